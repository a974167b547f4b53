/* search_select.c — the selection's measurements before any point (kv_search_run's phase 4b, SEARCH.md §5.3-§5.5):
 * each single method (a candidate offered on every stream) through its own fit at each context on calibration
 * tokens, the context scale of every candidate's sensitivities (kv_search_context_scale), each pruned contender's
 * KL and honest bits, and with per-layer options each contender's per-layer table. */
#include "search_internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

/* The per-layer table of contender pr (candidate position base) at one context (SEARCH.md §5.5), on the table's
 * chunks (tab: as many as the selection's, other text): the contender's own KL and bits (*kl0, *bits0), then layer
 * l alone on option o, every other layer on the contender; dkl / dbits[l * n_opt + o] less the contender's. An
 * option that is the contender itself (its candidate, a kept fraction equal to its own once capped at 1) is not
 * measured: its changes are 0. */
static kv_status measure_layer_table(double *dkl, double *dbits, double *kl0, double *bits0, const search_run *r,
                                     int base, const kv_search_pruned *pr, long ctx) {
    const kv_search_layer_opt *opts = r->req->layer_opts;
    const int n_opt = r->req->n_layer_opts, L = r->L;
    int *choice = calloc((size_t)L, sizeof *choice);
    kv_status s = choice ? KV_OK : KV_ERR(KV_ENOMEM, "out of memory");
    kv_log(KV_LOG_INFO, "search: per-layer options of %s at context %ld: %d layers x %d options, one measurement each "
           "on the table's chunks", pr->name, ctx, L, n_opt);
    if (s == KV_OK) { /* the contender on the table's text */
        char label[160];
        search_layered lp;
        snprintf(label, sizeof label, "table %s ctx %ld", pr->name, ctx);
        if ((s = kv_search_layered_plan(&lp, r->plans, r->nc, base, pr, opts, NULL, NULL)) == KV_OK) {
            s = kv_search_select_kl(kl0, bits0, &r->tab, lp.plan, ctx, label);
            kv_search_layered_release(&lp);
        }
    }
    for (int l = 0; l < L && s == KV_OK; l++)
        for (int o = 0; o < n_opt && s == KV_OK; o++) {
            const size_t q = (size_t)l * (size_t)n_opt + (size_t)o;
            dkl[q] = dbits[q] = 0.0;
            if (opts[o].cand == base && (float)kv_search_layer_budget(pr->budget, opts[o].mult) == (float)pr->budget)
                continue;
            char label[192];
            double kl, bits;
            search_layered lp;
            snprintf(label, sizeof label, "table %s layer %d %s x%g ctx %ld", pr->name, l, r->cands[opts[o].cand]->name,
                     opts[o].mult, ctx);
            choice[l] = o + 1;
            s = kv_search_layered_plan(&lp, r->plans, r->nc, base, pr, opts, choice, NULL);
            choice[l] = 0;
            if (s == KV_OK && (s = kv_search_select_kl(&kl, &bits, &r->tab, lp.plan, ctx, label)) == KV_OK)
                dkl[q] = kl - *kl0, dbits[q] = bits - *bits0;
            kv_search_layered_release(&lp);
        }
    free(choice);
    return s;
}

/* Each single method's KL and honest bytes at each context, and the context-corrected sensitivities. */
static kv_status measure_singles(search_run *r) {
    kv_search_result *res = r->res;
    const int nc = r->nc, n_items = r->n_items;
    kv_status s = KV_OK;
    for (int k = 0; k < r->req->n_contexts && s == KV_OK; k++) {
        const long ctx = r->req->contexts[k];
        for (int c = 0; c < nc && s == KV_OK; c++) {
            int everywhere = 1;
            for (int i = 0; i < n_items; i++) {
                everywhere &= res->allowed[(size_t)i * nc + c];
                res->single_bytes[k * nc + c] += res->bytes[r->table_len * k + (size_t)i * nc + c];
            }
            res->select_single[k * nc + c] = NAN;
            if (!everywhere) continue;
            char label[96];
            snprintf(label, sizeof label, "selection %s ctx %ld", r->cands[c]->name, ctx);
            s = kv_search_select_kl(&res->select_single[k * nc + c], NULL, &r->sel, r->plans[c], ctx, label);
        }
        if (s == KV_OK)
            s = kv_search_context_scale(r->kl_scaled + r->table_len * k, res->context_scale + (size_t)k * nc, res->kl,
                                        res->select_single + (size_t)k * nc, n_items, nc);
    }
    return s;
}

kv_status kv_search_select_measure(search_run *r) {
    const kv_search_request *q = r->req;
    kv_search_result *res = r->res;
    const int nc = r->nc, n_ctx = q->n_contexts, n_pruned = q->n_pruned, n_lopt = q->n_layer_opts;
    res->select_single = malloc((size_t)n_ctx * nc * sizeof *res->select_single);
    res->context_scale = malloc((size_t)n_ctx * nc * sizeof *res->context_scale);
    r->kl_scaled = malloc(r->table_len * n_ctx * sizeof *r->kl_scaled);
    res->single_bytes = calloc((size_t)n_ctx * nc, sizeof *res->single_bytes);
    r->choice2 = malloc((size_t)r->n_items * sizeof *r->choice2);
    if (!res->select_single || !res->context_scale || !r->kl_scaled || !res->single_bytes || !r->choice2)
        return KV_ERR(KV_ENOMEM, "out of memory");
    kv_status s = measure_singles(r);
    /* each pruned contender (§5.4): its candidate's fit under H2O, KL and honest bits on the same chunks */
    if (s == KV_OK && n_pruned > 0 &&
        (!(res->pruned_kl = malloc((size_t)n_ctx * n_pruned * sizeof *res->pruned_kl)) ||
         !(res->pruned_bits = malloc((size_t)n_ctx * n_pruned * sizeof *res->pruned_bits))))
        s = KV_ERR(KV_ENOMEM, "out of memory");
    for (int k = 0; k < n_ctx && s == KV_OK && n_pruned > 0; k++)
        for (int j = 0; j < n_pruned && s == KV_OK; j++) {
            search_layered lp;
            char label[128];
            snprintf(label, sizeof label, "selection %s ctx %ld", q->pruned[j].name, q->contexts[k]);
            if ((s = kv_search_layered_plan(&lp, r->plans, nc, q->pruned_pos[j], &q->pruned[j], NULL, NULL, NULL)) ==
                KV_OK) {
                s = kv_search_select_kl(&res->pruned_kl[k * n_pruned + j], &res->pruned_bits[k * n_pruned + j],
                                        &r->sel, lp.plan, q->contexts[k], label);
                kv_search_layered_release(&lp);
            }
            if (s != KV_OK) kv_error_wrap(s, "--pruned %s at context %ld: ", q->pruned[j].name, q->contexts[k]);
        }
    /* with per-layer options, each contender's per-layer table (§5.5) */
    const size_t ly_len = (size_t)r->L * (size_t)n_lopt; /* one table */
    if (s == KV_OK && n_lopt > 0 &&
        (!(res->layer_dkl = malloc((size_t)n_ctx * n_pruned * ly_len * sizeof *res->layer_dkl)) ||
         !(res->layer_dbits = malloc((size_t)n_ctx * n_pruned * ly_len * sizeof *res->layer_dbits)) ||
         !(res->layer_kl = malloc((size_t)n_ctx * n_pruned * sizeof *res->layer_kl)) ||
         !(res->layer_bits = malloc((size_t)n_ctx * n_pruned * sizeof *res->layer_bits))))
        s = KV_ERR(KV_ENOMEM, "out of memory");
    for (int k = 0; k < n_ctx && s == KV_OK && n_lopt > 0; k++)
        for (int j = 0; j < n_pruned && s == KV_OK; j++) {
            const size_t off = ((size_t)k * n_pruned + (size_t)j) * ly_len;
            s = measure_layer_table(res->layer_dkl + off, res->layer_dbits + off, &res->layer_kl[k * n_pruned + j],
                                    &res->layer_bits[k * n_pruned + j], r, q->pruned_pos[j], &q->pruned[j],
                                    q->contexts[k]);
            if (s != KV_OK) kv_error_wrap(s, "--pruned-layers, %s at context %ld: ", q->pruned[j].name, q->contexts[k]);
        }
    return s;
}
