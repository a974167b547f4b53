/* search_fit.c — the plans kv_search_run builds and how it measures one: a candidate's fit, a choice's plan
 * (assembled, or refitted when it has AQUA-KV streams, SEARCH.md §1.3), a pruned contender with its per-layer
 * options (§5.4, §5.5), and the selection's measure (kv_eval_plan on calibration chunks). */
#include "search_internal.h"

#include <stdlib.h>
#include <string.h>

kv_status kv_search_fit_with(kv_plan **out, const search_run *r, const kv_fit_config *cfg) {
    const kv_search_request *q = r->req;
    kv_fit_data data;
    memset(&data, 0, sizeof data);
    data.tokens = q->ids;
    data.n_tokens = (size_t)q->fit_tokens;
    data.bos_id = q->fit_bos;
    kv_fit_options fo;
    kv_fit_options_init(&fo);
    fo.corpus_sha256 = q->corpus_sha256;
    fo.grid_cache_dir = q->grid_cache_dir;
    kv_status s = kv_fit_check(cfg, r->arch);
    return s == KV_OK ? kv_fit_run(out, NULL, q->model, q->model_file, &data, cfg, &fo) : s;
}

kv_status kv_search_build_mix(kv_plan **out, int *refit, double *seconds, const search_run *r, const int *choice,
                              double budget, long context) {
    *out = NULL;
    *refit = kv_search_needs_refit(r->cands, choice, 2 * r->L);
    *seconds = 0;
    if (!*refit) return kv_search_assemble(out, (const kv_plan *const *)r->plans, r->nc, choice, r->L);
    const double tr = kv_now_seconds();
    kv_fit_config rcfg;
    kv_log(KV_LOG_INFO, "search: budget %g at context %ld takes AQUA-KV streams: refitting the mix layer-sequentially",
           budget, context);
    kv_status s = kv_search_refit_config(&rcfg, r->cands, r->nc, choice, r->L, r->common, r->n_common);
    if (s == KV_OK) {
        s = kv_search_fit_with(out, r, &rcfg);
        kv_fit_config_free(&rcfg);
    }
    if (s == KV_OK) s = kv_search_splice(*out, (const kv_plan *const *)r->plans, r->cands, r->nc, choice, r->L);
    *seconds = kv_now_seconds() - tr;
    if (s != KV_OK) {
        kv_plan_free(*out);
        *out = NULL;
        kv_error_wrap(s, "the refit for --budget-bits %g at --context %ld: ", budget, context);
    }
    return s;
}

/* A single method is a choice whose own fit is the plan the assembly (or the refit: AQUA-KV everywhere refits to its
 * fit byte for byte, test_refit_equals_aqua) would rebuild. */
int kv_search_single_of(const int *choice, int n_items) {
    for (int i = 1; i < n_items; i++)
        if (choice[i] != choice[0]) return -1;
    return choice[0];
}

kv_status kv_search_select_kl(double *kl, double *bits, const search_tokens *st, const kv_plan *plan, long ctx,
                              const char *label) {
    kv_plan_eval e;
    kv_status s = kv_eval_plan_loaded(&e, st->m, plan, st->tok, st->n_tok, (int)ctx, st->bos, (size_t)st->chunks, 0, 0,
                                      label);
    if (s == KV_OK) *kl = e.cmp.kl_mean;
    if (s == KV_OK && bits) *bits = e.bits_per_value_total;
    return s;
}

/* A candidate's plan carries a contender's pruning only while it is measured or written: what it had before (its
 * fit's: no pruning) is saved and put back. */
static kv_status pruning_save(search_layered *lp) {
    const kv_plan *plan = lp->plan;
    lp->global = plan->global;
    if (!(lp->layer = malloc((size_t)plan->n_layers * sizeof *lp->layer))) return KV_ERR(KV_ENOMEM, "out of memory");
    for (int l = 0; l < plan->n_layers; l++) lp->layer[l] = plan->layers[l].prune_budget;
    return KV_OK;
}

static void pruning_restore(search_layered *lp) {
    kv_plan *plan = lp->plan;
    plan->global = lp->global;
    for (int l = 0; l < plan->n_layers; l++) plan->layers[l].prune_budget = lp->layer[l];
    free(lp->layer);
    lp->layer = NULL;
}

kv_status kv_search_layered_plan(search_layered *out, kv_plan *const *plans, int nc, int base,
                                 const kv_search_pruned *pr, const kv_search_layer_opt *opts, const int *choice,
                                 int *streams) {
    const int L = plans[base]->n_layers;
    int *st = malloc((size_t)2 * L * sizeof *st);
    double *mult = malloc((size_t)L * sizeof *mult);
    int mixed = 0;
    kv_status s = !st || !mult ? KV_ERR(KV_ENOMEM, "out of memory") : KV_OK;
    for (int l = 0; l < L && s == KV_OK; l++) {
        const kv_search_layer_opt *o = choice && choice[l] ? &opts[choice[l] - 1] : NULL;
        st[2 * l] = st[2 * l + 1] = o ? o->cand : base;
        mult[l] = o ? o->mult : 1.0;
        mixed |= o && o->cand != base;
    }
    memset(out, 0, sizeof *out);
    if (s == KV_OK && mixed) {
        s = kv_search_assemble(&out->plan, (const kv_plan *const *)plans, nc, st, L);
        out->owned = 1;
    } else if (s == KV_OK) {
        out->plan = plans[base];
        s = pruning_save(out);
    }
    if (s == KV_OK) kv_search_layer_apply(out->plan, pr, mult);
    if (s == KV_OK && streams) memcpy(streams, st, (size_t)2 * L * sizeof *st);
    if (s != KV_OK) out->plan = NULL;
    free(st);
    free(mult);
    return s;
}

void kv_search_layered_release(search_layered *lp) {
    if (lp->owned) kv_plan_free(lp->plan);
    else if (lp->plan) pruning_restore(lp);
    lp->plan = NULL;
}
