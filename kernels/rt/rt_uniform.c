/* rt_uniform.c — attention over uniform (KIVI / XQuant) blocks without decoding them (RUNTIME.md §3).
 *
 * Keys, groups along tokens (KIVI "per-channel" keys): within token group k every channel c has one
 * scale s and zero point z, so q . k_hat[t] = sum_c (q_c s_c) code[t][c] + sum_c q_c z_c: the query is
 * folded into the group's scales once (qs) and every token costs one multiply-add per channel on its
 * integer code, with the bias added once per token.
 * Keys, groups along channels: q . k_hat[t] = sum_g (s_g sum_{c in g} q_c code[t][c] + z_g sum_{c in g} q_c).
 * Values, groups along channels (KIVI "per-token" values): acc[c] += (p_t s_g) code[t][c], and
 * sum_t p_t z_g once per channel group, added at the end of the call.
 * Values, groups along tokens: acc[c] += s_c sum_t p_t code[t][c] + z_c sum_t p_t.
 *
 * Codes are unpacked to floats a tile at a time (word-aligned runs take the fast path), so that a
 * tile is unpacked once for all the query vectors of a KV head. Summation orders are fixed
 * (RUNTIME.md §4): results do not depend on the thread count; the AVX2 loops (rt_avx2.c) fuse the
 * multiply-adds and stay within the same bound. */
#include "kvrt.h"
#include "rt_internal.h"

#include <string.h>

/* Queries handled per pass (their folded scales stay on the stack). */
#define QC 8
/* Tokens of a token group handled per pass (their accumulators stay on the stack). */
#define RUN 64

/* n codes from stream position pos as floats: whole words at once when the run starts on a word
 * and the width divides 32 (the common case: token groups and heads are multiples of the codes
 * per word), else word by word (one division per word, not per code: 3-bit codes packed 11 to a
 * word, KVmix's 3-bit layers, start anywhere in a word). */
static inline void unpack_run(float *dst, const uint32_t *codes, size_t pos, size_t n, int bits, int per) {
    size_t i = 0;
    if (per != 11 && 32 % bits == 0 && pos % (size_t)per == 0 && n >= (size_t)per) {
        const size_t nw = n / (size_t)per;
        kv_rti_unpack_words(dst, codes + pos / (size_t)per, nw, bits);
        i = nw * (size_t)per;
    }
    while (i < n) {
        const size_t j = pos + i, w = j / (size_t)per;
        int slot = (int)(j - w * (size_t)per);
        uint32_t word = codes[w] >> (slot * bits);
        for (; slot < per && i < n; slot++, i++, word >>= bits) dst[i] = (float)(word & kv_qm_slot_max(bits, per, slot));
    }
}

/* Tokens unpacked at once so that a tile of codes (channels x tokens floats) stays within 16 KiB. */
static size_t tile_tokens(size_t hd, size_t other) {
    const size_t w = hd > other ? hd : other;
    size_t r = 4096 / (w ? w : 1);
    r = r > RUN ? RUN : r;
    r -= r % 8;
    return r ? r : 1;
}

/* n consecutive parameters (f16 or f32) from index i0 as floats. */
static inline void load_params(float *dst, const void *arr, size_t i0, size_t n, int pt) {
    if (pt == KV_PARAM_F16)
        kv_rti_f16_to_f32_row(dst, (const uint16_t *)arr + i0, n);
    else
        memcpy(dst, (const float *)arr + i0, n * sizeof(float));
}

static inline void params_of(const rt_codec *c, const uint8_t *params, int m, const void **scales,
                             const void **zeros) {
    const size_t groups = kv_uniform_groups(&c->q.uniform, (size_t)m, (size_t)c->kv_dim);
    *scales = params;
    *zeros = params + groups * (c->q.uniform.param_type == KV_PARAM_F16 ? 2u : 4u);
}

/* ---- scores ------------------------------------------------------------------------------------ */
/* A token group's scales fold into the nj queries (qs[j][c] = q[j][c] s[c]); its zero points give one
 * bias per query (sum_c q[j][c] z[c]); the hd parameters of each start at index i0. */
static void fold_group(const float *q, size_t hd, int nj, const void *scales, const void *zeros, size_t i0, int pt,
                       int avx2, float *qs, float *bias) {
    if (avx2 && hd % 8 == 0) {
        kv_rti_uniform_fold_avx2(q, (int)hd, nj, scales, zeros, i0, pt, qs, bias);
        return;
    }
    float sv[KV_RT_MAX_HEAD_DIM], zv[KV_RT_MAX_HEAD_DIM];
    load_params(sv, scales, i0, hd, pt);
    load_params(zv, zeros, i0, hd, pt);
    for (int j = 0; j < nj; j++) {
        const float *qj = q + (size_t)j * hd;
        float b = 0.0f;
        for (size_t ch = 0; ch < hd; ch++) {
            qs[(size_t)j * hd + ch] = qj[ch] * sv[ch];
            b += qj[ch] * zv[ch];
        }
        bias[j] = b;
    }
}

static void scores_tokens_axis(const rt_codec *c, const uint32_t *codes, const void *scales, const void *zeros,
                               int m, int r0, int r1, int h, const float *q, int nq, float *out, size_t ld) {
    const kv_uniform *u = &c->q.uniform;
    const size_t C = (size_t)c->kv_dim, G = (size_t)u->group, hd = (size_t)c->head_dim, c0 = (size_t)h * hd;
    const int pt = (int)u->param_type, avx2 = kv_rti_avx2_usable();
    const size_t run = tile_tokens(hd, 0);
    float qs[QC * KV_RT_MAX_HEAD_DIM], cf[4096], acc[QC * RUN], bias[QC];
    for (int j0 = 0; j0 < nq; j0 += QC) {
        const int nj = nq - j0 < QC ? nq - j0 : QC;
        for (size_t t = (size_t)r0; t < (size_t)r1;) {
            const size_t k = t / G, gs = kv_qm_tok_group_rows(G, (size_t)m, k);
            const size_t i0 = t - k * G, iend = (size_t)r1 - k * G < gs ? (size_t)r1 - k * G : gs;
            fold_group(q + (size_t)j0 * hd, hd, nj, scales, zeros, k * C + c0, pt, avx2, qs, bias);
            for (size_t i = i0; i < iend; i += run) {
                const size_t n = iend - i < run ? iend - i : run;
                const size_t pos0 = k * G * C + c0 * gs + i, per = (size_t)c->per_word;
                if (avx2 && (c->bits == 2 || c->bits == 4) && pos0 % 16 == 0 && gs % 16 == 0 && n % 16 == 0) {
                    /* codes straight from their words into registers */
                    kv_rti_uniform_tok_scores_fused_avx2(codes, k * G * C + c0 * gs, gs, i, (int)n, (int)hd, c->bits, qs, bias,
                                                     nj, out + (size_t)j0 * ld + (k * G + i - (size_t)r0), ld);
                    continue;
                }
                if (avx2 && per != 11 && 32 % c->bits == 0 && pos0 % per == 0 && gs % per == 0 && n % per == 0)
                    kv_rti_unpack_rows_avx2(cf, run, codes, pos0 / per, gs / per, (int)hd, n / per, c->bits);
                else
                    for (size_t ch = 0; ch < hd; ch++)
                        unpack_run(cf + ch * run, codes, pos0 + ch * gs, n, c->bits, c->per_word);
                if (avx2 && n % 8 == 0) {
                    kv_rti_uniform_tok_scores_avx2(cf, run, (int)n, (int)hd, qs, nj, acc, RUN);
                } else {
                    memset(acc, 0, sizeof acc);
                    for (size_t ch = 0; ch < hd; ch++)
                        for (int j = 0; j < nj; j++) {
                            const float w = qs[(size_t)j * hd + ch];
                            float *a = acc + (size_t)j * RUN;
                            const float *cr = cf + ch * run;
                            for (size_t ii = 0; ii < n; ii++) a[ii] += w * cr[ii];
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
                score += rt_param(scales, g, pt) * dot + rt_param(zeros, g, pt) * qsum;
            }
            out[(size_t)j * ld + (size_t)(t - r0)] = score;
        }
    }
}

void kv_rti_uniform_scores(const rt_codec *c, const uint32_t *codes, const uint8_t *params, int m, int r0, int r1,
                       int h, const float *q, int nq, float *out, size_t ld) {
    const void *scales, *zeros;
    params_of(c, params, m, &scales, &zeros);
    if (c->q.uniform.axis == KV_AXIS_TOKENS)
        scores_tokens_axis(c, codes, scales, zeros, m, r0, r1, h, q, nq, out, ld);
    else
        scores_channels_axis(c, codes, scales, zeros, m, r0, r1, h, q, nq, out, ld);
}

/* ---- weighted sums of values ------------------------------------------------------------------- */
/* Tokens per tile of the fused channel-axis path, and the stored parameters of a tile's segments in
 * rows (f16 or f32 as stored; at most head_dim / 16 segments). */
enum { TF = 64 };
typedef union param_rows {
    uint16_t h[TF * (KV_RT_MAX_HEAD_DIM / 16)];
    float f[TF * (KV_RT_MAX_HEAD_DIM / 16)];
} param_rows;

/* Row r..r+n of dst: the n parameters at index g0, g0 + stride, ... of arr (type pt). */
static void gather_params(param_rows *dst, size_t r, const void *arr, size_t g0, size_t stride, int n, int pt) {
    if (pt == KV_PARAM_F16) {
        const uint16_t *a = (const uint16_t *)arr + g0;
        for (int i = 0; i < n; i++) dst->h[r + (size_t)i] = a[(size_t)i * stride];
    } else {
        const float *a = (const float *)arr + g0;
        for (int i = 0; i < n; i++) dst->f[r + (size_t)i] = a[(size_t)i * stride];
    }
}

static const void *param_row_ptr(const param_rows *rows, int pt) {
    return pt == KV_PARAM_F16 ? (const void *)rows->h : (const void *)rows->f;
}

static void accum_channels_axis(const rt_codec *c, const uint32_t *codes, const void *scales, const void *zeros,
                                int m, int r0, int r1, int h, const float *p, size_t ld, int nq, float *acc) {
    (void)m;
    const kv_uniform *u = &c->q.uniform;
    const size_t C = (size_t)c->kv_dim, G = (size_t)u->group, hd = (size_t)c->head_dim, c0 = (size_t)h * hd;
    const size_t ncg = kv_qm_chan_groups(G, C);
    const int pt = (int)u->param_type;
    size_t seg[KV_RT_MAX_HEAD_DIM + 1];
    int segi[KV_RT_MAX_HEAD_DIM + 1];
    const int nseg = head_segments(c0, hd, G, seg);
    int aligned = hd % 8 == 0;
    for (int sg = 0; sg <= nseg; sg++) {
        segi[sg] = (int)seg[sg];
        aligned &= seg[sg] % 8 == 0;
    }
    const int avx2 = aligned && kv_rti_avx2_usable();
    /* the fused path reads codes from their words: 2 or 4 bits, runs of 16 channels in one segment */
    int fused = avx2 && (c->bits == 2 || c->bits == 4) && hd % 16 == 0 && C % 16 == 0 && c0 % 16 == 0;
    int seg16[KV_RT_MAX_HEAD_DIM / 16 + 1];
    for (int sg = 0; fused && sg <= nseg; sg++) fused &= seg[sg] % 16 == 0;
    for (int sg = 0; fused && sg < nseg; sg++)
        for (size_t ch = seg[sg]; ch < seg[sg + 1]; ch += 16) seg16[ch / 16] = sg;
    const size_t tt = tile_tokens(hd, (size_t)nseg);
    float cf[4096], st[4096], zacc[QC * (KV_RT_MAX_HEAD_DIM + 1)];
    for (int j0 = 0; j0 < nq; j0 += QC) {
        const int nj = nq - j0 < QC ? nq - j0 : QC;
        memset(zacc, 0, (size_t)nj * (size_t)nseg * sizeof(float));
        if (fused) {
            /* per tile of tokens: the stored scales and zero points of each segment in a row (sp, zp),
             * then the weights p_t * s_t,g per query and segment (st) and the zero points into zacc,
             * 8 tokens at a time */
            const int tf = (int)(4096 / ((size_t)nj * (size_t)nseg)) < TF ? (int)(4096 / ((size_t)nj * (size_t)nseg)) : TF;
            param_rows sp, zp;
            for (int t0 = r0; t0 < r1; t0 += tf) {
                const int n = r1 - t0 < tf ? r1 - t0 : tf;
                for (int sg = 0; sg < nseg; sg++) {
                    const size_t g0 = (size_t)t0 * ncg + (c0 + seg[sg]) / G, r = (size_t)sg * (size_t)tf;
                    gather_params(&sp, r, scales, g0, ncg, n, pt);
                    gather_params(&zp, r, zeros, g0, ncg, n, pt);
                }
                kv_rti_uniform_chan_weights_avx2(param_row_ptr(&sp, pt), param_row_ptr(&zp, pt), pt, (size_t)tf, nseg,
                                             p + (size_t)j0 * ld + (size_t)(t0 - r0), ld, nj, n, st, zacc);
                kv_rti_uniform_chan_accum_fused_avx2(codes, (size_t)t0 * C + c0, C, n, (int)hd, c->bits, st, (size_t)tf, nseg, seg16,
                                                 nj, acc + (size_t)j0 * hd);
            }
        }
        for (int t0 = r0; !fused && t0 < r1; t0 += (int)tt) {
            const int n = r1 - t0 < (int)tt ? r1 - t0 : (int)tt;
            /* a tile: codes as floats (tokens x head channels), scales per token and segment; the
             * zero points go straight into one sum per segment */
            for (int i = 0; i < n; i++) {
                const size_t t = (size_t)(t0 + i);
                unpack_run(cf + (size_t)i * hd, codes, t * C + c0, hd, c->bits, c->per_word);
                for (int sg = 0; sg < nseg; sg++) {
                    const size_t g = t * ncg + (c0 + seg[sg]) / G;
                    st[(size_t)i * (size_t)nseg + (size_t)sg] = rt_param(scales, g, pt);
                    const float z = rt_param(zeros, g, pt);
                    for (int j = 0; j < nj; j++)
                        zacc[(size_t)j * (size_t)nseg + (size_t)sg] += p[(size_t)(j0 + j) * ld + (t - (size_t)r0)] * z;
                }
            }
            const float *pt0 = p + (size_t)j0 * ld + (size_t)(t0 - r0);
            if (avx2) {
                kv_rti_uniform_chan_accum_avx2(cf, hd, n, (int)hd, st, segi, nseg, pt0, ld, nj, acc + (size_t)j0 * hd);
                continue;
            }
            for (int j = 0; j < nj; j++) {
                float *aj = acc + (size_t)(j0 + j) * hd;
                for (int i = 0; i < n; i++) {
                    const float pj = pt0[(size_t)j * ld + (size_t)i];
                    const float *row = cf + (size_t)i * hd;
                    for (int sg = 0; sg < nseg; sg++) {
                        const float ps = pj * st[(size_t)i * (size_t)nseg + (size_t)sg];
                        for (size_t ch = seg[sg]; ch < seg[sg + 1]; ch++) aj[ch] += ps * row[ch];
                    }
                }
            }
        }
        for (int j = 0; j < nj; j++)
            for (int sg = 0; sg < nseg; sg++)
                for (size_t ch = seg[sg]; ch < seg[sg + 1]; ch++)
                    acc[(size_t)(j0 + j) * hd + ch] += zacc[(size_t)j * (size_t)nseg + (size_t)sg];
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
                acc[(size_t)j * hd + ch] += rt_param(scales, g, pt) * sp + rt_param(zeros, g, pt) * psum;
            }
        }
        t = k * G + iend;
    }
}

void kv_rti_uniform_accum(const rt_codec *c, const uint32_t *codes, const uint8_t *params, int m, int r0, int r1,
                      int h, const float *p, size_t ld, int nq, float *acc) {
    const void *scales, *zeros;
    params_of(c, params, m, &scales, &zeros);
    if (c->q.uniform.axis == KV_AXIS_CHANNELS)
        accum_channels_axis(c, codes, scales, zeros, m, r0, r1, h, p, ld, nq, acc);
    else
        accum_tokens_axis(c, codes, scales, zeros, m, r0, r1, h, p, ld, nq, acc);
}
