/* SQuat key quantization: CPU reference (kvrt.h; squat.txt §3.3, appendix A.2, Algorithm 1).
 *
 * P = I + lambda Qh^T Qh, P_inv = P^-1. The key is quantized in blocks of g channels; after block t
 * (channels [e_{t-1}, e_t)) the remaining channels move by W_t err with W_t = B_t H_t (Lemma 2,
 * eq. 6): B_t = P_inv[e_t:, :e_t], H_t = the last g_t columns of A_t^-1, A_t = P_inv[:e_t, :e_t].
 * The A_t^-1 come from A_T^-1 = P by Lemma 3: A_t^-1 = M - N^T O^-1 N for
 * A_{t+1}^-1 = [[M, N^T], [N, O]]. Everything is precomputed in double; W_t is kept as float.
 */
#include "kv_quant_math.h"
#include "kv_kernels_internal.h"

#include <lapacke.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

struct kv_squat {
    int d, g, nblocks;   /* nblocks = T = ceil(d / g) */
    double *pinv;        /* d x d */
    float *w;            /* concatenated W_t, t = 1..T-1 */
    size_t nw;
    size_t *woff;        /* T + 1 offsets into w (woff[t] for t = 1..T-1) */
};

static int block_end(const kv_squat *s, int t) { return t * s->g < s->d ? t * s->g : s->d; }

kv_status kv_squat_subspace_ref(float *qhat, const float *queries, size_t n, int d, int r) {
    if (d < 1 || r < 1 || (size_t)r > n || r > d)
        return KV_ERR(KV_EINVAL, "SQuat subspace: need 1 <= r <= min(n, d) (n=%zu d=%d r=%d)", n, d, r);
    size_t nd;
    if (kv_size_mul(&nd, n, (size_t)d) != 0) return KV_ERR(KV_EINVAL, "SQuat subspace: too many queries");
    const size_t k = n < (size_t)d ? n : (size_t)d;
    double *a = malloc(nd * sizeof *a), *sv = malloc(k * sizeof *sv), *vt = malloc(k * (size_t)d * sizeof *vt);
    double *superb = malloc(k * sizeof *superb);
    kv_status st = KV_OK;
    if (!a || !sv || !vt || !superb) {
        st = KV_ERR(KV_ENOMEM, "SQuat subspace: out of memory");
        goto done;
    }
    for (size_t i = 0; i < nd; i++) {
        if (!kv_qm_is_finite(queries[i])) {
            st = KV_ERR(KV_ENUMERIC, "SQuat subspace: non-finite query value");
            goto done;
        }
        a[i] = queries[i];
    }
    double udummy = 0.0;
    lapack_int info = LAPACKE_dgesvd(LAPACK_ROW_MAJOR, 'N', 'S', (lapack_int)n, d, a, d, sv, &udummy, 1,
                                     vt, d, superb);
    if (info != 0) {
        st = KV_ERR(KV_ENUMERIC, "SQuat subspace: dgesvd failed (info %d)", (int)info);
        goto done;
    }
    for (int i = 0; i < r; i++)
        for (int j = 0; j < d; j++) qhat[(size_t)i * (size_t)d + (size_t)j] = (float)(sv[i] * vt[(size_t)i * (size_t)d + (size_t)j]);
done:
    free(a);
    free(sv);
    free(vt);
    free(superb);
    return st;
}

void kv_squat_free(kv_squat *s) {
    if (!s) return;
    free(s->pinv);
    free(s->w);
    free(s->woff);
    free(s);
}

int kv_squat_dim(const kv_squat *s) { return s->d; }
int kv_squat_block(const kv_squat *s) { return s->g; }
const double *kv_squat_pinv(const kv_squat *s) { return s->pinv; }
const float *kv_squat_weights(const kv_squat *s, size_t *count) {
    if (count) *count = s->nw;
    return s->w;
}

kv_status kv_squat_create(kv_squat **out, const float *qhat, int r, int d, float lambda, int block) {
    *out = NULL;
    if (d < 1 || d > 4096) return KV_ERR(KV_EINVAL, "SQuat: dimension must be in 1..4096 (got %d)", d);
    if (block < 1) return KV_ERR(KV_EINVAL, "SQuat: block must be >= 1 (got %d)", block);
    if (r < 0 || (r > 0 && !qhat)) return KV_ERR(KV_EINVAL, "SQuat: bad subspace (r=%d)", r);
    if (!(lambda >= 0.0f) || !kv_qm_is_finite(lambda))
        return KV_ERR(KV_EINVAL, "SQuat: lambda must be finite and >= 0 (got %g)", (double)lambda);
    kv_status st = KV_OK;
    const size_t D = (size_t)d;
    kv_squat *s = calloc(1, sizeof *s);
    double *p = malloc(D * D * sizeof *p), *ainv = malloc(D * D * sizeof *ainv), *x = malloc(D * D * sizeof *x);
    double *o = malloc(D * D * sizeof *o);
    if (!s || !p || !ainv || !x || !o) {
        st = KV_ERR(KV_ENOMEM, "SQuat: out of memory");
        goto done;
    }
    s->d = d;
    s->g = block < d ? block : d;
    s->nblocks = (d + s->g - 1) / s->g;
    s->pinv = malloc(D * D * sizeof *s->pinv);
    s->woff = calloc((size_t)s->nblocks + 1, sizeof *s->woff);
    if (!s->pinv || !s->woff) {
        st = KV_ERR(KV_ENOMEM, "SQuat: out of memory");
        goto done;
    }
    /* P = I + lambda Qh^T Qh */
    for (size_t i = 0; i < D; i++)
        for (size_t j = 0; j < D; j++) {
            double acc = 0.0;
            for (int k = 0; k < r; k++) acc += (double)qhat[(size_t)k * D + i] * (double)qhat[(size_t)k * D + j];
            p[i * D + j] = (i == j ? 1.0 : 0.0) + (double)lambda * acc;
        }
    for (size_t i = 0; i < D * D; i++) {
        if (!isfinite(p[i])) {
            st = KV_ERR(KV_ENUMERIC, "SQuat: non-finite subspace");
            goto done;
        }
    }
    memcpy(s->pinv, p, D * D * sizeof *p);
    lapack_int info = LAPACKE_dpotrf(LAPACK_ROW_MAJOR, 'L', d, s->pinv, d);
    if (info == 0) info = LAPACKE_dpotri(LAPACK_ROW_MAJOR, 'L', d, s->pinv, d);
    if (info != 0) {
        st = KV_ERR(KV_ENUMERIC, "SQuat: I + lambda Qh^T Qh is not invertible (info %d)", (int)info);
        goto done;
    }
    for (size_t i = 0; i < D; i++)
        for (size_t j = i + 1; j < D; j++) s->pinv[i * D + j] = s->pinv[j * D + i];
    /* sizes of the W_t */
    size_t total = 0;
    for (int t = 1; t < s->nblocks; t++) {
        const int e = block_end(s, t), gt = e - block_end(s, t - 1);
        s->woff[t] = total;
        total += (size_t)(d - e) * (size_t)gt;
    }
    s->woff[s->nblocks] = total;
    s->nw = total;
    s->w = malloc((total ? total : 1) * sizeof *s->w);
    if (!s->w) {
        st = KV_ERR(KV_ENOMEM, "SQuat: out of memory");
        goto done;
    }
    /* A_T^-1 = P (leading dimension D throughout); walk t = T-1 .. 1 */
    memcpy(ainv, p, D * D * sizeof *p);
    for (int t = s->nblocks - 1; t >= 1; t--) {
        const int e = block_end(s, t), e1 = block_end(s, t + 1), go = e1 - e;
        /* X = O^-1 N with O = ainv[e:e1, e:e1], N = ainv[e:e1, 0:e] */
        for (int i = 0; i < go; i++) {
            for (int j = 0; j < go; j++) o[(size_t)i * (size_t)go + (size_t)j] = ainv[(size_t)(e + i) * D + (size_t)(e + j)];
            for (int j = 0; j < e; j++) x[(size_t)i * (size_t)e + (size_t)j] = ainv[(size_t)(e + i) * D + (size_t)j];
        }
        info = LAPACKE_dposv(LAPACK_ROW_MAJOR, 'L', go, e, o, go, x, e);
        if (info != 0) {
            st = KV_ERR(KV_ENUMERIC, "SQuat: Lemma 3 solve failed at block %d (info %d)", t, (int)info);
            goto done;
        }
        /* A_t^-1 = M - N^T X, built in o (free now) because N is read while M is replaced */
        double *m = o;
        for (int i = 0; i < e; i++)
            for (int j = 0; j < e; j++) {
                double acc = 0.0;
                for (int k = 0; k < go; k++)
                    acc += ainv[(size_t)(e + k) * D + (size_t)i] * x[(size_t)k * (size_t)e + (size_t)j];
                m[(size_t)i * (size_t)e + (size_t)j] = ainv[(size_t)i * D + (size_t)j] - acc;
            }
        for (int i = 0; i < e; i++)
            for (int j = 0; j < e; j++) ainv[(size_t)i * D + (size_t)j] = m[(size_t)i * (size_t)e + (size_t)j];
        /* W_t = B_t H_t: B_t = pinv[e:d, 0:e], H_t = ainv[0:e, e-gt:e] */
        const int gt = e - block_end(s, t - 1);
        float *w = s->w + s->woff[t];
        for (int i = 0; i < d - e; i++)
            for (int j = 0; j < gt; j++) {
                double acc = 0.0;
                for (int k = 0; k < e; k++)
                    acc += s->pinv[(size_t)(e + i) * D + (size_t)k] * ainv[(size_t)k * D + (size_t)(e - gt + j)];
                w[(size_t)i * (size_t)gt + (size_t)j] = (float)acc;
            }
    }
done:
    free(p);
    free(ainv);
    free(x);
    free(o);
    if (st != KV_OK) {
        kv_squat_free(s);
        return st;
    }
    *out = s;
    return KV_OK;
}

kv_status kv_squat_update_ref(float *rest, const kv_squat *s, int t, const float *err) {
    if (t < 1 || t >= s->nblocks) return KV_ERR(KV_EINVAL, "SQuat update: block %d out of 1..%d", t, s->nblocks - 1);
    const int e = block_end(s, t), gt = e - block_end(s, t - 1);
    const float *w = s->w + s->woff[t];
    for (int i = 0; i < s->d - e; i++) rest[i] = kv_qm_squat_update(rest[i], w + (size_t)i * (size_t)gt, err, gt);
    return KV_OK;
}

kv_status kv_squat_encode_ref(uint32_t *codes, void *scales, void *zeros, const kv_squat *s,
                              const kv_uniform *q, size_t tokens, const float *x) {
    kv_status st = kv_uniform_check(q);
    if (st != KV_OK) return st;
    if (q->axis != KV_AXIS_TOKENS) return KV_ERR(KV_EINVAL, "SQuat: keys must be grouped along tokens");
    const size_t C = (size_t)s->d, G = (size_t)q->group;
    size_t n;
    if ((st = kv_block_values(&n, tokens, C)) != KV_OK || n == 0) return st;
    const int bits = q->bits, per = kv_qm_per_word(bits, q->pack11), pt = (int)q->param_type;
    float *k = malloc(n * sizeof *k);
    float *err = malloc(G * (size_t)s->g * sizeof *err);
    uint8_t *cs = malloc(n);
    if (!k || !err || !cs) {
        st = KV_ERR(KV_ENOMEM, "SQuat: out of memory");
        goto done;
    }
    memcpy(k, x, n * sizeof *k);
    for (size_t kg = 0; kg * G < tokens; kg++) {
        const size_t r0 = kg * G, rows = kv_qm_tok_group_rows(G, tokens, kg);
        float *kt = k + r0 * C;
        for (int t = 1; t <= s->nblocks; t++) {
            const int b0 = block_end(s, t - 1), b1 = block_end(s, t), gt = b1 - b0;
            for (int c = b0; c < b1; c++) {
                float lo = kt[c], hi = kt[c];
                int bad = 0;
                for (size_t i = 0; i < rows; i++) {
                    const float v = kt[i * C + (size_t)c];
                    bad |= !kv_qm_is_finite(v);
                    lo = v < lo ? v : lo;
                    hi = v > hi ? v : hi;
                }
                if (bad) {
                    st = KV_ERR(KV_ENUMERIC, "SQuat: non-finite key value (or error propagation overflow)");
                    goto done;
                }
                const kv_qm_uparams p = kv_qm_uniform_params(lo, hi, bits, q->eta);
                const size_t grp = kg * C + (size_t)c;
                kv_qm_param_store(scales, grp, p.sc, pt);
                kv_qm_param_store(zeros, grp, p.zc, pt);
                const float sr = kv_qm_param_round(p.sc, pt), zr = kv_qm_param_round(p.zc, pt);
                const size_t j0 = kg * G * C + (size_t)c * rows;
                for (size_t i = 0; i < rows; i++) {
                    const size_t j = j0 + i;
                    const float v = kt[i * C + (size_t)c];
                    const uint32_t code = kv_qm_uniform_code(v, p.z, p.inv, kv_qm_slot_max(bits, per, (int)(j % (size_t)per)));
                    cs[j] = (uint8_t)code;
                    err[i * (size_t)gt + (size_t)(c - b0)] = kv_qm_uniform_dequant(code, sr, zr) - v;
                }
            }
            if (t < s->nblocks)
                for (size_t i = 0; i < rows; i++)
                    kv_squat_update_ref(kt + i * C + (size_t)b1, s, t, err + i * (size_t)gt);
        }
    }
    st = kv_pack_ref(codes, cs, n, bits, q->pack11);
done:
    free(k);
    free(err);
    free(cs);
    return st;
}
