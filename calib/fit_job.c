/* kvcal fit's run as one call (kv_fit_run_job): XQuant's --target-bits probe when the configuration asks for
 * it (the choice written into the configuration before the fit and into the report after), the fit, and a
 * warning naming the predictors whose normal equations were rank deficient. The tool keeps only its options,
 * inputs and report; this is the order the probe and the fit must run in (kv_xquant_probe's comment). */
#include "kv_calib.h"

kv_status kv_fit_run_job(kv_plan **out, kv_fit_report *rep, kv_model *m, const kv_model_file *mf,
                         const kv_fit_data *data, kv_fit_config *cfg, const kv_fit_options *opt) {
    kv_xquant_choice xq_choice; /* --target-bits: kq, vq, km, vm chosen by four probe fits, then fitted */
    const int xq_target = cfg->xquant.target_bits > 0;
    kv_status s = xq_target ? kv_xquant_probe(&xq_choice, m, mf, data, cfg, opt) : KV_OK;
    if (s == KV_OK && xq_target) kv_xquant_choice_apply(cfg, &xq_choice);
    if (s == KV_OK) s = kv_fit_run(out, rep, m, mf, data, cfg, opt);
    if (s == KV_OK && xq_target) kv_xquant_choice_report(rep, &xq_choice);
    if (s != KV_OK) return s;
    /* predictors whose normal equations were rank deficient (also in the report and the plan) */
    int n_fb = 0;
    for (int l = 0; l < rep->n_layers; l++)
        for (int st = 0; st < 2; st++) n_fb += rep->layers[l].ridge_fallback[st] == 1.0;
    if (n_fb > 0)
        kv_log(KV_LOG_WARN, "%d %s rank-deficient normal equations and got the minimum-norm solution "
               "(collinear inputs; the report lists them, the plan records ridge_rcond and ridge_fallback)", n_fb,
               n_fb == 1 ? "predictor had" : "predictors had");
    return KV_OK;
}
