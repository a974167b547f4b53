/* The model with the runtime's compressed cache (model/kv_cache_rt.c -> kernels/rt/) and with the
 * decoded-copy oracle (ccache_oracle.c), on small random models:
 *   - a plan of f16 streams behaves like the exact cache up to f16 rounding;
 *   - the runtime holds exactly what the oracle holds (every decoded key and value, bit for bit), and
 *     the model's logits through both agree to the float-summation differences of their attention;
 *   - feeding one token at a time gives the same logits as feeding whole buffers (the compression
 *     boundaries are a property of the cache, not of how the model is driven);
 *   - the oracle's contents equal an independent replay of the AQUA-KV chain (predict from the
 *     previous layer's reconstruction, quantize the residual, reconstruct, rotate), sinks and the
 *     recent buffer f16-exact;
 *   - the bits accounting adds up chunk by chunk (kv_quant_storage) in both;
 *   - plans the runtime cannot apply, or made for another model, are refused by name. */
#include "kv_test.h"
#include "kv_calib.h"
#include "kv_model.h"
#include "kvrt.h"
#include "ccache_oracle.h"

#include <math.h>

enum { L = 2, D = 16, NH = 4, NKV = 2, HD = 8, FF = 24, VOCAB = 13, KVD = NKV * HD };

static kv_status rand_tensor(void *user, const char *name, int n_dims, const uint64_t ne[4], float *dst) {
    (void)user;
    if (strstr(name, ".bias") || strcmp(name, "output.weight") == 0 || strcmp(name, "rope_freqs.weight") == 0)
        return KV_ENOTFOUND;
    uint64_t h = 1469598103934665603ull;
    for (const char *p = name; *p; p++) h = (h ^ (uint8_t)*p) * 1099511628211ull;
    size_t n = 1;
    for (int i = 0; i < n_dims; i++) n *= ne[i];
    const int is_norm = strstr(name, "norm") != NULL;
    for (size_t i = 0; i < n; i++) {
        const double u = kv_rng_uniform(h, i) - 0.5;
        dst[i] = (float)(is_norm ? 1.0 + 0.2 * u : 1.2 * u);
    }
    return KV_OK;
}

static kv_model *make_model(void) {
    kv_arch a;
    memset(&a, 0, sizeof a);
    snprintf(a.arch, sizeof a.arch, "llama");
    a.n_layers = L, a.d_model = D, a.n_heads = NH, a.n_kv_heads = NKV, a.head_dim = HD, a.d_ff = FF;
    a.vocab_size = VOCAB, a.max_seq_len = 512, a.rms_eps = 1e-5f, a.rope_theta = 10000.0f;
    a.rope_layout = KV_ROPE_ADJACENT, a.tied_embeddings = 1, a.bos_id = 1, a.eos_id = 2;
    kv_model_options opt = {1, 0, KV_MODEL_DEVICE_CPU};
    kv_model *m = NULL;
    ck_assert_kv_ok(kv_model_create(&m, &a, rand_tensor, NULL, &opt));
    return m;
}

static kv_plan *make_plan(const kv_model *m, int sinks, int recent) {
    const kv_arch *a = kv_model_arch(m);
    kv_plan_fingerprint fp;
    memset(&fp, 0, sizeof fp);
    snprintf(fp.arch, sizeof fp.arch, "%s", a->arch);
    fp.n_layers = a->n_layers, fp.d_model = a->d_model, fp.n_heads = a->n_heads, fp.n_kv_heads = a->n_kv_heads;
    fp.head_dim = a->head_dim, fp.vocab_size = a->vocab_size, fp.rope_theta = a->rope_theta;
    kv_plan *p = NULL;
    ck_assert_kv_ok(kv_plan_create(&p, &fp));
    p->global.sinks = sinks;
    p->global.recent = recent;
    p->global.rht_seed = 99;
    return p;
}

/* An AQUA-style plan: layer 0 K and V HIGGS (d=2, n=16 grid: 2 bits) pre-RoPE, layer 1 K uniform
 * 2-bit per-channel groups of 4 tokens with a predictor from layer 0's K, V uniform 3-bit per-token
 * groups of 8 with a predictor from [V(0); K(1)]. */
static kv_plan *make_aqua_plan(const kv_model *m, int sinks, int recent) {
    kv_plan *p = make_plan(m, sinks, recent);
    float *grid = NULL;
    kv_grid_opts go = {.seed = 7, .samples = 4096, .max_iters = 50};
    ck_assert_kv_ok(kv_grid_generate(&grid, NULL, 2, 16, &go));
    int gi = -1;
    ck_assert_kv_ok(kv_plan_add_grid(p, 2, 16, grid, &gi));
    free(grid);
    for (int st = 0; st < 2; st++) {
        kv_plan_stream *s = &p->layers[0].stream[st];
        s->method = KV_PLAN_HIGGS, s->bits = 0, s->group_size = HD, s->group_axis = KV_PLAN_GROUP_CHANNELS;
        s->scale_dtype = KV_DTYPE_F16, s->higgs_grid = gi, s->pre_rope = st == KV_PLAN_K;
    }
    kv_plan_stream *k1 = &p->layers[1].stream[KV_PLAN_K], *v1 = &p->layers[1].stream[KV_PLAN_V];
    k1->method = KV_PLAN_UNIFORM, k1->bits = 2, k1->group_size = 4, k1->group_axis = KV_PLAN_GROUP_TOKENS;
    k1->scale_dtype = KV_DTYPE_F16, k1->pre_rope = 1;
    v1->method = KV_PLAN_UNIFORM, v1->bits = 3, v1->group_size = 8, v1->group_axis = KV_PLAN_GROUP_CHANNELS;
    v1->scale_dtype = KV_DTYPE_F32;
    float wk[KVD * KVD], wv[KVD * 2 * KVD], bk[KVD], bv[KVD];
    kv_rng r;
    kv_rng_init(&r, 5);
    for (int i = 0; i < KVD * KVD; i++) wk[i] = (float)(0.3 * kv_rng_next_normal(&r));
    for (int i = 0; i < 2 * KVD * KVD; i++) wv[i] = (float)(0.2 * kv_rng_next_normal(&r));
    for (int i = 0; i < KVD; i++) bk[i] = (float)(0.1 * kv_rng_next_normal(&r)), bv[i] = (float)(0.1 * kv_rng_next_normal(&r));
    const kv_plan_pred_input ik[1] = {{0, KV_PLAN_K}}, iv[2] = {{0, KV_PLAN_V}, {1, KV_PLAN_K}};
    ck_assert_kv_ok(kv_plan_set_predictor(p, 1, KV_PLAN_K, 1, ik, wk, bk));
    ck_assert_kv_ok(kv_plan_set_predictor(p, 1, KV_PLAN_V, 2, iv, wv, bv));
    ck_assert_kv_ok(kv_plan_validate(p));
    return p;
}

static kv_cache *rt_cache(kv_plan *p, kv_model *m) {
    kv_cache *c = NULL;
    ck_assert_kv_ok(kv_cache_rt_create(&c, p, m, 1, 0, 0, 0));
    return c;
}

static void make_tokens(int32_t *t, int n, uint64_t seed) {
    kv_rng r;
    kv_rng_init(&r, seed);
    t[0] = 1;
    for (int i = 1; i < n; i++) t[i] = 3 + (int32_t)(kv_rng_next_u64(&r) % (VOCAB - 3));
}

/* Run tokens through a cache in steps (first, then step at a time); logits of every position. */
static void run_steps(kv_model *m, kv_cache *c, const int32_t *tok, int n, int first, int step, float *logits) {
    kv_cache_reset(c, -1);
    for (int p = 0; p < n;) {
        int len = p == 0 ? first : step;
        if (len > n - p) len = n - p;
        kv_forward f;
        memset(&f, 0, sizeof f);
        f.tokens = tok + p, f.n_seqs = 1, f.n_tokens = len, f.cache = c, f.logits = logits + (size_t)p * VOCAB;
        ck_assert_kv_ok(kv_model_forward(m, &f));
        p += len;
    }
}

/* f16 streams: the same logits as the exact cache up to f16 rounding of K/V (relative 2^-11 per
 * value, amplified by two layers and the softmax: 2e-2 absolute on logits of magnitude ~3). */
START_TEST(test_f16_plan_close_to_exact) {
    kv_model *m = make_model();
    kv_plan *p = make_plan(m, 4, 8);
    kv_cache *cc = NULL, *pc = NULL;
    if (_i == 0)
        ck_assert_kv_ok(ccache_oracle_create(&cc, p, m, 1));
    else
        cc = rt_cache(p, m);
    ck_assert_kv_ok(kv_cache_plain_create(&pc, kv_model_arch(m), 1, 0));
    int32_t tok[40];
    make_tokens(tok, 40, 3);
    float a[40 * VOCAB], b[40 * VOCAB];
    run_steps(m, cc, tok, 40, 12, 8, a);
    run_steps(m, pc, tok, 40, 12, 8, b);
    double worst = 0, differ = 0;
    for (int i = 0; i < 40 * VOCAB; i++) {
        worst = fmax(worst, fabs(a[i] - b[i]));
        differ += a[i] != b[i];
    }
    ck_assert_double_lt(worst, 2e-2);
    ck_assert_double_gt(differ, 0); /* the f16 rounding is really applied */
    kv_cache_free(cc);
    kv_cache_free(pc);
    kv_plan_free(p);
    kv_model_free(m);
}
END_TEST

/* Token-by-token decoding and buffer-sized steps see the same compression schedule: after every
 * token the compressed count is sinks-exclusive whole chunks, the buffer never exceeds r before the
 * next append; and the logits agree. Not bit for bit: attention over differently partitioned steps
 * sums in a different order (1e-6 on logits before anything is compressed), and a last-bit
 * difference in a compressed chunk's input can flip a code of the 2-bit/3-bit quantizers, which
 * then moves later logits by up to ~1e-3 (observed 6e-4). So: every logit within 1e-2, and the
 * mean difference below 2e-4; the schedule itself is checked exactly through the stats. */
START_TEST(test_step_invariance) {
    kv_model *m = make_model();
    const int sinks = 4, r = 8, T = 45;
    kv_plan *p = make_aqua_plan(m, sinks, r);
    kv_cache *c = rt_cache(p, m);
    kv_rt *rt = kv_cache_rt_runtime(c);
    int32_t tok[45];
    make_tokens(tok, T, 11);
    float a[45 * VOCAB], b[45 * VOCAB];
    kv_cache_reset(c, -1);
    for (int t = 0; t < T; t++) {
        kv_forward f;
        memset(&f, 0, sizeof f);
        f.tokens = tok + t, f.n_seqs = 1, f.n_tokens = 1, f.cache = c, f.logits = a + (size_t)t * VOCAB;
        ck_assert_kv_ok(kv_model_forward(m, &f));
        /* tokens before this append: t; chunks compressed when t - sinks >= r, 2r, ... */
        const int chunks = t > sinks ? (t - sinks) / r : 0;
        kv_rt_stats st;
        ck_assert_kv_ok(kv_rt_get_stats(rt, 0, &st));
        ck_assert_uint_eq(st.values_compressed, 2ull * L * (uint64_t)chunks * r * KVD);
        ck_assert_uint_eq(st.tokens, (uint64_t)t + 1);
    }
    run_steps(m, c, tok, T, sinks + r, r, b);
    double mean = 0;
    for (int i = 0; i < T * VOCAB; i++) {
        ck_assert_msg(fabs(a[i] - b[i]) < 1e-2, "logit %d: %g vs %g", i, a[i], b[i]);
        mean += fabs(a[i] - b[i]) / (T * VOCAB);
    }
    ck_assert_double_lt(mean, 2e-4);
    kv_cache_free(c);
    kv_plan_free(p);
    kv_model_free(m);
}
END_TEST

typedef struct capture_all {
    float kpre[L][64 * KVD], k[L][64 * KVD], v[L][64 * KVD];
    int n;
} capture_all;

static kv_status capture(void *user, const kv_capture *c) {
    capture_all *cap = user;
    memcpy(cap->kpre[c->layer], c->k_pre, sizeof(float) * (size_t)c->n_tokens * KVD);
    memcpy(cap->k[c->layer], c->k, sizeof(float) * (size_t)c->n_tokens * KVD);
    memcpy(cap->v[c->layer], c->v, sizeof(float) * (size_t)c->n_tokens * KVD);
    cap->n = c->n_tokens;
    return KV_OK;
}

/* The cache's contents equal an independent replay of the chain on exactly captured K/V. The
 * replay uses the quantizer and predictor primitives directly; what is checked is the cache's
 * orchestration: chunk boundaries, layer order, inputs from reconstructions, pre-RoPE domain and
 * rotation, f16-exact sinks and buffer (every appended value is rounded to f16 first, as deployed;
 * keys held before RoPE are rotated from their f16 value). Tolerance 1e-5: the chain's float
 * operations are the same, only RoPE's rotation of reconstructed keys may round differently from
 * the model's. */
START_TEST(test_contents_match_replay) {
    kv_model *m = make_model();
    const int sinks = 3, r = 8, T = 3 + 2 * 8 + 5; /* two compressed chunks, 5 tokens in the buffer */
    kv_plan *p = make_aqua_plan(m, sinks, r);
    int32_t tok[64];
    make_tokens(tok, T, 21);
    /* exact K/V of every token (one prefill; the model's K/V do not depend on the cache content of
     * the same layer, but later layers' inputs do: so capture with the cache itself, below) */
    kv_cache *c = NULL;
    ck_assert_kv_ok(ccache_oracle_create(&c, p, m, 1));
    capture_all *cap = calloc(1, sizeof *cap);
    capture_all *step_cap = calloc(1, sizeof *step_cap);
    kv_hooks hooks = {capture, step_cap, 0, 0};
    /* feed: sinks + r, then r, then the rest (5); then one more token to trigger compression of the
     * second chunk... the layout after the feeds: [sinks][chunk 0][chunk 1][buffer 5] */
    const int steps[4] = {sinks + r, r, 5, 0};
    int p0 = 0;
    for (int i = 0; i < 3; i++) {
        kv_forward f;
        memset(&f, 0, sizeof f);
        f.tokens = tok + p0, f.n_seqs = 1, f.n_tokens = steps[i], f.cache = c, f.hooks = &hooks;
        ck_assert_kv_ok(kv_model_forward(m, &f));
        for (int l = 0; l < L; l++) {
            memcpy(cap->kpre[l] + (size_t)p0 * KVD, step_cap->kpre[l], sizeof(float) * steps[i] * KVD);
            memcpy(cap->k[l] + (size_t)p0 * KVD, step_cap->k[l], sizeof(float) * steps[i] * KVD);
            memcpy(cap->v[l] + (size_t)p0 * KVD, step_cap->v[l], sizeof(float) * steps[i] * KVD);
        }
        p0 += steps[i];
    }
    ck_assert_int_eq(p0, T);
    for (int l = 0; l < L; l++) /* what the cache holds of its inputs: f16 */
        for (int i = 0; i < T * KVD; i++) {
            cap->kpre[l][i] = kv_f16_to_f32(kv_f32_to_f16(cap->kpre[l][i]));
            cap->v[l][i] = kv_f16_to_f32(kv_f32_to_f16(cap->v[l][i]));
        }
    /* at the third append the first two buffers... the first append held sinks + chunk 0 in the
     * buffer; the second append compressed chunk 0; the third compressed chunk 1. */
    ccache_oracle_stats st;
    ck_assert_kv_ok(ccache_oracle_get_stats(c, &st));
    ck_assert_uint_eq(st.values_compressed, 2ull * L * 2 * r * KVD);
    ck_assert_uint_eq(st.values_total, 2ull * L * T * KVD);
    /* replay */
    float recon_k[L][64 * KVD], recon_v[L][64 * KVD]; /* compression domain (pre-RoPE) */
    float y[8 * KVD], res[8 * KVD], rh[8 * KVD];
    uint64_t payload = 0;
    for (int ch = 0; ch < 2; ch++) {
        const int t0 = sinks + ch * r;
        for (int l = 0; l < L; l++) {
            for (int stv = 0; stv < 2; stv++) {
                const float *x = (stv == 0 ? cap->kpre[l] : cap->v[l]) + (size_t)t0 * KVD;
                float *dst = (stv == 0 ? recon_k[l] : recon_v[l]) + (size_t)t0 * KVD;
                kv_quant q;
                ck_assert_kv_ok(kv_quant_from_plan(&q, p, l, stv));
                kv_block_storage bs;
                const kv_plan_predictor *pr = p->layers[l].stream[stv].predictor;
                if (pr) {
                    const float *in[2];
                    for (int i = 0; i < pr->n_inputs; i++)
                        in[i] = (pr->inputs[i].stream == 0 ? recon_k[pr->inputs[i].layer] : recon_v[pr->inputs[i].layer]) +
                                (size_t)t0 * KVD;
                    ck_assert_kv_ok(kv_predictor_apply(y, pr, in, (size_t)r, KVD));
                    for (int i = 0; i < r * KVD; i++) res[i] = x[i] - y[i];
                    ck_assert_kv_ok(kv_quant_roundtrip(rh, &bs, &q, (size_t)r, KVD, res));
                    for (int i = 0; i < r * KVD; i++) dst[i] = y[i] + rh[i];
                } else {
                    ck_assert_kv_ok(kv_quant_roundtrip(dst, &bs, &q, (size_t)r, KVD, x));
                }
                payload += bs.total_bits;
            }
        }
    }
    ck_assert_uint_eq(st.payload_bits, payload);
    for (int l = 0; l < L; l++) {
        kv_cache_view view;
        ck_assert_kv_ok(kv_cache_view_layer(c, l, 0, &view));
        ck_assert_int_eq(view.n, T);
        /* expected post-RoPE keys: rotate the reconstructions to their positions */
        float kexp[64 * KVD];
        memcpy(kexp, cap->kpre[l], sizeof(float) * T * KVD);
        memcpy(kexp + sinks * KVD, recon_k[l] + sinks * KVD, sizeof(float) * 2 * r * KVD);
        int32_t pos[64];
        for (int i = 0; i < T; i++) pos[i] = i;
        kv_model_rope(m, kexp, (size_t)T, KVD, NKV, pos, 0);
        for (int t = 0; t < T; t++)
            for (int j = 0; j < KVD; j++) {
                const int compressed = t >= sinks && t < sinks + 2 * r;
                const float ev = compressed ? recon_v[l][t * KVD + j] : cap->v[l][t * KVD + j];
                const float ek = kexp[t * KVD + j];
                if (compressed) {
                    ck_assert_msg(fabs(view.k[t * view.ld_k + j] - ek) < 1e-5, "layer %d token %d K[%d]", l, t, j);
                    ck_assert_msg(fabs(view.v[t * view.ld_v + j] - ev) < 1e-5, "layer %d token %d V[%d]", l, t, j);
                } else { /* sinks and buffer: bit-exact */
                    ck_assert_msg(view.k[t * view.ld_k + j] == ek, "layer %d token %d K[%d] not exact", l, t, j);
                    ck_assert_msg(view.v[t * view.ld_v + j] == ev, "layer %d token %d V[%d] not exact", l, t, j);
                }
            }
    }
    free(cap);
    free(step_cap);
    kv_cache_free(c);
    kv_plan_free(p);
    kv_model_free(m);
}
END_TEST

/* kv_eval_compare: an f32 plan costs only the f16 rounding of the window (every appended key and
 * value is held in f16 until it is compressed, as deployed): KL below 1e-6 (f16's 2^-11 relative
 * rounding on logits of magnitude ~3 moves log-probabilities by ~1e-3, KL ~ their square), the same
 * argmax everywhere and perplexity within 1e-3; an aggressive plan costs something (KL > 0).
 * Both caches (oracle, runtime). */
START_TEST(test_compare) {
    kv_model *m = make_model();
    kv_plan *exact = make_plan(m, 4, 8);
    for (int l = 0; l < L; l++)
        for (int st = 0; st < 2; st++) exact->layers[l].stream[st].bits = 32;
    kv_plan *aqua = make_aqua_plan(m, 4, 8);
    int32_t text[200];
    make_tokens(text, 200, 8);
    kv_compare_options o;
    memset(&o, 0, sizeof o);
    o.ctx = 40, o.bos_id = 1, o.first_step = 12, o.step = 8;
    kv_cache *c = NULL;
    kv_compare_result r;
    if (_i == 0)
        ck_assert_kv_ok(ccache_oracle_create(&c, exact, m, 1));
    else
        c = rt_cache(exact, m);
    ck_assert_kv_ok(kv_eval_compare(m, c, text, 200, &o, &r));
    ck_assert_uint_eq(r.n_chunks, 200 / 39);
    ck_assert_uint_eq(r.tokens_scored, r.n_chunks * 39);
    ck_assert_double_lt(r.kl_mean, 1e-6);
    ck_assert_double_eq_tol(r.ppl, r.ppl_ref, 1e-3 * r.ppl_ref);
    ck_assert_double_eq(r.top1_agreement, 1.0);
    kv_cache_free(c);
    if (_i == 0)
        ck_assert_kv_ok(ccache_oracle_create(&c, aqua, m, 1));
    else
        c = rt_cache(aqua, m);
    ck_assert_kv_ok(kv_eval_compare(m, c, text, 200, &o, &r));
    ck_assert_double_gt(r.kl_mean, 1e-6);
    ck_assert_double_lt(r.top1_agreement, 1.0 + 1e-12);
    kv_cache_free(c);
    kv_plan_free(exact);
    kv_plan_free(aqua);
    kv_model_free(m);
}
END_TEST

/* KVmix recent pivotal context: after each step the stream keeps floor(rpc * current_RPC) of its
 * full-precision window (current_RPC = the step's new tokens + the RPCs kept before), rounded to
 * whole token groups for keys grouped along tokens; the window shrinks as decoding goes on. The
 * expected schedule is computed here from the paper's formula and compared with the cache's
 * accounting after every step of a prefill followed by single-token decoding. */
START_TEST(test_rpc_schedule) {
    kv_model *m = make_model();
    const int sinks = 2, G = 4;
    kv_plan *p = make_plan(m, sinks, 8);
    const float ratio[2] = {0.5f, 0.25f};
    for (int l = 0; l < L; l++) {
        kv_plan_stream *k = &p->layers[l].stream[KV_PLAN_K], *v = &p->layers[l].stream[KV_PLAN_V];
        k->method = KV_PLAN_UNIFORM, k->bits = 2, k->group_size = G, k->group_axis = KV_PLAN_GROUP_TOKENS;
        k->scale_dtype = KV_DTYPE_F16, k->rpc_ratio = ratio[0];
        v->method = KV_PLAN_UNIFORM, v->bits = 2, v->group_size = 8, v->group_axis = KV_PLAN_GROUP_CHANNELS;
        v->scale_dtype = KV_DTYPE_F16, v->rpc_ratio = ratio[1];
    }
    ck_assert_kv_ok(kv_plan_validate(p));
    kv_cache *c = rt_cache(p, m);
    int32_t tok[80];
    make_tokens(tok, 80, 17);
    int n = 0, ce[2] = {0, 0}, pos = 0;
    const int granule[2] = {G, 1};
    int window_after_prefill = -1, window_late = -1;
    while (pos < 80) {
        const int len = pos == 0 ? 40 : 1; /* a prompt, then decoding */
        for (int st = 0; st < 2; st++) { /* the rule, applied at the start of the append */
            if (ce[st] < sinks) ce[st] = sinks < n ? sinks : n;
            const int window = n - ce[st], keep = (int)((double)ratio[st] * window);
            int mm = window - keep;
            mm -= mm % granule[st];
            if (mm > 0) ce[st] += mm;
        }
        kv_forward f;
        memset(&f, 0, sizeof f);
        f.tokens = tok + pos, f.n_seqs = 1, f.n_tokens = len, f.cache = c;
        ck_assert_kv_ok(kv_model_forward(m, &f));
        n += len;
        pos += len;
        kv_rt_stats stt;
        ck_assert_kv_ok(kv_rt_get_stats(kv_cache_rt_runtime(c), 0, &stt));
        const uint64_t expect = (uint64_t)L * KVD * (uint64_t)((ce[0] > sinks ? ce[0] - sinks : 0) + (ce[1] > sinks ? ce[1] - sinks : 0));
        ck_assert_msg(stt.values_compressed == expect, "after %d tokens: %llu compressed values, expected %llu", n,
                      (unsigned long long)stt.values_compressed, (unsigned long long)expect);
        if (n == 41) window_after_prefill = n - ce[1];
        if (n == 80) window_late = n - ce[1];
    }
    /* values after the first decoded token: floor(0.25 * 38) = 9 RPCs of the prompt + the new token;
     * late in decoding the window has shrunk to the newest token (floor(0.25 * 1) = 0 kept) */
    ck_assert_int_eq(window_after_prefill, 10);
    ck_assert_int_eq(window_late, 1);
    /* RPC and AQUA-KV predictors together are refused */
    kv_cache_free(c);
    kv_plan *aq = make_aqua_plan(m, 4, 8);
    aq->layers[1].stream[KV_PLAN_K].rpc_ratio = 0.2f;
    ck_assert_int_eq(kv_cache_rt_create(&c, aq, m, 1, 0, 0, 0), KV_EUNSUPPORTED);
    kv_plan_free(aq);
    kv_plan_free(p);
    kv_model_free(m);
}
END_TEST

/* The runtime holds what the oracle holds, bit for bit, and the model's logits through both agree.
 * Contents: both round the appended values to f16 and compress the same chunks with the same
 * primitives, so every decoded key and value is identical as long as the inputs are; the inputs of
 * layer 1 come from layer 0's attention, which the two compute in different orders (the oracle with
 * BLAS over decoded rows, the runtime from codes): so layer 0 is compared bit for bit, and the
 * logits within 1e-2 (a last-bit difference in an input can flip a 2-bit code, ~1e-3 on logits, as
 * in test_step_invariance) with a mean difference below 2e-4. Token by token and in buffer steps,
 * for an AQUA-KV plan (HIGGS, predictors, pre-RoPE keys) and a KIVI-style plan. */
START_TEST(test_runtime_matches_oracle) {
    kv_model *m = make_model();
    const int T = 45, sinks = 4, r = 8;
    kv_plan *p = _i == 0 ? make_aqua_plan(m, sinks, r) : make_plan(m, sinks, r);
    if (_i == 1) /* KIVI: uniform keys per channel after RoPE, values per token, no predictors */
        for (int l = 0; l < L; l++) {
            kv_plan_stream *k = &p->layers[l].stream[KV_PLAN_K], *v = &p->layers[l].stream[KV_PLAN_V];
            k->method = KV_PLAN_UNIFORM, k->bits = 2, k->group_size = 4, k->group_axis = KV_PLAN_GROUP_TOKENS;
            k->scale_dtype = KV_DTYPE_F16;
            v->method = KV_PLAN_UNIFORM, v->bits = 2, v->group_size = 8, v->group_axis = KV_PLAN_GROUP_CHANNELS;
            v->scale_dtype = KV_DTYPE_F16;
        }
    int32_t tok[45];
    make_tokens(tok, T, 19);
    float a[45 * VOCAB], b[45 * VOCAB];
    for (int mode = 0; mode < 2; mode++) {
        kv_cache *oc = NULL, *rc = rt_cache(p, m);
        ck_assert_kv_ok(ccache_oracle_create(&oc, p, m, 1));
        const int first = mode ? sinks + r : 1, step = mode ? r : 1;
        run_steps(m, oc, tok, T, first, step, a);
        run_steps(m, rc, tok, T, first, step, b);
        double mean = 0;
        for (int i = 0; i < T * VOCAB; i++) {
            ck_assert_msg(fabs(a[i] - b[i]) < 1e-2, "logit %d: %g vs %g", i, a[i], b[i]);
            mean += fabs(a[i] - b[i]) / (T * VOCAB);
        }
        ck_assert_double_lt(mean, 2e-4);
        /* layer 0 holds identical values (its inputs are the same embeddings) */
        kv_cache_view view;
        ck_assert_kv_ok(kv_cache_view_layer(oc, 0, 0, &view));
        float K[64 * HD], V[64 * HD];
        for (int h = 0; h < NKV; h++) {
            ck_assert_kv_ok(kv_rt_decode_head(kv_cache_rt_runtime(rc), 0, 0, h, K, V));
            for (int t = 0; t < T; t++)
                for (int c = 0; c < HD; c++) {
                    ck_assert_msg(K[t * HD + c] == view.k[t * view.ld_k + h * HD + c], "K t %d h %d c %d", t, h, c);
                    ck_assert_msg(V[t * HD + c] == view.v[t * view.ld_v + h * HD + c], "V t %d h %d c %d", t, h, c);
                }
        }
        /* the same accounting */
        ccache_oracle_stats os;
        kv_rt_stats rs;
        ck_assert_kv_ok(ccache_oracle_get_stats(oc, &os));
        ck_assert_kv_ok(kv_rt_get_stats(kv_cache_rt_runtime(rc), 0, &rs));
        ck_assert_uint_eq(rs.values_compressed, os.values_compressed);
        ck_assert_uint_eq(8 * rs.payload_bytes, os.payload_bits);
        ck_assert_uint_eq(8 * rs.fp_bytes, os.fp_bits);
        kv_cache_free(oc);
        kv_cache_free(rc);
    }
    kv_plan_free(p);
    kv_model_free(m);
}
END_TEST

START_TEST(test_refusals) {
    kv_model *m = make_model();
    kv_plan *p = make_aqua_plan(m, 4, 8);
    kv_cache *c = NULL;
    p->layers[1].stream[KV_PLAN_V].share_codes_with_layer = 0;
    ck_assert_int_eq(kv_cache_rt_create(&c, p, m, 1, 0, 0, 0), KV_EUNSUPPORTED);
    ck_assert_ptr_nonnull(strstr(kv_error_last(), "shared codes"));
    ck_assert_ptr_nonnull(strstr(kv_error_last(), "layer 1 V"));
    p->layers[1].stream[KV_PLAN_V].share_codes_with_layer = -1;
    p->global.recent = 6; /* token groups of 4 do not divide 6 */
    ck_assert_int_eq(kv_cache_rt_create(&c, p, m, 1, 0, 0, 0), KV_EFORMAT);
    p->global.recent = 8;
    p->fingerprint.n_layers = 3;
    ck_assert_int_eq(kv_cache_rt_create(&c, p, m, 1, 0, 0, 0), KV_EMISMATCH);
    ck_assert_ptr_null(c);
    kv_plan_free(p);
    kv_model_free(m);
}
END_TEST

int main(void) {
    Suite *s = suite_create("ccache");
    TCase *tc = tcase_create("ccache");
    tcase_set_timeout(tc, 120);
    tcase_add_loop_test(tc, test_f16_plan_close_to_exact, 0, 2);
    tcase_add_test(tc, test_step_invariance);
    tcase_add_test(tc, test_contents_match_replay);
    tcase_add_loop_test(tc, test_compare, 0, 2);
    tcase_add_loop_test(tc, test_runtime_matches_oracle, 0, 2);
    tcase_add_test(tc, test_rpc_schedule);
    tcase_add_test(tc, test_refusals);
    suite_add_tcase(s, tc);
    return kv_test_run(s);
}
