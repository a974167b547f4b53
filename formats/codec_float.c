/* codec_float.c — the plan format's rows of the engines' float formats (methods fp8_e4m3, fp8_e5m2, nvfp4; plan 1.1,
 * PLAN_FORMAT.md §6.4 and §6.9, kernels/FLOAT_KV.md): elements under f32 tensor scales per tensor or per KV head,
 * which the stream owns (section FSCL), and NVFP4's E4M3 block scale per 16 channels. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "plan_internal.h"

/* The record's shape of a float format: element bits, group (NVFP4 blocks), axis. */
typedef struct float_shape {
    int bits, group;
    kv_plan_group_axis axis;
} float_shape;

static float_shape shape_of(int method) {
    return method == KV_PLAN_NVFP4 ? (float_shape){4, 16, KV_PLAN_GROUP_CHANNELS}
                                   : (float_shape){8, 0, KV_PLAN_GROUP_TOKENS};
}

static kv_status float_validate(const kv_plan *p, int l, int stream, const kv_plan_stream *s) {
    const float_shape sh = shape_of((int)s->method);
    const char *name = kv_plan_method_name((int)s->method);
    if (s->bits != sh.bits || s->group_size != sh.group || s->group_axis != sh.axis || s->scale_dtype != KV_DTYPE_F32 ||
        s->eta != 0.0f || s->pack != KV_PLAN_PACK_WORD)
        return KV_PLAN_SERR("method %s takes bits %d, group_size %d, group_axis %s, scale_dtype f32, eta 0, pack word",
                            name, sh.bits, sh.group, kv_plan_axis_name(sh.axis));
    const int nkv = p->fingerprint.n_kv_heads;
    if (!s->fp_scales || (s->n_fp_scales != 1 && s->n_fp_scales != nkv))
        return KV_PLAN_SERR("method %s needs 1 or n_kv_heads (%d) scales, has %d", name, nkv,
                            s->fp_scales ? s->n_fp_scales : 0);
    for (int i = 0; i < s->n_fp_scales; i++)
        if (!isfinite(s->fp_scales[i]) || !(s->fp_scales[i] > 0.0f))
            return KV_PLAN_SERR("scale %d is %g (must be finite and > 0)", i, (double)s->fp_scales[i]);
    if (sh.group && s->n_fp_scales > 1 && p->fingerprint.head_dim % sh.group != 0)
        return KV_PLAN_SERR("%s per-head scales need head_dim (%d) to be a multiple of %d", name,
                            p->fingerprint.head_dim, sh.group);
    return KV_OK;
}

/* The elements, and NVFP4's E4M3 block scale per 16 values; the tensor scales are per layer, not per value. */
static double float_bits(const kv_plan *p, const kv_plan_stream *s) {
    (void)p;
    const float_shape sh = shape_of((int)s->method);
    return sh.bits + (sh.group ? 8.0 / (double)sh.group : 0.0);
}

static kv_status float_copy_params(kv_plan_stream *dst, const kv_plan_stream *src) {
    dst->fp_scales = NULL;
    dst->n_fp_scales = 0;
    if (!src->fp_scales) return KV_OK;
    dst->fp_scales = malloc((size_t)src->n_fp_scales * sizeof *dst->fp_scales);
    if (!dst->fp_scales) return KV_ERR(KV_ENOMEM, "out of memory copying tensor scales");
    memcpy(dst->fp_scales, src->fp_scales, (size_t)src->n_fp_scales * sizeof *dst->fp_scales);
    dst->n_fp_scales = src->n_fp_scales;
    return KV_OK;
}

static void float_free_params(kv_plan_stream *s) {
    free(s->fp_scales);
    s->fp_scales = NULL;
    s->n_fp_scales = 0;
}

#define KV_PLAN_FLOAT_ROW(row_name)                                                                                  \
    {                                                                                                                \
        .name = row_name, .required_feature = KV_PLAN_FEAT_FLOAT, .is_float = 1, .validate = float_validate,       \
        .bits = float_bits, .copy_params = float_copy_params, .free_params = float_free_params,                     \
    }
const kv_plan_codec kv_plan_codec_fp8_e4m3 = KV_PLAN_FLOAT_ROW("fp8_e4m3");
const kv_plan_codec kv_plan_codec_fp8_e5m2 = KV_PLAN_FLOAT_ROW("fp8_e5m2");
const kv_plan_codec kv_plan_codec_nvfp4 = KV_PLAN_FLOAT_ROW("nvfp4");
