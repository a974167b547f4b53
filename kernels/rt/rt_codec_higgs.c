/* rt_codec_higgs.c — the codec table's row of HIGGS streams (plan method higgs: randomized Hadamard transform,
 * per-group norm, nearest point of a Gaussian grid; the AQUA-KV backbone), RUNTIME.md §3. Attention reads the
 * codes (rt_higgs.c) when the groups lie inside a head; otherwise through decoded tiles. */
#include "kvrt.h"
#include "rt_dev.h"
#include "rt_internal.h"

#include <stdlib.h>
#include <string.h>

static kv_status higgs_quant(kv_quant *q, const kv_plan *p, int layer, int stream) {
    const kv_plan_stream *s = &p->layers[layer].stream[stream];
    memset(q, 0, sizeof *q);
    if (s->higgs_grid < 0 || s->higgs_grid >= p->n_grids)
        return KV_ERR(KV_EFORMAT, "layer %d %s stream: HIGGS grid index %d out of range", layer,
                      rt_stream_name(stream), s->higgs_grid);
    const kv_plan_grid *g = &p->grids[s->higgs_grid];
    q->kind = KV_QUANT_HIGGS;
    q->higgs.dim = g->d;
    q->higgs.size = g->n;
    q->higgs.group = s->group_size;
    q->higgs.norm_type = s->scale_dtype == KV_DTYPE_F32 ? KV_PARAM_F32 : KV_PARAM_F16;
    q->higgs.seed = p->global.rht_seed;
    q->higgs.grid = g->points;
    const kv_status st = kv_higgs_check(&q->higgs);
    return st == KV_OK ? KV_OK : kv_rti_quant_refusal(st, layer, stream);
}

static kv_status higgs_init(rt_codec *c, const kv_plan *p, int layer, int stream, kv_grid_search *const *search) {
    c->kind = RT_HIGGS;
    const kv_higgs *h = &c->q.higgs;
    if (c->kv_dim % h->group)
        return KV_ERR(KV_EFORMAT, "plan layer %d %s: HIGGS group %d does not divide the %d channels of a token",
                      layer, rt_stream_name(stream), h->group, c->kv_dim);
    c->bits = kv_higgs_index_bits(h->size);
    c->per_word = kv_qm_per_word(c->bits, 0);
    c->higgs_direct = c->head_dim % h->group == 0;
    c->direct = c->higgs_direct;
    c->signs = malloc((size_t)c->kv_dim * sizeof *c->signs);
    if (!c->signs) return KV_ERR(KV_ENOMEM, "out of memory");
    for (int ch = 0; ch < c->kv_dim; ch++) c->signs[ch] = kv_qm_higgs_sign(h->seed, (size_t)ch);
    const int gi = p->layers[layer].stream[stream].higgs_grid;
    if (search && gi >= 0 && gi < p->n_grids) c->q.higgs.search = search[gi];
    return KV_OK;
}

/* One head's codec: the head's signs (its channels' of the whole-token stream) and the channel offset. */
static kv_status higgs_head_init(rt_codec *dst, const rt_codec *full, int h) {
    if (full->head_dim % full->q.higgs.group)
        return KV_ERR(KV_EUNSUPPORTED, "plan layer %d %s: HIGGS groups of %d channels span KV heads (head_dim %d), so a "
                      "head's kept tokens cannot be coded on their own (token pruning keeps tokens per head)",
                      full->layer, rt_stream_name(full->stream), full->q.higgs.group, full->head_dim);
    dst->higgs_direct = 1;
    dst->direct = 1;
    dst->q.higgs.channel0 = (uint64_t)h * (uint64_t)full->head_dim;
    dst->signs = malloc((size_t)full->head_dim * sizeof *dst->signs);
    if (!dst->signs) return KV_ERR(KV_ENOMEM, "out of memory");
    memcpy(dst->signs, full->signs + (size_t)h * (size_t)full->head_dim, (size_t)full->head_dim * sizeof *dst->signs);
    return KV_OK;
}

static kv_status higgs_encode(const rt_codec *c, uint8_t *blk, int m, const float *x) {
    rt_layout L;
    kv_rti_quant_layout(c, m, &L);
    return kv_higgs_encode_ref((uint32_t *)blk, blk + L.code_bytes, &c->q.higgs, (size_t)m, (size_t)c->kv_dim, x);
}

static kv_status higgs_decode(const rt_codec *c, const rt_block *b, float *out) {
    const uint32_t *codes;
    const uint8_t *params;
    kv_rti_block_parts(c, b, &codes, &params);
    return kv_higgs_decode_ref(out, &c->q.higgs, (size_t)b->m, (size_t)c->kv_dim, codes, params);
}

static void higgs_decode_head(const rt_codec *c, const rt_block *b, int r0, int r1, int h, float *out, size_t ldo) {
    const uint32_t *idx;
    const uint8_t *params;
    kv_rti_block_parts(c, b, &idx, &params);
    const void *norms = params;
    const kv_higgs *q = &c->q.higgs;
    const size_t C = (size_t)c->kv_dim, g = (size_t)q->group, hd = (size_t)c->head_dim, d = (size_t)q->dim;
    const size_t per_group = g / d, c0 = (size_t)h * hd;
    /* the groups that hold the head's channels: [c0 / g, (c0 + hd - 1) / g] */
    const size_t g_lo = c0 / g, g_hi = (c0 + hd - 1) / g;
    float v[KV_HIGGS_MAX_GROUP], y[KV_HIGGS_MAX_GROUP];
    uint8_t ib[KV_HIGGS_MAX_GROUP];
    for (int t = r0; t < r1; t++) {
        for (size_t gi = g_lo; gi <= g_hi; gi++) {
            const size_t grp = (size_t)t * (C / g) + gi;
            const float mul = kv_qm_higgs_dec_mul(kv_qm_param_load(norms, grp, (int)q->norm_type), g);
            kv_unpack_range(ib, idx, grp * per_group, per_group, c->bits, c->per_word);
            for (size_t p = 0; p < per_group; p++)
                for (size_t k = 0; k < d; k++) v[p * d + k] = q->grid[(size_t)ib[p] * d + k] * mul;
            kv_higgs_decode_transform(y, v, g, c->signs + gi * g);
            /* copy the part of the group inside the head */
            const size_t a = gi * g > c0 ? gi * g : c0, e = (gi + 1) * g < c0 + hd ? (gi + 1) * g : c0 + hd;
            memcpy(out + (size_t)(t - r0) * ldo + (a - c0), y + (a - gi * g), (e - a) * sizeof(float));
        }
    }
}

static void higgs_scores(const rt_codec *c, const rt_block *b, int r0, int r1, int h, const float *q, const float *prep,
                         int nq, float *out, size_t ld) {
    (void)q;
    const uint32_t *codes;
    const uint8_t *params;
    kv_rti_block_parts(c, b, &codes, &params);
    kv_rti_higgs_scores(c, codes, params, b->m, r0, r1, h, prep, nq, out, ld);
}

static void higgs_accum(const rt_codec *c, const rt_block *b, int r0, int r1, int h, const float *p, size_t ld, int nq,
                        float *racc) {
    const uint32_t *codes;
    const uint8_t *params;
    kv_rti_block_parts(c, b, &codes, &params);
    kv_rti_higgs_accum(c, codes, params, b->m, r0, r1, h, p, ld, nq, racc);
}

static kv_status higgs_dev_check(const kv_rt *rt, const rt_codec *c) {
    if (!c->higgs_direct || c->q.higgs.group > KV_DA_MAX_HGROUP)
        return KV_ERR(KV_EUNSUPPORTED, "plan layer %d %s: HIGGS groups of %d channels on the device must lie inside "
                      "a head (head_dim %d) and hold at most %d channels", c->layer, rt_stream_name(c->stream),
                      c->q.higgs.group, rt->head_dim, KV_DA_MAX_HGROUP);
    return KV_OK;
}

static kv_status higgs_dev_describe(kv_rt *rt, const rt_codec *c, kv_dcodec *d, kv_quant *dq) {
    const kv_higgs *h = &c->q.higgs;
    void *p = NULL;
    kv_status s;
    d->hdim = h->dim;
    d->hgroup = h->group;
    d->ntype = (int)h->norm_type;
    d->rotated = !c->pre_rope;
    if ((s = kv_rti_dev_table(rt, h->grid, (size_t)h->size * (size_t)h->dim * sizeof(float), &p)) != KV_OK) return s;
    d->grid = (const float *)p;
    dq->higgs.grid = (const float *)p;
    dq->higgs.search = NULL;
    if ((s = kv_rti_dev_table(rt, c->signs, (size_t)c->kv_dim * sizeof(float), &p)) != KV_OK) return s;
    d->signs = (const float *)p;
    return KV_OK;
}

const rt_codec_ops kv_rti_codec_higgs = {
    .name = "higgs", .bound = 2, .quant = higgs_quant, .init = higgs_init, .head_init = higgs_head_init,
    .layout = kv_rti_quant_layout, .encode = higgs_encode, .decode = higgs_decode, .decode_head = higgs_decode_head,
    .prep_floats = kv_rti_higgs_prep_floats, .prepare = kv_rti_higgs_prepare, .scores = higgs_scores,
    .accum = higgs_accum, .finish = kv_rti_higgs_finish, .dev_check = higgs_dev_check,
    .dev_describe = higgs_dev_describe,
};
