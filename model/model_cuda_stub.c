/* model_cuda_stub.c — the GPU forward's entry points in a build without CUDA: they refuse with the reason. */
#include "model_cuda.h"

#if !defined(KV_MODEL_WITH_CUDA)
kv_status kv_model_cuda_open(kv_model *m) {
    (void)m;
    return KV_ERR(KV_EUNSUPPORTED, "model: this build has no CUDA forward (built without nvcc; KV_CUDA=OFF)");
}
void kv_model_cuda_free(struct kv_model_cuda *g) { (void)g; }
kv_status kv_model_cuda_forward(kv_model *m, const kv_forward *f) {
    (void)m, (void)f;
    return KV_ERR(KV_EUNSUPPORTED, "model: this build has no CUDA forward");
}
kv_stream kv_model_cuda_stream(const kv_model *m) {
    (void)m;
    return NULL;
}
size_t kv_model_cuda_weight_bytes(const kv_model *m) {
    (void)m;
    return 0;
}
#endif
