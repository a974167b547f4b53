/* kvcal fit: calibrate a compression plan (AQUA-KV and baselines) on a text corpus. Thin: parse,
 * resolve the configuration (defaults < method preset < config file < flags < --set), tokenize,
 * call kv_fit_run, print the held-out metrics. calib/FIT.md documents the procedure.
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
#include <sys/stat.h>
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

int kvcal_fit(int argc, char **argv) {
    const char *tool = "kvcal fit";
    const char *model = NULL, *tokenizer = NULL, *corpus = NULL, *heldout = NULL, *config = NULL, *out = NULL;
    const char *method = NULL, *set_last = NULL, *granularity = NULL, *target_bits = NULL;
    long bits = 0, seq_len = 0, max_tokens = -1, seed = -1, threads = 0;
    int json = 0, no_ckpt = 0, bench = 0;
    const kv_opt opts[] = {
        {"model", 'm', KV_OPT_STRING, &model, "M", "model: GGUF, safetensors directory or llama2.c checkpoint "
                                                   "(default: the config's `model`)", 0},
        {"tokenizer", 0, KV_OPT_STRING, &tokenizer, "T", "tokenizer (default: the model's own)", 0},
        {"corpus", 'c', KV_OPT_STRING, &corpus, "FILE", "calibration text (default: the config's data.calibration)", 0},
        {"heldout", 0, KV_OPT_STRING, &heldout, "FILE", "held-out text for the metrics (default: data.heldout, "
                                                        "else a seeded data.heldout_fraction of the calibration sequences)", 0},
        {"config", 0, KV_OPT_STRING, &config, "CFG.yaml", "fit configuration (configs/kvcal-example.yaml)", 0},
        {"out", 'o', KV_OPT_STRING, &out, "PLAN", "plan to write (atomically); PLAN.ckpt/ holds checkpoints", 1},
        {"method", 0, KV_OPT_STRING, &method, "NAME", "aqua (default), aqua-uniform, higgs, kivi, fp8, nvfp4, xquant or squat", 0},
        {"scale-granularity", 0, KV_OPT_STRING, &granularity, "G", "fp8 / nvfp4: one calibrated scale per tensor "
                                                                "(default) or per KV head (fp.scale_granularity)", 0},
        {"bits", 'b', KV_OPT_INT, &bits, "B", "bits of keys and values: uniform methods 1, 2, 3, 4 or 8, higgs/aqua 1..8, or 16 (kivi: kept in f16, for pruning plans; default: the config's, 2)", 0},
        {"target-bits", 0, KV_OPT_STRING, &target_bits, "B", "method xquant: choose kq, vq, km, vm for at most B bits "
                                                          "per value (codes + scales + zero points; xquant.target_bits)", 0},
        {"seq-len", 0, KV_OPT_INT, &seq_len, "N", "tokens per calibration sequence (data.seq_len, default 1024)", 0},
        {"max-tokens", 0, KV_OPT_INT, &max_tokens, "N", "calibration tokens at most, 0 = all (data.max_tokens)", 0},
        {"seed", 0, KV_OPT_INT, &seed, "S", "seed: held-out split, grids, HIGGS signs (default 0)", 0},
        {"set", 0, KV_OPT_STRING, &set_last, "KEY=VALUE", "override one configuration key (repeatable), e.g. "
                                                          "--set cache.recent=64", 0},
        {"threads", 't', KV_OPT_INT, &threads, "N", "threads, 1..4 per CPU (default: KVCAL_THREADS or all CPUs)", 0},
        {"json", 0, KV_OPT_FLAG, &json, NULL, "print the report as JSON", 0},
        {"no-checkpoint", 0, KV_OPT_FLAG, &no_ckpt, NULL, "do not checkpoint after each layer (no resume)", 0},
        {"bench", 0, KV_OPT_FLAG, &bench, NULL, "also time one plain forward pass over the same tokens and print "
                                                "calibration time / forward time", 0},
        {NULL, 0, KV_OPT_FLAG, NULL, NULL, NULL, 0},
    };
    /* --set may be given many times: collect every value in order (the parser keeps the last). */
    const char **sets = calloc((size_t)argc + 1, sizeof *sets);
    int n_sets = 0;
    if (!sets) return kv_cli_fail(tool, KV_ERR(KV_ENOMEM, "out of memory"));
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--") == 0) break;
        if (strcmp(argv[i], "--set") == 0 && i + 1 < argc) sets[n_sets++] = argv[++i];
        else if (strncmp(argv[i], "--set=", 6) == 0) sets[n_sets++] = argv[i] + 6;
    }
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
    if (rc != KV_EXIT_OK) {
        free(sets);
        return rc < 0 ? KV_EXIT_OK : rc;
    }
    kv_fit_config cfg;
    kv_dist *dist = NULL;
    int rank = 0;
    kv_model_file *mf = NULL;
    kv_model *m = NULL;
    kv_tokenizer *tok = NULL;
    int32_t *ids = NULL, *ho_ids = NULL;
    size_t n_ids = 0, n_ho = 0;
    kv_plan *plan = NULL;
    kv_fit_report rep;
    char *text = NULL, *ckpt = NULL, *gcache = kv_tool_grid_cache_dir();
    memset(&rep, 0, sizeof rep);
    kv_status s = kv_fit_config_init(&cfg);
    rc = KV_EXIT_OK;
    if (s != KV_OK) goto fail;
    /* ---- flags that are usage errors ---- */
    int method_id = -1;
    if (method && (method_id = kv_fit_method_from_name(method)) < 0) {
        char known[256] = ""; /* "aqua, ..., xquant or squat": the methods' table (formats/config.c) */
        for (int k = 0; k < KV_FIT_METHOD_COUNT; k++) {
            const size_t len = strlen(known);
            snprintf(known + len, sizeof known - len, "%s%s", k == 0 ? "" : k + 1 < KV_FIT_METHOD_COUNT ? ", " : " or ",
                     kv_fit_method_name(k));
        }
        rc = kv_cli_usage_error(tool, "--method must be %s (got '%s')", known, method);
        goto end;
    }
    if (granularity && strcmp(granularity, "tensor") != 0 && strcmp(granularity, "head") != 0) {
        rc = kv_cli_usage_error(tool, "--scale-granularity must be tensor or head (got '%s')", granularity);
        goto end;
    }
    /* --bits is keys.bits and values.bits together: the same range as those keys here, and the method's own limits
     * (uniform codes 1, 2, 3, 4 or 8 bits; HIGGS grids bits x d <= 16; 16 = f16 for kivi only) from the configuration's
     * validation below, before any work, with the method named */
    if (kv_cli_given(&a, opts, "bits") && !((bits >= KV_FIT_MIN_BITS && bits <= KV_FIT_MAX_BITS) || bits == KV_FIT_F16_BITS)) {
        rc = kv_cli_usage_error(tool, "--bits must be in %d..%d or 16 (got %ld): uniform methods (kivi, xquant, squat, "
                                "aqua-uniform) take 1, 2, 3, 4 or 8, higgs and aqua 1..8, 16 keeps kivi streams in f16",
                                KV_FIT_MIN_BITS, KV_FIT_MAX_BITS, bits);
        goto end;
    }
    if (kv_cli_given(&a, opts, "seq-len") && (seq_len < 2 || seq_len > (1 << 20))) {
        rc = kv_cli_usage_error(tool, "--seq-len must be in 2..1048576 (got %ld)", seq_len);
        goto end;
    }
    if (kv_cli_given(&a, opts, "max-tokens") && max_tokens < 0) {
        rc = kv_cli_usage_error(tool, "--max-tokens must be >= 0 (got %ld)", max_tokens);
        goto end;
    }
    if (kv_cli_given(&a, opts, "seed") && seed < 0) {
        rc = kv_cli_usage_error(tool, "--seed must be >= 0 (got %ld)", seed);
        goto end;
    }
    int n_threads = 0;
    if ((rc = kv_tool_threads(tool, threads, &n_threads)) != KV_EXIT_OK) goto end;
    /* ---- ranks (mpirun), one process otherwise: from here on only rank 0 prints ---- */
    if ((s = kv_dist_init(&dist, NULL, NULL)) != KV_OK) goto fail;
    rank = kv_dist_rank(dist);
    if (rank != 0) {
        kv_log_set_callback(kv_log_to_stream, stderr, KV_LOG_ERROR);
        kv_progress_set_stream(NULL, 10.0);
    }
    /* ---- configuration: defaults < method preset < file < flags < --set ---- */
    if (method_id < 0 && config) { /* the file's method picks the preset */
        kv_fit_config probe;
        if ((s = kv_fit_config_init(&probe)) != KV_OK) goto fail;
        s = kv_fit_config_load_file(&probe, config);
        method_id = (int)probe.method;
        kv_fit_config_free(&probe);
        if (s != KV_OK) goto fail;
    }
    if (method_id >= 0 && (s = kv_fit_config_method_preset(&cfg, (kv_fit_method)method_id)) != KV_OK) goto fail;
    if (config && (s = kv_fit_config_load_file(&cfg, config)) != KV_OK) goto fail;
    if (method) cfg.method = (kv_fit_method)method_id;
    if (kv_cli_given(&a, opts, "bits") && kv_fit_method_has(cfg.method, KV_FIT_T_FLOAT)) {
        /* a float format's bits are its own: refused rather than ignored */
        rc = rank ? KV_EXIT_USAGE
                  : kv_cli_usage_error(tool, "--bits does not apply to method %s (FP8 codes have 8 bits, NVFP4 4); "
                                       "choose the format with --method or --set fp.fp8_format=e4m3|e5m2",
                                       kv_fit_method_name(cfg.method));
        goto end;
    }
    {
        char as[96];
        if (kv_cli_given(&a, opts, "bits")) {
            snprintf(as, sizeof as, "keys.bits=%ld", bits);
            if ((s = kv_fit_config_set(&cfg, as)) != KV_OK) goto fail;
            snprintf(as, sizeof as, "values.bits=%ld", bits);
            if ((s = kv_fit_config_set(&cfg, as)) != KV_OK) goto fail;
        }
        if (target_bits) {
            snprintf(as, sizeof as, "xquant.target_bits=%s", target_bits);
            if ((s = kv_fit_config_set(&cfg, as)) != KV_OK) goto fail;
        }
        if (kv_cli_given(&a, opts, "seq-len")) {
            snprintf(as, sizeof as, "data.seq_len=%ld", seq_len);
            if ((s = kv_fit_config_set(&cfg, as)) != KV_OK) goto fail;
        }
        if (kv_cli_given(&a, opts, "max-tokens")) {
            snprintf(as, sizeof as, "data.max_tokens=%ld", max_tokens);
            if ((s = kv_fit_config_set(&cfg, as)) != KV_OK) goto fail;
        }
        if (kv_cli_given(&a, opts, "seed")) {
            snprintf(as, sizeof as, "seed=%ld", seed);
            if ((s = kv_fit_config_set(&cfg, as)) != KV_OK) goto fail;
        }
        if (granularity) {
            snprintf(as, sizeof as, "fp.scale_granularity=%s", granularity);
            if ((s = kv_fit_config_set(&cfg, as)) != KV_OK) goto fail;
        }
    }
    if (model && (s = set_string(&cfg.model, model)) != KV_OK) goto fail;
    if (corpus && (s = set_string(&cfg.data.calibration, corpus)) != KV_OK) goto fail;
    if (heldout && (s = set_string(&cfg.data.heldout, heldout)) != KV_OK) goto fail;
    for (int i = 0; i < n_sets; i++)
        if ((s = kv_fit_config_set(&cfg, sets[i])) != KV_OK) goto fail;
    if ((s = kv_fit_config_validate(&cfg)) != KV_OK) goto fail;
    if (!cfg.model[0]) {
        rc = rank ? KV_EXIT_USAGE : kv_cli_usage_error(tool, "no model: give --model or `model:` in the configuration");
        goto end;
    }
    if (!cfg.data.calibration[0]) {
        rc = rank ? KV_EXIT_USAGE
                  : kv_cli_usage_error(tool, "no corpus: give --corpus or `data.calibration:` in the configuration");
        goto end;
    }
    /* ---- every output location and input identity, before any work ---- */
    {
        const kv_tool_path ins[] = {{"the model", cfg.model}, {"--tokenizer", tokenizer},
                                    {"the corpus", cfg.data.calibration},
                                    {"the held-out corpus", cfg.data.heldout[0] ? cfg.data.heldout : NULL},
                                    {"--config", config}};
        const kv_tool_path outs[] = {{"--out", out}};
        if ((rc = kv_tool_check_io(tool, ins, 5, outs, 1)) != KV_EXIT_OK) goto end;
        struct stat st;
        if (!no_ckpt && *out) {
            char ck[4096];
            snprintf(ck, sizeof ck, "%s.ckpt", out);
            if (stat(ck, &st) == 0 && !S_ISDIR(st.st_mode)) {
                rc = kv_cli_usage_error(tool, "'%s' (the checkpoint directory of --out) exists and is not a directory",
                                        ck);
                goto end;
            }
            if (kv_fit_ckpt_check_dir(ck) != KV_OK) { /* a symlink, or a directory kvcal fit did not create */
                rc = kv_cli_usage_error(tool, "%s", kv_error_last());
                goto end;
            }
        }
    }
    /* corpora that never end (devices) are refused before anything is loaded */
    if ((s = kv_input_check(cfg.data.calibration)) != KV_OK) goto fail;
    if (cfg.data.heldout[0] && (s = kv_input_check(cfg.data.heldout)) != KV_OK) goto fail;
    /* ---- model, tokenizer, corpus: every rank loads its own copy ---- */
    char corpus_sha[65] = "";
    if ((s = kv_model_file_open(&mf, cfg.model)) != KV_OK) goto loaded;
    /* what the fit would refuse, now that the model's shape is known and before any weight is read */
    if ((s = kv_fit_check(&cfg, kv_model_file_arch(mf))) != KV_OK) goto loaded;
    kv_tool_warn_context(kv_model_file_arch(mf), cfg.data.seq_len, "data.seq_len (--seq-len)");
    {   /* weights as memory.* says: one layer at a time by default */
        kv_model_options mo;
        memset(&mo, 0, sizeof mo);
        mo.n_threads = n_threads;
        mo.weights = (kv_weight_storage)cfg.memory.weights;
        s = cfg.memory.stream_weights ? kv_model_load_streamed(&m, mf, &mo) : kv_model_load(&m, mf, &mo);
        if (s != KV_OK) goto loaded;
    }
    if ((s = kv_tokenizer_load(&tok, mf, tokenizer)) != KV_OK) goto loaded;
    if ((s = kv_tool_check_vocab(m, tok, tokenizer)) != KV_OK) goto loaded;
    /* only the tokens the fit can use are read and tokenized (data.max_tokens, 0 = all); the held-out
     * corpus never needs more than that either (at most 0.9 of the calibration sequences) */
    const size_t budget = cfg.data.max_tokens > 0 ? (size_t)cfg.data.max_tokens : 0;
    if ((s = kv_tool_tokenize_file_max(&ids, &n_ids, corpus_sha, tok, cfg.data.calibration, budget)) != KV_OK)
        goto loaded;
    if (cfg.data.heldout[0]) s = kv_tool_tokenize_file_max(&ho_ids, &n_ho, NULL, tok, cfg.data.heldout, budget);
loaded: /* the ranks agree before working together (a rank that failed alone says why) */
    if ((s = kv_dist_agree(dist, s)) != KV_OK) goto fail;
    kv_fit_data data;
    memset(&data, 0, sizeof data);
    data.tokens = ids;
    data.n_tokens = n_ids;
    data.heldout_tokens = ho_ids;
    data.n_heldout_tokens = n_ho;
    data.bos_id = kv_tokenizer_add_bos_default(tok) ? kv_tokenizer_bos(tok) : -1;
    /* ---- run ---- */
    char hash[41];
    git_hash(hash);
    kv_fit_options fo;
    kv_fit_options_init(&fo);
    fo.out_path = out;
    fo.git_hash = hash;
    fo.corpus_sha256 = corpus_sha;
    fo.interrupt = &g_interrupt;
    fo.grid_cache_dir = gcache;
    fo.dist = dist;
    struct stat ost;
    if (!no_ckpt && stat(out, &ost) == 0 && !S_ISREG(ost.st_mode)) {
        /* a device or a pipe: its directory (/dev) is no place for PLAN.ckpt, and nothing could resume */
        kv_log(KV_LOG_INFO, "--out '%s' is not a regular file: no checkpoints (as --no-checkpoint)", out);
        no_ckpt = 1;
    }
    if (!no_ckpt) {
        ckpt = malloc(strlen(out) + 6);
        if (!ckpt) {
            s = KV_ERR(KV_ENOMEM, "out of memory");
            goto fail;
        }
        sprintf(ckpt, "%s.ckpt", out);
        fo.checkpoint_dir = ckpt;
    }
    const char *stop = getenv("KVCAL_FIT_STOP_AFTER_LAYER");
    if (stop && *stop) fo.stop_after_layer = atoi(stop);
    struct sigaction sa, old_int, old_term;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, &old_int);
    sigaction(SIGTERM, &sa, &old_term);
    kv_xquant_choice xq_choice; /* --target-bits: kq, vq, km, vm chosen by four probe fits, then fitted */
    const int xq_target = cfg.xquant.target_bits > 0;
    s = xq_target ? kv_xquant_probe(&xq_choice, m, mf, &data, &cfg, &fo) : KV_OK;
    if (s == KV_OK && xq_target) kv_xquant_choice_apply(&cfg, &xq_choice);
    if (s == KV_OK) s = kv_fit_run(&plan, &rep, m, mf, &data, &cfg, &fo);
    if (s == KV_OK && xq_target) kv_xquant_choice_report(&rep, &xq_choice);
    sigaction(SIGINT, &old_int, NULL);
    sigaction(SIGTERM, &old_term, NULL);
    if (s != KV_OK) goto fail;
    {   /* predictors whose normal equations were rank deficient (also in the report and the plan) */
        int n_fb = 0;
        for (int l = 0; l < rep.n_layers; l++)
            for (int st = 0; st < 2; st++) n_fb += rep.layers[l].ridge_fallback[st] == 1.0;
        if (n_fb > 0)
            kv_log(KV_LOG_WARN, "%d %s rank-deficient normal equations and got the minimum-norm solution "
                   "(collinear inputs; the report lists them, the plan records ridge_rcond and ridge_fallback)", n_fb,
                   kv_tool_plural(n_fb, "predictor had", "predictors had"));
    }
    double fwd = 0.0;
    if (bench && (s = kv_fit_forward_baseline(&fwd, m, &data, &cfg, &fo)) != KV_OK) goto fail;
    if (rank != 0) goto end;
    if ((s = kv_fit_report_format(&text, &rep, json)) != KV_OK) goto fail;
    if (json) {
        /* the report object, plus where the plan went (and the benchmark) */
        size_t n = strlen(text);
        while (n > 0 && (text[n - 1] == '\n' || text[n - 1] == '}')) n--;
        fwrite(text, 1, n, stdout);
        printf(",\n  \"method\": \"%s\", \"plan\": ", kv_fit_method_name(cfg.method));
        kv_tool_json_string(stdout, out);
        if (bench)
            printf(",\n  \"bench\": {\"calibration_s\": %.3f, \"forward_s\": %.3f, \"ratio\": %.3f}", rep.seconds_total, fwd,
                   fwd > 0 ? rep.seconds_total / fwd : 0.0);
        printf("\n}\n");
    } else {
        fputs(text, stdout);
        printf("method %s: plan written to %s\n", kv_fit_method_name(cfg.method), out);
        if (bench)
            printf("bench: calibration %.2f s, one plain forward pass over the same %lld tokens %.2f s, ratio %.2f\n",
                   rep.seconds_total, (long long)(rep.calib_tokens + rep.heldout_tokens), fwd,
                   fwd > 0 ? rep.seconds_total / fwd : 0.0);
    }
    goto end;
fail:
    /* failures past kv_dist_init are the same on every rank (deterministic, or agreed): rank 0 says it */
    rc = rank == 0 ? kv_cli_fail(tool, s) : KV_EXIT_RUNTIME;
end:
    free(text);
    free(ckpt);
    free(gcache);
    free(ids);
    free(ho_ids);
    kv_fit_report_free(&rep);
    kv_plan_free(plan);
    kv_tokenizer_free(tok);
    kv_model_free(m);
    kv_model_file_close(mf);
    kv_fit_config_free(&cfg);
    kv_cli_args_free(&a);
    free(sets);
    kv_dist_finalize(dist);
    return rc;
}
