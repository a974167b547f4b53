/* kvcal search: one plan from several methods, a choice per (layer, stream) under a budget of honest total
 * bits per value (calib/SEARCH.md). Thin: parse the options, check inputs and outputs, load the model and the
 * tokens, run the search as a library call (kv_search_run, calib/search_run.c: fits, bytes, sensitivities, proxy,
 * knapsack, refit, selection, validation; the plans written there), then print the report (text or JSON). */
#define _POSIX_C_SOURCE 200809L
#include "kv_calib.h"
#include "kv_tools.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <unistd.h>
#include <sys/stat.h>

#define MAX_COUNT (1L << 30) /* the most tokens or chunks a count option may ask for */
static const char *const k_default_cands =
    "f16,kivi2,kivi3,kivi4,higgs2,higgs3,aqua2,aqua3,aqua2r32,aqua2r64,aqua3r32,fp8,nvfp4";
#define MAX_BUDGETS 32
#define MAX_CONTEXTS 8
#define MAX_PRUNED 8
#define MAX_MULTS 8
#define MAX_LAYER_OPTS (MAX_PRUNED * (MAX_MULTS + 1))
#define MAX_POINTS (MAX_BUDGETS * MAX_CONTEXTS)

/* "a,b,c" -> numbers (each checked by the caller); at most max. With `at` (--budget-bits), an entry may be
 * "B@N": budget B at context N only (at[i] = N; 0 = at every context), so that one run can put a point at
 * each single method's own bits at each context (scripts/pareto.sh). */
static kv_status parse_numbers(double *v, long *at, int *n, int max, const char *list, const char *opt) {
    *n = 0;
    const char *p = list;
    while (*p) {
        char *end;
        const double x = strtod(p, &end);
        long ctx = 0;
        if (at && end != p && *end == '@') {
            const char *q = end + 1;
            ctx = strtol(q, &end, 10);
            if (end == q || ctx < 2) end = (char *)p; /* malformed: refused below */
        }
        if (end == p || (*end && *end != ','))
            return KV_ERR(KV_EINVAL, "%s: '%s' is not a comma-separated list of numbers%s", opt, list,
                          at ? " (each B or B@CONTEXT)" : "");
        if (*n >= max) return KV_ERR(KV_EINVAL, "%s: at most %d values", opt, max);
        if (at) at[*n] = ctx;
        v[(*n)++] = x;
        p = *end ? end + 1 : end;
    }
    if (*n == 0) return KV_ERR(KV_EINVAL, "%s is empty", opt);
    return KV_OK;
}

/* A directory that does not exist yet (--out-dir, created with its parents when the plans are written):
 * its nearest existing ancestor must be a writable directory. */
static int check_new_dir(const char *tool, const char *dir) {
    char p[4096];
    if (snprintf(p, sizeof p, "%s", dir) >= (int)sizeof p) return kv_cli_usage_error(tool, "--out-dir: path too long");
    for (;;) {
        char *slash = strrchr(p, '/');
        while (slash && slash > p && slash[1] == '\0') { /* trailing slashes */
            *slash = '\0';
            slash = strrchr(p, '/');
        }
        if (!slash) {
            snprintf(p, sizeof p, ".");
        } else if (slash == p) {
            p[1] = '\0';
        } else {
            *slash = '\0';
        }
        struct stat sb;
        if (stat(p, &sb) == 0) {
            if (!S_ISDIR(sb.st_mode))
                return kv_cli_usage_error(tool, "--out-dir '%s': '%s' is not a directory", dir, p);
            if (access(p, W_OK | X_OK) != 0)
                return kv_cli_usage_error(tool, "--out-dir '%s': directory '%s' is not writable: %s", dir, p,
                                          strerror(errno));
            return KV_EXIT_OK;
        }
        if (strcmp(p, ".") == 0 || strcmp(p, "/") == 0)
            return kv_cli_usage_error(tool, "--out-dir '%s': no existing directory above it", dir);
    }
}

/* "a,b,c" -> candidate indices (unknown: KV_EINVAL naming the known ones; duplicates refused). */
static kv_status parse_candidates(int *idx, int *n, const char *list) {
    *n = 0;
    char buf[1024];
    if (snprintf(buf, sizeof buf, "%s", list) >= (int)sizeof buf)
        return KV_ERR(KV_EINVAL, "--candidates: the list has %zu bytes, more than the %zu it may hold", strlen(list),
                      sizeof buf - 1);
    for (char *save = NULL, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        int k;
        kv_status s = kv_search_candidate_find(&k, t);
        if (s != KV_OK) return s;
        for (int i = 0; i < *n; i++)
            if (idx[i] == k) return KV_ERR(KV_EINVAL, "--candidates names '%s' twice", t);
        if (*n >= KV_SEARCH_MAX_CANDS) return KV_ERR(KV_EINVAL, "--candidates: at most %d", KV_SEARCH_MAX_CANDS);
        idx[(*n)++] = k;
    }
    if (*n == 0) return KV_ERR(KV_EINVAL, "--candidates is empty");
    return KV_OK;
}

/* "a@h2o0.1,b@h2o0.2" -> the pruned contenders, each's candidate's position in --candidates (pos[j]). */
static kv_status parse_pruned(kv_search_pruned *pr, int *pos, int *n, const char *list, const int *cidx, int nc) {
    *n = 0;
    char buf[1024];
    if (snprintf(buf, sizeof buf, "%s", list) >= (int)sizeof buf) return KV_ERR(KV_EINVAL, "--pruned: list too long");
    int nk;
    const kv_search_candidate *table = kv_search_candidates(&nk);
    for (char *save = NULL, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        if (*n >= MAX_PRUNED) return KV_ERR(KV_EINVAL, "--pruned: at most %d contenders", MAX_PRUNED);
        kv_status s = kv_search_pruned_parse(&pr[*n], t);
        if (s != KV_OK) return s;
        pos[*n] = -1;
        for (int c = 0; c < nc; c++)
            if (cidx[c] == pr[*n].cand) pos[*n] = c;
        if (pos[*n] < 0)
            return KV_ERR(KV_EINVAL, "--pruned %s: %s is not in --candidates (a pruned contender is a candidate's own "
                          "fit under pruning)", t, table[pr[*n].cand].name);
        if (table[pr[*n].cand].keys_only)
            return KV_ERR(KV_EINVAL, "--pruned %s: %s codes keys only; a pruned contender is one method on every "
                          "stream", t, table[pr[*n].cand].name);
        for (int j = 0; j < *n; j++)
            if (strcmp(pr[j].name, pr[*n].name) == 0) return KV_ERR(KV_EINVAL, "--pruned names '%s' twice", t);
        (*n)++;
    }
    if (*n == 0) return KV_ERR(KV_EINVAL, "--pruned is empty");
    return KV_OK;
}

/* The command line, parsed and checked. */
typedef struct search_args {
    const char *model, *tokenizer, *corpus, *heldout, *out, *out_dir, *cand_list, *set_last, *budget_list,
        *context_list, *pruned_list, *layer_list, *pred_inputs;
    long fit_tokens, fit_seq, sens_ctx, sens_samples, eval_chunks, eval_tokens, prompts, threads, select_chunks;
    double min_speed;
    int json, n_threads;
    kv_cli_args cli;
    const char **sets; /* every --set, in order */
    int n_sets;
    int cidx[KV_SEARCH_MAX_CANDS], nc; /* --candidates: indices into kv_search_candidates() */
    double budgets[MAX_BUDGETS];
    int n_budgets;
    long contexts[MAX_CONTEXTS], max_ctx;
    int n_ctx;
    kv_search_point_spec points[MAX_POINTS]; /* context-major: the frontier at one context, then the next */
    char paths[MAX_POINTS][4096];
    int n_points;
    kv_search_pruned pruned[MAX_PRUNED];
    int pruned_pos[MAX_PRUNED], n_pruned;   /* a contender's candidate: its position in --candidates */
    kv_search_layer_opt lopts[MAX_LAYER_OPTS]; /* every contender's candidate x (1 and each multiplier) (§5.5) */
    int n_lopt;
} search_args;

/* --budget-bits and --context into the points, context-major, each with its plan path and validation chunks;
 * KV_EXIT_OK or the usage error's exit code. */
static int parse_points(search_args *a, long *min_ctx, const char *tool) {
    double ctx_d[MAX_CONTEXTS];
    long budget_at[MAX_BUDGETS];
    if (parse_numbers(a->budgets, budget_at, &a->n_budgets, MAX_BUDGETS, a->budget_list, "--budget-bits") != KV_OK ||
        parse_numbers(ctx_d, NULL, &a->n_ctx, MAX_CONTEXTS, a->context_list ? a->context_list : "2048", "--context") !=
            KV_OK)
        return kv_cli_usage_error(tool, "%s", kv_error_last());
    for (int b = 0; b < a->n_budgets; b++)
        if (!(a->budgets[b] > 0 && a->budgets[b] <= 32))
            return kv_cli_usage_error(tool, "--budget-bits must be in (0, 32] (got %g)", a->budgets[b]);
    *min_ctx = 0;
    for (int k = 0; k < a->n_ctx; k++) {
        if (!(ctx_d[k] >= 2 && ctx_d[k] <= (1 << 20)) || ctx_d[k] != floor(ctx_d[k]))
            return kv_cli_usage_error(tool, "--context must be whole numbers in [2, 2^20] (got %g)", ctx_d[k]);
        a->contexts[k] = (long)ctx_d[k];
        *min_ctx = k == 0 || a->contexts[k] < *min_ctx ? a->contexts[k] : *min_ctx;
        a->max_ctx = a->contexts[k] > a->max_ctx ? a->contexts[k] : a->max_ctx;
    }
    for (int b = 0; b < a->n_budgets; b++) {
        int known = budget_at[b] == 0;
        for (int k = 0; k < a->n_ctx; k++) known |= budget_at[b] == a->contexts[k];
        if (!known)
            return kv_cli_usage_error(tool, "--budget-bits %g@%ld: %ld is not one of the --context values", a->budgets[b],
                                      budget_at[b], budget_at[b]);
    }
    int wanted = 0;
    for (int k = 0; k < a->n_ctx; k++)
        for (int b = 0; b < a->n_budgets; b++) wanted += !budget_at[b] || budget_at[b] == a->contexts[k];
    if ((a->out != NULL) == (a->out_dir != NULL) || (a->out && wanted != 1))
        return kv_cli_usage_error(tool, "give --out PLAN (one point: one budget at one context) or --out-dir DIR (any "
                                  "number of points; %d here)", wanted);
    for (int k = 0; k < a->n_ctx; k++)
        for (int b = 0; b < a->n_budgets; b++) {
            if (budget_at[b] && budget_at[b] != a->contexts[k]) continue;
            kv_search_point_spec *pt = &a->points[a->n_points];
            char *path = a->paths[a->n_points];
            pt->budget_bits = a->budgets[b];
            pt->ctx_index = k;
            pt->path = path;
            pt->eval_chunks = a->eval_tokens ? (size_t)(a->eval_tokens / a->contexts[k]) : (size_t)a->eval_chunks;
            if (pt->eval_chunks == 0)
                return kv_cli_usage_error(tool, "--eval-tokens %ld is less than one chunk of %ld tokens", a->eval_tokens,
                                          a->contexts[k]);
            int len = a->out ? snprintf(path, sizeof a->paths[0], "%s", a->out)
                             : snprintf(path, sizeof a->paths[0], "%s/search-ctx%ld-%gbits.kvplan", a->out_dir,
                                        a->contexts[k], a->budgets[b]);
            if (len < 0 || (size_t)len >= sizeof a->paths[0]) return kv_cli_usage_error(tool, "--out-dir: path too long");
            for (int q = 0; q < a->n_points; q++)
                if (strcmp(a->paths[q], path) == 0)
                    return kv_cli_usage_error(tool, "--budget-bits / --context name the point %s twice", path);
            a->n_points++;
        }
    return KV_EXIT_OK;
}

/* --pruned into the contenders (each's candidate's position in --candidates) and --pruned-layers into the per-layer
 * options: each contender's candidate (once) at its contender's budget and at each multiple of it (§5.5);
 * KV_EXIT_OK or the usage error's exit code. */
static int parse_contenders(search_args *a, const char *tool) {
    double mults[MAX_MULTS];
    int n_mult = 0;
    a->n_pruned = a->n_lopt = 0;
    if (a->pruned_list && parse_pruned(a->pruned, a->pruned_pos, &a->n_pruned, a->pruned_list, a->cidx, a->nc) != KV_OK)
        return kv_cli_usage_error(tool, "%s", kv_error_last());
    if (!a->layer_list) return KV_EXIT_OK;
    if (a->n_pruned == 0)
        return kv_cli_usage_error(tool, "--pruned-layers sets per-layer options of the --pruned contenders: give --pruned");
    if (parse_numbers(mults, NULL, &n_mult, MAX_MULTS, a->layer_list, "--pruned-layers") != KV_OK)
        return kv_cli_usage_error(tool, "%s", kv_error_last());
    for (int o = 0; o < n_mult; o++) {
        int twice = 0;
        for (int q = 0; q < o; q++) twice |= mults[q] == mults[o];
        if (!(mults[o] > 0 && mults[o] <= 1024) || mults[o] == 1 || twice)
            return kv_cli_usage_error(tool, "--pruned-layers: multipliers must be in (0, 1024], other than 1 (a layer "
                                      "may always keep its contender's budget), each once (got %g)", mults[o]);
    }
    for (int j = 0; j < a->n_pruned; j++) {
        int seen = 0;
        for (int q = 0; q < j; q++) seen |= a->pruned_pos[q] == a->pruned_pos[j];
        for (int o = -1; o < n_mult && !seen; o++)
            a->lopts[a->n_lopt++] = (kv_search_layer_opt){a->pruned_pos[j], o < 0 ? 1.0 : mults[o]};
    }
    return KV_EXIT_OK;
}

/* The counts' ranges and the options that exclude each other; KV_EXIT_OK or the usage error's exit code. */
static int check_counts(const search_args *a, const kv_opt *opts, const char *tool) {
    if (a->fit_tokens < 2 || a->sens_samples < 1 || a->eval_chunks < 1 || a->eval_tokens < 0 || a->prompts < 0 ||
        a->select_chunks < 0 || (kv_cli_given(&a->cli, opts, "fit-seq-len") && a->fit_seq < 2) ||
        (kv_cli_given(&a->cli, opts, "sens-ctx") && a->sens_ctx < 2))
        return kv_cli_usage_error(tool, "--fit-tokens, --fit-seq-len and --sens-ctx must be >= 2, --sens-samples and "
                                  "--eval-chunks >= 1, --eval-tokens, --prompts and --select-chunks >= 0");
    /* counts of tokens or chunks beyond any corpus: refused here, so that the sums of what the run reads
     * cannot overflow */
    if (a->fit_tokens > MAX_COUNT || a->fit_seq > (1L << 20) || a->sens_ctx > (1L << 20) ||
        a->sens_samples > MAX_COUNT || a->eval_chunks > MAX_COUNT || a->eval_tokens > MAX_COUNT ||
        a->prompts > MAX_COUNT || a->select_chunks > MAX_COUNT)
        return kv_cli_usage_error(tool, "--fit-tokens, --sens-samples, --eval-chunks, --eval-tokens, --prompts and "
                                  "--select-chunks must be at most %ld, --fit-seq-len and --sens-ctx at most 2^20",
                                  (long)MAX_COUNT);
    if (!(a->min_speed >= 0 && a->min_speed <= 100))
        return kv_cli_usage_error(tool, "--min-decode-speed must be in [0, 100] (0: no floor; 1: as fast as the f16 "
                                  "cache), not %g", a->min_speed);
    if (strcmp(a->pred_inputs, "chained") != 0 && strcmp(a->pred_inputs, "free") != 0)
        return kv_cli_usage_error(tool, "--predictor-inputs must be chained or free (got '%s')", a->pred_inputs);
    if (a->eval_tokens && kv_cli_given(&a->cli, opts, "eval-chunks"))
        return kv_cli_usage_error(tool, "give --eval-chunks or --eval-tokens, not both");
    return KV_EXIT_OK;
}

/* Every input readable and every output writable (--out-dir is created only when the plans are written, after every
 * check: a missing one is checked where it would be created); KV_EXIT_OK or the exit code. */
static int check_files(const search_args *a, const char *tool) {
    const kv_tool_path ins[] = {{"--model", a->model}, {"--tokenizer", a->tokenizer}, {"--corpus", a->corpus},
                                {"--heldout", a->heldout}};
    kv_tool_path outs[MAX_POINTS];
    for (int p = 0; p < a->n_points; p++) outs[p].what = a->out ? "--out" : "--out-dir", outs[p].path = a->paths[p];
    struct stat sb;
    const int dir_exists = a->out_dir && stat(a->out_dir, &sb) == 0;
    int rc;
    if (a->out_dir && dir_exists && !S_ISDIR(sb.st_mode))
        return kv_cli_usage_error(tool, "--out-dir '%s' exists and is not a directory", a->out_dir);
    if (a->out_dir && !dir_exists && (rc = check_new_dir(tool, a->out_dir)) != KV_EXIT_OK) return rc;
    if ((rc = kv_tool_check_io(tool, ins, 4, outs, a->out_dir && !dir_exists ? 0 : a->n_points)) != KV_EXIT_OK) return rc;
    /* corpora that never end (devices), or missing, before anything is loaded */
    kv_status s;
    if ((s = kv_input_check(a->corpus)) != KV_OK || (a->heldout && (s = kv_input_check(a->heldout)) != KV_OK))
        return kv_cli_fail(tool, s);
    return KV_EXIT_OK;
}

/* The command line into *a (a->cli and a->sets freed by search_args_free): KV_EXIT_OK, -1 after --help, or the
 * usage error's exit code. */
static int parse_args(search_args *a, const char *tool, int argc, char **argv) {
    a->fit_tokens = 16384, a->sens_samples = 2, a->eval_chunks = 4, a->prompts = 8, a->select_chunks = 1;
    a->pred_inputs = "chained";
    const kv_opt opts[] = {
        {"model", 'm', KV_OPT_STRING, &a->model, "M", "model: GGUF, safetensors directory or llama2.c checkpoint", 1},
        {"tokenizer", 0, KV_OPT_STRING, &a->tokenizer, "T", "tokenizer (default: the model's own)", 0},
        {"corpus", 'c', KV_OPT_STRING, &a->corpus, "FILE", "calibration text: the fits, then (disjoint tokens) the "
                                                        "sensitivities and the importance proxy", 1},
        {"heldout", 0, KV_OPT_STRING, &a->heldout, "FILE", "held-out text for the end-to-end validation (default: the "
                                                         "corpus's tokens after every token the search reads)", 0},
        {"budget-bits", 'B', KV_OPT_STRING, &a->budget_list, "B[,B...]", "honest total bits per value at --context, as "
                                                                       "kvrun eval --plan reports bits_per_value_total "
                                                                       "(several: one plan per budget and context; "
                                                                       "B@N: at context N only)", 1},
        {"context", 0, KV_OPT_STRING, &a->context_list, "N[,N...]", "context(s) the bits are counted at, and the "
                                                                  "validation's --ctx (default 2048)", 0},
        {"out", 'o', KV_OPT_STRING, &a->out, "PLAN", "plan to write (atomically), for one budget and one context", 0},
        {"out-dir", 0, KV_OPT_STRING, &a->out_dir, "DIR", "instead of --out, for any number of points: the plans as "
                                                       "DIR/search-ctxN-Bbits.kvplan", 0},
        {"candidates", 0, KV_OPT_STRING, &a->cand_list, "LIST", "comma-separated candidates (default: f16,kivi2,kivi3,"
                                                             "kivi4,higgs2,higgs3,aqua2,aqua3,aqua2r32,aqua2r64,"
                                                             "aqua3r32,fp8,nvfp4; AQUA-KV ones make a chosen mix be "
                                                             "refitted)", 0},
        {"fit-tokens", 0, KV_OPT_INT, &a->fit_tokens, "N", "calibration tokens for each candidate's fit (default 16384)", 0},
        {"fit-seq-len", 0, KV_OPT_INT, &a->fit_seq, "N", "tokens per fit sequence (default min(context, 512))", 0},
        {"sens-ctx", 0, KV_OPT_INT, &a->sens_ctx, "N", "tokens per sensitivity chunk (default min(context, 512))", 0},
        {"sens-samples", 0, KV_OPT_INT, &a->sens_samples, "N", "sensitivity chunks (default 2)", 0},
        {"eval-chunks", 0, KV_OPT_INT, &a->eval_chunks, "N", "validation chunks of --context tokens (default 4)", 0},
        {"eval-tokens", 0, KV_OPT_INT, &a->eval_tokens, "N", "instead of --eval-chunks: N / context chunks at each "
                                                          "context, the tokens `kvrun eval --max-tokens N` scores", 0},
        {"predictor-inputs", 0, KV_OPT_STRING, &a->pred_inputs, "chained|free", "chained (default): an AQUA-KV "
                                                                              "stream only where its inputs are "
                                                                              "AQUA-KV streams (keys before RoPE, "
                                                                              "SEARCH.md §1.4); free: anywhere", 0},
        {"min-decode-speed", 0, KV_OPT_DOUBLE, &a->min_speed, "R", "every plan decodes at least R times the f16 "
                                                               "cache's tokens/s at its context on this machine "
                                                               "(default 0: no floor; calib/SEARCH.md §7): a "
                                                               "second budget of the knapsack, from a cost model "
                                                               "the runtime measures; each plan's speed is then "
                                                               "measured end to end", 0},
        {"select-chunks", 0, KV_OPT_INT, &a->select_chunks, "N", "selection (default 1; 0: none): per point, keep the "
                                                              "plan of least KL on N chunks of calibration text "
                                                              "at its context among the knapsack's choice, the "
                                                              "choice on context-corrected sensitivities and every "
                                                              "single method within the budget", 0},
        {"pruned", 0, KV_OPT_STRING, &a->pruned_list, "LIST", "pruned contenders for the selection, comma-separated "
                                                           "CANDIDATE@h2oF (e.g. kivi4@h2o0.125: that candidate's "
                                                           "fit with H2O keeping F of the f16 cache): measured at "
                                                           "each context, kept at a point whose budget their bits "
                                                           "fit when they measure the least KL, also where no "
                                                           "assembly fits (SEARCH.md §5.4)", 0},
        {"pruned-layers", 0, KV_OPT_STRING, &a->layer_list, "M[,M...]", "per-layer options for the pruned contenders: "
                                                                      "each layer may take any contender's candidate "
                                                                      "keeping 1 or M times its contender's fraction "
                                                                      "(at most 1), allocated per point under its "
                                                                      "budget from one-layer measurements (contexts x "
                                                                      "contenders x layers x options selection runs), "
                                                                      "then measured and kept if least (SEARCH.md "
                                                                      "§5.5)", 0},
        {"prompts", 0, KV_OPT_INT, &a->prompts, "N", "KVmix importance prompts for the proxy (default 8; 0: none)", 0},
        {"set", 0, KV_OPT_STRING, &a->set_last, "KEY=VALUE", "a fit configuration key for every candidate (repeatable), "
                                                          "e.g. cache.recent=64", 0},
        {"threads", 't', KV_OPT_INT, &a->threads, "N", "threads (default: KVCAL_THREADS or all CPUs)", 0},
        {"json", 0, KV_OPT_FLAG, &a->json, NULL, "print everything as JSON", 0},
        {NULL, 0, KV_OPT_FLAG, NULL, NULL, NULL, 0},
    };
    if (!(a->sets = kv_cli_collect(argc, argv, "set", 8, &a->n_sets)))
        return kv_cli_fail(tool, KV_ERR(KV_ENOMEM, "out of memory"));
    int rc = kv_cli_parse(&a->cli, tool,
                          "--model M --corpus FILE [--heldout FILE] --budget-bits B[,B...] (--out PLAN | --out-dir DIR) "
                          "[--context N[,N...]] [--candidates LIST] [--json] [--set key=value ...]",
                          "Choose, for every layer and stream, one of several single-method plans so that the "
                          "summed per-stream KL sensitivity is least under a budget of honest total bits per value "
                          "(codes, scales, zero points, norms, FP scales, predictors amortized, f16 sinks and "
                          "window, at --context tokens). Each candidate is fitted once (kvcal fit); a stream without "
                          "a predictor is fitted from its own layer's exact K/V, so the assembled plan is what one "
                          "mixed fit would write; a choice with AQUA-KV streams (taken only above AQUA-KV inputs, "
                          "--predictor-inputs) is refitted layer-sequentially on the mix's reconstructions. The "
                          "selection (--select-chunks) measures that choice, a choice on context-corrected "
                          "sensitivities and the single methods within the budget on calibration text at the "
                          "context and keeps the least KL. Then the plan is written and evaluated end to end on held-out text (kvrun eval --plan's "
                          "code): predicted vs measured KL, perplexity, honest bits. Several budgets and contexts "
                          "share the fits and the sensitivities: one plan per point.",
                          opts, 0, argc, argv);
    if (rc != KV_EXIT_OK) return rc;
    long min_ctx = 0;
    if ((rc = check_counts(a, opts, tool)) != KV_EXIT_OK || (rc = parse_points(a, &min_ctx, tool)) != KV_EXIT_OK)
        return rc;
    if (!a->fit_seq) a->fit_seq = min_ctx < 512 ? min_ctx : 512;
    if (!a->sens_ctx) a->sens_ctx = min_ctx < 512 ? min_ctx : 512;
    for (int k = 0; k < a->n_ctx; k++)
        if (a->sens_ctx != a->contexts[k])
            kv_log(KV_LOG_INFO, "search: sensitivities on chunks of %ld tokens, the budget and the validation at %ld: "
                   "the predicted KL is that of %ld-token chunks (--sens-ctx)", a->sens_ctx, a->contexts[k], a->sens_ctx);
    if (parse_candidates(a->cidx, &a->nc, a->cand_list ? a->cand_list : k_default_cands) != KV_OK)
        return kv_cli_usage_error(tool, "%s", kv_error_last());
    if ((rc = parse_contenders(a, tool)) != KV_EXIT_OK) return rc;
    if (a->n_pruned > 0 && a->select_chunks == 0)
        return kv_cli_usage_error(tool, "--pruned: a pruned contender enters a plan only through the selection, which "
                                  "--select-chunks 0 turns off");
    if ((rc = kv_tool_threads(tool, a->threads, &a->n_threads)) != KV_EXIT_OK) return rc;
    return check_files(a, tool);
}

/* The model, its tokenizer and the tokens the search reads (kv_search_token_need), checked before any fit. */
typedef struct search_inputs {
    kv_model_file *mf;
    kv_model *m;
    kv_tokenizer *tok;
    int32_t *ids, *ho;
    size_t n_ids, n_ho;
    char corpus_sha[65];
    kv_search_tokens need;
} search_inputs;

static void search_inputs_free(search_inputs *in) {
    free(in->ids);
    free(in->ho);
    kv_tokenizer_free(in->tok);
    kv_model_free(in->m);
    kv_model_file_close(in->mf);
}

/* The validation's tokens: --heldout's, or the corpus's after every token the search reads. Every point is validated
 * on at least one chunk of its context: checked before any fit. */
static kv_status load_heldout(search_inputs *in, const search_args *a) {
    const size_t corpus_used = in->need.corpus_used;
    size_t ho_need = 0; /* the most any point's validation reads */
    for (int p = 0; p < a->n_points; p++) {
        const size_t need = a->points[p].eval_chunks * (size_t)(a->contexts[a->points[p].ctx_index] - 1);
        ho_need = need > ho_need ? need : ho_need;
    }
    kv_status s;
    if (a->heldout) {
        if ((s = kv_tool_tokenize_file_max(&in->ho, &in->n_ho, NULL, in->tok, a->heldout, ho_need)) != KV_OK) return s;
    } else {
        in->n_ho = in->n_ids > corpus_used ? in->n_ids - corpus_used : 0;
        if (in->n_ho > 0) {
            if (!(in->ho = malloc(in->n_ho * sizeof *in->ho)))
                return KV_ERR(KV_ENOMEM, "out of memory (%zu held-out tokens)", in->n_ho);
            memcpy(in->ho, in->ids + corpus_used, in->n_ho * sizeof *in->ho);
        }
    }
    for (int k = 0; k < a->n_ctx; k++)
        if (in->n_ho < (size_t)(a->contexts[k] - 1)) {
            if (a->heldout)
                return KV_ERR(KV_EINVAL, "--heldout '%s' has %zu tokens, fewer than one validation chunk of %ld at "
                              "--context %ld: use a longer held-out text or a shorter --context", a->heldout, in->n_ho,
                              a->contexts[k] - 1, a->contexts[k]);
            return KV_ERR(KV_EINVAL, "corpus '%s' has %zu tokens: the search reads the first %zu and, without "
                          "--heldout, validates on the tokens after them, fewer than one chunk of %ld at --context "
                          "%ld: give --heldout FILE or a longer corpus", a->corpus, in->n_ids, corpus_used,
                          a->contexts[k] - 1, a->contexts[k]);
        }
    if (!a->heldout)
        kv_log(KV_LOG_INFO, "search: no --heldout: the plans are validated on the corpus's tokens %zu..%zu, after (and "
               "disjoint from) every token the fits, sensitivities, proxy and selection read", corpus_used,
               corpus_used + (in->n_ho < ho_need ? in->n_ho : ho_need));
    return KV_OK;
}

static kv_status load_inputs(search_inputs *in, const search_args *a) {
    kv_status s;
    if ((s = kv_model_file_open(&in->mf, a->model)) != KV_OK) return s;
    kv_model_options mo;
    memset(&mo, 0, sizeof mo);
    mo.n_threads = a->n_threads;
    if ((s = kv_model_load(&in->m, in->mf, &mo)) != KV_OK || (s = kv_tokenizer_load(&in->tok, in->mf, a->tokenizer)) != KV_OK ||
        (s = kv_tool_check_vocab(in->m, in->tok, a->tokenizer)) != KV_OK)
        return s;
    for (int k = 0; k < a->n_ctx; k++) kv_tool_warn_context(kv_model_arch(in->m), a->contexts[k], "--context");
    kv_search_token_need(&in->need, a->fit_tokens, a->sens_ctx, a->sens_samples, a->prompts, a->select_chunks,
                         a->max_ctx, a->n_lopt > 0);
    const kv_search_tokens *nd = &in->need;
    size_t ho_need = 0; /* without --heldout the validation reads on after the search's tokens */
    for (int p = 0; p < a->n_points && !a->heldout; p++) {
        const size_t need = a->points[p].eval_chunks * (size_t)(a->contexts[a->points[p].ctx_index] - 1);
        ho_need = need > ho_need ? need : ho_need;
    }
    if ((s = kv_tool_tokenize_file_max(&in->ids, &in->n_ids, in->corpus_sha, in->tok, a->corpus,
                                       nd->corpus_used + ho_need)) != KV_OK)
        return s;
    if (in->n_ids < (size_t)a->fit_tokens + nd->sens_need)
        return KV_ERR(KV_EINVAL, "corpus '%s' has %zu tokens; the fits take %ld and the sensitivities %zu more",
                      a->corpus, in->n_ids, a->fit_tokens, nd->sens_need);
    if (a->select_chunks > 0 && in->n_ids < (size_t)a->fit_tokens + nd->extra + nd->select_need + nd->table_need)
        return KV_ERR(KV_EINVAL, "corpus '%s' has %zu tokens; the fits take %ld, the sensitivities and the proxy %zu, "
                      "and the selection %zu more (%ld chunks of %ld tokens; --select-chunks 0: no selection)%s",
                      a->corpus, in->n_ids, a->fit_tokens, nd->extra, nd->select_need + nd->table_need,
                      a->select_chunks, a->max_ctx, nd->table_need ? ", twice with --pruned-layers" : "");
    if ((s = load_heldout(in, a)) != KV_OK) return s;
    /* the memory of the largest step, before any fit: the validation at the longest --context (the exact and the
     * compressed forward side by side: two hidden-state buffers, the f32 exact cache and at most as much for the
     * compressed one, the forward workspace over the whole chunk) */
    const kv_arch *ar = kv_model_arch(in->m);
    const double c = (double)a->max_ctx, kvd = (double)ar->n_kv_heads * ar->head_dim;
    const double est = (double)kv_model_weight_bytes(in->m) + 2.0 * c * ar->d_model * 4.0 +
                       2.0 * c * ar->n_layers * 2.0 * kvd * 4.0 + kv_model_forward_bytes(in->m, c, c) +
                       4.0 * ((double)in->n_ids + (double)in->n_ho);
    char what[160];
    snprintf(what, sizeof what, "the validation at --context %ld on this model (%d layers, %d KV heads of %d)", a->max_ctx,
             ar->n_layers, ar->n_kv_heads, ar->head_dim);
    return kv_tool_check_memory(est, what);
}

/* The name of the candidate at position c of --candidates. */
static const char *cand_name(const search_args *a, int c) {
    int nk;
    return kv_search_candidates(&nk)[a->cidx[c]].name;
}

/* The kept fraction of a layer on choice c (0: the contender's own, o + 1: option o). */
static double layer_fraction(const kv_search_pruned *pr, const kv_search_layer_opt *opts, int c) {
    return c ? kv_search_layer_budget(pr->budget, opts[c - 1].mult) : pr->budget;
}

/* The pruned contender's part of a point's text report: which one was kept, and per layer with its options. */
static void print_point_pruned(const kv_search_point *pt, const search_args *a, int n_items) {
    if (pt->selected != KV_SEARCH_KEPT_PRUNED) return;
    printf("the pruned contender %s%s: %s's own fit under H2O (the per-stream KL and bits below are the candidate's "
           "without pruning; its bits were measured)\n", a->pruned[pt->pruned].name,
           pt->layered ? " with per-layer options" : "", cand_name(a, pt->choice[0]));
    if (!pt->layered) return;
    const kv_search_layered_try *lt = &pt->layers[pt->pruned];
    printf("per layer, candidate and fraction of the f16 cache kept:");
    for (int l = 0; l < n_items / 2; l++)
        printf(" %s@%.4g", cand_name(a, pt->choice[2 * l]), layer_fraction(&a->pruned[pt->pruned], a->lopts, lt->choice[l]));
    printf("\n");
}

/* The selection's line of a point's text report. */
static void print_point_selection(const kv_search_point *pt, const search_args *a, const kv_search_result *res) {
    const int k = pt->ctx_index, np = a->n_pruned;
    const double *pr_kl = res->pruned_kl ? res->pruned_kl + k * np : NULL;
    const double *pr_bits = res->pruned_bits ? res->pruned_bits + k * np : NULL;
    if (!isfinite(pt->sel_kl[0]) && !np) return;
    printf("selection on calibration text (ctx %ld):", a->contexts[k]);
    if (isfinite(pt->sel_kl[0])) printf(" knapsack KL %.5g", pt->sel_kl[0]);
    if (isfinite(pt->sel_kl[1])) printf(", context-corrected choice %.5g", pt->sel_kl[1]);
    for (int j = 0; j < np; j++) {
        printf("%s %s KL %.5g at %.4f bits%s", j || isfinite(pt->sel_kl[0]) ? "," : "", a->pruned[j].name, pr_kl[j],
               pr_bits[j], pr_bits[j] <= pt->budget_bits ? "" : " (over the budget)");
        const kv_search_layered_try *lt = a->n_lopt > 0 ? &pt->layers[j] : NULL;
        if (lt && lt->state == KV_SEARCH_LAYERED_MEASURED)
            printf(", %s per layer KL %.5g at %.4f bits (predicted %.5g at %.4f)%s", a->pruned[j].name, lt->kl,
                   lt->bits, lt->predicted_kl, lt->predicted_bits, lt->bits <= pt->budget_bits ? "" : " (over the budget)");
    }
    printf("; kept: %s%s%s\n",
           pt->selected == KV_SEARCH_KEPT_SINGLE ? "the single method " :
           pt->selected == KV_SEARCH_KEPT_PRUNED ? "the pruned contender " : kv_search_kept_name(pt->selected),
           pt->selected == KV_SEARCH_KEPT_SINGLE ? cand_name(a, pt->single) :
           pt->selected == KV_SEARCH_KEPT_PRUNED ? a->pruned[pt->pruned].name : "",
           pt->selected == KV_SEARCH_KEPT_PRUNED && pt->layered ? " per layer" : "");
}

/* The text report of one point: per stream (one point) or a count of the choices (several). */
static void print_point_text(const kv_search_point *pt, const search_args *a, const kv_search_result *res) {
    const int nc = a->nc, n_items = res->n_items, k = pt->ctx_index;
    const long context = a->contexts[k];
    const size_t table_len = (size_t)n_items * nc;
    const uint64_t *bytes = res->bytes + table_len * k, *values = res->values + table_len * k;
    printf("\n== budget %.3f honest bits per value at context %ld", pt->budget_bits, context);
    if (!pt->feasible) {
        printf(": below the cheapest assembly of these candidates (%.4f bits)%s; no plan\n", pt->cheapest_bits,
               a->n_pruned ? " and every pruned contender's bits" : "");
        return;
    }
    printf(" (%llu bytes, unit %llu): %s\n", (unsigned long long)pt->budget_bytes, (unsigned long long)pt->unit,
           pt->path);
    if (pt->refit)
        printf("AQUA-KV streams chosen: the plan was refitted layer-sequentially on the mix's reconstructions (%.1f s)\n",
               pt->seconds_refit);
    print_point_pruned(pt, a, n_items);
    if (res->n_points == 1) {
        printf("%-6s %-2s %-8s %12s %8s   KL per candidate\n", "layer", "s", "choice", "kl", "bits");
        for (int i = 0; i < n_items; i++) {
            const size_t q = (size_t)i * nc + pt->choice[i];
            printf("%-6d %-2s %-8s %12.4g %8.3f  ", i / 2, i % 2 ? "V" : "K", cand_name(a, pt->choice[i]), res->kl[q],
                   8.0 * (double)bytes[q] / (double)values[q]);
            for (int c = 0; c < nc; c++)
                if (res->allowed[(size_t)i * nc + c]) printf(" %s=%.3g", cand_name(a, c), res->kl[(size_t)i * nc + c]);
            printf("\n");
        }
    } else {
        for (int st = 0; st < 2; st++) {
            printf("%s:", st ? "V" : "K");
            for (int c = 0; c < nc; c++) {
                int count = 0;
                for (int i = st; i < n_items; i += 2) count += pt->choice[i] == c;
                if (count) printf(" %s %d", cand_name(a, c), count);
            }
            printf("%s", st ? "\n" : ";  ");
        }
    }
    if (isfinite(pt->predicted_kl))
        printf("predicted: KL sum %.5g, honest bits %.4f\n", pt->predicted_kl, pt->predicted_bits);
    else
        printf("predicted: no KL (the sensitivities do not model pruning), honest bits %.4f (measured)\n",
               pt->predicted_bits);
    print_point_selection(pt, a, res);
    if (pt->time_budget > 0)
        printf("decode speed against the f16 cache (floor %.2fx, %s): predicted %.2fx, measured %.2fx (%.1f against "
               "%.1f tokens/s)%s\n", a->min_speed, res->device, pt->predicted_speed, pt->measured_speed, pt->plan_tps,
               pt->f16_tps, pt->measured_speed < a->min_speed ? " BELOW THE FLOOR" : "");
    printf("measured on the sensitivity tokens (ctx %ld, %ld chunks): KL %.5g, ppl %.4f (exact %.4f), bits %.4f\n",
           a->sens_ctx, a->sens_samples, pt->ev_same.cmp.kl_mean, pt->ev_same.cmp.ppl, pt->ev_same.cmp.ppl_ref,
           pt->ev_same.bits_per_value_total);
    printf("measured on held-out text (ctx %ld, %zu chunks): KL %.5g, ppl %.4f (exact %.4f, %+.2f%%), top-1 %.4f, "
           "bits_per_value_total %.4f (%.1f s)\n", context, pt->ev.cmp.n_chunks, pt->ev.cmp.kl_mean, pt->ev.cmp.ppl,
           pt->ev.cmp.ppl_ref, 100.0 * (pt->ev.cmp.ppl / pt->ev.cmp.ppl_ref - 1.0), pt->ev.cmp.top1_agreement,
           pt->ev.bits_per_value_total, pt->seconds_eval);
}

static void print_text(const search_args *a, const kv_search_result *res, double t0) {
    const int nc = a->nc;
    printf("kvcal search: %d candidate(s), %d point(s) (budget, context)%s\n", nc, res->n_points,
           res->any_predicted && strcmp(a->pred_inputs, "chained") == 0
               ? "; AQUA-KV streams only above AQUA-KV inputs (--predictor-inputs chained)" : "");
    printf("proxy (KVmix importance) vs measured KL, Spearman per candidate:");
    for (int c = 0; c < nc; c++) printf(" %s K %.3f V %.3f;", cand_name(a, c), res->rho[c], res->rho[nc + c]);
    printf("\n");
    for (int p = 0; p < res->n_points; p++) print_point_text(&res->points[p], a, res);
    printf("\ntime: fits %.1f s, bytes %.1f s, sensitivity %.1f s (%zu tokens x %d evaluations), proxy %.1f s, "
           "selection %.1f s, validation %.1f s, total %.1f s\n", res->seconds_fit, res->seconds_bytes,
           res->seconds_sens, res->sens_need, res->n_evals, res->seconds_proxy, res->seconds_select, res->seconds_eval,
           kv_now_seconds() - t0);
}

/* One pruned contender in the JSON report: per context its KL and honest bits on the selection's chunks, and with
 * per-layer options its table. */
static void print_json_pruned(int j, const search_args *a, const kv_search_result *res) {
    const int L = res->n_layers;
    printf("%s\n    {\"name\": \"%s\", \"candidate\": \"%s\", \"method\": \"%s\", \"budget\": %.9g, "
           "\"select_kl\": [", j ? "," : "", a->pruned[j].name, cand_name(a, a->pruned_pos[j]),
           kv_plan_prune_name(a->pruned[j].method), a->pruned[j].budget);
    for (int k = 0; k < a->n_ctx; k++) printf("%s%.9g", k ? ", " : "", res->pruned_kl[k * a->n_pruned + j]);
    printf("], \"bits\": [");
    for (int k = 0; k < a->n_ctx; k++) printf("%s%.9g", k ? ", " : "", res->pruned_bits[k * a->n_pruned + j]);
    printf("]");
    if (a->n_lopt > 0) { /* per context, [layer][option]: the changes with that layer alone on the option */
        printf(",\n     \"layers\": {\"kl\": [");
        for (int k = 0; k < a->n_ctx; k++) printf("%s%.9g", k ? ", " : "", res->layer_kl[k * a->n_pruned + j]);
        printf("], \"bits\": [");
        for (int k = 0; k < a->n_ctx; k++) printf("%s%.9g", k ? ", " : "", res->layer_bits[k * a->n_pruned + j]);
        printf("], \"options\": [");
        for (int o = 0; o < a->n_lopt; o++)
            printf("%s{\"candidate\": \"%s\", \"multiplier\": %.9g, \"budget\": %.9g}", o ? ", " : "",
                   cand_name(a, a->lopts[o].cand), a->lopts[o].mult,
                   kv_search_layer_budget(a->pruned[j].budget, a->lopts[o].mult));
        for (int w = 0; w < 2; w++) {
            printf("], \"%s\": [", w ? "dbits" : "dkl");
            for (int k = 0; k < a->n_ctx; k++) {
                const double *d =
                    (w ? res->layer_dbits : res->layer_dkl) + ((size_t)k * a->n_pruned + (size_t)j) * (size_t)L * a->n_lopt;
                printf("%s[", k ? ", " : "");
                for (int l = 0; l < L; l++) {
                    printf("%s[", l ? ", " : "");
                    for (int o = 0; o < a->n_lopt; o++) printf("%s%.9g", o ? ", " : "", d[(size_t)l * a->n_lopt + o]);
                    printf("]");
                }
                printf("]");
            }
        }
        printf("]}");
    }
    printf("}");
}

/* A point's selection in the JSON report: what it kept among what it measured. */
static void print_json_selection(const kv_search_point *pt, const search_args *a, const kv_search_result *res) {
    const int nc = a->nc, L = res->n_layers;
    printf("     \"selection\": {\"kept\": \"%s\", \"single\": ", kv_search_kept_name(pt->selected));
    if (pt->selected == KV_SEARCH_KEPT_SINGLE) printf("\"%s\"", cand_name(a, pt->single)); else printf("null");
    printf(", \"pruned\": ");
    if (pt->selected == KV_SEARCH_KEPT_PRUNED) printf("\"%s\"", a->pruned[pt->pruned].name); else printf("null");
    printf(", \"ctx\": %ld, \"chunks\": %ld, \"kl_knapsack\": ", a->contexts[pt->ctx_index], a->select_chunks);
    if (isfinite(pt->sel_kl[0])) printf("%.6g", pt->sel_kl[0]); else printf("null"); /* no assembly */
    printf(", \"kl_corrected\": ");
    if (isfinite(pt->sel_kl[1])) printf("%.6g", pt->sel_kl[1]); else printf("null");
    printf(", \"singles_within_budget\": [");
    for (int c = 0, first = 1; c < nc; c++) {
        const int q = pt->ctx_index * nc + c;
        if (!isfinite(res->select_single[q]) || res->single_bytes[q] > pt->budget_bytes) continue;
        printf("%s{\"name\": \"%s\", \"kl\": %.6g}", first ? "" : ", ", cand_name(a, c), res->select_single[q]);
        first = 0;
    }
    printf("], \"pruned_within_budget\": [");
    for (int j = 0, first = 1; j < a->n_pruned; j++) {
        const int q = pt->ctx_index * a->n_pruned + j;
        if (res->pruned_bits[q] > pt->budget_bits) continue;
        printf("%s{\"name\": \"%s\", \"kl\": %.9g, \"bits\": %.9g}", first ? "" : ", ", a->pruned[j].name,
               res->pruned_kl[q], res->pruned_bits[q]);
        first = 0;
    }
    printf("], \"layered\": %s, \"pruned_layers\": [", pt->layered ? "true" : "false");
    for (int j = 0; j < a->n_pruned && a->n_lopt > 0; j++) { /* §5.5: per contender, its per-layer options here */
        const kv_search_layered_try *lt = &pt->layers[j];
        printf("%s{\"name\": \"%s\", \"state\": \"%s\"", j ? ", " : "", a->pruned[j].name,
               lt->state == KV_SEARCH_LAYERED_NONE   ? "none fits"
               : lt->state == KV_SEARCH_LAYERED_SAME ? "its own"
                                           : "measured");
        if (lt->state != KV_SEARCH_LAYERED_NONE) {
            printf(", \"budgets\": [");
            for (int l = 0; l < L; l++)
                printf("%s%.9g", l ? ", " : "", layer_fraction(&a->pruned[j], a->lopts, lt->choice[l]));
            printf("], \"candidates\": [");
            for (int l = 0; l < L; l++)
                printf("%s\"%s\"", l ? ", " : "",
                       cand_name(a, lt->choice[l] ? a->lopts[lt->choice[l] - 1].cand : a->pruned_pos[j]));
            printf("], \"predicted_kl\": %.9g, \"predicted_bits\": %.9g, \"kl\": %.9g, \"bits\": %.9g",
                   lt->predicted_kl, lt->predicted_bits, lt->kl, lt->bits);
        }
        printf("}");
    }
    printf("], \"seconds\": %.3f},\n", pt->seconds_select);
}

/* One point in the JSON report (after the first, its comma). */
static void print_json_point(int p, const search_args *a, const kv_search_result *res) {
    const kv_search_point *pt = &res->points[p];
    const int n_items = res->n_items;
    printf("%s\n    {\"plan\": ", p ? "," : "");
    if (pt->feasible) kv_tool_json_string(stdout, pt->path); else printf("null");
    printf(", \"budget_bits\": %.9g, \"context\": %ld, \"feasible\": %s, \"assembly\": %s, "
           "\"cheapest_bits\": %.6f", pt->budget_bits, a->contexts[pt->ctx_index], pt->feasible ? "true" : "false",
           pt->assembly ? "true" : "false", pt->cheapest_bits);
    if (!pt->feasible) {
        printf("}");
        return;
    }
    printf(",\n     \"budget_bytes\": %llu, \"unit_bytes\": %llu, \"choices\": [",
           (unsigned long long)pt->budget_bytes, (unsigned long long)pt->unit);
    for (int i = 0; i < n_items; i++) printf("%s\"%s\"", i ? ", " : "", cand_name(a, pt->choice[i]));
    printf("],\n     \"refit\": %s, \"seconds_refit\": %.3f,\n", pt->refit ? "true" : "false",
           pt->seconds_refit);
    printf("     \"predicted\": {\"kl_sum\": ");
    if (isfinite(pt->predicted_kl)) printf("%.6g", pt->predicted_kl); else printf("null"); /* pruned */
    printf(", \"bits_per_value_total\": %.9f},\n", pt->predicted_bits);
    if (a->select_chunks > 0) print_json_selection(pt, a, res);
    if (pt->time_budget > 0) {
        printf("     \"decode_speed\": {\"floor\": %.6g, \"predicted\": %.6g, \"measured\": %.6g, "
               "\"tokens_per_second\": %.6g, \"f16_tokens_per_second\": %.6g, \"lambda\": %.6g, "
               "\"time_budget_ms\": %.6g, \"device\": ", a->min_speed, pt->predicted_speed, pt->measured_speed,
               pt->plan_tps, pt->f16_tps, pt->lambda, pt->time_budget * 1e3);
        kv_tool_json_string(stdout, res->device);
        printf("},\n");
    }
    printf("     \"measured_same_tokens\": {\"kl_mean\": %.6g, \"ppl\": %.6g, \"ppl_ref\": %.6g, "
           "\"bits_per_value_total\": %.9f, \"ctx\": %ld, \"chunks\": %ld},\n", pt->ev_same.cmp.kl_mean,
           pt->ev_same.cmp.ppl, pt->ev_same.cmp.ppl_ref, pt->ev_same.bits_per_value_total, a->sens_ctx, a->sens_samples);
    printf("     \"measured_heldout\": {\"kl_mean\": %.6g, \"ppl\": %.6g, \"ppl_ref\": %.6g, \"top1_agreement\": "
           "%.6f, \"bits_per_value_total\": %.9f, \"ctx\": %ld, \"chunks\": %zu, \"seconds\": %.3f}}",
           pt->ev.cmp.kl_mean, pt->ev.cmp.ppl, pt->ev.cmp.ppl_ref, pt->ev.cmp.top1_agreement,
           pt->ev.bits_per_value_total, a->contexts[pt->ctx_index], pt->ev.cmp.n_chunks, pt->seconds_eval);
}

static void print_json(const search_args *a, const kv_search_result *res, const kv_search_tokens *need, double t0) {
    const int nc = a->nc, n_items = res->n_items;
    const size_t table_len = (size_t)n_items * nc;
    printf("{\n  \"heldout\": ");
    if (a->heldout) kv_tool_json_string(stdout, a->heldout);
    else printf("\"corpus tokens from %zu\"", need->corpus_used);
    printf(",\n  \"budget_bits\": [");
    for (int b = 0; b < a->n_budgets; b++) printf("%s%.6g", b ? ", " : "", a->budgets[b]);
    printf("], \"contexts\": [");
    for (int k = 0; k < a->n_ctx; k++) printf("%s%ld", k ? ", " : "", a->contexts[k]);
    printf("],\n  \"candidates\": [");
    for (int c = 0; c < nc; c++) {
        printf("%s\n    {\"name\": \"%s\", \"fit_s\": %.3f, \"rho_k\": ", c ? "," : "", cand_name(a, c), res->fit_seconds[c]);
        if (isfinite(res->rho[c])) printf("%.4f", res->rho[c]); else printf("null");
        printf(", \"rho_v\": ");
        if (isfinite(res->rho[nc + c])) printf("%.4f", res->rho[nc + c]); else printf("null");
        if (a->select_chunks > 0) { /* per context: its own plan's selection KL (null: not a single method), scale */
            printf(", \"select_kl\": [");
            for (int k = 0; k < a->n_ctx; k++)
                if (isfinite(res->select_single[k * nc + c])) printf("%s%.6g", k ? ", " : "", res->select_single[k * nc + c]);
                else printf("%snull", k ? ", " : "");
            printf("], \"context_scale\": [");
            for (int k = 0; k < a->n_ctx; k++) printf("%s%.6g", k ? ", " : "", res->context_scale[k * nc + c]);
            printf("]");
        }
        printf("}");
    }
    printf("\n  ],\n  \"pruned\": [");
    for (int j = 0; j < a->n_pruned; j++) print_json_pruned(j, a, res); /* per context: KL and bits on the selection's chunks */
    printf("%s],\n  \"streams\": [", a->n_pruned ? "\n  " : "");
    for (int i = 0; i < n_items; i++) {
        printf("%s\n    {\"layer\": %d, \"stream\": \"%s\", \"kl\": [", i ? "," : "", i / 2, i % 2 ? "V" : "K");
        for (int c = 0; c < nc; c++) {
            const double v = res->kl[(size_t)i * nc + c];
            if (isfinite(v)) printf("%s%.6g", c ? ", " : "", v); else printf("%snull", c ? ", " : ""); /* not offered */
        }
        printf("], \"bits\": [");
        for (int k = 0; k < a->n_ctx; k++) {
            printf("%s[", k ? ", " : "");
            for (int c = 0; c < nc; c++) {
                const size_t q = table_len * k + (size_t)i * nc + c;
                printf("%s%.6g", c ? ", " : "", 8.0 * (double)res->bytes[q] / (double)res->values[q]);
            }
            printf("]");
        }
        printf("]");
        if (a->prompts > 0) printf(", \"importance\": %.6g", i % 2 ? res->importance.v_mean[i / 2] : res->importance.k_mean[i / 2]);
        printf("}");
    }
    printf("\n  ],\n  \"plans\": [");
    for (int p = 0; p < res->n_points; p++) print_json_point(p, a, res);
    printf("\n  ],\n  \"seconds\": {\"fits\": %.3f, \"bytes\": %.3f, \"sensitivity\": %.3f, \"proxy\": %.3f, "
           "\"selection\": %.3f, \"validation\": %.3f, \"speed\": %.3f, \"total\": %.3f},\n  \"sensitivity_tokens\": %zu,\n  "
           "\"predictor_inputs\": \"%s\"\n}\n", res->seconds_fit, res->seconds_bytes, res->seconds_sens, res->seconds_proxy,
           res->seconds_select, res->seconds_eval, res->seconds_speed,
           kv_now_seconds() - t0, res->sens_need, res->any_predicted && strcmp(a->pred_inputs, "chained") == 0 ? "chained" : "free");
}

static void search_args_free(search_args *a) {
    kv_cli_args_free(&a->cli);
    free(a->sets);
    free(a);
}

int kvcal_search(int argc, char **argv) {
    const char *tool = "kvcal search";
    search_args *a = calloc(1, sizeof *a); /* ~1 MiB of plan paths: not on the stack */
    if (!a) return kv_cli_fail(tool, KV_ERR(KV_ENOMEM, "out of memory"));
    int rc = parse_args(a, tool, argc, argv);
    if (rc != KV_EXIT_OK) {
        search_args_free(a);
        return rc < 0 ? KV_EXIT_OK : rc;
    }
    search_inputs in;
    memset(&in, 0, sizeof in);
    kv_search_result res;
    memset(&res, 0, sizeof res);
    char *gcache = kv_tool_grid_cache_dir();
    const double t0 = kv_now_seconds();
    kv_status s = load_inputs(&in, a);
    if (s == KV_OK) {
        kv_search_request req;
        memset(&req, 0, sizeof req);
        req.model = in.m, req.model_file = in.mf, req.model_path = a->model;
        req.ids = in.ids, req.n_ids = in.n_ids, req.heldout = in.ho, req.n_heldout = in.n_ho;
        req.bos = kv_tokenizer_bos(in.tok);
        req.fit_bos = kv_tokenizer_add_bos_default(in.tok) ? req.bos : -1;
        req.corpus_sha256 = in.corpus_sha, req.grid_cache_dir = gcache, req.out_dir = a->out_dir;
        req.candidates = a->cidx, req.n_candidates = a->nc;
        req.contexts = a->contexts, req.n_contexts = a->n_ctx;
        req.points = a->points, req.n_points = a->n_points;
        req.pruned = a->pruned, req.pruned_pos = a->pruned_pos, req.n_pruned = a->n_pruned;
        req.layer_opts = a->lopts, req.n_layer_opts = a->n_lopt;
        req.sets = a->sets, req.n_sets = a->n_sets;
        req.fit_tokens = a->fit_tokens, req.fit_seq_len = a->fit_seq, req.sens_ctx = a->sens_ctx;
        req.sens_samples = a->sens_samples, req.prompts = a->prompts, req.select_chunks = a->select_chunks;
        req.predictors_chained = strcmp(a->pred_inputs, "chained") == 0;
        req.min_decode_speed = a->min_speed;
        s = kv_search_run(&req, &res);
    }
    if (s == KV_OK && a->json) print_json(a, &res, &in.need, t0);
    else if (s == KV_OK) print_text(a, &res, t0);
    else rc = res.usage_error ? kv_cli_usage_error(tool, "%s", kv_error_last()) : kv_cli_fail(tool, s);
    kv_search_result_free(&res);
    search_inputs_free(&in);
    free(gcache);
    search_args_free(a);
    return rc;
}
