/* xquant_probe.c — XQuant's --target-bits (xquant.target_bits): a search over four candidate fits, run
 * by the caller before the fit (kvcal fit; calib/FIT.md "XQuant"): kv_xquant_probe chooses kq, vq, km, vm,
 * kv_xquant_choice_apply writes them into the configuration that kv_fit_run then fits.
 *
 * Without predictors every layer's quantization is independent of the others' (the calibration
 * forward pass is exact), except that the upper layer of a sharing pair reads the lower layer's
 * codes. So four probe fits measure every (layer, stream) under each of its four possible
 * quantizers: A all 2-bit own codes, B all 1-bit own codes (kq = vq = 0), C 2-bit with every pair
 * sharing (km = vm = 0), D 1-bit with every pair sharing. A setting (kq, vq, km, vm) then gives layer
 * l's stream the error and the bits of the probe that matches it at l: 1-bit when l >= kq, sharing
 * when l is odd and l >= km (even thresholds only: an odd threshold splits a pair, and odd km is the
 * same layout as km - 1). The error summed is the held-out relative reconstruction error of each
 * stream (quant_rel_err) over all streams; the bits are the plan's honest bits per value (codes,
 * scales and zero points, shared codes once: kv_plan_stream_bits), averaged over the streams as
 * kvrun reports bits_per_value. The setting with the least error at bits <= B is the choice, which the
 * caller then fits (with the configured eta: data-free, or calibrated per layer and stream). */
#define _POSIX_C_SOURCE 200809L
#include "fit_internal.h"
#include "kv_model.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct xq_probe {
    double err[2];  /* per stream */
    double bits[2];
} xq_probe;

kv_status kv_xquant_probe(kv_xquant_choice *out, kv_model *m, const kv_model_file *mf, const kv_fit_data *data,
                          const kv_fit_config *cfg, const kv_fit_options *opt_in) {
    memset(out, 0, sizeof *out);
    out->kq = out->vq = out->km = out->vm = -1;
    if (!m || !cfg) return KV_ERR(KV_EINVAL, "kv_xquant_probe: no model or configuration");
    if (!kv_fit_method_has(cfg->method, KV_FIT_T_XQUANT) || !(cfg->xquant.target_bits > 0))
        return KV_ERR(KV_EINVAL, "kv_xquant_probe: method %s, xquant.target_bits %g: a probe needs method xquant "
                      "and a target", kv_fit_method_name(cfg->method), cfg->xquant.target_bits);
    const kv_arch *a = kv_model_arch(m);
    kv_status s = kv_fit_check(cfg, a);
    if (s != KV_OK) return s;
    kv_fit_options defopt;
    kv_fit_options_init(&defopt);
    const kv_fit_options *opt = opt_in ? opt_in : &defopt;
    const int L = a->n_layers;
    const double B = cfg->xquant.target_bits;
    xq_probe *pr = calloc((size_t)L * 4, sizeof *pr);
    if (!pr) return KV_ERR(KV_ENOMEM, "out of memory");
    kv_fit_options po = *opt;
    po.out_path = NULL;
    po.checkpoint_dir = NULL;
    po.stop_after_layer = -1;
    static const char *const names[4] = {"2-bit", "1-bit", "2-bit shared", "1-bit shared"};
    for (int p = 0; p < 4 && s == KV_OK; p++) {
        kv_fit_config pc = *cfg; /* shallow: only scalars change, the original frees what it owns */
        pc.xquant.target_bits = 0;
        pc.xquant.kq = pc.xquant.vq = (p & 1) ? 0 : -1;
        pc.xquant.km = pc.xquant.vm = (p & 2) ? 0 : -1;
        kv_plan *plan = NULL;
        kv_fit_report r;
        kv_log(KV_LOG_INFO, "fit: --target-bits %g: probe %d/4 (%s everywhere)", B, p + 1, names[p]);
        s = kv_fit_run(&plan, &r, m, mf, data, &pc, &po);
        if (s != KV_OK) {
            s = kv_error_wrap(s, "--target-bits probe '%s': ", names[p]);
            break;
        }
        for (int l = 0; l < L; l++)
            for (int st = 0; st < 2; st++) {
                pr[(size_t)l * 4 + (size_t)p].err[st] = r.layers[l].quant_rel_err[st];
                pr[(size_t)l * 4 + (size_t)p].bits[st] = kv_plan_stream_bits(plan, l, st);
            }
        kv_fit_report_free(&r);
        kv_plan_free(plan);
    }
    int best[2][2] = {{-1, -1}, {-1, -1}}; /* [stream][q threshold, m threshold] */
    double best_err[2] = {INFINITY, INFINITY}, best_bits[2] = {0, 0}, min_bits = INFINITY;
    if (s == KV_OK) {
        /* the two streams are independent given the total bits: enumerate each stream's settings, then
         * combine the pairs whose mean bits fit the budget */
        const int nt = L / 2 + 1 + (L % 2); /* thresholds 0, 2, ..., and "off" (>= L) */
        double *e[2], *b[2];
        e[0] = malloc((size_t)nt * (size_t)nt * 4 * sizeof(double));
        if (!e[0]) {
            s = KV_ERR(KV_ENOMEM, "out of memory");
        } else {
            e[1] = e[0] + (size_t)nt * (size_t)nt, b[0] = e[1] + (size_t)nt * (size_t)nt, b[1] = b[0] + (size_t)nt * (size_t)nt;
            for (int st = 0; st < 2; st++)
                for (int iq = 0; iq < nt; iq++)
                    for (int im = 0; im < nt; im++) {
                        const int q = 2 * iq, mm = 2 * im;
                        double err = 0, bits = 0;
                        for (int l = 0; l < L; l++) {
                            const int p = (l >= q ? 1 : 0) | (l >= mm && l % 2 == 1 ? 2 : 0);
                            err += pr[(size_t)l * 4 + (size_t)p].err[st];
                            bits += pr[(size_t)l * 4 + (size_t)p].bits[st];
                        }
                        e[st][iq * nt + im] = err, b[st][iq * nt + im] = bits;
                    }
            for (int i = 0; i < nt * nt; i++)
                for (int k = 0; k < nt * nt; k++) {
                    const double bits = (b[0][i] + b[1][k]) / (2.0 * L), err = e[0][i] + e[1][k];
                    if (bits < min_bits) min_bits = bits;
                    if (bits <= B + 1e-12 && err < best_err[0] + best_err[1]) {
                        best_err[0] = e[0][i], best_err[1] = e[1][k];
                        best_bits[0] = b[0][i] / L, best_bits[1] = b[1][k] / L;
                        best[0][0] = 2 * (i / nt), best[0][1] = 2 * (i % nt);
                        best[1][0] = 2 * (k / nt), best[1][1] = 2 * (k % nt);
                    }
                }
            free(e[0]);
        }
    }
    if (s == KV_OK && best[0][0] < 0)
        s = KV_ERR(KV_EINVAL, "xquant.target_bits %g: no setting of kq, vq, km, vm reaches it; the fewest bits per value "
                   "with these quantizers (keys.group_size %d, values.group_size %d, scale_dtype) are %.4f (every "
                   "layer 1-bit, every pair sharing: the scales and zero points remain); raise the target or the "
                   "group sizes", B, cfg->keys.group_size, cfg->values.group_size, min_bits);
    if (s == KV_OK) {
        /* -1 where the threshold changes nothing: no layer at or above it (kq, vq), no odd one (km, vm) */
        out->target_bits = B;
        out->kq = best[0][0] >= L ? -1 : best[0][0];
        out->km = best[0][1] + 1 >= L ? -1 : best[0][1];
        out->vq = best[1][0] >= L ? -1 : best[1][0];
        out->vm = best[1][1] + 1 >= L ? -1 : best[1][1];
        kv_log(KV_LOG_INFO, "fit: --target-bits %g: kq %d vq %d km %d vm %d: %.4f bits per value (keys %.4f, values "
               "%.4f), summed held-out error %.4f (keys %.4f, values %.4f) from the probes", B, out->kq, out->vq,
               out->km, out->vm, (best_bits[0] + best_bits[1]) / 2, best_bits[0], best_bits[1],
               best_err[0] + best_err[1], best_err[0], best_err[1]);
    }
    free(pr);
    return s;
}

void kv_xquant_choice_apply(kv_fit_config *cfg, const kv_xquant_choice *c) {
    cfg->xquant.target_bits = 0;
    cfg->xquant.kq = c->kq;
    cfg->xquant.vq = c->vq;
    cfg->xquant.km = c->km;
    cfg->xquant.vm = c->vm;
}

void kv_xquant_choice_report(kv_fit_report *rep, const kv_xquant_choice *c) {
    rep->xq_target_bits = c->target_bits;
    rep->xq_chosen[0] = c->kq, rep->xq_chosen[1] = c->vq;
    rep->xq_chosen[2] = c->km, rep->xq_chosen[3] = c->vm;
}
