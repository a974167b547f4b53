/* search_internal.h — what the files of kv_search_run share (search_run.c, search_fit.c, search_select.c,
 * search_point.c). Internal to calib/. */
#ifndef KV_SEARCH_INTERNAL_H
#define KV_SEARCH_INTERNAL_H

#include "kv_calib.h"

/* The selection's measure of a plan (kvrun eval --plan's code): its mean KL on these tokens at a context. */
typedef struct search_tokens {
    kv_model *m;
    const int32_t *tok;
    size_t n_tok;
    int32_t bos;
    long chunks;
} search_tokens;

/* One run: the request, the result it fills, and what the phases share. */
typedef struct search_run {
    const kv_search_request *req;
    kv_search_result *res;
    const kv_arch *arch;
    int L, n_items, nc;
    size_t table_len;                               /* n_items * nc: one [item][cand] table */
    const kv_search_candidate *cands[KV_SEARCH_MAX_CANDS]; /* by position in the request */
    kv_plan *plans[KV_SEARCH_MAX_CANDS];            /* each candidate's own fit */
    const char **common;                            /* the fit keys every candidate and a refit share */
    int n_common;
    char seq_set[64], tok_set[64];
    kv_search_chain chain;
    const kv_search_chain *chain_p;                 /* NULL: no rule applies */
    kv_search_tokens need;
    const int32_t *sens_tok;                        /* the sensitivities' and the proxy's tokens */
    size_t n_sens_tok;
    search_tokens sel, tab;                         /* the selection's chunks; the per-layer tables' */
    double *kl_scaled;                              /* [context][item][cand]: the context-corrected sensitivities */
    int *choice2;                                   /* a second choice per point */
    double *f16_tps;                                /* [context]: the f16 cache's decode tokens/s (0: not yet) */
} search_run;

/* search_fit.c: fits and plans */
/* Fit cfg on the request's calibration tokens (kv_fit_check first). */
kv_status kv_search_fit_with(kv_plan **out, const search_run *r, const kv_fit_config *cfg);
/* The plan of a choice: assembled from the candidates' fits, or (AQUA-KV streams) refitted layer-sequentially on the
 * mix's reconstructions with the spliced streams copied in after (*refit = 1, *seconds its time). */
kv_status kv_search_build_mix(kv_plan **out, int *refit, double *seconds, const search_run *r, const int *choice,
                              double budget, long context);
/* The candidate a choice takes on every stream, or -1. */
int kv_search_single_of(const int *choice, int n_items);
/* Mean KL of plan on st at ctx and (bits may be NULL) its bits_per_value_total there. */
kv_status kv_search_select_kl(double *kl, double *bits, const search_tokens *st, const kv_plan *plan, long ctx,
                              const char *label);

/* A pruned contender's plan with per-layer options: its candidate's own fit when every layer keeps that candidate
 * (its pruning saved, set, restored by kv_search_layered_release), else an assembly (owned, freed there). */
typedef struct search_layered {
    kv_plan *plan;
    int owned;
    kv_plan_global global; /* the candidate's own pruning, put back */
    float *layer;          /* n_layers prune_budget */
} search_layered;
/* Contender pr (candidate position base) with layer l on option opts[choice[l] - 1] (choice[l] 0, or choice NULL:
 * the contender's own); streams[2L], if not NULL, receives each stream's candidate position. */
kv_status kv_search_layered_plan(search_layered *out, kv_plan *const *plans, int nc, int base,
                                 const kv_search_pruned *pr, const kv_search_layer_opt *opts, const int *choice,
                                 int *streams);
void kv_search_layered_release(search_layered *lp);

/* search_select.c: the selection's measurements before the points (phase 4b) */
kv_status kv_search_select_measure(search_run *r);

/* search_speed.c: the decoding speed floor (SEARCH.md §7; each a no-op without min_decode_speed) */
/* Phase 2b: the cost model's tables (the weights' part, the f16 cache's, every candidate's per stream). */
kv_status kv_search_speed_measure(search_run *r);
/* The seconds of the cache's part of a step the floor allows at context k (<= 0: not even a free cache meets it). */
double kv_search_time_budget(const search_run *r, int k);
/* The predicted seconds of the cache's part: candidate c on every stream; a choice. */
double kv_search_single_seconds(const search_run *r, int k, int c);
double kv_search_choice_seconds(const search_run *r, int k, const int *choice);
/* After a point's plan is written: its decode speed measured end to end against the f16 cache (pt->measured_speed). */
kv_status kv_search_speed_check(search_run *r, kv_search_point *pt);

/* search_point.c: one point: the knapsack, the plan, the selection, the plan written and validated */
kv_status kv_search_point_run(search_run *r, kv_search_point *pt);

#endif
