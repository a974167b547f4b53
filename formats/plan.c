/* The in-memory plan: creation, setters, validation (PLAN_FORMAT.md §6), bits per value (§9). */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "plan_internal.h"

/* ---- small helpers ---------------------------------------------------------------------------- */
char *kv_plan_strdup(const char *s) {
    if (!s) s = "";
    size_t n = strlen(s) + 1;
    char *d = malloc(n);
    if (d) memcpy(d, s, n);
    return d;
}

static float *dup_floats(const float *src, size_t n) {
    size_t bytes;
    if (kv_size_mul(&bytes, n, sizeof(float))) return NULL;
    float *d = malloc(bytes ? bytes : 1);
    if (!d) return NULL;
    if (src) memcpy(d, src, bytes);
    else memset(d, 0, bytes);
    return d;
}

int kv_plan_utf8_valid(const char *s, size_t n) {
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0;
    while (i < n) {
        const unsigned c = u[i];
        size_t len;
        unsigned min;
        if (c == 0) return 0;
        if (c < 0x80) {
            i++;
            continue;
        } else if ((c & 0xE0) == 0xC0) {
            len = 2, min = 0x80;
        } else if ((c & 0xF0) == 0xE0) {
            len = 3, min = 0x800;
        } else if ((c & 0xF8) == 0xF0) {
            len = 4, min = 0x10000;
        } else {
            return 0;
        }
        if (n - i < len) return 0;
        unsigned cp = c & (0x7Fu >> len);
        for (size_t k = 1; k < len; k++) {
            if ((u[i + k] & 0xC0) != 0x80) return 0;
            cp = (cp << 6) | (u[i + k] & 0x3Fu);
        }
        if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
        i += len;
    }
    return 1;
}

const char *kv_plan_axis_name(int a) {
    switch (a) {
    case KV_PLAN_GROUP_TOKENS: return "tokens";
    case KV_PLAN_GROUP_CHANNELS: return "channels";
    }
    return NULL;
}
const char *kv_plan_pack_name(int p) {
    switch (p) {
    case KV_PLAN_PACK_WORD: return "word";
    case KV_PLAN_PACK_3BIT_11: return "3bit-11";
    }
    return NULL;
}
const char *kv_plan_prune_name(int p) {
    switch (p) {
    case KV_PLAN_PRUNE_NONE: return "none";
    case KV_PLAN_PRUNE_STREAMINGLLM: return "streamingllm";
    case KV_PLAN_PRUNE_H2O: return "h2o";
    case KV_PLAN_PRUNE_SNAPKV: return "snapkv";
    case KV_PLAN_PRUNE_PYRAMIDKV: return "pyramidkv";
    }
    return NULL;
}
const char *kv_plan_stream_name(int s) {
    switch (s) {
    case KV_PLAN_K: return "K";
    case KV_PLAN_V: return "V";
    }
    return NULL;
}

/* ---- create / free ---------------------------------------------------------------------------- */
kv_status kv_plan_fingerprint_validate(const kv_plan_fingerprint *f) {
    /* §6.1 */
    if (f->n_layers < 1 || f->n_layers > KV_PLAN_MAX_LAYERS)
        return KV_ERR(KV_EFORMAT, "fingerprint: n_layers %d out of range [1, %d]", f->n_layers, KV_PLAN_MAX_LAYERS);
    if (f->d_model < 1 || f->d_model > (1 << 20))
        return KV_ERR(KV_EFORMAT, "fingerprint: d_model %d out of range [1, 1048576]", f->d_model);
    if (f->n_heads < 1 || f->n_heads > 4096)
        return KV_ERR(KV_EFORMAT, "fingerprint: n_heads %d out of range [1, 4096]", f->n_heads);
    if (f->n_kv_heads < 1 || f->n_kv_heads > f->n_heads || f->n_heads % f->n_kv_heads != 0)
        return KV_ERR(KV_EFORMAT, "fingerprint: n_kv_heads %d must divide n_heads %d", f->n_kv_heads, f->n_heads);
    if (f->head_dim < 1 || f->head_dim > 4096)
        return KV_ERR(KV_EFORMAT, "fingerprint: head_dim %d out of range [1, 4096]", f->head_dim);
    if (f->vocab_size < 1 || f->vocab_size > (1 << 24))
        return KV_ERR(KV_EFORMAT, "fingerprint: vocab_size %d out of range [1, 16777216]", f->vocab_size);
    if (!isfinite(f->rope_theta) || !(f->rope_theta > 0.0f))
        return KV_ERR(KV_EFORMAT, "fingerprint: rope_theta %g must be finite and > 0", (double)f->rope_theta);
    const char *nul = memchr(f->arch, '\0', sizeof f->arch);
    if (!nul) return KV_ERR(KV_EFORMAT, "fingerprint: arch is not NUL-terminated");
    for (const char *c = f->arch; c < nul; c++)
        if (*c < 0x20 || *c > 0x7E) return KV_ERR(KV_EFORMAT, "fingerprint: arch is not printable ASCII");
    return KV_OK;
}

static void stream_defaults(kv_plan_stream *s) {
    memset(s, 0, sizeof *s);
    s->method = KV_PLAN_FP;
    s->bits = 16;
    s->group_size = 0;
    s->group_axis = KV_PLAN_GROUP_TOKENS;
    s->scale_dtype = KV_DTYPE_F32;
    s->pack = KV_PLAN_PACK_WORD;
    s->share_codes_with_layer = -1;
    s->higgs_grid = -1;
}

kv_status kv_plan_create(kv_plan **out, const kv_plan_fingerprint *fp) {
    *out = NULL;
    if (!fp) return KV_ERR(KV_EINVAL, "kv_plan_create: no fingerprint");
    kv_status s = kv_plan_fingerprint_validate(fp);
    if (s != KV_OK) return kv_error_wrap(KV_EINVAL, "kv_plan_create: ");
    kv_plan *p = calloc(1, sizeof *p);
    if (!p) return KV_ERR(KV_ENOMEM, "out of memory creating a plan");
    p->fingerprint = *fp;
    p->global.sinks = 4;
    p->global.recent = 128;
    p->global.prune_method = KV_PLAN_PRUNE_NONE;
    p->global.prune_budget = 1.0f;
    p->global.prune_window = 32;
    p->global.prune_pool = 7;
    p->n_layers = fp->n_layers;
    p->layers = calloc((size_t)fp->n_layers, sizeof *p->layers);
    if (!p->layers) {
        kv_plan_free(p);
        return KV_ERR(KV_ENOMEM, "out of memory creating a plan of %d layers", fp->n_layers);
    }
    for (int l = 0; l < p->n_layers; l++) {
        stream_defaults(&p->layers[l].stream[KV_PLAN_K]);
        stream_defaults(&p->layers[l].stream[KV_PLAN_V]);
    }
    *out = p;
    return KV_OK;
}

static void predictor_free(kv_plan_predictor *pr) {
    if (!pr) return;
    free(pr->left);
    free(pr->right);
    free(pr->qcodes);
    free(pr->qscale);
    free(pr->qoffset);
    free(pr->weight);
    free(pr->bias);
    free(pr);
}

static void squat_free(kv_plan_squat *sq) {
    if (!sq) return;
    free(sq->basis);
    free(sq);
}

/* An owned array copied: *dst = a copy of src's n floats (or bytes), NULL for a NULL src; 1 on success. */
static int copy_floats(float **dst, const float *src, size_t n) {
    *dst = src ? dup_floats(src, n) : NULL;
    return !src || *dst;
}

static int copy_bytes(uint8_t **dst, const uint8_t *src, size_t n) {
    *dst = src ? malloc(n ? n : 1) : NULL;
    if (*dst) memcpy(*dst, src, n);
    return !src || *dst;
}

/* A deep copy of a predictor (NULL when out of memory). */
static kv_plan_predictor *predictor_copy(const kv_plan_predictor *pr) {
    kv_plan_predictor *c = malloc(sizeof *c);
    if (!c) return NULL;
    *c = *pr;
    c->weight = c->bias = c->left = c->right = c->qscale = c->qoffset = NULL;
    c->qcodes = NULL;
    const size_t o = (size_t)pr->out_dim, in = (size_t)pr->in_dim, r = (size_t)(pr->rank > 0 ? pr->rank : 0);
    const size_t ng = pr->qgroup > 0 ? in / (size_t)pr->qgroup : 0;
    int ok = copy_floats(&c->weight, pr->weight, o * in) && copy_floats(&c->bias, pr->bias, o) &&
             copy_floats(&c->left, pr->left, o * r) && copy_floats(&c->right, pr->right, r * in) &&
             copy_bytes(&c->qcodes, pr->qcodes, o * in) && copy_floats(&c->qscale, pr->qscale, o * ng) &&
             copy_floats(&c->qoffset, pr->qoffset, o * ng);
    if (!ok) {
        predictor_free(c);
        return NULL;
    }
    return c;
}

/* A deep copy of SQuat parameters, the basis n_kv_heads x r x head_dim (NULL when out of memory). */
static kv_plan_squat *squat_copy(const kv_plan_squat *q, int n_kv_heads, int head_dim) {
    kv_plan_squat *c = malloc(sizeof *c);
    if (!c) return NULL;
    *c = *q;
    if (!copy_floats(&c->basis, q->basis, (size_t)n_kv_heads * (size_t)q->r * (size_t)head_dim)) {
        free(c);
        return NULL;
    }
    return c;
}

static void report_clear(kv_plan_report *r) {
    if (r->names)
        for (int i = 0; i < r->n_metrics; i++) free(r->names[i]);
    free(r->names);
    free(r->values);
    memset(r, 0, sizeof *r);
}

static void provenance_clear(kv_plan_provenance *v) {
    free(v->tool_version);
    free(v->git_hash);
    free(v->corpus_sha256);
    free(v->config_yaml);
    memset(v, 0, sizeof *v);
}

/* Everything a stream owns: its predictor, its SQuat parameters, its method's parameters (the codec's free). */
static void stream_release(kv_plan_stream *s) {
    predictor_free(s->predictor);
    squat_free(s->squat);
    const kv_plan_codec *codec = kv_plan_codec_of((int)s->method);
    if (codec && codec->free_params) codec->free_params(s);
    free(s->fp_scales); /* only a record that is not valid holds scales its method does not own */
    s->predictor = NULL, s->squat = NULL, s->fp_scales = NULL, s->n_fp_scales = 0;
}

void kv_plan_free(kv_plan *p) {
    if (!p) return;
    if (p->layers) {
        for (int l = 0; l < p->n_layers; l++)
            for (int st = 0; st < 2; st++) stream_release(&p->layers[l].stream[st]);
    }
    free(p->layers);
    if (p->grids)
        for (int g = 0; g < p->n_grids; g++) free(p->grids[g].points);
    free(p->grids);
    provenance_clear(&p->provenance);
    report_clear(&p->report);
    free(p->file.sections);
    free(p);
}

/* ---- setters ------------------------------------------------------------------------------------ */
static int kv_dim_of(const kv_plan *p) { return p->fingerprint.n_kv_heads * p->fingerprint.head_dim; }

/* §6.5: an input is an earlier layer's stream, or the K stream of the same layer for a V stream. */
static kv_status check_pred_inputs(int layer, int stream, int n_layers, int n_inputs,
                                   const kv_plan_pred_input *in) {
    if (n_inputs < 1 || n_inputs > KV_PLAN_MAX_PRED_INPUTS)
        return KV_ERR(KV_EFORMAT, "layer %d %s: predictor n_inputs %d out of range [1, %d]", layer,
                      kv_plan_stream_name(stream), n_inputs, KV_PLAN_MAX_PRED_INPUTS);
    for (int i = 0; i < n_inputs; i++) {
        const int il = in[i].layer, is = in[i].stream;
        if (is != KV_PLAN_K && is != KV_PLAN_V)
            return KV_ERR(KV_EFORMAT, "layer %d %s: predictor input %d has stream %d (0 K or 1 V)", layer,
                          kv_plan_stream_name(stream), i, is);
        if (il < 0 || il >= n_layers)
            return KV_ERR(KV_EFORMAT, "layer %d %s: predictor input %d names layer %d of %d", layer,
                          kv_plan_stream_name(stream), i, il, n_layers);
        const int earlier = il < layer || (il == layer && stream == KV_PLAN_V && is == KV_PLAN_K);
        if (!earlier)
            return KV_ERR(KV_EFORMAT,
                          "layer %d %s: predictor input %d (layer %d %s) is not reconstructed before this stream",
                          layer, kv_plan_stream_name(stream), i, il, kv_plan_stream_name(is));
        for (int j = 0; j < i; j++)
            if (in[j].layer == il && in[j].stream == is)
                return KV_ERR(KV_EFORMAT, "layer %d %s: predictor input (layer %d %s) appears twice", layer,
                              kv_plan_stream_name(stream), il, kv_plan_stream_name(is));
    }
    return KV_OK;
}

static kv_status check_layer_stream(const kv_plan *p, int layer, int stream, const char *fn) {
    if (!p) return KV_ERR(KV_EINVAL, "%s: no plan", fn);
    if (layer < 0 || layer >= p->n_layers)
        return KV_ERR(KV_EINVAL, "%s: layer %d out of range [0, %d)", fn, layer, p->n_layers);
    if (stream != KV_PLAN_K && stream != KV_PLAN_V)
        return KV_ERR(KV_EINVAL, "%s: stream %d is neither K (0) nor V (1)", fn, stream);
    return KV_OK;
}

kv_status kv_plan_set_predictor(kv_plan *p, int layer, int stream, int n_inputs,
                                const kv_plan_pred_input *inputs, const float *weight,
                                const float *bias) {
    kv_status s = check_layer_stream(p, layer, stream, "kv_plan_set_predictor");
    if (s != KV_OK) return s;
    if (!inputs || !weight) return KV_ERR(KV_EINVAL, "kv_plan_set_predictor: inputs and weight are required");
    s = check_pred_inputs(layer, stream, p->n_layers, n_inputs, inputs);
    if (s != KV_OK) return kv_error_wrap(KV_EINVAL, "kv_plan_set_predictor: ");
    const int kv_dim = kv_dim_of(p);
    kv_plan_predictor *pr = calloc(1, sizeof *pr);
    if (!pr) return KV_ERR(KV_ENOMEM, "out of memory");
    pr->n_inputs = n_inputs;
    memcpy(pr->inputs, inputs, (size_t)n_inputs * sizeof *inputs);
    pr->out_dim = kv_dim;
    pr->in_dim = n_inputs * kv_dim;
    pr->weight = dup_floats(weight, (size_t)pr->out_dim * (size_t)pr->in_dim);
    pr->bias = dup_floats(bias, (size_t)pr->out_dim);
    if (!pr->weight || !pr->bias) {
        predictor_free(pr);
        return KV_ERR(KV_ENOMEM, "out of memory copying a %dx%d predictor", kv_dim, n_inputs * kv_dim);
    }
    kv_plan_stream *st = &p->layers[layer].stream[stream];
    predictor_free(st->predictor);
    st->predictor = pr;
    return KV_OK;
}

/* The float arrays the file holds for a predictor (§6.5): weight and bias, or (1.3) left, right and bias, or
 * (1.4) the codes' scales and offsets and the bias. */
static int stored_arrays(kv_plan_predictor *pr, float **arr, size_t *len) {
    if (pr->qbits > 0) {
        const size_t ng = (size_t)pr->out_dim * (size_t)pr->in_dim / (size_t)pr->qgroup;
        arr[0] = pr->qscale, len[0] = ng;
        arr[1] = pr->qoffset, len[1] = ng;
        arr[2] = pr->bias, len[2] = (size_t)pr->out_dim;
        return 3;
    }
    if (pr->rank >= 1) {
        arr[0] = pr->left, len[0] = (size_t)pr->out_dim * (size_t)pr->rank;
        arr[1] = pr->right, len[1] = (size_t)pr->rank * (size_t)pr->in_dim;
        arr[2] = pr->bias, len[2] = (size_t)pr->out_dim;
        return 3;
    }
    arr[0] = pr->weight, len[0] = (size_t)pr->out_dim * (size_t)pr->in_dim;
    arr[1] = pr->bias, len[1] = (size_t)pr->out_dim;
    return 2;
}

kv_status kv_plan_set_predictor_dtype(kv_plan *p, int layer, int stream, int dtype) {
    kv_status s = check_layer_stream(p, layer, stream, "kv_plan_set_predictor_dtype");
    if (s != KV_OK) return s;
    kv_plan_predictor *pr = p->layers[layer].stream[stream].predictor;
    if (!pr)
        return KV_ERR(KV_EINVAL, "kv_plan_set_predictor_dtype: layer %d %s has no predictor", layer,
                      kv_plan_stream_name(stream));
    if (dtype != KV_DTYPE_F32 && dtype != KV_DTYPE_F16)
        return KV_ERR(KV_EINVAL, "kv_plan_set_predictor_dtype: dtype %d is neither f32 nor f16", dtype);
    if (pr->qbits > 0 && dtype != KV_DTYPE_F16)
        return KV_ERR(KV_EINVAL, "kv_plan_set_predictor_dtype: layer %d %s predictor is quantized (its scales and bias "
                      "are f16)", layer, kv_plan_stream_name(stream));
    if (dtype == KV_DTYPE_F16) { /* what the file holds: the weight, or (1.3) the two factors; and the bias */
        float *arr[3];
        size_t len[3];
        const int n = stored_arrays(pr, arr, len);
        for (int a = 0; a < n; a++)
            for (size_t i = 0; i < len[a]; i++)
                if (!(fabsf(arr[a][i]) <= 65504.0f))
                    return KV_ERR(KV_EINVAL, "kv_plan_set_predictor_dtype: layer %d %s predictor value %g does not fit "
                                  "f16", layer, kv_plan_stream_name(stream), (double)arr[a][i]);
        for (int a = 0; a < n; a++)
            for (size_t i = 0; i < len[a]; i++) arr[a][i] = kv_f16_to_f32(kv_f32_to_f16(arr[a][i]));
        kv_plan_predictor_expand(pr);
    }
    pr->dtype = dtype;
    return KV_OK;
}

/* W[o][i] of a low-rank predictor: the sum over k in order, in double, rounded once (§6.5: every reader's) */
static float factor_product(const kv_plan_predictor *pr, int o, int i) {
    double acc = 0;
    for (int k = 0; k < pr->rank; k++)
        acc += (double)pr->left[(size_t)o * pr->rank + k] * (double)pr->right[(size_t)k * pr->in_dim + i];
    return (float)acc;
}

void kv_plan_predictor_expand(kv_plan_predictor *pr) {
    if (!pr || pr->rank < 1 || !pr->left || !pr->right || !pr->weight) return;
    for (int o = 0; o < pr->out_dim; o++)
        for (int i = 0; i < pr->in_dim; i++) pr->weight[(size_t)o * pr->in_dim + i] = factor_product(pr, o, i);
}

kv_status kv_plan_set_predictor_factors(kv_plan *p, int layer, int stream, int rank, const float *left,
                                        const float *right) {
    kv_status s = check_layer_stream(p, layer, stream, "kv_plan_set_predictor_factors");
    if (s != KV_OK) return s;
    kv_plan_predictor *pr = p->layers[layer].stream[stream].predictor;
    if (!pr)
        return KV_ERR(KV_EINVAL, "kv_plan_set_predictor_factors: layer %d %s has no predictor", layer,
                      kv_plan_stream_name(stream));
    const int max_rank = pr->out_dim < pr->in_dim ? pr->out_dim : pr->in_dim;
    if (rank < 1 || rank > max_rank || !left || !right)
        return KV_ERR(KV_EINVAL, "kv_plan_set_predictor_factors: layer %d %s: rank %d (1..%d) and both factors are "
                      "required", layer, kv_plan_stream_name(stream), rank, max_rank);
    float *l = dup_floats(left, (size_t)pr->out_dim * (size_t)rank);
    float *r = dup_floats(right, (size_t)rank * (size_t)pr->in_dim);
    if (!l || !r) {
        free(l);
        free(r);
        return KV_ERR(KV_ENOMEM, "out of memory copying rank-%d factors", rank);
    }
    free(pr->left);
    free(pr->right);
    pr->left = l;
    pr->right = r;
    pr->rank = rank;
    if (pr->dtype == KV_DTYPE_F16) return kv_plan_set_predictor_dtype(p, layer, stream, KV_DTYPE_F16);
    kv_plan_predictor_expand(pr);
    return KV_OK;
}

kv_status kv_plan_set_predictor_quantized(kv_plan *p, int layer, int stream, int bits, int group,
                                          const uint8_t *codes, const float *scale, const float *offset) {
    kv_status s = check_layer_stream(p, layer, stream, "kv_plan_set_predictor_quantized");
    if (s != KV_OK) return s;
    kv_plan_predictor *pr = p->layers[layer].stream[stream].predictor;
    const char *sn = kv_plan_stream_name(stream);
    if (!pr) return KV_ERR(KV_EINVAL, "kv_plan_set_predictor_quantized: layer %d %s has no predictor", layer, sn);
    if (bits != 4 || group < 1 || pr->in_dim % group != 0 || !codes || !scale || !offset)
        return KV_ERR(KV_EINVAL, "kv_plan_set_predictor_quantized: layer %d %s: 4-bit codes (not %d), a group dividing "
                      "in_dim %d (not %d), codes, scales and offsets are required", layer, sn, bits, pr->in_dim, group);
    if (pr->rank != 0)
        return KV_ERR(KV_EINVAL, "kv_plan_set_predictor_quantized: layer %d %s predictor is low-rank (rank %d): codes "
                      "are for a full weight", layer, sn, pr->rank);
    const size_t n = (size_t)pr->out_dim * (size_t)pr->in_dim, ng = n / (size_t)group;
    for (size_t i = 0; i < n; i++)
        if (codes[i] > 15) return KV_ERR(KV_EINVAL, "kv_plan_set_predictor_quantized: code %u > 15", codes[i]);
    for (size_t g = 0; g < ng; g++)
        if (kv_f16_to_f32(kv_f32_to_f16(scale[g])) != scale[g] || kv_f16_to_f32(kv_f32_to_f16(offset[g])) != offset[g] ||
            !(scale[g] >= 0.0f) || !isfinite(offset[g]))
            return KV_ERR(KV_EINVAL, "kv_plan_set_predictor_quantized: layer %d %s: scale %g / offset %g is not a finite "
                          "f16 value (scale >= 0)", layer, sn, (double)scale[g], (double)offset[g]);
    uint8_t *c = malloc(n);
    float *sc = dup_floats(scale, ng), *of = dup_floats(offset, ng);
    if (!c || !sc || !of) {
        free(c);
        free(sc);
        free(of);
        return KV_ERR(KV_ENOMEM, "out of memory copying a quantized predictor");
    }
    memcpy(c, codes, n);
    free(pr->qcodes);
    free(pr->qscale);
    free(pr->qoffset);
    pr->qcodes = c;
    pr->qscale = sc;
    pr->qoffset = of;
    pr->qbits = bits;
    pr->qgroup = group;
    for (size_t i = 0; i < n; i++) pr->weight[i] = kv_plan_pred_qvalue(sc[i / (size_t)group], of[i / (size_t)group], c[i]);
    return kv_plan_set_predictor_dtype(p, layer, stream, KV_DTYPE_F16); /* the bias to f16 (scales already are) */
}

kv_status kv_plan_set_fp_scales(kv_plan *p, int layer, int stream, int n, const float *scales) {
    kv_status s = check_layer_stream(p, layer, stream, "kv_plan_set_fp_scales");
    if (s != KV_OK) return s;
    kv_plan_stream *st = &p->layers[layer].stream[stream];
    if (!kv_plan_method_is_float(st->method))
        return KV_ERR(KV_EINVAL, "kv_plan_set_fp_scales: layer %d %s is not an FP8 / NVFP4 stream", layer,
                      kv_plan_stream_name(stream));
    if (!scales || (n != 1 && n != p->fingerprint.n_kv_heads))
        return KV_ERR(KV_EINVAL, "kv_plan_set_fp_scales: %d scales (1 or n_kv_heads = %d)", n, p->fingerprint.n_kv_heads);
    for (int i = 0; i < n; i++)
        if (!isfinite(scales[i]) || !(scales[i] > 0.0f))
            return KV_ERR(KV_EINVAL, "kv_plan_set_fp_scales: layer %d %s scale %d is %g (must be finite and > 0)", layer,
                          kv_plan_stream_name(stream), i, (double)scales[i]);
    float *c = malloc((size_t)n * sizeof *c);
    if (!c) return KV_ERR(KV_ENOMEM, "out of memory");
    memcpy(c, scales, (size_t)n * sizeof *c);
    free(st->fp_scales);
    st->fp_scales = c;
    st->n_fp_scales = n;
    return KV_OK;
}

kv_status kv_plan_set_squat(kv_plan *p, int layer, int r, float lambda, int g, const float *basis) {
    kv_status s = check_layer_stream(p, layer, KV_PLAN_K, "kv_plan_set_squat");
    if (s != KV_OK) return s;
    const int hd = p->fingerprint.head_dim;
    if (r < 1 || r > hd) return KV_ERR(KV_EINVAL, "kv_plan_set_squat: r %d out of range [1, %d]", r, hd);
    if (g < 1 || g > hd || hd % g != 0)
        return KV_ERR(KV_EINVAL, "kv_plan_set_squat: g %d must divide head_dim %d", g, hd);
    if (!isfinite(lambda) || lambda < 0.0f)
        return KV_ERR(KV_EINVAL, "kv_plan_set_squat: lambda %g must be finite and >= 0", (double)lambda);
    kv_plan_squat *sq = calloc(1, sizeof *sq);
    if (!sq) return KV_ERR(KV_ENOMEM, "out of memory");
    sq->r = r;
    sq->lambda = lambda;
    sq->g = g;
    if (basis) {
        sq->basis = dup_floats(basis, (size_t)p->fingerprint.n_kv_heads * (size_t)r * (size_t)hd);
        if (!sq->basis) {
            free(sq);
            return KV_ERR(KV_ENOMEM, "out of memory copying a SQuat basis");
        }
    }
    kv_plan_stream *st = &p->layers[layer].stream[KV_PLAN_K];
    squat_free(st->squat);
    st->squat = sq;
    return KV_OK;
}

kv_status kv_plan_add_grid(kv_plan *p, int d, int n, const float *points, int *index) {
    if (!p || !points) return KV_ERR(KV_EINVAL, "kv_plan_add_grid: no plan or no points");
    if (p->n_grids >= KV_PLAN_MAX_GRIDS)
        return KV_ERR(KV_EINVAL, "kv_plan_add_grid: at most %d grids", KV_PLAN_MAX_GRIDS);
    if (d < 1 || d > 16 || n < 2 || n > 65536)
        return KV_ERR(KV_EINVAL, "kv_plan_add_grid: d %d (1..16) or n %d (2..65536) out of range", d, n);
    kv_plan_grid *ng = realloc(p->grids, (size_t)(p->n_grids + 1) * sizeof *ng);
    if (!ng) return KV_ERR(KV_ENOMEM, "out of memory");
    p->grids = ng;
    float *pts = dup_floats(points, (size_t)n * (size_t)d);
    if (!pts) return KV_ERR(KV_ENOMEM, "out of memory copying a grid");
    p->grids[p->n_grids].d = d;
    p->grids[p->n_grids].n = n;
    p->grids[p->n_grids].points = pts;
    if (index) *index = p->n_grids;
    p->n_grids++;
    return KV_OK;
}

kv_status kv_plan_stream_copy(kv_plan *dst, const kv_plan *src, int layer, int stream, unsigned flags) {
    if (!dst || !src || layer < 0 || layer >= dst->n_layers || layer >= src->n_layers || stream < 0 || stream > 1)
        return KV_ERR(KV_EINVAL, "kv_plan_stream_copy: bad arguments (layer %d, stream %d)", layer, stream);
    if (dst->n_layers != src->n_layers || dst->fingerprint.n_kv_heads != src->fingerprint.n_kv_heads ||
        dst->fingerprint.head_dim != src->fingerprint.head_dim)
        return KV_ERR(KV_EINVAL, "kv_plan_stream_copy: layer %d stream %d: the plans are for models of different "
                      "shapes", layer, stream);
    /* the layer's attention window is the model's (1.5): a stream of a windowed layer brings it along */
    const int sw = src->layers[layer].window, dw = dst->layers[layer].window;
    if (sw > 0 && dw > 0 && sw != dw)
        return KV_ERR(KV_EINVAL, "kv_plan_stream_copy: layer %d: attention windows %d and %d differ", layer, sw, dw);
    const kv_plan_stream *ss = &src->layers[layer].stream[stream];
    const kv_plan_codec *codec = kv_plan_codec_of((int)ss->method);
    if (!codec) return KV_ERR(KV_EINVAL, "kv_plan_stream_copy: layer %d stream %d: unknown method %d", layer, stream,
                              (int)ss->method);
    if (ss->predictor && !(flags & KV_PLAN_COPY_PREDICTOR))
        return KV_ERR(KV_EUNSUPPORTED, "layer %d stream %d has an AQUA-KV predictor, which depends on other streams' "
                      "reconstructions (copied only on request)", layer, stream);
    int grid = -1;
    if (ss->higgs_grid >= 0) {
        if (ss->higgs_grid >= src->n_grids)
            return KV_ERR(KV_EINVAL, "kv_plan_stream_copy: layer %d stream %d: grid %d of %d", layer, stream,
                          ss->higgs_grid, src->n_grids);
        const kv_plan_grid *g = &src->grids[ss->higgs_grid];
        for (int i = 0; i < dst->n_grids && grid < 0; i++)
            if (dst->grids[i].d == g->d && dst->grids[i].n == g->n &&
                memcmp(dst->grids[i].points, g->points, (size_t)g->n * (size_t)g->d * sizeof(float)) == 0)
                grid = i;
        if (grid < 0) {
            kv_status s = kv_plan_add_grid(dst, g->d, g->n, g->points, &grid);
            if (s != KV_OK) return s;
        }
    }
    /* the copy is built apart and swapped in only when every part succeeded: dst never holds half a stream */
    kv_plan_stream c = *ss;
    c.predictor = NULL, c.squat = NULL, c.fp_scales = NULL, c.n_fp_scales = 0;
    c.higgs_grid = grid;
    kv_status s = codec->copy_params ? codec->copy_params(&c, ss) : KV_OK;
    if (s == KV_OK && ss->squat) {
        const kv_plan_squat *q = ss->squat;
        c.squat = squat_copy(q, (int)src->fingerprint.n_kv_heads, (int)src->fingerprint.head_dim);
        if (!c.squat) s = KV_ERR(KV_ENOMEM, "out of memory copying SQuat parameters");
    }
    if (s == KV_OK && ss->predictor && (flags & KV_PLAN_COPY_PREDICTOR)) {
        c.predictor = predictor_copy(ss->predictor);
        if (!c.predictor) s = KV_ERR(KV_ENOMEM, "out of memory copying a predictor");
    }
    if (s != KV_OK) {
        stream_release(&c);
        return s;
    }
    stream_release(&dst->layers[layer].stream[stream]);
    dst->layers[layer].stream[stream] = c;
    if (sw > 0) dst->layers[layer].window = sw;
    return KV_OK;
}

kv_status kv_plan_set_provenance(kv_plan *p, const kv_plan_provenance *src) {
    if (!p || !src) return KV_ERR(KV_EINVAL, "kv_plan_set_provenance: no plan or no provenance");
    kv_plan_provenance v = {0};
    v.tool_version = kv_plan_strdup(src->tool_version);
    v.git_hash = kv_plan_strdup(src->git_hash);
    v.corpus_sha256 = kv_plan_strdup(src->corpus_sha256);
    v.config_yaml = kv_plan_strdup(src->config_yaml);
    v.seed = src->seed;
    v.created = src->created;
    if (!v.tool_version || !v.git_hash || !v.corpus_sha256 || !v.config_yaml) {
        provenance_clear(&v);
        return KV_ERR(KV_ENOMEM, "out of memory copying provenance");
    }
    provenance_clear(&p->provenance);
    p->provenance = v;
    return KV_OK;
}

kv_status kv_plan_set_report(kv_plan *p, int n_metrics, const char *const *names, const float *values) {
    if (!p) return KV_ERR(KV_EINVAL, "kv_plan_set_report: no plan");
    if (n_metrics == 0) {
        report_clear(&p->report);
        return KV_OK;
    }
    if (n_metrics < 0 || n_metrics > KV_PLAN_MAX_METRICS || !names || !values)
        return KV_ERR(KV_EINVAL, "kv_plan_set_report: n_metrics %d (1..%d) with names and values", n_metrics,
                      KV_PLAN_MAX_METRICS);
    kv_plan_report r = {0};
    r.names = calloc((size_t)n_metrics, sizeof *r.names);
    r.values = dup_floats(values, (size_t)p->n_layers * 2u * (size_t)n_metrics);
    r.n_metrics = n_metrics;
    int ok = r.names && r.values;
    for (int i = 0; ok && i < n_metrics; i++) ok = (r.names[i] = kv_plan_strdup(names[i])) != NULL;
    if (!ok) {
        report_clear(&r);
        return KV_ERR(KV_ENOMEM, "out of memory copying a report");
    }
    report_clear(&p->report);
    p->report = r;
    return KV_OK;
}

/* ---- validation (§6) ------------------------------------------------------------------------- */
static int all_finite(const float *v, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (!isfinite(v[i])) return 0;
    return 1;
}

#define SERR KV_PLAN_SERR /* "layer L K|V: ..." at this line */

static kv_status validate_stream(const kv_plan *p, int l, int stream) {
    const kv_plan_stream *s = &p->layers[l].stream[stream];
    const char *sn = kv_plan_stream_name(stream);
    const int hd = p->fingerprint.head_dim;
    const kv_plan_codec *codec = kv_plan_codec_of((int)s->method);
    if (!codec) {
        char list[256] = "";
        for (int m = 0; m < KV_PLAN_METHOD_COUNT; m++)
            snprintf(list + strlen(list), sizeof list - strlen(list), "%s%d (%s)", m ? ", " : "", m,
                     kv_plan_method_name(m));
        return SERR("method %d is not %s", (int)s->method, list);
    }
    kv_status cs = codec->validate(p, l, stream, s);
    if (cs != KV_OK) return cs;
    if (!codec->is_float && (s->fp_scales || s->n_fp_scales))
        return SERR("tensor scales on a %s stream (FP8 / NVFP4 only)", codec->name);
    if (codec->takes_scale_dtype && s->scale_dtype != KV_DTYPE_F16 && s->scale_dtype != KV_DTYPE_F32)
        return SERR("scale_dtype %d is not 0 (f32) or 1 (f16)", s->scale_dtype);
    if (!codec->uses_grid && s->higgs_grid != -1)
        return SERR("higgs_grid %d set on a %s stream (must be -1)", s->higgs_grid, codec->name);
    if (s->pre_rope != 0 && !(s->pre_rope == 1 && stream == KV_PLAN_K))
        return SERR("pre_rope %d (only 0, or 1 on a K stream)", s->pre_rope);
    if (!(s->rpc_ratio >= 0.0f && s->rpc_ratio <= 1.0f))
        return SERR("rpc_ratio %g out of range [0, 1]", (double)s->rpc_ratio);
    if (s->share_codes_with_layer != -1) {
        /* XQuant pairs adjacent layers (xquant.txt Algorithm 1: layer l reuses KeyCache[l-1]'s codes), so the
         * partner is exactly the previous layer; which layer of a pair is the lower one (the paper: the even
         * one) is the writer's choice and not checked here. Each mismatch has its own message. */
        const int t = s->share_codes_with_layer;
        if (t < 0 || t >= l) return SERR("share_codes_with_layer %d is not an earlier layer", t);
        if (t != l - 1)
            return SERR("share_codes_with_layer %d is not the previous layer %d (codes are shared by adjacent layers)",
                        t, l - 1);
        const kv_plan_stream *o = &p->layers[t].stream[stream];
        if (!codec->shares_codes)
            return SERR("shares codes with layer %d but is %s (only uniform streams share codes)", t, codec->name);
        if (o->method != s->method)
            return SERR("shares codes with layer %d, whose %s stream is %s, not uniform", t, sn,
                        kv_plan_method_name(o->method));
        if (o->bits != s->bits)
            return SERR("shares codes with layer %d, whose %s stream has %d-bit codes, not %d (a different bit width)",
                        t, sn, o->bits, s->bits);
        if (o->group_size != s->group_size || o->group_axis != s->group_axis)
            return SERR("shares codes with layer %d, whose %s stream has another group layout (group_size %d axis %d, "
                        "here %d axis %d)", t, sn, o->group_size, (int)o->group_axis, s->group_size,
                        (int)s->group_axis);
        if (o->pack != s->pack)
            return SERR("shares codes with layer %d, whose %s stream packs its codes with pack %d, not %d", t, sn,
                        (int)o->pack, (int)s->pack);
        if (o->share_codes_with_layer != -1)
            return SERR("shares codes with layer %d, which itself shares codes (no chains)", t);
    }
    if (s->predictor) {
        const kv_plan_predictor *pr = s->predictor;
        if (!codec->takes_predictor) return SERR("a %s stream has a predictor", codec->name);
        kv_status st = check_pred_inputs(l, stream, p->n_layers, pr->n_inputs, pr->inputs);
        if (st != KV_OK) return st;
        const int kv_dim = kv_dim_of(p);
        if (pr->out_dim != kv_dim || pr->in_dim != pr->n_inputs * kv_dim)
            return SERR("predictor is %dx%d, expected %dx%d", pr->out_dim, pr->in_dim, kv_dim,
                        pr->n_inputs * kv_dim);
        if (!pr->weight || !pr->bias) return SERR("predictor without weight or bias");
        if (!all_finite(pr->weight, (size_t)pr->out_dim * (size_t)pr->in_dim) ||
            !all_finite(pr->bias, (size_t)pr->out_dim))
            return SERR("predictor has a NaN or infinite weight");
        if (pr->dtype != KV_DTYPE_F32 && pr->dtype != KV_DTYPE_F16)
            return SERR("predictor dtype %d is neither f32 nor f16", pr->dtype);
        if (pr->rank != 0) { /* 1.3: the weight must be the product of the stored factors */
            const int max_rank = pr->out_dim < pr->in_dim ? pr->out_dim : pr->in_dim;
            if (pr->rank < 1 || pr->rank > max_rank || !pr->left || !pr->right)
                return SERR("low-rank predictor of rank %d (1..%d) without both factors", pr->rank, max_rank);
            if (!all_finite(pr->left, (size_t)pr->out_dim * (size_t)pr->rank) ||
                !all_finite(pr->right, (size_t)pr->rank * (size_t)pr->in_dim))
                return SERR("predictor has a NaN or infinite factor");
            for (int o = 0; o < pr->out_dim; o++)
                for (int i = 0; i < pr->in_dim; i++)
                    if (factor_product(pr, o, i) != pr->weight[(size_t)o * pr->in_dim + i])
                        return SERR("predictor weight [%d, %d] is not the product of its rank-%d factors", o, i,
                                    pr->rank);
        }
        if (pr->qbits != 0) { /* 1.4: the weight must be the codes' values */
            if (pr->qbits != 4 || pr->rank != 0 || pr->dtype != KV_DTYPE_F16 || pr->qgroup < 1 ||
                pr->in_dim % pr->qgroup != 0 || !pr->qcodes || !pr->qscale || !pr->qoffset)
                return SERR("quantized predictor (%d-bit codes, group %d, rank %d) is not 4-bit, f16, full rank with a "
                            "group dividing in_dim %d", pr->qbits, pr->qgroup, pr->rank, pr->in_dim);
            const size_t n = (size_t)pr->out_dim * (size_t)pr->in_dim;
            for (size_t i = 0; i < n; i++) {
                const size_t g = i / (size_t)pr->qgroup;
                if (pr->qcodes[i] > 15 || !isfinite(pr->qscale[g]) || !isfinite(pr->qoffset[g]) ||
                    kv_plan_pred_qvalue(pr->qscale[g], pr->qoffset[g], pr->qcodes[i]) != pr->weight[i])
                    return SERR("predictor weight %zu is not the value of its 4-bit code", i);
            }
        }
        if (pr->dtype == KV_DTYPE_F16) { /* the file would hold other values than memory */
            float *arr[3];
            size_t len[3];
            const int n = stored_arrays((kv_plan_predictor *)pr, arr, len);
            for (int a = 0; a < n; a++)
                for (size_t i = 0; i < len[a]; i++)
                    if (kv_f16_to_f32(kv_f32_to_f16(arr[a][i])) != arr[a][i])
                        return SERR("predictor is stored in f16 but value %zu (%g) is not an f16 value", i,
                                    (double)arr[a][i]);
        }
    }
    if (s->squat) {
        const kv_plan_squat *q = s->squat;
        if (stream != KV_PLAN_K || !codec->squat_keys) return SERR("SQuat needs a uniform K stream");
        if (q->r < 1 || q->r > hd) return SERR("SQuat r %d out of range [1, %d]", q->r, hd);
        if (q->g < 1 || q->g > hd || hd % q->g != 0) return SERR("SQuat g %d must divide head_dim %d", q->g, hd);
        if (!isfinite(q->lambda) || q->lambda < 0.0f) return SERR("SQuat lambda %g must be >= 0", (double)q->lambda);
        if (q->basis && !all_finite(q->basis, (size_t)p->fingerprint.n_kv_heads * (size_t)q->r * (size_t)hd))
            return SERR("SQuat basis has a NaN or infinite value");
        if (q->static_subspace != 0 && q->static_subspace != 1)
            return SERR("SQuat static_subspace %d is not 0 or 1", q->static_subspace);
        if (q->static_subspace && !q->basis) return SERR("SQuat with a static subspace but no stored basis");
    }
    return KV_OK;
}

static int hex_or_empty(const char *s, size_t want) {
    if (!s || !*s) return 1;
    if (strlen(s) != want) return 0;
    for (const char *c = s; *c; c++)
        if (!((*c >= '0' && *c <= '9') || (*c >= 'a' && *c <= 'f'))) return 0;
    return 1;
}

kv_status kv_plan_validate(const kv_plan *p) {
    if (!p) return KV_ERR(KV_EINVAL, "kv_plan_validate: no plan");
    kv_status s = kv_plan_fingerprint_validate(&p->fingerprint);
    if (s != KV_OK) return s;
    if (p->n_layers != p->fingerprint.n_layers || !p->layers)
        return KV_ERR(KV_EFORMAT, "plan has %d layer records for a model of %d layers", p->n_layers,
                      p->fingerprint.n_layers);
    /* §6.2 */
    const kv_plan_global *g = &p->global;
    if (g->sinks < 0 || g->sinks > (1 << 20)) return KV_ERR(KV_EFORMAT, "global: sinks %d out of range", g->sinks);
    if (g->recent < 0 || g->recent > (1 << 24)) return KV_ERR(KV_EFORMAT, "global: recent %d out of range", g->recent);
    if (!kv_plan_prune_name(g->prune_method))
        return KV_ERR(KV_EFORMAT, "global: prune_method %d is not 0..4", (int)g->prune_method);
    if (!(g->prune_budget > 0.0f && g->prune_budget <= 1.0f))
        return KV_ERR(KV_EFORMAT, "global: prune_budget %g out of range (0, 1]", (double)g->prune_budget);
    if (g->prune_method == KV_PLAN_PRUNE_NONE && g->prune_budget != 1.0f)
        return KV_ERR(KV_EFORMAT, "global: prune_budget %g without a prune_method (must be 1)", (double)g->prune_budget);
    if (g->prune_window < 0 || g->prune_window > (1 << 20))
        return KV_ERR(KV_EFORMAT, "global: prune_window %d out of range", g->prune_window);
    if (g->prune_pool < 0 || g->prune_pool > 1024 || (g->prune_pool != 0 && g->prune_pool % 2 == 0))
        return KV_ERR(KV_EFORMAT, "global: prune_pool %d must be 0 or odd and <= 1024", g->prune_pool);
    /* §6.3 */
    if (p->n_grids < 0 || p->n_grids > KV_PLAN_MAX_GRIDS || (p->n_grids > 0 && !p->grids))
        return KV_ERR(KV_EFORMAT, "n_grids %d out of range [0, %d]", p->n_grids, KV_PLAN_MAX_GRIDS);
    for (int i = 0; i < p->n_grids; i++) {
        const kv_plan_grid *gr = &p->grids[i];
        if (gr->d < 1 || gr->d > 16 || gr->n < 2 || gr->n > 65536 || !gr->points)
            return KV_ERR(KV_EFORMAT, "grid %d: d %d (1..16) or n %d (2..65536) out of range", i, gr->d, gr->n);
        if (!all_finite(gr->points, (size_t)gr->n * (size_t)gr->d))
            return KV_ERR(KV_EFORMAT, "grid %d: a point is NaN or infinite", i);
    }
    /* §6.4 */
    for (int l = 0; l < p->n_layers; l++) {
        const float b = p->layers[l].prune_budget;
        if (!(b == 0.0f || (b > 0.0f && b <= 1.0f)))
            return KV_ERR(KV_EFORMAT, "layer %d: prune_budget %g (0, or in (0, 1])", l, (double)b);
        if (p->layers[l].window < 0 || p->layers[l].window > KV_PLAN_MAX_WINDOW) /* §6.10 */
            return KV_ERR(KV_EFORMAT, "layer %d: window %d out of range (0 = full attention, or 1..%d)", l,
                          p->layers[l].window, KV_PLAN_MAX_WINDOW);
        for (int st = 0; st < 2; st++) {
            s = validate_stream(p, l, st);
            if (s != KV_OK) return s;
        }
    }
    /* §6.7 */
    const kv_plan_provenance *v = &p->provenance;
    const char *strs[] = {v->tool_version, v->git_hash, v->corpus_sha256, v->config_yaml};
    for (size_t i = 0; i < sizeof strs / sizeof *strs; i++) {
        const size_t n = strs[i] ? strlen(strs[i]) : 0;
        if (n > KV_PLAN_MAX_STRING)
            return KV_ERR(KV_EFORMAT, "provenance: a string is longer than %u bytes", KV_PLAN_MAX_STRING);
        if (!kv_plan_utf8_valid(strs[i], n)) return KV_ERR(KV_EFORMAT, "provenance: a string is not valid UTF-8");
    }
    if (!hex_or_empty(v->corpus_sha256, 64))
        return KV_ERR(KV_EFORMAT, "provenance: corpus_sha256 '%.80s' is not 64 lowercase hex digits", v->corpus_sha256);
    /* §6.8 */
    const kv_plan_report *r = &p->report;
    if (r->n_metrics < 0 || r->n_metrics > KV_PLAN_MAX_METRICS || (r->n_metrics > 0 && (!r->names || !r->values)))
        return KV_ERR(KV_EFORMAT, "report: n_metrics %d out of range [0, %d]", r->n_metrics, KV_PLAN_MAX_METRICS);
    for (int i = 0; i < r->n_metrics; i++) {
        size_t n = r->names[i] ? strlen(r->names[i]) : 0;
        if (n < 1 || n > 64 || !kv_plan_utf8_valid(r->names[i], n))
            return KV_ERR(KV_EFORMAT, "report: metric %d name must be 1..64 bytes of UTF-8", i);
        for (int j = 0; j < i; j++)
            if (strcmp(r->names[i], r->names[j]) == 0)
                return KV_ERR(KV_EFORMAT, "report: metric '%s' appears twice", r->names[i]);
    }
    const size_t n_values = (size_t)p->n_layers * 2u * (size_t)(r->n_metrics > 0 ? r->n_metrics : 0);
    for (size_t i = 0; i < n_values; i++)
        if (isinf(r->values[i])) return KV_ERR(KV_EFORMAT, "report: value %zu is infinite (NaN = not measured)", i);
    return KV_OK;
}

/* ---- features (§4) --------------------------------------------------------------------------- */
uint64_t kv_plan_required_features(const kv_plan *p) {
    uint64_t f = 0;
    if (p->global.prune_method != KV_PLAN_PRUNE_NONE) f |= KV_PLAN_FEAT_PRUNING;
    for (int l = 0; l < p->n_layers; l++)
        for (int st = 0; st < 2; st++) {
            const kv_plan_stream *s = &p->layers[l].stream[st];
            const kv_plan_codec *codec = kv_plan_codec_of((int)s->method);
            if (codec) f |= codec->required_feature; /* HIGGS, FLOAT */
            if (s->predictor) f |= KV_PLAN_FEAT_PREDICTOR;
            if (s->share_codes_with_layer >= 0) f |= KV_PLAN_FEAT_SHARED_CODES;
            if (s->squat) f |= KV_PLAN_FEAT_SQUAT;
            if (s->squat && s->squat->static_subspace) f |= KV_PLAN_FEAT_SQUAT_STATIC;
            if (s->predictor && s->predictor->dtype == KV_DTYPE_F16) f |= KV_PLAN_FEAT_PRED_F16;
            if (s->predictor && s->predictor->rank >= 1) f |= KV_PLAN_FEAT_PRED_LOWRANK;
            if (s->predictor && s->predictor->qbits > 0) f |= KV_PLAN_FEAT_PRED_Q4;
            if (s->pack == KV_PLAN_PACK_3BIT_11) f |= KV_PLAN_FEAT_PACK3_11;
        }
    if (kv_plan_has_windows(p)) f |= KV_PLAN_FEAT_WINDOW;
    return f;
}

int kv_plan_has_windows(const kv_plan *p) {
    for (int l = 0; p && p->layers && l < p->n_layers; l++)
        if (p->layers[l].window > 0) return 1;
    return 0;
}

uint64_t kv_plan_optional_features(const kv_plan *p) {
    uint64_t f = KV_PLAN_OPT_PROVENANCE;
    if (p->report.n_metrics > 0) f |= KV_PLAN_OPT_REPORT;
    for (int l = 0; l < p->n_layers; l++)
        if (p->layers[l].stream[KV_PLAN_K].squat && p->layers[l].stream[KV_PLAN_K].squat->basis)
            f |= KV_PLAN_OPT_SQUAT_BASIS;
    return f;
}

/* ---- bits per value (§9) ------------------------------------------------------------------------- */
double kv_plan_stream_bits(const kv_plan *p, int layer, int stream) {
    if (!p || layer < 0 || layer >= p->n_layers || (stream != 0 && stream != 1)) return 0.0;
    const kv_plan_stream *s = &p->layers[layer].stream[stream];
    const kv_plan_codec *codec = kv_plan_codec_of((int)s->method);
    return codec ? codec->bits(p, s) : 0.0;
}

uint64_t kv_plan_stream_predictor_bytes(const kv_plan *p, int layer, int stream) {
    if (!p || layer < 0 || layer >= p->n_layers || stream < 0 || stream > 1) return 0;
    const kv_plan_predictor *pr = p->layers[layer].stream[stream].predictor;
    if (!pr) return 0u;
    if (pr->qbits > 0) { /* 1.4: the codes, two per byte, then f16 scales, offsets and bias */
        const uint64_t n = (uint64_t)pr->out_dim * (uint64_t)pr->in_dim;
        return (n * (uint64_t)pr->qbits + 7u) / 8u + 2u * (2u * (n / (uint64_t)pr->qgroup) + (uint64_t)pr->out_dim);
    }
    const uint64_t w = pr->rank >= 1 ? (uint64_t)pr->rank * ((uint64_t)pr->out_dim + (uint64_t)pr->in_dim)
                                     : (uint64_t)pr->out_dim * (uint64_t)pr->in_dim;
    return (pr->dtype == KV_DTYPE_F16 ? 2u : 4u) * (w + (uint64_t)pr->out_dim);
}

uint64_t kv_plan_stream_basis_bytes(const kv_plan *p, int layer, int stream) {
    if (!p || layer < 0 || layer >= p->n_layers || stream < 0 || stream > 1) return 0;
    const kv_plan_squat *q = p->layers[layer].stream[stream].squat;
    if (!q || !q->basis) return 0u;
    return 4u * (uint64_t)p->fingerprint.n_kv_heads * (uint64_t)q->r * (uint64_t)p->fingerprint.head_dim;
}

uint64_t kv_plan_basis_bytes(const kv_plan *p) {
    uint64_t n = 0;
    for (int l = 0; p && l < p->n_layers; l++)
        for (int st = 0; st < 2; st++) n += kv_plan_stream_basis_bytes(p, l, st);
    return n;
}

uint64_t kv_plan_predictor_bytes(const kv_plan *p) {
    uint64_t n = 0;
    for (int l = 0; p && l < p->n_layers; l++)
        for (int st = 0; st < 2; st++) n += kv_plan_stream_predictor_bytes(p, l, st);
    return n;
}

/* ---- creation time, fingerprint check --------------------------------------------------------------- */
kv_status kv_plan_creation_time(int64_t *out) {
    const char *e = getenv("SOURCE_DATE_EPOCH");
    if (e && *e) {
        char *end = NULL;
        errno = 0;
        long long v = strtoll(e, &end, 10);
        if (errno || !end || *end || v < 0)
            return KV_ERR(KV_EINVAL, "SOURCE_DATE_EPOCH='%s' is not a non-negative integer", e);
        *out = (int64_t)v;
        return KV_OK;
    }
    *out = (int64_t)time(NULL);
    return KV_OK;
}

kv_status kv_plan_check_fingerprint(const kv_plan *p, const kv_plan_fingerprint *m) {
    if (!p || !m) return KV_ERR(KV_EINVAL, "kv_plan_check_fingerprint: no plan or no model fingerprint");
    const kv_plan_fingerprint *f = &p->fingerprint;
    if (strncmp(f->arch, m->arch, sizeof f->arch) != 0)
        return KV_ERR(KV_EMISMATCH, "plan is for a different model: arch '%.32s' in the plan, '%.32s' in the model",
                      f->arch, m->arch);
#define CMP_INT(field)                                                                                     \
    if (f->field != m->field)                                                                              \
        return KV_ERR(KV_EMISMATCH, "plan is for a different model: " #field " %d in the plan, %d in the model", \
                      f->field, m->field);
    CMP_INT(n_layers)
    CMP_INT(d_model)
    CMP_INT(n_heads)
    CMP_INT(n_kv_heads)
    CMP_INT(head_dim)
    CMP_INT(vocab_size)
#undef CMP_INT
    if (f->rope_theta != m->rope_theta)
        return KV_ERR(KV_EMISMATCH, "plan is for a different model: rope_theta %g in the plan, %g in the model",
                      (double)f->rope_theta, (double)m->rope_theta);
    if (memcmp(f->kv_sha256, m->kv_sha256, 32) != 0) {
        char a[65], b[65];
        kv_sha256_hex(a, f->kv_sha256);
        kv_sha256_hex(b, m->kv_sha256);
        return KV_ERR(KV_EMISMATCH,
                      "plan is for a different model: the K/V projection weights differ (sha256 %.16s... in the "
                      "plan, %.16s... in the model)", a, b);
    }
    return KV_OK;
}
