/* Tokenizer data (kv_formats.h section 4): the builder shared by the loaders, kv_vocab_free, the
 * kv_vocab_load dispatcher and the GGUF loader (tokenizer.ggml.* metadata, as llama.cpp reads it). */
#define _POSIX_C_SOURCE 200809L
#include "vocab_internal.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

typedef struct vocab_priv {
    char *tok_text;
    char *mrg_text;
} vocab_priv;

/* ---- builder ------------------------------------------------------------------------------- */

static kv_status vbuf_put(kv_vbuf *b, const char *s, size_t n, size_t *off) {
    if (b->cap - b->len < n + 1) {
        size_t cap = b->cap ? b->cap : 4096;
        while (cap - b->len < n + 1) {
            if (cap > SIZE_MAX / 2) return KV_ERR(KV_ENOMEM, "vocabulary text too large");
            cap *= 2;
        }
        char *d = realloc(b->data, cap);
        if (!d) return KV_ERR(KV_ENOMEM, "out of memory for vocabulary text");
        b->data = d;
        b->cap = cap;
    }
    *off = b->len;
    memcpy(b->data + b->len, s, n);
    b->data[b->len + n] = '\0';
    b->len += n + 1;
    return KV_OK;
}

kv_status kv_vb_init(kv_vocab_builder *b, int n_tokens, int want_scores, const char *what) {
    memset(b, 0, sizeof *b);
    b->what = what ? what : "(tokenizer)";
    if (n_tokens <= 0 || n_tokens > KV_VOCAB_MAX_TOKENS)
        return KV_ERR(KV_EFORMAT, "%s: token count %d out of range (1..%d)", b->what, n_tokens,
                      KV_VOCAB_MAX_TOKENS);
    kv_vocab_data *v = calloc(1, sizeof *v);
    vocab_priv *p = calloc(1, sizeof *p);
    if (!v || !p) {
        free(v);
        free(p);
        return KV_ERR(KV_ENOMEM, "out of memory for a vocabulary");
    }
    v->priv_ = p;
    b->v = v;
    v->n_tokens = n_tokens;
    v->bos_id = v->eos_id = v->unk_id = v->pad_id = -1;
    v->tokens = calloc((size_t)n_tokens, sizeof *v->tokens);
    v->token_len = calloc((size_t)n_tokens, sizeof *v->token_len);
    v->token_type = malloc((size_t)n_tokens * sizeof *v->token_type);
    b->tok_off = malloc((size_t)n_tokens * sizeof *b->tok_off);
    if (want_scores) v->scores = calloc((size_t)n_tokens, sizeof *v->scores);
    if (!v->tokens || !v->token_len || !v->token_type || !b->tok_off || (want_scores && !v->scores)) {
        kv_vb_abort(b);
        return KV_ERR(KV_ENOMEM, "out of memory for a vocabulary of %d tokens", n_tokens);
    }
    for (int i = 0; i < n_tokens; i++) {
        v->token_type[i] = KV_TOKEN_NORMAL;
        b->tok_off[i] = SIZE_MAX;
    }
    return KV_OK;
}

kv_status kv_vb_set_token(kv_vocab_builder *b, int id, const char *s, size_t n) {
    if (id < 0 || id >= b->v->n_tokens)
        return KV_ERR(KV_EFORMAT, "%s: token id %d out of range (vocabulary of %d)", b->what, id,
                      b->v->n_tokens);
    if (n > KV_VOCAB_MAX_TOKEN_BYTES)
        return KV_ERR(KV_EFORMAT, "%s: token %d is %zu bytes long (limit %u)", b->what, id, n,
                      KV_VOCAB_MAX_TOKEN_BYTES);
    if (n > 0 && memchr(s, '\0', n))
        return KV_ERR(KV_EFORMAT, "%s: token %d contains a NUL byte", b->what, id);
    char tmp[32];
    if (n == 0) {
        /* llama.cpp names empty tokens "[EMPTY_<id>]" so that they can never match text */
        n = (size_t)snprintf(tmp, sizeof tmp, "[EMPTY_%d]", id);
        s = tmp;
    }
    kv_status s2 = vbuf_put(&b->tok, s, n, &b->tok_off[id]);
    if (s2 != KV_OK) return s2;
    b->v->token_len[id] = (uint32_t)n;
    return KV_OK;
}

kv_status kv_vb_add_merge(kv_vocab_builder *b, const char *s, size_t n) {
    if (b->v->n_merges >= KV_VOCAB_MAX_MERGES)
        return KV_ERR(KV_EFORMAT, "%s: more than %d merges", b->what, KV_VOCAB_MAX_MERGES);
    if (n > 2 * KV_VOCAB_MAX_TOKEN_BYTES + 1 || (n > 0 && memchr(s, '\0', n)))
        return KV_ERR(KV_EFORMAT, "%s: merge %d is malformed", b->what, b->v->n_merges);
    if (b->v->n_merges == b->mrg_cap) {
        int cap = b->mrg_cap ? b->mrg_cap * 2 : 1024;
        size_t *o = realloc(b->mrg_off, (size_t)cap * sizeof *o);
        if (!o) return KV_ERR(KV_ENOMEM, "out of memory for merges");
        b->mrg_off = o;
        b->mrg_cap = cap;
    }
    kv_status st = vbuf_put(&b->mrg, s, n, &b->mrg_off[b->v->n_merges]);
    if (st != KV_OK) return st;
    b->v->n_merges++;
    return KV_OK;
}

void kv_vb_abort(kv_vocab_builder *b) {
    if (!b) return;
    if (b->v) {
        /* arenas are not yet in priv_: free them here */
        free(b->v->priv_);
        b->v->priv_ = NULL;
        kv_vocab_free(b->v);
    }
    free(b->tok.data);
    free(b->mrg.data);
    free(b->tok_off);
    free(b->mrg_off);
    memset(b, 0, sizeof *b);
}

kv_status kv_vb_finish(kv_vocab_builder *b, kv_vocab_data **out) {
    *out = NULL;
    kv_vocab_data *v = b->v;
    kv_status st = KV_OK;
    for (int i = 0; i < v->n_tokens; i++) {
        if (b->tok_off[i] == SIZE_MAX) {
            st = kv_vb_set_token(b, i, "", 0);
            if (st != KV_OK) goto fail;
            v->token_type[i] = KV_TOKEN_UNUSED;
        }
    }
    if (v->n_merges > 0) {
        v->merges = malloc((size_t)v->n_merges * sizeof *v->merges);
        if (!v->merges) {
            st = KV_ERR(KV_ENOMEM, "out of memory for merges");
            goto fail;
        }
        for (int i = 0; i < v->n_merges; i++) v->merges[i] = b->mrg.data + b->mrg_off[i];
    }
    for (int i = 0; i < v->n_tokens; i++) v->tokens[i] = b->tok.data + b->tok_off[i];
    vocab_priv *p = v->priv_;
    p->tok_text = b->tok.data;
    p->mrg_text = b->mrg.data;
    free(b->tok_off);
    free(b->mrg_off);
    memset(b, 0, sizeof *b);
    *out = v;
    return KV_OK;
fail:
    kv_vb_abort(b);
    return st;
}

void kv_vocab_free(kv_vocab_data *v) {
    if (!v) return;
    vocab_priv *p = v->priv_;
    if (p) {
        free(p->tok_text);
        free(p->mrg_text);
        free(p);
    }
    free(v->tokens);
    free(v->token_len);
    free(v->scores);
    free(v->token_type);
    free(v->merges);
    free(v);
}

/* ---- GGUF ---------------------------------------------------------------------------------- */

static int value_is_str(const kv_gguf_value *x) { return x && x->type == KV_GGUF_STRING; }

/* An array of `elem` elements, or NULL (absent); KV_EFORMAT through *st when present but wrong. */
static const kv_gguf_value *gguf_array(const kv_gguf *g, const char *key, kv_gguf_type elem,
                                       const char *what, kv_status *st) {
    const kv_gguf_value *x = kv_gguf_find(g, key);
    if (!x) return NULL;
    if (x->type != KV_GGUF_ARRAY || x->v.arr.elem_type != elem ||
        (elem == KV_GGUF_STRING && x->v.arr.count > 0 && !x->v.arr.items) ||
        (elem != KV_GGUF_STRING && x->v.arr.count > 0 && !x->v.arr.raw)) {
        *st = KV_ERR(KV_EFORMAT, "%s: metadata '%s' is not an array of %s", what, key,
                     kv_gguf_type_name(elem) ? kv_gguf_type_name(elem) : "the expected type");
        return NULL;
    }
    return x;
}

/* Optional unsigned integer or bool: KV_OK and *out set, KV_ENOTFOUND (error cleared), or an error. */
static kv_status gguf_opt_u64(const kv_gguf *g, const char *key, uint64_t *out) {
    if (!kv_gguf_find(g, key)) return KV_ENOTFOUND;
    return kv_gguf_get_u64(g, key, out);
}

static void copy_name(char *dst, size_t cap, const char *s, size_t n) {
    if (n >= cap) n = cap - 1;
    memcpy(dst, s, n);
    dst[n] = '\0';
}

kv_status kv_vocab_from_gguf(kv_vocab_data **out, const kv_gguf *g, const char *what) {
    *out = NULL;
    kv_status st = KV_OK;
    kv_vocab_builder b;
    memset(&b, 0, sizeof b);
    const kv_gguf_value *model = kv_gguf_find(g, "tokenizer.ggml.model");
    if (!model) return KV_ERR(KV_ENOTFOUND, "%s: no tokenizer in the GGUF metadata (tokenizer.ggml.model)", what);
    if (!value_is_str(model)) return KV_ERR(KV_EFORMAT, "%s: tokenizer.ggml.model is not a string", what);
    char model_name[32];
    copy_name(model_name, sizeof model_name, model->v.str.ptr, (size_t)model->v.str.len);
    kv_vocab_kind kind;
    if (strcmp(model_name, "llama") == 0) {
        kind = KV_VOCAB_SPM;
    } else if (strcmp(model_name, "gpt2") == 0) {
        kind = KV_VOCAB_BPE;
    } else {
        return KV_ERR(KV_EUNSUPPORTED, "%s: tokenizer model '%s' is not supported (only 'llama' and 'gpt2')",
                      what, model_name);
    }

    const kv_gguf_value *toks = gguf_array(g, "tokenizer.ggml.tokens", KV_GGUF_STRING, what, &st);
    if (st != KV_OK) return st;
    if (!toks) return KV_ERR(KV_EFORMAT, "%s: tokenizer.ggml.tokens is missing", what);
    uint64_t n = toks->v.arr.count;
    if (n == 0 || n > KV_VOCAB_MAX_TOKENS)
        return KV_ERR(KV_EFORMAT, "%s: tokenizer.ggml.tokens has %llu entries", what, (unsigned long long)n);
    const kv_gguf_value *scores = gguf_array(g, "tokenizer.ggml.scores", KV_GGUF_FLOAT32, what, &st);
    if (st != KV_OK) return st;
    const kv_gguf_value *types = gguf_array(g, "tokenizer.ggml.token_type", KV_GGUF_INT32, what, &st);
    if (st != KV_OK) return st;
    const kv_gguf_value *merges = gguf_array(g, "tokenizer.ggml.merges", KV_GGUF_STRING, what, &st);
    if (st != KV_OK) return st;
    if (scores && scores->v.arr.count != n)
        return KV_ERR(KV_EFORMAT, "%s: tokenizer.ggml.scores has %llu entries for %llu tokens", what,
                      (unsigned long long)scores->v.arr.count, (unsigned long long)n);
    if (types && types->v.arr.count != n)
        return KV_ERR(KV_EFORMAT, "%s: tokenizer.ggml.token_type has %llu entries for %llu tokens", what,
                      (unsigned long long)types->v.arr.count, (unsigned long long)n);
    if (kind == KV_VOCAB_BPE && !merges)
        return KV_ERR(KV_EFORMAT, "%s: BPE tokenizer without tokenizer.ggml.merges", what);
    if (merges && merges->v.arr.count > KV_VOCAB_MAX_MERGES)
        return KV_ERR(KV_EFORMAT, "%s: tokenizer.ggml.merges has %llu entries", what,
                      (unsigned long long)merges->v.arr.count);

    st = kv_vb_init(&b, (int)n, kind == KV_VOCAB_SPM, what);
    if (st != KV_OK) return st;
    kv_vocab_data *v = b.v;
    v->kind = kind;
    snprintf(v->source, sizeof v->source, "gguf");
    for (uint64_t i = 0; i < n; i++) {
        const kv_gguf_value *t = &toks->v.arr.items[i];
        if (!value_is_str(t)) {
            st = KV_ERR(KV_EFORMAT, "%s: token %llu is not a string", what, (unsigned long long)i);
            goto fail;
        }
        st = kv_vb_set_token(&b, (int)i, t->v.str.ptr, (size_t)t->v.str.len);
        if (st != KV_OK) goto fail;
        if (scores) v->scores[i] = kv_load_f32le(scores->v.arr.raw + 4 * i);
        if (types) v->token_type[i] = (int32_t)kv_load_u32le(types->v.arr.raw + 4 * i);
    }
    if (merges) {
        for (uint64_t i = 0; i < merges->v.arr.count; i++) {
            const kv_gguf_value *m = &merges->v.arr.items[i];
            if (!value_is_str(m)) {
                st = KV_ERR(KV_EFORMAT, "%s: merge %llu is not a string", what, (unsigned long long)i);
                goto fail;
            }
            st = kv_vb_add_merge(&b, m->v.str.ptr, (size_t)m->v.str.len);
            if (st != KV_OK) goto fail;
        }
    }

    /* Defaults as llama.cpp's llama_vocab::load sets them before reading the keys. */
    if (kind == KV_VOCAB_SPM) {
        v->bos_id = 1;
        v->eos_id = 2;
        v->unk_id = 0;
        v->add_bos = 1;
        v->add_space_prefix = 1;
    } else {
        v->bos_id = 11;
        v->eos_id = 11;
        v->add_bos = 0;
        v->add_space_prefix = 0;
        const kv_gguf_value *pre = kv_gguf_find(g, "tokenizer.ggml.pre");
        if (pre) {
            if (!value_is_str(pre)) {
                st = KV_ERR(KV_EFORMAT, "%s: tokenizer.ggml.pre is not a string", what);
                goto fail;
            }
            copy_name(v->pre, sizeof v->pre, pre->v.str.ptr, (size_t)pre->v.str.len);
        } else {
            snprintf(v->pre, sizeof v->pre, "default");
        }
        /* these pre-tokenizers switch BOS on in llama.cpp (the key below may override) */
        if (!strcmp(v->pre, "llama3") || !strcmp(v->pre, "llama-v3") || !strcmp(v->pre, "llama-bpe") ||
            !strcmp(v->pre, "falcon3") || !strcmp(v->pre, "tekken") || !strcmp(v->pre, "chameleon"))
            v->add_bos = 1;
    }
    struct {
        const char *key;
        int *dst;
    } ids[] = {{"tokenizer.ggml.bos_token_id", &v->bos_id},
               {"tokenizer.ggml.eos_token_id", &v->eos_id},
               {"tokenizer.ggml.unknown_token_id", &v->unk_id},
               {"tokenizer.ggml.padding_token_id", &v->pad_id}};
    for (size_t k = 0; k < sizeof ids / sizeof ids[0]; k++) {
        uint64_t x;
        st = gguf_opt_u64(g, ids[k].key, &x);
        if (st == KV_ENOTFOUND) {
            st = KV_OK;
            continue;
        }
        if (st != KV_OK) goto fail;
        /* llama.cpp warns and keeps its default for an id outside the vocabulary */
        if (x < n) *ids[k].dst = (int)x;
        else kv_log(KV_LOG_WARN, "%s: %s = %llu is outside the vocabulary; ignored", what, ids[k].key,
                    (unsigned long long)x);
    }
    for (int k = 0; k < 4; k++)
        if (*ids[k].dst >= (int)n) *ids[k].dst = -1;
    uint64_t flag;
    st = gguf_opt_u64(g, "tokenizer.ggml.add_bos_token", &flag);
    if (st == KV_OK) v->add_bos = flag != 0;
    else if (st != KV_ENOTFOUND) goto fail;
    st = gguf_opt_u64(g, "tokenizer.ggml.add_space_prefix", &flag);
    if (st == KV_OK) v->add_space_prefix = flag != 0;
    else if (st != KV_ENOTFOUND) goto fail;
    /* tokenizer.ggml.remove_extra_whitespaces is read by llama.cpp but only its Unigram tokenizer
     * uses it; to give llama.cpp's ids for SPM models we ignore it as well. */
    st = KV_OK;
    kv_error_clear();
    return kv_vb_finish(&b, out);
fail:
    kv_vb_abort(&b);
    return st;
}

/* ---- dispatcher ---------------------------------------------------------------------------- */

static int file_exists(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0 && S_ISREG(sb.st_mode);
}

static int dir_exists(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0 && S_ISDIR(sb.st_mode);
}

static int ends_with(const char *s, const char *suffix) {
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && strcmp(s + a - b, suffix) == 0;
}

/* dirname(path) + "/" + name, malloc'd; for a directory path, path + "/" + name. */
static char *path_join_dir(const char *path, const char *name, int path_is_dir) {
    size_t dl;
    if (path_is_dir) {
        dl = strlen(path);
    } else {
        const char *slash = strrchr(path, '/');
        dl = slash ? (size_t)(slash - path) : 0;
    }
    size_t n = dl + 1 + strlen(name) + 1;
    char *out = malloc(n);
    if (!out) return NULL;
    if (dl) snprintf(out, n, "%.*s/%s", (int)dl, path, name);
    else snprintf(out, n, "%s%s", path_is_dir ? "./" : "", name);
    return out;
}

/* A llama2.c tok*.bin, with the normalizer flags of a sibling sentencepiece .model if there is one. */
static kv_status load_llama2c(kv_vocab_data **out, const char *path, int expect) {
    kv_status st = kv_vocab_from_llama2c(out, path, expect);
    if (st != KV_OK) return st;
    size_t n = strlen(path);
    char *model = malloc(n + 8);
    if (!model) return KV_OK;
    memcpy(model, path, n + 1);
    if (ends_with(model, ".bin")) model[n - 4] = '\0';
    strcat(model, ".model");
    int dummy = 1, rm = 0;
    if (file_exists(model) && kv_spm_model_normalizer(model, &dummy, &rm) == KV_OK) {
        (*out)->add_space_prefix = dummy;
        (*out)->remove_extra_ws = rm;
        kv_log(KV_LOG_DEBUG, "%s: normalizer from %s: add_dummy_prefix=%d remove_extra_whitespaces=%d", path,
               model, dummy, rm);
    }
    kv_error_clear();
    free(model);
    return KV_OK;
}

static kv_status load_explicit(kv_vocab_data **out, const char *path, int expect) {
    if (dir_exists(path)) {
        char *p = path_join_dir(path, "tokenizer.json", 1);
        char *q = path_join_dir(path, "tokenizer.model", 1);
        kv_status st;
        if (!p || !q) st = KV_ERR(KV_ENOMEM, "out of memory");
        else if (file_exists(p)) st = kv_vocab_from_hf_json(out, p);
        else if (file_exists(q)) st = kv_vocab_from_spm_model(out, q);
        else st = KV_ERR(KV_ENOTFOUND, "no tokenizer.json or tokenizer.model in directory '%s'", path);
        free(p);
        free(q);
        return st;
    }
    FILE *fp = fopen(path, "rb");
    if (!fp) return KV_ERR(errno == ENOENT ? KV_ENOTFOUND : KV_EIO, "cannot open tokenizer '%s': %s", path,
                           strerror(errno));
    unsigned char head[64];
    size_t got = fread(head, 1, sizeof head, fp);
    fclose(fp);
    if (got >= 4 && memcmp(head, "GGUF", 4) == 0) {
        kv_gguf *g = NULL;
        kv_status st = kv_gguf_open(&g, path);
        if (st != KV_OK) return kv_error_wrap(st, "tokenizer '%s': ", path);
        st = kv_vocab_from_gguf(out, g, path);
        kv_gguf_close(g);
        return st;
    }
    size_t i = 0;
    while (i < got && (head[i] == ' ' || head[i] == '\t' || head[i] == '\n' || head[i] == '\r')) i++;
    if (i < got && head[i] == '{') return kv_vocab_from_hf_json(out, path);
    if (ends_with(path, ".model")) return kv_vocab_from_spm_model(out, path);
    return load_llama2c(out, path, expect);
}

static kv_status load_for_model(kv_vocab_data **out, const kv_model_file *mf, const char *tokenizer_path);

kv_status kv_vocab_load(kv_vocab_data **out, const kv_model_file *mf, const char *tokenizer_path) {
    kv_status st = load_for_model(out, mf, tokenizer_path);
    if (st != KV_OK || !mf) return st;
    /* tokenizer files that name no BOS/EOS (tokenizer.json without tokenizer_config.json): take the
     * ids the model's own config gives */
    const kv_arch *a = kv_model_file_arch(mf);
    kv_vocab_data *v = *out;
    if (a && v->bos_id < 0 && a->bos_id >= 0 && a->bos_id < v->n_tokens) v->bos_id = a->bos_id;
    if (a && v->eos_id < 0 && a->eos_id >= 0 && a->eos_id < v->n_tokens) v->eos_id = a->eos_id;
    return KV_OK;
}

static kv_status load_for_model(kv_vocab_data **out, const kv_model_file *mf, const char *tokenizer_path) {
    *out = NULL;
    int expect = 0;
    if (mf) {
        const kv_arch *a = kv_model_file_arch(mf);
        if (a && a->vocab_size > 0) expect = a->vocab_size;
    }
    if (tokenizer_path) {
        /* the vocab size is only binding for llama2.c files, which carry no token count */
        int llama2c_model = mf && kv_model_file_format(mf) == KV_MODEL_LLAMA2C;
        return load_explicit(out, tokenizer_path, llama2c_model ? expect : 0);
    }
    if (!mf) return KV_ERR(KV_EINVAL, "kv_vocab_load: neither a model nor a tokenizer path");
    const char *mpath = kv_model_file_path(mf);
    switch (kv_model_file_format(mf)) {
    case KV_MODEL_GGUF: {
        const kv_gguf *g = kv_model_file_gguf(mf);
        if (!g) return KV_ERR(KV_EINVAL, "model '%s': no GGUF reader", mpath ? mpath : "?");
        return kv_vocab_from_gguf(out, g, mpath ? mpath : "(gguf)");
    }
    case KV_MODEL_SAFETENSORS: {
        if (!mpath) return KV_ERR(KV_EINVAL, "model without a path");
        int isdir = dir_exists(mpath);
        char *p = path_join_dir(mpath, "tokenizer.json", isdir);
        char *q = path_join_dir(mpath, "tokenizer.model", isdir);
        kv_status st;
        if (!p || !q) st = KV_ERR(KV_ENOMEM, "out of memory");
        else if (file_exists(p)) st = kv_vocab_from_hf_json(out, p);
        else if (file_exists(q)) st = kv_vocab_from_spm_model(out, q);
        else st = KV_ERR(KV_ENOTFOUND, "model '%s': no tokenizer.json or tokenizer.model beside it (use --tokenizer)",
                         mpath);
        free(p);
        free(q);
        return st;
    }
    case KV_MODEL_LLAMA2C: {
        if (!mpath) return KV_ERR(KV_EINVAL, "model without a path");
        char name[64];
        snprintf(name, sizeof name, "tok%d.bin", expect);
        char *p = path_join_dir(mpath, name, 0);
        char *q = path_join_dir(mpath, "tokenizer.bin", 0);
        kv_status st;
        if (!p || !q) st = KV_ERR(KV_ENOMEM, "out of memory");
        else if (expect > 0 && file_exists(p)) st = load_llama2c(out, p, expect);
        else if (file_exists(q)) st = load_llama2c(out, q, expect);
        else st = KV_ERR(KV_ENOTFOUND, "model '%s': neither %s nor tokenizer.bin beside it (use --tokenizer)",
                         mpath, name);
        free(p);
        free(q);
        return st;
    }
    }
    return KV_ERR(KV_EINVAL, "unknown model format");
}
