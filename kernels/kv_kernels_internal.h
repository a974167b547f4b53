/* kv_kernels_internal.h — helpers shared by kernels/cpu and kernels/cuda (not public). */
#ifndef KV_KERNELS_INTERNAL_H
#define KV_KERNELS_INTERNAL_H

#include "kvrt.h"

#ifdef __cplusplus
extern "C" {
#endif

#define KV_HIGGS_MAX_GROUP 4096

/* log2(n) for a power of two n: the width of a HIGGS index. */
int kv_higgs_index_bits(int n);
/* tokens * channels, checked against overflow (KV_EINVAL). */
kv_status kv_block_values(size_t *n, size_t tokens, size_t channels);
/* Scale/zero entries of a uniform block (q already checked). */
size_t kv_uniform_groups(const kv_uniform *q, size_t tokens, size_t channels);

#ifdef __cplusplus
}
#endif
#endif
