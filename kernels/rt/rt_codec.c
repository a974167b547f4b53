/* rt_codec.c — the codec of one (layer, stream): what a plan's stream record becomes in the runtime
 * (RUNTIME.md §3). What every method shares lives here (the fields common to all, the rules between streams,
 * dispatch through the method's row of the codec table, rt_codecs.c); the rest is the row's. */
#include "kvrt.h"
#include "rt_internal.h"

#include <stdlib.h>
#include <string.h>

kv_status kv_rti_codec_init(rt_codec *c, const kv_plan *p, int layer, int stream, kv_grid_search *const *search) {
    memset(c, 0, sizeof *c);
    const kv_plan_stream *ps = &p->layers[layer].stream[stream];
    const kv_plan_fingerprint *fp = &p->fingerprint;
    c->layer = layer;
    c->stream = stream;
    c->n_kv_heads = fp->n_kv_heads;
    c->head_dim = fp->head_dim;
    c->kv_dim = fp->n_kv_heads * fp->head_dim;
    c->pre_rope = stream == KV_PLAN_K && ps->pre_rope;
    c->pred = ps->predictor;
    c->rpc_ratio = ps->rpc_ratio;
    c->granule = 1;
    c->share_from = ps->share_codes_with_layer;
    if (c->share_from >= 0 && (ps->predictor || ps->rpc_ratio > 0.0f ||
                               p->layers[c->share_from].stream[stream].rpc_ratio > 0.0f))
        return KV_ERR(KV_EUNSUPPORTED, "plan layer %d %s: shared codes (XQuant) together with %s are not supported (the "
                      "two layers' chunks must be the same tokens)", layer, rt_stream_name(stream),
                      ps->predictor ? "an AQUA-KV predictor" : "a recent pivotal context (KVmix)");
    if (ps->rpc_ratio > 0.0f && ps->predictor)
        return KV_ERR(KV_EUNSUPPORTED, "plan layer %d %s: a recent pivotal context (KVmix) together with an "
                      "AQUA-KV predictor is not supported (their chunks do not align across layers)", layer,
                      rt_stream_name(stream));
    const rt_codec_ops *ops = kv_rti_codec_ops((int)ps->method);
    if (!ops)
        return KV_ERR(KV_EUNSUPPORTED, "plan layer %d %s: unknown method %d", layer, rt_stream_name(stream),
                      (int)ps->method);
    if (ps->squat && (stream != KV_PLAN_K || !ops->squat_keys))
        return KV_ERR(KV_EUNSUPPORTED, "plan layer %d %s: SQuat applies to uniform keys (the stream is %s, method %s)",
                      layer, rt_stream_name(stream), rt_stream_name(stream), ops->name);
    c->ops = ops;
    kv_status s = ops->quant(&c->q, p, layer, stream);
    if (s != KV_OK) return kv_error_wrap(s, "plan: "); /* the message names the layer and stream */
    return ops->init(c, p, layer, stream, search);
}

kv_status kv_rti_codec_head_init(rt_codec *dst, const rt_codec *full, int h) {
    *dst = *full;
    dst->kv_dim = full->head_dim;
    dst->n_kv_heads = 1;
    dst->pred = NULL;
    dst->rpc_ratio = 0.0f;
    dst->granule = 1;
    dst->share_from = -1;
    dst->signs = NULL;
    dst->lut = NULL; /* a table is the codec's own (kv_rti_codec_free frees it) */
    dst->squat = NULL; /* SQuat with token pruning is refused at open */
    dst->sq_basis = NULL;
    return full->ops->head_init ? full->ops->head_init(dst, full, h) : KV_OK;
}

void kv_rti_codec_free(rt_codec *c) {
    if (!c) return;
    free(c->signs);
    c->signs = NULL;
    free(c->lut);
    c->lut = NULL;
    for (int h = 0; c->sq_basis && h < c->n_kv_heads; h++) kv_squat_free(c->sq_basis[h]);
    free(c->sq_basis);
    c->sq_basis = NULL;
}

void kv_rti_codec_layout(const rt_codec *c, int m, rt_layout *out) { c->ops->layout(c, m, out); }

kv_status kv_rti_codec_encode(const rt_codec *c, uint8_t *blk, int m, const float *x) {
    if (c->squat) /* a programming error: SQuat needs the sequence's encoders */
        return KV_ERR(KV_EINVAL, "plan layer %d K: SQuat keys are encoded through kv_rti_squat_encode", c->layer);
    return c->ops->encode(c, blk, m, x);
}

kv_status kv_rti_codec_encode_squat(const rt_codec *c, uint8_t *blk, int m, const float *x, kv_squat *const *enc) {
    rt_layout L;
    kv_rti_codec_layout(c, m, &L);
    const size_t n = (size_t)m * (size_t)c->kv_dim, hd = (size_t)c->head_dim;
    uint8_t *params = blk + L.code_bytes, *cs = malloc(n ? n : 1);
    if (!cs) return KV_ERR(KV_ENOMEM, "out of memory");
    kv_status s = KV_OK;
    for (int h = 0; h < c->n_kv_heads; h++) { /* the head's channel runs of every token group */
        s = kv_squat_encode_cols(cs, params, params + L.param_bytes, enc[h], &c->q.uniform, (size_t)m,
                                 (size_t)c->kv_dim, (size_t)h * hd, x + (size_t)h * hd, (size_t)c->kv_dim);
        if (s != KV_OK) {
            s = kv_error_wrap(s, "KV head %d: ", h);
            break;
        }
    }
    if (s == KV_OK) {
        memset(blk, 0, L.code_bytes);
        kv_pack_range((uint32_t *)blk, 0, cs, n, c->bits, c->per_word);
    }
    free(cs);
    return s;
}

void kv_rti_codec_decode_head(const rt_codec *c, const rt_block *b, int r0, int r1, int h, float *out, size_t ldo) {
    c->ops->decode_head(c, b, r0, r1, h, out, ldo);
}

kv_status kv_rti_codec_decode(const rt_codec *c, const rt_block *b, float *out) { return c->ops->decode(c, b, out); }

/* The layout of a quantizer's block (kvrt.h "Packed code layout"): [codes][scales or norms][zeros]. */
void kv_rti_quant_layout(const rt_codec *c, int m, rt_layout *out) {
    memset(out, 0, sizeof *out);
    kv_block_storage st;
    /* the descriptor was checked at init: the storage of a valid shape cannot fail */
    if (kv_quant_storage(&st, &c->q, (size_t)m, (size_t)c->kv_dim) != KV_OK) return;
    out->code_bytes = (size_t)st.code_bytes;
    out->groups = (size_t)st.groups;
    out->param_bytes = (size_t)(c->q.kind == KV_QUANT_UNIFORM ? st.scale_bytes : st.norm_bytes);
    out->total = (size_t)st.total_bytes;
}

void kv_rti_block_parts(const rt_codec *c, const rt_block *blk, const uint32_t **codes, const uint8_t **params) {
    rt_layout L;
    kv_rti_codec_layout(c, blk->m, &L);
    *codes = blk->codes;
    *params = blk->data + L.code_bytes;
}
