/* GGUF models written with the project's GGUF writer: a tiny llama (separate output), a tied one
 * and a qwen2 with QKV biases; F32, F16 and Q8_0 tensors read back exactly. */
#include "mf_test.h"

static const struct {
    const char *arch;
    int qkv_bias, tied;
} k_cases[] = {
    {"llama", 0, 0},
    {"llama", 0, 1},
    {"qwen2", 1, 0},
    {"mistral", 0, 1},
};

START_TEST(test_gguf_roundtrip) {
    char dir[256], path[300];
    mf_tmpdir(dir, sizeof dir);
    snprintf(path, sizeof path, "%s/tiny.gguf", dir);
    mf_gguf_opts o = {0};
    o.arch = k_cases[_i].arch;
    o.qkv_bias = k_cases[_i].qkv_bias;
    o.tied = k_cases[_i].tied;
    mf_model m;
    size_t size;
    uint8_t *img = mf_gguf_tiny(&size, &o, &m);
    mf_write(path, img, size);
    free(img);

    kv_model_file *mf = NULL;
    ck_assert_kv_ok(kv_model_file_open(&mf, path));
    ck_assert_int_eq(kv_model_file_format(mf), KV_MODEL_GGUF);
    ck_assert_ptr_nonnull(kv_model_file_gguf(mf));
    ck_assert_ptr_nonnull(kv_gguf_find(kv_model_file_gguf(mf), "general.name"));
    const kv_arch *a = kv_model_file_arch(mf);
    ck_assert_str_eq(a->arch, o.arch);
    ck_assert_str_eq(a->name, "tiny test model");
    ck_assert_int_eq(a->n_layers, 2);
    ck_assert_int_eq(a->d_model, 64);
    ck_assert_int_eq(a->n_heads, 4);
    ck_assert_int_eq(a->n_kv_heads, 2);
    ck_assert_int_eq(a->head_dim, 16);
    ck_assert_int_eq(a->d_ff, 96);
    ck_assert_int_eq(a->vocab_size, 40);
    ck_assert_int_eq(a->max_seq_len, 128);
    ck_assert(a->rms_eps == 1e-5f && a->rope_theta == 100000.0f);
    ck_assert_int_eq(a->rope_layout, strcmp(o.arch, "qwen2") == 0 ? KV_ROPE_HALF : KV_ROPE_ADJACENT);
    ck_assert_int_eq(a->rope_scaling, KV_ROPE_SCALING_NONE);
    ck_assert_int_eq(a->qkv_bias, o.qkv_bias);
    ck_assert_int_eq(a->tied_embeddings, o.tied);
    ck_assert_int_eq(a->bos_id, 1);
    ck_assert_int_eq(a->eos_id, 2);
    ck_assert_uint_eq(kv_model_file_tensor_count(mf), m.n);
    mf_check_values(mf, &m);
    kv_model_file_close(mf);
    mf_model_free(&m);
    mf_rmtree(dir);
}
END_TEST

/* Optional keys: head_count_kv defaults to head_count, freq_base to 10000, bos/eos to -1. */
START_TEST(test_gguf_optional_keys) {
    static const char *const k_omit[] = {"llama.attention.head_count_kv", "llama.rope.freq_base",
                                         "tokenizer.ggml.bos_token_id", "llama.rope.dimension_count"};
    char dir[256], path[300];
    mf_tmpdir(dir, sizeof dir);
    snprintf(path, sizeof path, "%s/tiny.gguf", dir);
    mf_gguf_opts o = {0};
    o.omit_key = k_omit[_i];
    size_t size;
    uint8_t *img = mf_gguf_tiny(&size, &o, NULL);
    mf_write(path, img, size);
    free(img);
    kv_model_file *mf = NULL;
    kv_status s = kv_model_file_open(&mf, path);
    const kv_arch *a = mf ? kv_model_file_arch(mf) : NULL;
    switch (_i) {
    case 0: /* 4 KV heads would need wider K/V weights than the file has */
        ck_assert_int_eq(s, KV_EFORMAT);
        ck_assert_ptr_nonnull(strstr(kv_error_last(), "blk.0.attn_k.weight has shape"));
        break;
    case 1:
        ck_assert_kv_ok(s);
        ck_assert(a->rope_theta == 10000.0f);
        break;
    case 2:
        ck_assert_kv_ok(s);
        ck_assert_int_eq(a->bos_id, -1);
        ck_assert_int_eq(a->eos_id, 2);
        break;
    default:
        ck_assert_kv_ok(s);
        ck_assert_int_eq(a->head_dim, 16);
    }
    kv_model_file_close(mf);
    mf_rmtree(dir);
}
END_TEST

TCase *mf_tcase_gguf(void) {
    TCase *tc = tcase_create("gguf");
    tcase_add_loop_test(tc, test_gguf_roundtrip, 0, (int)(sizeof k_cases / sizeof k_cases[0]));
    tcase_add_loop_test(tc, test_gguf_optional_keys, 0, 4);
    return tc;
}
