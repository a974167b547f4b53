/* Seeded random byte mutations of valid files in each format: every variant either opens (and
 * then every tensor reads) or fails with a status and a message; none may crash or read out of
 * bounds (this suite also runs under ASan+UBSan). The headers are where the mutations land. */
#include "mf_test.h"

enum { N_MUTANTS = 150 };

/* Overwrite 1..4 random bytes of buf[0..span). */
static void mutate(uint8_t *buf, size_t span, kv_rng *rng) {
    const int k = 1 + (int)(kv_rng_next_u64(rng) % 4);
    for (int i = 0; i < k; i++) {
        const size_t at = (size_t)(kv_rng_next_u64(rng) % span);
        const uint64_t r = kv_rng_next_u64(rng);
        /* Half the time a small change of a byte (counts and offsets stay plausible), else any byte. */
        buf[at] = (r & 1) ? (uint8_t)(buf[at] + (int)((r >> 8) % 5) - 2) : (uint8_t)(r >> 16);
    }
}

/* 1 when the file opened (and every tensor read). */
static int open_and_read(const char *path) {
    kv_model_file *mf = NULL;
    kv_status s = kv_model_file_open(&mf, path);
    if (s != KV_OK) {
        ck_assert_ptr_null(mf);
        ck_assert_msg(*kv_error_last() != '\0', "%s without a message", kv_status_name(s));
        return 0;
    }
    ck_assert_ptr_nonnull(mf);
    for (size_t i = 0; i < kv_model_file_tensor_count(mf); i++) {
        const kv_tensor_info *t = kv_model_file_tensor_at(mf, i);
        const size_t n = (size_t)(t->ne[0] * t->ne[1] * t->ne[2] * t->ne[3]);
        float *buf = malloc(n * sizeof(float) + 1);
        ck_assert(buf != NULL);
        ck_assert_kv_ok(kv_model_file_read_f32(mf, t, buf));
        free(buf);
    }
    kv_model_file_close(mf);
    return 1;
}

/* _i: 0 llama2.c, 1 GGUF, 2 safetensors header, 3 config.json, 4 index.json */
START_TEST(test_mutations) {
    char dir[256], path[512], target[512];
    mf_tmpdir(dir, sizeof dir);
    uint8_t *orig = NULL;
    size_t size = 0, span = 0;
    mf_spec s;
    memset(&s, 0, sizeof s);
    s.model_type = "qwen2";
    s.n_layers = 2, s.d_model = 16, s.n_heads = 2, s.n_kv_heads = 1, s.head_dim = 8, s.d_ff = 24, s.vocab = 20;
    s.qkv_bias = 1, s.dtype = KV_DTYPE_BF16, s.norm_dtype = KV_DTYPE_F32, s.seed = 5;
    s.n_shards = _i == 4 ? 2 : 0;
    if (_i == 0) {
        orig = mf_llama2c_image(&size, 16, 24, 2, 2, 1, -20, 8);
        span = 28;
        snprintf(path, sizeof path, "%s/model.bin", dir);
        snprintf(target, sizeof target, "%s", path);
    } else if (_i == 1) {
        mf_gguf_opts o = {0};
        o.qkv_bias = 1;
        orig = mf_gguf_tiny(&size, &o, NULL);
        span = size < 4096 ? size : 4096;
        snprintf(path, sizeof path, "%s/model.gguf", dir);
        snprintf(target, sizeof target, "%s", path);
    } else {
        mf_model m;
        mf_model_generate(&m, &s);
        mf_write_hf_dir(dir, &s, &m);
        mf_model_free(&m);
        snprintf(path, sizeof path, "%s", dir);
        snprintf(target, sizeof target, "%s/%s", dir,
                 _i == 2 ? "model.safetensors" : _i == 3 ? "config.json" : "model.safetensors.index.json");
        orig = mf_read(target, &size);
        span = _i == 2 ? 8 + (size_t)kv_load_u64le(orig) : size;
    }
    uint8_t *buf = malloc(size);
    ck_assert(buf != NULL);
    kv_rng rng;
    kv_rng_init(&rng, 1000 + (uint64_t)_i);
    int opened = 0;
    for (int k = 0; k < N_MUTANTS; k++) {
        memcpy(buf, orig, size);
        mutate(buf, span, &rng);
        mf_write(target, buf, size);
        kv_error_clear();
        opened += open_and_read(path);
    }
    /* The untouched file opens (the mutants are a mix of harmless and fatal changes). */
    mf_write(target, orig, size);
    ck_assert(open_and_read(path));
    ck_assert_msg(opened < N_MUTANTS, "no mutant was rejected");
    free(buf);
    free(orig);
    mf_rmtree(dir);
}
END_TEST

TCase *mf_tcase_mutate(void) {
    TCase *tc = tcase_create("mutate");
    tcase_set_timeout(tc, 120);
    tcase_add_loop_test(tc, test_mutations, 0, 5);
    return tc;
}
