/* kernels/ CPU reference: packing, uniform + XQuant, shared codes, HIGGS, SQuat, bits accounting. */
#include "kv_test.h"
#include "kv_kernels_internal.h"
#include "kv_quant_math.h"
#include "kvrt.h"

#include <float.h>
#include <lapacke.h>
#include <math.h>

static float *randn(size_t n, uint64_t seed, float scale, float shift) {
    float *x = malloc((n ? n : 1) * sizeof *x);
    kv_rng r;
    kv_rng_init(&r, seed);
    for (size_t i = 0; i < n; i++) x[i] = (float)kv_rng_next_normal(&r) * scale + shift;
    return x;
}

/* ---- packing ------------------------------------------------------------------------------------ */
static const size_t k_pack_sizes[] = {0, 1, 7, 10, 11, 31, 32, 33, 100, 1001};

START_TEST(pack_roundtrip_every_width) {
    /* _i enumerates (width 1..8, plus 3-bit 11-per-word) x sizes */
    const int nsz = (int)(sizeof k_pack_sizes / sizeof k_pack_sizes[0]);
    const int wi = _i / nsz;
    const size_t n = k_pack_sizes[_i % nsz];
    const int bits = wi < 8 ? wi + 1 : 3, pack11 = wi == 8;
    const int per = kv_pack_per_word(bits, pack11);
    ck_assert_int_eq(per, pack11 ? 11 : 32 / bits);
    const size_t nw = kv_pack_words(n, bits, pack11);
    ck_assert_uint_eq(nw, (n + (size_t)per - 1) / (size_t)per);
    uint8_t *c = malloc(n + 1), *back = malloc(n + 1);
    uint32_t *w = malloc((nw + 2) * sizeof *w);
    kv_rng r;
    kv_rng_init(&r, 1234 + (uint64_t)_i);
    for (size_t j = 0; j < n; j++) {
        uint32_t mx = (pack11 && j % 11 == 10) ? 3u : (1u << bits) - 1u;
        c[j] = (uint8_t)(kv_rng_next_u64(&r) % (mx + 1));
    }
    w[nw] = 0xdeadbeefu; /* guard */
    ck_assert_kv_ok(kv_pack_ref(w, c, n, bits, pack11));
    ck_assert_uint_eq(w[nw], 0xdeadbeefu);
    ck_assert_kv_ok(kv_unpack_ref(back, w, n, bits, pack11));
    for (size_t j = 0; j < n; j++) ck_assert_uint_eq(back[j], c[j]);
    /* unused trailing slots are zero */
    if (n % (size_t)per) {
        const int used = (int)(n % (size_t)per);
        const int used_bits = pack11 ? used * 3 : used * bits;
        ck_assert_uint_eq(w[nw - 1] >> used_bits, 0u);
    }
    free(c);
    free(back);
    free(w);
}
END_TEST

START_TEST(pack_hand_made_layouts) {
    const uint8_t c2[] = {1, 2, 3};
    uint32_t w[2] = {0, 0};
    ck_assert_kv_ok(kv_pack_ref(w, c2, 3, 2, 0));
    ck_assert_uint_eq(w[0], 1u | 2u << 2 | 3u << 4);
    /* 11 per word: ten 3-bit codes 7 and a final 2-bit code 3 fill all 32 bits */
    uint8_t c11[12];
    for (int i = 0; i < 10; i++) c11[i] = 7;
    c11[10] = 3;
    c11[11] = 5;
    ck_assert_kv_ok(kv_pack_ref(w, c11, 12, 3, 1));
    ck_assert_uint_eq(w[0], 0xffffffffu);
    ck_assert_uint_eq(w[1], 5u);
    /* plain 3-bit: 10 per word, bits 30..31 unused */
    ck_assert_kv_ok(kv_pack_ref(w, c11, 11, 3, 0));
    ck_assert_uint_eq(w[0], 0x3fffffffu);
    ck_assert_uint_eq(w[1], 3u);
    ck_assert_int_eq(kv_pack_ref(w, c2, 3, 9, 0), KV_EINVAL);
    ck_assert_int_eq(kv_pack_ref(w, c2, 3, 2, 1), KV_EINVAL);
}
END_TEST

/* ---- uniform ------------------------------------------------------------------------------------ */
START_TEST(uniform_exact_codes_values_axis) {
    const float x[8] = {0.f, 1.f, 2.f, 3.f, /* second group of the row */ 10.f, 10.f, 10.f, 10.f};
    kv_uniform q = {.bits = 2, .group = 4, .axis = KV_AXIS_CHANNELS, .param_type = KV_PARAM_F32, .eta = 0.0f};
    uint32_t w[1];
    float s[2], z[2];
    ck_assert_kv_ok(kv_uniform_encode_ref(w, s, z, &q, 1, 8, x));
    ck_assert_uint_eq(w[0], 0u | 1u << 2 | 2u << 4 | 3u << 6); /* constant group: all codes 0 */
    ck_assert_float_eq(s[0], 1.0f);
    ck_assert_float_eq(z[0], 0.0f);
    ck_assert_float_eq(s[1], 0.0f);
    ck_assert_float_eq(z[1], 10.0f);
    float y[8];
    ck_assert_kv_ok(kv_uniform_decode_ref(y, &q, 1, 8, w, s, z));
    for (int i = 0; i < 8; i++) ck_assert_float_eq(y[i], x[i]);
    /* XQuant: z' = z + eta s (2^B - 1), s' = (1 - 2 eta) s */
    q.eta = 0.125f;
    ck_assert_kv_ok(kv_uniform_encode_ref(w, s, z, &q, 1, 8, x));
    ck_assert_uint_eq(w[0], 0xe4u);
    ck_assert_float_eq(z[0], 0.375f);
    ck_assert_float_eq(s[0], 0.75f);
    ck_assert_kv_ok(kv_uniform_decode_ref(y, &q, 1, 8, w, s, z));
    ck_assert_float_eq(y[0], 0.375f);
    ck_assert_float_eq(y[3], 2.625f);
    /* rounding: 1.4 -> 1, 1.6 -> 2 with s = 1 */
    const float x2[4] = {0.f, 1.4f, 1.6f, 3.f};
    q.eta = 0.0f;
    ck_assert_kv_ok(kv_uniform_encode_ref(w, s, z, &q, 1, 4, x2));
    ck_assert_uint_eq(w[0], 0u | 1u << 2 | 2u << 4 | 3u << 6);
}
END_TEST

START_TEST(uniform_exact_codes_keys_axis) {
    /* T=3 tokens, C=2 channels, G=2: token group 0 = rows 0-1, token group 1 = row 2 (1 row).
     * Stream: [c0 t0, c0 t1, c1 t0, c1 t1, c0 t2, c1 t2]. 1 bit per code. */
    const float x[6] = {0.f, 5.f, /* t0 */ 1.f, 4.f, /* t1 */ 7.f, 9.f /* t2 */};
    kv_uniform q = {.bits = 1, .group = 2, .axis = KV_AXIS_TOKENS, .param_type = KV_PARAM_F32};
    uint32_t w[1];
    float s[4], z[4];
    ck_assert_kv_ok(kv_uniform_encode_ref(w, s, z, &q, 3, 2, x));
    /* c0 t0 = 0 (min), c0 t1 = 1 (max), c1 t0 = 1 (max 5), c1 t1 = 0 (min 4), row 2 groups are
     * single values: codes 0 */
    ck_assert_uint_eq(w[0], 0u | 1u << 1 | 1u << 2 | 0u << 3);
    ck_assert_float_eq(z[0], 0.f);
    ck_assert_float_eq(s[0], 1.f);
    ck_assert_float_eq(z[1], 4.f);
    ck_assert_float_eq(s[1], 1.f);
    ck_assert_float_eq(z[2], 7.f);
    ck_assert_float_eq(z[3], 9.f);
    ck_assert_uint_eq(kv_qm_uniform_stream_pos(KV_AXIS_TOKENS, 2, 3, 2, 2, 1), 5);
    size_t t, c;
    kv_qm_uniform_stream_elem(KV_AXIS_TOKENS, 2, 3, 2, 3, &t, &c);
    ck_assert_uint_eq(t, 1);
    ck_assert_uint_eq(c, 1);
}
END_TEST

/* Table of round-trip shapes: odd sizes, sizes not a multiple of the group, zero. */
typedef struct rt_case {
    int bits, group, axis, pack11, ptype;
    size_t tokens, channels;
} rt_case;
static const rt_case k_rt[] = {
    {1, 32, KV_AXIS_TOKENS, 0, KV_PARAM_F32, 77, 13},  {2, 32, KV_AXIS_TOKENS, 0, KV_PARAM_F32, 64, 64},
    {3, 16, KV_AXIS_TOKENS, 0, KV_PARAM_F32, 35, 9},   {3, 16, KV_AXIS_TOKENS, 1, KV_PARAM_F32, 35, 9},
    {4, 64, KV_AXIS_TOKENS, 0, KV_PARAM_F16, 130, 7},  {8, 5, KV_AXIS_TOKENS, 0, KV_PARAM_F32, 11, 3},
    {1, 32, KV_AXIS_CHANNELS, 0, KV_PARAM_F32, 5, 70}, {2, 64, KV_AXIS_CHANNELS, 0, KV_PARAM_F16, 9, 64},
    {3, 24, KV_AXIS_CHANNELS, 1, KV_PARAM_F32, 4, 53}, {3, 7, KV_AXIS_CHANNELS, 0, KV_PARAM_F32, 3, 29},
    {4, 128, KV_AXIS_CHANNELS, 0, KV_PARAM_F32, 2, 100}, {8, 16, KV_AXIS_CHANNELS, 0, KV_PARAM_F16, 6, 33},
    {2, 32, KV_AXIS_TOKENS, 0, KV_PARAM_F32, 0, 8},    {2, 32, KV_AXIS_CHANNELS, 0, KV_PARAM_F32, 4, 0},
    {4, 1, KV_AXIS_CHANNELS, 0, KV_PARAM_F32, 3, 5},   {2, 1000, KV_AXIS_TOKENS, 0, KV_PARAM_F32, 3, 5},
};

START_TEST(uniform_roundtrip_bound) {
    const rt_case *k = &k_rt[_i];
    const kv_uniform q = {.bits = k->bits, .group = k->group, .axis = (kv_axis)k->axis,
                          .param_type = (kv_param_type)k->ptype, .pack11 = k->pack11, .eta = 0.0f};
    const size_t n = k->tokens * k->channels;
    kv_quant qd = {.kind = KV_QUANT_UNIFORM, .uniform = q};
    kv_block_storage bs;
    ck_assert_kv_ok(kv_quant_storage(&bs, &qd, k->tokens, k->channels));
    float *x = randn(n, 77 + (uint64_t)_i, 3.0f, 1.5f);
    uint32_t *w = malloc((bs.code_words + 1) * sizeof *w);
    uint8_t *sc = malloc(bs.scale_bytes + 4), *zr = malloc(bs.zero_bytes + 4);
    float *y = malloc((n ? n : 1) * sizeof *y);
    ck_assert_kv_ok(kv_uniform_encode_ref(w, sc, zr, &q, k->tokens, k->channels, x));
    ck_assert_kv_ok(kv_uniform_decode_ref(y, &q, k->tokens, k->channels, w, sc, zr));
    const int per = kv_pack_per_word(q.bits, q.pack11);
    const float qmax = (float)((1u << q.bits) - 1u);
    for (size_t t = 0; t < k->tokens; t++)
        for (size_t c = 0; c < k->channels; c++) {
            const size_t g = kv_qm_uniform_group(q.axis, (size_t)q.group, k->tokens, k->channels, t, c);
            const size_t j = kv_qm_uniform_stream_pos(q.axis, (size_t)q.group, k->tokens, k->channels, t, c);
            const float s = kv_qm_param_load(sc, g, q.param_type), z = kv_qm_param_load(zr, g, q.param_type);
            const float xv = x[t * k->channels + c], yv = y[t * k->channels + c];
            if (per == 11 && j % 11 == 10) {
                /* slot 10 holds at most code 3: values above z + 3 s are clamped */
                ck_assert_uint_le(kv_qm_unpack(w, j, 3, 11), 3u);
                if (xv <= z + 3.0f * s) ck_assert_float_le(fabsf(xv - yv), 0.5f * s * 1.0001f + 1e-5f);
                continue;
            }
            /* |x - x_hat| <= s/2 at eta = 0; slack: f32 rounding of (x - z) / s and code*s + z
             * (a few ulp of the group's magnitude); with f16 storage, the rounding of s and z
             * (2^-11 relative) times their weight in code*s + z. */
            float slack = 1e-5f * (fabsf(z) + qmax * s + 1.0f);
            if (q.param_type == KV_PARAM_F16) slack += 1.0f / 1024.0f * (fabsf(z) + qmax * s);
            ck_assert_msg(fabsf(xv - yv) <= 0.5f * s + slack, "t=%zu c=%zu x=%g y=%g s=%g", t, c, (double)xv,
                          (double)yv, (double)s);
        }
    /* scores: the dequantize-and-dot equals the dot with the decoded block (same order) */
    float *qv = randn(k->channels, 5, 1.0f, 0.0f), *scores = malloc((k->tokens + 1) * sizeof *scores);
    ck_assert_kv_ok(kv_uniform_scores_ref(scores, &q, k->tokens, k->channels, w, sc, zr, qv));
    for (size_t t = 0; t < k->tokens; t++) {
        float acc = 0.0f;
        for (size_t c = 0; c < k->channels; c++) acc += qv[c] * y[t * k->channels + c];
        ck_assert_float_eq(scores[t], acc);
    }
    free(qv);
    free(scores);
    free(x);
    free(w);
    free(sc);
    free(zr);
    free(y);
}
END_TEST

START_TEST(uniform_shared_codes_decode) {
    /* XQuant pair: layer l stores codes, layer l+1 only its scale/zero and decodes l's codes. */
    const size_t T = 40, C = 24;
    const kv_uniform q = {.bits = 2, .group = 16, .axis = KV_AXIS_TOKENS, .param_type = KV_PARAM_F32, .eta = 0.05f};
    float *xa = randn(T * C, 1, 1.0f, 0.0f), *xb = randn(T * C, 2, 2.0f, 0.5f);
    kv_quant qd = {.kind = KV_QUANT_UNIFORM, .uniform = q};
    kv_block_storage bs;
    ck_assert_kv_ok(kv_quant_storage(&bs, &qd, T, C));
    uint32_t *wa = malloc(bs.code_words * 4);
    float *sa = malloc(bs.scale_bytes), *za = malloc(bs.zero_bytes), *sb = malloc(bs.scale_bytes),
          *zb = malloc(bs.zero_bytes), *y = malloc(T * C * sizeof *y);
    ck_assert_kv_ok(kv_uniform_encode_ref(wa, sa, za, &q, T, C, xa));
    ck_assert_kv_ok(kv_uniform_encode_ref(NULL, sb, zb, &q, T, C, xb)); /* params only */
    ck_assert_kv_ok(kv_uniform_decode_ref(y, &q, T, C, wa, sb, zb));
    double err = 0.0, ref = 0.0;
    for (size_t t = 0; t < T; t++)
        for (size_t c = 0; c < C; c++) {
            const size_t g = kv_qm_uniform_group(q.axis, 16, T, C, t, c);
            const uint32_t code = kv_qm_unpack(wa, kv_qm_uniform_stream_pos(q.axis, 16, T, C, t, c), 2, 16);
            ck_assert_float_eq(y[t * C + c], (float)code * sb[g] + zb[g]);
            /* B's own min/max: stored params are B's (z' within B's range) */
            ck_assert_float_ge(zb[g], -20.f);
            err += (y[t * C + c] - xb[t * C + c]) * (y[t * C + c] - xb[t * C + c]);
            ref += xb[t * C + c] * xb[t * C + c];
        }
    ck_assert(err > 0.0 && ref > 0.0);
    /* the shared layer's storage has no codes */
    qd.shared_codes = 1;
    kv_block_storage bsh;
    ck_assert_kv_ok(kv_quant_storage(&bsh, &qd, T, C));
    ck_assert_uint_eq(bsh.code_bytes, 0);
    ck_assert_uint_eq(bsh.total_bytes, bs.scale_bytes + bs.zero_bytes);
    free(xa);
    free(xb);
    free(wa);
    free(sa);
    free(za);
    free(sb);
    free(zb);
    free(y);
}
END_TEST

/* The SSE2 encoder (cpu/uniform_sse2.c, taken by kv_uniform_encode_ref on x86-64 for 1/2/4/8 bits
 * in whole-word layouts) writes exactly the portable path's words, scales and zero points, and the
 * decoder (SSE2 on the keys axis) gives exactly the shared element formula's values: random
 * data with constant groups, signed zeros and large offsets, and data on exact rounding ties; both axes,
 * eta 0 and 0.1, f16 and f32 parameters, odd channel counts and partial token groups (those go
 * to the portable path — the comparison then holds trivially, and the test checks which path ran). */
typedef struct sse2_case {
    int bits, axis, group;
    size_t tokens, channels;
} sse2_case;
static const sse2_case k_sse2[] = {
    {2, KV_AXIS_CHANNELS, 64, 37, 128, }, {4, KV_AXIS_CHANNELS, 32, 16, 96},  {1, KV_AXIS_CHANNELS, 32, 5, 64},
    {8, KV_AXIS_CHANNELS, 8, 9, 40},      {2, KV_AXIS_TOKENS, 64, 192, 128},  {4, KV_AXIS_TOKENS, 32, 96, 36},
    {1, KV_AXIS_TOKENS, 32, 64, 20},      {8, KV_AXIS_TOKENS, 16, 40, 12},    {2, KV_AXIS_TOKENS, 32, 48, 64},
    {2, KV_AXIS_TOKENS, 64, 70, 128},     {3, KV_AXIS_CHANNELS, 64, 8, 128}, {2, KV_AXIS_CHANNELS, 64, 8, 100},
};

START_TEST(uniform_sse2_matches_portable) {
    const sse2_case *c = &k_sse2[_i];
    const size_t n = c->tokens * c->channels;
    float *x = randn(n, 900 + (uint64_t)_i, 1.5f, 0.25f);
    for (size_t j = 0; j < n; j += 37) x[j] = 0.0f;
    for (size_t j = 5; j < n; j += 41) x[j] = -0.0f;
    for (size_t j = 11; j < n; j += 53) x[j] = 1000.0f; /* a large offset widens its group */
    for (size_t j = 0; j < c->channels && j < n; j++) x[j] = 0.5f; /* constant runs: s = 0 */
    /* zeros of both signs filling a values group (row 1's first channels) and a keys group
     * (channel 1 down the rows): the scale must not depend on which zero the min/max keeps */
    for (size_t j = 0; j < (size_t)c->group && c->channels + j < n; j++) x[c->channels + j] = j % 2 ? -0.0f : 0.0f;
    for (size_t t = 0; t < c->tokens && c->channels > 1; t++) x[t * c->channels + 1] = t % 3 ? -0.0f : 0.0f;
    for (int variant = 0; variant < 6; variant++) {
        if (variant == 4) /* exact rounding ties: groups span 0 .. 2^bits - 1 (so s = 1, inv = 1) and hold k + 0.5 */
            for (size_t j = 0; j < n; j++)
                x[j] = j % 7 == 0 ? 0.0f : j % 7 == 1 ? (float)((1u << c->bits) - 1u) : (float)(j % 5 % (1u << c->bits)) + 0.5f;
        kv_uniform q = {.bits = c->bits, .group = c->group, .axis = (kv_axis)c->axis, .eta = variant & 1 ? 0.1f : 0.0f,
                        .param_type = variant & 2 ? KV_PARAM_F32 : KV_PARAM_F16};
        const size_t nw = kv_pack_words(n, c->bits, 0), ng = kv_uniform_groups(&q, c->tokens, c->channels);
        uint32_t *w1 = calloc(nw + 1, 4), *w2 = calloc(nw + 1, 4);
        float *s1 = calloc(ng, 4), *s2 = calloc(ng, 4), *z1 = calloc(ng, 4), *z2 = calloc(ng, 4);
        kv_status st = KV_EINVAL;
        const int handled = kv_uniform_encode_sse2(w1, s1, z1, &q, c->tokens, c->channels, x, &st);
        const int per = 32 / c->bits;
        const int eligible = c->bits != 3 && c->group % per == 0 &&
                             (c->axis == KV_AXIS_CHANNELS ? c->group % 8 == 0 && c->channels % (size_t)c->group == 0
                                                          : c->channels % 4 == 0 && (c->tokens % (size_t)c->group) % (size_t)per == 0);
#if defined(__SSE2__)
        ck_assert_int_eq(handled, eligible);
#else
        ck_assert_int_eq(handled, 0);
#endif
        if (!handled) ck_assert_kv_ok(kv_uniform_encode_ref(w1, s1, z1, &q, c->tokens, c->channels, x));
        else ck_assert_kv_ok(st);
        ck_assert_kv_ok(kv_uniform_encode_portable(w2, s2, z2, &q, c->tokens, c->channels, x));
        ck_assert_msg(memcmp(w1, w2, nw * 4) == 0, "case %d variant %d: codes differ", _i, variant);
        const size_t pb = variant & 2 ? 4 : 2;
        ck_assert_msg(memcmp(s1, s2, ng * pb) == 0 && memcmp(z1, z2, ng * pb) == 0, "case %d variant %d: parameters differ",
                      _i, variant);
        /* decode (the keys axis takes the SSE2 decoder where eligible) equals the shared element
         * formula (the one the CUDA decode kernel uses), bit for bit */
        float *y = malloc(n * sizeof *y);
        ck_assert_kv_ok(kv_uniform_decode_ref(y, &q, c->tokens, c->channels, w1, s1, z1));
        for (size_t t = 0; t < c->tokens; t++)
            for (size_t ch = 0; ch < c->channels; ch++) {
                const float e = kv_qm_uniform_elem(c->bits, per, c->axis, (size_t)c->group, c->tokens, c->channels, t, ch,
                                                   w1, s1, z1, (int)q.param_type);
                ck_assert_msg(memcmp(&e, &y[t * c->channels + ch], 4) == 0, "case %d variant %d: decode differs at %zu,%zu", _i,
                              variant, t, ch);
            }
        free(y);
        free(w1);
        free(w2);
        free(s1);
        free(s2);
        free(z1);
        free(z2);
    }
    x[n / 2] = NAN; /* a non-finite value is refused by both paths */
    kv_uniform q = {.bits = c->bits, .group = c->group, .axis = (kv_axis)c->axis};
    uint32_t *w = calloc(kv_pack_words(n, c->bits, 0) + 1, 4);
    uint16_t *p1 = calloc(n, 2), *p2 = calloc(n, 2);
    ck_assert_int_eq(kv_uniform_encode_ref(w, p1, p2, &q, c->tokens, c->channels, x), KV_ENUMERIC);
    x[n / 2] = INFINITY;
    ck_assert_int_eq(kv_uniform_encode_ref(w, p1, p2, &q, c->tokens, c->channels, x), KV_ENUMERIC);
    free(w);
    free(p1);
    free(p2);
    free(x);
}
END_TEST

START_TEST(uniform_errors) {
    kv_uniform q = {.bits = 5, .group = 4, .axis = KV_AXIS_CHANNELS};
    float x[4] = {0, 1, 2, NAN}, s[1], z[1];
    uint32_t w[1];
    ck_assert_int_eq(kv_uniform_encode_ref(w, s, z, &q, 1, 4, x), KV_EINVAL);
    q.bits = 2;
    q.eta = 0.5f;
    ck_assert_int_eq(kv_uniform_encode_ref(w, s, z, &q, 1, 4, x), KV_EINVAL);
    q.eta = 0.0f;
    ck_assert_int_eq(kv_uniform_encode_ref(w, s, z, &q, 1, 4, x), KV_ENUMERIC);
    x[3] = INFINITY;
    q.axis = KV_AXIS_TOKENS;
    ck_assert_int_eq(kv_uniform_encode_ref(w, s, z, &q, 4, 1, x), KV_ENUMERIC);
    q.pack11 = 1;
    ck_assert_int_eq(kv_uniform_check(&q), KV_EINVAL);
}
END_TEST

/* ---- bits accounting ----------------------------------------------------------------------------- */
START_TEST(storage_hand_computed) {
    kv_block_storage b;
    kv_quant q = {.kind = KV_QUANT_UNIFORM,
                  .uniform = {.bits = 2, .group = 32, .axis = KV_AXIS_TOKENS, .param_type = KV_PARAM_F16}};
    /* 128 x 64 values, 2 bits: 8192 / 16 = 512 words = 2048 B; groups 4 * 64 = 256, f16 scale + zero
     * = 512 + 512 B; 3072 B = 24576 bits = 3 bits per value */
    ck_assert_kv_ok(kv_quant_storage(&b, &q, 128, 64));
    ck_assert_uint_eq(b.values, 8192);
    ck_assert_uint_eq(b.code_words, 512);
    ck_assert_uint_eq(b.groups, 256);
    ck_assert_uint_eq(b.scale_bytes, 512);
    ck_assert_uint_eq(b.zero_bytes, 512);
    ck_assert_uint_eq(b.total_bytes, 3072);
    ck_assert_uint_eq(b.total_bits, 24576);
    ck_assert_double_eq_tol(b.bits_per_value, 3.0, 1e-12);
    /* 130 tokens: 5 token groups (last of 2 rows) */
    ck_assert_kv_ok(kv_quant_storage(&b, &q, 130, 64));
    ck_assert_uint_eq(b.groups, 5 * 64);
    ck_assert_uint_eq(b.code_words, (130 * 64 + 15) / 16);
    /* 3 bits: 110 values = 11 words plain (10/word), 10 words KVmix (11/word); values axis G=16,
     * C=11: 1 group per token, f32 */
    q.uniform = (kv_uniform){.bits = 3, .group = 16, .axis = KV_AXIS_CHANNELS, .param_type = KV_PARAM_F32};
    ck_assert_kv_ok(kv_quant_storage(&b, &q, 10, 11));
    ck_assert_uint_eq(b.code_words, 11);
    ck_assert_uint_eq(b.total_bytes, 44 + 10 * 4 * 2);
    q.uniform.pack11 = 1;
    ck_assert_kv_ok(kv_quant_storage(&b, &q, 10, 11));
    ck_assert_uint_eq(b.code_words, 10);
    q.shared_codes = 1;
    ck_assert_kv_ok(kv_quant_storage(&b, &q, 10, 11));
    ck_assert_uint_eq(b.total_bytes, 80);
    /* HIGGS d=2 n=256 g=64, f32 norms, 3 x 128: 192 indices of 8 bits = 48 words; 6 norms */
    q = (kv_quant){.kind = KV_QUANT_HIGGS, .higgs = {.dim = 2, .size = 256, .group = 64, .norm_type = KV_PARAM_F32}};
    ck_assert_kv_ok(kv_quant_storage(&b, &q, 3, 128));
    ck_assert_uint_eq(b.code_words, 48);
    ck_assert_uint_eq(b.norm_bytes, 24);
    ck_assert_uint_eq(b.total_bytes, 216);
    /* n = 64: 6-bit indices, 5 per word: 39 words; f16 norms */
    q.higgs.size = 64;
    q.higgs.norm_type = KV_PARAM_F16;
    ck_assert_kv_ok(kv_quant_storage(&b, &q, 3, 128));
    ck_assert_uint_eq(b.code_words, 39);
    ck_assert_uint_eq(b.total_bytes, 39 * 4 + 12);
    ck_assert_int_eq(kv_quant_storage(&b, &q, 3, 100), KV_EINVAL); /* 100 % 64 != 0 */
    q = (kv_quant){.kind = KV_QUANT_F16};
    ck_assert_kv_ok(kv_quant_storage(&b, &q, 7, 9));
    ck_assert_uint_eq(b.total_bytes, 126);
    ck_assert_double_eq_tol(b.bits_per_value, 16.0, 1e-12);
}
END_TEST

/* ---- FWHT and HIGGS -------------------------------------------------------------------------------- */
START_TEST(fwht_matches_explicit_hadamard) {
    const size_t n = (size_t)1 << _i; /* 1 .. 512 */
    float *v = randn(n, 9 + (uint64_t)_i, 1.0f, 0.0f);
    double *ref = calloc(n, sizeof *ref);
    for (size_t i = 0; i < n; i++)
        for (size_t j = 0; j < n; j++) {
            const int sign = __builtin_popcountll(i & j) & 1 ? -1 : 1;
            ref[i] += sign * (double)v[j];
        }
    ck_assert_kv_ok(kv_fwht_ref(v, n));
    const double norm = 1.0 / sqrt((double)n);
    for (size_t i = 0; i < n; i++) ck_assert_double_eq_tol(v[i], ref[i] * norm, 1e-5 * (1.0 + fabs(ref[i] * norm)));
    free(v);
    free(ref);
    float bad[3];
    ck_assert_int_eq(kv_fwht_ref(bad, 3), KV_EINVAL);
}
END_TEST

/* The CPU's vector paths, lowest first: every test below that runs per level caps the kernels at
 * k_levels[_i % 3] (the machine may lack the top ones: then the lower path runs twice). */
static const kv_simd_level k_levels[] = {KV_SIMD_NONE, KV_SIMD_SSE2, KV_SIMD_AVX2};

START_TEST(fwht_fast_is_bit_identical) {
    /* the CPU's FWHT (portable blocked C, SSE2, AVX2) and the shared stage-by-stage one (what the GPU
     * runs) agree bit for bit */
    kv_simd_level_limit(k_levels[_i]);
    for (size_t n = 1; n <= 4096; n *= 2) {
        float *a = randn(n, 40 + n, 3.0f, 0.5f), *b = malloc(n * sizeof *b);
        memcpy(b, a, n * sizeof *a);
        kv_fwht_unnormalized_ref(a, n);
        kv_qm_fwht(b, n);
        ck_assert_msg(memcmp(a, b, n * sizeof *a) == 0, "level %d, n %zu", (int)k_levels[_i], n);
        free(a);
        free(b);
    }
    kv_simd_level_limit(KV_SIMD_AVX2);
}
END_TEST

/* Product grids of the scalar Lloyd-Max quantizers, whose MSE per dimension is known:
 * 2 levels +-0.7979 (MSE 0.3634), 4 levels +-0.4528, +-1.5104 (MSE 0.1175). */
static float *product_grid(int d, int levels) {
    static const float l2[2] = {-0.7979f, 0.7979f}, l4[4] = {-1.5104f, -0.4528f, 0.4528f, 1.5104f};
    const float *l = levels == 2 ? l2 : l4;
    int n = 1;
    for (int k = 0; k < d; k++) n *= levels;
    float *g = malloc((size_t)n * (size_t)d * sizeof *g);
    for (int i = 0; i < n; i++) {
        int r = i;
        for (int k = 0; k < d; k++) {
            g[i * d + k] = l[r % levels];
            r /= levels;
        }
    }
    return g;
}

typedef struct higgs_case {
    int d, levels, group;
    double mse;
} higgs_case;
static const higgs_case k_higgs[] = {
    {1, 4, 256, 0.1175}, {2, 4, 256, 0.1175}, {4, 2, 128, 0.3634}, {8, 2, 256, 0.3634}, {1, 2, 64, 0.3634},
};

START_TEST(higgs_gaussian_mse_matches_grid) {
    const higgs_case *k = &k_higgs[_i];
    int n = 1;
    for (int i = 0; i < k->d; i++) n *= k->levels;
    float *grid = product_grid(k->d, k->levels);
    kv_grid_search *gs = NULL;
    if (k->d <= 2) ck_assert_kv_ok(kv_grid_search_create(&gs, grid, k->d, n));
    const kv_higgs h = {.dim = k->d, .size = n, .group = k->group, .norm_type = KV_PARAM_F32, .seed = 42,
                        .grid = grid, .search = gs};
    const size_t T = 200, C = (size_t)k->group * 2;
    float *x = randn(T * C, 100 + (uint64_t)_i, 2.0f, 0.0f), *y = malloc(T * C * sizeof *y);
    kv_quant qd = {.kind = KV_QUANT_HIGGS, .higgs = h};
    kv_block_storage bs;
    ck_assert_kv_ok(kv_quant_storage(&bs, &qd, T, C));
    uint32_t *idx = malloc(bs.code_words * 4);
    float *norms = malloc(bs.norm_bytes);
    ck_assert_kv_ok(kv_higgs_encode_ref(idx, norms, &h, T, C, x));
    ck_assert_kv_ok(kv_higgs_decode_ref(y, &h, T, C, idx, norms));
    double err = 0.0, ref = 0.0;
    for (size_t i = 0; i < T * C; i++) {
        err += (double)(x[i] - y[i]) * (x[i] - y[i]);
        ref += (double)x[i] * x[i];
    }
    /* relative MSE ~ grid MSE per dimension: the rotated, norm-scaled coordinates are close to
     * N(0, 1) (exactly on a sphere of radius sqrt(g)); 400 groups x 256 values give a standard
     * error well under 2%, so 6% covers the estimate and the sphere-vs-Gaussian difference. */
    ck_assert_msg(fabs(err / ref - k->mse) < 0.06 * k->mse, "rel mse %g vs grid %g", err / ref, k->mse);
    /* the search accelerator gives exactly the exhaustive indices */
    if (gs) {
        kv_higgs h2 = h;
        h2.search = NULL;
        uint32_t *idx2 = malloc(bs.code_words * 4);
        float *norms2 = malloc(bs.norm_bytes);
        ck_assert_kv_ok(kv_higgs_encode_ref(idx2, norms2, &h2, T, C, x));
        ck_assert_int_eq(memcmp(idx, idx2, bs.code_words * 4), 0);
        free(idx2);
        free(norms2);
    }
    /* scores in the rotated domain equal the dot with the decoded block (to rounding) */
    float *qv = randn(C, 3, 1.0f, 0.0f), *sc = malloc(T * sizeof *sc);
    ck_assert_kv_ok(kv_higgs_scores_ref(sc, &h, T, C, idx, norms, qv));
    for (size_t t = 0; t < T; t++) {
        double acc = 0.0, mag = 0.0;
        for (size_t c = 0; c < C; c++) {
            acc += (double)qv[c] * y[t * C + c];
            mag += fabs((double)qv[c] * y[t * C + c]);
        }
        ck_assert_double_eq_tol(sc[t], acc, 1e-5 * mag + 1e-6);
    }
    free(qv);
    free(sc);
    kv_grid_search_free(gs);
    free(grid);
    free(x);
    free(y);
    free(idx);
    free(norms);
}
END_TEST

START_TEST(grid_search_equals_exhaustive) {
    /* random 1-D and 2-D grids, queries drawn wide (outside the table too) and exactly on
     * midpoints between points (ties) */
    for (int d = 1; d <= 2; d++) {
        const int n = d == 1 ? 16 : 256;
        float *g = randn((size_t)n * (size_t)d, 50 + (uint64_t)d, 1.0f, 0.0f);
        kv_grid_search *s = NULL;
        ck_assert_kv_ok(kv_grid_search_create(&s, g, d, n));
        kv_rng r;
        kv_rng_init(&r, 7);
        for (int it = 0; it < 200000; it++) {
            float u[2];
            if (it % 4 == 3) {
                const int a = (int)(kv_rng_next_u64(&r) % (uint64_t)n), b = (int)(kv_rng_next_u64(&r) % (uint64_t)n);
                for (int k = 0; k < d; k++) u[k] = 0.5f * (g[a * d + k] + g[b * d + k]);
            } else {
                for (int k = 0; k < d; k++) u[k] = (float)kv_rng_next_normal(&r) * 2.5f;
            }
            ck_assert_int_eq(kv_grid_search_nearest(s, u), kv_qm_grid_nearest(u, g, d, n));
        }
        kv_grid_search_free(s);
        free(g);
    }
}
END_TEST

/* Grids for the batched search: random Gaussian ones (the HIGGS case), a tight cluster (cells with
 * up to dozens of candidates: the quad records and the scalar fall-back), repeated points (exact
 * ties between different indices), a product grid (ties on whole lines) and a single point. */
static float *search_test_grid(int kind, int *n) {
    switch (kind) {
    case 0: *n = 256; return randn(2 * 256, 61, 1.0f, 0.0f);
    case 1: *n = 16; return randn(2 * 16, 62, 1.0f, 0.0f);
    case 2: *n = 64; return randn(2 * 64, 63, 0.01f, 0.3f);
    case 3: {
        *n = 128;
        float *g = randn(2 * 128, 64, 1.0f, 0.0f);
        for (int i = 64; i < 128; i++) g[2 * i] = g[2 * (i - 64)], g[2 * i + 1] = g[2 * (i - 64) + 1];
        return g;
    }
    case 4: *n = 16; return product_grid(2, 4);
    default: *n = 1; return randn(2, 65, 1.0f, 0.0f);
    }
}

START_TEST(grid_search_many_equals_exhaustive) {
    /* kv_grid_search_nearest_many (the encoder's batched search: table, pair and quad records, SSE2
     * or AVX2 first pass) gives the exhaustive search's index for every query, at every level: queries
     * Gaussian, wide, at midpoints between two points and on points (ties), far outside the table,
     * NaN and infinite; counts around the vector widths and the 512-query chunk */
    kv_simd_level_limit(k_levels[_i % 3]);
    int n = 0;
    float *g = search_test_grid(_i / 3, &n);
    kv_grid_search *s = NULL;
    ck_assert_kv_ok(kv_grid_search_create(&s, g, 2, n));
    const size_t counts[] = {0, 1, 3, 7, 8, 9, 17, 511, 512, 513, 1500};
    kv_rng r;
    kv_rng_init(&r, 100 + (uint64_t)_i);
    for (size_t c = 0; c < sizeof counts / sizeof counts[0]; c++) {
        const size_t m = counts[c];
        float *u = malloc((2 * m + 1) * sizeof *u);
        uint8_t *got = malloc(m + 1);
        for (size_t q = 0; q < m; q++) {
            const int a = (int)(kv_rng_next_u64(&r) % (uint64_t)n), b = (int)(kv_rng_next_u64(&r) % (uint64_t)n);
            const float wide = (float)kv_rng_next_normal(&r) * 2.5f;
            switch (q % 8) {
            case 0: case 1: case 2:
                u[2 * q] = (float)kv_rng_next_normal(&r), u[2 * q + 1] = (float)kv_rng_next_normal(&r);
                break;
            case 3: u[2 * q] = wide, u[2 * q + 1] = (float)kv_rng_next_normal(&r) * 2.5f; break;
            case 4: u[2 * q] = 0.5f * (g[2 * a] + g[2 * b]), u[2 * q + 1] = 0.5f * (g[2 * a + 1] + g[2 * b + 1]); break;
            case 5: u[2 * q] = g[2 * a], u[2 * q + 1] = g[2 * a + 1]; break;
            case 6: u[2 * q] = wide * 8.0f, u[2 * q + 1] = 0.5f; break;
            default: u[2 * q] = q % 16 == 7 ? NAN : 0.1f, u[2 * q + 1] = q % 16 == 7 ? 0.2f : INFINITY; break;
            }
        }
        kv_grid_search_nearest_many(s, got, u, m);
        for (size_t q = 0; q < m; q++)
            ck_assert_msg(got[q] == kv_qm_grid_nearest(u + 2 * q, g, 2, n), "level %d grid %d count %zu query %zu (%g, %g): %d vs %d",
                          (int)k_levels[_i % 3], _i / 3, m, q, (double)u[2 * q], (double)u[2 * q + 1], got[q],
                          kv_qm_grid_nearest(u + 2 * q, g, 2, n));
        free(u);
        free(got);
    }
    kv_grid_search_free(s);
    free(g);
    kv_simd_level_limit(KV_SIMD_AVX2);
}
END_TEST

/* HIGGS encode and decode (each CPU path: portable, SSE2, AVX2 with the sum of squares fused into
 * the transform) against the shared element math step by step — signs, kv_qm_sumsq, kv_qm_fwht, the
 * norm's multiplier, exhaustive nearest point; decode: grid point times multiplier, kv_qm_fwht,
 * signs — bit for bit, for groups 8 .. 256 (one, two and three passes, with and without an odd
 * last stage). */
START_TEST(higgs_matches_element_math) {
    kv_simd_level_limit(k_levels[_i % 3]); /* _i / 3: the group size */
    const size_t g = (size_t)8 << (_i / 3), tokens = 5, channels = 2 * g, n = tokens * channels;
    float *grid = randn(16 * 2, 77, 1.0f, 0.0f);
    const kv_higgs h = {.dim = 2, .size = 16, .group = (int)g, .norm_type = KV_PARAM_F32, .seed = 3, .grid = grid};
    float *x = randn(n, 500 + (uint64_t)_i, 2.0f, 0.1f), *y = malloc(n * sizeof *y), *v = malloc(g * sizeof *v);
    uint32_t *idx = calloc(n, sizeof *idx);
    float *norms = malloc(n / g * sizeof *norms);
    ck_assert_kv_ok(kv_higgs_encode_ref(idx, norms, &h, tokens, channels, x));
    ck_assert_kv_ok(kv_higgs_decode_ref(y, &h, tokens, channels, idx, norms));
    for (size_t grp = 0; grp < n / g; grp++) {
        const float *xg = x + grp * g;
        const float norm = sqrtf(kv_qm_sumsq(xg, g)), mul = kv_qm_higgs_enc_mul(norm);
        ck_assert(memcmp(&norm, &norms[grp], 4) == 0);
        for (size_t k = 0; k < g; k++) v[k] = xg[k] * kv_qm_higgs_sign(h.seed, (grp * g + k) % channels);
        kv_qm_fwht(v, g);
        for (size_t k = 0; k < g; k++) v[k] *= mul;
        for (size_t p = 0; p < g / 2; p++) {
            const size_t piece = grp * g / 2 + p;
            const uint32_t got = (idx[piece / 8] >> (4 * (piece % 8))) & 15u;
            ck_assert_uint_eq(got, (uint32_t)kv_qm_grid_nearest(v + 2 * p, grid, 2, 16));
            v[2 * p] = grid[2 * got] * kv_qm_higgs_dec_mul(norm, g);
            v[2 * p + 1] = grid[2 * got + 1] * kv_qm_higgs_dec_mul(norm, g);
        }
        kv_qm_fwht(v, g);
        for (size_t k = 0; k < g; k++) {
            const float e = v[k] * kv_qm_higgs_sign(h.seed, (grp * g + k) % channels);
            ck_assert_msg(memcmp(&e, &y[grp * g + k], 4) == 0, "g %zu group %zu: decode differs at %zu", g, grp, k);
        }
    }
    kv_simd_level_limit(KV_SIMD_AVX2);
    free(grid);
    free(x);
    free(y);
    free(v);
    free(idx);
    free(norms);
}
END_TEST

START_TEST(higgs_details) {
    /* signs are deterministic and balanced */
    int neg = 0;
    for (size_t c = 0; c < 10000; c++) {
        const float s = kv_higgs_sign(99, c);
        ck_assert(s == 1.0f || s == -1.0f);
        ck_assert_float_eq(s, kv_higgs_sign(99, c));
        neg += s < 0;
    }
    ck_assert_int_gt(neg, 4700);
    ck_assert_int_lt(neg, 5300);
    /* zero group decodes to zero; non-finite input is an error; bad shapes are rejected */
    float *grid = product_grid(2, 4);
    const kv_higgs h = {.dim = 2, .size = 16, .group = 8, .norm_type = KV_PARAM_F16, .seed = 1, .grid = grid};
    float x[16] = {0}, y[16];
    uint32_t idx[2];
    uint16_t norms[2];
    for (int i = 8; i < 16; i++) x[i] = (float)i;
    ck_assert_kv_ok(kv_higgs_encode_ref(idx, norms, &h, 1, 16, x));
    ck_assert_kv_ok(kv_higgs_decode_ref(y, &h, 1, 16, idx, norms));
    for (int i = 0; i < 8; i++) ck_assert_float_eq(y[i], 0.0f);
    ck_assert_float_eq_tol(kv_f16_to_f32(norms[1]), sqrtf(8 * 8 + 9 * 9 + 10 * 10 + 11 * 11 + 12 * 12 + 13 * 13 + 14 * 14 + 15 * 15), 0.05f);
    x[3] = NAN;
    ck_assert_int_eq(kv_higgs_encode_ref(idx, norms, &h, 1, 16, x), KV_ENUMERIC);
    ck_assert_int_eq(kv_higgs_encode_ref(idx, norms, &h, 1, 12, x), KV_EINVAL);
    kv_higgs bad = h;
    bad.size = 12;
    ck_assert_int_eq(kv_higgs_check(&bad), KV_EINVAL);
    bad = h;
    bad.group = 24;
    ck_assert_int_eq(kv_higgs_check(&bad), KV_EINVAL);
    free(grid);
}
END_TEST

/* kv_higgs.channel0: a block holding one KV head's channels (token pruning keeps tokens per head) is
 * coded exactly as those channels of a whole-token block — the same indices, norms, decoded values and
 * scores — for every group inside a head, at each CPU level. */
START_TEST(higgs_channel_offset) {
    kv_simd_level_limit(k_levels[_i % 3]);
    const size_t hd = 64, heads = 3, C = hd * heads, tokens = 7, g = (size_t)16 << (_i / 3 % 3);
    float *grid = randn(16 * 2, 21, 1.0f, 0.0f);
    kv_higgs h = {.dim = 2, .size = 16, .group = (int)g, .norm_type = KV_PARAM_F16, .seed = 12345, .grid = grid};
    float *x = randn(tokens * C, 600 + (uint64_t)_i, 1.5f, 0.2f), *xh = malloc(tokens * hd * sizeof *xh);
    float *y = malloc(tokens * C * sizeof *y), *yh = malloc(tokens * hd * sizeof *yh);
    uint32_t *idx = calloc(tokens * C, sizeof *idx), *idxh = calloc(tokens * hd, sizeof *idxh);
    uint16_t *norms = malloc(tokens * C / g * sizeof *norms), *normsh = malloc(tokens * hd / g * sizeof *normsh);
    float *q = randn(hd, 5, 1.0f, 0.0f), *sch = malloc(tokens * sizeof *sch);
    ck_assert_kv_ok(kv_higgs_encode_ref(idx, norms, &h, tokens, C, x));
    ck_assert_kv_ok(kv_higgs_decode_ref(y, &h, tokens, C, idx, norms));
    uint8_t *code = malloc(tokens * C / 2), *codeh = malloc(tokens * hd / 2);
    ck_assert_kv_ok(kv_unpack_ref(code, idx, tokens * C / 2, 4, 0));
    for (size_t head = 0; head < heads; head++) {
        kv_higgs hh = h;
        hh.channel0 = head * hd;
        for (size_t t = 0; t < tokens; t++) memcpy(xh + t * hd, x + t * C + head * hd, hd * sizeof *xh);
        ck_assert_kv_ok(kv_higgs_encode_ref(idxh, normsh, &hh, tokens, hd, xh));
        ck_assert_kv_ok(kv_higgs_decode_ref(yh, &hh, tokens, hd, idxh, normsh));
        ck_assert_kv_ok(kv_unpack_ref(codeh, idxh, tokens * hd / 2, 4, 0));
        for (size_t t = 0; t < tokens; t++) {
            ck_assert_int_eq(memcmp(codeh + t * hd / 2, code + (t * C + head * hd) / 2, hd / 2), 0);
            ck_assert_int_eq(memcmp(normsh + t * hd / g, norms + (t * C + head * hd) / g, hd / g * sizeof *norms), 0);
            ck_assert_int_eq(memcmp(yh + t * hd, y + t * C + head * hd, hd * sizeof *y), 0);
        }
        /* scores: the head's block against the head's query equal the decoded dot products' */
        ck_assert_kv_ok(kv_higgs_scores_ref(sch, &hh, tokens, hd, idxh, normsh, q));
        for (size_t t = 0; t < tokens; t++) {
            double d = 0, a = 0;
            for (size_t c = 0; c < hd; c++) d += (double)q[c] * yh[t * hd + c], a += fabs((double)q[c] * yh[t * hd + c]);
            ck_assert_double_le(fabs(sch[t] - d), 1e-5 * a + 1e-6); /* float sums of 64 terms, rotated domain */
        }
        if (head == 1) { /* without the offset the signs are another head's: different codes */
            hh.channel0 = 0;
            ck_assert_kv_ok(kv_higgs_encode_ref(idxh, normsh, &hh, tokens, hd, xh));
            ck_assert_kv_ok(kv_unpack_ref(codeh, idxh, tokens * hd / 2, 4, 0));
            ck_assert_int_ne(memcmp(codeh, code + hd / 2, hd / 2), 0);
        }
    }
    kv_simd_level_limit(KV_SIMD_AVX2);
    free(grid), free(x), free(xh), free(y), free(yh), free(idx), free(idxh), free(norms), free(normsh);
    free(q), free(sch), free(code), free(codeh);
}
END_TEST

/* ---- SQuat --------------------------------------------------------------------------------------- */
/* A rank-r query matrix Q[n][d] = A[n][r] B[r][d] (so the subspace is exact), scaled. */
static float *lowrank_queries(size_t n, int d, int r, uint64_t seed, float scale) {
    float *a = randn(n * (size_t)r, seed, 1.0f, 0.0f), *b = randn((size_t)r * (size_t)d, seed + 1, scale, 0.0f);
    float *q = calloc(n * (size_t)d, sizeof *q);
    for (size_t i = 0; i < n; i++)
        for (int k = 0; k < r; k++)
            for (int j = 0; j < d; j++) q[i * (size_t)d + (size_t)j] += a[i * (size_t)r + (size_t)k] * b[(size_t)k * (size_t)d + (size_t)j];
    free(a);
    free(b);
    return q;
}

START_TEST(squat_subspace_svd) {
    const size_t n = 50;
    const int d = 16, r = 3;
    float *q = lowrank_queries(n, d, r, 11, 1.0f), *qh = malloc((size_t)r * (size_t)d * sizeof *qh);
    ck_assert_kv_ok(kv_squat_subspace_ref(qh, q, n, d, r));
    /* rank r: Qh^T Qh = Q^T Q exactly (up to rounding); rows orthogonal, norms decreasing */
    for (int i = 0; i < d; i++)
        for (int j = 0; j < d; j++) {
            double a = 0.0, b = 0.0, mag = 0.0;
            for (size_t t = 0; t < n; t++) {
                a += (double)q[t * (size_t)d + (size_t)i] * q[t * (size_t)d + (size_t)j];
                mag += fabs((double)q[t * (size_t)d + (size_t)i] * q[t * (size_t)d + (size_t)j]);
            }
            for (int k = 0; k < r; k++) b += (double)qh[k * d + i] * qh[k * d + j];
            ck_assert_double_eq_tol(a, b, 1e-5 * mag + 1e-6);
        }
    for (int k = 0; k + 1 < r; k++) {
        double dot = 0.0, n0 = 0.0, n1 = 0.0;
        for (int j = 0; j < d; j++) {
            dot += (double)qh[k * d + j] * qh[(k + 1) * d + j];
            n0 += (double)qh[k * d + j] * qh[k * d + j];
            n1 += (double)qh[(k + 1) * d + j] * qh[(k + 1) * d + j];
        }
        ck_assert_double_le(fabs(dot), 1e-4 * sqrt(n0 * n1));
        ck_assert_double_ge(n0, n1);
    }
    ck_assert_int_eq(kv_squat_subspace_ref(qh, q, n, d, 0), KV_EINVAL);
    ck_assert_int_eq(kv_squat_subspace_ref(qh, q, 2, d, 3), KV_EINVAL);
    free(q);
    free(qh);
}
END_TEST

START_TEST(squat_lambda_zero_is_plain) {
    const int d = 40; /* not a multiple of the block */
    const size_t T = 45;
    float *q = lowrank_queries(30, d, 4, 3, 1.0f), *qh = malloc(4 * (size_t)d * sizeof *qh);
    ck_assert_kv_ok(kv_squat_subspace_ref(qh, q, 30, d, 4));
    kv_squat *s = NULL;
    ck_assert_kv_ok(kv_squat_create(&s, qh, 4, d, 0.0f, 16));
    const kv_uniform u = {.bits = 2, .group = 32, .axis = KV_AXIS_TOKENS, .param_type = KV_PARAM_F16};
    kv_quant qd = {.kind = KV_QUANT_UNIFORM, .uniform = u};
    kv_block_storage bs;
    ck_assert_kv_ok(kv_quant_storage(&bs, &qd, T, (size_t)d));
    float *x = randn(T * (size_t)d, 8, 1.0f, 0.0f);
    uint32_t *w1 = malloc(bs.code_words * 4), *w2 = malloc(bs.code_words * 4);
    uint8_t *s1 = malloc(bs.scale_bytes), *s2 = malloc(bs.scale_bytes), *z1 = malloc(bs.zero_bytes), *z2 = malloc(bs.zero_bytes);
    ck_assert_kv_ok(kv_squat_encode_ref(w1, s1, z1, s, &u, T, x));
    ck_assert_kv_ok(kv_uniform_encode_ref(w2, s2, z2, &u, T, (size_t)d, x));
    ck_assert_int_eq(memcmp(w1, w2, bs.code_bytes), 0);
    ck_assert_int_eq(memcmp(s1, s2, bs.scale_bytes), 0);
    ck_assert_int_eq(memcmp(z1, z2, bs.zero_bytes), 0);
    kv_uniform bad = u;
    bad.axis = KV_AXIS_CHANNELS;
    ck_assert_int_eq(kv_squat_encode_ref(w1, s1, z1, s, &bad, T, x), KV_EINVAL);
    kv_squat_free(s);
    free(q);
    free(qh);
    free(x);
    free(w1);
    free(w2);
    free(s1);
    free(s2);
    free(z1);
    free(z2);
}
END_TEST

/* Lemma 2 against the constrained least-squares problem solved directly: minimize
 * delta^T P delta subject to delta[0:e_{t-1}] = 0, delta[e_{t-1}:e_t] = err; the free part solves
 * P_rr delta_r = -P_rf err. */
typedef struct lemma_case {
    int d, r, g;
    float lambda;
} lemma_case;
static const lemma_case k_lemma[] = {{16, 3, 4, 0.5f}, {24, 5, 8, 2.0f}, {13, 2, 5, 1.0f}, {32, 8, 1, 0.1f}, {64, 5, 16, 0.01f}};

START_TEST(squat_lemma2_equals_direct_solve) {
    const lemma_case *k = &k_lemma[_i];
    const int d = k->d;
    float *qh = randn((size_t)k->r * (size_t)d, 21 + (uint64_t)_i, 1.0f, 0.0f);
    kv_squat *s = NULL;
    ck_assert_kv_ok(kv_squat_create(&s, qh, k->r, d, k->lambda, k->g));
    double *p = malloc((size_t)d * (size_t)d * sizeof *p);
    for (int i = 0; i < d; i++)
        for (int j = 0; j < d; j++) {
            double acc = 0.0;
            for (int m = 0; m < k->r; m++) acc += (double)qh[m * d + i] * qh[m * d + j];
            p[i * d + j] = (i == j) + (double)k->lambda * acc;
        }
    const int nb = (d + k->g - 1) / k->g;
    for (int t = 1; t < nb; t++) {
        const int e0 = (t - 1) * k->g, e = t * k->g < d ? t * k->g : d, gt = e - e0, nr = d - e;
        float *err = randn((size_t)gt, 300 + (uint64_t)t, 1.0f, 0.0f);
        float *rest = calloc((size_t)nr, sizeof *rest);
        ck_assert_kv_ok(kv_squat_update_ref(rest, s, t, err));
        double *a = malloc((size_t)nr * (size_t)nr * sizeof *a), *b = malloc((size_t)nr * sizeof *b);
        for (int i = 0; i < nr; i++) {
            for (int j = 0; j < nr; j++) a[i * nr + j] = p[(e + i) * d + e + j];
            double acc = 0.0;
            for (int j = 0; j < gt; j++) acc += p[(e + i) * d + e0 + j] * err[j];
            b[i] = -acc;
        }
        ck_assert_int_eq(LAPACKE_dposv(LAPACK_ROW_MAJOR, 'L', nr, 1, a, nr, b, 1), 0);
        for (int i = 0; i < nr; i++) ck_assert_double_eq_tol(rest[i], b[i], 1e-4 * (1.0 + fabs(b[i])));
        free(err);
        free(rest);
        free(a);
        free(b);
    }
    ck_assert_int_eq(kv_squat_update_ref(NULL, s, 0, NULL), KV_EINVAL);
    kv_squat_free(s);
    free(qh);
    free(p);
}
END_TEST

/* The chunk-wide encoder (kv_squat_encode_ref: the error propagation as one GEMM per block over all
 * tokens) gives kv_squat_encode_loop's bits at every SIMD level: both accumulate each updated
 * coordinate in the same order without contraction, so no tolerance is needed. Cases: blocks
 * dividing d or not, g = 1 and g = d (no update), token counts that leave partial token groups and
 * partial 4-token tiles, several token tiles, the 11-per-word 3-bit packing, XQuant eta, f16 and f32 parameters, and
 * coordinates left after a block that are not a multiple of the 16-wide AVX2 step. */
typedef struct sq_fast_case {
    int d, r, g, group, bits, pack11, ptype;
    size_t tokens;
    float lambda, eta;
} sq_fast_case;
static const sq_fast_case k_sq_fast[] = {
    {128, 5, 64, 64, 2, 0, KV_PARAM_F16, 300, 1e-3f, 0.0f}, {64, 5, 16, 32, 4, 0, KV_PARAM_F32, 101, 0.05f, 0.0f},
    {40, 4, 16, 32, 3, 1, KV_PARAM_F16, 45, 0.5f, 0.0f},    {13, 2, 5, 7, 3, 0, KV_PARAM_F32, 23, 1.0f, 0.1f},
    {64, 8, 1, 16, 2, 0, KV_PARAM_F32, 37, 0.1f, 0.0f},     {64, 5, 64, 32, 2, 0, KV_PARAM_F16, 64, 0.1f, 0.0f},
    {96, 6, 8, 128, 2, 0, KV_PARAM_F16, 130, 2e-3f, 0.2f},  {48, 3, 16, 32, 8, 0, KV_PARAM_F32, 3, 0.3f, 0.0f},
    {32, 3, 8, 24, 2, 0, KV_PARAM_F32, 1000, 0.05f, 0.0f}, /* tiles of 264 tokens (11 groups of 24), a partial last group */
};

START_TEST(squat_chunk_encoder_matches_loop) {
    const sq_fast_case *k = &k_sq_fast[_i / 3];
    kv_simd_level_limit(k_levels[_i % 3]);
    const int d = k->d;
    /* queries with a strong spectrum so that lambda moves the keys a lot (large updates) */
    float *q = lowrank_queries(3 * (size_t)k->r + 7, d, k->r, 40 + (uint64_t)_i, 3.0f);
    float *qh = malloc((size_t)k->r * (size_t)d * sizeof *qh);
    ck_assert_kv_ok(kv_squat_subspace_ref(qh, q, 3 * (size_t)k->r + 7, d, k->r));
    kv_squat *s = NULL;
    ck_assert_kv_ok(kv_squat_create(&s, qh, k->r, d, k->lambda, k->g));
    const kv_uniform u = {.bits = k->bits, .group = k->group, .axis = KV_AXIS_TOKENS, .eta = k->eta,
                          .pack11 = k->pack11, .param_type = (kv_param_type)k->ptype};
    kv_quant qd = {.kind = KV_QUANT_UNIFORM, .uniform = u};
    kv_block_storage bs;
    ck_assert_kv_ok(kv_quant_storage(&bs, &qd, k->tokens, (size_t)d));
    float *x = randn(k->tokens * (size_t)d, 70 + (uint64_t)_i, 1.0f, 0.0f);
    uint32_t *w1 = calloc(bs.code_words + 1, 4), *w2 = calloc(bs.code_words + 1, 4);
    uint8_t *s1 = calloc(bs.scale_bytes + 1, 1), *s2 = calloc(bs.scale_bytes + 1, 1);
    uint8_t *z1 = calloc(bs.zero_bytes + 1, 1), *z2 = calloc(bs.zero_bytes + 1, 1);
    ck_assert_kv_ok(kv_squat_encode_loop(w1, s1, z1, s, &u, k->tokens, x));
    ck_assert_kv_ok(kv_squat_encode_ref(w2, s2, z2, s, &u, k->tokens, x));
    ck_assert_msg(memcmp(w1, w2, bs.code_bytes) == 0, "codes differ (case %d, level %d)", _i / 3, _i % 3);
    ck_assert_msg(memcmp(s1, s2, bs.scale_bytes) == 0, "scales differ (case %d, level %d)", _i / 3, _i % 3);
    ck_assert_msg(memcmp(z1, z2, bs.zero_bytes) == 0, "zero points differ (case %d, level %d)", _i / 3, _i % 3);
    /* the same keys as columns [d, 2d) of a 3d-channel block (the runtime's per-KV-head call): the
     * head's codes, scales and zero points land where the block's layout puts channels d..2d-1 (not
     * with the 11-per-word packing, whose clamped slot 10 depends on the stream position, which
     * differs between the two layouts: the runtime's replay covers that packing) */
    if (k->pack11) goto level_done;
    const size_t C = 3 * (size_t)d, n3 = k->tokens * C;
    float *x3 = calloc(n3, sizeof *x3);
    for (size_t t = 0; t < k->tokens; t++) memcpy(x3 + t * C + d, x + t * (size_t)d, (size_t)d * sizeof *x3);
    kv_block_storage b3;
    ck_assert_kv_ok(kv_quant_storage(&b3, &qd, k->tokens, C));
    uint8_t *cs = calloc(n3, 1);
    float *sc3 = calloc(b3.groups, sizeof(float)), *zr3 = calloc(b3.groups, sizeof(float));
    ck_assert_kv_ok(kv_squat_encode_cols(cs, sc3, zr3, s, &u, k->tokens, C, (size_t)d, x3 + d, C));
    uint8_t *c1 = malloc(k->tokens * (size_t)d);
    kv_unpack_range(c1, w1, 0, k->tokens * (size_t)d, k->bits, kv_qm_per_word(k->bits, k->pack11));
    const size_t G = (size_t)k->group, ps = k->ptype == KV_PARAM_F16 ? 2 : 4;
    for (size_t kg = 0; kg * G < k->tokens; kg++) {
        const size_t rows = kv_qm_tok_group_rows(G, k->tokens, kg);
        /* a token group's channel c is a run of `rows` codes at kg*G*C + c*rows */
        ck_assert_int_eq(memcmp(cs + kg * G * C + (size_t)d * rows, c1 + kg * G * (size_t)d, (size_t)d * rows), 0);
        ck_assert_int_eq(memcmp((uint8_t *)sc3 + (kg * C + (size_t)d) * ps, s1 + kg * (size_t)d * ps, (size_t)d * ps), 0);
        ck_assert_int_eq(memcmp((uint8_t *)zr3 + (kg * C + (size_t)d) * ps, z1 + kg * (size_t)d * ps, (size_t)d * ps), 0);
    }
    ck_assert_int_eq(kv_squat_encode_cols(cs, sc3, zr3, s, &u, k->tokens, C, 2 * (size_t)d + 1, x3, C), KV_EINVAL);
    free(x3);
    free(cs);
    free(sc3);
    free(zr3);
    free(c1);
level_done:
    kv_simd_level_limit(KV_SIMD_AVX2);
    kv_squat_free(s);
    free(q);
    free(qh);
    free(x);
    free(w1);
    free(w2);
    free(s1);
    free(s2);
    free(z1);
    free(z2);
}
END_TEST

START_TEST(squat_lowers_projected_error) {
    const int d = 64, r = 5;
    const size_t T = 256, nq = 200;
    /* queries in a 5-dim subspace; lambda * sigma^2 ~ 10 so the constraint matters */
    float *q = lowrank_queries(nq, d, r, 5, 0.3f), *qh = malloc((size_t)r * (size_t)d * sizeof *qh);
    ck_assert_kv_ok(kv_squat_subspace_ref(qh, q, nq, d, r));
    double s0 = 0.0;
    for (int j = 0; j < d; j++) s0 += (double)qh[j] * qh[j];
    const float lambda = (float)(10.0 / s0);
    kv_squat *s = NULL;
    ck_assert_kv_ok(kv_squat_create(&s, qh, r, d, lambda, 16));
    const kv_uniform u = {.bits = 2, .group = 32, .axis = KV_AXIS_TOKENS, .param_type = KV_PARAM_F32};
    kv_quant qd = {.kind = KV_QUANT_UNIFORM, .uniform = u};
    kv_block_storage bs;
    ck_assert_kv_ok(kv_quant_storage(&bs, &qd, T, (size_t)d));
    float *x = randn(T * (size_t)d, 6, 1.0f, 0.0f), *y1 = malloc(T * (size_t)d * 4), *y2 = malloc(T * (size_t)d * 4);
    uint32_t *w = malloc(bs.code_words * 4);
    float *sc = malloc(bs.scale_bytes), *zr = malloc(bs.zero_bytes);
    ck_assert_kv_ok(kv_squat_encode_ref(w, sc, zr, s, &u, T, x));
    ck_assert_kv_ok(kv_uniform_decode_ref(y1, &u, T, (size_t)d, w, sc, zr));
    ck_assert_kv_ok(kv_uniform_encode_ref(w, sc, zr, &u, T, (size_t)d, x));
    ck_assert_kv_ok(kv_uniform_decode_ref(y2, &u, T, (size_t)d, w, sc, zr));
    double proj1 = 0.0, proj2 = 0.0, e1 = 0.0, e2 = 0.0;
    for (size_t t = 0; t < T; t++)
        for (int k = 0; k < r; k++) {
            double a = 0.0, b = 0.0;
            for (int j = 0; j < d; j++) {
                a += (double)qh[k * d + j] * (x[t * (size_t)d + (size_t)j] - y1[t * (size_t)d + (size_t)j]);
                b += (double)qh[k * d + j] * (x[t * (size_t)d + (size_t)j] - y2[t * (size_t)d + (size_t)j]);
            }
            proj1 += a * a;
            proj2 += b * b;
        }
    for (size_t i = 0; i < T * (size_t)d; i++) {
        e1 += (double)(x[i] - y1[i]) * (x[i] - y1[i]);
        e2 += (double)(x[i] - y2[i]) * (x[i] - y2[i]);
    }
    /* SQuat trades plain error for error orthogonal to the query subspace */
    ck_assert_msg(proj1 < 0.7 * proj2, "projected error squat %g vs plain %g", proj1, proj2);
    ck_assert(e1 < 3.0 * e2);
    kv_squat_free(s);
    free(q);
    free(qh);
    free(x);
    free(y1);
    free(y2);
    free(w);
    free(sc);
    free(zr);
}
END_TEST

int main(void) {
    Suite *s = suite_create("kernels");
    TCase *tc = tcase_create("pack");
    tcase_add_loop_test(tc, pack_roundtrip_every_width, 0, 9 * (int)(sizeof k_pack_sizes / sizeof k_pack_sizes[0]));
    tcase_add_test(tc, pack_hand_made_layouts);
    suite_add_tcase(s, tc);
    tc = tcase_create("uniform");
    tcase_add_test(tc, uniform_exact_codes_values_axis);
    tcase_add_test(tc, uniform_exact_codes_keys_axis);
    tcase_add_loop_test(tc, uniform_roundtrip_bound, 0, (int)(sizeof k_rt / sizeof k_rt[0]));
    tcase_add_test(tc, uniform_shared_codes_decode);
    tcase_add_test(tc, uniform_errors);
    tcase_add_loop_test(tc, uniform_sse2_matches_portable, 0, (int)(sizeof k_sse2 / sizeof k_sse2[0]));
    tcase_add_test(tc, storage_hand_computed);
    suite_add_tcase(s, tc);
    tc = tcase_create("higgs");
    tcase_set_timeout(tc, 120);
    tcase_add_loop_test(tc, fwht_matches_explicit_hadamard, 0, 10);
    tcase_add_loop_test(tc, fwht_fast_is_bit_identical, 0, 3);
    tcase_add_loop_test(tc, higgs_matches_element_math, 0, 6 * 3);
    tcase_add_loop_test(tc, higgs_gaussian_mse_matches_grid, 0, (int)(sizeof k_higgs / sizeof k_higgs[0]));
    tcase_add_test(tc, grid_search_equals_exhaustive);
    tcase_add_loop_test(tc, grid_search_many_equals_exhaustive, 0, 3 * 6);
    tcase_add_test(tc, higgs_details);
    tcase_add_loop_test(tc, higgs_channel_offset, 0, 9);
    suite_add_tcase(s, tc);
    tc = tcase_create("squat");
    tcase_add_test(tc, squat_subspace_svd);
    tcase_add_test(tc, squat_lambda_zero_is_plain);
    tcase_add_loop_test(tc, squat_lemma2_equals_direct_solve, 0, (int)(sizeof k_lemma / sizeof k_lemma[0]));
    tcase_add_test(tc, squat_lowers_projected_error);
    tcase_add_loop_test(tc, squat_chunk_encoder_matches_loop, 0, 3 * (int)(sizeof k_sq_fast / sizeof k_sq_fast[0]));
    suite_add_tcase(s, tc);
    return kv_test_run(s);
}
