/* higgs_sse2.c — HIGGS's x86-64 paths (SSE2, the baseline, compiled in; AVX2 CPUs take
 * higgs_avx2.c): the unnormalized Walsh-Hadamard transform, and the encoder's with the group's sum
 * of squares, bit-identical to kv_qm_fwht and kv_qm_sumsq, which the GPU runs.
 *
 * The sum of squares keeps kv_qm_sumsq's 8 lanes (lane k sums elements k, k + 8, ... in order) in
 * two vectors, fed by the transform's first pass, and adds the lanes in its order.
 *
 * Same butterflies as kv_qm_fwht — stage h pairs (j, j + h) into (a + b, a - b), stages in order
 * h = 1, 2, 4, ... — in three kinds of pass: stages 1, 2 and 4 inside each block of 8 values (two
 * vectors; within a vector the pairs come from shuffles, and a - b is computed as a + (-b) by
 * flipping b's sign bit, which IEEE defines to be the same operation); then stages two at a time
 * (h and 2h on four vectors j, j + h, j + 2h, j + 3h, in registers); then a last single stage when
 * the count is odd. So n = 128 takes 3 passes over v instead of 7. tests/kernels checks the bits
 * against kv_qm_fwht for every power of two up to 4096. */
#include "kv_quant_math.h"
#include "kv_kernels_internal.h"

#if defined(__SSE2__)
#include <emmintrin.h>
#include <math.h>

#if defined(__GNUC__)
#define FWHT_INLINE inline __attribute__((always_inline))
#else
#define FWHT_INLINE inline
#endif

/* Output lane: the transform's value, times post[k] (when given), times scale (when used). */
static FWHT_INLINE __m128 finish(__m128 v, const float *post, size_t k, const int use_scale, __m128 scale) {
    if (post) v = _mm_mul_ps(v, _mm_loadu_ps(post + k));
    if (use_scale) v = _mm_mul_ps(v, scale);
    return v;
}

/* Stages 1 and 2 inside one vector of 4 (named values, not an array: gcc -O2 keeps a small array
 * indexed in a loop in memory). */
static FWHT_INLINE __m128 stages_in_vector(__m128 a, __m128 neg_odd, __m128 neg_hi) {
    /* h = 1: [a0 + a1, a0 - a1, a2 + a3, a2 - a3] */
    const __m128 u = _mm_add_ps(_mm_shuffle_ps(a, a, _MM_SHUFFLE(2, 2, 0, 0)), _mm_xor_ps(_mm_shuffle_ps(a, a, _MM_SHUFFLE(3, 3, 1, 1)), neg_odd));
    /* h = 2: [u0 + u2, u1 + u3, u0 - u2, u1 - u3] */
    return _mm_add_ps(_mm_shuffle_ps(u, u, _MM_SHUFFLE(1, 0, 1, 0)), _mm_xor_ps(_mm_shuffle_ps(u, u, _MM_SHUFFLE(3, 2, 3, 2)), neg_hi));
}

/* The encoder's scale from kv_qm_sumsq's 8 lanes (0-3 in lo, 4-7 in hi): *sumsq = their sum, and
 * kv_qm_higgs_enc_mul(sqrtf(*sumsq)) in every lane. */
static FWHT_INLINE __m128 encoder_scale(__m128 lo, __m128 hi, float *sumsq) {
    float l[8];
    _mm_storeu_ps(l, lo);
    _mm_storeu_ps(l + 4, hi);
    *sumsq = kv_qm_sum_lanes8(l);
    return _mm_set1_ps(kv_qm_higgs_enc_mul(sqrtf(*sumsq)));
}

/* dst = H (src * pre) * post * scale, pre/post/scale optional (NULL / use_scale 0); dst may be
 * src. n >= 8, a power of two. With sumsq set: *sumsq = kv_qm_sumsq(src), and the scale is
 * kv_qm_higgs_enc_mul(sqrtf(*sumsq)) instead of scale_f (the encoder's transform). The sum rides on
 * the first pass, which reads the values in kv_qm_sumsq's lane order (lane k: elements k, k + 8,
 * ...); x^2, not (x * sign)^2, though they are equal. */
static FWHT_INLINE void fwht(float *dst, const float *src, size_t n, const float *pre, const float *post,
                             int use_scale, float scale_f, float *sumsq) {
    __m128 scale = _mm_set1_ps(scale_f);
    const __m128 neg_odd = _mm_castsi128_ps(_mm_set_epi32((int)0x80000000u, 0, (int)0x80000000u, 0)); /* lanes 1, 3 */
    const __m128 neg_hi = _mm_castsi128_ps(_mm_set_epi32((int)0x80000000u, (int)0x80000000u, 0, 0)); /* lanes 2, 3 */
    const int block_is_last = n == 8;
    __m128 acc_lo = _mm_setzero_ps(), acc_hi = _mm_setzero_ps();
    if (sumsq && block_is_last) { /* the scale is needed before the only block is finished */
        const __m128 a = _mm_loadu_ps(src), b = _mm_loadu_ps(src + 4);
        scale = encoder_scale(_mm_mul_ps(a, a), _mm_mul_ps(b, b), sumsq); /* lanes 0 + x^2 = x^2 */
        use_scale = 1;
    }
    for (size_t i = 0; i < n; i += 8) {
        __m128 a = _mm_loadu_ps(src + i), b = _mm_loadu_ps(src + i + 4);
        if (sumsq && !block_is_last) {
            acc_lo = _mm_add_ps(acc_lo, _mm_mul_ps(a, a));
            acc_hi = _mm_add_ps(acc_hi, _mm_mul_ps(b, b));
        }
        if (pre) {
            a = _mm_mul_ps(a, _mm_loadu_ps(pre + i));
            b = _mm_mul_ps(b, _mm_loadu_ps(pre + i + 4));
        }
        const __m128 v0 = stages_in_vector(a, neg_odd, neg_hi), v1 = stages_in_vector(b, neg_odd, neg_hi);
        /* h = 4: across the two vectors */
        const __m128 lo = _mm_add_ps(v0, v1), hi = _mm_sub_ps(v0, v1);
        if (block_is_last) {
            _mm_storeu_ps(dst + i, finish(lo, post, i, use_scale, scale));
            _mm_storeu_ps(dst + i + 4, finish(hi, post, i + 4, use_scale, scale));
        } else {
            _mm_storeu_ps(dst + i, lo);
            _mm_storeu_ps(dst + i + 4, hi);
        }
    }
    if (sumsq && !block_is_last) {
        scale = encoder_scale(acc_lo, acc_hi, sumsq);
        use_scale = 1;
    }
    size_t h = 8;
    for (; 4 * h <= n; h *= 4) { /* stages h and 2h together */
        const int last = 4 * h == n;
        for (size_t i = 0; i < n; i += 4 * h)
            for (size_t j = i; j < i + h; j += 4) {
                const __m128 a = _mm_loadu_ps(dst + j), b = _mm_loadu_ps(dst + j + h);
                const __m128 c = _mm_loadu_ps(dst + j + 2 * h), d = _mm_loadu_ps(dst + j + 3 * h);
                const __m128 ab = _mm_add_ps(a, b), amb = _mm_sub_ps(a, b); /* stage h */
                const __m128 cd = _mm_add_ps(c, d), cmd = _mm_sub_ps(c, d);
                __m128 o0 = _mm_add_ps(ab, cd), o1 = _mm_add_ps(amb, cmd); /* stage 2h */
                __m128 o2 = _mm_sub_ps(ab, cd), o3 = _mm_sub_ps(amb, cmd);
                if (last) {
                    o0 = finish(o0, post, j, use_scale, scale);
                    o1 = finish(o1, post, j + h, use_scale, scale);
                    o2 = finish(o2, post, j + 2 * h, use_scale, scale);
                    o3 = finish(o3, post, j + 3 * h, use_scale, scale);
                }
                _mm_storeu_ps(dst + j, o0);
                _mm_storeu_ps(dst + j + h, o1);
                _mm_storeu_ps(dst + j + 2 * h, o2);
                _mm_storeu_ps(dst + j + 3 * h, o3);
            }
    }
    if (h < n) /* one stage left: h = n / 2 */
        for (size_t j = 0; j < h; j += 4) {
            const __m128 a = _mm_loadu_ps(dst + j), b = _mm_loadu_ps(dst + j + h);
            _mm_storeu_ps(dst + j, finish(_mm_add_ps(a, b), post, j, use_scale, scale));
            _mm_storeu_ps(dst + j + h, finish(_mm_sub_ps(a, b), post, j + h, use_scale, scale));
        }
}

int kv_fwht_sse2(float *dst, const float *src, size_t n) {
    if (n < 8) return 0;
    fwht(dst, src, n, NULL, NULL, 0, 1.0f, NULL);
    return 1;
}

int kv_higgs_transform_sse2(float *dst, const float *x, size_t n, const float *signs, float *sumsq) {
    if (n < 8) return 0;
    fwht(dst, x, n, signs, NULL, 0, 1.0f, sumsq);
    return 1;
}

int kv_fwht_sse2_decode(float *dst, const float *v, size_t n, const float *signs) {
    if (n < 8) return 0;
    fwht(dst, v, n, NULL, signs, 0, 1.0f, NULL);
    return 1;
}

#else /* not x86-64 */

int kv_fwht_sse2(float *dst, const float *src, size_t n) {
    (void)dst, (void)src, (void)n;
    return 0;
}
int kv_higgs_transform_sse2(float *dst, const float *x, size_t n, const float *signs, float *sumsq) {
    (void)dst, (void)x, (void)n, (void)signs, (void)sumsq;
    return 0;
}
int kv_fwht_sse2_decode(float *dst, const float *v, size_t n, const float *signs) {
    (void)dst, (void)v, (void)n, (void)signs;
    return 0;
}

#endif
