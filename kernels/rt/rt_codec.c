/* rt_codec.c — the codec of one (layer, stream): what a plan's stream record becomes in the runtime
 * (RUNTIME.md §3). A codec is looked up by (layer, stream) and answers the same questions for every
 * method: block layout, encode, decode of one head's rows. The attention kernels of each method are
 * in rt_uniform.c, rt_higgs.c and rt_fp.c. */
#include "kvrt.h"
#include "rt_internal.h"

#include <stdlib.h>
#include <string.h>

static const char *stream_name(int stream) { return stream == KV_PLAN_K ? "K" : "V"; }

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
                      "two layers' chunks must be the same tokens)", layer, stream_name(stream),
                      ps->predictor ? "an AQUA-KV predictor" : "a recent pivotal context (KVmix)");
    if (ps->rpc_ratio > 0.0f && ps->predictor)
        return KV_ERR(KV_EUNSUPPORTED, "plan layer %d %s: a recent pivotal context (KVmix) together with an "
                      "AQUA-KV predictor is not supported (their chunks do not align across layers)", layer,
                      stream_name(stream));
    if (ps->squat && (stream != KV_PLAN_K || ps->method != KV_PLAN_UNIFORM))
        return KV_ERR(KV_EUNSUPPORTED, "plan layer %d %s: SQuat applies to uniform keys (the stream is %s, method %d)",
                      layer, stream_name(stream), stream == KV_PLAN_K ? "K" : "V", (int)ps->method);
    switch (ps->method) {
    case KV_PLAN_FP:
        c->kind = ps->bits == 32 ? RT_F32 : RT_F16;
        return KV_OK;
    case KV_PLAN_UNIFORM:
    case KV_PLAN_HIGGS: {
        kv_status s = kv_quant_from_plan(&c->q, p, layer, stream);
        if (s != KV_OK) return kv_error_wrap(s, "plan: "); /* the message names the layer and stream */
        break;
    }
    case KV_PLAN_FP8_E4M3: /* rt_float.c */
    case KV_PLAN_FP8_E5M2:
    case KV_PLAN_NVFP4: {
        kv_status s = kv_quant_from_plan(&c->q, p, layer, stream);
        if (s != KV_OK) return kv_error_wrap(s, "plan: ");
        return kv_rti_float_init(c);
    }
    default:
        return KV_ERR(KV_EUNSUPPORTED, "plan layer %d %s: unknown method %d", layer, stream_name(stream),
                      (int)ps->method);
    }
    if (c->q.kind == KV_QUANT_UNIFORM) {
        c->kind = RT_UNIFORM;
        c->bits = c->q.uniform.bits;
        c->per_word = kv_qm_per_word(c->bits, c->q.uniform.pack11);
        if (c->q.uniform.axis == KV_AXIS_TOKENS) c->granule = c->q.uniform.group;
        return ps->squat ? kv_rti_squat_codec_init(c, p, layer) : KV_OK;
    }
    c->kind = RT_HIGGS;
    const kv_higgs *h = &c->q.higgs;
    if (c->kv_dim % h->group)
        return KV_ERR(KV_EFORMAT, "plan layer %d %s: HIGGS group %d does not divide the %d channels of a token",
                      layer, stream_name(stream), h->group, c->kv_dim);
    c->bits = kv_higgs_index_bits(h->size);
    c->per_word = kv_qm_per_word(c->bits, 0);
    c->higgs_direct = c->head_dim % h->group == 0;
    c->signs = malloc((size_t)c->kv_dim * sizeof *c->signs);
    if (!c->signs) return KV_ERR(KV_ENOMEM, "out of memory");
    for (int ch = 0; ch < c->kv_dim; ch++) c->signs[ch] = kv_qm_higgs_sign(h->seed, (size_t)ch);
    const int gi = p->layers[layer].stream[stream].higgs_grid;
    if (search && gi >= 0 && gi < p->n_grids) c->q.higgs.search = search[gi];
    return KV_OK;
}

/* A float stream's codec for one head's own blocks: the head's scale (per-head scales) and its own
 * element table; NVFP4 blocks of 16 channels must not span heads (a head's block holds only its
 * channels). */
static kv_status float_head_init(rt_codec *dst, const rt_codec *full, int h) {
    if (full->q.fp.format == KV_FP_NVFP4 && full->head_dim % KV_NVFP4_BLOCK)
        return KV_ERR(KV_EUNSUPPORTED, "plan layer %d %s: NVFP4 blocks of %d channels span KV heads (head_dim %d), so "
                      "a head's kept tokens cannot be coded on their own (token pruning keeps tokens per head)",
                      full->layer, stream_name(full->stream), KV_NVFP4_BLOCK, full->head_dim);
    if (full->q.fp.n_scales > 1) {
        dst->q.fp.scales = full->q.fp.scales + h;
        dst->q.fp.n_scales = 1;
    }
    return kv_rti_float_init(dst);
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
    if (full->kind == RT_FLOAT) return float_head_init(dst, full, h);
    if (full->kind != RT_HIGGS) return KV_OK;
    if (full->head_dim % full->q.higgs.group)
        return KV_ERR(KV_EUNSUPPORTED, "plan layer %d %s: HIGGS groups of %d channels span KV heads (head_dim %d), so a "
                      "head's kept tokens cannot be coded on their own (token pruning keeps tokens per head)",
                      full->layer, stream_name(full->stream), full->q.higgs.group, full->head_dim);
    dst->higgs_direct = 1;
    dst->q.higgs.channel0 = (uint64_t)h * (uint64_t)full->head_dim;
    dst->signs = malloc((size_t)full->head_dim * sizeof *dst->signs);
    if (!dst->signs) return KV_ERR(KV_ENOMEM, "out of memory");
    memcpy(dst->signs, full->signs + (size_t)h * (size_t)full->head_dim, (size_t)full->head_dim * sizeof *dst->signs);
    return KV_OK;
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

void kv_rti_codec_layout(const rt_codec *c, int m, rt_layout *out) {
    memset(out, 0, sizeof *out);
    const size_t n = (size_t)m * (size_t)c->kv_dim;
    if (c->kind == RT_F16 || c->kind == RT_F32) {
        out->code_bytes = n * (c->kind == RT_F16 ? 2u : 4u);
        out->total = out->code_bytes;
        return;
    }
    kv_block_storage st;
    /* the descriptor was checked at init: the storage of a valid shape cannot fail */
    if (kv_quant_storage(&st, &c->q, (size_t)m, (size_t)c->kv_dim) != KV_OK) return;
    out->code_bytes = (size_t)st.code_bytes;
    out->groups = (size_t)st.groups;
    out->param_bytes = (size_t)(c->kind == RT_HIGGS || c->kind == RT_FLOAT ? st.norm_bytes : st.scale_bytes);
    out->total = (size_t)st.total_bytes;
}

kv_status kv_rti_codec_encode(const rt_codec *c, uint8_t *blk, int m, const float *x) {
    const size_t n = (size_t)m * (size_t)c->kv_dim;
    if (c->kind == RT_F16) {
        kv_rti_f32_to_f16_row((uint16_t *)blk, x, n);
        return KV_OK;
    }
    if (c->kind == RT_F32) {
        memcpy(blk, x, n * sizeof(float));
        return KV_OK;
    }
    if (c->squat) /* a programming error: SQuat needs the sequence's encoders */
        return KV_ERR(KV_EINVAL, "plan layer %d K: SQuat keys are encoded through kv_rti_squat_encode", c->layer);
    rt_layout L;
    kv_rti_codec_layout(c, m, &L);
    uint32_t *codes = (uint32_t *)blk;
    uint8_t *params = blk + L.code_bytes;
    if (c->kind == RT_FLOAT) return kv_fpq_encode_ref(codes, params, &c->q.fp, (size_t)m, (size_t)c->kv_dim, x);
    if (c->kind == RT_UNIFORM) /* shared codes: this layer stores its scales and zero points only */
        return kv_uniform_encode_ref(c->share_from >= 0 ? NULL : codes, params, params + L.param_bytes, &c->q.uniform,
                                     (size_t)m, (size_t)c->kv_dim, x);
    return kv_higgs_encode_ref(codes, params, &c->q.higgs, (size_t)m, (size_t)c->kv_dim, x);
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

/* ---- decode of one head's rows ---------------------------------------------------------------- */
static void decode_uniform(const rt_codec *c, const rt_block *b, int r0, int r1, int h, float *out, size_t ldo) {
    const int m = b->m;
    rt_layout L;
    kv_rti_codec_layout(c, m, &L);
    const uint32_t *codes;
    const uint8_t *params;
    kv_rti_block_parts(c, b, &codes, &params);
    const void *scales = params, *zeros = params + L.param_bytes;
    const kv_uniform *q = &c->q.uniform;
    const size_t C = (size_t)c->kv_dim, G = (size_t)q->group, hd = (size_t)c->head_dim, c0 = (size_t)h * hd;
    const int pt = (int)q->param_type;
    uint8_t cb[RT_TILE > 4096 ? RT_TILE : 4096];
    if (q->axis == KV_AXIS_CHANNELS) {
        const size_t ncg = kv_qm_chan_groups(G, C);
        for (int t = r0; t < r1; t++) {
            kv_unpack_range(cb, codes, (size_t)t * C + c0, hd, c->bits, c->per_word);
            float *o = out + (size_t)(t - r0) * ldo;
            for (size_t k = 0; k < hd; k++) {
                const size_t g = (size_t)t * ncg + (c0 + k) / G;
                o[k] = kv_qm_uniform_dequant(cb[k], kv_qm_param_load(scales, g, pt), kv_qm_param_load(zeros, g, pt));
            }
        }
        return;
    }
    /* groups along tokens: token group k holds channel runs of Gs codes */
    for (int t = r0; t < r1;) {
        const size_t k = (size_t)t / G, gs = kv_qm_tok_group_rows(G, (size_t)m, k);
        const size_t i0 = (size_t)t - k * G, i1 = (size_t)r1 - k * G < gs ? (size_t)r1 - k * G : gs;
        for (size_t ch = 0; ch < hd; ch++) {
            const size_t cc = c0 + ch, g = k * C + cc;
            const float s = kv_qm_param_load(scales, g, pt), z = kv_qm_param_load(zeros, g, pt);
            kv_unpack_range(cb, codes, k * G * C + cc * gs + i0, i1 - i0, c->bits, c->per_word);
            for (size_t i = i0; i < i1; i++) out[(k * G + i - (size_t)r0) * ldo + ch] = kv_qm_uniform_dequant(cb[i - i0], s, z);
        }
        t = (int)(k * G + i1);
    }
}

void kv_rti_codec_decode_head(const rt_codec *c, const rt_block *b, int r0, int r1, int h, float *out, size_t ldo) {
    const size_t hd = (size_t)c->head_dim, C = (size_t)c->kv_dim;
    const uint8_t *blk = b->data;
    switch (c->kind) {
    case RT_F16:
        for (int t = r0; t < r1; t++)
            kv_rti_f16_to_f32_row(out + (size_t)(t - r0) * ldo, (const uint16_t *)blk + (size_t)t * C + (size_t)h * hd, hd);
        return;
    case RT_F32:
        for (int t = r0; t < r1; t++)
            memcpy(out + (size_t)(t - r0) * ldo, (const float *)blk + (size_t)t * C + (size_t)h * hd, hd * sizeof(float));
        return;
    case RT_UNIFORM:
        decode_uniform(c, b, r0, r1, h, out, ldo);
        return;
    case RT_HIGGS:
        kv_rti_higgs_decode_head(c, b, r0, r1, h, out, ldo);
        return;
    case RT_FLOAT:
        kv_rti_float_decode_head(c, b, r0, r1, h, out, ldo);
        return;
    }
}

kv_status kv_rti_codec_decode(const rt_codec *c, const rt_block *b, float *out) {
    const int m = b->m;
    const uint8_t *blk = b->data;
    const size_t n = (size_t)m * (size_t)c->kv_dim;
    if (c->kind == RT_F16) {
        kv_rti_f16_to_f32_row(out, (const uint16_t *)blk, n);
        return KV_OK;
    }
    if (c->kind == RT_F32) {
        memcpy(out, blk, n * sizeof(float));
        return KV_OK;
    }
    rt_layout L;
    kv_rti_codec_layout(c, m, &L);
    const uint32_t *codes;
    const uint8_t *params;
    kv_rti_block_parts(c, b, &codes, &params);
    if (c->kind == RT_FLOAT) return kv_fpq_decode_ref(out, &c->q.fp, (size_t)m, (size_t)c->kv_dim, codes, params);
    if (c->kind == RT_UNIFORM)
        return kv_uniform_decode_ref(out, &c->q.uniform, (size_t)m, (size_t)c->kv_dim, codes, params,
                                     params + L.param_bytes);
    return kv_higgs_decode_ref(out, &c->q.higgs, (size_t)m, (size_t)c->kv_dim, codes, params);
}

void kv_rti_block_parts(const rt_codec *c, const rt_block *blk, const uint32_t **codes, const uint8_t **params) {
    rt_layout L;
    kv_rti_codec_layout(c, blk->m, &L);
    *codes = blk->codes;
    *params = blk->data + L.code_bytes;
}
