/* Closed-form ridge regression for AQUA-KV predictors (calib/ridge.c), checked against answers
 * derived independently: the 1-D closed form, the normal equations recomputed naively in double,
 * exact recovery of noise-free linear data, and the minimum-norm fallback on collinear inputs. */
#include "kv_test.h"
#include "kv_calib.h"

#include <math.h>

static void fill_normal(float *x, size_t n, kv_rng *r) {
    for (size_t i = 0; i < n; i++) x[i] = (float)kv_rng_next_normal(r);
}

/* 1-D: minimizing sum (y - w x - b)^2 + lambda w^2 gives w = Sxy / (Sxx + lambda) with centered
 * sums and b = my - w mx; lambda = rel * sum x^2 (the mean diagonal of X^T X for one input). */
START_TEST(test_one_dimensional_closed_form) {
    const int n = 500;
    float x[500], y[500];
    kv_rng r;
    kv_rng_init(&r, 11);
    for (int i = 0; i < n; i++) {
        x[i] = (float)(1.0 + kv_rng_next_normal(&r));
        y[i] = (float)(0.7 * x[i] - 2.0 + 0.3 * kv_rng_next_normal(&r));
    }
    double mx = 0, my = 0, sxx2 = 0;
    for (int i = 0; i < n; i++) {
        mx += x[i];
        my += y[i];
        sxx2 += (double)x[i] * x[i];
    }
    mx /= n;
    my /= n;
    double sxx = 0, sxy = 0;
    for (int i = 0; i < n; i++) {
        sxx += (x[i] - mx) * (x[i] - mx);
        sxy += (x[i] - mx) * (y[i] - my);
    }
    const double rel = 1e-2, lambda = rel * sxx2;
    const double w = sxy / (sxx + lambda), b = my - w * mx;
    kv_ridge_stats s;
    ck_assert_kv_ok(kv_ridge_stats_init(&s, 1, 1));
    ck_assert_kv_ok(kv_ridge_stats_add(&s, x, 1, y, 1, n));
    kv_ridge_fit f;
    ck_assert_kv_ok(kv_ridge_solve(&f, &s, rel));
    /* the result is stored as float: 1e-6 relative covers float rounding of w and b */
    ck_assert_double_eq_tol(f.lambda, lambda, 1e-9 * lambda);
    ck_assert_double_eq_tol(f.W[0], w, 1e-6 * fabs(w));
    ck_assert_double_eq_tol(f.b[0], b, 1e-6 * fabs(b));
    ck_assert_int_eq(f.used_fallback, 0);
    kv_ridge_fit_free(&f);
    kv_ridge_stats_free(&s);
}
END_TEST

/* Multi-dimensional: the solution satisfies (Xa^T Xa + lambda D) Wa = Xa^T Y, recomputed here with
 * naive double loops; data fed in uneven chunks to exercise the streaming accumulation. */
START_TEST(test_normal_equations) {
    const int n = 3001, din = 7, dout = 5, na = din + 1;
    float *x = malloc(sizeof(float) * n * din), *y = malloc(sizeof(float) * n * dout);
    kv_rng r;
    kv_rng_init(&r, 5);
    fill_normal(x, (size_t)n * din, &r);
    fill_normal(y, (size_t)n * dout, &r);
    for (int i = 0; i < n; i++) y[i * dout] += 2.0f * x[i * din + 3] + 1.0f; /* some signal */
    kv_ridge_stats s;
    ck_assert_kv_ok(kv_ridge_stats_init(&s, din, dout));
    for (int r0 = 0; r0 < n; r0 += 777) {
        int m = n - r0 < 777 ? n - r0 : 777;
        ck_assert_kv_ok(kv_ridge_stats_add(&s, x + (size_t)r0 * din, din, y + (size_t)r0 * dout, dout, m));
    }
    kv_ridge_fit f;
    ck_assert_kv_ok(kv_ridge_solve(&f, &s, 1e-3));
    double G[8][8] = {{0}}, C[8][5] = {{0}};
    for (int i = 0; i < n; i++) {
        double xa[8];
        for (int j = 0; j < din; j++) xa[j] = x[i * din + j];
        xa[din] = 1.0;
        for (int a = 0; a < na; a++) {
            for (int b2 = 0; b2 < na; b2++) G[a][b2] += xa[a] * xa[b2];
            for (int o = 0; o < dout; o++) C[a][o] += xa[a] * y[i * dout + o];
        }
    }
    double md = 0;
    for (int j = 0; j < din; j++) md += G[j][j];
    md /= din;
    ck_assert_double_eq_tol(f.lambda, 1e-3 * md, 1e-9 * md);
    for (int j = 0; j < din; j++) G[j][j] += f.lambda;
    double worst = 0, cnorm = 0;
    for (int a = 0; a < na; a++)
        for (int o = 0; o < dout; o++) {
            double lhs = 0;
            for (int b2 = 0; b2 < na; b2++) lhs += G[a][b2] * (b2 < din ? f.W[b2 * dout + o] : f.b[o]);
            worst = fmax(worst, fabs(lhs - C[a][o]));
            cnorm = fmax(cnorm, fabs(C[a][o]));
        }
    /* W is float (2^-24 relative); the Gram matrix of Gaussian data is well conditioned (~2),
     * so the residual is ~1e-7 of |C|: 1e-5 leaves room without hiding a wrong solve. */
    ck_assert_double_lt(worst, 1e-5 * cnorm);
    kv_ridge_fit_free(&f);
    kv_ridge_stats_free(&s);
    free(x);
    free(y);
}
END_TEST

/* Noise-free data with lambda = 0 is recovered exactly (up to float rounding); the metrics say
 * so: relative MSE ~0, explained variance ~1; a zero predictor has relative MSE 1. */
START_TEST(test_exact_recovery_and_metrics) {
    const int n = 400, din = 4, dout = 3;
    float x[400 * 4], y[400 * 3], p[400 * 3], Wt[4 * 3] = {1, -2, 0.5f, 0, 3, 1, -1, 0.25f, 2, 0.5f, 0, -3};
    const float bt[3] = {0.5f, -1.0f, 2.0f};
    kv_rng r;
    kv_rng_init(&r, 9);
    fill_normal(x, sizeof x / sizeof x[0], &r);
    for (int i = 0; i < n; i++)
        for (int o = 0; o < dout; o++) {
            double v = bt[o];
            for (int j = 0; j < din; j++) v += (double)x[i * din + j] * Wt[j * dout + o];
            y[i * dout + o] = (float)v;
        }
    kv_ridge_stats s;
    ck_assert_kv_ok(kv_ridge_stats_init(&s, din, dout));
    ck_assert_kv_ok(kv_ridge_stats_add(&s, x, din, y, dout, n));
    kv_ridge_fit f;
    ck_assert_kv_ok(kv_ridge_solve(&f, &s, 0.0));
    for (int i = 0; i < din * dout; i++) ck_assert_double_eq_tol(f.W[i], Wt[i], 1e-5);
    for (int o = 0; o < dout; o++) ck_assert_double_eq_tol(f.b[o], bt[o], 1e-5);
    kv_ridge_predict(&f, x, din, p, n);
    kv_fit_error e;
    ck_assert_kv_ok(kv_fit_error_init(&e, dout));
    kv_fit_error_add(&e, y, p, n);
    ck_assert_double_lt(kv_fit_error_relative_mse(&e), 1e-10);
    ck_assert_double_gt(kv_fit_error_explained_variance(&e), 1 - 1e-9);
    kv_fit_error_free(&e);
    memset(p, 0, sizeof p);
    ck_assert_kv_ok(kv_fit_error_init(&e, dout));
    kv_fit_error_add(&e, y, p, n);
    ck_assert_double_eq_tol(kv_fit_error_relative_mse(&e), 1.0, 1e-12);
    kv_fit_error_free(&e);
    kv_ridge_fit_free(&f);
    kv_ridge_stats_free(&s);
}
END_TEST

/* Two identical input columns and lambda = 0: Cholesky fails, the SVD fallback returns the
 * minimum-norm solution, which splits the weight equally between the twin columns. */
START_TEST(test_collinear_fallback) {
    const int n = 300;
    float x[300 * 3], y[300];
    kv_rng r;
    kv_rng_init(&r, 3);
    for (int i = 0; i < n; i++) {
        x[i * 3] = (float)kv_rng_next_normal(&r);
        x[i * 3 + 1] = x[i * 3];
        x[i * 3 + 2] = (float)kv_rng_next_normal(&r);
        y[i] = 4.0f * x[i * 3] - x[i * 3 + 2] + 0.5f;
    }
    kv_ridge_stats s;
    ck_assert_kv_ok(kv_ridge_stats_init(&s, 3, 1));
    ck_assert_kv_ok(kv_ridge_stats_add(&s, x, 3, y, 1, n));
    kv_ridge_fit f;
    ck_assert_kv_ok(kv_ridge_solve(&f, &s, 0.0));
    ck_assert_int_eq(f.used_fallback, 1);
    ck_assert_double_eq_tol(f.W[0], 2.0, 1e-4);
    ck_assert_double_eq_tol(f.W[1], 2.0, 1e-4);
    ck_assert_double_eq_tol(f.W[2], -1.0, 1e-4);
    ck_assert_double_eq_tol(f.b[0], 0.5, 1e-4);
    kv_ridge_fit_free(&f);
    kv_ridge_stats_free(&s);
    ck_assert_int_eq(kv_ridge_stats_init(&s, 0, 1), KV_EINVAL);
    ck_assert_kv_ok(kv_ridge_stats_init(&s, 2, 1));
    ck_assert_int_eq(kv_ridge_solve(&f, &s, 1e-3), KV_EINVAL); /* no samples */
    kv_ridge_stats_free(&s);
}
END_TEST

int main(void) {
    Suite *s = suite_create("calib-ridge");
    TCase *tc = tcase_create("ridge");
    tcase_add_test(tc, test_one_dimensional_closed_form);
    tcase_add_test(tc, test_normal_equations);
    tcase_add_test(tc, test_exact_recovery_and_metrics);
    tcase_add_test(tc, test_collinear_fallback);
    suite_add_tcase(s, tc);
    return kv_test_run(s);
}
