/* rt_codec_uniform.c — the codec table's row of uniform streams (plan method uniform: KIVI's asymmetric min-max
 * groups with XQuant's eta and shared codes, KVmix's 11-per-word 3-bit packing, SQuat keys), RUNTIME.md §3. The
 * attention kernels are rt_uniform.c's (and rt_avx2.c's). */
#include "kvrt.h"
#include "rt_dev.h"
#include "rt_internal.h"

#include <string.h>

static kv_status uniform_quant(kv_quant *q, const kv_plan *p, int layer, int stream) {
    const kv_plan_stream *s = &p->layers[layer].stream[stream];
    memset(q, 0, sizeof *q);
    q->kind = KV_QUANT_UNIFORM;
    q->uniform.bits = s->bits;
    q->uniform.group = s->group_size;
    q->uniform.axis = s->group_axis == KV_PLAN_GROUP_TOKENS ? KV_AXIS_TOKENS : KV_AXIS_CHANNELS;
    q->uniform.param_type = s->scale_dtype == KV_DTYPE_F32 ? KV_PARAM_F32 : KV_PARAM_F16;
    q->uniform.pack11 = s->pack == KV_PLAN_PACK_3BIT_11;
    q->uniform.eta = s->eta;
    q->shared_codes = s->share_codes_with_layer >= 0;
    const kv_status st = kv_uniform_check(&q->uniform);
    return st == KV_OK ? KV_OK : kv_rti_quant_refusal(st, layer, stream);
}

static kv_status uniform_init(rt_codec *c, const kv_plan *p, int layer, int stream, kv_grid_search *const *search) {
    (void)stream, (void)search;
    c->kind = RT_UNIFORM;
    c->direct = 1;
    c->bits = c->q.uniform.bits;
    c->per_word = kv_qm_per_word(c->bits, c->q.uniform.pack11);
    if (c->q.uniform.axis == KV_AXIS_TOKENS) c->granule = c->q.uniform.group;
    return p->layers[layer].stream[stream].squat ? kv_rti_squat_codec_init(c, p, layer) : KV_OK;
}

static kv_status uniform_encode(const rt_codec *c, uint8_t *blk, int m, const float *x) {
    rt_layout L;
    kv_rti_quant_layout(c, m, &L);
    uint8_t *params = blk + L.code_bytes;
    /* shared codes: this layer stores its scales and zero points only */
    return kv_uniform_encode_ref(c->share_from >= 0 ? NULL : (uint32_t *)blk, params, params + L.param_bytes,
                                 &c->q.uniform, (size_t)m, (size_t)c->kv_dim, x);
}

static kv_status uniform_decode(const rt_codec *c, const rt_block *b, float *out) {
    rt_layout L;
    kv_rti_quant_layout(c, b->m, &L);
    const uint32_t *codes;
    const uint8_t *params;
    kv_rti_block_parts(c, b, &codes, &params);
    return kv_uniform_decode_ref(out, &c->q.uniform, (size_t)b->m, (size_t)c->kv_dim, codes, params,
                                 params + L.param_bytes);
}

static void uniform_decode_head(const rt_codec *c, const rt_block *b, int r0, int r1, int h, float *out, size_t ldo) {
    const int m = b->m;
    rt_layout L;
    kv_rti_quant_layout(c, m, &L);
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

static void uniform_scores(const rt_codec *c, const rt_block *b, int r0, int r1, int h, const float *q,
                           const float *prep, int nq, float *out, size_t ld) {
    (void)prep;
    const uint32_t *codes;
    const uint8_t *params;
    kv_rti_block_parts(c, b, &codes, &params);
    kv_rti_uniform_scores(c, codes, params, b->m, r0, r1, h, q, nq, out, ld);
}

static void uniform_accum(const rt_codec *c, const rt_block *b, int r0, int r1, int h, const float *p, size_t ld,
                          int nq, float *acc) {
    const uint32_t *codes;
    const uint8_t *params;
    kv_rti_block_parts(c, b, &codes, &params);
    kv_rti_uniform_accum(c, codes, params, b->m, r0, r1, h, p, ld, nq, acc);
}

static kv_status uniform_dev_describe(kv_rt *rt, const rt_codec *c, kv_dcodec *d, kv_quant *dq) {
    (void)rt, (void)dq;
    d->axis = (int)c->q.uniform.axis;
    d->group = c->q.uniform.group;
    d->ptype = (int)c->q.uniform.param_type;
    d->word_aligned = c->kv_dim % c->per_word == 0 && c->head_dim % c->per_word == 0;
    return KV_OK;
}

const rt_codec_ops kv_rti_codec_uniform = {
    .name = "uniform", .squat_keys = 1, .bound = 1, .quant = uniform_quant, .init = uniform_init,
    .layout = kv_rti_quant_layout, .encode = uniform_encode, .decode = uniform_decode,
    .decode_head = uniform_decode_head, .scores = uniform_scores, .accum = uniform_accum,
    .dev_describe = uniform_dev_describe,
};
