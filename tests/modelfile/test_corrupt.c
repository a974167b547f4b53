/* Hand-made corrupt model files, per format: each must fail with its own status and a message
 * naming the problem, never crash (the suite also runs under ASan+UBSan). */
#include "mf_test.h"

#include <sys/stat.h>

/* A small valid llama checkpoint the corrupt variants start from. */
static mf_spec base_spec(void) {
    mf_spec s;
    memset(&s, 0, sizeof s);
    s.model_type = "llama";
    s.n_layers = 2, s.d_model = 16, s.n_heads = 2, s.n_kv_heads = 1, s.head_dim = 8, s.d_ff = 24, s.vocab = 20;
    s.dtype = KV_DTYPE_F32, s.norm_dtype = KV_DTYPE_F32;
    s.seed = 99;
    return s;
}

static void join(char *out, const char *dir, const char *name) { snprintf(out, 512, "%s/%s", dir, name); }

static void write_config(const char *dir, const char *text) {
    char p[512];
    join(p, dir, "config.json");
    mf_write_str(p, text);
}

/* config.json of the base spec with `extra` appended to the object. */
static void write_base_config(const char *dir, const char *extra) {
    mf_spec s = base_spec();
    write_config(dir, mf_config_json(&s, extra));
}

/* A directory with a valid config and a raw model.safetensors; the model is the directory. */
static void raw_st(const char *dir, char *path, const char *header, const void *data, size_t n, uint64_t hlen) {
    char p[512];
    write_base_config(dir, NULL);
    join(p, dir, "model.safetensors");
    mf_write_raw_safetensors(p, header, data, n, hlen);
    snprintf(path, 512, "%s", dir);
}

/* The base model with one tensor removed (hf name) or reshaped, written to dir. */
static void hf_variant(const char *dir, char *path, const mf_spec *s, const char *drop, const char *reshape) {
    mf_model m;
    mf_model_generate(&m, s);
    for (size_t i = 0; i < m.n; i++) {
        if (drop && strcmp(m.t[i].hf, drop) == 0) {
            free(m.t[i].values);
            free(m.t[i].bytes);
            memmove(&m.t[i], &m.t[i + 1], (m.n - i - 1) * sizeof m.t[0]);
            m.n--;
            break;
        }
        if (reshape && strcmp(m.t[i].hf, reshape) == 0) { /* same bytes, rows and columns swapped */
            uint64_t t = m.t[i].shape[0];
            m.t[i].shape[0] = m.t[i].shape[1];
            m.t[i].shape[1] = t;
        }
    }
    mf_write_hf_dir(dir, s, &m);
    mf_model_free(&m);
    snprintf(path, 512, "%s", dir);
}

static void file_bytes(const char *dir, char *path, const void *data, size_t n) {
    join(path, dir, "model.bin");
    mf_write(path, data, n);
}

static void l2c_variant(const char *dir, char *path, int dim, int heads, int layers, long delta_bytes) {
    size_t size;
    uint8_t *img = mf_llama2c_image(&size, 16, 24, 2, 2, 1, 20, 8);
    kv_store_u32le(img, (uint32_t)dim);
    kv_store_u32le(img + 8, (uint32_t)layers);
    kv_store_u32le(img + 12, (uint32_t)heads);
    uint8_t *buf = calloc(size + 64, 1);
    memcpy(buf, img, size);
    file_bytes(dir, path, buf, (size_t)((long)size + delta_bytes));
    free(buf);
    free(img);
}

static void gguf_variant(const char *dir, char *path, const mf_gguf_opts *o, size_t cut, int patch_at,
                         uint64_t patch_value, int patch_bytes) {
    size_t size;
    uint8_t *img = mf_gguf_tiny(&size, o, NULL);
    if (patch_bytes == 4) kv_store_u32le(img + patch_at, (uint32_t)patch_value);
    if (patch_bytes == 8) kv_store_u64le(img + patch_at, patch_value);
    join(path, dir, "model.gguf");
    mf_write(path, img, cut ? cut : size);
    free(img);
}

/* ---- the cases ----------------------------------------------------------------------------------- */
#define F32_16 "\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]"
static const uint8_t k_zeros[128];

static void c_st_short(const char *d, char *p) {
    char f[512];
    write_base_config(d, NULL);
    join(f, d, "model.safetensors");
    mf_write(f, "abc", 3);
    snprintf(p, 512, "%s", d);
}
static void c_st_hlen(const char *d, char *p) { raw_st(d, p, "{}", NULL, 0, 1000); }
static void c_st_hlen_huge(const char *d, char *p) { raw_st(d, p, "{}", NULL, 0, 1ull << 63); }
static void c_st_bad_json(const char *d, char *p) { raw_st(d, p, "{\"a\": ", NULL, 0, 0); }
static void c_st_not_object(const char *d, char *p) { raw_st(d, p, "[1, 2]", NULL, 0, 0); }
static void c_st_duplicate(const char *d, char *p) {
    raw_st(d, p, "{\"model.norm.weight\":{" F32_16 "},\"model.norm.weight\":{" F32_16 "}}", k_zeros, 16, 0);
}
static void c_st_unknown_dtype(const char *d, char *p) {
    raw_st(d, p, "{\"model.norm.weight\":{\"dtype\":\"F17\",\"shape\":[4],\"data_offsets\":[0,16]}}", k_zeros, 16, 0);
}
static void c_st_unsupported_dtype(const char *d, char *p) {
    raw_st(d, p, "{\"model.norm.weight\":{\"dtype\":\"I64\",\"shape\":[2],\"data_offsets\":[0,16]}}", k_zeros, 16, 0);
}
static void c_st_past_end(const char *d, char *p) { raw_st(d, p, "{\"x\":{" F32_16 "}}", k_zeros, 8, 0); }
static void c_st_reversed(const char *d, char *p) {
    raw_st(d, p, "{\"x\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,4]}}", k_zeros, 16, 0);
}
static void c_st_overlap(const char *d, char *p) {
    raw_st(d, p,
           "{\"a\":{" F32_16 "},\"b\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[8,24]}}", k_zeros, 24, 0);
}
static void c_st_size(const char *d, char *p) {
    raw_st(d, p, "{\"x\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,16]}}", k_zeros, 16, 0);
}
static void c_st_overflow(const char *d, char *p) {
    raw_st(d, p,
           "{\"x\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296,4294967296],\"data_offsets\":[0,16]}}",
           k_zeros, 16, 0);
}
static void c_st_negative(const char *d, char *p) {
    raw_st(d, p, "{\"x\":{\"dtype\":\"F32\",\"shape\":[-4],\"data_offsets\":[0,16]}}", k_zeros, 16, 0);
}
static void c_st_entry(const char *d, char *p) { raw_st(d, p, "{\"x\": 5}", NULL, 0, 0); }
static void c_st_no_dtype(const char *d, char *p) {
    raw_st(d, p, "{\"x\":{\"shape\":[4],\"data_offsets\":[0,16]}}", k_zeros, 16, 0);
}
static void c_st_offsets(const char *d, char *p) {
    raw_st(d, p, "{\"x\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0]}}", k_zeros, 16, 0);
}
static void c_st_rank5(const char *d, char *p) {
    raw_st(d, p, "{\"model.norm.weight\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,4],\"data_offsets\":[0,16]}}",
           k_zeros, 16, 0);
}

static void c_missing_tensor(const char *d, char *p) {
    mf_spec s = base_spec();
    hf_variant(d, p, &s, "model.layers.1.mlp.down_proj.weight", NULL);
}
static void c_misshaped(const char *d, char *p) {
    mf_spec s = base_spec();
    hf_variant(d, p, &s, NULL, "model.layers.0.self_attn.k_proj.weight");
}
static void c_missing_lm_head(const char *d, char *p) {
    mf_spec s = base_spec();
    hf_variant(d, p, &s, "lm_head.weight", NULL);
}

/* The base model under another config.json: text verbatim, or the config of spec `s` plus extra. */
static void with_config_text(const char *d, char *p, const char *text) {
    mf_spec s = base_spec();
    hf_variant(d, p, &s, NULL, NULL);
    write_config(d, text);
}
static void with_config(const char *d, char *p, const mf_spec *s, const char *extra) {
    mf_spec base = base_spec();
    hf_variant(d, p, &base, NULL, NULL);
    write_config(d, mf_config_json(s, extra)); /* after hf_variant: the text is a static buffer */
}
#define SPEC_WITH(field, value) \
    mf_spec s = base_spec();     \
    s.field = value

static void c_qwen2_no_bias(const char *d, char *p) { SPEC_WITH(model_type, "qwen2"); with_config(d, p, &s, NULL); }
static void c_vocab_mismatch(const char *d, char *p) { SPEC_WITH(vocab, 21); with_config(d, p, &s, NULL); }
static void c_cfg_model_type(const char *d, char *p) { SPEC_WITH(model_type, "gpt2"); with_config(d, p, &s, NULL); }
static void c_cfg_kv_heads(const char *d, char *p) { SPEC_WITH(n_kv_heads, 3); with_config(d, p, &s, NULL); }
static void c_cfg_layers(const char *d, char *p) { SPEC_WITH(n_layers, 100000); with_config(d, p, &s, NULL); }
static void c_cfg_duplicate(const char *d, char *p) {
    mf_spec s = base_spec();
    with_config(d, p, &s, ", \"hidden_size\": 16");
}
static void c_cfg_yarn(const char *d, char *p) {
    mf_spec s = base_spec();
    with_config(d, p, &s, ", \"rope_scaling\": {\"type\": \"yarn\", \"factor\": 4.0}");
}
static void c_cfg_llama3_partial(const char *d, char *p) {
    mf_spec s = base_spec();
    with_config(d, p, &s, ", \"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": 8.0}");
}
static void c_cfg_bad_json(const char *d, char *p) { with_config_text(d, p, "{not json"); }
static void c_cfg_no_hidden(const char *d, char *p) {
    with_config_text(d, p, "{\"model_type\": \"llama\", \"num_hidden_layers\": 2}");
}
static void c_cfg_string(const char *d, char *p) {
    with_config_text(d, p, "{\"model_type\": \"llama\", \"hidden_size\": \"16\"}");
}
static void c_cfg_act(const char *d, char *p) {
    with_config_text(d, p, "{\"model_type\": \"llama\", \"hidden_act\": \"gelu\"}");
}
static void c_cfg_not_object(const char *d, char *p) { with_config_text(d, p, "[\"llama\"]"); }
static void c_cfg_mixtral(const char *d, char *p) { SPEC_WITH(model_type, "mixtral"); with_config(d, p, &s, NULL); }
static void c_cfg_gemma2(const char *d, char *p) { SPEC_WITH(model_type, "gemma2"); with_config(d, p, &s, NULL); }
static void c_cfg_qwen3_moe(const char *d, char *p) { SPEC_WITH(model_type, "qwen3_moe"); with_config(d, p, &s, NULL); }
static void c_cfg_gemma3_mm(const char *d, char *p) { SPEC_WITH(model_type, "gemma3"); with_config(d, p, &s, NULL); }

static void c_dir_no_config(const char *d, char *p) {
    mf_spec s = base_spec();
    hf_variant(d, p, &s, NULL, NULL);
    char f[512];
    join(f, d, "config.json");
    remove(f);
}
static void c_dir_no_weights(const char *d, char *p) {
    write_base_config(d, NULL);
    snprintf(p, 512, "%s", d);
}
static void c_index(const char *d, char *p, const char *index) {
    mf_spec s = base_spec();
    s.n_shards = 2;
    hf_variant(d, p, &s, NULL, NULL);
    char f[512];
    join(f, d, "model.safetensors.index.json");
    mf_write_str(f, index);
}
static void c_index_missing_shard(const char *d, char *p) {
    c_index(d, p, "{\"weight_map\": {\"model.norm.weight\": \"model-00009-of-00009.safetensors\"}}");
}
static void c_index_escape(const char *d, char *p) {
    c_index(d, p, "{\"weight_map\": {\"model.norm.weight\": \"../model-00001-of-00002.safetensors\"}}");
}
static void c_index_lacks(const char *d, char *p) {
    c_index(d, p, "{\"weight_map\": {\"model.embed_tokens.weight\": \"model-00001-of-00002.safetensors\", "
                  "\"model.extra.weight\": \"model-00002-of-00002.safetensors\"}}");
}
static void c_index_bad_json(const char *d, char *p) { c_index(d, p, "{\"weight_map\": "); }
static void c_index_no_map(const char *d, char *p) { c_index(d, p, "{\"metadata\": {}}"); }
static void c_dup_across_shards(const char *d, char *p) {
    c_index(d, p, "{\"weight_map\": {\"model.norm.weight\": \"model-00001-of-00002.safetensors\", "
                  "\"model.layers.0.input_layernorm.weight\": \"model-00002-of-00002.safetensors\"}}");
    char a[512], b[512];
    join(a, d, "model-00001-of-00002.safetensors");
    join(b, d, "model-00002-of-00002.safetensors");
    mf_write_raw_safetensors(a, "{\"model.norm.weight\":{\"dtype\":\"F32\",\"shape\":[16],\"data_offsets\":[0,64]}}",
                             k_zeros, 64, 0);
    mf_write_raw_safetensors(b,
                             "{\"model.norm.weight\":{\"dtype\":\"F32\",\"shape\":[16],\"data_offsets\":[0,64]},"
                             "\"model.layers.0.input_layernorm.weight\":{\"dtype\":\"F32\",\"shape\":[16],"
                             "\"data_offsets\":[64,128]}}",
                             k_zeros, 128, 0);
}

static void c_l2c_truncated(const char *d, char *p) { l2c_variant(d, p, 16, 2, 2, -4); }
static void c_l2c_trailing(const char *d, char *p) { l2c_variant(d, p, 16, 2, 2, 4); }
static void c_l2c_absurd(const char *d, char *p) { l2c_variant(d, p, -5, 2, 2, 0); }
static void c_l2c_huge(const char *d, char *p) { l2c_variant(d, p, 16, 2, 0x7fffffff, 0); }
static void c_l2c_heads(const char *d, char *p) { l2c_variant(d, p, 30, 4, 2, 0); }
static void c_l2c_text(const char *d, char *p) { file_bytes(d, p, "hello", 5); }
static void c_l2c_empty(const char *d, char *p) { file_bytes(d, p, "", 0); }
static void c_l2c_ak42(const char *d, char *p) {
    uint8_t buf[256] = {0};
    kv_store_u32le(buf, 0x616b3432u);
    kv_store_u32le(buf + 4, 1);
    file_bytes(d, p, buf, sizeof buf);
}
static void c_no_such_path(const char *d, char *p) { join(p, d, "does-not-exist"); }

static void c_gguf_truncated(const char *d, char *p) {
    mf_gguf_opts o = {0};
    size_t size;
    free(mf_gguf_tiny(&size, &o, NULL));
    gguf_variant(d, p, &o, size - 100, 0, 0, 0);
}
static void c_gguf_short(const char *d, char *p) { file_bytes(d, p, "GGUF\3\0\0\0", 8); }
static void c_gguf_version(const char *d, char *p) {
    mf_gguf_opts o = {0};
    gguf_variant(d, p, &o, 0, 4, 99, 4);
}
static void c_gguf_count(const char *d, char *p) {
    mf_gguf_opts o = {0};
    gguf_variant(d, p, &o, 0, 8, 1ull << 62, 8);
}
static void c_gguf_bad_magic(const char *d, char *p) {
    mf_gguf_opts o = {0};
    gguf_variant(d, p, &o, 0, 0, 0x58554747u /* "GGUX" */, 4);
}
static void c_gguf_arch(const char *d, char *p) {
    mf_gguf_opts o = {0};
    o.arch = "gpt2";
    gguf_variant(d, p, &o, 0, 0, 0, 0);
}
/* Architectures still unsupported (issue 36 part 5): refused with the list of supported ones. */
static void c_gguf_gemma2(const char *d, char *p) {
    mf_gguf_opts o = {0};
    o.arch = "gemma2";
    gguf_variant(d, p, &o, 0, 0, 0, 0);
}
static void c_gguf_qwen3moe(const char *d, char *p) {
    mf_gguf_opts o = {0};
    o.arch = "qwen3moe";
    gguf_variant(d, p, &o, 0, 0, 0, 0);
}
/* A Gemma 3 GGUF without its QK-norm weights (the llama tensors only). */
static void c_gguf_gemma3_no_qk_norm(const char *d, char *p) {
    mf_gguf_opts o = {0};
    o.arch = "gemma3";
    gguf_variant(d, p, &o, 0, 0, 0, 0);
}
static void c_gguf_no_arch(const char *d, char *p) {
    mf_gguf_opts o = {0};
    o.omit_key = "general.architecture";
    gguf_variant(d, p, &o, 0, 0, 0, 0);
}
static void c_gguf_missing_key(const char *d, char *p) {
    mf_gguf_opts o = {0};
    o.omit_key = "llama.block_count";
    gguf_variant(d, p, &o, 0, 0, 0, 0);
}
static void c_gguf_key_type(const char *d, char *p) {
    mf_gguf_opts o = {0};
    o.block_count_as_string = 1;
    gguf_variant(d, p, &o, 0, 0, 0, 0);
}
static void c_gguf_missing_tensor(const char *d, char *p) {
    mf_gguf_opts o = {0};
    o.omit_tensor = "blk.1.ffn_up.weight";
    gguf_variant(d, p, &o, 0, 0, 0, 0);
}
static void c_gguf_type(const char *d, char *p) {
    mf_gguf_opts o = {0};
    o.q8_1_tensor = 1;
    gguf_variant(d, p, &o, 0, 0, 0, 0);
}

typedef struct corrupt_case {
    const char *name;
    void (*build)(const char *dir, char *path);
    kv_status status;
    const char *message; /* substring of kv_error_last() */
} corrupt_case;

static const corrupt_case k_cases[] = {
    /* safetensors container */
    {"st_short", c_st_short, KV_EFORMAT, "too short for a safetensors file"},
    {"st_header_length", c_st_hlen, KV_EFORMAT, "header length 1000 does not fit"},
    {"st_header_length_huge", c_st_hlen_huge, KV_EFORMAT, "header length 9223372036854775808 does not fit"},
    {"st_bad_json", c_st_bad_json, KV_EFORMAT, "invalid JSON header"},
    {"st_not_object", c_st_not_object, KV_EFORMAT, "header is not a JSON object"},
    {"st_duplicate_key", c_st_duplicate, KV_EFORMAT, "duplicate object key"},
    {"st_unknown_dtype", c_st_unknown_dtype, KV_EFORMAT, "unknown dtype 'F17'"},
    {"st_unsupported_dtype", c_st_unsupported_dtype, KV_EUNSUPPORTED, "has dtype I64; only F32, F16 and BF16"},
    {"st_offsets_past_end", c_st_past_end, KV_EFORMAT, "point past the end of the data"},
    {"st_offsets_reversed", c_st_reversed, KV_EFORMAT, "end before they begin"},
    {"st_overlap", c_st_overlap, KV_EFORMAT, "tensors 'a' and 'b' overlap"},
    {"st_size_mismatch", c_st_size, KV_EFORMAT, "(size mismatch)"},
    {"st_count_overflow", c_st_overflow, KV_EFORMAT, "element count overflows"},
    {"st_negative_shape", c_st_negative, KV_EFORMAT, "shape[0] is not a non-negative integer"},
    {"st_entry_not_object", c_st_entry, KV_EFORMAT, "header entry 'x' is not an object"},
    {"st_no_dtype", c_st_no_dtype, KV_EFORMAT, "has no dtype string"},
    {"st_bad_offsets", c_st_offsets, KV_EFORMAT, "data_offsets must be [begin, end]"},
    {"st_rank5", c_st_rank5, KV_EFORMAT, "has 5 dimensions (at most 4)"},
    /* HF model content */
    {"hf_missing_tensor", c_missing_tensor, KV_EFORMAT,
     "missing tensor 'blk.1.ffn_down.weight' ('model.layers.1.mlp.down_proj.weight')"},
    {"hf_misshaped_tensor", c_misshaped, KV_EFORMAT,
     "tensor blk.0.attn_k.weight ('model.layers.0.self_attn.k_proj.weight') has shape [8, 16, 1, 1], expected [16, 8]"},
    {"hf_missing_lm_head", c_missing_lm_head, KV_EFORMAT, "missing tensor 'output.weight' ('lm_head.weight')"},
    {"hf_qwen2_without_bias", c_qwen2_no_bias, KV_EFORMAT, "missing tensor 'blk.0.attn_q.bias'"},
    {"hf_vocab_mismatch", c_vocab_mismatch, KV_EFORMAT, "vocab_size 21 does not match token_embd.weight (20 rows)"},
    /* config.json */
    {"cfg_bad_json", c_cfg_bad_json, KV_EFORMAT, "config.json: invalid JSON (line 1"},
    {"cfg_duplicate_key", c_cfg_duplicate, KV_EFORMAT, "duplicate object key"},
    {"cfg_missing_field", c_cfg_no_hidden, KV_EFORMAT, "config.json: missing \"hidden_size\""},
    {"cfg_wrong_type", c_cfg_string, KV_EFORMAT, "\"hidden_size\" must be an integer"},
    {"cfg_model_type", c_cfg_model_type, KV_EUNSUPPORTED, "model_type 'gpt2' is not supported"},
    {"cfg_rope_yarn", c_cfg_yarn, KV_EUNSUPPORTED, "rope_scaling type 'yarn' is not supported"},
    {"cfg_llama3_partial", c_cfg_llama3_partial, KV_EFORMAT, "missing \"low_freq_factor\""},
    {"cfg_kv_heads", c_cfg_kv_heads, KV_EFORMAT, "n_heads (2) is not a multiple of n_kv_heads (3)"},
    {"cfg_hidden_act", c_cfg_act, KV_EUNSUPPORTED, "hidden_act 'gelu' is not supported"},
    {"cfg_absurd_layers", c_cfg_layers, KV_EFORMAT, "n_layers = 100000 is out of range"},
    {"cfg_not_object", c_cfg_not_object, KV_EFORMAT, "config.json: not a JSON object"},
    {"cfg_mixtral", c_cfg_mixtral, KV_EUNSUPPORTED,
     "model_type 'mixtral' is not supported (llama, mistral, qwen2, qwen3, gemma3_text)"},
    {"cfg_gemma2", c_cfg_gemma2, KV_EUNSUPPORTED,
     "model_type 'gemma2' is not supported (llama, mistral, qwen2, qwen3, gemma3_text)"},
    {"cfg_qwen3_moe", c_cfg_qwen3_moe, KV_EUNSUPPORTED,
     "model_type 'qwen3_moe' is not supported (llama, mistral, qwen2, qwen3, gemma3_text)"},
    {"cfg_gemma3_multimodal", c_cfg_gemma3_mm, KV_EUNSUPPORTED, "only the text model (model_type 'gemma3_text'"},
    /* HF directory and index */
    {"dir_no_config", c_dir_no_config, KV_ENOTFOUND, "is a directory without config.json"},
    {"dir_no_weights", c_dir_no_weights, KV_ENOTFOUND, "no model.safetensors or model.safetensors.index.json"},
    {"index_missing_shard", c_index_missing_shard, KV_EIO, "model-00009-of-00009.safetensors"},
    {"index_path_escape", c_index_escape, KV_EFORMAT, "must name a file in the same directory"},
    {"index_tensor_not_in_shard", c_index_lacks, KV_EFORMAT, "places tensor 'model.extra.weight' in this shard"},
    {"index_bad_json", c_index_bad_json, KV_EFORMAT, "model.safetensors.index.json': invalid JSON"},
    {"index_no_weight_map", c_index_no_map, KV_EFORMAT, "no \"weight_map\" object"},
    {"index_duplicate_across_shards", c_dup_across_shards, KV_EFORMAT,
     "tensor 'output_norm.weight' appears twice (as 'model.norm.weight')"},
    /* llama2.c */
    {"l2c_truncated", c_l2c_truncated, KV_EFORMAT, "llama2.c checkpoint truncated"},
    {"l2c_trailing", c_l2c_trailing, KV_EFORMAT, "has 4 trailing bytes"},
    {"l2c_absurd_dim", c_l2c_absurd, KV_EFORMAT, "dim=-5"},
    {"l2c_absurd_layers", c_l2c_huge, KV_EFORMAT, "n_layers=2147483647 n_heads=2 n_kv_heads=1 vocab_size=20 seq_len=8 has absurd dims"},
    {"l2c_head_size", c_l2c_heads, KV_EFORMAT, "dim 30 must be n_heads (4) times an even head size"},
    {"unknown_format_text", c_l2c_text, KV_EFORMAT, "unrecognized model format"},
    {"empty_file", c_l2c_empty, KV_EFORMAT, "is empty"},
    {"l2c_versioned_export", c_l2c_ak42, KV_EUNSUPPORTED, "llama2.c version-1 export"},
    {"no_such_path", c_no_such_path, KV_EIO, "cannot open model"},
    /* GGUF */
    {"gguf_truncated_data", c_gguf_truncated, KV_EFORMAT, "extends past the end of the file"},
    {"gguf_truncated_header", c_gguf_short, KV_EFORMAT, "truncated header"},
    {"gguf_future_version", c_gguf_version, KV_EVERSION, "GGUF version 99 is a future version"},
    {"gguf_count_overflow", c_gguf_count, KV_EFORMAT, "tensor_count 4611686018427387904 is more than"},
    {"gguf_bad_magic", c_gguf_bad_magic, KV_EFORMAT, "unrecognized model format"},
    {"gguf_unknown_arch", c_gguf_arch, KV_EUNSUPPORTED, "architecture 'gpt2' is not supported"},
    {"gguf_gemma2", c_gguf_gemma2, KV_EUNSUPPORTED,
     "architecture 'gemma2' is not supported (llama, mistral, qwen2, qwen3, gemma3)"},
    {"gguf_qwen3moe", c_gguf_qwen3moe, KV_EUNSUPPORTED,
     "architecture 'qwen3moe' is not supported (llama, mistral, qwen2, qwen3, gemma3)"},
    {"gguf_gemma3_no_qk_norm", c_gguf_gemma3_no_qk_norm, KV_EFORMAT, "missing tensor 'blk.0.attn_q_norm.weight'"},
    {"gguf_no_arch", c_gguf_no_arch, KV_EFORMAT, "missing GGUF key 'general.architecture'"},
    {"gguf_missing_key", c_gguf_missing_key, KV_EFORMAT, "missing GGUF key 'llama.block_count'"},
    {"gguf_key_type", c_gguf_key_type, KV_EFORMAT, "'llama.block_count' has type string, expected an integer"},
    {"gguf_missing_tensor", c_gguf_missing_tensor, KV_EFORMAT, "missing tensor 'blk.1.ffn_up.weight'"},
    {"gguf_unreadable_type", c_gguf_type, KV_EUNSUPPORTED, "blk.0.ffn_norm.weight has type Q8_1 (9), which this build cannot read"},
};

START_TEST(test_corrupt) {
    const corrupt_case *c = &k_cases[_i];
    char dir[256], path[512];
    mf_tmpdir(dir, sizeof dir);
    c->build(dir, path);
    kv_model_file *mf = (kv_model_file *)&dir; /* must be reset to NULL */
    kv_status s = kv_model_file_open(&mf, path);
    ck_assert_msg(s == c->status, "%s: got %s (%s), expected %s", c->name, kv_status_name(s), kv_error_last(),
                  kv_status_name(c->status));
    ck_assert_ptr_null(mf);
    ck_assert_msg(strstr(kv_error_last(), c->message) != NULL, "%s: message '%s' lacks '%s'", c->name,
                  kv_error_last(), c->message);
    mf_rmtree(dir);
}
END_TEST

START_TEST(test_bad_arguments) {
    kv_model_file *mf = NULL;
    ck_assert_int_eq(kv_model_file_open(NULL, "x"), KV_EINVAL);
    ck_assert_int_eq(kv_model_file_open(&mf, NULL), KV_EINVAL);
    ck_assert_int_eq(kv_model_file_open(&mf, ""), KV_EINVAL);
    ck_assert_ptr_null(mf);
    ck_assert_int_eq(kv_model_file_open(&mf, "/dev/null"), KV_EIO);
    ck_assert_ptr_nonnull(strstr(kv_error_last(), "neither a regular file nor a directory"));
}
END_TEST

TCase *mf_tcase_corrupt(void) {
    TCase *tc = tcase_create("corrupt");
    tcase_add_loop_test(tc, test_corrupt, 0, (int)(sizeof k_cases / sizeof k_cases[0]));
    tcase_add_test(tc, test_bad_arguments);
    return tc;
}
