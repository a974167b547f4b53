/* plan_internal.h — internals of the plan format shared by plan*.c and config.c (not a public header). Only
 * kv_plan.h and kv_common.h: plan.c, plan_read.c and plan_write.c form the kvplan library (no JSON, no YAML).
 * Spec: formats/PLAN_FORMAT.md (cited as §N). */
#ifndef KV_PLAN_INTERNAL_H
#define KV_PLAN_INTERNAL_H

#include "kv_plan.h"

/* §4: the header and the section table entry of format 1.0. */
#define KV_PLAN_MAGIC_BYTES "\x89KVPLAN\n"
#define KV_PLAN_HEADER_SIZE 64u
#define KV_PLAN_ENTRY_SIZE 40u
#define KV_PLAN_ALIGN 64u
#define KV_PLAN_BOM 0x0A0B0C0Du
#define KV_PLAN_MAX_SECTIONS 64u
#define KV_PLAN_LAYER_RECORD_SIZE 104u  /* §6.4 */
#define KV_PLAN_STREAM_RECORD_SIZE 48u
#define KV_PLAN_MAX_SECTION_SIZE (1ull << 36)
#define KV_PLAN_MAX_STRING (16u << 20)

/* Stream record flags (§6.4). */
#define KV_PLAN_SF_PRE_ROPE 0x1u
#define KV_PLAN_SF_PREDICTOR 0x2u
#define KV_PLAN_SF_SQUAT 0x4u
#define KV_PLAN_SF_SQUAT_STATIC 0x10u /* 1.2: with SQUAT, the stored basis for every sequence */
#define KV_PLAN_SF_PRED_F16 0x20u     /* 1.2: with PREDICTOR, its weight and bias are f16 in PRED */
#define KV_PLAN_SF_PRED_LOWRANK 0x40u /* 1.3: with PREDICTOR, PRED holds rank and factors, not the weight */
#define KV_PLAN_SF_PRED_Q4 0x80u      /* 1.4: with PREDICTOR and PRED_F16, PRED holds codes, scales, offsets */
#define KV_PLAN_SF_FP_SCALES 0x8u /* 1.1: an FSCL entry exists */

/* Limits of §6. */
#define KV_PLAN_MAX_LAYERS 4096
#define KV_PLAN_MAX_GRIDS 64
#define KV_PLAN_MAX_METRICS 64
#define KV_PLAN_MAX_WINDOW (1 << 24) /* §6.10 */

/* ---- growable little-endian byte buffer (writer side) ---- */
typedef struct kv_buf {
    uint8_t *data;
    size_t size, cap;
    int failed; /* sticky: an allocation failed */
} kv_buf;
void kv_buf_free(kv_buf *b);
uint8_t *kv_buf_grow(kv_buf *b, size_t n); /* n more bytes (zeroed); NULL once failed */
void kv_buf_u32(kv_buf *b, uint32_t v);
void kv_buf_i32(kv_buf *b, int32_t v);
void kv_buf_u64(kv_buf *b, uint64_t v);
void kv_buf_f32(kv_buf *b, float v);
void kv_buf_f32s(kv_buf *b, const float *v, size_t n);
void kv_buf_f16s(kv_buf *b, const float *v, size_t n); /* each value's nearest f16, little-endian */
void kv_buf_bytes(kv_buf *b, const void *p, size_t n);
void kv_buf_str(kv_buf *b, const char *s); /* §1 str: u32 length + bytes (NULL = "") */

/* Required/optional feature bits the content of p uses (§4; the ZLIB bit is the writer's). */
uint64_t kv_plan_required_features(const kv_plan *p);
uint64_t kv_plan_optional_features(const kv_plan *p);

/* CRC-32 (zlib's crc32) of n bytes, any n. */
uint32_t kv_plan_crc32(const uint8_t *p, size_t n);

/* ---- the plan's codec table (plan_codecs.c): one row per method (§6.4) ----------------------------------
 * What the format knows of a method: its name, the feature bit it sets, which of a stream record's fields and
 * sections belong to it, its own validation rules, its bits per value, and its parameters that the stream owns
 * (copy and free). plan.c, plan_read.c, plan_write.c and plan_dump.c ask the row and never branch on the method.
 * Each row lives in its method's file (codec_fp.c, codec_uniform.c, codec_higgs.c, codec_float.c). */
typedef struct kv_plan_codec {
    const char *name;            /* kv_plan_method_name */
    uint64_t required_feature;   /* header bit set when a stream uses the method (§4), or 0 */
    int is_float;                /* an engine float format: the stream owns tensor scales (fp_scales, section FSCL) */
    int uses_grid;               /* higgs_grid names one of the plan's grids (section GRID) */
    int shares_codes;            /* the stream may reuse the previous layer's codes (XQuant, SHARED_CODES) */
    int squat_keys;              /* a key stream may be quantized by SQuat (section SQAT) */
    int takes_predictor;         /* the stream may have an AQUA-KV predictor (section PRED) */
    int takes_scale_dtype;       /* scale_dtype (f16 / f32) applies to its parameters */
    /* The method's own rules of a stream record (bits, groups, packing, its parameters), KV_EFORMAT naming the
     * layer, stream and field (kv_plan_stream_err). */
    kv_status (*validate)(const kv_plan *p, int l, int stream, const kv_plan_stream *s);
    /* Nominal bits per value (§9): codes + per-group parameters, as packed; 0 for a record that is not valid. */
    double (*bits)(const kv_plan *p, const kv_plan_stream *s);
    /* The parameters the stream owns (NULL: none): deep copy into dst (whose own are not set), and release. */
    kv_status (*copy_params)(kv_plan_stream *dst, const kv_plan_stream *src);
    void (*free_params)(kv_plan_stream *s);
} kv_plan_codec;
/* The row of a method, or NULL for a value that is not one. */
const kv_plan_codec *kv_plan_codec_of(int method);
extern const kv_plan_codec kv_plan_codec_fp, kv_plan_codec_uniform, kv_plan_codec_higgs, kv_plan_codec_fp8_e4m3,
    kv_plan_codec_fp8_e5m2, kv_plan_codec_nvfp4;
/* KV_EFORMAT "layer L K|V: message", raised at the caller's line (codec validation). */
kv_status kv_plan_stream_err(const char *file, int line, int layer, int stream, const char *fmt, ...) KV_PRINTF(5, 6);
#define KV_PLAN_SERR(...) kv_plan_stream_err(__FILE__, __LINE__, l, stream, __VA_ARGS__)
/* Bits per value of a B-bit code packed 32 / floor(32 / B) per word, or 11 per word (pack 3BIT_11). */
double kv_plan_code_bits_packed(int bits, int pack);
static inline int kv_plan_is_pow2(long v) { return v > 0 && (v & (v - 1)) == 0; }

/* §6.1 sanity of a fingerprint (KV_EFORMAT naming the field). */
kv_status kv_plan_fingerprint_validate(const kv_plan_fingerprint *f);

/* 1 when the n bytes at s are valid UTF-8 without NUL bytes. */
int kv_plan_utf8_valid(const char *s, size_t n);

/* A copy of s (NULL -> ""), or NULL when out of memory. */
char *kv_plan_strdup(const char *s);

#endif
