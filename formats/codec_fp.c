/* codec_fp.c — the plan format's row of full-precision streams (method fp, PLAN_FORMAT.md §6.4): f16 or f32 rows,
 * no groups, no parameters. */
#include "plan_internal.h"

static kv_status fp_validate(const kv_plan *p, int l, int stream, const kv_plan_stream *s) {
    (void)p;
    if (s->bits != 16 && s->bits != 32) return KV_PLAN_SERR("method fp needs bits 16 or 32, not %d", s->bits);
    if (s->group_size != 0 || s->group_axis != KV_PLAN_GROUP_TOKENS || s->scale_dtype != KV_DTYPE_F32 ||
        s->pack != KV_PLAN_PACK_WORD || s->eta != 0.0f)
        return KV_PLAN_SERR("method fp takes group_size 0, group_axis tokens, scale_dtype f32, pack word, eta 0");
    return KV_OK;
}

static double fp_bits(const kv_plan *p, const kv_plan_stream *s) {
    (void)p;
    return (double)s->bits;
}

const kv_plan_codec kv_plan_codec_fp = {
    .name = "fp", .validate = fp_validate, .bits = fp_bits,
};
