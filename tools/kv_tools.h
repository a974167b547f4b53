/* kv_tools.h — the subcommands of kvcal, kvprof and kvrun (each in <tool>_<sub>.c). Internal. */
#ifndef KV_TOOLS_H
#define KV_TOOLS_H

#include "kv_cli.h"
#include "kv_model.h"

/* Shared steps (tool_support.c). */
/* Read a text file and tokenize it whole (no BOS; the SentencePiece dummy prefix once at the
 * start); its SHA-256 into sha256 (may be NULL). *ids is malloc'd. = kv_tool_tokenize_file_max(.., 0). */
kv_status kv_tool_tokenize_file(int32_t **ids, size_t *n, char sha256[65], const kv_tokenizer *t, const char *path);
/* The same, read and tokenized incrementally (1 MiB at a time, cut between words where every
 * tokenizer here gives the same tokens as for the whole text) and stopped once max_tokens tokens
 * (0 = no limit) are collected: *n <= max_tokens, and the tokens are the first ones of the whole
 * text. The file must be a regular file or a pipe (a device never ends: KV_EINVAL). sha256: of the
 * whole file for a regular file (read on without tokenizing), of the bytes read for a pipe. */
kv_status kv_tool_tokenize_file_max(int32_t **ids, size_t *n, char sha256[65], const kv_tokenizer *t,
                                    const char *path, size_t max_tokens);
/* The same reading `block` bytes at a time (tests use small blocks to cut the text many times). */
kv_status kv_tool_tokenize_file_ex(int32_t **ids, size_t *n, char sha256[65], const kv_tokenizer *t, const char *path,
                                   size_t max_tokens, size_t block);
/* Open a model file, load the model (n_threads 0 = default) and, when tok is not NULL, its
 * tokenizer (tok_path NULL = the model's own), refused (KV_EMISMATCH) when its vocabulary does not
 * fit the model (kv_tool_check_vocab). */
kv_status kv_tool_open_model(kv_model **model, kv_tokenizer **tok, const char *model_path, const char *tok_path,
                             int n_threads);
/* The same with every model option (weight storage, threads). */
kv_status kv_tool_open_model_opt(kv_model **model, kv_tokenizer **tok, const char *model_path, const char *tok_path,
                                 const kv_model_options *opt);
/* A tokenizer fits a model when its ids all index the embedding and it covers all but padding rows:
 * n_model - max(1024, n_model / 16) <= n_tokenizer <= n_model. Else KV_EMISMATCH naming both sizes. */
kv_status kv_tool_check_vocab(const kv_model *m, const kv_tokenizer *tok, const char *tok_path);
/* The KV cache a run uses: with plan_path, the runtime applying that plan (read, checked against the
 * model file's fingerprint; *plan_out keeps it alive: free it after the cache); otherwise
 * cache_kind "f16" is the runtime's f16 cache, "f32" (or NULL) the plain exact cache. capacity:
 * tokens per sequence (0 = grow); rt_flags: KV_CACHE_RT_* for a plan's runtime. */
kv_status kv_tool_make_cache(kv_cache **out, kv_plan **plan_out, kv_model *m, const char *model_path,
                             const char *plan_path, const char *cache_kind, int n_seqs, int capacity, unsigned rt_flags);
/* Parse a --weights value ("f32", "f16", "native"); -1 when it is none of them. */
int kv_tool_weight_storage(const char *name);
/* --device and --weights into model options: device "cpu" or "cuda" (RUNTIME.md §10.6; NULL = cpu), weights as
 * kv_tool_weight_storage (NULL = dflt on the CPU, f16 on the GPU). KV_EXIT_OK, or a usage error. */
int kv_tool_model_device(const char *tool, const char *device, const char *weights, kv_weight_storage dflt,
                         kv_model_options *mo);

/* Checks made before any work (exit codes: KV_EXIT_OK, or KV_EXIT_USAGE after a usage error naming
 * the problem). */
/* -t/--threads (0: $KVCAL_THREADS, else the online CPUs) under common's one rule (kv_threads_resolve:
 * 1..4 per online CPU, at most 1024; a bad $KVCAL_THREADS is an error too); *n receives the count and
 * OpenMP's default follows it. */
int kv_tool_threads(const char *tool, long requested, int *n);
/* A path with the option that named it, for messages ("--out"). */
typedef struct kv_tool_path {
    const char *what;
    const char *path; /* NULL: not given */
} kv_tool_path;
/* Every output location is usable (kv_output_check: not empty, not a directory, its directory exists
 * and is writable; devices and pipes are written in place), no output is the same file as an input
 * (device and inode; for an input directory, the files directly in it) or as another output. */
int kv_tool_check_io(const char *tool, const kv_tool_path *inputs, int n_in, const kv_tool_path *outputs, int n_out);
/* A directory output written whole (a temporary directory renamed to it at the end): a usage error
 * (exit 2, message naming `what`) for an empty path, a path that exists and is not an empty
 * directory, a missing or unwritable parent directory, and for the same directory as an input (device
 * and inode, so a symlink counts) or one inside an input directory. */
int kv_tool_check_out_dir(const char *tool, const char *what, const char *path, const kv_tool_path *inputs, int n_in);
/* KV_ENOMEM, naming `what` and the estimate, when `bytes` (an estimate made before allocating)
 * exceeds the machine's physical memory; else KV_OK. */
kv_status kv_tool_check_memory(double bytes, const char *what);
/* Warn (kv_log) when a context of n tokens (`what`: "--ctx", "data.seq_len", ...) is longer than the
 * model was trained for (kv_arch.max_seq_len; models with RoPE scaling state the scaled length). */
void kv_tool_warn_context(const kv_arch *a, long n, const char *what);
/* s as a JSON string, quoted, every control character escaped (a newline in a path is "\n", not
 * dropped). */
void kv_tool_json_string(FILE *fp, const char *s);
/* one when n == 1, else many ("1 token", "2 tokens"). */
const char *kv_tool_plural(long n, const char *one, const char *many);

/* `kvrun eval --plan`'s report of kv_eval_plan (model library) on stdout, as text or one JSON line (eval_plan.c). */
void kv_tool_eval_plan_print(const kv_plan_eval *e, int json);

/* `kvrun eval --protocol continuation` and `--task passkey` (eval_long.c; DESIGN.md §9). */
typedef struct kv_tool_cont_eval {
    kv_cont_summary sum;
    kv_cont_result res;           /* through the plan's cache (has_plan) */
    int has_plan;
    int prompt_len, score_len, step, prefill_chunk;
    double cache_fraction;        /* bytes held right after each prompt / its f16 cache, averaged over samples */
    double end_fraction;          /* the same after each sample's scored tokens */
    double bits_per_value;        /* of the compressed values then (codes, scales, zero points, norms, positions) */
    uint64_t cache_bytes, fp16_bytes; /* per sample, averaged */
    const char *prune_method;
    double prune_budget;
} kv_tool_cont_eval;
/* plan_path NULL: the exact model alone. step <= 0: the plan's recent window (one chunk per step). */
kv_status kv_tool_eval_continuation(kv_tool_cont_eval *out, kv_model *m, const char *model_path, const char *plan_path,
                                    const int32_t *tokens, size_t n_tokens, int bos, int prompt_len, int score_len,
                                    int step, int prefill_chunk, size_t max_samples, const char *progress_label);
void kv_tool_eval_continuation_print(const kv_tool_cont_eval *e, int json);

typedef struct kv_tool_passkey_trial {
    int length, trial, key, answer, correct;
    double depth, cache_fraction; /* cache bytes after the answer / f16 bytes of the same tokens */
    double seconds_prefill, seconds_end_prompt;
    char text[96];
} kv_tool_passkey_trial;
typedef struct kv_tool_passkey_eval {
    double accuracy;
    int correct, n_trials, has_plan;
    kv_tool_passkey_trial *trials; /* lengths x depths x trials, in that order (owned) */
    const char *prune_method;
    double prune_budget;
} kv_tool_passkey_eval;
/* Trial t uses the key and filler offset of seed kv_rng_u64(seed, t) at every length and depth. */
kv_status kv_tool_eval_passkey(kv_tool_passkey_eval *out, kv_model *m, const kv_tokenizer *tok, const char *model_path,
                               const char *plan_path, const int32_t *filler, size_t n_filler, const int *lengths,
                               int n_lengths, const double *depths, int n_depths, int trials, uint64_t seed,
                               int prefill_chunk, int max_new, const char *progress_label);
void kv_tool_eval_passkey_print(const kv_tool_passkey_eval *e, int json);
void kv_tool_passkey_eval_free(kv_tool_passkey_eval *e);
/* "0.1,0.5,0.9" into out (at most max values). */
kv_status kv_tool_parse_list(double *out, int max, int *n, const char *text, const char *what);

/* kvrun */
int kvrun_eval(int argc, char **argv);     /* kvrun_eval.c: perplexity; with --plan, the plan's cost */
int kvrun_generate(int argc, char **argv); /* kvrun_generate.c: text generation through the KV cache */
int kvrun_info(int argc, char **argv);     /* kvrun_info.c: describe a model file */
int kvrun_inspect(int argc, char **argv);  /* kvrun_inspect.c: print a plan (YAML/JSON); --check it against a model */
int kvrun_bench(int argc, char **argv);    /* kvrun_bench.c: prefill and decode speed, bytes held, with a plan or cache */
int kvrun_selfcheck(int argc, char **argv); /* kvrun_selfcheck.c: the runtime's CPU-vs-device self-check */

/* kvcal */
int kvcal_grids(int argc, char **argv);    /* kvcal_grids.c: generate a HIGGS grid file */
int kvcal_export(int argc, char **argv);   /* kvcal_export.c: scales for vLLM / SGLang / TensorRT-LLM */
/* Where generated HIGGS grids are kept between runs (kvcal fit, kvcal search): $KVCAL_GRID_CACHE ("" = none),
 * else $XDG_CACHE_HOME/kvcal/grids, else $HOME/.cache/kvcal/grids. Malloc'd or NULL (kvcal_fit.c). */
char *kv_tool_grid_cache_dir(void);
int kvcal_search(int argc, char **argv);   /* kvcal_search.c: per-stream method choice under a bit budget */
int kvcal_fit(int argc, char **argv);      /* kvcal_fit.c: calibrate a plan (AQUA-KV and baselines) */

/* kvprof */
int kvprof_budget(int argc, char **argv);     /* kvprof_budget.c: quantized pruning operating points under a budget */
int kvprof_importance(int argc, char **argv); /* kvprof_importance.c: KVmix layer importance and bit allocation */

#endif
