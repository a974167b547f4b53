// CUDA: HIGGS encode / decode / scores (kvrt.h). One thread block per group of g channels; the FWHT
// runs stage by stage in shared memory with the same butterflies as the CPU (bit-identical), and the
// group norm is the same serial sum on one thread.
#include "kv_cuda_util.h"

#define KV_HIGGS_THREADS 128

static __global__ void kv_higgs_encode_kernel(uint8_t *idx, void *norms, const float *x, size_t C, size_t g,
                                       size_t groups, uint64_t seed, uint64_t ch0, const float *grid, int d, int n,
                                       int nt, int *bad) {
    extern __shared__ float v[];
    __shared__ float s_norm;
    const size_t per_group = g / (size_t)d;
    for (size_t grp = blockIdx.x; grp < groups; grp += gridDim.x) {
        const float *xg = x + grp * g;
        const size_t c0 = (grp * g) % C;
        if (threadIdx.x == 0) s_norm = sqrtf(kv_qm_sumsq(xg, g));
        for (size_t k = threadIdx.x; k < g; k += blockDim.x) v[k] = xg[k] * kv_qm_higgs_sign(seed, ch0 + c0 + k);
        __syncthreads();
        const float norm = s_norm;
        if (!kv_qm_is_finite(norm)) {
            if (threadIdx.x == 0) atomicExch(bad, 1);
            __syncthreads();
            continue;
        }
        for (size_t h = 1; h < g; h *= 2) {
            for (size_t p = threadIdx.x; p < g / 2; p += blockDim.x) kv_qm_fwht_butterfly(v, p, h);
            __syncthreads();
        }
        const float mul = kv_qm_higgs_enc_mul(norm);
        for (size_t k = threadIdx.x; k < g; k += blockDim.x) v[k] *= mul;
        __syncthreads();
        for (size_t p = threadIdx.x; p < per_group; p += blockDim.x)
            idx[grp * per_group + p] = (uint8_t)kv_qm_grid_nearest(v + p * (size_t)d, grid, d, n);
        if (threadIdx.x == 0) kv_qm_param_store(norms, grp, norm, nt);
        __syncthreads();
    }
}

static __global__ void kv_higgs_decode_kernel(float *y, const uint32_t *indices, const void *norms, size_t C, size_t g,
                                       size_t groups, uint64_t seed, uint64_t ch0, const float *grid, int d, int bits,
                                       int per, int nt) {
    extern __shared__ float v[];
    const size_t per_group = g / (size_t)d;
    for (size_t grp = blockIdx.x; grp < groups; grp += gridDim.x) {
        const float mul = kv_qm_higgs_dec_mul(kv_qm_param_load(norms, grp, nt), g);
        for (size_t p = threadIdx.x; p < per_group; p += blockDim.x) {
            const uint32_t i = kv_qm_unpack(indices, grp * per_group + p, bits, per);
            for (int k = 0; k < d; k++) v[p * (size_t)d + (size_t)k] = grid[i * (uint32_t)d + (uint32_t)k] * mul;
        }
        __syncthreads();
        for (size_t h = 1; h < g; h *= 2) {
            for (size_t p = threadIdx.x; p < g / 2; p += blockDim.x) kv_qm_fwht_butterfly(v, p, h);
            __syncthreads();
        }
        const size_t c0 = (grp * g) % C;
        for (size_t k = threadIdx.x; k < g; k += blockDim.x) y[grp * g + k] = v[k] * kv_qm_higgs_sign(seed, ch0 + c0 + k);
        __syncthreads();
    }
}

static __global__ void kv_higgs_rotate_kernel(float *qrot, const float *q, uint64_t seed, uint64_t ch0, size_t C, size_t g) {
    if (blockIdx.x == 0 && threadIdx.x == 0) kv_qm_higgs_rotate_query(qrot, q, seed, ch0, C, g);
}

static __global__ void kv_higgs_scores_kernel(float *scores, const float *qrot, size_t T, size_t C, size_t g,
                                       const uint32_t *indices, const void *norms, int nt, const float *grid, int d,
                                       int bits, int per) {
    for (size_t t = blockIdx.x * (size_t)blockDim.x + threadIdx.x; t < T; t += (size_t)gridDim.x * blockDim.x)
        scores[t] = kv_qm_higgs_score(qrot, C, g, t, indices, norms, nt, grid, d, bits, per);
}

static kv_status higgs_prologue(size_t *n, const kv_higgs *h, size_t tokens, size_t channels) {
    kv_status st = kv_higgs_check(h);
    if (st != KV_OK) return st;
    if (!h->grid) return KV_ERR(KV_EINVAL, "HIGGS: no grid");
    if (channels % (size_t)h->group)
        return KV_ERR(KV_EINVAL, "HIGGS: channels (%zu) must be a multiple of the group (%d)", channels, h->group);
    return kv_block_values(n, tokens, channels);
}

extern "C" kv_status kv_higgs_encode_cuda(uint32_t *indices, void *norms, const kv_higgs *h, size_t tokens,
                                          size_t channels, const float *x, kv_stream stream) {
    cudaStream_t s = (cudaStream_t)stream;
    size_t n = 0, groups = 0, pieces = 0;
    uint8_t *idx = NULL;
    int *bad = NULL;
    int bits = 0;
    kv_status st = higgs_prologue(&n, h, tokens, channels);
    if (st != KV_OK || n == 0) return st;
    groups = n / (size_t)h->group;
    pieces = n / (size_t)h->dim;
    bits = kv_higgs_index_bits(h->size);
    KV_CU(cudaMallocAsync((void **)&bad, sizeof *bad, s));
    KV_CU(cudaMemsetAsync(bad, 0, sizeof *bad, s));
    KV_CU(cudaMallocAsync((void **)&idx, pieces, s));
    kv_higgs_encode_kernel<<<kv_cu_blocks(groups, 1), KV_HIGGS_THREADS, (size_t)h->group * sizeof(float), s>>>(
        idx, norms, x, channels, (size_t)h->group, groups, h->seed, h->channel0, h->grid, h->dim, h->size, (int)h->norm_type, bad);
    KV_CU_LAUNCH(higgs_encode);
    if ((st = kv_cu_pack(indices, idx, pieces, bits, kv_qm_per_word(bits, 0), s)) != KV_OK) goto done;
    st = kv_cu_check_flag(bad, s, "HIGGS encode (CUDA)");
done:
    if (idx) cudaFreeAsync(idx, s);
    if (bad) cudaFreeAsync(bad, s);
    return st;
}

extern "C" kv_status kv_higgs_decode_cuda(float *x_hat, const kv_higgs *h, size_t tokens, size_t channels,
                                          const uint32_t *indices, const void *norms, kv_stream stream) {
    cudaStream_t s = (cudaStream_t)stream;
    size_t n = 0;
    int bits = 0;
    kv_status st = higgs_prologue(&n, h, tokens, channels);
    if (st != KV_OK || n == 0) return st;
    bits = kv_higgs_index_bits(h->size);
    kv_higgs_decode_kernel<<<kv_cu_blocks(n / (size_t)h->group, 1), KV_HIGGS_THREADS,
                             (size_t)h->group * sizeof(float), s>>>(x_hat, indices, norms, channels,
                                                                    (size_t)h->group, n / (size_t)h->group,
                                                                    h->seed, h->channel0, h->grid, h->dim, bits,
                                                                    kv_qm_per_word(bits, 0), (int)h->norm_type);
    KV_CU_LAUNCH(higgs_decode);
    KV_CU(cudaStreamSynchronize(s));
done:
    return st;
}

extern "C" kv_status kv_higgs_scores_cuda(float *scores, const kv_higgs *h, size_t tokens, size_t channels,
                                          const uint32_t *indices, const void *norms, const float *query,
                                          kv_stream stream) {
    cudaStream_t s = (cudaStream_t)stream;
    size_t n = 0;
    int bits = 0;
    float *qrot = NULL;
    kv_status st = higgs_prologue(&n, h, tokens, channels);
    if (st != KV_OK || tokens == 0) return st;
    if (n == 0) {
        KV_CU(cudaMemsetAsync(scores, 0, tokens * sizeof *scores, s));
        KV_CU(cudaStreamSynchronize(s));
        goto done;
    }
    bits = kv_higgs_index_bits(h->size);
    KV_CU(cudaMallocAsync((void **)&qrot, channels * sizeof *qrot, s));
    kv_higgs_rotate_kernel<<<1, 1, 0, s>>>(qrot, query, h->seed, h->channel0, channels, (size_t)h->group);
    KV_CU_LAUNCH(higgs_rotate);
    kv_higgs_scores_kernel<<<kv_cu_blocks(tokens, 128), 128, 0, s>>>(scores, qrot, tokens, channels,
                                                                       (size_t)h->group, indices, norms,
                                                                       (int)h->norm_type, h->grid, h->dim, bits,
                                                                       kv_qm_per_word(bits, 0));
    KV_CU_LAUNCH(higgs_scores);
    KV_CU(cudaStreamSynchronize(s));
done:
    if (qrot) cudaFreeAsync(qrot, s);
    return st;
}
