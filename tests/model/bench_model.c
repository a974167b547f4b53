/* bench_model — prefill and decode throughput of the reference model (a benchmark, not a test;
 * scripts/bench-model.sh runs it next to llama.cpp).
 *
 *   bench_model MODEL [--threads T] [--prefill N] [--decode N] [--reps R] [--weights f32|f16|native]
 *
 * prefill: one forward pass over N tokens of a single sequence without a cache (logits of the last
 * token only, as llama.cpp's prompt processing does), best of R runs.
 * decode: N single-token steps through the plain KV cache after a 16-token prompt (tokens fed back
 * greedily), tokens/s over the N steps, best of R runs.
 * Output: one JSON object (also the peak RSS of the process). */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "kv_model.h"

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: bench_model MODEL [--threads T] [--prefill N] [--decode N] [--reps R] [--weights f32|f16|native]\n");
        return 2;
    }
    const char *path = argv[1];
    int threads = 0, n_prefill = 512, n_decode = 128, reps = 3;
    kv_model_options opt;
    memset(&opt, 0, sizeof opt);
    for (int i = 2; i < argc; i++) {
        if (strcmp(argv[i], "--threads") == 0 && i + 1 < argc) threads = atoi(argv[++i]);
        else if (strcmp(argv[i], "--prefill") == 0 && i + 1 < argc) n_prefill = atoi(argv[++i]);
        else if (strcmp(argv[i], "--decode") == 0 && i + 1 < argc) n_decode = atoi(argv[++i]);
        else if (strcmp(argv[i], "--reps") == 0 && i + 1 < argc) reps = atoi(argv[++i]);
        else if (strcmp(argv[i], "--weights") == 0 && i + 1 < argc) {
            const char *w = argv[++i];
            opt.weights = strcmp(w, "f16") == 0 ? KV_WEIGHTS_F16 : strcmp(w, "native") == 0 ? KV_WEIGHTS_NATIVE : KV_WEIGHTS_F32;
        }
        else {
            fprintf(stderr, "bench_model: unknown argument '%s'\n", argv[i]);
            return 2;
        }
    }
    opt.n_threads = threads;
    kv_model *m = NULL;
    double t0 = kv_now_seconds();
    kv_status s = kv_model_open(&m, path, &opt);
    if (s != KV_OK) {
        fprintf(stderr, "bench_model: %s\n", kv_error_last());
        return 1;
    }
    const double load_s = kv_now_seconds() - t0;
    const kv_arch *a = kv_model_arch(m);
    const int V = a->vocab_size;
    int32_t *toks = malloc(sizeof(int32_t) * (size_t)(n_prefill + n_decode + 16));
    for (int i = 0; i < n_prefill + n_decode + 16; i++) toks[i] = (int32_t)(kv_rng_u64(1, (uint64_t)i) % (uint64_t)V);
    float *logits = malloc(sizeof(float) * (size_t)V);

    double best_prefill = 0;
    for (int r = 0; r < reps && n_prefill > 0; r++) {
        kv_forward f;
        memset(&f, 0, sizeof f);
        f.tokens = toks;
        f.n_seqs = 1;
        f.n_tokens = n_prefill;
        f.logits = logits;
        f.logits_last_only = 1;
        t0 = kv_now_seconds();
        if ((s = kv_model_forward(m, &f)) != KV_OK) break;
        const double tps = n_prefill / (kv_now_seconds() - t0);
        if (tps > best_prefill) best_prefill = tps;
    }
    double best_decode = 0;
    kv_cache *c = NULL;
    if (s == KV_OK) s = kv_cache_plain_create(&c, a, 1, 16 + n_decode);
    for (int r = 0; r < reps && n_decode > 0 && s == KV_OK; r++) {
        kv_cache_reset(c, -1);
        kv_forward f;
        memset(&f, 0, sizeof f);
        f.tokens = toks;
        f.n_seqs = 1;
        f.n_tokens = 16;
        f.cache = c;
        f.logits = logits;
        f.logits_last_only = 1;
        if ((s = kv_model_forward(m, &f)) != KV_OK) break;
        t0 = kv_now_seconds();
        int32_t tok = 0;
        for (int i = 0; i < n_decode && s == KV_OK; i++) {
            kv_sample_token(&tok, logits, V, 0.0f, 1.0f, NULL);
            f.tokens = &tok;
            f.n_tokens = 1;
            s = kv_model_forward(m, &f);
        }
        const double tps = n_decode / (kv_now_seconds() - t0);
        if (tps > best_decode) best_decode = tps;
    }
    if (s != KV_OK) {
        fprintf(stderr, "bench_model: %s\n", kv_error_last());
        return 1;
    }
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    printf("{\"engine\": \"kvcal\", \"threads\": %d, \"prefill_tokens\": %d, \"prefill_tps\": %.1f, "
           "\"decode_tokens\": %d, \"decode_tps\": %.2f, \"load_s\": %.2f, \"weight_bytes\": %zu, "
           "\"peak_rss_mb\": %.1f}\n",
           kv_model_threads(m), n_prefill, best_prefill, n_decode, best_decode, load_s, kv_model_weight_bytes(m),
           ru.ru_maxrss / 1024.0);
    kv_cache_free(c);
    kv_model_free(m);
    free(toks);
    free(logits);
    return 0;
}
