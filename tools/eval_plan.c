/* eval_plan.c — the printing half of `kvrun eval --plan`: the evaluation itself is the model library's
 * kv_eval_plan (model/eval_plan.c), which kvcal search's selection and validation call too. */
#include "kv_tools.h"

#include <stdio.h>

void kv_tool_eval_plan_print(const kv_plan_eval *e, int json) {
    const kv_compare_result *r = &e->cmp;
    const double rel = r->ppl_ref > 0 ? r->ppl / r->ppl_ref - 1.0 : 0.0;
    if (json) {
        printf("{\"ppl\": %.6f, \"ppl_uncompressed\": %.6f, \"ppl_relative_increase\": %.6f, \"nll_mean\": %.6f, "
               "\"kl_mean\": %.6g, \"top1_agreement\": %.6f, \"bits_per_value\": %.9f, \"bits_per_value_total\": %.9f, "
               "\"predictor_bits_per_value_per_sequence\": %.4f, \"squat_basis_bits_per_value_per_sequence\": %.4f, \"cache_bytes\": %llu, \"fp16_cache_bytes\": %llu, "
               "\"cache_bytes_allocated\": %llu, \"compressed_fraction\": %.4f, \"held_fraction\": %.6f, \"tokens_total\": %zu, \"tokens_evaluated\": %zu, \"tokens_scored\": %zu, "
               "\"chunks\": %zu, \"tokens_per_second\": %.2f, \"tokens_per_second_uncompressed\": %.2f, "
               "\"sinks\": %d, \"recent\": %d, \"prefill\": %d, \"step\": %d}\n",
               r->ppl, r->ppl_ref, rel, r->nll_mean, r->kl_mean, r->top1_agreement, e->bits_per_value,
               e->bits_per_value_total, e->predictor_bits_per_value_sequence, e->basis_bits_per_value_sequence, (unsigned long long)e->cache_bytes,
               (unsigned long long)e->fp16_cache_bytes, (unsigned long long)e->cache_bytes_allocated,
               e->compressed_fraction, e->held_fraction, r->tokens_total, r->tokens_evaluated,
               r->tokens_scored, r->n_chunks, r->tokens_per_second, r->tokens_per_second_ref, e->sinks, e->recent,
               e->prefill, e->step);
        return;
    }
    printf("ppl                    %.4f  (uncompressed %.4f, %+.2f%%)\n", r->ppl, r->ppl_ref, 100.0 * rel);
    printf("kl_mean                %.5g nats\n", r->kl_mean);
    printf("top1_agreement         %.4f\n", r->top1_agreement);
    printf("bits_per_value         %.3f  (compressed tokens; predictors, bases amortized over all evaluated tokens)\n",
           e->bits_per_value);
    printf("bits_per_value_total   %.3f  (everything held: sinks %d and recent %d tokens at 16 bits, predictors per "
           "sequence, SQuat bases per sequence)\n", e->bits_per_value_total, e->sinks, e->recent);
    printf("predictor bits/value   %.3f  (per %zu-token sequence)\n", e->predictor_bits_per_value_sequence,
           r->n_chunks ? r->tokens_evaluated / r->n_chunks : (size_t)0);
    if (e->basis_bits_per_value_sequence > 0.0)
        printf("SQuat basis bits/value %.3f  (per %zu-token sequence)\n", e->basis_bits_per_value_sequence,
               r->n_chunks ? r->tokens_evaluated / r->n_chunks : (size_t)0);
    printf("cache_bytes            %llu per sequence (fp16: %llu; allocated by the runtime: %llu)\n",
           (unsigned long long)e->cache_bytes, (unsigned long long)e->fp16_cache_bytes,
           (unsigned long long)e->cache_bytes_allocated);
    if (e->held_fraction < 1.0)
        printf("held_fraction          %.4f  (token pruning, layers' attention windows: the values still held at the end "
               "of a chunk; evicted ones and those that left a window count 0 bits above)\n", e->held_fraction);
    if (e->compressed_fraction == 0.0) {
        const size_t chunk = r->n_chunks ? r->tokens_evaluated / r->n_chunks : 0;
        if ((size_t)e->prefill >= chunk && chunk > (size_t)(e->sinks + e->recent))
            printf("note                   nothing was compressed: each chunk went in as one prompt step (--prefill)\n");
        else
            printf("note                   nothing was compressed: every chunk fit in the sinks and the recent buffer\n");
    }
    printf("tokens                 %zu evaluated in %zu chunks, %zu scored\n", r->tokens_evaluated, r->n_chunks,
           r->tokens_scored);
    printf("tokens_per_second      %.1f compressed (steps: %d, then %d), %.1f uncompressed\n", r->tokens_per_second,
           e->prefill, e->step, r->tokens_per_second_ref);
}
