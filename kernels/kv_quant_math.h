/* kv_quant_math.h — the element math of every quantizer, written once (STYLE.md).
 *
 * KV_HD functions: `__host__ __device__ static inline` under nvcc, `static inline` in C. The CPU
 * reference (cpu/) and the CUDA kernels (cuda/) both call them, so that with FMA contraction off on
 * both sides (-ffp-contract=off, -fmad=false) they produce bit-identical codes and floats. Every
 * float expression is written in the order it must be evaluated; do not "simplify" it.
 * Internal to kernels/ (and its tests); the public API is kvrt.h.
 */
#ifndef KV_QUANT_MATH_H
#define KV_QUANT_MATH_H

#include "kvrt.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Round-to-nearest-even of 0 <= v < 2^22 by the 1.5 * 2^23 trick: exact, branch-free, vectorizes,
 * and identical on host and device (no library call whose rounding could differ). */
#define KV_QM_ROUND_MAGIC 12582912.0f

/* ---- packing ----------------------------------------------------------------------------------- */
KV_HD int kv_qm_per_word(int bits, int pack11) {
    if (bits < 1 || bits > 8) return 0;
    if (bits == 3 && pack11) return 11;
    return 32 / bits;
}

/* Largest code slot `slot` can hold: 2^bits - 1, or 3 in slot 10 of the 11-per-word layout. */
KV_HD uint32_t kv_qm_slot_max(int bits, int per_word, int slot) {
    return (per_word == 11 && slot == 10) ? 3u : ((1u << bits) - 1u);
}

KV_HD uint32_t kv_qm_unpack(const uint32_t *words, size_t j, int bits, int per_word) {
    const size_t w = j / (size_t)per_word;
    const int slot = (int)(j - w * (size_t)per_word);
    return (words[w] >> (slot * bits)) & kv_qm_slot_max(bits, per_word, slot);
}

/* One packed word from the codes at stream positions [w*per, w*per + per) (n codes in all). */
KV_HD uint32_t kv_qm_pack_word(const uint8_t *codes, size_t n, size_t w, int bits, int per_word) {
    uint32_t word = 0;
    const size_t j0 = w * (size_t)per_word;
    for (int s = 0; s < per_word && j0 + (size_t)s < n; s++)
        word |= ((uint32_t)codes[j0 + (size_t)s] & kv_qm_slot_max(bits, per_word, s)) << (s * bits);
    return word;
}

/* ---- parameter storage (f32 or f16) -------------------------------------------------------------- */
KV_HD float kv_qm_param_load(const void *arr, size_t i, int type) {
    if (type == KV_PARAM_F16) return kv_f16_to_f32(((const uint16_t *)arr)[i]);
    return ((const float *)arr)[i];
}
KV_HD void kv_qm_param_store(void *arr, size_t i, float v, int type) {
    if (type == KV_PARAM_F16)
        ((uint16_t *)arr)[i] = kv_f32_to_f16(v);
    else
        ((float *)arr)[i] = v;
}
/* The value a stored parameter decodes to (rounding to f16 when that is the storage). */
KV_HD float kv_qm_param_round(float v, int type) {
    return type == KV_PARAM_F16 ? kv_f16_to_f32(kv_f32_to_f16(v)) : v;
}

KV_HD int kv_qm_is_finite(float x) { return x - x == 0.0f; } /* false for NaN and +-Inf */

/* 1 when x is NaN or +-Inf, from the exponent bits (integer ops: vectorizes inside reductions). */
KV_HD uint32_t kv_qm_nonfinite_bit(float x) {
    union { float f; uint32_t u; } v;
    v.f = x;
    return (v.u & 0x7f800000u) == 0x7f800000u;
}

/* ---- uniform quantizer ------------------------------------------------------------------------- */
/* Encoder parameters of a group from its min and max. */
typedef struct kv_qm_uparams {
    float z;    /* min */
    float s;    /* (max - min) / qmax */
    float inv;  /* 1 / s, 0 when s == 0 */
    float zc;   /* stored zero point z' = z + (eta * s) * qmax (XQuant eq. 12) */
    float sc;   /* stored scale s' = (1 - 2 eta) * s */
} kv_qm_uparams;

KV_HD kv_qm_uparams kv_qm_uniform_params(float mn, float mx, int bits, float eta) {
    kv_qm_uparams p;
    const float qmax = (float)((1u << bits) - 1u);
    p.z = mn;
    /* + 0.0f turns a -0 range (a group of zeros of both signs, whose min and max signs depend on the
     * order they were compared in) into +0, so every reduction order stores the same scale */
    p.s = (mx - mn) / qmax + 0.0f;
    p.inv = p.s > 0.0f ? 1.0f / p.s : 0.0f;
    p.zc = p.z + (eta * p.s) * qmax;
    p.sc = (1.0f - 2.0f * eta) * p.s;
    return p;
}

/* code = clamp(round((x - z) / s), 0, slot_max) with the division done as a multiply by 1/s. */
KV_HD uint32_t kv_qm_uniform_code(float x, float z, float inv, uint32_t slot_max) {
    const float hi = (float)slot_max;
    float v = (x - z) * inv;
    v = v > 0.0f ? v : 0.0f;
    v = v < hi ? v : hi;
    v = (v + KV_QM_ROUND_MAGIC) - KV_QM_ROUND_MAGIC;
    return (uint32_t)(int32_t)v; /* 0 <= v <= 255: the signed conversion vectorizes */
}

KV_HD float kv_qm_uniform_dequant(uint32_t code, float s, float z) { return (float)code * s + z; }

/* Rows in token group k of a block of T tokens (groups along tokens). */
KV_HD size_t kv_qm_tok_group_rows(size_t G, size_t T, size_t k) {
    const size_t r = T - k * G;
    return r < G ? r : G;
}
KV_HD size_t kv_qm_chan_groups(size_t G, size_t C) { return (C + G - 1) / G; }

/* Stream position of element (t, c); see kvrt.h. */
KV_HD size_t kv_qm_uniform_stream_pos(int axis, size_t G, size_t T, size_t C, size_t t, size_t c) {
    if (axis == KV_AXIS_CHANNELS) return t * C + c;
    const size_t k = t / G;
    return k * G * C + c * kv_qm_tok_group_rows(G, T, k) + (t - k * G);
}
/* Group of element (t, c); see kvrt.h. */
KV_HD size_t kv_qm_uniform_group(int axis, size_t G, size_t T, size_t C, size_t t, size_t c) {
    if (axis == KV_AXIS_CHANNELS) return t * kv_qm_chan_groups(G, C) + c / G;
    (void)T;
    return (t / G) * C + c;
}
/* Inverse of kv_qm_uniform_stream_pos. */
KV_HD void kv_qm_uniform_stream_elem(int axis, size_t G, size_t T, size_t C, size_t j, size_t *t,
                                     size_t *c) {
    if (axis == KV_AXIS_CHANNELS) {
        *t = j / C;
        *c = j - *t * C;
        return;
    }
    const size_t k = j / (G * C);
    const size_t rem = j - k * G * C;
    const size_t rows = kv_qm_tok_group_rows(G, T, k);
    *c = rem / rows;
    *t = k * G + (rem - *c * rows);
}

/* Decoded value of element (t, c). */
KV_HD float kv_qm_uniform_elem(int bits, int per_word, int axis, size_t G, size_t T, size_t C,
                               size_t t, size_t c, const uint32_t *codes, const void *scales,
                               const void *zeros, int ptype) {
    const size_t g = kv_qm_uniform_group(axis, G, T, C, t, c);
    const uint32_t code = kv_qm_unpack(codes, kv_qm_uniform_stream_pos(axis, G, T, C, t, c), bits,
                                       per_word);
    return kv_qm_uniform_dequant(code, kv_qm_param_load(scales, g, ptype),
                                 kv_qm_param_load(zeros, g, ptype));
}

/* Attention score of token t: sum over c in order of query[c] * x_hat[t][c]. */
KV_HD float kv_qm_uniform_score(int bits, int per_word, int axis, size_t G, size_t T, size_t C,
                                size_t t, const uint32_t *codes, const void *scales,
                                const void *zeros, int ptype, const float *query) {
    float acc = 0.0f;
    for (size_t c = 0; c < C; c++)
        acc += query[c] * kv_qm_uniform_elem(bits, per_word, axis, G, T, C, t, c, codes, scales,
                                             zeros, ptype);
    return acc;
}

/* ---- HIGGS ------------------------------------------------------------------------------------- */
KV_HD float kv_qm_higgs_sign(uint64_t seed, size_t c) {
    return (kv_rng_u64(seed, (uint64_t)c) & 1u) ? -1.0f : 1.0f;
}

/* Butterfly p (0 <= p < n/2) of the FWHT stage with half-width h: (a, b) -> (a + b, a - b).
 * Within a stage the butterflies touch disjoint pairs, so any thread order gives the same bits. */
KV_HD void kv_qm_fwht_butterfly(float *v, size_t p, size_t h) {
    const size_t i = (p / h) * 2u * h + (p % h);
    const float a = v[i], b = v[i + h];
    v[i] = a + b;
    v[i + h] = a - b;
}

/* Unnormalized FWHT (v <- H v), stage by stage: the same butterflies as kv_qm_fwht_butterfly
 * (pair (j, j + h) for j with bit h clear), in blocks so that the inner loop is contiguous. */
KV_HD void kv_qm_fwht(float *v, size_t n) {
    for (size_t h = 1; h < n; h *= 2)
        for (size_t i = 0; i < n; i += 2 * h)
            for (size_t j = i; j < i + h; j++) {
                const float a = v[j], b = v[j + h];
                v[j] = a + b;
                v[j + h] = a - b;
            }
}

/* Sum of squares in a fixed order that both sides compute the same way (the GPU on one thread):
 * 8 lanes (lane k sums elements k, k + 8, ...; a tail below 8 goes to lane 0), then the lanes
 * pairwise. The lanes let the CPU vectorize it without reassociating anything. */
/* kv_qm_sumsq's final sum of its 8 lanes (the CPU's vector paths call it too). */
KV_HD float kv_qm_sum_lanes8(const float *acc) {
    return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

KV_HD float kv_qm_sumsq(const float *v, size_t n) {
    float acc[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int k = 0; k < 8; k++) acc[k] += v[i + (size_t)k] * v[i + (size_t)k];
    for (; i < n; i++) acc[0] += v[i] * v[i];
    return kv_qm_sum_lanes8(acc);
}

/* Squared distance of a d-vector to grid point i, summed in coordinate order. */
KV_HD float kv_qm_grid_dist(const float *u, const float *grid, int d, int i) {
    float acc = 0.0f;
    for (int k = 0; k < d; k++) {
        const float e = u[k] - grid[i * d + k];
        acc += e * e;
    }
    return acc;
}

/* Nearest grid point by exhaustive search; ties go to the lowest index. */
KV_HD int kv_qm_grid_nearest(const float *u, const float *grid, int d, int n) {
    int best = 0;
    float bd = kv_qm_grid_dist(u, grid, d, 0);
    for (int i = 1; i < n; i++) {
        const float e = kv_qm_grid_dist(u, grid, d, i);
        if (e < bd) {
            bd = e;
            best = i;
        }
    }
    return best;
}

/* Encoder multiplier of a group: u = (H D x) / ||x|| (unnormalized H), i.e. the normalized transform
 * H D x / sqrt(g) rescaled to ||u||^2 = g, so that its coordinates are ~N(0, 1). */
KV_HD float kv_qm_higgs_enc_mul(float norm) { return norm > 0.0f ? 1.0f / norm : 0.0f; }
/* Decoder multiplier: x = D H (grid * norm / g) because H H = g I. */
KV_HD float kv_qm_higgs_dec_mul(float norm, size_t g) { return norm / (float)g; }

/* Rotated query of a HIGGS block: qrot = H (D q) per group of g channels (unnormalized H); the block's
 * channel c takes the sign of channel ch0 + c (kv_higgs.channel0). */
KV_HD void kv_qm_higgs_rotate_query(float *qrot, const float *q, uint64_t seed, uint64_t ch0, size_t C, size_t g) {
    for (size_t c = 0; c < C; c++) qrot[c] = q[c] * kv_qm_higgs_sign(seed, ch0 + c);
    for (size_t c0 = 0; c0 < C; c0 += g) kv_qm_fwht(qrot + c0, g);
}

/* Score of token t: q . x_hat[t] = sum over groups of (norm / g) * (qrot . grid[idx]) because
 * x_hat = D H (grid[idx] * norm / g) and H is symmetric. */
KV_HD float kv_qm_higgs_score(const float *qrot, size_t C, size_t g, size_t t, const uint32_t *indices,
                              const void *norms, int ntype, const float *grid, int d, int bits, int per) {
    const size_t ng = C / g, per_group = g / (size_t)d;
    float total = 0.0f;
    for (size_t gi = 0; gi < ng; gi++) {
        const size_t grp = t * ng + gi;
        float acc = 0.0f;
        for (size_t p = 0; p < per_group; p++) {
            const uint32_t i = kv_qm_unpack(indices, grp * per_group + p, bits, per);
            for (int k = 0; k < d; k++)
                acc += qrot[gi * g + p * (size_t)d + (size_t)k] * grid[i * (uint32_t)d + (uint32_t)k];
        }
        total += acc * kv_qm_higgs_dec_mul(kv_qm_param_load(norms, grp, ntype), g);
    }
    return total;
}

/* ---- FP8 (E4M3, E5M2) and NVFP4 (E2M1 elements) ------------------------------------------------
 * Definitions (kernels/FLOAT_KV.md cites them): OCP 8-bit Floating Point Specification (OFP8) rev. 1.0
 * and NVIDIA's cuda_fp8.h / cuda_fp4.h conversions with __NV_SATFINITE; NVFP4 as NVIDIA defines it
 * (E2M1 values in blocks of 16, one E4M3 block scale each, under one f32 scale per tensor).
 *   E4M3 ("fn"): bias 7, 3 mantissa bits, no infinities, S.1111.111 is NaN, largest 448.
 *   E5M2: bias 15, 2 mantissa bits, IEEE-like (S.11111.00 = Inf, S.11111.xx != 0 = NaN), largest 57344.
 *   E2M1: bias 1, 1 mantissa bit, no Inf or NaN: 0, 0.5, 1, 1.5, 2, 3, 4, 6.
 * Conversion from f32: round to nearest, ties to even (on the code's last mantissa bit), saturating:
 * a magnitude above the largest finite value (infinity included) becomes the largest finite value
 * with its sign. NaN becomes the canonical NaN 0x7F (E4M3, E5M2; cuda_fp8.h returns the same);
 * E2M1 has no NaN encoding: NaN becomes +6 (0x7; our choice, see FLOAT_KV.md). The quantizers reject
 * non-finite inputs before converting (KV_ENUMERIC), so these rules only matter to direct callers. */

/* 2^k exactly, for -126 <= k <= 127 (from the exponent bits: no library call). */
KV_HD float kv_qm_pow2(int k) {
    union { uint32_t u; float f; } v;
    v.u = (uint32_t)(k + 127) << 23;
    return v.f;
}

/* Magnitude of the unsigned minifloat bits `mag` (exponent field above M mantissa bits, bias B). */
KV_HD float kv_qm_mf_magnitude(uint32_t mag, int M, int B) {
    const uint32_t E = mag >> M, m = mag & ((1u << M) - 1u);
    if (E == 0) return (float)m * kv_qm_pow2(1 - B - M); /* subnormal: m * 2^(1-B-M) */
    return (float)((1u << M) | m) * kv_qm_pow2((int)E - B - M);
}

/* Magnitude bits of the representable value nearest to a, 0 <= a <= the format's largest finite
 * value (finite), ties to even. The binade e of a (at least 1 - B, the subnormal one) gives the
 * quantum 2^(e - M); a / quantum is an exact power-of-two scaling below 2^(M+2), rounded by the
 * magic-number trick; code = ((e - (1 - B)) << M) + r covers the subnormals (e = 1 - B: code = r),
 * and r = 2^(M+1) carries into the next binade by itself. */
KV_HD uint32_t kv_qm_mf_encode_mag(float a, int M, int B) {
    union { float f; uint32_t u; } v;
    v.f = a;
    const int emin = 1 - B;
    int e = (int)(v.u >> 23) - 127;
    e = e < emin ? emin : e;
    const float r = (a * kv_qm_pow2(M - e) + KV_QM_ROUND_MAGIC) - KV_QM_ROUND_MAGIC;
    return ((uint32_t)(e - emin) << M) + (uint32_t)(int32_t)r;
}

#define KV_QM_E4M3_MAX 448.0f
#define KV_QM_E5M2_MAX 57344.0f
#define KV_QM_E2M1_MAX 6.0f

KV_HD float kv_qm_f32_from_bits(uint32_t u) {
    union { uint32_t u; float f; } v;
    v.u = u;
    return v.f;
}
KV_HD uint32_t kv_qm_bits_of(float f) {
    union { float f; uint32_t u; } v;
    v.f = f;
    return v.u;
}

KV_HD float kv_qm_e4m3_to_f32(uint32_t code) {
    const uint32_t mag = code & 0x7fu;
    if (mag == 0x7fu) return kv_qm_f32_from_bits(0x7fc00000u);
    const float a = kv_qm_mf_magnitude(mag, 3, 7);
    return kv_qm_f32_from_bits(kv_qm_bits_of(a) | ((code & 0x80u) << 24));
}
KV_HD float kv_qm_e5m2_to_f32(uint32_t code) {
    const uint32_t mag = code & 0x7fu, sign = (code & 0x80u) << 24;
    if ((mag >> 2) == 31u) return kv_qm_f32_from_bits((mag & 3u) ? 0x7fc00000u : (0x7f800000u | sign));
    return kv_qm_f32_from_bits(kv_qm_bits_of(kv_qm_mf_magnitude(mag, 2, 15)) | sign);
}
KV_HD float kv_qm_e2m1_to_f32(uint32_t code) {
    return kv_qm_f32_from_bits(kv_qm_bits_of(kv_qm_mf_magnitude(code & 7u, 1, 1)) | ((code & 8u) << 28));
}

/* Saturating round-to-nearest-even conversions (rules above). */
KV_HD uint32_t kv_qm_e4m3_from_f32(float x) {
    const uint32_t u = kv_qm_bits_of(x), sign = (u >> 24) & 0x80u, au = u & 0x7fffffffu;
    if (au > 0x7f800000u) return 0x7fu;
    float a = kv_qm_f32_from_bits(au);
    a = a < KV_QM_E4M3_MAX ? a : KV_QM_E4M3_MAX;
    return sign | kv_qm_mf_encode_mag(a, 3, 7);
}
KV_HD uint32_t kv_qm_e5m2_from_f32(float x) {
    const uint32_t u = kv_qm_bits_of(x), sign = (u >> 24) & 0x80u, au = u & 0x7fffffffu;
    if (au > 0x7f800000u) return 0x7fu;
    float a = kv_qm_f32_from_bits(au);
    a = a < KV_QM_E5M2_MAX ? a : KV_QM_E5M2_MAX;
    return sign | kv_qm_mf_encode_mag(a, 2, 15);
}
KV_HD uint32_t kv_qm_e2m1_from_f32(float x) {
    const uint32_t u = kv_qm_bits_of(x), sign = (u >> 28) & 0x8u, au = u & 0x7fffffffu;
    if (au > 0x7f800000u) return 0x7u;
    float a = kv_qm_f32_from_bits(au);
    a = a < KV_QM_E2M1_MAX ? a : KV_QM_E2M1_MAX;
    return sign | kv_qm_mf_encode_mag(a, 1, 1);
}

/* Element format of a float quantizer (kv_fp_format): code width, conversions, largest value. */
KV_HD int kv_qm_fp_bits(int format) { return format == KV_FP_NVFP4 ? 4 : 8; }
KV_HD float kv_qm_fp_max(int format) {
    return format == KV_FP_E4M3 ? KV_QM_E4M3_MAX : format == KV_FP_E5M2 ? KV_QM_E5M2_MAX : KV_QM_E2M1_MAX;
}
KV_HD uint32_t kv_qm_fp_encode(int format, float x) {
    return format == KV_FP_E4M3 ? kv_qm_e4m3_from_f32(x)
           : format == KV_FP_E5M2 ? kv_qm_e5m2_from_f32(x) : kv_qm_e2m1_from_f32(x);
}
KV_HD float kv_qm_fp_decode(int format, uint32_t code) {
    return format == KV_FP_E4M3 ? kv_qm_e4m3_to_f32(code)
           : format == KV_FP_E5M2 ? kv_qm_e5m2_to_f32(code) : kv_qm_e2m1_to_f32(code);
}

/* The f32 scale of channel c (per tensor: n_scales == 1; per KV head: c / scale_channels). */
KV_HD float kv_qm_fp_scale(const float *scales, int n_scales, int scale_channels, size_t c) {
    return n_scales == 1 ? scales[0] : scales[c / (size_t)scale_channels];
}

/* NVFP4 block of n <= 16 values with block maximum |x| amax under the f32 scale S:
 * the stored E4M3 block scale is e4m3((amax / 6) / S) (NVIDIA's two-level scaling: the tensor scale
 * S = amax_tensor / (6 * 448) maps the block scales into E4M3's range); elements are
 * e2m1(x / d) with d = e4m3_value(block scale) * S, and decode to e2m1_value * d. A block whose
 * scale rounds to 0 stores zeros. */
KV_HD uint32_t kv_qm_nvfp4_block_scale(float amax, float S) { return kv_qm_e4m3_from_f32((amax / 6.0f) / S); }
KV_HD float kv_qm_nvfp4_block_mul(uint32_t bscale, float S) { return kv_qm_e4m3_to_f32(bscale) * S; }
KV_HD uint32_t kv_qm_nvfp4_code(float x, float d) { return d > 0.0f ? kv_qm_e2m1_from_f32(x / d) : 0u; }
/* FP8: code = fp8(x / S), value = fp8_value(code) * S. */
KV_HD uint32_t kv_qm_fp8_code(int format, float x, float S) { return kv_qm_fp_encode(format, x / S); }

/* ---- SQuat ------------------------------------------------------------------------------------- */
/* rest[i] += sum_k w[i][k] * err[k] (k in order) for one remaining coordinate i. */
KV_HD float kv_qm_squat_update(float rest_i, const float *w_row, const float *err, int gt) {
    float acc = 0.0f;
    for (int k = 0; k < gt; k++) acc += w_row[k] * err[k];
    return rest_i + acc;
}

#ifdef __cplusplus
}
#endif
#endif /* KV_QUANT_MATH_H */
