/* kv_stream.c — the bridge between a plan's stream records (kv_formats.h §5) and the quantizers:
 * calibration (kvcal fit) and the compressed cache both compress through these functions, so the
 * residuals a predictor was fitted against are exactly the ones the runtime produces. */
#include "kvrt.h"

#include <cblas.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* A refusal of a stream's values names the stream (PLAN_FORMAT.md §6.4); the caller adds the plan. */
static kv_status stream_refusal(kv_status s, int layer, int stream) {
    return kv_error_wrap(s, "layer %d %s stream: this runtime cannot apply the plan's values: ", layer,
                         stream == KV_PLAN_K ? "K" : "V");
}

kv_status kv_quant_from_plan(kv_quant *out, const kv_plan *p, int layer, int stream) {
    memset(out, 0, sizeof *out);
    if (layer < 0 || layer >= p->n_layers || (stream != KV_PLAN_K && stream != KV_PLAN_V))
        return KV_ERR(KV_EINVAL, "plan stream (%d, %d) out of range", layer, stream);
    kv_status st = KV_OK;
    const kv_plan_stream *s = &p->layers[layer].stream[stream];
    const kv_param_type pt = s->scale_dtype == KV_DTYPE_F32 ? KV_PARAM_F32 : KV_PARAM_F16;
    switch (s->method) {
    case KV_PLAN_FP:
        out->kind = KV_QUANT_F16;
        return KV_OK;
    case KV_PLAN_UNIFORM:
        out->kind = KV_QUANT_UNIFORM;
        out->uniform.bits = s->bits;
        out->uniform.group = s->group_size;
        out->uniform.axis = s->group_axis == KV_PLAN_GROUP_TOKENS ? KV_AXIS_TOKENS : KV_AXIS_CHANNELS;
        out->uniform.param_type = pt;
        out->uniform.pack11 = s->pack == KV_PLAN_PACK_3BIT_11;
        out->uniform.eta = s->eta;
        out->shared_codes = s->share_codes_with_layer >= 0;
        if ((st = kv_uniform_check(&out->uniform)) != KV_OK) return stream_refusal(st, layer, stream);
        return KV_OK;
    case KV_PLAN_HIGGS: {
        if (s->higgs_grid < 0 || s->higgs_grid >= p->n_grids)
            return KV_ERR(KV_EFORMAT, "layer %d %s stream: HIGGS grid index %d out of range", layer,
                          stream ? "V" : "K", s->higgs_grid);
        const kv_plan_grid *g = &p->grids[s->higgs_grid];
        out->kind = KV_QUANT_HIGGS;
        out->higgs.dim = g->d;
        out->higgs.size = g->n;
        out->higgs.group = s->group_size;
        out->higgs.norm_type = pt;
        out->higgs.seed = p->global.rht_seed;
        out->higgs.grid = g->points;
        if ((st = kv_higgs_check(&out->higgs)) != KV_OK) return stream_refusal(st, layer, stream);
        return KV_OK;
    }
    case KV_PLAN_FP8_E4M3:
    case KV_PLAN_FP8_E5M2:
    case KV_PLAN_NVFP4: {
        const kv_plan_fingerprint *f = &p->fingerprint;
        out->kind = KV_QUANT_FP;
        out->fp.format = s->method == KV_PLAN_FP8_E4M3 ? KV_FP_E4M3 : s->method == KV_PLAN_FP8_E5M2 ? KV_FP_E5M2
                                                                                                : KV_FP_NVFP4;
        out->fp.n_scales = s->n_fp_scales;
        out->fp.scale_channels = f->head_dim;
        out->fp.scales = s->fp_scales; /* borrowed from the plan */
        if ((st = kv_fpq_check(&out->fp, (size_t)f->n_kv_heads * (size_t)f->head_dim)) != KV_OK)
            return stream_refusal(st, layer, stream);
        return KV_OK;
    }
    }
    return KV_ERR(KV_EFORMAT, "layer %d %s stream: unknown method %d", layer, stream ? "V" : "K", (int)s->method);
}

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
