/* HF tokenizers' tokenizer.json (model.type "BPE"), read with jansson, plus the special tokens of a
 * tokenizer_config.json beside it.
 *
 * Two flavours of BPE are recognized:
 *  - byte-level (GPT-2 style; a ByteLevel pre-tokenizer): KV_VOCAB_BPE, with the pre-tokenizer named as
 *    GGUF's tokenizer.ggml.pre would name it: "gpt-2" (ByteLevel with its regex), "smollm" (Digits with
 *    individual_digits, then ByteLevel), "llama-bpe" (Split with Llama 3's regex), "qwen2" (Split with
 *    Qwen2's regex, single digits);
 *  - SentencePiece-like (Llama 2 / Mistral exported to tokenizer.json: spaces replaced by U+2581,
 *    a prepended U+2581, byte_fallback): KV_VOCAB_SPM_MERGES.
 * Anything else is KV_EUNSUPPORTED with the reason. */
#define _POSIX_C_SOURCE 200809L
#include "vocab_internal.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define SPM_SPACE "\xE2\x96\x81"

static const char *const k_llama3_regex =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
    "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
static const char *const k_qwen2_regex =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
    "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

static const char *jstr(json_t *o, const char *key) {
    json_t *x = json_object_get(o, key);
    return json_is_string(x) ? json_string_value(x) : NULL;
}

static int jtype_is(json_t *o, const char *type) {
    const char *t = jstr(o, "type");
    return t && strcmp(t, type) == 0;
}

/* What the pre-tokenizer and normalizer say. */
typedef struct hf_shape {
    int byte_level, byte_level_regex, byte_level_prefix_space;
    int digits_individual, digits;
    int n_split;
    const char *split_regex;
    int metaspace, metaspace_prepend;
    int norm_replace_space, norm_prepend;
    int other;              /* a component we do not model */
    char other_name[48];
} hf_shape;

static void note_other(hf_shape *s, const char *what) {
    if (!s->other) snprintf(s->other_name, sizeof s->other_name, "%s", what ? what : "?");
    s->other = 1;
}

static void walk_pretok(json_t *p, hf_shape *s) {
    if (!p || json_is_null(p)) return;
    if (jtype_is(p, "Sequence")) {
        json_t *arr = json_object_get(p, "pretokenizers");
        size_t i;
        json_t *x;
        json_array_foreach(arr, i, x) walk_pretok(x, s);
    } else if (jtype_is(p, "ByteLevel")) {
        s->byte_level = 1;
        json_t *ur = json_object_get(p, "use_regex");
        s->byte_level_regex = ur ? json_is_true(ur) : 1;
        s->byte_level_prefix_space = json_is_true(json_object_get(p, "add_prefix_space"));
    } else if (jtype_is(p, "Digits")) {
        s->digits = 1;
        s->digits_individual = json_is_true(json_object_get(p, "individual_digits"));
    } else if (jtype_is(p, "Split")) {
        s->n_split++;
        json_t *pat = json_object_get(p, "pattern");
        s->split_regex = jstr(pat, "Regex");
        if (!s->split_regex) note_other(s, "Split with a string pattern");
    } else if (jtype_is(p, "Metaspace")) {
        s->metaspace = 1;
        const char *scheme = jstr(p, "prepend_scheme");
        json_t *aps = json_object_get(p, "add_prefix_space");
        s->metaspace_prepend = scheme ? strcmp(scheme, "never") != 0 : (aps ? json_is_true(aps) : 1);
    } else {
        note_other(s, jstr(p, "type"));
    }
}

static void walk_norm(json_t *n, hf_shape *s) {
    if (!n || json_is_null(n)) return;
    if (jtype_is(n, "Sequence")) {
        json_t *arr = json_object_get(n, "normalizers");
        size_t i;
        json_t *x;
        json_array_foreach(arr, i, x) walk_norm(x, s);
    } else if (jtype_is(n, "Prepend")) {
        const char *pp = jstr(n, "prepend");
        if (pp && strcmp(pp, SPM_SPACE) == 0) s->norm_prepend = 1;
        else note_other(s, "Prepend");
    } else if (jtype_is(n, "Replace")) {
        const char *c = jstr(n, "content");
        const char *pat = jstr(json_object_get(n, "pattern"), "String");
        if (c && pat && strcmp(pat, " ") == 0 && strcmp(c, SPM_SPACE) == 0) s->norm_replace_space = 1;
        else note_other(s, "Replace");
    } else if (jtype_is(n, "NFC")) {
        /* Qwen2's tokenizer.json normalizes to NFC; llama.cpp (our reference for Qwen2 GGUFs) does
         * not, and neither do we: ids differ from HF only on text that is not already NFC */
    } else {
        note_other(s, jstr(n, "type"));
    }
}

/* The text of a special-token entry of tokenizer_config.json: a string or {"content": ...}. */
static const char *token_text(json_t *x) {
    if (json_is_string(x)) return json_string_value(x);
    if (json_is_object(x)) return jstr(x, "content");
    return NULL;
}

static int find_token_id(json_t *vocab, json_t *added, const char *text) {
    if (!text) return -1;
    size_t i;
    json_t *x;
    json_array_foreach(added, i, x) {
        const char *c = jstr(x, "content");
        json_t *id = json_object_get(x, "id");
        if (c && json_is_integer(id) && strcmp(c, text) == 0) return (int)json_integer_value(id);
    }
    json_t *id = json_object_get(vocab, text);
    return json_is_integer(id) ? (int)json_integer_value(id) : -1;
}

static char *sibling(const char *path, const char *name) {
    const char *slash = strrchr(path, '/');
    size_t dl = slash ? (size_t)(slash - path) : 0;
    size_t n = dl + strlen(name) + 2;
    char *o = malloc(n);
    if (!o) return NULL;
    if (slash) snprintf(o, n, "%.*s/%s", (int)dl, path, name);
    else snprintf(o, n, "%s", name);
    return o;
}

kv_status kv_vocab_from_hf_json(kv_vocab_data **out, const char *path) {
    *out = NULL;
    kv_status st = KV_OK;
    kv_vocab_builder b;
    memset(&b, 0, sizeof b);
    json_t *cfg = NULL;
    char *cfg_path = NULL;
    char *buf = NULL;
    json_error_t err;
    json_t *root = json_load_file(path, 0, &err);
    if (!root) {
        struct stat sb;
        if (stat(path, &sb) != 0) return KV_ERR(KV_ENOTFOUND, "cannot open tokenizer '%s'", path);
        return KV_ERR(KV_EFORMAT, "%s:%d:%d: invalid JSON: %s", path, err.line, err.column, err.text);
    }
    json_t *model = json_object_get(root, "model");
    json_t *vocab = json_object_get(model, "vocab");
    json_t *merges = json_object_get(model, "merges");
    json_t *added = json_object_get(root, "added_tokens");
    if (!json_is_object(model)) {
        st = KV_ERR(KV_EFORMAT, "%s: no \"model\" object (not a tokenizer.json?)", path);
        goto done;
    }
    const char *mtype = jstr(model, "type");
    if (!mtype && json_is_object(vocab) && json_is_array(merges)) mtype = "BPE"; /* older files omit it */
    if (!mtype || strcmp(mtype, "BPE") != 0) {
        st = KV_ERR(KV_EUNSUPPORTED, "%s: tokenizer model type '%s' is not supported (only BPE)", path,
                    mtype ? mtype : "?");
        goto done;
    }
    if (!json_is_object(vocab) || !json_is_array(merges)) {
        st = KV_ERR(KV_EFORMAT, "%s: model.vocab must be an object and model.merges an array", path);
        goto done;
    }
    if (added && !json_is_array(added)) {
        st = KV_ERR(KV_EFORMAT, "%s: added_tokens must be an array", path);
        goto done;
    }

    /* the shape of the pipeline decides the kind and the pre-tokenizer name */
    hf_shape sh;
    memset(&sh, 0, sizeof sh);
    walk_pretok(json_object_get(root, "pre_tokenizer"), &sh);
    walk_norm(json_object_get(root, "normalizer"), &sh);
    kv_vocab_kind kind;
    char pre[32] = "";
    if (sh.byte_level) {
        kind = KV_VOCAB_BPE;
        if (sh.other || sh.byte_level_prefix_space || sh.metaspace || sh.norm_prepend || sh.norm_replace_space) {
            st = KV_ERR(KV_EUNSUPPORTED, "%s: byte-level pre-tokenizer combined with %s is not supported", path,
                        sh.other ? sh.other_name : "a prefix space");
            goto done;
        }
        if (sh.n_split == 0 && sh.byte_level_regex) {
            snprintf(pre, sizeof pre, "%s", sh.digits ? (sh.digits_individual ? "smollm" : "") : "gpt-2");
        } else if (sh.n_split == 1 && !sh.byte_level_regex && !sh.digits && sh.split_regex) {
            if (strcmp(sh.split_regex, k_llama3_regex) == 0) snprintf(pre, sizeof pre, "llama-bpe");
            else if (strcmp(sh.split_regex, k_qwen2_regex) == 0) snprintf(pre, sizeof pre, "qwen2");
        }
        if (!pre[0]) {
            st = KV_ERR(KV_EUNSUPPORTED, "%s: pre-tokenizer not recognized (split regex %s%s%s); known: GPT-2, "
                        "SmolLM (digits + ByteLevel), Llama 3, Qwen2", path, sh.split_regex ? "'" : "",
                        sh.split_regex ? sh.split_regex : "none", sh.split_regex ? "'" : "");
            goto done;
        }
    } else if ((sh.norm_replace_space || sh.metaspace) && !sh.other) {
        kind = KV_VOCAB_SPM_MERGES;
    } else {
        st = KV_ERR(KV_EUNSUPPORTED, "%s: BPE tokenizer that is neither byte-level nor SentencePiece-like (%s)",
                    path, sh.other ? sh.other_name : "no ByteLevel / Metaspace");
        goto done;
    }

    /* size of the vocabulary: the largest id + 1 over vocab and added_tokens */
    long long max_id = -1;
    const char *key;
    json_t *val;
    json_object_foreach(vocab, key, val) {
        if (!json_is_integer(val) || json_integer_value(val) < 0 || json_integer_value(val) >= KV_VOCAB_MAX_TOKENS) {
            st = KV_ERR(KV_EFORMAT, "%s: vocab entry '%.40s' has an invalid id", path, key);
            goto done;
        }
        if (json_integer_value(val) > max_id) max_id = json_integer_value(val);
    }
    size_t i;
    json_t *x;
    json_array_foreach(added, i, x) {
        json_t *id = json_object_get(x, "id");
        if (!json_is_integer(id) || json_integer_value(id) < 0 || json_integer_value(id) >= KV_VOCAB_MAX_TOKENS ||
            !jstr(x, "content")) {
            st = KV_ERR(KV_EFORMAT, "%s: added_tokens[%zu] lacks a valid id or content", path, i);
            goto done;
        }
        if (json_integer_value(id) > max_id) max_id = json_integer_value(id);
    }
    st = kv_vb_init(&b, (int)(max_id + 1), 0, path);
    if (st != KV_OK) goto done;
    kv_vocab_data *v = b.v;
    v->kind = kind;
    snprintf(v->pre, sizeof v->pre, "%s", pre);
    snprintf(v->source, sizeof v->source, "tokenizer.json");
    json_object_foreach(vocab, key, val) {
        st = kv_vb_set_token(&b, (int)json_integer_value(val), key, strlen(key));
        if (st != KV_OK) goto done;
    }
    json_array_foreach(added, i, x) {
        int id = (int)json_integer_value(json_object_get(x, "id"));
        const char *c = jstr(x, "content");
        st = kv_vb_set_token(&b, id, c, strlen(c));
        if (st != KV_OK) goto done;
        /* as llama.cpp's converter types them: special added tokens are control tokens */
        v->token_type[id] = json_is_true(json_object_get(x, "special")) ? KV_TOKEN_CONTROL : KV_TOKEN_USER_DEFINED;
    }
    size_t cap = 256;
    buf = malloc(cap);
    if (!buf) {
        st = KV_ERR(KV_ENOMEM, "out of memory");
        goto done;
    }
    json_array_foreach(merges, i, x) {
        const char *a = NULL, *c = NULL, *whole = NULL;
        if (json_is_string(x)) {
            whole = json_string_value(x);
        } else if (json_is_array(x) && json_array_size(x) == 2 && json_is_string(json_array_get(x, 0)) &&
                   json_is_string(json_array_get(x, 1))) {
            a = json_string_value(json_array_get(x, 0));
            c = json_string_value(json_array_get(x, 1));
        } else {
            st = KV_ERR(KV_EFORMAT, "%s: merges[%zu] is neither \"a b\" nor [\"a\", \"b\"]", path, i);
            goto done;
        }
        if (whole) {
            st = kv_vb_add_merge(&b, whole, strlen(whole));
        } else {
            size_t la = strlen(a), lc = strlen(c);
            if (la + lc + 2 > cap) {
                cap = la + lc + 2;
                char *nb = realloc(buf, cap);
                if (!nb) {
                    st = KV_ERR(KV_ENOMEM, "out of memory");
                    goto done;
                }
                buf = nb;
            }
            memcpy(buf, a, la);
            buf[la] = ' ';
            memcpy(buf + la + 1, c, lc);
            st = kv_vb_add_merge(&b, buf, la + lc + 1);
        }
        if (st != KV_OK) goto done;
    }

    /* special tokens: tokenizer_config.json when present, else what the pipeline shows */
    v->add_bos = 0;
    v->add_space_prefix = kind == KV_VOCAB_SPM_MERGES ? (sh.norm_prepend || sh.metaspace_prepend) : 0;
    v->remove_extra_ws = 0;
    v->unk_id = find_token_id(vocab, added, jstr(model, "unk_token"));
    cfg_path = sibling(path, "tokenizer_config.json");
    if (cfg_path) cfg = json_load_file(cfg_path, 0, &err);
    if (cfg) {
        v->bos_id = find_token_id(vocab, added, token_text(json_object_get(cfg, "bos_token")));
        v->eos_id = find_token_id(vocab, added, token_text(json_object_get(cfg, "eos_token")));
        v->pad_id = find_token_id(vocab, added, token_text(json_object_get(cfg, "pad_token")));
        int u = find_token_id(vocab, added, token_text(json_object_get(cfg, "unk_token")));
        if (u >= 0) v->unk_id = u;
        json_t *ab = json_object_get(cfg, "add_bos_token");
        if (json_is_boolean(ab)) v->add_bos = json_is_true(ab);
        else v->add_bos = -1; /* decided from the post-processor below */
    } else {
        v->add_bos = -1;
    }
    if (v->add_bos < 0) {
        /* TemplateProcessing whose "single" template starts with a special token: that token is BOS */
        json_t *pp = json_object_get(root, "post_processor");
        json_t *tp = NULL;
        if (jtype_is(pp, "TemplateProcessing")) tp = pp;
        else if (jtype_is(pp, "Sequence")) {
            json_array_foreach(json_object_get(pp, "processors"), i, x) if (jtype_is(x, "TemplateProcessing")) tp = x;
        }
        json_t *first = tp ? json_array_get(json_object_get(tp, "single"), 0) : NULL;
        json_t *sp = json_object_get(first, "SpecialToken");
        const char *bos_text = jstr(sp, "id");
        v->add_bos = 0;
        if (bos_text) {
            int id = find_token_id(vocab, added, bos_text);
            if (id >= 0) {
                v->add_bos = 1;
                if (v->bos_id < 0) v->bos_id = id;
            }
        }
    }
    kv_error_clear();
    st = kv_vb_finish(&b, out);
    /* byte_fallback pieces "<0xNN>" of SentencePiece-like vocabularies are byte tokens */
    if (st == KV_OK && kind == KV_VOCAB_SPM_MERGES) {
        kv_vocab_data *o = *out;
        for (int t = 0; t < o->n_tokens; t++) {
            const char *s = o->tokens[t];
            if (o->token_type[t] == KV_TOKEN_NORMAL && o->token_len[t] == 6 && !memcmp(s, "<0x", 3) && s[5] == '>')
                o->token_type[t] = KV_TOKEN_BYTE;
        }
        if (o->unk_id >= 0 && o->token_type[o->unk_id] != KV_TOKEN_CONTROL) o->token_type[o->unk_id] = KV_TOKEN_UNKNOWN;
    }
done:
    if (st != KV_OK) kv_vb_abort(&b);
    free(buf);
    free(cfg_path);
    json_decref(cfg);
    json_decref(root);
    return st;
}
