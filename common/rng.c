/* Sequential host RNG over the counter-based generator (kv_common.h). */
#include "kv_common.h"

#include <math.h>

void kv_rng_init(kv_rng *r, uint64_t seed) {
    r->seed = seed;
    r->counter = 0;
}

uint64_t kv_rng_next_u64(kv_rng *r) { return kv_rng_u64(r->seed, r->counter++); }

double kv_rng_next_uniform(kv_rng *r) { return kv_rng_uniform(r->seed, r->counter++); }

double kv_rng_next_normal(kv_rng *r) {
    /* Box-Muller; 1 - u keeps the logarithm's argument in (0, 1]. */
    const double u1 = 1.0 - kv_rng_next_uniform(r);
    const double u2 = kv_rng_next_uniform(r);
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586476925 * u2);
}
