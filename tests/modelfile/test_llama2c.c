/* llama2.c checkpoints written by the test: every tensor starts where run.c's order puts it. */
#include "mf_test.h"

/* Canonical name of run.c's k-th per-layer array, its (in, out) shape and the floats per layer. */
typedef struct l2c_array {
    const char *suffix;
    uint64_t ne0, ne1;
} l2c_array;

static void check_image(int dim, int hidden, int layers, int heads, int kv_heads, int vocab, int seq) {
    char dir[256], path[300];
    mf_tmpdir(dir, sizeof dir);
    snprintf(path, sizeof path, "%s/model.bin", dir);
    size_t size;
    uint8_t *img = mf_llama2c_image(&size, dim, hidden, layers, heads, kv_heads, vocab, seq);
    mf_write(path, img, size);
    free(img);

    kv_model_file *mf = NULL;
    ck_assert_kv_ok(kv_model_file_open(&mf, path));
    ck_assert_int_eq(kv_model_file_format(mf), KV_MODEL_LLAMA2C);
    ck_assert_ptr_null(kv_model_file_gguf(mf));
    ck_assert_str_eq(kv_model_file_path(mf), path);
    const kv_arch *a = kv_model_file_arch(mf);
    const uint64_t V = (uint64_t)(vocab < 0 ? -vocab : vocab), d = (uint64_t)dim, head = d / (uint64_t)heads,
                   kvd = head * (uint64_t)kv_heads, ff = (uint64_t)hidden;
    ck_assert_str_eq(a->arch, "llama");
    ck_assert_str_eq(a->name, "model.bin");
    ck_assert_int_eq(a->d_model, dim);
    ck_assert_int_eq(a->d_ff, hidden);
    ck_assert_int_eq(a->n_layers, layers);
    ck_assert_int_eq(a->n_heads, heads);
    ck_assert_int_eq(a->n_kv_heads, kv_heads);
    ck_assert_int_eq(a->head_dim, (int)head);
    ck_assert_int_eq(a->vocab_size, (int)V);
    ck_assert_int_eq(a->max_seq_len, seq);
    ck_assert_int_eq(a->tied_embeddings, vocab > 0);
    ck_assert_int_eq(a->rope_layout, KV_ROPE_ADJACENT);
    ck_assert_int_eq(a->rope_scaling, KV_ROPE_SCALING_NONE);
    ck_assert(a->rms_eps == 1e-5f && a->rope_theta == 10000.0f);
    ck_assert_int_eq(a->qkv_bias, 0);
    ck_assert_int_eq((int)kv_model_file_tensor_count(mf), 1 + 9 * layers + 1 + (vocab < 0));

    /* Walk run.c's order and check that each tensor starts at the expected float index. */
    const l2c_array arrays[] = {
        {"attn_norm.weight", d, 1}, {"attn_q.weight", d, d},     {"attn_k.weight", d, kvd},
        {"attn_v.weight", d, kvd},  {"attn_output.weight", d, d}, {"ffn_norm.weight", d, 1},
        {"ffn_gate.weight", d, ff}, {"ffn_down.weight", ff, d},   {"ffn_up.weight", d, ff},
    };
    uint64_t idx = 0;
    float *buf = malloc((V * d + d * ff) * sizeof(float));
    ck_assert(buf != NULL);
#define CHECK_AT(name, ne0, ne1)                                                                      \
    do {                                                                                             \
        const kv_tensor_info *t = kv_model_file_find(mf, name);                                      \
        ck_assert_msg(t != NULL, "%s missing", name);                                                \
        ck_assert_msg(t->ne[0] == (ne0) && t->ne[1] == (ne1), "%s shape", name);                     \
        ck_assert_int_eq(t->dtype, KV_DTYPE_F32);                                                    \
        ck_assert_uint_eq(t->offset, 28 + 4 * idx);                                                  \
        ck_assert_kv_ok(kv_model_file_read_f32(mf, t, buf));                                         \
        for (uint64_t j = 0; j < (ne0) * (ne1); j++)                                                 \
            ck_assert_msg(buf[j] == (float)(idx + j), "%s[%llu] = %g, expected %llu", name,          \
                          (unsigned long long)j, (double)buf[j], (unsigned long long)(idx + j));     \
        idx += (ne0) * (ne1);                                                                        \
    } while (0)
    CHECK_AT("token_embd.weight", d, V);
    for (size_t k = 0; k < sizeof arrays / sizeof arrays[0]; k++) {
        for (int l = 0; l < layers; l++) {
            char name[64];
            snprintf(name, sizeof name, "blk.%d.%s", l, arrays[k].suffix);
            CHECK_AT(name, arrays[k].ne0, arrays[k].ne1);
        }
    }
    CHECK_AT("output_norm.weight", d, 1);
    idx += (uint64_t)seq * head; /* freq_cis_real, freq_cis_imag */
    if (vocab < 0)
        CHECK_AT("output.weight", d, V);
    else
        ck_assert_ptr_null(kv_model_file_find(mf, "output.weight"));
#undef CHECK_AT
    free(buf);
    kv_model_file_close(mf);
    mf_rmtree(dir);
}

START_TEST(test_llama2c_shared) { check_image(32, 80, 3, 4, 2, 50, 16); }
END_TEST

START_TEST(test_llama2c_separate_classifier) { check_image(24, 40, 2, 3, 3, -30, 8); }
END_TEST

START_TEST(test_llama2c_mha) { check_image(16, 48, 1, 2, 2, 20, 4); }
END_TEST

/* A tensor from another model is a caller error, not a crash. */
START_TEST(test_read_foreign_tensor) {
    char dir[256], p1[300], p2[300];
    mf_tmpdir(dir, sizeof dir);
    snprintf(p1, sizeof p1, "%s/a.bin", dir);
    snprintf(p2, sizeof p2, "%s/b.bin", dir);
    size_t size;
    uint8_t *img = mf_llama2c_image(&size, 16, 48, 1, 2, 2, 20, 4);
    mf_write(p1, img, size);
    mf_write(p2, img, size);
    free(img);
    kv_model_file *a = NULL, *b = NULL;
    ck_assert_kv_ok(kv_model_file_open(&a, p1));
    ck_assert_kv_ok(kv_model_file_open(&b, p2));
    float buf[16];
    ck_assert_int_eq(kv_model_file_read_f32(a, kv_model_file_find(b, "output_norm.weight"), buf), KV_EINVAL);
    ck_assert_ptr_nonnull(strstr(kv_error_last(), "does not belong"));
    ck_assert_int_eq(kv_model_file_read_f32(a, NULL, buf), KV_EINVAL);
    ck_assert_ptr_null(kv_model_file_tensor_at(a, kv_model_file_tensor_count(a)));
    ck_assert_ptr_null(kv_model_file_find(a, "no.such.tensor"));
    kv_model_file_close(a);
    kv_model_file_close(b);
    kv_model_file_close(NULL);
    mf_rmtree(dir);
}
END_TEST

TCase *mf_tcase_llama2c(void) {
    TCase *tc = tcase_create("llama2c");
    tcase_add_test(tc, test_llama2c_shared);
    tcase_add_test(tc, test_llama2c_separate_classifier);
    tcase_add_test(tc, test_llama2c_mha);
    tcase_add_test(tc, test_read_foreign_tensor);
    return tc;
}
