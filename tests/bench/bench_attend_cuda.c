/* bench_attend_cuda — the runtime's fused decoding attention on the GPU alone (kv_rt_attend_batch of one query row
 * per sequence over a filled cache), against this runtime's own f16 cache (the fp16 flash-decoding baseline: the
 * same kernel reading f16 rows) and against the physical limit: the bytes a step must read (what the cache holds,
 * kv_rt_stats.accounted_bytes) over its time, as a fraction of the measured device-copy bandwidth. Not a test.
 *
 * One layer (the attention of a layer, repeated), B sequences filled with N tokens each (appended in chunks of 2048,
 * compressed as the plan says), then R timed steps (wall time of the calls and a stream synchronization: what a
 * caller waits). Rows: method, context, batch, microseconds per step, bytes read per step, GB/s, fraction of copy
 * bandwidth, speed-up over f16 at the same context and batch.
 *
 * usage: bench_attend_cuda [--contexts 4096,16384,32768] [--batches 1,8,32] [--methods f16,kivi-2,...] [--reps R]
 *        [--kv-heads 3 --gqa 3 --head-dim 64] [--json FILE]                    (SmolLM2's shape by default) */
#define _POSIX_C_SOURCE 200809L
#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_plans.h"
#include "kvrt.h"

#define CU(call)                                                                                                   \
    do {                                                                                                           \
        cudaError_t e_ = (call);                                                                                   \
        if (e_ != cudaSuccess) {                                                                                   \
            fprintf(stderr, "bench_attend_cuda: %s: %s\n", #call, cudaGetErrorString(e_));                         \
            exit(1);                                                                                               \
        }                                                                                                          \
    } while (0)

static void die(kv_status s) { bench_die("bench_attend_cuda", s); }

static int parse_list(int *out, int cap, char *s) {
    int n = 0;
    for (char *t = strtok(s, ","); t && n < cap; t = strtok(NULL, ",")) out[n++] = atoi(t);
    return n;
}

/* Device-copy bandwidth: bytes read + written per second by cudaMemcpy of a 1 GiB buffer, best of 5. */
static double copy_bandwidth(void) {
    const size_t bytes = (size_t)1 << 30;
    void *a = NULL, *b = NULL;
    cudaEvent_t e0, e1;
    CU(cudaMalloc(&a, bytes));
    CU(cudaMalloc(&b, bytes));
    CU(cudaMemset(a, 1, bytes));
    CU(cudaEventCreate(&e0));
    CU(cudaEventCreate(&e1));
    float best = 1e30f;
    for (int i = 0; i < 6; i++) {
        CU(cudaEventRecord(e0, 0));
        CU(cudaMemcpy(b, a, bytes, cudaMemcpyDeviceToDevice));
        CU(cudaEventRecord(e1, 0));
        CU(cudaEventSynchronize(e1));
        float ms = 0;
        CU(cudaEventElapsedTime(&ms, e0, e1));
        if (i && ms < best) best = ms; /* the first is a warm-up */
    }
    CU(cudaFree(a));
    CU(cudaFree(b));
    return 2.0 * (double)bytes / (best * 1e-3);
}

int main(int argc, char **argv) {
    int contexts[8] = {4096, 16384, 32768}, n_ctx = 3, batches[8] = {1, 8, 32}, n_b = 3, reps = 20, H = 3, gqa = 3, hd = 64;
    char methods_s[512] = "f16,kivi-2,kivi-2g128,kivi-4,higgs-2,fp8,nvfp4";
    const char *json_path = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--contexts") && i + 1 < argc) n_ctx = parse_list(contexts, 8, argv[++i]);
        else if (!strcmp(argv[i], "--batches") && i + 1 < argc) n_b = parse_list(batches, 8, argv[++i]);
        else if (!strcmp(argv[i], "--methods") && i + 1 < argc) snprintf(methods_s, sizeof methods_s, "%s", argv[++i]);
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--kv-heads") && i + 1 < argc) H = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--gqa") && i + 1 < argc) gqa = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--head-dim") && i + 1 < argc) hd = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--json") && i + 1 < argc) json_path = argv[++i];
        else {
            fprintf(stderr, "usage: bench_attend_cuda [--contexts N,..] [--batches B,..] [--methods M,..] [--reps R] "
                            "[--kv-heads H --gqa G --head-dim D] [--json FILE]\n");
            return 2;
        }
    }
    if (!kv_cuda_available()) {
        fprintf(stderr, "bench_attend_cuda: no usable CUDA device\n");
        return 77;
    }
    const bench_method *ms[16];
    int nm = 0;
    for (char *t = strtok(methods_s, ","); t && nm < 16; t = strtok(NULL, ",")) {
        if (!(ms[nm] = bench_method_find(t))) {
            fprintf(stderr, "bench_attend_cuda: unknown method '%s'\n", t);
            return 2;
        }
        if (ms[nm]->kind == 3) {
            fprintf(stderr, "bench_attend_cuda: %s needs several layers (bench_model_cuda)\n", t);
            return 2;
        }
        nm++;
    }
    struct cudaDeviceProp prop;
    CU(cudaGetDeviceProperties(&prop, 0));
    const double bw = copy_bandwidth();
    FILE *js = json_path ? fopen(json_path, "w") : NULL;
    printf("# bench_attend_cuda on %s: one decoding attend per sequence (%d KV heads x GQA %d x head_dim %d), best of "
           "%d steps; device copy %.0f GB/s (read + write)\n", prop.name, H, gqa, hd, reps, bw / 1e9);
    printf("%-11s %7s %5s %10s %12s %8s %7s %7s %7s\n", "method", "context", "batch", "us/step", "bytes/step", "GB/s",
           "of copy", "bits", "vs f16");
    if (js) fprintf(js, "{\"device\": \"%s\", \"copy_bytes_per_second\": %.4g, \"rows\": [", prop.name, bw);
    int first = 1;
    const int kvd = H * hd, qd = H * gqa * hd, chunk = 2048;
    float *hk = malloc(sizeof(float) * (size_t)chunk * kvd), *hv = malloc(sizeof(float) * (size_t)chunk * kvd);
    float *hq = malloc(sizeof(float) * (size_t)32 * qd);
    kv_rng r;
    kv_rng_init(&r, 7);
    for (size_t i = 0; i < (size_t)chunk * kvd; i++) {
        hk[i] = (float)kv_rng_next_normal(&r) + (i % 7 == 3 ? 3.0f : 0.0f);
        hv[i] = (float)kv_rng_next_normal(&r);
    }
    for (int i = 0; i < 32 * qd; i++) hq[i] = (float)kv_rng_next_normal(&r);
    float *dk = NULL, *dv = NULL, *dq = NULL, *dout = NULL;
    CU(cudaMalloc((void **)&dk, sizeof(float) * (size_t)chunk * kvd));
    CU(cudaMalloc((void **)&dv, sizeof(float) * (size_t)chunk * kvd));
    CU(cudaMalloc((void **)&dq, sizeof(float) * (size_t)4096 * qd));
    CU(cudaMalloc((void **)&dout, sizeof(float) * (size_t)4096 * qd));
    CU(cudaMemcpy(dk, hk, sizeof(float) * (size_t)chunk * kvd, cudaMemcpyHostToDevice));
    CU(cudaMemcpy(dv, hv, sizeof(float) * (size_t)chunk * kvd, cudaMemcpyHostToDevice));
    for (int rep = 0; rep < 4096 / 32; rep++)
        CU(cudaMemcpy(dq + (size_t)rep * 32 * qd, hq, sizeof(float) * (size_t)32 * qd, cudaMemcpyHostToDevice));
    int32_t *pos = malloc(sizeof(int32_t) * (size_t)chunk);
    int *seqs = malloc(sizeof(int) * 4096);
    for (int i = 0; i < 4096; i++) seqs[i] = i;
    for (int ci = 0; ci < n_ctx; ci++)
        for (int bi = 0; bi < n_b; bi++) {
            const int N = contexts[ci], B = batches[bi];
            double t_f16 = 0;
            for (int mi = 0; mi < nm; mi++) {
                kv_plan *p = bench_make_plan(ms[mi], 1, H, hd, gqa);
                kv_rt_options o;
                memset(&o, 0, sizeof o);
                o.device = KV_RT_DEVICE_CUDA, o.n_seqs = B, o.n_heads = H * gqa;
                kv_rt *rt = NULL;
                kv_status s = kv_rt_open(&rt, p, &o);
                if (s != KV_OK) die(s);
                for (int b = 0; b < B; b++)
                    for (int t0 = 0; t0 < N; t0 += chunk) {
                        const int n = N - t0 < chunk ? N - t0 : chunk;
                        for (int i = 0; i < n; i++) pos[i] = t0 + i;
                        if ((s = kv_rt_append(rt, 0, b, n, pos, dk, dk, dv, (size_t)kvd)) != KV_OK) die(s);
                    }
                /* one decoding append (compresses what the window holds, as a step would) */
                if ((s = kv_rt_append_batch(rt, 0, B, seqs, dk, dk, dv, (size_t)kvd)) != KV_OK) die(s);
                CU(cudaStreamSynchronize((cudaStream_t)kv_rt_stream(rt)));
                double best = 1e30;
                for (int rep = 0; rep < reps + 2; rep++) {
                    const double t0 = kv_now_seconds();
                    if ((s = kv_rt_attend_batch(rt, 0, B, seqs, dq, (size_t)qd, dout, (size_t)qd)) != KV_OK) die(s);
                    CU(cudaStreamSynchronize((cudaStream_t)kv_rt_stream(rt)));
                    const double t = kv_now_seconds() - t0;
                    if (rep >= 2 && t < best) best = t; /* two warm-ups */
                }
                kv_rt_stats st;
                kv_rt_get_stats(rt, -1, &st);
                const double bytes = (double)st.accounted_bytes;
                if (ms[mi]->kind == 0) t_f16 = best;
                const double speed = t_f16 > 0 ? t_f16 / best : 0.0;
                printf("%-11s %7d %5d %10.1f %12.0f %8.1f %6.1f%% %7.3f %7.2f\n", ms[mi]->name, N, B, best * 1e6, bytes,
                       bytes / best / 1e9, 100.0 * bytes / best / bw, st.bits_per_value_total, speed);
                fflush(stdout);
                if (js) {
                    fprintf(js, "%s{\"method\": \"%s\", \"context\": %d, \"batch\": %d, \"seconds_per_step\": %.6g, "
                            "\"bytes_per_step\": %.0f, \"fraction_of_copy\": %.4f, \"bits_per_value_total\": %.4f, "
                            "\"speedup_vs_f16\": %.4f}", first ? "" : ", ", ms[mi]->name, N, B, best, bytes,
                            bytes / best / bw, st.bits_per_value_total, speed);
                    first = 0;
                }
                kv_rt_close(rt);
                kv_plan_free(p);
            }
        }
    if (js) {
        fprintf(js, "]}\n");
        fclose(js);
    }
    cudaFree(dk), cudaFree(dv), cudaFree(dq), cudaFree(dout);
    free(hk), free(hv), free(hq), free(pos), free(seqs);
    return 0;
}
