/* search_layers.c — per-layer options of a pruned contender (calib/SEARCH.md §5.5): each layer's candidate and
 * kept fraction of its f16 cache chosen under the point's honest bit budget from one-layer-at-a-time measurements
 * around the contender. The tool (tools/kvcal_search.c) measures the table on chunks of its own and the allocated
 * plan again on the selection's before it may be kept. */
#include "kv_calib.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>

/* Bits per value are counted in units of 1e-9 for the knapsack (it takes integer costs): a plan's bits are a
 * few units of 1 and the smallest per-layer change measured on SmolLM2 is ~1e-4, far above the rounding. */
#define NANO 1e9

double kv_search_layer_budget(double budget, double mult) {
    const double b = budget * mult;
    return b < 1.0 ? b : 1.0;
}

kv_status kv_search_layer_allocate(int *choice, double *pred_kl, double *pred_bits, const kv_search_layer_table *t,
                                   double budget_bits) {
    if (!choice || !t || t->n_layers < 1 || t->n_opt < 1 || t->n_opt > 254 || !t->dkl || !t->dbits ||
        !isfinite(t->kl) || !(t->bits > 0) || !(budget_bits > 0))
        return KV_ERR(KV_EINVAL, "kv_search_layer_allocate: bad arguments");
    const int L = t->n_layers, no = t->n_opt, nc = no + 1;
    for (size_t i = 0; i < (size_t)L * (size_t)no; i++)
        if (!isfinite(t->dkl[i]) || !isfinite(t->dbits[i]))
            return KV_ERR(KV_EINVAL, "kv_search_layer_allocate: layer %zu option %zu: a measurement is not a number",
                          i / (size_t)no, i % (size_t)no);
    uint64_t *cost = malloc((size_t)L * (size_t)nc * sizeof *cost);
    double *value = malloc((size_t)L * (size_t)nc * sizeof *value);
    if (!cost || !value) {
        free(cost);
        free(value);
        return KV_ERR(KV_ENOMEM, "out of memory");
    }
    /* a layer's share: the contender's bits split evenly (any split adds up to the same totals), plus the change.
     * A share below 0 (a change larger than the even split) is not possible for memory; clamping keeps the
     * knapsack's costs unsigned and the prediction below uses the unclamped changes. */
    const double share = t->bits / (double)L;
    for (int l = 0; l < L; l++)
        for (int o = 0; o < nc; o++) {
            const double db = o ? t->dbits[(size_t)l * no + (size_t)(o - 1)] : 0.0;
            const double c = (share + db) * NANO;
            cost[(size_t)l * nc + o] = c > 0 ? (uint64_t)llround(c) : 0;
            value[(size_t)l * nc + o] = o ? t->dkl[(size_t)l * no + (size_t)(o - 1)] : 0.0;
        }
    const double b = floor(budget_bits * NANO);
    kv_status s = b >= 0 && b < 1.8e19 ? kv_search_allocate(choice, cost, value, NULL, NULL, L, nc, (uint64_t)b, 0, NULL)
                                       : KV_ERR(KV_EINVAL, "kv_search_layer_allocate: budget %g bits", budget_bits);
    if (s == KV_OK) {
        double kl = t->kl, bits = t->bits;
        for (int l = 0; l < L; l++)
            if (choice[l]) {
                kl += t->dkl[(size_t)l * no + (size_t)(choice[l] - 1)];
                bits += t->dbits[(size_t)l * no + (size_t)(choice[l] - 1)];
            }
        if (pred_kl) *pred_kl = kl;
        if (pred_bits) *pred_bits = bits;
    }
    free(cost);
    free(value);
    return s;
}

void kv_search_layer_apply(kv_plan *plan, const kv_search_pruned *p, const double *layer_mult) {
    kv_search_pruned_apply(plan, p);
    for (int l = 0; l < plan->n_layers; l++)
        plan->layers[l].prune_budget = layer_mult && layer_mult[l] != 1.0
                                           ? (float)kv_search_layer_budget(p->budget, layer_mult[l]) : 0.0f;
}
