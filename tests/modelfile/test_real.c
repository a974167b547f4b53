/* The real checkpoints: stories260K (llama2.c, MF_REAL_STORIES) or the default model (GGUF Q4_1).
 * The binary exits 77 (skipped) when its file is absent. The GGUF goldens come from an
 * independent implementation: the gguf Python package's dequantize (gguf 0.19.0), sums taken
 * with math.fsum over the float32 values. */
#include <math.h>
#include <sys/stat.h>

#include "kv_formats.h"
#include "kv_test.h"

static char g_path[4096];

#ifdef MF_REAL_STORIES
START_TEST(test_stories260k) {
    kv_model_file *mf = NULL;
    ck_assert_kv_ok(kv_model_file_open(&mf, g_path));
    ck_assert_int_eq(kv_model_file_format(mf), KV_MODEL_LLAMA2C);
    const kv_arch *a = kv_model_file_arch(mf);
    ck_assert_str_eq(a->arch, "llama");
    ck_assert_str_eq(a->name, "stories260K.bin");
    ck_assert_int_eq(a->d_model, 64);
    ck_assert_int_eq(a->n_layers, 5);
    ck_assert_int_eq(a->n_heads, 8);
    ck_assert_int_eq(a->n_kv_heads, 4);
    ck_assert_int_eq(a->head_dim, 8);
    ck_assert_int_eq(a->d_ff, 172);
    ck_assert_int_eq(a->vocab_size, 512);
    ck_assert_int_eq(a->max_seq_len, 512);
    ck_assert_int_eq(a->tied_embeddings, 1);
    ck_assert_int_eq(a->qkv_bias, 0);
    ck_assert_int_eq(a->rope_layout, KV_ROPE_ADJACENT);
    ck_assert_int_eq(a->rope_scaling, KV_ROPE_SCALING_NONE);
    ck_assert(a->rms_eps == 1e-5f && a->rope_theta == 10000.0f);
    ck_assert_int_eq(a->bos_id, 1);
    ck_assert_int_eq(a->eos_id, 2);
    ck_assert_uint_eq(kv_model_file_tensor_count(mf), 1 + 9 * 5 + 1);
    ck_assert_ptr_null(kv_model_file_find(mf, "output.weight"));
    /* run.c's order: the final norm follows the 5 layers' arrays; 64*512 + 5*(2*64 + 2*64*64 +
     * 2*64*32 + 3*64*172) floats after the 28-byte header. */
    ck_assert_uint_eq(kv_model_file_find(mf, "token_embd.weight")->offset, 28);
    ck_assert_uint_eq(kv_model_file_find(mf, "output_norm.weight")->offset, 28 + 4 * 259968);
    /* Every tensor reads back as the floats stored at its offset. */
    kv_file_map map;
    ck_assert_kv_ok(kv_file_map_open(&map, g_path));
    float *buf = malloc(64 * 512 * sizeof(float));
    ck_assert(buf != NULL);
    for (size_t i = 0; i < kv_model_file_tensor_count(mf); i++) {
        const kv_tensor_info *t = kv_model_file_tensor_at(mf, i);
        const size_t n = (size_t)(t->ne[0] * t->ne[1]);
        ck_assert(n <= 64 * 512 && t->nbytes == 4 * n && t->offset + t->nbytes <= map.size);
        ck_assert_kv_ok(kv_model_file_read_f32(mf, t, buf));
        for (size_t j = 0; j < n; j++)
            ck_assert(buf[j] == kv_load_f32le(map.data + t->offset + 4 * j));
    }
    free(buf);
    kv_file_map_close(&map);
    kv_model_file_close(mf);
}
END_TEST
#else
/* Neumaier-compensated sums of x and x^2 over a dequantized tensor. */
static void sums(const float *x, size_t n, double *sum, double *sq) {
    double s = 0, c = 0, s2 = 0, c2 = 0;
    for (size_t i = 0; i < n; i++) {
        const double v[2] = {x[i], (double)x[i] * x[i]};
        double *acc[2] = {&s, &s2}, *cmp[2] = {&c, &c2};
        for (int k = 0; k < 2; k++) {
            const double t = *acc[k] + v[k];
            *cmp[k] += fabs(*acc[k]) >= fabs(v[k]) ? (*acc[k] - t) + v[k] : (v[k] - t) + *acc[k];
            *acc[k] = t;
        }
    }
    *sum = s + c;
    *sq = s2 + c2;
}

static const struct {
    const char *name;
    int dtype;
    size_t n;
    double sum, sq;
    float first[6], last[2];
} k_golden[] = {
    {"blk.0.attn_k.weight", KV_DTYPE_Q4_1, 110592, 26.937057495117188, 17499.561343912734,
     {-0x1.3ep-3f, 0x1.5c6p-2f, -0x1.f14p-2f, -0x1.482p-2f, 0x1.44p-7f, 0x1.668p-3f}, {0x1.814p-3f, 0x1.746p-2f}},
    {"token_embd.weight", KV_DTYPE_Q8_0, 28311552, -15353.04449415207, 520415.71544764005,
     {-0x1.b468p-4f, 0x1.0e28p-5f, 0x1.8ad8p-5f, -0x1.761p-6f, -0x1.188cp-4f, -0x1.761p-5f}, {-0x1.eb16p-4f, -0x1.55ap-5f}},
    {"blk.29.ffn_down.weight", KV_DTYPE_Q4_1, 884736, 49.83570861816406, 29667.074891592143,
     {-0x1.17ep-2f, 0x1.7d8p-3f, 0x1.7d8p-3f, 0x1.8c8p-5f, 0x1.7d8p-3f, 0x1.7d8p-3f}, {-0x1.7p-4f, 0x1.dp-5f}},
    {"output_norm.weight", KV_DTYPE_F32, 576, 1038.33203125, 1921.7355499267578,
     {0x1.c2p+0f, 0x1.d2p+0f, 0x1.c8p+0f, 0x1.9ap+0f, 0x1.bep+0f, 0x1.b8p+0f}, {0x1.ecp+0f, 0x1.fcp+0f}},
};

START_TEST(test_default_model) {
    kv_model_file *mf = NULL;
    ck_assert_kv_ok(kv_model_file_open(&mf, g_path));
    ck_assert_int_eq(kv_model_file_format(mf), KV_MODEL_GGUF);
    ck_assert_uint_eq(kv_gguf_version(kv_model_file_gguf(mf)), 3);
    const kv_arch *a = kv_model_file_arch(mf);
    ck_assert_str_eq(a->arch, "llama");
    ck_assert_int_eq(a->n_layers, 30);
    ck_assert_int_eq(a->d_model, 576);
    ck_assert_int_eq(a->n_heads, 9);
    ck_assert_int_eq(a->n_kv_heads, 3);
    ck_assert_int_eq(a->head_dim, 64);
    ck_assert_int_eq(a->d_ff, 1536);
    ck_assert_int_eq(a->vocab_size, 49152);
    ck_assert_int_eq(a->max_seq_len, 8192);
    ck_assert(a->rms_eps == 1e-5f && a->rope_theta == 100000.0f);
    ck_assert_int_eq(a->rope_layout, KV_ROPE_ADJACENT);
    ck_assert_int_eq(a->rope_scaling, KV_ROPE_SCALING_NONE);
    ck_assert_int_eq(a->tied_embeddings, 1);
    ck_assert_int_eq(a->qkv_bias, 0);
    ck_assert_int_eq(a->bos_id, 1);
    ck_assert_int_eq(a->eos_id, 2);
    ck_assert_uint_eq(kv_model_file_tensor_count(mf), 272);
    for (size_t g = 0; g < sizeof k_golden / sizeof k_golden[0]; g++) {
        const kv_tensor_info *t = kv_model_file_find(mf, k_golden[g].name);
        ck_assert_ptr_nonnull(t);
        ck_assert_int_eq(t->dtype, k_golden[g].dtype);
        const size_t n = k_golden[g].n;
        ck_assert_uint_eq(t->ne[0] * t->ne[1] * t->ne[2] * t->ne[3], n);
        float *x = malloc(n * sizeof(float));
        ck_assert(x != NULL);
        ck_assert_kv_ok(kv_model_file_read_f32(mf, t, x));
        for (int i = 0; i < 6; i++)
            ck_assert_msg(x[i] == k_golden[g].first[i], "%s[%d] = %a", t->name, i, (double)x[i]);
        ck_assert(x[n - 2] == k_golden[g].last[0] && x[n - 1] == k_golden[g].last[1]);
        double sum, sq;
        sums(x, n, &sum, &sq);
        /* The values match exactly, so only the summation order differs: both sums are
         * (nearly) exactly rounded. */
        ck_assert_msg(fabs(sum - k_golden[g].sum) <= 1e-9 * fabs(k_golden[g].sum), "%s: sum %.17g", t->name, sum);
        ck_assert_msg(fabs(sq - k_golden[g].sq) <= 1e-12 * k_golden[g].sq, "%s: sum of squares %.17g", t->name, sq);
        free(x);
    }
    kv_model_file_close(mf);
}
END_TEST
#endif

int main(void) {
    struct stat st;
#ifdef MF_REAL_STORIES
    const char *dir = kv_test_data_dir();
    if (!dir) {
        fprintf(stderr, "skip: no data folder (KVCAL_DATA_DIR)\n");
        return 77;
    }
    snprintf(g_path, sizeof g_path, "%s/stories260K/stories260K.bin", dir);
#else
    const char *m = getenv("KVCAL_DEFAULT_MODEL");
    snprintf(g_path, sizeof g_path, "%s", m ? m : "");
#endif
    if (stat(g_path, &st) != 0) {
        fprintf(stderr, "skip: '%s' is absent\n", g_path);
        return 77;
    }
    Suite *s = suite_create("modelfile_real");
    TCase *tc = tcase_create("real");
    tcase_set_timeout(tc, 300);
#ifdef MF_REAL_STORIES
    tcase_add_test(tc, test_stories260k);
#else
    tcase_add_test(tc, test_default_model);
#endif
    suite_add_tcase(s, tc);
    return kv_test_run(s);
}
