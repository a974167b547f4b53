/* forward_internal.h — the kv_model structure shared by weights.c, forward.c and the other model/
 * sources that belong to the reference model (not a public header). */
#ifndef KV_FORWARD_INTERNAL_H
#define KV_FORWARD_INTERNAL_H

#include "kv_model.h"

/* Storage behind one kv_matrix (the kv_matrix fields point into it). */
typedef struct kv_owned_matrix {
    kv_matrix m;
    void *data; /* float* or uint16_t*, kv_aligned_alloc'd */
} kv_owned_matrix;

typedef struct kv_layer_storage {
    kv_owned_matrix wq, wk, wv, wo, w_gate, w_up, w_down;
    float *attn_norm, *ffn_norm, *bq, *bk, *bv;
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
    float *rope_cos, *rope_sin; /* rows x head_dim/2 */
    int32_t *pos;     /* rows positions (kv_model_forward) */
    int32_t *rope_pos; /* the positions rope_cos/rope_sin were computed for */
    size_t rope_n;    /* rows of rope_pos that are valid */
    size_t scores_cap; /* floats */
    float *scores;    /* attention scores of the running tasks */
    size_t deq_cap;   /* floats */
    float *deq;       /* an f16 matrix widened to f32 */
} kv_workspace;

struct kv_model {
    kv_arch arch;
    kv_model_options opt;
    int n_threads;
    int blas_threads; /* the BLAS's current thread count (kv_model_blas_threads) */
    kv_owned_matrix tok_embd;
    kv_owned_matrix output; /* data NULL when tied (m points at tok_embd's) */
    float *output_norm;
    kv_layer_storage *store; /* n_layers */
    kv_layer_weights *layers; /* n_layers views */
    double *inv_freq_d;  /* head_dim/2 */
    float *inv_freq;     /* the same, rounded */
    size_t weight_bytes;
    kv_workspace ws;
};

/* Work (multiply-adds or elements) below which a loop or a BLAS call runs on one thread: the
 * synchronization would cost more than it saves, and on a loaded machine every barrier waits for a
 * descheduled peer. */
#define KV_PAR_MIN_WORK 32768
static inline int kv_model_par(const kv_model *m, size_t work) {
    return work < KV_PAR_MIN_WORK ? 1 : m->n_threads;
}
/* Set the BLAS thread count (cached: no call when it is already n). */
void kv_model_blas_threads(kv_model *m, int n);

/* y (n x W.rows) = x (n x W.cols) W^T (+ bias). */
kv_status kv_model_matmul(kv_model *m, const float *x, size_t n, const kv_matrix *w, const float *bias,
                          float *y);

#endif
