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
 *   5. the plan: kv_plan.h (plan*.c); here the fingerprint of a model file and the export to serving engines
 */
#ifndef KV_FORMATS_H
#define KV_FORMATS_H

#include <stddef.h>
#include <stdint.h>

#include "kv_common.h"
#include "kv_plan.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ============================================================================================
 * 1. Tensor types (numbered as GGML numbers them, so GGUF type ids map one to one)
 * ============================================================================================ */

/* Name ("Q4_1"), or NULL for a value that is not a known type. */
const char *kv_dtype_name(int dtype);
/* Elements per block and bytes per block; 0 for unknown types. */
size_t kv_dtype_block_elems(int dtype);
size_t kv_dtype_block_bytes(int dtype);
/* Bytes taken by n elements (n must be a multiple of the block size): KV_EFORMAT otherwise. */
kv_status kv_dtype_row_bytes(size_t *out, int dtype, uint64_t n);
/* 1 when kv_dequantize supports the type: F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K,
 * Q4_K, Q5_K, Q6_K, I8, I16, I32, I64, F64 (bit-identical to ggml's dequantize_row_*). Other GGML
 * types (Q8_1, Q8_K, IQ*, TQ*, MXFP4, ...) have known block sizes, so files holding them read fine,
 * but they do not dequantize (KV_EUNSUPPORTED). */
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

typedef struct kv_gguf kv_gguf; /* opaque; immutable once open, so concurrent readers are safe */

/* Name of a metadata value type ("uint32", "string", "array"), or NULL for an unknown value. */
const char *kv_gguf_type_name(int type);

/* Open a GGUF file (memory-mapped). On failure *out is NULL and the error names the problem. */
kv_status kv_gguf_open(kv_gguf **out, const char *path);
/* Parse a GGUF image held in memory (borrowed; must outlive the reader). Used by tests and fuzzing. */
kv_status kv_gguf_open_memory(kv_gguf **out, const void *data, size_t size);
void kv_gguf_close(kv_gguf *g);

uint32_t kv_gguf_version(const kv_gguf *g);
size_t kv_gguf_alignment(const kv_gguf *g);
/* Byte offset of the tensor data section from the start of the file (a multiple of the alignment). */
size_t kv_gguf_data_offset(const kv_gguf *g);
size_t kv_gguf_kv_count(const kv_gguf *g);
const kv_gguf_kv *kv_gguf_kv_at(const kv_gguf *g, size_t i);
/* Borrowed pointer to the value of `key`, or NULL. */
const kv_gguf_value *kv_gguf_find(const kv_gguf *g, const char *key);
/* Typed getters: KV_ENOTFOUND when absent, KV_EFORMAT when the stored type does not fit.
 * u64 takes any unsigned integer, bool, or a signed integer >= 0; i64 any signed integer or an
 * unsigned one <= INT64_MAX; f64 float32/float64 or any integer (converted). */
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
/* Any value, deep-copied: scalars, strings, arrays of fixed-size elements (from arr.raw, stored
 * little-endian as in a file), and arrays of strings or of arrays (from arr.items), nested to any
 * depth the reader accepts. Lets tools copy metadata from a kv_gguf into a new file. */
kv_status kv_gguf_writer_set_value(kv_gguf_writer *w, const char *key, const kv_gguf_value *v);
/* Setting a key that is already set replaces its value in place (the key keeps its position).
 * "general.alignment" (uint32, a power of two) sets the writer's alignment; the default is 32. */
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
 *   blk.N.attn_q_norm.weight, blk.N.attn_k_norm.weight [head_dim]                (qk_norm: Qwen3, Gemma 3)
 *   blk.N.post_attention_norm.weight, blk.N.post_ffw_norm.weight [d_model]       (post_norms: Gemma 3)
 * i.e. a weight W with ne = {in, out} is a row-major out x in matrix (y = W x), as in PyTorch.
 * Other GGUF tensors keep their own names (rope_freqs.weight [head_dim/2]: llama.cpp's per-pair
 * frequency divisors, its form of Llama 3 RoPE scaling); HF tensors a forward does not use are
 * left out. kv_model_file_open checks that every tensor above is present with its shape and a type
 * kv_dequantize reads (biases only when qkv_bias, the norms of the last two lines only with their
 * flags), so a model that opens can be loaded. Norm weights read as the forward multiplies by them:
 * HF Gemma 3 stores w and computes x * (1 + w) (Gemma3RMSNorm), llama.cpp's converter stores 1 + w in
 * GGUF; kv_model_file_read_f32 returns 1 + w for an HF Gemma 3 norm, so both formats give the same
 * values (the bytes at kv_tensor_info.data stay the file's).
 * kv_tensor_info.offset counts from the GGUF data section, or from the start of the (shard) file
 * for safetensors and llama2.c. `data` is not necessarily aligned for its type (safetensors offsets
 * are byte offsets): read through kv_model_file_read_f32 or byte loads.
 * The RoPE layout says how Q/K rows are paired: GGUF-converted Llama and llama2.c rotate adjacent
 * pairs (2i, 2i+1); HF checkpoints (and GGUF qwen2) rotate halves (i, i + head_dim/2).
 * ============================================================================================ */
typedef enum kv_model_format { KV_MODEL_GGUF = 0, KV_MODEL_SAFETENSORS = 1, KV_MODEL_LLAMA2C = 2 } kv_model_format;
typedef enum kv_rope_scaling { KV_ROPE_SCALING_NONE = 0, KV_ROPE_SCALING_LINEAR = 1, KV_ROPE_SCALING_LLAMA3 = 2 } kv_rope_scaling;
/* Gate activation of the gated feed-forward block: SwiGLU (silu(g) * u; Llama, Qwen) or GeGLU with the tanh
 * approximation of GELU (gelu_tanh(g) * u; Gemma 3's hidden_activation "gelu_pytorch_tanh", llama.cpp's
 * LLM_FFN_GELU). */
typedef enum kv_ffn_act { KV_FFN_SILU = 0, KV_FFN_GELU_TANH = 1 } kv_ffn_act;

typedef struct kv_arch {
    char arch[32];        /* "llama", "qwen2", "mistral", "qwen3", "gemma3" (SmolLM2 is "llama"; HF's gemma3_text
                             reads as "gemma3") */
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
    /* Gemma 3 and Qwen3 (all zero: the Llama-family block above; the choices and their sources:
     * model/MODELS.md). */
    int qk_norm;                  /* 1: RMSNorm over each head of q and of k (blk.N.attn_q_norm.weight and
                                     attn_k_norm.weight, [head_dim]) after the projections, before RoPE */
    int post_norms;               /* 1: RMSNorm of the attention output (blk.N.post_attention_norm.weight) and of
                                     the FFN output (blk.N.post_ffw_norm.weight) before each residual add */
    kv_ffn_act ffn_act;           /* the gated FFN's activation */
    float embed_scale;            /* token embeddings are multiplied by this (Gemma: sqrt(d_model)); 0 = 1 */
    float attn_scale;             /* softmax scale of q.k (Gemma 3: query_pre_attn_scalar^-1/2); 0 = 1/sqrt(head_dim) */
    float final_logit_softcap;    /* c > 0: logits = c * tanh(logits / c); 0 = none */
    int sliding_window;           /* W > 0: a local layer's query attends to the last W positions, its own
                                     included (keys at p - W < pos <= p); 0: every layer attends to all */
    int swa_pattern;              /* with sliding_window: layer l is local when l % swa_pattern < swa_pattern - 1
                                     (Gemma 3: 6, five local layers then a global one); 0: every layer local */
    float rope_theta_local;       /* RoPE base of local layers (Gemma 3: 10000), which ignore rope_scaling;
                                     global layers use rope_theta and the scaling */
} kv_arch;

/* The window of a layer's attention: sliding_window for a local layer, 0 (unbounded) for a global one or
 * any layer of a model without windows. */
int kv_arch_layer_window(const kv_arch *a, int layer);
/* 1 when the layer is local (kv_arch_layer_window > 0). */
int kv_arch_layer_is_local(const kv_arch *a, int layer);
/* The RoPE base of a layer: rope_theta_local for a local layer, rope_theta otherwise. */
float kv_arch_layer_rope_theta(const kv_arch *a, int layer);
/* The softmax scale of q.k the model uses (attn_scale, or 1/sqrt(head_dim) when 0). */
double kv_arch_attn_scale(const kv_arch *a);
/* Architectures kv_model_file_open reads ("llama, mistral, qwen2, qwen3, gemma3"), for messages. */
const char *kv_arch_supported_list(void);

typedef struct kv_model_file kv_model_file; /* opaque */

/* Open a model: a .gguf file, a directory with config.json + *.safetensors (single or sharded
 * with model.safetensors.index.json), or a llama2.c checkpoint. The format is detected from the
 * content (magic / directory), not the file name. Errors: KV_EIO (cannot open or map),
 * KV_EFORMAT (malformed: unrecognized content, truncated, missing or misshaped tensor, bad
 * config.json), KV_EVERSION (GGUF version), KV_EUNSUPPORTED (architecture, dtype, RoPE scaling
 * type this build does not read), KV_ENOTFOUND (a directory without config.json or weights). */
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
/* Hand back the memory pages of tensor t's data (t NULL: every tensor's) to the OS: they stop
 * counting in the process's resident set and are read again from the file when next touched. For a
 * caller that has copied or decoded a tensor and will not read it soon (layer-streamed weights,
 * kv_model_options.stream). The data stays valid; only advice, so it cannot fail. */
void kv_model_file_release_pages(const kv_model_file *mf, const kv_tensor_info *t);

/* ============================================================================================
 * 4. Tokenizer data (the model/ tokenizer builds on this)
 * ============================================================================================ */
typedef enum kv_vocab_kind {
    KV_VOCAB_SPM = 0,        /* SentencePiece BPE: merges chosen by token score, spaces as U+2581,
                                byte fallback "<0xNN>" (Llama 2 GGUF, llama2.c tok*.bin, .model) */
    KV_VOCAB_BPE = 1,        /* byte-level BPE with ranked merges and a pre-tokenizer (GPT-2 style:
                                Llama 3, Qwen2, SmolLM2) */
    KV_VOCAB_SPM_MERGES = 2  /* SentencePiece text handling (U+2581, dummy prefix, byte fallback) but
                                merges by rank, as HF tokenizer.json stores Llama 2 / Mistral */
} kv_vocab_kind;

/* Token types, numbered as GGUF's tokenizer.ggml.token_type (and sentencepiece) number them. */
typedef enum kv_token_type {
    KV_TOKEN_NORMAL = 1,
    KV_TOKEN_UNKNOWN = 2,
    KV_TOKEN_CONTROL = 3,
    KV_TOKEN_USER_DEFINED = 4,
    KV_TOKEN_UNUSED = 5,
    KV_TOKEN_BYTE = 6
} kv_token_type;

/* Everything a tokenizer needs, independent of the file it came from. Token strings are stored as
 * the vocabulary spells them: byte-level BPE tokens in the GPT-2 byte-to-unicode alphabet (U+0120
 * for a space), SentencePiece tokens with U+2581 for spaces and "<0x0A>" for byte tokens. All arrays
 * and strings point into memory owned by the struct; kv_vocab_free releases everything. */
typedef struct kv_vocab_data {
    kv_vocab_kind kind;
    char pre[32];           /* BPE pre-tokenizer name as GGUF's tokenizer.ggml.pre spells it ("smollm",
                               "llama-bpe", "qwen2", "gpt-2", ...); "" for SPM kinds */
    char source[32];        /* where it came from: "gguf", "tokenizer.json", "llama2.c", "sentencepiece" */
    int n_tokens;
    char **tokens;          /* n_tokens NUL-terminated strings (a token never contains NUL) */
    uint32_t *token_len;    /* byte length of each token */
    float *scores;          /* n_tokens scores (KV_VOCAB_SPM); NULL otherwise */
    int32_t *token_type;    /* n_tokens kv_token_type values (never NULL: inferred when the file has none) */
    int n_merges;
    char **merges;          /* "left right" pairs in priority order (BPE kinds); NULL for KV_VOCAB_SPM */
    int bos_id, eos_id, unk_id, pad_id; /* -1 when absent */
    int add_bos;            /* the model's default for prepending BOS */
    int add_space_prefix;   /* SPM kinds: dummy prefix, a space prepended to the input (to the text
                               after each special token, as llama.cpp does) */
    int remove_extra_ws;    /* SPM kinds: sentencepiece's remove_extra_whitespaces normalization:
                               drop leading and trailing spaces, collapse runs of spaces to one */
    void *priv_;            /* storage behind the pointers above */
} kv_vocab_data;

/* Load tokenizer data for a model.
 *
 * tokenizer_path NULL: from the model itself: GGUF metadata (tokenizer.ggml.*), tokenizer.json in a
 * safetensors directory, or beside a llama2.c checkpoint tok<vocab_size>.bin, else tokenizer.bin.
 * An explicit tokenizer_path may name: a GGUF file (its metadata), a tokenizer.json (or a directory
 * holding one), a sentencepiece .model (BPE type), or a llama2.c tok*.bin. mf may be NULL when
 * tokenizer_path is given.
 *
 * llama2.c tok*.bin carries no normalizer settings: when a sentencepiece model with the same stem
 * (tok512.bin -> tok512.model) lies beside it, its add_dummy_prefix / remove_extra_whitespaces are
 * used (that is how llama2.c's own tokenizers were trained and their training data tokenized);
 * otherwise the llama2.c run.c behaviour: dummy prefix on, no whitespace removal.
 *
 * Errors: KV_ENOTFOUND (no tokenizer found), KV_EIO, KV_EFORMAT (malformed data: token ids out of
 * range, truncated records, wrong types), KV_EUNSUPPORTED (a tokenizer model this build does not
 * implement, e.g. WordPiece or Unigram). On failure *out is NULL. */
kv_status kv_vocab_load(kv_vocab_data **out, const kv_model_file *mf, const char *tokenizer_path);
void kv_vocab_free(kv_vocab_data *v);

/* ============================================================================================
 * 5. The compression plan: kv_plan.h (the plan format, which libkvrt links without the rest of formats/);
 *    here what needs a model file or a checkpoint
 * ============================================================================================ */
/* The fingerprint of a model file: kv_arch fields plus SHA-256 over every layer's attn_k.weight,
 * attn_k.bias, attn_v.weight, attn_v.bias (the biases when present) as stored (§6.1.1). */
kv_status kv_plan_fingerprint_compute(kv_plan_fingerprint *out, const kv_model_file *mf);
/* ---- export to serving engines' checkpoint formats (export_hf.c, kvcal export) ---- */
typedef enum kv_export_format { KV_EXPORT_COMPRESSED_TENSORS = 0, KV_EXPORT_MODELOPT = 1 } kv_export_format;
/* KV_OK when the format can express the plan, else KV_EUNSUPPORTED with the reason (a predictor, a
 * stream that is not FP8 E4M3 / NVFP4, methods or scale counts that differ between streams, keys
 * before RoPE, E5M2, NVFP4 in compressed-tensors, per-head scales in modelopt). */
kv_status kv_export_check(const kv_plan *p, kv_export_format f);
/* A new directory out_dir: a copy of the Hugging Face checkpoint model_dir with the plan's scales in
 * the engines' names and shapes and the quantization metadata they read (export_hf.c says which;
 * kernels/FLOAT_KV.md cites the engines' code). Written into a temporary directory beside out_dir
 * and renamed to it at the end: out_dir must not exist or be an empty directory (the caller checks
 * that before any work; a rename onto a directory that is not empty fails with KV_EIO). Files are
 * copied in blocks of 1 MiB; config.json, the index, hf_quant_config.json and safetensors headers are
 * read with a cap of KV_EXPORT_JSON_MAX bytes. KV_EMISMATCH when config.json does not describe the
 * plan's model (layers, hidden size, heads, KV heads, head dim, vocabulary, RoPE theta);
 * KV_EUNSUPPORTED when the plan or the checkpoint's own quantization_config cannot take the format. */
#define KV_EXPORT_JSON_MAX (16u << 20)
kv_status kv_export_hf(const kv_plan *p, const char *model_dir, kv_export_format f, const char *out_dir);

/* ---- kvcal fit configuration (YAML; config.c; keys documented in configs/kvcal-example.yaml) ----
 * kv_fit_config_init sets the defaults; kv_fit_config_load_* merge a YAML document onto the struct
 * (later loads and kv_fit_config_set override earlier values); kv_fit_config_validate checks the
 * cross-key rules; kv_fit_config_dump writes the resolved configuration back as YAML (it loads back
 * to the same struct). Errors are KV_EINVAL with "SOURCE:LINE:COL: key 'a.b': problem" messages. */
typedef enum kv_fit_method {
    KV_FIT_AQUA = 0,         /* AQUA-KV predictors + HIGGS */
    KV_FIT_AQUA_UNIFORM = 1, /* AQUA-KV predictors + uniform quantizer */
    KV_FIT_HIGGS = 2,        /* HIGGS alone */
    KV_FIT_KIVI = 3,         /* uniform quantizer alone (KIVI + XQuant eta) */
    KV_FIT_FP8 = 4,          /* FP8 (fp.fp8_format) with calibrated tensor scales (calib/fit_float.c) */
    KV_FIT_NVFP4 = 5,        /* NVFP4 with a calibrated second-level tensor scale */
    KV_FIT_XQUANT = 6,       /* XQuant: KIVI layout, data-free or calibrated eta, shared codes, 1-bit layers */
    KV_FIT_SQUAT = 7,        /* KIVI layout with SQuat keys (squat.enabled), r / lambda calibrated per layer */
    KV_FIT_METHOD_COUNT      /* the number of methods: one row each in kv_fit_method_traits_of (formats/config.c)
                              * and kv_fitter_of (calib/fitters.c) */
} kv_fit_method;
/* What a method is to the configuration and the fit: kv_fit_method_traits_of(m)->flags. */
enum {
    KV_FIT_T_HIGGS = 1u << 0,       /* streams coded on a HIGGS grid (higgs.* apply) */
    KV_FIT_T_PREDICTS = 1u << 1,    /* AQUA-KV: predictors from layer 1 on, aqua.first_layer_bits on layer 0 */
    KV_FIT_T_FLOAT = 1u << 2,       /* an engine's float format (fp.*): its bits are the format's own, no RPC */
    KV_FIT_T_F16 = 1u << 3,         /* 16 bits keeps a stream in f16 unquantized (KIVI's layout) */
    KV_FIT_T_SQUAT_OK = 1u << 4,    /* may quantize its keys with SQuat (squat.enabled) */
    KV_FIT_T_SQUAT = 1u << 5,       /* always does (squat.enabled must stay true) */
    KV_FIT_T_WHOLE_PLAN = 1u << 6,  /* a method of the whole plan, not a per-stream override (layers.N.*_method) */
    KV_FIT_T_XQUANT = 1u << 7,      /* takes xquant.* (eta calibration, shared codes, 1-bit layers, target bits) */
    KV_FIT_T_UNCALIBRATED = 1u << 8 /* has a plan without calibration data (kv_fit_plan_uncalibrated) */
};
typedef struct kv_fit_method_traits {
    unsigned flags; /* KV_FIT_T_* */
} kv_fit_method_traits;
enum { KV_FIT_SQ_PROMPT = 0, KV_FIT_SQ_STATIC = 1 };        /* squat.subspace */
enum { KV_FIT_SQ_CALIBRATED = 0, KV_FIT_SQ_FIXED = 1 };     /* squat.choose */

typedef struct kv_fit_stream_config {
    int bits;                /* uniform bits, 1..8 */
    int group_size;
    kv_plan_group_axis group_axis;
    int scale_dtype;         /* KV_DTYPE_F16 | KV_DTYPE_F32 */
    double eta;              /* [0, 0.5) */
    int pack3;               /* 10 or 11 codes per word when bits == 3 */
} kv_fit_stream_config;

/* Per-layer overrides (what kvprof importance writes). `set` has a KV_FIT_LO_* bit per given key. */
typedef struct kv_fit_layer_override {
    int layer;
    unsigned set;
    int key_bits, value_bits;
    double rpc_ratio;        /* both streams */
    double key_eta, value_eta;
    double prune_budget;
    double key_rpc_ratio, value_rpc_ratio; /* one stream (KVmix sets K and V apart); win over rpc_ratio */
    int key_method, value_method; /* kv_fit_method of one stream (a mixed plan: kvcal search's refit); kivi,
                                     higgs, aqua, aqua-uniform, fp8 or nvfp4 */
    int key_pre_rope;        /* the layer's keys stored before RoPE (1) or after (0); wins over cache.pre_rope */
    int key_rank, value_rank; /* a predicted stream's predictor rank (0 full); win over aqua.rank */
    int key_predictor_bits, value_predictor_bits; /* 0 or 4 (GPTQ codes); win over aqua.predictor_bits */
    int key_group_axis, key_group_size;     /* a uniform stream's groups (KV_PLAN_GROUP_*, values per group); */
    int value_group_axis, value_group_size; /* win over keys.* / values.* (kvcal search's refit of AQUA-KV with
                                               uniform residuals beside KIVI streams) */
    char where[128];         /* where the override was first set ("file:line:col", "command line") */
} kv_fit_layer_override;
#define KV_FIT_LO_KEY_BITS 0x1u
#define KV_FIT_LO_VALUE_BITS 0x2u
#define KV_FIT_LO_RPC_RATIO 0x4u
#define KV_FIT_LO_KEY_ETA 0x8u
#define KV_FIT_LO_VALUE_ETA 0x10u
#define KV_FIT_LO_PRUNE_BUDGET 0x20u
#define KV_FIT_LO_KEY_RPC_RATIO 0x40u
#define KV_FIT_LO_VALUE_RPC_RATIO 0x80u
#define KV_FIT_LO_KEY_METHOD 0x100u
#define KV_FIT_LO_VALUE_METHOD 0x200u
#define KV_FIT_LO_KEY_PRE_ROPE 0x400u
#define KV_FIT_LO_KEY_RANK 0x800u
#define KV_FIT_LO_VALUE_RANK 0x1000u
#define KV_FIT_LO_KEY_GROUP_AXIS 0x2000u
#define KV_FIT_LO_KEY_GROUP_SIZE 0x4000u
#define KV_FIT_LO_VALUE_GROUP_AXIS 0x8000u
#define KV_FIT_LO_VALUE_GROUP_SIZE 0x10000u
#define KV_FIT_LO_KEY_PRED_BITS 0x20000u
#define KV_FIT_LO_VALUE_PRED_BITS 0x40000u

typedef struct kv_fit_config {
    kv_fit_method method;
    uint64_t seed;
    char *model;                 /* owned strings; "" = not given */
    struct {
        char *calibration;       /* corpus used to fit */
        char *heldout;           /* held-out corpus for metrics; "" = split off the calibration */
        double heldout_fraction; /* fraction of calibration sequences held out when heldout is "" */
        int seq_len;
        int64_t max_tokens;      /* calibration tokens at most; 0 = all */
        int shard_seqs;          /* sequences per shard (forward batch, unit of the rank split and of the
                                    fixed-order sums); 0 = max(1, 2048 / seq_len) */
    } data;
    struct {
        int sinks, recent;
        int pre_rope;            /* keys compressed before RoPE */
        double rpc_ratio;        /* default KVmix recent-pivotal-context ratio */
        int windowed_layers;     /* kv_fit_windowed: what the fit does with a layer whose attention has a window
                                    (kv_arch_layer_window > 0, e.g. Gemma 3's local layers; the plan records the window) */
    } cache;
    kv_fit_stream_config keys, values;
    struct {
        double ridge;            /* relative ridge: lambda = ridge * mean(diag(X^T X)) */
        int predict_keys, predict_values;
        int value_uses_keys;     /* V predictor input [V_prev; K_hat] (1) or V_prev (0) */
        int first_layer_bits;    /* bits of layer 0 (quantized directly) */
        int predictor_dtype;     /* KV_DTYPE_F16 (default) or KV_DTYPE_F32: how the plan stores predictors */
        int rank;                /* 0: full predictors; r >= 1: rank-r factors (plan format 1.3), capped at
                                    kv_dim (a rank that would not save bytes is still honoured) */
        int predictor_bits;      /* 0: the weights in predictor_dtype; 4: GPTQ 4-bit codes (plan format 1.4,
                                    aquakv.txt §4.1), f16 scales, offsets and bias; full-rank predictors only */
        int predictor_group;     /* GPTQ: input columns per scale and offset (divides kv_dim) */
    } aqua;
    struct {
        int d;                   /* grid dimension: 1, 2, 4 or 8 */
        int n;                   /* grid size; 0 = 2^(bits*d) for the stream's bits (log2(n)/d bits per value) */
        int group_size;          /* 0 = head_dim */
        int64_t grid_samples;
        int grid_iters;
    } higgs;
    struct {
        int enabled, r;          /* r, lambda: squat.choose fixed's setting (else candidates among others) */
        double lambda;
        int g;                   /* 0 = head_dim / 2 */
        int static_basis;        /* store the calibration basis in the plan */
        int subspace;            /* KV_FIT_SQ_PROMPT (the paper's) or KV_FIT_SQ_STATIC (needs static_basis) */
        int choose;              /* KV_FIT_SQ_CALIBRATED (measured over a grid) or KV_FIT_SQ_FIXED (r, lambda) */
    } squat;
    struct {
        int km, vm;              /* layers >= km (keys) / vm (values) share codes in pairs; -1 off */
        int kq, vq;              /* layers >= kq / vq use 1-bit codes; -1 off */
        double eta1;             /* data-free eta of the 1-bit layers (xquant.txt Table 4: 0.2) */
        double eta2;             /* data-free eta of the 2-bit layers (method xquant; Table 4: 0.05) */
        int calibrate_eta;       /* method xquant: search eta per layer and stream on the calibration data */
        double target_bits;      /* method xquant: > 0 = choose kq, vq, km, vm for bits per value <= this */
    } xquant;
    struct {
        kv_plan_prune method;
        double budget;
        int window, pool;
    } pruning;
    struct {                     /* methods fp8 / nvfp4 (kernels/FLOAT_KV.md, calib/fit_float.c) */
        int fp8_format;          /* 0 e4m3, 1 e5m2 */
        int scale_granularity;   /* 0 one scale per tensor (layer and stream), 1 one per KV head */
        int scale;               /* 0 calibrated (max or a percentile of |x|, whichever quantizes the
                                    calibration tokens with the least error), 1 fixed at 1.0 */
    } fp;
    struct {                     /* where kvcal fit keeps its working set (calib/FIT.md §5) */
        int weights;             /* model weights: 0 f32, 1 f16, 2 native (model/'s kv_weight_storage) */
        int stream_weights;      /* hold one layer's weights at a time */
        int hidden_dtype;        /* hidden states between layers: KV_DTYPE_F32 or KV_DTYPE_F16 */
        char *spill_dir;         /* "" = in memory; else the per-token state goes to files there */
    } memory;
    int n_layer_overrides;       /* sorted by layer */
    kv_fit_layer_override *layer_overrides;
    void *origins_;              /* where each key was set (for messages); internal */
} kv_fit_config;

/* Defaults (documented in configs/kvcal-example.yaml). Free with kv_fit_config_free. */
kv_status kv_fit_config_init(kv_fit_config *c);
void kv_fit_config_free(kv_fit_config *c);
/* A configuration file: a regular file or a pipe of at most KV_FIT_CONFIG_MAX_BYTES (a device such
 * as /dev/zero, or a larger file, is KV_EINVAL before anything is parsed). */
#define KV_FIT_CONFIG_MAX_BYTES (16u << 20)
kv_status kv_fit_config_load_file(kv_fit_config *c, const char *path);
/* source names the text in messages ("<string>" when NULL). */
kv_status kv_fit_config_load_string(kv_fit_config *c, const char *yaml, size_t len, const char *source);
/* Apply one "dotted.key=value" assignment (the value is parsed as a YAML scalar), e.g.
 * "keys.bits=3", "layers.5.rpc_ratio=0.2". Unknown keys and bad values are KV_EINVAL. */
kv_status kv_fit_config_set(kv_fit_config *c, const char *assignment);
/* The same with the origin messages will name instead of "command line" (e.g. "the kivi preset"). */
kv_status kv_fit_config_set_from(kv_fit_config *c, const char *assignment, const char *where);
/* Where key `path` got its value: "FILE:LINE:COL", "command line", a preset's name, or "default";
 * "layers.N" or "layers.N.field" names the layer override's origin. Borrowed from c. */
const char *kv_fit_config_origin(const kv_fit_config *c, const char *path);
/* Bits a stream may be given in a configuration (keys.bits, values.bits, layers.N.key_bits, ...;
 * kvprof's allocation options use the same range): the plan format's 1..8 for uniform codes and
 * the HIGGS bits-per-dimension. */
#define KV_FIT_MIN_BITS 1
#define KV_FIT_MAX_BITS 8
/* keys.bits / values.bits / key_bits / value_bits 16: the stream is not quantized but held in f16 (a plan
 * stream of method fp, bits 16; uniform methods only: kivi). With token pruning this is "1x tokens at 16
 * bits", the quantized-pruning paper's baseline; the uniform quantizer itself has no 16-bit mode. */
#define KV_FIT_F16_BITS 16
/* cache.windowed_layers: compress a windowed layer like any other (the default), or keep it in f16 (KV_FIT_F16_BITS on
 * both streams, unless layers.N sets its bits; methods that can keep a stream in f16 only: kivi, xquant, squat). */
typedef enum kv_fit_windowed { KV_FIT_WINDOWED_COMPRESS = 0, KV_FIT_WINDOWED_F16 = 1 } kv_fit_windowed;
kv_status kv_fit_config_validate(const kv_fit_config *c);
/* The resolved configuration as YAML (caller frees). */
kv_status kv_fit_config_dump(char **out, const kv_fit_config *c);
/* The layer's override, or NULL. */
const kv_fit_layer_override *kv_fit_config_layer(const kv_fit_config *c, int layer);
/* The method of stream (0 K, 1 V) of a layer: its layers.N.key_method / value_method, else `method`. */
int kv_fit_config_stream_method(const kv_fit_config *c, int layer, int stream);
/* Whether the layer's keys are stored before RoPE: layers.N.key_pre_rope, else cache.pre_rope. */
int kv_fit_config_key_pre_rope(const kv_fit_config *c, int layer);
/* The predictor rank of a stream: layers.N.key_rank / value_rank, else aqua.rank (0 = full). */
int kv_fit_config_pred_rank(const kv_fit_config *c, int layer, int stream);
/* The predictor code bits of a stream: layers.N.key_predictor_bits / value_predictor_bits, else
 * aqua.predictor_bits (0: the weights in aqua.predictor_dtype; 4: GPTQ codes). */
int kv_fit_config_pred_bits(const kv_fit_config *c, int layer, int stream);
/* 1 when layers.N.key_eta / value_eta gives the stream's eta (then *eta is it; eta may be NULL), else 0. */
int kv_fit_config_stream_eta(const kv_fit_config *c, int layer, int stream, double *eta);
/* A uniform stream's group layout: layers.N.key_group_axis / key_group_size (value_*), else keys.* / values.*. */
void kv_fit_config_stream_groups(const kv_fit_config *c, int layer, int stream, int *axis, int *size);
/* The method's name ("aqua", "kivi", ...) and traits; NULL outside [0, KV_FIT_METHOD_COUNT). */
const char *kv_fit_method_name(int method);
const kv_fit_method_traits *kv_fit_method_traits_of(int method);
/* 1 when method m has every flag of `flags` (KV_FIT_T_*), 0 otherwise (also for an unknown method). */
int kv_fit_method_has(int method, unsigned flags);
/* The method called `name`, or -1. */
int kv_fit_method_from_name(const char *name);

#ifdef __cplusplus
}
#endif
#endif /* KV_FORMATS_H */
