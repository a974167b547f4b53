/* dist_parts.h — parts whose left fold is sensitive to the order of additions (values of very
 * different magnitudes and signs), shared by test_dist.c and dist_mpi_check.c. */
#ifndef KV_TEST_DIST_PARTS_H
#define KV_TEST_DIST_PARTS_H

#include "kv_common.h"

#include <math.h>

/* Element i of part k: a value whose scale varies over 30 orders of magnitude, so that adding the
 * same parts in another order (or pairwise) changes the low bits. */
static inline double dist_part_value(int64_t k, size_t i) {
    const uint64_t r = kv_rng_u64(0x5eedull + (uint64_t)k, (uint64_t)i);
    const double u = (double)(r >> 11) * (1.0 / 9007199254740992.0); /* [0, 1) */
    const int e = (int)((r & 0x3f) % 31) - 15;
    return (u - 0.5) * pow(10.0, e);
}

static inline kv_status dist_part_fill(void *user, int64_t part, double *out) {
    const size_t n = *(const size_t *)user;
    for (size_t i = 0; i < n; i++) out[i] = dist_part_value(part, i);
    return KV_OK;
}

/* The reference: ((p0 + p1) + p2) + ... computed directly. */
static inline void dist_part_left_fold(double *acc, size_t n, int64_t n_parts) {
    for (size_t i = 0; i < n; i++) acc[i] = 0.0;
    for (int64_t k = 0; k < n_parts; k++)
        for (size_t i = 0; i < n; i++) acc[i] += dist_part_value(k, i);
}

#endif
