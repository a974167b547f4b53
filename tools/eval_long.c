/* eval_long.c — kvrun eval's long-context protocols (DESIGN.md §9): continuation scoring after a
 * compressed prompt and passkey retrieval, for the exact model or any plan (model/eval_compare.c,
 * model/eval_passkey.c). What a plan holds after a prompt is reported beside the quality: the cache's
 * bytes against the f16 cache of the same tokens (the budget a pruning plan promises). */
#include "kv_tools.h"
#include "kvrt.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Memory after each prompt and after each sample's scored tokens (runtime caches): summed over samples.
 * A plan that prunes nothing compresses a chunk when the next tokens arrive (RUNTIME.md §2), so right
 * after its prompt it may still hold the last chunks in f16: the end of the sample shows its steady state. */
typedef struct prompt_mem {
    kv_rt *rt;
    double fraction, bits, end_fraction;
    uint64_t accounted, appended_f16;
    int n, n_end;
} prompt_mem;

static double held_fraction(const kv_rt_stats *st) {
    return st->values_appended ? (double)st->accounted_bytes / (2.0 * (double)st->values_appended) : 0.0;
}

static kv_status on_prompt(void *user, kv_cache *cache, size_t sample) {
    (void)cache, (void)sample;
    prompt_mem *pm = user;
    if (!pm->rt) return KV_OK;
    kv_rt_stats st;
    kv_status s = kv_rt_get_stats(pm->rt, 0, &st);
    if (s != KV_OK) return s;
    pm->accounted += st.accounted_bytes;
    pm->appended_f16 += 2 * st.values_appended;
    pm->fraction += held_fraction(&st);
    pm->bits += st.bits_per_value;
    pm->n++;
    return KV_OK;
}

static kv_status on_sample_end(void *user, kv_cache *cache, size_t sample) {
    (void)cache, (void)sample;
    prompt_mem *pm = user;
    if (!pm->rt) return KV_OK;
    kv_rt_stats st;
    kv_status s = kv_rt_get_stats(pm->rt, 0, &st);
    if (s != KV_OK) return s;
    pm->end_fraction += held_fraction(&st);
    pm->n_end++;
    return KV_OK;
}

kv_status kv_tool_eval_continuation(kv_tool_cont_eval *out, kv_model *m, const char *model_path, const char *plan_path,
                                    const int32_t *tokens, size_t n_tokens, int bos, int prompt_len, int score_len,
                                    int step, int prefill_chunk, size_t max_samples, const char *progress_label) {
    memset(out, 0, sizeof *out);
    kv_cache *cache = NULL;
    kv_plan *plan = NULL;
    kv_status s = KV_OK;
    if (plan_path && (s = kv_tool_make_cache(&cache, &plan, m, model_path, plan_path, NULL, 1, prompt_len + score_len, 0)) !=
                         KV_OK)
        return s;
    prompt_mem pm;
    memset(&pm, 0, sizeof pm);
    pm.rt = cache ? kv_cache_rt_runtime(cache) : NULL;
    kv_cont_options o;
    memset(&o, 0, sizeof o);
    o.prompt_len = prompt_len, o.score_len = score_len, o.bos_id = bos, o.max_samples = max_samples;
    o.prefill_chunk = prefill_chunk;
    o.step = step > 0 ? step : (plan ? plan->global.recent : score_len);
    o.progress_label = progress_label;
    o.on_prompt = on_prompt;
    o.on_sample_end = on_sample_end;
    o.user = &pm;
    s = kv_eval_continuation(m, cache ? &cache : NULL, cache ? 1 : 0, tokens, n_tokens, &o, &out->sum, &out->res);
    if (s == KV_OK) {
        out->has_plan = cache != NULL;
        out->step = o.step;
        out->prefill_chunk = prefill_chunk;
        out->prompt_len = prompt_len, out->score_len = score_len;
        if (pm.n) {
            out->cache_fraction = pm.fraction / pm.n;
            out->bits_per_value = pm.bits / pm.n;
            out->cache_bytes = pm.accounted / (uint64_t)pm.n;
            out->fp16_bytes = pm.appended_f16 / (uint64_t)pm.n;
        }
        if (pm.n_end) out->end_fraction = pm.end_fraction / pm.n_end;
        if (plan) {
            out->prune_method = kv_plan_prune_name(plan->global.prune_method);
            out->prune_budget = plan->global.prune_budget;
        }
    }
    kv_cache_free(cache);
    kv_plan_free(plan);
    return s;
}

void kv_tool_eval_continuation_print(const kv_tool_cont_eval *e, int json) {
    const kv_cont_summary *u = &e->sum;
    const kv_cont_result *r = &e->res;
    const double n = u->n_samples ? (double)u->n_samples : 1.0;
    if (json) {
        printf("{\"protocol\": \"continuation\", \"prompt_len\": %d, \"score_len\": %d, \"samples\": %zu, "
               "\"tokens_scored\": %zu, \"ppl_uncompressed\": %.6f",
               e->prompt_len, e->score_len, u->n_samples, u->tokens_scored, u->ppl_ref);
        if (e->has_plan)
            printf(", \"ppl\": %.6f, \"kl_mean\": %.6g, \"top1_agreement\": %.6f, \"cache_fraction\": %.6f, "
                   "\"cache_fraction_end\": %.6f, \"cache_bytes\": %llu, \"fp16_bytes\": %llu, \"bits_per_value\": %.4f, \"prune_method\": \"%s\", "
                   "\"prune_budget\": %.6g, \"step\": %d, \"prefill_chunk\": %d, \"prefill_seconds\": %.4f, "
                   "\"end_prompt_seconds\": %.4f, \"continuation_seconds\": %.4f",
                   r->ppl, r->kl_mean, r->top1_agreement, e->cache_fraction, e->end_fraction, (unsigned long long)e->cache_bytes,
                   (unsigned long long)e->fp16_bytes, e->bits_per_value, e->prune_method ? e->prune_method : "none",
                   e->prune_budget, e->step, e->prefill_chunk, r->seconds_prefill / n, r->seconds_end_prompt / n,
                   r->seconds_continuation / n);
        printf(", \"reference_seconds\": %.4f}\n", u->seconds_ref / n);
        return;
    }
    printf("continuation           %zu %s: a %d-token prompt (BOS included), then %d tokens scored\n", u->n_samples,
           kv_tool_plural((long)u->n_samples, "sample", "samples"), e->prompt_len, e->score_len);
    if (!e->has_plan) {
        printf("ppl                    %.4f (the exact model, %zu predictions)\n", u->ppl_ref, u->tokens_scored);
        return;
    }
    const double rel = u->ppl_ref > 0 ? r->ppl / u->ppl_ref - 1.0 : 0.0;
    printf("ppl                    %.4f  (uncompressed %.4f, %+.2f%%)\n", r->ppl, u->ppl_ref, 100.0 * rel);
    printf("kl_mean                %.5g nats\n", r->kl_mean);
    printf("top1_agreement         %.4f\n", r->top1_agreement);
    printf("cache after the prompt %.4f of the f16 cache (%llu of %llu bytes; pruning %s, budget %g), %.3f bits per "
           "compressed value\n", e->cache_fraction, (unsigned long long)e->cache_bytes, (unsigned long long)e->fp16_bytes,
           e->prune_method ? e->prune_method : "none", e->prune_budget, e->bits_per_value);
    printf("cache after the sample %.4f of the f16 cache (prompt and scored tokens)\n", e->end_fraction);
    printf("seconds per sample     prefill %.3f, end of prompt (selection + compression) %.3f, continuation %.3f "
           "(steps of %d), exact reference %.3f\n", r->seconds_prefill / n, r->seconds_end_prompt / n,
           r->seconds_continuation / n, e->step, u->seconds_ref / n);
}

/* ---- passkey ---------------------------------------------------------------------------------------- */
kv_status kv_tool_parse_list(double *out, int max, int *n, const char *text, const char *what) {
    *n = 0;
    const char *p = text;
    while (*p) {
        char *end = NULL;
        const double v = strtod(p, &end);
        if (end == p || !isfinite(v) || (*end && *end != ','))
            return KV_ERR(KV_EINVAL, "%s: '%s' is not a comma-separated list of numbers", what, text);
        if (*n == max) return KV_ERR(KV_EINVAL, "%s: more than %d values", what, max);
        out[(*n)++] = v;
        p = *end ? end + 1 : end;
    }
    if (*n == 0) return KV_ERR(KV_EINVAL, "%s: no values", what);
    return KV_OK;
}

kv_status kv_tool_eval_passkey(kv_tool_passkey_eval *out, kv_model *m, const kv_tokenizer *tok, const char *model_path,
                               const char *plan_path, const int32_t *filler, size_t n_filler, const int *lengths,
                               int n_lengths, const double *depths, int n_depths, int trials, uint64_t seed,
                               int prefill_chunk, int max_new, const char *progress_label) {
    memset(out, 0, sizeof *out);
    int max_len = 0;
    for (int i = 0; i < n_lengths; i++) max_len = lengths[i] > max_len ? lengths[i] : max_len;
    kv_cache *cache = NULL;
    kv_plan *plan = NULL;
    kv_status s = kv_tool_make_cache(&cache, &plan, m, model_path, plan_path, NULL, 1, max_len + max_new, 0);
    if (s != KV_OK) return s;
    kv_rt *rt = kv_cache_rt_runtime(cache);
    const int total = n_lengths * n_depths * trials;
    out->trials = calloc((size_t)total, sizeof *out->trials);
    if (!out->trials) {
        s = KV_ERR(KV_ENOMEM, "out of memory");
        goto done;
    }
    kv_progress prog;
    if (progress_label) kv_progress_begin(&prog, progress_label, "prompt", (double)total);
    for (int li = 0; li < n_lengths; li++)
        for (int di = 0; di < n_depths; di++)
            for (int t = 0; t < trials; t++) {
                kv_tool_passkey_trial *tr = &out->trials[out->n_trials];
                int32_t *ids = NULL;
                int n = 0, key = 0;
                /* the same key and filler for every depth of a (length, trial) */
                kv_passkey_options po = {lengths[li], depths[di], kv_rng_u64(seed, (uint64_t)t)};
                if ((s = kv_passkey_prompt(&ids, &n, &key, tok, filler, n_filler, &po)) != KV_OK) goto done;
                kv_passkey_answer ans;
                s = kv_eval_passkey(m, tok, &cache, 1, NULL, ids, n, key, max_new, prefill_chunk, &ans);
                free(ids);
                if (s != KV_OK) goto done;
                tr->length = lengths[li], tr->depth = depths[di], tr->trial = t, tr->key = key;
                tr->answer = ans.answer, tr->correct = ans.correct;
                snprintf(tr->text, sizeof tr->text, "%s", ans.text);
                tr->seconds_prefill = ans.seconds_prefill, tr->seconds_end_prompt = ans.seconds_end_prompt;
                if (rt) {
                    kv_rt_stats st;
                    if ((s = kv_rt_get_stats(rt, 0, &st)) != KV_OK) goto done;
                    tr->cache_fraction =
                        st.values_appended ? (double)st.accounted_bytes / (2.0 * (double)st.values_appended) : 1.0;
                }
                out->correct += ans.correct;
                out->n_trials++;
                if (progress_label) kv_progress_update(&prog, (double)out->n_trials);
            }
    if (progress_label) kv_progress_end(&prog);
    out->accuracy = out->n_trials ? (double)out->correct / out->n_trials : 0.0;
    out->has_plan = plan != NULL;
    if (plan) {
        out->prune_method = kv_plan_prune_name(plan->global.prune_method);
        out->prune_budget = plan->global.prune_budget;
    }
done:
    kv_cache_free(cache);
    kv_plan_free(plan);
    return s;
}

void kv_tool_eval_passkey_print(const kv_tool_passkey_eval *e, int json) {
    if (json) {
        printf("{\"task\": \"passkey\", \"accuracy\": %.6f, \"correct\": %d, \"prompts\": %d, \"cache\": \"%s\"", e->accuracy,
               e->correct, e->n_trials, e->has_plan ? "plan" : "exact");
        if (e->has_plan) printf(", \"prune_method\": \"%s\", \"prune_budget\": %.6g", e->prune_method, e->prune_budget);
        printf(", \"trials\": [");
        for (int i = 0; i < e->n_trials; i++) {
            const kv_tool_passkey_trial *t = &e->trials[i];
            printf("%s{\"length\": %d, \"depth\": %.4g, \"trial\": %d, \"key\": %d, \"answer\": %d, \"correct\": %d, "
                   "\"cache_fraction\": %.5f, \"prefill_seconds\": %.3f, \"end_prompt_seconds\": %.4f, \"text\": ",
                   i ? ", " : "", t->length, t->depth, t->trial, t->key, t->answer, t->correct, t->cache_fraction,
                   t->seconds_prefill, t->seconds_end_prompt);
            kv_tool_json_string(stdout, t->text);
            printf("}");
        }
        printf("]}\n");
        return;
    }
    printf("passkey accuracy       %.4f (%d of %d prompts; %s)\n", e->accuracy, e->correct, e->n_trials,
           e->has_plan ? "through the plan's cache" : "the exact model");
    printf("%8s %7s %6s %7s %7s %9s  %s\n", "length", "depth", "trial", "key", "answer", "cache", "text");
    for (int i = 0; i < e->n_trials; i++) {
        const kv_tool_passkey_trial *t = &e->trials[i];
        char txt[64];
        size_t k = 0;
        for (const char *p = t->text; *p && k + 1 < sizeof txt; p++) txt[k++] = (*p == '\n' || *p == '\r') ? ' ' : *p;
        txt[k] = 0;
        printf("%8d %7.3g %6d %7d %7d %9.4f  %s%s\n", t->length, t->depth, t->trial, t->key, t->answer,
               e->has_plan ? t->cache_fraction : 1.0, txt, t->correct ? "" : "   (wrong)");
    }
}

void kv_tool_passkey_eval_free(kv_tool_passkey_eval *e) {
    if (!e) return;
    free(e->trials);
    e->trials = NULL;
}
