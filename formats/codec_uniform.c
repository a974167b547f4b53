/* codec_uniform.c — the plan format's row of uniform streams (method uniform, PLAN_FORMAT.md §6.4): KIVI's
 * asymmetric min-max groups along tokens or channels, XQuant's eta and shared codes, KVmix's 11-per-word packing of
 * 3-bit codes, SQuat keys (the same storage). */
#include "plan_internal.h"

static kv_status uniform_validate(const kv_plan *p, int l, int stream, const kv_plan_stream *s) {
    (void)p;
    if (s->bits < 1 || s->bits > 8) return KV_PLAN_SERR("method uniform needs bits in [1, 8], not %d", s->bits);
    if (s->group_size < 1 || s->group_size > (1 << 20))
        return KV_PLAN_SERR("group_size %d out of range [1, 1048576]", s->group_size);
    if (s->group_axis != KV_PLAN_GROUP_TOKENS && s->group_axis != KV_PLAN_GROUP_CHANNELS)
        return KV_PLAN_SERR("group_axis %d is not 0 (tokens) or 1 (channels)", (int)s->group_axis);
    if (!(s->eta >= 0.0f && s->eta < 0.5f)) return KV_PLAN_SERR("eta %g out of range [0, 0.5)", (double)s->eta);
    if (s->bits == 1 && s->pack != KV_PLAN_PACK_WORD)
        return KV_PLAN_SERR("1-bit codes are packed 32 per word (pack 0); pack %d is not supported for them",
                            (int)s->pack);
    if (s->pack != KV_PLAN_PACK_WORD && !(s->pack == KV_PLAN_PACK_3BIT_11 && s->bits == 3))
        return KV_PLAN_SERR("pack %d is not valid with %d bits", (int)s->pack, s->bits);
    return KV_OK;
}

/* Codes (none when they are another layer's) + an f16/f32 scale and zero point per group. */
static double uniform_bits(const kv_plan *p, const kv_plan_stream *s) {
    (void)p;
    if (s->bits < 1 || s->bits > 8 || s->group_size < 1) return 0.0;
    const double sbits = s->scale_dtype == KV_DTYPE_F16 ? 16.0 : 32.0;
    const double scales = 2.0 * sbits / (double)s->group_size;
    return (s->share_codes_with_layer >= 0 ? 0.0 : kv_plan_code_bits_packed(s->bits, s->pack)) + scales;
}

const kv_plan_codec kv_plan_codec_uniform = {
    .name = "uniform", .shares_codes = 1, .squat_keys = 1, .takes_predictor = 1, .takes_scale_dtype = 1,
    .validate = uniform_validate, .bits = uniform_bits,
};
