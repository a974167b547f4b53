/* Layers with an attention window (plan 1.5, RUNTIME.md §11): a windowed layer's query at position p sees the
 * positions p - W + 1 .. p only (the model's mask, model/forward.c `attend`), and the runtime drops what left the
 * window, so that what it holds stays bounded while the sequence grows.
 *
 * Each case runs a plan of two layers (layer 0 windowed, layer 1 full attention) through prefill and decoding
 * steps well beyond the window, and after every step compares each query row's output with exact attention in
 * double over what the runtime holds (kv_rt_decode_head: the decoded cache, the compressed tokens as they decode),
 * masked to the row's window by position (kv_rt_held_positions). Every position of a row's window must be held, and
 * the held tokens of the windowed layer (and the bytes, in kv_rt_get_stream_stats and kv_rt_get_stats) must stay
 * within the window, the recent buffer (blocks leave whole) and the step. Windows of 8 and 16 with block sizes that
 * do not divide them, sinks and none, f16 and uniform (KIVI) streams, keys before RoPE, the direct (<= 4 rows) and
 * the tiled (prefill) attention. Every case runs again on the device backend's host model (KV_RT_DEVICE_CUDA_MODEL:
 * the CUDA kernels' own code, kv_attn_math.h, run on the CPU), where a windowed layer is masked but keeps its tokens
 * (RUNTIME.md §10.8): the same exact reference, every position held. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kv_test.h"
#include "kvrt.h"

typedef struct wcase {
    const char *name;
    int W, sinks, recent;
    int kbits, kgroup, vbits, vgroup; /* 16: f16 stream; else uniform (K groups along tokens, V along channels) */
    int pre_rope;
    int T, prefill, step;
    int share;    /* 1: layer 1 decodes layer 0's codes (XQuant): the windowed layer 0 is then masked, not bounded */
    int local;    /* 1: the windowed layer has its own RoPE base (kv_rt_options.rope_inv_freq_local: 10, not 10000) */
} wcase;

enum { LAYERS = 2, KVH = 2, GQA = 2, HD = 16, KVD = KVH * HD, QD = KVH * GQA * HD };

static const wcase k_cases[] = {
    {"f16 W8 sinks3 recent5 decode", 8, 3, 5, 16, 0, 16, 0, 0, 29, 1, 1, 0, 0},
    {"f16 W16 recent12 prefill20 step3", 16, 0, 12, 16, 0, 16, 0, 0, 52, 20, 3, 0, 0},
    {"kivi4 W8 sinks2 recent6 decode", 8, 2, 6, 4, 6, 4, 8, 0, 30, 1, 1, 0, 0},
    {"kivi2 W16 sinks4 recent12 pre-RoPE prefill25 step7", 16, 4, 12, 2, 12, 2, 16, 1, 60, 25, 7, 0, 0},
    {"kivi4 W16 recent32 (blocks longer than W)", 16, 0, 32, 4, 32, 4, 16, 0, 100, 9, 2, 0, 0},
    {"kivi4 W8 sinks4 recent12 prefill30 step1", 8, 4, 12, 4, 4, 4, 16, 0, 40, 30, 1, 0, 0},
    {"kivi4 W8 sinks2 recent6 XQuant pair (masked, kept)", 8, 2, 6, 4, 6, 4, 8, 0, 30, 7, 1, 1, 0},
    {"f16 W8 sinks2 recent5 pre-RoPE, own RoPE base", 8, 2, 5, 16, 0, 16, 0, 1, 30, 12, 1, 0, 1},
    {"kivi4 W16 recent12 pre-RoPE, own RoPE base", 16, 0, 12, 4, 12, 4, 16, 1, 50, 20, 3, 0, 1},
};

static void set_stream(kv_plan_stream *s, int bits, int group, int axis) {
    if (bits == 16) return; /* kv_plan_create's f16 */
    s->method = KV_PLAN_UNIFORM, s->bits = bits, s->group_size = group, s->group_axis = (kv_plan_group_axis)axis;
    s->scale_dtype = KV_DTYPE_F16;
}

static kv_plan *make_plan(const wcase *c, int window) {
    kv_plan_fingerprint fp;
    memset(&fp, 0, sizeof fp);
    snprintf(fp.arch, sizeof fp.arch, "gemma3");
    fp.n_layers = LAYERS, fp.n_kv_heads = KVH, fp.head_dim = HD, fp.n_heads = KVH * GQA, fp.d_model = QD;
    fp.vocab_size = 32, fp.rope_theta = 10000.0f;
    kv_plan *p = NULL;
    ck_assert_kv_ok(kv_plan_create(&p, &fp));
    p->global.sinks = c->sinks, p->global.recent = c->recent;
    for (int l = 0; l < LAYERS; l++) {
        set_stream(&p->layers[l].stream[KV_PLAN_K], c->kbits, c->kgroup, KV_PLAN_GROUP_TOKENS);
        set_stream(&p->layers[l].stream[KV_PLAN_V], c->vbits, c->vgroup, KV_PLAN_GROUP_CHANNELS);
        p->layers[l].stream[KV_PLAN_K].pre_rope = c->pre_rope;
    }
    p->layers[0].window = window;
    if (c->share)
        for (int st = 0; st < 2; st++) p->layers[1].stream[st].share_codes_with_layer = 0;
    ck_assert_kv_ok(kv_plan_validate(p));
    return p;
}

static double g_freq[HD / 2], g_freq_local[HD / 2];

static void open_rt(kv_rt **rt, const kv_plan *p, kv_rt_device dev, int local) {
    for (int i = 0; i < HD / 2; i++) g_freq[i] = pow(10000.0, -2.0 * i / HD), g_freq_local[i] = pow(10.0, -2.0 * i / HD);
    kv_rt_options o;
    memset(&o, 0, sizeof o);
    o.device = dev, o.n_seqs = 1, o.n_heads = KVH * GQA, o.n_threads = 2;
    o.rope_inv_freq = g_freq, o.rope_layout = KV_ROPE_ADJACENT;
    o.rope_inv_freq_local = local ? g_freq_local : NULL;
    ck_assert_kv_ok(kv_rt_open(rt, p, &o));
}

/* Keys, values and queries of token t of a layer: uniform in [-1, 1), a fixed pattern. */
static float val(int layer, int what, int t, int c) {
    return (float)(2.0 * kv_rng_uniform(0x77696e646f77ull + (uint64_t)(layer * 3 + what), (uint64_t)t * 4096u + (uint64_t)c) -
                   1.0);
}

/* Keys after RoPE (adjacent pairs) from the keys before RoPE, in double then rounded, as a model hands them over. */
static void rope(float *k, const float *kp, int pos, const double *freq) {
    for (int h = 0; h < KVH; h++)
        for (int i = 0; i < HD / 2; i++) {
            const double a = pos * freq[i], x = kp[h * HD + 2 * i], y = kp[h * HD + 2 * i + 1];
            k[h * HD + 2 * i] = (float)(x * cos(a) - y * sin(a));
            k[h * HD + 2 * i + 1] = (float)(x * sin(a) + y * cos(a));
        }
}

/* Exact attention of query row q (position p) of KV head h over the held rows (positions pos) whose position lies in
 * p's window (W = 0: every position <= p); counts the window positions found into *seen. */
static void exact(double *out, const float *q, int h, const float *K, const float *V, const int32_t *pos, int n, int p,
                  int W, int *seen) {
    const int lo = W > 0 ? p - W + 1 : 0;
    double mx = -INFINITY, s[512];
    ck_assert_int_le(n, 512);
    for (int r = 0; r < n; r++) {
        s[r] = -INFINITY;
        if (pos[r] < lo || pos[r] > p) continue;
        double d = 0;
        for (int c = 0; c < HD; c++) d += (double)q[c] * (double)K[(size_t)r * HD + c];
        s[r] = d / sqrt((double)HD);
        mx = s[r] > mx ? s[r] : mx;
    }
    double sum = 0;
    for (int c = 0; c < HD; c++) out[c] = 0;
    *seen = 0;
    for (int r = 0; r < n; r++) {
        if (s[r] == -INFINITY) continue;
        (*seen)++;
        const double e = exp(s[r] - mx);
        sum += e;
        for (int c = 0; c < HD; c++) out[c] += e * (double)V[(size_t)r * HD + c];
    }
    for (int c = 0; c < HD; c++) out[c] /= sum;
    (void)h;
}

/* Tolerance (values lie in [-1, 1)): the runtime works in f32 (products of 16 channels, uniform codes read with the
 * query folded into scales and zero points, exp with a relative error below 4e-7, f32 sums of at most W + recent +
 * step terms), the reference in double over the same decoded values: measured below 2.2e-7 (printed below); 1e-5
 * leaves a factor of 40, while a window one position off moves some row by more than 0.2 (checked below: the same
 * reference with W + 1 must differ by more than 100 x the tolerance). */
#define TOL 1e-5

enum { N_CASES = (int)(sizeof k_cases / sizeof k_cases[0]) };

START_TEST(test_window_attend) {
    const wcase *c = &k_cases[_i % N_CASES];
    const kv_rt_device dev = _i < N_CASES ? KV_RT_DEVICE_CPU : KV_RT_DEVICE_CUDA_MODEL;
    const int kept = c->share || dev != KV_RT_DEVICE_CPU; /* masked, every token kept */
    kv_plan *p = make_plan(c, c->W);
    kv_rt *rt = NULL;
    open_rt(&rt, p, dev, c->local);
    const int maxn = c->prefill > c->step ? c->prefill : c->step;
    float *kp = malloc(sizeof(float) * (size_t)maxn * KVD), *k = malloc(sizeof(float) * (size_t)maxn * KVD);
    float *v = malloc(sizeof(float) * (size_t)maxn * KVD), *q = malloc(sizeof(float) * (size_t)maxn * QD);
    float *out = malloc(sizeof(float) * (size_t)maxn * QD);
    float *K = malloc(sizeof(float) * (size_t)c->T * HD), *V = malloc(sizeof(float) * (size_t)c->T * HD);
    int32_t *pos = malloc(sizeof(int32_t) * (size_t)c->T), *hp = malloc(sizeof(int32_t) * (size_t)c->T);
    double worst = 0, off_by_one = 0;
    int max_held = 0;
    for (int t0 = 0; t0 < c->T;) {
        const int n = t0 == 0 ? c->prefill : (c->step < c->T - t0 ? c->step : c->T - t0);
        for (int i = 0; i < n; i++) pos[i] = t0 + i;
        for (int l = 0; l < LAYERS; l++) {
            for (int i = 0; i < n; i++) {
                for (int ch = 0; ch < KVD; ch++) {
                    kp[(size_t)i * KVD + ch] = val(l, 0, t0 + i, ch);
                    v[(size_t)i * KVD + ch] = val(l, 1, t0 + i, ch);
                }
                for (int ch = 0; ch < QD; ch++) q[(size_t)i * QD + ch] = 1.5f * val(l, 2, t0 + i, ch);
                rope(k + (size_t)i * KVD, kp + (size_t)i * KVD, t0 + i, l == 0 && c->local ? g_freq_local : g_freq);
            }
            ck_assert_kv_ok(kv_rt_append(rt, l, 0, n, pos, kp, k, v, KVD));
            ck_assert_kv_ok(kv_rt_attend(rt, l, 0, n, q, QD, out, QD));
            const int W = l == 0 ? c->W : 0, len = t0 + n;
            for (int h = 0; h < KVH; h++) {
                const int held = kv_rt_held(rt, l, 0, h);
                if (W == 0 || kept) ck_assert_int_eq(held, len);
                /* bounded: the step's rows and the window of its first one, plus what shares a block (or the
                 * sinks) with the window's first position */
                const int extra = c->recent > c->sinks + 1 ? c->recent : c->sinks + 1;
                if (W > 0 && !kept) ck_assert_int_le(held, W + extra + n);
                if (W > 0 && held > max_held) max_held = held;
                ck_assert_kv_ok(kv_rt_decode_head(rt, l, 0, h, K, V));
                ck_assert_kv_ok(kv_rt_held_positions(rt, l, 0, h, hp));
                for (int r = 1; r < held; r++) ck_assert_int_eq(hp[r], hp[r - 1] + 1);
                /* f16 keys before RoPE decode to the keys rotated with the layer's own base: within the f16
                 * rounding of the stored values (2^-11 relative, |x| < 1) and f32 rotation (measured < 1e-3) */
                for (int r = 0; c->kbits == 16 && c->pre_rope && r < held; r++) {
                    float kpr[KVD], kr[KVD];
                    for (int ch = 0; ch < KVD; ch++) kpr[ch] = val(l, 0, hp[r], ch);
                    rope(kr, kpr, hp[r], l == 0 && c->local ? g_freq_local : g_freq);
                    for (int ch = 0; ch < HD; ch++)
                        ck_assert_msg(fabs((double)K[(size_t)r * HD + ch] - kr[h * HD + ch]) < 2e-3,
                                      "%s: layer %d key at %d channel %d: %g, rotated %g", c->name, l, hp[r], ch,
                                      (double)K[(size_t)r * HD + ch], (double)kr[h * HD + ch]);
                }
                if (held > 0) ck_assert_int_eq(hp[held - 1], len - 1);
                for (int i = 0; i < n; i++)
                    for (int g = 0; g < GQA; g++) {
                        const int qh = h * GQA + g, pp = t0 + i;
                        double ref[HD], ref1[HD];
                        int seen, seen1;
                        exact(ref, q + (size_t)i * QD + (size_t)qh * HD, h, K, V, hp, held, pp, W, &seen);
                        /* every position of the row's window is held */
                        const int want = W > 0 ? (pp + 1 < W ? pp + 1 : W) : pp + 1;
                        ck_assert_msg(seen == want, "%s: layer %d row at %d sees %d held positions of %d", c->name, l,
                                      pp, seen, want);
                        for (int ch = 0; ch < HD; ch++) {
                            const double d = fabs((double)out[(size_t)i * QD + (size_t)qh * HD + ch] - ref[ch]);
                            worst = d > worst ? d : worst;
                        }
                        if (W > 0 && pp + 1 > W && hp[0] <= pp - W) { /* the window one position wider, where held */
                            exact(ref1, q + (size_t)i * QD + (size_t)qh * HD, h, K, V, hp, held, pp, W + 1, &seen1);
                            for (int ch = 0; ch < HD; ch++) {
                                const double d = fabs((double)out[(size_t)i * QD + (size_t)qh * HD + ch] - ref1[ch]);
                                off_by_one = d > off_by_one ? d : off_by_one;
                            }
                        }
                    }
            }
            /* the bytes count what is held: the layer's values and, at most, 16 bits each */
            kv_rt_stats ss;
            for (int st = 0; st < 2; st++) {
                ck_assert_kv_ok(kv_rt_get_stream_stats(rt, 0, l, st, &ss));
                ck_assert_uint_eq(ss.values_total, (uint64_t)kv_rt_held(rt, l, 0, 0) * KVD);
                ck_assert_uint_le(ss.accounted_bytes, 2 * ss.values_total);
                if (c->kbits == 16 && c->vbits == 16) ck_assert_uint_eq(ss.accounted_bytes, 2 * ss.values_total);
                ck_assert_uint_eq(ss.values_appended, (uint64_t)len * KVD);
            }
        }
        t0 += n;
    }
    kv_rt_stats all;
    ck_assert_kv_ok(kv_rt_get_stats(rt, 0, &all));
    ck_assert_uint_eq(all.values_total, 2u * (uint64_t)(kv_rt_held(rt, 0, 0, 0) + c->T) * KVD);
    printf("window %-52s %-4s T %3d: max |diff| %.2e (tolerance %.0e), one position wider %.2e, held at most %d of "
           "W %d\n", c->name, dev == KV_RT_DEVICE_CPU ? "cpu" : "host-model", c->T, worst, TOL, off_by_one, max_held, c->W);
    fflush(stdout);
    ck_assert_msg(worst <= TOL, "%s: outputs differ from exact windowed attention by %g", c->name, worst);
    ck_assert_msg(off_by_one > 100 * TOL, "%s: a window one position wider gives the same outputs (%g): the test does "
                  "not see the window's edge", c->name, off_by_one);
    /* rows older than the step's own tokens would need positions that are gone: n_q = held rows reach back to
     * position T - held, whose window starts W - 1 before the first position held */
    const int held = kv_rt_held(rt, 0, 0, 0);
    if (kept) ck_assert_int_eq(held, c->T);
    if (held < c->T) {
        float *qq = calloc((size_t)held * QD, sizeof(float)), *oo = malloc(sizeof(float) * (size_t)held * QD);
        ck_assert_int_eq(kv_rt_attend(rt, 0, 0, held, qq, QD, oo, QD), KV_EINVAL);
        ck_assert_ptr_nonnull(strstr(kv_error_last(), "dropped positions before"));
        free(qq), free(oo);
    }
    kv_rt_close(rt);
    kv_plan_free(p);
    free(kp), free(k), free(v), free(q), free(out), free(K), free(V), free(pos), free(hp);
}
END_TEST

/* Bytes held stop growing: a windowed layer at 4W and at 16W tokens holds the same (decoding one token at a time,
 * recent buffer 12), while the full layer grows with the sequence. */
START_TEST(test_window_bounded) {
    const wcase c = {"bounded", 16, 4, 12, 4, 4, 4, 16, 0, 0, 1, 1, 0, 0};
    kv_plan *p = make_plan(&c, c.W);
    kv_rt *rt = NULL;
    open_rt(&rt, p, KV_RT_DEVICE_CPU, 0);
    float kp[KVD], k[KVD], v[KVD], q[QD], out[QD];
    uint64_t at[2][2];
    for (int t = 0; t < 16 * c.W; t++) {
        const int32_t pos = t;
        for (int l = 0; l < LAYERS; l++) {
            for (int ch = 0; ch < KVD; ch++) kp[ch] = val(l, 0, t, ch), v[ch] = val(l, 1, t, ch);
            for (int ch = 0; ch < QD; ch++) q[ch] = val(l, 2, t, ch);
            rope(k, kp, t, g_freq);
            ck_assert_kv_ok(kv_rt_append(rt, l, 0, 1, &pos, kp, k, v, KVD));
            ck_assert_kv_ok(kv_rt_attend(rt, l, 0, 1, q, QD, out, QD));
        }
        if (t + 1 == 4 * c.W || t + 1 == 16 * c.W)
            for (int l = 0; l < LAYERS; l++) {
                kv_rt_stats s0, s1;
                ck_assert_kv_ok(kv_rt_get_stream_stats(rt, 0, l, 0, &s0));
                ck_assert_kv_ok(kv_rt_get_stream_stats(rt, 0, l, 1, &s1));
                at[t + 1 == 4 * c.W ? 0 : 1][l] = s0.accounted_bytes + s1.accounted_bytes;
            }
    }
    /* the blocks' phase against the window differs between the two lengths: allow one block of K and V */
    const uint64_t block = 2u * 12u * KVD * 2u;
    ck_assert_uint_le(at[1][0], at[0][0] + block);
    ck_assert_uint_ge(at[1][1], 3 * at[0][1]);
    printf("window bounded: layer 0 (W %d) %llu bytes at %d tokens, %llu at %d; layer 1 %llu, %llu\n", c.W,
           (unsigned long long)at[0][0], 4 * c.W, (unsigned long long)at[1][0], 16 * c.W, (unsigned long long)at[0][1],
           (unsigned long long)at[1][1]);
    kv_rt_close(rt);
    kv_plan_free(p);
}
END_TEST

/* Token pruning on a model with windowed layers prunes the layers without a window only: with each policy, layer 0
 * (windowed) gives bit for bit the outputs of the same plan without pruning, layer 1 (full attention) those of the
 * same pruning plan without the window (the test's layers do not feed each other), layer 0 stays bounded by its
 * window and layer 1 holds less than the sequence after the prompt (a budget of 0.1 of the f16 prompt: about half of
 * it at 4 bits). */
static void run_steps(const kv_plan *p, int T, int prefill, float *outs /* LAYERS x T x QD */, int *held_end) {
    kv_rt *rt = NULL;
    open_rt(&rt, p, KV_RT_DEVICE_CPU, 0);
    float *kp = malloc(sizeof(float) * (size_t)T * KVD), *k = malloc(sizeof(float) * (size_t)T * KVD);
    float *v = malloc(sizeof(float) * (size_t)T * KVD), *q = malloc(sizeof(float) * (size_t)T * QD);
    int32_t *pos = malloc(sizeof(int32_t) * (size_t)T);
    for (int t0 = 0; t0 < T;) {
        const int n = t0 == 0 ? prefill : 1;
        for (int i = 0; i < n; i++) pos[i] = t0 + i;
        for (int l = 0; l < LAYERS; l++) {
            for (int i = 0; i < n; i++) {
                for (int ch = 0; ch < KVD; ch++)
                    kp[(size_t)i * KVD + ch] = val(l, 0, t0 + i, ch), v[(size_t)i * KVD + ch] = val(l, 1, t0 + i, ch);
                for (int ch = 0; ch < QD; ch++) q[(size_t)i * QD + ch] = 1.5f * val(l, 2, t0 + i, ch);
                rope(k + (size_t)i * KVD, kp + (size_t)i * KVD, t0 + i, g_freq);
            }
            ck_assert_kv_ok(kv_rt_append(rt, l, 0, n, pos, kp, k, v, KVD));
            ck_assert_kv_ok(kv_rt_attend(rt, l, 0, n, q, QD, outs + ((size_t)l * T + (size_t)t0) * QD, QD));
        }
        t0 += n;
    }
    for (int l = 0; l < LAYERS; l++) held_end[l] = kv_rt_held(rt, l, 0, 0);
    kv_rt_close(rt);
    free(kp), free(k), free(v), free(q), free(pos);
}

START_TEST(test_window_pruning) {
    static const kv_plan_prune policies[] = {KV_PLAN_PRUNE_STREAMINGLLM, KV_PLAN_PRUNE_H2O, KV_PLAN_PRUNE_SNAPKV,
                                             KV_PLAN_PRUNE_PYRAMIDKV};
    const wcase c = {"pruning", 8, 2, 8, 4, 8, 4, 16, 0, 0, 1, 1, 0, 0};
    const int T = 64, prefill = 40;
    const size_t n_out = (size_t)LAYERS * T * QD;
    float *both = malloc(sizeof(float) * n_out), *window_only = malloc(sizeof(float) * n_out);
    float *prune_only = malloc(sizeof(float) * n_out);
    int held_both[LAYERS], held_w[LAYERS], held_p[LAYERS];
    kv_plan *pw = make_plan(&c, c.W);
    run_steps(pw, T, prefill, window_only, held_w);
    for (size_t i = 0; i < sizeof policies / sizeof policies[0]; i++) {
        kv_plan *p = make_plan(&c, c.W), *pp = make_plan(&c, 0);
        for (int j = 0; j < 2; j++) {
            kv_plan *x = j ? pp : p;
            x->global.prune_method = policies[i], x->global.prune_budget = 0.1f, x->global.prune_window = 4;
            ck_assert_kv_ok(kv_plan_validate(x));
        }
        run_steps(p, T, prefill, both, held_both);
        run_steps(pp, T, prefill, prune_only, held_p);
        ck_assert_msg(memcmp(both, window_only, sizeof(float) * (size_t)T * QD) == 0,
                      "%s: the windowed layer's outputs differ from the plan without pruning", kv_plan_prune_name(policies[i]));
        ck_assert_msg(memcmp(both + (size_t)T * QD, prune_only + (size_t)T * QD, sizeof(float) * (size_t)T * QD) == 0,
                      "%s: the full layer's outputs differ from the pruning plan without a window",
                      kv_plan_prune_name(policies[i]));
        ck_assert_int_eq(held_both[0], held_w[0]);
        ck_assert_int_le(held_both[0], c.W + c.recent + 1);
        ck_assert_int_eq(held_both[1], held_p[1]);
        ck_assert_int_lt(held_both[1], T);
        printf("window + %-12s held at %d tokens: windowed layer %d, pruned layer %d\n", kv_plan_prune_name(policies[i]),
               T, held_both[0], held_both[1]);
        kv_plan_free(p);
        kv_plan_free(pp);
    }
    /* a per-layer pruning budget on a windowed layer is refused: the policy does not prune it */
    pw->global.prune_method = KV_PLAN_PRUNE_H2O, pw->global.prune_budget = 0.5f;
    pw->layers[0].prune_budget = 0.25f;
    kv_rt *rt = NULL;
    kv_rt_options o;
    memset(&o, 0, sizeof o);
    o.device = KV_RT_DEVICE_CPU, o.n_seqs = 1, o.n_heads = KVH * GQA, o.n_threads = 1;
    ck_assert_int_eq(kv_rt_open(&rt, pw, &o), KV_EINVAL);
    ck_assert_ptr_nonnull(strstr(kv_error_last(), "does not prune"));
    kv_plan_free(pw);
    free(both), free(window_only), free(prune_only);
}
END_TEST

/* What the runtime does not take with windows yet: prompt statistics; token pruning on the device (any plan). The
 * device's host model opens a windowed plan. */
START_TEST(test_window_refusals) {
    const wcase c = {"refusals", 8, 0, 8, 4, 8, 4, 16, 0, 0, 1, 1, 0, 0};
    kv_plan *p = make_plan(&c, c.W);
    kv_rt *rt = NULL;
    kv_rt_options o;
    memset(&o, 0, sizeof o);
    o.device = KV_RT_DEVICE_CUDA_MODEL, o.n_seqs = 1, o.n_heads = KVH * GQA, o.n_threads = 1;
    ck_assert_kv_ok(kv_rt_open(&rt, p, &o));
    kv_rt_close(rt);
    rt = NULL;
    o.device = KV_RT_DEVICE_CPU;
    o.prompt_stats = 1;
    ck_assert_int_eq(kv_rt_open(&rt, p, &o), KV_EUNSUPPORTED);
    ck_assert_ptr_nonnull(strstr(kv_error_last(), "attention windows"));
    o.prompt_stats = 0;
    ck_assert_kv_ok(kv_rt_open(&rt, p, &o));
    kv_rt_close(rt);
    kv_plan_free(p);
}
END_TEST

int main(void) {
    Suite *s = suite_create("rt_window");
    TCase *tc = tcase_create("window");
    tcase_set_timeout(tc, 120);
    tcase_add_loop_test(tc, test_window_attend, 0, 2 * N_CASES);
    tcase_add_test(tc, test_window_bounded);
    tcase_add_test(tc, test_window_pruning);
    tcase_add_test(tc, test_window_refusals);
    suite_add_tcase(s, tc);
    return kv_test_run(s);
}
