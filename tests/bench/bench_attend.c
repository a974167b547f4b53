/* bench_attend — the runtime's decoding attention alone (kv_rt_attend of one query row over a long
 * cache), for an f16 cache and the plans' codecs, at several context lengths. Not a test.
 *
 * L layers (30 by default, as SmolLM2, so that the caches do not sit in the CPU's caches between
 * calls as they would not in a model) are filled with one append of N tokens plus one more (so
 * that N - recent tokens are compressed); then one decoding step attends every layer in turn
 * (after one untimed step, so that AQUA-KV's working set is the steady state's): best of R steps, thread CPU time on 1 thread (the kernels' speed) or wall time with -t 2.
 * Reported: microseconds per layer, the bytes one layer's cache holds and their rate, and the ratio
 * to the f16 cache in the same run. Methods: f16, KIVI-2/4, HIGGS-2/4 (keys after RoPE), HIGGS-2r
 * (keys before RoPE, as `kvcal fit --method higgs` makes them), AQUA-KV-2 (layer 0 HIGGS-4, then
 * random predictors with HIGGS-2 residuals, keys before RoPE; the reconstructions rebuilt per step,
 * or kept: aqua-2k).
 *
 * usage: bench_attend [--contexts 1024,4096,8192] [--reps R] [-t T] [--simd none|sse2|avx2]
 *        [--kv-heads 3 --gqa 3 --head-dim 64] (SmolLM2-135M's shape by default) */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_plans.h"
#include "kv_kernels_internal.h"
#include "kvrt.h"

#include <cblas.h>

static double now(int thread_time) {
    struct timespec ts;
    clock_gettime(thread_time ? CLOCK_THREAD_CPUTIME_ID : CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void die(kv_status s) { bench_die("bench_attend", s); }

int main(int argc, char **argv) {
    int contexts[16] = {1024, 4096, 8192}, n_ctx = 3, reps = 20, threads = 1, H = 3, gqa = 3, hd = 64, L = 30;
    const char *only = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--contexts") && i + 1 < argc) {
            n_ctx = 0;
            for (char *t = strtok(argv[++i], ","); t && n_ctx < 16; t = strtok(NULL, ",")) contexts[n_ctx++] = atoi(t);
        } else if (!strcmp(argv[i], "--reps") && i + 1 < argc) {
            reps = atoi(argv[++i]);
        } else if (!strcmp(argv[i], "-t") && i + 1 < argc) {
            threads = atoi(argv[++i]);
        } else if (!strcmp(argv[i], "--kv-heads") && i + 1 < argc) {
            H = atoi(argv[++i]);
        } else if (!strcmp(argv[i], "--gqa") && i + 1 < argc) {
            gqa = atoi(argv[++i]);
        } else if (!strcmp(argv[i], "--head-dim") && i + 1 < argc) {
            hd = atoi(argv[++i]);
        } else if (!strcmp(argv[i], "--layers") && i + 1 < argc) {
            L = atoi(argv[++i]);
        } else if (!strcmp(argv[i], "--method") && i + 1 < argc) {
            only = argv[++i];
        } else if (!strcmp(argv[i], "--simd") && i + 1 < argc) {
            const char *v = argv[++i];
            kv_simd_level_limit(!strcmp(v, "none") ? KV_SIMD_NONE : !strcmp(v, "sse2") ? KV_SIMD_SSE2 : KV_SIMD_AVX2);
        } else {
            fprintf(stderr, "usage: bench_attend [--contexts N,N,...] [--reps R] [-t T] [--simd none|sse2|avx2] "
                            "[--kv-heads H --gqa G --head-dim D] [--method NAME] [--layers L]\n");
            return 2;
        }
    }
    /* the CPU's rows of the methods' table (bench_plans.h) */
    const char *names[] = {"f16", "kivi-2", "kivi-4", "higgs-2", "higgs-2r", "higgs-4", "aqua-2", "aqua-2r32", "aqua-2k"};
    const int nm = (int)(sizeof names / sizeof names[0]);
    bench_method methods[9];
    for (int i = 0; i < nm; i++) methods[i] = *bench_method_find(names[i]);
    /* the runtime calls the BLAS from its own threads (AQUA-KV's predictors): no BLAS threads besides */
    openblas_set_num_threads(1);
    const int kvd = H * hd, qd = H * gqa * hd;
    printf("# bench_attend: one decoding attend (1 query row, %d KV heads x GQA %d x head_dim %d), %d thread(s), "
           "%s time per layer, best of %d steps over %d layers; SIMD level %d\n", H, gqa, hd, threads,
           threads == 1 ? "thread CPU" : "wall", reps, L,
           (int)kv_simd_level_now());
    printf("%-8s %7s %10s %12s %9s %8s\n", "method", "context", "us/call", "cache bytes", "GB/s", "vs f16");
    for (int ci = 0; ci < n_ctx; ci++) {
        const int N = contexts[ci];
        double t_f16 = 0;
        float *k = malloc(sizeof(float) * (size_t)(N + 1) * kvd), *v = malloc(sizeof(float) * (size_t)(N + 1) * kvd);
        float *q = malloc(sizeof(float) * qd), *out = malloc(sizeof(float) * qd);
        int32_t *pos = malloc(sizeof(int32_t) * (size_t)(N + 1));
        kv_rng r;
        kv_rng_init(&r, 7);
        for (size_t i = 0; i < (size_t)(N + 1) * kvd; i++) {
            k[i] = (float)kv_rng_next_normal(&r) + (i % 7 == 3 ? 3.0f : 0.0f);
            v[i] = (float)kv_rng_next_normal(&r);
        }
        for (int i = 0; i < qd; i++) q[i] = (float)kv_rng_next_normal(&r);
        for (int i = 0; i <= N; i++) pos[i] = i;
        double *freq = malloc(sizeof(double) * (size_t)(hd / 2));
        for (int i = 0; i < hd / 2; i++) freq[i] = pow(10000.0, -2.0 * i / hd);
        for (int mi = 0; mi < nm; mi++) {
            if (only && mi > 0 && strcmp(only, methods[mi].name) != 0) continue;
            kv_plan *p = bench_make_plan(&methods[mi], L, H, hd, gqa);
            kv_rt_options o;
            memset(&o, 0, sizeof o);
            o.n_seqs = 1, o.n_heads = H * gqa, o.n_threads = threads, o.rope_inv_freq = freq;
            o.keep_reconstructions = methods[mi].keep;
            kv_rt *rt = NULL;
            kv_status s = kv_rt_open(&rt, p, &o);
            if (s != KV_OK) die(s);
            for (int l = 0; l < L; l++) {
                if ((s = kv_rt_append(rt, l, 0, N, pos, k, k, v, (size_t)kvd)) != KV_OK) die(s);
                if ((s = kv_rt_append(rt, l, 0, 1, pos + N, k + (size_t)N * kvd, k + (size_t)N * kvd,
                                      v + (size_t)N * kvd, (size_t)kvd)) != KV_OK)
                    die(s);
            }
            /* one untimed step first: the fill leaves the last chunks' AQUA-KV reconstructions in the working set
             * (compression reads its inputs' reconstructions), which a decoding step in steady state rebuilds; the
             * first step after the fill would time that leftover, not the step */
            for (int l = 0; l < L; l++)
                if ((s = kv_rt_attend(rt, l, 0, 1, q, (size_t)qd, out, (size_t)qd)) != KV_OK) die(s);
            double best = INFINITY;
            for (int rep = 0; rep < reps; rep++) {
                const double t0 = now(threads == 1);
                for (int l = 0; l < L; l++)
                    if ((s = kv_rt_attend(rt, l, 0, 1, q, (size_t)qd, out, (size_t)qd)) != KV_OK) die(s);
                const double t = (now(threads == 1) - t0) / L;
                best = t < best ? t : best;
            }
            kv_rt_stats st;
            kv_rt_get_stats(rt, 0, &st);
            st.accounted_bytes /= (uint64_t)L;
            if (mi == 0) t_f16 = best;
            printf("%-8s %7d %10.1f %12llu %9.2f %8.2f\n", methods[mi].name, N, best * 1e6,
                   (unsigned long long)st.accounted_bytes, (double)st.accounted_bytes / best / 1e9, t_f16 / best);
            kv_rt_close(rt);
            kv_plan_free(p);
        }
        free(k), free(v), free(q), free(out), free(pos), free(freq);
    }
    return 0;
}
