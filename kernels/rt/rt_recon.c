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
#include "rt_internal.h"

#include <stdlib.h>
#include <string.h>

void rt_recon_free(rt_recon *r) {
    if (!r) return;
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

kv_status rt_recon_inputs(kv_rt *rt, int seq, int layer, int stream, int t0, const float **inputs) {
    const rt_codec *c = rt_codec_of(rt, layer, stream);
    const kv_plan_predictor *pr = c->pred;
    for (int i = 0; i < pr->n_inputs; i++) {
        const int il = pr->inputs[i].layer, is = pr->inputs[i].stream;
        kv_status s = rt_recon_ensure(rt, seq, il, is);
        if (s != KV_OK) return s;
        const rt_recon *r = &rt->seqs[seq].recon[il * 2 + is];
        inputs[i] = r->x + (size_t)(t0 - rt->sinks) * (size_t)rt->kv_dim;
    }
    return KV_OK;
}

kv_status rt_recon_ensure(kv_rt *rt, int seq, int layer, int stream) {
    rt_recon *r = &rt->seqs[seq].recon[layer * 2 + stream];
    const rt_stream *st = rt_stream_of(rt, seq, layer, stream);
    const rt_codec *c = rt_codec_of(rt, layer, stream);
    const int target = st->comp_end - rt->sinks;
    if (target <= r->rows) return KV_OK;
    kv_status s = recon_reserve(rt, r, target);
    if (s != KV_OK) return s;
    const size_t kvd = (size_t)rt->kv_dim;
    float *tmp = NULL;
    int tmp_rows = 0;
    /* blocks are consecutive chunks: the ones after the rows already reconstructed */
    for (int b = 0; b < st->n_blocks; b++) {
        const rt_block *blk = &st->blocks[b];
        const int row0 = blk->t0 - rt->sinks;
        if (row0 < r->rows) continue;
        float *dst = r->x + (size_t)row0 * kvd;
        if (!c->pred) {
            if ((s = rt_codec_decode(c, blk->data, blk->m, dst)) != KV_OK) goto done;
            continue;
        }
        /* a block's predictor inputs must already be compressed in their own streams */
        for (int i = 0; i < c->pred->n_inputs; i++) {
            const rt_stream *in = rt_stream_of(rt, seq, c->pred->inputs[i].layer, c->pred->inputs[i].stream);
            if (in->comp_end < blk->t0 + blk->m) {
                s = KV_ERR(KV_EINVAL, "runtime: layer %d %s predicts from layer %d %s, which has not compressed "
                           "tokens %d..%d yet (layers must be appended in order)", layer, stream ? "V" : "K",
                           c->pred->inputs[i].layer, c->pred->inputs[i].stream ? "V" : "K", blk->t0,
                           blk->t0 + blk->m - 1);
                goto done;
            }
        }
        const float *inputs[KV_PLAN_MAX_PRED_INPUTS];
        if ((s = rt_recon_inputs(rt, seq, layer, stream, blk->t0, inputs)) != KV_OK) goto done;
        if (blk->m > tmp_rows) {
            kv_aligned_free(tmp);
            tmp_rows = blk->m;
            if (!(tmp = kv_aligned_alloc(64, (size_t)tmp_rows * kvd * sizeof(float)))) {
                s = KV_ERR(KV_ENOMEM, "runtime: out of memory");
                goto done;
            }
        }
        if ((s = kv_predictor_apply(dst, c->pred, inputs, (size_t)blk->m, rt->kv_dim)) != KV_OK) goto done;
        if ((s = rt_codec_decode(c, blk->data, blk->m, tmp)) != KV_OK) goto done;
        const size_t n = (size_t)blk->m * kvd;
        for (size_t i = 0; i < n; i++) dst[i] = dst[i] + tmp[i];
    }
    r->rows = target;
done:
    kv_aligned_free(tmp);
    return s;
}

void rt_recon_release(kv_rt *rt, int seq, int layer) {
    if (rt->opt.keep_reconstructions) return; /* kept, and extended chunk by chunk as tokens are compressed */
    rt_seq *sq = &rt->seqs[seq];
    for (int i = 0; i < rt->n_layers * 2; i++)
        if (sq->recon[i].x && rt->recon_last_use[i] <= layer) rt_recon_free(&sq->recon[i]);
}
