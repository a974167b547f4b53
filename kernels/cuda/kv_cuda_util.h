/* kv_cuda_util.h — error checking and launch helpers for kernels/cuda (internal). */
#ifndef KV_CUDA_UTIL_H
#define KV_CUDA_UTIL_H

#include <cuda_runtime.h>

#include "kv_kernels_internal.h"
#include "kv_quant_math.h"

/* Every CUDA call is checked; on failure record KV_ECUDA with the CUDA message and jump to the
 * function's single `done:` cleanup block (variables must be declared before the first use). */
#define KV_CU(call)                                                                               \
    do {                                                                                          \
        cudaError_t e_ = (call);                                                                  \
        if (e_ != cudaSuccess) {                                                                  \
            st = KV_ERR(KV_ECUDA, "%s: %s", #call, cudaGetErrorString(e_));                       \
            goto done;                                                                            \
        }                                                                                         \
    } while (0)
/* After every launch. */
#define KV_CU_LAUNCH(name) KV_CU(cudaGetLastError())

/* Blocks for a grid-stride loop over n items with `threads` per block. */
static inline unsigned kv_cu_blocks(size_t n, unsigned threads) {
    size_t b = (n + threads - 1) / threads;
    if (b > 65535u * 16u) b = 65535u * 16u;
    return b ? (unsigned)b : 1u;
}

/* C linkage: libkvrt exports kv_ names only, not C++-mangled ones. */
extern "C" {
/* Pack u8 codes (device) into words (device) on a stream; defined in common.cu. */
kv_status kv_cu_pack(uint32_t *words, const uint8_t *codes, size_t n, int bits, int per, cudaStream_t s);
/* Read the device flag and map a non-zero value to KV_ENUMERIC with `what`. */
kv_status kv_cu_check_flag(int *dflag, cudaStream_t s, const char *what);
}

#endif
