/* HF config.json -> kv_arch (llama, mistral, qwen2, qwen3, gemma3_text), with the defaults transformers uses
 * for fields a config leaves out. Parsed with jansson; duplicate keys are an error.
 *
 * Qwen3 and Gemma 3 follow transformers 5.24.0 (model/MODELS.md lists every choice): Qwen3Config
 * (models/qwen3/configuration_qwen3.py:61-96: head_dim 128, no attention bias, sliding windows only with
 * use_sliding_window), Qwen3Attention's QK-norm over head_dim (modeling_qwen3.py:229-230); Gemma3TextConfig
 * (models/gemma3/configuration_gemma3.py:73-158: the defaults, layer_types from sliding_window_pattern
 * (:105-111), rope_parameters per layer type with the global and local thetas 1e6 and 1e4 (:98, 132-158)),
 * Gemma3TextScaledWordEmbedding (modeling_gemma3.py:89-100, 468: sqrt(hidden_size)), Gemma3RMSNorm's
 * (1 + w) (:119-133), the attention's query_pre_attn_scalar^-0.5 and window (:290, 307), the decoder
 * layer's four norms (:367-370, 384-400), final logit softcapping (:617-620). */
#include "model_file_internal.h"

#include <jansson.h>
#include <limits.h>
#include <math.h>
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
    if (json_is_object(rs) && !json_object_get(rs, "rope_type") && !json_object_get(rs, "type")) return KV_OK;
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

/* "rope_parameters" (transformers 5): a flat {rope_type, rope_theta, factor...} or, for Gemma 3, one such object per
 * layer type ("full_attention", "sliding_attention"). The global layers' object gives rope_theta and the
 * scaling; the local layers' its theta (their scaling, if any, is refused: llama.cpp applies none to them). */
static kv_status parse_rope_parameters(kv_arch *a, const json_t *rp, const char *what) {
    if (!rp || json_is_null(rp)) return KV_OK;
    if (!json_is_object(rp)) return KV_ERR(KV_EFORMAT, "%s: \"rope_parameters\" must be an object or null", what);
    const json_t *full = json_object_get(rp, "full_attention"), *local = json_object_get(rp, "sliding_attention");
    kv_status s;
    if (full || local) {
        if ((full && !json_is_object(full)) || (local && !json_is_object(local)))
            return KV_ERR(KV_EFORMAT, "%s: \"rope_parameters\" per layer type must hold objects", what);
        if (full && ((s = get_num(full, "rope_theta", 0, a->rope_theta, &a->rope_theta, what)) ||
                     (s = parse_rope_scaling(a, full, what))))
            return s;
        if (local) {
            kv_arch tmp = *a;
            if ((s = get_num(local, "rope_theta", 0, a->rope_theta_local, &a->rope_theta_local, what)) ||
                (s = parse_rope_scaling(&tmp, local, what)))
                return s;
            if (tmp.rope_scaling != KV_ROPE_SCALING_NONE)
                return KV_ERR(KV_EUNSUPPORTED, "%s: RoPE scaling of the sliding-window layers is not supported", what);
        }
        return KV_OK;
    }
    if ((s = get_num(rp, "rope_theta", 0, a->rope_theta, &a->rope_theta, what))) return s;
    return parse_rope_scaling(a, rp, what);
}

/* Gemma 3's windows: layer_types (a list of "sliding_attention" / "full_attention") or else
 * sliding_window_pattern (Gemma3TextConfig.__post_init__: layer i local when (i + 1) % pattern != 0). kv_arch
 * holds a period, so a layer_types list must be periodic in that sense. */
static kv_status parse_gemma3_layers(kv_arch *a, const json_t *root, const char *what) {
    kv_status s;
    if ((s = get_int(root, "sliding_window", 0, 4096, &a->sliding_window, what)) ||
        (s = get_int(root, "sliding_window_pattern", 0, 6, &a->swa_pattern, what)))
        return s;
    if (a->sliding_window <= 0 || a->swa_pattern < 1)
        return KV_ERR(KV_EFORMAT, "%s: sliding_window (%d) and sliding_window_pattern (%d) must be positive", what,
                      a->sliding_window, a->swa_pattern);
    const json_t *lt = json_object_get(root, "layer_types");
    if (!lt || json_is_null(lt)) return KV_OK;
    if (!json_is_array(lt) || json_array_size(lt) != (size_t)a->n_layers)
        return KV_ERR(KV_EFORMAT, "%s: \"layer_types\" must list num_hidden_layers (%d) layer types", what,
                      a->n_layers);
    int first_global = -1, n_local = 0;
    for (int l = 0; l < a->n_layers; l++) {
        const char *t = json_string_value(json_array_get(lt, (size_t)l));
        const int local = t && strcmp(t, "sliding_attention") == 0;
        if (!t || (!local && strcmp(t, "full_attention") != 0))
            return KV_ERR(KV_EFORMAT, "%s: layer_types[%d] must be \"sliding_attention\" or \"full_attention\"",
                          what, l);
        if (!local && first_global < 0) first_global = l;
        n_local += local;
    }
    /* the period: every layer local (0), or the first global layer's index + 1 */
    a->swa_pattern = first_global < 0 ? 0 : first_global + 1;
    for (int l = 0; l < a->n_layers; l++) {
        const int local = strcmp(json_string_value(json_array_get(lt, (size_t)l)), "sliding_attention") == 0;
        if (local != kv_arch_layer_is_local(a, l))
            return KV_ERR(KV_EUNSUPPORTED, "%s: layer_types (%d local of %d) is not a repeating pattern of local layers "
                          "ending in a global one, which is all this build models", what, n_local, a->n_layers);
    }
    return KV_OK;
}

static kv_status parse(kv_arch *a, const json_t *root, const char *what) {
    if (!json_is_object(root)) return KV_ERR(KV_EFORMAT, "%s: not a JSON object", what);
    const json_t *mt = json_object_get(root, "model_type");
    if (!json_is_string(mt)) return KV_ERR(KV_EFORMAT, "%s: missing \"model_type\" string", what);
    const char *type = json_string_value(mt);
    int max_pos_default;
    const int gemma3 = strcmp(type, "gemma3_text") == 0, qwen3 = strcmp(type, "qwen3") == 0;
    if (strcmp(type, "llama") == 0) {
        max_pos_default = 2048;
    } else if (strcmp(type, "mistral") == 0) {
        max_pos_default = 4096 * 32;
    } else if (strcmp(type, "qwen2") == 0 || qwen3) {
        max_pos_default = 32768;
    } else if (gemma3) {
        max_pos_default = 131072;
    } else if (strcmp(type, "gemma3") == 0) {
        return KV_ERR(KV_EUNSUPPORTED, "%s: model_type 'gemma3' is the multimodal checkpoint; only the text model "
                      "(model_type 'gemma3_text', Gemma3ForCausalLM) is read", what);
    } else {
        return KV_ERR(KV_EUNSUPPORTED, "%s: model_type '%s' is not supported (llama, mistral, qwen2, qwen3, "
                      "gemma3_text)", what, type);
    }
    kv_mf_copy_str(a->arch, sizeof a->arch, gemma3 ? "gemma3" : type, strlen(gemma3 ? "gemma3" : type));
    const char *act_key = gemma3 ? "hidden_activation" : "hidden_act";
    const char *act_want = gemma3 ? "gelu_pytorch_tanh" : "silu";
    const json_t *act = json_object_get(root, act_key);
    if (act && !json_is_null(act) && !(json_is_string(act) && strcmp(json_string_value(act), act_want) == 0))
        return KV_ERR(KV_EUNSUPPORTED, "%s: %s '%s' is not supported (%s)", what, act_key,
                      json_is_string(act) ? json_string_value(act) : "?", act_want);
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
        (s = get_num(root, "rope_theta", 0, gemma3 ? 1e6f : 10000.0f, &a->rope_theta, what)) ||
        (s = get_bool(root, "tie_word_embeddings", gemma3, &a->tied_embeddings, what)) ||
        (s = get_bool(root, "attention_bias", 0, &attention_bias, what)) ||
        (s = get_bool(root, "mlp_bias", 0, &mlp_bias, what)) ||
        (s = get_token_id(root, "bos_token_id", &a->bos_id, what)) ||
        (s = get_token_id(root, "eos_token_id", &a->eos_id, what)) ||
        (s = parse_rope_scaling(a, json_object_get(root, "rope_scaling"), what)))
        return s;
    if (gemma3) {
        a->rope_theta_local = 10000.0f;
        if ((s = get_num(root, "rope_local_base_freq", 0, 10000.0f, &a->rope_theta_local, what))) return s;
    }
    if ((s = parse_rope_parameters(a, json_object_get(root, "rope_parameters"), what))) return s;
    if (a->n_heads < 1) return KV_ERR(KV_EFORMAT, "%s: num_attention_heads = %d must be positive", what, a->n_heads);
    const json_t *hd = json_object_get(root, "head_dim");
    if (hd && !json_is_null(hd)) {
        if ((s = get_int(root, "head_dim", 1, 0, &a->head_dim, what))) return s;
    } else if (gemma3 || qwen3) { /* Gemma3TextConfig / Qwen3Config: head_dim defaults to 256 / 128 */
        a->head_dim = gemma3 ? 256 : 128;
    } else if (a->d_model % a->n_heads != 0) {
        return KV_ERR(KV_EFORMAT, "%s: hidden_size %d is not a multiple of num_attention_heads %d", what,
                      a->d_model, a->n_heads);
    } else {
        a->head_dim = a->d_model / a->n_heads;
    }
    /* Llama's attention_bias also puts a bias on o_proj, which the forward does not have (so do Qwen3's and
     * Gemma 3's). */
    if ((strcmp(type, "llama") == 0 || gemma3 || qwen3) && attention_bias)
        return KV_ERR(KV_EUNSUPPORTED, "%s: attention_bias (with an o_proj bias) is not supported", what);
    if (mlp_bias) return KV_ERR(KV_EUNSUPPORTED, "%s: mlp_bias is not supported", what);
    a->qkv_bias = strcmp(type, "qwen2") == 0;
    a->rope_layout = KV_ROPE_HALF;
    a->qk_norm = gemma3 || qwen3;
    if (gemma3) {
        float qpas = 256.0f, attn_softcap = 0.0f;
        int bidir = 0;
        if ((s = get_num(root, "query_pre_attn_scalar", 0, 256.0f, &qpas, what)) ||
            (s = get_num(root, "final_logit_softcapping", 0, 0.0f, &a->final_logit_softcap, what)) ||
            (s = get_num(root, "attn_logit_softcapping", 0, 0.0f, &attn_softcap, what)) ||
            (s = get_bool(root, "use_bidirectional_attention", 0, &bidir, what)) ||
            (s = parse_gemma3_layers(a, root, what)))
            return s;
        if (!(qpas > 0.0f)) return KV_ERR(KV_EFORMAT, "%s: query_pre_attn_scalar = %g must be positive", what, (double)qpas);
        if (attn_softcap != 0.0f)
            return KV_ERR(KV_EUNSUPPORTED, "%s: attn_logit_softcapping is not supported", what);
        if (bidir) return KV_ERR(KV_EUNSUPPORTED, "%s: use_bidirectional_attention is not supported", what);
        a->post_norms = 1;
        a->ffn_act = KV_FFN_GELU_TANH;
        a->embed_scale = sqrtf((float)a->d_model);
        a->attn_scale = (float)(1.0 / sqrt((double)qpas));
        return KV_OK;
    }
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
