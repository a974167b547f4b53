/* kv_rti_attend.c — attention over what a sequence holds, from the compressed form (RUNTIME.md §4).
 *
 * Decoding (at most RT_DIRECT_MAX_ROWS query rows): work items are (KV head, segment of RT_SEGMENT
 * tokens). An item takes the scores of all the head's query vectors (the GQA group times the rows)
 * against its tokens, piece by piece, with each piece's own kernel (f16 rows, uniform codes with the
 * query folded into the scales, HIGGS lookup tables; other layouts through a decoded tile of
 * RT_TILE rows), then its softmax statistics (max, sum of exp) and the weighted sum of its values,
 * again from the codes. Items are combined in a fixed order with the usual rescaling (numerically
 * safe at any length), so results do not depend on the thread count.
 * Prefill and chunked evaluation (more rows): items are (KV head, block of query rows); keys and
 * values are decoded a tile of RT_TILE tokens at a time into per-thread scratch, scored with a GEMM
 * and folded into an online softmax (flash-attention style). Neither path ever holds more than a
 * tile of decoded keys or values. */
#include "kvrt.h"
#include "rt_internal.h"

#include <cblas.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Query rows per item on the tiled path. */
#define TILED_ROWS 64

int kv_rti_blas_threads_begin(void) {
    const int n = openblas_get_num_threads();
    if (n != 1) openblas_set_num_threads(1);
    return n;
}

void kv_rti_blas_threads_end(int previous) {
    if (previous != 1) openblas_set_num_threads(previous);
}

kv_status kv_rti_scratch_reserve(rt_scratch *s, size_t floats) {
    if (floats <= s->cap) return KV_OK;
    float *b = kv_aligned_alloc(64, floats * sizeof(float));
    if (!b) return KV_ERR(KV_ENOMEM, "runtime: out of memory for attention scratch (%zu floats)", floats);
    kv_aligned_free(s->buf);
    s->buf = b;
    s->cap = floats;
    return KV_OK;
}

/* ---- pieces ---------------------------------------------------------------------------------------- */
int kv_rti_head_rows(const kv_rt *rt, int seq, int layer, int h) {
    const rt_seq *sq = &rt->seqs[seq];
    const int n = sq->layer_n[layer];
    const rt_stream *st = &sq->st[layer * 2];
    if (!st->heads) return n - sq->ev[layer];
    return n - (sq->ps[layer].sel_end - rt->sinks) + st->heads[h].kept;
}

void kv_rti_piece_at(const kv_rt *rt, int seq, int layer, int stream, int h, int v, int end, rt_piece *p) {
    const rt_seq *sq = &rt->seqs[seq];
    const rt_stream *st = &sq->st[layer * 2 + stream];
    const int n = sq->layer_n[layer], kvd = rt->kv_dim;
    /* a windowed layer that dropped what left its window holds positions [ev, n) (no sinks): row v is position
     * ev + v, its f16 rows are the window alone */
    const int ev = sq->ev[layer];
    const int sinks_held = ev > 0 ? 0 : rt_sinks_held(rt, n), fp0 = ev > 0 ? 0 : rt->sinks;
    memset(p, 0, sizeof *p);
    p->a = v;
    p->kh = h;
    if (v < sinks_held) {
        p->kind = RT_PIECE_FP16;
        p->b = end < sinks_held ? end : sinks_held;
        p->fp = st->fp + (size_t)v * (size_t)kvd;
        p->p0 = v;
        return;
    }
    int dropped = ev;
    if (st->heads) {
        const rt_hstore *hs = &st->heads[h];
        const int k = v - sinks_held;
        if (k < hs->kept) { /* the head's kept tokens: the block holding row k (blocks sorted by k0) */
            int lo = 0, hi = hs->n_blocks - 1;
            while (lo < hi) {
                const int mid = (lo + hi + 1) / 2;
                if (hs->blocks[mid].k0 <= k) lo = mid; else hi = mid - 1;
            }
            const rt_hblock *hb = &hs->blocks[lo];
            p->kind = RT_PIECE_BLOCK;
            p->blk = &hb->b;
            p->r0 = k - hb->k0;
            const int blk_end = v + (hb->b.m - p->r0);
            p->b = end < blk_end ? end : blk_end;
            p->codec = rt_hcodec_of(rt, layer, stream, h);
            p->kh = 0;
            p->pos = hb->pos ? hb->pos + p->r0 : NULL;
            p->p0 = hb->pos ? hb->pos[p->r0] : hb->b.t0 + p->r0;
            return;
        }
        dropped = (sq->ps[layer].sel_end - rt->sinks) - hs->kept;
    }
    /* whole-token storage after the pruned region, by position */
    const int t = v + dropped, tend = end + dropped;
    p->p0 = t;
    if (t < st->comp_end) {
        const int b = tend < st->comp_end ? tend : st->comp_end;
        p->b = b - dropped;
        if (rt_codec_of(rt, layer, stream)->pred) {
            p->kind = RT_PIECE_RECON;
            p->recon = sq->recon[layer * 2 + stream].x + (size_t)(t - rt->sinks) * (size_t)kvd;
            return;
        }
        /* the block holding t: blocks are consecutive and sorted */
        int lo = 0, hi = st->n_blocks - 1;
        while (lo < hi) {
            const int mid = (lo + hi + 1) / 2;
            if (st->blocks[mid].t0 <= t) lo = mid; else hi = mid - 1;
        }
        p->kind = RT_PIECE_BLOCK;
        p->blk = &st->blocks[lo];
        p->r0 = t - p->blk->t0;
        p->codec = rt_codec_of(rt, layer, stream);
        const int blk_end = p->blk->t0 + p->blk->m - dropped;
        if (p->b > blk_end) p->b = blk_end;
    } else {
        p->kind = RT_PIECE_FP16;
        p->b = (tend < n ? tend : n) - dropped;
        p->fp = st->fp + (size_t)(fp0 + (t - st->comp_end)) * (size_t)kvd;
    }
}

int kv_rti_row_position(const kv_rt *rt, int seq, int layer, int h, int v) {
    rt_piece p;
    kv_rti_piece_at(rt, seq, layer, KV_PLAN_K, h, v, v + 1, &p);
    return p.pos ? p.pos[0] : p.p0;
}

kv_status kv_rti_read_prepare(kv_rt *rt, int seq, int layer, int stream) {
    kv_status s;
    if (rt_codec_of(rt, layer, stream)->pred && (s = kv_rti_recon_ensure(rt, seq, layer, stream)) != KV_OK) return s;
    if (stream == KV_PLAN_K && rt_codec_of(rt, layer, stream)->pre_rope &&
        (s = kv_rti_rope_reserve(rt, rt->seqs[seq].layer_n[layer])) != KV_OK)
        return s;
    return KV_OK;
}

void kv_rti_read_rows_ready(const kv_rt *rt, int seq, int layer, int stream, int h, int a, int b, float *out, size_t ldo) {
    const rt_codec *c = rt_codec_of(rt, layer, stream);
    const size_t hd = (size_t)rt->head_dim, kvd = (size_t)rt->kv_dim, off = (size_t)h * hd;
    rt_piece p;
    for (int v = a; v < b; v = p.b) {
        kv_rti_piece_at(rt, seq, layer, stream, h, v, b, &p);
        float *o = out + (size_t)(v - a) * ldo;
        const int len = p.b - p.a;
        switch (p.kind) {
        case RT_PIECE_FP16:
            for (int r = 0; r < len; r++) kv_rti_f16_to_f32_row(o + (size_t)r * ldo, p.fp + (size_t)r * kvd + off, hd);
            break;
        case RT_PIECE_RECON:
            for (int r = 0; r < len; r++) memcpy(o + (size_t)r * ldo, p.recon + (size_t)r * kvd + off, hd * sizeof(float));
            break;
        case RT_PIECE_BLOCK:
            kv_rti_codec_decode_head(p.codec, p.blk, p.r0, p.r0 + len, p.kh, o, ldo);
            break;
        }
        if (stream == KV_PLAN_K && c->pre_rope) {
            if (p.pos)
                kv_rti_rope_rows_at(rt, layer, o, ldo, len, p.pos);
            else
                kv_rti_rope_rows_layer(rt, layer, o, ldo, len, p.p0);
        }
    }
}

kv_status kv_rti_read_rows(kv_rt *rt, int seq, int layer, int stream, int h, int a, int b, float *out, size_t ldo) {
    kv_status s = kv_rti_read_prepare(rt, seq, layer, stream);
    if (s != KV_OK) return s;
    kv_rti_read_rows_ready(rt, seq, layer, stream, h, a, b, out, ldo);
    return KV_OK;
}

/* ---- the job shared by the items of one attend call ------------------------------------------------ */
typedef struct attn_job {
    kv_rt *rt;
    int layer, seq, n_q, nqv, nseg;
    int window;          /* the layer's attention window (rows are consecutive positions then), 0 = full */
    size_t hd;
    const int *nh;       /* per KV head: the rows it holds (the sequence length unless tokens were pruned) */
    const float *qv;     /* per KV head: nqv x hd scaled query vectors (vector j = row j / group, head j % group) */
    const float *hprep;  /* per KV head: nqv x hprep_floats HIGGS tables of the K codec, or NULL */
    size_t hprep_floats;
    float *part;         /* direct path: items x nqv x (hd + 2): max, sum, weighted values */
    float *out;
    size_t ldo;
    /* accumulated attention (H2O): the rows from vb[h] on (positions from the policy's acc_base) */
    const int *vb;
    float *hs;           /* direct path: per KV head nqv x (nh - vb) exponentiated scores */
    const size_t *hs_off;
} attn_job;

static int row_of(const attn_job *jb, int j) { return j / jb->rt->group; }
/* Rows of head h that query vector j may see: [0, limit). */
static int limit_of(const attn_job *jb, int h, int j) { return jb->nh[h] - jb->n_q + row_of(jb, j) + 1; }
/* The first row it may see: the window's left edge (query at p sees p - W + 1 .. p), 0 without a window. */
static int lower_of(const attn_job *jb, int h, int j) {
    const int lo = limit_of(jb, h, j) - jb->window;
    return jb->window > 0 && lo > 0 ? lo : 0;
}

/* Scores of the item's query vectors for rows [a, b) of head h into sc (row stride ld). */
static void item_scores(const attn_job *jb, int h, int a, int b, const float *qv, const float *hprep, float *sc,
                        size_t ld, float *tile) {
    const kv_rt *rt = jb->rt;
    const rt_codec *kc = rt_codec_of(rt, jb->layer, KV_PLAN_K);
    const int hd = rt->head_dim, kvd = rt->kv_dim, nqv = jb->nqv;
    rt_piece p;
    for (int v = a; v < b; v = p.b) {
        kv_rti_piece_at(rt, jb->seq, jb->layer, KV_PLAN_K, h, v, b, &p);
        float *o = sc + (v - a);
        const int len = p.b - p.a;
        if (!kc->pre_rope && p.kind == RT_PIECE_FP16) {
            kv_rti_f16_scores(p.fp + (size_t)h * hd, (size_t)kvd, len, hd, qv, nqv, o, ld);
            continue;
        }
        if (!kc->pre_rope && p.kind == RT_PIECE_BLOCK && p.codec->direct) { /* the codec reads its codes */
            p.codec->ops->scores(p.codec, p.blk, p.r0, p.r0 + len, p.kh, qv, hprep, nqv, o, ld);
            continue;
        }
        if (kc->pre_rope && p.kind == RT_PIECE_BLOCK && p.codec->ops->scores_rope && /* keys before RoPE, no tile */
            p.codec->ops->scores_rope(rt, p.codec, p.blk, p.r0, p.r0 + len, p.kh, p.p0, p.pos, qv, nqv, o, ld))
            continue;
        if (!kc->pre_rope && p.kind == RT_PIECE_RECON) {
            kv_rti_f32_scores(p.recon + (size_t)h * hd, (size_t)kvd, len, hd, qv, nqv, o, ld);
            continue;
        }
        /* anything else (keys stored before RoPE, HIGGS groups across heads): decoded tiles */
        for (int t0 = p.a; t0 < p.b; t0 += RT_TILE) {
            const int t1 = t0 + RT_TILE < p.b ? t0 + RT_TILE : p.b;
            kv_rti_read_rows_ready(rt, jb->seq, jb->layer, KV_PLAN_K, h, t0, t1, tile, (size_t)hd);
            kv_rti_f32_scores(tile, (size_t)hd, t1 - t0, hd, qv, nqv, sc + (t0 - a), ld);
        }
    }
}

/* acc (nqv x hd) += p . V over rows [a, b) of head h; racc: HIGGS rotated-domain scratch. */
static void item_values(const attn_job *jb, int h, int a, int b, const float *pr, size_t ld, float *acc, float *racc,
                        float *tile) {
    const kv_rt *rt = jb->rt;
    const rt_codec *vc = rt_codec_of(rt, jb->layer, KV_PLAN_V);
    const int hd = rt->head_dim, kvd = rt->kv_dim, nqv = jb->nqv;
    int any_rot = 0;
    rt_piece p;
    for (int v = a; v < b; v = p.b) {
        kv_rti_piece_at(rt, jb->seq, jb->layer, KV_PLAN_V, h, v, b, &p);
        const float *pp = pr + (v - a);
        const int len = p.b - p.a;
        if (p.kind == RT_PIECE_FP16) {
            kv_rti_f16_accum(p.fp + (size_t)h * hd, (size_t)kvd, len, hd, pp, ld, nqv, acc);
            continue;
        }
        if (p.kind == RT_PIECE_RECON) {
            kv_rti_f32_accum(p.recon + (size_t)h * hd, (size_t)kvd, len, hd, pp, ld, nqv, acc);
            continue;
        }
        const rt_codec *c = p.codec;
        if (c->direct && c->ops->finish) { /* accumulated in the codec's rotated domain, taken back once below */
            if (!any_rot) memset(racc, 0, (size_t)nqv * (size_t)hd * sizeof(float));
            any_rot = 1;
            c->ops->accum(c, p.blk, p.r0, p.r0 + len, p.kh, pp, ld, nqv, racc);
        } else if (c->direct) {
            c->ops->accum(c, p.blk, p.r0, p.r0 + len, p.kh, pp, ld, nqv, acc);
        } else {
            for (int t0 = p.a; t0 < p.b; t0 += RT_TILE) {
                const int t1 = t0 + RT_TILE < p.b ? t0 + RT_TILE : p.b;
                kv_rti_read_rows_ready(rt, jb->seq, jb->layer, KV_PLAN_V, h, t0, t1, tile, (size_t)hd);
                kv_rti_f32_accum(tile, (size_t)hd, t1 - t0, hd, pr + (t0 - a), ld, nqv, acc);
            }
        }
    }
    /* the head's own blocks and whole-token blocks rotate with the same signs (the head's channels) */
    if (any_rot) vc->ops->finish(vc, h, nqv, racc, acc);
}

/* Sum of n values in 8 lanes (lanes pairwise, then the tail in order). */
static float sum8(const float *x, int n) {
    float l[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int i = 0;
    for (; i + 8 <= n; i += 8)
        for (int k = 0; k < 8; k++) l[k] += x[i + k];
    float s = ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]));
    for (; i < n; i++) s += x[i];
    return s;
}

static void direct_item(void *ctx, int item, int thread) {
    const attn_job *jb = ctx;
    kv_rt *rt = jb->rt;
    /* items run segment by segment, the KV heads of a segment one after another: the heads' codes
     * share cache lines (a token's channels are contiguous across heads), so the second and third
     * head of a segment find them in cache instead of reading them from memory again */
    const int H = jb->rt->n_kv_heads, h = item % H, sgi = item / H, nqv = jb->nqv, hd = (int)jb->hd, nh = jb->nh[h];
    float *part = jb->part + ((size_t)h * (size_t)jb->nseg + (size_t)sgi) * (size_t)nqv * (size_t)(hd + 2);
    const int a = sgi * RT_SEGMENT, b = a + RT_SEGMENT < nh ? a + RT_SEGMENT : nh, len = b - a;
    /* nothing here: a head holding fewer rows than another, or a windowed layer's segment no query vector sees */
    int seen = len > 0 && jb->window == 0;
    for (int j = 0; len > 0 && j < nqv && !seen; j++) seen = lower_of(jb, h, j) < b && limit_of(jb, h, j) > a;
    if (!seen) {
        for (int j = 0; j < nqv; j++) {
            float *pj = part + (size_t)j * (size_t)(hd + 2);
            pj[0] = -INFINITY;
            pj[1] = 0.0f;
            memset(pj + 2, 0, (size_t)hd * sizeof(float));
        }
        return;
    }
    float *sc = rt->scratch[thread].buf;            /* nqv x RT_SEGMENT */
    float *acc = sc + (size_t)nqv * RT_SEGMENT;      /* nqv x hd */
    float *racc = acc + (size_t)nqv * (size_t)hd;    /* nqv x hd */
    float *tile = racc + (size_t)nqv * (size_t)hd;   /* RT_TILE x hd */
    const float *qv = jb->qv + (size_t)h * (size_t)nqv * (size_t)hd;
    const float *hprep = jb->hprep ? jb->hprep + (size_t)h * (size_t)nqv * jb->hprep_floats : NULL;
    item_scores(jb, h, a, b, qv, hprep, sc, RT_SEGMENT, tile);
    int any = 0;
    for (int j = 0; j < nqv; j++) {
        float *s = sc + (size_t)j * RT_SEGMENT;
        const int lim = limit_of(jb, h, j), valid = lim - a < len ? (lim - a > 0 ? lim - a : 0) : len;
        const int vlo = lower_of(jb, h, j) - a > 0 ? lower_of(jb, h, j) - a : 0; /* rows [vlo, valid) are seen */
        float *pj = part + (size_t)j * (size_t)(hd + 2);
        if (valid <= vlo) {
            pj[0] = -INFINITY;
            pj[1] = 0.0f;
            memset(s, 0, (size_t)len * sizeof(float));
            continue;
        }
        const float mx = kv_rti_shift_by_max(s + vlo, (size_t)(valid - vlo));
        kv_rti_exp_inplace(s + vlo, (size_t)(valid - vlo));
        for (int t = 0; t < vlo; t++) s[t] = 0.0f;
        for (int t = valid; t < len; t++) s[t] = 0.0f;
        pj[0] = mx;
        pj[1] = sum8(s + vlo, valid - vlo);
        any = 1;
    }
    if (jb->hs) { /* accumulated attention: keep the exponentiated scores of the rows from vb[h] */
        const int vb = jb->vb[h], w = nh - vb, v0 = a > vb ? a : vb;
        for (int j = 0; j < nqv && v0 < b; j++)
            memcpy(jb->hs + jb->hs_off[h] + (size_t)j * (size_t)w + (size_t)(v0 - vb), sc + (size_t)j * RT_SEGMENT + (v0 - a),
                   (size_t)(b - v0) * sizeof(float));
    }
    memset(acc, 0, (size_t)nqv * (size_t)hd * sizeof(float));
    if (any) item_values(jb, h, a, b, sc, RT_SEGMENT, acc, racc, tile);
    for (int j = 0; j < nqv; j++) memcpy(part + (size_t)j * (size_t)(hd + 2) + 2, acc + (size_t)j * (size_t)hd, (size_t)hd * sizeof(float));
}

/* Softmax statistics of query vector j of head h over its items: the maximum and the sum (double). */
static void combine_stats(const attn_job *jb, int h, int j, float *M_out, double *l_out) {
    const int nqv = jb->nqv, hd = (int)jb->hd;
    const size_t stride = (size_t)nqv * (size_t)(hd + 2);
    const float *p0 = jb->part + (size_t)h * (size_t)jb->nseg * stride + (size_t)j * (size_t)(hd + 2);
    float M = -INFINITY;
    for (int s = 0; s < jb->nseg; s++) M = p0[(size_t)s * stride] > M ? p0[(size_t)s * stride] : M;
    double l = 0.0;
    for (int s = 0; s < jb->nseg; s++) {
        const float *ps = p0 + (size_t)s * stride;
        if (ps[0] == -INFINITY) continue;
        l += exp((double)ps[0] - (double)M) * (double)ps[1];
    }
    *M_out = M;
    *l_out = l;
}

/* One query vector's result from its items' partial results, in item order. */
static void combine(const attn_job *jb, int h, int j, float *out) {
    const int nqv = jb->nqv, hd = (int)jb->hd;
    const size_t stride = (size_t)nqv * (size_t)(hd + 2);
    const float *p0 = jb->part + (size_t)h * (size_t)jb->nseg * stride + (size_t)j * (size_t)(hd + 2);
    float M;
    double l;
    combine_stats(jb, h, j, &M, &l);
    double acc[KV_RT_MAX_HEAD_DIM];
    for (int c = 0; c < hd; c++) acc[c] = 0.0;
    for (int s = 0; s < jb->nseg; s++) {
        const float *ps = p0 + (size_t)s * stride;
        if (ps[0] == -INFINITY) continue;
        const double w = exp((double)ps[0] - (double)M);
        for (int c = 0; c < hd; c++) acc[c] += w * (double)ps[2 + c];
    }
    for (int c = 0; c < hd; c++) out[c] = l > 0.0 ? (float)(acc[c] / l) : 0.0f;
}

/* Accumulated attention after a direct call: every query vector's softmax weights of the rows from
 * vb[h], added in vector order (deterministic). */
static void direct_accumulate(const attn_job *jb, float *accs, int acc_cap) {
    const int nqv = jb->nqv, hd = (int)jb->hd, H = jb->rt->n_kv_heads;
    const size_t stride = (size_t)nqv * (size_t)(hd + 2);
    for (int h = 0; h < H; h++) {
        const int vb = jb->vb[h], w = jb->nh[h] - vb;
        float *acc = accs + (size_t)h * (size_t)acc_cap;
        for (int j = 0; j < nqv && w > 0; j++) {
            float M;
            double l;
            combine_stats(jb, h, j, &M, &l);
            const float *hsj = jb->hs + jb->hs_off[h] + (size_t)j * (size_t)w;
            for (int sgi = 0; sgi < jb->nseg; sgi++) {
                const float mx = jb->part[((size_t)h * (size_t)jb->nseg + (size_t)sgi) * stride + (size_t)j * (size_t)(hd + 2)];
                const int a = sgi * RT_SEGMENT, b = a + RT_SEGMENT < jb->nh[h] ? a + RT_SEGMENT : jb->nh[h];
                const int v0 = a > vb ? a : vb;
                if (mx == -INFINITY || v0 >= b || !(l > 0.0)) continue;
                const float wt = (float)(exp((double)mx - (double)M) / l);
                for (int v = v0; v < b; v++) acc[v - vb] += hsj[v - vb] * wt;
            }
        }
    }
}

/* ---- the tiled path (many query rows) ------------------------------------------------------------- */
typedef struct tiled_job {
    attn_job base;
    int nblk;      /* query-row blocks per KV head */
    /* accumulated attention: per item the column sums of its rows' softmax weights over rows [vb, end) */
    float *col;
    size_t col_stride;
    size_t e_stride; /* per-thread scratch: exponentiated scores, nv x e_stride, then tile maxima */
} tiled_job;

static void tiled_item(void *ctx, int item, int thread) {
    const tiled_job *tj = ctx;
    const attn_job *jb = &tj->base;
    kv_rt *rt = jb->rt;
    const int h = item / tj->nblk, blk = item % tj->nblk, hd = (int)jb->hd, G = rt->group;
    const int r0 = blk * TILED_ROWS, r1 = r0 + TILED_ROWS < jb->n_q ? r0 + TILED_ROWS : jb->n_q;
    const int nv = (r1 - r0) * G; /* query vectors: row-major (row, head in group) */
    float *Q = rt->scratch[thread].buf;              /* nv x hd */
    float *O = Q + (size_t)nv * (size_t)hd;          /* nv x hd */
    float *S = O + (size_t)nv * (size_t)hd;          /* nv x RT_TILE */
    float *Kt = S + (size_t)nv * RT_TILE;            /* RT_TILE x hd */
    float *Vt = Kt + (size_t)RT_TILE * (size_t)hd;   /* RT_TILE x hd */
    float *ml = Vt + (size_t)RT_TILE * (size_t)hd;   /* nv maxima, nv sums */
    float *E = ml + 2 * (size_t)nv;                  /* accumulation: nv x e_stride scores, then nv x tiles maxima */
    const int qd = rt->n_heads * hd;
    for (int r = r0; r < r1; r++)
        for (int g = 0; g < G; g++) {
            const float *src = jb->qv + (size_t)r * (size_t)qd + (size_t)(h * G + g) * (size_t)hd;
            memcpy(Q + (size_t)((r - r0) * G + g) * (size_t)hd, src, (size_t)hd * sizeof(float));
        }
    memset(O, 0, (size_t)nv * (size_t)hd * sizeof(float));
    for (int v = 0; v < nv; v++) ml[v] = -INFINITY, ml[nv + v] = 0.0f;
    const int first_row = jb->nh[h] - jb->n_q;
    const int end = first_row + r1; /* the last row sees rows < end */
    const int vb = tj->col ? jb->vb[h] : end, ntiles = (end + RT_TILE - 1) / RT_TILE;
    float *tmax = E + (size_t)nv * tj->e_stride;     /* nv x ntiles */
    /* a windowed layer: the block's first row sees rows from its window's left edge on (no accumulation then) */
    const int W = jb->window, a0 = W > 0 && first_row + r0 + 1 - W > 0 ? first_row + r0 + 1 - W : 0;
    for (int a = a0; a < end; a += RT_TILE) {
        const int b = a + RT_TILE < end ? a + RT_TILE : end, len = b - a;
        kv_rti_read_rows_ready(rt, jb->seq, jb->layer, KV_PLAN_K, h, a, b, Kt, (size_t)hd);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, nv, len, hd, 1.0f, Q, hd, Kt, hd, 0.0f, S, RT_TILE);
        int any = 0;
        for (int v = 0; v < nv; v++) {
            float *s = S + (size_t)v * RT_TILE;
            const int lim = first_row + r0 + v / G + 1 - a;
            const int valid = lim < len ? (lim > 0 ? lim : 0) : len;
            const int vlo = W > 0 && lim - W > 0 ? lim - W : 0; /* rows [vlo, valid) of the tile are in the window */
            if (valid <= vlo) {
                memset(s, 0, (size_t)len * sizeof(float));
                if (tj->col) tmax[(size_t)v * (size_t)ntiles + (size_t)(a / RT_TILE)] = -INFINITY;
                continue;
            }
            any = 1;
            float mt = s[vlo];
            for (int t = vlo + 1; t < valid; t++) mt = s[t] > mt ? s[t] : mt;
            const float m_old = ml[v], m_new = mt > m_old ? mt : m_old;
            if (m_old != -INFINITY && m_new != m_old) {
                float corr = m_old - m_new;
                kv_rti_exp_inplace(&corr, 1);
                ml[nv + v] *= corr;
                for (int c = 0; c < hd; c++) O[(size_t)v * (size_t)hd + (size_t)c] *= corr;
            }
            ml[v] = m_new;
            for (int t = vlo; t < valid; t++) s[t] = s[t] - m_new;
            kv_rti_exp_inplace(s + vlo, (size_t)(valid - vlo));
            for (int t = 0; t < vlo; t++) s[t] = 0.0f;
            for (int t = valid; t < len; t++) s[t] = 0.0f;
            ml[nv + v] += sum8(s + vlo, valid - vlo);
            if (tj->col) tmax[(size_t)v * (size_t)ntiles + (size_t)(a / RT_TILE)] = m_new;
        }
        if (tj->col && b > vb) { /* keep the exponentiated scores of rows >= vb until the sums are final */
            const int t0 = a > vb ? a : vb;
            for (int v = 0; v < nv; v++)
                memcpy(E + (size_t)v * tj->e_stride + (size_t)(t0 - vb), S + (size_t)v * RT_TILE + (t0 - a),
                       (size_t)(b - t0) * sizeof(float));
        }
        if (!any) continue;
        kv_rti_read_rows_ready(rt, jb->seq, jb->layer, KV_PLAN_V, h, a, b, Vt, (size_t)hd);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, nv, hd, len, 1.0f, S, RT_TILE, Vt, hd, 1.0f, O, hd);
    }
    for (int r = r0; r < r1; r++)
        for (int g = 0; g < G; g++) {
            const int v = (r - r0) * G + g;
            const float inv = ml[nv + v] > 0.0f ? 1.0f / ml[nv + v] : 0.0f;
            float *dst = jb->out + (size_t)r * jb->ldo + (size_t)(h * G + g) * (size_t)hd;
            for (int c = 0; c < hd; c++) dst[c] = O[(size_t)v * (size_t)hd + (size_t)c] * inv;
        }
    if (tj->col) { /* the item's column sums of softmax weights, rows in order */
        float *col = tj->col + (size_t)item * tj->col_stride;
        memset(col, 0, tj->col_stride * sizeof(float));
        for (int v = 0; v < nv; v++) {
            if (!(ml[nv + v] > 0.0f)) continue;
            const double inv_l = 1.0 / (double)ml[nv + v];
            for (int a = (vb / RT_TILE) * RT_TILE; a < end; a += RT_TILE) {
                const float m_t = tmax[(size_t)v * (size_t)ntiles + (size_t)(a / RT_TILE)];
                if (m_t == -INFINITY) continue;
                const float w = (float)(exp((double)m_t - (double)ml[v]) * inv_l);
                const int t0 = a > vb ? a : vb, t1 = a + RT_TILE < end ? a + RT_TILE : end;
                const float *e = E + (size_t)v * tj->e_stride;
                for (int t = t0; t < t1; t++) col[t - vb] += e[t - vb] * w;
            }
        }
    }
}

/* ---- entry ------------------------------------------------------------------------------------------ */
kv_status kv_rti_attend(kv_rt *rt, int layer, int seq, int n_q, const float *q, size_t ldq, float *out, size_t ldo) {
    const int hd = rt->head_dim, G = rt->group, H = rt->n_kv_heads;
    kv_status s;
    /* everything that allocates or is shared happens here, before the parallel part */
    if ((s = kv_rti_read_prepare(rt, seq, layer, KV_PLAN_K)) != KV_OK) return s;
    if ((s = kv_rti_read_prepare(rt, seq, layer, KV_PLAN_V)) != KV_OK) return s;
    rt_pstate *ps = &rt->seqs[seq].ps[layer];
    const int accumulate = kv_rti_policy_accumulates(rt, seq, layer);
    int *nh = malloc((size_t)H * 2 * sizeof(int));
    size_t *hs_off = malloc((size_t)(H + 1) * sizeof(size_t));
    if (!nh || !hs_off) {
        free(nh), free(hs_off);
        return KV_ERR(KV_ENOMEM, "runtime: out of memory for attention");
    }
    int *vb = nh + H, nmax = 0, wmax = 0;
    for (int h = 0; h < H; h++) {
        nh[h] = kv_rti_head_rows(rt, seq, layer, h);
        nmax = nh[h] > nmax ? nh[h] : nmax;
        /* the rows of the positions the policy scores, [acc_base, n): after the sinks and the head's kept rows */
        vb[h] = nh[h] - ps->acc_n;
        wmax = ps->acc_n > wmax ? ps->acc_n : wmax;
    }
    attn_job jb;
    memset(&jb, 0, sizeof jb);
    jb.rt = rt, jb.layer = layer, jb.seq = seq, jb.n_q = n_q, jb.hd = (size_t)hd, jb.nh = nh, jb.vb = vb;
    jb.window = rt->win[layer];
    jb.out = out, jb.ldo = ldo;
    const int qd = rt->n_heads * hd;
    float *qv = NULL, *hprep = NULL, *part = NULL, *hs = NULL, *col = NULL;
    if (n_q > RT_DIRECT_MAX_ROWS) {
        /* tiled: scaled queries in row-major order, one item per (KV head, block of rows) */
        tiled_job tj;
        memset(&tj, 0, sizeof tj);
        tj.base = jb;
        tj.nblk = (n_q + TILED_ROWS - 1) / TILED_ROWS;
        const int nv = TILED_ROWS * G;
        size_t need = 2 * (size_t)nv * (size_t)hd + (size_t)nv * RT_TILE + 2 * (size_t)RT_TILE * (size_t)hd + 2 * (size_t)nv;
        if (accumulate) {
            tj.e_stride = (size_t)wmax;
            tj.col_stride = (size_t)wmax;
            need += (size_t)nv * tj.e_stride + (size_t)nv * (size_t)((nmax + RT_TILE - 1) / RT_TILE);
            col = kv_aligned_alloc(64, (size_t)H * (size_t)tj.nblk * tj.col_stride * sizeof(float) + 64);
            if (!col) {
                s = KV_ERR(KV_ENOMEM, "runtime: out of memory for accumulated attention");
                goto done;
            }
            tj.col = col;
        }
        qv = kv_aligned_alloc(64, (size_t)n_q * (size_t)qd * sizeof(float));
        if (!qv) {
            s = KV_ERR(KV_ENOMEM, "runtime: out of memory for %d query rows", n_q);
            goto done;
        }
        for (int r = 0; r < n_q; r++)
            for (int c = 0; c < qd; c++) qv[(size_t)r * (size_t)qd + (size_t)c] = q[(size_t)r * ldq + (size_t)c] * rt->scale;
        for (int t = 0; t < rt->n_threads; t++)
            if ((s = kv_rti_scratch_reserve(&rt->scratch[t], need)) != KV_OK) goto done;
        tj.base.qv = qv;
        /* each pool thread calls the BLAS on its own: keep the BLAS single-threaded meanwhile */
        const int blas_threads = kv_rti_blas_threads_begin();
        kv_pool_run(rt->pool, H * tj.nblk, tiled_item, &tj);
        kv_rti_blas_threads_end(blas_threads);
        if (accumulate) /* items in a fixed order: the same sums for any thread count */
            for (int h = 0; h < H; h++) {
                float *acc = ps->acc + (size_t)h * (size_t)ps->acc_cap;
                for (int b = 0; b < tj.nblk; b++) {
                    const int r1 = (b + 1) * TILED_ROWS < n_q ? (b + 1) * TILED_ROWS : n_q;
                    const int end = nh[h] - n_q + r1;
                    const float *cb = col + (size_t)(h * tj.nblk + b) * tj.col_stride;
                    for (int v = vb[h]; v < end; v++) acc[v - vb[h]] += cb[v - vb[h]];
                }
            }
        goto done;
    }
    /* direct: per KV head its query vectors (row-major: row, then head of the group) */
    jb.nqv = n_q * G;
    jb.nseg = (nmax + RT_SEGMENT - 1) / RT_SEGMENT;
    qv = kv_aligned_alloc(64, (size_t)H * (size_t)jb.nqv * (size_t)hd * sizeof(float));
    part = kv_aligned_alloc(64, (size_t)H * (size_t)jb.nseg * (size_t)jb.nqv * (size_t)(hd + 2) * sizeof(float));
    if (!qv || !part) {
        s = KV_ERR(KV_ENOMEM, "runtime: out of memory for attention");
        goto done;
    }
    if (accumulate) {
        hs_off[0] = 0;
        for (int h = 0; h < H; h++) hs_off[h + 1] = hs_off[h] + (size_t)jb.nqv * (size_t)(nh[h] - vb[h]);
        hs = kv_aligned_alloc(64, (hs_off[H] ? hs_off[H] : 1) * sizeof(float));
        if (!hs) {
            s = KV_ERR(KV_ENOMEM, "runtime: out of memory for accumulated attention");
            goto done;
        }
        jb.hs = hs, jb.hs_off = hs_off;
    }
    for (int h = 0; h < H; h++)
        for (int j = 0; j < jb.nqv; j++) {
            const float *src = q + (size_t)(j / G) * ldq + (size_t)(h * G + j % G) * (size_t)hd;
            float *dst = qv + ((size_t)h * (size_t)jb.nqv + (size_t)j) * (size_t)hd;
            for (int c = 0; c < hd; c++) dst[c] = src[c] * rt->scale;
        }
    const rt_codec *kc = rt_codec_of(rt, layer, KV_PLAN_K);
    if (kc->ops->prep_floats && kc->direct && !kc->pre_rope && !kc->pred) { /* tables per query vector */
        jb.hprep_floats = kc->ops->prep_floats(kc);
        hprep = kv_aligned_alloc(64, (size_t)H * (size_t)jb.nqv * jb.hprep_floats * sizeof(float));
        if (!hprep) {
            s = KV_ERR(KV_ENOMEM, "runtime: out of memory for HIGGS query tables");
            goto done;
        }
        for (int h = 0; h < H; h++)
            for (int j = 0; j < jb.nqv; j++)
                kc->ops->prepare(kc, h, qv + ((size_t)h * (size_t)jb.nqv + (size_t)j) * (size_t)hd,
                                 hprep + ((size_t)h * (size_t)jb.nqv + (size_t)j) * jb.hprep_floats);
    }
    const size_t need = (size_t)jb.nqv * RT_SEGMENT + 2 * (size_t)jb.nqv * (size_t)hd + (size_t)RT_TILE * (size_t)hd;
    for (int t = 0; t < rt->n_threads; t++)
        if ((s = kv_rti_scratch_reserve(&rt->scratch[t], need)) != KV_OK) goto done;
    jb.qv = qv, jb.hprep = hprep, jb.part = part;
    kv_pool_run(rt->pool, H * jb.nseg, direct_item, &jb);
    for (int h = 0; h < H; h++)
        for (int j = 0; j < jb.nqv; j++)
            combine(&jb, h, j, out + (size_t)(j / G) * ldo + (size_t)(h * G + j % G) * (size_t)hd);
    if (accumulate) direct_accumulate(&jb, ps->acc, ps->acc_cap);
done:
    kv_aligned_free(qv);
    kv_aligned_free(hprep);
    kv_aligned_free(part);
    kv_aligned_free(hs);
    kv_aligned_free(col);
    free(nh);
    free(hs_off);
    return s;
}
