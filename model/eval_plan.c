/* eval_plan.c — what a plan costs (kv_eval_plan, behind `kvrun eval --plan` and kvcal search's selection and
 * validation): the same chunks run exactly and through the runtime's compressed cache (kv_cache_rt_create,
 * kv_eval_compare); quality (ppl both ways, KL, top-1 agreement), bits and speed. Bits per value follow the papers' convention for the compressed tokens (codes,
 * scales, zero points, norms, positions of pruned tokens, and the predictor weights amortized over all
 * evaluated tokens), and bits_per_value_total counts everything the cache held (full-precision sinks and
 * recent buffer at 16 bits, positions, predictors once per sequence) per value of every token the model
 * produced: a pruning plan (H2O prunes throughout a chunk) is charged against the f16 cache of all tokens,
 * the memory it saves, not against the tokens it kept. */
#include "kv_model.h"
#include "kvrt.h"

#include <stdlib.h>
#include <string.h>

typedef struct chunk_totals {
    kv_rt *rt;
    uint64_t payload_bytes, index_bytes, fp_bytes, values_compressed, values_total, values_appended;
    uint64_t predictor_bytes, basis_bytes;
    uint64_t last_bytes, last_appended; /* one sequence (the last chunk), for cache_bytes */
    uint64_t last_allocated;          /* what the runtime allocated for it */
} chunk_totals;

static kv_status on_chunk(void *user, kv_cache *cache, size_t chunk) {
    (void)chunk, (void)cache;
    chunk_totals *t = user;
    kv_rt_stats st;
    kv_status s = kv_rt_get_stats(t->rt, 0, &st);
    if (s != KV_OK) return s;
    t->payload_bytes += st.payload_bytes;
    t->index_bytes += st.index_bytes;
    t->fp_bytes += st.fp_bytes;
    t->values_compressed += st.values_compressed;
    t->values_total += st.values_total;
    t->values_appended += st.values_appended;
    t->predictor_bytes = st.predictor_bytes;
    t->basis_bytes = st.basis_bytes;
    t->last_bytes = st.accounted_bytes + st.predictor_bytes + st.basis_bytes;
    t->last_appended = st.values_appended;
    t->last_allocated = st.allocated_bytes;
    return KV_OK;
}

kv_status kv_eval_plan(kv_plan_eval *out, kv_model *m, const char *model_path, const char *plan_path,
                            const int32_t *tokens, size_t n_tokens, int ctx, int bos, size_t max_chunks,
                            int prefill, int step, const char *progress_label) {
    return kv_eval_plan_ex(out, m, model_path, plan_path, tokens, n_tokens, ctx, bos, max_chunks, prefill, step,
                                progress_label, NULL);
}

kv_status kv_eval_plan_ex(kv_plan_eval *out, kv_model *m, const char *model_path, const char *plan_path,
                               const int32_t *tokens, size_t n_tokens, int ctx, int bos, size_t max_chunks,
                               int prefill, int step, const char *progress_label, const char *predictions) {
    memset(out, 0, sizeof *out);
    kv_plan *plan = NULL;
    kv_model_file *mf = NULL;
    kv_status s = kv_plan_read(&plan, plan_path);
    if (s != KV_OK) return s;
    /* refuse a plan made for another model before running anything */
    kv_plan_fingerprint fp;
    if ((s = kv_model_file_open(&mf, model_path)) != KV_OK) goto done;
    if ((s = kv_plan_fingerprint_compute(&fp, mf)) != KV_OK) goto done;
    if ((s = kv_plan_check_fingerprint(plan, &fp)) != KV_OK) {
        kv_error_wrap(s, "plan '%s' does not belong to model '%s': ", plan_path, model_path);
        goto done;
    }
    if ((s = kv_eval_plan_loaded_ex(out, m, plan, tokens, n_tokens, ctx, bos, max_chunks, prefill, step,
                                         progress_label, predictions)) != KV_OK)
        kv_error_wrap(s, "plan '%s': ", plan_path);
done:
    kv_model_file_close(mf);
    kv_plan_free(plan);
    return s;
}

kv_status kv_eval_plan_loaded(kv_plan_eval *out, kv_model *m, const kv_plan *plan, const int32_t *tokens,
                                   size_t n_tokens, int ctx, int bos, size_t max_chunks, int prefill, int step,
                                   const char *progress_label) {
    return kv_eval_plan_loaded_ex(out, m, plan, tokens, n_tokens, ctx, bos, max_chunks, prefill, step,
                                       progress_label, NULL);
}

kv_status kv_eval_plan_loaded_ex(kv_plan_eval *out, kv_model *m, const kv_plan *plan, const int32_t *tokens,
                                      size_t n_tokens, int ctx, int bos, size_t max_chunks, int prefill, int step,
                                      const char *progress_label, const char *predictions) {
    memset(out, 0, sizeof *out);
    kv_cache *cache = NULL;
    int32_t *argmax = NULL;
    size_t cap = 0;
    if (predictions) { /* every scored position's argmax, exact and through the cache: (ctx - 1) per chunk */
        size_t chunks = ctx > 1 ? n_tokens / (size_t)(ctx - 1) : 0;
        if (max_chunks && chunks > max_chunks) chunks = max_chunks;
        cap = chunks * (size_t)(ctx - 1);
        if (!(argmax = malloc(2 * (cap ? cap : 1) * sizeof(int32_t)))) return KV_ERR(KV_ENOMEM, "out of memory");
    }
    kv_status s = kv_cache_rt_create(&cache, plan, m, 1, ctx, 0, 0);
    if (s != KV_OK) {
        free(argmax);
        return s;
    }
    chunk_totals tot;
    memset(&tot, 0, sizeof tot);
    tot.rt = kv_cache_rt_runtime(cache);
    kv_compare_options o;
    memset(&o, 0, sizeof o);
    o.ctx = ctx, o.bos_id = bos, o.max_chunks = max_chunks;
    /* By default the first step fills the sinks and one recent buffer, then one buffer per step:
     * identical to token-by-token decoding for the fixed-buffer semantics (tests/ccache). KVmix's
     * recent pivotal context depends on how many tokens each step brings, so its evaluation sets
     * prefill (a prompt) and step (1 = true decoding) explicitly. */
    o.first_step = prefill > 0 ? prefill : plan->global.sinks + plan->global.recent;
    o.step = step > 0 ? step : plan->global.recent;
    o.progress_label = progress_label;
    o.on_chunk = on_chunk;
    o.user = &tot;
    o.argmax_ref = argmax, o.argmax_cache = argmax ? argmax + cap : NULL, o.argmax_cap = cap;
    if ((s = kv_eval_compare(m, cache, tokens, n_tokens, &o, &out->cmp)) != KV_OK) goto done;
    /* int32 little-endian: the exact pass's argmaxes, then the cache's (scoring order) */
    if (predictions && (s = kv_write_file_atomic(predictions, argmax, 2 * cap * sizeof(int32_t))) != KV_OK) goto done;
    /* predictors and stored SQuat bases are held once per sequence's runtime: counted once per chunk */
    const uint64_t side_bytes = tot.predictor_bytes + tot.basis_bytes;
    out->bits_per_value =
        tot.values_compressed
            ? 8.0 * (double)(tot.payload_bytes + tot.index_bytes + side_bytes) / (double)tot.values_compressed
            : 0.0;
    /* per value of every appended token: without pruning every appended value is held, so this is the mean
     * over the values held; with pruning the evicted tokens count as 0 bits (the memory a budget promises) */
    out->bits_per_value_total =
        tot.values_appended
            ? 8.0 * (double)(tot.payload_bytes + tot.index_bytes + tot.fp_bytes + side_bytes * out->cmp.n_chunks) /
                  (double)tot.values_appended
            : 0.0;
    out->held_fraction = tot.values_appended ? (double)tot.values_total / (double)tot.values_appended : 0.0;
    out->predictor_bits_per_value_sequence =
        tot.last_appended ? 8.0 * (double)tot.predictor_bytes / (double)tot.last_appended : 0.0;
    out->basis_bits_per_value_sequence =
        tot.last_appended ? 8.0 * (double)tot.basis_bytes / (double)tot.last_appended : 0.0;
    out->cache_bytes = tot.last_bytes;
    out->cache_bytes_allocated = tot.last_allocated;
    out->fp16_cache_bytes = tot.last_appended * 2;
    out->compressed_fraction = tot.values_total ? (double)tot.values_compressed / (double)tot.values_total : 0.0;
    out->sinks = plan->global.sinks;
    out->recent = plan->global.recent;
    out->prefill = o.first_step;
    out->step = o.step;
    if (tot.values_compressed == 0 && o.first_step >= ctx && ctx > plan->global.sinks + plan->global.recent)
        /* the chunk is long enough: it went in as one step, and the runtime compresses at the start of a later
         * append (RUNTIME.md §2), of which there was none */
        kv_log(KV_LOG_WARN, "nothing was compressed: each chunk of %d tokens went in as one prompt step (--prefill %d), "
               "and the runtime compresses at the start of a later step, of which there was none (use a --prefill "
               "shorter than --ctx)", ctx, o.first_step);
    else if (tot.values_compressed == 0)
        kv_log(KV_LOG_WARN, "nothing was compressed: chunks of %d tokens never fill the %d sinks plus the %d-token "
               "recent buffer, so every token stayed in f16 (use a longer --ctx, or a plan with a smaller recent "
               "buffer)", ctx, plan->global.sinks, plan->global.recent);
done:
    kv_cache_free(cache);
    free(argmax);
    return s;
}
