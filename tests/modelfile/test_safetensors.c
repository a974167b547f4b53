/* HF safetensors directories written by the test: single file and sharded, F32/F16/BF16, llama
 * (llama3 rope scaling), qwen2 (QKV biases), mistral (explicit head_dim); read back exactly. */
#include "mf_test.h"

static const mf_spec k_specs[] = {
    /* type      L  d   H  KV hd ff  V   tied bias dtype          norm dtype     shards l3 omit seed */
    {"llama",   2, 32, 4, 2, 8, 48, 40, 0,   0,   KV_DTYPE_F32,  KV_DTYPE_F32,  0,     1, 0,   11},
    {"qwen2",   3, 32, 4, 1, 8, 40, 37, 1,   1,   KV_DTYPE_BF16, KV_DTYPE_F32,  3,     0, 1,   12},
    {"mistral", 2, 32, 4, 2, 16, 64, 50, 0,  0,   KV_DTYPE_F16,  KV_DTYPE_F16,  0,     0, 0,   13},
    {"llama",   1, 16, 2, 2, 8, 24, 30, 1,   0,   KV_DTYPE_F16,  KV_DTYPE_BF16, 1,     0, 0,   14},
    {"llama",   2, 24, 3, 1, 8, 33, 29, 0,   0,   KV_DTYPE_BF16, KV_DTYPE_BF16, 2,     0, 0,   15},
};

START_TEST(test_safetensors_roundtrip) {
    const mf_spec *s = &k_specs[_i];
    char dir[256];
    mf_tmpdir(dir, sizeof dir);
    mf_model m;
    mf_model_generate(&m, s);
    mf_write_hf_dir(dir, s, &m);

    kv_model_file *mf = NULL;
    ck_assert_kv_ok(kv_model_file_open(&mf, dir));
    ck_assert_int_eq(kv_model_file_format(mf), KV_MODEL_SAFETENSORS);
    ck_assert_ptr_null(kv_model_file_gguf(mf));
    const kv_arch *a = kv_model_file_arch(mf);
    ck_assert_str_eq(a->arch, s->model_type);
    ck_assert_str_eq(a->name, strrchr(dir, '/') + 1);
    ck_assert_int_eq(a->n_layers, s->n_layers);
    ck_assert_int_eq(a->d_model, s->d_model);
    ck_assert_int_eq(a->n_heads, s->n_heads);
    ck_assert_int_eq(a->n_kv_heads, s->n_kv_heads);
    ck_assert_int_eq(a->head_dim, s->head_dim);
    ck_assert_int_eq(a->d_ff, s->d_ff);
    ck_assert_int_eq(a->vocab_size, s->vocab);
    ck_assert_int_eq(a->max_seq_len, 256);
    ck_assert(a->rms_eps == 1e-5f);
    ck_assert(a->rope_theta == 500000.0f);
    ck_assert_int_eq(a->rope_layout, KV_ROPE_HALF);
    ck_assert_int_eq(a->qkv_bias, s->qkv_bias);
    ck_assert_int_eq(a->tied_embeddings, s->tied);
    ck_assert_int_eq(a->bos_id, 1);
    ck_assert_int_eq(a->eos_id, 2); /* the first of the list */
    if (s->llama3_rope) {
        ck_assert_int_eq(a->rope_scaling, KV_ROPE_SCALING_LLAMA3);
        ck_assert(a->rope_factor == 8.0f && a->rope_low_freq_factor == 1.0f && a->rope_high_freq_factor == 4.0f);
        ck_assert_int_eq(a->rope_orig_max_pos, 64);
    } else {
        ck_assert_int_eq(a->rope_scaling, KV_ROPE_SCALING_NONE);
    }
    size_t used = 0;
    for (size_t i = 0; i < m.n; i++) used += m.t[i].canon[0] != 0;
    ck_assert_uint_eq(kv_model_file_tensor_count(mf), used);
    ck_assert_int_eq(kv_model_file_find(mf, "output.weight") == NULL, s->tied);
    mf_check_values(mf, &m);
    kv_model_file_close(mf);
    mf_model_free(&m);
    mf_rmtree(dir);
}
END_TEST

/* Config fields a checkpoint may leave out take transformers' defaults; a trailing slash on the
 * directory still names it. */
START_TEST(test_config_defaults) {
    char dir[256], path[300];
    mf_tmpdir(dir, sizeof dir);
    mf_spec s = k_specs[3];
    mf_model m;
    mf_model_generate(&m, &s);
    mf_write_hf_dir(dir, &s, &m);
    snprintf(path, sizeof path, "%s/config.json", dir);
    mf_write_str(path, "{\"model_type\": \"llama\", \"hidden_size\": 16, \"num_hidden_layers\": 1, "
                       "\"num_attention_heads\": 2, \"intermediate_size\": 24, \"tie_word_embeddings\": true, "
                       "\"head_dim\": null, \"rope_scaling\": null, \"__extra\": {\"nested\": [1, 2]}}");
    snprintf(path, sizeof path, "%s/", dir);
    kv_model_file *mf = NULL;
    ck_assert_kv_ok(kv_model_file_open(&mf, path));
    const kv_arch *a = kv_model_file_arch(mf);
    ck_assert_int_eq(a->n_kv_heads, 2);
    ck_assert_int_eq(a->head_dim, 8);
    ck_assert_int_eq(a->vocab_size, 30); /* from the embedding */
    ck_assert_int_eq(a->max_seq_len, 2048);
    ck_assert(a->rms_eps == 1e-6f && a->rope_theta == 10000.0f);
    ck_assert_int_eq(a->bos_id, -1);
    ck_assert_int_eq(a->eos_id, -1);
    ck_assert_str_eq(a->name, strrchr(dir, '/') + 1);
    mf_check_values(mf, &m);
    kv_model_file_close(mf);
    mf_model_free(&m);
    mf_rmtree(dir);
}
END_TEST

/* Tensors the forward does not use (rotary inv_freq buffers, integer buffers) are skipped. */
START_TEST(test_unused_tensors_skipped) {
    char dir[256], path[300];
    mf_tmpdir(dir, sizeof dir);
    mf_spec s = k_specs[0];
    s.llama3_rope = 0;
    mf_model m;
    mf_model_generate(&m, &s);
    mf_write_hf_dir(dir, &s, &m);
    /* Rewrite the file with two extra tensors in front. */
    mf_tensor extra[2];
    memset(extra, 0, sizeof extra);
    uint8_t ids[16] = {0};
    snprintf(extra[0].hf, sizeof extra[0].hf, "model.layers.0.self_attn.rotary_emb.inv_freq");
    extra[0].dtype = KV_DTYPE_F32, extra[0].rank = 1, extra[0].shape[0] = 4, extra[0].n = 4;
    extra[0].bytes = ids, extra[0].nbytes = 16;
    mf_tensor **list = malloc((m.n + 1) * sizeof *list);
    ck_assert(list != NULL);
    list[0] = &extra[0];
    for (size_t i = 0; i < m.n; i++) list[i + 1] = &m.t[i];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    mf_write_safetensors(path, list, m.n + 1);
    free(list);
    kv_model_file *mf = NULL;
    ck_assert_kv_ok(kv_model_file_open(&mf, dir));
    ck_assert_ptr_null(kv_model_file_find(mf, "model.layers.0.self_attn.rotary_emb.inv_freq"));
    ck_assert_uint_eq(kv_model_file_tensor_count(mf), m.n);
    mf_check_values(mf, &m);
    kv_model_file_close(mf);
    mf_model_free(&m);
    mf_rmtree(dir);
}
END_TEST

TCase *mf_tcase_safetensors(void) {
    TCase *tc = tcase_create("safetensors");
    tcase_add_loop_test(tc, test_safetensors_roundtrip, 0, (int)(sizeof k_specs / sizeof k_specs[0]));
    tcase_add_test(tc, test_config_defaults);
    tcase_add_test(tc, test_unused_tensors_skipped);
    return tc;
}
