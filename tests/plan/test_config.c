/* kvcal fit configuration tests (formats/config.c): defaults, the documented example, errors that
 * name the line and the key, command-line overrides, cross-key validation, dump -> load round trip. */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "kv_formats.h"
#include "kv_test.h"

static void init(kv_fit_config *c) { ck_assert_kv_ok(kv_fit_config_init(c)); }

static kv_status load(kv_fit_config *c, const char *yaml) {
    return kv_fit_config_load_string(c, yaml, strlen(yaml), "cfg.yaml");
}

static void example_path(char *out, size_t n) {
    const char *src = getenv("KVCAL_TEST_SRC");
    snprintf(out, n, "%s/../configs/kvcal-example.yaml", src && *src ? src : "tests");
}

START_TEST(test_defaults) {
    kv_fit_config c;
    init(&c);
    ck_assert_int_eq(c.method, KV_FIT_AQUA);
    ck_assert_int_eq(c.data.seq_len, 1024);
    ck_assert_int_eq(c.cache.sinks, 4);
    ck_assert_int_eq(c.cache.recent, 128);
    ck_assert_int_eq(c.keys.group_axis, KV_PLAN_GROUP_TOKENS);
    ck_assert_int_eq(c.values.group_axis, KV_PLAN_GROUP_CHANNELS);
    ck_assert_int_eq(c.keys.scale_dtype, KV_DTYPE_F16);
    ck_assert(c.aqua.ridge == 1e-3);
    ck_assert_int_eq(c.squat.r, 5);
    ck_assert_int_eq(c.xquant.km, -1);
    ck_assert_str_eq(c.model, "");
    ck_assert_kv_ok(kv_fit_config_validate(&c));
    kv_fit_config_free(&c);
    kv_fit_config_free(&c); /* a freed config can be freed again */
    kv_fit_config_free(NULL);
}
END_TEST

/* The example documents every key at its default (plus two layer overrides). */
START_TEST(test_example_is_the_defaults) {
    char path[1024];
    example_path(path, sizeof path);
    kv_fit_config c, d;
    init(&c);
    init(&d);
    ck_assert_kv_ok(kv_fit_config_load_file(&c, path));
    ck_assert_kv_ok(kv_fit_config_validate(&c));
    ck_assert_int_eq(c.n_layer_overrides, 2);
    const kv_fit_layer_override *o = kv_fit_config_layer(&c, 7);
    ck_assert_ptr_nonnull(o);
    ck_assert_int_eq(o->key_bits, 3);
    ck_assert_int_eq(o->value_bits, 4);
    ck_assert(o->rpc_ratio == 0.2);
    ck_assert_uint_eq(o->set, KV_FIT_LO_KEY_BITS | KV_FIT_LO_VALUE_BITS | KV_FIT_LO_RPC_RATIO);
    ck_assert_ptr_null(kv_fit_config_layer(&c, 3));
    free(c.layer_overrides);
    c.layer_overrides = NULL;
    c.n_layer_overrides = 0;
    char *a = NULL, *b = NULL;
    ck_assert_kv_ok(kv_fit_config_dump(&a, &c));
    ck_assert_kv_ok(kv_fit_config_dump(&b, &d));
    ck_assert_str_eq(a, b);
    free(a);
    free(b);
    kv_fit_config_free(&c);
    kv_fit_config_free(&d);
}
END_TEST

/* Every error names the source, line, column and key. */
typedef struct bad_case {
    const char *yaml;
    const char *message;
} bad_case;

static const bad_case k_bad[] = {
    {"method: aqua\nmetod: kivi\n", "cfg.yaml:2:1: unknown key 'metod' (known keys: method, seed, model, data"},
    {"data:\n  seq_len: 512\n  seqlen: 5\n", "cfg.yaml:3:3: unknown key 'data.seqlen' (known keys under data: calibration"},
    {"keys:\n  bits: 9\n", "cfg.yaml:2:9: key 'keys.bits': expected an integer in [1, 8], got '9'"},
    {"keys:\n  bits: two\n", "cfg.yaml:2:9: key 'keys.bits': expected an integer"},
    {"keys:\n  eta: 0.5\n", "cfg.yaml:2:8: key 'keys.eta': expected a number in [0, 0.4999]"},
    {"keys:\n  eta: .nan\n", "key 'keys.eta': expected a number"},
    {"method: fast\n", "cfg.yaml:1:9: key 'method': expected one of aqua, aqua-uniform, higgs, kivi, fp8, nvfp4, xquant, squat; got 'fast'"},
    {"cache:\n  pre_rope: maybe\n", "cfg.yaml:2:13: key 'cache.pre_rope': expected true or false"},
    {"data: 5\n", "cfg.yaml:1:1: key 'data' must be a mapping"},
    {"seed: [1, 2]\n", "cfg.yaml:1:1: key 'seed' takes a single value, not a list"},
    {"seed: -3\n", "key 'seed': expected a non-negative integer"},
    {"seed: 1\nseed: 2\n", "cfg.yaml:2:1: duplicate key 'seed'"},
    {"keys:\n  bits: 2\n  bits: 3\n", "cfg.yaml:3:3: duplicate key 'keys.bits'"},
    {"keys:\n  bits: 2\n bad indent\n", "cfg.yaml:3:"},
    {"- a\n- b\n", "cfg.yaml:1:1: the configuration must be a mapping"},
    {"layers:\n  3: {key_bits: 9}\n", "cfg.yaml:2:17: key 'layers.3.key_bits': expected an integer in [1, 8]"},
    {"layers:\n  3: {keybits: 2}\n", "unknown key 'layers.3.keybits'"},
    {"layers:\n  x: {key_bits: 2}\n", "key 'layers.x.key_bits': expected layers.<layer index"},
    {"layers:\n  3: 4\n", "cfg.yaml:2:3: key 'layers.3' must be a mapping"},
    {"layers:\n  3: {key_bits: 2}\n  3: {value_bits: 2}\n", "cfg.yaml:3:3: duplicate key 'layers.3'"},
    {"layers: 5\n", "key 'layers' must be a mapping"},
    {"method: aqua\n---\nmethod: kivi\n", "more than one YAML document"},
    {"keys:\n  bits:\n", "key 'keys.bits': expected an integer in [1, 8], got ''"},
};
enum { N_BAD = sizeof k_bad / sizeof *k_bad };

START_TEST(test_bad_yaml) {
    const bad_case *b = &k_bad[_i];
    kv_fit_config c;
    init(&c);
    kv_status s = load(&c, b->yaml);
    ck_assert_msg(s == KV_EINVAL, "'%s': %s", b->yaml, kv_status_name(s));
    ck_assert_msg(strstr(kv_error_last(), b->message) != NULL, "'%s':\n  got  '%s'\n  want '%s'", b->yaml,
                  kv_error_last(), b->message);
    kv_fit_config_free(&c);
}
END_TEST

START_TEST(test_values_and_null) {
    kv_fit_config c;
    init(&c);
    ck_assert_kv_ok(load(&c, "method: KIVI\nmodel: ~\nseed: 18446744073709551615\n"
                             "data: {calibration: 'a b: c.txt', max_tokens: 0}\n"
                             "cache:\n  pre_rope: off\nkeys: {scale_dtype: f32, group_axis: channels}\n"
                             "pruning: {method: snapkv, budget: 0.25}\n"));
    ck_assert_int_eq(c.method, KV_FIT_KIVI);
    ck_assert_str_eq(c.model, "");
    ck_assert_uint_eq(c.seed, UINT64_MAX);
    ck_assert_str_eq(c.data.calibration, "a b: c.txt");
    ck_assert_int_eq(c.data.max_tokens, 0);
    ck_assert_int_eq(c.cache.pre_rope, 0);
    ck_assert_int_eq(c.keys.scale_dtype, KV_DTYPE_F32);
    ck_assert_int_eq(c.keys.group_axis, KV_PLAN_GROUP_CHANNELS);
    ck_assert_int_eq(c.pruning.method, KV_PLAN_PRUNE_SNAPKV);
    ck_assert_kv_ok(kv_fit_config_validate(&c));
    /* an empty document changes nothing */
    ck_assert_kv_ok(load(&c, ""));
    ck_assert_kv_ok(load(&c, "# only a comment\n"));
    ck_assert_int_eq(c.method, KV_FIT_KIVI);
    kv_fit_config_free(&c);
}
END_TEST

START_TEST(test_command_line_overrides) {
    kv_fit_config c;
    init(&c);
    ck_assert_kv_ok(load(&c, "keys:\n  bits: 2\n"));
    ck_assert_kv_ok(kv_fit_config_set(&c, "keys.bits=3"));
    ck_assert_int_eq(c.keys.bits, 3);
    ck_assert_kv_ok(kv_fit_config_set(&c, "method=kivi"));
    ck_assert_kv_ok(kv_fit_config_set(&c, "data.calibration='/tmp/x y.txt'"));
    ck_assert_str_eq(c.data.calibration, "/tmp/x y.txt");
    ck_assert_kv_ok(kv_fit_config_set(&c, "layers.5.rpc_ratio=0.2"));
    ck_assert_kv_ok(kv_fit_config_set(&c, "layers.2.key_bits=4"));
    ck_assert_kv_ok(kv_fit_config_set(&c, "layers.5.value_eta=0.05"));
    ck_assert_int_eq(c.n_layer_overrides, 2);
    ck_assert_int_eq(c.layer_overrides[0].layer, 2); /* kept sorted */
    ck_assert_int_eq(c.layer_overrides[1].layer, 5);
    ck_assert_uint_eq(c.layer_overrides[1].set, KV_FIT_LO_RPC_RATIO | KV_FIT_LO_VALUE_ETA);
    ck_assert(c.layer_overrides[1].value_eta == 0.05);
    ck_assert_int_eq(kv_fit_config_set(&c, "keys.bits=0"), KV_EINVAL);
    ck_assert_ptr_nonnull(strstr(kv_error_last(), "command line: key 'keys.bits': expected an integer in [1, 8]"));
    ck_assert_int_eq(c.keys.bits, 3); /* a rejected value changes nothing */
    ck_assert_int_eq(kv_fit_config_set(&c, "nope=1"), KV_EINVAL);
    ck_assert_ptr_nonnull(strstr(kv_error_last(), "command line: unknown key 'nope'"));
    ck_assert_int_eq(kv_fit_config_set(&c, "keys.bitz=1"), KV_EINVAL);
    ck_assert_ptr_nonnull(strstr(kv_error_last(), "known keys under keys: bits, group_size"));
    ck_assert_int_eq(kv_fit_config_set(&c, "keys.bits"), KV_EINVAL);
    ck_assert_ptr_nonnull(strstr(kv_error_last(), "is not key=value"));
    ck_assert_int_eq(kv_fit_config_set(&c, "=3"), KV_EINVAL);
    ck_assert_int_eq(kv_fit_config_set(&c, "layers.9999.key_bits=2"), KV_EINVAL);
    ck_assert_int_eq(kv_fit_config_set(&c, "keys=3"), KV_EINVAL);
    kv_fit_config_free(&c);
}
END_TEST

typedef struct cross_case {
    const char *yaml;
    const char *message;
} cross_case;

static const cross_case k_cross[] = {
    /* per-stream methods (layers.N.key_method / value_method: kvcal search's mixed refit) */
    {"method: kivi\nlayers:\n  2: {key_method: xquant}\n",
     "cfg.yaml:3:19: key 'layers.2.key_method': xquant is a method of the whole plan"},
    {"method: kivi\nlayers:\n  1: {value_method: higgs, value_bits: 16}\n",
     "key 'layers.1.value_bits': 16 bits keeps the stream in f16 unquantized, which only method kivi does (the "
     "stream's method is 'higgs')"},
    {"method: kivi\ncache: {pre_rope: false}\nsquat: {enabled: true}\nlayers:\n  0: {key_method: higgs}\n",
     "key 'layers.0.key_method': SQuat (squat.enabled, set at cfg.yaml:3:18) is not combined with per-stream methods"},
    {"method: aqua\nsquat:\n  enabled: true\n",
     "cfg.yaml:3:12: key 'squat.enabled': SQuat quantizes keys with the uniform quantizer: method must be squat, "
     "kivi or aqua-uniform (method is 'aqua', set at cfg.yaml:1:9)"},
    {"method: kivi\nsquat:\n  enabled: true\ncache:\n  pre_rope: true\n",
     "cfg.yaml:5:13: key 'cache.pre_rope': SQuat keys are quantized after RoPE"},
    {"method: kivi\ncache: {pre_rope: false}\nsquat: {enabled: true, subspace: static, static_basis: false}\n",
     "key 'squat.subspace': a static subspace is the basis stored in the plan"},
    {"data:\n  heldout_fraction: 0\n", "cfg.yaml:2:21: key 'data.heldout_fraction': no held-out data"},
    {"keys:\n  pack3: 11\nvalues:\n  pack3: 10\nhiggs:\n  d: 3\n", "cfg.yaml:6:6: key 'higgs.d': must be 1, 2, 4 or 8"},
    {"higgs:\n  d: 8\n", "default: key 'aqua.first_layer_bits': 4 bits with higgs.d 8 needs a grid of 2^32"},
    {"higgs:\n  group_size: 24\n", "key 'higgs.group_size': must be 0 (head_dim) or a power of two"},
    {"pruning:\n  budget: 0.5\n", "key 'pruning.budget': a budget below 1 needs a pruning.method"},
    {"pruning:\n  method: h2o\n  pool: 4\n", "key 'pruning.pool': must be 0 or odd"},
    {"xquant:\n  km: 8\n", "key 'xquant.km': cross-layer code sharing and 1-bit layers are XQuant's"},
    {"method: kivi\naqua:\n  first_layer_bits: 12\n", "key 'aqua.first_layer_bits': uniform quantization takes 1..8"},
};
enum { N_CROSS = sizeof k_cross / sizeof *k_cross };

START_TEST(test_cross_validation) {
    const cross_case *x = &k_cross[_i];
    kv_fit_config c;
    init(&c);
    ck_assert_kv_ok(load(&c, x->yaml));
    kv_status s = kv_fit_config_validate(&c);
    ck_assert_msg(s == KV_EINVAL, "'%s': %s", x->yaml, kv_status_name(s));
    ck_assert_msg(strstr(kv_error_last(), x->message) != NULL, "'%s':\n  got  '%s'\n  want '%s'", x->yaml,
                  kv_error_last(), x->message);
    kv_fit_config_free(&c);
}
END_TEST

/* A command-line value is named as such in cross-key messages. */
START_TEST(test_cross_origin_command_line) {
    kv_fit_config c;
    init(&c);
    ck_assert_kv_ok(kv_fit_config_set(&c, "squat.enabled=true"));
    ck_assert_int_eq(kv_fit_config_validate(&c), KV_EINVAL);
    ck_assert_ptr_nonnull(strstr(kv_error_last(), "command line: key 'squat.enabled'"));
    ck_assert_ptr_nonnull(strstr(kv_error_last(), "set at default"));
    kv_fit_config_free(&c);
}
END_TEST

/* c's dump holds `expect`, and loaded into d it dumps the same text again. */
static void dump_reloads(const kv_fit_config *c, kv_fit_config *d, const char *expect) {
    char *a = NULL, *b = NULL;
    ck_assert_kv_ok(kv_fit_config_dump(&a, c));
    ck_assert_msg(strstr(a, expect) != NULL, "the dump lacks '%s':\n%s", expect, a);
    ck_assert_kv_ok(kv_fit_config_load_string(d, a, strlen(a), "dump"));
    ck_assert_kv_ok(kv_fit_config_dump(&b, d));
    ck_assert_str_eq(a, b);
    free(a);
    free(b);
}

/* Per-stream method overrides: parsed, resolved per stream, dumped readably and loaded back. */
START_TEST(test_stream_methods) {
    kv_fit_config c, d;
    init(&c);
    init(&d);
    ck_assert_kv_ok(load(&c, "method: xquant\nlayers:\n  1: {key_method: aqua, key_bits: 3, key_pre_rope: true}\n"
                             "  2: {value_method: nvfp4}\n"));
    ck_assert_kv_ok(kv_fit_config_validate(&c));
    ck_assert_int_eq(kv_fit_config_stream_method(&c, 1, 0), KV_FIT_AQUA);
    ck_assert_int_eq(kv_fit_config_stream_method(&c, 1, 1), KV_FIT_XQUANT);
    ck_assert_int_eq(kv_fit_config_stream_method(&c, 2, 1), KV_FIT_NVFP4);
    ck_assert_int_eq(kv_fit_config_stream_method(&c, 0, 0), KV_FIT_XQUANT);
    ck_assert_int_eq(kv_fit_config_key_pre_rope(&c, 1), 1);
    ck_assert_int_eq(kv_fit_config_key_pre_rope(&c, 2), c.cache.pre_rope);
    dump_reloads(&c, &d, "  1: {key_bits: 3, key_method: aqua, key_pre_rope: true}\n");
    ck_assert_int_eq(kv_fit_config_load_string(&d, "layers: {3: {key_method: lloyd}}\n", 33, "x"), KV_EINVAL);
    ck_assert_ptr_nonnull(strstr(kv_error_last(), "expected one of aqua, aqua-uniform, higgs, kivi"));
    kv_fit_config_free(&c);
    kv_fit_config_free(&d);
}
END_TEST

/* Per-stream group layouts (kvcal search's refit of AQUA-KV with uniform residuals): resolved per stream, the
 * rest of the plan keeps keys.* / values.*; dumped and loaded back; SQuat keys refuse them. */
START_TEST(test_stream_groups) {
    kv_fit_config c, d;
    init(&c);
    init(&d);
    ck_assert_kv_ok(load(&c, "method: xquant\nlayers:\n  1: {key_method: aqua-uniform, key_group_axis: channels, "
                             "key_group_size: 64}\n  2: {value_group_size: 16}\n"));
    ck_assert_kv_ok(kv_fit_config_validate(&c));
    int axis, size;
    kv_fit_config_stream_groups(&c, 1, 0, &axis, &size);
    ck_assert_int_eq(axis, KV_PLAN_GROUP_CHANNELS);
    ck_assert_int_eq(size, 64);
    kv_fit_config_stream_groups(&c, 1, 1, &axis, &size); /* V of layer 1: the values' */
    ck_assert_int_eq(axis, (int)c.values.group_axis);
    ck_assert_int_eq(size, c.values.group_size);
    kv_fit_config_stream_groups(&c, 2, 1, &axis, &size); /* only the size given */
    ck_assert_int_eq(axis, (int)c.values.group_axis);
    ck_assert_int_eq(size, 16);
    kv_fit_config_stream_groups(&c, 0, 0, &axis, &size);
    ck_assert_int_eq(axis, (int)c.keys.group_axis);
    ck_assert_int_eq(size, c.keys.group_size);
    dump_reloads(&c, &d, "key_group_axis: channels");
    kv_fit_config_free(&c);
    kv_fit_config_free(&d);
    init(&c);
    ck_assert_int_eq(load(&c, "layers: {3: {value_group_axis: heads}}\n"), KV_EINVAL);
    ck_assert_ptr_nonnull(strstr(kv_error_last(), "expected one of tokens, channels"));
    kv_fit_config_free(&c);
    init(&c);
    ck_assert_kv_ok(load(&c, "method: kivi\ncache: {pre_rope: false}\nkeys: {group_axis: tokens}\nsquat: {enabled: true}\n"
                             "layers: {2: {key_group_size: 64}}\n"));
    ck_assert_int_eq(kv_fit_config_validate(&c), KV_EINVAL);
    ck_assert_msg(strstr(kv_error_last(), "layers.2.key_group_*") != NULL, "%s", kv_error_last());
    kv_fit_config_free(&c);
}
END_TEST

/* dump -> load gives the same configuration, field for field (and the same dump). */
START_TEST(test_dump_roundtrip) {
    kv_fit_config c, d;
    init(&c);
    init(&d);
    ck_assert_kv_ok(load(&c, "method: aqua-uniform\nseed: 12345678901234\nmodel: 'yes'\n"
                             "data: {calibration: \"caf\\u00e9 #1.txt\", heldout: 'true', heldout_fraction: 0.3}\n"
                             "keys: {bits: 3, eta: 0.1, pack3: 10}\naqua: {ridge: 1.0e-7}\n"
                             "squat: {enabled: false, lambda: 0.0001, g: 32, subspace: static, choose: fixed}\n"
                             "layers:\n  12: {key_bits: 4, prune_budget: 0.5}\n  3: {rpc_ratio: 0.15}\n"));
    ck_assert_kv_ok(kv_fit_config_validate(&c));
    char *a = NULL, *b = NULL;
    ck_assert_kv_ok(kv_fit_config_dump(&a, &c));
    ck_assert_kv_ok(kv_fit_config_load_string(&d, a, strlen(a), "dump"));
    ck_assert_kv_ok(kv_fit_config_dump(&b, &d));
    ck_assert_str_eq(a, b);
    ck_assert_int_eq(d.method, KV_FIT_AQUA_UNIFORM);
    ck_assert_uint_eq(d.seed, 12345678901234ull);
    ck_assert_str_eq(d.model, "yes");
    ck_assert_str_eq(d.data.calibration, "caf\xc3\xa9 #1.txt");
    ck_assert_str_eq(d.data.heldout, "true");
    ck_assert(d.data.heldout_fraction == 0.3);
    ck_assert(d.keys.eta == 0.1);
    ck_assert(d.aqua.ridge == 1.0e-7);
    ck_assert(d.squat.lambda == 0.0001);
    ck_assert_int_eq(d.squat.subspace, KV_FIT_SQ_STATIC);
    ck_assert_int_eq(d.squat.choose, KV_FIT_SQ_FIXED);
    ck_assert_int_eq(d.keys.pack3, 10);
    ck_assert_int_eq(d.n_layer_overrides, 2);
    ck_assert_int_eq(d.layer_overrides[0].layer, 3);
    ck_assert(d.layer_overrides[1].prune_budget == 0.5);
    ck_assert_uint_eq(d.layer_overrides[1].set, KV_FIT_LO_KEY_BITS | KV_FIT_LO_PRUNE_BUDGET);
    /* readable: a couple of lines as a person would write them */
    ck_assert_ptr_nonnull(strstr(a, "method: aqua-uniform\n"));
    ck_assert_ptr_nonnull(strstr(a, "  12: {key_bits: 4, prune_budget: 0.5}\n"));
    free(a);
    free(b);
    kv_fit_config_free(&c);
    kv_fit_config_free(&d);
}
END_TEST

START_TEST(test_missing_file) {
    kv_fit_config c;
    init(&c);
    ck_assert_int_eq(kv_fit_config_load_file(&c, "/nonexistent/kvcal.yaml"), KV_EIO);
    ck_assert_ptr_nonnull(strstr(kv_error_last(), "/nonexistent/kvcal.yaml"));
    kv_fit_config_free(&c);
}
END_TEST

/* Where each value came from, for messages: a file position, the command line, a preset by name,
 * "default"; a layer override remembers where it was first set. */
START_TEST(test_origins) {
    kv_fit_config c;
    init(&c);
    ck_assert_str_eq(kv_fit_config_origin(&c, "keys.bits"), "default");
    ck_assert_kv_ok(kv_fit_config_set_from(&c, "keys.group_size=32", "the kivi preset"));
    ck_assert_str_eq(kv_fit_config_origin(&c, "keys.group_size"), "the kivi preset");
    ck_assert_kv_ok(load(&c, "values:\n  bits: 3\nlayers:\n  2:\n    key_bits: 4\n"));
    ck_assert_str_eq(kv_fit_config_origin(&c, "values.bits"), "cfg.yaml:2:9");
    ck_assert_str_eq(kv_fit_config_origin(&c, "layers.2"), "cfg.yaml:5:15");
    ck_assert_str_eq(kv_fit_config_origin(&c, "layers.2.key_bits"), "cfg.yaml:5:15");
    ck_assert_kv_ok(kv_fit_config_set(&c, "layers.9.value_bits=2"));
    ck_assert_str_eq(kv_fit_config_origin(&c, "layers.9"), "command line");
    ck_assert_str_eq(kv_fit_config_origin(&c, "layers.5"), "default");
    /* the bits range is the shared one */
    ck_assert_int_eq(kv_fit_config_set(&c, "keys.bits=9"), KV_EINVAL);
    ck_assert_int_eq(kv_fit_config_set(&c, "layers.1.key_bits=9"), KV_EINVAL);
    char as[64];
    snprintf(as, sizeof as, "layers.1.key_bits=%d", KV_FIT_MAX_BITS);
    ck_assert_kv_ok(kv_fit_config_set(&c, as));
    /* 16: an f16 stream (kivi only; the uniform quantizer has no 16-bit mode), 9..15 still refused */
    ck_assert_int_eq(kv_fit_config_set(&c, "values.bits=15"), KV_EINVAL);
    ck_assert_ptr_nonnull(strstr(kv_error_last(), "got '15' (or 16: the stream kept in f16"));
    ck_assert_kv_ok(kv_fit_config_set(&c, "layers.3.value_bits=16"));
    ck_assert_kv_ok(kv_fit_config_set(&c, "method=kivi"));
    ck_assert_kv_ok(kv_fit_config_validate(&c));
    ck_assert_kv_ok(kv_fit_config_set(&c, "method=aqua"));
    ck_assert_int_eq(kv_fit_config_validate(&c), KV_EINVAL);
    ck_assert_ptr_nonnull(strstr(kv_error_last(), "only method kivi"));
    ck_assert_kv_ok(kv_fit_config_set(&c, "method=kivi"));
    /* a pruning budget is a fraction of the f16 cache in (0, 1] */
    ck_assert_kv_ok(kv_fit_config_set(&c, "pruning.method=snapkv"));
    const char *budgets[] = {"pruning.budget=0", "pruning.budget=-0.5", "pruning.budget=1.01"};
    for (int i = 0; i < 3; i++) {
        ck_assert_kv_ok(kv_fit_config_set(&c, budgets[i]));
        ck_assert_int_eq(kv_fit_config_validate(&c), KV_EINVAL);
        ck_assert_ptr_nonnull(strstr(kv_error_last(), "key 'pruning.budget': the budget is the fraction"));
    }
    ck_assert_kv_ok(kv_fit_config_set(&c, "pruning.budget=0.125"));
    ck_assert_kv_ok(kv_fit_config_validate(&c));
    ck_assert_int_eq(kv_fit_config_set_from(&c, "nonsense", "preset x"), KV_EINVAL);
    ck_assert_ptr_nonnull(strstr(kv_error_last(), "preset x"));
    kv_fit_config_free(&c);
}
END_TEST

/* A configuration file is bounded: over KV_FIT_CONFIG_MAX_BYTES it is refused without being read
 * whole; a directory is refused. */
START_TEST(test_file_bounds) {
    kv_fit_config c;
    init(&c);
    char dir[256], path[600];
    kv_test_tmpdir(dir, sizeof dir);
    ck_assert_ptr_nonnull(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/big.yaml", dir);
    FILE *fp = fopen(path, "wb");
    ck_assert_ptr_nonnull(fp);
    ck_assert_int_eq(fseek(fp, (long)KV_FIT_CONFIG_MAX_BYTES, SEEK_SET), 0);
    fputc('\n', fp);
    fclose(fp);
    ck_assert_int_eq(kv_fit_config_load_file(&c, path), KV_EINVAL);
    ck_assert_ptr_nonnull(strstr(kv_error_last(), "larger than"));
    ck_assert_int_eq(kv_fit_config_load_file(&c, dir), KV_EINVAL);
    ck_assert_ptr_nonnull(strstr(kv_error_last(), "directory"));
    unlink(path);
    rmdir(dir);
    kv_fit_config_free(&c);
}
END_TEST

int main(void) {
    Suite *s = suite_create("plan_config");
    TCase *tc = tcase_create("config");
    tcase_add_test(tc, test_defaults);
    tcase_add_test(tc, test_example_is_the_defaults);
    tcase_add_loop_test(tc, test_bad_yaml, 0, N_BAD);
    tcase_add_test(tc, test_values_and_null);
    tcase_add_test(tc, test_command_line_overrides);
    tcase_add_loop_test(tc, test_cross_validation, 0, N_CROSS);
    tcase_add_test(tc, test_cross_origin_command_line);
    tcase_add_test(tc, test_dump_roundtrip);
    tcase_add_test(tc, test_stream_methods);
    tcase_add_test(tc, test_stream_groups);
    tcase_add_test(tc, test_missing_file);
    tcase_add_test(tc, test_origins);
    tcase_add_test(tc, test_file_bounds);
    suite_add_tcase(s, tc);
    return kv_test_run(s);
}
