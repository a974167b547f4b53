/* tokenizer_internal.h — shared by model/tokenizer*.c (not a public header). */
#ifndef KV_TOKENIZER_INTERNAL_H
#define KV_TOKENIZER_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "kv_model.h"

/* ---- code point classes (tokenizer_unicode_table.c is generated) ---------------------------- */
#define KV_UCP_LETTER 1u
#define KV_UCP_NUMBER 2u
#define KV_UCP_WHITESPACE 4u
#define KV_UCP_DEFINED 0x80u /* set for every valid code point (llama.cpp's flags are never all zero) */

typedef struct kv_ucp_range {
    uint32_t first, last;
    uint8_t flags;
} kv_ucp_range;

extern const kv_ucp_range kv_ucp_ranges[];
extern const size_t kv_ucp_n_ranges;
extern const char kv_ucp_unicode_version[];

/* Class flags of a code point by binary search (KV_UCP_DEFINED added; 0 above U+10FFFF). */
uint8_t kv_ucp_flags(uint32_t cp);

/* Decode one UTF-8 sequence at s[0..n) as llama.cpp's unicode_cpt_from_utf8 does (no overlong or
 * surrogate checks). Returns its length (>= 1) and the code point; an invalid sequence consumes one
 * byte and returns *valid = 0. */
size_t kv_utf8_decode(const uint8_t *s, size_t n, uint32_t *cp, int *valid);
/* Encode a code point (<= 0x10FFFF) as UTF-8 into out[4]; returns the length. */
size_t kv_utf8_encode(uint32_t cp, char *out);

/* ---- the tokenizer ------------------------------------------------------------------------- */
typedef enum kv_pretok {
    KV_PRETOK_NONE = 0,   /* SPM kinds */
    KV_PRETOK_GPT2,       /* 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+ */
    KV_PRETOK_DIGITS_GPT2,/* every \p{N} alone, then GPT-2 (SmolLM, StarCoder, ...) */
    KV_PRETOK_LLAMA3,     /* Llama 3: \p{N}{1,3}, case-insensitive contractions, newline rules */
    KV_PRETOK_QWEN2       /* Qwen2: as Llama 3 with single \p{N} */
} kv_pretok;

typedef struct kv_merge_slot {
    uint64_t key;   /* (left id << 32) | right id; UINT64_MAX = empty */
    int32_t rank;
    int32_t result; /* id of left+right */
} kv_merge_slot;

struct kv_tokenizer {
    kv_vocab_kind kind;
    kv_pretok pretok;
    char pre[32];
    char source[32];
    int n_tokens;
    char *text_arena;       /* every token text, NUL-terminated */
    uint32_t *text_off;
    uint32_t *text_len;
    char *piece_arena;      /* decoded pieces (bytes), NUL-terminated */
    size_t *piece_off;
    uint32_t *piece_len;
    float *score;           /* KV_VOCAB_SPM */
    int32_t *type;          /* kv_token_type */
    uint8_t *eog;           /* 1 for end-of-generation tokens */
    int bos, eos, unk, pad;
    int add_bos, add_space_prefix, remove_extra_ws, ignore_merges;
    /* token text -> id: open addressing, slots hold id + 1 (0 = empty) */
    uint32_t *tok_slots;
    size_t tok_mask;
    /* merges (BPE kinds) */
    kv_merge_slot *merge_slots;
    size_t merge_mask;
    int n_merges_used;
    /* byte b -> token: BPE its byte-level character, SPM kinds "<0xNN>"; -1 if none */
    int32_t byte_token[256];
    /* BPE: byte b as a character of the byte-level alphabet (UTF-8, 1 or 2 bytes) */
    char byte_utf8[256][2];
    uint8_t byte_utf8_len[256];
    /* SPM kinds: ASCII bytes that no mergeable multi-byte token contains. A symbol holding one can
     * never take part in a merge, so the merge loop runs on the stretches between such symbols
     * independently (same result, small heaps). */
    uint8_t isolating[128];
    /* special tokens split out of the text before tokenizing, longest first */
    int32_t *special_ids;
    int n_special;
    uint8_t *bmp_flags;     /* 65536 code point classes */
};

/* Token id of the n bytes at s, or -1. */
int32_t kv_tok_lookup(const kv_tokenizer *t, const char *s, size_t n);
/* Merge of (left, right): rank and result, or 0 when there is none. */
static inline const kv_merge_slot *kv_tok_merge(const kv_tokenizer *t, int32_t left, int32_t right) {
    if (!t->merge_slots || left < 0 || right < 0) return NULL;
    uint64_t key = ((uint64_t)(uint32_t)left << 32) | (uint32_t)right;
    size_t h = (size_t)((key * 0x9E3779B97F4A7C15ull) >> 32) & t->merge_mask;
    for (;;) {
        const kv_merge_slot *s = &t->merge_slots[h];
        if (s->key == key) return s;
        if (s->key == UINT64_MAX) return NULL;
        h = (h + 1) & t->merge_mask;
    }
}

static inline uint8_t kv_tok_cp_flags(const kv_tokenizer *t, uint32_t cp) {
    return cp < 0x10000 ? t->bmp_flags[cp] : kv_ucp_flags(cp);
}

/* A growable id vector. */
typedef struct kv_idvec {
    int32_t *ids;
    size_t n, cap;
} kv_idvec;
kv_status kv_idvec_push(kv_idvec *v, int32_t id);

/* Scratch reused across the fragments of one encode call. */
typedef struct kv_tok_scratch {
    size_t *cp_off;     /* byte offset of each code point, plus the end */
    uint8_t *cp_flags;
    uint32_t *cp;
    size_t cp_cap;
    size_t *word_end;   /* code point index where each word ends */
    size_t n_words, word_cap;
    void *sym;          /* merge symbols */
    size_t sym_cap;
    void *heap;
    size_t heap_cap;
    char *buf;          /* normalized text / mapped word */
    size_t buf_cap;
} kv_tok_scratch;
void kv_tok_scratch_free(kv_tok_scratch *s);

/* Split text[0..n) into words with the tokenizer's pre-tokenizer rule: fills s->cp_* and s->word_end. */
kv_status kv_tok_pretokenize(const kv_tokenizer *t, kv_tok_scratch *s, const char *text, size_t n, size_t *n_cp);
/* Byte-level BPE of one word (raw bytes), appending ids. */
kv_status kv_tok_bpe_word(const kv_tokenizer *t, kv_tok_scratch *s, const uint8_t *w, size_t n, kv_idvec *out);
/* SentencePiece-style merge of already normalized text (spaces are U+2581), appending ids. */
kv_status kv_tok_spm_text(const kv_tokenizer *t, kv_tok_scratch *s, const char *text, size_t n, kv_idvec *out);

#endif
