/* model_file_internal.h — shared between the model-file readers of formats/ (model_file.c,
 * model_file_gguf.c, safetensors.c, hf_config.c, llama2c.c). Not a public header.
 *
 * Each format reader fills a kv_model_file: the architecture (kv_arch), the tensors under their
 * canonical names (kv_mf_add_tensor) and the file mappings that keep the data alive
 * (kv_mf_map_file). kv_model_file_open then checks the result with kv_mf_check, which is the one
 * place that knows which tensors a Llama-family forward needs and their shapes.
 */
#ifndef KV_MODEL_FILE_INTERNAL_H
#define KV_MODEL_FILE_INTERNAL_H

#include "kv_formats.h"

struct kv_model_file {
    kv_model_format format;
    char *path;
    kv_arch arch;
    kv_tensor_info *tensors; /* names are owned (malloc'd) */
    char **src_names;        /* name in the source file when it differs (HF), else NULL; owned */
    float *shift;            /* added to every value kv_model_file_read_f32 returns (HF Gemma 3 norms: 1, the
                                +1 of Gemma3RMSNorm that llama.cpp's converter folds into GGUF), else 0 */
    size_t n_tensors, cap_tensors;
    kv_gguf *gguf;           /* GGUF only */
    kv_file_map *maps;       /* safetensors shards / llama2.c checkpoint */
    size_t n_maps, cap_maps;
};

/* Sanity limits on header fields, so that products of them cannot overflow and absurd values
 * are rejected before anything is allocated. */
#define KV_MF_MAX_DIM (1 << 20)        /* d_model, d_ff, head_dim */
#define KV_MF_MAX_LAYERS 4096
#define KV_MF_MAX_HEADS 4096
#define KV_MF_MAX_VOCAB (1 << 24)
#define KV_MF_MAX_SEQ (1 << 26)

/* Append a tensor (name copied; src_name, when not NULL, copied as the name in the source file).
 * KV_EFORMAT when the name is already present. */
kv_status kv_mf_add_tensor(kv_model_file *mf, const char *name, const char *src_name, int dtype,
                           int n_dims, const uint64_t ne[4], uint64_t offset, size_t nbytes,
                           const void *data);
/* Set the shift of tensor t (see kv_model_file.shift). */
void kv_mf_set_shift(kv_model_file *mf, const kv_tensor_info *t, float shift);
/* Map a file for the lifetime of mf; *out is the mapping (valid until close, not across calls). */
kv_status kv_mf_map_file(kv_model_file *mf, const char *path, kv_file_map *out);
/* The tensor's name for messages: "name" or "name ('src name')" into buf. */
const char *kv_mf_describe(const kv_model_file *mf, const kv_tensor_info *t, char *buf, size_t n);
/* Copy at most n-1 bytes of a possibly unterminated string, NUL-terminated. */
void kv_mf_copy_str(char *dst, size_t n, const char *src, size_t len);
/* The last path component of path into dst (for kv_arch.name). */
void kv_mf_basename(char *dst, size_t n, const char *path);

/* Format readers: called with mf->path set and mf->format chosen. */
kv_status kv_mf_open_gguf(kv_model_file *mf);
kv_status kv_mf_open_hf(kv_model_file *mf);
/* map is the checkpoint (already mapped, owned by mf). Returns KV_EFORMAT with a message starting
 * "unrecognized model format" when the header does not look like llama2.c at all. */
kv_status kv_mf_open_llama2c(kv_model_file *mf, const kv_file_map *map);

/* Parse an HF config.json text into arch (all fields set: from the config or the defaults
 * transformers uses; qkv_bias from model_type / attention_bias). `what` names the file in
 * messages. */
kv_status kv_hf_config_parse(kv_arch *arch, const char *text, size_t len, const char *what);

/* The HF tensor name of a canonical name for architecture a into buf ("" when there is none); for messages. */
const char *kv_hf_source_name(const kv_arch *a, const char *canonical, char *buf, size_t n);

/* Check the architecture and that every tensor a Llama-family forward needs is present with the
 * right shape and a type kv_dequantize supports. Fills vocab_size from token_embd when 0. */
kv_status kv_mf_check(kv_model_file *mf);

#endif
