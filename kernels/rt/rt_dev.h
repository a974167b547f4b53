/* rt_dev.h — the runtime's device backends (RUNTIME.md §10). Internal to kernels/.
 *
 * A runtime opened for KV_RT_DEVICE_CUDA (or its host model, KV_RT_DEVICE_CUDA_MODEL) keeps every piece of
 * bookkeeping the CPU runtime keeps (rt_internal.h: sequences, streams, block descriptors, positions,
 * statistics) on the host, and the data in device memory: the f16 rows of each stream (sinks and window),
 * the compressed blocks (in a per-sequence arena), a device copy of each stream's block descriptors
 * (kv_dblock), the reconstructions of AQUA-KV streams and the codecs' tables. What touches the data goes
 * through a table of device operations (rt_dev_ops): the CUDA backend launches kernels (kernels/cuda/
 * rt_cuda.cu), the host model runs the same KV_HD functions on the CPU (rt_dev_host.c), so the host model
 * tests, here and in CI, everything but the kernels' execution. */
#ifndef KV_RT_DEV_H
#define KV_RT_DEV_H

#include "kv_attn_math.h"
#include "rt_internal.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum rt_copy_dir { RT_COPY_H2D = 0, RT_COPY_D2H = 1, RT_COPY_D2D = 2 } rt_copy_dir;

/* One stream's new rows of an append: n rows of src (f32, row stride ld floats) rounded to f16 into dst
 * (row stride kv_dim). */
typedef struct rt_dev_rows {
    uint16_t *dst;
    const float *src;
    int n;
} rt_dev_rows;

typedef struct rt_dev rt_dev;

/* Device operations. Pointers to device memory unless named host; every operation is ordered after the
 * previous ones (one stream); `copy` to the host returns when the data is there. */
typedef struct rt_dev_ops {
    const char *name;
    kv_status (*alloc)(rt_dev *d, void **p, size_t bytes);
    void (*free)(rt_dev *d, void *p);
    kv_status (*copy)(rt_dev *d, void *dst, const void *src, size_t bytes, rt_copy_dir dir);
    kv_status (*zero)(rt_dev *d, void *p, size_t bytes);
    /* Rows of an append into the f16 rows (ld: the sources' row stride in floats). */
    kv_status (*store_rows)(rt_dev *d, const rt_dev_rows *jobs, int n_jobs, size_t ld, int kv_dim);
    /* dst[i] = f16 src[i] as f32, i < n. */
    kv_status (*rows_f32)(rt_dev *d, float *dst, const uint16_t *src, size_t n);
    /* x[i] -= y[i], i < n. */
    kv_status (*sub)(rt_dev *d, float *x, const float *y, size_t n);
    /* y[r][c] = bias[c] for r < rows, c < kv_dim (bias: device). */
    kv_status (*fill_rows)(rt_dev *d, float *y, const float *bias, int rows, int kv_dim);
    /* C[M][N] += A[M][K] B[N][K]^T, row-major with leading dimensions (the predictors: B = W's column slice). */
    kv_status (*gemm_nt)(rt_dev *d, int M, int N, int K, const float *A, int lda, const float *B, int ldb, float *C,
                         int ldc);
    /* Encode m tokens x kv_dim of x into the block layout at blk (kv_rti_codec_layout). dq: the codec's quantizer with
     * device tables (grids, scales). Not for SQuat streams (host encoders). */
    kv_status (*encode)(rt_dev *d, const rt_codec *c, const kv_quant *dq, uint8_t *blk, int m, const float *x);
    /* out (row 0 = token first_token, stride kv_dim) += the decoded blocks [b0, b1) of the device table. */
    kv_status (*recon_add)(rt_dev *d, const kv_dcodec *c, const kv_dblock *table, int b0, int b1, int first_token,
                           float *out);
    /* The attention blocks of a launch, then the combine (A->seq[].out written). */
    kv_status (*attend)(rt_dev *d, const kv_dattn *A);
    void (*close)(rt_dev *d);
} rt_dev_ops;

struct rt_dev {
    const rt_dev_ops *ops;
    void *impl;
};

/* Backends. The CUDA one is KV_EUNSUPPORTED (with the reason) in a build without CUDA or on a machine without
 * a usable GPU. */
kv_status kv_rti_dev_host_create(rt_dev **out);
kv_status kv_rti_dev_cuda_create(rt_dev **out, kv_stream stream); /* stream NULL: one of its own */
kv_stream kv_rti_dev_cuda_stream(rt_dev *d);

/* The device side of one runtime (kv_rt.dv). */
typedef struct rt_devstate {
    rt_dev *dev;
    kv_rt_device kind;
    kv_dcodec *dcodec;        /* n_layers * 2: the codecs as the kernels read them */
    kv_quant *dq;             /* n_layers * 2: the quantizers with device tables (encode) */
    void **owned;             /* device tables to free at close */
    int n_owned, cap_owned;
    float **pred_w, **pred_b; /* n_layers * 2: device copies of the predictors (NULL without) */
    float *rope_cos, *rope_sin; /* device copies of the RoPE table (rt->rope_n positions) */
    float *rope_cos_local, *rope_sin_local; /* and of the windowed layers' own (rt->inv_freq_local), or NULL */
    int rope_n;
    float *x, *pred;          /* compression scratch: rows x kv_dim each */
    size_t x_rows;
    uint16_t *tmp;            /* window moves */
    size_t tmp_bytes;
    float *part;              /* attention partials */
    size_t part_floats;
    uint8_t *host_blk;        /* host staging (SQuat encode, queries) */
    size_t host_bytes;
    float *host_x;
    size_t host_x_bytes;
} rt_devstate;

/* Per-sequence device arena of compressed blocks (rt_seq.arena). */
typedef struct rt_arena_page {
    uint8_t *base;
    size_t size, used;
} rt_arena_page;
typedef struct rt_arena {
    rt_arena_page *pages;
    int n, cap;
} rt_arena;

/* ---- rt_dev.c: the runtime's data paths on a device -------------------------------------------- */
/* A device copy of n bytes of host data, owned by the runtime (freed at close): the codecs' tables
 * (rt_codec_ops.dev_describe). */
kv_status kv_rti_dev_table(kv_rt *rt, const void *host, size_t bytes, void **out);
kv_status kv_rti_dev_open(kv_rt *rt);            /* after the codecs: backend, device codecs, predictors */
void kv_rti_dev_close(kv_rt *rt);
void kv_rti_dev_seq_clear(kv_rt *rt, rt_seq *sq);  /* every device allocation of the sequence */
kv_status kv_rti_dev_fp_resize(kv_rt *rt, rt_seq *sq, rt_stream *st, int rows);
kv_status kv_rti_dev_window_drop(kv_rt *rt, rt_seq *sq, rt_stream *st, int m);
/* Compression scratch of rows x kv_dim floats (x and pred). */
kv_status kv_rti_dev_scratch(kv_rt *rt, int rows, float **x, float **pred);
/* Compress window rows [row, row + m) of (layer, stream) into a block (rt_runtime.c compress_chunk's device
 * path): the new block is pushed and comp_end advanced. */
kv_status kv_rti_dev_compress(kv_rt *rt, int seq, int layer, int stream, int row, int m, float *x, float *pred);
/* The new rows of one append of n tokens per listed sequence (rows of k_pre/k/v: sequence i's at i * n * ld). */
kv_status kv_rti_dev_store(kv_rt *rt, int layer, int n_seqs, const int *seqs, int n, const float *k_pre, const float *k,
                       const float *v, size_t ld);
/* Attention of n_q rows for each listed sequence (queries qs[i], outputs outs[i]). */
kv_status kv_rti_dev_attend(kv_rt *rt, int layer, int n_seqs, const int *seqs, int n_q, const float *const *qs, size_t ldq,
                        float *const *outs, size_t ldo);
kv_status kv_rti_dev_recon_ensure(kv_rt *rt, int seq, int layer, int stream);
void kv_rti_dev_recon_free(kv_rt *rt, rt_recon *r);
kv_status kv_rti_dev_rope_reserve(kv_rt *rt, int n_pos);
/* kv_rt_decode_head of a device runtime: the stream's data copied to the host and read by the CPU code. */
kv_status kv_rti_dev_decode_head(kv_rt *rt, int layer, int seq, int kv_head, float *k_out, float *v_out);
/* Queries on the host for the host-side consumers (SQuat's prompt subspace): q itself for the host model. */
kv_status kv_rti_dev_host_queries(kv_rt *rt, int n_q, const float *q, size_t ldq, const float **host_q);

/* Faults the host model injects for the self-check's own tests (0: none): 1 shifts every attention output by
 * 1e-3 of itself, 2 flips the lowest bit of the first code word of every block it encodes. */
extern int kv_rti_dev_host_fault;

/* kv_rt_open's guard: the self-check of a CUDA runtime's plan when a kind of codec in it was not checked yet in
 * this process (rt_selfcheck.c). */
kv_status kv_rti_selfcheck_guard(const kv_plan *plan, const kv_rt_options *opt);

/* The launch shape of an attention call (kv_da_configure): rows per block, tile, splits. */
void kv_rti_dev_configure(kv_dattn *A, int n_max);

#ifdef __cplusplus
}
#endif
#endif
