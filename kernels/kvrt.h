/* kvrt.h — the public header of kernels/ (libkvrt): KV quantizers, packers, bits accounting.
 *
 * Quantizers (DESIGN.md §4):
 *   - uniform asymmetric min-max (KIVI) with XQuant's eta calibration, 1/2/3/4/8 bits, groups along
 *     tokens (keys, "per-channel") or along channels (values, "per-token");
 *   - HIGGS: randomized Hadamard transform + per-group L2 norm + nearest point of a Gaussian grid;
 *   - SQuat: block-sequential key quantization that keeps the error away from a query subspace;
 *   - XQuant shared codes: a layer decodes another layer's codes with its own scale and zero point.
 *
 * Every quantizer has a CPU reference (`_ref`) and a CUDA version (`_cuda`, declared always, defined
 * only in CUDA builds of libkvrt, which then define KV_HAVE_CUDA=1). The element math of both
 * is in kv_quant_math.h. `_ref` functions take host pointers; `_cuda` functions take device pointers
 * (grids and weights included) and a stream (NULL = the default stream) and may allocate temporary
 * device memory on that stream; they synchronize the stream before returning a status.
 *
 * Data: a block is a row-major f32 matrix x[tokens][channels] (one KV head, or several heads side by
 * side). Buffers are owned by the caller; the *_storage() functions say how large they must be.
 *
 * Packed code layout (every quantizer): the codes of a block form one stream; stream position j is
 * stored in 32-bit word j / per_word at slot j % per_word, slot s occupying bits [s*w, s*w + w)
 * (w = code width), with per_word = floor(32 / w) (3 bits: 10 per word) or, for the KVmix layout,
 * 11 per word: slots 0..9 are 3 bits wide and slot 10 (bits 30..31) is 2 bits wide; the quantizer
 * clamps a code that lands in slot 10 to 3 (kvmix.txt eq. 12). Unused trailing slots are zero.
 *   - uniform, groups along channels: stream position = t * channels + c (memory order);
 *   - uniform, groups along tokens: token groups of G rows (the last may be shorter, Gs rows); inside
 *     token group k the stream holds channel 0's Gs codes, then channel 1's, ...:
 *     position = k*G*channels + c*Gs + i for token t = k*G + i;
 *   - HIGGS: one index per d-dimensional piece, in memory order (piece p = (t*channels + c) / d),
 *     width log2(n) bits.
 * Scale/zero (uniform) and norm (HIGGS) arrays hold one value per group, f16 or f32 (little-endian
 * as in memory on the supported little-endian hosts), in group order:
 *   - groups along channels: group = t * ceil(channels / G) + c / G;
 *   - groups along tokens:   group = (t / G) * channels + c;
 *   - HIGGS: group = (t * channels + c) / g.
 *
 * Errors: functions return KV_OK or a negative kv_status and record a message (kv_error_last()).
 * Non-finite input values give KV_ENUMERIC.
 */
#ifndef KVRT_H
#define KVRT_H

#include "kv_common.h"
#include "kv_plan.h"

#ifdef __cplusplus
extern "C" {
#endif

/* cudaStream_t without including CUDA headers (the runtime's type is `struct CUstream_st *`). */
typedef struct CUstream_st *kv_stream;

/* ---- descriptors --------------------------------------------------------------------------- */
typedef enum kv_axis {
    KV_AXIS_TOKENS = 0,   /* groups of G consecutive tokens of one channel (keys, "per-channel") */
    KV_AXIS_CHANNELS = 1  /* groups of G consecutive channels of one token (values, "per-token") */
} kv_axis;

typedef enum kv_param_type { KV_PARAM_F32 = 0, KV_PARAM_F16 = 1 } kv_param_type;

/* Uniform asymmetric quantizer: z = min, s = (max - min) / (2^B - 1), code = clamp(round((x - z)/s));
 * stored (XQuant) z' = z + eta*s*(2^B - 1), s' = (1 - 2 eta) s; decode x = code * s' + z'. */
typedef struct kv_uniform {
    int bits;                 /* 1, 2, 3, 4 or 8 */
    int group;                /* G >= 1 */
    kv_axis axis;
    kv_param_type param_type; /* storage of s' and z' */
    int pack11;               /* bits == 3 only: KVmix 11-per-word layout */
    float eta;                /* XQuant calibration, 0 <= eta < 0.5; 0 = plain KIVI */
} kv_uniform;

/* Optional CPU accelerator for nearest-grid-point search (d = 1 or 2): a bucket table of candidate
 * points. It returns exactly the exhaustive search's index (same distances, same tie rule). */
typedef struct kv_grid_search kv_grid_search;
kv_status kv_grid_search_create(kv_grid_search **out, const float *grid, int d, int n);
void kv_grid_search_free(kv_grid_search *s);
/* Index of the grid point nearest to u[d]; ties go to the lowest index. */
int kv_grid_search_nearest(const kv_grid_search *s, const float *u);
/* The same for n queries u[p*d .. p*d + d) (batched: faster per query for d = 2). */
void kv_grid_search_nearest_many(const kv_grid_search *s, uint8_t *out, const float *u, size_t n);
int kv_grid_search_dim(const kv_grid_search *s);
int kv_grid_search_size(const kv_grid_search *s);

/* HIGGS vector quantizer over groups of g consecutive channels of one token. */
typedef struct kv_higgs {
    int dim;                  /* grid dimension d: 1, 2, 4 or 8 */
    int size;                 /* grid size n: power of two, 2..256 */
    int group;                /* g: power of two, d <= g <= 4096; channels must be a multiple */
    kv_param_type norm_type;  /* storage of the per-group L2 norm */
    uint64_t seed;            /* sign of channel c = bit 0 of kv_rng_u64(seed, channel0 + c): 1 -> -1 */
    const float *grid;        /* n*d points, point i at grid[i*d .. i*d + d); borrowed */
    const kv_grid_search *search; /* optional (CPU only), built from the same grid; NULL = exhaustive */
    uint64_t channel0;        /* index of the block's first channel in the token vector: channel c of the block
                                 takes the sign of channel channel0 + c, so a block holding one KV head's channels
                                 (token pruning keeps tokens per head) is coded exactly as those channels of a
                                 whole-token block; 0 for whole tokens */
} kv_higgs;

/* Float KV formats as serving engines hold them (FLOAT_KV.md): FP8 E4M3 / E5M2 elements with one f32
 * scale per tensor or per KV head (x ~ fp8(x / s) * s), and NVFP4: E2M1 elements in blocks of
 * KV_NVFP4_BLOCK consecutive channels of one token, one E4M3 scale per block, under the f32 scale
 * (x ~ e2m1 * e4m3(block) * s). Element rules (rounding, saturation, NaN): kv_quant_math.h. */
typedef enum kv_fp_format { KV_FP_E4M3 = 0, KV_FP_E5M2 = 1, KV_FP_NVFP4 = 2 } kv_fp_format;
#define KV_NVFP4_BLOCK 16

typedef struct kv_fpq {
    kv_fp_format format;
    int n_scales;         /* 1 (per tensor) or channels / scale_channels (per KV head) */
    int scale_channels;   /* channels per scale when n_scales > 1 (head_dim); NVFP4: a multiple of 16 */
    const float *scales;  /* n_scales finite values > 0 (borrowed; device pointer for _cuda calls) */
} kv_fpq;

typedef enum kv_quant_kind {
    KV_QUANT_F16 = 0,     /* unquantized, 16 bits per value (sinks, recent window) */
    KV_QUANT_UNIFORM = 1, /* also SQuat keys (same storage) */
    KV_QUANT_HIGGS = 2,
    KV_QUANT_FP = 3       /* FP8 / NVFP4 (kv_fpq) */
} kv_quant_kind;

typedef struct kv_quant {
    kv_quant_kind kind;
    kv_uniform uniform;   /* KV_QUANT_UNIFORM */
    kv_higgs higgs;       /* KV_QUANT_HIGGS */
    kv_fpq fp;            /* KV_QUANT_FP */
    int shared_codes;     /* uniform only: codes are another layer's (XQuant), none stored here */
} kv_quant;

/* Exact storage of one compressed block; every report uses these numbers. */
typedef struct kv_block_storage {
    uint64_t values;      /* tokens * channels */
    uint64_t groups;      /* scale/zero or norm entries */
    uint64_t code_words;  /* u32 words of packed codes or indices */
    uint64_t code_bytes;  /* 4 * code_words */
    uint64_t scale_bytes; /* uniform scales */
    uint64_t zero_bytes;  /* uniform zero points */
    uint64_t norm_bytes;  /* HIGGS norms; NVFP4: its E4M3 block scales (1 byte per block) */
    uint64_t raw_bytes;   /* KV_QUANT_F16: 2 * values */
    uint64_t total_bytes; /* sum of the above */
    uint64_t total_bits;  /* 8 * total_bytes */
    double bits_per_value; /* total_bits / values (0 when values == 0) */
} kv_block_storage;

/* Validate a descriptor (KV_EINVAL with a message naming the field). */
kv_status kv_uniform_check(const kv_uniform *q);
kv_status kv_higgs_check(const kv_higgs *h);  /* grid may be NULL here */

/* Bits accounting: storage of a block of tokens x channels under q. */
kv_status kv_quant_storage(kv_block_storage *out, const kv_quant *q, size_t tokens, size_t channels);

/* ---- packing --------------------------------------------------------------------------------- */
/* Codes per 32-bit word for a width of 1..8 bits (pack11: 11 for width 3). 0 for a bad width. */
int kv_pack_per_word(int bits, int pack11);
/* Words needed for n codes. */
size_t kv_pack_words(size_t n, int bits, int pack11);
/* Pack n codes (each < 2^bits, and < 4 in slot 10 of the 11-per-word layout; higher bits are
 * masked off) into kv_pack_words() words; trailing slots are zero. */
kv_status kv_pack_ref(uint32_t *words, const uint8_t *codes, size_t n, int bits, int pack11);
kv_status kv_unpack_ref(uint8_t *codes, const uint32_t *words, size_t n, int bits, int pack11);

/* ---- uniform quantizer ------------------------------------------------------------------------- */
/* Encode x[tokens][channels]. codes: kv_block_storage.code_words words, or NULL to compute only
 * the scale and zero point (XQuant shared codes: this layer decodes another layer's codes).
 * scales, zeros: groups entries of param_type each. */
kv_status kv_uniform_encode_ref(uint32_t *codes, void *scales, void *zeros, const kv_uniform *q,
                                size_t tokens, size_t channels, const float *x);
/* Decode into x_hat[tokens][channels]. For shared codes pass the other layer's codes with this
 * layer's scales and zeros (both layers must use the same q apart from eta and param_type). */
kv_status kv_uniform_decode_ref(float *x_hat, const kv_uniform *q, size_t tokens, size_t channels,
                                const uint32_t *codes, const void *scales, const void *zeros);
/* Attention scores over a compressed key block: scores[t] = sum_c query[c] * x_hat[t][c]
 * (summed over c in order), without materializing x_hat. */
kv_status kv_uniform_scores_ref(float *scores, const kv_uniform *q, size_t tokens, size_t channels,
                                const uint32_t *codes, const void *scales, const void *zeros,
                                const float *query);

/* ---- HIGGS ------------------------------------------------------------------------------------- */
/* Normalized fast Walsh-Hadamard transform in place (n a power of two): v <- H v / sqrt(n), with
 * H the Sylvester Hadamard matrix H[i][j] = (-1)^popcount(i & j). */
kv_status kv_fwht_ref(float *v, size_t n);
/* Sign (+1/-1) of channel c under seed. */
float kv_higgs_sign(uint64_t seed, size_t c);
/* Encode x[tokens][channels] (channels % g == 0): indices packed at log2(n) bits (code_words words),
 * norms one per group. */
kv_status kv_higgs_encode_ref(uint32_t *indices, void *norms, const kv_higgs *h, size_t tokens,
                              size_t channels, const float *x);
kv_status kv_higgs_decode_ref(float *x_hat, const kv_higgs *h, size_t tokens, size_t channels,
                              const uint32_t *indices, const void *norms);
/* scores[t] = query . x_hat[t], computed in the rotated domain (the query is rotated once). */
kv_status kv_higgs_scores_ref(float *scores, const kv_higgs *h, size_t tokens, size_t channels,
                              const uint32_t *indices, const void *norms, const float *query);

/* ---- FP8 / NVFP4 ---------------------------------------------------------------------------------
 * Codes: one per value at stream position t * channels + c, 8 bits (FP8, 4 per word) or 4 bits
 * (NVFP4, 8 per word), packed as above. NVFP4 block scales: one E4M3 byte per block of 16 channels
 * of a token (the last block of a token may be shorter), block = t * ceil(channels / 16) + c / 16. */
/* Validate q for rows of `channels` values (KV_EINVAL naming the field). */
kv_status kv_fpq_check(const kv_fpq *q, size_t channels);
/* Encode x[tokens][channels]: codes (code_words words), bscales (NVFP4: groups bytes; FP8: unused,
 * may be NULL). Non-finite input: KV_ENUMERIC. */
kv_status kv_fpq_encode_ref(uint32_t *codes, uint8_t *bscales, const kv_fpq *q, size_t tokens, size_t channels,
                            const float *x);
kv_status kv_fpq_decode_ref(float *x_hat, const kv_fpq *q, size_t tokens, size_t channels, const uint32_t *codes,
                            const uint8_t *bscales);
/* The squared error of n consecutive values of one token quantized under tensor scale `scale`, added to *acc: FP8
 * adds each value's in order; NVFP4 takes one block (n <= 16 channels, its E4M3 block scale from its own largest
 * magnitude) and adds the block's sum. The element math of kv_fpq_encode_ref, for calibration's scale search
 * (calib/fit_float.c) without the quantizer's private header. */
void kv_fpq_sse_add(double *acc, kv_fp_format format, const float *x, int n, float scale);

/* ---- SQuat key quantization -------------------------------------------------------------------- */
/* Query subspace of one KV head: qhat[r][d] = diag(sigma[:r]) V[:r] from the SVD of the stacked
 * queries[n][d] (all query heads of the group, all prompt tokens). Requires 1 <= r <= min(n, d).
 * Rows are defined up to sign; qhat^T qhat is unique when sigma_r > sigma_{r+1}. */
kv_status kv_squat_subspace_ref(float *qhat, const float *queries, size_t n, int d, int r);

/* Precomputed SQuat state for one head (P_inv, the A_t^-1 chain, and the update matrices
 * W_t = B_t H_t of Lemma 2 for every block boundary). Owned by the caller; kv_squat_free(NULL) ok. */
typedef struct kv_squat kv_squat;
kv_status kv_squat_create(kv_squat **out, const float *qhat, int r, int d, float lambda, int block);
void kv_squat_free(kv_squat *s);
int kv_squat_dim(const kv_squat *s);
int kv_squat_block(const kv_squat *s);
/* The update matrices, concatenated: for block t = 1..T-1 (block t ends at channel e_t = min(t*g, d)
 * and has g_t channels), a (d - e_t) x g_t row-major matrix. Borrowed. */
const float *kv_squat_weights(const kv_squat *s, size_t *count);
/* P_inv = (I + lambda qhat^T qhat)^-1, d x d row-major, double precision. Borrowed. */
const double *kv_squat_pinv(const kv_squat *s);
/* Lemma 2 update for one token: given the block ending at e_t (1 <= t < T) and err[g_t] =
 * deq(qtz(k_block)) - k_block, add W_t err to rest[d - e_t]. */
kv_status kv_squat_update_ref(float *rest, const kv_squat *s, int t, const float *err);
/* Quantize keys x[tokens][d] (d = kv_squat_dim) block by block along channels with error
 * propagation; q->axis must be KV_AXIS_TOKENS. Output layout = kv_uniform_encode_ref's; decode with
 * kv_uniform_decode_ref. With lambda = 0 the result equals kv_uniform_encode_ref's exactly. */
kv_status kv_squat_encode_ref(uint32_t *codes, void *scales, void *zeros, const kv_squat *s,
                              const kv_uniform *q, size_t tokens, const float *x);

/* ---- CUDA (libkvrt built with CUDA) ---------------------------------------------------------------- */
/* 1 if a CUDA device is usable, 0 if not (no driver, no device); never fails. */
int kv_cuda_available(void);
kv_status kv_pack_cuda(uint32_t *words, const uint8_t *codes, size_t n, int bits, int pack11,
                       kv_stream stream);
kv_status kv_uniform_encode_cuda(uint32_t *codes, void *scales, void *zeros, const kv_uniform *q,
                                 size_t tokens, size_t channels, const float *x, kv_stream stream);
kv_status kv_uniform_decode_cuda(float *x_hat, const kv_uniform *q, size_t tokens, size_t channels,
                                 const uint32_t *codes, const void *scales, const void *zeros,
                                 kv_stream stream);
kv_status kv_uniform_scores_cuda(float *scores, const kv_uniform *q, size_t tokens, size_t channels,
                                 const uint32_t *codes, const void *scales, const void *zeros,
                                 const float *query, kv_stream stream);
/* h->grid is a device pointer here. */
kv_status kv_higgs_encode_cuda(uint32_t *indices, void *norms, const kv_higgs *h, size_t tokens,
                               size_t channels, const float *x, kv_stream stream);
kv_status kv_higgs_decode_cuda(float *x_hat, const kv_higgs *h, size_t tokens, size_t channels,
                               const uint32_t *indices, const void *norms, kv_stream stream);
kv_status kv_higgs_scores_cuda(float *scores, const kv_higgs *h, size_t tokens, size_t channels,
                               const uint32_t *indices, const void *norms, const float *query,
                               kv_stream stream);
/* q->scales is a device pointer here. */
kv_status kv_fpq_encode_cuda(uint32_t *codes, uint8_t *bscales, const kv_fpq *q, size_t tokens, size_t channels,
                             const float *x, kv_stream stream);
kv_status kv_fpq_decode_cuda(float *x_hat, const kv_fpq *q, size_t tokens, size_t channels, const uint32_t *codes,
                             const uint8_t *bscales, kv_stream stream);
/* cuSOLVER gesvd on device queries[n][d] -> device qhat[r][d] (float precision). */
kv_status kv_squat_subspace_cuda(float *qhat, const float *queries, size_t n, int d, int r,
                                 kv_stream stream);
/* s is the host object (its weights are copied to the device on the stream); x, outputs: device. */
kv_status kv_squat_encode_cuda(uint32_t *codes, void *scales, void *zeros, const kv_squat *s,
                               const kv_uniform *q, size_t tokens, const float *x, kv_stream stream);

/* ---- plan streams (kv_stream.c) ---------------------------------------------------------------
 * The bridge from a plan's stream records (kv_formats.h §5) to the quantizers above, shared by
 * calibration and the compressed cache so that both compress residuals identically. */
/* The quantizer of (layer, stream): grids borrowed from the plan, HIGGS signs from the plan's
 * rht_seed, search accelerator NULL (attach one with kv_grid_search_create if wanted). */
kv_status kv_quant_from_plan(kv_quant *out, const kv_plan *p, int layer, int stream);
/* Compress and decompress x[tokens][channels] into x_hat (same shape), returning the exact storage
 * of the compressed block in *st (may be NULL). KV_QUANT_F16 rounds to binary16. Streams that reuse
 * another layer's codes are KV_EUNSUPPORTED here. */
kv_status kv_quant_roundtrip(float *x_hat, kv_block_storage *st, const kv_quant *q, size_t tokens,
                             size_t channels, const float *x);
/* AQUA-KV predictor: y[t] = W [inputs[0][t]; inputs[1][t]; ...] + b for t < tokens, every input
 * and y being tokens x kv_dim row-major. */
kv_status kv_predictor_apply(float *y, const kv_plan_predictor *pr, const float *const *inputs,
                             size_t tokens, int kv_dim);

/* ---- the engine-facing runtime (rt/; RUNTIME.md) ----------------------------------------------
 * What an inference engine links to apply a plan: it holds each sequence's KV cache compressed as the
 * plan says (sinks and a recent window in f16, older tokens in the plan's codes) and computes
 * attention from that form, so the cache costs the memory the plan promises. No dependency on the
 * reference model (model/ adapts its KV-cache interface to this API, not the other way round).
 *
 * Calling order, per sequence and forward step (what a transformer does anyway): for layer
 * l = 0 .. L-1: kv_rt_append(l, seq, n new tokens), then kv_rt_attend(l, seq, the same step's query
 * rows). Every layer receives the same n and positions, which continue the sequence (pos[i] ==
 * kv_rt_length(seq) + i). Sequences are independent and may interleave.
 *
 * Cache semantics (RUNTIME.md §2, DESIGN.md §4): per sequence the first `sinks` tokens stay in f16;
 * later tokens enter a recent window (f16); at the start of an append, while the window holds
 * >= `recent` tokens, its oldest `recent` tokens are compressed as one chunk, layer 0 first, through
 * the stream's predictor (AQUA-KV, from the previous layers' reconstructions of the same chunk) and
 * quantizer; a stream with a KVmix rpc_ratio keeps floor(ratio * window) of its window instead.
 * Attention of a step's query i covers every token held up to its own position (causal).
 *
 * Attention windows (plans of format 1.5, kv_plan_layer.window = W > 0; RUNTIME.md §11): a query at position p of
 * such a layer sees positions p - W + 1 .. p only, and before an append the layer drops what no query of the
 * step sees any more (its sinks, whole blocks, window rows), so it holds about W tokens; the statistics count what
 * is held. A windowed layer whose tokens other streams read (a predictor's input, XQuant pairs) is masked only.
 *
 * Token pruning (plans with a prune_method; RUNTIME.md §8): a sequence's first tokens are its prompt, held
 * in f16 (nothing is compressed while it is open) until kv_rt_end_prompt (or the first append of a single
 * token, which ends it first). Then, per layer and KV head, the token policy keeps the sinks, the last
 * prune_window tokens and the tokens it selects (StreamingLLM: the most recent; H2O: by the attention
 * they received from every prompt query; SnapKV: by the pooled attention of the last prune_window
 * queries; PyramidKV: SnapKV's scores under per-layer budgets falling with depth), as many as the
 * layer's budget (a fraction of the prompt's f16 cache) pays for at the plan's honest bits plus 4 bytes
 * of position per kept token, head and stream; the kept tokens are coded by the layer's quantizer in blocks one
 * KV head wide, the rest is dropped. Later tokens follow the semantics above (H2O also selects, at the
 * same budget, among each chunk leaving the window, by the attention it received meanwhile). Attention
 * covers the tokens a head holds; the step's own tokens are always held.
 *
 * Ownership and threads: the plan is borrowed and must outlive the runtime. A runtime is used by one
 * thread at a time (calls are not concurrent); inside a call it uses its own thread pool
 * (kv_rt_options.n_threads). Different runtimes are independent. Every buffer a sequence holds is
 * allocated exactly (kv_rt_stats says how many bytes, and which part is the accounted payload). */
typedef struct kv_rt kv_rt;

/* Devices (RUNTIME.md §10). On KV_RT_DEVICE_CUDA the cache lives in GPU memory and the float arrays every call
 * takes (k_pre, k, v, q, out) are device pointers, while positions (pos) and sequence lists stay on the host;
 * the device work is ordered on one stream (kv_rt_options.stream, kv_rt_stream). Opening one runs a
 * self-check the first time each kind of codec is seen in the process (kv_rt_selfcheck); a disagreement
 * between the CPU and the GPU fails the open with the codec and the size of the difference.
 * KV_RT_DEVICE_CUDA_MODEL is the same backend with its kernels run on the CPU by their host model (host
 * pointers): what tests and the self-check compare the GPU with. Not on a device yet (KV_EUNSUPPORTED at
 * open): token pruning, prompt statistics, HIGGS groups spanning heads, head_dim above 256, layers' attention windows. */
typedef enum kv_rt_device {
    KV_RT_DEVICE_CPU = 0,
    KV_RT_DEVICE_CUDA = 1,
    KV_RT_DEVICE_CUDA_MODEL = 2
} kv_rt_device;

typedef struct kv_rt_options {
    kv_rt_device device;
    int n_seqs;            /* sequence slots, 1..4096 */
    int n_heads;           /* query heads per layer: a multiple of the plan's n_kv_heads (GQA) */
    int capacity;          /* tokens per sequence at most; 0 = no limit (appends beyond: KV_EINVAL) */
    int n_threads;         /* threads of the runtime's pool; 0 = kv_default_threads() */
    kv_pool *pool;         /* run on this thread pool instead (borrowed, outlives the runtime; the engine's
                              own, so that one set of threads serves both); NULL: a pool of n_threads */
    float scale;           /* softmax scale of q.k; 0 = 1/sqrt(head_dim) */
    /* The model's RoPE, needed when a stream stores keys before RoPE (pre_rope): angle of pair i at
     * position p = p * rope_inv_freq[i] (head_dim/2 values, copied), pairs (2i, 2i+1) for
     * KV_ROPE_ADJACENT or (i, i + head_dim/2) for KV_ROPE_HALF. NULL: such plans are refused. */
    const double *rope_inv_freq;
    int rope_layout;       /* kv_rope_layout */
    /* The RoPE frequencies of the layers with an attention window (plan 1.5), when they have their own base (Gemma 3's
     * local layers: rope_local_base_freq), head_dim/2 values, copied; NULL: rope_inv_freq for every layer. */
    const double *rope_inv_freq_local;
    /* AQUA-KV streams (RUNTIME.md §6): 0 (default) rebuilds each predicted stream's reconstruction at
     * every step and drops it when no later layer needs it (memory: the compressed cache plus about
     * two layers' reconstructions); 1 keeps every reconstruction and extends it chunk by chunk
     * (no per-step predictor cost, but an f32 copy of the predicted streams is held). */
    int keep_reconstructions;
    /* Prompt statistics whatever the plan's prune method (for kv_rt_prompt_copy: one prefill, several plans
     * applied to it): 1 holds every prompt in f16 until kv_rt_end_prompt, accumulates the attention every
     * token receives (what H2O selects by) and keeps the prompt's last prompt_window queries (SnapKV,
     * PyramidKV; 0 = the plan's prune_window). 0 (default): what the plan's own policy needs. */
    int prompt_stats;
    int prompt_window;
    /* KV_RT_DEVICE_CUDA: the stream every device operation of the runtime is ordered on (borrowed: the engine's
     * own, so that the keys, values and queries it computes are ready when the runtime reads them, and its next
     * kernels see the outputs); NULL: a stream of the runtime's own (kv_rt_stream). */
    kv_stream stream;
} kv_rt_options;

/* Open a runtime for plan (validated here: every stream's method must be one this runtime applies:
 * f16/f32, uniform (with XQuant eta and shared codes), HIGGS, FP8 E4M3/E5M2 and NVFP4 (plan 1.1),
 * AQUA-KV predictors, KVmix RPC, token pruning (StreamingLLM, H2O, SnapKV, PyramidKV) with f16/f32,
 * uniform, float or HIGGS groups inside a head; others are refused with KV_EUNSUPPORTED naming the
 * layer and stream). *out NULL on failure. */
kv_status kv_rt_open(kv_rt **out, const kv_plan *plan, const kv_rt_options *opt);
void kv_rt_close(kv_rt *rt); /* NULL ok */

/* Append n tokens of `layer` to sequence seq: keys before RoPE (k_pre; may be NULL when no stream of
 * the plan is pre_rope), keys after RoPE (k), values (v), each n rows of n_kv_heads*head_dim floats
 * with row stride ld; pos[i] the tokens' positions. Compresses what the semantics say first. */
kv_status kv_rt_append(kv_rt *rt, int layer, int seq, int n, const int32_t *pos, const float *k_pre,
                       const float *k, const float *v, size_t ld);
/* Attention of the last n_q appended tokens of (layer, seq): q holds n_q rows of n_heads*head_dim
 * floats (after RoPE; row stride ldq), query head h uses KV head h / (n_heads / n_kv_heads); out
 * receives n_q rows of n_heads*head_dim (row stride ldo): softmax(scale q.K^T) V over every token the
 * sequence holds up to each query's own position, computed from the compressed form. */
kv_status kv_rt_attend(kv_rt *rt, int layer, int seq, int n_q, const float *q, size_t ldq, float *out,
                       size_t ldo);
/* A decoding step of several sequences at once: one new token per listed sequence (n_seqs distinct
 * sequences; row i of k_pre/k/v, stride ld, is seqs[i]'s, at position kv_rt_length-of-that-layer), then their
 * attention (row i of q and out is seqs[i]'s). Equal to the calls one sequence at a time; on a device the
 * sequences, whatever their lengths, are attended in one launch (up to KV_DA_MAX_BATCH = 32 per launch). */
kv_status kv_rt_append_batch(kv_rt *rt, int layer, int n_seqs, const int *seqs, const float *k_pre, const float *k,
                             const float *v, size_t ld);
kv_status kv_rt_attend_batch(kv_rt *rt, int layer, int n_seqs, const int *seqs, const float *q, size_t ldq, float *out,
                             size_t ldo);
/* Tokens appended to seq in the last layer (the next position); -1 for a bad seq. */
int kv_rt_length(const kv_rt *rt, int seq);
/* The prompt of seq is complete (every layer appended and attended): apply the plan's token selection
 * to every layer now and compress what is kept (pruning plans; RUNTIME.md §8). A no-op for plans that
 * prune nothing (their compression already follows the appends), and for a sequence with no open prompt.
 * Errors: KV_EINVAL when the observation window is larger than the prompt, or when a policy that scores
 * tokens by attention did not see the queries it needs (a step appended without kv_rt_attend, rows
 * attended twice) — the runtime cannot score what it did not attend. On an error the sequence must be
 * reset. */
kv_status kv_rt_end_prompt(kv_rt *rt, int seq);
/* Copy the open prompt of src_seq in src into dst_seq of dst (reset first), as if dst had prefilled it
 * itself: the prompt is held in f16 until its end under every plan that prunes, so its attention, and what
 * the policies score it by, do not depend on the plan. One prefill then serves several plans (kvprof
 * budget). Requires the same model shape and key domain (pre_rope) per layer and the same sinks, a source
 * that holds its prompt in f16 and collected what dst's policy needs (kv_rt_options.prompt_stats), and a
 * destination that holds prompts (a pruning plan, or prompt_stats). KV_EINVAL naming what differs. */
kv_status kv_rt_prompt_copy(kv_rt *dst, int dst_seq, const kv_rt *src, int src_seq);
/* Tokens KV head kv_head of (layer, seq) holds (the sequence's length unless tokens were pruned, or left the layer's
 * attention window: RUNTIME.md §11); -1 for bad arguments. */
int kv_rt_held(const kv_rt *rt, int layer, int seq, int kv_head);
/* Their positions, in order, into pos (kv_rt_held entries). */
kv_status kv_rt_held_positions(const kv_rt *rt, int layer, int seq, int kv_head, int32_t *pos);
/* PyramidKV's per-layer budgets for a mean budget b (its schedule, beta = 20): falling linearly with depth
 * from b_max = min(1, 2b - b/20) to 2b - b_max, mean b. out: n_layers fractions in (0, 1]. */
kv_status kv_prune_pyramid_budgets(double *out, int n_layers, double b);
/* Forget sequence seq (seq < 0: every sequence) and release its memory. */
void kv_rt_reset(kv_rt *rt, int seq);

/* What a sequence holds (seq < 0: all sequences summed). Bits follow the papers' convention:
 * `payload` = codes + scales + zero points + norms of the compressed tokens, `fp` = the f16 tokens
 * (sinks, window, RPC), predictor weights and stored SQuat bases once per runtime (as the plan stores them). */
typedef struct kv_rt_stats {
    uint64_t tokens;             /* tokens appended (the sequence lengths, summed over sequences) */
    uint64_t values_total;       /* values held: 2 streams x layers x (per KV head: tokens held x head_dim) */
    uint64_t values_compressed;
    uint64_t payload_bytes;      /* exact storage of the compressed tokens */
    uint64_t fp_bytes;           /* 2 bytes per uncompressed value */
    uint64_t predictor_bytes;    /* the plan's predictor weights and biases (once per runtime) */
    uint64_t basis_bytes;        /* the plan's stored SQuat bases (once per runtime; kv_plan_basis_bytes) */
    uint64_t accounted_bytes;    /* payload + index + fp (the cache itself) */
    uint64_t allocated_bytes;    /* bytes the runtime allocated for these sequences' cache storage:
                                    accounted_bytes + index overhead (RUNTIME.md §5) */
    uint64_t overhead_bytes;     /* allocated - accounted: block descriptors */
    uint64_t working_bytes;      /* scratch held at the moment (reconstruction working set, RoPE table, the
                                    token policy's scores and window queries) */
    double bits_per_value;       /* (payload + index) bits / compressed values (0 when none) */
    double bits_per_value_total; /* (payload + index + fp + predictors + bases) bits / all values held */
    /* token pruning */
    uint64_t index_bytes;        /* positions of kept tokens (4 bytes per token and KV head, when not consecutive) */
    uint64_t values_appended;    /* values an f16 cache of every appended token would hold (2 x layers x tokens x
                                    kv_dim): the denominator of a budget, accounted_bytes / (2 values_appended) */
} kv_rt_stats;
kv_status kv_rt_get_stats(const kv_rt *rt, int seq, kv_rt_stats *out);
/* The same for one (layer, stream) alone: its payload, index, f16 tokens, its own predictor's bytes
 * (kv_plan_stream_predictor_bytes) and stored SQuat basis (kv_plan_stream_basis_bytes); tokens is the sequence length, allocated/overhead stay 0 (they are
 * per sequence). Over every (layer, stream) the byte counts add up to kv_rt_get_stats' (one walk,
 * rt_runtime.c), so the honest bits of a plan are the value-weighted mean of its streams' (kvcal search). */
kv_status kv_rt_get_stream_stats(const kv_rt *rt, int seq, int layer, int stream, kv_rt_stats *out);

/* The CPU-vs-device self-check (RUNTIME.md §10.4): `plan` opened on the CPU and on opt->device (CUDA or its host
 * model; opt as for kv_rt_open, n_seqs and capacity ignored) and fed the same synthetic sequence: a prompt of
 * sinks + 2 chunks + 10 tokens in one step, then 4 decoding steps. Every stream's decoded cache must equal the
 * CPU's bit for bit (AQUA-KV reconstructions, which come from cuBLAS products on the GPU: within 1e-5 of the
 * row's largest value for 999 values in 1000) and every attention output checked (the prompt's last 8 rows,
 * every decoding row) must lie within the runtime's bound of exact attention (RUNTIME.md §4). KV_ENUMERIC
 * with the codec and the size of the disagreement otherwise (also in report->what). kv_rt_open runs it for a
 * CUDA runtime the first time each kind of codec appears in the process. report may be NULL. */
typedef struct kv_rt_check {
    int passed;
    char device[16];
    double seconds;
    double worst_ratio;        /* largest output error / its bound */
    uint64_t rows_checked;     /* query vectors checked against the bound */
    uint64_t values_compared;  /* decoded cache values compared */
    uint64_t values_differing; /* ... that are not the CPU's bits (predicted streams only, when it passes) */
    double max_recon_rel;      /* the largest of those differences, relative to its row's largest value */
    char what[320];            /* the first disagreement, or "" */
} kv_rt_check;
kv_status kv_rt_selfcheck(const kv_plan *plan, const kv_rt_options *opt, kv_rt_check *report);
/* One small plan per kind of codec the device serves (`kvrun selfcheck`): SmolLM2's attention shape (3 KV heads of
 * 64, 9 query heads; RoPE theta 10000 for pre-RoPE entries), 4 layers, 4 sinks, chunks of 32. Entry i (0 <= i <
 * kv_rt_selfcheck_catalog_size()) into *plan (the caller frees it) and its name (borrowed). */
int kv_rt_selfcheck_catalog_size(void);
kv_status kv_rt_selfcheck_catalog(int i, kv_plan **plan, const char **name);

/* The CUDA stream a KV_RT_DEVICE_CUDA runtime orders its work on (results of append/attend are complete when it
 * reaches them; a D2H copy on it, or cudaStreamSynchronize, waits for them); NULL for other devices. */
kv_stream kv_rt_stream(const kv_rt *rt);

/* The plan's choices as the runtime applies them (for tools): sinks, recent. */
int kv_rt_sinks(const kv_rt *rt);
int kv_rt_recent(const kv_rt *rt);

/* The keys and values held for (layer, seq, KV head), decoded to f32 (keys after RoPE), tokens in
 * order: k_out, v_out hold kv_rt_held(layer, seq, kv_head) x head_dim floats (kv_rt_length(seq) rows
 * unless tokens were pruned). For tests and tools (the oracle of the compressed-form attention); never
 * on the attention path. */
kv_status kv_rt_decode_head(kv_rt *rt, int layer, int seq, int kv_head, float *k_out, float *v_out);

#ifdef __cplusplus
}
#endif
#endif /* KVRT_H */
