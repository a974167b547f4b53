/* export_hf.c — a plan's FP8 / NVFP4 KV scales in the forms serving engines and their loaders read
 * from a Hugging Face checkpoint (kvcal export; kernels/FLOAT_KV.md "Export" cites the engines' code
 * for each point):
 *   - compressed-tensors (vLLM, SGLang, transformers + compressed-tensors): config.json's
 *     quantization_config (quant_method "compressed-tensors") gains kv_cache_scheme = QuantizationArgs
 *     {num_bits 8, type "float", symmetric, dynamic false, strategy "tensor" (one scale per layer and
 *     stream) or "attn_head" (one per KV head)}; the scales are model.layers.N.self_attn.k_scale /
 *     v_scale with the shape compressed-tensors registers on the attention module, (1,) for "tensor"
 *     and (num_kv_heads, 1, 1) for "attn_head", in the model's dtype (config.json torch_dtype / dtype:
 *     float32, float16 or bfloat16; rounded to nearest, as loading into the registered parameter would);
 *   - modelopt (TensorRT-LLM, vLLM, SGLang): model.layers.N.self_attn.k_proj.k_scale /
 *     v_proj.v_scale, float32 scalars (shape []), hf_quant_config.json {"producer", "quantization":
 *     {"quant_algo", "kv_cache_quant_algo": "FP8" | "NVFP4"}} and config.json's quantization_config
 *     with quant_method "modelopt" and kv_cache_scheme, as ModelOpt's unified HF export writes them.
 * The checkpoint's own quantization metadata is kept: a compressed-tensors quantization_config is
 * extended (its config_groups, format and ignore list stay), a ModelOpt one keeps its quant_algo; a
 * quantization_config of another method is refused with the reason. Scale tensors the checkpoint
 * already has (either naming, kv_scale, KV zero points) are replaced, not left beside the new ones.
 *
 * The output is a new directory: every regular file at the top of HF_DIR is copied in bounded blocks
 * into a temporary directory beside --out (safetensors files that hold old scales rewritten without
 * them; a single-file checkpoint's model.safetensors rewritten with the new scales appended, since
 * loaders read model.safetensors alone when it exists; a sharded one gets kv_scales.safetensors and an
 * extended index), each file fsync'd, and the directory renamed to --out at the end: a failure leaves
 * no output. The JSON files and safetensors headers are read with a cap (KV_EXPORT_JSON_MAX).
 * Plans the formats cannot express are refused with the reason: streams that are not FP8 E4M3 /
 * NVFP4, AQUA-KV predictors, methods that differ between streams or layers (mixed bits), E5M2, NVFP4 in
 * compressed-tensors, per-head scales in modelopt; and checkpoints whose config.json does not describe
 * the plan's model (layers, hidden size, heads, KV heads, head dim, vocabulary, RoPE theta). */
#define _POSIX_C_SOURCE 200809L
#define _DEFAULT_SOURCE /* mkdtemp */
#include "kv_formats.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define COPY_BLOCK (1u << 20) /* bytes per read/write when copying */

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

/* ---- small helpers ------------------------------------------------------------------------------ */
static char *join(const char *dir, const char *name) {
    const size_t n = strlen(dir) + strlen(name) + 2;
    char *p = malloc(n);
    if (p) snprintf(p, n, "%s/%s", dir, name);
    return p;
}

/* dir/name as JSON, at most KV_EXPORT_JSON_MAX bytes. optional: a missing file gives *out = NULL. */
static kv_status read_json(json_t **out, const char *dir, const char *name, int optional) {
    *out = NULL;
    char *path = join(dir, name), *text = NULL;
    size_t n = 0;
    if (!path) return KV_ERR(KV_ENOMEM, "out of memory");
    struct stat sb;
    kv_status s = KV_OK;
    if (optional && lstat(path, &sb) != 0 && errno == ENOENT) goto done;
    if ((s = kv_file_read_bounded(&text, &n, path, KV_EXPORT_JSON_MAX)) != KV_OK) goto done;
    json_error_t e;
    if (!(*out = json_loadb(text, n, 0, &e))) s = KV_ERR(KV_EFORMAT, "%s: %s (line %d)", path, e.text, e.line);
    else if (!json_is_object(*out)) {
        s = KV_ERR(KV_EFORMAT, "%s: not a JSON object", path);
        json_decref(*out);
        *out = NULL;
    }
done:
    free(text);
    free(path);
    return s;
}

/* Is this tensor a KV-cache scale (or zero point) of an attention layer, in any naming the engines
 * read? Those of the checkpoint are replaced by the plan's. */
static int is_kv_scale_name(const char *name) {
    static const char *const suffixes[] = {".self_attn.k_scale",        ".self_attn.v_scale",
                                           ".self_attn.kv_scale",       ".self_attn.k_zero_point",
                                           ".self_attn.v_zero_point",   ".self_attn.k_proj.k_scale",
                                           ".self_attn.v_proj.v_scale", ".self_attn.attn.k_scale",
                                           ".self_attn.attn.v_scale"};
    const size_t n = strlen(name);
    for (size_t i = 0; i < sizeof suffixes / sizeof *suffixes; i++) {
        const size_t k = strlen(suffixes[i]);
        if (n > k && strcmp(name + n - k, suffixes[i]) == 0) return 1;
    }
    return 0;
}

/* config.json's integer `key` (in the text_config of a multimodal config when the top level lacks it). */
static long cfg_int(const json_t *cfg, const char *key) {
    const json_t *v = json_object_get(cfg, key);
    if (!v) {
        const json_t *tc = json_object_get(cfg, "text_config");
        if (json_is_object(tc)) v = json_object_get(tc, key);
    }
    return json_is_integer(v) ? (long)json_integer_value(v) : -1;
}

static double cfg_real(const json_t *cfg, const char *key) {
    const json_t *v = json_object_get(cfg, key);
    const json_t *tc = json_object_get(cfg, "text_config");
    if (!v && json_is_object(tc)) v = json_object_get(tc, key);
    return json_is_number(v) ? json_number_value(v) : NAN;
}

/* The plan's fingerprint against config.json: the checkpoint must be the plan's model. */
static kv_status check_model(const json_t *cfg, const kv_plan *p, const char *model_dir) {
    const kv_plan_fingerprint *fp = &p->fingerprint;
    const long layers = cfg_int(cfg, "num_hidden_layers"), hidden = cfg_int(cfg, "hidden_size"),
               heads = cfg_int(cfg, "num_attention_heads"), vocab = cfg_int(cfg, "vocab_size");
    long kvh = cfg_int(cfg, "num_key_value_heads"), hd = cfg_int(cfg, "head_dim");
    if (kvh < 0) kvh = heads;
    if (hd < 0 && heads > 0 && hidden > 0) hd = hidden / heads;
    const struct {
        const char *what;
        long got, want;
    } f[] = {{"num_hidden_layers", layers, fp->n_layers},   {"hidden_size", hidden, fp->d_model},
             {"num_attention_heads", heads, fp->n_heads},  {"num_key_value_heads", kvh, fp->n_kv_heads},
             {"head_dim", hd, fp->head_dim},               {"vocab_size", vocab, fp->vocab_size}};
    for (size_t i = 0; i < sizeof f / sizeof *f; i++) {
        if (f[i].got < 0)
            return KV_ERR(KV_EFORMAT, "%s/config.json has no integer %s: cannot tell whether the checkpoint is the "
                          "plan's model", model_dir, f[i].what);
        if (f[i].got != f[i].want)
            return KV_ERR(KV_EMISMATCH, "%s/config.json: %s %ld, the plan was fitted on a model with %ld (%d layers, "
                          "%d KV heads of %d): not the plan's model", model_dir, f[i].what, f[i].got, f[i].want,
                          fp->n_layers, fp->n_kv_heads, fp->head_dim);
    }
    /* RoPE theta: top level (transformers 4) or rope_parameters (transformers 5) */
    double theta = cfg_real(cfg, "rope_theta");
    const json_t *rp = json_object_get(cfg, "rope_parameters");
    if (isnan(theta) && json_is_object(rp)) theta = cfg_real(rp, "rope_theta");
    if (!isnan(theta) && fp->rope_theta > 0 && fabs(theta - fp->rope_theta) > 1e-5 * fp->rope_theta)
        return KV_ERR(KV_EMISMATCH, "%s/config.json: rope_theta %g, the plan's model has %g: not the plan's model",
                      model_dir, theta, (double)fp->rope_theta);
    return KV_OK;
}

/* ---- the scale tensors -------------------------------------------------------------------------- */
typedef struct scale_tensor {
    char name[96];
    int n_dims, shape[3];
    size_t off, size; /* in the scales' data */
} scale_tensor;

typedef struct scale_set {
    const char *dtype; /* "F32", "F16", "BF16" */
    int n;
    scale_tensor *t;
    uint8_t *data;
    size_t size;
} scale_set;

static void scale_set_free(scale_set *s) {
    free(s->t);
    free(s->data);
    memset(s, 0, sizeof *s);
}

static kv_status make_scales(scale_set *out, const kv_plan *p, kv_export_format f, const char *dtype) {
    memset(out, 0, sizeof *out);
    const int ns = p->layers[0].stream[0].n_fp_scales, L = p->n_layers;
    const size_t esize = strcmp(dtype, "F32") == 0 ? 4 : 2;
    out->dtype = dtype;
    out->n = 2 * L;
    out->t = calloc((size_t)out->n, sizeof *out->t);
    out->size = (size_t)out->n * (size_t)ns * esize;
    out->data = malloc(out->size ? out->size : 1);
    if (!out->t || !out->data) {
        scale_set_free(out);
        return KV_ERR(KV_ENOMEM, "out of memory");
    }
    size_t off = 0;
    for (int l = 0; l < L; l++)
        for (int st = 0; st < 2; st++) {
            scale_tensor *t = &out->t[2 * l + st];
            const char k = st ? 'v' : 'k';
            if (f == KV_EXPORT_MODELOPT) { /* float32 scalars under k_proj / v_proj */
                snprintf(t->name, sizeof t->name, "model.layers.%d.self_attn.%c_proj.%c_scale", l, k, k);
                t->n_dims = 0;
            } else if (ns > 1) { /* compressed-tensors attn_head: (num_kv_heads, 1, 1) */
                snprintf(t->name, sizeof t->name, "model.layers.%d.self_attn.%c_scale", l, k);
                t->n_dims = 3;
                t->shape[0] = ns;
                t->shape[1] = t->shape[2] = 1;
            } else { /* compressed-tensors tensor: (1,) */
                snprintf(t->name, sizeof t->name, "model.layers.%d.self_attn.%c_scale", l, k);
                t->n_dims = 1;
                t->shape[0] = 1;
            }
            t->off = off;
            t->size = (size_t)ns * esize;
            for (int i = 0; i < ns; i++, off += esize) {
                const float v = p->layers[l].stream[st].fp_scales[i];
                if (esize == 4) kv_store_f32le(out->data + off, v);
                else {
                    const uint16_t h = strcmp(dtype, "BF16") == 0 ? kv_f32_to_bf16(v) : kv_f32_to_f16(v);
                    out->data[off] = (uint8_t)(h & 0xff);
                    out->data[off + 1] = (uint8_t)(h >> 8);
                }
            }
        }
    return KV_OK;
}

static json_t *scale_entry(const scale_set *s, const scale_tensor *t, uint64_t base) {
    json_t *e = json_object(), *shape = json_array(), *offs = json_array();
    for (int d = 0; d < t->n_dims; d++) json_array_append_new(shape, json_integer(t->shape[d]));
    json_array_append_new(offs, json_integer((json_int_t)(base + t->off)));
    json_array_append_new(offs, json_integer((json_int_t)(base + t->off + t->size)));
    json_object_set_new(e, "dtype", json_string(s->dtype));
    json_object_set_new(e, "shape", shape);
    json_object_set_new(e, "data_offsets", offs);
    return e;
}

/* ---- writing into the temporary directory -------------------------------------------------------- */
static kv_status write_all_fd(int fd, const void *data, size_t n, const char *path) {
    const uint8_t *b = data;
    while (n > 0) {
        const ssize_t w = write(fd, b, n);
        if (w < 0) {
            if (errno == EINTR) continue;
            return KV_ERR(KV_EIO, "cannot write '%s': %s", path, strerror(errno));
        }
        b += w;
        n -= (size_t)w;
    }
    return KV_OK;
}

static kv_status create_out(int *fd, const char *path) {
    *fd = open(path, O_WRONLY | O_CREAT | O_EXCL, 0644);
    if (*fd < 0) return KV_ERR(KV_EIO, "cannot create '%s': %s", path, strerror(errno));
    return KV_OK;
}

static kv_status finish_out(int fd, const char *path, kv_status s) {
    if (s == KV_OK && fsync(fd) != 0) s = KV_ERR(KV_EIO, "cannot fsync '%s': %s", path, strerror(errno));
    if (close(fd) != 0 && s == KV_OK) s = KV_ERR(KV_EIO, "cannot close '%s': %s", path, strerror(errno));
    return s;
}

static kv_status write_json(const char *dir, const char *name, const json_t *j) {
    char *path = join(dir, name);
    char *text = json_dumps(j, JSON_INDENT(2));
    kv_status s = KV_OK;
    int fd = -1;
    if (!path || !text) s = KV_ERR(KV_ENOMEM, "out of memory");
    else if ((s = create_out(&fd, path)) == KV_OK) {
        s = write_all_fd(fd, text, strlen(text), path);
        if (s == KV_OK) s = write_all_fd(fd, "\n", 1, path);
        s = finish_out(fd, path, s);
    }
    free(text);
    free(path);
    return s;
}

/* Copy `len` bytes at `off` of in_fd to out_fd through buf (COPY_BLOCK bytes). */
static kv_status copy_range(int out_fd, const char *out_path, int in_fd, const char *in_path, uint64_t off,
                            uint64_t len, uint8_t *buf) {
    while (len > 0) {
        const size_t want = len > COPY_BLOCK ? COPY_BLOCK : (size_t)len;
        const ssize_t got = pread(in_fd, buf, want, (off_t)off);
        if (got < 0 && errno == EINTR) continue;
        if (got < 0) return KV_ERR(KV_EIO, "error reading '%s': %s", in_path, strerror(errno));
        if (got == 0) return KV_ERR(KV_EFORMAT, "'%s' is shorter than its header says (truncated)", in_path);
        kv_status s = write_all_fd(out_fd, buf, (size_t)got, out_path);
        if (s != KV_OK) return s;
        off += (uint64_t)got;
        len -= (uint64_t)got;
    }
    return KV_OK;
}

static kv_status copy_file(const char *dst, const char *src, uint8_t *buf) {
    const int in = open(src, O_RDONLY);
    if (in < 0) return KV_ERR(KV_EIO, "cannot open '%s': %s", src, strerror(errno));
    struct stat sb;
    int out = -1;
    kv_status s = fstat(in, &sb) != 0 ? KV_ERR(KV_EIO, "cannot stat '%s': %s", src, strerror(errno)) : KV_OK;
    if (s == KV_OK && (s = create_out(&out, dst)) == KV_OK) {
        s = copy_range(out, dst, in, src, 0, (uint64_t)sb.st_size, buf);
        s = finish_out(out, dst, s);
    }
    close(in);
    return s;
}

/* ---- safetensors files ------------------------------------------------------------------------- */
typedef struct st_file {
    json_t *hdr;       /* the header object */
    uint64_t data_at;  /* byte offset of the data */
    uint64_t data_len; /* bytes of data the file holds */
    int n_scales;      /* KV scale tensors in it */
} st_file;

typedef struct st_range {
    const char *name;
    uint64_t b, e;
} st_range;

static int range_cmp(const void *a, const void *b) {
    const st_range *x = a, *y = b;
    return x->b < y->b ? -1 : x->b > y->b ? 1 : 0;
}

/* Read and check a safetensors header: every tensor's data_offsets inside the file. */
static kv_status st_read_header(st_file *f, int fd, const char *path) {
    memset(f, 0, sizeof *f);
    struct stat sb;
    uint8_t n8[8];
    if (fstat(fd, &sb) != 0) return KV_ERR(KV_EIO, "cannot stat '%s': %s", path, strerror(errno));
    if (sb.st_size < 8 || pread(fd, n8, 8, 0) != 8) return KV_ERR(KV_EFORMAT, "'%s' is not a safetensors file (too short)", path);
    const uint64_t hl = kv_load_u64le(n8), size = (uint64_t)sb.st_size;
    if (hl > KV_EXPORT_JSON_MAX || hl > size - 8)
        return KV_ERR(KV_EFORMAT, "'%s': header of %llu bytes (at most %u, and inside the file of %llu bytes)", path,
                      (unsigned long long)hl, (unsigned)KV_EXPORT_JSON_MAX, (unsigned long long)size);
    char *text = malloc(hl ? hl : 1);
    if (!text) return KV_ERR(KV_ENOMEM, "out of memory");
    kv_status s = KV_OK;
    if (pread(fd, text, hl, 8) != (ssize_t)hl) s = KV_ERR(KV_EIO, "error reading '%s'", path);
    json_error_t e;
    if (s == KV_OK && !(f->hdr = json_loadb(text, hl, 0, &e)))
        s = KV_ERR(KV_EFORMAT, "'%s': header: %s", path, e.text);
    free(text);
    if (s == KV_OK && !json_is_object(f->hdr)) s = KV_ERR(KV_EFORMAT, "'%s': the header is not a JSON object", path);
    f->data_at = 8 + hl;
    f->data_len = size - f->data_at;
    const char *name;
    json_t *v;
    json_t *hdr = s == KV_OK ? f->hdr : NULL; /* NULL: no entries */
    json_object_foreach(hdr, name, v) {
        if (strcmp(name, "__metadata__") == 0) continue;
        const json_t *o = json_object_get(v, "data_offsets");
        const json_t *b = json_array_get(o, 0), *en = json_array_get(o, 1);
        if (!json_is_integer(b) || !json_is_integer(en) || json_integer_value(b) < 0 ||
            json_integer_value(en) < json_integer_value(b) || (uint64_t)json_integer_value(en) > f->data_len) {
            s = KV_ERR(KV_EFORMAT, "'%s': tensor '%s' has data_offsets outside the file", path, name);
            break;
        }
        f->n_scales += is_kv_scale_name(name);
    }
    if (s != KV_OK) {
        json_decref(f->hdr);
        f->hdr = NULL;
    }
    return s;
}

/* Write dst: the tensors of src (header f) except KV scales, packed in their order in the file, then
 * the scales of `add` (NULL: none). *removed_bytes: the data bytes left out. */
static kv_status st_rewrite(const char *dst, const char *src, int in_fd, const st_file *f, const scale_set *add,
                            uint8_t *buf, uint64_t *removed_bytes) {
    *removed_bytes = 0;
    const size_t nt = json_object_size(f->hdr);
    st_range *r = calloc(nt ? nt : 1, sizeof *r);
    json_t *hdr = json_object();
    char *text = NULL;
    int out = -1;
    kv_status s = KV_OK;
    if (!r || !hdr) {
        s = KV_ERR(KV_ENOMEM, "out of memory");
        goto done;
    }
    size_t n = 0;
    const char *name;
    json_t *v;
    json_object_foreach(f->hdr, name, v) {
        if (strcmp(name, "__metadata__") == 0) {
            json_object_set(hdr, name, v);
            continue;
        }
        const json_t *o = json_object_get(v, "data_offsets");
        const uint64_t b = (uint64_t)json_integer_value(json_array_get(o, 0)), e = (uint64_t)json_integer_value(json_array_get(o, 1));
        if (is_kv_scale_name(name)) {
            *removed_bytes += e - b;
            continue;
        }
        r[n].name = name;
        r[n].b = b;
        r[n].e = e;
        n++;
    }
    qsort(r, n, sizeof *r, range_cmp);
    uint64_t off = 0;
    for (size_t i = 0; i < n; i++) {
        json_t *e = json_deep_copy(json_object_get(f->hdr, r[i].name)), *offs = json_array();
        json_array_append_new(offs, json_integer((json_int_t)off));
        json_array_append_new(offs, json_integer((json_int_t)(off + r[i].e - r[i].b)));
        json_object_set_new(e, "data_offsets", offs);
        json_object_set_new(hdr, r[i].name, e);
        off += r[i].e - r[i].b;
    }
    for (int i = 0; add && i < add->n; i++) json_object_set_new(hdr, add->t[i].name, scale_entry(add, &add->t[i], off));
    if (!(text = json_dumps(hdr, JSON_COMPACT))) {
        s = KV_ERR(KV_ENOMEM, "out of memory");
        goto done;
    }
    const size_t hl = strlen(text), padded = (hl + 7) / 8 * 8;
    uint8_t n8[8];
    kv_store_u64le(n8, (uint64_t)padded);
    if ((s = create_out(&out, dst)) != KV_OK) goto done;
    s = write_all_fd(out, n8, 8, dst);
    if (s == KV_OK) s = write_all_fd(out, text, hl, dst);
    for (size_t i = hl; s == KV_OK && i < padded; i++) s = write_all_fd(out, " ", 1, dst);
    for (size_t i = 0; s == KV_OK && i < n; i++)
        s = copy_range(out, dst, in_fd, src, f->data_at + r[i].b, r[i].e - r[i].b, buf);
    if (s == KV_OK && add) s = write_all_fd(out, add->data, add->size, dst);
    s = finish_out(out, dst, s);
done:
    free(text);
    json_decref(hdr);
    free(r);
    return s;
}

/* The scales alone as a safetensors file. */
static kv_status st_write_scales(const char *dst, const scale_set *sc) {
    json_t *hdr = json_object(), *meta = json_object();
    json_object_set_new(meta, "format", json_string("pt"));
    json_object_set_new(meta, "producer", json_string("kvcal export"));
    json_object_set_new(hdr, "__metadata__", meta);
    for (int i = 0; i < sc->n; i++) json_object_set_new(hdr, sc->t[i].name, scale_entry(sc, &sc->t[i], 0));
    char *text = json_dumps(hdr, JSON_COMPACT);
    json_decref(hdr);
    if (!text) return KV_ERR(KV_ENOMEM, "out of memory");
    const size_t hl = strlen(text), padded = (hl + 7) / 8 * 8;
    uint8_t n8[8];
    kv_store_u64le(n8, (uint64_t)padded);
    int out = -1;
    kv_status s = create_out(&out, dst);
    if (s == KV_OK) {
        s = write_all_fd(out, n8, 8, dst);
        if (s == KV_OK) s = write_all_fd(out, text, hl, dst);
        for (size_t i = hl; s == KV_OK && i < padded; i++) s = write_all_fd(out, " ", 1, dst);
        if (s == KV_OK) s = write_all_fd(out, sc->data, sc->size, dst);
        s = finish_out(out, dst, s);
    }
    free(text);
    return s;
}

/* ---- quantization metadata ---------------------------------------------------------------------- */
static json_t *ct_kv_scheme(int per_head) {
    json_t *qa = json_object();
    json_object_set_new(qa, "num_bits", json_integer(8));
    json_object_set_new(qa, "type", json_string("float"));
    json_object_set_new(qa, "symmetric", json_true());
    json_object_set_new(qa, "group_size", json_null());
    json_object_set_new(qa, "strategy", json_string(per_head ? "attn_head" : "tensor"));
    json_object_set_new(qa, "block_structure", json_null());
    json_object_set_new(qa, "dynamic", json_false());
    json_object_set_new(qa, "actorder", json_null());
    json_object_set_new(qa, "observer", json_string("minmax"));
    json_object_set_new(qa, "observer_kwargs", json_object());
    return qa;
}

static const char *quant_method_of(const json_t *qc) {
    const json_t *m = json_object_get(qc, "quant_method");
    return json_is_string(m) ? json_string_value(m) : "(none)";
}

/* config.json's quantization_config (and for modelopt hf_quant_config.json, *hq) for the export;
 * the checkpoint's own entries kept, another method's refused. */
static kv_status quant_metadata(json_t *cfg, json_t **hq, const kv_plan *p, kv_export_format f, const char *model_dir) {
    json_t *qc = json_object_get(cfg, "quantization_config");
    const int ns = p->layers[0].stream[0].n_fp_scales;
    const int nvfp4 = p->layers[0].stream[0].method == KV_PLAN_NVFP4;
    if (qc && !json_is_object(qc))
        return KV_ERR(KV_EFORMAT, "%s/config.json: quantization_config is not an object", model_dir);
    if (f == KV_EXPORT_COMPRESSED_TENSORS) {
        if (*hq)
            return KV_ERR(KV_EUNSUPPORTED, "%s has hf_quant_config.json (a ModelOpt checkpoint): a compressed-tensors "
                          "kv_cache_scheme would not be read beside it; use --format modelopt", model_dir);
        if (qc && strcmp(quant_method_of(qc), "compressed-tensors") != 0)
            return KV_ERR(KV_EUNSUPPORTED, "%s/config.json already has a quantization_config with quant_method '%s': a "
                          "compressed-tensors kv_cache_scheme cannot be added to it without dropping the weights' "
                          "quantization (export into the unquantized or a compressed-tensors checkpoint%s)", model_dir,
                          quant_method_of(qc), strncmp(quant_method_of(qc), "modelopt", 8) == 0 ? ", or use --format modelopt" : "");
        if (!qc) {
            qc = json_object();
            json_object_set_new(qc, "quant_method", json_string("compressed-tensors"));
            json_object_set_new(qc, "format", json_string("dense"));
            json_object_set_new(qc, "quantization_status", json_string("compressed"));
            json_object_set_new(qc, "config_groups", json_object());
            json_object_set_new(qc, "ignore", json_array());
            json_object_set_new(qc, "global_compression_ratio", json_null());
            json_object_set_new(cfg, "quantization_config", qc);
        } else if (json_object_get(qc, "kv_cache_scheme") && !json_is_null(json_object_get(qc, "kv_cache_scheme"))) {
            kv_log(KV_LOG_INFO, "export: the checkpoint's kv_cache_scheme is replaced by the plan's");
        }
        json_object_set_new(qc, "kv_cache_scheme", ct_kv_scheme(ns > 1));
        if (ns > 1)
            kv_log(KV_LOG_WARN, "export: per-head scales (kv_cache_scheme strategy attn_head): SGLang ignores this "
                   "scheme with a warning and keeps scale 1.0, and vLLM accepts it only on attention backends that "
                   "support per-head scales (FlashAttention 3); refit with --scale-granularity tensor for every engine "
                   "(kernels/FLOAT_KV.md)");
        return KV_OK;
    }
    /* modelopt */
    if (qc && strncmp(quant_method_of(qc), "modelopt", 8) != 0)
        return KV_ERR(KV_EUNSUPPORTED, "%s/config.json already has a quantization_config with quant_method '%s': "
                      "ModelOpt KV scales cannot be added to it without dropping the weights' quantization (export "
                      "into the unquantized or a ModelOpt checkpoint%s)", model_dir, quant_method_of(qc),
                      strcmp(quant_method_of(qc), "compressed-tensors") == 0 ? ", or use --format compressed-tensors" : "");
    json_t *q = NULL;
    if (*hq) {
        q = json_object_get(*hq, "quantization");
        if (!json_is_object(q))
            return KV_ERR(KV_EFORMAT, "%s/hf_quant_config.json has no \"quantization\" object", model_dir);
    } else {
        *hq = json_object();
        json_t *prod = json_object();
        json_object_set_new(prod, "name", json_string("modelopt"));
        json_object_set_new(prod, "version", json_string("kvcal export " KV_VERSION_STRING));
        json_object_set_new(*hq, "producer", prod);
        q = json_object();
        json_object_set_new(q, "quant_algo", qc && json_object_get(qc, "quant_algo")
                                                 ? json_deep_copy(json_object_get(qc, "quant_algo")) : json_null());
        json_object_set_new(*hq, "quantization", q);
    }
    json_object_set_new(q, "kv_cache_quant_algo", json_string(nvfp4 ? "NVFP4" : "FP8"));
    const json_t *algo = json_object_get(q, "quant_algo");
    if (!qc) { /* as ModelOpt's convert_hf_quant_config_format writes it */
        qc = json_object();
        const json_t *ex = json_object_get(q, "exclude_modules");
        json_object_set_new(qc, "ignore", json_is_array(ex) ? json_deep_copy(ex) : json_array());
        if (json_is_string(algo)) json_object_set_new(qc, "quant_algo", json_deep_copy(algo));
        const json_t *prod = json_object_get(*hq, "producer");
        if (prod) json_object_set_new(qc, "producer", json_deep_copy(prod));
        json_object_set_new(qc, "quant_method", json_string("modelopt"));
        json_object_set_new(cfg, "quantization_config", qc);
    }
    if (nvfp4) {
        json_object_set_new(qc, "kv_cache_scheme", json_string("NVFP4"));
    } else {
        json_t *ks = json_object();
        json_object_set_new(ks, "dynamic", json_false());
        json_object_set_new(ks, "num_bits", json_integer(8));
        json_object_set_new(ks, "type", json_string("float"));
        json_object_set_new(qc, "kv_cache_scheme", ks);
    }
    if (!json_is_string(algo) && !json_is_string(json_object_get(qc, "quant_algo")))
        kv_log(KV_LOG_WARN, "export: the checkpoint's weights are not ModelOpt-quantized (quant_algo null): TensorRT-LLM "
               "reads a KV-cache-only ModelOpt checkpoint, but vLLM's ModelOpt loader requires a quant_algo and refuses "
               "it; for vLLM use --format compressed-tensors (kernels/FLOAT_KV.md)");
    return KV_OK;
}

/* config.json's torch_dtype / dtype as a safetensors dtype (F32 when it says nothing we know). */
static const char *model_dtype(const json_t *cfg) {
    const json_t *d = json_object_get(cfg, "torch_dtype");
    if (!json_is_string(d)) d = json_object_get(cfg, "dtype");
    const char *s = json_is_string(d) ? json_string_value(d) : "";
    if (strcmp(s, "bfloat16") == 0) return "BF16";
    if (strcmp(s, "float16") == 0) return "F16";
    return "F32";
}

static int ends_with(const char *s, const char *suffix) {
    const size_t n = strlen(s), k = strlen(suffix);
    return n >= k && strcmp(s + n - k, suffix) == 0;
}

/* Remove every entry of our temporary directory, then the directory. */
static void remove_tmp_dir(const char *dir) {
    DIR *d = opendir(dir);
    if (d) {
        struct dirent *e;
        while ((e = readdir(d)) != NULL) {
            if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
            char *p = join(dir, e->d_name);
            if (p) unlink(p);
            free(p);
        }
        closedir(d);
    }
    rmdir(dir);
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

kv_status kv_export_hf(const kv_plan *p, const char *model_dir, kv_export_format f, const char *out_dir) {
    kv_status s = kv_export_check(p, f);
    json_t *cfg = NULL, *index = NULL, *hq = NULL;
    DIR *d = NULL;
    char **names = NULL, *tmp = NULL, *out = NULL;
    size_t n_names = 0;
    uint8_t *buf = NULL;
    scale_set sc;
    memset(&sc, 0, sizeof sc);
    int made_tmp = 0;
    if (s != KV_OK) return s;
    if ((s = read_json(&cfg, model_dir, "config.json", 0)) != KV_OK) return s;
    if ((s = check_model(cfg, p, model_dir)) != KV_OK) goto done;
    if ((s = read_json(&index, model_dir, "model.safetensors.index.json", 1)) != KV_OK) goto done;
    if ((s = read_json(&hq, model_dir, "hf_quant_config.json", 1)) != KV_OK) goto done;
    json_t *wmap = index ? json_object_get(index, "weight_map") : NULL;
    if (index && !json_is_object(wmap)) {
        s = KV_ERR(KV_EFORMAT, "%s/model.safetensors.index.json has no weight_map object", model_dir);
        goto done;
    }
    if ((s = quant_metadata(cfg, &hq, p, f, model_dir)) != KV_OK) goto done;
    if ((s = make_scales(&sc, p, f, f == KV_EXPORT_MODELOPT ? "F32" : model_dtype(cfg))) != KV_OK) goto done;

    /* the checkpoint's files, in name order */
    if (!(d = opendir(model_dir))) {
        s = KV_ERR(KV_EIO, "cannot read the directory '%s': %s", model_dir, strerror(errno));
        goto done;
    }
    size_t cap = 0;
    int single = 0, n_st = 0;
    for (struct dirent *e; (e = readdir(d)) != NULL;) {
        if (e->d_name[0] == '.') continue;
        char *src = join(model_dir, e->d_name);
        struct stat sb;
        const int regular = src && stat(src, &sb) == 0 && S_ISREG(sb.st_mode);
        free(src);
        if (!regular) continue;
        if (n_names == cap) {
            cap = cap ? 2 * cap : 64;
            char **nn = realloc(names, cap * sizeof *nn);
            if (!nn) {
                s = KV_ERR(KV_ENOMEM, "out of memory");
                goto done;
            }
            names = nn;
        }
        if (!(names[n_names] = malloc(strlen(e->d_name) + 1))) {
            s = KV_ERR(KV_ENOMEM, "out of memory");
            goto done;
        }
        strcpy(names[n_names++], e->d_name);
        if (ends_with(e->d_name, ".safetensors") && strcmp(e->d_name, "kv_scales.safetensors") != 0) n_st++;
        if (strcmp(e->d_name, "model.safetensors") == 0) single = 1;
    }
    closedir(d);
    d = NULL;
    if (n_names) qsort(names, n_names, sizeof *names, cmp_str);
    /* model.safetensors without an index: loaders read that file alone, so the scales go into it */
    single = single && !index;
    if (!single && !index && n_st > 0)
        kv_log(KV_LOG_WARN, "export: %s has %d safetensors files and no model.safetensors.index.json: the scales go to "
               "kv_scales.safetensors, which loaders that follow an index or model.safetensors will not read", model_dir,
               n_st);

    /* the temporary directory beside --out */
    {
        size_t n = strlen(out_dir);
        while (n > 1 && out_dir[n - 1] == '/') n--;
        if (!(out = malloc(n + 1)) || !(tmp = malloc(n + 32))) {
            s = KV_ERR(KV_ENOMEM, "out of memory");
            goto done;
        }
        memcpy(out, out_dir, n);
        out[n] = 0;
        snprintf(tmp, n + 32, "%s.kvcal-tmp-XXXXXX", out);
        if (!mkdtemp(tmp)) {
            s = KV_ERR(KV_EIO, "cannot create a temporary directory beside '%s': %s", out, strerror(errno));
            goto done;
        }
        made_tmp = 1;
    }
    if (!(buf = malloc(COPY_BLOCK))) {
        s = KV_ERR(KV_ENOMEM, "out of memory");
        goto done;
    }
    uint64_t removed_total = 0;
    for (size_t i = 0; i < n_names && s == KV_OK; i++) {
        const char *nm = names[i];
        if (strcmp(nm, "config.json") == 0 || strcmp(nm, "model.safetensors.index.json") == 0 ||
            strcmp(nm, "hf_quant_config.json") == 0)
            continue; /* written below */
        char *src = join(model_dir, nm), *dst = join(tmp, nm);
        if (!src || !dst) s = KV_ERR(KV_ENOMEM, "out of memory");
        if (s == KV_OK && ends_with(nm, ".safetensors")) {
            const int fd = open(src, O_RDONLY);
            st_file sf;
            memset(&sf, 0, sizeof sf);
            if (fd < 0) s = KV_ERR(KV_EIO, "cannot open '%s': %s", src, strerror(errno));
            else s = st_read_header(&sf, fd, src);
            if (s == KV_OK && strcmp(nm, "kv_scales.safetensors") == 0) {
                /* a previous export's scales: replaced; anything else in it would be lost */
                if ((size_t)sf.n_scales + (json_object_get(sf.hdr, "__metadata__") ? 1 : 0) != json_object_size(sf.hdr))
                    s = KV_ERR(KV_EUNSUPPORTED, "'%s' holds tensors other than KV scales: the exported scales would "
                               "replace it", src);
                removed_total += sf.data_len;
            } else if (s == KV_OK) {
                const int add = single && strcmp(nm, "model.safetensors") == 0;
                if (sf.n_scales || add) {
                    uint64_t removed = 0;
                    s = st_rewrite(dst, src, fd, &sf, add ? &sc : NULL, buf, &removed);
                    removed_total += removed;
                    if (s == KV_OK && sf.n_scales)
                        kv_log(KV_LOG_INFO, "export: %d KV scale tensor(s) of %s replaced by the plan's", sf.n_scales, nm);
                } else {
                    s = copy_file(dst, src, buf);
                }
            }
            json_decref(sf.hdr);
            if (fd >= 0) close(fd);
        } else if (s == KV_OK) {
            s = copy_file(dst, src, buf);
        }
        free(src);
        free(dst);
    }
    if (s != KV_OK) goto done;
    if (!single) {
        char *dst = join(tmp, "kv_scales.safetensors");
        s = dst ? st_write_scales(dst, &sc) : KV_ERR(KV_ENOMEM, "out of memory");
        free(dst);
        if (s != KV_OK) goto done;
    }
    if (index) { /* old scale names out, the new ones in kv_scales.safetensors */
        void *it = json_object_iter(wmap);
        while (it) {
            const char *k = json_object_iter_key(it);
            void *next = json_object_iter_next(wmap, it);
            if (is_kv_scale_name(k)) json_object_del(wmap, k);
            it = next;
        }
        for (int i = 0; i < sc.n; i++) json_object_set_new(wmap, sc.t[i].name, json_string("kv_scales.safetensors"));
        json_t *meta = json_object_get(index, "metadata"), *ts = json_object_get(meta, "total_size");
        if (json_is_integer(ts)) {
            const json_int_t v = json_integer_value(ts) - (json_int_t)removed_total + (json_int_t)sc.size;
            json_object_set_new(meta, "total_size", json_integer(v > 0 ? v : 0));
        }
        if ((s = write_json(tmp, "model.safetensors.index.json", index)) != KV_OK) goto done;
    }
    if (f == KV_EXPORT_MODELOPT && (s = write_json(tmp, "hf_quant_config.json", hq)) != KV_OK) goto done;
    if ((s = write_json(tmp, "config.json", cfg)) != KV_OK) goto done;
    {   /* the directory's entries on disk, then the directory in place of --out */
        const int dfd = open(tmp, O_RDONLY);
        if (dfd >= 0) {
            (void)fsync(dfd);
            close(dfd);
        }
        if (rename(tmp, out) != 0) {
            s = KV_ERR(KV_EIO, "cannot rename '%s' to '%s': %s", tmp, out, strerror(errno));
            goto done;
        }
        made_tmp = 0;
        char *slash = strrchr(out, '/');
        const char *parent = ".";
        if (slash) {
            if (slash == out) slash[1] = 0;
            else *slash = 0;
            parent = out;
        }
        const int pfd = open(parent, O_RDONLY);
        if (pfd >= 0) {
            (void)fsync(pfd);
            close(pfd);
        }
    }
done:
    if (made_tmp) remove_tmp_dir(tmp);
    if (d) closedir(d);
    for (size_t i = 0; i < n_names; i++) free(names[i]);
    free(names);
    free(tmp);
    free(out);
    free(buf);
    scale_set_free(&sc);
    json_decref(cfg);
    json_decref(index);
    json_decref(hq);
    return s;
}
