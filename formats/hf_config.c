/* HF config.json -> kv_arch (llama, mistral, qwen2), with the defaults transformers uses for
 * fields a config leaves out. Parsed with jansson; duplicate keys are an error. */
#include "model_file_internal.h"

#include <jansson.h>
#include <limits.h>
#include <string.h>

/* An integer field; absent or null gives dflt unless required. */
static kv_status get_int(const json_t *root, const char *key, int required, int dflt, int *out,
                         const char *what) {
    const json_t *v = json_object_get(root, key);
    if (!v || json_is_null(v)) {
        if (required) return KV_ERR(KV_EFORMAT, "%s: missing \"%s\"", what, key);
        *out = dflt;
        return KV_OK;
    }
    if (!json_is_integer(v)) return KV_ERR(KV_EFORMAT, "%s: \"%s\" must be an integer", what, key);
    json_int_t x = json_integer_value(v);
    if (x < INT_MIN || x > INT_MAX)
        return KV_ERR(KV_EFORMAT, "%s: \"%s\" = %lld is out of range", what, key, (long long)x);
    *out = (int)x;
    return KV_OK;
}

static kv_status get_num(const json_t *root, const char *key, int required, float dflt, float *out,
                         const char *what) {
    const json_t *v = json_object_get(root, key);
    if (!v || json_is_null(v)) {
        if (required) return KV_ERR(KV_EFORMAT, "%s: missing \"%s\"", what, key);
        *out = dflt;
        return KV_OK;
    }
    if (!json_is_number(v)) return KV_ERR(KV_EFORMAT, "%s: \"%s\" must be a number", what, key);
    *out = (float)json_number_value(v);
    return KV_OK;
}

static kv_status get_bool(const json_t *root, const char *key, int dflt, int *out, const char *what) {
    const json_t *v = json_object_get(root, key);
    if (!v || json_is_null(v)) {
        *out = dflt;
        return KV_OK;
    }
    if (!json_is_boolean(v)) return KV_ERR(KV_EFORMAT, "%s: \"%s\" must be true or false", what, key);
    *out = json_is_true(v);
    return KV_OK;
}

/* bos/eos ids: an integer, a list of integers (the first is taken: Llama 3.1 lists several EOS
 * ids), or null/absent (-1). */
static kv_status get_token_id(const json_t *root, const char *key, int *out, const char *what) {
    const json_t *v = json_object_get(root, key);
    if (json_is_array(v)) v = json_array_get(v, 0); /* NULL when empty */
    *out = -1;
    if (!v || json_is_null(v)) return KV_OK;
    if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > INT_MAX)
        return KV_ERR(KV_EFORMAT, "%s: \"%s\" must be a token id or a list of them", what, key);
    *out = (int)json_integer_value(v);
    return KV_OK;
}

static kv_status parse_rope_scaling(kv_arch *a, const json_t *rs, const char *what) {
    a->rope_scaling = KV_ROPE_SCALING_NONE;
    if (!rs || json_is_null(rs)) return KV_OK;
    if (!json_is_object(rs)) return KV_ERR(KV_EFORMAT, "%s: \"rope_scaling\" must be an object or null", what);
    const json_t *type = json_object_get(rs, "rope_type");
    if (!type) type = json_object_get(rs, "type");
    if (!json_is_string(type))
        return KV_ERR(KV_EFORMAT, "%s: \"rope_scaling\" has no \"rope_type\" / \"type\" string", what);
    const char *t = json_string_value(type);
    kv_status s;
    if (strcmp(t, "default") == 0) return KV_OK;
    if (strcmp(t, "linear") == 0) {
        a->rope_scaling = KV_ROPE_SCALING_LINEAR;
        return get_num(rs, "factor", 1, 0.0f, &a->rope_factor, what);
    }
    if (strcmp(t, "llama3") == 0) {
        a->rope_scaling = KV_ROPE_SCALING_LLAMA3;
        if ((s = get_num(rs, "factor", 1, 0.0f, &a->rope_factor, what)) ||
            (s = get_num(rs, "low_freq_factor", 1, 0.0f, &a->rope_low_freq_factor, what)) ||
            (s = get_num(rs, "high_freq_factor", 1, 0.0f, &a->rope_high_freq_factor, what)) ||
            (s = get_int(rs, "original_max_position_embeddings", 1, 0, &a->rope_orig_max_pos, what)))
            return s;
        return KV_OK;
    }
    return KV_ERR(KV_EUNSUPPORTED, "%s: rope_scaling type '%s' is not supported (default, linear, llama3)",
                  what, t);
}

static kv_status parse(kv_arch *a, const json_t *root, const char *what) {
    if (!json_is_object(root)) return KV_ERR(KV_EFORMAT, "%s: not a JSON object", what);
    const json_t *mt = json_object_get(root, "model_type");
    if (!json_is_string(mt)) return KV_ERR(KV_EFORMAT, "%s: missing \"model_type\" string", what);
    const char *type = json_string_value(mt);
    int max_pos_default;
    if (strcmp(type, "llama") == 0) {
        max_pos_default = 2048;
    } else if (strcmp(type, "mistral") == 0) {
        max_pos_default = 4096 * 32;
    } else if (strcmp(type, "qwen2") == 0) {
        max_pos_default = 32768;
    } else {
        return KV_ERR(KV_EUNSUPPORTED, "%s: model_type '%s' is not supported (llama, mistral, qwen2)", what,
                      type);
    }
    kv_mf_copy_str(a->arch, sizeof a->arch, type, strlen(type));
    const json_t *act = json_object_get(root, "hidden_act");
    if (act && !json_is_null(act) && !(json_is_string(act) && strcmp(json_string_value(act), "silu") == 0))
        return KV_ERR(KV_EUNSUPPORTED, "%s: hidden_act '%s' is not supported (silu)", what,
                      json_is_string(act) ? json_string_value(act) : "?");
    kv_status s;
    int attention_bias = 0, mlp_bias = 0;
    if ((s = get_int(root, "hidden_size", 1, 0, &a->d_model, what)) ||
        (s = get_int(root, "num_hidden_layers", 1, 0, &a->n_layers, what)) ||
        (s = get_int(root, "num_attention_heads", 1, 0, &a->n_heads, what)) ||
        (s = get_int(root, "num_key_value_heads", 0, a->n_heads, &a->n_kv_heads, what)) ||
        (s = get_int(root, "intermediate_size", 1, 0, &a->d_ff, what)) ||
        (s = get_int(root, "vocab_size", 0, 0, &a->vocab_size, what)) ||
        (s = get_int(root, "max_position_embeddings", 0, max_pos_default, &a->max_seq_len, what)) ||
        (s = get_num(root, "rms_norm_eps", 0, 1e-6f, &a->rms_eps, what)) ||
        (s = get_num(root, "rope_theta", 0, 10000.0f, &a->rope_theta, what)) ||
        (s = get_bool(root, "tie_word_embeddings", 0, &a->tied_embeddings, what)) ||
        (s = get_bool(root, "attention_bias", 0, &attention_bias, what)) ||
        (s = get_bool(root, "mlp_bias", 0, &mlp_bias, what)) ||
        (s = get_token_id(root, "bos_token_id", &a->bos_id, what)) ||
        (s = get_token_id(root, "eos_token_id", &a->eos_id, what)) ||
        (s = parse_rope_scaling(a, json_object_get(root, "rope_scaling"), what)))
        return s;
    if (a->n_heads < 1) return KV_ERR(KV_EFORMAT, "%s: num_attention_heads = %d must be positive", what, a->n_heads);
    const json_t *hd = json_object_get(root, "head_dim");
    if (hd && !json_is_null(hd)) {
        if ((s = get_int(root, "head_dim", 1, 0, &a->head_dim, what))) return s;
    } else if (a->d_model % a->n_heads != 0) {
        return KV_ERR(KV_EFORMAT, "%s: hidden_size %d is not a multiple of num_attention_heads %d", what,
                      a->d_model, a->n_heads);
    } else {
        a->head_dim = a->d_model / a->n_heads;
    }
    /* Llama's attention_bias also puts a bias on o_proj, which the forward does not have. */
    if (strcmp(type, "llama") == 0 && attention_bias)
        return KV_ERR(KV_EUNSUPPORTED, "%s: attention_bias (with an o_proj bias) is not supported", what);
    if (mlp_bias) return KV_ERR(KV_EUNSUPPORTED, "%s: mlp_bias is not supported", what);
    a->qkv_bias = strcmp(type, "qwen2") == 0;
    a->rope_layout = KV_ROPE_HALF;
    const json_t *sw = json_object_get(root, "sliding_window");
    const json_t *use_sw = json_object_get(root, "use_sliding_window");
    if (json_is_integer(sw) && json_integer_value(sw) < a->max_seq_len && !json_is_false(use_sw))
        kv_log(KV_LOG_WARN, "%s: sliding-window attention (%lld) is not modeled: attention is full "
                            "beyond the window", what, (long long)json_integer_value(sw));
    return KV_OK;
}

kv_status kv_hf_config_parse(kv_arch *arch, const char *text, size_t len, const char *what) {
    json_error_t err;
    json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &err);
    if (!root)
        return KV_ERR(KV_EFORMAT, "%s: invalid JSON (line %d, column %d): %s", what, err.line, err.column,
                      err.text);
    kv_status s = parse(arch, root, what);
    json_decref(root);
    return s;
}
