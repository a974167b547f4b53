/* Corrupt GGUF files: each is the hand-built base image with one field patched (or cut short);
 * each must fail with its own status and a message naming the problem, never crash (this binary
 * also runs under ASan+UBSan). Then every truncation and many random mutations of a valid file. */
#define _POSIX_C_SOURCE 200809L
#include "gguf_test_util.h"

#include <unistd.h>

typedef struct corrupt_case {
    const char *name;
    kv_status want;
    const char *substr; /* distinctive part of the message */
} corrupt_case;

static void p32(bb *b, size_t at, uint32_t v) { kv_store_u32le(b->p + at, v); }
static void p64(bb *b, size_t at, uint64_t v) { kv_store_u64le(b->p + at, v); }

#define BIG (1ull << 60)

static const corrupt_case g_cases[] = {
    /* 0 */ {"bad magic", KV_EFORMAT, "bad magic 47 47 55 58 ('GGUX'), expected 'GGUF'"},
    /* 1 */ {"version 1", KV_EVERSION, "GGUF version 1 is not supported"},
    /* 2 */ {"future version", KV_EVERSION, "GGUF version 4 is a future version"},
    /* 3 */ {"big-endian file", KV_EUNSUPPORTED, "big-endian GGUF file"},
    /* 4 */ {"truncated header (20 bytes)", KV_EFORMAT, "truncated header: the file has 20 bytes"},
    /* 5 */ {"empty file", KV_EFORMAT, "truncated header: the file has 0 bytes"},
    /* 6 */ {"tensor_count 2^60", KV_EFORMAT, "tensor_count 1152921504606846976 is more than"},
    /* 7 */ {"kv_count 2^60", KV_EFORMAT, "kv_count 1152921504606846976 is more than"},
    /* 8 */ {"kv_count 2^64-1", KV_EFORMAT, "kv_count 18446744073709551615 is more than"},
    /* 9 */ {"counts together too large", KV_EFORMAT, "and tensor_count"},
    /* 10 */ {"key length past the end", KV_EFORMAT, "kv 0: key length 4611686018427387904"},
    /* 11 */ {"empty key", KV_EFORMAT, "kv 0: key at offset 24 is empty"},
    /* 12 */ {"NUL in key", KV_EFORMAT, "key at offset 24 contains a NUL byte"},
    /* 13 */ {"duplicate key", KV_EFORMAT, "duplicate key 'test.u32s' (kv 2 and kv 3)"},
    /* 14 */ {"unknown value type", KV_EFORMAT, "kv 0 ('general.architecture'): unknown value type 13"},
    /* 15 */ {"string value past the end", KV_EFORMAT, "kv 0 ('general.architecture'): string value length"},
    /* 16 */ {"u32 array count 2^60", KV_EFORMAT, "array of 1152921504606846976 uint32 values"},
    /* 17 */ {"string array count 2^60", KV_EFORMAT, "array count 1152921504606846976 of string elements"},
    /* 18 */ {"unknown array element type", KV_EFORMAT, "unknown array element type 99"},
    /* 19 */ {"array string past the end", KV_EFORMAT, "array element 0 of 2: string value length"},
    /* 20 */ {"alignment not a power of two", KV_EFORMAT, "general.alignment = 48 is not a power of two"},
    /* 21 */ {"alignment 0", KV_EFORMAT, "general.alignment = 0 is not a power of two"},
    /* 22 */ {"alignment of the wrong type", KV_EFORMAT, "general.alignment has type int32, expected uint32"},
    /* 23 */ {"bool value 2", KV_EFORMAT, "bool value 2"},
    /* 24 */ {"n_dims 0", KV_EFORMAT, "tensor 0 ('t0'): n_dims 0 out of range (1..4)"},
    /* 25 */ {"n_dims 5", KV_EFORMAT, "tensor 1 ('t1'): n_dims 5 out of range (1..4)"},
    /* 26 */ {"zero dimension", KV_EFORMAT, "tensor 0 ('t0'): dimension ne[1] is 0"},
    /* 27 */ {"dimensions overflow", KV_EFORMAT, "tensor 0 ('t0'): element count overflows"},
    /* 28 */ {"unknown tensor type", KV_EUNSUPPORTED, "tensor 1 ('t1'): unknown tensor type 99"},
    /* 29 */ {"row not whole blocks", KV_EFORMAT, "row length ne[0] = 33 is not a multiple of the Q8_0 block size 32"},
    /* 30 */ {"misaligned tensor offset", KV_EFORMAT, "tensor 1 ('t1'): data offset 40 is not a multiple of the alignment 32"},
    /* 31 */ {"tensor offset past the end", KV_EFORMAT, "tensor 1 ('t1'): data [1099511627776, +34) extends past the end"},
    /* 32 */ {"tensor data truncated", KV_EFORMAT, "tensor 1 ('t1'): data [32, +34) extends past the end of the file"},
    /* 33 */ {"duplicate tensor name", KV_EFORMAT, "tensor 1 ('t0'): duplicate tensor name (also tensor 0)"},
    /* 34 */ {"tensor name past the end", KV_EFORMAT, "tensor 0: tensor name length 1152921504606846976"},
    /* 35 */ {"cut inside tensor infos", KV_EFORMAT, "tensor 1 ('t1'): n_dims at offset"},
    /* 36 */ {"array past the end", KV_EFORMAT, "kv 2 ('test.u32s'): array of 1000 uint32 values at offset"},
    /* 37 */ {"data section past the end", KV_EFORMAT, "data section would start at"},
    /* 38 */ {"offset + size overflows", KV_EFORMAT, "tensor 1 ('t1'): data [18446744073709551584, +34) extends past"},
    /* 39 */ {"bool array element 2", KV_EFORMAT, "bool array element 4 has value 2"},
    /* 40 */ {"huge dimension", KV_EFORMAT, "tensor 1 ('t1'): data [32, +"},
    /* 41 */ {"version 0", KV_EVERSION, "GGUF version 0 is not supported"},
    /* 42 */ {"cut inside kvs", KV_EFORMAT, "kv 4 ('test.flag'): bool at offset 220 needs 1 bytes but the file ends at 220"},
};
#define N_CASES ((int)(sizeof g_cases / sizeof g_cases[0]))

/* Apply case i to the base image (may change b->n). */
static void apply_case(int i, bb *b, const base_offsets *o) {
    switch (i) {
    case 0: b->p[3] = 'X'; break;
    case 1: p32(b, o->version, 1); break;
    case 2: p32(b, o->version, 4); break;
    case 3: p32(b, o->version, 0x03000000u); break;
    case 4: b->n = 20; break;
    case 5: b->n = 0; break;
    case 6: p64(b, o->n_tensors, BIG); break;
    case 7: p64(b, o->n_kv, BIG); break;
    case 8: p64(b, o->n_kv, UINT64_MAX); break;
    case 9: { /* each count alone fits the file, both together do not */
        const uint64_t left = b->n - 24;
        p64(b, o->n_kv, left / 13);
        p64(b, o->n_tensors, left / 32);
        break;
    }
    case 10: p64(b, o->kv_key[0], 1ull << 62); break;
    case 11: p64(b, o->kv_key[0], 0); break;
    case 12: b->p[o->kv_key[0] + 8 + 3] = 0; break;
    case 13: memcpy(b->p + o->kv_key[3] + 8, "test.u32s", 9); break; /* "test.strs" -> "test.u32s" */
    case 14: p32(b, o->kv_type[0], 13); break;
    case 15: p64(b, o->kv_val[0], 1000); break;
    case 16: p64(b, o->u32s_count, BIG); break;
    case 17: p64(b, o->strs_count, BIG); break;
    case 18: p32(b, o->u32s_elem_type, 99); break;
    case 19: p64(b, o->strs_item0, 1ull << 40); break;
    case 20: p32(b, o->kv_val[1], 48); break;
    case 21: p32(b, o->kv_val[1], 0); break;
    case 22: p32(b, o->kv_type[1], KV_GGUF_INT32); break;
    case 23: b->p[o->kv_val[4]] = 2; break;
    case 24: p32(b, o->t_ndims[0], 0); break;
    case 25: p32(b, o->t_ndims[1], 5); break;
    case 26: p64(b, o->t_ne0[0] + 8, 0); break;
    case 27:
        p64(b, o->t_ne0[0], 1ull << 40);
        p64(b, o->t_ne0[0] + 8, 1ull << 40);
        break;
    case 28: p32(b, o->t_dtype[1], 99); break;
    case 29: p64(b, o->t_ne0[1], 33); break;
    case 30: p64(b, o->t_offset[1], 40); break;
    case 31: p64(b, o->t_offset[1], 1ull << 40); break;
    case 32: b->n = o->data + 32 + 20; break; /* t1's 34 bytes cut after 20 */
    case 33: b->p[o->t_name[1] + 8 + 1] = '0'; break;
    case 34: p64(b, o->t_name[0], BIG); break;
    case 35: b->n = o->t_ndims[1] + 2; break;
    case 36: p64(b, o->u32s_count, 1000); break;
    case 37: b->n = o->infos_end; break; /* the padding and data are gone */
    case 38: p64(b, o->t_offset[1], UINT64_MAX - 31); break; /* aligned, offset + size wraps */
    case 39: { /* turn test.u32s into a bool array: [1, 0, 0, 0, 2, 0, ...] */
        p32(b, o->u32s_elem_type, KV_GGUF_BOOL);
        p64(b, o->u32s_count, 12);
        break;
    }
    case 40: p64(b, o->t_ne0[1], 32ull << 30); break; /* 2^35 elements: far more data than the file */
    case 41: p32(b, o->version, 0); break;
    case 42: b->n = o->kv_val[4]; break;
    default: ck_abort_msg("no case %d", i);
    }
}

START_TEST(test_corrupt_memory) {
    bb b;
    base_offsets o;
    gguf_base_image(&b, &o);
    ck_assert_uint_ne(o.infos_end % 32, 0); /* case 37 needs padding after the infos */
    apply_case(_i, &b, &o);
    kv_gguf *g = (kv_gguf *)&b; /* must be reset to NULL on failure */
    kv_error_clear();
    const kv_status s = kv_gguf_open_memory(&g, b.p, b.n);
    const char *msg = kv_error_last();
    ck_assert_msg(s == g_cases[_i].want, "case %d (%s): got %s (%s), want %s", _i, g_cases[_i].name,
                  kv_status_name(s), msg, kv_status_name(g_cases[_i].want));
    ck_assert_ptr_null(g);
    ck_assert_msg(strstr(msg, g_cases[_i].substr) != NULL, "case %d (%s): message '%s' lacks '%s'", _i,
                  g_cases[_i].name, msg, g_cases[_i].substr);
    ck_assert_msg(strncmp(msg, "GGUF '<memory>': ", 17) == 0, "case %d: message '%s' lacks the source", _i, msg);
    free(b.p);
}
END_TEST

/* Every case also fails the same way from a file, and the message names the path. */
START_TEST(test_corrupt_file) {
    bb b;
    base_offsets o;
    gguf_base_image(&b, &o);
    apply_case(_i, &b, &o);
    char dir[256];
    kv_test_tmpdir(dir, sizeof dir);
    ck_assert_ptr_nonnull(mkdtemp(dir));
    char path[512];
    snprintf(path, sizeof path, "%s/corrupt_%d.gguf", dir, _i);
    ck_assert_kv_ok(kv_write_file_atomic(path, b.p, b.n));
    kv_gguf *g = NULL;
    const kv_status s = kv_gguf_open(&g, path);
    ck_assert_int_eq(s, g_cases[_i].want);
    ck_assert_ptr_null(g);
    ck_assert_ptr_nonnull(strstr(kv_error_last(), path));
    ck_assert_ptr_nonnull(strstr(kv_error_last(), g_cases[_i].substr));
    unlink(path);
    rmdir(dir);
    free(b.p);
}
END_TEST

/* Arrays nested deeper than the limit, and a hostile count of nested arrays: fail fast. */
START_TEST(test_corrupt_nesting) {
    bb b = {0};
    bb_put(&b, "GGUF", 4);
    bb_u32(&b, 3);
    bb_u64(&b, 0);
    bb_u64(&b, 1);
    bb_str(&b, "deep");
    bb_u32(&b, KV_GGUF_ARRAY);
    for (int i = 0; i < 100000; i++) { /* 100000 levels: must not recurse that deep */
        bb_u32(&b, KV_GGUF_ARRAY);
        bb_u64(&b, 1);
    }
    kv_gguf *g = NULL;
    ck_assert_int_eq(kv_gguf_open_memory(&g, b.p, b.n), KV_EFORMAT);
    ck_assert_ptr_nonnull(strstr(kv_error_last(), "arrays nested deeper than 16 levels"));
    free(b.p);

    memset(&b, 0, sizeof b);
    bb_put(&b, "GGUF", 4);
    bb_u32(&b, 3);
    bb_u64(&b, 0);
    bb_u64(&b, 1);
    bb_str(&b, "many");
    bb_u32(&b, KV_GGUF_ARRAY);
    bb_u32(&b, KV_GGUF_ARRAY);
    bb_u64(&b, BIG);
    for (int i = 0; i < 64; i++) bb_u8(&b, 0);
    ck_assert_int_eq(kv_gguf_open_memory(&g, b.p, b.n), KV_EFORMAT);
    ck_assert_ptr_nonnull(strstr(kv_error_last(), "array count 1152921504606846976 of array elements"));
    free(b.p);
}
END_TEST

/* Opening a path that does not exist or is a directory: KV_EIO, no crash. */
START_TEST(test_open_errors) {
    kv_gguf *g = NULL;
    ck_assert_int_eq(kv_gguf_open(&g, "/nonexistent/dir/model.gguf"), KV_EIO);
    ck_assert_ptr_nonnull(strstr(kv_error_last(), "/nonexistent/dir/model.gguf"));
    ck_assert_int_eq(kv_gguf_open(&g, "/"), KV_EIO);
    ck_assert_ptr_null(g);
    ck_assert_int_eq(kv_gguf_open_memory(&g, NULL, 5), KV_EINVAL);
}
END_TEST

/* Every prefix of a valid file fails cleanly with KV_EFORMAT, until t1's data is complete (only
 * the zero padding after the last tensor may be missing). Each prefix is its own allocation of
 * exactly that size, so ASan catches any read past the end. */
START_TEST(test_all_truncations) {
    bb b;
    base_offsets o;
    gguf_base_image(&b, &o);
    const size_t full = b.n, data_end = o.data + 32 + 34;
    for (size_t n = 0; n <= full; n++) {
        uint8_t *exact = malloc(n ? n : 1);
        memcpy(exact, b.p, n);
        kv_gguf *g = NULL;
        const kv_status s = kv_gguf_open_memory(&g, exact, n);
        if (n < data_end) {
            ck_assert_msg(s == KV_EFORMAT, "cut at %zu: %s (%s)", n, kv_status_name(s), kv_error_last());
        } else {
            ck_assert_msg(s == KV_OK, "cut at %zu: %s", n, kv_error_last());
        }
        kv_gguf_close(g);
        free(exact);
    }
    free(b.p);
}
END_TEST

/* Random mutations (1-4 bytes set to random or boundary values): any status, never a crash or a
 * sanitizer report; when a mutant opens, walking all its values and tensors stays in bounds. */
static void walk_value(const kv_gguf_value *v, const uint8_t *lo, const uint8_t *hi) {
    if (v->type == KV_GGUF_STRING && v->v.str.len) {
        ck_assert((const uint8_t *)v->v.str.ptr >= lo && (const uint8_t *)v->v.str.ptr + v->v.str.len <= hi);
    } else if (v->type == KV_GGUF_ARRAY && v->v.arr.items) {
        for (uint64_t i = 0; i < v->v.arr.count; i++) walk_value(&v->v.arr.items[i], lo, hi);
    }
}

START_TEST(test_random_mutations) {
    bb b;
    base_offsets o;
    gguf_base_image(&b, &o);
    kv_rng r;
    kv_rng_init(&r, 77);
    uint8_t *m = malloc(b.n);
    int opened = 0;
    for (int it = 0; it < 20000; it++) {
        memcpy(m, b.p, b.n);
        const int k = 1 + (int)(kv_rng_next_u64(&r) % 4);
        for (int j = 0; j < k; j++) {
            const size_t at = kv_rng_next_u64(&r) % b.n;
            const uint64_t x = kv_rng_next_u64(&r);
            const uint8_t special[] = {0x00, 0xff, 0x7f, 0x80, 0x01, 0x20, 0x40};
            m[at] = (x & 1) ? (uint8_t)(x >> 8) : special[(x >> 8) % sizeof special];
        }
        const size_t n = kv_rng_next_u64(&r) % 8 == 0 ? (size_t)(kv_rng_next_u64(&r) % b.n) : b.n;
        uint8_t *exact = malloc(n ? n : 1); /* exactly n bytes: ASan sees any overread */
        memcpy(exact, m, n);
        kv_gguf *g = NULL;
        if (kv_gguf_open_memory(&g, exact, n) == KV_OK) {
            opened++;
            for (size_t i = 0; i < kv_gguf_kv_count(g); i++) walk_value(&kv_gguf_kv_at(g, i)->value, exact, exact + n);
            for (size_t i = 0; i < kv_gguf_tensor_count(g); i++) {
                const kv_tensor_info *t = kv_gguf_tensor_at(g, i);
                ck_assert((const uint8_t *)t->data >= exact && (const uint8_t *)t->data + t->nbytes <= exact + n);
                if (kv_dtype_can_dequantize(t->dtype) && t->nbytes <= 4096) {
                    const uint64_t ne = t->ne[0] * t->ne[1] * t->ne[2] * t->ne[3];
                    float *out = malloc((size_t)ne * sizeof(float) + 4);
                    ck_assert_kv_ok(kv_dequantize(out, t->data, t->dtype, (size_t)ne));
                    free(out);
                }
            }
            kv_gguf_close(g);
        }
        free(exact);
    }
    ck_assert_int_gt(opened, 0); /* some mutants (in data bytes) are still valid files */
    free(m);
    free(b.p);
}
END_TEST

Suite *gguf_corrupt_suite(void) {
    Suite *s = suite_create("gguf_corrupt");
    TCase *tc = tcase_create("corrupt");
    tcase_set_timeout(tc, 120);
    tcase_add_loop_test(tc, test_corrupt_memory, 0, N_CASES);
    tcase_add_loop_test(tc, test_corrupt_file, 0, N_CASES);
    tcase_add_test(tc, test_corrupt_nesting);
    tcase_add_test(tc, test_open_errors);
    tcase_add_test(tc, test_all_truncations);
    tcase_add_test(tc, test_random_mutations);
    suite_add_tcase(s, tc);
    return s;
}
