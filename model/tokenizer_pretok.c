/* Pre-tokenizers of byte-level BPE: the splitting rules GGUF's tokenizer.ggml.pre names, written by
 * hand after llama.cpp's unicode.cpp (unicode_regex_split_custom_gpt2 / _llama3; the Qwen2 and
 * digit rules, which llama.cpp runs through std::regex on a category-collapsed text, follow the
 * same alternatives in the same order). Positions are code point indices into the fragment. */
#include "tokenizer_internal.h"

#include <stdlib.h>
#include <string.h>

#define OOR 0xFFFFFFFFu
#define L_ KV_UCP_LETTER
#define N_ KV_UCP_NUMBER
#define W_ KV_UCP_WHITESPACE

typedef struct splitter {
    kv_tok_scratch *s;
    size_t end;      /* end of the current range (exclusive) */
    size_t prev_end; /* end of the last word emitted */
    kv_status st;
} splitter;

static inline uint32_t gcp(const splitter *p, size_t pos) { return pos < p->end ? p->s->cp[pos] : OOR; }
static inline uint8_t gfl(const splitter *p, size_t pos) { return pos < p->end ? p->s->cp_flags[pos] : 0; }

static void add_word(splitter *p, size_t end) {
    if (end <= p->prev_end || p->st != KV_OK) return;
    kv_tok_scratch *s = p->s;
    if (s->n_words == s->word_cap) {
        size_t cap = s->word_cap ? s->word_cap * 2 : 256;
        size_t *w = realloc(s->word_end, cap * sizeof *w);
        if (!w) {
            p->st = KV_ERR(KV_ENOMEM, "out of memory splitting text");
            return;
        }
        s->word_end = w;
        s->word_cap = cap;
    }
    s->word_end[s->n_words++] = end;
    p->prev_end = end;
}

static inline uint32_t ascii_lower(uint32_t c) { return c >= 'A' && c <= 'Z' ? c + 32 : c; }

/* 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+ over [ini, end) */
static void split_gpt2(splitter *p, size_t ini, size_t end) {
    p->end = end;
    p->prev_end = ini;
    for (size_t pos = ini; pos < end && p->st == KV_OK;) {
        const uint32_t c = gcp(p, pos);
        const uint8_t f = gfl(p, pos);
        if (c == '\'' && pos + 1 < end) {
            uint32_t c1 = gcp(p, pos + 1);
            if (c1 == 's' || c1 == 't' || c1 == 'm' || c1 == 'd') {
                pos += 2;
                add_word(p, pos);
                continue;
            }
            if (pos + 2 < end) {
                uint32_t c2 = gcp(p, pos + 2);
                if ((c1 == 'r' && c2 == 'e') || (c1 == 'v' && c2 == 'e') || (c1 == 'l' && c2 == 'l')) {
                    pos += 3;
                    add_word(p, pos);
                    continue;
                }
            }
        }
        uint8_t f2 = c == ' ' ? gfl(p, pos + 1) : f;
        if (f2 & L_) { /* <space>?\p{L}+ */
            pos += c == ' ';
            while (f2 & L_) f2 = gfl(p, ++pos);
            add_word(p, pos);
            continue;
        }
        if (f2 & N_) { /* <space>?\p{N}+ */
            pos += c == ' ';
            while (f2 & N_) f2 = gfl(p, ++pos);
            add_word(p, pos);
            continue;
        }
        if (!(f2 & (W_ | L_ | N_)) && f2) { /* <space>?[^\s\p{L}\p{N}]+ */
            pos += c == ' ';
            while (!(f2 & (W_ | L_ | N_)) && f2) f2 = gfl(p, ++pos);
            add_word(p, pos);
            continue;
        }
        size_t nws = 0;
        while (gfl(p, pos + nws) & W_) nws++;
        if (nws > 1 && gcp(p, pos + nws) != OOR) { /* \s+(?!\S) */
            pos += nws - 1;
            add_word(p, pos);
            continue;
        }
        if (nws > 0) { /* \s+ */
            pos += nws;
            add_word(p, pos);
            continue;
        }
        add_word(p, ++pos); /* no match */
    }
}

/* (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,nmax}| ?[^\s\p{L}\p{N}]+[\r\n]*|
 * \s*[\r\n]+|\s+(?!\S)|\s+  over [ini, end); nmax 3 is Llama 3, 1 is Qwen2. */
static void split_llama3(splitter *p, size_t ini, size_t end, size_t nmax) {
    p->end = end;
    p->prev_end = ini;
    for (size_t pos = ini; pos < end && p->st == KV_OK;) {
        const uint32_t c = gcp(p, pos);
        const uint8_t f = gfl(p, pos);
        if (c == '\'' && pos + 1 < end) {
            uint32_t c1 = ascii_lower(gcp(p, pos + 1));
            if (c1 == 's' || c1 == 't' || c1 == 'm' || c1 == 'd') {
                pos += 2;
                add_word(p, pos);
                continue;
            }
            if (pos + 2 < end) {
                uint32_t c2 = ascii_lower(gcp(p, pos + 2));
                if ((c1 == 'r' && c2 == 'e') || (c1 == 'v' && c2 == 'e') || (c1 == 'l' && c2 == 'l')) {
                    pos += 3;
                    add_word(p, pos);
                    continue;
                }
            }
        }
        if (!(c == '\r' || c == '\n' || (f & N_))) { /* [^\r\n\p{L}\p{N}]?\p{L}+ */
            if ((f & L_) || (gfl(p, pos + 1) & L_)) {
                pos++;
                while (gfl(p, pos) & L_) pos++;
                add_word(p, pos);
                continue;
            }
        }
        if (f & N_) { /* \p{N}{1,nmax} */
            size_t i0 = pos;
            while (gfl(p, pos) & N_) {
                if (++pos - i0 >= nmax) {
                    add_word(p, pos);
                    i0 = pos;
                }
            }
            add_word(p, pos);
            continue;
        }
        uint8_t f2 = c == ' ' ? gfl(p, pos + 1) : f;
        if (!(f2 & (W_ | L_ | N_)) && f) { /* <space>?[^\s\p{L}\p{N}]+[\r\n]* */
            pos += c == ' ';
            while (!(f2 & (W_ | L_ | N_)) && f2) f2 = gfl(p, ++pos);
            uint32_t c2 = gcp(p, pos);
            while (c2 == '\r' || c2 == '\n') c2 = gcp(p, ++pos);
            add_word(p, pos);
            continue;
        }
        size_t nws = 0, last_rn = 0;
        while (gfl(p, pos + nws) & W_) {
            uint32_t c2 = gcp(p, pos + nws);
            if (c2 == '\r' || c2 == '\n') last_rn = pos + nws + 1;
            nws++;
        }
        if (last_rn > 0) { /* \s*[\r\n]+ */
            pos = last_rn;
            add_word(p, pos);
            continue;
        }
        if (nws > 1 && gcp(p, pos + nws) != OOR) { /* \s+(?!\S) */
            pos += nws - 1;
            add_word(p, pos);
            continue;
        }
        if (nws > 0) { /* \s+ */
            pos += nws;
            add_word(p, pos);
            continue;
        }
        add_word(p, ++pos);
    }
}

static kv_status ensure_cp(kv_tok_scratch *s, size_t n) {
    if (s->cp_cap >= n + 1) return KV_OK;
    size_t cap = s->cp_cap ? s->cp_cap : 256;
    while (cap < n + 1) cap *= 2;
    size_t *off = realloc(s->cp_off, cap * sizeof *off);
    if (off) s->cp_off = off;
    uint8_t *fl = realloc(s->cp_flags, cap);
    if (fl) s->cp_flags = fl;
    uint32_t *cp = realloc(s->cp, cap * sizeof *cp);
    if (cp) s->cp = cp;
    if (!off || !fl || !cp) return KV_ERR(KV_ENOMEM, "out of memory splitting text");
    s->cp_cap = cap;
    return KV_OK;
}

kv_status kv_tok_pretokenize(const kv_tokenizer *t, kv_tok_scratch *s, const char *text, size_t n, size_t *n_cp) {
    kv_status st = ensure_cp(s, n);
    if (st != KV_OK) return st;
    const uint8_t *u = (const uint8_t *)text;
    size_t k = 0;
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        int valid;
        size_t l;
        if (u[i] < 0x80) {
            cp = u[i];
            l = 1;
            valid = 1;
        } else {
            l = kv_utf8_decode(u + i, n - i, &cp, &valid);
        }
        s->cp[k] = cp;
        s->cp_off[k] = i;
        /* invalid UTF-8 (an error in llama.cpp) is one "other" code point per byte */
        s->cp_flags[k] = valid ? kv_tok_cp_flags(t, cp) : KV_UCP_DEFINED;
        k++;
        i += l;
    }
    s->cp_off[k] = n;
    *n_cp = k;
    s->n_words = 0;
    splitter p = {s, 0, 0, KV_OK};
    switch (t->pretok) {
    case KV_PRETOK_GPT2:
        split_gpt2(&p, 0, k);
        break;
    case KV_PRETOK_DIGITS_GPT2: {
        /* first \p{N}: every number code point is a fragment of its own */
        size_t run = 0;
        for (size_t pos = 0; pos < k && p.st == KV_OK; pos++) {
            if (s->cp_flags[pos] & N_) {
                if (run < pos) split_gpt2(&p, run, pos);
                p.end = pos + 1;
                p.prev_end = pos;
                add_word(&p, pos + 1);
                run = pos + 1;
            }
        }
        if (run < k && p.st == KV_OK) split_gpt2(&p, run, k);
        break;
    }
    case KV_PRETOK_LLAMA3:
        split_llama3(&p, 0, k, 3);
        break;
    case KV_PRETOK_QWEN2:
        split_llama3(&p, 0, k, 1);
        break;
    default:
        p.end = k;
        add_word(&p, k);
        break;
    }
    return p.st;
}
