/* Model fingerprints on real models (PLAN_FORMAT.md §6.1): stories260K (llama2.c) against a hash
 * computed here independently from the checkpoint's bytes; the default model (SmolLM2 GGUF) when it
 * has been fetched. `test_plan_model stories` exits 77 without the data, `test_plan_model default`
 * without the model. */
#define _POSIX_C_SOURCE 200809L
#include <unistd.h>

#include "kv_formats.h"
#include "kv_test.h"

static char g_stories[1024];
static char g_default[1024];

static void fingerprint_of(kv_plan_fingerprint *fp, const char *path) {
    kv_model_file *mf = NULL;
    ck_assert_kv_ok(kv_model_file_open(&mf, path));
    ck_assert_kv_ok(kv_plan_fingerprint_compute(fp, mf));
    kv_model_file_close(mf);
}

static void hash_u32(kv_sha256 *h, uint32_t v) {
    uint8_t b[4];
    kv_store_u32le(b, v);
    kv_sha256_update(h, b, 4);
}
static void hash_u64(kv_sha256 *h, uint64_t v) {
    uint8_t b[8];
    kv_store_u64le(b, v);
    kv_sha256_update(h, b, 8);
}

/* §6.1.1 by hand from the llama2.c layout (run.c): header of 7 int32, token embedding [vocab][dim],
 * rms_att [L][dim], wq [L][dim][dim], wk [L][kv_dim][dim], wv [L][kv_dim][dim], ... all f32. */
START_TEST(test_stories_fingerprint) {
    kv_plan_fingerprint fp;
    fingerprint_of(&fp, g_stories);
    ck_assert_str_eq(fp.arch, "llama");
    ck_assert_int_eq(fp.n_layers, 5);
    ck_assert_int_eq(fp.d_model, 64);
    ck_assert_int_eq(fp.n_heads, 8);
    ck_assert_int_eq(fp.n_kv_heads, 4);
    ck_assert_int_eq(fp.head_dim, 8);
    ck_assert_int_eq(fp.vocab_size, 512);
    ck_assert(fp.rope_theta == 10000.0f);

    char *buf = NULL;
    size_t n = 0;
    ck_assert_kv_ok(kv_file_read_all(&buf, &n, g_stories));
    const uint8_t *b = (const uint8_t *)buf;
    const uint32_t dim = kv_load_u32le(b), L = kv_load_u32le(b + 8), nh = kv_load_u32le(b + 12);
    const uint32_t nkv = kv_load_u32le(b + 16), vocab = kv_load_u32le(b + 20) & 0x7fffffffu;
    const size_t kv_dim = (size_t)dim / nh * nkv;
    const size_t wq = 28 + 4 * ((size_t)vocab * dim + (size_t)L * dim);
    const size_t wk = wq + 4 * (size_t)L * dim * dim;
    const size_t wv = wk + 4 * (size_t)L * kv_dim * dim;
    const size_t per_layer = 4 * kv_dim * dim;
    ck_assert_uint_lt(wv + L * per_layer, n);
    kv_sha256 h;
    kv_sha256_init(&h);
    for (uint32_t l = 0; l < L; l++)
        for (int k = 0; k < 2; k++) {
            char name[64];
            snprintf(name, sizeof name, "blk.%u.attn_%c.weight", l, k ? 'v' : 'k');
            hash_u32(&h, (uint32_t)strlen(name));
            kv_sha256_update(&h, name, strlen(name));
            hash_u32(&h, 0);  /* F32 */
            hash_u32(&h, 2);  /* n_dims */
            hash_u64(&h, dim);
            hash_u64(&h, kv_dim);
            hash_u64(&h, 1);
            hash_u64(&h, 1);
            hash_u64(&h, per_layer);
            kv_sha256_update(&h, b + (k ? wv : wk) + l * per_layer, per_layer);
        }
    uint8_t want[32];
    kv_sha256_final(&h, want);
    ck_assert(memcmp(want, fp.kv_sha256, 32) == 0);
    free(buf);

    /* a plan made for it checks; a changed fingerprint does not */
    kv_plan *p = NULL;
    ck_assert_kv_ok(kv_plan_create(&p, &fp));
    ck_assert_kv_ok(kv_plan_check_fingerprint(p, &fp));
    fp.kv_sha256[0] ^= 1;
    ck_assert_int_eq(kv_plan_check_fingerprint(p, &fp), KV_EMISMATCH);
    kv_plan_free(p);
}
END_TEST

/* SmolLM2: 30 layers, the Q4_1 bytes of its K/V projections; a stories260K plan is refused. */
START_TEST(test_default_model_fingerprint) {
    kv_plan_fingerprint fp, fp2;
    fingerprint_of(&fp, g_default);
    ck_assert_str_eq(fp.arch, "llama");
    ck_assert_int_eq(fp.n_layers, 30);
    ck_assert_int_eq(fp.d_model, 576);
    ck_assert_int_eq(fp.n_heads, 9);
    ck_assert_int_eq(fp.n_kv_heads, 3);
    ck_assert_int_eq(fp.head_dim, 64);
    ck_assert_int_eq(fp.vocab_size, 49152);
    ck_assert(fp.rope_theta == 100000.0f);
    fingerprint_of(&fp2, g_default); /* deterministic */
    ck_assert(memcmp(&fp, &fp2, sizeof fp) == 0);
    if (g_stories[0]) {
        kv_plan_fingerprint st;
        fingerprint_of(&st, g_stories);
        kv_plan *p = NULL;
        ck_assert_kv_ok(kv_plan_create(&p, &st));
        ck_assert_int_eq(kv_plan_check_fingerprint(p, &fp), KV_EMISMATCH);
        ck_assert_ptr_nonnull(strstr(kv_error_last(), "n_layers 5 in the plan, 30 in the model"));
        kv_plan_free(p);
    }
}
END_TEST

int main(int argc, char **argv) {
    const char *data = kv_test_data_dir();
    if (data) snprintf(g_stories, sizeof g_stories, "%s/stories260K/stories260K.bin", data);
    if (g_stories[0] && access(g_stories, R_OK) != 0) g_stories[0] = '\0';
    const char *model = getenv("KVCAL_DEFAULT_MODEL");
    if (model && *model && access(model, R_OK) == 0) snprintf(g_default, sizeof g_default, "%s", model);
    const int want_default = argc > 1 && strcmp(argv[1], "default") == 0;
    if (want_default ? !g_default[0] : !g_stories[0]) {
        fprintf(stderr, "test_plan_model: %s not available, skipped\n", want_default ? "default model" : "stories260K");
        return 77;
    }
    Suite *s = suite_create("plan_model");
    TCase *tc = tcase_create("fingerprint");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, want_default ? test_default_model_fingerprint : test_stories_fingerprint);
    suite_add_tcase(s, tc);
    return kv_test_run(s);
}
