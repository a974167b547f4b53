/* libFuzzer target over the GGUF reader (and, for what it accepts, the writer and dequantizers).
 * Besides "never crash, never leak, never read out of bounds" it checks the reader's promises:
 * every string and tensor it returns lies inside the input; every tensor of a dequantizable type
 * dequantizes; and whatever it accepts, copied through the writer, reads back to the same content
 * and re-serializes to identical bytes (the writer's output is canonical).
 * Built as `fuzz_gguf` with -DKV_FUZZ=ON under clang; its corpus (fuzz_corpus/) is replayed as an
 * ordinary test by fuzz_gguf_replay.c in every build (ASan included). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kv_formats.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define CHECK(cond)                    \
    do {                               \
        if (!(cond)) __builtin_trap(); \
    } while (0)

static void check_value(const kv_gguf_value *v, const uint8_t *lo, const uint8_t *hi) {
    if (v->type == KV_GGUF_STRING) {
        if (v->v.str.len) CHECK((const uint8_t *)v->v.str.ptr >= lo && v->v.str.len <= (uint64_t)(hi - (const uint8_t *)v->v.str.ptr));
    } else if (v->type == KV_GGUF_ARRAY) {
        CHECK(v->v.arr.raw >= lo && v->v.arr.raw <= hi);
        if (v->v.arr.items)
            for (uint64_t i = 0; i < v->v.arr.count; i++) {
                CHECK(v->v.arr.items[i].type == v->v.arr.elem_type);
                check_value(&v->v.arr.items[i], lo, hi);
            }
    }
}

/* Copy a reader's content into a new writer and serialize it. */
static kv_status copy_out(const kv_gguf *g, uint8_t **out, size_t *n) {
    kv_gguf_writer *w = NULL;
    kv_status s = kv_gguf_writer_create(&w);
    if (s) return s;
    for (size_t i = 0; i < kv_gguf_kv_count(g) && s == KV_OK; i++)
        s = kv_gguf_writer_set_value(w, kv_gguf_kv_at(g, i)->key, &kv_gguf_kv_at(g, i)->value);
    for (size_t i = 0; i < kv_gguf_tensor_count(g) && s == KV_OK; i++) {
        const kv_tensor_info *t = kv_gguf_tensor_at(g, i);
        s = kv_gguf_writer_add_tensor(w, t->name, t->dtype, t->n_dims, t->ne, t->data);
    }
    if (s == KV_OK) s = kv_gguf_writer_to_memory(w, out, n);
    kv_gguf_writer_free(w);
    return s;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    kv_gguf *g = NULL;
    if (kv_gguf_open_memory(&g, data, size) != KV_OK) {
        CHECK(g == NULL);
        return 0;
    }
    const uint8_t *hi = data + size;
    for (size_t i = 0; i < kv_gguf_kv_count(g); i++) {
        const kv_gguf_kv *kv = kv_gguf_kv_at(g, i);
        CHECK(kv->key && kv->key[0]);
        CHECK(kv_gguf_find(g, kv->key) == &kv->value);
        check_value(&kv->value, data, hi);
    }
    uint64_t total = 0;
    for (size_t i = 0; i < kv_gguf_tensor_count(g); i++) {
        const kv_tensor_info *t = kv_gguf_tensor_at(g, i);
        CHECK(kv_gguf_find_tensor(g, t->name) == t);
        CHECK(t->n_dims >= 1 && t->n_dims <= 4);
        CHECK((const uint8_t *)t->data >= data && t->nbytes <= (size_t)(hi - (const uint8_t *)t->data));
        CHECK(t->offset % kv_gguf_alignment(g) == 0);
        total += t->nbytes;
        const uint64_t ne = t->ne[0] * t->ne[1] * t->ne[2] * t->ne[3];
        if (kv_dtype_can_dequantize(t->dtype) && ne <= (1u << 16)) {
            float *out = malloc((size_t)ne * sizeof(float) + 1);
            CHECK(out);
            CHECK(kv_dequantize(out, t->data, t->dtype, (size_t)ne) == KV_OK);
            free(out);
        }
    }
    /* Round trip (bounded: overlapping tensors could make the copy much larger than the input). */
    if (total <= (1u << 20)) {
        uint8_t *a = NULL, *b = NULL;
        size_t na = 0, nb = 0;
        CHECK(copy_out(g, &a, &na) == KV_OK);
        kv_gguf *g2 = NULL;
        CHECK(kv_gguf_open_memory(&g2, a, na) == KV_OK);
        CHECK(kv_gguf_kv_count(g2) == kv_gguf_kv_count(g));
        CHECK(kv_gguf_tensor_count(g2) == kv_gguf_tensor_count(g));
        CHECK(kv_gguf_alignment(g2) == kv_gguf_alignment(g));
        for (size_t i = 0; i < kv_gguf_tensor_count(g); i++) {
            const kv_tensor_info *t = kv_gguf_tensor_at(g, i), *t2 = kv_gguf_tensor_at(g2, i);
            CHECK(strcmp(t->name, t2->name) == 0 && t->dtype == t2->dtype && t->nbytes == t2->nbytes);
            CHECK(memcmp(t->ne, t2->ne, sizeof t->ne) == 0);
            CHECK(t->nbytes == 0 || memcmp(t->data, t2->data, t->nbytes) == 0);
        }
        CHECK(copy_out(g2, &b, &nb) == KV_OK);
        CHECK(na == nb && memcmp(a, b, na) == 0);
        kv_gguf_close(g2);
        free(a);
        free(b);
    }
    kv_gguf_close(g);
    return 0;
}
