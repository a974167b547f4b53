/* generate.c — text generation through the KV-cache interface: prefill the prompt, then decode one
 * token at a time; greedy (argmax) or temperature / top-p sampling with the deterministic rng. */
#include "forward_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct prob_idx {
    double p;
    int i;
} prob_idx;

static int by_prob_desc(const void *a, const void *b) {
    const prob_idx *x = a, *y = b;
    if (x->p != y->p) return x->p < y->p ? 1 : -1;
    return x->i - y->i; /* ties: lower id first, so the order is total */
}

kv_status kv_sample_token(int32_t *out, const float *logits, int n_vocab, float temp, float top_p,
                          kv_rng *rng) {
    if (!out || !logits || n_vocab <= 0) return KV_ERR(KV_EINVAL, "kv_sample_token: bad arguments");
    int best = 0;
    for (int i = 1; i < n_vocab; i++)
        if (logits[i] > logits[best]) best = i;
    if (!(temp > 0.0f)) {
        *out = best;
        return KV_OK;
    }
    if (!rng) return KV_ERR(KV_EINVAL, "kv_sample_token: sampling needs an rng");
    prob_idx *pi = malloc((size_t)n_vocab * sizeof *pi);
    if (!pi) return KV_ERR(KV_ENOMEM, "out of memory for sampling");
    const double mx = logits[best];
    double sum = 0.0;
    for (int i = 0; i < n_vocab; i++) {
        pi[i].p = exp(((double)logits[i] - mx) / (double)temp);
        pi[i].i = i;
        sum += pi[i].p;
    }
    int n = n_vocab;
    if (top_p > 0.0f && top_p < 1.0f) {
        qsort(pi, (size_t)n_vocab, sizeof *pi, by_prob_desc);
        double cum = 0.0;
        for (n = 0; n < n_vocab;) {
            cum += pi[n].p;
            n++;
            if (cum >= (double)top_p * sum) break;
        }
        sum = cum;
    }
    const double u = kv_rng_next_uniform(rng) * sum;
    double cdf = 0.0;
    int pick = pi[n - 1].i;
    for (int j = 0; j < n; j++) {
        cdf += pi[j].p;
        if (u < cdf) {
            pick = pi[j].i;
            break;
        }
    }
    free(pi);
    *out = pick;
    return KV_OK;
}

static int is_stop(const kv_gen_options *opt, int32_t tok) {
    for (int i = 0; opt->stop_ids && i < opt->n_stop_ids; i++)
        if (opt->stop_ids[i] == tok) return 1;
    return 0;
}

kv_status kv_generate(int32_t *out, int *n_out, kv_gen_stats *stats, kv_model *m, kv_cache *cache,
                      const int32_t *prompt, int n_prompt, const kv_gen_options *opt, kv_token_fn on_token,
                      void *user) {
    if (!m || !cache || !prompt || n_prompt <= 0 || !opt || opt->n_new < 0 || (opt->n_new && !out) || !n_out ||
        opt->n_stop_ids < 0 || opt->prefill_chunk < 0)
        return KV_ERR(KV_EINVAL, "kv_generate: bad arguments (prompt of %d tokens)", n_prompt);
    *n_out = 0;
    kv_gen_stats st;
    memset(&st, 0, sizeof st);
    st.n_prompt = n_prompt;
    const int V = m->arch.vocab_size;
    float *logits = kv_aligned_alloc(64, (size_t)V * sizeof(float));
    if (!logits) return KV_ERR(KV_ENOMEM, "out of memory for logits");
    kv_rng rng;
    kv_rng_init(&rng, opt->seed);
    kv_cache_reset(cache, 0);
    const int slot = 0;
    kv_forward f;
    memset(&f, 0, sizeof f);
    f.n_seqs = 1;
    f.cache = cache;
    f.seq_ids = &slot;
    f.logits = logits;
    f.logits_last_only = 1;
    double t0 = kv_now_seconds();
    const int chunk = opt->prefill_chunk > 0 ? opt->prefill_chunk : n_prompt;
    kv_status s = KV_OK;
    for (int p0 = 0; p0 < n_prompt && s == KV_OK; p0 += chunk) {
        f.tokens = prompt + p0;
        f.n_tokens = n_prompt - p0 < chunk ? n_prompt - p0 : chunk;
        s = kv_model_forward(m, &f);
    }
    st.prefill_seconds = kv_now_seconds() - t0;
    /* the prompt is complete: a cache that prunes tokens selects what it keeps now */
    t0 = kv_now_seconds();
    if (s == KV_OK) s = kv_cache_end_prompt(cache, slot);
    st.end_prompt_seconds = kv_now_seconds() - t0;
    t0 = kv_now_seconds();
    for (int i = 0; s == KV_OK && i < opt->n_new; i++) {
        int32_t tok;
        if ((s = kv_sample_token(&tok, logits, V, opt->temp, opt->top_p, &rng)) != KV_OK) break;
        if (is_stop(opt, tok)) break;
        out[(*n_out)++] = tok;
        if (on_token && (s = on_token(user, tok)) != KV_OK) break;
        if (i + 1 == opt->n_new) break;
        f.tokens = &out[*n_out - 1];
        f.n_tokens = 1;
        s = kv_model_forward(m, &f);
    }
    st.decode_seconds = kv_now_seconds() - t0;
    st.n_generated = *n_out;
    if (stats) *stats = st;
    kv_aligned_free(logits);
    return s;
}
