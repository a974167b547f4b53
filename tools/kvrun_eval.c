/* kvrun eval: perplexity of a model on a text (protocols "all" and "llama.cpp"), and with --plan the
 * cost of a compression plan on the same chunks: ppl with and without the compressed cache, KL,
 * top-1 agreement, bits per value, cache bytes and speed (eval_plan.c). */
#include "kv_tools.h"

#include <stdlib.h>
#include <string.h>

static const char *k_tool = "kvrun eval";

int kvrun_eval(int argc, char **argv) {
    const char *model = NULL, *tokp = NULL, *text = NULL, *protocol = "all", *plan = NULL;
    long ctx = 0, max_tokens = 0, batch = 1, threads = 0, prefill = 0, step = 0;
    int json = 0;
    const kv_opt opts[] = {
        {"model", 'm', KV_OPT_STRING, &model, "PATH", "model (GGUF, safetensors directory, llama2.c)", 1},
        {"tokenizer", 0, KV_OPT_STRING, &tokp, "PATH", "tokenizer (default: the model's own)", 0},
        {"text", 'f', KV_OPT_STRING, &text, "FILE", "text to evaluate (e.g. wiki.test.raw)", 1},
        {"ctx", 'c', KV_OPT_INT, &ctx, "N", "tokens per chunk, BOS included", 1},
        {"protocol", 0, KV_OPT_STRING, &protocol, "NAME",
         "all (chunks of ctx-1 tokens after BOS, all scored; default) or llama.cpp (its perplexity tool)", 0},
        {"max-tokens", 'n', KV_OPT_INT, &max_tokens, "N", "evaluate at most N tokens (whole chunks; 0 = all)", 0},
        {"plan", 'p', KV_OPT_STRING, &plan, "PLAN",
         "also run through a compressed cache applying this plan and report what it costs", 0},
        {"prefill", 0, KV_OPT_INT, &prefill, "N",
         "with --plan: tokens of a chunk's first forward step (default sinks + recent)", 0},
        {"step", 0, KV_OPT_INT, &step, "N", "with --plan: tokens per later step (default recent; 1 = decoding)", 0},
        {"batch", 'b', KV_OPT_INT, &batch, "B", "chunks per forward pass without --plan (default 1)", 0},
        {"threads", 't', KV_OPT_INT, &threads, "N", "threads, 1..4 per CPU (default: KVCAL_THREADS or all CPUs)", 0},
        {"json", 0, KV_OPT_FLAG, &json, NULL, "print the result as one JSON object", 0},
        {NULL, 0, 0, NULL, NULL, NULL, 0},
    };
    kv_cli_args args;
    int rc = kv_cli_parse(&args, k_tool, "--model M --text FILE --ctx N [--plan PLAN] [options]",
                          "Perplexity on held-out text; with --plan, the same chunks exactly and through the\n"
                          "compressed KV cache the plan describes (sinks + recent buffer in full precision).",
                          opts, 0, argc, argv);
    if (rc) return rc < 0 ? KV_EXIT_OK : rc;
    kv_cli_args_free(&args);
    kv_ppl_protocol proto;
    if (strcmp(protocol, "all") == 0)
        proto = KV_PPL_ALL;
    else if (strcmp(protocol, "llama.cpp") == 0)
        proto = KV_PPL_LLAMACPP;
    else
        return kv_cli_usage_error(k_tool, "--protocol must be 'all' or 'llama.cpp', not '%s'", protocol);
    if (ctx < 2 || ctx > (1L << 24)) return kv_cli_usage_error(k_tool, "--ctx must be in [2, 2^24]");
    if (max_tokens < 0 || batch < 1 || batch > 4096)
        return kv_cli_usage_error(k_tool, "--max-tokens >= 0, --batch in [1, 4096]");
    int n_threads = 0;
    if ((rc = kv_tool_threads(k_tool, threads, &n_threads)) != KV_EXIT_OK) return rc;
    if (plan && proto != KV_PPL_ALL) return kv_cli_usage_error(k_tool, "--plan evaluates with protocol 'all' only");
    if (prefill < 0 || step < 0 || prefill > ctx) return kv_cli_usage_error(k_tool, "--prefill in [0, ctx], --step >= 0");

    kv_model *m = NULL;
    kv_tokenizer *tok = NULL;
    int32_t *ids = NULL;
    size_t n_ids = 0;
    kv_status s;
    if ((s = kv_input_check(text)) != KV_OK) goto done; /* a device never ends: before loading anything */
    if ((s = kv_tool_open_model(&m, &tok, model, tokp, n_threads)) != KV_OK) goto done;
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
        kv_tool_plan_eval e;
        if ((s = kv_tool_eval_plan(&e, m, model, plan, ids, n_ids, (int)ctx, kv_tokenizer_bos(tok), max_chunks,
                                   (int)prefill, (int)step, "eval")) != KV_OK)
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
