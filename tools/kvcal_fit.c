/* kvcal fit: calibrate a compression plan (AQUA-KV and baselines) on a text corpus. Thin: parse,
 * resolve the configuration (defaults < method preset < config file < flags < --set; the lower layers
 * are kv_fit_config_base), tokenize, call kv_fit_run_job (calib/fit_job.c: XQuant's probe, kv_fit_run),
 * print the held-out metrics. calib/FIT.md documents the procedure.
 * Under mpirun every rank runs this with the same arguments (kv_dist): rank 0 prints and writes,
 * the others only report errors that are theirs alone (carried to rank 0 by kv_dist_agree). */
#define _POSIX_C_SOURCE 200809L
#include "kv_calib.h"
#include "kv_tools.h"

#include <ctype.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static volatile sig_atomic_t g_interrupt;

static void on_signal(int sig) {
    (void)sig;
    g_interrupt = 1;
}

/* The commit the binary was built from: $KVCAL_GIT_HASH when set (may be empty), else
 * `git rev-parse HEAD` run in the executable's directory (a build tree inside the checkout), else "".
 * Only a 40-hex-digit answer is kept (PLAN_FORMAT.md §6.7). */
static void git_hash(char out[41]) {
    out[0] = '\0';
    const char *env = getenv("KVCAL_GIT_HASH");
    char buf[128] = "";
    if (env) {
        snprintf(buf, sizeof buf, "%s", env);
    } else {
        char exe[4096];
        const ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
        if (n <= 0) return;
        exe[n] = '\0';
        char *slash = strrchr(exe, '/');
        if (!slash) return;
        *slash = '\0';
        char cmd[4300];
        snprintf(cmd, sizeof cmd, "git -C '%s' rev-parse HEAD 2>/dev/null", exe);
        if (strchr(exe, '\'')) return;
        FILE *p = popen(cmd, "r");
        if (!p) return;
        if (!fgets(buf, sizeof buf, p)) buf[0] = '\0';
        pclose(p);
    }
    size_t k = 0;
    while (k < 40 && isxdigit((unsigned char)buf[k])) k++;
    if (k == 40 && (buf[40] == '\0' || buf[40] == '\n')) {
        for (int i = 0; i < 40; i++) out[i] = (char)tolower((unsigned char)buf[i]);
        out[40] = '\0';
    }
}

/* Where generated HIGGS grids are kept between runs: $KVCAL_GRID_CACHE ("" = no cache), else
 * $XDG_CACHE_HOME/kvcal/grids, else $HOME/.cache/kvcal/grids. Malloc'd or NULL. */
char *kv_tool_grid_cache_dir(void) {
    const char *env = getenv("KVCAL_GRID_CACHE");
    char buf[4096];
    if (env) {
        if (!*env) return NULL;
        snprintf(buf, sizeof buf, "%s", env);
    } else if (getenv("XDG_CACHE_HOME") && *getenv("XDG_CACHE_HOME")) {
        snprintf(buf, sizeof buf, "%s/kvcal/grids", getenv("XDG_CACHE_HOME"));
    } else if (getenv("HOME") && *getenv("HOME")) {
        snprintf(buf, sizeof buf, "%s/.cache/kvcal/grids", getenv("HOME"));
    } else {
        return NULL;
    }
    char *d = malloc(strlen(buf) + 1);
    if (d) strcpy(d, buf);
    return d;
}

static kv_status set_string(char **dst, const char *v) {
    char *c = malloc(strlen(v) + 1);
    if (!c) return KV_ERR(KV_ENOMEM, "out of memory");
    strcpy(c, v);
    free(*dst);
    *dst = c;
    return KV_OK;
}

/* The command line, parsed and checked. */
typedef struct fit_args {
    const char *model, *tokenizer, *corpus, *heldout, *config, *out, *method, *set_last, *granularity, *target_bits;
    long bits, seq_len, max_tokens, seed, threads;
    int json, no_ckpt, bench;
    int given_bits, given_seq_len, given_max_tokens, given_seed;
    int method_id, n_threads;
    const char **sets; /* every --set, in order (owned) */
    int n_sets;
} fit_args;

/* The options' checks that need no configuration: KV_EXIT_OK or the usage error's exit code. */
static int check_flags(fit_args *f, const char *tool) {
    if (f->method && (f->method_id = kv_fit_method_from_name(f->method)) < 0) {
        char known[256] = ""; /* "aqua, ..., xquant or squat": the methods' table (formats/config.c) */
        for (int k = 0; k < KV_FIT_METHOD_COUNT; k++) {
            const size_t len = strlen(known);
            snprintf(known + len, sizeof known - len, "%s%s", k == 0 ? "" : k + 1 < KV_FIT_METHOD_COUNT ? ", " : " or ",
                     kv_fit_method_name(k));
        }
        return kv_cli_usage_error(tool, "--method must be %s (got '%s')", known, f->method);
    }
    if (f->granularity && strcmp(f->granularity, "tensor") != 0 && strcmp(f->granularity, "head") != 0)
        return kv_cli_usage_error(tool, "--scale-granularity must be tensor or head (got '%s')", f->granularity);
    /* --bits is keys.bits and values.bits together: the same range as those keys here, and the method's own limits
     * (uniform codes 1, 2, 3, 4 or 8 bits; HIGGS grids bits x d <= 16; 16 = f16 for kivi only) from the configuration's
     * validation below, before any work, with the method named */
    if (f->given_bits &&
        !((f->bits >= KV_FIT_MIN_BITS && f->bits <= KV_FIT_MAX_BITS) || f->bits == KV_FIT_F16_BITS))
        return kv_cli_usage_error(tool, "--bits must be in %d..%d or 16 (got %ld): uniform methods (kivi, xquant, squat, "
                                  "aqua-uniform) take 1, 2, 3, 4 or 8, higgs and aqua 1..8, 16 keeps kivi streams in f16",
                                  KV_FIT_MIN_BITS, KV_FIT_MAX_BITS, f->bits);
    if (f->given_seq_len && (f->seq_len < 2 || f->seq_len > (1 << 20)))
        return kv_cli_usage_error(tool, "--seq-len must be in 2..1048576 (got %ld)", f->seq_len);
    if (f->given_max_tokens && f->max_tokens < 0)
        return kv_cli_usage_error(tool, "--max-tokens must be >= 0 (got %ld)", f->max_tokens);
    if (f->given_seed && f->seed < 0) return kv_cli_usage_error(tool, "--seed must be >= 0 (got %ld)", f->seed);
    return kv_tool_threads(tool, f->threads, &f->n_threads);
}

/* The command line into *f (f->sets freed by the caller): KV_EXIT_OK, -1 after --help, or the usage error's exit
 * code. */
static int parse_args(fit_args *f, const char *tool, int argc, char **argv) {
    memset(f, 0, sizeof *f);
    f->max_tokens = -1, f->seed = -1, f->method_id = -1;
    const kv_opt opts[] = {
        {"model", 'm', KV_OPT_STRING, &f->model, "M", "model: GGUF, safetensors directory or llama2.c checkpoint "
                                                      "(default: the config's `model`)", 0},
        {"tokenizer", 0, KV_OPT_STRING, &f->tokenizer, "T", "tokenizer (default: the model's own)", 0},
        {"corpus", 'c', KV_OPT_STRING, &f->corpus, "FILE", "calibration text (default: the config's data.calibration)", 0},
        {"heldout", 0, KV_OPT_STRING, &f->heldout, "FILE", "held-out text for the metrics (default: data.heldout, "
                                                           "else a seeded data.heldout_fraction of the calibration sequences)", 0},
        {"config", 0, KV_OPT_STRING, &f->config, "CFG.yaml", "fit configuration (configs/kvcal-example.yaml)", 0},
        {"out", 'o', KV_OPT_STRING, &f->out, "PLAN", "plan to write (atomically); PLAN.ckpt/ holds checkpoints", 1},
        {"method", 0, KV_OPT_STRING, &f->method, "NAME", "aqua (default), aqua-uniform, higgs, kivi, fp8, nvfp4, xquant or squat", 0},
        {"scale-granularity", 0, KV_OPT_STRING, &f->granularity, "G", "fp8 / nvfp4: one calibrated scale per tensor "
                                                                   "(default) or per KV head (fp.scale_granularity)", 0},
        {"bits", 'b', KV_OPT_INT, &f->bits, "B", "bits of keys and values: uniform methods 1, 2, 3, 4 or 8, higgs/aqua 1..8, or 16 (kivi: kept in f16, for pruning plans; default: the config's, 2)", 0},
        {"target-bits", 0, KV_OPT_STRING, &f->target_bits, "B", "method xquant: choose kq, vq, km, vm for at most B bits "
                                                             "per value (codes + scales + zero points; xquant.target_bits)", 0},
        {"seq-len", 0, KV_OPT_INT, &f->seq_len, "N", "tokens per calibration sequence (data.seq_len, default 1024)", 0},
        {"max-tokens", 0, KV_OPT_INT, &f->max_tokens, "N", "calibration tokens at most, 0 = all (data.max_tokens)", 0},
        {"seed", 0, KV_OPT_INT, &f->seed, "S", "seed: held-out split, grids, HIGGS signs (default 0)", 0},
        {"set", 0, KV_OPT_STRING, &f->set_last, "KEY=VALUE", "override one configuration key (repeatable), e.g. "
                                                             "--set cache.recent=64", 0},
        {"threads", 't', KV_OPT_INT, &f->threads, "N", "threads, 1..4 per CPU (default: KVCAL_THREADS or all CPUs)", 0},
        {"json", 0, KV_OPT_FLAG, &f->json, NULL, "print the report as JSON", 0},
        {"no-checkpoint", 0, KV_OPT_FLAG, &f->no_ckpt, NULL, "do not checkpoint after each layer (no resume)", 0},
        {"bench", 0, KV_OPT_FLAG, &f->bench, NULL, "also time one plain forward pass over the same tokens and print "
                                                   "calibration time / forward time", 0},
        {NULL, 0, KV_OPT_FLAG, NULL, NULL, NULL, 0},
    };
    if (!(f->sets = kv_cli_collect(argc, argv, "set", 0, &f->n_sets)))
        return kv_cli_fail(tool, KV_ERR(KV_ENOMEM, "out of memory"));
    kv_cli_args a;
    int rc = kv_cli_parse(&a, tool,
                          "--model M --corpus FILE --out PLAN [--config CFG.yaml] [--method aqua|aqua-uniform|higgs|kivi|fp8|nvfp4|xquant|squat] "
                          "[--scale-granularity tensor|head] "
                          "[--bits 1..8|16] [--target-bits B] [--seq-len N] [--max-tokens N] [--seed S] [--json] [--set key=value ...]",
                          "Fit a KV-cache compression plan for a model on a calibration corpus, layer by layer "
                          "(AQUA-KV, aquakv.txt Algorithm 1): capture each layer's keys and values, fit linear "
                          "predictors from the previous layer's reconstructions (aqua, aqua-uniform), quantize the "
                          "residuals chunk by chunk as the compressed cache will, and report held-out predictor and "
                          "quantizer errors per layer. Interrupted runs resume from the last finished layer "
                          "(PLAN.ckpt/). Configuration precedence: defaults < method preset < --config < flags < --set. "
                          "Holds one layer's weights at a time (memory.* keys: weights, hidden states in f16, "
                          "spilling to disk). Under mpirun (mpirun -np N kvcal fit ...) the ranks share the "
                          "sequences and rank 0 writes the same plan as one process.",
                          opts, 0, argc, argv);
    if (rc != KV_EXIT_OK) return rc;
    f->given_bits = kv_cli_given(&a, opts, "bits"), f->given_seq_len = kv_cli_given(&a, opts, "seq-len");
    f->given_max_tokens = kv_cli_given(&a, opts, "max-tokens"), f->given_seed = kv_cli_given(&a, opts, "seed");
    kv_cli_args_free(&a);
    return check_flags(f, tool);
}

/* The flags and --set over the configuration's lower layers (kv_fit_config_base), then validated. */
static kv_status apply_flags(kv_fit_config *cfg, const fit_args *f) {
    char as[96];
    kv_status s;
#define FIT_SET(cond, ...)                                                                                             \
    if (cond) {                                                                                                        \
        snprintf(as, sizeof as, __VA_ARGS__);                                                                          \
        if ((s = kv_fit_config_set(cfg, as)) != KV_OK) return s;                                                       \
    }
    FIT_SET(f->given_bits, "keys.bits=%ld", f->bits)
    FIT_SET(f->given_bits, "values.bits=%ld", f->bits)
    FIT_SET(f->target_bits, "xquant.target_bits=%s", f->target_bits)
    FIT_SET(f->given_seq_len, "data.seq_len=%ld", f->seq_len)
    FIT_SET(f->given_max_tokens, "data.max_tokens=%ld", f->max_tokens)
    FIT_SET(f->given_seed, "seed=%ld", f->seed)
    FIT_SET(f->granularity, "fp.scale_granularity=%s", f->granularity)
#undef FIT_SET
    if (f->model && (s = set_string(&cfg->model, f->model)) != KV_OK) return s;
    if (f->corpus && (s = set_string(&cfg->data.calibration, f->corpus)) != KV_OK) return s;
    if (f->heldout && (s = set_string(&cfg->data.heldout, f->heldout)) != KV_OK) return s;
    for (int i = 0; i < f->n_sets; i++)
        if ((s = kv_fit_config_set(cfg, f->sets[i])) != KV_OK) return s;
    return kv_fit_config_validate(cfg);
}

/* The resolved configuration names a model and a corpus, and every output location and input identity is
 * usable, before any work: KV_EXIT_OK or the usage error's exit code (printed by rank 0 where marked). */
static int check_files(const fit_args *f, const kv_fit_config *cfg, int rank, const char *tool) {
    if (!cfg->model[0])
        return rank ? KV_EXIT_USAGE : kv_cli_usage_error(tool, "no model: give --model or `model:` in the configuration");
    if (!cfg->data.calibration[0])
        return rank ? KV_EXIT_USAGE
                    : kv_cli_usage_error(tool, "no corpus: give --corpus or `data.calibration:` in the configuration");
    const kv_tool_path ins[] = {{"the model", cfg->model}, {"--tokenizer", f->tokenizer},
                                {"the corpus", cfg->data.calibration},
                                {"the held-out corpus", cfg->data.heldout[0] ? cfg->data.heldout : NULL},
                                {"--config", f->config}};
    const kv_tool_path outs[] = {{"--out", f->out}};
    int rc = kv_tool_check_io(tool, ins, 5, outs, 1);
    if (rc == KV_EXIT_OK && !f->no_ckpt && *f->out && kv_fit_ckpt_check_plan(f->out) != KV_OK)
        rc = kv_cli_usage_error(tool, "%s", kv_error_last());
    return rc;
}

/* The model, its tokenizer and the tokens the fit reads; every rank loads its own copy. */
typedef struct fit_inputs {
    kv_model_file *mf;
    kv_model *m;
    kv_tokenizer *tok;
    int32_t *ids, *ho_ids;
    size_t n_ids, n_ho;
    char corpus_sha[65];
    kv_fit_data data;
} fit_inputs;

static kv_status load_inputs(fit_inputs *in, const kv_fit_config *cfg, const fit_args *f) {
    kv_status s;
    if ((s = kv_model_file_open(&in->mf, cfg->model)) != KV_OK) return s;
    /* what the fit would refuse, now that the model's shape is known and before any weight is read */
    if ((s = kv_fit_check(cfg, kv_model_file_arch(in->mf))) != KV_OK) return s;
    kv_tool_warn_context(kv_model_file_arch(in->mf), cfg->data.seq_len, "data.seq_len (--seq-len)");
    kv_model_options mo; /* weights as memory.* says: one layer at a time by default */
    memset(&mo, 0, sizeof mo);
    mo.n_threads = f->n_threads;
    mo.weights = (kv_weight_storage)cfg->memory.weights;
    s = cfg->memory.stream_weights ? kv_model_load_streamed(&in->m, in->mf, &mo) : kv_model_load(&in->m, in->mf, &mo);
    if (s != KV_OK) return s;
    if ((s = kv_tokenizer_load(&in->tok, in->mf, f->tokenizer)) != KV_OK) return s;
    if ((s = kv_tool_check_vocab(in->m, in->tok, f->tokenizer)) != KV_OK) return s;
    /* only the tokens the fit can use are read and tokenized (data.max_tokens, 0 = all); the held-out
     * corpus never needs more than that either (at most 0.9 of the calibration sequences) */
    const size_t budget = cfg->data.max_tokens > 0 ? (size_t)cfg->data.max_tokens : 0;
    if ((s = kv_tool_tokenize_file_max(&in->ids, &in->n_ids, in->corpus_sha, in->tok, cfg->data.calibration,
                                       budget)) != KV_OK)
        return s;
    if (cfg->data.heldout[0] &&
        (s = kv_tool_tokenize_file_max(&in->ho_ids, &in->n_ho, NULL, in->tok, cfg->data.heldout, budget)) != KV_OK)
        return s;
    in->data.tokens = in->ids, in->data.n_tokens = in->n_ids;
    in->data.heldout_tokens = in->ho_ids, in->data.n_heldout_tokens = in->n_ho;
    in->data.bos_id = kv_tokenizer_add_bos_default(in->tok) ? kv_tokenizer_bos(in->tok) : -1;
    return KV_OK;
}

static void fit_inputs_free(fit_inputs *in) {
    free(in->ids);
    free(in->ho_ids);
    kv_tokenizer_free(in->tok);
    kv_model_free(in->m);
    kv_model_file_close(in->mf);
}

/* The fit's options: provenance, checkpoints (*ckpt owned by the caller), the grid cache, the ranks. */
static kv_status fit_options(kv_fit_options *fo, char **ckpt, char hash[41], const fit_args *f, const fit_inputs *in,
                             const char *gcache, kv_dist *dist) {
    git_hash(hash);
    kv_fit_options_init(fo);
    fo->out_path = f->out, fo->git_hash = hash, fo->corpus_sha256 = in->corpus_sha;
    fo->interrupt = &g_interrupt, fo->grid_cache_dir = gcache, fo->dist = dist;
    kv_status s = f->no_ckpt ? KV_OK : kv_fit_ckpt_dir_for(ckpt, f->out);
    fo->checkpoint_dir = *ckpt;
    const char *stop = getenv("KVCAL_FIT_STOP_AFTER_LAYER");
    if (stop && *stop) fo->stop_after_layer = atoi(stop);
    return s;
}

/* The fit between SIGINT/SIGTERM handlers that ask it to stop at the next batch (the checkpoint is kept). */
static kv_status run_fit(kv_plan **plan, kv_fit_report *rep, fit_inputs *in, kv_fit_config *cfg,
                         const kv_fit_options *fo) {
    struct sigaction sa, old_int, old_term;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, &old_int);
    sigaction(SIGTERM, &sa, &old_term);
    const kv_status s = kv_fit_run_job(plan, rep, in->m, in->mf, &in->data, cfg, fo);
    sigaction(SIGINT, &old_int, NULL);
    sigaction(SIGTERM, &old_term, NULL);
    return s;
}

/* The report (text: kv_fit_report_format's, JSON: its object plus where the plan went, and the benchmark). */
static void print_report(const char *text, const fit_args *f, const kv_fit_config *cfg, const kv_fit_report *rep,
                         double fwd) {
    if (f->json) {
        size_t n = strlen(text);
        while (n > 0 && (text[n - 1] == '\n' || text[n - 1] == '}')) n--;
        fwrite(text, 1, n, stdout);
        printf(",\n  \"method\": \"%s\", \"plan\": ", kv_fit_method_name(cfg->method));
        kv_tool_json_string(stdout, f->out);
        if (f->bench)
            printf(",\n  \"bench\": {\"calibration_s\": %.3f, \"forward_s\": %.3f, \"ratio\": %.3f}", rep->seconds_total,
                   fwd, fwd > 0 ? rep->seconds_total / fwd : 0.0);
        printf("\n}\n");
    } else {
        fputs(text, stdout);
        printf("method %s: plan written to %s\n", kv_fit_method_name(cfg->method), f->out);
        if (f->bench)
            printf("bench: calibration %.2f s, one plain forward pass over the same %lld tokens %.2f s, ratio %.2f\n",
                   rep->seconds_total, (long long)(rep->calib_tokens + rep->heldout_tokens), fwd,
                   fwd > 0 ? rep->seconds_total / fwd : 0.0);
    }
}

int kvcal_fit(int argc, char **argv) {
    const char *tool = "kvcal fit";
    fit_args f;
    int rc = parse_args(&f, tool, argc, argv);
    if (rc != KV_EXIT_OK) {
        free(f.sets);
        return rc < 0 ? KV_EXIT_OK : rc;
    }
    kv_fit_config cfg;
    kv_dist *dist = NULL;
    int rank = 0;
    fit_inputs in;
    memset(&in, 0, sizeof in);
    kv_plan *plan = NULL;
    kv_fit_report rep;
    memset(&rep, 0, sizeof rep);
    char *text = NULL, *ckpt = NULL, *gcache = kv_tool_grid_cache_dir(), hash[41];
    kv_status s = kv_fit_config_init(&cfg);
    if (s != KV_OK) goto fail;
    /* ---- ranks (mpirun), one process otherwise: from here on only rank 0 prints ---- */
    if ((s = kv_dist_init(&dist, NULL, NULL)) != KV_OK) goto fail;
    rank = kv_dist_rank(dist);
    if (rank != 0) {
        kv_log_set_callback(kv_log_to_stream, stderr, KV_LOG_ERROR);
        kv_progress_set_stream(NULL, 10.0);
    }
    /* ---- configuration: defaults < method preset < file < flags < --set ---- */
    if ((s = kv_fit_config_base(&cfg, f.config, f.method_id)) != KV_OK) goto fail;
    if (f.given_bits && kv_fit_method_has(cfg.method, KV_FIT_T_FLOAT)) {
        /* a float format's bits are its own: refused rather than ignored */
        rc = rank ? KV_EXIT_USAGE
                  : kv_cli_usage_error(tool, "--bits does not apply to method %s (FP8 codes have 8 bits, NVFP4 4); "
                                       "choose the format with --method or --set fp.fp8_format=e4m3|e5m2",
                                       kv_fit_method_name(cfg.method));
        goto end;
    }
    if ((s = apply_flags(&cfg, &f)) != KV_OK) goto fail;
    if ((rc = check_files(&f, &cfg, rank, tool)) != KV_EXIT_OK) goto end;
    /* corpora that never end (devices) are refused before anything is loaded */
    if ((s = kv_input_check(cfg.data.calibration)) != KV_OK) goto fail;
    if (cfg.data.heldout[0] && (s = kv_input_check(cfg.data.heldout)) != KV_OK) goto fail;
    /* ---- model, tokenizer, corpus; the ranks agree before working together (a rank that failed alone says why) ---- */
    s = load_inputs(&in, &cfg, &f);
    if ((s = kv_dist_agree(dist, s)) != KV_OK) goto fail;
    /* ---- run ---- */
    kv_fit_options fo;
    if ((s = fit_options(&fo, &ckpt, hash, &f, &in, gcache, dist)) != KV_OK) goto fail;
    if ((s = run_fit(&plan, &rep, &in, &cfg, &fo)) != KV_OK) goto fail;
    double fwd = 0.0;
    if (f.bench && (s = kv_fit_forward_baseline(&fwd, in.m, &in.data, &cfg, &fo)) != KV_OK) goto fail;
    if (rank != 0) goto end;
    if ((s = kv_fit_report_format(&text, &rep, f.json)) != KV_OK) goto fail;
    print_report(text, &f, &cfg, &rep, fwd);
    goto end;
fail:
    /* failures past kv_dist_init are the same on every rank (deterministic, or agreed): rank 0 says it */
    rc = rank == 0 ? kv_cli_fail(tool, s) : KV_EXIT_RUNTIME;
end:
    free(text);
    free(ckpt);
    free(gcache);
    fit_inputs_free(&in);
    kv_fit_report_free(&rep);
    kv_plan_free(plan);
    kv_fit_config_free(&cfg);
    free(f.sets);
    kv_dist_finalize(dist);
    return rc;
}
