/* kvrt.h — the public header of kernels/ (libkvrt): KV quantizers, packers, bits accounting. */
#ifndef KVRT_H
#define KVRT_H

#include "kv_common.h"

#ifdef __cplusplus
extern "C" {
#endif

#ifdef __cplusplus
}
#endif
#endif /* KVRT_H */
