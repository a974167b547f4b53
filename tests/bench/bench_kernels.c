/* bench_kernels — CPU (and, with a GPU, CUDA) throughput of the KV quantizers against memcpy.
 *
 * Not a test: built, never registered in CTest. For each quantizer at 2 and 4 bits it encodes and
 * decodes the same f32 block several times and reports the best time as GB/s of f32 input
 * (4 bytes per value), next to memcpy of the same bytes measured in the same run, and the ratio.
 * Single-threaded (the CPU reference is single-threaded; memcpy is too). Times are the thread's CPU
 * time (CLOCK_THREAD_CPUTIME_ID), best of R.
 *
 * usage: bench_kernels [--values N] [--reps R] [--simd none|sse2|avx2]
 * (--simd caps the CPU's vector paths, to measure what a CPU without AVX2 gets.)
 */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kv_calib.h"
#include "kv_kernels_internal.h"
#include "kvrt.h"

#include <time.h>

#ifdef KV_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

/* On-CPU time of this thread: the build/CI machine is shared and often oversubscribed, and wall
 * time then measures the scheduler. memcpy and the quantizers are timed the same way. */
static double cpu_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

typedef struct bench_ctx {
    size_t tokens, channels;
    const float *x;
    float *y;
    uint32_t *codes;
    void *p1, *p2;
} bench_ctx;

static double time_one(kv_status (*fn)(void *), void *arg) {
    const double t0 = cpu_seconds();
    kv_status s = fn(arg);
    const double t = cpu_seconds() - t0;
    if (s != KV_OK) {
        fprintf(stderr, "bench: %s: %s\n", kv_status_name(s), kv_error_last());
        exit(1);
    }
    return t;
}

/* Best of R times of memcpy, encode and (when given) decode, taken in turn within each repetition
 * so that the three see the same machine state (load on the other core changes memory bandwidth
 * from one second to the next). */
static void best_of3(int reps, kv_status (*mem)(void *), kv_status (*enc)(void *), kv_status (*dec)(void *), void *arg,
                     double *tm, double *te, double *td) {
    *tm = *te = *td = INFINITY;
    for (int r = 0; r < reps; r++) {
        const double a = time_one(mem, arg), b = time_one(enc, arg), c = dec ? time_one(dec, arg) : 0.0;
        *tm = a < *tm ? a : *tm;
        *te = b < *te ? b : *te;
        *td = c < *td ? c : *td;
    }
}

/* ---- the operations -------------------------------------------------------------------------- */
typedef struct op {
    bench_ctx *c;
    const kv_uniform *u;
    const kv_higgs *h;
    const kv_squat *sq;
} op;

static kv_status run_memcpy(void *a) {
    op *o = a;
    memcpy(o->c->y, o->c->x, o->c->tokens * o->c->channels * sizeof(float));
    return KV_OK;
}
static kv_status run_uenc(void *a) {
    op *o = a;
    return kv_uniform_encode_ref(o->c->codes, o->c->p1, o->c->p2, o->u, o->c->tokens, o->c->channels, o->c->x);
}
static kv_status run_udec(void *a) {
    op *o = a;
    return kv_uniform_decode_ref(o->c->y, o->u, o->c->tokens, o->c->channels, o->c->codes, o->c->p1, o->c->p2);
}
static kv_status run_henc(void *a) {
    op *o = a;
    return kv_higgs_encode_ref(o->c->codes, o->c->p1, o->h, o->c->tokens, o->c->channels, o->c->x);
}
static kv_status run_hdec(void *a) {
    op *o = a;
    return kv_higgs_decode_ref(o->c->y, o->h, o->c->tokens, o->c->channels, o->c->codes, o->c->p1);
}
static kv_status run_senc(void *a) {
    op *o = a;
    return kv_squat_encode_ref(o->c->codes, o->c->p1, o->c->p2, o->sq, o->u, o->c->tokens, o->c->x);
}
static kv_status run_senc_loop(void *a) {
    op *o = a;
    return kv_squat_encode_loop(o->c->codes, o->c->p1, o->c->p2, o->sq, o->u, o->c->tokens, o->c->x);
}

static void row(const char *name, int bits, double bytes, double t_enc, double t_dec, double t_memcpy) {
    const double gm = bytes / t_memcpy / 1e9;
    const double ge = bytes / t_enc / 1e9;
    if (t_dec > 0) {
        const double gd = bytes / t_dec / 1e9;
        printf("| %-34s | %d | %7.2f | %5.0f%% | %7.2f | %5.0f%% | %7.2f |\n", name, bits, ge, 100.0 * ge / gm, gd,
               100.0 * gd / gm, gm);
    } else {
        printf("| %-34s | %d | %7.2f | %5.0f%% | %7s | %6s | %7.2f |\n", name, bits, ge, 100.0 * ge / gm, "-", "-", gm);
    }
}

/* The SQuat case of both tables: a random rank-5 query subspace for C channels, lambda 1e-3,
 * blocks of 64 (exits on failure: a benchmark has nothing to fall back to). */
static kv_squat *bench_squat(kv_rng *r, size_t C) {
    float *qh = malloc(5 * C * sizeof *qh);
    for (size_t i = 0; i < 5 * C; i++) qh[i] = (float)kv_rng_next_normal(r);
    kv_squat *sq = NULL;
    if (!qh || kv_squat_create(&sq, qh, 5, (int)C, 1e-3f, 64) != KV_OK) {
        fprintf(stderr, "bench: SQuat set-up: %s\n", kv_error_last());
        exit(1);
    }
    free(qh);
    return sq;
}

#ifdef KV_HAVE_CUDA
/* ---- GPU: the same operations on device buffers ------------------------------------------------
 * Each timing is the best of R event-timed batches of GPU_BATCH back-to-back launches (one 64 MiB
 * launch is ~50 us on an H100, close to the event resolution), against a device-to-device copy of
 * the same f32 bytes timed the same way. Scores kernels read the compressed keys and one query and
 * write one score per token; their GB/s is of the f32 keys they stand for, as for decode. */
#define GPU_BATCH 10
typedef struct gpu_ctx {
    size_t tokens, channels;
    const float *x, *query;
    float *y;
    uint32_t *codes;
    void *p1, *p2;
    const kv_uniform *u;
    const kv_higgs *h; /* grid: device pointer */
    const kv_squat *sq;
} gpu_ctx;

static kv_status gpu_copy(gpu_ctx *g) {
    return cudaMemcpyAsync(g->y, g->x, g->tokens * g->channels * 4, cudaMemcpyDeviceToDevice, 0) == cudaSuccess
               ? KV_OK
               : KV_ERR(KV_ECUDA, "cudaMemcpyAsync failed");
}
static kv_status gpu_uenc(gpu_ctx *g) {
    return kv_uniform_encode_cuda(g->codes, g->p1, g->p2, g->u, g->tokens, g->channels, g->x, NULL);
}
static kv_status gpu_udec(gpu_ctx *g) {
    return kv_uniform_decode_cuda(g->y, g->u, g->tokens, g->channels, g->codes, g->p1, g->p2, NULL);
}
static kv_status gpu_uscore(gpu_ctx *g) {
    return kv_uniform_scores_cuda(g->y, g->u, g->tokens, g->channels, g->codes, g->p1, g->p2, g->query, NULL);
}
static kv_status gpu_henc(gpu_ctx *g) {
    return kv_higgs_encode_cuda(g->codes, g->p1, g->h, g->tokens, g->channels, g->x, NULL);
}
static kv_status gpu_hdec(gpu_ctx *g) {
    return kv_higgs_decode_cuda(g->y, g->h, g->tokens, g->channels, g->codes, g->p1, NULL);
}
static kv_status gpu_hscore(gpu_ctx *g) {
    return kv_higgs_scores_cuda(g->y, g->h, g->tokens, g->channels, g->codes, g->p1, g->query, NULL);
}
static kv_status gpu_senc(gpu_ctx *g) {
    return kv_squat_encode_cuda(g->codes, g->p1, g->p2, g->sq, g->u, g->tokens, g->x, NULL);
}

/* Best milliseconds per launch of fn. */
static double gpu_best_ms(int reps, kv_status (*fn)(gpu_ctx *), gpu_ctx *g) {
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    double best = INFINITY;
    for (int r = 0; r <= reps; r++) { /* r = 0 warms up (module load, first-touch) and is not kept */
        float ms = 0;
        cudaEventRecord(e0, 0);
        for (int b = 0; b < GPU_BATCH; b++) {
            kv_status s = fn(g);
            if (s != KV_OK) {
                fprintf(stderr, "bench (GPU): %s: %s\n", kv_status_name(s), kv_error_last());
                exit(1);
            }
        }
        cudaEventRecord(e1, 0);
        if (cudaEventSynchronize(e1) != cudaSuccess) {
            fprintf(stderr, "bench (GPU): %s\n", cudaGetErrorString(cudaGetLastError()));
            exit(1);
        }
        cudaEventElapsedTime(&ms, e0, e1);
        if (r > 0 && ms / GPU_BATCH < best) best = ms / GPU_BATCH;
    }
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    return best;
}

static void gpu_row(const char *name, int bits, double bytes, double ms_enc, double ms_dec, double ms_score,
                    double ms_copy) {
    const double gc = bytes / (ms_copy * 1e6);
    printf("| %-34s | %d | %8.1f | %4.0f%% |", name, bits, bytes / (ms_enc * 1e6), 100.0 * ms_copy / ms_enc);
    if (ms_dec > 0)
        printf(" %8.1f | %4.0f%% |", bytes / (ms_dec * 1e6), 100.0 * ms_copy / ms_dec);
    else
        printf(" %8s | %5s |", "-", "-");
    if (ms_score > 0)
        printf(" %8.1f |", bytes / (ms_score * 1e6));
    else
        printf(" %8s |", "-");
    printf(" %8.1f |\n", gc);
}

static int bench_gpu(const float *x, size_t tokens, size_t C, int reps) {
    const size_t n = tokens * C;
    const double bytes = (double)n * 4;
    struct cudaDeviceProp prop;
    int dev = 0;
    cudaGetDevice(&dev);
    cudaGetDeviceProperties(&prop, dev);
    float *dx = NULL, *dy = NULL, *dq = NULL;
    uint32_t *dcodes = NULL;
    void *dp1 = NULL, *dp2 = NULL;
    if (cudaMalloc((void **)&dx, n * 4) != cudaSuccess || cudaMalloc((void **)&dy, n * 4) != cudaSuccess ||
        cudaMalloc((void **)&dcodes, n * 4) != cudaSuccess || cudaMalloc(&dp1, n * 4) != cudaSuccess ||
        cudaMalloc(&dp2, n * 4) != cudaSuccess || cudaMalloc((void **)&dq, C * 4) != cudaSuccess) {
        fprintf(stderr, "bench (GPU): out of device memory\n");
        return 1;
    }
    cudaMemcpy(dx, x, n * 4, cudaMemcpyHostToDevice);
    cudaMemcpy(dq, x, C * 4, cudaMemcpyHostToDevice); /* any fixed query */
    gpu_ctx g = {.tokens = tokens, .channels = C, .x = dx, .query = dq, .y = dy, .codes = dcodes, .p1 = dp1, .p2 = dp2};
    printf("\nGPU: %s, %d SMs; best of %d batches of %d launches, CUDA events\n\n", prop.name,
           prop.multiProcessorCount, reps, GPU_BATCH);
    printf("| quantizer (GPU) | bits | encode GB/s | vs copy | decode GB/s | vs copy | scores GB/s | D2D copy GB/s |\n");
    printf("|---|---|---|---|---|---|---|---|\n");
    kv_rng r;
    kv_rng_init(&r, 2);
    for (int bits = 2; bits <= 4; bits += 2) {
        for (int axis = 0; axis < 2; axis++) {
            kv_uniform u = {.bits = bits, .group = 64, .axis = (kv_axis)axis, .param_type = KV_PARAM_F16};
            g.u = &u;
            const double tc = gpu_best_ms(reps, gpu_copy, &g);
            const double te = gpu_best_ms(reps, gpu_uenc, &g);
            const double td = gpu_best_ms(reps, gpu_udec, &g);
            const double ts = axis == KV_AXIS_TOKENS ? gpu_best_ms(reps, gpu_uscore, &g) : 0.0;
            gpu_row(axis == KV_AXIS_TOKENS ? "uniform, G=64 along tokens (keys)" : "uniform, G=64 along channels (values)",
                    bits, bytes, te, td, ts, tc);
        }
        {
            const int gn = bits == 2 ? 16 : 256;
            float *grid = NULL, *dgrid = NULL;
            kv_grid_opts go = {.seed = 1, .samples = (size_t)gn * 256, .max_iters = 30};
            if (kv_grid_generate(&grid, NULL, 2, gn, &go) != KV_OK) return 1;
            cudaMalloc((void **)&dgrid, (size_t)gn * 2 * 4);
            cudaMemcpy(dgrid, grid, (size_t)gn * 2 * 4, cudaMemcpyHostToDevice);
            kv_higgs h = {.dim = 2, .size = gn, .group = 128, .norm_type = KV_PARAM_F16, .seed = 7, .grid = dgrid};
            g.h = &h;
            const double tc = gpu_best_ms(reps, gpu_copy, &g);
            const double te = gpu_best_ms(reps, gpu_henc, &g);
            const double td = gpu_best_ms(reps, gpu_hdec, &g);
            const double ts = gpu_best_ms(reps, gpu_hscore, &g);
            char name[96];
            snprintf(name, sizeof name, "HIGGS d=2 n=%d, g=128", gn);
            gpu_row(name, bits, bytes, te, td, ts, tc);
            cudaFree(dgrid);
            free(grid);
        }
        {
            kv_squat *sq = bench_squat(&r, C);
            kv_uniform u = {.bits = bits, .group = 64, .axis = KV_AXIS_TOKENS, .param_type = KV_PARAM_F16};
            g.u = &u;
            g.sq = sq;
            const double tc = gpu_best_ms(reps, gpu_copy, &g);
            const double te = gpu_best_ms(reps, gpu_senc, &g);
            gpu_row("SQuat keys d=128 g=64 r=5, G=64", bits, bytes, te, 0.0, 0.0, tc);
            kv_squat_free(sq);
        }
    }
    cudaFree(dx);
    cudaFree(dy);
    cudaFree(dq);
    cudaFree(dcodes);
    cudaFree(dp1);
    cudaFree(dp2);
    return 0;
}
#endif

/* --simd's argument as a kv_simd_level (the names in its order), -1 when unknown. */
static int simd_level_arg(const char *name) {
    static const char *const names[] = {"none", "sse2", "avx2"};
    for (int k = 0; k < 3; k++)
        if (!strcmp(name, names[k])) return k;
    return -1;
}

int main(int argc, char **argv) {
    size_t values = (size_t)1 << 24; /* 64 MiB of f32: far beyond the caches */
    int reps = 5;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--values") && i + 1 < argc)
            values = (size_t)strtoull(argv[++i], NULL, 10);
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc)
            reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--simd") && i + 1 < argc && simd_level_arg(argv[i + 1]) >= 0)
            kv_simd_level_limit((kv_simd_level)simd_level_arg(argv[++i]));
        else {
            fprintf(stderr, "usage: bench_kernels [--values N] [--reps R] [--simd none|sse2|avx2]\n");
            return 2;
        }
    }
    const size_t C = 128; /* one KV head of head_dim 128 */
    bench_ctx c = {.channels = C, .tokens = values / C};
    const size_t n = c.tokens * C;
    const double bytes = (double)n * sizeof(float);
    float *x = malloc(n * sizeof *x);
    c.y = malloc(n * sizeof *c.y);
    c.codes = malloc(n * sizeof *c.codes); /* generous: <= 1 word per value */
    c.p1 = malloc(n * sizeof(float));
    c.p2 = malloc(n * sizeof(float));
    if (!x || !c.y || !c.codes || !c.p1 || !c.p2) {
        fprintf(stderr, "bench: out of memory\n");
        return 1;
    }
    kv_rng r;
    kv_rng_init(&r, 1);
    for (size_t i = 0; i < n; i++) x[i] = (float)kv_rng_next_normal(&r);
    c.x = x;
    memset(c.y, 0, n * sizeof *c.y); /* fault the pages in before timing */
    memset(c.codes, 0, n * sizeof *c.codes);
    memset(c.p1, 0, n * sizeof(float));
    memset(c.p2, 0, n * sizeof(float));

    static const char *const level_name[] = {"portable C", "SSE2", "AVX2"};
    printf("bench_kernels: %zu values (%zu tokens x %zu channels, %.0f MiB f32), best of %d, 1 thread, thread CPU time, CPU paths: %s\n\n", n,
           c.tokens, C, bytes / 1048576.0, reps, level_name[kv_simd_level_now()]);
    printf("| quantizer (CPU) | bits | encode GB/s | vs memcpy | decode GB/s | vs memcpy | memcpy GB/s |\n");
    printf("|---|---|---|---|---|---|---|\n");
    op o = {.c = &c};
    double t_ukeys[5] = {0}, t_squat[5] = {0}, t_squat_loop[5] = {0}; /* by bits: the ratio lines below */
    for (int bits = 2; bits <= 4; bits += 2) {
        for (int axis = 0; axis < 2; axis++) {
            kv_uniform u = {.bits = bits, .group = axis == KV_AXIS_TOKENS ? 64 : 64, .axis = (kv_axis)axis,
                            .param_type = KV_PARAM_F16};
            o.u = &u;
            double tm, te, td;
            best_of3(reps, run_memcpy, run_uenc, run_udec, &o, &tm, &te, &td);
            char name[96];
            snprintf(name, sizeof name, "uniform, G=64 along %s", axis == KV_AXIS_TOKENS ? "tokens (keys)" : "channels (values)");
            row(name, bits, bytes, te, td, tm);
            if (axis == KV_AXIS_TOKENS) t_ukeys[bits] = te;
        }
        /* XQuant eta and KVmix 11-per-word 3-bit are the same loops; not repeated here. */
        {
            /* HIGGS d=2: n=16 (2 bits per value) or n=256 (4 bits), group 128, search accelerator */
            const int gn = bits == 2 ? 16 : 256;
            float *grid = NULL;
            kv_grid_opts go = {.seed = 1, .samples = (size_t)gn * 256, .max_iters = 30};
            if (kv_grid_generate(&grid, NULL, 2, gn, &go) != KV_OK) {
                fprintf(stderr, "bench: grid: %s\n", kv_error_last());
                return 1;
            }
            kv_grid_search *gs = NULL;
            if (kv_grid_search_create(&gs, grid, 2, gn) != KV_OK) return 1;
            kv_higgs h = {.dim = 2, .size = gn, .group = 128, .norm_type = KV_PARAM_F16, .seed = 7, .grid = grid, .search = gs};
            o.h = &h;
            double tm, te, td;
            best_of3(reps, run_memcpy, run_henc, run_hdec, &o, &tm, &te, &td);
            char name[96];
            snprintf(name, sizeof name, "HIGGS d=2 n=%d, g=128", gn);
            row(name, bits, bytes, te, td, tm);
            kv_grid_search_free(gs);
            free(grid);
        }
        {
            /* SQuat keys: d=128, block 64 (T=2), r=5, G=64 tokens; decode = uniform decode */
            kv_squat *sq = bench_squat(&r, C);
            kv_uniform u = {.bits = bits, .group = 64, .axis = KV_AXIS_TOKENS, .param_type = KV_PARAM_F16};
            o.u = &u;
            o.sq = sq;
            double tm, te, td;
            best_of3(reps, run_memcpy, run_senc, NULL, &o, &tm, &te, &td);
            row("SQuat keys d=128 g=64 r=5, G=64", bits, bytes, te, 0.0, tm);
            t_squat[bits] = te;
            best_of3(reps, run_memcpy, run_senc_loop, NULL, &o, &tm, &te, &td);
            row("SQuat keys, per-token loop (oracle)", bits, bytes, te, 0.0, tm);
            t_squat_loop[bits] = te;
            kv_squat_free(sq);
        }
    }
    printf("\n");
    for (int bits = 2; bits <= 4; bits += 2)
        printf("SQuat encode time / uniform keys encode time, %d bits: %.2fx (per-token loop: %.2fx; chunk GEMM "
               "speed-up over the loop %.1fx)\n", bits, t_squat[bits] / t_ukeys[bits], t_squat_loop[bits] / t_ukeys[bits],
               t_squat_loop[bits] / t_squat[bits]);
#ifdef KV_HAVE_CUDA
    if (kv_cuda_available()) {
        if (bench_gpu(x, c.tokens, C, reps) != 0) return 1;
    } else {
        printf("\n(GPU rows: no usable CUDA device in this run)\n");
    }
#else
    printf("\n(GPU rows: built without CUDA)\n");
#endif
    free(x);
    free(c.y);
    free(c.codes);
    free(c.p1);
    free(c.p2);
    return 0;
}
