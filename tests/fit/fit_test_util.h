/* fit_test_util.h — a tiny random model whose K/V are exactly linear across layers, for the kvcal
 * fit tests (not a public header).
 *
 * Every layer's attention output projection and FFN down projection are zero, so the residual
 * stream never changes and every layer sees the same normalized input x. Layer 0's K/V projections
 * are random; layer l's are A_l Wk(l-1) and B_l Wv(l-1) with random A_l, B_l (kv_dim x kv_dim).
 * Then K_pre(l) = A_l K_pre(l-1) and V(l) = B_l V(l-1) exactly: the AQUA-KV key predictor must
 * recover A_l, the value predictor [B_l, 0]. */
#ifndef KV_FIT_TEST_UTIL_H
#define KV_FIT_TEST_UTIL_H

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kv_calib.h"
#include "kv_model.h"

enum { SYN_LAYERS = 3, SYN_DMODEL = 48, SYN_HEADS = 4, SYN_KV_HEADS = 2, SYN_HEAD_DIM = 8, SYN_DFF = 64,
       SYN_VOCAB = 97, SYN_KVD = SYN_KV_HEADS * SYN_HEAD_DIM };

typedef struct syn_model {
    kv_arch arch;
    float *embd;                         /* vocab x d_model */
    float *wq;                           /* q_dim x d_model, shared by every layer */
    float *wk[SYN_LAYERS], *wv[SYN_LAYERS]; /* kv_dim x d_model */
    float *A[SYN_LAYERS], *B[SYN_LAYERS];   /* kv_dim x kv_dim (layers >= 1) */
    float *gate, *up;                    /* d_ff x d_model */
    float attn_out;                      /* 0 (syn_init): attention leaves the residual stream alone (the K/V of
                                            every layer stay linear in the embeddings); else the scale of a
                                            fixed pseudo-random output projection, so the cache moves the logits */
} syn_model;

static inline void syn_normal(float *x, size_t n, kv_rng *r, double scale) {
    for (size_t i = 0; i < n; i++) x[i] = (float)(scale * kv_rng_next_normal(r));
}

/* c (m x n) = a (m x k) b (k x n), double accumulation. */
static inline void syn_matmul(float *c, const float *a, const float *b, int m, int k, int n) {
    for (int i = 0; i < m; i++)
        for (int j = 0; j < n; j++) {
            double s = 0;
            for (int t = 0; t < k; t++) s += (double)a[i * k + t] * b[t * n + j];
            c[i * n + j] = (float)s;
        }
}

static inline void syn_init(syn_model *s, uint64_t seed) {
    memset(s, 0, sizeof *s);
    kv_arch *a = &s->arch;
    strcpy(a->arch, "llama");
    strcpy(a->name, "synthetic-linear-kv");
    a->n_layers = SYN_LAYERS;
    a->d_model = SYN_DMODEL;
    a->n_heads = SYN_HEADS;
    a->n_kv_heads = SYN_KV_HEADS;
    a->head_dim = SYN_HEAD_DIM;
    a->d_ff = SYN_DFF;
    a->vocab_size = SYN_VOCAB;
    a->max_seq_len = 4096;
    a->rms_eps = 1e-5f;
    a->rope_theta = 10000.0f;
    a->rope_layout = KV_ROPE_ADJACENT;
    a->tied_embeddings = 1;
    a->bos_id = 1;
    a->eos_id = 2;
    kv_rng r;
    kv_rng_init(&r, seed);
    const int d = SYN_DMODEL, kvd = SYN_KVD;
    s->embd = malloc(sizeof(float) * SYN_VOCAB * d);
    s->wq = malloc(sizeof(float) * SYN_HEADS * SYN_HEAD_DIM * d);
    s->gate = malloc(sizeof(float) * SYN_DFF * d);
    s->up = malloc(sizeof(float) * SYN_DFF * d);
    syn_normal(s->embd, (size_t)SYN_VOCAB * d, &r, 1.0);
    syn_normal(s->wq, (size_t)SYN_HEADS * SYN_HEAD_DIM * d, &r, 1.0 / sqrt(d));
    syn_normal(s->gate, (size_t)SYN_DFF * d, &r, 1.0 / sqrt(d));
    syn_normal(s->up, (size_t)SYN_DFF * d, &r, 1.0 / sqrt(d));
    for (int l = 0; l < SYN_LAYERS; l++) {
        s->wk[l] = malloc(sizeof(float) * kvd * d);
        s->wv[l] = malloc(sizeof(float) * kvd * d);
        if (l == 0) {
            syn_normal(s->wk[0], (size_t)kvd * d, &r, 1.0 / sqrt(d));
            syn_normal(s->wv[0], (size_t)kvd * d, &r, 1.0 / sqrt(d));
            continue;
        }
        s->A[l] = malloc(sizeof(float) * kvd * kvd);
        s->B[l] = malloc(sizeof(float) * kvd * kvd);
        syn_normal(s->A[l], (size_t)kvd * kvd, &r, 0.5 / sqrt(kvd));
        syn_normal(s->B[l], (size_t)kvd * kvd, &r, 0.5 / sqrt(kvd));
        for (int i = 0; i < kvd; i++) s->A[l][i * kvd + i] += 1.0f, s->B[l][i * kvd + i] += 1.0f;
        syn_matmul(s->wk[l], s->A[l], s->wk[l - 1], kvd, kvd, d);
        syn_matmul(s->wv[l], s->B[l], s->wv[l - 1], kvd, kvd, d);
    }
}

static inline void syn_free(syn_model *s) {
    free(s->embd);
    free(s->wq);
    free(s->gate);
    free(s->up);
    for (int l = 0; l < SYN_LAYERS; l++) {
        free(s->wk[l]);
        free(s->wv[l]);
        free(s->A[l]);
        free(s->B[l]);
    }
}

static inline kv_status syn_read(void *user, const char *name, int n_dims, const uint64_t ne[4], float *dst) {
    const syn_model *s = user;
    size_t n = 1;
    for (int i = 0; i < n_dims; i++) n *= (size_t)ne[i];
    int l = -1;
    char what[64] = "";
    if (strcmp(name, "token_embd.weight") == 0) {
        memcpy(dst, s->embd, n * sizeof(float));
        return KV_OK;
    }
    if (strcmp(name, "output_norm.weight") == 0) {
        for (size_t i = 0; i < n; i++) dst[i] = 1.0f;
        return KV_OK;
    }
    if (sscanf(name, "blk.%d.%63s", &l, what) != 2 || l < 0 || l >= SYN_LAYERS) return KV_ENOTFOUND;
    if (strstr(what, "norm.weight")) {
        for (size_t i = 0; i < n; i++) dst[i] = 1.0f;
    } else if (strcmp(what, "attn_q.weight") == 0) {
        memcpy(dst, s->wq, n * sizeof(float));
    } else if (strcmp(what, "attn_k.weight") == 0) {
        memcpy(dst, s->wk[l], n * sizeof(float));
    } else if (strcmp(what, "attn_v.weight") == 0) {
        memcpy(dst, s->wv[l], n * sizeof(float));
    } else if (strcmp(what, "attn_output.weight") == 0 && s->attn_out != 0) {
        for (size_t i = 0; i < n; i++) /* uniform in [-1, 1) x attn_out / sqrt(q_dim), the same in every layer */
            dst[i] = s->attn_out * (float)(2.0 * kv_rng_uniform(777, i) - 1.0) /
                     sqrtf((float)(SYN_HEADS * SYN_HEAD_DIM));
    } else if (strcmp(what, "attn_output.weight") == 0 || strcmp(what, "ffn_down.weight") == 0) {
        memset(dst, 0, n * sizeof(float)); /* the residual stream never changes */
    } else if (strcmp(what, "ffn_gate.weight") == 0) {
        memcpy(dst, s->gate, n * sizeof(float));
    } else if (strcmp(what, "ffn_up.weight") == 0) {
        memcpy(dst, s->up, n * sizeof(float));
    } else {
        return KV_ENOTFOUND;
    }
    return KV_OK;
}

static inline void syn_fingerprint(kv_plan_fingerprint *fp, const kv_arch *a) {
    memset(fp, 0, sizeof *fp);
    strcpy(fp->arch, a->arch);
    fp->n_layers = a->n_layers;
    fp->d_model = a->d_model;
    fp->n_heads = a->n_heads;
    fp->n_kv_heads = a->n_kv_heads;
    fp->head_dim = a->head_dim;
    fp->vocab_size = a->vocab_size;
    fp->rope_theta = a->rope_theta;
    for (int i = 0; i < 32; i++) fp->kv_sha256[i] = (uint8_t)(i * 7 + 1);
}

#endif
