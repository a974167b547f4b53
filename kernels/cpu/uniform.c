/* Uniform asymmetric quantizer with XQuant calibration: CPU reference (kvrt.h). */
#include "kv_quant_math.h"
#include "kv_kernels_internal.h"

#include <stdlib.h>
#include <string.h>

/* Codes of `count` values x[i] with one group's parameters (clamped to 2^bits - 1; the
 * 11-per-word slot-10 clamp is applied by kv_pack_range). */
static void codes_run(uint8_t *KV_RESTRICT out, const float *KV_RESTRICT x, size_t count, float z, float inv,
                      uint32_t full) {
    size_t i = 0;
    for (; i + 16 <= count; i += 16) /* fixed-size blocks: vectorized even inside loop nests */
        for (int k = 0; k < 16; k++) out[i + (size_t)k] = (uint8_t)kv_qm_uniform_code(x[i + (size_t)k], z, inv, full);
    for (; i < count; i++) out[i] = (uint8_t)kv_qm_uniform_code(x[i], z, inv, full);
}

/* Per-channel codes of one row: out[c] = code(x[c]) with channel c's parameters. */
static void codes_row(uint8_t *KV_RESTRICT out, const float *KV_RESTRICT x, const float *KV_RESTRICT z,
                      const float *KV_RESTRICT inv, size_t C, uint32_t full) {
    size_t c = 0;
    for (; c + 16 <= C; c += 16)
        for (int k = 0; k < 16; k++) {
            const size_t j = c + (size_t)k;
            out[j] = (uint8_t)kv_qm_uniform_code(x[j], z[j], inv[j], full);
        }
    for (; c < C; c++) out[c] = (uint8_t)kv_qm_uniform_code(x[c], z[c], inv[c], full);
}

/* Pack a token group's row-major code tile straight into its channel-major stream when every
 * channel's run is whole words (rows and the group's start multiples of per_word): word b of
 * channel c holds rows b*per .. b*per + per - 1, built for all channels at once (vectorized over
 * channels). acc: C words of scratch. Returns 0 (nothing written) when the layout does not fit. */
static int pack_vertical(uint32_t *KV_RESTRICT words, size_t j0, const uint8_t *KV_RESTRICT tmp, size_t rows,
                         size_t C, int bits, int per, uint32_t *KV_RESTRICT acc) {
    if (per == 11 || rows % (size_t)per || j0 % (size_t)per) return 0;
    const size_t wpc = rows / (size_t)per, w0 = j0 / (size_t)per;
    for (size_t b = 0; b < wpc; b++) {
        memset(acc, 0, C * sizeof *acc);
        for (int sl = 0; sl < per; sl++) {
            const uint8_t *tr = tmp + (b * (size_t)per + (size_t)sl) * C;
            const int sh = sl * bits;
            size_t c = 0;
            for (; c + 16 <= C; c += 16)
                for (int k = 0; k < 16; k++) acc[c + (size_t)k] |= (uint32_t)tr[c + (size_t)k] << sh;
            for (; c < C; c++) acc[c] |= (uint32_t)tr[c] << sh;
        }
        for (size_t c = 0; c < C; c++) words[w0 + c * wpc + b] = acc[c];
    }
    return 1;
}

/* Running per-channel min/max over one more row; returns 1 if a value is NaN or infinite. */
static int minmax_rows(float *KV_RESTRICT mn, float *KV_RESTRICT mx, const float *KV_RESTRICT x, size_t C) {
    uint32_t nf = 0;
    size_t c = 0;
    for (; c + 8 <= C; c += 8)
        for (int k = 0; k < 8; k++) {
            const size_t j = c + (size_t)k;
            const float v = x[j];
            nf |= kv_qm_nonfinite_bit(v);
            mn[j] = v < mn[j] ? v : mn[j];
            mx[j] = v > mx[j] ? v : mx[j];
        }
    for (; c < C; c++) {
        const float v = x[c];
        nf |= kv_qm_nonfinite_bit(v);
        mn[c] = v < mn[c] ? v : mn[c];
        mx[c] = v > mx[c] ? v : mx[c];
    }
    return nf != 0;
}

/* Min and max of x[0..n) (n >= 1) in 8 lanes so that the loop vectorizes (min and max are exact
 * and order-independent); returns 1 if a value is NaN or infinite. */
static int minmax_run(const float *KV_RESTRICT x, size_t n, float *lo_out, float *hi_out) {
    float lo[8], hi[8];
    uint32_t nf = 0;
    for (int k = 0; k < 8; k++) lo[k] = hi[k] = x[0];
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int k = 0; k < 8; k++) {
            const float v = x[i + (size_t)k];
            nf |= kv_qm_nonfinite_bit(v);
            lo[k] = v < lo[k] ? v : lo[k];
            hi[k] = v > hi[k] ? v : hi[k];
        }
    for (; i < n; i++) {
        const float v = x[i];
        nf |= kv_qm_nonfinite_bit(v);
        lo[0] = v < lo[0] ? v : lo[0];
        hi[0] = v > hi[0] ? v : hi[0];
    }
    float l = lo[0], h = hi[0];
    for (int k = 1; k < 8; k++) {
        l = lo[k] < l ? lo[k] : l;
        h = hi[k] > h ? hi[k] : h;
    }
    *lo_out = l;
    *hi_out = h;
    return nf != 0;
}

/* Rows per tile along channels: about 16 KiB of codes, so a tile stays in L1/L2. */
static size_t tile_rows(size_t C) { return C >= 16384 ? 1 : 16384 / C; }

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
    if (kv_uniform_encode_sse2(codes, scales, zeros, q, tokens, channels, x, &st)) return st;
    return kv_uniform_encode_portable(codes, scales, zeros, q, tokens, channels, x);
}

kv_status kv_uniform_encode_portable(uint32_t *codes, void *scales, void *zeros, const kv_uniform *q,
                                     size_t tokens, size_t channels, const float *x) {
    size_t n; /* checked again (two comparisons) so that the portable path can be called alone */
    kv_status st = prologue(&n, q, tokens, channels);
    if (st != KV_OK || n == 0) return st;
    const int bits = q->bits, per = kv_qm_per_word(bits, q->pack11);
    const uint32_t full = (1u << bits) - 1u;
    const size_t G = (size_t)q->group, C = channels;
    const int pt = (int)q->param_type;
    int bad = 0;
    float *mn = NULL, *mx = NULL, *zv = NULL, *iv = NULL;
    uint8_t *tmp = NULL;
    uint32_t *acc = NULL;
    kv_qm_uparams *pp = NULL;
    const size_t TR = q->axis == KV_AXIS_CHANNELS ? tile_rows(C) : G;
    const size_t tile = (TR < tokens ? TR : tokens) * C;
    uint8_t *buf = codes ? malloc(tile) : NULL;
    if (codes && !buf) return KV_ERR(KV_ENOMEM, "uniform encode: out of memory");
    if (codes) memset(codes, 0, kv_pack_words(n, bits, q->pack11) * sizeof *codes);

    if (q->axis == KV_AXIS_CHANNELS) {
        const size_t ncg = kv_qm_chan_groups(G, C);
        for (size_t r0 = 0; r0 < tokens; r0 += TR) {
            const size_t rows = tokens - r0 < TR ? tokens - r0 : TR;
            for (size_t t = r0; t < r0 + rows; t++) {
                for (size_t cg = 0; cg < ncg; cg++) {
                    const size_t c0 = cg * G, cn = C - c0 < G ? C - c0 : G;
                    const float *xr = x + t * C + c0;
                float lo, hi;
                    if (minmax_run(xr, cn, &lo, &hi)) goto nonfinite;
                    const kv_qm_uparams p = kv_qm_uniform_params(lo, hi, bits, q->eta);
                    kv_qm_param_store(scales, t * ncg + cg, p.sc, pt);
                    kv_qm_param_store(zeros, t * ncg + cg, p.zc, pt);
                    if (codes) codes_run(buf + (t - r0) * C + c0, xr, cn, p.z, p.inv, full);
                }
            }
            if (codes) kv_pack_range(codes, r0 * C, buf, rows * C, bits, per);
        }
    } else {
        mn = malloc(C * sizeof *mn);
        mx = malloc(C * sizeof *mx);
        pp = malloc(C * sizeof *pp);
        zv = malloc(C * sizeof *zv);
        iv = malloc(C * sizeof *iv);
        tmp = codes ? malloc(tile) : NULL;
        acc = malloc(C * sizeof *acc);
        if (!mn || !mx || !pp || !zv || !iv || !acc || (codes && !tmp)) {
            st = KV_ERR(KV_ENOMEM, "uniform encode: out of memory (%zu channels)", C);
            goto done;
        }
        for (size_t k = 0; k * G < tokens; k++) {
            const size_t r0 = k * G, rows = kv_qm_tok_group_rows(G, tokens, k);
            const float *xt = x + r0 * C;
            memcpy(mn, xt, C * sizeof *mn);
            memcpy(mx, xt, C * sizeof *mx);
            for (size_t i = 0; i < rows; i++) {
                bad |= minmax_rows(mn, mx, xt + i * C, C);
            }
            if (bad) goto nonfinite;
            for (size_t c = 0; c < C; c++) {
                pp[c] = kv_qm_uniform_params(mn[c], mx[c], bits, q->eta);
                kv_qm_param_store(scales, k * C + c, pp[c].sc, pt);
                kv_qm_param_store(zeros, k * C + c, pp[c].zc, pt);
            }
            if (codes) {
                /* codes row by row (contiguous, vectorized over channels), then a byte transpose
                 * into stream order (channel-major inside the token group) */
                for (size_t c = 0; c < C; c++) {
                    zv[c] = pp[c].z;
                    iv[c] = pp[c].inv;
                }
                for (size_t i = 0; i < rows; i++) codes_row(tmp + i * C, xt + i * C, zv, iv, C, full);
                if (!pack_vertical(codes, k * G * C, tmp, rows, C, bits, per, acc)) {
                    for (size_t c = 0; c < C; c++)
                        for (size_t i = 0; i < rows; i++) buf[c * rows + i] = tmp[i * C + c];
                    kv_pack_range(codes, k * G * C, buf, rows * C, bits, per);
                }
            }
        }
    }
    goto done;
nonfinite:
    st = KV_ERR(KV_ENUMERIC, "uniform encode: non-finite input value");
done:
    free(buf);
    free(tmp);
    free(acc);
    free(mn);
    free(mx);
    free(zv);
    free(iv);
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
    const size_t TR = q->axis == KV_AXIS_CHANNELS ? tile_rows(C) : G;
    uint8_t *buf = malloc((TR < tokens ? TR : tokens) * C);
    float *sv = q->axis == KV_AXIS_TOKENS ? malloc(C * sizeof *sv) : NULL;
    float *zv = q->axis == KV_AXIS_TOKENS ? malloc(C * sizeof *zv) : NULL;
    if (!buf || (q->axis == KV_AXIS_TOKENS && (!sv || !zv))) {
        st = KV_ERR(KV_ENOMEM, "uniform decode: out of memory");
        goto done;
    }
    if (q->axis == KV_AXIS_CHANNELS) {
        const size_t ncg = kv_qm_chan_groups(G, C);
        for (size_t r0 = 0; r0 < tokens; r0 += TR) {
            const size_t rows = tokens - r0 < TR ? tokens - r0 : TR;
            kv_unpack_range(buf, codes, r0 * C, rows * C, bits, per);
            for (size_t t = r0; t < r0 + rows; t++) {
                const uint8_t *bt = buf + (t - r0) * C;
                float *yt = x_hat + t * C;
                for (size_t cg = 0; cg < ncg; cg++) {
                    const size_t c0 = cg * G, cn = C - c0 < G ? C - c0 : G;
                    const float s = kv_qm_param_load(scales, t * ncg + cg, pt), z = kv_qm_param_load(zeros, t * ncg + cg, pt);
                    for (size_t i = 0; i < cn; i++) yt[c0 + i] = kv_qm_uniform_dequant(bt[c0 + i], s, z);
                }
            }
        }
    } else if (!kv_uniform_decode_keys_sse2(x_hat, q, tokens, C, codes, scales, zeros, sv, zv)) {
        for (size_t k = 0; k * G < tokens; k++) {
            const size_t r0 = k * G, rows = kv_qm_tok_group_rows(G, tokens, k);
            kv_unpack_range(buf, codes, k * G * C, rows * C, bits, per);
            for (size_t c = 0; c < C; c++) {
                sv[c] = kv_qm_param_load(scales, k * C + c, pt);
                zv[c] = kv_qm_param_load(zeros, k * C + c, pt);
            }
            for (size_t i = 0; i < rows; i++) {
                float *yt = x_hat + (r0 + i) * C;
                for (size_t c = 0; c < C; c++) yt[c] = kv_qm_uniform_dequant(buf[c * rows + i], sv[c], zv[c]);
            }
        }
    }
done:
    free(buf);
    free(sv);
    free(zv);
    return st;
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
