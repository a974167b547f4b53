/* forward_matmul.c — y = x W^T for every weight storage (kv_weight_storage):
 *   few input rows (decoding): each thread takes a range of weight rows, decodes them to f32 (Q4_0,
 *     Q4_1 and Q8_0 fused in registers; other block types through kv_dequantize of the row; f32 rows
 *     as they are) and takes the dot products with every input row, reading the weights once;
 *   many input rows (prefill): each thread takes a slice of the weight rows and multiplies it with a
 *     single-threaded CBLAS sgemm, after decoding it tile by tile for non-f32 storages.
 * The decoded weights are bit-identical to kv_dequantize's (the fused kernels apply the same
 * operations: (float)q * d + m, ((float)q - 8) * d, (float)q * d; tests/model/test_model_matmul.c
 * checks them value by value), so the storages differ only in summation order.
 *
 * The kernels have AVX-512, AVX2 and portable versions that sum in the same order (bit-identical
 * results on every CPU). Each output element is summed by one thread: results do not depend on the
 * thread count. */
#include "forward_internal.h"

#include <stdlib.h>
#include <string.h>

#include <cblas.h>

#define QK 32               /* elements per Q4_0 / Q4_1 / Q8_0 block */
#define TILE_FLOATS (1u << 20) /* decoded tile per thread in the prefill path: 4 MiB */

/* ---- row kernels ------------------------------------------------------------------------------
 * Every kernel sums a dot product in 32 lanes (lane l takes elements l, l+32, l+64, ... in order;
 * two independent accumulator chains per 16 lanes keep the adds from waiting on each other) and adds
 * the lanes in lane order at the end, so the AVX-512, AVX2 and portable versions give bit-identical
 * results; which one runs depends on the CPU (checked at run time). */
enum { KV_ISA_PORTABLE = 0, KV_ISA_AVX2 = 1, KV_ISA_AVX512 = 2 };

#if (defined(__GNUC__) || defined(__clang__)) && defined(__x86_64__)
#include <immintrin.h>
#define KV_HAVE_X86 1
static int cpu_isa(void) {
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("f16c")) return KV_ISA_PORTABLE;
    if (__builtin_cpu_supports("avx512f")) return KV_ISA_AVX512;
    if (__builtin_cpu_supports("avx2")) return KV_ISA_AVX2;
    return KV_ISA_PORTABLE;
}
#else
#define KV_HAVE_X86 0
static int cpu_isa(void) { return KV_ISA_PORTABLE; }
#endif

static inline float lanes_sum(const float *l32) {
    float s = 0.0f;
    for (int k = 0; k < 32; k++) s += l32[k];
    return s;
}

/* The 32 weights of one block, in f32, exactly as kv_dequantize computes them. */
static inline void block_weights(float *w, const uint8_t *blk, int dtype) {
    const float d = kv_f16_to_f32(kv_load_u16le(blk));
    if (dtype == KV_DTYPE_Q4_1) {
        const float m = kv_f16_to_f32(kv_load_u16le(blk + 2));
        for (int j = 0; j < QK / 2; j++) {
            w[j] = (float)(blk[4 + j] & 0x0f) * d + m;
            w[j + QK / 2] = (float)(blk[4 + j] >> 4) * d + m;
        }
    } else if (dtype == KV_DTYPE_Q4_0) {
        for (int j = 0; j < QK / 2; j++) {
            w[j] = (float)((int)(blk[2 + j] & 0x0f) - 8) * d;
            w[j + QK / 2] = (float)((int)(blk[2 + j] >> 4) - 8) * d;
        }
    } else { /* Q8_0 */
        for (int j = 0; j < QK; j++) w[j] = (float)(int8_t)blk[2 + j] * d;
    }
}

static size_t block_bytes(int dtype) { return dtype == KV_DTYPE_Q4_1 ? 20 : dtype == KV_DTYPE_Q4_0 ? 18 : 34; }

/* y[i*ldy + r] = W_r . x_i for rows r0..r1 and inputs i < n. */
static void rows_portable(const uint8_t *W, size_t row_bytes, int dtype, int cols, int r0, int r1, const float *x,
                          size_t ldx, int n, float *y, size_t ldy) {
    const size_t bb = block_bytes(dtype);
    for (int r = r0; r < r1; r++) {
        float acc[KV_ROWS_MAX][32];
        memset(acc, 0, sizeof acc);
        const uint8_t *blk = W + (size_t)r * row_bytes;
        for (int j0 = 0; j0 < cols; j0 += QK, blk += bb) {
            float w[QK];
            block_weights(w, blk, dtype);
            for (int i = 0; i < n; i++) {
                const float *xi = x + (size_t)i * ldx + j0;
                for (int l = 0; l < 32; l++) acc[i][l] += w[l] * xi[l];
            }
        }
        for (int i = 0; i < n; i++) y[(size_t)i * ldy + r] = lanes_sum(acc[i]);
    }
}

static void dot_portable(const float *w, int cols, const float *x, size_t ldx, int n, float *y, size_t ldy) {
    for (int i = 0; i < n; i++) {
        const float *xi = x + (size_t)i * ldx;
        float acc[32] = {0};
        int j = 0;
        for (; j + 32 <= cols; j += 32)
            for (int l = 0; l < 32; l++) acc[l] += w[j + l] * xi[j + l];
        float tail = 0.0f;
        for (; j < cols; j++) tail += w[j] * xi[j];
        y[(size_t)i * ldy] = lanes_sum(acc) + tail;
    }
}

#if KV_HAVE_X86
/* AVX-512: the 16 lanes are one register. */
#define AVX512_BLOCK(w0, w1, blk, dtype)                                                                  \
    do {                                                                                                 \
        const __m512 d_ = _mm512_set1_ps(_cvtsh_ss(kv_load_u16le(blk)));                                 \
        if ((dtype) == KV_DTYPE_Q8_0) {                                                                  \
            w0 = _mm512_mul_ps(                                                                          \
                _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)((blk) + 2)))), d_);  \
            w1 = _mm512_mul_ps(                                                                          \
                _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)((blk) + 18)))), d_); \
        } else {                                                                                         \
            const int q4_1_ = (dtype) == KV_DTYPE_Q4_1;                                                  \
            const __m128i q_ = _mm_loadu_si128((const __m128i *)((blk) + (q4_1_ ? 4 : 2)));            \
            w0 = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_and_si128(q_, low4)));                      \
            w1 = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_and_si128(_mm_srli_epi16(q_, 4), low4)));   \
            if (q4_1_) {                                                                                 \
                const __m512 m_ = _mm512_set1_ps(_cvtsh_ss(kv_load_u16le((blk) + 2)));                   \
                w0 = _mm512_add_ps(_mm512_mul_ps(w0, d_), m_);                                           \
                w1 = _mm512_add_ps(_mm512_mul_ps(w1, d_), m_);                                           \
            } else {                                                                                     \
                w0 = _mm512_mul_ps(_mm512_sub_ps(w0, eight), d_);                                        \
                w1 = _mm512_mul_ps(_mm512_sub_ps(w1, eight), d_);                                        \
            }                                                                                            \
        }                                                                                                \
    } while (0)

__attribute__((target("avx512f,f16c"))) static void rows_avx512(const uint8_t *W, size_t row_bytes, int dtype,
                                                                int cols, int r0, int r1, const float *x,
                                                                size_t ldx, int n, float *y, size_t ldy) {
    const size_t bb = block_bytes(dtype);
    const __m128i low4 = _mm_set1_epi8(0x0f);
    const __m512 eight = _mm512_set1_ps(8.0f);
    float l32[32];
    for (int r = r0; r < r1; r++) {
        const uint8_t *blk = W + (size_t)r * row_bytes;
        if (n == 1) { /* decoding: the accumulators stay in registers */
            __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps(), w0, w1;
            for (int j0 = 0; j0 < cols; j0 += QK, blk += bb) {
                AVX512_BLOCK(w0, w1, blk, dtype);
                a0 = _mm512_add_ps(a0, _mm512_mul_ps(w0, _mm512_loadu_ps(x + j0)));
                a1 = _mm512_add_ps(a1, _mm512_mul_ps(w1, _mm512_loadu_ps(x + j0 + 16)));
            }
            _mm512_storeu_ps(l32, a0);
            _mm512_storeu_ps(l32 + 16, a1);
            y[r] = lanes_sum(l32);
            continue;
        }
        __m512 acc[KV_ROWS_MAX][2], w0, w1;
        for (int i = 0; i < n; i++) acc[i][0] = acc[i][1] = _mm512_setzero_ps();
        for (int j0 = 0; j0 < cols; j0 += QK, blk += bb) {
            AVX512_BLOCK(w0, w1, blk, dtype);
            for (int i = 0; i < n; i++) {
                const float *xi = x + (size_t)i * ldx + j0;
                acc[i][0] = _mm512_add_ps(acc[i][0], _mm512_mul_ps(w0, _mm512_loadu_ps(xi)));
                acc[i][1] = _mm512_add_ps(acc[i][1], _mm512_mul_ps(w1, _mm512_loadu_ps(xi + 16)));
            }
        }
        for (int i = 0; i < n; i++) {
            _mm512_storeu_ps(l32, acc[i][0]);
            _mm512_storeu_ps(l32 + 16, acc[i][1]);
            y[(size_t)i * ldy + r] = lanes_sum(l32);
        }
    }
}

__attribute__((target("avx512f,f16c"))) static void dot_avx512(const float *w, int cols, const float *x, size_t ldx,
                                                          int n, float *y, size_t ldy) {
    for (int i = 0; i < n; i++) {
        const float *xi = x + (size_t)i * ldx;
        __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps();
        int j = 0;
        for (; j + 32 <= cols; j += 32) {
            a0 = _mm512_add_ps(a0, _mm512_mul_ps(_mm512_loadu_ps(w + j), _mm512_loadu_ps(xi + j)));
            a1 = _mm512_add_ps(a1, _mm512_mul_ps(_mm512_loadu_ps(w + j + 16), _mm512_loadu_ps(xi + j + 16)));
        }
        float tail = 0.0f;
        for (; j < cols; j++) tail += w[j] * xi[j];
        float l32[32];
        _mm512_storeu_ps(l32, a0);
        _mm512_storeu_ps(l32 + 16, a1);
        y[(size_t)i * ldy] = lanes_sum(l32) + tail;
    }
}

/* AVX2: lanes 0-7, 8-15, 16-23, 24-31 in four registers. Weight rows are taken 8 at a time and the
 * inputs 2 at a time: a block's weights are decoded once per pair of inputs into w0..w3 and the
 * accumulators of both inputs stay in registers (an array of them, or a variable number of inputs,
 * leaves them in memory, where every block waits on a store); the lane sums of the 8 rows run side
 * by side in the lanes of one register (each row's own sum is a chain of 32 dependent adds). Same
 * operations in the same order as the portable loop and lanes_sum, so the same bits. */
__attribute__((target("avx2,f16c"), always_inline)) static inline void rows_avx2_t(const uint8_t *W, size_t row_bytes,
                                                                                 const int dtype, int cols, int r0,
                                                                                 int r1, const float *x, size_t ldx,
                                                                                 const int ni, float *y, size_t ldy) {
    const size_t bb = block_bytes(dtype);
    const __m128i low4 = _mm_set1_epi8(0x0f);
    const __m256 eight = _mm256_set1_ps(8.0f);
    const __m256i col = _mm256_setr_epi32(0, 32, 64, 96, 128, 160, 192, 224);
    const float *x1 = x + (ni > 1 ? ldx : 0);
    float l32[2][8][32];
    for (int rb = r0; rb < r1; rb += 8) {
        const int nr = r1 - rb < 8 ? r1 - rb : 8;
        for (int k = 0; k < nr; k++) {
            const uint8_t *blk = W + (size_t)(rb + k) * row_bytes;
            __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, b0 = a0, b1 = a0, b2 = a0, b3 = a0;
            for (int j0 = 0; j0 < cols; j0 += QK, blk += bb) {
                __m256 w0, w1, w2, w3; /* the block's 32 weights as kv_dequantize gives them */
                /* the weights are read once per step: ask for them 4 KiB ahead (measured: 58 -> 64
                 * tokens/s decoding SmolLM2 Q4_1 at 1K on 2 threads; 1-2 KiB gain less, 8 KiB no more) */
                _mm_prefetch((const char *)(blk + 4096), _MM_HINT_T0);
                const __m256 d = _mm256_set1_ps(_cvtsh_ss(kv_load_u16le(blk)));
                if (dtype == KV_DTYPE_Q8_0) {
                    const __m128i q0 = _mm_loadu_si128((const __m128i *)(blk + 2));
                    const __m128i q1 = _mm_loadu_si128((const __m128i *)(blk + 18));
                    w0 = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q0)), d);
                    w1 = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(q0, 8))), d);
                    w2 = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q1)), d);
                    w3 = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(q1, 8))), d);
                } else {
                    const __m128i q = _mm_loadu_si128((const __m128i *)(blk + (dtype == KV_DTYPE_Q4_1 ? 4 : 2)));
                    const __m128i lo = _mm_and_si128(q, low4), hi = _mm_and_si128(_mm_srli_epi16(q, 4), low4);
                    w0 = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(lo));
                    w1 = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(lo, 8)));
                    w2 = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(hi));
                    w3 = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(hi, 8)));
                    if (dtype == KV_DTYPE_Q4_1) {
                        const __m256 m = _mm256_set1_ps(_cvtsh_ss(kv_load_u16le(blk + 2)));
                        w0 = _mm256_add_ps(_mm256_mul_ps(w0, d), m), w1 = _mm256_add_ps(_mm256_mul_ps(w1, d), m);
                        w2 = _mm256_add_ps(_mm256_mul_ps(w2, d), m), w3 = _mm256_add_ps(_mm256_mul_ps(w3, d), m);
                    } else {
                        w0 = _mm256_mul_ps(_mm256_sub_ps(w0, eight), d), w1 = _mm256_mul_ps(_mm256_sub_ps(w1, eight), d);
                        w2 = _mm256_mul_ps(_mm256_sub_ps(w2, eight), d), w3 = _mm256_mul_ps(_mm256_sub_ps(w3, eight), d);
                    }
                }
                a0 = _mm256_add_ps(a0, _mm256_mul_ps(w0, _mm256_loadu_ps(x + j0)));
                a1 = _mm256_add_ps(a1, _mm256_mul_ps(w1, _mm256_loadu_ps(x + j0 + 8)));
                a2 = _mm256_add_ps(a2, _mm256_mul_ps(w2, _mm256_loadu_ps(x + j0 + 16)));
                a3 = _mm256_add_ps(a3, _mm256_mul_ps(w3, _mm256_loadu_ps(x + j0 + 24)));
                if (ni > 1) {
                    b0 = _mm256_add_ps(b0, _mm256_mul_ps(w0, _mm256_loadu_ps(x1 + j0)));
                    b1 = _mm256_add_ps(b1, _mm256_mul_ps(w1, _mm256_loadu_ps(x1 + j0 + 8)));
                    b2 = _mm256_add_ps(b2, _mm256_mul_ps(w2, _mm256_loadu_ps(x1 + j0 + 16)));
                    b3 = _mm256_add_ps(b3, _mm256_mul_ps(w3, _mm256_loadu_ps(x1 + j0 + 24)));
                }
            }
            _mm256_storeu_ps(l32[0][k], a0), _mm256_storeu_ps(l32[0][k] + 8, a1);
            _mm256_storeu_ps(l32[0][k] + 16, a2), _mm256_storeu_ps(l32[0][k] + 24, a3);
            if (ni > 1) {
                _mm256_storeu_ps(l32[1][k], b0), _mm256_storeu_ps(l32[1][k] + 8, b1);
                _mm256_storeu_ps(l32[1][k] + 16, b2), _mm256_storeu_ps(l32[1][k] + 24, b3);
            }
        }
        for (int i = 0; i < ni; i++) {
            for (int k = nr; k < 8; k++) memset(l32[i][k], 0, sizeof l32[i][k]);
            __m256 sum = _mm256_setzero_ps(); /* lane k: row rb + k, its lanes 0..31 added in order */
            for (int l = 0; l < 32; l++) sum = _mm256_add_ps(sum, _mm256_i32gather_ps(&l32[i][0][l], col, 4));
            float out[8];
            _mm256_storeu_ps(out, sum);
            for (int k = 0; k < nr; k++) y[(size_t)i * ldy + (size_t)(rb + k)] = out[k];
        }
    }
}

__attribute__((target("avx2,f16c"))) static void rows_avx2(const uint8_t *W, size_t row_bytes, int dtype, int cols,
                                                           int r0, int r1, const float *x, size_t ldx, int n,
                                                           float *y, size_t ldy) {
    for (int i = 0; i < n; i += 2) {
        const float *xi = x + (size_t)i * ldx;
        float *yi = y + (size_t)i * ldy;
        const int two = n - i >= 2;
        if (dtype == KV_DTYPE_Q4_1 && two)
            rows_avx2_t(W, row_bytes, KV_DTYPE_Q4_1, cols, r0, r1, xi, ldx, 2, yi, ldy);
        else if (dtype == KV_DTYPE_Q4_1)
            rows_avx2_t(W, row_bytes, KV_DTYPE_Q4_1, cols, r0, r1, xi, ldx, 1, yi, ldy);
        else if (dtype == KV_DTYPE_Q4_0 && two)
            rows_avx2_t(W, row_bytes, KV_DTYPE_Q4_0, cols, r0, r1, xi, ldx, 2, yi, ldy);
        else if (dtype == KV_DTYPE_Q4_0)
            rows_avx2_t(W, row_bytes, KV_DTYPE_Q4_0, cols, r0, r1, xi, ldx, 1, yi, ldy);
        else if (two)
            rows_avx2_t(W, row_bytes, KV_DTYPE_Q8_0, cols, r0, r1, xi, ldx, 2, yi, ldy);
        else
            rows_avx2_t(W, row_bytes, KV_DTYPE_Q8_0, cols, r0, r1, xi, ldx, 1, yi, ldy);
    }
}

__attribute__((target("avx2,f16c"))) static void dot_avx2(const float *w, int cols, const float *x, size_t ldx, int n,
                                                     float *y, size_t ldy) {
    for (int i = 0; i < n; i++) {
        const float *xi = x + (size_t)i * ldx;
        __m256 a[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
        int j = 0;
        for (; j + 32 <= cols; j += 32)
            for (int k = 0; k < 4; k++)
                a[k] = _mm256_add_ps(a[k], _mm256_mul_ps(_mm256_loadu_ps(w + j + 8 * k), _mm256_loadu_ps(xi + j + 8 * k)));
        float tail = 0.0f;
        for (; j < cols; j++) tail += w[j] * xi[j];
        float l32[32];
        for (int k = 0; k < 4; k++) _mm256_storeu_ps(l32 + 8 * k, a[k]);
        y[(size_t)i * ldy] = lanes_sum(l32) + tail;
    }
}
#endif

static void rows_q(int isa, const uint8_t *W, size_t row_bytes, int dtype, int cols, int r0, int r1,
                   const float *x, size_t ldx, int n, float *y, size_t ldy) {
#if KV_HAVE_X86
    if (isa == KV_ISA_AVX512) {
        rows_avx512(W, row_bytes, dtype, cols, r0, r1, x, ldx, n, y, ldy);
        return;
    }
    if (isa == KV_ISA_AVX2) {
        rows_avx2(W, row_bytes, dtype, cols, r0, r1, x, ldx, n, y, ldy);
        return;
    }
#endif
    rows_portable(W, row_bytes, dtype, cols, r0, r1, x, ldx, n, y, ldy);
}

static void dot_rows(int isa, const float *w, int cols, const float *x, size_t ldx, int n, float *y, size_t ldy) {
#if KV_HAVE_X86
    if (isa == KV_ISA_AVX512) {
        dot_avx512(w, cols, x, ldx, n, y, ldy);
        return;
    }
    if (isa == KV_ISA_AVX2) {
        dot_avx2(w, cols, x, ldx, n, y, ldy);
        return;
    }
#endif
    dot_portable(w, cols, x, ldx, n, y, ldy);
}

int kv_model_isa(kv_model *m) {
    if (m->isa < 0) m->isa = cpu_isa();
    return m->isa;
}

/* Row r of a non-f32 matrix, decoded to f32 (the values kv_dequantize gives). */
static kv_status decode_row(const kv_matrix *w, int r, float *dst) {
    if (w->f16) {
        const uint16_t *src = w->f16 + (size_t)r * w->cols;
        for (int j = 0; j < w->cols; j++) dst[j] = kv_f16_to_f32(src[j]);
        return KV_OK;
    }
    return kv_dequantize(dst, w->q + (size_t)r * w->q_row_bytes, w->q_dtype, (size_t)w->cols);
}

static int fused_type(const kv_matrix *w) {
    return w->q && (w->cols % QK) == 0 &&
           (w->q_dtype == KV_DTYPE_Q4_0 || w->q_dtype == KV_DTYPE_Q4_1 || w->q_dtype == KV_DTYPE_Q8_0);
}

/* Few input rows: every item decodes a chunk of weight rows and dots them with all n inputs, on the
 * model's thread pool (kv_model_pool: decoding runs many short parallel steps, which OpenMP's
 * spinning barriers slow down badly on a busy machine). Several matrices with the same input (Q, K
 * and V; gate and up) share one job. Each output is computed by one thread in a fixed order. */
enum { ROWS_CHUNK = 16 };
typedef struct rows_job {
    kv_model *m;
    const float *x;
    int n, count, cols, isa, any_decode;
    const kv_matrix *const *ws;
    float *const *ys;
    int failed;
} rows_job;

static void rows_item(void *ctx, int c, int thread) {
    rows_job *jb = ctx;
    const int cols = jb->cols;
    float *buf = jb->any_decode ? jb->m->ws.rowbuf + (size_t)thread * cols : NULL;
    int k = 0, r0 = c * ROWS_CHUNK;
    while (r0 >= (jb->ws[k]->rows + ROWS_CHUNK - 1) / ROWS_CHUNK * ROWS_CHUNK)
        r0 -= (jb->ws[k++]->rows + ROWS_CHUNK - 1) / ROWS_CHUNK * ROWS_CHUNK;
    const kv_matrix *w = jb->ws[k];
    float *y = jb->ys[k];
    const int rows = w->rows, r1 = r0 + ROWS_CHUNK < rows ? r0 + ROWS_CHUNK : rows;
    if (fused_type(w)) {
        rows_q(jb->isa, w->q, w->q_row_bytes, w->q_dtype, cols, r0, r1, jb->x, (size_t)cols, jb->n, y, (size_t)rows);
        return;
    }
    for (int r = r0; r < r1; r++) {
        const float *wr = w->f32 ? w->f32 + (size_t)r * cols : buf;
        if (!w->f32 && decode_row(w, r, buf) != KV_OK) {
            __atomic_store_n(&jb->failed, 1, __ATOMIC_RELAXED); /* read after the job */
            continue;
        }
        dot_rows(jb->isa, wr, cols, jb->x, (size_t)cols, jb->n, y + r, (size_t)rows);
    }
}

static kv_status matmul_rows(kv_model *m, const float *x, int n, const kv_matrix *const *ws, float *const *ys,
                             int count) {
    const int cols = ws[0]->cols;
    int n_chunks = 0, any_decode = 0;
    size_t work = 0;
    for (int k = 0; k < count; k++) {
        n_chunks += (ws[k]->rows + ROWS_CHUNK - 1) / ROWS_CHUNK;
        work += (size_t)ws[k]->rows * cols;
        any_decode |= !ws[k]->f32 && !fused_type(ws[k]);
    }
    const int nt = kv_model_par(m, work);
    if (any_decode) {
        kv_status s = kv_model_ws_floats(&m->ws.rowbuf, &m->ws.rowbuf_cap, (size_t)m->n_threads * cols,
                                         "decoding weight rows");
        if (s != KV_OK) return s;
    }
    rows_job jb = {m, x, n, count, cols, kv_model_isa(m), any_decode, ws, ys, 0};
    kv_pool_run(nt > 1 ? kv_model_pool(m) : NULL, n_chunks, rows_item, &jb);
    if (jb.failed) return KV_ERR(KV_EUNSUPPORTED, "cannot decode a weight matrix of type %d", ws[0]->q_dtype);
    return KV_OK;
}

/* Many input rows: every item takes a slice of the weight rows (output columns) and multiplies it
 * with a single-threaded sgemm (f32), or decodes it tile by tile into its thread's buffer first; the
 * items run on the model's pool. */
typedef struct slices_job {
    const float *x;
    size_t n;
    const kv_matrix *w;
    float *y;
    float *deq;
    int per, tile;
    int failed;
} slices_job;

static void slice_item(void *ctx, int item, int thread) {
    slices_job *jb = ctx;
    const kv_matrix *w = jb->w;
    const int rows = w->rows, cols = w->cols;
    const int s0 = item * jb->per < rows ? item * jb->per : rows, s1 = s0 + jb->per < rows ? s0 + jb->per : rows;
    if (s1 <= s0) return;
    if (w->f32) {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)jb->n, s1 - s0, cols, 1.0f, jb->x, cols,
                    w->f32 + (size_t)s0 * cols, cols, 0.0f, jb->y + s0, rows);
        return;
    }
    float *buf = jb->deq + (size_t)thread * jb->tile * cols;
    for (int r0 = s0; r0 < s1; r0 += jb->tile) {
        const int nr = r0 + jb->tile < s1 ? jb->tile : s1 - r0;
        for (int r = 0; r < nr; r++)
            if (decode_row(w, r0 + r, buf + (size_t)r * cols) != KV_OK) __atomic_store_n(&jb->failed, 1, __ATOMIC_RELAXED);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)jb->n, nr, cols, 1.0f, jb->x, cols, buf, cols, 0.0f,
                    jb->y + r0, rows);
    }
}

static kv_status matmul_slices(kv_model *m, const float *x, size_t n, const kv_matrix *w, float *y) {
    const int rows = w->rows, cols = w->cols;
    int nt = kv_model_par(m, n * (size_t)rows * cols / 4);
    if (nt > (rows + 15) / 16) nt = (rows + 15) / 16;
    if (nt < 1) nt = 1;
    int tile = (int)(TILE_FLOATS / (size_t)cols);
    if (tile < 1) tile = 1;
    if (!w->f32) {
        kv_status s = kv_model_ws_floats(&m->ws.deq, &m->ws.deq_cap, (size_t)m->n_threads * tile * cols,
                                         "decoding weight tiles");
        if (s != KV_OK) return s;
    }
    kv_model_blas_threads(m, 1);
    /* slices of whole 16-row blocks, two per thread (a thread that starts late takes fewer) */
    const int items = nt > 1 ? 2 * nt : 1;
    slices_job jb = {x, n, w, y, m->ws.deq, ((rows + items - 1) / items + 15) / 16 * 16, tile, 0};
    kv_pool_run(nt > 1 ? kv_model_pool(m) : NULL, (rows + jb.per - 1) / jb.per, slice_item, &jb);
    if (jb.failed) return KV_ERR(KV_EUNSUPPORTED, "cannot decode a weight matrix of type %d", w->q_dtype);
    return KV_OK;
}

typedef struct bias_job {
    float *y;
    int rows;
    const float *bias;
} bias_job;

static void bias_range(void *ctx, size_t r0, size_t r1, int thread) {
    (void)thread;
    const bias_job *jb = ctx;
    for (size_t r = r0; r < r1; r++)
        for (int c = 0; c < jb->rows; c++) jb->y[r * jb->rows + c] += jb->bias[c];
}

static void add_bias(kv_model *m, float *y, size_t n, int rows, const float *bias) {
    bias_job jb = {y, rows, bias};
    kv_model_for_rows(m, n, n * (size_t)rows, bias_range, &jb);
}

kv_status kv_model_matmul(kv_model *m, const float *x, size_t n, const kv_matrix *w, const float *bias, float *y) {
    return kv_model_matmul_multi(m, x, n, &w, &bias, &y, 1);
}

kv_status kv_model_matmul_multi(kv_model *m, const float *x, size_t n, const kv_matrix *const *w,
                                const float *const *bias, float *const *y, int count) {
    kv_status s = KV_OK;
    if (n <= KV_ROWS_MAX) {
        s = matmul_rows(m, x, (int)n, w, y, count);
    } else {
        for (int k = 0; k < count && s == KV_OK; k++) s = matmul_slices(m, x, n, w[k], y[k]);
    }
    for (int k = 0; k < count && s == KV_OK; k++)
        if (bias && bias[k]) add_bias(m, y[k], n, w[k]->rows, bias[k]);
    return s;
}

kv_status kv_model_matrix_row(const kv_matrix *w, int r, float *dst) {
    if (w->f32) {
        memcpy(dst, w->f32 + (size_t)r * w->cols, (size_t)w->cols * sizeof(float));
        return KV_OK;
    }
    return decode_row(w, r, dst);
}
