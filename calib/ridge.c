/* Streaming closed-form ridge regression (kv_calib.h): the AQUA-KV predictors are linear maps with
 * bias fitted in closed form (aquakv.txt §3.2, Algorithm 1 lines 13 and 17). */
#include "kv_calib.h"

#include <cblas.h>
#include <lapacke.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

kv_status kv_ridge_stats_init(kv_ridge_stats *s, int n_in, int n_out) {
    memset(s, 0, sizeof *s);
    if (n_in <= 0 || n_out <= 0 || n_in > 65536 || n_out > 65536)
        return KV_ERR(KV_EINVAL, "ridge: bad dimensions %d -> %d", n_in, n_out);
    const size_t na = (size_t)n_in + 1;
    s->n_in = n_in;
    s->n_out = n_out;
    s->G = calloc(na * na, sizeof(double));
    s->C = calloc(na * (size_t)n_out, sizeof(double));
    s->yy = calloc((size_t)n_out, sizeof(double));
    s->ys = calloc((size_t)n_out, sizeof(double));
    if (!s->G || !s->C || !s->yy || !s->ys) {
        kv_ridge_stats_free(s);
        return KV_ERR(KV_ENOMEM, "ridge: out of memory for %d x %d statistics", n_in + 1, n_in + 1);
    }
    return KV_OK;
}

void kv_ridge_stats_free(kv_ridge_stats *s) {
    if (!s) return;
    free(s->G);
    free(s->C);
    free(s->yy);
    free(s->ys);
    memset(s, 0, sizeof *s);
}

/* Chunks are converted to double so that sums over millions of tokens keep their precision
 * (float accumulation would lose ~1e-4 relative on the Gram matrix and bias the fit). */
enum { RIDGE_CHUNK = 1024 };

kv_status kv_ridge_stats_add(kv_ridge_stats *s, const float *x, int ldx, const float *y, int ldy,
                             int64_t n) {
    if (n < 0 || ldx < s->n_in || ldy < s->n_out) return KV_ERR(KV_EINVAL, "ridge: bad leading dimensions");
    const int na = s->n_in + 1;
    double *xa = malloc((size_t)RIDGE_CHUNK * (size_t)na * sizeof(double));
    double *yd = malloc((size_t)RIDGE_CHUNK * (size_t)s->n_out * sizeof(double));
    if (!xa || !yd) {
        free(xa);
        free(yd);
        return KV_ERR(KV_ENOMEM, "ridge: out of memory for a chunk");
    }
    for (int64_t r0 = 0; r0 < n; r0 += RIDGE_CHUNK) {
        const int m = (int)(n - r0 < RIDGE_CHUNK ? n - r0 : RIDGE_CHUNK);
        for (int i = 0; i < m; i++) {
            const float *xr = x + (size_t)(r0 + i) * (size_t)ldx;
            const float *yr = y + (size_t)(r0 + i) * (size_t)ldy;
            double *xo = xa + (size_t)i * (size_t)na;
            double *yo = yd + (size_t)i * (size_t)s->n_out;
            for (int j = 0; j < s->n_in; j++) xo[j] = xr[j];
            xo[s->n_in] = 1.0;
            for (int j = 0; j < s->n_out; j++) {
                yo[j] = yr[j];
                s->yy[j] += (double)yr[j] * yr[j];
                s->ys[j] += yr[j];
            }
        }
        /* G += Xa^T Xa (upper triangle), C += Xa^T Y */
        cblas_dsyrk(CblasRowMajor, CblasUpper, CblasTrans, na, m, 1.0, xa, na, 1.0, s->G, na);
        cblas_dgemm(CblasRowMajor, CblasTrans, CblasNoTrans, na, s->n_out, m, 1.0, xa, na, yd,
                    s->n_out, 1.0, s->C, s->n_out);
    }
    s->n_samples += n;
    free(xa);
    free(yd);
    return KV_OK;
}

kv_status kv_ridge_solve(kv_ridge_fit *out, const kv_ridge_stats *s, double rel_lambda) {
    memset(out, 0, sizeof *out);
    if (s->n_samples <= 0) return KV_ERR(KV_EINVAL, "ridge: no samples to fit");
    if (!(rel_lambda >= 0)) return KV_ERR(KV_EINVAL, "ridge: bad lambda %g", rel_lambda);
    const int na = s->n_in + 1, no = s->n_out;
    kv_status st = KV_OK;
    double *A = malloc((size_t)na * na * sizeof(double));
    double *B = malloc((size_t)na * no * sizeof(double));
    double *A2 = malloc((size_t)na * na * sizeof(double));
    double *B2 = malloc((size_t)na * no * sizeof(double));
    out->W = malloc((size_t)s->n_in * no * sizeof(float));
    out->b = malloc((size_t)no * sizeof(float));
    if (!A || !B || !A2 || !B2 || !out->W || !out->b) {
        st = KV_ERR(KV_ENOMEM, "ridge: out of memory solving %d x %d", na, no);
        goto done;
    }
    out->n_in = s->n_in;
    out->n_out = no;
    /* symmetrize from the upper triangle */
    for (int i = 0; i < na; i++)
        for (int j = 0; j < na; j++)
            A[(size_t)i * na + j] = i <= j ? s->G[(size_t)i * na + j] : s->G[(size_t)j * na + i];
    double mean_diag = 0;
    for (int i = 0; i < s->n_in; i++) mean_diag += A[(size_t)i * na + i];
    mean_diag /= s->n_in;
    out->lambda = rel_lambda * mean_diag;
    for (int i = 0; i < s->n_in; i++) A[(size_t)i * na + i] += out->lambda;
    memcpy(B, s->C, (size_t)na * no * sizeof(double));
    memcpy(A2, A, (size_t)na * na * sizeof(double));
    memcpy(B2, B, (size_t)na * no * sizeof(double));
    lapack_int info = LAPACKE_dposv(LAPACK_ROW_MAJOR, 'U', na, no, A, na, B, no);
    if (info > 0) {
        /* Not positive definite (collinear inputs with lambda = 0, or a constant column): the
         * minimum-norm least-squares solution of the same normal equations. */
        out->used_fallback = 1;
        double *sv = malloc((size_t)na * sizeof(double));
        lapack_int rank = 0;
        if (!sv) {
            st = KV_ERR(KV_ENOMEM, "ridge: out of memory");
            goto done;
        }
        info = LAPACKE_dgelsd(LAPACK_ROW_MAJOR, na, na, no, A2, na, B2, no, sv, -1.0, &rank);
        free(sv);
        if (info != 0) {
            st = KV_ERR(KV_ENUMERIC, "ridge: SVD least squares failed (info %d)", (int)info);
            goto done;
        }
        memcpy(B, B2, (size_t)na * no * sizeof(double));
    } else if (info < 0) {
        st = KV_ERR(KV_EINVAL, "ridge: LAPACKE_dposv argument %d invalid", (int)-info);
        goto done;
    }
    for (int i = 0; i < s->n_in; i++)
        for (int j = 0; j < no; j++) {
            double w = B[(size_t)i * no + j];
            if (!isfinite(w)) {
                st = KV_ERR(KV_ENUMERIC, "ridge: non-finite coefficient at (%d, %d)", i, j);
                goto done;
            }
            out->W[(size_t)i * no + j] = (float)w;
        }
    for (int j = 0; j < no; j++) out->b[j] = (float)B[(size_t)s->n_in * no + j];
done:
    free(A);
    free(B);
    free(A2);
    free(B2);
    if (st != KV_OK) kv_ridge_fit_free(out);
    return st;
}

void kv_ridge_fit_free(kv_ridge_fit *f) {
    if (!f) return;
    free(f->W);
    free(f->b);
    memset(f, 0, sizeof *f);
}

void kv_ridge_predict(const kv_ridge_fit *f, const float *x, int ldx, float *y_pred, int64_t n) {
    if (n <= 0) return;
    for (int64_t i = 0; i < n; i++) memcpy(y_pred + (size_t)i * f->n_out, f->b, (size_t)f->n_out * sizeof(float));
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)n, f->n_out, f->n_in, 1.0f, x, ldx,
                f->W, f->n_out, 1.0f, y_pred, f->n_out);
}

kv_status kv_fit_error_init(kv_fit_error *e, int n_out) {
    memset(e, 0, sizeof *e);
    e->sum = calloc((size_t)n_out, sizeof(double));
    if (!e->sum) return KV_ERR(KV_ENOMEM, "out of memory");
    e->n_out = n_out;
    return KV_OK;
}

void kv_fit_error_add(kv_fit_error *e, const float *y, const float *pred, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        for (int j = 0; j < e->n_out; j++) {
            const double yv = y[(size_t)i * e->n_out + j];
            const double d = yv - pred[(size_t)i * e->n_out + j];
            e->sse += d * d;
            e->ss += yv * yv;
            e->sum[j] += yv;
        }
    e->n += n;
}

double kv_fit_error_relative_mse(const kv_fit_error *e) { return e->ss > 0 ? e->sse / e->ss : 0.0; }

double kv_fit_error_explained_variance(const kv_fit_error *e) {
    /* sum (y - mean)^2 = sum y^2 - n mean^2, per column */
    double centered = e->ss;
    for (int j = 0; j < e->n_out; j++) centered -= e->n > 0 ? e->sum[j] * e->sum[j] / (double)e->n : 0.0;
    return centered > 0 ? 1.0 - e->sse / centered : 0.0;
}

void kv_fit_error_free(kv_fit_error *e) {
    if (!e) return;
    free(e->sum);
    memset(e, 0, sizeof *e);
}
