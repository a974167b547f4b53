/* Model fingerprint of a plan (PLAN_FORMAT.md §6.1, hash framing §6.1.1). Kept in its own file:
 * it is the only part of the plan code that needs the model-file reader. */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <string.h>

#include "plan_internal.h"
#include "kv_formats.h"

static void hash_u32(kv_sha256 *h, uint32_t v) {
    uint8_t b[4];
    kv_store_u32le(b, v);
    kv_sha256_update(h, b, 4);
}

static void hash_u64(kv_sha256 *h, uint64_t v) {
    uint8_t b[8];
    kv_store_u64le(b, v);
    kv_sha256_update(h, b, 8);
}

kv_status kv_plan_fingerprint_compute(kv_plan_fingerprint *out, const kv_model_file *mf) {
    memset(out, 0, sizeof *out);
    if (!mf) return KV_ERR(KV_EINVAL, "kv_plan_fingerprint_compute: no model");
    const kv_arch *a = kv_model_file_arch(mf);
    if (!a) return KV_ERR(KV_EINVAL, "kv_plan_fingerprint_compute: the model has no architecture");
    size_t an = strnlen(a->arch, sizeof a->arch);
    if (an >= sizeof out->arch) an = sizeof out->arch - 1;
    memcpy(out->arch, a->arch, an);
    out->n_layers = a->n_layers;
    out->d_model = a->d_model;
    out->n_heads = a->n_heads;
    out->n_kv_heads = a->n_kv_heads;
    out->head_dim = a->head_dim;
    out->vocab_size = a->vocab_size;
    out->rope_theta = a->rope_theta;

    static const char *const names[] = {"attn_k.weight", "attn_k.bias", "attn_v.weight", "attn_v.bias"};
    kv_sha256 h;
    kv_sha256_init(&h);
    for (int l = 0; l < a->n_layers; l++) {
        for (int k = 0; k < 4; k++) {
            char name[64];
            snprintf(name, sizeof name, "blk.%d.%s", l, names[k]);
            const kv_tensor_info *t = kv_model_file_find(mf, name);
            const int is_bias = (k % 2) == 1;
            if (!t) {
                if (is_bias) continue;
                return KV_ERR(KV_EFORMAT, "model '%s' has no tensor '%s' to fingerprint", kv_model_file_path(mf), name);
            }
            if (!t->data && t->nbytes)
                return KV_ERR(KV_EUNSUPPORTED, "model '%s': tensor '%s' has no bytes in memory", kv_model_file_path(mf),
                              name);
            const size_t nlen = strlen(name);
            hash_u32(&h, (uint32_t)nlen);
            kv_sha256_update(&h, name, nlen);
            hash_u32(&h, (uint32_t)t->dtype);
            hash_u32(&h, (uint32_t)t->n_dims);
            for (int d = 0; d < 4; d++) hash_u64(&h, t->ne[d]);
            hash_u64(&h, (uint64_t)t->nbytes);
            kv_sha256_update(&h, t->data, t->nbytes);
        }
    }
    kv_sha256_final(&h, out->kv_sha256);
    return KV_OK;
}
