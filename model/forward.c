/* forward.c — the reference forward pass: embedding, decoder layers (RMSNorm, Q/K/V projections,
 * RoPE, grouped-query causal attention through the KV-cache interface, SwiGLU), output logits.
 * Matrix products: forward_matmul.c.
 *
 * Threading: GEMMs through CBLAS (the BLAS threads them); row-wise work (norms, RoPE, softmax,
 * SwiGLU) in OpenMP loops where every row is computed by one thread, so no result depends on how
 * rows are split between threads. Attention runs (head, query block) tasks in parallel, each with a
 * single-threaded BLAS call. */
#include "forward_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <cblas.h>
#include <omp.h>

#define KV_ALIGN 64
#define ATT_QBLOCK 128 /* query rows per attention task */

/* ---- workspace ------------------------------------------------------------------------------ */
static int grow(float **buf, size_t n) {
    kv_aligned_free(*buf);
    *buf = kv_aligned_alloc(KV_ALIGN, (n ? n : 1) * sizeof(float));
    return *buf != NULL;
}

static kv_status ws_ensure_rows(kv_model *m, size_t rows) {
    kv_workspace *w = &m->ws;
    if (rows <= w->rows) return KV_OK;
    const kv_arch *a = &m->arch;
    const size_t d = (size_t)a->d_model, qd = (size_t)a->n_heads * a->head_dim;
    const size_t kvd = (size_t)a->n_kv_heads * a->head_dim, ff = (size_t)a->d_ff, half = (size_t)a->head_dim / 2;
    size_t big;
    if (kv_size_mul(&big, rows, ff) != 0 || kv_size_mul(&big, big, sizeof(float)) != 0)
        return KV_ERR(KV_ENOMEM, "forward batch of %zu rows is too large", rows);
    int ok = grow(&w->hres, rows * d) && grow(&w->x, rows * d) && grow(&w->q, rows * qd) &&
             grow(&w->q_pre, rows * qd) && grow(&w->k, rows * kvd) && grow(&w->k_pre, rows * kvd) &&
             grow(&w->v, rows * kvd) && grow(&w->att, rows * qd) && grow(&w->proj, rows * d) &&
             grow(&w->gate, rows * ff) && grow(&w->up, rows * ff) && grow(&w->rope_cos, rows * half) &&
             grow(&w->rope_sin, rows * half);
    kv_aligned_free(w->pos);
    kv_aligned_free(w->rope_pos);
    w->pos = kv_aligned_alloc(KV_ALIGN, rows * sizeof(int32_t));
    w->rope_pos = kv_aligned_alloc(KV_ALIGN, rows * sizeof(int32_t));
    w->rope_n = 0;
    if (!ok || !w->pos || !w->rope_pos) {
        w->rows = 0;
        return KV_ERR(KV_ENOMEM, "out of memory for a forward batch of %zu rows", rows);
    }
    w->rows = rows;
    return KV_OK;
}

kv_status kv_model_ws_floats(float **buf, size_t *cap, size_t n, const char *what) {
    if (n <= *cap) return KV_OK;
    if (!grow(buf, n)) {
        *cap = 0;
        return KV_ERR(KV_ENOMEM, "out of memory for %s (%zu floats)", what, n);
    }
    *cap = n;
    return KV_OK;
}

/* ---- elementwise pieces ----------------------------------------------------------------------- */
/* y = x / sqrt(mean(x^2) + eps) * w, the mean square summed in double. */
static void rmsnorm_rows(kv_model *m, float *y, const float *x, const float *w, size_t n, int d, float eps) {
#pragma omp parallel for num_threads(kv_model_par(m, n * (size_t)d)) schedule(static)
    for (long r = 0; r < (long)n; r++) {
        const float *xr = x + (size_t)r * d;
        float *yr = y + (size_t)r * d;
        double ss = 0.0;
        for (int i = 0; i < d; i++) ss += (double)xr[i] * (double)xr[i];
        const float scale = (float)(1.0 / sqrt(ss / d + (double)eps));
        for (int i = 0; i < d; i++) yr[i] = (xr[i] * scale) * w[i];
    }
}

/* cos/sin of pos * inv_freq[i] for one position (angles in double, rounded once). */
static void rope_angles(const kv_model *m, int32_t pos, float *c, float *s) {
    const int half = m->arch.head_dim / 2;
    for (int i = 0; i < half; i++) {
        const double ang = (double)pos * m->inv_freq_d[i];
        c[i] = (float)cos(ang);
        s[i] = (float)sin(ang);
    }
}

/* Rotate the n_heads heads of one row; sign = -1 rotates back. */
static void rope_row(const kv_model *m, float *x, int n_heads, const float *c, const float *s, float sign) {
    const int hd = m->arch.head_dim, half = hd / 2;
    const int adjacent = m->arch.rope_layout == KV_ROPE_ADJACENT;
    for (int h = 0; h < n_heads; h++) {
        float *xh = x + (size_t)h * hd;
        for (int i = 0; i < half; i++) {
            const int i0 = adjacent ? 2 * i : i, i1 = adjacent ? 2 * i + 1 : i + half;
            const float sn = sign * s[i];
            const float x0 = xh[i0], x1 = xh[i1];
            xh[i0] = x0 * c[i] - x1 * sn;
            xh[i1] = x0 * sn + x1 * c[i];
        }
    }
}

void kv_model_rope(const kv_model *m, float *x, size_t n, size_t ld, int n_heads, const int32_t *pos,
                   int inverse) {
#pragma omp parallel num_threads(kv_model_par(m, n * (size_t)n_heads * m->arch.head_dim))
    {
        float cbuf[2048], sbuf[2048]; /* head_dim <= 4096 (checked at creation) */
#pragma omp for schedule(static)
        for (long r = 0; r < (long)n; r++) {
            rope_angles(m, pos[r], cbuf, sbuf);
            rope_row(m, x + (size_t)r * ld, n_heads, cbuf, sbuf, inverse ? -1.0f : 1.0f);
        }
    }
}

/* The cos/sin table of the workspace for n rows at positions pos (kept across layers). */
static void rope_table(kv_model *m, const int32_t *pos, size_t n) {
    kv_workspace *w = &m->ws;
    if (w->rope_n == n && memcmp(w->rope_pos, pos, n * sizeof(int32_t)) == 0) return;
    const int half = m->arch.head_dim / 2;
#pragma omp parallel for num_threads(kv_model_par(m, n * (size_t)half * 16)) schedule(static)
    for (long r = 0; r < (long)n; r++)
        rope_angles(m, pos[r], w->rope_cos + (size_t)r * half, w->rope_sin + (size_t)r * half);
    memcpy(w->rope_pos, pos, n * sizeof(int32_t));
    w->rope_n = n;
}

/* In place over n rows: softmax over the first nvalid(r) entries, zeros after (causal mask). */
static void softmax_row(float *s, int nvalid, int ntotal) {
    float mx = -INFINITY;
    for (int j = 0; j < nvalid; j++) mx = s[j] > mx ? s[j] : mx;
    double sum = 0.0;
    for (int j = 0; j < nvalid; j++) {
        const float e = expf(s[j] - mx);
        s[j] = e;
        sum += e;
    }
    for (int j = 0; j < nvalid; j++) s[j] = (float)((double)s[j] / sum);
    for (int j = nvalid; j < ntotal; j++) s[j] = 0.0f;
}

/* Attention of one sequence: T queries (q: T x q_dim) over S keys/values of which the last T are
 * the queries' own tokens (query t sees keys 0 .. S-T+t). out: T x q_dim. */
static kv_status attend(kv_model *m, const float *q, int T, const float *K, size_t ldk, const float *V,
                        size_t ldv, int S, float *out) {
    const kv_arch *a = &m->arch;
    const int hd = a->head_dim, nh = a->n_heads, group = a->n_heads / a->n_kv_heads;
    const int qd = nh * hd, past = S - T;
    const int qb = T < ATT_QBLOCK ? T : ATT_QBLOCK;
    const int nqb = (T + qb - 1) / qb;
    const int ntasks = nh * nqb;
    /* multiply-adds of the whole step, about: 2 * heads * rows * keys * head_dim */
    const size_t work = 2 * (size_t)nh * (size_t)T * (size_t)S * (size_t)hd;
    int nthr = kv_model_par(m, work);
    if (nthr > ntasks) nthr = ntasks;
    const float scale = (float)(1.0 / sqrt((double)hd));
    kv_status s = kv_model_ws_floats(&m->ws.scores, &m->ws.scores_cap, (size_t)nthr * qb * (size_t)S,
                                   "attention scores");
    if (s != KV_OK) return s;
    float *scores_all = m->ws.scores;
    kv_model_blas_threads(m, 1); /* each task calls the BLAS on its own */
#pragma omp parallel num_threads(nthr)
    {
        float *sc = scores_all + (size_t)omp_get_thread_num() * qb * (size_t)S;
        /* Tasks are ordered with the heaviest (last) query blocks first for balance; the result of
         * a task does not depend on the thread that runs it. */
#pragma omp for schedule(dynamic, 1)
        for (int task = 0; task < ntasks; task++) {
            const int h = task % nh, blk = nqb - 1 - task / nh;
            const int t0 = blk * qb, t1 = t0 + qb < T ? t0 + qb : T, nq = t1 - t0;
            const int nk = past + t1; /* keys visible to the block's last row */
            const float *Qh = q + (size_t)t0 * qd + (size_t)h * hd;
            const float *Kh = K + (size_t)(h / group) * hd;
            const float *Vh = V + (size_t)(h / group) * hd;
            float *Oh = out + (size_t)t0 * qd + (size_t)h * hd;
            if (nq == 1) {
                cblas_sgemv(CblasRowMajor, CblasNoTrans, nk, hd, scale, Kh, (int)ldk, Qh, 1, 0.0f, sc, 1);
            } else {
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, nq, nk, hd, scale, Qh, qd, Kh, (int)ldk,
                            0.0f, sc, nk);
            }
            for (int i = 0; i < nq; i++) softmax_row(sc + (size_t)i * nk, past + t0 + i + 1, nk);
            if (nq == 1) {
                cblas_sgemv(CblasRowMajor, CblasTrans, nk, hd, 1.0f, Vh, (int)ldv, sc, 1, 0.0f, Oh, 1);
            } else {
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, nq, hd, nk, 1.0f, sc, nk, Vh, (int)ldv,
                            0.0f, Oh, qd);
            }
        }
    }
    return KV_OK;
}

/* ---- one decoder layer ------------------------------------------------------------------------ */
static kv_status check_cache(const kv_model *m, const kv_cache *c, int n_seqs, const int *seq_ids) {
    if (!c || !c->ops) return KV_ERR(KV_EINVAL, "KV cache without operations");
    const kv_arch *a = &m->arch;
    if (c->n_layers != a->n_layers || c->n_kv_heads != a->n_kv_heads || c->head_dim != a->head_dim)
        return KV_ERR(KV_EMISMATCH,
                      "KV cache geometry (%d layers, %d kv heads, head_dim %d) does not match the model "
                      "(%d, %d, %d)",
                      c->n_layers, c->n_kv_heads, c->head_dim, a->n_layers, a->n_kv_heads, a->head_dim);
    for (int b = 0; b < n_seqs; b++) {
        const int sid = seq_ids ? seq_ids[b] : b;
        if (sid < 0 || sid >= c->n_seqs)
            return KV_ERR(KV_EINVAL, "sequence slot %d outside the cache's %d slots", sid, c->n_seqs);
    }
    return KV_OK;
}

kv_status kv_model_layer_forward(kv_model *m, int layer, float *h, int n_seqs, int n_tokens,
                                 const int32_t *pos, kv_cache *cache, const int *seq_ids,
                                 const kv_hooks *hooks) {
    if (!m || !h || !pos || layer < 0 || layer >= m->arch.n_layers || n_seqs <= 0 || n_tokens <= 0)
        return KV_ERR(KV_EINVAL, "kv_model_layer_forward: bad arguments (layer %d, %d x %d rows)", layer,
                      n_seqs, n_tokens);
    kv_status s;
    if ((s = kv_model_require(m, layer)) != KV_OK) return s;
    if (cache && (s = check_cache(m, cache, n_seqs, seq_ids)) != KV_OK) return s;
    const kv_arch *a = &m->arch;
    const size_t n = (size_t)n_seqs * (size_t)n_tokens;
    if ((s = ws_ensure_rows(m, n)) != KV_OK) return s;
    kv_workspace *w = &m->ws;
    const kv_layer_weights *lw = &m->layers[layer];
    const int d = a->d_model, hd = a->head_dim, qd = a->n_heads * hd, kvd = a->n_kv_heads * hd, ff = a->d_ff;
    const int capture = hooks && hooks->on_layer &&
                        (hooks->layer_end <= hooks->layer_begin ||
                         (layer >= hooks->layer_begin && layer < hooks->layer_end));

    /* attention block */
    rmsnorm_rows(m, w->x, h, lw->attn_norm, n, d, a->rms_eps);
    {
        const kv_matrix *mats[3] = {&lw->wq, &lw->wk, &lw->wv};
        const float *bias[3] = {lw->bq, lw->bk, lw->bv};
        float *outs[3] = {w->q, w->k, w->v};
        if ((s = kv_model_matmul_multi(m, w->x, n, mats, bias, outs, 3)) != KV_OK) return s;
    }
    if (capture) memcpy(w->q_pre, w->q, n * (size_t)qd * sizeof(float));
    if (capture || cache) memcpy(w->k_pre, w->k, n * (size_t)kvd * sizeof(float));
    rope_table(m, pos, n);
    {
        const int half = hd / 2;
#pragma omp parallel for num_threads(kv_model_par(m, n * (size_t)(qd + kvd))) schedule(static)
        for (long r = 0; r < (long)n; r++) {
            const float *c = w->rope_cos + (size_t)r * half, *sn = w->rope_sin + (size_t)r * half;
            rope_row(m, w->q + (size_t)r * qd, a->n_heads, c, sn, 1.0f);
            rope_row(m, w->k + (size_t)r * kvd, a->n_kv_heads, c, sn, 1.0f);
        }
    }
    if (capture) {
        kv_capture cap = {layer, n_seqs, n_tokens, pos, d, qd, kvd, h, w->x, w->q_pre, w->q, w->k_pre, w->k, w->v};
        if ((s = hooks->on_layer(hooks->user, &cap)) != KV_OK) return s;
    }
    for (int b = 0; b < n_seqs; b++) {
        const size_t r0 = (size_t)b * n_tokens;
        const float *K = w->k + r0 * kvd, *V = w->v + r0 * kvd;
        size_t ldk = (size_t)kvd, ldv = (size_t)kvd;
        int S = n_tokens;
        if (cache) {
            const int sid = seq_ids ? seq_ids[b] : b;
            s = cache->ops->append(cache, layer, sid, n_tokens, pos + r0, w->k_pre + r0 * kvd, K, V, (size_t)kvd);
            if (s != KV_OK) return s;
            kv_cache_view view;
            memset(&view, 0, sizeof view);
            if ((s = cache->ops->view(cache, layer, sid, &view)) != KV_OK) return s;
            if (view.n < n_tokens || !view.k || !view.v)
                return KV_ERR(KV_EINVAL, "KV cache '%s' returned %d tokens for a step of %d", cache->ops->name,
                              view.n, n_tokens);
            K = view.k;
            V = view.v;
            ldk = view.ld_k;
            ldv = view.ld_v;
            S = view.n;
        }
        if ((s = attend(m, w->q + r0 * qd, n_tokens, K, ldk, V, ldv, S, w->att + r0 * qd)) != KV_OK) return s;
    }
    if ((s = kv_model_matmul(m, w->att, n, &lw->wo, NULL, w->proj)) != KV_OK) return s;
#pragma omp parallel for num_threads(kv_model_par(m, n * (size_t)d)) schedule(static)
    for (long r = 0; r < (long)n; r++)
        for (int i = 0; i < d; i++) h[(size_t)r * d + i] += w->proj[(size_t)r * d + i];

    /* feed-forward block */
    rmsnorm_rows(m, w->x, h, lw->ffn_norm, n, d, a->rms_eps);
    {
        const kv_matrix *mats[2] = {&lw->w_gate, &lw->w_up};
        float *outs[2] = {w->gate, w->up};
        if ((s = kv_model_matmul_multi(m, w->x, n, mats, NULL, outs, 2)) != KV_OK) return s;
    }
#pragma omp parallel for num_threads(kv_model_par(m, n * (size_t)ff * 8)) schedule(static)
    for (long r = 0; r < (long)n; r++) {
        float *g = w->gate + (size_t)r * ff;
        const float *u = w->up + (size_t)r * ff;
        for (int i = 0; i < ff; i++) g[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
    }
    if ((s = kv_model_matmul(m, w->gate, n, &lw->w_down, NULL, w->proj)) != KV_OK) return s;
#pragma omp parallel for num_threads(kv_model_par(m, n * (size_t)d)) schedule(static)
    for (long r = 0; r < (long)n; r++)
        for (int i = 0; i < d; i++) h[(size_t)r * d + i] += w->proj[(size_t)r * d + i];
    kv_model_blas_threads(m, m->n_threads); /* leave the BLAS as the model's thread count says */
    return KV_OK;
}

/* ---- embedding, output, whole forward ----------------------------------------------------------- */
kv_status kv_model_embed(const kv_model *m, const int32_t *tokens, size_t n, float *h) {
    if (!m || (!tokens && n) || (!h && n)) return KV_ERR(KV_EINVAL, "kv_model_embed: NULL argument");
    if (kv_model_require(m, KV_MODEL_PART_EMBED) != KV_OK) return KV_EINVAL;
    const int d = m->arch.d_model, V = m->arch.vocab_size;
    for (size_t r = 0; r < n; r++)
        if (tokens[r] < 0 || tokens[r] >= V)
            return KV_ERR(KV_EINVAL, "token id %d at row %zu is outside the vocabulary (%d)", (int)tokens[r], r, V);
    const kv_matrix *e = &m->tok_embd.m;
    for (size_t r = 0; r < n; r++) {
        kv_status s = kv_model_matrix_row(e, tokens[r], h + r * d);
        if (s != KV_OK) return s;
    }
    return KV_OK;
}

kv_status kv_model_logits(kv_model *m, const float *h, size_t n, float *logits) {
    if (!m || (!h && n) || (!logits && n)) return KV_ERR(KV_EINVAL, "kv_model_logits: NULL argument");
    if (n == 0) return KV_OK;
    kv_status s = kv_model_require(m, KV_MODEL_PART_OUTPUT);
    if (s != KV_OK) return s;
    s = ws_ensure_rows(m, n);
    if (s != KV_OK) return s;
    rmsnorm_rows(m, m->ws.x, h, m->output_norm, n, m->arch.d_model, m->arch.rms_eps);
    s = kv_model_matmul(m, m->ws.x, n, &m->output.m, NULL, logits);
    kv_model_blas_threads(m, m->n_threads);
    return s;
}

kv_status kv_model_forward(kv_model *m, const kv_forward *f) {
    if (!m || !f || !f->tokens || f->n_seqs <= 0 || f->n_tokens <= 0)
        return KV_ERR(KV_EINVAL, "kv_model_forward: bad arguments");
    kv_status s;
    if (f->cache && (s = check_cache(m, f->cache, f->n_seqs, f->seq_ids)) != KV_OK) return s;
    const size_t rows = (size_t)f->n_seqs * (size_t)f->n_tokens;
    if ((s = ws_ensure_rows(m, rows)) != KV_OK) return s;
    kv_workspace *w = &m->ws;
    const int d = m->arch.d_model;
    for (int b = 0; b < f->n_seqs; b++) {
        int32_t past = 0;
        if (f->cache) {
            const int len = f->cache->ops->length(f->cache, f->seq_ids ? f->seq_ids[b] : b);
            if (len < 0) return KV_ERR(KV_EINVAL, "KV cache '%s' reports a negative length", f->cache->ops->name);
            past = len;
        }
        for (int t = 0; t < f->n_tokens; t++) w->pos[(size_t)b * f->n_tokens + t] = past + t;
    }
    if ((s = kv_model_embed(m, f->tokens, rows, w->hres)) != KV_OK) return s;
    for (int l = 0; l < m->arch.n_layers; l++) {
        s = kv_model_layer_forward(m, l, w->hres, f->n_seqs, f->n_tokens, w->pos, f->cache, f->seq_ids, f->hooks);
        if (s != KV_OK) return s;
    }
    if (f->hidden) memcpy(f->hidden, w->hres, rows * (size_t)d * sizeof(float));
    if (f->logits) {
        if (f->logits_last_only) {
            for (int b = 0; b < f->n_seqs; b++)
                memcpy(w->proj + (size_t)b * d, w->hres + ((size_t)b * f->n_tokens + f->n_tokens - 1) * d,
                       (size_t)d * sizeof(float));
            s = kv_model_logits(m, w->proj, (size_t)f->n_seqs, f->logits);
        } else {
            s = kv_model_logits(m, w->hres, rows, f->logits);
        }
        if (s != KV_OK) return s;
    }
    return KV_OK;
}
