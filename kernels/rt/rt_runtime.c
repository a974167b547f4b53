/* rt_runtime.c — the engine-facing runtime (kvrt.h "engine-facing runtime", RUNTIME.md): open a plan,
 * hold sequences, append tokens (compressing what the cache semantics say), report what is held.
 * Attention is in kv_rti_attend.c, the codecs in rt_codec.c and the per-method kernel files. */
#include "kvrt.h"
#include "rt_dev.h"
#include "rt_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static const char *sname(int stream) { return stream == KV_PLAN_K ? "K" : "V"; }

/* ---- sequences ----------------------------------------------------------------------------------- */
static void stream_clear(kv_rt *rt, rt_seq *sq, rt_stream *st) {
    if (rt->dv) { /* blocks live in the sequence's arena (kv_rti_dev_seq_clear) */
        rt->dv->dev->ops->free(rt->dv->dev, st->fp);
        rt->dv->dev->ops->free(rt->dv->dev, st->dtab);
    } else {
        for (int b = 0; b < st->n_blocks; b++) free(st->blocks[b].data);
        free(st->fp);
    }
    free(st->blocks);
    rt_hstore *heads = st->heads;
    for (int h = 0; heads && h < rt->n_kv_heads; h++) kv_rti_hstore_clear(&heads[h]);
    memset(st, 0, sizeof *st);
    st->comp_end = rt->sinks;
    st->heads = heads; /* the per-head stores stay (empty) for the next sequence */
    (void)sq;
}

static void seq_clear(kv_rt *rt, rt_seq *sq) {
    for (int i = 0; i < rt->n_layers * 2; i++) {
        stream_clear(rt, sq, &sq->st[i]);
        kv_rti_recon_free(rt, &sq->recon[i]);
    }
    if (rt->dv) kv_rti_dev_seq_clear(rt, sq);
    memset(sq->layer_n, 0, (size_t)rt->n_layers * sizeof(int));
    memset(sq->ev, 0, (size_t)rt->n_layers * sizeof(int));
    kv_rti_policy_seq_clear(rt, sq);
    kv_rti_squat_seq_clear(rt, sq);
    sq->allocated = 0;
    sq->overhead = 0;
}

/* Resize a stream's f16 rows to exactly `rows` (the allocation is the accounted size). */
kv_status kv_rti_fp_resize(kv_rt *rt, rt_seq *sq, rt_stream *st, int rows) {
    const size_t row_bytes = (size_t)rt->kv_dim * 2u;
    if (rows == st->fp_rows) return KV_OK;
    if (rt->dv) return kv_rti_dev_fp_resize(rt, sq, st, rows);
    if (rows == 0) {
        free(st->fp);
        st->fp = NULL;
    } else {
        uint16_t *p = realloc(st->fp, (size_t)rows * row_bytes);
        if (!p) return KV_ERR(KV_ENOMEM, "runtime: out of memory for %d f16 tokens", rows);
        st->fp = p;
    }
    sq->allocated = sq->allocated - (uint64_t)st->fp_rows * row_bytes + (uint64_t)rows * row_bytes;
    st->fp_rows = rows;
    return KV_OK;
}

kv_status kv_rti_block_push(kv_rt *rt, rt_seq *sq, rt_stream *st, int t0, int m, uint8_t *data, size_t bytes,
                        const uint32_t *codes) {
    (void)rt;
    if (st->n_blocks == st->cap_blocks) {
        const int cap = st->cap_blocks ? st->cap_blocks * 2 : 16;
        rt_block *b = realloc(st->blocks, (size_t)cap * sizeof *b);
        if (!b) return KV_ERR(KV_ENOMEM, "runtime: out of memory for block descriptors");
        const uint64_t grow = (uint64_t)(cap - st->cap_blocks) * sizeof *b;
        sq->allocated += grow;
        sq->overhead += grow;
        st->blocks = b;
        st->cap_blocks = cap;
    }
    st->blocks[st->n_blocks++] = (rt_block){t0, m, data, codes};
    sq->allocated += bytes;
    return KV_OK;
}

/* ---- compression ----------------------------------------------------------------------------------- */
/* Compress window tokens [comp_end, comp_end + m) of (layer, stream) into one block; their f16 rows
 * start at fp row `row` (the caller drops them from the window afterwards). x, pred: m x kv_dim. */
static kv_status compress_chunk(kv_rt *rt, int seq, int layer, int stream, int row, int m, float *x, float *pred) {
    if (rt->dv) return kv_rti_dev_compress(rt, seq, layer, stream, row, m, x, pred);
    rt_seq *sq = &rt->seqs[seq];
    rt_stream *st = rt_stream_of(rt, seq, layer, stream);
    const rt_codec *c = rt_codec_of(rt, layer, stream);
    const size_t kvd = (size_t)rt->kv_dim, n = (size_t)m * kvd;
    const int t0 = st->comp_end;
    kv_rti_f16_to_f32_row(x, st->fp + (size_t)row * kvd, n);
    kv_status s;
    if (c->pred) {
        const float *inputs[KV_PLAN_MAX_PRED_INPUTS];
        for (int i = 0; i < c->pred->n_inputs; i++) {
            const rt_stream *in = rt_stream_of(rt, seq, c->pred->inputs[i].layer, c->pred->inputs[i].stream);
            if (in->comp_end < t0 + m)
                return KV_ERR(KV_EINVAL, "runtime: layer %d %s predicts from layer %d %s, which has not compressed "
                              "tokens %d..%d yet (layers must be appended in order)", layer, sname(stream),
                              c->pred->inputs[i].layer, sname(c->pred->inputs[i].stream), t0, t0 + m - 1);
        }
        if ((s = kv_rti_recon_inputs(rt, seq, layer, stream, t0, inputs)) != KV_OK) return s;
        if ((s = kv_predictor_apply(pred, c->pred, inputs, (size_t)m, rt->kv_dim)) != KV_OK) return s;
        for (size_t i = 0; i < n; i++) x[i] = x[i] - pred[i];
    }
    /* XQuant: the layer it shares with compressed the same chunk already (layers go in order) */
    const uint32_t *shared = NULL;
    if (c->share_from >= 0) {
        const rt_stream *o = rt_stream_of(rt, seq, c->share_from, stream);
        for (int b = o->n_blocks - 1; b >= 0 && !shared; b--)
            if (o->blocks[b].t0 == t0 && o->blocks[b].m == m) shared = o->blocks[b].codes;
        if (!shared)
            return KV_ERR(KV_EINVAL, "runtime: layer %d %s shares the codes of layer %d, which has not compressed tokens "
                          "%d..%d yet (layers must be appended in order)", layer, sname(stream), c->share_from, t0,
                          t0 + m - 1);
    }
    rt_layout L;
    kv_rti_codec_layout(c, m, &L);
    uint8_t *data = malloc(L.total ? L.total : 1);
    if (!data) return KV_ERR(KV_ENOMEM, "runtime: out of memory for a block of %d tokens", m);
    s = c->squat ? kv_rti_squat_encode(rt, seq, layer, data, m, x) : kv_rti_codec_encode(c, data, m, x);
    if (s != KV_OK) {
        free(data);
        return kv_error_wrap(s, "layer %d %s, tokens %d..%d: ", layer, sname(stream), t0, t0 + m - 1);
    }
    if ((s = kv_rti_block_push(rt, sq, st, t0, m, data, L.total, shared ? shared : (const uint32_t *)data)) != KV_OK) {
        free(data);
        return s;
    }
    st->comp_end = t0 + m;
    return KV_OK;
}

/* Drop the first m window rows (compressed now) from the f16 rows. */
kv_status kv_rti_window_drop(kv_rt *rt, int seq, rt_stream *st, int m) {
    if (m == 0) return KV_OK;
    if (rt->dv) return kv_rti_dev_window_drop(rt, &rt->seqs[seq], st, m);
    const size_t kvd = (size_t)rt->kv_dim;
    const int win0 = kv_rti_fp_window0(rt, seq, st), rows_after = st->fp_rows - m;
    memmove(st->fp + (size_t)win0 * kvd, st->fp + (size_t)(win0 + m) * kvd,
            (size_t)(rows_after - win0) * kvd * sizeof(uint16_t));
    return kv_rti_fp_resize(rt, &rt->seqs[seq], st, rows_after);
}

/* The f16 row where a stream's window starts: after the sinks, or 0 once a windowed layer dropped them. */
int kv_rti_fp_window0(const kv_rt *rt, int seq, const rt_stream *st) {
    const rt_seq *sq = &rt->seqs[seq];
    const int i = (int)(st - sq->st);
    return sq->ev[i / 2] > 0 ? 0 : rt->sinks;
}

/* ---- attention windows (RUNTIME.md §11) ------------------------------------------------------------------ */
/* The first position a stream must keep for queries from position lo's window on: what lies before the piece
 * (sinks, block, window rows) that holds lo can go. */
static int window_keep_from(const kv_rt *rt, int seq, const rt_stream *st, int lo) {
    if (lo <= 0 || (rt->seqs[seq].ev[(int)(st - rt->seqs[seq].st) / 2] == 0 && lo < rt->sinks)) return 0;
    if (lo >= st->comp_end) return lo;
    for (int b = 0; b < st->n_blocks; b++)
        if (lo < st->blocks[b].t0 + st->blocks[b].m) return st->blocks[b].t0;
    return lo;
}

/* Drop what stream `st` of layer holds before position ev (>= the layer's current first position): the sinks,
 * the whole blocks before it, and window rows before it (comp_end moves up to ev then). */
static kv_status window_evict_stream(kv_rt *rt, int seq, int layer, rt_stream *st, int ev) {
    rt_seq *sq = &rt->seqs[seq];
    const size_t kvd = (size_t)rt->kv_dim;
    kv_status s = KV_OK;
    if (sq->ev[layer] == 0 && ev > 0) { /* the sinks leave (no window keeps them) */
        const int sk = rt_sinks_held(rt, sq->layer_n[layer]);
        if (sk > 0) {
            memmove(st->fp, st->fp + (size_t)sk * kvd, (size_t)(st->fp_rows - sk) * kvd * sizeof(uint16_t));
            if ((s = kv_rti_fp_resize(rt, sq, st, st->fp_rows - sk)) != KV_OK) return s;
        }
    }
    int nb = 0;
    while (nb < st->n_blocks && st->blocks[nb].t0 + st->blocks[nb].m <= ev) {
        rt_layout L;
        kv_rti_codec_layout(rt_codec_of(rt, layer, (int)(st - sq->st) % 2), st->blocks[nb].m, &L);
        free(st->blocks[nb].data);
        sq->allocated -= L.total;
        nb++;
    }
    if (nb > 0) {
        memmove(st->blocks, st->blocks + nb, (size_t)(st->n_blocks - nb) * sizeof *st->blocks);
        st->n_blocks -= nb;
    }
    if (ev > st->comp_end) { /* window rows that left the window before they were compressed */
        const int m = ev - st->comp_end, fp0 = 0; /* the sinks are gone by now */
        memmove(st->fp + (size_t)fp0 * kvd, st->fp + (size_t)(fp0 + m) * kvd,
                (size_t)(st->fp_rows - fp0 - m) * kvd * sizeof(uint16_t));
        if ((s = kv_rti_fp_resize(rt, sq, st, st->fp_rows - m)) != KV_OK) return s;
        st->comp_end = ev;
    }
    return KV_OK;
}

/* Before tokens from position `have` join a windowed layer: the first of them sees positions have - W + 1 on,
 * later ones less, so what lies before that piece boundary is dropped, from both streams alike (a row is one
 * position in K and V). */
static kv_status window_evict(kv_rt *rt, int seq, int layer) {
    rt_seq *sq = &rt->seqs[seq];
    const int lo = sq->layer_n[layer] - rt->win[layer] + 1;
    int ev = INT32_MAX;
    for (int stream = 0; stream < 2; stream++) {
        const int k = window_keep_from(rt, seq, rt_stream_of(rt, seq, layer, stream), lo);
        ev = k < ev ? k : ev;
    }
    if (ev <= sq->ev[layer]) return KV_OK;
    for (int stream = 0; stream < 2; stream++) {
        const kv_status s = window_evict_stream(rt, seq, layer, rt_stream_of(rt, seq, layer, stream), ev);
        if (s != KV_OK) return s;
    }
    sq->ev[layer] = ev;
    return KV_OK;
}

/* Bring one stream's window to what the semantics allow before new tokens arrive. */
static kv_status settle_stream(kv_rt *rt, int seq, int layer, int stream, float *x, float *pred) {
    rt_stream *st = rt_stream_of(rt, seq, layer, stream);
    const rt_codec *c = rt_codec_of(rt, layer, stream);
    const int n = rt->seqs[seq].layer_n[layer];
    const int window = n > st->comp_end ? n - st->comp_end : 0, win0 = kv_rti_fp_window0(rt, seq, st);
    kv_status s = KV_OK;
    int done = 0; /* window rows compressed */
    if (c->rpc_ratio > 0.0f) { /* KVmix: keep floor(rpc * current_RPC) of the window */
        const int keep = (int)((double)c->rpc_ratio * window);
        int m = window - keep;
        m -= m % c->granule;
        if (m > 0 && (s = compress_chunk(rt, seq, layer, stream, win0, m, x, pred)) == KV_OK) done = m;
    } else {
        for (; window - done >= rt->recent; done += rt->recent)
            if ((s = compress_chunk(rt, seq, layer, stream, win0 + done, rt->recent, x, pred)) != KV_OK) break;
    }
    const kv_status s2 = kv_rti_window_drop(rt, seq, st, done);
    return s != KV_OK ? s : s2;
}

/* Tokens a settle of this stream may compress at once (scratch rows). */
static int settle_rows(const kv_rt *rt, int seq, int layer, int stream) {
    const rt_stream *st = &rt->seqs[seq].st[layer * 2 + stream];
    const int n = rt->seqs[seq].layer_n[layer];
    const int window = n > st->comp_end ? n - st->comp_end : 0;
    return rt_codec_of(rt, layer, stream)->rpc_ratio > 0.0f ? window : rt->recent;
}

/* What an append does before its tokens join: the checks, the prompt's state, and the compression the cache
 * semantics ask for (K before V: a V predictor may read this layer's reconstructed K; nothing while a prompt
 * that will be pruned is open). */
static kv_status append_begin(kv_rt *rt, int layer, int seq, int n, const int32_t *pos, const float *k_pre) {
    rt_seq *sq = &rt->seqs[seq];
    const int have = sq->layer_n[layer];
    for (int i = 0; pos && i < n; i++)
        if (pos[i] != have + i)
            return KV_ERR(KV_EINVAL, "kv_rt_append: layer %d seq %d holds %d tokens, token %d comes at position %d",
                          layer, seq, have, i, (int)pos[i]);
    if (rt->opt.capacity > 0 && have + n > rt->opt.capacity)
        return KV_ERR(KV_EINVAL, "kv_rt_append: sequence %d would hold %d tokens, the runtime was opened for %d",
                      seq, have + n, rt->opt.capacity);
    if (have > INT32_MAX - n) return KV_ERR(KV_EINVAL, "kv_rt_append: too many tokens");
    const int any_pre = rt_codec_of(rt, layer, KV_PLAN_K)->pre_rope;
    if (any_pre && !k_pre) return KV_ERR(KV_EINVAL, "kv_rt_append: layer %d stores keys before RoPE: k_pre needed", layer);
    kv_status s = KV_OK;
    /* a single token after an open prompt is decoding: the prompt ended (RUNTIME.md §8) */
    if (n == 1 && layer == 0 && sq->prompt_open && have > 0 && (s = kv_rt_end_prompt(rt, seq)) != KV_OK) return s;
    if (n > 0 && !sq->prompt_ended) sq->prompt_open = 1;
    if ((s = kv_rti_policy_reserve(rt, seq, layer, have + n)) != KV_OK) return s;
    if (n > 0 && rt->evicts[layer] && (s = window_evict(rt, seq, layer)) != KV_OK) return s;
    const int hold = sq->prompt_open && rt->hold_prompt && kv_rti_policy_holds(rt, layer);
    int rows = hold ? 0 : settle_rows(rt, seq, layer, 0);
    const int rv = hold ? 0 : settle_rows(rt, seq, layer, 1);
    rows = rows > rv ? rows : rv;
    if (rows == 0) return KV_OK;
    float *x = NULL, *pred = NULL;
    if (rt->dv) {
        if ((s = kv_rti_dev_scratch(rt, rows, &x, &pred)) != KV_OK) return s;
    } else {
        x = kv_aligned_alloc(64, (size_t)rows * (size_t)rt->kv_dim * sizeof(float));
        pred = kv_aligned_alloc(64, (size_t)rows * (size_t)rt->kv_dim * sizeof(float));
        if (!x || !pred) {
            s = KV_ERR(KV_ENOMEM, "runtime: out of memory compressing %d tokens", rows);
            goto done;
        }
    }
    int handled = 0;
    if (!hold && (s = kv_rti_policy_settle(rt, seq, layer, &handled, x)) != KV_OK) goto done;
    for (int stream = 0; stream < 2 && !hold && !handled; stream++)
        if ((s = settle_stream(rt, seq, layer, stream, x, pred)) != KV_OK) goto done;
done:
    if (!rt->dv) {
        kv_aligned_free(x);
        kv_aligned_free(pred);
    }
    return s;
}

/* The new tokens join the f16 rows (sinks first, then the window): CPU runtimes. */
static kv_status append_rows(kv_rt *rt, int layer, int seq, int n, const float *k_pre, const float *k, const float *v,
                             size_t ld) {
    rt_seq *sq = &rt->seqs[seq];
    for (int stream = 0; stream < 2; stream++) {
        rt_stream *st = rt_stream_of(rt, seq, layer, stream);
        const int r0 = st->fp_rows;
        kv_status s = kv_rti_fp_resize(rt, sq, st, r0 + n);
        if (s != KV_OK) return s;
        const float *src = stream == KV_PLAN_V ? v : (rt_codec_of(rt, layer, 0)->pre_rope ? k_pre : k);
        for (int i = 0; i < n; i++)
            kv_rti_f32_to_f16_row(st->fp + (size_t)(r0 + i) * (size_t)rt->kv_dim, src + (size_t)i * ld, (size_t)rt->kv_dim);
    }
    return KV_OK;
}

kv_status kv_rt_append(kv_rt *rt, int layer, int seq, int n, const int32_t *pos, const float *k_pre, const float *k,
                       const float *v, size_t ld) {
    if (!rt || layer < 0 || layer >= rt->n_layers || seq < 0 || seq >= rt->opt.n_seqs || n < 0 ||
        (n > 0 && (!pos || !k || !v)) || (n > 0 && ld < (size_t)rt->kv_dim))
        return KV_ERR(KV_EINVAL, "kv_rt_append: bad arguments (layer %d, seq %d, n %d)", layer, seq, n);
    kv_status s = append_begin(rt, layer, seq, n, pos, k_pre);
    if (s == KV_OK && n > 0)
        s = rt->dv ? kv_rti_dev_store(rt, layer, 1, &seq, n, k_pre, k, v, ld) : append_rows(rt, layer, seq, n, k_pre, k, v, ld);
    if (s == KV_OK) rt->seqs[seq].layer_n[layer] += n;
    return s;
}

/* The listed sequences, each once and in range. */
static kv_status check_batch(const kv_rt *rt, const char *fn, int layer, int n_seqs, const int *seqs) {
    if (layer < 0 || layer >= rt->n_layers || n_seqs < 1 || n_seqs > rt->opt.n_seqs || !seqs)
        return KV_ERR(KV_EINVAL, "%s: bad arguments (layer %d, %d sequences)", fn, layer, n_seqs);
    for (int i = 0; i < n_seqs; i++) {
        if (seqs[i] < 0 || seqs[i] >= rt->opt.n_seqs)
            return KV_ERR(KV_EINVAL, "%s: sequence %d out of range (0..%d)", fn, seqs[i], rt->opt.n_seqs - 1);
        for (int j = 0; j < i; j++)
            if (seqs[j] == seqs[i]) return KV_ERR(KV_EINVAL, "%s: sequence %d listed twice", fn, seqs[i]);
    }
    return KV_OK;
}

kv_status kv_rt_append_batch(kv_rt *rt, int layer, int n_seqs, const int *seqs, const float *k_pre, const float *k,
                             const float *v, size_t ld) {
    if (!rt || !k || !v || (rt && ld < (size_t)rt->kv_dim))
        return KV_ERR(KV_EINVAL, "kv_rt_append_batch: bad arguments");
    kv_status s = check_batch(rt, "kv_rt_append_batch", layer, n_seqs, seqs);
    for (int i = 0; s == KV_OK && i < n_seqs; i++) s = append_begin(rt, layer, seqs[i], 1, NULL, k_pre);
    if (s != KV_OK) return s;
    if (rt->dv) {
        s = kv_rti_dev_store(rt, layer, n_seqs, seqs, 1, k_pre, k, v, ld);
    } else {
        for (int i = 0; s == KV_OK && i < n_seqs; i++) {
            const size_t off = (size_t)i * ld;
            s = append_rows(rt, layer, seqs[i], 1, k_pre ? k_pre + off : NULL, k + off, v + off, ld);
        }
    }
    for (int i = 0; s == KV_OK && i < n_seqs; i++) rt->seqs[seqs[i]].layer_n[layer] += 1;
    return s;
}

static kv_status attend_checks(const kv_rt *rt, int layer, int seq, int n_q, size_t ldq, size_t ldo) {
    const int qd = rt->n_heads * rt->head_dim;
    if (ldq < (size_t)qd || ldo < (size_t)qd)
        return KV_ERR(KV_EINVAL, "kv_rt_attend: row strides %zu, %zu below %d", ldq, ldo, qd);
    if (n_q > rt->seqs[seq].layer_n[layer])
        return KV_ERR(KV_EINVAL, "kv_rt_attend: %d query rows but layer %d of sequence %d holds %d tokens", n_q, layer,
                      seq, rt->seqs[seq].layer_n[layer]);
    const int ev = rt->seqs[seq].ev[layer], first = rt->seqs[seq].layer_n[layer] - n_q;
    if (ev > 0 && first - rt->win[layer] + 1 < ev)
        return KV_ERR(KV_EINVAL, "kv_rt_attend: %d query rows, but layer %d of sequence %d dropped positions before %d, "
                      "which the window of %d of its row at position %d sees (the rows must be the step's own tokens)",
                      n_q, layer, seq, ev, rt->win[layer], first);
    const int whole = rt->seqs[seq].layer_n[layer] - rt->seqs[seq].ps[layer].sel_end;
    if (rt->seqs[seq].st[layer * 2].heads && rt->seqs[seq].ps[layer].sel_end > rt->sinks && n_q > whole)
        return KV_ERR(KV_EINVAL, "kv_rt_attend: %d query rows, but layer %d of sequence %d appended only %d tokens since "
                      "its prompt was pruned (the rows must be the step's own tokens)", n_q, layer, seq, whole);
    return KV_OK;
}

/* After an attend of (layer, seq): what the token policy and SQuat's prompt subspace record of its queries,
 * and the reconstructions no later layer reads. */
static kv_status attend_after(kv_rt *rt, int layer, int seq, int n_q, const float *q, size_t ldq) {
    kv_status s = kv_rti_policy_saw_queries(rt, seq, layer, n_q, q, ldq);
    if (s == KV_OK && rt->squat_prompt) {
        const float *hq = q;
        if (rt->dv) s = kv_rti_dev_host_queries(rt, n_q, q, ldq, &hq);
        if (s == KV_OK) s = kv_rti_squat_saw_queries(rt, seq, layer, n_q, hq, ldq);
    }
    kv_rti_recon_release(rt, seq, layer);
    return s;
}

kv_status kv_rt_attend(kv_rt *rt, int layer, int seq, int n_q, const float *q, size_t ldq, float *out, size_t ldo) {
    if (!rt || layer < 0 || layer >= rt->n_layers || seq < 0 || seq >= rt->opt.n_seqs || n_q < 1 || !q || !out)
        return KV_ERR(KV_EINVAL, "kv_rt_attend: bad arguments (layer %d, seq %d, %d rows)", layer, seq, n_q);
    kv_status s = attend_checks(rt, layer, seq, n_q, ldq, ldo);
    if (s != KV_OK) return s;
    s = rt->dv ? kv_rti_dev_attend(rt, layer, 1, &seq, n_q, &q, ldq, &out, ldo) : kv_rti_attend(rt, layer, seq, n_q, q, ldq, out, ldo);
    const kv_status s2 = attend_after(rt, layer, seq, n_q, q, ldq);
    return s != KV_OK ? s : s2;
}

kv_status kv_rt_attend_batch(kv_rt *rt, int layer, int n_seqs, const int *seqs, const float *q, size_t ldq, float *out,
                             size_t ldo) {
    if (!rt || !q || !out) return KV_ERR(KV_EINVAL, "kv_rt_attend_batch: bad arguments");
    kv_status s = check_batch(rt, "kv_rt_attend_batch", layer, n_seqs, seqs);
    for (int i = 0; s == KV_OK && i < n_seqs; i++) s = attend_checks(rt, layer, seqs[i], 1, ldq, ldo);
    if (s != KV_OK) return s;
    if (rt->dv) {
        const float **qs = malloc((size_t)n_seqs * sizeof *qs);
        float **outs = malloc((size_t)n_seqs * sizeof *outs);
        if (!qs || !outs) {
            free(qs), free(outs);
            return KV_ERR(KV_ENOMEM, "out of memory");
        }
        for (int i = 0; i < n_seqs; i++) qs[i] = q + (size_t)i * ldq, outs[i] = out + (size_t)i * ldo;
        s = kv_rti_dev_attend(rt, layer, n_seqs, seqs, 1, qs, ldq, outs, ldo);
        free(qs), free(outs);
    } else {
        for (int i = 0; s == KV_OK && i < n_seqs; i++)
            s = kv_rti_attend(rt, layer, seqs[i], 1, q + (size_t)i * ldq, ldq, out + (size_t)i * ldo, ldo);
    }
    for (int i = 0; i < n_seqs; i++) {
        const kv_status s2 = attend_after(rt, layer, seqs[i], 1, q + (size_t)i * ldq, ldq);
        if (s == KV_OK) s = s2;
    }
    return s;
}

int kv_rt_length(const kv_rt *rt, int seq) {
    if (!rt || seq < 0 || seq >= rt->opt.n_seqs) return -1;
    return rt->seqs[seq].layer_n[rt->n_layers - 1];
}

void kv_rt_reset(kv_rt *rt, int seq) {
    if (!rt) return;
    for (int q = 0; q < rt->opt.n_seqs; q++)
        if (seq < 0 || q == seq) seq_clear(rt, &rt->seqs[q]);
}

int kv_rt_sinks(const kv_rt *rt) { return rt ? rt->sinks : 0; }
int kv_rt_recent(const kv_rt *rt) { return rt ? rt->recent : 0; }

/* ---- statistics -------------------------------------------------------------------------------------- */
/* Sums over the (layer, stream) pairs that `only_layer`/`only_stream` select (-1: every one): one walk for
 * the whole cache (kv_rt_get_stats) and for one stream (kv_rt_get_stream_stats), so that the parts add up
 * to the total by construction. Per-layer working sets count with the layer's K stream. */
static void seq_stats(const kv_rt *rt, int seq, int only_layer, int only_stream, kv_rt_stats *o) {
    const rt_seq *sq = &rt->seqs[seq];
    const uint64_t kvd = (uint64_t)rt->kv_dim, hd = (uint64_t)rt->head_dim;
    o->tokens += (uint64_t)sq->layer_n[rt->n_layers - 1];
    for (int l = 0; l < rt->n_layers; l++) {
        if (only_layer >= 0 && l != only_layer) continue;
        const rt_pstate *ps = &sq->ps[l];
        if (only_stream <= 0) {
            o->working_bytes += (uint64_t)ps->acc_cap * (uint64_t)rt->n_kv_heads * sizeof(float);
            o->working_bytes += ps->wq ? (uint64_t)rt->wq_rows * (uint64_t)rt->n_heads * hd * sizeof(float) : 0u;
        }
        for (int stream = 0; stream < 2; stream++) {
            if (only_stream >= 0 && stream != only_stream) continue;
            const rt_stream *st = &sq->st[l * 2 + stream];
            const rt_codec *c = rt_codec_of(rt, l, stream);
            o->values_appended += (uint64_t)sq->layer_n[l] * kvd;
            for (int h = 0; h < rt->n_kv_heads; h++) o->values_total += (uint64_t)kv_rti_head_rows(rt, seq, l, h) * hd;
            if (st->heads) {
                uint64_t pay, idx, vals;
                kv_rti_hstore_bytes(rt, l, stream, st, &pay, &idx, &vals);
                o->payload_bytes += pay;
                o->index_bytes += idx;
                o->values_compressed += vals;
            }
            for (int b = 0; b < st->n_blocks; b++) {
                rt_layout L;
                kv_rti_codec_layout(c, st->blocks[b].m, &L);
                o->payload_bytes += L.total;
                o->values_compressed += (uint64_t)st->blocks[b].m * kvd;
            }
            o->fp_bytes += (uint64_t)st->fp_rows * kvd * 2u;
            const rt_recon *r = &sq->recon[l * 2 + stream];
            o->working_bytes += (uint64_t)r->cap * kvd * sizeof(float);
        }
    }
    if (only_layer < 0 && only_stream < 0) { /* per-sequence state: not one stream's */
        o->working_bytes += kv_rti_squat_working_bytes(rt, seq);
        o->allocated_bytes += sq->allocated;
        o->overhead_bytes += sq->overhead;
    }
    if (rt->dv && only_layer < 0 && only_stream < 0) {
        /* device memory is held in arena pages and f16 rows with room to grow: what is not accounted is overhead */
        uint64_t acc = 0;
        for (int i = 0; i < rt->n_layers * 2; i++) {
            const rt_stream *st = &sq->st[i];
            acc += (uint64_t)st->fp_rows * (uint64_t)rt->kv_dim * 2u;
            for (int b = 0; b < st->n_blocks; b++) {
                rt_layout L;
                kv_rti_codec_layout(&rt->codec[i], st->blocks[b].m, &L);
                acc += L.total;
            }
        }
        o->overhead_bytes += sq->allocated - acc - sq->overhead; /* sq->overhead (host descriptors) counted above */
    }
}

/* bits per value from the byte counts (the one formula of kv_rt_get_stats and kv_rt_get_stream_stats) */
static void stats_finish(kv_rt_stats *out) {
    out->accounted_bytes = out->payload_bytes + out->index_bytes + out->fp_bytes;
    out->bits_per_value = out->values_compressed
                              ? 8.0 * (double)(out->payload_bytes + out->index_bytes) / (double)out->values_compressed
                              : 0.0;
    out->bits_per_value_total =
        out->values_total
            ? 8.0 * (double)(out->accounted_bytes + out->predictor_bytes + out->basis_bytes) / (double)out->values_total
            : 0.0;
}

kv_status kv_rt_get_stats(const kv_rt *rt, int seq, kv_rt_stats *out) {
    if (!rt || !out || seq >= rt->opt.n_seqs) return KV_ERR(KV_EINVAL, "kv_rt_get_stats: bad arguments");
    memset(out, 0, sizeof *out);
    for (int q = 0; q < rt->opt.n_seqs; q++)
        if (seq < 0 || q == seq) seq_stats(rt, q, -1, -1, out);
    out->predictor_bytes = kv_plan_predictor_bytes(rt->plan);
    out->basis_bytes = kv_plan_basis_bytes(rt->plan);
    out->working_bytes += (uint64_t)rt->rope_n * (uint64_t)rt->head_dim * sizeof(float) * (rt->inv_freq_local ? 2u : 1u);
    stats_finish(out);
    return KV_OK;
}

kv_status kv_rt_get_stream_stats(const kv_rt *rt, int seq, int layer, int stream, kv_rt_stats *out) {
    if (!rt || !out || seq >= rt->opt.n_seqs || layer < 0 || layer >= rt->n_layers || stream < 0 || stream > 1)
        return KV_ERR(KV_EINVAL, "kv_rt_get_stream_stats: bad arguments (layer %d, stream %d)", layer, stream);
    memset(out, 0, sizeof *out);
    for (int q = 0; q < rt->opt.n_seqs; q++)
        if (seq < 0 || q == seq) seq_stats(rt, q, layer, stream, out);
    out->predictor_bytes = kv_plan_stream_predictor_bytes(rt->plan, layer, stream);
    out->basis_bytes = kv_plan_stream_basis_bytes(rt->plan, layer, stream);
    stats_finish(out);
    return KV_OK;
}

/* ---- decoded view (tests, tools) ----------------------------------------------------------------------- */
kv_status kv_rt_decode_head(kv_rt *rt, int layer, int seq, int kv_head, float *k_out, float *v_out) {
    if (!rt || layer < 0 || layer >= rt->n_layers || seq < 0 || seq >= rt->opt.n_seqs || kv_head < 0 ||
        kv_head >= rt->n_kv_heads || !k_out || !v_out)
        return KV_ERR(KV_EINVAL, "kv_rt_decode_head: bad arguments");
    if (rt->dv) return kv_rti_dev_decode_head(rt, layer, seq, kv_head, k_out, v_out);
    const int n = kv_rti_head_rows(rt, seq, layer, kv_head);
    kv_status s;
    for (int stream = 0; stream < 2; stream++)
        if ((s = kv_rti_read_rows(rt, seq, layer, stream, kv_head, 0, n, stream ? v_out : k_out, (size_t)rt->head_dim)) !=
            KV_OK)
            return s;
    return KV_OK;
}

int kv_rt_held(const kv_rt *rt, int layer, int seq, int kv_head) {
    if (!rt || layer < 0 || layer >= rt->n_layers || seq < 0 || seq >= rt->opt.n_seqs || kv_head < 0 ||
        kv_head >= rt->n_kv_heads)
        return -1;
    return kv_rti_head_rows(rt, seq, layer, kv_head);
}

kv_status kv_rt_held_positions(const kv_rt *rt, int layer, int seq, int kv_head, int32_t *pos) {
    const int n = kv_rt_held(rt, layer, seq, kv_head);
    if (n < 0 || (!pos && n > 0)) return KV_ERR(KV_EINVAL, "kv_rt_held_positions: bad arguments");
    rt_piece p;
    for (int v = 0; v < n; v = p.b) {
        kv_rti_piece_at(rt, seq, layer, KV_PLAN_K, kv_head, v, n, &p);
        for (int r = 0; r < p.b - p.a; r++) pos[v + r] = p.pos ? p.pos[r] : p.p0 + r;
    }
    return KV_OK;
}

/* ---- open / close ------------------------------------------------------------------------------------- */
void kv_rt_close(kv_rt *rt) {
    if (!rt) return;
    if (rt->seqs) {
        for (int q = 0; q < rt->opt.n_seqs; q++) {
            rt_seq *sq = &rt->seqs[q];
            if (sq->st) seq_clear(rt, sq);
            for (int i = 0; sq->st && i < rt->n_layers * 2; i++) free(sq->st[i].heads);
            kv_rti_squat_seq_free(rt, sq);
            free(sq->arena);
            free(sq->ps);
            free(sq->st);
            free(sq->recon);
            free(sq->layer_n);
            free(sq->ev);
        }
    }
    kv_rti_policy_close(rt);
    if (rt->codec)
        for (int i = 0; i < rt->n_layers * 2; i++) kv_rti_codec_free(&rt->codec[i]);
    if (rt->search)
        for (int g = 0; g < rt->plan->n_grids; g++) kv_grid_search_free(rt->search[g]);
    if (rt->scratch)
        for (int t = 0; t < rt->n_threads; t++) kv_aligned_free(rt->scratch[t].buf);
    if (rt->own_pool) kv_pool_free(rt->pool);
    free(rt->scratch);
    free(rt->search);
    free(rt->codec);
    free(rt->seqs);
    free(rt->inv_freq);
    free(rt->inv_freq_local);
    free(rt->rope_cos);
    free(rt->rope_sin);
    free(rt->rope_cos_local);
    free(rt->rope_sin_local);
    free(rt->recon_last_use);
    free(rt->win);
    free(rt->evicts);
    kv_rti_dev_close(rt);
    free(rt);
}

static kv_status check_plan(const kv_plan *p, const kv_rt_options *o) {
    const kv_plan_fingerprint *fp = &p->fingerprint;
    if (p->n_layers != fp->n_layers || fp->n_layers < 1 || fp->n_kv_heads < 1 || fp->head_dim < 1)
        return KV_ERR(KV_EFORMAT, "runtime: the plan's shape (%d layers, %d KV heads x %d) is not usable",
                      p->n_layers, fp->n_kv_heads, fp->head_dim);
    if (fp->head_dim > KV_RT_MAX_HEAD_DIM)
        return KV_ERR(KV_EUNSUPPORTED, "runtime: head_dim %d (at most %d)", fp->head_dim, KV_RT_MAX_HEAD_DIM);
    if (o->n_heads < fp->n_kv_heads || o->n_heads % fp->n_kv_heads)
        return KV_ERR(KV_EINVAL, "runtime: %d query heads is not a multiple of the plan's %d KV heads", o->n_heads,
                      fp->n_kv_heads);
    if (o->n_heads / fp->n_kv_heads * RT_DIRECT_MAX_ROWS > RT_MAX_QV)
        return KV_ERR(KV_EUNSUPPORTED, "runtime: %d query heads per KV head (at most %d)", o->n_heads / fp->n_kv_heads,
                      RT_MAX_QV / RT_DIRECT_MAX_ROWS);
    if (p->global.recent < 1 || p->global.sinks < 0)
        return KV_ERR(KV_EFORMAT, "plan: recent buffer %d / sinks %d", p->global.recent, p->global.sinks);
    return KV_OK;
}

/* The layers' attention windows (RUNTIME.md §11), after the codecs and the policy. A windowed layer drops what left
 * its window unless another stream still reads its tokens (it is a predictor's input or has one, or shares codes
 * either way): those are masked only. On a device every windowed layer is masked only (RUNTIME.md §10.8): its
 * blocks live in the sequence's shared arena and its kernel addresses rows by position from 0. */
static kv_status window_open(kv_rt *rt) {
    const kv_plan *p = rt->plan;
    const int L = rt->n_layers;
    rt->win = calloc((size_t)L, sizeof(int));
    rt->evicts = calloc((size_t)L, sizeof(int));
    if (!rt->win || !rt->evicts) return KV_ERR(KV_ENOMEM, "out of memory for a runtime");
    for (int l = 0; l < L; l++) {
        rt->win[l] = p->layers[l].window;
        rt->evicts[l] = rt->win[l] > 0 && rt->opt.device == KV_RT_DEVICE_CPU;
        rt->any_window |= rt->win[l] > 0;
    }
    if (!rt->any_window) return KV_OK;
    if (rt->opt.prompt_stats)
        return KV_ERR(KV_EUNSUPPORTED, "runtime: the plan has attention windows (layer windows, plan 1.5), which prompt "
                      "statistics do not take yet");
    for (int l = 0; l < L && rt->policy->score != RT_SCORE_NONE; l++) /* token pruning: the layers without a window */
        if (rt->win[l] > 0 && p->layers[l].prune_budget > 0.0f)
            return KV_ERR(KV_EINVAL, "plan layer %d: a token-pruning budget (%g) on a layer with an attention window of "
                          "%d tokens, which the policy does not prune (it holds its window)", l,
                          (double)p->layers[l].prune_budget, rt->win[l]);
    for (int i = 0; i < L * 2; i++) {
        const rt_codec *c = &rt->codec[i];
        if (c->pred) {
            rt->evicts[i / 2] = 0;
            for (int k = 0; k < c->pred->n_inputs; k++) rt->evicts[c->pred->inputs[k].layer] = 0;
        }
        if (c->share_from >= 0) rt->evicts[i / 2] = rt->evicts[c->share_from] = 0;
    }
    return KV_OK;
}

kv_status kv_rt_open(kv_rt **out, const kv_plan *plan, const kv_rt_options *opt) {
    if (!out) return KV_ERR(KV_EINVAL, "kv_rt_open: NULL output");
    *out = NULL;
    if (!plan || !opt) return KV_ERR(KV_EINVAL, "kv_rt_open: NULL plan or options");
    if (opt->device != KV_RT_DEVICE_CPU && opt->device != KV_RT_DEVICE_CUDA && opt->device != KV_RT_DEVICE_CUDA_MODEL)
        return KV_ERR(KV_EINVAL, "runtime: unknown device %d", (int)opt->device);
    if (opt->n_seqs < 1 || opt->n_seqs > 4096) return KV_ERR(KV_EINVAL, "runtime: %d sequences (1..4096)", opt->n_seqs);
    if (opt->capacity < 0 || opt->n_threads < 0 || !(opt->scale >= 0.0f) || !isfinite(opt->scale))
        return KV_ERR(KV_EINVAL, "runtime: bad capacity %d / threads %d / scale %g", opt->capacity, opt->n_threads,
                      (double)opt->scale);
    kv_status s = check_plan(plan, opt);
    if (s == KV_OK) s = kv_rti_policy_check(plan);
    if (s != KV_OK) return s;
    if (opt->prompt_stats < 0 || opt->prompt_stats > 1 || opt->prompt_window < 0 || opt->prompt_window > (1 << 20))
        return KV_ERR(KV_EINVAL, "runtime: prompt_stats %d (0 or 1) / prompt_window %d", opt->prompt_stats,
                      opt->prompt_window);
    kv_rt *rt = calloc(1, sizeof *rt);
    if (!rt) return KV_ERR(KV_ENOMEM, "out of memory for a runtime");
    const kv_plan_fingerprint *fp = &plan->fingerprint;
    rt->plan = plan;
    rt->opt = *opt;
    rt->opt.rope_inv_freq = NULL;
    rt->opt.rope_inv_freq_local = NULL;
    rt->n_layers = fp->n_layers;
    rt->n_kv_heads = fp->n_kv_heads;
    rt->head_dim = fp->head_dim;
    rt->kv_dim = fp->n_kv_heads * fp->head_dim;
    rt->n_heads = opt->n_heads;
    rt->group = opt->n_heads / fp->n_kv_heads;
    rt->sinks = plan->global.sinks;
    rt->recent = plan->global.recent;
    rt->scale = opt->scale > 0.0f ? opt->scale : (float)(1.0 / sqrt((double)fp->head_dim));
    rt->n_threads = opt->pool ? kv_pool_threads(opt->pool) : opt->n_threads > 0 ? opt->n_threads : kv_default_threads();
    const int L2 = rt->n_layers * 2;
    rt->codec = calloc((size_t)L2, sizeof *rt->codec);
    rt->seqs = calloc((size_t)opt->n_seqs, sizeof *rt->seqs);
    rt->search = calloc((size_t)(plan->n_grids > 0 ? plan->n_grids : 1), sizeof *rt->search);
    rt->scratch = calloc((size_t)rt->n_threads, sizeof *rt->scratch);
    rt->recon_last_use = malloc((size_t)L2 * sizeof(int));
    if (!rt->codec || !rt->seqs || !rt->search || !rt->scratch || !rt->recon_last_use) {
        s = KV_ERR(KV_ENOMEM, "out of memory for a runtime");
        goto done;
    }
    if (opt->rope_inv_freq) {
        rt->inv_freq = malloc((size_t)rt->head_dim / 2 * sizeof(double));
        if (!rt->inv_freq) {
            s = KV_ERR(KV_ENOMEM, "out of memory");
            goto done;
        }
        memcpy(rt->inv_freq, opt->rope_inv_freq, (size_t)rt->head_dim / 2 * sizeof(double));
    }
    if (opt->rope_inv_freq && opt->rope_inv_freq_local && kv_plan_has_windows(plan)) { /* the windowed layers' own */
        rt->inv_freq_local = malloc((size_t)rt->head_dim / 2 * sizeof(double));
        if (!rt->inv_freq_local) {
            s = KV_ERR(KV_ENOMEM, "out of memory");
            goto done;
        }
        memcpy(rt->inv_freq_local, opt->rope_inv_freq_local, (size_t)rt->head_dim / 2 * sizeof(double));
    }
    /* the HIGGS encoder's search accelerator, one per low-dimensional grid */
    for (int g = 0; g < plan->n_grids; g++)
        if (plan->grids[g].d <= 2 &&
            (s = kv_grid_search_create(&rt->search[g], plan->grids[g].points, plan->grids[g].d, plan->grids[g].n)) != KV_OK)
            goto done;
    for (int l = 0; l < rt->n_layers; l++)
        for (int stream = 0; stream < 2; stream++) {
            rt_codec *c = &rt->codec[l * 2 + stream];
            if ((s = kv_rti_codec_init(c, plan, l, stream, rt->search)) != KV_OK) goto done;
            if (c->squat && !c->squat->static_subspace) rt->squat_prompt = 1;
            if (c->pre_rope) {
                rt->any_pre_rope = 1;
                if (rt->head_dim & 1) {
                    s = KV_ERR(KV_EUNSUPPORTED, "plan layer %d K stores keys before RoPE, which needs an even head_dim "
                               "(%d)", l, rt->head_dim);
                    goto done;
                }
                if (!rt->inv_freq) {
                    s = KV_ERR(KV_EINVAL, "plan layer %d K stores keys before RoPE: the runtime needs the model's RoPE "
                               "frequencies (kv_rt_options.rope_inv_freq)", l);
                    goto done;
                }
            }
            if (c->granule > 1 && c->rpc_ratio <= 0.0f && rt->recent % c->granule) {
                s = KV_ERR(KV_EFORMAT, "plan layer %d %s: token groups of %d do not divide the recent buffer (%d)", l,
                           sname(stream), c->granule, rt->recent);
                goto done;
            }
        }
    /* which layer reads each stream's reconstruction last: its own (a predicted stream is read through
     * it) and every predictor that takes it as input */
    for (int i = 0; i < L2; i++) rt->recon_last_use[i] = rt->codec[i].pred ? i / 2 : -1;
    for (int i = 0; i < L2; i++) {
        const kv_plan_predictor *pr = rt->codec[i].pred;
        for (int k = 0; pr && k < pr->n_inputs; k++) {
            const int in = pr->inputs[k].layer * 2 + pr->inputs[k].stream;
            if (rt->recon_last_use[in] < i / 2) rt->recon_last_use[in] = i / 2;
        }
    }
    if ((s = kv_rti_policy_open(rt)) != KV_OK) goto done;
    if ((s = window_open(rt)) != KV_OK) goto done;
    if (opt->device != KV_RT_DEVICE_CPU && (s = kv_rti_dev_open(rt)) != KV_OK) goto done;
    for (int q = 0; q < opt->n_seqs; q++) {
        rt_seq *sq = &rt->seqs[q];
        sq->layer_n = calloc((size_t)rt->n_layers, sizeof(int));
        sq->ev = calloc((size_t)rt->n_layers, sizeof(int));
        sq->st = calloc((size_t)L2, sizeof *sq->st);
        sq->recon = calloc((size_t)L2, sizeof *sq->recon);
        sq->ps = calloc((size_t)rt->n_layers, sizeof *sq->ps);
        if (!sq->layer_n || !sq->ev || !sq->st || !sq->recon || !sq->ps) {
            s = KV_ERR(KV_ENOMEM, "out of memory for %d sequences", opt->n_seqs);
            goto done;
        }
        for (int i = 0; i < L2; i++) sq->st[i].comp_end = rt->sinks;
        if ((s = kv_rti_policy_seq_init(rt, sq)) != KV_OK) goto done;
        if ((s = kv_rti_squat_seq_init(rt, sq)) != KV_OK) goto done;
    }
    if (opt->pool) {
        rt->pool = opt->pool;
    } else {
        if ((s = kv_pool_create(&rt->pool, rt->n_threads)) != KV_OK) goto done;
        rt->own_pool = 1;
    }
    if (opt->device == KV_RT_DEVICE_CUDA) s = kv_rti_selfcheck_guard(plan, opt);
done:
    if (s != KV_OK) {
        kv_rt_close(rt);
        return s;
    }
    *out = rt;
    return KV_OK;
}
