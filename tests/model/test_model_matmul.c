/* The matrix products of every weight storage (model/forward_matmul.c):
 *   - decoded weights are bit-identical to kv_dequantize's (probed with one-hot inputs, where each
 *     output is exactly one weight) for Q4_0, Q4_1, Q8_0 (fused kernels), Q4_K / Q6_K / f16 (row path),
 *     in both the few-rows (decoding) and the tiled (prefill) paths;
 *   - random inputs agree with f32 sgemm on the dequantized matrix up to summation order;
 *   - the AVX-512, AVX2 and portable kernels give bit-identical results (those this CPU has);
 *   - results do not depend on the thread count. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "forward_internal.h"
#include "kv_test.h"

/* A model only to own threads and workspace (its weights are not used). */
static kv_status tiny_read(void *user, const char *name, int n_dims, const uint64_t ne[4], float *dst) {
    (void)user, (void)name;
    size_t n = 1;
    for (int i = 0; i < n_dims; i++) n *= (size_t)ne[i];
    for (size_t i = 0; i < n; i++) dst[i] = 0.5f;
    return strcmp(name, "rope_freqs.weight") == 0 ? KV_ENOTFOUND : KV_OK;
}

static kv_model *tiny_model(void) {
    kv_arch a;
    memset(&a, 0, sizeof a);
    a.n_layers = 1, a.d_model = 8, a.n_heads = 1, a.n_kv_heads = 1, a.head_dim = 8, a.d_ff = 8, a.vocab_size = 4;
    a.rms_eps = 1e-5f, a.rope_theta = 10000.0f, a.tied_embeddings = 1;
    kv_model *m = NULL;
    ck_assert_kv_ok(kv_model_create(&m, &a, tiny_read, NULL, NULL));
    return m;
}

typedef struct qmat {
    kv_matrix w;
    uint8_t *bytes;
    float *deq; /* rows x cols, kv_dequantize of every row */
} qmat;

/* A random matrix of dtype (f16 when dtype is KV_DTYPE_F16): random bytes, with every block's scale
 * fields replaced by finite f16 values (of either sign). */
static qmat make_qmat(int dtype, int rows, int cols, uint64_t seed) {
    qmat q;
    memset(&q, 0, sizeof q);
    size_t rb = 0;
    ck_assert_kv_ok(kv_dtype_row_bytes(&rb, dtype, (uint64_t)cols));
    q.bytes = malloc(rb * rows);
    q.deq = malloc(sizeof(float) * (size_t)rows * cols);
    kv_rng r;
    kv_rng_init(&r, seed);
    for (size_t i = 0; i < rb * rows; i++) q.bytes[i] = (uint8_t)kv_rng_next_u64(&r);
    const size_t bb = kv_dtype_block_bytes(dtype), nblocks = rb * rows / bb;
    for (size_t b = 0; b < nblocks; b++) {
        uint8_t *blk = q.bytes + b * bb;
        uint16_t h[2] = {kv_f32_to_f16((float)(kv_rng_next_normal(&r) * 0.05)),
                         kv_f32_to_f16((float)(kv_rng_next_normal(&r) * 0.05))};
        switch (dtype) {
        case KV_DTYPE_Q4_0:
        case KV_DTYPE_Q8_0: kv_store_u16le(blk, h[0]); break;
        case KV_DTYPE_Q4_1:
        case KV_DTYPE_Q4_K: kv_store_u16le(blk, h[0]), kv_store_u16le(blk + 2, h[1]); break;
        case KV_DTYPE_Q6_K: kv_store_u16le(blk + bb - 2, h[0]); break;
        case KV_DTYPE_F16: /* every element */
            for (size_t j = 0; j < bb; j += 2) kv_store_u16le(blk + j, kv_f32_to_f16((float)kv_rng_next_normal(&r)));
            break;
        }
    }
    for (int i = 0; i < rows; i++) ck_assert_kv_ok(kv_dequantize(q.deq + (size_t)i * cols, q.bytes + i * rb, dtype, (size_t)cols));
    q.w.rows = rows;
    q.w.cols = cols;
    if (dtype == KV_DTYPE_F16) {
        q.w.f16 = (const uint16_t *)q.bytes;
    } else {
        q.w.q = q.bytes;
        q.w.q_dtype = dtype;
        q.w.q_row_bytes = rb;
    }
    return q;
}

static void free_qmat(qmat *q) {
    free(q->bytes);
    free(q->deq);
}

static const int k_types[] = {KV_DTYPE_Q4_0, KV_DTYPE_Q4_1, KV_DTYPE_Q8_0, KV_DTYPE_Q4_K, KV_DTYPE_Q6_K, KV_DTYPE_F16};
#define N_TYPES 6

static int cols_for(int dtype) { return (dtype == KV_DTYPE_Q4_K || dtype == KV_DTYPE_Q6_K) ? 512 : 96; }

/* One-hot inputs: output (i, r) is exactly weight (r, col_i). n = 3 takes the decoding path, n = 11 the
 * tiled path (sgemm of exact products with zeros is exact too). */
START_TEST(test_one_hot_exact) {
    const int dtype = k_types[_i], rows = 37, cols = cols_for(dtype);
    kv_model *m = tiny_model();
    qmat q = make_qmat(dtype, rows, cols, 11 + (uint64_t)_i);
    for (int n = 3; n <= 11; n += 8) {
        float *x = calloc((size_t)n * cols, sizeof(float)), *y = malloc(sizeof(float) * (size_t)n * rows);
        int col[11];
        for (int i = 0; i < n; i++) {
            col[i] = (i * 37 + 5) % cols;
            x[(size_t)i * cols + col[i]] = 1.0f;
        }
        ck_assert_kv_ok(kv_model_matmul(m, x, (size_t)n, &q.w, NULL, y));
        for (int i = 0; i < n; i++)
            for (int r = 0; r < rows; r++) {
                const float want = q.deq[(size_t)r * cols + col[i]], got = y[(size_t)i * rows + r];
                /* == : the same value (a -0 weight comes out as +0 from a sum of products) */
                ck_assert_msg(want == got, "%s n=%d: row %d col %d: %.9g vs %.9g",
                              kv_dtype_name(dtype), n, r, col[i], got, want);
            }
        free(x);
        free(y);
    }
    free_qmat(&q);
    kv_model_free(m);
}
END_TEST

/* Random inputs against sgemm on the dequantized matrix (f32 summation order only: 1e-5 relative to
 * the largest |y|), n = 1 .. KV_ROWS_MAX + 2. */
START_TEST(test_random_vs_f32) {
    const int dtype = k_types[_i], rows = 53, cols = cols_for(dtype);
    kv_model *m = tiny_model();
    qmat q = make_qmat(dtype, rows, cols, 99 + (uint64_t)_i);
    kv_matrix wf = {rows, cols, q.deq, NULL, NULL, 0, 0};
    kv_rng r;
    kv_rng_init(&r, 5);
    for (int n = 1; n <= KV_ROWS_MAX + 2; n++) {
        float *x = malloc(sizeof(float) * (size_t)n * cols), *y = malloc(sizeof(float) * (size_t)n * rows);
        float *ref = malloc(sizeof(float) * (size_t)n * rows);
        for (int i = 0; i < n * cols; i++) x[i] = (float)kv_rng_next_normal(&r);
        ck_assert_kv_ok(kv_model_matmul(m, x, (size_t)n, &q.w, NULL, y));
        ck_assert_kv_ok(kv_model_matmul(m, x, (size_t)n, &wf, NULL, ref));
        double md = 0, mr = 0;
        for (int i = 0; i < n * rows; i++) {
            md = fmax(md, fabs(y[i] - ref[i]));
            mr = fmax(mr, fabs(ref[i]));
        }
        ck_assert_msg(md <= 1e-5 * mr, "%s n=%d: max |diff| %g of %g", kv_dtype_name(dtype), n, md, mr);
        free(x);
        free(y);
        free(ref);
    }
    free_qmat(&q);
    kv_model_free(m);
}
END_TEST

/* Every instruction set this CPU has gives the same bits; so do 1 and 2 threads. */
START_TEST(test_isa_and_threads_identical) {
    const int dtype = k_types[_i], rows = 130, cols = cols_for(dtype);
    kv_model *m = tiny_model();
    const int best = kv_model_isa(m);
    qmat q = make_qmat(dtype, rows, cols, 7 + (uint64_t)_i);
    for (int n = 1; n <= KV_ROWS_MAX; n++) { /* odd and even n: the AVX2 kernel takes inputs in pairs */
    float *x = malloc(sizeof(float) * (size_t)n * cols), *ref = malloc(sizeof(float) * (size_t)n * rows);
    float *y = malloc(sizeof(float) * (size_t)n * rows);
    kv_rng r;
    kv_rng_init(&r, 3);
    for (int i = 0; i < n * cols; i++) x[i] = (float)kv_rng_next_normal(&r);
    m->isa = 0; /* portable */
    kv_model_set_threads(m, 1);
    ck_assert_kv_ok(kv_model_matmul(m, x, (size_t)n, &q.w, NULL, ref));
    for (int isa = 0; isa <= best; isa++)
        for (int t = 1; t <= 2; t++) {
            m->isa = isa;
            kv_model_set_threads(m, t);
            ck_assert_kv_ok(kv_model_matmul(m, x, (size_t)n, &q.w, NULL, y));
            ck_assert_msg(memcmp(y, ref, sizeof(float) * (size_t)n * rows) == 0, "%s: isa %d, %d threads differ",
                          kv_dtype_name(dtype), isa, t);
        }
    free(x);
    free(y);
    free(ref);
    }
    free_qmat(&q);
    kv_model_free(m);
}
END_TEST

int main(void) {
    Suite *s = suite_create("model_matmul");
    TCase *tc = tcase_create("storages");
    tcase_set_timeout(tc, 60);
    tcase_add_loop_test(tc, test_one_hot_exact, 0, N_TYPES);
    tcase_add_loop_test(tc, test_random_vs_f32, 0, N_TYPES);
    tcase_add_loop_test(tc, test_isa_and_threads_identical, 0, N_TYPES);
    suite_add_tcase(s, tc);
    return kv_test_run(s);
}
