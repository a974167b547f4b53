/* rt_dev.c — the runtime's data paths on a device (rt_dev.h, RUNTIME.md §10): the f16 rows, the compressed
 * blocks, the reconstructions and the attention of a runtime opened for KV_RT_DEVICE_CUDA or its host model.
 * The bookkeeping is the CPU runtime's own (rt_runtime.c calls in here where it would touch data), so the
 * cache semantics, the statistics and every refusal are the same on both. */
#include "kvrt.h"
#include "rt_dev.h"
#include "rt_internal.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>

_Static_assert(KV_DC_F16 == (int)RT_F16 && KV_DC_F32 == (int)RT_F32 && KV_DC_UNIFORM == (int)RT_UNIFORM &&
                   KV_DC_HIGGS == (int)RT_HIGGS && KV_DC_FLOAT == (int)RT_FLOAT,
               "kv_dcodec kinds are rt_kind values");

/* A launch's description travels as a kernel parameter (4 KiB at most on every CUDA architecture). */
_Static_assert(sizeof(kv_dattn) <= 4096, "kv_dattn must fit the kernel parameter space");

/* Bytes of one page of a sequence's block arena (a block larger than this gets a page of its own). */
#define RT_ARENA_PAGE ((size_t)2 << 20)
/* Alignment of blocks in the arena. */
#define RT_ARENA_ALIGN ((size_t)256)

static const char *sname(int stream) { return stream == KV_PLAN_K ? "K" : "V"; }

static rt_dev *dev_of(const kv_rt *rt) { return rt->dv->dev; }
#define OPS(rt) (dev_of(rt)->ops)

/* ---- device tables of the codecs --------------------------------------------------------------------- */
/* A device copy of n bytes of host data, owned by the runtime (freed at close). */
kv_status kv_rti_dev_table(kv_rt *rt, const void *host, size_t bytes, void **out) {
    rt_devstate *dv = rt->dv;
    *out = NULL;
    if (dv->n_owned == dv->cap_owned) {
        const int cap = dv->cap_owned ? dv->cap_owned * 2 : 64;
        void **o = realloc(dv->owned, (size_t)cap * sizeof *o);
        if (!o) return KV_ERR(KV_ENOMEM, "out of memory");
        dv->owned = o, dv->cap_owned = cap;
    }
    void *p = NULL;
    kv_status s = OPS(rt)->alloc(dev_of(rt), &p, bytes ? bytes : 4);
    if (s == KV_OK && bytes) s = OPS(rt)->copy(dev_of(rt), p, host, bytes, RT_COPY_H2D);
    if (s != KV_OK) {
        OPS(rt)->free(dev_of(rt), p);
        return s;
    }
    dv->owned[dv->n_owned++] = p;
    *out = p;
    return KV_OK;
}

/* What the device cannot serve yet, refused at open with the reason (RUNTIME.md §10). */
static kv_status dev_refusals(const kv_rt *rt) {
    if (rt->hold_prompt || rt->policy->score != RT_SCORE_NONE)
        return KV_ERR(KV_EUNSUPPORTED, "runtime (CUDA): token pruning (%s) and prompt statistics are not supported on "
                      "the device yet; use the CPU runtime", rt->policy->name);
    if (rt->head_dim > 256)
        return KV_ERR(KV_EUNSUPPORTED, "runtime (CUDA): head_dim %d (the device attention takes at most 256)",
                      rt->head_dim);
    for (int i = 0; i < rt->n_layers * 2; i++) {
        const rt_codec *c = &rt->codec[i];
        const kv_status s = c->ops->dev_check ? c->ops->dev_check(rt, c) : KV_OK;
        if (s != KV_OK) return s;
    }
    return KV_OK;
}

static kv_status fill_dcodec(kv_rt *rt, int i) {
    const rt_codec *c = &rt->codec[i];
    kv_dcodec *d = &rt->dv->dcodec[i];
    kv_quant *dq = &rt->dv->dq[i];
    memset(d, 0, sizeof *d);
    *dq = c->q;
    d->kind = (int)c->kind;
    d->kv_dim = c->kv_dim;
    d->head_dim = c->head_dim;
    d->pre_rope = c->pre_rope;
    d->recon = c->pred != NULL;
    d->bits = c->bits;
    d->per_word = c->per_word;
    return c->ops->dev_describe(rt, c, d, dq);
}

kv_status kv_rti_dev_open(kv_rt *rt) {
    kv_status s = dev_refusals(rt);
    if (s != KV_OK) return s;
    rt_devstate *dv = calloc(1, sizeof *dv);
    if (!dv) return KV_ERR(KV_ENOMEM, "out of memory");
    rt->dv = dv;
    dv->kind = rt->opt.device;
    s = rt->opt.device == KV_RT_DEVICE_CUDA ? kv_rti_dev_cuda_create(&dv->dev, rt->opt.stream) : kv_rti_dev_host_create(&dv->dev);
    if (s != KV_OK) goto done;
    const int L2 = rt->n_layers * 2;
    dv->dcodec = calloc((size_t)L2, sizeof *dv->dcodec);
    dv->dq = calloc((size_t)L2, sizeof *dv->dq);
    dv->pred_w = calloc((size_t)L2, sizeof *dv->pred_w);
    dv->pred_b = calloc((size_t)L2, sizeof *dv->pred_b);
    if (!dv->dcodec || !dv->dq || !dv->pred_w || !dv->pred_b) {
        s = KV_ERR(KV_ENOMEM, "out of memory");
        goto done;
    }
    for (int i = 0; i < L2; i++) {
        if ((s = fill_dcodec(rt, i)) != KV_OK) goto done;
        const kv_plan_predictor *pr = rt->codec[i].pred;
        if (!pr) continue;
        void *w = NULL, *b = NULL;
        if ((s = kv_rti_dev_table(rt, pr->weight, (size_t)pr->out_dim * (size_t)pr->in_dim * sizeof(float), &w)) != KV_OK ||
            (s = kv_rti_dev_table(rt, pr->bias, (size_t)pr->out_dim * sizeof(float), &b)) != KV_OK)
            goto done;
        dv->pred_w[i] = (float *)w;
        dv->pred_b[i] = (float *)b;
    }
done:
    if (s != KV_OK) kv_rti_dev_close(rt); /* leaves rt->dv NULL: the CPU-side close frees the rest */
    return s;
}

void kv_rti_dev_close(kv_rt *rt) {
    rt_devstate *dv = rt ? rt->dv : NULL;
    if (!dv) return;
    if (dv->dev) {
        const rt_dev_ops *op = dv->dev->ops;
        for (int i = 0; i < dv->n_owned; i++) op->free(dv->dev, dv->owned[i]);
        op->free(dv->dev, dv->rope_cos);
        op->free(dv->dev, dv->rope_sin);
        op->free(dv->dev, dv->rope_cos_local);
        op->free(dv->dev, dv->rope_sin_local);
        op->free(dv->dev, dv->x);
        op->free(dv->dev, dv->pred);
        op->free(dv->dev, dv->tmp);
        op->free(dv->dev, dv->part);
        op->close(dv->dev);
    }
    free(dv->owned);
    free(dv->dcodec);
    free(dv->dq);
    free(dv->pred_w);
    free(dv->pred_b);
    free(dv->host_blk);
    free(dv->host_x);
    free(dv);
    rt->dv = NULL;
}

/* ---- memory ------------------------------------------------------------------------------------------ */
/* A device buffer of at least `need` bytes in *buf (grown, contents dropped). */
static kv_status grow(kv_rt *rt, void **buf, size_t *have, size_t need) {
    if (need <= *have && *buf) return KV_OK;
    OPS(rt)->free(dev_of(rt), *buf);
    *buf = NULL;
    *have = 0;
    kv_status s = OPS(rt)->alloc(dev_of(rt), buf, need ? need : 4);
    if (s == KV_OK) *have = need;
    return s;
}

static kv_status host_grow(void **buf, size_t *have, size_t need) {
    if (need <= *have && *buf) return KV_OK;
    void *p = realloc(*buf, need ? need : 4);
    if (!p) return KV_ERR(KV_ENOMEM, "out of memory for %zu bytes of host staging", need);
    *buf = p;
    *have = need;
    return KV_OK;
}

static kv_status arena_alloc(kv_rt *rt, rt_seq *sq, size_t bytes, uint8_t **out) {
    if (!sq->arena && !(sq->arena = calloc(1, sizeof *sq->arena))) return KV_ERR(KV_ENOMEM, "out of memory");
    rt_arena *a = sq->arena;
    bytes = (bytes + RT_ARENA_ALIGN - 1) / RT_ARENA_ALIGN * RT_ARENA_ALIGN;
    if (bytes == 0) bytes = RT_ARENA_ALIGN;
    if (a->n && a->pages[a->n - 1].used + bytes <= a->pages[a->n - 1].size) {
        rt_arena_page *pg = &a->pages[a->n - 1];
        *out = pg->base + pg->used;
        pg->used += bytes;
        return KV_OK;
    }
    if (a->n == a->cap) {
        const int cap = a->cap ? a->cap * 2 : 16;
        rt_arena_page *p = realloc(a->pages, (size_t)cap * sizeof *p);
        if (!p) return KV_ERR(KV_ENOMEM, "out of memory");
        a->pages = p, a->cap = cap;
    }
    const size_t size = bytes > RT_ARENA_PAGE ? bytes : RT_ARENA_PAGE;
    void *base = NULL;
    kv_status s = OPS(rt)->alloc(dev_of(rt), &base, size);
    if (s != KV_OK) return kv_error_wrap(s, "runtime (device): a block page of %zu bytes: ", size);
    a->pages[a->n++] = (rt_arena_page){(uint8_t *)base, size, bytes};
    sq->allocated += size;
    *out = (uint8_t *)base;
    return KV_OK;
}

void kv_rti_dev_seq_clear(kv_rt *rt, rt_seq *sq) {
    rt_arena *a = sq->arena;
    if (!a) return;
    for (int i = 0; i < a->n; i++) OPS(rt)->free(dev_of(rt), a->pages[i].base);
    free(a->pages);
    memset(a, 0, sizeof *a);
}

kv_status kv_rti_dev_fp_resize(kv_rt *rt, rt_seq *sq, rt_stream *st, int rows) {
    const size_t row_bytes = (size_t)rt->kv_dim * 2u;
    if (rows <= st->fp_cap) {
        st->fp_rows = rows;
        return KV_OK;
    }
    int cap = st->fp_cap ? st->fp_cap * 2 : 32;
    if (cap < rows) cap = rows;
    void *p = NULL;
    kv_status s = OPS(rt)->alloc(dev_of(rt), &p, (size_t)cap * row_bytes);
    if (s != KV_OK) return kv_error_wrap(s, "runtime (device): f16 rows of %d tokens: ", cap);
    if (st->fp_rows && (s = OPS(rt)->copy(dev_of(rt), p, st->fp, (size_t)st->fp_rows * row_bytes, RT_COPY_D2D)) != KV_OK) {
        OPS(rt)->free(dev_of(rt), p);
        return s;
    }
    OPS(rt)->free(dev_of(rt), st->fp);
    st->fp = p;
    sq->allocated += (uint64_t)(cap - st->fp_cap) * row_bytes;
    st->fp_cap = cap;
    st->fp_rows = rows;
    return KV_OK;
}

kv_status kv_rti_dev_window_drop(kv_rt *rt, rt_seq *sq, rt_stream *st, int m) {
    const size_t kvd = (size_t)rt->kv_dim, row_bytes = kvd * 2u;
    const int win0 = rt->sinks, count = st->fp_rows - m - win0;
    kv_status s = KV_OK;
    if (count > 0) {
        uint16_t *dst = st->fp + (size_t)win0 * kvd, *src = st->fp + (size_t)(win0 + m) * kvd;
        const size_t bytes = (size_t)count * row_bytes;
        if (count <= m) { /* the regions do not overlap */
            s = OPS(rt)->copy(dev_of(rt), dst, src, bytes, RT_COPY_D2D);
        } else {
            if ((s = grow(rt, (void **)&rt->dv->tmp, &rt->dv->tmp_bytes, bytes)) != KV_OK) return s;
            s = OPS(rt)->copy(dev_of(rt), rt->dv->tmp, src, bytes, RT_COPY_D2D);
            if (s == KV_OK) s = OPS(rt)->copy(dev_of(rt), dst, rt->dv->tmp, bytes, RT_COPY_D2D);
        }
    }
    return s == KV_OK ? kv_rti_dev_fp_resize(rt, sq, st, st->fp_rows - m) : s;
}

kv_status kv_rti_dev_scratch(kv_rt *rt, int rows, float **x, float **pred) {
    rt_devstate *dv = rt->dv;
    if ((size_t)rows > dv->x_rows || !dv->x) {
        const size_t bytes = (size_t)rows * (size_t)rt->kv_dim * sizeof(float);
        size_t have = 0;
        kv_status s = grow(rt, (void **)&dv->x, &have, bytes);
        if (s == KV_OK) {
            have = 0;
            s = grow(rt, (void **)&dv->pred, &have, bytes);
        }
        if (s != KV_OK) return kv_error_wrap(s, "runtime (device): compressing %d tokens: ", rows);
        dv->x_rows = (size_t)rows;
    }
    *x = dv->x;
    *pred = dv->pred;
    return KV_OK;
}

/* ---- compression ------------------------------------------------------------------------------------- */
/* The device descriptor of a stream's new last block. */
static kv_status table_push(kv_rt *rt, rt_seq *sq, rt_stream *st, const rt_codec *c) {
    const rt_block *b = &st->blocks[st->n_blocks - 1];
    if (st->n_blocks > st->dtab_cap) {
        const int cap = st->dtab_cap ? st->dtab_cap * 2 : 16;
        void *p = NULL;
        kv_status s = OPS(rt)->alloc(dev_of(rt), &p, (size_t)cap * sizeof(kv_dblock));
        if (s == KV_OK && st->dtab_cap)
            s = OPS(rt)->copy(dev_of(rt), p, st->dtab, (size_t)st->dtab_cap * sizeof(kv_dblock), RT_COPY_D2D);
        if (s != KV_OK) {
            OPS(rt)->free(dev_of(rt), p);
            return s;
        }
        OPS(rt)->free(dev_of(rt), st->dtab);
        st->dtab = (kv_dblock *)p;
        sq->allocated += (uint64_t)(cap - st->dtab_cap) * sizeof(kv_dblock);
        st->dtab_cap = cap;
    }
    rt_layout L;
    kv_rti_codec_layout(c, b->m, &L);
    kv_dblock d;
    d.codes = b->codes;
    d.params = b->data + L.code_bytes;
    d.zeros = b->data + L.code_bytes + L.param_bytes;
    d.t0 = b->t0;
    d.m = b->m;
    return OPS(rt)->copy(dev_of(rt), &st->dtab[st->n_blocks - 1], &d, sizeof d, RT_COPY_H2D);
}

/* SQuat keys are encoded by the host's encoders (the sequence's prompt subspace lives there): the chunk goes
 * to the host and its block comes back. */
static kv_status encode_squat(kv_rt *rt, int seq, int layer, uint8_t *data, size_t bytes, int m, const float *x) {
    rt_devstate *dv = rt->dv;
    const size_t n = (size_t)m * (size_t)rt->kv_dim;
    kv_status s = host_grow((void **)&dv->host_x, &dv->host_x_bytes, n * sizeof(float));
    if (s == KV_OK) s = host_grow((void **)&dv->host_blk, &dv->host_bytes, bytes);
    if (s == KV_OK) s = OPS(rt)->copy(dev_of(rt), dv->host_x, x, n * sizeof(float), RT_COPY_D2H);
    if (s == KV_OK) s = kv_rti_squat_encode(rt, seq, layer, dv->host_blk, m, dv->host_x);
    if (s == KV_OK) s = OPS(rt)->copy(dev_of(rt), data, dv->host_blk, bytes, RT_COPY_H2D);
    return s;
}

/* y[0..rows) = the predictor of (layer, stream) applied to its inputs' reconstruction rows (from row r0). */
static kv_status predict(kv_rt *rt, int seq, int layer, int stream, int r0, int rows, float *y) {
    const int i = layer * 2 + stream, kvd = rt->kv_dim;
    const kv_plan_predictor *pr = rt->codec[i].pred;
    kv_status s = OPS(rt)->fill_rows(dev_of(rt), y, rt->dv->pred_b[i], rows, kvd);
    for (int k = 0; s == KV_OK && k < pr->n_inputs; k++) {
        const rt_recon *in = &rt->seqs[seq].recon[pr->inputs[k].layer * 2 + pr->inputs[k].stream];
        s = OPS(rt)->gemm_nt(dev_of(rt), rows, kvd, kvd, in->x + (size_t)r0 * (size_t)kvd, kvd,
                             rt->dv->pred_w[i] + (size_t)k * (size_t)kvd, pr->in_dim, y, kvd);
    }
    return s;
}

kv_status kv_rti_dev_compress(kv_rt *rt, int seq, int layer, int stream, int row, int m, float *x, float *pred) {
    rt_seq *sq = &rt->seqs[seq];
    rt_stream *st = rt_stream_of(rt, seq, layer, stream);
    const int i = layer * 2 + stream;
    const rt_codec *c = &rt->codec[i];
    const size_t kvd = (size_t)rt->kv_dim, n = (size_t)m * kvd;
    const int t0 = st->comp_end;
    kv_status s = OPS(rt)->rows_f32(dev_of(rt), x, st->fp + (size_t)row * kvd, n);
    if (s != KV_OK) return s;
    if (c->pred) {
        for (int k = 0; k < c->pred->n_inputs; k++) {
            const rt_stream *in = rt_stream_of(rt, seq, c->pred->inputs[k].layer, c->pred->inputs[k].stream);
            if (in->comp_end < t0 + m)
                return KV_ERR(KV_EINVAL, "runtime: layer %d %s predicts from layer %d %s, which has not compressed "
                              "tokens %d..%d yet (layers must be appended in order)", layer, sname(stream),
                              c->pred->inputs[k].layer, sname(c->pred->inputs[k].stream), t0, t0 + m - 1);
            if ((s = kv_rti_dev_recon_ensure(rt, seq, c->pred->inputs[k].layer, c->pred->inputs[k].stream)) != KV_OK)
                return s;
        }
        if ((s = predict(rt, seq, layer, stream, t0 - rt->sinks, m, pred)) != KV_OK) return s;
        if ((s = OPS(rt)->sub(dev_of(rt), x, pred, n)) != KV_OK) return s;
    }
    const uint32_t *shared = NULL; /* XQuant: the partner compressed the same chunk already */
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
    uint8_t *data = NULL;
    if ((s = arena_alloc(rt, sq, L.total, &data)) != KV_OK) return s;
    s = c->squat ? encode_squat(rt, seq, layer, data, L.total, m, x) : OPS(rt)->encode(dev_of(rt), c, &rt->dv->dq[i], data, m, x);
    if (s != KV_OK) return kv_error_wrap(s, "layer %d %s, tokens %d..%d: ", layer, sname(stream), t0, t0 + m - 1);
    /* the arena accounts the bytes (its pages) */
    if ((s = kv_rti_block_push(rt, sq, st, t0, m, data, 0, shared ? shared : (const uint32_t *)data)) != KV_OK) return s;
    if ((s = table_push(rt, sq, st, c)) != KV_OK) return s;
    st->comp_end = t0 + m;
    return KV_OK;
}

kv_status kv_rti_dev_store(kv_rt *rt, int layer, int n_seqs, const int *seqs, int n, const float *k_pre, const float *k,
                       const float *v, size_t ld) {
    rt_dev_rows stack[64], *jobs = n_seqs * 2 <= 64 ? stack : malloc((size_t)n_seqs * 2 * sizeof *jobs);
    if (!jobs) return KV_ERR(KV_ENOMEM, "out of memory");
    const int pre = rt_codec_of(rt, layer, KV_PLAN_K)->pre_rope;
    kv_status s = KV_OK;
    for (int i = 0; s == KV_OK && i < n_seqs; i++) {
        rt_seq *sq = &rt->seqs[seqs[i]];
        for (int stream = 0; stream < 2; stream++) {
            rt_stream *st = &sq->st[layer * 2 + stream];
            const int r0 = st->fp_rows;
            if ((s = kv_rti_dev_fp_resize(rt, sq, st, r0 + n)) != KV_OK) break;
            const float *src = stream == KV_PLAN_V ? v : pre ? k_pre : k;
            jobs[i * 2 + stream] = (rt_dev_rows){st->fp + (size_t)r0 * (size_t)rt->kv_dim, src + (size_t)i * (size_t)n * ld, n};
        }
    }
    if (s == KV_OK) s = OPS(rt)->store_rows(dev_of(rt), jobs, n_seqs * 2, ld, rt->kv_dim);
    if (jobs != stack) free(jobs);
    return s;
}

/* ---- reconstructions ----------------------------------------------------------------------------------- */
void kv_rti_dev_recon_free(kv_rt *rt, rt_recon *r) {
    OPS(rt)->free(dev_of(rt), r->x);
    memset(r, 0, sizeof *r);
}

kv_status kv_rti_dev_recon_ensure(kv_rt *rt, int seq, int layer, int stream) {
    rt_recon *r = &rt->seqs[seq].recon[layer * 2 + stream];
    const rt_stream *st = rt_stream_of(rt, seq, layer, stream);
    const int i = layer * 2 + stream;
    const rt_codec *c = &rt->codec[i];
    const int target = st->comp_end - rt->sinks, kvd = rt->kv_dim;
    if (target <= r->rows) return KV_OK;
    kv_status s;
    if (target > r->cap) {
        int cap = r->cap ? r->cap : 256;
        while (cap < target) cap *= 2;
        void *p = NULL;
        if ((s = OPS(rt)->alloc(dev_of(rt), &p, (size_t)cap * (size_t)kvd * sizeof(float))) != KV_OK)
            return kv_error_wrap(s, "runtime (device): a reconstruction of %d tokens: ", cap);
        if (r->rows &&
            (s = OPS(rt)->copy(dev_of(rt), p, r->x, (size_t)r->rows * (size_t)kvd * sizeof(float), RT_COPY_D2D)) != KV_OK) {
            OPS(rt)->free(dev_of(rt), p);
            return s;
        }
        OPS(rt)->free(dev_of(rt), r->x);
        r->x = p;
        r->cap = cap;
    }
    /* the blocks after the rows reconstructed so far (blocks are consecutive chunks) */
    int first = st->n_blocks;
    for (int b = st->n_blocks - 1; b >= 0 && st->blocks[b].t0 - rt->sinks >= r->rows; b--) first = b;
    const int rows = target - r->rows;
    float *y = r->x + (size_t)r->rows * (size_t)kvd;
    if (c->pred) {
        for (int k = 0; k < c->pred->n_inputs; k++) {
            const int il = c->pred->inputs[k].layer, is = c->pred->inputs[k].stream;
            if (rt_stream_of(rt, seq, il, is)->comp_end < st->comp_end)
                return KV_ERR(KV_EINVAL, "runtime: layer %d %s predicts from layer %d %s, which has not compressed "
                              "tokens %d..%d yet (layers must be appended in order)", layer, sname(stream), il, sname(is),
                              rt_stream_of(rt, seq, il, is)->comp_end, st->comp_end - 1);
            if ((s = kv_rti_dev_recon_ensure(rt, seq, il, is)) != KV_OK) return s;
        }
        s = predict(rt, seq, layer, stream, r->rows, rows, y);
    } else {
        s = OPS(rt)->zero(dev_of(rt), y, (size_t)rows * (size_t)kvd * sizeof(float));
    }
    if (s == KV_OK && first < st->n_blocks)
        s = OPS(rt)->recon_add(dev_of(rt), &rt->dv->dcodec[i], st->dtab, first, st->n_blocks, rt->sinks, r->x);
    if (s != KV_OK) return s;
    r->rows = target;
    return KV_OK;
}

/* A device copy of one host RoPE table (rt->rope_n positions) in *dst, replacing the old one. */
static kv_status rope_copy(kv_rt *rt, float **dst, const float *host) {
    const size_t bytes = (size_t)rt->rope_n * (size_t)(rt->head_dim / 2) * sizeof(float);
    OPS(rt)->free(dev_of(rt), *dst);
    *dst = NULL;
    void *p = NULL;
    kv_status s = OPS(rt)->alloc(dev_of(rt), &p, bytes);
    if (s == KV_OK) *dst = p;
    return s == KV_OK ? OPS(rt)->copy(dev_of(rt), p, host, bytes, RT_COPY_H2D) : s;
}

kv_status kv_rti_dev_rope_reserve(kv_rt *rt, int n_pos) {
    kv_status s = kv_rti_rope_reserve(rt, n_pos); /* the host tables, which the device copies */
    if (s != KV_OK || rt->rope_n <= rt->dv->rope_n) return s;
    rt_devstate *dv = rt->dv;
    dv->rope_n = 0;
    s = rope_copy(rt, &dv->rope_cos, rt->rope_cos);
    if (s == KV_OK) s = rope_copy(rt, &dv->rope_sin, rt->rope_sin);
    if (s == KV_OK && rt->inv_freq_local) s = rope_copy(rt, &dv->rope_cos_local, rt->rope_cos_local);
    if (s == KV_OK && rt->inv_freq_local) s = rope_copy(rt, &dv->rope_sin_local, rt->rope_sin_local);
    if (s == KV_OK) dv->rope_n = rt->rope_n;
    return s;
}

/* ---- attention ----------------------------------------------------------------------------------------- */
void kv_rti_dev_configure(kv_dattn *A, int n_max) {
    const int nqv_max = A->hd <= 128 ? 32 : 16;
    A->tile = A->hd <= 128 ? 64 : 32;
    int rpb = nqv_max / A->G;
    rpb = rpb < 1 ? 1 : rpb > A->n_q ? A->n_q : rpb;
    A->rows_per_block = rpb;
    A->n_rowblocks = (A->n_q + rpb - 1) / rpb;
    const long base = (long)A->n_seqs * (long)A->H * (long)A->n_rowblocks;
    long ns = (KV_DA_TARGET_BLOCKS + base - 1) / base;
    const long tiles = (n_max + A->tile - 1) / A->tile;
    ns = ns < 1 ? 1 : ns > tiles ? tiles : ns;
    if (ns < 1) ns = 1;
    long split = (n_max + ns - 1) / ns;
    split = (split + A->tile - 1) / A->tile * A->tile;
    if (split > KV_DA_MAX_SPLIT) split = KV_DA_MAX_SPLIT;
    if (split < A->tile) split = A->tile;
    A->split = (int)split;
    A->n_splits = (int)((n_max + split - 1) / split);
    if (A->n_splits < 1) A->n_splits = 1;
}

kv_status kv_rti_dev_attend(kv_rt *rt, int layer, int n_seqs, const int *seqs, int n_q, const float *const *qs, size_t ldq,
                        float *const *outs, size_t ldo) {
    rt_devstate *dv = rt->dv;
    kv_status s = KV_OK;
    if (ldq > INT_MAX || ldo > INT_MAX) return KV_ERR(KV_EINVAL, "runtime (device): row strides above INT_MAX");
    const int kpre = rt_codec_of(rt, layer, KV_PLAN_K)->pre_rope;
    for (int i = 0; i < n_seqs; i++) {
        for (int stream = 0; stream < 2; stream++)
            if (rt_codec_of(rt, layer, stream)->pred && (s = kv_rti_dev_recon_ensure(rt, seqs[i], layer, stream)) != KV_OK)
                return s;
        if (kpre && (s = kv_rti_dev_rope_reserve(rt, rt->seqs[seqs[i]].layer_n[layer])) != KV_OK) return s;
    }
    for (int b0 = 0; b0 < n_seqs; b0 += KV_DA_MAX_BATCH) {
        const int nb = n_seqs - b0 < KV_DA_MAX_BATCH ? n_seqs - b0 : KV_DA_MAX_BATCH;
        kv_dattn *A = calloc(1, sizeof *A);
        if (!A) return KV_ERR(KV_ENOMEM, "out of memory");
        A->codec[0] = dv->dcodec[layer * 2];
        A->codec[1] = dv->dcodec[layer * 2 + 1];
        A->n_seqs = nb, A->n_q = n_q, A->H = rt->n_kv_heads, A->G = rt->group, A->hd = rt->head_dim, A->sinks = rt->sinks;
        A->ldq = (int)ldq, A->ldo = (int)ldo;
        A->scale = rt->scale;
        const int local = rt->inv_freq_local && rt->win[layer] > 0; /* as kv_rti_rope_table */
        A->rope_cos = local ? dv->rope_cos_local : dv->rope_cos, A->rope_sin = local ? dv->rope_sin_local : dv->rope_sin;
        A->rope_adjacent = rt->opt.rope_layout == KV_ROPE_ADJACENT;
        A->window = rt->win[layer];
        int n_max = 1;
        for (int i = 0; i < nb; i++) {
            const int n = rt->seqs[seqs[b0 + i]].layer_n[layer];
            n_max = n > n_max ? n : n_max;
        }
        kv_rti_dev_configure(A, n_max);
        const size_t per = (size_t)A->H * (size_t)n_q * (size_t)A->G * (size_t)A->n_splits * (size_t)(A->hd + 2);
        size_t have = dv->part_floats * sizeof(float);
        if ((s = grow(rt, (void **)&dv->part, &have, per * (size_t)nb * sizeof(float))) != KV_OK) {
            free(A);
            return s;
        }
        dv->part_floats = have / sizeof(float);
        for (int i = 0; i < nb; i++) {
            const int seq = seqs[b0 + i];
            const rt_seq *sq = &rt->seqs[seq];
            kv_dseq *d = &A->seq[i];
            for (int stream = 0; stream < 2; stream++) {
                const rt_stream *st = &sq->st[layer * 2 + stream];
                d->s[stream].fp = st->fp;
                d->s[stream].blocks = st->dtab;
                d->s[stream].recon = sq->recon[layer * 2 + stream].x;
                d->s[stream].n_blocks = st->n_blocks;
                d->s[stream].comp_end = st->comp_end;
            }
            d->n = sq->layer_n[layer];
            d->q = qs[b0 + i];
            d->out = outs[b0 + i];
            d->part = dv->part + (size_t)i * per;
        }
        s = OPS(rt)->attend(dev_of(rt), A);
        free(A);
        if (s != KV_OK) return kv_error_wrap(s, "runtime (device): attention of layer %d: ", layer);
    }
    return KV_OK;
}

kv_status kv_rti_dev_host_queries(kv_rt *rt, int n_q, const float *q, size_t ldq, const float **host_q) {
    rt_devstate *dv = rt->dv;
    if (dv->kind != KV_RT_DEVICE_CUDA) { /* the host model's device memory is the host's */
        *host_q = q;
        return KV_OK;
    }
    const size_t floats = (size_t)(n_q - 1) * ldq + (size_t)rt->n_heads * (size_t)rt->head_dim;
    kv_status s = host_grow((void **)&dv->host_x, &dv->host_x_bytes, floats * sizeof(float));
    if (s == KV_OK) s = OPS(rt)->copy(dev_of(rt), dv->host_x, q, floats * sizeof(float), RT_COPY_D2H);
    *host_q = dv->host_x;
    return s;
}

/* ---- decoded view -------------------------------------------------------------------------------------- */
/* The CPU reader on host copies of one stream's data: the stream's pointers are swapped for the copies while
 * kv_rti_read_rows_ready runs, and back. */
static kv_status decode_stream(kv_rt *rt, int layer, int seq, int stream, int h, float *out) {
    rt_seq *sq = &rt->seqs[seq];
    rt_stream *st = &sq->st[layer * 2 + stream];
    rt_recon *r = &sq->recon[layer * 2 + stream];
    const rt_codec *c = &rt->codec[layer * 2 + stream];
    const size_t kvd = (size_t)rt->kv_dim;
    kv_status s = KV_OK;
    if (c->pred && (s = kv_rti_dev_recon_ensure(rt, seq, layer, stream)) != KV_OK) return s;
    if (stream == KV_PLAN_K && c->pre_rope && (s = kv_rti_rope_reserve(rt, sq->layer_n[layer])) != KV_OK) return s;
    uint16_t *dev_fp = st->fp, *host_fp = NULL;
    float *dev_recon = r->x, *host_recon = NULL;
    rt_block *saved = NULL;
    uint8_t **copies = NULL;
    const int nb = st->n_blocks;
    if (st->fp_rows) {
        host_fp = malloc((size_t)st->fp_rows * kvd * 2u);
        if (!host_fp) goto oom;
        if ((s = OPS(rt)->copy(dev_of(rt), host_fp, dev_fp, (size_t)st->fp_rows * kvd * 2u, RT_COPY_D2H)) != KV_OK) goto done;
    }
    if (r->rows) {
        host_recon = malloc((size_t)r->rows * kvd * sizeof(float));
        if (!host_recon) goto oom;
        if ((s = OPS(rt)->copy(dev_of(rt), host_recon, dev_recon, (size_t)r->rows * kvd * sizeof(float), RT_COPY_D2H)) !=
            KV_OK)
            goto done;
    }
    saved = malloc((size_t)(nb ? nb : 1) * sizeof *saved);
    copies = calloc((size_t)(nb ? nb : 1) * 2, sizeof *copies);
    if (!saved || !copies) goto oom;
    for (int b = 0; b < nb; b++) {
        const rt_block *blk = &st->blocks[b];
        saved[b] = *blk;
        rt_layout L;
        kv_rti_codec_layout(c, blk->m, &L);
        if (!(copies[2 * b] = malloc(L.total ? L.total : 1))) goto oom;
        if ((s = OPS(rt)->copy(dev_of(rt), copies[2 * b], blk->data, L.total, RT_COPY_D2H)) != KV_OK) goto done;
        if (blk->codes != (const uint32_t *)blk->data) { /* XQuant: the partner's codes, as its layout holds them */
            rt_layout Lp;
            kv_rti_codec_layout(rt_codec_of(rt, c->share_from, stream), blk->m, &Lp);
            if (!(copies[2 * b + 1] = malloc(Lp.code_bytes ? Lp.code_bytes : 1))) goto oom;
            if ((s = OPS(rt)->copy(dev_of(rt), copies[2 * b + 1], blk->codes, Lp.code_bytes, RT_COPY_D2H)) != KV_OK)
                goto done;
        }
    }
    st->fp = host_fp;
    r->x = host_recon;
    for (int b = 0; b < nb; b++) {
        st->blocks[b].data = copies[2 * b];
        st->blocks[b].codes = (const uint32_t *)(copies[2 * b + 1] ? copies[2 * b + 1] : copies[2 * b]);
    }
    kv_rti_read_rows_ready(rt, seq, layer, stream, h, 0, kv_rti_head_rows(rt, seq, layer, h), out, (size_t)rt->head_dim);
    st->fp = dev_fp;
    r->x = dev_recon;
    for (int b = 0; b < nb; b++) st->blocks[b] = saved[b];
    goto done;
oom:
    s = KV_ERR(KV_ENOMEM, "out of memory decoding layer %d %s", layer, sname(stream));
done:
    for (int b = 0; copies && b < 2 * nb; b++) free(copies[b]);
    free(copies);
    free(saved);
    free(host_fp);
    free(host_recon);
    return s;
}

kv_status kv_rti_dev_decode_head(kv_rt *rt, int layer, int seq, int kv_head, float *k_out, float *v_out) {
    kv_status s = decode_stream(rt, layer, seq, KV_PLAN_K, kv_head, k_out);
    return s == KV_OK ? decode_stream(rt, layer, seq, KV_PLAN_V, kv_head, v_out) : s;
}

kv_stream kv_rt_stream(const kv_rt *rt) {
    return rt && rt->dv && rt->dv->kind == KV_RT_DEVICE_CUDA ? kv_rti_dev_cuda_stream(rt->dv->dev) : NULL;
}
