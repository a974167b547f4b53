/* vocab_internal.h — shared by the tokenizer-data loaders vocab*.c (not a public header).
 *
 * A kv_vocab_builder collects tokens (in any id order) and merges, then hands out one
 * kv_vocab_data whose strings live in two arenas owned by the struct (kv_vocab_free). */
#ifndef KV_VOCAB_INTERNAL_H
#define KV_VOCAB_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "kv_formats.h"

/* Hard limits on what a loader accepts (real vocabularies are ~250k tokens at most). */
#define KV_VOCAB_MAX_TOKENS (1 << 24)
#define KV_VOCAB_MAX_MERGES (1 << 24)
#define KV_VOCAB_MAX_TOKEN_BYTES (1u << 16)

typedef struct kv_vbuf {
    char *data;
    size_t len, cap;
} kv_vbuf;

typedef struct kv_vocab_builder {
    kv_vocab_data *v;
    kv_vbuf tok;
    size_t *tok_off; /* per id: offset into tok, or SIZE_MAX when unset */
    kv_vbuf mrg;
    size_t *mrg_off;
    int mrg_cap;
    const char *what; /* file name for messages */
} kv_vocab_builder;

/* Start a vocabulary of n_tokens tokens (all unset, type NORMAL, score 0). want_scores allocates
 * v->scores. kind and the special ids are set by the caller on b->v. */
kv_status kv_vb_init(kv_vocab_builder *b, int n_tokens, int want_scores, const char *what);
/* Set token `id` to the n bytes at s (copied). Empty or NUL-containing strings are KV_EFORMAT. */
kv_status kv_vb_set_token(kv_vocab_builder *b, int id, const char *s, size_t n);
/* Append a merge "left right" (n bytes, copied). */
kv_status kv_vb_add_merge(kv_vocab_builder *b, const char *s, size_t n);
/* Finish: unset ids become "[EMPTY_<id>]" of type UNUSED (as llama.cpp names empty tokens); the
 * builder is consumed. On failure everything is freed. */
kv_status kv_vb_finish(kv_vocab_builder *b, kv_vocab_data **out);
void kv_vb_abort(kv_vocab_builder *b);

/* Loaders (each sets its own errors). */
kv_status kv_vocab_from_gguf(kv_vocab_data **out, const kv_gguf *g, const char *what);
kv_status kv_vocab_from_llama2c(kv_vocab_data **out, const char *path, int expect_n_tokens);
kv_status kv_vocab_from_spm_model(kv_vocab_data **out, const char *path);
kv_status kv_vocab_from_hf_json(kv_vocab_data **out, const char *path);

/* Read a sentencepiece model's normalizer flags (add_dummy_prefix, remove_extra_whitespaces;
 * proto2 defaults are 1). KV_ENOTFOUND when the file does not exist. */
kv_status kv_spm_model_normalizer(const char *path, int *add_dummy_prefix, int *remove_extra_ws);

#endif
