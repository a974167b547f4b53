// CUDA: device detection, packing, and the uniform quantizer (kvrt.h). Element math: kv_quant_math.h.
#include "kv_cuda_util.h"

extern "C" int kv_cuda_available(void) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError(); /* clear the sticky "no driver/device" error */
        return 0;
    }
    return n > 0;
}

static __global__ void kv_pack_kernel(uint32_t *words, const uint8_t *codes, size_t n, size_t nw, int bits, int per) {
    for (size_t w = blockIdx.x * (size_t)blockDim.x + threadIdx.x; w < nw; w += (size_t)gridDim.x * blockDim.x)
        words[w] = kv_qm_pack_word(codes, n, w, bits, per);
}

kv_status kv_cu_pack(uint32_t *words, const uint8_t *codes, size_t n, int bits, int per, cudaStream_t s) {
    kv_status st = KV_OK;
    const size_t nw = (n + (size_t)per - 1) / (size_t)per;
    if (nw == 0) return KV_OK;
    kv_pack_kernel<<<kv_cu_blocks(nw, 256), 256, 0, s>>>(words, codes, n, nw, bits, per);
    KV_CU_LAUNCH(pack);
done:
    return st;
}

kv_status kv_cu_check_flag(int *dflag, cudaStream_t s, const char *what) {
    kv_status st = KV_OK;
    int h = 0;
    KV_CU(cudaMemcpyAsync(&h, dflag, sizeof h, cudaMemcpyDeviceToHost, s));
    KV_CU(cudaStreamSynchronize(s));
    if (h) st = KV_ERR(KV_ENUMERIC, "%s: non-finite input value", what);
done:
    return st;
}

extern "C" kv_status kv_pack_cuda(uint32_t *words, const uint8_t *codes, size_t n, int bits, int pack11,
                                  kv_stream stream) {
    kv_status st = KV_OK;
    const int per = kv_pack_per_word(bits, pack11);
    if (per == 0 || (pack11 && bits != 3)) return KV_ERR(KV_EINVAL, "packing: bad width %d", bits);
    st = kv_cu_pack(words, codes, n, bits, per, (cudaStream_t)stream);
    if (st != KV_OK) return st;
    KV_CU(cudaStreamSynchronize((cudaStream_t)stream));
done:
    return st;
}

/* ---- uniform ------------------------------------------------------------------------------------- */
/* One thread per group: min/max, stored parameters, and the u8 code of every element at its
 * stream position (codes == NULL: parameters only). */
static __global__ void kv_uniform_encode_kernel(uint8_t *codes, void *scales, void *zeros, const float *x, size_t T,
                                         size_t C, size_t G, int axis, int bits, int per, float eta, int pt,
                                         size_t ngroups, int *bad) {
    for (size_t grp = blockIdx.x * (size_t)blockDim.x + threadIdx.x; grp < ngroups;
         grp += (size_t)gridDim.x * blockDim.x) {
        size_t base, stride, count, j0;
        if (axis == KV_AXIS_CHANNELS) {
            const size_t ncg = kv_qm_chan_groups(G, C), t = grp / ncg, c0 = (grp - t * ncg) * G;
            base = t * C + c0;
            stride = 1;
            count = C - c0 < G ? C - c0 : G;
            j0 = base;
        } else {
            const size_t k = grp / C, c = grp - k * C, rows = kv_qm_tok_group_rows(G, T, k);
            base = k * G * C + c;
            stride = C;
            count = rows;
            j0 = k * G * C + c * rows;
        }
        float lo = x[base], hi = x[base];
        int nonfinite = 0;
        for (size_t i = 0; i < count; i++) {
            const float v = x[base + i * stride];
            nonfinite |= !kv_qm_is_finite(v);
            lo = v < lo ? v : lo;
            hi = v > hi ? v : hi;
        }
        if (nonfinite) {
            atomicExch(bad, 1);
            continue;
        }
        const kv_qm_uparams p = kv_qm_uniform_params(lo, hi, bits, eta);
        kv_qm_param_store(scales, grp, p.sc, pt);
        kv_qm_param_store(zeros, grp, p.zc, pt);
        if (!codes) continue;
        for (size_t i = 0; i < count; i++) {
            const size_t j = j0 + i;
            codes[j] = (uint8_t)kv_qm_uniform_code(x[base + i * stride], p.z, p.inv,
                                                   kv_qm_slot_max(bits, per, (int)(j % (size_t)per)));
        }
    }
}

static __global__ void kv_uniform_decode_kernel(float *y, const uint32_t *codes, const void *scales, const void *zeros,
                                         size_t T, size_t C, size_t G, int axis, int bits, int per, int pt) {
    const size_t n = T * C;
    for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < n; e += (size_t)gridDim.x * blockDim.x) {
        const size_t t = e / C, c = e - t * C;
        y[e] = kv_qm_uniform_elem(bits, per, axis, G, T, C, t, c, codes, scales, zeros, pt);
    }
}

static __global__ void kv_uniform_scores_kernel(float *scores, const uint32_t *codes, const void *scales,
                                         const void *zeros, const float *query, size_t T, size_t C, size_t G,
                                         int axis, int bits, int per, int pt) {
    for (size_t t = blockIdx.x * (size_t)blockDim.x + threadIdx.x; t < T; t += (size_t)gridDim.x * blockDim.x)
        scores[t] = kv_qm_uniform_score(bits, per, axis, G, T, C, t, codes, scales, zeros, pt, query);
}

extern "C" kv_status kv_uniform_encode_cuda(uint32_t *codes, void *scales, void *zeros, const kv_uniform *q,
                                            size_t tokens, size_t channels, const float *x, kv_stream stream) {
    kv_status st = kv_uniform_check(q);
    cudaStream_t s = (cudaStream_t)stream;
    uint8_t *cs = NULL;
    int *bad = NULL;
    size_t n = 0, ngroups = 0;
    int per = 0;
    if (st != KV_OK) return st;
    if ((st = kv_block_values(&n, tokens, channels)) != KV_OK || n == 0) return st;
    per = kv_qm_per_word(q->bits, q->pack11);
    ngroups = kv_uniform_groups(q, tokens, channels);
    KV_CU(cudaMallocAsync((void **)&bad, sizeof *bad, s));
    KV_CU(cudaMemsetAsync(bad, 0, sizeof *bad, s));
    if (codes) KV_CU(cudaMallocAsync((void **)&cs, n, s));
    kv_uniform_encode_kernel<<<kv_cu_blocks(ngroups, 128), 128, 0, s>>>(
        cs, scales, zeros, x, tokens, channels, (size_t)q->group, (int)q->axis, q->bits, per, q->eta,
        (int)q->param_type, ngroups, bad);
    KV_CU_LAUNCH(uniform_encode);
    if (codes && (st = kv_cu_pack(codes, cs, n, q->bits, per, s)) != KV_OK) goto done;
    st = kv_cu_check_flag(bad, s, "uniform encode (CUDA)");
done:
    if (cs) cudaFreeAsync(cs, s);
    if (bad) cudaFreeAsync(bad, s);
    return st;
}

extern "C" kv_status kv_uniform_decode_cuda(float *x_hat, const kv_uniform *q, size_t tokens, size_t channels,
                                            const uint32_t *codes, const void *scales, const void *zeros,
                                            kv_stream stream) {
    kv_status st = kv_uniform_check(q);
    cudaStream_t s = (cudaStream_t)stream;
    size_t n = 0;
    if (st != KV_OK) return st;
    if ((st = kv_block_values(&n, tokens, channels)) != KV_OK || n == 0) return st;
    kv_uniform_decode_kernel<<<kv_cu_blocks(n, 256), 256, 0, s>>>(x_hat, codes, scales, zeros, tokens, channels,
                                                                    (size_t)q->group, (int)q->axis, q->bits,
                                                                    kv_qm_per_word(q->bits, q->pack11),
                                                                    (int)q->param_type);
    KV_CU_LAUNCH(uniform_decode);
    KV_CU(cudaStreamSynchronize(s));
done:
    return st;
}

extern "C" kv_status kv_uniform_scores_cuda(float *scores, const kv_uniform *q, size_t tokens, size_t channels,
                                            const uint32_t *codes, const void *scales, const void *zeros,
                                            const float *query, kv_stream stream) {
    kv_status st = kv_uniform_check(q);
    cudaStream_t s = (cudaStream_t)stream;
    size_t n = 0;
    if (st != KV_OK) return st;
    if ((st = kv_block_values(&n, tokens, channels)) != KV_OK || tokens == 0) return st;
    if (n == 0) {
        KV_CU(cudaMemsetAsync(scores, 0, tokens * sizeof *scores, s));
    } else {
        kv_uniform_scores_kernel<<<kv_cu_blocks(tokens, 128), 128, 0, s>>>(
            scores, codes, scales, zeros, query, tokens, channels, (size_t)q->group, (int)q->axis, q->bits,
            kv_qm_per_word(q->bits, q->pack11), (int)q->param_type);
        KV_CU_LAUNCH(uniform_scores);
    }
    KV_CU(cudaStreamSynchronize(s));
done:
    return st;
}
