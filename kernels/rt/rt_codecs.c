/* rt_codecs.c — the runtime's codec table: one row per plan method (rt_internal.h, struct rt_codec_ops). The
 * runtime looks a stream's row up by its method and never branches on the method elsewhere. Adding a method is
 * its enum value in kv_plan.h, its row's file (rt_codec_<name>.c) with its kernels, and one line here; the
 * assertion below fails the build when the enum grows without a row. */
#include "kvrt.h"
#include "rt_internal.h"

#include <string.h>

static const rt_codec_ops *const k_codec_table[] = {
    [KV_PLAN_FP] = &kv_rti_codec_fp,
    [KV_PLAN_UNIFORM] = &kv_rti_codec_uniform,
    [KV_PLAN_HIGGS] = &kv_rti_codec_higgs,
    [KV_PLAN_FP8_E4M3] = &kv_rti_codec_fp8_e4m3,
    [KV_PLAN_FP8_E5M2] = &kv_rti_codec_fp8_e5m2,
    [KV_PLAN_NVFP4] = &kv_rti_codec_nvfp4,
};
_Static_assert(sizeof k_codec_table / sizeof *k_codec_table == KV_PLAN_METHOD_COUNT,
               "every plan method (kv_plan_method) needs a row in the runtime's codec table");

const rt_codec_ops *kv_rti_codec_ops(int method) {
    return method >= 0 && method < KV_PLAN_METHOD_COUNT ? k_codec_table[method] : NULL;
}

kv_status kv_rti_quant_refusal(kv_status s, int layer, int stream) {
    return kv_error_wrap(s, "layer %d %s stream: this runtime cannot apply the plan's values: ", layer,
                         rt_stream_name(stream));
}

kv_status kv_quant_from_plan(kv_quant *out, const kv_plan *p, int layer, int stream) {
    memset(out, 0, sizeof *out);
    if (layer < 0 || layer >= p->n_layers || (stream != KV_PLAN_K && stream != KV_PLAN_V))
        return KV_ERR(KV_EINVAL, "plan stream (%d, %d) out of range", layer, stream);
    const int method = (int)p->layers[layer].stream[stream].method;
    const rt_codec_ops *ops = kv_rti_codec_ops(method);
    if (!ops) return KV_ERR(KV_EFORMAT, "layer %d %s stream: unknown method %d", layer, rt_stream_name(stream), method);
    return ops->quant(out, p, layer, stream);
}
