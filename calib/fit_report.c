/* kvcal fit report as a text table or JSON (kv_calib.h). */
#define _POSIX_C_SOURCE 200809L
#include "fit_internal.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct sbuf {
    char *p;
    size_t n, cap;
    int failed;
} sbuf;

static void sb_printf(sbuf *b, const char *fmt, ...) KV_PRINTF(2, 3);
static void sb_printf(sbuf *b, const char *fmt, ...) {
    if (b->failed) return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        const size_t room = b->cap - b->n;
        const int k = vsnprintf(b->p ? b->p + b->n : NULL, room, fmt, ap);
        va_end(ap);
        if (k < 0) {
            b->failed = 1;
            return;
        }
        if ((size_t)k < room) {
            b->n += (size_t)k;
            return;
        }
        size_t cap = b->cap ? b->cap * 2 : 4096;
        while (cap < b->n + (size_t)k + 1) cap *= 2;
        char *q = realloc(b->p, cap);
        if (!q) {
            b->failed = 1;
            return;
        }
        b->p = q;
        b->cap = cap;
    }
}

/* A number for JSON (NaN -> null). */
static void sb_num(sbuf *b, double v) {
    if (isfinite(v))
        sb_printf(b, "%.6g", v);
    else
        sb_printf(b, "null");
}

/* A table cell: "-" for NaN. */
static void sb_cell(sbuf *b, double v, int width, int prec) {
    if (isfinite(v))
        sb_printf(b, " %*.*f", width, prec, v);
    else
        sb_printf(b, " %*s", width, "-");
}

kv_status kv_fit_report_format(char **out, const kv_fit_report *r, int json) {
    *out = NULL;
    sbuf b = {NULL, 0, 0, 0};
    if (json) {
        sb_printf(&b, "{\n  \"seq_len\": %d, \"sinks\": %d, \"recent\": %d,\n", r->seq_len, r->sinks, r->recent);
        sb_printf(&b, "  \"calib_seqs\": %lld, \"heldout_seqs\": %lld, \"calib_tokens\": %lld, \"heldout_tokens\": %lld,\n",
                  (long long)r->n_calib_seqs, (long long)r->n_heldout_seqs, (long long)r->calib_tokens,
                  (long long)r->heldout_tokens);
        sb_printf(&b, "  \"fit_rows\": %lld, \"heldout_rows\": %lld, \"resumed_from_layer\": %d,\n",
                  (long long)r->fit_rows, (long long)r->heldout_rows, r->resumed_from_layer);
        sb_printf(&b, "  \"mean_bits\": ");
        sb_num(&b, r->mean_bits);
        sb_printf(&b, ", \"predictor_bytes\": %llu, \"hidden_bytes\": %llu, \"state_bytes\": %llu,\n",
                  (unsigned long long)r->predictor_bytes, (unsigned long long)r->hidden_bytes,
                  (unsigned long long)r->state_bytes);
        sb_printf(&b, "  \"weight_bytes_max\": %llu, \"weights_streamed\": %s, \"hidden_dtype\": \"%s\", \"spilled\": %s, "
                      "\"peak_rss_mib\": ",
                  (unsigned long long)r->weight_bytes_max, r->weights_streamed ? "true" : "false",
                  r->hidden_f16 ? "f16" : "f32", r->spilled ? "true" : "false");
        sb_num(&b, r->peak_rss_mib);
        sb_printf(&b, ",\n  \"ranks\": %d, \"shards\": %lld, \"shard_seqs\": %d,\n", r->n_ranks, (long long)r->n_shards,
                  r->shard_seqs);
        sb_printf(&b, "  \"seconds_total\": %.3f, \"seconds_setup\": %.3f, \"seconds_grids\": %.3f,\n", r->seconds_total,
                  r->seconds_setup, r->seconds_grids);
        if (r->xq_target_bits > 0)
            sb_printf(&b, "  \"xquant_target\": {\"target_bits\": %.17g, \"kq\": %d, \"vq\": %d, \"km\": %d, "
                          "\"vm\": %d},\n", r->xq_target_bits, r->xq_chosen[0], r->xq_chosen[1], r->xq_chosen[2],
                      r->xq_chosen[3]);
        sb_printf(&b, "  \"layers\": [");
        for (int l = 0; l < r->n_layers; l++) {
            const kv_fit_layer_report *lr = &r->layers[l];
            sb_printf(&b, "%s\n    {\"layer\": %d, \"resumed\": %s", l ? "," : "", l, lr->resumed ? "true" : "false");
            for (int st = 0; st < 2; st++) {
                sb_printf(&b, ", \"%s\": {\"bits\": ", st ? "v" : "k");
                sb_num(&b, lr->bits[st]);
                sb_printf(&b, ", \"rel_mse\": ");
                sb_num(&b, lr->rel_mse[st]);
                sb_printf(&b, ", \"explained_var\": ");
                sb_num(&b, lr->explained_var[st]);
                sb_printf(&b, ", \"resid_rel_err\": ");
                sb_num(&b, lr->resid_rel_err[st]);
                sb_printf(&b, ", \"quant_rel_err\": ");
                sb_num(&b, lr->quant_rel_err[st]);
                sb_printf(&b, ", \"ridge_rcond\": ");
                sb_num(&b, lr->ridge_rcond[st]);
                sb_printf(&b, ", \"ridge_fallback\": ");
                if (isfinite(lr->ridge_fallback[st])) sb_printf(&b, "%d", lr->ridge_fallback[st] != 0.0);
                else sb_printf(&b, "null");
                sb_printf(&b, ", \"eta\": ");
                sb_num(&b, lr->eta[st]);
                sb_printf(&b, ", \"eta_gain_vs_0\": ");
                sb_num(&b, lr->eta_gain_vs_0[st]);
                sb_printf(&b, ", \"eta_gain_vs_datafree\": ");
                sb_num(&b, lr->eta_gain_vs_datafree[st]);
                if (st == 0 && isfinite(lr->squat[0])) { /* SQuat keys (fit_squat.c; kv_fit_sq_metric_names) */
                    for (int m = 0; m < KV_FIT_SQ_METRICS; m++) {
                        sb_printf(&b, ", \"%s\": ", kv_fit_sq_metric_names[m]);
                        sb_num(&b, lr->squat[m]);
                    }
                }
                sb_printf(&b, "}");
            }
            sb_printf(&b, ", \"seconds_forward\": %.3f, \"seconds_fit\": %.3f, \"seconds_checkpoint\": %.3f, "
                          "\"peak_rss_mib\": ",
                      lr->seconds_forward, lr->seconds_fit, lr->seconds_checkpoint);
            sb_num(&b, lr->peak_rss_mib);
            sb_printf(&b, "}");
        }
        sb_printf(&b, "\n  ]\n}\n");
    } else {
        sb_printf(&b, "held-out metrics per layer (pred = predictor, ev = explained variance, resid = quantizer error "
                      "on its input, total = ||Y - Y_hat||^2/||Y||^2)\n");
        sb_printf(&b, "%5s | %5s %8s %8s %8s %8s | %5s %8s %8s %8s %8s | %8s %8s %8s\n", "layer", "Kbits", "K pred", "K ev",
                  "K resid", "K total", "Vbits", "V pred", "V ev", "V resid", "V total", "fwd s", "fit s", "RSS MiB");
        for (int l = 0; l < r->n_layers; l++) {
            const kv_fit_layer_report *lr = &r->layers[l];
            sb_printf(&b, "%5d |", l);
            for (int st = 0; st < 2; st++) {
                sb_cell(&b, lr->bits[st], 5, 2);
                sb_cell(&b, lr->rel_mse[st], 8, 4);
                sb_cell(&b, lr->explained_var[st], 8, 4);
                sb_cell(&b, lr->resid_rel_err[st], 8, 4);
                sb_cell(&b, lr->quant_rel_err[st], 8, 4);
                sb_printf(&b, " |");
            }
            sb_cell(&b, lr->seconds_forward, 8, 2);
            sb_cell(&b, lr->seconds_fit, 8, 2);
            sb_cell(&b, lr->peak_rss_mib, 8, 1);
            sb_printf(&b, "%s\n", lr->resumed ? "  (checkpoint)" : "");
        }
        sb_printf(&b, "sequences: %lld calibration + %lld held-out of %d tokens (sinks %d, chunks of %d); %lld fit rows, "
                      "%lld held-out rows\n",
                  (long long)r->n_calib_seqs, (long long)r->n_heldout_seqs, r->seq_len, r->sinks, r->recent,
                  (long long)r->fit_rows, (long long)r->heldout_rows);
        /* predictors whose normal equations were rank deficient (kv_ridge_solve's minimum-norm answer) */
        for (int l = 0; l < r->n_layers; l++)
            for (int st = 0; st < 2; st++)
                if (r->layers[l].ridge_fallback[st] == 1.0)
                    sb_printf(&b, "warning: layer %d %s predictor: rank-deficient normal equations (reciprocal "
                                  "condition number %.3g), minimum-norm solution used\n",
                              l, st ? "V" : "K", r->layers[l].ridge_rcond[st]);
        /* XQuant's calibrated eta: held-out attention error reductions (fit_xquant.c) */
        for (int l = 0; l < r->n_layers; l++)
            if (isfinite(r->layers[l].eta_gain_vs_0[0]) || isfinite(r->layers[l].eta_gain_vs_0[1])) {
                const kv_fit_layer_report *lr = &r->layers[l];
                sb_printf(&b, "eta layer %d: K %.4f (gain vs 0 %+.4f, vs data-free %+.4f) | V %.4f (gain vs 0 %+.4f, vs "
                              "data-free %+.4f)\n", l, lr->eta[0], lr->eta_gain_vs_0[0], lr->eta_gain_vs_datafree[0],
                          lr->eta[1], lr->eta_gain_vs_0[1], lr->eta_gain_vs_datafree[1]);
            }
        /* SQuat keys: the choice and the held-out errors (relative; fit_squat.c) */
        for (int l = 0; l < r->n_layers; l++)
            if (isfinite(r->layers[l].squat[0])) {
                const double *q = r->layers[l].squat;
                sb_printf(&b, "squat layer %d: r %d lambda %g (energy %.3f): softmax-output err %.4g, score err %.4g | paper "
                              "r=5 lambda=1e-3 %.4g, %.4g | uniform (KIVI) %.4g, %.4g | best per KV head %.4g\n",
                          l, (int)q[0], q[1], q[9], q[3], q[2], q[5], q[4], q[7], q[6], q[8]);
            }
        if (r->xq_target_bits > 0)
            sb_printf(&b, "xquant --target-bits %g: kq %d vq %d km %d vm %d (-1 = off)\n", r->xq_target_bits,
                      r->xq_chosen[0], r->xq_chosen[1], r->xq_chosen[2], r->xq_chosen[3]);
        sb_printf(&b, "mean nominal bits per value %.3f, predictor weights %.1f KiB\n", r->mean_bits,
                  (double)r->predictor_bytes / 1024.0);
        sb_printf(&b, "memory: hidden states %.1f MiB (%s%s), working set %.1f MiB, weights held at most %.1f MiB (%s), "
                      "peak RSS %.1f MiB\n",
                  (double)r->hidden_bytes / 1048576.0, r->hidden_f16 ? "f16" : "f32", r->spilled ? ", one shard: spilled" : "",
                  (double)r->state_bytes / 1048576.0, (double)r->weight_bytes_max / 1048576.0,
                  r->weights_streamed ? "one layer at a time" : "the whole model", r->peak_rss_mib);
        sb_printf(&b, "ranks: %d; shards: %lld of up to %d sequences\n", r->n_ranks, (long long)r->n_shards, r->shard_seqs);
        sb_printf(&b, "time: %.2f s total (set-up %.2f s, grids %.2f s)%s\n", r->seconds_total, r->seconds_setup,
                  r->seconds_grids, r->resumed_from_layer > 0 ? ", resumed from a checkpoint" : "");
    }
    if (b.failed) {
        free(b.p);
        return KV_ERR(KV_ENOMEM, "out of memory formatting the report");
    }
    *out = b.p;
    return KV_OK;
}
