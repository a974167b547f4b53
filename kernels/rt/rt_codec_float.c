/* rt_codec_float.c — the codec table's rows of the float formats serving engines hold (plan methods fp8_e4m3,
 * fp8_e5m2, nvfp4: kernels/FLOAT_KV.md), RUNTIME.md §3: elements with one f32 scale per tensor or per KV head, and
 * NVFP4's E4M3 block scales. The three rows share everything but their element format; the attention kernels
 * and the element table are rt_float.c's. */
#include "kvrt.h"
#include "rt_dev.h"
#include "rt_internal.h"

#include <string.h>

static kv_status float_quant(kv_quant *q, const kv_plan *p, int layer, int stream, kv_fp_format format) {
    const kv_plan_stream *s = &p->layers[layer].stream[stream];
    const kv_plan_fingerprint *f = &p->fingerprint;
    memset(q, 0, sizeof *q);
    q->kind = KV_QUANT_FP;
    q->fp.format = format;
    q->fp.n_scales = s->n_fp_scales;
    q->fp.scale_channels = f->head_dim;
    q->fp.scales = s->fp_scales; /* borrowed from the plan */
    const kv_status st = kv_fpq_check(&q->fp, (size_t)f->n_kv_heads * (size_t)f->head_dim);
    return st == KV_OK ? KV_OK : kv_rti_quant_refusal(st, layer, stream);
}
static kv_status e4m3_quant(kv_quant *q, const kv_plan *p, int l, int s) { return float_quant(q, p, l, s, KV_FP_E4M3); }
static kv_status e5m2_quant(kv_quant *q, const kv_plan *p, int l, int s) { return float_quant(q, p, l, s, KV_FP_E5M2); }
static kv_status nvfp4_quant(kv_quant *q, const kv_plan *p, int l, int s) { return float_quant(q, p, l, s, KV_FP_NVFP4); }

static kv_status float_init(rt_codec *c, const kv_plan *p, int layer, int stream, kv_grid_search *const *search) {
    (void)p, (void)layer, (void)stream, (void)search;
    c->direct = 1;
    return kv_rti_float_init(c);
}

/* One head's own blocks: the head's scale (per-head scales) and its own element table; NVFP4 blocks of 16 channels
 * must not span heads (a head's block holds only its channels). */
static kv_status float_head_init(rt_codec *dst, const rt_codec *full, int h) {
    if (full->q.fp.format == KV_FP_NVFP4 && full->head_dim % KV_NVFP4_BLOCK)
        return KV_ERR(KV_EUNSUPPORTED, "plan layer %d %s: NVFP4 blocks of %d channels span KV heads (head_dim %d), so "
                      "a head's kept tokens cannot be coded on their own (token pruning keeps tokens per head)",
                      full->layer, rt_stream_name(full->stream), KV_NVFP4_BLOCK, full->head_dim);
    if (full->q.fp.n_scales > 1) {
        dst->q.fp.scales = full->q.fp.scales + h;
        dst->q.fp.n_scales = 1;
    }
    return kv_rti_float_init(dst);
}

static kv_status float_encode(const rt_codec *c, uint8_t *blk, int m, const float *x) {
    rt_layout L;
    kv_rti_quant_layout(c, m, &L);
    return kv_fpq_encode_ref((uint32_t *)blk, blk + L.code_bytes, &c->q.fp, (size_t)m, (size_t)c->kv_dim, x);
}

static kv_status float_decode(const rt_codec *c, const rt_block *b, float *out) {
    const uint32_t *codes;
    const uint8_t *params;
    kv_rti_block_parts(c, b, &codes, &params);
    return kv_fpq_decode_ref(out, &c->q.fp, (size_t)b->m, (size_t)c->kv_dim, codes, params);
}

static void float_scores(const rt_codec *c, const rt_block *b, int r0, int r1, int h, const float *q, const float *prep,
                         int nq, float *out, size_t ld) {
    (void)prep;
    const uint32_t *codes;
    const uint8_t *params;
    kv_rti_block_parts(c, b, &codes, &params);
    kv_rti_float_scores(c, codes, params, b->m, r0, r1, h, q, nq, out, ld);
}

static void float_accum(const rt_codec *c, const rt_block *b, int r0, int r1, int h, const float *p, size_t ld, int nq,
                        float *acc) {
    const uint32_t *codes;
    const uint8_t *params;
    kv_rti_block_parts(c, b, &codes, &params);
    kv_rti_float_accum(c, codes, params, b->m, r0, r1, h, p, ld, nq, acc);
}

static kv_status float_dev_describe(kv_rt *rt, const rt_codec *c, kv_dcodec *d, kv_quant *dq) {
    const kv_fpq *f = &c->q.fp;
    void *p = NULL;
    kv_status s;
    d->fformat = (int)f->format;
    d->n_scales = f->n_scales;
    d->scale_channels = f->scale_channels;
    d->word_aligned = c->kv_dim % c->per_word == 0 && c->head_dim % c->per_word == 0;
    if ((s = kv_rti_dev_table(rt, f->scales, (size_t)f->n_scales * sizeof(float), &p)) != KV_OK) return s;
    d->scales = (const float *)p;
    dq->fp.scales = (const float *)p;
    if ((s = kv_rti_dev_table(rt, c->lut, (size_t)(f->format == KV_FP_NVFP4 ? 16 : 256) * sizeof(float), &p)) != KV_OK)
        return s;
    d->lut = (const float *)p;
    return KV_OK;
}

#define KV_RT_FLOAT_ROW(row_name, quant_fn)                                                                          \
    {                                                                                                                \
        .name = row_name, .bound = 0, .quant = quant_fn, .init = float_init, .head_init = float_head_init,          \
        .layout = kv_rti_quant_layout, .encode = float_encode, .decode = float_decode,                              \
        .decode_head = kv_rti_float_decode_head, .scores = float_scores, .accum = float_accum,                      \
        .dev_describe = float_dev_describe,                                                                          \
    }
const rt_codec_ops kv_rti_codec_fp8_e4m3 = KV_RT_FLOAT_ROW("fp8_e4m3", e4m3_quant);
const rt_codec_ops kv_rti_codec_fp8_e5m2 = KV_RT_FLOAT_ROW("fp8_e5m2", e5m2_quant);
const rt_codec_ops kv_rti_codec_nvfp4 = KV_RT_FLOAT_ROW("nvfp4", nvfp4_quant);
