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
 * through decoded tiles (kv_rti_attend.c). */
#include "kvrt.h"
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

void kv_rti_higgs_scores(const rt_codec *c, const uint32_t *codes, const uint8_t *params, int m, int r0, int r1,
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

void kv_rti_higgs_accum(const rt_codec *c, const uint32_t *codes, const uint8_t *params, int m, int r0, int r1,
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
