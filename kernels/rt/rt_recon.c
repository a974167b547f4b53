/* rt_recon.c — the reconstruction working set of streams with AQUA-KV predictors (RUNTIME.md §6).
 *
 * A predicted stream stores only the quantized residual r of Y - f(X), where X are the previous
 * layers' *reconstructions* of the same tokens: Y_hat = f(X_hat) + r_hat. Reading such a stream
 * therefore needs the reconstructions of its inputs, which need theirs, down to a stream without a
 * predictor. The runtime follows aquakv.txt Algorithm 4: at each step, when a layer is attended,
 * the reconstruction of each of its predicted streams is rebuilt for every compressed token, chunk
 * by chunk, from the inputs' reconstructions (kept from the layers just attended), and released as
 * soon as no later layer of the step reads it. So at most the reconstructions that a predictor
 * still needs are held (two layers for AQUA-KV's f_k: K(l-1) -> K(l), f_v: [V(l-1); K(l)] -> V(l)),
 * never the whole decoded cache; the price is O(tokens x kv_dim x in_dim) multiply-adds per layer
 * and step (RUNTIME.md §6 gives the numbers and the options measured).
 *
 * Every chunk is predicted with kv_predictor_apply on exactly the rows it was compressed with
 * (one block = one call of the same size), so a reconstruction equals, bit for bit, the one the
 * encoder formed when it quantized the residual.
 *
 * Low-rank predictors (W = L R, rank r: plan 1.3) are applied as their factors, z = R x then L z
 * (r (d_in + d) multiply-adds per token instead of d d_in: 3.6x fewer for AQUA-KV's V at r = 32 on
 * SmolLM2), to chunks that every predicted stream of the sequence has compressed: no encoder reads
 * their reconstruction again, so the codes it writes do not change; the reconstruction is the same map
 * summed in another order (within float rounding of the dense product's, RUNTIME.md §6). A chunk that
 * some predicted stream has still to compress is rebuilt with the dense W, as before, in every stream,
 * so what an encoder reads is the bits it always read. */
#include "kvrt.h"
#include "rt_dev.h"
#include "rt_internal.h"

#include <cblas.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

void kv_rti_recon_free(kv_rt *rt, rt_recon *r) {
    if (!r) return;
    if (rt->dv) {
        kv_rti_dev_recon_free(rt, r);
        return;
    }
    kv_aligned_free(r->x);
    memset(r, 0, sizeof *r);
}

static kv_status recon_reserve(kv_rt *rt, rt_recon *r, int rows) {
    if (rows <= r->cap) return KV_OK;
    int cap = r->cap ? r->cap : 256;
    while (cap < rows) cap *= 2;
    float *x = kv_aligned_alloc(64, (size_t)cap * (size_t)rt->kv_dim * sizeof(float));
    if (!x) return KV_ERR(KV_ENOMEM, "runtime: out of memory for a reconstruction of %d tokens", rows);
    if (r->rows) memcpy(x, r->x, (size_t)r->rows * (size_t)rt->kv_dim * sizeof(float));
    kv_aligned_free(r->x);
    r->x = x;
    r->cap = cap;
    return KV_OK;
}

kv_status kv_rti_recon_inputs(kv_rt *rt, int seq, int layer, int stream, int t0, const float **inputs) {
    const rt_codec *c = rt_codec_of(rt, layer, stream);
    const kv_plan_predictor *pr = c->pred;
    for (int i = 0; i < pr->n_inputs; i++) {
        const int il = pr->inputs[i].layer, is = pr->inputs[i].stream;
        kv_status s = kv_rti_recon_ensure(rt, seq, il, is);
        if (s != KV_OK) return s;
        const rt_recon *r = &rt->seqs[seq].recon[il * 2 + is];
        inputs[i] = r->x + (size_t)(t0 - rt->sinks) * (size_t)rt->kv_dim;
    }
    return KV_OK;
}

/* Work items of a rebuild: runs of consecutive blocks. A block some encoder may still read is a run of its own,
 * predicted by one call of exactly its rows (the bits the encoder formed); settled blocks of a low-rank predictor
 * go in runs of several blocks, predicted from the factors by one call per run (fewer, larger products). */
typedef struct recon_run {
    int b0, nb;    /* blocks b0 .. b0 + nb - 1 of the stream */
    int factored;
} recon_run;

typedef struct recon_job {
    kv_rt *rt;
    int seq, layer, stream;
    rt_recon *r;
    const float *in[KV_PLAN_MAX_PRED_INPUTS]; /* the inputs' reconstructions, row 0 = token sinks */
    const recon_run *runs;
    size_t zoff;                    /* scratch: a block's residual, then from zoff the factored product's z */
    kv_status status;
} recon_job;

/* Tokens [sinks, end) that every predicted stream of the sequence has compressed: no encoder reads their
 * reconstructions any more. */
static int settled_end(const kv_rt *rt, int seq) {
    int end = INT32_MAX;
    for (int i = 0; i < rt->n_layers * 2; i++)
        if (rt->codec[i].pred) {
            const int ce = rt->seqs[seq].st[i].comp_end;
            end = ce < end ? ce : end;
        }
    return end;
}

/* y[t] = W [x_0[t]; x_1[t]; ...] + b for a low-rank W = L R, as its factors: z = sum_i x_i R_i^T (R_i: R's columns
 * of input i), then y = b + z L^T. z: tokens x rank floats of scratch. */
static void predict_factored(float *y, const kv_plan_predictor *pr, const float *const *inputs, size_t tokens,
                             int kv_dim, float *z) {
    const int r = pr->rank;
    for (int i = 0; i < pr->n_inputs; i++)
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)tokens, r, kv_dim, 1.0f, inputs[i], kv_dim,
                    pr->right + (size_t)i * (size_t)kv_dim, pr->in_dim, i ? 1.0f : 0.0f, z, r);
    for (size_t t = 0; t < tokens; t++) memcpy(y + t * (size_t)kv_dim, pr->bias, sizeof(float) * (size_t)kv_dim);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)tokens, kv_dim, r, 1.0f, z, r, pr->left, r, 1.0f, y,
                kv_dim);
}

static void recon_run_item(void *ctx, int item, int thread) {
    recon_job *jb = ctx;
    kv_rt *rt = jb->rt;
    const recon_run *run = &jb->runs[item];
    const rt_stream *st = rt_stream_of(rt, jb->seq, jb->layer, jb->stream);
    const rt_codec *c = rt_codec_of(rt, jb->layer, jb->stream);
    const rt_block *b0 = &st->blocks[run->b0], *bl = &st->blocks[run->b0 + run->nb - 1];
    const size_t kvd = (size_t)rt->kv_dim, row0 = (size_t)(b0->t0 - rt->sinks);
    const size_t rows = (size_t)(bl->t0 + bl->m - b0->t0);
    float *dst = jb->r->x + row0 * kvd;
    float *tmp = rt->scratch[thread].buf; /* reserved by kv_rti_recon_ensure: a block, then z */
    kv_status s = KV_OK;
    if (c->pred) {
        const float *inputs[KV_PLAN_MAX_PRED_INPUTS];
        for (int i = 0; i < c->pred->n_inputs; i++) inputs[i] = jb->in[i] + row0 * kvd;
        if (run->factored)
            predict_factored(dst, c->pred, inputs, rows, rt->kv_dim, tmp + jb->zoff);
        else
            s = kv_predictor_apply(dst, c->pred, inputs, rows, rt->kv_dim);
    }
    for (int k = 0; s == KV_OK && k < run->nb; k++) {
        const rt_block *blk = &st->blocks[run->b0 + k];
        float *d = jb->r->x + (size_t)(blk->t0 - rt->sinks) * kvd;
        if (!c->pred) {
            s = kv_rti_codec_decode(c, blk, d);
            continue;
        }
        if ((s = kv_rti_codec_decode(c, blk, tmp)) != KV_OK) break;
        const size_t n = (size_t)blk->m * kvd;
        for (size_t i = 0; i < n; i++) d[i] = d[i] + tmp[i];
    }
    if (s != KV_OK) __atomic_store_n(&jb->status, s, __ATOMIC_RELAXED);
}

kv_status kv_rti_recon_ensure(kv_rt *rt, int seq, int layer, int stream) {
    if (rt->dv) return kv_rti_dev_recon_ensure(rt, seq, layer, stream);
    rt_recon *r = &rt->seqs[seq].recon[layer * 2 + stream];
    const rt_stream *st = rt_stream_of(rt, seq, layer, stream);
    const rt_codec *c = rt_codec_of(rt, layer, stream);
    const int target = st->comp_end - rt->sinks;
    if (target <= r->rows) return KV_OK;
    kv_status s = recon_reserve(rt, r, target);
    if (s != KV_OK) return s;
    recon_job jb;
    memset(&jb, 0, sizeof jb);
    jb.rt = rt, jb.seq = seq, jb.layer = layer, jb.stream = stream, jb.r = r;
    /* blocks are consecutive chunks: the ones after the rows already reconstructed */
    int first = st->n_blocks, max_m = 0;
    for (int b = 0; b < st->n_blocks; b++)
        if (st->blocks[b].t0 - rt->sinks >= r->rows) {
            first = b < first ? b : first;
            max_m = st->blocks[b].m > max_m ? st->blocks[b].m : max_m;
        }
    const int nbl = st->n_blocks - first;
    const int low_rank = c->pred && c->pred->rank >= 1;
    const int sett = c->pred ? settled_end(rt, seq) : 0;
    /* settled blocks of a low-rank predictor: up to 2 runs per thread of about equal rows; others one per block */
    int n_sett = 0;
    while (low_rank && n_sett < nbl && st->blocks[first + n_sett].t0 + st->blocks[first + n_sett].m <= sett) n_sett++;
    const int per_run = n_sett ? (n_sett + 2 * rt->n_threads - 1) / (2 * rt->n_threads) : 1;
    recon_run *runs = malloc((size_t)(nbl ? nbl : 1) * sizeof *runs);
    if (!runs) return KV_ERR(KV_ENOMEM, "runtime: out of memory for a reconstruction");
    int n_runs = 0, max_rows = 0;
    for (int b = 0; b < nbl;) {
        const int nb = b < n_sett ? (n_sett - b < per_run ? n_sett - b : per_run) : 1;
        runs[n_runs++] = (recon_run){first + b, nb, b < n_sett};
        const int rows = st->blocks[first + b + nb - 1].t0 + st->blocks[first + b + nb - 1].m - st->blocks[first + b].t0;
        max_rows = rows > max_rows ? rows : max_rows;
        b += nb;
    }
    jb.runs = runs;
    if (c->pred) {
        /* the inputs first (recursively), serially: they must cover every block here */
        for (int i = 0; i < c->pred->n_inputs; i++) {
            const int il = c->pred->inputs[i].layer, is = c->pred->inputs[i].stream;
            const rt_stream *in = rt_stream_of(rt, seq, il, is);
            if (in->comp_end < st->comp_end) {
                free(runs);
                return KV_ERR(KV_EINVAL, "runtime: layer %d %s predicts from layer %d %s, which has not compressed "
                              "tokens %d..%d yet (layers must be appended in order)", layer, stream ? "V" : "K", il,
                              is ? "V" : "K", in->comp_end, st->comp_end - 1);
            }
            if ((s = kv_rti_recon_ensure(rt, seq, il, is)) != KV_OK) {
                free(runs);
                return s;
            }
            jb.in[i] = rt->seqs[seq].recon[il * 2 + is].x;
        }
        const size_t zf = low_rank ? (size_t)max_rows * (size_t)c->pred->rank : 0;
        jb.zoff = (size_t)max_m * (size_t)rt->kv_dim;
        for (int t = 0; t < rt->n_threads; t++)
            if ((s = kv_rti_scratch_reserve(&rt->scratch[t], jb.zoff + zf)) != KV_OK) {
                free(runs);
                return s;
            }
    }
    /* runs in parallel, each predicted by single-threaded GEMM calls */
    const int blas_threads = kv_rti_blas_threads_begin();
    kv_pool_run(rt->pool, n_runs, recon_run_item, &jb);
    kv_rti_blas_threads_end(blas_threads);
    free(runs);
    if (jb.status != KV_OK)
        return KV_ERR(jb.status, "runtime: reconstructing layer %d %s failed (%s)", layer, stream ? "V" : "K",
                      kv_status_name(jb.status));
    r->rows = target;
    return KV_OK;
}

void kv_rti_recon_release(kv_rt *rt, int seq, int layer) {
    if (rt->opt.keep_reconstructions) return; /* kept, and extended chunk by chunk as tokens are compressed */
    rt_seq *sq = &rt->seqs[seq];
    for (int i = 0; i < rt->n_layers * 2; i++)
        if (sq->recon[i].x && rt->recon_last_use[i] <= layer) kv_rti_recon_free(rt, &sq->recon[i]);
}
