/* fit_float.c — the scale fitter of methods fp8 and nvfp4 (kvcal fit --method fp8|nvfp4): per tensor
 * (layer and stream) or per KV head, a scale chosen among candidates by the error it gives on the
 * calibration tokens (kernels/FLOAT_KV.md for the formats).
 *
 * Candidates, from |x| over the group's calibration values: the maximum (amax: nothing saturates),
 * and the 99.999th, 99.99th and 99.9th percentiles (a few outliers saturate, everything else gets a
 * finer step). The scale maps the candidate onto the format's largest value: FP8 s = c / 448 (E4M3)
 * or c / 57344 (E5M2), as llm-compressor / ModelOpt calibrate k_scale and v_scale from amax; NVFP4
 * s = c / (6 * 448), NVIDIA's second-level scale (the largest block scale lands on E4M3's largest
 * value). Each candidate quantizes every calibration value with the quantizer's own element math and
 * the squared errors are summed per group (shard by shard, in shard order: the same bits for any
 * number of ranks); the group takes the candidate with the least error (ties: the earlier one).
 * Percentiles come from a histogram of log2|x| at 32 bins per octave (upper bin edge, at most 2.2%
 * above the exact percentile, and never above amax). */
#include "fit_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

const char *const kv_fit_float_cand_names[KV_FIT_FLOAT_CANDS] = {"max", "p99.999", "p99.99", "p99.9"};
static const double k_pct[KV_FIT_FLOAT_CANDS] = {1.0, 0.99999, 0.9999, 0.999};

enum { BINS_PER_OCTAVE = 32, MIN_LOG2 = -64 };

size_t kv_fit_float_hist_len(int n_groups) { return (size_t)n_groups * KV_FIT_FLOAT_BINS; }

static int bin_of(float a) {
    if (!(a > 0.0f)) return 0;
    const double b = floor(((double)log2f(a) - MIN_LOG2) * BINS_PER_OCTAVE);
    return b < 0 ? 0 : b >= KV_FIT_FLOAT_BINS ? KV_FIT_FLOAT_BINS - 1 : (int)b;
}

void kv_fit_float_hist_add(double *hist, float *amax, const float *x, size_t rows, int kv_dim, int n_groups) {
    const int gc = kv_dim / n_groups;
    for (size_t t = 0; t < rows; t++)
        for (int c = 0; c < kv_dim; c++) {
            const float a = fabsf(x[t * (size_t)kv_dim + (size_t)c]);
            const int g = c / gc;
            hist[(size_t)g * KV_FIT_FLOAT_BINS + (size_t)bin_of(a)] += 1.0;
            amax[g] = a > amax[g] ? a : amax[g];
        }
}

static double format_denominator(kv_fp_format f) {
    return f == KV_FP_E4M3 ? 448.0 : f == KV_FP_E5M2 ? 57344.0 : 6.0 * 448.0;
}

void kv_fit_float_candidates(float *cand, const double *hist, const float *amax, int n_groups, kv_fp_format fmt) {
    const double den = format_denominator(fmt);
    for (int g = 0; g < n_groups; g++) {
        const double *h = hist + (size_t)g * KV_FIT_FLOAT_BINS;
        double total = 0;
        for (int b = 0; b < KV_FIT_FLOAT_BINS; b++) total += h[b];
        for (int k = 0; k < KV_FIT_FLOAT_CANDS; k++) {
            double v = amax[g];
            if (k_pct[k] < 1.0 && total > 0) {
                const double want = k_pct[k] * total;
                double cum = 0;
                int b = 0;
                for (; b < KV_FIT_FLOAT_BINS - 1; b++)
                    if ((cum += h[b]) >= want) break;
                const double edge = exp2((double)(b + 1) / BINS_PER_OCTAVE + MIN_LOG2);
                v = edge < v ? edge : v;
            }
            const double s = v / den;
            /* all zeros (or a value too small for a float scale): any positive scale decodes them */
            cand[(size_t)g * KV_FIT_FLOAT_CANDS + (size_t)k] = s > 1e-30 && isfinite(s) ? (float)s : 1.0f;
        }
    }
}

void kv_fit_float_sse_add(double *sse, const float *x, size_t rows, int kv_dim, int n_groups, kv_fp_format fmt,
                          const float *cand) {
    const int gc = kv_dim / n_groups;
    for (size_t t = 0; t < rows; t++) {
        const float *row = x + t * (size_t)kv_dim;
        if (fmt != KV_FP_NVFP4) { /* per group and candidate, its channels in order */
            for (int g = 0; g < n_groups; g++)
                for (int k = 0; k < KV_FIT_FLOAT_CANDS; k++)
                    kv_fpq_sse_add(&sse[(size_t)g * KV_FIT_FLOAT_CANDS + (size_t)k], fmt, row + (size_t)g * (size_t)gc, gc,
                                   cand[(size_t)g * KV_FIT_FLOAT_CANDS + (size_t)k]);
            continue;
        }
        /* NVFP4: blocks of 16 channels of the row, as kv_fpq_encode_ref cuts them; the group (and its
         * scale) of a block is that of its first channel (per-head groups hold whole blocks) */
        for (int c0 = 0; c0 < kv_dim; c0 += KV_NVFP4_BLOCK) {
            const int m = kv_dim - c0 < KV_NVFP4_BLOCK ? kv_dim - c0 : KV_NVFP4_BLOCK, g = c0 / gc;
            for (int k = 0; k < KV_FIT_FLOAT_CANDS; k++)
                kv_fpq_sse_add(&sse[(size_t)g * KV_FIT_FLOAT_CANDS + (size_t)k], fmt, row + c0, m,
                               cand[(size_t)g * KV_FIT_FLOAT_CANDS + (size_t)k]);
        }
    }
}

void kv_fit_float_choose(float *scales, int *which, const double *sse, const float *cand, int n_groups) {
    for (int g = 0; g < n_groups; g++) {
        int best = 0;
        for (int k = 1; k < KV_FIT_FLOAT_CANDS; k++)
            if (sse[(size_t)g * KV_FIT_FLOAT_CANDS + (size_t)k] < sse[(size_t)g * KV_FIT_FLOAT_CANDS + (size_t)best]) best = k;
        scales[g] = cand[(size_t)g * KV_FIT_FLOAT_CANDS + (size_t)best];
        if (which) which[g] = best;
    }
}

/* ---- the fitters' stream set-up (fitters.c's rows fp8, nvfp4) -------------------------------------------
 * The element format and its record's shape; scales 1.0 until calibrated (kv_fit_float_scales) before the
 * layer's pass, one per tensor or per KV head (fp.scale_granularity). */
static kv_status float_setup(const kv_fit_stream_setup *c, kv_plan_method method, int bits, int group,
                             kv_plan_group_axis axis) {
    kv_plan_stream *s = &c->plan->layers[c->layer].stream[c->stream];
    s->method = method;
    s->bits = bits;
    s->group_size = group;
    s->group_axis = axis;
    s->scale_dtype = KV_DTYPE_F32;
    s->eta = 0.0f;
    s->higgs_grid = -1;
    float ones[4096];
    const int ns = c->cfg->fp.scale_granularity ? c->plan->fingerprint.n_kv_heads : 1;
    for (int i = 0; i < ns; i++) ones[i] = 1.0f;
    return kv_plan_set_fp_scales(c->plan, c->layer, c->stream, ns, ones);
}

kv_status kv_fit_fp8_setup(const kv_fit_stream_setup *c) {
    return float_setup(c, c->cfg->fp.fp8_format ? KV_PLAN_FP8_E5M2 : KV_PLAN_FP8_E4M3, 8, 0, KV_PLAN_GROUP_TOKENS);
}

kv_status kv_fit_nvfp4_setup(const kv_fit_stream_setup *c) {
    return float_setup(c, KV_PLAN_NVFP4, 4, KV_NVFP4_BLOCK, KV_PLAN_GROUP_CHANNELS);
}

/* ---- the fitter's hook: a stream's scales, before its quantization pass (fit.c's loop) ------------------ */
typedef struct float_job {
    kv_fit_state *r;
    int role, n_groups, pass; /* pass 0: histograms; 1: squared errors */
    kv_fp_format fmt;
    const float *cand;
} float_job;

static kv_status float_part(void *user, int64_t k, double *out) {
    float_job *job = user;
    kv_fit_state *r = job->r;
    const int64_t rows = kv_fit_shard_ncal(r, k) * r->n_comp;
    if (rows <= 0) return KV_OK;
    float *y = NULL, amax[4096] = {0};
    kv_status s = kv_fit_store_get(&r->st, job->role, k / r->size, 1, &y); /* k = rank + j * size */
    if (s != KV_OK) return s;
    if (job->pass == 0)
        kv_fit_float_hist_add(out, amax, y, (size_t)rows, r->kv_dim, job->n_groups);
    else
        kv_fit_float_sse_add(out, y, (size_t)rows, r->kv_dim, job->n_groups, job->fmt, job->cand);
    return KV_OK;
}

kv_status kv_fit_float_scales(kv_fit_state *r, int l, int stream, const kv_plan_predictor *pred,
                              kv_fit_layer_report *lr) {
    (void)pred, (void)lr;
    const kv_plan_stream *ps = &r->plan->layers[l].stream[stream];
    if (!kv_plan_method_is_float(ps->method) || r->cfg->fp.scale == 1) return KV_OK; /* scale: one */
    kv_quant q; /* the element format as the runtime's codec reads it from the plan */
    kv_status qs = kv_quant_from_plan(&q, r->plan, l, stream);
    if (qs != KV_OK) return qs;
    float_job job = {r, stream == KV_PLAN_K ? KV_FIT_K : KV_FIT_V, ps->n_fp_scales, 0, q.fp.format, NULL};
    const int ng = job.n_groups;
    const size_t hl = kv_fit_float_hist_len(ng), cl = (size_t)ng * KV_FIT_FLOAT_CANDS;
    double *acc = calloc(hl, sizeof(double));
    float amax[4096] = {0}, cand[4096 * KV_FIT_FLOAT_CANDS], scales[4096];
    int which[4096];
    kv_status s = kv_dist_agree(r->dist, acc ? KV_OK : KV_ERR(KV_ENOMEM, "out of memory for scale histograms"));
    if (s != KV_OK) goto done;
    /* the largest |x| per group: this rank's calibration shards, then the maximum over ranks */
    for (int64_t j = 0; j < r->n_local && s == KV_OK; j++) {
        const int64_t rows = kv_fit_shard_ncal(r, r->shard_ids[j]) * r->n_comp;
        float *y = NULL;
        if (rows <= 0 || (s = kv_fit_store_get(&r->st, job.role, j, 1, &y)) != KV_OK) continue;
        for (int64_t t = 0; t < rows; t++)
            for (int c = 0; c < r->kv_dim; c++) {
                const float a = fabsf(y[(size_t)t * (size_t)r->kv_dim + (size_t)c]);
                const int g = c / (r->kv_dim / ng);
                amax[g] = a > amax[g] ? a : amax[g];
            }
    }
    if ((s = kv_dist_agree(r->dist, s)) != KV_OK) goto done;
    for (int g = 0; g < ng && s == KV_OK; g++) {
        double v = amax[g];
        s = kv_dist_max(r->dist, &v);
        amax[g] = (float)v;
    }
    if (s != KV_OK) goto done;
    if ((s = kv_dist_fold(r->dist, acc, hl, r->n_shards, float_part, &job)) != KV_OK) goto done;
    if (r->rank == 0) kv_fit_float_candidates(cand, acc, amax, ng, job.fmt);
    if ((s = kv_dist_bcast(r->dist, cand, cl * sizeof(float), 0)) != KV_OK) goto done;
    job.pass = 1, job.cand = cand;
    if ((s = kv_dist_fold(r->dist, acc, cl, r->n_shards, float_part, &job)) != KV_OK) goto done;
    if (r->rank == 0) kv_fit_float_choose(scales, which, acc, cand, ng);
    if ((s = kv_dist_bcast(r->dist, scales, (size_t)ng * sizeof(float), 0)) != KV_OK ||
        (s = kv_dist_bcast(r->dist, which, (size_t)ng * sizeof(int), 0)) != KV_OK)
        goto done;
    kv_log(KV_LOG_INFO, "fit: layer %d %s: %s scale%s %.6g (from the %s)%s", l, stream ? "V" : "K",
           kv_plan_method_name(ps->method), ng > 1 ? "s (head 0)" : "", (double)scales[0],
           kv_fit_float_cand_names[which[0]], ng > 1 ? ", one per KV head" : "");
    s = kv_plan_set_fp_scales(r->plan, l, stream, ng, scales);
done:
    free(acc);
    return s;
}
