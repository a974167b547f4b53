/* ccache_oracle.c — the first-generation compressed KV cache, kept as a test oracle for the runtime
 * (kernels/rt/, RUNTIME.md): it applies a plan behind the model's KV-cache interface by keeping a
 * decoded f32 copy of every token and letting the model attend over it through `view`. Independent
 * of the runtime's storage, blocks and attention kernels; it shares only the quantizers and the
 * predictor (kv_quant_roundtrip, kv_predictor_apply). As deployed (and as the runtime does), every
 * appended key and value is first rounded to f16; keys of pre-RoPE streams are held before RoPE and
 * rotated from their f16 value.
 *
 * Semantics (DESIGN.md §4 "Runtime cache semantics", aquakv.txt Algorithms 2-4):
 *   - per sequence, the first `sinks` tokens stay full precision;
 *   - the following tokens enter a recent buffer of `recent` (r) tokens, full precision;
 *   - at the start of an append, while the buffer holds >= r tokens, its oldest r tokens are
 *     compressed as one chunk. Layers are appended in order 0..L-1, so when layer l compresses a
 *     chunk, layer l-1 has already compressed the same chunk and its reconstruction is available to
 *     layer l's predictors (AQUA-KV: K_hat(l) = f_k(K_hat(l-1)) + Q(K - f_k(.)), V likewise with
 *     inputs [V_hat(l-1); K_hat(l)]). Compressing before the new tokens are added means a token
 *     always attends to its own step's keys/values exactly, and a long prefill attends exactly,
 *     then is compressed at the next step (as inference engines do).
 *   - attention reads decoded f32 keys (post-RoPE) and values: a decoded copy of every token is
 *     kept (the reference path; the storage that is *accounted* is the compressed one).
 * Keys of a stream with pre_rope are compressed before RoPE and rotated back to their positions
 * after decoding; a predictor's K input is the input layer's reconstructed key in that layer's
 * compression domain (pre-RoPE when its pre_rope flag is set).
 *
 * KVmix recent pivotal context (a stream with rpc_ratio > 0, kvmix.txt "Dynamic Pivotal Context
 * Selection"): instead of the fixed buffer, the stream's full-precision window after a step holds
 * current_RPC tokens (the step's new tokens plus the RPCs kept before); at the next append only
 * num_RPC = floor(rpc_ratio * current_RPC) of them stay, the older ones are compressed (rounded down
 * to whole token groups for keys grouped along tokens). The window thus shrinks as decoding goes on.
 * Streams differ in ratio, so K and V of a layer are compressed on their own schedules; RPC is
 * therefore refused together with AQUA-KV predictors, which need aligned chunks across layers.
 *
 * Bits: compressed chunks count their exact storage (kv_block_storage: codes, scales, zero points,
 * norms); full-precision tokens (sinks, buffer) count 16 bits per value, as deployed in f16 — the
 * reference keeps them in f32; predictor weights count 32 bits each (f32 in the plan). */
#include "ccache_oracle.h"
#include "kvrt.h"
#include "kv_model.h"

#include <stdlib.h>
#include <string.h>

#define CC_ALIGN 64

typedef struct cc_slot {
    float *kdom; /* keys in the compression domain (pre-RoPE if pre_rope, else post-RoPE) */
    float *k;    /* post-RoPE keys: what attention reads */
    float *v;
    int32_t *pos;
    int n, cap;
    int comp_end[2]; /* per stream: tokens [sinks, comp_end) are compressed; [comp_end, n) full precision */
    uint64_t payload_bits; /* exact storage of this slot's compressed chunks */
} cc_slot;

typedef struct ccache {
    kv_cache base;
    const kv_plan *plan;
    const kv_model *model;
    int kv_dim, sinks, recent;
    kv_quant *quant;           /* n_layers * 2 */
    kv_grid_search **search;   /* per plan grid (d <= 2), or NULL */
    cc_slot *slots;            /* layer * n_seqs + seq */
    float *pred, *resid, *rhat; /* chunk scratch, scratch_rows x kv_dim each */
    int scratch_rows;
    uint64_t predictor_bits;
} ccache;

static cc_slot *slot_of(ccache *c, int layer, int seq) { return &c->slots[(size_t)layer * c->base.n_seqs + seq]; }

static kv_status reserve(ccache *c, cc_slot *s, int need) {
    if (need <= s->cap) return KV_OK;
    int cap = s->cap ? s->cap : 256;
    while (cap < need) {
        if (cap > (1 << 28)) return KV_ERR(KV_ENOMEM, "compressed KV cache: %d tokens is too many", need);
        cap *= 2;
    }
    const size_t row = (size_t)c->kv_dim * sizeof(float);
    float *kd = kv_aligned_alloc(CC_ALIGN, (size_t)cap * row), *k = kv_aligned_alloc(CC_ALIGN, (size_t)cap * row);
    float *v = kv_aligned_alloc(CC_ALIGN, (size_t)cap * row);
    int32_t *pos = malloc((size_t)cap * sizeof(int32_t));
    if (!kd || !k || !v || !pos) {
        kv_aligned_free(kd);
        kv_aligned_free(k);
        kv_aligned_free(v);
        free(pos);
        return KV_ERR(KV_ENOMEM, "compressed KV cache: out of memory for %d tokens", cap);
    }
    if (s->n) {
        memcpy(kd, s->kdom, (size_t)s->n * row);
        memcpy(k, s->k, (size_t)s->n * row);
        memcpy(v, s->v, (size_t)s->n * row);
        memcpy(pos, s->pos, (size_t)s->n * sizeof(int32_t));
    }
    kv_aligned_free(s->kdom);
    kv_aligned_free(s->k);
    kv_aligned_free(s->v);
    free(s->pos);
    s->kdom = kd, s->k = k, s->v = v, s->pos = pos, s->cap = cap;
    return KV_OK;
}

/* The reconstructed rows [t0, t0+n) of (layer, stream) for sequence seq, as a predictor input. */
static const float *input_rows(ccache *c, int layer, int stream, int seq, int t0) {
    cc_slot *s = slot_of(c, layer, seq);
    return (stream == KV_PLAN_K ? s->kdom : s->v) + (size_t)t0 * c->kv_dim;
}

static kv_status reserve_scratch(ccache *c, int rows) {
    if (rows <= c->scratch_rows) return KV_OK;
    const size_t bytes = (size_t)rows * c->kv_dim * sizeof(float);
    float *a = kv_aligned_alloc(CC_ALIGN, bytes), *b = kv_aligned_alloc(CC_ALIGN, bytes);
    float *d = kv_aligned_alloc(CC_ALIGN, bytes);
    if (!a || !b || !d) {
        kv_aligned_free(a);
        kv_aligned_free(b);
        kv_aligned_free(d);
        return KV_ERR(KV_ENOMEM, "compressed KV cache: out of memory for a chunk of %d tokens", rows);
    }
    kv_aligned_free(c->pred);
    kv_aligned_free(c->resid);
    kv_aligned_free(c->rhat);
    c->pred = a, c->resid = b, c->rhat = d, c->scratch_rows = rows;
    return KV_OK;
}

/* Compress rows [t0, t0+m) of one stream in place (x -> its reconstruction); for K, also refresh
 * the post-RoPE copy attention reads. */
static kv_status compress_stream(ccache *c, int layer, int stream, int seq, int t0, int m) {
    const kv_plan_stream *ps = &c->plan->layers[layer].stream[stream];
    cc_slot *slot = slot_of(c, layer, seq);
    const int kvd = c->kv_dim;
    const size_t n = (size_t)m * kvd;
    float *x = (stream == KV_PLAN_K ? slot->kdom : slot->v) + (size_t)t0 * kvd;
    kv_block_storage st;
    kv_status s = reserve_scratch(c, m);
    if (s != KV_OK) return s;
    if (ps->predictor) {
        const kv_plan_predictor *pr = ps->predictor;
        const float *inputs[KV_PLAN_MAX_PRED_INPUTS];
        for (int i = 0; i < pr->n_inputs; i++) {
            const kv_plan_pred_input *in = &pr->inputs[i];
            const cc_slot *src = slot_of(c, in->layer, seq);
            /* the input stream must already hold these rows' reconstruction */
            if (src->comp_end[in->stream] < t0 + m)
                return KV_ERR(KV_EINVAL, "compressed cache: layer %d %s needs layer %d %s's rows %d.. compressed "
                              "first (layers must be appended in order)", layer, kv_plan_stream_name(stream),
                              in->layer, kv_plan_stream_name(in->stream), t0);
            inputs[i] = input_rows(c, in->layer, in->stream, seq, t0);
        }
        if ((s = kv_predictor_apply(c->pred, pr, inputs, (size_t)m, kvd)) != KV_OK) return s;
        for (size_t i = 0; i < n; i++) c->resid[i] = x[i] - c->pred[i];
        if ((s = kv_quant_roundtrip(c->rhat, &st, &c->quant[layer * 2 + stream], (size_t)m, (size_t)kvd,
                                    c->resid)) != KV_OK)
            return s;
        for (size_t i = 0; i < n; i++) x[i] = c->pred[i] + c->rhat[i];
    } else if (ps->method == KV_PLAN_FP && ps->bits == 32) { /* f32 full precision: kept as is */
        memset(&st, 0, sizeof st);
        st.total_bits = 32ull * n;
    } else {
        if ((s = kv_quant_roundtrip(c->rhat, &st, &c->quant[layer * 2 + stream], (size_t)m, (size_t)kvd, x)) != KV_OK)
            return s;
        memcpy(x, c->rhat, n * sizeof(float));
    }
    slot->payload_bits += st.total_bits;
    if (stream == KV_PLAN_K) {
        /* attention reads post-RoPE keys: rotate the reconstruction (or take it as is) */
        memcpy(slot->k + (size_t)t0 * kvd, x, n * sizeof(float));
        if (ps->pre_rope)
            kv_model_rope(c->model, slot->k + (size_t)t0 * kvd, (size_t)m, (size_t)kvd, c->base.n_kv_heads,
                          slot->pos + t0, 0);
    }
    slot->comp_end[stream] = t0 + m;
    return KV_OK;
}

/* Tokens of a stream compressed together at least: whole token groups for keys grouped along
 * tokens, single tokens otherwise. */
static int token_granule(const kv_quant *q) {
    return q->kind == KV_QUANT_UNIFORM && q->uniform.axis == KV_AXIS_TOKENS ? q->uniform.group : 1;
}

/* Bring one stream's full-precision window to what the semantics allow before new tokens arrive. */
static kv_status settle_stream(ccache *c, int layer, int stream, int seq) {
    cc_slot *s = slot_of(c, layer, seq);
    if (s->comp_end[stream] < c->sinks) s->comp_end[stream] = c->sinks < s->n ? c->sinks : s->n;
    const float rpc = c->plan->layers[layer].stream[stream].rpc_ratio;
    kv_status st;
    if (rpc > 0.0f) { /* KVmix: keep floor(rpc * current_RPC) of the window */
        const int window = s->n - s->comp_end[stream];
        const int keep = (int)((double)rpc * window); /* floor: window >= 0 */
        const int granule = token_granule(&c->quant[layer * 2 + stream]);
        int m = window - keep;
        m -= m % granule;
        return m > 0 ? compress_stream(c, layer, stream, seq, s->comp_end[stream], m) : KV_OK;
    }
    while (s->n - s->comp_end[stream] >= c->recent) /* fixed buffer: whole chunks of `recent` */
        if ((st = compress_stream(c, layer, stream, seq, s->comp_end[stream], c->recent)) != KV_OK) return st;
    return KV_OK;
}

static kv_status cc_append(kv_cache *base, int layer, int seq, int n, const int32_t *pos, const float *k_pre,
                           const float *k, const float *v, size_t ld) {
    ccache *c = (ccache *)base;
    cc_slot *s = slot_of(c, layer, seq);
    kv_status st;
    /* K first: a V predictor may take this layer's reconstructed keys as input */
    if ((st = settle_stream(c, layer, KV_PLAN_K, seq)) != KV_OK) return st;
    if ((st = settle_stream(c, layer, KV_PLAN_V, seq)) != KV_OK) return st;
    if ((st = reserve(c, s, s->n + n)) != KV_OK) return st;
    const int pre_rope = c->plan->layers[layer].stream[KV_PLAN_K].pre_rope;
    if (pre_rope && !k_pre) return KV_ERR(KV_EINVAL, "compressed cache: the plan needs pre-RoPE keys");
    const size_t row = (size_t)c->kv_dim * sizeof(float);
    (void)row;
    for (int i = 0; i < n; i++) {
        const size_t dst = (size_t)(s->n + i) * c->kv_dim;
        const float *ks = (pre_rope ? k_pre : k) + (size_t)i * ld, *vs = v + (size_t)i * ld;
        for (int j = 0; j < c->kv_dim; j++) {
            s->kdom[dst + j] = kv_f16_to_f32(kv_f32_to_f16(ks[j]));
            s->k[dst + j] = s->kdom[dst + j];
            s->v[dst + j] = kv_f16_to_f32(kv_f32_to_f16(vs[j]));
        }
        s->pos[s->n + i] = pos[i];
    }
    if (pre_rope)
        kv_model_rope(c->model, s->k + (size_t)s->n * c->kv_dim, (size_t)n, (size_t)c->kv_dim, c->base.n_kv_heads,
                      s->pos + s->n, 0);
    s->n += n;
    return KV_OK;
}

static kv_status cc_view(kv_cache *base, int layer, int seq, kv_cache_view *out) {
    ccache *c = (ccache *)base;
    cc_slot *s = slot_of(c, layer, seq);
    out->k = s->k;
    out->v = s->v;
    out->ld_k = out->ld_v = (size_t)c->kv_dim;
    out->n = s->n;
    return KV_OK;
}

static int cc_length(const kv_cache *base, int seq) {
    const ccache *c = (const ccache *)base;
    return c->slots[(size_t)(c->base.n_layers - 1) * c->base.n_seqs + seq].n;
}

static void cc_reset(kv_cache *base, int seq) {
    ccache *c = (ccache *)base;
    for (int l = 0; l < base->n_layers; l++)
        for (int q = 0; q < base->n_seqs; q++)
            if (seq < 0 || q == seq) {
                cc_slot *s = slot_of(c, l, q);
                s->n = 0;
                s->comp_end[0] = s->comp_end[1] = 0;
                s->payload_bits = 0;
            }
}

kv_status ccache_oracle_get_stats(const kv_cache *base, ccache_oracle_stats *out) {
    memset(out, 0, sizeof *out);
    if (!base || base->ops->append != cc_append) return KV_ERR(KV_EINVAL, "not a compressed KV cache");
    const ccache *c = (const ccache *)base;
    for (int l = 0; l < base->n_layers; l++)
        for (int q = 0; q < base->n_seqs; q++) {
            const cc_slot *s = &c->slots[(size_t)l * base->n_seqs + q];
            out->values_total += 2ull * (uint64_t)s->n * c->kv_dim;
            for (int st = 0; st < 2; st++) {
                const int comp = s->comp_end[st] > c->sinks ? s->comp_end[st] - c->sinks : 0;
                out->values_compressed += (uint64_t)comp * c->kv_dim;
            }
            out->payload_bits += s->payload_bits;
        }
    out->values_fp = out->values_total - out->values_compressed;
    out->fp_bits = 16ull * out->values_fp;
    out->predictor_bits = c->predictor_bits;
    for (int q = 0; q < base->n_seqs; q++) out->tokens += (uint64_t)cc_length(base, q);
    return KV_OK;
}

static size_t cc_bytes(const kv_cache *base) {
    ccache_oracle_stats st;
    if (ccache_oracle_get_stats(base, &st) != KV_OK) return 0;
    return (size_t)((st.payload_bits + st.fp_bits + st.predictor_bits + 7) / 8);
}

static void cc_destroy(kv_cache *base) {
    ccache *c = (ccache *)base;
    if (!c) return;
    if (c->slots)
        for (size_t i = 0; i < (size_t)base->n_layers * base->n_seqs; i++) {
            kv_aligned_free(c->slots[i].kdom);
            kv_aligned_free(c->slots[i].k);
            kv_aligned_free(c->slots[i].v);
            free(c->slots[i].pos);
        }
    if (c->search)
        for (int g = 0; g < c->plan->n_grids; g++) kv_grid_search_free(c->search[g]);
    free(c->search);
    free(c->slots);
    free(c->quant);
    kv_aligned_free(c->pred);
    kv_aligned_free(c->resid);
    kv_aligned_free(c->rhat);
    free(c);
}

static const kv_cache_ops k_ccache_ops = {"compressed", cc_append, cc_view, cc_length, cc_reset, cc_bytes, cc_destroy, NULL, NULL};

/* What this runtime applies; anything else in a plan is refused by name rather than ignored. */
static kv_status check_supported(const kv_plan *p) {
    if (p->global.prune_method != KV_PLAN_PRUNE_NONE)
        return KV_ERR(KV_EUNSUPPORTED, "this runtime does not apply token pruning (plan method %s)",
                      kv_plan_prune_name(p->global.prune_method));
    for (int l = 0; l < p->n_layers; l++)
        for (int st = 0; st < 2; st++) {
            const kv_plan_stream *s = &p->layers[l].stream[st];
            if (s->share_codes_with_layer >= 0)
                return KV_ERR(KV_EUNSUPPORTED, "layer %d %s: shared codes (XQuant) are not applied by this runtime",
                              l, kv_plan_stream_name(st));
            if (s->squat)
                return KV_ERR(KV_EUNSUPPORTED, "layer %d K: SQuat is not applied by this runtime", l);
            if (s->rpc_ratio > 0.0f && s->predictor)
                return KV_ERR(KV_EUNSUPPORTED, "layer %d %s: a recent pivotal context (KVmix) together with an "
                              "AQUA-KV predictor is not supported (their chunks do not align)", l, kv_plan_stream_name(st));
        }
    return KV_OK;
}

kv_status ccache_oracle_create(kv_cache **out, const kv_plan *plan, const kv_model *model, int n_seqs) {
    *out = NULL;
    const kv_arch *a = kv_model_arch(model);
    const kv_plan_fingerprint *fp = &plan->fingerprint;
    if (fp->n_layers != a->n_layers || fp->n_kv_heads != a->n_kv_heads || fp->head_dim != a->head_dim)
        return KV_ERR(KV_EMISMATCH, "the plan is for %d layers x %d KV heads x %d, the model has %d x %d x %d",
                      fp->n_layers, fp->n_kv_heads, fp->head_dim, a->n_layers, a->n_kv_heads, a->head_dim);
    if (n_seqs < 1 || n_seqs > 4096) return KV_ERR(KV_EINVAL, "compressed cache: bad sequence count %d", n_seqs);
    kv_status s = check_supported(plan);
    if (s != KV_OK) return s;
    if (plan->global.recent < 1 || plan->global.sinks < 0)
        return KV_ERR(KV_EFORMAT, "plan: recent buffer %d / sinks %d", plan->global.recent, plan->global.sinks);
    ccache *c = calloc(1, sizeof *c);
    if (!c) return KV_ERR(KV_ENOMEM, "out of memory");
    c->base.ops = &k_ccache_ops;
    c->base.impl = c;
    c->base.n_layers = a->n_layers;
    c->base.n_seqs = n_seqs;
    c->base.n_kv_heads = a->n_kv_heads;
    c->base.head_dim = a->head_dim;
    c->plan = plan;
    c->model = model;
    c->kv_dim = a->n_kv_heads * a->head_dim;
    c->sinks = plan->global.sinks;
    c->recent = plan->global.recent;
    c->predictor_bits = 8ull * kv_plan_predictor_bytes(plan);
    c->quant = calloc((size_t)a->n_layers * 2, sizeof(kv_quant));
    c->slots = calloc((size_t)a->n_layers * n_seqs, sizeof(cc_slot));
    c->search = calloc((size_t)(plan->n_grids > 0 ? plan->n_grids : 1), sizeof(kv_grid_search *));
    if (!c->quant || !c->slots || !c->search || reserve_scratch(c, c->recent) != KV_OK) {
        s = KV_ERR(KV_ENOMEM, "out of memory for the compressed cache");
        goto done;
    }
    /* the nearest-point search accelerator for low-dimensional grids (same result, faster) */
    for (int g = 0; g < plan->n_grids; g++)
        if (plan->grids[g].d <= 2 &&
            (s = kv_grid_search_create(&c->search[g], plan->grids[g].points, plan->grids[g].d, plan->grids[g].n)) != KV_OK)
            goto done;
    for (int l = 0; l < a->n_layers; l++)
        for (int st = 0; st < 2; st++) {
            kv_quant *q = &c->quant[l * 2 + st];
            if ((s = kv_quant_from_plan(q, plan, l, st)) != KV_OK) goto done;
            if (q->kind == KV_QUANT_HIGGS) q->higgs.search = c->search[plan->layers[l].stream[st].higgs_grid];
            if (q->kind == KV_QUANT_UNIFORM && q->uniform.axis == KV_AXIS_TOKENS && c->recent % q->uniform.group)
                s = KV_ERR(KV_EFORMAT, "layer %d %s: token groups of %d do not divide the recent buffer (%d)", l,
                           kv_plan_stream_name(st), q->uniform.group, c->recent);
            if (s != KV_OK) goto done;
        }
done:
    if (s != KV_OK) {
        cc_destroy(&c->base);
        return s;
    }
    *out = &c->base;
    return KV_OK;
}
