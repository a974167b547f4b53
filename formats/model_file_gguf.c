/* GGUF models (llama, mistral, qwen2, qwen3, gemma3 as llama.cpp converts them): kv_arch from the metadata
 * keys, tensors as stored (GGUF names and GGML-order shapes are already canonical).
 *
 * Gemma 3 and Qwen3 follow llama.cpp (cited at upstream ggml-org/llama.cpp 82bb48500, the tree
 * unslothai/llama.cpp d32676d7 mirrors; model/MODELS.md has the whole list): the keys and their defaults
 * from src/models/gemma3.cpp:3-34 and src/llama-hparams.h:127-129, the forward from src/models/gemma3.cpp:84-222
 * and src/models/qwen3.cpp:53-140, the NEOX (half) RoPE layout of both from src/llama-model.cpp:2632,2646. */
#include "model_file_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct gguf_ctx {
    const kv_model_file *mf;
    const kv_gguf *g;
    char key[160];
} gguf_ctx;

/* Sets c->key to "<arch>.<suffix>" (or `suffix` itself when arch is NULL); 1 when it is present. */
static int has_key(gguf_ctx *c, const char *arch, const char *suffix) {
    if (arch)
        snprintf(c->key, sizeof c->key, "%s.%s", arch, suffix);
    else
        snprintf(c->key, sizeof c->key, "%s", suffix);
    return kv_gguf_find(c->g, c->key) != NULL;
}

static kv_status missing(const gguf_ctx *c) {
    return KV_ERR(KV_EFORMAT, "'%s': missing GGUF key '%s'", c->mf->path, c->key);
}

static kv_status get_int(gguf_ctx *c, const char *arch, const char *suffix, int required, int dflt, int *out) {
    if (!has_key(c, arch, suffix)) {
        *out = dflt;
        return required ? missing(c) : KV_OK;
    }
    int64_t x;
    kv_status s = kv_gguf_get_i64(c->g, c->key, &x);
    if (s != KV_OK) return kv_error_wrap(s, "'%s': ", c->mf->path);
    if (x < INT32_MIN || x > INT32_MAX)
        return KV_ERR(KV_EFORMAT, "'%s': GGUF key '%s' = %lld is out of range", c->mf->path, c->key, (long long)x);
    *out = (int)x;
    return KV_OK;
}

static kv_status get_float(gguf_ctx *c, const char *arch, const char *suffix, int required, float dflt,
                           float *out) {
    if (!has_key(c, arch, suffix)) {
        *out = dflt;
        return required ? missing(c) : KV_OK;
    }
    double x;
    kv_status s = kv_gguf_get_f64(c->g, c->key, &x);
    if (s != KV_OK) return kv_error_wrap(s, "'%s': ", c->mf->path);
    *out = (float)x;
    return KV_OK;
}

/* A string value copied into dst (truncated to n-1 bytes); *found = 0 when absent. */
static kv_status get_str(gguf_ctx *c, const char *arch, const char *suffix, char *dst, size_t n, int *found) {
    *found = has_key(c, arch, suffix);
    if (!*found) return KV_OK;
    char *v = NULL;
    kv_status s = kv_gguf_get_str(c->g, c->key, &v);
    if (s != KV_OK) return kv_error_wrap(s, "'%s': ", c->mf->path);
    kv_mf_copy_str(dst, n, v, strlen(v));
    free(v);
    return KV_OK;
}

/* Gemma 3's block (src/models/gemma3.cpp): embeddings times sqrt(d_model) (:93), QK-norm before RoPE
 * (:133,141), queries scaled by f_attention_scale (:154) = 1/sqrt(head_dim), or 1/sqrt(d_model/n_heads) for
 * the 62-layer 27B (:31-33), post-attention and post-FFN norms (:164,187), GELU-gated FFN (:184; ggml_gelu is
 * the tanh approximation, ggml/src/ggml-cpu/vec.h:968), final logit softcapping when the key is there
 * (:16-17,212-216). Sliding windows when attention.sliding_window > 0 (:4-14): local layers by
 * sliding_window_pattern (default 6; llama_hparams::set_swa_pattern, src/llama-hparams.cpp:15: layer l is
 * local when l % 6 < 5), with RoPE base rope.freq_base_swa (default 10000, src/llama-hparams.h:127) and no
 * RoPE scaling (freq_scale_swa 1, :129); a query at p sees keys at p - W < pos <= p
 * (llama_hparams::is_masked_swa, src/llama-hparams.h:388-392). Norm weights are stored with Gemma's +1
 * already added (conversion/gemma.py:124-125,166-171). */
static kv_status read_gemma3(gguf_ctx *c, kv_arch *a) {
    const char *path = c->mf->path, *ar = a->arch;
    kv_status s;
    float attn_softcap = 0.0f;
    if ((s = get_int(c, ar, "attention.sliding_window", 0, 0, &a->sliding_window)) ||
        (s = get_float(c, ar, "final_logit_softcapping", 0, 0.0f, &a->final_logit_softcap)) ||
        (s = get_float(c, ar, "attn_logit_softcapping", 0, 0.0f, &attn_softcap)))
        return s;
    if (attn_softcap != 0.0f)
        return KV_ERR(KV_EUNSUPPORTED, "'%s': attention logit softcapping (%g) is not supported (Gemma 2's; Gemma 3 "
                      "has none)", path, (double)attn_softcap);
    if (a->sliding_window < 0)
        return KV_ERR(KV_EFORMAT, "'%s': %s.attention.sliding_window = %d is negative", path, ar, a->sliding_window);
    if (a->sliding_window > 0) {
        if (has_key(c, ar, "attention.sliding_window_pattern")) {
            const kv_gguf_value *v = kv_gguf_find(c->g, c->key);
            if (v->type == KV_GGUF_ARRAY)
                return KV_ERR(KV_EUNSUPPORTED, "'%s': a per-layer %s (array) is not supported, only a period", path,
                              c->key);
        }
        if ((s = get_int(c, ar, "attention.sliding_window_pattern", 0, 6, &a->swa_pattern)) ||
            (s = get_float(c, ar, "rope.freq_base_swa", 0, 10000.0f, &a->rope_theta_local)))
            return s;
        if (a->swa_pattern < 0)
            return KV_ERR(KV_EFORMAT, "'%s': %s.attention.sliding_window_pattern = %d is negative", path, ar,
                          a->swa_pattern);
    }
    a->qk_norm = 1;
    a->post_norms = 1;
    a->ffn_act = KV_FFN_GELU_TANH;
    a->embed_scale = sqrtf((float)a->d_model);
    a->attn_scale = a->n_layers == 62 && a->d_model % a->n_heads == 0
                        ? (float)(1.0 / sqrt((double)(a->d_model / a->n_heads)))
                        : (float)(1.0 / sqrt((double)a->head_dim));
    return KV_OK;
}

static kv_status read_arch(gguf_ctx *c, kv_arch *a) {
    const char *path = c->mf->path;
    char name[64];
    int found;
    kv_status s = get_str(c, NULL, "general.architecture", name, sizeof name, &found);
    if (s) return s;
    if (!found) return KV_ERR(KV_EFORMAT, "'%s': missing GGUF key 'general.architecture'", path);
    const int gemma3 = strcmp(name, "gemma3") == 0, qwen3 = strcmp(name, "qwen3") == 0;
    if (strcmp(name, "llama") != 0 && strcmp(name, "mistral") != 0 && strcmp(name, "qwen2") != 0 && !gemma3 &&
        !qwen3)
        return KV_ERR(KV_EUNSUPPORTED, "'%s': architecture '%s' is not supported (%s)", path, name,
                      kv_arch_supported_list());
    kv_mf_copy_str(a->arch, sizeof a->arch, name, strlen(name));
    const char *ar = a->arch;
    if ((s = get_str(c, NULL, "general.name", a->name, sizeof a->name, &found))) return s;
    if (!found) kv_mf_basename(a->name, sizeof a->name, path);
    int key_len = 0, value_len = 0, rope_dims = 0;
    if ((s = get_int(c, ar, "block_count", 1, 0, &a->n_layers)) ||
        (s = get_int(c, ar, "embedding_length", 1, 0, &a->d_model)) ||
        (s = get_int(c, ar, "attention.head_count", 1, 0, &a->n_heads)) ||
        (s = get_int(c, ar, "attention.head_count_kv", 0, a->n_heads, &a->n_kv_heads)) ||
        (s = get_int(c, ar, "feed_forward_length", 1, 0, &a->d_ff)) ||
        (s = get_int(c, ar, "context_length", 1, 0, &a->max_seq_len)) ||
        (s = get_int(c, ar, "vocab_size", 0, 0, &a->vocab_size)) ||
        (s = get_float(c, ar, "attention.layer_norm_rms_epsilon", 1, 0.0f, &a->rms_eps)) ||
        (s = get_float(c, ar, "rope.freq_base", 0, 10000.0f, &a->rope_theta)) ||
        (s = get_int(c, ar, "attention.key_length", 0, 0, &key_len)) ||
        (s = get_int(c, ar, "attention.value_length", 0, 0, &value_len)) ||
        (s = get_int(c, ar, "rope.dimension_count", 0, 0, &rope_dims)) ||
        (s = get_int(c, NULL, "tokenizer.ggml.bos_token_id", 0, -1, &a->bos_id)) ||
        (s = get_int(c, NULL, "tokenizer.ggml.eos_token_id", 0, -1, &a->eos_id)))
        return s;
    if (a->n_heads < 1) return KV_ERR(KV_EFORMAT, "'%s': %s.attention.head_count must be positive", path, ar);
    if (key_len) {
        a->head_dim = key_len;
    } else if (a->d_model % a->n_heads != 0) {
        return KV_ERR(KV_EFORMAT, "'%s': embedding_length %d is not a multiple of head_count %d", path,
                      a->d_model, a->n_heads);
    } else {
        a->head_dim = a->d_model / a->n_heads;
    }
    if (value_len && value_len != a->head_dim)
        return KV_ERR(KV_EUNSUPPORTED, "'%s': value_length %d differs from key_length %d", path, value_len,
                      a->head_dim);
    if (rope_dims && rope_dims != a->head_dim)
        return KV_ERR(KV_EUNSUPPORTED, "'%s': partial RoPE (rope.dimension_count %d of head_dim %d) is not supported",
                      path, rope_dims, a->head_dim);

    /* RoPE scaling: "<arch>.rope.scaling.type" (or the older rope.scale_linear). llama.cpp stores
     * Llama 3 scaling as a rope_freqs.weight tensor of per-pair divisors instead, which stays a
     * tensor of the model (the forward applies it); the arch then says "none". */
    char type[32] = "none";
    if ((s = get_str(c, ar, "rope.scaling.type", type, sizeof type, &found))) return s;
    float scale_linear = 0.0f;
    if ((s = get_float(c, ar, "rope.scale_linear", 0, 0.0f, &scale_linear))) return s;
    if (!found && scale_linear != 0.0f && scale_linear != 1.0f) {
        snprintf(type, sizeof type, "linear");
        a->rope_factor = scale_linear;
    }
    if (strcmp(type, "linear") == 0) {
        a->rope_scaling = KV_ROPE_SCALING_LINEAR;
        if (found && (s = get_float(c, ar, "rope.scaling.factor", 1, 0.0f, &a->rope_factor))) return s;
    } else if (strcmp(type, "none") != 0) {
        return KV_ERR(KV_EUNSUPPORTED, "'%s': rope scaling type '%s' is not supported (none, linear)", path,
                      type);
    }
    if ((s = get_int(c, ar, "rope.scaling.original_context_length", 0, 0, &a->rope_orig_max_pos))) return s;
    /* llama.cpp permutes Llama/Mistral Q and K rows at conversion (adjacent pairs); qwen2, qwen3 and gemma3
     * keep the HF order and are rotated NEOX style (halves; src/llama-model.cpp:2629-2685). */
    a->rope_layout = strcmp(ar, "llama") == 0 || strcmp(ar, "mistral") == 0 ? KV_ROPE_ADJACENT : KV_ROPE_HALF;
    a->tied_embeddings = kv_gguf_find_tensor(c->g, "output.weight") == NULL;
    a->qkv_bias = kv_gguf_find_tensor(c->g, "blk.0.attn_q.bias") != NULL;
    if (qwen3) a->qk_norm = 1; /* src/models/qwen3.cpp:88,97; attention scale 1/sqrt(head_dim) (:112) */
    if (gemma3) return read_gemma3(c, a);
    return KV_OK;
}

kv_status kv_mf_open_gguf(kv_model_file *mf) {
    kv_status s = kv_gguf_open(&mf->gguf, mf->path);
    if (s != KV_OK) return s;
    gguf_ctx c = {mf, mf->gguf, ""};
    if ((s = read_arch(&c, &mf->arch)) != KV_OK) return s;
    const size_t n = kv_gguf_tensor_count(mf->gguf);
    for (size_t i = 0; i < n && s == KV_OK; i++) {
        const kv_tensor_info *t = kv_gguf_tensor_at(mf->gguf, i);
        s = kv_mf_add_tensor(mf, t->name, NULL, t->dtype, t->n_dims, t->ne, t->offset, t->nbytes, t->data);
    }
    return s;
}
