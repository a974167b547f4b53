/* kv_kernels_internal.h — helpers shared by kernels/cpu and kernels/cuda (not public). */
#ifndef KV_KERNELS_INTERNAL_H
#define KV_KERNELS_INTERNAL_H

#include "kvrt.h"

#ifdef __cplusplus
extern "C" {
#endif

#define KV_HIGGS_MAX_GROUP 4096

/* log2(n) for a power of two n: the width of a HIGGS index. */
int kv_higgs_index_bits(int n);
/* tokens * channels, checked against overflow (KV_EINVAL). */
kv_status kv_block_values(size_t *n, size_t tokens, size_t channels);
/* Scale/zero entries of a uniform block (q already checked). */
size_t kv_uniform_groups(const kv_uniform *q, size_t tokens, size_t channels);

/* CPU fast paths (cpu/common.c). pack_range ORs `count` codes into stream positions
 * [j0, j0 + count) (the words must be zero there); codes must be < 2^bits, except that in the
 * 11-per-word layout slot 10 is clamped to 3 here. unpack_range is its inverse. */
void kv_pack_range(uint32_t *words, size_t j0, const uint8_t *codes, size_t count, int bits, int per);
void kv_unpack_range(uint8_t *codes, const uint32_t *words, size_t j0, size_t count, int bits, int per);

/* The uniform encoder's two CPU paths behind kv_uniform_encode_ref, which tries the first: SSE2
 * (cpu/uniform_sse2.c) returns 1 when it handled the call (then *st is its status), 0 when this
 * machine or layout is left to the portable C (cpu/uniform.c). Same output bits (tested). */
int kv_uniform_encode_sse2(uint32_t *codes, void *scales, void *zeros, const kv_uniform *q, size_t tokens,
                           size_t channels, const float *x, kv_status *st);
kv_status kv_uniform_encode_portable(uint32_t *codes, void *scales, void *zeros, const kv_uniform *q,
                                     size_t tokens, size_t channels, const float *x);
/* Keys-axis decode by SSE2 (1 when handled; sv, zv: channels floats each of scratch for a token
 * group's scales and zero points), else the portable loop in kv_uniform_decode_ref. Same output
 * bits (tested). */
int kv_uniform_decode_keys_sse2(float *x_hat, const kv_uniform *q, size_t tokens, size_t channels,
                                const uint32_t *codes, const void *scales, const void *zeros, float *sv, float *zv);

/* SQuat (cpu/squat.c). kv_squat_encode_cols encodes the d = kv_squat_dim columns of x (tokens rows,
 * row stride ldx) as channels [c0, c0 + d) of a tokens x channels keys block (groups along tokens):
 * unpacked codes into cs (the block's stream positions, kvrt.h "Packed code layout"; pack with
 * kv_pack_ref once every column range is written) and the scales/zero points of those channels; the
 * rest of the block is not touched. It is what kv_squat_encode_ref runs (c0 = 0, channels = d), and
 * how the runtime encodes one KV head's keys into a block of kv_dim channels.
 * kv_squat_encode_loop is the per-token reference the chunk-wide encoder is tested against (same bits). */
kv_status kv_squat_encode_cols(uint8_t *cs, void *scales, void *zeros, const kv_squat *s, const kv_uniform *q,
                               size_t tokens, size_t channels, size_t c0, const float *x, size_t ldx);
/* Bytes a kv_squat holds (P_inv, the W_t and their transposes); 0 for NULL. */
size_t kv_squat_bytes(const kv_squat *s);
kv_status kv_squat_encode_loop(uint32_t *codes, void *scales, void *zeros, const kv_squat *s,
                               const kv_uniform *q, size_t tokens, const float *x);

/* AVX2 code (function target attributes, chosen at run time) needs GCC or Clang on x86-64. */
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define KV_HAVE_X86_AVX2 1
#else
#define KV_HAVE_X86_AVX2 0
#endif

/* The vector paths the CPU kernels may take (cpu/simd.c): the best this build and machine have,
 * capped by kv_simd_level_limit (for tests, which run each level and compare the bits; every level
 * gives the same output). */
typedef enum kv_simd_level { KV_SIMD_NONE = 0, KV_SIMD_SSE2 = 1, KV_SIMD_AVX2 = 2 } kv_simd_level;
kv_simd_level kv_simd_level_now(void);
void kv_simd_level_limit(kv_simd_level max);

/* HIGGS's AVX2 paths (cpu/higgs_avx2.c): kv_qm_fwht's bits, n >= 16 a power of two, 0 (nothing
 * done) otherwise or without AVX2 code. _transform: dst = H (x * signs) * kv_qm_higgs_enc_mul(norm)
 * with *sumsq = kv_qm_sumsq(x) and norm = sqrtf(*sumsq); _decode: dst = (H v) * signs. The caller
 * checks that the CPU has AVX2. */
int kv_fwht_avx2(float *dst, const float *src, size_t n);
int kv_higgs_transform_avx2(float *dst, const float *x, size_t n, const float *signs, float *sumsq);
int kv_fwht_avx2_decode(float *dst, const float *v, size_t n, const float *signs);

/* The CPU's vectorizable FWHT (unnormalized), bit-identical to kv_qm_fwht (tested). */
void kv_fwht_unnormalized_ref(float *v, size_t n);
/* HIGGS decode of one group: y = (H v) * signs (g a power of two; v is scratch, overwritten), the
 * exact operations kv_higgs_decode_ref applies (the runtime decodes single groups with it). */
void kv_higgs_decode_transform(float *y, float *v, size_t g, const float *signs);
/* HIGGS's SSE2 paths (cpu/higgs_sse2.c), 0 (nothing done) off x86-64 or for n < 8; otherwise as the
 * AVX2 ones above (kv_qm_fwht's and kv_qm_sumsq's bits; dst may equal the input). */
int kv_fwht_sse2(float *dst, const float *src, size_t n);
int kv_higgs_transform_sse2(float *dst, const float *x, size_t n, const float *signs, float *sumsq);
int kv_fwht_sse2_decode(float *dst, const float *v, size_t n, const float *signs);

#ifdef __cplusplus
}
#endif
#endif
