// CUDA: FP8 (E4M3, E5M2) and NVFP4 quantizers (kvrt.h "FP8 / NVFP4"). Element math: kv_quant_math.h,
// the same calls as the CPU reference (cpu/fp.c), so codes, block scales and decoded values are
// bit-identical (-fmad=false; the block maximum is a max, exact in any order).
#include "kv_cuda_util.h"

#include <stdlib.h>

/* One thread per (token, block of 16 channels): the block's codes (u8, at their stream positions)
 * and, for NVFP4, its E4M3 block scale. */
static __global__ void kv_fpq_encode_kernel(uint8_t *codes, uint8_t *bscales, const float *x, size_t T, size_t C, int fmt,
                                     const float *scales, int n_scales, int scale_channels, int *bad) {
    const size_t nb = (C + KV_NVFP4_BLOCK - 1) / KV_NVFP4_BLOCK, items = T * nb;
    for (size_t it = blockIdx.x * (size_t)blockDim.x + threadIdx.x; it < items; it += (size_t)gridDim.x * blockDim.x) {
        const size_t t = it / nb, b = it - t * nb, c0 = b * KV_NVFP4_BLOCK;
        const size_t m = C - c0 < KV_NVFP4_BLOCK ? C - c0 : KV_NVFP4_BLOCK;
        const float *xr = x + t * C + c0;
        uint32_t nonfinite = 0;
        float amax = 0.0f;
        for (size_t k = 0; k < m; k++) {
            nonfinite |= kv_qm_nonfinite_bit(xr[k]);
            const float a = xr[k] < 0.0f ? -xr[k] : xr[k];
            amax = a > amax ? a : amax;
        }
        if (nonfinite) {
            atomicExch(bad, 1);
            continue;
        }
        if (fmt != KV_FP_NVFP4) {
            for (size_t k = 0; k < m; k++)
                codes[t * C + c0 + k] =
                    (uint8_t)kv_qm_fp8_code(fmt, xr[k], kv_qm_fp_scale(scales, n_scales, scale_channels, c0 + k));
            continue;
        }
        const float S = kv_qm_fp_scale(scales, n_scales, scale_channels, c0);
        const uint32_t bs = kv_qm_nvfp4_block_scale(amax, S);
        bscales[it] = (uint8_t)bs;
        const float d = kv_qm_nvfp4_block_mul(bs, S);
        for (size_t k = 0; k < m; k++) codes[t * C + c0 + k] = (uint8_t)kv_qm_nvfp4_code(xr[k], d);
    }
}

static __global__ void kv_fpq_decode_kernel(float *y, const uint32_t *codes, const uint8_t *bscales, size_t T, size_t C,
                                     int fmt, const float *scales, int n_scales, int scale_channels) {
    const size_t n = T * C, nb = (C + KV_NVFP4_BLOCK - 1) / KV_NVFP4_BLOCK;
    const int bits = kv_qm_fp_bits(fmt), per = kv_qm_per_word(bits, 0);
    for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < n; e += (size_t)gridDim.x * blockDim.x) {
        const size_t t = e / C, c = e - t * C;
        const float S = kv_qm_fp_scale(scales, n_scales, scale_channels, c);
        const uint32_t code = kv_qm_unpack(codes, e, bits, per);
        y[e] = fmt == KV_FP_NVFP4 ? kv_qm_fp_decode(fmt, code) * kv_qm_nvfp4_block_mul(bscales[t * nb + c / KV_NVFP4_BLOCK], S)
                                  : kv_qm_fp_decode(fmt, code) * S;
    }
}

/* The descriptor, and its (device) scales copied to the host and checked as the CPU reference does. */
static kv_status fpq_check_device(const kv_fpq *q, size_t channels, cudaStream_t s) {
    kv_status st = kv_fpq_check(q, channels);
    float *h = NULL;
    if (st != KV_OK) return st;
    h = (float *)malloc((size_t)q->n_scales * sizeof *h);
    if (!h) return KV_ERR(KV_ENOMEM, "float quantizer (CUDA): out of memory");
    KV_CU(cudaMemcpyAsync(h, q->scales, (size_t)q->n_scales * sizeof *h, cudaMemcpyDeviceToHost, s));
    KV_CU(cudaStreamSynchronize(s));
    for (int i = 0; i < q->n_scales; i++)
        if (!(h[i] > 0.0f) || !kv_qm_is_finite(h[i])) {
            st = KV_ERR(KV_EINVAL, "float quantizer (CUDA): scale %d is %g (must be finite and > 0)", i, (double)h[i]);
            goto done;
        }
done:
    free(h);
    return st;
}

extern "C" kv_status kv_fpq_encode_cuda(uint32_t *codes, uint8_t *bscales, const kv_fpq *q, size_t tokens,
                                        size_t channels, const float *x, kv_stream stream) {
    cudaStream_t s = (cudaStream_t)stream;
    kv_status st = KV_OK;
    uint8_t *cs = NULL;
    int *bad = NULL;
    size_t n = 0, nb = 0;
    int bits = 0;
    if ((st = kv_block_values(&n, tokens, channels)) != KV_OK) return st;
    if ((st = fpq_check_device(q, channels, s)) != KV_OK || n == 0) return st;
    bits = kv_qm_fp_bits((int)q->format);
    nb = tokens * ((channels + KV_NVFP4_BLOCK - 1) / KV_NVFP4_BLOCK);
    KV_CU(cudaMallocAsync((void **)&bad, sizeof *bad, s));
    KV_CU(cudaMemsetAsync(bad, 0, sizeof *bad, s));
    KV_CU(cudaMallocAsync((void **)&cs, n, s));
    kv_fpq_encode_kernel<<<kv_cu_blocks(nb, 128), 128, 0, s>>>(cs, bscales, x, tokens, channels, (int)q->format,
                                                                 q->scales, q->n_scales, q->scale_channels, bad);
    KV_CU_LAUNCH(fpq_encode);
    if ((st = kv_cu_pack(codes, cs, n, bits, kv_qm_per_word(bits, 0), s)) != KV_OK) goto done;
    st = kv_cu_check_flag(bad, s, "float quantizer encode (CUDA)");
done:
    if (cs) cudaFreeAsync(cs, s);
    if (bad) cudaFreeAsync(bad, s);
    return st;
}

extern "C" kv_status kv_fpq_decode_cuda(float *x_hat, const kv_fpq *q, size_t tokens, size_t channels,
                                        const uint32_t *codes, const uint8_t *bscales, kv_stream stream) {
    cudaStream_t s = (cudaStream_t)stream;
    kv_status st = KV_OK;
    size_t n = 0;
    if ((st = kv_block_values(&n, tokens, channels)) != KV_OK) return st;
    if ((st = fpq_check_device(q, channels, s)) != KV_OK || n == 0) return st;
    kv_fpq_decode_kernel<<<kv_cu_blocks(n, 256), 256, 0, s>>>(x_hat, codes, bscales, tokens, channels, (int)q->format,
                                                                q->scales, q->n_scales, q->scale_channels);
    KV_CU_LAUNCH(fpq_decode);
    KV_CU(cudaStreamSynchronize(s));
done:
    return st;
}
