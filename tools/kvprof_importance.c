/* kvprof importance: KVmix layer importance (||dL/dW_k||_F, ||dL/dW_v||_F per layer, averaged over
 * prompts sampled from a corpus), rank stability, the mixed-precision allocation with recent
 * pivotal context ratios, a report (YAML/JSON), a kvcal configuration fragment and an SVG chart.
 * Under mpirun the ranks share the prompts (kv_dist); rank 0 writes and prints. */
#define _POSIX_C_SOURCE 200809L
#include "kv_profile.h"
#include "kv_tools.h"

#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

static const char *k_tool = "kvprof importance";

/* Plain forward passes over the same prompts, for the cost ratio of one importance profile. */
static kv_status time_forwards(double *seconds, kv_model *m, const kv_importance *imp, const int32_t *tokens,
                               int bos) {
    const int len = imp->prompt_len, body = len - (bos >= 0);
    int32_t *buf = malloc(sizeof(int32_t) * (size_t)len);
    float *logits = malloc(sizeof(float) * (size_t)len * (size_t)kv_model_arch(m)->vocab_size);
    if (!buf || !logits) {
        free(buf);
        free(logits);
        return KV_ERR(KV_ENOMEM, "out of memory");
    }
    kv_status s = KV_OK;
    const double t0 = kv_now_seconds();
    for (int p = 0; p < imp->n_prompts && s == KV_OK; p++) {
        int n = 0;
        if (bos >= 0) buf[n++] = bos;
        memcpy(buf + n, tokens + imp->prompt_starts[p], sizeof(int32_t) * (size_t)body);
        kv_forward f;
        memset(&f, 0, sizeof f);
        f.tokens = buf, f.n_seqs = 1, f.n_tokens = len, f.logits = logits; /* a whole forward: logits too */
        s = kv_model_forward(m, &f);
    }
    *seconds = kv_now_seconds() - t0;
    free(buf);
    free(logits);
    return s;
}

int kvprof_importance(int argc, char **argv) {
    const char *model = NULL, *tokp = NULL, *corpus = NULL, *out = NULL, *svg = NULL, *cfg_out = NULL;
    const char *rand_out = NULL;
    long rand_seed = 1;
    long prompts = 30, max_len = 1024, seed = 0, threads = 0, k_high = 3, v_high = 4, low = 2;
    double high_frac = 0.2, rpc_high = 0.2, rpc_low = 0.1;
    int json = 0, compare_forward = 0;
    const kv_opt opts[] = {
        {"model", 'm', KV_OPT_STRING, &model, "PATH", "model (GGUF, safetensors directory, llama2.c)", 1},
        {"tokenizer", 0, KV_OPT_STRING, &tokp, "PATH", "tokenizer (default: the model's own)", 0},
        {"corpus", 'c', KV_OPT_STRING, &corpus, "FILE", "text to sample prompts from", 1},
        {"out", 'o', KV_OPT_STRING, &out, "FILE", "report (YAML, or JSON with --json); '-' = stdout", 1},
        {"json", 0, KV_OPT_FLAG, &json, NULL, "write the report as JSON", 0},
        {"prompts", 'p', KV_OPT_INT, &prompts, "N", "prompts to average over (default 30)", 0},
        {"max-len", 0, KV_OPT_INT, &max_len, "N", "tokens per prompt, BOS included (default 1024)", 0},
        {"seed", 's', KV_OPT_INT, &seed, "S", "prompt sampling seed (default 0)", 0},
        {"high-frac", 0, KV_OPT_DOUBLE, &high_frac, "F", "fraction of layers given high bits (default 0.2)", 0},
        {"k-high-bits", 0, KV_OPT_INT, &k_high, "B", "key bits of important layers (default 3)", 0},
        {"v-high-bits", 0, KV_OPT_INT, &v_high, "B", "value bits of important layers (default 4)", 0},
        {"low-bits", 0, KV_OPT_INT, &low, "B", "bits of the other layers (default 2)", 0},
        {"rpc-high", 0, KV_OPT_DOUBLE, &rpc_high, "F", "recent pivotal context ratio, high-bit streams (0.2)", 0},
        {"rpc-low", 0, KV_OPT_DOUBLE, &rpc_low, "F", "recent pivotal context ratio, low-bit streams (0.1)", 0},
        {"svg", 0, KV_OPT_STRING, &svg, "FILE", "bar chart of K/V importance with the high-bit layers marked", 0},
        {"config-out", 0, KV_OPT_STRING, &cfg_out, "FILE", "kvcal fit configuration fragment (per-layer bits, RPC)", 0},
        {"random-config-out", 0, KV_OPT_STRING, &rand_out, "FILE",
         "the paper's baseline: the same number of high-bit layers chosen at random, as a config fragment", 0},
        {"random-seed", 0, KV_OPT_INT, &rand_seed, "S", "seed of the random allocation (default 1)", 0},
        {"compare-forward", 0, KV_OPT_FLAG, &compare_forward, NULL, "also time plain forwards over the same prompts", 0},
        {"threads", 't', KV_OPT_INT, &threads, "N", "threads, 1..4 per CPU (default: KVCAL_THREADS or all CPUs)", 0},
        {NULL, 0, 0, NULL, NULL, NULL, 0},
    };
    kv_cli_args args;
    int rc = kv_cli_parse(&args, k_tool, "--model M --corpus FILE --out REPORT [options]",
                          "KVmix layer importance: one forward and one backward per prompt give every layer's\n"
                          "||dL/dW_k||_F and ||dL/dW_v||_F; the top --high-frac layers get high bits.\n"
                          "Under mpirun the ranks share the prompts (same report as one process).",
                          opts, 0, argc, argv);
    if (rc) return rc < 0 ? KV_EXIT_OK : rc;
    kv_cli_args_free(&args);
    /* ---- every argument and output location, before any work ---- */
    if (prompts < 2 || prompts > 100000) return kv_cli_usage_error(k_tool, "--prompts must be in [2, 100000]");
    if (max_len < 2 || max_len > 1 << 20) return kv_cli_usage_error(k_tool, "--max-len must be in [2, 2^20]");
    if (seed < 0 || rand_seed < 0) return kv_cli_usage_error(k_tool, "--seed and --random-seed must be >= 0");
    int n_threads = 0;
    if ((rc = kv_tool_threads(k_tool, threads, &n_threads)) != KV_EXIT_OK) return rc;
    {
        kv_alloc_params chk;
        kv_alloc_params_default(&chk);
        chk.high_frac = high_frac, chk.k_high_bits = (int)k_high, chk.v_high_bits = (int)v_high;
        chk.k_low_bits = chk.v_low_bits = (int)low, chk.rpc_high = rpc_high, chk.rpc_low = rpc_low;
        if (k_high < KV_FIT_MIN_BITS || k_high > KV_FIT_MAX_BITS || v_high < KV_FIT_MIN_BITS ||
            v_high > KV_FIT_MAX_BITS || low < KV_FIT_MIN_BITS || low > KV_FIT_MAX_BITS)
            return kv_cli_usage_error(k_tool, "--k-high-bits, --v-high-bits and --low-bits must be in %d..%d, the bits "
                                      "kvcal fit accepts (got %ld, %ld, %ld)", KV_FIT_MIN_BITS, KV_FIT_MAX_BITS,
                                      k_high, v_high, low);
        if (kv_alloc_params_check(&chk) != KV_OK) return kv_cli_usage_error(k_tool, "%s", kv_error_last());
        const kv_tool_path ins[] = {{"--model", model}, {"--tokenizer", tokp}, {"--corpus", corpus}};
        const kv_tool_path outs[] = {{"--out", out && strcmp(out, "-") == 0 ? NULL : out},
                                     {"--svg", svg},
                                     {"--config-out", cfg_out},
                                     {"--random-config-out", rand_out}};
        if ((rc = kv_tool_check_io(k_tool, ins, 3, outs, 4)) != KV_EXIT_OK) return rc;
    }

    kv_model *m = NULL;
    kv_tokenizer *tok = NULL;
    int32_t *ids = NULL;
    size_t n_ids = 0;
    char sha[65] = "";
    kv_importance imp = {0};
    kv_alloc alloc = {0};
    kv_stability stab = {0};
    kv_alloc_params ap;
    kv_alloc_params_default(&ap);
    ap.high_frac = high_frac, ap.k_high_bits = (int)k_high, ap.v_high_bits = (int)v_high;
    ap.k_low_bits = ap.v_low_bits = (int)low, ap.rpc_high = rpc_high, ap.rpc_low = rpc_low;
    kv_status s;
    kv_dist *dist = NULL;
    int rank = 0;
    if ((s = kv_input_check(corpus)) != KV_OK) goto done; /* a device never ends: before loading anything */
    if ((s = kv_dist_init(&dist, NULL, NULL)) != KV_OK) goto done;
    rank = kv_dist_rank(dist);
    if (rank != 0) { /* rank 0 prints; the others only their own errors */
        kv_log_set_callback(kv_log_to_stream, stderr, KV_LOG_ERROR);
        kv_progress_set_stream(NULL, 10.0);
    }
    if ((s = kv_tool_open_model(&m, &tok, model, tokp, n_threads)) == KV_OK) {
        if (rank == 0) kv_tool_warn_context(kv_model_arch(m), max_len, "--max-len");
        s = kv_tool_tokenize_file(&ids, &n_ids, sha, tok, corpus);
    }
    if ((s = kv_dist_agree(dist, s)) != KV_OK) goto done;
    kv_importance_options io = {(int)prompts, (int)max_len, (uint64_t)seed, kv_tokenizer_bos(tok), "importance", dist};
    if ((s = kv_importance_run(&imp, m, ids, n_ids, &io)) != KV_OK) goto done;
    if ((s = kv_alloc_by_importance(&alloc, imp.k_mean, imp.v_mean, imp.n_layers, &ap)) != KV_OK) goto done;
    if ((s = kv_importance_stability(&stab, &imp, alloc.n_high > 0 ? alloc.n_high : 1)) != KV_OK) goto done;
    kv_importance_meta meta = {model, kv_model_arch(m)->name, corpus, sha, &ap, (uint64_t)seed, 0.0};
    if (rank != 0) goto done; /* the rest is rank 0's: the reports, and the plain forwards it times alone */
    if (compare_forward && (s = time_forwards(&meta.forward_seconds, m, &imp, ids, kv_tokenizer_bos(tok))) != KV_OK)
        goto done;
    if ((s = kv_importance_report_write(out, json, &imp, &alloc, &stab, &meta)) != KV_OK) goto done;
    if (cfg_out && (s = kv_alloc_config_write(cfg_out, &alloc, &meta)) != KV_OK) goto done;
    if (rand_out) {
        kv_alloc ra;
        if ((s = kv_alloc_random(&ra, imp.n_layers, &ap, (uint64_t)rand_seed)) != KV_OK) goto done;
        s = kv_alloc_config_write(rand_out, &ra, &meta);
        kv_alloc_free(&ra);
        if (s != KV_OK) goto done;
    }
    if (svg) {
        char title[256];
        snprintf(title, sizeof title, "KVmix importance: %s, %d prompts x %d tokens", kv_model_arch(m)->name,
                 imp.n_prompts, imp.prompt_len);
        if ((s = kv_importance_svg_write(svg, title, imp.k_mean, imp.k_std, imp.v_mean, imp.v_std, imp.n_layers,
                                         &alloc)) != KV_OK)
            goto done;
    }
    if (out && strcmp(out, "-") != 0) { /* a summary on stdout when the report went to a file */
        printf("layer  k_score     v_score     k_bits v_bits k_rpc v_rpc\n");
        for (int l = 0; l < imp.n_layers; l++)
            printf("%5d  %-10.4g  %-10.4g  %6d %6d %5.2f %5.2f\n", l, imp.k_mean[l], imp.v_mean[l], alloc.k_bits[l],
                   alloc.v_bits[l], alloc.k_rpc[l], alloc.v_rpc[l]);
        printf("average bits: K %.4g, V %.4g (%d of %d layers high)\n", alloc.k_avg_bits, alloc.v_avg_bits,
               alloc.n_high, imp.n_layers);
        printf("rank stability (Spearman, two disjoint halves of %d prompts): K %.3f, V %.3f\n", stab.half,
               stab.k_rho, stab.v_rho);
        struct rusage ru;
        getrusage(RUSAGE_SELF, &ru);
        printf("time: %.2f s for %d prompts (%.3f s per forward+backward)", imp.seconds, imp.n_prompts,
               imp.seconds / imp.n_prompts);
        if (meta.forward_seconds > 0)
            printf(", plain forwards %.2f s: ratio %.2fx", meta.forward_seconds, imp.seconds / meta.forward_seconds);
        printf("; peak RSS %.1f MiB\n", ru.ru_maxrss / 1024.0);
    }
done:
    kv_stability_free(&stab);
    kv_alloc_free(&alloc);
    kv_importance_free(&imp);
    free(ids);
    kv_tokenizer_free(tok);
    kv_model_free(m);
    kv_dist_finalize(dist);
    /* failures are the same on every rank (deterministic, or agreed): rank 0 says it */
    return s == KV_OK ? KV_EXIT_OK : rank == 0 ? kv_cli_fail(k_tool, s) : KV_EXIT_RUNTIME;
}
