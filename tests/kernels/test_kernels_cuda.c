/* CPU-vs-GPU harness for kernels/: every op on both sides over a table of shapes (odd sizes,
 * sizes not a multiple of the group, zero). Integer codes must match exactly; floats by normalized
 * MSE with a tolerance derived from the format; guard bytes around every device output; non-finite
 * inputs fail on both sides. Without a usable GPU the binary exits 77 (CTest: skipped).
 * Runs with CK_NOFORK: CUDA is initialized in main() before the tests, and a forked child must not
 * use the parent's CUDA context. */
#include "kv_test.h"
#include "kv_quant_math.h"
#include "kvrt.h"

#include <cuda_runtime_api.h>
#include <float.h>
#include <math.h>

#define GUARD 256
#define GUARD_BYTE 0xA5

/* Tolerances. CPU and GPU evaluate the same KV_HD expressions without FMA contraction, so decoded
 * floats are expected to be bit-identical; the bound still allows a few f32 ulps per value
 * (NMSE <= (4 eps)^2) in case a libdevice/libm function differs in the last place. Scores are sums
 * over C terms: (4 eps sqrt(C))^2 relative. Float SVD (cuSOLVER) vs double (LAPACK): relative
 * accuracy ~1e-5 on Qh^T Qh, NMSE <= 1e-8. */
static double nmse_tol_f32(void) { return 16.0 * (double)FLT_EPSILON * (double)FLT_EPSILON; }

static void *dev_alloc(size_t bytes) {
    uint8_t *p = NULL;
    ck_assert_int_eq(cudaMalloc((void **)&p, bytes + 2 * GUARD), cudaSuccess);
    ck_assert_int_eq(cudaMemset(p, GUARD_BYTE, bytes + 2 * GUARD), cudaSuccess);
    return p + GUARD;
}
static void dev_check_guard(void *d, size_t bytes) {
    uint8_t g[GUARD];
    uint8_t *base = (uint8_t *)d - GUARD;
    ck_assert_int_eq(cudaMemcpy(g, base, GUARD, cudaMemcpyDeviceToHost), cudaSuccess);
    for (int i = 0; i < GUARD; i++) ck_assert_msg(g[i] == GUARD_BYTE, "guard before output overwritten");
    ck_assert_int_eq(cudaMemcpy(g, base + GUARD + bytes, GUARD, cudaMemcpyDeviceToHost), cudaSuccess);
    for (int i = 0; i < GUARD; i++) ck_assert_msg(g[i] == GUARD_BYTE, "guard after output overwritten");
}
static void dev_free(void *d) {
    if (d) cudaFree((uint8_t *)d - GUARD);
}
static void *to_dev(const void *h, size_t bytes) {
    void *d = dev_alloc(bytes);
    if (bytes) ck_assert_int_eq(cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice), cudaSuccess);
    return d;
}
static void *to_host(const void *d, size_t bytes) {
    void *h = malloc(bytes ? bytes : 1);
    if (bytes) ck_assert_int_eq(cudaMemcpy(h, d, bytes, cudaMemcpyDeviceToHost), cudaSuccess);
    return h;
}

static double nmse(const float *a, const float *b, size_t n) {
    double e = 0.0, r = 0.0;
    for (size_t i = 0; i < n; i++) {
        ck_assert_msg(isnan(a[i]) == isnan(b[i]) && isinf(a[i]) == isinf(b[i]), "NaN/Inf differ at %zu", i);
        if (!isfinite(a[i])) continue;
        e += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
        r += (double)a[i] * a[i];
    }
    return r > 0.0 ? e / r : e;
}

static float *randn(size_t n, uint64_t seed, float scale, float shift) {
    float *x = malloc((n ? n : 1) * sizeof *x);
    kv_rng r;
    kv_rng_init(&r, seed);
    for (size_t i = 0; i < n; i++) x[i] = (float)kv_rng_next_normal(&r) * scale + shift;
    return x;
}

/* ---- packing --------------------------------------------------------------------------------- */
START_TEST(gpu_pack_every_width) {
    const size_t n = 1001;
    for (int wi = 0; wi < 9; wi++) {
        const int bits = wi < 8 ? wi + 1 : 3, pack11 = wi == 8;
        uint8_t *c = malloc(n);
        kv_rng r;
        kv_rng_init(&r, (uint64_t)wi);
        for (size_t j = 0; j < n; j++) c[j] = (uint8_t)(kv_rng_next_u64(&r) % ((pack11 && j % 11 == 10) ? 4u : (1u << bits)));
        const size_t nw = kv_pack_words(n, bits, pack11);
        uint32_t *w = malloc(nw * 4);
        ck_assert_kv_ok(kv_pack_ref(w, c, n, bits, pack11));
        uint8_t *dc = to_dev(c, n);
        uint32_t *dw = dev_alloc(nw * 4);
        ck_assert_kv_ok(kv_pack_cuda(dw, dc, n, bits, pack11, NULL));
        uint32_t *hw = to_host(dw, nw * 4);
        ck_assert_int_eq(memcmp(w, hw, nw * 4), 0);
        dev_check_guard(dw, nw * 4);
        dev_free(dc);
        dev_free(dw);
        free(c);
        free(w);
        free(hw);
    }
}
END_TEST

/* ---- uniform ------------------------------------------------------------------------------------ */
typedef struct u_case {
    int bits, group, axis, pack11, ptype;
    float eta;
    size_t tokens, channels;
} u_case;
static const u_case k_u[] = {
    {1, 32, KV_AXIS_TOKENS, 0, KV_PARAM_F32, 0.0f, 77, 13},   {2, 32, KV_AXIS_TOKENS, 0, KV_PARAM_F16, 0.05f, 130, 64},
    {3, 16, KV_AXIS_TOKENS, 1, KV_PARAM_F32, 0.0f, 35, 9},    {3, 16, KV_AXIS_TOKENS, 0, KV_PARAM_F32, 0.1f, 35, 9},
    {4, 64, KV_AXIS_TOKENS, 0, KV_PARAM_F16, 0.0f, 1, 7},     {8, 5, KV_AXIS_TOKENS, 0, KV_PARAM_F32, 0.0f, 11, 3},
    {1, 32, KV_AXIS_CHANNELS, 0, KV_PARAM_F32, 0.2f, 5, 70},  {2, 64, KV_AXIS_CHANNELS, 0, KV_PARAM_F16, 0.0f, 9, 64},
    {3, 24, KV_AXIS_CHANNELS, 1, KV_PARAM_F32, 0.0f, 4, 53},  {4, 128, KV_AXIS_CHANNELS, 0, KV_PARAM_F32, 0.0f, 300, 100},
    {8, 16, KV_AXIS_CHANNELS, 0, KV_PARAM_F16, 0.0f, 6, 33},  {2, 32, KV_AXIS_TOKENS, 0, KV_PARAM_F32, 0.0f, 0, 8},
    {2, 32, KV_AXIS_CHANNELS, 0, KV_PARAM_F32, 0.0f, 4, 0},   {2, 32, KV_AXIS_TOKENS, 0, KV_PARAM_F32, 0.0f, 1000, 128},
};

START_TEST(gpu_uniform_matches_cpu) {
    const u_case *k = &k_u[_i];
    const kv_uniform q = {.bits = k->bits, .group = k->group, .axis = (kv_axis)k->axis,
                          .param_type = (kv_param_type)k->ptype, .pack11 = k->pack11, .eta = k->eta};
    const kv_quant qd = {.kind = KV_QUANT_UNIFORM, .uniform = q};
    kv_block_storage bs;
    ck_assert_kv_ok(kv_quant_storage(&bs, &qd, k->tokens, k->channels));
    const size_t n = bs.values;
    float *x = randn(n, 500 + (uint64_t)_i, 2.0f, 0.3f);
    /* CPU */
    uint32_t *w = malloc(bs.code_bytes + 4);
    uint8_t *sc = malloc(bs.scale_bytes + 4), *zr = malloc(bs.zero_bytes + 4);
    float *y = malloc((n + 1) * 4), *qv = randn(k->channels, 9, 1.0f, 0.0f), *scores = malloc((k->tokens + 1) * 4);
    ck_assert_kv_ok(kv_uniform_encode_ref(w, sc, zr, &q, k->tokens, k->channels, x));
    ck_assert_kv_ok(kv_uniform_decode_ref(y, &q, k->tokens, k->channels, w, sc, zr));
    ck_assert_kv_ok(kv_uniform_scores_ref(scores, &q, k->tokens, k->channels, w, sc, zr, qv));
    /* GPU */
    float *dx = to_dev(x, n * 4), *dq = to_dev(qv, k->channels * 4);
    uint32_t *dw = dev_alloc(bs.code_bytes);
    void *ds = dev_alloc(bs.scale_bytes), *dz = dev_alloc(bs.zero_bytes);
    float *dy = dev_alloc(n * 4), *dsc = dev_alloc(k->tokens * 4);
    ck_assert_kv_ok(kv_uniform_encode_cuda(dw, ds, dz, &q, k->tokens, k->channels, dx, NULL));
    uint32_t *hw = to_host(dw, bs.code_bytes);
    uint8_t *hs = to_host(ds, bs.scale_bytes), *hz = to_host(dz, bs.zero_bytes);
    ck_assert_msg(memcmp(w, hw, bs.code_bytes) == 0, "codes differ");
    ck_assert_msg(memcmp(sc, hs, bs.scale_bytes) == 0, "scales differ");
    ck_assert_msg(memcmp(zr, hz, bs.zero_bytes) == 0, "zero points differ");
    /* decode the CPU's codes on the GPU */
    uint32_t *dw2 = to_dev(w, bs.code_bytes);
    ck_assert_kv_ok(kv_uniform_decode_cuda(dy, &q, k->tokens, k->channels, dw2, ds, dz, NULL));
    ck_assert_kv_ok(kv_uniform_scores_cuda(dsc, &q, k->tokens, k->channels, dw2, ds, dz, dq, NULL));
    float *hy = to_host(dy, n * 4), *hsc = to_host(dsc, k->tokens * 4);
    ck_assert_double_le(nmse(y, hy, n), nmse_tol_f32());
    ck_assert_double_le(nmse(scores, hsc, k->tokens), nmse_tol_f32() * (double)(k->channels + 1));
    /* shared codes: parameters only */
    ck_assert_kv_ok(kv_uniform_encode_cuda(NULL, ds, dz, &q, k->tokens, k->channels, dx, NULL));
    dev_check_guard(dw, bs.code_bytes);
    dev_check_guard(ds, bs.scale_bytes);
    dev_check_guard(dz, bs.zero_bytes);
    dev_check_guard(dy, n * 4);
    dev_check_guard(dsc, k->tokens * 4);
    /* a NaN fails on both sides */
    if (n) {
        x[n / 2] = NAN;
        ck_assert_int_eq(kv_uniform_encode_ref(w, sc, zr, &q, k->tokens, k->channels, x), KV_ENUMERIC);
        ck_assert_int_eq(cudaMemcpy(dx, x, n * 4, cudaMemcpyHostToDevice), cudaSuccess);
        ck_assert_int_eq(kv_uniform_encode_cuda(dw, ds, dz, &q, k->tokens, k->channels, dx, NULL), KV_ENUMERIC);
    }
    dev_free(dx);
    dev_free(dq);
    dev_free(dw);
    dev_free(dw2);
    dev_free(ds);
    dev_free(dz);
    dev_free(dy);
    dev_free(dsc);
    free(x);
    free(w);
    free(sc);
    free(zr);
    free(y);
    free(qv);
    free(scores);
    free(hw);
    free(hs);
    free(hz);
    free(hy);
    free(hsc);
}
END_TEST

/* ---- HIGGS ------------------------------------------------------------------------------------- */
typedef struct h_case {
    int d, n, group, ntype;
    size_t tokens, channels;
} h_case;
static const h_case k_h[] = {
    {2, 16, 64, KV_PARAM_F32, 33, 192}, {2, 256, 128, KV_PARAM_F16, 7, 128}, {1, 4, 32, KV_PARAM_F32, 5, 96},
    {4, 16, 64, KV_PARAM_F32, 3, 64},   {8, 256, 1024, KV_PARAM_F32, 2, 2048}, {2, 64, 8, KV_PARAM_F16, 101, 24},
    {2, 16, 64, KV_PARAM_F32, 0, 64},
};

START_TEST(gpu_higgs_matches_cpu) {
    const h_case *k = &k_h[_i];
    float *grid = randn((size_t)k->n * (size_t)k->d, 700 + (uint64_t)_i, 1.0f, 0.0f);
    kv_higgs h = {.dim = k->d, .size = k->n, .group = k->group, .norm_type = (kv_param_type)k->ntype,
                  .seed = 1234 + (uint64_t)_i, .grid = grid};
    const kv_quant qd = {.kind = KV_QUANT_HIGGS, .higgs = h};
    kv_block_storage bs;
    ck_assert_kv_ok(kv_quant_storage(&bs, &qd, k->tokens, k->channels));
    const size_t n = bs.values;
    float *x = randn(n, 800 + (uint64_t)_i, 1.5f, 0.0f);
    if (n) memset(x, 0, (size_t)k->group * sizeof *x); /* an all-zero group */
    uint32_t *w = malloc(bs.code_bytes + 4);
    uint8_t *nr = malloc(bs.norm_bytes + 4);
    float *y = malloc((n + 1) * 4), *qv = randn(k->channels, 4, 1.0f, 0.0f), *scores = malloc((k->tokens + 1) * 4);
    ck_assert_kv_ok(kv_higgs_encode_ref(w, nr, &h, k->tokens, k->channels, x));
    ck_assert_kv_ok(kv_higgs_decode_ref(y, &h, k->tokens, k->channels, w, nr));
    ck_assert_kv_ok(kv_higgs_scores_ref(scores, &h, k->tokens, k->channels, w, nr, qv));
    float *dgrid = to_dev(grid, (size_t)k->n * (size_t)k->d * 4), *dx = to_dev(x, n * 4), *dq = to_dev(qv, k->channels * 4);
    kv_higgs hd = h;
    hd.grid = dgrid;
    uint32_t *dw = dev_alloc(bs.code_bytes);
    void *dn = dev_alloc(bs.norm_bytes);
    float *dy = dev_alloc(n * 4), *dsc = dev_alloc(k->tokens * 4);
    ck_assert_kv_ok(kv_higgs_encode_cuda(dw, dn, &hd, k->tokens, k->channels, dx, NULL));
    uint32_t *hw = to_host(dw, bs.code_bytes);
    uint8_t *hn = to_host(dn, bs.norm_bytes);
    ck_assert_msg(memcmp(w, hw, bs.code_bytes) == 0, "indices differ");
    ck_assert_msg(memcmp(nr, hn, bs.norm_bytes) == 0, "norms differ");
    ck_assert_kv_ok(kv_higgs_decode_cuda(dy, &hd, k->tokens, k->channels, dw, dn, NULL));
    ck_assert_kv_ok(kv_higgs_scores_cuda(dsc, &hd, k->tokens, k->channels, dw, dn, dq, NULL));
    float *hy = to_host(dy, n * 4), *hsc = to_host(dsc, k->tokens * 4);
    ck_assert_double_le(nmse(y, hy, n), nmse_tol_f32());
    ck_assert_double_le(nmse(scores, hsc, k->tokens), nmse_tol_f32() * (double)(k->channels + 1));
    dev_check_guard(dw, bs.code_bytes);
    dev_check_guard(dn, bs.norm_bytes);
    dev_check_guard(dy, n * 4);
    dev_check_guard(dsc, k->tokens * 4);
    if (n) {
        x[n - 1] = INFINITY;
        ck_assert_int_eq(kv_higgs_encode_ref(w, nr, &h, k->tokens, k->channels, x), KV_ENUMERIC);
        ck_assert_int_eq(cudaMemcpy(dx, x, n * 4, cudaMemcpyHostToDevice), cudaSuccess);
        ck_assert_int_eq(kv_higgs_encode_cuda(dw, dn, &hd, k->tokens, k->channels, dx, NULL), KV_ENUMERIC);
    }
    dev_free(dgrid);
    dev_free(dx);
    dev_free(dq);
    dev_free(dw);
    dev_free(dn);
    dev_free(dy);
    dev_free(dsc);
    free(grid);
    free(x);
    free(w);
    free(nr);
    free(y);
    free(qv);
    free(scores);
    free(hw);
    free(hn);
    free(hy);
    free(hsc);
}
END_TEST

/* ---- SQuat ------------------------------------------------------------------------------------- */
typedef struct s_case {
    int d, r, block, group, bits, ptype;
    size_t tokens, nq;
    float lambda;
} s_case;
static const s_case k_s[] = {
    {64, 5, 16, 32, 2, KV_PARAM_F32, 100, 200, 0.05f}, {40, 4, 16, 32, 2, KV_PARAM_F16, 45, 30, 0.5f},
    {128, 5, 64, 128, 2, KV_PARAM_F16, 300, 500, 0.001f}, {13, 2, 5, 7, 3, KV_PARAM_F32, 20, 9, 1.0f},
    {64, 5, 16, 32, 4, KV_PARAM_F32, 0, 100, 0.1f},
};

START_TEST(gpu_squat_matches_cpu) {
    const s_case *k = &k_s[_i];
    const int d = k->d;
    float *qs = randn(k->nq * (size_t)d, 900 + (uint64_t)_i, 1.0f, 0.0f);
    float *qh = malloc((size_t)k->r * (size_t)d * 4);
    ck_assert_kv_ok(kv_squat_subspace_ref(qh, qs, k->nq, d, k->r));
    /* subspace on the GPU: compare the sign-free Qh^T Qh */
    float *dqs = to_dev(qs, k->nq * (size_t)d * 4), *dqh = dev_alloc((size_t)k->r * (size_t)d * 4);
    ck_assert_kv_ok(kv_squat_subspace_cuda(dqh, dqs, k->nq, d, k->r, NULL));
    dev_check_guard(dqh, (size_t)k->r * (size_t)d * 4);
    float *gqh = to_host(dqh, (size_t)k->r * (size_t)d * 4);
    float *ga = malloc((size_t)d * (size_t)d * 4), *gb = malloc((size_t)d * (size_t)d * 4);
    for (int i = 0; i < d; i++)
        for (int j = 0; j < d; j++) {
            double a = 0.0, b = 0.0;
            for (int m = 0; m < k->r; m++) {
                a += (double)qh[m * d + i] * qh[m * d + j];
                b += (double)gqh[m * d + i] * gqh[m * d + j];
            }
            ga[i * d + j] = (float)a;
            gb[i * d + j] = (float)b;
        }
    ck_assert_double_le(nmse(ga, gb, (size_t)d * (size_t)d), 1e-8);
    /* key quantization with the CPU's subspace on both sides */
    kv_squat *s = NULL;
    ck_assert_kv_ok(kv_squat_create(&s, qh, k->r, d, k->lambda, k->block));
    const kv_uniform u = {.bits = k->bits, .group = k->group, .axis = KV_AXIS_TOKENS, .param_type = (kv_param_type)k->ptype};
    const kv_quant qd = {.kind = KV_QUANT_UNIFORM, .uniform = u};
    kv_block_storage bs;
    ck_assert_kv_ok(kv_quant_storage(&bs, &qd, k->tokens, (size_t)d));
    const size_t n = bs.values;
    float *x = randn(n, 950 + (uint64_t)_i, 1.0f, 0.0f);
    uint32_t *w = malloc(bs.code_bytes + 4);
    uint8_t *sc = malloc(bs.scale_bytes + 4), *zr = malloc(bs.zero_bytes + 4);
    ck_assert_kv_ok(kv_squat_encode_ref(w, sc, zr, s, &u, k->tokens, x));
    float *dx = to_dev(x, n * 4);
    uint32_t *dw = dev_alloc(bs.code_bytes);
    void *ds = dev_alloc(bs.scale_bytes), *dz = dev_alloc(bs.zero_bytes);
    ck_assert_kv_ok(kv_squat_encode_cuda(dw, ds, dz, s, &u, k->tokens, dx, NULL));
    uint32_t *hw = to_host(dw, bs.code_bytes);
    uint8_t *hs = to_host(ds, bs.scale_bytes), *hz = to_host(dz, bs.zero_bytes);
    ck_assert_msg(memcmp(w, hw, bs.code_bytes) == 0, "codes differ");
    ck_assert_msg(memcmp(sc, hs, bs.scale_bytes) == 0, "scales differ");
    ck_assert_msg(memcmp(zr, hz, bs.zero_bytes) == 0, "zero points differ");
    dev_check_guard(dw, bs.code_bytes);
    dev_check_guard(ds, bs.scale_bytes);
    dev_check_guard(dz, bs.zero_bytes);
    kv_squat_free(s);
    dev_free(dqs);
    dev_free(dqh);
    dev_free(dx);
    dev_free(dw);
    dev_free(ds);
    dev_free(dz);
    free(qs);
    free(qh);
    free(gqh);
    free(ga);
    free(gb);
    free(x);
    free(w);
    free(sc);
    free(zr);
    free(hw);
    free(hs);
    free(hz);
}
END_TEST

/* ---- FP8 / NVFP4 ------------------------------------------------------------------------------------ */
typedef struct f_case {
    int format;
    size_t tokens, channels;
    int scale_channels; /* 0: one scale per tensor */
    float spread;       /* input standard deviation (large: saturation at small scales) */
} f_case;
static const f_case k_f[] = {
    {KV_FP_E4M3, 77, 13, 0, 1.0f},    {KV_FP_E4M3, 130, 64, 32, 3.0f}, {KV_FP_E4M3, 1, 1, 0, 1e4f},
    {KV_FP_E5M2, 9, 53, 0, 100.0f},   {KV_FP_E5M2, 40, 48, 16, 1.0f},  {KV_FP_NVFP4, 5, 7, 0, 1.0f},
    {KV_FP_NVFP4, 300, 64, 32, 2.0f}, {KV_FP_NVFP4, 33, 40, 0, 50.0f}, {KV_FP_NVFP4, 0, 16, 0, 1.0f},
    {KV_FP_E4M3, 3, 0, 0, 1.0f},
};

/* Codes and block scales exactly equal; decoded values bit-identical (the same KV_HD expressions);
 * also every FP8 code's value through the conversion (the GPU encodes the full table). */
START_TEST(gpu_fpq_matches_cpu) {
    const f_case *k = &k_f[_i];
    const int ns = k->scale_channels ? (int)(k->channels / (size_t)k->scale_channels) : 1;
    float scales[8];
    for (int i = 0; i < ns; i++) scales[i] = 0.05f * (float)(i + 1) * (k->spread > 10.0f ? 0.01f : 1.0f);
    float *dsc = to_dev(scales, (size_t)ns * 4);
    const kv_fpq qh = {.format = (kv_fp_format)k->format, .n_scales = ns, .scale_channels = k->scale_channels, .scales = scales};
    kv_fpq qd = qh;
    qd.scales = dsc;
    const kv_quant kq = {.kind = KV_QUANT_FP, .fp = qh};
    kv_block_storage bs;
    ck_assert_kv_ok(kv_quant_storage(&bs, &kq, k->tokens, k->channels));
    const size_t n = bs.values;
    float *x = randn(n, 900 + (uint64_t)_i, k->spread, 0.1f);
    uint32_t *w = calloc(bs.code_words + 1, 4);
    uint8_t *b = calloc(bs.groups + 1, 1);
    float *y = malloc((n + 1) * 4);
    ck_assert_kv_ok(kv_fpq_encode_ref(w, b, &qh, k->tokens, k->channels, x));
    ck_assert_kv_ok(kv_fpq_decode_ref(y, &qh, k->tokens, k->channels, w, b));
    float *dx = to_dev(x, n * 4), *dy = dev_alloc(n * 4);
    uint32_t *dw = dev_alloc(bs.code_bytes);
    uint8_t *db = dev_alloc(bs.groups);
    ck_assert_kv_ok(kv_fpq_encode_cuda(dw, db, &qd, k->tokens, k->channels, dx, NULL));
    uint32_t *hw = to_host(dw, bs.code_bytes);
    uint8_t *hb = to_host(db, bs.groups);
    ck_assert_msg(memcmp(w, hw, bs.code_bytes) == 0, "codes differ");
    ck_assert_msg(memcmp(b, hb, bs.groups) == 0, "block scales differ");
    ck_assert_kv_ok(kv_fpq_decode_cuda(dy, &qd, k->tokens, k->channels, dw, db, NULL));
    float *hy = to_host(dy, n * 4);
    ck_assert_msg(memcmp(y, hy, n * 4) == 0, "decoded values differ");
    dev_check_guard(dw, bs.code_bytes);
    dev_check_guard(db, bs.groups);
    dev_check_guard(dy, n * 4);
    if (n) {
        x[n / 2] = INFINITY;
        ck_assert_int_eq(kv_fpq_encode_ref(w, b, &qh, k->tokens, k->channels, x), KV_ENUMERIC);
        ck_assert_int_eq(cudaMemcpy(dx, x, n * 4, cudaMemcpyHostToDevice), cudaSuccess);
        ck_assert_int_eq(kv_fpq_encode_cuda(dw, db, &qd, k->tokens, k->channels, dx, NULL), KV_ENUMERIC);
    }
    dev_free(dsc);
    dev_free(dx);
    dev_free(dy);
    dev_free(dw);
    dev_free(db);
    free(x);
    free(w);
    free(b);
    free(y);
    free(hw);
    free(hb);
    free(hy);
}
END_TEST

/* Every finite FP8 value (times a scale of 1) through the GPU's conversion: its own code. */
START_TEST(gpu_fp8_every_code) {
    for (int f = 0; f < 2; f++) {
        const int fmt = f ? KV_FP_E5M2 : KV_FP_E4M3;
        float x[256], one = 1.0f;
        uint32_t want[256];
        size_t n = 0;
        for (uint32_t c = 0; c < 256; c++) {
            const float v = kv_qm_fp_decode(fmt, c);
            if (isfinite(v)) {
                x[n] = v;
                want[n++] = c;
            }
        }
        float *d1 = to_dev(&one, 4), *dx = to_dev(x, n * 4);
        const size_t nbytes = (n + 3) / 4 * 4;
        uint32_t *dw = dev_alloc(nbytes);
        const kv_fpq q = {.format = (kv_fp_format)fmt, .n_scales = 1, .scales = d1};
        ck_assert_kv_ok(kv_fpq_encode_cuda(dw, NULL, &q, 1, n, dx, NULL));
        uint32_t *hw = to_host(dw, nbytes);
        for (size_t i = 0; i < n; i++) ck_assert_uint_eq(kv_qm_unpack(hw, i, 8, 4), want[i]);
        dev_check_guard(dw, nbytes);
        dev_free(d1);
        dev_free(dx);
        dev_free(dw);
        free(hw);
    }
}
END_TEST

int main(void) {
    if (!kv_cuda_available()) {
        printf("test_kernels_cuda: no usable CUDA device, skipping\n");
        return 77;
    }
    Suite *s = suite_create("kernels_cuda");
    TCase *tc = tcase_create("cpu_vs_gpu");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, gpu_pack_every_width);
    tcase_add_loop_test(tc, gpu_uniform_matches_cpu, 0, (int)(sizeof k_u / sizeof k_u[0]));
    tcase_add_loop_test(tc, gpu_higgs_matches_cpu, 0, (int)(sizeof k_h / sizeof k_h[0]));
    tcase_add_loop_test(tc, gpu_squat_matches_cpu, 0, (int)(sizeof k_s / sizeof k_s[0]));
    tcase_add_loop_test(tc, gpu_fpq_matches_cpu, 0, (int)(sizeof k_f / sizeof k_f[0]));
    tcase_add_test(tc, gpu_fp8_every_code);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_set_fork_status(sr, CK_NOFORK);
    srunner_run_all(sr, CK_NORMAL);
    const int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? 0 : 1;
}
