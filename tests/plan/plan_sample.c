/* The sample plan and helpers shared by the plan tests, the golden writer and the fuzz corpus. */
#include "plan_sample.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

void plan_sample_fingerprint(kv_plan_fingerprint *fp) {
    memset(fp, 0, sizeof *fp);
    strcpy(fp->arch, "llama");
    fp->n_layers = 3;
    fp->d_model = 32;
    fp->n_heads = 4;
    fp->n_kv_heads = 2;
    fp->head_dim = 4;
    fp->vocab_size = 100;
    fp->rope_theta = 10000.0f;
    for (int i = 0; i < 32; i++) fp->kv_sha256[i] = (uint8_t)(0xA0 + i);
}

/* Values on a 1/16 grid: exactly representable, and they compress (the golden file has a ZLIB section). */
static float q16(int i) { return (float)((i * 7) % 33 - 16) / 16.0f; }

kv_status plan_sample_make(kv_plan **out) {
    kv_plan_fingerprint fp;
    plan_sample_fingerprint(&fp);
    kv_plan *p = NULL;
    kv_status s = kv_plan_create(&p, &fp);
    if (s != KV_OK) return s;
    p->global.sinks = 4;
    p->global.recent = 96;
    p->global.prune_method = KV_PLAN_PRUNE_SNAPKV;
    p->global.prune_budget = 0.25f;
    p->global.prune_window = 16;
    p->global.prune_pool = 5;
    p->global.rht_seed = 0x0123456789ABCDEFull;

    float g0[16 * 2], g1[4];
    for (int i = 0; i < 32; i++) g0[i] = q16(i);
    g1[0] = -1.5f, g1[1] = -0.5f, g1[2] = 0.5f, g1[3] = 1.5f;
    int gi0 = -1, gi1 = -1;
    if ((s = kv_plan_add_grid(p, 2, 16, g0, &gi0)) != KV_OK) goto fail;
    if ((s = kv_plan_add_grid(p, 1, 4, g1, &gi1)) != KV_OK) goto fail;

    /* layer 0: HIGGS on both streams (AQUA-KV's directly quantized first layer) */
    kv_plan_stream *k0 = &p->layers[0].stream[KV_PLAN_K], *v0 = &p->layers[0].stream[KV_PLAN_V];
    k0->method = KV_PLAN_HIGGS, k0->bits = 0, k0->group_size = 8, k0->group_axis = KV_PLAN_GROUP_CHANNELS;
    k0->scale_dtype = KV_DTYPE_F32, k0->higgs_grid = gi0, k0->pre_rope = 1;
    v0->method = KV_PLAN_HIGGS, v0->bits = 0, v0->group_size = 4, v0->group_axis = KV_PLAN_GROUP_CHANNELS;
    v0->scale_dtype = KV_DTYPE_F16, v0->higgs_grid = gi1;
    /* layer 1: uniform with predictors; keys 3-bit 11/word with SQuat; values 2-bit per token */
    kv_plan_stream *k1 = &p->layers[1].stream[KV_PLAN_K], *v1 = &p->layers[1].stream[KV_PLAN_V];
    k1->method = KV_PLAN_UNIFORM, k1->bits = 3, k1->group_size = 32, k1->group_axis = KV_PLAN_GROUP_TOKENS;
    k1->scale_dtype = KV_DTYPE_F16, k1->eta = 0.05f, k1->pack = KV_PLAN_PACK_3BIT_11, k1->pre_rope = 1;
    k1->rpc_ratio = 0.2f;
    v1->method = KV_PLAN_UNIFORM, v1->bits = 2, v1->group_size = 8, v1->group_axis = KV_PLAN_GROUP_CHANNELS;
    v1->scale_dtype = KV_DTYPE_F32, v1->eta = 0.125f, v1->rpc_ratio = 0.1f;
    p->layers[1].prune_budget = 0.5f;
    float wk[8 * 8], bk[8], wv[8 * 16], bv[8];
    for (int i = 0; i < 64; i++) wk[i] = (i % 9 == 0) ? 1.0f : q16(i) / 8.0f;
    for (int i = 0; i < 128; i++) wv[i] = q16(i + 3) / 4.0f;
    for (int i = 0; i < 8; i++) bk[i] = (float)i / 32.0f, bv[i] = -(float)i / 64.0f;
    const kv_plan_pred_input ik[1] = {{0, KV_PLAN_K}};
    const kv_plan_pred_input iv[2] = {{0, KV_PLAN_V}, {1, KV_PLAN_K}};
    if ((s = kv_plan_set_predictor(p, 1, KV_PLAN_K, 1, ik, wk, bk)) != KV_OK) goto fail;
    if ((s = kv_plan_set_predictor(p, 1, KV_PLAN_V, 2, iv, wv, bv)) != KV_OK) goto fail;
    float basis[2 * 2 * 4];
    for (int i = 0; i < 16; i++) basis[i] = q16(i + 5);
    if ((s = kv_plan_set_squat(p, 1, 2, 1e-3f, 2, basis)) != KV_OK) goto fail;
    /* layer 2: keys reuse layer 1's codes (XQuant), values in full precision */
    kv_plan_stream *k2 = &p->layers[2].stream[KV_PLAN_K];
    *k2 = *k1;
    k2->predictor = NULL;
    k2->squat = NULL;
    k2->share_codes_with_layer = 1;
    k2->eta = 0.0f;
    k2->scale_dtype = KV_DTYPE_F32;
    p->layers[2].stream[KV_PLAN_V].rpc_ratio = 0.1f;

    kv_plan_provenance v = {0};
    v.tool_version = "kvcal 0.1.0";
    v.git_hash = "0123456789abcdef0123456789abcdef01234567";
    v.corpus_sha256 = "4cd0f6876d07a413aa911261ff6d363c72d757d47f0fdd6015702014c89cb9c7";
    v.seed = 42;
    v.created = 1700000000;
    v.config_yaml = "method: aqua\nseed: 42\ndata:\n  seq_len: 1024\n  max_tokens: 262144\n"
                    "keys:\n  bits: 3\n  group_size: 32\nvalues:\n  bits: 2\n  group_size: 8\n";
    if ((s = kv_plan_set_provenance(p, &v)) != KV_OK) goto fail;
    const char *names[3] = {"rel_mse", "explained_var", "quant_rel_err"};
    float vals[3 * 2 * 3];
    for (int i = 0; i < 18; i++) vals[i] = (float)i / 64.0f;
    vals[0] = NAN; /* layer 0 K has no predictor: not measured */
    if ((s = kv_plan_set_report(p, 3, names, vals)) != KV_OK) goto fail;
    *out = p;
    return KV_OK;
fail:
    kv_plan_free(p);
    return s;
}

kv_status plan_sample_make_v1_1(kv_plan **out) {
    kv_plan *p = NULL;
    kv_status s = plan_sample_make(&p);
    if (s != KV_OK) return s;
    kv_plan_stream *v2 = &p->layers[2].stream[KV_PLAN_V];
    v2->method = KV_PLAN_FP8_E4M3, v2->bits = 8;
    const float sc[2] = {0.5f, 0.0625f};
    if ((s = kv_plan_set_fp_scales(p, 2, KV_PLAN_V, 2, sc)) != KV_OK) {
        kv_plan_free(p);
        return s;
    }
    *out = p;
    return KV_OK;
}

/* 1.1 plus a SQuat stream with the static subspace and an f16 predictor (format 1.2). */
kv_status plan_sample_make_v1_2(kv_plan **out) {
    kv_plan *p = NULL;
    kv_status s = plan_sample_make_v1_1(&p);
    if (s != KV_OK) return s;
    p->layers[1].stream[KV_PLAN_K].squat->static_subspace = 1;
    /* the sample's values are on a 1/16 grid: f16 values already, so the rounding changes nothing */
    if ((s = kv_plan_set_predictor_dtype(p, 1, KV_PLAN_V, KV_DTYPE_F16)) != KV_OK) {
        kv_plan_free(p);
        return s;
    }
    *out = p;
    return KV_OK;
}

kv_status plan_sample_make_v1_3(kv_plan **out) {
    kv_plan *p = NULL;
    kv_status s = plan_sample_make_v1_2(&p);
    if (s != KV_OK) return s;
    /* factors on a 1/8 grid (f16 values, small products: the product is exact in f32 as well) */
    float lk[8 * 2], rk[2 * 8], lv[8 * 3], rv[3 * 16];
    for (int i = 0; i < 16; i++) lk[i] = (float)((i * 5) % 9 - 4) / 8.0f, rk[i] = (float)((i * 3) % 7 - 3) / 8.0f;
    for (int i = 0; i < 24; i++) lv[i] = (float)((i * 7) % 11 - 5) / 8.0f;
    for (int i = 0; i < 48; i++) rv[i] = (float)((i * 5) % 13 - 6) / 8.0f;
    if ((s = kv_plan_set_predictor_factors(p, 1, KV_PLAN_K, 2, lk, rk)) != KV_OK ||
        (s = kv_plan_set_predictor_factors(p, 1, KV_PLAN_V, 3, lv, rv)) != KV_OK) {
        kv_plan_free(p);
        return s;
    }
    *out = p;
    return KV_OK;
}

kv_status plan_sample_make_v1_4(kv_plan **out) {
    kv_plan *p = NULL;
    kv_status s = plan_sample_make_v1_3(&p);
    if (s != KV_OK) return s;
    /* V's predictor back to full rank (a quantized predictor is), then codes 0..15 in a fixed pattern with f16
     * scales and offsets: 8 rows x 16 columns, 2 groups per row */
    const kv_plan_predictor *v = p->layers[1].stream[KV_PLAN_V].predictor;
    uint8_t codes[8 * 16];
    float sc[16], of[16], w[8 * 16], b[8];
    for (int i = 0; i < 8 * 16; i++) codes[i] = (uint8_t)((i * 7 + 3) % 16), w[i] = 0.0f;
    for (int g = 0; g < 16; g++) sc[g] = (float)(g % 5 + 1) / 64.0f, of[g] = (float)(g % 7 - 3) / 8.0f;
    memcpy(b, v->bias, sizeof b);
    if ((s = kv_plan_set_predictor(p, 1, KV_PLAN_V, v->n_inputs, v->inputs, w, b)) != KV_OK ||
        (s = kv_plan_set_predictor_dtype(p, 1, KV_PLAN_V, KV_DTYPE_F16)) != KV_OK ||
        (s = kv_plan_set_predictor_quantized(p, 1, KV_PLAN_V, 4, 8, codes, sc, of)) != KV_OK) {
        kv_plan_free(p);
        return s;
    }
    *out = p;
    return KV_OK;
}

kv_status plan_sample_make_v1_5(kv_plan **out) {
    kv_plan *p = NULL;
    kv_status s = plan_sample_make_v1_4(&p);
    if (s != KV_OK) return s;
    p->layers[0].window = 512; /* local, global, local (Gemma 3's pattern, shortened) */
    p->layers[2].window = 7;
    *out = p;
    return KV_OK;
}

/* ---- comparison ---------------------------------------------------------------------------- */
static int feq(float a, float b) { return (isnan(a) && isnan(b)) || memcmp(&a, &b, sizeof a) == 0; }
static int farr_eq(const float *a, const float *b, size_t n) {
    if (!a || !b) return a == b;
    for (size_t i = 0; i < n; i++)
        if (!feq(a[i], b[i])) return 0;
    return 1;
}
static int str_eq(const char *a, const char *b) { return strcmp(a ? a : "", b ? b : "") == 0; }

#define DIFF(...)                        \
    do {                                 \
        snprintf(why, why_n, __VA_ARGS__); \
        return 0;                        \
    } while (0)

int plan_equal(const kv_plan *a, const kv_plan *b, char *why, size_t why_n) {
    const kv_plan_fingerprint *fa = &a->fingerprint, *fb = &b->fingerprint;
    if (strcmp(fa->arch, fb->arch) || fa->n_layers != fb->n_layers || fa->d_model != fb->d_model ||
        fa->n_heads != fb->n_heads || fa->n_kv_heads != fb->n_kv_heads || fa->head_dim != fb->head_dim ||
        fa->vocab_size != fb->vocab_size || !feq(fa->rope_theta, fb->rope_theta) ||
        memcmp(fa->kv_sha256, fb->kv_sha256, 32))
        DIFF("fingerprint differs");
    const kv_plan_global *ga = &a->global, *gb = &b->global;
    if (ga->sinks != gb->sinks || ga->recent != gb->recent || ga->prune_method != gb->prune_method ||
        !feq(ga->prune_budget, gb->prune_budget) || ga->prune_window != gb->prune_window ||
        ga->prune_pool != gb->prune_pool || ga->rht_seed != gb->rht_seed)
        DIFF("global differs");
    if (a->n_grids != b->n_grids) DIFF("n_grids %d vs %d", a->n_grids, b->n_grids);
    for (int i = 0; i < a->n_grids; i++)
        if (a->grids[i].d != b->grids[i].d || a->grids[i].n != b->grids[i].n ||
            !farr_eq(a->grids[i].points, b->grids[i].points, (size_t)a->grids[i].n * (size_t)a->grids[i].d))
            DIFF("grid %d differs", i);
    if (a->n_layers != b->n_layers) DIFF("n_layers differs");
    const int kv_dim = fa->n_kv_heads * fa->head_dim;
    for (int l = 0; l < a->n_layers; l++) {
        if (!feq(a->layers[l].prune_budget, b->layers[l].prune_budget)) DIFF("layer %d prune_budget", l);
        if (a->layers[l].window != b->layers[l].window) DIFF("layer %d window", l);
        for (int st = 0; st < 2; st++) {
            const kv_plan_stream *x = &a->layers[l].stream[st], *y = &b->layers[l].stream[st];
            if (x->method != y->method || x->bits != y->bits || x->group_size != y->group_size ||
                x->group_axis != y->group_axis || x->scale_dtype != y->scale_dtype || !feq(x->eta, y->eta) ||
                x->pack != y->pack || x->share_codes_with_layer != y->share_codes_with_layer ||
                x->higgs_grid != y->higgs_grid || x->pre_rope != y->pre_rope || !feq(x->rpc_ratio, y->rpc_ratio))
                DIFF("layer %d stream %d record differs", l, st);
            if (!x->predictor != !y->predictor) DIFF("layer %d stream %d predictor presence", l, st);
            if (x->predictor) {
                const kv_plan_predictor *pa = x->predictor, *pb = y->predictor;
                if (pa->n_inputs != pb->n_inputs || pa->out_dim != pb->out_dim || pa->in_dim != pb->in_dim)
                    DIFF("layer %d stream %d predictor shape", l, st);
                for (int i = 0; i < pa->n_inputs; i++)
                    if (pa->inputs[i].layer != pb->inputs[i].layer || pa->inputs[i].stream != pb->inputs[i].stream)
                        DIFF("layer %d stream %d predictor input %d", l, st, i);
                if (!farr_eq(pa->weight, pb->weight, (size_t)pa->out_dim * (size_t)pa->in_dim) ||
                    !farr_eq(pa->bias, pb->bias, (size_t)pa->out_dim))
                    DIFF("layer %d stream %d predictor values", l, st);
                if (pa->dtype != pb->dtype) DIFF("layer %d stream %d predictor dtype", l, st);
                if (pa->rank != pb->rank || (pa->rank >= 1 && (!farr_eq(pa->left, pb->left, (size_t)pa->out_dim * (size_t)pa->rank) ||
                                                               !farr_eq(pa->right, pb->right, (size_t)pa->rank * (size_t)pa->in_dim))))
                    DIFF("layer %d stream %d predictor factors", l, st);
                if (pa->qbits != pb->qbits || pa->qgroup != pb->qgroup) DIFF("layer %d stream %d predictor codes", l, st);
                if (pa->qbits > 0) {
                    const size_t nw = (size_t)pa->out_dim * (size_t)pa->in_dim, ng = nw / (size_t)pa->qgroup;
                    if (memcmp(pa->qcodes, pb->qcodes, nw) || !farr_eq(pa->qscale, pb->qscale, ng) ||
                        !farr_eq(pa->qoffset, pb->qoffset, ng))
                        DIFF("layer %d stream %d predictor codes, scales or offsets", l, st);
                }
            }
            if (x->n_fp_scales != y->n_fp_scales || !farr_eq(x->fp_scales, y->fp_scales, (size_t)x->n_fp_scales))
                DIFF("layer %d stream %d tensor scales differ", l, st);
            if (!x->squat != !y->squat) DIFF("layer %d stream %d squat presence", l, st);
            if (x->squat) {
                const kv_plan_squat *qa = x->squat, *qb = y->squat;
                if (qa->r != qb->r || !feq(qa->lambda, qb->lambda) || qa->g != qb->g || !qa->basis != !qb->basis ||
                    qa->static_subspace != qb->static_subspace)
                    DIFF("layer %d squat parameters", l);
                if (qa->basis && !farr_eq(qa->basis, qb->basis, (size_t)qa->r * (size_t)kv_dim))
                    DIFF("layer %d squat basis", l);
            }
        }
    }
    const kv_plan_provenance *va = &a->provenance, *vb = &b->provenance;
    if (!str_eq(va->tool_version, vb->tool_version) || !str_eq(va->git_hash, vb->git_hash) ||
        !str_eq(va->corpus_sha256, vb->corpus_sha256) || !str_eq(va->config_yaml, vb->config_yaml) ||
        va->seed != vb->seed || va->created != vb->created)
        DIFF("provenance differs");
    if (a->report.n_metrics != b->report.n_metrics) DIFF("report n_metrics");
    for (int m = 0; m < a->report.n_metrics; m++)
        if (!str_eq(a->report.names[m], b->report.names[m])) DIFF("report name %d", m);
    if (a->report.n_metrics &&
        !farr_eq(a->report.values, b->report.values, (size_t)a->n_layers * 2u * (size_t)a->report.n_metrics))
        DIFF("report values");
    return 1;
}

/* ---- byte editing ------------------------------------------------------------------------------ */
size_t plan_bytes_entry(const uint8_t *buf, const char tag[4]) {
    const uint32_t n = kv_load_u32le(buf + 20);
    const size_t toff = (size_t)kv_load_u64le(buf + 48);
    const size_t esize = kv_load_u16le(buf + 14);
    for (uint32_t i = 0; i < n && i < 64; i++)
        if (memcmp(buf + toff + i * esize, tag, 4) == 0) return toff + i * esize;
    return 0;
}

void plan_bytes_repair_crcs(uint8_t *b, size_t n) {
    if (n < 64) return;
    const uint32_t count = kv_load_u32le(b + 20);
    const uint64_t toff = kv_load_u64le(b + 48);
    const size_t esize = kv_load_u16le(b + 14), hsize = kv_load_u16le(b + 12);
    if (count <= 64 && esize >= 40 && esize <= 1024 && toff <= n && (uint64_t)count * esize <= n - toff) {
        for (uint32_t i = 0; i < count; i++) {
            uint8_t *e = b + toff + (size_t)i * esize;
            const uint64_t off = kv_load_u64le(e + 8), stored = kv_load_u64le(e + 16);
            if (off <= n && stored <= n - off) kv_store_u32le(e + 32, (uint32_t)crc32(0L, b + off, (uInt)stored));
        }
        kv_store_u32le(b + 56, (uint32_t)crc32(0L, b + toff, (uInt)(count * esize)));
    }
    if (hsize >= 64 && hsize <= n) {
        kv_store_u32le(b + 60, 0);
        kv_store_u32le(b + 60, (uint32_t)crc32(0L, b, (uInt)hsize));
    }
}
