/* backward.c — one forward + ONE backward pass per prompt over all layers, for KVmix layer
 * importance (kvmix.txt, "KV Importance Analysis": s_k(i) = ||dL/dW_k(i)||, s_v(i) likewise, L the
 * next-token cross-entropy). The KVmix code reruns a forward and backward per layer; the gradients
 * of every layer's W_k and W_v come out of a single backward here.
 *
 * The math is in backward_impl.inc, compiled twice: in float for real models (weights borrowed
 * from the kv_model) and in double for finite-difference checks (weights copied and widened). */
#include "forward_internal.h"

#include <cblas.h>
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#define R float
#define GEMM cblas_sgemm
#define EXP expf /* as the reference forward computes softmax and SiLU */
#define FN(name) name##_f32
#include "backward_impl.inc"
#undef R
#undef GEMM
#undef EXP
#undef FN

#define R double
#define GEMM cblas_dgemm
#define EXP exp
#define FN(name) name##_f64
#include "backward_impl.inc"
#undef R
#undef GEMM
#undef EXP
#undef FN

/* Parameters per layer in params[]: the 12 of the Llama block, then QK-norm's and the post-norms' (absent
 * ones have no values). */
#define GRAD_PER_LAYER 16

/* One named parameter: value and gradient (float* or double* by precision), element count. */
typedef struct grad_param {
    char name[64];
    void *value;
    void *grad; /* NULL when this gradient is not computed */
    size_t numel;
} grad_param;

struct kv_grad {
    kv_arch arch;
    kv_grad_precision prec;
    int all_grads;
    int n_threads; /* the model's thread count (OpenMP regions) */
    double *inv_freq;
    double *inv_freq_local; /* local layers' (NULL without) */
    double fold;            /* the queries' factor (kv_model.q_fold) */
    state_f32 s32;
    state_f64 s64;
    grad_param *params;
    int n_params;
    void *owned_values; /* double copies (f64) — one block */
    void *grads;        /* one block for every gradient */
};

static size_t elem_size(kv_grad_precision p) { return p == KV_GRAD_F64 ? sizeof(double) : sizeof(float); }

/* Append a parameter; its value comes from src (f32, borrowed from the model). */
static void add_param(kv_grad *g, const char *name, const float *src, size_t numel, int has_grad) {
    grad_param *p = &g->params[g->n_params++];
    snprintf(p->name, sizeof p->name, "%s", name);
    p->value = (void *)(uintptr_t)src; /* f32: borrowed and never written; f64: replaced below */
    p->grad = has_grad ? (void *)1 : NULL; /* marks "allocate"; real pointers assigned later */
    p->numel = src ? numel : 0;
}

static kv_status need_f32(const kv_matrix *mx, const char *what) {
    if (!mx->f32) return KV_ERR(KV_EUNSUPPORTED, "backward needs f32 weights (%s is stored as f16 or native blocks)", what);
    return KV_OK;
}

kv_status kv_grad_create(kv_grad **out, const kv_model *m, kv_grad_precision prec, int all_grads) {
    *out = NULL;
    if (kv_model_streamed(m))
        return KV_ERR(KV_EINVAL, "gradients need every layer's weights at once: load the model whole, not with "
                      "kv_model_load_streamed");
    kv_status s = KV_OK;
    kv_grad *g = calloc(1, sizeof *g);
    if (!g) return KV_ERR(KV_ENOMEM, "out of memory");
    g->arch = *kv_model_arch(m);
    g->prec = prec;
    g->all_grads = all_grads;
    g->n_threads = kv_model_threads(m);
    const kv_arch *a = &g->arch;
    const int L = a->n_layers, d = a->d_model, qd = a->n_heads * a->head_dim;
    const int kvd = a->n_kv_heads * a->head_dim, ff = a->d_ff, V = a->vocab_size;
    g->params = calloc((size_t)L * GRAD_PER_LAYER + 3, sizeof(grad_param));
    g->inv_freq = malloc(sizeof(double) * (size_t)(a->head_dim / 2));
    if (m->inv_freq_local_d) g->inv_freq_local = malloc(sizeof(double) * (size_t)(a->head_dim / 2));
    if (!g->params || !g->inv_freq || (m->inv_freq_local_d && !g->inv_freq_local)) {
        s = KV_ERR(KV_ENOMEM, "out of memory");
        goto done;
    }
    memcpy(g->inv_freq, m->inv_freq_d, sizeof(double) * (size_t)(a->head_dim / 2));
    if (g->inv_freq_local) memcpy(g->inv_freq_local, m->inv_freq_local_d, sizeof(double) * (size_t)(a->head_dim / 2));
    g->fold = m->q_fold;
    const kv_matrix emb = kv_model_token_embedding(m), outw = kv_model_output_weight(m);
    if ((s = need_f32(&emb, "token_embd")) != KV_OK || (s = need_f32(&outw, "output")) != KV_OK) goto done;
    const int tied = outw.f32 == emb.f32;
    add_param(g, "token_embd.weight", emb.f32, (size_t)V * d, all_grads);
    add_param(g, "output_norm.weight", kv_model_output_norm(m), (size_t)d, all_grads);
    add_param(g, "output.weight", tied ? NULL : outw.f32, (size_t)V * d, all_grads);
    for (int l = 0; l < L; l++) {
        const kv_layer_weights *w = kv_model_layer(m, l);
        const kv_matrix *mats[] = {&w->wq, &w->wk, &w->wv, &w->wo, &w->w_gate, &w->w_up, &w->w_down};
        for (int i = 0; i < 7; i++)
            if ((s = need_f32(mats[i], "a layer matrix")) != KV_OK) goto done;
        char nm[64];
#define P(field, src, n, grad)                                                                     \
    snprintf(nm, sizeof nm, "blk.%d." field, l);                                                   \
    add_param(g, nm, src, n, grad)
        P("attn_norm.weight", w->attn_norm, (size_t)d, all_grads);
        P("attn_q.weight", w->wq.f32, (size_t)qd * d, all_grads);
        P("attn_k.weight", w->wk.f32, (size_t)kvd * d, 1);
        P("attn_v.weight", w->wv.f32, (size_t)kvd * d, 1);
        P("attn_output.weight", w->wo.f32, (size_t)d * qd, all_grads);
        P("attn_q.bias", w->bq, (size_t)qd, all_grads);
        P("attn_k.bias", w->bk, (size_t)kvd, 1);
        P("attn_v.bias", w->bv, (size_t)kvd, 1);
        P("ffn_norm.weight", w->ffn_norm, (size_t)d, all_grads);
        P("ffn_gate.weight", w->w_gate.f32, (size_t)ff * d, all_grads);
        P("ffn_up.weight", w->w_up.f32, (size_t)ff * d, all_grads);
        P("ffn_down.weight", w->w_down.f32, (size_t)d * ff, all_grads);
        P("attn_q_norm.weight", w->q_norm, (size_t)a->head_dim, all_grads);
        P("attn_k_norm.weight", w->k_norm, (size_t)a->head_dim, all_grads);
        P("post_attention_norm.weight", w->post_attn_norm, (size_t)d, all_grads);
        P("post_ffw_norm.weight", w->post_ffn_norm, (size_t)d, all_grads);
#undef P
    }
    /* one block for the gradients (and, in double, one for the widened values) */
    size_t total_grad = 0, total_val = 0;
    for (int i = 0; i < g->n_params; i++) {
        if (g->params[i].grad) total_grad += g->params[i].numel;
        total_val += g->params[i].numel;
    }
    const size_t es = elem_size(prec);
    g->grads = calloc(total_grad ? total_grad : 1, es);
    if (prec == KV_GRAD_F64) g->owned_values = malloc((total_val ? total_val : 1) * es);
    if (!g->grads || (prec == KV_GRAD_F64 && !g->owned_values)) {
        s = KV_ERR(KV_ENOMEM, "backward: out of memory for %zu gradients", total_grad);
        goto done;
    }
    size_t og = 0, ov = 0;
    for (int i = 0; i < g->n_params; i++) {
        grad_param *p = &g->params[i];
        if (p->grad) {
            p->grad = p->numel ? (char *)g->grads + og * es : NULL;
            og += p->numel;
        }
        if (prec == KV_GRAD_F64 && p->numel) {
            double *dst = (double *)g->owned_values + ov;
            const float *src = p->value;
            for (size_t j = 0; j < p->numel; j++) dst[j] = src[j];
            p->value = dst;
            ov += p->numel;
        }
        if (!p->numel) p->value = NULL;
    }
    /* wire the state's parameter views: params[] order is emb, out_norm, out, then GRAD_PER_LAYER per layer */
#define WIRE(S, TYPE)                                                                              \
    do {                                                                                           \
        S.p = calloc((size_t)L, sizeof *S.p);                                                     \
        S.gp = calloc((size_t)L, sizeof *S.gp);                                                   \
        if (!S.p || !S.gp) {                                                                       \
            s = KV_ERR(KV_ENOMEM, "out of memory");                                                \
            goto done;                                                                             \
        }                                                                                          \
        S.emb = g->params[0].value;                                                                \
        S.g_emb = g->params[0].grad;                                                               \
        S.out_norm = g->params[1].value;                                                           \
        S.g_out_norm = g->params[1].grad;                                                          \
        S.out_w = tied ? S.emb : g->params[2].value;                                               \
        S.g_out_w = tied ? S.g_emb : g->params[2].grad;                                            \
        for (int l = 0; l < L; l++) {                                                              \
            const grad_param *q = &g->params[3 + GRAD_PER_LAYER * l];                              \
            TYPE *v[GRAD_PER_LAYER], *gr[GRAD_PER_LAYER];                                          \
            for (int i = 0; i < GRAD_PER_LAYER; i++) {                                             \
                v[i] = q[i].value;                                                                 \
                gr[i] = q[i].grad;                                                                 \
            }                                                                                      \
            S.p[l].attn_norm = v[0], S.p[l].wq = v[1], S.p[l].wk = v[2], S.p[l].wv = v[3];         \
            S.p[l].wo = v[4], S.p[l].bq = v[5], S.p[l].bk = v[6], S.p[l].bv = v[7];                \
            S.p[l].ffn_norm = v[8], S.p[l].wg = v[9], S.p[l].wu = v[10], S.p[l].wd = v[11];        \
            S.gp[l].attn_norm = gr[0], S.gp[l].wq = gr[1], S.gp[l].wk = gr[2], S.gp[l].wv = gr[3]; \
            S.gp[l].wo = gr[4], S.gp[l].bq = gr[5], S.gp[l].bk = gr[6], S.gp[l].bv = gr[7];        \
            S.gp[l].ffn_norm = gr[8], S.gp[l].wg = gr[9], S.gp[l].wu = gr[10], S.gp[l].wd = gr[11]; \
            S.p[l].q_norm = v[12], S.p[l].k_norm = v[13];                                          \
            S.p[l].post_attn_norm = v[14], S.p[l].post_ffn_norm = v[15];                           \
            S.gp[l].q_norm = gr[12], S.gp[l].k_norm = gr[13];                                      \
            S.gp[l].post_attn_norm = gr[14], S.gp[l].post_ffn_norm = gr[15];                       \
        }                                                                                          \
    } while (0)
    if (prec == KV_GRAD_F64)
        WIRE(g->s64, double);
    else
        WIRE(g->s32, float);
#undef WIRE
done:
    if (s != KV_OK) {
        kv_grad_free(g);
        return s;
    }
    *out = g;
    return KV_OK;
}

void kv_grad_free(kv_grad *g) {
    if (!g) return;
    acts_free_f32(&g->s32, g->arch.n_layers);
    acts_free_f64(&g->s64, g->arch.n_layers);
    free(g->s32.p);
    free(g->s32.gp);
    free(g->s64.p);
    free(g->s64.gp);
    free(g->params);
    free(g->inv_freq);
    free(g->inv_freq_local);
    free(g->owned_values);
    free(g->grads);
    free(g);
}

static size_t total_grad_elems(const kv_grad *g) {
    size_t n = 0;
    for (int i = 0; i < g->n_params; i++)
        if (g->params[i].grad) n += g->params[i].numel;
    return n;
}

static double frob(const kv_grad *g, const void *grad, size_t n) {
    double ss = 0;
    if (!grad) return 0.0;
    if (g->prec == KV_GRAD_F64)
        for (size_t i = 0; i < n; i++) ss += ((const double *)grad)[i] * ((const double *)grad)[i];
    else
        for (size_t i = 0; i < n; i++) ss += (double)((const float *)grad)[i] * ((const float *)grad)[i];
    return sqrt(ss);
}

/* One forward (and backward) with the BLAS single-threaded: the run splits its GEMMs and attention
 * heads over its own OpenMP threads (backward_impl.inc), and a multi-threaded BLAS inside them would
 * oversubscribe the cores. The BLAS's previous thread count is restored afterwards. */
static kv_status run_single_blas(kv_grad *g, const int32_t *tokens, int n_tokens, int backward, double *loss) {
    const int prev = openblas_get_num_threads();
    openblas_set_num_threads(1);
    const kv_status s =
        g->prec == KV_GRAD_F64
            ? run_f64(&g->s64, &g->arch, g->inv_freq, g->inv_freq_local, g->fold, tokens, n_tokens, backward,
                      backward && g->all_grads, loss, g->n_threads)
            : run_f32(&g->s32, &g->arch, g->inv_freq, g->inv_freq_local, g->fold, tokens, n_tokens, backward,
                      backward && g->all_grads, loss, g->n_threads);
    openblas_set_num_threads(prev);
    return s;
}

kv_status kv_grad_run(kv_grad *g, const int32_t *tokens, int n_tokens, double *loss, double *k_norm,
                      double *v_norm) {
    memset(g->grads, 0, total_grad_elems(g) * elem_size(g->prec));
    double l = 0;
    kv_status s = run_single_blas(g, tokens, n_tokens, 1, &l);
    if (s != KV_OK) return s;
    if (loss) *loss = l;
    for (int layer = 0; layer < g->arch.n_layers; layer++) {
        const grad_param *q = &g->params[3 + GRAD_PER_LAYER * layer];
        if (k_norm) k_norm[layer] = frob(g, q[2].grad, q[2].numel);
        if (v_norm) v_norm[layer] = frob(g, q[3].grad, q[3].numel);
    }
    return KV_OK;
}

kv_status kv_grad_loss(kv_grad *g, const int32_t *tokens, int n_tokens, double *loss) {
    return run_single_blas(g, tokens, n_tokens, 0, loss);
}

kv_status kv_grad_param(kv_grad *g, const char *name, void **value, const void **grad, size_t *numel) {
    for (int i = 0; i < g->n_params; i++) {
        grad_param *p = &g->params[i];
        if (strcmp(p->name, name) != 0 || !p->numel) continue;
        if (value) *value = g->prec == KV_GRAD_F64 ? p->value : NULL; /* f32 values are the model's, read-only */
        if (grad) *grad = p->grad;
        if (numel) *numel = p->numel;
        return KV_OK;
    }
    return KV_ERR(KV_ENOTFOUND, "backward: no parameter named '%s'", name);
}
