/* rt_avx2.c — the runtime's inner loops with AVX2, FMA and F16C (chosen at run time, rt_simd.c).
 *
 * Same loops as the portable C (rt_fp.c, rt_uniform.c, rt_math.c), the same summation order per
 * output, except that products are fused into their sums (FMA): the results are within the same
 * float-summation bound of exact attention as the portable ones (tests/runtime runs every level
 * against the exact reference), not bit-identical to them. f16 conversions are exact both ways. */
#include "kvrt.h"
#include "rt_internal.h"

#if KV_HAVE_X86_AVX2
#include <immintrin.h>

#define RT_AVX2 __attribute__((target("avx2,fma,f16c")))

RT_AVX2 void kv_rti_f16_to_f32_row_avx2(float *dst, const uint16_t *src, size_t n) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(src + i))));
    for (; i < n; i++) dst[i] = kv_f16_to_f32(src[i]);
}

/* Round to nearest even, as kv_f32_to_f16 (finite inputs: the runtime refuses others). */
RT_AVX2 void kv_rti_f32_to_f16_row_avx2(uint16_t *dst, const float *src, size_t n) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(dst + i), _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
    for (; i < n; i++) dst[i] = kv_f32_to_f16(src[i]);
}

/* The 8 lanes of v summed as ((l0+l1)+(l2+l3))+((l4+l5)+(l6+l7)), the portable order. */
RT_AVX2 static inline float hsum8(__m256 v) {
    const __m256 p = _mm256_hadd_ps(v, v);         /* l0+l1, l2+l3, ., ., l4+l5, l6+l7 */
    const __m256 q = _mm256_hadd_ps(p, p);         /* (l0+l1)+(l2+l3), ., (l4+l5)+(l6+l7) */
    return _mm_cvtss_f32(_mm_add_ss(_mm256_castps256_ps128(q), _mm256_extractf128_ps(q, 1)));
}

/* Eight dot products at once: the sums of v0..v7 in one vector (lane i = hsum8(v_i)). */
RT_AVX2 static inline __m256 hsum8x8(__m256 v0, __m256 v1, __m256 v2, __m256 v3, __m256 v4, __m256 v5, __m256 v6,
                                     __m256 v7) {
    const __m256 a = _mm256_hadd_ps(v0, v1), b = _mm256_hadd_ps(v2, v3);
    const __m256 c = _mm256_hadd_ps(v4, v5), d = _mm256_hadd_ps(v6, v7);
    const __m256 ab = _mm256_hadd_ps(a, b), cd = _mm256_hadd_ps(c, d);
    /* ab: lanes (v0 low, v1 low, v2 low, v3 low | v0 high, ...): add the halves */
    const __m256 lo = _mm256_permute2f128_ps(ab, cd, 0x20), hi = _mm256_permute2f128_ps(ab, cd, 0x31);
    return _mm256_add_ps(lo, hi);
}

RT_AVX2 void kv_rti_f32_scores_avx2(const float *x, size_t ld, int n, int hd, const float *q, int nq, float *out,
                                size_t ldo) {
    const int nc = hd / 8;
    int t = 0;
    for (; t + 8 <= n; t += 8)
        for (int j = 0; j < nq; j++) {
            const float *qj = q + (size_t)j * hd;
            __m256 a[8];
            for (int r = 0; r < 8; r++) a[r] = _mm256_setzero_ps();
            for (int c = 0; c < nc; c++) {
                const __m256 qv = _mm256_loadu_ps(qj + 8 * c);
                for (int r = 0; r < 8; r++)
                    a[r] = _mm256_fmadd_ps(qv, _mm256_loadu_ps(x + (size_t)(t + r) * ld + 8 * c), a[r]);
            }
            _mm256_storeu_ps(out + (size_t)j * ldo + t, hsum8x8(a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7]));
        }
    for (; t < n; t++)
        for (int j = 0; j < nq; j++) {
            const float *qj = q + (size_t)j * hd;
            __m256 a = _mm256_setzero_ps();
            for (int c = 0; c < nc; c++)
                a = _mm256_fmadd_ps(_mm256_loadu_ps(qj + 8 * c), _mm256_loadu_ps(x + (size_t)t * ld + 8 * c), a);
            out[(size_t)j * ldo + t] = hsum8(a);
        }
}

RT_AVX2 void kv_rti_f32_accum_avx2(const float *x, size_t ld, int n, int hd, const float *p, size_t ldp, int nq,
                               float *acc) {
    const int nc = hd / 8;
    for (int j = 0; j < nq; j++) {
        float *aj = acc + (size_t)j * hd;
        const float *pj = p + (size_t)j * ldp;
        for (int c0 = 0; c0 < nc; c0 += 8) { /* 8 accumulators (64 channels) stay in registers */
            const int cn = nc - c0 < 8 ? nc - c0 : 8;
            __m256 a[8];
            for (int c = 0; c < cn; c++) a[c] = _mm256_loadu_ps(aj + 8 * (c0 + c));
            for (int t = 0; t < n; t++) {
                const __m256 pv = _mm256_set1_ps(pj[t]);
                const float *row = x + (size_t)t * ld + 8 * c0;
                for (int c = 0; c < cn; c++) a[c] = _mm256_fmadd_ps(pv, _mm256_loadu_ps(row + 8 * c), a[c]);
            }
            for (int c = 0; c < cn; c++) _mm256_storeu_ps(aj + 8 * (c0 + c), a[c]);
        }
    }
}

/* exp of x <= 0: rt_math.c's reduction and polynomial, 8 at a time (with FMA). */
RT_AVX2 void kv_rti_exp_avx2(float *x, size_t n) {
    const __m256 log2e = _mm256_set1_ps(1.44269504088896341f), c1 = _mm256_set1_ps(0.693359375f);
    const __m256 c2 = _mm256_set1_ps(-2.12194440e-4f), lo = _mm256_set1_ps(-87.33f), one = _mm256_set1_ps(1.0f);
    const __m256 p0 = _mm256_set1_ps(1.9875691500e-4f), p1 = _mm256_set1_ps(1.3981999507e-3f);
    const __m256 p2 = _mm256_set1_ps(8.3334519073e-3f), p3 = _mm256_set1_ps(4.1665795894e-2f);
    const __m256 p4 = _mm256_set1_ps(1.6666665459e-1f), p5 = _mm256_set1_ps(5.0000001201e-1f);
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 xv = _mm256_loadu_ps(x + i);
        const __m256 xc = _mm256_max_ps(xv, lo);
        const __m256 nn = _mm256_round_ps(_mm256_mul_ps(xc, log2e), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        const __m256 r = _mm256_fnmadd_ps(nn, c2, _mm256_fnmadd_ps(nn, c1, xc));
        __m256 pp = _mm256_fmadd_ps(p0, r, p1);
        pp = _mm256_fmadd_ps(pp, r, p2);
        pp = _mm256_fmadd_ps(pp, r, p3);
        pp = _mm256_fmadd_ps(pp, r, p4);
        pp = _mm256_fmadd_ps(pp, r, p5);
        const __m256 y = _mm256_add_ps(_mm256_fmadd_ps(pp, _mm256_mul_ps(r, r), r), one);
        const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(nn), _mm256_set1_epi32(127)), 23);
        const __m256 out = _mm256_mul_ps(y, _mm256_castsi256_ps(e));
        _mm256_storeu_ps(x + i, _mm256_andnot_ps(_mm256_cmp_ps(xv, lo, _CMP_LT_OQ), out));
    }
    if (i < n) kv_rti_exp_portable(x + i, n - i);
}

RT_AVX2 float kv_rti_shift_by_max_avx2(float *x, size_t n) {
    float mx = x[0];
    size_t i = 0;
    if (n >= 8) {
        __m256 m = _mm256_loadu_ps(x);
        for (i = 8; i + 8 <= n; i += 8) m = _mm256_max_ps(m, _mm256_loadu_ps(x + i));
        float l[8];
        _mm256_storeu_ps(l, m);
        for (int k = 0; k < 8; k++) mx = l[k] > mx ? l[k] : mx;
    }
    for (; i < n; i++) mx = x[i] > mx ? x[i] : mx;
    const __m256 mv = _mm256_set1_ps(mx);
    for (i = 0; i + 8 <= n; i += 8) _mm256_storeu_ps(x + i, _mm256_sub_ps(_mm256_loadu_ps(x + i), mv));
    for (; i < n; i++) x[i] = x[i] - mx;
    return mx;
}

/* Shift counts of slot 8v + k (k = lane) for widths 1, 2, 4: row (bits index, v). */
static const int32_t k_shifts[3][4][8] = {
    {{0, 1, 2, 3, 4, 5, 6, 7}, {8, 9, 10, 11, 12, 13, 14, 15}, {16, 17, 18, 19, 20, 21, 22, 23}, {24, 25, 26, 27, 28, 29, 30, 31}},
    {{0, 2, 4, 6, 8, 10, 12, 14}, {16, 18, 20, 22, 24, 26, 28, 30}, {0}, {0}},
    {{0, 4, 8, 12, 16, 20, 24, 28}, {0}, {0}, {0}},
};

/* rows runs of nwords whole words each (bits 1, 2, 4 or 8), run r starting at word w0 + r * wstride,
 * to floats at dst + r * ldd (slot s of word i at i * per + s). */
RT_AVX2 void kv_rti_unpack_rows_avx2(float *dst, size_t ldd, const uint32_t *codes, size_t w0, size_t wstride, int rows,
                                 size_t nwords, int bits) {
    const __m256i mask = _mm256_set1_epi32((int)((1u << bits) - 1u));
    if (bits == 8) {
        const __m256i sh8 = _mm256_setr_epi32(0, 8, 16, 24, 0, 8, 16, 24);
        for (int r = 0; r < rows; r++) {
            const uint32_t *w = codes + w0 + (size_t)r * wstride;
            float *d = dst + (size_t)r * ldd;
            size_t i = 0;
            for (; i + 2 <= nwords; i += 2) {
                const __m256i b = _mm256_setr_epi32((int)w[i], (int)w[i], (int)w[i], (int)w[i], (int)w[i + 1],
                                                    (int)w[i + 1], (int)w[i + 1], (int)w[i + 1]);
                _mm256_storeu_ps(d + i * 4, _mm256_cvtepi32_ps(_mm256_and_si256(_mm256_srlv_epi32(b, sh8), mask)));
            }
            for (; i < nwords; i++)
                for (int s = 0; s < 4; s++) d[i * 4 + (size_t)s] = (float)((w[i] >> (8 * s)) & 0xffu);
        }
        return;
    }
    const int per = 32 / bits, nv = per / 8, bi = bits == 1 ? 0 : bits == 2 ? 1 : 2;
    __m256i sh[4];
    for (int v = 0; v < nv; v++) sh[v] = _mm256_loadu_si256((const __m256i *)k_shifts[bi][v]);
    for (int r = 0; r < rows; r++) {
        const uint32_t *w = codes + w0 + (size_t)r * wstride;
        float *d = dst + (size_t)r * ldd;
        for (size_t i = 0; i < nwords; i++) {
            const __m256i b = _mm256_set1_epi32((int)w[i]);
            for (int v = 0; v < nv; v++)
                _mm256_storeu_ps(d + i * (size_t)per + 8 * (size_t)v,
                                 _mm256_cvtepi32_ps(_mm256_and_si256(_mm256_srlv_epi32(b, sh[v]), mask)));
        }
    }
}

RT_AVX2 void kv_rti_unpack_words_avx2(float *dst, const uint32_t *w, size_t nwords, int bits) {
    kv_rti_unpack_rows_avx2(dst, 0, w, 0, 0, 1, nwords, bits);
}

/* acc[j][i] (+)= sum_c qs[j][c] cf[c][i] for i < n (n a multiple of 8, at most 64): the token-axis
 * uniform key scores, queries one at a time with the tokens' accumulators in registers. */
RT_AVX2 void kv_rti_uniform_tok_scores_avx2(const float *cf, size_t ldc, int n, int hd, const float *qs, int nj,
                                        float *acc, size_t lda) {
    const int nv = n / 8;
    for (int j = 0; j < nj; j++) {
        __m256 a[8];
        for (int v = 0; v < nv; v++) a[v] = _mm256_setzero_ps();
        const float *qj = qs + (size_t)j * hd;
        for (int c = 0; c < hd; c++) {
            const __m256 w = _mm256_set1_ps(qj[c]);
            const float *row = cf + (size_t)c * ldc;
            for (int v = 0; v < nv; v++) a[v] = _mm256_fmadd_ps(w, _mm256_loadu_ps(row + 8 * v), a[v]);
        }
        for (int v = 0; v < nv; v++) _mm256_storeu_ps(acc + (size_t)j * lda + 8 * v, a[v]);
    }
}

/* acc[j][c] += sum_t (p[j][t] s[t][g(c)]) cf[t][c] for the n tokens of a tile (cf: n x ldc floats),
 * head channels in segments [seg[i], seg[i+1]) of one scale each (multiples of 8), s: n x nseg
 * scales. Each query's accumulators stay in registers 64 channels at a time. */
RT_AVX2 void kv_rti_uniform_chan_accum_avx2(const float *cf, size_t ldc, int n, int hd, const float *s, const int *seg,
                                        int nseg, const float *p, size_t ldp, int nj, float *acc) {
    for (int j = 0; j < nj; j++) {
        const float *pj = p + (size_t)j * ldp;
        float *aj = acc + (size_t)j * hd;
        for (int c0 = 0; c0 < hd; c0 += 64) {
            const int c1 = c0 + 64 < hd ? c0 + 64 : hd, nv = (c1 - c0) / 8;
            __m256 a[8];
            for (int v = 0; v < nv; v++) a[v] = _mm256_loadu_ps(aj + c0 + 8 * v);
            for (int t = 0; t < n; t++) {
                const float *row = cf + (size_t)t * ldc;
                const float *st = s + (size_t)t * nseg;
                int sg = 0;
                for (int v = 0; v < nv; v++) {
                    const int ch = c0 + 8 * v;
                    while (seg[sg + 1] <= ch) sg++;
                    a[v] = _mm256_fmadd_ps(_mm256_set1_ps(pj[t] * st[sg]), _mm256_loadu_ps(row + ch), a[v]);
                }
            }
            for (int v = 0; v < nv; v++) _mm256_storeu_ps(aj + c0 + 8 * v, a[v]);
        }
    }
}

/* 16 codes of width 2 or 4 from stream position pos (pos a multiple of 16 / of 8) as two float
 * vectors: tokens pos..pos+7 and pos+8..pos+15. Width 2: a lane shifted right by 2k holds code k in
 * its low 2 bits and the next code's low bit above them, so a permute of the table {0,1,2,3,0,1,2,3}
 * (which reads the low 3 bits) gives the code as a float without a mask or a conversion. */
RT_AVX2 static inline void codes16(const uint32_t *codes, size_t pos, int bits, __m256 *lo, __m256 *hi) {
    if (bits == 2) {
        const __m256i b = _mm256_set1_epi32((int)codes[pos / 16]);
        const __m256 tab = _mm256_setr_ps(0.0f, 1.0f, 2.0f, 3.0f, 0.0f, 1.0f, 2.0f, 3.0f);
        *lo = _mm256_permutevar8x32_ps(tab, _mm256_srlv_epi32(b, _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14)));
        *hi = _mm256_permutevar8x32_ps(tab, _mm256_srlv_epi32(b, _mm256_setr_epi32(16, 18, 20, 22, 24, 26, 28, 30)));
    } else {
        const __m256i sh = _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28), m = _mm256_set1_epi32(15);
        *lo = _mm256_cvtepi32_ps(_mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32((int)codes[pos / 8]), sh), m));
        *hi = _mm256_cvtepi32_ps(_mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32((int)codes[pos / 8 + 1]), sh), m));
    }
}

/* n (a multiple of 8) stored parameters from index i: f16 or f32 (KV_PARAM_*), as floats. */
RT_AVX2 static inline __m256 params8(const void *arr, size_t i, int pt) {
    return pt == KV_PARAM_F16 ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)arr + i)))
                              : _mm256_loadu_ps((const float *)arr + i);
}

/* The token-axis fold of a group's scales and zero points (stored, f16 or f32, hd of each from index
 * i0) into the queries: qs[j][c] = q[j][c] s[c] and bias[j] = sum_c q[j][c] z[c] (8 lanes, then
 * hsum8), for nj queries of hd channels (a multiple of 8). One loop per parameter type. */
RT_AVX2 __attribute__((always_inline)) static inline void fold_t(const float *q, int hd, int nj, const void *s,
                                                                 const void *z, size_t i0, const int pt, float *qs,
                                                                 float *bias) {
    for (int j = 0; j < nj; j++) {
        const float *qj = q + (size_t)j * hd;
        float *qsj = qs + (size_t)j * hd;
        __m256 b = _mm256_setzero_ps();
        for (int c = 0; c < hd; c += 8) {
            const __m256 qv = _mm256_loadu_ps(qj + c);
            _mm256_storeu_ps(qsj + c, _mm256_mul_ps(qv, params8(s, i0 + (size_t)c, pt)));
            b = _mm256_fmadd_ps(qv, params8(z, i0 + (size_t)c, pt), b);
        }
        bias[j] = hsum8(b);
    }
}

RT_AVX2 void kv_rti_uniform_fold_avx2(const float *q, int hd, int nj, const void *s, const void *z, size_t i0, int pt,
                                  float *qs, float *bias) {
    if (pt == KV_PARAM_F16)
        fold_t(q, hd, nj, s, z, i0, KV_PARAM_F16, qs, bias);
    else
        fold_t(q, hd, nj, s, z, i0, KV_PARAM_F32, qs, bias);
}

/* The channel-axis weights of n tokens (n at most lds): ps[(j nseg + sg) lds + i] = p[j][i] s[sg][i]
 * and zacc[j nseg + sg] += sum_i p[j][i] z[sg][i], s and z: nseg rows of lds stored parameters (f16
 * or f32: a token's scale and zero point of segment sg), 8 tokens at a time. One loop per type. */
RT_AVX2 __attribute__((always_inline)) static inline void weights_t(const void *s, const void *z, const int pt,
                                                                    size_t lds, int nseg, const float *p, size_t ldp,
                                                                    int nj, int n, float *ps, float *zacc) {
    for (int j = 0; j < nj; j++) {
        const float *pj = p + (size_t)j * ldp;
        for (int sg = 0; sg < nseg; sg++) {
            const size_t r = (size_t)sg * lds;
            float *o = ps + ((size_t)j * (size_t)nseg + (size_t)sg) * lds;
            __m256 zb = _mm256_setzero_ps();
            int i = 0;
            for (; i + 8 <= n; i += 8) {
                const __m256 pv = _mm256_loadu_ps(pj + i);
                _mm256_storeu_ps(o + i, _mm256_mul_ps(pv, params8(s, r + (size_t)i, pt)));
                zb = _mm256_fmadd_ps(pv, params8(z, r + (size_t)i, pt), zb);
            }
            float zsum = hsum8(zb);
            for (; i < n; i++) {
                o[i] = pj[i] * rt_param(s, r + (size_t)i, pt);
                zsum += pj[i] * rt_param(z, r + (size_t)i, pt);
            }
            zacc[(size_t)j * (size_t)nseg + (size_t)sg] += zsum;
        }
    }
}

RT_AVX2 void kv_rti_uniform_chan_weights_avx2(const void *s, const void *z, int pt, size_t lds, int nseg, const float *p,
                                          size_t ldp, int nj, int n, float *ps, float *zacc) {
    if (pt == KV_PARAM_F16)
        weights_t(s, z, KV_PARAM_F16, lds, nseg, p, ldp, nj, n, ps, zacc);
    else
        weights_t(s, z, KV_PARAM_F32, lds, nseg, p, ldp, nj, n, ps, zacc);
}

/* Token-axis uniform key scores, fused (2- or 4-bit codes): for tokens i0 + [0, n) of a token group
 * (n a multiple of 16) whose channel ch's run starts at stream position run0 + ch * gs,
 * out[j][i] = sum_ch qs[j][ch] code[ch][i0 + i] + bias[j]. Codes go from their words to registers and
 * are used for up to 3 query vectors at a time; 16 tokens per pass. */
RT_AVX2 void kv_rti_uniform_tok_scores_fused_avx2(const uint32_t *codes, size_t run0, size_t gs, size_t i0, int n,
                                              int hd, int bits, const float *qs, const float *bias, int nj,
                                              float *out, size_t ldo) {
    for (int t = 0; t < n; t += 16)
        for (int j0 = 0; j0 < nj; j0 += 3) {
            const int jn = nj - j0 < 3 ? nj - j0 : 3;
            __m256 a0 = _mm256_setzero_ps(), a1 = a0, b0 = a0, b1 = a0, c0 = a0, c1 = a0;
            const float *q0 = qs + (size_t)j0 * hd, *q1 = q0 + (jn > 1 ? hd : 0), *q2 = q0 + (jn > 2 ? 2 * hd : 0);
            for (int ch = 0; ch < hd; ch++) {
                __m256 lo, hi;
                codes16(codes, run0 + (size_t)ch * gs + i0 + (size_t)t, bits, &lo, &hi);
                const __m256 w0 = _mm256_broadcast_ss(q0 + ch), w1 = _mm256_broadcast_ss(q1 + ch);
                const __m256 w2 = _mm256_broadcast_ss(q2 + ch);
                a0 = _mm256_fmadd_ps(w0, lo, a0), a1 = _mm256_fmadd_ps(w0, hi, a1);
                b0 = _mm256_fmadd_ps(w1, lo, b0), b1 = _mm256_fmadd_ps(w1, hi, b1);
                c0 = _mm256_fmadd_ps(w2, lo, c0), c1 = _mm256_fmadd_ps(w2, hi, c1);
            }
            float *d = out + (size_t)j0 * ldo + (size_t)t;
            const __m256 z0 = _mm256_broadcast_ss(bias + j0);
            _mm256_storeu_ps(d, _mm256_add_ps(a0, z0)), _mm256_storeu_ps(d + 8, _mm256_add_ps(a1, z0));
            if (jn > 1) {
                const __m256 z1 = _mm256_broadcast_ss(bias + j0 + 1);
                _mm256_storeu_ps(d + ldo, _mm256_add_ps(b0, z1)), _mm256_storeu_ps(d + ldo + 8, _mm256_add_ps(b1, z1));
            }
            if (jn > 2) {
                const __m256 z2 = _mm256_broadcast_ss(bias + j0 + 2);
                _mm256_storeu_ps(d + 2 * ldo, _mm256_add_ps(c0, z2)), _mm256_storeu_ps(d + 2 * ldo + 8, _mm256_add_ps(c1, z2));
            }
        }
}

/* Channel-axis uniform values, fused (2- or 4-bit codes, head_dim a multiple of 16): for n tokens
 * whose head codes start at stream positions pos0 + i * C, acc[j][c] += ps[j][g(c)][i] code[i][c],
 * ps: nj x nseg rows of lps weights (p times scale; kv_rti_uniform_chan_weights_avx2), seg16[c / 16] the
 * segment of channels c..c+15 (segments multiples of 16). 16 channels per pass, up to 3 query
 * vectors, accumulators in registers. */
RT_AVX2 void kv_rti_uniform_chan_accum_fused_avx2(const uint32_t *codes, size_t pos0, size_t C, int n, int hd, int bits,
                                              const float *ps, size_t lps, int nseg, const int *seg16, int nj,
                                              float *acc) {
    for (int c = 0; c < hd; c += 16) {
        const int sg = seg16[c / 16];
        for (int j0 = 0; j0 < nj; j0 += 3) {
            const int jn = nj - j0 < 3 ? nj - j0 : 3;
            float *aj = acc + (size_t)j0 * hd + c;
            __m256 a0 = _mm256_loadu_ps(aj), a1 = _mm256_loadu_ps(aj + 8);
            __m256 b0 = jn > 1 ? _mm256_loadu_ps(aj + hd) : _mm256_setzero_ps(), b1 = jn > 1 ? _mm256_loadu_ps(aj + hd + 8) : b0;
            __m256 c0 = jn > 2 ? _mm256_loadu_ps(aj + 2 * hd) : _mm256_setzero_ps(),
                   c1 = jn > 2 ? _mm256_loadu_ps(aj + 2 * hd + 8) : c0;
            for (int i = 0; i < n; i++) {
                __m256 lo, hi;
                codes16(codes, pos0 + (size_t)i * C + (size_t)c, bits, &lo, &hi);
                const float *pi = ps + ((size_t)j0 * (size_t)nseg + (size_t)sg) * lps + (size_t)i;
                const __m256 w0 = _mm256_broadcast_ss(pi);
                a0 = _mm256_fmadd_ps(w0, lo, a0), a1 = _mm256_fmadd_ps(w0, hi, a1);
                if (jn > 1) {
                    const __m256 w1 = _mm256_broadcast_ss(pi + (size_t)nseg * lps);
                    b0 = _mm256_fmadd_ps(w1, lo, b0), b1 = _mm256_fmadd_ps(w1, hi, b1);
                }
                if (jn > 2) {
                    const __m256 w2 = _mm256_broadcast_ss(pi + 2 * (size_t)nseg * lps);
                    c0 = _mm256_fmadd_ps(w2, lo, c0), c1 = _mm256_fmadd_ps(w2, hi, c1);
                }
            }
            _mm256_storeu_ps(aj, a0), _mm256_storeu_ps(aj + 8, a1);
            if (jn > 1) _mm256_storeu_ps(aj + hd, b0), _mm256_storeu_ps(aj + hd + 8, b1);
            if (jn > 2) _mm256_storeu_ps(aj + 2 * hd, c0), _mm256_storeu_ps(aj + 2 * hd + 8, c1);
        }
    }
}

/* f16 rows straight from memory: scores of up to 3 query vectors at a time against 4 rows at a time
 * (12 accumulators), each row chunk converted once per pass. hd a multiple of 8. */
RT_AVX2 void kv_rti_f16_scores_avx2(const uint16_t *x, size_t ld, int n, int hd, const float *q, int nq, float *out,
                                size_t ldo) {
    const int nc = hd / 8;
    for (int j0 = 0; j0 < nq; j0 += 3) {
        const int jn = nq - j0 < 3 ? nq - j0 : 3;
        const float *q0 = q + (size_t)j0 * hd, *q1 = q0 + (jn > 1 ? hd : 0), *q2 = q0 + (jn > 2 ? 2 * hd : 0);
        int t = 0;
        for (; t + 4 <= n; t += 4) {
            __m256 a[3][4];
            for (int j = 0; j < 3; j++)
                for (int r = 0; r < 4; r++) a[j][r] = _mm256_setzero_ps();
            for (int c = 0; c < nc; c++) {
                const __m256 v0 = _mm256_loadu_ps(q0 + 8 * c), v1 = _mm256_loadu_ps(q1 + 8 * c);
                const __m256 v2 = _mm256_loadu_ps(q2 + 8 * c);
                for (int r = 0; r < 4; r++) {
                    const __m256 k = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(x + (size_t)(t + r) * ld + 8 * c)));
                    a[0][r] = _mm256_fmadd_ps(v0, k, a[0][r]);
                    a[1][r] = _mm256_fmadd_ps(v1, k, a[1][r]);
                    a[2][r] = _mm256_fmadd_ps(v2, k, a[2][r]);
                }
            }
            for (int j = 0; j < jn; j++) {
                const __m256 s = hsum8x8(a[j][0], a[j][1], a[j][2], a[j][3], a[j][0], a[j][1], a[j][2], a[j][3]);
                _mm_storeu_ps(out + (size_t)(j0 + j) * ldo + t, _mm256_castps256_ps128(s));
            }
        }
        for (; t < n; t++)
            for (int j = 0; j < jn; j++) {
                const float *qj = q + (size_t)(j0 + j) * hd;
                __m256 a = _mm256_setzero_ps();
                for (int c = 0; c < nc; c++)
                    a = _mm256_fmadd_ps(_mm256_loadu_ps(qj + 8 * c),
                                        _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(x + (size_t)t * ld + 8 * c))), a);
                out[(size_t)(j0 + j) * ldo + t] = hsum8(a);
            }
    }
}

/* f16 rows weighted into up to 3 query vectors' accumulators, 32 channels per pass (12 accumulators
 * in registers over the rows). hd a multiple of 8. */
RT_AVX2 void kv_rti_f16_accum_avx2(const uint16_t *x, size_t ld, int n, int hd, const float *p, size_t ldp, int nq,
                               float *acc) {
    for (int j0 = 0; j0 < nq; j0 += 3) {
        const int jn = nq - j0 < 3 ? nq - j0 : 3;
        const float *p0 = p + (size_t)j0 * ldp, *p1 = p0 + (jn > 1 ? ldp : 0), *p2 = p0 + (jn > 2 ? 2 * ldp : 0);
        for (int c0 = 0; c0 < hd; c0 += 32) {
            const int nv = (hd - c0 < 32 ? hd - c0 : 32) / 8;
            __m256 a[3][4];
            for (int j = 0; j < 3; j++)
                for (int v = 0; v < 4; v++)
                    a[j][v] = j < jn && v < nv ? _mm256_loadu_ps(acc + (size_t)(j0 + j) * hd + c0 + 8 * v) : _mm256_setzero_ps();
            for (int t = 0; t < n; t++) {
                const __m256 w0 = _mm256_broadcast_ss(p0 + t), w1 = _mm256_broadcast_ss(p1 + t);
                const __m256 w2 = _mm256_broadcast_ss(p2 + t);
                const uint16_t *row = x + (size_t)t * ld + c0;
                for (int v = 0; v < nv; v++) {
                    const __m256 k = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(row + 8 * v)));
                    a[0][v] = _mm256_fmadd_ps(w0, k, a[0][v]);
                    a[1][v] = _mm256_fmadd_ps(w1, k, a[1][v]);
                    a[2][v] = _mm256_fmadd_ps(w2, k, a[2][v]);
                }
            }
            for (int j = 0; j < jn; j++)
                for (int v = 0; v < nv; v++) _mm256_storeu_ps(acc + (size_t)(j0 + j) * hd + c0 + 8 * v, a[j][v]);
        }
    }
}

int kv_rti_avx2_usable(void) {
    static int cached = -1;
    if (cached < 0) {
        __builtin_cpu_init();
        cached = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
    }
    return cached && kv_simd_level_now() >= KV_SIMD_AVX2;
}

#else /* no x86 AVX2 code in this build */
int kv_rti_avx2_usable(void) { return 0; }
void kv_rti_f16_scores_avx2(const uint16_t *x, size_t ld, int n, int hd, const float *q, int nq, float *out, size_t ldo) {
    (void)x, (void)ld, (void)n, (void)hd, (void)q, (void)nq, (void)out, (void)ldo;
}
void kv_rti_f16_accum_avx2(const uint16_t *x, size_t ld, int n, int hd, const float *p, size_t ldp, int nq, float *acc) {
    (void)x, (void)ld, (void)n, (void)hd, (void)p, (void)ldp, (void)nq, (void)acc;
}
void kv_rti_f16_to_f32_row_avx2(float *dst, const uint16_t *src, size_t n) { (void)dst, (void)src, (void)n; }
void kv_rti_f32_to_f16_row_avx2(uint16_t *dst, const float *src, size_t n) { (void)dst, (void)src, (void)n; }
void kv_rti_f32_scores_avx2(const float *x, size_t ld, int n, int hd, const float *q, int nq, float *out, size_t ldo) {
    (void)x, (void)ld, (void)n, (void)hd, (void)q, (void)nq, (void)out, (void)ldo;
}
void kv_rti_f32_accum_avx2(const float *x, size_t ld, int n, int hd, const float *p, size_t ldp, int nq, float *acc) {
    (void)x, (void)ld, (void)n, (void)hd, (void)p, (void)ldp, (void)nq, (void)acc;
}
void kv_rti_exp_avx2(float *x, size_t n) { (void)x, (void)n; }
float kv_rti_shift_by_max_avx2(float *x, size_t n) { (void)x, (void)n; return 0.0f; }
void kv_rti_unpack_words_avx2(float *dst, const uint32_t *w, size_t nwords, int bits) {
    (void)dst, (void)w, (void)nwords, (void)bits;
}
void kv_rti_unpack_rows_avx2(float *dst, size_t ldd, const uint32_t *codes, size_t w0, size_t wstride, int rows,
                         size_t nwords, int bits) {
    (void)dst, (void)ldd, (void)codes, (void)w0, (void)wstride, (void)rows, (void)nwords, (void)bits;
}
void kv_rti_uniform_tok_scores_avx2(const float *cf, size_t ldc, int n, int hd, const float *qs, int nj, float *acc,
                                size_t lda) {
    (void)cf, (void)ldc, (void)n, (void)hd, (void)qs, (void)nj, (void)acc, (void)lda;
}
void kv_rti_uniform_chan_accum_avx2(const float *cf, size_t ldc, int n, int hd, const float *s, const int *seg, int nseg,
                                const float *p, size_t ldp, int nj, float *acc) {
    (void)cf, (void)ldc, (void)n, (void)hd, (void)s, (void)seg, (void)nseg, (void)p, (void)ldp, (void)nj, (void)acc;
}
void kv_rti_uniform_tok_scores_fused_avx2(const uint32_t *codes, size_t run0, size_t gs, size_t i0, int n, int hd, int bits,
                                      const float *qs, const float *bias, int nj, float *out, size_t ldo) {
    (void)codes, (void)run0, (void)gs, (void)i0, (void)n, (void)hd, (void)bits, (void)qs, (void)bias, (void)nj, (void)out,
        (void)ldo;
}
void kv_rti_uniform_chan_accum_fused_avx2(const uint32_t *codes, size_t pos0, size_t C, int n, int hd, int bits,
                                      const float *ps, size_t lps, int nseg, const int *seg16, int nj, float *acc) {
    (void)codes, (void)pos0, (void)C, (void)n, (void)hd, (void)bits, (void)ps, (void)lps, (void)nseg, (void)seg16,
        (void)nj, (void)acc;
}
void kv_rti_uniform_fold_avx2(const float *q, int hd, int nj, const void *s, const void *z, size_t i0, int pt, float *qs,
                          float *bias) {
    (void)q, (void)hd, (void)nj, (void)s, (void)z, (void)i0, (void)pt, (void)qs, (void)bias;
}
void kv_rti_uniform_chan_weights_avx2(const void *s, const void *z, int pt, size_t lds, int nseg, const float *p,
                                  size_t ldp, int nj, int n, float *ps, float *zacc) {
    (void)s, (void)z, (void)pt, (void)lds, (void)nseg, (void)p, (void)ldp, (void)nj, (void)n, (void)ps, (void)zacc;
}
#endif
