/* kvcal search: one plan from several methods, a choice per (layer, stream) under a budget of honest total
 * bits per value (calib/SEARCH.md). Thin: parse, fit each candidate once (kv_fit_run), measure honest bytes
 * (kv_search_stream_bytes, per context) and sensitivities (kv_search_sensitivity, once), KVmix importance as
 * the proxy (kv_importance_run, Spearman per stream); then for every (budget, context) point asked for:
 * allocate (kv_search_allocate), assemble, keep the least-KL plan on calibration text at the point's
 * context among the knapsack's, a context-corrected choice and the single methods within the budget (the
 * selection, SEARCH.md §5.3; with --pruned also single methods under H2O token pruning, §5.4, and with
 * --pruned-layers those with a candidate and a budget per layer, §5.5), write, and validate the plan end to end with
 * `kvrun eval --plan`'s own code (kv_eval_plan). Several points share the fits and the sensitivities:
 * that is how one run draws a frontier (scripts/pareto.sh). */
#define _POSIX_C_SOURCE 200809L
#include "kv_calib.h"
#include "kv_profile.h"
#include "kv_tools.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <unistd.h>
#include <sys/stat.h>

#define MAX_CANDS 32
#define MAX_COUNT (1L << 30) /* the most tokens or chunks a count option may ask for */
static const char *const k_default_cands =
    "f16,kivi2,kivi3,kivi4,higgs2,higgs3,aqua2,aqua3,aqua2r32,aqua2r64,aqua3r32,fp8,nvfp4";
#define MAX_BUDGETS 32
#define MAX_CONTEXTS 8
#define MAX_PRUNED 8
#define MAX_MULTS 8
#define MAX_LAYER_OPTS (MAX_PRUNED * (MAX_MULTS + 1))

/* One (budget, context) point: the plan chosen for it and what its validation measured. */
typedef struct search_point {
    double budget_bits;
    int ctx_index;               /* into contexts[] and the per-context byte tables */
    char path[4096];             /* where its plan is written */
    int assembly;                /* the cheapest assembly fits the budget */
    int feasible;                /* a plan was written: an assembly fits, or (--pruned) a pruned contender */
    double cheapest_bits;
    int *choice;                 /* n_items candidate positions */
    uint64_t budget_bytes, unit;
    double predicted_kl, predicted_bits;
    int refit;                   /* the plan has AQUA-KV streams: refitted layer-sequentially, not assembled */
    double seconds_refit;
    size_t eval_chunks;
    kv_plan_eval ev_same, ev;
    double seconds_eval;
    /* the selection (--select-chunks, SEARCH.md §5.3): the measured KL on calibration tokens at the point's
     * context of the knapsack's choice, of the choice on context-corrected sensitivities (NAN: the same
     * choice, or no selection), and which plan was kept */
    int selected;                /* SEL_KNAPSACK, SEL_CORRECTED, SEL_SINGLE, SEL_PRUNED */
    int single;                  /* SEL_SINGLE: the candidate whose own fit is the plan */
    int pruned;                  /* SEL_PRUNED: the pruned contender (its candidate's fit under H2O) */
    int layered;                 /* SEL_PRUNED: with the per-layer options of layers[pruned] (--pruned-layers) */
    struct layered_try *layers;  /* --pruned-layers: per contender, its per-layer options at this point (§5.5) */
    double sel_kl[2];
    double seconds_select;
} search_point;

/* A per-layer option of the pruned contenders (--pruned-layers, SEARCH.md §5.5): one of the contenders' candidates,
 * keeping its contender's budget times mult. */
typedef struct layer_opt {
    int cand;                    /* position in --candidates */
    double mult;
} layer_opt;

/* A pruned contender with per-layer options at one point (§5.5): allocated under the point's budget from the
 * contender's per-layer table, then measured on the selection's chunks like every other plan. */
typedef struct layered_try {
    enum { LAYERED_NONE, LAYERED_SAME, LAYERED_MEASURED } state; /* none fits / the contender itself / measured */
    int *choice;                 /* per layer: 0 the contender, o + 1 option o */
    double predicted_kl, predicted_bits, kl, bits;
} layered_try;

enum { SEL_KNAPSACK = 0, SEL_CORRECTED = 1, SEL_SINGLE = 2, SEL_PRUNED = 3 };
static const char *const k_sel_names[] = {"knapsack", "corrected", "single", "pruned"};

/* "a,b,c" -> numbers (each checked by the caller); at most max. With `at` (--budget-bits), an entry may be
 * "B@N": budget B at context N only (at[i] = N; 0 = at every context), so that one run can put a point at
 * each single method's own bits at each context (scripts/pareto.sh). */
static kv_status parse_numbers(double *v, long *at, int *n, int max, const char *list, const char *opt) {
    *n = 0;
    const char *p = list;
    while (*p) {
        char *end;
        const double x = strtod(p, &end);
        long ctx = 0;
        if (at && end != p && *end == '@') {
            const char *q = end + 1;
            ctx = strtol(q, &end, 10);
            if (end == q || ctx < 2) end = (char *)p; /* malformed: refused below */
        }
        if (end == p || (*end && *end != ','))
            return KV_ERR(KV_EINVAL, "%s: '%s' is not a comma-separated list of numbers%s", opt, list,
                          at ? " (each B or B@CONTEXT)" : "");
        if (*n >= max) return KV_ERR(KV_EINVAL, "%s: at most %d values", opt, max);
        if (at) at[*n] = ctx;
        v[(*n)++] = x;
        p = *end ? end + 1 : end;
    }
    if (*n == 0) return KV_ERR(KV_EINVAL, "%s is empty", opt);
    return KV_OK;
}

/* A directory that does not exist yet (--out-dir, created with its parents when the plans are written):
 * its nearest existing ancestor must be a writable directory. */
static int check_new_dir(const char *tool, const char *dir) {
    char p[4096];
    if (snprintf(p, sizeof p, "%s", dir) >= (int)sizeof p) return kv_cli_usage_error(tool, "--out-dir: path too long");
    for (;;) {
        char *slash = strrchr(p, '/');
        while (slash && slash > p && slash[1] == '\0') { /* trailing slashes */
            *slash = '\0';
            slash = strrchr(p, '/');
        }
        if (!slash) {
            snprintf(p, sizeof p, ".");
        } else if (slash == p) {
            p[1] = '\0';
        } else {
            *slash = '\0';
        }
        struct stat sb;
        if (stat(p, &sb) == 0) {
            if (!S_ISDIR(sb.st_mode))
                return kv_cli_usage_error(tool, "--out-dir '%s': '%s' is not a directory", dir, p);
            if (access(p, W_OK | X_OK) != 0)
                return kv_cli_usage_error(tool, "--out-dir '%s': directory '%s' is not writable: %s", dir, p,
                                          strerror(errno));
            return KV_EXIT_OK;
        }
        if (strcmp(p, ".") == 0 || strcmp(p, "/") == 0)
            return kv_cli_usage_error(tool, "--out-dir '%s': no existing directory above it", dir);
    }
}

/* "a,b,c" -> candidate indices (unknown: KV_EINVAL naming the known ones; duplicates refused). */
static kv_status parse_candidates(int *idx, int *n, const char *list) {
    *n = 0;
    char buf[1024];
    if (snprintf(buf, sizeof buf, "%s", list) >= (int)sizeof buf)
        return KV_ERR(KV_EINVAL, "--candidates: the list has %zu bytes, more than the %zu it may hold", strlen(list),
                      sizeof buf - 1);
    for (char *save = NULL, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        int k;
        kv_status s = kv_search_candidate_find(&k, t);
        if (s != KV_OK) return s;
        for (int i = 0; i < *n; i++)
            if (idx[i] == k) return KV_ERR(KV_EINVAL, "--candidates names '%s' twice", t);
        if (*n >= MAX_CANDS) return KV_ERR(KV_EINVAL, "--candidates: at most %d", MAX_CANDS);
        idx[(*n)++] = k;
    }
    if (*n == 0) return KV_ERR(KV_EINVAL, "--candidates is empty");
    return KV_OK;
}

/* The text report of one point: per stream (one point) or a count of the choices (several). */
/* The calibration inputs every fit of one run shares: the candidates' and a mixed plan's refit. */
typedef struct fit_inputs {
    kv_model *m;
    const kv_model_file *mf;
    const kv_arch *arch;
    const int32_t *ids;
    long fit_tokens;
    int32_t bos;                 /* -1: the tokenizer adds none */
    const char *corpus_sha, *grid_cache;
} fit_inputs;

static kv_status fit_with(kv_plan **out, const fit_inputs *in, const kv_fit_config *cfg) {
    kv_fit_data data;
    memset(&data, 0, sizeof data);
    data.tokens = in->ids;
    data.n_tokens = (size_t)in->fit_tokens;
    data.bos_id = in->bos;
    kv_fit_options fo;
    kv_fit_options_init(&fo);
    fo.corpus_sha256 = in->corpus_sha;
    fo.grid_cache_dir = in->grid_cache;
    kv_status s = kv_fit_check(cfg, in->arch);
    return s == KV_OK ? kv_fit_run(out, NULL, in->m, in->mf, &data, cfg, &fo) : s;
}

/* What a choice needs to become a plan: the candidates' fits and, for a refit, the fit inputs. */
typedef struct mix_inputs {
    const fit_inputs *fin;
    const kv_search_candidate *const *cands;
    kv_plan *const *plans;
    int nc, L;
    const char *const *common;
    int n_common;
} mix_inputs;

/* The plan of a choice: assembled from the candidates' fits, or (AQUA-KV streams) refitted layer-sequentially
 * on the mix's reconstructions with the spliced streams copied in after (*refit = 1, *seconds its time). */
static kv_status build_mix(kv_plan **out, int *refit, double *seconds, const mix_inputs *mi, const int *choice,
                           double budget, long context) {
    *out = NULL;
    *refit = kv_search_needs_refit(mi->cands, choice, 2 * mi->L);
    *seconds = 0;
    if (!*refit) return kv_search_assemble(out, (const kv_plan *const *)mi->plans, mi->nc, choice, mi->L);
    const double tr = kv_now_seconds();
    kv_fit_config rcfg;
    kv_log(KV_LOG_INFO, "search: budget %g at context %ld takes AQUA-KV streams: refitting the mix layer-sequentially",
           budget, context);
    kv_status s = kv_search_refit_config(&rcfg, mi->cands, mi->nc, choice, mi->L, mi->common, mi->n_common);
    if (s == KV_OK) {
        s = fit_with(out, mi->fin, &rcfg);
        kv_fit_config_free(&rcfg);
    }
    if (s == KV_OK) s = kv_search_splice(*out, (const kv_plan *const *)mi->plans, mi->cands, mi->nc, choice, mi->L);
    *seconds = kv_now_seconds() - tr;
    if (s != KV_OK) {
        kv_plan_free(*out);
        *out = NULL;
        kv_error_wrap(s, "the refit for --budget-bits %g at --context %ld: ", budget, context);
    }
    return s;
}

/* The candidate a choice takes on every stream, or -1: a single method, whose own fit is the plan the assembly
 * (or the refit: AQUA-KV everywhere refits to its fit byte for byte, test_refit_equals_aqua) would rebuild. */
static int single_of(const int *choice, int n_items) {
    for (int i = 1; i < n_items; i++)
        if (choice[i] != choice[0]) return -1;
    return choice[0];
}

/* The selection's measure of a plan: its mean KL on the selection tokens at ctx (kvrun eval --plan's code), and
 * (bits may be NULL) its bits_per_value_total there. */
typedef struct select_tokens {
    kv_model *m;
    const int32_t *tok;
    size_t n_tok;
    int32_t bos;
    long chunks;
} select_tokens;

static kv_status select_kl(double *kl, double *bits, const select_tokens *st, const kv_plan *plan, long ctx,
                           const char *label) {
    kv_plan_eval e;
    kv_status s = kv_eval_plan_loaded(&e, st->m, plan, st->tok, st->n_tok, (int)ctx, st->bos, (size_t)st->chunks, 0,
                                           0, label);
    if (s == KV_OK) *kl = e.cmp.kl_mean;
    if (s == KV_OK && bits) *bits = e.bits_per_value_total;
    return s;
}

/* "a@h2o0.1,b@h2o0.2" -> the pruned contenders, each's candidate's position in --candidates (pos[j]). */
static kv_status parse_pruned(kv_search_pruned *pr, int *pos, int *n, const char *list, const int *cidx, int nc) {
    *n = 0;
    char buf[1024];
    if (snprintf(buf, sizeof buf, "%s", list) >= (int)sizeof buf) return KV_ERR(KV_EINVAL, "--pruned: list too long");
    int nk;
    const kv_search_candidate *table = kv_search_candidates(&nk);
    for (char *save = NULL, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        if (*n >= MAX_PRUNED) return KV_ERR(KV_EINVAL, "--pruned: at most %d contenders", MAX_PRUNED);
        kv_status s = kv_search_pruned_parse(&pr[*n], t);
        if (s != KV_OK) return s;
        pos[*n] = -1;
        for (int c = 0; c < nc; c++)
            if (cidx[c] == pr[*n].cand) pos[*n] = c;
        if (pos[*n] < 0)
            return KV_ERR(KV_EINVAL, "--pruned %s: %s is not in --candidates (a pruned contender is a candidate's own "
                          "fit under pruning)", t, table[pr[*n].cand].name);
        if (table[pr[*n].cand].keys_only)
            return KV_ERR(KV_EINVAL, "--pruned %s: %s codes keys only; a pruned contender is one method on every "
                          "stream", t, table[pr[*n].cand].name);
        for (int j = 0; j < *n; j++)
            if (strcmp(pr[j].name, pr[*n].name) == 0) return KV_ERR(KV_EINVAL, "--pruned names '%s' twice", t);
        (*n)++;
    }
    if (*n == 0) return KV_ERR(KV_EINVAL, "--pruned is empty");
    return KV_OK;
}

/* A candidate's plan carries a contender's pruning only while it is measured or written: what it had before (its
 * fit's: no pruning) is saved here and put back. */
typedef struct saved_pruning {
    kv_plan_global global;
    float *layer; /* n_layers prune_budget */
} saved_pruning;

static kv_status pruning_save(saved_pruning *sv, const kv_plan *plan) {
    sv->global = plan->global;
    if (!(sv->layer = malloc((size_t)plan->n_layers * sizeof *sv->layer))) return KV_ERR(KV_ENOMEM, "out of memory");
    for (int l = 0; l < plan->n_layers; l++) sv->layer[l] = plan->layers[l].prune_budget;
    return KV_OK;
}

static void pruning_restore(kv_plan *plan, saved_pruning *sv) {
    plan->global = sv->global;
    for (int l = 0; l < plan->n_layers; l++) plan->layers[l].prune_budget = sv->layer[l];
    free(sv->layer);
    sv->layer = NULL;
}

/* A pruned contender's plan with per-layer options: its candidate's own fit when every layer keeps that candidate
 * (its pruning saved, set, restored by layered_release), else an assembly (owned, freed by layered_release). */
typedef struct layered {
    kv_plan *plan;
    int owned;
    saved_pruning sv;
} layered;

/* Contender pr (candidate position base) with layer l on option opts[choice[l] - 1] (choice[l] 0, or choice NULL:
 * the contender's own); streams[2L], if not NULL, receives each stream's candidate position. */
static kv_status layered_plan(layered *out, kv_plan *const *plans, int nc, int base, const kv_search_pruned *pr,
                              const layer_opt *opts, const int *choice, int *streams) {
    const int L = plans[base]->n_layers;
    int *st = malloc((size_t)2 * L * sizeof *st);
    double *mult = malloc((size_t)L * sizeof *mult);
    int mixed = 0;
    kv_status s = !st || !mult ? KV_ERR(KV_ENOMEM, "out of memory") : KV_OK;
    for (int l = 0; l < L && s == KV_OK; l++) {
        const layer_opt *o = choice && choice[l] ? &opts[choice[l] - 1] : NULL;
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
        s = pruning_save(&out->sv, out->plan);
    }
    if (s == KV_OK) kv_search_layer_apply(out->plan, pr, mult);
    if (s == KV_OK && streams) memcpy(streams, st, (size_t)2 * L * sizeof *st);
    if (s != KV_OK) out->plan = NULL;
    free(st);
    free(mult);
    return s;
}

/* The kept fraction of a layer on choice c (0: the contender's own, o + 1: option o). */
static double layer_fraction(const kv_search_pruned *pr, const layer_opt *opts, int c) {
    return c ? kv_search_layer_budget(pr->budget, opts[c - 1].mult) : pr->budget;
}

static void layered_release(layered *lp) {
    if (lp->owned) kv_plan_free(lp->plan);
    else if (lp->plan) pruning_restore(lp->plan, &lp->sv);
    lp->plan = NULL;
}

/* The per-layer table of contender j (candidate position base) at one context (SEARCH.md §5.5), on the table's
 * chunks (tab: as many as the selection's, other text): the contender's own KL and bits (*kl0, *bits0), then layer
 * l alone on option o, every other layer on the contender; dkl / dbits[l * n_opt + o] less the contender's. An
 * option that is the contender itself (its candidate, a kept fraction equal to its own once capped at 1) is not
 * measured: its changes are 0. */
static kv_status measure_layer_table(double *dkl, double *dbits, double *kl0, double *bits0, const select_tokens *tab,
                                     kv_plan *const *plans, int nc, int base, const kv_search_pruned *pr,
                                     const layer_opt *opts, int n_opt, long ctx, const kv_search_candidate *const *cands) {
    const int L = plans[base]->n_layers;
    int *choice = calloc((size_t)L, sizeof *choice);
    kv_status s = choice ? KV_OK : KV_ERR(KV_ENOMEM, "out of memory");
    kv_log(KV_LOG_INFO, "search: per-layer options of %s at context %ld: %d layers x %d options, one measurement each "
           "on the table's chunks", pr->name, ctx, L, n_opt);
    if (s == KV_OK) { /* the contender on the table's text */
        char label[160];
        layered lp;
        snprintf(label, sizeof label, "table %s ctx %ld", pr->name, ctx);
        if ((s = layered_plan(&lp, plans, nc, base, pr, opts, NULL, NULL)) == KV_OK) {
            s = select_kl(kl0, bits0, tab, lp.plan, ctx, label);
            layered_release(&lp);
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
            layered lp;
            snprintf(label, sizeof label, "table %s layer %d %s x%g ctx %ld", pr->name, l,
                     cands[opts[o].cand]->name, opts[o].mult, ctx);
            choice[l] = o + 1;
            s = layered_plan(&lp, plans, nc, base, pr, opts, choice, NULL);
            choice[l] = 0;
            if (s == KV_OK && (s = select_kl(&kl, &bits, tab, lp.plan, ctx, label)) == KV_OK)
                dkl[q] = kl - *kl0, dbits[q] = bits - *bits0;
            layered_release(&lp);
        }
    free(choice);
    return s;
}

/* The pruned contenders (--pruned) and their measurements at one context. */
typedef struct pruned_at {
    const kv_search_pruned *pr;
    const double *kl, *bits; /* [contender] */
    int n;
    const layer_opt *opts;   /* --pruned-layers (n_opt 0: none); the tries are the point's layers[] */
    int n_opt;
} pruned_at;

static void print_point_text(const search_point *pt, long context, const kv_search_candidate *table, const int *cidx,
                             int nc, int n_items, const double *kl, const unsigned char *allowed,
                             const uint64_t *bytes, const uint64_t *values, const pruned_at *pa,
                             int per_stream, long sens_ctx, long sens_samples) {
    printf("\n== budget %.3f honest bits per value at context %ld", pt->budget_bits, context);
    if (!pt->feasible) {
        printf(": below the cheapest assembly of these candidates (%.4f bits)%s; no plan\n", pt->cheapest_bits,
               pa->n ? " and every pruned contender's bits" : "");
        return;
    }
    printf(" (%llu bytes, unit %llu): %s\n", (unsigned long long)pt->budget_bytes, (unsigned long long)pt->unit,
           pt->path);
    if (pt->refit)
        printf("AQUA-KV streams chosen: the plan was refitted layer-sequentially on the mix's reconstructions (%.1f s)\n",
               pt->seconds_refit);
    if (pt->selected == SEL_PRUNED)
        printf("the pruned contender %s%s: %s's own fit under H2O (the per-stream KL and bits below are the candidate's "
               "without pruning; its bits were measured)\n", pa->pr[pt->pruned].name,
               pt->layered ? " with per-layer options" : "", table[cidx[pt->choice[0]]].name);
    if (pt->selected == SEL_PRUNED && pt->layered) {
        const layered_try *lt = &pt->layers[pt->pruned];
        printf("per layer, candidate and fraction of the f16 cache kept:");
        for (int l = 0; l < n_items / 2; l++)
            printf(" %s@%.4g", table[cidx[pt->choice[2 * l]]].name,
                   layer_fraction(&pa->pr[pt->pruned], pa->opts, lt->choice[l]));
        printf("\n");
    }
    if (per_stream) {
        printf("%-6s %-2s %-8s %12s %8s   KL per candidate\n", "layer", "s", "choice", "kl", "bits");
        for (int i = 0; i < n_items; i++) {
            const size_t k = (size_t)i * nc + pt->choice[i];
            printf("%-6d %-2s %-8s %12.4g %8.3f  ", i / 2, i % 2 ? "V" : "K", table[cidx[pt->choice[i]]].name, kl[k],
                   8.0 * (double)bytes[k] / (double)values[k]);
            for (int c = 0; c < nc; c++)
                if (allowed[(size_t)i * nc + c]) printf(" %s=%.3g", table[cidx[c]].name, kl[(size_t)i * nc + c]);
            printf("\n");
        }
    } else {
        for (int st = 0; st < 2; st++) {
            printf("%s:", st ? "V" : "K");
            for (int c = 0; c < nc; c++) {
                int count = 0;
                for (int i = st; i < n_items; i += 2) count += pt->choice[i] == c;
                if (count) printf(" %s %d", table[cidx[c]].name, count);
            }
            printf("%s", st ? "\n" : ";  ");
        }
    }
    if (isfinite(pt->predicted_kl))
        printf("predicted: KL sum %.5g, honest bits %.4f\n", pt->predicted_kl, pt->predicted_bits);
    else
        printf("predicted: no KL (the sensitivities do not model pruning), honest bits %.4f (measured)\n",
               pt->predicted_bits);
    if (isfinite(pt->sel_kl[0]) || pa->n) {
        printf("selection on calibration text (ctx %ld):", context);
        if (isfinite(pt->sel_kl[0])) printf(" knapsack KL %.5g", pt->sel_kl[0]);
        if (isfinite(pt->sel_kl[1])) printf(", context-corrected choice %.5g", pt->sel_kl[1]);
        for (int j = 0; j < pa->n; j++) {
            printf("%s %s KL %.5g at %.4f bits%s", j || isfinite(pt->sel_kl[0]) ? "," : "", pa->pr[j].name, pa->kl[j],
                   pa->bits[j], pa->bits[j] <= pt->budget_bits ? "" : " (over the budget)");
            const layered_try *lt = pa->n_opt > 0 ? &pt->layers[j] : NULL;
            if (lt && lt->state == LAYERED_MEASURED)
                printf(", %s per layer KL %.5g at %.4f bits (predicted %.5g at %.4f)%s", pa->pr[j].name, lt->kl,
                       lt->bits, lt->predicted_kl, lt->predicted_bits,
                       lt->bits <= pt->budget_bits ? "" : " (over the budget)");
        }
        printf("; kept: %s%s%s\n",
               pt->selected == SEL_SINGLE ? "the single method " :
               pt->selected == SEL_PRUNED ? "the pruned contender " : k_sel_names[pt->selected],
               pt->selected == SEL_SINGLE ? table[cidx[pt->single]].name :
               pt->selected == SEL_PRUNED ? pa->pr[pt->pruned].name : "",
               pt->selected == SEL_PRUNED && pt->layered ? " per layer" : "");
    }
    printf("measured on the sensitivity tokens (ctx %ld, %ld chunks): KL %.5g, ppl %.4f (exact %.4f), bits %.4f\n",
           sens_ctx, sens_samples, pt->ev_same.cmp.kl_mean, pt->ev_same.cmp.ppl, pt->ev_same.cmp.ppl_ref,
           pt->ev_same.bits_per_value_total);
    printf("measured on held-out text (ctx %ld, %zu chunks): KL %.5g, ppl %.4f (exact %.4f, %+.2f%%), top-1 %.4f, "
           "bits_per_value_total %.4f (%.1f s)\n", context, pt->ev.cmp.n_chunks, pt->ev.cmp.kl_mean, pt->ev.cmp.ppl,
           pt->ev.cmp.ppl_ref, 100.0 * (pt->ev.cmp.ppl / pt->ev.cmp.ppl_ref - 1.0), pt->ev.cmp.top1_agreement,
           pt->ev.bits_per_value_total, pt->seconds_eval);
}

/* --budget-bits (into budgets[MAX_BUDGETS]) and --context (contexts[MAX_CONTEXTS]) into the points, context-major
 * (the frontier at one context, then the next), each with its plan path and validation chunks; KV_EXIT_OK or the
 * usage error's exit code. */
static int parse_points(search_point *points, int *n_points, double *budgets, int *n_budgets, long *contexts, int *n_ctx,
                        long *min_ctx, const char *tool, const char *budget_list, const char *context_list,
                        const char *out, const char *out_dir, long eval_tokens, long eval_chunks) {
    double ctx_d[MAX_CONTEXTS];
    long budget_at[MAX_BUDGETS];
    if (parse_numbers(budgets, budget_at, n_budgets, MAX_BUDGETS, budget_list, "--budget-bits") != KV_OK ||
        parse_numbers(ctx_d, NULL, n_ctx, MAX_CONTEXTS, context_list ? context_list : "2048", "--context") != KV_OK)
        return kv_cli_usage_error(tool, "%s", kv_error_last());
    for (int b = 0; b < *n_budgets; b++)
        if (!(budgets[b] > 0 && budgets[b] <= 32))
            return kv_cli_usage_error(tool, "--budget-bits must be in (0, 32] (got %g)", budgets[b]);
    *min_ctx = 0;
    for (int k = 0; k < *n_ctx; k++) {
        if (!(ctx_d[k] >= 2 && ctx_d[k] <= (1 << 20)) || ctx_d[k] != floor(ctx_d[k]))
            return kv_cli_usage_error(tool, "--context must be whole numbers in [2, 2^20] (got %g)", ctx_d[k]);
        contexts[k] = (long)ctx_d[k];
        *min_ctx = k == 0 || contexts[k] < *min_ctx ? contexts[k] : *min_ctx;
    }
    for (int b = 0; b < *n_budgets; b++) {
        int known = budget_at[b] == 0;
        for (int k = 0; k < *n_ctx; k++) known |= budget_at[b] == contexts[k];
        if (!known)
            return kv_cli_usage_error(tool, "--budget-bits %g@%ld: %ld is not one of the --context values", budgets[b],
                                      budget_at[b], budget_at[b]);
    }
    int wanted = 0;
    for (int k = 0; k < *n_ctx; k++)
        for (int b = 0; b < *n_budgets; b++) wanted += !budget_at[b] || budget_at[b] == contexts[k];
    if ((out != NULL) == (out_dir != NULL) || (out && wanted != 1))
        return kv_cli_usage_error(tool, "give --out PLAN (one point: one budget at one context) or --out-dir DIR (any "
                                  "number of points; %d here)", wanted);
    for (int k = 0; k < *n_ctx; k++)
        for (int b = 0; b < *n_budgets; b++) {
            if (budget_at[b] && budget_at[b] != contexts[k]) continue;
            search_point *pt = &points[*n_points];
            pt->budget_bits = budgets[b];
            pt->ctx_index = k;
            pt->eval_chunks = eval_tokens ? (size_t)(eval_tokens / contexts[k]) : (size_t)eval_chunks;
            if (pt->eval_chunks == 0)
                return kv_cli_usage_error(tool, "--eval-tokens %ld is less than one chunk of %ld tokens", eval_tokens,
                                          contexts[k]);
            int len = out ? snprintf(pt->path, sizeof pt->path, "%s", out)
                          : snprintf(pt->path, sizeof pt->path, "%s/search-ctx%ld-%gbits.kvplan", out_dir, contexts[k],
                                     budgets[b]);
            if (len < 0 || (size_t)len >= sizeof pt->path) return kv_cli_usage_error(tool, "--out-dir: path too long");
            for (int q = 0; q < *n_points; q++)
                if (strcmp(points[q].path, pt->path) == 0)
                    return kv_cli_usage_error(tool, "--budget-bits / --context name the point %s twice", pt->path);
            (*n_points)++;
        }
    return KV_EXIT_OK;
}

/* --pruned into the contenders (each's candidate's position in --candidates) and --pruned-layers into the per-layer
 * options: each contender's candidate (once) at its contender's budget and at each multiple of it (§5.5);
 * KV_EXIT_OK or the usage error's exit code. */
static int parse_contenders(kv_search_pruned *pruned, int *pruned_pos, int *n_pruned, layer_opt *lopts, int *n_lopt,
                            const char *tool, const char *pruned_list, const char *layer_list, const int *cidx, int nc) {
    double mults[MAX_MULTS];
    int n_mult = 0;
    *n_pruned = *n_lopt = 0;
    if (pruned_list && parse_pruned(pruned, pruned_pos, n_pruned, pruned_list, cidx, nc) != KV_OK)
        return kv_cli_usage_error(tool, "%s", kv_error_last());
    if (!layer_list) return KV_EXIT_OK;
    if (*n_pruned == 0)
        return kv_cli_usage_error(tool, "--pruned-layers sets per-layer options of the --pruned contenders: give --pruned");
    if (parse_numbers(mults, NULL, &n_mult, MAX_MULTS, layer_list, "--pruned-layers") != KV_OK)
        return kv_cli_usage_error(tool, "%s", kv_error_last());
    for (int o = 0; o < n_mult; o++) {
        int twice = 0;
        for (int q = 0; q < o; q++) twice |= mults[q] == mults[o];
        if (!(mults[o] > 0 && mults[o] <= 1024) || mults[o] == 1 || twice)
            return kv_cli_usage_error(tool, "--pruned-layers: multipliers must be in (0, 1024], other than 1 (a layer "
                                      "may always keep its contender's budget), each once (got %g)", mults[o]);
    }
    for (int j = 0; j < *n_pruned; j++) {
        int seen = 0;
        for (int q = 0; q < j; q++) seen |= pruned_pos[q] == pruned_pos[j];
        for (int o = -1; o < n_mult && !seen; o++) lopts[(*n_lopt)++] = (layer_opt){pruned_pos[j], o < 0 ? 1.0 : mults[o]};
    }
    return KV_EXIT_OK;
}

/* The provenance of a point's plan (config_yaml): its budget and context, the candidate of every stream, and with
 * a selection what it kept (the pruned contender and its per-layer budgets). Truncated at cap. */
static void point_yaml(char *yaml, size_t cap, const search_point *pt, long context, const kv_plan *plan, int L,
                       int selection, const kv_search_pruned *pruned, const kv_search_candidate *const *cands) {
    size_t len = (size_t)snprintf(yaml, cap, "# kvcal search: budget %g bits at context %ld\nsearch:\n  budget_bits: %g\n"
                                  "  context: %ld\n  choices:\n", pt->budget_bits, context, pt->budget_bits, context);
    for (int l = 0; l < L && len < cap; l++)
        len += (size_t)snprintf(yaml + len, cap - len, "    - {layer: %d, key: %s, value: %s}\n", l,
                                cands[pt->choice[2 * l]]->name, cands[pt->choice[2 * l + 1]]->name);
    if (selection && len < cap) len += (size_t)snprintf(yaml + len, cap - len, "  selected: %s\n", k_sel_names[pt->selected]);
    if (pt->selected == SEL_PRUNED && len < cap)
        len += (size_t)snprintf(yaml + len, cap - len, "  pruned: %s\n", pruned[pt->pruned].name);
    if (pt->selected == SEL_PRUNED && pt->layered)
        for (int l = 0; l < L && len < cap; l++)
            len += (size_t)snprintf(yaml + len, cap - len, "%s%.7g%s", /* f32's digits */
                                    l ? ", " : "  layer_budgets: [",
                                    plan->layers[l].prune_budget ? (double)plan->layers[l].prune_budget
                                                                 : (double)plan->global.prune_budget,
                                    l == L - 1 ? "]\n" : "");
}

/* One pruned contender with its per-layer options at a point (§5.5): allocated under the point's budget from its
 * table, measured on the selection's chunks (unless the allocation is the contender itself, measured before), and
 * kept (pt->selected, pt->pruned, pt->layered, *best) when it fits the budget and measures the least KL so far. */
typedef struct layered_contender {
    const kv_search_pruned *pr;
    int pos;                           /* its candidate's position in --candidates */
    int index;                         /* in --pruned */
    const layer_opt *opts;
    const kv_search_layer_table *table; /* at this point's context: the changes measured on the table's text, added to
                                           the contender as the selection measured it: the prediction is for the
                                           selection's text, where the allocated plan is measured next */
} layered_contender;

static kv_status try_layered(search_point *pt, double *best, const layered_contender *lc, kv_plan *const *plans, int nc,
                             const select_tokens *sel, long context) {
    layered_try *lt = &pt->layers[lc->index];
    const kv_search_layer_table *t = lc->table;
    kv_status s = kv_search_layer_allocate(lt->choice, &lt->predicted_kl, &lt->predicted_bits, t, pt->budget_bits);
    if (s == KV_EINVAL) { /* even the cheapest per-layer options predict more bits than the point's */
        lt->state = LAYERED_NONE;
        return KV_OK;
    }
    if (s != KV_OK) return s;
    int changed = 0;
    for (int l = 0; l < t->n_layers; l++) changed |= lt->choice[l] != 0;
    if (!changed) { /* the contender itself, measured before */
        lt->state = LAYERED_SAME, lt->kl = t->kl, lt->bits = t->bits;
        return KV_OK;
    }
    layered lp;
    char label[160];
    snprintf(label, sizeof label, "selection %s per layer, budget %g ctx %ld", lc->pr->name, pt->budget_bits, context);
    if ((s = layered_plan(&lp, plans, nc, lc->pos, lc->pr, lc->opts, lt->choice, NULL)) != KV_OK) return s;
    s = select_kl(&lt->kl, &lt->bits, sel, lp.plan, context, label);
    layered_release(&lp);
    if (s != KV_OK) return s;
    lt->state = LAYERED_MEASURED;
    if (lt->bits <= pt->budget_bits && lt->kl < *best)
        *best = lt->kl, pt->selected = SEL_PRUNED, pt->pruned = lc->index, pt->layered = 1;
    return KV_OK;
}

int kvcal_search(int argc, char **argv) {
    const char *tool = "kvcal search";
    const char *model = NULL, *tokenizer = NULL, *corpus = NULL, *heldout = NULL, *out = NULL, *out_dir = NULL,
               *cand_list = NULL, *set_last = NULL, *budget_list = NULL, *context_list = NULL,
               *pruned_list = NULL, *layer_list = NULL;
    long fit_tokens = 16384, fit_seq = 0, sens_ctx = 0, sens_samples = 2, eval_chunks = 4, eval_tokens = 0,
         prompts = 8, threads = 0, select_chunks = 1;
    int json = 0;
    const char *pred_inputs = "chained";
    const kv_opt opts[] = {
        {"model", 'm', KV_OPT_STRING, &model, "M", "model: GGUF, safetensors directory or llama2.c checkpoint", 1},
        {"tokenizer", 0, KV_OPT_STRING, &tokenizer, "T", "tokenizer (default: the model's own)", 0},
        {"corpus", 'c', KV_OPT_STRING, &corpus, "FILE", "calibration text: the fits, then (disjoint tokens) the "
                                                        "sensitivities and the importance proxy", 1},
        {"heldout", 0, KV_OPT_STRING, &heldout, "FILE", "held-out text for the end-to-end validation (default: the "
                                                         "corpus's tokens after every token the search reads)", 0},
        {"budget-bits", 'B', KV_OPT_STRING, &budget_list, "B[,B...]", "honest total bits per value at --context, as "
                                                                       "kvrun eval --plan reports bits_per_value_total "
                                                                       "(several: one plan per budget and context; "
                                                                       "B@N: at context N only)", 1},
        {"context", 0, KV_OPT_STRING, &context_list, "N[,N...]", "context(s) the bits are counted at, and the "
                                                                  "validation's --ctx (default 2048)", 0},
        {"out", 'o', KV_OPT_STRING, &out, "PLAN", "plan to write (atomically), for one budget and one context", 0},
        {"out-dir", 0, KV_OPT_STRING, &out_dir, "DIR", "instead of --out, for any number of points: the plans as "
                                                       "DIR/search-ctxN-Bbits.kvplan", 0},
        {"candidates", 0, KV_OPT_STRING, &cand_list, "LIST", "comma-separated candidates (default: f16,kivi2,kivi3,"
                                                             "kivi4,higgs2,higgs3,aqua2,aqua3,aqua2r32,aqua2r64,"
                                                             "aqua3r32,fp8,nvfp4; AQUA-KV ones make a chosen mix be "
                                                             "refitted)", 0},
        {"fit-tokens", 0, KV_OPT_INT, &fit_tokens, "N", "calibration tokens for each candidate's fit (default 16384)", 0},
        {"fit-seq-len", 0, KV_OPT_INT, &fit_seq, "N", "tokens per fit sequence (default min(context, 512))", 0},
        {"sens-ctx", 0, KV_OPT_INT, &sens_ctx, "N", "tokens per sensitivity chunk (default min(context, 512))", 0},
        {"sens-samples", 0, KV_OPT_INT, &sens_samples, "N", "sensitivity chunks (default 2)", 0},
        {"eval-chunks", 0, KV_OPT_INT, &eval_chunks, "N", "validation chunks of --context tokens (default 4)", 0},
        {"eval-tokens", 0, KV_OPT_INT, &eval_tokens, "N", "instead of --eval-chunks: N / context chunks at each "
                                                          "context, the tokens `kvrun eval --max-tokens N` scores", 0},
        {"predictor-inputs", 0, KV_OPT_STRING, &pred_inputs, "chained|free", "chained (default): an AQUA-KV "
                                                                              "stream only where its inputs are "
                                                                              "AQUA-KV streams (keys before RoPE, "
                                                                              "SEARCH.md §1.4); free: anywhere", 0},
        {"select-chunks", 0, KV_OPT_INT, &select_chunks, "N", "selection (default 1; 0: none): per point, keep the "
                                                              "plan of least KL on N chunks of calibration text "
                                                              "at its context among the knapsack's choice, the "
                                                              "choice on context-corrected sensitivities and every "
                                                              "single method within the budget", 0},
        {"pruned", 0, KV_OPT_STRING, &pruned_list, "LIST", "pruned contenders for the selection, comma-separated "
                                                           "CANDIDATE@h2oF (e.g. kivi4@h2o0.125: that candidate's "
                                                           "fit with H2O keeping F of the f16 cache): measured at "
                                                           "each context, kept at a point whose budget their bits "
                                                           "fit when they measure the least KL, also where no "
                                                           "assembly fits (SEARCH.md §5.4)", 0},
        {"pruned-layers", 0, KV_OPT_STRING, &layer_list, "M[,M...]", "per-layer options for the pruned contenders: "
                                                                      "each layer may take any contender's candidate "
                                                                      "keeping 1 or M times its contender's fraction "
                                                                      "(at most 1), allocated per point under its "
                                                                      "budget from one-layer measurements (contexts x "
                                                                      "contenders x layers x options selection runs), "
                                                                      "then measured and kept if least (SEARCH.md "
                                                                      "§5.5)", 0},
        {"prompts", 0, KV_OPT_INT, &prompts, "N", "KVmix importance prompts for the proxy (default 8; 0: none)", 0},
        {"set", 0, KV_OPT_STRING, &set_last, "KEY=VALUE", "a fit configuration key for every candidate (repeatable), "
                                                          "e.g. cache.recent=64", 0},
        {"threads", 't', KV_OPT_INT, &threads, "N", "threads (default: KVCAL_THREADS or all CPUs)", 0},
        {"json", 0, KV_OPT_FLAG, &json, NULL, "print everything as JSON", 0},
        {NULL, 0, KV_OPT_FLAG, NULL, NULL, NULL, 0},
    };
    const char **sets = calloc((size_t)argc + 8, sizeof *sets);
    int n_sets = 0;
    if (!sets) return kv_cli_fail(tool, KV_ERR(KV_ENOMEM, "out of memory"));
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--") == 0) break;
        if (strcmp(argv[i], "--set") == 0 && i + 1 < argc) sets[n_sets++] = argv[++i];
        else if (strncmp(argv[i], "--set=", 6) == 0) sets[n_sets++] = argv[i] + 6;
    }
    kv_cli_args a;
    int rc = kv_cli_parse(&a, tool,
                          "--model M --corpus FILE [--heldout FILE] --budget-bits B[,B...] (--out PLAN | --out-dir DIR) "
                          "[--context N[,N...]] [--candidates LIST] [--json] [--set key=value ...]",
                          "Choose, for every layer and stream, one of several single-method plans so that the "
                          "summed per-stream KL sensitivity is least under a budget of honest total bits per value "
                          "(codes, scales, zero points, norms, FP scales, predictors amortized, f16 sinks and "
                          "window, at --context tokens). Each candidate is fitted once (kvcal fit); a stream without "
                          "a predictor is fitted from its own layer's exact K/V, so the assembled plan is what one "
                          "mixed fit would write; a choice with AQUA-KV streams (taken only above AQUA-KV inputs, "
                          "--predictor-inputs) is refitted layer-sequentially on the mix's reconstructions. The "
                          "selection (--select-chunks) measures that choice, a choice on context-corrected "
                          "sensitivities and the single methods within the budget on calibration text at the "
                          "context and keeps the least KL. Then the plan is written and evaluated end to end on held-out text (kvrun eval --plan's "
                          "code): predicted vs measured KL, perplexity, honest bits. Several budgets and contexts "
                          "share the fits and the sensitivities: one plan per point.",
                          opts, 0, argc, argv);
    if (rc != KV_EXIT_OK) {
        free(sets);
        return rc < 0 ? KV_EXIT_OK : rc;
    }
    int cidx[MAX_CANDS], nc = 0, n_threads = 0, n_budgets = 0, n_ctx = 0, n_points = 0;
    double budgets[MAX_BUDGETS];
    kv_search_pruned pruned[MAX_PRUNED];
    int pruned_pos[MAX_PRUNED], n_pruned = 0; /* a contender's candidate: its position in --candidates */
    double *pr_kl = NULL, *pr_bits = NULL;    /* [context][contender]: measured on the selection's chunks */
    int n_lopt = 0;
    layer_opt lopts[MAX_LAYER_OPTS];          /* every contender's candidate x (1 and each multiplier) (§5.5) */
    double *ly_dkl = NULL, *ly_dbits = NULL;  /* [context][contender][layer][option] */
    double *ly_kl = NULL, *ly_bits = NULL;    /* [context][contender]: the contender on the table's chunks */
    long contexts[MAX_CONTEXTS];
    search_point *points = calloc(MAX_BUDGETS * MAX_CONTEXTS, sizeof *points); /* ~4.5 KiB each: not on the stack */
    kv_model_file *mf = NULL;
    kv_model *m = NULL;
    kv_tokenizer *tok = NULL;
    int32_t *ids = NULL, *ho = NULL;
    size_t n_ids = 0, n_ho = 0;
    kv_plan *plans[MAX_CANDS] = {NULL};
    const char **common = NULL; /* the fit keys every candidate and a refit share */
    uint64_t *bytes = NULL, *values = NULL; /* [context][item][candidate] */
    double *kl = NULL, *fit_s = NULL, *rho = NULL;
    /* the selection: per context, each single method's measured KL (NAN: not one) and honest bytes, the
     * context scale per candidate and the sensitivities it corrects; a second choice per point */
    double *sel_single = NULL, *scale = NULL, *kl_scaled = NULL;
    uint64_t *single_bytes = NULL;
    int *choice2 = NULL;
    unsigned char *allowed = NULL; /* [item][candidate]: a keys-only candidate is not offered for V */
    kv_search_chain chain, *chain_p = NULL; /* predictor inputs and shared codes (kv_search_chain_init) */
    memset(&chain, 0, sizeof chain);
    kv_importance imp;
    memset(&imp, 0, sizeof imp);
    char corpus_sha[65] = "", *gcache = kv_tool_grid_cache_dir();
    kv_status s = KV_OK;
    if (!points) {
        s = KV_ERR(KV_ENOMEM, "out of memory");
        goto fail;
    }
    if (fit_tokens < 2 || sens_samples < 1 || eval_chunks < 1 || eval_tokens < 0 || prompts < 0 || select_chunks < 0 ||
        (kv_cli_given(&a, opts, "fit-seq-len") && fit_seq < 2) || (kv_cli_given(&a, opts, "sens-ctx") && sens_ctx < 2)) {
        rc = kv_cli_usage_error(tool, "--fit-tokens, --fit-seq-len and --sens-ctx must be >= 2, --sens-samples and "
                                "--eval-chunks >= 1, --eval-tokens, --prompts and --select-chunks >= 0");
        goto end;
    }
    /* counts of tokens or chunks beyond any corpus: refused here, so that the sums of what the run reads
     * below cannot overflow */
    if (fit_tokens > MAX_COUNT || fit_seq > (1L << 20) || sens_ctx > (1L << 20) || sens_samples > MAX_COUNT ||
        eval_chunks > MAX_COUNT || eval_tokens > MAX_COUNT || prompts > MAX_COUNT || select_chunks > MAX_COUNT) {
        rc = kv_cli_usage_error(tool, "--fit-tokens, --sens-samples, --eval-chunks, --eval-tokens, --prompts and "
                                "--select-chunks must be at most %ld, --fit-seq-len and --sens-ctx at most 2^20",
                                (long)MAX_COUNT);
        goto end;
    }
    if (strcmp(pred_inputs, "chained") != 0 && strcmp(pred_inputs, "free") != 0) {
        rc = kv_cli_usage_error(tool, "--predictor-inputs must be chained or free (got '%s')", pred_inputs);
        goto end;
    }
    if (eval_tokens && kv_cli_given(&a, opts, "eval-chunks")) {
        rc = kv_cli_usage_error(tool, "give --eval-chunks or --eval-tokens, not both");
        goto end;
    }
    long min_ctx = 0;
    if ((rc = parse_points(points, &n_points, budgets, &n_budgets, contexts, &n_ctx, &min_ctx, tool, budget_list,
                           context_list, out, out_dir, eval_tokens, eval_chunks)) != KV_EXIT_OK)
        goto end;
    if (!fit_seq) fit_seq = min_ctx < 512 ? min_ctx : 512;
    if (!sens_ctx) sens_ctx = min_ctx < 512 ? min_ctx : 512;
    for (int k = 0; k < n_ctx; k++)
        if (sens_ctx != contexts[k])
            kv_log(KV_LOG_INFO, "search: sensitivities on chunks of %ld tokens, the budget and the validation at %ld: "
                   "the predicted KL is that of %ld-token chunks (--sens-ctx)", sens_ctx, contexts[k], sens_ctx);
    if ((s = parse_candidates(cidx, &nc, cand_list ? cand_list : k_default_cands)) !=
        KV_OK) {
        rc = kv_cli_usage_error(tool, "%s", kv_error_last());
        goto end;
    }
    if ((rc = parse_contenders(pruned, pruned_pos, &n_pruned, lopts, &n_lopt, tool, pruned_list, layer_list, cidx, nc)) !=
        KV_EXIT_OK)
        goto end;
    if (n_pruned > 0 && select_chunks == 0) {
        rc = kv_cli_usage_error(tool, "--pruned: a pruned contender enters a plan only through the selection, which "
                                "--select-chunks 0 turns off");
        goto end;
    }
    if ((rc = kv_tool_threads(tool, threads, &n_threads)) != KV_EXIT_OK) goto end;
    {
        const kv_tool_path ins[] = {{"--model", model}, {"--tokenizer", tokenizer}, {"--corpus", corpus},
                                    {"--heldout", heldout}};
        kv_tool_path outs[MAX_BUDGETS * MAX_CONTEXTS];
        for (int p = 0; p < n_points; p++) outs[p].what = out ? "--out" : "--out-dir", outs[p].path = points[p].path;
        /* --out-dir is created only when the plans are written, after every check: a missing one is
         * checked where it would be created (its nearest existing ancestor must take it) */
        struct stat sb;
        const int dir_exists = out_dir && stat(out_dir, &sb) == 0;
        if (out_dir && dir_exists && !S_ISDIR(sb.st_mode)) {
            rc = kv_cli_usage_error(tool, "--out-dir '%s' exists and is not a directory", out_dir);
            goto end;
        }
        if (out_dir && !dir_exists && (rc = check_new_dir(tool, out_dir)) != KV_EXIT_OK) goto end;
        if ((rc = kv_tool_check_io(tool, ins, 4, outs, out_dir && !dir_exists ? 0 : n_points)) != KV_EXIT_OK) goto end;
        /* corpora that never end (devices), or missing, before anything is loaded */
        if ((s = kv_input_check(corpus)) != KV_OK || (heldout && (s = kv_input_check(heldout)) != KV_OK)) goto fail;
    }
    /* ---- model, tokens ---- */
    const double t0 = kv_now_seconds();
    if ((s = kv_model_file_open(&mf, model)) != KV_OK) goto fail;
    {
        kv_model_options mo;
        memset(&mo, 0, sizeof mo);
        mo.n_threads = n_threads;
        if ((s = kv_model_load(&m, mf, &mo)) != KV_OK) goto fail;
    }
    if ((s = kv_tokenizer_load(&tok, mf, tokenizer)) != KV_OK) goto fail;
    if ((s = kv_tool_check_vocab(m, tok, tokenizer)) != KV_OK) goto fail;
    for (int k = 0; k < n_ctx; k++) kv_tool_warn_context(kv_model_arch(m), contexts[k], "--context");
    const size_t sens_need = (size_t)sens_samples * (size_t)(sens_ctx - 1);
    const size_t prompt_need = prompts > 0 ? (size_t)(2 * prompts) * (size_t)sens_ctx : 0; /* room to sample windows */
    const size_t extra = sens_need > prompt_need ? sens_need : prompt_need;
    long max_ctx = 0;
    for (int k = 0; k < n_ctx; k++) max_ctx = contexts[k] > max_ctx ? contexts[k] : max_ctx;
    const size_t select_need = (size_t)select_chunks * (size_t)(max_ctx - 1); /* after the fits' and the proxy's */
    /* --pruned-layers: the per-layer tables on as many chunks again, after the selection's: the allocation is fitted
     * to its table's text, so the selection must measure the allocated plan on other text (SEARCH.md §5.5) */
    const size_t table_need = n_lopt > 0 ? select_need : 0;
    size_t ho_need = 0; /* the most any point's validation reads */
    for (int p = 0; p < n_points; p++) {
        const size_t need = points[p].eval_chunks * (size_t)(contexts[points[p].ctx_index] - 1);
        ho_need = need > ho_need ? need : ho_need;
    }
    /* every token the search reads from the corpus: without --heldout the validation takes the tokens after them,
     * so it never scores text a fit, a sensitivity, the proxy or the selection saw */
    const size_t corpus_used = (size_t)fit_tokens + extra + select_need + table_need;
    if ((s = kv_tool_tokenize_file_max(&ids, &n_ids, corpus_sha, tok, corpus,
                                       corpus_used + (heldout ? 0 : ho_need))) != KV_OK)
        goto fail;
    if (n_ids < (size_t)fit_tokens + sens_need) {
        s = KV_ERR(KV_EINVAL, "corpus '%s' has %zu tokens; the fits take %ld and the sensitivities %zu more", corpus,
                   n_ids, fit_tokens, sens_need);
        goto fail;
    }
    if (select_chunks > 0 && n_ids < (size_t)fit_tokens + extra + select_need + table_need) {
        s = KV_ERR(KV_EINVAL, "corpus '%s' has %zu tokens; the fits take %ld, the sensitivities and the proxy %zu, and "
                   "the selection %zu more (%ld chunks of %ld tokens; --select-chunks 0: no selection)%s", corpus, n_ids,
                   fit_tokens, extra, select_need + table_need, select_chunks, max_ctx,
                   table_need ? ", twice with --pruned-layers" : "");
        goto fail;
    }
    if (heldout) {
        if ((s = kv_tool_tokenize_file_max(&ho, &n_ho, NULL, tok, heldout, ho_need)) != KV_OK) goto fail;
    } else {
        n_ho = n_ids > corpus_used ? n_ids - corpus_used : 0;
        if (n_ho > 0) {
            if (!(ho = malloc(n_ho * sizeof *ho))) {
                s = KV_ERR(KV_ENOMEM, "out of memory (%zu held-out tokens)", n_ho);
                goto fail;
            }
            memcpy(ho, ids + corpus_used, n_ho * sizeof *ho);
        }
    }
    /* every point is validated on at least one chunk of its context: checked before any fit */
    for (int k = 0; k < n_ctx; k++)
        if (n_ho < (size_t)(contexts[k] - 1)) {
            if (heldout)
                s = KV_ERR(KV_EINVAL, "--heldout '%s' has %zu tokens, fewer than one validation chunk of %ld at "
                           "--context %ld: use a longer held-out text or a shorter --context", heldout, n_ho,
                           contexts[k] - 1, contexts[k]);
            else
                s = KV_ERR(KV_EINVAL, "corpus '%s' has %zu tokens: the search reads the first %zu and, without "
                           "--heldout, validates on the tokens after them, fewer than one chunk of %ld at --context "
                           "%ld: give --heldout FILE or a longer corpus", corpus, n_ids, corpus_used,
                           contexts[k] - 1, contexts[k]);
            goto fail;
        }
    if (!heldout)
        kv_log(KV_LOG_INFO, "search: no --heldout: the plans are validated on the corpus's tokens %zu..%zu, after (and "
               "disjoint from) every token the fits, sensitivities, proxy and selection read", corpus_used,
               corpus_used + (n_ho < ho_need ? n_ho : ho_need));
    {   /* the memory of the largest step, before any fit: the validation at the longest --context (the exact
         * and the compressed forward side by side: two hidden-state buffers, the f32 exact cache and at most
         * as much for the compressed one, the forward workspace over the whole chunk) */
        const kv_arch *ar = kv_model_arch(m);
        const double c = (double)max_ctx, kvd = (double)ar->n_kv_heads * ar->head_dim;
        const double est = (double)kv_model_weight_bytes(m) + 2.0 * c * ar->d_model * 4.0 +
                           2.0 * c * ar->n_layers * 2.0 * kvd * 4.0 + kv_model_forward_bytes(m, c, c) +
                           4.0 * ((double)n_ids + (double)n_ho);
        char what[160];
        snprintf(what, sizeof what, "the validation at --context %ld on this model (%d layers, %d KV heads of %d)",
                 max_ctx, ar->n_layers, ar->n_kv_heads, ar->head_dim);
        if ((s = kv_tool_check_memory(est, what)) != KV_OK) goto fail;
    }
    const int32_t bos = kv_tokenizer_bos(tok);
    const kv_arch *arch = kv_model_arch(m);
    const int L = arch->n_layers, n_items = 2 * L;
    const size_t table_len = (size_t)n_items * nc;
    bytes = calloc(table_len * n_ctx, sizeof *bytes);
    values = calloc(table_len * n_ctx, sizeof *values);
    kl = calloc(table_len, sizeof *kl);
    allowed = malloc(table_len);
    fit_s = calloc((size_t)nc, sizeof *fit_s);
    rho = calloc((size_t)2 * nc, sizeof *rho);
    if (!bytes || !values || !kl || !allowed || !fit_s || !rho) {
        s = KV_ERR(KV_ENOMEM, "out of memory");
        goto fail;
    }
    for (int p = 0; p < n_points; p++) {
        if (!(points[p].choice = calloc((size_t)n_items, sizeof *points[p].choice)) ||
            (n_lopt > 0 && !(points[p].layers = calloc((size_t)n_pruned, sizeof *points[p].layers)))) {
            s = KV_ERR(KV_ENOMEM, "out of memory");
            goto fail;
        }
        for (int j = 0; j < n_pruned && n_lopt > 0; j++)
            if (!(points[p].layers[j].choice = calloc((size_t)L, sizeof *points[p].layers[j].choice))) {
                s = KV_ERR(KV_ENOMEM, "out of memory");
                goto fail;
            }
    }
    /* ---- 1. fit each candidate once ---- */
    int nk;
    const kv_search_candidate *table = kv_search_candidates(&nk);
    char seq_set[64], tok_set[64];
    snprintf(seq_set, sizeof seq_set, "data.seq_len=%ld", fit_seq);
    snprintf(tok_set, sizeof tok_set, "data.max_tokens=%ld", fit_tokens);
    common = calloc((size_t)n_sets + 2, sizeof *common);
    if (!common) {
        s = KV_ERR(KV_ENOMEM, "out of memory");
        goto fail;
    }
    common[0] = seq_set, common[1] = tok_set;
    for (int i = 0; i < n_sets; i++) common[2 + i] = sets[i];
    const int n_common = n_sets + 2;
    const kv_search_candidate *cands[MAX_CANDS]; /* by position in --candidates */
    int any_aqua = 0, any_spliced = 0;
    for (int c = 0; c < nc; c++) {
        cands[c] = &table[cidx[c]];
        any_aqua |= kv_search_candidate_predicted(cands[c]);
        any_spliced |= kv_search_candidate_spliced(cands[c]);
    }
    kv_search_allowed(allowed, cands, nc, L);
    if (any_aqua && any_spliced && strcmp(pred_inputs, "free") == 0) {
        rc = kv_cli_usage_error(tool, "--predictor-inputs free with AQUA-KV and SQuat or shared-codes candidates: a "
                                "predictor could read one of their streams, which the mixed refit fits as a "
                                "placeholder (use chained)");
        goto end;
    }
    /* the chain: with AQUA-KV candidates (and unless --predictor-inputs free) a predicted stream is taken only
     * above AQUA-KV inputs; a shared-codes stream only above its codes */
    if ((s = kv_search_chain_init(&chain, cands, nc, L, strcmp(pred_inputs, "chained") == 0)) != KV_OK) {
        rc = kv_cli_usage_error(tool, "%s", kv_error_last());
        goto end;
    }
    if (chain.n_classes > 1) chain_p = &chain;
    /* with AQUA-KV candidates a chosen mix is refitted: refuse what a refit cannot carry before any fit */
    if (any_aqua && (s = kv_search_refit_check(cands, nc, common, n_common)) != KV_OK) goto fail;
    /* every candidate's configuration is checked against the model before the first fit: a refusal (key groups
     * that do not divide cache.recent, a pruning combination) costs nothing */
    for (int c = 0; c < nc && s == KV_OK; c++) {
        kv_fit_config cfg;
        if ((s = kv_search_candidate_config(&cfg, cands[c], common, n_common)) != KV_OK) break;
        s = kv_fit_check(&cfg, arch);
        /* a sensitivity chunk no longer than the f16 sinks and window compresses nothing: every KL would be 0 */
        if (s == KV_OK && sens_ctx <= (long)cfg.cache.sinks + cfg.cache.recent)
            s = KV_ERR(KV_EINVAL, "--sens-ctx %ld: the cache keeps the first %d (sinks) and last %d (cache.recent) "
                       "tokens in f16, so chunks of %ld tokens compress nothing and measure no sensitivity: use more "
                       "than %d", sens_ctx, cfg.cache.sinks, cfg.cache.recent, sens_ctx,
                       cfg.cache.sinks + cfg.cache.recent);
        kv_fit_config_free(&cfg);
        if (s != KV_OK) kv_error_wrap(s, "candidate %s: ", cands[c]->name);
    }
    for (int j = 0; j < n_pruned && s == KV_OK; j++) { /* what the runtime cannot prune: predictors, shared codes */
        kv_fit_config cfg;
        if ((s = kv_search_pruned_config(&cfg, &pruned[j], common, n_common)) != KV_OK) break;
        s = kv_fit_check(&cfg, arch);
        kv_fit_config_free(&cfg);
        if (s != KV_OK) kv_error_wrap(s, "--pruned %s: ", pruned[j].name);
    }
    if (s != KV_OK) goto fail;
    const fit_inputs fin = {m, mf, arch, ids, fit_tokens, kv_tokenizer_add_bos_default(tok) ? bos : -1, corpus_sha,
                            gcache};
    double seconds_fit = 0;
    for (int c = 0; c < nc && s == KV_OK; c++) {
        kv_fit_config cfg;
        if ((s = kv_search_candidate_config(&cfg, cands[c], common, n_common)) != KV_OK) break;
        const double tf = kv_now_seconds();
        kv_log(KV_LOG_INFO, "search: fitting candidate %s (%s)", cands[c]->name, cands[c]->what);
        s = fit_with(&plans[c], &fin, &cfg);
        fit_s[c] = kv_now_seconds() - tf;
        seconds_fit += fit_s[c];
        kv_fit_config_free(&cfg);
        if (s != KV_OK) kv_error_wrap(s, "candidate %s: ", cands[c]->name);
    }
    if (s != KV_OK) goto fail;
    /* ---- 2. honest bytes per (context, layer, stream, candidate) ---- */
    double tb = kv_now_seconds();
    {
        uint64_t *b1 = malloc((size_t)n_items * sizeof *b1), *v1 = malloc((size_t)n_items * sizeof *v1);
        if (!b1 || !v1) s = KV_ERR(KV_ENOMEM, "out of memory");
        for (int k = 0; k < n_ctx && s == KV_OK; k++)
            for (int c = 0; c < nc && s == KV_OK; c++) {
                if ((s = kv_search_stream_bytes(b1, v1, plans[c], m, (int)contexts[k])) != KV_OK) break;
                for (int i = 0; i < n_items; i++) {
                    bytes[table_len * k + (size_t)i * nc + c] = b1[i];
                    values[table_len * k + (size_t)i * nc + c] = v1[i];
                }
                for (int i = 0; i < n_items; i++)
                    if (v1[i] != values[table_len * k + (size_t)i * nc]) {
                        s = KV_ERR(KV_EINVAL, "layer %d %s: candidates hold different numbers of values (token pruning "
                                   "enters through --pruned, not --set)", i / 2, i % 2 ? "V" : "K");
                        break;
                    }
            }
        free(b1);
        free(v1);
        if (s != KV_OK) goto fail;
    }
    const double seconds_bytes = kv_now_seconds() - tb;
    /* each point's budget: sum of bytes <= B / 8 * values (every stream holds the same values); a point below
     * the cheapest assembly is refused (one point) or reported without a plan (several), before the
     * sensitivities */
    int n_feasible = 0;
    for (int p = 0; p < n_points; p++) {
        search_point *pt = &points[p];
        const uint64_t *by = bytes + table_len * pt->ctx_index, *va = values + table_len * pt->ctx_index;
        uint64_t total_values = 0, cheapest = 0;
        for (int i = 0; i < n_items; i++) total_values += va[(size_t)i * nc];
        if ((s = kv_search_cheapest(&cheapest, NULL, by, allowed, chain_p, n_items, nc)) != KV_OK) goto fail;
        pt->budget_bytes = (uint64_t)floor(pt->budget_bits * (double)total_values / 8.0);
        pt->cheapest_bits = 8.0 * (double)cheapest / (double)total_values;
        pt->assembly = pt->feasible = cheapest <= pt->budget_bytes;
        n_feasible += pt->feasible;
        if (!pt->feasible && n_pruned > 0) {
            kv_log(KV_LOG_INFO, "search: --budget-bits %g at --context %ld is below the cheapest assembly (%.4f bits): "
                   "only a pruned contender can serve it", pt->budget_bits, contexts[pt->ctx_index], pt->cheapest_bits);
        } else if (!pt->feasible) {
            s = KV_ERR(KV_EINVAL, "--budget-bits %g at --context %ld is below the cheapest assembly of these "
                       "candidates, %.4f honest bits per value (f16 sinks and window included; a longer context "
                       "amortizes them)", pt->budget_bits, contexts[pt->ctx_index], pt->cheapest_bits);
            if (n_points == 1) goto fail;
            kv_log(KV_LOG_WARN, "search: %s: no plan for this point", kv_error_last());
            s = KV_OK;
        }
    }
    if (n_feasible == 0 && n_pruned == 0) {
        s = KV_ERR(KV_EINVAL, "every budget is below the cheapest assembly of these candidates at its context");
        goto fail;
    }
    /* ---- 3. sensitivities on calibration tokens the fits did not see ---- */
    double seconds_sens = 0;
    const int32_t *sens_tok = ids + fit_tokens;
    const size_t n_sens_tok = n_ids - (size_t)fit_tokens < extra ? n_ids - (size_t)fit_tokens : extra;
    const int32_t *sel_tok = ids + fit_tokens + extra; /* the selection's: disjoint from both (select_chunks > 0) */
    const size_t n_sel_tok = select_chunks > 0 ? n_ids - (size_t)fit_tokens - extra : 0;
    {
        kv_search_sens_options so = {(int)sens_ctx, (int)sens_samples, bos, "sensitivity", allowed};
        if ((s = kv_search_sensitivity(kl, m, (const kv_plan *const *)plans, nc, sens_tok, n_sens_tok, &so,
                                       &seconds_sens)) != KV_OK ||
            (s = kv_search_pair_increments(kl, cands, nc, L)) != KV_OK)
            goto fail;
    }
    /* ---- 4. the proxy: KVmix gradient importance, Spearman vs measured KL per stream and candidate ---- */
    double seconds_proxy = 0;
    for (int i = 0; i < 2 * nc; i++) rho[i] = NAN;
    if (prompts > 0) {
        kv_importance_options io = {(int)prompts, (int)sens_ctx, 0, bos, "importance", NULL};
        if ((s = kv_importance_run(&imp, m, sens_tok, n_sens_tok, &io)) != KV_OK) goto fail;
        seconds_proxy = imp.seconds;
        double *col = malloc((size_t)L * sizeof *col);
        for (int st = 0; col && st < 2; st++)
            for (int c = 0; c < nc; c++) {
                if (st == KV_PLAN_V && cands[c]->keys_only) continue; /* not measured */
                for (int l = 0; l < L; l++) col[l] = kl[(size_t)(2 * l + st) * nc + c];
                double r;
                if (L >= 2 && kv_rank_spearman(&r, st ? imp.v_mean : imp.k_mean, col, L) == KV_OK) rho[st * nc + c] = r;
            }
        free(col);
    }
    int n_evals = 0;
    for (size_t i = 0; i < table_len; i++) n_evals += allowed[i];
    /* ---- 4b. the selection's measurements: each single method (a candidate offered on every stream) through
     * its own fit at each context on calibration tokens, and the context scale of every candidate's
     * sensitivities (kv_search_context_scale, SEARCH.md §5.3) ---- */
    double seconds_select = 0;
    const mix_inputs mix = {&fin, cands, plans, nc, L, common, n_common};
    const select_tokens sel = {m, sel_tok, n_sel_tok, bos, select_chunks};
    const select_tokens tab = {m, sel_tok + select_need, table_need, bos, select_chunks}; /* --pruned-layers */
    if (select_chunks > 0) {
        const double ts = kv_now_seconds();
        sel_single = malloc((size_t)n_ctx * nc * sizeof *sel_single);
        scale = malloc((size_t)n_ctx * nc * sizeof *scale);
        kl_scaled = malloc(table_len * n_ctx * sizeof *kl_scaled);
        single_bytes = calloc((size_t)n_ctx * nc, sizeof *single_bytes);
        choice2 = malloc((size_t)n_items * sizeof *choice2);
        if (!sel_single || !scale || !kl_scaled || !single_bytes || !choice2) {
            s = KV_ERR(KV_ENOMEM, "out of memory");
            goto fail;
        }
        for (int k = 0; k < n_ctx && s == KV_OK; k++) {
            for (int c = 0; c < nc && s == KV_OK; c++) {
                int everywhere = 1;
                for (int i = 0; i < n_items; i++) {
                    everywhere &= allowed[(size_t)i * nc + c];
                    single_bytes[k * nc + c] += bytes[table_len * k + (size_t)i * nc + c];
                }
                sel_single[k * nc + c] = NAN;
                if (!everywhere) continue;
                char label[96];
                snprintf(label, sizeof label, "selection %s ctx %ld", cands[c]->name, contexts[k]);
                s = select_kl(&sel_single[k * nc + c], NULL, &sel, plans[c], contexts[k], label);
            }
            if (s == KV_OK)
                s = kv_search_context_scale(kl_scaled + table_len * k, scale + (size_t)k * nc, kl,
                                            sel_single + (size_t)k * nc, n_items, nc);
        }
        /* each pruned contender (§5.4): its candidate's fit under H2O, KL and honest bits on the same chunks */
        if (s == KV_OK && n_pruned > 0 &&
            (!(pr_kl = malloc((size_t)n_ctx * n_pruned * sizeof *pr_kl)) ||
             !(pr_bits = malloc((size_t)n_ctx * n_pruned * sizeof *pr_bits))))
            s = KV_ERR(KV_ENOMEM, "out of memory");
        for (int k = 0; k < n_ctx && s == KV_OK && n_pruned > 0; k++)
            for (int j = 0; j < n_pruned && s == KV_OK; j++) {
                layered lp;
                char label[128];
                snprintf(label, sizeof label, "selection %s ctx %ld", pruned[j].name, contexts[k]);
                if ((s = layered_plan(&lp, plans, nc, pruned_pos[j], &pruned[j], NULL, NULL, NULL)) == KV_OK) {
                    s = select_kl(&pr_kl[k * n_pruned + j], &pr_bits[k * n_pruned + j], &sel, lp.plan, contexts[k],
                                  label);
                    layered_release(&lp);
                }
                if (s != KV_OK) kv_error_wrap(s, "--pruned %s at context %ld: ", pruned[j].name, contexts[k]);
            }
        /* with --pruned-layers, each contender's per-layer table (§5.5) */
        const size_t ly_len = (size_t)L * (size_t)n_lopt; /* one table */
        if (s == KV_OK && n_lopt > 0 &&
            (!(ly_dkl = malloc((size_t)n_ctx * n_pruned * ly_len * sizeof *ly_dkl)) ||
             !(ly_dbits = malloc((size_t)n_ctx * n_pruned * ly_len * sizeof *ly_dbits)) ||
             !(ly_kl = malloc((size_t)n_ctx * n_pruned * sizeof *ly_kl)) ||
             !(ly_bits = malloc((size_t)n_ctx * n_pruned * sizeof *ly_bits))))
            s = KV_ERR(KV_ENOMEM, "out of memory");
        for (int k = 0; k < n_ctx && s == KV_OK && n_lopt > 0; k++)
            for (int j = 0; j < n_pruned && s == KV_OK; j++) {
                const size_t off = ((size_t)k * n_pruned + (size_t)j) * ly_len;
                s = measure_layer_table(ly_dkl + off, ly_dbits + off, &ly_kl[k * n_pruned + j], &ly_bits[k * n_pruned + j],
                                        &tab, plans, nc, pruned_pos[j], &pruned[j], lopts, n_lopt, contexts[k], cands);
                if (s != KV_OK) kv_error_wrap(s, "--pruned-layers, %s at context %ld: ", pruned[j].name, contexts[k]);
            }
        seconds_select = kv_now_seconds() - ts;
        if (s != KV_OK) goto fail;
    }
    /* ---- 5. per point: the choice under its budget, the plan assembled, written, validated ---- */
    double seconds_eval = 0;
    for (int p = 0; p < n_points; p++) {
        search_point *pt = &points[p];
        if (!pt->assembly && n_pruned == 0) continue;
        const long context = contexts[pt->ctx_index];
        const uint64_t *by = bytes + table_len * pt->ctx_index, *va = values + table_len * pt->ctx_index;
        const int k = pt->ctx_index;
        kv_plan *plan = NULL;
        int plan_owned = 1; /* 0: plans[c] itself (a single method: the knapsack's choice or the selection's) */
        double best = INFINITY; /* the selection's least KL so far */
        double ts = kv_now_seconds(); /* the selection's start (after the knapsack's own plan is built) */
        pt->sel_kl[0] = pt->sel_kl[1] = NAN;
        if (pt->assembly) {
            if ((s = kv_search_allocate(pt->choice, by, kl, allowed, chain_p, n_items, nc, pt->budget_bytes, 0,
                                        &pt->unit)) != KV_OK) {
                kv_error_wrap(s, "--budget-bits %g at --context %ld: ", pt->budget_bits, context);
                goto fail;
            }
            const int single = single_of(pt->choice, n_items);
            if (single >= 0) { /* the single method's own fit: no assembly, no refit */
                kv_log(KV_LOG_INFO, "search: budget %g at context %ld: the choice is %s on every stream, its own fit",
                       pt->budget_bits, context, cands[single]->name);
                plan = plans[single], plan_owned = 0, pt->refit = 0, pt->seconds_refit = 0;
            } else if ((s = build_mix(&plan, &pt->refit, &pt->seconds_refit, &mix, pt->choice, pt->budget_bits,
                                      context)) != KV_OK) {
                goto fail;
            }
            pt->selected = SEL_KNAPSACK;
            ts = kv_now_seconds();
            if (select_chunks > 0) { /* measure, on calibration tokens at this context, what to keep (SEARCH.md §5.3) */
                /* a single method was measured in 4b on the same chunks: its KL is reused, not measured again */
                if (single >= 0) pt->sel_kl[0] = sel_single[k * nc + single];
                if ((single < 0 && (s = select_kl(&pt->sel_kl[0], NULL, &sel, plan, context, NULL)) != KV_OK) ||
                    (s = kv_search_allocate(choice2, by, kl_scaled + table_len * k, allowed, chain_p, n_items, nc,
                                            pt->budget_bytes, 0, NULL)) != KV_OK) {
                    if (plan_owned) kv_plan_free(plan);
                    goto fail;
                }
                best = pt->sel_kl[0];
                const int single2 = single_of(choice2, n_items);
                if (single2 >= 0 && single2 != single) {
                    pt->sel_kl[1] = sel_single[k * nc + single2]; /* a single method: the loop below may keep it */
                } else if (memcmp(choice2, pt->choice, (size_t)n_items * sizeof *choice2) != 0) {
                    kv_plan *plan2 = NULL;
                    int refit2;
                    double sec2;
                    s = build_mix(&plan2, &refit2, &sec2, &mix, choice2, pt->budget_bits, context);
                    pt->seconds_refit += sec2;
                    if (s == KV_OK) s = select_kl(&pt->sel_kl[1], NULL, &sel, plan2, context, NULL);
                    if (s != KV_OK) {
                        kv_plan_free(plan2);
                        if (plan_owned) kv_plan_free(plan);
                        goto fail;
                    }
                    if (pt->sel_kl[1] < best) {
                        if (plan_owned) kv_plan_free(plan);
                        plan = plan2, plan_owned = 1, best = pt->sel_kl[1], pt->refit = refit2,
                        pt->selected = SEL_CORRECTED;
                        memcpy(pt->choice, choice2, (size_t)n_items * sizeof *choice2);
                    } else {
                        kv_plan_free(plan2);
                    }
                }
                for (int c = 0; c < nc; c++) /* a single method within the budget that measured less */
                    if (isfinite(sel_single[k * nc + c]) && single_bytes[k * nc + c] <= pt->budget_bytes &&
                        sel_single[k * nc + c] < best)
                        best = sel_single[k * nc + c], pt->selected = SEL_SINGLE, pt->single = c;
            }
        }
        /* a pruned contender whose bits (measured at this context) fit the budget and that measured less (§5.4) */
        for (int j = 0; j < n_pruned; j++)
            if (pr_bits[k * n_pruned + j] <= pt->budget_bits && pr_kl[k * n_pruned + j] < best)
                best = pr_kl[k * n_pruned + j], pt->selected = SEL_PRUNED, pt->pruned = j;
        /* each contender with per-layer options allocated under this budget, measured (§5.5) */
        for (int j = 0; j < n_pruned && n_lopt > 0 && s == KV_OK; j++) {
            const size_t off = ((size_t)k * n_pruned + (size_t)j) * (size_t)L * (size_t)n_lopt;
            const kv_search_layer_table t = {L, n_lopt, ly_dkl + off, ly_dbits + off, pr_kl[k * n_pruned + j],
                                             pr_bits[k * n_pruned + j]};
            const layered_contender lc = {&pruned[j], pruned_pos[j], j, lopts, &t};
            s = try_layered(pt, &best, &lc, plans, nc, &sel, context);
        }
        if (s != KV_OK) {
            if (plan_owned) kv_plan_free(plan);
            goto fail;
        }
        if (!pt->assembly && pt->selected != SEL_PRUNED) { /* no assembly, no pruned contender fits */
            pt->feasible = 0;
            s = KV_ERR(KV_EINVAL, "--budget-bits %g at --context %ld is below the cheapest assembly of these candidates "
                       "(%.4f honest bits per value) and below every pruned contender's measured bits",
                       pt->budget_bits, context, pt->cheapest_bits);
            if (n_points == 1) goto fail;
            kv_log(KV_LOG_WARN, "search: %s: no plan for this point", kv_error_last());
            s = KV_OK;
            continue;
        }
        pt->feasible = 1;
        layered lp = {0}; /* SEL_PRUNED: the contender's plan, its pruning restored (or the assembly freed) after */
        if (pt->selected == SEL_SINGLE || pt->selected == SEL_PRUNED) {
            if (plan_owned) kv_plan_free(plan);
            plan = NULL, plan_owned = 0, pt->refit = 0;
            if (pt->selected == SEL_SINGLE) {
                plan = plans[pt->single];
                for (int i = 0; i < n_items; i++) pt->choice[i] = pt->single;
            } else {
                if ((s = layered_plan(&lp, plans, nc, pruned_pos[pt->pruned], &pruned[pt->pruned], lopts,
                                      pt->layered ? pt->layers[pt->pruned].choice : NULL, pt->choice)) != KV_OK)
                    goto fail;
                plan = lp.plan;
            }
        }
        if (select_chunks > 0) {
            pt->seconds_select = kv_now_seconds() - ts;
            seconds_select += pt->seconds_select;
        }
        uint64_t chosen_bytes = 0, total_values = 0;
        for (int i = 0; i < n_items; i++) {
            pt->predicted_kl += kl[(size_t)i * nc + pt->choice[i]];
            chosen_bytes += by[(size_t)i * nc + pt->choice[i]];
            total_values += va[(size_t)i * nc];
        }
        pt->predicted_bits = 8.0 * (double)chosen_bytes / (double)total_values;
        if (pt->selected == SEL_PRUNED) /* the sensitivities do not model pruning; its bits were measured (§5.4) */
            pt->predicted_kl = NAN, pt->predicted_bits = pt->layered ? pt->layers[pt->pruned].bits
                                                                    : pr_bits[k * n_pruned + pt->pruned];
        kv_plan_provenance pv;
        memset(&pv, 0, sizeof pv);
        char ver[64], yaml[8192];
        snprintf(ver, sizeof ver, "kvcal %s", KV_VERSION_STRING);
        pv.tool_version = ver;
        pv.corpus_sha256 = corpus_sha;
        point_yaml(yaml, sizeof yaml, pt, context, plan, L, select_chunks > 0, pruned, cands);
        pv.config_yaml = yaml;
        if ((s = kv_plan_creation_time(&pv.created)) == KV_OK) s = kv_plan_set_provenance(plan, &pv);
        if (s == KV_OK && out_dir && kv_mkdir_p(out_dir) != 0)
            s = KV_ERR(KV_EIO, "--out-dir '%s': cannot create it: %s", out_dir, strerror(errno));
        if (s == KV_OK) s = kv_plan_write(plan, pt->path, NULL);
        if (plan_owned) kv_plan_free(plan);
        layered_release(&lp);
        if (s != KV_OK) goto fail;
        /* the additivity gap on the very tokens the sensitivities saw, then the end-to-end validation */
        const double tv = kv_now_seconds();
        if ((s = kv_eval_plan(&pt->ev_same, m, model, pt->path, sens_tok, n_sens_tok, (int)sens_ctx, bos,
                                   (size_t)sens_samples, 0, 0, NULL)) != KV_OK ||
            (s = kv_eval_plan(&pt->ev, m, model, pt->path, ho, n_ho, (int)context, bos, pt->eval_chunks, 0, 0,
                                   "validation")) != KV_OK)
            goto fail;
        pt->seconds_eval = kv_now_seconds() - tv;
        seconds_eval += pt->seconds_eval;
    }
    {   /* with --pruned, every point may have been refused one by one: no plan at all is a failure */
        int n_plans = 0;
        for (int p = 0; p < n_points; p++) n_plans += points[p].feasible;
        if (n_plans == 0) {
            s = KV_ERR(KV_EINVAL, "no point got a plan: every --budget-bits is below the cheapest assembly of these "
                       "candidates and below every pruned contender's measured bits");
            goto fail;
        }
    }
    /* ---- report ---- */
    if (json) {
        printf("{\n  \"heldout\": ");
        if (heldout) kv_tool_json_string(stdout, heldout);
        else printf("\"corpus tokens from %zu\"", corpus_used);
        printf(",\n  \"budget_bits\": [");
        for (int b = 0; b < n_budgets; b++) printf("%s%.6g", b ? ", " : "", budgets[b]);
        printf("], \"contexts\": [");
        for (int k = 0; k < n_ctx; k++) printf("%s%ld", k ? ", " : "", contexts[k]);
        printf("],\n  \"candidates\": [");
        for (int c = 0; c < nc; c++) {
            printf("%s\n    {\"name\": \"%s\", \"fit_s\": %.3f, \"rho_k\": ", c ? "," : "", table[cidx[c]].name, fit_s[c]);
            if (isfinite(rho[c])) printf("%.4f", rho[c]); else printf("null");
            printf(", \"rho_v\": ");
            if (isfinite(rho[nc + c])) printf("%.4f", rho[nc + c]); else printf("null");
            if (select_chunks > 0) { /* per context: its own plan's selection KL (null: not a single method), scale */
                printf(", \"select_kl\": [");
                for (int k = 0; k < n_ctx; k++)
                    if (isfinite(sel_single[k * nc + c])) printf("%s%.6g", k ? ", " : "", sel_single[k * nc + c]);
                    else printf("%snull", k ? ", " : "");
                printf("], \"context_scale\": [");
                for (int k = 0; k < n_ctx; k++) printf("%s%.6g", k ? ", " : "", scale[k * nc + c]);
                printf("]");
            }
            printf("}");
        }
        printf("\n  ],\n  \"pruned\": [");
        for (int j = 0; j < n_pruned; j++) { /* per context: KL and honest bits on the selection's chunks */
            printf("%s\n    {\"name\": \"%s\", \"candidate\": \"%s\", \"method\": \"%s\", \"budget\": %.9g, "
                   "\"select_kl\": [", j ? "," : "", pruned[j].name, cands[pruned_pos[j]]->name,
                   kv_plan_prune_name(pruned[j].method), pruned[j].budget);
            for (int k = 0; k < n_ctx; k++) printf("%s%.9g", k ? ", " : "", pr_kl[k * n_pruned + j]);
            printf("], \"bits\": [");
            for (int k = 0; k < n_ctx; k++) printf("%s%.9g", k ? ", " : "", pr_bits[k * n_pruned + j]);
            printf("]");
            if (n_lopt > 0) { /* per context, [layer][option]: the changes with that layer alone on the option */
                printf(",\n     \"layers\": {\"kl\": [");
                for (int k = 0; k < n_ctx; k++) printf("%s%.9g", k ? ", " : "", ly_kl[k * n_pruned + j]);
                printf("], \"bits\": [");
                for (int k = 0; k < n_ctx; k++) printf("%s%.9g", k ? ", " : "", ly_bits[k * n_pruned + j]);
                printf("], \"options\": [");
                for (int o = 0; o < n_lopt; o++)
                    printf("%s{\"candidate\": \"%s\", \"multiplier\": %.9g, \"budget\": %.9g}", o ? ", " : "",
                           cands[lopts[o].cand]->name, lopts[o].mult,
                           kv_search_layer_budget(pruned[j].budget, lopts[o].mult));
                for (int w = 0; w < 2; w++) {
                    printf("], \"%s\": [", w ? "dbits" : "dkl");
                    for (int k = 0; k < n_ctx; k++) {
                        const double *d =
                            (w ? ly_dbits : ly_dkl) + ((size_t)k * n_pruned + (size_t)j) * (size_t)L * n_lopt;
                        printf("%s[", k ? ", " : "");
                        for (int l = 0; l < L; l++) {
                            printf("%s[", l ? ", " : "");
                            for (int o = 0; o < n_lopt; o++) printf("%s%.9g", o ? ", " : "", d[(size_t)l * n_lopt + o]);
                            printf("]");
                        }
                        printf("]");
                    }
                }
                printf("]}");
            }
            printf("}");
        }
        printf("%s],\n  \"streams\": [", n_pruned ? "\n  " : "");
        for (int i = 0; i < n_items; i++) {
            printf("%s\n    {\"layer\": %d, \"stream\": \"%s\", \"kl\": [", i ? "," : "", i / 2, i % 2 ? "V" : "K");
            for (int c = 0; c < nc; c++) {
                const double v = kl[(size_t)i * nc + c];
                if (isfinite(v)) printf("%s%.6g", c ? ", " : "", v); else printf("%snull", c ? ", " : ""); /* not offered */
            }
            printf("], \"bits\": [");
            for (int k = 0; k < n_ctx; k++) {
                printf("%s[", k ? ", " : "");
                for (int c = 0; c < nc; c++) {
                    const size_t q = table_len * k + (size_t)i * nc + c;
                    printf("%s%.6g", c ? ", " : "", 8.0 * (double)bytes[q] / (double)values[q]);
                }
                printf("]");
            }
            printf("]");
            if (prompts > 0) printf(", \"importance\": %.6g", i % 2 ? imp.v_mean[i / 2] : imp.k_mean[i / 2]);
            printf("}");
        }
        printf("\n  ],\n  \"plans\": [");
        for (int p = 0; p < n_points; p++) {
            const search_point *pt = &points[p];
            printf("%s\n    {\"plan\": ", p ? "," : "");
            if (pt->feasible) kv_tool_json_string(stdout, pt->path); else printf("null");
            printf(", \"budget_bits\": %.9g, \"context\": %ld, \"feasible\": %s, \"assembly\": %s, "
                   "\"cheapest_bits\": %.6f", pt->budget_bits, contexts[pt->ctx_index], pt->feasible ? "true" : "false",
                   pt->assembly ? "true" : "false", pt->cheapest_bits);
            if (!pt->feasible) {
                printf("}");
                continue;
            }
            printf(",\n     \"budget_bytes\": %llu, \"unit_bytes\": %llu, \"choices\": [",
                   (unsigned long long)pt->budget_bytes, (unsigned long long)pt->unit);
            for (int i = 0; i < n_items; i++) printf("%s\"%s\"", i ? ", " : "", table[cidx[pt->choice[i]]].name);
            printf("],\n     \"refit\": %s, \"seconds_refit\": %.3f,\n", pt->refit ? "true" : "false",
                   pt->seconds_refit);
            printf("     \"predicted\": {\"kl_sum\": ");
            if (isfinite(pt->predicted_kl)) printf("%.6g", pt->predicted_kl); else printf("null"); /* pruned */
            printf(", \"bits_per_value_total\": %.9f},\n", pt->predicted_bits);
            if (select_chunks > 0) {
                printf("     \"selection\": {\"kept\": \"%s\", \"single\": ", k_sel_names[pt->selected]);
                if (pt->selected == SEL_SINGLE) printf("\"%s\"", cands[pt->single]->name); else printf("null");
                printf(", \"pruned\": ");
                if (pt->selected == SEL_PRUNED) printf("\"%s\"", pruned[pt->pruned].name); else printf("null");
                printf(", \"ctx\": %ld, \"chunks\": %ld, \"kl_knapsack\": ", contexts[pt->ctx_index], select_chunks);
                if (isfinite(pt->sel_kl[0])) printf("%.6g", pt->sel_kl[0]); else printf("null"); /* no assembly */
                printf(", \"kl_corrected\": ");
                if (isfinite(pt->sel_kl[1])) printf("%.6g", pt->sel_kl[1]); else printf("null");
                printf(", \"singles_within_budget\": [");
                for (int c = 0, first = 1; c < nc; c++) {
                    const int q = pt->ctx_index * nc + c;
                    if (!isfinite(sel_single[q]) || single_bytes[q] > pt->budget_bytes) continue;
                    printf("%s{\"name\": \"%s\", \"kl\": %.6g}", first ? "" : ", ", cands[c]->name, sel_single[q]);
                    first = 0;
                }
                printf("], \"pruned_within_budget\": [");
                for (int j = 0, first = 1; j < n_pruned; j++) {
                    const int q = pt->ctx_index * n_pruned + j;
                    if (pr_bits[q] > pt->budget_bits) continue;
                    printf("%s{\"name\": \"%s\", \"kl\": %.9g, \"bits\": %.9g}", first ? "" : ", ", pruned[j].name,
                           pr_kl[q], pr_bits[q]);
                    first = 0;
                }
                printf("], \"layered\": %s, \"pruned_layers\": [", pt->layered ? "true" : "false");
                for (int j = 0; j < n_pruned && n_lopt > 0; j++) { /* §5.5: per contender, its per-layer options here */
                    const layered_try *lt = &pt->layers[j];
                    printf("%s{\"name\": \"%s\", \"state\": \"%s\"", j ? ", " : "", pruned[j].name,
                           lt->state == LAYERED_NONE   ? "none fits"
                           : lt->state == LAYERED_SAME ? "its own"
                                                       : "measured");
                    if (lt->state != LAYERED_NONE) {
                        printf(", \"budgets\": [");
                        for (int l = 0; l < L; l++)
                            printf("%s%.9g", l ? ", " : "", layer_fraction(&pruned[j], lopts, lt->choice[l]));
                        printf("], \"candidates\": [");
                        for (int l = 0; l < L; l++)
                            printf("%s\"%s\"", l ? ", " : "",
                                   cands[lt->choice[l] ? lopts[lt->choice[l] - 1].cand : pruned_pos[j]]->name);
                        printf("], \"predicted_kl\": %.9g, \"predicted_bits\": %.9g, \"kl\": %.9g, \"bits\": %.9g",
                               lt->predicted_kl, lt->predicted_bits, lt->kl, lt->bits);
                    }
                    printf("}");
                }
                printf("], \"seconds\": %.3f},\n", pt->seconds_select);
            }
            printf("     \"measured_same_tokens\": {\"kl_mean\": %.6g, \"ppl\": %.6g, \"ppl_ref\": %.6g, "
                   "\"bits_per_value_total\": %.9f, \"ctx\": %ld, \"chunks\": %ld},\n", pt->ev_same.cmp.kl_mean,
                   pt->ev_same.cmp.ppl, pt->ev_same.cmp.ppl_ref, pt->ev_same.bits_per_value_total, sens_ctx, sens_samples);
            printf("     \"measured_heldout\": {\"kl_mean\": %.6g, \"ppl\": %.6g, \"ppl_ref\": %.6g, \"top1_agreement\": "
                   "%.6f, \"bits_per_value_total\": %.9f, \"ctx\": %ld, \"chunks\": %zu, \"seconds\": %.3f}}",
                   pt->ev.cmp.kl_mean, pt->ev.cmp.ppl, pt->ev.cmp.ppl_ref, pt->ev.cmp.top1_agreement,
                   pt->ev.bits_per_value_total, contexts[pt->ctx_index], pt->ev.cmp.n_chunks, pt->seconds_eval);
        }
        printf("\n  ],\n  \"seconds\": {\"fits\": %.3f, \"bytes\": %.3f, \"sensitivity\": %.3f, \"proxy\": %.3f, "
               "\"selection\": %.3f, \"validation\": %.3f, \"total\": %.3f},\n  \"sensitivity_tokens\": %zu,\n  "
               "\"predictor_inputs\": \"%s\"\n}\n", seconds_fit, seconds_bytes, seconds_sens, seconds_proxy,
               seconds_select, seconds_eval,
               kv_now_seconds() - t0, sens_need, any_aqua && strcmp(pred_inputs, "chained") == 0 ? "chained" : "free");
    } else {
        printf("kvcal search: %d candidate(s), %d point(s) (budget, context)%s\n", nc, n_points,
               any_aqua && strcmp(pred_inputs, "chained") == 0
                   ? "; AQUA-KV streams only above AQUA-KV inputs (--predictor-inputs chained)" : "");
        printf("proxy (KVmix importance) vs measured KL, Spearman per candidate:");
        for (int c = 0; c < nc; c++) printf(" %s K %.3f V %.3f;", table[cidx[c]].name, rho[c], rho[nc + c]);
        printf("\n");
        for (int p = 0; p < n_points; p++) {
            const int k = points[p].ctx_index;
            const pruned_at pa = {pruned, pr_kl ? pr_kl + k * n_pruned : NULL, pr_bits ? pr_bits + k * n_pruned : NULL,
                                  n_pruned, lopts, n_lopt};
            print_point_text(&points[p], contexts[k], table, cidx, nc, n_items, kl, allowed, bytes + table_len * k,
                             values + table_len * k, &pa, n_points == 1, sens_ctx, sens_samples);
        }
        printf("\ntime: fits %.1f s, bytes %.1f s, sensitivity %.1f s (%zu tokens x %d evaluations), proxy %.1f s, "
               "selection %.1f s, validation %.1f s, total %.1f s\n", seconds_fit, seconds_bytes, seconds_sens,
               sens_need, n_evals, seconds_proxy, seconds_select, seconds_eval, kv_now_seconds() - t0);
    }
    goto end;
fail:
    rc = kv_cli_fail(tool, s);
end:
    free(common);
    for (int c = 0; c < MAX_CANDS; c++) kv_plan_free(plans[c]);
    for (int p = 0; points && p < MAX_BUDGETS * MAX_CONTEXTS; p++) {
        free(points[p].choice);
        for (int j = 0; points[p].layers && j < n_pruned; j++) free(points[p].layers[j].choice);
        free(points[p].layers);
    }
    free(points);
    kv_importance_free(&imp);
    free(bytes);
    free(values);
    free(kl);
    free(allowed);
    kv_search_chain_free(&chain);
    free(fit_s);
    free(rho);
    free(sel_single);
    free(scale);
    free(kl_scaled);
    free(single_bytes);
    free(choice2);
    free(pr_kl);
    free(pr_bits);
    free(ly_dkl);
    free(ly_dbits);
    free(ly_kl);
    free(ly_bits);
    free(ids);
    free(ho);
    kv_tokenizer_free(tok);
    kv_model_free(m);
    kv_model_file_close(mf);
    kv_cli_args_free(&a);
    free(sets);
    free(gcache);
    return rc;
}
