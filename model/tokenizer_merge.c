/* The merge loops: ranked merges (byte-level BPE words, HF SentencePiece-like BPE) and score-driven
 * merges (SentencePiece BPE). Both keep the symbols in a linked list and the candidate pairs in a
 * binary heap with lazy invalidation, so a text of n symbols costs O(n log n) (llama.cpp's
 * llm_tokenizer_bpe_session / llm_tokenizer_spm_session, and sentencepiece's bpe_model.cc, work the
 * same way; ties go to the leftmost pair in all three). */
#include "tokenizer_internal.h"

#include <stdlib.h>
#include <string.h>

typedef struct sym {
    int32_t id;    /* token of the symbol (rank merges); -1 when none */
    int32_t prev, next;
    uint32_t start, len; /* bytes (score merges); len 0 = merged away */
} sym;

typedef struct pair {
    float score;   /* score merges: higher first */
    int32_t rank;  /* rank merges: lower first */
    int32_t left, right;
    int32_t lid, rid, result; /* rank merges: ids when pushed, merged id */
    uint32_t size; /* score merges: bytes of left + right when pushed */
} pair;

static kv_status ensure_sym(kv_tok_scratch *s, size_t n) {
    if (s->sym_cap >= n) return KV_OK;
    size_t cap = s->sym_cap ? s->sym_cap : 64;
    while (cap < n) cap *= 2;
    void *p = realloc(s->sym, cap * sizeof(sym));
    if (!p) return KV_ERR(KV_ENOMEM, "out of memory tokenizing");
    s->sym = p;
    s->sym_cap = cap;
    return KV_OK;
}

/* heap of pairs, ordered by `before` */
typedef struct heap {
    pair *a;
    size_t n;
    kv_tok_scratch *s;
} heap;

static inline int rank_before(const pair *x, const pair *y) {
    return x->rank < y->rank || (x->rank == y->rank && x->left < y->left);
}
static inline int score_before(const pair *x, const pair *y) {
    return x->score > y->score || (x->score == y->score && x->left < y->left);
}

static kv_status heap_push(heap *h, const pair *p, int by_score) {
    if (h->n == h->s->heap_cap) {
        size_t cap = h->s->heap_cap ? h->s->heap_cap * 2 : 64;
        pair *a = realloc(h->s->heap, cap * sizeof *a);
        if (!a) return KV_ERR(KV_ENOMEM, "out of memory tokenizing");
        h->s->heap = a;
        h->s->heap_cap = cap;
        h->a = a;
    }
    size_t i = h->n++;
    while (i > 0) {
        size_t parent = (i - 1) / 2;
        int b = by_score ? score_before(p, &h->a[parent]) : rank_before(p, &h->a[parent]);
        if (!b) break;
        h->a[i] = h->a[parent];
        i = parent;
    }
    h->a[i] = *p;
    return KV_OK;
}

static pair heap_pop(heap *h, int by_score) {
    pair top = h->a[0];
    pair last = h->a[--h->n];
    size_t i = 0, n = h->n;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n) break;
        if (c + 1 < n && (by_score ? score_before(&h->a[c + 1], &h->a[c]) : rank_before(&h->a[c + 1], &h->a[c]))) c++;
        if (!(by_score ? score_before(&h->a[c], &last) : rank_before(&h->a[c], &last))) break;
        h->a[i] = h->a[c];
        i = c;
    }
    if (n > 0) h->a[i] = last;
    return top;
}

/* ---- ranked merges over the n symbols in s->sym (ids set, linked in order) ------------------ */

static kv_status rank_pair(const kv_tokenizer *t, heap *h, const sym *y, int32_t l, int32_t r) {
    if (l < 0 || r < 0) return KV_OK;
    const kv_merge_slot *m = kv_tok_merge(t, y[l].id, y[r].id);
    if (!m) return KV_OK;
    pair p;
    memset(&p, 0, sizeof p);
    p.rank = m->rank;
    p.left = l;
    p.right = r;
    p.lid = y[l].id;
    p.rid = y[r].id;
    p.result = m->result;
    return heap_push(h, &p, 0);
}

static kv_status rank_merge(const kv_tokenizer *t, kv_tok_scratch *s, size_t n, kv_idvec *out) {
    sym *y = s->sym;
    heap h = {s->heap, 0, s};
    kv_status st = KV_OK;
    for (size_t i = 1; i < n; i++)
        if ((st = rank_pair(t, &h, y, (int32_t)i - 1, (int32_t)i)) != KV_OK) return st;
    while (h.n > 0) {
        pair p = heap_pop(&h, 0);
        sym *a = &y[p.left], *b = &y[p.right];
        if (a->len == 0 || b->len == 0 || a->id != p.lid || b->id != p.rid || a->next != p.right) continue;
        a->id = p.result;
        a->len += b->len;
        b->len = 0;
        a->next = b->next;
        if (b->next >= 0) y[b->next].prev = p.left;
        if ((st = rank_pair(t, &h, y, a->prev, p.left)) != KV_OK) return st;
        if ((st = rank_pair(t, &h, y, p.left, a->next)) != KV_OK) return st;
    }
    for (int32_t i = n ? 0 : -1; i >= 0; i = y[i].next)
        if (y[i].id >= 0 && (st = kv_idvec_push(out, y[i].id)) != KV_OK) return st;
    return KV_OK;
}

kv_status kv_tok_bpe_word(const kv_tokenizer *t, kv_tok_scratch *s, const uint8_t *w, size_t n, kv_idvec *out) {
    if (n == 0) return KV_OK;
    if (t->ignore_merges || n == 1) {
        /* a word that is a token as a whole is emitted without merging (llama.cpp ignore_merges) */
        if (n == 1) return t->byte_token[w[0]] >= 0 ? kv_idvec_push(out, t->byte_token[w[0]]) : KV_OK;
        if (s->buf_cap < 2 * n) {
            size_t cap = s->buf_cap ? s->buf_cap : 256;
            while (cap < 2 * n) cap *= 2;
            char *b = realloc(s->buf, cap);
            if (!b) return KV_ERR(KV_ENOMEM, "out of memory tokenizing");
            s->buf = b;
            s->buf_cap = cap;
        }
        size_t k = 0;
        for (size_t i = 0; i < n; i++) {
            memcpy(s->buf + k, t->byte_utf8[w[i]], t->byte_utf8_len[w[i]]);
            k += t->byte_utf8_len[w[i]];
        }
        int32_t id = kv_tok_lookup(t, s->buf, k);
        if (id >= 0) return kv_idvec_push(out, id);
    }
    if (n > INT32_MAX) return KV_ERR(KV_EUNSUPPORTED, "a single word of %zu bytes", n);
    kv_status st = ensure_sym(s, n);
    if (st != KV_OK) return st;
    sym *y = s->sym;
    for (size_t i = 0; i < n; i++) {
        y[i].id = t->byte_token[w[i]];
        y[i].prev = (int32_t)i - 1;
        y[i].next = i + 1 < n ? (int32_t)i + 1 : -1;
        y[i].start = (uint32_t)i;
        y[i].len = 1;
    }
    return rank_merge(t, s, n, out);
}

/* ---- SentencePiece ------------------------------------------------------------------------- */

/* UTF-8 length from the lead byte, as llama.cpp's unicode_len_utf8 (continuation bytes count 1). */
static inline size_t lead_len(uint8_t c) {
    static const uint8_t lut[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
    return lut[c >> 4];
}

static kv_status push_symbol_bytes(const kv_tokenizer *t, const char *text, uint32_t start, uint32_t len,
                                   kv_idvec *out) {
    int all = 1;
    for (uint32_t j = 0; j < len; j++)
        if (t->byte_token[(uint8_t)text[start + j]] < 0) all = 0;
    kv_status st = KV_OK;
    if (all) {
        for (uint32_t j = 0; j < len && st == KV_OK; j++) st = kv_idvec_push(out, t->byte_token[(uint8_t)text[start + j]]);
    } else if (t->unk >= 0) {
        st = kv_idvec_push(out, t->unk);
    }
    return st;
}

/* sentencepiece merges into NORMAL, USER_DEFINED and UNUSED pieces only (not control/unknown/byte) */
static inline int mergeable(const kv_tokenizer *t, int32_t id) {
    int ty = t->type[id];
    return ty != KV_TOKEN_CONTROL && ty != KV_TOKEN_UNKNOWN && ty != KV_TOKEN_BYTE;
}

static kv_status score_pair(const kv_tokenizer *t, heap *h, const sym *y, const char *text, int32_t l, int32_t r) {
    if (l < 0 || r < 0) return KV_OK;
    uint32_t size = y[l].len + y[r].len;
    int32_t id = kv_tok_lookup(t, text + y[l].start, size);
    if (id < 0 || !mergeable(t, id)) return KV_OK;
    pair p;
    memset(&p, 0, sizeof p);
    p.score = t->score[id];
    p.left = l;
    p.right = r;
    p.size = size;
    return heap_push(h, &p, 1);
}

/* Merge the symbols y[a..b) (linked in order); returns the status. */
static kv_status spm_segment(const kv_tokenizer *t, kv_tok_scratch *s, const char *text, size_t a, size_t b) {
    sym *y = s->sym;
    heap h = {s->heap, 0, s};
    kv_status st;
    for (size_t i = a + 1; i < b; i++)
        if ((st = score_pair(t, &h, y, text, (int32_t)i - 1, (int32_t)i)) != KV_OK) return st;
    while (h.n > 0) {
        pair p = heap_pop(&h, 1);
        sym *l = &y[p.left], *r = &y[p.right];
        if (l->len == 0 || r->len == 0 || l->len + r->len != p.size) continue;
        l->len += r->len;
        r->len = 0;
        l->next = r->next;
        if (r->next >= 0) y[r->next].prev = p.left;
        if ((st = score_pair(t, &h, y, text, l->prev, p.left)) != KV_OK) return st;
        if ((st = score_pair(t, &h, y, text, p.left, l->next)) != KV_OK) return st;
    }
    return KV_OK;
}

static int isolated(const kv_tokenizer *t, const char *text, const sym *y) {
    for (uint32_t j = 0; j < y->len; j++) {
        uint8_t c = (uint8_t)text[y->start + j];
        if (c < 128 && t->isolating[c]) return 1;
    }
    return 0;
}

kv_status kv_tok_spm_text(const kv_tokenizer *t, kv_tok_scratch *s, const char *text, size_t n, kv_idvec *out) {
    if (n == 0) return KV_OK;
    if (n > UINT32_MAX / 2) return KV_ERR(KV_EUNSUPPORTED, "text of %zu bytes in one piece", n);
    kv_status st = ensure_sym(s, n);
    if (st != KV_OK) return st;
    sym *y = s->sym;
    size_t ns = 0;
    for (size_t off = 0; off < n;) {
        size_t l = lead_len((uint8_t)text[off]);
        if (l > n - off) l = n - off;
        y[ns].start = (uint32_t)off;
        y[ns].len = (uint32_t)l;
        y[ns].id = -1;
        ns++;
        off += l;
    }

    if (t->kind == KV_VOCAB_SPM_MERGES) {
        /* HF BPE with byte_fallback: characters outside the vocabulary become their byte tokens
         * before merging, then ranked merges */
        size_t total = 0;
        for (size_t i = 0; i < ns; i++) total += kv_tok_lookup(t, text + y[i].start, y[i].len) >= 0 ? 1 : y[i].len;
        if ((st = ensure_sym(s, ns + total)) != KV_OK) return st;
        y = s->sym;
        /* build the expanded list after the char list, then move it down */
        sym *z = y + ns;
        size_t k = 0;
        for (size_t i = 0; i < ns; i++) {
            int32_t id = kv_tok_lookup(t, text + y[i].start, y[i].len);
            if (id >= 0) {
                z[k].id = id;
                z[k].start = y[i].start;
                z[k].len = y[i].len;
                k++;
                continue;
            }
            int all = 1;
            for (uint32_t j = 0; j < y[i].len; j++)
                if (t->byte_token[(uint8_t)text[y[i].start + j]] < 0) all = 0;
            for (uint32_t j = 0; j < y[i].len; j++) {
                z[k].id = all ? t->byte_token[(uint8_t)text[y[i].start + j]] : (j == 0 ? t->unk : -1);
                z[k].start = y[i].start + j;
                z[k].len = 1;
                k++;
            }
        }
        memmove(y, z, k * sizeof *y);
        for (size_t i = 0; i < k; i++) {
            y[i].prev = (int32_t)i - 1;
            y[i].next = i + 1 < k ? (int32_t)i + 1 : -1;
        }
        return rank_merge(t, s, k, out);
    }

    /* score merges, stretch by stretch between isolated symbols */
    for (size_t a = 0; a < ns;) {
        size_t b = a;
        while (b < ns && !isolated(t, text, &y[b])) b++;
        if (b == a) b = a + 1; /* an isolated symbol alone */
        for (size_t i = a; i < b; i++) {
            y[i].prev = i > a ? (int32_t)i - 1 : -1;
            y[i].next = i + 1 < b ? (int32_t)i + 1 : -1;
        }
        if (b - a > 1 && (st = spm_segment(t, s, text, a, b)) != KV_OK) return st;
        y = s->sym;
        for (int32_t i = (int32_t)a; i >= 0; i = y[i].next) {
            int32_t id = kv_tok_lookup(t, text + y[i].start, y[i].len);
            if (id >= 0) st = kv_idvec_push(out, id);
            else st = push_symbol_bytes(t, text, y[i].start, y[i].len, out);
            if (st != KV_OK) return st;
        }
        a = b;
    }
    return KV_OK;
}
