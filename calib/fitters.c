/* fitters.c — the fit's table of methods: one row per kv_fit_method (fit_internal.h: kv_fitter), which
 * fit.c's layer-sequential loop calls instead of branching on the method (calib/FIT.md "The fitters").
 * A method's configuration traits (what it may be combined with, formats/config.c: kv_fit_method_traits_of)
 * are the other half of its row. Adding a method: its traits row, its row here, the functions they name
 * (one file per family: uniform codes here, HIGGS in fit_higgs.c, float formats in fit_float.c, XQuant's
 * and SQuat's statistics in fit_xquant.c and fit_squat.c). */
#include "fit_internal.h"

#include <stdio.h>
#include <string.h>

/* ---- uniform codes (aqua-uniform, kivi, xquant, squat), or f16 at 16 bits ------------------------------ */
kv_status kv_fit_uniform_setup(const kv_fit_stream_setup *c) {
    kv_plan *p = c->plan;
    const kv_fit_config *cfg = c->cfg;
    const int l = c->layer, st = c->stream, bits = c->bits, head_dim = c->head_dim;
    const kv_fit_stream_config *sc = st == KV_PLAN_K ? &cfg->keys : &cfg->values;
    kv_plan_stream *s = &p->layers[l].stream[st];
    if (bits == KV_FIT_F16_BITS) { /* kept in f16, not quantized (KV_FIT_F16_BITS) */
        kv_plan_stream keep = *s;
        memset(s, 0, sizeof *s);
        s->method = KV_PLAN_FP;
        s->bits = 16;
        s->group_axis = KV_PLAN_GROUP_TOKENS;
        s->scale_dtype = KV_DTYPE_F32;
        s->pack = KV_PLAN_PACK_WORD;
        s->share_codes_with_layer = -1;
        s->higgs_grid = -1;
        s->pre_rope = keep.pre_rope;
        s->rpc_ratio = keep.rpc_ratio;
        return KV_OK;
    }
    if (bits < 1 || bits > 8)
        return KV_ERR(KV_EINVAL, "layer %d %s stream: %d bits for the uniform quantizer (1..8)", l,
                      st == KV_PLAN_K ? "key" : "value", bits);
    s->method = KV_PLAN_UNIFORM;
    s->bits = bits;
    int axis, size;
    kv_fit_config_stream_groups(cfg, l, st, &axis, &size);
    s->group_axis = (kv_plan_group_axis)axis;
    s->group_size = size;
    double eta = sc->eta;
    kv_fit_config_stream_eta(cfg, l, st, &eta); /* layers.N.key_eta / value_eta win */
    s->eta = (float)eta;
    s->pack = bits == 3 && sc->pack3 == 11 ? KV_PLAN_PACK_3BIT_11 : KV_PLAN_PACK_WORD;
    s->higgs_grid = -1;
    kv_status xs = kv_fit_xq_stream(p, cfg, l, st); /* 1-bit layers, eta, shared codes */
    if (xs != KV_OK) return xs;
    if (cfg->squat.enabled && st == KV_PLAN_K) { /* r and lambda: chosen per layer (fit_squat.c) */
        const int g = kv_fit_sq_g(cfg, head_dim), r0 = cfg->squat.r < head_dim ? cfg->squat.r : head_dim;
        kv_status qs = kv_plan_set_squat(p, l, r0, (float)cfg->squat.lambda, g, NULL);
        if (qs != KV_OK) return kv_error_wrap(qs, "squat.g (%s), squat.r (%s): ", kv_fit_config_origin(cfg, "squat.g"),
                                              kv_fit_config_origin(cfg, "squat.r"));
    }
    return KV_OK;
}

/* XQuant's eta (xquant.calibrate_eta) of a uniform stream without a predictor, then SQuat's r and lambda of
 * the keys (squat.enabled); each does nothing where its settings are off. */
static kv_status uniform_calibrate(kv_fit_state *r, int l, int st, const kv_plan_predictor *pred,
                                   kv_fit_layer_report *lr) {
    kv_status s = kv_dist_agree(r->dist, kv_fit_xq_eta_search(r, l, st, lr));
    if (s != KV_OK || st != KV_PLAN_K) return s;
    return kv_fit_sq_choose_layer(r, l, pred, lr);
}

/* ---- presets: what --method sets before the configuration file and --set ---------------------------- */
static const char *const k_kivi[] = {"keys.group_axis=tokens", "keys.group_size=32", "values.group_axis=channels",
                                     "values.group_size=32", "cache.pre_rope=false", NULL};
static const char *const k_aqua_uniform[] = {"keys.group_axis=channels", "keys.group_size=64",
                                             "values.group_axis=channels", "values.group_size=64", NULL};
/* fp8 / nvfp4: keys after RoPE, as serving engines hold them */
static const char *const k_fp[] = {"cache.pre_rope=false", NULL};
/* squat: KIVI's layout (per-channel key groups along tokens, post-RoPE keys) with SQuat keys */
static const char *const k_squat[] = {"keys.group_axis=tokens", "keys.group_size=32", "values.group_axis=channels",
                                      "values.group_size=32", "cache.pre_rope=false", "squat.enabled=true", NULL};

/* ---- the table --------------------------------------------------------------------------------------- */
static const kv_fitter k_fitters[] = {
    /* AQUA-KV: predictors from layer 1 on (fit.c, ridge.c), residuals on a HIGGS grid */
    [KV_FIT_AQUA] = {KV_FIT_AQUA, NULL, kv_fit_higgs_setup, NULL},
    /* AQUA-KV with uniform residuals (SQuat keys allowed) */
    [KV_FIT_AQUA_UNIFORM] = {KV_FIT_AQUA_UNIFORM, k_aqua_uniform, kv_fit_uniform_setup, uniform_calibrate},
    [KV_FIT_HIGGS] = {KV_FIT_HIGGS, NULL, kv_fit_higgs_setup, NULL},
    /* uniform codes in KIVI's layout, f16 at 16 bits */
    [KV_FIT_KIVI] = {KV_FIT_KIVI, k_kivi, kv_fit_uniform_setup, uniform_calibrate},
    /* engines' float formats: plan methods fp8_e4m3 / fp8_e5m2, nvfp4; calibrated tensor scales */
    [KV_FIT_FP8] = {KV_FIT_FP8, k_fp, kv_fit_fp8_setup, kv_fit_float_scales},
    [KV_FIT_NVFP4] = {KV_FIT_NVFP4, k_fp, kv_fit_nvfp4_setup, kv_fit_float_scales},
    /* KIVI's layout, 1-bit layers and shared codes (kv_fit_xq_stream), data-free or calibrated eta */
    [KV_FIT_XQUANT] = {KV_FIT_XQUANT, k_kivi, kv_fit_uniform_setup, uniform_calibrate},
    /* KIVI's layout with SQuat keys, r and lambda per layer */
    [KV_FIT_SQUAT] = {KV_FIT_SQUAT, k_squat, kv_fit_uniform_setup, uniform_calibrate},
};
_Static_assert(sizeof k_fitters / sizeof *k_fitters == KV_FIT_METHOD_COUNT, "one fitter per kv_fit_method");

const kv_fitter *kv_fitter_of(kv_fit_method method) { return &k_fitters[method]; }

kv_status kv_fit_config_method_preset(kv_fit_config *c, kv_fit_method method) {
    if (!kv_fit_method_name((int)method)) return KV_ERR(KV_EINVAL, "unknown fit method %d", (int)method);
    const char *const *set = k_fitters[method].preset;
    c->method = method;
    char where[64];
    snprintf(where, sizeof where, "the %s preset", kv_fit_method_name((int)method));
    for (int i = 0; set && set[i]; i++) {
        kv_status s = kv_fit_config_set_from(c, set[i], where);
        if (s != KV_OK) return s;
    }
    return KV_OK;
}
