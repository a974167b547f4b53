/* rt_uniform.c — attention over uniform (KIVI / XQuant) blocks without decoding them (RUNTIME.md §3).
 *
 * Keys, groups along tokens (KIVI "per-channel" keys): within token group k every channel c has one
 * scale s and zero point z, so q . k_hat[t] = sum_c (q_c s_c) code[t][c] + sum_c q_c z_c: the query is
 * folded into the group's scales once (qs) and every token costs one multiply-add per channel on its
 * integer code, with the bias added once per token.
 * Keys, groups along channels: q . k_hat[t] = sum_g (s_g sum_{c in g} q_c code[t][c] + z_g sum_{c in g} q_c).
 * Values, groups along channels (KIVI "per-token" values): acc[c] += (p_t s_g) code[t][c] + p_t z_g.
 * Values, groups along tokens: acc[c] += s_c sum_t p_t code[t][c] + z_c sum_t p_t.
 *
 * Codes are unpacked to floats a run at a time (word-aligned runs take the fast path). Summation
 * orders are fixed (RUNTIME.md §4): results do not depend on the thread count or vector width. */
#include "kvrt.h"
#include "rt_internal.h"

#include <string.h>

/* Queries handled per pass (their folded scales stay on the stack). */
#define QC 8
/* Tokens of a token group handled per pass (their accumulators stay on the stack). */
#define RUN 64

/* n codes from stream position pos as floats. */
static inline void unpack_run(float *dst, const uint32_t *codes, size_t pos, size_t n, int bits, int per) {
    size_t i = 0;
    if (per != 11 && pos % (size_t)per == 0) {
        const uint32_t mask = (1u << bits) - 1u;
        const uint32_t *w = codes + pos / (size_t)per;
        for (; i + (size_t)per <= n; i += (size_t)per, w++) {
            const uint32_t word = *w;
            for (int s = 0; s < per; s++) dst[i + (size_t)s] = (float)((word >> (s * bits)) & mask);
        }
    }
    for (; i < n; i++) dst[i] = (float)kv_qm_unpack(codes, pos + i, bits, per);
}

static inline void params_of(const rt_codec *c, const uint8_t *params, int m, const void **scales,
                             const void **zeros) {
    const size_t groups = kv_uniform_groups(&c->q.uniform, (size_t)m, (size_t)c->kv_dim);
    *scales = params;
    *zeros = params + groups * (c->q.uniform.param_type == KV_PARAM_F16 ? 2u : 4u);
}

/* ---- scores ------------------------------------------------------------------------------------ */
static void scores_tokens_axis(const rt_codec *c, const uint32_t *codes, const void *scales, const void *zeros,
                               int m, int r0, int r1, int h, const float *q, int nq, float *out, size_t ld) {
    const kv_uniform *u = &c->q.uniform;
    const size_t C = (size_t)c->kv_dim, G = (size_t)u->group, hd = (size_t)c->head_dim, c0 = (size_t)h * hd;
    const int pt = (int)u->param_type;
    float qs[QC * KV_RT_MAX_HEAD_DIM];
    float cf[RUN], acc[QC * RUN], bias[QC];
    for (int j0 = 0; j0 < nq; j0 += QC) {
        const int nj = nq - j0 < QC ? nq - j0 : QC;
        for (size_t t = (size_t)r0; t < (size_t)r1;) {
            const size_t k = t / G, gs = kv_qm_tok_group_rows(G, (size_t)m, k);
            const size_t i0 = t - k * G, iend = (size_t)r1 - k * G < gs ? (size_t)r1 - k * G : gs;
            for (int j = 0; j < nj; j++) bias[j] = 0.0f;
            for (size_t ch = 0; ch < hd; ch++) {
                const size_t g = k * C + c0 + ch;
                const float s = kv_qm_param_load(scales, g, pt), z = kv_qm_param_load(zeros, g, pt);
                for (int j = 0; j < nj; j++) {
                    const float qv = q[(size_t)(j0 + j) * hd + ch];
                    qs[(size_t)j * hd + ch] = qv * s;
                    bias[j] += qv * z;
                }
            }
            for (size_t i = i0; i < iend; i += RUN) {
                const size_t n = iend - i < RUN ? iend - i : RUN;
                memset(acc, 0, sizeof acc);
                for (size_t ch = 0; ch < hd; ch++) {
                    unpack_run(cf, codes, k * G * C + (c0 + ch) * gs + i, n, c->bits, c->per_word);
                    for (int j = 0; j < nj; j++) {
                        const float w = qs[(size_t)j * hd + ch];
                        float *a = acc + (size_t)j * RUN;
                        for (size_t ii = 0; ii < n; ii++) a[ii] += w * cf[ii];
                    }
                }
                for (int j = 0; j < nj; j++)
                    for (size_t ii = 0; ii < n; ii++)
                        out[(size_t)(j0 + j) * ld + (k * G + i + ii - (size_t)r0)] = acc[(size_t)j * RUN + ii] + bias[j];
            }
            t = k * G + iend;
        }
    }
}

/* The channel groups that cut a head: segment i covers head channels [seg[i], seg[i + 1]). */
static int head_segments(size_t c0, size_t hd, size_t G, size_t *seg) {
    int n = 0;
    seg[n++] = 0;
    for (size_t ch = (c0 / G + 1) * G - c0; ch < hd; ch += G) seg[n++] = ch;
    seg[n] = hd;
    return n;
}

static void scores_channels_axis(const rt_codec *c, const uint32_t *codes, const void *scales, const void *zeros,
                                 int m, int r0, int r1, int h, const float *q, int nq, float *out, size_t ld) {
    (void)m;
    const kv_uniform *u = &c->q.uniform;
    const size_t C = (size_t)c->kv_dim, G = (size_t)u->group, hd = (size_t)c->head_dim, c0 = (size_t)h * hd;
    const size_t ncg = kv_qm_chan_groups(G, C);
    const int pt = (int)u->param_type;
    size_t seg[KV_RT_MAX_HEAD_DIM + 1];
    const int nseg = head_segments(c0, hd, G, seg);
    float cf[KV_RT_MAX_HEAD_DIM];
    for (int t = r0; t < r1; t++) {
        unpack_run(cf, codes, (size_t)t * C + c0, hd, c->bits, c->per_word);
        for (int j = 0; j < nq; j++) {
            const float *qj = q + (size_t)j * hd;
            float score = 0.0f;
            for (int sg = 0; sg < nseg; sg++) {
                const size_t a = seg[sg], b = seg[sg + 1], g = (size_t)t * ncg + (c0 + a) / G;
                float l[8] = {0, 0, 0, 0, 0, 0, 0, 0}, qsum = 0.0f;
                size_t ch = a;
                for (; ch + 8 <= b; ch += 8)
                    for (int k = 0; k < 8; k++) l[k] += qj[ch + (size_t)k] * cf[ch + (size_t)k];
                float dot = ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]));
                for (; ch < b; ch++) dot += qj[ch] * cf[ch];
                for (ch = a; ch < b; ch++) qsum += qj[ch];
                score += kv_qm_param_load(scales, g, pt) * dot + kv_qm_param_load(zeros, g, pt) * qsum;
            }
            out[(size_t)j * ld + (size_t)(t - r0)] = score;
        }
    }
}

void rt_uniform_scores(const rt_codec *c, const uint32_t *codes, const uint8_t *params, int m, int r0, int r1,
                       int h, const float *q, int nq, float *out, size_t ld) {
    const void *scales, *zeros;
    params_of(c, params, m, &scales, &zeros);
    if (c->q.uniform.axis == KV_AXIS_TOKENS)
        scores_tokens_axis(c, codes, scales, zeros, m, r0, r1, h, q, nq, out, ld);
    else
        scores_channels_axis(c, codes, scales, zeros, m, r0, r1, h, q, nq, out, ld);
}

/* ---- weighted sums of values ------------------------------------------------------------------- */
static void accum_channels_axis(const rt_codec *c, const uint32_t *codes, const void *scales, const void *zeros,
                                int m, int r0, int r1, int h, const float *p, size_t ld, int nq, float *acc) {
    (void)m;
    const kv_uniform *u = &c->q.uniform;
    const size_t C = (size_t)c->kv_dim, G = (size_t)u->group, hd = (size_t)c->head_dim, c0 = (size_t)h * hd;
    const size_t ncg = kv_qm_chan_groups(G, C);
    const int pt = (int)u->param_type;
    size_t seg[KV_RT_MAX_HEAD_DIM + 1];
    const int nseg = head_segments(c0, hd, G, seg);
    float cf[KV_RT_MAX_HEAD_DIM];
    for (int t = r0; t < r1; t++) {
        unpack_run(cf, codes, (size_t)t * C + c0, hd, c->bits, c->per_word);
        for (int sg = 0; sg < nseg; sg++) {
            const size_t a = seg[sg], b = seg[sg + 1], g = (size_t)t * ncg + (c0 + a) / G;
            const float s = kv_qm_param_load(scales, g, pt), z = kv_qm_param_load(zeros, g, pt);
            for (int j = 0; j < nq; j++) {
                const float pj = p[(size_t)j * ld + (size_t)(t - r0)];
                const float ps = pj * s, pz = pj * z;
                float *aj = acc + (size_t)j * hd;
                for (size_t ch = a; ch < b; ch++) aj[ch] += ps * cf[ch] + pz;
            }
        }
    }
}

static void accum_tokens_axis(const rt_codec *c, const uint32_t *codes, const void *scales, const void *zeros,
                              int m, int r0, int r1, int h, const float *p, size_t ld, int nq, float *acc) {
    const kv_uniform *u = &c->q.uniform;
    const size_t C = (size_t)c->kv_dim, G = (size_t)u->group, hd = (size_t)c->head_dim, c0 = (size_t)h * hd;
    const int pt = (int)u->param_type;
    float cf[RUN];
    for (size_t t = (size_t)r0; t < (size_t)r1;) {
        const size_t k = t / G, gs = kv_qm_tok_group_rows(G, (size_t)m, k);
        const size_t i0 = t - k * G, iend = (size_t)r1 - k * G < gs ? (size_t)r1 - k * G : gs;
        for (int j = 0; j < nq; j++) {
            const float *pj = p + (size_t)j * ld + (k * G - (size_t)r0);
            float psum = 0.0f;
            for (size_t i = i0; i < iend; i++) psum += pj[i];
            for (size_t ch = 0; ch < hd; ch++) {
                const size_t g = k * C + c0 + ch;
                float sp = 0.0f;
                for (size_t i = i0; i < iend; i += RUN) {
                    const size_t n = iend - i < RUN ? iend - i : RUN;
                    unpack_run(cf, codes, k * G * C + (c0 + ch) * gs + i, n, c->bits, c->per_word);
                    for (size_t ii = 0; ii < n; ii++) sp += pj[i + ii] * cf[ii];
                }
                acc[(size_t)j * hd + ch] += kv_qm_param_load(scales, g, pt) * sp + kv_qm_param_load(zeros, g, pt) * psum;
            }
        }
        t = k * G + iend;
    }
}

void rt_uniform_accum(const rt_codec *c, const uint32_t *codes, const uint8_t *params, int m, int r0, int r1,
                      int h, const float *p, size_t ld, int nq, float *acc) {
    const void *scales, *zeros;
    params_of(c, params, m, &scales, &zeros);
    if (c->q.uniform.axis == KV_AXIS_CHANNELS)
        accum_channels_axis(c, codes, scales, zeros, m, r0, r1, h, p, ld, nq, acc);
    else
        accum_tokens_axis(c, codes, scales, zeros, m, r0, r1, h, p, ld, nq, acc);
}
