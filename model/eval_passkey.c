/* eval_passkey.c — passkey retrieval (DESIGN.md §9): a random 5-digit key hidden at a chosen depth in
 * filler text from a corpus, asked for at the end, answered greedily through a KV cache. It tests what
 * perplexity cannot: whether the one token that matters survives the cache's compression (token
 * pruning drops most of a prompt; the key must be among what is kept). */
#include "forward_internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char k_intro[] = "There is an important piece of information hidden inside a lot of irrelevant text. "
                              "Find it and memorize it. I will quiz you about the important information there.\n\n";
static const char k_question[] = "\n\nWhat is the pass key?";
static const char k_primer[] = "The pass key is";

typedef struct tokbuf {
    int32_t *ids;
    int n, cap;
} tokbuf;

static kv_status tb_push(tokbuf *b, const int32_t *ids, int n) {
    if (b->n + n > b->cap) {
        int cap = b->cap ? b->cap : 256;
        while (cap < b->n + n) cap *= 2;
        int32_t *p = realloc(b->ids, (size_t)cap * sizeof *p);
        if (!p) return KV_ERR(KV_ENOMEM, "out of memory for a passkey prompt");
        b->ids = p;
        b->cap = cap;
    }
    memcpy(b->ids + b->n, ids, (size_t)n * sizeof *ids);
    b->n += n;
    return KV_OK;
}

static kv_status tb_text(tokbuf *b, const kv_tokenizer *tok, const char *text) {
    int32_t *ids = NULL;
    size_t n = 0;
    /* pieces continue earlier text: no SentencePiece dummy prefix */
    kv_status s = kv_tokenizer_encode(&ids, &n, tok, text, strlen(text), KV_TOK_NO_SPACE_PREFIX);
    if (s == KV_OK) s = tb_push(b, ids, (int)n);
    free(ids);
    return s;
}

static kv_status tb_special(tokbuf *b, int32_t id) { return tb_push(b, &id, 1); }

kv_status kv_passkey_prompt(int32_t **ids, int *n, int *key, const kv_tokenizer *tok, const int32_t *filler,
                            size_t n_filler, const kv_passkey_options *opt) {
    if (!ids || !n || !key || !tok || !opt || (!filler && n_filler))
        return KV_ERR(KV_EINVAL, "kv_passkey_prompt: bad arguments");
    *ids = NULL;
    *n = 0;
    if (!(opt->depth >= 0.0 && opt->depth <= 1.0)) return KV_ERR(KV_EINVAL, "passkey depth %g is not in [0, 1]", opt->depth);
    kv_rng rng;
    kv_rng_init(&rng, opt->seed ^ 0x7061737368ull); /* "passh" */
    *key = 10000 + (int)(kv_rng_next_u64(&rng) % 90000u);
    const int32_t im_start = kv_tokenizer_find(tok, "<|im_start|>", 12), im_end = kv_tokenizer_find(tok, "<|im_end|>", 10);
    const int chat = im_start >= 0 && im_end >= 0;
    tokbuf head = {0}, needle = {0}, tail = {0};
    char nt[96];
    snprintf(nt, sizeof nt, "\nThe pass key is %d. Remember it.\n", *key);
    kv_status s = KV_OK;
    const int32_t bos = kv_tokenizer_bos(tok);
    if (bos >= 0 && kv_tokenizer_add_bos_default(tok)) s = tb_special(&head, bos);
    if (s == KV_OK && chat) s = tb_special(&head, im_start);
    if (s == KV_OK && chat) s = tb_text(&head, tok, "user\n");
    if (s == KV_OK) s = tb_text(&head, tok, k_intro);
    if (s == KV_OK) s = tb_text(&needle, tok, nt);
    if (s == KV_OK) s = tb_text(&tail, tok, k_question);
    if (s == KV_OK && chat) s = tb_special(&tail, im_end);
    if (s == KV_OK && chat) s = tb_text(&tail, tok, "\n");
    if (s == KV_OK && chat) s = tb_special(&tail, im_start);
    if (s == KV_OK && chat) s = tb_text(&tail, tok, "assistant\n");
    if (s == KV_OK) s = tb_text(&tail, tok, chat ? k_primer : " The pass key is");
    if (s != KV_OK) goto done;
    const int fixed = head.n + needle.n + tail.n, F = opt->length - fixed;
    if (F < 1) {
        s = KV_ERR(KV_EINVAL, "a passkey prompt of %d tokens cannot hold its %d-token instruction, needle and question "
                   "and any filler", opt->length, fixed);
        goto done;
    }
    if ((size_t)F > n_filler) {
        s = KV_ERR(KV_EINVAL, "the filler corpus has %zu tokens, fewer than the %d a %d-token passkey prompt needs",
                   n_filler, F, opt->length);
        goto done;
    }
    const size_t off = (size_t)(kv_rng_next_u64(&rng) % (uint64_t)(n_filler - (size_t)F + 1));
    const int a = (int)floor(opt->depth * F + 0.5);
    tokbuf out = {0};
    if ((s = tb_push(&out, head.ids, head.n)) == KV_OK && (s = tb_push(&out, filler + off, a)) == KV_OK &&
        (s = tb_push(&out, needle.ids, needle.n)) == KV_OK && (s = tb_push(&out, filler + off + a, F - a)) == KV_OK)
        s = tb_push(&out, tail.ids, tail.n);
    if (s != KV_OK) {
        free(out.ids);
        goto done;
    }
    *ids = out.ids;
    *n = out.n;
done:
    free(head.ids);
    free(needle.ids);
    free(tail.ids);
    return s;
}

/* The prompt through a cache in steps, the last position's logits into logits. */
static kv_status prefill(kv_model *m, kv_cache *cache, const int32_t *prompt, int n, int chunk, float *logits) {
    const int slot = 0;
    kv_forward f;
    memset(&f, 0, sizeof f);
    f.n_seqs = 1;
    f.cache = cache;
    f.seq_ids = &slot;
    f.logits = logits;
    f.logits_last_only = 1;
    const int c = chunk > 0 ? chunk : n;
    for (int p = 0; p < n; p += c) {
        f.tokens = prompt + p;
        f.n_tokens = n - p < c ? n - p : c;
        kv_status s = kv_model_forward(m, &f);
        if (s != KV_OK) return s;
    }
    return KV_OK;
}

static int argmax(const float *x, int n) {
    int b = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return b;
}

/* The first number in text (at most 9 digits), or -1. */
static int first_number(const char *text) {
    const char *p = text;
    while (*p && (*p < '0' || *p > '9')) p++;
    if (!*p) return -1;
    long v = 0;
    for (int d = 0; *p >= '0' && *p <= '9' && d < 9; p++, d++) v = v * 10 + (*p - '0');
    return (int)v;
}

kv_status kv_eval_passkey(kv_model *m, const kv_tokenizer *tok, kv_cache *const *caches, int n_caches,
                          kv_cache *prefill_cache, const int32_t *prompt, int n_prompt, int key, int max_new,
                          int prefill_chunk, kv_passkey_answer *answers) {
    if (!m || !tok || n_caches < 1 || !caches || !prompt || n_prompt < 1 || max_new < 1 || max_new > 4096 ||
        prefill_chunk < 0 || !answers)
        return KV_ERR(KV_EINVAL, "kv_eval_passkey: bad arguments");
    memset(answers, 0, (size_t)n_caches * sizeof *answers);
    const int V = m->arch.vocab_size;
    float *first = kv_aligned_alloc(64, (size_t)V * sizeof(float)), *lg = kv_aligned_alloc(64, (size_t)V * sizeof(float));
    int32_t *gen = malloc((size_t)max_new * sizeof *gen);
    kv_status s = KV_OK;
    if (!first || !lg || !gen) {
        s = KV_ERR(KV_ENOMEM, "out of memory for a passkey answer");
        goto done;
    }
    if (prefill_cache) {
        kv_cache_reset(prefill_cache, 0);
        if ((s = prefill(m, prefill_cache, prompt, n_prompt, prefill_chunk, first)) != KV_OK) goto done;
    }
    for (int i = 0; i < n_caches; i++) {
        kv_passkey_answer *ans = &answers[i];
        kv_cache *cache = caches[i];
        double t0 = kv_now_seconds();
        if (prefill_cache) {
            if ((s = kv_cache_rt_prompt_copy(cache, 0, prefill_cache, 0)) != KV_OK) goto done;
            memcpy(lg, first, (size_t)V * sizeof(float));
        } else {
            kv_cache_reset(cache, 0);
            if ((s = prefill(m, cache, prompt, n_prompt, prefill_chunk, lg)) != KV_OK) goto done;
        }
        ans->seconds_prefill = kv_now_seconds() - t0;
        t0 = kv_now_seconds();
        if ((s = kv_cache_end_prompt(cache, 0)) != KV_OK) goto done;
        ans->seconds_end_prompt = kv_now_seconds() - t0;
        t0 = kv_now_seconds();
        int n = 0;
        const int slot = 0;
        for (;;) {
            const int32_t t = argmax(lg, V);
            if (kv_tokenizer_is_eog(tok, t)) break;
            gen[n++] = t;
            if (n == max_new) break;
            kv_forward f;
            memset(&f, 0, sizeof f);
            f.tokens = &gen[n - 1];
            f.n_seqs = 1;
            f.n_tokens = 1;
            f.cache = cache;
            f.seq_ids = &slot;
            f.logits = lg;
            f.logits_last_only = 1;
            if ((s = kv_model_forward(m, &f)) != KV_OK) goto done;
        }
        ans->seconds_decode = kv_now_seconds() - t0;
        char *text = NULL;
        size_t len = 0;
        if ((s = kv_tokenizer_decode(&text, &len, tok, gen, (size_t)n, 0)) != KV_OK) goto done;
        snprintf(ans->text, sizeof ans->text, "%s", text);
        ans->answer = first_number(text);
        ans->correct = ans->answer == key;
        free(text);
    }
done:
    kv_aligned_free(first);
    kv_aligned_free(lg);
    free(gen);
    return s;
}
