/* kvrun eval: perplexity of a model on a text (protocols "all" and "llama.cpp"), and with --plan the
 * cost of a compression plan on the same chunks: ppl with and without the compressed cache, KL,
 * top-1 agreement, bits per value, cache bytes and speed (kv_eval_plan, model/eval_plan.c). Thin: the
 * options, then per protocol their checks, the model and the text loaded, one library call
 * (kv_eval_perplexity_text, kv_eval_plan_ex, kv_tool_eval_continuation, kv_tool_eval_passkey) and its report. */
#include "kv_tools.h"

#include <math.h>
#include <stdio.h>
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

/* The command line, parsed. */
typedef struct eval_args {
    const char *model, *tokp, *text, *protocol, *plan, *task, *filler, *lengths, *depths, *device, *weights,
        *predictions;
    long ctx, max_tokens, batch, threads, prefill, step, prompt_len, score_len, samples, prefill_chunk, trials, seed,
        answer_tokens;
    int json;
    kv_model_options mo; /* threads, device, weights */
} eval_args;

/* The command line into *e, with the checks every protocol shares: KV_EXIT_OK, -1 after --help, or the usage
 * error's exit code. */
static int parse_args(eval_args *e, int argc, char **argv) {
    memset(e, 0, sizeof *e);
    e->protocol = "all", e->depths = "0.1,0.5,0.9";
    e->batch = 1, e->prefill_chunk = 512, e->trials = 1, e->answer_tokens = 8;
    const kv_opt opts[] = {
        {"model", 'm', KV_OPT_STRING, &e->model, "PATH", "model (GGUF, safetensors directory, llama2.c)", 1},
        {"tokenizer", 0, KV_OPT_STRING, &e->tokp, "PATH", "tokenizer (default: the model's own)", 0},
        {"text", 'f', KV_OPT_STRING, &e->text, "FILE", "text to evaluate (e.g. wiki.test.raw)", 0},
        {"ctx", 'c', KV_OPT_INT, &e->ctx, "N", "tokens per chunk, BOS included (protocols all, llama.cpp)", 0},
        {"protocol", 0, KV_OPT_STRING, &e->protocol, "NAME",
         "all (chunks of ctx-1 tokens after BOS, all scored; default), llama.cpp (its perplexity tool), or "
         "continuation (a prompt prefilled and compressed, the next tokens scored)", 0},
        {"max-tokens", 'n', KV_OPT_INT, &e->max_tokens, "N", "evaluate at most N tokens (whole chunks; 0 = all)", 0},
        {"plan", 'p', KV_OPT_STRING, &e->plan, "PLAN",
         "also run through a compressed cache applying this plan and report what it costs", 0},
        {"prefill", 0, KV_OPT_INT, &e->prefill, "N",
         "with --plan: tokens of a chunk's first forward step (default sinks + recent)", 0},
        {"step", 0, KV_OPT_INT, &e->step, "N", "with --plan: tokens per later step (default recent; 1 = decoding)", 0},
        {"batch", 'b', KV_OPT_INT, &e->batch, "B", "chunks per forward pass without --plan (default 1)", 0},
        {"prompt-len", 0, KV_OPT_INT, &e->prompt_len, "N", "continuation: prompt tokens, BOS included", 0},
        {"score-len", 0, KV_OPT_INT, &e->score_len, "M", "continuation: tokens scored after the prompt", 0},
        {"samples", 0, KV_OPT_INT, &e->samples, "S", "continuation: at most S samples (0 = all the text holds)", 0},
        {"prefill-chunk", 0, KV_OPT_INT, &e->prefill_chunk, "N",
         "continuation, passkey: prompt tokens per forward step (default 512; 0 = the whole prompt at once)", 0},
        {"task", 0, KV_OPT_STRING, &e->task, "NAME", "passkey: retrieval of a key hidden in filler (instead of a text)", 0},
        {"filler", 0, KV_OPT_STRING, &e->filler, "FILE", "passkey: corpus the filler comes from (e.g. wiki.test.raw)", 0},
        {"length", 0, KV_OPT_STRING, &e->lengths, "N[,N...]", "passkey: prompt lengths in tokens", 0},
        {"depths", 0, KV_OPT_STRING, &e->depths, "D[,D...]", "passkey: needle depths in [0, 1] (default 0.1,0.5,0.9)", 0},
        {"trials", 0, KV_OPT_INT, &e->trials, "T", "passkey: keys per length and depth (default 1)", 0},
        {"seed", 's', KV_OPT_INT, &e->seed, "S", "passkey: seed of the keys and filler offsets (default 0)", 0},
        {"answer-tokens", 0, KV_OPT_INT, &e->answer_tokens, "N", "passkey: answer tokens generated at most (default 8)", 0},
        {"threads", 't', KV_OPT_INT, &e->threads, "N", "threads, 1..4 per CPU (default: KVCAL_THREADS or all CPUs)", 0},
        {"device", 0, KV_OPT_STRING, &e->device, "DEV", "cpu (default) or cuda: the model and its KV cache on the GPU "
                                                        "(kernels/RUNTIME.md §10)", 0},
        {"weights", 0, KV_OPT_STRING, &e->weights, "KIND", "weight storage: f32 (the CPU's default), f16 (the GPU's "
                                                           "default: f16 products accumulated in f32), native", 0},
        {"predictions", 0, KV_OPT_STRING, &e->predictions, "FILE", "with --plan: write every scored position's argmax "
                                                                   "(int32: the exact pass's, then the cache's)", 0},
        {"json", 0, KV_OPT_FLAG, &e->json, NULL, "print the result as one JSON object", 0},
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
    if (rc) return rc;
    kv_cli_args_free(&args);
    int n_threads = 0;
    if ((rc = kv_tool_threads(k_tool, e->threads, &n_threads)) != KV_EXIT_OK) return rc;
    e->mo.n_threads = n_threads;
    if ((rc = kv_tool_model_device(k_tool, e->device, e->weights, KV_WEIGHTS_F32, &e->mo)) != KV_EXIT_OK) return rc;
    if (e->prefill_chunk < 0 || e->prefill_chunk > (1L << 24))
        return kv_cli_usage_error(k_tool, "--prefill-chunk in [0, 2^24]");
    return KV_EXIT_OK;
}

/* --task passkey: its options' checks, the model, then run_passkey. */
static int eval_passkey(const eval_args *e) {
    if (strcmp(e->task, "passkey") != 0) return kv_cli_usage_error(k_tool, "--task must be 'passkey', not '%s'", e->task);
    if (!e->filler || !e->lengths) return kv_cli_usage_error(k_tool, "--task passkey needs --filler FILE and --length N");
    if (e->text || e->ctx) return kv_cli_usage_error(k_tool, "--task passkey takes --filler, not --text or --ctx");
    if (e->trials < 1 || e->trials > 10000 || e->answer_tokens < 1 || e->answer_tokens > 256)
        return kv_cli_usage_error(k_tool, "--trials in [1, 10000], --answer-tokens in [1, 256]");
    kv_model *m = NULL;
    kv_tokenizer *tok = NULL;
    kv_status s;
    int rc;
    if ((s = kv_input_check(e->filler)) != KV_OK || (s = kv_tool_open_model_opt(&m, &tok, e->model, e->tokp, &e->mo)) != KV_OK)
        rc = kv_cli_fail(k_tool, s);
    else
        rc = run_passkey(m, tok, e->model, e->plan, e->filler, e->lengths, e->depths, e->trials, e->seed,
                         e->prefill_chunk, e->answer_tokens, e->json);
    kv_tokenizer_free(tok);
    kv_model_free(m);
    return rc;
}

/* --protocol continuation: its options' checks, the model and the tokens the samples need, the evaluation. */
static int eval_continuation(const eval_args *e) {
    /* each bounded before the sum (no signed overflow) and every count fits the int it becomes */
    if (e->prompt_len < 2 || e->score_len < 1 || e->prompt_len > (1L << 24) || e->score_len > (1L << 24) ||
        e->prompt_len + e->score_len > (1L << 24))
        return kv_cli_usage_error(k_tool, "--protocol continuation needs --prompt-len N >= 2 and --score-len M >= 1, "
                                  "together at most 2^24");
    if (e->ctx || e->prefill) return kv_cli_usage_error(k_tool, "--protocol continuation takes --prompt-len, not --ctx or --prefill");
    if (e->samples < 0 || e->step < 0 || e->max_tokens < 0 || e->samples > (1L << 30) || e->step > (1L << 24) ||
        e->prefill_chunk > (1L << 24))
        return kv_cli_usage_error(k_tool, "--samples in [0, 2^30], --step and --prefill-chunk in [0, 2^24], "
                                  "--max-tokens >= 0");
    kv_model *m = NULL;
    kv_tokenizer *tok = NULL;
    int32_t *ids = NULL;
    size_t n_ids = 0;
    kv_status s;
    if ((s = kv_input_check(e->text)) != KV_OK) goto done;
    if ((s = kv_tool_open_model_opt(&m, &tok, e->model, e->tokp, &e->mo)) != KV_OK) goto done;
    kv_tool_warn_context(kv_model_arch(m), e->prompt_len + e->score_len, "--prompt-len + --score-len");
    const size_t per = (size_t)(e->prompt_len + e->score_len);
    size_t want = e->max_tokens ? (size_t)e->max_tokens : 0;
    if (e->samples && (!want || want > per * (size_t)e->samples)) want = per * (size_t)e->samples;
    if ((s = kv_tool_tokenize_file_max(&ids, &n_ids, NULL, tok, e->text, want)) != KV_OK) goto done;
    kv_tool_cont_eval r;
    if ((s = kv_tool_eval_continuation(&r, m, e->model, e->plan, ids, n_ids, kv_tokenizer_bos(tok), (int)e->prompt_len,
                                       (int)e->score_len, (int)e->step, (int)e->prefill_chunk, (size_t)e->samples,
                                       "continuation")) == KV_OK)
        kv_tool_eval_continuation_print(&r, e->json);
done:
    free(ids);
    kv_tokenizer_free(tok);
    kv_model_free(m);
    return s == KV_OK ? KV_EXIT_OK : kv_cli_fail(k_tool, s);
}

/* Protocols all and llama.cpp: their options' checks; KV_EXIT_OK with *proto, or the usage error's exit code. */
static int check_chunks(const eval_args *e, kv_ppl_protocol *proto) {
    if (!e->ctx) return kv_cli_usage_error(k_tool, "--ctx N is required for protocols all and llama.cpp");
    if (e->prompt_len || e->score_len)
        return kv_cli_usage_error(k_tool, "--prompt-len/--score-len belong to --protocol continuation");
    if (strcmp(e->protocol, "all") == 0)
        *proto = KV_PPL_ALL;
    else if (strcmp(e->protocol, "llama.cpp") == 0)
        *proto = KV_PPL_LLAMACPP;
    else
        return kv_cli_usage_error(k_tool, "--protocol must be 'all', 'llama.cpp' or 'continuation', not '%s'", e->protocol);
    if (e->ctx < 2 || e->ctx > (1L << 24)) return kv_cli_usage_error(k_tool, "--ctx must be in [2, 2^24]");
    if (e->max_tokens < 0 || e->batch < 1 || e->batch > 4096)
        return kv_cli_usage_error(k_tool, "--max-tokens >= 0, --batch in [1, 4096]");
    if (e->plan && *proto != KV_PPL_ALL) return kv_cli_usage_error(k_tool, "--plan evaluates with protocol 'all' only");
    if (e->predictions && !e->plan) return kv_cli_usage_error(k_tool, "--predictions goes with --plan");
    if (e->prefill < 0 || e->step < 0 || e->prefill > e->ctx || e->step > (1L << 24))
        return kv_cli_usage_error(k_tool, "--prefill in [0, ctx], --step in [0, 2^24]");
    return KV_EXIT_OK;
}

static void print_ppl(const kv_ppl_result *r, const eval_args *e) {
    if (e->json)
        printf("{\"ppl\": %.6f, \"nll_mean\": %.6f, \"tokens_total\": %zu, \"tokens_evaluated\": %zu, "
               "\"tokens_scored\": %zu, \"chunks\": %zu, \"tokens_per_second\": %.2f, \"protocol\": \"%s\", \"ctx\": %ld}\n",
               r->ppl, r->nll_mean, r->tokens_total, r->tokens_evaluated, r->tokens_scored, r->n_chunks,
               r->tokens_per_second, e->protocol, e->ctx);
    else
        printf("ppl %.4f (nll %.5f) over %zu scored %s in %zu %s of %ld (protocol %s; %zu %s %s); %.1f tokens/s\n",
               r->ppl, r->nll_mean, r->tokens_scored, kv_tool_plural((long)r->tokens_scored, "token", "tokens"),
               r->n_chunks, kv_tool_plural((long)r->n_chunks, "chunk", "chunks"), e->ctx, e->protocol, r->tokens_total,
               kv_tool_plural((long)r->tokens_total, "token", "tokens"),
               e->max_tokens ? "read from the text" : "in the text", r->tokens_per_second);
}

int kvrun_eval(int argc, char **argv) {
    eval_args e;
    int rc = parse_args(&e, argc, argv);
    if (rc) return rc < 0 ? KV_EXIT_OK : rc;
    if (e.task) return eval_passkey(&e);
    if (!e.text) return kv_cli_usage_error(k_tool, "--text FILE is required (or --task passkey)");
    if (strcmp(e.protocol, "continuation") == 0) return eval_continuation(&e);
    kv_ppl_protocol proto = KV_PPL_ALL;
    if ((rc = check_chunks(&e, &proto)) != KV_EXIT_OK) return rc;
    kv_model *m = NULL;
    kv_tokenizer *tok = NULL;
    int32_t *ids = NULL;
    size_t n_ids = 0;
    kv_status s;
    if ((s = kv_input_check(e.text)) != KV_OK) goto done; /* a device never ends: before loading anything */
    if ((s = kv_tool_open_model_opt(&m, &tok, e.model, e.tokp, &e.mo)) != KV_OK) goto done;
    kv_tool_warn_context(kv_model_arch(m), e.ctx, "--ctx");
    /* with --max-tokens only what the chunks can use is read and tokenized (whole chunks of ctx tokens;
     * the llama.cpp protocol's BOS is added afterwards) */
    if ((s = kv_tool_tokenize_file_max(&ids, &n_ids, NULL, tok, e.text, (size_t)e.max_tokens)) != KV_OK) goto done;
    const size_t max_chunks = e.max_tokens ? (size_t)(e.max_tokens / e.ctx) : 0;
    if (e.max_tokens && max_chunks == 0) {
        s = KV_ERR(KV_EINVAL, "--max-tokens %ld is less than one chunk of %ld tokens", e.max_tokens, e.ctx);
        goto done;
    }
    if (e.plan) {
        kv_plan_eval pe;
        if ((s = kv_eval_plan_ex(&pe, m, e.model, e.plan, ids, n_ids, (int)e.ctx, kv_tokenizer_bos(tok), max_chunks,
                                 (int)e.prefill, (int)e.step, "eval", e.predictions)) == KV_OK)
            kv_tool_eval_plan_print(&pe, e.json);
        goto done;
    }
    kv_ppl_options po;
    memset(&po, 0, sizeof po);
    po.protocol = proto, po.ctx = (int)e.ctx, po.batch = (int)e.batch, po.max_chunks = max_chunks;
    po.progress_label = "eval";
    kv_ppl_result r;
    if ((s = kv_eval_perplexity_text(&r, m, tok, ids, n_ids, &po)) == KV_OK) print_ppl(&r, &e);
done:
    free(ids);
    kv_tokenizer_free(tok);
    kv_model_free(m);
    return s == KV_OK ? KV_EXIT_OK : kv_cli_fail(k_tool, s);
}
