/* kvprof budget: the token-precision operating point of quantized pruning searched under a memory
 * budget (quantized-pruning.txt; issue 17). For every budget, selection method and precision (1x tokens
 * at 16 bits, 2x at 8, 4x at 4, 8x at 2) and the layer-wise mixes of the paper's appendix C, the plan
 * kvcal fit would write (method kivi: nothing to calibrate) is applied to the same prompts of the
 * calibration corpus with the two long-context protocols (continuation KL and ppl; passkey accuracy
 * when --passkey-length is given). Each prompt goes through the model once and is copied into every
 * plan's cache (kv_rt_prompt_copy). The best point of the target budget is written as a kvcal fit
 * configuration fragment; a table, a JSON report and an SVG chart of quality against budget.
 * Thin: parse and check the options, load the model and the corpus, make the plans and caches
 * (kv_budget_plans_make, calib/budget_plans.c), measure them (kv_budget_measure, profile/budget_measure.c),
 * print and write the reports. */
#define _POSIX_C_SOURCE 200809L
#include "kv_profile.h"
#include "kv_tools.h"
#include "kvrt.h"
#include "kv_calib.h"

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *k_tool = "kvprof budget";

#define MAX_LIST 16

static kv_status parse_methods(kv_plan_prune *out, int *n, const char *text) {
    *n = 0;
    char buf[256];
    snprintf(buf, sizeof buf, "%s", text);
    for (char *save = NULL, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        int found = -1;
        for (int p = KV_PLAN_PRUNE_STREAMINGLLM; p <= KV_PLAN_PRUNE_PYRAMIDKV; p++)
            if (strcmp(t, kv_plan_prune_name(p)) == 0) found = p;
        if (found < 0)
            return KV_ERR(KV_EINVAL, "--methods: '%s' is not streamingllm, h2o, snapkv or pyramidkv", t);
        if (*n == MAX_LIST) return KV_ERR(KV_EINVAL, "--methods: more than %d", MAX_LIST);
        out[(*n)++] = (kv_plan_prune)found;
    }
    if (*n == 0) return KV_ERR(KV_EINVAL, "--methods: none given");
    return KV_OK;
}

/* The command line, parsed and checked. */
typedef struct budget_args {
    const char *model, *tokp, *corpus, *config, *set_last, *budgets_s, *methods_s, *bits_s, *cfg_out, *svg, *report,
        *depths_s;
    double target;
    long prompt_len, score_len, samples, prefill_chunk, threads, mix_base, mix_ranges, mix_methods, pk_len, trials,
        seed, max_tokens;
    int json, no_mixes, n_threads;
    const char **sets; /* every --set, in order (owned) */
    int n_sets;
    double budgets[MAX_LIST], dv[MAX_LIST];
    int nb, nd, nbits, nm, ti, bits[MAX_LIST];
    kv_plan_prune methods[MAX_LIST];
} budget_args;

/* The lists and the counts, then every file: KV_EXIT_OK or the usage error's exit code. */
static int check_args(budget_args *b) {
    double bv[MAX_LIST];
    kv_status s = kv_tool_parse_list(b->budgets, MAX_LIST, &b->nb, b->budgets_s, "--budgets");
    if (s == KV_OK) s = kv_tool_parse_list(bv, MAX_LIST, &b->nbits, b->bits_s, "--bits");
    if (s == KV_OK) s = kv_tool_parse_list(b->dv, MAX_LIST, &b->nd, b->depths_s, "--depths");
    if (s == KV_OK) s = parse_methods(b->methods, &b->nm, b->methods_s);
    if (s != KV_OK) return kv_cli_usage_error(k_tool, "%s", kv_error_last());
    for (int i = 0; i < b->nbits; i++) {
        if (!(bv[i] >= 1 && bv[i] <= 32 && bv[i] == floor(bv[i]))) /* 2.5 is not 2 */
            return kv_cli_usage_error(k_tool, "--bits %g: token precisions are whole numbers of bits (16, 8, 4, 3 or "
                                      "2)", bv[i]);
        b->bits[i] = (int)bv[i];
    }
    if (b->target == 0) b->target = b->budgets[0];
    b->ti = -1;
    for (int i = 0; i < b->nb; i++)
        if (b->budgets[i] == b->target) b->ti = i;
    int rc = KV_EXIT_OK;
    if (b->ti < 0) rc = kv_cli_usage_error(k_tool, "--target %g is not one of --budgets", b->target);
    else if (b->prompt_len < 2 || b->score_len < 1 || b->samples < 1 || b->prompt_len > (1L << 22) ||
             b->score_len > (1L << 22) || b->samples > (1L << 30) || b->prompt_len + b->score_len > (1L << 22))
        rc = kv_cli_usage_error(k_tool, "--prompt-len >= 2, --score-len >= 1 (together at most 2^22), --samples in "
                                "[1, 2^30]");
    else if (b->pk_len < 0 || b->pk_len > (1L << 22) || b->trials < 1 || b->trials > 1000 || b->prefill_chunk < 0 ||
             b->prefill_chunk > (1L << 24) || b->max_tokens < 0 || b->seed < 0)
        rc = kv_cli_usage_error(k_tool, "--passkey-length in [0, 2^22], --trials in [1, 1000], --prefill-chunk in "
                                "[0, 2^24], --max-tokens, --seed >= 0");
    for (int i = 0; i < b->nd && rc == KV_EXIT_OK; i++)
        if (!(b->dv[i] >= 0 && b->dv[i] <= 1)) rc = kv_cli_usage_error(k_tool, "--depths values must be in [0, 1]");
    if (rc == KV_EXIT_OK) rc = kv_tool_threads(k_tool, b->threads, &b->n_threads);
    if (rc == KV_EXIT_OK) {
        const kv_tool_path ins[] = {{"--model", b->model}, {"--tokenizer", b->tokp}, {"--corpus", b->corpus},
                                    {"--config", b->config}};
        const kv_tool_path outs[] = {{"--config-out", b->cfg_out}, {"--svg", b->svg}, {"--report", b->report}};
        rc = kv_tool_check_io(k_tool, ins, 4, outs, 3);
    }
    return rc;
}

/* The command line into *b (b->sets freed by the caller): KV_EXIT_OK, -1 after --help, or the usage error's exit
 * code. */
static int parse_args(budget_args *b, int argc, char **argv) {
    memset(b, 0, sizeof *b);
    b->budgets_s = "0.25,0.125,0.0625", b->methods_s = "snapkv,pyramidkv,h2o,streamingllm", b->bits_s = "16,8,4,2";
    b->depths_s = "0.1,0.5,0.9";
    b->prompt_len = 1024, b->score_len = 64, b->samples = 4, b->prefill_chunk = 512, b->mix_base = 4;
    b->mix_ranges = 4, b->mix_methods = 1, b->trials = 1;
    const kv_opt opts[] = {
        {"model", 'm', KV_OPT_STRING, &b->model, "PATH", "model (GGUF, safetensors directory, llama2.c)", 1},
        {"tokenizer", 0, KV_OPT_STRING, &b->tokp, "PATH", "tokenizer (default: the model's own)", 0},
        {"corpus", 'c', KV_OPT_STRING, &b->corpus, "FILE", "calibration text (e.g. wiki.valid.raw): prompts and filler", 1},
        {"budgets", 0, KV_OPT_STRING, &b->budgets_s, "B,...", "memory budgets, fractions of the f16 cache (default "
                                                              "0.25,0.125,0.0625)", 0},
        {"target", 0, KV_OPT_DOUBLE, &b->target, "B", "the budget whose best point --config-out writes (default: the "
                                                      "first of --budgets)", 0},
        {"methods", 0, KV_OPT_STRING, &b->methods_s, "M,...", "selection methods (default snapkv,pyramidkv,h2o,"
                                                              "streamingllm)", 0},
        {"bits", 0, KV_OPT_STRING, &b->bits_s, "B,...", "token precisions: 16 (f16), 8, 4, 3, 2 (default 16,8,4,2)", 0},
        {"mix-base", 0, KV_OPT_INT, &b->mix_base, "B", "layer-wise mixes: base precision (default 4, the paper's)", 0},
        {"mix-ranges", 0, KV_OPT_INT, &b->mix_ranges, "R", "layer-wise mixes: layers split into R ranges (default 4)", 0},
        {"mix-methods", 0, KV_OPT_INT, &b->mix_methods, "K", "layer-wise mixes for the first K methods (default 1)", 0},
        {"no-mixes", 0, KV_OPT_FLAG, &b->no_mixes, NULL, "uniform precisions only", 0},
        {"prompt-len", 0, KV_OPT_INT, &b->prompt_len, "N", "continuation: prompt tokens, BOS included (default 1024)", 0},
        {"score-len", 0, KV_OPT_INT, &b->score_len, "M", "continuation: tokens scored after it (default 64)", 0},
        {"samples", 0, KV_OPT_INT, &b->samples, "S", "continuation: samples from the corpus (default 4)", 0},
        {"passkey-length", 0, KV_OPT_INT, &b->pk_len, "N", "also passkey retrieval at this length (0 = not; default)", 0},
        {"depths", 0, KV_OPT_STRING, &b->depths_s, "D,...", "passkey depths (default 0.1,0.5,0.9)", 0},
        {"trials", 0, KV_OPT_INT, &b->trials, "T", "passkey keys per depth (default 1)", 0},
        {"seed", 's', KV_OPT_INT, &b->seed, "S", "passkey seed (default 0)", 0},
        {"prefill-chunk", 0, KV_OPT_INT, &b->prefill_chunk, "N", "prompt tokens per forward step (default 512)", 0},
        {"max-tokens", 0, KV_OPT_INT, &b->max_tokens, "N", "corpus tokens read at most (0 = what the samples need)", 0},
        {"config", 0, KV_OPT_STRING, &b->config, "CFG.yaml", "base kvcal fit configuration (group sizes, cache, window)", 0},
        {"set", 0, KV_OPT_STRING, &b->set_last, "KEY=VALUE", "override a base configuration key (repeatable)", 0},
        {"config-out", 0, KV_OPT_STRING, &b->cfg_out, "FILE", "the best point of --target as a kvcal fit config fragment", 0},
        {"svg", 0, KV_OPT_STRING, &b->svg, "FILE", "chart: continuation KL against the budget for every point", 0},
        {"report", 0, KV_OPT_STRING, &b->report, "FILE", "every point's measurements as JSON", 0},
        {"json", 0, KV_OPT_FLAG, &b->json, NULL, "print the table as JSON instead", 0},
        {"threads", 't', KV_OPT_INT, &b->threads, "N", "threads, 1..4 per CPU (default: KVCAL_THREADS or all CPUs)", 0},
        {NULL, 0, 0, NULL, NULL, NULL, 0},
    };
    if (!(b->sets = kv_cli_collect(argc, argv, "set", 0, &b->n_sets)))
        return kv_cli_fail(k_tool, KV_ERR(KV_ENOMEM, "out of memory"));
    kv_cli_args args;
    int rc = kv_cli_parse(&args, k_tool, "--model M --corpus FILE [--budgets 0.25,0.125] [--config-out FILE] [options]",
                          "Quantized pruning under a memory budget: every operating point (selection method x token\n"
                          "precision, 1x tokens at 16 bits ... 8x at 2, and layer-wise mixes) measured on the corpus\n"
                          "with the continuation protocol (and passkey), one prefill per prompt shared by all;\n"
                          "the best point of the target budget written as a kvcal fit config fragment.",
                          opts, 0, argc, argv);
    if (rc) return rc;
    kv_cli_args_free(&args);
    return check_args(b);
}

/* The table on stdout: text, or JSON with every point. */
static void print_table(const budget_args *b, const kv_budget_plans *bp, const kv_budget_result *res,
                        const kv_cont_summary *sum, const int *best, double t_cont) {
    const kv_budget_point *pts = bp->points;
    if (b->json) {
        printf("{\"ppl_uncompressed\": %.6f, \"samples\": %zu, \"prompt_len\": %ld, \"score_len\": %ld, "
               "\"passkey_length\": %ld, \"points\": [", sum->ppl_ref, sum->n_samples, b->prompt_len, b->score_len,
               b->pk_len);
        for (int i = 0; i < bp->n; i++) {
            printf("%s{\"name\": \"%s\", \"method\": \"%s\", \"budget\": %.6g, \"bits\": %d, \"range\": [%d, %d], "
                   "\"range_bits\": %d, \"kl_mean\": %.6g, \"ppl\": %.6f, \"top1_agreement\": %.6f, \"cache_fraction\": "
                   "%.6f", i ? ", " : "", pts[i].name, kv_plan_prune_name(pts[i].method), pts[i].budget, pts[i].bits,
                   pts[i].range_lo, pts[i].range_hi, pts[i].range_bits, res[i].kl_mean, res[i].ppl,
                   res[i].top1_agreement, res[i].cache_fraction);
            if (isfinite(res[i].passkey_accuracy)) printf(", \"passkey_accuracy\": %.6f", res[i].passkey_accuracy);
            int is_best = 0;
            for (int k = 0; k < b->nb; k++) is_best |= best[k] == i;
            printf(", \"best\": %s}", is_best ? "true" : "false");
        }
        printf("]}\n");
        return;
    }
    printf("uncompressed continuation ppl %.4f (%zu samples: %ld-token prompts, %ld scored tokens each; %.1f s)\n",
           sum->ppl_ref, sum->n_samples, b->prompt_len, b->score_len, t_cont);
    printf("%-8s %-40s %10s %9s %6s %8s %8s\n", "budget", "operating point", "kl_mean", "ppl", "top1", "cache",
           b->pk_len > 0 ? "passkey" : "");
    for (int k = 0; k < b->nb; k++)
        for (int i = 0; i < bp->n; i++) {
            if (pts[i].budget != b->budgets[k]) continue;
            printf("1/%-6.3g %-40s %10.5g %9.4f %6.4f %8.4f", 1.0 / pts[i].budget, pts[i].name, res[i].kl_mean,
                   res[i].ppl, res[i].top1_agreement, res[i].cache_fraction);
            if (b->pk_len > 0) printf(" %8.3f", res[i].passkey_accuracy);
            printf("%s\n", best[k] == i ? "  <- best" : "");
        }
}

/* --report: every point's measurements as JSON, written atomically. */
static kv_status write_report(const char *path, const char *model, const kv_budget_plans *bp,
                              const kv_budget_result *res, const kv_cont_summary *sum) {
    kv_atomic_file af;
    kv_status s;
    if ((s = kv_atomic_open(&af, path)) != KV_OK) return s;
    fprintf(af.fp, "{\"model\": ");
    kv_tool_json_string(af.fp, model);
    fprintf(af.fp, ", \"ppl_uncompressed\": %.6f, \"points\": [", sum->ppl_ref);
    for (int i = 0; i < bp->n; i++)
        fprintf(af.fp, "%s{\"name\": \"%s\", \"budget\": %.6g, \"kl_mean\": %.6g, \"ppl\": %.6f, "
                "\"passkey_accuracy\": %.6g}", i ? ", " : "", bp->points[i].name, bp->points[i].budget,
                res[i].kl_mean, res[i].ppl, isfinite(res[i].passkey_accuracy) ? res[i].passkey_accuracy : -1.0);
    fprintf(af.fp, "]}\n");
    return kv_atomic_commit(&af);
}

int kvprof_budget(int argc, char **argv) {
    budget_args b;
    int rc = parse_args(&b, argc, argv);
    if (rc) {
        free(b.sets);
        return rc < 0 ? KV_EXIT_OK : rc;
    }
    kv_model *m = NULL;
    kv_tokenizer *tok = NULL;
    int32_t *ids = NULL;
    size_t n_ids = 0;
    kv_budget_plans bp;
    memset(&bp, 0, sizeof bp);
    kv_budget_result *res = NULL;
    kv_status s;
    if ((s = kv_input_check(b.corpus)) != KV_OK) goto done;
    if ((s = kv_tool_open_model(&m, &tok, b.model, b.tokp, b.n_threads)) != KV_OK) goto done;
    const kv_arch *a = kv_model_arch(m);
    /* the plans (and every refusal) before any measuring */
    kv_budget_plans_request rq = {
        {b.budgets, b.nb, b.methods, b.nm, b.bits, b.nbits, b.no_mixes ? 0 : (int)b.mix_base,
         (int)(b.mix_ranges > INT_MAX ? INT_MAX : b.mix_ranges), (int)b.mix_methods},
        b.model, b.config, b.sets, b.n_sets,
        (int)(b.prompt_len + b.score_len > b.pk_len + 64 ? b.prompt_len + b.score_len : b.pk_len + 64)};
    if ((s = kv_budget_plans_make(&bp, m, &rq)) != KV_OK) goto done;
    if (!(res = calloc((size_t)bp.n, sizeof *res))) {
        s = KV_ERR(KV_ENOMEM, "out of memory for %d operating points", bp.n);
        goto done;
    }
    const size_t per = (size_t)(b.prompt_len + b.score_len);
    size_t want = b.max_tokens ? (size_t)b.max_tokens : per * (size_t)b.samples;
    if (b.pk_len > 0 && want < (size_t)b.pk_len * 8) want = (size_t)b.pk_len * 8;
    if ((s = kv_tool_tokenize_file_max(&ids, &n_ids, NULL, tok, b.corpus, want)) != KV_OK) goto done;
    kv_log(KV_LOG_INFO, "kvprof budget: %d operating points x %ld samples of %ld + %ld tokens", bp.n, b.samples,
           b.prompt_len, b.score_len);
    kv_budget_measure_options mo = {(int)b.prompt_len, (int)b.score_len, (int)b.prefill_chunk, bp.base->global.recent,
                                    (size_t)b.samples, (int)b.pk_len, b.dv, b.nd, (int)b.trials, (uint64_t)b.seed};
    kv_cont_summary sum;
    double t_cont = 0;
    if ((s = kv_budget_measure(res, &sum, &t_cont, m, tok, bp.caches, bp.n, bp.prefill, ids, n_ids, &mo)) != KV_OK)
        goto done;
    int best[MAX_LIST]; /* the best point of each budget */
    kv_budget_best(best, bp.points, res, bp.n, b.budgets, b.nb);
    print_table(&b, &bp, res, &sum, best, t_cont);
    if (b.report && (s = write_report(b.report, b.model, &bp, res, &sum)) != KV_OK) goto done;
    if (b.svg) {
        char title[256];
        snprintf(title, sizeof title, "quantized pruning: %s, %zu x %ld-token prompts", a->name, sum.n_samples,
                 b.prompt_len);
        if ((s = kv_budget_svg_write(b.svg, title, bp.points, res, bp.n, b.budgets, b.nb)) != KV_OK) goto done;
    }
    if (b.cfg_out && (s = kv_budget_config_write(b.cfg_out, &bp.points[best[b.ti]], &res[best[b.ti]], a->n_layers,
                                                 bp.base->global.prune_window, bp.base->global.prune_pool)) != KV_OK)
        goto done;
done:
    kv_budget_plans_free(&bp);
    free(res);
    free(ids);
    free(b.sets);
    kv_tokenizer_free(tok);
    kv_model_free(m);
    return s == KV_OK ? KV_EXIT_OK : kv_cli_fail(k_tool, s);
}
