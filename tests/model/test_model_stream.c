/* Layer-streamed weights (kv_model_load_streamed, kv_model_acquire / kv_model_release): a streamed
 * model run layer by layer gives the same bits as the whole model (every storage), holds one layer's
 * weights at a time (weight_bytes returns to its base after each release), refuses to run a part it
 * does not hold (a message naming it, never a NULL read), and leaves the whole-model path alone.
 * stories260K (f32 llama2.c checkpoint) always; SmolLM2-135M (GGUF Q4_1/Q8_0 blocks) when present. */
#define _POSIX_C_SOURCE 200809L
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kv_model.h"
#include "kv_test.h"

static int stories_path(char *out, size_t n) {
    const char *dir = kv_test_data_dir();
    snprintf(out, n, "%s/stories260K/stories260K.bin", dir ? dir : ".");
    return access(out, R_OK) == 0;
}

static int smollm_path(char *out, size_t n) {
    const char *p = getenv("KVCAL_DEFAULT_MODEL");
    snprintf(out, n, "%s", p ? p : "");
    return p && access(out, R_OK) == 0;
}

/* Hidden states after every layer for n_seqs x T tokens: the whole model's kv_model_forward vs the
 * streamed model's embed + layer_forward with one layer held at a time. */
static void compare_streamed(const char *path, kv_weight_storage storage, int T, int n_seqs) {
    kv_model_file *mf = NULL;
    ck_assert_kv_ok(kv_model_file_open(&mf, path));
    kv_model_options o;
    memset(&o, 0, sizeof o);
    o.n_threads = 2;
    o.weights = storage;
    kv_model *whole = NULL, *st = NULL;
    ck_assert_kv_ok(kv_model_load(&whole, mf, &o));
    ck_assert_kv_ok(kv_model_load_streamed(&st, mf, &o));
    ck_assert_int_eq(kv_model_streamed(st), 1);
    ck_assert_int_eq(kv_model_streamed(whole), 0);
    const kv_arch *a = kv_model_arch(st);
    const int L = a->n_layers, d = a->d_model;
    const size_t rows = (size_t)n_seqs * (size_t)T;
    int32_t *tok = malloc(rows * sizeof *tok), *pos = malloc(rows * sizeof *pos);
    float *ref = malloc(rows * (size_t)d * sizeof(float)), *h = malloc(rows * (size_t)d * sizeof(float));
    for (size_t r = 0; r < rows; r++) {
        tok[r] = (int32_t)(1 + kv_rng_u64(7, r) % (uint64_t)(a->vocab_size - 1));
        pos[r] = (int32_t)(r % (size_t)T);
    }
    kv_forward f;
    memset(&f, 0, sizeof f);
    f.tokens = tok, f.n_seqs = n_seqs, f.n_tokens = T, f.hidden = ref;
    ck_assert_kv_ok(kv_model_forward(whole, &f));
    /* nothing held yet: every entry point refuses with a message that names the part */
    ck_assert_uint_eq(kv_model_weight_bytes(st), 0);
    ck_assert_int_eq(kv_model_embed(st, tok, rows, h), KV_EINVAL);
    ck_assert_int_eq(kv_model_layer_forward(st, 0, h, n_seqs, T, pos, NULL, NULL, NULL), KV_EINVAL);
    ck_assert_ptr_nonnull(strstr(kv_error_last(), "layer 0"));
    ck_assert_int_eq(kv_model_forward(st, &f), KV_EINVAL);
    ck_assert_int_eq(kv_model_logits(st, ref, 1, h), KV_EINVAL);
    kv_grad *g = NULL;
    ck_assert_int_eq(kv_grad_create(&g, st, KV_GRAD_F32, 0), KV_EINVAL);
    /* embed, then one layer at a time */
    ck_assert_kv_ok(kv_model_acquire(st, KV_MODEL_PART_EMBED));
    ck_assert_kv_ok(kv_model_embed(st, tok, rows, h));
    kv_model_release(st, KV_MODEL_PART_EMBED);
    ck_assert_int_eq(kv_model_holds(st, KV_MODEL_PART_EMBED), 0);
    ck_assert_uint_eq(kv_model_weight_bytes(st), 0);
    size_t layer_bytes = 0;
    for (int l = 0; l < L; l++) {
        ck_assert_kv_ok(kv_model_acquire(st, l));
        ck_assert_kv_ok(kv_model_acquire(st, l)); /* twice is fine */
        ck_assert_int_eq(kv_model_holds(st, l), 1);
        if (l == 0) layer_bytes = kv_model_weight_bytes(st);
        ck_assert_uint_eq(kv_model_weight_bytes(st), layer_bytes); /* one layer, every layer the same size */
        ck_assert_kv_ok(kv_model_layer_forward(st, l, h, n_seqs, T, pos, NULL, NULL, NULL));
        kv_model_release(st, l);
        ck_assert_uint_eq(kv_model_weight_bytes(st), 0);
    }
    ck_assert_uint_lt(layer_bytes * (size_t)L, kv_model_weight_bytes(whole) + 1);
    /* same operations on the same weights: the same bits */
    ck_assert_int_eq(memcmp(h, ref, rows * (size_t)d * sizeof(float)), 0);
    /* the whole model ignores acquire/release */
    kv_model_release(whole, 0);
    ck_assert_int_eq(kv_model_holds(whole, 0), 1);
    ck_assert_int_eq(kv_model_holds(whole, KV_MODEL_PART_OUTPUT), 1);
    /* the output part (tied: with the embedding) gives the whole model's logits */
    float *l1 = malloc((size_t)a->vocab_size * sizeof(float)), *l2 = malloc((size_t)a->vocab_size * sizeof(float));
    ck_assert_kv_ok(kv_model_acquire(st, KV_MODEL_PART_OUTPUT));
    ck_assert_kv_ok(kv_model_logits(st, ref, 1, l1));
    ck_assert_kv_ok(kv_model_logits(whole, ref, 1, l2));
    ck_assert_int_eq(memcmp(l1, l2, (size_t)a->vocab_size * sizeof(float)), 0);
    kv_model_release(st, KV_MODEL_PART_EMBED); /* the output still reads a tied embedding */
    if (a->tied_embeddings) ck_assert_int_eq(kv_model_holds(st, KV_MODEL_PART_EMBED), 1);
    kv_model_release(st, KV_MODEL_PART_OUTPUT);
    ck_assert_int_eq(kv_model_holds(st, KV_MODEL_PART_EMBED), 0);
    ck_assert_uint_eq(kv_model_weight_bytes(st), 0);
    ck_assert_int_eq(kv_model_acquire(st, L), KV_EINVAL);
    ck_assert_int_eq(kv_model_acquire(st, -3), KV_EINVAL);
    free(l1);
    free(l2);
    free(tok);
    free(pos);
    free(ref);
    free(h);
    kv_model_free(whole);
    kv_model_free(st);
    kv_model_file_close(mf);
}

START_TEST(test_stories_streamed) {
    char path[1024];
    if (!stories_path(path, sizeof path)) return;
    const kv_weight_storage storages[] = {KV_WEIGHTS_F32, KV_WEIGHTS_F16, KV_WEIGHTS_NATIVE};
    compare_streamed(path, storages[_i], 64, 3);
}
END_TEST

START_TEST(test_smollm_streamed) {
    char path[1024];
    if (!smollm_path(path, sizeof path)) {
        fprintf(stderr, "note: no SmolLM2 model at $KVCAL_DEFAULT_MODEL, streamed SmolLM2 not tested\n");
        return;
    }
    const kv_weight_storage storages[] = {KV_WEIGHTS_F32, KV_WEIGHTS_NATIVE};
    compare_streamed(path, storages[_i], 24, 2);
}
END_TEST

int main(void) {
    Suite *s = suite_create("model_stream");
    TCase *tc = tcase_create("stream");
    tcase_set_timeout(tc, 600);
    tcase_add_loop_test(tc, test_stories_streamed, 0, 3);
    tcase_add_loop_test(tc, test_smollm_streamed, 0, 2);
    suite_add_tcase(s, tc);
    return kv_test_run(s);
}
