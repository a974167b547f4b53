/* The engine-facing runtime (kernels/rt/, RUNTIME.md) without a model: plans built here, keys,
 * values and queries drawn here, appended step by step, and every attention output compared with
 * exact attention (double precision) over the keys and values the runtime holds, decoded
 * (kv_rt_decode_head). The bound on each output is derived from float summation (RUNTIME.md §4):
 *   scores:  |s_hat - s| <= gamma(n_s) * A_t, n_s = head_dim + log2(g) + 8 terms summed, A_t the sum of
 *            the magnitudes of the terms a kernel adds (uniform: |q_c| (|k_c| + 2 Z_c), Z_c the largest
 *            |k| of the channel; HIGGS: sum over groups of |q_g|_2 |k_g|_2; f16/f32: |q_c k_c|);
 *   weights: a score error d moves a softmax weight by at most (e^{2d} - 1) of itself, the
 *            polynomial exp adds 4e-7 relative;
 *   outputs: sum_t w_t v_t accumulated over at most n_v terms in float (a segment of 2048 tokens on the
 *            decoding path, all tokens on the tiled path) adds gamma(n_v) * sum_t w_t V_tc with V the
 *            term magnitudes as for keys.
 * gamma(n) = n u / (1 - n u), u = 2^-24. Cases cover every method and bit width, eta, both group
 * axes, 3-bit packings, HIGGS groups inside and across heads, keys before RoPE, AQUA-KV predictor
 * chains, KVmix RPC, odd head dims, GQA ratios 1-8, lengths up to several thousand with the sinks,
 * chunk, segment and window boundaries in the middle, both the decoding and the tiled path, and
 * interleaved sequences. Also: the bytes held equal the bytes accounted plus the block descriptors,
 * and the plans or calls the runtime cannot serve are refused by name. */
#include "kv_test.h"
#include "kvrt.h"
#include "rt_dev.h"
#include "rt_internal.h"
#include "kv_kernels_internal.h"

#include <float.h>
#include <math.h>

/* The device the cases run on: the CPU runtime, the CUDA backend's host model (RUNTIME.md §10), or (test_runtime_cuda,
 * built with KV_TEST_CUDA) the GPU; a device's attention sums a split's tokens (up to KV_DA_MAX_SPLIT) in one float
 * accumulator: the tiled path's bound. */
static kv_rt_device g_device = KV_RT_DEVICE_CPU;

/* Every attention output of a run, in order, when g_log_on (the GPU's and the host model's must agree bit for bit). */
static int g_log_on;
static float *g_log;
static size_t g_log_n, g_log_cap;

static void log_outputs(const float *out, size_t n) {
    if (!g_log_on) return;
    if (g_log_n + n > g_log_cap) {
        g_log_cap = (g_log_n + n) * 2;
        g_log = realloc(g_log, g_log_cap * sizeof(float));
        ck_assert_ptr_nonnull(g_log);
    }
    memcpy(g_log + g_log_n, out, n * sizeof(float));
    g_log_n += n;
}

/* Buffers a call hands the runtime: the host's, or device copies for the GPU (copied after the runtime's stream
 * finished the previous call that read them). */
typedef struct iobuf {
    void *dev;
    size_t bytes;
} iobuf;

#ifdef KV_TEST_CUDA
#include <cuda_runtime_api.h>
static void *io_in(kv_rt *rt, iobuf *b, const void *host, size_t bytes) {
    if (g_device != KV_RT_DEVICE_CUDA) return (void *)host;
    ck_assert_int_eq(cudaStreamSynchronize((cudaStream_t)kv_rt_stream(rt)), cudaSuccess);
    if (bytes > b->bytes) {
        if (b->dev) cudaFree(b->dev);
        ck_assert_int_eq(cudaMalloc(&b->dev, bytes), cudaSuccess);
        b->bytes = bytes;
    }
    ck_assert_int_eq(cudaMemcpy(b->dev, host, bytes, cudaMemcpyHostToDevice), cudaSuccess);
    return b->dev;
}
static void io_out(kv_rt *rt, void *host, const iobuf *b, size_t bytes) {
    if (g_device != KV_RT_DEVICE_CUDA) return;
    ck_assert_int_eq(cudaStreamSynchronize((cudaStream_t)kv_rt_stream(rt)), cudaSuccess);
    ck_assert_int_eq(cudaMemcpy(host, b->dev, bytes, cudaMemcpyDeviceToHost), cudaSuccess);
}
static void io_free(iobuf *b) {
    if (b->dev) cudaFree(b->dev);
    b->dev = NULL, b->bytes = 0;
}
#else
static void *io_in(kv_rt *rt, iobuf *b, const void *host, size_t bytes) {
    (void)rt, (void)b, (void)bytes;
    return (void *)host;
}
static void io_out(kv_rt *rt, void *host, const iobuf *b, size_t bytes) { (void)rt, (void)host, (void)b, (void)bytes; }
static void io_free(iobuf *b) { (void)b; }
#endif

/* ---- plans ------------------------------------------------------------------------------------- */
typedef struct sspec {
    int method;      /* KV_PLAN_FP / UNIFORM / HIGGS / FP8_E4M3 / FP8_E5M2 / NVFP4 */
    int bits;        /* FP: 16 | 32; UNIFORM: 1..8 */
    int group;       /* UNIFORM group; HIGGS group (0 = head_dim) */
    int axis;        /* KV_PLAN_GROUP_TOKENS / CHANNELS */
    int pack11;
    float eta;
    int gd, gn;      /* HIGGS grid; float methods: gd = 1 for one scale per KV head */
    int f32params;
    float rpc;
} sspec;

typedef struct rcase {
    const char *name;
    int layers, kv_heads, gqa, hd;
    int sinks, recent;
    sspec k, v;
    sspec k0, v0;    /* layer 0 when set (method >= 0 and bits/gd given), else k, v */
    int has_l0;
    int pre_rope, rope_half;
    int aqua;        /* predictors for layers >= 1: 1 full, r > 1 stored as rank-r factors (plan 1.3) */
    int T, prefill, step;
    int check_every; /* compare every this many steps (and always at the end) */
    int xq_from;     /* > 0: XQuant, layers l + 1 (l >= xq_from, l even) decode layer l's codes (K and V) */
    int squat;       /* SQuat keys on every layer: 0 none, SQ_STATIC (the plan's basis), SQ_PROMPT (the prompt's
                        queries, no basis), SQ_PROMPT_BASIS (the prompt's queries, the basis as the fallback) */
    int sq_r, sq_g;
    float sq_lambda;
} rcase;
enum { SQ_STATIC = 1, SQ_PROMPT = 2, SQ_PROMPT_BASIS = 3 };
#define NO_SQ 0, 0, 0, 0.0f

/* SQuat cases: queries with a few dominant directions per KV head (as real queries have: squat.txt
 * Fig. 2), so that the top-r subspace is well separated; the basis stored in the plan for the static
 * variant is the top-r subspace of queries drawn the same way (other draws). */
#define SQ_DIRS 4
static double sq_dir(int layer, int kvh, int a, int ch) {
    return kv_rng_uniform(4242u, ((uint64_t)layer << 32) ^ ((uint64_t)kvh << 24) ^ ((uint64_t)a << 16) ^ (uint64_t)ch) - 0.5;
}

static float *grid_for(int d, int n, uint64_t seed) {
    float *g = malloc(sizeof(float) * (size_t)(d * n));
    kv_rng r;
    kv_rng_init(&r, seed);
    for (int i = 0; i < d * n; i++) g[i] = (float)kv_rng_next_normal(&r);
    return g;
}

static void set_stream(kv_plan *p, int l, int st, const sspec *s, int hd, int pre_rope) {
    kv_plan_stream *ps = &p->layers[l].stream[st];
    ps->method = (kv_plan_method)s->method;
    ps->scale_dtype = s->f32params ? KV_DTYPE_F32 : KV_DTYPE_F16;
    ps->rpc_ratio = s->rpc;
    ps->pre_rope = st == KV_PLAN_K ? pre_rope : 0;
    ps->higgs_grid = -1;
    if (s->method == KV_PLAN_FP) {
        ps->bits = s->bits;
        ps->group_size = 0;
        ps->scale_dtype = KV_DTYPE_F32;
        return;
    }
    if (kv_plan_method_is_float(s->method)) {
        /* scales near the calibrated amax / max (keys reach ~4, values ~1): codes in the normal range,
         * a few saturating outliers for E4M3; per head: a different scale for each */
        const int nv = s->method == KV_PLAN_NVFP4, nh = s->gd ? p->fingerprint.n_kv_heads : 1;
        ps->bits = nv ? 4 : 8, ps->group_size = nv ? 16 : 0;
        ps->group_axis = nv ? KV_PLAN_GROUP_CHANNELS : KV_PLAN_GROUP_TOKENS, ps->scale_dtype = KV_DTYPE_F32;
        const float base = s->method == KV_PLAN_FP8_E4M3 ? 3.5f / 448.0f : s->method == KV_PLAN_FP8_E5M2 ? 1.0f : 4.0f / 2688.0f;
        float sc[64];
        for (int h = 0; h < nh; h++) sc[h] = base * (1.0f + 0.375f * (float)h);
        ck_assert_kv_ok(kv_plan_set_fp_scales(p, l, st, nh, sc));
        return;
    }
    if (s->method == KV_PLAN_UNIFORM) {
        ps->bits = s->bits, ps->group_size = s->group, ps->group_axis = (kv_plan_group_axis)s->axis;
        ps->eta = s->eta, ps->pack = s->pack11 ? KV_PLAN_PACK_3BIT_11 : KV_PLAN_PACK_WORD;
        return;
    }
    int gi = -1;
    for (int i = 0; i < p->n_grids; i++)
        if (p->grids[i].d == s->gd && p->grids[i].n == s->gn) gi = i;
    if (gi < 0) {
        float *g = grid_for(s->gd, s->gn, 1000u + (uint64_t)(s->gd * 1000 + s->gn));
        ck_assert_kv_ok(kv_plan_add_grid(p, s->gd, s->gn, g, &gi));
        free(g);
    }
    ps->bits = 0, ps->group_size = s->group ? s->group : hd, ps->group_axis = KV_PLAN_GROUP_CHANNELS;
    ps->higgs_grid = gi;
}

static kv_plan *make_plan(const rcase *c) {
    kv_plan_fingerprint fp;
    memset(&fp, 0, sizeof fp);
    snprintf(fp.arch, sizeof fp.arch, "llama");
    fp.n_layers = c->layers, fp.n_kv_heads = c->kv_heads, fp.head_dim = c->hd;
    fp.n_heads = c->kv_heads * c->gqa, fp.d_model = fp.n_heads * c->hd, fp.vocab_size = 32, fp.rope_theta = 10000.0f;
    kv_plan *p = NULL;
    ck_assert_kv_ok(kv_plan_create(&p, &fp));
    p->global.sinks = c->sinks, p->global.recent = c->recent, p->global.rht_seed = 77;
    const int kvd = c->kv_heads * c->hd;
    for (int l = 0; l < c->layers; l++) {
        set_stream(p, l, KV_PLAN_K, l == 0 && c->has_l0 ? &c->k0 : &c->k, c->hd, c->pre_rope);
        set_stream(p, l, KV_PLAN_V, l == 0 && c->has_l0 ? &c->v0 : &c->v, c->hd, 0);
        if (c->xq_from > 0 && l > c->xq_from && (l - c->xq_from) % 2 == 1)
            p->layers[l].stream[KV_PLAN_K].share_codes_with_layer = p->layers[l].stream[KV_PLAN_V].share_codes_with_layer =
                l - 1;
        if (c->aqua && l >= 1) {
            kv_rng r;
            kv_rng_init(&r, 31u + (uint64_t)l);
            float *wk = malloc(sizeof(float) * (size_t)kvd * kvd), *wv = malloc(sizeof(float) * (size_t)kvd * 2 * kvd);
            float *b = malloc(sizeof(float) * (size_t)kvd);
            for (int i = 0; i < kvd * kvd; i++) wk[i] = (float)(0.5 / sqrt((double)kvd) * kv_rng_next_normal(&r));
            for (int i = 0; i < 2 * kvd * kvd; i++) wv[i] = (float)(0.3 / sqrt((double)kvd) * kv_rng_next_normal(&r));
            for (int i = 0; i < kvd; i++) b[i] = (float)(0.1 * kv_rng_next_normal(&r));
            const kv_plan_pred_input ik[1] = {{l - 1, KV_PLAN_K}}, iv[2] = {{l - 1, KV_PLAN_V}, {l, KV_PLAN_K}};
            ck_assert_kv_ok(kv_plan_set_predictor(p, l, KV_PLAN_K, 1, ik, wk, b));
            ck_assert_kv_ok(kv_plan_set_predictor(p, l, KV_PLAN_V, 2, iv, wv, b));
            if (c->aqua > 1) { /* factors of about the dense weights' scale: K kvd x kvd, V kvd x 2 kvd */
                const int rk = c->aqua;
                float *lf = malloc(sizeof(float) * (size_t)kvd * rk), *rf = malloc(sizeof(float) * (size_t)rk * 2 * kvd);
                for (int st = 0; st < 2; st++) {
                    for (int i = 0; i < kvd * rk; i++) lf[i] = (float)(0.7 / sqrt((double)rk) * kv_rng_next_normal(&r));
                    for (int i = 0; i < rk * 2 * kvd; i++) rf[i] = (float)(0.7 / sqrt((double)kvd * (st + 1)) * kv_rng_next_normal(&r));
                    ck_assert_kv_ok(kv_plan_set_predictor_factors(p, l, st, rk, lf, rf));
                }
                free(lf), free(rf);
            }
            free(wk), free(wv), free(b);
        }
        if (c->squat) {
            float *basis = NULL;
            if (c->squat != SQ_PROMPT) { /* per KV head the top-r subspace of 200 queries drawn like run_case's */
                const int nq = 200;
                basis = malloc(sizeof(float) * (size_t)c->kv_heads * (size_t)c->sq_r * (size_t)c->hd);
                float *qs = malloc(sizeof(float) * (size_t)nq * (size_t)c->hd);
                kv_rng r;
                kv_rng_init(&r, 77u + (uint64_t)l);
                for (int h = 0; h < c->kv_heads; h++) {
                    for (int i = 0; i < nq; i++) {
                        double z[SQ_DIRS];
                        for (int a = 0; a < SQ_DIRS; a++) z[a] = kv_rng_next_normal(&r);
                        for (int ch = 0; ch < c->hd; ch++) {
                            double v = 1.5 * kv_rng_next_normal(&r);
                            for (int a = 0; a < SQ_DIRS; a++) v += 12.0 * z[a] * sq_dir(l, h, a, ch);
                            qs[(size_t)i * c->hd + ch] = (float)v;
                        }
                    }
                    ck_assert_kv_ok(kv_squat_subspace_ref(basis + (size_t)h * c->sq_r * c->hd, qs, (size_t)nq, c->hd, c->sq_r));
                }
                free(qs);
            }
            ck_assert_kv_ok(kv_plan_set_squat(p, l, c->sq_r, c->sq_lambda, c->sq_g, basis));
            p->layers[l].stream[KV_PLAN_K].squat->static_subspace = c->squat == SQ_STATIC;
            free(basis);
        }
    }
    ck_assert_kv_ok(kv_plan_validate(p));
    return p;
}

/* The queries of step (len, layer, seq): n rows of qd floats (run_case and the replay draw the same). */
static void make_queries(float *q, const rcase *c, int n, int len, int l, int sq) {
    const int qd = c->kv_heads * c->gqa * c->hd;
    kv_rng r;
    kv_rng_init(&r, 900u + (uint64_t)(len * 131 + l * 7 + sq));
    for (size_t i = 0; i < (size_t)n * qd; i++) q[i] = (float)(1.5 * kv_rng_next_normal(&r));
    if (!c->squat) return;
    for (int i = 0; i < n; i++)
        for (int hq = 0; hq < c->kv_heads * c->gqa; hq++) {
            const int h = hq / c->gqa;
            double z[SQ_DIRS];
            for (int a = 0; a < SQ_DIRS; a++) z[a] = kv_rng_next_normal(&r);
            float *row = q + (size_t)i * qd + (size_t)hq * c->hd;
            for (int ch = 0; ch < c->hd; ch++) {
                double v = row[ch];
                for (int a = 0; a < SQ_DIRS; a++) v += 12.0 * z[a] * sq_dir(l, h, a, ch);
                row[ch] = (float)v;
            }
        }
}

static double *rope_freqs(int hd) {
    double *f = malloc(sizeof(double) * (size_t)(hd / 2));
    for (int i = 0; i < hd / 2; i++) f[i] = pow(10000.0, -2.0 * i / hd);
    return f;
}

/* ---- data: keys with per-channel offsets and a few outlier channels (as real keys have) -------- */
static void fill_kv(float *k, float *v, int n, int kvd, int layer, int t0, uint64_t seed) {
    for (int i = 0; i < n; i++)
        for (int c = 0; c < kvd; c++) {
            const uint64_t ctr = ((uint64_t)layer << 40) ^ ((uint64_t)(t0 + i) << 16) ^ (uint64_t)c;
            const double z1 = kv_rng_uniform(seed, 2 * ctr) - 0.5, z2 = kv_rng_uniform(seed ^ 0x55, 2 * ctr + 1) - 0.5;
            const double off = (c % 7 == 3) ? 3.0 : 0.3 * ((c * 37) % 11 - 5) / 5.0;
            k[(size_t)i * kvd + c] = (float)(off + 2.0 * z1);
            v[(size_t)i * kvd + c] = (float)(1.6 * z2 + 0.2 * (c % 3));
        }
}

/* ---- the reference and its bound ------------------------------------------------------------------- */
typedef struct refctx {
    int kind_k, kind_v; /* 0 fp, 1 uniform, 2 higgs */
    int gk, gv;          /* HIGGS groups */
} refctx;

static int stream_kind(const kv_plan_stream *s) {
    return s->method == KV_PLAN_UNIFORM ? 1 : s->method == KV_PLAN_HIGGS ? 2 : 0;
}

static double gamma_n(double n) {
    const double u = ldexp(1.0, -24);
    return n * u / (1.0 - n * u);
}

/* Per-term magnitudes of one row (key or value) for the bound: fills mag[hd]. */
static void term_mag(int kind, int g, const float *row, const double *zmax, int hd, double *mag) {
    if (kind == 1) {
        for (int c = 0; c < hd; c++) mag[c] = fabs(row[c]) + 2.0 * zmax[c];
    } else if (kind == 2) { /* a group's norm spread over its channels: sum_c |q_c| mag_c >= |q_g| |k_g| */
        for (int a = 0; a < hd; a += g) {
            const int b = a + g < hd ? a + g : hd;
            double nk = 0;
            for (int c = a; c < b; c++) nk += (double)row[c] * row[c];
            for (int c = a; c < b; c++) mag[c] = sqrt(nk);
        }
    } else {
        for (int c = 0; c < hd; c++) mag[c] = fabs(row[c]);
    }
}

/* Softmax weights the checked queries give each held token, summed (the scores H2O and SnapKV select
 * by), per KV head and position: acc[h * acc_ld + position] += weight, for query rows r >= row_min (the
 * step's rows are numbered 0..n_q-1). */
typedef struct acc_out {
    double *acc;
    int acc_ld, row_min;
} acc_out;

/* Compare one attend call's output with exact attention over the decoded cache (the tokens each KV head
 * holds: kv_rt_held); returns the largest error relative to its bound. */
static double check_attend_acc(kv_rt *rt, const kv_plan *p, int layer, int seq, int n_q, const float *q,
                               const float *out, int H, int G, int hd, int tiled, const char *what, const acc_out *ao) {
    const refctx rc = {stream_kind(&p->layers[layer].stream[0]), stream_kind(&p->layers[layer].stream[1]),
                       p->layers[layer].stream[0].group_size, p->layers[layer].stream[1].group_size};
    const int qd = H * G * hd, nmax = rt->seqs[seq].layer_n[layer];
    const double scale = 1.0 / sqrt((double)hd);
    float *K = malloc(sizeof(float) * (size_t)(nmax + 1) * hd), *V = malloc(sizeof(float) * (size_t)(nmax + 1) * hd);
    double *s = malloc(sizeof(double) * (size_t)(nmax + 1)), *ref = malloc(sizeof(double) * (size_t)hd);
    double *kz = calloc((size_t)hd, sizeof(double)), *vz = calloc((size_t)hd, sizeof(double));
    double *km = malloc(sizeof(double) * (size_t)(nmax + 1) * hd), *vm = malloc(sizeof(double) * (size_t)(nmax + 1) * hd);
    int32_t *tpos = malloc(sizeof(int32_t) * (size_t)(nmax + 1));
    double worst = 0;
    const int lg = rc.kind_k == 2 ? (int)log2((double)(rc.gk > 0 ? rc.gk : 1)) : 0;
    for (int h = 0; h < H; h++) {
        const int n = kv_rt_held(rt, layer, seq, h);
        ck_assert_int_ge(n, n_q);
        ck_assert_int_le(n, nmax);
        ck_assert_kv_ok(kv_rt_decode_head(rt, layer, seq, h, K, V));
        ck_assert_kv_ok(kv_rt_held_positions(rt, layer, seq, h, tpos));
        for (int t = 1; t < n; t++) ck_assert_int_lt(tpos[t - 1], tpos[t]);
        if (n) ck_assert_int_eq(tpos[n - 1], nmax - 1); /* the step's own tokens are held */
        for (int t = 0; t < n; t++)
            for (int c = 0; c < hd; c++) {
                kz[c] = fmax(kz[c], fabs(K[(size_t)t * hd + c]));
                vz[c] = fmax(vz[c], fabs(V[(size_t)t * hd + c]));
            }
        for (int t = 0; t < n; t++) {
            term_mag(rc.kind_k, rc.gk, K + (size_t)t * hd, kz, hd, km + (size_t)t * hd);
            term_mag(rc.kind_v, rc.gv, V + (size_t)t * hd, vz, hd, vm + (size_t)t * hd);
        }
        for (int r = 0; r < n_q; r++)
            for (int gq = 0; gq < G; gq++) {
                const float *qv = q + (size_t)r * qd + (size_t)(h * G + gq) * hd;
                const int lim = n - n_q + r + 1;
                double mx = -INFINITY, bmax = 0;
                for (int t = 0; t < lim; t++) {
                    double acc = 0, a = 0;
                    for (int c = 0; c < hd; c++) {
                        acc += (double)qv[c] * K[(size_t)t * hd + c];
                        a += fabs((double)qv[c]) * km[(size_t)t * hd + c];
                    }
                    s[t] = acc * scale;
                    /* the kernels sum scaled queries: one more rounding per product */
                    bmax = fmax(bmax, gamma_n(hd + lg + 8) * a * scale);
                    mx = fmax(mx, s[t]);
                }
                double sum = 0;
                for (int t = 0; t < lim; t++) sum += (s[t] = exp(s[t] - mx));
                const double wrel = expm1(2.0 * bmax) + 1e-6; /* weight perturbation, relative */
                const double nv = tiled ? lim + 8 : (lim < RT_SEGMENT ? lim : RT_SEGMENT) + 8;
                for (int c = 0; c < hd; c++) {
                    double o = 0;
                    for (int t = 0; t < lim; t++) o += s[t] * V[(size_t)t * hd + c];
                    ref[c] = o / sum;
                }
                if (ao && r >= ao->row_min)
                    for (int t = 0; t < lim; t++) ao->acc[(size_t)h * (size_t)ao->acc_ld + (size_t)tpos[t]] += s[t] / sum;
                for (int c = 0; c < hd; c++) {
                    double spread = 0, mag = 0;
                    for (int t = 0; t < lim; t++) {
                        spread += s[t] / sum * fabs(V[(size_t)t * hd + c] - ref[c]);
                        mag += s[t] / sum * vm[(size_t)t * hd + c];
                    }
                    const double bound = 2.0 * wrel * spread + gamma_n(nv) * mag + gamma_n(8) * fabs(ref[c]) + 1e-30;
                    const double got = out[(size_t)r * qd + (size_t)(h * G + gq) * hd + c];
                    const double err = fabs(got - ref[c]);
                    if (!(err <= bound))
                        ck_abort_msg("%s: layer %d seq %d head %d row %d/%d ch %d: got %.9g want %.9g (err %.3g > bound %.3g, "
                                     "n %d)", what, layer, seq, h * G + gq, r, n_q, c, got, ref[c], err, bound, n);
                    worst = fmax(worst, err / bound);
                }
            }
    }
    free(K), free(V), free(s), free(ref), free(kz), free(vz), free(km), free(vm), free(tpos);
    return worst;
}

static double check_attend(kv_rt *rt, const kv_plan *p, int layer, int seq, int n, int n_q, const float *q,
                           const float *out, int H, int G, int hd, int tiled, const char *what) {
    ck_assert_int_eq(n, rt->seqs[seq].layer_n[layer]);
    return check_attend_acc(rt, p, layer, seq, n_q, q, out, H, G, hd, tiled, what, NULL);
}

/* Bytes: allocated = payload + f16 rows + descriptors, and the payload is what the quantizers say
 * for the blocks the semantics produce (checked against kv_quant_storage by the block sizes). */
static void check_bytes(kv_rt *rt, int seq) {
    kv_rt_stats st;
    ck_assert_kv_ok(kv_rt_get_stats(rt, seq, &st));
    ck_assert_uint_eq(st.allocated_bytes, st.accounted_bytes + st.overhead_bytes);
    ck_assert_uint_eq(st.accounted_bytes, st.payload_bytes + st.index_bytes + st.fp_bytes);
    ck_assert_uint_eq(st.fp_bytes, 2u * (st.values_total - st.values_compressed));
    ck_assert_uint_le(st.values_total, st.values_appended);
    /* a stored SQuat basis is held once per runtime and enters the honest bits like predictor weights */
    uint64_t basis = 0;
    for (int l = 0; l < rt->plan->n_layers; l++) {
        const kv_plan_squat *q = rt->plan->layers[l].stream[KV_PLAN_K].squat;
        if (q && q->basis)
            basis += sizeof(float) * (uint64_t)rt->plan->fingerprint.n_kv_heads * (uint64_t)q->r *
                     (uint64_t)rt->plan->fingerprint.head_dim;
    }
    ck_assert_uint_eq(st.basis_bytes, basis);
    if (st.values_total)
        ck_assert_double_eq_tol(st.bits_per_value_total,
                                8.0 * (double)(st.accounted_bytes + st.predictor_bytes + basis) / (double)st.values_total,
                                1e-12 * st.bits_per_value_total);
    /* descriptors: 16 per stream at first, doubling: at most 2 x blocks + 16 per stream (a device runtime holds
     * arena pages and f16 rows with room to grow: its overhead is what it holds beyond the accounted bytes) */
    if (!rt->dv) ck_assert_uint_le(st.overhead_bytes, (uint64_t)sizeof(rt_block) * (2u * st.values_total + 16u * 64u));
}

/* ---- an independent replay of what the cache must hold --------------------------------------------
 * The semantics simulated step by step with the public quantizer API (kv_quant_roundtrip,
 * kv_predictor_apply), not the runtime's blocks: every held key and value, decoded, must equal the
 * replay bit for bit (sinks and window: the f16-rounded input; compressed chunks: prediction from
 * the replayed reconstructions plus the round trip of the residual; keys before RoPE rotated). */
/* The model's RoPE of one head's row at position pos (what the runtime must reproduce). */
static void rope_row(float *row, int hd, int half_layout, const double *freq, int pos) {
    for (int pr = 0; pr < hd / 2; pr++) {
        const double ang = (double)pos * freq[pr];
        const int i0 = half_layout ? pr : 2 * pr, i1 = half_layout ? pr + hd / 2 : 2 * pr + 1;
        const float cs = (float)cos(ang), sn = (float)sin(ang), a = row[i0], b = row[i1];
        row[i0] = a * cs - b * sn;
        row[i1] = a * sn + b * cs;
    }
}

static void f16_round(float *x, size_t n) {
    for (size_t i = 0; i < n; i++) x[i] = kv_f16_to_f32(kv_f32_to_f16(x[i]));
}

static void check_replay(kv_rt *rt, const kv_plan *p, const rcase *c, int seq, int T, const double *freq) {
    const int L = c->layers, kvd = c->kv_heads * c->hd, hd = c->hd;
    float *x = malloc(sizeof(float) * (size_t)T * kvd * 2 * L);   /* inputs, f16-rounded: [l][stream][t] */
    float *rec = malloc(sizeof(float) * (size_t)T * kvd * 2 * L); /* expected decoded (compression domain) */
    float *tmpk = malloc(sizeof(float) * (size_t)T * kvd), *tmpv = malloc(sizeof(float) * (size_t)T * kvd);
    float *pred = malloc(sizeof(float) * (size_t)T * kvd), *res = malloc(sizeof(float) * (size_t)T * kvd);
#define XS(l, st) (x + ((size_t)(l) * 2 + (size_t)(st)) * (size_t)T * kvd)
#define RS(l, st) (rec + ((size_t)(l) * 2 + (size_t)(st)) * (size_t)T * kvd)
    for (int l = 0; l < L; l++) {
        fill_kv(tmpk, tmpv, T, kvd, l, 0, 5u + (uint64_t)seq);
        if (!c->pre_rope) /* keys compressed after RoPE */
            for (int t = 0; t < T; t++)
                for (int h = 0; h < c->kv_heads; h++) rope_row(tmpk + (size_t)t * kvd + (size_t)h * hd, hd, c->rope_half, freq, t);
        f16_round(tmpk, (size_t)T * kvd), f16_round(tmpv, (size_t)T * kvd);
        memcpy(XS(l, 0), tmpk, sizeof(float) * (size_t)T * kvd);
        memcpy(XS(l, 1), tmpv, sizeof(float) * (size_t)T * kvd);
        memcpy(RS(l, 0), tmpk, sizeof(float) * (size_t)T * kvd);
        memcpy(RS(l, 1), tmpv, sizeof(float) * (size_t)T * kvd);
    }
    int *comp = malloc(sizeof(int) * (size_t)L * 2);
    for (int i = 0; i < L * 2; i++) comp[i] = c->sinks;
    /* SQuat: per layer and KV head the queries of its GQA group attended before the layer's first
     * compression, stacked (qst), and the encoders made at that compression (enc) */
    const int H = c->kv_heads, G = c->gqa, qdim = H * G * hd;
    float *qst = c->squat ? malloc(sizeof(float) * (size_t)L * H * (size_t)T * G * hd) : NULL;
    float *qbuf = c->squat ? malloc(sizeof(float) * (size_t)(c->prefill > c->step ? c->prefill : c->step) * qdim) : NULL;
    int *qrows = calloc((size_t)L, sizeof(int));
    kv_squat **enc = calloc((size_t)L * H, sizeof *enc);
    int64_t sq_vals = 0, sq_moved = 0; /* compressed SQuat key values; those that differ from KIVI's round trip */
#define QS(l, h) (qst + ((size_t)(l) * H + (size_t)(h)) * (size_t)T * G * hd)
    int len = 0;
    while (len < T) {
        int n = len == 0 ? c->prefill : c->step;
        if (n > T - len) n = T - len;
        for (int l = 0; l < L; l++)
            for (int st = 0; st < 2; st++) { /* settle before the step's tokens join */
                const kv_plan_stream *ps = &p->layers[l].stream[st];
                kv_quant qd;
                ck_assert_kv_ok(kv_quant_from_plan(&qd, p, l, st));
                const int gran = qd.kind == KV_QUANT_UNIFORM && qd.uniform.axis == KV_AXIS_TOKENS ? qd.uniform.group : 1;
                int *ce = &comp[l * 2 + st];
                const int window = len > *ce ? len - *ce : 0;
                int chunks[4096], nch = 0;
                if (ps->rpc_ratio > 0) {
                    int m = window - (int)((double)ps->rpc_ratio * window);
                    m -= m % gran;
                    if (m > 0) chunks[nch++] = m;
                } else {
                    for (int w = window; w >= c->recent; w -= c->recent) chunks[nch++] = c->recent;
                }
                for (int ci = 0; ci < nch; ci++) {
                    const int t0 = *ce, m = chunks[ci];
                    const float *xin = XS(l, st) + (size_t)t0 * kvd;
                    float *out = RS(l, st) + (size_t)t0 * kvd;
                    if (ps->share_codes_with_layer >= 0) { /* the partner's codes, this layer's scales */
                        const kv_uniform *u = &qd.uniform;
                        kv_block_storage bs;
                        kv_quant qp = qd;
                        qp.shared_codes = 0;
                        ck_assert_kv_ok(kv_quant_storage(&bs, &qp, (size_t)m, (size_t)kvd));
                        uint32_t *pc = malloc(sizeof(uint32_t) * (size_t)(bs.code_words + 1));
                        uint8_t *ppar = malloc((size_t)bs.scale_bytes * 2 + 8), *opar = malloc((size_t)bs.scale_bytes * 2 + 8);
                        const float *xp = XS(ps->share_codes_with_layer, st) + (size_t)t0 * kvd;
                        kv_uniform up = *u;
                        up.eta = p->layers[ps->share_codes_with_layer].stream[st].eta;
                        ck_assert_kv_ok(kv_uniform_encode_ref(pc, ppar, ppar + bs.scale_bytes, &up, (size_t)m, (size_t)kvd, xp));
                        ck_assert_kv_ok(kv_uniform_encode_ref(NULL, opar, opar + bs.scale_bytes, u, (size_t)m, (size_t)kvd, xin));
                        ck_assert_kv_ok(kv_uniform_decode_ref(out, u, (size_t)m, (size_t)kvd, pc, opar, opar + bs.scale_bytes));
                        free(pc), free(ppar), free(opar);
                    } else if (ps->squat) { /* per KV head: the head's columns, SQuat-encoded */
                        const kv_plan_squat *pq = ps->squat;
                        const int fresh = !enc[l * H]; /* the layer's first compression: choose the subspace */
                        for (int h = 0; h < H && fresh; h++) {
                            float *qh = calloc((size_t)pq->r * hd, sizeof *qh);
                            if (pq->static_subspace || (qrows[l] < pq->r && pq->basis)) {
                                memcpy(qh, pq->basis + (size_t)h * pq->r * hd, sizeof(float) * (size_t)pq->r * hd);
                            } else if (qrows[l] > 0) { /* fewer rows than r: the rest of the basis is 0 */
                                const int rr = qrows[l] < pq->r ? qrows[l] : pq->r;
                                ck_assert_kv_ok(kv_squat_subspace_ref(qh, QS(l, h), (size_t)qrows[l], hd, rr));
                            }
                            ck_assert_kv_ok(kv_squat_create(&enc[l * H + h], qh, pq->r, hd, pq->lambda, pq->g));
                            free(qh);
                        }
                        kv_block_storage bs;
                        kv_quant qh1 = qd;
                        ck_assert_kv_ok(kv_quant_storage(&bs, &qh1, (size_t)m, (size_t)hd));
                        uint32_t *hc = malloc(sizeof(uint32_t) * (size_t)(bs.code_words + 1));
                        uint8_t *hp = malloc((size_t)bs.scale_bytes + (size_t)bs.zero_bytes + 8);
                        float *hx = malloc(sizeof(float) * (size_t)m * hd), *hy = malloc(sizeof(float) * (size_t)m * hd);
                        for (int h = 0; h < H; h++) {
                            for (int t = 0; t < m; t++) memcpy(hx + (size_t)t * hd, xin + (size_t)t * kvd + (size_t)h * hd, sizeof(float) * hd);
                            ck_assert_kv_ok(kv_squat_encode_ref(hc, hp, hp + bs.scale_bytes, enc[l * H + h], &qd.uniform, (size_t)m, hx));
                            ck_assert_kv_ok(kv_uniform_decode_ref(hy, &qd.uniform, (size_t)m, (size_t)hd, hc, hp, hp + bs.scale_bytes));
                            for (int t = 0; t < m; t++) memcpy(out + (size_t)t * kvd + (size_t)h * hd, hy + (size_t)t * hd, sizeof(float) * hd);
                        }
                        ck_assert_kv_ok(kv_quant_roundtrip(res, NULL, &qd, (size_t)m, (size_t)kvd, xin));
                        for (size_t i = 0; i < (size_t)m * kvd; i++) sq_moved += memcmp(&res[i], &out[i], sizeof(float)) != 0;
                        sq_vals += (int64_t)m * kvd;
                        free(hc), free(hp), free(hx), free(hy);
                    } else if (ps->predictor) {
                        const float *ins[KV_PLAN_MAX_PRED_INPUTS];
                        for (int k = 0; k < ps->predictor->n_inputs; k++)
                            ins[k] = RS(ps->predictor->inputs[k].layer, ps->predictor->inputs[k].stream) + (size_t)t0 * kvd;
                        ck_assert_kv_ok(kv_predictor_apply(pred, ps->predictor, ins, (size_t)m, kvd));
                        for (size_t i = 0; i < (size_t)m * kvd; i++) res[i] = xin[i] - pred[i];
                        ck_assert_kv_ok(kv_quant_roundtrip(out, NULL, &qd, (size_t)m, (size_t)kvd, res));
                        for (size_t i = 0; i < (size_t)m * kvd; i++) out[i] = pred[i] + out[i];
                    } else {
                        ck_assert_kv_ok(kv_quant_roundtrip(out, NULL, &qd, (size_t)m, (size_t)kvd, xin));
                    }
                    *ce = t0 + m;
                }
            }
        /* the step's queries, attended after the settle: kept while the layer has not compressed */
        for (int l = 0; l < L && c->squat; l++) {
            if (enc[l * H]) continue;
            make_queries(qbuf, c, n, len, l, seq);
            for (int i = 0; i < n; i++)
                for (int h = 0; h < H; h++)
                    memcpy(QS(l, h) + ((size_t)qrows[l] + (size_t)i * G) * hd, qbuf + (size_t)i * qdim + (size_t)h * G * hd,
                           sizeof(float) * (size_t)G * hd);
            qrows[l] += n * G;
        }
        len += n;
    }
    /* SQuat must have moved the keys away from KIVI's codes (else the comparison below proves little) */
    if (sq_vals) ck_assert_msg(sq_moved > sq_vals / 20, "%s: SQuat changed only %lld of %lld key values against KIVI",
                               c->name, (long long)sq_moved, (long long)sq_vals);
    float *K = malloc(sizeof(float) * (size_t)T * hd), *V = malloc(sizeof(float) * (size_t)T * hd);
    for (int l = 0; l < L; l++)
        for (int h = 0; h < c->kv_heads; h++) {
            ck_assert_kv_ok(kv_rt_decode_head(rt, l, seq, h, K, V));
            /* A device predicts a layer's chunks with one product over every new row (cuBLAS on the GPU, the BLAS on
             * the host model) where the replay takes one call per chunk: predictions differ in their last bits, a residual
             * code flips where a value lies at a rounding boundary, and a flip moves the next layers' predictions, so
             * codes drift apart down the chain (seen on the GPU: 0.3% of the values of a 2-bit uniform chain). Both are
             * then valid AQUA-KV caches of the same inputs: the device's error against the inputs must equal the
             * replay's within 5%, and at most 5% of its values may leave 1e-5 of the replay's row maximum. */
            /* Low-rank predictors on the CPU: chunks that every predicted stream has compressed are rebuilt from the
             * factors (z = R x, then L z: RUNTIME.md §6) where the replay applies the dense product, and the BLAS
             * splits the runtime's products over other row counts than the replay's: predictions differ in their last
             * bits, and under some OpenBLAS kernels and thread counts a residual code flips (seen: Haswell and Zen
             * kernels with 2 threads, layer 3 of 'aqua low-rank', one value 0.11 of its row maximum away), so they take
             * the device's criterion below. */
            if ((g_device != KV_RT_DEVICE_CPU || c->aqua > 1) && c->aqua && l >= 1) {
                int64_t far = 0;
                double e_dev = 0, e_rep = 0;
                for (int st = 0; st < 2; st++)
                    for (int t = 0; t < T; t++) {
                        float row[KV_RT_MAX_HEAD_DIM], in[KV_RT_MAX_HEAD_DIM];
                        memcpy(row, RS(l, st) + (size_t)t * kvd + (size_t)h * hd, sizeof(float) * hd);
                        memcpy(in, XS(l, st) + (size_t)t * kvd + (size_t)h * hd, sizeof(float) * hd);
                        if (st == 0 && c->pre_rope) rope_row(row, hd, c->rope_half, freq, t), rope_row(in, hd, c->rope_half, freq, t);
                        const float *got = (st ? V : K) + (size_t)t * hd;
                        double mx = 0;
                        for (int ch = 0; ch < hd; ch++) mx = fmax(mx, fabs(row[ch]));
                        for (int ch = 0; ch < hd; ch++) {
                            far += fabs((double)got[ch] - row[ch]) > 1e-5 * mx;
                            e_dev += ((double)got[ch] - in[ch]) * ((double)got[ch] - in[ch]);
                            e_rep += ((double)row[ch] - in[ch]) * ((double)row[ch] - in[ch]);
                        }
                    }
                ck_assert_msg(far <= (int64_t)T * hd * 2 / 20, "%s: layer %d head %d: %lld of %lld values off the replay",
                              c->name, l, h, (long long)far, (long long)T * hd * 2);
                ck_assert_msg(fabs(e_dev - e_rep) <= 0.05 * e_rep + 1e-12, "%s: layer %d head %d: error %.6g, the replay's %.6g",
                              c->name, l, h, e_dev, e_rep);
                if (far) printf("%s: layer %d head %d: %lld of %lld values off the replay, error %.6g vs %.6g\n", c->name, l,
                                h, (long long)far, (long long)T * hd * 2, e_dev, e_rep);
                continue;
            }
            for (int t = 0; t < T; t++)
                for (int ch = 0; ch < hd; ch++) {
                    const float wv = RS(l, 1)[(size_t)t * kvd + (size_t)h * hd + ch];
                    if (memcmp(&V[(size_t)t * hd + ch], &wv, sizeof wv) != 0)
                        ck_abort_msg("%s: layer %d V token %d head %d ch %d: %.9g, replay %.9g", c->name, l, t, h, ch,
                                     V[(size_t)t * hd + ch], wv);
                }
            /* SQuat with the prompt subspace: the runtime takes the eigenvectors of the Gram matrix, the
             * replay the SVD of the stacked queries; both round the same double-precision subspace to
             * float, so P and the codes agree unless a rounding lands differently: then a code may flip,
             * and the flip moves the rest of that token's coordinates by W_t times one step. At most 1% of
             * the compressed key values may differ, and their error against the input must stay within 1%
             * of the replay's (observed: see the printed counts). Static subspaces and every f16 row: bits. */
            const kv_plan_squat *pq = p->layers[l].stream[KV_PLAN_K].squat;
            const int tol = pq && !pq->static_subspace;
            int64_t diff = 0, vals = 0;
            double e_rt = 0, e_rep = 0;
            for (int t = 0; t < T; t++) {
                float row[KV_RT_MAX_HEAD_DIM];
                memcpy(row, RS(l, 0) + (size_t)t * kvd + (size_t)h * hd, sizeof(float) * hd);
                if (c->pre_rope) rope_row(row, hd, c->rope_half, freq, t);
                const int compressed = t >= c->sinks && t < comp[l * 2];
                if (tol && compressed) {
                    const float *xi = XS(l, 0) + (size_t)t * kvd + (size_t)h * hd;
                    for (int ch = 0; ch < hd; ch++) {
                        diff += memcmp(&K[(size_t)t * hd + ch], &row[ch], sizeof(float)) != 0;
                        e_rt += ((double)K[(size_t)t * hd + ch] - xi[ch]) * ((double)K[(size_t)t * hd + ch] - xi[ch]);
                        e_rep += ((double)row[ch] - xi[ch]) * ((double)row[ch] - xi[ch]);
                    }
                    vals += hd;
                    continue;
                }
                if (memcmp(&K[(size_t)t * hd], row, sizeof(float) * hd) != 0)
                    ck_abort_msg("%s: layer %d K token %d head %d differs from the replay", c->name, l, t, h);
            }
            if (tol && vals) {
                ck_assert_msg(diff <= vals / 100, "%s: layer %d head %d: %lld of %lld SQuat key values differ from the "
                              "replay", c->name, l, h, (long long)diff, (long long)vals);
                ck_assert_msg(fabs(e_rt - e_rep) <= 0.01 * e_rep, "%s: layer %d head %d: key error %.6g vs replay %.6g",
                              c->name, l, h, e_rt, e_rep);
                if (diff) printf("%s: layer %d head %d: %lld of %lld SQuat key values differ from the replay\n", c->name,
                                 l, h, (long long)diff, (long long)vals);
            }
        }
#undef XS
#undef RS
#undef QS
    for (int i = 0; i < L * H; i++) kv_squat_free(enc[i]);
    free(enc), free(qst), free(qbuf), free(qrows);
    free(x), free(rec), free(tmpk), free(tmpv), free(pred), free(res), free(comp), free(K), free(V);
}

/* ---- the driver ------------------------------------------------------------------------------- */
static double run_case(const rcase *c, int n_seqs, int n_threads) {
    kv_plan *p = make_plan(c);
    double *freq = rope_freqs(c->hd);
    kv_rt_options o;
    memset(&o, 0, sizeof o);
    o.n_seqs = n_seqs, o.n_heads = c->kv_heads * c->gqa, o.n_threads = n_threads;
    o.rope_inv_freq = freq, o.rope_layout = c->rope_half ? KV_ROPE_HALF : KV_ROPE_ADJACENT;
    o.device = g_device;
    kv_rt *rt = NULL;
    ck_assert_kv_ok(kv_rt_open(&rt, p, &o));
    const int kvd = c->kv_heads * c->hd, qd = c->kv_heads * c->gqa * c->hd, H = c->kv_heads, G = c->gqa;
    const int maxn = c->prefill > c->step ? c->prefill : c->step;
    float *k = malloc(sizeof(float) * (size_t)maxn * kvd), *kp = malloc(sizeof(float) * (size_t)maxn * kvd);
    float *v = malloc(sizeof(float) * (size_t)maxn * kvd), *q = malloc(sizeof(float) * (size_t)maxn * qd);
    float *out = malloc(sizeof(float) * (size_t)maxn * qd);
    int32_t *pos = malloc(sizeof(int32_t) * (size_t)maxn);
    double worst = 0;
    /* sequences advance in turn, seq q with a length offset, so that they interleave and differ */
    int *len = calloc((size_t)n_seqs, sizeof(int)), *steps = calloc((size_t)n_seqs, sizeof(int));
    iobuf io[5];
    memset(io, 0, sizeof io);
    for (int done = 0; !done;) {
        done = 1;
        for (int sq = 0; sq < n_seqs; sq++) {
            const int T = c->T - 17 * sq;
            if (len[sq] >= T) continue;
            done = 0;
            int n = len[sq] == 0 ? c->prefill : c->step;
            if (n > T - len[sq]) n = T - len[sq];
            const int last = len[sq] + n == T;
            const int check = last || (c->check_every && steps[sq] % c->check_every == 0);
            for (int i = 0; i < n; i++) pos[i] = len[sq] + i;
            for (int l = 0; l < c->layers; l++) {
                fill_kv(k, v, n, kvd, l, len[sq], 5u + (uint64_t)sq);
                memcpy(kp, k, sizeof(float) * (size_t)n * kvd);
                /* post-RoPE keys: the runtime's own RoPE applied per head (what a model hands over) */
                for (int h = 0; h < H; h++)
                    for (int i = 0; i < n; i++) rope_row(k + (size_t)i * kvd + (size_t)h * c->hd, c->hd, c->rope_half, freq, pos[i]);
                const size_t kb = sizeof(float) * (size_t)n * kvd, qb = sizeof(float) * (size_t)n * qd;
                const float *ikp = io_in(rt, &io[0], kp, kb), *ik = io_in(rt, &io[1], k, kb), *iv = io_in(rt, &io[2], v, kb);
                ck_assert_kv_ok(kv_rt_append(rt, l, sq, n, pos, ikp, ik, iv, (size_t)kvd));
                make_queries(q, c, n, len[sq], l, sq);
                const float *iq = io_in(rt, &io[3], q, qb);
                float *iout = g_device == KV_RT_DEVICE_CUDA ? io_in(rt, &io[4], out, qb) : out;
                ck_assert_kv_ok(kv_rt_attend(rt, l, sq, n, iq, (size_t)qd, iout, (size_t)qd));
                io_out(rt, out, &io[4], qb);
                log_outputs(out, (size_t)n * qd);
                if (check)
                    worst = fmax(worst, check_attend(rt, p, l, sq, len[sq] + n, n, q, out, H, G, c->hd,
                                                     n > RT_DIRECT_MAX_ROWS || g_device != KV_RT_DEVICE_CPU, c->name));
            }
            len[sq] += n;
            steps[sq]++;
            ck_assert_int_eq(kv_rt_length(rt, sq), len[sq]);
            check_bytes(rt, sq);
        }
    }
    for (int sq = 0; sq < n_seqs; sq++) check_replay(rt, p, c, sq, c->T - 17 * sq, freq);
    /* reset releases a sequence's memory */
    kv_rt_reset(rt, 0);
    kv_rt_stats st;
    ck_assert_kv_ok(kv_rt_get_stats(rt, 0, &st));
    ck_assert_uint_eq(st.allocated_bytes, 0);
    ck_assert_int_eq(kv_rt_length(rt, 0), 0);
    free(len), free(steps);
    for (int i = 0; i < 5; i++) io_free(&io[i]);
    free(k), free(kp), free(v), free(q), free(out), free(pos), free(freq);
    kv_rt_close(rt);
    kv_plan_free(p);
    return worst;
}

#define U(b, g, ax) {KV_PLAN_UNIFORM, b, g, ax, 0, 0.0f, 0, 0, 0, 0.0f}
#define HG(g, d, n) {KV_PLAN_HIGGS, 0, g, KV_PLAN_GROUP_CHANNELS, 0, 0.0f, d, n, 0, 0.0f}
#define F16 {KV_PLAN_FP, 16, 0, 0, 0, 0.0f, 0, 0, 0, 0.0f}
#define F32 {KV_PLAN_FP, 32, 0, 0, 0, 0.0f, 0, 0, 0, 0.0f}
#define FL(m, per_head) {m, 0, 0, 0, 0, 0.0f, per_head, 0, 0, 0.0f}
enum { E4M3 = KV_PLAN_FP8_E4M3, E5M2 = KV_PLAN_FP8_E5M2, NVFP4 = KV_PLAN_NVFP4 };
enum { TOK = KV_PLAN_GROUP_TOKENS, CH = KV_PLAN_GROUP_CHANNELS };

static const rcase k_cases[] = {
    /* name, layers, kv_heads, gqa, hd, sinks, recent, k, v, k0, v0, has_l0, pre_rope, rope_half, aqua, T, prefill, step, every */
    {"f16", 1, 2, 3, 64, 4, 32, F16, F16, F16, F16, 0, 0, 0, 0, 300, 40, 1, 25, 0, NO_SQ},
    {"f32 blocks", 1, 1, 2, 16, 0, 16, F32, F32, F16, F16, 0, 0, 0, 0, 120, 20, 3, 7, 0, NO_SQ},
    {"kivi-2", 2, 3, 3, 64, 4, 32, U(2, 32, TOK), U(2, 32, CH), F16, F16, 0, 0, 0, 0, 400, 40, 1, 60, 0, NO_SQ},
    {"kivi-4 eta f32", 2, 2, 4, 32, 4, 32, {KV_PLAN_UNIFORM, 4, 16, TOK, 0, 0.05f, 0, 0, 1, 0.0f},
     {KV_PLAN_UNIFORM, 4, 16, CH, 0, 0.08f, 0, 0, 1, 0.0f}, F16, F16, 0, 0, 0, 0, 200, 36, 2, 20, 0, NO_SQ},
    {"kivi-3 pack11/10", 1, 2, 2, 64, 2, 64, {KV_PLAN_UNIFORM, 3, 32, TOK, 1, 0.0f, 0, 0, 0, 0.0f},
     {KV_PLAN_UNIFORM, 3, 32, CH, 0, 0.0f, 0, 0, 0, 0.0f}, F16, F16, 0, 0, 0, 0, 300, 66, 1, 50, 0, NO_SQ},
    {"kivi-1 and 8", 1, 1, 8, 64, 4, 32, U(1, 32, TOK), U(8, 64, CH), F16, F16, 0, 0, 0, 0, 200, 40, 4, 10, 0, NO_SQ},
    {"channels keys, tokens values", 1, 2, 1, 64, 4, 32, U(2, 64, CH), U(4, 16, TOK), F16, F16, 0, 0, 0, 0, 200, 40, 1, 30,
     0, NO_SQ},
    {"odd head_dim 9", 1, 2, 2, 9, 3, 16, U(2, 4, CH), U(4, 4, CH), F16, F16, 0, 0, 0, 0, 150, 21, 1, 20, 0, NO_SQ},
    {"odd head_dim 9 tokens", 1, 2, 1, 9, 3, 16, U(2, 8, TOK), U(2, 8, TOK), F16, F16, 0, 0, 0, 0, 100, 19, 2, 10, 0, NO_SQ},
    {"higgs-2", 1, 3, 3, 64, 4, 32, HG(0, 2, 16), HG(0, 2, 16), F16, F16, 0, 0, 0, 0, 300, 40, 1, 40, 0, NO_SQ},
    {"higgs-4 g32", 1, 2, 2, 64, 4, 32, HG(32, 2, 256), HG(32, 2, 256), F16, F16, 0, 0, 0, 0, 200, 36, 1, 30, 0, NO_SQ},
    {"higgs d1 d4", 1, 2, 2, 32, 4, 32, HG(0, 1, 8), HG(16, 4, 256), F16, F16, 0, 0, 0, 0, 200, 36, 3, 10, 0, NO_SQ},
    {"higgs across heads", 1, 2, 2, 32, 4, 32, HG(64, 2, 16), HG(64, 2, 64), F16, F16, 0, 0, 0, 0, 150, 36, 1, 20, 0, NO_SQ},
    {"higgs pre-rope", 1, 2, 3, 64, 4, 32, HG(0, 2, 16), HG(0, 2, 16), F16, F16, 0, 1, 0, 0, 200, 36, 1, 30, 0, NO_SQ},
    {"kivi pre-rope half", 1, 2, 2, 16, 4, 32, U(2, 32, TOK), U(2, 16, CH), F16, F16, 0, 1, 1, 0, 150, 36, 1, 20, 0, NO_SQ},
    {"aqua", 3, 2, 3, 32, 4, 32, U(2, 32, CH), HG(0, 2, 16), HG(0, 2, 256), HG(0, 2, 256), 1, 1, 0, 1, 250, 36, 1, 20, 0, NO_SQ},
    {"aqua uniform", 3, 2, 2, 16, 4, 16, U(2, 16, CH), U(2, 16, CH), U(4, 16, CH), U(4, 16, CH), 1, 0, 0, 1, 150, 20,
     1, 20, 0, NO_SQ},
    {"aqua low-rank", 4, 3, 3, 64, 4, 32, HG(0, 2, 16), HG(0, 2, 16), HG(0, 2, 256), HG(0, 2, 256), 1, 1, 0, 16, 300, 40,
     1, 20, 0, NO_SQ},
    {"rpc", 2, 2, 2, 32, 4, 32, {KV_PLAN_UNIFORM, 2, 8, TOK, 0, 0.0f, 0, 0, 0, 0.2f},
     {KV_PLAN_UNIFORM, 2, 32, CH, 0, 0.0f, 0, 0, 0, 0.1f}, F16, F16, 0, 0, 0, 0, 250, 64, 1, 20, 0, NO_SQ},
    {"gqa 1", 1, 4, 1, 32, 4, 32, U(2, 32, TOK), U(2, 32, CH), F16, F16, 0, 0, 0, 0, 150, 36, 1, 30, 0, NO_SQ},
    {"xquant shared codes", 4, 2, 2, 32, 4, 32, U(2, 32, TOK), U(2, 32, CH), F16, F16, 0, 0, 0, 0, 200, 36, 1, 20, 2, NO_SQ},
    {"xquant 1-bit shared", 4, 2, 3, 64, 4, 32, U(1, 32, TOK), {KV_PLAN_UNIFORM, 1, 32, CH, 0, 0.2f, 0, 0, 0, 0.0f},
     U(2, 32, TOK), U(2, 32, CH), 1, 0, 0, 0, 150, 36, 2, 20, 2, NO_SQ},
    {"fp8 e4m3 tensor/head", 2, 2, 3, 64, 4, 32, FL(E4M3, 0), FL(E4M3, 1), F16, F16, 0, 0, 0, 0, 300, 40, 1, 40, 0, NO_SQ},
    {"fp8 e5m2 odd head_dim 9", 1, 3, 2, 9, 3, 16, FL(E5M2, 1), FL(E5M2, 0), F16, F16, 0, 0, 0, 0, 150, 21, 1, 20, 0, NO_SQ},
    {"nvfp4 tensor, blocks across heads", 1, 2, 2, 40, 4, 32, FL(NVFP4, 0), FL(NVFP4, 0), F16, F16, 0, 0, 0, 0, 200, 36,
     1, 25, 0, NO_SQ},
    {"nvfp4 per head, fp8 layer 0", 2, 2, 4, 32, 4, 32, FL(NVFP4, 1), FL(NVFP4, 1), FL(E4M3, 1), FL(E5M2, 0), 1, 0, 0, 0,
     200, 36, 2, 20, 0, NO_SQ},
    {"fp8 nvfp4 pre-rope", 1, 2, 2, 32, 4, 32, FL(E4M3, 1), FL(NVFP4, 0), F16, F16, 0, 1, 0, 0, 150, 36, 1, 20, 0, NO_SQ},
    {"tiled fp8 nvfp4", 2, 2, 3, 64, 4, 64, FL(E4M3, 1), FL(NVFP4, 1), F16, F16, 0, 0, 0, 0, 500, 100, 70, 1, 0, NO_SQ},
    {"tiled steps", 2, 2, 3, 64, 4, 64, U(2, 32, TOK), HG(0, 2, 16), F16, F16, 0, 0, 0, 0, 500, 100, 70, 1, 0, NO_SQ},
    {"tiled aqua", 3, 2, 2, 32, 4, 32, U(2, 32, CH), HG(0, 2, 16), HG(0, 2, 256), HG(0, 2, 256), 1, 1, 0, 1, 300, 80,
     50, 1, 0, NO_SQ},
    /* SQuat keys (name ... every, xq_from, squat, r, g, lambda): the static basis; the prompt subspace
     * with per-layer bits (layer 0 4-bit), a prompt of 70 tokens (two chunks and a rest) and steps of 3
     * across chunk boundaries; the basis fallback (8 query vectors seen, r = 16); no basis and fewer
     * query vectors than r (16 < 20: the Gram's rank); the tiled path with RPC, eta, f32 parameters and
     * r beyond the dominant directions (the 5th and 6th from the noise) */
    {"squat static gqa3", 2, 2, 3, 64, 4, 32, U(2, 32, TOK), U(2, 32, CH), F16, F16, 0, 0, 0, 0, 300, 40, 1, 40, 0,
     SQ_STATIC, 4, 16, 1e-4f},
    {"squat prompt gqa3 per-layer bits", 2, 2, 3, 64, 4, 32, U(2, 32, TOK), U(2, 32, CH), U(4, 32, TOK), U(2, 32, CH),
     1, 0, 0, 0, 250, 70, 3, 20, 0, SQ_PROMPT, 4, 16, 1e-4f},
    {"squat prompt basis fallback", 1, 2, 1, 16, 0, 8, U(2, 8, TOK), U(2, 8, CH), F16, F16, 0, 0, 0, 0, 120, 1, 1, 15, 0,
     SQ_PROMPT_BASIS, 16, 4, 1e-4f},
    {"squat prompt rank-deficient", 1, 1, 2, 32, 0, 8, U(2, 8, TOK), U(2, 8, CH), F16, F16, 0, 0, 0, 0, 100, 1, 1, 10,
     0, SQ_PROMPT, 20, 8, 1e-4f},
    {"squat prompt tiled rpc", 2, 2, 2, 64, 4, 64, {KV_PLAN_UNIFORM, 2, 32, TOK, 0, 0.05f, 0, 0, 1, 0.2f}, U(2, 32, CH),
     F16, F16, 0, 0, 0, 0, 400, 100, 70, 1, 0, SQ_PROMPT_BASIS, 6, 32, 1e-4f},
};

/* Every case at each vector level: the portable C, and AVX2 + FMA when this CPU has it (the AVX2
 * loops fuse multiply-adds, so they are held to the same bound rather than to the portable bits). */
START_TEST(test_attention_matches_exact) {
    const int n_cases = (int)(sizeof k_cases / sizeof k_cases[0]);
    const rcase *c = &k_cases[_i % n_cases];
    kv_simd_level_limit(_i < n_cases ? KV_SIMD_NONE : KV_SIMD_AVX2);
    const double w1 = run_case(c, 1, 2);
    const double w2 = run_case(c, 2, 1); /* two interleaved sequences, one thread */
    printf("%-32s %s worst error / bound: %.3g, %.3g\n", c->name, _i < n_cases ? "portable" : "avx2    ", w1, w2);
}
END_TEST

/* The CUDA backend's host model (RUNTIME.md §10): every case the device serves, held to the same bound and the
 * same replay; the cases it refuses are refused by name. */
/* Under ASan+UBSan (KV_TEST_SANITIZE) the device model, a host emulation of every kernel's threads, runs ~15x slower
 * than here and its full set (~3 min in the optimised build) would not fit CI's time: the sanitizers see every 4th
 * case with two sequences (batch offsets included), one catalogue entry in 3 of the self-check and no long
 * sequences; the optimised build runs them all. */
#ifdef KV_TEST_SANITIZE
#define SANITIZED 1
#else
#define SANITIZED 0
#endif

START_TEST(test_device_model) {
    const int n_cases = (int)(sizeof k_cases / sizeof k_cases[0]);
    const rcase *c = &k_cases[_i];
    if (SANITIZED && _i % 4 != 0) return;
    g_device = KV_RT_DEVICE_CUDA_MODEL;
    kv_simd_level_limit(KV_SIMD_AVX2);
    (void)n_cases;
    if (strstr(c->name, "across heads") && c->k.method == KV_PLAN_HIGGS) { /* HIGGS groups spanning heads */
        kv_plan *p = make_plan(c);
        kv_rt_options o;
        memset(&o, 0, sizeof o);
        o.n_seqs = 1, o.n_heads = c->kv_heads * c->gqa, o.device = KV_RT_DEVICE_CUDA_MODEL;
        kv_rt *rt = NULL;
        ck_assert_int_eq(kv_rt_open(&rt, p, &o), KV_EUNSUPPORTED);
        ck_assert_ptr_null(rt);
        ck_assert_ptr_nonnull(strstr(kv_error_last(), "inside a head"));
        kv_plan_free(p);
        g_device = KV_RT_DEVICE_CPU;
        return;
    }
    const double w1 = SANITIZED ? NAN : run_case(c, 1, 1), w2 = run_case(c, 2, 1);
    printf("%-32s device model worst error / bound: %.3g, %.3g\n", c->name, w1, w2);
    g_device = KV_RT_DEVICE_CPU;
}
END_TEST

/* Long sequences on the device model: several splits, a long prefill over many row blocks, then decoding. */
START_TEST(test_device_model_long) {
    if (SANITIZED) return;
    g_device = KV_RT_DEVICE_CUDA_MODEL;
    const rcase c1 = {"device long kivi-2", 1, 2, 3, 64, 4, 128, U(2, 32, TOK), U(2, 32, CH), F16, F16, 0, 0, 0, 0, 2700,
                      2690, 1, 0, 0, NO_SQ};
    const rcase c2 = {"device long higgs pre-rope", 2, 1, 3, 64, 4, 128, HG(0, 2, 16), HG(0, 2, 16), F16, F16, 0, 1, 0, 0,
                      1500, 600, 1, 0, 0, NO_SQ};
    printf("%s worst %.3g\n", c1.name, run_case(&c1, 1, 1));
    printf("%s worst %.3g\n", c2.name, run_case(&c2, 1, 1));
    g_device = KV_RT_DEVICE_CPU;
}
END_TEST

/* A decoding step of several sequences of different lengths: kv_rt_append_batch / kv_rt_attend_batch give the
 * same bits as the calls one sequence at a time, on the CPU and on the device model (one launch), and the
 * device model's decoded cache equals the CPU's bit for bit. */
START_TEST(test_batch_calls) {
    const rcase c = {"batch", 2, 2, 3, 32, 4, 16, U(2, 16, TOK), U(4, 16, CH), F16, F16, 0, 0, 0, 0, 0, 0, 0, 0, 0, NO_SQ};
    kv_plan *p = make_plan(&c);
    const int kvd = 64, qd = 192, B = 5, steps = 40;
    const int prompt[5] = {3, 50, 17, 70, 1};
    float *k = malloc(sizeof(float) * (size_t)B * 80 * kvd), *v = malloc(sizeof(float) * (size_t)B * 80 * kvd);
    float *q = malloc(sizeof(float) * (size_t)B * qd), *o1 = malloc(sizeof(float) * (size_t)B * qd);
    float *o2 = malloc(sizeof(float) * (size_t)B * qd);
    int32_t pos[80];
    for (int dev = 0; dev < 2; dev++) {
        kv_rt *rt[2] = {NULL, NULL};
        for (int i = 0; i < 2; i++) {
            kv_rt_options o;
            memset(&o, 0, sizeof o);
            o.n_seqs = B, o.n_heads = 6, o.n_threads = 1;
            o.device = dev ? KV_RT_DEVICE_CUDA_MODEL : KV_RT_DEVICE_CPU;
            ck_assert_kv_ok(kv_rt_open(&rt[i], p, &o));
        }
        const int seqs[5] = {4, 0, 3, 1, 2}; /* listed out of order */
        for (int b = 0; b < B; b++)
            for (int l = 0; l < 2; l++) {
                for (int i = 0; i < prompt[b]; i++) pos[i] = i;
                fill_kv(k, v, prompt[b], kvd, l, 0, 40u + (uint64_t)b);
                for (int i = 0; i < 2; i++) ck_assert_kv_ok(kv_rt_append(rt[i], l, b, prompt[b], pos, k, k, v, kvd));
            }
        for (int t = 0; t < steps; t++)
            for (int l = 0; l < 2; l++) {
                for (int i = 0; i < B; i++) {
                    const int b = seqs[i];
                    fill_kv(k + (size_t)i * kvd, v + (size_t)i * kvd, 1, kvd, l, prompt[b] + t, 40u + (uint64_t)b);
                    for (int e = 0; e < qd; e++) q[(size_t)i * qd + e] = (float)sin(0.21 * e + 1.3 * b + t + l);
                }
                ck_assert_kv_ok(kv_rt_append_batch(rt[0], l, B, seqs, k, k, v, kvd));
                ck_assert_kv_ok(kv_rt_attend_batch(rt[0], l, B, seqs, q, qd, o1, qd));
                for (int i = 0; i < B; i++) {
                    const int b = seqs[i];
                    pos[0] = prompt[b] + t;
                    ck_assert_kv_ok(kv_rt_append(rt[1], l, b, 1, pos, k + (size_t)i * kvd, k + (size_t)i * kvd,
                                                 v + (size_t)i * kvd, kvd));
                    ck_assert_kv_ok(kv_rt_attend(rt[1], l, b, 1, q + (size_t)i * qd, qd, o2 + (size_t)i * qd, qd));
                }
                ck_assert_msg(memcmp(o1, o2, sizeof(float) * (size_t)B * qd) == 0, "device %d step %d layer %d: the batch "
                              "differs from one sequence at a time", dev, t, l);
            }
        for (int b = 0; b < B; b++) ck_assert_int_eq(kv_rt_length(rt[0], b), prompt[b] + steps);
        for (int i = 0; i < 2; i++) kv_rt_close(rt[i]);
    }
    /* bad batches */
    kv_rt_options o;
    memset(&o, 0, sizeof o);
    o.n_seqs = 3, o.n_heads = 6;
    kv_rt *rt = NULL;
    ck_assert_kv_ok(kv_rt_open(&rt, p, &o));
    const int dup[2] = {1, 1}, out_of_range[2] = {0, 3};
    ck_assert_int_eq(kv_rt_append_batch(rt, 0, 2, dup, k, k, v, kvd), KV_EINVAL);
    ck_assert_int_eq(kv_rt_append_batch(rt, 0, 2, out_of_range, k, k, v, kvd), KV_EINVAL);
    ck_assert_int_eq(kv_rt_attend_batch(rt, 0, 2, dup, q, qd, o1, qd), KV_EINVAL);
    kv_rt_close(rt);
    free(k), free(v), free(q), free(o1), free(o2);
    kv_plan_free(p);
}
END_TEST

/* The CPU-vs-device self-check on the host model: every catalogue entry passes, and each injected fault (an
 * attention output off by 1e-3, one flipped code) is caught with the codec named. */
START_TEST(test_selfcheck) {
    double freq[32];
    for (int i = 0; i < 32; i++) freq[i] = pow(10000.0, -2.0 * i / 64);
    kv_rt_options o;
    memset(&o, 0, sizeof o);
    o.device = KV_RT_DEVICE_CUDA_MODEL, o.n_seqs = 1, o.n_heads = 9, o.n_threads = 1, o.rope_inv_freq = freq;
    for (int i = 0; i < kv_rt_selfcheck_catalog_size(); i++) {
        if (SANITIZED && i % 3 != 0) continue;
        kv_plan *p = NULL;
        const char *name = NULL;
        ck_assert_kv_ok(kv_rt_selfcheck_catalog(i, &p, &name));
        kv_rt_check rep;
        ck_assert_kv_ok(kv_rt_selfcheck(p, &o, &rep));
        ck_assert(rep.passed);
        ck_assert_uint_gt(rep.rows_checked, 0);
        ck_assert_uint_gt(rep.values_compared, 0);
        printf("selfcheck %-32s worst/bound %.3g, %llu of %llu cache values differ (%.2g), %.3f s\n", name,
               rep.worst_ratio, (unsigned long long)rep.values_differing, (unsigned long long)rep.values_compared,
               rep.max_recon_rel, rep.seconds);
        for (int fault = 1; fault <= 2; fault++) {
            if (fault == 2 && (strcmp(name, "f16") == 0 || strcmp(name, "f32") == 0)) continue; /* nothing coded */
            kv_rti_dev_host_fault = fault;
            const kv_status s = kv_rt_selfcheck(p, &o, &rep);
            kv_rti_dev_host_fault = 0;
            ck_assert_msg(s == KV_ENUMERIC && !rep.passed, "%s: fault %d not caught", name, fault);
            /* a flipped code shows first in an attention output over it, or in the decoded cache */
            ck_assert_msg(strstr(rep.what, "outside the bound") || (fault == 2 && strstr(rep.what, "differs from the CPU")),
                          "%s fault %d: %s", name, fault, rep.what);
            ck_assert_ptr_nonnull(strstr(rep.what, "layer"));
        }
        kv_plan_free(p);
    }
}
END_TEST

/* Long sequences: segment boundaries (2048) crossed twice, a long prefill (tiled) then decoding. */
START_TEST(test_long_sequences) {
    kv_simd_level_limit(_i ? KV_SIMD_AVX2 : KV_SIMD_NONE);
    const rcase c1 = {"long kivi-2", 1, 2, 3, 64, 4, 128, U(2, 32, TOK), U(2, 32, CH), F16, F16, 0, 0, 0, 0, 4300, 4290,
                      1, 0, 0, NO_SQ};
    const rcase c2 = {"long higgs-2 pre-rope", 1, 1, 3, 64, 4, 128, HG(0, 2, 16), HG(0, 2, 16), F16, F16, 0, 1, 0, 0,
                      2200, 2196, 1, 0, 0, NO_SQ};
    printf("long kivi-2 worst %.3g\n", run_case(&c1, 1, 2));
    printf("long higgs-2 worst %.3g\n", run_case(&c2, 1, 2));
}
END_TEST

/* The polynomial exp of the softmax against exp, over every float in [-104, 0] stepped finely. */
START_TEST(test_exp) {
    kv_simd_level_limit(_i ? KV_SIMD_AVX2 : KV_SIMD_NONE);
    double worst = 0;
    for (double x = -104.0; x <= 0.0; x += 1.0 / 4096) {
        float v = (float)x;
        kv_rti_exp_inplace(&v, 1);
        const double want = exp((double)(float)x);
        if ((float)x < -87.33f) { /* 2^n below the normal range: flushed to 0 (rt_math.c) */
            ck_assert_float_eq(v, 0.0f);
            continue;
        }
        worst = fmax(worst, fabs(v - want) / want);
    }
    ck_assert_double_lt(worst, 4e-7);
    float z[9] = {0, -INFINITY, -1e30f, -87.0f, -87.5f, -0.5f, -1e-20f, -20.0f, -3.0f};
    kv_rti_exp_inplace(z, 9);
    ck_assert_float_eq(z[0], 1.0f);
    ck_assert_float_eq(z[1], 0.0f);
    ck_assert_float_eq(z[2], 0.0f);
    ck_assert_float_eq(z[4], 0.0f);
    ck_assert_float_eq(z[6], 1.0f);
}
END_TEST

/* The softmax's shift by the maximum: the same bits at every SIMD level (it is exact), for lengths
 * around the vector width and the maximum in the tail, the body and the first lane. */
START_TEST(test_shift_by_max) {
    kv_rng r;
    kv_rng_init(&r, 5);
    for (int n = 1; n <= 41; n++)
        for (int where = 0; where < 3; where++) {
            float a[41], b[41];
            for (int i = 0; i < n; i++) a[i] = (float)kv_rng_next_normal(&r);
            const int at = where == 0 ? 0 : where == 1 ? n / 2 : n - 1;
            a[at] = 9.0f;
            memcpy(b, a, sizeof a);
            kv_simd_level_limit(KV_SIMD_NONE);
            const float m0 = kv_rti_shift_by_max(a, (size_t)n);
            kv_simd_level_limit(KV_SIMD_AVX2);
            const float m1 = kv_rti_shift_by_max(b, (size_t)n);
            ck_assert_float_eq(m0, 9.0f);
            ck_assert_float_eq(m1, 9.0f);
            ck_assert_msg(memcmp(a, b, sizeof(float) * (size_t)n) == 0, "n %d: the levels differ", n);
            ck_assert_float_eq(a[at], 0.0f);
        }
}
END_TEST

/* Decoding with 1 and 2 threads gives the same bits (fixed segments, fixed combine order). */
START_TEST(test_threads_agree) {
    const rcase c = {"threads", 2, 2, 3, 64, 4, 32, U(2, 32, TOK), HG(0, 2, 16), F16, F16, 0, 0, 0, 0, 2500, 2490, 1, 0, 0, NO_SQ};
    kv_plan *p = make_plan(&c);
    float *outs[2];
    const int kvd = 128, qd = 384, n = c.T;
    float *k = malloc(sizeof(float) * (size_t)n * kvd), *v = malloc(sizeof(float) * (size_t)n * kvd);
    float *q = malloc(sizeof(float) * qd);
    int32_t *pos = malloc(sizeof(int32_t) * (size_t)n);
    for (int i = 0; i < n; i++) pos[i] = i;
    for (int th = 1; th <= 2; th++) {
        kv_rt_options o;
        memset(&o, 0, sizeof o);
        o.n_seqs = 1, o.n_heads = 6, o.n_threads = th;
        kv_rt *rt = NULL;
        ck_assert_kv_ok(kv_rt_open(&rt, p, &o));
        outs[th - 1] = malloc(sizeof(float) * qd);
        for (int l = 0; l < 2; l++) {
            fill_kv(k, v, 2490, kvd, l, 0, 3);
            ck_assert_kv_ok(kv_rt_append(rt, l, 0, 2490, pos, k, k, v, kvd));
        }
        for (int t = 2490; t < n; t++)
            for (int l = 0; l < 2; l++) {
                fill_kv(k, v, 1, kvd, l, t, 3);
                ck_assert_kv_ok(kv_rt_append(rt, l, 0, 1, pos + t, k, k, v, kvd));
                for (int i = 0; i < qd; i++) q[i] = (float)sin(0.37 * i + t + l);
                ck_assert_kv_ok(kv_rt_attend(rt, l, 0, 1, q, qd, outs[th - 1], qd));
            }
        kv_rt_close(rt);
    }
    ck_assert_int_eq(memcmp(outs[0], outs[1], sizeof(float) * qd), 0);
    free(outs[0]), free(outs[1]), free(k), free(v), free(q), free(pos);
    kv_plan_free(p);
}
END_TEST

/* AQUA-KV with the reconstructions kept across steps (extended chunk by chunk) gives the same bits as
 * rebuilding them at every step: every chunk is predicted by the same call on the same rows. */
START_TEST(test_keep_reconstructions) {
    const rcase c = {"aqua keep", 3, 2, 2, 32, 4, 16, U(2, 16, CH), HG(0, 2, 16), HG(0, 2, 256), HG(0, 2, 256), 1, 1, 0, 1,
                     120, 20, 1, 0, 0, NO_SQ};
    kv_plan *p = make_plan(&c);
    double *freq = rope_freqs(c.hd);
    const int kvd = 64, qd = 128, T = c.T;
    float *k = malloc(sizeof(float) * (size_t)T * kvd), *v = malloc(sizeof(float) * (size_t)T * kvd);
    float q[128], outs[2][3][128];
    int32_t pos[120];
    for (int i = 0; i < T; i++) pos[i] = i;
    for (int keep = 0; keep < 2; keep++) {
        kv_rt_options o;
        memset(&o, 0, sizeof o);
        o.n_seqs = 1, o.n_heads = 4, o.n_threads = 2, o.rope_inv_freq = freq, o.keep_reconstructions = keep;
        kv_rt *rt = NULL;
        ck_assert_kv_ok(kv_rt_open(&rt, p, &o));
        for (int t = 0; t < T; t++)
            for (int l = 0; l < 3; l++) {
                fill_kv(k, v, 1, kvd, l, t, 9);
                ck_assert_kv_ok(kv_rt_append(rt, l, 0, 1, pos + t, k, k, v, kvd));
                for (int i = 0; i < qd; i++) q[i] = (float)cos(0.3 * i + t + l);
                ck_assert_kv_ok(kv_rt_attend(rt, l, 0, 1, q, qd, outs[keep][l], qd));
            }
        kv_rt_stats st;
        ck_assert_kv_ok(kv_rt_get_stats(rt, 0, &st));
        /* kept: layers 1 and 2's streams and their inputs stay (f32, every compressed token) */
        if (keep) ck_assert_uint_ge(st.working_bytes, 4u * (uint64_t)(T - 4 - 16) * kvd * 4u);
        kv_rt_close(rt);
    }
    ck_assert_int_eq(memcmp(outs[0], outs[1], sizeof outs[0]), 0);
    free(k), free(v), free(freq);
    kv_plan_free(p);
}
END_TEST

/* ---- token pruning (RUNTIME.md §8) --------------------------------------------------------------------
 * A prompt of `prefill` tokens, then decoding steps. Checked: every attend against exact attention over the
 * tokens each head holds (decoded); the number of tokens each head keeps against the budget, recomputed
 * here from kv_quant_storage; the tokens kept against scores recomputed here in double precision from the
 * decoded cache (the attention every query paid them for H2O, the pooled attention of the window for
 * SnapKV/PyramidKV, recency for StreamingLLM): no dropped token may outscore a kept one beyond float
 * rounding; the decoded cache bit for bit against a replay with the public quantizers (each head's kept
 * tokens one block, HIGGS signs at the head's channel offset); bytes held = bytes accounted. */
typedef struct pcase {
    const char *name;
    int layers, kv_heads, gqa, hd, sinks, recent;
    sspec k, v;
    int pre_rope;
    int method;       /* kv_plan_prune */
    float budget;
    int window, pool;
    float budget_l1;  /* layer 1's own budget (0: the global one) */
    int T, prefill, step;
} pcase;

static kv_plan *make_pplan(const pcase *c) {
    rcase r;
    memset(&r, 0, sizeof r);
    r.name = c->name, r.layers = c->layers, r.kv_heads = c->kv_heads, r.gqa = c->gqa, r.hd = c->hd;
    r.sinks = c->sinks, r.recent = c->recent, r.k = c->k, r.v = c->v, r.pre_rope = c->pre_rope;
    kv_plan *p = make_plan(&r);
    p->global.prune_method = (kv_plan_prune)c->method;
    p->global.prune_budget = c->budget;
    p->global.prune_window = c->window;
    p->global.prune_pool = c->pool;
    if (c->budget_l1 > 0 && c->layers > 1) p->layers[1].prune_budget = c->budget_l1;
    ck_assert_kv_ok(kv_plan_validate(p));
    return p;
}

/* The layer's budget: its own, PyramidKV's schedule (written out here: b_max = min(1, 2b - b/20), falling
 * linearly to 2b - b_max), or the global one. */
static double layer_budget(const kv_plan *p, int l) {
    if (p->layers[l].prune_budget > 0) return p->layers[l].prune_budget;
    int any = 0;
    for (int i = 0; i < p->n_layers; i++) any |= p->layers[i].prune_budget > 0;
    const double b = p->global.prune_budget;
    if (p->global.prune_method != KV_PLAN_PRUNE_PYRAMIDKV || any || p->n_layers == 1) return b;
    const double bmax = fmin(1.0, 2 * b - b / 20), bmin = 2 * b - bmax;
    return bmax - (bmax - bmin) * l / (p->n_layers - 1);
}

/* The quantizer of head h's own blocks (one head wide), written out independently of kv_rti_codec_head_init:
 * HIGGS signs at the head's channel offset, a float stream's per-head scale. */
static kv_quant head_quant(kv_quant q, int h, int hd) {
    if (q.kind == KV_QUANT_HIGGS) q.higgs.channel0 = (uint64_t)h * (uint64_t)hd;
    if (q.kind == KV_QUANT_FP && q.fp.n_scales > 1) q.fp.scales += h, q.fp.n_scales = 1;
    return q;
}

/* Rows a head keeps: the most whose K and V blocks (one head wide) plus index fit the allowance. */
static int expected_rows(const kv_plan *p, int l, double allow, int forced, int most, int index, int hd) {
    kv_quant qk, qv;
    ck_assert_kv_ok(kv_quant_from_plan(&qk, p, l, KV_PLAN_K));
    ck_assert_kv_ok(kv_quant_from_plan(&qv, p, l, KV_PLAN_V));
    for (int m = most; m > forced; m--) {
        kv_block_storage a, b;
        const kv_quant hk = head_quant(qk, 0, hd), hv = head_quant(qv, 0, hd);
        ck_assert_kv_ok(kv_quant_storage(&a, &hk, (size_t)m, (size_t)hd));
        ck_assert_kv_ok(kv_quant_storage(&b, &hv, (size_t)m, (size_t)hd));
        if ((double)(a.total_bytes + b.total_bytes) + 2.0 * (double)index * m <= allow) return m; /* K and V blocks each store positions */
    }
    return forced;
}

/* Candidates [lo, hi): `kept` of them held (flags), compared by score: every kept one scores at least as
 * high as every dropped one, up to float rounding (the runtime scores in float). Returns the kept count. */
static int check_margin(const char *what, int l, int h, const double *score, const unsigned char *kept, int lo, int hi) {
    double kmin = INFINITY, dmax = -INFINITY, smax = 0;
    int nk = 0;
    for (int t = lo; t < hi; t++) {
        smax = fmax(smax, fabs(score[t]));
        if (kept[t]) kmin = fmin(kmin, score[t]), nk++;
        else dmax = fmax(dmax, score[t]);
    }
    /* scores are sums of softmax weights computed in float (GEMM, polynomial exp, float sums of <= a few
     * hundred terms): relative error well below 1e-5 of the largest */
    const double tol = 1e-5 * smax + 1e-9;
    if (nk && dmax > -INFINITY && !(kmin >= dmax - tol))
        ck_abort_msg("%s: layer %d head %d: a dropped token scores %.9g, above a kept one (%.9g)", what, l, h, dmax, kmin);
    return nk;
}

typedef struct pstate_t {
    const pcase *c;
    kv_plan *p;
    kv_rt *rt;
    int H, kvd, T;
    double *acc_all;  /* per layer: H x T, the attention every checked query paid each position (H2O) */
    double *acc_win;  /* per layer: H x T, the prompt window's queries only (SnapKV) */
} pstate_t;

static void verify_prompt(const pstate_t *ps, int l) {
    const pcase *c = ps->c;
    const int P = c->prefill, S = P < c->sinks ? P : c->sinks, hd = c->hd;
    const int wstart = P - c->window > S ? P - c->window : S, forced = P - wstart;
    const int index = c->method == KV_PLAN_PRUNE_STREAMINGLLM ? 0 : 4;
    const double allow = layer_budget(ps->p, l) * P * hd * 4.0 - S * hd * 4.0;
    const int m = expected_rows(ps->p, l, allow, forced, P - S, index, hd);
    int32_t *pos = malloc(sizeof(int32_t) * (size_t)ps->T);
    unsigned char *kept = calloc((size_t)ps->T, 1);
    double *sc = calloc((size_t)ps->T, sizeof(double));
    for (int h = 0; h < ps->H; h++) {
        const int n = kv_rt_held(ps->rt, l, 0, h);
        ck_assert_kv_ok(kv_rt_held_positions(ps->rt, l, 0, h, pos));
        memset(kept, 0, (size_t)ps->T);
        for (int i = 0; i < n; i++) kept[pos[i]] = 1;
        for (int t = 0; t < S; t++) ck_assert_msg(kept[t], "%s: sink %d dropped", c->name, t);
        for (int t = wstart; t < P; t++) ck_assert_msg(kept[t], "%s: window token %d dropped", c->name, t);
        int held = 0;
        for (int t = S; t < P; t++) held += kept[t];
        ck_assert_msg(held == m, "%s: layer %d head %d keeps %d prompt tokens, the budget pays for %d", c->name, l, h, held, m);
        const double *a = ps->acc_all + (size_t)l * ps->H * ps->T + (size_t)h * ps->T;
        const double *w = ps->acc_win + (size_t)l * ps->H * ps->T + (size_t)h * ps->T;
        if (c->method == KV_PLAN_PRUNE_STREAMINGLLM) {
            for (int t = S; t < wstart; t++) sc[t] = t;
        } else if (c->method == KV_PLAN_PRUNE_H2O) {
            for (int t = S; t < wstart; t++) sc[t] = a[t];
        } else { /* SnapKV, PyramidKV: the window's attention to the prefix [0, wstart), averaged over `pool` */
            const int half = c->pool / 2;
            for (int t = S; t < wstart; t++) {
                double v = 0;
                for (int u = t - half; u <= t + half; u++)
                    if (u >= 0 && u < wstart) v += w[u];
                sc[t] = c->pool ? v / (2 * half + 1) : w[t];
            }
        }
        check_margin(c->name, l, h, sc, kept, S, wstart);
    }
    free(pos), free(kept), free(sc);
}

/* H2O after the prompt: the chunk [c0, c0 + R) left the window; per head its best-scored tokens stay. */
static void verify_chunk(const pstate_t *ps, int l, int c0) {
    const pcase *c = ps->c;
    const int R = c->recent, hd = c->hd;
    const int k = expected_rows(ps->p, l, layer_budget(ps->p, l) * R * hd * 4.0, 0, R, 4, hd);
    int32_t *pos = malloc(sizeof(int32_t) * (size_t)ps->T);
    unsigned char *kept = calloc((size_t)ps->T, 1);
    for (int h = 0; h < ps->H; h++) {
        const int n = kv_rt_held(ps->rt, l, 0, h);
        ck_assert_kv_ok(kv_rt_held_positions(ps->rt, l, 0, h, pos));
        memset(kept, 0, (size_t)ps->T);
        for (int i = 0; i < n; i++) kept[pos[i]] = 1;
        const double *a = ps->acc_all + (size_t)l * ps->H * ps->T + (size_t)h * ps->T;
        const int nk = check_margin(c->name, l, h, a, kept, c0, c0 + R);
        ck_assert_msg(nk == k, "%s: layer %d head %d keeps %d of chunk %d, the budget pays for %d", c->name, l, h, nk, c0, k);
    }
    free(pos), free(kept);
}

/* The decoded cache against a replay with the public quantizers. */
static void replay_pruned(const pstate_t *ps, const double *freq) {
    const pcase *c = ps->c;
    kv_rt *rt = ps->rt;
    const int T = ps->T, kvd = ps->kvd, hd = c->hd, P = c->prefill, R = c->recent;
    float *xk = malloc(sizeof(float) * (size_t)T * kvd), *xv = malloc(sizeof(float) * (size_t)T * kvd);
    float *K = malloc(sizeof(float) * (size_t)T * hd), *V = malloc(sizeof(float) * (size_t)T * hd);
    float *blk = malloc(sizeof(float) * (size_t)T * kvd), *out = malloc(sizeof(float) * (size_t)T * kvd);
    int32_t *pos = malloc(sizeof(int32_t) * (size_t)T);
    for (int l = 0; l < c->layers; l++) {
        fill_kv(xk, xv, T, kvd, l, 0, 5u);
        if (!c->pre_rope)
            for (int t = 0; t < T; t++)
                for (int h = 0; h < ps->H; h++) rope_row(xk + (size_t)t * kvd + (size_t)h * hd, hd, 0, freq, t);
        f16_round(xk, (size_t)T * kvd), f16_round(xv, (size_t)T * kvd);
        const int sel_end = rt->seqs[0].ps[l].sel_end;
        for (int st = 0; st < 2; st++) {
            const float *x = st ? xv : xk;
            const int comp_end = rt->seqs[0].st[l * 2 + st].comp_end;
            kv_quant q;
            ck_assert_kv_ok(kv_quant_from_plan(&q, ps->p, l, st));
            for (int h = 0; h < ps->H; h++) {
                const int n = kv_rt_held(rt, l, 0, h);
                ck_assert_kv_ok(kv_rt_decode_head(rt, l, 0, h, K, V));
                ck_assert_kv_ok(kv_rt_held_positions(rt, l, 0, h, pos));
                const kv_quant qh = head_quant(q, h, hd);
                for (int i = 0; i < n;) {
                    const int t = pos[i];
                    /* the run of rows coded together: sinks / the window (f16), the prompt's kept tokens, an H2O
                     * chunk's kept tokens (one block each, one head wide), whole-token chunks */
                    int j = i + 1, whole = 0;
                    if (t < c->sinks || t >= comp_end) {
                        for (int r = 0; r < hd; r++) out[r] = x[(size_t)t * kvd + (size_t)h * hd + r];
                        j = i + 1;
                    } else if (t < sel_end) {
                        const int base = P > c->sinks ? P : c->sinks; /* H2O's chunks start after the prompt */
                        const int grp = t < base ? -1 : (t - base) / R;
                        while (j < n && pos[j] < sel_end && (pos[j] < base ? -1 : (pos[j] - base) / R) == grp) j++;
                        for (int r = i; r < j; r++) memcpy(blk + (size_t)(r - i) * hd, x + (size_t)pos[r] * kvd + (size_t)h * hd, sizeof(float) * hd);
                        ck_assert_kv_ok(kv_quant_roundtrip(out, NULL, &qh, (size_t)(j - i), (size_t)hd, blk));
                    } else {
                        const int c0 = sel_end + (t - sel_end) / R * R;
                        ck_assert_int_eq(t, c0); /* whole chunks are held whole */
                        ck_assert_kv_ok(kv_quant_roundtrip(out, NULL, &q, (size_t)R, (size_t)kvd, x + (size_t)c0 * kvd));
                        j = i + R;
                        whole = 1;
                    }
                    for (int r = i; r < j; r++) {
                        float row[KV_RT_MAX_HEAD_DIM];
                        memcpy(row, out + (whole ? (size_t)(r - i) * kvd + (size_t)h * hd : (size_t)(r - i) * hd), sizeof(float) * hd);
                        if (st == 0 && c->pre_rope) rope_row(row, hd, 0, freq, pos[r]);
                        const float *got = (st ? V : K) + (size_t)r * hd;
                        if (memcmp(got, row, sizeof(float) * hd) != 0)
                            ck_abort_msg("%s: layer %d %s head %d row %d (position %d) differs from the replay", c->name, l,
                                         st ? "V" : "K", h, r, pos[r]);
                    }
                    i = j;
                }
            }
        }
    }
    free(xk), free(xv), free(K), free(V), free(blk), free(out), free(pos);
}

static double run_pcase(const pcase *c, int n_threads) {
    kv_plan *p = make_pplan(c);
    double *freq = rope_freqs(c->hd);
    kv_rt_options o;
    memset(&o, 0, sizeof o);
    o.n_seqs = 1, o.n_heads = c->kv_heads * c->gqa, o.n_threads = n_threads, o.rope_inv_freq = freq;
    kv_rt *rt = NULL;
    ck_assert_kv_ok(kv_rt_open(&rt, p, &o));
    const int kvd = c->kv_heads * c->hd, qd = c->kv_heads * c->gqa * c->hd, H = c->kv_heads, G = c->gqa, T = c->T;
    const int maxn = c->prefill > c->step ? c->prefill : c->step;
    float *k = malloc(sizeof(float) * (size_t)maxn * kvd), *kp = malloc(sizeof(float) * (size_t)maxn * kvd);
    float *v = malloc(sizeof(float) * (size_t)maxn * kvd), *q = malloc(sizeof(float) * (size_t)maxn * qd);
    float *out = malloc(sizeof(float) * (size_t)maxn * qd);
    int32_t *pos = malloc(sizeof(int32_t) * (size_t)maxn);
    pstate_t ps = {c, p, rt, H, kvd, T, calloc((size_t)c->layers * H * T, sizeof(double)),
                   calloc((size_t)c->layers * H * T, sizeof(double))};
    double worst = 0;
    for (int len = 0; len < T;) {
        int n = len == 0 ? c->prefill : c->step;
        if (n > T - len) n = T - len;
        for (int i = 0; i < n; i++) pos[i] = len + i;
        for (int l = 0; l < c->layers; l++) {
            fill_kv(k, v, n, kvd, l, len, 5u);
            memcpy(kp, k, sizeof(float) * (size_t)n * kvd);
            for (int h = 0; h < H; h++)
                for (int i = 0; i < n; i++) rope_row(k + (size_t)i * kvd + (size_t)h * c->hd, c->hd, 0, freq, pos[i]);
            const int sel0 = rt->seqs[0].ps[l].sel_end;
            ck_assert_kv_ok(kv_rt_append(rt, l, 0, n, pos, kp, k, v, (size_t)kvd));
            for (int c0 = sel0; len > 0 && c0 < rt->seqs[0].ps[l].sel_end; c0 += c->recent) verify_chunk(&ps, l, c0);
            kv_rng r;
            kv_rng_init(&r, 900u + (uint64_t)(len * 131 + l * 7));
            for (size_t i = 0; i < (size_t)n * qd; i++) q[i] = (float)(1.5 * kv_rng_next_normal(&r));
            ck_assert_kv_ok(kv_rt_attend(rt, l, 0, n, q, (size_t)qd, out, (size_t)qd));
            acc_out aa = {ps.acc_all + (size_t)l * H * T, T, 0}, aw = {ps.acc_win + (size_t)l * H * T, T, n - c->window};
            worst = fmax(worst, check_attend_acc(rt, p, l, 0, n, q, out, H, G, c->hd, n > RT_DIRECT_MAX_ROWS, c->name, &aa));
            if (len == 0) check_attend_acc(rt, p, l, 0, n, q, out, H, G, c->hd, n > RT_DIRECT_MAX_ROWS, c->name, &aw);
        }
        len += n;
        if (len == c->prefill) {
            kv_rt_stats before;
            ck_assert_kv_ok(kv_rt_get_stats(rt, 0, &before));
            ck_assert_uint_eq(before.payload_bytes, 0); /* the prompt is held in f16 until it ends */
            ck_assert_kv_ok(kv_rt_end_prompt(rt, 0));
            ck_assert_kv_ok(kv_rt_end_prompt(rt, 0)); /* a second call is a no-op */
            for (int l = 0; l < c->layers; l++) verify_prompt(&ps, l);
        }
        check_bytes(rt, 0);
    }
    replay_pruned(&ps, freq);
    kv_rt_stats st;
    ck_assert_kv_ok(kv_rt_get_stats(rt, 0, &st));
    ck_assert_uint_eq(st.values_appended, 2u * (uint64_t)c->layers * (uint64_t)T * (uint64_t)kvd);
    kv_rt_reset(rt, 0);
    ck_assert_kv_ok(kv_rt_get_stats(rt, 0, &st));
    ck_assert_uint_eq(st.allocated_bytes, 0);
    free(ps.acc_all), free(ps.acc_win);
    free(k), free(kp), free(v), free(q), free(out), free(pos), free(freq);
    kv_rt_close(rt);
    kv_plan_free(p);
    return worst;
}

enum { SLLM = KV_PLAN_PRUNE_STREAMINGLLM, H2O = KV_PLAN_PRUNE_H2O, SNAP = KV_PLAN_PRUNE_SNAPKV, PYR = KV_PLAN_PRUNE_PYRAMIDKV };
static const pcase k_pcases[] = {
    /* name, layers, kv_heads, gqa, hd, sinks, recent, k, v, pre_rope, method, budget, window, pool, budget_l1, T, prefill, step */
    {"snapkv kivi-4", 2, 3, 3, 64, 4, 32, U(4, 32, TOK), U(4, 64, CH), 0, SNAP, 0.25f, 16, 7, 0, 420, 300, 1},
    {"snapkv kivi-2 tiled steps", 2, 2, 2, 32, 2, 32, U(2, 32, TOK), U(2, 32, CH), 0, SNAP, 0.2f, 8, 5, 0.4f, 400, 250, 50},
    {"snapkv f16 16-bit", 1, 2, 3, 64, 4, 32, F16, F16, 0, SNAP, 0.25f, 8, 0, 0, 300, 260, 1},
    {"snapkv higgs pre-rope", 2, 2, 2, 64, 4, 32, HG(32, 2, 16), HG(0, 2, 256), 1, SNAP, 0.15f, 8, 3, 0, 330, 280, 1},
    {"pyramidkv kivi-4", 3, 2, 3, 32, 4, 32, U(4, 32, TOK), U(4, 32, CH), 0, PYR, 0.3f, 8, 5, 0, 320, 280, 2},
    {"h2o kivi-2 decode chunks", 2, 2, 3, 32, 4, 32, U(2, 32, TOK), U(2, 32, CH), 0, H2O, 0.1f, 8, 0, 0, 330, 200, 1},
    {"h2o higgs tiled", 1, 3, 2, 64, 4, 16, HG(0, 2, 16), HG(0, 2, 16), 0, H2O, 0.08f, 4, 0, 0, 300, 180, 16},
    {"h2o kivi pre-rope", 1, 2, 2, 32, 4, 32, U(4, 32, TOK), U(4, 32, CH), 1, H2O, 0.15f, 8, 0, 0, 290, 200, 3},
    {"streamingllm kivi-2", 2, 2, 2, 32, 4, 32, U(2, 32, TOK), U(2, 32, CH), 0, SLLM, 0.2f, 0, 0, 0, 300, 256, 1},
    {"snapkv fp8 per head", 2, 3, 2, 64, 4, 32, FL(E4M3, 1), FL(E5M2, 1), 0, SNAP, 0.3f, 8, 5, 0, 330, 260, 1},
    {"h2o nvfp4 per head tiled", 1, 2, 3, 32, 4, 16, FL(NVFP4, 1), FL(NVFP4, 0), 0, H2O, 0.2f, 4, 0, 0, 300, 180, 8},
    {"budget keeps all", 1, 2, 2, 32, 4, 32, U(2, 32, TOK), U(2, 32, CH), 0, SNAP, 1.0f, 8, 7, 0, 140, 100, 1},
    {"forced over budget", 1, 2, 2, 32, 4, 32, F16, F16, 0, SNAP, 0.05f, 16, 7, 0, 110, 100, 1},
    {"short prompt", 1, 2, 2, 32, 4, 32, U(2, 32, TOK), U(2, 32, CH), 0, H2O, 0.5f, 2, 0, 0, 40, 3, 1},
};

START_TEST(test_pruning) {
    const int n = (int)(sizeof k_pcases / sizeof k_pcases[0]);
    kv_simd_level_limit(_i < n ? KV_SIMD_NONE : KV_SIMD_AVX2);
    const pcase *c = &k_pcases[_i % n];
    printf("%-32s %s worst error / bound: %.3g\n", c->name, _i < n ? "portable" : "avx2    ", run_pcase(c, 2));
}
END_TEST

/* One prefill, several plans: a prompt copied from a runtime that collected the prompt statistics is
 * exactly the prompt each plan's own runtime would hold — the same kept tokens, the same decoded cache
 * and the same attention afterwards, bit for bit — and the selection does not depend on the thread count. */
START_TEST(test_prompt_copy) {
    const pcase base = {"copy", 2, 2, 3, 32, 4, 32, U(4, 32, TOK), U(4, 32, CH), 0, SNAP, 0.25f, 8, 5, 0, 0, 0, 0};
    const int methods[] = {SLLM, H2O, SNAP, PYR}, P = 200, hd = 32, kvd = 64, qd = 192;
    double *freq = rope_freqs(hd);
    float *k = malloc(sizeof(float) * P * kvd), *v = malloc(sizeof(float) * P * kvd), *q = malloc(sizeof(float) * P * qd);
    float *o = malloc(sizeof(float) * P * qd), *o1 = malloc(sizeof(float) * qd), *o2 = malloc(sizeof(float) * qd);
    float *K1 = malloc(sizeof(float) * (P + 1) * hd), *V1 = malloc(sizeof(float) * (P + 1) * hd);
    float *K2 = malloc(sizeof(float) * (P + 1) * hd), *V2 = malloc(sizeof(float) * (P + 1) * hd);
    int32_t pos[201];
    for (int i = 0; i <= P; i++) pos[i] = i;
    /* the source: an f16 plan that prunes nothing, collecting statistics for every policy */
    pcase sc = base;
    sc.method = KV_PLAN_PRUNE_NONE, sc.budget = 1.0f, sc.k = (sspec)F16, sc.v = (sspec)F16;
    kv_plan *ps = make_pplan(&sc);
    kv_rt_options so;
    memset(&so, 0, sizeof so);
    so.n_seqs = 1, so.n_heads = 6, so.n_threads = 2, so.rope_inv_freq = freq, so.prompt_stats = 1, so.prompt_window = 16;
    kv_rt *src = NULL;
    ck_assert_kv_ok(kv_rt_open(&src, ps, &so));
    for (int l = 0; l < 2; l++) {
        fill_kv(k, v, P, kvd, l, 0, 8);
        for (int i = 0; i < P * qd; i++) q[i] = (float)sin(0.01 * i + l);
        ck_assert_kv_ok(kv_rt_append(src, l, 0, P, pos, k, k, v, kvd));
        ck_assert_kv_ok(kv_rt_attend(src, l, 0, P, q, qd, o, qd));
    }
    for (size_t mi = 0; mi < sizeof methods / sizeof methods[0]; mi++) {
        pcase pc = base;
        pc.method = methods[mi];
        kv_plan *p = make_pplan(&pc);
        kv_rt *own = NULL, *cp = NULL;
        kv_rt_options oo = so;
        oo.prompt_stats = 0, oo.prompt_window = 0, oo.n_threads = 1; /* 1 thread here, 2 in the source */
        ck_assert_kv_ok(kv_rt_open(&own, p, &oo));
        ck_assert_kv_ok(kv_rt_open(&cp, p, &oo));
        for (int l = 0; l < 2; l++) {
            fill_kv(k, v, P, kvd, l, 0, 8);
            for (int i = 0; i < P * qd; i++) q[i] = (float)sin(0.01 * i + l);
            ck_assert_kv_ok(kv_rt_append(own, l, 0, P, pos, k, k, v, kvd));
            ck_assert_kv_ok(kv_rt_attend(own, l, 0, P, q, qd, o, qd));
        }
        ck_assert_kv_ok(kv_rt_prompt_copy(cp, 0, src, 0));
        ck_assert_kv_ok(kv_rt_end_prompt(own, 0));
        ck_assert_kv_ok(kv_rt_end_prompt(cp, 0));
        int pruned = 0;
        for (int l = 0; l < 2; l++) {
            fill_kv(k, v, 1, kvd, l, P, 8);
            for (int i = 0; i < qd; i++) q[i] = (float)cos(0.05 * i + l);
            ck_assert_kv_ok(kv_rt_append(own, l, 0, 1, pos + P, k, k, v, kvd));
            ck_assert_kv_ok(kv_rt_append(cp, l, 0, 1, pos + P, k, k, v, kvd));
            ck_assert_kv_ok(kv_rt_attend(own, l, 0, 1, q, qd, o1, qd));
            ck_assert_kv_ok(kv_rt_attend(cp, l, 0, 1, q, qd, o2, qd));
            ck_assert_msg(memcmp(o1, o2, sizeof(float) * qd) == 0, "%s: layer %d attention differs after a copy",
                          kv_plan_prune_name(methods[mi]), l);
            for (int h = 0; h < 2; h++) {
                const int n1 = kv_rt_held(own, l, 0, h);
                ck_assert_int_eq(n1, kv_rt_held(cp, l, 0, h));
                pruned |= n1 < P + 1;
                ck_assert_kv_ok(kv_rt_decode_head(own, l, 0, h, K1, V1));
                ck_assert_kv_ok(kv_rt_decode_head(cp, l, 0, h, K2, V2));
                ck_assert_int_eq(memcmp(K1, K2, sizeof(float) * (size_t)n1 * hd), 0);
                ck_assert_int_eq(memcmp(V1, V2, sizeof(float) * (size_t)n1 * hd), 0);
            }
        }
        ck_assert(pruned);
        kv_rt_stats s1, s2;
        ck_assert_kv_ok(kv_rt_get_stats(own, 0, &s1));
        ck_assert_kv_ok(kv_rt_get_stats(cp, 0, &s2));
        ck_assert_uint_eq(s1.accounted_bytes, s2.accounted_bytes);
        ck_assert_uint_eq(s1.allocated_bytes, s2.allocated_bytes);
        /* a destination that prunes nothing would have compressed the prompt as it came: refused */
        kv_rt *plain = NULL;
        ck_assert_kv_ok(kv_rt_open(&plain, ps, &oo));
        ck_assert_int_eq(kv_rt_prompt_copy(plain, 0, src, 0), KV_EINVAL);
        ck_assert_ptr_nonnull(strstr(kv_error_last(), "prunes nothing"));
        kv_rt_close(plain);
        kv_rt_close(own), kv_rt_close(cp);
        kv_plan_free(p);
    }
    /* a source without statistics cannot feed H2O */
    pcase sn = base;
    kv_plan *psn = make_pplan(&sn); /* SnapKV: keeps window queries, no accumulated attention */
    pcase h2 = base;
    h2.method = H2O;
    kv_plan *ph2 = make_pplan(&h2);
    kv_rt_options oo = so;
    oo.prompt_stats = 0;
    kv_rt *a = NULL, *b = NULL;
    ck_assert_kv_ok(kv_rt_open(&a, psn, &oo));
    ck_assert_kv_ok(kv_rt_open(&b, ph2, &oo));
    fill_kv(k, v, 20, kvd, 0, 0, 8);
    ck_assert_kv_ok(kv_rt_append(a, 0, 0, 20, pos, k, k, v, kvd));
    ck_assert_int_eq(kv_rt_prompt_copy(b, 0, a, 0), KV_EINVAL);
    ck_assert_ptr_nonnull(strstr(kv_error_last(), "accumulated"));
    kv_rt_close(a), kv_rt_close(b), kv_rt_close(src);
    kv_plan_free(psn), kv_plan_free(ph2), kv_plan_free(ps);
    free(freq), free(k), free(v), free(q), free(o), free(o1), free(o2), free(K1), free(V1), free(K2), free(V2);
}
END_TEST

/* Bad input and what the policies cannot score: each refused with its own message. */
START_TEST(test_pruning_refusals) {
    const pcase base = {"refuse", 2, 2, 2, 32, 4, 32, U(2, 32, TOK), U(2, 32, CH), 0, SNAP, 0.25f, 8, 5, 0, 0, 0, 0};
    double *freq = rope_freqs(32);
    kv_rt_options o;
    memset(&o, 0, sizeof o);
    o.n_seqs = 1, o.n_heads = 4, o.n_threads = 1, o.rope_inv_freq = freq;
    kv_rt *rt = NULL;
    kv_plan *p = make_pplan(&base);
    /* budgets outside (0, 1], an even pooling kernel, no observation window for SnapKV */
    p->global.prune_budget = 1.5f;
    ck_assert_int_eq(kv_rt_open(&rt, p, &o), KV_EINVAL);
    ck_assert_ptr_nonnull(strstr(kv_error_last(), "outside (0, 1]"));
    p->global.prune_budget = 0.0f;
    ck_assert_int_eq(kv_rt_open(&rt, p, &o), KV_EINVAL);
    p->global.prune_budget = 0.25f;
    p->layers[1].prune_budget = -0.5f;
    ck_assert_int_eq(kv_rt_open(&rt, p, &o), KV_EINVAL);
    ck_assert_ptr_nonnull(strstr(kv_error_last(), "layer 1"));
    p->layers[1].prune_budget = 0.0f;
    p->global.prune_pool = 4;
    ck_assert_int_eq(kv_rt_open(&rt, p, &o), KV_EINVAL);
    ck_assert_ptr_nonnull(strstr(kv_error_last(), "odd"));
    p->global.prune_pool = 5;
    p->global.prune_window = 0;
    ck_assert_int_eq(kv_rt_open(&rt, p, &o), KV_EINVAL);
    ck_assert_ptr_nonnull(strstr(kv_error_last(), "snapkv"));
    p->global.prune_window = 8;
    /* what pruning cannot be combined with: predictors, shared codes, RPC, HIGGS groups across heads */
    p->layers[1].stream[KV_PLAN_V].rpc_ratio = 0.2f;
    ck_assert_int_eq(kv_rt_open(&rt, p, &o), KV_EUNSUPPORTED);
    ck_assert_ptr_nonnull(strstr(kv_error_last(), "layer 1 V"));
    p->layers[1].stream[KV_PLAN_V].rpc_ratio = 0.0f;
    p->layers[1].stream[KV_PLAN_K].share_codes_with_layer = 0;
    ck_assert_int_eq(kv_rt_open(&rt, p, &o), KV_EUNSUPPORTED);
    ck_assert_ptr_nonnull(strstr(kv_error_last(), "XQuant"));
    p->layers[1].stream[KV_PLAN_K].share_codes_with_layer = -1;
    kv_plan_free(p);
    pcase hx = base;
    hx.k = (sspec)HG(64, 2, 16);
    p = make_pplan(&hx);
    ck_assert_int_eq(kv_rt_open(&rt, p, &o), KV_EUNSUPPORTED);
    ck_assert_ptr_nonnull(strstr(kv_error_last(), "span KV heads"));
    kv_plan_free(p);
    rcase aq = {"aqua", 2, 2, 2, 32, 4, 32, U(2, 32, CH), U(2, 32, CH), U(4, 32, CH), U(4, 32, CH), 1, 0, 0, 1, 0, 0, 0, 0, 0, NO_SQ};
    p = make_plan(&aq);
    p->global.prune_method = KV_PLAN_PRUNE_H2O, p->global.prune_budget = 0.5f;
    ck_assert_int_eq(kv_rt_open(&rt, p, &o), KV_EUNSUPPORTED);
    ck_assert_ptr_nonnull(strstr(kv_error_last(), "AQUA-KV"));
    kv_plan_free(p);
    /* a window larger than the prompt; a prompt appended without attending (nothing to score by) */
    p = make_pplan(&base);
    ck_assert_kv_ok(kv_rt_open(&rt, p, &o));
    float kv[32 * 64] = {0}, qo[32 * 128];
    for (int i = 0; i < 32 * 64; i++) kv[i] = (float)sin(i);
    for (int i = 0; i < 32 * 128; i++) qo[i] = (float)cos(i);
    int32_t pos[32];
    for (int i = 0; i < 32; i++) pos[i] = i;
    for (int l = 0; l < 2; l++) {
        ck_assert_kv_ok(kv_rt_append(rt, l, 0, 6, pos, kv, kv, kv, 64));
        ck_assert_kv_ok(kv_rt_attend(rt, l, 0, 6, qo, 128, qo + 6 * 128, 128));
    }
    ck_assert_int_eq(kv_rt_end_prompt(rt, 0), KV_EINVAL);
    ck_assert_ptr_nonnull(strstr(kv_error_last(), "larger than the prompt"));
    kv_rt_reset(rt, 0);
    for (int l = 0; l < 2; l++) {
        ck_assert_kv_ok(kv_rt_append(rt, l, 0, 20, pos, kv, kv, kv, 64));
        if (l == 0) ck_assert_kv_ok(kv_rt_attend(rt, l, 0, 20, qo, 128, qo, 128));
    }
    ck_assert_int_eq(kv_rt_end_prompt(rt, 0), KV_EINVAL);
    ck_assert_ptr_nonnull(strstr(kv_error_last(), "cannot score"));
    ck_assert_ptr_nonnull(strstr(kv_error_last(), "layer 1"));
    /* the first single-token step ends the prompt (and so fails the same way) */
    ck_assert_int_eq(kv_rt_append(rt, 0, 0, 1, pos + 20, kv, kv, kv, 64), KV_EINVAL);
    kv_rt_close(rt);
    kv_plan_free(p);
    /* H2O: rows attended twice */
    pcase h = base;
    h.method = H2O;
    p = make_pplan(&h);
    ck_assert_kv_ok(kv_rt_open(&rt, p, &o));
    for (int l = 0; l < 2; l++) {
        ck_assert_kv_ok(kv_rt_append(rt, l, 0, 20, pos, kv, kv, kv, 64));
        ck_assert_kv_ok(kv_rt_attend(rt, l, 0, 20, qo, 128, qo, 128));
        if (l == 1) ck_assert_kv_ok(kv_rt_attend(rt, l, 0, 4, qo, 128, qo, 128));
    }
    ck_assert_int_eq(kv_rt_end_prompt(rt, 0), KV_EINVAL);
    ck_assert_ptr_nonnull(strstr(kv_error_last(), "h2o"));
    /* after a clean prompt, query rows reaching back before it are refused */
    kv_rt_reset(rt, 0);
    for (int l = 0; l < 2; l++) {
        ck_assert_kv_ok(kv_rt_append(rt, l, 0, 20, pos, kv, kv, kv, 64));
        ck_assert_kv_ok(kv_rt_attend(rt, l, 0, 20, qo, 128, qo, 128));
    }
    ck_assert_kv_ok(kv_rt_end_prompt(rt, 0));
    ck_assert_kv_ok(kv_rt_append(rt, 0, 0, 1, pos + 20, kv, kv, kv, 64));
    ck_assert_int_eq(kv_rt_attend(rt, 0, 0, 2, qo, 128, qo, 128), KV_EINVAL);
    ck_assert_ptr_nonnull(strstr(kv_error_last(), "step's own tokens"));
    kv_rt_close(rt);
    kv_plan_free(p);
    free(freq);
}
END_TEST

/* What the runtime cannot serve is refused with its own message. */
START_TEST(test_refusals) {
    const rcase c = {"base", 2, 2, 2, 16, 4, 16, U(2, 16, TOK), U(2, 16, CH), F16, F16, 0, 1, 0, 0, 10, 5, 1, 0, 0, NO_SQ};
    kv_plan *p = make_plan(&c);
    double *freq = rope_freqs(16);
    kv_rt_options o;
    memset(&o, 0, sizeof o);
    o.n_seqs = 1, o.n_heads = 4, o.n_threads = 1, o.rope_inv_freq = freq;
    kv_rt *rt = NULL;
    /* pre-RoPE keys without the model's RoPE */
    o.rope_inv_freq = NULL;
    ck_assert_int_eq(kv_rt_open(&rt, p, &o), KV_EINVAL);
    ck_assert_ptr_null(rt);
    ck_assert_ptr_nonnull(strstr(kv_error_last(), "RoPE"));
    o.rope_inv_freq = freq;
    /* query heads not a multiple of the KV heads */
    o.n_heads = 3;
    ck_assert_int_eq(kv_rt_open(&rt, p, &o), KV_EINVAL);
    o.n_heads = 4;
    /* CUDA is not in this version */
    o.device = KV_RT_DEVICE_CUDA;
    ck_assert_int_eq(kv_rt_open(&rt, p, &o), KV_EUNSUPPORTED);
    o.device = KV_RT_DEVICE_CPU;
    /* shared codes with a recent pivotal context: chunks that need not align */
    p->layers[1].stream[KV_PLAN_K].share_codes_with_layer = 0;
    p->layers[1].stream[KV_PLAN_K].rpc_ratio = 0.2f;
    ck_assert_int_eq(kv_rt_open(&rt, p, &o), KV_EUNSUPPORTED);
    ck_assert_ptr_nonnull(strstr(kv_error_last(), "layer 1 K"));
    p->layers[1].stream[KV_PLAN_K].share_codes_with_layer = -1;
    p->layers[1].stream[KV_PLAN_K].rpc_ratio = 0.0f;
    /* a key group that does not divide the recent buffer */
    p->layers[0].stream[KV_PLAN_K].group_size = 12;
    ck_assert_int_eq(kv_rt_open(&rt, p, &o), KV_EFORMAT);
    p->layers[0].stream[KV_PLAN_K].group_size = 16;
    ck_assert_kv_ok(kv_rt_open(&rt, p, &o));
    float kv[8 * 32] = {0};
    int32_t pos[8] = {0, 1, 2, 3, 4, 5, 6, 7};
    /* positions must continue the sequence; k_pre is needed; capacity; query rows held */
    ck_assert_int_eq(kv_rt_append(rt, 0, 0, 2, pos + 1, kv, kv, kv, 32), KV_EINVAL);
    ck_assert_int_eq(kv_rt_append(rt, 0, 0, 2, pos, NULL, kv, kv, 32), KV_EINVAL);
    ck_assert_int_eq(kv_rt_append(rt, 0, 1, 2, pos, kv, kv, kv, 32), KV_EINVAL); /* no sequence 1 */
    ck_assert_kv_ok(kv_rt_append(rt, 0, 0, 2, pos, kv, kv, kv, 32));
    float qo[3 * 64];
    ck_assert_int_eq(kv_rt_attend(rt, 0, 0, 3, qo, 64, qo, 64), KV_EINVAL);
    kv_rt_close(rt);
    o.capacity = 4;
    ck_assert_kv_ok(kv_rt_open(&rt, p, &o));
    ck_assert_kv_ok(kv_rt_append(rt, 0, 0, 4, pos, kv, kv, kv, 32));
    ck_assert_int_eq(kv_rt_append(rt, 0, 0, 1, pos + 4, kv, kv, kv, 32), KV_EINVAL);
    kv_rt_close(rt);
    kv_plan_free(p);
    /* an AQUA plan whose layer 1 is appended before layer 0 compressed the same tokens */
    const rcase a = {"aqua", 2, 1, 1, 16, 0, 8, U(2, 8, CH), U(2, 8, CH), U(4, 8, CH), U(4, 8, CH), 1, 0, 0, 1, 10, 5, 1, 0, 0, NO_SQ};
    p = make_plan(&a);
    o.capacity = 0, o.n_heads = 1;
    ck_assert_kv_ok(kv_rt_open(&rt, p, &o));
    float kk[16 * 16] = {0};
    int32_t pp[16];
    for (int i = 0; i < 16; i++) pp[i] = i;
    ck_assert_kv_ok(kv_rt_append(rt, 1, 0, 8, pp, kk, kk, kk, 16));
    ck_assert_int_eq(kv_rt_append(rt, 1, 0, 1, pp + 8, kk, kk, kk, 16), KV_EINVAL);
    ck_assert_ptr_nonnull(strstr(kv_error_last(), "in order"));
    kv_rt_close(rt);
    kv_plan_free(p);
    free(freq);
}
END_TEST

/* SQuat plans the runtime cannot serve, each refused naming the layer and stream; the prompt
 * variant's working memory (the Gram matrices, then the sequence's encoders) is reported and released. */
static void squat_refused(kv_plan *p, kv_rt_options *o, kv_status want, const char *needle) {
    kv_rt *rt = NULL;
    ck_assert_int_eq(kv_rt_open(&rt, p, o), want);
    ck_assert_ptr_null(rt);
    ck_assert_msg(strstr(kv_error_last(), needle) && strstr(kv_error_last(), "layer 0 K"), "message: %s", kv_error_last());
}

START_TEST(test_squat_refusals) {
    const rcase c = {"sq", 1, 2, 2, 16, 0, 8, U(2, 8, TOK), U(2, 8, CH), F16, F16, 0, 0, 0, 0, 10, 5, 1, 0, 0,
                     SQ_PROMPT_BASIS, 4, 4, 1e-3f};
    kv_plan *p = make_plan(&c);
    double *freq = rope_freqs(16);
    kv_rt_options o;
    memset(&o, 0, sizeof o);
    o.n_seqs = 1, o.n_heads = 4, o.n_threads = 1, o.rope_inv_freq = freq;
    kv_plan_stream *ks = &p->layers[0].stream[KV_PLAN_K];
    ks->pre_rope = 1; /* keys before RoPE: the query subspace is after RoPE */
    squat_refused(p, &o, KV_EUNSUPPORTED, "after RoPE");
    ks->pre_rope = 0;
    ks->group_axis = KV_PLAN_GROUP_CHANNELS; /* per-token groups */
    squat_refused(p, &o, KV_EUNSUPPORTED, "along tokens");
    ks->group_axis = KV_PLAN_GROUP_TOKENS;
    ks->method = KV_PLAN_FP, ks->bits = 16, ks->group_size = 0; /* not a uniform stream */
    squat_refused(p, &o, KV_EUNSUPPORTED, "uniform keys");
    ks->method = KV_PLAN_UNIFORM, ks->bits = 2, ks->group_size = 8;
    p->global.prune_method = KV_PLAN_PRUNE_STREAMINGLLM, p->global.prune_budget = 0.5f;
    squat_refused(p, &o, KV_EUNSUPPORTED, "pruning");
    p->global.prune_method = KV_PLAN_PRUNE_NONE, p->global.prune_budget = 0.0f;
    ks->squat->static_subspace = 1;
    float *basis = ks->squat->basis;
    ks->squat->basis = NULL; /* static without a basis (the reader refuses it too) */
    squat_refused(p, &o, KV_EFORMAT, "without a basis");
    ks->squat->basis = basis;
    ks->squat->static_subspace = 0;
    /* the prompt variant: Gram matrices while the layer has not compressed, encoders after */
    kv_rt *rt = NULL;
    ck_assert_kv_ok(kv_rt_open(&rt, p, &o));
    float k[16 * 32], v[16 * 32], q[16 * 64], out[16 * 64];
    int32_t pos[16];
    for (int i = 0; i < 16; i++) pos[i] = i;
    fill_kv(k, v, 16, 32, 0, 0, 1);
    make_queries(q, &c, 16, 0, 0, 0);
    kv_rt_stats st;
    ck_assert_kv_ok(kv_rt_append(rt, 0, 0, 12, pos, k, k, v, 32));
    ck_assert_kv_ok(kv_rt_attend(rt, 0, 0, 12, q, 64, out, 64));
    ck_assert_kv_ok(kv_rt_get_stats(rt, 0, &st));
    ck_assert_uint_eq(st.working_bytes, 2u * 16u * 16u * sizeof(double)); /* two KV heads' Gram matrices */
    ck_assert_kv_ok(kv_rt_append(rt, 0, 0, 1, pos + 12, k, k, v, 32)); /* compresses 8 tokens: the subspace */
    ck_assert_kv_ok(kv_rt_get_stats(rt, 0, &st));
    ck_assert_uint_gt(st.working_bytes, 2u * 16u * 16u * sizeof(double)); /* two encoders: P_inv and the W_t */
    ck_assert_uint_lt(st.working_bytes, 2u * 16u * 16u * sizeof(double) + 4096u);
    kv_rt_reset(rt, 0);
    ck_assert_kv_ok(kv_rt_get_stats(rt, 0, &st));
    ck_assert_uint_eq(st.working_bytes, 0);
    kv_rt_close(rt);
    kv_plan_free(p);
    free(freq);
}
END_TEST

/* kv_rt_prompt_copy into a SQuat plan with the prompt subspace: the source's Gram matrices go with the
 * prompt, so the copy compresses as a runtime that attended the prompt itself (bits); a source that did
 * not accumulate them is refused. */
START_TEST(test_squat_prompt_copy) {
    const rcase c = {"sq copy", 2, 2, 3, 32, 4, 32, U(2, 32, TOK), U(2, 32, CH), F16, F16, 0, 0, 0, 0, 0, 0, 0, 0, 0,
                     SQ_PROMPT, 4, 8, 1e-4f};
    const int P = 100, hd = 32, kvd = 64, qd = 192;
    kv_plan *p = make_plan(&c);
    const rcase cf = {"f16", 2, 2, 3, 32, 4, 32, F16, F16, F16, F16, 0, 0, 0, 0, 0, 0, 0, 0, 0, NO_SQ};
    kv_plan *pf = make_plan(&cf);
    kv_rt_options o;
    memset(&o, 0, sizeof o);
    o.n_seqs = 1, o.n_heads = 6, o.n_threads = 1, o.prompt_stats = 1;
    float *k = malloc(sizeof(float) * P * kvd), *v = malloc(sizeof(float) * P * kvd), *q = malloc(sizeof(float) * P * qd);
    float *out = malloc(sizeof(float) * P * qd), *o1 = malloc(sizeof(float) * qd), *o2 = malloc(sizeof(float) * qd);
    float *K1 = malloc(sizeof(float) * (P + 1) * hd), *V1 = malloc(sizeof(float) * (P + 1) * hd);
    float *K2 = malloc(sizeof(float) * (P + 1) * hd), *V2 = malloc(sizeof(float) * (P + 1) * hd);
    int32_t pos[101];
    for (int i = 0; i <= P; i++) pos[i] = i;
    kv_rt *src = NULL, *own = NULL, *cp = NULL, *fsrc = NULL;
    ck_assert_kv_ok(kv_rt_open(&src, p, &o));
    ck_assert_kv_ok(kv_rt_open(&own, p, &o));
    ck_assert_kv_ok(kv_rt_open(&cp, p, &o));
    ck_assert_kv_ok(kv_rt_open(&fsrc, pf, &o));
    for (int l = 0; l < 2; l++) {
        fill_kv(k, v, P, kvd, l, 0, 9);
        make_queries(q, &c, P, 0, l, 0);
        kv_rt *rs[3] = {src, own, fsrc};
        for (int i = 0; i < 3; i++) {
            ck_assert_kv_ok(kv_rt_append(rs[i], l, 0, P, pos, k, k, v, kvd));
            ck_assert_kv_ok(kv_rt_attend(rs[i], l, 0, P, q, qd, out, qd));
        }
    }
    ck_assert_int_eq(kv_rt_prompt_copy(cp, 0, fsrc, 0), KV_EINVAL); /* no Gram matrices in an f16 source */
    ck_assert_ptr_nonnull(strstr(kv_error_last(), "SQuat"));
    ck_assert_kv_ok(kv_rt_prompt_copy(cp, 0, src, 0));
    ck_assert_kv_ok(kv_rt_end_prompt(own, 0));
    ck_assert_kv_ok(kv_rt_end_prompt(cp, 0));
    for (int l = 0; l < 2; l++) { /* the next token: the prompt is compressed with its own subspace */
        fill_kv(k, v, 1, kvd, l, P, 9);
        make_queries(q, &c, 1, P, l, 0);
        ck_assert_kv_ok(kv_rt_append(own, l, 0, 1, pos + P, k, k, v, kvd));
        ck_assert_kv_ok(kv_rt_append(cp, l, 0, 1, pos + P, k, k, v, kvd));
        ck_assert_kv_ok(kv_rt_attend(own, l, 0, 1, q, qd, o1, qd));
        ck_assert_kv_ok(kv_rt_attend(cp, l, 0, 1, q, qd, o2, qd));
        ck_assert_int_eq(memcmp(o1, o2, sizeof(float) * qd), 0);
        for (int h = 0; h < 2; h++) {
            ck_assert_kv_ok(kv_rt_decode_head(own, l, 0, h, K1, V1));
            ck_assert_kv_ok(kv_rt_decode_head(cp, l, 0, h, K2, V2));
            ck_assert_int_eq(memcmp(K1, K2, sizeof(float) * (P + 1) * hd), 0);
            ck_assert_int_eq(memcmp(V1, V2, sizeof(float) * (P + 1) * hd), 0);
        }
    }
    kv_rt_stats st;
    ck_assert_kv_ok(kv_rt_get_stats(cp, 0, &st));
    ck_assert_uint_gt(st.values_compressed, 0);
    kv_rt_close(src), kv_rt_close(own), kv_rt_close(cp), kv_rt_close(fsrc);
    kv_plan_free(p), kv_plan_free(pf);
    free(k), free(v), free(q), free(out), free(o1), free(o2), free(K1), free(V1), free(K2), free(V2);
}
END_TEST

#ifdef KV_TEST_CUDA
/* The device under test: the GPU, or with KV_TEST_FAKE_GPU=1 the host model again (to run this harness's own
 * logic where there is no GPU). */
static kv_rt_device g_gpu = KV_RT_DEVICE_CUDA;

/* A case on the GPU: within the bound and the replay like every device, and the same bits as the host model (the
 * kernels run the host model's code: kv_attn_math.h), for every attention output of the run. */
static void cuda_vs_model(const rcase *c, int n_seqs) {
    g_log_on = 1;
    g_log_n = 0;
    g_device = KV_RT_DEVICE_CUDA_MODEL;
    run_case(c, n_seqs, 1);
    const size_t n = g_log_n;
    float *ref = malloc(n * sizeof(float));
    ck_assert_ptr_nonnull(ref);
    memcpy(ref, g_log, n * sizeof(float));
    g_log_n = 0;
    g_device = g_gpu;
    const double w = run_case(c, n_seqs, 1);
    g_device = KV_RT_DEVICE_CPU;
    g_log_on = 0;
    ck_assert_uint_eq(g_log_n, n);
    size_t differ = 0, first = n;
    double worst = 0;
    for (size_t i = 0; i < n; i++)
        if (memcmp(&ref[i], &g_log[i], sizeof(float)) != 0) {
            if (!differ) first = i;
            differ++;
            worst = fmax(worst, fabs((double)ref[i] - g_log[i]) / fmax(fabs((double)ref[i]), 1e-30));
        }
    printf("%-34s gpu: worst error / bound %.3g; %zu of %zu outputs differ from the host model", c->name, w, differ, n);
    if (differ) printf(" (first at %zu: %.9g vs %.9g, largest relative %.3g)", first, ref[first], g_log[first], worst);
    printf("\n");
    fflush(stdout);
    free(ref);
    /* AQUA-KV's predictions come from cuBLAS on the GPU and the BLAS on the host model: the bound and the replay
     * (run_case) hold the GPU to account there, not the host model's bits */
    if (!c->aqua) ck_assert_msg(differ == 0, "%s: %zu of %zu GPU outputs are not the host model's bits", c->name, differ, n);
}

/* KV_CUDA_CASES=name,name: only those cases (and not the long ones or the self-check): compute-sanitizer's racecheck
 * is slow. KV_CUDA_QUICK=1: every 4th case (memcheck). */
static int case_selected(const char *name) {
    const char *list = getenv("KV_CUDA_CASES");
    if (!list) return 1;
    const size_t n = strlen(name);
    for (const char *p = list; (p = strstr(p, name)) != NULL; p += n)
        if ((p == list || p[-1] == ',') && (p[n] == ',' || p[n] == '\0')) return 1;
    return 0;
}

START_TEST(test_cuda_cases) {
    const rcase *c = &k_cases[_i];
    if (getenv("KV_CUDA_TINY")) return;
    if (strstr(c->name, "across heads") && c->k.method == KV_PLAN_HIGGS) return; /* refused on devices (test_device_model) */
    if (getenv("KV_CUDA_QUICK") && _i % 4) return; /* under compute-sanitizer: every 4th case */
    if (!case_selected(c->name)) return;
    cuda_vs_model(c, 2);
}
END_TEST

/* KV_CUDA_TINY=1 (compute-sanitizer's racecheck, which follows every shared-memory access): a few short cases
 * through every phase of the attention (prefill rows, decoding, a compressed block, pre-RoPE HIGGS, HIGGS values
 * in the rotated domain, f16 rows) and nothing else. */
START_TEST(test_cuda_tiny) {
    if (!getenv("KV_CUDA_TINY")) return;
    const rcase c1 = {"tiny kivi-2", 1, 2, 3, 64, 4, 32, U(2, 32, TOK), U(2, 32, CH), F16, F16, 0, 0, 0, 0, 80, 40, 20, 1, 0, NO_SQ};
    const rcase c2 = {"tiny higgs pre-rope", 1, 1, 2, 64, 4, 32, HG(0, 2, 16), HG(0, 2, 16), F16, F16, 0, 1, 0, 0, 76, 40, 12,
                      1, 0, NO_SQ};
    cuda_vs_model(&c1, 1);
    cuda_vs_model(&c2, 1);
}
END_TEST

START_TEST(test_cuda_long) {
    if (getenv("KV_CUDA_CASES") || getenv("KV_CUDA_QUICK") || getenv("KV_CUDA_TINY")) return;
    const rcase c1 = {"gpu long kivi-2", 1, 2, 3, 64, 4, 128, U(2, 32, TOK), U(2, 32, CH), F16, F16, 0, 0, 0, 0, 2700,
                      2690, 1, 0, 0, NO_SQ};
    const rcase c2 = {"gpu long higgs pre-rope", 2, 1, 3, 64, 4, 128, HG(0, 2, 16), HG(0, 2, 16), F16, F16, 0, 1, 0, 0,
                      1500, 600, 1, 0, 0, NO_SQ};
    const rcase c3 = {"gpu long aqua", 3, 3, 3, 64, 4, 128, U(2, 32, CH), HG(0, 2, 16), HG(0, 2, 256), HG(0, 2, 256), 1, 1,
                      0, 1, 1200, 900, 1, 0, 0, NO_SQ};
    cuda_vs_model(&c1, 1);
    cuda_vs_model(&c2, 1);
    cuda_vs_model(&c3, 1);
}
END_TEST

/* The self-check on the GPU for every catalogue entry (what kv_rt_open runs), with its cost. */
START_TEST(test_cuda_selfcheck) {
    if (getenv("KV_CUDA_CASES") || getenv("KV_CUDA_QUICK") || getenv("KV_CUDA_TINY")) return;
    double freq[32];
    for (int i = 0; i < 32; i++) freq[i] = pow(10000.0, -2.0 * i / 64);
    kv_rt_options o;
    memset(&o, 0, sizeof o);
    o.device = g_gpu, o.n_seqs = 1, o.n_heads = 9, o.rope_inv_freq = freq;
    int failed = 0;
    for (int i = 0; i < kv_rt_selfcheck_catalog_size(); i++) {
        kv_plan *p = NULL;
        const char *name = NULL;
        ck_assert_kv_ok(kv_rt_selfcheck_catalog(i, &p, &name));
        kv_rt_check rep;
        const kv_status s = kv_rt_selfcheck(p, &o, &rep);
        printf("gpu selfcheck %-32s %s worst/bound %.3g, %llu of %llu cache values differ (%.2g), %.3f s%s%s\n", name,
               s == KV_OK ? "ok  " : "FAIL", rep.worst_ratio, (unsigned long long)rep.values_differing,
               (unsigned long long)rep.values_compared, rep.max_recon_rel, rep.seconds, s == KV_OK ? "" : ": ",
               s == KV_OK ? "" : kv_error_last());
        fflush(stdout);
        failed += s != KV_OK;
        kv_plan_free(p);
    }
    ck_assert_int_eq(failed, 0);
}
END_TEST

int main(void) {
    if (getenv("KV_TEST_FAKE_GPU")) {
        g_gpu = KV_RT_DEVICE_CUDA_MODEL;
    } else if (!kv_cuda_available()) {
        printf("test_runtime_cuda: no usable CUDA device, skipping\n");
        return 77;
    }
    Suite *s = suite_create("runtime_cuda");
    TCase *tc = tcase_create("gpu");
    tcase_set_timeout(tc, 1800);
    tcase_add_loop_test(tc, test_cuda_cases, 0, (int)(sizeof k_cases / sizeof k_cases[0]));
    tcase_add_test(tc, test_cuda_long);
    tcase_add_test(tc, test_cuda_tiny);
    tcase_add_test(tc, test_cuda_selfcheck);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_set_fork_status(sr, CK_NOFORK); /* CUDA must not be used across fork */
    srunner_run_all(sr, CK_NORMAL);
    const int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    free(g_log);
    return failed == 0 ? 0 : 1;
}
#else
/* Three test cases, each its own CTest test (CK_RUN_CASE, tests/runtime/CMakeLists.txt), so that they run side by
 * side and each has its own time limit: the CPU paths against exact attention, the device model, the rest. */
int main(void) {
    Suite *s = suite_create("runtime");
    TCase *tc = tcase_create("exact");
    tcase_set_timeout(tc, 900);
    tcase_add_loop_test(tc, test_attention_matches_exact, 0, 2 * (int)(sizeof k_cases / sizeof k_cases[0]));
    tcase_add_loop_test(tc, test_long_sequences, 0, 2);
    suite_add_tcase(s, tc);
    tc = tcase_create("device");
    tcase_set_timeout(tc, 900);
    tcase_add_loop_test(tc, test_device_model, 0, (int)(sizeof k_cases / sizeof k_cases[0]));
    tcase_add_test(tc, test_device_model_long);
    tcase_add_test(tc, test_batch_calls);
    tcase_add_test(tc, test_selfcheck);
    suite_add_tcase(s, tc);
    tc = tcase_create("rest");
    tcase_set_timeout(tc, 900);
    tcase_add_loop_test(tc, test_exp, 0, 2);
    tcase_add_test(tc, test_shift_by_max);
    tcase_add_test(tc, test_threads_agree);
    tcase_add_test(tc, test_keep_reconstructions);
    tcase_add_test(tc, test_refusals);
    tcase_add_test(tc, test_squat_refusals);
    tcase_add_test(tc, test_squat_prompt_copy);
    tcase_add_loop_test(tc, test_pruning, 0, 2 * (int)(sizeof k_pcases / sizeof k_pcases[0]));
    tcase_add_test(tc, test_prompt_copy);
    tcase_add_test(tc, test_pruning_refusals);
    suite_add_tcase(s, tc);
    return kv_test_run(s);
}
#endif
