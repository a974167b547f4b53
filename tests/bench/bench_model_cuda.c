/* bench_model_cuda — whole-model decoding on the GPU (the slim forward, RUNTIME.md §10.6) with a plan's compressed
 * cache against this engine's f16 cache. Not a test.
 *
 * The model has SmolLM2-135M's shape (30 layers, d_model 576, 9 query / 3 KV heads of 64, SwiGLU 1536, vocabulary
 * 49152, tied embeddings) with random weights (speed does not depend on their values; the real file does not fit
 * the GPU machine's transfer limit). For each (method, context N, batch B): B sequences' caches are filled with N
 * tokens (every layer's keys and values appended in chunks of 2048, compressed as the plan says: the steady
 * state a long prompt leaves), then K decoding steps of the whole model for the B sequences together
 * (kv_model_forward: embedding, 30 layers, logits copied to the host) are timed. Reported: milliseconds per step
 * (the median of K), tokens/s, the cache's bytes, the ratio to the f16 cache at the same N and B.
 *
 * usage: bench_model_cuda [--contexts 4096,16384,32768] [--batches 1,8] [--methods f16,kivi-2,aqua-2,aqua-2k]
 *        [--steps K] [--json FILE] [--weights f16|f32] */
#define _POSIX_C_SOURCE 200809L
#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_plans.h"
#include "kv_model.h"
#include "kvrt.h"

static void die(kv_status s) { bench_die("bench_model_cuda", s); }

static int parse_list(int *out, int cap, char *s) {
    int n = 0;
    for (char *t = strtok(s, ","); t && n < cap; t = strtok(NULL, ",")) out[n++] = atoi(t);
    return n;
}

/* Random weights: norms 1, matrices N(0, 0.02^2) from a hash of the name (deterministic). */
static kv_status random_tensor(void *user, const char *name, int n_dims, const uint64_t ne[4], float *dst) {
    (void)user;
    if (!strcmp(name, "output.weight") || strstr(name, ".bias") || !strcmp(name, "rope_freqs.weight")) return KV_ENOTFOUND;
    uint64_t n = 1, seed = 1469598103934665603ull;
    for (int i = 0; i < n_dims; i++) n *= ne[i];
    for (const char *p = name; *p; p++) seed = (seed ^ (uint8_t)*p) * 1099511628211ull;
    if (strstr(name, "norm")) {
        for (uint64_t i = 0; i < n; i++) dst[i] = 1.0f;
        return KV_OK;
    }
    kv_rng r;
    kv_rng_init(&r, seed);
    for (uint64_t i = 0; i < n; i++) dst[i] = (float)(0.02 * kv_rng_next_normal(&r));
    return KV_OK;
}

static int cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
    int contexts[8] = {4096, 16384, 32768}, n_ctx = 3, batches[8] = {1, 8}, n_b = 2, steps = 16;
    char methods_s[512] = "f16,kivi-2,aqua-2,aqua-2k";
    const char *json_path = NULL, *weights = "f16";
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--contexts") && i + 1 < argc) n_ctx = parse_list(contexts, 8, argv[++i]);
        else if (!strcmp(argv[i], "--batches") && i + 1 < argc) n_b = parse_list(batches, 8, argv[++i]);
        else if (!strcmp(argv[i], "--methods") && i + 1 < argc) snprintf(methods_s, sizeof methods_s, "%s", argv[++i]);
        else if (!strcmp(argv[i], "--steps") && i + 1 < argc) steps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--json") && i + 1 < argc) json_path = argv[++i];
        else if (!strcmp(argv[i], "--weights") && i + 1 < argc) weights = argv[++i];
        else {
            fprintf(stderr, "usage: bench_model_cuda [--contexts N,..] [--batches B,..] [--methods M,..] [--steps K] "
                            "[--json FILE] [--weights f16|f32]\n");
            return 2;
        }
    }
    if (!kv_cuda_available()) {
        fprintf(stderr, "bench_model_cuda: no usable CUDA device\n");
        return 77;
    }
    if (steps < 3 || steps > 4096) steps = 16;
    kv_arch a;
    memset(&a, 0, sizeof a);
    snprintf(a.arch, sizeof a.arch, "llama");
    snprintf(a.name, sizeof a.name, "random SmolLM2-135M shape");
    a.n_layers = 30, a.d_model = 576, a.n_heads = 9, a.n_kv_heads = 3, a.head_dim = 64, a.d_ff = 1536;
    a.vocab_size = 49152, a.max_seq_len = 65536, a.rms_eps = 1e-5f, a.rope_theta = 100000.0f;
    a.rope_layout = KV_ROPE_ADJACENT, a.tied_embeddings = 1, a.bos_id = 1, a.eos_id = 2;
    kv_model_options mo;
    memset(&mo, 0, sizeof mo);
    mo.device = KV_MODEL_DEVICE_CUDA;
    mo.weights = strcmp(weights, "f32") == 0 ? KV_WEIGHTS_F32 : KV_WEIGHTS_F16;
    kv_model *m = NULL;
    const double tl = kv_now_seconds();
    kv_status s = kv_model_create(&m, &a, random_tensor, NULL, &mo);
    if (s != KV_OK) die(s);
    struct cudaDeviceProp prop;
    cudaGetDeviceProperties(&prop, 0);
    const bench_method *ms[16];
    int nm = 0;
    for (char *t = strtok(methods_s, ","); t && nm < 16; t = strtok(NULL, ","))
        if (!(ms[nm++] = bench_method_find(t))) {
            fprintf(stderr, "bench_model_cuda: unknown method '%s'\n", t);
            return 2;
        }
    printf("# bench_model_cuda on %s: %s, %s weights (%.0f MB on the GPU, loaded in %.1f s); median of %d decoding "
           "steps\n", prop.name, a.name, weights, (double)kv_model_device_weight_bytes(m) / 1e6, kv_now_seconds() - tl,
           steps);
    printf("%-9s %7s %5s %10s %11s %14s %8s %7s\n", "method", "context", "batch", "ms/step", "tokens/s", "cache bytes",
           "bits", "vs f16");
    FILE *js = json_path ? fopen(json_path, "w") : NULL;
    if (js) fprintf(js, "{\"device\": \"%s\", \"model\": \"%s\", \"weights\": \"%s\", \"rows\": [", prop.name, a.name, weights);
    int first = 1;
    const int kvd = a.n_kv_heads * a.head_dim, chunk = 2048, V = a.vocab_size;
    float *hk = malloc(sizeof(float) * (size_t)chunk * kvd), *hv = malloc(sizeof(float) * (size_t)chunk * kvd);
    kv_rng r;
    kv_rng_init(&r, 7);
    for (size_t i = 0; i < (size_t)chunk * kvd; i++) {
        hk[i] = (float)kv_rng_next_normal(&r) + (i % 7 == 3 ? 3.0f : 0.0f);
        hv[i] = (float)kv_rng_next_normal(&r);
    }
    float *dk = NULL, *dv = NULL;
    cudaMalloc((void **)&dk, sizeof(float) * (size_t)chunk * kvd);
    cudaMalloc((void **)&dv, sizeof(float) * (size_t)chunk * kvd);
    cudaMemcpy(dk, hk, sizeof(float) * (size_t)chunk * kvd, cudaMemcpyHostToDevice);
    cudaMemcpy(dv, hv, sizeof(float) * (size_t)chunk * kvd, cudaMemcpyHostToDevice);
    int32_t *pos = malloc(sizeof(int32_t) * (size_t)chunk), *tokens = malloc(sizeof(int32_t) * 4096);
    int *ids = malloc(sizeof(int) * 4096);
    float *logits = malloc(sizeof(float) * (size_t)V * 64);
    double *times = malloc(sizeof(double) * (size_t)steps);
    for (int i = 0; i < 4096; i++) ids[i] = i;
    for (int ci = 0; ci < n_ctx; ci++)
        for (int bi = 0; bi < n_b; bi++) {
            const int N = contexts[ci], B = batches[bi] > 64 ? 64 : batches[bi];
            double t_f16 = 0;
            for (int mi = 0; mi < nm; mi++) {
                kv_plan *p = ms[mi]->kind == 0 ? NULL : bench_make_plan(ms[mi], a.n_layers, a.n_kv_heads, a.head_dim, 3);
                kv_cache *cache = NULL;
                const double to = kv_now_seconds(); /* the first open of a kind of codec runs the self-check */
                if ((s = kv_cache_rt_create(&cache, p, m, B, N + steps + 8, 0,
                                            ms[mi]->keep ? KV_CACHE_RT_KEEP_RECONSTRUCTIONS : 0u)) != KV_OK)
                    die(s);
                const double open_s = kv_now_seconds() - to;
                kv_rt *rt = kv_cache_rt_runtime(cache);
                const double tf = kv_now_seconds();
                for (int b = 0; b < B; b++)
                    for (int t0 = 0; t0 < N; t0 += chunk) {
                        const int n = N - t0 < chunk ? N - t0 : chunk;
                        for (int i = 0; i < n; i++) pos[i] = t0 + i;
                        for (int l = 0; l < a.n_layers; l++)
                            if ((s = kv_rt_append(rt, l, b, n, pos, dk, dk, dv, (size_t)kvd)) != KV_OK) die(s);
                    }
                cudaStreamSynchronize((cudaStream_t)kv_rt_stream(rt));
                const double fill_s = kv_now_seconds() - tf;
                for (int k = 0; k < steps; k++) {
                    for (int b = 0; b < B; b++) tokens[b] = (int32_t)((k * 7919 + b * 104729) % V);
                    kv_forward f;
                    memset(&f, 0, sizeof f);
                    f.tokens = tokens, f.n_seqs = B, f.n_tokens = 1, f.cache = cache, f.seq_ids = ids;
                    f.logits = logits, f.logits_last_only = 1;
                    const double t0 = kv_now_seconds();
                    if ((s = kv_model_forward(m, &f)) != KV_OK) die(s);
                    times[k] = kv_now_seconds() - t0;
                }
                qsort(times, (size_t)steps, sizeof *times, cmp_double);
                const double med = times[steps / 2];
                kv_rt_stats st;
                kv_rt_get_stats(rt, -1, &st);
                if (ms[mi]->kind == 0) t_f16 = med;
                const double ratio = t_f16 > 0 ? t_f16 / med : 0.0;
                printf("%-9s %7d %5d %10.3f %11.1f %14llu %8.3f %7.2f   (open %.3f s, fill %.1f s)\n", ms[mi]->name, N,
                       B, med * 1e3, (double)B / med, (unsigned long long)(st.accounted_bytes + st.predictor_bytes),
                       st.bits_per_value_total, ratio, open_s, fill_s);
                fflush(stdout);
                if (js) {
                    fprintf(js, "%s{\"method\": \"%s\", \"context\": %d, \"batch\": %d, \"seconds_per_step\": %.6g, "
                            "\"cache_bytes\": %llu, \"bits_per_value_total\": %.4f, \"speedup_vs_f16\": %.4f, "
                            "\"open_seconds\": %.4f}",
                            first ? "" : ", ", ms[mi]->name, N, B, med, (unsigned long long)(st.accounted_bytes + st.predictor_bytes),
                            st.bits_per_value_total, ratio, open_s);
                    first = 0;
                }
                kv_cache_free(cache);
                kv_plan_free(p);
            }
        }
    if (js) {
        fprintf(js, "]}\n");
        fclose(js);
    }
    cudaFree(dk), cudaFree(dv);
    free(hk), free(hv), free(pos), free(tokens), free(ids), free(logits), free(times);
    kv_model_free(m);
    return 0;
}
