/* kv_model.h — the public header of model/: the reference transformer (Llama family), its
 * tokenizers, the KV-cache interface and capture hooks. */
#ifndef KV_MODEL_H
#define KV_MODEL_H

#include "kv_common.h"
#include "kv_formats.h"

#ifdef __cplusplus
extern "C" {
#endif

#ifdef __cplusplus
}
#endif
#endif /* KV_MODEL_H */
