/* st_writer.h — a minimal safetensors writer for the tests' random-weight HF checkpoints (F32 only): tensors filled
 * by kv_test_fill, written with their JSON header as the format says (8-byte little-endian header length, header
 * padded to 8 bytes, data in order); the golden-file reader and the clean-up both tests use. Shared by
 * test_model_hf.c and test_model_hft.c; include after check.h and kv_test.h. */
#ifndef KV_TEST_ST_WRITER_H
#define KV_TEST_ST_WRITER_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

typedef struct st_tensor {
    char name[96];
    int n_dims;
    int shape[2];
    float *data;
} st_tensor;

typedef struct st_list {
    st_tensor t[96];
    int n;
} st_list;

static inline void add(st_list *l, const char *name, int rows, int cols, kv_test_weight_kind kind) {
    ck_assert_int_lt(l->n, 96);
    st_tensor *t = &l->t[l->n++];
    snprintf(t->name, sizeof t->name, "%s", name);
    t->n_dims = cols ? 2 : 1;
    t->shape[0] = rows;
    t->shape[1] = cols;
    const size_t n = (size_t)rows * (cols ? cols : 1);
    t->data = malloc(n * sizeof(float));
    ck_assert_ptr_nonnull(t->data);
    kv_test_fill(t->data, n, name, kind, cols, KV_TEST_MODEL_SEED);
}

static inline size_t numel(const st_tensor *t) { return (size_t)t->shape[0] * (t->n_dims == 2 ? t->shape[1] : 1); }

static inline void write_safetensors(const char *path, const st_list *l) {
    char *hdr = malloc(1 << 16);
    ck_assert_ptr_nonnull(hdr);
    size_t len = 0, off = 0;
    len += (size_t)snprintf(hdr + len, (1 << 16) - len, "{\"__metadata__\":{\"format\":\"pt\"}");
    for (int i = 0; i < l->n; i++) {
        const st_tensor *t = &l->t[i];
        const size_t nb = numel(t) * sizeof(float);
        if (t->n_dims == 2)
            len += (size_t)snprintf(hdr + len, (1 << 16) - len,
                                    ",\"%s\":{\"dtype\":\"F32\",\"shape\":[%d,%d],\"data_offsets\":[%zu,%zu]}",
                                    t->name, t->shape[0], t->shape[1], off, off + nb);
        else
            len += (size_t)snprintf(hdr + len, (1 << 16) - len,
                                    ",\"%s\":{\"dtype\":\"F32\",\"shape\":[%d],\"data_offsets\":[%zu,%zu]}",
                                    t->name, t->shape[0], off, off + nb);
        off += nb;
    }
    len += (size_t)snprintf(hdr + len, (1 << 16) - len, "}");
    while (len % 8) hdr[len++] = ' ';
    FILE *fp = fopen(path, "wb");
    ck_assert_ptr_nonnull(fp);
    uint8_t n8[8];
    kv_store_u64le(n8, (uint64_t)len);
    ck_assert_int_eq(fwrite(n8, 1, 8, fp), 8);
    ck_assert_int_eq(fwrite(hdr, 1, len, fp), len);
    for (int i = 0; i < l->n; i++) {
        const st_tensor *t = &l->t[i];
        for (size_t j = 0; j < numel(t); j++) {
            uint8_t b[4];
            kv_store_f32le(b, t->data[j]);
            ck_assert_int_eq(fwrite(b, 1, 4, fp), 4);
        }
    }
    ck_assert_int_eq(fclose(fp), 0);
    free(hdr);
}

/* A golden file of n little-endian f32 values: tests/model/golden/<prefix><name>.f32 (KVCAL_TEST_SRC: the tests'
 * source directory when not run from the source tree). */
static inline float *read_golden_f32(const char *prefix, const char *name, size_t n) {
    const char *src = getenv("KVCAL_TEST_SRC");
    char path[1024];
    snprintf(path, sizeof path, "%s/model/golden/%s%s.f32", src ? src : "tests", prefix, name);
    char *buf = NULL;
    size_t size = 0;
    ck_assert_kv_ok(kv_file_read_all(&buf, &size, path));
    ck_assert_msg(size == n * sizeof(float), "%s: %zu bytes, expected %zu", path, size, n * sizeof(float));
    float *out = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) out[i] = kv_load_f32le((const uint8_t *)buf + 4 * i);
    free(buf);
    return out;
}

/* Remove a checkpoint directory the test wrote (config.json and model.safetensors). */
static inline void remove_checkpoint_dir(const char *dir) {
    char path[512];
    snprintf(path, sizeof path, "%s/config.json", dir);
    unlink(path);
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    unlink(path);
    rmdir(dir);
}

#endif
