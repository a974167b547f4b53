/* model_cuda.h — the GPU forward of the reference model (model/cuda/forward_cuda.cu; kv_model.h "device"). Internal
 * to model/. Without CUDA in the build the functions are stubs that refuse (model_cuda_stub.c). */
#ifndef KV_MODEL_CUDA_H
#define KV_MODEL_CUDA_H

#include "forward_internal.h"
#include "kvrt.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Upload m's weights (decoded once from whatever storage it holds: f16, or f32 with KV_WEIGHTS_F32) and set up
 * the stream and cuBLAS: m->gpu. */
kv_status kv_model_cuda_open(kv_model *m);
void kv_model_cuda_free(struct kv_model_cuda *g);
/* kv_model_forward on the GPU (tokens, logits and hidden on the host; the cache a GPU runtime cache). */
kv_status kv_model_cuda_forward(kv_model *m, const kv_forward *f);
/* The stream the model's work (and its runtimes') is ordered on; NULL without a GPU model. */
kv_stream kv_model_cuda_stream(const kv_model *m);
/* Bytes of weights on the device. */
size_t kv_model_cuda_weight_bytes(const kv_model *m);
/* The plan of this engine's f16 cache (kv_cache_rt_create with no plan; the GPU forward's exact attention). */
kv_status kv_model_f16_plan(kv_plan **out, const kv_arch *a);

#ifdef __cplusplus
}
#endif
#endif
