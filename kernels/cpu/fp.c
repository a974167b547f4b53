/* FP8 (E4M3, E5M2) and NVFP4 quantizers: CPU reference (kvrt.h "FP8 / NVFP4"). Element math and the
 * block rules: kv_quant_math.h; definitions cited in kernels/FLOAT_KV.md. */
#include "kv_quant_math.h"
#include "kv_kernels_internal.h"

#include <math.h>
#include <string.h>

kv_status kv_fpq_check(const kv_fpq *q, size_t channels) {
    if (!q) return KV_ERR(KV_EINVAL, "float quantizer: NULL descriptor");
    if (q->format != KV_FP_E4M3 && q->format != KV_FP_E5M2 && q->format != KV_FP_NVFP4)
        return KV_ERR(KV_EINVAL, "float quantizer: unknown format %d", (int)q->format);
    if (q->n_scales < 1 || !q->scales) return KV_ERR(KV_EINVAL, "float quantizer: n_scales must be >= 1 with scales");
    if (q->n_scales > 1) {
        if (q->scale_channels < 1 || (size_t)q->n_scales * (size_t)q->scale_channels != channels)
            return KV_ERR(KV_EINVAL, "float quantizer: %d scales of %d channels do not cover a row of %zu channels",
                          q->n_scales, q->scale_channels, channels);
        if (q->format == KV_FP_NVFP4 && q->scale_channels % KV_NVFP4_BLOCK)
            return KV_ERR(KV_EINVAL, "float quantizer: NVFP4 per-head scales need head_dim (%d) a multiple of %d",
                          q->scale_channels, KV_NVFP4_BLOCK);
    }
    return KV_OK;
}

/* Host-side check of the scales (device pointers are not read: the _cuda callers check on the host). */
static kv_status check_scales(const kv_fpq *q) {
    for (int i = 0; i < q->n_scales; i++)
        if (!(q->scales[i] > 0.0f) || !kv_qm_is_finite(q->scales[i]))
            return KV_ERR(KV_EINVAL, "float quantizer: scale %d is %g (must be finite and > 0)", i, (double)q->scales[i]);
    return KV_OK;
}

kv_status kv_fpq_encode_ref(uint32_t *codes, uint8_t *bscales, const kv_fpq *q, size_t tokens, size_t channels,
                            const float *x) {
    size_t n;
    kv_status s = kv_block_values(&n, tokens, channels);
    if (s != KV_OK || (s = kv_fpq_check(q, channels)) != KV_OK || (s = check_scales(q)) != KV_OK) return s;
    uint32_t bad = 0;
    for (size_t i = 0; i < n; i++) bad |= kv_qm_nonfinite_bit(x[i]);
    if (bad) return KV_ERR(KV_ENUMERIC, "float quantizer: non-finite input value");
    const int bits = kv_qm_fp_bits((int)q->format), per = kv_qm_per_word(bits, 0);
    memset(codes, 0, kv_pack_words(n, bits, 0) * sizeof *codes);
    uint8_t tmp[KV_NVFP4_BLOCK];
    if (q->format != KV_FP_NVFP4) {
        for (size_t t = 0; t < tokens; t++)
            for (size_t c0 = 0; c0 < channels; c0 += KV_NVFP4_BLOCK) {
                const size_t m = channels - c0 < KV_NVFP4_BLOCK ? channels - c0 : KV_NVFP4_BLOCK;
                for (size_t k = 0; k < m; k++) {
                    const size_t c = c0 + k;
                    const float S = kv_qm_fp_scale(q->scales, q->n_scales, q->scale_channels, c);
                    tmp[k] = (uint8_t)kv_qm_fp8_code((int)q->format, x[t * channels + c], S);
                }
                kv_pack_range(codes, t * channels + c0, tmp, m, bits, per);
            }
        return KV_OK;
    }
    const size_t nb = (channels + KV_NVFP4_BLOCK - 1) / KV_NVFP4_BLOCK;
    for (size_t t = 0; t < tokens; t++)
        for (size_t b = 0; b < nb; b++) {
            const size_t c0 = b * KV_NVFP4_BLOCK, m = channels - c0 < KV_NVFP4_BLOCK ? channels - c0 : KV_NVFP4_BLOCK;
            const float *xr = x + t * channels + c0;
            const float S = kv_qm_fp_scale(q->scales, q->n_scales, q->scale_channels, c0);
            float amax = 0.0f;
            for (size_t k = 0; k < m; k++) {
                const float a = xr[k] < 0.0f ? -xr[k] : xr[k];
                amax = a > amax ? a : amax;
            }
            const uint32_t bs = kv_qm_nvfp4_block_scale(amax, S);
            bscales[t * nb + b] = (uint8_t)bs;
            const float d = kv_qm_nvfp4_block_mul(bs, S);
            for (size_t k = 0; k < m; k++) tmp[k] = (uint8_t)kv_qm_nvfp4_code(xr[k], d);
            kv_pack_range(codes, t * channels + c0, tmp, m, bits, per);
        }
    return KV_OK;
}

kv_status kv_fpq_decode_ref(float *x_hat, const kv_fpq *q, size_t tokens, size_t channels, const uint32_t *codes,
                            const uint8_t *bscales) {
    size_t n;
    kv_status s = kv_block_values(&n, tokens, channels);
    if (s != KV_OK || (s = kv_fpq_check(q, channels)) != KV_OK || (s = check_scales(q)) != KV_OK) return s;
    const int fmt = (int)q->format, bits = kv_qm_fp_bits(fmt), per = kv_qm_per_word(bits, 0);
    const size_t nb = (channels + KV_NVFP4_BLOCK - 1) / KV_NVFP4_BLOCK;
    for (size_t t = 0; t < tokens; t++)
        for (size_t c = 0; c < channels; c++) {
            const size_t j = t * channels + c;
            const float S = kv_qm_fp_scale(q->scales, q->n_scales, q->scale_channels, c);
            const uint32_t code = kv_qm_unpack(codes, j, bits, per);
            x_hat[j] = fmt == KV_FP_NVFP4
                           ? kv_qm_fp_decode(fmt, code) * kv_qm_nvfp4_block_mul(bscales[t * nb + c / KV_NVFP4_BLOCK], S)
                           : kv_qm_fp_decode(fmt, code) * S;
        }
    return KV_OK;
}

void kv_fpq_sse_add(double *acc, kv_fp_format format, const float *x, int n, float scale) {
    if (format != KV_FP_NVFP4) {
        for (int i = 0; i < n; i++) {
            const float xh = kv_qm_fp_decode((int)format, kv_qm_fp8_code((int)format, x[i], scale)) * scale;
            const double e = (double)x[i] - (double)xh;
            *acc += e * e;
        }
        return;
    }
    float amax = 0.0f;
    for (int i = 0; i < n; i++) amax = fabsf(x[i]) > amax ? fabsf(x[i]) : amax;
    const float d = kv_qm_nvfp4_block_mul(kv_qm_nvfp4_block_scale(amax, scale), scale);
    double e2 = 0;
    for (int i = 0; i < n; i++) {
        const double e = (double)x[i] - (double)(kv_qm_e2m1_to_f32(kv_qm_nvfp4_code(x[i], d)) * d);
        e2 += e * e;
    }
    *acc += e2;
}
