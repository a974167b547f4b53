/* kvcal fit on a synthetic model with a known answer (fit_test_util.h: K and V exactly linear from
 * one layer to the next), plan contents and round trip, method presets, bad inputs, and
 * checkpoint/resume (an interrupted run resumed gives the same plan bytes as an uninterrupted one). */
#define _POSIX_C_SOURCE 200809L
#include "fit_internal.h"
#include "fit_fixture.h"
#include "kv_test.h"
#include "kvrt.h"

#include <math.h>
#include <sys/stat.h>
#include <unistd.h>

/* The key predictor recovers A_l and the value predictor [B_l, 0]: with 8-bit residuals the
 * inputs carry a relative noise of ~1e-5 (uniform 8-bit, one group per token), so the fitted maps
 * match to ~1e-4; 1e-2 leaves a wide margin while any wiring error (wrong layer, transposed
 * weights, post-RoPE keys) gives an O(1) error. */
START_TEST(test_recovers_linear_map) {
    kv_fit_config cfg;
    const char *sets[] = {"keys.bits=8", "values.bits=8", "aqua.first_layer_bits=8", "aqua.ridge=1e-9", NULL};
    make_cfg(&cfg, KV_FIT_AQUA_UNIFORM, sets);
    kv_plan *plan = NULL;
    kv_fit_report rep;
    ck_assert_kv_ok(run_fit(&plan, &rep, &cfg, NULL));
    ck_assert_int_eq(rep.n_layers, SYN_LAYERS);
    ck_assert_int_eq(rep.n_calib_seqs + rep.n_heldout_seqs, N_SEQS);
    ck_assert_int_eq(rep.n_heldout_seqs, 10);
    ck_assert_int_eq(rep.fit_rows, 30 * 64);
    const int kvd = SYN_KVD;
    ck_assert_ptr_null(plan->layers[0].stream[KV_PLAN_K].predictor);
    ck_assert_ptr_null(plan->layers[0].stream[KV_PLAN_V].predictor);
    for (int l = 1; l < SYN_LAYERS; l++) {
        const kv_plan_predictor *pk = plan->layers[l].stream[KV_PLAN_K].predictor;
        const kv_plan_predictor *pv = plan->layers[l].stream[KV_PLAN_V].predictor;
        ck_assert_ptr_nonnull(pk);
        ck_assert_ptr_nonnull(pv);
        ck_assert_int_eq(pk->n_inputs, 1);
        ck_assert_int_eq(pk->inputs[0].layer, l - 1);
        ck_assert_int_eq(pk->inputs[0].stream, KV_PLAN_K);
        ck_assert_int_eq(pv->n_inputs, 2);
        ck_assert_int_eq(pv->inputs[0].layer, l - 1);
        ck_assert_int_eq(pv->inputs[0].stream, KV_PLAN_V);
        ck_assert_int_eq(pv->inputs[1].layer, l);
        ck_assert_int_eq(pv->inputs[1].stream, KV_PLAN_K);
        double ek = 0, nk = 0, ev = 0, nv = 0, bias = 0;
        for (int o = 0; o < kvd; o++) {
            for (int i = 0; i < kvd; i++) {
                const double a = g_syn.A[l][o * kvd + i], b = g_syn.B[l][o * kvd + i];
                ek += (pk->weight[o * kvd + i] - a) * (pk->weight[o * kvd + i] - a);
                nk += a * a;
                ev += (pv->weight[o * 2 * kvd + i] - b) * (pv->weight[o * 2 * kvd + i] - b);
                ev += (double)pv->weight[o * 2 * kvd + kvd + i] * pv->weight[o * 2 * kvd + kvd + i];
                nv += b * b;
            }
            bias += fabs(pk->bias[o]) + fabs(pv->bias[o]);
        }
        ck_assert_msg(sqrt(ek / nk) < 1e-2, "layer %d: key map error %g", l, sqrt(ek / nk));
        ck_assert_msg(sqrt(ev / nv) < 1e-2, "layer %d: value map error %g", l, sqrt(ev / nv));
        ck_assert_msg(bias / (2 * kvd) < 1e-2, "layer %d: mean |bias| %g", l, bias / (2 * kvd));
        /* explained variance ~1 on held-out tokens (the residual is the input's 8-bit noise) */
        ck_assert_msg(rep.layers[l].explained_var[0] > 0.999, "layer %d K ev %g", l, rep.layers[l].explained_var[0]);
        ck_assert_msg(rep.layers[l].explained_var[1] > 0.999, "layer %d V ev %g", l, rep.layers[l].explained_var[1]);
        ck_assert_msg(rep.layers[l].rel_mse[0] < 1e-3, "layer %d K rel_mse %g", l, rep.layers[l].rel_mse[0]);
    }
    /* 8-bit reconstruction: total error tiny everywhere; without a predictor total == resid */
    for (int l = 0; l < SYN_LAYERS; l++)
        for (int st = 0; st < 2; st++) {
            ck_assert_msg(rep.layers[l].quant_rel_err[st] < 1e-4, "layer %d stream %d total %g", l, st,
                          rep.layers[l].quant_rel_err[st]);
            ck_assert(rep.layers[l].resid_rel_err[st] > 0);
        }
    ck_assert(isnan(rep.layers[0].explained_var[0]));
    ck_assert_double_eq_tol(rep.layers[0].quant_rel_err[0], rep.layers[0].resid_rel_err[0], 1e-12);
    kv_fit_report_free(&rep);
    kv_plan_free(plan);
    kv_fit_config_free(&cfg);
}
END_TEST

/* Predictors are stored in f16 by default (aqua.predictor_dtype), f32 on request. Layer 1's key
 * predictor reads layer 0's key reconstructions, which do not depend on the predictor dtype, so its
 * f16 weights must be exactly the f16 rounding of the f32 run's weights (its value predictor also
 * reads layer 1's reconstructed keys, which do) (kv_f32_to_f16, an independent conversion);
 * the stored bytes halve; and the residuals of later layers are those of the rounded predictor, so
 * the held-out error grows by no more than the f16 rounding of the prediction (2^-11 relative to
 * the predicted values, far below the 2-bit residual error: a 5% allowance). */
START_TEST(test_predictor_dtype) {
    kv_plan *plan[2] = {NULL, NULL};
    kv_fit_report rep[2];
    for (int f16 = 0; f16 < 2; f16++) {
        kv_fit_config cfg;
        const char *sets_f32[] = {"keys.bits=2", "values.bits=2", "aqua.predictor_dtype=f32", NULL};
        const char *sets_f16[] = {"keys.bits=2", "values.bits=2", NULL}; /* the default */
        make_cfg(&cfg, KV_FIT_AQUA_UNIFORM, f16 ? sets_f16 : sets_f32);
        ck_assert_kv_ok(run_fit(&plan[f16], &rep[f16], &cfg, NULL));
        kv_fit_config_free(&cfg);
    }
    for (int l = 1; l < SYN_LAYERS; l++)
        for (int st = 0; st < 2; st++) {
            ck_assert_int_eq(plan[0]->layers[l].stream[st].predictor->dtype, KV_DTYPE_F32);
            ck_assert_int_eq(plan[1]->layers[l].stream[st].predictor->dtype, KV_DTYPE_F16);
        }
    ck_assert_uint_eq(kv_plan_predictor_bytes(plan[0]), 2 * kv_plan_predictor_bytes(plan[1]));
    {
        const kv_plan_predictor *a = plan[0]->layers[1].stream[KV_PLAN_K].predictor;
        const kv_plan_predictor *b = plan[1]->layers[1].stream[KV_PLAN_K].predictor;
        const size_t nw = (size_t)a->out_dim * (size_t)a->in_dim;
        for (size_t i = 0; i < nw; i++)
            ck_assert_msg(b->weight[i] == kv_f16_to_f32(kv_f32_to_f16(a->weight[i])), "weight %zu", i);
        for (int o = 0; o < a->out_dim; o++) ck_assert(b->bias[o] == kv_f16_to_f32(kv_f32_to_f16(a->bias[o])));
    }
    for (int l = 1; l < SYN_LAYERS; l++)
        for (int st = 0; st < 2; st++)
            ck_assert_msg(rep[1].layers[l].quant_rel_err[st] < 1.05 * rep[0].layers[l].quant_rel_err[st] + 1e-6,
                          "layer %d stream %d: f16 %g vs f32 %g", l, st, rep[1].layers[l].quant_rel_err[st],
                          rep[0].layers[l].quant_rel_err[st]);
    for (int f16 = 0; f16 < 2; f16++) {
        kv_fit_report_free(&rep[f16]);
        kv_plan_free(plan[f16]);
    }
}
END_TEST

/* 4-bit predictors (aqua.predictor_bits 4, plan format 1.4): every predictor holds GPTQ codes whose values are
 * its weight (the plan validates), the bytes are the codes' (half a byte per weight) plus f16 scales, offsets
 * and bias, counted here independently of kv_plan_stream_predictor_bytes; the predictions lose little: a 4-bit
 * code is within 1/30 of its group's range of the weight, so the explained variance may drop by a few hundredths
 * at most (0.05 allowed; a wrong code, scale or bias loses far more); refusals: a group not dividing kv_dim,
 * codes with low-rank or f32 predictors. */
START_TEST(test_predictor_q4) {
    kv_plan *plan[2] = {NULL, NULL};
    kv_fit_report rep[2];
    for (int q4 = 0; q4 < 2; q4++) {
        kv_fit_config cfg;
        const char *sets_f16[] = {"keys.bits=4", "values.bits=4", NULL};
        const char *sets_q4[] = {"keys.bits=4", "values.bits=4", "aqua.predictor_bits=4", "aqua.predictor_group=8", NULL};
        make_cfg(&cfg, KV_FIT_AQUA_UNIFORM, q4 ? sets_q4 : sets_f16);
        ck_assert_kv_ok(run_fit(&plan[q4], &rep[q4], &cfg, NULL));
        kv_fit_config_free(&cfg);
    }
    uint64_t bytes = 0;
    for (int l = 1; l < SYN_LAYERS; l++)
        for (int st = 0; st < 2; st++) {
            const kv_plan_predictor *pr = plan[1]->layers[l].stream[st].predictor;
            ck_assert_int_eq(pr->qbits, 4);
            ck_assert_int_eq(pr->qgroup, 8);
            ck_assert_int_eq(pr->dtype, KV_DTYPE_F16);
            const uint64_t nw = (uint64_t)SYN_KVD * (uint64_t)pr->in_dim;
            bytes += nw / 2 + 2 * (2 * nw / 8 + SYN_KVD);
            ck_assert_msg(rep[1].layers[l].explained_var[st] > rep[0].layers[l].explained_var[st] - 0.05,
                          "layer %d stream %d: explained variance %g with 4-bit codes, %g in f16", l, st,
                          rep[1].layers[l].explained_var[st], rep[0].layers[l].explained_var[st]);
        }
    ck_assert_kv_ok(kv_plan_validate(plan[1]));
    ck_assert_uint_eq(kv_plan_predictor_bytes(plan[1]), bytes);
    /* groups of 8: 4 + 2 x 16 / 8 = 8 bits per weight, half of f16's 16 (plus the f16 bias both keep) */
    ck_assert_uint_lt(20 * kv_plan_predictor_bytes(plan[1]), 11 * kv_plan_predictor_bytes(plan[0]));
    for (int q4 = 0; q4 < 2; q4++) {
        kv_fit_report_free(&rep[q4]);
        kv_plan_free(plan[q4]);
    }
    kv_fit_config cfg;
    const char *bad_group[] = {"keys.bits=4", "values.bits=4", "aqua.predictor_bits=4", "aqua.predictor_group=32", NULL};
    make_cfg(&cfg, KV_FIT_AQUA_UNIFORM, bad_group);
    kv_plan *p = NULL;
    ck_assert_int_eq(run_fit(&p, &rep[0], &cfg, NULL), KV_EINVAL); /* 32 does not divide kv_dim 16 */
    ck_assert_ptr_nonnull(strstr(kv_error_last(), "aqua.predictor_group"));
    kv_plan_free(p);
    kv_fit_config_free(&cfg);
    kv_fit_config c2;
    ck_assert_kv_ok(kv_fit_config_init(&c2));
    ck_assert_kv_ok(kv_fit_config_method_preset(&c2, KV_FIT_AQUA));
    ck_assert_kv_ok(kv_fit_config_set(&c2, "aqua.predictor_bits=4"));
    ck_assert_kv_ok(kv_fit_config_set(&c2, "aqua.rank=8"));
    ck_assert_int_eq(kv_fit_config_validate(&c2), KV_EINVAL);
    ck_assert_ptr_nonnull(strstr(kv_error_last(), "aqua.rank 0"));
    ck_assert_kv_ok(kv_fit_config_set(&c2, "aqua.rank=0"));
    ck_assert_kv_ok(kv_fit_config_set(&c2, "aqua.predictor_bits=3"));
    ck_assert_int_eq(kv_fit_config_validate(&c2), KV_EINVAL);
    kv_fit_config_free(&c2);
}
END_TEST

/* Post-RoPE keys are not a linear function of the previous layer's post-RoPE keys (the rotation
 * depends on the position; aquakv.txt §3.3): the same model fitted post-RoPE explains less. */
START_TEST(test_post_rope_is_worse) {
    kv_fit_config cfg;
    const char *sets[] = {"keys.bits=8", "values.bits=8", "aqua.first_layer_bits=8", "cache.pre_rope=false", NULL};
    make_cfg(&cfg, KV_FIT_AQUA_UNIFORM, sets);
    kv_plan *plan = NULL;
    kv_fit_report rep;
    ck_assert_kv_ok(run_fit(&plan, &rep, &cfg, NULL));
    ck_assert_int_eq(plan->layers[1].stream[KV_PLAN_K].pre_rope, 0);
    ck_assert_msg(rep.layers[1].explained_var[0] < 0.99, "post-RoPE K ev %g", rep.layers[1].explained_var[0]);
    kv_fit_report_free(&rep);
    kv_plan_free(plan);
    kv_fit_config_free(&cfg);
}
END_TEST

/* HIGGS alone (no predictors): the relative error of a stream is the grid's MSE per dimension,
 * since the RHT makes coordinates ~N(0, 1) after scaling by the group norm. With groups of
 * head_dim = 8 values the rotated coordinates are only roughly Gaussian, hence the factor 2. */
START_TEST(test_higgs_error_near_grid_mse) {
    kv_fit_config cfg;
    const char *sets[] = {"keys.bits=4", "values.bits=4", NULL};
    make_cfg(&cfg, KV_FIT_HIGGS, sets);
    kv_plan *plan = NULL;
    kv_fit_report rep;
    ck_assert_kv_ok(run_fit(&plan, &rep, &cfg, NULL));
    ck_assert_int_eq(plan->n_grids, 1);
    ck_assert_int_eq(plan->grids[0].d, 2);
    ck_assert_int_eq(plan->grids[0].n, 256);
    double mse = 0;
    ck_assert_kv_ok(kv_grid_mse(&mse, plan->grids[0].points, 2, 256, 7, 200000));
    for (int l = 0; l < SYN_LAYERS; l++)
        for (int st = 0; st < 2; st++) {
            const kv_plan_stream *s = &plan->layers[l].stream[st];
            ck_assert_int_eq(s->method, KV_PLAN_HIGGS);
            ck_assert_int_eq(s->group_size, SYN_HEAD_DIM);
            ck_assert_ptr_null(s->predictor);
            const double e = rep.layers[l].quant_rel_err[st];
            ck_assert_msg(e > 0.5 * mse && e < 2.0 * mse, "layer %d stream %d: error %g, grid MSE %g", l, st, e, mse);
            ck_assert(isnan(rep.layers[l].rel_mse[st]));
        }
    kv_fit_report_free(&rep);
    kv_plan_free(plan);
    kv_fit_config_free(&cfg);
}
END_TEST

/* Plan contents as configured, and a write/read round trip that keeps them. */
START_TEST(test_plan_round_trip) {
    kv_fit_config cfg;
    const char *sets[] = {"keys.bits=3", "values.bits=2", "seed=42", "layers.2.value_bits=4", NULL};
    make_cfg(&cfg, KV_FIT_AQUA, sets);
    kv_plan *plan = NULL;
    kv_fit_report rep;
    kv_fit_options opt;
    kv_fit_options_init(&opt);
    opt.git_hash = "0123456789abcdef0123456789abcdef01234567";
    opt.corpus_sha256 = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";
    ck_assert_kv_ok(run_fit(&plan, &rep, &cfg, &opt));
    uint8_t *bytes = NULL;
    size_t size = 0;
    ck_assert_kv_ok(kv_plan_write_memory(&bytes, &size, plan, NULL));
    kv_plan *back = NULL;
    ck_assert_kv_ok(kv_plan_read_memory(&back, bytes, size));
    ck_assert_kv_ok(kv_plan_validate(back));
    ck_assert_int_eq(back->global.sinks, 4);
    ck_assert_int_eq(back->global.recent, 32);
    ck_assert_int_eq(back->n_layers, SYN_LAYERS);
    /* grids: layer 0 at 4 bits (n 256), keys 3 bits (n 64), values 2 bits (n 16) */
    ck_assert_int_eq(back->n_grids, 3);
    const int want_n[SYN_LAYERS][2] = {{256, 256}, {64, 16}, {64, 256}};
    for (int l = 0; l < SYN_LAYERS; l++)
        for (int st = 0; st < 2; st++) {
            const kv_plan_stream *s = &back->layers[l].stream[st];
            ck_assert_int_eq(s->method, KV_PLAN_HIGGS);
            ck_assert_int_eq(back->grids[s->higgs_grid].n, want_n[l][st]);
            ck_assert_int_eq(back->grids[s->higgs_grid].d, 2);
            ck_assert_int_eq(s->group_axis, KV_PLAN_GROUP_CHANNELS);
            ck_assert_int_eq(s->pre_rope, st == KV_PLAN_K);
            ck_assert_int_eq(s->predictor != NULL, l >= 1);
            if (s->predictor) {
                const kv_plan_predictor *a = plan->layers[l].stream[st].predictor;
                ck_assert_int_eq(s->predictor->in_dim, a->in_dim);
                ck_assert_int_eq(memcmp(s->predictor->weight, a->weight,
                                        sizeof(float) * (size_t)a->in_dim * (size_t)a->out_dim), 0);
            }
            /* log2(n)-bit indices packed floor(32/B) per word (6 bits: 5 per word), one per d = 2
             * values, plus an f16 norm per group of head_dim values (PLAN_FORMAT.md §9) */
            const int B = (int)lround(log2(want_n[l][st]));
            ck_assert_double_eq_tol(kv_plan_stream_bits(back, l, st),
                                    32.0 / (32 / B) / 2.0 + 16.0 / SYN_HEAD_DIM, 1e-9);
        }
    ck_assert_uint_eq(back->global.rht_seed, plan->global.rht_seed);
    ck_assert_uint_eq(back->provenance.seed, 42);
    ck_assert_str_eq(back->provenance.git_hash, opt.git_hash);
    ck_assert_str_eq(back->provenance.corpus_sha256, opt.corpus_sha256);
    ck_assert_int_eq(back->provenance.created, 1700000000);
    char *yaml = NULL;
    ck_assert_kv_ok(kv_fit_config_dump(&yaml, &cfg));
    ck_assert_str_eq(back->provenance.config_yaml, yaml);
    free(yaml);
    ck_assert_int_eq(back->report.n_metrics, 8);
    ck_assert_str_eq(back->report.names[0], "rel_mse");
    ck_assert_str_eq(back->report.names[1], "explained_var");
    ck_assert_str_eq(back->report.names[2], "quant_rel_err");
    ck_assert_str_eq(back->report.names[3], "resid_rel_err");
    ck_assert_str_eq(back->report.names[4], "ridge_rcond");
    ck_assert_str_eq(back->report.names[5], "ridge_fallback");
    ck_assert_str_eq(back->report.names[6], "eta_gain_vs_0");
    ck_assert_str_eq(back->report.names[7], "eta_gain_vs_datafree");
    for (int l = 0; l < SYN_LAYERS; l++)
        for (int st = 0; st < 2; st++) {
            const float *v = back->report.values + (size_t)(l * 2 + st) * KV_FIT_N_METRICS;
            ck_assert(isnan(v[6]) && isnan(v[7])); /* no eta calibrated in an AQUA-KV fit */
            ck_assert_float_eq((float)rep.layers[l].quant_rel_err[st], v[2]);
            ck_assert(l == 0 ? isnan(v[1]) : isfinite(v[1]));
            /* well-posed predictors: Cholesky, rcond far above the rank threshold */
            ck_assert(l == 0 ? isnan(v[4]) && isnan(v[5]) : v[4] > 1e3 * kv_ridge_rcond_threshold(2 * SYN_KVD));
            ck_assert(l == 0 || v[5] == 0.0f);
        }
    /* the text and JSON reports render */
    char *text = NULL;
    ck_assert_kv_ok(kv_fit_report_format(&text, &rep, 0));
    ck_assert_ptr_nonnull(strstr(text, "held-out metrics"));
    free(text);
    ck_assert_kv_ok(kv_fit_report_format(&text, &rep, 1));
    ck_assert_ptr_nonnull(strstr(text, "\"layers\""));
    free(text);
    free(bytes);
    kv_plan_free(back);
    kv_fit_report_free(&rep);
    kv_plan_free(plan);
    kv_fit_config_free(&cfg);
}
END_TEST

/* KIVI: uniform everywhere, keys per-channel (groups along tokens) post-RoPE, values per-token,
 * groups of 32, no predictors. The keys' group runs along the 32 tokens of a chunk. */
/* A model with sliding-window layers (every other layer local, a window of 8 tokens): the fit records each layer's
 * window in the plan (plan 1.5); cache.windowed_layers=f16 leaves the local layers' streams in f16 (a layer's own bits
 * win), compress (the default) quantizes them like the others; f16 with a method that always quantizes is refused
 * before any work, token pruning is taken (it prunes the layers without a window). */
START_TEST(test_windowed_layers) {
    syn_model sw;
    syn_init(&sw, 12345);
    sw.arch.sliding_window = 8;
    sw.arch.swa_pattern = 2; /* layers 0, 2, ... local */
    kv_model *m = syn_model_open(&sw);
    kv_fit_options o;
    kv_fit_options_init(&o);
    o.fingerprint = &g_fp;
    kv_fit_data d = make_data();
    for (int f16 = 0; f16 < 2; f16++) {
        const char *sets[] = {f16 ? "cache.windowed_layers=f16" : "cache.windowed_layers=compress", "layers.2.key_bits=4",
                              NULL};
        kv_fit_config cfg;
        make_cfg(&cfg, KV_FIT_KIVI, sets);
        kv_plan *plan = NULL;
        ck_assert_kv_ok(kv_fit_run(&plan, NULL, m, NULL, &d, &cfg, &o));
        for (int l = 0; l < SYN_LAYERS; l++) {
            const int local = l % 2 == 0;
            ck_assert_int_eq(plan->layers[l].window, local ? 8 : 0);
            for (int st = 0; st < 2; st++) {
                const kv_plan_stream *s = &plan->layers[l].stream[st];
                const int want_f16 = f16 && local && !(l == 2 && st == KV_PLAN_K);
                ck_assert_msg(s->method == (want_f16 ? KV_PLAN_FP : KV_PLAN_UNIFORM), "f16 %d layer %d %s: method %d", f16,
                              l, st ? "V" : "K", (int)s->method);
                if (want_f16) ck_assert_int_eq(s->bits, 16);
            }
        }
        /* the uncalibrated plan is the same shape */
        kv_plan *u = NULL;
        ck_assert_kv_ok(kv_fit_plan_uncalibrated(&u, &cfg, &g_fp, &sw.arch));
        for (int l = 0; l < SYN_LAYERS; l++) {
            ck_assert_int_eq(u->layers[l].window, plan->layers[l].window);
            ck_assert_int_eq(u->layers[l].stream[KV_PLAN_V].method, plan->layers[l].stream[KV_PLAN_V].method);
        }
        kv_plan_free(u);
        kv_plan_free(plan);
        kv_fit_config_free(&cfg);
    }
    const char *aqua[] = {"cache.windowed_layers=f16", NULL};
    kv_fit_config cfg;
    make_cfg(&cfg, KV_FIT_AQUA, aqua);
    ck_assert_int_eq(kv_fit_check(&cfg, &sw.arch), KV_EINVAL);
    ck_assert_ptr_nonnull(strstr(kv_error_last(), "cache.windowed_layers"));
    ck_assert_kv_ok(kv_fit_check(&cfg, kv_model_arch(g_model))); /* no windowed layer: nothing to refuse */
    kv_fit_config_free(&cfg);
    /* token pruning: the runtime prunes the layers without a window (RUNTIME.md §11) */
    const char *prune[] = {"pruning.method=snapkv", "pruning.budget=0.5", NULL};
    make_cfg(&cfg, KV_FIT_KIVI, prune);
    ck_assert_kv_ok(kv_fit_check(&cfg, &sw.arch));
    kv_fit_config_free(&cfg);
    kv_model_free(m);
    syn_free(&sw);
}
END_TEST

/* kvcal search's pieces on a model with windowed layers (every other layer local, a window of 8 tokens), the gap
 * the first Gemma 3 search fell into: an assembled plan and a sensitivity's one-stream plans carry the model's windows
 * (else the runtime refuses them as another model's), and the per-stream bytes are per value of the context, as
 * kvrun eval's bits_per_value_total: a windowed stream's bytes are those of the tokens it holds (about a window), its
 * values those of every appended token, so the same budget in bits means the same to the search and to the tables. */
START_TEST(test_search_windowed) {
    syn_model sw;
    syn_init(&sw, 12345);
    sw.arch.sliding_window = 8;
    sw.arch.swa_pattern = 2; /* layers 0, 2, ... local */
    sw.attn_out = 3.0f;      /* attention moves the logits: a stream's compression has a KL */
    kv_model *m = syn_model_open(&sw);
    kv_fit_options o;
    kv_fit_options_init(&o);
    o.fingerprint = &g_fp;
    kv_fit_data d = make_data();
    kv_plan *plans[2] = {NULL, NULL};
    for (int c = 0; c < 2; c++) {
        const char *sets[] = {c ? "keys.bits=16" : "keys.bits=2", c ? "values.bits=16" : "values.bits=2", NULL};
        kv_fit_config cfg;
        make_cfg(&cfg, KV_FIT_KIVI, sets);
        ck_assert_kv_ok(kv_fit_run(&plans[c], NULL, m, NULL, &d, &cfg, &o));
        kv_fit_config_free(&cfg);
    }
    int choice[2 * SYN_LAYERS];
    for (int i = 0; i < 2 * SYN_LAYERS; i++) choice[i] = i % 3 == 0; /* f16 and 2-bit streams, K and V differing */
    kv_plan *mix = NULL;
    ck_assert_kv_ok(kv_search_assemble(&mix, (const kv_plan *const *)plans, 2, choice, SYN_LAYERS));
    for (int l = 0; l < SYN_LAYERS; l++) ck_assert_int_eq(mix->layers[l].window, l % 2 == 0 ? 8 : 0);
    /* bytes: 68 tokens (4 sinks + 2 chunks of 32); values are the context's in every stream */
    enum { CTX = 68 };
    const int kvd = sw.arch.n_kv_heads * sw.arch.head_dim;
    uint64_t bytes[2 * SYN_LAYERS], values[2 * SYN_LAYERS], f16b[2 * SYN_LAYERS], f16v[2 * SYN_LAYERS];
    ck_assert_kv_ok(kv_search_stream_bytes(bytes, values, mix, m, CTX));
    ck_assert_kv_ok(kv_search_stream_bytes(f16b, f16v, plans[1], m, CTX));
    for (int i = 0; i < 2 * SYN_LAYERS; i++) {
        ck_assert_uint_eq(values[i], (uint64_t)CTX * (uint64_t)kvd);
        ck_assert_uint_eq(f16v[i], values[i]);
        const int local = (i / 2) % 2 == 0;
        /* an f16 stream of a full layer holds every token at 2 bytes; a local one at most W - 1 + the last step
         * (32 tokens, the recent buffer): the runtime's eviction (RUNTIME.md §11), 39 of the 68 tokens */
        if (!local)
            ck_assert_uint_eq(f16b[i], 2u * (uint64_t)CTX * (uint64_t)kvd);
        else
            ck_assert_msg(f16b[i] > 0 && f16b[i] <= 2u * (8u - 1u + 32u) * (uint64_t)kvd, "stream %d: %llu bytes", i,
                          (unsigned long long)f16b[i]);
    }
    /* sensitivities past the window: the one-stream plans open on the windowed model */
    double kl[2 * SYN_LAYERS * 2];
    kv_search_sens_options so = {SEQ_LEN, 2, sw.arch.bos_id, NULL, NULL};
    ck_assert_kv_ok(kv_search_sensitivity(kl, m, (const kv_plan *const *)plans, 2, g_tokens, g_n_tokens, &so, NULL));
    for (int i = 0; i < 2 * SYN_LAYERS; i++) {
        if ((i / 2) % 2 == 0) { /* a window of 8 inside the 32-token f16 buffer: a local layer compresses nothing,
                                   its f16 rows are the same in both plans */
            ck_assert_msg(kl[i * 2] == kl[i * 2 + 1], "stream %d: KL %g, %g", i, kl[i * 2], kl[i * 2 + 1]);
            continue;
        }
        ck_assert_msg(isfinite(kl[i * 2]) && kl[i * 2] > 0, "stream %d: 2-bit KL %g", i, kl[i * 2]);
        /* f16 rounds once (relative 2^-11), 2 bits errs by a quarter of a group's range: 10x apart at least */
        ck_assert_msg(kl[i * 2 + 1] * 10 < kl[i * 2], "stream %d: f16 %g, 2-bit %g", i, kl[i * 2 + 1], kl[i * 2]);
    }
    kv_plan_free(mix);
    kv_plan_free(plans[0]);
    kv_plan_free(plans[1]);
    kv_model_free(m);
    syn_free(&sw);
}
END_TEST

START_TEST(test_kivi_preset) {
    kv_fit_config cfg;
    ck_assert_kv_ok(kv_fit_config_init(&cfg));
    ck_assert_kv_ok(kv_fit_config_method_preset(&cfg, KV_FIT_KIVI));
    ck_assert_int_eq(cfg.keys.group_size, 32);
    ck_assert_int_eq(cfg.keys.group_axis, KV_PLAN_GROUP_TOKENS);
    ck_assert_int_eq(cfg.values.group_axis, KV_PLAN_GROUP_CHANNELS);
    ck_assert_int_eq(cfg.cache.pre_rope, 0);
    const char *sets[] = {"data.seq_len=68", "cache.recent=32", "data.heldout_fraction=0.25",
                          /* per-layer overrides as kvprof writes them */
                          "layers.0.key_bits=4", "layers.1.rpc_ratio=0.1", "layers.1.key_rpc_ratio=0.2",
                          "layers.2.value_eta=0.1", "layers.2.prune_budget=0.5", NULL};
    for (int i = 0; sets[i]; i++) ck_assert_kv_ok(kv_fit_config_set(&cfg, sets[i]));
    kv_plan *plan = NULL;
    kv_fit_report rep;
    ck_assert_kv_ok(run_fit(&plan, &rep, &cfg, NULL));
    ck_assert_int_eq(plan->layers[0].stream[KV_PLAN_K].bits, 4);
    ck_assert_int_eq(plan->layers[0].stream[KV_PLAN_V].bits, 2);
    ck_assert_float_eq(plan->layers[1].stream[KV_PLAN_K].rpc_ratio, 0.2f); /* the stream's own wins */
    ck_assert_float_eq(plan->layers[1].stream[KV_PLAN_V].rpc_ratio, 0.1f);
    ck_assert_float_eq(plan->layers[0].stream[KV_PLAN_V].rpc_ratio, 0.0f);
    ck_assert_float_eq(plan->layers[2].stream[KV_PLAN_V].eta, 0.1f);
    ck_assert_float_eq(plan->layers[2].stream[KV_PLAN_K].eta, 0.0f);
    ck_assert_float_eq(plan->layers[2].prune_budget, 0.5f);
    ck_assert(rep.layers[0].quant_rel_err[KV_PLAN_K] < rep.layers[1].quant_rel_err[KV_PLAN_K]); /* 4 vs 2 bits */
    for (int l = 0; l < SYN_LAYERS; l++) {
        const kv_plan_stream *k = &plan->layers[l].stream[KV_PLAN_K], *v = &plan->layers[l].stream[KV_PLAN_V];
        ck_assert_int_eq(k->method, KV_PLAN_UNIFORM);
        ck_assert_int_eq(k->bits, l == 0 ? 4 : 2);
        ck_assert_int_eq(k->group_axis, KV_PLAN_GROUP_TOKENS);
        ck_assert_int_eq(k->group_size, 32);
        ck_assert_int_eq(k->pre_rope, 0);
        ck_assert_int_eq(v->group_axis, KV_PLAN_GROUP_CHANNELS);
        ck_assert_ptr_null(k->predictor);
        ck_assert_ptr_null(v->predictor);
        /* 2-bit min-max: a few percent to a few tens of percent of the energy */
        for (int st = 0; st < 2; st++)
            ck_assert_msg(rep.layers[l].quant_rel_err[st] > 1e-3 && rep.layers[l].quant_rel_err[st] < 0.5,
                          "layer %d stream %d: %g", l, st, rep.layers[l].quant_rel_err[st]);
    }
    kv_fit_report_free(&rep);
    kv_plan_free(plan);
    kv_fit_config_free(&cfg);
}
END_TEST

/* The calibration's round trips are libkvrt's: quantizing a held-out chunk's keys with the plan's
 * quantizer outside the fit reproduces the reported error for a method without predictors. */
START_TEST(test_same_quantizer_as_runtime) {
    kv_fit_config cfg;
    make_cfg(&cfg, KV_FIT_HIGGS, NULL);
    kv_plan *plan = NULL;
    kv_fit_report rep;
    ck_assert_kv_ok(run_fit(&plan, &rep, &cfg, NULL));
    kv_quant q;
    ck_assert_kv_ok(kv_quant_from_plan(&q, plan, 0, KV_PLAN_K));
    ck_assert_int_eq(q.kind, KV_QUANT_HIGGS);
    kv_block_storage st;
    ck_assert_kv_ok(kv_quant_storage(&st, &q, 32, SYN_KVD));
    ck_assert_double_eq_tol(st.bits_per_value, kv_plan_stream_bits(plan, 0, KV_PLAN_K), 1e-9);
    kv_fit_report_free(&rep);
    kv_plan_free(plan);
    kv_fit_config_free(&cfg);
}
END_TEST

/* ---- XQuant: the plan's layout, and the runtime compresses exactly as the fit measured ---- */
typedef struct xq_capture {
    float *k, *v; /* [layer][row][kv_dim] */
    int rows;
} xq_capture;

static kv_status xq_hook(void *user, const kv_capture *c) {
    xq_capture *x = user;
    const size_t n = (size_t)c->n_seqs * (size_t)c->n_tokens * SYN_KVD;
    memcpy(x->k + (size_t)c->layer * n, c->k, n * sizeof(float));
    memcpy(x->v + (size_t)c->layer * n, c->v, n * sizeof(float));
    return KV_OK;
}

/* Layers 1 shares layer 0's codes (km = vm = 0: pairs (0, 1)), layer 2 has 1-bit codes (kq = vq =
 * 2); the data-free eta is eta2 on the 2-bit streams and eta1 on the 1-bit ones. Then every
 * held-out sequence goes through the engine-facing runtime with the fitted plan (one more token
 * makes it compress both chunks), and the runtime's decoded cache gives the held-out relative
 * error the fit reported. The K/V differ in their last bits: the fit runs its sequences through the
 * model batched, this test one at a time, and OpenBLAS's AVX-512 sgemm kernels (Cooperlake,
 * SkylakeX) round by matrix shape; a value at a rounding boundary then takes the neighbouring code:
 * 3.1e-6 relative measured there. 3e-5 allows ten such flips while a
 * wrong eta moves the error far more (every eta off by 0.01: 2e-3 to 4e-2 relative in 11 of the 12
 * streams, 1e-4 in the 12th), as does a wrong partner layer or bit width. */
START_TEST(test_xquant_runtime_applies_fit) {
    /* _i = 0: the data-free eta; 1: eta calibrated on the data */
    const char *sets[] = {"xquant.km=0", "xquant.vm=0", "xquant.kq=2", "xquant.vq=2",
                          _i ? "xquant.calibrate_eta=true" : NULL, NULL};
    kv_fit_config cfg;
    make_cfg(&cfg, KV_FIT_XQUANT, sets);
    ck_assert_int_eq(cfg.keys.group_axis, KV_PLAN_GROUP_TOKENS); /* the KIVI layout */
    kv_plan *plan = NULL;
    kv_fit_report rep;
    ck_assert_kv_ok(run_fit(&plan, &rep, &cfg, NULL));
    for (int st = 0; st < 2; st++) {
        const kv_plan_stream *s0 = &plan->layers[0].stream[st], *s1 = &plan->layers[1].stream[st],
                             *s2 = &plan->layers[2].stream[st];
        ck_assert_int_eq(s0->share_codes_with_layer, -1);
        ck_assert_int_eq(s1->share_codes_with_layer, 0);
        ck_assert_int_eq(s2->share_codes_with_layer, -1);
        ck_assert_int_eq(s0->bits, 2);
        ck_assert_int_eq(s1->bits, 2);
        ck_assert_int_eq(s2->bits, 1);
        if (_i == 0) {
            ck_assert_float_eq(s0->eta, 0.05f);
            ck_assert_float_eq(s1->eta, 0.05f);
            ck_assert_float_eq(s2->eta, 0.2f);
            ck_assert(isnan(rep.layers[2].eta_gain_vs_0[st]));
        } else {
            for (int l = 0; l < SYN_LAYERS; l++) {
                const float eta = plan->layers[l].stream[st].eta;
                const double g0 = rep.layers[l].eta_gain_vs_0[st], gd = rep.layers[l].eta_gain_vs_datafree[st];
                ck_assert(eta >= 0.0f && eta <= 0.49f);
                ck_assert_double_eq(rep.layers[l].eta[st], eta);
                /* the eta is chosen on 30 calibration sequences and scored on 10 held-out ones: on the
                 * held-out error it may lose a little against eta = 0 or the data-free value, never much */
                ck_assert_msg(g0 > -0.05 && gd > -0.05, "layer %d stream %d: eta %g gains %g %g", l, st, eta, g0, gd);
                const float *v = plan->report.values + ((size_t)l * 2 + (size_t)st) * KV_FIT_N_METRICS;
                ck_assert_float_eq(v[6], (float)g0); /* recorded in the plan's report */
                ck_assert_float_eq(v[7], (float)gd);
            }
            /* 1-bit codes at the ends of the range are far from the values (xquant.txt §3.2): a
             * calibrated eta wins clearly over eta = 0 there */
            ck_assert_msg(rep.layers[2].eta_gain_vs_0[st] > 0.05, "layer 2 stream %d: gain %g", st,
                          rep.layers[2].eta_gain_vs_0[st]);
        }
        /* shared codes are counted once: layer 1 pays for its scales and zero points only */
        ck_assert_double_eq_tol(kv_plan_stream_bits(plan, 1, st), 2.0 * 16.0 / 16.0, 1e-12);
        ck_assert_double_eq_tol(kv_plan_stream_bits(plan, 0, st), 2.0 + 2.0 * 16.0 / 16.0, 1e-12);
        ck_assert_double_eq_tol(rep.layers[1].bits[st], 2.0, 1e-12);
    }
    kv_fit_seqs seqs;
    kv_fit_data d = make_data();
    ck_assert_kv_ok(kv_fit_make_seqs(&seqs, &d, &cfg));
    ck_assert_int_eq(seqs.n_ho, rep.n_heldout_seqs);
    const int T = seqs.seq_len, sinks = 4, recent = 32, n_comp = 2 * recent;
    xq_capture x = {malloc((size_t)SYN_LAYERS * (size_t)T * SYN_KVD * sizeof(float)),
                    malloc((size_t)SYN_LAYERS * (size_t)T * SYN_KVD * sizeof(float)), T};
    float *kd = malloc((size_t)(T + 1) * SYN_HEAD_DIM * sizeof(float)), *vd = malloc((size_t)(T + 1) * SYN_HEAD_DIM * sizeof(float));
    int32_t *pos = malloc((size_t)(T + 1) * sizeof(int32_t));
    for (int t = 0; t <= T; t++) pos[t] = t;
    double ss[SYN_LAYERS][2] = {{0}}, se[SYN_LAYERS][2] = {{0}};
    kv_rt_options ro;
    memset(&ro, 0, sizeof ro);
    ro.n_seqs = 1, ro.n_heads = SYN_HEADS, ro.n_threads = 1;
    kv_rt *rt = NULL;
    ck_assert_kv_ok(kv_rt_open(&rt, plan, &ro));
    for (int64_t q = 0; q < seqs.n_ho; q++) {
        kv_hooks hooks;
        memset(&hooks, 0, sizeof hooks);
        hooks.on_layer = xq_hook, hooks.user = &x;
        kv_forward f;
        memset(&f, 0, sizeof f);
        f.tokens = seqs.tokens + (size_t)(seqs.n_cal + q) * (size_t)T;
        f.n_seqs = 1, f.n_tokens = T, f.hooks = &hooks;
        ck_assert_kv_ok(kv_model_forward(g_model, &f));
        kv_rt_reset(rt, 0);
        for (int l = 0; l < SYN_LAYERS; l++) {
            const float *kl = x.k + (size_t)l * (size_t)T * SYN_KVD, *vl = x.v + (size_t)l * (size_t)T * SYN_KVD;
            ck_assert_kv_ok(kv_rt_append(rt, l, 0, T, pos, NULL, kl, vl, SYN_KVD));
        }
        for (int l = 0; l < SYN_LAYERS; l++) { /* one more token: the window's two chunks get compressed */
            const float *kl = x.k + ((size_t)l * (size_t)T + (size_t)(T - 1)) * SYN_KVD;
            const float *vl = x.v + ((size_t)l * (size_t)T + (size_t)(T - 1)) * SYN_KVD;
            ck_assert_kv_ok(kv_rt_append(rt, l, 0, 1, pos + T, NULL, kl, vl, SYN_KVD));
        }
        for (int l = 0; l < SYN_LAYERS; l++)
            for (int h = 0; h < SYN_KV_HEADS; h++) {
                ck_assert_kv_ok(kv_rt_decode_head(rt, l, 0, h, kd, vd));
                for (int t = sinks; t < sinks + n_comp; t++)
                    for (int c = 0; c < SYN_HEAD_DIM; c++) {
                        const size_t at = ((size_t)l * (size_t)T + (size_t)t) * SYN_KVD + (size_t)h * SYN_HEAD_DIM + (size_t)c;
                        const double yk = x.k[at], yv = x.v[at];
                        const double ek = yk - kd[(size_t)t * SYN_HEAD_DIM + (size_t)c];
                        const double ev = yv - vd[(size_t)t * SYN_HEAD_DIM + (size_t)c];
                        ss[l][0] += yk * yk, ss[l][1] += yv * yv, se[l][0] += ek * ek, se[l][1] += ev * ev;
                    }
            }
    }
    for (int l = 0; l < SYN_LAYERS; l++)
        for (int st = 0; st < 2; st++) {
            const double mine = se[l][st] / ss[l][st], fit = rep.layers[l].quant_rel_err[st];
            ck_assert_msg(fabs(mine - fit) <= 3e-5 * fit, "layer %d stream %d: runtime %.12g, fit %.12g", l, st, mine,
                          fit);
            ck_assert(fit > 1e-4); /* a real quantization error, not a vacuous match */
        }
    kv_rt_close(rt);
    free(x.k), free(x.v), free(kd), free(vd), free(pos);
    kv_fit_seqs_free(&seqs);
    kv_fit_report_free(&rep);
    kv_plan_free(plan);
    kv_fit_config_free(&cfg);
}
END_TEST

/* E(eta) = A + 2 eta B + eta^2 D: the minimum -B/D, clamped to [0, 0.49]; gains on the held-out sums. */
START_TEST(test_xquant_eta_choose) {
    double eta, g0, gd;
    /* calibration (1 - 5 eta)^2 * 4 = 4 - 40 eta + 100 eta^2: minimum at 0.2; held-out the same */
    const double a[6] = {4, -20, 100, 4, -20, 100};
    kv_fit_xq_eta_choose(a, 0.1, &eta, &g0, &gd);
    ck_assert_double_eq_tol(eta, 0.2, 1e-7); /* stored as a float */
    ck_assert_double_eq_tol(g0, 1.0, 1e-6);  /* E(0.2) = 0 */
    ck_assert_double_eq_tol(gd, 1.0, 1e-6);
    const double b[6] = {1, 5, 1, 1, 5, 1}; /* increasing: eta 0 */
    kv_fit_xq_eta_choose(b, 0.2, &eta, &g0, &gd);
    ck_assert_double_eq(eta, 0.0);
    ck_assert_double_eq(g0, 0.0);
    ck_assert_double_eq_tol(gd, 1.0 - 1.0 / (1 + 2 * 0.2 * 5 + 0.04), 1e-12);
    const double c[6] = {1, -10, 1, 1, -10, 1}; /* minimum at 10: clamped */
    kv_fit_xq_eta_choose(c, 0.0, &eta, &g0, &gd);
    ck_assert_double_eq_tol(eta, 0.49, 1e-7);
    const double z[6] = {0, 0, 0, 0, 0, 0}; /* no error at all */
    kv_fit_xq_eta_choose(z, 0.0, &eta, &g0, &gd);
    ck_assert_double_eq(eta, 0.0);
    ck_assert(isnan(g0));
}
END_TEST

/* --target-bits: with groups of 16 and f16 scale + zero point, a stream costs 4 bits per value with
 * 2-bit codes, 3 with 1-bit codes, 2 when it shares its codes. Everything allowed (4): the least
 * error is 2-bit everywhere; 3.2: at most that on average, and the fitted plan says so; 2.5: below
 * the 8/3 that every layer 1-bit and pair (0, 1) sharing cost, refused with that number. */
START_TEST(test_xquant_target_bits) {
    static const char *const targets[] = {"xquant.target_bits=4", "xquant.target_bits=3.2", "xquant.target_bits=2.5"};
    const char *sets[] = {targets[_i], "keys.scale_dtype=f16", "values.scale_dtype=f16", NULL};
    kv_fit_config cfg;
    make_cfg(&cfg, KV_FIT_XQUANT, sets);
    kv_plan *plan = NULL;
    kv_fit_report rep;
    memset(&rep, 0, sizeof rep);
    /* kv_fit_run fits no target itself: the probe chooses first (calib/xquant_probe.c) */
    ck_assert_int_eq(run_fit(&plan, &rep, &cfg, NULL), KV_EINVAL);
    ck_assert_msg(strstr(kv_error_last(), "kv_xquant_probe"), "message: %s", kv_error_last());
    ck_assert_ptr_null(plan);
    kv_xquant_choice c;
    kv_fit_options o;
    kv_fit_options_init(&o);
    o.fingerprint = &g_fp;
    kv_fit_data d = make_data();
    kv_status s = kv_xquant_probe(&c, g_model, NULL, &d, &cfg, &o);
    if (s == KV_OK) {
        kv_xquant_choice_apply(&cfg, &c);
        ck_assert(cfg.xquant.target_bits == 0);
        s = run_fit(&plan, &rep, &cfg, NULL);
        if (s == KV_OK) kv_xquant_choice_report(&rep, &c);
    }
    if (_i == 2) {
        ck_assert_int_eq(s, KV_EINVAL);
        ck_assert_msg(strstr(kv_error_last(), "no setting of kq, vq, km, vm reaches it") &&
                          strstr(kv_error_last(), "are 2.6667"), "message: %s", kv_error_last());
        ck_assert_ptr_null(plan);
    } else {
        ck_assert_kv_ok(s);
        double bits = 0;
        for (int l = 0; l < SYN_LAYERS; l++)
            for (int st = 0; st < 2; st++) bits += kv_plan_stream_bits(plan, l, st);
        bits /= 2 * SYN_LAYERS;
        ck_assert_double_eq(rep.xq_target_bits, _i ? 3.2 : 4.0);
        if (_i == 0) {
            ck_assert_double_eq_tol(bits, 4.0, 1e-12);
            for (int k = 0; k < 4; k++) ck_assert_int_eq(rep.xq_chosen[k], -1);
        } else {
            ck_assert_msg(bits <= 3.2 && bits > 2.0, "bits %g", bits);
            int any = 0;
            for (int k = 0; k < 4; k++) any |= rep.xq_chosen[k] >= 0;
            ck_assert(any);
        }
        kv_fit_report_free(&rep);
        kv_plan_free(plan);
    }
    kv_fit_config_free(&cfg);
}
END_TEST

/* Pairs must not mix bit widths: kq = 1 would make layer 1 1-bit and share 2-bit layer 0's codes. */
START_TEST(test_xquant_odd_split_refused) {
    const char *sets[] = {"xquant.km=0", "xquant.kq=1", NULL};
    kv_fit_config cfg;
    make_cfg(&cfg, KV_FIT_XQUANT, sets);
    kv_plan *plan = NULL;
    ck_assert_int_eq(run_fit(&plan, NULL, &cfg, NULL), KV_EINVAL);
    ck_assert_msg(strstr(kv_error_last(), "layer 1 K would share the codes of layer 0"), "message: %s", kv_error_last());
    ck_assert_ptr_null(plan);
    kv_fit_config_free(&cfg);
    /* sharing keys belong to method xquant */
    ck_assert_kv_ok(kv_fit_config_init(&cfg));
    ck_assert_int_eq(kv_fit_config_set(&cfg, "xquant.km=2"), KV_OK);
    ck_assert_int_eq(kv_fit_config_validate(&cfg), KV_EINVAL);
    ck_assert_ptr_nonnull(strstr(kv_error_last(), "method xquant"));
    kv_fit_config_free(&cfg);
}
END_TEST

/* ---- bad inputs ---- */
START_TEST(test_bad_inputs) {
    kv_fit_config cfg;
    make_cfg(&cfg, KV_FIT_KIVI, NULL);
    kv_plan *plan = NULL;
    kv_fit_options o;
    kv_fit_options_init(&o);
    o.fingerprint = &g_fp;
    kv_fit_data d = make_data();
    /* shorter than two sequences */
    d.n_tokens = SEQ_LEN + 5;
    ck_assert_int_eq(kv_fit_run(&plan, NULL, g_model, NULL, &d, &cfg, &o), KV_EINVAL);
    ck_assert_ptr_nonnull(strstr(kv_error_last(), "fewer than the two sequences"));
    ck_assert_ptr_null(plan);
    /* an empty corpus */
    d.n_tokens = 0;
    ck_assert_int_eq(kv_fit_run(&plan, NULL, g_model, NULL, &d, &cfg, &o), KV_EINVAL);
    d = make_data();
    /* a token outside the vocabulary */
    int32_t saved = g_tokens[5];
    g_tokens[5] = SYN_VOCAB;
    ck_assert_int_eq(kv_fit_run(&plan, NULL, g_model, NULL, &d, &cfg, &o), KV_EINVAL);
    ck_assert_ptr_nonnull(strstr(kv_error_last(), "outside the vocabulary"));
    g_tokens[5] = saved;
    /* a sequence too short for sinks + one chunk */
    ck_assert_kv_ok(kv_fit_config_set(&cfg, "data.seq_len=30"));
    ck_assert_int_eq(kv_fit_run(&plan, NULL, g_model, NULL, &d, &cfg, &o), KV_EINVAL);
    ck_assert_ptr_nonnull(strstr(kv_error_last(), "at least one chunk"));
    ck_assert_kv_ok(kv_fit_config_set(&cfg, "data.seq_len=68"));
    /* key groups along tokens that do not divide the chunk */
    ck_assert_kv_ok(kv_fit_config_set(&cfg, "keys.group_size=24"));
    ck_assert_int_eq(kv_fit_run(&plan, NULL, g_model, NULL, &d, &cfg, &o), KV_EINVAL);
    ck_assert_ptr_nonnull(strstr(kv_error_last(), "must divide cache.recent"));
    ck_assert_kv_ok(kv_fit_config_set(&cfg, "keys.group_size=32"));
    /* SQuat keys before RoPE: the queries whose subspace they protect are post-RoPE */
    ck_assert_kv_ok(kv_fit_config_set(&cfg, "squat.enabled=true"));
    ck_assert_kv_ok(kv_fit_config_set(&cfg, "cache.pre_rope=true"));
    ck_assert_int_eq(kv_fit_run(&plan, NULL, g_model, NULL, &d, &cfg, &o), KV_EINVAL);
    ck_assert_ptr_nonnull(strstr(kv_error_last(), "cache.pre_rope"));
    ck_assert_kv_ok(kv_fit_config_set(&cfg, "cache.pre_rope=false"));
    ck_assert_kv_ok(kv_fit_config_set(&cfg, "squat.enabled=false"));
    /* HIGGS at 5 bits needs a 1024-point grid */
    kv_fit_config c2;
    const char *sets[] = {"keys.bits=5", NULL};
    make_cfg(&c2, KV_FIT_HIGGS, sets);
    ck_assert_int_eq(kv_fit_run(&plan, NULL, g_model, NULL, &d, &c2, &o), KV_EINVAL);
    ck_assert_ptr_nonnull(strstr(kv_error_last(), "at most 256 points"));
    /* an interrupt flag already set stops before any work */
    volatile sig_atomic_t flag = 1;
    o.interrupt = &flag;
    ck_assert_int_eq(kv_fit_run(&plan, NULL, g_model, NULL, &d, &cfg, &o), KV_EINTERRUPTED);
    ck_assert_ptr_null(plan);
    kv_fit_config_free(&c2);
    kv_fit_config_free(&cfg);
}
END_TEST

/* A held-out corpus given separately. */
START_TEST(test_separate_heldout) {
    kv_fit_config cfg;
    const char *sets[] = {"data.heldout_fraction=0.1", NULL};
    make_cfg(&cfg, KV_FIT_KIVI, sets);
    kv_fit_options o;
    kv_fit_options_init(&o);
    o.fingerprint = &g_fp;
    kv_fit_data d = make_data();
    d.n_tokens = (size_t)30 * (SEQ_LEN - 1);
    d.heldout_tokens = g_tokens + d.n_tokens;
    d.n_heldout_tokens = (size_t)10 * (SEQ_LEN - 1);
    kv_plan *plan = NULL;
    kv_fit_report rep;
    ck_assert_kv_ok(kv_fit_run(&plan, &rep, g_model, NULL, &d, &cfg, &o));
    ck_assert_int_eq(rep.n_calib_seqs, 30);
    ck_assert_int_eq(rep.n_heldout_seqs, 3);
    kv_fit_report_free(&rep);
    kv_plan_free(plan);
    kv_fit_config_free(&cfg);
}
END_TEST

/* ---- checkpoints ---- */
/* Stop after layer k (k = 0, 1), resume, compare with an uninterrupted run byte for byte. _i = 2:
 * XQuant with calibrated eta and the pair (0, 1) sharing codes, stopped after layer 1 (the first
 * checkpoint: none is written inside a pair); the resumed layers' eta is reported from the plan. */
START_TEST(test_resume_equals_uninterrupted) {
    const int k = _i == 2 ? 1 : _i;
    const char *xq[] = {"xquant.km=0", "xquant.vm=0", "xquant.kq=2", "xquant.calibrate_eta=true", NULL};
    kv_fit_config cfg;
    make_cfg(&cfg, _i == 2 ? KV_FIT_XQUANT : KV_FIT_AQUA, _i == 2 ? xq : NULL);
    kv_plan *ref = NULL, *plan = NULL;
    kv_fit_report rep;
    ck_assert_kv_ok(run_fit(&ref, NULL, &cfg, NULL));
    ckpt_env e;
    ckpt_env_init(&e, k);
    char *dir = e.dir, *ck = e.ck;
    kv_fit_options o = e.o;
    ck_assert_int_eq(run_fit(&plan, NULL, &cfg, &o), KV_EINTERRUPTED);
    ck_assert_ptr_null(plan);
    ck_assert(dir_exists(ck));
    o.stop_after_layer = -1;
    ck_assert_kv_ok(run_fit(&plan, &rep, &cfg, &o));
    ck_assert_int_eq(rep.resumed_from_layer, k + 1);
    ck_assert_int_eq(rep.layers[0].resumed, 1);
    ck_assert_int_eq(rep.layers[SYN_LAYERS - 1].resumed, 0);
    ck_assert(!dir_exists(ck)); /* removed on success */
    assert_same_plan(ref, plan);
    for (int st = 0; _i == 2 && st < 2; st++) {
        ck_assert_double_eq(rep.layers[0].eta[st], plan->layers[0].stream[st].eta);
        ck_assert(isfinite(rep.layers[0].eta_gain_vs_0[st])); /* from the checkpoint's report */
    }
    kv_fit_report_free(&rep);
    kv_plan_free(plan);
    kv_plan_free(ref);
    kv_fit_config_free(&cfg);
    rmdir(dir);
}
END_TEST

/* A checkpoint made with other inputs is not used: the run starts over and gives the plan of a
 * fresh run with the new inputs; the plan also lands at out_path. */
START_TEST(test_resume_mismatch_starts_over) {
    kv_fit_config c1, c2;
    const char *s1[] = {"seed=1", NULL}, *s2[] = {"seed=2", NULL};
    make_cfg(&c1, KV_FIT_AQUA, s1);
    make_cfg(&c2, KV_FIT_AQUA, s2);
    ckpt_env e;
    ckpt_env_init(&e, 0);
    char *dir = e.dir, *ck = e.ck, out[300];
    snprintf(out, sizeof out, "%s/p.kvplan", dir);
    kv_fit_options o = e.o;
    kv_plan *plan = NULL, *ref = NULL;
    ck_assert_int_eq(run_fit(&plan, NULL, &c1, &o), KV_EINTERRUPTED);
    o.stop_after_layer = -1;
    o.out_path = out;
    kv_fit_report rep;
    ck_assert_kv_ok(run_fit(&plan, &rep, &c2, &o));
    ck_assert_int_eq(rep.resumed_from_layer, 0);
    ck_assert_kv_ok(run_fit(&ref, NULL, &c2, NULL));
    assert_same_plan(ref, plan);
    kv_plan *disk = NULL;
    ck_assert_kv_ok(kv_plan_read(&disk, out));
    ck_assert_int_eq(disk->n_layers, SYN_LAYERS);
    kv_plan_free(disk);
    unlink(out);
    ck_assert(!dir_exists(ck));
    kv_fit_report_free(&rep);
    kv_plan_free(plan);
    kv_plan_free(ref);
    kv_fit_config_free(&c1);
    kv_fit_config_free(&c2);
    rmdir(dir);
}
END_TEST

/* A corrupted state file is detected (CRC) and the run starts over. */
START_TEST(test_resume_corrupt_state) {
    kv_fit_config cfg;
    make_cfg(&cfg, KV_FIT_KIVI, NULL);
    ckpt_env e;
    ckpt_env_init(&e, 0);
    char *dir = e.dir, state[340];
    snprintf(state, sizeof state, "%s/state.0.0.bin", e.ck); /* layer 0, shard 0 */
    kv_fit_options o = e.o;
    kv_plan *plan = NULL, *ref = NULL;
    ck_assert_int_eq(run_fit(&plan, NULL, &cfg, &o), KV_EINTERRUPTED);
    FILE *fp = fopen(state, "r+b");
    ck_assert_ptr_nonnull(fp);
    fseek(fp, 200, SEEK_SET);
    fputc(0x5a, fp);
    fclose(fp);
    o.stop_after_layer = -1;
    kv_fit_report rep;
    ck_assert_kv_ok(run_fit(&plan, &rep, &cfg, &o));
    ck_assert_int_eq(rep.resumed_from_layer, 0);
    ck_assert_kv_ok(run_fit(&ref, NULL, &cfg, NULL));
    assert_same_plan(ref, plan);
    kv_fit_report_free(&rep);
    kv_plan_free(plan);
    kv_plan_free(ref);
    kv_fit_config_free(&cfg);
    rmdir(dir);
}
END_TEST

/* A model whose layer-0 keys have two identical channels (so the reconstructed K(0), the input of
 * layer 1's key predictor, has twin columns) fitted with aqua.ridge = 0: the solve is rank
 * deficient on every BLAS kernel; the report and the plan's REPT record it (fallback 1, rcond below
 * the threshold), the twins get equal weights, and the text report warns. */
START_TEST(test_rank_deficient_predictor_reported) {
    syn_model sm;
    syn_init(&sm, 777);
    memcpy(sm.wk[0] + SYN_DMODEL, sm.wk[0], sizeof(float) * SYN_DMODEL); /* K channel 1 = channel 0 */
    for (int l = 1; l < SYN_LAYERS; l++) /* keep K(l) = A_l K(l-1) exact */
        syn_matmul(sm.wk[l], sm.A[l], sm.wk[l - 1], SYN_KVD, SYN_KVD, SYN_DMODEL);
    kv_model *m = syn_model_open(&sm);
    kv_fit_config cfg;
    const char *sets[] = {"keys.bits=8", "values.bits=8", "aqua.first_layer_bits=8", "aqua.ridge=0", NULL};
    make_cfg(&cfg, KV_FIT_AQUA_UNIFORM, sets);
    kv_fit_options o;
    kv_fit_options_init(&o);
    kv_plan_fingerprint fp;
    syn_fingerprint(&fp, &sm.arch);
    o.fingerprint = &fp;
    kv_fit_data d = make_data();
    kv_plan *plan = NULL;
    kv_fit_report rep;
    ck_assert_kv_ok(kv_fit_run(&plan, &rep, m, NULL, &d, &cfg, &o));
    ck_assert_double_eq(rep.layers[1].ridge_fallback[KV_PLAN_K], 1.0);
    ck_assert_double_lt(rep.layers[1].ridge_rcond[KV_PLAN_K], kv_ridge_rcond_threshold(SYN_KVD));
    const float *v = plan->report.values + (size_t)(1 * 2 + KV_PLAN_K) * KV_FIT_N_METRICS;
    ck_assert_str_eq(plan->report.names[5], "ridge_fallback");
    ck_assert_float_eq(v[5], 1.0f);
    ck_assert(v[4] < kv_ridge_rcond_threshold(SYN_KVD));
    /* the predictor: weights of the twin input channels are equal (1e-4 of the largest weight:
     * the minimum-norm split is exact up to float storage), the prediction still explains K(1) */
    const kv_plan_predictor *pk = plan->layers[1].stream[KV_PLAN_K].predictor;
    ck_assert_ptr_nonnull(pk);
    double wmax = 0;
    for (int i = 0; i < pk->out_dim * pk->in_dim; i++) wmax = fmax(wmax, fabs(pk->weight[i]));
    for (int o2 = 0; o2 < pk->out_dim; o2++)
        ck_assert_msg(fabs(pk->weight[o2 * pk->in_dim + 0] - pk->weight[o2 * pk->in_dim + 1]) < 1e-4 * wmax,
                      "output %d: twin weights %g and %g", o2, pk->weight[o2 * pk->in_dim],
                      pk->weight[o2 * pk->in_dim + 1]);
    ck_assert_msg(rep.layers[1].explained_var[KV_PLAN_K] > 0.999, "K ev %g", rep.layers[1].explained_var[KV_PLAN_K]);
    char *text = NULL;
    ck_assert_kv_ok(kv_fit_report_format(&text, &rep, 0));
    ck_assert_msg(strstr(text, "minimum-norm") && strstr(text, "layer 1 K"), "report: %s", text);
    free(text);
    ck_assert_kv_ok(kv_fit_report_format(&text, &rep, 1));
    ck_assert_ptr_nonnull(strstr(text, "\"ridge_fallback\": 1"));
    free(text);
    kv_fit_report_free(&rep);
    kv_plan_free(plan);
    kv_fit_config_free(&cfg);
    kv_model_free(m);
    syn_free(&sm);
}
END_TEST

/* NaN in a weight: the fit names non-finite activations at the layer (not a LAPACK argument), and
 * a failure after a checkpoint says where the checkpoint is; one before any layer leaves no
 * directory behind. */
START_TEST(test_non_finite_layer) {
    for (int bad_layer = 0; bad_layer < 2; bad_layer++) {
        syn_model sm;
        syn_init(&sm, 4242);
        sm.wk[bad_layer][5] = NAN;
        kv_model_options mo;
        memset(&mo, 0, sizeof mo);
        mo.n_threads = 1;
        kv_model *m = NULL;
        ck_assert_kv_ok(kv_model_create(&m, &sm.arch, syn_read, &sm, &mo));
        kv_fit_config cfg;
        make_cfg(&cfg, KV_FIT_AQUA, NULL);
        ckpt_env e;
        ckpt_env_init(&e, -1);
        kv_plan_fingerprint fp;
        syn_fingerprint(&fp, &sm.arch);
        e.o.fingerprint = &fp;
        kv_fit_data d = make_data();
        kv_plan *plan = NULL;
        ck_assert_int_eq(kv_fit_run(&plan, NULL, m, NULL, &d, &cfg, &e.o), KV_ENUMERIC);
        char want[64];
        snprintf(want, sizeof want, "non-finite activations at layer %d", bad_layer);
        ck_assert_msg(strstr(kv_error_last(), want) != NULL, "message: %s", kv_error_last());
        ck_assert_ptr_null(strstr(kv_error_last(), "LAPACKE"));
        if (bad_layer == 0) {
            ck_assert(!dir_exists(e.ck));
        } else {
            ck_assert(dir_exists(e.ck));
            ck_assert_msg(strstr(kv_error_last(), "checkpoint after layer 0 is kept in") &&
                              strstr(kv_error_last(), e.ck), "message: %s", kv_error_last());
            ck_assert_kv_ok(kv_fit_ckpt_remove(e.ck));
        }
        ck_assert_ptr_null(plan);
        rmdir(e.dir);
        kv_fit_config_free(&cfg);
        kv_model_free(m);
        syn_free(&sm);
    }
}
END_TEST

/* What the fit refuses before any work, naming the configuration key and where it was set: token
 * pruning with AQUA-KV predictors (the runtime does not combine them), an override of a layer the model lacks (--set and a file),
 * quantizer values the runtime refuses (uniform bits 5); an interrupt raised during the HIGGS grid
 * generation stops it. */
START_TEST(test_config_refusals_named) {
    kv_fit_options o;
    kv_fit_options_init(&o);
    o.fingerprint = &g_fp;
    kv_fit_data d = make_data();
    kv_plan *plan = NULL;
    kv_fit_config cfg;
    const char *prune[] = {"pruning.method=h2o", "pruning.budget=0.5", NULL};
    make_cfg(&cfg, KV_FIT_AQUA, prune);
    ck_assert_int_eq(kv_fit_run(&plan, NULL, g_model, NULL, &d, &cfg, &o), KV_EUNSUPPORTED);
    ck_assert_msg(strstr(kv_error_last(), "pruning.method") && strstr(kv_error_last(), "h2o") &&
                      strstr(kv_error_last(), "AQUA-KV predictor") &&
                      strstr(kv_error_last(), "command line"), "message: %s", kv_error_last());
    kv_fit_config_free(&cfg);
    /* per stream: one AQUA-KV stream under method kivi is refused too; method aqua with every stream
     * overridden to kivi has no predictor and passes the check */
    const char *prune_one[] = {"pruning.method=h2o", "pruning.budget=0.5", "layers.1.value_method=aqua", NULL};
    make_cfg(&cfg, KV_FIT_KIVI, prune_one);
    ck_assert_int_eq(kv_fit_check(&cfg, kv_model_arch(g_model)), KV_EUNSUPPORTED);
    ck_assert_ptr_nonnull(strstr(kv_error_last(), "AQUA-KV predictor"));
    kv_fit_config_free(&cfg);
    const char *prune_none[] = {"pruning.method=h2o", "pruning.budget=0.5", "layers.0.key_method=kivi",
                                "layers.0.value_method=kivi", "layers.1.key_method=kivi", "layers.1.value_method=kivi",
                                "layers.2.key_method=kivi", "layers.2.value_method=kivi", NULL};
    make_cfg(&cfg, KV_FIT_AQUA, prune_none);
    ck_assert_int_eq(kv_model_arch(g_model)->n_layers, 3);
    ck_assert_kv_ok(kv_fit_check(&cfg, kv_model_arch(g_model)));
    kv_fit_config_free(&cfg);
    const char *layer77[] = {"layers.77.key_bits=4", NULL};
    make_cfg(&cfg, KV_FIT_KIVI, layer77);
    ck_assert_int_eq(kv_fit_run(&plan, NULL, g_model, NULL, &d, &cfg, &o), KV_EINVAL);
    ck_assert_msg(strstr(kv_error_last(), "command line: key 'layers.77'") && strstr(kv_error_last(), "3 layers"),
                  "message: %s", kv_error_last());
    kv_fit_config_free(&cfg);
    make_cfg(&cfg, KV_FIT_KIVI, NULL);
    const char *yaml = "layers:\n  1:\n    key_bits: 3\n  999:\n    value_bits: 4\n";
    ck_assert_kv_ok(kv_fit_config_load_string(&cfg, yaml, strlen(yaml), "over.yaml"));
    ck_assert_int_eq(kv_fit_run(&plan, NULL, g_model, NULL, &d, &cfg, &o), KV_EINVAL);
    ck_assert_msg(strstr(kv_error_last(), "over.yaml:5:") && strstr(kv_error_last(), "layers.999"), "message: %s",
                  kv_error_last());
    kv_fit_config_free(&cfg);
    make_cfg(&cfg, KV_FIT_KIVI, NULL);
    const char *bits5 = "values:\n  bits: 5\n";
    ck_assert_kv_ok(kv_fit_config_load_string(&cfg, bits5, strlen(bits5), "q.yaml"));
    ck_assert_int_eq(kv_fit_run(&plan, NULL, g_model, NULL, &d, &cfg, &o), KV_EINVAL);
    ck_assert_msg(strstr(kv_error_last(), "values.bits (q.yaml:2:9)") && strstr(kv_error_last(), "layer 0 V stream") &&
                      strstr(kv_error_last(), "values.group_axis (the kivi preset)"),
                  "message: %s", kv_error_last());
    kv_fit_config_free(&cfg);
    /* an interrupt during grid generation (no grid cache; the flag is up from the start) */
    make_cfg(&cfg, KV_FIT_HIGGS, NULL);
    volatile sig_atomic_t flag = 1;
    o.interrupt = &flag;
    ck_assert_int_eq(kv_fit_run(&plan, NULL, g_model, NULL, &d, &cfg, &o), KV_EINTERRUPTED);
    ck_assert_msg(strstr(kv_error_last(), "HIGGS grid") && strstr(kv_error_last(), "before layer 0"), "message: %s",
                  kv_error_last());
    ck_assert_ptr_null(plan);
    kv_fit_config_free(&cfg);
}
END_TEST

/* The plain forward baseline runs over the same sequences. */
START_TEST(test_forward_baseline) {
    kv_fit_config cfg;
    make_cfg(&cfg, KV_FIT_KIVI, NULL);
    kv_fit_data d = make_data();
    double sec = -1;
    ck_assert_kv_ok(kv_fit_forward_baseline(&sec, g_model, &d, &cfg, NULL));
    ck_assert(sec >= 0);
    kv_fit_config_free(&cfg);
}
END_TEST

static Suite *fit_suite(void) {
    Suite *s = suite_create("fit");
    TCase *tc = tcase_create("synthetic");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, test_recovers_linear_map);
    tcase_add_test(tc, test_predictor_dtype);
    tcase_add_test(tc, test_predictor_q4);
    tcase_add_test(tc, test_post_rope_is_worse);
    tcase_add_test(tc, test_higgs_error_near_grid_mse);
    tcase_add_test(tc, test_plan_round_trip);
    tcase_add_test(tc, test_kivi_preset);
    tcase_add_test(tc, test_windowed_layers);
    tcase_add_test(tc, test_search_windowed);
    tcase_add_test(tc, test_same_quantizer_as_runtime);
    tcase_add_loop_test(tc, test_xquant_runtime_applies_fit, 0, 2);
    tcase_add_test(tc, test_xquant_eta_choose);
    tcase_add_loop_test(tc, test_xquant_target_bits, 0, 3);
    tcase_add_test(tc, test_xquant_odd_split_refused);
    tcase_add_test(tc, test_bad_inputs);
    tcase_add_test(tc, test_separate_heldout);
    tcase_add_loop_test(tc, test_resume_equals_uninterrupted, 0, 3);
    tcase_add_test(tc, test_resume_mismatch_starts_over);
    tcase_add_test(tc, test_resume_corrupt_state);
    tcase_add_test(tc, test_forward_baseline);
    tcase_add_test(tc, test_rank_deficient_predictor_reported);
    tcase_add_test(tc, test_non_finite_layer);
    tcase_add_test(tc, test_config_refusals_named);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return kv_test_run(fit_suite()); }
