/* ridge.h — streaming closed-form ridge regression for AQUA-KV predictors (calib/, internal until
 * merged into kv_calib.h). Y ~ X W + b, fitted from normal equations accumulated in chunks. */
#ifndef KV_CALIB_RIDGE_H
#define KV_CALIB_RIDGE_H

#include "kv_common.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Sufficient statistics of a linear fit with bias, in double precision: the augmented input is
 * [x, 1], so G = Xa^T Xa is (n_in+1)^2 and C = Xa^T Y is (n_in+1) x n_out. O(d^2) memory, never
 * the samples. */
typedef struct kv_ridge_stats {
    int n_in;
    int n_out;
    int64_t n_samples;
    double *G;  /* (n_in+1) x (n_in+1), row-major, upper and lower both filled at solve time */
    double *C;  /* (n_in+1) x n_out, row-major */
    double *yy; /* n_out: sum of y^2 per output (for metrics) */
    double *ys; /* n_out: sum of y per output */
} kv_ridge_stats;

kv_status kv_ridge_stats_init(kv_ridge_stats *s, int n_in, int n_out);
void kv_ridge_stats_free(kv_ridge_stats *s);
/* Add n rows: x is n x ldx (first n_in columns used), y is n x ldy (first n_out columns). */
kv_status kv_ridge_stats_add(kv_ridge_stats *s, const float *x, int ldx, const float *y, int ldy,
                             int64_t n);

/* The fitted map: W is n_in x n_out row-major (y = x W + b), b has n_out entries. */
typedef struct kv_ridge_fit {
    int n_in;
    int n_out;
    float *W;
    float *b;
    double lambda;    /* the ridge actually applied to the non-bias diagonal */
    int used_fallback; /* 1 when Cholesky failed and the SVD least-squares solve was used */
} kv_ridge_fit;

/* Solve (G + lambda D) Wa = C with lambda = rel_lambda * mean(diag(X^T X)) (D is the identity on
 * the input coordinates and 0 on the bias, which is not shrunk). Cholesky (LAPACKE_dposv) first;
 * when the matrix is not positive definite, the minimum-norm least-squares solution by SVD
 * (LAPACKE_dgelsd) of the same system. */
kv_status kv_ridge_solve(kv_ridge_fit *out, const kv_ridge_stats *s, double rel_lambda);
void kv_ridge_fit_free(kv_ridge_fit *f);

/* Apply: y_pred (n x n_out, row-major) = x (n x ldx) W + b. Uses CBLAS. */
void kv_ridge_predict(const kv_ridge_fit *f, const float *x, int ldx, float *y_pred, int64_t n);

/* Held-out quality of a prediction: relative MSE ||Y - P||^2 / ||Y||^2 and explained variance
 * 1 - ||Y - P||^2 / ||Y - mean(Y)||^2 (mean per output column), accumulated over chunks. */
typedef struct kv_fit_error {
    double sse;   /* sum of squared errors */
    double ss;    /* sum of squares of y */
    double *sum;  /* per-column sums of y (n_out) */
    int n_out;
    int64_t n;
} kv_fit_error;
kv_status kv_fit_error_init(kv_fit_error *e, int n_out);
void kv_fit_error_add(kv_fit_error *e, const float *y, const float *pred, int64_t n);
double kv_fit_error_relative_mse(const kv_fit_error *e);
double kv_fit_error_explained_variance(const kv_fit_error *e);
void kv_fit_error_free(kv_fit_error *e);

#ifdef __cplusplus
}
#endif
#endif
