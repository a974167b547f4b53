/* Model files: format detection, the shared tensor table, the completeness check and
 * dequantization (kv_formats.h section 3). The format readers are model_file_gguf.c,
 * safetensors.c (+ hf_config.c) and llama2c.c. */
#define _POSIX_C_SOURCE 200809L
#include "model_file_internal.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static char *mf_strdup(const char *s) {
    size_t n = strlen(s) + 1;
    char *d = malloc(n);
    if (d) memcpy(d, s, n);
    return d;
}

void kv_mf_copy_str(char *dst, size_t n, const char *src, size_t len) {
    if (n == 0) return;
    if (len > n - 1) len = n - 1;
    if (len) memcpy(dst, src, len);
    dst[len] = '\0';
}

void kv_mf_basename(char *dst, size_t n, const char *path) {
    size_t len = strlen(path);
    while (len > 1 && path[len - 1] == '/') len--; /* "dir/" names "dir" */
    size_t start = len;
    while (start > 0 && path[start - 1] != '/') start--;
    kv_mf_copy_str(dst, n, path + start, len - start);
}

kv_status kv_mf_add_tensor(kv_model_file *mf, const char *name, const char *src_name, int dtype,
                           int n_dims, const uint64_t ne[4], uint64_t offset, size_t nbytes,
                           const void *data) {
    if (kv_model_file_find(mf, name)) {
        return KV_ERR(KV_EFORMAT, "'%s': tensor '%s' appears twice%s%s%s", mf->path, name,
                      src_name ? " (as '" : "", src_name ? src_name : "", src_name ? "')" : "");
    }
    if (mf->n_tensors == mf->cap_tensors) {
        size_t cap = mf->cap_tensors ? mf->cap_tensors * 2 : 64;
        kv_tensor_info *t = realloc(mf->tensors, cap * sizeof *t);
        if (!t) return KV_ERR(KV_ENOMEM, "out of memory");
        mf->tensors = t;
        char **s = realloc(mf->src_names, cap * sizeof *s);
        if (!s) return KV_ERR(KV_ENOMEM, "out of memory");
        mf->src_names = s;
        float *sh = realloc(mf->shift, cap * sizeof *sh);
        if (!sh) return KV_ERR(KV_ENOMEM, "out of memory");
        mf->shift = sh;
        mf->cap_tensors = cap;
    }
    char *nm = mf_strdup(name);
    char *src = (src_name && strcmp(src_name, name) != 0) ? mf_strdup(src_name) : NULL;
    if (!nm || (src_name && strcmp(src_name, name) != 0 && !src)) {
        free(nm);
        free(src);
        return KV_ERR(KV_ENOMEM, "out of memory");
    }
    kv_tensor_info *t = &mf->tensors[mf->n_tensors];
    memset(t, 0, sizeof *t);
    t->name = nm;
    t->dtype = dtype;
    t->n_dims = n_dims;
    for (int i = 0; i < 4; i++) t->ne[i] = ne[i];
    t->offset = offset;
    t->nbytes = nbytes;
    t->data = data;
    mf->src_names[mf->n_tensors] = src;
    mf->shift[mf->n_tensors] = 0.0f;
    mf->n_tensors++;
    return KV_OK;
}

void kv_mf_set_shift(kv_model_file *mf, const kv_tensor_info *t, float shift) {
    const size_t i = (size_t)(t - mf->tensors);
    if (i < mf->n_tensors) mf->shift[i] = shift;
}

/* ---- architecture helpers (kv_formats.h section 3) ------------------------------------------ */
int kv_arch_layer_is_local(const kv_arch *a, int layer) {
    if (!a || a->sliding_window <= 0 || layer < 0 || layer >= a->n_layers) return 0;
    return a->swa_pattern <= 0 || layer % a->swa_pattern < a->swa_pattern - 1;
}

int kv_arch_layer_window(const kv_arch *a, int layer) {
    return kv_arch_layer_is_local(a, layer) ? a->sliding_window : 0;
}

float kv_arch_layer_rope_theta(const kv_arch *a, int layer) {
    return kv_arch_layer_is_local(a, layer) && a->rope_theta_local > 0.0f ? a->rope_theta_local : a->rope_theta;
}

double kv_arch_attn_scale(const kv_arch *a) {
    return a->attn_scale > 0.0f ? (double)a->attn_scale : 1.0 / sqrt((double)a->head_dim);
}

const char *kv_arch_supported_list(void) { return "llama, mistral, qwen2, qwen3, gemma3"; }

kv_status kv_mf_map_file(kv_model_file *mf, const char *path, kv_file_map *out) {
    if (mf->n_maps == mf->cap_maps) {
        size_t cap = mf->cap_maps ? mf->cap_maps * 2 : 4;
        kv_file_map *m = realloc(mf->maps, cap * sizeof *m);
        if (!m) return KV_ERR(KV_ENOMEM, "out of memory");
        mf->maps = m;
        mf->cap_maps = cap;
    }
    kv_status s = kv_file_map_open(&mf->maps[mf->n_maps], path);
    if (s != KV_OK) return s;
    *out = mf->maps[mf->n_maps++];
    return KV_OK;
}

const char *kv_mf_describe(const kv_model_file *mf, const kv_tensor_info *t, char *buf, size_t n) {
    size_t i = (size_t)(t - mf->tensors);
    if (i < mf->n_tensors && mf->src_names[i])
        snprintf(buf, n, "%s ('%s')", t->name, mf->src_names[i]);
    else
        snprintf(buf, n, "%s", t->name);
    return buf;
}

/* ---- the completeness check ----------------------------------------------------------------- */

static kv_status check_range(const kv_model_file *mf, const char *field, long v, long lo, long hi) {
    if (v < lo || v > hi)
        return KV_ERR(KV_EFORMAT, "'%s': %s = %ld is out of range [%ld, %ld]", mf->path, field, v, lo, hi);
    return KV_OK;
}

static kv_status check_arch(const kv_model_file *mf) {
    const kv_arch *a = &mf->arch;
    kv_status s;
    if ((s = check_range(mf, "n_layers", a->n_layers, 1, KV_MF_MAX_LAYERS)) ||
        (s = check_range(mf, "d_model", a->d_model, 1, KV_MF_MAX_DIM)) ||
        (s = check_range(mf, "n_heads", a->n_heads, 1, KV_MF_MAX_HEADS)) ||
        (s = check_range(mf, "n_kv_heads", a->n_kv_heads, 1, KV_MF_MAX_HEADS)) ||
        (s = check_range(mf, "head_dim", a->head_dim, 2, KV_MF_MAX_DIM)) ||
        (s = check_range(mf, "d_ff", a->d_ff, 1, KV_MF_MAX_DIM)) ||
        (s = check_range(mf, "max_seq_len", a->max_seq_len, 1, KV_MF_MAX_SEQ)))
        return s;
    if (a->n_heads % a->n_kv_heads != 0)
        return KV_ERR(KV_EFORMAT, "'%s': n_heads (%d) is not a multiple of n_kv_heads (%d)", mf->path,
                      a->n_heads, a->n_kv_heads);
    if (a->head_dim % 2 != 0)
        return KV_ERR(KV_EFORMAT, "'%s': head_dim (%d) must be even for RoPE", mf->path, a->head_dim);
    if ((long)a->n_heads * a->head_dim > KV_MF_MAX_DIM)
        return KV_ERR(KV_EFORMAT, "'%s': n_heads * head_dim = %ld is too large", mf->path,
                      (long)a->n_heads * a->head_dim);
    if (!(a->rms_eps > 0.0f) || !isfinite(a->rms_eps))
        return KV_ERR(KV_EFORMAT, "'%s': rms_eps = %g must be positive", mf->path, (double)a->rms_eps);
    if (!(a->rope_theta > 0.0f) || !isfinite(a->rope_theta))
        return KV_ERR(KV_EFORMAT, "'%s': rope_theta = %g must be positive", mf->path, (double)a->rope_theta);
    if (a->rope_scaling != KV_ROPE_SCALING_NONE && (!(a->rope_factor > 0.0f) || !isfinite(a->rope_factor)))
        return KV_ERR(KV_EFORMAT, "'%s': rope scaling factor = %g must be positive", mf->path,
                      (double)a->rope_factor);
    if (a->rope_scaling == KV_ROPE_SCALING_LLAMA3 &&
        (!(a->rope_low_freq_factor > 0.0f) || !(a->rope_high_freq_factor > a->rope_low_freq_factor) ||
         !isfinite(a->rope_high_freq_factor) || a->rope_orig_max_pos < 1))
        return KV_ERR(KV_EFORMAT,
                      "'%s': llama3 rope scaling needs 0 < low_freq_factor (%g) < high_freq_factor (%g) "
                      "and original_max_position_embeddings (%d) >= 1",
                      mf->path, (double)a->rope_low_freq_factor, (double)a->rope_high_freq_factor,
                      a->rope_orig_max_pos);
    if ((s = check_range(mf, "sliding_window", a->sliding_window, 0, KV_MF_MAX_SEQ)) ||
        (s = check_range(mf, "sliding_window_pattern", a->swa_pattern, 0, KV_MF_MAX_LAYERS)))
        return s;
    if (a->sliding_window > 0 && a->rope_theta_local != 0.0f &&
        (!(a->rope_theta_local > 0.0f) || !isfinite(a->rope_theta_local)))
        return KV_ERR(KV_EFORMAT, "'%s': the local layers' rope_theta = %g must be positive", mf->path,
                      (double)a->rope_theta_local);
    if (!(a->embed_scale >= 0.0f) || !isfinite(a->embed_scale) || !(a->attn_scale >= 0.0f) ||
        !isfinite(a->attn_scale) || !(a->final_logit_softcap >= 0.0f) || !isfinite(a->final_logit_softcap))
        return KV_ERR(KV_EFORMAT, "'%s': embedding scale %g, attention scale %g and logit softcap %g must be finite "
                      "and >= 0", mf->path, (double)a->embed_scale, (double)a->attn_scale,
                      (double)a->final_logit_softcap);
    if (a->ffn_act != KV_FFN_SILU && a->ffn_act != KV_FFN_GELU_TANH)
        return KV_ERR(KV_EFORMAT, "'%s': unknown FFN activation %d", mf->path, (int)a->ffn_act);
    return KV_OK;
}

static kv_status expect_tensor(const kv_model_file *mf, const char *name, uint64_t ne0, uint64_t ne1) {
    const kv_tensor_info *t = kv_model_file_find(mf, name);
    char desc[256];
    if (!t) {
        char src[160] = "";
        if (mf->format == KV_MODEL_SAFETENSORS) kv_hf_source_name(&mf->arch, name, src, sizeof src);
        return KV_ERR(KV_EFORMAT, "'%s': missing tensor '%s'%s%s%s", mf->path, name,
                      *src ? " ('" : "", src, *src ? "')" : "");
    }
    kv_mf_describe(mf, t, desc, sizeof desc);
    if (t->ne[0] != ne0 || t->ne[1] != ne1 || t->ne[2] != 1 || t->ne[3] != 1) {
        return KV_ERR(KV_EFORMAT,
                      "'%s': tensor %s has shape [%llu, %llu, %llu, %llu], expected [%llu, %llu] "
                      "(GGML order)",
                      mf->path, desc, (unsigned long long)t->ne[0], (unsigned long long)t->ne[1],
                      (unsigned long long)t->ne[2], (unsigned long long)t->ne[3],
                      (unsigned long long)ne0, (unsigned long long)ne1);
    }
    if (!kv_dtype_can_dequantize(t->dtype)) {
        const char *dn = kv_dtype_name(t->dtype);
        return KV_ERR(KV_EUNSUPPORTED, "'%s': tensor %s has type %s (%d), which this build cannot read",
                      mf->path, desc, dn ? dn : "unknown", t->dtype);
    }
    return KV_OK;
}

kv_status kv_mf_check(kv_model_file *mf) {
    kv_arch *a = &mf->arch;
    kv_status s = check_arch(mf);
    if (s != KV_OK) return s;
    /* Every tensor's byte size must match its type and shape, whichever reader produced it. */
    for (size_t i = 0; i < mf->n_tensors; i++) {
        const kv_tensor_info *t = &mf->tensors[i];
        size_t row = 0, total = 0;
        char desc[256];
        if (t->n_dims < 1 || t->n_dims > 4 ||
            kv_dtype_row_bytes(&row, t->dtype, t->ne[0]) != KV_OK || kv_size_mul(&total, row, t->ne[1]) ||
            kv_size_mul(&total, total, t->ne[2]) || kv_size_mul(&total, total, t->ne[3]) ||
            total != t->nbytes)
            return KV_ERR(KV_EFORMAT, "'%s': tensor %s: %zu bytes do not fit its type and shape",
                          mf->path, kv_mf_describe(mf, t, desc, sizeof desc), t->nbytes);
    }
    const kv_tensor_info *emb = kv_model_file_find(mf, "token_embd.weight");
    if (!emb) return expect_tensor(mf, "token_embd.weight", 0, 0); /* reports it missing */
    if (emb->ne[1] >= 1 && emb->ne[1] <= KV_MF_MAX_VOCAB) {
        if (a->vocab_size == 0) a->vocab_size = (int)emb->ne[1];
        if ((uint64_t)a->vocab_size != emb->ne[1])
            return KV_ERR(KV_EFORMAT, "'%s': vocab_size %d does not match token_embd.weight (%llu rows)",
                          mf->path, a->vocab_size, (unsigned long long)emb->ne[1]);
    }
    if ((s = check_range(mf, "vocab_size", a->vocab_size, 1, KV_MF_MAX_VOCAB))) return s;

    const uint64_t d = (uint64_t)a->d_model, V = (uint64_t)a->vocab_size, ff = (uint64_t)a->d_ff;
    const uint64_t q = (uint64_t)a->n_heads * (uint64_t)a->head_dim;
    const uint64_t kv = (uint64_t)a->n_kv_heads * (uint64_t)a->head_dim;
    if ((s = expect_tensor(mf, "token_embd.weight", d, V))) return s;
    if ((s = expect_tensor(mf, "output_norm.weight", d, 1))) return s;
    const int has_output = kv_model_file_find(mf, "output.weight") != NULL;
    if (a->tied_embeddings && has_output)
        return KV_ERR(KV_EFORMAT, "'%s': embeddings are tied but output.weight is present", mf->path);
    if (!a->tied_embeddings && (s = expect_tensor(mf, "output.weight", d, V))) return s;
    for (int l = 0; l < a->n_layers; l++) {
        static const struct {
            const char *suffix;
            int in, out; /* 0 d_model, 1 q width, 2 kv width, 3 d_ff, 4 none (1-D), 5 head_dim */
            int bias;    /* only with: 1 qkv_bias, 2 qk_norm, 3 post_norms */
        } k_layer[] = {
            {"attn_norm.weight", 0, 4, 0}, {"ffn_norm.weight", 0, 4, 0},
            {"attn_q.weight", 0, 1, 0},    {"attn_k.weight", 0, 2, 0},
            {"attn_v.weight", 0, 2, 0},    {"attn_output.weight", 1, 0, 0},
            {"ffn_gate.weight", 0, 3, 0},  {"ffn_up.weight", 0, 3, 0},
            {"ffn_down.weight", 3, 0, 0},  {"attn_q.bias", 1, 4, 1},
            {"attn_k.bias", 2, 4, 1},      {"attn_v.bias", 2, 4, 1},
            {"attn_q_norm.weight", 5, 4, 2}, {"attn_k_norm.weight", 5, 4, 2},
            {"post_attention_norm.weight", 0, 4, 3}, {"post_ffw_norm.weight", 0, 4, 3},
        };
        const uint64_t width[6] = {d, q, kv, ff, 1, (uint64_t)a->head_dim};
        for (size_t k = 0; k < sizeof k_layer / sizeof k_layer[0]; k++) {
            if (k_layer[k].bias == 1 && !a->qkv_bias) continue;
            if (k_layer[k].bias == 2 && !a->qk_norm) continue;
            if (k_layer[k].bias == 3 && !a->post_norms) continue;
            char name[96];
            snprintf(name, sizeof name, "blk.%d.%s", l, k_layer[k].suffix);
            if ((s = expect_tensor(mf, name, width[k_layer[k].in], width[k_layer[k].out]))) return s;
        }
    }
    return KV_OK;
}

/* ---- public API ---------------------------------------------------------------------------- */

kv_status kv_model_file_open(kv_model_file **out, const char *path) {
    if (!out) return KV_ERR(KV_EINVAL, "kv_model_file_open: out is NULL");
    *out = NULL;
    if (!path || !*path) return KV_ERR(KV_EINVAL, "kv_model_file_open: empty path");
    kv_model_file *mf = calloc(1, sizeof *mf);
    if (!mf || !(mf->path = mf_strdup(path))) {
        free(mf);
        return KV_ERR(KV_ENOMEM, "out of memory");
    }
    mf->arch.bos_id = -1;
    mf->arch.eos_id = -1;
    kv_status s;
    struct stat st;
    if (stat(path, &st) != 0) {
        s = KV_ERR(KV_EIO, "cannot open model '%s': %s", path, strerror(errno));
    } else if (S_ISDIR(st.st_mode)) {
        mf->format = KV_MODEL_SAFETENSORS;
        s = kv_mf_open_hf(mf);
    } else if (!S_ISREG(st.st_mode)) {
        s = KV_ERR(KV_EIO, "model '%s' is neither a regular file nor a directory", path);
    } else {
        kv_file_map map;
        s = kv_mf_map_file(mf, path, &map);
        if (s == KV_OK && map.size == 0) {
            s = KV_ERR(KV_EFORMAT, "model file '%s' is empty", path);
        } else if (s == KV_OK && map.size >= 4 && memcmp(map.data, "GGUF", 4) == 0) {
            /* The GGUF reader maps the file itself. */
            kv_file_map_close(&mf->maps[--mf->n_maps]);
            mf->format = KV_MODEL_GGUF;
            s = kv_mf_open_gguf(mf);
        } else if (s == KV_OK) {
            mf->format = KV_MODEL_LLAMA2C;
            s = kv_mf_open_llama2c(mf, &map);
        }
    }
    if (s == KV_OK) s = kv_mf_check(mf);
    if (s != KV_OK) {
        kv_model_file_close(mf);
        return s;
    }
    *out = mf;
    return KV_OK;
}

void kv_model_file_close(kv_model_file *mf) {
    if (!mf) return;
    for (size_t i = 0; i < mf->n_tensors; i++) {
        free((char *)mf->tensors[i].name);
        free(mf->src_names[i]);
    }
    free(mf->tensors);
    free(mf->src_names);
    free(mf->shift);
    for (size_t i = 0; i < mf->n_maps; i++) kv_file_map_close(&mf->maps[i]);
    free(mf->maps);
    kv_gguf_close(mf->gguf);
    free(mf->path);
    free(mf);
}

kv_model_format kv_model_file_format(const kv_model_file *mf) { return mf->format; }
const kv_arch *kv_model_file_arch(const kv_model_file *mf) { return &mf->arch; }
size_t kv_model_file_tensor_count(const kv_model_file *mf) { return mf->n_tensors; }

const kv_tensor_info *kv_model_file_tensor_at(const kv_model_file *mf, size_t i) {
    return i < mf->n_tensors ? &mf->tensors[i] : NULL;
}

const kv_tensor_info *kv_model_file_find(const kv_model_file *mf, const char *name) {
    for (size_t i = 0; i < mf->n_tensors; i++)
        if (strcmp(mf->tensors[i].name, name) == 0) return &mf->tensors[i];
    return NULL;
}

kv_status kv_model_file_read_f32(const kv_model_file *mf, const kv_tensor_info *t, float *dst) {
    if (!mf || !t || !dst) return KV_ERR(KV_EINVAL, "kv_model_file_read_f32: NULL argument");
    if (t < mf->tensors || t >= mf->tensors + mf->n_tensors)
        return KV_ERR(KV_EINVAL, "kv_model_file_read_f32: tensor '%s' does not belong to '%s'", t->name,
                      mf->path);
    size_t n = 1;
    for (int i = 0; i < 4; i++)
        if (kv_size_mul(&n, n, (size_t)t->ne[i]))
            return KV_ERR(KV_EFORMAT, "tensor '%s': element count overflows", t->name);
    kv_status s = kv_dequantize(dst, t->data, t->dtype, n);
    if (s != KV_OK) return kv_error_wrap(s, "reading tensor '%s' of '%s': ", t->name, mf->path);
    const float shift = mf->shift[t - mf->tensors];
    if (shift != 0.0f)
        for (size_t i = 0; i < n; i++) dst[i] += shift;
    return KV_OK;
}

const kv_gguf *kv_model_file_gguf(const kv_model_file *mf) { return mf->gguf; }
const char *kv_model_file_path(const kv_model_file *mf) { return mf->path; }
