/* The fixture the kvcal fit C-API tests share: the synthetic model of fit_test_util.h (K and V exactly
 * linear from one layer to the next), a token stream of N_SEQS sequences of SEQ_LEN, a small fast
 * configuration, kv_fit_run with the model's fingerprint, and the checkpoint helpers (a temporary
 * checkpoint folder, plans compared byte for byte). Each test binary includes it once. */
#ifndef KV_FIT_FIXTURE_H
#define KV_FIT_FIXTURE_H

#include "fit_test_util.h"
#include "kv_test.h"

#include <sys/stat.h>

enum { SEQ_LEN = 68, N_SEQS = 40 }; /* 4 sinks + 2 chunks of 32 tokens */

static syn_model g_syn;
static kv_model *g_model;
static int32_t *g_tokens;
static size_t g_n_tokens;
static kv_plan_fingerprint g_fp;

/* The reference model over a synthetic model's weights (one thread). */
static kv_model *syn_model_open(syn_model *sm) {
    kv_model_options mo;
    memset(&mo, 0, sizeof mo);
    mo.n_threads = 1;
    kv_model *m = NULL;
    ck_assert_kv_ok(kv_model_create(&m, &sm->arch, syn_read, sm, &mo));
    return m;
}

static void setup(void) {
    kv_error_clear();
    syn_init(&g_syn, 12345);
    g_model = syn_model_open(&g_syn);
    g_n_tokens = (size_t)N_SEQS * (SEQ_LEN - 1);
    g_tokens = malloc(g_n_tokens * sizeof *g_tokens);
    for (size_t i = 0; i < g_n_tokens; i++) g_tokens[i] = (int32_t)(3 + kv_rng_u64(99, i) % (SYN_VOCAB - 3));
    syn_fingerprint(&g_fp, &g_syn.arch);
    setenv("SOURCE_DATE_EPOCH", "1700000000", 1);
}

static void teardown(void) {
    kv_model_free(g_model);
    syn_free(&g_syn);
    free(g_tokens);
}

/* A configuration for the synthetic model: chunks of 32 tokens, 4 sinks, small fast grids. */
static void make_cfg(kv_fit_config *c, kv_fit_method method, const char *const *sets) {
    ck_assert_kv_ok(kv_fit_config_init(c));
    ck_assert_kv_ok(kv_fit_config_method_preset(c, method));
    const char *base[] = {"data.seq_len=68", "cache.recent=32", "cache.sinks=4", "data.heldout_fraction=0.25",
                          "higgs.grid_samples=20000", "higgs.grid_iters=30", "keys.group_size=16",
                          "values.group_size=16", NULL};
    for (int i = 0; base[i]; i++) ck_assert_kv_ok(kv_fit_config_set(c, base[i]));
    for (int i = 0; sets && sets[i]; i++) ck_assert_kv_ok(kv_fit_config_set(c, sets[i]));
}

static kv_fit_data make_data(void) {
    kv_fit_data d;
    memset(&d, 0, sizeof d);
    d.tokens = g_tokens;
    d.n_tokens = g_n_tokens;
    d.bos_id = 1;
    return d;
}

static kv_status run_fit(kv_plan **plan, kv_fit_report *rep, const kv_fit_config *cfg, kv_fit_options *opt) {
    kv_fit_options o;
    kv_fit_options_init(&o);
    if (!opt) opt = &o;
    opt->fingerprint = &g_fp;
    kv_fit_data d = make_data();
    return kv_fit_run(plan, rep, g_model, NULL, &d, cfg, opt);
}

static int dir_exists(const char *p) {
    struct stat st;
    return stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

/* Two plans serialize to the same bytes. */
static void assert_same_plan(const kv_plan *x, const kv_plan *y) {
    uint8_t *a = NULL, *b = NULL;
    size_t na = 0, nb = 0;
    ck_assert_kv_ok(kv_plan_write_memory(&a, &na, x, NULL));
    ck_assert_kv_ok(kv_plan_write_memory(&b, &nb, y, NULL));
    ck_assert_uint_eq(na, nb);
    ck_assert_int_eq(memcmp(a, b, na), 0);
    free(a);
    free(b);
}

/* A fresh temporary directory, a checkpoint folder path inside it, and fit options that write the
 * checkpoint there and stop after layer `stop_after`. */
typedef struct ckpt_env {
    char dir[256], ck[300];
    kv_fit_options o;
} ckpt_env;
static void ckpt_env_init(ckpt_env *e, int stop_after) {
    kv_test_tmpdir(e->dir, sizeof e->dir);
    ck_assert_ptr_nonnull(mkdtemp(e->dir));
    snprintf(e->ck, sizeof e->ck, "%s/plan.ckpt", e->dir);
    kv_fit_options_init(&e->o);
    e->o.checkpoint_dir = e->ck;
    e->o.stop_after_layer = stop_after;
}

#endif
