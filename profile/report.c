/* kvprof reports: the importance result as a JSON tree (jansson), written as JSON or converted to
 * YAML event by event with libyaml's emitter; the kvcal configuration fragment (kv_profile.h). */
#include "kv_profile.h"

#include <jansson.h>
#include <math.h>
#include <string.h>
#include <yaml.h>

static json_t *darray(const double *v, int n) {
    json_t *a = json_array();
    for (int i = 0; i < n; i++) json_array_append_new(a, isfinite(v[i]) ? json_real(v[i]) : json_null());
    return a;
}

static json_t *iarray(const int *v, int n) {
    json_t *a = json_array();
    for (int i = 0; i < n; i++) json_array_append_new(a, json_integer(v[i]));
    return a;
}

static json_t *build(const kv_importance *imp, const kv_alloc *alloc, const kv_stability *st,
                     const kv_importance_meta *meta) {
    json_t *root = json_object();
    json_t *m = json_object();
    json_object_set_new(m, "tool", json_string("kvprof importance " KV_VERSION_STRING));
    if (meta->model_path) json_object_set_new(m, "model", json_string(meta->model_path));
    if (meta->model_name) json_object_set_new(m, "model_name", json_string(meta->model_name));
    if (meta->corpus_path) json_object_set_new(m, "corpus", json_string(meta->corpus_path));
    if (meta->corpus_sha256) json_object_set_new(m, "corpus_sha256", json_string(meta->corpus_sha256));
    json_object_set_new(m, "seed", json_integer((json_int_t)meta->seed));
    json_object_set_new(m, "prompts", json_integer(imp->n_prompts));
    json_object_set_new(m, "prompt_len", json_integer(imp->prompt_len));
    json_object_set_new(m, "layers", json_integer(imp->n_layers));
    json_object_set_new(m, "score", json_string("Frobenius norm of dL/dW, L = mean next-token cross-entropy"));
    json_object_set_new(root, "meta", m);

    json_t *t = json_object();
    json_object_set_new(t, "forward_backward_seconds", json_real(imp->seconds));
    json_object_set_new(t, "seconds_per_prompt", json_real(imp->seconds / imp->n_prompts));
    if (meta->forward_seconds > 0) {
        json_object_set_new(t, "forward_seconds", json_real(meta->forward_seconds));
        json_object_set_new(t, "ratio_to_forward", json_real(imp->seconds / meta->forward_seconds));
    }
    json_object_set_new(root, "timing", t);

    json_t *layers = json_array();
    for (int l = 0; l < imp->n_layers; l++) {
        json_t *e = json_object();
        json_object_set_new(e, "layer", json_integer(l));
        json_object_set_new(e, "k_score", json_real(imp->k_mean[l]));
        json_object_set_new(e, "k_std", json_real(imp->k_std[l]));
        json_object_set_new(e, "v_score", json_real(imp->v_mean[l]));
        json_object_set_new(e, "v_std", json_real(imp->v_std[l]));
        if (alloc) {
            json_object_set_new(e, "k_bits", json_integer(alloc->k_bits[l]));
            json_object_set_new(e, "v_bits", json_integer(alloc->v_bits[l]));
            json_object_set_new(e, "k_rpc", json_real(alloc->k_rpc[l]));
            json_object_set_new(e, "v_rpc", json_real(alloc->v_rpc[l]));
        }
        json_array_append_new(layers, e);
    }
    json_object_set_new(root, "layers", layers);

    if (alloc) {
        json_t *a = json_object();
        const kv_alloc_params *p = meta->params;
        if (p) {
            json_object_set_new(a, "high_frac", json_real(p->high_frac));
            json_object_set_new(a, "k_bits_high_low", iarray((const int[]){p->k_high_bits, p->k_low_bits}, 2));
            json_object_set_new(a, "v_bits_high_low", iarray((const int[]){p->v_high_bits, p->v_low_bits}, 2));
            json_object_set_new(a, "rpc_high_low", darray((const double[]){p->rpc_high, p->rpc_low}, 2));
        }
        json_object_set_new(a, "n_high_layers", json_integer(alloc->n_high));
        json_object_set_new(a, "k_avg_bits", json_real(alloc->k_avg_bits));
        json_object_set_new(a, "v_avg_bits", json_real(alloc->v_avg_bits));
        json_object_set_new(root, "allocation", a);
    }
    if (st && st->half > 0) {
        json_t *s = json_object();
        json_object_set_new(s, "method", json_string("Spearman rho between the mean scores of two disjoint "
                                                     "prompt halves; prefix: first n prompts of half A vs all of B"));
        json_object_set_new(s, "half_size", json_integer(st->half));
        json_object_set_new(s, "k_rho", json_real(st->k_rho));
        json_object_set_new(s, "v_rho", json_real(st->v_rho));
        if (st->n_top > 0) {
            json_object_set_new(s, "top_n", json_integer(st->n_top));
            json_object_set_new(s, "k_top_overlap", json_real(st->k_top_overlap));
            json_object_set_new(s, "v_top_overlap", json_real(st->v_top_overlap));
        }
        json_object_set_new(s, "prefix_k_rho", darray(st->prefix_k_rho, st->n_steps));
        json_object_set_new(s, "prefix_v_rho", darray(st->prefix_v_rho, st->n_steps));
        json_object_set_new(root, "stability", s);
    }
    json_t *pp = json_array();
    for (int p = 0; p < imp->n_prompts; p++) {
        json_t *e = json_object();
        json_object_set_new(e, "start", json_integer((json_int_t)imp->prompt_starts[p]));
        json_object_set_new(e, "loss", json_real(imp->losses[p]));
        json_object_set_new(e, "k", darray(imp->k_scores + (size_t)p * imp->n_layers, imp->n_layers));
        json_object_set_new(e, "v", darray(imp->v_scores + (size_t)p * imp->n_layers, imp->n_layers));
        json_array_append_new(pp, e);
    }
    json_object_set_new(root, "per_prompt", pp);
    return root;
}

/* ---- JSON tree -> YAML events ---------------------------------------------------------------- */
static int emit_scalar(yaml_emitter_t *em, const char *text, int plain) {
    yaml_event_t ev;
    yaml_scalar_event_initialize(&ev, NULL, NULL, (yaml_char_t *)text, (int)strlen(text), plain, !plain,
                                 plain ? YAML_PLAIN_SCALAR_STYLE : YAML_DOUBLE_QUOTED_SCALAR_STYLE);
    return yaml_emitter_emit(em, &ev);
}

static int emit_json(yaml_emitter_t *em, json_t *v, int flow) {
    yaml_event_t ev;
    char buf[64];
    switch (json_typeof(v)) {
    case JSON_OBJECT: {
        yaml_mapping_start_event_initialize(&ev, NULL, NULL, 1, flow ? YAML_FLOW_MAPPING_STYLE : YAML_BLOCK_MAPPING_STYLE);
        if (!yaml_emitter_emit(em, &ev)) return 0;
        const char *key;
        json_t *val;
        json_object_foreach(v, key, val) {
            if (!emit_scalar(em, key, 1) || !emit_json(em, val, flow)) return 0;
        }
        yaml_mapping_end_event_initialize(&ev);
        return yaml_emitter_emit(em, &ev);
    }
    case JSON_ARRAY: {
        /* arrays of numbers and small objects (layer rows) stay on one line each */
        int inner_flow = flow;
        if (json_array_size(v) > 0 && !json_is_object(json_array_get(v, 0))) inner_flow = 1;
        yaml_sequence_start_event_initialize(&ev, NULL, NULL, 1,
                                             inner_flow ? YAML_FLOW_SEQUENCE_STYLE : YAML_BLOCK_SEQUENCE_STYLE);
        if (!yaml_emitter_emit(em, &ev)) return 0;
        size_t i;
        json_t *val;
        json_array_foreach(v, i, val) {
            if (!emit_json(em, val, inner_flow || json_is_object(val))) return 0;
        }
        yaml_sequence_end_event_initialize(&ev);
        return yaml_emitter_emit(em, &ev);
    }
    case JSON_STRING: return emit_scalar(em, json_string_value(v), 0);
    case JSON_INTEGER:
        snprintf(buf, sizeof buf, "%lld", (long long)json_integer_value(v));
        return emit_scalar(em, buf, 1);
    case JSON_REAL: snprintf(buf, sizeof buf, "%.9g", json_real_value(v)); return emit_scalar(em, buf, 1);
    case JSON_TRUE: return emit_scalar(em, "true", 1);
    case JSON_FALSE: return emit_scalar(em, "false", 1);
    case JSON_NULL: return emit_scalar(em, "null", 1);
    }
    return 0;
}

static int write_yaml(FILE *fp, json_t *root) {
    yaml_emitter_t em;
    yaml_event_t ev;
    if (!yaml_emitter_initialize(&em)) return 0;
    yaml_emitter_set_output_file(&em, fp);
    yaml_emitter_set_width(&em, 120);
    yaml_emitter_set_unicode(&em, 1);
    int ok = 1;
    yaml_stream_start_event_initialize(&ev, YAML_UTF8_ENCODING);
    ok = ok && yaml_emitter_emit(&em, &ev);
    yaml_document_start_event_initialize(&ev, NULL, NULL, NULL, 1);
    ok = ok && yaml_emitter_emit(&em, &ev);
    ok = ok && emit_json(&em, root, 0);
    yaml_document_end_event_initialize(&ev, 1);
    ok = ok && yaml_emitter_emit(&em, &ev);
    yaml_stream_end_event_initialize(&ev);
    ok = ok && yaml_emitter_emit(&em, &ev);
    ok = ok && yaml_emitter_flush(&em);
    yaml_emitter_delete(&em);
    return ok;
}

static kv_status write_tree(const char *path, json_t *root, int json) {
    const int to_stdout = !path || strcmp(path, "-") == 0;
    kv_atomic_file af = {0};
    FILE *fp = stdout;
    if (!to_stdout) {
        kv_status s = kv_atomic_open(&af, path);
        if (s != KV_OK) return s;
        fp = af.fp;
    }
    int ok = json ? json_dumpf(root, fp, JSON_INDENT(2) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(9)) == 0 &&
                        fputc('\n', fp) != EOF
                  : write_yaml(fp, root);
    if (!ok) {
        if (!to_stdout) kv_atomic_abort(&af);
        return KV_ERR(KV_EIO, "cannot write the report%s%s", to_stdout ? "" : " to ", to_stdout ? "" : path);
    }
    return to_stdout ? KV_OK : kv_atomic_commit(&af);
}

kv_status kv_importance_report_write(const char *path, int json, const kv_importance *imp,
                                     const kv_alloc *alloc, const kv_stability *st,
                                     const kv_importance_meta *meta) {
    json_t *root = build(imp, alloc, st, meta);
    if (!root) return KV_ERR(KV_ENOMEM, "out of memory building the report");
    kv_status s = write_tree(path, root, json);
    json_decref(root);
    return s;
}

kv_status kv_alloc_config_write(const char *path, const kv_alloc *alloc, const kv_importance_meta *meta) {
    /* The `layers:` block of a kvcal fit configuration (configs/kvcal-example.yaml), keyed by layer
     * index, so that `kvcal fit --config base.yaml --config this.yaml` applies it. */
    json_t *root = json_object();
    json_t *layers = json_object();
    for (int l = 0; l < alloc->n_layers; l++) {
        char key[16];
        snprintf(key, sizeof key, "%d", l);
        json_t *e = json_object();
        json_object_set_new(e, "key_bits", json_integer(alloc->k_bits[l]));
        json_object_set_new(e, "value_bits", json_integer(alloc->v_bits[l]));
        json_object_set_new(e, "key_rpc_ratio", json_real(alloc->k_rpc[l]));
        json_object_set_new(e, "value_rpc_ratio", json_real(alloc->v_rpc[l]));
        json_object_set_new(layers, key, e);
    }
    json_object_set_new(root, "layers", layers);
    (void)meta;
    kv_status s = write_tree(path, root, 0);
    json_decref(root);
    return s;
}
