/* kvrun bench: what a KV cache costs in speed and memory on a real model. B sequences each get a
 * prompt of N tokens (a corpus slice, or seeded random tokens) through a prefill in chunks, then K
 * single-token decoding steps run all B sequences in one forward call (kv_bench_run, model/bench.c).
 * Reports prefill and decode tokens per second, the bytes the cache holds (from the runtime's own
 * allocations; the plain cache's arrays otherwise), bits per value and the process's peak RSS; with
 * --predict the cost model's decode speed beside them (model/decode_cost.c). Timings are wall time of
 * the forward calls. Thin: the options, the memory estimate, one library call, the report. */
#define _POSIX_C_SOURCE 200809L
#include "kv_bench.h"
#include "kv_tools.h"
#include "kvrt.h"

#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

static const char *k_tool = "kvrun bench";

typedef struct bench_args {
    const char *model, *tokp, *text, *plan_path, *cache_kind, *weights, *device;
    long context, decode, batch, threads, seed, prefill_chunk;
    int json, keep, predict;
    kv_model_options mo;
} bench_args;

typedef struct bench_report {
    kv_bench_result run;
    uint64_t cache_bytes, cache_bytes_accounted, working_bytes;
    double bits_per_value, bits_per_value_total;
    long peak_rss_kb;
    double pred_tps, pred_ratio; /* --predict: the cost model's, one sequence */
} bench_report;

/* KV_EXIT_OK, or the exit code of --help (-1 from kv_cli_parse) or of a usage error. */
static int parse_args(bench_args *a, int argc, char **argv) {
    memset(a, 0, sizeof *a);
    a->cache_kind = "f16", a->decode = 32, a->batch = 1, a->seed = 1, a->prefill_chunk = 512;
    const kv_opt opts[] = {
        {"model", 'm', KV_OPT_STRING, &a->model, "PATH", "model (GGUF, safetensors directory, llama2.c)", 1},
        {"plan", 'p', KV_OPT_STRING, &a->plan_path, "PLAN", "the runtime with this plan's compressed cache", 0},
        {"cache", 0, KV_OPT_STRING, &a->cache_kind, "KIND", "without --plan: f16 (the runtime's f16 cache; default) or "
                                                            "f32 (the plain exact cache)", 0},
        {"context", 'c', KV_OPT_INT, &a->context, "N", "prompt tokens prefilled per sequence", 1},
        {"decode", 'n', KV_OPT_INT, &a->decode, "K", "decoding steps after the prefill (default 32)", 0},
        {"batch", 'b', KV_OPT_INT, &a->batch, "B", "sequences decoded together (default 1)", 0},
        {"prefill-chunk", 0, KV_OPT_INT, &a->prefill_chunk, "N", "prompt tokens per forward step (default 512, as kvrun "
                                                                 "generate; 0 = the whole prompt at once)", 0},
        {"text", 0, KV_OPT_STRING, &a->text, "FILE", "take the prompts from this text (default: seeded random tokens)", 0},
        {"tokenizer", 0, KV_OPT_STRING, &a->tokp, "PATH", "tokenizer for --text (default: the model's own)", 0},
        {"seed", 0, KV_OPT_INT, &a->seed, "S", "seed of the random prompts (default 1)", 0},
        {"weights", 0, KV_OPT_STRING, &a->weights, "KIND", "weight storage: native (the CPU's default), f32, f16 (the GPU's)", 0},
        {"device", 0, KV_OPT_STRING, &a->device, "DEV", "cpu (default) or cuda (the model and its cache on the GPU)", 0},
        {"threads", 't', KV_OPT_INT, &a->threads, "N", "threads, 1..4 per CPU (default: KVCAL_THREADS or all CPUs)", 0},
        {"keep-reconstructions", 0, KV_OPT_FLAG, &a->keep, NULL, "AQUA-KV plans: keep the reconstructions across steps "
                                                                     "instead of rebuilding them (kernels/RUNTIME.md §6)", 0},
        {"predict", 0, KV_OPT_FLAG, &a->predict, NULL, "also the cost model's decode speed (kvcal search "
                                                            "--min-decode-speed's; calib/SEARCH.md §7) for one sequence "
                                                            "at --context, against the f16 cache's, beside what was measured", 0},
        {"json", 0, KV_OPT_FLAG, &a->json, NULL, "print the result as one JSON object", 0},
        {NULL, 0, 0, NULL, NULL, NULL, 0},
    };
    kv_cli_args args;
    int rc = kv_cli_parse(&args, k_tool, "--model M [--plan P | --cache f16|f32] --context N [--decode K] [--batch B] "
                          "[--prefill-chunk N] [--text FILE] [-t T] [--json]",
                          "Prefill N tokens per sequence, decode K tokens for B sequences together, and report speed "
                          "and the bytes the KV cache holds.",
                          opts, 0, argc, argv);
    if (rc) return rc;
    kv_cli_args_free(&args);
    if (a->context < 1 || a->context > (1L << 22) || a->decode < 1 || a->decode > (1L << 20) || a->batch < 1 ||
        a->batch > 4096 || a->seed < 0)
        return kv_cli_usage_error(k_tool, "--context in [1, 2^22], --decode in [1, 2^20], --batch in [1, 4096], "
                                  "--seed >= 0");
    int n_threads = 0;
    if ((rc = kv_tool_threads(k_tool, a->threads, &n_threads)) != KV_EXIT_OK) return rc;
    if (strcmp(a->cache_kind, "f32") != 0 && strcmp(a->cache_kind, "f16") != 0)
        return kv_cli_usage_error(k_tool, "--cache must be f16 or f32, not '%s'", a->cache_kind);
    a->mo.n_threads = n_threads;
    if ((rc = kv_tool_model_device(k_tool, a->device, a->weights, KV_WEIGHTS_NATIVE, &a->mo)) != KV_EXIT_OK) return rc;
    if (a->mo.device == KV_MODEL_DEVICE_CUDA && !a->plan_path && strcmp(a->cache_kind, "f32") == 0)
        return kv_cli_usage_error(k_tool, "--device cuda holds the cache in the runtime: --cache f16 or --plan");
    return KV_EXIT_OK;
}

/* The memory this asks for, before allocating any of it: the cache of B sequences of N + K tokens (f32 for the
 * plain cache, f16 as the bound for the runtime's), the forward workspace of the largest step (a prefill chunk or
 * the B decoding rows), the logits, the text's tokens. */
static kv_status check_memory(const bench_args *a, kv_model *m) {
    const kv_arch *ar = kv_model_arch(m);
    const int N = (int)a->context, K = (int)a->decode, B = (int)a->batch;
    const double kvd = (double)ar->n_kv_heads * ar->head_dim;
    const double per_value = !a->plan_path && strcmp(a->cache_kind, "f32") == 0 ? 4.0 : 2.0;
    const double cache_b = (double)B * (double)(N + K) * ar->n_layers * 2.0 * kvd * per_value;
    const double chunk = a->prefill_chunk > 0 && a->prefill_chunk < a->context ? (double)a->prefill_chunk : (double)N;
    const double rows = chunk > B ? chunk : B;
    const double est = (double)kv_model_weight_bytes(m) + cache_b + kv_model_forward_bytes(m, rows, (double)(N + K)) +
                       4.0 * (double)B * ar->vocab_size + (a->text ? 16.0 * (double)N : 0.0);
    char what[256];
    snprintf(what, sizeof what, "--batch %d x --context %d + --decode %d (a cache of %.1f GiB; a forward step of "
             "%.0f rows, --prefill-chunk)", B, N, K, cache_b / 1073741824.0, rows);
    return kv_tool_check_memory(est, what);
}

/* What the cache holds after the run (the runtime's own counts; the plain cache's arrays), the peak RSS, and with
 * --predict the cost model's decode speed for one sequence at the context. */
static kv_status measure_after(bench_report *r, const bench_args *a, kv_model *m, kv_cache *cache, const kv_plan *plan) {
    kv_rt *rt = kv_cache_rt_runtime(cache);
    kv_status s = KV_OK;
    if (rt) {
        kv_rt_stats st;
        if ((s = kv_rt_get_stats(rt, -1, &st)) != KV_OK) return s;
        r->cache_bytes = st.allocated_bytes + st.predictor_bytes + st.basis_bytes;
        r->cache_bytes_accounted = st.accounted_bytes + st.predictor_bytes + st.basis_bytes;
        r->working_bytes = st.working_bytes;
        r->bits_per_value = st.bits_per_value;
        r->bits_per_value_total = st.bits_per_value_total;
    } else { /* the plain cache: f32 keys and values of every token */
        r->cache_bytes = r->cache_bytes_accounted = kv_cache_bytes(cache);
        r->bits_per_value = r->bits_per_value_total = 32.0;
    }
    struct rusage ru;
    r->peak_rss_kb = getrusage(RUSAGE_SELF, &ru) == 0 ? ru.ru_maxrss : 0;
    if (!a->predict) return KV_OK;
    kv_decode_cost dc, df;
    double w = 0;
    if ((s = kv_decode_weights_seconds(&w, m, 16)) != KV_OK ||
        (s = kv_decode_cost_measure(&dc, plan, m, (int)a->context, 8)) != KV_OK)
        return s;
    if ((s = kv_decode_cost_measure(&df, NULL, m, (int)a->context, 8)) == KV_OK) {
        r->pred_tps = 1.0 / (w + dc.seconds), r->pred_ratio = kv_decode_speed_ratio(w, dc.seconds, df.seconds);
        kv_decode_cost_free(&df);
    }
    kv_decode_cost_free(&dc);
    return s;
}

static void print_json(const bench_args *a, const bench_report *r, int threads) {
    const char *what = a->plan_path ? a->plan_path : a->cache_kind;
    printf("{\"cache\": \"");
    for (const char *p = what; *p; p++) {
        if (*p == '"' || *p == '\\') putchar('\\');
        if ((unsigned char)*p >= 0x20) putchar(*p);
    }
    printf("\", \"context\": %ld, \"decode\": %ld, \"batch\": %ld, \"threads\": %d, \"decode_tokens_per_second\": %.3f, "
           "\"prefill_tokens_per_second\": %.3f, \"decode_seconds\": %.4f, \"prefill_seconds\": %.4f, "
           "\"end_prompt_seconds\": %.4f, "
           "\"cache_bytes\": %llu, \"cache_bytes_accounted\": %llu, \"working_bytes\": %llu, "
           "\"bits_per_value\": %.4f, \"bits_per_value_total\": %.4f, \"peak_rss_bytes\": %lld",
           a->context, a->decode, a->batch, threads, r->run.decode_tokens_per_second, r->run.prefill_tokens_per_second,
           r->run.decode_s, r->run.prefill_s, r->run.end_prompt_s, (unsigned long long)r->cache_bytes,
           (unsigned long long)r->cache_bytes_accounted, (unsigned long long)r->working_bytes, r->bits_per_value,
           r->bits_per_value_total, (long long)r->peak_rss_kb * 1024);
    if (a->predict)
        printf(", \"predicted_decode_tokens_per_second\": %.3f, \"predicted_speed_vs_f16\": %.4f", r->pred_tps,
               r->pred_ratio);
    printf("}\n");
}

static void print_text(const bench_args *a, const bench_report *r, int threads) {
    const kv_bench_result *b = &r->run;
    printf("cache                      %s\n", a->plan_path ? a->plan_path : a->cache_kind);
    printf("context / decode / batch   %ld / %ld / %ld (%d threads)\n", a->context, a->decode, a->batch, threads);
    printf("decode_tokens_per_second   %.2f\n", b->decode_tokens_per_second);
    printf("prefill_tokens_per_second  %.2f\n", b->prefill_tokens_per_second);
    printf("end_prompt_seconds         %.4f (%.2f%% of the prefill's %.4f s: token selection and compression)\n",
           b->end_prompt_s, b->prefill_s > 0 ? 100.0 * b->end_prompt_s / b->prefill_s : 0.0, b->prefill_s);
    printf("cache_bytes                %llu held (accounted %llu; working set %llu)\n",
           (unsigned long long)r->cache_bytes, (unsigned long long)r->cache_bytes_accounted,
           (unsigned long long)r->working_bytes);
    printf("bits_per_value             %.3f (total %.3f)\n", r->bits_per_value, r->bits_per_value_total);
    printf("peak_rss                   %.1f MiB\n", r->peak_rss_kb / 1024.0);
    if (a->predict)
        printf("predicted                  %.2f decode tokens/s for one sequence, %.3fx the f16 cache's (the cost "
               "model)\n", r->pred_tps, r->pred_ratio);
}

int kvrun_bench(int argc, char **argv) {
    bench_args a;
    int rc = parse_args(&a, argc, argv);
    if (rc) return rc < 0 ? KV_EXIT_OK : rc;
    kv_model *m = NULL;
    kv_tokenizer *tok = NULL;
    kv_cache *cache = NULL;
    kv_plan *plan = NULL;
    int32_t *ids = NULL;
    size_t n_ids = 0;
    bench_report r;
    memset(&r, 0, sizeof r);
    kv_status s;
    if (a.text && (s = kv_input_check(a.text)) != KV_OK) goto done; /* a device never ends */
    if ((s = kv_tool_open_model_opt(&m, a.text ? &tok : NULL, a.model, a.tokp, &a.mo)) != KV_OK) goto done;
    kv_tool_warn_context(kv_model_arch(m), a.context + a.decode, "--context plus --decode");
    if ((s = check_memory(&a, m)) != KV_OK) goto done;
    if (a.text) {
        if ((s = kv_tool_tokenize_file(&ids, &n_ids, NULL, tok, a.text)) != KV_OK) goto done;
        if (n_ids < (size_t)a.context) {
            s = KV_ERR(KV_EINVAL, "'%s' has %zu tokens, fewer than one prompt of %ld", a.text, n_ids, a.context);
            goto done;
        }
    }
    if ((s = kv_tool_make_cache(&cache, &plan, m, a.model, a.plan_path, a.cache_kind, (int)a.batch,
                                (int)(a.context + a.decode), a.keep ? KV_CACHE_RT_KEEP_RECONSTRUCTIONS : 0u)) != KV_OK)
        goto done;
    const kv_bench_options bo = {(int)a.context, (int)a.decode, (int)a.batch, (int)a.prefill_chunk, ids, n_ids,
                                 (uint64_t)a.seed};
    if ((s = kv_bench_run(&r.run, m, cache, &bo)) != KV_OK || (s = measure_after(&r, &a, m, cache, plan)) != KV_OK)
        goto done;
    if (a.json) print_json(&a, &r, kv_model_threads(m));
    else print_text(&a, &r, kv_model_threads(m));
done:
    free(ids);
    kv_cache_free(cache);
    kv_plan_free(plan);
    kv_tokenizer_free(tok);
    kv_model_free(m);
    return s == KV_OK ? KV_EXIT_OK : kv_cli_fail(k_tool, s);
}
