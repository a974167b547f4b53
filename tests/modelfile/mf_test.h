/* mf_test.h — helpers of the model-file tests: temporary folders, small random checkpoints in
 * each format (written by the tests themselves), raw file writes for corrupt variants. */
#ifndef MF_TEST_H
#define MF_TEST_H

#include "kv_formats.h"
#include "kv_test.h"

/* ---- files ------------------------------------------------------------------------------- */
/* A fresh temporary folder (path into out); removed with mf_rmtree. */
void mf_tmpdir(char *out, size_t n);
void mf_rmtree(const char *path);
void mf_write(const char *path, const void *data, size_t n);
void mf_write_str(const char *path, const char *text);
/* Read a whole file (malloc'd). */
uint8_t *mf_read(const char *path, size_t *n);

/* ---- a small random Llama-family model ------------------------------------------------------ */
typedef struct mf_spec {
    const char *model_type; /* "llama", "mistral", "qwen2" */
    int n_layers, d_model, n_heads, n_kv_heads, head_dim, d_ff, vocab;
    int tied;
    int qkv_bias;
    int dtype;      /* KV_DTYPE_F32 / F16 / BF16 for weight matrices */
    int norm_dtype; /* for norms and biases */
    int n_shards;   /* 0: one model.safetensors; >= 1: model-0000i-of-0000n.safetensors + index */
    int llama3_rope; /* rope_scaling llama3 in config.json */
    int omit_lm_head; /* tied checkpoints may leave lm_head.weight out */
    uint64_t seed;
} mf_spec;

/* One tensor as an HF checkpoint stores it, with its exact values after rounding to dtype. */
typedef struct mf_tensor {
    char hf[96];
    char canon[64];
    int dtype;
    int rank;
    uint64_t shape[2]; /* row-major (PyTorch) order */
    size_t n;
    float *values;
    uint8_t *bytes;     /* the values encoded in dtype */
    size_t nbytes;
} mf_tensor;

typedef struct mf_model {
    mf_tensor *t;
    size_t n;
} mf_model;

void mf_model_generate(mf_model *m, const mf_spec *spec);
void mf_model_free(mf_model *m);
mf_tensor *mf_model_find(mf_model *m, const char *hf);

/* config.json text for spec (static buffer; extra is inserted verbatim before the closing brace,
 * e.g. ", \"foo\": 1", or NULL). */
const char *mf_config_json(const mf_spec *spec, const char *extra);
/* Write tensors t[0..n) as one safetensors file (header padded to 8 bytes). */
void mf_write_safetensors(const char *path, mf_tensor *const *t, size_t n);
/* Write a whole HF directory for spec: config.json, weights (single or sharded + index). */
void mf_write_hf_dir(const char *dir, const mf_spec *spec, mf_model *m);
/* A raw safetensors file: 8-byte header length (hlen_override when nonzero), header, data. */
void mf_write_raw_safetensors(const char *path, const char *header, const void *data, size_t ndata,
                              uint64_t hlen_override);

/* ---- llama2.c ---------------------------------------------------------------------------------- */
/* A llama2.c v0 image: header, then float i at float index i of the weights (values = index, so
 * tests can check where each tensor starts). vocab < 0: separate classifier. */
uint8_t *mf_llama2c_image(size_t *size, int dim, int hidden, int n_layers, int n_heads, int n_kv_heads,
                          int vocab, int seq_len);

/* ---- GGUF -------------------------------------------------------------------------------------- */
typedef struct mf_gguf_opts {
    const char *arch;          /* general.architecture (default "llama") */
    const char *omit_key;      /* leave this key out */
    const char *omit_tensor;   /* leave this tensor out */
    int block_count_as_string; /* store <arch>.block_count as a string */
    int qkv_bias;
    int tied;
    int q8_1_tensor;           /* store blk.0.ffn_norm.weight as Q8_1 (not dequantizable) */
} mf_gguf_opts;
/* A tiny GGUF model (d 64, 2 layers, 4 heads / 2 KV heads, d_ff 96, vocab 40): norms F32,
 * attention F16, FFN Q8_0 (scale 2^-6), embeddings F32. expected (may be NULL) receives a model
 * with the exact values under canonical names in mf_tensor.canon. Returns the serialized file. */
uint8_t *mf_gguf_tiny(size_t *size, const mf_gguf_opts *o, mf_model *expected);

/* ---- assertions ---------------------------------------------------------------------------------- */
/* Read every tensor of m through mf and compare exactly (names by canon, shapes reversed). */
void mf_check_values(const kv_model_file *mf, mf_model *m);

/* Suites' test cases, one per source file. */
TCase *mf_tcase_llama2c(void);
TCase *mf_tcase_safetensors(void);
TCase *mf_tcase_gguf(void);
TCase *mf_tcase_corrupt(void);
TCase *mf_tcase_mutate(void);

#endif
