/* rt_dev_host.c — the host model of the CUDA backend (KV_RT_DEVICE_CUDA_MODEL, RUNTIME.md §10): "device"
 * memory is host memory and every kernel of kernels/cuda/rt_cuda.cu is the same KV_HD functions run here with a
 * loop over its grid and thread indices (the attention blocks run their phases thread after thread, which gives
 * the kernel's bits: kv_attn_math.h). Encoding uses the CPU quantizers, which the CUDA encoders match bit for
 * bit; the predictors' products use the BLAS (cuBLAS's summation order is its own). So CI runs the whole device
 * backend but the kernels' execution. */
#include "kvrt.h"
#include "rt_dev.h"
#include "rt_internal.h"

#include <cblas.h>
#include <stdlib.h>
#include <string.h>

int kv_rti_dev_host_fault = 0;

static kv_status h_alloc(rt_dev *d, void **p, size_t bytes) {
    (void)d;
    *p = kv_aligned_alloc(64, bytes ? bytes : 4);
    return *p ? KV_OK : KV_ERR(KV_ENOMEM, "runtime (host model): out of memory for %zu bytes", bytes);
}

static void h_free(rt_dev *d, void *p) {
    (void)d;
    kv_aligned_free(p);
}

static kv_status h_copy(rt_dev *d, void *dst, const void *src, size_t bytes, rt_copy_dir dir) {
    (void)d, (void)dir;
    if (bytes) memcpy(dst, src, bytes);
    return KV_OK;
}

static kv_status h_zero(rt_dev *d, void *p, size_t bytes) {
    (void)d;
    if (bytes) memset(p, 0, bytes);
    return KV_OK;
}

static kv_status h_store_rows(rt_dev *d, const rt_dev_rows *jobs, int n_jobs, size_t ld, int kv_dim) {
    (void)d;
    for (int j = 0; j < n_jobs; j++)
        for (int r = 0; r < jobs[j].n; r++)
            for (int c = 0; c < kv_dim; c++)
                jobs[j].dst[(size_t)r * (size_t)kv_dim + (size_t)c] = kv_f32_to_f16(jobs[j].src[(size_t)r * ld + (size_t)c]);
    return KV_OK;
}

static kv_status h_rows_f32(rt_dev *d, float *dst, const uint16_t *src, size_t n) {
    (void)d;
    for (size_t i = 0; i < n; i++) dst[i] = kv_da_h2f(src[i]);
    return KV_OK;
}

static kv_status h_sub(rt_dev *d, float *x, const float *y, size_t n) {
    (void)d;
    for (size_t i = 0; i < n; i++) x[i] = x[i] - y[i];
    return KV_OK;
}

static kv_status h_fill_rows(rt_dev *d, float *y, const float *bias, int rows, int kv_dim) {
    (void)d;
    for (int r = 0; r < rows; r++) memcpy(y + (size_t)r * (size_t)kv_dim, bias, (size_t)kv_dim * sizeof(float));
    return KV_OK;
}

static kv_status h_gemm_nt(rt_dev *d, int M, int N, int K, const float *A, int lda, const float *B, int ldb, float *C,
                           int ldc) {
    (void)d;
    if (M > 0) cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, N, K, 1.0f, A, lda, B, ldb, 1.0f, C, ldc);
    return KV_OK;
}

static kv_status h_encode(rt_dev *d, const rt_codec *c, const kv_quant *dq, uint8_t *blk, int m, const float *x) {
    (void)d, (void)dq; /* the host's tables are the codec's own */
    const kv_status s = kv_rti_codec_encode(c, blk, m, x);
    if (s == KV_OK && kv_rti_dev_host_fault == 2 && c->q.kind != KV_QUANT_F16 && c->share_from < 0)
        ((uint32_t *)blk)[0] ^= 1u;
    return s;
}

static kv_status h_recon_add(rt_dev *d, const kv_dcodec *c, const kv_dblock *table, int b0, int b1, int first_token,
                             float *out) {
    (void)d;
    for (int b = b0; b < b1; b++) {
        const kv_dblock *blk = &table[b];
        float *o = out + (size_t)(blk->t0 - first_token) * (size_t)c->kv_dim;
        const int units = kv_da_recon_units(c, blk);
        for (int u = 0; u < units; u++) kv_da_recon_unit(c, blk, u, o);
    }
    return KV_OK;
}

/* The kernel's program with its threads run one after another (kv_attn_math.h "Phases"). */
#define H_RUN(f)                                                                                                   \
    do {                                                                                                           \
        for (int t_ = 0; t_ < KV_DA_THREADS; t_++) f(A, &J, &S, t_, KV_DA_THREADS);                                \
    } while (0)
#define H_RUN1(f) f(A, &J, &S, 0, 1)
#define H_SYNC() ((void)0)

static kv_status h_attend(rt_dev *d, const kv_dattn *A) {
    (void)d;
    void *smem = kv_aligned_alloc(64, kv_da_smem_bytes(A, A->rows_per_block * A->G));
    if (!smem) return KV_ERR(KV_ENOMEM, "runtime (host model): out of memory for a block's shared memory");
    for (int z = 0; z < A->n_seqs; z++)
        for (int y = 0; y < A->H * A->n_rowblocks; y++)
            for (int x = 0; x < A->n_splits; x++) {
                kv_da_job J;
                kv_da_smem S;
                kv_da_job_of(A, x, y, z, &J);
                kv_da_carve(A, J.nqv, smem, &S);
                KV_DA_PROGRAM(H_RUN, H_RUN1, H_SYNC, A, (&J), (&S));
            }
    kv_aligned_free(smem);
    for (int z = 0; z < A->n_seqs; z++)
        for (int h = 0; h < A->H; h++)
            for (int row = 0; row < A->n_q; row++)
                for (int g = 0; g < A->G; g++)
                    for (int c = 0; c < A->hd; c++) {
                        kv_da_combine_channel(A, z, h, row, g, c);
                        float *o = &A->seq[z].out[(size_t)row * (size_t)A->ldo + (size_t)(h * A->G + g) * (size_t)A->hd + (size_t)c];
                        if (kv_rti_dev_host_fault == 1) *o *= 1.001f;
                    }
    return KV_OK;
}

static void h_close(rt_dev *d) { free(d); }

static const rt_dev_ops k_host_ops = {
    .name = "cuda-model",
    .alloc = h_alloc,
    .free = h_free,
    .copy = h_copy,
    .zero = h_zero,
    .store_rows = h_store_rows,
    .rows_f32 = h_rows_f32,
    .sub = h_sub,
    .fill_rows = h_fill_rows,
    .gemm_nt = h_gemm_nt,
    .encode = h_encode,
    .recon_add = h_recon_add,
    .attend = h_attend,
    .close = h_close,
};

kv_status kv_rti_dev_host_create(rt_dev **out) {
    rt_dev *d = calloc(1, sizeof *d);
    if (!d) return KV_ERR(KV_ENOMEM, "out of memory");
    d->ops = &k_host_ops;
    *out = d;
    return KV_OK;
}

#if !defined(KV_RT_WITH_CUDA)
kv_status kv_rti_dev_cuda_create(rt_dev **out, kv_stream stream) {
    (void)stream;
    *out = NULL;
    return KV_ERR(KV_EUNSUPPORTED, "runtime: this build has no CUDA backend (built without nvcc; KV_CUDA=OFF)");
}
kv_stream kv_rti_dev_cuda_stream(rt_dev *d) {
    (void)d;
    return NULL;
}
#endif
