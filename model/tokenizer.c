/* Tokenizer core (kv_model.h "tokenizer" section): construction from kv_vocab_data, lookups,
 * special-token partitioning, the encode driver, pieces and decoding.
 *
 * Behaviour follows llama.cpp's llama-vocab.cpp (tokenize, tokenizer_st_partition, token_to_piece)
 * for GGUF vocabularies and sentencepiece for SentencePiece models; differences are noted where
 * they are made. */
#define _POSIX_C_SOURCE 200809L
#include "tokenizer_internal.h"

#include <stdlib.h>
#include <string.h>

#define SPM_SPACE "\xE2\x96\x81"

/* ---- small utilities ----------------------------------------------------------------------- */

kv_status kv_idvec_push(kv_idvec *v, int32_t id) {
    if (v->n == v->cap) {
        size_t cap = v->cap ? v->cap * 2 : 256;
        int32_t *p = realloc(v->ids, cap * sizeof *p);
        if (!p) return KV_ERR(KV_ENOMEM, "out of memory for token ids");
        v->ids = p;
        v->cap = cap;
    }
    v->ids[v->n++] = id;
    return KV_OK;
}

void kv_tok_scratch_free(kv_tok_scratch *s) {
    free(s->cp_off);
    free(s->cp_flags);
    free(s->cp);
    free(s->word_end);
    free(s->sym);
    free(s->heap);
    free(s->buf);
    memset(s, 0, sizeof *s);
}

uint8_t kv_ucp_flags(uint32_t cp) {
    if (cp > 0x10FFFF) return 0;
    size_t lo = 0, hi = kv_ucp_n_ranges;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (kv_ucp_ranges[mid].last < cp) lo = mid + 1;
        else hi = mid;
    }
    uint8_t f = KV_UCP_DEFINED;
    if (lo < kv_ucp_n_ranges && kv_ucp_ranges[lo].first <= cp) f |= kv_ucp_ranges[lo].flags;
    return f;
}

size_t kv_utf8_decode(const uint8_t *s, size_t n, uint32_t *cp, int *valid) {
    uint8_t c = s[0];
    *valid = 1;
    if (!(c & 0x80)) {
        *cp = c;
        return 1;
    }
    size_t len = !(c & 0x40) ? 0 : !(c & 0x20) ? 2 : !(c & 0x10) ? 3 : !(c & 0x08) ? 4 : 0;
    if (len == 0 || len > n) goto invalid;
    for (size_t i = 1; i < len; i++)
        if ((s[i] & 0xC0) != 0x80) goto invalid;
    switch (len) {
    case 2: *cp = ((uint32_t)(c & 0x1F) << 6) | (s[1] & 0x3F); break;
    case 3: *cp = ((uint32_t)(c & 0x0F) << 12) | ((uint32_t)(s[1] & 0x3F) << 6) | (s[2] & 0x3F); break;
    default:
        *cp = ((uint32_t)(c & 0x07) << 18) | ((uint32_t)(s[1] & 0x3F) << 12) | ((uint32_t)(s[2] & 0x3F) << 6) |
              (s[3] & 0x3F);
        break;
    }
    return len;
invalid:
    *valid = 0;
    *cp = 0xFFFD;
    return 1;
}

size_t kv_utf8_encode(uint32_t cp, char *o) {
    if (cp < 0x80) {
        o[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (char)(0xC0 | (cp >> 6));
        o[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (char)(0xE0 | (cp >> 12));
        o[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        o[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (char)(0xF0 | (cp >> 18));
    o[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    o[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    o[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

/* GPT-2's bytes_to_unicode: printable bytes map to themselves, the other 68 to U+0100 onwards. */
static uint32_t byte_to_cp(int b) {
    if ((b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF)) return (uint32_t)b;
    int n = 0;
    for (int c = 0; c < b; c++)
        if (!((c >= 0x21 && c <= 0x7E) || (c >= 0xA1 && c <= 0xAC) || (c >= 0xAE && c <= 0xFF))) n++;
    return 256u + (uint32_t)n;
}

static uint64_t hash_bytes(const char *s, size_t n) {
    uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a */
    for (size_t i = 0; i < n; i++) {
        h ^= (uint8_t)s[i];
        h *= 0x100000001b3ull;
    }
    return h ^ (h >> 29);
}

int32_t kv_tok_lookup(const kv_tokenizer *t, const char *s, size_t n) {
    size_t h = (size_t)hash_bytes(s, n) & t->tok_mask;
    for (;;) {
        uint32_t v = t->tok_slots[h];
        if (v == 0) return -1;
        int32_t id = (int32_t)(v - 1);
        if (t->text_len[id] == n && memcmp(t->text_arena + t->text_off[id], s, n) == 0) return id;
        h = (h + 1) & t->tok_mask;
    }
}

static const char *tok_text(const kv_tokenizer *t, int32_t id) { return t->text_arena + t->text_off[id]; }

/* ---- construction -------------------------------------------------------------------------- */

static kv_pretok pretok_from_name(const char *pre, int *ignore_merges) {
    static const char *const gpt2[] = {"gpt-2", "phi-2", "jina-es", "jina-de", "gigachat", "jina-v1-en",
                                       "jina-v2-es", "jina-v2-de", "jina-v2-code", "roberta-bpe", "mpt",
                                       "olmo", "jais", "trillion", NULL};
    static const char *const digits_gpt2[] = {"smollm", "starcoder", "refact", "command-r", "codeshell",
                                              "exaone", "minerva-7b", NULL};
    static const char *const llama3[] = {"llama3", "llama-v3", "llama-bpe", "falcon3", "dbrx", "smaug-bpe", NULL};
    static const char *const qwen2[] = {"qwen2", "stablelm2", "megrez", NULL};
    *ignore_merges = 0;
    for (int i = 0; gpt2[i]; i++)
        if (!strcmp(pre, gpt2[i])) return KV_PRETOK_GPT2;
    for (int i = 0; digits_gpt2[i]; i++)
        if (!strcmp(pre, digits_gpt2[i])) return KV_PRETOK_DIGITS_GPT2;
    for (int i = 0; llama3[i]; i++)
        if (!strcmp(pre, llama3[i])) {
            /* llama.cpp: ignore_merges for LLAMA3 (dbrx and smaug share its regex, not the flag) */
            *ignore_merges = i < 4;
            return KV_PRETOK_LLAMA3;
        }
    for (int i = 0; qwen2[i]; i++)
        if (!strcmp(pre, qwen2[i])) return KV_PRETOK_QWEN2;
    return KV_PRETOK_NONE;
}

static size_t pow2_at_least(size_t n) {
    size_t c = 16;
    while (c < n) c *= 2;
    return c;
}

/* Decoded bytes of token id into out (at most 4 * text_len bytes); returns the length. */
static size_t make_piece(const kv_tokenizer *t, int32_t id, const int32_t *cp_to_byte, char *out) {
    const char *s = tok_text(t, id);
    size_t n = t->text_len[id];
    int type = t->type[id];
    if (type == KV_TOKEN_CONTROL || type == KV_TOKEN_UNKNOWN) return 0; /* rendered only with KV_DETOK_SPECIAL */
    if (type == KV_TOKEN_USER_DEFINED) {
        memcpy(out, s, n);
        return n;
    }
    if (t->kind == KV_VOCAB_BPE) {
        /* llama.cpp renders only NORMAL tokens of BPE vocabularies (and the types above) */
        if (type != KV_TOKEN_NORMAL) return 0;
        size_t o = 0;
        for (size_t i = 0; i < n;) {
            uint32_t cp;
            int valid;
            size_t l = kv_utf8_decode((const uint8_t *)s + i, n - i, &cp, &valid);
            if (valid && cp < 324 && cp_to_byte[cp] >= 0) {
                out[o++] = (char)cp_to_byte[cp];
            } else {
                memcpy(out + o, s + i, l); /* not in the byte alphabet: kept as written */
                o += l;
            }
            i += l;
        }
        return o;
    }
    if (type == KV_TOKEN_BYTE) {
        if (n == 6 && !memcmp(s, "<0x", 3)) {
            char hex[3] = {s[3], s[4], 0};
            out[0] = (char)strtol(hex, NULL, 16);
            return 1;
        }
        return 0;
    }
    /* SPM NORMAL (and UNUSED / undefined types): U+2581 -> ' ' */
    size_t o = 0;
    for (size_t i = 0; i < n;) {
        if (i + 3 <= n && !memcmp(s + i, SPM_SPACE, 3)) {
            out[o++] = ' ';
            i += 3;
        } else {
            out[o++] = s[i++];
        }
    }
    return o;
}

static int is_eog_text(const char *s) {
    static const char *const eog[] = {"<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>",
                                      "<|eom_id|>", "<EOT>", NULL};
    for (int i = 0; eog[i]; i++)
        if (!strcmp(s, eog[i])) return 1;
    return 0;
}

/* Order special tokens longest first (ties by id), as llama.cpp's cache_special_tokens. */
static int special_before(const kv_tokenizer *t, int32_t x, int32_t y) {
    uint32_t lx = t->text_len[x], ly = t->text_len[y];
    return lx != ly ? lx > ly : x < y;
}

static void sort_specials(const kv_tokenizer *t, int32_t *a, int32_t *tmp, size_t n) {
    if (n < 2) return;
    size_t h = n / 2;
    sort_specials(t, a, tmp, h);
    sort_specials(t, a + h, tmp, n - h);
    size_t i = 0, j = h, k = 0;
    while (i < h && j < n) tmp[k++] = special_before(t, a[j], a[i]) ? a[j++] : a[i++];
    while (i < h) tmp[k++] = a[i++];
    while (j < n) tmp[k++] = a[j++];
    memcpy(a, tmp, n * sizeof *a);
}

kv_status kv_tokenizer_create(kv_tokenizer **out, const kv_vocab_data *v) {
    *out = NULL;
    kv_status st = KV_OK;
    char *tmp = NULL;
    if (!v || v->n_tokens <= 0 || !v->tokens || !v->token_len)
        return KV_ERR(KV_EINVAL, "kv_tokenizer_create: empty vocabulary");
    if (v->kind != KV_VOCAB_SPM && v->kind != KV_VOCAB_BPE && v->kind != KV_VOCAB_SPM_MERGES)
        return KV_ERR(KV_EINVAL, "kv_tokenizer_create: unknown vocabulary kind %d", (int)v->kind);
    kv_tokenizer *t = calloc(1, sizeof *t);
    if (!t) return KV_ERR(KV_ENOMEM, "out of memory for a tokenizer");
    const int n = v->n_tokens;
    t->kind = v->kind;
    t->n_tokens = n;
    snprintf(t->source, sizeof t->source, "%s", v->source);
    if (t->kind == KV_VOCAB_BPE) {
        snprintf(t->pre, sizeof t->pre, "%s", v->pre[0] ? v->pre : "default");
        t->pretok = pretok_from_name(t->pre, &t->ignore_merges);
        if (t->pretok == KV_PRETOK_NONE) {
            if (!strcmp(t->pre, "default")) {
                /* llama.cpp's "default" chains four regexes; GPT-2's is its core. Not exact. */
                kv_log(KV_LOG_WARN, "tokenizer: no pre-tokenizer named; using GPT-2's splitting rule");
                t->pretok = KV_PRETOK_GPT2;
            } else {
                free(t);
                return KV_ERR(KV_EUNSUPPORTED,
                              "tokenizer: pre-tokenizer '%s' is not implemented (known: gpt-2 family, smollm/starcoder "
                              "family, llama-bpe/llama3, qwen2)", v->pre);
            }
        }
    }
    t->bos = v->bos_id >= 0 && v->bos_id < n ? v->bos_id : -1;
    t->eos = v->eos_id >= 0 && v->eos_id < n ? v->eos_id : -1;
    t->unk = v->unk_id >= 0 && v->unk_id < n ? v->unk_id : -1;
    t->pad = v->pad_id >= 0 && v->pad_id < n ? v->pad_id : -1;
    t->add_bos = v->add_bos != 0;
    t->add_space_prefix = t->kind != KV_VOCAB_BPE && v->add_space_prefix;
    t->remove_extra_ws = t->kind != KV_VOCAB_BPE && v->remove_extra_ws;

    /* token texts */
    size_t total = 0;
    for (int i = 0; i < n; i++) {
        if (!v->tokens[i]) {
            st = KV_ERR(KV_EINVAL, "tokenizer: token %d has no text", i);
            goto fail;
        }
        total += (size_t)v->token_len[i] + 1;
    }
    if (total > UINT32_MAX) {
        st = KV_ERR(KV_EUNSUPPORTED, "tokenizer: vocabulary text exceeds 4 GiB");
        goto fail;
    }
    t->text_arena = malloc(total ? total : 1);
    t->text_off = malloc((size_t)n * sizeof *t->text_off);
    t->text_len = malloc((size_t)n * sizeof *t->text_len);
    t->type = malloc((size_t)n * sizeof *t->type);
    t->eog = calloc((size_t)n, 1);
    t->piece_off = malloc(((size_t)n + 1) * sizeof *t->piece_off);
    t->piece_len = malloc((size_t)n * sizeof *t->piece_len);
    if (v->kind == KV_VOCAB_SPM) t->score = malloc((size_t)n * sizeof *t->score);
    t->bmp_flags = malloc(0x10000);
    if (!t->text_arena || !t->text_off || !t->text_len || !t->type || !t->eog || !t->piece_off || !t->piece_len ||
        (v->kind == KV_VOCAB_SPM && !t->score) || !t->bmp_flags) {
        st = KV_ERR(KV_ENOMEM, "out of memory for a tokenizer of %d tokens", n);
        goto fail;
    }
    size_t off = 0;
    for (int i = 0; i < n; i++) {
        t->text_off[i] = (uint32_t)off;
        t->text_len[i] = v->token_len[i];
        memcpy(t->text_arena + off, v->tokens[i], v->token_len[i]);
        t->text_arena[off + v->token_len[i]] = '\0';
        off += (size_t)v->token_len[i] + 1;
        t->type[i] = v->token_type ? v->token_type[i] : KV_TOKEN_NORMAL;
        if (t->score) t->score[i] = v->scores ? v->scores[i] : 0.0f;
    }
    /* code point classes of the BMP */
    memset(t->bmp_flags, KV_UCP_DEFINED, 0x10000);
    for (size_t r = 0; r < kv_ucp_n_ranges && kv_ucp_ranges[r].first < 0x10000; r++) {
        uint32_t last = kv_ucp_ranges[r].last < 0xFFFF ? kv_ucp_ranges[r].last : 0xFFFF;
        for (uint32_t c = kv_ucp_ranges[r].first; c <= last; c++) t->bmp_flags[c] |= kv_ucp_ranges[r].flags;
    }

    /* text -> id (the first id wins for duplicates; llama.cpp keeps the last: duplicates do not occur
     * in real vocabularies) */
    size_t cap = pow2_at_least((size_t)n * 2);
    t->tok_slots = calloc(cap, sizeof *t->tok_slots);
    if (!t->tok_slots) {
        st = KV_ERR(KV_ENOMEM, "out of memory for the token table");
        goto fail;
    }
    t->tok_mask = cap - 1;
    for (int i = 0; i < n; i++) {
        if (kv_tok_lookup(t, tok_text(t, i), t->text_len[i]) >= 0) continue;
        size_t h = (size_t)hash_bytes(tok_text(t, i), t->text_len[i]) & t->tok_mask;
        while (t->tok_slots[h]) h = (h + 1) & t->tok_mask;
        t->tok_slots[h] = (uint32_t)i + 1;
    }

    /* byte tokens */
    int32_t cp_to_byte[324];
    for (int c = 0; c < 324; c++) cp_to_byte[c] = -1;
    for (int b = 0; b < 256; b++) {
        char buf[8];
        if (t->kind == KV_VOCAB_BPE) {
            uint32_t cp = byte_to_cp(b);
            cp_to_byte[cp] = b;
            size_t l = kv_utf8_encode(cp, buf);
            t->byte_token[b] = kv_tok_lookup(t, buf, l);
            memcpy(t->byte_utf8[b], buf, l);
            t->byte_utf8_len[b] = (uint8_t)l;
        } else {
            snprintf(buf, sizeof buf, "<0x%02X>", b);
            t->byte_token[b] = kv_tok_lookup(t, buf, 6);
        }
    }

    /* merges */
    if (v->kind != KV_VOCAB_SPM && v->n_merges > 0) {
        size_t mcap = pow2_at_least((size_t)v->n_merges * 2);
        t->merge_slots = malloc(mcap * sizeof *t->merge_slots);
        if (!t->merge_slots) {
            st = KV_ERR(KV_ENOMEM, "out of memory for the merge table");
            goto fail;
        }
        for (size_t i = 0; i < mcap; i++) t->merge_slots[i].key = UINT64_MAX;
        t->merge_mask = mcap - 1;
        size_t tmp_cap = 0;
        int skipped = 0;
        for (int r = 0; r < v->n_merges; r++) {
            const char *m = v->merges[r];
            size_t ml = strlen(m);
            /* split at the first space after the first byte, as llama.cpp does */
            const char *sp = ml > 1 ? memchr(m + 1, ' ', ml - 1) : NULL;
            if (!sp) {
                skipped++;
                continue;
            }
            size_t la = (size_t)(sp - m), lb = ml - la - 1;
            int32_t a = kv_tok_lookup(t, m, la), b = kv_tok_lookup(t, sp + 1, lb);
            if (la + lb > tmp_cap) {
                tmp_cap = (la + lb) * 2;
                char *nt = realloc(tmp, tmp_cap);
                if (!nt) {
                    st = KV_ERR(KV_ENOMEM, "out of memory");
                    goto fail;
                }
                tmp = nt;
            }
            memcpy(tmp, m, la);
            memcpy(tmp + la, sp + 1, lb);
            int32_t c = kv_tok_lookup(t, tmp, la + lb);
            if (a < 0 || b < 0 || c < 0) {
                /* a merge whose parts or result are not tokens cannot change the output of a
                 * well-formed vocabulary; llama.cpp would still apply it and fall back to bytes */
                skipped++;
                continue;
            }
            uint64_t key = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
            size_t h = (size_t)((key * 0x9E3779B97F4A7C15ull) >> 32) & t->merge_mask;
            while (t->merge_slots[h].key != UINT64_MAX && t->merge_slots[h].key != key) h = (h + 1) & t->merge_mask;
            if (t->merge_slots[h].key == key) continue; /* the first (best) rank wins, as in llama.cpp */
            t->merge_slots[h].key = key;
            t->merge_slots[h].rank = r;
            t->merge_slots[h].result = c;
            t->n_merges_used++;
        }
        if (skipped) kv_log(KV_LOG_DEBUG, "tokenizer: %d of %d merges skipped (parts not in the vocabulary)", skipped,
                            v->n_merges);
    } else if (v->kind != KV_VOCAB_SPM) {
        st = KV_ERR(KV_EINVAL, "tokenizer: a BPE vocabulary without merges");
        goto fail;
    }

    /* isolating bytes (SPM kinds) */
    if (t->kind != KV_VOCAB_BPE) {
        memset(t->isolating, 1, sizeof t->isolating);
        for (int i = 0; i < n; i++) {
            int ty = t->type[i];
            if (t->text_len[i] < 2 || ty == KV_TOKEN_BYTE || (t->kind == KV_VOCAB_SPM && (ty == KV_TOKEN_CONTROL ||
                                                                                            ty == KV_TOKEN_UNKNOWN)))
                continue;
            const uint8_t *s = (const uint8_t *)tok_text(t, i);
            for (uint32_t k = 0; k < t->text_len[i]; k++)
                if (s[k] < 128) t->isolating[s[k]] = 0;
        }
    }

    /* pieces */
    size_t ptotal = 0;
    for (int i = 0; i < n; i++) ptotal += (size_t)t->text_len[i] + 1;
    t->piece_arena = malloc(ptotal ? ptotal : 1);
    if (!t->piece_arena) {
        st = KV_ERR(KV_ENOMEM, "out of memory for token pieces");
        goto fail;
    }
    off = 0;
    for (int i = 0; i < n; i++) {
        /* a piece is never longer than its text: bytes map to <= 2-byte characters and back to 1 */
        size_t l = make_piece(t, i, cp_to_byte, t->piece_arena + off);
        t->piece_off[i] = off;
        t->piece_len[i] = (uint32_t)l;
        t->piece_arena[off + l] = '\0';
        off += l + 1;
        t->eog[i] = is_eog_text(tok_text(t, i));
    }
    t->piece_off[n] = off;
    if (t->eos >= 0) t->eog[t->eos] = 1;

    /* special tokens for partitioning */
    int ns = 0;
    for (int i = 0; i < n; i++)
        if (t->type[i] == KV_TOKEN_CONTROL || t->type[i] == KV_TOKEN_USER_DEFINED || t->type[i] == KV_TOKEN_UNKNOWN) ns++;
    if (ns) {
        t->special_ids = malloc((size_t)ns * sizeof *t->special_ids);
        if (!t->special_ids) {
            st = KV_ERR(KV_ENOMEM, "out of memory");
            goto fail;
        }
        for (int i = 0; i < n; i++)
            if (t->type[i] == KV_TOKEN_CONTROL || t->type[i] == KV_TOKEN_USER_DEFINED || t->type[i] == KV_TOKEN_UNKNOWN)
                t->special_ids[t->n_special++] = i;
        int32_t *stmp = malloc((size_t)ns * sizeof *stmp);
        if (!stmp) {
            st = KV_ERR(KV_ENOMEM, "out of memory");
            goto fail;
        }
        sort_specials(t, t->special_ids, stmp, (size_t)t->n_special);
        free(stmp);
    }
    free(tmp);
    *out = t;
    return KV_OK;
fail:
    free(tmp);
    kv_tokenizer_free(t);
    return st;
}

kv_status kv_tokenizer_load(kv_tokenizer **out, const kv_model_file *mf, const char *tokenizer_path) {
    *out = NULL;
    kv_vocab_data *v = NULL;
    kv_status st = kv_vocab_load(&v, mf, tokenizer_path);
    if (st != KV_OK) return st;
    st = kv_tokenizer_create(out, v);
    kv_vocab_free(v);
    return st;
}

void kv_tokenizer_free(kv_tokenizer *t) {
    if (!t) return;
    free(t->text_arena);
    free(t->text_off);
    free(t->text_len);
    free(t->piece_arena);
    free(t->piece_off);
    free(t->piece_len);
    free(t->score);
    free(t->type);
    free(t->eog);
    free(t->tok_slots);
    free(t->merge_slots);
    free(t->special_ids);
    free(t->bmp_flags);
    free(t);
}

/* ---- encoding ------------------------------------------------------------------------------ */

/* A fragment of the input: raw text [off, off+len) or a special token. */
typedef struct frag {
    size_t off, len;
    int32_t id; /* -1 for text */
} frag;

typedef struct fragvec {
    frag *f;
    size_t n, cap;
} fragvec;

static kv_status frag_push(fragvec *v, size_t off, size_t len, int32_t id) {
    if (v->n == v->cap) {
        size_t cap = v->cap ? v->cap * 2 : 16;
        frag *p = realloc(v->f, cap * sizeof *p);
        if (!p) return KV_ERR(KV_ENOMEM, "out of memory");
        v->f = p;
        v->cap = cap;
    }
    v->f[v->n].off = off;
    v->f[v->n].len = len;
    v->f[v->n].id = id;
    v->n++;
    return KV_OK;
}

static const char *find_bytes(const char *hay, size_t hn, const char *needle, size_t nn) {
    if (nn == 0 || nn > hn) return NULL;
    const char *end = hay + hn - nn + 1;
    for (const char *p = hay; p < end;) {
        p = memchr(p, needle[0], (size_t)(end - p));
        if (!p) return NULL;
        if (!memcmp(p, needle, nn)) return p;
        p++;
    }
    return NULL;
}

/* llama.cpp's tokenizer_st_partition: for each special token, longest first, split every text
 * fragment at its occurrences. */
static kv_status partition(const kv_tokenizer *t, const char *text, size_t len, unsigned flags, fragvec *out) {
    if (len == 0) return KV_OK; /* no fragment at all: "" gives no tokens, not even a dummy prefix */
    kv_status st = frag_push(out, 0, len, -1);
    if (st != KV_OK) return st;
    fragvec next = {0};
    for (int k = 0; k < t->n_special; k++) {
        int32_t id = t->special_ids[k];
        if (!(flags & KV_TOK_PARSE_SPECIAL) && t->type[id] != KV_TOKEN_USER_DEFINED) continue;
        const char *s = tok_text(t, id);
        size_t sl = t->text_len[id];
        int any = 0;
        for (size_t i = 0; i < out->n && !any; i++)
            if (out->f[i].id < 0 && find_bytes(text + out->f[i].off, out->f[i].len, s, sl)) any = 1;
        if (!any) continue;
        next.n = 0;
        for (size_t i = 0; i < out->n; i++) {
            frag f = out->f[i];
            if (f.id >= 0) {
                if ((st = frag_push(&next, f.off, f.len, f.id)) != KV_OK) goto done;
                continue;
            }
            size_t pos = f.off, end = f.off + f.len;
            for (;;) {
                const char *m = find_bytes(text + pos, end - pos, s, sl);
                if (!m) break;
                size_t mo = (size_t)(m - text);
                if (mo > pos && (st = frag_push(&next, pos, mo - pos, -1)) != KV_OK) goto done;
                if ((st = frag_push(&next, mo, sl, id)) != KV_OK) goto done;
                pos = mo + sl;
            }
            if (pos < end && (st = frag_push(&next, pos, end - pos, -1)) != KV_OK) goto done;
        }
        fragvec tmp = *out;
        *out = next;
        next = tmp;
    }
done:
    free(next.f);
    return st;
}

static kv_status ensure_buf(kv_tok_scratch *s, size_t n) {
    if (s->buf_cap >= n) return KV_OK;
    size_t cap = s->buf_cap ? s->buf_cap : 256;
    while (cap < n) cap *= 2;
    char *p = realloc(s->buf, cap);
    if (!p) return KV_ERR(KV_ENOMEM, "out of memory");
    s->buf = p;
    s->buf_cap = cap;
    return KV_OK;
}

/* SentencePiece normalization of one text fragment into s->buf: optional remove_extra_whitespaces,
 * dummy prefix, ' ' -> U+2581. Returns the length (0: nothing to tokenize). */
static kv_status spm_normalize(const kv_tokenizer *t, kv_tok_scratch *s, const char *text, size_t n, int prefix,
                               size_t *out_len) {
    *out_len = 0;
    size_t a = 0, b = n;
    if (t->remove_extra_ws) {
        while (a < b && text[a] == ' ') a++;
        while (b > a && text[b - 1] == ' ') b--;
        if (a == b) return KV_OK; /* sentencepiece: whitespace-only input gives no tokens */
    }
    if (ensure_buf(s, 3 * (b - a + 1)) != KV_OK) return KV_ENOMEM;
    char *o = s->buf;
    size_t k = 0;
    if (prefix) {
        memcpy(o, SPM_SPACE, 3);
        k = 3;
    }
    for (size_t i = a; i < b; i++) {
        if (text[i] == ' ') {
            if (t->remove_extra_ws && i > a && text[i - 1] == ' ') continue;
            memcpy(o + k, SPM_SPACE, 3);
            k += 3;
        } else {
            o[k++] = text[i];
        }
    }
    *out_len = k;
    return KV_OK;
}

kv_status kv_tokenizer_encode(int32_t **ids, size_t *n, const kv_tokenizer *t, const char *text, size_t len,
                              unsigned flags) {
    *ids = NULL;
    *n = 0;
    if (!t || (!text && len)) return KV_ERR(KV_EINVAL, "kv_tokenizer_encode: NULL argument");
    kv_idvec out = {0};
    fragvec fr = {0};
    kv_tok_scratch sc;
    memset(&sc, 0, sizeof sc);
    kv_status st = KV_OK;
    if (flags & KV_TOK_ADD_BOS) {
        if (t->bos < 0) {
            st = KV_ERR(KV_EINVAL, "kv_tokenizer_encode: BOS requested but the vocabulary has none");
            goto done;
        }
        if ((st = kv_idvec_push(&out, t->bos)) != KV_OK) goto done;
    }
    if ((st = partition(t, text, len, flags, &fr)) != KV_OK) goto done;
    int prev_special = 1; /* llama.cpp: the dummy prefix goes before the first text and after specials */
    for (size_t i = 0; i < fr.n; i++) {
        const frag *f = &fr.f[i];
        if (f->id >= 0) {
            if ((st = kv_idvec_push(&out, f->id)) != KV_OK) goto done;
            prev_special = 1;
            continue;
        }
        const char *s = text + f->off;
        if (t->kind == KV_VOCAB_BPE) {
            size_t ncp;
            if ((st = kv_tok_pretokenize(t, &sc, s, f->len, &ncp)) != KV_OK) goto done;
            size_t start = 0;
            for (size_t w = 0; w < sc.n_words; w++) {
                size_t end = sc.word_end[w];
                size_t bo = sc.cp_off[start], be = sc.cp_off[end];
                if ((st = kv_tok_bpe_word(t, &sc, (const uint8_t *)s + bo, be - bo, &out)) != KV_OK) goto done;
                start = end;
            }
        } else {
            int prefix = t->add_space_prefix && prev_special && !(flags & KV_TOK_NO_SPACE_PREFIX);
            size_t nl;
            if ((st = spm_normalize(t, &sc, s, f->len, prefix, &nl)) != KV_OK) goto done;
            if (nl > 0) {
                /* the merge works on a copy: s->buf is reused by the merge's scratch */
                char *copy = malloc(nl);
                if (!copy) {
                    st = KV_ERR(KV_ENOMEM, "out of memory");
                    goto done;
                }
                memcpy(copy, sc.buf, nl);
                st = kv_tok_spm_text(t, &sc, copy, nl, &out);
                free(copy);
                if (st != KV_OK) goto done;
            }
        }
        prev_special = 0;
    }
    if (!out.ids) {
        out.ids = malloc(sizeof *out.ids);
        if (!out.ids) {
            st = KV_ERR(KV_ENOMEM, "out of memory");
            goto done;
        }
    }
done:
    free(fr.f);
    kv_tok_scratch_free(&sc);
    if (st != KV_OK) {
        free(out.ids);
        return st;
    }
    *ids = out.ids;
    *n = out.n;
    return KV_OK;
}

/* ---- decoding and getters ------------------------------------------------------------------ */

const char *kv_tokenizer_piece(const kv_tokenizer *t, int32_t id, size_t *len) {
    if (!t || id < 0 || id >= t->n_tokens) {
        if (len) *len = 0;
        return NULL;
    }
    if (len) *len = t->piece_len[id];
    return t->piece_arena + t->piece_off[id];
}

const char *kv_tokenizer_piece_after(const kv_tokenizer *t, int32_t prev, int32_t id, size_t *len) {
    size_t l;
    const char *p = kv_tokenizer_piece(t, id, &l);
    if (p && t->add_space_prefix && (prev < 0 || prev == t->bos) && l > 0 && p[0] == ' ') {
        p++;
        l--;
    }
    if (len) *len = l;
    return p;
}

const char *kv_tokenizer_token_text(const kv_tokenizer *t, int32_t id, size_t *len) {
    if (!t || id < 0 || id >= t->n_tokens) {
        if (len) *len = 0;
        return NULL;
    }
    if (len) *len = t->text_len[id];
    return tok_text(t, id);
}

int32_t kv_tokenizer_find(const kv_tokenizer *t, const char *text, size_t n) {
    if (!t || (!text && n)) return -1;
    return kv_tok_lookup(t, text, n);
}

kv_status kv_tokenizer_decode(char **text, size_t *len, const kv_tokenizer *t, const int32_t *ids, size_t n,
                              unsigned flags) {
    *text = NULL;
    if (len) *len = 0;
    if (!t || (!ids && n)) return KV_ERR(KV_EINVAL, "kv_tokenizer_decode: NULL argument");
    size_t total = 0;
    for (size_t i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= t->n_tokens)
            return KV_ERR(KV_EINVAL, "kv_tokenizer_decode: token id %d at position %zu is out of range (vocabulary of %d)",
                          (int)ids[i], i, t->n_tokens);
        total += (flags & KV_DETOK_SPECIAL) ? t->text_len[ids[i]] + t->piece_len[ids[i]] : t->piece_len[ids[i]];
    }
    char *o = malloc(total + 1);
    if (!o) return KV_ERR(KV_ENOMEM, "out of memory decoding %zu tokens", n);
    size_t k = 0;
    int strip = t->add_space_prefix && !(flags & KV_DETOK_KEEP_PREFIX);
    for (size_t i = 0; i < n; i++) {
        int32_t id = ids[i];
        int type = t->type[id];
        const char *p;
        size_t l;
        if ((type == KV_TOKEN_CONTROL || type == KV_TOKEN_UNKNOWN)) {
            if (!(flags & KV_DETOK_SPECIAL)) continue; /* BOS etc. render as nothing */
            p = tok_text(t, id);
            l = t->text_len[id];
        } else {
            p = t->piece_arena + t->piece_off[id];
            l = t->piece_len[id];
            if (strip && l > 0 && p[0] == ' ') {
                p++;
                l--;
            }
            strip = 0;
        }
        memcpy(o + k, p, l);
        k += l;
    }
    o[k] = '\0';
    *text = o;
    if (len) *len = k;
    return KV_OK;
}

int kv_tokenizer_n_vocab(const kv_tokenizer *t) { return t ? t->n_tokens : 0; }
int32_t kv_tokenizer_bos(const kv_tokenizer *t) { return t ? t->bos : -1; }
int32_t kv_tokenizer_eos(const kv_tokenizer *t) { return t ? t->eos : -1; }
int kv_tokenizer_add_bos_default(const kv_tokenizer *t) { return t ? t->add_bos : 0; }
int kv_tokenizer_token_type(const kv_tokenizer *t, int32_t id) {
    return t && id >= 0 && id < t->n_tokens ? t->type[id] : 0;
}
int kv_tokenizer_is_eog(const kv_tokenizer *t, int32_t id) {
    return t && id >= 0 && id < t->n_tokens && t->eog[id];
}
kv_vocab_kind kv_tokenizer_kind(const kv_tokenizer *t) { return t ? t->kind : KV_VOCAB_SPM; }
const char *kv_tokenizer_pre(const kv_tokenizer *t) { return t && t->kind == KV_VOCAB_BPE ? t->pre : ""; }
