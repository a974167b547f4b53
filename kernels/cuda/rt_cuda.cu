// rt_cuda.cu — the CUDA backend of the runtime (rt_dev.h, RUNTIME.md §10): device memory, the element kernels of
// appends and compression, the reconstructions of AQUA-KV streams (cuBLAS products, decoded residuals added),
// and the fused attention: kv_attn_math.h's block program run by KV_DA_THREADS threads per block, then the
// combine of the splits. Every kernel's per-element work is a KV_HD function the host model (rt_dev_host.c)
// runs too; this file compiles with -fmad=false so that both give the same bits.

#include <new>

#include "kv_cuda_dl.h"
#include "kv_cuda_util.h"
#include "rt_dev.h"

/* Everything below up to the backend table is file-local (static, not an anonymous namespace: nvcc gives
 * those external linkage under a unique name, and libkvrt exports kv_ names only). */

struct cuda_impl {
    cudaStream_t stream;
    int own_stream; // created here (else the caller's, borrowed)
    cublasHandle_t cublas;
    int smem_optin;
};

static cudaStream_t stream_of(rt_dev *d) { return static_cast<cuda_impl *>(d->impl)->stream; }

// ---- kernels ------------------------------------------------------------------------------------------
#define KV_CU_MAX_JOBS 64
struct store_args {
    rt_dev_rows jobs[KV_CU_MAX_JOBS];
    int n_jobs;
    size_t ld;
    int kv_dim;
};

static __global__ void store_rows_kernel(const __grid_constant__ store_args a) {
    const rt_dev_rows *j = &a.jobs[blockIdx.y];
    const size_t n = (size_t)j->n * (size_t)a.kv_dim;
    for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < n; e += (size_t)gridDim.x * blockDim.x) {
        const size_t r = e / (size_t)a.kv_dim, c = e - r * (size_t)a.kv_dim;
        j->dst[e] = kv_f32_to_f16(j->src[r * a.ld + c]);
    }
}

static __global__ void rows_f32_kernel(float *dst, const uint16_t *src, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        dst[i] = kv_da_h2f(src[i]);
}

static __global__ void f16_rows_kernel(uint16_t *dst, const float *src, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        dst[i] = kv_f32_to_f16(src[i]);
}

static __global__ void sub_kernel(float *x, const float *y, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        x[i] = x[i] - y[i];
}

static __global__ void fill_rows_kernel(float *y, const float *bias, size_t n, int kv_dim) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        y[i] = bias[i % (size_t)kv_dim];
}

// One thread block per table entry, its units strided over the threads.
static __global__ void recon_add_kernel(const __grid_constant__ kv_dcodec c, const kv_dblock *table, int b0, int first_token,
                                 float *out) {
    const kv_dblock blk = table[b0 + (int)blockIdx.x];
    float *o = out + (size_t)(blk.t0 - first_token) * (size_t)c.kv_dim;
    const int units = kv_da_recon_units(&c, &blk);
    for (int u = (int)threadIdx.x; u < units; u += (int)blockDim.x) kv_da_recon_unit(&c, &blk, u, o);
}

#define D_RUN(f)                                                                                                   \
    do {                                                                                                           \
        f(A, &J, &S, (int)threadIdx.x, (int)blockDim.x);                                                           \
        __syncthreads();                                                                                           \
    } while (0)
#define D_RUN1(f)                                                                                                  \
    do {                                                                                                           \
        if (threadIdx.x == 0) f(A, &J, &S, 0, 1);                                                                  \
        __syncthreads();                                                                                           \
    } while (0)
#define D_SYNC() __syncthreads()

static __global__ void __launch_bounds__(KV_DA_THREADS) attend_kernel(const __grid_constant__ kv_dattn Ap) {
    extern __shared__ float4 smem_raw[];
    const kv_dattn *A = &Ap;
    kv_da_job J;
    kv_da_smem S;
    kv_da_job_of(A, (int)blockIdx.x, (int)blockIdx.y, (int)blockIdx.z, &J);
    kv_da_carve(A, J.nqv, smem_raw, &S);
    KV_DA_PROGRAM(D_RUN, D_RUN1, D_SYNC, A, (&J), (&S));
}

static __global__ void combine_kernel(const __grid_constant__ kv_dattn Ap) {
    const kv_dattn *A = &Ap;
    const int z = (int)blockIdx.y, v = (int)blockIdx.x;
    const int g = v % A->G, hr = v / A->G, row = hr % A->n_q, h = hr / A->n_q;
    for (int c = (int)threadIdx.x; c < A->hd; c += (int)blockDim.x) kv_da_combine_channel(A, z, h, row, g, c);
}

// ---- operations ----------------------------------------------------------------------------------------
static kv_status c_alloc(rt_dev *d, void **p, size_t bytes) {
    kv_status st = KV_OK;
    (void)d;
    *p = NULL;
    KV_CU(cudaMalloc(p, bytes ? bytes : 4));
done:
    return st;
}

static void c_free(rt_dev *d, void *p) {
    (void)d;
    if (p) cudaFree(p);
}

static kv_status c_copy(rt_dev *d, void *dst, const void *src, size_t bytes, rt_copy_dir dir) {
    kv_status st = KV_OK;
    const cudaMemcpyKind k = dir == RT_COPY_H2D ? cudaMemcpyHostToDevice
                             : dir == RT_COPY_D2H ? cudaMemcpyDeviceToHost : cudaMemcpyDeviceToDevice;
    if (!bytes) return KV_OK;
    KV_CU(cudaMemcpyAsync(dst, src, bytes, k, stream_of(d)));
    if (dir == RT_COPY_D2H) KV_CU(cudaStreamSynchronize(stream_of(d)));
done:
    return st;
}

static kv_status c_zero(rt_dev *d, void *p, size_t bytes) {
    kv_status st = KV_OK;
    if (bytes) KV_CU(cudaMemsetAsync(p, 0, bytes, stream_of(d)));
done:
    return st;
}

static kv_status c_store_rows(rt_dev *d, const rt_dev_rows *jobs, int n_jobs, size_t ld, int kv_dim) {
    kv_status st = KV_OK;
    for (int j0 = 0; j0 < n_jobs; j0 += KV_CU_MAX_JOBS) {
        store_args a;
        a.n_jobs = n_jobs - j0 < KV_CU_MAX_JOBS ? n_jobs - j0 : KV_CU_MAX_JOBS;
        a.ld = ld;
        a.kv_dim = kv_dim;
        int rows = 1;
        for (int j = 0; j < a.n_jobs; j++) {
            a.jobs[j] = jobs[j0 + j];
            rows = jobs[j0 + j].n > rows ? jobs[j0 + j].n : rows;
        }
        const dim3 grid(kv_cu_blocks((size_t)rows * (size_t)kv_dim, 256), (unsigned)a.n_jobs);
        store_rows_kernel<<<grid, 256, 0, stream_of(d)>>>(a);
        KV_CU_LAUNCH(store_rows);
    }
done:
    return st;
}

static kv_status c_rows_f32(rt_dev *d, float *dst, const uint16_t *src, size_t n) {
    kv_status st = KV_OK;
    if (!n) return KV_OK;
    rows_f32_kernel<<<kv_cu_blocks(n, 256), 256, 0, stream_of(d)>>>(dst, src, n);
    KV_CU_LAUNCH(rows_f32);
done:
    return st;
}

static kv_status c_sub(rt_dev *d, float *x, const float *y, size_t n) {
    kv_status st = KV_OK;
    if (!n) return KV_OK;
    sub_kernel<<<kv_cu_blocks(n, 256), 256, 0, stream_of(d)>>>(x, y, n);
    KV_CU_LAUNCH(sub);
done:
    return st;
}

static kv_status c_fill_rows(rt_dev *d, float *y, const float *bias, int rows, int kv_dim) {
    kv_status st = KV_OK;
    const size_t n = (size_t)rows * (size_t)kv_dim;
    if (!n) return KV_OK;
    fill_rows_kernel<<<kv_cu_blocks(n, 256), 256, 0, stream_of(d)>>>(y, bias, n, kv_dim);
    KV_CU_LAUNCH(fill_rows);
done:
    return st;
}

// Row-major C[M][N] += A[M][K] B[N][K]^T is column-major C^T = B A^T: cuBLAS with (op T on B, op N on A).
static kv_status c_gemm_nt(rt_dev *d, int M, int N, int K, const float *A, int lda, const float *B, int ldb, float *C,
                    int ldc) {
    const float one = 1.0f;
    if (M <= 0) return KV_OK;
    cuda_impl *im = static_cast<cuda_impl *>(d->impl);
    const kv_cublas_fns *bl = kv_cuda_cublas(); /* loaded on first use (kv_cuda_dl.h) */
    if (!bl) return kv_error_wrap(KV_ECUDA, "runtime (CUDA): ");
    if (!im->cublas) { /* made on first use: only AQUA-KV's predictors need it, and it costs milliseconds */
        if (bl->create(&im->cublas) != CUBLAS_STATUS_SUCCESS || bl->set_stream(im->cublas, im->stream) != CUBLAS_STATUS_SUCCESS ||
            bl->set_math_mode(im->cublas, CUBLAS_PEDANTIC_MATH) != CUBLAS_STATUS_SUCCESS) {
            if (im->cublas) bl->destroy(im->cublas);
            im->cublas = NULL;
            return KV_ERR(KV_ECUDA, "runtime (CUDA): cuBLAS could not be set up");
        }
    }
    const cublasStatus_t r = bl->sgemm(im->cublas, CUBLAS_OP_T, CUBLAS_OP_N, N, M, K, &one, B, ldb, A, lda, &one, C, ldc);
    if (r != CUBLAS_STATUS_SUCCESS) return KV_ERR(KV_ECUDA, "cublasSgemm (%d x %d x %d): status %d", M, N, K, (int)r);
    return KV_OK;
}

static kv_status c_encode(rt_dev *d, const rt_codec *c, const kv_quant *dq, uint8_t *blk, int m, const float *x) {
    kv_status st = KV_OK;
    const size_t n = (size_t)m * (size_t)c->kv_dim;
    rt_layout L;
    kv_rti_codec_layout(c, m, &L);
    uint32_t *codes = reinterpret_cast<uint32_t *>(blk);
    uint8_t *params = blk + L.code_bytes;
    const kv_stream s = reinterpret_cast<kv_stream>(stream_of(d));
    switch (c->kind) {
    case RT_F16:
        if (!n) return KV_OK;
        f16_rows_kernel<<<kv_cu_blocks(n, 256), 256, 0, stream_of(d)>>>(reinterpret_cast<uint16_t *>(blk), x, n);
        KV_CU_LAUNCH(f16_rows);
        return KV_OK;
    case RT_F32:
        return c_copy(d, blk, x, n * sizeof(float), RT_COPY_D2D);
    case RT_UNIFORM:
        return kv_uniform_encode_cuda(c->share_from >= 0 ? NULL : codes, params, params + L.param_bytes, &dq->uniform,
                                      (size_t)m, (size_t)c->kv_dim, x, s);
    case RT_HIGGS:
        return kv_higgs_encode_cuda(codes, params, &dq->higgs, (size_t)m, (size_t)c->kv_dim, x, s);
    case RT_FLOAT:
        return kv_fpq_encode_cuda(codes, params, &dq->fp, (size_t)m, (size_t)c->kv_dim, x, s);
    }
    return KV_ERR(KV_EINVAL, "runtime (CUDA): codec kind %d", (int)c->kind);
done:
    return st;
}

static kv_status c_recon_add(rt_dev *d, const kv_dcodec *c, const kv_dblock *table, int b0, int b1, int first_token,
                      float *out) {
    kv_status st = KV_OK;
    if (b1 <= b0) return KV_OK;
    recon_add_kernel<<<(unsigned)(b1 - b0), 128, 0, stream_of(d)>>>(*c, table, b0, first_token, out);
    KV_CU_LAUNCH(recon_add);
done:
    return st;
}

static kv_status c_attend(rt_dev *d, const kv_dattn *A) {
    kv_status st = KV_OK;
    cuda_impl *im = static_cast<cuda_impl *>(d->impl);
    const size_t smem = kv_da_smem_bytes(A, A->rows_per_block * A->G);
    const long gy = (long)A->H * (long)A->n_rowblocks, gc = (long)A->H * (long)A->n_q * (long)A->G;
    if (smem > (size_t)im->smem_optin)
        return KV_ERR(KV_EUNSUPPORTED, "runtime (CUDA): an attention block needs %zu bytes of shared memory, the device "
                      "offers %d", smem, im->smem_optin);
    if (gy > 65535)
        return KV_ERR(KV_EUNSUPPORTED, "runtime (CUDA): %d query rows in one call (at most %ld for this model); feed them "
                      "in steps", A->n_q, 65535L / A->H * A->rows_per_block);
    attend_kernel<<<dim3((unsigned)A->n_splits, (unsigned)gy, (unsigned)A->n_seqs), KV_DA_THREADS, smem, im->stream>>>(*A);
    KV_CU_LAUNCH(attend);
    combine_kernel<<<dim3((unsigned)gc, (unsigned)A->n_seqs), A->hd < 256 ? (unsigned)((A->hd + 31) / 32 * 32) : 256u, 0,
                     im->stream>>>(*A);
    KV_CU_LAUNCH(combine);
done:
    return st;
}

static void c_close(rt_dev *d) {
    if (!d) return;
    cuda_impl *im = static_cast<cuda_impl *>(d->impl);
    if (im) {
        if (im->cublas) kv_cuda_cublas()->destroy(im->cublas); /* loaded when made */
        if (im->stream) cudaStreamSynchronize(im->stream);
        if (im->stream && im->own_stream) cudaStreamDestroy(im->stream);
        delete im;
    }
    delete d;
}

const rt_dev_ops k_cuda_ops = {
    "cuda",    c_alloc, c_free,    c_copy,   c_zero,      c_store_rows, c_rows_f32,
    c_sub,     c_fill_rows, c_gemm_nt, c_encode, c_recon_add, c_attend,     c_close,
};


extern "C" kv_status kv_rti_dev_cuda_create(rt_dev **out, kv_stream stream) {
    kv_status st = KV_OK;
    *out = NULL;
    if (!kv_cuda_available()) return KV_ERR(KV_EUNSUPPORTED, "runtime: no usable CUDA device (no driver or no GPU)");
    rt_dev *d = new (std::nothrow) rt_dev;
    cuda_impl *im = new (std::nothrow) cuda_impl;
    int dev = 0;
    if (!d || !im) {
        delete d;
        delete im;
        return KV_ERR(KV_ENOMEM, "out of memory");
    }
    im->stream = reinterpret_cast<cudaStream_t>(stream);
    im->own_stream = stream == NULL;
    im->cublas = NULL;
    im->smem_optin = 0;
    d->ops = &k_cuda_ops;
    d->impl = im;
    KV_CU(cudaGetDevice(&dev));
    KV_CU(cudaDeviceGetAttribute(&im->smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
    KV_CU(cudaFuncSetAttribute(attend_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, im->smem_optin));
    if (im->own_stream) KV_CU(cudaStreamCreateWithFlags(&im->stream, cudaStreamNonBlocking));
    *out = d;
    return KV_OK;
done:
    c_close(d);
    return st;
}

extern "C" kv_stream kv_rti_dev_cuda_stream(rt_dev *d) { return reinterpret_cast<kv_stream>(stream_of(d)); }
