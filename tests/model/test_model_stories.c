/* stories260K (llama2.c checkpoint, adjacent-pair RoPE, GQA 8/4, tied output): greedy generation from
 * BOS through the KV cache reproduces the token ids of a numpy port of llama2.c's run.c
 * (tests/model/gen_stories_ref.py -> golden/stories260K_greedy.txt: "Once upon a time, there was a
 * little girl named Lily. She loved to play outside in the park. One day, she saw a big, red ball...").
 * Token ids must match exactly: greedy argmax is stable under f32 summation-order differences unless
 * two logits tie to ~1e-6, and the port's sequence (254 tokens) has no such near-tie. */
#include <stdlib.h>
#include <string.h>

#include "kv_model.h"
#include "kv_test.h"

static int read_golden(int32_t *ids, int cap) {
    const char *src = getenv("KVCAL_TEST_SRC");
    char path[1024];
    snprintf(path, sizeof path, "%s/model/golden/stories260K_greedy.txt", src ? src : "tests");
    FILE *fp = fopen(path, "r");
    ck_assert_msg(fp != NULL, "cannot open %s", path);
    char line[4096];
    int n = 0;
    while (fgets(line, sizeof line, fp))
        if (line[0] != '#' && n < cap) ids[n++] = (int32_t)strtol(line, NULL, 10);
    fclose(fp);
    return n;
}

static void model_path(char *out, size_t n) {
    const char *dir = kv_test_data_dir();
    snprintf(out, n, "%s/stories260K/stories260K.bin", dir ? dir : ".");
}

START_TEST(test_greedy_from_bos) {
    char path[1024];
    model_path(path, sizeof path);
    kv_model *m = NULL;
    ck_assert_kv_ok(kv_model_open(&m, path, NULL));
    const kv_arch *a = kv_model_arch(m);
    ck_assert_int_eq(a->rope_layout, KV_ROPE_ADJACENT);
    ck_assert_int_eq(a->bos_id, 1);
    int32_t golden[512], out[512];
    const int ng = read_golden(golden, 512);
    ck_assert_int_ge(ng, 100);
    kv_cache *c = NULL;
    ck_assert_kv_ok(kv_cache_plain_create(&c, a, 1, 256));
    const int32_t bos = 1;
    /* llama2.c stops when BOS comes back (a new story) or after 256 positions. */
    kv_gen_options g = {255, 0.0f, 1.0f, 0, &bos, 1, 0};
    int n = 0;
    kv_gen_stats st;
    ck_assert_kv_ok(kv_generate(out, &n, &st, m, c, &bos, 1, &g, NULL, NULL));
    ck_assert_int_eq(st.n_prompt, 1);
    ck_assert_int_eq(st.n_generated, n);
    ck_assert_int_eq(n, ng);
    for (int i = 0; i < ng; i++) ck_assert_msg(out[i] == golden[i], "token %d: %d, llama2.c port %d", i, out[i], golden[i]);
    kv_cache_free(c);
    kv_model_free(m);
}
END_TEST

/* The same continuation from a batched prefill of the whole golden sequence (no cache): the argmax at
 * every position is the next golden token. */
START_TEST(test_prefill_argmax) {
    char path[1024];
    model_path(path, sizeof path);
    kv_model *m = NULL;
    ck_assert_kv_ok(kv_model_open(&m, path, NULL));
    const int V = kv_model_arch(m)->vocab_size;
    int32_t seq[513];
    seq[0] = 1;
    const int ng = read_golden(seq + 1, 511);
    float *lg = malloc((size_t)ng * V * sizeof(float));
    kv_forward f;
    memset(&f, 0, sizeof f);
    f.tokens = seq;
    f.n_seqs = 1;
    f.n_tokens = ng;
    f.logits = lg;
    ck_assert_kv_ok(kv_model_forward(m, &f));
    for (int t = 0; t < ng; t++) {
        int32_t best;
        ck_assert_kv_ok(kv_sample_token(&best, lg + (size_t)t * V, V, 0.0f, 1.0f, NULL));
        ck_assert_msg(best == seq[t + 1], "position %d: argmax %d, golden %d", t, best, seq[t + 1]);
    }
    free(lg);
    kv_model_free(m);
}
END_TEST

int main(void) {
    char path[1024];
    model_path(path, sizeof path);
    FILE *fp = kv_test_data_dir() ? fopen(path, "rb") : NULL;
    if (!fp) {
        printf("stories260K not found (KVCAL_DATA_DIR): skipped\n");
        return 77;
    }
    fclose(fp);
    Suite *s = suite_create("model_stories");
    TCase *tc = tcase_create("stories260K");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_greedy_from_bos);
    tcase_add_test(tc, test_prefill_argmax);
    suite_add_tcase(s, tc);
    return kv_test_run(s);
}
