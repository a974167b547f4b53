/* GGUF reader and writer: the hand-built base image, every metadata type, nested arrays, tensors
 * of several types, v2 files, round trips (byte-identical), getters, alignment, writer errors,
 * atomic writes. */
#define _POSIX_C_SOURCE 200809L
#include "gguf_test_util.h"

#include <dirent.h>
#include <math.h>
#include <stdlib.h>
#include <unistd.h>

static void check_base_content(const kv_gguf *g) {
    ck_assert_uint_eq(kv_gguf_kv_count(g), 5);
    ck_assert_uint_eq(kv_gguf_alignment(g), 32);
    char *arch = NULL;
    ck_assert_kv_ok(kv_gguf_get_str(g, "general.architecture", &arch));
    ck_assert_str_eq(arch, "llama");
    free(arch);
    const kv_gguf_value *v = kv_gguf_find(g, "test.u32s");
    ck_assert_ptr_nonnull(v);
    ck_assert_int_eq(v->type, KV_GGUF_ARRAY);
    ck_assert_int_eq(v->v.arr.elem_type, KV_GGUF_UINT32);
    ck_assert_uint_eq(v->v.arr.count, 3);
    ck_assert_ptr_null(v->v.arr.items);
    for (uint32_t i = 0; i < 3; i++) ck_assert_uint_eq(kv_load_u32le(v->v.arr.raw + 4 * i), i + 1);
    v = kv_gguf_find(g, "test.strs");
    ck_assert_ptr_nonnull(v);
    ck_assert_int_eq(v->v.arr.elem_type, KV_GGUF_STRING);
    ck_assert_uint_eq(v->v.arr.count, 2);
    ck_assert_int_eq(v->v.arr.items[1].type, KV_GGUF_STRING);
    ck_assert_uint_eq(v->v.arr.items[1].v.str.len, 2);
    ck_assert_mem_eq(v->v.arr.items[1].v.str.ptr, "bc", 2);
    uint64_t flag = 0;
    ck_assert_kv_ok(kv_gguf_get_u64(g, "test.flag", &flag));
    ck_assert_uint_eq(flag, 1);
    ck_assert_str_eq(kv_gguf_kv_at(g, 0)->key, "general.architecture");
    ck_assert_str_eq(kv_gguf_kv_at(g, 4)->key, "test.flag");
    ck_assert_ptr_null(kv_gguf_kv_at(g, 5));

    ck_assert_uint_eq(kv_gguf_tensor_count(g), 2);
    const kv_tensor_info *t0 = kv_gguf_find_tensor(g, "t0");
    const kv_tensor_info *t1 = kv_gguf_find_tensor(g, "t1");
    ck_assert_ptr_eq(t0, kv_gguf_tensor_at(g, 0));
    ck_assert_ptr_eq(t1, kv_gguf_tensor_at(g, 1));
    ck_assert_ptr_null(kv_gguf_tensor_at(g, 2));
    ck_assert_ptr_null(kv_gguf_find_tensor(g, "t2"));
    ck_assert_int_eq(t0->dtype, KV_DTYPE_F32);
    ck_assert_int_eq(t0->n_dims, 2);
    ck_assert(t0->ne[0] == 4 && t0->ne[1] == 2 && t0->ne[2] == 1 && t0->ne[3] == 1);
    ck_assert_uint_eq(t0->nbytes, 32);
    ck_assert_uint_eq(t1->nbytes, 34);
    ck_assert_uint_eq(t1->offset, 32);
    ck_assert_uint_eq(kv_gguf_data_offset(g) % 32, 0);
    float out[32];
    ck_assert_kv_ok(kv_dequantize(out, t0->data, t0->dtype, 8));
    for (int i = 0; i < 8; i++) ck_assert(out[i] == (float)i);
    ck_assert_kv_ok(kv_dequantize(out, t1->data, t1->dtype, 32));
    for (int j = 0; j < 32; j++) ck_assert(out[j] == 0.5f * (float)(j - 16));
}

/* The reader parses a hand-built image, and the writer produces exactly the same bytes. */
START_TEST(test_base_image) {
    bb b;
    base_offsets o;
    gguf_base_image(&b, &o);
    kv_gguf *g = NULL;
    ck_assert_kv_ok(kv_gguf_open_memory(&g, b.p, b.n));
    ck_assert_uint_eq(kv_gguf_version(g), 3);
    ck_assert_uint_eq(kv_gguf_data_offset(g), o.data);
    check_base_content(g);
    kv_gguf_close(g);

    kv_gguf_writer *w = gguf_base_writer();
    uint8_t *mem = NULL;
    size_t n = 0;
    ck_assert_kv_ok(kv_gguf_writer_to_memory(w, &mem, &n));
    ck_assert_uint_eq(n, b.n);
    ck_assert_mem_eq(mem, b.p, n);
    free(mem);
    kv_gguf_writer_free(w);
    free(b.p);
}
END_TEST

/* v2 has the same little-endian layout; only the version field differs. */
START_TEST(test_v2_image) {
    bb b;
    base_offsets o;
    gguf_base_image(&b, &o);
    kv_store_u32le(b.p + o.version, 2);
    kv_gguf *g = NULL;
    ck_assert_kv_ok(kv_gguf_open_memory(&g, b.p, b.n));
    ck_assert_uint_eq(kv_gguf_version(g), 2);
    check_base_content(g);
    kv_gguf_close(g);
    free(b.p);
}
END_TEST

/* ---- a file with every metadata type, nested arrays and several tensor types -------------------- */
typedef struct rich_tensor {
    const char *name;
    int dtype;
    int n_dims;
    uint64_t ne[4];
} rich_tensor;

static const rich_tensor g_rich_tensors[] = {
    {"f32.1d", KV_DTYPE_F32, 1, {7, 1, 1, 1}},
    {"f16.3d", KV_DTYPE_F16, 3, {5, 3, 2, 1}},
    {"bf16.2d", KV_DTYPE_BF16, 2, {3, 3, 1, 1}},
    {"q8_0.4d", KV_DTYPE_Q8_0, 4, {64, 2, 1, 3}},
    {"q4_1.2d", KV_DTYPE_Q4_1, 2, {96, 5, 1, 1}},
    {"q4_k.2d", KV_DTYPE_Q4_K, 2, {256, 2, 1, 1}},
    {"q6_k.1d", KV_DTYPE_Q6_K, 1, {512, 1, 1, 1}},
    {"i32.1d", KV_DTYPE_I32, 1, {3, 1, 1, 1}},
    {"iq2_xxs.1d", 16, 1, {256, 1, 1, 1}}, /* readable and writable even though not dequantizable */
};
#define N_RICH ((int)(sizeof g_rich_tensors / sizeof g_rich_tensors[0]))

static size_t rich_nbytes(const rich_tensor *t) {
    size_t n;
    ck_assert_kv_ok(kv_dtype_row_bytes(&n, t->dtype, t->ne[0]));
    return n * (size_t)(t->ne[1] * t->ne[2] * t->ne[3]);
}

/* Deterministic bytes for tensor i (with finite f16 scales where the type has them: the reader
 * does not care, but the tests dequantize some). */
static uint8_t *rich_data(int i) {
    const rich_tensor *t = &g_rich_tensors[i];
    const size_t n = rich_nbytes(t);
    uint8_t *d = malloc(n);
    kv_rng r;
    kv_rng_init(&r, 1000 + (uint64_t)i);
    for (size_t k = 0; k < n; k++) d[k] = (uint8_t)kv_rng_next_u64(&r);
    if (t->dtype == KV_DTYPE_F32)
        for (size_t k = 0; k < n / 4; k++) kv_store_f32le(d + 4 * k, (float)k * 0.25f);
    return d;
}

static kv_gguf_value scalar_u(kv_gguf_type t, uint64_t v) {
    kv_gguf_value x = {.type = t};
    x.v.u64 = v;
    return x;
}
static kv_gguf_value scalar_i(kv_gguf_type t, int64_t v) {
    kv_gguf_value x = {.type = t};
    x.v.i64 = v;
    return x;
}
static kv_gguf_value scalar_f(kv_gguf_type t, double v) {
    kv_gguf_value x = {.type = t};
    x.v.f64 = v;
    return x;
}

static kv_gguf_writer *rich_writer(void) {
    kv_gguf_writer *w = NULL;
    ck_assert_kv_ok(kv_gguf_writer_create(&w));
    ck_assert_kv_ok(kv_gguf_writer_set_str(w, "general.architecture", "llama"));
    /* every scalar type */
    kv_gguf_value v;
    v = scalar_u(KV_GGUF_UINT8, 250);
    ck_assert_kv_ok(kv_gguf_writer_set_value(w, "s.u8", &v));
    v = scalar_i(KV_GGUF_INT8, -100);
    ck_assert_kv_ok(kv_gguf_writer_set_value(w, "s.i8", &v));
    v = scalar_u(KV_GGUF_UINT16, 65000);
    ck_assert_kv_ok(kv_gguf_writer_set_value(w, "s.u16", &v));
    v = scalar_i(KV_GGUF_INT16, -32768);
    ck_assert_kv_ok(kv_gguf_writer_set_value(w, "s.i16", &v));
    ck_assert_kv_ok(kv_gguf_writer_set_u32(w, "s.u32", 4000000000u));
    ck_assert_kv_ok(kv_gguf_writer_set_i32(w, "s.i32", -2000000000));
    ck_assert_kv_ok(kv_gguf_writer_set_f32(w, "s.f32", 1e5f));
    ck_assert_kv_ok(kv_gguf_writer_set_bool(w, "s.bool", 7)); /* any nonzero is true */
    ck_assert_kv_ok(kv_gguf_writer_set_str(w, "s.str", "h\xc3\xa9llo"));
    ck_assert_kv_ok(kv_gguf_writer_set_str(w, "s.empty", ""));
    ck_assert_kv_ok(kv_gguf_writer_set_u64(w, "s.u64", UINT64_MAX));
    v = scalar_i(KV_GGUF_INT64, INT64_MIN);
    ck_assert_kv_ok(kv_gguf_writer_set_value(w, "s.i64", &v));
    v = scalar_f(KV_GGUF_FLOAT64, -0.1);
    ck_assert_kv_ok(kv_gguf_writer_set_value(w, "s.f64", &v));
    /* arrays of every fixed type */
    const uint8_t u8s[3] = {0, 1, 255};
    ck_assert_kv_ok(kv_gguf_writer_set_array(w, "a.u8", KV_GGUF_UINT8, u8s, 3));
    const int8_t i8s[2] = {-1, 1};
    ck_assert_kv_ok(kv_gguf_writer_set_array(w, "a.i8", KV_GGUF_INT8, i8s, 2));
    const uint16_t u16s[2] = {1, 65535};
    ck_assert_kv_ok(kv_gguf_writer_set_array(w, "a.u16", KV_GGUF_UINT16, u16s, 2));
    const int16_t i16s[2] = {-2, 2};
    ck_assert_kv_ok(kv_gguf_writer_set_array(w, "a.i16", KV_GGUF_INT16, i16s, 2));
    const int32_t i32s[4] = {1, -2, 3, -4};
    ck_assert_kv_ok(kv_gguf_writer_set_array(w, "a.i32", KV_GGUF_INT32, i32s, 4));
    const float f32s[2] = {0.5f, -1.5f};
    ck_assert_kv_ok(kv_gguf_writer_set_array(w, "a.f32", KV_GGUF_FLOAT32, f32s, 2));
    const uint8_t bools[3] = {1, 0, 1};
    ck_assert_kv_ok(kv_gguf_writer_set_array(w, "a.bool", KV_GGUF_BOOL, bools, 3));
    const uint64_t u64s[1] = {1ull << 63};
    ck_assert_kv_ok(kv_gguf_writer_set_array(w, "a.u64", KV_GGUF_UINT64, u64s, 1));
    const int64_t i64s[2] = {-1, INT64_MAX};
    ck_assert_kv_ok(kv_gguf_writer_set_array(w, "a.i64", KV_GGUF_INT64, i64s, 2));
    const double f64s[2] = {3.25, -1e300};
    ck_assert_kv_ok(kv_gguf_writer_set_array(w, "a.f64", KV_GGUF_FLOAT64, f64s, 2));
    ck_assert_kv_ok(kv_gguf_writer_set_array(w, "a.empty", KV_GGUF_UINT32, NULL, 0));
    const char *strs[3] = {"x", "", "yz"};
    ck_assert_kv_ok(kv_gguf_writer_set_str_array(w, "a.str", strs, 3));
    ck_assert_kv_ok(kv_gguf_writer_set_str_array(w, "a.str_empty", NULL, 0));
    /* nested: [[1,2,3],[],[4]] of uint32, [["a"],["b","c"]] of strings, [[[7]]] three deep */
    const uint32_t n0[3] = {1, 2, 3}, n2[1] = {4};
    kv_gguf_value inner[3] = {{.type = KV_GGUF_ARRAY}, {.type = KV_GGUF_ARRAY}, {.type = KV_GGUF_ARRAY}};
    for (int i = 0; i < 3; i++) inner[i].v.arr.elem_type = KV_GGUF_UINT32;
    inner[0].v.arr.count = 3;
    inner[0].v.arr.raw = (const uint8_t *)n0;
    inner[2].v.arr.count = 1;
    inner[2].v.arr.raw = (const uint8_t *)n2;
    kv_gguf_value outer = {.type = KV_GGUF_ARRAY};
    outer.v.arr.elem_type = KV_GGUF_ARRAY;
    outer.v.arr.count = 3;
    outer.v.arr.items = inner;
    ck_assert_kv_ok(kv_gguf_writer_set_value(w, "n.u32", &outer));
    kv_gguf_value sa[1] = {{.type = KV_GGUF_STRING}}, sb[2] = {{.type = KV_GGUF_STRING}, {.type = KV_GGUF_STRING}};
    sa[0].v.str.ptr = "a";
    sa[0].v.str.len = 1;
    sb[0].v.str.ptr = "b";
    sb[0].v.str.len = 1;
    sb[1].v.str.ptr = "c";
    sb[1].v.str.len = 1;
    kv_gguf_value sinner[2] = {{.type = KV_GGUF_ARRAY}, {.type = KV_GGUF_ARRAY}};
    sinner[0].v.arr.elem_type = sinner[1].v.arr.elem_type = KV_GGUF_STRING;
    sinner[0].v.arr.count = 1;
    sinner[0].v.arr.items = sa;
    sinner[1].v.arr.count = 2;
    sinner[1].v.arr.items = sb;
    kv_gguf_value souter = {.type = KV_GGUF_ARRAY};
    souter.v.arr.elem_type = KV_GGUF_ARRAY;
    souter.v.arr.count = 2;
    souter.v.arr.items = sinner;
    ck_assert_kv_ok(kv_gguf_writer_set_value(w, "n.str", &souter));
    const uint32_t seven = 7;
    kv_gguf_value d3 = {.type = KV_GGUF_ARRAY}, d2 = {.type = KV_GGUF_ARRAY}, d1 = {.type = KV_GGUF_ARRAY};
    d3.v.arr.elem_type = KV_GGUF_UINT32;
    d3.v.arr.count = 1;
    d3.v.arr.raw = (const uint8_t *)&seven;
    d2.v.arr.elem_type = KV_GGUF_ARRAY;
    d2.v.arr.count = 1;
    d2.v.arr.items = &d3;
    d1.v.arr.elem_type = KV_GGUF_ARRAY;
    d1.v.arr.count = 1;
    d1.v.arr.items = &d2;
    ck_assert_kv_ok(kv_gguf_writer_set_value(w, "n.deep", &d1));
    for (int i = 0; i < N_RICH; i++) {
        uint8_t *d = rich_data(i);
        const rich_tensor *t = &g_rich_tensors[i];
        ck_assert_kv_ok(kv_gguf_writer_add_tensor(w, t->name, t->dtype, t->n_dims, t->ne, d));
        free(d);
    }
    return w;
}

static void check_rich(const kv_gguf *g) {
    uint64_t u;
    int64_t i;
    double f;
    char *s;
    ck_assert_uint_eq(kv_gguf_version(g), 3);
    ck_assert_uint_eq(kv_gguf_kv_count(g), 30);
    ck_assert_kv_ok(kv_gguf_get_u64(g, "s.u8", &u));
    ck_assert_uint_eq(u, 250);
    ck_assert_kv_ok(kv_gguf_get_i64(g, "s.i8", &i));
    ck_assert_int_eq(i, -100);
    ck_assert_kv_ok(kv_gguf_get_u64(g, "s.u16", &u));
    ck_assert_uint_eq(u, 65000);
    ck_assert_kv_ok(kv_gguf_get_i64(g, "s.i16", &i));
    ck_assert_int_eq(i, -32768);
    ck_assert_kv_ok(kv_gguf_get_u64(g, "s.u32", &u));
    ck_assert_uint_eq(u, 4000000000u);
    ck_assert_kv_ok(kv_gguf_get_i64(g, "s.i32", &i));
    ck_assert_int_eq(i, -2000000000);
    ck_assert_kv_ok(kv_gguf_get_f64(g, "s.f32", &f));
    ck_assert(f == 1e5);
    ck_assert_int_eq(kv_gguf_find(g, "s.f32")->type, KV_GGUF_FLOAT32);
    ck_assert_kv_ok(kv_gguf_get_u64(g, "s.bool", &u));
    ck_assert_uint_eq(u, 1);
    ck_assert_int_eq(kv_gguf_find(g, "s.bool")->type, KV_GGUF_BOOL);
    ck_assert_kv_ok(kv_gguf_get_str(g, "s.str", &s));
    ck_assert_str_eq(s, "h\xc3\xa9llo");
    free(s);
    ck_assert_kv_ok(kv_gguf_get_str(g, "s.empty", &s));
    ck_assert_str_eq(s, "");
    free(s);
    ck_assert_kv_ok(kv_gguf_get_u64(g, "s.u64", &u));
    ck_assert_uint_eq(u, UINT64_MAX);
    ck_assert_kv_ok(kv_gguf_get_i64(g, "s.i64", &i));
    ck_assert(i == INT64_MIN);
    ck_assert_kv_ok(kv_gguf_get_f64(g, "s.f64", &f));
    ck_assert(f == -0.1);
    /* fixed arrays: raw little-endian elements */
    const kv_gguf_value *v = kv_gguf_find(g, "a.i64");
    ck_assert(v && v->type == KV_GGUF_ARRAY && v->v.arr.elem_type == KV_GGUF_INT64 && v->v.arr.count == 2);
    ck_assert((int64_t)kv_load_u64le(v->v.arr.raw + 8) == INT64_MAX);
    v = kv_gguf_find(g, "a.f64");
    union { uint64_t u; double d; } cv;
    cv.u = kv_load_u64le(v->v.arr.raw + 8);
    ck_assert(cv.d == -1e300);
    v = kv_gguf_find(g, "a.bool");
    ck_assert(v->v.arr.elem_type == KV_GGUF_BOOL && v->v.arr.count == 3 && v->v.arr.raw[0] == 1 && v->v.arr.raw[1] == 0);
    v = kv_gguf_find(g, "a.i16");
    ck_assert((int16_t)kv_load_u16le(v->v.arr.raw) == -2);
    v = kv_gguf_find(g, "a.f32");
    ck_assert(kv_load_f32le(v->v.arr.raw + 4) == -1.5f);
    v = kv_gguf_find(g, "a.empty");
    ck_assert(v->v.arr.count == 0 && v->v.arr.elem_type == KV_GGUF_UINT32);
    v = kv_gguf_find(g, "a.str");
    ck_assert(v->v.arr.count == 3 && v->v.arr.items[1].v.str.len == 0 && v->v.arr.items[2].v.str.len == 2);
    ck_assert_mem_eq(v->v.arr.items[2].v.str.ptr, "yz", 2);
    v = kv_gguf_find(g, "a.str_empty");
    ck_assert(v->v.arr.count == 0 && v->v.arr.elem_type == KV_GGUF_STRING && v->v.arr.items == NULL);
    /* nested arrays */
    v = kv_gguf_find(g, "n.u32");
    ck_assert(v->v.arr.elem_type == KV_GGUF_ARRAY && v->v.arr.count == 3);
    ck_assert(v->v.arr.items[0].type == KV_GGUF_ARRAY && v->v.arr.items[0].v.arr.count == 3);
    ck_assert_uint_eq(kv_load_u32le(v->v.arr.items[0].v.arr.raw + 8), 3);
    ck_assert_uint_eq(v->v.arr.items[1].v.arr.count, 0);
    ck_assert_uint_eq(kv_load_u32le(v->v.arr.items[2].v.arr.raw), 4);
    v = kv_gguf_find(g, "n.str");
    ck_assert(v->v.arr.count == 2 && v->v.arr.items[1].v.arr.elem_type == KV_GGUF_STRING);
    ck_assert_mem_eq(v->v.arr.items[1].v.arr.items[1].v.str.ptr, "c", 1);
    v = kv_gguf_find(g, "n.deep");
    ck_assert_uint_eq(kv_load_u32le(v->v.arr.items[0].v.arr.items[0].v.arr.raw), 7);
    /* tensors */
    ck_assert_uint_eq(kv_gguf_tensor_count(g), N_RICH);
    for (int k = 0; k < N_RICH; k++) {
        const rich_tensor *rt = &g_rich_tensors[k];
        const kv_tensor_info *t = kv_gguf_find_tensor(g, rt->name);
        ck_assert_ptr_nonnull(t);
        ck_assert_ptr_eq(t, kv_gguf_tensor_at(g, (size_t)k));
        ck_assert_int_eq(t->dtype, rt->dtype);
        ck_assert_int_eq(t->n_dims, rt->n_dims);
        for (int d = 0; d < 4; d++) ck_assert_uint_eq(t->ne[d], rt->ne[d]);
        ck_assert_uint_eq(t->nbytes, rich_nbytes(rt));
        ck_assert_uint_eq(t->offset % kv_gguf_alignment(g), 0);
        ck_assert_uint_eq(((const uint8_t *)t->data - (const uint8_t *)kv_gguf_tensor_at(g, 0)->data) % kv_gguf_alignment(g), 0);
        uint8_t *want = rich_data(k);
        ck_assert_mem_eq(t->data, want, t->nbytes);
        free(want);
    }
}

START_TEST(test_rich_roundtrip) {
    kv_gguf_writer *w = rich_writer();
    uint8_t *mem = NULL, *mem2 = NULL;
    size_t n = 0, n2 = 0;
    ck_assert_kv_ok(kv_gguf_writer_to_memory(w, &mem, &n));
    /* deterministic: a second serialization is identical */
    ck_assert_kv_ok(kv_gguf_writer_to_memory(w, &mem2, &n2));
    ck_assert_uint_eq(n, n2);
    ck_assert_mem_eq(mem, mem2, n);
    free(mem2);
    ck_assert_uint_eq(n % 32, 0); /* every tensor's data is padded to the alignment */
    kv_gguf *g = NULL;
    ck_assert_kv_ok(kv_gguf_open_memory(&g, mem, n));
    check_rich(g);

    /* copy everything the reader returns into a new writer: byte-identical file */
    kv_gguf_writer *w2 = NULL;
    ck_assert_kv_ok(kv_gguf_writer_create(&w2));
    for (size_t i = 0; i < kv_gguf_kv_count(g); i++) {
        const kv_gguf_kv *kv = kv_gguf_kv_at(g, i);
        ck_assert_kv_ok(kv_gguf_writer_set_value(w2, kv->key, &kv->value));
    }
    for (size_t i = 0; i < kv_gguf_tensor_count(g); i++) {
        const kv_tensor_info *t = kv_gguf_tensor_at(g, i);
        ck_assert_kv_ok(kv_gguf_writer_add_tensor(w2, t->name, t->dtype, t->n_dims, t->ne, t->data));
    }
    ck_assert_kv_ok(kv_gguf_writer_to_memory(w2, &mem2, &n2));
    ck_assert_uint_eq(n, n2);
    ck_assert_mem_eq(mem, mem2, n);
    free(mem2);
    kv_gguf_writer_free(w2);
    kv_gguf_close(g);

    /* write to disk atomically, read back by path: same bytes, same content */
    char dir[256];
    kv_test_tmpdir(dir, sizeof dir);
    ck_assert_ptr_nonnull(mkdtemp(dir));
    char path[512];
    snprintf(path, sizeof path, "%s/rich.gguf", dir);
    ck_assert_kv_ok(kv_gguf_writer_write(w, path));
    char *file = NULL;
    size_t fn = 0;
    ck_assert_kv_ok(kv_file_read_all(&file, &fn, path));
    ck_assert_uint_eq(fn, n);
    ck_assert_mem_eq(file, mem, n);
    free(file);
    ck_assert_kv_ok(kv_gguf_open(&g, path));
    check_rich(g);
    kv_gguf_close(g);
    /* overwrite in place; no temporaries left behind */
    ck_assert_kv_ok(kv_gguf_writer_write(w, path));
    DIR *dp = opendir(dir);
    int entries = 0;
    struct dirent *de;
    while ((de = readdir(dp)))
        if (de->d_name[0] != '.') entries++;
    closedir(dp);
    ck_assert_int_eq(entries, 1);
    unlink(path);
    rmdir(dir);
    /* a directory that does not exist: KV_EIO, nothing created */
    snprintf(path, sizeof path, "%s/no/such/dir/x.gguf", dir);
    ck_assert_int_eq(kv_gguf_writer_write(w, path), KV_EIO);
    free(mem);
    kv_gguf_writer_free(w);
}
END_TEST

/* Getter type rules. */
START_TEST(test_getters) {
    kv_gguf_writer *w = rich_writer();
    uint8_t *mem;
    size_t n;
    ck_assert_kv_ok(kv_gguf_writer_to_memory(w, &mem, &n));
    kv_gguf_writer_free(w);
    kv_gguf *g;
    ck_assert_kv_ok(kv_gguf_open_memory(&g, mem, n));
    uint64_t u;
    int64_t i;
    double f;
    char *s = NULL;
    ck_assert_int_eq(kv_gguf_get_u64(g, "no.such.key", &u), KV_ENOTFOUND);
    ck_assert_ptr_nonnull(strstr(kv_error_last(), "no.such.key"));
    ck_assert_ptr_null(kv_gguf_find(g, "no.such.key"));
    ck_assert_int_eq(kv_gguf_get_u64(g, "s.i8", &u), KV_EFORMAT); /* negative */
    ck_assert_ptr_nonnull(strstr(kv_error_last(), "negative"));
    ck_assert_int_eq(kv_gguf_get_u64(g, "s.str", &u), KV_EFORMAT);
    ck_assert_ptr_nonnull(strstr(kv_error_last(), "has type string"));
    ck_assert_int_eq(kv_gguf_get_u64(g, "s.f32", &u), KV_EFORMAT);
    ck_assert_int_eq(kv_gguf_get_i64(g, "s.u64", &i), KV_EFORMAT); /* > INT64_MAX */
    ck_assert_kv_ok(kv_gguf_get_i64(g, "s.u32", &i));
    ck_assert_int_eq(i, 4000000000ll);
    ck_assert_kv_ok(kv_gguf_get_f64(g, "s.i32", &f));
    ck_assert(f == -2e9);
    ck_assert_int_eq(kv_gguf_get_f64(g, "s.str", &f), KV_EFORMAT);
    ck_assert_int_eq(kv_gguf_get_f64(g, "s.bool", &f), KV_EFORMAT);
    ck_assert_int_eq(kv_gguf_get_str(g, "s.u8", &s), KV_EFORMAT);
    ck_assert_ptr_null(s);
    ck_assert_int_eq(kv_gguf_get_str(g, "a.str", &s), KV_EFORMAT);
    ck_assert_int_eq(kv_gguf_get_u64(g, "a.u8", &u), KV_EFORMAT);
    ck_assert_str_eq(kv_gguf_type_name(KV_GGUF_FLOAT64), "float64");
    ck_assert_ptr_null(kv_gguf_type_name(13));
    kv_gguf_close(g);
    free(mem);
}
END_TEST

/* general.alignment other than 32: offsets and the data section follow it. */
START_TEST(test_alignment_64) {
    kv_gguf_writer *w = NULL;
    ck_assert_kv_ok(kv_gguf_writer_create(&w));
    ck_assert_kv_ok(kv_gguf_writer_set_u32(w, "general.alignment", 64));
    const float a[3] = {1, 2, 3};
    const uint64_t ne[1] = {3};
    ck_assert_kv_ok(kv_gguf_writer_add_tensor(w, "a", KV_DTYPE_F32, 1, ne, a));
    ck_assert_kv_ok(kv_gguf_writer_add_tensor(w, "b", KV_DTYPE_F32, 1, ne, a));
    uint8_t *mem;
    size_t n;
    ck_assert_kv_ok(kv_gguf_writer_to_memory(w, &mem, &n));
    kv_gguf *g;
    ck_assert_kv_ok(kv_gguf_open_memory(&g, mem, n));
    ck_assert_uint_eq(kv_gguf_alignment(g), 64);
    ck_assert_uint_eq(kv_gguf_data_offset(g) % 64, 0);
    ck_assert_uint_eq(kv_gguf_tensor_at(g, 1)->offset, 64);
    ck_assert(kv_load_f32le((const uint8_t *)kv_gguf_tensor_at(g, 1)->data + 8) == 3.0f);
    kv_gguf_close(g);
    free(mem);
    kv_gguf_writer_free(w);
}
END_TEST

/* A file with no tensors (and one with no kvs either) is valid. */
START_TEST(test_empty_files) {
    kv_gguf_writer *w = NULL;
    ck_assert_kv_ok(kv_gguf_writer_create(&w));
    uint8_t *mem;
    size_t n;
    ck_assert_kv_ok(kv_gguf_writer_to_memory(w, &mem, &n));
    ck_assert_uint_eq(n, 32); /* 24-byte header padded to the alignment */
    kv_gguf *g;
    ck_assert_kv_ok(kv_gguf_open_memory(&g, mem, n));
    ck_assert_uint_eq(kv_gguf_kv_count(g), 0);
    ck_assert_uint_eq(kv_gguf_tensor_count(g), 0);
    ck_assert_ptr_null(kv_gguf_find(g, "x"));
    ck_assert_ptr_null(kv_gguf_find_tensor(g, "x"));
    kv_gguf_close(g);
    /* without the padding too (other writers may stop right after the header) */
    ck_assert_kv_ok(kv_gguf_open_memory(&g, mem, 24));
    kv_gguf_close(g);
    free(mem);
    kv_gguf_writer_free(w);
    kv_gguf_close(NULL);
    kv_gguf_writer_free(NULL);
}
END_TEST

/* Setting a key again replaces its value in place. */
START_TEST(test_writer_replace) {
    kv_gguf_writer *w = NULL;
    ck_assert_kv_ok(kv_gguf_writer_create(&w));
    ck_assert_kv_ok(kv_gguf_writer_set_u32(w, "a", 1));
    ck_assert_kv_ok(kv_gguf_writer_set_str(w, "b", "x"));
    ck_assert_kv_ok(kv_gguf_writer_set_str(w, "a", "now a string"));
    uint8_t *mem;
    size_t n;
    ck_assert_kv_ok(kv_gguf_writer_to_memory(w, &mem, &n));
    kv_gguf *g;
    ck_assert_kv_ok(kv_gguf_open_memory(&g, mem, n));
    ck_assert_uint_eq(kv_gguf_kv_count(g), 2);
    ck_assert_str_eq(kv_gguf_kv_at(g, 0)->key, "a");
    ck_assert_int_eq(kv_gguf_kv_at(g, 0)->value.type, KV_GGUF_STRING);
    kv_gguf_close(g);
    free(mem);
    kv_gguf_writer_free(w);
}
END_TEST

START_TEST(test_writer_errors) {
    kv_gguf_writer *w = NULL;
    ck_assert_kv_ok(kv_gguf_writer_create(&w));
    const float a[64] = {0};
    uint64_t ne[4] = {4, 1, 1, 1};
    ck_assert_kv_ok(kv_gguf_writer_add_tensor(w, "a", KV_DTYPE_F32, 1, ne, a));
    ck_assert_int_eq(kv_gguf_writer_add_tensor(w, "a", KV_DTYPE_F32, 1, ne, a), KV_EINVAL);
    ck_assert_ptr_nonnull(strstr(kv_error_last(), "duplicate tensor name"));
    ck_assert_int_eq(kv_gguf_writer_add_tensor(w, "b", KV_DTYPE_F32, 0, ne, a), KV_EINVAL);
    ck_assert_int_eq(kv_gguf_writer_add_tensor(w, "b", KV_DTYPE_F32, 5, ne, a), KV_EINVAL);
    ck_assert_int_eq(kv_gguf_writer_add_tensor(w, "", KV_DTYPE_F32, 1, ne, a), KV_EINVAL);
    ck_assert_int_eq(kv_gguf_writer_add_tensor(w, "b", KV_DTYPE_Q4_0, 1, ne, a), KV_EINVAL); /* 4 % 32 */
    ck_assert_ptr_nonnull(strstr(kv_error_last(), "not a whole number of blocks"));
    ck_assert_int_eq(kv_gguf_writer_add_tensor(w, "b", 99, 1, ne, a), KV_EINVAL);
    ne[0] = 0;
    ck_assert_int_eq(kv_gguf_writer_add_tensor(w, "b", KV_DTYPE_F32, 1, ne, a), KV_EINVAL);
    ne[0] = 4;
    ck_assert_int_eq(kv_gguf_writer_add_tensor(w, "b", KV_DTYPE_F32, 1, ne, NULL), KV_EINVAL);
    ck_assert_int_eq(kv_gguf_writer_set_array(w, "x", KV_GGUF_STRING, a, 1), KV_EINVAL);
    ck_assert_int_eq(kv_gguf_writer_set_array(w, "x", KV_GGUF_UINT32, NULL, 2), KV_EINVAL);
    const uint8_t badbool[2] = {1, 2};
    ck_assert_int_eq(kv_gguf_writer_set_array(w, "x", KV_GGUF_BOOL, badbool, 2), KV_EINVAL);
    ck_assert_int_eq(kv_gguf_writer_set_u32(w, "general.alignment", 48), KV_EINVAL);
    ck_assert_int_eq(kv_gguf_writer_set_u64(w, "general.alignment", 64), KV_EINVAL);
    ck_assert_int_eq(kv_gguf_writer_set_str(w, "", "x"), KV_EINVAL);
    ck_assert_int_eq(kv_gguf_writer_set_str(w, "x", NULL), KV_EINVAL);
    kv_gguf_value v = {.type = KV_GGUF_UINT8};
    v.v.u64 = 256;
    ck_assert_int_eq(kv_gguf_writer_set_value(w, "x", &v), KV_EINVAL);
    ck_assert_ptr_nonnull(strstr(kv_error_last(), "out of range for uint8"));
    v.type = KV_GGUF_INT16;
    v.v.i64 = 40000;
    ck_assert_int_eq(kv_gguf_writer_set_value(w, "x", &v), KV_EINVAL);
    v.type = (kv_gguf_type)13;
    ck_assert_int_eq(kv_gguf_writer_set_value(w, "x", &v), KV_EINVAL);
    /* array element of the wrong type */
    kv_gguf_value item = {.type = KV_GGUF_UINT32};
    kv_gguf_value arr = {.type = KV_GGUF_ARRAY};
    arr.v.arr.elem_type = KV_GGUF_STRING;
    arr.v.arr.count = 1;
    arr.v.arr.items = &item;
    ck_assert_int_eq(kv_gguf_writer_set_value(w, "x", &arr), KV_EINVAL);
    /* nesting deeper than the reader accepts */
    kv_gguf_value chain[40];
    for (int i = 0; i < 40; i++) {
        memset(&chain[i], 0, sizeof chain[i]);
        chain[i].type = KV_GGUF_ARRAY;
        chain[i].v.arr.elem_type = i < 39 ? KV_GGUF_ARRAY : KV_GGUF_UINT32;
        chain[i].v.arr.count = i < 39 ? 1 : 0;
        chain[i].v.arr.items = i < 39 ? &chain[i + 1] : NULL;
    }
    ck_assert_int_eq(kv_gguf_writer_set_value(w, "x", &chain[0]), KV_EINVAL);
    ck_assert_ptr_nonnull(strstr(kv_error_last(), "nested deeper"));
    /* the failed calls left nothing behind */
    uint8_t *mem;
    size_t n;
    ck_assert_kv_ok(kv_gguf_writer_to_memory(w, &mem, &n));
    kv_gguf *g;
    ck_assert_kv_ok(kv_gguf_open_memory(&g, mem, n));
    ck_assert_uint_eq(kv_gguf_kv_count(g), 0);
    ck_assert_uint_eq(kv_gguf_tensor_count(g), 1);
    kv_gguf_close(g);
    free(mem);
    kv_gguf_writer_free(w);
}
END_TEST

/* Nesting up to the limit is accepted by both sides. */
START_TEST(test_nesting_limit) {
    kv_gguf_value chain[16];
    for (int i = 0; i < 16; i++) {
        memset(&chain[i], 0, sizeof chain[i]);
        chain[i].type = KV_GGUF_ARRAY;
        chain[i].v.arr.elem_type = i < 15 ? KV_GGUF_ARRAY : KV_GGUF_UINT32;
        chain[i].v.arr.count = i < 15 ? 1 : 0;
        chain[i].v.arr.items = i < 15 ? &chain[i + 1] : NULL;
    }
    kv_gguf_writer *w = NULL;
    ck_assert_kv_ok(kv_gguf_writer_create(&w));
    /* 16 array levels = depth 0..15 */
    ck_assert_kv_ok(kv_gguf_writer_set_value(w, "deep", &chain[0]));
    uint8_t *mem;
    size_t n;
    ck_assert_kv_ok(kv_gguf_writer_to_memory(w, &mem, &n));
    kv_gguf *g;
    ck_assert_kv_ok(kv_gguf_open_memory(&g, mem, n));
    const kv_gguf_value *v = kv_gguf_find(g, "deep");
    for (int i = 0; i < 15; i++) v = &v->v.arr.items[0];
    ck_assert(v->type == KV_GGUF_ARRAY && v->v.arr.elem_type == KV_GGUF_UINT32 && v->v.arr.count == 0);
    kv_gguf_close(g);
    free(mem);
    kv_gguf_writer_free(w);
}
END_TEST

/* A realistic tokenizer-sized string array parses and indexes quickly. */
START_TEST(test_large_arrays) {
    enum { N = 60000 };
    char **strs = malloc(N * sizeof *strs);
    for (int i = 0; i < N; i++) {
        strs[i] = malloc(16);
        snprintf(strs[i], 16, "tok%d", i);
    }
    kv_gguf_writer *w = NULL;
    ck_assert_kv_ok(kv_gguf_writer_create(&w));
    ck_assert_kv_ok(kv_gguf_writer_set_str_array(w, "tokenizer.ggml.tokens", (const char *const *)strs, N));
    for (int i = 0; i < 2000; i++) {
        char key[32];
        snprintf(key, sizeof key, "k.%d", i);
        ck_assert_kv_ok(kv_gguf_writer_set_u32(w, key, (uint32_t)i));
    }
    uint8_t *mem;
    size_t n;
    ck_assert_kv_ok(kv_gguf_writer_to_memory(w, &mem, &n));
    kv_gguf *g;
    ck_assert_kv_ok(kv_gguf_open_memory(&g, mem, n));
    const kv_gguf_value *v = kv_gguf_find(g, "tokenizer.ggml.tokens");
    ck_assert_uint_eq(v->v.arr.count, N);
    ck_assert_mem_eq(v->v.arr.items[54321].v.str.ptr, "tok54321", 8);
    uint64_t u;
    ck_assert_kv_ok(kv_gguf_get_u64(g, "k.1999", &u));
    ck_assert_uint_eq(u, 1999);
    kv_gguf_close(g);
    free(mem);
    kv_gguf_writer_free(w);
    for (int i = 0; i < N; i++) free(strs[i]);
    free(strs);
}
END_TEST

Suite *gguf_rw_suite(void) {
    Suite *s = suite_create("gguf_rw");
    TCase *tc = tcase_create("rw");
    tcase_add_test(tc, test_base_image);
    tcase_add_test(tc, test_v2_image);
    tcase_add_test(tc, test_rich_roundtrip);
    tcase_add_test(tc, test_getters);
    tcase_add_test(tc, test_alignment_64);
    tcase_add_test(tc, test_empty_files);
    tcase_add_test(tc, test_writer_replace);
    tcase_add_test(tc, test_writer_errors);
    tcase_add_test(tc, test_nesting_limit);
    tcase_add_test(tc, test_large_arrays);
    suite_add_tcase(s, tc);
    return s;
}
