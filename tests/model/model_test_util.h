/* model_test_util.h — deterministic random weights for the model tests (not a public header).
 *
 * A tensor named N gets values offset + (2u - 1) * scale with u = kv_rng_uniform(fnv1a64(N) ^ seed, i),
 * i the element index: tests/model/gen_hf_ref.py computes exactly the same values in Python. */
#ifndef KV_MODEL_TEST_UTIL_H
#define KV_MODEL_TEST_UTIL_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "kv_common.h"

#define KV_TEST_MODEL_SEED 0x5EEDull

static inline uint64_t kv_test_fnv1a64(const char *s) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (; *s; s++) h = (h ^ (uint8_t)*s) * 0x100000001b3ull;
    return h;
}

typedef enum { KV_TW_MATRIX, KV_TW_NORM, KV_TW_BIAS, KV_TW_EMB } kv_test_weight_kind;

/* Fill n values of tensor `name`; `in` is the input width of a matrix (its scale is 1/sqrt(in)). */
static inline void kv_test_fill(float *dst, size_t n, const char *name, kv_test_weight_kind kind, int in,
                                uint64_t seed) {
    const uint64_t s = kv_test_fnv1a64(name) ^ seed;
    double scale = 1.0, offset = 0.0;
    switch (kind) {
    case KV_TW_MATRIX: scale = 1.0 / sqrt((double)in); break;
    case KV_TW_NORM: scale = 0.2; offset = 1.0; break;
    case KV_TW_BIAS: scale = 0.2; break;
    case KV_TW_EMB: scale = 1.0; break;
    }
    for (size_t i = 0; i < n; i++) dst[i] = (float)(offset + (2.0 * kv_rng_uniform(s, i) - 1.0) * scale);
}

/* Token ids as gen_hf_ref.py draws them: splitmix(777, i) % vocab. */
static inline void kv_test_tokens(int32_t *dst, size_t n, int vocab) {
    for (size_t i = 0; i < n; i++) dst[i] = (int32_t)(kv_rng_u64(777, i) % (uint64_t)vocab);
}

/* Largest |a - b| over n values, and largest |b|. */
static inline void kv_test_maxdiff(const float *a, const float *b, size_t n, double *maxdiff, double *maxref) {
    double md = 0.0, mr = 0.0;
    for (size_t i = 0; i < n; i++) {
        const double d = fabs((double)a[i] - (double)b[i]);
        if (!(d <= md)) md = d; /* NaN propagates as the max */
        if (fabs((double)b[i]) > mr) mr = fabs((double)b[i]);
    }
    *maxdiff = md;
    *maxref = mr;
}

#endif
