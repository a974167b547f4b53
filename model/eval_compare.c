/* eval_compare.c — the cost of a KV cache in quality: the same chunks of a text run through the
 * model twice, once with exact attention (one prefill per chunk) and once through the given cache
 * in steps (as a decoder would feed it), and every prediction is compared: perplexity of both, mean
 * KL(P_exact || P_cache) and top-1 agreement. Protocol: chunks of ctx-1 text tokens, each prefixed
 * with BOS, every prediction scored (protocol "all" of kv_eval_perplexity). */
#include "forward_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define CMP_ROWS 32 /* output rows scored at a time (bounds the two logits buffers) */

/* log-softmax statistics of one row: max and log-sum-exp (double). */
static void row_lse(const float *x, int n, float *mx_out, double *lse_out) {
    float mx = x[0];
    for (int i = 1; i < n; i++) mx = x[i] > mx ? x[i] : mx;
    double sum = 0.0;
    for (int i = 0; i < n; i++) sum += exp((double)(x[i] - mx));
    *mx_out = mx;
    *lse_out = log(sum);
}

static int row_argmax(const float *x, int n) {
    int best = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return best;
}

/* Score one row pair: NLLs of the target under both, KL(P || Q), whether the argmaxes agree, the argmaxes. */
#define ROW_STATS 6
static void score_row(const float *p_logits, const float *q_logits, int V, int target, double out[ROW_STATS]) {
    float mp, mq;
    double lp, lq;
    row_lse(p_logits, V, &mp, &lp);
    row_lse(q_logits, V, &mq, &lq);
    double kl = 0.0;
    for (int i = 0; i < V; i++) {
        const double logp = (double)(p_logits[i] - mp) - lp, logq = (double)(q_logits[i] - mq) - lq;
        kl += exp(logp) * (logp - logq);
    }
    out[0] = -((double)(p_logits[target] - mp) - lp);
    out[1] = -((double)(q_logits[target] - mq) - lq);
    out[2] = kl > 0 ? kl : 0.0; /* rounding can make a zero divergence slightly negative */
    out[4] = row_argmax(p_logits, V);
    out[5] = row_argmax(q_logits, V);
    out[3] = out[4] == out[5];
}

typedef struct score_job {
    const float *p, *q;
    int V;
    const int32_t *targets;
    double *rows;
} score_job;

static void score_range(void *ctx, size_t i0, size_t i1, int thread) {
    (void)thread;
    const score_job *jb = ctx;
    for (size_t i = i0; i < i1; i++)
        score_row(jb->p + i * (size_t)jb->V, jb->q + i * (size_t)jb->V, jb->V, jb->targets[i], jb->rows + ROW_STATS * i);
}

/* The exact pass over one sample: in = [bos, the n_text tokens of text], the first n_tokens of it
 * through the model in one forward (no cache), final hidden states into hidden. */
static kv_status forward_exact(kv_model *m, int32_t *in, int32_t bos, const int32_t *text, size_t n_text, int n_tokens,
                               float *hidden) {
    in[0] = bos;
    memcpy(in + 1, text, n_text * sizeof(int32_t));
    kv_forward f;
    memset(&f, 0, sizeof f);
    f.tokens = in;
    f.n_seqs = 1;
    f.n_tokens = n_tokens;
    f.hidden = hidden;
    return kv_model_forward(m, &f);
}

kv_status kv_eval_compare(kv_model *m, kv_cache *cache, const int32_t *tokens, size_t n_tokens,
                          const kv_compare_options *opt, kv_compare_result *out) {
    if (!m || !cache || !opt || !out || (!tokens && n_tokens)) return KV_ERR(KV_EINVAL, "kv_eval_compare: NULL argument");
    memset(out, 0, sizeof *out);
    const int ctx = opt->ctx, V = m->arch.vocab_size, d = m->arch.d_model;
    if (ctx < 2 || ctx > (1 << 24)) return KV_ERR(KV_EINVAL, "context %d is out of range", ctx);
    if (opt->bos_id < 0 || opt->bos_id >= V) return KV_ERR(KV_EINVAL, "the comparison needs a BOS token (got %d)", opt->bos_id);
    if (opt->first_step < 1 || opt->step < 1) return KV_ERR(KV_EINVAL, "step sizes must be >= 1");
    const size_t stride = (size_t)ctx - 1;
    size_t n_chunks = n_tokens / stride;
    if (opt->max_chunks && n_chunks > opt->max_chunks) n_chunks = opt->max_chunks;
    if (n_chunks == 0) return KV_ERR(KV_EINVAL, "the text has %zu tokens, fewer than one chunk of %zu", n_tokens, stride);
    kv_status s = KV_OK;
    int32_t *in = malloc((size_t)ctx * sizeof(int32_t));
    float *h_ref = kv_aligned_alloc(64, (size_t)ctx * d * sizeof(float));
    float *h_c = kv_aligned_alloc(64, (size_t)ctx * d * sizeof(float));
    float *lg_ref = kv_aligned_alloc(64, (size_t)CMP_ROWS * V * sizeof(float));
    float *lg_c = kv_aligned_alloc(64, (size_t)CMP_ROWS * V * sizeof(float));
    double *rows = malloc((size_t)CMP_ROWS * ROW_STATS * sizeof(double));
    if (!in || !h_ref || !h_c || !lg_ref || !lg_c || !rows) {
        s = KV_ERR(KV_ENOMEM, "out of memory for the comparison of %d-token chunks", ctx);
        goto done;
    }
    kv_progress prog;
    if (opt->progress_label) kv_progress_begin(&prog, opt->progress_label, "tok", (double)(n_chunks * ctx));
    double sum_nll_ref = 0, sum_nll = 0, sum_kl = 0, agree = 0;
    size_t scored = 0;
    for (size_t c = 0; c < n_chunks; c++) {
        /* exact: one prefill */
        double t0 = kv_now_seconds();
        if ((s = forward_exact(m, in, opt->bos_id, tokens + c * stride, stride, ctx, h_ref)) != KV_OK) goto done;
        kv_forward f;
        out->seconds_ref += kv_now_seconds() - t0;
        /* through the cache, in steps */
        t0 = kv_now_seconds();
        kv_cache_reset(cache, 0);
        for (int p = 0; p < ctx;) {
            const int n = p == 0 ? opt->first_step : opt->step;
            const int len = n < ctx - p ? n : ctx - p;
            memset(&f, 0, sizeof f);
            f.tokens = in + p;
            f.n_seqs = 1;
            f.n_tokens = len;
            f.cache = cache;
            f.hidden = h_c + (size_t)p * d;
            if ((s = kv_model_forward(m, &f)) != KV_OK) goto done;
            /* the first step is the prompt: a cache that prunes tokens selects what it keeps after it */
            if (p == 0 && (s = kv_cache_end_prompt(cache, 0)) != KV_OK) goto done;
            p += len;
        }
        out->seconds_cache += kv_now_seconds() - t0;
        if (opt->on_chunk && (s = opt->on_chunk(opt->user, cache, c)) != KV_OK) goto done;
        /* compare: position t predicts text token c*stride + t (in[t+1]) */
        for (int r0 = 0; r0 < ctx - 1; r0 += CMP_ROWS) {
            const int nr = ctx - 1 - r0 < CMP_ROWS ? ctx - 1 - r0 : CMP_ROWS;
            if ((s = kv_model_logits(m, h_ref + (size_t)r0 * d, (size_t)nr, lg_ref)) != KV_OK) goto done;
            if ((s = kv_model_logits(m, h_c + (size_t)r0 * d, (size_t)nr, lg_c)) != KV_OK) goto done;
            score_job sj = {lg_ref, lg_c, V, in + r0 + 1, rows};
            kv_model_for_rows(m, (size_t)nr, (size_t)nr * (size_t)V * 8, score_range, &sj);
            for (int i = 0; i < nr; i++) { /* sums in a fixed order */
                const double *ri = rows + ROW_STATS * i;
                sum_nll_ref += ri[0];
                sum_nll += ri[1];
                sum_kl += ri[2];
                agree += ri[3];
                if (opt->argmax_ref && opt->argmax_cache && scored + (size_t)i < opt->argmax_cap) {
                    opt->argmax_ref[scored + (size_t)i] = (int32_t)ri[4];
                    opt->argmax_cache[scored + (size_t)i] = (int32_t)ri[5];
                }
            }
            scored += (size_t)nr;
        }
        if (opt->progress_label) kv_progress_update(&prog, (double)((c + 1) * ctx));
    }
    if (opt->progress_label) kv_progress_end(&prog);
    out->n_chunks = n_chunks;
    out->tokens_total = n_tokens;
    out->tokens_evaluated = n_chunks * (size_t)ctx;
    out->tokens_scored = scored;
    out->nll_mean = sum_nll / scored;
    out->nll_mean_ref = sum_nll_ref / scored;
    out->ppl = exp(out->nll_mean);
    out->ppl_ref = exp(out->nll_mean_ref);
    out->kl_mean = sum_kl / scored;
    out->top1_agreement = agree / scored;
    out->tokens_per_second = out->seconds_cache > 0 ? out->tokens_evaluated / out->seconds_cache : 0.0;
    out->tokens_per_second_ref = out->seconds_ref > 0 ? out->tokens_evaluated / out->seconds_ref : 0.0;
    if (!isfinite(out->nll_mean) || !isfinite(out->kl_mean))
        s = KV_ERR(KV_ENUMERIC, "the comparison is not finite (NLL %g, KL %g)", out->nll_mean, out->kl_mean);
done:
    free(in);
    kv_aligned_free(h_ref);
    kv_aligned_free(h_c);
    kv_aligned_free(lg_ref);
    kv_aligned_free(lg_c);
    free(rows);
    return s;
}

/* ---- continuation (long-context protocol) ---------------------------------------------------------- */
/* n tokens of `in` from position p0 through the cache in steps (hidden states into h, n x d). */
static kv_status feed(kv_model *m, kv_cache *cache, const int32_t *in, int n, int step, float *h) {
    const int d = m->arch.d_model;
    for (int p = 0; p < n;) {
        const int len = step > 0 && step < n - p ? step : n - p;
        kv_forward f;
        memset(&f, 0, sizeof f);
        f.tokens = in + p;
        f.n_seqs = 1;
        f.n_tokens = len;
        f.cache = cache;
        f.hidden = h ? h + (size_t)p * (size_t)d : NULL;
        kv_status s = kv_model_forward(m, &f);
        if (s != KV_OK) return s;
        p += len;
    }
    return KV_OK;
}

kv_status kv_eval_continuation(kv_model *m, kv_cache *const *caches, int n_caches, const int32_t *tokens,
                               size_t n_tokens, const kv_cont_options *opt, kv_cont_summary *sum, kv_cont_result *res) {
    if (!m || !opt || !sum || (n_caches > 0 && (!caches || !res)) || n_caches < 0 || (!tokens && n_tokens))
        return KV_ERR(KV_EINVAL, "kv_eval_continuation: bad arguments");
    memset(sum, 0, sizeof *sum);
    if (n_caches) memset(res, 0, (size_t)n_caches * sizeof *res);
    const int N = opt->prompt_len, M = opt->score_len, V = m->arch.vocab_size, d = m->arch.d_model;
    if (N < 2 || M < 1 || N > (1 << 24) - M)
        return KV_ERR(KV_EINVAL, "continuation: prompt of %d and %d scored tokens (prompt >= 2, scored >= 1)", N, M);
    if (opt->bos_id < 0 || opt->bos_id >= V) return KV_ERR(KV_EINVAL, "continuation needs a BOS token (got %d)", opt->bos_id);
    if (opt->step < 1 || opt->prefill_chunk < 0) return KV_ERR(KV_EINVAL, "continuation: step %d, prefill chunk %d", opt->step, opt->prefill_chunk);
    const size_t stride = (size_t)N + (size_t)M; /* text tokens per sample: N - 1 in the prompt, M fed, 1 more target */
    size_t n_samples = n_tokens / stride;
    if (opt->max_samples && n_samples > opt->max_samples) n_samples = opt->max_samples;
    if (n_samples == 0)
        return KV_ERR(KV_EINVAL, "the text has %zu tokens, fewer than one sample (%zu: a %d-token prompt after BOS and %d "
                      "scored)", n_tokens, stride, N - 1, M);
    kv_status s = KV_OK;
    const size_t L = (size_t)N + (size_t)M;
    int32_t *in = malloc((L + 1) * sizeof(int32_t));
    float *h_ref = kv_aligned_alloc(64, L * (size_t)d * sizeof(float));
    float *h_c = kv_aligned_alloc(64, (size_t)M * (size_t)d * sizeof(float));
    float *lg_ref = kv_aligned_alloc(64, (size_t)M * (size_t)V * sizeof(float));
    float *lg_c = kv_aligned_alloc(64, (size_t)CMP_ROWS * (size_t)V * sizeof(float));
    double *rows = malloc((size_t)CMP_ROWS * ROW_STATS * sizeof(double));
    double *sums = calloc((size_t)(n_caches > 0 ? n_caches : 1) * 3, sizeof(double));
    if (!in || !h_ref || !h_c || !lg_ref || !lg_c || !rows || !sums) {
        s = KV_ERR(KV_ENOMEM, "out of memory for a continuation of %d + %d tokens (%.0f MiB of reference logits)", N, M,
                   (double)M * V * 4 / 1048576.0);
        goto done;
    }
    kv_progress prog;
    if (opt->progress_label) kv_progress_begin(&prog, opt->progress_label, "sample", (double)n_samples);
    double sum_ref = 0;
    for (size_t c = 0; c < n_samples; c++) {
        /* exact: the whole sample in one pass; logits of the fed positions N .. N+M-1 */
        double t0 = kv_now_seconds();
        if ((s = forward_exact(m, in, opt->bos_id, tokens + c * stride, stride, (int)L, h_ref)) != KV_OK) goto done;
        for (int r0 = 0; r0 < M; r0 += CMP_ROWS) {
            const int nr = M - r0 < CMP_ROWS ? M - r0 : CMP_ROWS;
            if ((s = kv_model_logits(m, h_ref + ((size_t)N + (size_t)r0) * (size_t)d, (size_t)nr,
                                     lg_ref + (size_t)r0 * (size_t)V)) != KV_OK)
                goto done;
        }
        for (int r = 0; r < M; r++) sum_ref += kv_nll_of(lg_ref + (size_t)r * (size_t)V, V, in[N + r + 1]);
        sum->seconds_ref += kv_now_seconds() - t0;
        if (opt->prefill_cache && n_caches > 0) {
            t0 = kv_now_seconds();
            kv_cache_reset(opt->prefill_cache, 0);
            const int chunk = opt->prefill_chunk > 0 ? opt->prefill_chunk : N;
            if ((s = feed(m, opt->prefill_cache, in, N, chunk, NULL)) != KV_OK) goto done;
            sum->seconds_shared_prefill += kv_now_seconds() - t0;
        }
        for (int i = 0; i < n_caches; i++) {
            kv_cache *cache = caches[i];
            t0 = kv_now_seconds();
            if (opt->prefill_cache) {
                if ((s = kv_cache_rt_prompt_copy(cache, 0, opt->prefill_cache, 0)) != KV_OK) goto done;
            } else {
                kv_cache_reset(cache, 0);
                if ((s = feed(m, cache, in, N, opt->prefill_chunk > 0 ? opt->prefill_chunk : N, NULL)) != KV_OK) goto done;
            }
            res[i].seconds_prefill += kv_now_seconds() - t0;
            t0 = kv_now_seconds();
            if ((s = kv_cache_end_prompt(cache, 0)) != KV_OK) goto done;
            res[i].seconds_end_prompt += kv_now_seconds() - t0;
            if (opt->on_prompt && (s = opt->on_prompt(opt->user, cache, c)) != KV_OK) goto done;
            t0 = kv_now_seconds();
            if ((s = feed(m, cache, in + N, M, opt->step, h_c)) != KV_OK) goto done;
            for (int r0 = 0; r0 < M; r0 += CMP_ROWS) {
                const int nr = M - r0 < CMP_ROWS ? M - r0 : CMP_ROWS;
                if ((s = kv_model_logits(m, h_c + (size_t)r0 * (size_t)d, (size_t)nr, lg_c)) != KV_OK) goto done;
                score_job sj = {lg_ref + (size_t)r0 * (size_t)V, lg_c, V, in + N + r0 + 1, rows};
                kv_model_for_rows(m, (size_t)nr, (size_t)nr * (size_t)V * 8, score_range, &sj);
                for (int k = 0; k < nr; k++) { /* sums in a fixed order */
                    sums[3 * i] += rows[ROW_STATS * k + 1];
                    sums[3 * i + 1] += rows[ROW_STATS * k + 2];
                    sums[3 * i + 2] += rows[ROW_STATS * k + 3];
                }
            }
            res[i].seconds_continuation += kv_now_seconds() - t0;
            if (opt->on_sample_end && (s = opt->on_sample_end(opt->user, cache, c)) != KV_OK) goto done;
        }
        if (opt->progress_label) kv_progress_update(&prog, (double)(c + 1));
    }
    if (opt->progress_label) kv_progress_end(&prog);
    const double scored = (double)n_samples * (double)M;
    sum->n_samples = n_samples;
    sum->tokens_scored = n_samples * (size_t)M;
    sum->tokens_total = n_tokens;
    sum->nll_mean_ref = sum_ref / scored;
    sum->ppl_ref = exp(sum->nll_mean_ref);
    for (int i = 0; i < n_caches; i++) {
        res[i].nll_mean = sums[3 * i] / scored;
        res[i].ppl = exp(res[i].nll_mean);
        res[i].kl_mean = sums[3 * i + 1] / scored;
        res[i].top1_agreement = sums[3 * i + 2] / scored;
        if (!isfinite(res[i].nll_mean) || !isfinite(res[i].kl_mean))
            s = KV_ERR(KV_ENUMERIC, "the continuation through cache %d is not finite (NLL %g, KL %g)", i, res[i].nll_mean,
                       res[i].kl_mean);
    }
done:
    free(in);
    kv_aligned_free(h_ref);
    kv_aligned_free(h_c);
    kv_aligned_free(lg_ref);
    kv_aligned_free(lg_c);
    free(rows);
    free(sums);
    return s;
}
