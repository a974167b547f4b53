/* export_hf.c — a plan's FP8 / NVFP4 KV scales in the forms serving engines read from a Hugging Face
 * checkpoint (kvcal export; kernels/FLOAT_KV.md "Export"):
 *   - compressed-tensors (vLLM, SGLang): config.json gains quantization_config with quant_method
 *     "compressed-tensors" and kv_cache_scheme = QuantizationArgs {num_bits 8, type "float",
 *     symmetric true, dynamic false, strategy "tensor" (one scale per layer and stream) or
 *     "attn_head" (one per KV head), group_size null}; the scales are tensors
 *     model.layers.N.self_attn.k_scale / v_scale (F32, shape [] per tensor, [n_kv_heads] per head);
 *   - modelopt (TensorRT-LLM, vLLM, SGLang): hf_quant_config.json {"producer": {"name": "modelopt"},
 *     "quantization": {"quant_algo": null, "kv_cache_quant_algo": "FP8" | "NVFP4"}}, and the same
 *     tensors (F32, shape [], per tensor only: ModelOpt's KV scales are per tensor).
 * The output directory is a copy of the checkpoint: every file of HF_DIR copied, config.json rewritten
 * (compressed-tensors), the scales in kv_scales.safetensors, and model.safetensors.index.json (when
 * the checkpoint has one) extended with their names, so that loaders that follow the index find them.
 * Plans the formats cannot express are refused with the reason: streams that are not FP8 E4M3 /
 * NVFP4, AQUA-KV predictors, methods that differ between streams or layers (mixed bits), E5M2,
 * NVFP4 in compressed-tensors, per-head scales in modelopt. */
#include "kv_formats.h"

#include <dirent.h>
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static kv_status refuse(const char *fmt_name, const char *why) {
    return KV_ERR(KV_EUNSUPPORTED, "the %s format cannot express this plan: %s", fmt_name, why);
}

kv_status kv_export_check(const kv_plan *p, kv_export_format f) {
    const char *fn = f == KV_EXPORT_MODELOPT ? "modelopt" : "compressed-tensors";
    const kv_plan_stream *s0 = &p->layers[0].stream[KV_PLAN_K];
    char why[256];
    for (int l = 0; l < p->n_layers; l++) /* predictors first: an AQUA-KV plan is named as such */
        for (int st = 0; st < 2; st++)
            if (p->layers[l].stream[st].predictor) {
                snprintf(why, sizeof why, "layer %d %s has an AQUA-KV predictor (engines store keys and values "
                         "themselves, not residuals)", l, st ? "V" : "K");
                return refuse(fn, why);
            }
    for (int l = 0; l < p->n_layers; l++)
        for (int st = 0; st < 2; st++) {
            const kv_plan_stream *s = &p->layers[l].stream[st];
            const char *sn = st ? "V" : "K";
            if (s->method != KV_PLAN_FP8_E4M3 && s->method != KV_PLAN_FP8_E5M2 && s->method != KV_PLAN_NVFP4) {
                snprintf(why, sizeof why, "layer %d %s is %s (%d bits): only FP8 / NVFP4 KV caches can be exported", l,
                         sn, kv_plan_method_name(s->method), s->bits);
                return refuse(fn, why);
            }
            if (s->method != s0->method || s->n_fp_scales != s0->n_fp_scales) {
                snprintf(why, sizeof why, "layer %d %s is %s with %d scale(s), layer 0 K %s with %d: one KV cache "
                         "format for the whole model (mixed bits or granularity)", l, sn, kv_plan_method_name(s->method),
                         s->n_fp_scales, kv_plan_method_name(s0->method), s0->n_fp_scales);
                return refuse(fn, why);
            }
            if (s->pre_rope) {
                snprintf(why, sizeof why, "layer %d K is compressed before RoPE (engines cache keys after RoPE)", l);
                return refuse(fn, why);
            }
        }
    if (s0->method == KV_PLAN_FP8_E5M2) return refuse(fn, "FP8 E5M2 (engines' FP8 KV scales are for E4M3)");
    if (f == KV_EXPORT_COMPRESSED_TENSORS && s0->method == KV_PLAN_NVFP4)
        return refuse(fn, "NVFP4 (its kv_cache_scheme is exported for FP8 E4M3 only; use --format modelopt)");
    if (f == KV_EXPORT_MODELOPT && s0->n_fp_scales > 1)
        return refuse(fn, "per-head scales (ModelOpt's KV scales are one per layer and stream; use "
                          "--format compressed-tensors or refit with --scale-granularity tensor)");
    return KV_OK;
}

/* The safetensors bytes of the scale tensors (header JSON padded with spaces to a multiple of 8). */
static kv_status scales_file(uint8_t **out, size_t *size, const kv_plan *p, json_t *index_map) {
    const int ns = p->layers[0].stream[0].n_fp_scales, L = p->n_layers;
    json_t *hdr = json_object();
    kv_status s = KV_OK;
    char *text = NULL;
    uint8_t *buf = NULL;
    if (!hdr) return KV_ERR(KV_ENOMEM, "out of memory");
    size_t off = 0;
    for (int l = 0; l < L; l++)
        for (int st = 0; st < 2; st++) {
            char name[96];
            snprintf(name, sizeof name, "model.layers.%d.self_attn.%s_scale", l, st ? "v" : "k");
            json_t *t = json_object(), *shape = json_array(), *offs = json_array();
            if (ns > 1) json_array_append_new(shape, json_integer(ns));
            json_array_append_new(offs, json_integer((json_int_t)off));
            json_array_append_new(offs, json_integer((json_int_t)(off + 4u * (size_t)ns)));
            json_object_set_new(t, "dtype", json_string("F32"));
            json_object_set_new(t, "shape", shape);
            json_object_set_new(t, "data_offsets", offs);
            json_object_set_new(hdr, name, t);
            if (index_map) json_object_set_new(index_map, name, json_string("kv_scales.safetensors"));
            off += 4u * (size_t)ns;
        }
    json_t *meta = json_object();
    json_object_set_new(meta, "format", json_string("pt"));
    json_object_set_new(meta, "producer", json_string("kvcal export"));
    json_object_set_new(hdr, "__metadata__", meta);
    text = json_dumps(hdr, JSON_COMPACT | JSON_SORT_KEYS);
    if (!text) {
        s = KV_ERR(KV_ENOMEM, "out of memory");
        goto done;
    }
    const size_t hl = strlen(text), padded = (hl + 7) / 8 * 8;
    *size = 8 + padded + off;
    buf = malloc(*size);
    if (!buf) {
        s = KV_ERR(KV_ENOMEM, "out of memory");
        goto done;
    }
    kv_store_u64le(buf, (uint64_t)padded);
    memcpy(buf + 8, text, hl);
    memset(buf + 8 + hl, ' ', padded - hl);
    uint8_t *d = buf + 8 + padded;
    for (int l = 0; l < L; l++)
        for (int st = 0; st < 2; st++)
            for (int i = 0; i < ns; i++, d += 4) kv_store_f32le(d, p->layers[l].stream[st].fp_scales[i]);
    *out = buf;
    buf = NULL;
done:
    free(buf);
    free(text);
    json_decref(hdr);
    return s;
}

static kv_status write_json(const char *dir, const char *name, json_t *j) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    char *text = json_dumps(j, JSON_INDENT(2) | JSON_SORT_KEYS);
    if (!text) return KV_ERR(KV_ENOMEM, "out of memory");
    const size_t n = strlen(text);
    char *t2 = realloc(text, n + 2);
    if (!t2) {
        free(text);
        return KV_ERR(KV_ENOMEM, "out of memory");
    }
    t2[n] = '\n';
    t2[n + 1] = 0;
    kv_status s = kv_write_file_atomic(path, t2, n + 1);
    free(t2);
    return s;
}

static json_t *read_json(const char *dir, const char *name, kv_status *s) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    json_error_t e;
    json_t *j = json_load_file(path, 0, &e);
    if (!j) *s = KV_ERR(KV_EFORMAT, "%s: %s (line %d)", path, e.text, e.line);
    return j;
}

kv_status kv_export_hf(const kv_plan *p, const char *model_dir, kv_export_format f, const char *out_dir) {
    kv_status s = kv_export_check(p, f);
    json_t *cfg = NULL, *index = NULL;
    DIR *d = NULL;
    uint8_t *st = NULL;
    size_t st_size = 0;
    if (s != KV_OK) return s;
    if (!(cfg = read_json(model_dir, "config.json", &s))) return s;
    /* the plan's model: the architecture's sizes must match */
    const json_t *nl = json_object_get(cfg, "num_hidden_layers"), *nkv = json_object_get(cfg, "num_key_value_heads"),
                 *nh = json_object_get(cfg, "num_attention_heads");
    const long kvh = json_is_integer(nkv) ? (long)json_integer_value(nkv) : json_is_integer(nh) ? (long)json_integer_value(nh) : -1;
    if (!json_is_integer(nl) || json_integer_value(nl) != p->n_layers || kvh != p->fingerprint.n_kv_heads) {
        s = KV_ERR(KV_EMISMATCH, "%s/config.json: %lld layers and %ld KV heads, the plan is for %d layers and %d KV heads",
                   model_dir, json_is_integer(nl) ? (long long)json_integer_value(nl) : -1LL, kvh, p->n_layers,
                   p->fingerprint.n_kv_heads);
        goto done;
    }
    if (mkdir(out_dir, 0755) != 0 && errno != EEXIST) {
        s = KV_ERR(KV_EIO, "cannot create '%s': %s", out_dir, strerror(errno));
        goto done;
    }
    /* copy the checkpoint's files (config.json and the index are written below) */
    if (!(d = opendir(model_dir))) {
        s = KV_ERR(KV_EIO, "cannot read the directory '%s': %s", model_dir, strerror(errno));
        goto done;
    }
    for (struct dirent *e; (e = readdir(d)) && s == KV_OK;) {
        if (e->d_name[0] == '.' || strcmp(e->d_name, "config.json") == 0 ||
            strcmp(e->d_name, "model.safetensors.index.json") == 0 || strcmp(e->d_name, "kv_scales.safetensors") == 0 ||
            strcmp(e->d_name, "hf_quant_config.json") == 0)
            continue;
        char src[4096], dst[4096];
        snprintf(src, sizeof src, "%s/%s", model_dir, e->d_name);
        snprintf(dst, sizeof dst, "%s/%s", out_dir, e->d_name);
        struct stat sb;
        if (stat(src, &sb) != 0 || !S_ISREG(sb.st_mode)) continue;
        char *data = NULL;
        size_t n = 0;
        if ((s = kv_file_read_all(&data, &n, src)) == KV_OK) s = kv_write_file_atomic(dst, data, n);
        free(data);
    }
    if (s != KV_OK) goto done;
    {
        kv_status is = KV_OK;
        char ip[4096];
        snprintf(ip, sizeof ip, "%s/model.safetensors.index.json", model_dir);
        struct stat sb;
        if (stat(ip, &sb) == 0 && !(index = read_json(model_dir, "model.safetensors.index.json", &is))) {
            s = is;
            goto done;
        }
    }
    json_t *wmap = index ? json_object_get(index, "weight_map") : NULL;
    if ((s = scales_file(&st, &st_size, p, json_is_object(wmap) ? wmap : NULL)) != KV_OK) goto done;
    {
        char path[4096];
        snprintf(path, sizeof path, "%s/kv_scales.safetensors", out_dir);
        if ((s = kv_write_file_atomic(path, st, st_size)) != KV_OK) goto done;
    }
    if (index && (s = write_json(out_dir, "model.safetensors.index.json", index)) != KV_OK) goto done;
    const int ns = p->layers[0].stream[0].n_fp_scales;
    if (f == KV_EXPORT_COMPRESSED_TENSORS) {
        json_t *qa = json_object(), *qc = json_object();
        json_object_set_new(qa, "num_bits", json_integer(8));
        json_object_set_new(qa, "type", json_string("float"));
        json_object_set_new(qa, "symmetric", json_true());
        json_object_set_new(qa, "dynamic", json_false());
        json_object_set_new(qa, "strategy", json_string(ns > 1 ? "attn_head" : "tensor"));
        json_object_set_new(qa, "group_size", json_null());
        json_object_set_new(qa, "block_structure", json_null());
        json_object_set_new(qa, "actorder", json_null());
        json_object_set_new(qa, "observer", json_string("minmax"));
        json_object_set_new(qa, "observer_kwargs", json_object());
        json_object_set_new(qc, "quant_method", json_string("compressed-tensors"));
        json_object_set_new(qc, "format", json_string("dense"));
        json_object_set_new(qc, "quantization_status", json_string("compressed"));
        json_object_set_new(qc, "config_groups", json_object());
        json_object_set_new(qc, "ignore", json_array());
        json_object_set_new(qc, "global_compression_ratio", json_null());
        json_object_set_new(qc, "kv_cache_scheme", qa);
        json_object_set_new(cfg, "quantization_config", qc);
    } else {
        json_t *h = json_object(), *prod = json_object(), *q = json_object();
        json_object_set_new(prod, "name", json_string("modelopt"));
        json_object_set_new(prod, "version", json_string("kvcal export"));
        json_object_set_new(q, "quant_algo", json_null());
        json_object_set_new(q, "kv_cache_quant_algo",
                            json_string(p->layers[0].stream[0].method == KV_PLAN_NVFP4 ? "NVFP4" : "FP8"));
        json_object_set_new(h, "producer", prod);
        json_object_set_new(h, "quantization", q);
        s = write_json(out_dir, "hf_quant_config.json", h);
        json_decref(h);
        if (s != KV_OK) goto done;
    }
    s = write_json(out_dir, "config.json", cfg);
done:
    if (d) closedir(d);
    free(st);
    json_decref(cfg);
    json_decref(index);
    return s;
}
