/* kv_bench.h — what a KV cache costs in decoding speed on a real model: measured end to end (kv_bench_run,
 * model/bench.c: what `kvrun bench` reports) and predicted from a per-layer cost model (kv_decode_cost_*,
 * model/decode_cost.c: what `kvcal search --min-decode-speed` plans with; calib/SEARCH.md §7 states its
 * error against kv_bench_run). */
#ifndef KV_BENCH_H
#define KV_BENCH_H

#include "kv_model.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- end to end (bench.c) -------------------------------------------------------------------------
 * B sequences each get a prompt of `context` tokens (a slice of ids at offset b * 7919 mod room, or seeded random
 * tokens when ids is NULL) through a prefill in chunks of prefill_chunk tokens (0: the whole prompt at once), then
 * kv_cache_end_prompt (timed apart: a pruning plan's selection and compression), then `decode` single-token steps
 * run all B sequences in one forward call (greedy: each step feeds the argmax of the previous logits). Timings are
 * the wall time of the forward calls. The cache holds at least context + decode tokens per sequence. */
typedef struct kv_bench_options {
    int context, decode, batch, prefill_chunk;
    const int32_t *ids; /* NULL: seeded random prompts */
    size_t n_ids;       /* at least context when ids is given */
    uint64_t seed;
} kv_bench_options;

typedef struct kv_bench_result {
    double prefill_s, decode_s, end_prompt_s;
    double prefill_tokens_per_second, decode_tokens_per_second;
} kv_bench_result;

kv_status kv_bench_run(kv_bench_result *out, kv_model *m, kv_cache *cache, const kv_bench_options *opt);

/* ---- the cost model (decode_cost.c) ---------------------------------------------------------------
 * A decoding step of one sequence costs the weights' part (every matrix product, norms, the logits: the same for
 * every cache) plus, per layer, the cache's part: appending the new token and attending one query over what the
 * cache holds at that context, plus the compression the cache does as tokens leave its f16 window (a block every
 * `recent` tokens: its cost per token). kv_decode_cost_measure measures the cache's part of a plan by the runtime
 * itself: a runtime for the plan (NULL: this engine's f16 cache) is fed ctx tokens of synthetic K/V in the steps
 * `kvrun eval` uses (the time of that feed per token and layer is the compression's), then `steps` decoding steps
 * of one token and one query per layer are timed per layer (the median of the steps). Codec speed does not depend
 * on the values (fixed layouts, dense scores), so synthetic data give the cost of any text; pruning plans select
 * from the synthetic prompt's attention like any other. */
typedef struct kv_decode_cost {
    int n_layers, ctx, steps;
    double *step;     /* [layer]: seconds of one step's append + attention at ctx (median over the steps) */
    double *compress; /* [layer]: seconds per token of the feed (compression amortized over the tokens) */
    double seconds;   /* sum over layers of step + compress: the cache's part of one decoding step */
} kv_decode_cost;

/* Feed ctx tokens of synthetic K/V (a fixed pseudo-random pattern in [-1, 1)) into sequence 0 of a runtime cache in
 * `kvrun eval`'s steps: the plan's sinks and window first, then a window at a time (plan NULL, the f16 cache: 512 at
 * a time), kv_cache_end_prompt after the first. seconds (NULL, or [layer]) += the wall time of each layer's appends.
 * Also what calib/'s honest bytes (kv_search_stream_bytes) are counted on. */
kv_status kv_cache_feed_synthetic(kv_cache *cache, const kv_plan *plan, int ctx, double *seconds);
kv_status kv_decode_cost_measure(kv_decode_cost *out, const kv_plan *plan, kv_model *m, int ctx, int steps);
void kv_decode_cost_free(kv_decode_cost *c);
/* The weights' part of a decoding step: the median over `steps` forward calls of one token without a cache (each
 * attends to itself only), after one call not timed (warm caches and pools). */
kv_status kv_decode_weights_seconds(double *out, kv_model *m, int steps);
/* The predicted decoding speed of a cache against another at the same context: (weights + ref) / (weights + cache),
 * each the seconds of the cache's part of a step. */
double kv_decode_speed_ratio(double weights, double cache_seconds, double ref_seconds);

#ifdef __cplusplus
}
#endif
#endif
