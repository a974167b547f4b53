/* kv_stream.c — the bridge between a plan's stream records (kv_formats.h §5) and the quantizers:
 * calibration (kvcal fit) and the compressed cache both compress through these functions, so the
 * residuals a predictor was fitted against are exactly the ones the runtime produces. */
#include "kvrt.h"

#include <cblas.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* kv_quant_from_plan: the codec table, kernels/rt/rt_codecs.c. */

kv_status kv_quant_roundtrip(float *x_hat, kv_block_storage *st, const kv_quant *q, size_t tokens,
                             size_t channels, const float *x) {
    kv_block_storage local;
    kv_status s = kv_quant_storage(&local, q, tokens, channels);
    if (s != KV_OK) return s;
    if (st) *st = local;
    const size_t n = tokens * channels;
    if (q->kind == KV_QUANT_F16) { /* full precision, stored as binary16 */
        for (size_t i = 0; i < n; i++) x_hat[i] = kv_f16_to_f32(kv_f32_to_f16(x[i]));
        return KV_OK;
    }
    if (q->shared_codes)
        return KV_ERR(KV_EUNSUPPORTED, "a stream that reuses another layer's codes cannot be compressed alone");
    if (q->kind == KV_QUANT_FP) {
        uint32_t *fc = malloc((local.code_words ? local.code_words : 1) * sizeof(uint32_t));
        uint8_t *bs = malloc(local.groups ? local.groups : 1);
        if (!fc || !bs)
            s = KV_ERR(KV_ENOMEM, "out of memory compressing %zu x %zu values", tokens, channels);
        else if ((s = kv_fpq_encode_ref(fc, bs, &q->fp, tokens, channels, x)) == KV_OK)
            s = kv_fpq_decode_ref(x_hat, &q->fp, tokens, channels, fc, bs);
        free(fc);
        free(bs);
        return s;
    }
    const size_t pbytes = (q->kind == KV_QUANT_UNIFORM ? q->uniform.param_type : q->higgs.norm_type) ==
                                  KV_PARAM_F32 ? 4 : 2;
    uint32_t *codes = malloc((local.code_words ? local.code_words : 1) * sizeof(uint32_t));
    void *scales = malloc((local.groups ? local.groups : 1) * pbytes);
    void *zeros = malloc((local.groups ? local.groups : 1) * pbytes);
    if (!codes || !scales || !zeros) {
        s = KV_ERR(KV_ENOMEM, "out of memory compressing %zu x %zu values", tokens, channels);
        goto done;
    }
    if (q->kind == KV_QUANT_UNIFORM) {
        if ((s = kv_uniform_encode_ref(codes, scales, zeros, &q->uniform, tokens, channels, x)) != KV_OK) goto done;
        s = kv_uniform_decode_ref(x_hat, &q->uniform, tokens, channels, codes, scales, zeros);
    } else {
        if ((s = kv_higgs_encode_ref(codes, scales, &q->higgs, tokens, channels, x)) != KV_OK) goto done;
        s = kv_higgs_decode_ref(x_hat, &q->higgs, tokens, channels, codes, scales);
    }
done:
    free(codes);
    free(scales);
    free(zeros);
    return s;
}

kv_status kv_predictor_apply(float *y, const kv_plan_predictor *pr, const float *const *inputs,
                             size_t tokens, int kv_dim) {
    if (pr->out_dim != kv_dim || pr->in_dim != pr->n_inputs * kv_dim)
        return KV_ERR(KV_EINVAL, "predictor shape %d x %d does not fit %d inputs of %d", pr->out_dim,
                      pr->in_dim, pr->n_inputs, kv_dim);
    /* y[t] = W [x_0[t]; x_1[t]; ...] + b; W is out_dim x in_dim row-major: one GEMM per input block
     * against the column slice W[:, i*kv_dim : (i+1)*kv_dim]. */
    for (size_t t = 0; t < tokens; t++) memcpy(y + t * (size_t)kv_dim, pr->bias, sizeof(float) * (size_t)kv_dim);
    for (int i = 0; i < pr->n_inputs; i++)
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)tokens, kv_dim, kv_dim, 1.0f, inputs[i], kv_dim,
                    pr->weight + (size_t)i * kv_dim, pr->in_dim, 1.0f, y, kv_dim);
    return KV_OK;
}
