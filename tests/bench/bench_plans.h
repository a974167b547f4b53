/* bench_plans.h — the plans the benchmarks time (bench_attend, bench_attend_cuda, bench_model_cuda): one per
 * method, built in memory for any attention shape, with fixed seeds (speed does not depend on fitted values).
 *   f16       every stream f16 (sinks 0, f16 blocks of 64: this engine's f16 cache)
 *   kivi-B    uniform B bits, keys grouped along 32 tokens, values along 32 channels, f16 scales
 *             (honest bits B + 1); kivi-2g128: values along 128 channels (and keys 32 tokens)
 *   higgs-B   HIGGS d = 2, 2^(2B) points, a group per head (B + 32 / head_dim bits); -r: keys before RoPE
 *   aqua-B    layer 0 HIGGS-4, then random predictors (K from the previous K, V from the previous V and
 *             this K) with HIGGS-B residuals, keys before RoPE; aqua-Bk keeps the reconstructions;
 *             aqua-2r32: rank-32 predictors (random factors, plan 1.3), as `kvcal search`'s aqua2r32
 *   fp8       E4M3, a scale per KV head; nvfp4: E2M1 with E4M3 scales per 16 channels
 * Every plan but f16 keeps 4 sinks and a window of 128 (the runtime's defaults). */
#ifndef KV_BENCH_PLANS_H
#define KV_BENCH_PLANS_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvrt.h"

typedef struct bench_method {
    const char *name;
    int kind; /* 0 f16, 1 kivi, 2 higgs, 3 aqua, 4 fp8 e4m3, 5 nvfp4 */
    int bits;
    int pre_rope;
    int keep;   /* AQUA-KV: keep the reconstructions */
    int vgroup; /* kivi: values' channel group */
    int rank;   /* AQUA-KV: rank of the predictors' factors (0: full) */
} bench_method;

static const bench_method k_bench_methods[] = {
    {"f16", 0, 16, 0, 0, 0, 0},        {"kivi-2", 1, 2, 0, 0, 32, 0}, {"kivi-2g128", 1, 2, 0, 0, 128, 0},
    {"kivi-4", 1, 4, 0, 0, 32, 0},     {"higgs-2", 2, 2, 0, 0, 0, 0}, {"higgs-2r", 2, 2, 1, 0, 0, 0},
    {"higgs-4", 2, 4, 0, 0, 0, 0},     {"aqua-2", 3, 2, 1, 0, 0, 0},  {"aqua-2k", 3, 2, 1, 1, 0, 0},
    {"aqua-2r32", 3, 2, 1, 0, 0, 32},  {"fp8", 4, 8, 0, 0, 0, 0},     {"nvfp4", 5, 4, 0, 0, 0, 0},
};
#define BENCH_N_METHODS ((int)(sizeof k_bench_methods / sizeof k_bench_methods[0]))

static const bench_method *bench_method_find(const char *name) {
    for (int i = 0; i < BENCH_N_METHODS; i++)
        if (strcmp(k_bench_methods[i].name, name) == 0) return &k_bench_methods[i];
    return NULL;
}

static void bench_die(const char *who, kv_status s) {
    fprintf(stderr, "%s: %s: %s\n", who, kv_status_name(s), kv_error_last());
    exit(1);
}

static kv_plan *bench_make_plan(const bench_method *me, int L, int H, int hd, int gqa) {
    kv_plan_fingerprint fp;
    memset(&fp, 0, sizeof fp);
    snprintf(fp.arch, sizeof fp.arch, "llama");
    fp.n_layers = L, fp.n_kv_heads = H, fp.head_dim = hd, fp.n_heads = H * gqa, fp.d_model = H * gqa * hd;
    fp.vocab_size = 32, fp.rope_theta = 10000.0f;
    kv_plan *p = NULL;
    kv_status s = kv_plan_create(&p, &fp);
    if (s != KV_OK) bench_die("bench plan", s);
    p->global.sinks = me->kind == 0 ? 0 : 4;
    p->global.recent = me->kind == 0 ? 64 : 128;
    p->global.rht_seed = 5;
    int gi = 0, g4 = 0;
    if (me->kind == 2 || me->kind == 3) {
        const int d = 2;
        for (int pass = 0; pass < (me->kind == 3 ? 2 : 1); pass++) {
            const int n = 1 << ((pass ? 4 : me->bits) * d);
            float *g = malloc(sizeof(float) * (size_t)(d * n));
            kv_rng r;
            kv_rng_init(&r, 3);
            for (int i = 0; i < d * n; i++) g[i] = (float)kv_rng_next_normal(&r);
            if ((s = kv_plan_add_grid(p, d, n, g, pass ? &g4 : &gi)) != KV_OK) bench_die("bench plan", s);
            free(g);
        }
    }
    const int kvd = H * hd;
    float *w = me->kind == 3 ? malloc(sizeof(float) * (size_t)kvd * 2 * kvd) : NULL, *b = NULL;
    if (w) {
        kv_rng r;
        kv_rng_init(&r, 11);
        b = calloc((size_t)kvd, sizeof(float));
        for (size_t i = 0; i < (size_t)kvd * 2 * kvd; i++) w[i] = (float)(0.3 / sqrt((double)kvd) * kv_rng_next_normal(&r));
    }
    float sc[256];
    for (int h = 0; h < H && h < 256; h++) sc[h] = (me->kind == 5 ? 4.0f / 2688.0f : 3.5f / 448.0f) * (1.0f + 0.1f * (float)h);
    for (int l = 0; l < L; l++) {
        kv_plan_stream *k = &p->layers[l].stream[KV_PLAN_K], *v = &p->layers[l].stream[KV_PLAN_V];
        k->pre_rope = me->pre_rope;
        if (me->kind == 3) {
            k->method = v->method = KV_PLAN_HIGGS, k->bits = v->bits = 0, k->group_size = v->group_size = hd;
            k->group_axis = v->group_axis = KV_PLAN_GROUP_CHANNELS, k->higgs_grid = v->higgs_grid = l ? gi : g4;
            k->scale_dtype = v->scale_dtype = KV_DTYPE_F16;
            if (l) {
                const kv_plan_pred_input ik[1] = {{l - 1, KV_PLAN_K}}, iv[2] = {{l - 1, KV_PLAN_V}, {l, KV_PLAN_K}};
                if ((s = kv_plan_set_predictor(p, l, KV_PLAN_K, 1, ik, w, b)) != KV_OK) bench_die("bench plan", s);
                if ((s = kv_plan_set_predictor(p, l, KV_PLAN_V, 2, iv, w, b)) != KV_OK) bench_die("bench plan", s);
                if (me->rank > 0) { /* factors of the same scale: left kvd x r, right r x in_dim */
                    const int r = me->rank;
                    float *lf = malloc(sizeof(float) * (size_t)kvd * (size_t)r), *rf = malloc(sizeof(float) * (size_t)r * 2 * (size_t)kvd);
                    kv_rng rr;
                    kv_rng_init(&rr, 13u + (uint64_t)l);
                    for (size_t i = 0; i < (size_t)kvd * (size_t)r; i++) lf[i] = (float)(0.5 / sqrt((double)r) * kv_rng_next_normal(&rr));
                    for (size_t i = 0; i < (size_t)r * 2 * (size_t)kvd; i++) rf[i] = (float)(0.6 / sqrt((double)kvd) * kv_rng_next_normal(&rr));
                    if ((s = kv_plan_set_predictor_factors(p, l, KV_PLAN_K, r, lf, rf)) != KV_OK) bench_die("bench plan", s);
                    if ((s = kv_plan_set_predictor_factors(p, l, KV_PLAN_V, r, lf, rf)) != KV_OK) bench_die("bench plan", s);
                    free(lf), free(rf);
                }
            }
        } else if (me->kind == 1) {
            k->method = v->method = KV_PLAN_UNIFORM, k->bits = v->bits = me->bits;
            k->group_size = 32, v->group_size = me->vgroup;
            k->group_axis = KV_PLAN_GROUP_TOKENS, v->group_axis = KV_PLAN_GROUP_CHANNELS;
            k->scale_dtype = v->scale_dtype = KV_DTYPE_F16;
        } else if (me->kind == 2) {
            k->method = v->method = KV_PLAN_HIGGS, k->bits = v->bits = 0, k->group_size = v->group_size = hd;
            k->group_axis = v->group_axis = KV_PLAN_GROUP_CHANNELS, k->higgs_grid = v->higgs_grid = gi;
            k->scale_dtype = v->scale_dtype = KV_DTYPE_F16;
        } else if (me->kind == 4 || me->kind == 5) {
            const int nv = me->kind == 5;
            for (int st = 0; st < 2; st++) {
                kv_plan_stream *ps = st ? v : k;
                ps->method = nv ? KV_PLAN_NVFP4 : KV_PLAN_FP8_E4M3, ps->bits = nv ? 4 : 8, ps->group_size = nv ? 16 : 0;
                ps->group_axis = nv ? KV_PLAN_GROUP_CHANNELS : KV_PLAN_GROUP_TOKENS, ps->scale_dtype = KV_DTYPE_F32;
                if ((s = kv_plan_set_fp_scales(p, l, st, H, sc)) != KV_OK) bench_die("bench plan", s);
            }
        }
    }
    free(w);
    free(b);
    if ((s = kv_plan_validate(p)) != KV_OK) bench_die("bench plan", s);
    return p;
}

#endif
