/* kv_formats.h — the public header of formats/: model file readers (GGUF, HF safetensors with
 * config.json, llama2.c checkpoints), tensor types and dequantization, tokenizer data, and the
 * compression plan format (spec: formats/PLAN_FORMAT.md).
 *
 * Everything read from a file is validated before use: counts, offsets and sizes are bounds-checked
 * before anything is allocated, and a malformed file yields KV_EFORMAT / KV_EVERSION /
 * KV_EUNSUPPORTED with a message naming the file and the field, never a crash.
 *
 * Sections of this header (each owned by one part of the module):
 *   1. tensor types and dequantization       (dequant.c)
 *   2. GGUF reader and writer                (gguf_read.c, gguf_write.c)
 *   3. model files: one view over GGUF, safetensors and llama2.c (model_file*.c, safetensors.c, llama2c.c)
 *   4. tokenizer data                        (vocab*.c)
 *   5. compression plan                      (plan*.c)
 */
#ifndef KV_FORMATS_H
#define KV_FORMATS_H

#include <stddef.h>
#include <stdint.h>

#include "kv_common.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ============================================================================================
 * 1. Tensor types (numbered as GGML numbers them, so GGUF type ids map one to one)
 * ============================================================================================ */
typedef enum kv_dtype {
    KV_DTYPE_F32 = 0,
    KV_DTYPE_F16 = 1,
    KV_DTYPE_Q4_0 = 2,
    KV_DTYPE_Q4_1 = 3,
    KV_DTYPE_Q5_0 = 6,
    KV_DTYPE_Q5_1 = 7,
    KV_DTYPE_Q8_0 = 8,
    KV_DTYPE_Q8_1 = 9,
    KV_DTYPE_Q2_K = 10,
    KV_DTYPE_Q3_K = 11,
    KV_DTYPE_Q4_K = 12,
    KV_DTYPE_Q5_K = 13,
    KV_DTYPE_Q6_K = 14,
    KV_DTYPE_Q8_K = 15,
    KV_DTYPE_I8 = 24,
    KV_DTYPE_I16 = 25,
    KV_DTYPE_I32 = 26,
    KV_DTYPE_I64 = 27,
    KV_DTYPE_F64 = 28,
    KV_DTYPE_BF16 = 30
} kv_dtype;

/* Name ("Q4_1"), or NULL for a value that is not a known type. */
const char *kv_dtype_name(int dtype);
/* Elements per block and bytes per block; 0 for unknown types. */
size_t kv_dtype_block_elems(int dtype);
size_t kv_dtype_block_bytes(int dtype);
/* Bytes taken by n elements (n must be a multiple of the block size): KV_EFORMAT otherwise. */
kv_status kv_dtype_row_bytes(size_t *out, int dtype, uint64_t n);
/* 1 when kv_dequantize supports the type. */
int kv_dtype_can_dequantize(int dtype);
/* Dequantize n elements (a multiple of the block size) of `dtype` at src into dst. */
kv_status kv_dequantize(float *dst, const void *src, int dtype, size_t n);

/* ============================================================================================
 * 2. GGUF (v2 and v3) reader and writer
 * ============================================================================================ */
typedef enum kv_gguf_type {
    KV_GGUF_UINT8 = 0,
    KV_GGUF_INT8 = 1,
    KV_GGUF_UINT16 = 2,
    KV_GGUF_INT16 = 3,
    KV_GGUF_UINT32 = 4,
    KV_GGUF_INT32 = 5,
    KV_GGUF_FLOAT32 = 6,
    KV_GGUF_BOOL = 7,
    KV_GGUF_STRING = 8,
    KV_GGUF_ARRAY = 9,
    KV_GGUF_UINT64 = 10,
    KV_GGUF_INT64 = 11,
    KV_GGUF_FLOAT64 = 12
} kv_gguf_type;

/* A metadata value. Strings are (ptr, len), not NUL-terminated, pointing into the file. Arrays
 * hold `count` values of `elem_type`; nested arrays are supported (elements are kv_gguf_value). */
typedef struct kv_gguf_value kv_gguf_value;
struct kv_gguf_value {
    kv_gguf_type type;
    union {
        uint64_t u64; /* every unsigned integer type and bool, widened */
        int64_t i64;  /* every signed integer type, widened */
        double f64;   /* float32 and float64, widened */
        struct {
            const char *ptr;
            uint64_t len;
        } str;
        struct {
            kv_gguf_type elem_type;
            uint64_t count;
            const uint8_t *raw; /* the elements as stored (fixed-size types) */
            kv_gguf_value *items; /* decoded elements for string and array element types; NULL otherwise */
        } arr;
    } v;
};

typedef struct kv_gguf_kv {
    const char *key; /* NUL-terminated copy owned by the reader */
    kv_gguf_value value;
} kv_gguf_kv;

typedef struct kv_tensor_info {
    const char *name;   /* NUL-terminated, owned by the reader */
    int dtype;          /* kv_dtype */
    int n_dims;         /* 1..4 */
    uint64_t ne[4];     /* GGML order: ne[0] is the fastest-varying (row length); unused dims = 1 */
    uint64_t offset;    /* byte offset of the data from the start of the data section (GGUF) or file */
    size_t nbytes;      /* bytes of data */
    const void *data;   /* points into the mapped file; valid while the reader is open */
} kv_tensor_info;

typedef struct kv_gguf kv_gguf; /* opaque */

/* Open a GGUF file (memory-mapped). On failure *out is NULL and the error names the problem. */
kv_status kv_gguf_open(kv_gguf **out, const char *path);
/* Parse a GGUF image held in memory (borrowed; must outlive the reader). Used by tests and fuzzing. */
kv_status kv_gguf_open_memory(kv_gguf **out, const void *data, size_t size);
void kv_gguf_close(kv_gguf *g);

uint32_t kv_gguf_version(const kv_gguf *g);
size_t kv_gguf_alignment(const kv_gguf *g);
size_t kv_gguf_kv_count(const kv_gguf *g);
const kv_gguf_kv *kv_gguf_kv_at(const kv_gguf *g, size_t i);
/* Borrowed pointer to the value of `key`, or NULL. */
const kv_gguf_value *kv_gguf_find(const kv_gguf *g, const char *key);
/* Typed getters: KV_ENOTFOUND when absent, KV_EFORMAT when the stored type does not fit. */
kv_status kv_gguf_get_u64(const kv_gguf *g, const char *key, uint64_t *out);
kv_status kv_gguf_get_i64(const kv_gguf *g, const char *key, int64_t *out);
kv_status kv_gguf_get_f64(const kv_gguf *g, const char *key, double *out);
/* A copy of a string value (caller frees). */
kv_status kv_gguf_get_str(const kv_gguf *g, const char *key, char **out);

size_t kv_gguf_tensor_count(const kv_gguf *g);
const kv_tensor_info *kv_gguf_tensor_at(const kv_gguf *g, size_t i);
const kv_tensor_info *kv_gguf_find_tensor(const kv_gguf *g, const char *name);

/* GGUF writer (v3), used by tests to write small random models and by tools to export. */
typedef struct kv_gguf_writer kv_gguf_writer;
kv_status kv_gguf_writer_create(kv_gguf_writer **out);
void kv_gguf_writer_free(kv_gguf_writer *w);
kv_status kv_gguf_writer_set_u32(kv_gguf_writer *w, const char *key, uint32_t v);
kv_status kv_gguf_writer_set_i32(kv_gguf_writer *w, const char *key, int32_t v);
kv_status kv_gguf_writer_set_u64(kv_gguf_writer *w, const char *key, uint64_t v);
kv_status kv_gguf_writer_set_f32(kv_gguf_writer *w, const char *key, float v);
kv_status kv_gguf_writer_set_bool(kv_gguf_writer *w, const char *key, int v);
kv_status kv_gguf_writer_set_str(kv_gguf_writer *w, const char *key, const char *v);
/* Array of fixed-size elements (elem_type not STRING/ARRAY): `count` elements at `data`. */
kv_status kv_gguf_writer_set_array(kv_gguf_writer *w, const char *key, kv_gguf_type elem_type,
                                   const void *data, uint64_t count);
kv_status kv_gguf_writer_set_str_array(kv_gguf_writer *w, const char *key, const char *const *strs,
                                       uint64_t count);
/* Add a tensor; data (nbytes = kv_dtype_row_bytes of ne[0] times the other dims) is copied. */
kv_status kv_gguf_writer_add_tensor(kv_gguf_writer *w, const char *name, int dtype, int n_dims,
                                    const uint64_t *ne, const void *data);
/* Write atomically to path. */
kv_status kv_gguf_writer_write(kv_gguf_writer *w, const char *path);
/* Serialize to a malloc'd buffer (caller frees) — for tests that build corrupt variants. */
kv_status kv_gguf_writer_to_memory(kv_gguf_writer *w, uint8_t **out, size_t *size);

/* ============================================================================================
 * 3. Model files: one view over GGUF, HF safetensors directories and llama2.c checkpoints.
 *
 * Tensors are exposed under canonical (GGUF/llama.cpp) names, with shapes in GGML order:
 *   token_embd.weight [d_model, vocab]       output_norm.weight [d_model]   output.weight (absent if tied)
 *   blk.N.attn_norm.weight [d_model]         blk.N.ffn_norm.weight [d_model]
 *   blk.N.attn_q.weight [d_model, n_heads*head_dim]      blk.N.attn_q.bias (Qwen2)
 *   blk.N.attn_k.weight [d_model, n_kv_heads*head_dim]   blk.N.attn_k.bias
 *   blk.N.attn_v.weight [d_model, n_kv_heads*head_dim]   blk.N.attn_v.bias
 *   blk.N.attn_output.weight [n_heads*head_dim, d_model]
 *   blk.N.ffn_gate.weight [d_model, d_ff]  blk.N.ffn_up.weight [d_model, d_ff]  blk.N.ffn_down.weight [d_ff, d_model]
 * i.e. a weight W with ne = {in, out} is a row-major out x in matrix (y = W x), as in PyTorch.
 * The RoPE layout says how Q/K rows are paired: GGUF-converted Llama and llama2.c rotate adjacent
 * pairs (2i, 2i+1); HF checkpoints (and GGUF qwen2) rotate halves (i, i + head_dim/2).
 * ============================================================================================ */
typedef enum kv_model_format { KV_MODEL_GGUF = 0, KV_MODEL_SAFETENSORS = 1, KV_MODEL_LLAMA2C = 2 } kv_model_format;
typedef enum kv_rope_layout { KV_ROPE_ADJACENT = 0, KV_ROPE_HALF = 1 } kv_rope_layout;
typedef enum kv_rope_scaling { KV_ROPE_SCALING_NONE = 0, KV_ROPE_SCALING_LINEAR = 1, KV_ROPE_SCALING_LLAMA3 = 2 } kv_rope_scaling;

typedef struct kv_arch {
    char arch[32];        /* "llama", "qwen2", "mistral" (SmolLM2 is "llama") */
    char name[128];       /* general.name or the directory name; informational */
    int n_layers;
    int d_model;
    int n_heads;
    int n_kv_heads;
    int head_dim;
    int d_ff;
    int vocab_size;
    int max_seq_len;      /* context length the model was trained with */
    float rms_eps;
    float rope_theta;
    kv_rope_layout rope_layout;
    kv_rope_scaling rope_scaling;
    float rope_factor;            /* linear / llama3 factor */
    float rope_low_freq_factor;   /* llama3 */
    float rope_high_freq_factor;  /* llama3 */
    int rope_orig_max_pos;        /* llama3 original_max_position_embeddings */
    int qkv_bias;                 /* 1 when Q/K/V projections have biases (Qwen2) */
    int tied_embeddings;          /* 1 when output.weight is token_embd.weight */
    int bos_id, eos_id;           /* -1 when unknown */
} kv_arch;

typedef struct kv_model_file kv_model_file; /* opaque */

/* Open a model: a .gguf file, a directory with config.json + *.safetensors (single or sharded
 * with model.safetensors.index.json), or a llama2.c checkpoint. The format is detected from the
 * content (magic / directory), not the file name. */
kv_status kv_model_file_open(kv_model_file **out, const char *path);
void kv_model_file_close(kv_model_file *mf);
kv_model_format kv_model_file_format(const kv_model_file *mf);
const kv_arch *kv_model_file_arch(const kv_model_file *mf);
size_t kv_model_file_tensor_count(const kv_model_file *mf);
const kv_tensor_info *kv_model_file_tensor_at(const kv_model_file *mf, size_t i);
/* Canonical-name lookup; NULL when absent. */
const kv_tensor_info *kv_model_file_find(const kv_model_file *mf, const char *name);
/* Dequantize a whole tensor to f32 (dst holds ne[0]*ne[1]*ne[2]*ne[3] floats). */
kv_status kv_model_file_read_f32(const kv_model_file *mf, const kv_tensor_info *t, float *dst);
/* The underlying GGUF reader (for metadata such as tokenizer arrays), or NULL for other formats. */
const kv_gguf *kv_model_file_gguf(const kv_model_file *mf);
/* Path the model was opened from (borrowed). */
const char *kv_model_file_path(const kv_model_file *mf);

/* ============================================================================================
 * 4. Tokenizer data (the model/ tokenizer builds on this)
 * ============================================================================================ */
typedef enum kv_vocab_kind {
    KV_VOCAB_SPM = 0,  /* SentencePiece-style BPE with scores and byte fallback (Llama 2, llama2.c) */
    KV_VOCAB_BPE = 1   /* byte-level BPE with merges (GPT-2 style: Llama 3, Qwen2, SmolLM2) */
} kv_vocab_kind;

typedef struct kv_vocab_data {
    kv_vocab_kind kind;
    char pre[32];           /* pre-tokenizer name as GGUF's tokenizer.ggml.pre says ("smollm", "llama-bpe", "qwen2", "default") */
    int n_tokens;
    char **tokens;          /* n_tokens strings (byte strings; may contain NUL only as "<0x00>"-style pieces) */
    uint32_t *token_len;    /* byte length of each token */
    float *scores;          /* n_tokens scores (SPM); NULL for BPE */
    int32_t *token_type;    /* GGUF token types (1 normal, 2 unknown, 3 control, 4 user-defined, 6 byte); may be NULL */
    int n_merges;
    char **merges;          /* "left right" pairs in priority order (BPE); NULL for SPM */
    int bos_id, eos_id, unk_id, pad_id; /* -1 when absent */
    int add_bos;            /* the model's default for prepending BOS */
    int add_space_prefix;   /* SPM dummy prefix: prepend a space to the input */
} kv_vocab_data;

/* Load tokenizer data for a model. tokenizer_path may be NULL (then: GGUF metadata, tokenizer.json in
 * a safetensors directory, or tokenizer.bin / tok*.bin beside a llama2.c checkpoint). An explicit
 * tokenizer_path may name a tokenizer.json or a llama2.c tok*.bin. */
kv_status kv_vocab_load(kv_vocab_data **out, const kv_model_file *mf, const char *tokenizer_path);
void kv_vocab_free(kv_vocab_data *v);

/* ============================================================================================
 * 5. Compression plan (spec: formats/PLAN_FORMAT.md)
 * ============================================================================================ */
/* (declared by the plan module below this line) */

#ifdef __cplusplus
}
#endif
#endif /* KV_FORMATS_H */
