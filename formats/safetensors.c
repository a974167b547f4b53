/* HF model directories: config.json + model.safetensors, or shards listed in
 * model.safetensors.index.json. A safetensors file is an 8-byte little-endian header length, a
 * JSON header {name: {dtype, shape, data_offsets: [begin, end]}, "__metadata__": {...}}, then the
 * data; offsets are relative to the end of the header. Every entry is validated (known dtype,
 * shape product without overflow, size = elements * dtype size, offsets inside the file and not
 * overlapping); tensors are then exposed under their canonical names in GGML order. */
#define _POSIX_C_SOURCE 200809L
#include "model_file_internal.h"

#include <errno.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* ---- HF <-> canonical names ------------------------------------------------------------------ */
typedef struct name_pair {
    const char *hf;
    const char *canon;
} name_pair;
static const name_pair k_layer_names[] = {
    {"self_attn.q_proj.weight", "attn_q.weight"},     {"self_attn.q_proj.bias", "attn_q.bias"},
    {"self_attn.k_proj.weight", "attn_k.weight"},     {"self_attn.k_proj.bias", "attn_k.bias"},
    {"self_attn.v_proj.weight", "attn_v.weight"},     {"self_attn.v_proj.bias", "attn_v.bias"},
    {"self_attn.o_proj.weight", "attn_output.weight"}, {"mlp.gate_proj.weight", "ffn_gate.weight"},
    {"mlp.up_proj.weight", "ffn_up.weight"},          {"mlp.down_proj.weight", "ffn_down.weight"},
    {"input_layernorm.weight", "attn_norm.weight"},   {"post_attention_layernorm.weight", "ffn_norm.weight"},
    {"self_attn.q_norm.weight", "attn_q_norm.weight"}, {"self_attn.k_norm.weight", "attn_k_norm.weight"},
};
/* Gemma 3's decoder layer has four norms: its post_attention_layernorm normalizes the attention output
 * (llama.cpp's post_attention_norm), pre_feedforward_layernorm is the FFN's input norm (transformers 5.24.0
 * models/gemma3/modeling_gemma3.py:367-370, 394-400). */
static const name_pair k_gemma3_layer_names[] = {
    {"self_attn.q_proj.weight", "attn_q.weight"},     {"self_attn.k_proj.weight", "attn_k.weight"},
    {"self_attn.v_proj.weight", "attn_v.weight"},     {"self_attn.o_proj.weight", "attn_output.weight"},
    {"mlp.gate_proj.weight", "ffn_gate.weight"},      {"mlp.up_proj.weight", "ffn_up.weight"},
    {"mlp.down_proj.weight", "ffn_down.weight"},      {"input_layernorm.weight", "attn_norm.weight"},
    {"post_attention_layernorm.weight", "post_attention_norm.weight"},
    {"pre_feedforward_layernorm.weight", "ffn_norm.weight"},
    {"post_feedforward_layernorm.weight", "post_ffw_norm.weight"},
    {"self_attn.q_norm.weight", "attn_q_norm.weight"}, {"self_attn.k_norm.weight", "attn_k_norm.weight"},
};
static const struct {
    const char *hf;
    const char *canon;
} k_global_names[] = {
    {"model.embed_tokens.weight", "token_embd.weight"},
    {"model.norm.weight", "output_norm.weight"},
    {"lm_head.weight", "output.weight"},
};
#define N_ELEMS(a) (sizeof(a) / sizeof((a)[0]))

/* "blk.N." / "model.layers.N." prefix: returns the rest and sets *layer, or NULL. */
static const char *layer_prefix(const char *name, const char *prefix, long *layer) {
    size_t n = strlen(prefix);
    if (strncmp(name, prefix, n) != 0) return NULL;
    const char *p = name + n;
    if (*p < '0' || *p > '9' || (*p == '0' && p[1] != '.')) return NULL;
    long v = 0;
    while (*p >= '0' && *p <= '9') {
        v = v * 10 + (*p - '0');
        if (v > KV_MF_MAX_LAYERS) return NULL;
        p++;
    }
    if (*p != '.') return NULL;
    *layer = v;
    return p + 1;
}

static const name_pair *layer_names(const kv_arch *a, size_t *count) {
    if (a && strcmp(a->arch, "gemma3") == 0) {
        *count = N_ELEMS(k_gemma3_layer_names);
        return k_gemma3_layer_names;
    }
    *count = N_ELEMS(k_layer_names);
    return k_layer_names;
}

/* Canonical name of an HF tensor name into buf; 0 when the tensor is not one the model uses. */
static int hf_to_canonical(const kv_arch *a, const char *hf, char *buf, size_t n) {
    for (size_t i = 0; i < N_ELEMS(k_global_names); i++)
        if (strcmp(hf, k_global_names[i].hf) == 0) return snprintf(buf, n, "%s", k_global_names[i].canon), 1;
    long layer;
    const char *rest = layer_prefix(hf, "model.layers.", &layer);
    if (!rest) return 0;
    size_t count;
    const name_pair *names = layer_names(a, &count);
    for (size_t i = 0; i < count; i++)
        if (strcmp(rest, names[i].hf) == 0) return snprintf(buf, n, "blk.%ld.%s", layer, names[i].canon), 1;
    return 0;
}

const char *kv_hf_source_name(const kv_arch *a, const char *canonical, char *buf, size_t n) {
    if (n) buf[0] = '\0';
    for (size_t i = 0; i < N_ELEMS(k_global_names); i++)
        if (strcmp(canonical, k_global_names[i].canon) == 0)
            return snprintf(buf, n, "%s", k_global_names[i].hf), buf;
    long layer;
    const char *rest = layer_prefix(canonical, "blk.", &layer);
    if (!rest) return buf;
    size_t count;
    const name_pair *names = layer_names(a, &count);
    for (size_t i = 0; i < count; i++)
        if (strcmp(rest, names[i].canon) == 0)
            return snprintf(buf, n, "model.layers.%ld.%s", layer, names[i].hf), buf;
    return buf;
}

/* 1 for a canonical norm weight ("...norm.weight"): Gemma 3 computes x * (1 + w) with them. */
static int is_norm_weight(const char *canon) {
    const size_t n = strlen(canon), k = strlen("norm.weight");
    return n >= k && strcmp(canon + n - k, "norm.weight") == 0;
}

/* ---- safetensors dtypes ------------------------------------------------------------------------ */
static const struct {
    const char *name;
    int bits;
    int kv; /* kv_dtype, or -1 when valid safetensors but not readable here */
} k_dtypes[] = {
    {"F32", 32, KV_DTYPE_F32}, {"F16", 16, KV_DTYPE_F16}, {"BF16", 16, KV_DTYPE_BF16},
    {"F64", 64, -1},           {"I64", 64, -1},           {"U64", 64, -1},
    {"I32", 32, -1},           {"U32", 32, -1},           {"I16", 16, -1},
    {"U16", 16, -1},           {"I8", 8, -1},             {"U8", 8, -1},
    {"BOOL", 8, -1},           {"F8_E4M3", 8, -1},        {"F8_E5M2", 8, -1},
    {"F8_E8M0", 8, -1},        {"C64", 64, -1},           {"F6_E2M3", 6, -1},
    {"F6_E3M2", 6, -1},        {"F4", 4, -1},
};

typedef struct st_entry {
    const char *name;  /* borrowed from the JSON header */
    const char *dtype; /* borrowed */
    int kv_dtype;      /* -1 when not readable here */
    int rank;
    uint64_t shape[8];
    uint64_t begin, end; /* relative to the data section */
} st_entry;

static int cmp_entry(const void *a, const void *b) {
    const st_entry *x = a, *y = b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end) return x->end < y->end ? -1 : 1;
    return strcmp(x->name, y->name);
}

static kv_status get_u64(const json_t *v, uint64_t *out) {
    if (!json_is_integer(v) || json_integer_value(v) < 0) return KV_EFORMAT;
    *out = (uint64_t)json_integer_value(v);
    return KV_OK;
}

/* Validate one header entry into e (data_size: bytes after the header). */
static kv_status parse_entry(st_entry *e, const char *name, const json_t *v, uint64_t data_size,
                             const char *path) {
    memset(e, 0, sizeof *e);
    e->name = name;
    if (!json_is_object(v)) return KV_ERR(KV_EFORMAT, "'%s': header entry '%s' is not an object", path, name);
    const json_t *dt = json_object_get(v, "dtype"), *shape = json_object_get(v, "shape"),
                 *offs = json_object_get(v, "data_offsets");
    if (!json_is_string(dt)) return KV_ERR(KV_EFORMAT, "'%s': tensor '%s' has no dtype string", path, name);
    e->dtype = json_string_value(dt);
    int bits = 0;
    e->kv_dtype = -1;
    for (size_t i = 0; i < N_ELEMS(k_dtypes); i++)
        if (strcmp(e->dtype, k_dtypes[i].name) == 0) bits = k_dtypes[i].bits, e->kv_dtype = k_dtypes[i].kv;
    if (!bits) return KV_ERR(KV_EFORMAT, "'%s': tensor '%s' has unknown dtype '%s'", path, name, e->dtype);
    if (!json_is_array(shape) || json_array_size(shape) > 8)
        return KV_ERR(KV_EFORMAT, "'%s': tensor '%s': shape must be an array of at most 8 sizes", path, name);
    e->rank = (int)json_array_size(shape);
    size_t n = 1;
    for (int i = 0; i < e->rank; i++) {
        if (get_u64(json_array_get(shape, (size_t)i), &e->shape[i]))
            return KV_ERR(KV_EFORMAT, "'%s': tensor '%s': shape[%d] is not a non-negative integer", path,
                          name, i);
        if (e->shape[i] > SIZE_MAX || kv_size_mul(&n, n, (size_t)e->shape[i]))
            return KV_ERR(KV_EFORMAT, "'%s': tensor '%s': element count overflows", path, name);
    }
    if (!json_is_array(offs) || json_array_size(offs) != 2 || get_u64(json_array_get(offs, 0), &e->begin) ||
        get_u64(json_array_get(offs, 1), &e->end))
        return KV_ERR(KV_EFORMAT, "'%s': tensor '%s': data_offsets must be [begin, end]", path, name);
    if (e->begin > e->end)
        return KV_ERR(KV_EFORMAT, "'%s': tensor '%s': data_offsets [%llu, %llu] end before they begin", path,
                      name, (unsigned long long)e->begin, (unsigned long long)e->end);
    if (e->end > data_size)
        return KV_ERR(KV_EFORMAT,
                      "'%s': tensor '%s': data_offsets [%llu, %llu] point past the end of the data "
                      "(%llu bytes)",
                      path, name, (unsigned long long)e->begin, (unsigned long long)e->end,
                      (unsigned long long)data_size);
    size_t nbits;
    if (kv_size_mul(&nbits, n, (size_t)bits))
        return KV_ERR(KV_EFORMAT, "'%s': tensor '%s': element count overflows", path, name);
    if (nbits % 8 != 0 || nbits / 8 != e->end - e->begin)
        return KV_ERR(KV_EFORMAT,
                      "'%s': tensor '%s': %zu elements of %s take %zu bits, but data_offsets give %llu "
                      "bytes (size mismatch)",
                      path, name, n, e->dtype, nbits, (unsigned long long)(e->end - e->begin));
    return KV_OK;
}

/* Parse one safetensors file (already mapped) and add the tensors the model uses. When
 * weight_map is given (sharded), every tensor it places in `shard` must be in this file. */
static kv_status parse_file(kv_model_file *mf, const kv_file_map *map, const char *path,
                            const json_t *weight_map, const char *shard) {
    if (map->size < 8)
        return KV_ERR(KV_EFORMAT, "'%s': too short for a safetensors file (%zu bytes)", path, map->size);
    const uint64_t hlen = kv_load_u64le(map->data);
    if (hlen < 2 || hlen > map->size - 8)
        return KV_ERR(KV_EFORMAT, "'%s': safetensors header length %llu does not fit the file (%zu bytes)",
                      path, (unsigned long long)hlen, map->size);
    const uint64_t data_start = 8 + hlen, data_size = map->size - data_start;
    json_error_t err;
    json_t *root = json_loadb((const char *)map->data + 8, (size_t)hlen, JSON_REJECT_DUPLICATES, &err);
    if (!root)
        return KV_ERR(KV_EFORMAT, "'%s': invalid JSON header (column %d): %s", path, err.column, err.text);
    kv_status s = KV_OK;
    st_entry *entries = NULL;
    size_t n = 0;
    if (!json_is_object(root)) {
        s = KV_ERR(KV_EFORMAT, "'%s': the safetensors header is not a JSON object", path);
        goto done;
    }
    entries = calloc(json_object_size(root) + 1, sizeof *entries);
    if (!entries) {
        s = KV_ERR(KV_ENOMEM, "out of memory");
        goto done;
    }
    const char *key;
    json_t *val;
    json_object_foreach(root, key, val) {
        if (strcmp(key, "__metadata__") == 0) continue;
        if ((s = parse_entry(&entries[n], key, val, data_size, path)) != KV_OK) goto done;
        n++;
    }
    qsort(entries, n, sizeof *entries, cmp_entry);
    for (size_t i = 1; i < n; i++) {
        if (entries[i].begin < entries[i - 1].end) {
            s = KV_ERR(KV_EFORMAT, "'%s': tensors '%s' and '%s' overlap in the data section", path,
                       entries[i - 1].name, entries[i].name);
            goto done;
        }
    }
    if (weight_map) {
        json_object_foreach((json_t *)weight_map, key, val) {
            if (strcmp(json_string_value(val), shard) == 0 && !json_object_get(root, key)) {
                s = KV_ERR(KV_EFORMAT, "'%s': the index places tensor '%s' in this shard, which lacks it",
                           path, key);
                goto done;
            }
        }
    }
    for (size_t i = 0; i < n; i++) {
        const st_entry *e = &entries[i];
        char canon[96];
        if (!hf_to_canonical(&mf->arch, e->name, canon, sizeof canon)) {
            kv_log(KV_LOG_DEBUG, "%s: tensor '%s' is not used", path, e->name);
            continue;
        }
        if (strcmp(canon, "output.weight") == 0 && mf->arch.tied_embeddings) {
            kv_log(KV_LOG_DEBUG, "%s: embeddings are tied: '%s' is not used", path, e->name);
            continue;
        }
        if (e->kv_dtype < 0) {
            s = KV_ERR(KV_EUNSUPPORTED, "'%s': tensor '%s' has dtype %s; only F32, F16 and BF16 are supported",
                       path, e->name, e->dtype);
            goto done;
        }
        if (e->rank > 4) {
            s = KV_ERR(KV_EFORMAT, "'%s': tensor '%s' has %d dimensions (at most 4)", path, e->name, e->rank);
            goto done;
        }
        uint64_t ne[4] = {1, 1, 1, 1};
        for (int d = 0; d < e->rank; d++) ne[d] = e->shape[e->rank - 1 - d]; /* row-major -> GGML order */
        if ((s = kv_mf_add_tensor(mf, canon, e->name, e->kv_dtype, e->rank ? e->rank : 1, ne,
                                  data_start + e->begin, (size_t)(e->end - e->begin),
                                  map->data + data_start + e->begin)) != KV_OK)
            goto done;
        /* Gemma3RMSNorm multiplies by (1 + w) (modeling_gemma3.py:132); GGUF stores 1 + w (llama.cpp's
         * conversion/gemma.py:124-125,166-171), and so does what kv_model_file_read_f32 returns */
        if (strcmp(mf->arch.arch, "gemma3") == 0 && is_norm_weight(canon))
            kv_mf_set_shift(mf, kv_model_file_find(mf, canon), 1.0f);
    }
done:
    free(entries);
    json_decref(root);
    return s;
}

/* ---- the directory ------------------------------------------------------------------------------ */

static char *join(const char *dir, const char *name) {
    size_t a = strlen(dir), b = strlen(name);
    char *p = malloc(a + b + 2);
    if (!p) return NULL;
    memcpy(p, dir, a);
    p[a] = '/';
    memcpy(p + a + 1, name, b + 1);
    return p;
}

static int is_file(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(const char *const *)a, *(const char *const *)b); }

static kv_status open_shard(kv_model_file *mf, const char *name, const json_t *weight_map) {
    char *path = join(mf->path, name);
    if (!path) return KV_ERR(KV_ENOMEM, "out of memory");
    kv_file_map map;
    kv_status s = kv_mf_map_file(mf, path, &map);
    if (s == KV_OK) s = parse_file(mf, &map, path, weight_map, name);
    free(path);
    return s;
}

static kv_status open_sharded(kv_model_file *mf, const char *index_path) {
    char *text = NULL;
    size_t len = 0;
    const char **shards = NULL;
    json_t *root = NULL;
    kv_status s = kv_file_read_all(&text, &len, index_path);
    if (s != KV_OK) return s;
    json_error_t err;
    root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &err);
    if (!root) {
        s = KV_ERR(KV_EFORMAT, "'%s': invalid JSON (line %d, column %d): %s", index_path, err.line,
                   err.column, err.text);
        goto done;
    }
    const json_t *wm = json_object_get(root, "weight_map");
    if (!json_is_object(wm) || json_object_size(wm) == 0) {
        s = KV_ERR(KV_EFORMAT, "'%s': no \"weight_map\" object", index_path);
        goto done;
    }
    shards = calloc(json_object_size(wm), sizeof *shards);
    if (!shards) {
        s = KV_ERR(KV_ENOMEM, "out of memory");
        goto done;
    }
    size_t n = 0;
    const char *key;
    json_t *val;
    json_object_foreach((json_t *)wm, key, val) {
        const char *f = json_string_value(val);
        /* Shards live beside the index: no paths, so an index cannot point elsewhere. */
        if (!f || !*f || strchr(f, '/') || strcmp(f, ".") == 0 || strcmp(f, "..") == 0) {
            s = KV_ERR(KV_EFORMAT, "'%s': weight_map entry '%s' must name a file in the same directory",
                       index_path, key);
            goto done;
        }
        shards[n++] = f;
    }
    qsort(shards, n, sizeof *shards, cmp_str);
    for (size_t i = 0; i < n && s == KV_OK; i++)
        if (i == 0 || strcmp(shards[i], shards[i - 1]) != 0) s = open_shard(mf, shards[i], wm);
done:
    free(shards);
    json_decref(root);
    free(text);
    return s;
}

kv_status kv_mf_open_hf(kv_model_file *mf) {
    char *cfg = join(mf->path, "config.json");
    char *index = join(mf->path, "model.safetensors.index.json");
    char *text = NULL;
    size_t len = 0;
    kv_status s = KV_OK;
    if (!cfg || !index) {
        s = KV_ERR(KV_ENOMEM, "out of memory");
        goto done;
    }
    if (!is_file(cfg)) {
        s = KV_ERR(KV_ENOTFOUND, "'%s' is a directory without config.json (not an HF model directory)",
                   mf->path);
        goto done;
    }
    if ((s = kv_file_read_all(&text, &len, cfg)) != KV_OK) goto done;
    if ((s = kv_hf_config_parse(&mf->arch, text, len, cfg)) != KV_OK) goto done;
    kv_mf_basename(mf->arch.name, sizeof mf->arch.name, mf->path);
    if (is_file(index)) {
        s = open_sharded(mf, index);
    } else {
        char *single = join(mf->path, "model.safetensors");
        if (!single) {
            s = KV_ERR(KV_ENOMEM, "out of memory");
        } else if (!is_file(single)) {
            s = KV_ERR(KV_ENOTFOUND, "'%s': no model.safetensors or model.safetensors.index.json", mf->path);
        } else {
            s = open_shard(mf, "model.safetensors", NULL);
        }
        free(single);
    }
done:
    free(text);
    free(cfg);
    free(index);
    return s;
}
