/* kernels/: FP8 (E4M3, E5M2) and NVFP4 (E2M1 + E4M3 block scales) — every representable value of
 * each element format against its definition (OCP OFP8 rev. 1.0; NVIDIA cuda_fp8.h / cuda_fp4.h,
 * __NV_SATFINITE; kernels/FLOAT_KV.md), round to nearest even at every midpoint, saturation and NaN,
 * an exhaustive nearest-value oracle over every binary16 value, then the quantizers built on them. */
#include "kv_test.h"
#include "kv_kernels_internal.h"
#include "kv_quant_math.h"
#include "kvrt.h"

#include <float.h>
#include <math.h>

/* One element format: width, field widths, the functions under test. */
typedef struct fmt_case {
    const char *name;
    int bits, M, B;       /* code width, mantissa bits, exponent bias */
    double max;           /* largest finite value */
    int has_inf;          /* E5M2: S.11111.00 */
    uint32_t nan_code;    /* canonical NaN code of a conversion (E2M1: +6, no NaN) */
    float (*to_f32)(uint32_t);
    uint32_t (*from_f32)(float);
} fmt_case;

static float e4m3_to(uint32_t c) { return kv_qm_e4m3_to_f32(c); }
static float e5m2_to(uint32_t c) { return kv_qm_e5m2_to_f32(c); }
static float e2m1_to(uint32_t c) { return kv_qm_e2m1_to_f32(c); }
static uint32_t e4m3_from(float x) { return kv_qm_e4m3_from_f32(x); }
static uint32_t e5m2_from(float x) { return kv_qm_e5m2_from_f32(x); }
static uint32_t e2m1_from(float x) { return kv_qm_e2m1_from_f32(x); }

static const fmt_case k_fmt[] = {
    {"e4m3", 8, 3, 7, 448.0, 0, 0x7f, e4m3_to, e4m3_from},
    {"e5m2", 8, 2, 15, 57344.0, 1, 0x7f, e5m2_to, e5m2_from},
    {"e2m1", 4, 1, 1, 6.0, 0, 0x7, e2m1_to, e2m1_from},
};

/* The definition, in double: sign, exponent field E, mantissa m; E = 0 subnormal. Returns 0 for a
 * finite value, 1 for NaN, 2 for an infinity (*v signed). */
static int spec_value(const fmt_case *f, uint32_t code, double *v) {
    const int E_bits = f->bits - 1 - f->M;
    const uint32_t sign = code >> (f->bits - 1), E = (code >> f->M) & ((1u << E_bits) - 1u), m = code & ((1u << f->M) - 1u);
    const uint32_t Emax = (1u << E_bits) - 1u;
    if (f->bits == 8 && f->has_inf && E == Emax) {
        *v = sign ? -INFINITY : INFINITY;
        return m ? 1 : 2;
    }
    if (f->bits == 8 && !f->has_inf && E == Emax && m == (1u << f->M) - 1u) return 1; /* E4M3: S.1111.111 */
    const double mag = E == 0 ? ldexp((double)m, 1 - f->B - f->M) : ldexp((double)((1u << f->M) | m), (int)E - f->B - f->M);
    *v = sign ? -mag : mag;
    return 0;
}

START_TEST(decode_every_code) {
    const fmt_case *f = &k_fmt[_i];
    const uint32_t n = 1u << f->bits;
    int nans = 0;
    for (uint32_t c = 0; c < n; c++) {
        double v;
        const int kind = spec_value(f, c, &v);
        const float got = f->to_f32(c);
        if (kind == 1) {
            ck_assert_msg(isnan(got), "%s code 0x%02x: NaN expected, got %g", f->name, c, (double)got);
            nans++;
            continue;
        }
        ck_assert_msg((double)got == v && !signbit(got) == !signbit(v), "%s code 0x%02x: %.9g, definition %.9g", f->name, c,
                      (double)got, v);
    }
    /* NaN codes: E4M3 0x7f, 0xff; E5M2 0x7d-0x7f, 0xfd-0xff; E2M1 none */
    ck_assert_int_eq(nans, f->bits == 4 ? 0 : f->has_inf ? 6 : 2);
}
END_TEST

/* Hand-written values from the definitions (OFP8 table 1; NVFP4 E2M1 value set). */
START_TEST(decode_hand_values) {
    ck_assert_float_eq(kv_qm_e4m3_to_f32(0x7e), 448.0f);
    ck_assert_float_eq(kv_qm_e4m3_to_f32(0xfe), -448.0f);
    ck_assert_float_eq(kv_qm_e4m3_to_f32(0x08), 0.015625f);     /* 2^-6, smallest normal */
    ck_assert_float_eq(kv_qm_e4m3_to_f32(0x01), 0.001953125f);  /* 2^-9, smallest subnormal */
    ck_assert_float_eq(kv_qm_e4m3_to_f32(0x38), 1.0f);
    ck_assert(isnan(kv_qm_e4m3_to_f32(0x7f)) && isnan(kv_qm_e4m3_to_f32(0xff)));
    ck_assert_float_eq(kv_qm_e5m2_to_f32(0x7b), 57344.0f);
    ck_assert_float_eq(kv_qm_e5m2_to_f32(0x3c), 1.0f);
    ck_assert_float_eq(kv_qm_e5m2_to_f32(0x01), 1.52587890625e-05f); /* 2^-16 */
    ck_assert(isinf(kv_qm_e5m2_to_f32(0x7c)) && kv_qm_e5m2_to_f32(0xfc) < 0.0f);
    ck_assert(isnan(kv_qm_e5m2_to_f32(0x7d)) && isnan(kv_qm_e5m2_to_f32(0xff)));
    static const float e2m1[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
    for (uint32_t c = 0; c < 8; c++) {
        ck_assert_float_eq(kv_qm_e2m1_to_f32(c), e2m1[c]);
        ck_assert_float_eq(kv_qm_e2m1_to_f32(c | 8u), -e2m1[c]);
    }
    ck_assert(signbit(kv_qm_e2m1_to_f32(8)) && signbit(kv_qm_e4m3_to_f32(0x80)));
}
END_TEST

/* Every finite code converts back to itself; every midpoint between neighbours rounds to the even
 * code, the floats just beside it to the nearer code; both signs. */
START_TEST(encode_every_code_and_midpoint) {
    const fmt_case *f = &k_fmt[_i];
    const uint32_t half = 1u << (f->bits - 1), sign = half;
    for (uint32_t c = 0; c < 2 * half; c++) {
        double v;
        if (spec_value(f, c, &v) != 0) continue;
        ck_assert_msg(f->from_f32((float)v) == c, "%s: value %g of code 0x%02x converts to 0x%02x", f->name, v, c,
                      f->from_f32((float)v));
    }
    /* positive magnitudes are increasing in the code: neighbours are c, c + 1 */
    for (uint32_t c = 0; c + 1 < half; c++) {
        double a, b;
        if (spec_value(f, c, &a) != 0 || spec_value(f, c + 1, &b) != 0) continue;
        ck_assert(b > a);
        const float mid = (float)((a + b) / 2.0); /* at most M + 2 significant bits: exact */
        ck_assert((double)mid == (a + b) / 2.0);
        const uint32_t even = (c % 2 == 0) ? c : c + 1;
        ck_assert_msg(f->from_f32(mid) == even, "%s: midpoint %g of 0x%02x/0x%02x -> 0x%02x", f->name, (double)mid, c, c + 1,
                      f->from_f32(mid));
        ck_assert_uint_eq(f->from_f32(-mid), even | sign);
        ck_assert_uint_eq(f->from_f32(nextafterf(mid, 0.0f)), c);
        ck_assert_uint_eq(f->from_f32(nextafterf(mid, INFINITY)), c + 1);
        ck_assert_uint_eq(f->from_f32(-nextafterf(mid, 0.0f)), c | sign);
        ck_assert_uint_eq(f->from_f32(-nextafterf(mid, INFINITY)), (c + 1) | sign);
    }
}
END_TEST

/* Saturation (__NV_SATFINITE, OFP8 "saturating" conversion) and NaN. */
START_TEST(encode_saturation_and_nan) {
    const fmt_case *f = &k_fmt[_i];
    const uint32_t sign = 1u << (f->bits - 1);
    const uint32_t maxc = f->from_f32((float)f->max);
    ck_assert_float_eq(f->to_f32(maxc), (float)f->max);
    const float above[] = {nextafterf((float)f->max, INFINITY), (float)f->max * 1.03f, (float)f->max * 2.0f, 1e30f, FLT_MAX,
                           INFINITY};
    for (size_t i = 0; i < sizeof above / sizeof above[0]; i++) {
        ck_assert_uint_eq(f->from_f32(above[i]), maxc);
        ck_assert_uint_eq(f->from_f32(-above[i]), maxc | sign);
    }
    ck_assert_uint_eq(f->from_f32(NAN), f->nan_code);
    ck_assert_uint_eq(f->from_f32(-NAN), f->nan_code);
    /* below half the smallest subnormal: zero of the same sign; f32 subnormals too */
    double tiny;
    ck_assert_int_eq(spec_value(f, 1, &tiny), 0);
    ck_assert_uint_eq(f->from_f32((float)(tiny / 2.0)), 0u); /* a tie: to even (zero) */
    ck_assert_uint_eq(f->from_f32(nextafterf((float)(tiny / 2.0), 1.0f)), 1u);
    ck_assert_uint_eq(f->from_f32(1e-42f), 0u);
    ck_assert_uint_eq(f->from_f32(-1e-42f), sign);
    ck_assert_uint_eq(f->from_f32(-0.0f), sign);
}
END_TEST

/* Independent oracle: the nearest finite value by exhaustive scan (ties: the even code), values
 * beyond the largest saturating; over every finite binary16 value scaled into the format's range and
 * 200000 random f32 values. */
static uint32_t oracle(const fmt_case *f, float x) {
    const uint32_t sign = 1u << (f->bits - 1);
    const double a = fabs((double)x);
    uint32_t best = 0;
    double bd = INFINITY;
    for (uint32_t c = 0; c < sign; c++) {
        double v;
        if (spec_value(f, c, &v) != 0) continue;
        const double d = fabs(v - a);
        if (d < bd || (d == bd && c % 2 == 0)) {
            bd = d;
            best = c;
        }
    }
    return best | (signbit(x) ? sign : 0u);
}

START_TEST(encode_matches_oracle) {
    const fmt_case *f = &k_fmt[_i];
    /* binary16 covers 2^-24 .. 65504 with 11 significant bits; E2M1's range is small: scale it down */
    const float mul = f->bits == 4 ? 1.0f / 4096.0f : 1.0f;
    for (uint32_t h = 0; h < 65536; h++) {
        if ((h & 0x7c00u) == 0x7c00u) continue;
        const float x = kv_f16_to_f32((uint16_t)h) * mul;
        ck_assert_msg(f->from_f32(x) == oracle(f, x), "%s: %.9g -> 0x%02x, oracle 0x%02x", f->name, (double)x,
                      f->from_f32(x), oracle(f, x));
    }
    kv_rng r;
    kv_rng_init(&r, 20u + (uint64_t)_i);
    for (int i = 0; i < 200000; i++) {
        const float x = (float)(kv_rng_next_normal(&r) * ldexp(1.0, (int)(kv_rng_next_u64(&r) % 40) - 20));
        ck_assert_msg(f->from_f32(x) == oracle(f, x), "%s: %.9g -> 0x%02x, oracle 0x%02x", f->name, (double)x,
                      f->from_f32(x), oracle(f, x));
    }
}
END_TEST

/* ---- quantizers ------------------------------------------------------------------------------------ */
typedef struct fpq_case {
    kv_fp_format format;
    size_t T, C;
    int per_head; /* 0: one scale; else scale_channels */
} fpq_case;

static const fpq_case k_q[] = {
    {KV_FP_E4M3, 1, 1, 0},   {KV_FP_E4M3, 7, 13, 0},  {KV_FP_E4M3, 33, 64, 16}, {KV_FP_E5M2, 5, 31, 0},
    {KV_FP_E5M2, 17, 48, 24}, {KV_FP_NVFP4, 1, 16, 0}, {KV_FP_NVFP4, 9, 40, 0},  {KV_FP_NVFP4, 12, 64, 32},
    {KV_FP_NVFP4, 3, 7, 0},  {KV_FP_E4M3, 0, 8, 0},
};

static void make_scales(float *s, int n, uint64_t seed) {
    kv_rng r;
    kv_rng_init(&r, seed);
    for (int i = 0; i < n; i++) s[i] = (float)(0.01 + kv_rng_next_uniform(&r));
}

/* Round trip of Gaussian data with a few outliers: decode = fp(code) * scale exactly as the element
 * math says, and the error within half a step of the format at that value:
 *   FP8: |x - x_hat| <= 2^-(M+1) |x| (normal) or 2^-(M+1) * 2^(1-B) * S (subnormal range), relative
 *   slack 1e-6 for the rounding of x / S; values beyond max * S saturate (error |x| - max * S);
 *   NVFP4: |x - x_hat| <= d (half of E2M1's widest step, 2, times the block multiplier d), plus the
 *   clamp of x / d in (6, 6.375] when the block scale rounds down (E4M3 step 2^-3 relative: < d). */
START_TEST(fpq_roundtrip) {
    const fpq_case *c = &k_q[_i];
    const size_t n = c->T * c->C;
    float scales[8];
    const int ns = c->per_head ? (int)(c->C / (size_t)c->per_head) : 1;
    make_scales(scales, ns, 7u + (uint64_t)_i);
    kv_fpq q = {.format = c->format, .n_scales = ns, .scale_channels = c->per_head, .scales = scales};
    kv_quant kq = {.kind = KV_QUANT_FP, .fp = q};
    kv_block_storage st;
    ck_assert_kv_ok(kv_quant_storage(&st, &kq, c->T, c->C));
    float *x = malloc((n ? n : 1) * sizeof *x), *y = malloc((n ? n : 1) * sizeof *y);
    kv_rng r;
    kv_rng_init(&r, 100u + (uint64_t)_i);
    for (size_t i = 0; i < n; i++) x[i] = (float)kv_rng_next_normal(&r) * (i % 29 == 3 ? 40.0f : 1.0f);
    uint32_t *codes = calloc(st.code_words + 1, 4);
    uint8_t *bs = calloc(st.groups + 1, 1);
    ck_assert_kv_ok(kv_fpq_encode_ref(codes, bs, &q, c->T, c->C, x));
    ck_assert_kv_ok(kv_fpq_decode_ref(y, &q, c->T, c->C, codes, bs));
    const int fmt = (int)c->format, bits = kv_qm_fp_bits(fmt), per = kv_qm_per_word(bits, 0);
    const size_t nb = (c->C + 15) / 16;
    for (size_t t = 0; t < c->T; t++)
        for (size_t ch = 0; ch < c->C; ch++) {
            const size_t j = t * c->C + ch;
            const float S = kv_qm_fp_scale(scales, ns, c->per_head, ch);
            const uint32_t code = kv_qm_unpack(codes, j, bits, per);
            const double err = fabs((double)x[j] - y[j]);
            if (fmt == KV_FP_NVFP4) {
                const float d = kv_qm_e4m3_to_f32(bs[t * nb + ch / 16]) * S;
                ck_assert_float_eq(y[j], kv_qm_e2m1_to_f32(code) * d);
                ck_assert_msg(err <= (double)d, "NVFP4 (%zu, %zu): error %g above d = %g", t, ch, err, (double)d);
            } else {
                ck_assert_float_eq(y[j], kv_qm_fp_decode(fmt, code) * S);
                const int M = fmt == KV_FP_E4M3 ? 3 : 2, B = fmt == KV_FP_E4M3 ? 7 : 15;
                const double mx = (double)kv_qm_fp_max(fmt) * S;
                const double bound = fabs((double)x[j]) > mx ? fabs((double)x[j]) - mx + ldexp(mx, -M - 1)
                                                             : fmax(ldexp(fabs((double)x[j]), -M - 1), ldexp((double)S, -M - B));
                ck_assert_msg(err <= bound * (1.0 + 1e-6), "%d (%zu, %zu): x %g error %g bound %g", fmt, t, ch,
                              (double)x[j], err, bound);
            }
        }
    /* unused trailing slots of the last word are zero */
    if (n % (size_t)per) ck_assert_uint_eq(codes[st.code_words - 1] >> ((n % (size_t)per) * (size_t)bits), 0u);
    free(x);
    free(y);
    free(codes);
    free(bs);
}
END_TEST

/* Every FP8 value times the scale encodes to its own code (scale not a power of two: x / S is
 * within an ulp of the value, far nearer to it than to any neighbour). */
START_TEST(fp8_every_value_through_scale) {
    for (int fi = 0; fi < 2; fi++) {
        const int fmt = fi ? KV_FP_E5M2 : KV_FP_E4M3;
        const float S = 0.0371f;
        uint32_t n = 0, codes_in[256];
        float x[256], y[256];
        for (uint32_t c = 0; c < 256; c++) {
            const float v = kv_qm_fp_decode(fmt, c);
            if (!isfinite(v)) continue;
            codes_in[n] = c;
            x[n++] = v * S;
        }
        kv_fpq q = {.format = (kv_fp_format)fmt, .n_scales = 1, .scales = &S};
        uint32_t words[64];
        ck_assert_kv_ok(kv_fpq_encode_ref(words, NULL, &q, 1, n, x));
        ck_assert_kv_ok(kv_fpq_decode_ref(y, &q, 1, n, words, NULL));
        for (uint32_t i = 0; i < n; i++) {
            ck_assert_uint_eq(kv_qm_unpack(words, i, 8, 4), codes_in[i]);
            ck_assert_float_eq(y[i], x[i]);
        }
    }
}
END_TEST

/* NVFP4 by hand: S = 1/448 maps a block maximum of 6 to the block scale 6/6/S = 448 (0x7e). */
START_TEST(nvfp4_hand_made) {
    const float S = 1.0f / 448.0f;
    float x[32] = {6.0f, -3.0f, 1.0f, 0.25f, 0.74f, 5.1f, -6.0f, 2.5f};
    /* second block all zeros: block scale 0, codes 0, decodes to zeros */
    kv_fpq q = {.format = KV_FP_NVFP4, .n_scales = 1, .scales = &S};
    uint32_t w[4];
    uint8_t bs[2];
    float y[32];
    ck_assert_kv_ok(kv_fpq_encode_ref(w, bs, &q, 1, 32, x));
    ck_assert_uint_eq(bs[0], 0x7e);
    ck_assert_uint_eq(bs[1], 0x00);
    /* d = 448 * S = 1: codes of 6, -3, 1, 0.25 (tie 0/0.5 -> 0), 0.74 (-> 0.5), 5.1 (-> 6; 4/6 midpoint 5),
     * -6, 2.5 (tie 2/3 -> 2, even code 4) */
    static const uint32_t want[8] = {0x7, 0xd, 0x2, 0x0, 0x1, 0x7, 0xf, 0x4};
    for (int i = 0; i < 8; i++) ck_assert_uint_eq(kv_qm_unpack(w, (size_t)i, 4, 8), want[i]);
    ck_assert_kv_ok(kv_fpq_decode_ref(y, &q, 1, 32, w, bs));
    ck_assert_float_eq(y[5], 6.0f);
    ck_assert_float_eq(y[7], 2.0f);
    for (int i = 16; i < 32; i++) ck_assert_float_eq(y[i], 0.0f);
    /* a tensor scale far too small saturates the block scale at 448 and the elements at 6 */
    const float tiny = 1e-6f;
    q.scales = &tiny;
    ck_assert_kv_ok(kv_fpq_encode_ref(w, bs, &q, 1, 32, x));
    ck_assert_uint_eq(bs[0], 0x7e);
    ck_assert_uint_eq(kv_qm_unpack(w, 0, 4, 8), 0x7u);
}
END_TEST

START_TEST(fpq_errors_and_storage) {
    float s2[2] = {1.0f, 2.0f}, bad = 0.0f, x[48] = {0};
    uint32_t w[64];
    uint8_t bs[8];
    kv_fpq q = {.format = KV_FP_NVFP4, .n_scales = 2, .scale_channels = 24, .scales = s2};
    ck_assert_int_eq(kv_fpq_encode_ref(w, bs, &q, 1, 48, x), KV_EINVAL); /* 24 % 16 */
    q.format = KV_FP_E4M3;
    ck_assert_kv_ok(kv_fpq_encode_ref(w, bs, &q, 1, 48, x));
    ck_assert_int_eq(kv_fpq_encode_ref(w, bs, &q, 1, 40, x), KV_EINVAL); /* 2 x 24 != 40 */
    q = (kv_fpq){.format = KV_FP_E4M3, .n_scales = 1, .scales = &bad};
    ck_assert_int_eq(kv_fpq_encode_ref(w, bs, &q, 1, 4, x), KV_EINVAL);
    q.scales = s2;
    x[3] = INFINITY;
    ck_assert_int_eq(kv_fpq_encode_ref(w, bs, &q, 1, 4, x), KV_ENUMERIC);
    x[3] = NAN;
    ck_assert_int_eq(kv_fpq_encode_ref(w, bs, &q, 1, 4, x), KV_ENUMERIC);
    q.format = (kv_fp_format)7;
    ck_assert_int_eq(kv_fpq_encode_ref(w, bs, &q, 1, 4, x), KV_EINVAL);
    /* storage: FP8 10 x 11 = 110 codes, 4 per word: 28 words = 112 B, 8.15 bits per value;
     * NVFP4 3 x 40 = 120 codes, 8 per word: 15 words = 60 B, blocks 3 per token = 9 B: 69 B */
    kv_quant kq = {.kind = KV_QUANT_FP, .fp = {.format = KV_FP_E4M3, .n_scales = 1, .scales = s2}};
    kv_block_storage st;
    ck_assert_kv_ok(kv_quant_storage(&st, &kq, 10, 11));
    ck_assert_uint_eq(st.code_words, 28);
    ck_assert_uint_eq(st.total_bytes, 112);
    kq.fp.format = KV_FP_NVFP4;
    ck_assert_kv_ok(kv_quant_storage(&st, &kq, 3, 40));
    ck_assert_uint_eq(st.code_words, 15);
    ck_assert_uint_eq(st.groups, 9);
    ck_assert_uint_eq(st.norm_bytes, 9);
    ck_assert_uint_eq(st.total_bytes, 69);
    /* 64 channels: exactly 4 + 8/16 = 4.5 bits per value */
    ck_assert_kv_ok(kv_quant_storage(&st, &kq, 10, 64));
    ck_assert_double_eq_tol(st.bits_per_value, 4.5, 1e-12);
    /* the generic round trip goes through the same calls */
    float xx[64], yy[64], zz[64];
    kv_rng r;
    kv_rng_init(&r, 5);
    for (int i = 0; i < 64; i++) xx[i] = (float)kv_rng_next_normal(&r);
    ck_assert_kv_ok(kv_quant_roundtrip(yy, &st, &kq, 1, 64, xx));
    uint32_t cw[8];
    uint8_t b4[4];
    ck_assert_kv_ok(kv_fpq_encode_ref(cw, b4, &kq.fp, 1, 64, xx));
    ck_assert_kv_ok(kv_fpq_decode_ref(zz, &kq.fp, 1, 64, cw, b4));
    for (int i = 0; i < 64; i++) ck_assert_float_eq(yy[i], zz[i]);
}
END_TEST

int main(void) {
    Suite *s = suite_create("fp_formats");
    TCase *tc = tcase_create("elements");
    tcase_set_timeout(tc, 120);
    const int nf = (int)(sizeof k_fmt / sizeof k_fmt[0]);
    tcase_add_loop_test(tc, decode_every_code, 0, nf);
    tcase_add_test(tc, decode_hand_values);
    tcase_add_loop_test(tc, encode_every_code_and_midpoint, 0, nf);
    tcase_add_loop_test(tc, encode_saturation_and_nan, 0, nf);
    tcase_add_loop_test(tc, encode_matches_oracle, 0, nf);
    suite_add_tcase(s, tc);
    tc = tcase_create("quantizers");
    tcase_add_loop_test(tc, fpq_roundtrip, 0, (int)(sizeof k_q / sizeof k_q[0]));
    tcase_add_test(tc, fp8_every_value_through_scale);
    tcase_add_test(tc, nvfp4_hand_made);
    tcase_add_test(tc, fpq_errors_and_storage);
    suite_add_tcase(s, tc);
    return kv_test_run(s);
}
