/* kv_plan.h — the compression plan (spec: formats/PLAN_FORMAT.md): the in-memory struct, its builders,
 * validation, bits accounting, and the binary reader and writer (plan.c, plan_read.c, plan_write.c: the
 * kvplan library, which needs only kv_common and zlib, so that an engine linking libkvrt gets the plan
 * format without the model readers, YAML or JSON of formats/). */
#ifndef KV_PLAN_H
#define KV_PLAN_H

#include <stddef.h>
#include <stdint.h>

#include "kv_common.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The plan is the contract between calibration (kvcal) and the runtime (kvrun, libkvrt): what each
 * layer's key and value streams are compressed with, the fitted parameters, the model it belongs to
 * and how it was made. On disk it is a versioned, little-endian, sectioned binary (PLAN_FORMAT.md);
 * in memory it is the transparent struct kv_plan below, whose arrays are owned by the plan
 * (malloc'd; kv_plan_free releases everything). Build one with kv_plan_create and the kv_plan_set_*
 * helpers (they copy their inputs), write it with kv_plan_write, read one with kv_plan_read.
 *
 * Indices: layers 0..n_layers-1; streams KV_PLAN_K (0) and KV_PLAN_V (1). kv_dim below means
 * fingerprint.n_kv_heads * fingerprint.head_dim. */
#define KV_PLAN_VERSION_MAJOR 1
#define KV_PLAN_VERSION_MINOR 5 /* what this reader knows; a writer writes the least minor that holds the
                                   content: 4 for a plan without attention windows (section WNDW, 1.5) */
#define KV_PLAN_MAX_PRED_INPUTS 8  /* PLAN_FORMAT.md §6.5 */

typedef enum kv_plan_stream_id { KV_PLAN_K = 0, KV_PLAN_V = 1 } kv_plan_stream_id;

/* How a stream is stored (PLAN_FORMAT.md §6.4). */
typedef enum kv_plan_method {
    KV_PLAN_FP = 0,      /* full precision: bits 16 (f16) or 32 (f32) */
    KV_PLAN_UNIFORM = 1, /* asymmetric min-max groups (KIVI) with XQuant eta, bits 1..8 */
    KV_PLAN_HIGGS = 2,   /* RHT + vector quantization on a Gaussian grid (AQUA-KV backbone) */
    /* 1.1: float formats of serving engines (kernels/FLOAT_KV.md), with f32 scales per tensor or per
     * KV head (kv_plan_stream.fp_scales) */
    KV_PLAN_FP8_E4M3 = 3, /* bits 8 */
    KV_PLAN_FP8_E5M2 = 4, /* bits 8 */
    KV_PLAN_NVFP4 = 5,    /* bits 4, group_size 16 (E4M3 block scales), group_axis channels */
    KV_PLAN_METHOD_COUNT  /* not a method: the number of methods (each has a row in the codec tables) */
} kv_plan_method;

/* Which way a uniform quantization group runs. */
typedef enum kv_plan_group_axis {
    KV_PLAN_GROUP_TOKENS = 0,  /* a group = group_size consecutive tokens of one channel (KIVI keys) */
    KV_PLAN_GROUP_CHANNELS = 1 /* a group = group_size consecutive channels of one token (KIVI values, HIGGS) */
} kv_plan_group_axis;

/* Code packing into 32-bit words. */
typedef enum kv_plan_pack {
    KV_PLAN_PACK_WORD = 0,   /* floor(32/B) B-bit codes per word, low bits first (3 bits: 10 per word) */
    KV_PLAN_PACK_3BIT_11 = 1 /* bits == 3 only: 11 codes per word, ten 3-bit + one 2-bit (kvmix eq. 12) */
} kv_plan_pack;

/* Token selection under a memory budget (quantized pruning). */
typedef enum kv_plan_prune {
    KV_PLAN_PRUNE_NONE = 0,
    KV_PLAN_PRUNE_STREAMINGLLM = 1, /* sinks + recent window */
    KV_PLAN_PRUNE_H2O = 2,          /* accumulated attention */
    KV_PLAN_PRUNE_SNAPKV = 3,       /* observation window, pooled attention scores */
    KV_PLAN_PRUNE_PYRAMIDKV = 4     /* SnapKV scores with per-layer budgets */
} kv_plan_prune;

/* The model a plan belongs to (PLAN_FORMAT.md §6.1). */
typedef struct kv_plan_fingerprint {
    char arch[32];           /* kv_arch.arch, NUL-terminated */
    int n_layers, d_model, n_heads, n_kv_heads, head_dim, vocab_size;
    float rope_theta;
    uint8_t kv_sha256[32];   /* SHA-256 over every layer's attn_k / attn_v tensors (§6.1.1) */
} kv_plan_fingerprint;

typedef struct kv_plan_global {
    int sinks;               /* first tokens kept in full precision (default 4) */
    int recent;              /* recent-token buffer kept in full precision (default 128) */
    kv_plan_prune prune_method;
    float prune_budget;      /* kept fraction of the fp16 cache, (0, 1]; 1 with PRUNE_NONE */
    int prune_window;        /* SnapKV/PyramidKV observation window (tokens) */
    int prune_pool;          /* pooling kernel of the scores (tokens, odd), 0 = none */
    uint64_t rht_seed;       /* seed of the HIGGS random signs (kv_rng_u64) */
} kv_plan_global;

/* A HIGGS grid: n points of dimension d, optimized for N(0, I_d). */
typedef struct kv_plan_grid {
    int d, n;
    float *points;           /* n*d values, point-major */
} kv_plan_grid;

/* One input block of a predictor: the reconstructed `stream` of `layer`. */
typedef struct kv_plan_pred_input {
    int layer;
    int stream;              /* kv_plan_stream_id */
} kv_plan_pred_input;

/* AQUA-KV linear predictor: y = W x + b, x = the inputs concatenated in order (each kv_dim wide). */
typedef struct kv_plan_predictor {
    int n_inputs;            /* 1..KV_PLAN_MAX_PRED_INPUTS */
    kv_plan_pred_input inputs[KV_PLAN_MAX_PRED_INPUTS];
    int out_dim;             /* kv_dim */
    int in_dim;              /* n_inputs * kv_dim */
    float *weight;           /* out_dim x in_dim, row-major */
    float *bias;             /* out_dim */
    int dtype;               /* (1.2) how the file stores weight and bias: KV_DTYPE_F32, or KV_DTYPE_F16
                                (then every value in memory is an f16 value: kv_plan_set_predictor_dtype
                                rounds them, so what the fit and the runtime use is what the file holds) */
    int rank;                /* (1.3) 0: weight is what the file holds; r >= 1: the file holds the factors
                                left (out_dim x r) and right (r x in_dim), W = left right, and `weight` is
                                their product (kv_plan_set_predictor_factors; f16 rules apply to the factors) */
    float *left, *right;     /* rank >= 1 only, row-major */
    int qbits;               /* (1.4) 0, or 4: the file holds GPTQ codes (PRED_Q4, aquakv.txt §4.1) and `weight` is
                                their value (kv_plan_pred_qvalue); such a predictor is f16 and full rank */
    int qgroup;              /* (1.4) columns per scale and offset (divides in_dim) */
    uint8_t *qcodes;         /* (1.4) out_dim x in_dim codes, 0..2^qbits-1, row-major */
    float *qscale, *qoffset; /* (1.4) out_dim x (in_dim / qgroup), f16 values */
} kv_plan_predictor;

/* SQuat key quantization parameters (key streams only). */
typedef struct kv_plan_squat {
    int r;                   /* query-subspace rank, 1..head_dim */
    float lambda;            /* >= 0 */
    int g;                   /* block of coordinates quantized at once; divides head_dim */
    float *basis;            /* optional static subspace: n_kv_heads x r x head_dim, or NULL */
    int static_subspace;     /* (1.2) 0, the paper's default: the subspace comes from each sequence's
                                prompt queries at prefill, the basis (when stored) is the fallback for
                                a prompt with fewer than r query rows; 1: the stored basis is used for
                                every sequence (no SVD at run time), so it needs a basis */
} kv_plan_squat;

typedef struct kv_plan_stream {
    kv_plan_method method;
    int bits;                /* FP: 16|32; UNIFORM: 1..8; HIGGS: 0 (log2(n)/d from the grid) */
    int group_size;          /* UNIFORM: values per group; HIGGS: RHT group (power of two); FP: 0 */
    kv_plan_group_axis group_axis;
    int scale_dtype;         /* KV_DTYPE_F16 or KV_DTYPE_F32: scale/zero (UNIFORM), norm (HIGGS) */
    float eta;               /* XQuant range shrink, [0, 0.5); 0 = plain KIVI */
    kv_plan_pack pack;
    int share_codes_with_layer; /* -1: own codes; else an earlier layer whose codes this stream reuses */
    int higgs_grid;          /* HIGGS: index into kv_plan.grids; otherwise -1 */
    int pre_rope;            /* K only: 1 when keys are compressed before RoPE */
    float rpc_ratio;         /* KVmix recent-pivotal-context fraction of the recent buffer, [0, 1] */
    kv_plan_predictor *predictor; /* NULL: none (kv_plan_set_predictor) */
    kv_plan_squat *squat;    /* NULL: none (kv_plan_set_squat; K only) */
    int n_fp_scales;         /* FP8 / NVFP4: 1 (per tensor) or n_kv_heads (per KV head); else 0 */
    float *fp_scales;        /* n_fp_scales finite values > 0 (kv_plan_set_fp_scales), or NULL */
} kv_plan_stream;

typedef struct kv_plan_layer {
    kv_plan_stream stream[2];   /* [KV_PLAN_K], [KV_PLAN_V] */
    float prune_budget;         /* per-layer budget (PyramidKV), (0, 1]; 0 = the global one */
    int window;                 /* (1.5) attention window of the layer: 0 = full attention; W >= 1: a query at
                                   position p sees the keys at positions p - W + 1 .. p only (sliding window,
                                   Gemma 3's local layers), so the runtime holds about W of its tokens
                                   (RUNTIME.md §11). Section WNDW; kvcal fit sets it from kv_arch_layer_window */
} kv_plan_layer;

/* How the plan was made. Strings are owned (NULL = empty). */
typedef struct kv_plan_provenance {
    char *tool_version;      /* "kvcal 0.1.0" */
    char *git_hash;
    char *corpus_sha256;     /* 64 lowercase hex digits or empty */
    uint64_t seed;
    int64_t created;         /* seconds since the Unix epoch (kv_plan_creation_time) */
    char *config_yaml;       /* the resolved configuration (kv_fit_config_dump) */
} kv_plan_provenance;

/* Per-layer calibration metrics: values[(layer*2 + stream)*n_metrics + m] (NaN = not measured). */
typedef struct kv_plan_report {
    int n_metrics;           /* 0: no report */
    char **names;            /* n_metrics names ("rel_mse", "explained_var", "quant_rel_err") */
    float *values;
} kv_plan_report;

/* Where the reader found things (filled by kv_plan_read*; zero for plans built in memory). */
typedef struct kv_plan_section_info {
    char tag[5];
    uint32_t flags;          /* KV_PLAN_SECTION_* */
    uint64_t offset, stored_size, size;
    uint32_t crc32;
    int known;               /* 0: an optional section this reader skipped */
} kv_plan_section_info;
#define KV_PLAN_SECTION_REQUIRED 0x1u
#define KV_PLAN_SECTION_ZLIB 0x2u

typedef struct kv_plan_file_info {
    int version_major, version_minor;
    uint64_t file_size;
    uint64_t required_features, optional_features;
    int n_sections;
    kv_plan_section_info *sections;
} kv_plan_file_info;

/* Feature bits of the header (PLAN_FORMAT.md §4). */
#define KV_PLAN_FEAT_ZLIB 0x1ull         /* required: a section is zlib-compressed */
#define KV_PLAN_FEAT_HIGGS 0x2ull        /* required: a stream uses HIGGS */
#define KV_PLAN_FEAT_PREDICTOR 0x4ull    /* required: a stream has an AQUA-KV predictor */
#define KV_PLAN_FEAT_SHARED_CODES 0x8ull /* required: a stream reuses another layer's codes */
#define KV_PLAN_FEAT_SQUAT 0x10ull       /* required: a key stream uses SQuat */
#define KV_PLAN_FEAT_PRUNING 0x20ull     /* required: token pruning is on */
#define KV_PLAN_FEAT_PACK3_11 0x40ull    /* required: a stream packs 3-bit codes 11 per word */
#define KV_PLAN_FEAT_FLOAT 0x80ull      /* required (1.1): a stream uses FP8 or NVFP4 */
#define KV_PLAN_FEAT_PRED_F16 0x200ull  /* required (1.2): a predictor is stored in f16 */
#define KV_PLAN_FEAT_SQUAT_STATIC 0x100ull /* required (1.2): a SQuat stream uses its stored basis for
                                              every sequence (older readers would compute the prompt's) */
#define KV_PLAN_FEAT_PRED_LOWRANK 0x400ull /* required (1.3): a predictor is stored as two low-rank factors */
#define KV_PLAN_FEAT_PRED_Q4 0x800ull /* required (1.4): a predictor is stored as GPTQ codes */
#define KV_PLAN_FEAT_WINDOW 0x1000ull /* required (1.5): a layer attends over a window (section WNDW) */
#define KV_PLAN_REQUIRED_KNOWN 0x1fffull
#define KV_PLAN_OPT_REPORT 0x1ull        /* optional: calibration report section present */
#define KV_PLAN_OPT_SQUAT_BASIS 0x2ull   /* optional: a static SQuat basis is stored */
#define KV_PLAN_OPT_PROVENANCE 0x4ull    /* optional: provenance section present */

typedef struct kv_plan {
    kv_plan_fingerprint fingerprint;
    kv_plan_global global;
    int n_grids;
    kv_plan_grid *grids;
    int n_layers;            /* == fingerprint.n_layers */
    kv_plan_layer *layers;
    kv_plan_provenance provenance;
    kv_plan_report report;
    kv_plan_file_info file;
} kv_plan;

/* A plan for the model described by fp with every stream in full precision (f16), default global
 * settings and nothing fitted. KV_EINVAL when the fingerprint is not sane. */
kv_status kv_plan_create(kv_plan **out, const kv_plan_fingerprint *fp);
void kv_plan_free(kv_plan *p);

/* Set (replace) the predictor of (layer, stream); weight is kv_dim x (n_inputs*kv_dim) row-major,
 * bias kv_dim (NULL = zeros). Inputs are checked as kv_plan_validate would. Copies everything. */
kv_status kv_plan_set_predictor(kv_plan *p, int layer, int stream, int n_inputs,
                                const kv_plan_pred_input *inputs, const float *weight,
                                const float *bias);
/* Set (replace) the SQuat parameters of layer's key stream; basis (n_kv_heads*r*head_dim) or NULL.
 * static_subspace starts at 0 (prompt subspace); set the field afterwards for the static variant. */
kv_status kv_plan_set_squat(kv_plan *p, int layer, int r, float lambda, int g, const float *basis);
/* Set (replace) the tensor scales of an FP8 / NVFP4 stream: n = 1 (per tensor) or n_kv_heads
 * (per KV head), each finite and > 0; copied. The stream's method must already be FP8 or NVFP4. */
/* How the predictor of (layer, stream) is stored: KV_DTYPE_F32 or KV_DTYPE_F16. F16 rounds its weight
 * and bias to the nearest f16 in place; a value beyond the f16 range (|x| > 65504) is KV_EINVAL. */
kv_status kv_plan_set_predictor_dtype(kv_plan *p, int layer, int stream, int dtype);
/* (1.3) Store the predictor of (layer, stream) as rank-r factors: W = left (out_dim x r) right (r x in_dim),
 * copied; `weight` becomes their product (double sums over k in order, rounded once to f32, the same on
 * every machine: validation recomputes it). 1 <= r <= min(out_dim, in_dim). A predictor stored in f16 has
 * its factors rounded (kv_plan_set_predictor_dtype, before or after). */
kv_status kv_plan_set_predictor_factors(kv_plan *p, int layer, int stream, int rank, const float *left,
                                        const float *right);
/* The product of a low-rank predictor's factors into its weight (no-op for rank 0). */
void kv_plan_predictor_expand(kv_plan_predictor *pr);
/* (1.4) A quantized predictor weight: scale * code + offset, formed in double (exact: f16 scale and offset, a
 * code below 256) and rounded once to f32, so the fit, the writer's validation and every reader hold the same
 * weight whatever the compiler contracts. */
static inline float kv_plan_pred_qvalue(float scale, float offset, int code) {
    return (float)((double)scale * (double)code + (double)offset);
}
/* (1.4) Store the predictor of (layer, stream) as `bits`-bit codes (GPTQ, calib/gptq.c): codes out_dim x in_dim
 * (0..2^bits-1), scale and offset out_dim x (in_dim / group) f16 values, copied; `weight` becomes their values
 * (kv_plan_pred_qvalue); the predictor is f16 (its bias rounded), full rank. bits 4 only (the paper's GPTQ). */
kv_status kv_plan_set_predictor_quantized(kv_plan *p, int layer, int stream, int bits, int group,
                                          const uint8_t *codes, const float *scale, const float *offset);
kv_status kv_plan_set_fp_scales(kv_plan *p, int layer, int stream, int n, const float *scales);
/* 1 when the method is one of the float formats (FP8 E4M3, E5M2, NVFP4). */
int kv_plan_method_is_float(int method);
/* Append a grid (points n*d copied); its index goes to *index (may be NULL). */
kv_status kv_plan_add_grid(kv_plan *p, int d, int n, const float *points, int *index);
/* Copy stream (layer, stream) of src into the same place of dst, deeply: its scalar fields, its HIGGS grid (found
 * among dst's grids by value, else appended), its method's parameters (the codec's copy), its SQuat parameters
 * (keys), and with KV_PLAN_COPY_PREDICTOR its predictor (without it, a stream with a predictor is refused:
 * KV_EUNSUPPORTED). Whatever dst's stream owned is released first. The plans must be of one model shape; whether
 * the copied stream makes sense beside dst's other streams (a shared-codes partner, global settings) is the
 * caller's policy (calib/search.c). */
#define KV_PLAN_COPY_PREDICTOR 1u
kv_status kv_plan_stream_copy(kv_plan *dst, const kv_plan *src, int layer, int stream, unsigned flags);
/* Replace the provenance with a deep copy of src (its NULL strings become empty). */
kv_status kv_plan_set_provenance(kv_plan *p, const kv_plan_provenance *src);
/* Replace the report: names[n_metrics], values[n_layers*2*n_metrics] copied; n_metrics 0 clears it. */
kv_status kv_plan_set_report(kv_plan *p, int n_metrics, const char *const *names, const float *values);

/* Every rule of PLAN_FORMAT.md §6 (ranges, enums, cross references, dimensions). KV_EFORMAT with a
 * message naming the layer, stream and field. kv_plan_write and kv_plan_read both apply it. */
kv_status kv_plan_validate(const kv_plan *p);

/* Nominal bits per value of (layer, stream): codes + scales/zeros (or norms) per value, as packed.
 * Full-precision tokens (sinks, recent buffer) and predictor weights are not included: they depend
 * on the sequence length (kv_plan_predictor_bytes gives the latter). Shared codes count 0 bits. */
double kv_plan_stream_bits(const kv_plan *p, int layer, int stream);
/* 1 when some layer of the plan has an attention window (kv_plan_layer.window > 0). */
int kv_plan_has_windows(const kv_plan *p);

/* Bytes of predictor weights and biases over the whole plan, as stored (f16 or f32). */
uint64_t kv_plan_predictor_bytes(const kv_plan *p);
/* ... of (layer, stream) alone, as stored (f16 or f32); 0 without a predictor. */
uint64_t kv_plan_stream_predictor_bytes(const kv_plan *p, int layer, int stream);
/* Bytes of stored SQuat bases (f32, n_kv_heads x r x head_dim per key stream that has one) over the whole
 * plan: like predictor weights, the runtime holds them once, whatever the sequence length, and the honest
 * bits count them (kv_rt_stats.basis_bytes). */
uint64_t kv_plan_basis_bytes(const kv_plan *p);
/* ... of (layer, stream) alone; 0 without a stored basis (and always for V). */
uint64_t kv_plan_stream_basis_bytes(const kv_plan *p, int layer, int stream);

/* Creation time for provenance: $SOURCE_DATE_EPOCH when set (reproducible builds; KV_EINVAL if it
 * is not a non-negative integer), else the current time. */
kv_status kv_plan_creation_time(int64_t *out);

typedef struct kv_plan_write_options {
    int compress;            /* 1: zlib-compress sections of at least compress_min bytes when that
                                makes them smaller; 0: never */
    size_t compress_min;     /* 0 = 4096 */
} kv_plan_write_options;
/* Serialize (opt NULL = compress on, defaults). The same plan and options give the same bytes
 * (with the same zlib when compressing). Validates first. Caller frees *out with free(). */
kv_status kv_plan_write_memory(uint8_t **out, size_t *size, const kv_plan *p,
                               const kv_plan_write_options *opt);
/* Serialize and write atomically (path.tmp.<pid>, fsync, rename). */
kv_status kv_plan_write(const kv_plan *p, const char *path, const kv_plan_write_options *opt);

/* Read and validate a plan. KV_EFORMAT (malformed), KV_EVERSION (newer major version, unknown
 * required feature or section), KV_ECHECKSUM (CRC mismatch), KV_EIO, KV_ENOMEM; the message names
 * the file, the section and the field. Unknown optional sections are skipped (file.sections lists
 * them with known = 0). On failure *out is NULL. */
kv_status kv_plan_read(kv_plan **out, const char *path);
/* The same over bytes in memory (borrowed; not needed after the call). */
kv_status kv_plan_read_memory(kv_plan **out, const void *data, size_t size);

/* KV_OK when the plan was made for this model; KV_EMISMATCH naming the first field that differs. */
kv_status kv_plan_check_fingerprint(const kv_plan *p, const kv_plan_fingerprint *model);

/* Names of enum values ("uniform", "tokens", "snapkv", "f16", "K"); NULL for unknown values. */
const char *kv_plan_method_name(int method);
/* The method named `name` ("uniform", "nvfp4", ...), or -1. */
int kv_plan_method_from_name(const char *name);
const char *kv_plan_axis_name(int axis);
const char *kv_plan_pack_name(int pack);
const char *kv_plan_prune_name(int prune);
const char *kv_plan_stream_name(int stream);

/* The whole plan as text: YAML (json = 0) or JSON (json = 1). full = 1 includes every array
 * (grid points, predictor matrices, SQuat bases); otherwise arrays are summarized (shape, norm).
 * Caller frees *out. */
kv_status kv_plan_dump(char **out, const kv_plan *p, int json, int full);

#ifdef __cplusplus
}
#endif
#endif /* KV_PLAN_H */
