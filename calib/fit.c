/* kvcal fit: streaming, layer-sequential AQUA-KV calibration (kv_calib.h, calib/FIT.md).
 *
 * aquakv.txt Algorithm 1, run with the compressed cache's own chunking: per sequence, tokens
 * [sinks, sinks + n_chunks*recent) are compressed in chunks of `recent` tokens; every residual goes
 * through kv_quant_roundtrip and every prediction through kv_predictor_apply (libkvrt), the code
 * the runtime uses, so a predictor is fitted on exactly the reconstructions it will see. */
#define _POSIX_C_SOURCE 200809L
#include "fit_internal.h"
#include "kvrt.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

const char *const kv_fit_metric_names[KV_FIT_N_METRICS] = {"rel_mse",       "explained_var", "quant_rel_err",
                                                           "resid_rel_err", "ridge_rcond",   "ridge_fallback",
                                                           "eta_gain_vs_0", "eta_gain_vs_datafree"};

void kv_fit_options_init(kv_fit_options *o) {
    memset(o, 0, sizeof *o);
    o->stop_after_layer = -1;
}

void kv_fit_report_free(kv_fit_report *r) {
    if (!r) return;
    free(r->layers);
    memset(r, 0, sizeof *r);
}

/* ---- sequences ---------------------------------------------------------------------------------- */
void kv_fit_seqs_free(kv_fit_seqs *s) {
    if (!s) return;
    free(s->tokens);
    memset(s, 0, sizeof *s);
}

kv_status kv_fit_make_seqs(kv_fit_seqs *out, const kv_fit_data *data, const kv_fit_config *cfg) {
    memset(out, 0, sizeof *out);
    const int seq_len = cfg->data.seq_len;
    const int bos = data->bos_id >= 0;
    const int64_t body = seq_len - bos; /* corpus tokens per sequence */
    if (body < 1) return KV_ERR(KV_EINVAL, "data.seq_len %d leaves no room for corpus tokens", seq_len);
    size_t usable = data->n_tokens;
    if (cfg->data.max_tokens > 0 && (uint64_t)cfg->data.max_tokens < usable) usable = (size_t)cfg->data.max_tokens;
    const int64_t slots = (int64_t)(usable / (size_t)body);
    const double frac = cfg->data.heldout_fraction;
    int64_t n_cal, n_ho;
    int64_t *ho_slots = NULL; /* split: which calibration slots are held out */
    const int split = data->heldout_tokens == NULL;
    if (split) {
        if (slots < 2)
            return KV_ERR(KV_EINVAL,
                          "the calibration corpus gives %zu tokens (data.max_tokens %lld): fewer than the two "
                          "sequences of %d tokens (data.seq_len) needed for one calibration and one held-out "
                          "sequence; use a longer corpus or a smaller --seq-len",
                          usable, (long long)cfg->data.max_tokens, seq_len);
        n_ho = (int64_t)llround(frac * (double)slots);
        if (n_ho < 1) n_ho = 1;
        if (n_ho > slots - 1) n_ho = slots - 1;
        n_cal = slots - n_ho;
    } else {
        if (slots < 1)
            return KV_ERR(KV_EINVAL,
                          "the calibration corpus gives %zu tokens: fewer than one sequence of %d tokens "
                          "(data.seq_len)", usable, seq_len);
        const int64_t avail = (int64_t)(data->n_heldout_tokens / (size_t)body);
        if (avail < 1)
            return KV_ERR(KV_EINVAL, "the held-out corpus has %zu tokens: fewer than one sequence of %d tokens",
                          data->n_heldout_tokens, seq_len);
        n_cal = slots;
        n_ho = (int64_t)llround(frac * (double)slots);
        if (n_ho < 1) n_ho = 1;
        if (n_ho > avail) n_ho = avail;
    }
    const int64_t n = n_cal + n_ho;
    size_t total;
    if (kv_size_mul(&total, (size_t)n, (size_t)seq_len) != 0 || total > ((size_t)1 << 40))
        return KV_ERR(KV_EINVAL, "too many tokens (%lld sequences of %d)", (long long)n, seq_len);
    out->tokens = malloc(total * sizeof(int32_t));
    char *is_ho = split ? calloc((size_t)slots, 1) : NULL;
    if (!out->tokens || (split && !is_ho)) {
        free(is_ho);
        kv_fit_seqs_free(out);
        return KV_ERR(KV_ENOMEM, "out of memory for %lld sequences of %d tokens", (long long)n, seq_len);
    }
    if (split) {
        /* Held-out slots: a seeded partial Fisher-Yates shuffle of the slot indices. */
        ho_slots = malloc((size_t)slots * sizeof *ho_slots);
        if (!ho_slots) {
            free(is_ho);
            kv_fit_seqs_free(out);
            return KV_ERR(KV_ENOMEM, "out of memory");
        }
        for (int64_t i = 0; i < slots; i++) ho_slots[i] = i;
        kv_rng rng;
        kv_rng_init(&rng, cfg->seed ^ 0x6b766669742d686full); /* "kvfit-ho" */
        for (int64_t i = 0; i < n_ho; i++) {
            const int64_t j = i + (int64_t)(kv_rng_next_u64(&rng) % (uint64_t)(slots - i));
            const int64_t t = ho_slots[i];
            ho_slots[i] = ho_slots[j];
            ho_slots[j] = t;
            is_ho[ho_slots[i]] = 1;
        }
        free(ho_slots);
    }
    int64_t ci = 0, hi = n_cal;
    for (int64_t s = 0; s < (split ? slots : n_cal); s++) {
        const int64_t dst = split && is_ho[s] ? hi++ : ci++;
        int32_t *t = out->tokens + (size_t)dst * (size_t)seq_len;
        if (bos) t[0] = data->bos_id;
        memcpy(t + bos, data->tokens + (size_t)s * (size_t)body, (size_t)body * sizeof(int32_t));
    }
    if (!split)
        for (int64_t s = 0; s < n_ho; s++) {
            int32_t *t = out->tokens + (size_t)(n_cal + s) * (size_t)seq_len;
            if (bos) t[0] = data->bos_id;
            memcpy(t + bos, data->heldout_tokens + (size_t)s * (size_t)body, (size_t)body * sizeof(int32_t));
        }
    free(is_ho);
    out->n_cal = n_cal;
    out->n_ho = n_ho;
    out->seq_len = seq_len;
    return KV_OK;
}

/* ---- plan set-up: every stream's quantizer and the grids ------------------------------------------ */
/* Traits of a method (formats/config.c: kv_fit_method_traits_of). */
static int is_aqua(kv_fit_method m) { return kv_fit_method_has((int)m, KV_FIT_T_PREDICTS); }
static int uses_higgs(kv_fit_method m) { return kv_fit_method_has((int)m, KV_FIT_T_HIGGS); }
static int is_float(kv_fit_method m) { return kv_fit_method_has((int)m, KV_FIT_T_FLOAT); }
/* The method of one stream: layers.N.key_method / value_method (a mixed plan) or the config's method. */
static kv_fit_method smethod(const kv_fit_config *cfg, int layer, int stream) {
    return (kv_fit_method)kv_fit_config_stream_method(cfg, layer, stream);
}

/* Bits of (layer, stream) before the quantizer is chosen (window: the layer's attention window, 0 = full);
 * *explicit_bits = 1 when not the config's stream default (first layer of AQUA, a windowed layer left in f16 by
 * cache.windowed_layers, or a per-layer override, which wins). */
static int stream_bits(const kv_fit_config *cfg, int layer, int stream, int window, int *explicit_bits) {
    int bits = stream == KV_PLAN_K ? cfg->keys.bits : cfg->values.bits;
    *explicit_bits = 0;
    if (window > 0 && cfg->cache.windowed_layers == KV_FIT_WINDOWED_F16) { /* a windowed layer left in f16 */
        bits = KV_FIT_F16_BITS;
        *explicit_bits = 1;
    }
    if (is_aqua(smethod(cfg, layer, stream)) && layer == 0) {
        bits = cfg->aqua.first_layer_bits;
        *explicit_bits = 1;
    }
    const kv_fit_layer_override *lo = kv_fit_config_layer(cfg, layer);
    if (lo && stream == KV_PLAN_K && (lo->set & KV_FIT_LO_KEY_BITS)) bits = lo->key_bits, *explicit_bits = 1;
    if (lo && stream == KV_PLAN_V && (lo->set & KV_FIT_LO_VALUE_BITS)) bits = lo->value_bits, *explicit_bits = 1;
    return bits;
}

/* "keys.bits=5 (cfg.yaml:3:9), keys.group_size=32 (default), ..." for the keys that shape stream st
 * of layer l, so that a quantizer's refusal names where the configuration said it. */
static void stream_keys(char *buf, size_t n, const kv_fit_config *cfg, int l, int st) {
    const char *sec = st == KV_PLAN_K ? "keys" : "values";
    const char *fields[] = {"bits", "group_size", "group_axis", "scale_dtype", "eta"};
    const kv_fit_method m = smethod(cfg, l, st);
    const int higgs = uses_higgs(m);
    size_t used = 0;
    char key[64];
    if (is_float(m)) { /* shaped by the method and fp.* */
        snprintf(buf, n, "method (%s), fp.scale_granularity (%s)", kv_fit_config_origin(cfg, "method"),
                 kv_fit_config_origin(cfg, "fp.scale_granularity"));
        return;
    }
    for (size_t i = 0; i < sizeof fields / sizeof *fields && used < n; i++) {
        if (higgs && i > 0) break; /* HIGGS streams take their shape from higgs.* */
        snprintf(key, sizeof key, "%s.%s", sec, fields[i]);
        used += (size_t)snprintf(buf + used, n - used, "%s%s (%s)", used ? ", " : "", key,
                                 kv_fit_config_origin(cfg, key));
    }
    if (higgs) {
        const char *hk[] = {"higgs.d", "higgs.n", "higgs.group_size"};
        for (size_t i = 0; i < 3 && used < n; i++)
            used += (size_t)snprintf(buf + used, n - used, ", %s (%s)", hk[i], kv_fit_config_origin(cfg, hk[i]));
    }
    if (is_aqua(m) && l == 0 && used < n)
        used += (size_t)snprintf(buf + used, n - used, ", aqua.first_layer_bits (%s)",
                                 kv_fit_config_origin(cfg, "aqua.first_layer_bits"));
    const kv_fit_layer_override *lo = kv_fit_config_layer(cfg, l);
    if (lo && used < n) snprintf(buf + used, n - used, ", layers.%d (%s)", l, lo->where[0] ? lo->where : "?");
}

/* The layers' attention windows, the model's (plan 1.5): the runtime applies them and holds at most a window of
 * such a layer's tokens, in every accounting the plan is measured by. */
static kv_status set_windows(kv_plan *p, const kv_arch *a) {
    for (int l = 0; l < p->n_layers; l++) p->layers[l].window = kv_arch_layer_window(a, l);
    return KV_OK;
}

static kv_status setup_plan(kv_plan *p, const kv_fit_config *cfg, int kv_dim, int head_dim, const kv_fit_options *opt,
                            double *grid_seconds) {
    if (cfg->cache.recent < 1)
        return KV_ERR(KV_EINVAL, "cache.recent is %d: the compressed cache compresses chunks of `recent` tokens, "
                      "which must be at least 1", cfg->cache.recent);
    p->global.sinks = cfg->cache.sinks;
    p->global.recent = cfg->cache.recent;
    p->global.prune_method = cfg->pruning.method;
    p->global.prune_budget = (float)cfg->pruning.budget;
    p->global.prune_window = cfg->pruning.window;
    p->global.prune_pool = cfg->pruning.pool;
    p->global.rht_seed = kv_rng_u64(cfg->seed, 0x726874ull); /* "rht" */
    const int hg = cfg->higgs.group_size ? cfg->higgs.group_size : head_dim;
    int any_higgs = 0;
    for (int l = 0; l < p->n_layers; l++) any_higgs |= uses_higgs(smethod(cfg, l, 0)) || uses_higgs(smethod(cfg, l, 1));
    if (any_higgs) {
        if (hg < cfg->higgs.d || (hg & (hg - 1)) != 0 || kv_dim % hg != 0 || hg % cfg->higgs.d != 0)
            return KV_ERR(KV_EINVAL, "higgs.group_size %d: a HIGGS group must be a power of two, a multiple of "
                          "higgs.d (%d) and divide the %d channels of a token (n_kv_heads * head_dim)", hg,
                          cfg->higgs.d, kv_dim);
    }
    /* PyramidKV: the plan records its per-layer schedule (the runtime's, kv_prune_pyramid_budgets), so that
     * what a layer keeps is read from the plan; layers.N.prune_budget overrides it (per-layer mixes). */
    const int pyramid = cfg->pruning.method == KV_PLAN_PRUNE_PYRAMIDKV;
    double *pyr = pyramid ? malloc((size_t)p->n_layers * sizeof *pyr) : NULL;
    if (pyramid && !pyr) return KV_ERR(KV_ENOMEM, "out of memory");
    if (pyramid) {
        const kv_status ps = kv_prune_pyramid_budgets(pyr, p->n_layers, cfg->pruning.budget);
        for (int l = 0; l < p->n_layers && ps == KV_OK; l++) p->layers[l].prune_budget = (float)pyr[l];
        free(pyr);
        if (ps != KV_OK) return ps;
    }
    for (int l = 0; l < p->n_layers; l++) {
        const kv_fit_layer_override *lo = kv_fit_config_layer(cfg, l);
        if (lo && (lo->set & KV_FIT_LO_PRUNE_BUDGET)) p->layers[l].prune_budget = (float)lo->prune_budget;
        for (int st = 0; st < 2; st++) {
            kv_plan_stream *s = &p->layers[l].stream[st];
            const kv_fit_stream_config *sc = st == KV_PLAN_K ? &cfg->keys : &cfg->values;
            const kv_fit_method method = smethod(cfg, l, st);
            int explicit_bits;
            const int bits = stream_bits(cfg, l, st, p->layers[l].window, &explicit_bits);
            s->scale_dtype = sc->scale_dtype;
            s->share_codes_with_layer = -1;
            s->rpc_ratio = (float)cfg->cache.rpc_ratio;
            if (lo && (lo->set & KV_FIT_LO_RPC_RATIO)) s->rpc_ratio = (float)lo->rpc_ratio;
            if (lo && st == KV_PLAN_K && (lo->set & KV_FIT_LO_KEY_RPC_RATIO)) s->rpc_ratio = (float)lo->key_rpc_ratio;
            if (lo && st == KV_PLAN_V && (lo->set & KV_FIT_LO_VALUE_RPC_RATIO))
                s->rpc_ratio = (float)lo->value_rpc_ratio;
            s->pre_rope = st == KV_PLAN_K ? kv_fit_config_key_pre_rope(cfg, l) : 0;
            s->pack = KV_PLAN_PACK_WORD;
            const kv_fit_stream_setup su = {p, cfg, opt, l, st, bits, explicit_bits, head_dim, hg, grid_seconds};
            kv_status r = kv_fitter_of(method)->setup_stream(&su); /* the method's record (fitters.c) */
            if (r != KV_OK) return r;
            /* The quantizer the runtime will build from this record, on one chunk's shape: a refusal
             * here names the configuration keys (and where they were set), not only the quantizer. */
            kv_quant q;
            kv_block_storage bs;
            kv_status qs = kv_quant_from_plan(&q, p, l, st);
            if (qs == KV_OK) qs = kv_quant_storage(&bs, &q, (size_t)cfg->cache.recent, (size_t)kv_dim);
            if (qs != KV_OK) {
                char keys[768];
                stream_keys(keys, sizeof keys, cfg, l, st);
                return kv_error_wrap(qs, "configuration %s: ", keys); /* the message names the stream */
            }
        }
    }
    return KV_OK;
}

/* ---- the run -------------------------------------------------------------------------------------
 * Sequences are cut into shards of data.shard_seqs consecutive sequences (calibration sequences
 * first, then held-out ones). A shard is one forward call, the unit the ranks share (shard k belongs
 * to rank k mod size) and the unit of every sum: the normal equations are summed per shard and the
 * shards' sums added in shard order (kv_dist_fold), the held-out metrics per chunk and the chunks'
 * sums added in chunk order. The plan therefore has the same bits for any number of ranks (at a
 * given thread count per rank). The state (kv_fit_state) is in fit_internal.h: the fitters' hooks read it. */
typedef kv_fit_state fit_run;

typedef struct capture_ctx {
    fit_run *r;
    float *k, *v; /* the shard's K and V */
    int64_t j;    /* the local shard */
} capture_ctx;

static kv_status capture(void *user, const kv_capture *c) {
    capture_ctx *cc = user;
    fit_run *r = cc->r;
    const float *ksrc = kv_fit_config_key_pre_rope(r->cfg, c->layer) ? c->k_pre : c->k;
    const size_t kvd = (size_t)r->kv_dim;
    for (int b = 0; b < c->n_seqs; b++) {
        const size_t row0 = (size_t)b * (size_t)c->n_tokens + (size_t)r->sinks;
        const size_t dst0 = (size_t)b * (size_t)r->n_comp;
        memcpy(cc->k + dst0 * kvd, ksrc + row0 * kvd, (size_t)r->n_comp * kvd * sizeof(float));
        memcpy(cc->v + dst0 * kvd, c->v + row0 * kvd, (size_t)r->n_comp * kvd * sizeof(float));
    }
    kv_status s = kv_fit_xq_eta_capture(&r->xqe, cc->j, kv_fit_shard_ncal(r, r->shard_ids[cc->j]), c);
    return s == KV_OK ? kv_fit_sq_capture(&r->sq, cc->j, c) : s;
}

static void fit_run_free(fit_run *r) {
    kv_fit_store_free(&r->st);
    kv_fit_seqs_free(&r->seqs);
    free(r->shard_ids);
    free(r->shard_nseq);
    free(r->pos);
    free(r->layer_report);
    for (int i = 0; i < 64; i++) kv_grid_search_free(r->search[i]);
    kv_fit_xq_codes_free(&r->xq);
    kv_fit_xq_eta_free(&r->xqe);
    kv_fit_sq_free(&r->sq);
}

/* ---- layer forward ------------------------------------------------------------------------------ */
/* NaN or Inf in a layer's captured K/V (a NaN weight, an overflow) would otherwise surface as a
 * LAPACK argument error or a silently broken plan. Checked per shard as it is captured. */
static kv_status check_finite(const fit_run *r, int l, int64_t j, const float *k, const float *v) {
    const float *kv[2] = {k, v};
    const size_t n = (size_t)r->shard_nseq[j] * (size_t)r->n_comp * (size_t)r->kv_dim;
    for (int st = 0; st < 2; st++)
        for (size_t i = 0; i < n; i++)
            if (!isfinite(kv[st][i])) {
                const size_t row = i / (size_t)r->kv_dim, seq = (size_t)(r->shard_ids[j] * r->shard_seqs) + row / (size_t)r->n_comp;
                return KV_ERR(KV_ENUMERIC, "non-finite activations at layer %d: %s value %g (sequence %zu, token %zu, "
                              "channel %zu); the model's weights or the forward pass produce NaN or Inf", l,
                              st ? "V" : "K", (double)kv[st][i], seq, (size_t)r->sinks + row % (size_t)r->n_comp,
                              i % (size_t)r->kv_dim);
            }
    return KV_OK;
}

static kv_status forward_shard(fit_run *r, int l, int64_t j) {
    float *h, *k, *v;
    kv_status s;
    if ((s = kv_fit_store_get(&r->st, KV_FIT_H, j, 1, &h)) != KV_OK ||
        (s = kv_fit_store_get(&r->st, KV_FIT_K, j, 0, &k)) != KV_OK ||
        (s = kv_fit_store_get(&r->st, KV_FIT_V, j, 0, &v)) != KV_OK)
        return s;
    capture_ctx cc = {r, k, v, j};
    kv_hooks hooks;
    memset(&hooks, 0, sizeof hooks);
    hooks.on_layer = capture;
    hooks.user = &cc;
    hooks.layer_begin = l;
    hooks.layer_end = l + 1;
    s = kv_model_layer_forward(r->m, l, h, (int)r->shard_nseq[j], r->seq_len, r->pos, NULL, NULL, &hooks);
    if (s != KV_OK) return kv_error_wrap(s, "layer %d forward: ", l);
    if ((s = check_finite(r, l, j, k, v)) != KV_OK) return s;
    if ((s = kv_fit_store_put(&r->st, KV_FIT_H, j)) != KV_OK || (s = kv_fit_store_put(&r->st, KV_FIT_K, j)) != KV_OK ||
        (s = kv_fit_store_put(&r->st, KV_FIT_V, j)) != KV_OK)
        return s;
    return KV_OK;
}

/* Every rank takes the same number of steps (ranks with fewer shards idle in the last one), and the
 * ranks agree on the status before each step: an interruption or a failure on any rank stops all
 * of them at the same shard. */
static kv_status forward_pass(fit_run *r, int l, kv_progress *prog, double *done_rows) {
    kv_status s = KV_OK;
    for (int64_t j = 0; j < r->max_local; j++) {
        if (s == KV_OK && r->opt->interrupt && *r->opt->interrupt)
            s = KV_ERR(KV_EINTERRUPTED, "interrupted during layer %d", l); /* kv_fit_run adds where the checkpoint is */
        if ((s = kv_dist_agree(r->dist, s)) != KV_OK) return s;
        if (j < r->n_local) s = forward_shard(r, l, j);
        for (int64_t k = j * r->size; k < (j + 1) * r->size && k < r->n_shards; k++)
            *done_rows += (double)kv_fit_shard_nseq(r, k) * (double)r->seq_len;
        kv_progress_update(prog, *done_rows);
    }
    return kv_dist_agree(r->dist, s);
}

/* ---- predictors: normal equations per shard, summed in shard order, solved on rank 0 ------------- */
typedef struct stats_job {
    fit_run *r;
    int n_inputs;
    int in_roles[2];
    int y_role;
    kv_ridge_stats st; /* one shard's sums (reused) */
    float *xb;         /* concatenated inputs of XB rows */
} stats_job;
enum { XB = 4096 };

static size_t stats_len(int n_in, int n_out) {
    const size_t na = (size_t)n_in + 1;
    return na * na + na * (size_t)n_out + 2 * (size_t)n_out + 1;
}

static kv_status stats_part(void *user, int64_t k, double *out) {
    stats_job *job = user;
    fit_run *r = job->r;
    kv_ridge_stats *st = &job->st;
    const int kvd = r->kv_dim, n_in = job->n_inputs * kvd;
    const size_t na = (size_t)n_in + 1;
    memset(st->G, 0, na * na * sizeof(double));
    memset(st->C, 0, na * (size_t)kvd * sizeof(double));
    memset(st->yy, 0, (size_t)kvd * sizeof(double));
    memset(st->ys, 0, (size_t)kvd * sizeof(double));
    st->n_samples = 0;
    const int64_t rows = kv_fit_shard_ncal(r, k) * r->n_comp;
    if (rows > 0) {
        const int64_t j = k / r->size; /* k = rank + j * size */
        float *in[2] = {NULL, NULL}, *y = NULL;
        kv_status s;
        for (int i = 0; i < job->n_inputs; i++)
            if ((s = kv_fit_store_get(&r->st, job->in_roles[i], j, 1, &in[i])) != KV_OK) return s;
        if ((s = kv_fit_store_get(&r->st, job->y_role, j, 1, &y)) != KV_OK) return s;
        for (int64_t r0 = 0; r0 < rows; r0 += XB) {
            const int64_t nr = rows - r0 < XB ? rows - r0 : XB;
            const float *x = in[0] + (size_t)r0 * (size_t)kvd;
            int ldx = kvd;
            if (job->n_inputs > 1) {
                for (int64_t i = 0; i < nr; i++)
                    for (int q = 0; q < job->n_inputs; q++)
                        memcpy(job->xb + (size_t)i * (size_t)n_in + (size_t)q * (size_t)kvd,
                               in[q] + (size_t)(r0 + i) * (size_t)kvd, (size_t)kvd * sizeof(float));
                x = job->xb;
                ldx = n_in;
            }
            if ((s = kv_ridge_stats_add(st, x, ldx, y + (size_t)r0 * (size_t)kvd, kvd, nr)) != KV_OK) return s;
        }
    }
    double *o = out;
    memcpy(o, st->G, na * na * sizeof(double));
    o += na * na;
    memcpy(o, st->C, na * (size_t)kvd * sizeof(double));
    o += na * (size_t)kvd;
    memcpy(o, st->yy, (size_t)kvd * sizeof(double));
    o += kvd;
    memcpy(o, st->ys, (size_t)kvd * sizeof(double));
    o += kvd;
    o[0] = (double)st->n_samples;
    return KV_OK;
}

/* Fit a predictor of the stream from the inputs (roles) concatenated; every rank stores it. */
static kv_status fit_predictor(fit_run *r, int l, int stream, int n_inputs, const kv_plan_pred_input *in_ids,
                               const int *in_roles, kv_fit_layer_report *lr) {
    const int kvd = r->kv_dim, n_in = n_inputs * kvd;
    const size_t na = (size_t)n_in + 1, len = stats_len(n_in, kvd);
    int rank = kv_fit_config_pred_rank(r->cfg, l, stream); /* 0: full */
    if (rank > kvd) rank = kvd;                             /* min(kv_dim, n_in) = kv_dim */
    const int qbits = kv_fit_config_pred_bits(r->cfg, l, stream), qgroup = r->cfg->aqua.predictor_group; /* 4: GPTQ */
    if (qbits != 0 && (qbits != 4 || rank || kvd % qgroup != 0))
        return KV_ERR(KV_EINVAL, "layer %d %s predictor: code bits %d (aqua.predictor_bits or the layer's "
                      "key/value_predictor_bits: 0 or 4) need a full-rank predictor (rank %d) and aqua.predictor_group (%d) "
                      "dividing kv_dim %d", l, stream ? "V" : "K", qbits, rank, qgroup, kvd);
    const size_t n_w = (size_t)n_in * (size_t)kvd, n_g = qbits ? n_w / (size_t)qgroup : 0;
    stats_job job;
    memset(&job, 0, sizeof job);
    job.r = r;
    job.n_inputs = n_inputs;
    for (int i = 0; i < n_inputs; i++) job.in_roles[i] = in_roles[i];
    job.y_role = stream == KV_PLAN_K ? KV_FIT_K : KV_FIT_V;
    kv_ridge_fit fit;
    memset(&fit, 0, sizeof fit);
    double *acc = malloc(len * sizeof(double));
    float *wt = malloc((size_t)n_in * (size_t)kvd * sizeof(float)), *b = malloc((size_t)kvd * sizeof(float));
    float *left = rank ? malloc((size_t)kvd * (size_t)rank * sizeof(float)) : NULL;
    float *right = rank ? malloc((size_t)rank * (size_t)n_in * sizeof(float)) : NULL;
    uint8_t *qcodes = qbits ? malloc(n_w) : NULL;
    float *qscale = qbits ? malloc(n_g * sizeof(float)) : NULL, *qoffset = qbits ? malloc(n_g * sizeof(float)) : NULL;
    kv_status s = kv_ridge_stats_init(&job.st, n_in, kvd);
    if (s == KV_OK && n_inputs > 1 && !(job.xb = malloc((size_t)XB * (size_t)n_in * sizeof(float))))
        s = KV_ERR(KV_ENOMEM, "out of memory");
    if (s == KV_OK && (!acc || !wt || !b || (rank && (!left || !right)) || (qbits && (!qcodes || !qscale || !qoffset))))
        s = KV_ERR(KV_ENOMEM, "out of memory for the normal equations");
    if ((s = kv_dist_agree(r->dist, s)) != KV_OK) goto done;
    if ((s = kv_dist_fold(r->dist, acc, len, r->n_shards, stats_part, &job)) != KV_OK) goto done;
    kv_status solved = KV_OK;
    double solve_info[2] = {NAN, NAN}; /* rcond, fallback: rank 0's, for every rank's report */
    if (r->rank == 0) {
        kv_ridge_stats sum;
        memset(&sum, 0, sizeof sum);
        sum.n_in = n_in;
        sum.n_out = kvd;
        sum.G = acc;
        sum.C = acc + na * na;
        sum.yy = sum.C + na * (size_t)kvd;
        sum.ys = sum.yy + kvd;
        sum.n_samples = (int64_t)sum.ys[kvd];
        solved = kv_ridge_solve(&fit, &sum, r->cfg->aqua.ridge);
        if (solved != KV_OK) {
            solved = kv_error_wrap(solved, "layer %d %s predictor: ", l, stream ? "V" : "K");
        } else {
            solve_info[0] = fit.rcond;
            solve_info[1] = fit.used_fallback;
            if (fit.used_fallback)
                kv_log(KV_LOG_WARN, "fit: layer %d %s predictor: the normal equations are rank deficient (reciprocal "
                       "condition number %.3g < %.3g; rank %d of %d): used the minimum-norm solution", l,
                       stream ? "V" : "K", fit.rcond, kv_ridge_rcond_threshold(n_in), fit.rank, n_in + 1);
            /* ridge W is n_in x kvd (y = x W + b); the plan stores out x in (y = W x + b). */
            for (int i = 0; i < n_in; i++)
                for (int o = 0; o < kvd; o++)
                    wt[(size_t)o * (size_t)n_in + (size_t)i] = fit.W[(size_t)i * (size_t)kvd + (size_t)o];
            memcpy(b, fit.b, (size_t)kvd * sizeof(float));
            if (rank) { /* the rank-r map closest to the full one's predictions (ridge.c), bias refitted */
                double lost = 0;
                solved = kv_ridge_reduce_rank(left, right, b, &lost, &fit, &sum, rank);
                if (solved != KV_OK) solved = kv_error_wrap(solved, "layer %d %s predictor, rank %d: ", l, stream ? "V" : "K", rank);
                else
                    kv_log(KV_LOG_DEBUG, "fit: layer %d %s predictor at rank %d: %.4g of the predictions' variance lost",
                           l, stream ? "V" : "K", rank, lost);
            }
            if (qbits) { /* GPTQ on the inputs' covariance, the bias refitted (ridge.c); the residuals below are
                          * quantized against these weights */
                solved = kv_ridge_quantize(wt, b, qcodes, qscale, qoffset, &sum, qbits, qgroup);
                if (solved != KV_OK) solved = kv_error_wrap(solved, "layer %d %s predictor, GPTQ: ", l, stream ? "V" : "K");
            }
        }
    }
    if ((s = kv_dist_agree(r->dist, solved)) != KV_OK) goto done;
    if ((s = kv_dist_bcast(r->dist, wt, (size_t)n_in * (size_t)kvd * sizeof(float), 0)) != KV_OK ||
        (s = kv_dist_bcast(r->dist, b, (size_t)kvd * sizeof(float), 0)) != KV_OK ||
        (s = kv_dist_bcast(r->dist, solve_info, sizeof solve_info, 0)) != KV_OK)
        goto done;
    if (rank && ((s = kv_dist_bcast(r->dist, left, (size_t)kvd * (size_t)rank * sizeof(float), 0)) != KV_OK ||
                 (s = kv_dist_bcast(r->dist, right, (size_t)rank * (size_t)n_in * sizeof(float), 0)) != KV_OK))
        goto done;
    if (qbits && ((s = kv_dist_bcast(r->dist, qcodes, n_w, 0)) != KV_OK ||
                  (s = kv_dist_bcast(r->dist, qscale, n_g * sizeof(float), 0)) != KV_OK ||
                  (s = kv_dist_bcast(r->dist, qoffset, n_g * sizeof(float), 0)) != KV_OK))
        goto done;
    lr->ridge_rcond[stream] = solve_info[0];
    lr->ridge_fallback[stream] = solve_info[1];
    s = kv_plan_set_predictor(r->plan, l, stream, n_inputs, in_ids, wt, b);
    if (s == KV_OK && rank) s = kv_plan_set_predictor_factors(r->plan, l, stream, rank, left, right); /* W = left right */
    /* rounded to the stored dtype now: the residuals below are quantized against the predictor the
     * runtime will read, not the f32 solution */
    if (s == KV_OK) s = kv_plan_set_predictor_dtype(r->plan, l, stream, r->cfg->aqua.predictor_dtype);
    if (s == KV_OK && qbits) s = kv_plan_set_predictor_quantized(r->plan, l, stream, qbits, qgroup, qcodes, qscale, qoffset);
done:
    free(qcodes);
    free(qscale);
    free(qoffset);
    free(acc);
    free(wt);
    free(b);
    free(left);
    free(right);
    free(job.xb);
    kv_ridge_fit_free(&fit);
    kv_ridge_stats_free(&job.st);
    return s;
}

/* ---- quantization of a stream, per shard; held-out metrics per chunk ---------------------------- */
/* Per held-out chunk (in chunk order): ss, sse_pred, rr, rerr, then kv_dim column sums of Y. Each
 * chunk is filled by the rank that owns it and zero elsewhere (kv_dist_sum_disjoint). */
#define HO_SUMS 4
static size_t ho_stride(const fit_run *r) { return HO_SUMS + (size_t)r->kv_dim; }

/* Predict, quantize the residual and reconstruct one stream of layer l in place (Y -> Y_hat), for
 * every compressed chunk of this rank's shards; per-chunk sums of the held-out chunks into ho. */
static kv_status quant_pass(fit_run *r, int l, int stream, const kv_plan_predictor *pred, const int *in_roles,
                            double *ho) {
    const int kvd = r->kv_dim, recent = r->recent;
    const int64_t first_ho_chunk = r->seqs.n_cal * r->n_chunks;
    const int y_role = stream == KV_PLAN_K ? KV_FIT_K : KV_FIT_V;
    const size_t stride = ho_stride(r);
    kv_quant q;
    kv_status s = kv_quant_from_plan(&q, r->plan, l, stream);
    if (s != KV_OK) return s;
    if (q.kind == KV_QUANT_HIGGS) {
        const int gi = r->plan->layers[l].stream[stream].higgs_grid;
        if (gi >= 0 && gi < 64 && !r->search[gi] && (q.higgs.dim == 1 || q.higgs.dim == 2)) {
            s = kv_grid_search_create(&r->search[gi], q.higgs.grid, q.higgs.dim, q.higgs.size);
            if (s != KV_OK) return s;
        }
        if (gi >= 0 && gi < 64) q.higgs.search = r->search[gi];
    }
    /* Predictions for a block of chunks at a time (BLAS, serial), then the round trips in parallel. */
    enum { BLOCK = 64 };
    const size_t chunk_vals = (size_t)recent * (size_t)kvd;
    float *P = pred ? malloc(BLOCK * chunk_vals * sizeof(float)) : NULL;
    if (pred && !P) return KV_ERR(KV_ENOMEM, "out of memory for predictions");
    /* XQuant: keep this layer's codes when the next layer shares them; read the previous layer's */
    int64_t local_chunks = 0, chunk_base = 0;
    for (int64_t j = 0; j < r->n_local; j++) local_chunks += r->shard_nseq[j] * r->n_chunks;
    if ((s = kv_fit_xq_codes_begin(&r->xq, r->plan, l, stream, recent, kvd, local_chunks)) != KV_OK) {
        free(P);
        return s;
    }
    uint32_t *keep = r->xq.cur[stream];
    const uint32_t *partner = q.shared_codes ? r->xq.prev[stream] : NULL;
    const size_t wpc = r->xq.words[stream];
    /* (KIVI streams only: in a mixed plan, kvcal search's refit, the HIGGS / float / AQUA-KV-uniform streams of
     * an xquant base are fitted as their own methods fit them) */
    const int xq_f16 = kv_fit_xq_active(r->cfg) && !pred && r->plan->layers[l].stream[stream].method == KV_PLAN_UNIFORM &&
                       !is_aqua(smethod(r->cfg, l, stream));
    const int sq = stream == KV_PLAN_K && r->sq_layer; /* SQuat keys: per head, the layer's chosen encoders */
    for (int64_t j = 0; j < r->n_local && s == KV_OK; j++) {
        const float *inputs[KV_PLAN_MAX_PRED_INPUTS] = {NULL};
        float *Y = NULL;
        for (int i = 0; pred && i < pred->n_inputs && s == KV_OK; i++) {
            float *p = NULL;
            s = kv_fit_store_get(&r->st, in_roles[i], j, 1, &p);
            inputs[i] = p;
        }
        if (s == KV_OK) s = kv_fit_store_get(&r->st, y_role, j, 1, &Y);
        if (s != KV_OK) break;
        const int64_t n_chunks = r->shard_nseq[j] * r->n_chunks;
        const int64_t g0 = r->shard_ids[j] * r->shard_seqs * r->n_chunks; /* global index of its first chunk */
        for (int64_t c0 = 0; c0 < n_chunks && s == KV_OK; c0 += BLOCK) {
            if (r->opt->interrupt && *r->opt->interrupt) { /* the ranks agree after the pass */
                s = KV_ERR(KV_EINTERRUPTED, "interrupted during layer %d", l);
                break;
            }
            const int nb = (int)(n_chunks - c0 < BLOCK ? n_chunks - c0 : BLOCK);
            if (pred) {
                for (int i = 0; i < nb && s == KV_OK; i++) {
                    const size_t off = (size_t)(c0 + i) * chunk_vals;
                    const float *in[KV_PLAN_MAX_PRED_INPUTS];
                    for (int k = 0; k < pred->n_inputs; k++) in[k] = inputs[k] + off;
                    s = kv_predictor_apply(P + (size_t)i * chunk_vals, pred, in, (size_t)recent, kvd);
                }
                if (s != KV_OK) break;
            }
            kv_status bad = KV_OK;
            char bad_msg[512] = "";
#pragma omp parallel for schedule(dynamic, 1)
            for (int i = 0; i < nb; i++) {
                const int64_t chunk = g0 + c0 + i;
                float *y = Y + (size_t)(c0 + i) * chunk_vals;
                const float *p = pred ? P + (size_t)i * chunk_vals : NULL;
                float *res = malloc(2 * chunk_vals * sizeof(float));
                if (!res) {
#pragma omp critical
                    bad = KV_ENOMEM;
                    continue;
                }
                float *rh = res + chunk_vals;
                /* XQuant compresses what the runtime compresses: the window's f16 rows (rt_runtime.c) */
                if (xq_f16)
                    for (size_t k = 0; k < chunk_vals; k++) res[k] = kv_f16_to_f32(kv_f32_to_f16(y[k]));
                else
                    for (size_t k = 0; k < chunk_vals; k++) res[k] = p ? y[k] - p[k] : y[k];
                const size_t lc = (size_t)(chunk_base + c0 + i); /* this rank's chunk index */
                kv_status qs = sq ? kv_fit_sq_roundtrip(rh, &r->sq, (int64_t)(lc / (size_t)r->n_chunks), &q.uniform, recent,
                                                        kvd, res)
                                  : kv_fit_xq_roundtrip(rh, keep ? keep + lc * wpc : NULL, &q, (size_t)recent, (size_t)kvd,
                                                        res, partner ? partner + lc * wpc : NULL);
                if (qs != KV_OK) {
#pragma omp critical
                    {
                        /* the message is thread-local: carry it to the calling thread */
                        bad = qs;
                        snprintf(bad_msg, sizeof bad_msg, "%s", kv_error_last());
                    }
                    free(res);
                    continue;
                }
                if (chunk >= first_ho_chunk) {
                    double *h = ho + (size_t)(chunk - first_ho_chunk) * stride;
                    double ss = 0, sse = 0, rr = 0, rerr = 0;
                    double *col = h + HO_SUMS;
                    for (size_t k = 0; k < chunk_vals; k++) {
                        const double yv = y[k], rv = res[k];
                        const double e = xq_f16 ? (double)y[k] - (double)rh[k] : (double)res[k] - (double)rh[k];
                        ss += yv * yv;
                        sse += rv * rv; /* ||Y - f(X)||^2 (= ||Y||^2 without a predictor) */
                        rr += rv * rv;
                        rerr += e * e;
                        col[k % (size_t)kvd] += yv;
                    }
                    h[0] = ss, h[1] = sse, h[2] = rr, h[3] = rerr;
                }
                for (size_t k = 0; k < chunk_vals; k++) y[k] = p ? p[k] + rh[k] : rh[k];
                free(res);
            }
            if (bad != KV_OK)
                s = bad == KV_ENOMEM ? KV_ERR(KV_ENOMEM, "out of memory quantizing residuals")
                                     : KV_ERR(bad, "layer %d %s stream: %s", l, stream ? "V" : "K", bad_msg);
        }
        if (s == KV_OK) s = kv_fit_store_put(&r->st, y_role, j);
        chunk_base += n_chunks;
    }
    free(P);
    return s;
}

/* The stream's metrics from every held-out chunk's sums, added in chunk order. */
static void stream_metrics(fit_run *r, int l, int stream, int has_pred, const double *ho, kv_fit_layer_report *lr) {
    const int kvd = r->kv_dim;
    const int64_t n_ho_chunks = r->seqs.n_ho * r->n_chunks;
    const size_t stride = ho_stride(r);
    double ss = 0, sse = 0, rr = 0, rerr = 0, centred;
    double *col = calloc((size_t)kvd, sizeof(double));
    for (int64_t c = 0; c < n_ho_chunks; c++) {
        const double *h = ho + (size_t)c * stride;
        ss += h[0];
        sse += h[1];
        rr += h[2];
        rerr += h[3];
        for (int j = 0; col && j < kvd; j++) col[j] += h[HO_SUMS + j];
    }
    const double n_rows = (double)n_ho_chunks * (double)r->recent;
    centred = ss;
    for (int j = 0; col && j < kvd; j++) centred -= n_rows > 0 ? col[j] * col[j] / n_rows : 0.0;
    if (!col) centred = NAN;
    free(col);
    lr->rel_mse[stream] = has_pred && ss > 0 ? sse / ss : NAN;
    lr->explained_var[stream] = has_pred && centred > 0 ? 1.0 - sse / centred : NAN;
    lr->resid_rel_err[stream] = rr > 0 ? rerr / rr : NAN;
    lr->quant_rel_err[stream] = ss > 0 ? rerr / ss : NAN;
    lr->bits[stream] = kv_plan_stream_bits(r->plan, l, stream);
    lr->eta[stream] = r->plan->layers[l].stream[stream].eta;
}

/* The stream's fitter: its statistics and choices before the quantization pass (fitters.c). */
static kv_status calibrate(fit_run *r, int l, int st, const kv_plan_predictor *pred, kv_fit_layer_report *lr) {
    const kv_fitter *f = kv_fitter_of(smethod(r->cfg, l, st));
    return kv_dist_agree(r->dist, f->calibrate ? f->calibrate(r, l, st, pred, lr) : KV_OK);
}

/* One layer: per stream (K, then V, whose predictor reads K_hat), the AQUA-KV predictor where the method has
 * one, the fitter's calibration, the quantization pass; then the held-out metrics. */
static kv_status fit_layer(fit_run *r, int l, kv_fit_layer_report *lr) {
    const kv_fit_config *cfg = r->cfg;
    const int aqua_k = is_aqua(smethod(cfg, l, KV_PLAN_K)) && l >= 1, aqua_v = is_aqua(smethod(cfg, l, KV_PLAN_V)) && l >= 1;
    const size_t n_ho = (size_t)(r->seqs.n_ho * r->n_chunks) * ho_stride(r);
    double *ho = calloc(2 * n_ho + 1, sizeof(double)); /* K's chunks, then V's */
    kv_status s = kv_dist_agree(r->dist, ho ? KV_OK : KV_ERR(KV_ENOMEM, "out of memory for the held-out sums"));
    lr->ridge_rcond[0] = lr->ridge_rcond[1] = NAN;
    lr->ridge_fallback[0] = lr->ridge_fallback[1] = NAN;
    lr->eta_gain_vs_0[0] = lr->eta_gain_vs_0[1] = NAN; /* set by XQuant's calibrated eta */
    lr->eta_gain_vs_datafree[0] = lr->eta_gain_vs_datafree[1] = NAN;
    for (int i = 0; i < KV_FIT_SQ_METRICS; i++) lr->squat[i] = NAN;
    r->sq_layer = 0; /* set by SQuat's choice for the keys */
    if (s != KV_OK) goto done;
    /* K: f_k(K_hat(l-1)) */
    const kv_plan_predictor *pk = NULL;
    const int kin[2] = {KV_FIT_KP, -1};
    if (aqua_k && cfg->aqua.predict_keys) {
        const kv_plan_pred_input ids[1] = {{l - 1, KV_PLAN_K}};
        if ((s = fit_predictor(r, l, KV_PLAN_K, 1, ids, kin, lr)) != KV_OK) goto done;
        pk = r->plan->layers[l].stream[KV_PLAN_K].predictor;
    }
    if ((s = calibrate(r, l, KV_PLAN_K, pk, lr)) != KV_OK) goto done;
    if ((s = kv_dist_agree(r->dist, quant_pass(r, l, KV_PLAN_K, pk, kin, ho))) != KV_OK) goto done;
    r->sq_layer = 0;
    /* V: f_v([V_hat(l-1); K_hat(l)]) — the K role now holds K_hat(l) */
    const kv_plan_predictor *pv = NULL;
    const int vin[2] = {KV_FIT_VP, KV_FIT_K};
    if (aqua_v && cfg->aqua.predict_values) {
        const kv_plan_pred_input ids[2] = {{l - 1, KV_PLAN_V}, {l, KV_PLAN_K}};
        const int n_in = cfg->aqua.value_uses_keys ? 2 : 1;
        if ((s = fit_predictor(r, l, KV_PLAN_V, n_in, ids, vin, lr)) != KV_OK) goto done;
        pv = r->plan->layers[l].stream[KV_PLAN_V].predictor;
    }
    if ((s = calibrate(r, l, KV_PLAN_V, pv, lr)) != KV_OK) goto done;
    if ((s = kv_dist_agree(r->dist, quant_pass(r, l, KV_PLAN_V, pv, vin, ho + n_ho))) != KV_OK) goto done;
    kv_fit_xq_codes_end_layer(&r->xq);
    if ((s = kv_dist_sum_disjoint(r->dist, ho, 2 * n_ho)) != KV_OK) goto done;
    stream_metrics(r, l, KV_PLAN_K, pk != NULL, ho, lr);
    stream_metrics(r, l, KV_PLAN_V, pv != NULL, ho + n_ho, lr);
done:
    free(ho);
    return s;
}

/* Store the per-layer numbers (doubles for the checkpoint, floats in the plan's report). */
static void pack_layer_report(double *dst, const kv_fit_layer_report *lr) {
    for (int st = 0; st < 2; st++) {
        dst[st * 4 + 0] = lr->rel_mse[st];
        dst[st * 4 + 1] = lr->explained_var[st];
        dst[st * 4 + 2] = lr->quant_rel_err[st];
        dst[st * 4 + 3] = lr->resid_rel_err[st];
        dst[8 + st] = lr->bits[st];
    }
    dst[10] = lr->seconds_forward;
    dst[11] = lr->seconds_fit;
    for (int st = 0; st < 2; st++) {
        dst[12 + st] = lr->ridge_rcond[st];
        dst[14 + st] = lr->ridge_fallback[st];
    }
    dst[16] = lr->peak_rss_mib;
    for (int st = 0; st < 2; st++) {
        dst[17 + st] = lr->eta_gain_vs_0[st];
        dst[19 + st] = lr->eta_gain_vs_datafree[st];
    }
    for (int i = 0; i < KV_FIT_SQ_METRICS; i++) dst[21 + i] = lr->squat[i];
}

static void unpack_layer_report(kv_fit_layer_report *lr, const double *src) {
    for (int st = 0; st < 2; st++) {
        lr->rel_mse[st] = src[st * 4 + 0];
        lr->explained_var[st] = src[st * 4 + 1];
        lr->quant_rel_err[st] = src[st * 4 + 2];
        lr->resid_rel_err[st] = src[st * 4 + 3];
        lr->bits[st] = src[8 + st];
    }
    lr->seconds_forward = src[10];
    lr->seconds_fit = src[11];
    for (int st = 0; st < 2; st++) {
        lr->ridge_rcond[st] = src[12 + st];
        lr->ridge_fallback[st] = src[14 + st];
    }
    lr->peak_rss_mib = src[16];
    for (int st = 0; st < 2; st++) {
        lr->eta_gain_vs_0[st] = src[17 + st];
        lr->eta_gain_vs_datafree[st] = src[19 + st];
    }
    for (int i = 0; i < KV_FIT_SQ_METRICS; i++) lr->squat[i] = src[21 + i];
}

/* Where metric m of stream st sits in a packed layer record. */
static size_t metric_slot(int st, int m) {
    return m < 4 ? (size_t)st * 4 + (size_t)m : m < 6 ? (size_t)(12 + 2 * (m - 4) + st) : (size_t)(17 + 2 * (m - 6) + st);
}

/* With SQuat keys the report has the SQuat metrics after the others (on the K rows; NaN on V). */
static kv_status update_plan_report(fit_run *r) {
    const int L = r->L, nm = KV_FIT_N_METRICS + (r->cfg->squat.enabled ? KV_FIT_SQ_METRICS : 0);
    const char *names[KV_FIT_N_METRICS + KV_FIT_SQ_METRICS];
    for (int m = 0; m < nm; m++) names[m] = m < KV_FIT_N_METRICS ? kv_fit_metric_names[m] : kv_fit_sq_metric_names[m - KV_FIT_N_METRICS];
    float *vals = malloc((size_t)L * 2 * (size_t)nm * sizeof(float));
    if (!vals) return KV_ERR(KV_ENOMEM, "out of memory");
    for (int l = 0; l < L; l++)
        for (int st = 0; st < 2; st++)
            for (int m = 0; m < nm; m++) {
                const double *lr = r->layer_report + (size_t)l * KV_FIT_CKPT_DOUBLES;
                vals[((size_t)l * 2 + (size_t)st) * (size_t)nm + (size_t)m] =
                    m < KV_FIT_N_METRICS ? (float)lr[metric_slot(st, m)]
                                         : st == KV_PLAN_K ? (float)lr[21 + m - KV_FIT_N_METRICS] : NAN;
            }
    kv_status s = kv_plan_set_report(r->plan, nm, names, vals);
    free(vals);
    return s;
}

/* Peak resident set of this process so far, MiB (the largest over ranks after kv_dist_max). */
static double peak_rss_mib(void) {
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru) != 0) return NAN;
    return (double)ru.ru_maxrss / 1024.0; /* KiB on Linux */
}

kv_status kv_fit_check(const kv_fit_config *cfg, const kv_arch *a) {
    if (!cfg || !a) return KV_ERR(KV_EINVAL, "kv_fit_check: no configuration or architecture");
    kv_status s = kv_fit_config_validate(cfg);
    if (s != KV_OK) return s;
    if (cfg->xquant.target_bits > 0 &&
        (cfg->xquant.km >= 0 || cfg->xquant.vm >= 0 || cfg->xquant.kq >= 0 || cfg->xquant.vq >= 0))
        return KV_ERR(KV_EINVAL, "xquant.target_bits %g chooses xquant.kq/vq/km/vm: leave them at -1",
                      cfg->xquant.target_bits);
    int windowed = 0; /* the model's sliding-window layers (the plan records them; RUNTIME.md §11) */
    for (int l = 0; l < a->n_layers; l++) windowed |= kv_arch_layer_window(a, l) > 0;
    for (int l = 0; windowed && cfg->cache.windowed_layers == KV_FIT_WINDOWED_F16 && l < a->n_layers; l++)
        for (int st = 0; st < 2 && kv_arch_layer_window(a, l) > 0; st++) {
            int explicit_bits;
            const int m = smethod(cfg, l, st);
            if (stream_bits(cfg, l, st, kv_arch_layer_window(a, l), &explicit_bits) == KV_FIT_F16_BITS &&
                !kv_fit_method_has(m, KV_FIT_T_F16))
                return KV_ERR(KV_EINVAL, "%s: key 'cache.windowed_layers': f16 keeps layer %d (a sliding-window layer) "
                              "in f16 unquantized, which method %s does not do (kivi, xquant and squat do); set the "
                              "layer's bits with layers.%d, or compress windowed layers",
                              kv_fit_config_origin(cfg, "cache.windowed_layers"), l, kv_fit_method_name(m), l);
        }
    if (cfg->pruning.method != KV_PLAN_PRUNE_NONE) { /* what the runtime's token policy cannot combine with */
        const char *pw = kv_fit_config_origin(cfg, "pruning.method"), *pm = kv_plan_prune_name(cfg->pruning.method);
        int any_aqua = 0; /* per stream: overrides may take every stream away from method aqua, or add one */
        for (int l = 0; l < a->n_layers; l++) any_aqua |= is_aqua(smethod(cfg, l, 0)) || is_aqua(smethod(cfg, l, 1));
        if (any_aqua && (cfg->aqua.predict_keys || cfg->aqua.predict_values))
            return KV_ERR(KV_EUNSUPPORTED, "%s: key 'pruning.method': token pruning (%s) keeps different tokens per KV "
                          "head and layer, but an AQUA-KV predictor reads every head of the previous layer's same "
                          "tokens: use method kivi or higgs with pruning (method %s, set at %s)", pw, pm,
                          kv_fit_method_name(cfg->method), kv_fit_config_origin(cfg, "method"));
        if (kv_fit_method_has(cfg->method, KV_FIT_T_XQUANT) &&
            (cfg->xquant.km >= 0 || cfg->xquant.vm >= 0 || cfg->xquant.target_bits > 0))
            return KV_ERR(KV_EUNSUPPORTED, "%s: key 'pruning.method': token pruning (%s) keeps different tokens per "
                          "layer, so a layer cannot reuse the codes of the layer below (xquant.km/vm%s)", pw, pm,
                          cfg->xquant.target_bits > 0 ? ", which xquant.target_bits may choose" : "");
        if (cfg->cache.rpc_ratio > 0.0)
            return KV_ERR(KV_EUNSUPPORTED, "%s: key 'pruning.method': token pruning (%s) together with a KVmix recent "
                          "pivotal context (cache.rpc_ratio %g) is not applied by the runtime", pw, pm,
                          cfg->cache.rpc_ratio);
        if (uses_higgs(cfg->method) && cfg->higgs.group_size > a->head_dim)
            return KV_ERR(KV_EUNSUPPORTED, "%s: key 'pruning.method': token pruning (%s) codes each KV head's kept "
                          "tokens on their own, so a HIGGS group (higgs.group_size %d) cannot span heads (head_dim %d)",
                          pw, pm, cfg->higgs.group_size, a->head_dim);
    }
    /* A uniform stream's groups along tokens must divide cache.recent, the chunk of tokens the cache compresses
     * at once: checked here, before any work (kvcal search checks every candidate before its first fit). */
    for (int l = 0; l < a->n_layers; l++)
        for (int st = 0; st < 2; st++) {
            const kv_fit_method m = smethod(cfg, l, st);
            int explicit_bits, axis, size;
            if (uses_higgs(m) || is_float(m) ||
                stream_bits(cfg, l, st, kv_arch_layer_window(a, l), &explicit_bits) == KV_FIT_F16_BITS)
                continue;
            kv_fit_config_stream_groups(cfg, l, st, &axis, &size);
            if (axis == KV_PLAN_GROUP_TOKENS && cfg->cache.recent % size != 0)
                return KV_ERR(KV_EINVAL, "layer %d: %s.group_size %d: groups along tokens must divide cache.recent (%d, "
                              "set at %s), the chunk of tokens the cache compresses at once", l,
                              st ? "values" : "keys", size, cfg->cache.recent, kv_fit_config_origin(cfg, "cache.recent"));
        }
    for (int i = 0; i < cfg->n_layer_overrides; i++) { /* an override of a layer the model lacks is a mistake */
        const kv_fit_layer_override *o = &cfg->layer_overrides[i];
        if (o->layer >= a->n_layers)
            return KV_ERR(KV_EINVAL, "%s: key 'layers.%d': the model has %d layers (0..%d), so this override would "
                          "apply to nothing; remove it or fix its index", o->where[0] ? o->where : "configuration",
                          o->layer, a->n_layers, a->n_layers - 1);
    }
    return KV_OK;
}

kv_status kv_fit_plan_uncalibrated(kv_plan **out, const kv_fit_config *cfg, const kv_plan_fingerprint *fp,
                                   const kv_arch *a) {
    if (!out || !cfg || !fp || !a) return KV_ERR(KV_EINVAL, "kv_fit_plan_uncalibrated: bad arguments");
    *out = NULL;
    if (!kv_fit_method_has(cfg->method, KV_FIT_T_UNCALIBRATED))
        return KV_ERR(KV_EINVAL, "method %s calibrates predictors or grids: an uncalibrated plan exists for kivi only",
                      kv_fit_method_name(cfg->method));
    if (cfg->squat.enabled)
        return KV_ERR(KV_EINVAL, "squat.enabled: SQuat's r and lambda are chosen from calibration queries (kvcal fit); "
                      "there is no uncalibrated SQuat plan");
    kv_status s = kv_fit_check(cfg, a);
    if (s != KV_OK) return s;
    if (fp->n_layers != a->n_layers || fp->n_kv_heads != a->n_kv_heads || fp->head_dim != a->head_dim)
        return KV_ERR(KV_EMISMATCH, "the fingerprint does not describe the model");
    kv_plan *p = NULL;
    double grid_seconds = 0;
    if ((s = kv_plan_create(&p, fp)) == KV_OK && (s = set_windows(p, a)) == KV_OK &&
        (s = setup_plan(p, cfg, a->n_kv_heads * a->head_dim, a->head_dim, NULL, &grid_seconds)) == KV_OK)
        s = kv_plan_validate(p);
    if (s != KV_OK) {
        kv_plan_free(p);
        return s;
    }
    *out = p;
    return KV_OK;
}

static kv_status check_inputs(kv_model *m, const kv_fit_data *data, const kv_fit_config *cfg) {
    if (!m || !data || !cfg) return KV_ERR(KV_EINVAL, "kv_fit: no model, data or configuration");
    if (!data->tokens && data->n_tokens) return KV_ERR(KV_EINVAL, "kv_fit: no tokens");
    const kv_arch *a = kv_model_arch(m);
    kv_status s = kv_fit_check(cfg, a);
    if (s != KV_OK) return s;
    const int vocab = a->vocab_size;
    for (size_t i = 0; i < data->n_tokens; i++)
        if (data->tokens[i] < 0 || data->tokens[i] >= vocab)
            return KV_ERR(KV_EINVAL, "calibration token %zu is id %d, outside the vocabulary (%d)", i,
                          (int)data->tokens[i], vocab);
    for (size_t i = 0; data->heldout_tokens && i < data->n_heldout_tokens; i++)
        if (data->heldout_tokens[i] < 0 || data->heldout_tokens[i] >= vocab)
            return KV_ERR(KV_EINVAL, "held-out token %zu is id %d, outside the vocabulary (%d)", i,
                          (int)data->heldout_tokens[i], vocab);
    if (data->bos_id >= vocab) return KV_ERR(KV_EINVAL, "BOS id %d outside the vocabulary", (int)data->bos_id);

    const int compressed = cfg->data.seq_len - cfg->cache.sinks;
    if (cfg->cache.recent < 1 || compressed < cfg->cache.recent)
        return KV_ERR(KV_EINVAL, "data.seq_len %d with cache.sinks %d and cache.recent %d: a sequence must hold the "
                      "sinks and at least one chunk of `recent` tokens to compress", cfg->data.seq_len,
                      cfg->cache.sinks, cfg->cache.recent);
    return KV_OK;
}

/* Sequences per shard: data.shard_seqs, else 2048 tokens' worth (at least one sequence): large enough
 * for efficient matrix products, small enough that one shard's forward activations stay a small part
 * of the memory (BENCHMARKS.md), and enough shards for the ranks to share. */
static int shard_seqs_of(const kv_fit_config *cfg) {
    if (cfg->data.shard_seqs > 0) return cfg->data.shard_seqs;
    const int b = 2048 / cfg->data.seq_len;
    return b < 1 ? 1 : b;
}

/* Shards, this rank's share of them, the per-token state and the positions of one shard. */
static kv_status setup_shards(fit_run *r) {
    r->shard_seqs = shard_seqs_of(r->cfg);
    r->n_shards = (r->n_seqs + r->shard_seqs - 1) / r->shard_seqs;
    r->max_local = (r->n_shards + r->size - 1) / r->size;
    r->n_local = r->rank < r->n_shards ? (r->n_shards - r->rank + r->size - 1) / r->size : 0;
    r->shard_ids = calloc((size_t)(r->n_local > 0 ? r->n_local : 1), sizeof(int64_t));
    r->shard_nseq = calloc((size_t)(r->n_local > 0 ? r->n_local : 1), sizeof(int64_t));
    r->pos = malloc((size_t)r->shard_seqs * (size_t)r->seq_len * sizeof(int32_t));
    if (!r->shard_ids || !r->shard_nseq || !r->pos) return KV_ERR(KV_ENOMEM, "out of memory");
    for (int64_t j = 0; j < r->n_local; j++) {
        r->shard_ids[j] = r->rank + j * r->size;
        r->shard_nseq[j] = kv_fit_shard_nseq(r, r->shard_ids[j]);
    }
    for (int b = 0; b < r->shard_seqs; b++)
        for (int t = 0; t < r->seq_len; t++) r->pos[(size_t)b * (size_t)r->seq_len + (size_t)t] = t;
    size_t h_per_seq, kv_per_seq;
    if (kv_size_mul(&h_per_seq, (size_t)r->seq_len, (size_t)r->d_model) != 0 ||
        kv_size_mul(&kv_per_seq, (size_t)r->n_comp, (size_t)r->kv_dim) != 0)
        return KV_ERR(KV_EINVAL, "calibration set too large");
    const kv_arch *a = kv_model_arch(r->m);
    kv_status s = kv_fit_xq_eta_init(&r->xqe, r->cfg, a->n_heads, a->n_kv_heads, a->head_dim, r->sinks, r->n_comp,
                                     r->n_local, r->shard_nseq);
    if (s != KV_OK) return s;
    int64_t *ncal = calloc((size_t)(r->n_local > 0 ? r->n_local : 1), sizeof *ncal);
    if (!ncal) return KV_ERR(KV_ENOMEM, "out of memory");
    for (int64_t j = 0; j < r->n_local; j++) ncal[j] = kv_fit_shard_ncal(r, r->shard_ids[j]);
    s = kv_fit_sq_init(&r->sq, r->cfg, a->n_heads, a->n_kv_heads, a->head_dim, r->seq_len, r->sinks, r->n_comp, r->recent,
                       r->n_local, r->shard_nseq, ncal);
    free(ncal);
    if (s != KV_OK) return s;
    return kv_fit_store_init(&r->st, r->cfg->memory.spill_dir, r->cfg->memory.hidden_dtype == KV_DTYPE_F16, r->n_local,
                             r->shard_ids, r->shard_nseq, r->shard_seqs, h_per_seq, kv_per_seq);
}

/* Rank 0's plan to every other rank (the grids, provenance and predictors so far). */
static kv_status share_plan(fit_run *r) {
    if (r->size == 1) return KV_OK;
    uint8_t *bytes = NULL;
    uint64_t size = 0;
    kv_status s = KV_OK;
    if (r->rank == 0) {
        kv_plan_write_options wo;
        memset(&wo, 0, sizeof wo);
        size_t n = 0;
        s = kv_plan_write_memory(&bytes, &n, r->plan, &wo);
        size = n;
    }
    if ((s = kv_dist_agree(r->dist, s)) != KV_OK) return s;
    if ((s = kv_dist_bcast(r->dist, &size, sizeof size, 0)) != KV_OK) goto done;
    if (r->rank != 0 && !(bytes = malloc(size ? (size_t)size : 1))) s = KV_ERR(KV_ENOMEM, "out of memory for the plan");
    if ((s = kv_dist_agree(r->dist, s)) != KV_OK) goto done;
    if ((s = kv_dist_bcast(r->dist, bytes, (size_t)size, 0)) != KV_OK) goto done;
    if (r->rank != 0) {
        kv_plan_free(r->plan);
        r->plan = NULL;
        s = kv_plan_read_memory(&r->plan, bytes, (size_t)size);
    }
    s = kv_dist_agree(r->dist, s);
done:
    free(bytes);
    return s;
}

/* The model's part, held by every rank (agreed). */
static kv_status acquire(fit_run *r, int part) {
    kv_status s = kv_model_acquire(r->m, part);
    const size_t held = kv_model_weight_bytes(r->m);
    if (held > r->weight_bytes_max) r->weight_bytes_max = held;
    return kv_dist_agree(r->dist, s);
}

/* Every rank embeds its shards (the input of layer 0). */
static kv_status embed_all(fit_run *r) {
    kv_status s = acquire(r, KV_MODEL_PART_EMBED);
    if (s != KV_OK) return s;
    for (int64_t j = 0; j < r->n_local && s == KV_OK; j++) {
        float *h = NULL;
        if ((s = kv_fit_store_get(&r->st, KV_FIT_H, j, 0, &h)) != KV_OK) break;
        const int64_t q0 = r->shard_ids[j] * r->shard_seqs;
        for (int64_t b = 0; b < r->shard_nseq[j] && s == KV_OK; b++)
            s = kv_model_embed(r->m, r->seqs.tokens + (size_t)(q0 + b) * (size_t)r->seq_len, (size_t)r->seq_len,
                               h + (size_t)b * (size_t)r->seq_len * (size_t)r->d_model);
        if (s == KV_OK) s = kv_fit_store_put(&r->st, KV_FIT_H, j);
    }
    kv_model_release(r->m, KV_MODEL_PART_EMBED);
    return kv_dist_agree(r->dist, s);
}

/* ---- checkpoints: every rank its shards, then rank 0 the plan, the report and the manifest ------- */
static kv_status ckpt_save(fit_run *r, const char *hash, int l) {
    const char *dir = r->opt->checkpoint_dir;
    const uint64_t n_h = (uint64_t)r->seq_len * (uint64_t)r->d_model, n_kv = (uint64_t)r->n_comp * (uint64_t)r->kv_dim;
    kv_status s = KV_OK;
    for (int64_t j = 0; j < r->n_local && s == KV_OK; j++) {
        float *h, *kp, *vp;
        if ((s = kv_fit_store_get(&r->st, KV_FIT_H, j, 1, &h)) != KV_OK ||
            (s = kv_fit_store_get(&r->st, KV_FIT_KP, j, 1, &kp)) != KV_OK ||
            (s = kv_fit_store_get(&r->st, KV_FIT_VP, j, 1, &vp)) != KV_OK)
            break;
        const uint64_t nb = (uint64_t)r->shard_nseq[j];
        s = kv_fit_ckpt_save_shard(dir, l, r->shard_ids[j], r->n_shards, h, nb * n_h, kp, vp, nb * n_kv);
    }
    if ((s = kv_dist_agree(r->dist, s)) != KV_OK) return s;
    if (r->rank == 0) s = kv_fit_ckpt_commit(dir, hash, l, r->L, r->n_shards, r->plan, r->layer_report);
    return kv_dist_agree(r->dist, s);
}

/* Resume: the layer to continue after (-1: none), with the plan and the report restored on every
 * rank and every rank's shards loaded. A checkpoint that cannot be used is cleared (rank 0). */
static kv_status ckpt_resume(fit_run *r, const char *hash, int *layer) {
    const char *dir = r->opt->checkpoint_dir;
    const uint64_t n_h = (uint64_t)r->seq_len * (uint64_t)r->d_model, n_kv = (uint64_t)r->n_comp * (uint64_t)r->kv_dim;
    int32_t l = -1;
    char why[1100] = "";
    kv_status s = KV_OK;
    if (r->rank == 0) {
        const char *w = NULL;
        int found = -1;
        kv_fit_ckpt_manifest(&found, &w, dir, hash, r->L, r->n_shards);
        if (found >= 0) {
            if (kv_fit_ckpt_load_common(&r->plan, r->layer_report, dir, found, r->L) == KV_OK) l = found;
            else snprintf(why, sizeof why, "%s", kv_error_last());
        } else if (w) {
            snprintf(why, sizeof why, "%s", w);
        }
        kv_error_clear();
    }
    if ((s = kv_dist_bcast(r->dist, &l, sizeof l, 0)) != KV_OK) return s;
    if (l >= 0) {
        if ((s = share_plan(r)) != KV_OK) return s;
        if ((s = kv_dist_bcast(r->dist, r->layer_report, (size_t)r->L * KV_FIT_CKPT_DOUBLES * sizeof(double), 0)) != KV_OK)
            return s;
        kv_status ls = KV_OK;
        for (int64_t j = 0; j < r->n_local && ls == KV_OK; j++) {
            float *h, *kp, *vp;
            if ((ls = kv_fit_store_get(&r->st, KV_FIT_H, j, 0, &h)) != KV_OK ||
                (ls = kv_fit_store_get(&r->st, KV_FIT_KP, j, 0, &kp)) != KV_OK ||
                (ls = kv_fit_store_get(&r->st, KV_FIT_VP, j, 0, &vp)) != KV_OK)
                break;
            const uint64_t nb = (uint64_t)r->shard_nseq[j];
            ls = kv_fit_ckpt_load_shard(dir, l, r->shard_ids[j], r->n_shards, h, nb * n_h, kp, vp, nb * n_kv);
            if (ls == KV_OK && (ls = kv_fit_store_put(&r->st, KV_FIT_H, j)) == KV_OK &&
                (ls = kv_fit_store_put(&r->st, KV_FIT_KP, j)) == KV_OK)
                ls = kv_fit_store_put(&r->st, KV_FIT_VP, j);
        }
        if (kv_dist_agree(r->dist, ls) != KV_OK) {
            snprintf(why, sizeof why, "%s", kv_error_last());
            kv_error_clear();
            kv_plan_free(r->plan);
            r->plan = NULL;
            l = -1;
        }
    }
    if (l < 0)
        for (size_t i = 0; i < (size_t)r->L * KV_FIT_CKPT_DOUBLES; i++) r->layer_report[i] = NAN;
    if (l < 0 && r->rank == 0) {
        if (why[0]) kv_log(KV_LOG_WARN, "fit: not resuming from the checkpoint in %s: %s; starting over", dir, why);
        struct stat sb;
        if (stat(dir, &sb) == 0) kv_fit_ckpt_clear(dir);
    }
    *layer = l;
    return KV_OK;
}

/* Rank 0 builds the plan (quantizers, grids, provenance) and shares it. */
static kv_status fresh_plan(fit_run *r, const kv_plan_fingerprint *fp, kv_fit_report *lrep) {
    kv_status s = KV_OK;
    char *cfg_yaml = NULL;
    if (r->rank == 0) {
        const kv_fit_config *cfg = r->cfg;
        const kv_fit_options *opt = r->opt;
        if ((s = kv_plan_create(&r->plan, fp)) != KV_OK || (s = set_windows(r->plan, kv_model_arch(r->m))) != KV_OK)
            goto agree;
        if ((s = setup_plan(r->plan, cfg, r->kv_dim, kv_model_arch(r->m)->head_dim, opt, &lrep->seconds_grids)) !=
            KV_OK)
            goto agree;
        kv_plan_provenance pv;
        memset(&pv, 0, sizeof pv);
        if ((s = kv_fit_config_dump(&cfg_yaml, cfg)) != KV_OK) goto agree;
        char tool[64];
        snprintf(tool, sizeof tool, "kvcal %s", KV_VERSION_STRING);
        pv.tool_version = (char *)(opt->tool_version ? opt->tool_version : tool);
        pv.git_hash = (char *)(opt->git_hash ? opt->git_hash : "");
        pv.corpus_sha256 = (char *)(opt->corpus_sha256 ? opt->corpus_sha256 : "");
        pv.seed = cfg->seed;
        pv.config_yaml = cfg_yaml;
        if ((s = kv_plan_creation_time(&pv.created)) != KV_OK) goto agree;
        s = kv_plan_set_provenance(r->plan, &pv);
    }
agree:
    free(cfg_yaml);
    if ((s = kv_dist_agree(r->dist, s)) != KV_OK) return s;
    return share_plan(r);
}

kv_status kv_fit_run(kv_plan **out, kv_fit_report *rep, kv_model *m, const kv_model_file *mf,
                     const kv_fit_data *data, const kv_fit_config *cfg, const kv_fit_options *opt_in) {
    const double t_start = kv_now_seconds();
    *out = NULL;
    if (rep) memset(rep, 0, sizeof *rep);
    kv_fit_options defopt;
    kv_fit_options_init(&defopt);
    const kv_fit_options *opt = opt_in ? opt_in : &defopt;
    if (cfg && cfg->xquant.target_bits > 0) /* a search over fits, not a fit */
        return KV_ERR(KV_EINVAL, "xquant.target_bits %g: the target is met by choosing kq, vq, km, vm before the fit "
                      "(kv_xquant_probe, kv_xquant_choice_apply): kv_fit_run fits a configuration without one",
                      cfg->xquant.target_bits);
    kv_dist *dist = opt->dist;
    fit_run r;
    memset(&r, 0, sizeof r);
    char inputs_hash[65] = "";
    int ckpt_layer = -1; /* the layer the checkpoint on disk holds (-1: none) */
    kv_fit_report lrep;
    memset(&lrep, 0, sizeof lrep);
    kv_status s = kv_dist_agree(dist, check_inputs(m, data, cfg));
    if (s != KV_OK) return s;
    const kv_arch *a = kv_model_arch(m);
    kv_plan_fingerprint fp;
    memset(&fp, 0, sizeof fp);
    if (opt->fingerprint) {
        fp = *opt->fingerprint;
    } else if (kv_dist_rank(dist) == 0) {
        s = mf ? kv_plan_fingerprint_compute(&fp, mf) : KV_ERR(KV_EINVAL, "kv_fit_run: neither a model file nor a fingerprint");
        if (mf) kv_model_file_release_pages(mf, NULL); /* the hashed keys' pages */
    }
    if ((s = kv_dist_agree(dist, s)) != KV_OK) return s;
    if ((s = kv_dist_bcast(dist, &fp, sizeof fp, 0)) != KV_OK) return s;
    /* whether this run creates memory.spill_dir (then it removes it, empty, at the end): as rank 0 sees
     * it before any rank creates it */
    int32_t spill_existed = 1;
    if (kv_dist_rank(dist) == 0 && cfg->memory.spill_dir && cfg->memory.spill_dir[0]) {
        struct stat sb;
        spill_existed = stat(cfg->memory.spill_dir, &sb) == 0;
    }
    if ((s = kv_dist_bcast(dist, &spill_existed, sizeof spill_existed, 0)) != KV_OK) return s;
    if (fp.n_layers != a->n_layers || fp.n_kv_heads != a->n_kv_heads || fp.head_dim != a->head_dim)
        return KV_ERR(KV_EMISMATCH, "the fingerprint does not describe the model (layers %d/%d, kv heads %d/%d, "
                      "head_dim %d/%d)", fp.n_layers, a->n_layers, fp.n_kv_heads, a->n_kv_heads, fp.head_dim,
                      a->head_dim);
    r.m = m;
    r.cfg = cfg;
    r.opt = opt;
    r.dist = dist;
    r.rank = kv_dist_rank(dist);
    r.size = kv_dist_size(dist);
    r.L = a->n_layers;
    r.d_model = a->d_model;
    r.kv_dim = a->n_kv_heads * a->head_dim;
    r.seq_len = cfg->data.seq_len;
    r.sinks = cfg->cache.sinks;
    r.recent = cfg->cache.recent;
    r.n_chunks = (r.seq_len - r.sinks) / r.recent;
    r.n_comp = r.n_chunks * r.recent;
    lrep.n_layers = r.L;
    lrep.layers = calloc((size_t)r.L, sizeof *lrep.layers);
    r.layer_report = malloc((size_t)r.L * KV_FIT_CKPT_DOUBLES * sizeof(double));
    if (!lrep.layers || !r.layer_report) s = KV_ERR(KV_ENOMEM, "out of memory");
    if (s == KV_OK) s = kv_fit_make_seqs(&r.seqs, data, cfg);
    if (s == KV_OK) {
        r.n_seqs = r.seqs.n_cal + r.seqs.n_ho;
        s = setup_shards(&r);
        r.st.made_top = !spill_existed;
    }
    if ((s = kv_dist_agree(dist, s)) != KV_OK) goto done;
    for (size_t i = 0; i < (size_t)r.L * KV_FIT_CKPT_DOUBLES; i++) r.layer_report[i] = NAN;

    /* Resume? */
    int first = 0, resumed = -1;
    if (opt->checkpoint_dir) {
        if (r.rank == 0) s = kv_fit_inputs_hash(inputs_hash, mf, &fp, data, cfg, opt);
        if ((s = kv_dist_agree(dist, s)) != KV_OK) goto done;
        if ((s = kv_dist_bcast(dist, inputs_hash, sizeof inputs_hash, 0)) != KV_OK) goto done;
        if ((s = ckpt_resume(&r, inputs_hash, &resumed)) != KV_OK) goto done;
    }
    if (resumed >= 0) {
        first = resumed + 1;
        ckpt_layer = resumed;
        for (int l = 0; l < first; l++) {
            unpack_layer_report(&lrep.layers[l], r.layer_report + (size_t)l * KV_FIT_CKPT_DOUBLES);
            lrep.layers[l].resumed = 1;
            for (int st = 0; r.plan && st < 2; st++) lrep.layers[l].eta[st] = r.plan->layers[l].stream[st].eta;
        }
        kv_log(KV_LOG_INFO, "fit: resuming after layer %d from the checkpoint in %s", resumed, opt->checkpoint_dir);
    } else {
        if ((s = fresh_plan(&r, &fp, &lrep)) != KV_OK) goto done;
        if ((s = embed_all(&r)) != KV_OK) goto done;
    }
    lrep.resumed_from_layer = first;
    lrep.seconds_setup = kv_now_seconds() - t_start;

    kv_progress prog;
    kv_progress_begin(&prog, "kvcal fit", "tok", (double)(r.L - first) * (double)r.n_seqs * (double)r.seq_len);
    double done_rows = 0;
    for (int l = first; l < r.L; l++) {
        kv_fit_layer_report *lr = &lrep.layers[l];
        const double t0 = kv_now_seconds();
        if ((s = acquire(&r, l)) == KV_OK) s = forward_pass(&r, l, &prog, &done_rows);
        kv_model_release(m, l);
        if (s != KV_OK) {
            kv_progress_end(&prog);
            goto done;
        }
        const double t1 = kv_now_seconds();
        if ((s = fit_layer(&r, l, lr)) != KV_OK) {
            kv_progress_end(&prog);
            goto done;
        }
        const double t2 = kv_now_seconds();
        lr->seconds_forward = t1 - t0;
        lr->seconds_fit = t2 - t1;
        lr->peak_rss_mib = peak_rss_mib();
        if ((s = kv_dist_max(dist, &lr->peak_rss_mib)) != KV_OK) goto done;
        pack_layer_report(r.layer_report + (size_t)l * KV_FIT_CKPT_DOUBLES, lr);
        if ((s = update_plan_report(&r)) != KV_OK) goto done;
        {   /* "ev -" where a stream has no predictor (NaN) */
            char ev[2][32];
            for (int st = 0; st < 2; st++) {
                if (isfinite(lr->explained_var[st])) snprintf(ev[st], sizeof ev[st], "%.4f", lr->explained_var[st]);
                else snprintf(ev[st], sizeof ev[st], "-");
            }
            kv_log(KV_LOG_INFO,
                   "fit: layer %d: K ev %s quant err %.4g (resid %.4g) | V ev %s quant err %.4g (resid %.4g) | "
                   "forward %.2fs fit %.2fs",
                   l, ev[0], lr->quant_rel_err[0], lr->resid_rel_err[0], ev[1], lr->quant_rel_err[1],
                   lr->resid_rel_err[1], lr->seconds_forward, lr->seconds_fit);
        }
        /* this layer's reconstructions are the next layer's inputs */
        kv_fit_store_swap(&r.st);
        /* XQuant: no checkpoint inside a sharing pair (the lower layer's codes are not in it); the
         * last one, before the pair, is where a resumed run starts */
        const int inside_pair = r.xq.prev[0] != NULL || r.xq.prev[1] != NULL;
        if (opt->checkpoint_dir && (l + 1 < r.L) && !inside_pair) {
            const double tc = kv_now_seconds();
            if ((s = ckpt_save(&r, inputs_hash, l)) != KV_OK) {
                /* a failed save (a full disk) leaves no files without a manifest: the previous checkpoint
                 * stays whole, or there is none */
                if (r.rank == 0) kv_fit_ckpt_drop_partial(opt->checkpoint_dir, ckpt_layer);
                kv_progress_end(&prog);
                goto done;
            }
            ckpt_layer = l;
            lr->seconds_checkpoint = kv_now_seconds() - tc;
        }
        if (opt->stop_after_layer >= 0 && l == opt->stop_after_layer && l + 1 < r.L) {
            kv_progress_end(&prog);
            s = KV_ERR(KV_EINTERRUPTED, "stopped after layer %d as asked", l);
            goto done;
        }
    }
    kv_progress_end(&prog);
    /* rank 0 writes the plan; the checkpoint goes only once it is on disk */
    if (r.rank == 0) {
        s = kv_plan_validate(r.plan);
        if (s == KV_OK && opt->out_path && (s = kv_plan_write(r.plan, opt->out_path, NULL)) != KV_OK)
            s = kv_error_wrap(s, "writing the plan: ");
    }
    if ((s = kv_dist_agree(dist, s)) != KV_OK) goto done;
    if (r.rank == 0 && opt->checkpoint_dir) (void)kv_fit_ckpt_remove(opt->checkpoint_dir);
    /* summary */
    lrep.seq_len = r.seq_len;
    lrep.sinks = r.sinks;
    lrep.recent = r.recent;
    lrep.n_calib_seqs = r.seqs.n_cal;
    lrep.n_heldout_seqs = r.seqs.n_ho;
    lrep.calib_tokens = r.seqs.n_cal * r.seq_len;
    lrep.heldout_tokens = r.seqs.n_ho * r.seq_len;
    lrep.fit_rows = r.seqs.n_cal * r.n_comp;
    lrep.heldout_rows = r.seqs.n_ho * r.n_comp;
    lrep.n_ranks = r.size;
    lrep.n_shards = r.n_shards;
    lrep.shard_seqs = r.shard_seqs;
    lrep.hidden_f16 = r.st.h_f16;
    lrep.spilled = r.st.spill;
    lrep.weights_streamed = kv_model_streamed(m);
    lrep.weight_bytes_max = kv_model_streamed(m) ? r.weight_bytes_max : kv_model_weight_bytes(m);
    {
        /* this rank's hidden states in memory (one shard when spilled) */
        uint64_t seqs = 0;
        for (int64_t j = 0; j < r.n_local; j++)
            seqs = r.st.spill ? (seqs > (uint64_t)r.shard_nseq[j] ? seqs : (uint64_t)r.shard_nseq[j])
                              : seqs + (uint64_t)r.shard_nseq[j];
        lrep.hidden_bytes = seqs * (uint64_t)r.seq_len * (uint64_t)r.d_model * (r.st.h_f16 ? 2u : 4u);
        const uint64_t n_in = (uint64_t)r.kv_dim * 2 + 1;
        lrep.state_bytes = r.st.bytes + 8u * 2u * n_in * (n_in + (uint64_t)r.kv_dim) +
                           64u * (uint64_t)r.recent * (uint64_t)r.kv_dim * 4u;
    }
    lrep.peak_rss_mib = peak_rss_mib();
    if ((s = kv_dist_max(dist, &lrep.peak_rss_mib)) != KV_OK) goto done;
    double bsum = 0;
    for (int l = 0; l < r.L; l++) bsum += kv_plan_stream_bits(r.plan, l, 0) + kv_plan_stream_bits(r.plan, l, 1);
    lrep.mean_bits = bsum / (2.0 * r.L);
    lrep.predictor_bytes = kv_plan_predictor_bytes(r.plan);
    lrep.seconds_total = kv_now_seconds() - t_start;
    *out = r.plan;
    r.plan = NULL;
done:
    /* A failed or interrupted run says where its checkpoint is (disk full, a numeric failure or a
     * signal: the same command resumes after the last finished layer), or removes the directory
     * when it holds nothing. */
    if (s != KV_OK && opt->checkpoint_dir) {
        if (ckpt_layer >= 0) {
            kv_error_append(s, "; the checkpoint after layer %d is kept in %s (the same command resumes from it; "
                            "delete it to start over)", ckpt_layer, opt->checkpoint_dir);
        } else {
            if (r.rank == 0) (void)rmdir(opt->checkpoint_dir); /* only when empty */
            if (s == KV_EINTERRUPTED) kv_error_append(s, "; no layer had finished, so there is no checkpoint");
        }
    }
    if (rep && (s == KV_OK || s == KV_EINTERRUPTED)) {
        *rep = lrep;
        lrep.layers = NULL;
    }
    kv_fit_report_free(&lrep);
    kv_plan_free(r.plan);
    fit_run_free(&r);
    return s;
}

kv_status kv_fit_forward_baseline(double *seconds, kv_model *m, const kv_fit_data *data, const kv_fit_config *cfg,
                                  const kv_fit_options *opt) {
    *seconds = 0;
    kv_dist *dist = opt ? opt->dist : NULL;
    const int rank = kv_dist_rank(dist), size = kv_dist_size(dist);
    kv_status s = kv_dist_agree(dist, check_inputs(m, data, cfg));
    if (s != KV_OK) return s;
    kv_fit_seqs seqs;
    memset(&seqs, 0, sizeof seqs);
    const int d = kv_model_arch(m)->d_model, L = kv_model_arch(m)->n_layers, T = cfg->data.seq_len;
    const int B = shard_seqs_of(cfg);
    float *h = NULL;
    int32_t *pos = NULL;
    int64_t local = 0;
    s = kv_fit_make_seqs(&seqs, data, cfg);
    const int64_t n = seqs.n_cal + seqs.n_ho, n_shards = (n + B - 1) / B;
    /* this rank's sequences, shard by shard */
    for (int64_t k = rank; s == KV_OK && k < n_shards; k += size) local += n - k * B < B ? n - k * B : B;
    if (s == KV_OK) {
        pos = malloc((size_t)B * (size_t)T * sizeof(int32_t));
        h = kv_model_streamed(m) ? kv_aligned_alloc(64, (size_t)(local ? local : 1) * (size_t)T * (size_t)d * sizeof(float))
                                 : NULL;
        if (!pos || (kv_model_streamed(m) && !h)) s = KV_ERR(KV_ENOMEM, "out of memory for the forward baseline");
    }
    if ((s = kv_dist_agree(dist, s)) != KV_OK) goto done;
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) pos[(size_t)b * (size_t)T + (size_t)t] = t;
    const double t0 = kv_now_seconds();
    if (!kv_model_streamed(m)) {
        /* every layer of a shard at once (kv_model_forward), shard after shard */
        for (int64_t k = rank; k < n_shards && s == KV_OK; k += size) {
            kv_forward f;
            memset(&f, 0, sizeof f);
            f.tokens = seqs.tokens + (size_t)(k * B) * (size_t)T;
            f.n_seqs = (int)(n - k * B < B ? n - k * B : B);
            f.n_tokens = T;
            s = kv_model_forward(m, &f);
        }
    } else {
        /* streamed weights: one layer at a time over every shard, as the fit runs */
        if ((s = kv_model_acquire(m, KV_MODEL_PART_EMBED)) == KV_OK) {
            size_t row = 0;
            for (int64_t k = rank; k < n_shards && s == KV_OK; k += size) {
                const int64_t nb = n - k * B < B ? n - k * B : B;
                s = kv_model_embed(m, seqs.tokens + (size_t)(k * B) * (size_t)T, (size_t)(nb * T), h + row * (size_t)d);
                row += (size_t)(nb * T);
            }
        }
        kv_model_release(m, KV_MODEL_PART_EMBED);
        for (int l = 0; l < L && s == KV_OK; l++) {
            if ((s = kv_model_acquire(m, l)) != KV_OK) break;
            size_t row = 0;
            for (int64_t k = rank; k < n_shards && s == KV_OK; k += size) {
                const int64_t nb = n - k * B < B ? n - k * B : B;
                s = kv_model_layer_forward(m, l, h + row * (size_t)d, (int)nb, T, pos, NULL, NULL, NULL);
                row += (size_t)(nb * T);
            }
            kv_model_release(m, l);
        }
    }
    *seconds = kv_now_seconds() - t0;
    s = kv_dist_agree(dist, s);
    if (s == KV_OK) s = kv_dist_max(dist, seconds);
done:
    kv_aligned_free(h);
    free(pos);
    kv_fit_seqs_free(&seqs);
    return s;
}
