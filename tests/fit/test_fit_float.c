/* calib/fit_float.c, the FP8 / NVFP4 scale fitter, on problems with known answers: candidates from
 * the max and from histogram percentiles (within one bin, 2.2%, above the exact order statistic and
 * never above the max); the squared errors it sums equal the quantizer's own round trip
 * (kv_quant_roundtrip) under each candidate; the least-error candidate is chosen per group, ties to
 * the earlier one. */
#include "kv_test.h"
#include "fit_internal.h"
#include "kvrt.h"

#include <math.h>
#include <stdlib.h>

static int cmp_f(const void *a, const void *b) {
    const float x = *(const float *)a, y = *(const float *)b;
    return x < y ? -1 : x > y;
}

static float *data(size_t rows, int kvd, uint64_t seed) {
    float *x = malloc(rows * (size_t)kvd * sizeof *x);
    kv_rng r;
    kv_rng_init(&r, seed);
    for (size_t i = 0; i < rows * (size_t)kvd; i++) /* heavy-ish tails: some values 20x the rest */
        x[i] = (float)kv_rng_next_normal(&r) * ((i % 97) == 5 ? 20.0f : 1.0f) * (float)(1 + (int)(i % (size_t)kvd) / 16);
    return x;
}

/* Candidates per group: [0] = amax / 448 exactly; percentiles between the exact order statistic and
 * 2^(1/32) above it (the bin's upper edge), capped by the max. */
START_TEST(candidates_from_max_and_percentiles) {
    const size_t rows = 3000;
    const int kvd = 64, ng = _i ? 4 : 1;
    float *x = data(rows, kvd, 3);
    double *hist = calloc(kv_fit_float_hist_len(ng), sizeof(double));
    float amax[4] = {0}, cand[4 * KV_FIT_FLOAT_CANDS];
    kv_fit_float_hist_add(hist, amax, x, rows / 2, kvd, ng); /* in two parts: sums add */
    kv_fit_float_hist_add(hist, amax, x + rows / 2 * kvd, rows - rows / 2, kvd, ng);
    kv_fit_float_candidates(cand, hist, amax, ng, KV_FP_E4M3);
    static const double pct[KV_FIT_FLOAT_CANDS] = {1.0, 0.99999, 0.9999, 0.999};
    const int gc = kvd / ng;
    float *g = malloc(rows * (size_t)gc * sizeof *g);
    for (int grp = 0; grp < ng; grp++) {
        size_t n = 0;
        for (size_t t = 0; t < rows; t++)
            for (int c = grp * gc; c < (grp + 1) * gc; c++) g[n++] = fabsf(x[t * (size_t)kvd + (size_t)c]);
        qsort(g, n, sizeof *g, cmp_f);
        ck_assert_float_eq(amax[grp], g[n - 1]);
        ck_assert_float_eq(cand[grp * KV_FIT_FLOAT_CANDS], (float)((double)g[n - 1] / 448.0));
        for (int k = 1; k < KV_FIT_FLOAT_CANDS; k++) {
            /* the smallest value with at least pct * n values at or below it */
            const size_t rank = (size_t)ceil(pct[k] * (double)n);
            const double exact = g[rank - 1], got = (double)cand[grp * KV_FIT_FLOAT_CANDS + k] * 448.0;
            ck_assert_msg(got >= exact * (1 - 1e-6) && got <= fmin(exact * exp2(1.0 / 32) * (1 + 1e-6), g[n - 1] * (1 + 1e-6)),
                          "group %d candidate %d: %g, exact percentile %g", grp, k, got, exact);
        }
    }
    free(g);
    free(x);
    free(hist);
}
END_TEST

/* The summed squared error of each candidate equals the quantizer's round trip under that scale. */
START_TEST(sse_equals_quantizer_roundtrip) {
    const kv_fp_format fmts[3] = {KV_FP_E4M3, KV_FP_E5M2, KV_FP_NVFP4};
    const kv_fp_format fmt = fmts[_i % 3];
    const int ng = _i >= 3 ? 2 : 1, kvd = 64;
    const size_t rows = 200;
    float *x = data(rows, kvd, 11u + (uint64_t)_i), *xh = malloc(rows * (size_t)kvd * sizeof *xh);
    float cand[2 * KV_FIT_FLOAT_CANDS];
    for (int i = 0; i < ng * KV_FIT_FLOAT_CANDS; i++) cand[i] = 0.003f * (float)(1 + i) * (fmt == KV_FP_NVFP4 ? 0.1f : 1.0f);
    double sse[2 * KV_FIT_FLOAT_CANDS] = {0};
    kv_fit_float_sse_add(sse, x, rows, kvd, ng, fmt, cand);
    for (int k = 0; k < KV_FIT_FLOAT_CANDS; k++) {
        float sc[2];
        for (int gi = 0; gi < ng; gi++) sc[gi] = cand[gi * KV_FIT_FLOAT_CANDS + k];
        kv_quant q = {.kind = KV_QUANT_FP, .fp = {.format = fmt, .n_scales = ng, .scale_channels = kvd / ng, .scales = sc}};
        ck_assert_kv_ok(kv_quant_roundtrip(xh, NULL, &q, rows, (size_t)kvd, x));
        double want[2] = {0, 0};
        for (size_t t = 0; t < rows; t++)
            for (int c = 0; c < kvd; c++) {
                const double e = (double)x[t * (size_t)kvd + (size_t)c] - (double)xh[t * (size_t)kvd + (size_t)c];
                want[c / (kvd / ng)] += e * e;
            }
        for (int gi = 0; gi < ng; gi++) /* the same terms in another order: relative 1e-12 */
            ck_assert_double_eq_tol(sse[gi * KV_FIT_FLOAT_CANDS + k], want[gi], 1e-12 * want[gi] + 1e-300);
    }
    free(x);
    free(xh);
}
END_TEST

START_TEST(choose_least_error_ties_to_earlier) {
    const float cand[2 * KV_FIT_FLOAT_CANDS] = {1, 2, 3, 4, 10, 20, 30, 40};
    const double sse[2 * KV_FIT_FLOAT_CANDS] = {5, 3, 3, 4, 1, 1, 2, 0.5};
    float sc[2];
    int which[2];
    kv_fit_float_choose(sc, which, sse, cand, 2);
    ck_assert_int_eq(which[0], 1);
    ck_assert_float_eq(sc[0], 2.0f);
    ck_assert_int_eq(which[1], 3);
    ck_assert_float_eq(sc[1], 40.0f);
}
END_TEST

/* All zeros: a positive scale (1.0) rather than 0. */
START_TEST(zeros_give_a_positive_scale) {
    float x[64] = {0}, amax[1] = {0}, cand[KV_FIT_FLOAT_CANDS];
    double *hist = calloc(kv_fit_float_hist_len(1), sizeof(double));
    kv_fit_float_hist_add(hist, amax, x, 1, 64, 1);
    kv_fit_float_candidates(cand, hist, amax, 1, KV_FP_NVFP4);
    for (int k = 0; k < KV_FIT_FLOAT_CANDS; k++) ck_assert_float_eq(cand[k], 1.0f);
    free(hist);
}
END_TEST

int main(void) {
    Suite *s = suite_create("fit_float");
    TCase *tc = tcase_create("fitter");
    tcase_add_loop_test(tc, candidates_from_max_and_percentiles, 0, 2);
    tcase_add_loop_test(tc, sse_equals_quantizer_roundtrip, 0, 6);
    tcase_add_test(tc, choose_least_error_ties_to_earlier);
    tcase_add_test(tc, zeros_give_a_positive_scale);
    suite_add_tcase(s, tc);
    return kv_test_run(s);
}
