/* decode_cost.c — the cost model of a decoding step (kv_bench.h): the cache's part per layer, measured by the runtime
 * on synthetic K/V, and the weights' part, measured by the model without a cache. */
#define _POSIX_C_SOURCE 200809L
#include "kv_bench.h"
#include "kvrt.h"
#include "model_cuda.h"

#include <stdlib.h>
#include <string.h>

#define SYNTH_SEED 0x736561726368ull /* the synthetic K/V's pattern (any fixed one: sizes and speed ignore values) */

kv_status kv_cache_feed_synthetic(kv_cache *cache, const kv_plan *plan, int ctx, double *seconds) {
    if (!cache || ctx < 1) return KV_ERR(KV_EINVAL, "kv_cache_feed_synthetic: bad arguments");
    const int L = cache->n_layers, kvd = cache->n_kv_heads * cache->head_dim;
    /* kvrun eval's steps: the sinks and a window first, then a window at a time (the f16 cache: 512 at a time) */
    const int recent = plan && plan->global.recent > 0 ? plan->global.recent : 512;
    const int first = (plan ? plan->global.sinks : 0) + recent, step = recent;
    const int maxn = first > step ? first : step;
    float *x = malloc((size_t)maxn * (size_t)kvd * sizeof(float));
    int32_t *pos = malloc((size_t)maxn * sizeof(int32_t));
    kv_status s = KV_OK;
    if (!x || !pos) {
        s = KV_ERR(KV_ENOMEM, "out of memory");
        goto done;
    }
    for (size_t i = 0; i < (size_t)maxn * (size_t)kvd; i++) x[i] = (float)(kv_rng_uniform(SYNTH_SEED, i) * 2.0 - 1.0);
    for (int p = 0; p < ctx && s == KV_OK;) {
        const int n = p == 0 ? first : step, len = n < ctx - p ? n : ctx - p;
        for (int i = 0; i < len; i++) pos[i] = p + i;
        for (int l = 0; l < L && s == KV_OK; l++) {
            const double t0 = seconds ? kv_now_seconds() : 0.0;
            s = kv_cache_append(cache, l, 0, len, pos, x, x, x, (size_t)kvd);
            if (seconds) seconds[l] += kv_now_seconds() - t0;
        }
        if (s == KV_OK && p == 0) s = kv_cache_end_prompt(cache, 0);
        p += len;
    }
done:
    free(x);
    free(pos);
    return s;
}

static int cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

void kv_decode_cost_free(kv_decode_cost *c) {
    if (!c) return;
    free(c->step);
    free(c->compress);
    memset(c, 0, sizeof *c);
}

kv_status kv_decode_cost_measure(kv_decode_cost *out, const kv_plan *plan, kv_model *m, int ctx, int steps) {
    if (!out || !m || ctx < 1 || steps < 1 || steps > 1024) return KV_ERR(KV_EINVAL, "kv_decode_cost_measure: bad arguments");
    memset(out, 0, sizeof *out);
    if (kv_model_cuda_stream(m))
        return KV_ERR(KV_EUNSUPPORTED, "the decoding cost model measures the CPU runtime; the model is on the GPU");
    const kv_arch *a = kv_model_arch(m);
    const int L = a->n_layers, kvd = a->n_kv_heads * a->head_dim, qd = a->n_heads * a->head_dim;
    out->n_layers = L, out->ctx = ctx, out->steps = steps;
    out->step = calloc((size_t)L, sizeof(double));
    out->compress = calloc((size_t)L, sizeof(double));
    double *t = malloc((size_t)L * (size_t)steps * sizeof(double));
    float *x = malloc((size_t)kvd * sizeof(float)), *q = malloc((size_t)qd * sizeof(float));
    float *o = malloc((size_t)qd * sizeof(float));
    kv_cache *cache = NULL;
    kv_status s = KV_OK;
    if (!out->step || !out->compress || !t || !x || !q || !o) {
        s = KV_ERR(KV_ENOMEM, "out of memory");
        goto done;
    }
    for (int i = 0; i < kvd; i++) x[i] = (float)(kv_rng_uniform(SYNTH_SEED + 1, (uint64_t)i) * 2.0 - 1.0);
    for (int i = 0; i < qd; i++) q[i] = (float)(kv_rng_uniform(SYNTH_SEED + 2, (uint64_t)i) * 2.0 - 1.0);
    if ((s = kv_cache_rt_create(&cache, plan, m, 1, ctx + steps + 1, 0, 0)) != KV_OK) goto done;
    if ((s = kv_cache_feed_synthetic(cache, plan, ctx, out->compress)) != KV_OK) goto done;
    kv_rt *rt = kv_cache_rt_runtime(cache);
    for (int i = -1; i < steps && s == KV_OK; i++) { /* i = -1: a step not timed (warm caches and pools) */
        const int32_t pos = ctx + 1 + i;
        for (int l = 0; l < L && s == KV_OK; l++) {
            const double t0 = kv_now_seconds();
            if ((s = kv_cache_append(cache, l, 0, 1, &pos, x, x, x, (size_t)kvd)) == KV_OK)
                s = kv_rt_attend(rt, l, 0, 1, q, (size_t)qd, o, (size_t)qd);
            if (i >= 0) t[(size_t)l * steps + i] = kv_now_seconds() - t0;
        }
    }
    if (s != KV_OK) goto done;
    for (int l = 0; l < L; l++) {
        out->compress[l] /= ctx;
        out->step[l] = median(t + (size_t)l * steps, steps);
        out->seconds += out->step[l] + out->compress[l];
    }
done:
    free(t);
    free(x);
    free(q);
    free(o);
    kv_cache_free(cache);
    if (s != KV_OK) kv_decode_cost_free(out);
    return s;
}

kv_status kv_decode_weights_seconds(double *out, kv_model *m, int steps) {
    if (!out || !m || steps < 1 || steps > 1024) return KV_ERR(KV_EINVAL, "kv_decode_weights_seconds: bad arguments");
    const int V = kv_model_arch(m)->vocab_size;
    float *logits = malloc((size_t)V * sizeof(float));
    double *t = malloc((size_t)steps * sizeof(double));
    kv_status s = KV_OK;
    if (!logits || !t) {
        s = KV_ERR(KV_ENOMEM, "out of memory");
        goto done;
    }
    for (int i = -1; i < steps && s == KV_OK; i++) { /* i = -1: the call not timed */
        const int32_t tok = (int32_t)((i + 2) % V);
        kv_forward f;
        memset(&f, 0, sizeof f);
        f.tokens = &tok, f.n_seqs = 1, f.n_tokens = 1, f.logits = logits, f.logits_last_only = 1;
        const double t0 = kv_now_seconds();
        s = kv_model_forward(m, &f);
        if (i >= 0) t[i] = kv_now_seconds() - t0;
    }
    if (s == KV_OK) *out = median(t, steps);
done:
    free(logits);
    free(t);
    return s;
}

double kv_decode_speed_ratio(double weights, double cache_seconds, double ref_seconds) {
    return (weights + ref_seconds) / (weights + cache_seconds);
}
