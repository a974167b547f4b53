/* kv_profile.h — the public header of profile/ (kvprof's library): KVmix layer importance, bit
 * allocation with recent-pivotal-context ratios, rank stability and the SVG importance chart.
 * kvmix.txt, "KV Importance Analysis", "Dynamic Pivotal Context Selection", appendix B. */
#ifndef KV_PROFILE_H
#define KV_PROFILE_H

#include "kv_common.h"

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

#ifdef __cplusplus
}
#endif
#endif /* KV_PROFILE_H */
