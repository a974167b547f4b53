/* rt_squat.c — SQuat keys in the runtime (RUNTIME.md §9; squat.txt §3.3, Algorithm 1).
 *
 * A SQuat key stream is stored exactly as a uniform tokens-axis stream (KIVI keys), so attention reads
 * it with the uniform kernels; only the encode differs: per KV head, the head's columns of a chunk are
 * SQuat-encoded (kv_squat_encode_cols) with an encoder built from a query subspace of that head:
 *   - static (kv_plan_squat.static_subspace = 1): the plan's basis, one encoder per (layer, KV head)
 *     made at kv_rt_open and shared by every sequence;
 *   - prompt subspace (0, the paper's default): per sequence, layer and KV head, the Gram matrix
 *     Q^T Q (double) of the queries of the head's GQA group that kv_rt_attend receives before the
 *     layer's first compression; at that compression its top-r eigenvectors scaled by sqrt(eigenvalue)
 *     (= the top-r right singular vectors of the stacked queries scaled by their singular values,
 *     kv_squat_subspace_ref's basis up to signs, which P does not see) make the sequence's encoders.
 *     With fewer than r query vectors seen and a stored basis, the basis encoders are used instead;
 *     without a basis the Gram's top r are taken as they are (eigenvalues 0 contribute nothing: no
 *     queries at all give P = I, plain uniform keys). */
#include "kvrt.h"
#include "rt_internal.h"

#include <cblas.h>
#include <lapacke.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static int squat_prompt(const rt_codec *c) { return c->squat && !c->squat->static_subspace; }

kv_status kv_rti_squat_codec_init(rt_codec *c, const kv_plan *p, int layer) {
    const kv_plan_stream *ps = &p->layers[layer].stream[KV_PLAN_K];
    const kv_plan_squat *sq = ps->squat;
    const int hd = c->head_dim, H = c->n_kv_heads;
    if (c->q.uniform.axis != KV_AXIS_TOKENS)
        return KV_ERR(KV_EUNSUPPORTED, "plan layer %d K: SQuat keys need groups along tokens (the stream groups along "
                      "channels)", layer);
    if (ps->pre_rope)
        return KV_ERR(KV_EUNSUPPORTED, "plan layer %d K: SQuat keys are quantized after RoPE (the query subspace is "
                      "after RoPE); keys stored before RoPE are refused", layer);
    if (ps->predictor || ps->share_codes_with_layer >= 0)
        return KV_ERR(KV_EUNSUPPORTED, "plan layer %d K: SQuat keys together with %s are not supported", layer,
                      ps->predictor ? "an AQUA-KV predictor (SQuat quantizes the keys, not a residual)"
                                    : "shared codes (XQuant: the codes are another layer's)");
    if (p->global.prune_method != KV_PLAN_PRUNE_NONE)
        return KV_ERR(KV_EUNSUPPORTED, "plan layer %d K: SQuat keys together with token pruning are not supported (kept "
                      "tokens are coded per head outside the chunk layout)", layer);
    if (sq->r < 1 || sq->r > hd || !(sq->lambda >= 0.0f) || !isfinite(sq->lambda) || sq->g < 1 || hd % sq->g)
        return KV_ERR(KV_EFORMAT, "plan layer %d K: SQuat r %d (1..%d), lambda %g (>= 0), g %d (dividing %d)", layer,
                      sq->r, hd, (double)sq->lambda, sq->g, hd);
    if (sq->static_subspace && !sq->basis)
        return KV_ERR(KV_EFORMAT, "plan layer %d K: SQuat static subspace without a basis", layer);
    c->squat = sq;
    if (!sq->basis) return KV_OK;
    c->sq_basis = calloc((size_t)H, sizeof *c->sq_basis);
    if (!c->sq_basis) return KV_ERR(KV_ENOMEM, "out of memory");
    for (int h = 0; h < H; h++) {
        kv_status s = kv_squat_create(&c->sq_basis[h], sq->basis + (size_t)h * (size_t)sq->r * (size_t)hd, sq->r, hd,
                                      sq->lambda, sq->g);
        if (s != KV_OK) return kv_error_wrap(s, "plan layer %d K, KV head %d, SQuat basis: ", layer, h);
    }
    return KV_OK;
}

/* ---- per-sequence state --------------------------------------------------------------------------- */
kv_status kv_rti_squat_seq_init(kv_rt *rt, rt_seq *sq) {
    if (!rt->squat_prompt) return KV_OK;
    sq->sq = calloc((size_t)rt->n_layers, sizeof *sq->sq);
    return sq->sq ? KV_OK : KV_ERR(KV_ENOMEM, "out of memory for SQuat state");
}

static void state_clear(const kv_rt *rt, rt_sqstate *s) {
    free(s->gram);
    for (int h = 0; s->enc && h < rt->n_kv_heads; h++) kv_squat_free(s->enc[h]);
    free(s->enc);
    memset(s, 0, sizeof *s);
}

void kv_rti_squat_seq_clear(kv_rt *rt, rt_seq *sq) {
    for (int l = 0; sq->sq && l < rt->n_layers; l++) state_clear(rt, &sq->sq[l]);
}

void kv_rti_squat_seq_free(kv_rt *rt, rt_seq *sq) {
    kv_rti_squat_seq_clear(rt, sq);
    free(sq->sq);
    sq->sq = NULL;
}

uint64_t kv_rti_squat_working_bytes(const kv_rt *rt, int seq) {
    const rt_seq *sq = &rt->seqs[seq];
    uint64_t b = 0;
    const uint64_t hd = (uint64_t)rt->head_dim;
    for (int l = 0; sq->sq && l < rt->n_layers; l++) {
        const rt_sqstate *s = &sq->sq[l];
        if (s->gram) b += (uint64_t)rt->n_kv_heads * hd * hd * sizeof(double);
        for (int h = 0; s->enc && h < rt->n_kv_heads; h++) b += kv_squat_bytes(s->enc[h]);
    }
    return b;
}

/* ---- the prompt subspace ---------------------------------------------------------------------------- */
kv_status kv_rti_squat_saw_queries(kv_rt *rt, int seq, int layer, int n_q, const float *q, size_t ldq) {
    const rt_codec *c = rt_codec_of(rt, layer, KV_PLAN_K);
    if (!squat_prompt(c)) return KV_OK;
    rt_sqstate *s = &rt->seqs[seq].sq[layer];
    if (s->frozen) return KV_OK;
    const int H = rt->n_kv_heads, hd = rt->head_dim, grp = rt->group;
    const size_t hd2 = (size_t)hd * (size_t)hd, rows = (size_t)n_q * (size_t)grp;
    if (!s->gram && !(s->gram = calloc((size_t)H * hd2, sizeof *s->gram)))
        return KV_ERR(KV_ENOMEM, "runtime: out of memory for SQuat query statistics");
    double *a = malloc(rows * (size_t)hd * sizeof *a);
    if (!a) return KV_ERR(KV_ENOMEM, "runtime: out of memory for SQuat query statistics");
    for (int h = 0; h < H; h++) {
        /* the group's query vectors stacked: row (t, j) = query head h * grp + j of row t */
        for (int t = 0; t < n_q; t++)
            for (int j = 0; j < grp; j++) {
                const float *src = q + (size_t)t * ldq + (size_t)(h * grp + j) * (size_t)hd;
                double *dst = a + ((size_t)t * (size_t)grp + (size_t)j) * (size_t)hd;
                for (int k = 0; k < hd; k++) dst[k] = (double)src[k];
            }
        cblas_dsyrk(CblasRowMajor, CblasUpper, CblasTrans, hd, (int)rows, 1.0, a, hd, 1.0, s->gram + (size_t)h * hd2, hd);
    }
    free(a);
    s->rows += (int64_t)rows;
    return KV_OK;
}

/* Choose the sequence's encoders of (layer) at its first compression. */
static kv_status freeze(kv_rt *rt, int seq, int layer) {
    const rt_codec *c = rt_codec_of(rt, layer, KV_PLAN_K);
    rt_sqstate *s = &rt->seqs[seq].sq[layer];
    const kv_plan_squat *sq = c->squat;
    const int H = rt->n_kv_heads, hd = rt->head_dim, r = sq->r;
    const size_t hd2 = (size_t)hd * (size_t)hd;
    const int use_basis = s->rows < r && c->sq_basis;
    kv_status st = KV_OK;
    double *w = NULL, *z = NULL;
    lapack_int *sup = NULL;
    float *qh = NULL;
    if (use_basis) goto done;
    w = malloc((size_t)hd * sizeof *w);
    z = malloc((size_t)hd * (size_t)r * sizeof *z);
    sup = malloc(2 * (size_t)hd * sizeof *sup);
    qh = calloc((size_t)r * (size_t)hd, sizeof *qh);
    s->enc = calloc((size_t)H, sizeof *s->enc);
    if (!w || !z || !sup || !qh || !s->enc) {
        st = KV_ERR(KV_ENOMEM, "runtime: out of memory for the SQuat subspace");
        goto done;
    }
    for (int h = 0; h < H; h++) {
        if (s->gram) {
            double *g = s->gram + (size_t)h * hd2; /* overwritten by dsyevr: not needed afterwards */
            lapack_int found = 0;
            const lapack_int info = LAPACKE_dsyevr(LAPACK_ROW_MAJOR, 'V', 'I', 'U', hd, g, hd, 0.0, 0.0, hd - r + 1, hd,
                                                   0.0, &found, w, z, r, sup);
            if (info != 0 || found != r) {
                st = KV_ERR(KV_ENUMERIC, "runtime: layer %d K, KV head %d: SQuat subspace (dsyevr info %d, %d of %d "
                            "eigenvectors)", layer, h, (int)info, (int)found, r);
                goto done;
            }
            /* eigenvalues ascending: row i of the basis = the (i+1)-th largest, scaled by sqrt(eigenvalue) */
            for (int i = 0; i < r; i++) {
                const int k = r - 1 - i;
                const double sc = w[k] > 0.0 ? sqrt(w[k]) : 0.0;
                for (int j = 0; j < hd; j++)
                    qh[(size_t)i * (size_t)hd + (size_t)j] = (float)(sc * z[(size_t)j * (size_t)r + (size_t)k]);
            }
        } /* else no query was seen: qh stays 0 (P = I) */
        if ((st = kv_squat_create(&s->enc[h], qh, r, hd, sq->lambda, sq->g)) != KV_OK) {
            st = kv_error_wrap(st, "runtime: layer %d K, KV head %d, SQuat prompt subspace: ", layer, h);
            goto done;
        }
    }
done:
    free(w);
    free(z);
    free(sup);
    free(qh);
    if (st != KV_OK) {
        for (int h = 0; s->enc && h < H; h++) kv_squat_free(s->enc[h]);
        free(s->enc);
        s->enc = NULL;
        return st;
    }
    free(s->gram); /* the statistics are spent: the subspace is the sequence's from now on */
    s->gram = NULL;
    s->use_basis = use_basis;
    s->frozen = 1;
    return KV_OK;
}

kv_status kv_rti_squat_encode(kv_rt *rt, int seq, int layer, uint8_t *blk, int m, const float *x) {
    const rt_codec *c = rt_codec_of(rt, layer, KV_PLAN_K);
    if (!squat_prompt(c)) return kv_rti_codec_encode_squat(c, blk, m, x, c->sq_basis);
    rt_sqstate *s = &rt->seqs[seq].sq[layer];
    kv_status st;
    if (!s->frozen && (st = freeze(rt, seq, layer)) != KV_OK) return st;
    return kv_rti_codec_encode_squat(c, blk, m, x, s->use_basis ? c->sq_basis : s->enc);
}

kv_status kv_rti_squat_prompt_copy(kv_rt *dst, int dst_seq, const kv_rt *src, int src_seq) {
    const size_t hd2 = (size_t)dst->head_dim * (size_t)dst->head_dim, H = (size_t)dst->n_kv_heads;
    for (int l = 0; l < dst->n_layers; l++) {
        if (!squat_prompt(rt_codec_of(dst, l, KV_PLAN_K))) continue;
        const int accumulated = squat_prompt(rt_codec_of(src, l, KV_PLAN_K)) && src->seqs[src_seq].sq;
        const rt_sqstate *a = accumulated ? &src->seqs[src_seq].sq[l] : NULL;
        if (!a || (a->rows > 0 && !a->gram))
            return KV_ERR(KV_EINVAL, "kv_rt_prompt_copy: layer %d of the destination takes SQuat's subspace from the "
                          "prompt's queries, which the source did not accumulate (its plan has no SQuat prompt subspace "
                          "there)", l);
        rt_sqstate *b = &dst->seqs[dst_seq].sq[l];
        b->rows = a->rows;
        if (a->gram) {
            if (!(b->gram = malloc(H * hd2 * sizeof *b->gram))) return KV_ERR(KV_ENOMEM, "out of memory");
            memcpy(b->gram, a->gram, H * hd2 * sizeof *b->gram);
        }
    }
    return KV_OK;
}
