/* kv_plan_dump: the whole plan as YAML or JSON (PLAN_FORMAT.md §10). One JSON tree is built
 * (jansson) and printed either by jansson or by the JSON -> YAML emitter (plan_yaml.c). */
#define _POSIX_C_SOURCE 200809L
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "plan_internal.h"
#include "yaml_emit.h"
#include "kv_formats.h"

/* The double nearest to the shortest decimal that reads back as this float: 0.1f prints "0.1". */
static json_t *jf32(float x) {
    if (!isfinite(x)) return json_null(); /* JSON has no NaN; YAML readers see null = not measured */
    char buf[32];
    for (int prec = 1; prec <= 9; prec++) {
        snprintf(buf, sizeof buf, "%.*g", prec, (double)x);
        if (strtof(buf, NULL) == x) break;
    }
    return json_real(strtod(buf, NULL));
}
static json_t *jint(long long v) { return json_integer((json_int_t)v); }
static json_t *ju64(uint64_t v) {
    if (v <= (uint64_t)INT64_MAX) return json_integer((json_int_t)v);
    char buf[32];
    snprintf(buf, sizeof buf, "%" PRIu64, v);
    return json_string(buf);
}
static json_t *jstr(const char *s) { return json_string(s ? s : ""); }
static json_t *jhex32(uint32_t v) {
    char buf[16];
    snprintf(buf, sizeof buf, "0x%08x", v);
    return json_string(buf);
}

/* json_object_set_new that remembers an allocation failure in *ok. */
static void put(json_t *obj, const char *key, json_t *v, int *ok) {
    if (!obj || !v || json_object_set_new(obj, key, v) != 0) *ok = 0;
}
static void push(json_t *arr, json_t *v, int *ok) {
    if (!arr || !v || json_array_append_new(arr, v) != 0) *ok = 0;
}

static json_t *float_array(const float *v, size_t n, int *ok) {
    json_t *a = json_array();
    for (size_t i = 0; a && i < n; i++) push(a, jf32(v[i]), ok);
    return a;
}

static double l2norm(const float *v, size_t n) {
    double s = 0.0;
    for (size_t i = 0; i < n; i++) s += (double)v[i] * (double)v[i];
    return sqrt(s);
}

static json_t *feature_list(uint64_t bits, int required, int *ok) {
    static const char *const req[] = {"ZLIB",    "HIGGS",    "PREDICTOR", "SHARED_CODES", "SQUAT",
                                      "PRUNING", "PACK3_11", "FLOAT",     "SQUAT_STATIC", "PRED_F16",
                                      "PRED_LOWRANK", "PRED_Q4"};
    static const char *const opt[] = {"REPORT", "SQUAT_BASIS", "PROVENANCE"};
    const char *const *names = required ? req : opt;
    const int n_names = required ? (int)(sizeof req / sizeof *req) : (int)(sizeof opt / sizeof *opt);
    json_t *a = json_array();
    for (int b = 0; b < 64; b++) {
        if (!(bits & (1ull << b))) continue;
        if (b < n_names) {
            push(a, json_string(names[b]), ok);
        } else {
            char buf[24];
            snprintf(buf, sizeof buf, "bit%d", b);
            push(a, json_string(buf), ok);
        }
    }
    return a;
}

static json_t *dump_format(const kv_plan *p, int *ok) {
    const kv_plan_file_info *f = &p->file;
    json_t *o = json_object();
    char ver[32];
    snprintf(ver, sizeof ver, "%d.%d", f->version_major, f->version_minor);
    put(o, "version", json_string(ver), ok);
    put(o, "file_size", ju64(f->file_size), ok);
    put(o, "required_features", feature_list(f->required_features, 1, ok), ok);
    put(o, "optional_features", feature_list(f->optional_features, 0, ok), ok);
    json_t *secs = json_array();
    for (int i = 0; i < f->n_sections; i++) {
        const kv_plan_section_info *s = &f->sections[i];
        json_t *e = json_object();
        put(e, "tag", json_string(s->tag), ok);
        put(e, "required", json_boolean(s->flags & KV_PLAN_SECTION_REQUIRED), ok);
        put(e, "zlib", json_boolean(s->flags & KV_PLAN_SECTION_ZLIB), ok);
        put(e, "offset", ju64(s->offset), ok);
        put(e, "stored_size", ju64(s->stored_size), ok);
        put(e, "size", ju64(s->size), ok);
        put(e, "crc32", jhex32(s->crc32), ok);
        put(e, "known", json_boolean(s->known), ok);
        push(secs, e, ok);
    }
    put(o, "sections", secs, ok);
    return o;
}

static json_t *dump_provenance(const kv_plan *p, int *ok) {
    const kv_plan_provenance *v = &p->provenance;
    json_t *o = json_object();
    put(o, "tool_version", jstr(v->tool_version), ok);
    put(o, "git_hash", jstr(v->git_hash), ok);
    put(o, "corpus_sha256", jstr(v->corpus_sha256), ok);
    put(o, "seed", ju64(v->seed), ok);
    put(o, "created", jint(v->created), ok);
    char when[64] = "";
    time_t t = (time_t)v->created;
    struct tm tm;
    if (gmtime_r(&t, &tm)) strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", &tm);
    put(o, "created_utc", json_string(when), ok);
    put(o, "config", jstr(v->config_yaml), ok);
    return o;
}

static json_t *dump_fingerprint(const kv_plan *p, int *ok) {
    const kv_plan_fingerprint *f = &p->fingerprint;
    json_t *o = json_object();
    char arch[33];
    memcpy(arch, f->arch, 32);
    arch[32] = '\0';
    char hex[65];
    kv_sha256_hex(hex, f->kv_sha256);
    put(o, "arch", json_string(arch), ok);
    put(o, "n_layers", jint(f->n_layers), ok);
    put(o, "d_model", jint(f->d_model), ok);
    put(o, "n_heads", jint(f->n_heads), ok);
    put(o, "n_kv_heads", jint(f->n_kv_heads), ok);
    put(o, "head_dim", jint(f->head_dim), ok);
    put(o, "vocab_size", jint(f->vocab_size), ok);
    put(o, "rope_theta", jf32(f->rope_theta), ok);
    put(o, "kv_sha256", json_string(hex), ok);
    return o;
}

static json_t *dump_global(const kv_plan *p, int *ok) {
    const kv_plan_global *g = &p->global;
    json_t *o = json_object();
    put(o, "sinks", jint(g->sinks), ok);
    put(o, "recent", jint(g->recent), ok);
    put(o, "prune_method", json_string(kv_plan_prune_name(g->prune_method)), ok);
    put(o, "prune_budget", jf32(g->prune_budget), ok);
    put(o, "prune_window", jint(g->prune_window), ok);
    put(o, "prune_pool", jint(g->prune_pool), ok);
    put(o, "rht_seed", ju64(g->rht_seed), ok);
    return o;
}

static json_t *dump_grids(const kv_plan *p, int full, int *ok) {
    json_t *a = json_array();
    for (int i = 0; i < p->n_grids; i++) {
        const kv_plan_grid *g = &p->grids[i];
        json_t *o = json_object();
        put(o, "index", jint(i), ok);
        put(o, "d", jint(g->d), ok);
        put(o, "n", jint(g->n), ok);
        put(o, "code_bits_per_value", json_real(log2((double)g->n) / (double)g->d), ok);
        if (full) put(o, "points", float_array(g->points, (size_t)g->n * (size_t)g->d, ok), ok);
        push(a, o, ok);
    }
    return a;
}

static json_t *dump_stream(const kv_plan *p, int l, int st, int full, int *ok) {
    const kv_plan_stream *s = &p->layers[l].stream[st];
    json_t *row = json_object();
    put(row, "method", json_string(kv_plan_method_name(s->method)), ok);
    put(row, "bits", jint(s->bits), ok);
    put(row, "group_size", jint(s->group_size), ok);
    put(row, "group_axis", json_string(kv_plan_axis_name(s->group_axis)), ok);
    put(row, "scale_dtype", json_string(s->scale_dtype == KV_DTYPE_F16 ? "f16" : "f32"), ok);
    put(row, "eta", jf32(s->eta), ok);
    put(row, "pack", json_string(kv_plan_pack_name(s->pack)), ok);
    put(row, "share_codes_with_layer", jint(s->share_codes_with_layer), ok);
    put(row, "higgs_grid", jint(s->higgs_grid), ok);
    put(row, "pre_rope", json_boolean(s->pre_rope), ok);
    put(row, "rpc_ratio", jf32(s->rpc_ratio), ok);
    put(row, "bits_per_value", json_real(kv_plan_stream_bits(p, l, st)), ok);
    if (s->fp_scales) put(row, "scales", float_array(s->fp_scales, (size_t)s->n_fp_scales, ok), ok);
    if (!s->predictor && !s->squat) return row;
    /* A stream with fitted parameters: the scalar row first, then the parameters. */
    json_t *o = json_object();
    put(o, "record", row, ok);
    if (s->predictor) {
        const kv_plan_predictor *pr = s->predictor;
        json_t *po = json_object();
        json_t *in = json_array();
        for (int i = 0; i < pr->n_inputs; i++) {
            char buf[32];
            snprintf(buf, sizeof buf, "L%d.%s", pr->inputs[i].layer, kv_plan_stream_name(pr->inputs[i].stream));
            push(in, json_string(buf), ok);
        }
        put(po, "inputs", in, ok);
        put(po, "dtype", json_string(pr->dtype == KV_DTYPE_F16 ? "f16" : "f32"), ok);
        json_t *shape = json_array();
        push(shape, jint(pr->out_dim), ok);
        push(shape, jint(pr->in_dim), ok);
        put(po, "shape", shape, ok);
        if (pr->rank >= 1) put(po, "rank", jint(pr->rank), ok);
        if (pr->qbits > 0) { /* 1.4: GPTQ codes */
            put(po, "code_bits", jint(pr->qbits), ok);
            put(po, "group", jint(pr->qgroup), ok);
        }
        const size_t nw = (size_t)pr->out_dim * (size_t)pr->in_dim;
        put(po, "weight_norm", json_real(l2norm(pr->weight, nw)), ok);
        put(po, "bias_norm", json_real(l2norm(pr->bias, (size_t)pr->out_dim)), ok);
        if (full && pr->rank >= 1) {
            put(po, "left", float_array(pr->left, (size_t)pr->out_dim * (size_t)pr->rank, ok), ok);
            put(po, "right", float_array(pr->right, (size_t)pr->rank * (size_t)pr->in_dim, ok), ok);
        }
        if (full) {
            put(po, "weight", float_array(pr->weight, nw, ok), ok);
            put(po, "bias", float_array(pr->bias, (size_t)pr->out_dim, ok), ok);
        }
        put(o, "predictor", po, ok);
    }
    if (s->squat) {
        const kv_plan_squat *q = s->squat;
        json_t *qo = json_object();
        put(qo, "r", jint(q->r), ok);
        put(qo, "lambda", jf32(q->lambda), ok);
        put(qo, "g", jint(q->g), ok);
        put(qo, "subspace", json_string(q->static_subspace ? "static" : "prompt"), ok);
        put(qo, "basis_stored", json_boolean(q->basis != NULL), ok);
        if (q->basis) {
            const size_t nb = (size_t)p->fingerprint.n_kv_heads * (size_t)q->r * (size_t)p->fingerprint.head_dim;
            put(qo, "basis_norm", json_real(l2norm(q->basis, nb)), ok);
            if (full) put(qo, "basis", float_array(q->basis, nb, ok), ok);
        }
        put(o, "squat", qo, ok);
    }
    return o;
}

static json_t *dump_layers(const kv_plan *p, int full, int *ok) {
    json_t *a = json_array();
    for (int l = 0; l < p->n_layers; l++) {
        json_t *o = json_object();
        put(o, "layer", jint(l), ok);
        put(o, "prune_budget", jf32(p->layers[l].prune_budget), ok);
        /* (1.5) plans with attention windows: every layer's (0 = full attention) */
        if (kv_plan_has_windows(p)) put(o, "window", jint(p->layers[l].window), ok);
        put(o, "K", dump_stream(p, l, KV_PLAN_K, full, ok), ok);
        put(o, "V", dump_stream(p, l, KV_PLAN_V, full, ok), ok);
        push(a, o, ok);
    }
    return a;
}

static json_t *dump_totals(const kv_plan *p, int *ok) {
    json_t *o = json_object();
    double sum[2] = {0.0, 0.0};
    for (int l = 0; l < p->n_layers; l++)
        for (int st = 0; st < 2; st++) sum[st] += kv_plan_stream_bits(p, l, st);
    const double kv = (double)p->n_layers;
    put(o, "bits_per_value_K", json_real(sum[0] / kv), ok);
    put(o, "bits_per_value_V", json_real(sum[1] / kv), ok);
    put(o, "bits_per_value", json_real((sum[0] + sum[1]) / (2.0 * kv)), ok);
    const uint64_t pb = kv_plan_predictor_bytes(p);
    put(o, "predictor_bytes", ju64(pb), ok);
    /* Amortized over tokens: one token carries 2 * n_layers * kv_dim values. */
    const double values_per_token = 2.0 * kv * (double)p->fingerprint.n_kv_heads * (double)p->fingerprint.head_dim;
    put(o, "predictor_bits_per_value_at_4096_tokens", json_real((double)pb * 8.0 / (values_per_token * 4096.0)), ok);
    const uint64_t bb = kv_plan_basis_bytes(p);
    put(o, "squat_basis_bytes", ju64(bb), ok);
    put(o, "squat_basis_bits_per_value_at_4096_tokens", json_real((double)bb * 8.0 / (values_per_token * 4096.0)), ok);
    put(o, "note", json_string("bits exclude full-precision sinks/recent tokens; predictors and SQuat bases listed "
                               "separately"), ok);
    return o;
}

static json_t *dump_report(const kv_plan *p, int *ok) {
    const kv_plan_report *r = &p->report;
    json_t *o = json_object();
    json_t *names = json_array();
    for (int m = 0; m < r->n_metrics; m++) push(names, json_string(r->names[m]), ok);
    put(o, "metrics", names, ok);
    json_t *rows = json_array();
    for (int l = 0; l < p->n_layers; l++)
        for (int st = 0; st < 2; st++) {
            json_t *row = json_object();
            put(row, "layer", jint(l), ok);
            put(row, "stream", json_string(kv_plan_stream_name(st)), ok);
            for (int m = 0; m < r->n_metrics; m++)
                put(row, r->names[m], jf32(r->values[((size_t)l * 2 + (size_t)st) * (size_t)r->n_metrics + (size_t)m]), ok);
            push(rows, row, ok);
        }
    put(o, "rows", rows, ok);
    return o;
}

kv_status kv_plan_dump(char **out, const kv_plan *p, int json, int full) {
    *out = NULL;
    if (!p) return KV_ERR(KV_EINVAL, "kv_plan_dump: no plan");
    int ok = 1;
    json_t *root = json_object();
    if (p->file.version_major > 0) put(root, "format", dump_format(p, &ok), &ok);
    put(root, "provenance", dump_provenance(p, &ok), &ok);
    put(root, "fingerprint", dump_fingerprint(p, &ok), &ok);
    put(root, "global", dump_global(p, &ok), &ok);
    put(root, "grids", dump_grids(p, full, &ok), &ok);
    put(root, "layers", dump_layers(p, full, &ok), &ok);
    put(root, "totals", dump_totals(p, &ok), &ok);
    if (p->report.n_metrics > 0) put(root, "report", dump_report(p, &ok), &ok);
    kv_status s = KV_OK;
    if (!ok) {
        s = KV_ERR(KV_ENOMEM, "out of memory dumping a plan");
    } else if (json) {
        char *text = json_dumps(root, JSON_INDENT(2) | JSON_REAL_PRECISION(9));
        if (!text) {
            s = KV_ERR(KV_ENOMEM, "out of memory dumping a plan as JSON");
        } else {
            /* jansson's allocator is malloc: hand it over with a trailing newline. */
            size_t n = strlen(text);
            char *t = realloc(text, n + 2);
            if (!t) {
                free(text);
                s = KV_ERR(KV_ENOMEM, "out of memory");
            } else {
                t[n] = '\n';
                t[n + 1] = '\0';
                *out = t;
            }
        }
    } else {
        s = kv_yaml_from_json(out, root);
    }
    json_decref(root);
    return s;
}
