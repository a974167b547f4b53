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
 * encoder formed when it quantized the residual. */
#include "kvrt.h"
#include "rt_dev.h"
#include "rt_internal.h"

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

/* One block's reconstruction: the prediction from the inputs' rows plus the decoded residual. */
typedef struct recon_job {
    kv_rt *rt;
    int seq, layer, stream, first; /* blocks first.. of the stream */
    rt_recon *r;
    const float *in[KV_PLAN_MAX_PRED_INPUTS]; /* the inputs' reconstructions, row 0 = token sinks */
    kv_status status;
} recon_job;

static void recon_block(void *ctx, int item, int thread) {
    recon_job *jb = ctx;
    kv_rt *rt = jb->rt;
    const rt_stream *st = rt_stream_of(rt, jb->seq, jb->layer, jb->stream);
    const rt_codec *c = rt_codec_of(rt, jb->layer, jb->stream);
    const rt_block *blk = &st->blocks[jb->first + item];
    const size_t kvd = (size_t)rt->kv_dim, row0 = (size_t)(blk->t0 - rt->sinks);
    float *dst = jb->r->x + row0 * kvd;
    kv_status s;
    if (!c->pred) {
        s = kv_rti_codec_decode(c, blk, dst);
    } else {
        const float *inputs[KV_PLAN_MAX_PRED_INPUTS];
        for (int i = 0; i < c->pred->n_inputs; i++) inputs[i] = jb->in[i] + row0 * kvd;
        float *tmp = rt->scratch[thread].buf; /* reserved for a block by kv_rti_recon_ensure */
        s = kv_predictor_apply(dst, c->pred, inputs, (size_t)blk->m, rt->kv_dim);
        if (s == KV_OK) s = kv_rti_codec_decode(c, blk, tmp);
        const size_t n = (size_t)blk->m * kvd;
        for (size_t i = 0; s == KV_OK && i < n; i++) dst[i] = dst[i] + tmp[i];
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
    jb.first = st->n_blocks;
    int max_m = 0;
    for (int b = 0; b < st->n_blocks; b++)
        if (st->blocks[b].t0 - rt->sinks >= r->rows) {
            jb.first = b < jb.first ? b : jb.first;
            max_m = st->blocks[b].m > max_m ? st->blocks[b].m : max_m;
        }
    if (c->pred) {
        /* the inputs first (recursively), serially: they must cover every block here */
        for (int i = 0; i < c->pred->n_inputs; i++) {
            const int il = c->pred->inputs[i].layer, is = c->pred->inputs[i].stream;
            const rt_stream *in = rt_stream_of(rt, seq, il, is);
            if (in->comp_end < st->comp_end)
                return KV_ERR(KV_EINVAL, "runtime: layer %d %s predicts from layer %d %s, which has not compressed "
                              "tokens %d..%d yet (layers must be appended in order)", layer, stream ? "V" : "K", il,
                              is ? "V" : "K", in->comp_end, st->comp_end - 1);
            if ((s = kv_rti_recon_ensure(rt, seq, il, is)) != KV_OK) return s;
            jb.in[i] = rt->seqs[seq].recon[il * 2 + is].x;
        }
        for (int t = 0; t < rt->n_threads; t++)
            if ((s = kv_rti_scratch_reserve(&rt->scratch[t], (size_t)max_m * (size_t)rt->kv_dim)) != KV_OK) return s;
    }
    /* blocks in parallel, each predicted by one single-threaded GEMM call of exactly its rows */
    const int blas_threads = kv_rti_blas_threads_begin();
    kv_pool_run(rt->pool, st->n_blocks - jb.first, recon_block, &jb);
    kv_rti_blas_threads_end(blas_threads);
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
