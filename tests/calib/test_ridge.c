/* Closed-form ridge regression for AQUA-KV predictors (calib/ridge.c), checked against answers
 * derived independently: the 1-D closed form, the normal equations recomputed naively in double,
 * exact recovery of noise-free linear data, and the minimum-norm answer on collinear inputs (twins,
 * near twins, constant and zero columns) whatever code path and BLAS kernel produce it. */
#include "kv_test.h"
#include "kv_calib.h"

#include <lapacke.h>
#include <math.h>
#include <string.h>

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
    /* one Gaussian input with a bias: well conditioned, reported as such */
    ck_assert_double_gt(f.rcond, 1e-3);
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

/* Relative prediction error ||y - f(x)||^2 / ||y||^2 of a fit on (x, y), n rows. */
static double pred_rel_err(const kv_ridge_fit *f, const float *x, int din, const float *y, int n) {
    float *p = malloc(sizeof(float) * (size_t)n * (size_t)f->n_out);
    kv_ridge_predict(f, x, din, p, n);
    double e = 0, t = 0;
    for (int i = 0; i < n * f->n_out; i++) {
        e += ((double)y[i] - p[i]) * ((double)y[i] - p[i]);
        t += (double)y[i] * y[i];
    }
    free(p);
    return e / t;
}

/* x0 ~ N(0, scale^2), x1 = x0 + eps * z (eps = 0: exact twins), x2 ~ N(0, scale^2);
 * y = (4 x0 - x2) / scale + 0.5. */
static void collinear_data(float *x, float *y, int n, double scale, double eps, uint64_t seed) {
    kv_rng r;
    kv_rng_init(&r, seed);
    for (int i = 0; i < n; i++) {
        const double a = scale * kv_rng_next_normal(&r), z = kv_rng_next_normal(&r);
        x[i * 3] = (float)a;
        x[i * 3 + 1] = (float)(a + eps * z);
        x[i * 3 + 2] = (float)(scale * kv_rng_next_normal(&r));
        y[i] = (float)((4.0 * x[i * 3] - x[i * 3 + 2]) / scale + 0.5);
    }
}

/* Collinear inputs (exact twins, and twins perturbed by 1e-9 at unit scale and at scale 1e-3 where
 * the perturbation survives float rounding) with lambda = 0: whatever code path runs, the answer is
 * the minimum-norm one, so the weight splits evenly between the twins, the other weights are right
 * and the prediction is exact. The seeds and thread counts vary the BLAS's rounding; .ci/run also
 * runs this under every OpenBLAS core type the CPU executes. */
static const struct { double scale, eps; } k_collinear[] = {{1.0, 0.0}, {1.0, 1e-9}, {1e-3, 1e-9}, {1e-3, 0.0}};

START_TEST(test_collinear_min_norm) {
    const int n = 300;
    const double scale = k_collinear[_i].scale, eps = k_collinear[_i].eps;
    float x[300 * 3], y[300];
    for (uint64_t seed = 1; seed <= 8; seed++) {
        collinear_data(x, y, n, scale, eps, seed);
        kv_ridge_stats s;
        ck_assert_kv_ok(kv_ridge_stats_init(&s, 3, 1));
        ck_assert_kv_ok(kv_ridge_stats_add(&s, x, 3, y, 1, n));
        kv_ridge_fit f;
        ck_assert_kv_ok(kv_ridge_solve(&f, &s, 0.0));
        /* the minimum-norm answer in input units is (2, 2, -1)/scale, bias 0.5. The twins differ by
         * at most 1e-9 relative (below float resolution at unit scale, 1e-6 relative at 1e-3), so
         * any split other than the even one is an arbitrary point of the near-null space: 1e-4 of
         * the weight leaves room for float storage (6e-8) and the perturbation's pull (~1e-6). */
        const double w = 2.0 / scale;
        ck_assert_msg(fabs(f.W[0] - f.W[1]) < 1e-4 * w, "seed %d: twin weights %g and %g are not split evenly",
                      (int)seed, f.W[0], f.W[1]);
        ck_assert_double_eq_tol(f.W[0], w, 1e-4 * w);
        ck_assert_double_eq_tol(f.W[2], -1.0 / scale, 1e-4 / scale);
        ck_assert_double_eq_tol(f.b[0], 0.5, 1e-4);
        /* noise-free targets: what is left is float rounding of y and W (~1e-14 relative) */
        ck_assert_double_lt(pred_rel_err(&f, x, 3, y, n), 1e-10);
        ck_assert(f.rcond >= 0.0 && f.rcond < 1.0);
        kv_ridge_fit_free(&f);
        kv_ridge_stats_free(&s);
    }
}
END_TEST

/* A constant input column is collinear with the bias (which is not shrunk): with lambda = 0 the
 * system is singular, with lambda > 0 it is not. Both give the exact prediction; the weights stay
 * finite and modest (no huge opposite pair), and an all-zero column gets weight 0. */
START_TEST(test_constant_and_zero_columns) {
    const int n = 257;
    float x[257 * 3], y[257];
    kv_rng r;
    kv_rng_init(&r, 21);
    for (int i = 0; i < n; i++) {
        x[i * 3] = (float)kv_rng_next_normal(&r);
        x[i * 3 + 1] = 3.0f; /* constant */
        x[i * 3 + 2] = 0.0f; /* zero */
        y[i] = 1.5f * x[i * 3] - 2.0f;
    }
    const double lambdas[] = {0.0, 1e-3};
    for (int k = 0; k < 2; k++) {
        kv_ridge_stats s;
        ck_assert_kv_ok(kv_ridge_stats_init(&s, 3, 1));
        ck_assert_kv_ok(kv_ridge_stats_add(&s, x, 3, y, 1, n));
        kv_ridge_fit f;
        ck_assert_kv_ok(kv_ridge_solve(&f, &s, lambdas[k]));
        /* the intercept -2 is shared between the constant column and the bias (with the ridge it
         * also absorbs mean(x0) times the ~1e-3 shrinkage of the slope) */
        ck_assert_double_eq_tol(3.0 * f.W[1] + f.b[0], -2.0, k == 0 ? 1e-4 : 1e-2);
        ck_assert(fabs(f.W[1]) < 1.0 && fabs(f.b[0]) < 2.01);
        ck_assert_double_lt(fabs(f.W[2]), 1e-6);
        if (k == 0) {
            ck_assert_double_eq_tol(f.W[0], 1.5, 1e-4);
            ck_assert_double_lt(pred_rel_err(&f, x, 3, y, n), 1e-10);
        } else {
            /* ridge shrinks the slope by ~lambda / var(x) ~ 1e-3 relative at most */
            ck_assert_double_eq_tol(f.W[0], 1.5, 1e-2);
            ck_assert_double_lt(pred_rel_err(&f, x, 3, y, n), 1e-4);
        }
        kv_ridge_fit_free(&f);
        kv_ridge_stats_free(&s);
    }
}
END_TEST

/* Non-finite activations are named as such (not "LAPACKE argument 7 invalid"); bad calls are
 * KV_EINVAL. */
START_TEST(test_non_finite_and_bad_calls) {
    float x[40 * 2], y[40];
    kv_rng r;
    kv_rng_init(&r, 4);
    fill_normal(x, 80, &r);
    fill_normal(y, 40, &r);
    kv_ridge_stats s;
    kv_ridge_fit f;
    for (int which = 0; which < 3; which++) {
        float xc[80], yc[40];
        memcpy(xc, x, sizeof xc);
        memcpy(yc, y, sizeof yc);
        if (which == 0) xc[17] = NAN;
        if (which == 1) xc[3] = INFINITY;
        if (which == 2) yc[5] = NAN;
        ck_assert_kv_ok(kv_ridge_stats_init(&s, 2, 1));
        ck_assert_kv_ok(kv_ridge_stats_add(&s, xc, 2, yc, 1, 40));
        ck_assert_int_eq(kv_ridge_solve(&f, &s, 1e-3), KV_ENUMERIC);
        ck_assert_msg(strstr(kv_error_last(), "non-finite activations") != NULL, "message: %s", kv_error_last());
        ck_assert_ptr_null(f.W);
        kv_ridge_stats_free(&s);
    }
    ck_assert_int_eq(kv_ridge_stats_init(&s, 0, 1), KV_EINVAL);
    ck_assert_kv_ok(kv_ridge_stats_init(&s, 2, 1));
    ck_assert_int_eq(kv_ridge_solve(&f, &s, 1e-3), KV_EINVAL); /* no samples */
    ck_assert_kv_ok(kv_ridge_stats_add(&s, x, 2, y, 1, 40));
    ck_assert_int_eq(kv_ridge_solve(&f, &s, -1.0), KV_EINVAL);
    ck_assert_int_eq(kv_ridge_solve(&f, &s, NAN), KV_EINVAL);
    kv_ridge_stats_free(&s);
}
END_TEST

/* Reduced rank: checked against an independent computation of the same optimum. Eckart-Young: the best
 * rank-r approximation of the centred full-rank predictions P (n x dout) leaves the sum of its trailing
 * squared singular values (LAPACKE_dgesvd on P itself, not the eigensolver of W^T Cxx W the code uses);
 * the rank-r map's predictions, computed here on the data, must be exactly that far from the full map's
 * (mean per sample), *lost must say so, the mean prediction is kept, and rank = dout gives back W. */
START_TEST(test_reduced_rank) {
    const int n = 600, din = 12, dout = 6;
    float *x = malloc(sizeof(float) * n * din), *y = malloc(sizeof(float) * n * dout);
    double *P = malloc(sizeof(double) * n * dout), *Pr = malloc(sizeof(double) * n * dout);
    kv_rng r;
    kv_rng_init(&r, 23);
    fill_normal(x, (size_t)n * din, &r);
    for (int i = 0; i < n * din; i++) x[i] += 0.5f * (float)(i % din); /* non-zero means: the bias matters */
    for (int t = 0; t < n; t++) /* y = rank-3 map of x + a little noise + offsets */
        for (int o = 0; o < dout; o++) {
            double acc = 0.3 * o;
            for (int k = 0; k < 3; k++) {
                double u = 0;
                for (int i = 0; i < din; i++) u += x[t * din + i] * sin(1.0 + i * 0.7 + k * 1.3);
                acc += u * cos(0.4 + o * 0.9 + k * 2.1);
            }
            y[t * dout + o] = (float)(acc + 0.05 * kv_rng_next_normal(&r));
        }
    kv_ridge_stats s;
    ck_assert_kv_ok(kv_ridge_stats_init(&s, din, dout));
    ck_assert_kv_ok(kv_ridge_stats_add(&s, x, din, y, dout, n));
    kv_ridge_fit f;
    ck_assert_kv_ok(kv_ridge_solve(&f, &s, 1e-3));
    double mx[12] = {0};
    for (int t = 0; t < n; t++)
        for (int i = 0; i < din; i++) mx[i] += x[t * din + i] / (double)n;
    for (int t = 0; t < n; t++) /* centred full-rank predictions */
        for (int o = 0; o < dout; o++) {
            double acc = 0;
            for (int i = 0; i < din; i++) acc += (x[t * din + i] - mx[i]) * f.W[i * dout + o];
            P[t * dout + o] = acc;
        }
    double sv[6], U1, VT1, superb[6];
    memcpy(Pr, P, sizeof(double) * n * dout);
    ck_assert_int_eq(LAPACKE_dgesvd(LAPACK_ROW_MAJOR, 'N', 'N', n, dout, Pr, dout, sv, &U1, 1, &VT1, 1, superb), 0);
    for (int rank = 1; rank <= dout; rank++) {
        float left[6 * 6], right[6 * 12], bias[6];
        double lost = -1;
        ck_assert_kv_ok(kv_ridge_reduce_rank(left, right, bias, &lost, &f, &s, rank));
        double eckart = 0, dist = 0;
        for (int k = rank; k < dout; k++) eckart += sv[k] * sv[k] / n;
        double mean_full[6] = {0}, mean_r[6] = {0};
        for (int t = 0; t < n; t++)
            for (int o = 0; o < dout; o++) {
                double full = f.b[o], red = bias[o];
                for (int i = 0; i < din; i++) {
                    double w = 0;
                    for (int j = 0; j < rank; j++) w += (double)left[o * rank + j] * right[j * din + i];
                    full += x[t * din + i] * (double)f.W[i * dout + o];
                    red += x[t * din + i] * w;
                }
                dist += (full - red) * (full - red) / n;
                mean_full[o] += full / n;
                mean_r[o] += red / n;
            }
        /* float factors and float data: 1e-4 relative to the predictions' scale covers their rounding */
        const double scale = sv[0] * sv[0] / n;
        ck_assert_msg(fabs(dist - eckart) <= 1e-4 * scale, "rank %d: distance %.9g, Eckart-Young %.9g", rank, dist, eckart);
        ck_assert_msg(fabs(lost - eckart) <= 1e-6 * scale, "rank %d: lost %.9g, Eckart-Young %.9g", rank, lost, eckart);
        for (int o = 0; o < dout; o++) ck_assert_double_eq_tol(mean_r[o], mean_full[o], 1e-4 * sqrt(scale));
        if (rank == 3) ck_assert_msg(eckart < 1e-3 * scale, "the data are rank 3 + noise: %g of %g", eckart, scale);
        if (rank == dout)
            for (int i = 0; i < din; i++)
                for (int o = 0; o < dout; o++) {
                    double w = 0;
                    for (int j = 0; j < rank; j++) w += (double)left[o * rank + j] * right[j * din + i];
                    ck_assert_double_eq_tol(w, f.W[i * dout + o], 1e-5 * (1 + fabs(f.W[i * dout + o])));
                }
    }
    float l1[6], r1[12], b1[6];
    ck_assert_int_eq(kv_ridge_reduce_rank(l1, r1, b1, NULL, &f, &s, 0), KV_EINVAL);
    ck_assert_int_eq(kv_ridge_reduce_rank(l1, r1, b1, NULL, &f, &s, 7), KV_EINVAL);
    kv_ridge_fit_free(&f);
    kv_ridge_stats_free(&s);
    free(x);
    free(y);
    free(P);
    free(Pr);
}
END_TEST

int main(void) {
    Suite *s = suite_create("calib-ridge");
    TCase *tc = tcase_create("ridge");
    tcase_add_test(tc, test_one_dimensional_closed_form);
    tcase_add_test(tc, test_normal_equations);
    tcase_add_test(tc, test_exact_recovery_and_metrics);
    tcase_add_loop_test(tc, test_collinear_min_norm, 0, (int)(sizeof k_collinear / sizeof *k_collinear));
    tcase_add_test(tc, test_constant_and_zero_columns);
    tcase_add_test(tc, test_non_finite_and_bad_calls);
    tcase_add_test(tc, test_reduced_rank);
    suite_add_tcase(s, tc);
    return kv_test_run(s);
}
