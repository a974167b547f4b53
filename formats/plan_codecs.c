/* plan_codecs.c — the plan format's codec table: one row per method (plan_internal.h, struct kv_plan_codec). The
 * format looks a stream's row up by its method and never branches on the method elsewhere. Adding a method is its
 * enum value in kv_plan.h, its row's file (codec_<name>.c) and one line here; the assertion fails the build when
 * the enum grows without a row. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "plan_internal.h"

static const kv_plan_codec *const k_plan_codecs[] = {
    [KV_PLAN_FP] = &kv_plan_codec_fp,
    [KV_PLAN_UNIFORM] = &kv_plan_codec_uniform,
    [KV_PLAN_HIGGS] = &kv_plan_codec_higgs,
    [KV_PLAN_FP8_E4M3] = &kv_plan_codec_fp8_e4m3,
    [KV_PLAN_FP8_E5M2] = &kv_plan_codec_fp8_e5m2,
    [KV_PLAN_NVFP4] = &kv_plan_codec_nvfp4,
};
_Static_assert(sizeof k_plan_codecs / sizeof *k_plan_codecs == KV_PLAN_METHOD_COUNT,
               "every plan method (kv_plan_method) needs a row in the plan's codec table");

const kv_plan_codec *kv_plan_codec_of(int method) {
    return method >= 0 && method < KV_PLAN_METHOD_COUNT ? k_plan_codecs[method] : NULL;
}

const char *kv_plan_method_name(int method) {
    const kv_plan_codec *c = kv_plan_codec_of(method);
    return c ? c->name : NULL;
}

int kv_plan_method_is_float(int method) {
    const kv_plan_codec *c = kv_plan_codec_of(method);
    return c && c->is_float;
}

int kv_plan_method_from_name(const char *name) {
    for (int m = 0; name && m < KV_PLAN_METHOD_COUNT; m++)
        if (strcmp(k_plan_codecs[m]->name, name) == 0) return m;
    return -1;
}

kv_status kv_plan_stream_err(const char *file, int line, int layer, int stream, const char *fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return kv_error_set_at(KV_EFORMAT, file, line, "layer %d %s: %s", layer, kv_plan_stream_name(stream), msg);
}

double kv_plan_code_bits_packed(int bits, int pack) {
    if (pack == KV_PLAN_PACK_3BIT_11) return 32.0 / 11.0;
    return 32.0 / (double)(32 / bits);
}
