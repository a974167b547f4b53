/* Uniform asymmetric quantizer with XQuant calibration: CPU reference (kvrt.h). */
#include "kv_quant_math.h"
#include "kv_kernels_internal.h"

#include <stdlib.h>
#include <string.h>

/* Running position in the packed stream. */
typedef struct stream_cursor {
    size_t w;
    int slot;
} stream_cursor;

static inline stream_cursor cursor_at(size_t j, int per) {
    stream_cursor cur;
    cur.w = j / (size_t)per;
    cur.slot = (int)(j - cur.w * (size_t)per);
    return cur;
}

/* Quantize `count` values x[i * stride] into consecutive stream positions starting at j0.
 * The words must be zero where the run writes (memset by the caller). */
static void put_run(uint32_t *KV_RESTRICT words, size_t j0, const float *KV_RESTRICT x, size_t stride,
                    size_t count, const kv_qm_uparams *p, int bits, int per) {
    stream_cursor cur = cursor_at(j0, per);
    const uint32_t full = (1u << bits) - 1u;
    size_t i = 0;
    /* head: slot by slot up to a word boundary */
    for (; i < count && cur.slot != 0; i++) {
        words[cur.w] |= kv_qm_uniform_code(x[i * stride], p->z, p->inv, kv_qm_slot_max(bits, per, cur.slot))
                        << (cur.slot * bits);
        if (++cur.slot == per) {
            cur.slot = 0;
            cur.w++;
        }
    }
    /* whole words */
    if (per != 11) {
        for (; i + (size_t)per <= count; i += (size_t)per, cur.w++) {
            uint32_t word = 0;
            for (int s = 0; s < per; s++)
                word |= kv_qm_uniform_code(x[(i + (size_t)s) * stride], p->z, p->inv, full) << (s * bits);
            words[cur.w] = word;
        }
    } else {
        for (; i + 11 <= count; i += 11, cur.w++) {
            uint32_t word = 0;
            for (int s = 0; s < 10; s++)
                word |= kv_qm_uniform_code(x[(i + (size_t)s) * stride], p->z, p->inv, 7u) << (s * 3);
            word |= kv_qm_uniform_code(x[(i + 10) * stride], p->z, p->inv, 3u) << 30;
            words[cur.w] = word;
        }
    }
    /* tail */
    for (; i < count; i++) {
        words[cur.w] |= kv_qm_uniform_code(x[i * stride], p->z, p->inv, kv_qm_slot_max(bits, per, cur.slot))
                        << (cur.slot * bits);
        cur.slot++;
    }
}

/* Decode `count` consecutive stream positions from j0 into y[i * stride]. */
static void get_run(float *KV_RESTRICT y, size_t stride, const uint32_t *KV_RESTRICT words, size_t j0,
                    size_t count, float s, float z, int bits, int per) {
    stream_cursor cur = cursor_at(j0, per);
    for (size_t i = 0; i < count; i++) {
        const uint32_t code = (words[cur.w] >> (cur.slot * bits)) & kv_qm_slot_max(bits, per, cur.slot);
        y[i * stride] = kv_qm_uniform_dequant(code, s, z);
        if (++cur.slot == per) {
            cur.slot = 0;
            cur.w++;
        }
    }
}

static kv_status prologue(size_t *n, const kv_uniform *q, size_t tokens, size_t channels) {
    kv_status s = kv_uniform_check(q);
    if (s != KV_OK) return s;
    return kv_block_values(n, tokens, channels);
}

kv_status kv_uniform_encode_ref(uint32_t *codes, void *scales, void *zeros, const kv_uniform *q,
                                size_t tokens, size_t channels, const float *x) {
    size_t n;
    kv_status st = prologue(&n, q, tokens, channels);
    if (st != KV_OK || n == 0) return st;
    const int bits = q->bits, per = kv_qm_per_word(bits, q->pack11);
    const size_t G = (size_t)q->group, C = channels;
    const int pt = (int)q->param_type;
    int bad = 0;
    float *mn = NULL, *mx = NULL;
    kv_qm_uparams *pp = NULL;
    if (codes) memset(codes, 0, kv_pack_words(n, bits, q->pack11) * sizeof *codes);

    if (q->axis == KV_AXIS_CHANNELS) {
        const size_t ncg = kv_qm_chan_groups(G, C);
        for (size_t t = 0; t < tokens; t++) {
            for (size_t cg = 0; cg < ncg; cg++) {
                const size_t c0 = cg * G, cn = C - c0 < G ? C - c0 : G;
                const float *xr = x + t * C + c0;
                float lo = xr[0], hi = xr[0];
                for (size_t i = 0; i < cn; i++) {
                    const float v = xr[i];
                    bad |= !kv_qm_is_finite(v);
                    lo = v < lo ? v : lo;
                    hi = v > hi ? v : hi;
                }
                if (bad) goto nonfinite;
                const kv_qm_uparams p = kv_qm_uniform_params(lo, hi, bits, q->eta);
                kv_qm_param_store(scales, t * ncg + cg, p.sc, pt);
                kv_qm_param_store(zeros, t * ncg + cg, p.zc, pt);
                if (codes) put_run(codes, t * C + c0, xr, 1, cn, &p, bits, per);
            }
        }
    } else {
        mn = malloc(C * sizeof *mn);
        mx = malloc(C * sizeof *mx);
        pp = malloc(C * sizeof *pp);
        if (!mn || !mx || !pp) {
            st = KV_ERR(KV_ENOMEM, "uniform encode: out of memory (%zu channels)", C);
            goto done;
        }
        for (size_t k = 0; k * G < tokens; k++) {
            const size_t r0 = k * G, rows = kv_qm_tok_group_rows(G, tokens, k);
            const float *xt = x + r0 * C;
            memcpy(mn, xt, C * sizeof *mn);
            memcpy(mx, xt, C * sizeof *mx);
            for (size_t i = 0; i < rows; i++) {
                const float *xr = xt + i * C;
                for (size_t c = 0; c < C; c++) {
                    const float v = xr[c];
                    bad |= !kv_qm_is_finite(v);
                    mn[c] = v < mn[c] ? v : mn[c];
                    mx[c] = v > mx[c] ? v : mx[c];
                }
            }
            if (bad) goto nonfinite;
            for (size_t c = 0; c < C; c++) {
                pp[c] = kv_qm_uniform_params(mn[c], mx[c], bits, q->eta);
                kv_qm_param_store(scales, k * C + c, pp[c].sc, pt);
                kv_qm_param_store(zeros, k * C + c, pp[c].zc, pt);
            }
            if (codes)
                for (size_t c = 0; c < C; c++)
                    put_run(codes, k * G * C + c * rows, xt + c, C, rows, &pp[c], bits, per);
        }
    }
    goto done;
nonfinite:
    st = KV_ERR(KV_ENUMERIC, "uniform encode: non-finite input value");
done:
    free(mn);
    free(mx);
    free(pp);
    return st;
}

kv_status kv_uniform_decode_ref(float *x_hat, const kv_uniform *q, size_t tokens, size_t channels,
                                const uint32_t *codes, const void *scales, const void *zeros) {
    size_t n;
    kv_status st = prologue(&n, q, tokens, channels);
    if (st != KV_OK || n == 0) return st;
    const int bits = q->bits, per = kv_qm_per_word(bits, q->pack11);
    const size_t G = (size_t)q->group, C = channels;
    const int pt = (int)q->param_type;
    if (q->axis == KV_AXIS_CHANNELS) {
        const size_t ncg = kv_qm_chan_groups(G, C);
        for (size_t t = 0; t < tokens; t++)
            for (size_t cg = 0; cg < ncg; cg++) {
                const size_t c0 = cg * G, cn = C - c0 < G ? C - c0 : G;
                const size_t g = t * ncg + cg;
                get_run(x_hat + t * C + c0, 1, codes, t * C + c0, cn, kv_qm_param_load(scales, g, pt),
                        kv_qm_param_load(zeros, g, pt), bits, per);
            }
    } else {
        for (size_t k = 0; k * G < tokens; k++) {
            const size_t r0 = k * G, rows = kv_qm_tok_group_rows(G, tokens, k);
            for (size_t c = 0; c < C; c++)
                get_run(x_hat + r0 * C + c, C, codes, k * G * C + c * rows, rows,
                        kv_qm_param_load(scales, k * C + c, pt), kv_qm_param_load(zeros, k * C + c, pt),
                        bits, per);
        }
    }
    return KV_OK;
}

kv_status kv_uniform_scores_ref(float *scores, const kv_uniform *q, size_t tokens, size_t channels,
                                const uint32_t *codes, const void *scales, const void *zeros,
                                const float *query) {
    size_t n;
    kv_status st = prologue(&n, q, tokens, channels);
    if (st != KV_OK || n == 0) {
        if (st == KV_OK)
            for (size_t t = 0; t < tokens; t++) scores[t] = 0.0f;
        return st;
    }
    const int per = kv_qm_per_word(q->bits, q->pack11);
    for (size_t t = 0; t < tokens; t++)
        scores[t] = kv_qm_uniform_score(q->bits, per, (int)q->axis, (size_t)q->group, tokens, channels,
                                        t, codes, scales, zeros, (int)q->param_type, query);
    return KV_OK;
}
