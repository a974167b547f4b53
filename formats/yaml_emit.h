/* yaml_emit.h — YAML text from a JSON value tree (plan_yaml.c), for the plan dump and the configuration dump
 * (not a public header; formats/ only, not the kvplan library). */
#ifndef KV_YAML_EMIT_H
#define KV_YAML_EMIT_H

#include <jansson.h>

#include "kv_common.h"

/* Emit a JSON value tree as a YAML document (block style; multi-line strings as literals).
 * Caller frees *out. */
kv_status kv_yaml_from_json(char **out, const json_t *root);

#endif
