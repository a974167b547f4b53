/* kvprof budget's measurements (kv_budget_measure): every operating point's cache on the same prompts of a
 * corpus, with the continuation protocol (KL, ppl, top-1 agreement, the cache's bytes after the last sample)
 * and, when asked, passkey retrieval; each prompt through the model once (the prefill cache, copied into every
 * point's cache). Then the best point of each budget (kv_budget_best). The plans and caches are made by the
 * caller (kv_budget_plans_make in calib/, which builds them as kvcal fit would); this file only measures. */
#include "kv_profile.h"
#include "kvrt.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Passkey accuracy of every cache: depths x trials prompts, trial t's key and filler offset from seed t. */
static kv_status measure_passkey(kv_budget_result *res, kv_model *m, const kv_tokenizer *tok, kv_cache *const *caches,
                                 int n, kv_cache *prefill, const int32_t *ids, size_t n_ids,
                                 const kv_budget_measure_options *o) {
    int *correct = calloc((size_t)n, sizeof *correct), total = 0;
    kv_passkey_answer *ans = calloc((size_t)n, sizeof *ans);
    if (!correct || !ans) {
        free(correct);
        free(ans);
        return KV_ERR(KV_ENOMEM, "out of memory");
    }
    kv_status s = KV_OK;
    kv_progress prog;
    kv_progress_begin(&prog, "passkey", "prompt", (double)(o->n_depths * o->trials));
    for (int di = 0; di < o->n_depths && s == KV_OK; di++)
        for (int t = 0; t < o->trials && s == KV_OK; t++) {
            int32_t *pk = NULL;
            int np = 0, key = 0;
            kv_passkey_options po = {o->passkey_len, o->depths[di], kv_rng_u64(o->seed, (uint64_t)t)};
            if ((s = kv_passkey_prompt(&pk, &np, &key, tok, ids, n_ids, &po)) != KV_OK) break;
            s = kv_eval_passkey(m, tok, caches, n, prefill, pk, np, key, 8, o->prefill_chunk, ans);
            free(pk);
            for (int i = 0; i < n && s == KV_OK; i++) correct[i] += ans[i].correct;
            total++;
            kv_progress_update(&prog, (double)total);
        }
    kv_progress_end(&prog);
    for (int i = 0; i < n && s == KV_OK; i++) res[i].passkey_accuracy = (double)correct[i] / total;
    free(correct);
    free(ans);
    return s;
}

kv_status kv_budget_measure(kv_budget_result *res, kv_cont_summary *sum, double *seconds_continuation, kv_model *m,
                            const kv_tokenizer *tok, kv_cache *const *caches, int n, kv_cache *prefill,
                            const int32_t *ids, size_t n_ids, const kv_budget_measure_options *o) {
    kv_cont_result *cres = calloc((size_t)n, sizeof *cres);
    if (!cres) return KV_ERR(KV_ENOMEM, "out of memory for %d operating points", n);
    for (int i = 0; i < n; i++) {
        memset(&res[i], 0, sizeof res[i]);
        res[i].passkey_accuracy = NAN;
    }
    kv_cont_options co;
    memset(&co, 0, sizeof co);
    co.prompt_len = o->prompt_len, co.score_len = o->score_len, co.bos_id = kv_tokenizer_bos(tok);
    co.max_samples = o->samples, co.prefill_chunk = o->prefill_chunk, co.step = o->step;
    co.prefill_cache = prefill;
    co.progress_label = "continuation";
    const double t0 = kv_now_seconds();
    kv_status s = kv_eval_continuation(m, caches, n, ids, n_ids, &co, sum, cres);
    *seconds_continuation = kv_now_seconds() - t0;
    for (int i = 0; i < n && s == KV_OK; i++) {
        res[i].kl_mean = cres[i].kl_mean, res[i].ppl = cres[i].ppl, res[i].top1_agreement = cres[i].top1_agreement;
        res[i].seconds = cres[i].seconds_prefill + cres[i].seconds_end_prompt + cres[i].seconds_continuation;
        kv_rt_stats st; /* after the last sample's continuation */
        if ((s = kv_rt_get_stats(kv_cache_rt_runtime(caches[i]), 0, &st)) != KV_OK) break;
        res[i].cache_fraction = st.values_appended ? (double)st.accounted_bytes / (2.0 * (double)st.values_appended) : 0;
    }
    free(cres);
    if (s == KV_OK && o->passkey_len > 0) s = measure_passkey(res, m, tok, caches, n, prefill, ids, n_ids, o);
    return s;
}

void kv_budget_best(int *best, const kv_budget_point *pts, const kv_budget_result *res, int n, const double *budgets,
                    int n_budgets) {
    for (int b = 0; b < n_budgets; b++) {
        best[b] = -1;
        for (int i = 0; i < n; i++)
            if (pts[i].budget == budgets[b] && kv_budget_better(&res[i], best[b] >= 0 ? &res[best[b]] : NULL))
                best[b] = i;
    }
}
