/* search.c — kvcal search, phase 1 (calib/SEARCH.md): the candidate table, plan surgery, honest bytes per
 * stream from the runtime's own accounting, per-stream KL sensitivity with an exact shortcut, and the
 * global choice under a byte budget (exact multiple-choice knapsack). The tool (tools/kvcal_search.c) fits
 * the candidates, calls these, validates the assembled plan end to end and reports. */
#include "kv_calib.h"
#include "kv_bench.h"
#include "kvrt.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- the candidates ------------------------------------------------------------------------------------
 * One row per candidate; a new method (pruning points) is one more row once its stream can be copied
 * (kv_search_copy_stream says what cannot yet). KIVI rows are method xquant without
 * shared codes or 1-bit layers: the KIVI layout with XQuant's eta calibrated per layer and stream. */
static const kv_search_candidate k_cands[] = {
    {"f16", KV_FIT_KIVI, {"keys.bits=16", "values.bits=16", NULL}, "f16, not quantized", 0, NULL},
    {"kivi1", KV_FIT_XQUANT, {"keys.bits=1", "values.bits=1", "xquant.calibrate_eta=true", NULL},
     "KIVI 1-bit, XQuant calibrated eta", 0, NULL},
    {"kivi2", KV_FIT_XQUANT, {"keys.bits=2", "values.bits=2", "xquant.calibrate_eta=true", NULL},
     "KIVI 2-bit, XQuant calibrated eta", 0, NULL},
    {"kivi3", KV_FIT_XQUANT, {"keys.bits=3", "values.bits=3", "xquant.calibrate_eta=true", NULL},
     "KIVI 3-bit, XQuant calibrated eta", 0, NULL},
    /* the default 3-bit layout is KVmix's 11 codes per word (one slot of each word holds 2 bits); 10 per word
     * costs 0.3 bits more per value and, on stories260K, errs 4.5x less (layer 0 K: 0.0049 vs 0.0222) */
    {"kivi3w10", KV_FIT_XQUANT,
     {"keys.bits=3", "values.bits=3", "keys.pack3=10", "values.pack3=10", "xquant.calibrate_eta=true", NULL},
     "KIVI 3-bit, 10 codes per word, XQuant calibrated eta", 0, NULL},
    {"kivi4", KV_FIT_XQUANT, {"keys.bits=4", "values.bits=4", "xquant.calibrate_eta=true", NULL},
     "KIVI 4-bit, XQuant calibrated eta", 0, NULL},
    /* KIVI's larger groups (KIVI's G = 128 for keys: scales and zero points of a key channel per 128 tokens;
     * values per token in groups of 64 channels, one KV head of most models, so a group never spans heads):
     * 0.25 + 0.5 bits of f16 scales and zero points per value instead of 1 + 1 at groups of 32. The cheapest
     * candidates: with them a stream costs 1.375 bits before the f16 sinks and window, so budgets down to
     * 2 bits per value are feasible at 8K (SEARCH.md §1.1). Key groups along tokens must divide cache.recent. */
    {"kivi1g128", KV_FIT_XQUANT,
     {"keys.bits=1", "values.bits=1", "keys.group_size=128", "values.group_size=64", "xquant.calibrate_eta=true",
      NULL},
     "KIVI 1-bit, key groups of 128 tokens, value groups of 64 channels, XQuant calibrated eta", 0, NULL},
    {"kivi2g128", KV_FIT_XQUANT,
     {"keys.bits=2", "values.bits=2", "keys.group_size=128", "values.group_size=64", "xquant.calibrate_eta=true",
      NULL},
     "KIVI 2-bit, key groups of 128 tokens, value groups of 64 channels, XQuant calibrated eta", 0, NULL},
    /* XQuant cross-layer (xquant.txt Algorithm 1): at an odd layer, the codes of the layer below (which must be
     * the codes_of candidate), with this layer's own scales and zero points; only those are stored */
    {"kivi2s", KV_FIT_XQUANT,
     {"keys.bits=2", "values.bits=2", "xquant.calibrate_eta=true", "xquant.km=0", "xquant.vm=0", NULL},
     "XQuant: layer l-1's KIVI-2 codes, own scales (odd layers, above kivi2)", 0, "kivi2"},
    {"kivi4s", KV_FIT_XQUANT,
     {"keys.bits=4", "values.bits=4", "xquant.calibrate_eta=true", "xquant.km=0", "xquant.vm=0", NULL},
     "XQuant: layer l-1's KIVI-4 codes, own scales (odd layers, above kivi4)", 0, "kivi4"},
    {"higgs2", KV_FIT_HIGGS, {"keys.bits=2", "values.bits=2", NULL}, "HIGGS 2 bits per dimension (d 2)", 0, NULL},
    {"higgs3", KV_FIT_HIGGS, {"keys.bits=3", "values.bits=3", NULL}, "HIGGS 3 bits per dimension (d 2)", 0, NULL},
    {"higgs4", KV_FIT_HIGGS, {"keys.bits=4", "values.bits=4", NULL}, "HIGGS 4 bits per dimension (d 2)", 0, NULL},
    /* AQUA-KV: a ridge predictor from the previous layer's reconstructions + HIGGS on the residual (layer 0:
     * HIGGS at aqua.first_layer_bits, no predictor). A mixed plan that takes one is refitted layer-sequentially
     * (kv_search_refit_config), so its predictors read the reconstructions the mix produces. */
    {"aqua2", KV_FIT_AQUA, {"keys.bits=2", "values.bits=2", NULL}, "AQUA-KV predictors + HIGGS 2 bits", 0, NULL},
    {"aqua3", KV_FIT_AQUA, {"keys.bits=3", "values.bits=3", NULL}, "AQUA-KV predictors + HIGGS 3 bits", 0, NULL},
    {"aqua4", KV_FIT_AQUA, {"keys.bits=4", "values.bits=4", NULL}, "AQUA-KV predictors + HIGGS 4 bits", 0, NULL},
    /* AQUA-KV with uniform residuals (aqua.txt §3.3's "Quant" variant: per-token groups of 64, the aqua-uniform
     * preset); in a refit its streams keep that layout and eta through per-layer overrides */
    {"aquau2", KV_FIT_AQUA_UNIFORM, {"keys.bits=2", "values.bits=2", NULL},
     "AQUA-KV predictors + uniform 2 bits (per-token groups of 64)", 0, NULL},
    {"aquau3", KV_FIT_AQUA_UNIFORM, {"keys.bits=3", "values.bits=3", NULL},
     "AQUA-KV predictors + uniform 3 bits (per-token groups of 64)", 0, NULL},
    {"aquau4", KV_FIT_AQUA_UNIFORM, {"keys.bits=4", "values.bits=4", NULL},
     "AQUA-KV predictors + uniform 4 bits (per-token groups of 64)", 0, NULL},
    /* low-rank predictors (plan format 1.3): the rank is chosen by the same budget, as one more candidate per
     * rank; on SmolLM2 (kv_dim 192) rank 32 stores 1/3 of a K and 1/4 of a V predictor, rank 64 2/3 and 1/2 */
    {"aqua2r32", KV_FIT_AQUA, {"keys.bits=2", "values.bits=2", "aqua.rank=32", NULL},
     "AQUA-KV rank-32 predictors + HIGGS 2 bits", 0, NULL},
    {"aqua2r64", KV_FIT_AQUA, {"keys.bits=2", "values.bits=2", "aqua.rank=64", NULL},
     "AQUA-KV rank-64 predictors + HIGGS 2 bits", 0, NULL},
    {"aqua3r32", KV_FIT_AQUA, {"keys.bits=3", "values.bits=3", "aqua.rank=32", NULL},
     "AQUA-KV rank-32 predictors + HIGGS 3 bits", 0, NULL},
    {"aqua3r64", KV_FIT_AQUA, {"keys.bits=3", "values.bits=3", "aqua.rank=64", NULL},
     "AQUA-KV rank-64 predictors + HIGGS 3 bits", 0, NULL},
    {"aqua4r32", KV_FIT_AQUA, {"keys.bits=4", "values.bits=4", "aqua.rank=32", NULL},
     "AQUA-KV rank-32 predictors + HIGGS 4 bits", 0, NULL},
    {"aqua4r64", KV_FIT_AQUA, {"keys.bits=4", "values.bits=4", "aqua.rank=64", NULL},
     "AQUA-KV rank-64 predictors + HIGGS 4 bits", 0, NULL},
    /* AQUA-KV's GPTQ predictors (aquakv.txt §4.1; plan format 1.4): 4-bit codes of the full weight, f16 scale
     * and offset per aqua.predictor_group (64) input columns: 4.5 bits per weight instead of 16, so on SmolLM2
     * a predicted stream costs ~0.45 bits less at 8K and ~1.6 less at 2K; the refit carries it per stream
     * (layers.N.key_predictor_bits / value_predictor_bits) */
    {"aqua2q", KV_FIT_AQUA, {"keys.bits=2", "values.bits=2", "aqua.predictor_bits=4", NULL},
     "AQUA-KV 4-bit GPTQ predictors + HIGGS 2 bits", 0, NULL},
    {"aqua3q", KV_FIT_AQUA, {"keys.bits=3", "values.bits=3", "aqua.predictor_bits=4", NULL},
     "AQUA-KV 4-bit GPTQ predictors + HIGGS 3 bits", 0, NULL},
    {"aqua4q", KV_FIT_AQUA, {"keys.bits=4", "values.bits=4", "aqua.predictor_bits=4", NULL},
     "AQUA-KV 4-bit GPTQ predictors + HIGGS 4 bits", 0, NULL},
    /* SQuat keys (squat.txt): KIVI keys whose quantization error is kept orthogonal to the subspace of the
     * prompt's queries; r and lambda chosen per layer by the fit. Keys only (its values are plain KIVI). No
     * stored basis: the subspace is each prompt's own (the paper's default), so the plan stores nothing more
     * than KIVI's and the honest bits are KIVI's; a refit carries it by splicing (kv_search_splice). */
    {"squat2", KV_FIT_SQUAT, {"keys.bits=2", "values.bits=2", "squat.static_basis=false", NULL},
     "SQuat keys, 2 bits (KIVI layout, query subspace of the prompt)", 1, NULL},
    {"squat3", KV_FIT_SQUAT, {"keys.bits=3", "values.bits=3", "squat.static_basis=false", NULL},
     "SQuat keys, 3 bits (KIVI layout, query subspace of the prompt)", 1, NULL},
    {"fp8", KV_FIT_FP8, {NULL}, "FP8 E4M3, calibrated tensor scale", 0, NULL},
    {"nvfp4", KV_FIT_NVFP4, {NULL}, "NVFP4, calibrated second-level scale", 0, NULL},
};

const kv_search_candidate *kv_search_candidates(int *n) {
    if (n) *n = (int)(sizeof k_cands / sizeof k_cands[0]);
    return k_cands;
}

kv_status kv_search_candidate_find(int *index, const char *name) {
    int n;
    const kv_search_candidate *c = kv_search_candidates(&n);
    for (int i = 0; name && i < n; i++)
        if (strcmp(c[i].name, name) == 0) {
            *index = i;
            return KV_OK;
        }
    char known[512] = "";
    for (int i = 0; i < n; i++) {
        const size_t len = strlen(known);
        snprintf(known + len, sizeof known - len, "%s%s", i ? ", " : "", c[i].name);
    }
    return KV_ERR(KV_EINVAL, "unknown candidate '%s' (known: %s)", name ? name : "", known);
}

kv_status kv_search_candidate_config(kv_fit_config *cfg, const kv_search_candidate *c, const char *const *common,
                                     int n_common) {
    kv_status s = kv_fit_config_init(cfg);
    if (s != KV_OK) return s;
    char where[96];
    snprintf(where, sizeof where, "search candidate %s", c->name);
    if ((s = kv_fit_config_method_preset(cfg, c->method)) != KV_OK) goto done;
    for (int i = 0; i < KV_SEARCH_MAX_SETS && c->sets[i] && s == KV_OK; i++) s = kv_fit_config_set_from(cfg, c->sets[i], where);
    for (int i = 0; i < n_common && s == KV_OK; i++) s = kv_fit_config_set(cfg, common[i]);
done:
    if (s != KV_OK) {
        kv_error_wrap(s, "candidate %s: ", c->name);
        kv_fit_config_free(cfg);
    }
    return s;
}

/* ---- plan surgery ----------------------------------------------------------------------------------- */
static int same_global(const kv_plan_global *a, const kv_plan_global *b) {
    return a->sinks == b->sinks && a->recent == b->recent && a->prune_method == b->prune_method &&
           a->prune_budget == b->prune_budget && a->prune_window == b->prune_window && a->prune_pool == b->prune_pool &&
           a->rht_seed == b->rht_seed;
}

static const char *sname(int stream) { return stream == KV_PLAN_K ? "K" : "V"; }

/* with_predictor: also copy src's predictor (the one-stream plans of the sensitivity, whose inputs are f16) */
static kv_status copy_stream(kv_plan *dst, const kv_plan *src, int layer, int stream, int with_predictor) {
    /* the policy of plan surgery here; the copy itself (and its shape checks) is the format's kv_plan_stream_copy */
    if (!dst || !src || layer < 0 || layer >= dst->n_layers || layer >= src->n_layers || stream < 0 || stream > 1)
        return KV_ERR(KV_EINVAL, "kv_search_copy_stream: bad arguments (layer %d, stream %d)", layer, stream);
    if (!same_global(&dst->global, &src->global))
        return KV_ERR(KV_EINVAL, "plan surgery: layer %d %s: the plans differ in their global settings (sinks %d/%d, "
                      "recent %d/%d, pruning, RHT seed): streams of one plan share them", layer, sname(stream),
                      dst->global.sinks, src->global.sinks, dst->global.recent, src->global.recent);
    const kv_plan_stream *ss = &src->layers[layer].stream[stream];
    kv_plan_stream *ds = &dst->layers[layer].stream[stream];
    if (ss->predictor && !with_predictor)
        return KV_ERR(KV_EUNSUPPORTED, "plan surgery: layer %d %s: a stream with an AQUA-KV predictor depends on other "
                      "streams' reconstructions and needs a layer-sequential refit", layer, sname(stream));
    if (ss->share_codes_with_layer >= 0) { /* XQuant: the codes of dst's layer below, which must make the same codes */
        const int t = ss->share_codes_with_layer;
        const kv_plan_stream *o = t >= 0 && t < dst->n_layers ? &dst->layers[t].stream[stream] : NULL;
        if (!o || o->method != KV_PLAN_UNIFORM || o->bits != ss->bits || o->group_size != ss->group_size ||
            o->group_axis != ss->group_axis || o->pack != ss->pack || o->share_codes_with_layer >= 0 || o->squat)
            return KV_ERR(KV_EUNSUPPORTED, "plan surgery: layer %d %s reuses the codes of layer %d, which in the "
                          "destination is not a %d-bit uniform stream of the same groups owning its codes", layer,
                          sname(stream), t, ss->bits);
    }
    if (ds->predictor || ds->squat)
        return KV_ERR(KV_EINVAL, "plan surgery: layer %d %s of the destination carries a predictor or SQuat "
                      "parameters", layer, sname(stream));
    /* the stream itself, deeply (its grid, its codec's parameters, SQuat, the predictor when asked): the format's */
    return kv_plan_stream_copy(dst, src, layer, stream, with_predictor ? KV_PLAN_COPY_PREDICTOR : 0u);
}

kv_status kv_search_copy_stream(kv_plan *dst, const kv_plan *src, int layer, int stream) {
    return copy_stream(dst, src, layer, stream, 0);
}

kv_status kv_search_assemble(kv_plan **out, const kv_plan *const *srcs, int n_srcs, const int *choice, int n_layers) {
    if (!out || !srcs || n_srcs < 1 || !choice || !srcs[0] || n_layers != srcs[0]->n_layers)
        return KV_ERR(KV_EINVAL, "kv_search_assemble: bad arguments");
    *out = NULL;
    kv_plan *p = NULL;
    kv_status s = kv_plan_create(&p, &srcs[0]->fingerprint);
    if (s != KV_OK) return s;
    p->global = srcs[0]->global;
    for (int l = 0; l < n_layers && s == KV_OK; l++) {
        p->layers[l].prune_budget = srcs[0]->layers[l].prune_budget;
        p->layers[l].window = srcs[0]->layers[l].window; /* the model's, in every candidate (plan 1.5) */
        for (int st = 0; st < 2 && s == KV_OK; st++) {
            const int c = choice[2 * l + st];
            if (c < 0 || c >= n_srcs || !srcs[c])
                s = KV_ERR(KV_EINVAL, "assemble: layer %d %s: choice %d of %d plans", l, sname(st), c, n_srcs);
            else
                s = kv_search_copy_stream(p, srcs[c], l, st);
        }
    }
    if (s == KV_OK) s = kv_plan_validate(p);
    if (s != KV_OK) {
        kv_plan_free(p);
        return s;
    }
    *out = p;
    return KV_OK;
}

/* ---- honest bytes per stream --------------------------------------------------------------------------- */
kv_status kv_search_stream_bytes(uint64_t *bytes, uint64_t *values, const kv_plan *plan, kv_model *m, int ctx) {
    if (!bytes || !values || !plan || !m || ctx < 1) return KV_ERR(KV_EINVAL, "kv_search_stream_bytes: bad arguments");
    const int L = kv_model_arch(m)->n_layers;
    kv_cache *cache = NULL;
    kv_status s = kv_cache_rt_create(&cache, plan, m, 1, ctx, 0, 0);
    if (s == KV_OK) s = kv_cache_feed_synthetic(cache, plan, ctx, NULL); /* sizes do not depend on the values */
    const kv_rt *rt = s == KV_OK ? kv_cache_rt_runtime(cache) : NULL;
    for (int l = 0; l < L && s == KV_OK; l++)
        for (int st = 0; st < 2 && s == KV_OK; st++) {
            kv_rt_stats o;
            if ((s = kv_rt_get_stream_stats(rt, 0, l, st, &o)) != KV_OK) break;
            bytes[2 * l + st] = o.accounted_bytes + o.predictor_bytes + o.basis_bytes;
            /* per value of the context (every appended token), as kvrun eval's bits_per_value_total: a windowed
             * layer's bytes are those of the tokens it holds, its values those of the whole context, so a budget in
             * bits means the same to the search and to the tables it is compared with (RUNTIME.md §11) */
            values[2 * l + st] = o.values_appended;
        }
    kv_cache_free(cache);
    return s;
}

/* ---- sensitivity ---------------------------------------------------------------------------------- */
typedef struct sens_capture {
    float *H;  /* L x ctx x d: the input of every layer */
    int ctx, d;
} sens_capture;

static kv_status on_layer(void *user, const kv_capture *c) {
    sens_capture *sc = user;
    memcpy(sc->H + (size_t)c->layer * (size_t)sc->ctx * (size_t)sc->d, c->h, (size_t)sc->ctx * (size_t)sc->d * sizeof(float));
    return KV_OK;
}

/* KL(P || Q) of one row from logits (double sums in index order). */
static double row_kl(const float *p, const float *q, int V) {
    float mp = p[0], mq = q[0];
    for (int i = 1; i < V; i++) {
        mp = p[i] > mp ? p[i] : mp;
        mq = q[i] > mq ? q[i] : mq;
    }
    double sp = 0, sq = 0;
    for (int i = 0; i < V; i++) {
        sp += exp((double)(p[i] - mp));
        sq += exp((double)(q[i] - mq));
    }
    const double lp = log(sp), lq = log(sq);
    double kl = 0;
    for (int i = 0; i < V; i++) {
        const double a = (double)(p[i] - mp) - lp, b = (double)(q[i] - mq) - lq;
        kl += exp(a) * (a - b);
    }
    return kl > 0 ? kl : 0.0;
}

#define SENS_ROWS 32

/* The one-stream plan of a sensitivity: f16 everywhere, (l, st) from src. A predicted stream (AQUA-KV) comes
 * with its predictor, and the f16 streams it reads keep src's side of RoPE (a key predictor was fitted on
 * keys before or after RoPE and must be fed the same). *first_layer: the lowest layer it reads (l when
 * none), from where the layers run through the cache together, step by step, as the runtime rebuilds a
 * predicted stream from the reconstructions of the layers just attended (RUNTIME.md §6). A shared-codes
 * stream (XQuant) comes with its partner, src's stream of the layer whose codes it reuses: the KL measured is
 * the pair's (kv_search_pair_increments takes the partner's share out). */
static kv_status one_stream_plan(kv_plan **out, const kv_plan *src, int l, int st, int *first_layer) {
    kv_plan *one = NULL;
    kv_status s = kv_plan_create(&one, &src->fingerprint);
    if (s != KV_OK) return s;
    one->global = src->global;
    for (int i = 0; i < one->n_layers; i++) one->layers[i].window = src->layers[i].window; /* the model's windows */
    *first_layer = l;
    const int partner = src->layers[l].stream[st].share_codes_with_layer; /* XQuant: the codes it reuses */
    if (partner >= 0) {
        s = copy_stream(one, src, partner, st, 0);
        *first_layer = partner;
    }
    const kv_plan_predictor *pr = src->layers[l].stream[st].predictor;
    for (int i = 0; pr && i < pr->n_inputs; i++) {
        const kv_plan_pred_input in = pr->inputs[i];
        if (in.stream == KV_PLAN_K) one->layers[in.layer].stream[KV_PLAN_K].pre_rope = src->layers[in.layer].stream[KV_PLAN_K].pre_rope;
        *first_layer = in.layer < *first_layer ? in.layer : *first_layer;
    }
    if (s == KV_OK) s = copy_stream(one, src, l, st, 1);
    if (s == KV_OK) s = kv_plan_validate(one);
    if (s != KV_OK) {
        kv_plan_free(one);
        return s;
    }
    *out = one;
    return KV_OK;
}

kv_status kv_search_sensitivity(double *kl, kv_model *m, const kv_plan *const *plans, int n_plans,
                                const int32_t *tokens, size_t n_tokens, const kv_search_sens_options *opt,
                                double *seconds) {
    if (!kl || !m || !plans || n_plans < 1 || !tokens || !opt || opt->ctx < 2 || opt->n_samples < 1)
        return KV_ERR(KV_EINVAL, "kv_search_sensitivity: bad arguments");
    const double t_start = kv_now_seconds();
    const kv_arch *a = kv_model_arch(m);
    const int L = a->n_layers, d = a->d_model, V = a->vocab_size, ctx = opt->ctx;
    if (opt->bos_id < 0 || opt->bos_id >= V) return KV_ERR(KV_EINVAL, "sensitivity needs a BOS token (got %d)", opt->bos_id);
    const size_t stride = (size_t)ctx - 1;
    if (n_tokens / stride < (size_t)opt->n_samples)
        return KV_ERR(KV_EINVAL, "sensitivity: %zu tokens give %zu chunks of %zu, %d wanted", n_tokens, n_tokens / stride,
                      stride, opt->n_samples);
    const int rows = ctx - 1; /* scored positions: t predicts in[t+1] */
    kv_status s = KV_OK;
    int32_t *in = malloc((size_t)ctx * sizeof(int32_t));
    int32_t *pos = malloc((size_t)ctx * sizeof(int32_t));
    float *H = kv_aligned_alloc(64, (size_t)L * (size_t)ctx * (size_t)d * sizeof(float));
    float *h_ref = kv_aligned_alloc(64, (size_t)ctx * (size_t)d * sizeof(float));
    float *h = kv_aligned_alloc(64, (size_t)ctx * (size_t)d * sizeof(float));
    float *lg_ref = kv_aligned_alloc(64, (size_t)rows * (size_t)V * sizeof(float));
    float *lg = kv_aligned_alloc(64, (size_t)SENS_ROWS * (size_t)V * sizeof(float));
    double *sum = calloc((size_t)L * 2 * (size_t)n_plans, sizeof(double));
    kv_plan *one = NULL;
    kv_cache *cache = NULL;
    if (!in || !pos || !H || !h_ref || !h || !lg_ref || !lg || !sum) {
        s = KV_ERR(KV_ENOMEM, "out of memory for the sensitivity of %d-token chunks (%.0f MiB of exact logits)", ctx,
                   (double)rows * V * 4 / 1048576.0);
        goto done;
    }
    for (int t = 0; t < ctx; t++) pos[t] = t;
    kv_progress prog;
    size_t n_measured = 0;
    for (size_t i = 0; i < (size_t)L * 2 * (size_t)n_plans; i++) n_measured += !opt->allowed || opt->allowed[i];
    const double total = (double)opt->n_samples * (double)n_measured;
    if (opt->progress_label) kv_progress_begin(&prog, opt->progress_label, "eval", total);
    double done_evals = 0;
    for (int c = 0; c < opt->n_samples && s == KV_OK; c++) {
        in[0] = opt->bos_id;
        memcpy(in + 1, tokens + (size_t)c * stride, stride * sizeof(int32_t));
        sens_capture sc = {H, ctx, d};
        kv_hooks hooks;
        memset(&hooks, 0, sizeof hooks);
        hooks.on_layer = on_layer;
        hooks.user = &sc;
        kv_forward f;
        memset(&f, 0, sizeof f);
        f.tokens = in;
        f.n_seqs = 1;
        f.n_tokens = ctx;
        f.hooks = &hooks;
        f.hidden = h_ref;
        if ((s = kv_model_forward(m, &f)) != KV_OK) break;
        for (int r0 = 0; r0 < rows && s == KV_OK; r0 += SENS_ROWS) {
            const int nr = rows - r0 < SENS_ROWS ? rows - r0 : SENS_ROWS;
            s = kv_model_logits(m, h_ref + (size_t)r0 * d, (size_t)nr, lg_ref + (size_t)r0 * V);
        }
        for (int l = 0; l < L && s == KV_OK; l++)
            for (int st = 0; st < 2 && s == KV_OK; st++)
                for (int p = 0; p < n_plans && s == KV_OK; p++) {
                    if (opt->allowed && !opt->allowed[(size_t)(2 * l + st) * n_plans + p]) continue;
                    int l0;
                    if ((s = one_stream_plan(&one, plans[p], l, st, &l0)) != KV_OK) break;
                    if ((s = kv_cache_rt_create(&cache, one, m, 1, ctx, 0, 0)) != KV_OK) break;
                    memcpy(h, H + (size_t)l0 * ctx * d, (size_t)ctx * d * sizeof(float));
                    const int first = one->global.sinks + one->global.recent, step = one->global.recent;
                    for (int t = 0; t < ctx && s == KV_OK;) {
                        const int n = t == 0 ? first : step, len = n < ctx - t ? n : ctx - t;
                        for (int lay = l0; lay <= l && s == KV_OK; lay++) /* in place: the rows of this step */
                            s = kv_model_layer_forward(m, lay, h + (size_t)t * d, 1, len, pos + t, cache, NULL, NULL);
                        if (s == KV_OK && t == 0) s = kv_cache_end_prompt(cache, 0);
                        t += len;
                    }
                    kv_cache_free(cache);
                    cache = NULL;
                    kv_plan_free(one);
                    one = NULL;
                    for (int l2 = l + 1; l2 < L && s == KV_OK; l2++)
                        s = kv_model_layer_forward(m, l2, h, 1, ctx, pos, NULL, NULL, NULL);
                    double acc = 0;
                    for (int r0 = 0; r0 < rows && s == KV_OK; r0 += SENS_ROWS) {
                        const int nr = rows - r0 < SENS_ROWS ? rows - r0 : SENS_ROWS;
                        if ((s = kv_model_logits(m, h + (size_t)r0 * d, (size_t)nr, lg)) != KV_OK) break;
                        for (int i = 0; i < nr; i++) acc += row_kl(lg_ref + (size_t)(r0 + i) * V, lg + (size_t)i * V, V);
                    }
                    sum[(size_t)(2 * l + st) * n_plans + p] += acc;
                    done_evals += 1;
                    if (opt->progress_label) kv_progress_update(&prog, done_evals);
                }
    }
    if (opt->progress_label) kv_progress_end(&prog);
    if (s == KV_OK)
        for (size_t i = 0; i < (size_t)L * 2 * (size_t)n_plans; i++) {
            if (opt->allowed && !opt->allowed[i]) {
                kl[i] = HUGE_VAL;
                continue;
            }
            kl[i] = sum[i] / ((double)opt->n_samples * rows);
            if (!isfinite(kl[i])) {
                s = KV_ERR(KV_ENUMERIC, "sensitivity of layer %zu %s, candidate %zu is not finite", i / n_plans / 2,
                           sname((int)(i / n_plans % 2)), i % n_plans);
                break;
            }
        }
done:
    kv_cache_free(cache);
    kv_plan_free(one);
    free(in);
    free(pos);
    kv_aligned_free(H);
    kv_aligned_free(h_ref);
    kv_aligned_free(h);
    kv_aligned_free(lg_ref);
    kv_aligned_free(lg);
    free(sum);
    if (seconds) *seconds = kv_now_seconds() - t_start;
    return s;
}

/* ---- the global choice ------------------------------------------------------------------------------
 * A state of the chained DP is (class of item i-1) + C * (class of item i-2), C = n_classes; without a chain
 * C = 1 and only state 0 occurs. Before item 0 both are class 0. */
static int n_cls(const kv_search_chain *chain) { return chain ? chain->n_classes : 1; }
static int chain_ok(const kv_search_chain *chain, int i, int n_choices, int j, int prev_state) {
    if (!chain) return 1;
    const size_t k = (size_t)i * n_choices + j;
    const int C = chain->n_classes;
    return (chain->ok1[k] >> (prev_state % C) & 1) && (chain->ok2[k] >> (prev_state / C) & 1);
}
static int chain_next(const kv_search_chain *chain, int j, int prev_state) {
    return chain ? chain->cls[j] + chain->n_classes * (prev_state % chain->n_classes) : 0;
}
static int is_allowed(const unsigned char *allowed, int i, int n_choices, int j) {
    return !allowed || allowed[(size_t)i * n_choices + j];
}
static kv_status check_chain(const kv_search_chain *chain, int n_choices, const char *fn) {
    if (!chain) return KV_OK;
    if (chain->n_classes < 1 || chain->n_classes > KV_SEARCH_MAX_CLASSES || !chain->cls || !chain->ok1 || !chain->ok2)
        return KV_ERR(KV_EINVAL, "%s: bad chain (%d classes)", fn, chain->n_classes);
    for (int j = 0; j < n_choices; j++)
        if (chain->cls[j] >= chain->n_classes)
            return KV_ERR(KV_EINVAL, "%s: choice %d has class %d of %d", fn, j, chain->cls[j], chain->n_classes);
    return KV_OK;
}

kv_status kv_search_cheapest(uint64_t *sum, int *choice, const uint64_t *cost, const unsigned char *allowed,
                             const kv_search_chain *chain, int n_items, int n_choices) {
    if (!sum || !cost || n_items < 1 || n_choices < 1 || n_choices > 255)
        return KV_ERR(KV_EINVAL, "kv_search_cheapest: bad arguments");
    kv_status s = check_chain(chain, n_choices, "kv_search_cheapest");
    if (s != KV_OK) return s;
    enum { MS = KV_SEARCH_MAX_CLASSES * KV_SEARCH_MAX_CLASSES };
    const int n_states = n_cls(chain) * n_cls(chain);
    uint64_t least[MS], next[MS];
    unsigned char *pick = malloc((size_t)n_items * MS * 2); /* [item][state]: choice, previous state */
    if (!pick) return KV_ERR(KV_ENOMEM, "out of memory");
    for (int st = 0; st < n_states; st++) least[st] = st == 0 ? 0 : UINT64_MAX;
    for (int i = 0; i < n_items; i++) {
        for (int st = 0; st < n_states; st++) next[st] = UINT64_MAX;
        for (int ps = 0; ps < n_states; ps++) {
            if (least[ps] == UINT64_MAX) continue;
            for (int j = 0; j < n_choices; j++) {
                if (!is_allowed(allowed, i, n_choices, j) || !chain_ok(chain, i, n_choices, j, ps)) continue;
                const int ns = chain_next(chain, j, ps);
                const uint64_t c = least[ps] + cost[(size_t)i * n_choices + j];
                if (c < next[ns]) {
                    next[ns] = c;
                    pick[((size_t)i * MS + ns) * 2] = (unsigned char)j;
                    pick[((size_t)i * MS + ns) * 2 + 1] = (unsigned char)ps;
                }
            }
        }
        memcpy(least, next, (size_t)n_states * sizeof least[0]);
    }
    int end = -1;
    for (int st = 0; st < n_states; st++)
        if (least[st] != UINT64_MAX && (end < 0 || least[st] < least[end])) end = st;
    if (end < 0) {
        free(pick);
        return KV_ERR(KV_EINVAL, "no assembly respects the allowed choices and the chain (predictor inputs, shared "
                      "codes)");
    }
    *sum = least[end];
    for (int i = n_items - 1, st = end; i >= 0; i--) {
        if (choice) choice[i] = pick[((size_t)i * MS + st) * 2];
        st = pick[((size_t)i * MS + st) * 2 + 1];
    }
    free(pick);
    return KV_OK;
}

/* (c - base) / unit rounded up (toward +infinity, also when negative): never less than the true extra */
static int64_t extra_units(uint64_t c, uint64_t base, uint64_t unit) {
    return c >= base ? (int64_t)((c - base) / unit + ((c - base) % unit != 0)) : -(int64_t)((base - c) / unit);
}

kv_status kv_search_allocate(int *choice, const uint64_t *cost, const double *value, const unsigned char *allowed,
                             const kv_search_chain *chain, int n_items, int n_choices, uint64_t budget,
                             int max_units, uint64_t *unit_out) {
    if (!choice || !cost || !value || n_items < 1 || n_choices < 1 || n_choices > 255)
        return KV_ERR(KV_EINVAL, "kv_search_allocate: bad arguments");
    kv_status cs = check_chain(chain, n_choices, "kv_search_allocate");
    if (cs != KV_OK) return cs;
    /* the cheapest assembly must fit, else nothing does; its choices are the base each cost is counted above */
    int *cheap = malloc((size_t)n_items * sizeof *cheap);
    uint64_t *base = malloc((size_t)n_items * sizeof *base), *shift = malloc((size_t)n_items * sizeof *shift);
    uint64_t min_sum = 0;
    kv_status s = !cheap || !base || !shift ? KV_ERR(KV_ENOMEM, "out of memory")
                                  : kv_search_cheapest(&min_sum, cheap, cost, allowed, chain, n_items, n_choices);
    if (s == KV_OK && min_sum > budget)
        s = KV_ERR(KV_EINVAL, "the budget of %llu bytes is below the cheapest assembly (%llu bytes)",
                   (unsigned long long)budget, (unsigned long long)min_sum);
    if (s != KV_OK) {
        free(cheap);
        free(base);
        free(shift);
        return s;
    }
    /* The DP runs over what each choice costs above its choice in the cheapest assembly, within what the budget
     * leaves above that assembly: rounding those extras up to units keeps the cheapest assembly feasible however
     * tight the budget (a budget at a single method's own bits is exactly that tight), and the units are finer.
     * Under a chain a choice may cost LESS than the base (the base item pays for its neighbours' constraints):
     * its extra is negative, rounded up too (toward 0), and each item's units are shifted by its most negative
     * extra so the DP's index stays >= 0; the capacity grows by the same shifts. */
    uint64_t margin = 0; /* sum over items of how far the base lies above the item's cheapest allowed choice */
    for (int i = 0; i < n_items; i++) {
        base[i] = cost[(size_t)i * n_choices + cheap[i]];
        uint64_t lo = base[i];
        for (int j = 0; j < n_choices; j++)
            if (is_allowed(allowed, i, n_choices, j) && cost[(size_t)i * n_choices + j] < lo) lo = cost[(size_t)i * n_choices + j];
        margin += base[i] - lo;
    }
    free(cheap);
    const uint64_t mu = max_units > 0 ? (uint64_t)max_units : 20000u, extra = budget - min_sum;
    uint64_t unit = (extra + margin) / mu + ((extra + margin) % mu != 0); /* ceil((extra + margin) / max_units) */
    if (unit < 1) unit = 1;
    if (unit_out) *unit_out = unit;
    const size_t C = (size_t)n_cls(chain), n_states = C * C;
    size_t cap = (size_t)(extra / unit);
    for (int i = 0; i < n_items; i++) {
        int64_t least = 0;
        for (int j = 0; j < n_choices; j++)
            if (is_allowed(allowed, i, n_choices, j)) {
                const int64_t w = extra_units(cost[(size_t)i * n_choices + j], base[i], unit);
                least = w < least ? w : least;
            }
        shift[i] = (uint64_t)-least;
        cap += (size_t)shift[i];
    }
    const size_t row = cap + 1;
    /* best[st][u]: least value of items 0..i ending in state st using at most u units; pick[i][st][u]: the
     * choice made for item i (low byte) and the class of item i-2 (high byte: the previous state is st / C +
     * C * that class, the class of item i-1 being st / C) */
    double *best = malloc(n_states * row * sizeof(double));
    double *next = malloc(n_states * row * sizeof(double));
    uint16_t *pick = malloc((size_t)n_items * n_states * row * sizeof(uint16_t));
    uint64_t *units = malloc((size_t)n_choices * sizeof *units); /* item i's extra units per choice (u-independent) */
    /* for one new state: the (choice, class of item i-2) pairs that lead to it under the chain, in the order the
     * DP tries them (class outer, choice inner); u-independent, so found once per (item, state) */
    int *trans = malloc((size_t)C * (size_t)n_choices * 2 * sizeof *trans);
    if (!best || !next || !pick || !units || !trans) {
        s = KV_ERR(KV_ENOMEM, "out of memory for the allocation (%d items x %zu states x %zu units)", n_items,
                   n_states, row);
        goto done;
    }
    for (size_t st = 0; st < n_states; st++)
        for (size_t u = 0; u <= cap; u++) best[st * row + u] = st == 0 ? 0.0 : INFINITY;
    for (int i = 0; i < n_items; i++) {
        for (int j = 0; j < n_choices; j++) {
            units[j] = is_allowed(allowed, i, n_choices, j)
                           ? (uint64_t)(extra_units(cost[(size_t)i * n_choices + j], base[i], unit) + (int64_t)shift[i])
                           : UINT64_MAX;
        }
        for (size_t ns = 0; ns < n_states; ns++) {
            uint16_t *pk = pick + ((size_t)i * n_states + ns) * row;
            int n_trans = 0;
            for (size_t c2 = 0; c2 < C; c2++) { /* the previous state: item i-1 of class ns / C, i-2 of c2 */
                const int ps = (int)(ns / C + C * c2);
                for (int j = 0; j < n_choices; j++)
                    if (units[j] != UINT64_MAX && (size_t)chain_next(chain, j, ps) == ns &&
                        chain_ok(chain, i, n_choices, j, ps))
                        trans[2 * n_trans] = j, trans[2 * n_trans++ + 1] = (int)c2;
            }
            for (size_t u = 0; u <= cap; u++) {
                double bv = INFINITY;
                int bj = 255, bp = 0;
                uint64_t bc = 0;
                for (int t = 0; t < n_trans; t++) {
                    const int j = trans[2 * t], c2 = trans[2 * t + 1];
                    const size_t k = (size_t)i * n_choices + j;
                    const uint64_t w = units[j];
                    const double *bprev = best + (ns / C + C * (size_t)c2) * row;
                    if (w > u || !isfinite(bprev[u - w])) continue;
                    const double v = bprev[u - w] + value[k];
                    if (v < bv || (v == bv && cost[k] < bc)) bv = v, bj = j, bp = c2, bc = cost[k];
                }
                next[ns * row + u] = bv;
                pk[u] = (uint16_t)(bj | bp << 8);
            }
        }
        double *t = best;
        best = next;
        next = t;
    }
    size_t end = 0;
    for (size_t st = 1; st < n_states; st++)
        if (best[st * row + cap] < best[end * row + cap]) end = st;
    if (!isfinite(best[end * row + cap])) {
        s = KV_ERR(KV_EINVAL, "no assembly fits the budget of %llu bytes once costs are rounded up to units of %llu "
                   "bytes", (unsigned long long)budget, (unsigned long long)unit);
        goto done;
    }
    size_t u = cap, st = end;
    for (int i = n_items - 1; i >= 0; i--) {
        const uint16_t pk = pick[((size_t)i * n_states + st) * row + u];
        const int j = pk & 0xff;
        choice[i] = j;
        u -= (size_t)(extra_units(cost[(size_t)i * n_choices + j], base[i], unit) + (int64_t)shift[i]);
        st = st / C + C * (size_t)(pk >> 8);
    }
done:
    free(base);
    free(shift);
    free(best);
    free(next);
    free(pick);
    free(units);
    free(trans);
    return s;
}

/* ---- the layer-sequential refit of a plan with AQUA-KV streams ----------------------------------------
 * A predictor fitted in a single-method AQUA-KV fit read that fit's reconstructions; in a mixed plan its
 * inputs are whatever the chosen mix reconstructs. So a plan that takes an AQUA-KV stream is fitted again as
 * one kv_fit_run with per-stream overrides (layers.N.key_method / value_method / key_bits / value_bits /
 * key_pre_rope): the fit walks the layers in order and fits each predictor on the reconstructions the mix
 * produced below it, as the runtime will feed them. The base is method xquant with a calibrated eta (the
 * kivi rows); every other stream is overridden to its candidate's method, bits and side of RoPE. A stream
 * without a predictor depends on its own layer's K/V only (SEARCH.md §1.2), so it comes out as in its single fit; the
 * tests check both that and that the refit of an all-AQUA-KV choice is the AQUA-KV fit, byte for byte. */
int kv_search_candidate_predicted(const kv_search_candidate *c) {
    return c->method == KV_FIT_AQUA || c->method == KV_FIT_AQUA_UNIFORM;
}

/* The index of candidate c's codes_of among cands: -1 when it has none or it is not listed. */
static int codes_source(const kv_search_candidate *const *cands, int n_cands, int c) {
    for (int k = 0; cands[c]->codes_of && k < n_cands; k++)
        if (strcmp(cands[k]->name, cands[c]->codes_of) == 0) return k;
    return -1;
}

/* Classes: 0 none; then, when used, AQUA-KV (a valid predictor input), spliced (a placeholder in the refit: no
 * predictor may read it), and one class per codes_of candidate (the codes a shared stream reuses). */
kv_status kv_search_chain_init(kv_search_chain *out, const kv_search_candidate *const *cands, int n_cands, int n_layers,
                               int predictors_chained) {
    memset(out, 0, sizeof *out);
    if (!cands || n_cands < 1 || n_cands > 255 || n_layers < 1) return KV_ERR(KV_EINVAL, "kv_search_chain_init: bad arguments");
    int any_pred = 0, any_spliced = 0, src_of[256], n_classes = 1;
    for (int c = 0; c < n_cands; c++) {
        any_pred |= kv_search_candidate_predicted(cands[c]);
        any_spliced |= kv_search_candidate_spliced(cands[c]);
    }
    const int aqua = predictors_chained && any_pred ? n_classes++ : -1;
    const int spliced = aqua >= 0 && any_spliced ? n_classes++ : -1;
    unsigned char src_class[256] = {0};
    for (int c = 0; c < n_cands; c++) {
        src_of[c] = codes_source(cands, n_cands, c);
        if (!cands[c]->codes_of) continue;
        if (src_of[c] < 0)
            return KV_ERR(KV_EINVAL, "candidate %s reuses the codes of %s at the layer below: list %s among the "
                          "candidates too", cands[c]->name, cands[c]->codes_of, cands[c]->codes_of);
        if (!src_class[src_of[c]]) {
            if (n_classes >= KV_SEARCH_MAX_CLASSES)
                return KV_ERR(KV_EINVAL, "too many chained candidate classes (at most %d)", KV_SEARCH_MAX_CLASSES);
            src_class[src_of[c]] = (unsigned char)n_classes++;
        }
    }
    out->n_classes = n_classes;
    const size_t nk = (size_t)2 * n_layers * n_cands;
    out->cls = malloc((size_t)n_cands);
    out->ok1 = malloc(nk);
    out->ok2 = malloc(nk);
    if (!out->cls || !out->ok1 || !out->ok2) {
        kv_search_chain_free(out);
        return KV_ERR(KV_ENOMEM, "out of memory");
    }
    /* a choice's class: a source of codes keeps that role even if AQUA-KV (it never is: sources are KIVI) */
    for (int c = 0; c < n_cands; c++)
        out->cls[c] = src_class[c] ? src_class[c]
                      : aqua >= 0 && kv_search_candidate_predicted(cands[c]) ? (unsigned char)aqua
                      : spliced >= 0 && kv_search_candidate_spliced(cands[c]) ? (unsigned char)spliced : 0;
    const unsigned char any = (unsigned char)((1u << n_classes) - 1);
    for (int l = 0; l < n_layers; l++)
        for (int st = 0; st < 2; st++)
            for (int c = 0; c < n_cands; c++) {
                const size_t k = (size_t)(2 * l + st) * n_cands + c;
                unsigned char o1 = any, o2 = any;
                if (l > 0 && aqua >= 0 && kv_search_candidate_predicted(cands[c])) {
                    if (st == KV_PLAN_K) o2 = (unsigned char)(1u << aqua);     /* K(l-1) */
                    else o1 = (unsigned char)(1u << aqua),                        /* K(l) */
                         o2 = spliced >= 0 ? (unsigned char)(any & ~(1u << spliced)) : any; /* V(l-1): not a placeholder */
                }
                if (src_of[c] >= 0) o2 = l > 0 ? (unsigned char)(1u << src_class[src_of[c]]) : 0; /* same stream, l-1 */
                out->ok1[k] = o1, out->ok2[k] = o2;
            }
    return KV_OK;
}

void kv_search_chain_free(kv_search_chain *chain) {
    if (!chain) return;
    free(chain->cls);
    free(chain->ok1);
    free(chain->ok2);
    memset(chain, 0, sizeof *chain);
}

kv_status kv_search_pair_increments(double *kl, const kv_search_candidate *const *cands, int n_cands, int n_layers) {
    for (int c = 0; c < n_cands; c++) {
        if (!cands[c]->codes_of) continue;
        const int src = codes_source(cands, n_cands, c);
        if (src < 0) return KV_ERR(KV_EINVAL, "candidate %s: %s is not a candidate", cands[c]->name, cands[c]->codes_of);
        for (int l = 1; l < n_layers; l++)
            for (int st = 0; st < 2; st++) {
                double *v = &kl[(size_t)(2 * l + st) * n_cands + c];
                if (!isfinite(*v)) continue; /* not offered here */
                const double d = *v - kl[(size_t)(2 * (l - 1) + st) * n_cands + src];
                *v = d > 0 ? d : 0.0;
            }
    }
    return KV_OK;
}

void kv_search_allowed(unsigned char *allowed, const kv_search_candidate *const *cands, int n_cands, int n_layers) {
    for (int l = 0; l < n_layers; l++)
        for (int st = 0; st < 2; st++)
            for (int c = 0; c < n_cands; c++)
                allowed[(size_t)(2 * l + st) * n_cands + c] =
                    !(st == KV_PLAN_V && cands[c]->keys_only) && !(cands[c]->codes_of && l % 2 == 0);
}

int kv_search_candidate_spliced(const kv_search_candidate *c) { return c->method == KV_FIT_SQUAT || c->codes_of; }

kv_status kv_search_context_scale(double *scaled, double *scale, const double *kl, const double *measured,
                                  int n_items, int n_cands) {
    double formed[64]; /* the scales the median is taken over */
    if (!scaled || !scale || !kl || !measured || n_items < 1 || n_cands < 1 ||
        n_cands > (int)(sizeof formed / sizeof formed[0]))
        return KV_ERR(KV_EINVAL, "kv_search_context_scale: bad arguments (%d candidates, at most 64)", n_cands);
    int n_formed = 0;
    for (int c = 0; c < n_cands; c++) {
        double predicted = 0.0;
        int offered = 1;
        for (int i = 0; i < n_items; i++) {
            const double v = kl[(size_t)i * n_cands + c];
            if (isfinite(v)) predicted += v;
            else offered = 0;
        }
        scale[c] = NAN;
        if (offered && isfinite(measured[c]) && measured[c] > 0.0 && predicted > 0.0) {
            scale[c] = measured[c] / predicted;
            formed[n_formed++] = scale[c];
        }
    }
    for (int a = 1; a < n_formed; a++) /* insertion sort: a few dozen candidates at most */
        for (int b = a; b > 0 && formed[b - 1] > formed[b]; b--) {
            const double t = formed[b];
            formed[b] = formed[b - 1], formed[b - 1] = t;
        }
    const double fallback = n_formed == 0       ? 1.0
                            : n_formed % 2 == 1 ? formed[n_formed / 2]
                                                : 0.5 * (formed[n_formed / 2 - 1] + formed[n_formed / 2]);
    for (int c = 0; c < n_cands; c++) {
        if (!isfinite(scale[c])) scale[c] = fallback;
        for (int i = 0; i < n_items; i++) {
            const size_t k = (size_t)i * n_cands + c;
            scaled[k] = isfinite(kl[k]) ? kl[k] * scale[c] : kl[k];
        }
    }
    return KV_OK;
}

int kv_search_needs_refit(const kv_search_candidate *const *cands, const int *choice, int n_items) {
    for (int i = 0; i < n_items; i++)
        if (kv_search_candidate_predicted(cands[choice[i]])) return 1;
    return 0;
}

/* What the per-stream overrides cannot carry must be the same in the candidate and the base; a spliced
 * candidate's own quantizer settings travel with its stream (kv_search_splice), its global ones must agree. */
static kv_status refit_compatible(const kv_fit_config *b, const kv_fit_config *c, const kv_search_candidate *cand) {
    const char *name = cand->name;
    const int uniform = !kv_search_candidate_spliced(cand) &&
                        (c->method == KV_FIT_XQUANT || (c->method == KV_FIT_KIVI && c->keys.bits != KV_FIT_F16_BITS));
    const char *what = NULL;
    if (c->squat.enabled && c->method != KV_FIT_SQUAT) what = "SQuat keys on another method";
    else if (c->cache.sinks != b->cache.sinks || c->cache.recent != b->cache.recent || c->cache.rpc_ratio != b->cache.rpc_ratio)
        what = "cache.sinks / recent / rpc_ratio";
    else if (c->seed != b->seed || c->pruning.method != b->pruning.method || c->pruning.budget != b->pruning.budget)
        what = "seed or pruning";
    else if (c->higgs.d != b->higgs.d || c->higgs.n != b->higgs.n || c->higgs.group_size != b->higgs.group_size ||
             c->higgs.grid_samples != b->higgs.grid_samples || c->higgs.grid_iters != b->higgs.grid_iters)
        what = "higgs.*";
    else if (c->aqua.ridge != b->aqua.ridge || c->aqua.predict_keys != b->aqua.predict_keys ||
             c->aqua.predict_values != b->aqua.predict_values || c->aqua.value_uses_keys != b->aqua.value_uses_keys ||
             c->aqua.predictor_dtype != b->aqua.predictor_dtype || c->aqua.predictor_group != b->aqua.predictor_group)
        what = "aqua.* (ridge, predicted streams, predictor dtype and code group)";
    else if (c->fp.fp8_format != b->fp.fp8_format || c->fp.scale_granularity != b->fp.scale_granularity ||
             c->fp.scale != b->fp.scale)
        what = "fp.*";
    else if (uniform && (c->method != KV_FIT_XQUANT || !c->xquant.calibrate_eta || c->xquant.km >= 0 || c->xquant.vm >= 0 ||
                         c->xquant.kq >= 0 || c->xquant.vq >= 0 || c->xquant.target_bits > 0 ||
                         c->keys.scale_dtype != b->keys.scale_dtype || c->keys.pack3 != b->keys.pack3 ||
                         c->values.scale_dtype != b->values.scale_dtype || c->values.pack3 != b->values.pack3))
        what = "the uniform layout (scale dtype, codes per word) or XQuant settings other than a calibrated eta (its "
               "groups are per-layer keys)";
    else if (c->method == KV_FIT_AQUA_UNIFORM &&
             (c->keys.scale_dtype != b->keys.scale_dtype || c->values.scale_dtype != b->values.scale_dtype ||
              c->keys.pack3 != b->keys.pack3 || c->values.pack3 != b->values.pack3))
        what = "the uniform residual's scale dtype or codes per word (its groups and eta are per-layer keys)";
    if (what)
        return KV_ERR(KV_EUNSUPPORTED, "candidate %s differs from the mixed refit's base in %s, which a per-stream "
                      "override cannot carry: it cannot be combined with AQUA-KV candidates", name, what);
    return KV_OK;
}

static const char *override_method(kv_fit_method m) {
    /* a uniform stream of the xquant base; SQuat keys: their placeholder, spliced after the fit */
    return m == KV_FIT_XQUANT || m == KV_FIT_SQUAT ? "kivi" : kv_fit_method_name((int)m);
}

static const char *const k_refit_where = "kvcal search (mixed refit)";

/* The refit's base: the kivi rows' configuration (method xquant, calibrated eta) with the common keys. */
static kv_status refit_base(kv_fit_config *cfg, const char *const *common, int n_common) {
    kv_status s = kv_fit_config_init(cfg);
    if (s != KV_OK) return s;
    if ((s = kv_fit_config_method_preset(cfg, KV_FIT_XQUANT)) == KV_OK)
        s = kv_fit_config_set_from(cfg, "xquant.calibrate_eta=true", k_refit_where);
    for (int i = 0; i < n_common && s == KV_OK; i++) s = kv_fit_config_set(cfg, common[i]);
    if (s != KV_OK) kv_fit_config_free(cfg);
    return s;
}

kv_status kv_search_refit_check(const kv_search_candidate *const *cands, int n_cands, const char *const *common,
                                int n_common) {
    kv_fit_config base, cc;
    kv_status s = refit_base(&base, common, n_common);
    for (int k = 0; k < n_cands && s == KV_OK; k++) {
        if ((s = kv_search_candidate_config(&cc, cands[k], common, n_common)) != KV_OK) break;
        s = refit_compatible(&base, &cc, cands[k]);
        kv_fit_config_free(&cc);
    }
    kv_fit_config_free(&base); /* zeroed by refit_base when it failed: freeing it again is a no-op */
    return s;
}

kv_status kv_search_refit_config(kv_fit_config *cfg, const kv_search_candidate *const *cands, int n_cands,
                                 const int *choice, int n_layers, const char *const *common, int n_common) {
    if (!cfg || !cands || n_cands < 1 || !choice || n_layers < 1)
        return KV_ERR(KV_EINVAL, "kv_search_refit_config: bad arguments");
    kv_fit_config *cc = calloc((size_t)n_cands, sizeof *cc);
    int *have = calloc((size_t)n_cands, sizeof *have);
    kv_status s = cc && have ? refit_base(cfg, common, n_common) : KV_ERR(KV_ENOMEM, "out of memory");
    if (s != KV_OK) {
        free(cc);
        free(have);
        return s;
    }
    const char *where = k_refit_where;
    for (int l = 0; l < n_layers && s == KV_OK; l++)
        for (int st = 0; st < 2 && s == KV_OK; st++) {
            const int k = choice[2 * l + st];
            if (k < 0 || k >= n_cands) {
                s = KV_ERR(KV_EINVAL, "refit: layer %d %s: choice %d of %d candidates", l, sname(st), k, n_cands);
                break;
            }
            if (!have[k]) {
                if ((s = kv_search_candidate_config(&cc[k], cands[k], common, n_common)) != KV_OK) break;
                have[k] = 1;
                if ((s = refit_compatible(cfg, &cc[k], cands[k])) != KV_OK) break;
            }
            const kv_fit_config *c = &cc[k];
            const char *field = st == KV_PLAN_K ? "key" : "value";
            int bits = st == KV_PLAN_K ? c->keys.bits : c->values.bits;
            if (kv_search_candidate_predicted(cands[k]) && l == 0) bits = c->aqua.first_layer_bits; /* as its single fit */
            char set[96];
            snprintf(set, sizeof set, "layers.%d.%s_method=%s", l, field, override_method(c->method));
            s = kv_fit_config_set_from(cfg, set, where);
            if (s == KV_OK && c->method != KV_FIT_FP8 && c->method != KV_FIT_NVFP4) {
                snprintf(set, sizeof set, "layers.%d.%s_bits=%d", l, field, bits);
                s = kv_fit_config_set_from(cfg, set, where);
            }
            if (s == KV_OK && st == KV_PLAN_K) {
                snprintf(set, sizeof set, "layers.%d.key_pre_rope=%s", l, c->cache.pre_rope ? "true" : "false");
                s = kv_fit_config_set_from(cfg, set, where);
            }
            if (s == KV_OK && kv_search_candidate_predicted(cands[k]) && c->aqua.rank != cfg->aqua.rank) {
                snprintf(set, sizeof set, "layers.%d.%s_rank=%d", l, field, c->aqua.rank);
                s = kv_fit_config_set_from(cfg, set, where);
            }
            if (s == KV_OK && kv_search_candidate_predicted(cands[k]) &&
                c->aqua.predictor_bits != cfg->aqua.predictor_bits) {
                snprintf(set, sizeof set, "layers.%d.%s_predictor_bits=%d", l, field, c->aqua.predictor_bits);
                s = kv_fit_config_set_from(cfg, set, where);
            }
            const kv_fit_stream_config *sc = st == KV_PLAN_K ? &c->keys : &c->values;
            const kv_fit_stream_config *bc = st == KV_PLAN_K ? &cfg->keys : &cfg->values;
            /* a uniform stream's own groups where they are not the base's KIVI ones: aqua-uniform (per-token groups
             * of 64) and the KIVI rows with larger groups (kivi1g128 ...); the eta of a KIVI row is calibrated on
             * its own groups by the refit, as in its single fit */
            const int own_groups = c->method == KV_FIT_AQUA_UNIFORM ||
                                   (c->method == KV_FIT_XQUANT && !kv_search_candidate_spliced(cands[k]) &&
                                    (sc->group_axis != bc->group_axis || sc->group_size != bc->group_size));
            if (s == KV_OK && own_groups) {
                snprintf(set, sizeof set, "layers.%d.%s_group_axis=%s", l, field,
                         sc->group_axis == KV_PLAN_GROUP_TOKENS ? "tokens" : "channels");
                s = kv_fit_config_set_from(cfg, set, where);
                if (s == KV_OK) {
                    snprintf(set, sizeof set, "layers.%d.%s_group_size=%d", l, field, sc->group_size);
                    s = kv_fit_config_set_from(cfg, set, where);
                }
            }
            if (s == KV_OK && c->method == KV_FIT_AQUA_UNIFORM) { /* its own eta (0), not a calibrated one */
                snprintf(set, sizeof set, "layers.%d.%s_eta=%.17g", l, field, sc->eta);
                s = kv_fit_config_set_from(cfg, set, where);
            }
        }
    for (int k = 0; k < n_cands; k++)
        if (have[k]) kv_fit_config_free(&cc[k]);
    free(cc);
    free(have);
    /* a predictor reads K(l-1) (keys) or [V(l-1); K(l)] (values): none of them may be a placeholder */
    for (int l = 1; l < n_layers && s == KV_OK; l++)
        for (int st = 0; st < 2 && s == KV_OK; st++) {
            if (!kv_search_candidate_predicted(cands[choice[2 * l + st]])) continue;
            const int in[2] = {st == KV_PLAN_K ? 2 * (l - 1) : 2 * l, st == KV_PLAN_K ? -1 : 2 * (l - 1) + 1};
            for (int j = 0; j < 2 && s == KV_OK; j++)
                if (in[j] >= 0 && kv_search_candidate_spliced(cands[choice[in[j]]]))
                    s = KV_ERR(KV_EUNSUPPORTED, "layer %d %s is AQUA-KV and its predictor would read layer %d %s, a "
                               "%s stream that the refit fits as a placeholder (use --predictor-inputs chained)", l,
                               sname(st), in[j] / 2, sname(in[j] % 2), cands[choice[in[j]]]->name);
        }
    if (s != KV_OK) {
        kv_fit_config_free(cfg);
        kv_error_wrap(s, "the mixed refit: ");
    }
    return s;
}

kv_status kv_search_splice(kv_plan *plan, const kv_plan *const *srcs, const kv_search_candidate *const *cands,
                           int n_cands, const int *choice, int n_layers) {
    if (!plan || !srcs || !cands || n_cands < 1 || !choice || n_layers != plan->n_layers)
        return KV_ERR(KV_EINVAL, "kv_search_splice: bad arguments");
    kv_status s = KV_OK;
    int spliced = 0;
    for (int i = 0; i < 2 * n_layers && s == KV_OK; i++) {
        const int k = choice[i];
        if (k < 0 || k >= n_cands || !srcs[k]) return KV_ERR(KV_EINVAL, "splice: item %d: choice %d", i, k);
        if (!kv_search_candidate_spliced(cands[k])) continue;
        spliced = 1;
        s = kv_search_copy_stream(plan, srcs[k], i / 2, i % 2);
    }
    /* the refit's report measured the placeholders: it no longer describes the plan (an assembled plan has none) */
    if (s == KV_OK && spliced) s = kv_plan_set_report(plan, 0, NULL, NULL);
    if (s == KV_OK) s = kv_plan_validate(plan);
    return s;
}

/* ---- pruned contenders (SEARCH.md §5.4) --------------------------------------------------------------- */
kv_status kv_search_pruned_parse(kv_search_pruned *out, const char *spec) {
    if (!out || !spec) return KV_ERR(KV_EINVAL, "kv_search_pruned_parse: bad arguments");
    memset(out, 0, sizeof *out);
    const char *at = strchr(spec, '@');
    if (!at || at == spec || strlen(spec) >= sizeof out->name)
        return KV_ERR(KV_EINVAL, "pruned contender '%s': expected CANDIDATE@h2oFRACTION, e.g. kivi4@h2o0.125", spec);
    char cname[64];
    snprintf(cname, sizeof cname, "%.*s", (int)(at - spec), spec);
    kv_status s = kv_search_candidate_find(&out->cand, cname);
    if (s != KV_OK) return kv_error_wrap(s, "pruned contender '%s': ", spec);
    const char *pol = at + 1, *h2o = kv_plan_prune_name(KV_PLAN_PRUNE_H2O);
    for (int p = KV_PLAN_PRUNE_STREAMINGLLM; p <= KV_PLAN_PRUNE_PYRAMIDKV; p++) { /* the plan format's policies */
        const char *name = kv_plan_prune_name(p);
        if (p != KV_PLAN_PRUNE_H2O && strncmp(pol, name, strlen(name)) == 0)
            return KV_ERR(KV_EINVAL, "pruned contender '%s': %s selects its tokens once, after a prompt; the "
                          "selection scores teacher-forced chunks stepped by the window, where only %s prunes "
                          "throughout (measure %s with kvrun eval --protocol continuation)", spec, name, h2o, name);
    }
    if (strncmp(pol, h2o, strlen(h2o)) != 0)
        return KV_ERR(KV_EINVAL, "pruned contender '%s': the policy must be %s (e.g. kivi4@%s0.125)", spec, h2o, h2o);
    const char *num = pol + strlen(h2o);
    char *end = NULL;
    const double f = strtod(num, &end);
    if (end == num || *end != '\0' || !(f > 0.0 && f <= 1.0))
        return KV_ERR(KV_EINVAL, "pruned contender '%s': the kept fraction of the f16 cache after h2o must be a "
                      "number in (0, 1]", spec);
    out->method = KV_PLAN_PRUNE_H2O;
    out->budget = f;
    snprintf(out->name, sizeof out->name, "%s", spec);
    return KV_OK;
}

kv_status kv_search_pruned_config(kv_fit_config *cfg, const kv_search_pruned *p, const char *const *common,
                                  int n_common) {
    int nk;
    const kv_search_candidate *table = kv_search_candidates(&nk);
    if (!p || p->cand < 0 || p->cand >= nk) return KV_ERR(KV_EINVAL, "kv_search_pruned_config: bad contender");
    kv_status s = kv_search_candidate_config(cfg, &table[p->cand], common, n_common);
    if (s != KV_OK) return s;
    char where[96], m[64], b[64];
    snprintf(where, sizeof where, "pruned contender %s", p->name);
    snprintf(m, sizeof m, "pruning.method=%s", kv_plan_prune_name(p->method));
    snprintf(b, sizeof b, "pruning.budget=%.17g", p->budget);
    if ((s = kv_fit_config_set_from(cfg, m, where)) == KV_OK) s = kv_fit_config_set_from(cfg, b, where);
    if (s != KV_OK) {
        kv_error_wrap(s, "pruned contender %s: ", p->name);
        kv_fit_config_free(cfg);
    }
    return s;
}

void kv_search_pruned_apply(kv_plan *plan, const kv_search_pruned *p) {
    plan->global.prune_method = p->method;
    plan->global.prune_budget = (float)p->budget; /* as setup_plan stores pruning.budget */
}
