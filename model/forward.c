/* forward.c — the reference forward pass: embedding, decoder layers (RMSNorm, Q/K/V projections,
 * QK-norm, RoPE, grouped-query causal attention through the KV-cache interface with sliding windows on
 * local layers, post-norms, SwiGLU or GELU-tanh gating), output logits (softcapped when the arch says).
 * Matrix products: forward_matmul.c.
 *
 * Threading: the model's thread pool (kv_model_pool) runs every parallel loop: row-wise work (norms,
 * RoPE, SwiGLU, residual adds) in ranges of rows where every row is computed by one thread, so no
 * result depends on how rows are split between threads; matrix products in forward_matmul.c. Attention runs (head, query block) tasks on the model's thread
 * pool (kv_model_pool), each with a single-threaded BLAS call; a cache with its own `attend` (the
 * compressed runtime) computes attention itself. */
#include "forward_internal.h"
#include "model_cuda.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <cblas.h>

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
             grow(&w->gate, rows * ff) && grow(&w->up, rows * ff);
    kv_aligned_free(w->pos);
    w->pos = kv_aligned_alloc(KV_ALIGN, rows * sizeof(int32_t));
    ok = ok && w->pos;
    for (int i = 0; i < 2; i++) { /* [1]: the local layers' table, only for a model with local layers */
        const size_t r = i == 0 || m->inv_freq_local_d ? rows : 1;
        ok = ok && grow(&w->rope_cos[i], r * half) && grow(&w->rope_sin[i], r * half);
        kv_aligned_free(w->rope_pos[i]);
        w->rope_pos[i] = kv_aligned_alloc(KV_ALIGN, r * sizeof(int32_t));
        w->rope_n[i] = 0;
        ok = ok && w->rope_pos[i];
    }
    if (!ok) {
        w->rows = 0;
        return KV_ERR(KV_ENOMEM, "out of memory for a forward batch of %zu rows", rows);
    }
    w->rows = rows;
    return KV_OK;
}

double kv_model_forward_bytes(const kv_model *m, double rows, double keys) {
    const kv_arch *a = &m->arch;
    const double qb = rows < ATT_QBLOCK ? rows : ATT_QBLOCK;
    const double d = a->d_model, qd = (double)a->n_heads * a->head_dim, kvd = (double)a->n_kv_heads * a->head_dim;
    const double ff = a->d_ff, half = a->head_dim / 2, tables = m->inv_freq_local_d ? 2 : 1;
    /* as ws_ensure_rows: hres, x, proj (d); q, q_pre, att (qd); k, k_pre, v (kvd); gate, up (ff); RoPE
     * tables (a second set for a model whose local layers have their own base), each with its int32
     * positions; the int32 positions */
    return rows * ((3 * d + 3 * qd + 3 * kvd + 2 * ff + 2 * tables * half) * sizeof(float) +
                   (1 + tables) * sizeof(int32_t)) +
           (double)m->n_threads * qb * keys * sizeof(float); /* a block of attention scores per thread */
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

/* ---- parallel rows -------------------------------------------------------------------------------- */
typedef struct rows_job {
    kv_rows_fn fn;
    void *ctx;
    size_t n, per;
} rows_job;

static void rows_item(void *ctx, int item, int thread) {
    const rows_job *jb = ctx;
    const size_t r0 = (size_t)item * jb->per, r1 = r0 + jb->per < jb->n ? r0 + jb->per : jb->n;
    if (r0 < r1) jb->fn(jb->ctx, r0, r1, thread);
}

void kv_model_for_rows(kv_model *m, size_t n, size_t work, kv_rows_fn fn, void *ctx) {
    if (n == 0) return;
    const int nt = kv_model_par(m, work);
    if (nt <= 1 || n == 1) {
        fn(ctx, 0, n, 0);
        return;
    }
    /* a few ranges per thread: a thread that starts late (a busy core) takes fewer */
    size_t items = (size_t)nt * 4 < n ? (size_t)nt * 4 : n;
    rows_job jb = {fn, ctx, n, (n + items - 1) / items};
    items = (n + jb.per - 1) / jb.per;
    kv_pool_run(kv_model_pool(m), (int)items, rows_item, &jb);
}

/* ---- elementwise pieces ----------------------------------------------------------------------- */
/* y = x / sqrt(mean(x^2) + eps) * w, the mean square summed in double. */
typedef struct rmsnorm_job {
    float *y;
    const float *x, *w;
    int d;
    float eps;
} rmsnorm_job;

static void rmsnorm_range(void *ctx, size_t r0, size_t r1, int thread) {
    (void)thread;
    const rmsnorm_job *jb = ctx;
    const int d = jb->d;
    for (size_t r = r0; r < r1; r++) {
        const float *xr = jb->x + r * d;
        float *yr = jb->y + r * d;
        double ss = 0.0;
        for (int i = 0; i < d; i++) ss += (double)xr[i] * (double)xr[i];
        const float scale = (float)(1.0 / sqrt(ss / d + (double)jb->eps));
        for (int i = 0; i < d; i++) yr[i] = (xr[i] * scale) * jb->w[i];
    }
}

static void rmsnorm_rows(kv_model *m, float *y, const float *x, const float *w, size_t n, int d, float eps) {
    rmsnorm_job jb = {y, x, w, d, eps};
    kv_model_for_rows(m, n, n * (size_t)d, rmsnorm_range, &jb);
}

/* cos/sin of pos * inv[i] for one position (angles in double, rounded once). */
static void rope_angles(const kv_model *m, const double *inv, int32_t pos, float *c, float *s) {
    const int half = m->arch.head_dim / 2;
    for (int i = 0; i < half; i++) {
        const double ang = (double)pos * inv[i];
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

typedef struct rope_job {
    const kv_model *m;
    const double *inv; /* the layer's inverse frequencies */
    float *x;
    size_t ld;
    int n_heads;
    const int32_t *pos;
    float sign;
    float *cos_out, *sin_out; /* rope_table: the angles' table instead of rotating x */
} rope_job;

static void rope_range(void *ctx, size_t r0, size_t r1, int thread) {
    (void)thread;
    const rope_job *jb = ctx;
    const int half = jb->m->arch.head_dim / 2;
    float cbuf[2048], sbuf[2048]; /* head_dim <= 4096 (checked at creation) */
    for (size_t r = r0; r < r1; r++) {
        if (jb->cos_out) {
            rope_angles(jb->m, jb->inv, jb->pos[r], jb->cos_out + r * half, jb->sin_out + r * half);
            continue;
        }
        rope_angles(jb->m, jb->inv, jb->pos[r], cbuf, sbuf);
        rope_row(jb->m, jb->x + r * jb->ld, jb->n_heads, cbuf, sbuf, jb->sign);
    }
}

void kv_model_rope_layer(const kv_model *m, int layer, float *x, size_t n, size_t ld, int n_heads,
                         const int32_t *pos, int inverse) {
    const double *inv = kv_model_rope_inv_freq_layer(m, layer);
    rope_job jb = {m, inv ? inv : m->inv_freq_d, x, ld, n_heads, pos, inverse ? -1.0f : 1.0f, NULL, NULL};
    /* the pool lives in the model (created on first use): the rotation itself leaves m unchanged */
    kv_model_for_rows((kv_model *)m, n, n * (size_t)n_heads * m->arch.head_dim, rope_range, &jb);
}

void kv_model_rope(const kv_model *m, float *x, size_t n, size_t ld, int n_heads, const int32_t *pos,
                   int inverse) {
    rope_job jb = {m, m->inv_freq_d, x, ld, n_heads, pos, inverse ? -1.0f : 1.0f, NULL, NULL};
    kv_model_for_rows((kv_model *)m, n, n * (size_t)n_heads * m->arch.head_dim, rope_range, &jb);
}

/* The cos/sin table `which` (0 global layers, 1 local layers) of the workspace for n rows at positions pos
 * (kept across layers). */
static void rope_table(kv_model *m, int which, const int32_t *pos, size_t n) {
    kv_workspace *w = &m->ws;
    if (w->rope_n[which] == n && memcmp(w->rope_pos[which], pos, n * sizeof(int32_t)) == 0) return;
    const int half = m->arch.head_dim / 2;
    rope_job jb = {m, which ? m->inv_freq_local_d : m->inv_freq_d, NULL, 0, 0, pos, 1.0f, w->rope_cos[which],
                   w->rope_sin[which]};
    kv_model_for_rows(m, n, n * (size_t)half * 16, rope_range, &jb);
    memcpy(w->rope_pos[which], pos, n * sizeof(int32_t));
    w->rope_n[which] = n;
}

/* In place over one row: softmax over the entries [lo, hi), zeros elsewhere (the causal mask, and the
 * sliding window's left edge). */
static void softmax_row(float *s, int lo, int hi, int ntotal) {
    float mx = -INFINITY;
    for (int j = lo; j < hi; j++) mx = s[j] > mx ? s[j] : mx;
    double sum = 0.0;
    for (int j = lo; j < hi; j++) {
        const float e = expf(s[j] - mx);
        s[j] = e;
        sum += e;
    }
    for (int j = 0; j < lo; j++) s[j] = 0.0f;
    for (int j = lo; j < hi; j++) s[j] = (float)((double)s[j] / sum);
    for (int j = hi; j < ntotal; j++) s[j] = 0.0f;
}

/* Attention of one sequence: T queries (q: T x q_dim) over S keys/values of which the last T are
 * the queries' own tokens (query t sees keys 0 .. S-T+t; with a window W > 0 only the last W of them,
 * S-T+t-W < j <= S-T+t). out: T x q_dim. Tasks (head, block of query rows) run on the model's thread pool,
 * the heaviest (last) blocks first for balance; a task's result does not depend on the thread that runs
 * it. A block's products skip the keys that none of its rows sees (a local layer reads about W + block
 * keys per block, not S). */
typedef struct attend_job {
    kv_model *m;
    const float *q, *K, *V;
    size_t ldk, ldv;
    int T, S, qb, nqb, window;
    float scale;
    float *out;
} attend_job;

static void attend_task(void *ctx, int task, int thread) {
    const attend_job *jb = ctx;
    const kv_arch *a = &jb->m->arch;
    const int hd = a->head_dim, nh = a->n_heads, group = a->n_heads / a->n_kv_heads, qd = nh * hd;
    const int past = jb->S - jb->T, qb = jb->qb;
    float *sc = jb->m->ws.scores + (size_t)thread * qb * (size_t)jb->S;
    const int h = task % nh, blk = jb->nqb - 1 - task / nh;
    const int t0 = blk * qb, t1 = t0 + qb < jb->T ? t0 + qb : jb->T, nq = t1 - t0;
    const int W = jb->window;
    /* keys [kb, past + t1): what the block's rows see (its first row's window starts at kb) */
    const int kb = W > 0 && past + t0 + 1 - W > 0 ? past + t0 + 1 - W : 0;
    const int nk = past + t1 - kb;
    const float *Qh = jb->q + (size_t)t0 * qd + (size_t)h * hd;
    const float *Kh = jb->K + (size_t)kb * jb->ldk + (size_t)(h / group) * hd;
    const float *Vh = jb->V + (size_t)kb * jb->ldv + (size_t)(h / group) * hd;
    float *Oh = jb->out + (size_t)t0 * qd + (size_t)h * hd;
    if (nq == 1) {
        cblas_sgemv(CblasRowMajor, CblasNoTrans, nk, hd, jb->scale, Kh, (int)jb->ldk, Qh, 1, 0.0f, sc, 1);
    } else {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, nq, nk, hd, jb->scale, Qh, qd, Kh, (int)jb->ldk, 0.0f, sc,
                    nk);
    }
    for (int i = 0; i < nq; i++) {
        const int qpos = past + t0 + i; /* the row's own key index */
        const int lo = W > 0 && qpos + 1 - W > kb ? qpos + 1 - W - kb : 0;
        softmax_row(sc + (size_t)i * nk, lo, qpos + 1 - kb, nk);
    }
    if (nq == 1) {
        cblas_sgemv(CblasRowMajor, CblasTrans, nk, hd, 1.0f, Vh, (int)jb->ldv, sc, 1, 0.0f, Oh, 1);
    } else {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, nq, hd, nk, 1.0f, sc, nk, Vh, (int)jb->ldv, 0.0f, Oh, qd);
    }
}

static kv_status attend(kv_model *m, const float *q, int T, const float *K, size_t ldk, const float *V,
                        size_t ldv, int S, int window, float *out) {
    const kv_arch *a = &m->arch;
    const int hd = a->head_dim, nh = a->n_heads;
    const int qb = T < ATT_QBLOCK ? T : ATT_QBLOCK;
    const int nqb = (T + qb - 1) / qb;
    /* multiply-adds of the whole step, about: 2 * heads * rows * keys * head_dim */
    const size_t work = 2 * (size_t)nh * (size_t)T * (size_t)S * (size_t)hd;
    const int nthr = kv_model_par(m, work);
    kv_status s = kv_model_ws_floats(&m->ws.scores, &m->ws.scores_cap, (size_t)m->n_threads * qb * (size_t)S,
                                     "attention scores");
    if (s != KV_OK) return s;
    kv_model_blas_threads(m, 1); /* each task calls the BLAS on its own */
    attend_job jb = {m, q, K, V, ldk, ldv, T, S, qb, nqb, window, (float)(1.0 / sqrt((double)hd)), out};
    kv_pool_run(nthr > 1 ? kv_model_pool(m) : NULL, nh * nqb, attend_task, &jb);
    return KV_OK;
}

/* ---- one decoder layer ------------------------------------------------------------------------ */
/* Row-range pieces of a layer (kv_model_for_rows). */
typedef struct layer_job {
    const kv_model *m;
    const kv_layer_weights *lw;
    int table; /* RoPE table: 0 global, 1 local */
} layer_job;

static void rope_qk_range(void *ctx, size_t r0, size_t r1, int thread) {
    (void)thread;
    const layer_job *jb = ctx;
    const kv_model *m = jb->m;
    const kv_arch *a = &m->arch;
    const kv_workspace *w = &m->ws;
    const int half = a->head_dim / 2, qd = a->n_heads * a->head_dim, kvd = a->n_kv_heads * a->head_dim;
    for (size_t r = r0; r < r1; r++) {
        const float *c = w->rope_cos[jb->table] + r * half, *sn = w->rope_sin[jb->table] + r * half;
        rope_row(m, w->q + r * qd, a->n_heads, c, sn, 1.0f);
        rope_row(m, w->k + r * kvd, a->n_kv_heads, c, sn, 1.0f);
    }
}

/* RMSNorm of n vectors of length d in place, each times w (the mean square in double, as rmsnorm_range). */
static void rmsnorm_vecs(float *x, int n, int d, const float *w, float eps) {
    for (int v = 0; v < n; v++) {
        float *xv = x + (size_t)v * d;
        double ss = 0.0;
        for (int i = 0; i < d; i++) ss += (double)xv[i] * (double)xv[i];
        const float scale = (float)(1.0 / sqrt(ss / d + (double)eps));
        for (int i = 0; i < d; i++) xv[i] = (xv[i] * scale) * w[i];
    }
}

/* QK-norm: every head of q and k normalized over head_dim (Qwen3, Gemma 3); then q times the attention
 * scale's fold (kv_model.q_fold). */
static void qk_norm_range(void *ctx, size_t r0, size_t r1, int thread) {
    (void)thread;
    const layer_job *jb = ctx;
    const kv_model *m = jb->m;
    const kv_arch *a = &m->arch;
    const kv_workspace *w = &m->ws;
    const int hd = a->head_dim, qd = a->n_heads * hd, kvd = a->n_kv_heads * hd;
    const float fold = (float)m->q_fold;
    for (size_t r = r0; r < r1; r++) {
        float *q = w->q + r * qd;
        if (jb->lw->q_norm) {
            rmsnorm_vecs(q, a->n_heads, hd, jb->lw->q_norm, a->rms_eps);
            rmsnorm_vecs(w->k + r * kvd, a->n_kv_heads, hd, jb->lw->k_norm, a->rms_eps);
        }
        if (fold != 1.0f)
            for (int i = 0; i < qd; i++) q[i] *= fold;
    }
}

typedef struct add_job {
    float *h;
    const float *x;
    int d;
} add_job;

static void add_range(void *ctx, size_t r0, size_t r1, int thread) {
    (void)thread;
    const add_job *jb = ctx;
    for (size_t r = r0; r < r1; r++)
        for (int i = 0; i < jb->d; i++) jb->h[r * jb->d + i] += jb->x[r * jb->d + i];
}

static void swiglu_range(void *ctx, size_t r0, size_t r1, int thread) {
    (void)thread;
    const kv_model *m = ctx;
    const int ff = m->arch.d_ff;
    for (size_t r = r0; r < r1; r++) {
        float *g = m->ws.gate + r * ff;
        const float *u = m->ws.up + r * ff;
        for (int i = 0; i < ff; i++) g[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
    }
}

/* GeGLU with the tanh form of GELU, 0.5 g (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3))), as PyTorch's
 * gelu(approximate="tanh") (HF "gelu_pytorch_tanh") and ggml_gelu_f32 compute it. */
static void geglu_range(void *ctx, size_t r0, size_t r1, int thread) {
    (void)thread;
    const kv_model *m = ctx;
    const int ff = m->arch.d_ff;
    const float c = 0.7978845608028654f; /* sqrt(2/pi) */
    for (size_t r = r0; r < r1; r++) {
        float *g = m->ws.gate + r * ff;
        const float *u = m->ws.up + r * ff;
        for (int i = 0; i < ff; i++) {
            const float x = g[i];
            g[i] = 0.5f * x * (1.0f + tanhf(c * (x + 0.044715f * x * x * x))) * u[i];
        }
    }
}

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
    const int local = kv_arch_layer_is_local(a, layer) && m->inv_freq_local_d;
    const int window = kv_arch_layer_window(a, layer);
    layer_job lj = {m, lw, local};
    if (lw->q_norm || m->q_fold != 1.0) kv_model_for_rows(m, n, n * (size_t)(qd + kvd) * 4, qk_norm_range, &lj);
    if (capture) memcpy(w->q_pre, w->q, n * (size_t)qd * sizeof(float));
    if (capture || cache) memcpy(w->k_pre, w->k, n * (size_t)kvd * sizeof(float));
    rope_table(m, local, pos, n);
    kv_model_for_rows(m, n, n * (size_t)(qd + kvd), rope_qk_range, &lj);
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
            if (cache->ops->attend) { /* the cache attends over what it holds (a compressed form) */
                /* a cache that applies the layer's window itself (a plan with windows, checked against the model
                 * at kv_cache_rt_create) attends like the model; one that does not (a plan of format 1.4 or older)
                 * must not attend beyond it: refuse a step whose queries would need it (one at position >= W) */
                if (window > 0 && pos[r0 + (size_t)n_tokens - 1] >= window && !kv_cache_applies_windows(cache))
                    return KV_ERR(KV_EUNSUPPORTED,
                                  "layer %d attends over a sliding window of %d tokens, which the KV cache '%s' does "
                                  "not apply (it attends itself; its plan has no layer windows: refit it with this kvcal, plan "
                                  "format 1.5); at most %d positions can run through it",
                                  layer, window, cache->ops->name, window);
                kv_model_blas_threads(m, 1); /* it may call the BLAS from its own threads */
                s = cache->ops->attend(cache, layer, sid, n_tokens, w->q + r0 * qd, (size_t)qd, w->att + r0 * qd,
                                       (size_t)qd);
                if (s != KV_OK) return s;
                continue;
            }
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
        if ((s = attend(m, w->q + r0 * qd, n_tokens, K, ldk, V, ldv, S, window, w->att + r0 * qd)) != KV_OK)
            return s;
    }
    if ((s = kv_model_matmul(m, w->att, n, &lw->wo, NULL, w->proj)) != KV_OK) return s;
    if (lw->post_attn_norm) rmsnorm_rows(m, w->proj, w->proj, lw->post_attn_norm, n, d, a->rms_eps);
    add_job aj = {h, w->proj, d};
    kv_model_for_rows(m, n, n * (size_t)d, add_range, &aj);

    /* feed-forward block */
    rmsnorm_rows(m, w->x, h, lw->ffn_norm, n, d, a->rms_eps);
    {
        const kv_matrix *mats[2] = {&lw->w_gate, &lw->w_up};
        float *outs[2] = {w->gate, w->up};
        if ((s = kv_model_matmul_multi(m, w->x, n, mats, NULL, outs, 2)) != KV_OK) return s;
    }
    kv_model_for_rows(m, n, n * (size_t)ff * 8, a->ffn_act == KV_FFN_GELU_TANH ? geglu_range : swiglu_range, m);
    if ((s = kv_model_matmul(m, w->gate, n, &lw->w_down, NULL, w->proj)) != KV_OK) return s;
    if (lw->post_ffn_norm) rmsnorm_rows(m, w->proj, w->proj, lw->post_ffn_norm, n, d, a->rms_eps);
    kv_model_for_rows(m, n, n * (size_t)d, add_range, &aj);
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
    const float scale = m->arch.embed_scale;
    for (size_t r = 0; r < n; r++) {
        kv_status s = kv_model_matrix_row(e, tokens[r], h + r * d);
        if (s != KV_OK) return s;
        if (scale != 0.0f && scale != 1.0f)
            for (int i = 0; i < d; i++) h[r * d + i] *= scale;
    }
    return KV_OK;
}

/* Final logit softcapping: c * tanh(z / c) (Gemma; llama.cpp's gemma3 graph, HF Gemma3ForCausalLM). */
typedef struct softcap_job {
    float *z;
    int V;
    float c;
} softcap_job;

static void softcap_range(void *ctx, size_t r0, size_t r1, int thread) {
    (void)thread;
    const softcap_job *jb = ctx;
    for (size_t r = r0; r < r1; r++) {
        float *z = jb->z + r * (size_t)jb->V;
        for (int j = 0; j < jb->V; j++) z[j] = jb->c * tanhf(z[j] / jb->c);
    }
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
    if (s == KV_OK && m->arch.final_logit_softcap > 0.0f) {
        softcap_job jb = {logits, m->arch.vocab_size, m->arch.final_logit_softcap};
        kv_model_for_rows(m, n, n * (size_t)m->arch.vocab_size * 8, softcap_range, &jb);
    }
    return s;
}

kv_status kv_model_forward(kv_model *m, const kv_forward *f) {
    if (!m || !f || !f->tokens || f->n_seqs <= 0 || f->n_tokens <= 0)
        return KV_ERR(KV_EINVAL, "kv_model_forward: bad arguments");
    kv_status s;
    if (m->gpu) {
        if (f->cache && (s = check_cache(m, f->cache, f->n_seqs, f->seq_ids)) != KV_OK) return s;
        return kv_model_cuda_forward(m, f);
    }
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
