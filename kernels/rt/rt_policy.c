/* rt_policy.c — the token policy of a sequence (RUNTIME.md §8): token pruning under a memory budget,
 * the first half of quantized pruning (quantized-pruning.txt §4; the second half is the plan's
 * quantizer applied to what is kept).
 *
 * A method is an entry of k_policies: how it scores the tokens of a prompt (recency, accumulated
 * attention, the attention of an observation window) and what else it does. The runtime never
 * branches on the method elsewhere: it asks the policy whether attention accumulates scores, whether
 * a prompt is held in f16, and calls rt_policy_end_prompt / kv_rti_policy_settle at the two moments a
 * selection happens.
 *
 * At the end of a prompt of N tokens, per layer and KV head: the sinks (f16) and the last `window`
 * tokens are kept; among the tokens between them the policy keeps the best-scored ones, as many as the
 * layer's budget pays for: budget x (the f16 bytes of the prompt's K and V of one head), minus the f16
 * sinks, over the bytes of m tokens of K and V coded one head wide by the layer's quantizers (codes,
 * scales, zero points or norms, exactly as stored) plus 4 bytes of position per token in each of the K
 * and V blocks when the kept tokens are not consecutive. What is kept is encoded in one block per head and stream; the rest of
 * the prompt is dropped. */
#include "kvrt.h"
#include "rt_internal.h"

#include <cblas.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* The methods (kv_plan_prune): scores, pooling, per-layer schedule, selection after the prompt, least window. */
static const rt_policy k_policies[] = {
    {KV_PLAN_PRUNE_NONE, "none", RT_SCORE_NONE, 0, 0, 0, 0},
    {KV_PLAN_PRUNE_STREAMINGLLM, "streamingllm", RT_SCORE_RECENCY, 0, 0, 0, 0},
    {KV_PLAN_PRUNE_H2O, "h2o", RT_SCORE_ACCUMULATED, 0, 0, 1, 0},
    {KV_PLAN_PRUNE_SNAPKV, "snapkv", RT_SCORE_WINDOW, 1, 0, 0, 1},
    {KV_PLAN_PRUNE_PYRAMIDKV, "pyramidkv", RT_SCORE_WINDOW, 1, 1, 0, 1},
};

/* PyramidKV's beta: the last layer keeps 1/beta of the mean budget (pyramidkv_utils.py). */
#define PYRAMID_BETA 20.0
/* Bytes of position stored per kept token and KV head when the kept tokens are not consecutive. */
#define INDEX_BYTES 4

static const char *sname(int stream) { return stream == KV_PLAN_K ? "K" : "V"; }

const rt_policy *kv_rti_policy_of(kv_plan_prune method) {
    for (size_t i = 0; i < sizeof k_policies / sizeof k_policies[0]; i++)
        if (k_policies[i].method == method) return &k_policies[i];
    return NULL;
}

kv_status kv_prune_pyramid_budgets(double *out, int n_layers, double b) {
    if (!out || n_layers < 1 || !(b > 0.0 && b <= 1.0))
        return KV_ERR(KV_EINVAL, "PyramidKV budgets: %d layers, mean budget %g (must be in (0, 1])", n_layers, b);
    double bmax = 2.0 * b - b / PYRAMID_BETA;
    if (bmax > 1.0) bmax = 1.0;
    const double bmin = 2.0 * b - bmax;
    for (int l = 0; l < n_layers; l++)
        out[l] = n_layers == 1 ? b : bmax - (bmax - bmin) * (double)l / (double)(n_layers - 1);
    return KV_OK;
}

kv_status kv_rti_policy_check(const kv_plan *p) {
    const rt_policy *pol = kv_rti_policy_of(p->global.prune_method);
    if (!pol) return KV_ERR(KV_EFORMAT, "plan: unknown prune method %d", (int)p->global.prune_method);
    if (pol->score == RT_SCORE_NONE) return KV_OK;
    const kv_plan_global *g = &p->global;
    if (!(g->prune_budget > 0.0f && g->prune_budget <= 1.0f))
        return KV_ERR(KV_EINVAL, "plan: prune budget %g is outside (0, 1] (a fraction of the f16 cache)",
                      (double)g->prune_budget);
    if (g->prune_pool < 0 || (g->prune_pool != 0 && g->prune_pool % 2 == 0))
        return KV_ERR(KV_EINVAL, "plan: pooling kernel %d must be odd (or 0: no pooling)", g->prune_pool);
    if (g->prune_window < pol->min_window)
        return KV_ERR(KV_EINVAL, "plan: %s scores tokens by the attention of the prompt's last prune_window queries, "
                      "which must be at least %d (got %d)", pol->name, pol->min_window, g->prune_window);
    for (int l = 0; l < p->n_layers; l++) {
        const float b = p->layers[l].prune_budget;
        if (b != 0.0f && !(b > 0.0f && b <= 1.0f))
            return KV_ERR(KV_EINVAL, "plan layer %d: prune budget %g is outside (0, 1]", l, (double)b);
        for (int st = 0; st < 2; st++) {
            const kv_plan_stream *ps = &p->layers[l].stream[st];
            if (ps->predictor)
                return KV_ERR(KV_EUNSUPPORTED, "plan layer %d %s: token pruning (%s) keeps different tokens per KV head "
                              "and layer, but an AQUA-KV predictor reads every head of the same tokens of the previous "
                              "layer: the two are not combined", l, sname(st), pol->name);
            if (ps->share_codes_with_layer >= 0)
                return KV_ERR(KV_EUNSUPPORTED, "plan layer %d %s: token pruning (%s) keeps different tokens per layer, "
                              "so XQuant shared codes (the codes of layer %d's same tokens) do not exist", l, sname(st),
                              pol->name, ps->share_codes_with_layer);
            if (ps->rpc_ratio > 0.0f)
                return KV_ERR(KV_EUNSUPPORTED, "plan layer %d %s: token pruning (%s) together with a KVmix recent pivotal "
                              "context is not supported", l, sname(st), pol->name);
            if (ps->method == KV_PLAN_HIGGS && (ps->group_size <= 0 || p->fingerprint.head_dim % ps->group_size))
                return KV_ERR(KV_EUNSUPPORTED, "plan layer %d %s: HIGGS groups of %d channels span KV heads (head_dim "
                              "%d); token pruning keeps tokens per head, whose channels must be coded on their own",
                              l, sname(st), ps->group_size, p->fingerprint.head_dim);
        }
    }
    return KV_OK;
}

kv_status kv_rti_policy_open(kv_rt *rt) {
    const kv_plan *p = rt->plan;
    rt->policy = kv_rti_policy_of(p->global.prune_method);
    const int pruning = rt->policy->score != RT_SCORE_NONE, stats = rt->opt.prompt_stats;
    rt->window = pruning ? p->global.prune_window : 0;
    rt->hold_prompt = pruning || stats;
    rt->collect_acc = rt->policy->score == RT_SCORE_ACCUMULATED || stats;
    rt->wq_rows = rt->policy->score == RT_SCORE_WINDOW ? rt->window : 0;
    if (stats) {
        const int w = rt->opt.prompt_window > 0 ? rt->opt.prompt_window : p->global.prune_window;
        rt->wq_rows = w > rt->wq_rows ? w : rt->wq_rows;
    }
    if (!pruning) return KV_OK;
    const int H = rt->n_kv_heads, L = rt->n_layers;
    rt->hcodec = calloc((size_t)L * 2 * (size_t)H, sizeof *rt->hcodec);
    rt->budget = malloc((size_t)L * sizeof *rt->budget);
    if (!rt->hcodec || !rt->budget) return KV_ERR(KV_ENOMEM, "out of memory for a runtime");
    for (int l = 0; l < L; l++)
        for (int st = 0; st < 2; st++)
            for (int h = 0; h < H; h++) {
                kv_status s = kv_rti_codec_head_init(&rt->hcodec[((size_t)l * 2 + (size_t)st) * (size_t)H + (size_t)h],
                                                 rt_codec_of(rt, l, st), h);
                if (s != KV_OK) return s;
            }
    int any_layer = 0;
    for (int l = 0; l < L; l++) any_layer |= p->layers[l].prune_budget > 0.0f;
    kv_status s = KV_OK;
    if (rt->policy->layer_schedule && !any_layer)
        s = kv_prune_pyramid_budgets(rt->budget, L, (double)p->global.prune_budget);
    else
        for (int l = 0; l < L; l++)
            rt->budget[l] = p->layers[l].prune_budget > 0.0f ? (double)p->layers[l].prune_budget
                                                              : (double)p->global.prune_budget;
    return s;
}

void kv_rti_policy_close(kv_rt *rt) {
    if (rt->hcodec)
        for (size_t i = 0; i < (size_t)rt->n_layers * 2 * (size_t)rt->n_kv_heads; i++) kv_rti_codec_free(&rt->hcodec[i]);
    free(rt->hcodec);
    free(rt->budget);
    rt->hcodec = NULL;
    rt->budget = NULL;
}

/* Whether the policy prunes a layer: every layer of a pruning plan but those with an attention window, which hold
 * at most their window already and keep what it covers (RUNTIME.md §11). */
int kv_rti_policy_prunes(const kv_rt *rt, int layer) {
    return rt->policy->score != RT_SCORE_NONE && !(rt->win && rt->win[layer] > 0);
}

/* Whether a layer holds an open prompt in f16 until it ends: a layer the policy prunes, or every layer when the
 * prompt's statistics are collected. */
int kv_rti_policy_holds(const kv_rt *rt, int layer) {
    return rt->opt.prompt_stats || kv_rti_policy_prunes(rt, layer);
}

static void pstate_reset(kv_rt *rt, rt_pstate *ps) {
    free(ps->acc);
    free(ps->wq);
    memset(ps, 0, sizeof *ps);
    ps->sel_end = rt->sinks;
    ps->acc_base = rt->sinks;
}

kv_status kv_rti_policy_seq_init(kv_rt *rt, rt_seq *sq) {
    for (int l = 0; l < rt->n_layers; l++) pstate_reset(rt, &sq->ps[l]);
    if (rt->policy->score == RT_SCORE_NONE) return KV_OK;
    for (int i = 0; i < rt->n_layers * 2; i++)
        if (kv_rti_policy_prunes(rt, i / 2) && !(sq->st[i].heads = calloc((size_t)rt->n_kv_heads, sizeof(rt_hstore))))
            return KV_ERR(KV_ENOMEM, "out of memory for a sequence");
    return KV_OK;
}

void kv_rti_policy_seq_clear(kv_rt *rt, rt_seq *sq) {
    for (int l = 0; sq->ps && l < rt->n_layers; l++) pstate_reset(rt, &sq->ps[l]);
    sq->prompt_open = 0;
    sq->prompt_ended = 0;
}

void kv_rti_hstore_clear(rt_hstore *hs) {
    for (int b = 0; b < hs->n_blocks; b++) {
        free(hs->blocks[b].b.data);
        free(hs->blocks[b].pos);
    }
    free(hs->blocks);
    memset(hs, 0, sizeof *hs);
}

void kv_rti_hstore_bytes(const kv_rt *rt, int layer, int stream, const rt_stream *st, uint64_t *payload, uint64_t *index,
                     uint64_t *values) {
    *payload = *index = *values = 0;
    for (int h = 0; h < rt->n_kv_heads; h++) {
        const rt_hstore *hs = &st->heads[h];
        for (int b = 0; b < hs->n_blocks; b++) {
            rt_layout L;
            kv_rti_codec_layout(rt_hcodec_of(rt, layer, stream, h), hs->blocks[b].b.m, &L);
            *payload += L.total;
            *index += hs->blocks[b].pos ? (uint64_t)INDEX_BYTES * (uint64_t)hs->blocks[b].b.m : 0u;
            *values += (uint64_t)hs->blocks[b].b.m * (uint64_t)rt->head_dim;
        }
    }
}

/* ---- what attention collects ------------------------------------------------------------------------ */
int kv_rti_policy_accumulates(const kv_rt *rt, int seq, int layer) {
    if (rt->policy->score == RT_SCORE_ACCUMULATED && kv_rti_policy_prunes(rt, layer))
        return 1; /* H2O: the prompt, then the window after it */
    return rt->opt.prompt_stats && rt->seqs[seq].prompt_open;
}

kv_status kv_rti_policy_reserve(kv_rt *rt, int seq, int layer, int n_total) {
    if (!kv_rti_policy_accumulates(rt, seq, layer)) return KV_OK;
    rt_pstate *ps = &rt->seqs[seq].ps[layer];
    const int need = n_total - ps->acc_base;
    if (need <= ps->acc_n) return KV_OK;
    const size_t H = (size_t)rt->n_kv_heads;
    if (need > ps->acc_cap) {
        int cap = ps->acc_cap ? ps->acc_cap : 256;
        while (cap < need) cap = cap > (1 << 29) ? need : cap * 2;
        float *a = malloc(H * (size_t)cap * sizeof(float));
        if (!a) return KV_ERR(KV_ENOMEM, "runtime: out of memory for the scores of %d tokens", need);
        for (size_t h = 0; h < H; h++)
            if (ps->acc_n) memcpy(a + h * (size_t)cap, ps->acc + h * (size_t)ps->acc_cap, (size_t)ps->acc_n * sizeof(float));
        free(ps->acc);
        ps->acc = a;
        ps->acc_cap = cap;
    }
    for (size_t h = 0; h < H; h++)
        memset(ps->acc + h * (size_t)ps->acc_cap + ps->acc_n, 0, (size_t)(need - ps->acc_n) * sizeof(float));
    ps->acc_n = need;
    return KV_OK;
}

kv_status kv_rti_policy_saw_queries(kv_rt *rt, int seq, int layer, int n_q, const float *q, size_t ldq) {
    rt_seq *sq = &rt->seqs[seq];
    if (!sq->prompt_open || !kv_rti_policy_holds(rt, layer)) return KV_OK;
    rt_pstate *ps = &sq->ps[layer];
    const int n = sq->layer_n[layer];
    /* coverage: every prompt position's query attended once, in order */
    ps->q_seen = ps->q_seen == n - n_q ? n : -1;
    if (rt->wq_rows <= 0) return KV_OK;
    const size_t qd = (size_t)rt->n_heads * (size_t)rt->head_dim, W = (size_t)rt->wq_rows;
    if (!ps->wq && !(ps->wq = malloc(W * qd * sizeof(float))))
        return KV_ERR(KV_ENOMEM, "runtime: out of memory for %d window queries", rt->wq_rows);
    if (ps->wq_end != n - n_q) ps->wq_n = 0; /* not the rows just before: start again */
    const int take = (size_t)n_q < W ? n_q : (int)W;
    const int keep = ps->wq_n + take > (int)W ? (int)W - take : ps->wq_n;
    if (keep < ps->wq_n) memmove(ps->wq, ps->wq + (size_t)(ps->wq_n - keep) * qd, (size_t)keep * qd * sizeof(float));
    for (int r = 0; r < take; r++)
        memcpy(ps->wq + (size_t)(keep + r) * qd, q + (size_t)(n_q - take + r) * ldq, qd * sizeof(float));
    ps->wq_n = keep + take;
    ps->wq_end = n;
    return KV_OK;
}

/* ---- selection ---------------------------------------------------------------------------------------- */
/* Rows m a head keeps: the most whose K and V (coded one head wide) and positions fit in `allow` bytes,
 * at least `forced`, at most `most`. */
/* index_bytes: position bytes per kept token in one stream; the K and V blocks each store their positions
 * (kv_rt_get_stats counts both), so both are charged. */
static int rows_for_budget(const kv_rt *rt, int layer, double allow, int forced, int most, int index_bytes) {
    rt_layout lk, lv;
    const rt_codec *ck = rt_hcodec_of(rt, layer, KV_PLAN_K, 0), *cv = rt_hcodec_of(rt, layer, KV_PLAN_V, 0);
#define COST(m) (kv_rti_codec_layout(ck, (m), &lk), kv_rti_codec_layout(cv, (m), &lv), \
                 (double)lk.total + (double)lv.total + 2.0 * (double)index_bytes * (double)(m))
    if (COST(forced) > allow) return forced;
    int lo = forced, hi = most; /* cost(lo) <= allow; find the largest such */
    while (lo < hi) {
        const int mid = lo + (hi - lo + 1) / 2;
        if (COST(mid) <= allow) lo = mid; else hi = mid - 1;
    }
#undef COST
    return lo;
}

typedef struct scored {
    float s;
    int i;
} scored;

static int by_score_desc(const void *a, const void *b) {
    const scored *x = a, *y = b;
    if (x->s != y->s) return x->s < y->s ? 1 : -1;
    return y->i - x->i; /* ties: the later token first */
}

static int by_index(const void *a, const void *b) { return ((const scored *)a)->i - ((const scored *)b)->i; }

/* The k best of n scores (candidates 0..n-1) into keep[0..k), ascending. Scores that are not numbers
 * rank last. */
static kv_status top_k(int *keep, const float *score, int n, int k) {
    scored *sv = malloc((size_t)(n > 0 ? n : 1) * sizeof *sv);
    if (!sv) return KV_ERR(KV_ENOMEM, "runtime: out of memory selecting among %d tokens", n);
    for (int i = 0; i < n; i++) sv[i] = (scored){isnan(score[i]) ? -INFINITY : score[i], i};
    qsort(sv, (size_t)n, sizeof *sv, by_score_desc);
    qsort(sv, (size_t)k, sizeof *sv, by_index);
    for (int i = 0; i < k; i++) keep[i] = sv[i].i;
    free(sv);
    return KV_OK;
}

/* SnapKV's scores of one KV head: the softmax weights the window's queries (every head of the group)
 * give each token of the prefix [0, pre), summed, then averaged over `pool` neighbours (zero padded, as
 * torch's avg_pool1d with padding pool/2). */
typedef struct window_job {
    kv_rt *rt;
    int seq, layer, n, pre;
    float *scores;   /* per KV head: pre floats */
    kv_status status;
} window_job;

static void window_item(void *ctx, int h, int thread) {
    (void)thread;
    window_job *jb = ctx;
    kv_rt *rt = jb->rt;
    const rt_pstate *ps = &rt->seqs[jb->seq].ps[jb->layer];
    const int hd = rt->head_dim, G = rt->group, n = jb->n, pre = jb->pre;
    const int rows = rt->window < ps->wq_n ? rt->window : ps->wq_n, nv = rows * G;
    const size_t qd = (size_t)rt->n_heads * (size_t)hd;
    float *Q = malloc((size_t)nv * (size_t)hd * sizeof(float));
    float *S = malloc((size_t)nv * (size_t)n * sizeof(float));
    float *K = malloc((size_t)RT_TILE * (size_t)hd * sizeof(float));
    double *col = calloc((size_t)(pre > 0 ? pre : 1), sizeof(double));
    if (!Q || !S || !K || !col) {
        __atomic_store_n(&jb->status, KV_ENOMEM, __ATOMIC_RELAXED);
        goto done;
    }
    for (int r = 0; r < rows; r++)
        for (int g = 0; g < G; g++) {
            const float *src = ps->wq + (size_t)(ps->wq_n - rows + r) * qd + (size_t)(h * G + g) * (size_t)hd;
            for (int c = 0; c < hd; c++) Q[(size_t)(r * G + g) * (size_t)hd + (size_t)c] = src[c] * rt->scale;
        }
    for (int a = 0; a < n; a += RT_TILE) {
        const int b = a + RT_TILE < n ? a + RT_TILE : n;
        kv_rti_read_rows_ready(rt, jb->seq, jb->layer, KV_PLAN_K, h, a, b, K, (size_t)hd);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, nv, b - a, hd, 1.0f, Q, hd, K, hd, 0.0f, S + a, n);
    }
    for (int v = 0; v < nv; v++) {
        const int lim = n - rows + v / G + 1; /* query of position n - rows + r sees tokens <= its own */
        float *s = S + (size_t)v * (size_t)n;
        float mx = s[0];
        for (int t = 1; t < lim; t++) mx = s[t] > mx ? s[t] : mx;
        for (int t = 0; t < lim; t++) s[t] -= mx;
        kv_rti_exp_inplace(s, (size_t)lim);
        double sum = 0.0;
        for (int t = 0; t < lim; t++) sum += s[t];
        const int e = pre < lim ? pre : lim;
        for (int t = 0; t < e; t++) col[t] += (double)s[t] / sum;
    }
    float *out = jb->scores + (size_t)h * (size_t)(pre > 0 ? pre : 1);
    const int half = rt->plan->global.prune_pool / 2, k = 2 * half + 1;
    for (int t = 0; t < pre; t++) {
        if (!rt->policy->pooled || half == 0) {
            out[t] = (float)col[t];
            continue;
        }
        double acc = 0.0;
        for (int u = t - half; u <= t + half; u++)
            if (u >= 0 && u < pre) acc += col[u];
        out[t] = (float)(acc / k);
    }
done:
    free(Q), free(S), free(K), free(col);
}

/* One (stream, head) of a selection: its kept rows gathered from the f16 rows and encoded. */
typedef struct enc_item {
    uint8_t *data;
    size_t bytes;
    kv_status status;
} enc_item;

typedef struct enc_job {
    kv_rt *rt;
    int seq, layer, m_max;
    const int *m;          /* per head: rows kept */
    const int32_t *pos;    /* per head: m_max positions (the first m used) */
    int fp_first;          /* position of f16 row rt->sinks (the window's first token) */
    enc_item *items;       /* 2 * H */
} enc_job;

static void enc_run(void *ctx, int item, int thread) {
    (void)thread;
    enc_job *jb = ctx;
    kv_rt *rt = jb->rt;
    const int H = rt->n_kv_heads, st = item / H, h = item % H, m = jb->m[h], hd = rt->head_dim;
    enc_item *it = &jb->items[item];
    if (m == 0) return;
    const rt_codec *c = rt_hcodec_of(rt, jb->layer, st, h);
    const rt_stream *s = rt_stream_of(rt, jb->seq, jb->layer, st);
    const int32_t *pos = jb->pos + (size_t)h * (size_t)jb->m_max;
    float *x = malloc((size_t)m * (size_t)hd * sizeof(float));
    rt_layout L;
    kv_rti_codec_layout(c, m, &L);
    it->data = malloc(L.total ? L.total : 1);
    it->bytes = L.total;
    if (!x || !it->data) {
        it->status = KV_ENOMEM;
        free(x);
        return;
    }
    for (int r = 0; r < m; r++) {
        const int row = pos[r] < rt->sinks ? pos[r] : rt->sinks + (pos[r] - jb->fp_first);
        kv_rti_f16_to_f32_row(x + (size_t)r * (size_t)hd, s->fp + (size_t)row * (size_t)rt->kv_dim + (size_t)h * (size_t)hd,
                          (size_t)hd);
    }
    it->status = kv_rti_codec_encode(c, it->data, m, x);
    free(x);
}

static kv_status hstore_push(kv_rt *rt, rt_seq *sq, rt_hstore *hs, uint8_t *data, size_t bytes, int m,
                             const int32_t *pos) {
    if (hs->n_blocks == hs->cap_blocks) {
        const int cap = hs->cap_blocks ? hs->cap_blocks * 2 : 4;
        rt_hblock *b = realloc(hs->blocks, (size_t)cap * sizeof *b);
        if (!b) return KV_ERR(KV_ENOMEM, "runtime: out of memory for block descriptors");
        const uint64_t grow = (uint64_t)(cap - hs->cap_blocks) * sizeof *b;
        sq->allocated += grow;
        sq->overhead += grow;
        hs->blocks = b;
        hs->cap_blocks = cap;
    }
    int consecutive = 1;
    for (int r = 1; r < m; r++) consecutive &= pos[r] == pos[0] + r;
    int32_t *own = NULL;
    if (!consecutive) {
        if (!(own = malloc((size_t)m * sizeof *own))) return KV_ERR(KV_ENOMEM, "runtime: out of memory for positions");
        memcpy(own, pos, (size_t)m * sizeof *own);
        sq->allocated += (uint64_t)m * INDEX_BYTES;
    }
    hs->blocks[hs->n_blocks++] = (rt_hblock){{pos[0], m, data, (const uint32_t *)data}, own, hs->kept};
    hs->kept += m;
    sq->allocated += bytes;
    return KV_OK;
}

/* Encode every head's kept rows (both streams) and append them to the heads' stores. */
static kv_status encode_kept(kv_rt *rt, int seq, int layer, const int *m, const int32_t *pos, int m_max, int fp_first) {
    const int H = rt->n_kv_heads;
    rt_seq *sq = &rt->seqs[seq];
    enc_item *items = calloc((size_t)(2 * H), sizeof *items);
    if (!items) return KV_ERR(KV_ENOMEM, "runtime: out of memory");
    enc_job jb = {rt, seq, layer, m_max, m, pos, fp_first, items};
    kv_pool_run(rt->pool, 2 * H, enc_run, &jb);
    kv_status s = KV_OK;
    for (int i = 0; i < 2 * H && s == KV_OK; i++)
        if (items[i].status != KV_OK)
            s = items[i].status == KV_ENOMEM
                    ? KV_ERR(KV_ENOMEM, "runtime: out of memory for the kept tokens of layer %d", layer)
                    : kv_error_wrap(items[i].status, "layer %d %s, KV head %d, kept tokens: ", layer, sname(i / H), i % H);
    for (int i = 0; i < 2 * H && s == KV_OK; i++) {
        const int h = i % H;
        if (m[h] == 0) continue;
        rt_stream *st = rt_stream_of(rt, seq, layer, i / H);
        s = hstore_push(rt, sq, &st->heads[h], items[i].data, items[i].bytes, m[h], pos + (size_t)h * (size_t)m_max);
        if (s == KV_OK) items[i].data = NULL; /* owned by the store now */
    }
    for (int i = 0; i < 2 * H; i++) free(items[i].data);
    free(items);
    return s;
}

/* The selection of one layer at the end of its prompt of n tokens (checked by the caller). */
static kv_status prune_layer(kv_rt *rt, int seq, int layer) {
    rt_seq *sq = &rt->seqs[seq];
    rt_pstate *ps = &sq->ps[layer];
    const int n = sq->layer_n[layer], H = rt->n_kv_heads, hd = rt->head_dim;
    const int S = rt_sinks_held(rt, n);
    const int wstart = n - rt->window > S ? n - rt->window : S; /* the window [wstart, n) is kept whole */
    const int C = wstart - S, forced = n - wstart, region = n - S;
    const int index = rt->policy->score == RT_SCORE_RECENCY ? 0 : INDEX_BYTES;
    const double allow = rt->budget[layer] * (double)n * (double)hd * 4.0 - (double)S * (double)hd * 4.0;
    int *m = malloc((size_t)H * sizeof *m), *keep = malloc((size_t)(C > 0 ? C : 1) * sizeof *keep);
    int32_t *pos = malloc((size_t)H * (size_t)(region > 0 ? region : 1) * sizeof *pos);
    float *scores = NULL;
    kv_status s = KV_OK;
    if (!m || !keep || !pos) {
        s = KV_ERR(KV_ENOMEM, "runtime: out of memory selecting the tokens of layer %d", layer);
        goto done;
    }
    const int kept_rows = region > 0 ? rows_for_budget(rt, layer, allow, forced, region, index) : 0;
    const int k = kept_rows - forced; /* candidates kept per head */
    if (k > 0 && k < C && rt->policy->score == RT_SCORE_WINDOW) {
        if (!(scores = malloc((size_t)H * (size_t)wstart * sizeof *scores))) {
            s = KV_ERR(KV_ENOMEM, "runtime: out of memory for the scores of layer %d", layer);
            goto done;
        }
        if ((s = kv_rti_read_prepare(rt, seq, layer, KV_PLAN_K)) != KV_OK) goto done;
        window_job wj = {rt, seq, layer, n, wstart, scores, KV_OK};
        const int blas_threads = kv_rti_blas_threads_begin();
        kv_pool_run(rt->pool, H, window_item, &wj);
        kv_rti_blas_threads_end(blas_threads);
        if (wj.status != KV_OK) {
            s = KV_ERR(wj.status, "runtime: out of memory scoring the tokens of layer %d", layer);
            goto done;
        }
    }
    for (int h = 0; h < H; h++) {
        int32_t *ph = pos + (size_t)h * (size_t)(region > 0 ? region : 1);
        int nk = 0;
        if (k >= C) { /* the budget pays for every candidate */
            for (int t = S; t < wstart; t++) ph[nk++] = t;
        } else if (k > 0) {
            const float *sc = NULL;
            float *tmp = NULL;
            if (rt->policy->score == RT_SCORE_WINDOW) {
                sc = scores + (size_t)h * (size_t)wstart + S;
            } else if (rt->policy->score == RT_SCORE_ACCUMULATED) {
                sc = ps->acc + (size_t)h * (size_t)ps->acc_cap + (S - ps->acc_base);
            } else { /* recency */
                if (!(tmp = malloc((size_t)C * sizeof *tmp))) {
                    s = KV_ERR(KV_ENOMEM, "runtime: out of memory");
                    goto done;
                }
                for (int i = 0; i < C; i++) tmp[i] = (float)i;
                sc = tmp;
            }
            s = top_k(keep, sc, C, k);
            free(tmp);
            if (s != KV_OK) goto done;
            for (int i = 0; i < k; i++) ph[nk++] = S + keep[i];
        }
        for (int t = wstart; t < n; t++) ph[nk++] = t;
        m[h] = nk;
    }
    if ((s = encode_kept(rt, seq, layer, m, pos, region > 0 ? region : 1, rt->sinks)) != KV_OK) goto done;
    /* the prompt after the sinks is in the heads' stores now: the f16 rows keep the sinks */
    for (int st = 0; st < 2; st++) {
        rt_stream *sp = rt_stream_of(rt, seq, layer, st);
        if ((s = kv_rti_window_drop(rt, seq, sp, sp->fp_rows - S)) != KV_OK) goto done;
        sp->comp_end = n > rt->sinks ? n : rt->sinks;
    }
    ps->sel_end = n > rt->sinks ? n : rt->sinks;
done:
    free(m), free(keep), free(pos), free(scores);
    return s;
}

static kv_status check_prompt(const kv_rt *rt, int seq) {
    const rt_seq *sq = &rt->seqs[seq];
    const int n = sq->layer_n[0];
    const char *name = rt->policy->name;
    for (int l = 0; l < rt->n_layers; l++) {
        const rt_pstate *ps = &sq->ps[l];
        if (!kv_rti_policy_prunes(rt, l)) continue;
        if (sq->layer_n[l] != n)
            return KV_ERR(KV_EINVAL, "kv_rt_end_prompt: layer %d holds %d tokens, layer 0 %d: the prompt is not complete "
                          "in every layer", l, sq->layer_n[l], n);
        if (rt->window > n)
            return KV_ERR(KV_EINVAL, "kv_rt_end_prompt: the observation window of %s (prune_window %d tokens) is larger "
                          "than the prompt (%d tokens)", name, rt->window, n);
        if (rt->policy->score == RT_SCORE_ACCUMULATED && ps->q_seen != n)
            return KV_ERR(KV_EINVAL, "kv_rt_end_prompt: layer %d: %s selects tokens by the attention every prompt query "
                          "paid them, but kv_rt_attend did not see each of the %d prompt rows once, in order (a step "
                          "appended without attending through the runtime, or attended twice): the runtime cannot "
                          "score tokens it did not attend", l, name, n);
        if (rt->policy->score == RT_SCORE_WINDOW && (ps->wq_end != n || ps->wq_n < rt->window))
            return KV_ERR(KV_EINVAL, "kv_rt_end_prompt: layer %d: %s scores tokens by the attention of the prompt's "
                          "last %d queries, but kv_rt_attend saw %d of them (a step appended without attending through "
                          "the runtime): the runtime cannot score tokens it did not attend", l, name, rt->window,
                          ps->wq_end == n ? ps->wq_n : 0);
    }
    return KV_OK;
}

kv_status kv_rt_end_prompt(kv_rt *rt, int seq) {
    if (!rt || seq < 0 || seq >= rt->opt.n_seqs) return KV_ERR(KV_EINVAL, "kv_rt_end_prompt: bad arguments");
    rt_seq *sq = &rt->seqs[seq];
    if (!sq->prompt_open) return KV_OK;
    kv_status s = KV_OK;
    if (rt->policy->score != RT_SCORE_NONE) {
        if ((s = check_prompt(rt, seq)) != KV_OK) return s;
        for (int l = 0; l < rt->n_layers && s == KV_OK; l++)
            if (kv_rti_policy_prunes(rt, l)) s = prune_layer(rt, seq, l);
        if (s != KV_OK) return s;
    }
    for (int l = 0; l < rt->n_layers; l++) {
        rt_pstate *ps = &sq->ps[l];
        free(ps->wq);
        ps->wq = NULL;
        ps->wq_n = ps->wq_end = 0;
        if (rt->policy->score == RT_SCORE_ACCUMULATED) { /* H2O goes on scoring the tokens after the prompt */
            ps->acc_base = ps->sel_end;
            ps->acc_n = 0;
        } else {
            free(ps->acc);
            ps->acc = NULL;
            ps->acc_n = ps->acc_cap = 0;
            ps->acc_base = ps->sel_end;
        }
    }
    sq->prompt_open = 0;
    sq->prompt_ended = 1;
    return KV_OK;
}

/* ---- after the prompt: H2O selects among the chunks leaving the window ------------------------------ */
kv_status kv_rti_policy_settle(kv_rt *rt, int seq, int layer, int *handled, float *x) {
    (void)x;
    *handled = 0;
    rt_seq *sq = &rt->seqs[seq];
    if (!rt->policy->decode_chunks || !sq->prompt_ended || !kv_rti_policy_prunes(rt, layer)) return KV_OK;
    *handled = 1;
    rt_pstate *ps = &sq->ps[layer];
    const int H = rt->n_kv_heads, R = rt->recent, hd = rt->head_dim;
    const int n = sq->layer_n[layer];
    int *m = malloc((size_t)H * sizeof *m), *keep = malloc((size_t)R * sizeof *keep);
    int32_t *pos = malloc((size_t)H * (size_t)R * sizeof *pos);
    kv_status s = KV_OK;
    if (!m || !keep || !pos) {
        s = KV_ERR(KV_ENOMEM, "runtime: out of memory selecting tokens");
        goto done;
    }
    while (n - ps->sel_end >= R) {
        const int c0 = ps->sel_end;
        const double allow = rt->budget[layer] * (double)R * (double)hd * 4.0;
        const int k = rows_for_budget(rt, layer, allow, 0, R, INDEX_BYTES);
        for (int h = 0; h < H; h++) {
            const float *sc = ps->acc + (size_t)h * (size_t)ps->acc_cap + (c0 - ps->acc_base);
            if ((s = top_k(keep, sc, R, k)) != KV_OK) goto done;
            for (int i = 0; i < k; i++) pos[(size_t)h * (size_t)R + (size_t)i] = c0 + keep[i];
            m[h] = k;
        }
        if (k > 0 && (s = encode_kept(rt, seq, layer, m, pos, R, c0)) != KV_OK) goto done;
        for (int st = 0; st < 2; st++) {
            rt_stream *sp = rt_stream_of(rt, seq, layer, st);
            if ((s = kv_rti_window_drop(rt, seq, sp, R)) != KV_OK) goto done;
            sp->comp_end = c0 + R;
        }
        ps->sel_end = c0 + R;
        /* the scores of the chunk are spent */
        for (int h = 0; h < H; h++) {
            float *a = ps->acc + (size_t)h * (size_t)ps->acc_cap;
            memmove(a, a + R, (size_t)(ps->acc_n - R) * sizeof(float));
        }
        ps->acc_base += R;
        ps->acc_n -= R;
    }
done:
    free(m), free(keep), free(pos);
    return s;
}

/* ---- one prefill, several plans ----------------------------------------------------------------------- */
kv_status kv_rt_prompt_copy(kv_rt *dst, int dst_seq, const kv_rt *src, int src_seq) {
    if (!dst || !src || dst == src || dst_seq < 0 || dst_seq >= dst->opt.n_seqs || src_seq < 0 ||
        src_seq >= src->opt.n_seqs)
        return KV_ERR(KV_EINVAL, "kv_rt_prompt_copy: bad arguments");
    if (dst->dv || src->dv)
        return KV_ERR(KV_EUNSUPPORTED, "kv_rt_prompt_copy: runtimes on a device (%s) do not copy prompts",
                      dst->dv ? "destination" : "source");
    if (dst->n_layers != src->n_layers || dst->n_kv_heads != src->n_kv_heads || dst->head_dim != src->head_dim ||
        dst->n_heads != src->n_heads)
        return KV_ERR(KV_EINVAL, "kv_rt_prompt_copy: the runtimes are for different model shapes");
    if (dst->sinks != src->sinks)
        return KV_ERR(KV_EINVAL, "kv_rt_prompt_copy: %d sinks in the source, %d in the destination", src->sinks, dst->sinks);
    for (int l = 0; l < dst->n_layers; l++)
        if (rt_codec_of(dst, l, KV_PLAN_K)->pre_rope != rt_codec_of(src, l, KV_PLAN_K)->pre_rope)
            return KV_ERR(KV_EINVAL, "kv_rt_prompt_copy: layer %d holds keys %s RoPE in the source and %s in the "
                          "destination", l, rt_codec_of(src, l, KV_PLAN_K)->pre_rope ? "before" : "after",
                          rt_codec_of(dst, l, KV_PLAN_K)->pre_rope ? "before" : "after");
    const rt_seq *ss = &src->seqs[src_seq];
    if (!ss->prompt_open || !src->hold_prompt)
        return KV_ERR(KV_EINVAL, "kv_rt_prompt_copy: the source sequence holds no open prompt in f16 (open the source "
                      "with a pruning plan or kv_rt_options.prompt_stats, and copy before kv_rt_end_prompt)");
    if (!dst->hold_prompt)
        return KV_ERR(KV_EINVAL, "kv_rt_prompt_copy: the destination's plan prunes nothing and would have compressed "
                      "the prompt as it was appended: a copy of an f16 prompt is not what it would hold");
    const int accumulate = dst->policy->score == RT_SCORE_ACCUMULATED || dst->opt.prompt_stats;
    if (accumulate && !src->collect_acc)
        return KV_ERR(KV_EINVAL, "kv_rt_prompt_copy: the destination (%s) needs the attention accumulated over the "
                      "prompt, which the source did not collect", dst->policy->name);
    if (dst->wq_rows > 0 && dst->wq_rows > src->wq_rows)
        return KV_ERR(KV_EINVAL, "kv_rt_prompt_copy: the destination needs the prompt's last %d queries, the source "
                      "kept %d", dst->wq_rows, src->wq_rows);
    kv_rt_reset(dst, dst_seq);
    rt_seq *ds = &dst->seqs[dst_seq];
    kv_status s = KV_OK;
    const size_t kvd = (size_t)dst->kv_dim, H = (size_t)dst->n_kv_heads;
    const size_t qd = (size_t)dst->n_heads * (size_t)dst->head_dim;
    /* open before reserving: a prompt_stats destination accumulates (and reserves) only while its
     * prompt is open (with it set afterwards, its scores were never allocated and the copy wrote
     * through NULL) */
    ds->prompt_open = 1;
    for (int l = 0; l < dst->n_layers; l++) {
        const int n = ss->layer_n[l];
        for (int st = 0; st < 2; st++) {
            const rt_stream *a = &ss->st[l * 2 + st];
            rt_stream *b = &ds->st[l * 2 + st];
            if (a->n_blocks || a->comp_end != src->sinks)
                return KV_ERR(KV_EINVAL, "kv_rt_prompt_copy: layer %d of the source compressed tokens", l);
            if ((s = kv_rti_fp_resize(dst, ds, b, a->fp_rows)) != KV_OK) goto fail;
            if (a->fp_rows) memcpy(b->fp, a->fp, (size_t)a->fp_rows * kvd * sizeof(uint16_t));
        }
        ds->layer_n[l] = n;
        const rt_pstate *pa = &ss->ps[l];
        rt_pstate *pb = &ds->ps[l];
        pb->q_seen = pa->q_seen;
        if (accumulate) {
            if ((s = kv_rti_policy_reserve(dst, dst_seq, l, n)) != KV_OK) goto fail;
            for (size_t h = 0; h < H && pa->acc_n > 0; h++)
                memcpy(pb->acc + h * (size_t)pb->acc_cap, pa->acc + h * (size_t)pa->acc_cap, (size_t)pa->acc_n * sizeof(float));
        }
        if (dst->wq_rows > 0 && pa->wq_n > 0) {
            const int rows = pa->wq_n < dst->wq_rows ? pa->wq_n : dst->wq_rows;
            if (!(pb->wq = malloc((size_t)dst->wq_rows * qd * sizeof(float)))) {
                s = KV_ERR(KV_ENOMEM, "runtime: out of memory for window queries");
                goto fail;
            }
            memcpy(pb->wq, pa->wq + (size_t)(pa->wq_n - rows) * qd, (size_t)rows * qd * sizeof(float));
            pb->wq_n = rows;
            pb->wq_end = pa->wq_end;
        }
    }
    if ((s = kv_rti_squat_prompt_copy(dst, dst_seq, src, src_seq)) != KV_OK) goto fail;
    return KV_OK;
fail:
    kv_rt_reset(dst, dst_seq);
    return s;
}
