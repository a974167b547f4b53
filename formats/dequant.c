/* dequant.c — tensor types and dequantization to f32 (kv_formats.h section 1).
 *
 * Block layouts follow the GGML specification (ggml-common.h); each is written here as a struct of
 * byte arrays (alignment 1, no padding, no byte-order dependence: multi-byte fields are read with
 * kv_load_*le) with a static size check. Element order inside a block and the arithmetic of each
 * element are those of GGML's reference dequantizers (dequantize_row_*), including the order of
 * the float operations, so results are bit-identical to ggml and to the `gguf` Python package
 * (checked by tests/gguf against goldens made with it).
 *
 * The build uses -ffp-contract=off, so `d * q + m` is two roundings here as it is there.
 */
#include "kv_formats.h"

#include <stddef.h>
#include <string.h>

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "kvcal assumes a little-endian host (F32 tensors are copied as stored)"
#endif

/* ---- type table ------------------------------------------------------------------------------ */
typedef struct dtype_info {
    const char *name;
    uint16_t block_elems;
    uint16_t block_bytes;
} dtype_info;

/* Every type GGML has defined and not withdrawn (ggml.h, enum ggml_type). Types outside kv_dtype
 * are listed so that files holding them can still be read (their tensors just cannot be
 * dequantized here); removed numbers (4, 5, 31-33, 36-38) stay unknown. Q8_1 is the current
 * 36-byte layout (two f16 then 32 int8). */
#define KV_DTYPE_TABLE_SIZE 42
static const dtype_info g_dtypes[KV_DTYPE_TABLE_SIZE] = {
    [0] = {"F32", 1, 4},
    [1] = {"F16", 1, 2},
    [2] = {"Q4_0", 32, 18},
    [3] = {"Q4_1", 32, 20},
    [6] = {"Q5_0", 32, 22},
    [7] = {"Q5_1", 32, 24},
    [8] = {"Q8_0", 32, 34},
    [9] = {"Q8_1", 32, 36},
    [10] = {"Q2_K", 256, 84},
    [11] = {"Q3_K", 256, 110},
    [12] = {"Q4_K", 256, 144},
    [13] = {"Q5_K", 256, 176},
    [14] = {"Q6_K", 256, 210},
    [15] = {"Q8_K", 256, 292},
    [16] = {"IQ2_XXS", 256, 66},
    [17] = {"IQ2_XS", 256, 74},
    [18] = {"IQ3_XXS", 256, 98},
    [19] = {"IQ1_S", 256, 50},
    [20] = {"IQ4_NL", 32, 18},
    [21] = {"IQ3_S", 256, 110},
    [22] = {"IQ2_S", 256, 82},
    [23] = {"IQ4_XS", 256, 136},
    [24] = {"I8", 1, 1},
    [25] = {"I16", 1, 2},
    [26] = {"I32", 1, 4},
    [27] = {"I64", 1, 8},
    [28] = {"F64", 1, 8},
    [29] = {"IQ1_M", 256, 56},
    [30] = {"BF16", 1, 2},
    [34] = {"TQ1_0", 256, 54},
    [35] = {"TQ2_0", 256, 66},
    [39] = {"MXFP4", 32, 17},
    [40] = {"NVFP4", 64, 36},
    [41] = {"Q1_0", 128, 18},
};

static const dtype_info *dtype_lookup(int dtype) {
    if (dtype < 0 || dtype >= KV_DTYPE_TABLE_SIZE) return NULL;
    const dtype_info *d = &g_dtypes[dtype];
    return d->name ? d : NULL;
}

const char *kv_dtype_name(int dtype) {
    const dtype_info *d = dtype_lookup(dtype);
    return d ? d->name : NULL;
}

size_t kv_dtype_block_elems(int dtype) {
    const dtype_info *d = dtype_lookup(dtype);
    return d ? d->block_elems : 0;
}

size_t kv_dtype_block_bytes(int dtype) {
    const dtype_info *d = dtype_lookup(dtype);
    return d ? d->block_bytes : 0;
}

kv_status kv_dtype_row_bytes(size_t *out, int dtype, uint64_t n) {
    *out = 0;
    const dtype_info *d = dtype_lookup(dtype);
    if (!d) return KV_ERR(KV_EUNSUPPORTED, "unknown tensor type %d", dtype);
    if (n % d->block_elems != 0)
        return KV_ERR(KV_EFORMAT, "%llu elements of %s are not a whole number of blocks of %u",
                      (unsigned long long)n, d->name, (unsigned)d->block_elems);
    const uint64_t blocks = n / d->block_elems;
    if (blocks > (uint64_t)SIZE_MAX / d->block_bytes)
        return KV_ERR(KV_EFORMAT, "%llu elements of %s overflow the size type", (unsigned long long)n,
                      d->name);
    *out = (size_t)blocks * d->block_bytes;
    return KV_OK;
}

int kv_dtype_can_dequantize(int dtype) {
    switch (dtype) {
    case KV_DTYPE_F32:
    case KV_DTYPE_F16:
    case KV_DTYPE_BF16:
    case KV_DTYPE_Q4_0:
    case KV_DTYPE_Q4_1:
    case KV_DTYPE_Q5_0:
    case KV_DTYPE_Q5_1:
    case KV_DTYPE_Q8_0:
    case KV_DTYPE_Q2_K:
    case KV_DTYPE_Q3_K:
    case KV_DTYPE_Q4_K:
    case KV_DTYPE_Q5_K:
    case KV_DTYPE_Q6_K:
    case KV_DTYPE_I8:
    case KV_DTYPE_I16:
    case KV_DTYPE_I32:
    case KV_DTYPE_I64:
    case KV_DTYPE_F64:
        return 1;
    default:
        return 0;
    }
}

/* ---- block layouts (GGML spec) ------------------------------------------------------------------ */
#define QK 32   /* elements per block of the legacy types */
#define QK_K 256 /* elements per super-block of the k-quants */
#define K_SCALE_SIZE 12

/* Q4_0: x = d * (q - 8), q = 4 bits; element j < 16 in the low nibble of qs[j], j >= 16 high. */
typedef struct { uint8_t d[2]; uint8_t qs[QK / 2]; } blk_q4_0;
/* Q4_1: x = d * q + m. */
typedef struct { uint8_t d[2]; uint8_t m[2]; uint8_t qs[QK / 2]; } blk_q4_1;
/* Q5_0: x = d * (q - 16), bit 4 of element j is bit j of qh (little-endian u32). */
typedef struct { uint8_t d[2]; uint8_t qh[4]; uint8_t qs[QK / 2]; } blk_q5_0;
/* Q5_1: x = d * q + m. */
typedef struct { uint8_t d[2]; uint8_t m[2]; uint8_t qh[4]; uint8_t qs[QK / 2]; } blk_q5_1;
/* Q8_0: x = d * q, q int8. */
typedef struct { uint8_t d[2]; uint8_t qs[QK]; } blk_q8_0;
/* Q2_K: 16 sub-blocks of 16; scales[i] = scale (low 4 bits) | min (high 4 bits);
 * x = (d * sc) * q - (dmin * m), q = 2 bits. */
typedef struct { uint8_t scales[QK_K / 16]; uint8_t qs[QK_K / 4]; uint8_t d[2]; uint8_t dmin[2]; } blk_q2_k;
/* Q3_K: 16 sub-blocks of 16 with 6-bit signed scales (offset 32) packed in 12 bytes;
 * x = (d * (sc - 32)) * (q2 - (hbit ? 0 : 4)). */
typedef struct { uint8_t hmask[QK_K / 8]; uint8_t qs[QK_K / 4]; uint8_t scales[12]; uint8_t d[2]; } blk_q3_k;
/* Q4_K: 8 sub-blocks of 32 with 6-bit scales and mins packed in 12 bytes;
 * x = (d * sc) * q - (dmin * m), q = 4 bits. */
typedef struct { uint8_t d[2]; uint8_t dmin[2]; uint8_t scales[K_SCALE_SIZE]; uint8_t qs[QK_K / 2]; } blk_q4_k;
/* Q5_K: as Q4_K with a fifth bit per element in qh. */
typedef struct {
    uint8_t d[2];
    uint8_t dmin[2];
    uint8_t scales[K_SCALE_SIZE];
    uint8_t qh[QK_K / 8];
    uint8_t qs[QK_K / 2];
} blk_q5_k;
/* Q6_K: 16 sub-blocks of 16 with int8 scales; x = (d * sc) * (q - 32), q = 6 bits (4 in ql, 2 in qh). */
typedef struct { uint8_t ql[QK_K / 2]; uint8_t qh[QK_K / 4]; int8_t scales[QK_K / 16]; uint8_t d[2]; } blk_q6_k;

_Static_assert(sizeof(blk_q4_0) == 18, "Q4_0 block is 18 bytes");
_Static_assert(sizeof(blk_q4_1) == 20, "Q4_1 block is 20 bytes");
_Static_assert(sizeof(blk_q5_0) == 22, "Q5_0 block is 22 bytes");
_Static_assert(sizeof(blk_q5_1) == 24, "Q5_1 block is 24 bytes");
_Static_assert(sizeof(blk_q8_0) == 34, "Q8_0 block is 34 bytes");
_Static_assert(sizeof(blk_q2_k) == 84, "Q2_K block is 84 bytes");
_Static_assert(sizeof(blk_q3_k) == 110, "Q3_K block is 110 bytes");
_Static_assert(sizeof(blk_q4_k) == 144, "Q4_K block is 144 bytes");
_Static_assert(sizeof(blk_q5_k) == 176, "Q5_K block is 176 bytes");
_Static_assert(sizeof(blk_q6_k) == 210, "Q6_K block is 210 bytes");

static inline float ld_f16(const uint8_t *p) { return kv_f16_to_f32(kv_load_u16le(p)); }

/* ---- bulk half conversions (branch-free so the loops vectorize) ------------------------------- */
/* f16 -> f32 without branches, so the loop vectorizes: shift the 15 magnitude bits into place as
 * an f32 whose exponent is 112 too small, multiply by 2^112 (exact, also for f16 subnormals, which
 * land on f32 denormals here and become normal), then force the exponent of Inf/NaN to all ones
 * (keeping the NaN payload) and restore the sign. Equal to kv_f16_to_f32 for all 65536 inputs
 * (tested exhaustively). */
static inline float f16_to_f32_fast(uint16_t h) {
    union { uint32_t u; float f; } o, magic;
    magic.u = (127u + 112u) << 23; /* 2^112 */
    o.u = (uint32_t)(h & 0x7fffu) << 13;
    o.f *= magic.f;
    o.u |= (o.f >= 65536.0f) ? 0x7f800000u : 0u; /* was Inf or NaN */
    o.u |= (uint32_t)(h & 0x8000u) << 16;
    return o.f;
}

/* Chunks of a fixed 32 elements: gcc's -O2 vectorizer only takes loops without a remainder. */
static void deq_f16(float *KV_RESTRICT y, const uint8_t *KV_RESTRICT x, size_t n) {
    size_t i = 0;
    for (; i + 32 <= n; i += 32, x += 64, y += 32)
        for (int j = 0; j < 32; j++) y[j] = f16_to_f32_fast((uint16_t)(x[2 * j] | (x[2 * j + 1] << 8)));
    for (size_t j = 0; i < n; i++, j++) y[j] = f16_to_f32_fast((uint16_t)(x[2 * j] | (x[2 * j + 1] << 8)));
}

static inline float bf16_bytes(uint8_t lo, uint8_t hi) {
    union { uint32_t u; float f; } v;
    v.u = ((uint32_t)lo << 16) | ((uint32_t)hi << 24);
    return v.f;
}

static void deq_bf16(float *KV_RESTRICT y, const uint8_t *KV_RESTRICT x, size_t n) {
    size_t i = 0;
    for (; i + 32 <= n; i += 32, x += 64, y += 32)
        for (int j = 0; j < 32; j++) y[j] = bf16_bytes(x[2 * j], x[2 * j + 1]);
    for (size_t j = 0; i < n; i++, j++) y[j] = bf16_bytes(x[2 * j], x[2 * j + 1]);
}

/* ---- legacy 32-element blocks ------------------------------------------------------------------- */
static void deq_q4_0(float *KV_RESTRICT y, const uint8_t *KV_RESTRICT x, size_t nb) {
    for (size_t b = 0; b < nb; b++, x += sizeof(blk_q4_0), y += QK) {
        const blk_q4_0 *blk = (const blk_q4_0 *)x;
        const float d = ld_f16(blk->d);
        for (int j = 0; j < QK / 2; j++) {
            y[j] = (float)((int)(blk->qs[j] & 0x0f) - 8) * d;
            y[j + QK / 2] = (float)((int)(blk->qs[j] >> 4) - 8) * d;
        }
    }
}

static void deq_q4_1(float *KV_RESTRICT y, const uint8_t *KV_RESTRICT x, size_t nb) {
    for (size_t b = 0; b < nb; b++, x += sizeof(blk_q4_1), y += QK) {
        const blk_q4_1 *blk = (const blk_q4_1 *)x;
        const float d = ld_f16(blk->d);
        const float m = ld_f16(blk->m);
        for (int j = 0; j < QK / 2; j++) {
            y[j] = (float)(blk->qs[j] & 0x0f) * d + m;
            y[j + QK / 2] = (float)(blk->qs[j] >> 4) * d + m;
        }
    }
}

/* The 5-bit codes of a Q5_0 / Q5_1 block in element order. */
static inline void unpack_q5(uint8_t *KV_RESTRICT q, const uint8_t *KV_RESTRICT qs, uint32_t qh) {
    for (int j = 0; j < QK / 2; j++) {
        q[j] = (uint8_t)((qs[j] & 0x0f) | (((qh >> j) & 1u) << 4));
        q[j + QK / 2] = (uint8_t)((qs[j] >> 4) | (((qh >> (j + 16)) & 1u) << 4));
    }
}

static void deq_q5_0(float *KV_RESTRICT y, const uint8_t *KV_RESTRICT x, size_t nb) {
    uint8_t q[QK];
    for (size_t b = 0; b < nb; b++, x += sizeof(blk_q5_0), y += QK) {
        const blk_q5_0 *blk = (const blk_q5_0 *)x;
        const float d = ld_f16(blk->d);
        unpack_q5(q, blk->qs, kv_load_u32le(blk->qh));
        for (int j = 0; j < QK; j++) y[j] = (float)((int)q[j] - 16) * d;
    }
}

static void deq_q5_1(float *KV_RESTRICT y, const uint8_t *KV_RESTRICT x, size_t nb) {
    uint8_t q[QK];
    for (size_t b = 0; b < nb; b++, x += sizeof(blk_q5_1), y += QK) {
        const blk_q5_1 *blk = (const blk_q5_1 *)x;
        const float d = ld_f16(blk->d);
        const float m = ld_f16(blk->m);
        unpack_q5(q, blk->qs, kv_load_u32le(blk->qh));
        for (int j = 0; j < QK; j++) y[j] = (float)q[j] * d + m;
    }
}

static void deq_q8_0(float *KV_RESTRICT y, const uint8_t *KV_RESTRICT x, size_t nb) {
    for (size_t b = 0; b < nb; b++, x += sizeof(blk_q8_0), y += QK) {
        const blk_q8_0 *blk = (const blk_q8_0 *)x;
        const float d = ld_f16(blk->d);
        for (int j = 0; j < QK; j++) y[j] = (float)(int8_t)blk->qs[j] * d;
    }
}

/* ---- k-quants (256-element super-blocks) -------------------------------------------------------- */
/* The 6-bit scale and min of sub-block j (0..7) of Q4_K / Q5_K (ggml's get_scale_min_k4). */
static inline void scale_min_k4(int j, const uint8_t *q, uint8_t *sc, uint8_t *m) {
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (uint8_t)((q[j + 4] & 0x0f) | ((q[j - 4] >> 6) << 4));
        *m = (uint8_t)((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
    }
}

static void deq_q2_k(float *KV_RESTRICT y, const uint8_t *KV_RESTRICT x, size_t nb) {
    for (size_t b = 0; b < nb; b++, x += sizeof(blk_q2_k)) {
        const blk_q2_k *blk = (const blk_q2_k *)x;
        const float d = ld_f16(blk->d);
        const float dmin = ld_f16(blk->dmin);
        const uint8_t *q = blk->qs;
        int is = 0;
        for (int half = 0; half < 2; half++, q += 32) {
            for (int shift = 0; shift < 8; shift += 2) {
                for (int part = 0; part < 2; part++, is++) {
                    const uint8_t sc = blk->scales[is];
                    const float dl = d * (float)(sc & 0x0f);
                    const float ml = dmin * (float)(sc >> 4);
                    const uint8_t *qq = q + 16 * part;
                    for (int l = 0; l < 16; l++) y[l] = dl * (float)((qq[l] >> shift) & 3) - ml;
                    y += 16;
                }
            }
        }
    }
}

static void deq_q3_k(float *KV_RESTRICT y, const uint8_t *KV_RESTRICT x, size_t nb) {
    for (size_t b = 0; b < nb; b++, x += sizeof(blk_q3_k)) {
        const blk_q3_k *blk = (const blk_q3_k *)x;
        const float d_all = ld_f16(blk->d);
        /* 16 six-bit scales: low 4 bits from bytes 0..7 (low nibble for i < 8, high for i >= 8),
         * high 2 bits from bytes 8..11 (byte 8 + i % 4, bit pair i / 4). */
        int scales[16];
        for (int i = 0; i < 16; i++) {
            const int lo = (i < 8 ? blk->scales[i] : blk->scales[i - 8] >> 4) & 0x0f;
            const int hi = (blk->scales[8 + (i & 3)] >> (2 * (i >> 2))) & 3;
            scales[i] = (lo | (hi << 4)) - 32;
        }
        const uint8_t *q = blk->qs;
        const uint8_t *hm = blk->hmask;
        int is = 0;
        unsigned m = 1;
        for (int half = 0; half < 2; half++, q += 32) {
            for (int shift = 0; shift < 8; shift += 2, m <<= 1) {
                for (int part = 0; part < 2; part++, is++) {
                    const float dl = d_all * (float)scales[is];
                    const uint8_t *qq = q + 16 * part;
                    const uint8_t *hh = hm + 16 * part;
                    for (int l = 0; l < 16; l++) {
                        const int v = ((qq[l] >> shift) & 3) - ((hh[l] & m) ? 0 : 4);
                        y[l] = dl * (float)v;
                    }
                    y += 16;
                }
            }
        }
    }
}

static void deq_q4_k(float *KV_RESTRICT y, const uint8_t *KV_RESTRICT x, size_t nb) {
    for (size_t b = 0; b < nb; b++, x += sizeof(blk_q4_k)) {
        const blk_q4_k *blk = (const blk_q4_k *)x;
        const float d = ld_f16(blk->d);
        const float dmin = ld_f16(blk->dmin);
        const uint8_t *q = blk->qs;
        for (int j = 0; j < 8; j += 2, q += 32) {
            uint8_t sc, m;
            scale_min_k4(j, blk->scales, &sc, &m);
            const float d1 = d * (float)sc, m1 = dmin * (float)m;
            scale_min_k4(j + 1, blk->scales, &sc, &m);
            const float d2 = d * (float)sc, m2 = dmin * (float)m;
            for (int l = 0; l < 32; l++) y[l] = d1 * (float)(q[l] & 0x0f) - m1;
            for (int l = 0; l < 32; l++) y[l + 32] = d2 * (float)(q[l] >> 4) - m2;
            y += 64;
        }
    }
}

static void deq_q5_k(float *KV_RESTRICT y, const uint8_t *KV_RESTRICT x, size_t nb) {
    for (size_t b = 0; b < nb; b++, x += sizeof(blk_q5_k)) {
        const blk_q5_k *blk = (const blk_q5_k *)x;
        const float d = ld_f16(blk->d);
        const float dmin = ld_f16(blk->dmin);
        const uint8_t *ql = blk->qs;
        const uint8_t *qh = blk->qh;
        unsigned u1 = 1, u2 = 2;
        for (int j = 0; j < 8; j += 2, ql += 32, u1 <<= 2, u2 <<= 2) {
            uint8_t sc, m;
            scale_min_k4(j, blk->scales, &sc, &m);
            const float d1 = d * (float)sc, m1 = dmin * (float)m;
            scale_min_k4(j + 1, blk->scales, &sc, &m);
            const float d2 = d * (float)sc, m2 = dmin * (float)m;
            for (int l = 0; l < 32; l++) y[l] = d1 * (float)((ql[l] & 0x0f) + ((qh[l] & u1) ? 16 : 0)) - m1;
            for (int l = 0; l < 32; l++) y[l + 32] = d2 * (float)((ql[l] >> 4) + ((qh[l] & u2) ? 16 : 0)) - m2;
            y += 64;
        }
    }
}

static void deq_q6_k(float *KV_RESTRICT y, const uint8_t *KV_RESTRICT x, size_t nb) {
    int8_t q[QK_K];
    for (size_t b = 0; b < nb; b++, x += sizeof(blk_q6_k), y += QK_K) {
        const blk_q6_k *blk = (const blk_q6_k *)x;
        const float d = ld_f16(blk->d);
        /* codes in element order: in each half of 128, element l + 32k takes 4 bits from ql and
         * 2 bits (pair k) from qh[l] */
        for (int n = 0; n < 2; n++) {
            const uint8_t *ql = blk->ql + 64 * n;
            const uint8_t *qh = blk->qh + 32 * n;
            int8_t *qq = q + 128 * n;
            for (int l = 0; l < 32; l++) {
                qq[l] = (int8_t)((int)((ql[l] & 0x0f) | ((qh[l] & 3) << 4)) - 32);
                qq[l + 32] = (int8_t)((int)((ql[l + 32] & 0x0f) | (((qh[l] >> 2) & 3) << 4)) - 32);
                qq[l + 64] = (int8_t)((int)((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32);
                qq[l + 96] = (int8_t)((int)((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32);
            }
        }
        /* 16 sub-blocks of 16 share a scale: x = (d * sc) * q, as ggml computes d * sc[is] * q */
        for (int is = 0; is < 16; is++) {
            const float ds = d * (float)blk->scales[is];
            const int8_t *qq = q + 16 * is;
            float *yy = y + 16 * is;
            for (int l = 0; l < 16; l++) yy[l] = ds * (float)qq[l];
        }
    }
}

/* ---- plain element types ---------------------------------------------------------------------- */
static void deq_ints(float *KV_RESTRICT y, const uint8_t *KV_RESTRICT x, size_t n, int dtype) {
    switch (dtype) {
    case KV_DTYPE_I8:
        for (size_t i = 0; i < n; i++) y[i] = (float)(int8_t)x[i];
        break;
    case KV_DTYPE_I16:
        for (size_t i = 0; i < n; i++) y[i] = (float)(int16_t)kv_load_u16le(x + 2 * i);
        break;
    case KV_DTYPE_I32:
        for (size_t i = 0; i < n; i++) y[i] = (float)(int32_t)kv_load_u32le(x + 4 * i);
        break;
    case KV_DTYPE_I64:
        for (size_t i = 0; i < n; i++) y[i] = (float)(int64_t)kv_load_u64le(x + 8 * i);
        break;
    default: /* F64 */
        for (size_t i = 0; i < n; i++) {
            union { uint64_t u; double f; } v;
            v.u = kv_load_u64le(x + 8 * i);
            y[i] = (float)v.f;
        }
        break;
    }
}

kv_status kv_dequantize(float *dst, const void *src, int dtype, size_t n) {
    const dtype_info *info = dtype_lookup(dtype);
    if (!info) return KV_ERR(KV_EUNSUPPORTED, "cannot dequantize unknown tensor type %d", dtype);
    if (!kv_dtype_can_dequantize(dtype))
        return KV_ERR(KV_EUNSUPPORTED, "dequantization of %s tensors is not supported", info->name);
    if (n % info->block_elems != 0)
        return KV_ERR(KV_EINVAL, "dequantize: %zu elements of %s are not a whole number of blocks of %u",
                      n, info->name, (unsigned)info->block_elems);
    if (n == 0) return KV_OK;
    if (!dst || !src) return KV_ERR(KV_EINVAL, "dequantize: NULL buffer");
    const uint8_t *x = (const uint8_t *)src;
    const size_t nb = n / info->block_elems;
    switch (dtype) {
    case KV_DTYPE_F32: memcpy(dst, src, n * sizeof(float)); break; /* little-endian host */
    case KV_DTYPE_F16: deq_f16(dst, x, n); break;
    case KV_DTYPE_BF16: deq_bf16(dst, x, n); break;
    case KV_DTYPE_Q4_0: deq_q4_0(dst, x, nb); break;
    case KV_DTYPE_Q4_1: deq_q4_1(dst, x, nb); break;
    case KV_DTYPE_Q5_0: deq_q5_0(dst, x, nb); break;
    case KV_DTYPE_Q5_1: deq_q5_1(dst, x, nb); break;
    case KV_DTYPE_Q8_0: deq_q8_0(dst, x, nb); break;
    case KV_DTYPE_Q2_K: deq_q2_k(dst, x, nb); break;
    case KV_DTYPE_Q3_K: deq_q3_k(dst, x, nb); break;
    case KV_DTYPE_Q4_K: deq_q4_k(dst, x, nb); break;
    case KV_DTYPE_Q5_K: deq_q5_k(dst, x, nb); break;
    case KV_DTYPE_Q6_K: deq_q6_k(dst, x, nb); break;
    default: deq_ints(dst, x, n, dtype); break;
    }
    return KV_OK;
}
