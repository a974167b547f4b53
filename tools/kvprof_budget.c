/* kvprof budget: the token-precision operating point of quantized pruning searched under a memory
 * budget (quantized-pruning.txt; issue 17). For every budget, selection method and precision (1x tokens
 * at 16 bits, 2x at 8, 4x at 4, 8x at 2) and the layer-wise mixes of the paper's appendix C, the plan
 * kvcal fit would write (method kivi: nothing to calibrate) is applied to the same prompts of the
 * calibration corpus with the two long-context protocols (continuation KL and ppl; passkey accuracy
 * when --passkey-length is given). Each prompt goes through the model once and is copied into every
 * plan's cache (kv_rt_prompt_copy). The best point of the target budget is written as a kvcal fit
 * configuration fragment; a table, a JSON report and an SVG chart of quality against budget. */
#define _POSIX_C_SOURCE 200809L
#include "kv_profile.h"
#include "kv_tools.h"
#include "kvrt.h"
#include "kv_calib.h"

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

/* The configuration of one point: kivi preset < --config < --set < the point's own assignments. */
static kv_status point_config(kv_fit_config *c, const char *config, const char **sets, int n_sets,
                              const kv_budget_point *pt, int n_layers) {
    kv_status s;
    if ((s = kv_fit_config_init(c)) != KV_OK) return s;
    if ((s = kv_fit_config_method_preset(c, KV_FIT_KIVI)) != KV_OK) return s;
    if (config && (s = kv_fit_config_load_file(c, config)) != KV_OK) return s;
    for (int i = 0; i < n_sets; i++)
        if ((s = kv_fit_config_set(c, sets[i])) != KV_OK) return s;
    if (pt) {
        char a[2 + 2 * 4096][64];
        const int n = kv_budget_point_assignments(pt, n_layers, a, (int)(sizeof a / sizeof a[0]));
        for (int i = 0; i < n; i++)
            if ((s = kv_fit_config_set_from(c, a[i], "kvprof budget")) != KV_OK) return s;
    }
    return kv_fit_config_validate(c);
}

int kvprof_budget(int argc, char **argv) {
    const char *model = NULL, *tokp = NULL, *corpus = NULL, *config = NULL, *set_last = NULL;
    const char *budgets_s = "0.25,0.125,0.0625", *methods_s = "snapkv,pyramidkv,h2o,streamingllm", *bits_s = "16,8,4,2";
    const char *cfg_out = NULL, *svg = NULL, *report = NULL, *depths_s = "0.1,0.5,0.9";
    double target = 0;
    long prompt_len = 1024, score_len = 64, samples = 4, prefill_chunk = 512, threads = 0, mix_base = 4, mix_ranges = 4;
    long mix_methods = 1, pk_len = 0, trials = 1, seed = 0, max_tokens = 0;
    int json = 0, no_mixes = 0;
    const kv_opt opts[] = {
        {"model", 'm', KV_OPT_STRING, &model, "PATH", "model (GGUF, safetensors directory, llama2.c)", 1},
        {"tokenizer", 0, KV_OPT_STRING, &tokp, "PATH", "tokenizer (default: the model's own)", 0},
        {"corpus", 'c', KV_OPT_STRING, &corpus, "FILE", "calibration text (e.g. wiki.valid.raw): prompts and filler", 1},
        {"budgets", 0, KV_OPT_STRING, &budgets_s, "B,...", "memory budgets, fractions of the f16 cache (default "
                                                           "0.25,0.125,0.0625)", 0},
        {"target", 0, KV_OPT_DOUBLE, &target, "B", "the budget whose best point --config-out writes (default: the "
                                                   "first of --budgets)", 0},
        {"methods", 0, KV_OPT_STRING, &methods_s, "M,...", "selection methods (default snapkv,pyramidkv,h2o,"
                                                           "streamingllm)", 0},
        {"bits", 0, KV_OPT_STRING, &bits_s, "B,...", "token precisions: 16 (f16), 8, 4, 3, 2 (default 16,8,4,2)", 0},
        {"mix-base", 0, KV_OPT_INT, &mix_base, "B", "layer-wise mixes: base precision (default 4, the paper's)", 0},
        {"mix-ranges", 0, KV_OPT_INT, &mix_ranges, "R", "layer-wise mixes: layers split into R ranges (default 4)", 0},
        {"mix-methods", 0, KV_OPT_INT, &mix_methods, "K", "layer-wise mixes for the first K methods (default 1)", 0},
        {"no-mixes", 0, KV_OPT_FLAG, &no_mixes, NULL, "uniform precisions only", 0},
        {"prompt-len", 0, KV_OPT_INT, &prompt_len, "N", "continuation: prompt tokens, BOS included (default 1024)", 0},
        {"score-len", 0, KV_OPT_INT, &score_len, "M", "continuation: tokens scored after it (default 64)", 0},
        {"samples", 0, KV_OPT_INT, &samples, "S", "continuation: samples from the corpus (default 4)", 0},
        {"passkey-length", 0, KV_OPT_INT, &pk_len, "N", "also passkey retrieval at this length (0 = not; default)", 0},
        {"depths", 0, KV_OPT_STRING, &depths_s, "D,...", "passkey depths (default 0.1,0.5,0.9)", 0},
        {"trials", 0, KV_OPT_INT, &trials, "T", "passkey keys per depth (default 1)", 0},
        {"seed", 's', KV_OPT_INT, &seed, "S", "passkey seed (default 0)", 0},
        {"prefill-chunk", 0, KV_OPT_INT, &prefill_chunk, "N", "prompt tokens per forward step (default 512)", 0},
        {"max-tokens", 0, KV_OPT_INT, &max_tokens, "N", "corpus tokens read at most (0 = what the samples need)", 0},
        {"config", 0, KV_OPT_STRING, &config, "CFG.yaml", "base kvcal fit configuration (group sizes, cache, window)", 0},
        {"set", 0, KV_OPT_STRING, &set_last, "KEY=VALUE", "override a base configuration key (repeatable)", 0},
        {"config-out", 0, KV_OPT_STRING, &cfg_out, "FILE", "the best point of --target as a kvcal fit config fragment", 0},
        {"svg", 0, KV_OPT_STRING, &svg, "FILE", "chart: continuation KL against the budget for every point", 0},
        {"report", 0, KV_OPT_STRING, &report, "FILE", "every point's measurements as JSON", 0},
        {"json", 0, KV_OPT_FLAG, &json, NULL, "print the table as JSON instead", 0},
        {"threads", 't', KV_OPT_INT, &threads, "N", "threads, 1..4 per CPU (default: KVCAL_THREADS or all CPUs)", 0},
        {NULL, 0, 0, NULL, NULL, NULL, 0},
    };
    const char **sets = calloc((size_t)argc + 1, sizeof *sets);
    int n_sets = 0;
    if (!sets) return kv_cli_fail(k_tool, KV_ERR(KV_ENOMEM, "out of memory"));
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--set") == 0 && i + 1 < argc) sets[n_sets++] = argv[++i];
        else if (strncmp(argv[i], "--set=", 6) == 0) sets[n_sets++] = argv[i] + 6;
    }
    kv_cli_args args;
    int rc = kv_cli_parse(&args, k_tool, "--model M --corpus FILE [--budgets 0.25,0.125] [--config-out FILE] [options]",
                          "Quantized pruning under a memory budget: every operating point (selection method x token\n"
                          "precision, 1x tokens at 16 bits ... 8x at 2, and layer-wise mixes) measured on the corpus\n"
                          "with the continuation protocol (and passkey), one prefill per prompt shared by all;\n"
                          "the best point of the target budget written as a kvcal fit config fragment.",
                          opts, 0, argc, argv);
    if (rc) {
        free(sets);
        return rc < 0 ? KV_EXIT_OK : rc;
    }
    kv_cli_args_free(&args);
    double budgets[MAX_LIST], dv[MAX_LIST], bv[MAX_LIST];
    int nb = 0, nd = 0, nbits = 0, nm = 0, bits[MAX_LIST];
    kv_plan_prune methods[MAX_LIST];
    kv_status s = kv_tool_parse_list(budgets, MAX_LIST, &nb, budgets_s, "--budgets");
    if (s == KV_OK) s = kv_tool_parse_list(bv, MAX_LIST, &nbits, bits_s, "--bits");
    if (s == KV_OK) s = kv_tool_parse_list(dv, MAX_LIST, &nd, depths_s, "--depths");
    if (s == KV_OK) s = parse_methods(methods, &nm, methods_s);
    if (s != KV_OK) {
        free(sets);
        return kv_cli_usage_error(k_tool, "%s", kv_error_last());
    }
    for (int i = 0; i < nbits; i++) {
        if (!(bv[i] >= 1 && bv[i] <= 32 && bv[i] == floor(bv[i]))) { /* 2.5 is not 2 */
            free(sets);
            return kv_cli_usage_error(k_tool, "--bits %g: token precisions are whole numbers of bits (16, 8, 4, 3 or "
                                      "2)", bv[i]);
        }
        bits[i] = (int)bv[i];
    }
    if (target == 0) target = budgets[0];
    int ti = -1;
    for (int i = 0; i < nb; i++)
        if (budgets[i] == target) ti = i;
    rc = KV_EXIT_OK;
    if (ti < 0) rc = kv_cli_usage_error(k_tool, "--target %g is not one of --budgets", target);
    else if (prompt_len < 2 || score_len < 1 || samples < 1 || prompt_len > (1L << 22) || score_len > (1L << 22) ||
             samples > (1L << 30) || prompt_len + score_len > (1L << 22))
        rc = kv_cli_usage_error(k_tool, "--prompt-len >= 2, --score-len >= 1 (together at most 2^22), --samples in "
                                "[1, 2^30]");
    else if (pk_len < 0 || pk_len > (1L << 22) || trials < 1 || trials > 1000 || prefill_chunk < 0 ||
             prefill_chunk > (1L << 24) || max_tokens < 0 || seed < 0)
        rc = kv_cli_usage_error(k_tool, "--passkey-length in [0, 2^22], --trials in [1, 1000], --prefill-chunk in "
                                "[0, 2^24], --max-tokens, --seed >= 0");
    for (int i = 0; i < nd && rc == KV_EXIT_OK; i++)
        if (!(dv[i] >= 0 && dv[i] <= 1)) rc = kv_cli_usage_error(k_tool, "--depths values must be in [0, 1]");
    int n_threads = 0;
    if (rc == KV_EXIT_OK) rc = kv_tool_threads(k_tool, threads, &n_threads);
    if (rc == KV_EXIT_OK) {
        const kv_tool_path ins[] = {{"--model", model}, {"--tokenizer", tokp}, {"--corpus", corpus}, {"--config", config}};
        const kv_tool_path outs[] = {{"--config-out", cfg_out}, {"--svg", svg}, {"--report", report}};
        rc = kv_tool_check_io(k_tool, ins, 4, outs, 3);
    }
    if (rc != KV_EXIT_OK) {
        free(sets);
        return rc;
    }

    kv_model *m = NULL;
    kv_tokenizer *tok = NULL;
    kv_model_file *mf = NULL;
    int32_t *ids = NULL;
    size_t n_ids = 0;
    kv_budget_point *pts = NULL;
    kv_budget_result *res = NULL;
    kv_plan **plans = NULL, *plan0 = NULL;
    kv_cache **caches = NULL, *src = NULL;
    kv_cont_result *cres = NULL;
    kv_passkey_answer *ans = NULL;
    int n = 0;
    kv_fit_config cfg;
    memset(&cfg, 0, sizeof cfg);
    if ((s = kv_input_check(corpus)) != KV_OK) goto done;
    if ((s = kv_tool_open_model(&m, &tok, model, tokp, n_threads)) != KV_OK) goto done;
    const kv_arch *a = kv_model_arch(m);
    const int L = a->n_layers;
    kv_budget_grid g = {budgets, nb, methods, nm, bits, nbits, no_mixes ? 0 : (int)mix_base,
                        (int)(mix_ranges < L ? mix_ranges : L), (int)mix_methods};
    if (g.mix_base) { /* mixes only when the base precision is one of the list */
        int in = 0;
        for (int i = 0; i < nbits; i++) in |= bits[i] == g.mix_base;
        if (!in) g.mix_base = 0;
    }
    if ((s = kv_budget_points(&pts, &n, &g, L)) != KV_OK) goto done;
    kv_plan_fingerprint fp;
    if ((s = kv_model_file_open(&mf, model)) != KV_OK || (s = kv_plan_fingerprint_compute(&fp, mf)) != KV_OK) goto done;
    /* the plans (and every refusal) before any measuring */
    plans = calloc((size_t)n, sizeof *plans);
    caches = calloc((size_t)n, sizeof *caches);
    res = calloc((size_t)n, sizeof *res);
    cres = calloc((size_t)n, sizeof *cres);
    ans = calloc((size_t)n, sizeof *ans);
    if (!plans || !caches || !res || !cres || !ans) {
        s = KV_ERR(KV_ENOMEM, "out of memory for %d operating points", n);
        goto done;
    }
    const int cap = (int)(prompt_len + score_len > pk_len + 64 ? prompt_len + score_len : pk_len + 64);
    for (int i = 0; i < n; i++) {
        kv_fit_config_free(&cfg);
        if ((s = point_config(&cfg, config, sets, n_sets, &pts[i], L)) != KV_OK ||
            (s = kv_fit_plan_uncalibrated(&plans[i], &cfg, &fp, a)) != KV_OK) {
            kv_error_wrap(s, "operating point '%s' (budget %g): ", pts[i].name, pts[i].budget);
            goto done;
        }
        if ((s = kv_cache_rt_create(&caches[i], plans[i], m, 1, cap, 0, 0)) != KV_OK) goto done;
        res[i].passkey_accuracy = NAN;
    }
    /* the prefill cache: the base configuration without pruning, holding every prompt with its statistics */
    kv_fit_config_free(&cfg);
    if ((s = point_config(&cfg, config, sets, n_sets, NULL, L)) != KV_OK) goto done;
    if ((s = kv_fit_config_set_from(&cfg, "pruning.method=none", "kvprof budget")) != KV_OK ||
        (s = kv_fit_config_set_from(&cfg, "pruning.budget=1", "kvprof budget")) != KV_OK ||
        (s = kv_fit_plan_uncalibrated(&plan0, &cfg, &fp, a)) != KV_OK)
        goto done;
    if ((s = kv_cache_rt_create(&src, plan0, m, 1, cap, 0, KV_CACHE_RT_PROMPT_STATS)) != KV_OK) goto done;
    const size_t per = (size_t)(prompt_len + score_len);
    size_t want = max_tokens ? (size_t)max_tokens : per * (size_t)samples;
    if (pk_len > 0 && want < (size_t)pk_len * 8) want = (size_t)pk_len * 8;
    if ((s = kv_tool_tokenize_file_max(&ids, &n_ids, NULL, tok, corpus, want)) != KV_OK) goto done;
    kv_log(KV_LOG_INFO, "kvprof budget: %d operating points x %ld samples of %ld + %ld tokens", n, samples, prompt_len,
           score_len);
    /* continuation */
    kv_cont_options o;
    memset(&o, 0, sizeof o);
    o.prompt_len = (int)prompt_len, o.score_len = (int)score_len, o.bos_id = kv_tokenizer_bos(tok);
    o.max_samples = (size_t)samples, o.prefill_chunk = (int)prefill_chunk, o.step = plan0->global.recent;
    o.prefill_cache = src;
    o.progress_label = "continuation";
    kv_cont_summary sum;
    double t0 = kv_now_seconds();
    if ((s = kv_eval_continuation(m, caches, n, ids, n_ids, &o, &sum, cres)) != KV_OK) goto done;
    const double t_cont = kv_now_seconds() - t0;
    for (int i = 0; i < n; i++) {
        res[i].kl_mean = cres[i].kl_mean, res[i].ppl = cres[i].ppl, res[i].top1_agreement = cres[i].top1_agreement;
        res[i].seconds = cres[i].seconds_prefill + cres[i].seconds_end_prompt + cres[i].seconds_continuation;
        kv_rt_stats st; /* after the last sample's continuation */
        if ((s = kv_rt_get_stats(kv_cache_rt_runtime(caches[i]), 0, &st)) != KV_OK) goto done;
        res[i].cache_fraction = st.values_appended ? (double)st.accounted_bytes / (2.0 * (double)st.values_appended) : 0;
    }
    /* passkey */
    if (pk_len > 0) {
        int *correct = calloc((size_t)n, sizeof *correct), total = 0;
        if (!correct) {
            s = KV_ERR(KV_ENOMEM, "out of memory");
            goto done;
        }
        kv_progress prog;
        kv_progress_begin(&prog, "passkey", "prompt", (double)(nd * trials));
        for (int di = 0; di < nd && s == KV_OK; di++)
            for (int t = 0; t < trials && s == KV_OK; t++) {
                int32_t *pk = NULL;
                int np = 0, key = 0;
                kv_passkey_options po = {(int)pk_len, dv[di], kv_rng_u64((uint64_t)seed, (uint64_t)t)};
                if ((s = kv_passkey_prompt(&pk, &np, &key, tok, ids, n_ids, &po)) != KV_OK) break;
                s = kv_eval_passkey(m, tok, caches, n, src, pk, np, key, 8, (int)prefill_chunk, ans);
                free(pk);
                for (int i = 0; i < n && s == KV_OK; i++) correct[i] += ans[i].correct;
                total++;
                kv_progress_update(&prog, (double)total);
            }
        kv_progress_end(&prog);
        for (int i = 0; i < n && s == KV_OK; i++) res[i].passkey_accuracy = (double)correct[i] / total;
        free(correct);
        if (s != KV_OK) goto done;
    }
    /* the best point of each budget */
    int best[MAX_LIST];
    for (int b = 0; b < nb; b++) {
        best[b] = -1;
        for (int i = 0; i < n; i++)
            if (pts[i].budget == budgets[b] && kv_budget_better(&res[i], best[b] >= 0 ? &res[best[b]] : NULL))
                best[b] = i;
    }
    if (json) {
        printf("{\"ppl_uncompressed\": %.6f, \"samples\": %zu, \"prompt_len\": %ld, \"score_len\": %ld, "
               "\"passkey_length\": %ld, \"points\": [", sum.ppl_ref, sum.n_samples, prompt_len, score_len, pk_len);
        for (int i = 0; i < n; i++) {
            printf("%s{\"name\": \"%s\", \"method\": \"%s\", \"budget\": %.6g, \"bits\": %d, \"range\": [%d, %d], "
                   "\"range_bits\": %d, \"kl_mean\": %.6g, \"ppl\": %.6f, \"top1_agreement\": %.6f, \"cache_fraction\": "
                   "%.6f", i ? ", " : "", pts[i].name, kv_plan_prune_name(pts[i].method), pts[i].budget, pts[i].bits,
                   pts[i].range_lo, pts[i].range_hi, pts[i].range_bits, res[i].kl_mean, res[i].ppl,
                   res[i].top1_agreement, res[i].cache_fraction);
            if (isfinite(res[i].passkey_accuracy)) printf(", \"passkey_accuracy\": %.6f", res[i].passkey_accuracy);
            int is_best = 0;
            for (int b = 0; b < nb; b++) is_best |= best[b] == i;
            printf(", \"best\": %s}", is_best ? "true" : "false");
        }
        printf("]}\n");
    } else {
        printf("uncompressed continuation ppl %.4f (%zu samples: %ld-token prompts, %ld scored tokens each; %.1f s)\n",
               sum.ppl_ref, sum.n_samples, prompt_len, score_len, t_cont);
        printf("%-8s %-40s %10s %9s %6s %8s %8s\n", "budget", "operating point", "kl_mean", "ppl", "top1", "cache",
               pk_len > 0 ? "passkey" : "");
        for (int b = 0; b < nb; b++)
            for (int i = 0; i < n; i++) {
                if (pts[i].budget != budgets[b]) continue;
                printf("1/%-6.3g %-40s %10.5g %9.4f %6.4f %8.4f", 1.0 / pts[i].budget, pts[i].name, res[i].kl_mean,
                       res[i].ppl, res[i].top1_agreement, res[i].cache_fraction);
                if (pk_len > 0) printf(" %8.3f", res[i].passkey_accuracy);
                printf("%s\n", best[b] == i ? "  <- best" : "");
            }
    }
    if (report) {
        kv_atomic_file af;
        if ((s = kv_atomic_open(&af, report)) != KV_OK) goto done;
        fprintf(af.fp, "{\"model\": ");
        kv_tool_json_string(af.fp, model);
        fprintf(af.fp, ", \"ppl_uncompressed\": %.6f, \"points\": [", sum.ppl_ref);
        for (int i = 0; i < n; i++)
            fprintf(af.fp, "%s{\"name\": \"%s\", \"budget\": %.6g, \"kl_mean\": %.6g, \"ppl\": %.6f, "
                    "\"passkey_accuracy\": %.6g}", i ? ", " : "", pts[i].name, pts[i].budget, res[i].kl_mean,
                    res[i].ppl, isfinite(res[i].passkey_accuracy) ? res[i].passkey_accuracy : -1.0);
        fprintf(af.fp, "]}\n");
        if ((s = kv_atomic_commit(&af)) != KV_OK) goto done;
    }
    if (svg) {
        char title[256];
        snprintf(title, sizeof title, "quantized pruning: %s, %zu x %ld-token prompts", a->name, sum.n_samples,
                 prompt_len);
        if ((s = kv_budget_svg_write(svg, title, pts, res, n, budgets, nb)) != KV_OK) goto done;
    }
    if (cfg_out && (s = kv_budget_config_write(cfg_out, &pts[best[ti]], &res[best[ti]], L, plan0->global.prune_window,
                                               plan0->global.prune_pool)) != KV_OK)
        goto done;
done:
    for (int i = 0; caches && i < n; i++) kv_cache_free(caches[i]);
    for (int i = 0; plans && i < n; i++) kv_plan_free(plans[i]);
    free(caches), free(plans), free(res), free(cres), free(ans), free(pts);
    kv_cache_free(src);
    kv_plan_free(plan0);
    kv_fit_config_free(&cfg);
    kv_model_file_close(mf);
    free(ids);
    free(sets);
    kv_tokenizer_free(tok);
    kv_model_free(m);
    return s == KV_OK ? KV_EXIT_OK : kv_cli_fail(k_tool, s);
}
