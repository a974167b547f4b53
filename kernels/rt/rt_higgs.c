/* rt_higgs.c — attention over HIGGS blocks without decoding them (RUNTIME.md §3).
 *
 * A token's group is x_hat = D H (grid[idx] * norm / g) (D the random signs, H the unnormalized
 * Walsh-Hadamard matrix, symmetric). So q . x_hat = (norm / g) (H D q) . grid[idx]: the query is
 * rotated once per group and step, and each d-dimensional piece p contributes the dot product of its
 * slice of the rotated query with grid point idx, which is looked up in a table of n entries per piece
 * built once per step (2-bit d = 2: 16 entries; 4-bit: 256). Values: sum_t p_t x_hat[t] =
 * D H (sum_t p_t (norm_t / g) grid[idx_t]): the weighted grid points are accumulated in the rotated
 * domain and transformed back once per group and step.
 * These kernels serve groups that lie inside one head (g divides head_dim); other layouts are read
 * through decoded tiles (kv_rti_attend.c).
 *
 * Vector paths (rt_higgs_avx2.c, RUNTIME.md §3.1), for 4-bit indices (16 grid points) on word boundaries, when the
 * CPU has AVX2: scores by table lookups in registers, 8 tokens per vector (the portable loop's bits); values with
 * the grid points looked up 8 pieces per vector and fused multiply-adds (within the bound); decoding to the real
 * domain (the portable bits: the row's decode_head in rt_codec_higgs.c); and keys stored before RoPE scored without
 * a tile (the row's scores_rope): decoded, rotated and dotted per token (the decoded tile's keys bit for bit, dot
 * products within the bound). The portable loops stay the reference and the path for every other layout and CPU
 * (tests/runtime/test_rt_fastpaths.c compares them). */
#include "kvrt.h"
#include "rt_higgs_kernels.h"
#include "rt_internal.h"

#include <string.h>

size_t kv_rti_higgs_prep_floats(const rt_codec *c) {
    return (size_t)c->head_dim / (size_t)c->q.higgs.dim * (size_t)c->q.higgs.size;
}

void kv_rti_higgs_prepare(const rt_codec *c, int h, const float *q, float *prep) {
    const kv_higgs *hq = &c->q.higgs;
    const size_t hd = (size_t)c->head_dim, g = (size_t)hq->group, d = (size_t)hq->dim, n = (size_t)hq->size;
    const float *signs = c->signs + (size_t)h * hd;
    float qrot[KV_RT_MAX_HEAD_DIM];
    for (size_t ch = 0; ch < hd; ch++) qrot[ch] = q[ch] * signs[ch];
    for (size_t a = 0; a < hd; a += g) kv_qm_fwht(qrot + a, g);
    const size_t pieces = hd / d;
    for (size_t p = 0; p < pieces; p++) {
        const float *qp = qrot + p * d;
        float *lut = prep + p * n;
        for (size_t i = 0; i < n; i++) {
            const float *pt = hq->grid + i * d;
            float s = 0.0f;
            for (size_t k = 0; k < d; k++) s += qp[k] * pt[k];
            lut[i] = s;
        }
    }
}

static void scores_portable(const rt_codec *c, const uint32_t *codes, const uint8_t *params, int m, int r0, int r1,
                     int h, const float *prep, int nq, float *out, size_t ld) {
    (void)m;
    const kv_higgs *hq = &c->q.higgs;
    const size_t C = (size_t)c->kv_dim, hd = (size_t)c->head_dim, g = (size_t)hq->group, d = (size_t)hq->dim;
    const size_t n = (size_t)hq->size, per_group = g / d, groups_per_token = C / g, head_groups = hd / g;
    const size_t pieces = hd / d, pf = pieces * n, g0 = (size_t)h * head_groups;
    uint8_t ib[KV_RT_MAX_HEAD_DIM];
    float mul[KV_RT_MAX_HEAD_DIM];
    for (int t = r0; t < r1; t++) {
        const size_t grp0 = (size_t)t * groups_per_token + g0;
        kv_unpack_range(ib, codes, grp0 * per_group, pieces, c->bits, c->per_word);
        for (size_t gi = 0; gi < head_groups; gi++)
            mul[gi] = kv_qm_higgs_dec_mul(rt_param(params, grp0 + gi, (int)hq->norm_type), g);
        for (int j = 0; j < nq; j++) {
            const float *lut = prep + (size_t)j * pf;
            float total = 0.0f;
            for (size_t gi = 0; gi < head_groups; gi++) {
                float s = 0.0f;
                for (size_t p = gi * per_group; p < (gi + 1) * per_group; p++) s += lut[p * n + ib[p]];
                total += s * mul[gi];
            }
            out[(size_t)j * ld + (size_t)(t - r0)] = total;
        }
    }
}

static void accum_portable(const rt_codec *c, const uint32_t *codes, const uint8_t *params, int m, int r0, int r1,
                    int h, const float *p, size_t ld, int nq, float *racc) {
    (void)m;
    const kv_higgs *hq = &c->q.higgs;
    const size_t C = (size_t)c->kv_dim, hd = (size_t)c->head_dim, g = (size_t)hq->group, d = (size_t)hq->dim;
    const size_t per_group = g / d, groups_per_token = C / g, head_groups = hd / g, pieces = hd / d;
    const size_t g0 = (size_t)h * head_groups;
    uint8_t ib[KV_RT_MAX_HEAD_DIM];
    float v[KV_RT_MAX_HEAD_DIM];
    for (int t = r0; t < r1; t++) {
        const size_t grp0 = (size_t)t * groups_per_token + g0;
        kv_unpack_range(ib, codes, grp0 * per_group, pieces, c->bits, c->per_word);
        /* the token's grid points, unscaled, in the rotated domain */
        for (size_t pc = 0; pc < pieces; pc++)
            for (size_t k = 0; k < d; k++) v[pc * d + k] = hq->grid[(size_t)ib[pc] * d + k];
        for (size_t gi = 0; gi < head_groups; gi++) {
            const float mul = kv_qm_higgs_dec_mul(rt_param(params, grp0 + gi, (int)hq->norm_type), g);
            for (int j = 0; j < nq; j++) {
                const float w = p[(size_t)j * ld + (size_t)(t - r0)] * mul;
                float *a = racc + (size_t)j * hd + gi * g;
                const float *vg = v + gi * g;
                for (size_t k = 0; k < g; k++) a[k] += w * vg[k];
            }
        }
    }
}

int kv_rti_higgs_words_aligned(const rt_codec *c) {
    const kv_higgs *hq = &c->q.higgs;
    const int d = hq->dim;
    return c->bits == 4 && c->per_word == 8 && (c->head_dim / d) % 8 == 0 && (hq->group / d) % 8 == 0 &&
           (c->kv_dim / d) % 8 == 0 && c->head_dim / hq->group <= RT_HIGGS_MAX_HGROUPS && kv_rti_avx2_usable();
}

void kv_rti_higgs_scores(const rt_codec *c, const uint32_t *codes, const uint8_t *params, int m, int r0, int r1,
                     int h, const float *prep, int nq, float *out, size_t ld) {
    if (!kv_rti_higgs_words_aligned(c)) {
        scores_portable(c, codes, params, m, r0, r1, h, prep, nq, out, ld);
        return;
    }
    const kv_higgs *hq = &c->q.higgs;
    const size_t hd = (size_t)c->head_dim, g = (size_t)hq->group, d = (size_t)hq->dim;
    const size_t ws = (size_t)c->kv_dim / d / 8, words = hd / d / 8, wpg = g / d / 8, ng = hd / g;
    const size_t gpt = (size_t)c->kv_dim / g, g0 = (size_t)h * ng, pf = hd / d * (size_t)hq->size;
    float mul[8 * RT_HIGGS_MAX_HGROUPS];
    int t = r0;
    for (; t + 8 <= r1; t += 8) {
        rt_higgs_tile_muls(mul, 8, params, (int)hq->norm_type, gpt, g0, ng, g, t, 8);
        kv_rti_higgs_scores16_avx2(codes, (size_t)t * ws + (size_t)h * words, ws, (int)words, (int)wpg, prep, pf, nq, mul,
                               (int)ng, out + (size_t)(t - r0), ld);
    }
    if (t < r1) scores_portable(c, codes, params, m, t, r1, h, prep, nq, out + (size_t)(t - r0), ld);
}

void kv_rti_higgs_accum(const rt_codec *c, const uint32_t *codes, const uint8_t *params, int m, int r0, int r1,
                    int h, const float *p, size_t ld, int nq, float *racc) {
    const kv_higgs *hq = &c->q.higgs;
    const size_t hd = (size_t)c->head_dim, g = (size_t)hq->group, ng = hd / g;
    /* the weights p_t norm_t / g of a run of tokens per query and group, at most 4096 floats */
    const size_t run = (size_t)nq * ng <= 64 ? 4096 / ((size_t)nq * ng) : 0;
    if (hq->dim != 2 || hq->size != 16 || run == 0 || !kv_rti_higgs_words_aligned(c)) {
        accum_portable(c, codes, params, m, r0, r1, h, p, ld, nq, racc);
        return;
    }
    const size_t d = 2, ws = (size_t)c->kv_dim / d / 8, words = hd / d / 8, wpg = g / d / 8;
    const size_t gpt = (size_t)c->kv_dim / g, g0 = (size_t)h * ng, R = run < 64 ? run : 64;
    float wt[4096], mul[64], gx[16], gy[16];
    for (int i = 0; i < 16; i++) gx[i] = hq->grid[2 * i], gy[i] = hq->grid[2 * i + 1];
    for (int t0 = r0; t0 < r1; t0 += (int)R) {
        const int n = r1 - t0 < (int)R ? r1 - t0 : (int)R;
        for (size_t gi = 0; gi < ng; gi++) {
            for (int i = 0; i < n; i++)
                mul[i] = kv_qm_higgs_dec_mul(rt_param(params, (size_t)(t0 + i) * gpt + g0 + gi, (int)hq->norm_type), g);
            for (int j = 0; j < nq; j++)
                for (int i = 0; i < n; i++)
                    wt[((size_t)j * ng + gi) * R + (size_t)i] = p[(size_t)j * ld + (size_t)(t0 - r0 + i)] * mul[i];
        }
        kv_rti_higgs_accum16_avx2(codes, (size_t)t0 * ws + (size_t)h * words, ws, n, (int)words, (int)wpg, gx,
                              gy, wt, ng * R, R, nq, racc, (int)hd);
    }
}

/* Scores of keys stored before RoPE (rows [r0, r1) of a block, positions p0 + i or pos[i]) against nq scaled query
 * vectors, decoded, rotated and dotted token by token without a tile (kv_rti_higgs_scores_rope16_avx2: the keys are the
 * decoded tile's bits, the dot products those of kv_rti_f32_scores up to summation order). 0 when the layout is not
 * one the kernel takes: the caller reads decoded tiles then. */
int kv_rti_higgs_scores_rope(const kv_rt *rt, const rt_codec *c, const uint32_t *codes, const uint8_t *params, int r0,
                         int r1, int h, int p0, const int32_t *pos, const float *q, int nq, float *out, size_t ld) {
    const kv_higgs *hq = &c->q.higgs;
    const size_t hd = (size_t)c->head_dim, g = (size_t)hq->group;
    if (!c->higgs_direct || hq->dim != 2 || hq->size != 16 || !(hd == 32 || hd == 64 || hd == 128) || nq > RT_MAX_QV ||
        !kv_rti_higgs_words_aligned(c))
        return 0;
    const size_t d = 2, ws = (size_t)c->kv_dim / d / 8, words = hd / d / 8, wpg = g / d / 8, ng = hd / g;
    const size_t gpt = (size_t)c->kv_dim / g, g0 = (size_t)h * ng;
    float gx[16], gy[16], mul[RT_HIGGS_MAX_HGROUPS * 64], qs[RT_MAX_QV * 128];
    for (int i = 0; i < 16; i++) gx[i] = hq->grid[2 * i], gy[i] = hq->grid[2 * i + 1];
    kv_rti_higgs_split_queries_avx2(q, nq, (int)hd, qs);
    const int rope = rt->opt.rope_layout == KV_ROPE_ADJACENT ? 1 : 2;
    const float *tc, *ts;
    kv_rti_rope_table(rt, c->layer, &tc, &ts);
    for (int t0 = r0; t0 < r1; t0 += 64) {
        const int n = r1 - t0 < 64 ? r1 - t0 : 64;
        rt_higgs_tile_muls(mul, 64, params, (int)hq->norm_type, gpt, g0, ng, g, t0, n);
        kv_rti_higgs_scores_rope16_avx2(codes, (size_t)t0 * ws + (size_t)h * words, ws, n, (int)words, (int)wpg, gx, gy, mul,
                                    64, c->signs + (size_t)h * hd, rope, tc, ts, hd / 2,
                                    p0 + (t0 - r0), pos ? pos + (t0 - r0) : NULL, qs, nq, out + (size_t)(t0 - r0), ld);
    }
    return 1;
}

void kv_rti_higgs_finish(const rt_codec *c, int h, int nq, float *racc, float *acc) {
    const size_t hd = (size_t)c->head_dim, g = (size_t)c->q.higgs.group;
    const float *signs = c->signs + (size_t)h * hd;
    float y[KV_RT_MAX_HEAD_DIM];
    for (int j = 0; j < nq; j++)
        for (size_t a = 0; a < hd; a += g) {
            kv_higgs_decode_transform(y, racc + (size_t)j * hd + a, g, signs + a);
            float *o = acc + (size_t)j * hd + a;
            for (size_t k = 0; k < g; k++) o[k] += y[k];
        }
}
