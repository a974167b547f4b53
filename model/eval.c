/* eval.c — perplexity of the uncompressed model over a tokenized text, in two protocols:
 *   all:       consecutive chunks of ctx-1 tokens, each prefixed with BOS, every prediction scored;
 *   llama.cpp: llama.cpp's perplexity tool (chunks of ctx tokens, the first replaced by BOS when the
 *              vocabulary adds BOS, predictions of the second half scored: positions ctx/2 .. ctx-2). */
#include "forward_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define LOGIT_ROWS 128 /* output rows computed at a time (bounds the logits buffer: 128 x vocab floats) */

double kv_nll_of(const float *logits, int n_vocab, int target) {
    float mx = logits[0];
    for (int i = 1; i < n_vocab; i++) mx = logits[i] > mx ? logits[i] : mx;
    double sum = 0.0;
    for (int i = 0; i < n_vocab; i++) sum += expf(logits[i] - mx);
    return -((double)(logits[target] - mx) - log(sum));
}

/* NLL of each scored row (rows r0 + i of the batch's scored positions): kv_model_for_rows. */
typedef struct nll_job {
    const float *logits;
    int V;
    double *out;
    const int32_t *tgt;
    size_t r0, n_score, first, ctx;
} nll_job;

static void nll_range(void *ctx, size_t i0, size_t i1, int thread) {
    (void)thread;
    const nll_job *jb = ctx;
    for (size_t i = i0; i < i1; i++) {
        const size_t r = jb->r0 + i, b = r / jb->n_score, t = jb->first + r % jb->n_score;
        jb->out[i] = kv_nll_of(jb->logits + i * (size_t)jb->V, jb->V, jb->tgt[b * jb->ctx + t]);
    }
}

kv_status kv_eval_perplexity(kv_ppl_result *out, kv_model *m, const int32_t *tokens, size_t n_tokens,
                             const kv_ppl_options *opt) {
    if (!m || !opt || !out || (!tokens && n_tokens)) return KV_ERR(KV_EINVAL, "kv_eval_perplexity: NULL argument");
    memset(out, 0, sizeof *out);
    const int ctx = opt->ctx, V = m->arch.vocab_size, d = m->arch.d_model;
    const int all = opt->protocol == KV_PPL_ALL;
    if (opt->protocol != KV_PPL_ALL && opt->protocol != KV_PPL_LLAMACPP)
        return KV_ERR(KV_EINVAL, "unknown perplexity protocol %d", (int)opt->protocol);
    if (ctx < (all ? 2 : 4) || ctx > (1 << 24))
        return KV_ERR(KV_EINVAL, "context %d is too small for protocol %s", ctx, all ? "all" : "llama.cpp");
    if (all && opt->bos_id < 0)
        return KV_ERR(KV_EINVAL, "protocol 'all' prefixes every chunk with BOS, and this vocabulary has none");
    if (opt->bos_id >= V) return KV_ERR(KV_EINVAL, "BOS id %d outside the vocabulary (%d)", opt->bos_id, V);
    const size_t stride = all ? (size_t)ctx - 1 : (size_t)ctx; /* text tokens consumed per chunk */
    size_t n_chunks = n_tokens / stride;
    if (opt->max_chunks && n_chunks > opt->max_chunks) n_chunks = opt->max_chunks;
    if (n_chunks == 0)
        return KV_ERR(KV_EINVAL, "the text has %zu tokens, fewer than one chunk of %zu", n_tokens, stride);
    const int first = all ? 0 : ctx / 2;         /* first scored position within a chunk */
    const int n_score = ctx - 1 - first;        /* positions first .. ctx-2 */
    const int batch = opt->batch > 0 ? opt->batch : 1;

    kv_status s = KV_OK;
    kv_progress prog;
    memset(&prog, 0, sizeof prog); /* inactive until begun; kv_progress_end is then a no-op */
    int32_t *inp = malloc((size_t)batch * ctx * sizeof(int32_t));
    int32_t *tgt = malloc((size_t)batch * ctx * sizeof(int32_t));
    float *hidden = kv_aligned_alloc(64, (size_t)batch * ctx * d * sizeof(float));
    float *rows_h = kv_aligned_alloc(64, (size_t)LOGIT_ROWS * d * sizeof(float));
    float *logits = kv_aligned_alloc(64, (size_t)LOGIT_ROWS * V * sizeof(float));
    double *nll_rows = malloc((size_t)LOGIT_ROWS * sizeof(double));
    if (!inp || !tgt || !hidden || !rows_h || !logits || !nll_rows) {
        s = KV_ERR(KV_ENOMEM, "out of memory for perplexity batches of %d x %d tokens", batch, ctx);
        goto done;
    }
    if (opt->progress_label) kv_progress_begin(&prog, opt->progress_label, "tok", (double)(n_chunks * ctx));
    double nll_sum = 0.0;
    size_t scored = 0;
    const double t0 = kv_now_seconds();
    for (size_t c0 = 0; c0 < n_chunks; c0 += (size_t)batch) {
        const int nb = (int)(n_chunks - c0 < (size_t)batch ? n_chunks - c0 : (size_t)batch);
        for (int b = 0; b < nb; b++) {
            const int32_t *src = tokens + (c0 + b) * stride;
            int32_t *in = inp + (size_t)b * ctx, *tg = tgt + (size_t)b * ctx;
            if (all) {
                in[0] = opt->bos_id;
                memcpy(in + 1, src, (size_t)(ctx - 1) * sizeof(int32_t));
                memcpy(tg, src, (size_t)(ctx - 1) * sizeof(int32_t)); /* position i predicts src[i] */
            } else {
                memcpy(in, src, (size_t)ctx * sizeof(int32_t));
                if (opt->bos_id >= 0) in[0] = opt->bos_id;
                memcpy(tg, src + 1, (size_t)(ctx - 1) * sizeof(int32_t)); /* position i predicts src[i+1] */
            }
        }
        kv_forward f;
        memset(&f, 0, sizeof f);
        f.tokens = inp;
        f.n_seqs = nb;
        f.n_tokens = ctx;
        f.hidden = hidden;
        if ((s = kv_model_forward(m, &f)) != KV_OK) goto done;
        /* Score the rows (b, first .. ctx-2) in blocks; sums in a fixed order. */
        const size_t total_rows = (size_t)nb * n_score;
        for (size_t r0 = 0; r0 < total_rows; r0 += LOGIT_ROWS) {
            const int nr = (int)(total_rows - r0 < LOGIT_ROWS ? total_rows - r0 : LOGIT_ROWS);
            for (int i = 0; i < nr; i++) {
                const size_t r = r0 + i, b = r / n_score, t = first + r % n_score;
                memcpy(rows_h + (size_t)i * d, hidden + (b * ctx + t) * d, (size_t)d * sizeof(float));
            }
            if ((s = kv_model_logits(m, rows_h, (size_t)nr, logits)) != KV_OK) goto done;
            nll_job nj = {logits, V, nll_rows, tgt, r0, (size_t)n_score, (size_t)first, (size_t)ctx};
            kv_model_for_rows(m, (size_t)nr, (size_t)nr * (size_t)V * 8, nll_range, &nj);
            for (int i = 0; i < nr; i++) nll_sum += nll_rows[i];
            scored += (size_t)nr;
        }
        if (opt->progress_label) kv_progress_update(&prog, (double)((c0 + nb) * ctx));
    }
    out->seconds = kv_now_seconds() - t0;
    kv_progress_end(&prog);
    out->n_chunks = n_chunks;
    out->tokens_total = n_tokens;
    out->tokens_evaluated = n_chunks * (size_t)ctx;
    out->tokens_scored = scored;
    out->nll_mean = nll_sum / (double)scored;
    out->ppl = exp(out->nll_mean);
    out->tokens_per_second = out->seconds > 0 ? (double)out->tokens_evaluated / out->seconds : 0.0;
    if (!isfinite(out->nll_mean)) s = KV_ERR(KV_ENUMERIC, "perplexity is not finite (NLL mean %g)", out->nll_mean);
done:
    kv_progress_end(&prog); /* after an error: finish the line */
    free(inp);
    free(tgt);
    kv_aligned_free(hidden);
    kv_aligned_free(rows_h);
    kv_aligned_free(logits);
    free(nll_rows);
    return s;
}
