/* kvcal search: one plan from several methods, a choice per (layer, stream) under a budget of honest total
 * bits per value (calib/SEARCH.md). Thin: parse, fit each candidate once (kv_fit_run), measure honest bytes
 * (kv_search_stream_bytes) and sensitivities (kv_search_sensitivity), KVmix importance as the proxy
 * (kv_importance_run, Spearman per stream), allocate (kv_search_allocate), assemble, write, and validate
 * the plan end to end with `kvrun eval --plan`'s own code (kv_tool_eval_plan). */
#define _POSIX_C_SOURCE 200809L
#include "kv_calib.h"
#include "kv_profile.h"
#include "kv_tools.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_CANDS 32

/* "a,b,c" -> candidate indices (unknown: KV_EINVAL naming the known ones; duplicates refused). */
static kv_status parse_candidates(int *idx, int *n, const char *list) {
    *n = 0;
    char buf[1024];
    snprintf(buf, sizeof buf, "%s", list);
    for (char *save = NULL, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        int k;
        kv_status s = kv_search_candidate_find(&k, t);
        if (s != KV_OK) return s;
        for (int i = 0; i < *n; i++)
            if (idx[i] == k) return KV_ERR(KV_EINVAL, "--candidates names '%s' twice", t);
        if (*n >= MAX_CANDS) return KV_ERR(KV_EINVAL, "--candidates: at most %d", MAX_CANDS);
        idx[(*n)++] = k;
    }
    if (*n == 0) return KV_ERR(KV_EINVAL, "--candidates is empty");
    return KV_OK;
}

int kvcal_search(int argc, char **argv) {
    const char *tool = "kvcal search";
    const char *model = NULL, *tokenizer = NULL, *corpus = NULL, *heldout = NULL, *out = NULL, *cand_list = NULL, *set_last = NULL;
    double budget_bits = 0;
    long context = 2048, fit_tokens = 16384, fit_seq = 0, sens_ctx = 0, sens_samples = 2, eval_chunks = 4,
         prompts = 8, threads = 0;
    int json = 0;
    const kv_opt opts[] = {
        {"model", 'm', KV_OPT_STRING, &model, "M", "model: GGUF, safetensors directory or llama2.c checkpoint", 1},
        {"tokenizer", 0, KV_OPT_STRING, &tokenizer, "T", "tokenizer (default: the model's own)", 0},
        {"corpus", 'c', KV_OPT_STRING, &corpus, "FILE", "calibration text: the fits, then (disjoint tokens) the "
                                                        "sensitivities and the importance proxy", 1},
        {"heldout", 0, KV_OPT_STRING, &heldout, "FILE", "held-out text for the end-to-end validation", 1},
        {"budget-bits", 'B', KV_OPT_DOUBLE, &budget_bits, "B", "honest total bits per value at --context, as kvrun "
                                                              "eval --plan reports bits_per_value_total", 1},
        {"context", 0, KV_OPT_INT, &context, "N", "context the bits are counted at, and the validation's --ctx "
                                                  "(default 2048)", 0},
        {"out", 'o', KV_OPT_STRING, &out, "PLAN", "plan to write (atomically)", 1},
        {"candidates", 0, KV_OPT_STRING, &cand_list, "LIST", "comma-separated candidates (default: f16,kivi2,kivi3,"
                                                             "kivi4,higgs2,higgs3,fp8,nvfp4)", 0},
        {"fit-tokens", 0, KV_OPT_INT, &fit_tokens, "N", "calibration tokens for each candidate's fit (default 16384)", 0},
        {"fit-seq-len", 0, KV_OPT_INT, &fit_seq, "N", "tokens per fit sequence (default min(context, 512))", 0},
        {"sens-ctx", 0, KV_OPT_INT, &sens_ctx, "N", "tokens per sensitivity chunk (default min(context, 512))", 0},
        {"sens-samples", 0, KV_OPT_INT, &sens_samples, "N", "sensitivity chunks (default 2)", 0},
        {"eval-chunks", 0, KV_OPT_INT, &eval_chunks, "N", "validation chunks of --context tokens (default 4)", 0},
        {"prompts", 0, KV_OPT_INT, &prompts, "N", "KVmix importance prompts for the proxy (default 8; 0: none)", 0},
        {"set", 0, KV_OPT_STRING, &set_last, "KEY=VALUE", "a fit configuration key for every candidate (repeatable), "
                                                          "e.g. cache.recent=64", 0},
        {"threads", 't', KV_OPT_INT, &threads, "N", "threads (default: KVCAL_THREADS or all CPUs)", 0},
        {"json", 0, KV_OPT_FLAG, &json, NULL, "print everything as JSON", 0},
        {NULL, 0, KV_OPT_FLAG, NULL, NULL, NULL, 0},
    };
    const char **sets = calloc((size_t)argc + 8, sizeof *sets);
    int n_sets = 0;
    if (!sets) return kv_cli_fail(tool, KV_ERR(KV_ENOMEM, "out of memory"));
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--") == 0) break;
        if (strcmp(argv[i], "--set") == 0 && i + 1 < argc) sets[n_sets++] = argv[++i];
        else if (strncmp(argv[i], "--set=", 6) == 0) sets[n_sets++] = argv[i] + 6;
    }
    kv_cli_args a;
    int rc = kv_cli_parse(&a, tool,
                          "--model M --corpus FILE --heldout FILE --budget-bits B --out PLAN [--context N] "
                          "[--candidates LIST] [--json] [--set key=value ...]",
                          "Choose, for every layer and stream, one of several single-method plans so that the "
                          "summed per-stream KL sensitivity is least under a budget of honest total bits per value "
                          "(codes, scales, zero points, norms, FP scales, predictors amortized, f16 sinks and "
                          "window, at --context tokens). Each candidate is fitted once (kvcal fit); its streams "
                          "are fitted from their own layer's exact K/V, so the assembled plan is what one mixed "
                          "fit would write. Then the plan is written and evaluated end to end on held-out text "
                          "(kvrun eval --plan's code): predicted vs measured KL, perplexity, honest bits.",
                          opts, 0, argc, argv);
    if (rc != KV_EXIT_OK) {
        free(sets);
        return rc < 0 ? KV_EXIT_OK : rc;
    }
    int cidx[MAX_CANDS], nc = 0, n_threads = 0;
    kv_model_file *mf = NULL;
    kv_model *m = NULL;
    kv_tokenizer *tok = NULL;
    int32_t *ids = NULL, *ho = NULL;
    size_t n_ids = 0, n_ho = 0;
    kv_plan *plans[MAX_CANDS] = {NULL}, *plan = NULL;
    uint64_t *bytes = NULL, *values = NULL;
    double *kl = NULL, *fit_s = NULL;
    int *choice = NULL;
    kv_importance imp;
    memset(&imp, 0, sizeof imp);
    char corpus_sha[65] = "", *gcache = kv_tool_grid_cache_dir();
    kv_status s = KV_OK;
    if (!(budget_bits > 0 && budget_bits <= 32)) {
        rc = kv_cli_usage_error(tool, "--budget-bits must be in (0, 32] (got %g)", budget_bits);
        goto end;
    }
    if (context < 2 || context > (1 << 20) || fit_tokens < 2 || sens_samples < 1 || eval_chunks < 1 || prompts < 0 ||
        (kv_cli_given(&a, opts, "fit-seq-len") && fit_seq < 2) || (kv_cli_given(&a, opts, "sens-ctx") && sens_ctx < 2)) {
        rc = kv_cli_usage_error(tool, "--context, --fit-tokens, --fit-seq-len and --sens-ctx must be >= 2, "
                                "--sens-samples and --eval-chunks >= 1, --prompts >= 0");
        goto end;
    }
    if (!fit_seq) fit_seq = context < 512 ? context : 512;
    if (!sens_ctx) sens_ctx = context < 512 ? context : 512;
    if (sens_ctx != context)
        kv_log(KV_LOG_INFO, "search: sensitivities on chunks of %ld tokens, the budget and the validation at %ld: the "
               "predicted KL is that of %ld-token chunks (--sens-ctx)", sens_ctx, context, sens_ctx);
    if ((s = parse_candidates(cidx, &nc, cand_list ? cand_list : "f16,kivi2,kivi3,kivi4,higgs2,higgs3,fp8,nvfp4")) !=
        KV_OK) {
        rc = kv_cli_usage_error(tool, "%s", kv_error_last());
        goto end;
    }
    if ((rc = kv_tool_threads(tool, threads, &n_threads)) != KV_EXIT_OK) goto end;
    {
        const kv_tool_path ins[] = {{"--model", model}, {"--tokenizer", tokenizer}, {"--corpus", corpus},
                                    {"--heldout", heldout}};
        const kv_tool_path outs[] = {{"--out", out}};
        if ((rc = kv_tool_check_io(tool, ins, 4, outs, 1)) != KV_EXIT_OK) goto end;
    }
    /* ---- model, tokens ---- */
    const double t0 = kv_now_seconds();
    if ((s = kv_model_file_open(&mf, model)) != KV_OK) goto fail;
    {
        kv_model_options mo;
        memset(&mo, 0, sizeof mo);
        mo.n_threads = n_threads;
        if ((s = kv_model_load(&m, mf, &mo)) != KV_OK) goto fail;
    }
    if ((s = kv_tokenizer_load(&tok, mf, tokenizer)) != KV_OK) goto fail;
    if ((s = kv_tool_check_vocab(m, tok, tokenizer)) != KV_OK) goto fail;
    kv_tool_warn_context(kv_model_arch(m), context, "--context");
    const size_t sens_need = (size_t)sens_samples * (size_t)(sens_ctx - 1);
    const size_t prompt_need = prompts > 0 ? (size_t)(2 * prompts) * (size_t)sens_ctx : 0; /* room to sample windows */
    const size_t extra = sens_need > prompt_need ? sens_need : prompt_need;
    if ((s = kv_tool_tokenize_file_max(&ids, &n_ids, corpus_sha, tok, corpus, (size_t)fit_tokens + extra)) != KV_OK)
        goto fail;
    if (n_ids < (size_t)fit_tokens + sens_need) {
        s = KV_ERR(KV_EINVAL, "corpus '%s' has %zu tokens; the fits take %ld and the sensitivities %zu more", corpus,
                   n_ids, fit_tokens, sens_need);
        goto fail;
    }
    if ((s = kv_tool_tokenize_file_max(&ho, &n_ho, NULL, tok, heldout, (size_t)eval_chunks * (size_t)(context - 1))) !=
        KV_OK)
        goto fail;
    const int32_t bos = kv_tokenizer_bos(tok);
    const kv_arch *arch = kv_model_arch(m);
    const int L = arch->n_layers, n_items = 2 * L;
    bytes = calloc((size_t)n_items * nc, sizeof *bytes);
    values = calloc((size_t)n_items * nc, sizeof *values);
    kl = calloc((size_t)n_items * nc, sizeof *kl);
    fit_s = calloc((size_t)nc, sizeof *fit_s);
    choice = calloc((size_t)n_items, sizeof *choice);
    if (!bytes || !values || !kl || !fit_s || !choice) {
        s = KV_ERR(KV_ENOMEM, "out of memory");
        goto fail;
    }
    /* ---- 1. fit each candidate once ---- */
    int nk;
    const kv_search_candidate *table = kv_search_candidates(&nk);
    char seq_set[64], tok_set[64];
    snprintf(seq_set, sizeof seq_set, "data.seq_len=%ld", fit_seq);
    snprintf(tok_set, sizeof tok_set, "data.max_tokens=%ld", fit_tokens);
    const char **common = calloc((size_t)n_sets + 2, sizeof *common);
    if (!common) {
        s = KV_ERR(KV_ENOMEM, "out of memory");
        goto fail;
    }
    common[0] = seq_set, common[1] = tok_set;
    for (int i = 0; i < n_sets; i++) common[2 + i] = sets[i];
    double seconds_fit = 0;
    for (int c = 0; c < nc && s == KV_OK; c++) {
        kv_fit_config cfg;
        if ((s = kv_search_candidate_config(&cfg, &table[cidx[c]], common, n_sets + 2)) != KV_OK) break;
        kv_fit_data data;
        memset(&data, 0, sizeof data);
        data.tokens = ids;
        data.n_tokens = (size_t)fit_tokens;
        data.bos_id = kv_tokenizer_add_bos_default(tok) ? bos : -1;
        kv_fit_options fo;
        kv_fit_options_init(&fo);
        fo.corpus_sha256 = corpus_sha;
        fo.grid_cache_dir = gcache;
        const double tf = kv_now_seconds();
        kv_log(KV_LOG_INFO, "search: fitting candidate %s (%s)", table[cidx[c]].name, table[cidx[c]].what);
        if ((s = kv_fit_check(&cfg, arch)) == KV_OK) s = kv_fit_run(&plans[c], NULL, m, mf, &data, &cfg, &fo);
        fit_s[c] = kv_now_seconds() - tf;
        seconds_fit += fit_s[c];
        kv_fit_config_free(&cfg);
        if (s != KV_OK) kv_error_wrap(s, "candidate %s: ", table[cidx[c]].name);
    }
    free(common);
    if (s != KV_OK) goto fail;
    /* ---- 2. honest bytes per (layer, stream, candidate) at the context ---- */
    double tb = kv_now_seconds();
    {
        uint64_t *b1 = malloc((size_t)n_items * sizeof *b1), *v1 = malloc((size_t)n_items * sizeof *v1);
        if (!b1 || !v1) s = KV_ERR(KV_ENOMEM, "out of memory");
        for (int c = 0; c < nc && s == KV_OK; c++) {
            if ((s = kv_search_stream_bytes(b1, v1, plans[c], m, (int)context)) != KV_OK) break;
            for (int i = 0; i < n_items; i++) {
                bytes[(size_t)i * nc + c] = b1[i];
                values[(size_t)i * nc + c] = v1[i];
            }
        }
        free(b1);
        free(v1);
        if (s != KV_OK) goto fail;
    }
    const double seconds_bytes = kv_now_seconds() - tb;
    /* the budget: sum of bytes <= B / 8 * values (every stream holds the same values); refused before the
     * sensitivities when even the cheapest candidates exceed it */
    uint64_t total_values = 0;
    for (int i = 0; i < n_items; i++) total_values += values[(size_t)i * nc];
    for (int i = 0; i < n_items; i++)
        for (int c = 1; c < nc; c++)
            if (values[(size_t)i * nc + c] != values[(size_t)i * nc]) {
                s = KV_ERR(KV_EINVAL, "layer %d %s: candidates hold different numbers of values (token pruning is not a "
                           "phase-1 candidate)", i / 2, i % 2 ? "V" : "K");
                goto fail;
            }
    const uint64_t budget = (uint64_t)floor(budget_bits * (double)total_values / 8.0);
    {
        uint64_t cheapest = 0;
        for (int i = 0; i < n_items; i++) {
            uint64_t mn = UINT64_MAX;
            for (int c = 0; c < nc; c++) mn = bytes[(size_t)i * nc + c] < mn ? bytes[(size_t)i * nc + c] : mn;
            cheapest += mn;
        }
        if (cheapest > budget) {
            s = KV_ERR(KV_EINVAL, "--budget-bits %g at --context %ld is below the cheapest assembly of these candidates, "
                       "%.4f honest bits per value (f16 sinks and window included; a longer context amortizes them)",
                       budget_bits, context, 8.0 * (double)cheapest / (double)total_values);
            goto fail;
        }
    }
    /* ---- 3. sensitivities on calibration tokens the fits did not see ---- */
    double seconds_sens = 0;
    const int32_t *sens_tok = ids + fit_tokens;
    const size_t n_sens_tok = n_ids - (size_t)fit_tokens;
    {
        kv_search_sens_options so = {(int)sens_ctx, (int)sens_samples, bos, "sensitivity"};
        if ((s = kv_search_sensitivity(kl, m, (const kv_plan *const *)plans, nc, sens_tok, n_sens_tok, &so,
                                       &seconds_sens)) != KV_OK)
            goto fail;
    }
    /* ---- 4. the proxy: KVmix gradient importance, Spearman vs measured KL per stream and candidate ---- */
    double seconds_proxy = 0;
    double *rho = calloc((size_t)2 * nc, sizeof *rho);
    if (!rho) {
        s = KV_ERR(KV_ENOMEM, "out of memory");
        goto fail;
    }
    for (int i = 0; i < 2 * nc; i++) rho[i] = NAN;
    if (prompts > 0) {
        kv_importance_options io = {(int)prompts, (int)sens_ctx, 0, bos, "importance", NULL};
        if ((s = kv_importance_run(&imp, m, sens_tok, n_sens_tok, &io)) != KV_OK) {
            free(rho);
            goto fail;
        }
        seconds_proxy = imp.seconds;
        double *col = malloc((size_t)L * sizeof *col);
        for (int st = 0; col && st < 2; st++)
            for (int c = 0; c < nc; c++) {
                for (int l = 0; l < L; l++) col[l] = kl[(size_t)(2 * l + st) * nc + c];
                double r;
                if (L >= 2 && kv_rank_spearman(&r, st ? imp.v_mean : imp.k_mean, col, L) == KV_OK) rho[st * nc + c] = r;
            }
        free(col);
    }
    /* ---- 5. the choice under the budget ---- */
    uint64_t unit = 0;
    if ((s = kv_search_allocate(choice, bytes, kl, NULL, n_items, nc, budget, 0, &unit)) != KV_OK) {
        kv_error_wrap(s, "--budget-bits %g at --context %ld: ", budget_bits, context);
        free(rho);
        goto fail;
    }
    double predicted_kl = 0;
    uint64_t chosen_bytes = 0;
    for (int i = 0; i < n_items; i++) {
        predicted_kl += kl[(size_t)i * nc + choice[i]];
        chosen_bytes += bytes[(size_t)i * nc + choice[i]];
    }
    const double predicted_bits = 8.0 * (double)chosen_bytes / (double)total_values;
    /* ---- 6. assemble, write, validate ---- */
    if ((s = kv_search_assemble(&plan, (const kv_plan *const *)plans, nc, choice, L)) != KV_OK) {
        free(rho);
        goto fail;
    }
    {
        kv_plan_provenance pv;
        memset(&pv, 0, sizeof pv);
        char ver[64], yaml[8192];
        snprintf(ver, sizeof ver, "kvcal %s", KV_VERSION_STRING);
        pv.tool_version = ver;
        pv.corpus_sha256 = corpus_sha;
        size_t len = (size_t)snprintf(yaml, sizeof yaml, "# kvcal search: budget %g bits at context %ld\nsearch:\n  "
                                      "budget_bits: %g\n  context: %ld\n  choices:\n", budget_bits, context,
                                      budget_bits, context);
        for (int l = 0; l < L && len < sizeof yaml; l++)
            len += (size_t)snprintf(yaml + len, sizeof yaml - len, "    - {layer: %d, key: %s, value: %s}\n", l,
                                    table[cidx[choice[2 * l]]].name, table[cidx[choice[2 * l + 1]]].name);
        pv.config_yaml = yaml;
        if ((s = kv_plan_creation_time(&pv.created)) == KV_OK) s = kv_plan_set_provenance(plan, &pv);
        if (s == KV_OK) s = kv_plan_write(plan, out, NULL);
        if (s != KV_OK) {
            free(rho);
            goto fail;
        }
    }
    kv_tool_plan_eval ev_same, ev;
    const double tv = kv_now_seconds();
    /* the additivity gap on the very tokens the sensitivities saw, then the end-to-end validation */
    if ((s = kv_tool_eval_plan(&ev_same, m, model, out, sens_tok, n_sens_tok, (int)sens_ctx, bos, (size_t)sens_samples, 0,
                               0, NULL)) != KV_OK ||
        (s = kv_tool_eval_plan(&ev, m, model, out, ho, n_ho, (int)context, bos, (size_t)eval_chunks, 0, 0,
                               "validation")) != KV_OK) {
        free(rho);
        goto fail;
    }
    const double seconds_eval = kv_now_seconds() - tv;
    /* ---- report ---- */
    if (json) {
        printf("{\n  \"plan\": ");
        kv_tool_json_string(stdout, out);
        printf(",\n  \"budget_bits\": %.6g, \"context\": %ld, \"budget_bytes\": %llu, \"unit_bytes\": %llu,\n",
               budget_bits, context, (unsigned long long)budget, (unsigned long long)unit);
        printf("  \"candidates\": [");
        for (int c = 0; c < nc; c++) {
            printf("%s\n    {\"name\": \"%s\", \"fit_s\": %.3f, \"rho_k\": ", c ? "," : "", table[cidx[c]].name, fit_s[c]);
            if (isfinite(rho[c])) printf("%.4f", rho[c]); else printf("null");
            printf(", \"rho_v\": ");
            if (isfinite(rho[nc + c])) printf("%.4f", rho[nc + c]); else printf("null");
            printf("}");
        }
        printf("\n  ],\n  \"streams\": [");
        for (int i = 0; i < n_items; i++) {
            printf("%s\n    {\"layer\": %d, \"stream\": \"%s\", \"choice\": \"%s\", \"kl\": [", i ? "," : "", i / 2,
                   i % 2 ? "V" : "K", table[cidx[choice[i]]].name);
            for (int c = 0; c < nc; c++) printf("%s%.6g", c ? ", " : "", kl[(size_t)i * nc + c]);
            printf("], \"bits\": [");
            for (int c = 0; c < nc; c++)
                printf("%s%.6g", c ? ", " : "", 8.0 * (double)bytes[(size_t)i * nc + c] / (double)values[(size_t)i * nc + c]);
            printf("]");
            if (prompts > 0) printf(", \"importance\": %.6g", i % 2 ? imp.v_mean[i / 2] : imp.k_mean[i / 2]);
            printf("}");
        }
        printf("\n  ],\n  \"predicted\": {\"kl_sum\": %.6g, \"bits_per_value_total\": %.6f},\n", predicted_kl,
               predicted_bits);
        printf("  \"measured_same_tokens\": {\"kl_mean\": %.6g, \"ppl\": %.6g, \"ppl_ref\": %.6g, \"bits_per_value_total\": "
               "%.6f, \"ctx\": %ld, \"chunks\": %ld},\n", ev_same.cmp.kl_mean, ev_same.cmp.ppl, ev_same.cmp.ppl_ref,
               ev_same.bits_per_value_total, sens_ctx, sens_samples);
        printf("  \"measured_heldout\": {\"kl_mean\": %.6g, \"ppl\": %.6g, \"ppl_ref\": %.6g, \"top1_agreement\": %.6f, "
               "\"bits_per_value_total\": %.6f, \"ctx\": %ld, \"chunks\": %zu},\n", ev.cmp.kl_mean, ev.cmp.ppl,
               ev.cmp.ppl_ref, ev.cmp.top1_agreement, ev.bits_per_value_total, context, ev.cmp.n_chunks);
        printf("  \"seconds\": {\"fits\": %.3f, \"bytes\": %.3f, \"sensitivity\": %.3f, \"proxy\": %.3f, \"validation\": "
               "%.3f, \"total\": %.3f},\n  \"sensitivity_tokens\": %zu\n}\n", seconds_fit, seconds_bytes, seconds_sens,
               seconds_proxy, seconds_eval, kv_now_seconds() - t0, sens_need);
    } else {
        printf("kvcal search: budget %.3f honest bits per value at context %ld (%llu bytes, unit %llu)\n", budget_bits,
               context, (unsigned long long)budget, (unsigned long long)unit);
        printf("%-6s %-2s %-8s %12s %8s   KL per candidate\n", "layer", "s", "choice", "kl", "bits");
        for (int i = 0; i < n_items; i++) {
            const size_t k = (size_t)i * nc + choice[i];
            printf("%-6d %-2s %-8s %12.4g %8.3f  ", i / 2, i % 2 ? "V" : "K", table[cidx[choice[i]]].name, kl[k],
                   8.0 * (double)bytes[k] / (double)values[k]);
            for (int c = 0; c < nc; c++) printf(" %s=%.3g", table[cidx[c]].name, kl[(size_t)i * nc + c]);
            printf("\n");
        }
        printf("proxy (KVmix importance) vs measured KL, Spearman per candidate:");
        for (int c = 0; c < nc; c++) printf(" %s K %.3f V %.3f;", table[cidx[c]].name, rho[c], rho[nc + c]);
        printf("\npredicted: KL sum %.5g, honest bits %.4f\n", predicted_kl, predicted_bits);
        printf("measured on the sensitivity tokens (ctx %ld, %ld chunks): KL %.5g, ppl %.4f (exact %.4f), bits %.4f\n",
               sens_ctx, sens_samples, ev_same.cmp.kl_mean, ev_same.cmp.ppl, ev_same.cmp.ppl_ref,
               ev_same.bits_per_value_total);
        printf("measured on held-out text (ctx %ld, %zu chunks): KL %.5g, ppl %.4f (exact %.4f, %+.2f%%), top-1 %.4f, "
               "bits_per_value_total %.4f\n", context, ev.cmp.n_chunks, ev.cmp.kl_mean, ev.cmp.ppl, ev.cmp.ppl_ref,
               100.0 * (ev.cmp.ppl / ev.cmp.ppl_ref - 1.0), ev.cmp.top1_agreement, ev.bits_per_value_total);
        printf("time: fits %.1f s, bytes %.1f s, sensitivity %.1f s (%zu tokens x %d evaluations), proxy %.1f s, "
               "validation %.1f s, total %.1f s\nplan written to %s\n", seconds_fit, seconds_bytes, seconds_sens,
               sens_need, n_items * nc, seconds_proxy, seconds_eval, kv_now_seconds() - t0, out);
    }
    free(rho);
    goto end;
fail:
    rc = kv_cli_fail(tool, s);
end:
    for (int c = 0; c < MAX_CANDS; c++) kv_plan_free(plans[c]);
    kv_plan_free(plan);
    kv_importance_free(&imp);
    free(bytes);
    free(values);
    free(kl);
    free(fit_s);
    free(choice);
    free(ids);
    free(ho);
    kv_tokenizer_free(tok);
    kv_model_free(m);
    kv_model_file_close(mf);
    kv_cli_args_free(&a);
    free(sets);
    free(gcache);
    return rc;
}
