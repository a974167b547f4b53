/* uniform_sse2.c — the uniform encoder's (and the keys decoder's) x86-64 path (SSE2, the x86-64
 * baseline: compiled in, skipped only when a test lowers kv_simd_level_limit).
 *
 * gcc vectorizes the portable loops in uniform.c, but keeps their min/max accumulators in memory
 * and narrows every code to a byte before a separate packing pass; written with SSE2 intrinsics
 * the min/max stay in registers and the codes are packed into words in registers, which doubles
 * the encode's throughput (BENCHMARKS.md, "Kernels"). The arithmetic is kv_quant_math.h's —
 * exact min/max (the reduction order may differ: kv_qm_uniform_params stores the same bits whichever
 * signed zero survives), its parameter formulas, and codes rounded as the scalar code rounds them
 * (see code4) — so the words, scales and zero points are bit-identical to the portable path's
 * (tests/kernels: uniform_sse2_matches_portable). Other layouts and other machines use the portable
 * path. */
#include "kv_quant_math.h"
#include "kv_kernels_internal.h"

#if defined(__SSE2__)
#include <emmintrin.h>

#if defined(__GNUC__)
#define SSE2_INLINE inline __attribute__((always_inline))
#else
#define SSE2_INLINE inline
#endif
/* Loops over a block's vectors are unrolled so that their arrays of __m128 live in registers. */
#define EACH_VECTOR _Pragma("GCC unroll 4")

/* kv_qm_uniform_code of four values x >= z (z is the group's minimum, so x - z >= 0 and the
 * clamp at 0 never acts): min((x - z) * inv, hi), rounded to nearest-even by cvtps2dq in the
 * default rounding mode — the integer the magic-number addition and truncation produce for every
 * value in [0, 255]. Three fewer operations than the literal formula, the same codes (tested). */
static SSE2_INLINE __m128i code4(const float *x, __m128 z, __m128 inv, __m128 hi) {
    const __m128 v = _mm_min_ps(_mm_mul_ps(_mm_sub_ps(_mm_loadu_ps(x), z), inv), hi); /* v < hi ? v : hi */
    return _mm_cvtps_epi32(v);
}

/* One packed word: the 32 / bits consecutive values at x (code i at bit i * bits). The vector of
 * codes 4v..4v+3 is shifted by 4 * bits * v and OR-ed, so lane l holds codes l, 4 + l, 8 + l ...
 * at their places relative to bit l * bits; two shift-and-fold steps then move lane l up by
 * l * bits and OR the lanes into lane 0. */
static SSE2_INLINE uint32_t word_of(const float *x, const int bits, __m128 z, __m128 inv, __m128 hi) {
    const int per = 32 / bits;
    __m128i e = code4(x, z, inv, hi);
    _Pragma("GCC unroll 8") for (int v = 1; v < per / 4; v++)
        e = _mm_or_si128(e, _mm_sll_epi32(code4(x + 4 * v, z, inv, hi), _mm_cvtsi32_si128(4 * bits * v)));
    const __m128i f = _mm_or_si128(e, _mm_srli_si128(_mm_sll_epi32(e, _mm_cvtsi32_si128(bits)), 4));
    const __m128i g = _mm_or_si128(f, _mm_srli_si128(_mm_sll_epi32(f, _mm_cvtsi32_si128(2 * bits)), 8));
    return (uint32_t)_mm_cvtsi128_si32(g);
}

/* One group's codes: the words of G values at xr with parameters z, inv. */
static SSE2_INLINE void value_words(uint32_t *w, const float *xr, size_t G, __m128 z, __m128 inv, __m128 hi,
                                    const int bits) {
    const size_t per = (size_t)(32 / bits);
    for (size_t b = 0; b < G / per; b++) w[b] = word_of(xr + b * per, bits, z, inv, hi);
}

/* Values: groups of G channels of one token; every group whole and word-aligned (checked), so the
 * groups are simply consecutive runs of G values. Four groups at a time: their min/max vectors are
 * transposed so that the reductions and the parameters (kv_qm_uniform_params, operation for
 * operation) run on one vector per quantity instead of four scalar chains. The order of the min/max
 * reduction differs from the portable path's, which changes no output: min and max are exact, and
 * kv_qm_uniform_params stores the same bits whichever signed zero a reduction keeps. A last batch
 * of fewer than four groups repeats its last group in the spare lanes and stores only the real ones.
 * Returns 1 on a NaN or infinity (v - v is NaN exactly then, and a NaN sticks in the running sum). */
static SSE2_INLINE int encode_values(uint32_t *codes, void *scales, void *zeros, const kv_uniform *q, size_t T,
                                     size_t C, const float *x, const int bits) {
    const size_t G = (size_t)q->group, per = (size_t)(32 / bits), ngroups = T * (C / G);
    const float qmax_f = (float)((1u << bits) - 1u);
    const __m128 hi = _mm_set1_ps(qmax_f), qmax = hi, zero = _mm_setzero_ps();
    const __m128 eta = _mm_set1_ps(q->eta), one_m_2eta = _mm_set1_ps(1.0f - 2.0f * q->eta);
    const int pt = (int)q->param_type;
    for (size_t g = 0; g < ngroups; g += 4) {
        const size_t nb = ngroups - g < 4 ? ngroups - g : 4; /* groups in this batch */
        __m128 lo[4], hv[4], nf = zero;
        for (int j = 0; j < 4; j++) {
            const float *xr = x + (g + ((size_t)j < nb ? (size_t)j : nb - 1)) * G;
            __m128 lo0 = _mm_loadu_ps(xr), lo1 = _mm_loadu_ps(xr + 4), hi0 = lo0, hi1 = lo1;
            for (size_t i = 0; i < G; i += 8) {
                const __m128 a = _mm_loadu_ps(xr + i), b = _mm_loadu_ps(xr + i + 4);
                nf = _mm_add_ps(nf, _mm_add_ps(_mm_sub_ps(a, a), _mm_sub_ps(b, b)));
                lo0 = _mm_min_ps(a, lo0);
                lo1 = _mm_min_ps(b, lo1);
                hi0 = _mm_max_ps(a, hi0);
                hi1 = _mm_max_ps(b, hi1);
            }
            lo[j] = _mm_min_ps(lo0, lo1);
            hv[j] = _mm_max_ps(hi0, hi1);
        }
        _MM_TRANSPOSE4_PS(lo[0], lo[1], lo[2], lo[3]); /* lane j of every vector: group j */
        _MM_TRANSPOSE4_PS(hv[0], hv[1], hv[2], hv[3]);
        const __m128 mn = _mm_min_ps(_mm_min_ps(lo[0], lo[1]), _mm_min_ps(lo[2], lo[3]));
        const __m128 mx = _mm_max_ps(_mm_max_ps(hv[0], hv[1]), _mm_max_ps(hv[2], hv[3]));
        float f[4];
        _mm_storeu_ps(f, nf);
        if ((f[0] + f[1]) + (f[2] + f[3]) != 0.0f) return 1; /* NaN != 0 */
        /* kv_qm_uniform_params, four groups at once */
        const __m128 s = _mm_add_ps(_mm_div_ps(_mm_sub_ps(mx, mn), qmax), zero);
        const __m128 inv = _mm_and_ps(_mm_cmpgt_ps(s, zero), _mm_div_ps(_mm_set1_ps(1.0f), s));
        const __m128 zc = _mm_add_ps(mn, _mm_mul_ps(_mm_mul_ps(eta, s), qmax));
        const __m128 sc = _mm_mul_ps(one_m_2eta, s);
        float zs[4], is[4], zcs[4], scs[4];
        _mm_storeu_ps(zs, mn);
        _mm_storeu_ps(is, inv);
        _mm_storeu_ps(zcs, zc);
        _mm_storeu_ps(scs, sc);
        for (size_t j = 0; j < nb; j++) {
            kv_qm_param_store(scales, g + (size_t)j, scs[j], pt);
            kv_qm_param_store(zeros, g + (size_t)j, zcs[j], pt);
            value_words(codes + (g + (size_t)j) * G / per, x + (g + (size_t)j) * G, G, _mm_set1_ps(zs[j]),
                        _mm_set1_ps(is[j]), hi, bits);
        }
    }
    return 0;
}

/* Keys, one token group of `rows` rows at xt and channels c0 .. c0 + 4 * NV: per-channel min/max
 * down the rows (NV vectors of running min/max in registers; per lane the portable path's order),
 * the channels' parameters, then each channel's codes OR-ed into its words row by row (all lanes
 * share the slot's shift) and stored to the channel's run (word b of channel c holds rows
 * b*per .. b*per+per-1). Returns 1 on a non-finite value. */
static SSE2_INLINE int key_block(uint32_t *words, void *scales, void *zeros, const float *xt, size_t rows, size_t C,
                                 size_t c0, const int NV, size_t k, const int bits, float eta, int pt, size_t w0,
                                 const float *xn, size_t rows_n) {
    enum { MAXV = 4 };
    const size_t per = (size_t)(32 / bits), wpc = rows / per;
    __m128 lo[MAXV], hi[MAXV], nf[MAXV], z[MAXV], inv[MAXV];
    EACH_VECTOR for (int v = 0; v < NV; v++) {
        lo[v] = hi[v] = _mm_loadu_ps(xt + c0 + 4 * (size_t)v);
        nf[v] = _mm_setzero_ps();
    }
    for (size_t i = 0; i < rows; i++) {
        /* The block reads one cache line per row, 4C bytes apart, which the hardware prefetchers
         * do not follow: fetch the next token group's line for this row and block now. */
        if (i < rows_n) _mm_prefetch((const char *)(xn + i * C + c0), _MM_HINT_T1);
        EACH_VECTOR for (int v = 0; v < NV; v++) {
            const __m128 a = _mm_loadu_ps(xt + i * C + c0 + 4 * (size_t)v);
            nf[v] = _mm_add_ps(nf[v], _mm_sub_ps(a, a));
            lo[v] = _mm_min_ps(a, lo[v]);
            hi[v] = _mm_max_ps(a, hi[v]);
        }
    }
    EACH_VECTOR for (int v = 0; v < NV; v++) {
        float l[4], h[4], f[4], zz[4], ii[4];
        _mm_storeu_ps(l, lo[v]);
        _mm_storeu_ps(h, hi[v]);
        _mm_storeu_ps(f, nf[v]);
        if ((f[0] + f[1]) + (f[2] + f[3]) != 0.0f) return 1;
        for (int j = 0; j < 4; j++) {
            const size_t c = c0 + 4 * (size_t)v + (size_t)j;
            const kv_qm_uparams p = kv_qm_uniform_params(l[j], h[j], bits, eta);
            kv_qm_param_store(scales, k * C + c, p.sc, pt);
            kv_qm_param_store(zeros, k * C + c, p.zc, pt);
            zz[j] = p.z;
            ii[j] = p.inv;
        }
        z[v] = _mm_loadu_ps(zz);
        inv[v] = _mm_loadu_ps(ii);
    }
    const __m128 top = _mm_set1_ps((float)((1u << bits) - 1u));
    for (size_t b = 0; b < wpc; b++) {
        __m128i acc[MAXV];
        EACH_VECTOR for (int v = 0; v < NV; v++) acc[v] = _mm_setzero_si128();
        for (size_t sl = 0; sl < per; sl++) {
            const float *xr = xt + (b * per + sl) * C + c0;
            const __m128i sh = _mm_cvtsi32_si128((int)sl * bits);
            EACH_VECTOR for (int v = 0; v < NV; v++)
                acc[v] = _mm_or_si128(acc[v], _mm_sll_epi32(code4(xr + 4 * v, z[v], inv[v], top), sh));
        }
        EACH_VECTOR for (int v = 0; v < NV; v++) {
            uint32_t o[4];
            _mm_storeu_si128((__m128i *)o, acc[v]);
            for (int j = 0; j < 4; j++) words[w0 + (c0 + 4 * (size_t)v + (size_t)j) * wpc + b] = o[j];
        }
    }
    return 0;
}

/* Keys: groups of G tokens of one channel; every channel's run whole words (checked). */
static SSE2_INLINE int encode_keys(uint32_t *codes, void *scales, void *zeros, const kv_uniform *q, size_t T,
                                   size_t C, const float *x, const int bits) {
    const size_t G = (size_t)q->group, per = (size_t)(32 / bits);
    const int pt = (int)q->param_type;
    for (size_t k = 0; k * G < T; k++) {
        const size_t rows = kv_qm_tok_group_rows(G, T, k), w0 = k * G * C / per;
        const float *xt = x + k * G * C;
        const size_t rows_n = (k + 1) * G < T ? kv_qm_tok_group_rows(G, T, k + 1) : 0;
        const float *xn = rows_n ? xt + G * C : xt; /* the next group (none: rows_n = 0) */
        size_t c0 = 0;
        for (; c0 + 16 <= C; c0 += 16)
            if (key_block(codes, scales, zeros, xt, rows, C, c0, 4, k, bits, q->eta, pt, w0, xn, rows_n)) return 1;
        for (; c0 < C; c0 += 4)
            if (key_block(codes, scales, zeros, xt, rows, C, c0, 1, k, bits, q->eta, pt, w0, xn, rows_n)) return 1;
    }
    return 0;
}

int kv_uniform_encode_sse2(uint32_t *codes, void *scales, void *zeros, const kv_uniform *q, size_t tokens,
                           size_t channels, const float *x, kv_status *st) {
    const int bits = q->bits;
    if (kv_simd_level_now() < KV_SIMD_SSE2) return 0;
    if (!codes || q->pack11 || (bits != 1 && bits != 2 && bits != 4 && bits != 8)) return 0;
    const size_t G = (size_t)q->group, per = (size_t)(32 / bits), C = channels;
    int bad;
    if (q->axis == KV_AXIS_CHANNELS) {
        if (G % 8 || G % per || C % G) return 0;
        switch (bits) {
        case 1: bad = encode_values(codes, scales, zeros, q, tokens, C, x, 1); break;
        case 2: bad = encode_values(codes, scales, zeros, q, tokens, C, x, 2); break;
        case 4: bad = encode_values(codes, scales, zeros, q, tokens, C, x, 4); break;
        default: bad = encode_values(codes, scales, zeros, q, tokens, C, x, 8); break;
        }
    } else {
        if (G % per || C % 4 || (tokens % G) % per) return 0;
        switch (bits) {
        case 1: bad = encode_keys(codes, scales, zeros, q, tokens, C, x, 1); break;
        case 2: bad = encode_keys(codes, scales, zeros, q, tokens, C, x, 2); break;
        case 4: bad = encode_keys(codes, scales, zeros, q, tokens, C, x, 4); break;
        default: bad = encode_keys(codes, scales, zeros, q, tokens, C, x, 8); break;
        }
    }
    *st = bad ? KV_ERR(KV_ENUMERIC, "uniform encode: non-finite input value") : KV_OK;
    return 1;
}

/* Keys decode, one token group and channels c0 .. c0 + 4 * NV: the channels' words for one run of
 * per rows are loaded once (one vector per 4 channels), then each row's codes are a uniform shift
 * and mask of them, dequantized as kv_qm_uniform_dequant (code * s, then + z) and stored as whole
 * rows of the block. sv/zv: the group's C scales and zero points as floats. */
static SSE2_INLINE void key_block_decode(float *y, const uint32_t *words, const float *sv, const float *zv,
                                         size_t rows, size_t C, size_t c0, const int NV, const int bits, size_t w0) {
    enum { MAXV = 4 };
    const size_t per = (size_t)(32 / bits), wpc = rows / per;
    const __m128i mask = _mm_set1_epi32((int)((1u << bits) - 1u));
    __m128 sc[MAXV], zc[MAXV];
    EACH_VECTOR for (int v = 0; v < NV; v++) {
        sc[v] = _mm_loadu_ps(sv + c0 + 4 * (size_t)v);
        zc[v] = _mm_loadu_ps(zv + c0 + 4 * (size_t)v);
    }
    for (size_t b = 0; b < wpc; b++) {
        __m128i w[MAXV];
        EACH_VECTOR for (int v = 0; v < NV; v++) {
            const size_t c = c0 + 4 * (size_t)v;
            w[v] = _mm_set_epi32((int)words[w0 + (c + 3) * wpc + b], (int)words[w0 + (c + 2) * wpc + b],
                                 (int)words[w0 + (c + 1) * wpc + b], (int)words[w0 + c * wpc + b]);
        }
        for (size_t sl = 0; sl < per; sl++) {
            float *yr = y + (b * per + sl) * C + c0;
            const __m128i sh = _mm_cvtsi32_si128((int)sl * bits);
            EACH_VECTOR for (int v = 0; v < NV; v++) {
                const __m128 code = _mm_cvtepi32_ps(_mm_and_si128(_mm_srl_epi32(w[v], sh), mask));
                _mm_storeu_ps(yr + 4 * v, _mm_add_ps(_mm_mul_ps(code, sc[v]), zc[v]));
            }
        }
    }
}

static SSE2_INLINE void decode_keys(float *y, const kv_uniform *q, size_t T, size_t C, const uint32_t *codes,
                                    const void *scales, const void *zeros, float *sv, float *zv, const int bits) {
    const size_t G = (size_t)q->group, per = (size_t)(32 / bits);
    const int pt = (int)q->param_type;
    for (size_t k = 0; k * G < T; k++) {
        const size_t rows = kv_qm_tok_group_rows(G, T, k), w0 = k * G * C / per;
        for (size_t c = 0; c < C; c++) {
            sv[c] = kv_qm_param_load(scales, k * C + c, pt);
            zv[c] = kv_qm_param_load(zeros, k * C + c, pt);
        }
        float *yt = y + k * G * C;
        size_t c0 = 0;
        for (; c0 + 16 <= C; c0 += 16) key_block_decode(yt, codes, sv, zv, rows, C, c0, 4, bits, w0);
        for (; c0 < C; c0 += 4) key_block_decode(yt, codes, sv, zv, rows, C, c0, 1, bits, w0);
    }
}

int kv_uniform_decode_keys_sse2(float *x_hat, const kv_uniform *q, size_t tokens, size_t channels,
                                const uint32_t *codes, const void *scales, const void *zeros, float *sv, float *zv) {
    const int bits = q->bits;
    if (kv_simd_level_now() < KV_SIMD_SSE2) return 0;
    if (q->axis != KV_AXIS_TOKENS || q->pack11 || (bits != 1 && bits != 2 && bits != 4 && bits != 8)) return 0;
    const size_t G = (size_t)q->group, per = (size_t)(32 / bits);
    if (G % per || channels % 4 || (tokens % G) % per) return 0;
    switch (bits) {
    case 1: decode_keys(x_hat, q, tokens, channels, codes, scales, zeros, sv, zv, 1); break;
    case 2: decode_keys(x_hat, q, tokens, channels, codes, scales, zeros, sv, zv, 2); break;
    case 4: decode_keys(x_hat, q, tokens, channels, codes, scales, zeros, sv, zv, 4); break;
    default: decode_keys(x_hat, q, tokens, channels, codes, scales, zeros, sv, zv, 8); break;
    }
    return 1;
}

#else /* not x86-64: the portable path everywhere */

int kv_uniform_encode_sse2(uint32_t *codes, void *scales, void *zeros, const kv_uniform *q, size_t tokens,
                           size_t channels, const float *x, kv_status *st) {
    (void)codes, (void)scales, (void)zeros, (void)q, (void)tokens, (void)channels, (void)x, (void)st;
    return 0;
}

int kv_uniform_decode_keys_sse2(float *x_hat, const kv_uniform *q, size_t tokens, size_t channels,
                                const uint32_t *codes, const void *scales, const void *zeros, float *sv, float *zv) {
    (void)x_hat, (void)q, (void)tokens, (void)channels, (void)codes, (void)scales, (void)zeros, (void)sv, (void)zv;
    return 0;
}

#endif
