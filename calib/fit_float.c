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
