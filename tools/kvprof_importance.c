/* kvprof importance: KVmix layer importance (||dL/dW_k||_F, ||dL/dW_v||_F per layer, averaged over
 * prompts sampled from a corpus), rank stability, the mixed-precision allocation with recent
 * pivotal context ratios, a report (YAML/JSON), a kvcal configuration fragment and an SVG chart.
 * Under mpirun the ranks share the prompts (kv_dist); rank 0 writes and prints. Thin: the options and
 * their checks, then profile/'s calls (kv_importance_run, kv_alloc_by_importance, kv_importance_stability,
 * kv_importance_time_forwards, the reports) and a summary on stdout. */
#define _POSIX_C_SOURCE 200809L
#include "kv_profile.h"
#include "kv_tools.h"

#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

static const char *k_tool = "kvprof importance";

/* The command line, parsed. */
typedef struct imp_args {
    const char *model, *tokp, *corpus, *out, *svg, *cfg_out, *rand_out;
    long rand_seed, prompts, max_len, seed, threads, k_high, v_high, low;
    double high_frac, rpc_high, rpc_low;
    int json, compare_forward, n_threads;
} imp_args;

/* The allocation the options ask for. */
static void alloc_params(kv_alloc_params *ap, const imp_args *a) {
    kv_alloc_params_default(ap);
    ap->high_frac = a->high_frac, ap->k_high_bits = (int)a->k_high, ap->v_high_bits = (int)a->v_high;
    ap->k_low_bits = ap->v_low_bits = (int)a->low, ap->rpc_high = a->rpc_high, ap->rpc_low = a->rpc_low;
}

/* Every argument and output location, before any work: KV_EXIT_OK or the usage error's exit code. */
static int check_args(imp_args *a) {
    if (a->prompts < 2 || a->prompts > 100000) return kv_cli_usage_error(k_tool, "--prompts must be in [2, 100000]");
    if (a->max_len < 2 || a->max_len > 1 << 20) return kv_cli_usage_error(k_tool, "--max-len must be in [2, 2^20]");
    if (a->seed < 0 || a->rand_seed < 0) return kv_cli_usage_error(k_tool, "--seed and --random-seed must be >= 0");
    int rc;
    if ((rc = kv_tool_threads(k_tool, a->threads, &a->n_threads)) != KV_EXIT_OK) return rc;
    kv_alloc_params chk;
    alloc_params(&chk, a);
    if (a->k_high < KV_FIT_MIN_BITS || a->k_high > KV_FIT_MAX_BITS || a->v_high < KV_FIT_MIN_BITS ||
        a->v_high > KV_FIT_MAX_BITS || a->low < KV_FIT_MIN_BITS || a->low > KV_FIT_MAX_BITS)
        return kv_cli_usage_error(k_tool, "--k-high-bits, --v-high-bits and --low-bits must be in %d..%d, the bits "
                                  "kvcal fit accepts (got %ld, %ld, %ld)", KV_FIT_MIN_BITS, KV_FIT_MAX_BITS,
                                  a->k_high, a->v_high, a->low);
    if (kv_alloc_params_check(&chk) != KV_OK) return kv_cli_usage_error(k_tool, "%s", kv_error_last());
    const kv_tool_path ins[] = {{"--model", a->model}, {"--tokenizer", a->tokp}, {"--corpus", a->corpus}};
    const kv_tool_path outs[] = {{"--out", a->out && strcmp(a->out, "-") == 0 ? NULL : a->out},
                                 {"--svg", a->svg},
                                 {"--config-out", a->cfg_out},
                                 {"--random-config-out", a->rand_out}};
    return kv_tool_check_io(k_tool, ins, 3, outs, 4);
}

/* The command line into *a: KV_EXIT_OK, -1 after --help, or the usage error's exit code. */
static int parse_args(imp_args *a, int argc, char **argv) {
    memset(a, 0, sizeof *a);
    a->rand_seed = 1, a->prompts = 30, a->max_len = 1024, a->k_high = 3, a->v_high = 4, a->low = 2;
    a->high_frac = 0.2, a->rpc_high = 0.2, a->rpc_low = 0.1;
    const kv_opt opts[] = {
        {"model", 'm', KV_OPT_STRING, &a->model, "PATH", "model (GGUF, safetensors directory, llama2.c)", 1},
        {"tokenizer", 0, KV_OPT_STRING, &a->tokp, "PATH", "tokenizer (default: the model's own)", 0},
        {"corpus", 'c', KV_OPT_STRING, &a->corpus, "FILE", "text to sample prompts from", 1},
        {"out", 'o', KV_OPT_STRING, &a->out, "FILE", "report (YAML, or JSON with --json); '-' = stdout", 1},
        {"json", 0, KV_OPT_FLAG, &a->json, NULL, "write the report as JSON", 0},
        {"prompts", 'p', KV_OPT_INT, &a->prompts, "N", "prompts to average over (default 30)", 0},
        {"max-len", 0, KV_OPT_INT, &a->max_len, "N", "tokens per prompt, BOS included (default 1024)", 0},
        {"seed", 's', KV_OPT_INT, &a->seed, "S", "prompt sampling seed (default 0)", 0},
        {"high-frac", 0, KV_OPT_DOUBLE, &a->high_frac, "F", "fraction of layers given high bits (default 0.2)", 0},
        {"k-high-bits", 0, KV_OPT_INT, &a->k_high, "B", "key bits of important layers (default 3)", 0},
        {"v-high-bits", 0, KV_OPT_INT, &a->v_high, "B", "value bits of important layers (default 4)", 0},
        {"low-bits", 0, KV_OPT_INT, &a->low, "B", "bits of the other layers (default 2)", 0},
        {"rpc-high", 0, KV_OPT_DOUBLE, &a->rpc_high, "F", "recent pivotal context ratio, high-bit streams (0.2)", 0},
        {"rpc-low", 0, KV_OPT_DOUBLE, &a->rpc_low, "F", "recent pivotal context ratio, low-bit streams (0.1)", 0},
        {"svg", 0, KV_OPT_STRING, &a->svg, "FILE", "bar chart of K/V importance with the high-bit layers marked", 0},
        {"config-out", 0, KV_OPT_STRING, &a->cfg_out, "FILE", "kvcal fit configuration fragment (per-layer bits, RPC)", 0},
        {"random-config-out", 0, KV_OPT_STRING, &a->rand_out, "FILE",
         "the paper's baseline: the same number of high-bit layers chosen at random, as a config fragment", 0},
        {"random-seed", 0, KV_OPT_INT, &a->rand_seed, "S", "seed of the random allocation (default 1)", 0},
        {"compare-forward", 0, KV_OPT_FLAG, &a->compare_forward, NULL, "also time plain forwards over the same prompts", 0},
        {"threads", 't', KV_OPT_INT, &a->threads, "N", "threads, 1..4 per CPU (default: KVCAL_THREADS or all CPUs)", 0},
        {NULL, 0, 0, NULL, NULL, NULL, 0},
    };
    kv_cli_args args;
    int rc = kv_cli_parse(&args, k_tool, "--model M --corpus FILE --out REPORT [options]",
                          "KVmix layer importance: one forward and one backward per prompt give every layer's\n"
                          "||dL/dW_k||_F and ||dL/dW_v||_F; the top --high-frac layers get high bits.\n"
                          "Under mpirun the ranks share the prompts (same report as one process).",
                          opts, 0, argc, argv);
    if (rc) return rc;
    kv_cli_args_free(&args);
    return check_args(a);
}

/* A summary on stdout when the report went to a file: the table, average bits, stability, time. */
static void print_summary(const kv_importance *imp, const kv_alloc *alloc, const kv_stability *stab,
                          const kv_importance_meta *meta) {
    printf("layer  k_score     v_score     k_bits v_bits k_rpc v_rpc\n");
    for (int l = 0; l < imp->n_layers; l++)
        printf("%5d  %-10.4g  %-10.4g  %6d %6d %5.2f %5.2f\n", l, imp->k_mean[l], imp->v_mean[l], alloc->k_bits[l],
               alloc->v_bits[l], alloc->k_rpc[l], alloc->v_rpc[l]);
    printf("average bits: K %.4g, V %.4g (%d of %d layers high)\n", alloc->k_avg_bits, alloc->v_avg_bits,
           alloc->n_high, imp->n_layers);
    printf("rank stability (Spearman, two disjoint halves of %d prompts): K %.3f, V %.3f\n", stab->half,
           stab->k_rho, stab->v_rho);
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    printf("time: %.2f s for %d prompts (%.3f s per forward+backward)", imp->seconds, imp->n_prompts,
           imp->seconds / imp->n_prompts);
    if (meta->forward_seconds > 0)
        printf(", plain forwards %.2f s: ratio %.2fx", meta->forward_seconds, imp->seconds / meta->forward_seconds);
    printf("; peak RSS %.1f MiB\n", ru.ru_maxrss / 1024.0);
}

int kvprof_importance(int argc, char **argv) {
    imp_args a;
    int rc = parse_args(&a, argc, argv);
    if (rc) return rc < 0 ? KV_EXIT_OK : rc;
    kv_model *m = NULL;
    kv_tokenizer *tok = NULL;
    int32_t *ids = NULL;
    size_t n_ids = 0;
    char sha[65] = "";
    kv_importance imp = {0};
    kv_alloc alloc = {0};
    kv_stability stab = {0};
    kv_alloc_params ap;
    alloc_params(&ap, &a);
    kv_status s;
    kv_dist *dist = NULL;
    int rank = 0;
    if ((s = kv_input_check(a.corpus)) != KV_OK) goto done; /* a device never ends: before loading anything */
    if ((s = kv_dist_init(&dist, NULL, NULL)) != KV_OK) goto done;
    rank = kv_dist_rank(dist);
    if (rank != 0) { /* rank 0 prints; the others only their own errors */
        kv_log_set_callback(kv_log_to_stream, stderr, KV_LOG_ERROR);
        kv_progress_set_stream(NULL, 10.0);
    }
    if ((s = kv_tool_open_model(&m, &tok, a.model, a.tokp, a.n_threads)) == KV_OK) {
        if (rank == 0) kv_tool_warn_context(kv_model_arch(m), a.max_len, "--max-len");
        s = kv_tool_tokenize_file(&ids, &n_ids, sha, tok, a.corpus);
    }
    if ((s = kv_dist_agree(dist, s)) != KV_OK) goto done;
    kv_importance_options io = {(int)a.prompts, (int)a.max_len, (uint64_t)a.seed, kv_tokenizer_bos(tok), "importance",
                                dist};
    if ((s = kv_importance_run(&imp, m, ids, n_ids, &io)) != KV_OK) goto done;
    if ((s = kv_alloc_by_importance(&alloc, imp.k_mean, imp.v_mean, imp.n_layers, &ap)) != KV_OK) goto done;
    if ((s = kv_importance_stability(&stab, &imp, alloc.n_high > 0 ? alloc.n_high : 1)) != KV_OK) goto done;
    kv_importance_meta meta = {a.model, kv_model_arch(m)->name, a.corpus, sha, &ap, (uint64_t)a.seed, 0.0};
    if (rank != 0) goto done; /* the rest is rank 0's: the reports, and the plain forwards it times alone */
    if (a.compare_forward &&
        (s = kv_importance_time_forwards(&meta.forward_seconds, m, &imp, ids, kv_tokenizer_bos(tok))) != KV_OK)
        goto done;
    if ((s = kv_importance_report_write(a.out, a.json, &imp, &alloc, &stab, &meta)) != KV_OK) goto done;
    if (a.cfg_out && (s = kv_alloc_config_write(a.cfg_out, &alloc, &meta)) != KV_OK) goto done;
    if (a.rand_out) {
        kv_alloc ra;
        if ((s = kv_alloc_random(&ra, imp.n_layers, &ap, (uint64_t)a.rand_seed)) != KV_OK) goto done;
        s = kv_alloc_config_write(a.rand_out, &ra, &meta);
        kv_alloc_free(&ra);
        if (s != KV_OK) goto done;
    }
    if (a.svg) {
        char title[256];
        snprintf(title, sizeof title, "KVmix importance: %s, %d prompts x %d tokens", kv_model_arch(m)->name,
                 imp.n_prompts, imp.prompt_len);
        if ((s = kv_importance_svg_write(a.svg, title, imp.k_mean, imp.k_std, imp.v_mean, imp.v_std, imp.n_layers,
                                         &alloc)) != KV_OK)
            goto done;
    }
    if (a.out && strcmp(a.out, "-") != 0) print_summary(&imp, &alloc, &stab, &meta);
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
