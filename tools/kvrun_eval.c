/* kvrun eval: perplexity of a model on a text (protocols "all" and "llama.cpp"), and with --plan the
 * cost of a compression plan on the same chunks: ppl with and without the compressed cache, KL,
 * top-1 agreement, bits per value, cache bytes and speed (kv_eval_plan, model/eval_plan.c). */
#include "kv_tools.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static const char *k_tool = "kvrun eval";

/* kvrun eval --task passkey (the model loaded; filler read here). */
static int run_passkey(kv_model *m, kv_tokenizer *tok, const char *model, const char *plan, const char *filler,
                       const char *lengths, const char *depths, long trials, long seed, long prefill_chunk,
                       long answer_tokens, int json) {
    double lv[64], dv[64];
    int nl = 0, nd = 0, len[64];
    kv_status s = kv_tool_parse_list(lv, 64, &nl, lengths, "--length");
    if (s == KV_OK) s = kv_tool_parse_list(dv, 64, &nd, depths, "--depths");
    if (s != KV_OK) return kv_cli_usage_error(k_tool, "%s", kv_error_last());
    int max_len = 0;
    for (int i = 0; i < nl; i++) {
        if (!(lv[i] >= 16 && lv[i] <= (1 << 22)) || lv[i] != floor(lv[i]))
            return kv_cli_usage_error(k_tool, "--length values must be whole numbers in [16, 2^22] (got %g)", lv[i]);
        len[i] = (int)lv[i];
        max_len = len[i] > max_len ? len[i] : max_len;
    }
    for (int i = 0; i < nd; i++)
        if (!(dv[i] >= 0.0 && dv[i] <= 1.0)) return kv_cli_usage_error(k_tool, "--depths values must be in [0, 1] (got %g)", dv[i]);
    kv_tool_warn_context(kv_model_arch(m), max_len, "--length");
    int32_t *ids = NULL;
    size_t n_ids = 0;
    /* filler: enough for distinct offsets (64 prompts' worth at most) */
    if ((s = kv_tool_tokenize_file_max(&ids, &n_ids, NULL, tok, filler, (size_t)max_len * 64)) != KV_OK) goto done;
    kv_tool_passkey_eval e;
    if ((s = kv_tool_eval_passkey(&e, m, tok, model, plan, ids, n_ids, len, nl, dv, nd, (int)trials, (uint64_t)seed,
                                  (int)prefill_chunk, (int)answer_tokens, "passkey")) == KV_OK)
        kv_tool_eval_passkey_print(&e, json);
    kv_tool_passkey_eval_free(&e);
done:
    free(ids);
    return s == KV_OK ? KV_EXIT_OK : kv_cli_fail(k_tool, s);
}

int kvrun_eval(int argc, char **argv) {
    const char *model = NULL, *tokp = NULL, *text = NULL, *protocol = "all", *plan = NULL, *task = NULL;
    const char *filler = NULL, *lengths = NULL, *depths = "0.1,0.5,0.9", *device = NULL, *weights = NULL;
    const char *predictions = NULL;
    long ctx = 0, max_tokens = 0, batch = 1, threads = 0, prefill = 0, step = 0;
    long prompt_len = 0, score_len = 0, samples = 0, prefill_chunk = 512, trials = 1, seed = 0, answer_tokens = 8;
    int json = 0;
    const kv_opt opts[] = {
        {"model", 'm', KV_OPT_STRING, &model, "PATH", "model (GGUF, safetensors directory, llama2.c)", 1},
        {"tokenizer", 0, KV_OPT_STRING, &tokp, "PATH", "tokenizer (default: the model's own)", 0},
        {"text", 'f', KV_OPT_STRING, &text, "FILE", "text to evaluate (e.g. wiki.test.raw)", 0},
        {"ctx", 'c', KV_OPT_INT, &ctx, "N", "tokens per chunk, BOS included (protocols all, llama.cpp)", 0},
        {"protocol", 0, KV_OPT_STRING, &protocol, "NAME",
         "all (chunks of ctx-1 tokens after BOS, all scored; default), llama.cpp (its perplexity tool), or "
         "continuation (a prompt prefilled and compressed, the next tokens scored)", 0},
        {"max-tokens", 'n', KV_OPT_INT, &max_tokens, "N", "evaluate at most N tokens (whole chunks; 0 = all)", 0},
        {"plan", 'p', KV_OPT_STRING, &plan, "PLAN",
         "also run through a compressed cache applying this plan and report what it costs", 0},
        {"prefill", 0, KV_OPT_INT, &prefill, "N",
         "with --plan: tokens of a chunk's first forward step (default sinks + recent)", 0},
        {"step", 0, KV_OPT_INT, &step, "N", "with --plan: tokens per later step (default recent; 1 = decoding)", 0},
        {"batch", 'b', KV_OPT_INT, &batch, "B", "chunks per forward pass without --plan (default 1)", 0},
        {"prompt-len", 0, KV_OPT_INT, &prompt_len, "N", "continuation: prompt tokens, BOS included", 0},
        {"score-len", 0, KV_OPT_INT, &score_len, "M", "continuation: tokens scored after the prompt", 0},
        {"samples", 0, KV_OPT_INT, &samples, "S", "continuation: at most S samples (0 = all the text holds)", 0},
        {"prefill-chunk", 0, KV_OPT_INT, &prefill_chunk, "N",
         "continuation, passkey: prompt tokens per forward step (default 512; 0 = the whole prompt at once)", 0},
        {"task", 0, KV_OPT_STRING, &task, "NAME", "passkey: retrieval of a key hidden in filler (instead of a text)", 0},
        {"filler", 0, KV_OPT_STRING, &filler, "FILE", "passkey: corpus the filler comes from (e.g. wiki.test.raw)", 0},
        {"length", 0, KV_OPT_STRING, &lengths, "N[,N...]", "passkey: prompt lengths in tokens", 0},
        {"depths", 0, KV_OPT_STRING, &depths, "D[,D...]", "passkey: needle depths in [0, 1] (default 0.1,0.5,0.9)", 0},
        {"trials", 0, KV_OPT_INT, &trials, "T", "passkey: keys per length and depth (default 1)", 0},
        {"seed", 's', KV_OPT_INT, &seed, "S", "passkey: seed of the keys and filler offsets (default 0)", 0},
        {"answer-tokens", 0, KV_OPT_INT, &answer_tokens, "N", "passkey: answer tokens generated at most (default 8)", 0},
        {"threads", 't', KV_OPT_INT, &threads, "N", "threads, 1..4 per CPU (default: KVCAL_THREADS or all CPUs)", 0},
        {"device", 0, KV_OPT_STRING, &device, "DEV", "cpu (default) or cuda: the model and its KV cache on the GPU "
                                                     "(kernels/RUNTIME.md §10)", 0},
        {"weights", 0, KV_OPT_STRING, &weights, "KIND", "weight storage: f32 (the CPU's default), f16 (the GPU's "
                                                        "default: f16 products accumulated in f32), native", 0},
        {"predictions", 0, KV_OPT_STRING, &predictions, "FILE", "with --plan: write every scored position's argmax "
                                                                "(int32: the exact pass's, then the cache's)", 0},
        {"json", 0, KV_OPT_FLAG, &json, NULL, "print the result as one JSON object", 0},
        {NULL, 0, 0, NULL, NULL, NULL, 0},
    };
    kv_cli_args args;
    int rc = kv_cli_parse(&args, k_tool,
                          "--model M --text FILE --ctx N [--plan PLAN] [options]\n"
                          "       kvrun eval --model M --protocol continuation --text FILE --prompt-len N --score-len M "
                          "[--plan PLAN] [options]\n"
                          "       kvrun eval --model M --task passkey --filler FILE --length N[,N...] [--depths D,...] "
                          "[--trials T] [--seed S] [--plan PLAN] [--json]",
                          "Perplexity on held-out text; with --plan, the same chunks exactly and through the\n"
                          "compressed KV cache the plan describes (sinks + recent buffer in full precision).\n"
                          "Long-context protocols (any plan; pruning plans select their tokens after the prompt):\n"
                          "continuation scores the tokens after a compressed prompt (ppl and KL against the exact\n"
                          "model on the same tokens); passkey asks for a key hidden in filler text (accuracy).",
                          opts, 0, argc, argv);
    if (rc) return rc < 0 ? KV_EXIT_OK : rc;
    kv_cli_args_free(&args);
    int n_threads = 0;
    if ((rc = kv_tool_threads(k_tool, threads, &n_threads)) != KV_EXIT_OK) return rc;
    kv_model_options mo;
    memset(&mo, 0, sizeof mo);
    mo.n_threads = n_threads;
    if ((rc = kv_tool_model_device(k_tool, device, weights, KV_WEIGHTS_F32, &mo)) != KV_EXIT_OK) return rc;
    if (prefill_chunk < 0 || prefill_chunk > (1L << 24)) return kv_cli_usage_error(k_tool, "--prefill-chunk in [0, 2^24]");
    if (task) {
        if (strcmp(task, "passkey") != 0) return kv_cli_usage_error(k_tool, "--task must be 'passkey', not '%s'", task);
        if (!filler || !lengths) return kv_cli_usage_error(k_tool, "--task passkey needs --filler FILE and --length N");
        if (text || ctx) return kv_cli_usage_error(k_tool, "--task passkey takes --filler, not --text or --ctx");
        if (trials < 1 || trials > 10000 || answer_tokens < 1 || answer_tokens > 256)
            return kv_cli_usage_error(k_tool, "--trials in [1, 10000], --answer-tokens in [1, 256]");
        kv_model *m = NULL;
        kv_tokenizer *tok = NULL;
        kv_status s;
        if ((s = kv_input_check(filler)) != KV_OK || (s = kv_tool_open_model_opt(&m, &tok, model, tokp, &mo)) != KV_OK) {
            kv_tokenizer_free(tok);
            kv_model_free(m);
            return kv_cli_fail(k_tool, s);
        }
        rc = run_passkey(m, tok, model, plan, filler, lengths, depths, trials, seed, prefill_chunk, answer_tokens, json);
        kv_tokenizer_free(tok);
        kv_model_free(m);
        return rc;
    }
    if (!text) return kv_cli_usage_error(k_tool, "--text FILE is required (or --task passkey)");
    const int continuation = strcmp(protocol, "continuation") == 0;
    if (continuation) {
        /* each bounded before the sum (no signed overflow) and every count fits the int it becomes */
        if (prompt_len < 2 || score_len < 1 || prompt_len > (1L << 24) || score_len > (1L << 24) ||
            prompt_len + score_len > (1L << 24))
            return kv_cli_usage_error(k_tool, "--protocol continuation needs --prompt-len N >= 2 and --score-len M >= 1, "
                                      "together at most 2^24");
        if (ctx || prefill) return kv_cli_usage_error(k_tool, "--protocol continuation takes --prompt-len, not --ctx or --prefill");
        if (samples < 0 || step < 0 || max_tokens < 0 || samples > (1L << 30) || step > (1L << 24) ||
            prefill_chunk > (1L << 24))
            return kv_cli_usage_error(k_tool, "--samples in [0, 2^30], --step and --prefill-chunk in [0, 2^24], "
                                      "--max-tokens >= 0");
        kv_model *m = NULL;
        kv_tokenizer *tok = NULL;
        int32_t *ids = NULL;
        size_t n_ids = 0;
        kv_status s;
        if ((s = kv_input_check(text)) != KV_OK) goto cont_done;
        if ((s = kv_tool_open_model_opt(&m, &tok, model, tokp, &mo)) != KV_OK) goto cont_done;
        kv_tool_warn_context(kv_model_arch(m), prompt_len + score_len, "--prompt-len + --score-len");
        const size_t per = (size_t)(prompt_len + score_len);
        size_t want = max_tokens ? (size_t)max_tokens : 0;
        if (samples && (!want || want > per * (size_t)samples)) want = per * (size_t)samples;
        if ((s = kv_tool_tokenize_file_max(&ids, &n_ids, NULL, tok, text, want)) != KV_OK) goto cont_done;
        kv_tool_cont_eval e;
        if ((s = kv_tool_eval_continuation(&e, m, model, plan, ids, n_ids, kv_tokenizer_bos(tok), (int)prompt_len,
                                           (int)score_len, (int)step, (int)prefill_chunk, (size_t)samples,
                                           "continuation")) == KV_OK)
            kv_tool_eval_continuation_print(&e, json);
    cont_done:
        free(ids);
        kv_tokenizer_free(tok);
        kv_model_free(m);
        return s == KV_OK ? KV_EXIT_OK : kv_cli_fail(k_tool, s);
    }
    if (!ctx) return kv_cli_usage_error(k_tool, "--ctx N is required for protocols all and llama.cpp");
    if (prompt_len || score_len) return kv_cli_usage_error(k_tool, "--prompt-len/--score-len belong to --protocol continuation");
    kv_ppl_protocol proto;
    if (strcmp(protocol, "all") == 0)
        proto = KV_PPL_ALL;
    else if (strcmp(protocol, "llama.cpp") == 0)
        proto = KV_PPL_LLAMACPP;
    else
        return kv_cli_usage_error(k_tool, "--protocol must be 'all', 'llama.cpp' or 'continuation', not '%s'", protocol);
    if (ctx < 2 || ctx > (1L << 24)) return kv_cli_usage_error(k_tool, "--ctx must be in [2, 2^24]");
    if (max_tokens < 0 || batch < 1 || batch > 4096)
        return kv_cli_usage_error(k_tool, "--max-tokens >= 0, --batch in [1, 4096]");
    if (plan && proto != KV_PPL_ALL) return kv_cli_usage_error(k_tool, "--plan evaluates with protocol 'all' only");
    if (predictions && !plan) return kv_cli_usage_error(k_tool, "--predictions goes with --plan");
    if (prefill < 0 || step < 0 || prefill > ctx || step > (1L << 24))
        return kv_cli_usage_error(k_tool, "--prefill in [0, ctx], --step in [0, 2^24]");

    kv_model *m = NULL;
    kv_tokenizer *tok = NULL;
    int32_t *ids = NULL;
    size_t n_ids = 0;
    kv_status s;
    if ((s = kv_input_check(text)) != KV_OK) goto done; /* a device never ends: before loading anything */
    if ((s = kv_tool_open_model_opt(&m, &tok, model, tokp, &mo)) != KV_OK) goto done;
    kv_tool_warn_context(kv_model_arch(m), ctx, "--ctx");
    /* with --max-tokens only what the chunks can use is read and tokenized (whole chunks of ctx tokens;
     * the llama.cpp protocol's BOS is added afterwards) */
    if ((s = kv_tool_tokenize_file_max(&ids, &n_ids, NULL, tok, text, (size_t)max_tokens)) != KV_OK) goto done;
    const size_t max_chunks = max_tokens ? (size_t)(max_tokens / ctx) : 0;
    if (max_tokens && max_chunks == 0) {
        s = KV_ERR(KV_EINVAL, "--max-tokens %ld is less than one chunk of %ld tokens", max_tokens, ctx);
        goto done;
    }
    if (plan) {
        kv_plan_eval e;
        if ((s = kv_eval_plan_ex(&e, m, model, plan, ids, n_ids, (int)ctx, kv_tokenizer_bos(tok), max_chunks,
                                      (int)prefill, (int)step, "eval", predictions)) != KV_OK)
            goto done;
        kv_tool_eval_plan_print(&e, json);
        goto done;
    }
    if (proto == KV_PPL_LLAMACPP && kv_tokenizer_add_bos_default(tok) && kv_tokenizer_bos(tok) >= 0) {
        /* llama.cpp tokenizes the text with BOS first when the vocabulary adds it */
        int32_t *with_bos = malloc(sizeof(int32_t) * (n_ids + 1));
        if (!with_bos) {
            s = KV_ERR(KV_ENOMEM, "out of memory");
            goto done;
        }
        with_bos[0] = kv_tokenizer_bos(tok);
        memcpy(with_bos + 1, ids, sizeof(int32_t) * n_ids);
        free(ids);
        ids = with_bos;
        n_ids++;
    }
    kv_ppl_options po;
    memset(&po, 0, sizeof po);
    po.protocol = proto, po.ctx = (int)ctx, po.batch = (int)batch, po.max_chunks = max_chunks;
    po.bos_id = kv_tokenizer_bos(tok);
    if (proto == KV_PPL_LLAMACPP && !kv_tokenizer_add_bos_default(tok)) po.bos_id = -1;
    po.progress_label = "eval";
    kv_ppl_result r;
    if ((s = kv_eval_perplexity(&r, m, ids, n_ids, &po)) != KV_OK) goto done;
    if (json)
        printf("{\"ppl\": %.6f, \"nll_mean\": %.6f, \"tokens_total\": %zu, \"tokens_evaluated\": %zu, "
               "\"tokens_scored\": %zu, \"chunks\": %zu, \"tokens_per_second\": %.2f, \"protocol\": \"%s\", \"ctx\": %ld}\n",
               r.ppl, r.nll_mean, r.tokens_total, r.tokens_evaluated, r.tokens_scored, r.n_chunks,
               r.tokens_per_second, protocol, ctx);
    else
        printf("ppl %.4f (nll %.5f) over %zu scored %s in %zu %s of %ld (protocol %s; %zu %s %s); %.1f tokens/s\n",
               r.ppl, r.nll_mean, r.tokens_scored, kv_tool_plural((long)r.tokens_scored, "token", "tokens"),
               r.n_chunks, kv_tool_plural((long)r.n_chunks, "chunk", "chunks"), ctx, protocol, r.tokens_total,
               kv_tool_plural((long)r.tokens_total, "token", "tokens"),
               max_tokens ? "read from the text" : "in the text", r.tokens_per_second);
done:
    free(ids);
    kv_tokenizer_free(tok);
    kv_model_free(m);
    return s == KV_OK ? KV_EXIT_OK : kv_cli_fail(k_tool, s);
}
