/* fit_squat.c — SQuat keys: the rank r and lambda of each layer chosen from calibration data
 * (squat.txt; calib/FIT.md §3.3 gives the rule and the paper's ambiguities resolved here).
 *
 * Per KV head the queries of its GQA group (all query heads, post-RoPE, every token of a sequence)
 * give a Gram Q^T Q, accumulated in double per sequence. The calibration sequences' Grams are summed
 * (over shards in shard order: the same bits for any number of ranks) and divided by their number:
 * the mean per-sequence Gram, whose eigenvectors scaled by sqrt(eigenvalue) are the top right singular
 * vectors of one sequence's stacked queries scaled by their singular values (kv_squat_subspace_ref's
 * output) on average, so that lambda means what it means for a prompt of data.seq_len tokens. Its
 * spectrum gives the candidate ranks (the paper's 5, squat.r, and the ranks holding 90/95/99% of the
 * query energy, the largest over the layer's KV heads); the lambdas are the paper's 5e-4 and 1e-3 up
 * to 1e-1 (where its Table 3 collapses) and 0 (= the plain uniform quantizer, KIVI at the same bits).
 * Each candidate quantizes the held-out sequences' keys with kv_squat_encode_ref at the stream's bits
 * (subspace of the variant the plan runs: each sequence's own queries for squat.subspace prompt, the
 * stored basis for static) and is scored on held-out queries by the attention-score error and the
 * softmax-output error; the least output error wins, ties to the smaller r. */
#include "fit_internal.h"

#include <cblas.h>
#include <lapacke.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

const char *const kv_fit_sq_metric_names[KV_FIT_SQ_METRICS] = {
    "squat_r",          "squat_lambda",          "squat_score_err",  "squat_out_err",       "squat_default_score_err",
    "squat_default_out_err", "squat_kivi_score_err", "squat_kivi_out_err", "squat_perhead_out_err", "squat_energy"};

/* The paper's setting (squat.txt §5: r = 5, lambda = 1e-3), always measured for the report. */
#define SQ_PAPER_R 5
#define SQ_PAPER_LAMBDA 1e-3f
static const float k_lambdas[] = {5e-4f, 1e-3f, 5e-3f, 1e-2f, 5e-2f, 1e-1f};
static const double k_energy[] = {0.90, 0.95, 0.99};

void kv_fit_sq_free(kv_fit_sq *e) {
    if (!e) return;
    for (int64_t j = 0; e->gram && j < e->n_local; j++) free(e->gram[j]);
    for (int64_t j = 0; e->ho && j < e->n_local; j++) free(e->ho[j]);
    free(e->gram);
    free(e->ho);
    free(e->shard_ncal);
    free(e->eigval);
    free(e->eigvec);
    for (int64_t i = 0; e->enc && i < e->n_enc; i++) kv_squat_free(e->enc[i]);
    free(e->enc);
    for (int i = 0; e->cand_enc && i < e->n_cand * e->n_kv_heads; i++) kv_squat_free(e->cand_enc[i]);
    free(e->cand_enc);
    memset(e, 0, sizeof *e);
}

int kv_fit_sq_g(const kv_fit_config *cfg, int head_dim) {
    if (cfg->squat.g > 0) return cfg->squat.g;
    return head_dim >= 2 ? head_dim / 2 : 1;
}

static size_t ho_floats(const kv_fit_sq *e) {
    const size_t kvd = (size_t)e->n_kv_heads * (size_t)e->head_dim, qd = (size_t)e->n_heads * (size_t)e->head_dim;
    return (size_t)e->n_q * qd + 2 * (size_t)e->seq_len * kvd;
}

kv_status kv_fit_sq_init(kv_fit_sq *e, const kv_fit_config *cfg, int n_heads, int n_kv_heads, int head_dim, int seq_len,
                         int sinks, int n_comp, int recent, int64_t n_local, const int64_t *shard_nseq,
                         const int64_t *shard_ncal) {
    memset(e, 0, sizeof *e);
    if (!cfg->squat.enabled) return KV_OK;
    e->on = 1;
    e->prompt = cfg->squat.subspace == KV_FIT_SQ_PROMPT;
    e->fixed = cfg->squat.choose == KV_FIT_SQ_FIXED;
    e->n_heads = n_heads, e->n_kv_heads = n_kv_heads, e->head_dim = head_dim;
    e->seq_len = seq_len, e->sinks = sinks, e->n_comp = n_comp, e->recent = recent;
    e->g = kv_fit_sq_g(cfg, head_dim);
    e->n_local = n_local;
    e->shard_nseq = shard_nseq;
    e->n_q = (seq_len - sinks) / KV_FIT_SQ_QSTRIDE;
    if (head_dim % e->g != 0)
        return KV_ERR(KV_EINVAL, "squat.g %d must divide head_dim %d", e->g, head_dim);
    if (n_kv_heads < 1 || n_heads % n_kv_heads != 0)
        return KV_ERR(KV_EINVAL, "SQuat: %d query heads do not group over %d KV heads", n_heads, n_kv_heads);
    const size_t nl = (size_t)(n_local > 0 ? n_local : 1);
    e->gram = calloc(nl, sizeof *e->gram);
    e->ho = calloc(nl, sizeof *e->ho);
    e->shard_ncal = calloc(nl, sizeof *e->shard_ncal);
    if (!e->gram || !e->ho || !e->shard_ncal) return KV_ERR(KV_ENOMEM, "out of memory for SQuat statistics");
    const size_t hh = (size_t)head_dim * (size_t)head_dim * (size_t)n_kv_heads;
    for (int64_t j = 0; j < n_local; j++) {
        e->shard_ncal[j] = shard_ncal[j];
        const int64_t n_ho = shard_nseq[j] - shard_ncal[j];
        e->gram[j] = malloc((size_t)shard_nseq[j] * hh * sizeof(double));
        if (!e->gram[j]) return KV_ERR(KV_ENOMEM, "out of memory for SQuat query Grams");
        if (n_ho > 0 && !(e->ho[j] = malloc((size_t)n_ho * ho_floats(e) * sizeof(float))))
            return KV_ERR(KV_ENOMEM, "out of memory for SQuat held-out queries");
    }
    return KV_OK;
}

/* Position of sampled query i of a held-out sequence. */
static int q_pos(const kv_fit_sq *e, int i) { return e->sinks + (i + 1) * KV_FIT_SQ_QSTRIDE - 1; }

kv_status kv_fit_sq_capture(kv_fit_sq *e, int64_t j, const kv_capture *c) {
    if (!e->on) return KV_OK;
    const int G = e->n_kv_heads, hd = e->head_dim, per = e->n_heads / G, T = c->n_tokens;
    const size_t qd = (size_t)c->q_dim, kvd = (size_t)c->kv_dim, hh = (size_t)hd * (size_t)hd;
    if (T != e->seq_len || c->n_seqs != (int)e->shard_nseq[j])
        return KV_ERR(KV_EINVAL, "SQuat capture: %d x %d tokens, expected %d x %d", c->n_seqs, T,
                      (int)e->shard_nseq[j], e->seq_len);
    const size_t rows = (size_t)T * (size_t)per;
    double *a = malloc(rows * (size_t)hd * sizeof(double));
    if (!a) return KV_ERR(KV_ENOMEM, "out of memory for a query Gram");
    for (int b = 0; b < c->n_seqs; b++) {
        for (int g = 0; g < G; g++) {
            for (int t = 0; t < T; t++)
                for (int p = 0; p < per; p++) {
                    const float *q = c->q + ((size_t)b * (size_t)T + (size_t)t) * qd + (size_t)(g * per + p) * (size_t)hd;
                    double *dst = a + ((size_t)t * (size_t)per + (size_t)p) * (size_t)hd;
                    for (int x = 0; x < hd; x++) dst[x] = q[x];
                }
            double *gm = e->gram[j] + ((size_t)b * (size_t)G + (size_t)g) * hh;
            cblas_dsyrk(CblasRowMajor, CblasUpper, CblasTrans, hd, (int)rows, 1.0, a, hd, 0.0, gm, hd);
            for (int x = 0; x < hd; x++)
                for (int y = 0; y < x; y++) gm[(size_t)x * (size_t)hd + (size_t)y] = gm[(size_t)y * (size_t)hd + (size_t)x];
        }
        if (b < e->shard_ncal[j]) continue;
        float *h = e->ho[j] + (size_t)(b - e->shard_ncal[j]) * ho_floats(e);
        for (int i = 0; i < e->n_q; i++)
            memcpy(h + (size_t)i * qd, c->q + ((size_t)b * (size_t)T + (size_t)q_pos(e, i)) * qd, qd * sizeof(float));
        float *hk = h + (size_t)e->n_q * qd, *hv = hk + (size_t)T * kvd;
        memcpy(hk, c->k + (size_t)b * (size_t)T * kvd, (size_t)T * kvd * sizeof(float));
        memcpy(hv, c->v + (size_t)b * (size_t)T * kvd, (size_t)T * kvd * sizeof(float));
    }
    free(a);
    return KV_OK;
}

size_t kv_fit_sq_gram_len(const kv_fit_sq *e) {
    return (size_t)e->n_kv_heads * (size_t)e->head_dim * (size_t)e->head_dim + 1;
}

void kv_fit_sq_gram_part(const kv_fit_sq *e, int64_t j, double *out) {
    const size_t n = kv_fit_sq_gram_len(e) - 1;
    for (int64_t b = 0; b < e->shard_ncal[j]; b++) {
        const double *gm = e->gram[j] + (size_t)b * n;
        for (size_t i = 0; i < n; i++) out[i] += gm[i];
    }
    out[n] += (double)e->shard_ncal[j];
}

/* Eigen-decomposition of a symmetric hd x hd matrix: val descending, vec rows = eigenvectors. */
static kv_status eig_desc(double *val, double *vec, const double *m, int hd) {
    const size_t hh = (size_t)hd * (size_t)hd;
    double *a = malloc(hh * sizeof(double)), *w = malloc((size_t)hd * sizeof(double));
    kv_status s = KV_OK;
    if (!a || !w) {
        s = KV_ERR(KV_ENOMEM, "out of memory");
        goto done;
    }
    memcpy(a, m, hh * sizeof(double));
    for (size_t i = 0; i < hh; i++)
        if (!isfinite(a[i])) {
            s = KV_ERR(KV_ENUMERIC, "SQuat: non-finite query Gram (NaN or Inf queries)");
            goto done;
        }
    const lapack_int info = LAPACKE_dsyevd(LAPACK_ROW_MAJOR, 'V', 'U', hd, a, hd, w);
    if (info != 0) {
        s = KV_ERR(KV_ENUMERIC, "SQuat: eigen-decomposition of a query Gram failed (info %d)", (int)info);
        goto done;
    }
    for (int i = 0; i < hd; i++) { /* ascending columns -> descending rows */
        const int src = hd - 1 - i;
        val[i] = w[src] > 0 ? w[src] : 0.0;
        for (int x = 0; x < hd; x++) vec[(size_t)i * (size_t)hd + (size_t)x] = a[(size_t)x * (size_t)hd + (size_t)src];
    }
done:
    free(a);
    free(w);
    return s;
}

/* qhat[r][hd] = sqrt(val_i) vec_i: kv_squat_subspace_ref's layout. */
static void basis_rows(float *qhat, const double *val, const double *vec, int hd, int r) {
    for (int i = 0; i < r; i++)
        for (int x = 0; x < hd; x++)
            qhat[(size_t)i * (size_t)hd + (size_t)x] = (float)(sqrt(val[i]) * vec[(size_t)i * (size_t)hd + (size_t)x]);
}

kv_status kv_fit_sq_gram_basis(float *qhat, double *energy, const double *gram, int hd, int r) {
    if (r < 1 || r > hd) return KV_ERR(KV_EINVAL, "SQuat: r %d out of 1..%d", r, hd);
    double *val = malloc((size_t)hd * sizeof(double)), *vec = malloc((size_t)hd * (size_t)hd * sizeof(double));
    kv_status s = val && vec ? eig_desc(val, vec, gram, hd) : KV_ERR(KV_ENOMEM, "out of memory");
    if (s == KV_OK) {
        basis_rows(qhat, val, vec, hd, r);
        if (energy) {
            double top = 0, all = 0;
            for (int i = 0; i < hd; i++) all += val[i], top += i < r ? val[i] : 0.0;
            *energy = all > 0 ? top / all : NAN;
        }
    }
    free(val);
    free(vec);
    return s;
}

static void free_cand_enc(kv_fit_sq *e) {
    for (int i = 0; e->cand_enc && i < e->n_cand * e->n_kv_heads; i++) kv_squat_free(e->cand_enc[i]);
    free(e->cand_enc);
    e->cand_enc = NULL;
}

static void add_cand(kv_fit_sq *e, int r, float lambda) {
    for (int i = 0; i < e->n_cand; i++)
        if (e->cand_r[i] == r && e->cand_lambda[i] == lambda) return;
    if (e->n_cand < KV_FIT_SQ_MAX_CANDS) e->cand_r[e->n_cand] = r, e->cand_lambda[e->n_cand] = lambda, e->n_cand++;
}

static int cand_cmp(const kv_fit_sq *e, int a, int b) {
    if (e->cand_r[a] != e->cand_r[b]) return e->cand_r[a] < e->cand_r[b] ? -1 : 1;
    return e->cand_lambda[a] < e->cand_lambda[b] ? -1 : e->cand_lambda[a] > e->cand_lambda[b];
}

kv_status kv_fit_sq_candidates(kv_fit_sq *e, const double *gram_sum, const kv_fit_config *cfg) {
    const int G = e->n_kv_heads, hd = e->head_dim;
    const size_t hh = (size_t)hd * (size_t)hd;
    free_cand_enc(e);
    free(e->eigval);
    free(e->eigvec);
    e->eigval = malloc((size_t)G * (size_t)hd * sizeof(double));
    e->eigvec = malloc((size_t)G * hh * sizeof(double));
    double *mean = malloc(hh * sizeof(double));
    kv_status s = e->eigval && e->eigvec && mean ? KV_OK : KV_ERR(KV_ENOMEM, "out of memory");
    const double n_seq = gram_sum[(size_t)G * hh];
    if (s == KV_OK && !(n_seq > 0)) s = KV_ERR(KV_EINVAL, "SQuat: no calibration sequences for the query Gram");
    int r_energy[3] = {1, 1, 1};
    for (int g = 0; g < G && s == KV_OK; g++) {
        for (size_t i = 0; i < hh; i++) mean[i] = gram_sum[(size_t)g * hh + i] / n_seq;
        double *val = e->eigval + (size_t)g * (size_t)hd;
        if ((s = eig_desc(val, e->eigvec + (size_t)g * hh, mean, hd)) != KV_OK) break;
        double all = 0;
        for (int i = 0; i < hd; i++) all += val[i];
        for (int k = 0; k < 3; k++) {
            double top = 0;
            int r = 0;
            while (r < hd && (all <= 0 || top < k_energy[k] * all)) top += val[r++];
            if (r > r_energy[k]) r_energy[k] = r;
        }
    }
    free(mean);
    if (s != KV_OK) return s;
    for (int k = 0; k < 3; k++) e->r_energy[k] = r_energy[k];
    e->n_cand = 0;
    const int r_cfg = cfg->squat.r < hd ? cfg->squat.r : hd, r_paper = SQ_PAPER_R < hd ? SQ_PAPER_R : hd;
    add_cand(e, r_cfg, (float)cfg->squat.lambda);
    add_cand(e, r_paper, SQ_PAPER_LAMBDA);
    if (!e->fixed) {
        const int rs[5] = {r_paper, r_cfg, r_energy[0], r_energy[1], r_energy[2]};
        for (int i = 0; i < 5; i++) {
            for (size_t k = 0; k < sizeof k_lambdas / sizeof *k_lambdas; k++) add_cand(e, rs[i], k_lambdas[k]);
            add_cand(e, rs[i], (float)cfg->squat.lambda);
        }
    }
    /* lambda 0 is the uniform quantizer whatever r: one candidate, at the smallest r */
    int r_min = hd;
    for (int i = 0; i < e->n_cand; i++) r_min = e->cand_r[i] < r_min ? e->cand_r[i] : r_min;
    add_cand(e, r_min, 0.0f);
    /* sorted by r, then lambda: the first of equal errors is the smaller r */
    for (int i = 1; i < e->n_cand; i++)
        for (int k = i; k > 0 && cand_cmp(e, k - 1, k) > 0; k--) {
            const int tr = e->cand_r[k];
            const float tl = e->cand_lambda[k];
            e->cand_r[k] = e->cand_r[k - 1], e->cand_lambda[k] = e->cand_lambda[k - 1];
            e->cand_r[k - 1] = tr, e->cand_lambda[k - 1] = tl;
        }
    if (e->prompt) return KV_OK;
    /* static subspace: one encoder per candidate and KV head, shared by every held-out sequence */
    e->cand_enc = calloc((size_t)e->n_cand * (size_t)G, sizeof *e->cand_enc);
    float *qhat = malloc(hh * sizeof(float));
    if (!e->cand_enc || !qhat) s = KV_ERR(KV_ENOMEM, "out of memory");
    for (int c = 0; c < e->n_cand && s == KV_OK; c++)
        for (int g = 0; g < G && s == KV_OK; g++) {
            basis_rows(qhat, e->eigval + (size_t)g * (size_t)hd, e->eigvec + (size_t)g * hh, hd, e->cand_r[c]);
            s = kv_squat_create(&e->cand_enc[(size_t)c * (size_t)G + (size_t)g], qhat, e->cand_r[c], hd,
                                e->cand_lambda[c], e->g);
        }
    free(qhat);
    return s;
}

/* Quantize one head's n_comp x hd keys (columns g of x, row stride ld) chunk by chunk with enc. */
static kv_status head_roundtrip(float *xh, const kv_squat *enc, const kv_uniform *uq, int n_rows, int recent, int hd,
                                const float *x, size_t ld, float *tmp, uint32_t *codes, void *sc, void *zr) {
    kv_status s = KV_OK;
    for (int c0 = 0; c0 < n_rows && s == KV_OK; c0 += recent) {
        for (int t = 0; t < recent; t++) memcpy(tmp + (size_t)t * (size_t)hd, x + (size_t)(c0 + t) * ld, (size_t)hd * sizeof(float));
        if ((s = kv_squat_encode_ref(codes, sc, zr, enc, uq, (size_t)recent, tmp)) == KV_OK)
            s = kv_uniform_decode_ref(xh + (size_t)c0 * (size_t)hd, uq, (size_t)recent, (size_t)hd, codes, sc, zr);
    }
    return s;
}

size_t kv_fit_sq_err_len(const kv_fit_sq *e) { return (size_t)e->n_cand * (size_t)e->n_kv_heads * 4; }

/* Scratch of one (sequence, head, candidate) evaluation. */
typedef struct sq_scratch {
    float *xh, *err, *D, *tmp, *ph;
    double *acc;
    uint32_t *codes;
    void *sc, *zr;
} sq_scratch;

static void scratch_free(sq_scratch *w) {
    free(w->xh), free(w->err), free(w->D), free(w->tmp), free(w->ph), free(w->acc), free(w->codes), free(w->sc), free(w->zr);
}

static int scratch_alloc(sq_scratch *w, const kv_fit_sq *e, int nqp) {
    const size_t hd = (size_t)e->head_dim, nc = (size_t)e->n_comp, rc = (size_t)e->recent;
    memset(w, 0, sizeof *w);
    w->xh = malloc(nc * hd * sizeof(float));
    w->err = malloc(nc * hd * sizeof(float));
    w->D = malloc((size_t)nqp * (nc ? nc : 1) * sizeof(float));
    w->tmp = malloc(rc * hd * sizeof(float));
    w->ph = malloc((size_t)e->seq_len * sizeof(float));
    w->acc = malloc(hd * sizeof(double));
    w->codes = malloc((rc * hd + 32) * sizeof(uint32_t));
    w->sc = malloc(rc * hd * sizeof(float));
    w->zr = malloc(rc * hd * sizeof(float));
    return w->xh && w->err && w->D && w->tmp && w->ph && w->acc && w->codes && w->sc && w->zr;
}

kv_status kv_fit_sq_err_seq(const kv_fit_sq *e, double *out, int64_t j, int64_t b, const float *X,
                            const kv_uniform *uq) {
    const int G = e->n_kv_heads, hd = e->head_dim, per = e->n_heads / G, T = e->seq_len, nc = e->n_comp;
    const int nq = e->n_q, nqp = nq * per;
    const size_t kvd = (size_t)G * (size_t)hd, qd = (size_t)e->n_heads * (size_t)hd, hh = (size_t)hd * (size_t)hd;
    const float *h = e->ho[j] + (size_t)(b - e->shard_ncal[j]) * ho_floats(e);
    const float *hk = h + (size_t)nq * qd, *hv = hk + (size_t)T * kvd;
    const double scale = 1.0 / sqrt((double)hd);
    kv_uniform uh = *uq;
    uh.axis = KV_AXIS_TOKENS;
    float *Q = malloc((size_t)nqp * (size_t)hd * sizeof(float)), *K = malloc((size_t)T * (size_t)hd * sizeof(float));
    float *V = malloc((size_t)T * (size_t)hd * sizeof(float)), *S = malloc((size_t)nqp * (size_t)T * sizeof(float));
    float *P = malloc((size_t)nqp * (size_t)T * sizeof(float)), *O = malloc((size_t)nqp * (size_t)hd * sizeof(float));
    float *xg = malloc((size_t)nc * (size_t)hd * sizeof(float));
    double *val = malloc((size_t)hd * sizeof(double)), *vec = malloc(hh * sizeof(double));
    kv_status s = Q && K && V && S && P && O && xg && val && vec ? KV_OK : KV_ERR(KV_ENOMEM, "out of memory");
    for (int g = 0; g < G && s == KV_OK; g++) {
        for (int i = 0; i < nq; i++)
            for (int p = 0; p < per; p++)
                memcpy(Q + ((size_t)i * (size_t)per + (size_t)p) * (size_t)hd, h + (size_t)i * qd + (size_t)(g * per + p) * (size_t)hd,
                       (size_t)hd * sizeof(float));
        for (int t = 0; t < T; t++) {
            memcpy(K + (size_t)t * (size_t)hd, hk + (size_t)t * kvd + (size_t)g * (size_t)hd, (size_t)hd * sizeof(float));
            memcpy(V + (size_t)t * (size_t)hd, hv + (size_t)t * kvd + (size_t)g * (size_t)hd, (size_t)hd * sizeof(float));
        }
        for (int t = 0; t < nc; t++)
            memcpy(xg + (size_t)t * (size_t)hd, X + (size_t)t * kvd + (size_t)g * (size_t)hd, (size_t)hd * sizeof(float));
        /* exact scores, attention weights (causal) and outputs */
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, nqp, T, hd, 1.0f, Q, hd, K, hd, 0.0f, S, T);
        for (int row = 0; row < nqp; row++) {
            const int t = q_pos(e, row / per);
            const float *sr = S + (size_t)row * (size_t)T;
            float *pr = P + (size_t)row * (size_t)T;
            double mx = -INFINITY, sum = 0;
            for (int k = 0; k <= t; k++) mx = sr[k] * scale > mx ? sr[k] * scale : mx;
            for (int k = 0; k <= t; k++) sum += (pr[k] = (float)exp(sr[k] * scale - mx));
            for (int k = 0; k < T; k++) pr[k] = k <= t ? (float)(pr[k] / sum) : 0.0f;
        }
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, nqp, hd, T, 1.0f, P, T, V, hd, 0.0f, O, hd);
        if (e->prompt) /* this sequence's own subspace, as the runtime computes it at prefill */
            s = eig_desc(val, vec, e->gram[j] + ((size_t)b * (size_t)G + (size_t)g) * hh, hd);
        if (s != KV_OK) break;
        kv_status bad = KV_OK;
#pragma omp parallel
        {
            sq_scratch w;
            const int ok = scratch_alloc(&w, e, nqp);
            float *qh = malloc(hh * sizeof(float));
#pragma omp for schedule(dynamic, 1)
            for (int c = 0; c < e->n_cand; c++) {
                if (!ok || !qh) {
#pragma omp critical
                    bad = KV_ENOMEM;
                    continue;
                }
                kv_squat *own = NULL;
                const kv_squat *enc = e->prompt ? NULL : e->cand_enc[(size_t)c * (size_t)G + (size_t)g];
                kv_status cs = KV_OK;
                if (e->prompt) {
                    basis_rows(qh, val, vec, hd, e->cand_r[c]);
                    cs = kv_squat_create(&own, qh, e->cand_r[c], hd, e->cand_lambda[c], e->g);
                    enc = own;
                }
                if (cs == KV_OK)
                    cs = head_roundtrip(w.xh, enc, &uh, nc, e->recent, hd, xg, (size_t)hd, w.tmp, w.codes, w.sc, w.zr);
                kv_squat_free(own);
                if (cs != KV_OK) {
#pragma omp critical
                    bad = cs;
                    continue;
                }
                for (size_t i = 0; i < (size_t)nc * (size_t)hd; i++) w.err[i] = w.xh[i] - xg[i];
                if (nc > 0)
                    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, nqp, nc, hd, 1.0f, Q, hd, w.err, hd, 0.0f, w.D, nc);
                double sn = 0, sd = 0, on = 0, od = 0;
                for (int row = 0; row < nqp; row++) {
                    const int t = q_pos(e, row / per);
                    const float *sr = S + (size_t)row * (size_t)T, *dr = w.D + (size_t)row * (size_t)nc;
                    const float *pr = P + (size_t)row * (size_t)T, *orow = O + (size_t)row * (size_t)hd;
                    double mx = -INFINITY, sum = 0;
                    for (int k = 0; k <= t; k++) {
                        const int ck = k - e->sinks;
                        double z = sr[k];
                        if (ck >= 0 && ck < nc) {
                            z += dr[ck];
                            sn += (double)dr[ck] * dr[ck];
                            sd += (double)sr[k] * sr[k];
                        }
                        z *= scale;
                        w.ph[k] = (float)z;
                        mx = z > mx ? z : mx;
                    }
                    for (int k = 0; k <= t; k++) sum += (w.ph[k] = (float)exp(w.ph[k] - mx));
                    /* o_hat - o = sum_k (p_hat_k - p_k) v_k */
                    for (int x = 0; x < hd; x++) w.acc[x] = 0.0;
                    for (int k = 0; k <= t; k++) {
                        const double dp = w.ph[k] / sum - pr[k];
                        const float *vk = V + (size_t)k * (size_t)hd;
                        for (int x = 0; x < hd; x++) w.acc[x] += dp * vk[x];
                    }
                    double o2 = 0, d2 = 0;
                    for (int x = 0; x < hd; x++) d2 += w.acc[x] * w.acc[x], o2 += (double)orow[x] * orow[x];
                    on += d2, od += o2;
                }
                double *o = out + ((size_t)c * (size_t)G + (size_t)g) * 4;
                o[0] += sn, o[1] += sd, o[2] += on, o[3] += od;
            }
            scratch_free(&w);
            free(qh);
        }
        if (bad != KV_OK) s = bad == KV_ENOMEM ? KV_ERR(KV_ENOMEM, "out of memory") : bad;
    }
    free(Q), free(K), free(V), free(S), free(P), free(O), free(xg), free(val), free(vec);
    return s;
}

void kv_fit_sq_choose(kv_fit_sq *e, const double *err, const kv_fit_config *cfg, double *metrics) {
    const int G = e->n_kv_heads, hd = e->head_dim;
    double score[KV_FIT_SQ_MAX_CANDS], outv[KV_FIT_SQ_MAX_CANDS];
    int best = 0, paper = -1, kivi = -1, cfgc = -1;
    const int r_cfg = cfg->squat.r < hd ? cfg->squat.r : hd, r_paper = SQ_PAPER_R < hd ? SQ_PAPER_R : hd;
    for (int c = 0; c < e->n_cand; c++) {
        double a[4] = {0, 0, 0, 0};
        for (int g = 0; g < G; g++)
            for (int k = 0; k < 4; k++) a[k] += err[((size_t)c * (size_t)G + (size_t)g) * 4 + (size_t)k];
        score[c] = a[1] > 0 ? a[0] / a[1] : NAN;
        outv[c] = a[3] > 0 ? a[2] / a[3] : NAN;
        if (e->cand_lambda[c] == 0.0f) kivi = c;
        if (e->cand_r[c] == r_paper && e->cand_lambda[c] == SQ_PAPER_LAMBDA) paper = c;
        if (e->cand_r[c] == r_cfg && e->cand_lambda[c] == (float)cfg->squat.lambda) cfgc = c;
        if (c > 0 && outv[c] < outv[best]) best = c; /* strict: the first (smaller r) of equal errors */
    }
    if (e->fixed && cfgc >= 0) best = cfgc;
    e->r = e->cand_r[best];
    e->lambda = e->cand_lambda[best];
    double ph_num = 0, ph_den = 0;
    for (int g = 0; g < G; g++) {
        double mn = INFINITY;
        for (int c = 0; c < e->n_cand; c++) {
            const double v = err[((size_t)c * (size_t)G + (size_t)g) * 4 + 2];
            mn = v < mn ? v : mn;
        }
        ph_num += mn;
        ph_den += err[(size_t)g * 4 + 3];
    }
    double top = 0, all = 0;
    for (int g = 0; g < G; g++)
        for (int i = 0; i < hd; i++) {
            const double v = e->eigval[(size_t)g * (size_t)hd + (size_t)i];
            all += v, top += i < e->r ? v : 0.0;
        }
    metrics[0] = e->r;
    metrics[1] = e->lambda;
    metrics[2] = score[best];
    metrics[3] = outv[best];
    metrics[4] = paper >= 0 ? score[paper] : NAN;
    metrics[5] = paper >= 0 ? outv[paper] : NAN;
    metrics[6] = kivi >= 0 ? score[kivi] : NAN;
    metrics[7] = kivi >= 0 ? outv[kivi] : NAN;
    metrics[8] = ph_den > 0 ? ph_num / ph_den : NAN;
    metrics[9] = all > 0 ? top / all : NAN;
}

kv_status kv_fit_sq_static_basis(const kv_fit_sq *e, float *basis) {
    const int hd = e->head_dim;
    for (int g = 0; g < e->n_kv_heads; g++)
        basis_rows(basis + (size_t)g * (size_t)e->r * (size_t)hd, e->eigval + (size_t)g * (size_t)hd,
                   e->eigvec + (size_t)g * (size_t)hd * (size_t)hd, hd, e->r);
    return KV_OK;
}

kv_status kv_fit_sq_encoders(kv_fit_sq *e) {
    const int G = e->n_kv_heads, hd = e->head_dim;
    const size_t hh = (size_t)hd * (size_t)hd;
    for (int64_t i = 0; e->enc && i < e->n_enc; i++) kv_squat_free(e->enc[i]);
    free(e->enc);
    int64_t n_seq = 0;
    for (int64_t j = 0; j < e->n_local; j++) n_seq += e->shard_nseq[j];
    e->n_enc = e->prompt ? n_seq * G : G;
    e->enc = calloc((size_t)(e->n_enc > 0 ? e->n_enc : 1), sizeof *e->enc);
    float *qhat = malloc(hh * sizeof(float));
    double *val = malloc((size_t)hd * sizeof(double)), *vec = malloc(hh * sizeof(double));
    kv_status s = e->enc && qhat && val && vec ? KV_OK : KV_ERR(KV_ENOMEM, "out of memory for SQuat encoders");
    if (!e->prompt) {
        for (int g = 0; g < G && s == KV_OK; g++) {
            basis_rows(qhat, e->eigval + (size_t)g * (size_t)hd, e->eigvec + (size_t)g * hh, hd, e->r);
            s = kv_squat_create(&e->enc[g], qhat, e->r, hd, e->lambda, e->g);
        }
    } else {
        int64_t i = 0;
        for (int64_t j = 0; j < e->n_local && s == KV_OK; j++)
            for (int64_t b = 0; b < e->shard_nseq[j] && s == KV_OK; b++)
                for (int g = 0; g < G && s == KV_OK; g++, i++) {
                    if ((s = eig_desc(val, vec, e->gram[j] + ((size_t)b * (size_t)G + (size_t)g) * hh, hd)) != KV_OK) break;
                    basis_rows(qhat, val, vec, hd, e->r);
                    s = kv_squat_create(&e->enc[i], qhat, e->r, hd, e->lambda, e->g);
                }
    }
    free(qhat);
    free(val);
    free(vec);
    return s;
}

kv_status kv_fit_sq_roundtrip(float *x_hat, const kv_fit_sq *e, int64_t lseq, const kv_uniform *uq, int recent, int kvd,
                              const float *x) {
    const int G = e->n_kv_heads, hd = e->head_dim;
    if (kvd != G * hd) return KV_ERR(KV_EINVAL, "SQuat: %d channels are not %d heads of %d", kvd, G, hd);
    const size_t rc = (size_t)recent, h = (size_t)hd;
    float *xh = malloc(2 * rc * h * sizeof(float));
    uint32_t *codes = malloc((rc * h + 32) * sizeof(uint32_t));
    float *sc = malloc(2 * rc * h * sizeof(float));
    kv_status s = xh && codes && sc ? KV_OK : KV_ERR(KV_ENOMEM, "out of memory");
    kv_uniform uh = *uq;
    for (int g = 0; g < G && s == KV_OK; g++) {
        const kv_squat *enc = e->enc[e->prompt ? (size_t)lseq * (size_t)G + (size_t)g : (size_t)g];
        s = head_roundtrip(xh, enc, &uh, recent, recent, hd, x + (size_t)g * h, (size_t)kvd, xh + rc * h, codes, sc,
                           sc + rc * h);
        for (int t = 0; t < recent && s == KV_OK; t++)
            memcpy(x_hat + (size_t)t * (size_t)kvd + (size_t)g * h, xh + (size_t)t * h, h * sizeof(float));
    }
    free(xh);
    free(codes);
    free(sc);
    return s;
}

/* ---- r and lambda of layer l's keys, before their quantization pass (fit.c's loop) -------------------
 * The calibration sequences' query Grams summed in shard order (kv_dist_fold) and sent to every rank;
 * each rank derives the same candidates; the held-out errors per candidate summed in shard order and
 * sent to every rank, which all make the same choice. */
typedef struct sq_job {
    kv_fit_state *r;
    const kv_plan_predictor *pred;
    kv_uniform uq;
} sq_job;

static kv_status sq_gram_part(void *user, int64_t k, double *out) {
    sq_job *job = user;
    kv_fit_sq_gram_part(&job->r->sq, k / job->r->size, out); /* k = rank + j * size */
    return KV_OK;
}

/* The held-out sequences of shard k: their quantizer input (K, or K minus the AQUA prediction). */
static kv_status sq_err_part(void *user, int64_t k, double *out) {
    sq_job *job = user;
    kv_fit_state *r = job->r;
    const int64_t j = k / r->size, ncal = kv_fit_shard_ncal(r, k), nseq = kv_fit_shard_nseq(r, k);
    if (ncal >= nseq) return KV_OK;
    const size_t kvd = (size_t)r->kv_dim, per_seq = (size_t)r->n_comp * kvd, cv = (size_t)r->recent * kvd;
    float *Y = NULL, *in = NULL;
    kv_status s = kv_fit_store_get(&r->st, KV_FIT_K, j, 1, &Y);
    if (s == KV_OK && job->pred) s = kv_fit_store_get(&r->st, KV_FIT_KP, j, 1, &in);
    float *X = s == KV_OK ? malloc((per_seq ? per_seq : 1) * sizeof(float)) : NULL;
    if (s == KV_OK && !X) s = KV_ERR(KV_ENOMEM, "out of memory");
    for (int64_t b = ncal; b < nseq && s == KV_OK; b++) {
        const float *y = Y + (size_t)b * per_seq;
        if (job->pred) {
            for (int c = 0; c < r->n_chunks && s == KV_OK; c++) {
                const float *ins[KV_PLAN_MAX_PRED_INPUTS] = {in + (size_t)b * per_seq + (size_t)c * cv};
                s = kv_predictor_apply(X + (size_t)c * cv, job->pred, ins, (size_t)r->recent, r->kv_dim);
            }
            for (size_t i = 0; i < per_seq; i++) X[i] = y[i] - X[i];
        } else {
            memcpy(X, y, per_seq * sizeof(float));
        }
        if (s == KV_OK) s = kv_fit_sq_err_seq(&r->sq, out, j, b, X, &job->uq);
    }
    free(X);
    return s;
}

kv_status kv_fit_sq_choose_layer(kv_fit_state *r, int l, const kv_plan_predictor *pk, kv_fit_layer_report *lr) {
    r->sq_layer = 0;
    const kv_plan_squat *ps = r->plan->layers[l].stream[KV_PLAN_K].squat;
    if (!r->sq.on || !ps) return KV_OK;
    const int g = ps->g, G = r->sq.n_kv_heads, hd = r->sq.head_dim;
    sq_job job;
    memset(&job, 0, sizeof job);
    job.r = r;
    job.pred = pk;
    kv_quant q;
    kv_status s = kv_quant_from_plan(&q, r->plan, l, KV_PLAN_K);
    if (s != KV_OK) return s;
    job.uq = q.uniform;
    const size_t gl = kv_fit_sq_gram_len(&r->sq);
    double *gram = calloc(gl, sizeof(double)), *err = NULL;
    float *basis = NULL;
    if ((s = kv_dist_agree(r->dist, gram ? KV_OK : KV_ERR(KV_ENOMEM, "out of memory"))) != KV_OK) goto done;
    if ((s = kv_dist_fold(r->dist, gram, gl, r->n_shards, sq_gram_part, &job)) != KV_OK ||
        (s = kv_dist_bcast(r->dist, gram, gl * sizeof(double), 0)) != KV_OK)
        goto done;
    if ((s = kv_dist_agree(r->dist, kv_fit_sq_candidates(&r->sq, gram, r->cfg))) != KV_OK) goto done;
    const size_t el = kv_fit_sq_err_len(&r->sq);
    err = calloc(el, sizeof(double));
    if ((s = kv_dist_agree(r->dist, err ? KV_OK : KV_ERR(KV_ENOMEM, "out of memory"))) != KV_OK) goto done;
    if ((s = kv_dist_fold(r->dist, err, el, r->n_shards, sq_err_part, &job)) != KV_OK ||
        (s = kv_dist_bcast(r->dist, err, el * sizeof(double), 0)) != KV_OK)
        goto done;
    kv_fit_sq_choose(&r->sq, err, r->cfg, lr->squat);
    if (r->cfg->squat.static_basis) {
        if (!(basis = malloc((size_t)G * (size_t)r->sq.r * (size_t)hd * sizeof(float)))) {
            s = KV_ERR(KV_ENOMEM, "out of memory");
            goto done;
        }
        kv_fit_sq_static_basis(&r->sq, basis);
    }
    if ((s = kv_plan_set_squat(r->plan, l, r->sq.r, r->sq.lambda, g, basis)) != KV_OK) goto done;
    r->plan->layers[l].stream[KV_PLAN_K].squat->static_subspace = r->cfg->squat.subspace == KV_FIT_SQ_STATIC;
    if ((s = kv_fit_sq_encoders(&r->sq)) != KV_OK) goto done;
    r->sq_layer = 1;
    kv_log(KV_LOG_INFO, "fit: layer %d K: SQuat r %d lambda %g of %d candidates (90/95/99%% energy at r %d/%d/%d): "
           "held-out softmax-output error %.4g (paper r=5 lambda=1e-3: %.4g, uniform: %.4g), score error %.4g",
           l, r->sq.r, (double)r->sq.lambda, r->sq.n_cand, r->sq.r_energy[0], r->sq.r_energy[1], r->sq.r_energy[2],
           lr->squat[3], lr->squat[5], lr->squat[7], lr->squat[2]);
done:
    free(gram);
    free(err);
    free(basis);
    return s;
}
