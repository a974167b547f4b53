/* kv_quant_from_plan (kernels/kv_stream.c): plan values the runtime does not implement (uniform bits
 * 5, a 65536-point HIGGS grid, a 2^20-value HIGGS group) are refused with KV_EINVAL and a message
 * naming the layer and the stream (PLAN_FORMAT.md §6.4); supported values pass. */
#include "kv_test.h"
#include "kvrt.h"

static kv_plan *make_plan(void) {
    kv_plan_fingerprint fp;
    memset(&fp, 0, sizeof fp);
    snprintf(fp.arch, sizeof fp.arch, "llama");
    fp.n_layers = 3, fp.d_model = 64, fp.n_heads = 4, fp.n_kv_heads = 2, fp.head_dim = 16, fp.vocab_size = 32;
    fp.rope_theta = 10000.0f;
    kv_plan *p = NULL;
    ck_assert_kv_ok(kv_plan_create(&p, &fp));
    p->global.sinks = 4, p->global.recent = 32, p->global.rht_seed = 1;
    return p;
}

static void set_uniform(kv_plan_stream *s, int bits) {
    s->method = KV_PLAN_UNIFORM, s->bits = bits, s->group_size = 32, s->group_axis = KV_PLAN_GROUP_CHANNELS;
    s->scale_dtype = KV_DTYPE_F16, s->higgs_grid = -1, s->share_codes_with_layer = -1;
}

static void set_higgs(kv_plan_stream *s, int grid, int group) {
    s->method = KV_PLAN_HIGGS, s->bits = 0, s->group_size = group, s->group_axis = KV_PLAN_GROUP_CHANNELS;
    s->scale_dtype = KV_DTYPE_F16, s->higgs_grid = grid, s->share_codes_with_layer = -1;
}

static void expect_refusal(const kv_plan *p, int layer, int stream, const char *name, const char *what) {
    kv_quant q;
    ck_assert_int_eq(kv_quant_from_plan(&q, p, layer, stream), KV_EINVAL);
    ck_assert_msg(strstr(kv_error_last(), name) != NULL && strstr(kv_error_last(), what) != NULL,
                  "message does not name '%s' and '%s': %s", name, what, kv_error_last());
}

START_TEST(test_refusals_name_the_stream) {
    kv_plan *p = make_plan();
    float *small = calloc(16 * 2, sizeof(float)), *huge = calloc(65536, sizeof(float));
    ck_assert_ptr_nonnull(small);
    ck_assert_ptr_nonnull(huge);
    for (int i = 0; i < 32; i++) small[i] = (float)i / 8.0f - 2.0f;
    for (int i = 0; i < 65536; i++) huge[i] = (float)i / 8192.0f - 4.0f;
    int g_small = -1, g_huge = -1;
    ck_assert_kv_ok(kv_plan_add_grid(p, 2, 16, small, &g_small));
    ck_assert_kv_ok(kv_plan_add_grid(p, 1, 65536, huge, &g_huge));
    set_uniform(&p->layers[0].stream[KV_PLAN_K], 4);
    set_higgs(&p->layers[0].stream[KV_PLAN_V], g_small, 16);
    kv_quant q;
    ck_assert_kv_ok(kv_quant_from_plan(&q, p, 0, KV_PLAN_K));
    ck_assert_kv_ok(kv_quant_from_plan(&q, p, 0, KV_PLAN_V));
    set_uniform(&p->layers[1].stream[KV_PLAN_V], 5); /* kivi bits 5 */
    expect_refusal(p, 1, KV_PLAN_V, "layer 1 V stream", "bits");
    set_higgs(&p->layers[2].stream[KV_PLAN_K], g_huge, 16); /* a 65536-point grid */
    expect_refusal(p, 2, KV_PLAN_K, "layer 2 K stream", "65536");
    set_higgs(&p->layers[2].stream[KV_PLAN_V], g_small, 1 << 20); /* a 2^20 HIGGS group */
    expect_refusal(p, 2, KV_PLAN_V, "layer 2 V stream", "group");
    set_higgs(&p->layers[1].stream[KV_PLAN_K], 7, 16); /* a grid index that does not exist */
    ck_assert_int_eq(kv_quant_from_plan(&q, p, 1, KV_PLAN_K), KV_EFORMAT);
    ck_assert_ptr_nonnull(strstr(kv_error_last(), "layer 1 K stream"));
    free(small);
    free(huge);
    kv_plan_free(p);
}
END_TEST

int main(void) {
    Suite *s = suite_create("kv_stream");
    TCase *tc = tcase_create("refusals");
    tcase_add_test(tc, test_refusals_name_the_stream);
    suite_add_tcase(s, tc);
    return kv_test_run(s);
}
