/* SentencePiece tokenizer data: llama2.c tok*.bin files and sentencepiece .model files (the
 * ModelProto protobuf, read with a minimal wire-format walker; field numbers from
 * sentencepiece_model.proto). */
#define _POSIX_C_SOURCE 200809L
#include "vocab_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SPM_SPACE "\xE2\x96\x81" /* U+2581, sentencepiece's visible space */

/* "<0xNN>" with uppercase hex digits, as sentencepiece names byte pieces. */
static int is_byte_piece(const char *s, size_t n) {
    if (n != 6 || memcmp(s, "<0x", 3) != 0 || s[5] != '>') return 0;
    for (int i = 3; i < 5; i++) {
        char c = s[i];
        if (!((c >= '0' && c <= '9') || (c >= 'A' && c <= 'F'))) return 0;
    }
    return 1;
}

/* ---- llama2.c tok*.bin ---------------------------------------------------------------------
 * int32 max_token_length; then per token: float32 score, int32 length, `length` bytes. llama2.c's
 * exporter (tokenizer.py) wrote each sentencepiece piece with U+2581 replaced by ' ' and BOS/EOS
 * as "\n<s>\n" / "\n</s>\n"; we undo both so the pieces read as sentencepiece spells them. */
kv_status kv_vocab_from_llama2c(kv_vocab_data **out, const char *path, int expect_n_tokens) {
    *out = NULL;
    kv_file_map map;
    kv_status st = kv_file_map_open(&map, path);
    if (st != KV_OK) return st;
    const uint8_t *p = map.data;
    size_t size = map.size, off = 4;
    kv_vocab_builder b;
    memset(&b, 0, sizeof b);
    char *tmp = NULL;
    if (size < 4) {
        st = KV_ERR(KV_EFORMAT, "%s: too short for a llama2.c tokenizer (%zu bytes)", path, size);
        goto done;
    }
    int32_t max_len = (int32_t)kv_load_u32le(p);
    if (max_len <= 0 || max_len > (int32_t)KV_VOCAB_MAX_TOKEN_BYTES) {
        st = KV_ERR(KV_EFORMAT, "%s: max_token_length %d is implausible for a llama2.c tokenizer", path, max_len);
        goto done;
    }
    /* count the records (the file has no token count) */
    int n = 0;
    while (off < size && (expect_n_tokens <= 0 || n < expect_n_tokens)) {
        if (size - off < 8) {
            st = KV_ERR(KV_EFORMAT, "%s: token %d: record header truncated at byte %zu", path, n, off);
            goto done;
        }
        int32_t len = (int32_t)kv_load_u32le(p + off + 4);
        if (len < 0 || len > max_len || (size_t)len > size - off - 8) {
            st = KV_ERR(KV_EFORMAT, "%s: token %d: length %d invalid (max_token_length %d, %zu bytes left)", path,
                        n, len, max_len, size - off - 8);
            goto done;
        }
        off += 8 + (size_t)len;
        if (++n > KV_VOCAB_MAX_TOKENS) {
            st = KV_ERR(KV_EFORMAT, "%s: more than %d tokens", path, KV_VOCAB_MAX_TOKENS);
            goto done;
        }
    }
    if (expect_n_tokens > 0 && n < expect_n_tokens) {
        st = KV_ERR(KV_EFORMAT, "%s: %d tokens, but the model's vocabulary has %d", path, n, expect_n_tokens);
        goto done;
    }
    st = kv_vb_init(&b, n, 1, path);
    if (st != KV_OK) goto done;
    kv_vocab_data *v = b.v;
    v->kind = KV_VOCAB_SPM;
    snprintf(v->source, sizeof v->source, "llama2.c");
    tmp = malloc(3 * (size_t)max_len + 8);
    if (!tmp) {
        st = KV_ERR(KV_ENOMEM, "out of memory");
        goto done;
    }
    off = 4;
    for (int i = 0; i < n; i++) {
        float score = kv_load_f32le(p + off);
        size_t len = kv_load_u32le(p + off + 4);
        const char *s = (const char *)p + off + 8;
        off += 8 + len;
        size_t m = 0;
        if ((len == 5 && !memcmp(s, "\n<s>\n", 5)) || (len == 6 && !memcmp(s, "\n</s>\n", 6))) {
            memcpy(tmp, s + 1, len - 2);
            m = len - 2;
        } else {
            for (size_t k = 0; k < len; k++) {
                if (s[k] == ' ') {
                    memcpy(tmp + m, SPM_SPACE, 3);
                    m += 3;
                } else {
                    tmp[m++] = s[k];
                }
            }
        }
        st = kv_vb_set_token(&b, i, tmp, m);
        if (st != KV_OK) goto done;
        v->scores[i] = score;
        if (is_byte_piece(tmp, m)) v->token_type[i] = KV_TOKEN_BYTE;
    }
    /* llama2.c's conventions (run.c and its exporter): 0 <unk>, 1 BOS, 2 EOS */
    v->unk_id = n > 0 ? 0 : -1;
    v->bos_id = n > 1 ? 1 : -1;
    v->eos_id = n > 2 ? 2 : -1;
    if (v->unk_id >= 0) v->token_type[0] = KV_TOKEN_UNKNOWN;
    if (v->bos_id >= 0) v->token_type[1] = KV_TOKEN_CONTROL;
    if (v->eos_id >= 0) v->token_type[2] = KV_TOKEN_CONTROL;
    v->add_bos = 1;
    v->add_space_prefix = 1;
    v->remove_extra_ws = 0;
    st = kv_vb_finish(&b, out);
done:
    if (st != KV_OK) kv_vb_abort(&b);
    free(tmp);
    kv_file_map_close(&map);
    return st;
}

/* ---- protobuf wire format ------------------------------------------------------------------ */

typedef struct pb {
    const uint8_t *p, *end;
} pb;

typedef struct pb_field {
    uint32_t num;
    int wire;            /* 0 varint, 1 fixed64, 2 length-delimited, 5 fixed32 */
    uint64_t u;          /* varint or fixed value */
    const uint8_t *data; /* wire 2 */
    size_t len;
} pb_field;

static int pb_varint(pb *r, uint64_t *out) {
    uint64_t x = 0;
    for (int shift = 0; shift < 64; shift += 7) {
        if (r->p >= r->end) return -1;
        uint8_t c = *r->p++;
        x |= (uint64_t)(c & 0x7f) << shift;
        if (!(c & 0x80)) {
            *out = x;
            return 0;
        }
    }
    return -1;
}

/* 1 = a field read, 0 = end of message, -1 = malformed. */
static int pb_next(pb *r, pb_field *f) {
    if (r->p >= r->end) return 0;
    uint64_t key;
    if (pb_varint(r, &key) != 0) return -1;
    f->num = (uint32_t)(key >> 3);
    f->wire = (int)(key & 7);
    f->data = NULL;
    f->len = 0;
    f->u = 0;
    switch (f->wire) {
    case 0:
        return pb_varint(r, &f->u) == 0 ? 1 : -1;
    case 1:
        if (r->end - r->p < 8) return -1;
        f->u = kv_load_u64le(r->p);
        r->p += 8;
        return 1;
    case 2: {
        uint64_t len;
        if (pb_varint(r, &len) != 0 || len > (uint64_t)(r->end - r->p)) return -1;
        f->data = r->p;
        f->len = (size_t)len;
        r->p += len;
        return 1;
    }
    case 5:
        if (r->end - r->p < 4) return -1;
        f->u = kv_load_u32le(r->p);
        r->p += 4;
        return 1;
    default:
        return -1;
    }
}

typedef struct spm_norm {
    int add_dummy_prefix, remove_extra_ws, escape_ws;
    char name[32];
    size_t charsmap_len;
} spm_norm;

static int parse_normalizer(const uint8_t *data, size_t len, spm_norm *nm) {
    pb r = {data, data + len};
    pb_field f;
    int k;
    while ((k = pb_next(&r, &f)) == 1) {
        if (f.num == 1 && f.wire == 2) {
            size_t n = f.len < sizeof nm->name - 1 ? f.len : sizeof nm->name - 1;
            memcpy(nm->name, f.data, n);
            nm->name[n] = '\0';
        } else if (f.num == 2 && f.wire == 2) {
            nm->charsmap_len = f.len;
        } else if (f.num == 3 && f.wire == 0) {
            nm->add_dummy_prefix = f.u != 0;
        } else if (f.num == 4 && f.wire == 0) {
            nm->remove_extra_ws = f.u != 0;
        } else if (f.num == 5 && f.wire == 0) {
            nm->escape_ws = f.u != 0;
        }
    }
    return k;
}

kv_status kv_spm_model_normalizer(const char *path, int *add_dummy_prefix, int *remove_extra_ws) {
    kv_file_map map;
    kv_status st = kv_file_map_open(&map, path);
    if (st != KV_OK) return st;
    spm_norm nm = {1, 1, 1, "", 0};
    pb r = {map.data, map.data + map.size};
    pb_field f;
    int k;
    while ((k = pb_next(&r, &f)) == 1) {
        if (f.num == 3 && f.wire == 2 && parse_normalizer(f.data, f.len, &nm) != 0) {
            k = -1;
            break;
        }
    }
    kv_file_map_close(&map);
    if (k != 0) return KV_ERR(KV_EFORMAT, "%s: not a sentencepiece model (malformed protobuf)", path);
    *add_dummy_prefix = nm.add_dummy_prefix;
    *remove_extra_ws = nm.remove_extra_ws;
    return KV_OK;
}

typedef struct spm_trainer {
    int model_type; /* 1 unigram, 2 bpe, 3 word, 4 char */
    int byte_fallback, treat_ws_as_suffix;
    int64_t unk_id, bos_id, eos_id, pad_id;
} spm_trainer;

static int parse_trainer(const uint8_t *data, size_t len, spm_trainer *t) {
    pb r = {data, data + len};
    pb_field f;
    int k;
    while ((k = pb_next(&r, &f)) == 1) {
        if (f.wire != 0) continue;
        switch (f.num) {
        case 3: t->model_type = (int)f.u; break;
        case 24: t->treat_ws_as_suffix = f.u != 0; break;
        case 35: t->byte_fallback = f.u != 0; break;
        case 40: t->unk_id = (int64_t)f.u; break; /* int32 fields: negative values arrive sign-extended */
        case 41: t->bos_id = (int64_t)f.u; break;
        case 42: t->eos_id = (int64_t)f.u; break;
        case 43: t->pad_id = (int64_t)f.u; break;
        default: break;
        }
    }
    return k;
}

kv_status kv_vocab_from_spm_model(kv_vocab_data **out, const char *path) {
    *out = NULL;
    kv_file_map map;
    kv_status st = kv_file_map_open(&map, path);
    if (st != KV_OK) return st;
    kv_vocab_builder b;
    memset(&b, 0, sizeof b);
    spm_norm nm = {1, 1, 1, "", 0};
    spm_trainer tr = {1, 0, 0, 0, 1, 2, -1};
    int n = 0, k;
    pb r = {map.data, map.data + map.size};
    pb_field f;
    /* pass 1: count pieces, read the specs */
    while ((k = pb_next(&r, &f)) == 1) {
        if (f.num == 1 && f.wire == 2) {
            if (++n > KV_VOCAB_MAX_TOKENS) break;
        } else if (f.num == 2 && f.wire == 2) {
            if (parse_trainer(f.data, f.len, &tr) != 0) k = -1;
        } else if (f.num == 3 && f.wire == 2) {
            if (parse_normalizer(f.data, f.len, &nm) != 0) k = -1;
        }
        if (k < 0) break;
    }
    if (k != 0 || n == 0 || n > KV_VOCAB_MAX_TOKENS) {
        st = KV_ERR(KV_EFORMAT, "%s: not a sentencepiece model (%s)", path,
                    k != 0 ? "malformed protobuf" : n == 0 ? "no pieces" : "too many pieces");
        goto done;
    }
    if (tr.model_type != 2) {
        st = KV_ERR(KV_EUNSUPPORTED, "%s: sentencepiece model type %d is not supported (only BPE = 2; "
                    "Unigram models need a Viterbi tokenizer)", path, tr.model_type);
        goto done;
    }
    if (tr.treat_ws_as_suffix) {
        st = KV_ERR(KV_EUNSUPPORTED, "%s: treat_whitespace_as_suffix is not supported", path);
        goto done;
    }
    if (nm.charsmap_len > 0 || (nm.name[0] && strcmp(nm.name, "identity") != 0))
        kv_log(KV_LOG_WARN, "%s: normalizer '%s' is not applied (only identity normalization is implemented)",
               path, nm.name);
    st = kv_vb_init(&b, n, 1, path);
    if (st != KV_OK) goto done;
    kv_vocab_data *v = b.v;
    v->kind = KV_VOCAB_SPM;
    snprintf(v->source, sizeof v->source, "sentencepiece");
    r.p = map.data;
    int id = 0;
    while ((k = pb_next(&r, &f)) == 1) {
        if (!(f.num == 1 && f.wire == 2)) continue;
        pb sr = {f.data, f.data + f.len};
        pb_field g;
        const uint8_t *piece = NULL;
        size_t plen = 0;
        float score = 0.0f;
        int type = KV_TOKEN_NORMAL, kk;
        while ((kk = pb_next(&sr, &g)) == 1) {
            if (g.num == 1 && g.wire == 2) {
                piece = g.data;
                plen = g.len;
            } else if (g.num == 2 && g.wire == 5) {
                union { uint32_t u; float f; } cv;
                cv.u = (uint32_t)g.u;
                score = cv.f;
            } else if (g.num == 3 && g.wire == 0) {
                type = (int)g.u;
            }
        }
        if (kk != 0 || !piece) {
            st = KV_ERR(KV_EFORMAT, "%s: piece %d is malformed", path, id);
            goto done;
        }
        st = kv_vb_set_token(&b, id, (const char *)piece, plen);
        if (st != KV_OK) goto done;
        v->scores[id] = score;
        v->token_type[id] = type;
        id++;
    }
    v->unk_id = tr.unk_id >= 0 && tr.unk_id < n ? (int)tr.unk_id : -1;
    v->bos_id = tr.bos_id >= 0 && tr.bos_id < n ? (int)tr.bos_id : -1;
    v->eos_id = tr.eos_id >= 0 && tr.eos_id < n ? (int)tr.eos_id : -1;
    v->pad_id = tr.pad_id >= 0 && tr.pad_id < n ? (int)tr.pad_id : -1;
    v->add_bos = v->bos_id >= 0;
    v->add_space_prefix = nm.add_dummy_prefix;
    v->remove_extra_ws = nm.remove_extra_ws;
    st = kv_vb_finish(&b, out);
done:
    if (st != KV_OK) kv_vb_abort(&b);
    kv_file_map_close(&map);
    return st;
}
