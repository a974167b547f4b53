/* kvrun bench: what a KV cache costs in speed and memory on a real model. B sequences each get a
 * prompt of N tokens (a corpus slice, or seeded random tokens) through a prefill in chunks, then K
 * single-token decoding steps run all B sequences in one forward call (greedy: each step feeds the
 * argmax of the previous logits). Reports prefill and decode tokens per second, the bytes the cache
 * holds (from the runtime's own allocations; the plain cache's arrays otherwise), bits per value and
 * the process's peak RSS. Timings are wall time of the forward calls. */
#define _POSIX_C_SOURCE 200809L
#include "kv_bench.h"
#include "kv_tools.h"
#include "kvrt.h"

#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

static const char *k_tool = "kvrun bench";

typedef struct bench_result {
    double prefill_s, decode_s;
    double end_prompt_s; /* kv_cache_end_prompt after each prefill: a pruning plan's selection and compression */
    uint64_t cache_bytes, cache_bytes_accounted, working_bytes;
    double bits_per_value, bits_per_value_total;
    long peak_rss_kb;
} bench_result;

static long peak_rss_kb(void) {
    struct rusage ru;
    return getrusage(RUSAGE_SELF, &ru) == 0 ? ru.ru_maxrss : 0;
}

int kvrun_bench(int argc, char **argv) {
    const char *model = NULL, *tokp = NULL, *text = NULL, *plan_path = NULL, *cache_kind = "f16", *weights = NULL;
    const char *device = NULL;
    long context = 0, decode = 32, batch = 1, threads = 0, seed = 1, prefill_chunk = 512;
    int json = 0, keep = 0, predict = 0;
    const kv_opt opts[] = {
        {"model", 'm', KV_OPT_STRING, &model, "PATH", "model (GGUF, safetensors directory, llama2.c)", 1},
        {"plan", 'p', KV_OPT_STRING, &plan_path, "PLAN", "the runtime with this plan's compressed cache", 0},
        {"cache", 0, KV_OPT_STRING, &cache_kind, "KIND", "without --plan: f16 (the runtime's f16 cache; default) or "
                                                         "f32 (the plain exact cache)", 0},
        {"context", 'c', KV_OPT_INT, &context, "N", "prompt tokens prefilled per sequence", 1},
        {"decode", 'n', KV_OPT_INT, &decode, "K", "decoding steps after the prefill (default 32)", 0},
        {"batch", 'b', KV_OPT_INT, &batch, "B", "sequences decoded together (default 1)", 0},
        {"prefill-chunk", 0, KV_OPT_INT, &prefill_chunk, "N", "prompt tokens per forward step (default 512, as kvrun "
                                                              "generate; 0 = the whole prompt at once)", 0},
        {"text", 0, KV_OPT_STRING, &text, "FILE", "take the prompts from this text (default: seeded random tokens)", 0},
        {"tokenizer", 0, KV_OPT_STRING, &tokp, "PATH", "tokenizer for --text (default: the model's own)", 0},
        {"seed", 0, KV_OPT_INT, &seed, "S", "seed of the random prompts (default 1)", 0},
        {"weights", 0, KV_OPT_STRING, &weights, "KIND", "weight storage: native (the CPU's default), f32, f16 (the GPU's)", 0},
        {"device", 0, KV_OPT_STRING, &device, "DEV", "cpu (default) or cuda (the model and its cache on the GPU)", 0},
        {"threads", 't', KV_OPT_INT, &threads, "N", "threads, 1..4 per CPU (default: KVCAL_THREADS or all CPUs)", 0},
        {"keep-reconstructions", 0, KV_OPT_FLAG, &keep, NULL, "AQUA-KV plans: keep the reconstructions across steps "
                                                                  "instead of rebuilding them (kernels/RUNTIME.md §6)", 0},
        {"predict", 0, KV_OPT_FLAG, &predict, NULL, "also the cost model's decode speed (kvcal search "
                                                         "--min-decode-speed's; calib/SEARCH.md §7) for one sequence "
                                                         "at --context, against the f16 cache's, beside what was measured", 0},
        {"json", 0, KV_OPT_FLAG, &json, NULL, "print the result as one JSON object", 0},
        {NULL, 0, 0, NULL, NULL, NULL, 0},
    };
    kv_cli_args args;
    int rc = kv_cli_parse(&args, k_tool, "--model M [--plan P | --cache f16|f32] --context N [--decode K] [--batch B] "
                          "[--prefill-chunk N] [--text FILE] [-t T] [--json]",
                          "Prefill N tokens per sequence, decode K tokens for B sequences together, and report speed "
                          "and the bytes the KV cache holds.",
                          opts, 0, argc, argv);
    if (rc) return rc < 0 ? KV_EXIT_OK : rc;
    kv_cli_args_free(&args);
    if (context < 1 || context > (1L << 22) || decode < 1 || decode > (1L << 20) || batch < 1 || batch > 4096 ||
        seed < 0)
        return kv_cli_usage_error(k_tool, "--context in [1, 2^22], --decode in [1, 2^20], --batch in [1, 4096], "
                                  "--seed >= 0");
    int n_threads = 0;
    if ((rc = kv_tool_threads(k_tool, threads, &n_threads)) != KV_EXIT_OK) return rc;
    if (strcmp(cache_kind, "f32") != 0 && strcmp(cache_kind, "f16") != 0)
        return kv_cli_usage_error(k_tool, "--cache must be f16 or f32, not '%s'", cache_kind);
    kv_model_options mo;
    memset(&mo, 0, sizeof mo);
    mo.n_threads = n_threads;
    if ((rc = kv_tool_model_device(k_tool, device, weights, KV_WEIGHTS_NATIVE, &mo)) != KV_EXIT_OK) return rc;
    if (mo.device == KV_MODEL_DEVICE_CUDA && !plan_path && strcmp(cache_kind, "f32") == 0)
        return kv_cli_usage_error(k_tool, "--device cuda holds the cache in the runtime: --cache f16 or --plan");
    kv_model *m = NULL;
    kv_tokenizer *tok = NULL;
    kv_cache *cache = NULL;
    kv_plan *plan = NULL;
    int32_t *ids = NULL;
    size_t n_ids = 0;
    bench_result br;
    memset(&br, 0, sizeof br);
    kv_status s;
    if (text && (s = kv_input_check(text)) != KV_OK) goto done; /* a device never ends */
    if ((s = kv_tool_open_model_opt(&m, text ? &tok : NULL, model, tokp, &mo)) != KV_OK) goto done;
    const kv_arch *a = kv_model_arch(m);
    kv_tool_warn_context(a, context + decode, "--context plus --decode");
    const int N = (int)context, K = (int)decode, B = (int)batch, V = a->vocab_size;
    {   /* the memory this asks for, before allocating any of it: the cache of B sequences of N + K tokens
         * (f32 for the plain cache, f16 as the bound for the runtime's), the forward workspace of the
         * largest step (a prefill chunk or the B decoding rows), the logits, the text's tokens */
        const double kvd = (double)a->n_kv_heads * a->head_dim;
        const double per_value = !plan_path && strcmp(cache_kind, "f32") == 0 ? 4.0 : 2.0;
        const double cache_b = (double)B * (double)(N + K) * a->n_layers * 2.0 * kvd * per_value;
        const double chunk = prefill_chunk > 0 && prefill_chunk < context ? (double)prefill_chunk : (double)N;
        const double rows = chunk > B ? chunk : B;
        const double est = (double)kv_model_weight_bytes(m) + cache_b + kv_model_forward_bytes(m, rows, (double)(N + K)) +
                           4.0 * (double)B * V + (text ? 16.0 * (double)N : 0.0);
        char what[256];
        snprintf(what, sizeof what, "--batch %d x --context %d + --decode %d (a cache of %.1f GiB; a forward step of "
                 "%.0f rows, --prefill-chunk)", B, N, K, cache_b / 1073741824.0, rows);
        if ((s = kv_tool_check_memory(est, what)) != KV_OK) goto done;
    }
    if (text) {
        if ((s = kv_tool_tokenize_file(&ids, &n_ids, NULL, tok, text)) != KV_OK) goto done;
        if (n_ids < (size_t)N) {
            s = KV_ERR(KV_EINVAL, "'%s' has %zu tokens, fewer than one prompt of %d", text, n_ids, N);
            goto done;
        }
    }
    if ((s = kv_tool_make_cache(&cache, &plan, m, model, plan_path, cache_kind, B, N + K,
                                 keep ? KV_CACHE_RT_KEEP_RECONSTRUCTIONS : 0u)) != KV_OK) goto done;
    const kv_bench_options bo = {N, K, B, (int)prefill_chunk, ids, n_ids, (uint64_t)seed};
    kv_bench_result r;
    if ((s = kv_bench_run(&r, m, cache, &bo)) != KV_OK) goto done;
    br.prefill_s = r.prefill_s, br.decode_s = r.decode_s, br.end_prompt_s = r.end_prompt_s;
    kv_rt *rt = kv_cache_rt_runtime(cache);
    if (rt) {
        kv_rt_stats st;
        if ((s = kv_rt_get_stats(rt, -1, &st)) != KV_OK) goto done;
        br.cache_bytes = st.allocated_bytes + st.predictor_bytes + st.basis_bytes;
        br.cache_bytes_accounted = st.accounted_bytes + st.predictor_bytes + st.basis_bytes;
        br.working_bytes = st.working_bytes;
        br.bits_per_value = st.bits_per_value;
        br.bits_per_value_total = st.bits_per_value_total;
    } else { /* the plain cache: f32 keys and values of every token */
        br.cache_bytes = br.cache_bytes_accounted = kv_cache_bytes(cache);
        br.bits_per_value = br.bits_per_value_total = 32.0;
    }
    br.peak_rss_kb = peak_rss_kb();
    double pred_tps = 0, pred_ratio = 0; /* the cost model: the weights' part and the cache's, one sequence */
    if (predict) {
        kv_decode_cost dc, df;
        double w = 0;
        if ((s = kv_decode_weights_seconds(&w, m, 16)) != KV_OK || (s = kv_decode_cost_measure(&dc, plan, m, N, 8)) != KV_OK)
            goto done;
        if ((s = kv_decode_cost_measure(&df, NULL, m, N, 8)) != KV_OK) {
            kv_decode_cost_free(&dc);
            goto done;
        }
        pred_tps = 1.0 / (w + dc.seconds), pred_ratio = kv_decode_speed_ratio(w, dc.seconds, df.seconds);
        kv_decode_cost_free(&dc);
        kv_decode_cost_free(&df);
    }
    const double dec_tps = br.decode_s > 0 ? (double)B * K / br.decode_s : 0.0;
    const double pre_tps = br.prefill_s > 0 ? (double)B * N / br.prefill_s : 0.0;
    const char *what = plan_path ? plan_path : cache_kind;
    if (json) {
        printf("{\"cache\": \"");
        for (const char *p = what; *p; p++) {
            if (*p == '"' || *p == '\\') putchar('\\');
            if ((unsigned char)*p >= 0x20) putchar(*p);
        }
        printf("\", \"context\": %d, \"decode\": %d, \"batch\": %d, \"threads\": %d, \"decode_tokens_per_second\": %.3f, "
               "\"prefill_tokens_per_second\": %.3f, \"decode_seconds\": %.4f, \"prefill_seconds\": %.4f, "
               "\"end_prompt_seconds\": %.4f, "
               "\"cache_bytes\": %llu, \"cache_bytes_accounted\": %llu, \"working_bytes\": %llu, "
               "\"bits_per_value\": %.4f, \"bits_per_value_total\": %.4f, \"peak_rss_bytes\": %lld",
               N, K, B, kv_model_threads(m), dec_tps, pre_tps, br.decode_s, br.prefill_s, br.end_prompt_s,
               (unsigned long long)br.cache_bytes, (unsigned long long)br.cache_bytes_accounted,
               (unsigned long long)br.working_bytes, br.bits_per_value, br.bits_per_value_total,
               (long long)br.peak_rss_kb * 1024);
        if (predict)
            printf(", \"predicted_decode_tokens_per_second\": %.3f, \"predicted_speed_vs_f16\": %.4f", pred_tps, pred_ratio);
        printf("}\n");
    } else {
        printf("cache                      %s\n", what);
        printf("context / decode / batch   %d / %d / %d (%d threads)\n", N, K, B, kv_model_threads(m));
        printf("decode_tokens_per_second   %.2f\n", dec_tps);
        printf("prefill_tokens_per_second  %.2f\n", pre_tps);
        printf("end_prompt_seconds         %.4f (%.2f%% of the prefill's %.4f s: token selection and compression)\n",
               br.end_prompt_s, br.prefill_s > 0 ? 100.0 * br.end_prompt_s / br.prefill_s : 0.0, br.prefill_s);
        printf("cache_bytes                %llu held (accounted %llu; working set %llu)\n",
               (unsigned long long)br.cache_bytes, (unsigned long long)br.cache_bytes_accounted,
               (unsigned long long)br.working_bytes);
        printf("bits_per_value             %.3f (total %.3f)\n", br.bits_per_value, br.bits_per_value_total);
        printf("peak_rss                   %.1f MiB\n", br.peak_rss_kb / 1024.0);
        if (predict)
            printf("predicted                  %.2f decode tokens/s for one sequence, %.3fx the f16 cache's (the cost "
                   "model)\n", pred_tps, pred_ratio);
    }
done:
    free(ids);
    kv_cache_free(cache);
    kv_plan_free(plan);
    kv_tokenizer_free(tok);
    kv_model_free(m);
    return s == KV_OK ? KV_EXIT_OK : kv_cli_fail(k_tool, s);
}
