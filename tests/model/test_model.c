/* The reference model on small random-weight models built in memory (kv_model_create):
 *   - logits against a naive double-precision implementation written independently in this file
 *     (loops only, no BLAS) for both RoPE layouts, QKV bias, MHA/GQA/MQA, llama3/linear scaling;
 *   - prefill equals incremental decoding and chunked prefill through the cache;
 *   - a batch of B sequences equals B single runs (also with different past lengths);
 *   - determinism for a fixed thread count; capture hooks; RoPE inverse; rope_freqs.weight;
 *   - f16 weights; perplexity protocols; generation; argument and file errors. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kv_model.h"
#include "kv_test.h"
#include "model_test_util.h"

/* ---- architectures ------------------------------------------------------------------------------ */
static kv_arch make_arch(int variant) {
    kv_arch a;
    memset(&a, 0, sizeof a);
    snprintf(a.arch, sizeof a.arch, "llama");
    a.rms_eps = 1e-5f;
    a.rope_theta = 10000.0f;
    a.bos_id = 1;
    a.eos_id = 2;
    a.max_seq_len = 256;
    switch (variant) {
    case 0: /* adjacent pairs, GQA 2, untied */
        a.n_layers = 2, a.d_model = 32, a.n_heads = 4, a.n_kv_heads = 2, a.head_dim = 8, a.d_ff = 48;
        a.vocab_size = 53, a.rope_layout = KV_ROPE_ADJACENT;
        break;
    case 1: /* halves, QKV bias, MQA, tied, llama3 scaling */
        a.n_layers = 2, a.d_model = 36, a.n_heads = 6, a.n_kv_heads = 1, a.head_dim = 6, a.d_ff = 40;
        a.vocab_size = 47, a.rope_layout = KV_ROPE_HALF, a.qkv_bias = 1, a.tied_embeddings = 1;
        a.rope_theta = 500000.0f, a.rope_scaling = KV_ROPE_SCALING_LLAMA3, a.rope_factor = 4.0f;
        a.rope_low_freq_factor = 1.0f, a.rope_high_freq_factor = 4.0f, a.rope_orig_max_pos = 16;
        break;
    default: /* adjacent, bias, MHA, q_dim != d_model, linear scaling, 3 layers */
        a.n_layers = 3, a.d_model = 24, a.n_heads = 4, a.n_kv_heads = 4, a.head_dim = 10, a.d_ff = 56;
        a.vocab_size = 41, a.rope_layout = KV_ROPE_ADJACENT, a.qkv_bias = 1;
        a.rope_scaling = KV_ROPE_SCALING_LINEAR, a.rope_factor = 2.0f;
        break;
    }
    return a;
}
#define N_VARIANTS 3

/* ---- the in-memory tensor source ------------------------------------------------------------------ */
typedef struct src_ctx {
    uint64_t seed;
    const float *rope_freqs; /* served as rope_freqs.weight when set */
    int n_reads;
} src_ctx;

static int ends_with(const char *s, const char *suffix) {
    const size_t n = strlen(s), k = strlen(suffix);
    return n >= k && strcmp(s + n - k, suffix) == 0;
}

static kv_status mem_read(void *user, const char *name, int n_dims, const uint64_t ne[4], float *dst) {
    src_ctx *c = user;
    size_t n = 1;
    for (int i = 0; i < n_dims; i++) n *= (size_t)ne[i];
    if (strcmp(name, "rope_freqs.weight") == 0) {
        if (!c->rope_freqs) return KV_ENOTFOUND;
        memcpy(dst, c->rope_freqs, n * sizeof(float));
        return KV_OK;
    }
    kv_test_weight_kind kind = KV_TW_MATRIX;
    if (ends_with(name, "norm.weight")) kind = KV_TW_NORM;
    else if (ends_with(name, ".bias")) kind = KV_TW_BIAS;
    else if (strcmp(name, "token_embd.weight") == 0) kind = KV_TW_EMB;
    kv_test_fill(dst, n, name, kind, (int)ne[0], c->seed);
    c->n_reads++;
    return KV_OK;
}

static kv_model *make_model(int variant, const kv_model_options *opt) {
    kv_arch a = make_arch(variant);
    src_ctx c = {KV_TEST_MODEL_SEED + (uint64_t)variant, NULL, 0};
    kv_model *m = NULL;
    ck_assert_kv_ok(kv_model_create(&m, &a, mem_read, &c, opt));
    return m;
}

/* ---- a naive double-precision reference ------------------------------------------------------------ */
static double *ref_tensor(const kv_arch *a, int variant, const char *name, int rows, int cols) {
    (void)a;
    const size_t n = (size_t)rows * (cols ? cols : 1);
    float *f = malloc(n * sizeof(float));
    double *d = malloc(n * sizeof(double));
    src_ctx c = {KV_TEST_MODEL_SEED + (uint64_t)variant, NULL, 0};
    const uint64_t ne[4] = {(uint64_t)(cols ? cols : rows), (uint64_t)(cols ? rows : 1), 1, 1};
    ck_assert_int_eq(mem_read(&c, name, cols ? 2 : 1, ne, f), KV_OK);
    for (size_t i = 0; i < n; i++) d[i] = f[i];
    free(f);
    return d;
}

static void ref_rmsnorm(double *y, const double *x, const double *w, int d, double eps) {
    double ss = 0;
    for (int i = 0; i < d; i++) ss += x[i] * x[i];
    const double s = 1.0 / sqrt(ss / d + eps);
    for (int i = 0; i < d; i++) y[i] = x[i] * s * w[i];
}

static void ref_matvec(double *y, const double *W, const double *b, const double *x, int rows, int cols) {
    for (int r = 0; r < rows; r++) {
        double s = b ? b[r] : 0.0;
        for (int c = 0; c < cols; c++) s += W[(size_t)r * cols + c] * x[c];
        y[r] = s;
    }
}

/* HF-style inverse frequencies, written out again (llama3: _compute_llama3_parameters). */
static double ref_inv_freq(const kv_arch *a, int i) {
    double f = pow((double)a->rope_theta, -2.0 * i / a->head_dim);
    if (a->rope_scaling == KV_ROPE_SCALING_LINEAR) return f / a->rope_factor;
    if (a->rope_scaling != KV_ROPE_SCALING_LLAMA3) return f;
    const double wl = 2 * 3.14159265358979323846 / f, old = a->rope_orig_max_pos;
    if (wl < old / a->rope_high_freq_factor) return f;
    if (wl > old / a->rope_low_freq_factor) return f / a->rope_factor;
    const double sm = (old / wl - a->rope_low_freq_factor) / (a->rope_high_freq_factor - a->rope_low_freq_factor);
    return (1 - sm) * f / a->rope_factor + sm * f;
}

static void ref_rope(const kv_arch *a, double *x, int n_heads, int pos) {
    const int hd = a->head_dim, half = hd / 2;
    for (int h = 0; h < n_heads; h++)
        for (int i = 0; i < half; i++) {
            const int i0 = a->rope_layout == KV_ROPE_ADJACENT ? 2 * i : i;
            const int i1 = a->rope_layout == KV_ROPE_ADJACENT ? 2 * i + 1 : i + half;
            const double ang = pos * ref_inv_freq(a, i), c = cos(ang), s = sin(ang);
            const double x0 = x[h * hd + i0], x1 = x[h * hd + i1];
            x[h * hd + i0] = x0 * c - x1 * s;
            x[h * hd + i1] = x0 * s + x1 * c;
        }
}

/* logits (T x vocab) of one sequence. */
static void ref_forward(int variant, const int32_t *toks, int T, float *logits) {
    const kv_arch A = make_arch(variant), *a = &A;
    const int d = a->d_model, hd = a->head_dim, nh = a->n_heads, nkv = a->n_kv_heads, ff = a->d_ff;
    const int qd = nh * hd, kvd = nkv * hd, V = a->vocab_size;
    double *emb = ref_tensor(a, variant, "token_embd.weight", V, d);
    double *h = calloc((size_t)T * d, sizeof(double)), *x = malloc((size_t)d * sizeof(double));
    double *q = malloc((size_t)T * qd * sizeof(double)), *k = malloc((size_t)T * kvd * sizeof(double));
    double *v = malloc((size_t)T * kvd * sizeof(double)), *att = malloc((size_t)qd * sizeof(double));
    double *tmp = malloc((size_t)(ff > d ? ff : d) * 2 * sizeof(double)), *p = malloc((size_t)T * sizeof(double));
    for (int t = 0; t < T; t++) memcpy(h + (size_t)t * d, emb + (size_t)toks[t] * d, (size_t)d * sizeof(double));
    char name[64];
    for (int l = 0; l < a->n_layers; l++) {
#define W(var, suffix, rows, cols) \
    snprintf(name, sizeof name, "blk.%d.%s", l, suffix); \
    double *var = ref_tensor(a, variant, name, rows, cols)
        W(an, "attn_norm.weight", d, 0);
        W(wq, "attn_q.weight", qd, d);
        W(wk, "attn_k.weight", kvd, d);
        W(wv, "attn_v.weight", kvd, d);
        W(wo, "attn_output.weight", d, qd);
        W(fn, "ffn_norm.weight", d, 0);
        W(wg, "ffn_gate.weight", ff, d);
        W(wu, "ffn_up.weight", ff, d);
        W(wd, "ffn_down.weight", d, ff);
        double *bq = NULL, *bk = NULL, *bv = NULL;
        if (a->qkv_bias) {
            W(bq_, "attn_q.bias", qd, 0);
            W(bk_, "attn_k.bias", kvd, 0);
            W(bv_, "attn_v.bias", kvd, 0);
            bq = bq_, bk = bk_, bv = bv_;
        }
#undef W
        for (int t = 0; t < T; t++) {
            ref_rmsnorm(x, h + (size_t)t * d, an, d, a->rms_eps);
            ref_matvec(q + (size_t)t * qd, wq, bq, x, qd, d);
            ref_matvec(k + (size_t)t * kvd, wk, bk, x, kvd, d);
            ref_matvec(v + (size_t)t * kvd, wv, bv, x, kvd, d);
            ref_rope(a, q + (size_t)t * qd, nh, t);
            ref_rope(a, k + (size_t)t * kvd, nkv, t);
        }
        for (int t = 0; t < T; t++) {
            for (int hh = 0; hh < nh; hh++) {
                const int g = hh / (nh / nkv);
                double mx = -INFINITY, sum = 0;
                for (int j = 0; j <= t; j++) {
                    double s = 0;
                    for (int i = 0; i < hd; i++) s += q[(size_t)t * qd + hh * hd + i] * k[(size_t)j * kvd + g * hd + i];
                    p[j] = s / sqrt((double)hd);
                    mx = p[j] > mx ? p[j] : mx;
                }
                for (int j = 0; j <= t; j++) sum += (p[j] = exp(p[j] - mx));
                for (int i = 0; i < hd; i++) {
                    double o = 0;
                    for (int j = 0; j <= t; j++) o += p[j] / sum * v[(size_t)j * kvd + g * hd + i];
                    att[hh * hd + i] = o;
                }
            }
            ref_matvec(tmp, wo, NULL, att, d, qd);
            for (int i = 0; i < d; i++) h[(size_t)t * d + i] += tmp[i];
        }
        for (int t = 0; t < T; t++) {
            ref_rmsnorm(x, h + (size_t)t * d, fn, d, a->rms_eps);
            double *gg = tmp, *uu = tmp + ff;
            ref_matvec(gg, wg, NULL, x, ff, d);
            ref_matvec(uu, wu, NULL, x, ff, d);
            for (int i = 0; i < ff; i++) gg[i] = gg[i] / (1 + exp(-gg[i])) * uu[i];
            double *o = malloc((size_t)d * sizeof(double));
            ref_matvec(o, wd, NULL, gg, d, ff);
            for (int i = 0; i < d; i++) h[(size_t)t * d + i] += o[i];
            free(o);
        }
        free(an), free(wq), free(wk), free(wv), free(wo), free(fn), free(wg), free(wu), free(wd);
        free(bq), free(bk), free(bv);
    }
    double *on = ref_tensor(a, variant, "output_norm.weight", d, 0);
    double *ow = a->tied_embeddings ? emb : ref_tensor(a, variant, "output.weight", V, d);
    double *lg = malloc((size_t)V * sizeof(double));
    for (int t = 0; t < T; t++) {
        ref_rmsnorm(x, h + (size_t)t * d, on, d, a->rms_eps);
        ref_matvec(lg, ow, NULL, x, V, d);
        for (int i = 0; i < V; i++) logits[(size_t)t * V + i] = (float)lg[i];
    }
    if (ow != emb) free(ow);
    free(on), free(lg), free(emb), free(h), free(x), free(q), free(k), free(v), free(att), free(tmp), free(p);
}

/* ---- helpers --------------------------------------------------------------------------------------- */
/* Tolerance for two f32 computations of the same logits that differ only in summation order (BLAS
 * blocking, gemv vs gemm, softmax over a longer zero-padded row): rounding of ~1e-7 per operation,
 * amplified by a few layers, stays under 1e-6 of the logit range; 1e-5 leaves margin. */
#define ORDER_TOL 1e-5

static void expect_close(const float *got, const float *want, size_t n, double rel, const char *what) {
    double md, mr;
    kv_test_maxdiff(got, want, n, &md, &mr);
    ck_assert_msg(md <= rel * (mr > 1.0 ? mr : 1.0), "%s: max |diff| %g (max |ref| %g, tolerance %g)", what, md, mr,
                  rel);
}

static void prefill(kv_model *m, const int32_t *toks, int B, int T, kv_cache *c, const int *seq_ids, float *logits) {
    kv_forward f;
    memset(&f, 0, sizeof f);
    f.tokens = toks;
    f.n_seqs = B;
    f.n_tokens = T;
    f.cache = c;
    f.seq_ids = seq_ids;
    f.logits = logits;
    ck_assert_kv_ok(kv_model_forward(m, &f));
}

/* ---- tests ------------------------------------------------------------------------------------------ */
START_TEST(test_against_reference) {
    const int T = 29;
    kv_model *m = make_model(_i, NULL);
    const int V = kv_model_arch(m)->vocab_size;
    int32_t toks[T];
    kv_test_tokens(toks, T, V);
    float *got = malloc((size_t)T * V * sizeof(float)), *want = malloc((size_t)T * V * sizeof(float));
    prefill(m, toks, 1, T, NULL, NULL, got);
    ref_forward(_i, toks, T, want);
    /* f32 against double on the same f32 weights: see test_model_hf.c for the same bound's reason. */
    expect_close(got, want, (size_t)T * V, 2e-5, "forward vs naive double reference");
    free(got);
    free(want);
    kv_model_free(m);
}
END_TEST

START_TEST(test_prefill_vs_decode) {
    const int T = 37;
    kv_model *m = make_model(_i, NULL);
    const kv_arch *a = kv_model_arch(m);
    const int V = a->vocab_size;
    int32_t toks[T];
    kv_test_tokens(toks, T, V);
    float *full = malloc((size_t)T * V * sizeof(float)), *inc = malloc((size_t)T * V * sizeof(float));
    prefill(m, toks, 1, T, NULL, NULL, full);

    kv_cache *c = NULL;
    ck_assert_kv_ok(kv_cache_plain_create(&c, a, 1, 0));
    for (int t = 0; t < T; t++) prefill(m, toks + t, 1, 1, c, NULL, inc + (size_t)t * V);
    ck_assert_int_eq(kv_cache_length(c, 0), T);
    expect_close(inc, full, (size_t)T * V, ORDER_TOL, "token-by-token decode vs prefill");

    /* Chunks of uneven sizes through the cache. */
    kv_cache_reset(c, -1);
    ck_assert_int_eq(kv_cache_length(c, 0), 0);
    const int chunks[] = {7, 1, 13, 2, 14};
    for (int i = 0, t = 0; i < 5; t += chunks[i], i++) prefill(m, toks + t, 1, chunks[i], c, NULL, inc + (size_t)t * V);
    expect_close(inc, full, (size_t)T * V, ORDER_TOL, "chunked prefill vs prefill");
    ck_assert_uint_eq(kv_cache_bytes(c), (size_t)2 * T * a->n_kv_heads * a->head_dim * sizeof(float) * a->n_layers);
    kv_cache_free(c);
    free(full);
    free(inc);
    kv_model_free(m);
}
END_TEST

START_TEST(test_batch_vs_single) {
    enum { B = 3, T = 19 };
    kv_model *m = make_model(_i, NULL);
    const kv_arch *a = kv_model_arch(m);
    const int V = a->vocab_size;
    int32_t toks[B * T];
    kv_test_tokens(toks, B * T, V);
    float *batch = malloc((size_t)B * T * V * sizeof(float)), *single = malloc((size_t)B * T * V * sizeof(float));
    prefill(m, toks, B, T, NULL, NULL, batch);
    for (int b = 0; b < B; b++) prefill(m, toks + b * T, 1, T, NULL, NULL, single + (size_t)b * T * V);
    expect_close(batch, single, (size_t)B * T * V, ORDER_TOL, "batched prefill vs single prefills");

    /* Different past lengths in one decode step: slot 2 holds 11 tokens, slot 0 holds 4. */
    kv_cache *c = NULL;
    ck_assert_kv_ok(kv_cache_plain_create(&c, a, 3, 8));
    const int s2 = 2, s0 = 0;
    prefill(m, toks, 1, 11, c, &s2, NULL);
    prefill(m, toks + T, 1, 4, c, &s0, NULL);
    const int ids[2] = {2, 0};
    const int32_t nxt[2] = {toks[11], toks[T + 4]};
    float step[2 * 64];
    ck_assert_int_le(V, 64);
    prefill(m, nxt, 2, 1, c, ids, step);
    ck_assert_int_eq(kv_cache_length(c, 2), 12);
    ck_assert_int_eq(kv_cache_length(c, 0), 5);
    ck_assert_int_eq(kv_cache_length(c, 1), 0);
    /* Row 11 of sequence 0's prefill and row 4 of sequence 1's. */
    expect_close(step, single + (size_t)11 * V, (size_t)V, ORDER_TOL, "batched decode, slot 2");
    expect_close(step + V, single + ((size_t)T + 4) * V, (size_t)V, ORDER_TOL, "batched decode, slot 0");
    kv_cache_free(c);
    free(batch);
    free(single);
    kv_model_free(m);
}
END_TEST

START_TEST(test_threads) {
    enum { B = 2, T = 150 }; /* more than one attention query block */
    kv_model *m = make_model(0, NULL);
    const int V = kv_model_arch(m)->vocab_size;
    int32_t toks[B * T];
    kv_test_tokens(toks, B * T, V);
    const size_t n = (size_t)B * T * V;
    float *r1 = malloc(n * sizeof(float)), *r2 = malloc(n * sizeof(float)), *r3 = malloc(n * sizeof(float));
    kv_model_set_threads(m, 2);
    prefill(m, toks, B, T, NULL, NULL, r1);
    prefill(m, toks, B, T, NULL, NULL, r2);
    ck_assert_msg(memcmp(r1, r2, n * sizeof(float)) == 0, "two runs with the same thread count differ");
    kv_model_set_threads(m, 1);
    ck_assert_int_eq(kv_model_threads(m), 1);
    prefill(m, toks, B, T, NULL, NULL, r3);
    expect_close(r3, r1, n, ORDER_TOL, "1 thread vs 2 threads");
    free(r1);
    free(r2);
    free(r3);
    kv_model_free(m);
}
END_TEST

/* ---- capture hooks --------------------------------------------------------------------------------- */
typedef struct cap_check {
    const kv_model *m;
    int calls, layers_seen[8];
    int fail_at; /* layer whose call returns an error, -1 none */
    double max_err;
} cap_check;

static kv_status on_layer(void *user, const kv_capture *c) {
    cap_check *cc = user;
    const kv_arch *a = kv_model_arch(cc->m);
    const kv_layer_weights *lw = kv_model_layer(cc->m, c->layer);
    cc->calls++;
    cc->layers_seen[c->layer]++;
    if (c->layer == cc->fail_at) return KV_ENUMERIC;
    const size_t rows = (size_t)c->n_seqs * c->n_tokens;
    float *tmp = malloc(rows * (size_t)c->q_dim * sizeof(float));
    /* q = rope(q_pre), k = rope(k_pre), and back. */
    memcpy(tmp, c->q_pre, rows * (size_t)c->q_dim * sizeof(float));
    kv_model_rope(cc->m, tmp, rows, (size_t)c->q_dim, a->n_heads, c->pos, 0);
    for (size_t i = 0; i < rows * (size_t)c->q_dim; i++) cc->max_err = fmax(cc->max_err, fabs(tmp[i] - c->q[i]));
    memcpy(tmp, c->k, rows * (size_t)c->kv_dim * sizeof(float));
    kv_model_rope(cc->m, tmp, rows, (size_t)c->kv_dim, a->n_kv_heads, c->pos, 1);
    for (size_t i = 0; i < rows * (size_t)c->kv_dim; i++) cc->max_err = fmax(cc->max_err, fabs(tmp[i] - c->k_pre[i]));
    /* x = rmsnorm(h) * attn_norm; v = x Wv^T (+ bv). */
    for (size_t r = 0; r < rows; r++) {
        const float *h = c->h + r * c->d_model, *x = c->x + r * c->d_model;
        double ss = 0;
        for (int i = 0; i < c->d_model; i++) ss += (double)h[i] * h[i];
        const double s = 1.0 / sqrt(ss / c->d_model + a->rms_eps);
        for (int i = 0; i < c->d_model; i++) cc->max_err = fmax(cc->max_err, fabs(h[i] * s * lw->attn_norm[i] - x[i]));
        for (int o = 0; o < c->kv_dim; o++) {
            double acc = lw->bv ? lw->bv[o] : 0.0;
            for (int i = 0; i < c->d_model; i++) acc += (double)lw->wv.f32[(size_t)o * c->d_model + i] * x[i];
            cc->max_err = fmax(cc->max_err, fabs(acc - c->v[r * c->kv_dim + o]));
        }
    }
    free(tmp);
    return KV_OK;
}

START_TEST(test_hooks) {
    enum { B = 2, T = 9 };
    kv_model *m = make_model(_i, NULL);
    const kv_arch *a = kv_model_arch(m);
    int32_t toks[B * T];
    kv_test_tokens(toks, B * T, a->vocab_size);
    cap_check cc = {m, 0, {0}, -1, 0.0};
    kv_hooks hk = {on_layer, &cc, 0, 0};
    kv_forward f;
    memset(&f, 0, sizeof f);
    f.tokens = toks;
    f.n_seqs = B;
    f.n_tokens = T;
    f.hooks = &hk;
    ck_assert_kv_ok(kv_model_forward(m, &f));
    ck_assert_int_eq(cc.calls, a->n_layers);
    /* f32 values of order 1 recomputed in double: a few ulps. */
    ck_assert_msg(cc.max_err < 1e-5, "capture consistency error %g", cc.max_err);
    /* Layer range [1, 2). */
    memset(&cc, 0, sizeof cc);
    cc.m = m, cc.fail_at = -1;
    hk.layer_begin = 1, hk.layer_end = 2;
    ck_assert_kv_ok(kv_model_forward(m, &f));
    ck_assert_int_eq(cc.calls, 1);
    ck_assert_int_eq(cc.layers_seen[1], 1);
    /* A hook's error stops the pass with its status. */
    hk.layer_begin = hk.layer_end = 0;
    cc.fail_at = 1;
    ck_assert_int_eq(kv_model_forward(m, &f), KV_ENUMERIC);
    kv_model_free(m);
}
END_TEST

/* llama.cpp's GGUF form of llama3 scaling: per-pair divisors in rope_freqs.weight. A model with
 * scaling NONE plus the divisors equals the model with llama3 scaling. */
START_TEST(test_rope_freqs_tensor) {
    kv_model *m3 = make_model(1, NULL);
    const kv_arch *a = kv_model_arch(m3);
    const int half = a->head_dim / 2;
    float divisors[16];
    const float *inv = kv_model_rope_inv_freq(m3);
    for (int i = 0; i < half; i++) divisors[i] = (float)(pow(a->rope_theta, -2.0 * i / a->head_dim) / inv[i]);
    kv_arch plain = *a;
    plain.rope_scaling = KV_ROPE_SCALING_NONE;
    src_ctx c = {KV_TEST_MODEL_SEED + 1, divisors, 0};
    kv_model *mf = NULL;
    ck_assert_kv_ok(kv_model_create(&mf, &plain, mem_read, &c, NULL));
    for (int i = 0; i < half; i++)
        ck_assert_msg(fabs(kv_model_rope_inv_freq(mf)[i] - inv[i]) <= 1e-6 * inv[i], "pair %d", i);
    kv_model_free(mf);
    kv_model_free(m3);
}
END_TEST

START_TEST(test_f16_weights) {
    const int T = 21;
    kv_model_options o = {0, 1, KV_MODEL_DEVICE_CPU};
    kv_model *m16 = make_model(_i, &o), *m32 = make_model(_i, NULL);
    ck_assert_ptr_nonnull(kv_model_layer(m16, 0)->wq.f16);
    ck_assert_ptr_null(kv_model_layer(m16, 0)->wq.f32);
    ck_assert_uint_lt(kv_model_weight_bytes(m16), kv_model_weight_bytes(m32));
    const int V = kv_model_arch(m32)->vocab_size;
    int32_t toks[T];
    kv_test_tokens(toks, T, V);
    float *a = malloc((size_t)T * V * sizeof(float)), *b = malloc((size_t)T * V * sizeof(float));
    prefill(m16, toks, 1, T, NULL, NULL, a);
    prefill(m32, toks, 1, T, NULL, NULL, b);
    /* f16 rounds each weight by up to 2^-11 relative; through a few layers the logits move by
     * ~1e-3 of their range. 1e-2 bounds that and still catches a wrong conversion (order 1). */
    expect_close(a, b, (size_t)T * V, 1e-2, "f16 weights vs f32 weights");
    free(a);
    free(b);
    kv_model_free(m16);
    kv_model_free(m32);
}
END_TEST

/* ---- perplexity protocols --------------------------------------------------------------------------- */
static double manual_ppl(kv_model *m, const int32_t *text, size_t n, int ctx, int all, size_t *scored) {
    const int V = kv_model_arch(m)->vocab_size;
    float *lg = malloc((size_t)ctx * V * sizeof(float));
    int32_t *in = malloc((size_t)ctx * sizeof(int32_t));
    double sum = 0;
    *scored = 0;
    const size_t stride = all ? (size_t)ctx - 1 : (size_t)ctx;
    for (size_t c = 0; c + stride <= n; c += stride) {
        if (all) {
            in[0] = 1;
            memcpy(in + 1, text + c, (ctx - 1) * sizeof(int32_t));
        } else {
            memcpy(in, text + c, ctx * sizeof(int32_t));
            in[0] = 1;
        }
        prefill(m, in, 1, ctx, NULL, NULL, lg);
        for (int i = all ? 0 : ctx / 2; i < ctx - 1; i++) {
            const int32_t tgt = all ? text[c + i] : text[c + i + 1];
            const float *row = lg + (size_t)i * V;
            double mx = row[0], se = 0;
            for (int j = 1; j < V; j++) mx = row[j] > mx ? row[j] : mx;
            for (int j = 0; j < V; j++) se += exp(row[j] - mx);
            sum += -(row[tgt] - mx - log(se));
            (*scored)++;
        }
    }
    free(lg);
    free(in);
    return exp(sum / *scored);
}

START_TEST(test_eval_protocols) {
    kv_model *m = make_model(0, NULL);
    const int V = kv_model_arch(m)->vocab_size;
    enum { N = 200, CTX = 24 };
    int32_t text[N];
    kv_test_tokens(text, N, V);
    for (int all = 1; all >= 0; all--) {
        size_t scored = 0;
        const double want = manual_ppl(m, text, N, CTX, all, &scored);
        for (int batch = 1; batch <= 3; batch += 2) {
            kv_ppl_options o = {all ? KV_PPL_ALL : KV_PPL_LLAMACPP, CTX, batch, 1, 0, NULL};
            kv_ppl_result r;
            ck_assert_kv_ok(kv_eval_perplexity(&r, m, text, N, &o));
            const size_t chunks = all ? N / (CTX - 1) : N / CTX;
            ck_assert_uint_eq(r.n_chunks, chunks);
            ck_assert_uint_eq(r.tokens_scored, scored);
            ck_assert_uint_eq(r.tokens_scored, chunks * (all ? CTX - 1 : CTX - 1 - CTX / 2));
            ck_assert_uint_eq(r.tokens_evaluated, chunks * CTX);
            ck_assert_uint_eq(r.tokens_total, N);
            /* Same logits up to summation order (batched GEMM rows), NLL in double. */
            ck_assert_msg(fabs(r.ppl - want) <= 1e-5 * want, "protocol %s batch %d: ppl %.9g, manual %.9g",
                          all ? "all" : "llama.cpp", batch, r.ppl, want);
            ck_assert(fabs(r.nll_mean - log(r.ppl)) < 1e-12);
        }
    }
    kv_ppl_options o = {KV_PPL_ALL, CTX, 1, 1, 2, NULL};
    kv_ppl_result r;
    ck_assert_kv_ok(kv_eval_perplexity(&r, m, text, N, &o));
    ck_assert_uint_eq(r.n_chunks, 2);
    ck_assert_int_eq(kv_eval_perplexity(&r, m, text, CTX - 2, &o), KV_EINVAL); /* shorter than a chunk */
    o.bos_id = -1;
    ck_assert_int_eq(kv_eval_perplexity(&r, m, text, N, &o), KV_EINVAL); /* protocol all needs BOS */
    kv_model_free(m);
}
END_TEST

/* ---- generation -------------------------------------------------------------------------------------- */
START_TEST(test_generate) {
    kv_model *m = make_model(_i, NULL);
    const kv_arch *a = kv_model_arch(m);
    const int V = a->vocab_size;
    kv_cache *c = NULL;
    ck_assert_kv_ok(kv_cache_plain_create(&c, a, 1, 0));
    int32_t prompt[5];
    kv_test_tokens(prompt, 5, V);
    enum { N = 20 };
    int32_t out[N], out2[N], seq[5 + N];
    int n = 0, n2 = 0;
    kv_gen_options g = {N, 0.0f, 1.0f, 0, NULL, 0, 0};
    ck_assert_kv_ok(kv_generate(out, &n, NULL, m, c, prompt, 5, &g, NULL, NULL));
    ck_assert_int_eq(n, N);
    /* Greedy through the cache equals argmax of a full prefill of the growing sequence. */
    memcpy(seq, prompt, sizeof prompt);
    float *lg = malloc((size_t)(5 + N) * V * sizeof(float));
    for (int i = 0; i < N; i++) {
        prefill(m, seq, 1, 5 + i, NULL, NULL, lg);
        int32_t best;
        ck_assert_kv_ok(kv_sample_token(&best, lg + (size_t)(4 + i) * V, V, 0.0f, 1.0f, NULL));
        ck_assert_int_eq(out[i], best);
        seq[5 + i] = best;
    }
    /* Sampling: reproducible for a seed; a tiny nucleus is greedy. */
    g.temp = 1.0f, g.seed = 42;
    ck_assert_kv_ok(kv_generate(out2, &n2, NULL, m, c, prompt, 5, &g, NULL, NULL));
    int32_t out3[N];
    int n3 = 0;
    ck_assert_kv_ok(kv_generate(out3, &n3, NULL, m, c, prompt, 5, &g, NULL, NULL));
    ck_assert_int_eq(n2, n3);
    ck_assert_mem_eq(out2, out3, (size_t)n2 * sizeof(int32_t));
    g.top_p = 1e-6f;
    ck_assert_kv_ok(kv_generate(out3, &n3, NULL, m, c, prompt, 5, &g, NULL, NULL));
    ck_assert_mem_eq(out3, out, N * sizeof(int32_t));
    /* Stop token: generation ends before it. */
    const int32_t stop = out[3];
    g.temp = 0.0f, g.top_p = 1.0f, g.stop_ids = &stop, g.n_stop_ids = 1;
    ck_assert_kv_ok(kv_generate(out3, &n3, NULL, m, c, prompt, 5, &g, NULL, NULL));
    int first = 0;
    while (out[first] != out[3]) first++;
    ck_assert_int_eq(n3, first);
    free(lg);
    kv_cache_free(c);
    kv_model_free(m);
}
END_TEST

START_TEST(test_sample_distribution) {
    /* Three logits with probabilities 0.7 / 0.2 / 0.1 at temp 1: frequencies over 20000 draws are within
     * 5 standard deviations (sd <= 0.0033). */
    const float lg[3] = {logf(0.7f), logf(0.2f), logf(0.1f)};
    kv_rng r;
    kv_rng_init(&r, 7);
    int cnt[3] = {0, 0, 0};
    for (int i = 0; i < 20000; i++) {
        int32_t t;
        ck_assert_kv_ok(kv_sample_token(&t, lg, 3, 1.0f, 1.0f, &r));
        cnt[t]++;
    }
    ck_assert(fabs(cnt[0] / 20000.0 - 0.7) < 0.017);
    ck_assert(fabs(cnt[1] / 20000.0 - 0.2) < 0.015);
    /* top_p 0.75 keeps {0, 1}: token 2 never drawn. */
    cnt[2] = 0;
    for (int i = 0; i < 5000; i++) {
        int32_t t;
        ck_assert_kv_ok(kv_sample_token(&t, lg, 3, 1.0f, 0.75f, &r));
        cnt[2] += t == 2;
    }
    ck_assert_int_eq(cnt[2], 0);
}
END_TEST

/* ---- errors ---------------------------------------------------------------------------------------------- */
static kv_status missing_q(void *user, const char *name, int n_dims, const uint64_t ne[4], float *dst) {
    if (strstr(name, "attn_q.weight")) return KV_ENOTFOUND;
    return mem_read(user, name, n_dims, ne, dst);
}

START_TEST(test_errors) {
    kv_model *m = make_model(0, NULL);
    const kv_arch *a = kv_model_arch(m);
    int32_t bad[2] = {0, a->vocab_size};
    kv_forward f;
    memset(&f, 0, sizeof f);
    f.tokens = bad;
    f.n_seqs = 1;
    f.n_tokens = 2;
    ck_assert_int_eq(kv_model_forward(m, &f), KV_EINVAL);
    ck_assert_ptr_nonnull(strstr(kv_error_last(), "outside the vocabulary"));
    /* A cache of another geometry. */
    kv_arch other = *a;
    other.n_kv_heads = 1;
    kv_cache *c = NULL;
    ck_assert_kv_ok(kv_cache_plain_create(&c, &other, 1, 0));
    bad[1] = 3;
    f.cache = c;
    ck_assert_int_eq(kv_model_forward(m, &f), KV_EMISMATCH);
    kv_cache_free(c);
    /* A slot outside the cache. */
    ck_assert_kv_ok(kv_cache_plain_create(&c, a, 1, 0));
    const int slot = 1;
    f.cache = c;
    f.seq_ids = &slot;
    ck_assert_int_eq(kv_model_forward(m, &f), KV_EINVAL);
    /* Appending at a position the plain cache does not hold. */
    float kv[64] = {0};
    const int32_t pos = 5;
    ck_assert_int_eq(kv_cache_append(c, 0, 0, 1, &pos, kv, kv, kv, 16), KV_EINVAL);
    kv_cache_free(c);
    kv_cache_free(NULL);
    kv_model_free(NULL);
    kv_model_free(m);
    /* Architectures the model refuses, and a missing tensor. */
    kv_arch x = make_arch(0);
    src_ctx sc = {KV_TEST_MODEL_SEED, NULL, 0};
    x.n_heads = 3; /* not a multiple of n_kv_heads 2 */
    ck_assert_int_eq(kv_model_create(&m, &x, mem_read, &sc, NULL), KV_EINVAL);
    ck_assert_ptr_null(m);
    x = make_arch(0);
    x.head_dim = 7;
    ck_assert_int_eq(kv_model_create(&m, &x, mem_read, &sc, NULL), KV_EINVAL);
    x = make_arch(1);
    x.rope_orig_max_pos = 0;
    ck_assert_int_eq(kv_model_create(&m, &x, mem_read, &sc, NULL), KV_EINVAL);
    x = make_arch(0);
    ck_assert_int_eq(kv_model_create(&m, &x, missing_q, &sc, NULL), KV_ENOTFOUND);
    ck_assert_ptr_nonnull(strstr(kv_error_last(), "blk.0.attn_q.weight"));
}
END_TEST

int main(void) {
    Suite *s = suite_create("model");
    TCase *tc = tcase_create("random");
    tcase_set_timeout(tc, 120);
    tcase_add_loop_test(tc, test_against_reference, 0, N_VARIANTS);
    tcase_add_loop_test(tc, test_prefill_vs_decode, 0, N_VARIANTS);
    tcase_add_loop_test(tc, test_batch_vs_single, 0, N_VARIANTS);
    tcase_add_test(tc, test_threads);
    tcase_add_loop_test(tc, test_hooks, 0, N_VARIANTS);
    tcase_add_test(tc, test_rope_freqs_tensor);
    tcase_add_loop_test(tc, test_f16_weights, 0, N_VARIANTS);
    tcase_add_test(tc, test_eval_protocols);
    tcase_add_loop_test(tc, test_generate, 0, N_VARIANTS);
    tcase_add_test(tc, test_sample_distribution);
    tcase_add_test(tc, test_errors);
    suite_add_tcase(s, tc);
    return kv_test_run(s);
}
