/* kvrun generate: text generation with the reference model, through the incremental path and the
 * KV-cache interface (the exact f32 cache, the runtime's f16 cache, or a plan's compressed cache):
 * prefill the prompt (in steps of --prefill-chunk tokens), then one token per step; greedy at
 * temperature 0, else temperature / top-p sampling from a seed. Text to stdout as it is produced;
 * timing to stderr. Thin: the options and their checks, the model, the prompt and stop tokens
 * (kv_gen_prompt_tokens, kv_gen_stop_tokens: model/generate_prompt.c), the cache, kv_generate, the timing. */
#define _POSIX_C_SOURCE 200809L
#include "kv_tools.h"

#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

static const char *k_tool = "kvrun generate";

static long peak_rss_kib(void) {
    struct rusage ru;
    return getrusage(RUSAGE_SELF, &ru) == 0 ? ru.ru_maxrss : 0;
}

typedef struct stream_ctx {
    const kv_tokenizer *tok;
    int32_t prev;
} stream_ctx;

static kv_status print_token(void *user, int32_t token) {
    stream_ctx *c = user;
    size_t len = 0;
    const char *piece = kv_tokenizer_piece_after(c->tok, c->prev, token, &len);
    if (piece && len) fwrite(piece, 1, len, stdout);
    fflush(stdout);
    c->prev = token;
    return KV_OK;
}

/* The command line, parsed. */
typedef struct gen_args {
    const char *model, *tokp, *prompt, *weights, *plan_path, *cache_kind, *device;
    long n_new, threads, seed, prefill_chunk;
    double temp, top_p;
    int ignore_eos, quiet;
    kv_model_options mo; /* threads, device, weights */
} gen_args;

/* The command line into *g, checked: KV_EXIT_OK, -1 after --help, or the usage error's exit code. */
static int parse_args(gen_args *g, int argc, char **argv) {
    memset(g, 0, sizeof *g);
    g->prompt = "", g->n_new = 256, g->prefill_chunk = 512, g->top_p = 1.0;
    const kv_opt opts[] = {
        {"model", 'm', KV_OPT_STRING, &g->model, "PATH", "model (GGUF, safetensors directory, llama2.c)", 1},
        {"tokenizer", 0, KV_OPT_STRING, &g->tokp, "PATH", "tokenizer (default: the model's own)", 0},
        {"prompt", 'p', KV_OPT_STRING, &g->prompt, "TEXT", "text to continue (default: empty, generation from BOS)", 0},
        {"n", 'n', KV_OPT_INT, &g->n_new, "N", "tokens to generate at most (default 256)", 0},
        {"temp", 0, KV_OPT_DOUBLE, &g->temp, "T", "sampling temperature; 0 = greedy (default 0)", 0},
        {"top-p", 0, KV_OPT_DOUBLE, &g->top_p, "P", "nucleus sampling threshold in (0, 1]; 1 = off (default)", 0},
        {"seed", 's', KV_OPT_INT, &g->seed, "S", "sampling seed (default 0)", 0},
        {"ignore-eos", 0, KV_OPT_FLAG, &g->ignore_eos, NULL, "do not stop at end-of-generation tokens", 0},
        {"threads", 't', KV_OPT_INT, &g->threads, "N", "threads, 1..4 per CPU (default: KVCAL_THREADS or all CPUs)", 0},
        {"weights", 0, KV_OPT_STRING, &g->weights, "KIND",
         "weight storage: native (the file's blocks decoded on the fly; the CPU's default), f32, f16 (the GPU's)", 0},
        {"device", 0, KV_OPT_STRING, &g->device, "DEV", "cpu (default) or cuda (the model and its cache on the GPU)", 0},
        {"plan", 0, KV_OPT_STRING, &g->plan_path, "PLAN", "hold the KV cache compressed as this plan says (the runtime)", 0},
        {"cache", 0, KV_OPT_STRING, &g->cache_kind, "KIND", "without --plan: f32 (exact; the CPU's default) or f16 (the "
                                                            "runtime's f16 cache; the GPU's only one)", 0},
        {"prefill-chunk", 0, KV_OPT_INT, &g->prefill_chunk, "N", "prompt tokens per forward step (default 512; 0 = the "
                                                                 "whole prompt at once)", 0},
        {NULL, 0, 0, NULL, NULL, NULL, 0},
    };
    kv_cli_args args;
    int rc = kv_cli_parse(&args, k_tool, "--model M [--prompt TEXT] [-n N] [--temp T] [--seed S] [options]",
                          "Generate text through the incremental decoder and the KV-cache interface.", opts, 0,
                          argc, argv);
    if (rc) return rc;
    g->quiet = args.quiet;
    kv_cli_args_free(&args);
    if (g->n_new < 0 || g->n_new > (1L << 24)) return kv_cli_usage_error(k_tool, "-n must be in [0, 2^24]");
    if (g->prefill_chunk < 0 || g->prefill_chunk > (1L << 24))
        return kv_cli_usage_error(k_tool, "--prefill-chunk must be in [0, 2^24]");
    if (!(g->temp >= 0.0) || !(g->top_p > 0.0 && g->top_p <= 1.0) || g->seed < 0)
        return kv_cli_usage_error(k_tool, "--temp >= 0, --top-p in (0, 1], --seed >= 0");
    int n_threads = 0;
    if ((rc = kv_tool_threads(k_tool, g->threads, &n_threads)) != KV_EXIT_OK) return rc;
    g->mo.n_threads = n_threads;
    if ((rc = kv_tool_model_device(k_tool, g->device, g->weights, KV_WEIGHTS_NATIVE, &g->mo)) != KV_EXIT_OK) return rc;
    if (!g->cache_kind) g->cache_kind = g->mo.device == KV_MODEL_DEVICE_CUDA ? "f16" : "f32";
    if (strcmp(g->cache_kind, "f32") != 0 && strcmp(g->cache_kind, "f16") != 0)
        return kv_cli_usage_error(k_tool, "--cache must be f32 or f16, not '%s'", g->cache_kind);
    if (g->mo.device == KV_MODEL_DEVICE_CUDA && strcmp(g->cache_kind, "f32") == 0)
        return kv_cli_usage_error(k_tool, "--device cuda holds the cache in the runtime: --cache f16 or --plan");
    return KV_EXIT_OK;
}

/* The timing line on stderr. */
static void print_stats(const kv_gen_stats *st, kv_model *m, const kv_cache *cache, const gen_args *g) {
    fprintf(stderr, "prompt %d %s: %.1f tokens/s; generated %d %s: %.1f tokens/s (%d %s); KV cache %zu bytes (%s); "
            "peak RSS %ld KiB\n", st->n_prompt, kv_tool_plural(st->n_prompt, "token", "tokens"),
            st->prefill_seconds > 0 ? st->n_prompt / st->prefill_seconds : 0.0, st->n_generated,
            kv_tool_plural(st->n_generated, "token", "tokens"),
            st->decode_seconds > 0 && st->n_generated > 1 ? (st->n_generated - 1) / st->decode_seconds : 0.0,
            kv_model_threads(m), kv_tool_plural(kv_model_threads(m), "thread", "threads"), kv_cache_bytes(cache),
            g->plan_path ? "plan" : g->cache_kind, peak_rss_kib());
}

int kvrun_generate(int argc, char **argv) {
    gen_args g;
    int rc = parse_args(&g, argc, argv);
    if (rc) return rc < 0 ? KV_EXIT_OK : rc;
    kv_model *m = NULL;
    kv_tokenizer *tok = NULL;
    kv_cache *cache = NULL;
    kv_plan *plan = NULL;
    int32_t *ids = NULL, *out = NULL, *stops = NULL;
    size_t n_ids = 0;
    int n_stops = 0;
    kv_status s;
    if ((s = kv_tool_open_model_opt(&m, &tok, g.model, g.tokp, &g.mo)) != KV_OK) goto done;
    if ((s = kv_gen_prompt_tokens(&ids, &n_ids, tok, g.prompt)) != KV_OK) goto done;
    const kv_arch *a = kv_model_arch(m);
    if (n_ids + (size_t)g.n_new > (size_t)1 << 24) {
        s = KV_ERR(KV_EINVAL, "prompt of %zu %s + %ld new is too long", n_ids, kv_tool_plural((long)n_ids, "token", "tokens"),
                   g.n_new);
        goto done;
    }
    kv_tool_warn_context(a, (long)n_ids + g.n_new, "the prompt plus -n");
    /* Stop at end-of-generation tokens (EOS, end of turn) and at BOS, unless --ignore-eos. */
    if (!g.ignore_eos && (s = kv_gen_stop_tokens(&stops, &n_stops, tok, a->vocab_size)) != KV_OK) goto done;
    if (!(out = malloc(sizeof(int32_t) * ((size_t)g.n_new + 1)))) {
        s = KV_ERR(KV_ENOMEM, "out of memory");
        goto done;
    }
    if ((s = kv_tool_make_cache(&cache, &plan, m, g.model, g.plan_path, g.cache_kind, 1,
                                (int)(n_ids + (size_t)g.n_new), 0)) != KV_OK)
        goto done;
    fwrite(g.prompt, 1, strlen(g.prompt), stdout);
    fflush(stdout);
    stream_ctx sc = {tok, ids[n_ids - 1]};
    kv_gen_options go;
    memset(&go, 0, sizeof go);
    go.n_new = (int)g.n_new, go.temp = (float)g.temp, go.top_p = (float)g.top_p, go.seed = (uint64_t)g.seed;
    go.stop_ids = stops, go.n_stop_ids = n_stops, go.prefill_chunk = (int)g.prefill_chunk;
    int n_out = 0;
    kv_gen_stats st;
    s = kv_generate(out, &n_out, &st, m, cache, ids, (int)n_ids, &go, print_token, &sc);
    printf("\n");
    fflush(stdout);
    if (s == KV_OK && !g.quiet) print_stats(&st, m, cache, &g);
done:
    free(ids);
    free(out);
    free(stops);
    kv_cache_free(cache);
    kv_plan_free(plan);
    kv_tokenizer_free(tok);
    kv_model_free(m);
    return s == KV_OK ? KV_EXIT_OK : kv_cli_fail(k_tool, s);
}
