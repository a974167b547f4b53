/* kvrun generate: text generation with the reference model, through the incremental path and the
 * KV-cache interface (the exact f32 cache, the runtime's f16 cache, or a plan's compressed cache):
 * prefill the prompt (in steps of --prefill-chunk tokens), then one token per step; greedy at
 * temperature 0, else temperature / top-p sampling from a seed. Text to stdout as it is produced;
 * timing to stderr. */
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

int kvrun_generate(int argc, char **argv) {
    const char *model = NULL, *tokp = NULL, *prompt = "", *weights = NULL, *plan_path = NULL, *cache_kind = NULL;
    const char *device = NULL;
    long n_new = 256, threads = 0, seed = 0, prefill_chunk = 512;
    double temp = 0.0, top_p = 1.0;
    int ignore_eos = 0;
    const kv_opt opts[] = {
        {"model", 'm', KV_OPT_STRING, &model, "PATH", "model (GGUF, safetensors directory, llama2.c)", 1},
        {"tokenizer", 0, KV_OPT_STRING, &tokp, "PATH", "tokenizer (default: the model's own)", 0},
        {"prompt", 'p', KV_OPT_STRING, &prompt, "TEXT", "text to continue (default: empty, generation from BOS)", 0},
        {"n", 'n', KV_OPT_INT, &n_new, "N", "tokens to generate at most (default 256)", 0},
        {"temp", 0, KV_OPT_DOUBLE, &temp, "T", "sampling temperature; 0 = greedy (default 0)", 0},
        {"top-p", 0, KV_OPT_DOUBLE, &top_p, "P", "nucleus sampling threshold in (0, 1]; 1 = off (default)", 0},
        {"seed", 's', KV_OPT_INT, &seed, "S", "sampling seed (default 0)", 0},
        {"ignore-eos", 0, KV_OPT_FLAG, &ignore_eos, NULL, "do not stop at end-of-generation tokens", 0},
        {"threads", 't', KV_OPT_INT, &threads, "N", "threads, 1..4 per CPU (default: KVCAL_THREADS or all CPUs)", 0},
        {"weights", 0, KV_OPT_STRING, &weights, "KIND",
         "weight storage: native (the file's blocks decoded on the fly; the CPU's default), f32, f16 (the GPU's)", 0},
        {"device", 0, KV_OPT_STRING, &device, "DEV", "cpu (default) or cuda (the model and its cache on the GPU)", 0},
        {"plan", 0, KV_OPT_STRING, &plan_path, "PLAN", "hold the KV cache compressed as this plan says (the runtime)", 0},
        {"cache", 0, KV_OPT_STRING, &cache_kind, "KIND", "without --plan: f32 (exact; the CPU's default) or f16 (the "
                                                         "runtime's f16 cache; the GPU's only one)", 0},
        {"prefill-chunk", 0, KV_OPT_INT, &prefill_chunk, "N", "prompt tokens per forward step (default 512; 0 = the "
                                                              "whole prompt at once)", 0},
        {NULL, 0, 0, NULL, NULL, NULL, 0},
    };
    kv_cli_args args;
    int rc = kv_cli_parse(&args, k_tool, "--model M [--prompt TEXT] [-n N] [--temp T] [--seed S] [options]",
                          "Generate text through the incremental decoder and the KV-cache interface.", opts, 0,
                          argc, argv);
    if (rc) return rc < 0 ? KV_EXIT_OK : rc;
    const int quiet = args.quiet;
    kv_cli_args_free(&args);
    if (n_new < 0 || n_new > (1L << 24)) return kv_cli_usage_error(k_tool, "-n must be in [0, 2^24]");
    if (prefill_chunk < 0 || prefill_chunk > (1L << 24))
        return kv_cli_usage_error(k_tool, "--prefill-chunk must be in [0, 2^24]");
    if (!(temp >= 0.0) || !(top_p > 0.0 && top_p <= 1.0) || seed < 0)
        return kv_cli_usage_error(k_tool, "--temp >= 0, --top-p in (0, 1], --seed >= 0");
    int n_threads = 0;
    if ((rc = kv_tool_threads(k_tool, threads, &n_threads)) != KV_EXIT_OK) return rc;
    kv_model_options mo;
    memset(&mo, 0, sizeof mo);
    mo.n_threads = n_threads;
    if ((rc = kv_tool_model_device(k_tool, device, weights, KV_WEIGHTS_NATIVE, &mo)) != KV_EXIT_OK) return rc;
    if (!cache_kind) cache_kind = mo.device == KV_MODEL_DEVICE_CUDA ? "f16" : "f32";
    if (strcmp(cache_kind, "f32") != 0 && strcmp(cache_kind, "f16") != 0)
        return kv_cli_usage_error(k_tool, "--cache must be f32 or f16, not '%s'", cache_kind);
    if (mo.device == KV_MODEL_DEVICE_CUDA && strcmp(cache_kind, "f32") == 0)
        return kv_cli_usage_error(k_tool, "--device cuda holds the cache in the runtime: --cache f16 or --plan");

    kv_model *m = NULL;
    kv_tokenizer *tok = NULL;
    kv_cache *cache = NULL;
    kv_plan *plan = NULL;
    int32_t *ids = NULL, *out = NULL, *stops = NULL;
    size_t n_ids = 0;
    kv_status s;
    if ((s = kv_tool_open_model_opt(&m, &tok, model, tokp, &mo)) != KV_OK) goto done;
    const int32_t bos = kv_tokenizer_bos(tok);
    /* BOS first when the vocabulary adds it, and always for an empty prompt (something to start from). */
    const unsigned flags = (bos >= 0 && (kv_tokenizer_add_bos_default(tok) || !*prompt)) ? KV_TOK_ADD_BOS : 0;
    if ((s = kv_tokenizer_encode(&ids, &n_ids, tok, prompt, strlen(prompt), flags)) != KV_OK) goto done;
    if (n_ids == 0) {
        s = KV_ERR(KV_EINVAL, "an empty prompt needs a BOS token, and this vocabulary has none");
        goto done;
    }
    const kv_arch *a = kv_model_arch(m);
    if (n_ids + (size_t)n_new > (size_t)1 << 24) {
        s = KV_ERR(KV_EINVAL, "prompt of %zu %s + %ld new is too long", n_ids, kv_tool_plural((long)n_ids, "token", "tokens"),
                   n_new);
        goto done;
    }
    kv_tool_warn_context(a, (long)n_ids + n_new, "the prompt plus -n");
    /* Stop at end-of-generation tokens (EOS, end of turn) and at BOS (a new document begins, as
     * llama2.c stops), unless --ignore-eos. */
    const int nv = kv_tokenizer_n_vocab(tok) < a->vocab_size ? kv_tokenizer_n_vocab(tok) : a->vocab_size;
    int n_stops = 0;
    stops = malloc(sizeof(int32_t) * ((size_t)nv + 1));
    out = malloc(sizeof(int32_t) * ((size_t)n_new + 1));
    if (!stops || !out) {
        s = KV_ERR(KV_ENOMEM, "out of memory");
        goto done;
    }
    if (!ignore_eos) {
        for (int32_t id = 0; id < nv; id++)
            if (kv_tokenizer_is_eog(tok, id) || id == bos) stops[n_stops++] = id;
    }
    if ((s = kv_tool_make_cache(&cache, &plan, m, model, plan_path, cache_kind, 1, (int)(n_ids + (size_t)n_new), 0)) !=
        KV_OK)
        goto done;

    fwrite(prompt, 1, strlen(prompt), stdout);
    fflush(stdout);
    stream_ctx sc = {tok, ids[n_ids - 1]};
    kv_gen_options g;
    memset(&g, 0, sizeof g);
    g.n_new = (int)n_new;
    g.temp = (float)temp;
    g.top_p = (float)top_p;
    g.seed = (uint64_t)seed;
    g.stop_ids = stops;
    g.n_stop_ids = n_stops;
    g.prefill_chunk = (int)prefill_chunk;
    int n_out = 0;
    kv_gen_stats st;
    s = kv_generate(out, &n_out, &st, m, cache, ids, (int)n_ids, &g, print_token, &sc);
    printf("\n");
    fflush(stdout);
    if (s == KV_OK && !quiet)
        fprintf(stderr, "prompt %d %s: %.1f tokens/s; generated %d %s: %.1f tokens/s (%d %s); KV cache %zu bytes (%s); "
                "peak RSS %ld KiB\n", st.n_prompt, kv_tool_plural(st.n_prompt, "token", "tokens"),
                st.prefill_seconds > 0 ? st.n_prompt / st.prefill_seconds : 0.0, st.n_generated,
                kv_tool_plural(st.n_generated, "token", "tokens"),
                st.decode_seconds > 0 && st.n_generated > 1 ? (st.n_generated - 1) / st.decode_seconds : 0.0,
                kv_model_threads(m), kv_tool_plural(kv_model_threads(m), "thread", "threads"), kv_cache_bytes(cache),
                plan_path ? "plan" : cache_kind, peak_rss_kib());
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
