/* rt_higgs_kernels.h — the vector kernels behind rt_higgs.c (rt_higgs_avx2.c), for 4-bit HIGGS indices (16 grid
 * points). Internal to kernels/rt/; rt_higgs.c decides when they apply (RUNTIME.md §3.1). */
#ifndef KV_RT_HIGGS_KERNELS_H
#define KV_RT_HIGGS_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Groups of a head the kernels take at most (their multipliers stay on the stack). */
#define RT_HIGGS_MAX_HGROUPS 16

/* Scores of 8 consecutive tokens: token i's indices (4 bits, 8 per word) start at word w0 + i * ws, the head
 * spans `words` words, a group wpg of them; lut + j * pf + p * 16 is query vector j's table of piece p (its dot
 * products with the 16 grid points), mul[gi * 8 + i] token i's multiplier norm / g of the head's group gi (ng
 * groups); out[j * ld + i] = sum_gi mul * (sum_p in gi table entries), in the portable loop's order. */
void kv_rti_higgs_scores16_avx2(const uint32_t *codes, size_t w0, size_t ws, int words, int wpg, const float *lut,
                            size_t pf, int nq, const float *mul, int ng, float *out, size_t ld);
/* Values of n consecutive tokens in the rotated domain, d = 2: racc[j * hd + c] += wt[j * ldw + g(c) * ldg + i] *
 * grid[idx][c % 2], gx / gy the 16 grid points' first and second coordinates. */
void kv_rti_higgs_accum16_avx2(const uint32_t *codes, size_t w0, size_t ws, int n, int words, int wpg, const float *gx,
                           const float *gy, const float *wt, size_t ldw, size_t ldg, int nq, float *racc, int hd);

/* Rows of n consecutive tokens of a head decoded to the real domain (d = 2, g | head_dim, head_dim <= 128):
 * out[i * ldo + c] = signs[c] (H (grid[idx] * mul[gi * ldm + i]))[c] per group, kv_higgs_decode_ref's values bit for
 * bit. */
void kv_rti_higgs_decode16_avx2(const uint32_t *codes, size_t w0, size_t ws, int n, int words, int wpg, const float *gx,
                            const float *gy, const float *mul, size_t ldm, const float *signs, float *out, size_t ldo);
/* Query vectors in the split order the next kernel reads (nq rows of hd, hd a multiple of 16). */
void kv_rti_higgs_split_queries_avx2(const float *q, int nq, int hd, float *qs);
/* Scores of n consecutive tokens' keys stored before RoPE: each key decoded as kv_rti_higgs_decode16_avx2 (words 2, 4
 * or 8), rotated to its position (rope 1: adjacent pairs, 2: halves; table rows cs, sn + pos * half, pos = pos[i]
 * or p0 + i) with rt_rope.c's arithmetic, then out[j * ld + i] = qs_j . k_i (qs from kv_rti_higgs_split_queries_avx2). */
void kv_rti_higgs_scores_rope16_avx2(const uint32_t *codes, size_t w0, size_t ws, int n, int words, int wpg,
                                 const float *gx, const float *gy, const float *mul, size_t ldm, const float *signs,
                                 int rope, const float *cs, const float *sn, size_t half, int p0, const int32_t *pos,
                                 const float *qs, int nq, float *out, size_t ld);

#ifdef __cplusplus
}
#endif
#endif
