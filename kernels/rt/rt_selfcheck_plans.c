/* rt_selfcheck_plans.c — one small plan per kind of codec the device serves (kv_rt_selfcheck_catalog), for
 * `kvrun selfcheck`: SmolLM2's attention shape (3 KV heads of 64, 9 query heads), 4 layers, 4 sinks and chunks of
 * 32 tokens, every method, bit width, packing, group axis, parameter storage and combination (pre-RoPE keys,
 * XQuant shared codes, KVmix RPC and per-layer bits, AQUA-KV predictors, SQuat subspaces, layers with an attention
 * window). Grids, scales and
 * predictors are drawn from fixed seeds: the check compares devices, not fitted quality. */
#include "kvrt.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define CAT_LAYERS 4
#define CAT_KV_HEADS 3
#define CAT_HEAD_DIM 64

typedef struct cat_stream {
    int method;       /* kv_plan_method */
    int bits, group, axis, pack11, f32params;
    float eta, rpc;
    int gd, gn;       /* HIGGS grid; float methods: gd = 1 for a scale per KV head */
} cat_stream;

typedef struct cat_entry {
    const char *name;
    cat_stream k, v;
    cat_stream k0, v0; /* layer 0 when has_l0 */
    int has_l0, pre_rope, aqua, xquant, squat; /* squat: 1 static basis, 2 prompt subspace */
    int window; /* > 0: layers 0 and 2 attend over a window of this many tokens (plan 1.5, Gemma 3's local layers) */
} cat_entry;

#define U(b, g, ax) {KV_PLAN_UNIFORM, b, g, ax, 0, 0, 0.0f, 0.0f, 0, 0}
#define HG(g, d, n) {KV_PLAN_HIGGS, 0, g, KV_PLAN_GROUP_CHANNELS, 0, 0, 0.0f, 0.0f, d, n}
#define FP(b) {KV_PLAN_FP, b, 0, 0, 0, 0, 0.0f, 0.0f, 0, 0}
#define FL(m, per_head) {m, 0, 0, 0, 0, 0, 0.0f, 0.0f, per_head, 0}
#define NONE {KV_PLAN_FP, 16, 0, 0, 0, 0, 0.0f, 0.0f, 0, 0}
enum { TOK = KV_PLAN_GROUP_TOKENS, CH = KV_PLAN_GROUP_CHANNELS };

static const cat_entry k_catalog[] = {
    {"f16", FP(16), FP(16), NONE, NONE, 0, 0, 0, 0, 0, 0},
    {"f32", FP(32), FP(32), NONE, NONE, 0, 0, 0, 0, 0, 0},
    {"kivi-1", U(1, 32, TOK), U(1, 32, CH), NONE, NONE, 0, 0, 0, 0, 0, 0},
    {"kivi-2", U(2, 32, TOK), U(2, 32, CH), NONE, NONE, 0, 0, 0, 0, 0, 0},
    {"kivi-3 (10 per word)", U(3, 32, TOK), U(3, 32, CH), NONE, NONE, 0, 0, 0, 0, 0, 0},
    {"kivi-3 (11 per word)", {KV_PLAN_UNIFORM, 3, 32, TOK, 1, 0, 0.0f, 0.0f, 0, 0},
     {KV_PLAN_UNIFORM, 3, 32, CH, 1, 0, 0.0f, 0.0f, 0, 0}, NONE, NONE, 0, 0, 0, 0, 0, 0},
    {"kivi-4 eta f32 params", {KV_PLAN_UNIFORM, 4, 16, TOK, 0, 1, 0.05f, 0.0f, 0, 0},
     {KV_PLAN_UNIFORM, 4, 16, CH, 0, 1, 0.08f, 0.0f, 0, 0}, NONE, NONE, 0, 0, 0, 0, 0, 0},
    {"kivi-8", U(8, 32, TOK), U(8, 64, CH), NONE, NONE, 0, 0, 0, 0, 0, 0},
    {"kivi channel keys, token values", U(2, 64, CH), U(4, 16, TOK), NONE, NONE, 0, 0, 0, 0, 0, 0},
    {"kivi-2 g128", U(2, 32, TOK), U(2, 128, CH), NONE, NONE, 0, 0, 0, 0, 0, 0},
    {"kivi-2 pre-rope", U(2, 32, TOK), U(2, 32, CH), NONE, NONE, 0, 1, 0, 0, 0, 0},
    {"higgs d1 n4", HG(0, 1, 4), HG(0, 1, 4), NONE, NONE, 0, 0, 0, 0, 0, 0},
    {"higgs d2 n16", HG(0, 2, 16), HG(0, 2, 16), NONE, NONE, 0, 0, 0, 0, 0, 0},
    {"higgs d4 n256 g32", HG(32, 4, 256), HG(32, 4, 256), NONE, NONE, 0, 0, 0, 0, 0, 0},
    {"higgs d8 n256", HG(0, 8, 256), HG(0, 8, 256), NONE, NONE, 0, 0, 0, 0, 0, 0},
    {"higgs pre-rope", HG(0, 2, 16), HG(0, 2, 256), NONE, NONE, 0, 1, 0, 0, 0, 0},
    {"fp8 e4m3 tensor/head", FL(KV_PLAN_FP8_E4M3, 0), FL(KV_PLAN_FP8_E4M3, 1), NONE, NONE, 0, 0, 0, 0, 0, 0},
    {"fp8 e5m2", FL(KV_PLAN_FP8_E5M2, 1), FL(KV_PLAN_FP8_E5M2, 0), NONE, NONE, 0, 0, 0, 0, 0, 0},
    {"nvfp4 tensor/head", FL(KV_PLAN_NVFP4, 0), FL(KV_PLAN_NVFP4, 1), NONE, NONE, 0, 0, 0, 0, 0, 0},
    {"fp8 pre-rope", FL(KV_PLAN_FP8_E4M3, 1), FL(KV_PLAN_NVFP4, 1), NONE, NONE, 0, 1, 0, 0, 0, 0},
    {"xquant shared codes, 1-bit", U(1, 32, TOK), {KV_PLAN_UNIFORM, 1, 32, CH, 0, 0, 0.2f, 0.0f, 0, 0}, U(2, 32, TOK),
     U(2, 32, CH), 1, 0, 0, 1, 0, 0},
    {"kvmix rpc, per-layer bits", {KV_PLAN_UNIFORM, 2, 8, TOK, 0, 0, 0.0f, 0.2f, 0, 0},
     {KV_PLAN_UNIFORM, 2, 32, CH, 0, 0, 0.0f, 0.1f, 0, 0}, {KV_PLAN_UNIFORM, 3, 8, TOK, 0, 0, 0.0f, 0.2f, 0, 0},
     {KV_PLAN_UNIFORM, 4, 32, CH, 0, 0, 0.0f, 0.2f, 0, 0}, 1, 0, 0, 0, 0, 0},
    {"aqua-kv higgs pre-rope", HG(0, 2, 16), HG(0, 2, 16), HG(0, 2, 256), HG(0, 2, 256), 1, 1, 1, 0, 0, 0},
    {"aqua-kv uniform", U(2, 16, CH), U(2, 16, CH), U(4, 16, CH), U(4, 16, CH), 1, 0, 1, 0, 0, 0},
    {"squat static", U(2, 32, TOK), U(2, 32, CH), NONE, NONE, 0, 0, 0, 0, 1, 0},
    {"squat prompt", U(2, 32, TOK), U(2, 32, CH), NONE, NONE, 0, 0, 0, 0, 2, 0},
    {"kivi-2 windows (layers 0, 2: 40 tokens)", U(2, 32, TOK), U(2, 32, CH), NONE, NONE, 0, 0, 0, 0, 0, 40},
    {"higgs pre-rope windows", HG(0, 2, 16), HG(0, 2, 256), NONE, NONE, 0, 1, 0, 0, 0, 40},
};

static kv_status set_stream(kv_plan *p, int l, int st, const cat_stream *s, int pre_rope) {
    kv_plan_stream *ps = &p->layers[l].stream[st];
    ps->method = (kv_plan_method)s->method;
    ps->scale_dtype = s->f32params ? KV_DTYPE_F32 : KV_DTYPE_F16;
    ps->rpc_ratio = s->rpc;
    ps->pre_rope = st == KV_PLAN_K ? pre_rope : 0;
    ps->higgs_grid = -1;
    if (s->method == KV_PLAN_FP) {
        ps->bits = s->bits, ps->group_size = 0, ps->scale_dtype = KV_DTYPE_F32;
        return KV_OK;
    }
    if (kv_plan_method_is_float(s->method)) {
        const int nv = s->method == KV_PLAN_NVFP4, nh = s->gd ? CAT_KV_HEADS : 1;
        ps->bits = nv ? 4 : 8, ps->group_size = nv ? 16 : 0;
        ps->group_axis = nv ? KV_PLAN_GROUP_CHANNELS : KV_PLAN_GROUP_TOKENS, ps->scale_dtype = KV_DTYPE_F32;
        const float base = s->method == KV_PLAN_FP8_E4M3 ? 3.5f / 448.0f : s->method == KV_PLAN_FP8_E5M2 ? 1.0f : 4.0f / 2688.0f;
        float sc[CAT_KV_HEADS];
        for (int h = 0; h < nh; h++) sc[h] = base * (1.0f + 0.375f * (float)h);
        return kv_plan_set_fp_scales(p, l, st, nh, sc);
    }
    if (s->method == KV_PLAN_UNIFORM) {
        ps->bits = s->bits, ps->group_size = s->group, ps->group_axis = (kv_plan_group_axis)s->axis;
        ps->eta = s->eta, ps->pack = s->pack11 ? KV_PLAN_PACK_3BIT_11 : KV_PLAN_PACK_WORD;
        return KV_OK;
    }
    int gi = -1;
    for (int i = 0; i < p->n_grids; i++)
        if (p->grids[i].d == s->gd && p->grids[i].n == s->gn) gi = i;
    if (gi < 0) { /* points drawn from the standard Gaussian, fixed seed */
        float *g = malloc(sizeof(float) * (size_t)(s->gd * s->gn));
        if (!g) return KV_ERR(KV_ENOMEM, "out of memory");
        kv_rng r;
        kv_rng_init(&r, 1000u + (uint64_t)(s->gd * 1000 + s->gn));
        for (int i = 0; i < s->gd * s->gn; i++) g[i] = (float)kv_rng_next_normal(&r);
        const kv_status st2 = kv_plan_add_grid(p, s->gd, s->gn, g, &gi);
        free(g);
        if (st2 != KV_OK) return st2;
    }
    ps->bits = 0, ps->group_size = s->group ? s->group : CAT_HEAD_DIM, ps->group_axis = KV_PLAN_GROUP_CHANNELS;
    ps->higgs_grid = gi;
    return KV_OK;
}

/* AQUA-KV predictors of layer l: K(l-1) -> K(l), [V(l-1); K(l)] -> V(l), small random weights. */
static kv_status set_predictors(kv_plan *p, int l) {
    const int kvd = CAT_KV_HEADS * CAT_HEAD_DIM;
    float *wk = malloc(sizeof(float) * (size_t)kvd * kvd), *wv = malloc(sizeof(float) * (size_t)kvd * 2 * kvd);
    float *b = malloc(sizeof(float) * (size_t)kvd);
    kv_status s = KV_ERR(KV_ENOMEM, "out of memory");
    if (wk && wv && b) {
        kv_rng r;
        kv_rng_init(&r, 31u + (uint64_t)l);
        for (int i = 0; i < kvd * kvd; i++) wk[i] = (float)(0.5 / sqrt((double)kvd) * kv_rng_next_normal(&r));
        for (int i = 0; i < 2 * kvd * kvd; i++) wv[i] = (float)(0.3 / sqrt((double)kvd) * kv_rng_next_normal(&r));
        for (int i = 0; i < kvd; i++) b[i] = (float)(0.1 * kv_rng_next_normal(&r));
        const kv_plan_pred_input ik[1] = {{l - 1, KV_PLAN_K}}, iv[2] = {{l - 1, KV_PLAN_V}, {l, KV_PLAN_K}};
        s = kv_plan_set_predictor(p, l, KV_PLAN_K, 1, ik, wk, b);
        if (s == KV_OK) s = kv_plan_set_predictor(p, l, KV_PLAN_V, 2, iv, wv, b);
    }
    free(wk), free(wv), free(b);
    return s;
}

/* A SQuat basis per KV head: r orthogonal-ish rows scaled like singular values (fixed seed). */
static kv_status set_squat(kv_plan *p, int l, int variant) {
    const int r = 4, n = CAT_KV_HEADS * r * CAT_HEAD_DIM;
    float *basis = malloc(sizeof(float) * (size_t)n);
    if (!basis) return KV_ERR(KV_ENOMEM, "out of memory");
    kv_rng g;
    kv_rng_init(&g, 77u + (uint64_t)l);
    for (int i = 0; i < n; i++) basis[i] = (float)(3.0 * kv_rng_next_normal(&g));
    kv_status s = kv_plan_set_squat(p, l, r, 1e-4f, 16, basis);
    free(basis);
    if (s == KV_OK) p->layers[l].stream[KV_PLAN_K].squat->static_subspace = variant == 1;
    return s;
}

int kv_rt_selfcheck_catalog_size(void) { return (int)(sizeof k_catalog / sizeof k_catalog[0]); }

kv_status kv_rt_selfcheck_catalog(int i, kv_plan **out, const char **name) {
    *out = NULL;
    if (i < 0 || i >= kv_rt_selfcheck_catalog_size()) return KV_ERR(KV_EINVAL, "selfcheck catalogue: no entry %d", i);
    const cat_entry *e = &k_catalog[i];
    if (name) *name = e->name;
    kv_plan_fingerprint fp;
    memset(&fp, 0, sizeof fp);
    memcpy(fp.arch, "llama", 6);
    fp.n_layers = CAT_LAYERS, fp.n_kv_heads = CAT_KV_HEADS, fp.head_dim = CAT_HEAD_DIM;
    fp.n_heads = CAT_KV_HEADS * 3, fp.d_model = fp.n_heads * CAT_HEAD_DIM, fp.vocab_size = 32, fp.rope_theta = 10000.0f;
    kv_plan *p = NULL;
    kv_status s = kv_plan_create(&p, &fp);
    if (s != KV_OK) return s;
    p->global.sinks = 4, p->global.recent = 32, p->global.rht_seed = 77;
    for (int l = 0; l < CAT_LAYERS && s == KV_OK; l++) {
        const int first = l == 0 && e->has_l0;
        s = set_stream(p, l, KV_PLAN_K, first ? &e->k0 : &e->k, e->pre_rope);
        if (s == KV_OK) s = set_stream(p, l, KV_PLAN_V, first ? &e->v0 : &e->v, 0);
        if (s == KV_OK && e->xquant && l >= 2 && l % 2 == 1) /* layer 3 decodes layer 2's 1-bit codes */
            p->layers[l].stream[KV_PLAN_K].share_codes_with_layer = p->layers[l].stream[KV_PLAN_V].share_codes_with_layer =
                l - 1;
        if (s == KV_OK && e->aqua && l >= 1) s = set_predictors(p, l);
        if (s == KV_OK && e->squat) s = set_squat(p, l, e->squat);
        if (l % 2 == 0) p->layers[l].window = e->window;
    }
    if (s == KV_OK) s = kv_plan_validate(p);
    if (s != KV_OK) {
        kv_plan_free(p);
        return kv_error_wrap(s, "selfcheck catalogue entry '%s': ", e->name);
    }
    *out = p;
    return KV_OK;
}
