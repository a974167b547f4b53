/* Streaming closed-form ridge regression (kv_calib.h): the AQUA-KV predictors are linear maps with
 * bias fitted in closed form (aquakv.txt §3.2, Algorithm 1 lines 13 and 17). */
#include "kv_calib.h"

#include <cblas.h>
#include <lapacke.h>
#include <float.h>
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

/* Threshold on the reciprocal condition number of the equilibrated normal matrix below which it
 * is treated as rank deficient: na * eps * 2^12. na * eps is the textbook rounding level of a
 * factorization of an na x na matrix; the factor 2^12 covers how the Gram matrix is accumulated
 * (up to ~4096 sequential double additions per entry: the BLAS's sums within a 1024-row chunk and
 * the running total over chunks), whose rounding lets exactly dependent columns (twins, a
 * constant column beside the bias) look independent at ~1e-15..1e-13 depending on the BLAS kernel
 * and thread count. Well-posed fits sit far above it: the default ridge (1e-3 of the mean diagonal)
 * keeps the equilibrated rcond above ~1e-6 / na. */
double kv_ridge_rcond_threshold(int n_in) { return (double)(n_in + 1) * DBL_EPSILON * 4096.0; }

kv_status kv_ridge_solve(kv_ridge_fit *out, const kv_ridge_stats *s, double rel_lambda) {
    memset(out, 0, sizeof *out);
    if (s->n_samples <= 0) return KV_ERR(KV_EINVAL, "ridge: no samples to fit");
    if (!(rel_lambda >= 0) || !isfinite(rel_lambda)) return KV_ERR(KV_EINVAL, "ridge: bad lambda %g", rel_lambda);
    const int na = s->n_in + 1, no = s->n_out;
    kv_status st = KV_OK;
    double *A = malloc((size_t)na * na * sizeof(double));
    double *B = malloc((size_t)na * no * sizeof(double));
    double *A2 = malloc((size_t)na * na * sizeof(double));
    double *B2 = malloc((size_t)na * no * sizeof(double));
    double *sc = malloc((size_t)na * sizeof(double));
    double *sv = malloc((size_t)na * sizeof(double));
    out->W = malloc((size_t)s->n_in * no * sizeof(float));
    out->b = malloc((size_t)no * sizeof(float));
    if (!A || !B || !A2 || !B2 || !sc || !sv || !out->W || !out->b) {
        st = KV_ERR(KV_ENOMEM, "ridge: out of memory solving %d x %d", na, no);
        goto done;
    }
    out->n_in = s->n_in;
    out->n_out = no;
    /* NaN or Inf in the statistics means the activations were not finite: LAPACK would report an
     * "invalid argument" or return garbage. */
    for (size_t i = 0; i < (size_t)na * na; i++)
        if (!isfinite(s->G[i])) {
            st = KV_ERR(KV_ENUMERIC, "ridge: non-finite activations (NaN or Inf in the inputs: X^T X entry %zu "
                        "of %d x %d)", i, na, na);
            goto done;
        }
    for (size_t i = 0; i < (size_t)na * no; i++)
        if (!isfinite(s->C[i])) {
            st = KV_ERR(KV_ENUMERIC, "ridge: non-finite activations (NaN or Inf in the targets: X^T Y entry %zu)",
                        i);
            goto done;
        }
    /* symmetrize from the upper triangle */
    for (int i = 0; i < na; i++)
        for (int j = 0; j < na; j++)
            A[(size_t)i * na + j] = i <= j ? s->G[(size_t)i * na + j] : s->G[(size_t)j * na + i];
    double mean_diag = 0;
    for (int i = 0; i < s->n_in; i++) mean_diag += A[(size_t)i * na + i];
    mean_diag /= s->n_in;
    out->lambda = rel_lambda * mean_diag;
    for (int i = 0; i < s->n_in; i++) A[(size_t)i * na + i] += out->lambda;
    /* Equilibrate: A_s = S A S, B_s = S B with S = diag(1 / sqrt(A_ii)) (1 for a zero diagonal, e.g.
     * an all-zero input with lambda = 0). Cholesky's accuracy depends on the condition number of the
     * equilibrated matrix (van der Sluis), so that is the one judged; a column's scale alone (an
     * input a thousand times larger than another) is not ill-conditioning. */
    for (int i = 0; i < na; i++) {
        const double d = A[(size_t)i * na + i];
        sc[i] = d > 0 ? 1.0 / sqrt(d) : 1.0;
    }
    for (int i = 0; i < na; i++) {
        for (int j = 0; j < na; j++) A[(size_t)i * na + j] *= sc[i] * sc[j];
        for (int j = 0; j < no; j++) B[(size_t)i * no + j] = s->C[(size_t)i * no + j] * sc[i];
    }
    memcpy(A2, A, (size_t)na * na * sizeof(double));
    memcpy(B2, B, (size_t)na * no * sizeof(double));
    const double tol = kv_ridge_rcond_threshold(s->n_in);
    /* Cholesky, then LAPACK's estimate of the reciprocal 1-norm condition number. A factorization
     * that succeeds is not enough: rounding leaves a tiny positive pivot on an exactly singular
     * matrix with some BLAS kernels and not others. */
    const double anorm = LAPACKE_dlansy(LAPACK_ROW_MAJOR, '1', 'U', na, A, na);
    lapack_int info = LAPACKE_dpotrf(LAPACK_ROW_MAJOR, 'U', na, A, na);
    if (info < 0) {
        st = KV_ERR(KV_EINVAL, "ridge: LAPACKE_dpotrf argument %d invalid", (int)-info);
        goto done;
    }
    double rcond = 0.0;
    if (info == 0) {
        info = LAPACKE_dpocon(LAPACK_ROW_MAJOR, 'U', na, A, na, anorm, &rcond);
        if (info != 0) {
            st = KV_ERR(KV_ENUMERIC, "ridge: condition estimate failed (LAPACKE_dpocon info %d)", (int)info);
            goto done;
        }
    }
    out->rank = na;
    if (info == 0 && rcond >= tol) {
        out->rcond = rcond;
        info = LAPACKE_dpotrs(LAPACK_ROW_MAJOR, 'U', na, no, A, na, B, no);
        if (info != 0) {
            st = KV_ERR(KV_ENUMERIC, "ridge: LAPACKE_dpotrs failed (info %d)", (int)info);
            goto done;
        }
    } else {
        /* Rank deficient at the threshold (collinear inputs with lambda = 0, a constant column beside
         * the bias): the minimum-norm least-squares solution of the same (equilibrated) normal
         * equations, singular values below tol * the largest treated as zero. Twin columns get
         * equal weights. */
        out->used_fallback = 1;
        lapack_int rank = 0;
        info = LAPACKE_dgelsd(LAPACK_ROW_MAJOR, na, na, no, A2, na, B2, no, sv, tol, &rank);
        if (info != 0) {
            st = KV_ERR(KV_ENUMERIC, "ridge: SVD least squares failed (LAPACKE_dgelsd info %d)", (int)info);
            goto done;
        }
        out->rank = (int)rank;
        out->rcond = sv[0] > 0 ? sv[na - 1] / sv[0] : 0.0; /* 2-norm, from the singular values */
        memcpy(B, B2, (size_t)na * no * sizeof(double));
    }
    /* undo the scaling: Wa = S Wa_s */
    for (int i = 0; i < na; i++)
        for (int j = 0; j < no; j++) B[(size_t)i * no + j] *= sc[i];
    for (int i = 0; i < s->n_in; i++)
        for (int j = 0; j < no; j++) {
            double w = B[(size_t)i * no + j];
            if (!isfinite(w) || fabs(w) > FLT_MAX) {
                st = KV_ERR(KV_ENUMERIC, "ridge: coefficient at (%d, %d) is %g, not a finite float", i, j, w);
                goto done;
            }
            out->W[(size_t)i * no + j] = (float)w;
        }
    for (int j = 0; j < no; j++) {
        const double b = B[(size_t)s->n_in * no + j];
        if (!isfinite(b) || fabs(b) > FLT_MAX) {
            st = KV_ERR(KV_ENUMERIC, "ridge: bias %d is %g, not a finite float", j, b);
            goto done;
        }
        out->b[j] = (float)b;
    }
done:
    free(A);
    free(B);
    free(A2);
    free(B2);
    free(sc);
    free(sv);
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

/* Reduced rank (PLAN_FORMAT.md §6.5, format 1.3). Choice: the rank-r map whose predictions on the calibration
 * inputs are closest, in squared error, to the full ridge map's: with P = (X - mean x) W the centred
 * predictions, the best rank-r approximation of P (Eckart-Young) projects it onto the top r eigenvectors V_r
 * of P^T P / n = W^T Cxx W, so W_r = W V_r V_r^T. This is reduced-rank regression applied to the ridge fit
 * (for an OLS W it is exactly the least-squares optimum under the rank constraint, Izenman 1975); the bias is
 * refitted so that the mean prediction is unchanged. The plan's layout (y = W' x + b, W' = W^T) gets
 * left = V_r (n_out x r) and right = V_r^T W^T (r x n_in). *lost: the mean squared distance per sample
 * between the full and the rank-r predictions, the sum of the n_out - r smallest eigenvalues. */
kv_status kv_ridge_reduce_rank(float *left, float *right, float *bias, double *lost, const kv_ridge_fit *f,
                               const kv_ridge_stats *s, int rank) {
    const int ni = f->n_in, no = f->n_out, na = ni + 1;
    if (!left || !right || !bias || !f->W || !s || s->n_in != ni || s->n_out != no || rank < 1 ||
        rank > (ni < no ? ni : no))
        return KV_ERR(KV_EINVAL, "ridge: rank %d for a %d -> %d map (1..%d)", rank, ni, no, ni < no ? ni : no);
    const double n = s->G[(size_t)ni * na + ni]; /* the bias column's sum of squares: the sample count */
    if (!(n > 0)) return KV_ERR(KV_EINVAL, "ridge: no samples to reduce the rank on");
    double *mx = malloc((size_t)ni * sizeof(double)), *C = malloc((size_t)ni * ni * sizeof(double));
    double *Wd = malloc((size_t)ni * no * sizeof(double)), *T = malloc((size_t)ni * no * sizeof(double));
    double *M = malloc((size_t)no * no * sizeof(double)), *ev = malloc((size_t)no * sizeof(double));
    kv_status st = KV_OK;
    if (!mx || !C || !Wd || !T || !M || !ev) {
        st = KV_ERR(KV_ENOMEM, "ridge: out of memory reducing a %d x %d map", ni, no);
        goto done;
    }
    for (int i = 0; i < ni; i++) mx[i] = s->G[(size_t)i * na + ni] / n;
    for (int i = 0; i < ni; i++) /* centred covariance of the inputs, from the upper triangle */
        for (int j = 0; j < ni; j++) {
            const double g = i <= j ? s->G[(size_t)i * na + j] : s->G[(size_t)j * na + i];
            C[(size_t)i * ni + j] = g / n - mx[i] * mx[j];
        }
    for (size_t k = 0; k < (size_t)ni * no; k++) Wd[k] = f->W[k];
    cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, ni, no, ni, 1.0, C, ni, Wd, no, 0.0, T, no);
    cblas_dgemm(CblasRowMajor, CblasTrans, CblasNoTrans, no, no, ni, 1.0, Wd, no, T, no, 0.0, M, no);
    for (int i = 0; i < no; i++) /* exactly symmetric for the eigensolver */
        for (int j = 0; j < i; j++) M[(size_t)i * no + j] = M[(size_t)j * no + i] = 0.5 * (M[(size_t)i * no + j] + M[(size_t)j * no + i]);
    lapack_int info = LAPACKE_dsyevd(LAPACK_ROW_MAJOR, 'V', 'U', no, M, no, ev); /* ascending; columns */
    if (info != 0) {
        st = KV_ERR(KV_ENUMERIC, "ridge: the eigensolver failed (LAPACKE_dsyevd info %d)", (int)info);
        goto done;
    }
    double drop = 0;
    for (int k = 0; k < no - rank; k++) drop += ev[k] > 0 ? ev[k] : 0.0;
    if (lost) *lost = drop;
    for (int o = 0; o < no; o++) /* left = V_r, the eigenvectors of the r largest eigenvalues, largest first */
        for (int j = 0; j < rank; j++) left[(size_t)o * rank + j] = (float)M[(size_t)o * no + (no - 1 - j)];
    for (int j = 0; j < rank; j++) /* right = V_r^T W^T */
        for (int i = 0; i < ni; i++) {
            double acc = 0;
            for (int o = 0; o < no; o++) acc += M[(size_t)o * no + (no - 1 - j)] * Wd[(size_t)i * no + o];
            right[(size_t)j * ni + i] = (float)acc;
        }
    for (int o = 0; o < no; o++) { /* b_r = b + mean_x (W - W_r): the mean prediction kept */
        double acc = f->b[o];
        for (int i = 0; i < ni; i++) {
            double wr = 0;
            for (int j = 0; j < rank; j++) wr += (double)left[(size_t)o * rank + j] * right[(size_t)j * ni + i];
            acc += mx[i] * (Wd[(size_t)i * no + o] - wr);
        }
        bias[o] = (float)acc;
    }
done:
    free(mx);
    free(C);
    free(Wd);
    free(T);
    free(M);
    free(ev);
    return st;
}

/* GPTQ's dampening (Frantar et al. 2022's default: 1% of the mean diagonal), which keeps the inverse Hessian
 * defined when inputs are collinear (the reconstructions of K and V of one layer often are). */
#define GPTQ_DAMP 0.01

kv_status kv_ridge_quantize(float *wt, float *bias, uint8_t *codes, float *scale, float *offset, const kv_ridge_stats *s,
                            int bits, int group) {
    const int ni = s ? s->n_in : 0, no = s ? s->n_out : 0, na = ni + 1;
    if (!wt || !bias || !codes || !scale || !offset || !s || ni < 1 || no < 1)
        return KV_ERR(KV_EINVAL, "ridge: quantize needs the map, its statistics and the outputs");
    const double n = s->G[(size_t)ni * na + ni]; /* the bias column's sum of squares: the sample count */
    if (!(n > 0)) return KV_ERR(KV_EINVAL, "ridge: no samples to quantize the map on");
    double *mx = malloc((size_t)ni * sizeof(double)), *H = malloc((size_t)ni * ni * sizeof(double));
    kv_status st = KV_OK;
    if (!mx || !H) {
        st = KV_ERR(KV_ENOMEM, "ridge: out of memory quantizing a %d x %d map", ni, no);
        goto done;
    }
    for (int i = 0; i < ni; i++) mx[i] = s->G[(size_t)i * na + ni] / n;
    for (int i = 0; i < ni; i++) /* centred covariance of the inputs, from the upper triangle (as reduce_rank) */
        for (int j = 0; j < ni; j++) {
            const double g = i <= j ? s->G[(size_t)i * na + j] : s->G[(size_t)j * na + i];
            H[(size_t)i * ni + j] = g / n - mx[i] * mx[j];
        }
    if ((st = kv_gptq_quantize(wt, no, ni, H, bits, group, GPTQ_DAMP, codes, scale, offset)) != KV_OK) goto done;
    for (int o = 0; o < no; o++) { /* the bias given the quantized weights: mean(y) - wt mean(x) */
        double acc = s->C[(size_t)ni * no + o] / n;
        for (int i = 0; i < ni; i++) acc -= (double)wt[(size_t)o * ni + i] * mx[i];
        bias[o] = (float)acc;
    }
done:
    free(mx);
    free(H);
    return st;
}
