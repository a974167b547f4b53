/* kvcal fit's shards and working set on the synthetic model (fit_test_util.h): the per-token state
 * spilled to files or held in f16, layer-streamed weights, another shard size, and resume with
 * spilled f16 state. (The distribution of shards over MPI ranks: tests/dist.) */
#define _POSIX_C_SOURCE 200809L
#include "fit_fixture.h"
#include "kv_test.h"
#include "kvrt.h"

#include <math.h>
#include <sys/stat.h>
#include <unistd.h>

/* The same plan but for the provenance (whose configuration names the settings that differ). */
static void assert_same_fit(const kv_plan *x, kv_plan *y) {
    ck_assert_kv_ok(kv_plan_set_provenance(y, &x->provenance));
    assert_same_plan(x, y);
}

/* How the per-token state is held changes nothing: spilled to files a shard at a time (with shards
 * of 3 sequences, a last short one, and a held-out shard) gives the in-memory plan exactly, and a
 * streamed model (one layer's weights at a time) gives the whole model's plan exactly. */
START_TEST(test_spill_and_stream_same_plan) {
    char dir[256], spill[300], set_spill[340];
    kv_test_tmpdir(dir, sizeof dir);
    ck_assert_ptr_nonnull(mkdtemp(dir));
    snprintf(spill, sizeof spill, "%s/spill/deeper", dir);
    snprintf(set_spill, sizeof set_spill, "memory.spill_dir=%s", spill);
    const char *base[] = {"data.shard_seqs=3", NULL}, *spilled[] = {"data.shard_seqs=3", set_spill, NULL};
    kv_fit_config c1, c2;
    make_cfg(&c1, KV_FIT_AQUA, base);
    make_cfg(&c2, KV_FIT_AQUA, spilled);
    kv_plan *ref = NULL, *plan = NULL;
    kv_fit_report rep;
    ck_assert_kv_ok(run_fit(&ref, NULL, &c1, NULL));
    ck_assert_kv_ok(run_fit(&plan, &rep, &c2, NULL));
    ck_assert_int_eq(rep.spilled, 1);
    ck_assert_int_eq(rep.n_shards, (N_SEQS + 2) / 3);
    ck_assert(!dir_exists(spill)); /* the spill files and directory are removed */
    assert_same_fit(ref, plan);
    kv_plan_free(plan);
    kv_fit_report_free(&rep);
    /* a streamed model */
    kv_model *sm = NULL;
    kv_model_options mo;
    memset(&mo, 0, sizeof mo);
    mo.n_threads = 1;
    ck_assert_kv_ok(kv_model_create_streamed(&sm, &g_syn.arch, syn_read, &g_syn, &mo));
    kv_fit_options o;
    kv_fit_options_init(&o);
    o.fingerprint = &g_fp;
    kv_fit_data d = make_data();
    ck_assert_kv_ok(kv_fit_run(&plan, &rep, sm, NULL, &d, &c1, &o));
    ck_assert_int_eq(rep.weights_streamed, 1);
    ck_assert_uint_lt(rep.weight_bytes_max, kv_model_weight_bytes(g_model));
    ck_assert_uint_eq(kv_model_weight_bytes(sm), 0); /* everything released */
    assert_same_plan(ref, plan);
    double sec = -1;
    ck_assert_kv_ok(kv_fit_forward_baseline(&sec, sm, &d, &c1, &o));
    ck_assert(sec >= 0);
    kv_fit_report_free(&rep);
    kv_plan_free(plan);
    kv_model_free(sm);
    kv_plan_free(ref);
    kv_fit_config_free(&c1);
    kv_fit_config_free(&c2);
    rmdir(dir);
}
END_TEST

/* Hidden states in f16 (in memory, and spilled): the fit sees inputs rounded once per layer, so the
 * plan differs from f32's in the low bits only. Bound: f16 keeps 11 significant bits (relative
 * rounding <= 2^-11 = 4.9e-4 per value); through two layers of the synthetic model the held-out
 * errors move by far less than 5% of their value, while a wrong conversion (bytes read as the
 * wrong type, a shard at the wrong offset) changes them by orders of magnitude. */
START_TEST(test_hidden_f16) {
    char dir[256], set_spill[340];
    kv_test_tmpdir(dir, sizeof dir);
    ck_assert_ptr_nonnull(mkdtemp(dir));
    snprintf(set_spill, sizeof set_spill, "memory.spill_dir=%s/s", dir);
    const char *h16[] = {"data.shard_seqs=4", "memory.hidden_dtype=f16", NULL};
    const char *h16s[] = {"data.shard_seqs=4", "memory.hidden_dtype=f16", set_spill, NULL};
    const char *f32[] = {"data.shard_seqs=4", NULL};
    kv_fit_config c0, c1, c2;
    make_cfg(&c0, KV_FIT_AQUA, f32);
    make_cfg(&c1, KV_FIT_AQUA, h16);
    make_cfg(&c2, KV_FIT_AQUA, h16s);
    kv_plan *p0 = NULL, *p1 = NULL, *p2 = NULL;
    kv_fit_report r0, r1, r2;
    ck_assert_kv_ok(run_fit(&p0, &r0, &c0, NULL));
    ck_assert_kv_ok(run_fit(&p1, &r1, &c1, NULL));
    ck_assert_kv_ok(run_fit(&p2, &r2, &c2, NULL));
    ck_assert_int_eq(r1.hidden_f16, 1);
    ck_assert_uint_eq(r1.hidden_bytes * 2, r0.hidden_bytes);
    assert_same_fit(p1, p2); /* f16 spilled == f16 in memory */
    int differ = 0;
    for (int l = 0; l < SYN_LAYERS; l++)
        for (int st = 0; st < 2; st++) {
            const double a = r0.layers[l].quant_rel_err[st], b = r1.layers[l].quant_rel_err[st];
            ck_assert_msg(fabs(a - b) <= 0.05 * a, "layer %d stream %d: f32 %g, f16 %g", l, st, a, b);
            differ += a != b;
        }
    ck_assert_msg(differ > 0, "f16 hidden states changed nothing: were they used?");
    kv_fit_report_free(&r0);
    kv_fit_report_free(&r1);
    kv_fit_report_free(&r2);
    kv_plan_free(p0);
    kv_plan_free(p1);
    kv_plan_free(p2);
    kv_fit_config_free(&c0);
    kv_fit_config_free(&c1);
    kv_fit_config_free(&c2);
    rmdir(dir);
}
END_TEST

/* Another shard size only re-associates the sums. Layer 1's predictors see the same inputs (layer 0
 * has none), so they differ by the regrouping alone: the double normal equations change by ~1e-15
 * relative, which the solve (condition number of the synthetic inputs < 1e3 with the ridge) turns
 * into ~1e-12 in W, far below the float rounding of the stored weights (6e-8): 1e-6 relative is a
 * wide margin. Later layers are fitted on reconstructions in which a last-bit difference can flip
 * a quantization code, so they are compared by their held-out errors: within 1% (a flipped code
 * changes one value by one step; a real difference in the fit moves the error by far more). */
START_TEST(test_shard_size_rounding_only) {
    const char *a[] = {"data.shard_seqs=1", NULL}, *b[] = {"data.shard_seqs=7", NULL};
    kv_fit_config ca, cb;
    make_cfg(&ca, KV_FIT_AQUA, a);
    make_cfg(&cb, KV_FIT_AQUA, b);
    kv_plan *pa = NULL, *pb = NULL;
    kv_fit_report ra, rb;
    ck_assert_kv_ok(run_fit(&pa, &ra, &ca, NULL));
    ck_assert_kv_ok(run_fit(&pb, &rb, &cb, NULL));
    for (int st = 0; st < 2; st++) {
        const kv_plan_predictor *x = pa->layers[1].stream[st].predictor, *y = pb->layers[1].stream[st].predictor;
        ck_assert_ptr_nonnull(x);
        ck_assert_ptr_nonnull(y);
        const size_t n = (size_t)x->out_dim * (size_t)x->in_dim;
        double num = 0, den = 0;
        for (size_t i = 0; i < n; i++) {
            const double d = (double)x->weight[i] - (double)y->weight[i];
            num += d * d;
            den += (double)x->weight[i] * x->weight[i];
        }
        ck_assert_msg(sqrt(num / den) < 1e-6, "layer 1 stream %d: relative difference %g", st, sqrt(num / den));
    }
    for (int l = 0; l < SYN_LAYERS; l++)
        for (int st = 0; st < 2; st++) {
            const double x = ra.layers[l].quant_rel_err[st], y = rb.layers[l].quant_rel_err[st];
            ck_assert_msg(fabs(x - y) <= 0.01 * x, "layer %d stream %d: %g vs %g", l, st, x, y);
        }
    kv_fit_report_free(&ra);
    kv_fit_report_free(&rb);
    kv_plan_free(pa);
    kv_plan_free(pb);
    kv_fit_config_free(&ca);
    kv_fit_config_free(&cb);
}
END_TEST

/* Resume with the state spilled and in f16: the checkpoint restores it, the plan is the same. */
START_TEST(test_resume_spilled_f16) {
    ckpt_env e;
    ckpt_env_init(&e, 1);
    char set_spill[340];
    snprintf(set_spill, sizeof set_spill, "memory.spill_dir=%s/spill", e.dir);
    const char *sets[] = {"data.shard_seqs=5", "memory.hidden_dtype=f16", set_spill, NULL};
    kv_fit_config cfg;
    make_cfg(&cfg, KV_FIT_AQUA, sets);
    kv_plan *ref = NULL, *plan = NULL;
    ck_assert_kv_ok(run_fit(&ref, NULL, &cfg, NULL));
    kv_fit_options o = e.o;
    ck_assert_int_eq(run_fit(&plan, NULL, &cfg, &o), KV_EINTERRUPTED);
    char state[400];
    snprintf(state, sizeof state, "%s/state.1.7.bin", e.ck); /* layer 1, shard 7 (of 8) */
    ck_assert_int_eq(access(state, R_OK), 0);
    o.stop_after_layer = -1;
    kv_fit_report rep;
    ck_assert_kv_ok(run_fit(&plan, &rep, &cfg, &o));
    ck_assert_int_eq(rep.resumed_from_layer, 2);
    assert_same_plan(ref, plan);
    kv_fit_report_free(&rep);
    kv_plan_free(plan);
    kv_plan_free(ref);
    kv_fit_config_free(&cfg);
    rmdir(e.dir);
}
END_TEST

static Suite *fit_shards_suite(void) {
    Suite *s = suite_create("fit_shards");
    TCase *tc = tcase_create("synthetic");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 600);
    tcase_add_test(tc, test_spill_and_stream_same_plan);
    tcase_add_test(tc, test_hidden_f16);
    tcase_add_test(tc, test_shard_size_rounding_only);
    tcase_add_test(tc, test_resume_spilled_f16);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return kv_test_run(fit_shards_suite()); }
