/* kv_model.h — the public header of model/: the reference transformer (Llama family), its
 * tokenizers, the KV-cache interface and capture hooks. */
#ifndef KV_MODEL_H
#define KV_MODEL_H

#include "kv_common.h"
#include "kv_formats.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- model ---- (weights*.c, forward*.c, kv_cache.c, eval.c, generate.c)
 *
 * The reference transformer of the Llama family (Llama 2/3.x, Mistral, Qwen2, SmolLM2) and of Qwen3 and
 * Gemma 3: RMSNorm, RoPE (adjacent-pair or half layout, theta and linear/llama3 scaling from kv_arch),
 * grouped-query attention, SwiGLU, optional QKV bias, tied or separate output; and what kv_arch's Gemma 3 /
 * Qwen3 fields switch on (model/MODELS.md): QK-norm before RoPE, post-attention and post-FFN norms,
 * GELU-tanh gating, scaled embeddings, an attention scale other than 1/sqrt(head_dim) (folded into the
 * queries: q is multiplied by attn_scale * sqrt(head_dim) right after its norm, so every consumer of q,
 * the capture hooks and a cache's `attend` included, computes softmax(q.k / sqrt(head_dim))), final logit
 * softcapping, and sliding-window layers with their own RoPE base (kv_arch_layer_window,
 * kv_arch_layer_rope_theta): a local layer's query at position p attends to the keys at p - W < pos <= p.
 * The window is applied by the model over a cache's `view`; a cache that attends itself (`attend`: the
 * runtime) does not apply it yet, so a step whose queries would need it is refused (KV_EUNSUPPORTED; issue
 * 36 part 3). All arithmetic is f32 (sums that
 * decide accuracy, such as RMSNorm's mean square and softmax's denominator, in double); weights are
 * dequantized to f32 at load time, or kept as f16 or in the file's quantized blocks and decoded on the
 * fly (kv_model_options.weights). One pool of OpenMP threads does the work: products of many rows
 * as single-threaded CBLAS sgemm calls on slices of the output, products of a few rows (decoding)
 * in the model's own kernels, the rest row by row. Every output element is summed by one thread in
 * a fixed order, so results are deterministic for a thread count (and the matrix products do not
 * depend on it); no reduction is racy. The BLAS's own thread count is left at n_threads.
 *
 * Rows of a batch: a forward step takes n_seqs sequences of n_tokens tokens each; row r = b*n_tokens
 * + t holds token t of sequence b. Every activation is a row-major (rows x width) f32 matrix.
 *
 * A kv_model owns scratch memory that its forward functions reuse: one kv_model is used by one
 * thread at a time (the functions themselves use n_threads threads).
 */
typedef struct kv_model kv_model;

/* A weight matrix, y = W x: `rows` outputs, `cols` inputs, row-major. Exactly one of f32 / f16 / q is
 * set (see kv_weight_storage). Borrowed from the model. */
typedef struct kv_matrix {
    int rows, cols;
    const float *f32;
    const uint16_t *f16;     /* IEEE binary16 */
    const uint8_t *q;        /* rows of the model file's quantized blocks (q_dtype, q_row_bytes each) */
    int q_dtype;             /* kv_dtype */
    size_t q_row_bytes;
} kv_matrix;

/* One decoder layer's weights (borrowed from the model). Canonical names: kv_formats.h section 3. */
typedef struct kv_layer_weights {
    const float *attn_norm;       /* [d_model] */
    kv_matrix wq;                 /* n_heads*head_dim x d_model */
    kv_matrix wk, wv;             /* n_kv_heads*head_dim x d_model */
    kv_matrix wo;                 /* d_model x n_heads*head_dim */
    const float *bq, *bk, *bv;    /* biases (qkv_bias), else NULL */
    const float *ffn_norm;        /* [d_model] */
    kv_matrix w_gate, w_up;       /* d_ff x d_model */
    kv_matrix w_down;             /* d_model x d_ff */
    const float *q_norm, *k_norm; /* [head_dim] (qk_norm), else NULL */
    const float *post_attn_norm, *post_ffn_norm; /* [d_model] (post_norms), else NULL */
} kv_layer_weights;

/* How the model keeps its weight matrices (norms and biases are always f32). */
typedef enum kv_weight_storage {
    KV_WEIGHTS_F32 = 0,   /* dequantized to f32 at load: kv_matrix.f32 (the default) */
    KV_WEIGHTS_F16 = 1,   /* rounded to f16: kv_matrix.f16 (half the memory; results change by f16 rounding) */
    KV_WEIGHTS_NATIVE = 2 /* quantized matrices stay in the file's blocks (kv_matrix.q) and f16 ones in f16,
                             decoded on the fly to the same f32 values as KV_WEIGHTS_F32 (results equal up to
                             summation order); f32/bf16 tensors and kv_model_create's sources become f32 */
} kv_weight_storage;

/* Where kv_model_forward runs. KV_MODEL_DEVICE_CUDA (RUNTIME.md §10.6): the weights are also decoded once to the
 * GPU (f16, or f32 with KV_WEIGHTS_F32) and kv_model_forward runs there: tokens, logits and hidden stay host
 * arrays, the cache must be a runtime cache made for this model (kv_cache_rt_create opens its runtime on the GPU,
 * on the model's stream), a NULL cache attends exactly within the step over the runtime's f16 rows, and capture
 * hooks are refused. Everything else (embed, layer_forward, logits, gradients) stays on the CPU. Layer-streamed
 * models run on the CPU only. A build or machine without CUDA refuses the load (KV_EUNSUPPORTED). */
typedef enum kv_model_device { KV_MODEL_DEVICE_CPU = 0, KV_MODEL_DEVICE_CUDA = 1 } kv_model_device;

typedef struct kv_model_options {
    int n_threads;             /* threads for OpenMP and the BLAS; 0 = kv_default_threads() */
    kv_weight_storage weights; /* default KV_WEIGHTS_F32 */
    kv_model_device device;    /* default KV_MODEL_DEVICE_CPU */
} kv_model_options;

/* Source of weights for kv_model_create: fill dst with the f32 values of tensor `name` (canonical
 * name), whose shape must be ne (GGML order, n_dims dims). Return KV_OK, KV_ENOTFOUND when the
 * tensor is absent (allowed for output.weight when tied, biases without qkv_bias, rope_freqs.weight),
 * or another code (KV_EFORMAT for a shape mismatch) with a message. */
typedef kv_status (*kv_tensor_read_fn)(void *user, const char *name, int n_dims, const uint64_t ne[4],
                                       float *dst);

/* Build a model from an architecture and a tensor source (tests use arrays in memory). opt may be
 * NULL (defaults). The arch is copied; on failure *out is NULL. Free with kv_model_free. */
kv_status kv_model_create(kv_model **out, const kv_arch *arch, kv_tensor_read_fn read, void *user,
                          const kv_model_options *opt);
/* Load every weight of an open model file (stored as opt->weights says; shapes checked against
 * kv_arch). The file may be closed afterwards: the model keeps its own copy. Pages of the file
 * mapping that loading touched are handed back to the OS (kv_model_file_release_pages) once their
 * tensor is copied. */
kv_status kv_model_load(kv_model **out, const kv_model_file *mf, const kv_model_options *opt);
/* The same with layer-streamed weights (below): nothing but the architecture and the RoPE
 * frequencies is read now; mf must stay open as long as the model lives. */
kv_status kv_model_load_streamed(kv_model **out, const kv_model_file *mf, const kv_model_options *opt);
/* kv_model_create with layer-streamed weights: read and user must outlive the model. */
kv_status kv_model_create_streamed(kv_model **out, const kv_arch *arch, kv_tensor_read_fn read, void *user,
                                   const kv_model_options *opt);
/* kv_model_file_open + kv_model_load + close. */
kv_status kv_model_open(kv_model **out, const char *path, const kv_model_options *opt);
void kv_model_free(kv_model *m);

const kv_arch *kv_model_arch(const kv_model *m);                          /* borrowed */
const kv_layer_weights *kv_model_layer(const kv_model *m, int layer);     /* borrowed; NULL if out of range */
kv_matrix kv_model_token_embedding(const kv_model *m);                    /* vocab x d_model */
kv_matrix kv_model_output_weight(const kv_model *m);                      /* vocab x d_model (tied: the embedding) */
const float *kv_model_output_norm(const kv_model *m);                     /* [d_model] */
/* The RoPE inverse frequencies after scaling, head_dim/2 values (angle of pair i at position p is
 * p * inv_freq[i]); borrowed. */
const float *kv_model_rope_inv_freq(const kv_model *m);
/* The same in double precision, as the model computes its angles (head_dim/2 values; borrowed). These two
 * are the global layers' (every layer's in a model without sliding-window layers). */
const double *kv_model_rope_inv_freq_d(const kv_model *m);
/* A layer's inverse frequencies (local layers: kv_arch.rope_theta_local, unscaled); NULL out of range. */
const double *kv_model_rope_inv_freq_layer(const kv_model *m, int layer);
/* Bytes of the forward workspace for a step of `rows` token rows attending over `keys` cached
 * positions, with the model's threads (a double: an estimate for requests too large for size_t). */
double kv_model_forward_bytes(const kv_model *m, double rows, double keys);
size_t kv_model_weight_bytes(const kv_model *m);   /* bytes of weights held now (streamed: the parts acquired) */
kv_model_device kv_model_device_of(const kv_model *m);
size_t kv_model_device_weight_bytes(const kv_model *m); /* bytes of weights on the GPU (0 on the CPU) */
int kv_model_threads(const kv_model *m);
/* Set the thread count for OpenMP regions and the BLAS (0 = kv_default_threads()). */
void kv_model_set_threads(kv_model *m, int n_threads);

/* ---- layer-streamed weights (weights.c) ---------------------------------------------------------
 * A layer-sequential caller (kvcal fit) needs one layer's weights at a time. A model made by
 * kv_model_load_streamed / kv_model_create_streamed starts with no weights held;
 * kv_model_acquire(m, part) reads a part's tensors from the source (stored as
 * kv_model_options.weights says, exactly as a whole load would store them, so results are the
 * same bits) and kv_model_release(m, part) frees them, so the weights held are one layer plus
 * whatever else the caller holds, whatever the number of layers. The embedding part is kept in the
 * file's blocks when they are quantized (rows are decoded on lookup to the same f32 values as a
 * dequantized table). Functions that need a part that is not held fail with KV_EINVAL naming it
 * (kv_model_layer_forward: the layer; kv_model_embed: the embedding; kv_model_logits: the output;
 * kv_model_forward: all; kv_grad_create refuses a streamed model). On a model that is not streamed
 * every part is always held: acquire and release do nothing. Not thread-safe with a forward on the
 * same model. Errors of acquire: those of reading the tensors (KV_EIO, KV_EFORMAT, KV_ENOMEM). */
#define KV_MODEL_PART_EMBED (-1)  /* token embedding */
#define KV_MODEL_PART_OUTPUT (-2) /* output norm and output matrix (with tied embeddings: the embedding too) */
kv_status kv_model_acquire(kv_model *m, int part); /* part: a layer index or KV_MODEL_PART_* */
void kv_model_release(kv_model *m, int part);
int kv_model_streamed(const kv_model *m);           /* 1 when made by kv_model_*_streamed */
int kv_model_holds(const kv_model *m, int part);    /* 1 when the part's weights are in memory */

/* Rotate n rows of n_heads heads (head h of row r at x + r*ld + h*head_dim) in place to the
 * positions pos[r], in the model's RoPE layout; inverse = 1 rotates back (pre-RoPE from post-RoPE).
 * For compressed caches that keep pre-RoPE keys and rotate them when they are read. */
void kv_model_rope(const kv_model *m, float *x, size_t n, size_t ld, int n_heads, const int32_t *pos,
                   int inverse);
/* The same with a layer's frequencies (kv_model_rope uses the global layers'). */
void kv_model_rope_layer(const kv_model *m, int layer, float *x, size_t n, size_t ld, int n_heads,
                         const int32_t *pos, int inverse);

/* ---- KV-cache interface ----------------------------------------------------------------------
 * The model writes each layer's new keys/values into a cache and reads the layer's keys/values
 * back for attention, only through these operations, so that compressed caches plug in without
 * touching the model. A cache holds n_seqs independent sequences (slots).
 *
 * Calling order within one forward step over a batch: for layer = 0 .. n_layers-1, for each
 * sequence of the batch: append(layer, seq, n, ...) then view(layer, seq). Every layer receives
 * the same n and positions; positions continue the sequence (pos[0] == length(seq) before the step).
 * A compressed cache may therefore reconstruct layer l from its reconstruction of layer l-1. */
typedef struct kv_cache kv_cache;

/* Keys (after RoPE) and values of one layer and sequence, decoded to f32, `n` tokens in position
 * order: token j's kv head h at k + j*ld_k + h*head_dim (likewise v). Borrowed from the cache: valid
 * until the next call of any operation on the cache. */
typedef struct kv_cache_view {
    const float *k;
    const float *v;
    size_t ld_k, ld_v;
    int n;
} kv_cache_view;

typedef struct kv_cache_ops {
    const char *name;
    /* Store n new tokens of `layer` for sequence `seq`: pre-RoPE keys, post-RoPE keys and values,
     * each n rows of n_kv_heads*head_dim floats with row stride ld; pos[i] their positions (for a
     * cache that stores pre-RoPE keys and rotates on read: kv_model_rope). */
    kv_status (*append)(kv_cache *c, int layer, int seq, int n, const int32_t *pos, const float *k_pre,
                        const float *k, const float *v, size_t ld);
    /* The tokens held for (layer, seq) that attention reads; the last n of them must be the n just
     * appended, in order (a cache that drops or merges older tokens may return fewer than length). */
    kv_status (*view)(kv_cache *c, int layer, int seq, kv_cache_view *out);
    /* Tokens appended to `seq` in every layer so far (the last layer's count): the next position. */
    int (*length)(const kv_cache *c, int seq);
    /* Forget sequence seq (seq < 0: every sequence); keeps the memory for reuse. */
    void (*reset)(kv_cache *c, int seq);
    /* Bytes the cache holds for its tokens (for reporting; may be NULL). */
    size_t (*bytes)(const kv_cache *c);
    /* Release the implementation state and the kv_cache itself. */
    void (*destroy)(kv_cache *c);
    /* Optional: attention computed by the cache itself, from whatever form it holds (a compressed
     * cache never decodes itself for `view`). After append(layer, seq, n_q, ...): q holds the step's
     * n_q query rows (after RoPE, n_heads*head_dim floats, stride ldq); out receives softmax(q.K^T /
     * sqrt(head_dim)) V for each row over the tokens up to its own position (stride ldo). When set,
     * the model calls it instead of view; NULL: the model attends over view's keys and values. */
    kv_status (*attend)(kv_cache *c, int layer, int seq, int n_q, const float *q, size_t ldq, float *out,
                        size_t ldo);
    /* Optional: the prompt of seq is complete (after its last step, before the first generated token). A
     * cache whose plan prunes tokens selects what it keeps now (kv_rt_end_prompt). NULL: nothing to do. */
    kv_status (*end_prompt)(kv_cache *c, int seq);
} kv_cache_ops;

/* The handle every implementation fills in (ops and geometry; impl is its own state). */
struct kv_cache {
    const kv_cache_ops *ops;
    void *impl;
    int n_layers, n_seqs, n_kv_heads, head_dim;
};

/* Full-precision cache: f32 post-RoPE keys and values, grown on demand (capacity_hint tokens per
 * sequence are reserved up front; 0 = grow from a small size). */
kv_status kv_cache_plain_create(kv_cache **out, const kv_arch *arch, int n_seqs, int capacity_hint);

/* A cache backed by libkvrt's runtime (kvrt.h "engine-facing runtime", kernels/RUNTIME.md): the plan's
 * compressed form is what is held, and attention is computed from it (the cache's `attend`; `view` is
 * not available). plan NULL: every stream in f16 with no compression at all (this engine's f16 cache:
 * sinks 0, an unbounded window). The plan is borrowed (must outlive the cache) and must match the
 * model's shape (kv_plan_check_fingerprint for the full check); capacity: tokens per sequence at most
 * (0 = no limit); n_threads 0 = the model's (then the runtime runs on the model's thread pool, and
 * kv_model_set_threads must not be called while the cache exists). */
struct kv_rt;
#define KV_CACHE_RT_KEEP_RECONSTRUCTIONS 0x1u /* kv_rt_options.keep_reconstructions (AQUA-KV, RUNTIME.md §6) */
#define KV_CACHE_RT_PROMPT_STATS 0x2u         /* kv_rt_options.prompt_stats: every prompt held in f16 with what any
                                                 token policy scores by (the source of kv_rt_prompt_copy) */
kv_status kv_cache_rt_create(kv_cache **out, const kv_plan *plan, const kv_model *m, int n_seqs, int capacity,
                             int n_threads, unsigned flags);
/* The runtime behind a cache made by kv_cache_rt_create (borrowed), or NULL for another cache. */
struct kv_rt *kv_cache_rt_runtime(kv_cache *c);
/* 1 when c is a runtime cache whose plan carries the layers' attention windows (plan format 1.5; checked against
 * the model's at creation), so that it attends over each sliding-window layer's window itself; 0 otherwise. */
int kv_cache_applies_windows(const kv_cache *c);
/* kv_rt_prompt_copy between two runtime caches (KV_EINVAL for other caches). */
kv_status kv_cache_rt_prompt_copy(kv_cache *dst, int dst_seq, kv_cache *src, int src_seq);
/* Dispatch helpers (argument checks, then the vtable). kv_cache_free accepts NULL. */
kv_status kv_cache_append(kv_cache *c, int layer, int seq, int n, const int32_t *pos, const float *k_pre,
                          const float *k, const float *v, size_t ld);
kv_status kv_cache_view_layer(kv_cache *c, int layer, int seq, kv_cache_view *out);
int kv_cache_length(const kv_cache *c, int seq);
/* The prompt of seq is complete: ops->end_prompt, or KV_OK when the cache has none. */
kv_status kv_cache_end_prompt(kv_cache *c, int seq);
void kv_cache_reset(kv_cache *c, int seq);
size_t kv_cache_bytes(const kv_cache *c);
void kv_cache_free(kv_cache *c);

/* ---- capture hooks -------------------------------------------------------------------------
 * Called once per layer and forward call, after the layer's Q/K/V are computed and before
 * attention, with every row of the batch. All pointers are borrowed for the duration of the call. */
typedef struct kv_capture {
    int layer;
    int n_seqs, n_tokens;   /* rows = n_seqs * n_tokens, row r = b*n_tokens + t */
    const int32_t *pos;     /* rows positions */
    int d_model, q_dim, kv_dim; /* q_dim = n_heads*head_dim, kv_dim = n_kv_heads*head_dim */
    const float *h;         /* the layer's input (residual stream), rows x d_model */
    const float *x;         /* attention input after RMSNorm, rows x d_model */
    const float *q_pre;     /* queries before RoPE (bias, QK-norm and the attention scale's fold included), rows x q_dim */
    const float *q;         /* queries after RoPE */
    const float *k_pre;     /* keys before RoPE (after QK-norm), rows x kv_dim */
    const float *k;         /* keys after RoPE */
    const float *v;         /* values, rows x kv_dim */
} kv_capture;
/* A non-OK return stops the forward pass with that status. */
typedef kv_status (*kv_capture_fn)(void *user, const kv_capture *c);
typedef struct kv_hooks {
    kv_capture_fn on_layer; /* NULL: no capture */
    void *user;
    int layer_begin, layer_end; /* capture layers in [begin, end); end <= begin means every layer */
} kv_hooks;

/* ---- forward ------------------------------------------------------------------------------- */
typedef struct kv_forward {
    const int32_t *tokens; /* n_seqs*n_tokens ids, row b*n_tokens + t */
    int n_seqs, n_tokens;
    kv_cache *cache;       /* NULL: no past, nothing stored (each sequence attends causally to itself) */
    const int *seq_ids;    /* cache slot of each sequence; NULL = 0..n_seqs-1 */
    const kv_hooks *hooks; /* NULL: none */
    float *logits;         /* NULL, or out: (logits_last_only ? n_seqs : rows) x vocab */
    int logits_last_only;
    float *hidden;         /* NULL, or out: final residual stream (before the output norm), rows x d_model */
} kv_forward;

/* One forward step: embed, every layer (reading and extending the cache), output. Positions are
 * kv_cache_length(seq) + t with a cache, t without. */
kv_status kv_model_forward(kv_model *m, const kv_forward *f);

/* The building blocks of kv_model_forward, for layer-by-layer use (calibration, backward passes
 * that recompute a layer from its input):
 *   embed: h[r] = token_embd[tokens[r]] * embed_scale (n rows);
 *   layer_forward: h <- layer(h) in place, for n_seqs x n_tokens rows at positions pos (rows
 *     values), with the cache (NULL: causal within each sequence, no past) and hooks as above;
 *   logits: out = output(rmsnorm(h)) for n rows (out: n x vocab), softcapped when the arch says so. */
kv_status kv_model_embed(const kv_model *m, const int32_t *tokens, size_t n, float *h);
kv_status kv_model_layer_forward(kv_model *m, int layer, float *h, int n_seqs, int n_tokens,
                                 const int32_t *pos, kv_cache *cache, const int *seq_ids,
                                 const kv_hooks *hooks);
kv_status kv_model_logits(kv_model *m, const float *h, size_t n, float *logits);

/* ---- evaluation (eval.c) ------------------------------------------------------------------- */
typedef enum kv_ppl_protocol {
    KV_PPL_ALL = 0,     /* chunks of ctx-1 tokens, each prefixed with BOS, every prediction scored */
    KV_PPL_LLAMACPP = 1 /* llama.cpp's perplexity tool: chunks of ctx tokens, first one replaced by
                           BOS (when the vocabulary adds BOS), the second half of each chunk scored */
} kv_ppl_protocol;

typedef struct kv_ppl_options {
    kv_ppl_protocol protocol;
    int ctx;          /* tokens per chunk as the model sees them (BOS included) */
    int batch;        /* chunks per forward call (>= 1) */
    int bos_id;       /* BOS token; -1: none (protocol all then fails; llama.cpp keeps the first token) */
    size_t max_chunks; /* 0 = all */
    const char *progress_label; /* NULL: no progress */
} kv_ppl_options;

typedef struct kv_ppl_result {
    double ppl;
    double nll_mean;
    size_t tokens_total;     /* tokens of the text given */
    size_t tokens_evaluated; /* tokens run through the model (chunks * ctx) */
    size_t tokens_scored;    /* predictions scored */
    size_t n_chunks;
    double seconds;          /* wall time of the forward passes and scoring */
    double tokens_per_second; /* tokens_evaluated / seconds */
} kv_ppl_result;

/* Perplexity of the uncompressed model over a tokenized text. For protocol all, `tokens` is the
 * text without BOS; for llama.cpp, the text as llama.cpp tokenizes it (BOS first when the vocabulary
 * adds it). KV_EINVAL when the text is shorter than one chunk. */
kv_status kv_eval_perplexity(kv_ppl_result *out, kv_model *m, const int32_t *tokens, size_t n_tokens,
                             const kv_ppl_options *opt);
/* The same over a text tokenized whole without BOS (ids), with tok's BOS conventions (eval_text.c): protocol
 * all prefixes every chunk with tok's BOS; llama.cpp puts BOS before the text when the vocabulary adds it
 * (kv_tokenizer_add_bos_default) and otherwise uses none. opt->bos_id is not read. */
struct kv_tokenizer; /* kv_tokenizer, below */
kv_status kv_eval_perplexity_text(kv_ppl_result *out, kv_model *m, const struct kv_tokenizer *tok,
                                  const int32_t *ids, size_t n_ids, const kv_ppl_options *opt);

/* -log softmax(logits)[target] of one row of n_vocab logits (max in float, sum of exp in double, as
 * llama.cpp's perplexity tool does). */
double kv_nll_of(const float *logits, int n_vocab, int target);

/* ---- generation (generate.c) --------------------------------------------------------------- */
typedef struct kv_gen_options {
    int n_new;                /* tokens to generate at most */
    float temp;               /* <= 0: greedy (argmax, lowest id on ties) */
    float top_p;              /* nucleus sampling when 0 < top_p < 1; 1 = off */
    uint64_t seed;
    const int32_t *stop_ids;  /* generation ends before any of these (NULL: none) */
    int n_stop_ids;
    int prefill_chunk;        /* the prompt goes through in steps of at most this many tokens (0: one step):
                                 bounds the forward workspace, and lets a compressed cache compress the
                                 prompt as it goes instead of holding all of it in f16 first */
} kv_gen_options;

typedef struct kv_gen_stats {
    int n_prompt, n_generated;
    double prefill_seconds;   /* the prompt's forward pass */
    double end_prompt_seconds; /* kv_cache_end_prompt after it (token selection and compression of a pruning plan) */
    double decode_seconds;    /* the single-token forward passes */
} kv_gen_stats;

/* Called for each generated token; a non-OK return stops generation with that status. */
typedef kv_status (*kv_token_fn)(void *user, int32_t token);

/* Prefill the prompt into `cache` slot 0 (which is reset first), end the prompt (kv_cache_end_prompt),
 * then decode token by token through the cache. Generated ids go to out (capacity opt->n_new) and *n_out; a stop token is not included.
 * stats may be NULL. */
kv_status kv_generate(int32_t *out, int *n_out, kv_gen_stats *stats, kv_model *m, kv_cache *cache,
                      const int32_t *prompt, int n_prompt, const kv_gen_options *opt, kv_token_fn on_token,
                      void *user);
/* A text prompt for kv_generate (generate_prompt.c): its tokens (*ids malloc'd), BOS first when the vocabulary
 * adds it and always for an empty prompt; KV_EINVAL for an empty prompt when the vocabulary has no BOS. */
kv_status kv_gen_prompt_tokens(int32_t **ids, size_t *n, const struct kv_tokenizer *tok, const char *prompt);
/* The tokens generation stops at (kv_gen_options.stop_ids; *ids malloc'd, *n of them): every end-of-generation
 * token and BOS among the first min(tokenizer's, n_vocab) ids (n_vocab: the model's). */
kv_status kv_gen_stop_tokens(int32_t **ids, int *n, const struct kv_tokenizer *tok, int n_vocab);
/* Pick the next token from one row of logits: argmax at temp <= 0, else a draw from
 * softmax(logits/temp) (restricted to the top-p nucleus when 0 < top_p < 1) using one uniform of rng. */
kv_status kv_sample_token(int32_t *out, const float *logits, int n_vocab, float temp, float top_p,
                          kv_rng *rng);
/* ---- end model ---- */

/* ---- comparison with a KV cache (eval_compare.c) -------------------------------------------
 * The same chunks (protocol "all": BOS + ctx-1 text tokens, every prediction scored) run twice:
 * exact attention (one prefill per chunk) and through `cache` fed in steps (first_step tokens, then
 * step tokens at a time, as a decoder with that cache's buffer would see them). The first step is the
 * chunk's prompt: kv_cache_end_prompt follows it (a pruning plan selects what it keeps there). */
typedef kv_status (*kv_compare_chunk_fn)(void *user, kv_cache *cache, size_t chunk);
typedef struct kv_compare_options {
    int ctx;
    int bos_id;
    size_t max_chunks;          /* 0 = all */
    int first_step, step;
    const char *progress_label; /* NULL: no progress */
    kv_compare_chunk_fn on_chunk; /* after each chunk, before the cache is reset (stats); may be NULL */
    void *user;
    /* optional: the argmax of each scored position, exact and through the cache, in scoring order (the first
     * argmax_cap positions; e.g. to compare the predictions of two devices) */
    int32_t *argmax_ref, *argmax_cache;
    size_t argmax_cap;
} kv_compare_options;

typedef struct kv_compare_result {
    double ppl, nll_mean;         /* through the cache */
    double ppl_ref, nll_mean_ref; /* exact, same tokens */
    double kl_mean;               /* mean KL(P_exact || P_cache) per scored position, nats */
    double top1_agreement;        /* fraction of positions where both argmaxes agree */
    size_t tokens_total, tokens_evaluated, tokens_scored, n_chunks;
    double seconds_ref, seconds_cache;
    double tokens_per_second, tokens_per_second_ref;
} kv_compare_result;

kv_status kv_eval_compare(kv_model *m, kv_cache *cache, const int32_t *tokens, size_t n_tokens,
                          const kv_compare_options *opt, kv_compare_result *out);

/* ---- what a plan costs (eval_plan.c): `kvrun eval --plan`, kvcal search's selection and validation ----
 * The plan's cost on tokenized text (protocol "all", chunks of ctx): the chunks run exactly and through the
 * plan's runtime cache (kv_eval_compare); quality, honest bits, bytes and speed. Logs a warning (kv_log) when
 * nothing was compressed. */
typedef struct kv_plan_eval {
    kv_compare_result cmp;
    double bits_per_value;        /* compressed tokens: payload + positions (pruning) + predictors, bases amortized
                                     over all evaluated tokens */
    double bits_per_value_total;  /* everything held: + full-precision tokens at 16 bits, predictors and stored
                                     SQuat bases per sequence, per value of every appended token (pruned ones too) */
    double predictor_bits_per_value_sequence; /* predictors amortized over one ctx-token sequence */
    double basis_bits_per_value_sequence;     /* stored SQuat bases, the same way */
    double compressed_fraction;   /* compressed values / values held */
    double held_fraction;         /* values held / values of every appended token (< 1 only with token pruning) */
    uint64_t cache_bytes;         /* one full sequence: payload + fp16 tokens + predictors + bases */
    uint64_t fp16_cache_bytes;    /* the same sequence uncompressed in fp16 */
    uint64_t cache_bytes_allocated; /* what the runtime allocated for that sequence's cache (RUNTIME.md §5) */
    int sinks, recent;
    int prefill, step;            /* tokens of the first forward step of a chunk, then of each later one */
} kv_plan_eval;
/* prefill/step <= 0: sinks + recent, then recent (equivalent to token-by-token decoding for the
 * fixed-buffer semantics). */
kv_status kv_eval_plan(kv_plan_eval *out, kv_model *m, const char *model_path, const char *plan_path,
                            const int32_t *tokens, size_t n_tokens, int ctx, int bos, size_t max_chunks,
                            int prefill, int step, const char *progress_label);
/* The same for a plan in memory that the caller has checked belongs to m (kvcal search's selection: the
 * candidates' own fits and the chosen mixes before one is written). plan is not modified or freed. */
kv_status kv_eval_plan_loaded(kv_plan_eval *out, kv_model *m, const kv_plan *plan, const int32_t *tokens,
                                   size_t n_tokens, int ctx, int bos, size_t max_chunks, int prefill, int step,
                                   const char *progress_label);
/* The same writing every scored position's argmax to `predictions` (int32 little-endian: the exact pass's, then
 * the cache's), e.g. to compare two devices' predictions (scripts/gpu-check.sh); NULL: none. */
kv_status kv_eval_plan_ex(kv_plan_eval *out, kv_model *m, const char *model_path, const char *plan_path,
                               const int32_t *tokens, size_t n_tokens, int ctx, int bos, size_t max_chunks,
                               int prefill, int step, const char *progress_label, const char *predictions);
kv_status kv_eval_plan_loaded_ex(kv_plan_eval *out, kv_model *m, const kv_plan *plan, const int32_t *tokens,
                                      size_t n_tokens, int ctx, int bos, size_t max_chunks, int prefill, int step,
                                      const char *progress_label, const char *predictions);
/* ---- long-context evaluation (eval_compare.c, eval_passkey.c; DESIGN.md §9) ----------------
 * Perplexity over independent chunks cannot show what a cache policy (token pruning above all) loses.
 *
 * Continuation: a sample is BOS + prompt_len - 1 text tokens (the prompt), prefilled through a cache in
 * steps of prefill_chunk and ended (kv_cache_end_prompt: a pruning plan selects and compresses there),
 * then the next score_len text tokens fed in steps of `step` (1 = decoding); each fed token's prediction
 * of the text token after it is scored, so every scored prediction is made from the compressed cache
 * (score_len per sample; a sample spans prompt_len + score_len text tokens). The exact model runs the same
 * tokens in one pass (exact attention): ppl both ways, mean KL(P_exact || P_cache), top-1 agreement.
 * Samples are consecutive and disjoint in the text. Several caches are evaluated on the same samples;
 * with a prefill cache (a runtime cache made with KV_CACHE_RT_PROMPT_STATS) each prompt goes through the
 * model once and is copied into every cache (kv_cache_rt_prompt_copy: what each would have held). */
typedef struct kv_cont_options {
    int prompt_len;            /* N >= 2: prompt tokens, BOS included */
    int score_len;             /* M >= 1 */
    int bos_id;
    size_t max_samples;        /* 0: as many as the text holds */
    int prefill_chunk;         /* prompt tokens per step; 0: the whole prompt in one */
    int step;                  /* continuation tokens per step, >= 1 */
    kv_cache *prefill_cache;   /* NULL: each cache prefills the prompt itself */
    const char *progress_label;
    kv_compare_chunk_fn on_prompt; /* after a cache's prompt ended, before its continuation (statistics) */
    kv_compare_chunk_fn on_sample_end; /* after a cache's continuation (statistics of the steady state) */
    void *user;
} kv_cont_options;

typedef struct kv_cont_result {
    double ppl, nll_mean, kl_mean, top1_agreement;
    double seconds_prefill;    /* its own prefill, or the copy from the prefill cache */
    double seconds_end_prompt; /* kv_cache_end_prompt: selection and compression */
    double seconds_continuation;
} kv_cont_result;

typedef struct kv_cont_summary {
    double ppl_ref, nll_mean_ref;
    size_t n_samples, tokens_scored, tokens_total;
    double seconds_ref;            /* the exact passes */
    double seconds_shared_prefill; /* the prefill cache's prompts */
} kv_cont_summary;

/* res: n_caches results (n_caches may be 0: the exact model alone). */
kv_status kv_eval_continuation(kv_model *m, kv_cache *const *caches, int n_caches, const int32_t *tokens,
                               size_t n_tokens, const kv_cont_options *opt, kv_cont_summary *sum, kv_cont_result *res);

/* ---- end comparison ---- */

/* ---- backward (backward.c) ----------------------------------------------------------------
 * Gradients of the mean next-token cross-entropy of a prompt, for KVmix layer importance: one
 * forward (activations kept) and ONE backward over all layers per prompt. The model must hold f32
 * weights (kv_model_options.weights = f32, the default). Precision F32 borrows the model's weights; F64 copies them widened to
 * double (for finite-difference checks). With all_grads = 0 only the K/V projection gradients are
 * computed (and the backward stops after layer 0's K/V); 1 computes every parameter's gradient. */
typedef enum kv_grad_precision { KV_GRAD_F32 = 0, KV_GRAD_F64 = 1 } kv_grad_precision;
typedef struct kv_grad kv_grad;

kv_status kv_grad_create(kv_grad **out, const kv_model *m, kv_grad_precision prec, int all_grads);
void kv_grad_free(kv_grad *g);
/* Forward + backward over tokens[0..n) (n >= 2; loss over the n-1 predictions). k_norm / v_norm
 * (n_layers each, may be NULL) receive ||dL/dW_k||_F and ||dL/dW_v||_F per layer (biases excluded). */
kv_status kv_grad_run(kv_grad *g, const int32_t *tokens, int n_tokens, double *loss, double *k_norm,
                      double *v_norm);
/* The loss alone (forward only). */
kv_status kv_grad_loss(kv_grad *g, const int32_t *tokens, int n_tokens, double *loss);
/* A parameter by canonical name ("blk.3.attn_k.weight", "token_embd.weight", ...): its value (F64
 * only, writable for finite differences; NULL for F32) and its gradient after the last kv_grad_run
 * (NULL when not computed), as double* (F64) or float* (F32), and its element count. */
kv_status kv_grad_param(kv_grad *g, const char *name, void **value, const void **grad, size_t *numel);
/* ---- end backward ---- */

/* ---- tokenizer ---- (tokenizer*.c)
 * Byte-level BPE (GPT-2 style: Llama 3, Qwen2, SmolLM2) with the pre-tokenizer rules GGUF's
 * tokenizer.ggml.pre names, and SentencePiece-style BPE (Llama 2, llama2.c tok*.bin, sentencepiece
 * .model, HF tokenizer.json exports of Llama 2 / Mistral) with the dummy prefix, U+2581 for spaces
 * and "<0xNN>" byte fallback. Token ids equal llama.cpp's (GGUF) and sentencepiece's (.model, llama2.c)
 * on WikiText-2; tests/tokenizer keeps the reference hashes and the script that made them.
 *
 * A kv_tokenizer is immutable after creation: encode/decode may run concurrently from many threads.
 * Special tokens: user-defined tokens written in the text are always split out and map to their ids
 * (as llama.cpp does); control tokens only with KV_TOK_PARSE_SPECIAL. */
typedef struct kv_tokenizer kv_tokenizer;

/* kv_tokenizer_encode flags */
#define KV_TOK_ADD_BOS 0x1u         /* prepend BOS (KV_EINVAL if the vocabulary has none) */
#define KV_TOK_PARSE_SPECIAL 0x2u   /* control tokens written in the text ("<|im_start|>") become their ids */
#define KV_TOK_NO_SPACE_PREFIX 0x4u /* SPM kinds: no dummy prefix (text that continues earlier text) */
/* kv_tokenizer_decode flags */
#define KV_DETOK_SPECIAL 0x1u       /* render control / unknown tokens as their text (default: nothing) */
#define KV_DETOK_KEEP_PREFIX 0x2u   /* SPM kinds: keep the leading space the dummy prefix produced */

/* Build a tokenizer from tokenizer data (copied: v may be freed afterwards). KV_EUNSUPPORTED for a
 * pre-tokenizer this build does not implement (message names it). */
kv_status kv_tokenizer_create(kv_tokenizer **out, const kv_vocab_data *v);
/* kv_vocab_load + kv_tokenizer_create (arguments as kv_vocab_load). */
kv_status kv_tokenizer_load(kv_tokenizer **out, const kv_model_file *mf, const char *tokenizer_path);
void kv_tokenizer_free(kv_tokenizer *t);

/* Tokenize len bytes of text (any bytes; invalid UTF-8 is tokenized byte-wise, never an error).
 * *ids (malloc'd, caller frees; non-NULL even when *n == 0) receives *n token ids. */
kv_status kv_tokenizer_encode(int32_t **ids, size_t *n, const kv_tokenizer *t, const char *text, size_t len,
                              unsigned flags);
/* Concatenate the pieces of n ids into *text (malloc'd, NUL-terminated, *len bytes without the NUL).
 * SPM kinds with a dummy prefix drop the one leading space of the first text token (so that
 * decode(encode(x)) == x) unless KV_DETOK_KEEP_PREFIX. KV_EINVAL for an id out of range. */
kv_status kv_tokenizer_decode(char **text, size_t *len, const kv_tokenizer *t, const int32_t *ids, size_t n,
                              unsigned flags);
/* The bytes token id stands for (borrowed, NUL-terminated, *len bytes; len may be NULL): byte-level
 * BPE tokens mapped back to bytes, U+2581 back to ' ', "<0xNN>" to its byte; "" for control and
 * unknown tokens. NULL for an id out of range. */
const char *kv_tokenizer_piece(const kv_tokenizer *t, int32_t id, size_t *len);
/* For streaming generated text: the piece of id, without its leading space when prev is BOS or
 * negative (start of text) and the vocabulary uses a dummy prefix (what sentencepiece's decoder does). */
const char *kv_tokenizer_piece_after(const kv_tokenizer *t, int32_t prev, int32_t id, size_t *len);
/* The token as the vocabulary spells it ("\xC4\xA0the", "\xE2\x96\x81the", "<0x0A>"); borrowed. */
const char *kv_tokenizer_token_text(const kv_tokenizer *t, int32_t id, size_t *len);
/* Id of the token spelled exactly as the n bytes at text, or -1. */
int32_t kv_tokenizer_find(const kv_tokenizer *t, const char *text, size_t n);

int kv_tokenizer_n_vocab(const kv_tokenizer *t);
int32_t kv_tokenizer_bos(const kv_tokenizer *t);      /* -1 when absent */
int32_t kv_tokenizer_eos(const kv_tokenizer *t);      /* -1 when absent */
int kv_tokenizer_add_bos_default(const kv_tokenizer *t); /* the model's default for KV_TOK_ADD_BOS */
int kv_tokenizer_token_type(const kv_tokenizer *t, int32_t id); /* kv_token_type; 0 out of range */
/* 1 for tokens that end generation: EOS and the end-of-turn tokens llama.cpp recognizes by text
 * ("<|eot_id|>", "<|im_end|>", "<|endoftext|>", "<end_of_turn>", ...). */
int kv_tokenizer_is_eog(const kv_tokenizer *t, int32_t id);
kv_vocab_kind kv_tokenizer_kind(const kv_tokenizer *t);
const char *kv_tokenizer_pre(const kv_tokenizer *t); /* pre-tokenizer name, "" for SPM kinds */
/* ---- end tokenizer ---- */

/* ---- passkey retrieval (eval_passkey.c; DESIGN.md §9, with the continuation protocol above) ---- */
/* Passkey retrieval: a needle "The pass key is NNNNN. Remember it." at a depth (fraction of the filler
 * before it) in filler tokens taken from a corpus, an instruction before and a question after, in the
 * model's ChatML turn when its vocabulary has <|im_start|> / <|im_end|> (SmolLM2, Qwen), as plain text
 * otherwise; the assistant's answer is primed with "The pass key is". The prompt has exactly `length`
 * tokens. The key (5 digits) and the filler's offset come from the seed. */
typedef struct kv_passkey_options {
    int length;
    double depth;              /* [0, 1] */
    uint64_t seed;
} kv_passkey_options;
/* *ids (malloc'd) receives the prompt, *key the number. KV_EINVAL when length cannot hold the template
 * and one filler token, or the filler has fewer tokens than the prompt needs. */
kv_status kv_passkey_prompt(int32_t **ids, int *n, int *key, const kv_tokenizer *tok, const int32_t *filler,
                            size_t n_filler, const kv_passkey_options *opt);

typedef struct kv_passkey_answer {
    int correct;               /* the first number in the answer is the key */
    int answer;                /* that number (-1: none; digits beyond 9 ignored) */
    char text[96];             /* the answer as generated (truncated) */
    double seconds_prefill, seconds_end_prompt, seconds_decode;
} kv_passkey_answer;

/* Greedy answers of up to max_new tokens (stopping at end-of-generation tokens) for each cache, the prompt
 * prefilled in steps of prefill_chunk (own, or once through prefill_cache and copied: the first answer
 * token comes from the prompt's last position, which every cache computes the same way). */
kv_status kv_eval_passkey(kv_model *m, const kv_tokenizer *tok, kv_cache *const *caches, int n_caches,
                          kv_cache *prefill_cache, const int32_t *prompt, int n_prompt, int key, int max_new,
                          int prefill_chunk, kv_passkey_answer *answers);
/* ---- end passkey ---- */

#ifdef __cplusplus
}
#endif
#endif /* KV_MODEL_H */
