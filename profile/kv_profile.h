/* kv_profile.h — the public header of profile/ (kvprof's library): KVmix layer importance, bit
 * allocation with recent-pivotal-context ratios, rank stability and the SVG importance chart.
 * kvmix.txt, "KV Importance Analysis", "Dynamic Pivotal Context Selection", appendix B. */
#ifndef KV_PROFILE_H
#define KV_PROFILE_H

#include "kv_common.h"
#include "kv_dist.h"
#include "kv_model.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Allocation parameters; kv_alloc_params_default() gives the paper's k2.19/v2.38 setting. */
typedef struct kv_alloc_params {
    double high_frac;  /* fraction of layers (by score) that get high bits: 0.2 */
    int k_high_bits;   /* 3 */
    int v_high_bits;   /* 4 */
    int k_low_bits;    /* 2 */
    int v_low_bits;    /* 2 */
    double rpc_high;   /* recent-pivotal-context ratio of high-bit streams: 0.2 */
    double rpc_low;    /* ... of low-bit streams: 0.1 */
} kv_alloc_params;

void kv_alloc_params_default(kv_alloc_params *p);
/* KV_EINVAL unless high_frac and the RPC ratios are in [0, 1] and every bit width is in
 * [KV_FIT_MIN_BITS, KV_FIT_MAX_BITS], the range kvcal fit accepts (so every fragment written loads). */
kv_status kv_alloc_params_check(const kv_alloc_params *p);

/* Per-layer result for the K and V streams. Arrays of n_layers, owned by the struct. */
typedef struct kv_alloc {
    int n_layers;
    int n_high;      /* floor(high_frac * n_layers): 6 of 32 gives the paper's 2.1875 / 2.375 */
    int *k_bits;
    int *v_bits;
    double *k_rpc;
    double *v_rpc;
    double k_avg_bits; /* mean of k_bits over layers (the paper's "k2.19") */
    double v_avg_bits;
} kv_alloc;

/* Importance-aware allocation: the n_high layers with the largest K scores get k_high_bits, and
 * independently the n_high layers with the largest V scores get v_high_bits (K and V of one layer
 * can differ, as in kvmix.txt Fig. 6). Ties go to the lower layer index (deterministic). */
kv_status kv_alloc_by_importance(kv_alloc *out, const double *k_scores, const double *v_scores,
                                 int n_layers, const kv_alloc_params *p);
/* The paper's "random" baseline: the same number of high-bit layers (so the same average bits),
 * chosen uniformly at random with the seed, independently for K and V. */
kv_status kv_alloc_random(kv_alloc *out, int n_layers, const kv_alloc_params *p, uint64_t seed);
/* Uniform allocation: every layer gets the low bits and low RPC ratio (rpc < 0 keeps p->rpc_low). */
kv_status kv_alloc_uniform(kv_alloc *out, int n_layers, int k_bits, int v_bits, double rpc);
void kv_alloc_free(kv_alloc *a);

/* Rank stability of two score vectors (e.g. from two disjoint prompt sets): Spearman's rank
 * correlation (average ranks for ties) and the overlap |A ∩ B| / n_top of their top-n_top sets. */
kv_status kv_rank_spearman(double *rho, const double *a, const double *b, int n);
kv_status kv_top_overlap(double *overlap, const double *a, const double *b, int n, int n_top);

/* SVG bar chart of K and V importance per layer (mean with a +-std whisker when std != NULL),
 * with the high-bit layers of `alloc` marked. Written atomically to path. */
kv_status kv_importance_svg_write(const char *path, const char *title, const double *k_mean,
                                  const double *k_std, const double *v_mean, const double *v_std,
                                  int n_layers, const kv_alloc *alloc);


/* ---- importance (importance.c) -------------------------------------------------------------- */
typedef struct kv_importance_options {
    int n_prompts;    /* P: 30 by default (the paper: 20-30 suffice) */
    int max_len;      /* tokens per prompt, BOS included (1024 by default) */
    uint64_t seed;    /* prompt sampling */
    int bos_id;       /* prepended when >= 0 */
    const char *progress_label;
    kv_dist *dist;    /* ranks sharing the prompts (prompt p on rank p mod ranks), or NULL: one process */
} kv_importance_options;

typedef struct kv_importance {
    int n_layers, n_prompts, prompt_len;
    double *k_scores, *v_scores; /* n_prompts x n_layers: ||dL/dW_k||_F, ||dL/dW_v||_F per prompt */
    double *k_mean, *k_std, *v_mean, *v_std; /* per layer over prompts (std: population) */
    double *losses;              /* per prompt: mean next-token cross-entropy */
    int64_t *prompt_starts;      /* per prompt: offset of its first corpus token */
    double seconds;              /* wall time of the forward+backward passes */
} kv_importance;

/* Sample P non-overlapping windows of the tokenized corpus with the seed (so that the first and
 * second halves of the prompt set are disjoint), and run one forward + one backward per prompt.
 * Under MPI (opt->dist) every rank samples the same prompts and runs its share (prompt p on rank
 * p mod ranks); the per-prompt scores and losses are then combined exactly (each prompt's numbers
 * come from one rank), so every rank gets the result of one process, bit for bit, for the same
 * thread count per rank. seconds is the slowest rank's. Every rank must call it. */
kv_status kv_importance_run(kv_importance *out, kv_model *m, const int32_t *tokens, size_t n_tokens,
                            const kv_importance_options *opt);
void kv_importance_free(kv_importance *imp);
/* Wall time of plain forward passes (logits included) over the prompts of imp (tokens: the corpus imp was
 * run on; bos >= 0 first, as kv_importance_run put it): the reference --compare-forward reports
 * (importance_forward.c). */
kv_status kv_importance_time_forwards(double *seconds, kv_model *m, const kv_importance *imp, const int32_t *tokens,
                                      int bos);

/* Rank stability between the two disjoint halves A (prompts 0..h-1) and B (h..2h-1), h = P/2:
 * Spearman's rho of mean(A) vs mean(B) for K and V, the overlap of their top-n_top sets, and
 * rho of mean(first n prompts of A) vs mean(B) for n = 1..h (how many prompts the ranking needs). */
typedef struct kv_stability {
    int half;
    double k_rho, v_rho;
    int n_top;
    double k_top_overlap, v_top_overlap;
    int n_steps;
    double *prefix_k_rho, *prefix_v_rho; /* n_steps values */
} kv_stability;
kv_status kv_importance_stability(kv_stability *out, const kv_importance *imp, int n_top);
void kv_stability_free(kv_stability *st);

/* ---- reports (report.c) --------------------------------------------------------------------- */
typedef struct kv_importance_meta {
    const char *model_path;
    const char *model_name;
    const char *corpus_path;
    const char *corpus_sha256;
    const kv_alloc_params *params;
    uint64_t seed;
    double forward_seconds; /* plain forward passes over the same prompts (0: not measured) */
} kv_importance_meta;

/* The whole result as YAML (json = 0) or JSON (json = 1): meta, per-layer scores with spread, the
 * allocation with average bits, stability. Written atomically to path, or to stdout when path is
 * NULL or "-". */
kv_status kv_importance_report_write(const char *path, int json, const kv_importance *imp,
                                     const kv_alloc *alloc, const kv_stability *st,
                                     const kv_importance_meta *meta);
/* The allocation as a `kvcal fit` configuration fragment (YAML): per-layer K/V bits and RPC ratios. */
kv_status kv_alloc_config_write(const char *path, const kv_alloc *alloc, const kv_importance_meta *meta);

/* ---- quantized pruning under a memory budget (budget.c; kvprof budget) ----------------------------
 * An operating point: a selection method keeping, at a budget (fraction of the f16 cache), as many
 * tokens as the budget pays for at `bits` (16 = f16: "1x tokens at 16 bits", 8: 2x, 4: 4x, 2: 8x), or a
 * layer-wise mix (quantized-pruning.txt appendix C): `bits` everywhere but layers [range_lo, range_hi)
 * at range_bits. Every point is a kvcal fit configuration of method kivi (kv_budget_point_assignments). */
typedef struct kv_budget_point {
    kv_plan_prune method;
    double budget;
    int bits;
    int range_lo, range_hi, range_bits; /* range_bits 0: no mix */
    char name[64];                      /* "snapkv 4-bit (4x tokens)", "snapkv 4-bit, layers 0-7 8-bit" */
} kv_budget_point;

typedef struct kv_budget_grid {
    const double *budgets;
    int n_budgets;
    const kv_plan_prune *methods;
    int n_methods;
    const int *bits;   /* 16, 8, 4, 3, 2 */
    int n_bits;
    int mix_base;      /* 0: no layer-wise mixes; else the base precision of the mixes */
    int mix_ranges;    /* the layers split into this many equal ranges, each changed in turn */
    int mix_methods;   /* mixes for the first mix_methods methods (0 = all) */
} kv_budget_grid;

/* Every point, budget-major: for each budget, methods x bits, then the mixes (for each mix method, each
 * precision of the list other than mix_base, each range). *out malloc'd. KV_EINVAL naming a bad value. */
kv_status kv_budget_points(kv_budget_point **out, int *n, const kv_budget_grid *g, int n_layers);
int kv_budget_point_layer_bits(const kv_budget_point *p, int layer);
/* The point as kvcal fit assignments ("method=kivi", "keys.bits=4", ..., "layers.3.key_bits=8"), at most
 * max of 64 bytes each; returns how many. */
int kv_budget_point_assignments(const kv_budget_point *p, int n_layers, char (*a)[64], int max);

typedef struct kv_budget_result {
    double kl_mean, ppl, top1_agreement, cache_fraction;
    double passkey_accuracy; /* NaN when passkey was not measured */
    double seconds;
} kv_budget_result;
/* 1 when a is better than b (b NULL: 1): higher passkey accuracy when both measured it, else lower KL. */
int kv_budget_better(const kv_budget_result *a, const kv_budget_result *b);
/* The point as a kvcal fit configuration fragment (YAML; comments give its measured quality). */
kv_status kv_budget_config_write(const char *path, const kv_budget_point *p, const kv_budget_result *r, int n_layers,
                                 int window, int pool);
/* What kv_budget_measure runs (profile/budget_measure.c): the continuation protocol's prompts of prompt_len
 * tokens (BOS included) and score_len scored tokens, at most `samples` of them, the prompt prefilled in steps
 * of prefill_chunk (0: whole) and the scored tokens fed `step` at a time; passkey_len > 0: also passkey
 * retrieval at that length, n_depths depths x trials prompts (trial t: key and filler offset of
 * kv_rng_u64(seed, t)), 8 answer tokens. */
typedef struct kv_budget_measure_options {
    int prompt_len, score_len, prefill_chunk, step;
    size_t samples;
    int passkey_len;
    const double *depths;
    int n_depths, trials;
    uint64_t seed;
} kv_budget_measure_options;
/* Every point's cache (caches[i], runtime caches of kv_cache_rt_create) measured on the same prompts of ids:
 * res[i] (n results: KL, ppl, top-1 agreement, run time, cache bytes per value over f16's after the last
 * sample, passkey accuracy or NaN), *sum the exact model's side, *seconds_continuation the continuation's
 * wall time. prefill: a runtime cache made with KV_CACHE_RT_PROMPT_STATS that runs each prompt once for all
 * (kv_cont_options.prefill_cache). Errors: kv_eval_continuation's, the passkey's, KV_ENOMEM. */
kv_status kv_budget_measure(kv_budget_result *res, kv_cont_summary *sum, double *seconds_continuation, kv_model *m,
                            const kv_tokenizer *tok, kv_cache *const *caches, int n, kv_cache *prefill,
                            const int32_t *ids, size_t n_ids, const kv_budget_measure_options *o);
/* best[b]: the index of the best point (kv_budget_better) whose budget is budgets[b], or -1. */
void kv_budget_best(int *best, const kv_budget_point *pts, const kv_budget_result *res, int n, const double *budgets,
                    int n_budgets);
/* SVG: KL (log scale) against the budgets (in the order given), one line per operating point name. */
kv_status kv_budget_svg_write(const char *path, const char *title, const kv_budget_point *pts,
                              const kv_budget_result *res, int n, const double *budgets, int n_budgets);

#ifdef __cplusplus
}
#endif
#endif /* KV_PROFILE_H */
