/* GPTQ quantization of a linear predictor's weights (kv_calib.h, kv_gptq_quantize): aquakv.txt §4.1 stores
 * the AQUA-KV predictors as 4-bit GPTQ codes (Frantar et al. 2022). This is the plain algorithm, column by
 * column, without lazy batching (the predictors are at most ~1024 inputs wide: one pass of rank-1 updates
 * costs rows * cols^2 / 2 multiply-adds) and without act-order (the columns keep their order, so the codes
 * map one to one onto the plan's layout). Serial and in a fixed order: the codes are the same bits for any
 * thread count. */
#include "kv_calib.h"
#include "kv_formats.h"

#include <lapacke.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Round to f16 and back through f32, the way the plan stores a scale or an offset. */
static float f16round(double x) { return kv_f16_to_f32(kv_f32_to_f16((float)x)); }

/* U, the upper Cholesky factor of (H + damp * mean(diag) I)^-1 (Hinv = U^T U), into A (n x n, row-major,
 * upper triangle; the strict lower triangle is left as garbage and never read). */
static kv_status gptq_inverse_factor(double *A, const double *H, int n, double damp) {
    memcpy(A, H, (size_t)n * (size_t)n * sizeof *A);
    /* A dead input (H[i][i] == 0: the input is always zero, so its row and column of H are zero) makes Hd
     * singular up to the damping; its weights cannot change the output, so any positive diagonal will do.
     * 1 as in the reference implementation: its column then sees no cross terms and keeps plain rounding. */
    for (int i = 0; i < n; i++)
        if (A[(size_t)i * n + i] == 0.0) A[(size_t)i * n + i] = 1.0;
    double mean = 0.0;
    for (int i = 0; i < n; i++) mean += A[(size_t)i * n + i];
    mean /= n;
    /* The damping is relative to the inputs' scale; a zero mean (diagonal entries of both signs, not a
     * scatter) falls back to an absolute damp so that the factorization below reports the problem. */
    const double add = damp * (mean != 0.0 ? mean : 1.0);
    for (int i = 0; i < n; i++) A[(size_t)i * n + i] += add;

    lapack_int info = LAPACKE_dpotrf(LAPACK_ROW_MAJOR, 'U', n, A, n);
    if (info != 0)
        return KV_ERR(KV_ENUMERIC, "gptq: H + %g * mean(diag H) * I is not positive definite (Cholesky fails at "
                      "column %d of %d): H is not a scatter matrix", damp, (int)info - 1, n);
    info = LAPACKE_dpotri(LAPACK_ROW_MAJOR, 'U', n, A, n);
    if (info != 0)
        return KV_ERR(KV_ENUMERIC, "gptq: inverting the damped H failed (LAPACK dpotri info %d)", (int)info);
    /* dpotri leaves the inverse in the upper triangle, which is all dpotrf 'U' reads. */
    info = LAPACKE_dpotrf(LAPACK_ROW_MAJOR, 'U', n, A, n);
    if (info != 0)
        return KV_ERR(KV_ENUMERIC, "gptq: the inverse of the damped H is not numerically positive definite "
                      "(Cholesky fails at column %d of %d): raise damp", (int)info - 1, n);
    return KV_OK;
}

kv_status kv_gptq_quantize(float *w, int rows, int cols, const double *H, int bits, int group, double damp,
                           uint8_t *codes, float *scale, float *offset) {
    if (!w || !H || !codes || !scale || !offset) return KV_ERR(KV_EINVAL, "gptq: NULL argument");
    if (rows < 1 || cols < 1) return KV_ERR(KV_EINVAL, "gptq: bad dimensions %d x %d", rows, cols);
    if (bits < 1 || bits > 8) return KV_ERR(KV_EINVAL, "gptq: %d bits (1..8 supported)", bits);
    if (group < 1 || cols % group != 0)
        return KV_ERR(KV_EINVAL, "gptq: group %d does not divide the %d columns", group, cols);
    if (!(damp > 0) || !isfinite(damp)) return KV_ERR(KV_EINVAL, "gptq: damp %g must be a positive number", damp);
    size_t nh, nw, bytes_h, bytes_w;
    if (kv_size_mul(&nh, (size_t)cols, (size_t)cols) || kv_size_mul(&nw, (size_t)rows, (size_t)cols) ||
        kv_size_mul(&bytes_h, nh, sizeof(double)) || kv_size_mul(&bytes_w, nw, sizeof(double)))
        return KV_ERR(KV_EINVAL, "gptq: %d x %d weights are too large", rows, cols);
    /* Non-finite statistics or weights mean the fit upstream went wrong; LAPACK would return garbage. */
    for (size_t k = 0; k < nh; k++)
        if (!isfinite(H[k]))
            return KV_ERR(KV_ENUMERIC, "gptq: non-finite H entry (%zu, %zu) of %d x %d", k / (size_t)cols,
                          k % (size_t)cols, cols, cols);
    for (size_t k = 0; k < nw; k++)
        if (!isfinite(w[k]))
            return KV_ERR(KV_ENUMERIC, "gptq: non-finite weight (%zu, %zu) of %d x %d", k / (size_t)cols,
                          k % (size_t)cols, rows, cols);

    double *U = malloc(bytes_h);
    double *wd = malloc(bytes_w);
    if (!U || !wd) {
        free(U);
        free(wd);
        return KV_ERR(KV_ENOMEM, "gptq: out of memory for %d x %d weights", rows, cols);
    }
    kv_status st = gptq_inverse_factor(U, H, cols, damp);
    if (st != KV_OK) goto done;
    /* The working copy is double: the error feedback adds up to cols small corrections per weight, and
     * f32 sums would drift from the reference algorithm by more than the codes' rounding decisions allow. */
    for (size_t k = 0; k < nw; k++) wd[k] = w[k];

    const int maxq = (1 << bits) - 1, ng = cols / group;
    for (int i = 0; i < cols; i++) {
        const int g = i / group;
        const double *u = U + (size_t)i * cols; /* row i of U: u[i] diagonal, u[j > i] the feedback */
        for (int r = 0; r < rows; r++) {
            double *wr = wd + (size_t)r * cols;
            float *sc = scale + (size_t)r * ng + g, *of = offset + (size_t)r * ng + g;
            if (i % group == 0) {
                /* The group's range from the weights as they are now, after the earlier columns' feedback:
                 * the grid must cover what is about to be rounded, not the original weights. */
                double mn = wr[i], mx = wr[i];
                for (int j = i + 1; j < i + group; j++) {
                    mn = fmin(mn, wr[j]);
                    mx = fmax(mx, wr[j]);
                }
                *sc = f16round((mx - mn) / maxq);
                *of = f16round(mn);
                if (!isfinite(*sc) || !isfinite(*of)) {
                    st = KV_ERR(KV_EINVAL, "gptq: row %d columns %d..%d span [%g, %g]: the scale or offset is "
                                "beyond the f16 range (65504)", r, i, i + group - 1, mn, mx);
                    goto done;
                }
            }
            /* The f16 offset may sit a little above the group's minimum, and the f16 scale a little short of
             * the range: the clamp keeps those ends on the first and last code. */
            int code = 0;
            if (*sc > 0.0f) {
                const double x = round((wr[i] - (double)*of) / (double)*sc);
                code = x < 0 ? 0 : x > maxq ? maxq : (int)x;
            }
            const float q = kv_plan_pred_qvalue(*sc, *of, code);
            const double err = (wr[i] - (double)q) / u[i];
            for (int j = i + 1; j < cols; j++) wr[j] -= err * u[j];
            codes[(size_t)r * cols + i] = (uint8_t)code;
            wr[i] = q; /* column i is final: its slot holds the dequantized weight from now on */
        }
    }
    /* w is written only on success, so that a refusal leaves the caller's weights as they were. */
    for (size_t k = 0; k < nw; k++) w[k] = (float)wd[k];
done:
    free(U);
    free(wd);
    return st;
}
