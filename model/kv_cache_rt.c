/* kv_cache_rt.c — the reference model's KV-cache interface backed by libkvrt's runtime (kvrt.h,
 * kernels/RUNTIME.md): appends go to kv_rt_append, attention to kv_rt_attend, so the model runs with
 * the plan's compressed cache and never sees decoded keys or values. The adapter lives here, on the
 * model's side: libkvrt does not know the model (it takes the RoPE frequencies and the thread pool
 * as options). */
#include "forward_internal.h"
#include "model_cuda.h"
#include "kvrt.h"

#include <stdlib.h>
#include <string.h>

typedef struct rt_cache {
    kv_cache base;
    kv_rt *rt;
    kv_plan *own_plan; /* the f16 plan when the caller gave none */
    int windows;       /* the plan carries the layers' attention windows (the model's) */
} rt_cache;

static kv_status rc_append(kv_cache *c, int layer, int seq, int n, const int32_t *pos, const float *k_pre,
                           const float *k, const float *v, size_t ld) {
    return kv_rt_append(((rt_cache *)c)->rt, layer, seq, n, pos, k_pre, k, v, ld);
}

static kv_status rc_view(kv_cache *c, int layer, int seq, kv_cache_view *out) {
    (void)c, (void)out;
    return KV_ERR(KV_EUNSUPPORTED, "the compressed runtime cache has no decoded view (layer %d, seq %d): it attends "
                  "over its compressed form itself", layer, seq);
}

static int rc_length(const kv_cache *c, int seq) { return kv_rt_length(((const rt_cache *)c)->rt, seq); }

static void rc_reset(kv_cache *c, int seq) { kv_rt_reset(((rt_cache *)c)->rt, seq); }

static size_t rc_bytes(const kv_cache *c) {
    kv_rt_stats st;
    if (kv_rt_get_stats(((const rt_cache *)c)->rt, -1, &st) != KV_OK) return 0;
    return (size_t)(st.accounted_bytes + st.predictor_bytes);
}

static void rc_destroy(kv_cache *c) {
    rt_cache *r = (rt_cache *)c;
    if (!r) return;
    kv_rt_close(r->rt);
    kv_plan_free(r->own_plan);
    free(r);
}

static kv_status rc_attend(kv_cache *c, int layer, int seq, int n_q, const float *q, size_t ldq, float *out,
                           size_t ldo) {
    return kv_rt_attend(((rt_cache *)c)->rt, layer, seq, n_q, q, ldq, out, ldo);
}

static kv_status rc_end_prompt(kv_cache *c, int seq) { return kv_rt_end_prompt(((rt_cache *)c)->rt, seq); }

static const kv_cache_ops k_rt_ops = {"runtime", rc_append, rc_view, rc_length, rc_reset, rc_bytes, rc_destroy,
                                      rc_attend, rc_end_prompt};

/* Every stream in f16, nothing ever quantized: the cache this engine would hold without a plan.
 * Tokens still move from the window into f16 blocks of 64, so that no f16 array grows without bound. */
kv_status kv_model_f16_plan(kv_plan **out, const kv_arch *a) {
    kv_plan_fingerprint fp;
    memset(&fp, 0, sizeof fp);
    snprintf(fp.arch, sizeof fp.arch, "%s", a->arch);
    fp.n_layers = a->n_layers, fp.d_model = a->d_model, fp.n_heads = a->n_heads, fp.n_kv_heads = a->n_kv_heads;
    fp.head_dim = a->head_dim, fp.vocab_size = a->vocab_size, fp.rope_theta = a->rope_theta;
    kv_status s = kv_plan_create(out, &fp);
    if (s != KV_OK) return s;
    (*out)->global.sinks = 0;
    (*out)->global.recent = 64;
    for (int l = 0; l < a->n_layers; l++) (*out)->layers[l].window = kv_arch_layer_window(a, l);
    return KV_OK;
}

kv_status kv_cache_rt_create(kv_cache **out, const kv_plan *plan, const kv_model *m, int n_seqs, int capacity,
                             int n_threads, unsigned flags) {
    if (!out || !m) return KV_ERR(KV_EINVAL, "kv_cache_rt_create: NULL argument");
    *out = NULL;
    const kv_arch *a = &m->arch;
    rt_cache *r = calloc(1, sizeof *r);
    if (!r) return KV_ERR(KV_ENOMEM, "out of memory for a KV cache");
    kv_status s = KV_OK;
    if (!plan) {
        if ((s = kv_model_f16_plan(&r->own_plan, a)) != KV_OK) goto done;
        /* prompt statistics do not take windows yet (RUNTIME.md §11): such a cache runs without them, and the model
         * refuses a step past a window as it did before plans knew windows */
        for (int l = 0; (flags & KV_CACHE_RT_PROMPT_STATS) && l < a->n_layers; l++) r->own_plan->layers[l].window = 0;
        plan = r->own_plan;
    }
    const kv_plan_fingerprint *fp = &plan->fingerprint;
    if (fp->n_layers != a->n_layers || fp->n_kv_heads != a->n_kv_heads || fp->head_dim != a->head_dim) {
        s = KV_ERR(KV_EMISMATCH, "the plan is for %d layers x %d KV heads x %d, the model has %d x %d x %d",
                   fp->n_layers, fp->n_kv_heads, fp->head_dim, a->n_layers, a->n_kv_heads, a->head_dim);
        goto done;
    }
    /* the layers' attention windows (plan 1.5) are the model's: a plan that carries them must carry exactly these; a
     * plan that carries none (written before 1.5) runs, and the model refuses a step past a window it cannot apply */
    if (kv_plan_has_windows(plan))
        for (int l = 0; l < a->n_layers; l++)
            if (plan->layers[l].window != kv_arch_layer_window(a, l)) {
                s = KV_ERR(KV_EMISMATCH, "layer %d: the plan's attention window is %d tokens, the model's %d (%s); the "
                           "plan was fitted for another model", l, plan->layers[l].window, kv_arch_layer_window(a, l),
                           kv_arch_layer_window(a, l) > 0 ? "a sliding-window layer" : "full attention");
                goto done;
            }
    /* a pre-RoPE key stream is rotated with its layer's frequencies: the windowed (local) layers' own base goes to the
     * runtime with a plan that carries the windows (kv_rt_options.rope_inv_freq_local); a plan without them would
     * rotate a local layer with the global base: refused */
    for (int l = 0; m->inv_freq_local_d && !kv_plan_has_windows(plan) && l < a->n_layers; l++)
        if (kv_arch_layer_is_local(a, l) && plan->layers && plan->layers[l].stream[0].pre_rope &&
            kv_arch_layer_rope_theta(a, l) != a->rope_theta) {
            s = KV_ERR(KV_EUNSUPPORTED, "layer %d's keys are stored before RoPE, but it is a sliding-window layer "
                       "with its own RoPE base (%g), and the plan has no layer windows (plan format 1.5) to tell the "
                       "runtime which layers take it: refit the plan", l,
                       (double)kv_arch_layer_rope_theta(a, l));
            goto done;
        }
    kv_rt_options o;
    memset(&o, 0, sizeof o);
    o.device = m->gpu ? KV_RT_DEVICE_CUDA : KV_RT_DEVICE_CPU; /* a GPU model's cache is on the GPU, on its stream */
    o.stream = kv_model_cuda_stream(m);
    o.n_seqs = n_seqs;
    o.n_heads = a->n_heads;
    o.capacity = capacity;
    o.n_threads = n_threads > 0 ? n_threads : m->n_threads;
    /* the model's own threads, so that decoding has one set of threads (forward_internal.h) */
    if (o.n_threads == m->n_threads && !m->gpu) o.pool = kv_model_pool((kv_model *)m);
    o.rope_inv_freq = m->inv_freq_d;
    o.rope_inv_freq_local = m->inv_freq_local_d; /* NULL: one base for every layer */
    o.rope_layout = (int)a->rope_layout;
    o.keep_reconstructions = (flags & KV_CACHE_RT_KEEP_RECONSTRUCTIONS) != 0;
    o.prompt_stats = (flags & KV_CACHE_RT_PROMPT_STATS) != 0;
    if ((s = kv_rt_open(&r->rt, plan, &o)) != KV_OK) goto done;
    r->windows = kv_plan_has_windows(plan);
    r->base.ops = &k_rt_ops;
    r->base.impl = r;
    r->base.n_layers = a->n_layers;
    r->base.n_seqs = n_seqs;
    r->base.n_kv_heads = a->n_kv_heads;
    r->base.head_dim = a->head_dim;
done:
    if (s != KV_OK) {
        rc_destroy(&r->base);
        return s;
    }
    *out = &r->base;
    return KV_OK;
}

kv_rt *kv_cache_rt_runtime(kv_cache *c) {
    return c && c->ops == &k_rt_ops ? ((rt_cache *)c)->rt : NULL;
}

int kv_cache_applies_windows(const kv_cache *c) {
    return c && c->ops == &k_rt_ops && ((const rt_cache *)c)->windows;
}

kv_status kv_cache_rt_prompt_copy(kv_cache *dst, int dst_seq, kv_cache *src, int src_seq) {
    kv_rt *d = kv_cache_rt_runtime(dst), *s = kv_cache_rt_runtime(src);
    if (!d || !s) return KV_ERR(KV_EINVAL, "prompt copy: both caches must be the runtime's");
    return kv_rt_prompt_copy(d, dst_seq, s, src_seq);
}
