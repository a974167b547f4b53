/* JSON value tree -> YAML text with libyaml's emitter (used by kv_plan_dump and kv_fit_config_dump).
 * Block style for the structure, flow style for short rows of scalars (readable per-layer tables),
 * literal blocks for multi-line strings; strings that YAML would read as something else are quoted,
 * numbers are written with the fewest digits that read back to the same double. */
#define _POSIX_C_SOURCE 200809L
#include <ctype.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <yaml.h>

#include "plan_internal.h"
#include "yaml_emit.h"
#include "kv_formats.h"

typedef struct out_buf {
    char *data;
    size_t size, cap;
    int failed;
} out_buf;

static int write_handler(void *data, unsigned char *buffer, size_t size) {
    out_buf *o = data;
    if (o->size + size + 1 > o->cap) {
        size_t cap = o->cap ? o->cap : 4096;
        while (cap < o->size + size + 1) cap *= 2;
        char *d = realloc(o->data, cap);
        if (!d) {
            o->failed = 1;
            return 0;
        }
        o->data = d;
        o->cap = cap;
    }
    memcpy(o->data + o->size, buffer, size);
    o->size += size;
    o->data[o->size] = '\0';
    return 1;
}

/* Fewest digits that read back to exactly v (fixed notation for ordinary magnitudes, %g otherwise);
 * always looks like a float to YAML. */
static void format_double(char *buf, size_t n, double v) {
    if (isnan(v)) {
        snprintf(buf, n, ".nan");
        return;
    }
    if (isinf(v)) {
        snprintf(buf, n, v > 0 ? ".inf" : "-.inf");
        return;
    }
    const double a = fabs(v);
    if (a == 0.0 || (a >= 1e-4 && a < 1e16)) {
        /* plain decimals read best: 10000.0 rather than 1e+04 */
        for (int dec = 0; dec <= 20; dec++) {
            snprintf(buf, n, "%.*f", dec, v);
            if (strtod(buf, NULL) == v) break;
        }
        if (strtod(buf, NULL) != v) snprintf(buf, n, "%.17g", v);
    } else {
        for (int prec = 1; prec <= 17; prec++) {
            snprintf(buf, n, "%.*g", prec, v);
            if (strtod(buf, NULL) == v) break;
        }
    }
    /* "1" would read back as an integer: keep it a float ("1.0", "1e+20" stays as is). */
    if (!strpbrk(buf, ".eEn")) {
        size_t len = strlen(buf);
        if (len + 2 < n) memcpy(buf + len, ".0", 3);
    }
}

/* A plain scalar is safe when YAML reads it back as this same string. */
static int plain_safe(const char *s) {
    if (!*s) return 0;
    static const char *const special[] = {"true", "false", "yes", "no", "on", "off", "y", "n", "null", "~"};
    for (size_t i = 0; i < sizeof special / sizeof *special; i++)
        if (strcasecmp(s, special[i]) == 0) return 0;
    if (!(isalpha((unsigned char)s[0]) || s[0] == '_' || s[0] == '/')) return 0;
    for (const char *c = s; *c; c++)
        if (!(isalnum((unsigned char)*c) || strchr("_-./+", *c))) return 0;
    return 1;
}

static int is_scalar(const json_t *v) { return !json_is_object(v) && !json_is_array(v); }
static int is_short_scalar(const json_t *v) {
    if (!is_scalar(v)) return 0;
    if (json_is_string(v)) return json_string_length(v) <= 64 && !strchr(json_string_value(v), '\n');
    return 1;
}

static int emit_scalar(yaml_emitter_t *em, const char *text, int quoted_ok_plain, yaml_scalar_style_t style) {
    yaml_event_t ev;
    if (!yaml_scalar_event_initialize(&ev, NULL, NULL, (yaml_char_t *)text, (int)strlen(text), quoted_ok_plain, 1,
                                      style))
        return 0;
    return yaml_emitter_emit(em, &ev);
}

static int emit_value(yaml_emitter_t *em, const json_t *v) {
    yaml_event_t ev;
    char num[64];
    if (json_is_object(v)) {
        int flow = json_object_size(v) <= 12;
        const char *key;
        const json_t *child;
        json_object_foreach((json_t *)v, key, child) flow = flow && is_short_scalar(child);
        if (!yaml_mapping_start_event_initialize(&ev, NULL, NULL, 1, flow ? YAML_FLOW_MAPPING_STYLE : YAML_BLOCK_MAPPING_STYLE) ||
            !yaml_emitter_emit(em, &ev))
            return 0;
        json_object_foreach((json_t *)v, key, child) {
            /* digit-only keys (layer indices) stay plain: the readers of these documents want numbers */
            const int plain = plain_safe(key) || (key[0] && strspn(key, "0123456789") == strlen(key));
            if (!emit_scalar(em, key, plain, YAML_ANY_SCALAR_STYLE) || !emit_value(em, child)) return 0;
        }
        return yaml_mapping_end_event_initialize(&ev) && yaml_emitter_emit(em, &ev);
    }
    if (json_is_array(v)) {
        int flow = 1;
        size_t i;
        const json_t *child;
        json_array_foreach(v, i, child) flow = flow && is_short_scalar(child);
        if (!yaml_sequence_start_event_initialize(&ev, NULL, NULL, 1, flow ? YAML_FLOW_SEQUENCE_STYLE : YAML_BLOCK_SEQUENCE_STYLE) ||
            !yaml_emitter_emit(em, &ev))
            return 0;
        json_array_foreach(v, i, child) {
            if (!emit_value(em, child)) return 0;
        }
        return yaml_sequence_end_event_initialize(&ev) && yaml_emitter_emit(em, &ev);
    }
    if (json_is_string(v)) {
        const char *s = json_string_value(v);
        if (strchr(s, '\n')) return emit_scalar(em, s, 0, YAML_LITERAL_SCALAR_STYLE);
        return emit_scalar(em, s, plain_safe(s), plain_safe(s) ? YAML_PLAIN_SCALAR_STYLE : YAML_SINGLE_QUOTED_SCALAR_STYLE);
    }
    if (json_is_integer(v)) {
        snprintf(num, sizeof num, "%" JSON_INTEGER_FORMAT, json_integer_value(v));
        return emit_scalar(em, num, 1, YAML_PLAIN_SCALAR_STYLE);
    }
    if (json_is_real(v)) {
        format_double(num, sizeof num, json_real_value(v));
        return emit_scalar(em, num, 1, YAML_PLAIN_SCALAR_STYLE);
    }
    if (json_is_boolean(v)) return emit_scalar(em, json_is_true(v) ? "true" : "false", 1, YAML_PLAIN_SCALAR_STYLE);
    return emit_scalar(em, "null", 1, YAML_PLAIN_SCALAR_STYLE);
}

kv_status kv_yaml_from_json(char **out, const json_t *root) {
    *out = NULL;
    yaml_emitter_t em;
    yaml_event_t ev;
    out_buf o = {0};
    if (!yaml_emitter_initialize(&em)) return KV_ERR(KV_ENOMEM, "out of memory (YAML emitter)");
    yaml_emitter_set_output(&em, write_handler, &o);
    yaml_emitter_set_unicode(&em, 1);
    yaml_emitter_set_width(&em, 160);
    yaml_emitter_set_indent(&em, 2);
    int ok = yaml_stream_start_event_initialize(&ev, YAML_UTF8_ENCODING) && yaml_emitter_emit(&em, &ev) &&
             yaml_document_start_event_initialize(&ev, NULL, NULL, NULL, 1) && yaml_emitter_emit(&em, &ev) &&
             emit_value(&em, root) && yaml_document_end_event_initialize(&ev, 1) && yaml_emitter_emit(&em, &ev) &&
             yaml_stream_end_event_initialize(&ev) && yaml_emitter_emit(&em, &ev) && yaml_emitter_flush(&em);
    kv_status s = KV_OK;
    if (!ok || o.failed)
        s = KV_ERR(o.failed ? KV_ENOMEM : KV_EINVAL, "YAML emitter failed: %s", em.problem ? em.problem : "out of memory");
    yaml_emitter_delete(&em);
    if (s != KV_OK) {
        free(o.data);
        return s;
    }
    if (!o.data) { /* nothing written (cannot happen for a document, but keep the contract) */
        o.data = calloc(1, 1);
        if (!o.data) return KV_ERR(KV_ENOMEM, "out of memory");
    }
    *out = o.data;
    return KV_OK;
}
