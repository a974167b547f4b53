/* bench.c — kv_bench_run: a cache's prefill and decoding speed on a real model, end to end (kv_bench.h). The
 * prompt goes in chunks, as kvrun generate feeds it, so a compressed cache compresses as it goes and the decoding
 * steps see the steady state, not the whole prompt's compression. */
#include "kv_bench.h"

#include <stdlib.h>
#include <string.h>

static int argmax(const float *x, int n) {
    int b = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return b;
}

kv_status kv_bench_run(kv_bench_result *out, kv_model *m, kv_cache *cache, const kv_bench_options *opt) {
    if (!out || !m || !cache || !opt || opt->context < 1 || opt->decode < 1 || opt->batch < 1 ||
        opt->prefill_chunk < 0 || (opt->ids && opt->n_ids < (size_t)opt->context))
        return KV_ERR(KV_EINVAL, "kv_bench_run: bad arguments");
    memset(out, 0, sizeof *out);
    const int N = opt->context, K = opt->decode, B = opt->batch, V = kv_model_arch(m)->vocab_size;
    int32_t *prompt = malloc(sizeof(int32_t) * (size_t)N);
    int32_t *next = malloc(sizeof(int32_t) * (size_t)B);
    int *seq_ids = malloc(sizeof(int) * (size_t)B);
    float *logits = malloc(sizeof(float) * (size_t)B * (size_t)V);
    kv_status s = KV_OK;
    if (!prompt || !next || !seq_ids || !logits) {
        s = KV_ERR(KV_ENOMEM, "out of memory");
        goto done;
    }
    kv_rng rng;
    kv_rng_init(&rng, opt->seed);
    const int chunk = opt->prefill_chunk > 0 ? opt->prefill_chunk : N;
    for (int b = 0; b < B; b++) {
        if (opt->ids) /* sequence b's prompt: the tokens from a different offset */
            memcpy(prompt, opt->ids + ((size_t)b * 7919u) % (opt->n_ids - (size_t)N + 1), sizeof(int32_t) * (size_t)N);
        else
            for (int t = 0; t < N; t++) prompt[t] = (int32_t)(kv_rng_next_u64(&rng) % (uint64_t)V);
        const double t0 = kv_now_seconds();
        for (int p0 = 0; p0 < N; p0 += chunk) {
            kv_forward f;
            memset(&f, 0, sizeof f);
            f.tokens = prompt + p0, f.n_seqs = 1, f.n_tokens = N - p0 < chunk ? N - p0 : chunk, f.cache = cache;
            f.seq_ids = &b, f.logits = logits + (size_t)b * V, f.logits_last_only = 1;
            if ((s = kv_model_forward(m, &f)) != KV_OK) goto done;
        }
        out->prefill_s += kv_now_seconds() - t0;
        const double t1 = kv_now_seconds();
        if ((s = kv_cache_end_prompt(cache, b)) != KV_OK) goto done;
        out->end_prompt_s += kv_now_seconds() - t1;
        next[b] = argmax(logits + (size_t)b * V, V);
        seq_ids[b] = b;
    }
    for (int i = 0; i < K; i++) {
        kv_forward f;
        memset(&f, 0, sizeof f);
        f.tokens = next, f.n_seqs = B, f.n_tokens = 1, f.cache = cache, f.seq_ids = seq_ids;
        f.logits = logits, f.logits_last_only = 1;
        const double t0 = kv_now_seconds();
        if ((s = kv_model_forward(m, &f)) != KV_OK) goto done;
        out->decode_s += kv_now_seconds() - t0;
        for (int b = 0; b < B; b++) next[b] = argmax(logits + (size_t)b * V, V);
    }
    out->decode_tokens_per_second = out->decode_s > 0 ? (double)B * K / out->decode_s : 0.0;
    out->prefill_tokens_per_second = out->prefill_s > 0 ? (double)B * N / out->prefill_s : 0.0;
done:
    free(prompt);
    free(next);
    free(seq_ids);
    free(logits);
    return s;
}
