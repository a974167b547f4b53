/* higgs_avx2.c — HIGGS's transform with AVX2 (8 lanes), for x86-64 CPUs that have it: chosen at run
 * time (kv_simd_level), the SSE2 paths in higgs_sse2.c otherwise. Bit-identical to kv_qm_fwht and
 * kv_qm_sumsq, which the GPU runs (tested at every level).
 *
 * Same butterflies as kv_qm_fwht — stage h pairs (j, j + h) into (a + b, a - b), stages in order
 * h = 1, 2, 4, ... — in passes over the group: stages 1, 2, 4 and 8 inside each block of 16 values
 * (two vectors; stages 1 and 2 pair lanes through shuffles within each 128-bit half, stage 4 pairs
 * the halves, and a - b is computed as a + (-b), which IEEE defines to be the same operation), then
 * stages three at a time on eight vectors j, j + h, ..., j + 7h in registers, then two, then one. A
 * group of 128 takes two passes (SSE2: three).
 *
 * The encoder's sum of squares rides on the first pass: kv_qm_sumsq's lane k sums elements k, k + 8,
 * ... in order, which is one 8-lane accumulator fed in the order the pass reads (x^2, not
 * (x * sign)^2, though they are equal). The global -ffp-contract=off keeps x * x + acc two
 * roundings, and "fma" is not enabled here. */
#include "kv_quant_math.h"
#include "kv_kernels_internal.h"

#if KV_HAVE_X86_AVX2
#include <immintrin.h>
#include <math.h>

#define AVX2_FN static inline __attribute__((target("avx2"), always_inline))
#define AVX2_ENTRY __attribute__((target("avx2")))

/* What the transform does around the butterflies. */
typedef struct fwht_io {
    const float *pre;  /* inputs times pre[k] (the encoder's signs), or NULL */
    const float *post; /* outputs times post[k] (the decoder's signs), or NULL */
    float *sumsq;      /* when set: kv_qm_sumsq of the input, and outputs times kv_qm_higgs_enc_mul */
} fwht_io;

/* The encoder's scale from kv_qm_sumsq's 8 lanes in acc: *sumsq = their sum, and
 * kv_qm_higgs_enc_mul(sqrtf(*sumsq)) in every lane. */
AVX2_FN __m256 encoder_scale(__m256 acc, float *sumsq) {
    float l[8];
    _mm256_storeu_ps(l, acc);
    *sumsq = kv_qm_sum_lanes8(l);
    return _mm256_set1_ps(kv_qm_higgs_enc_mul(sqrtf(*sumsq)));
}

AVX2_FN __m256 finish(__m256 v, const float *post, size_t k, int use_scale, __m256 scale) {
    if (post) v = _mm256_mul_ps(v, _mm256_loadu_ps(post + k));
    if (use_scale) v = _mm256_mul_ps(v, scale);
    return v;
}

/* One butterfly: (a, b) <- (a + b, a - b). */
#define BUTTERFLY(a, b)                                                                            \
    do {                                                                                           \
        const __m256 a_ = (a);                                                                     \
        (a) = _mm256_add_ps(a_, (b));                                                              \
        (b) = _mm256_sub_ps(a_, (b));                                                              \
    } while (0)

/* Stages h, 2h and 4h on the 8 vectors at j, j + h, ..., j + 7h, kept in named registers (an array
 * indexed in loops stays in memory at -O2); outputs finished when last. */
AVX2_FN void stages3(float *dst, size_t j, size_t h, int last, const float *post, int use_scale, __m256 scale) {
    float *p0 = dst + j, *p1 = p0 + h, *p2 = p1 + h, *p3 = p2 + h, *p4 = p3 + h, *p5 = p4 + h, *p6 = p5 + h, *p7 = p6 + h;
    __m256 r0 = _mm256_loadu_ps(p0), r1 = _mm256_loadu_ps(p1), r2 = _mm256_loadu_ps(p2), r3 = _mm256_loadu_ps(p3);
    __m256 r4 = _mm256_loadu_ps(p4), r5 = _mm256_loadu_ps(p5), r6 = _mm256_loadu_ps(p6), r7 = _mm256_loadu_ps(p7);
    BUTTERFLY(r0, r1); BUTTERFLY(r2, r3); BUTTERFLY(r4, r5); BUTTERFLY(r6, r7); /* stage h */
    BUTTERFLY(r0, r2); BUTTERFLY(r1, r3); BUTTERFLY(r4, r6); BUTTERFLY(r5, r7); /* stage 2h */
    BUTTERFLY(r0, r4); BUTTERFLY(r1, r5); BUTTERFLY(r2, r6); BUTTERFLY(r3, r7); /* stage 4h */
    if (last) {
        r0 = finish(r0, post, j, use_scale, scale), r1 = finish(r1, post, j + h, use_scale, scale);
        r2 = finish(r2, post, j + 2 * h, use_scale, scale), r3 = finish(r3, post, j + 3 * h, use_scale, scale);
        r4 = finish(r4, post, j + 4 * h, use_scale, scale), r5 = finish(r5, post, j + 5 * h, use_scale, scale);
        r6 = finish(r6, post, j + 6 * h, use_scale, scale), r7 = finish(r7, post, j + 7 * h, use_scale, scale);
    }
    _mm256_storeu_ps(p0, r0), _mm256_storeu_ps(p1, r1), _mm256_storeu_ps(p2, r2), _mm256_storeu_ps(p3, r3);
    _mm256_storeu_ps(p4, r4), _mm256_storeu_ps(p5, r5), _mm256_storeu_ps(p6, r6), _mm256_storeu_ps(p7, r7);
}

/* Stages h and 2h on the 4 vectors at j, j + h, j + 2h, j + 3h. */
AVX2_FN void stages2(float *dst, size_t j, size_t h, int last, const float *post, int use_scale, __m256 scale) {
    float *p0 = dst + j, *p1 = p0 + h, *p2 = p1 + h, *p3 = p2 + h;
    __m256 r0 = _mm256_loadu_ps(p0), r1 = _mm256_loadu_ps(p1), r2 = _mm256_loadu_ps(p2), r3 = _mm256_loadu_ps(p3);
    BUTTERFLY(r0, r1); BUTTERFLY(r2, r3); /* stage h */
    BUTTERFLY(r0, r2); BUTTERFLY(r1, r3); /* stage 2h */
    if (last) {
        r0 = finish(r0, post, j, use_scale, scale), r1 = finish(r1, post, j + h, use_scale, scale);
        r2 = finish(r2, post, j + 2 * h, use_scale, scale), r3 = finish(r3, post, j + 3 * h, use_scale, scale);
    }
    _mm256_storeu_ps(p0, r0), _mm256_storeu_ps(p1, r1), _mm256_storeu_ps(p2, r2), _mm256_storeu_ps(p3, r3);
}

/* Stage h on the 2 vectors at j, j + h. */
AVX2_FN void stages1(float *dst, size_t j, size_t h, int last, const float *post, int use_scale, __m256 scale) {
    __m256 r0 = _mm256_loadu_ps(dst + j), r1 = _mm256_loadu_ps(dst + j + h);
    BUTTERFLY(r0, r1);
    if (last) r0 = finish(r0, post, j, use_scale, scale), r1 = finish(r1, post, j + h, use_scale, scale);
    _mm256_storeu_ps(dst + j, r0), _mm256_storeu_ps(dst + j + h, r1);
}

/* Stages 1, 2 and 4 inside one vector of 8. */
AVX2_FN __m256 stages_in_vector(__m256 a) {
    const int32_t s = INT32_MIN; /* the sign bit */
    const __m256 neg_odd = _mm256_castsi256_ps(_mm256_set_epi32(s, 0, s, 0, s, 0, s, 0));
    const __m256 neg_hi2 = _mm256_castsi256_ps(_mm256_set_epi32(s, s, 0, 0, s, s, 0, 0));
    const __m256 neg_hi4 = _mm256_castsi256_ps(_mm256_set_epi32(s, s, s, s, 0, 0, 0, 0));
    /* h = 1: [a0 + a1, a0 - a1, a2 + a3, a2 - a3] in each half */
    a = _mm256_add_ps(_mm256_shuffle_ps(a, a, _MM_SHUFFLE(2, 2, 0, 0)), _mm256_xor_ps(_mm256_shuffle_ps(a, a, _MM_SHUFFLE(3, 3, 1, 1)), neg_odd));
    /* h = 2: [u0 + u2, u1 + u3, u0 - u2, u1 - u3] in each half */
    a = _mm256_add_ps(_mm256_shuffle_ps(a, a, _MM_SHUFFLE(1, 0, 1, 0)), _mm256_xor_ps(_mm256_shuffle_ps(a, a, _MM_SHUFFLE(3, 2, 3, 2)), neg_hi2));
    /* h = 4: [lo + hi, lo - hi] across the halves */
    return _mm256_add_ps(_mm256_permute2f128_ps(a, a, 0x00), _mm256_xor_ps(_mm256_permute2f128_ps(a, a, 0x11), neg_hi4));
}

/* dst = H (src * pre) * post * scale (see fwht_io); n >= 16, a power of two; dst may be src. */
AVX2_FN void fwht(float *dst, const float *src, size_t n, fwht_io io) {
    const int one_pass = n == 16; /* stages 1 to 8 are all of them */
    __m256 acc = _mm256_setzero_ps(), scale = _mm256_set1_ps(1.0f);
    int use_scale = 0;
    if (io.sumsq && one_pass) { /* the scale is needed before the only pass ends */
        for (size_t i = 0; i < n; i += 8) {
            const __m256 x = _mm256_loadu_ps(src + i);
            acc = _mm256_add_ps(acc, _mm256_mul_ps(x, x));
        }
        scale = encoder_scale(acc, io.sumsq);
        use_scale = 1;
    }
    for (size_t i = 0; i < n; i += 16) {
        __m256 a = _mm256_loadu_ps(src + i), b = _mm256_loadu_ps(src + i + 8);
        if (io.sumsq && !one_pass) {
            acc = _mm256_add_ps(acc, _mm256_mul_ps(a, a));
            acc = _mm256_add_ps(acc, _mm256_mul_ps(b, b));
        }
        if (io.pre) {
            a = _mm256_mul_ps(a, _mm256_loadu_ps(io.pre + i));
            b = _mm256_mul_ps(b, _mm256_loadu_ps(io.pre + i + 8));
        }
        const __m256 v0 = stages_in_vector(a), v1 = stages_in_vector(b);
        /* h = 8: across the two vectors */
        const __m256 lo = _mm256_add_ps(v0, v1), hi = _mm256_sub_ps(v0, v1);
        _mm256_storeu_ps(dst + i, one_pass ? finish(lo, io.post, i, use_scale, scale) : lo);
        _mm256_storeu_ps(dst + i + 8, one_pass ? finish(hi, io.post, i + 8, use_scale, scale) : hi);
    }
    if (one_pass) return;
    if (io.sumsq) {
        scale = encoder_scale(acc, io.sumsq);
        use_scale = 1;
    }
    for (size_t h = 16; h < n;) {
        int count = 1; /* stages in this pass: 3 while enough remain */
        while (count < 3 && (h << (count + 1)) <= n) count++;
        const size_t span = h << count;
        const int last = span == n;
        for (size_t i = 0; i < n; i += span)
            for (size_t j = i; j < i + h; j += 8) {
                if (count == 3)
                    stages3(dst, j, h, last, io.post, use_scale, scale);
                else if (count == 2)
                    stages2(dst, j, h, last, io.post, use_scale, scale);
                else
                    stages1(dst, j, h, last, io.post, use_scale, scale);
            }
        h = span;
    }
}

AVX2_ENTRY int kv_fwht_avx2(float *dst, const float *src, size_t n) {
    if (n < 16) return 0;
    fwht(dst, src, n, (fwht_io){0});
    return 1;
}

AVX2_ENTRY int kv_higgs_transform_avx2(float *dst, const float *x, size_t n, const float *signs, float *sumsq) {
    if (n < 16) return 0;
    fwht(dst, x, n, (fwht_io){.pre = signs, .sumsq = sumsq});
    return 1;
}

AVX2_ENTRY int kv_fwht_avx2_decode(float *dst, const float *v, size_t n, const float *signs) {
    if (n < 16) return 0;
    fwht(dst, v, n, (fwht_io){.post = signs});
    return 1;
}

#else /* no AVX2 code on this compiler or machine */

int kv_fwht_avx2(float *dst, const float *src, size_t n) {
    (void)dst, (void)src, (void)n;
    return 0;
}
int kv_higgs_transform_avx2(float *dst, const float *x, size_t n, const float *signs, float *sumsq) {
    (void)dst, (void)x, (void)n, (void)signs, (void)sumsq;
    return 0;
}
int kv_fwht_avx2_decode(float *dst, const float *v, size_t n, const float *signs) {
    (void)dst, (void)v, (void)n, (void)signs;
    return 0;
}

#endif
