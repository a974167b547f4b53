/* test_gguf_model: the reader and the dequantizers on the real default model
 * (SmolLM2-135M-Instruct Q4_1 GGUF). Exits 77 (skipped) when KVCAL_DEFAULT_MODEL is absent.
 * Golden values come from the gguf Python package (gen_dequant_golden.py --model). */
#include "gguf_test_util.h"

#include <math.h>
#include <sys/stat.h>

static const char *model_path(void) {
    const char *p = getenv("KVCAL_DEFAULT_MODEL");
    return p && *p ? p : NULL;
}

static kv_gguf *open_model(void) {
    kv_gguf *g = NULL;
    ck_assert_kv_ok(kv_gguf_open(&g, model_path()));
    return g;
}

static uint64_t n_elems(const kv_tensor_info *t) { return t->ne[0] * t->ne[1] * t->ne[2] * t->ne[3]; }

START_TEST(test_model_structure) {
    kv_gguf *g = open_model();
    ck_assert_uint_eq(kv_gguf_version(g), 3);
    ck_assert_uint_eq(kv_gguf_kv_count(g), 33);
    ck_assert_uint_eq(kv_gguf_alignment(g), 32);
    ck_assert_uint_eq(kv_gguf_data_offset(g), 1785664);
    char *arch = NULL;
    ck_assert_kv_ok(kv_gguf_get_str(g, "general.architecture", &arch));
    ck_assert_str_eq(arch, "llama");
    free(arch);
    char *pre = NULL;
    ck_assert_kv_ok(kv_gguf_get_str(g, "tokenizer.ggml.pre", &pre));
    ck_assert_str_eq(pre, "smollm");
    free(pre);
    uint64_t u;
    ck_assert_kv_ok(kv_gguf_get_u64(g, "llama.block_count", &u));
    ck_assert_uint_eq(u, 30);
    ck_assert_kv_ok(kv_gguf_get_u64(g, "llama.embedding_length", &u));
    ck_assert_uint_eq(u, 576);
    ck_assert_kv_ok(kv_gguf_get_u64(g, "llama.attention.head_count_kv", &u));
    ck_assert_uint_eq(u, 3);
    double theta;
    ck_assert_kv_ok(kv_gguf_get_f64(g, "llama.rope.freq_base", &theta));
    ck_assert(theta == 100000.0);
    const kv_gguf_value *tok = kv_gguf_find(g, "tokenizer.ggml.tokens");
    ck_assert(tok && tok->type == KV_GGUF_ARRAY && tok->v.arr.elem_type == KV_GGUF_STRING);
    ck_assert_uint_eq(tok->v.arr.count, 49152);
    ck_assert(tok->v.arr.items[1000].v.str.len == 2 && memcmp(tok->v.arr.items[1000].v.str.ptr, "()", 2) == 0);
    const kv_gguf_value *merges = kv_gguf_find(g, "tokenizer.ggml.merges");
    ck_assert_uint_eq(merges->v.arr.count, 48900);
    const kv_gguf_value *tt = kv_gguf_find(g, "tokenizer.ggml.token_type");
    ck_assert(tt->v.arr.elem_type == KV_GGUF_INT32 && tt->v.arr.count == 49152);
    ck_assert_int_eq((int32_t)kv_load_u32le(tt->v.arr.raw), 3); /* token 0 is a control token */

    ck_assert_uint_eq(kv_gguf_tensor_count(g), 272);
    size_t n_f32 = 0, n_q4_1 = 0, n_q8_0 = 0, n_other = 0;
    uint64_t params = 0;
    for (size_t i = 0; i < kv_gguf_tensor_count(g); i++) {
        const kv_tensor_info *t = kv_gguf_tensor_at(g, i);
        switch (t->dtype) {
        case KV_DTYPE_F32: n_f32++; break;
        case KV_DTYPE_Q4_1: n_q4_1++; break;
        case KV_DTYPE_Q8_0: n_q8_0++; break;
        default: n_other++; break;
        }
        params += n_elems(t);
        ck_assert(kv_dtype_can_dequantize(t->dtype));
        ck_assert_ptr_eq(kv_gguf_find_tensor(g, t->name), t);
    }
    ck_assert_uint_eq(n_f32, 61);
    ck_assert_uint_eq(n_q4_1, 210);
    ck_assert_uint_eq(n_q8_0, 1);
    ck_assert_uint_eq(n_other, 0);
    ck_assert_uint_eq(params, 134515008u);
    const kv_tensor_info *emb = kv_gguf_find_tensor(g, "token_embd.weight");
    ck_assert(emb && emb->dtype == KV_DTYPE_Q8_0 && emb->n_dims == 2 && emb->ne[0] == 576 && emb->ne[1] == 49152);
    ck_assert_ptr_null(kv_gguf_find_tensor(g, "output.weight")); /* tied embeddings */
    kv_gguf_close(g);
}
END_TEST

/* First 256 and 256 strided values bit for bit; sums over the whole tensor in double. The sums
 * differ from numpy's only by summation order (numpy sums pairwise, this test sequentially; the
 * terms themselves are computed identically), so the tolerance is the rigorous bound on that
 * difference, n * eps_double * sum|terms| (~3e-9 relative for the 28M-value embedding). */
START_TEST(test_model_golden) {
    size_t gsize;
    uint8_t *gold = gguf_test_read_golden("model_smollm2.bin", &gsize);
    ck_assert_mem_eq(gold, "KVDM", 4);
    ck_assert_uint_eq(kv_load_u32le(gold + 4), 1);
    struct stat st;
    ck_assert_int_eq(stat(model_path(), &st), 0);
    ck_assert_msg((uint64_t)st.st_size == kv_load_u64le(gold + 8),
                  "the model file is not the one the golden was made from");
    const uint32_t nt = kv_load_u32le(gold + 16);
    size_t pos = 20;
    kv_gguf *g = open_model();
    for (uint32_t k = 0; k < nt; k++) {
        const uint32_t nl = kv_load_u32le(gold + pos);
        char name[128];
        ck_assert_uint_lt(nl, sizeof name);
        memcpy(name, gold + pos + 4, nl);
        name[nl] = '\0';
        pos += 4 + nl;
        const int dtype = (int)kv_load_u32le(gold + pos);
        const uint64_t n = kv_load_u64le(gold + pos + 4);
        double want[4];
        for (int j = 0; j < 4; j++) {
            union { uint64_t u; double d; } cv;
            cv.u = kv_load_u64le(gold + pos + 12 + 8 * j);
            want[j] = cv.d;
        }
        const uint8_t *first = gold + pos + 44, *strided = first + 1024;
        pos += 44 + 2048;
        ck_assert_uint_le(pos, gsize);

        const kv_tensor_info *t = kv_gguf_find_tensor(g, name);
        ck_assert_msg(t != NULL, "tensor %s missing", name);
        ck_assert_int_eq(t->dtype, dtype);
        ck_assert_uint_eq(n_elems(t), n);
        float *x = malloc((size_t)n * sizeof(float));
        ck_assert_ptr_nonnull(x);
        ck_assert_kv_ok(kv_dequantize(x, t->data, t->dtype, (size_t)n));
        for (int i = 0; i < 256 && (uint64_t)i < n; i++)
            ck_assert_msg(kv_load_u32le((const uint8_t *)&x[i]) == kv_load_u32le(first + 4 * i),
                          "%s[%d]: %g vs golden %g", name, i, (double)x[i], (double)kv_load_f32le(first + 4 * i));
        for (uint64_t s = 0; s < 256; s++) {
            uint64_t idx = s * n / 256 + 7;
            if (idx > n - 1) idx = n - 1;
            ck_assert_msg(kv_load_u32le((const uint8_t *)&x[idx]) == kv_load_u32le(strided + 4 * s),
                          "%s[%llu]: %g vs golden %g", name, (unsigned long long)idx, (double)x[idx],
                          (double)kv_load_f32le(strided + 4 * s));
        }
        double sum = 0, sumsq = 0, wsum = 0, sabs = 0;
        for (uint64_t i = 0; i < n; i++) {
            const double v = (double)x[i];
            sum += v;
            sumsq += v * v;
            wsum += v * ((double)((i % 1009) + 1) / 1009.0);
            sabs += fabs(v);
        }
        const double tol = (double)n * 1.2e-16;
        ck_assert_msg(fabs(sum - want[0]) <= tol * want[3], "%s sum %.17g vs %.17g", name, sum, want[0]);
        ck_assert_msg(fabs(sumsq - want[1]) <= tol * want[1], "%s sumsq %.17g vs %.17g", name, sumsq, want[1]);
        ck_assert_msg(fabs(wsum - want[2]) <= tol * want[3], "%s wsum %.17g vs %.17g", name, wsum, want[2]);
        ck_assert_msg(fabs(sabs - want[3]) <= tol * want[3], "%s sum|x| %.17g vs %.17g", name, sabs, want[3]);
        free(x);
    }
    ck_assert_uint_eq(pos, gsize);
    kv_gguf_close(g);
    free(gold);
}
END_TEST

/* Dequantize the whole model: every value finite. The time goes to stderr (informational;
 * speed is measured by benchmarks, not asserted by tests). */
START_TEST(test_model_dequant_all) {
    kv_gguf *g = open_model();
    uint64_t biggest = 0;
    for (size_t i = 0; i < kv_gguf_tensor_count(g); i++)
        if (n_elems(kv_gguf_tensor_at(g, i)) > biggest) biggest = n_elems(kv_gguf_tensor_at(g, i));
    float *x = malloc((size_t)biggest * sizeof(float));
    ck_assert_ptr_nonnull(x);
    double secs = 0;
    uint64_t total = 0;
    for (size_t i = 0; i < kv_gguf_tensor_count(g); i++) {
        const kv_tensor_info *t = kv_gguf_tensor_at(g, i);
        const double t0 = kv_now_seconds();
        ck_assert_kv_ok(kv_dequantize(x, t->data, t->dtype, (size_t)n_elems(t)));
        secs += kv_now_seconds() - t0;
        uint64_t bad = 0; /* counted, not asserted per value: a Check assertion costs a pipe write */
        for (uint64_t k = 0; k < n_elems(t); k++) bad += !isfinite(x[k]);
        ck_assert_msg(bad == 0, "%s: %llu values not finite", t->name, (unsigned long long)bad);
        total += n_elems(t);
    }
    fprintf(stderr, "test_gguf_model: dequantized %llu values in %.3f s (%.0f M values/s, one thread)\n",
            (unsigned long long)total, secs, (double)total / secs / 1e6);
    ck_assert_uint_eq(total, 134515008u);
    free(x);
    kv_gguf_close(g);
}
END_TEST

int main(void) {
    const char *p = model_path();
    struct stat st;
    if (!p || stat(p, &st) != 0) {
        fprintf(stderr, "test_gguf_model: default model not found (KVCAL_DEFAULT_MODEL='%s'); skipped\n", p ? p : "");
        return 77;
    }
    Suite *s = suite_create("gguf_model");
    TCase *tc = tcase_create("model");
    tcase_set_timeout(tc, 240);
    tcase_add_test(tc, test_model_structure);
    tcase_add_test(tc, test_model_golden);
    tcase_add_test(tc, test_model_dequant_all);
    suite_add_tcase(s, tc);
    return kv_test_run(s);
}
