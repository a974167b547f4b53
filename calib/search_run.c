/* search_run.c — kv_search_run: the search as one call (calib/SEARCH.md), in the phases `kvcal search` names: fit
 * each candidate once (kv_fit_run), honest bytes per (context, stream, candidate) (kv_search_stream_bytes), the
 * points below the cheapest assembly, sensitivities (kv_search_sensitivity, once), the proxy (KVmix importance,
 * Spearman per stream), the selection's measurements (search_select.c), then every point (search_point.c). Several
 * points share the fits and the sensitivities: that is how one run draws a frontier (scripts/pareto.sh). */
#include "kv_bench.h"
#include "search_internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void kv_search_token_need(kv_search_tokens *out, long fit_tokens, long sens_ctx, long sens_samples, long prompts,
                          long select_chunks, long max_ctx, int layer_tables) {
    out->sens_need = (size_t)sens_samples * (size_t)(sens_ctx - 1);
    const size_t prompt_need = prompts > 0 ? (size_t)(2 * prompts) * (size_t)sens_ctx : 0; /* room to sample windows */
    out->extra = out->sens_need > prompt_need ? out->sens_need : prompt_need;
    out->select_need = (size_t)select_chunks * (size_t)(max_ctx - 1); /* after the fits' and the proxy's */
    /* per-layer tables: as many chunks again, after the selection's: the allocation is fitted to its table's text,
     * so the selection must measure the allocated plan on other text (SEARCH.md §5.5) */
    out->table_need = layer_tables ? out->select_need : 0;
    out->corpus_used = (size_t)fit_tokens + out->extra + out->select_need + out->table_need;
}

void kv_search_result_free(kv_search_result *res) {
    if (!res) return;
    for (int p = 0; res->points && p < res->n_points; p++) {
        free(res->points[p].choice);
        for (int j = 0; res->points[p].layers && j < res->n_pruned; j++) free(res->points[p].layers[j].choice);
        free(res->points[p].layers);
    }
    free(res->points);
    free(res->kl);
    free(res->allowed);
    free(res->bytes);
    free(res->values);
    free(res->fit_seconds);
    free(res->rho);
    kv_importance_free(&res->importance);
    free(res->select_single);
    free(res->context_scale);
    free(res->single_bytes);
    free(res->pruned_kl);
    free(res->pruned_bits);
    free(res->layer_kl);
    free(res->layer_bits);
    free(res->layer_dkl);
    free(res->layer_dbits);
    free(res->cache_seconds);
    free(res->f16_seconds);
    memset(res, 0, sizeof *res);
}

/* The result's tables and the points. */
static kv_status alloc_tables(search_run *r) {
    const kv_search_request *q = r->req;
    kv_search_result *res = r->res;
    const size_t n = r->table_len;
    res->bytes = calloc(n * q->n_contexts, sizeof *res->bytes);
    res->values = calloc(n * q->n_contexts, sizeof *res->values);
    res->kl = calloc(n, sizeof *res->kl);
    res->allowed = malloc(n);
    res->fit_seconds = calloc((size_t)r->nc, sizeof *res->fit_seconds);
    res->rho = calloc((size_t)2 * r->nc, sizeof *res->rho);
    res->points = calloc((size_t)q->n_points, sizeof *res->points);
    if (!res->bytes || !res->values || !res->kl || !res->allowed || !res->fit_seconds || !res->rho || !res->points)
        return KV_ERR(KV_ENOMEM, "out of memory");
    res->n_points = q->n_points;
    for (int p = 0; p < q->n_points; p++) {
        kv_search_point *pt = &res->points[p];
        pt->budget_bits = q->points[p].budget_bits;
        pt->ctx_index = q->points[p].ctx_index;
        pt->path = q->points[p].path;
        pt->eval_chunks = q->points[p].eval_chunks;
        if (!(pt->choice = calloc((size_t)r->n_items, sizeof *pt->choice)) ||
            (q->n_layer_opts > 0 && !(pt->layers = calloc((size_t)q->n_pruned, sizeof *pt->layers))))
            return KV_ERR(KV_ENOMEM, "out of memory");
        for (int j = 0; j < q->n_pruned && q->n_layer_opts > 0; j++)
            if (!(pt->layers[j].choice = calloc((size_t)r->L, sizeof *pt->layers[j].choice)))
                return KV_ERR(KV_ENOMEM, "out of memory");
    }
    return KV_OK;
}

/* The candidates, their chain, and every configuration checked against the model before the first fit: a refusal
 * (key groups that do not divide cache.recent, a pruning combination) costs nothing. */
static kv_status check_candidates(search_run *r) {
    const kv_search_request *q = r->req;
    int nk, any_spliced = 0;
    const kv_search_candidate *table = kv_search_candidates(&nk);
    snprintf(r->seq_set, sizeof r->seq_set, "data.seq_len=%ld", q->fit_seq_len);
    snprintf(r->tok_set, sizeof r->tok_set, "data.max_tokens=%ld", q->fit_tokens);
    if (!(r->common = calloc((size_t)q->n_sets + 2, sizeof *r->common))) return KV_ERR(KV_ENOMEM, "out of memory");
    r->common[0] = r->seq_set, r->common[1] = r->tok_set;
    for (int i = 0; i < q->n_sets; i++) r->common[2 + i] = q->sets[i];
    r->n_common = q->n_sets + 2;
    for (int c = 0; c < r->nc; c++) {
        r->cands[c] = &table[q->candidates[c]];
        r->res->any_predicted |= kv_search_candidate_predicted(r->cands[c]);
        any_spliced |= kv_search_candidate_spliced(r->cands[c]);
    }
    kv_search_allowed(r->res->allowed, r->cands, r->nc, r->L);
    if (r->res->any_predicted && any_spliced && !q->predictors_chained) {
        r->res->usage_error = 1;
        return KV_ERR(KV_EINVAL, "--predictor-inputs free with AQUA-KV and SQuat or shared-codes candidates: a "
                      "predictor could read one of their streams, which the mixed refit fits as a placeholder (use "
                      "chained)");
    }
    /* the chain: with AQUA-KV candidates (and unless --predictor-inputs free) a predicted stream is taken only
     * above AQUA-KV inputs; a shared-codes stream only above its codes */
    kv_status s = kv_search_chain_init(&r->chain, r->cands, r->nc, r->L, q->predictors_chained);
    if (s != KV_OK) {
        r->res->usage_error = 1;
        return s;
    }
    if (r->chain.n_classes > 1) r->chain_p = &r->chain;
    /* with AQUA-KV candidates a chosen mix is refitted: refuse what a refit cannot carry before any fit */
    if (r->res->any_predicted && (s = kv_search_refit_check(r->cands, r->nc, r->common, r->n_common)) != KV_OK)
        return s;
    for (int c = 0; c < r->nc && s == KV_OK; c++) {
        kv_fit_config cfg;
        if ((s = kv_search_candidate_config(&cfg, r->cands[c], r->common, r->n_common)) != KV_OK) break;
        s = kv_fit_check(&cfg, r->arch);
        /* a sensitivity chunk no longer than the f16 sinks and window compresses nothing: every KL would be 0 */
        if (s == KV_OK && q->sens_ctx <= (long)cfg.cache.sinks + cfg.cache.recent)
            s = KV_ERR(KV_EINVAL, "--sens-ctx %ld: the cache keeps the first %d (sinks) and last %d (cache.recent) "
                       "tokens in f16, so chunks of %ld tokens compress nothing and measure no sensitivity: use more "
                       "than %d", q->sens_ctx, cfg.cache.sinks, cfg.cache.recent, q->sens_ctx,
                       cfg.cache.sinks + cfg.cache.recent);
        kv_fit_config_free(&cfg);
        if (s != KV_OK) kv_error_wrap(s, "candidate %s: ", r->cands[c]->name);
    }
    for (int j = 0; j < q->n_pruned && s == KV_OK; j++) { /* what the runtime cannot prune: predictors, shared codes */
        kv_fit_config cfg;
        if ((s = kv_search_pruned_config(&cfg, &q->pruned[j], r->common, r->n_common)) != KV_OK) break;
        s = kv_fit_check(&cfg, r->arch);
        kv_fit_config_free(&cfg);
        if (s != KV_OK) kv_error_wrap(s, "--pruned %s: ", q->pruned[j].name);
    }
    return s;
}

/* Phase 1: each candidate fitted once. */
static kv_status fit_candidates(search_run *r) {
    kv_status s = KV_OK;
    for (int c = 0; c < r->nc && s == KV_OK; c++) {
        kv_fit_config cfg;
        if ((s = kv_search_candidate_config(&cfg, r->cands[c], r->common, r->n_common)) != KV_OK) break;
        const double tf = kv_now_seconds();
        kv_log(KV_LOG_INFO, "search: fitting candidate %s (%s)", r->cands[c]->name, r->cands[c]->what);
        s = kv_search_fit_with(&r->plans[c], r, &cfg);
        r->res->fit_seconds[c] = kv_now_seconds() - tf;
        r->res->seconds_fit += r->res->fit_seconds[c];
        kv_fit_config_free(&cfg);
        if (s != KV_OK) kv_error_wrap(s, "candidate %s: ", r->cands[c]->name);
    }
    return s;
}

/* Phase 2: honest bytes per (context, layer, stream, candidate). */
static kv_status measure_bytes(search_run *r) {
    kv_search_result *res = r->res;
    const int n_items = r->n_items, nc = r->nc;
    const size_t n = r->table_len;
    const double tb = kv_now_seconds();
    uint64_t *b1 = malloc((size_t)n_items * sizeof *b1), *v1 = malloc((size_t)n_items * sizeof *v1);
    kv_status s = !b1 || !v1 ? KV_ERR(KV_ENOMEM, "out of memory") : KV_OK;
    for (int k = 0; k < r->req->n_contexts && s == KV_OK; k++)
        for (int c = 0; c < nc && s == KV_OK; c++) {
            if ((s = kv_search_stream_bytes(b1, v1, r->plans[c], r->req->model, (int)r->req->contexts[k])) != KV_OK)
                break;
            for (int i = 0; i < n_items; i++) {
                res->bytes[n * k + (size_t)i * nc + c] = b1[i];
                res->values[n * k + (size_t)i * nc + c] = v1[i];
            }
            /* a candidate holds fewer tokens than it was given only through its windows (the model's, the same
             * in every candidate, or kept whole when a predictor reads them: bytes, not values); token pruning
             * would make its bytes those of a budget, which enters through --pruned */
            if (r->plans[c]->global.prune_method != KV_PLAN_PRUNE_NONE) {
                s = KV_ERR(KV_EINVAL, "candidate %s prunes tokens (token pruning enters through --pruned, not "
                           "--set)", r->cands[c]->name);
                break;
            }
        }
    free(b1);
    free(v1);
    res->seconds_bytes = kv_now_seconds() - tb;
    return s;
}

/* Each point's budget: sum of bytes <= B / 8 * values (every stream holds the same values); a point below the
 * cheapest assembly is refused (one point) or reported without a plan (several), before the sensitivities. */
static kv_status check_budgets(search_run *r) {
    const kv_search_request *q = r->req;
    kv_search_result *res = r->res;
    int n_feasible = 0;
    for (int p = 0; p < res->n_points; p++) {
        kv_search_point *pt = &res->points[p];
        const long context = q->contexts[pt->ctx_index];
        const uint64_t *by = res->bytes + r->table_len * pt->ctx_index, *va = res->values + r->table_len * pt->ctx_index;
        uint64_t total_values = 0, cheapest = 0;
        for (int i = 0; i < r->n_items; i++) total_values += va[(size_t)i * r->nc];
        kv_status s = kv_search_cheapest(&cheapest, NULL, by, res->allowed, r->chain_p, r->n_items, r->nc);
        if (s != KV_OK) return s;
        pt->budget_bytes = (uint64_t)floor(pt->budget_bits * (double)total_values / 8.0);
        pt->cheapest_bits = 8.0 * (double)cheapest / (double)total_values;
        pt->assembly = pt->feasible = cheapest <= pt->budget_bytes;
        n_feasible += pt->feasible;
        if (!pt->feasible && q->n_pruned > 0) {
            kv_log(KV_LOG_INFO, "search: --budget-bits %g at --context %ld is below the cheapest assembly (%.4f bits): "
                   "only a pruned contender can serve it", pt->budget_bits, context, pt->cheapest_bits);
        } else if (!pt->feasible) {
            s = KV_ERR(KV_EINVAL, "--budget-bits %g at --context %ld is below the cheapest assembly of these "
                       "candidates, %.4f honest bits per value (f16 sinks and window included; a longer context "
                       "amortizes them)", pt->budget_bits, context, pt->cheapest_bits);
            if (res->n_points == 1) return s;
            kv_log(KV_LOG_WARN, "search: %s: no plan for this point", kv_error_last());
        }
    }
    if (n_feasible == 0 && q->n_pruned == 0)
        return KV_ERR(KV_EINVAL, "every budget is below the cheapest assembly of these candidates at its context");
    return KV_OK;
}

/* With a speed floor: each point's time budget; a floor that not even a cache costing nothing meets is refused
 * before the sensitivities. */
static kv_status check_time_budgets(search_run *r) {
    if (!(r->req->min_decode_speed > 0)) return KV_OK;
    for (int p = 0; p < r->res->n_points; p++) {
        kv_search_point *pt = &r->res->points[p];
        pt->time_budget = kv_search_time_budget(r, pt->ctx_index);
        if (pt->time_budget <= 0)
            return KV_ERR(KV_EINVAL, "--min-decode-speed %g at --context %ld: the weights alone take %.2f ms of the f16 "
                          "cache's %.2f ms per step on this machine, so no cache decodes that fast (at most %.2fx)",
                          r->req->min_decode_speed, r->req->contexts[pt->ctx_index], r->res->weights_seconds * 1e3,
                          (r->res->weights_seconds + r->res->f16_seconds[pt->ctx_index]) * 1e3,
                          kv_decode_speed_ratio(r->res->weights_seconds, 0, r->res->f16_seconds[pt->ctx_index]));
    }
    return KV_OK;
}

/* Phases 3 and 4: sensitivities on calibration tokens the fits did not see, then the proxy (KVmix gradient
 * importance, Spearman vs measured KL per stream and candidate). */
static kv_status measure_sensitivities(search_run *r) {
    const kv_search_request *q = r->req;
    kv_search_result *res = r->res;
    const int nc = r->nc, L = r->L;
    kv_search_sens_options so = {(int)q->sens_ctx, (int)q->sens_samples, q->bos, "sensitivity", res->allowed};
    kv_status s = kv_search_sensitivity(res->kl, q->model, (const kv_plan *const *)r->plans, nc, r->sens_tok,
                                        r->n_sens_tok, &so, &res->seconds_sens);
    if (s != KV_OK || (s = kv_search_pair_increments(res->kl, r->cands, nc, L)) != KV_OK) return s;
    for (int i = 0; i < 2 * nc; i++) res->rho[i] = NAN;
    if (q->prompts > 0) {
        kv_importance_options io = {(int)q->prompts, (int)q->sens_ctx, 0, q->bos, "importance", NULL};
        if ((s = kv_importance_run(&res->importance, q->model, r->sens_tok, r->n_sens_tok, &io)) != KV_OK) return s;
        res->seconds_proxy = res->importance.seconds;
        double *col = malloc((size_t)L * sizeof *col);
        for (int st = 0; col && st < 2; st++)
            for (int c = 0; c < nc; c++) {
                if (st == KV_PLAN_V && r->cands[c]->keys_only) continue; /* not measured */
                for (int l = 0; l < L; l++) col[l] = res->kl[(size_t)(2 * l + st) * nc + c];
                double rho;
                if (L >= 2 && kv_rank_spearman(&rho, st ? res->importance.v_mean : res->importance.k_mean, col, L) ==
                                  KV_OK)
                    res->rho[st * nc + c] = rho;
            }
        free(col);
    }
    for (size_t i = 0; i < r->table_len; i++) res->n_evals += res->allowed[i];
    return KV_OK;
}

/* The run's layout of the corpus: fits, sensitivities and proxy, selection, per-layer tables (KV_EINVAL when the
 * corpus is shorter than the phases read: kvcal search refuses that before, with its options' names). */
static kv_status cut_tokens(search_run *r) {
    const kv_search_request *q = r->req;
    long max_ctx = 0;
    for (int k = 0; k < q->n_contexts; k++) max_ctx = q->contexts[k] > max_ctx ? q->contexts[k] : max_ctx;
    kv_search_token_need(&r->need, q->fit_tokens, q->sens_ctx, q->sens_samples, q->prompts, q->select_chunks, max_ctx,
                         q->n_layer_opts > 0);
    const size_t fit = (size_t)q->fit_tokens, extra = r->need.extra;
    if (q->fit_tokens < 2 || q->n_ids < fit + r->need.sens_need ||
        (q->select_chunks > 0 && q->n_ids < r->need.corpus_used))
        return KV_ERR(KV_EINVAL, "kv_search_run: %zu corpus tokens, fewer than the phases read (%zu)", q->n_ids,
                      q->select_chunks > 0 ? r->need.corpus_used : fit + r->need.sens_need);
    r->sens_tok = q->ids + fit;
    r->n_sens_tok = q->n_ids - fit < extra ? q->n_ids - fit : extra;
    const int32_t *sel_tok = q->ids + fit + extra; /* the selection's: disjoint from both (select_chunks > 0) */
    const size_t n_sel_tok = q->select_chunks > 0 ? q->n_ids - fit - extra : 0;
    r->sel = (search_tokens){q->model, sel_tok, n_sel_tok, q->bos, q->select_chunks};
    r->tab = (search_tokens){q->model, sel_tok + r->need.select_need, r->need.table_need, q->bos, q->select_chunks};
    r->res->sens_need = r->need.sens_need;
    return KV_OK;
}

kv_status kv_search_run(const kv_search_request *req, kv_search_result *res) {
    memset(res, 0, sizeof *res);
    search_run r;
    memset(&r, 0, sizeof r);
    r.req = req, r.res = res;
    r.arch = kv_model_arch(req->model);
    r.L = r.arch->n_layers, r.n_items = 2 * r.L, r.nc = req->n_candidates;
    r.table_len = (size_t)r.n_items * (size_t)r.nc;
    res->n_layers = r.L, res->n_items = r.n_items, res->n_cands = r.nc, res->n_contexts = req->n_contexts;
    res->n_pruned = req->n_pruned, res->n_layer_opts = req->n_layer_opts;
    int nk;
    kv_search_candidates(&nk);
    if (r.nc < 1 || r.nc > KV_SEARCH_MAX_CANDS || req->n_points < 1 || req->n_contexts < 1)
        return KV_ERR(KV_EINVAL, "kv_search_run: %d candidates (1..%d), %d points, %d contexts", r.nc,
                      KV_SEARCH_MAX_CANDS, req->n_points, req->n_contexts);
    for (int c = 0; c < r.nc; c++)
        if (req->candidates[c] < 0 || req->candidates[c] >= nk)
            return KV_ERR(KV_EINVAL, "kv_search_run: candidate index %d is not in the table (%d)", req->candidates[c], nk);
    for (int p = 0; p < req->n_points; p++)
        if (req->points[p].ctx_index < 0 || req->points[p].ctx_index >= req->n_contexts)
            return KV_ERR(KV_EINVAL, "kv_search_run: point %d names context %d of %d", p, req->points[p].ctx_index,
                          req->n_contexts);
    for (int j = 0; j < req->n_pruned; j++)
        if (req->pruned_pos[j] < 0 || req->pruned_pos[j] >= r.nc)
            return KV_ERR(KV_EINVAL, "kv_search_run: pruned contender %d names candidate %d of %d", j,
                          req->pruned_pos[j], r.nc);
    for (int o = 0; o < req->n_layer_opts; o++)
        if (req->layer_opts[o].cand < 0 || req->layer_opts[o].cand >= r.nc)
            return KV_ERR(KV_EINVAL, "kv_search_run: layer option %d names candidate %d of %d", o,
                          req->layer_opts[o].cand, r.nc);
    kv_status s = cut_tokens(&r);
    if (s != KV_OK) return s;
    if ((s = alloc_tables(&r)) != KV_OK || (s = check_candidates(&r)) != KV_OK) goto done;
    /* ---- 1. fit each candidate once; 2. honest bytes; the budgets ---- */
    if ((s = fit_candidates(&r)) != KV_OK || (s = measure_bytes(&r)) != KV_OK || (s = check_budgets(&r)) != KV_OK)
        goto done;
    /* ---- 2b. with a decoding speed floor: the cost model (SEARCH.md §7) ---- */
    if ((s = kv_search_speed_measure(&r)) != KV_OK || (s = check_time_budgets(&r)) != KV_OK) goto done;
    /* ---- 3. sensitivities, 4. the proxy ---- */
    if ((s = measure_sensitivities(&r)) != KV_OK) goto done;
    /* ---- 4b. the selection's measurements ---- */
    if (req->select_chunks > 0) {
        const double ts = kv_now_seconds();
        s = kv_search_select_measure(&r);
        res->seconds_select = kv_now_seconds() - ts;
        if (s != KV_OK) goto done;
    }
    /* ---- 5. per point: the choice under its budget, the plan assembled, written, validated ---- */
    for (int p = 0; p < res->n_points && s == KV_OK; p++)
        if (res->points[p].assembly || req->n_pruned > 0) s = kv_search_point_run(&r, &res->points[p]);
    if (s != KV_OK) goto done;
    /* every point may have been refused one by one: no plan at all is a failure */
    int n_plans = 0;
    for (int p = 0; p < res->n_points; p++) n_plans += res->points[p].feasible;
    if (n_plans == 0 && req->min_decode_speed > 0)
        s = KV_ERR(KV_EINVAL, "no point got a plan: at every point no assembly of these candidates within its bits (nor "
                   "a pruned contender) meets --min-decode-speed %g on this machine (each point's warning gives the "
                   "time budget and the least time found)", req->min_decode_speed);
    else if (n_plans == 0)
        s = KV_ERR(KV_EINVAL, "no point got a plan: every --budget-bits is below the cheapest assembly of these "
                   "candidates and below every pruned contender's measured bits");
done:
    for (int c = 0; c < KV_SEARCH_MAX_CANDS; c++) kv_plan_free(r.plans[c]);
    free(r.common);
    kv_search_chain_free(&r.chain);
    free(r.kl_scaled);
    free(r.choice2);
    free(r.f16_tps);
    return s;
}
