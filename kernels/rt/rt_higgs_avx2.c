/* rt_higgs_avx2.c — the HIGGS kernels of rt_higgs.c for 4-bit indices (n = 16 grid points: HIGGS-2 with
 * d = 2), with AVX2 + FMA, chosen at run time (rt_higgs.c says when). RUNTIME.md §3.1.
 *
 * A 16-entry float table is two registers of 8, and `vpermps` looks up 8 entries at once from the low 3
 * bits of each 32-bit lane (the bits above are ignored): so a word of eight 4-bit indices, shifted right
 * by 4k, indexes both halves of a table for slot k, and shifted left by 28 - 4k it carries the index's
 * bit 3 in the sign bit, which `vblendvps` reads to pick the half. No mask, no unpacking to bytes, no
 * gather: the byte-shuffle lookup of ggml's IQ4_NL dot products, on floats, so that nothing is rounded
 * differently from the scalar code.
 *
 * Scores: the lanes are 8 tokens. Each token's score is the sum, over the pieces of a group in order,
 * of the query's table entry of the piece's index, times the group's multiplier, added over groups in
 * order: the operations of rt_higgs.c's portable loop, in the same order and without fusing (the
 * multiplier's product and its sum stay two roundings), so the scores are the portable loop's bits.
 * Values: the lanes are 8 pieces of one token. A word gives the x (first) and y (second) coordinates of
 * its 8 pieces' grid points, accumulated with fused multiply-adds into per-coordinate accumulators whose
 * lanes hold pieces (0, 1, 4, 5, 2, 3, 6, 7) of the word, so that one unpack puts them back in channel
 * order. The fused products round once instead of twice: within the runtime's bound, not the portable
 * bits (tests/runtime compares them). */
#include "kvrt.h"
#include "rt_internal.h"
#include "rt_higgs_kernels.h"

#if KV_HAVE_X86_AVX2
#include <immintrin.h>

#define RT_AVX2 __attribute__((target("avx2,fma,f16c")))

/* Word w of 8 tokens: rows of ws words, the first token's word at codes[w0 + w] (8 loads). */
RT_AVX2 static inline __m256i words8(const uint32_t *codes, size_t w0, size_t ws, int w) {
    const uint32_t *c = codes + w0 + (size_t)w;
    return _mm256_setr_epi32((int)c[0], (int)c[ws], (int)c[2 * ws], (int)c[3 * ws], (int)c[4 * ws], (int)c[5 * ws],
                             (int)c[6 * ws], (int)c[7 * ws]);
}

/* The entry of a 16-entry table t for the index in bits [4k, 4k + 4) of each lane: iv = word >> 4k (vpermps
 * reads its low 3 bits), mk = word << (28 - 4k) (bit 3 in the sign). */
RT_AVX2 static inline __m256 lut16(const float *t, __m256i iv, __m256 mk) {
    const __m256 lo = _mm256_permutevar8x32_ps(_mm256_loadu_ps(t), iv);
    const __m256 hi = _mm256_permutevar8x32_ps(_mm256_loadu_ps(t + 8), iv);
    return _mm256_blendv_ps(lo, hi, mk);
}

/* Scores of 8 tokens for JN (1..4) query vectors; see kv_rti_higgs_scores16_avx2. */
RT_AVX2 __attribute__((always_inline)) static inline void scores8_t(const int JN, const uint32_t *codes, size_t w0,
                                                                    size_t ws, int words, int wpg, const float *lut,
                                                                    size_t pf, const float *mul, int ng,
                                                                    float *out, size_t ld) {
    __m256 tot[4];
    for (int j = 0; j < JN; j++) tot[j] = _mm256_setzero_ps();
    for (int gi = 0; gi < ng; gi++) {
        __m256 s[4];
        for (int j = 0; j < JN; j++) s[j] = _mm256_setzero_ps();
        for (int w = gi * wpg; w < (gi + 1) * wpg; w++) {
            const __m256i wv = words8(codes, w0, ws, w);
            const float *t0 = lut + (size_t)w * 8 * 16;
#define RT_HSLOT(k)                                                                                                   \
    do {                                                                                                              \
        const __m256i iv = _mm256_srli_epi32(wv, 4 * (k));                                                          \
        const __m256 mk = _mm256_castsi256_ps(_mm256_slli_epi32(wv, 28 - 4 * (k)));                                \
        for (int j = 0; j < JN; j++) s[j] = _mm256_add_ps(s[j], lut16(t0 + (size_t)j * pf + 16 * (k), iv, mk));    \
    } while (0)
            RT_HSLOT(0); RT_HSLOT(1); RT_HSLOT(2); RT_HSLOT(3);
            RT_HSLOT(4); RT_HSLOT(5); RT_HSLOT(6); RT_HSLOT(7);
#undef RT_HSLOT
        }
        const __m256 m = _mm256_loadu_ps(mul + (size_t)gi * 8);
        for (int j = 0; j < JN; j++) tot[j] = _mm256_add_ps(tot[j], _mm256_mul_ps(s[j], m));
    }
    for (int j = 0; j < JN; j++) _mm256_storeu_ps(out + (size_t)j * ld, tot[j]);
}

/* Scores of 8 tokens against nq query vectors' tables: token i's indices start at word w0 + i * ws (the head's
 * `words` words, wpg per group of the head), lut + j * pf + p * 16 is query j's table of piece p, mul[gi * 8 + i]
 * token i's multiplier of group gi (ng groups), out[j * ld + i] the scores. */
RT_AVX2 void kv_rti_higgs_scores16_avx2(const uint32_t *codes, size_t w0, size_t ws, int words, int wpg, const float *lut,
                                    size_t pf, int nq, const float *mul, int ng, float *out, size_t ld) {
    (void)words;
    for (int j0 = 0; j0 < nq; j0 += 4) {
        const int jn = nq - j0 < 4 ? nq - j0 : 4;
        const float *l0 = lut + (size_t)j0 * pf;
        float *o = out + (size_t)j0 * ld;
        switch (jn) {
        case 1: scores8_t(1, codes, w0, ws, words, wpg, l0, pf, mul, ng, o, ld); break;
        case 2: scores8_t(2, codes, w0, ws, words, wpg, l0, pf, mul, ng, o, ld); break;
        case 3: scores8_t(3, codes, w0, ws, words, wpg, l0, pf, mul, ng, o, ld); break;
        default: scores8_t(4, codes, w0, ws, words, wpg, l0, pf, mul, ng, o, ld); break;
        }
    }
}

/* Values of n tokens for JN (1..3) query vectors over NW (1 or 2) words of the head from word wa; see
 * kv_rti_higgs_accum16_avx2. The accumulators are named variables so that they stay in registers (12 at most, with
 * the grid's 4 halves); unused ones are compiled away. */
RT_AVX2 __attribute__((always_inline)) static inline void accum_t(const int JN, const int NW, const uint32_t *codes,
                                                                  size_t w0, size_t ws, int n, int wa, int wpg,
                                                                  const float *gx, const float *gy, const float *wt,
                                                                  size_t ldw, size_t ldg, float *racc, int hd) {
    /* lane l takes slot (0, 1, 4, 5, 2, 3, 6, 7)[l] of the word: shifts for the index and for its bit 3 */
    const __m256i shr = _mm256_setr_epi32(0, 4, 16, 20, 8, 12, 24, 28);
    const __m256i shl = _mm256_setr_epi32(28, 24, 12, 8, 20, 16, 4, 0);
    const __m256 gx0 = _mm256_loadu_ps(gx), gx1 = _mm256_loadu_ps(gx + 8);
    const __m256 gy0 = _mm256_loadu_ps(gy), gy1 = _mm256_loadu_ps(gy + 8);
    const __m256 z = _mm256_setzero_ps();
    /* channels [16 (wa + u), + 16) of vector j: x y pairs of 8 pieces, split into x (a.x) and y (a.y) */
#define RT_LD(j, u, AX, AY)                                                                                           \
    do {                                                                                                              \
        const float *r_ = racc + (size_t)(j) * (size_t)hd + 16 * (size_t)(wa + (u));                                \
        const __m256 A_ = _mm256_loadu_ps(r_), B_ = _mm256_loadu_ps(r_ + 8);                                          \
        AX = _mm256_shuffle_ps(A_, B_, _MM_SHUFFLE(2, 0, 2, 0));                                                     \
        AY = _mm256_shuffle_ps(A_, B_, _MM_SHUFFLE(3, 1, 3, 1));                                                     \
    } while (0)
#define RT_ST(j, u, AX, AY)                                                                                           \
    do {                                                                                                              \
        float *r_ = racc + (size_t)(j) * (size_t)hd + 16 * (size_t)(wa + (u));                                      \
        _mm256_storeu_ps(r_, _mm256_unpacklo_ps(AX, AY));                                                             \
        _mm256_storeu_ps(r_ + 8, _mm256_unpackhi_ps(AX, AY));                                                         \
    } while (0)
    __m256 x00 = z, y00 = z, x01 = z, y01 = z, x10 = z, y10 = z, x11 = z, y11 = z, x20 = z, y20 = z, x21 = z, y21 = z;
    RT_LD(0, 0, x00, y00);
    if (NW > 1) RT_LD(0, 1, x01, y01);
    if (JN > 1) RT_LD(1, 0, x10, y10);
    if (JN > 1 && NW > 1) RT_LD(1, 1, x11, y11);
    if (JN > 2) RT_LD(2, 0, x20, y20);
    if (JN > 2 && NW > 1) RT_LD(2, 1, x21, y21);
    /* the weights of each word's group, per vector */
    const size_t gA = (size_t)(wa / wpg) * ldg, gB = (size_t)((wa + NW - 1) / wpg) * ldg;
    const float *w0a = wt + gA, *w0b = wt + gB, *w1a = w0a + ldw, *w1b = w0b + ldw, *w2a = w1a + ldw, *w2b = w1b + ldw;
    const uint32_t *c = codes + w0 + (size_t)wa;
    for (int i = 0; i < n; i++, c += ws) {
        const __m256i wv0 = _mm256_set1_epi32((int)c[0]);
        const __m256i iv0 = _mm256_srlv_epi32(wv0, shr);
        const __m256 mk0 = _mm256_castsi256_ps(_mm256_sllv_epi32(wv0, shl));
        const __m256 xa = _mm256_blendv_ps(_mm256_permutevar8x32_ps(gx0, iv0), _mm256_permutevar8x32_ps(gx1, iv0), mk0);
        const __m256 ya = _mm256_blendv_ps(_mm256_permutevar8x32_ps(gy0, iv0), _mm256_permutevar8x32_ps(gy1, iv0), mk0);
        __m256 w = _mm256_broadcast_ss(w0a + i);
        x00 = _mm256_fmadd_ps(w, xa, x00), y00 = _mm256_fmadd_ps(w, ya, y00);
        if (JN > 1) w = _mm256_broadcast_ss(w1a + i), x10 = _mm256_fmadd_ps(w, xa, x10), y10 = _mm256_fmadd_ps(w, ya, y10);
        if (JN > 2) w = _mm256_broadcast_ss(w2a + i), x20 = _mm256_fmadd_ps(w, xa, x20), y20 = _mm256_fmadd_ps(w, ya, y20);
        if (NW > 1) {
            const __m256i wv1 = _mm256_set1_epi32((int)c[1]);
            const __m256i iv1 = _mm256_srlv_epi32(wv1, shr);
            const __m256 mk1 = _mm256_castsi256_ps(_mm256_sllv_epi32(wv1, shl));
            const __m256 xb = _mm256_blendv_ps(_mm256_permutevar8x32_ps(gx0, iv1), _mm256_permutevar8x32_ps(gx1, iv1), mk1);
            const __m256 yb = _mm256_blendv_ps(_mm256_permutevar8x32_ps(gy0, iv1), _mm256_permutevar8x32_ps(gy1, iv1), mk1);
            w = _mm256_broadcast_ss(w0b + i), x01 = _mm256_fmadd_ps(w, xb, x01), y01 = _mm256_fmadd_ps(w, yb, y01);
            if (JN > 1) w = _mm256_broadcast_ss(w1b + i), x11 = _mm256_fmadd_ps(w, xb, x11), y11 = _mm256_fmadd_ps(w, yb, y11);
            if (JN > 2) w = _mm256_broadcast_ss(w2b + i), x21 = _mm256_fmadd_ps(w, xb, x21), y21 = _mm256_fmadd_ps(w, yb, y21);
        }
    }
    RT_ST(0, 0, x00, y00);
    if (NW > 1) RT_ST(0, 1, x01, y01);
    if (JN > 1) RT_ST(1, 0, x10, y10);
    if (JN > 1 && NW > 1) RT_ST(1, 1, x11, y11);
    if (JN > 2) RT_ST(2, 0, x20, y20);
    if (JN > 2 && NW > 1) RT_ST(2, 1, x21, y21);
#undef RT_LD
#undef RT_ST
}

/* Values in the rotated domain for d = 2: racc[j][c] += wt[j][g(c)][i] grid[idx][c % 2] over n tokens (token i's
 * indices start at word w0 + i * ws; `words` words of the head, wpg per group; wt + j * ldw + gi * ldg + i the
 * weight p_i norm_i / g of group gi), gx, gy the grid's x and y coordinates (16 each), racc nq rows of hd. */
RT_AVX2 void kv_rti_higgs_accum16_avx2(const uint32_t *codes, size_t w0, size_t ws, int n, int words, int wpg,
                                   const float *gx, const float *gy, const float *wt, size_t ldw, size_t ldg, int nq,
                                   float *racc, int hd) {
    for (int j0 = 0; j0 < nq; j0 += 3) {
        const int jn = nq - j0 < 3 ? nq - j0 : 3;
        const float *w = wt + (size_t)j0 * ldw;
        float *r = racc + (size_t)j0 * (size_t)hd;
        for (int wa = 0; wa < words; wa += 2) {
            const int two = words - wa >= 2;
#define RT_HACC(J)                                                                                                    \
    do {                                                                                                              \
        if (two)                                                                                                      \
            accum_t(J, 2, codes, w0, ws, n, wa, wpg, gx, gy, w, ldw, ldg, r, hd);                                     \
        else                                                                                                          \
            accum_t(J, 1, codes, w0, ws, n, wa, wpg, gx, gy, w, ldw, ldg, r, hd);                                     \
    } while (0)
            if (jn == 1)
                RT_HACC(1);
            else if (jn == 2)
                RT_HACC(2);
            else
                RT_HACC(3);
#undef RT_HACC
        }
    }
}

/* Decode n tokens of a head (d = 2, 16 points) to the real domain: out row i = D H (grid[idx] * mul) per group of
 * g channels, exactly kv_higgs_decode_ref's values. Per word the 8 pieces' coordinates are held split as in
 * accum_t (x lanes, y lanes; lane l = slot (0, 1, 4, 5, 2, 3, 6, 7)[l]), where the FWHT's butterflies are: stage 1
 * x with y; stages 2, 4, 8 lanes of one vector (partners by a shuffle, a + b and a - b as one fused multiply-add with
 * +1 or -1, which rounds a + b or a - b exactly once: the same bits as kv_qm_fwht); stages 16 and up whole vectors.
 * Stages in kv_qm_fwht's order, then the signs, then one unpack back to channel order. signs: the head's hd signs;
 * mul[gi * ldm + i]: token i's multiplier of the head's group gi. words <= 16 (head_dim <= 128). */
RT_AVX2 void kv_rti_higgs_decode16_avx2(const uint32_t *codes, size_t w0, size_t ws, int n, int words, int wpg,
                                    const float *gx, const float *gy, const float *mul, size_t ldm,
                                    const float *signs, float *out, size_t ldo) {
    const __m256i shr = _mm256_setr_epi32(0, 4, 16, 20, 8, 12, 24, 28);
    const __m256i shl = _mm256_setr_epi32(28, 24, 12, 8, 20, 16, 4, 0);
    const __m256 gx0 = _mm256_loadu_ps(gx), gx1 = _mm256_loadu_ps(gx + 8);
    const __m256 gy0 = _mm256_loadu_ps(gy), gy1 = _mm256_loadu_ps(gy + 8);
    const __m256 s2 = _mm256_setr_ps(1, -1, 1, -1, 1, -1, 1, -1); /* pieces 2k, 2k+1: lanes (0,1) (2,3) ... */
    const __m256 s8 = _mm256_setr_ps(1, 1, -1, -1, 1, 1, -1, -1); /* pieces k, k+4: lanes (0,2) (1,3) (4,6) (5,7) */
    const __m256 s4 = _mm256_setr_ps(1, 1, 1, 1, -1, -1, -1, -1); /* pieces k, k+2: lanes (l, l+4) */
    __m256 sx[16], sy[16], X[16], Y[16];
    for (int w = 0; w < words; w++) {
        const __m256 A = _mm256_loadu_ps(signs + 16 * w), B = _mm256_loadu_ps(signs + 16 * w + 8);
        sx[w] = _mm256_shuffle_ps(A, B, _MM_SHUFFLE(2, 0, 2, 0));
        sy[w] = _mm256_shuffle_ps(A, B, _MM_SHUFFLE(3, 1, 3, 1));
    }
    const uint32_t *c = codes + w0;
    for (int i = 0; i < n; i++, c += ws) {
        for (int w = 0; w < words; w++) {
            const __m256i wv = _mm256_set1_epi32((int)c[w]);
            const __m256i iv = _mm256_srlv_epi32(wv, shr);
            const __m256 mk = _mm256_castsi256_ps(_mm256_sllv_epi32(wv, shl));
            const __m256 m = _mm256_broadcast_ss(mul + (size_t)(w / wpg) * ldm + (size_t)i);
            const __m256 x = _mm256_blendv_ps(_mm256_permutevar8x32_ps(gx0, iv), _mm256_permutevar8x32_ps(gx1, iv), mk);
            const __m256 y = _mm256_blendv_ps(_mm256_permutevar8x32_ps(gy0, iv), _mm256_permutevar8x32_ps(gy1, iv), mk);
            const __m256 xm = _mm256_mul_ps(x, m), ym = _mm256_mul_ps(y, m);
            /* stage 1: channels 2p, 2p + 1 */
            __m256 a = _mm256_add_ps(xm, ym), b = _mm256_sub_ps(xm, ym);
            /* stage 2: pieces 2k, 2k + 1 (adjacent lanes) */
            a = _mm256_fmadd_ps(a, s2, _mm256_permute_ps(a, _MM_SHUFFLE(2, 3, 0, 1)));
            b = _mm256_fmadd_ps(b, s2, _mm256_permute_ps(b, _MM_SHUFFLE(2, 3, 0, 1)));
            /* stage 4: pieces k, k + 2 (lanes l, l + 4) */
            a = _mm256_fmadd_ps(a, s4, _mm256_permute2f128_ps(a, a, 0x01));
            b = _mm256_fmadd_ps(b, s4, _mm256_permute2f128_ps(b, b, 0x01));
            /* stage 8: pieces k, k + 4 (lanes l, l + 2 within a half) */
            a = _mm256_fmadd_ps(a, s8, _mm256_permute_ps(a, _MM_SHUFFLE(1, 0, 3, 2)));
            b = _mm256_fmadd_ps(b, s8, _mm256_permute_ps(b, _MM_SHUFFLE(1, 0, 3, 2)));
            X[w] = a, Y[w] = b;
        }
        /* stages 16 .. g / 2: words w and w + hw inside a group */
        for (int hw = 1; hw < wpg; hw *= 2)
            for (int w = 0; w < words; w++)
                if (!(w & hw)) {
                    const __m256 xa = X[w], ya = Y[w];
                    X[w] = _mm256_add_ps(xa, X[w + hw]), X[w + hw] = _mm256_sub_ps(xa, X[w + hw]);
                    Y[w] = _mm256_add_ps(ya, Y[w + hw]), Y[w + hw] = _mm256_sub_ps(ya, Y[w + hw]);
                }
        float *o = out + (size_t)i * ldo;
        for (int w = 0; w < words; w++) {
            const __m256 xs = _mm256_mul_ps(X[w], sx[w]), ys = _mm256_mul_ps(Y[w], sy[w]);
            _mm256_storeu_ps(o + 16 * w, _mm256_unpacklo_ps(xs, ys));
            _mm256_storeu_ps(o + 16 * w + 8, _mm256_unpackhi_ps(xs, ys));
        }
    }
}

/* Keys stored before RoPE, fused: per token the head's key decoded as kv_rti_higgs_decode16_avx2 does (the same bits),
 * rotated to its position with rt_rope.c's arithmetic (two products and a sum, never fused: the same bits as the
 * decoded tile rotated), all in the split lane order, then dotted with the query vectors held in that order
 * (fused multiply-adds: within the runtime's bound, as kv_rti_f32_scores). W words (head_dim = 16 W), wpg words per
 * group. rope: 1 adjacent pairs, 2 halves. cs, sn: the RoPE table rows of token i at cs + pos_i * half. */
RT_AVX2 __attribute__((always_inline)) static inline void scores_rope_t(
    const int W, const uint32_t *codes, size_t w0, size_t ws, int n, int wpg, const float *gx, const float *gy,
    const float *mul, size_t ldm, const float *signs, int rope, const float *cs, const float *sn, size_t half, int p0,
    const int32_t *pos, const float *qs, int nq, float *out, size_t ld) {
    const __m256i shr = _mm256_setr_epi32(0, 4, 16, 20, 8, 12, 24, 28);
    const __m256i shl = _mm256_setr_epi32(28, 24, 12, 8, 20, 16, 4, 0);
    const __m256i lord = _mm256_setr_epi32(0, 1, 4, 5, 2, 3, 6, 7); /* lane l holds slot lord[l] */
    const __m256 s2 = _mm256_setr_ps(1, -1, 1, -1, 1, -1, 1, -1);
    const __m256 s8 = _mm256_setr_ps(1, 1, -1, -1, 1, 1, -1, -1);
    const __m256 s4 = _mm256_setr_ps(1, 1, 1, 1, -1, -1, -1, -1);
    float sgx[8 * 8], sgy[8 * 8];
    for (int w = 0; w < W; w++) {
        const __m256 A = _mm256_loadu_ps(signs + 16 * w), B = _mm256_loadu_ps(signs + 16 * w + 8);
        _mm256_storeu_ps(sgx + 8 * w, _mm256_shuffle_ps(A, B, _MM_SHUFFLE(2, 0, 2, 0)));
        _mm256_storeu_ps(sgy + 8 * w, _mm256_shuffle_ps(A, B, _MM_SHUFFLE(3, 1, 3, 1)));
    }
    float acc[8 * 8 * 4]; /* [token % 8][vector][8 lanes], vectors 4 at a time */
    const uint32_t *c0 = codes + w0;
    for (int j0 = 0; j0 < nq; j0 += 4) {
        const int jn = nq - j0 < 4 ? nq - j0 : 4;
        const uint32_t *c = c0;
        for (int i = 0; i < n; i++, c += ws) {
            __m256 X[8], Y[8];
            for (int w = 0; w < W; w++) {
                const __m256i wv = _mm256_set1_epi32((int)c[w]);
                const __m256i iv = _mm256_srlv_epi32(wv, shr);
                const __m256 mk = _mm256_castsi256_ps(_mm256_sllv_epi32(wv, shl));
                const __m256 m = _mm256_broadcast_ss(mul + (size_t)(w / wpg) * ldm + (size_t)i);
                const __m256 x = _mm256_blendv_ps(_mm256_permutevar8x32_ps(_mm256_loadu_ps(gx), iv),
                                                  _mm256_permutevar8x32_ps(_mm256_loadu_ps(gx + 8), iv), mk);
                const __m256 y = _mm256_blendv_ps(_mm256_permutevar8x32_ps(_mm256_loadu_ps(gy), iv),
                                                  _mm256_permutevar8x32_ps(_mm256_loadu_ps(gy + 8), iv), mk);
                const __m256 xm = _mm256_mul_ps(x, m), ym = _mm256_mul_ps(y, m);
                __m256 a = _mm256_add_ps(xm, ym), b = _mm256_sub_ps(xm, ym);
                a = _mm256_fmadd_ps(a, s2, _mm256_permute_ps(a, _MM_SHUFFLE(2, 3, 0, 1)));
                b = _mm256_fmadd_ps(b, s2, _mm256_permute_ps(b, _MM_SHUFFLE(2, 3, 0, 1)));
                a = _mm256_fmadd_ps(a, s4, _mm256_permute2f128_ps(a, a, 0x01));
                b = _mm256_fmadd_ps(b, s4, _mm256_permute2f128_ps(b, b, 0x01));
                a = _mm256_fmadd_ps(a, s8, _mm256_permute_ps(a, _MM_SHUFFLE(1, 0, 3, 2)));
                b = _mm256_fmadd_ps(b, s8, _mm256_permute_ps(b, _MM_SHUFFLE(1, 0, 3, 2)));
                X[w] = a, Y[w] = b;
            }
            for (int hw = 1; hw < wpg; hw *= 2)
                for (int w = 0; w < W; w++)
                    if (!(w & hw)) {
                        const __m256 xa = X[w], ya = Y[w];
                        X[w] = _mm256_add_ps(xa, X[w + hw]), X[w + hw] = _mm256_sub_ps(xa, X[w + hw]);
                        Y[w] = _mm256_add_ps(ya, Y[w + hw]), Y[w + hw] = _mm256_sub_ps(ya, Y[w + hw]);
                    }
            for (int w = 0; w < W; w++) {
                X[w] = _mm256_mul_ps(X[w], _mm256_loadu_ps(sgx + 8 * w));
                Y[w] = _mm256_mul_ps(Y[w], _mm256_loadu_ps(sgy + 8 * w));
            }
            const size_t row = (size_t)(pos ? pos[i] : p0 + i) * half;
            const float *cr = cs + row, *sr = sn + row;
            if (rope == 1) { /* pair p = channels (2p, 2p + 1): lane l of word w, x with y */
                for (int w = 0; w < W; w++) {
                    const __m256 C = _mm256_permutevar8x32_ps(_mm256_loadu_ps(cr + 8 * w), lord);
                    const __m256 S = _mm256_permutevar8x32_ps(_mm256_loadu_ps(sr + 8 * w), lord);
                    const __m256 a = X[w], b = Y[w];
                    X[w] = _mm256_sub_ps(_mm256_mul_ps(a, C), _mm256_mul_ps(b, S));
                    Y[w] = _mm256_add_ps(_mm256_mul_ps(a, S), _mm256_mul_ps(b, C));
                }
            } else { /* pair i = channels (i, i + hd / 2): word w with word w + W / 2, cos/sin of channel i */
                for (int w = 0; w < W / 2; w++) {
                    const __m256 A = _mm256_loadu_ps(cr + 16 * w), B = _mm256_loadu_ps(cr + 16 * w + 8);
                    const __m256 E = _mm256_loadu_ps(sr + 16 * w), F = _mm256_loadu_ps(sr + 16 * w + 8);
                    const __m256 Cx = _mm256_shuffle_ps(A, B, _MM_SHUFFLE(2, 0, 2, 0)), Cy = _mm256_shuffle_ps(A, B, _MM_SHUFFLE(3, 1, 3, 1));
                    const __m256 Sx = _mm256_shuffle_ps(E, F, _MM_SHUFFLE(2, 0, 2, 0)), Sy = _mm256_shuffle_ps(E, F, _MM_SHUFFLE(3, 1, 3, 1));
                    const __m256 ax = X[w], bx = X[w + W / 2], ay = Y[w], by = Y[w + W / 2];
                    X[w] = _mm256_sub_ps(_mm256_mul_ps(ax, Cx), _mm256_mul_ps(bx, Sx));
                    X[w + W / 2] = _mm256_add_ps(_mm256_mul_ps(ax, Sx), _mm256_mul_ps(bx, Cx));
                    Y[w] = _mm256_sub_ps(_mm256_mul_ps(ay, Cy), _mm256_mul_ps(by, Sy));
                    Y[w + W / 2] = _mm256_add_ps(_mm256_mul_ps(ay, Sy), _mm256_mul_ps(by, Cy));
                }
            }
            float *a8 = acc + (size_t)(i % 8) * 32;
            for (int j = 0; j < jn; j++) {
                const float *q = qs + (size_t)(j0 + j) * (size_t)(16 * W);
                __m256 t = _mm256_mul_ps(X[0], _mm256_loadu_ps(q));
                t = _mm256_fmadd_ps(Y[0], _mm256_loadu_ps(q + 8), t);
                for (int w = 1; w < W; w++) {
                    t = _mm256_fmadd_ps(X[w], _mm256_loadu_ps(q + 16 * w), t);
                    t = _mm256_fmadd_ps(Y[w], _mm256_loadu_ps(q + 16 * w + 8), t);
                }
                _mm256_storeu_ps(a8 + 8 * j, t);
            }
            if (i % 8 == 7 || i == n - 1) { /* the lanes of up to 8 tokens summed at once */
                const int t0 = i - i % 8, k = i % 8 + 1;
                for (int j = 0; j < jn; j++) {
                    float *o = out + (size_t)(j0 + j) * ld + (size_t)t0;
                    __m256 v[8];
                    for (int r = 0; r < 8; r++) v[r] = r < k ? _mm256_loadu_ps(acc + (size_t)r * 32 + 8 * j) : _mm256_setzero_ps();
                    const __m256 a = _mm256_hadd_ps(v[0], v[1]), b = _mm256_hadd_ps(v[2], v[3]);
                    const __m256 cc = _mm256_hadd_ps(v[4], v[5]), d = _mm256_hadd_ps(v[6], v[7]);
                    const __m256 ab = _mm256_hadd_ps(a, b), cd = _mm256_hadd_ps(cc, d);
                    const __m256 sum = _mm256_add_ps(_mm256_permute2f128_ps(ab, cd, 0x20), _mm256_permute2f128_ps(ab, cd, 0x31));
                    if (k == 8) {
                        _mm256_storeu_ps(o, sum);
                    } else {
                        float l[8];
                        _mm256_storeu_ps(l, sum);
                        for (int r = 0; r < k; r++) o[r] = l[r];
                    }
                }
            }
        }
    }
}

/* The same for head_dim 64 (4 words: SmolLM2's and many models' heads) with the key in named registers (an array
 * indexed in loops stays in memory at -O2). WPG: words per group, 1, 2 or 4. */
RT_AVX2 __attribute__((always_inline)) static inline void scores_rope4_t(
    const int WPG, const uint32_t *codes, size_t w0, size_t ws, int n, const float *gx, const float *gy,
    const float *mul, size_t ldm, const float *signs, int rope, const float *cs, const float *sn, size_t half, int p0,
    const int32_t *pos, const float *qs, int nq, float *out, size_t ld) {
    const __m256i shr = _mm256_setr_epi32(0, 4, 16, 20, 8, 12, 24, 28);
    const __m256i shl = _mm256_setr_epi32(28, 24, 12, 8, 20, 16, 4, 0);
    const __m256i lord = _mm256_setr_epi32(0, 1, 4, 5, 2, 3, 6, 7);
    float sg[64];
    for (int w = 0; w < 4; w++) {
        const __m256 A = _mm256_loadu_ps(signs + 16 * w), B = _mm256_loadu_ps(signs + 16 * w + 8);
        _mm256_storeu_ps(sg + 16 * w, _mm256_shuffle_ps(A, B, _MM_SHUFFLE(2, 0, 2, 0)));
        _mm256_storeu_ps(sg + 16 * w + 8, _mm256_shuffle_ps(A, B, _MM_SHUFFLE(3, 1, 3, 1)));
    }
    float acc[8 * 4 * 8];
    for (int j0 = 0; j0 < nq; j0 += 4) {
        const int jn = nq - j0 < 4 ? nq - j0 : 4;
        const uint32_t *c = codes + w0;
        for (int i = 0; i < n; i++, c += ws) {
            const float *mi = mul + (size_t)i;
            /* one word: grid points times the group's multiplier, FWHT stages 1, 2, 4, 8 (see the generic kernel) */
#define RT_DW(w, XA, YB)                                                                                              \
    do {                                                                                                              \
        const __m256i wv = _mm256_set1_epi32((int)c[w]);                                                              \
        const __m256i iv = _mm256_srlv_epi32(wv, shr);                                                                \
        const __m256 mk = _mm256_castsi256_ps(_mm256_sllv_epi32(wv, shl));                                           \
        const __m256 m = _mm256_broadcast_ss(mi + (size_t)((w) / WPG) * ldm);                                        \
        const __m256 x = _mm256_blendv_ps(_mm256_permutevar8x32_ps(_mm256_loadu_ps(gx), iv),                         \
                                          _mm256_permutevar8x32_ps(_mm256_loadu_ps(gx + 8), iv), mk);                \
        const __m256 y = _mm256_blendv_ps(_mm256_permutevar8x32_ps(_mm256_loadu_ps(gy), iv),                         \
                                          _mm256_permutevar8x32_ps(_mm256_loadu_ps(gy + 8), iv), mk);                \
        const __m256 xm = _mm256_mul_ps(x, m), ym = _mm256_mul_ps(y, m);                                             \
        __m256 a = _mm256_add_ps(xm, ym), b = _mm256_sub_ps(xm, ym);                                                 \
        const __m256 s2 = _mm256_setr_ps(1, -1, 1, -1, 1, -1, 1, -1), s4 = _mm256_setr_ps(1, 1, 1, 1, -1, -1, -1, -1); \
        const __m256 s8 = _mm256_setr_ps(1, 1, -1, -1, 1, 1, -1, -1);                                                 \
        a = _mm256_fmadd_ps(a, s2, _mm256_permute_ps(a, _MM_SHUFFLE(2, 3, 0, 1)));                                   \
        b = _mm256_fmadd_ps(b, s2, _mm256_permute_ps(b, _MM_SHUFFLE(2, 3, 0, 1)));                                   \
        a = _mm256_fmadd_ps(a, s4, _mm256_permute2f128_ps(a, a, 0x01));                                              \
        b = _mm256_fmadd_ps(b, s4, _mm256_permute2f128_ps(b, b, 0x01));                                              \
        XA = _mm256_fmadd_ps(a, s8, _mm256_permute_ps(a, _MM_SHUFFLE(1, 0, 3, 2)));                                  \
        YB = _mm256_fmadd_ps(b, s8, _mm256_permute_ps(b, _MM_SHUFFLE(1, 0, 3, 2)));                                  \
    } while (0)
#define RT_BF(A, B)                                                                                                   \
    do {                                                                                                              \
        const __m256 a_ = (A);                                                                                        \
        (A) = _mm256_add_ps(a_, (B));                                                                                 \
        (B) = _mm256_sub_ps(a_, (B));                                                                                 \
    } while (0)
            __m256 X0, Y0, X1, Y1, X2, Y2, X3, Y3;
            RT_DW(0, X0, Y0);
            RT_DW(1, X1, Y1);
            RT_DW(2, X2, Y2);
            RT_DW(3, X3, Y3);
            if (WPG >= 2) { RT_BF(X0, X1); RT_BF(Y0, Y1); RT_BF(X2, X3); RT_BF(Y2, Y3); } /* stage 16 */
            if (WPG >= 4) { RT_BF(X0, X2); RT_BF(Y0, Y2); RT_BF(X1, X3); RT_BF(Y1, Y3); } /* stage 32 */
            X0 = _mm256_mul_ps(X0, _mm256_loadu_ps(sg)), Y0 = _mm256_mul_ps(Y0, _mm256_loadu_ps(sg + 8));
            X1 = _mm256_mul_ps(X1, _mm256_loadu_ps(sg + 16)), Y1 = _mm256_mul_ps(Y1, _mm256_loadu_ps(sg + 24));
            X2 = _mm256_mul_ps(X2, _mm256_loadu_ps(sg + 32)), Y2 = _mm256_mul_ps(Y2, _mm256_loadu_ps(sg + 40));
            X3 = _mm256_mul_ps(X3, _mm256_loadu_ps(sg + 48)), Y3 = _mm256_mul_ps(Y3, _mm256_loadu_ps(sg + 56));
            const size_t row = (size_t)(pos ? pos[i] : p0 + i) * half;
            const float *cr = cs + row, *sr = sn + row;
            if (rope == 1) {
#define RT_RA(w, XA, YB)                                                                                              \
    do {                                                                                                              \
        const __m256 C = _mm256_permutevar8x32_ps(_mm256_loadu_ps(cr + 8 * (w)), lord);                              \
        const __m256 S = _mm256_permutevar8x32_ps(_mm256_loadu_ps(sr + 8 * (w)), lord);                              \
        const __m256 a_ = XA, b_ = YB;                                                                                \
        XA = _mm256_sub_ps(_mm256_mul_ps(a_, C), _mm256_mul_ps(b_, S));                                               \
        YB = _mm256_add_ps(_mm256_mul_ps(a_, S), _mm256_mul_ps(b_, C));                                               \
    } while (0)
                RT_RA(0, X0, Y0);
                RT_RA(1, X1, Y1);
                RT_RA(2, X2, Y2);
                RT_RA(3, X3, Y3);
#undef RT_RA
            } else {
#define RT_RH(w, XA, XB, YA, YB)                                                                                      \
    do {                                                                                                              \
        const __m256 A = _mm256_loadu_ps(cr + 16 * (w)), B = _mm256_loadu_ps(cr + 16 * (w) + 8);                      \
        const __m256 E = _mm256_loadu_ps(sr + 16 * (w)), F = _mm256_loadu_ps(sr + 16 * (w) + 8);                      \
        const __m256 Cx = _mm256_shuffle_ps(A, B, _MM_SHUFFLE(2, 0, 2, 0)), Cy = _mm256_shuffle_ps(A, B, _MM_SHUFFLE(3, 1, 3, 1)); \
        const __m256 Sx = _mm256_shuffle_ps(E, F, _MM_SHUFFLE(2, 0, 2, 0)), Sy = _mm256_shuffle_ps(E, F, _MM_SHUFFLE(3, 1, 3, 1)); \
        const __m256 ax = XA, bx = XB, ay = YA, by = YB;                                                              \
        XA = _mm256_sub_ps(_mm256_mul_ps(ax, Cx), _mm256_mul_ps(bx, Sx));                                             \
        XB = _mm256_add_ps(_mm256_mul_ps(ax, Sx), _mm256_mul_ps(bx, Cx));                                             \
        YA = _mm256_sub_ps(_mm256_mul_ps(ay, Cy), _mm256_mul_ps(by, Sy));                                             \
        YB = _mm256_add_ps(_mm256_mul_ps(ay, Sy), _mm256_mul_ps(by, Cy));                                             \
    } while (0)
                RT_RH(0, X0, X2, Y0, Y2);
                RT_RH(1, X1, X3, Y1, Y3);
#undef RT_RH
            }
#undef RT_DW
#undef RT_BF
            float *a8 = acc + (size_t)(i % 8) * 32;
            for (int j = 0; j < jn; j++) {
                const float *q = qs + (size_t)(j0 + j) * 64;
                __m256 t = _mm256_mul_ps(X0, _mm256_loadu_ps(q));
                t = _mm256_fmadd_ps(Y0, _mm256_loadu_ps(q + 8), t);
                t = _mm256_fmadd_ps(X1, _mm256_loadu_ps(q + 16), t);
                t = _mm256_fmadd_ps(Y1, _mm256_loadu_ps(q + 24), t);
                t = _mm256_fmadd_ps(X2, _mm256_loadu_ps(q + 32), t);
                t = _mm256_fmadd_ps(Y2, _mm256_loadu_ps(q + 40), t);
                t = _mm256_fmadd_ps(X3, _mm256_loadu_ps(q + 48), t);
                t = _mm256_fmadd_ps(Y3, _mm256_loadu_ps(q + 56), t);
                _mm256_storeu_ps(a8 + 8 * j, t);
            }
            if (i % 8 == 7 || i == n - 1) {
                const int t0 = i - i % 8, k = i % 8 + 1;
                for (int j = 0; j < jn; j++) {
                    float *o = out + (size_t)(j0 + j) * ld + (size_t)t0;
                    __m256 v[8];
                    for (int r = 0; r < 8; r++) v[r] = r < k ? _mm256_loadu_ps(acc + (size_t)r * 32 + 8 * j) : _mm256_setzero_ps();
                    const __m256 a = _mm256_hadd_ps(v[0], v[1]), b = _mm256_hadd_ps(v[2], v[3]);
                    const __m256 cc = _mm256_hadd_ps(v[4], v[5]), d = _mm256_hadd_ps(v[6], v[7]);
                    const __m256 ab = _mm256_hadd_ps(a, b), cd = _mm256_hadd_ps(cc, d);
                    const __m256 sum = _mm256_add_ps(_mm256_permute2f128_ps(ab, cd, 0x20), _mm256_permute2f128_ps(ab, cd, 0x31));
                    if (k == 8) {
                        _mm256_storeu_ps(o, sum);
                    } else {
                        float l[8];
                        _mm256_storeu_ps(l, sum);
                        for (int r = 0; r < k; r++) o[r] = l[r];
                    }
                }
            }
        }
    }
}

/* Query vectors (nq x head_dim, channel order) in the split lane order of kv_rti_higgs_scores_rope16_avx2. */
RT_AVX2 void kv_rti_higgs_split_queries_avx2(const float *q, int nq, int hd, float *qs) {
    for (int j = 0; j < nq; j++)
        for (int w = 0; w < hd / 16; w++) {
            const float *r = q + (size_t)j * (size_t)hd + 16 * w;
            const __m256 A = _mm256_loadu_ps(r), B = _mm256_loadu_ps(r + 8);
            float *o = qs + (size_t)j * (size_t)hd + 16 * w;
            _mm256_storeu_ps(o, _mm256_shuffle_ps(A, B, _MM_SHUFFLE(2, 0, 2, 0)));
            _mm256_storeu_ps(o + 8, _mm256_shuffle_ps(A, B, _MM_SHUFFLE(3, 1, 3, 1)));
        }
}

RT_AVX2 void kv_rti_higgs_scores_rope16_avx2(const uint32_t *codes, size_t w0, size_t ws, int n, int words, int wpg,
                                         const float *gx, const float *gy, const float *mul, size_t ldm,
                                         const float *signs, int rope, const float *cs, const float *sn, size_t half,
                                         int p0, const int32_t *pos, const float *qs, int nq, float *out, size_t ld) {
    if (words == 4 && wpg == 4)
        scores_rope4_t(4, codes, w0, ws, n, gx, gy, mul, ldm, signs, rope, cs, sn, half, p0, pos, qs, nq, out, ld);
    else if (words == 4 && wpg == 2)
        scores_rope4_t(2, codes, w0, ws, n, gx, gy, mul, ldm, signs, rope, cs, sn, half, p0, pos, qs, nq, out, ld);
    else if (words == 4)
        scores_rope4_t(1, codes, w0, ws, n, gx, gy, mul, ldm, signs, rope, cs, sn, half, p0, pos, qs, nq, out, ld);
    else if (words == 2)
        scores_rope_t(2, codes, w0, ws, n, wpg, gx, gy, mul, ldm, signs, rope, cs, sn, half, p0, pos, qs, nq, out, ld);
    else
        scores_rope_t(8, codes, w0, ws, n, wpg, gx, gy, mul, ldm, signs, rope, cs, sn, half, p0, pos, qs, nq, out, ld);
}

#else /* no x86 AVX2 code in this build: never called (rt_higgs.c asks kv_rti_avx2_usable first) */
void kv_rti_higgs_scores16_avx2(const uint32_t *codes, size_t w0, size_t ws, int words, int wpg, const float *lut,
                            size_t pf, int nq, const float *mul, int ng, float *out, size_t ld) {
    (void)codes, (void)w0, (void)ws, (void)words, (void)wpg, (void)lut, (void)pf, (void)nq, (void)mul, (void)ng,
        (void)out, (void)ld;
}
void kv_rti_higgs_accum16_avx2(const uint32_t *codes, size_t w0, size_t ws, int n, int words, int wpg, const float *gx,
                           const float *gy, const float *wt, size_t ldw, size_t ldg, int nq, float *racc, int hd) {
    (void)codes, (void)w0, (void)ws, (void)n, (void)words, (void)wpg, (void)gx, (void)gy, (void)wt, (void)ldw,
        (void)ldg, (void)nq, (void)racc, (void)hd;
}
void kv_rti_higgs_decode16_avx2(const uint32_t *codes, size_t w0, size_t ws, int n, int words, int wpg, const float *gx,
                            const float *gy, const float *mul, size_t ldm, const float *signs, float *out, size_t ldo) {
    (void)codes, (void)w0, (void)ws, (void)n, (void)words, (void)wpg, (void)gx, (void)gy, (void)mul, (void)ldm,
        (void)signs, (void)out, (void)ldo;
}
void kv_rti_higgs_split_queries_avx2(const float *q, int nq, int hd, float *qs) { (void)q, (void)nq, (void)hd, (void)qs; }
void kv_rti_higgs_scores_rope16_avx2(const uint32_t *codes, size_t w0, size_t ws, int n, int words, int wpg, const float *gx,
                                 const float *gy, const float *mul, size_t ldm, const float *signs, int rope,
                                 const float *cs, const float *sn, size_t half, int p0, const int32_t *pos,
                                 const float *qs, int nq, float *out, size_t ld) {
    (void)codes, (void)w0, (void)ws, (void)n, (void)words, (void)wpg, (void)gx, (void)gy, (void)mul, (void)ldm,
        (void)signs, (void)rope, (void)cs, (void)sn, (void)half, (void)p0, (void)pos, (void)qs, (void)nq, (void)out,
        (void)ld;
}
#endif
