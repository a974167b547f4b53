/* kv_tools.h — the subcommands of kvcal, kvprof and kvrun (each in <tool>_<sub>.c). Internal. */
#ifndef KV_TOOLS_H
#define KV_TOOLS_H

#include "kv_cli.h"
#include "kv_model.h"

/* Shared steps (tool_support.c). */
/* Read a text file and tokenize it whole (no BOS; the SentencePiece dummy prefix once at the
 * start); its SHA-256 into sha256 (may be NULL). *ids is malloc'd. */
kv_status kv_tool_tokenize_file(int32_t **ids, size_t *n, char sha256[65], const kv_tokenizer *t, const char *path);
/* Open a model file, load the model (n_threads 0 = default) and, when tok is not NULL, its
 * tokenizer (tok_path NULL = the model's own). */
kv_status kv_tool_open_model(kv_model **model, kv_tokenizer **tok, const char *model_path, const char *tok_path,
                             int n_threads);
/* The same with every model option (weight storage, threads). */
kv_status kv_tool_open_model_opt(kv_model **model, kv_tokenizer **tok, const char *model_path, const char *tok_path,
                                 const kv_model_options *opt);
/* The KV cache a run uses: with plan_path, the runtime applying that plan (read, checked against the
 * model file's fingerprint; *plan_out keeps it alive: free it after the cache); otherwise
 * cache_kind "f16" is the runtime's f16 cache, "f32" (or NULL) the plain exact cache. capacity:
 * tokens per sequence (0 = grow); rt_flags: KV_CACHE_RT_* for a plan's runtime. */
kv_status kv_tool_make_cache(kv_cache **out, kv_plan **plan_out, kv_model *m, const char *model_path,
                             const char *plan_path, const char *cache_kind, int n_seqs, int capacity, unsigned rt_flags);
/* Parse a --weights value ("f32", "f16", "native"); -1 when it is none of them. */
int kv_tool_weight_storage(const char *name);

/* `kvrun eval --plan` (eval_plan.c): the plan's cost on tokenized text (protocol "all", chunks of ctx). */
typedef struct kv_tool_plan_eval {
    kv_compare_result cmp;
    double bits_per_value;        /* compressed tokens: payload + predictors amortized over all evaluated tokens */
    double bits_per_value_total;  /* everything held: + full-precision tokens at 16 bits, predictors per sequence */
    double predictor_bits_per_value_sequence; /* predictors amortized over one ctx-token sequence */
    double compressed_fraction;   /* compressed values / all values */
    uint64_t cache_bytes;         /* one full sequence: payload + fp16 tokens + predictors */
    uint64_t fp16_cache_bytes;    /* the same sequence uncompressed in fp16 */
    uint64_t cache_bytes_allocated; /* what the runtime allocated for that sequence's cache (RUNTIME.md §5) */
    int sinks, recent;
    int prefill, step;            /* tokens of the first forward step of a chunk, then of each later one */
} kv_tool_plan_eval;
/* prefill/step <= 0: sinks + recent, then recent (equivalent to token-by-token decoding for the
 * fixed-buffer semantics). */
kv_status kv_tool_eval_plan(kv_tool_plan_eval *out, kv_model *m, const char *model_path, const char *plan_path,
                            const int32_t *tokens, size_t n_tokens, int ctx, int bos, size_t max_chunks,
                            int prefill, int step, const char *progress_label);
void kv_tool_eval_plan_print(const kv_tool_plan_eval *e, int json);

/* kvrun */
int kvrun_eval(int argc, char **argv);     /* kvrun_eval.c: perplexity; with --plan, the plan's cost */
int kvrun_generate(int argc, char **argv); /* kvrun_generate.c: text generation through the KV cache */
int kvrun_info(int argc, char **argv);     /* kvrun_info.c: describe a model file */
int kvrun_inspect(int argc, char **argv);  /* kvrun_inspect.c: print a plan (YAML/JSON); --check it against a model */
int kvrun_bench(int argc, char **argv);    /* kvrun_bench.c: prefill and decode speed, bytes held, with a plan or cache */

/* kvcal */
int kvcal_grids(int argc, char **argv);    /* kvcal_grids.c: generate a HIGGS grid file */
int kvcal_fit(int argc, char **argv);      /* kvcal_fit.c: calibrate a plan (AQUA-KV and baselines) */

/* kvprof */
int kvprof_importance(int argc, char **argv); /* kvprof_importance.c: KVmix layer importance and bit allocation */

#endif
