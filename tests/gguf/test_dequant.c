/* Dequantization tests: goldens from the gguf Python package (gen_dequant_golden.py), compared
 * bit for bit; the type table; the bulk f16 path against kv_f16_to_f32 for all 65536 inputs;
 * plain integer types; argument errors. */
#include "gguf_test_util.h"

#include <math.h>

static const struct {
    const char *file;
    int dtype;
} g_goldens[] = {
    {"dequant_F32.bin", KV_DTYPE_F32},   {"dequant_F16.bin", KV_DTYPE_F16},   {"dequant_BF16.bin", KV_DTYPE_BF16},
    {"dequant_Q4_0.bin", KV_DTYPE_Q4_0}, {"dequant_Q4_1.bin", KV_DTYPE_Q4_1}, {"dequant_Q5_0.bin", KV_DTYPE_Q5_0},
    {"dequant_Q5_1.bin", KV_DTYPE_Q5_1}, {"dequant_Q8_0.bin", KV_DTYPE_Q8_0}, {"dequant_Q2_K.bin", KV_DTYPE_Q2_K},
    {"dequant_Q3_K.bin", KV_DTYPE_Q3_K}, {"dequant_Q4_K.bin", KV_DTYPE_Q4_K}, {"dequant_Q5_K.bin", KV_DTYPE_Q5_K},
    {"dequant_Q6_K.bin", KV_DTYPE_Q6_K},
};
#define N_GOLDENS ((int)(sizeof g_goldens / sizeof g_goldens[0]))

/* Bit-exact: the reference computes the same f32 products in the same order as GGML (see
 * dequant.c), so no tolerance is needed; -0 and +0 must match too. */
START_TEST(test_dequant_golden) {
    size_t size;
    uint8_t *g = gguf_test_read_golden(g_goldens[_i].file, &size);
    ck_assert_uint_ge(size, 24);
    ck_assert_mem_eq(g, "KVDQ", 4);
    ck_assert_uint_eq(kv_load_u32le(g + 4), 1);
    const int dtype = (int)kv_load_u32le(g + 8);
    const size_t n_blocks = kv_load_u32le(g + 12), be = kv_load_u32le(g + 16), bb_ = kv_load_u32le(g + 20);
    ck_assert_int_eq(dtype, g_goldens[_i].dtype);
    ck_assert_uint_eq(be, kv_dtype_block_elems(dtype));
    ck_assert_uint_eq(bb_, kv_dtype_block_bytes(dtype));
    ck_assert_uint_eq(size, 24 + n_blocks * bb_ + n_blocks * be * 4);
    const uint8_t *raw = g + 24;
    const uint8_t *expect = raw + n_blocks * bb_;
    const size_t n = n_blocks * be;
    /* guard values around the output catch writes past the end */
    float *out = malloc((n + 2) * sizeof(float));
    ck_assert_ptr_nonnull(out);
    out[0] = out[n + 1] = 12345.0f;
    ck_assert_kv_ok(kv_dequantize(out + 1, raw, dtype, n));
    ck_assert(out[0] == 12345.0f && out[n + 1] == 12345.0f);
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) {
        const uint32_t got = kv_load_u32le((const uint8_t *)&out[1 + i]);
        const uint32_t want = kv_load_u32le(expect + 4 * i);
        if (got != want && bad++ < 5)
            fprintf(stderr, "%s element %zu (block %zu): got %08x (%g), want %08x\n", kv_dtype_name(dtype), i,
                    i / be, got, (double)out[1 + i], want);
    }
    ck_assert_msg(bad == 0, "%s: %zu of %zu values differ from the gguf-py reference", kv_dtype_name(dtype), bad, n);
    /* dequantizing block by block gives the same values (no state between blocks) */
    for (size_t b = 0; b < n_blocks; b += 5) {
        ck_assert_kv_ok(kv_dequantize(out + 1, raw + b * bb_, dtype, be));
        ck_assert_mem_eq(out + 1, expect + 4 * b * be, 4 * be);
    }
    free(out);
    free(g);
}
END_TEST

/* The bulk (vectorizable) f16 path agrees with kv_f16_to_f32 on every bit pattern, NaNs included. */
START_TEST(test_dequant_f16_exhaustive) {
    uint8_t *src = malloc(65536 * 2);
    float *out = malloc(65536 * sizeof(float));
    for (uint32_t h = 0; h < 65536; h++) kv_store_u16le(src + 2 * h, (uint16_t)h);
    ck_assert_kv_ok(kv_dequantize(out, src, KV_DTYPE_F16, 65536));
    for (uint32_t h = 0; h < 65536; h++) {
        const float want = kv_f16_to_f32((uint16_t)h);
        ck_assert_msg(memcmp(&out[h], &want, 4) == 0, "h=%04x got %g want %g", h, (double)out[h], (double)want);
    }
    free(src);
    free(out);
}
END_TEST

START_TEST(test_dequant_plain_types) {
    uint8_t buf[64];
    float out[8];
    /* I8 */
    const int8_t i8[4] = {-128, -1, 0, 127};
    memcpy(buf, i8, 4);
    ck_assert_kv_ok(kv_dequantize(out, buf, KV_DTYPE_I8, 4));
    ck_assert(out[0] == -128.0f && out[1] == -1.0f && out[2] == 0.0f && out[3] == 127.0f);
    /* I16, I32, I64 little-endian */
    kv_store_u16le(buf, (uint16_t)-300);
    kv_store_u16le(buf + 2, 32767);
    ck_assert_kv_ok(kv_dequantize(out, buf, KV_DTYPE_I16, 2));
    ck_assert(out[0] == -300.0f && out[1] == 32767.0f);
    kv_store_u32le(buf, (uint32_t)-70000);
    kv_store_u32le(buf + 4, 16777217u); /* rounds to even 16777216 in f32 */
    ck_assert_kv_ok(kv_dequantize(out, buf, KV_DTYPE_I32, 2));
    ck_assert(out[0] == -70000.0f && out[1] == 16777216.0f);
    kv_store_u64le(buf, (uint64_t)-5);
    kv_store_u64le(buf + 8, (uint64_t)1 << 40);
    ck_assert_kv_ok(kv_dequantize(out, buf, KV_DTYPE_I64, 2));
    ck_assert(out[0] == -5.0f && out[1] == 1099511627776.0f);
    /* F64 rounds to nearest f32 */
    const double d[2] = {0.1, -1e300};
    for (int i = 0; i < 2; i++) {
        union { double f; uint64_t u; } u = {d[i]};
        kv_store_u64le(buf + 8 * i, u.u);
    }
    ck_assert_kv_ok(kv_dequantize(out, buf, KV_DTYPE_F64, 2));
    ck_assert(out[0] == 0.1f && isinf(out[1]) && out[1] < 0);
    /* BF16 of 1.0 and -2.0 */
    kv_store_u16le(buf, 0x3f80);
    kv_store_u16le(buf + 2, 0xc000);
    ck_assert_kv_ok(kv_dequantize(out, buf, KV_DTYPE_BF16, 2));
    ck_assert(out[0] == 1.0f && out[1] == -2.0f);
}
END_TEST

/* A hand-computed Q4_1 and Q4_K block, independent of any reference implementation. */
START_TEST(test_dequant_hand_blocks) {
    uint8_t q41[20];
    kv_store_u16le(q41, kv_f32_to_f16(0.5f));   /* d */
    kv_store_u16le(q41 + 2, kv_f32_to_f16(-1.0f)); /* m */
    for (int j = 0; j < 16; j++) q41[4 + j] = (uint8_t)(j | ((15 - j) << 4));
    float out[256];
    ck_assert_kv_ok(kv_dequantize(out, q41, KV_DTYPE_Q4_1, 32));
    for (int j = 0; j < 16; j++) {
        ck_assert(out[j] == 0.5f * (float)j - 1.0f);
        ck_assert(out[16 + j] == 0.5f * (float)(15 - j) - 1.0f);
    }
    /* Q4_K: d = 1, dmin = 0.25, sub-block j has scale j+1 and min j (6-bit packing), q = l % 16 */
    uint8_t q4k[144] = {0};
    kv_store_u16le(q4k, kv_f32_to_f16(1.0f));
    kv_store_u16le(q4k + 2, kv_f32_to_f16(0.25f));
    uint8_t *sc = q4k + 4;
    for (int j = 0; j < 8; j++) {
        const int s = j + 1 + (j >= 4 ? 40 : 0), m = j + (j >= 4 ? 20 : 0); /* exercise high bits */
        if (j < 4) {
            sc[j] = (uint8_t)s;
            sc[j + 4] = (uint8_t)m;
        } else {
            sc[j + 4] = (uint8_t)((s & 0x0f) | ((m & 0x0f) << 4));
            sc[j - 4] |= (uint8_t)((s >> 4) << 6);
            sc[j] |= (uint8_t)((m >> 4) << 6);
        }
    }
    for (int c = 0; c < 4; c++)
        for (int l = 0; l < 32; l++) q4k[16 + 32 * c + l] = (uint8_t)((l % 16) | (((l + c) % 16) << 4));
    ck_assert_kv_ok(kv_dequantize(out, q4k, KV_DTYPE_Q4_K, 256));
    for (int j = 0; j < 8; j++) {
        const int s = j + 1 + (j >= 4 ? 40 : 0), m = j + (j >= 4 ? 20 : 0);
        for (int l = 0; l < 32; l++) {
            const int c = j / 2;
            const int q = (j % 2 == 0) ? l % 16 : (l + c) % 16;
            const float want = (1.0f * (float)s) * (float)q - 0.25f * (float)m;
            ck_assert_msg(out[32 * j + l] == want, "Q4_K sub-block %d element %d: %g != %g", j, l,
                          (double)out[32 * j + l], (double)want);
        }
    }
}
END_TEST

START_TEST(test_dtype_table) {
    ck_assert_str_eq(kv_dtype_name(KV_DTYPE_Q4_1), "Q4_1");
    ck_assert_str_eq(kv_dtype_name(KV_DTYPE_BF16), "BF16");
    ck_assert_ptr_null(kv_dtype_name(4)); /* withdrawn Q4_2 */
    ck_assert_ptr_null(kv_dtype_name(-1));
    ck_assert_ptr_null(kv_dtype_name(1000));
    ck_assert_uint_eq(kv_dtype_block_elems(KV_DTYPE_Q6_K), 256);
    ck_assert_uint_eq(kv_dtype_block_bytes(KV_DTYPE_Q6_K), 210);
    ck_assert_uint_eq(kv_dtype_block_bytes(KV_DTYPE_Q8_0), 34);
    ck_assert_uint_eq(kv_dtype_block_bytes(99), 0);
    size_t n;
    ck_assert_kv_ok(kv_dtype_row_bytes(&n, KV_DTYPE_Q4_1, 576));
    ck_assert_uint_eq(n, 18 * 20);
    ck_assert_kv_ok(kv_dtype_row_bytes(&n, KV_DTYPE_F16, 3));
    ck_assert_uint_eq(n, 6);
    ck_assert_kv_ok(kv_dtype_row_bytes(&n, KV_DTYPE_Q4_K, 0));
    ck_assert_uint_eq(n, 0);
    ck_assert_int_eq(kv_dtype_row_bytes(&n, KV_DTYPE_Q4_K, 255), KV_EFORMAT);
    ck_assert_ptr_nonnull(strstr(kv_error_last(), "not a whole number of blocks"));
    ck_assert_int_eq(kv_dtype_row_bytes(&n, 77, 32), KV_EUNSUPPORTED);
    ck_assert_int_eq(kv_dtype_row_bytes(&n, KV_DTYPE_F32, UINT64_MAX), KV_EFORMAT);
    ck_assert(kv_dtype_can_dequantize(KV_DTYPE_Q6_K));
    ck_assert(!kv_dtype_can_dequantize(16)); /* IQ2_XXS: readable, not dequantizable */
    ck_assert(!kv_dtype_can_dequantize(99));
}
END_TEST

START_TEST(test_dequant_errors) {
    float out[64];
    uint8_t src[64] = {0};
    ck_assert_int_eq(kv_dequantize(out, src, KV_DTYPE_Q4_0, 31), KV_EINVAL);
    ck_assert_ptr_nonnull(strstr(kv_error_last(), "not a whole number of blocks"));
    ck_assert_int_eq(kv_dequantize(out, src, 99, 32), KV_EUNSUPPORTED);
    ck_assert_ptr_nonnull(strstr(kv_error_last(), "unknown tensor type 99"));
    ck_assert_int_eq(kv_dequantize(out, src, 16, 256), KV_EUNSUPPORTED);
    ck_assert_ptr_nonnull(strstr(kv_error_last(), "IQ2_XXS"));
    ck_assert_kv_ok(kv_dequantize(out, src, KV_DTYPE_Q4_0, 0));
}
END_TEST

Suite *gguf_dequant_suite(void) {
    Suite *s = suite_create("dequant");
    TCase *tc = tcase_create("dequant");
    tcase_add_loop_test(tc, test_dequant_golden, 0, N_GOLDENS);
    tcase_add_test(tc, test_dequant_f16_exhaustive);
    tcase_add_test(tc, test_dequant_plain_types);
    tcase_add_test(tc, test_dequant_hand_blocks);
    tcase_add_test(tc, test_dtype_table);
    tcase_add_test(tc, test_dequant_errors);
    suite_add_tcase(s, tc);
    return s;
}
