/* gguf_test_util.h — helpers shared by the tests of tests/gguf/ (not a public header).
 *
 * A byte builder that writes GGUF images by hand (independently of the library's writer) and
 * records where each field lands, so the corrupt-file tests can patch exactly one field. */
#ifndef KV_GGUF_TEST_UTIL_H
#define KV_GGUF_TEST_UTIL_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kv_formats.h"
#include "kv_test.h"

typedef struct bb {
    uint8_t *p;
    size_t n, cap;
} bb;

static inline void bb_put(bb *b, const void *src, size_t n) {
    if (b->n + n > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->n + n) cap *= 2;
        b->p = realloc(b->p, cap);
        ck_assert_ptr_nonnull(b->p);
        b->cap = cap;
    }
    if (n) memcpy(b->p + b->n, src, n);
    b->n += n;
}
static inline size_t bb_u8(bb *b, uint8_t v) {
    size_t at = b->n;
    bb_put(b, &v, 1);
    return at;
}
static inline size_t bb_u32(bb *b, uint32_t v) {
    uint8_t t[4];
    kv_store_u32le(t, v);
    size_t at = b->n;
    bb_put(b, t, 4);
    return at;
}
static inline size_t bb_u64(bb *b, uint64_t v) {
    uint8_t t[8];
    kv_store_u64le(t, v);
    size_t at = b->n;
    bb_put(b, t, 8);
    return at;
}
/* Returns the offset of the length field. */
static inline size_t bb_str(bb *b, const char *s) {
    size_t at = bb_u64(b, strlen(s));
    bb_put(b, s, strlen(s));
    return at;
}
static inline void bb_pad(bb *b, size_t a) {
    while (b->n % a) bb_u8(b, 0);
}

/* Read a file of tests/gguf/golden/ (path from KVCAL_TEST_SRC, else relative to the source). */
static inline uint8_t *gguf_test_read_golden(const char *name, size_t *size) {
    const char *src = getenv("KVCAL_TEST_SRC");
    char path[1024];
    snprintf(path, sizeof path, "%s/gguf/golden/%s", src && *src ? src : KV_GGUF_TEST_SRC_DIR "/..", name);
    char *data = NULL;
    kv_status s = kv_file_read_all(&data, size, path);
    ck_assert_msg(s == KV_OK, "cannot read golden %s: %s", path, kv_error_last());
    return (uint8_t *)data;
}

/* The base image of the reader tests (gguf_images.c): 5 kvs (general.architecture = "llama",
 * general.alignment = 32, test.u32s = [1,2,3], test.strs = ["a","bc"], test.flag = true) and two
 * tensors (t0: F32 [4,2] holding 0..7; t1: Q8_0 [32], d = 0.5, q = -16..15), GGUF v3. */
typedef struct base_offsets {
    size_t version, n_tensors, n_kv;
    size_t kv_key[5], kv_type[5], kv_val[5];
    size_t u32s_elem_type, u32s_count, strs_count, strs_item0;
    size_t t_name[2], t_ndims[2], t_ne0[2], t_dtype[2], t_offset[2];
    size_t infos_end, data;
} base_offsets;
/* Build the base image by hand (caller frees bb.p). */
void gguf_base_image(bb *out, base_offsets *off);
/* The same content through the library's writer (must give identical bytes). */
kv_gguf_writer *gguf_base_writer(void);

Suite *gguf_dequant_suite(void);
Suite *gguf_rw_suite(void);
Suite *gguf_corrupt_suite(void);

#endif
