/* search_point.c — one (budget, context) point of kv_search_run (its phase 5): the knapsack's choice under the
 * budget (kv_search_allocate), its plan (assembled or refitted), the selection (SEARCH.md §5.3-§5.5: the least KL on
 * calibration text among that plan, the choice on context-corrected sensitivities, the single methods, the pruned
 * contenders and their per-layer options within the budget), the plan written with its provenance, then validated
 * end to end (kv_eval_plan) on the sensitivity tokens and on held-out text. */
#define _POSIX_C_SOURCE 200809L
#include "kv_bench.h"
#include "search_internal.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const k_kept_names[] = {"knapsack", "corrected", "single", "pruned"};

const char *kv_search_kept_name(int kept) {
    return kept >= 0 && kept < 4 ? k_kept_names[kept] : "?";
}

/* The knapsack under the point's byte budget, and with a speed floor under its time budget too (SEARCH.md §7). */
static kv_status allocate(int *choice, uint64_t *unit, const search_run *r, kv_search_point *pt, const double *value,
                          double *lambda) {
    const kv_search_result *res = r->res;
    const int k = pt->ctx_index;
    const uint64_t *by = res->bytes + r->table_len * k;
    if (!(r->req->min_decode_speed > 0))
        return kv_search_allocate(choice, by, value, res->allowed, r->chain_p, r->n_items, r->nc, pt->budget_bytes, 0,
                                  unit);
    if (unit) *unit = 0;
    return kv_search_allocate_timed(choice, by, value, res->cache_seconds + r->table_len * k, pt->time_budget,
                                    res->allowed, r->chain_p, r->n_items, r->nc, pt->budget_bytes, lambda);
}

/* 1 when plans of candidate c on every stream meet the speed floor (always without one). A pruned contender is
 * judged by its candidate's cost at the whole context: it holds fewer tokens, so that is an upper bound. */
static int speed_ok(const search_run *r, const kv_search_point *pt, int c) {
    return !(r->req->min_decode_speed > 0) || kv_search_single_seconds(r, pt->ctx_index, c) <= pt->time_budget;
}

/* One pruned contender (index j) with its per-layer options at the point (§5.5): allocated under the point's budget
 * from its table (the changes measured on the table's text, added to the contender as the selection measured it:
 * the prediction is for the selection's text, where the allocated plan is measured next), measured on the
 * selection's chunks (unless the allocation is the contender itself, measured before), and kept (pt->selected,
 * pt->pruned, pt->layered, *best) when it fits the budget and measures the least KL so far. */
static kv_status try_layered(kv_search_point *pt, double *best, const search_run *r, int j, long context) {
    const kv_search_request *q = r->req;
    const kv_search_result *res = r->res;
    const int k = pt->ctx_index, n_pruned = q->n_pruned;
    const size_t off = ((size_t)k * n_pruned + (size_t)j) * (size_t)r->L * (size_t)q->n_layer_opts;
    const kv_search_layer_table t = {r->L, q->n_layer_opts, res->layer_dkl + off, res->layer_dbits + off,
                                     res->pruned_kl[k * n_pruned + j], res->pruned_bits[k * n_pruned + j]};
    kv_search_layered_try *lt = &pt->layers[j];
    kv_status s = kv_search_layer_allocate(lt->choice, &lt->predicted_kl, &lt->predicted_bits, &t, pt->budget_bits);
    if (s == KV_EINVAL) { /* even the cheapest per-layer options predict more bits than the point's */
        lt->state = KV_SEARCH_LAYERED_NONE;
        return KV_OK;
    }
    if (s != KV_OK) return s;
    int changed = 0;
    for (int l = 0; l < t.n_layers; l++) changed |= lt->choice[l] != 0;
    if (!changed) { /* the contender itself, measured before */
        lt->state = KV_SEARCH_LAYERED_SAME, lt->kl = t.kl, lt->bits = t.bits;
        return KV_OK;
    }
    search_layered lp;
    char label[160];
    snprintf(label, sizeof label, "selection %s per layer, budget %g ctx %ld", q->pruned[j].name, pt->budget_bits,
             context);
    if ((s = kv_search_layered_plan(&lp, r->plans, r->nc, q->pruned_pos[j], &q->pruned[j], q->layer_opts, lt->choice,
                                    NULL)) != KV_OK)
        return s;
    s = kv_search_select_kl(&lt->kl, &lt->bits, &r->sel, lp.plan, context, label);
    kv_search_layered_release(&lp);
    if (s != KV_OK) return s;
    lt->state = KV_SEARCH_LAYERED_MEASURED;
    if (lt->bits <= pt->budget_bits && lt->kl < *best && speed_ok(r, pt, q->pruned_pos[j]))
        *best = lt->kl, pt->selected = KV_SEARCH_KEPT_PRUNED, pt->pruned = j, pt->layered = 1;
    return KV_OK;
}

/* The provenance of a point's plan (config_yaml): its budget and context, the candidate of every stream, and with
 * a selection what it kept (the pruned contender and its per-layer budgets). Truncated at cap. */
static void point_yaml(char *yaml, size_t cap, const kv_search_point *pt, long context, const kv_plan *plan,
                       const search_run *r) {
    const int L = r->L;
    size_t len = (size_t)snprintf(yaml, cap, "# kvcal search: budget %g bits at context %ld\nsearch:\n  budget_bits: %g\n"
                                  "  context: %ld\n  choices:\n", pt->budget_bits, context, pt->budget_bits, context);
    for (int l = 0; l < L && len < cap; l++)
        len += (size_t)snprintf(yaml + len, cap - len, "    - {layer: %d, key: %s, value: %s}\n", l,
                                r->cands[pt->choice[2 * l]]->name, r->cands[pt->choice[2 * l + 1]]->name);
    if (r->req->select_chunks > 0 && len < cap)
        len += (size_t)snprintf(yaml + len, cap - len, "  selected: %s\n", k_kept_names[pt->selected]);
    if (r->req->min_decode_speed > 0 && len < cap) /* the constraint and the machine the plan was chosen for */
        len += (size_t)snprintf(yaml + len, cap - len, "  min_decode_speed: %g\n  predicted_decode_speed: %.3f\n"
                                "  speed_device: \"%s\"\n", r->req->min_decode_speed, pt->predicted_speed,
                                r->res->device);
    if (pt->selected == KV_SEARCH_KEPT_PRUNED && len < cap)
        len += (size_t)snprintf(yaml + len, cap - len, "  pruned: %s\n", r->req->pruned[pt->pruned].name);
    if (pt->selected == KV_SEARCH_KEPT_PRUNED && pt->layered)
        for (int l = 0; l < L && len < cap; l++)
            len += (size_t)snprintf(yaml + len, cap - len, "%s%.7g%s", /* f32's digits */
                                    l ? ", " : "  layer_budgets: [",
                                    plan->layers[l].prune_budget ? (double)plan->layers[l].prune_budget
                                                                 : (double)plan->global.prune_budget,
                                    l == L - 1 ? "]\n" : "");
}

/* The knapsack's plan and the selection among the assemblies and single methods (pt->assembly): *plan (owned when
 * *owned) and *best, the least KL the selection measured. */
static kv_status knapsack_and_select(kv_plan **plan, int *owned, double *best, double *ts, const search_run *r,
                                     kv_search_point *pt, long context) {
    const kv_search_result *res = r->res;
    const int nc = r->nc, n_items = r->n_items, k = pt->ctx_index;
    kv_status s = allocate(pt->choice, &pt->unit, r, pt, res->kl, &pt->lambda);
    if (s == KV_EINVAL && r->req->min_decode_speed > 0) { /* the floor rules out every assembly: maybe a pruned one */
        kv_log(KV_LOG_WARN, "search: budget %g at context %ld: %s", pt->budget_bits, context, kv_error_last());
        pt->assembly = 0;
        return KV_OK;
    }
    if (s != KV_OK) return kv_error_wrap(s, "--budget-bits %g at --context %ld: ", pt->budget_bits, context);
    const int single = kv_search_single_of(pt->choice, n_items);
    if (single >= 0) { /* the single method's own fit: no assembly, no refit */
        kv_log(KV_LOG_INFO, "search: budget %g at context %ld: the choice is %s on every stream, its own fit",
               pt->budget_bits, context, r->cands[single]->name);
        *plan = r->plans[single], *owned = 0, pt->refit = 0, pt->seconds_refit = 0;
    } else if ((s = kv_search_build_mix(plan, &pt->refit, &pt->seconds_refit, r, pt->choice, pt->budget_bits,
                                        context)) != KV_OK) {
        return s;
    }
    pt->selected = KV_SEARCH_KEPT_KNAPSACK;
    *ts = kv_now_seconds();
    if (r->req->select_chunks == 0) return KV_OK;
    /* measure, on calibration tokens at this context, what to keep (SEARCH.md §5.3); a single method was measured
     * in phase 4b on the same chunks: its KL is reused, not measured again */
    int *choice2 = r->choice2;
    if (single >= 0) pt->sel_kl[0] = res->select_single[k * nc + single];
    if ((single < 0 && (s = kv_search_select_kl(&pt->sel_kl[0], NULL, &r->sel, *plan, context, NULL)) != KV_OK) ||
        (s = allocate(choice2, NULL, r, pt, r->kl_scaled + r->table_len * k, NULL)) != KV_OK)
        return s;
    *best = pt->sel_kl[0];
    const int single2 = kv_search_single_of(choice2, n_items);
    if (single2 >= 0 && single2 != single) {
        pt->sel_kl[1] = res->select_single[k * nc + single2]; /* a single method: the loop below may keep it */
    } else if (memcmp(choice2, pt->choice, (size_t)n_items * sizeof *choice2) != 0) {
        kv_plan *plan2 = NULL;
        int refit2;
        double sec2;
        s = kv_search_build_mix(&plan2, &refit2, &sec2, r, choice2, pt->budget_bits, context);
        pt->seconds_refit += sec2;
        if (s == KV_OK) s = kv_search_select_kl(&pt->sel_kl[1], NULL, &r->sel, plan2, context, NULL);
        if (s != KV_OK) {
            kv_plan_free(plan2);
            return s;
        }
        if (pt->sel_kl[1] < *best) {
            if (*owned) kv_plan_free(*plan);
            *plan = plan2, *owned = 1, *best = pt->sel_kl[1], pt->refit = refit2, pt->selected = KV_SEARCH_KEPT_CORRECTED;
            memcpy(pt->choice, choice2, (size_t)n_items * sizeof *choice2);
        } else {
            kv_plan_free(plan2);
        }
    }
    for (int c = 0; c < nc; c++) /* a single method within the budget that measured less */
        if (isfinite(res->select_single[k * nc + c]) && res->single_bytes[k * nc + c] <= pt->budget_bytes &&
            res->select_single[k * nc + c] < *best && speed_ok(r, pt, c))
            *best = res->select_single[k * nc + c], pt->selected = KV_SEARCH_KEPT_SINGLE, pt->single = c;
    return KV_OK;
}

/* The kept plan written with its provenance (its budget, context and choices as YAML). */
static kv_status write_plan(search_run *r, kv_search_point *pt, kv_plan *plan, long context) {
    const kv_search_request *q = r->req;
    kv_plan_provenance pv;
    memset(&pv, 0, sizeof pv);
    char ver[64], sha[65], yaml[8192];
    snprintf(ver, sizeof ver, "kvcal %s", KV_VERSION_STRING);
    snprintf(sha, sizeof sha, "%s", q->corpus_sha256 ? q->corpus_sha256 : "");
    pv.tool_version = ver;
    pv.corpus_sha256 = sha; /* copied by kv_plan_set_provenance */
    point_yaml(yaml, sizeof yaml, pt, context, plan, r);
    pv.config_yaml = yaml;
    kv_status s = kv_plan_creation_time(&pv.created);
    if (s == KV_OK) s = kv_plan_set_provenance(plan, &pv);
    if (s == KV_OK && q->out_dir && kv_mkdir_p(q->out_dir) != 0)
        s = KV_ERR(KV_EIO, "--out-dir '%s': cannot create it: %s", q->out_dir, strerror(errno));
    if (s == KV_OK) s = kv_plan_write(plan, pt->path, NULL);
    return s;
}

/* The validation of the written plan: the additivity gap on the very tokens the sensitivities saw, then the end to
 * end validation on held-out text at the point's context. */
static kv_status validate(search_run *r, kv_search_point *pt, long context) {
    const kv_search_request *q = r->req;
    const double tv = kv_now_seconds();
    kv_status s;
    if ((s = kv_eval_plan(&pt->ev_same, q->model, q->model_path, pt->path, r->sens_tok, r->n_sens_tok,
                          (int)q->sens_ctx, q->bos, (size_t)q->sens_samples, 0, 0, NULL)) != KV_OK ||
        (s = kv_eval_plan(&pt->ev, q->model, q->model_path, pt->path, q->heldout, q->n_heldout, (int)context, q->bos,
                          pt->eval_chunks, 0, 0, "validation")) != KV_OK)
        return s;
    pt->seconds_eval = kv_now_seconds() - tv;
    r->res->seconds_eval += pt->seconds_eval;
    return KV_OK;
}

kv_status kv_search_point_run(search_run *r, kv_search_point *pt) {
    const kv_search_request *q = r->req;
    kv_search_result *res = r->res;
    const int nc = r->nc, n_items = r->n_items, k = pt->ctx_index, n_pruned = q->n_pruned;
    const long context = q->contexts[k];
    const uint64_t *by = res->bytes + r->table_len * k, *va = res->values + r->table_len * k;
    kv_plan *plan = NULL;
    int plan_owned = 1;     /* 0: plans[c] itself (a single method: the knapsack's choice or the selection's) */
    double best = INFINITY; /* the selection's least KL so far */
    double ts = kv_now_seconds(); /* the selection's start (after the knapsack's own plan is built) */
    kv_status s = KV_OK;
    pt->sel_kl[0] = pt->sel_kl[1] = NAN;
    if (pt->assembly && (s = knapsack_and_select(&plan, &plan_owned, &best, &ts, r, pt, context)) != KV_OK) goto done;
    const int assembled = pt->assembly; /* 0 now also when the speed floor ruled out every assembly */
    /* a pruned contender whose bits (measured at this context) fit the budget and that measured less (§5.4) */
    for (int j = 0; j < n_pruned; j++)
        if (res->pruned_bits[k * n_pruned + j] <= pt->budget_bits && res->pruned_kl[k * n_pruned + j] < best &&
            speed_ok(r, pt, q->pruned_pos[j]))
            best = res->pruned_kl[k * n_pruned + j], pt->selected = KV_SEARCH_KEPT_PRUNED, pt->pruned = j;
    /* each contender with per-layer options allocated under this budget, measured (§5.5) */
    for (int j = 0; j < n_pruned && q->n_layer_opts > 0 && s == KV_OK; j++) s = try_layered(pt, &best, r, j, context);
    if (s != KV_OK) goto done;
    if (!assembled && pt->selected != KV_SEARCH_KEPT_PRUNED) { /* no assembly, no pruned contender fits */
        pt->feasible = 0;
        if (q->min_decode_speed > 0 && pt->budget_bits >= pt->cheapest_bits)
            s = KV_ERR(KV_EINVAL, "--budget-bits %g at --context %ld with --min-decode-speed %g: no assembly of these "
                       "candidates within the bits decodes that fast, nor a pruned contender", pt->budget_bits, context,
                       q->min_decode_speed);
        else
            s = KV_ERR(KV_EINVAL, "--budget-bits %g at --context %ld is below the cheapest assembly of these candidates "
                       "(%.4f honest bits per value) and below every pruned contender's measured bits",
                       pt->budget_bits, context, pt->cheapest_bits);
        if (q->n_points == 1) goto done;
        kv_log(KV_LOG_WARN, "search: %s: no plan for this point", kv_error_last());
        s = KV_OK;
        goto done;
    }
    pt->feasible = 1;
    search_layered lp = {0}; /* KEPT_PRUNED: the contender's plan, its pruning restored (or the assembly freed) after */
    if (pt->selected == KV_SEARCH_KEPT_SINGLE || pt->selected == KV_SEARCH_KEPT_PRUNED) {
        if (plan_owned) kv_plan_free(plan);
        plan = NULL, plan_owned = 0, pt->refit = 0;
        if (pt->selected == KV_SEARCH_KEPT_SINGLE) {
            plan = r->plans[pt->single];
            for (int i = 0; i < n_items; i++) pt->choice[i] = pt->single;
        } else {
            if ((s = kv_search_layered_plan(&lp, r->plans, nc, q->pruned_pos[pt->pruned], &q->pruned[pt->pruned],
                                            q->layer_opts, pt->layered ? pt->layers[pt->pruned].choice : NULL,
                                            pt->choice)) != KV_OK)
                goto done;
            plan = lp.plan;
        }
    }
    if (q->select_chunks > 0) {
        pt->seconds_select = kv_now_seconds() - ts;
        res->seconds_select += pt->seconds_select;
    }
    uint64_t chosen_bytes = 0, total_values = 0;
    for (int i = 0; i < n_items; i++) {
        pt->predicted_kl += res->kl[(size_t)i * nc + pt->choice[i]];
        chosen_bytes += by[(size_t)i * nc + pt->choice[i]];
        total_values += va[(size_t)i * nc];
    }
    pt->predicted_bits = 8.0 * (double)chosen_bytes / (double)total_values;
    if (pt->selected == KV_SEARCH_KEPT_PRUNED) /* the sensitivities do not model pruning; its bits were measured */
        pt->predicted_kl = NAN, pt->predicted_bits = pt->layered ? pt->layers[pt->pruned].bits
                                                                : res->pruned_bits[k * n_pruned + pt->pruned];
    if (q->min_decode_speed > 0) /* a pruned contender: its candidate's cost, an upper bound */
        pt->predicted_speed = kv_decode_speed_ratio(res->weights_seconds, kv_search_choice_seconds(r, k, pt->choice),
                                                    res->f16_seconds[k]);
    s = write_plan(r, pt, plan, context);
    if (plan_owned) kv_plan_free(plan);
    plan = NULL;
    kv_search_layered_release(&lp);
    if (s == KV_OK) s = validate(r, pt, context);
    if (s == KV_OK) s = kv_search_speed_check(r, pt);
done:
    if (plan_owned) kv_plan_free(plan);
    return s;
}
