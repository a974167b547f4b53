/* kvprof budget's plans (kv_budget_plans_make): every operating point of the grid (profile/'s
 * kv_budget_points) as the plan kvcal fit would write for it (method kivi: nothing to calibrate,
 * kv_fit_plan_uncalibrated), each with a runtime cache, and the prefill cache every prompt goes through once
 * (the base configuration without pruning, keeping the prompts' statistics). In calib/ because the plans are
 * kvcal fit's; every refusal comes here, before anything is measured (kv_budget_measure, profile/). */
#include "kv_calib.h"

#include <stdlib.h>
#include <string.h>

/* The configuration of one point: kivi preset < the file < sets < the point's own assignments (pt NULL: none). */
static kv_status point_config(kv_fit_config *c, const kv_budget_plans_request *rq, const kv_budget_point *pt,
                              int n_layers) {
    kv_status s;
    if ((s = kv_fit_config_init(c)) != KV_OK) return s;
    if ((s = kv_fit_config_method_preset(c, KV_FIT_KIVI)) != KV_OK) return s;
    if (rq->config_path && (s = kv_fit_config_load_file(c, rq->config_path)) != KV_OK) return s;
    for (int i = 0; i < rq->n_sets; i++)
        if ((s = kv_fit_config_set(c, rq->sets[i])) != KV_OK) return s;
    if (pt) {
        char a[2 + 2 * 4096][64];
        const int n = kv_budget_point_assignments(pt, n_layers, a, (int)(sizeof a / sizeof a[0]));
        for (int i = 0; i < n; i++)
            if ((s = kv_fit_config_set_from(c, a[i], "kvprof budget")) != KV_OK) return s;
    }
    return kv_fit_config_validate(c);
}

/* The prefill cache's plan: the base configuration without pruning. */
static kv_status base_plan(kv_plan **out, const kv_budget_plans_request *rq, const kv_plan_fingerprint *fp,
                           const kv_arch *a) {
    kv_fit_config cfg;
    memset(&cfg, 0, sizeof cfg);
    kv_status s;
    if ((s = point_config(&cfg, rq, NULL, a->n_layers)) == KV_OK &&
        (s = kv_fit_config_set_from(&cfg, "pruning.method=none", "kvprof budget")) == KV_OK &&
        (s = kv_fit_config_set_from(&cfg, "pruning.budget=1", "kvprof budget")) == KV_OK)
        s = kv_fit_plan_uncalibrated(out, &cfg, fp, a);
    kv_fit_config_free(&cfg);
    return s;
}

kv_status kv_budget_plans_make(kv_budget_plans *out, kv_model *m, const kv_budget_plans_request *rq) {
    memset(out, 0, sizeof *out);
    const kv_arch *a = kv_model_arch(m);
    const int L = a->n_layers;
    kv_budget_grid g = rq->grid;
    if (g.mix_ranges > L) g.mix_ranges = L;
    if (g.mix_base) { /* mixes only when the base precision is one of the list */
        int in = 0;
        for (int i = 0; i < g.n_bits; i++) in |= g.bits[i] == g.mix_base;
        if (!in) g.mix_base = 0;
    }
    kv_status s;
    if ((s = kv_budget_points(&out->points, &out->n, &g, L)) != KV_OK) return s;
    const int n = out->n;
    kv_model_file *mf = NULL;
    kv_plan_fingerprint fp;
    if ((s = kv_model_file_open(&mf, rq->model_path)) != KV_OK || (s = kv_plan_fingerprint_compute(&fp, mf)) != KV_OK)
        goto done;
    out->plans = calloc((size_t)n, sizeof *out->plans);
    out->caches = calloc((size_t)n, sizeof *out->caches);
    if (!out->plans || !out->caches) {
        s = KV_ERR(KV_ENOMEM, "out of memory for %d operating points", n);
        goto done;
    }
    kv_fit_config cfg;
    memset(&cfg, 0, sizeof cfg);
    for (int i = 0; i < n && s == KV_OK; i++) {
        const kv_budget_point *pt = &out->points[i];
        kv_fit_config_free(&cfg);
        if ((s = point_config(&cfg, rq, pt, L)) != KV_OK || (s = kv_fit_plan_uncalibrated(&out->plans[i], &cfg, &fp, a)) != KV_OK)
            kv_error_wrap(s, "operating point '%s' (budget %g): ", pt->name, pt->budget);
        else
            s = kv_cache_rt_create(&out->caches[i], out->plans[i], m, 1, rq->capacity, 0, 0);
    }
    kv_fit_config_free(&cfg);
    if (s == KV_OK && (s = base_plan(&out->base, rq, &fp, a)) == KV_OK)
        s = kv_cache_rt_create(&out->prefill, out->base, m, 1, rq->capacity, 0, KV_CACHE_RT_PROMPT_STATS);
done:
    kv_model_file_close(mf);
    return s;
}

void kv_budget_plans_free(kv_budget_plans *bp) {
    if (!bp) return;
    for (int i = 0; bp->caches && i < bp->n; i++) kv_cache_free(bp->caches[i]);
    for (int i = 0; bp->plans && i < bp->n; i++) kv_plan_free(bp->plans[i]);
    free(bp->caches);
    free(bp->plans);
    free(bp->points);
    kv_cache_free(bp->prefill);
    kv_plan_free(bp->base);
    memset(bp, 0, sizeof *bp);
}
