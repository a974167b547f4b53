/* kvcal fit configuration: YAML -> kv_fit_config with defaults, per-key validation naming the line
 * and the key (libyaml marks), unknown keys rejected, dotted command-line overrides, and a dump of
 * the resolved configuration back to YAML. Every key is one row of k_keys below: parsing,
 * overriding, dumping and the documentation (configs/kvcal-example.yaml) all follow that table. */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <yaml.h>

#include "plan_internal.h"
#include "yaml_emit.h"
#include "kv_formats.h"

/* T_BITS: an int in [min, max] or KV_FIT_F16_BITS (16: the stream kept in f16, unquantized). */
typedef enum key_type { T_INT, T_I64, T_U64, T_DOUBLE, T_BOOL, T_STRING, T_ENUM, T_BITS } key_type;

typedef struct key_desc {
    const char *path;
    key_type type;
    size_t offset;
    double min, max;                 /* inclusive range of numbers */
    const char *const *enum_names;   /* T_ENUM: names indexed by value, NULL-terminated */
} key_desc;

/* The methods: one name and one row of traits each, indexed by kv_fit_method (the fit's side of a method is
 * its row of calib/fitters.c). */
static const char *const k_methods[KV_FIT_METHOD_COUNT + 1] = {
    [KV_FIT_AQUA] = "aqua", [KV_FIT_AQUA_UNIFORM] = "aqua-uniform", [KV_FIT_HIGGS] = "higgs", [KV_FIT_KIVI] = "kivi",
    [KV_FIT_FP8] = "fp8",   [KV_FIT_NVFP4] = "nvfp4",               [KV_FIT_XQUANT] = "xquant", [KV_FIT_SQUAT] = "squat",
    [KV_FIT_METHOD_COUNT] = NULL};
static const kv_fit_method_traits k_method_traits[] = {
    [KV_FIT_AQUA] = {KV_FIT_T_HIGGS | KV_FIT_T_PREDICTS},
    [KV_FIT_AQUA_UNIFORM] = {KV_FIT_T_PREDICTS | KV_FIT_T_SQUAT_OK},
    [KV_FIT_HIGGS] = {KV_FIT_T_HIGGS},
    [KV_FIT_KIVI] = {KV_FIT_T_F16 | KV_FIT_T_SQUAT_OK | KV_FIT_T_UNCALIBRATED},
    [KV_FIT_FP8] = {KV_FIT_T_FLOAT},
    [KV_FIT_NVFP4] = {KV_FIT_T_FLOAT},
    [KV_FIT_XQUANT] = {KV_FIT_T_F16 | KV_FIT_T_WHOLE_PLAN | KV_FIT_T_XQUANT},
    [KV_FIT_SQUAT] = {KV_FIT_T_F16 | KV_FIT_T_SQUAT_OK | KV_FIT_T_SQUAT | KV_FIT_T_WHOLE_PLAN},
};
_Static_assert(sizeof k_method_traits / sizeof *k_method_traits == KV_FIT_METHOD_COUNT,
               "one row of traits per kv_fit_method");
static const char *const k_sq_subspace[] = {"prompt", "static", NULL}; /* = KV_FIT_SQ_PROMPT, KV_FIT_SQ_STATIC */
static const char *const k_sq_choose[] = {"calibrated", "fixed", NULL}; /* = KV_FIT_SQ_CALIBRATED, KV_FIT_SQ_FIXED */
static const char *const k_fp8_formats[] = {"e4m3", "e5m2", NULL};
static const char *const k_granularity[] = {"tensor", "head", NULL};
static const char *const k_fp_scales[] = {"calibrated", "one", NULL};
static const char *const k_axes[] = {"tokens", "channels", NULL};
static const char *const k_dtypes[] = {"f32", "f16", NULL}; /* = KV_DTYPE_F32, KV_DTYPE_F16 */
static const char *const k_weights[] = {"f32", "f16", "native", NULL}; /* = model/'s kv_weight_storage */
static const char *const k_prunes[] = {"none", "streamingllm", "h2o", "snapkv", "pyramidkv", NULL};
static const char *const k_windowed[] = {"compress", "f16", NULL}; /* kv_fit_windowed */

#define OFF(field) offsetof(kv_fit_config, field)
#define STREAM_KEYS(prefix, member)                                                            \
    {prefix ".bits", T_BITS, OFF(member.bits), KV_FIT_MIN_BITS, KV_FIT_MAX_BITS, NULL},                                     \
    {prefix ".group_size", T_INT, OFF(member.group_size), 1, 1 << 20, NULL},                   \
    {prefix ".group_axis", T_ENUM, OFF(member.group_axis), 0, 0, k_axes},                      \
    {prefix ".scale_dtype", T_ENUM, OFF(member.scale_dtype), 0, 0, k_dtypes},                  \
    {prefix ".eta", T_DOUBLE, OFF(member.eta), 0, 0.4999, NULL},                               \
    {prefix ".pack3", T_INT, OFF(member.pack3), 10, 11, NULL}

static const key_desc k_keys[] = {
    {"method", T_ENUM, OFF(method), 0, 0, k_methods},
    {"seed", T_U64, OFF(seed), 0, 0, NULL},
    {"model", T_STRING, OFF(model), 0, 0, NULL},
    {"data.calibration", T_STRING, OFF(data.calibration), 0, 0, NULL},
    {"data.heldout", T_STRING, OFF(data.heldout), 0, 0, NULL},
    {"data.heldout_fraction", T_DOUBLE, OFF(data.heldout_fraction), 0, 0.9, NULL},
    {"data.seq_len", T_INT, OFF(data.seq_len), 2, 1 << 20, NULL},
    {"data.max_tokens", T_I64, OFF(data.max_tokens), 0, 1e15, NULL},
    {"data.shard_seqs", T_INT, OFF(data.shard_seqs), 0, 1 << 20, NULL},
    {"cache.sinks", T_INT, OFF(cache.sinks), 0, 1 << 20, NULL},
    {"cache.recent", T_INT, OFF(cache.recent), 0, 1 << 24, NULL},
    {"cache.pre_rope", T_BOOL, OFF(cache.pre_rope), 0, 1, NULL},
    {"cache.rpc_ratio", T_DOUBLE, OFF(cache.rpc_ratio), 0, 1, NULL},
    {"cache.windowed_layers", T_ENUM, OFF(cache.windowed_layers), 0, 0, k_windowed},
    STREAM_KEYS("keys", keys),
    STREAM_KEYS("values", values),
    {"aqua.ridge", T_DOUBLE, OFF(aqua.ridge), 0, 1e6, NULL},
    {"aqua.predict_keys", T_BOOL, OFF(aqua.predict_keys), 0, 1, NULL},
    {"aqua.predict_values", T_BOOL, OFF(aqua.predict_values), 0, 1, NULL},
    {"aqua.value_uses_keys", T_BOOL, OFF(aqua.value_uses_keys), 0, 1, NULL},
    {"aqua.first_layer_bits", T_INT, OFF(aqua.first_layer_bits), 1, 16, NULL},
    {"aqua.predictor_dtype", T_ENUM, OFF(aqua.predictor_dtype), 0, 0, k_dtypes},
    {"aqua.rank", T_INT, OFF(aqua.rank), 0, 65536, NULL},
    {"aqua.predictor_bits", T_INT, OFF(aqua.predictor_bits), 0, 4, NULL},
    {"aqua.predictor_group", T_INT, OFF(aqua.predictor_group), 1, 65536, NULL},
    {"higgs.d", T_INT, OFF(higgs.d), 1, 8, NULL},
    {"higgs.n", T_INT, OFF(higgs.n), 0, 65536, NULL},
    {"higgs.group_size", T_INT, OFF(higgs.group_size), 0, 1 << 20, NULL},
    {"higgs.grid_samples", T_I64, OFF(higgs.grid_samples), 1000, 1e10, NULL},
    {"higgs.grid_iters", T_INT, OFF(higgs.grid_iters), 1, 100000, NULL},
    {"squat.enabled", T_BOOL, OFF(squat.enabled), 0, 1, NULL},
    {"squat.r", T_INT, OFF(squat.r), 1, 4096, NULL},
    {"squat.lambda", T_DOUBLE, OFF(squat.lambda), 0, 1e6, NULL},
    {"squat.g", T_INT, OFF(squat.g), 0, 4096, NULL},
    {"squat.static_basis", T_BOOL, OFF(squat.static_basis), 0, 1, NULL},
    {"squat.subspace", T_ENUM, OFF(squat.subspace), 0, 0, k_sq_subspace},
    {"squat.choose", T_ENUM, OFF(squat.choose), 0, 0, k_sq_choose},
    {"xquant.km", T_INT, OFF(xquant.km), -1, 4096, NULL},
    {"xquant.vm", T_INT, OFF(xquant.vm), -1, 4096, NULL},
    {"xquant.kq", T_INT, OFF(xquant.kq), -1, 4096, NULL},
    {"xquant.vq", T_INT, OFF(xquant.vq), -1, 4096, NULL},
    {"xquant.eta1", T_DOUBLE, OFF(xquant.eta1), 0, 0.4999, NULL},
    {"xquant.eta2", T_DOUBLE, OFF(xquant.eta2), 0, 0.4999, NULL},
    {"xquant.calibrate_eta", T_BOOL, OFF(xquant.calibrate_eta), 0, 1, NULL},
    {"xquant.target_bits", T_DOUBLE, OFF(xquant.target_bits), 0, 64, NULL},
    {"pruning.method", T_ENUM, OFF(pruning.method), 0, 0, k_prunes},
    {"pruning.budget", T_DOUBLE, OFF(pruning.budget), -1e9, 1e9, NULL}, /* (0, 1]: kv_fit_config_validate */
    {"pruning.window", T_INT, OFF(pruning.window), 0, 1 << 20, NULL},
    {"pruning.pool", T_INT, OFF(pruning.pool), 0, 1023, NULL},
    {"fp.fp8_format", T_ENUM, OFF(fp.fp8_format), 0, 0, k_fp8_formats},
    {"fp.scale_granularity", T_ENUM, OFF(fp.scale_granularity), 0, 0, k_granularity},
    {"fp.scale", T_ENUM, OFF(fp.scale), 0, 0, k_fp_scales},
    {"memory.weights", T_ENUM, OFF(memory.weights), 0, 0, k_weights},
    {"memory.stream_weights", T_BOOL, OFF(memory.stream_weights), 0, 1, NULL},
    {"memory.hidden_dtype", T_ENUM, OFF(memory.hidden_dtype), 0, 0, k_dtypes},
    {"memory.spill_dir", T_STRING, OFF(memory.spill_dir), 0, 0, NULL},
};
#undef OFF
enum { N_KEYS = sizeof k_keys / sizeof *k_keys };

/* Per-layer override fields: layers.<N>.<name>. */
#define LOFF(field) offsetof(kv_fit_layer_override, field)
static const struct layer_key {
    const char *name;
    key_type type;
    size_t offset;
    double min, max;
    unsigned bit;
    const char *const *enum_names; /* T_ENUM */
} k_layer_keys[] = {
    {"key_bits", T_BITS, LOFF(key_bits), KV_FIT_MIN_BITS, KV_FIT_MAX_BITS, KV_FIT_LO_KEY_BITS, NULL},
    {"value_bits", T_BITS, LOFF(value_bits), KV_FIT_MIN_BITS, KV_FIT_MAX_BITS, KV_FIT_LO_VALUE_BITS, NULL},
    {"rpc_ratio", T_DOUBLE, LOFF(rpc_ratio), 0, 1, KV_FIT_LO_RPC_RATIO, NULL},
    {"key_eta", T_DOUBLE, LOFF(key_eta), 0, 0.4999, KV_FIT_LO_KEY_ETA, NULL},
    {"value_eta", T_DOUBLE, LOFF(value_eta), 0, 0.4999, KV_FIT_LO_VALUE_ETA, NULL},
    {"prune_budget", T_DOUBLE, LOFF(prune_budget), 1e-6, 1, KV_FIT_LO_PRUNE_BUDGET, NULL},
    {"key_rpc_ratio", T_DOUBLE, LOFF(key_rpc_ratio), 0, 1, KV_FIT_LO_KEY_RPC_RATIO, NULL},
    {"value_rpc_ratio", T_DOUBLE, LOFF(value_rpc_ratio), 0, 1, KV_FIT_LO_VALUE_RPC_RATIO, NULL},
    {"key_method", T_ENUM, LOFF(key_method), 0, 0, KV_FIT_LO_KEY_METHOD, k_methods},
    {"value_method", T_ENUM, LOFF(value_method), 0, 0, KV_FIT_LO_VALUE_METHOD, k_methods},
    {"key_pre_rope", T_BOOL, LOFF(key_pre_rope), 0, 1, KV_FIT_LO_KEY_PRE_ROPE, NULL},
    {"key_rank", T_INT, LOFF(key_rank), 0, 65536, KV_FIT_LO_KEY_RANK, NULL},
    {"value_rank", T_INT, LOFF(value_rank), 0, 65536, KV_FIT_LO_VALUE_RANK, NULL},
    {"key_predictor_bits", T_INT, LOFF(key_predictor_bits), 0, 4, KV_FIT_LO_KEY_PRED_BITS, NULL},
    {"value_predictor_bits", T_INT, LOFF(value_predictor_bits), 0, 4, KV_FIT_LO_VALUE_PRED_BITS, NULL},
    {"key_group_axis", T_ENUM, LOFF(key_group_axis), 0, 0, KV_FIT_LO_KEY_GROUP_AXIS, k_axes},
    {"key_group_size", T_INT, LOFF(key_group_size), 1, 65536, KV_FIT_LO_KEY_GROUP_SIZE, NULL},
    {"value_group_axis", T_ENUM, LOFF(value_group_axis), 0, 0, KV_FIT_LO_VALUE_GROUP_AXIS, k_axes},
    {"value_group_size", T_INT, LOFF(value_group_size), 1, 65536, KV_FIT_LO_VALUE_GROUP_SIZE, NULL},
};
#undef LOFF
enum { N_LAYER_KEYS = sizeof k_layer_keys / sizeof *k_layer_keys, MAX_LAYER = 4095 };

/* Where each key got its value ("file:line:col", "command line", "" = default). */
typedef struct origin {
    char where[N_KEYS][128];
} origin;

const char *kv_fit_method_name(int m) { return m >= 0 && m < KV_FIT_METHOD_COUNT ? k_methods[m] : NULL; }

const kv_fit_method_traits *kv_fit_method_traits_of(int m) {
    return m >= 0 && m < KV_FIT_METHOD_COUNT ? &k_method_traits[m] : NULL;
}

int kv_fit_method_has(int m, unsigned flags) {
    const kv_fit_method_traits *t = kv_fit_method_traits_of(m);
    return t && (t->flags & flags) == flags;
}

int kv_fit_method_from_name(const char *name) {
    for (int m = 0; name && m < KV_FIT_METHOD_COUNT; m++)
        if (strcmp(name, k_methods[m]) == 0) return m;
    return -1;
}

/* ---- init / free --------------------------------------------------------------------------- */
kv_status kv_fit_config_init(kv_fit_config *c) {
    memset(c, 0, sizeof *c);
    c->method = KV_FIT_AQUA;
    c->seed = 0;
    c->model = kv_plan_strdup("");
    c->data.calibration = kv_plan_strdup("");
    c->data.heldout = kv_plan_strdup("");
    c->data.heldout_fraction = 0.1;
    c->data.seq_len = 1024;
    c->data.max_tokens = 262144;
    c->cache.sinks = 4;
    c->cache.recent = 128;
    c->cache.pre_rope = 1;
    c->cache.rpc_ratio = 0.0;
    c->cache.windowed_layers = KV_FIT_WINDOWED_COMPRESS;
    const kv_fit_stream_config keys = {2, 64, KV_PLAN_GROUP_TOKENS, KV_DTYPE_F16, 0.0, 11};
    const kv_fit_stream_config values = {2, 64, KV_PLAN_GROUP_CHANNELS, KV_DTYPE_F16, 0.0, 11};
    c->keys = keys;
    c->values = values;
    c->aqua.ridge = 1e-3;
    c->aqua.predict_keys = 1;
    c->aqua.predict_values = 1;
    c->aqua.value_uses_keys = 1;
    c->aqua.first_layer_bits = 4;
    c->aqua.predictor_dtype = KV_DTYPE_F16;
    c->aqua.predictor_bits = 0;
    c->aqua.predictor_group = 64;
    c->higgs.d = 2;
    c->higgs.n = 0;
    c->higgs.group_size = 0;
    c->higgs.grid_samples = 1 << 20;
    c->higgs.grid_iters = 100;
    c->squat.enabled = 0;
    c->squat.r = 5;
    c->squat.lambda = 1e-3;
    c->squat.g = 0;
    c->squat.static_basis = 1;
    c->squat.subspace = KV_FIT_SQ_PROMPT;
    c->squat.choose = KV_FIT_SQ_CALIBRATED;
    c->xquant.km = c->xquant.vm = c->xquant.kq = c->xquant.vq = -1;
    c->xquant.eta1 = 0.2;
    c->xquant.eta2 = 0.05;
    c->pruning.method = KV_PLAN_PRUNE_NONE;
    c->pruning.budget = 1.0;
    c->pruning.window = 32;
    c->pruning.pool = 7;
    c->memory.weights = 0;
    c->memory.stream_weights = 1;
    c->memory.hidden_dtype = KV_DTYPE_F32;
    c->memory.spill_dir = kv_plan_strdup("");
    c->origins_ = calloc(1, sizeof(origin));
    if (!c->model || !c->data.calibration || !c->data.heldout || !c->memory.spill_dir || !c->origins_) {
        kv_fit_config_free(c);
        return KV_ERR(KV_ENOMEM, "out of memory");
    }
    return KV_OK;
}

void kv_fit_config_free(kv_fit_config *c) {
    if (!c) return;
    for (int i = 0; i < N_KEYS; i++)
        if (k_keys[i].type == T_STRING) free(*(char **)((char *)c + k_keys[i].offset));
    free(c->layer_overrides);
    free(c->origins_);
    memset(c, 0, sizeof *c);
}

/* ---- values ---------------------------------------------------------------------------------- */
/* Parse `text` for a value of the given type/range into dst. On failure writes the reason to why. */
static int parse_value(key_type type, double min, double max, const char *const *enum_names, const char *text,
                       void *dst, char *why, size_t why_n) {
    char *end = NULL;
    errno = 0;
    switch (type) {
    case T_INT:
    case T_BITS:
    case T_I64: {
        long long v = strtoll(text, &end, 10);
        const int f16 = type == T_BITS && !errno && end != text && !*end && v == KV_FIT_F16_BITS;
        if (!f16 && (errno || end == text || *end || (double)v < min || (double)v > max)) {
            snprintf(why, why_n, "expected an integer in [%.0f, %.0f], got '%s'%s", min, max, text,
                     type == T_BITS ? " (or 16: the stream kept in f16, unquantized)" : "");
            return 0;
        }
        if (type != T_I64) *(int *)dst = (int)v;
        else *(int64_t *)dst = (int64_t)v;
        return 1;
    }
    case T_U64: {
        unsigned long long v = strtoull(text, &end, 10);
        if (errno || end == text || *end || text[0] == '-') {
            snprintf(why, why_n, "expected a non-negative integer, got '%s'", text);
            return 0;
        }
        *(uint64_t *)dst = (uint64_t)v;
        return 1;
    }
    case T_DOUBLE: {
        double v = strtod(text, &end);
        if (errno || end == text || *end || !isfinite(v) || v < min || v > max) {
            snprintf(why, why_n, "expected a number in [%g, %g], got '%s'", min, max, text);
            return 0;
        }
        *(double *)dst = v;
        return 1;
    }
    case T_BOOL: {
        static const char *const yes[] = {"true", "yes", "on"}, *const no[] = {"false", "no", "off"};
        for (int i = 0; i < 3; i++) {
            if (strcasecmp(text, yes[i]) == 0) {
                *(int *)dst = 1;
                return 1;
            }
            if (strcasecmp(text, no[i]) == 0) {
                *(int *)dst = 0;
                return 1;
            }
        }
        snprintf(why, why_n, "expected true or false, got '%s'", text);
        return 0;
    }
    case T_STRING: {
        char *s = kv_plan_strdup(text);
        if (!s) {
            snprintf(why, why_n, "out of memory");
            return 0;
        }
        free(*(char **)dst);
        *(char **)dst = s;
        return 1;
    }
    case T_ENUM: {
        for (int i = 0; enum_names[i]; i++)
            if (strcasecmp(text, enum_names[i]) == 0) {
                *(int *)dst = i;
                return 1;
            }
        size_t n = (size_t)snprintf(why, why_n, "expected one of");
        for (int i = 0; enum_names[i] && n < why_n; i++)
            n += (size_t)snprintf(why + n, why_n - n, "%s %s", i ? "," : "", enum_names[i]);
        if (n < why_n) snprintf(why + n, why_n - n, "; got '%s'", text);
        return 0;
    }
    }
    return 0;
}

static int find_key(const char *path) {
    for (int i = 0; i < N_KEYS; i++)
        if (strcmp(k_keys[i].path, path) == 0) return i;
    return -1;
}

/* 1 when some key lies under "prefix." */
static int is_section(const char *prefix) {
    size_t n = strlen(prefix);
    for (int i = 0; i < N_KEYS; i++)
        if (strncmp(k_keys[i].path, prefix, n) == 0 && k_keys[i].path[n] == '.') return 1;
    return 0;
}

/* "a, b, c" list of the keys directly under prefix ("" = top level), for unknown-key messages. */
static void known_under(const char *prefix, char *buf, size_t n) {
    size_t used = 0, pl = strlen(prefix);
    buf[0] = '\0';
    const char *last = NULL;
    size_t last_len = 0;
    for (int i = 0; i < N_KEYS && used < n; i++) {
        const char *p = k_keys[i].path;
        if (pl && (strncmp(p, prefix, pl) != 0 || p[pl] != '.')) continue;
        const char *rest = pl ? p + pl + 1 : p;
        size_t len = strcspn(rest, ".");
        if (last && last_len == len && strncmp(last, rest, len) == 0) continue;
        used += (size_t)snprintf(buf + used, n - used, "%s%.*s", used ? ", " : "", (int)len, rest);
        last = rest;
        last_len = len;
    }
    if (!pl && used < n) snprintf(buf + used, n - used, ", layers");
}

static kv_fit_layer_override *layer_slot(kv_fit_config *c, int layer) {
    int i = 0;
    while (i < c->n_layer_overrides && c->layer_overrides[i].layer < layer) i++;
    if (i < c->n_layer_overrides && c->layer_overrides[i].layer == layer) return &c->layer_overrides[i];
    kv_fit_layer_override *n = realloc(c->layer_overrides, (size_t)(c->n_layer_overrides + 1) * sizeof *n);
    if (!n) return NULL;
    c->layer_overrides = n;
    memmove(&n[i + 1], &n[i], (size_t)(c->n_layer_overrides - i) * sizeof *n);
    memset(&n[i], 0, sizeof *n);
    n[i].layer = layer;
    c->n_layer_overrides++;
    return &n[i];
}

/* Set key `path` (dotted; "layers.N.field" included) from text; `where` names the origin.
 * Errors: KV_EINVAL "WHERE: key 'PATH': reason". */
static kv_status set_path(kv_fit_config *c, const char *path, const char *text, const char *where) {
    char why[512];
    int k = find_key(path);
    if (k >= 0) {
        const key_desc *d = &k_keys[k];
        if (!parse_value(d->type, d->min, d->max, d->enum_names, text, (char *)c + d->offset, why, sizeof why))
            return KV_ERR(KV_EINVAL, "%s: key '%s': %s", where, path, why);
        if (c->origins_) snprintf(((origin *)c->origins_)->where[k], sizeof ((origin *)0)->where[k], "%s", where);
        return KV_OK;
    }
    if (strncmp(path, "layers.", 7) == 0) {
        const char *p = path + 7;
        char *end = NULL;
        errno = 0;
        long layer = strtol(p, &end, 10);
        if (end == p || errno || *end != '.' || layer < 0 || layer > MAX_LAYER || !(p[0] >= '0' && p[0] <= '9'))
            return KV_ERR(KV_EINVAL, "%s: key '%s': expected layers.<layer index 0..%d>.<field>", where, path, MAX_LAYER);
        const char *field = end + 1;
        for (int i = 0; i < N_LAYER_KEYS; i++) {
            const struct layer_key *lk = &k_layer_keys[i];
            if (strcmp(lk->name, field) != 0) continue;
            kv_fit_layer_override tmp;
            memset(&tmp, 0, sizeof tmp);
            if (!parse_value(lk->type, lk->min, lk->max, lk->enum_names, text, (char *)&tmp + lk->offset, why, sizeof why))
                return KV_ERR(KV_EINVAL, "%s: key '%s': %s", where, path, why);
            kv_fit_layer_override *o = layer_slot(c, (int)layer);
            if (!o) return KV_ERR(KV_ENOMEM, "out of memory");
            if (!o->where[0]) snprintf(o->where, sizeof o->where, "%s", where);
            memcpy((char *)o + lk->offset, (char *)&tmp + lk->offset, lk->type == T_DOUBLE ? sizeof(double) : sizeof(int));
            o->set |= lk->bit;
            return KV_OK;
        }
        return KV_ERR(KV_EINVAL,
                      "%s: unknown key '%s' (a layer override has key_bits, value_bits, rpc_ratio, key_rpc_ratio, value_rpc_ratio, key_eta, value_eta, "
                      "prune_budget, key_method, value_method, key_pre_rope, key_rank, value_rank, key_predictor_bits, "
                      "value_predictor_bits, key_group_axis, key_group_size, value_group_axis, value_group_size)", where, path);
    }
    char known[512];
    const char *dot = strrchr(path, '.');
    char prefix[128] = "";
    if (dot && (size_t)(dot - path) < sizeof prefix) {
        memcpy(prefix, path, (size_t)(dot - path));
        prefix[dot - path] = '\0';
    }
    if (prefix[0] && !is_section(prefix)) prefix[0] = '\0';
    known_under(prefix, known, sizeof known);
    return KV_ERR(KV_EINVAL, "%s: unknown key '%s' (known keys%s%s: %s)", where, path, prefix[0] ? " under " : "",
                  prefix, known);
}

/* ---- YAML documents -------------------------------------------------------------------------- */
typedef struct loader {
    kv_fit_config *c;
    yaml_document_t *doc;
    const char *source;
} loader;

static void mark_str(char *buf, size_t n, const char *source, yaml_mark_t m) {
    snprintf(buf, n, "%s:%zu:%zu", source, m.line + 1, m.column + 1);
}

static const char *scalar_text(const yaml_node_t *node) { return (const char *)node->data.scalar.value; }

static kv_status load_mapping(loader *ld, yaml_node_t *map, const char *prefix);

static kv_status load_layers(loader *ld, yaml_node_t *map) {
    char where[256];
    for (yaml_node_pair_t *pr = map->data.mapping.pairs.start; pr < map->data.mapping.pairs.top; pr++) {
        yaml_node_t *k = yaml_document_get_node(ld->doc, pr->key);
        yaml_node_t *v = yaml_document_get_node(ld->doc, pr->value);
        if (!k || !v) return KV_ERR(KV_EINVAL, "%s: malformed YAML document", ld->source);
        mark_str(where, sizeof where, ld->source, k->start_mark);
        if (k->type != YAML_SCALAR_NODE)
            return KV_ERR(KV_EINVAL, "%s: key under 'layers' must be a layer index", where);
        if (v->type != YAML_MAPPING_NODE)
            return KV_ERR(KV_EINVAL, "%s: key 'layers.%s' must be a mapping of overrides (key_bits: 3, ...)", where,
                          scalar_text(k));
        for (yaml_node_pair_t *q = pr + 1; q < map->data.mapping.pairs.top; q++) {
            yaml_node_t *k2 = yaml_document_get_node(ld->doc, q->key);
            if (k2 && k2->type == YAML_SCALAR_NODE && strcmp(scalar_text(k2), scalar_text(k)) == 0) {
                mark_str(where, sizeof where, ld->source, k2->start_mark);
                return KV_ERR(KV_EINVAL, "%s: duplicate key 'layers.%s'", where, scalar_text(k));
            }
        }
        char prefix[64];
        snprintf(prefix, sizeof prefix, "layers.%.40s", scalar_text(k));
        kv_status s = load_mapping(ld, v, prefix);
        if (s != KV_OK) return s;
    }
    return KV_OK;
}

static kv_status load_mapping(loader *ld, yaml_node_t *map, const char *prefix) {
    char where[256], path[256];
    for (yaml_node_pair_t *pr = map->data.mapping.pairs.start; pr < map->data.mapping.pairs.top; pr++) {
        yaml_node_t *k = yaml_document_get_node(ld->doc, pr->key);
        yaml_node_t *v = yaml_document_get_node(ld->doc, pr->value);
        if (!k || !v) return KV_ERR(KV_EINVAL, "%s: malformed YAML document", ld->source);
        mark_str(where, sizeof where, ld->source, k->start_mark);
        if (k->type != YAML_SCALAR_NODE) return KV_ERR(KV_EINVAL, "%s: a key must be a plain name", where);
        const char *name = scalar_text(k);
        if (strlen(name) + strlen(prefix) + 2 > sizeof path)
            return KV_ERR(KV_EINVAL, "%s: key '%.64s...' is too long", where, name);
        {   /* length checked above; explicit copies keep -Wformat-truncation quiet */
            size_t pl = strlen(prefix), nl = strlen(name), at = 0;
            memcpy(path, prefix, pl);
            at = pl;
            if (pl) path[at++] = '.';
            memcpy(path + at, name, nl + 1);
        }
        for (yaml_node_pair_t *q = map->data.mapping.pairs.start; q < pr; q++) {
            yaml_node_t *k2 = yaml_document_get_node(ld->doc, q->key);
            if (k2 && k2->type == YAML_SCALAR_NODE && strcmp(scalar_text(k2), name) == 0)
                return KV_ERR(KV_EINVAL, "%s: duplicate key '%s'", where, path);
        }
        kv_status s;
        if (!*prefix && strcmp(name, "layers") == 0) {
            if (v->type != YAML_MAPPING_NODE)
                return KV_ERR(KV_EINVAL, "%s: key 'layers' must be a mapping from layer index to overrides", where);
            s = load_layers(ld, v);
        } else if (find_key(path) < 0 && is_section(path)) {
            if (v->type != YAML_MAPPING_NODE) return KV_ERR(KV_EINVAL, "%s: key '%s' must be a mapping", where, path);
            s = load_mapping(ld, v, path);
        } else if (v->type != YAML_SCALAR_NODE && (find_key(path) >= 0 || strncmp(path, "layers.", 7) == 0)) {
            return KV_ERR(KV_EINVAL, "%s: key '%s' takes a single value, not a %s", where, path,
                          v->type == YAML_MAPPING_NODE ? "mapping" : "list");
        } else {
            /* The value's own position points at the value; the key's at the key: report the key's line
             * for unknown keys, the value's for bad values. */
            char vwhere[256];
            mark_str(vwhere, sizeof vwhere, ld->source, v->start_mark);
            if (find_key(path) < 0 && strncmp(path, "layers.", 7) != 0) {
                s = set_path(ld->c, path, "", where);
            } else {
                const char *text = v->type == YAML_SCALAR_NODE ? scalar_text(v) : "";
                /* A plain "~"/"null"/empty is YAML null: strings become "", others reject it. */
                const int is_null = v->type == YAML_SCALAR_NODE && v->data.scalar.style == YAML_PLAIN_SCALAR_STYLE &&
                                    (!*text || strcmp(text, "~") == 0 || strcasecmp(text, "null") == 0);
                if (is_null && find_key(path) >= 0 && k_keys[find_key(path)].type == T_STRING) text = "";
                s = set_path(ld->c, path, text, vwhere);
            }
        }
        if (s != KV_OK) return s;
    }
    return KV_OK;
}

kv_status kv_fit_config_load_string(kv_fit_config *c, const char *yaml, size_t len, const char *source) {
    if (!c || (!yaml && len)) return KV_ERR(KV_EINVAL, "kv_fit_config_load_string: no config or no text");
    if (!source) source = "<string>";
    yaml_parser_t parser;
    yaml_document_t doc;
    if (!yaml_parser_initialize(&parser)) return KV_ERR(KV_ENOMEM, "out of memory (YAML parser)");
    yaml_parser_set_input_string(&parser, (const unsigned char *)(yaml ? yaml : ""), len);
    if (!yaml_parser_load(&parser, &doc)) {
        kv_status s = KV_ERR(KV_EINVAL, "%s:%zu:%zu: YAML syntax error: %s%s%s", source, parser.problem_mark.line + 1,
                             parser.problem_mark.column + 1, parser.problem ? parser.problem : "?",
                             parser.context ? " " : "", parser.context ? parser.context : "");
        yaml_parser_delete(&parser);
        return s;
    }
    kv_status s = KV_OK;
    yaml_node_t *root = yaml_document_get_root_node(&doc);
    if (root && !(root->type == YAML_SCALAR_NODE && root->data.scalar.length == 0)) {
        if (root->type != YAML_MAPPING_NODE) {
            s = KV_ERR(KV_EINVAL, "%s:%zu:%zu: the configuration must be a mapping of keys", source,
                       root->start_mark.line + 1, root->start_mark.column + 1);
        } else {
            loader ld = {c, &doc, source};
            s = load_mapping(&ld, root, "");
        }
    }
    /* A second document in the stream is a mistake worth reporting. */
    if (s == KV_OK) {
        yaml_document_t next;
        if (yaml_parser_load(&parser, &next)) {
            if (yaml_document_get_root_node(&next))
                s = KV_ERR(KV_EINVAL, "%s: more than one YAML document ('---'); put everything in one", source);
            yaml_document_delete(&next);
        }
    }
    yaml_document_delete(&doc);
    yaml_parser_delete(&parser);
    return s;
}

kv_status kv_fit_config_load_file(kv_fit_config *c, const char *path) {
    char *text = NULL;
    size_t n = 0;
    kv_status s = kv_file_read_bounded(&text, &n, path, KV_FIT_CONFIG_MAX_BYTES);
    if (s != KV_OK) return kv_error_wrap(s, "reading configuration: ");
    s = kv_fit_config_load_string(c, text, n, path);
    free(text);
    return s;
}

kv_status kv_fit_config_set(kv_fit_config *c, const char *assignment) {
    return kv_fit_config_set_from(c, assignment, "command line");
}

kv_status kv_fit_config_set_from(kv_fit_config *c, const char *assignment, const char *where) {
    if (!c || !assignment) return KV_ERR(KV_EINVAL, "kv_fit_config_set: no config or no assignment");
    if (!where) where = "command line";
    const char *eq = strchr(assignment, '=');
    if (!eq || eq == assignment)
        return KV_ERR(KV_EINVAL, "%s: '%s' is not key=value (e.g. keys.bits=3)", where, assignment);
    char path[256];
    const size_t kl = (size_t)(eq - assignment);
    if (kl >= sizeof path) return KV_ERR(KV_EINVAL, "%s: key in '%.64s...' is too long", where, assignment);
    memcpy(path, assignment, kl);
    path[kl] = '\0';
    const char *val = eq + 1;
    size_t vl = strlen(val);
    char *text = malloc(vl + 1);
    if (!text) return KV_ERR(KV_ENOMEM, "out of memory");
    /* Matching quotes around the value are YAML quoting, not part of it. */
    if (vl >= 2 && (val[0] == '\'' || val[0] == '"') && val[vl - 1] == val[0]) {
        memcpy(text, val + 1, vl - 2);
        text[vl - 2] = '\0';
    } else {
        memcpy(text, val, vl + 1);
    }
    kv_status s = set_path(c, path, text, where);
    free(text);
    return s;
}

/* ---- cross-key validation ----------------------------------------------------------------------- */
static const char *origin_of(const kv_fit_config *c, const char *path) {
    const int k = find_key(path);
    if (k < 0 || !c->origins_) return "default";
    const char *w = ((const origin *)c->origins_)->where[k];
    return *w ? w : "default";
}

const char *kv_fit_config_origin(const kv_fit_config *c, const char *path) {
    if (!c || !path) return "default";
    if (strncmp(path, "layers.", 7) == 0) {
        char *end = NULL;
        const long layer = strtol(path + 7, &end, 10);
        if (end != path + 7) {
            const kv_fit_layer_override *o = kv_fit_config_layer(c, (int)layer);
            return o && o->where[0] ? o->where : "default";
        }
    }
    return origin_of(c, path);
}

#define CFG_ERR(key, ...) cfg_err(__LINE__, c, key, __VA_ARGS__)
static kv_status cfg_err(int line, const kv_fit_config *c, const char *key, const char *fmt, ...) KV_PRINTF(4, 5);
static kv_status cfg_err(int line, const kv_fit_config *c, const char *key, const char *fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return kv_error_set_at(KV_EINVAL, __FILE__, line, "%s: key '%s': %s", origin_of(c, key), key, msg);
}

/* Per-stream method overrides (layers.N.key_method / value_method): what may be overridden and with what. */
static kv_status validate_method_overrides(const kv_fit_config *c) {
    for (int i = 0; i < c->n_layer_overrides; i++) {
        const kv_fit_layer_override *o = &c->layer_overrides[i];
        for (int st = 0; st < 2; st++) {
            const unsigned bit = st == 0 ? KV_FIT_LO_KEY_METHOD : KV_FIT_LO_VALUE_METHOD;
            if (!(o->set & bit)) continue;
            const int m = st == 0 ? o->key_method : o->value_method;
            const char *field = st == 0 ? "key_method" : "value_method";
            if (kv_fit_method_has(m, KV_FIT_T_WHOLE_PLAN))
                return KV_ERR(KV_EINVAL, "%s: key 'layers.%d.%s': %s is a method of the whole plan (its eta "
                              "calibration, shared codes or query subspaces apply to every uniform stream): override "
                              "a stream with kivi and set method %s", o->where, o->layer, field, k_methods[m],
                              k_methods[m]);
            if (c->squat.enabled)
                return KV_ERR(KV_EINVAL, "%s: key 'layers.%d.%s': SQuat (squat.enabled, set at %s) is not combined "
                              "with per-stream methods", o->where, o->layer, field, origin_of(c, "squat.enabled"));
        }
        if ((o->set & KV_FIT_LO_KEY_PRE_ROPE) && c->squat.enabled)
            return KV_ERR(KV_EINVAL, "%s: key 'layers.%d.key_pre_rope': SQuat keys are quantized after RoPE "
                          "(squat.enabled, set at %s)", o->where, o->layer, origin_of(c, "squat.enabled"));
        if ((o->set & (KV_FIT_LO_KEY_GROUP_AXIS | KV_FIT_LO_KEY_GROUP_SIZE)) && c->squat.enabled)
            return KV_ERR(KV_EINVAL, "%s: key 'layers.%d.key_group_*': SQuat keys take KIVI's layout (keys.*) on "
                          "every layer (squat.enabled, set at %s)", o->where, o->layer, origin_of(c, "squat.enabled"));
    }
    return KV_OK;
}

static int method_uses_higgs(int m) { return kv_fit_method_has(m, KV_FIT_T_HIGGS); }

kv_status kv_fit_config_validate(const kv_fit_config *c) {
    if (!c) return KV_ERR(KV_EINVAL, "kv_fit_config_validate: no config");
    kv_status ms = validate_method_overrides(c);
    if (ms != KV_OK) return ms;
    int higgs = method_uses_higgs(c->method);
    for (int i = 0; i < c->n_layer_overrides; i++)
        for (int st = 0; st < 2; st++) higgs |= method_uses_higgs(kv_fit_config_stream_method(c, c->layer_overrides[i].layer, st));
    if ((!c->data.heldout || !*c->data.heldout) && c->data.heldout_fraction <= 0.0)
        return CFG_ERR("data.heldout_fraction", "no held-out data: set data.heldout or a heldout_fraction > 0");
    if (c->keys.pack3 != 10 && c->keys.pack3 != 11) return CFG_ERR("keys.pack3", "must be 10 or 11");
    if (c->values.pack3 != 10 && c->values.pack3 != 11) return CFG_ERR("values.pack3", "must be 10 or 11");
    /* bits 16 = an f16 stream (KV_FIT_F16_BITS): no quantizer, so no predictor or grid either */
    {
        /* a stream of the global method with the global bits, then every overridden stream */
        const int plain = kv_fit_method_has(c->method, KV_FIT_T_F16);
        if ((c->keys.bits == KV_FIT_F16_BITS || c->values.bits == KV_FIT_F16_BITS) && !plain)
            return KV_ERR(KV_EINVAL, "key '%s': 16 bits keeps the stream in f16 unquantized, which only method kivi "
                          "does (method is '%s', set at %s): an AQUA-KV or HIGGS stream is always quantized",
                          c->keys.bits == KV_FIT_F16_BITS ? "keys.bits" : "values.bits",
                          kv_fit_method_name(c->method), origin_of(c, "method"));
        for (int i = 0; i < c->n_layer_overrides; i++) {
            const kv_fit_layer_override *o = &c->layer_overrides[i];
            for (int st = 0; st < 2; st++) {
                const unsigned bit = st == 0 ? KV_FIT_LO_KEY_BITS : KV_FIT_LO_VALUE_BITS;
                const int bits = !(o->set & bit) ? (st == 0 ? c->keys.bits : c->values.bits)
                                 : st == 0 ? o->key_bits : o->value_bits;
                const int m = kv_fit_config_stream_method(c, o->layer, st);
                if (bits == KV_FIT_F16_BITS && !kv_fit_method_has(m, KV_FIT_T_F16))
                    return KV_ERR(KV_EINVAL, "%s: key 'layers.%d.%s_bits': 16 bits keeps the stream in f16 "
                                  "unquantized, which only method kivi does (the stream's method is '%s'): an "
                                  "AQUA-KV, HIGGS or float stream is always quantized", o->where, o->layer,
                                  st ? "value" : "key", kv_fit_method_name(m));
            }
        }
    }
    if (higgs) {
        if (c->higgs.d != 1 && c->higgs.d != 2 && c->higgs.d != 4 && c->higgs.d != 8)
            return CFG_ERR("higgs.d", "must be 1, 2, 4 or 8 (got %d)", c->higgs.d);
        if (c->higgs.n == 1) return CFG_ERR("higgs.n", "a grid needs at least 2 points (0 = 2^(bits*d))");
        if (c->higgs.group_size != 0 &&
            ((c->higgs.group_size & (c->higgs.group_size - 1)) != 0 || c->higgs.group_size < c->higgs.d))
            return CFG_ERR("higgs.group_size", "must be 0 (head_dim) or a power of two >= d (got %d)", c->higgs.group_size);
        /* n = 2^(bits*d) must stay within 65536 points for the bits in use. */
        if (c->higgs.n == 0) {
            const int bits[] = {c->keys.bits, c->values.bits, c->aqua.first_layer_bits};
            const char *names[] = {"keys.bits", "values.bits", "aqua.first_layer_bits"};
            for (int i = 0; i < 3; i++)
                if (bits[i] * c->higgs.d > 16)
                    return CFG_ERR(names[i], "%d bits with higgs.d %d needs a grid of 2^%d points (at most 2^16); "
                                   "lower d or set higgs.n", bits[i], c->higgs.d, bits[i] * c->higgs.d);
        }
    }
    if (c->aqua.predictor_bits != 0 && c->aqua.predictor_bits != 4)
        return CFG_ERR("aqua.predictor_bits", "must be 0 (the weights in aqua.predictor_dtype) or 4 (GPTQ codes), not %d",
                       c->aqua.predictor_bits);
    if (c->aqua.predictor_bits == 4 && (c->aqua.predictor_dtype != KV_DTYPE_F16 || c->aqua.rank != 0))
        return CFG_ERR("aqua.predictor_bits", "4-bit predictor codes need aqua.predictor_dtype f16 (their scales and bias) "
                       "and aqua.rank 0 (codes of the full weight)");
    if (c->aqua.first_layer_bits > 8 && !method_uses_higgs(c->method))
        return CFG_ERR("aqua.first_layer_bits", "uniform quantization takes 1..8 bits (got %d)", c->aqua.first_layer_bits);
    if (kv_fit_method_has(c->method, KV_FIT_T_SQUAT) && !c->squat.enabled)
        return CFG_ERR("squat.enabled", "method squat is kivi with SQuat keys: squat.enabled must stay true (or use "
                       "method kivi)");
    if (c->squat.enabled && !kv_fit_method_has(c->method, KV_FIT_T_SQUAT_OK))
        return CFG_ERR("squat.enabled", "SQuat quantizes keys with the uniform quantizer: method must be squat, kivi or "
                       "aqua-uniform (method is '%s', set at %s)", kv_fit_method_name(c->method), origin_of(c, "method"));
    if (c->squat.enabled && c->cache.pre_rope)
        return CFG_ERR("cache.pre_rope", "SQuat keys are quantized after RoPE, in the space of the post-RoPE queries "
                       "whose subspace they protect: set cache.pre_rope false (squat.enabled set at %s)",
                       origin_of(c, "squat.enabled"));
    if (c->squat.enabled && c->keys.group_axis != KV_PLAN_GROUP_TOKENS)
        return CFG_ERR("keys.group_axis", "SQuat quantizes a key block of channels per token while scales run along "
                       "tokens (per-channel groups, as KIVI's keys): set keys.group_axis tokens (squat.enabled set at "
                       "%s)", origin_of(c, "squat.enabled"));
    if (c->squat.enabled && c->squat.subspace == KV_FIT_SQ_STATIC && !c->squat.static_basis)
        return CFG_ERR("squat.subspace", "a static subspace is the basis stored in the plan: set squat.static_basis "
                       "true");
    if (c->squat.enabled && c->keys.eta != 0.0)
        return CFG_ERR("keys.eta", "SQuat keys use the plain uniform quantizer: keys.eta must be 0");
    if (!(c->pruning.budget > 0.0 && c->pruning.budget <= 1.0))
        return CFG_ERR("pruning.budget", "the budget is the fraction of the f16 cache the kept tokens may use, in (0, 1] "
                       "(got %g)", c->pruning.budget);
    if (c->pruning.method == KV_PLAN_PRUNE_NONE && c->pruning.budget != 1.0)
        return CFG_ERR("pruning.budget", "a budget below 1 needs a pruning.method");
    if (c->pruning.pool != 0 && c->pruning.pool % 2 == 0)
        return CFG_ERR("pruning.pool", "must be 0 or odd (got %d)", c->pruning.pool);
    if (kv_fit_method_has(c->method, KV_FIT_T_FLOAT) && c->cache.rpc_ratio > 0.0)
        return CFG_ERR("cache.rpc_ratio", "method %s keeps no recent pivotal context (serving engines' FP8 / NVFP4 "
                       "caches have none)", kv_fit_method_name(c->method));
    if ((c->xquant.km >= 0 || c->xquant.vm >= 0 || c->xquant.kq >= 0 || c->xquant.vq >= 0) &&
        !kv_fit_method_has(c->method, KV_FIT_T_XQUANT))
        return CFG_ERR(c->xquant.km >= 0 ? "xquant.km" : c->xquant.vm >= 0 ? "xquant.vm"
                       : c->xquant.kq >= 0 ? "xquant.kq" : "xquant.vq",
                       "cross-layer code sharing and 1-bit layers are XQuant's: method xquant");
    if ((c->xquant.calibrate_eta || c->xquant.target_bits > 0) && !kv_fit_method_has(c->method, KV_FIT_T_XQUANT))
        return CFG_ERR(c->xquant.calibrate_eta ? "xquant.calibrate_eta" : "xquant.target_bits",
                       "eta calibration and a bit target are XQuant's: method xquant");
    return KV_OK;
}

/* ---- dump ---------------------------------------------------------------------------------------- */
/* obj[path with dots] = v, creating the intermediate objects. */
static int put_path(json_t *root, const char *path, json_t *v) {
    if (!v) return 0;
    json_t *o = root;
    const char *p = path;
    for (;;) {
        const char *dot = strchr(p, '.');
        if (!dot) return json_object_set_new(o, p, v) == 0;
        char part[64];
        size_t n = (size_t)(dot - p);
        if (n >= sizeof part) {
            json_decref(v);
            return 0;
        }
        memcpy(part, p, n);
        part[n] = '\0';
        json_t *child = json_object_get(o, part);
        if (!child) {
            child = json_object();
            if (!child || json_object_set_new(o, part, child) != 0) {
                json_decref(v);
                return 0;
            }
        }
        o = child;
        p = dot + 1;
    }
}

static json_t *jdouble(double v) { return json_real(v); }

kv_status kv_fit_config_dump(char **out, const kv_fit_config *c) {
    *out = NULL;
    if (!c) return KV_ERR(KV_EINVAL, "kv_fit_config_dump: no config");
    json_t *root = json_object();
    int ok = root != NULL;
    for (int i = 0; ok && i < N_KEYS; i++) {
        const key_desc *d = &k_keys[i];
        const void *f = (const char *)c + d->offset;
        json_t *v = NULL;
        switch (d->type) {
        case T_INT:
        case T_BITS: v = json_integer(*(const int *)f); break;
        case T_I64: v = json_integer((json_int_t) * (const int64_t *)f); break;
        case T_U64: {
            const uint64_t u = *(const uint64_t *)f;
            if (u <= (uint64_t)INT64_MAX) {
                v = json_integer((json_int_t)u);
            } else {
                char buf[32];
                snprintf(buf, sizeof buf, "%" PRIu64, u);
                v = json_string(buf);
            }
            break;
        }
        case T_DOUBLE: v = jdouble(*(const double *)f); break;
        case T_BOOL: v = json_boolean(*(const int *)f); break;
        case T_STRING: v = json_string(*(char *const *)f ? *(char *const *)f : ""); break;
        case T_ENUM: {
            const int e = *(const int *)f;
            int n = 0;
            while (d->enum_names[n]) n++;
            v = json_string(e >= 0 && e < n ? d->enum_names[e] : "?");
            break;
        }
        }
        ok = put_path(root, d->path, v);
    }
    if (ok && c->n_layer_overrides > 0) {
        json_t *layers = json_object();
        ok = layers && json_object_set_new(root, "layers", layers) == 0;
        for (int i = 0; ok && i < c->n_layer_overrides; i++) {
            const kv_fit_layer_override *o = &c->layer_overrides[i];
            json_t *row = json_object();
            char key[16];
            snprintf(key, sizeof key, "%d", o->layer);
            ok = row && json_object_set_new(layers, key, row) == 0;
            for (int k = 0; ok && k < N_LAYER_KEYS; k++) {
                const struct layer_key *lk = &k_layer_keys[k];
                if (!(o->set & lk->bit)) continue;
                const void *f = (const char *)o + lk->offset;
                json_t *v = lk->type == T_DOUBLE ? jdouble(*(const double *)f)
                            : lk->type == T_BOOL ? json_boolean(*(const int *)f)
                            : lk->type == T_ENUM ? json_string(lk->enum_names[*(const int *)f])
                                                 : json_integer(*(const int *)f);
                ok = v && json_object_set_new(row, lk->name, v) == 0;
            }
        }
    }
    kv_status s = ok ? kv_yaml_from_json(out, root) : KV_ERR(KV_ENOMEM, "out of memory dumping the configuration");
    json_decref(root);
    return s;
}

int kv_fit_config_stream_method(const kv_fit_config *c, int layer, int stream) {
    const kv_fit_layer_override *o = kv_fit_config_layer(c, layer);
    if (o && stream == 0 && (o->set & KV_FIT_LO_KEY_METHOD)) return o->key_method;
    if (o && stream == 1 && (o->set & KV_FIT_LO_VALUE_METHOD)) return o->value_method;
    return (int)c->method;
}

int kv_fit_config_key_pre_rope(const kv_fit_config *c, int layer) {
    const kv_fit_layer_override *o = kv_fit_config_layer(c, layer);
    return o && (o->set & KV_FIT_LO_KEY_PRE_ROPE) ? o->key_pre_rope : c->cache.pre_rope;
}

int kv_fit_config_pred_rank(const kv_fit_config *c, int layer, int stream) {
    const kv_fit_layer_override *o = kv_fit_config_layer(c, layer);
    if (o && stream == 0 && (o->set & KV_FIT_LO_KEY_RANK)) return o->key_rank;
    if (o && stream == 1 && (o->set & KV_FIT_LO_VALUE_RANK)) return o->value_rank;
    return c->aqua.rank;
}

int kv_fit_config_pred_bits(const kv_fit_config *c, int layer, int stream) {
    const kv_fit_layer_override *o = kv_fit_config_layer(c, layer);
    if (o && stream == 0 && (o->set & KV_FIT_LO_KEY_PRED_BITS)) return o->key_predictor_bits;
    if (o && stream == 1 && (o->set & KV_FIT_LO_VALUE_PRED_BITS)) return o->value_predictor_bits;
    return c->aqua.predictor_bits;
}

int kv_fit_config_stream_eta(const kv_fit_config *c, int layer, int stream, double *eta) {
    const kv_fit_layer_override *o = kv_fit_config_layer(c, layer);
    if (!o || !(o->set & (stream == 0 ? KV_FIT_LO_KEY_ETA : KV_FIT_LO_VALUE_ETA))) return 0;
    if (eta) *eta = stream == 0 ? o->key_eta : o->value_eta;
    return 1;
}

void kv_fit_config_stream_groups(const kv_fit_config *c, int layer, int stream, int *axis, int *size) {
    const kv_fit_layer_override *o = kv_fit_config_layer(c, layer);
    const kv_fit_stream_config *sc = stream == 0 ? &c->keys : &c->values;
    const unsigned ab = stream == 0 ? KV_FIT_LO_KEY_GROUP_AXIS : KV_FIT_LO_VALUE_GROUP_AXIS;
    const unsigned sb = stream == 0 ? KV_FIT_LO_KEY_GROUP_SIZE : KV_FIT_LO_VALUE_GROUP_SIZE;
    *axis = o && (o->set & ab) ? (stream == 0 ? o->key_group_axis : o->value_group_axis) : (int)sc->group_axis;
    *size = o && (o->set & sb) ? (stream == 0 ? o->key_group_size : o->value_group_size) : sc->group_size;
}

const kv_fit_layer_override *kv_fit_config_layer(const kv_fit_config *c, int layer) {
    for (int i = 0; c && i < c->n_layer_overrides; i++)
        if (c->layer_overrides[i].layer == layer) return &c->layer_overrides[i];
    return NULL;
}
