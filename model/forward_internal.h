/* forward_internal.h — the kv_model structure shared by weights.c, forward.c and the other model/
 * sources that belong to the reference model (not a public header). */
#ifndef KV_FORWARD_INTERNAL_H
#define KV_FORWARD_INTERNAL_H

#include "kv_model.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Storage behind one kv_matrix (the kv_matrix fields point into it). */
typedef struct kv_owned_matrix {
    kv_matrix m;
    void *data; /* float* or uint16_t*, kv_aligned_alloc'd */
    size_t bytes; /* of data (counted in kv_model.weight_bytes) */
} kv_owned_matrix;

typedef struct kv_layer_storage {
    kv_owned_matrix wq, wk, wv, wo, w_gate, w_up, w_down;
    float *attn_norm, *ffn_norm, *bq, *bk, *bv;
    float *q_norm, *k_norm, *post_attn_norm, *post_ffn_norm; /* qk_norm / post_norms only */
} kv_layer_storage;

/* Scratch reused by the forward functions, grown on demand. */
typedef struct kv_workspace {
    size_t rows;      /* capacity in rows of the row-sized buffers */
    float *hres;      /* rows x d_model: residual stream of kv_model_forward */
    float *x;         /* rows x d_model: normed input */
    float *q, *q_pre; /* rows x q_dim */
    float *k, *k_pre, *v; /* rows x kv_dim */
    float *att;       /* rows x q_dim: attention output before wo */
    float *proj;      /* rows x d_model: wo / w_down output */
    float *gate, *up; /* rows x d_ff */
    float *rope_cos[2], *rope_sin[2]; /* rows x head_dim/2: [0] global layers' frequencies, [1] local layers' */
    int32_t *pos;     /* rows positions (kv_model_forward) */
    int32_t *rope_pos[2]; /* the positions rope_cos[i]/rope_sin[i] were computed for */
    size_t rope_n[2]; /* rows of rope_pos[i] that are valid */
    size_t scores_cap; /* floats */
    float *scores;    /* attention scores of the running tasks */
    size_t deq_cap;   /* floats */
    float *deq;       /* a tile of weight rows decoded to f32 (forward_matmul.c) */
    size_t rowbuf_cap; /* floats */
    float *rowbuf;    /* one decoded weight row per thread (forward_matmul.c) */
} kv_workspace;

struct kv_model {
    kv_arch arch;
    kv_model_options opt;
    int n_threads;
    int blas_threads; /* the BLAS's current thread count (kv_model_blas_threads) */
    int isa;          /* instruction set of the row kernels (forward_matmul.c); -1 until checked */
    kv_owned_matrix tok_embd;
    kv_owned_matrix output; /* data NULL when tied (m points at tok_embd's) */
    float *output_norm;
    kv_layer_storage *store; /* n_layers */
    kv_layer_weights *layers; /* n_layers views */
    double *inv_freq_d;  /* head_dim/2: the global layers' (every layer's in a model without local layers) */
    float *inv_freq;     /* the same, rounded */
    double *inv_freq_local_d; /* head_dim/2: the local layers' (kv_arch.rope_theta_local, unscaled); NULL without */
    float *inv_freq_local;
    double q_fold;       /* queries are multiplied by attn_scale * sqrt(head_dim) (1: nothing), so that the
                            softmax scale 1/sqrt(head_dim) every cache and consumer assumes is the model's */
    size_t weight_bytes;
    kv_workspace ws;
    int stream;              /* layer-streamed weights (kv_model_*_streamed) */
    /* The weight source, kept for layer streaming (weights.c). */
    kv_tensor_read_fn src_read;
    struct kv_model_raw_source *src_raw; /* NULL: no raw blocks (kv_model_create) */
    void *src_user;
    unsigned char *held;     /* n_layers + 2: [0] embedding, [1] output, [2 + l] layer l */
    kv_pool *pool; /* the decode path's threads (kv_model_pool), n_threads of them */
    struct kv_model_cuda *gpu; /* KV_MODEL_DEVICE_CUDA: the weights on the GPU and its forward (model_cuda.h) */
};

/* KV_OK when part (a layer or KV_MODEL_PART_*) is held, else KV_EINVAL naming it (forward.c's
 * entry points call it so that a streamed model fails cleanly instead of reading NULL weights). */
kv_status kv_model_require(const kv_model *m, int part);

/* Work (multiply-adds or elements) below which a loop or a BLAS call runs on one thread: the
 * synchronization would cost more than it saves, and on a loaded machine every barrier waits for a
 * descheduled peer. */
#define KV_PAR_MIN_WORK 32768
static inline int kv_model_par(const kv_model *m, size_t work) {
    return work < KV_PAR_MIN_WORK ? 1 : m->n_threads;
}
/* The model's thread pool (n_threads): every parallel loop of the forward runs on it. OpenMP's
 * barriers spin and wait for descheduled threads, which made decoding on a busy machine 50x slower
 * (pool.c), and its spinning workers competed with the runtime's. NULL when the model runs on one
 * thread (kv_pool_run then runs on the caller). */
kv_pool *kv_model_pool(kv_model *m);
/* fn(ctx, r0, r1, thread) over rows [0, n) split into ranges on the model's pool (one thread when the
 * work is below KV_PAR_MIN_WORK). Each row is handled by one call, so results do not depend on how
 * the rows are split; `thread` (< n_threads) indexes per-thread scratch. */
typedef void (*kv_rows_fn)(void *ctx, size_t r0, size_t r1, int thread);
void kv_model_for_rows(kv_model *m, size_t n, size_t work, kv_rows_fn fn, void *ctx);
/* Set the BLAS thread count (cached: no call when it is already n). */
void kv_model_blas_threads(kv_model *m, int n);

/* Grow a workspace buffer to n floats (contents not kept). */
kv_status kv_model_ws_floats(float **buf, size_t *cap, size_t n, const char *what);

/* y (n x W.rows) = x (n x W.cols) W^T (+ bias), for every storage (forward_matmul.c). Up to
 * KV_ROWS_MAX input rows take the decoding path (weights read once, decoded in registers). */
#define KV_ROWS_MAX 8
kv_status kv_model_matmul(kv_model *m, const float *x, size_t n, const kv_matrix *w, const float *bias,
                          float *y);
/* The same for count matrices of equal width sharing the input x (bias may be NULL, or hold NULLs). */
kv_status kv_model_matmul_multi(kv_model *m, const float *x, size_t n, const kv_matrix *const *w,
                                const float *const *bias, float *const *y, int count);
/* The instruction set the row kernels use on this CPU (checked once per model). */
int kv_model_isa(kv_model *m);
/* Row r of W decoded to f32 (dst holds W.cols floats). */
kv_status kv_model_matrix_row(const kv_matrix *w, int r, float *dst);

/* A tensor's stored bytes, for KV_WEIGHTS_NATIVE (weights_file.c supplies one; kv_model_create has
 * none). Same contract as kv_tensor_read_fn for names and shapes; *data is borrowed (the model copies
 * it), *row_bytes the bytes of one row of ne[0] elements. */
typedef kv_status (*kv_tensor_raw_fn)(void *user, const char *name, int n_dims, const uint64_t ne[4], int *dtype,
                                      const uint8_t **data, size_t *row_bytes);
/* Called after a tensor has been copied or decoded: its source bytes are not needed now (the file
 * source hands the mapping's pages back to the OS); name NULL: no source bytes are needed now. */
typedef void (*kv_tensor_done_fn)(void *user, const char *name);
typedef struct kv_model_raw_source {
    kv_tensor_raw_fn raw;
    kv_tensor_done_fn done; /* may be NULL */
} kv_model_raw_source;
/* raw may be NULL (no stored blocks: every matrix is read through `read`). stream: layer-streamed
 * weights, and then the source (read, *raw, user) must outlive the model. */
kv_status kv_model_create_raw(kv_model **out, const kv_arch *arch, kv_tensor_read_fn read,
                              const kv_model_raw_source *raw, void *user, const kv_model_options *opt, int stream);

#ifdef __cplusplus
}
#endif
#endif
