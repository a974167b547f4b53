/* codec_higgs.c — the plan format's row of HIGGS streams (method higgs, PLAN_FORMAT.md §6.4): randomized Hadamard
 * groups of channels, an f16/f32 norm per group, indices into one of the plan's grids (section GRID). */
#include "plan_internal.h"

static kv_status higgs_validate(const kv_plan *p, int l, int stream, const kv_plan_stream *s) {
    if (s->bits != 0) return KV_PLAN_SERR("method higgs takes bits 0 (the grid sets them), not %d", s->bits);
    if (s->higgs_grid < 0 || s->higgs_grid >= p->n_grids)
        return KV_PLAN_SERR("higgs_grid %d is not one of the %d grids", s->higgs_grid, p->n_grids);
    const int d = p->grids[s->higgs_grid].d;
    if (!kv_plan_is_pow2(s->group_size) || s->group_size < 2 || s->group_size > (1 << 20) || s->group_size % d != 0)
        return KV_PLAN_SERR("higgs group_size %d must be a power of two in [2, 1048576] and a multiple of the grid's "
                            "d %d", s->group_size, d);
    if (s->group_axis != KV_PLAN_GROUP_CHANNELS || s->eta != 0.0f || s->pack != KV_PLAN_PACK_WORD)
        return KV_PLAN_SERR("method higgs takes group_axis channels, eta 0, pack word");
    return KV_OK;
}

/* log2(n) index bits per d values (packed) + a norm per group. */
static double higgs_bits(const kv_plan *p, const kv_plan_stream *s) {
    if (s->higgs_grid < 0 || s->higgs_grid >= p->n_grids || s->group_size < 1) return 0.0;
    const kv_plan_grid *g = &p->grids[s->higgs_grid];
    const double sbits = s->scale_dtype == KV_DTYPE_F16 ? 16.0 : 32.0;
    int b = 0;
    while ((1L << b) < (long)g->n) b++;
    return kv_plan_code_bits_packed(b, KV_PLAN_PACK_WORD) / (double)g->d + sbits / (double)s->group_size;
}

const kv_plan_codec kv_plan_codec_higgs = {
    .name = "higgs", .required_feature = KV_PLAN_FEAT_HIGGS, .uses_grid = 1, .takes_predictor = 1,
    .takes_scale_dtype = 1, .validate = higgs_validate, .bits = higgs_bits,
};
