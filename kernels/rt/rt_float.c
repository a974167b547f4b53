/* rt_float.c — FP8 (E4M3, E5M2) and NVFP4 codecs of the runtime (kernels/FLOAT_KV.md, PLAN_FORMAT.md
 * §6.9): attention scores and weighted value sums read a block's codes directly (unpacked per token in
 * registers, looked up in the element table), never a decoded cache.
 *   FP8:   k_hat[t][c] = v(code) * S_h, so q . k_hat[t] = S_h * sum_c q_c v(code[t][c]) and the value
 *          sum adds (p_t S_h) v(code[t][c]);
 *   NVFP4: k_hat[t][c] = e2m1(code) * d_b, d_b = e4m3(block scale) * S_h per block b of 16 channels:
 *          q . k_hat[t] = sum_b d_b sum_{c in b} q_c e2m1(code), values add (p_t d_b) e2m1(code).
 * The float rounding of these orders is within the runtime's bound (RUNTIME.md §4: a score sums at
 * most head_dim + 2 products in float). Decoding multiplies exactly as kv_fpq_decode_ref does, so the
 * decoded cache equals the quantizer's output bit for bit. */
#include "kvrt.h"
#include "rt_internal.h"

#include <stdlib.h>

kv_status kv_rti_float_init(rt_codec *c) {
    const int fmt = (int)c->q.fp.format, n = fmt == KV_FP_NVFP4 ? 16 : 256;
    c->kind = RT_FLOAT;
    c->bits = kv_qm_fp_bits(fmt);
    c->per_word = kv_qm_per_word(c->bits, 0);
    c->lut = malloc((size_t)n * sizeof *c->lut);
    if (!c->lut) return KV_ERR(KV_ENOMEM, "out of memory");
    /* NaN codes of FP8 never occur in a block (the encoder rejects non-finite inputs and saturates) */
    for (int i = 0; i < n; i++) c->lut[i] = kv_qm_fp_decode(fmt, (uint32_t)i);
    return KV_OK;
}

static float head_scale(const rt_codec *c, int h) {
    const kv_fpq *f = &c->q.fp;
    return f->n_scales == 1 ? f->scales[0] : f->scales[h];
}

/* Element values of the head's channels of token t (exact table lookups). */
static void row_values(const rt_codec *c, const uint32_t *codes, int t, int h, float *row) {
    uint8_t cb[KV_RT_MAX_HEAD_DIM];
    const size_t hd = (size_t)c->head_dim;
    kv_unpack_range(cb, codes, (size_t)t * (size_t)c->kv_dim + (size_t)h * hd, hd, c->bits, c->per_word);
    for (size_t k = 0; k < hd; k++) row[k] = c->lut[cb[k]];
}

/* NVFP4 block multiplier of channel cc (absolute) of token t. */
static float block_mul(const rt_codec *c, const uint8_t *bscales, int t, size_t cc, float S) {
    const size_t nb = ((size_t)c->kv_dim + KV_NVFP4_BLOCK - 1) / KV_NVFP4_BLOCK;
    return kv_qm_nvfp4_block_mul(bscales[(size_t)t * nb + cc / KV_NVFP4_BLOCK], S);
}

/* The NVFP4 blocks that cover head h's channels for token t: blocks of absolute channels
 * [16 b, 16 b + 16) clipped to the head, as head-relative bounds bound[i]..bound[i+1] with the
 * block's multiplier mul[i]; returns their count. */
static int nvfp4_head_blocks(const rt_codec *c, const uint8_t *bscales, int t, int h, float S, int *bound, float *mul) {
    const int hd = c->head_dim;
    const size_t c0 = (size_t)h * (size_t)hd;
    int n = 0;
    bound[0] = 0;
    for (int a = 0; a < hd; n++) {
        const size_t cc = c0 + (size_t)a;
        int e = (int)((cc / KV_NVFP4_BLOCK + 1) * KV_NVFP4_BLOCK - c0);
        e = e < hd ? e : hd;
        mul[n] = block_mul(c, bscales, t, cc, S);
        bound[n + 1] = e;
        a = e;
    }
    return n;
}

/* at most one block per 16 channels, plus one straddling each end of the head */
#define MAX_HEAD_BLOCKS (KV_RT_MAX_HEAD_DIM / KV_NVFP4_BLOCK + 2)

void kv_rti_float_scores(const rt_codec *c, const uint32_t *codes, const uint8_t *params, int m, int r0, int r1, int h,
                     const float *q, int nq, float *out, size_t ld) {
    (void)m;
    const int hd = c->head_dim, nvfp4 = c->q.fp.format == KV_FP_NVFP4;
    const float S = head_scale(c, h);
    float row[KV_RT_MAX_HEAD_DIM], mul[MAX_HEAD_BLOCKS];
    int bound[MAX_HEAD_BLOCKS + 1], nb = 0;
    for (int t = r0; t < r1; t++) {
        row_values(c, codes, t, h, row);
        if (nvfp4) nb = nvfp4_head_blocks(c, params, t, h, S, bound, mul);
        for (int j = 0; j < nq; j++) {
            const float *qj = q + (size_t)j * (size_t)hd;
            float s = 0.0f;
            if (!nvfp4) {
                for (int k = 0; k < hd; k++) s += qj[k] * row[k];
                s *= S;
            } else {
                for (int b = 0; b < nb; b++) {
                    float part = 0.0f;
                    for (int k = bound[b]; k < bound[b + 1]; k++) part += qj[k] * row[k];
                    s += part * mul[b];
                }
            }
            out[(size_t)j * ld + (size_t)(t - r0)] = s;
        }
    }
}

void kv_rti_float_accum(const rt_codec *c, const uint32_t *codes, const uint8_t *params, int m, int r0, int r1, int h,
                    const float *p, size_t ld, int nq, float *acc) {
    (void)m;
    const int hd = c->head_dim, nvfp4 = c->q.fp.format == KV_FP_NVFP4;
    const float S = head_scale(c, h);
    float row[KV_RT_MAX_HEAD_DIM], mul[MAX_HEAD_BLOCKS];
    int bound[MAX_HEAD_BLOCKS + 1], nb = 0;
    for (int t = r0; t < r1; t++) {
        row_values(c, codes, t, h, row);
        if (nvfp4) nb = nvfp4_head_blocks(c, params, t, h, S, bound, mul);
        for (int j = 0; j < nq; j++) {
            const float w = p[(size_t)j * ld + (size_t)(t - r0)];
            float *a = acc + (size_t)j * (size_t)hd;
            if (!nvfp4) {
                const float ws = w * S;
                for (int k = 0; k < hd; k++) a[k] += ws * row[k];
                continue;
            }
            for (int b = 0; b < nb; b++) {
                const float wd = w * mul[b];
                for (int k = bound[b]; k < bound[b + 1]; k++) a[k] += wd * row[k];
            }
        }
    }
}

void kv_rti_float_decode_head(const rt_codec *c, const rt_block *b, int r0, int r1, int h, float *out, size_t ldo) {
    const uint32_t *codes;
    const uint8_t *params;
    kv_rti_block_parts(c, b, &codes, &params);
    const int hd = c->head_dim;
    const size_t c0 = (size_t)h * (size_t)hd;
    const float S = head_scale(c, h);
    float row[KV_RT_MAX_HEAD_DIM];
    for (int t = r0; t < r1; t++) {
        row_values(c, codes, t, h, row);
        float *o = out + (size_t)(t - r0) * ldo;
        if (c->q.fp.format != KV_FP_NVFP4)
            for (int k = 0; k < hd; k++) o[k] = row[k] * S; /* kv_fpq_decode_ref: fp_value * S */
        else
            for (int k = 0; k < hd; k++) o[k] = row[k] * block_mul(c, params, t, c0 + (size_t)k, S);
    }
}
