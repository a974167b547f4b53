/* rt_codec_fp.c — the codec table's row of full-precision streams (plan method fp: f16 or f32 rows), RUNTIME.md §3.
 * Blocks are the rows themselves; attention reads them with the f16 / f32 kernels of rt_fp.c. */
#include "kvrt.h"
#include "rt_dev.h"
#include "rt_internal.h"

#include <string.h>

static kv_status fp_quant(kv_quant *q, const kv_plan *p, int layer, int stream) {
    (void)p, (void)layer, (void)stream;
    memset(q, 0, sizeof *q);
    q->kind = KV_QUANT_F16;
    return KV_OK;
}

static kv_status fp_init(rt_codec *c, const kv_plan *p, int layer, int stream, kv_grid_search *const *search) {
    (void)search;
    c->kind = p->layers[layer].stream[stream].bits == 32 ? RT_F32 : RT_F16;
    c->direct = 1;
    return KV_OK;
}

static size_t elem_bytes(const rt_codec *c) { return c->kind == RT_F16 ? 2u : 4u; }

static void fp_layout(const rt_codec *c, int m, rt_layout *out) {
    memset(out, 0, sizeof *out);
    out->code_bytes = (size_t)m * (size_t)c->kv_dim * elem_bytes(c);
    out->total = out->code_bytes;
}

static kv_status fp_encode(const rt_codec *c, uint8_t *blk, int m, const float *x) {
    const size_t n = (size_t)m * (size_t)c->kv_dim;
    if (c->kind == RT_F16)
        kv_rti_f32_to_f16_row((uint16_t *)blk, x, n);
    else
        memcpy(blk, x, n * sizeof(float));
    return KV_OK;
}

static kv_status fp_decode(const rt_codec *c, const rt_block *b, float *out) {
    const size_t n = (size_t)b->m * (size_t)c->kv_dim;
    if (c->kind == RT_F16)
        kv_rti_f16_to_f32_row(out, (const uint16_t *)b->data, n);
    else
        memcpy(out, b->data, n * sizeof(float));
    return KV_OK;
}

static void fp_decode_head(const rt_codec *c, const rt_block *b, int r0, int r1, int h, float *out, size_t ldo) {
    const size_t hd = (size_t)c->head_dim, C = (size_t)c->kv_dim;
    for (int t = r0; t < r1; t++) {
        float *o = out + (size_t)(t - r0) * ldo;
        if (c->kind == RT_F16)
            kv_rti_f16_to_f32_row(o, (const uint16_t *)b->data + (size_t)t * C + (size_t)h * hd, hd);
        else
            memcpy(o, (const float *)b->data + (size_t)t * C + (size_t)h * hd, hd * sizeof(float));
    }
}

static void fp_scores(const rt_codec *c, const rt_block *b, int r0, int r1, int h, const float *q, const float *prep,
                      int nq, float *out, size_t ld) {
    (void)prep;
    const size_t C = (size_t)c->kv_dim, off = (size_t)r0 * C + (size_t)h * (size_t)c->head_dim;
    if (c->kind == RT_F16)
        kv_rti_f16_scores((const uint16_t *)b->data + off, C, r1 - r0, c->head_dim, q, nq, out, ld);
    else
        kv_rti_f32_scores((const float *)b->data + off, C, r1 - r0, c->head_dim, q, nq, out, ld);
}

static void fp_accum(const rt_codec *c, const rt_block *b, int r0, int r1, int h, const float *p, size_t ld, int nq,
                     float *acc) {
    const size_t C = (size_t)c->kv_dim, off = (size_t)r0 * C + (size_t)h * (size_t)c->head_dim;
    if (c->kind == RT_F16)
        kv_rti_f16_accum((const uint16_t *)b->data + off, C, r1 - r0, c->head_dim, p, ld, nq, acc);
    else
        kv_rti_f32_accum((const float *)b->data + off, C, r1 - r0, c->head_dim, p, ld, nq, acc);
}

static kv_status fp_dev_describe(kv_rt *rt, const rt_codec *c, kv_dcodec *d, kv_quant *dq) {
    (void)rt, (void)c, (void)d, (void)dq; /* rows: nothing beyond the common fields */
    return KV_OK;
}

const rt_codec_ops kv_rti_codec_fp = {
    .name = "fp", .bound = 0, .quant = fp_quant, .init = fp_init, .layout = fp_layout, .encode = fp_encode,
    .decode = fp_decode, .decode_head = fp_decode_head, .scores = fp_scores, .accum = fp_accum,
    .dev_describe = fp_dev_describe,
};
