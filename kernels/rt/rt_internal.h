/* rt_internal.h — the runtime's internal structures (kernels/rt/, RUNTIME.md). Not public.
 *
 * A runtime holds, per sequence, per layer and stream (K, V), one rt_stream:
 *   - the f16 rows: the sinks (the first `sinks` tokens) and the window (tokens not compressed yet),
 *     in the stream's compression domain (keys before RoPE when the stream is pre_rope);
 *   - the compressed blocks: chunks of consecutive tokens, each stored exactly as the stream's
 *     quantizer lays out a (tokens x kv_dim) block (kvrt.h "Packed code layout").
 * Each (layer, stream) has one codec (rt_codec): how its blocks are encoded, how attention reads
 * them (scores of queries against keys, weighted sums of values) and how they decode (tests, tiles).
 * Streams with an AQUA-KV predictor are read through their reconstruction (rt_recon.c).
 *
 * Token pruning (rt_policy.c, the token policy of a sequence): a plan with a prune method holds a
 * prompt in f16 until it ends, then keeps, per KV head, the tokens the policy selects, coded by the
 * head's codec (the stream's quantizer on blocks one head wide) in per-head blocks with their
 * positions (rt_hstore). Per KV head a stream then reads, in order: the sinks, the head's kept tokens,
 * the whole-token blocks after the pruned region, the window. Attention and decoding address a head's
 * tokens by their index among the tokens it holds (its "row"), not by position: the pieces below map
 * rows to storage (kv_rti_piece_at). */
#ifndef KV_RT_INTERNAL_H
#define KV_RT_INTERNAL_H

#include "kv_quant_math.h"
#include "kv_kernels_internal.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Largest head_dim the runtime takes (per-row scratch lives on the stack). */
#define KV_RT_MAX_HEAD_DIM 1024
/* Query vectors of one KV head that one attention call handles at once (GQA group x query rows). */
#define RT_MAX_QV 64
/* Tokens a work item of the single-row attention covers (its scores stay in per-thread scratch). */
#define RT_SEGMENT 2048
/* Query rows above which attention takes the tiled path (decoded tiles + GEMM). */
#define RT_DIRECT_MAX_ROWS 4
/* Keys/values decoded per tile on the tiled path and in the generic decode kernels. */
#define RT_TILE 128

typedef enum rt_kind { RT_F16 = 0, RT_F32 = 1, RT_UNIFORM = 2, RT_HIGGS = 3, RT_FLOAT = 4 /* FP8 / NVFP4 */ } rt_kind;

struct rt_codec_ops;

/* How one (layer, stream) is stored and read. Shared by every sequence; immutable after open. */
typedef struct rt_codec {
    const struct rt_codec_ops *ops; /* the plan method's row of the codec table (rt_codecs.c) */
    rt_kind kind;                  /* the storage kind (the device codec's KV_DC_* number, rt_dev.c) */
    int direct;                    /* 1: attention reads the codes through ops->scores / ops->accum (keys after
                                      RoPE); 0: through decoded tiles (e.g. HIGGS groups spanning heads) */
    int layer, stream;
    int kv_dim, head_dim, n_kv_heads;
    int pre_rope;                  /* keys stored before RoPE (rotated when read) */
    kv_quant q;                    /* uniform / HIGGS descriptor (kind RT_UNIFORM / RT_HIGGS) */
    const kv_plan_predictor *pred; /* AQUA-KV predictor or NULL (borrowed from the plan) */
    float rpc_ratio;               /* KVmix recent pivotal context, 0 = fixed window */
    int granule;                   /* tokens compressed together at least (whole key groups) */
    int per_word, bits;            /* packing of codes / indices */
    float *signs;                  /* HIGGS: kv_dim random signs */
    int higgs_direct;              /* HIGGS: groups lie inside one head (g divides head_dim) */
    int share_from;                /* XQuant: the layer whose codes this stream decodes, or -1 */
    kv_grid_search *search;        /* HIGGS encoder accelerator (d <= 2) or NULL */
    float *lut;                    /* FP8 / NVFP4: the value of every element code (rt_float.c) */
    const kv_plan_squat *squat;    /* SQuat keys (a uniform tokens-axis K stream after RoPE), or NULL */
    kv_squat **sq_basis;           /* SQuat with a stored basis: per KV head, the encoder of the plan's basis (the
                                      static variant's, and the prompt variant's fallback), or NULL */
} rt_codec;

/* Byte layout of a block of m tokens: [codes][scales or norms][zeros]. */
typedef struct rt_layout {
    size_t code_bytes, param_bytes, total; /* param_bytes: one array (scales or norms) */
    size_t groups;
} rt_layout;
void kv_rti_codec_layout(const rt_codec *c, int m, rt_layout *out);
/* The layout of a quantizer's block (uniform, HIGGS, float rows of the table): from kv_quant_storage. */
void kv_rti_quant_layout(const rt_codec *c, int m, rt_layout *out);

/* One compressed chunk: tokens [t0, t0 + m) of the sequence. */
typedef struct rt_block {
    int t0, m;
    uint8_t *data;         /* rt_layout.total bytes, allocated exactly: [own codes][parameters] */
    const uint32_t *codes; /* the codes it decodes: its own (data), or for XQuant shared codes those of the
                              same chunk of the layer it shares with (owned there) */
} rt_block;

/* A block of one KV head's kept tokens (token pruning): `b` holds m rows in the head codec's layout
 * (t0 = the first row's position); their positions are pos[0..m) when they are not consecutive (owned,
 * counted as index bytes), else NULL. k0: the index of its first row among the head's kept tokens. */
typedef struct rt_hblock {
    rt_block b;
    int32_t *pos;
    int k0;
} rt_hblock;

/* The kept tokens of one KV head of a stream, in position order. */
typedef struct rt_hstore {
    int n_blocks, cap_blocks;
    rt_hblock *blocks;
    int kept;           /* rows held: the sum of the blocks' m */
} rt_hstore;

typedef struct rt_stream {
    int comp_end;       /* tokens [sel_end, comp_end) are in whole-token blocks; [comp_end, n) in the window */
    int n_blocks, cap_blocks;
    rt_block *blocks;
    uint16_t *fp;       /* fp_rows x kv_dim f16: the sinks held (min(n, sinks) rows), then the window */
    int fp_rows;
    rt_hstore *heads;   /* n_kv_heads when the plan prunes tokens (the pruned region [sinks, sel_end)), else NULL */
    /* device runtimes (rt_dev.c): fp and the blocks' data are device memory, fp holds room for fp_cap rows, and
     * dtab is the device copy of the block descriptors (room for dtab_cap) */
    int fp_cap, dtab_cap;
    struct kv_dblock *dtab;
} rt_stream;

/* The token policy's state of one (sequence, layer) (rt_policy.c). */
typedef struct rt_pstate {
    int sel_end;        /* positions [sinks, sel_end) are the pruned region, held per KV head; sinks before */
    /* accumulated attention (H2O): per KV head acc_cap floats, the scores of positions [acc_base, acc_base + acc_n) */
    float *acc;
    int acc_base, acc_n, acc_cap;
    /* the last queries attended (SnapKV, PyramidKV): wq_n rows of n_heads * head_dim floats (as given, after
     * RoPE), the queries of positions [wq_end - wq_n, wq_end), oldest first; room for rt->wq_rows */
    float *wq;
    int wq_n, wq_end;
    int q_seen;         /* the queries of positions [0, q_seen) were attended, each once and in order; -1 otherwise */
} rt_pstate;

/* A stream's reconstruction, f32, covering tokens [sinks, sinks + rows) (the compressed ones), in the
 * stream's compression domain: the working set of AQUA-KV (rt_recon.c). */
typedef struct rt_recon {
    float *x;
    int rows, cap;
} rt_recon;

/* SQuat's prompt subspace of one (sequence, layer) (rt_squat.c): per KV head the Gram matrix of the
 * queries of its GQA group attended before the layer's first compression, then the encoders made from
 * its top-r eigenvectors at that compression. */
typedef struct rt_sqstate {
    double *gram;        /* n_kv_heads x head_dim x head_dim (upper triangles) while accumulating, else NULL */
    int64_t rows;        /* query vectors accumulated per KV head (query rows x GQA group) */
    int frozen;          /* the subspace is chosen (the first compression happened) */
    int use_basis;       /* frozen with fewer than r query vectors: the plan's basis encoders */
    kv_squat **enc;      /* n_kv_heads encoders (frozen, not use_basis), else NULL */
} rt_sqstate;

typedef struct rt_seq {
    int *layer_n;        /* tokens appended per layer */
    int *ev;             /* per layer: the first position it holds (windowed layers that drop what left the window,
                            RUNTIME.md §11: positions [0, ev) are gone, sinks included; row v is position ev + v);
                            0 for every other layer */
    rt_sqstate *sq;      /* n_layers when the plan has SQuat keys with the prompt subspace, else NULL */
    rt_stream *st;       /* n_layers * 2 */
    rt_recon *recon;     /* n_layers * 2 */
    rt_pstate *ps;       /* n_layers: the token policy's state */
    int prompt_open;     /* tokens were appended and the prompt has not ended (kv_rt_end_prompt) */
    int prompt_ended;    /* the prompt ended (selection applied): later tokens follow the decoding semantics */
    uint64_t allocated;  /* cache storage bytes (blocks, block descriptors, f16 rows, kept positions) */
    uint64_t overhead;   /* the descriptor part of allocated */
    struct rt_arena *arena; /* device runtimes: the pages holding the sequence's blocks (rt_dev.c) */
} rt_seq;

/* Per-thread scratch of attention. */
typedef struct rt_scratch {
    float *buf;
    size_t cap; /* floats */
} rt_scratch;

struct kv_rt {
    const kv_plan *plan;
    kv_rt_options opt;
    int n_layers, n_kv_heads, head_dim, kv_dim, n_heads, group; /* group = n_heads / n_kv_heads */
    int sinks, recent;
    float scale;
    rt_codec *codec;     /* n_layers * 2 */
    rt_seq *seqs;        /* opt.n_seqs */
    kv_pool *pool;
    int own_pool;        /* 1: pool was created here */
    int n_threads;
    rt_scratch *scratch; /* n_threads */
    /* RoPE table (pre-RoPE streams): cos/sin of rope_n positions x head_dim/2 pairs; the windowed layers' own
     * (inv_freq_local, rope_cos_local, rope_sin_local) when kv_rt_options.rope_inv_freq_local gave them */
    double *inv_freq, *inv_freq_local;
    float *rope_cos, *rope_sin, *rope_cos_local, *rope_sin_local;
    int rope_n;
    int any_pre_rope;
    int squat_prompt;    /* some layer's SQuat keys take the prompt subspace (per-sequence state, rt_squat.c) */
    int *recon_last_use; /* n_layers*2: last layer that reads (layer, stream)'s reconstruction; -1 none */
    kv_grid_search **search; /* per plan grid */
    /* token policy (rt_policy.c) */
    const struct rt_policy *policy; /* the plan's prune method (the "none" policy when it prunes nothing) */
    rt_codec *hcodec;    /* pruning: n_layers * 2 * n_kv_heads codecs of one KV head ((layer*2 + stream)*H + h) */
    double *budget;      /* pruning: n_layers budgets (fractions of the f16 cache) */
    int window;          /* pruning: the observation / recent window kept whole at the prompt's end */
    int hold_prompt;     /* a prompt stays in f16 until it ends (pruning plans, prompt_stats) */
    int collect_acc;     /* accumulate attention while the prompt is open (H2O; prompt_stats) and after (H2O) */
    int wq_rows;         /* last queries kept while the prompt is open (SnapKV/PyramidKV: window; prompt_stats) */
    /* attention windows (plan 1.5, RUNTIME.md §11) */
    int *win;            /* n_layers: the layer's window W (a query at p sees positions p - W + 1 .. p), 0 = full */
    int *evicts;         /* n_layers: 1 when the layer drops the tokens that left its window (0: masked only, for a
                            layer whose tokens another stream still reads: predictor inputs, shared codes) */
    int any_window;
    struct rt_devstate *dv; /* device runtimes (KV_RT_DEVICE_CUDA, _CUDA_MODEL): the device side, else NULL */
};

static inline rt_stream *rt_stream_of(kv_rt *rt, int seq, int layer, int stream) {
    return &rt->seqs[seq].st[layer * 2 + stream];
}
static inline const rt_codec *rt_codec_of(const kv_rt *rt, int layer, int stream) {
    return &rt->codec[layer * 2 + stream];
}
/* Rows of f16 sinks a stream holds when the sequence has n tokens. */
static inline int rt_sinks_held(const kv_rt *rt, int n) { return n < rt->sinks ? n : rt->sinks; }
/* The codec of KV head h's kept tokens of (layer, stream) (pruning plans). */
static inline const rt_codec *rt_hcodec_of(const kv_rt *rt, int layer, int stream, int h) {
    return &rt->hcodec[((size_t)layer * 2 + (size_t)stream) * (size_t)rt->n_kv_heads + (size_t)h];
}
/* Tokens KV head h of (layer) holds in sequence seq: its rows (the same for K and V). */
int kv_rti_head_rows(const kv_rt *rt, int seq, int layer, int h);
/* Position of row v of KV head h. */
int kv_rti_row_position(const kv_rt *rt, int seq, int layer, int h, int v);

/* ---- the codec table (rt_codecs.c): one row per plan method --------------------------------------------
 * A row says what the runtime does with a stream of its method; rt_codec.c, rt_attend.c and rt_dev.c call the
 * row and never branch on the method. A method's row and functions live in its own file (rt_codec_fp.c,
 * rt_codec_uniform.c, rt_codec_higgs.c, rt_codec_float.c), its attention kernels in rt_fp.c, rt_uniform.c,
 * rt_higgs.c, rt_float.c. Adding a method: its enum value (kv_plan.h), its files, one row in rt_codecs.c. */
struct kv_dcodec;
typedef struct rt_codec_ops {
    const char *name;
    int squat_keys;        /* 1: a key stream of this method may be quantized by SQuat (same storage) */
    int bound;             /* the attention bound's terms (rt_selfcheck.c): 0 |x| per value, 1 |x| + 2 |zero|
                              (uniform), 2 the group's norm (HIGGS) */
    /* The quantizer descriptor of a stream record (kv_quant_from_plan; calibration quantizes through it too). */
    kv_status (*quant)(kv_quant *q, const kv_plan *p, int layer, int stream);
    /* The method's part of the codec (kind, packing, tables, direct); the common fields and c->q are set. */
    kv_status (*init)(rt_codec *c, const kv_plan *p, int layer, int stream, kv_grid_search *const *search);
    /* The codec of one KV head's kept tokens (token pruning), after the common fields were copied; NULL:
     * nothing more to do. */
    kv_status (*head_init)(rt_codec *dst, const rt_codec *full, int h);
    void (*layout)(const rt_codec *c, int m, rt_layout *out);
    kv_status (*encode)(const rt_codec *c, uint8_t *blk, int m, const float *x);
    kv_status (*decode)(const rt_codec *c, const rt_block *b, float *out);
    void (*decode_head)(const rt_codec *c, const rt_block *b, int r0, int r1, int h, float *out, size_t ldo);
    /* Attention from the codes of one KV head (c->direct; keys after RoPE), rows [r0, r1) of block b:
     *   prep_floats/prepare: per query vector, tables built once per step (NULL / 0: none);
     *   scores: out[j * ld + (t - r0)] = q_j . k_hat[t];
     *   accum:  acc[j * hd + c] += sum_t p[j * ld + (t - r0)] v_hat[t][c], or, with finish, in a rotated domain
     *           that finish(c, h, nq, racc, acc) takes back once per step. */
    size_t (*prep_floats)(const rt_codec *c);
    void (*prepare)(const rt_codec *c, int h, const float *q, float *prep);
    void (*scores)(const rt_codec *c, const rt_block *b, int r0, int r1, int h, const float *q, const float *prep,
                   int nq, float *out, size_t ld);
    void (*accum)(const rt_codec *c, const rt_block *b, int r0, int r1, int h, const float *p, size_t ld, int nq,
                  float *acc);
    void (*finish)(const rt_codec *c, int h, int nq, float *racc, float *acc);
    /* Keys stored before RoPE (c->pre_rope) scored from the codes without a decoded tile: rows [r0, r1) of block b
     * at positions p0 + (t - r0), or pos[t - r0], rotated with rt's RoPE; out as scores. Returns 0 (nothing done)
     * when the codec's layout is not one it takes (the caller reads decoded tiles then); NULL: always tiles. */
    int (*scores_rope)(const kv_rt *rt, const rt_codec *c, const rt_block *b, int r0, int r1, int h, int p0,
                       const int32_t *pos, const float *q, int nq, float *out, size_t ld);
    /* The device column (RUNTIME.md §10): what the device cannot serve (NULL: all), and the device codec's
     * fields and tables (uploaded through kv_rti_dev_table), with dq the device copy of c->q. */
    kv_status (*dev_check)(const kv_rt *rt, const rt_codec *c);
    kv_status (*dev_describe)(kv_rt *rt, const rt_codec *c, struct kv_dcodec *d, kv_quant *dq);
} rt_codec_ops;
/* The row of a plan method, or NULL for a value that is not one. */
const rt_codec_ops *kv_rti_codec_ops(int method);
extern const rt_codec_ops kv_rti_codec_fp, kv_rti_codec_uniform, kv_rti_codec_higgs, kv_rti_codec_fp8_e4m3,
    kv_rti_codec_fp8_e5m2, kv_rti_codec_nvfp4;
/* A quantizer's refusal of a stream's values, naming the stream (the caller adds the plan). */
kv_status kv_rti_quant_refusal(kv_status s, int layer, int stream);
/* "K" / "V". */
static inline const char *rt_stream_name(int stream) { return stream == KV_PLAN_K ? "K" : "V"; }

/* ---- codecs (rt_codec.c: what every method shares; the rows above for the rest) ---- */
kv_status kv_rti_codec_init(rt_codec *c, const kv_plan *p, int layer, int stream, kv_grid_search *const *search);
/* The codec of KV head h's tokens alone: full's quantizer on blocks of head_dim channels (HIGGS signs of
 * the head's channels: kv_higgs.channel0). Kernels read its blocks as head 0. */
kv_status kv_rti_codec_head_init(rt_codec *dst, const rt_codec *full, int h);
void kv_rti_codec_free(rt_codec *c);
/* Encode m tokens x kv_dim (row-major f32) into blk (rt_layout.total bytes). */
kv_status kv_rti_codec_encode(const rt_codec *c, uint8_t *blk, int m, const float *x);
/* Decode rows [r0, r1) of KV head h of a block into out (row stride ldo), in the compression domain
 * (no RoPE). */
void kv_rti_codec_decode_head(const rt_codec *c, const rt_block *blk, int r0, int r1, int h, float *out, size_t ldo);
/* The whole block, all channels (m x kv_dim). */
kv_status kv_rti_codec_decode(const rt_codec *c, const rt_block *blk, float *out);

/* Compressed-form kernels of one KV head (RUNTIME.md §3). A block of m tokens is read through its
 * codes and its parameters (scales then zero points, or norms), passed apart so that a stream can
 * read codes stored elsewhere (XQuant shared codes). `nq` query vectors of head_dim floats (already
 * scaled), rows [r0, r1) of the block:
 *   scores: out[j * ld + (t - r0)] = q_j . k_hat[t]  (keys after RoPE: codecs with pre_rope = 0);
 *   accum:  acc[j * hd + c] += sum_t p[j * ld + (t - r0)] v_hat[t][c]. */
void kv_rti_block_parts(const rt_codec *c, const rt_block *blk, const uint32_t **codes, const uint8_t **params);
void kv_rti_uniform_scores(const rt_codec *c, const uint32_t *codes, const uint8_t *params, int m, int r0, int r1,
                       int h, const float *q, int nq, float *out, size_t ld);
void kv_rti_uniform_accum(const rt_codec *c, const uint32_t *codes, const uint8_t *params, int m, int r0, int r1,
                      int h, const float *p, size_t ld, int nq, float *acc);
/* HIGGS: per query vector lookup tables of its rotated copy against the grid (kv_rti_higgs_prepare),
 * then scores; values accumulate in the rotated domain (racc, nq x head_dim) and kv_rti_higgs_finish
 * transforms them back once (acc += D H racc; racc is overwritten). */
size_t kv_rti_higgs_prep_floats(const rt_codec *c);
void kv_rti_higgs_prepare(const rt_codec *c, int h, const float *q, float *prep);
void kv_rti_higgs_scores(const rt_codec *c, const uint32_t *codes, const uint8_t *params, int m, int r0, int r1,
                     int h, const float *prep, int nq, float *out, size_t ld);
void kv_rti_higgs_accum(const rt_codec *c, const uint32_t *codes, const uint8_t *params, int m, int r0, int r1,
                    int h, const float *p, size_t ld, int nq, float *racc);
void kv_rti_higgs_finish(const rt_codec *c, int h, int nq, float *racc, float *acc);
/* Keys stored before RoPE: scores of rows [r0, r1) of a block (positions p0 + i, or pos[i]) against nq scaled query
 * vectors without a decoded tile; 0 (nothing done) for layouts the vector kernel does not take (the row's
 * scores_rope). */
int kv_rti_higgs_scores_rope(const kv_rt *rt, const rt_codec *c, const uint32_t *codes, const uint8_t *params, int r0,
                         int r1, int h, int p0, const int32_t *pos, const float *q, int nq, float *out, size_t ld);
/* 1 when the AVX2 kernels of rt_higgs_avx2.c take the codec's blocks: 4-bit indices (16 grid points) whose head and
 * group boundaries fall on words (a head's and a group's pieces multiples of 8, tokens whole words), at most
 * RT_HIGGS_MAX_HGROUPS groups per head, and a CPU with AVX2. */
int kv_rti_higgs_words_aligned(const rt_codec *c);

/* FP8 / NVFP4 (rt_float.c): the codec's kind, packing and element table from c->q.fp; kernels as the
 * uniform ones (params: the NVFP4 block scales); decode of one head's rows. */
kv_status kv_rti_float_init(rt_codec *c);
void kv_rti_float_scores(const rt_codec *c, const uint32_t *codes, const uint8_t *params, int m, int r0, int r1, int h,
                     const float *q, int nq, float *out, size_t ld);
void kv_rti_float_accum(const rt_codec *c, const uint32_t *codes, const uint8_t *params, int m, int r0, int r1, int h,
                    const float *p, size_t ld, int nq, float *acc);
void kv_rti_float_decode_head(const rt_codec *c, const rt_block *b, int r0, int r1, int h, float *out, size_t ldo);

/* f16 rows (row stride ld halves): scores and weighted sums, nq queries, rows [0, n). */
void kv_rti_f16_scores(const uint16_t *x, size_t ld, int n, int hd, const float *q, int nq, float *out, size_t ldo);
void kv_rti_f16_accum(const uint16_t *x, size_t ld, int n, int hd, const float *p, size_t ldp, int nq, float *acc);
void kv_rti_f32_scores(const float *x, size_t ld, int n, int hd, const float *q, int nq, float *out, size_t ldo);
void kv_rti_f32_accum(const float *x, size_t ld, int n, int hd, const float *p, size_t ldp, int nq, float *acc);

/* ---- RoPE (rt_rope.c) ---- */
kv_status kv_rti_rope_reserve(kv_rt *rt, int n_pos);
/* Rotate rows (head_dim floats each, stride ld) of tokens at positions p0, p0 + 1, ... (the global table) */
void kv_rti_rope_rows(const kv_rt *rt, float *x, size_t ld, int n, int p0);
/* The cos/sin table of a layer's keys: the windowed layers' own when the runtime has one, else the global one. */
void kv_rti_rope_table(const kv_rt *rt, int layer, const float **cs, const float **sn);
/* kv_rti_rope_rows with the layer's table. */
void kv_rti_rope_rows_layer(const kv_rt *rt, int layer, float *x, size_t ld, int n, int p0);
/* The same at positions pos[0..n). */
void kv_rti_rope_rows_at(const kv_rt *rt, int layer, float *x, size_t ld, int n, const int32_t *pos);

/* ---- reconstruction working set (rt_recon.c) ---- */
/* Make rt->seqs[seq].recon[layer*2+stream] cover every compressed token of the stream. */
kv_status kv_rti_recon_ensure(kv_rt *rt, int seq, int layer, int stream);
/* Drop reconstructions no later layer of this step reads (after attending `layer`). */
void kv_rti_recon_release(kv_rt *rt, int seq, int layer);
void kv_rti_recon_free(kv_rt *rt, rt_recon *r);
/* Predictor inputs of rows [t0, t0 + m) (absolute token indices, compressed) of (layer, stream). */
kv_status kv_rti_recon_inputs(kv_rt *rt, int seq, int layer, int stream, int t0, const float **inputs);

/* ---- reading a stream (kv_rti_attend.c) ---- */
/* Where a KV head's rows of a stream live: f16 rows (sinks, window), a block (whole-token, or the head's
 * own kept tokens), or a reconstruction. */
typedef enum rt_piece_kind { RT_PIECE_FP16 = 0, RT_PIECE_BLOCK = 1, RT_PIECE_RECON = 2 } rt_piece_kind;
typedef struct rt_piece {
    rt_piece_kind kind;
    int a, b;            /* the head's rows [a, b) */
    const uint16_t *fp;  /* FP16: the row of row a (row stride kv_dim; the head's channels at kh * head_dim) */
    const float *recon;  /* RECON: the row of row a (row stride kv_dim) */
    const rt_block *blk; /* BLOCK: its rows [r0, r0 + b - a) */
    int r0;
    const rt_codec *codec; /* BLOCK: the codec that reads it (the stream's, or the head's for kept tokens) */
    int kh;              /* the head index the kernels take: h, or 0 for a head's own blocks */
    int p0;              /* position of row a (rows of the piece are consecutive positions unless pos) */
    const int32_t *pos;  /* kept tokens: the positions of rows [a, b), or NULL (consecutive from p0) */
} rt_piece;
/* The piece holding row v of KV head h of (layer, stream), clipped to [v, end). Predicted streams are
 * read through their reconstruction (which must be ensured). */
void kv_rti_piece_at(const kv_rt *rt, int seq, int layer, int stream, int h, int v, int end, rt_piece *p);
/* Rows [a, b) of (layer, stream) for KV head h decoded to f32 rows (stride ldo): keys after RoPE.
 * Reserves the RoPE table and ensures reconstructions: call from one thread. */
kv_status kv_rti_read_rows(kv_rt *rt, int seq, int layer, int stream, int h, int a, int b, float *out, size_t ldo);
/* The same without reserving or ensuring anything (inside parallel work, after kv_rti_read_prepare). */
void kv_rti_read_rows_ready(const kv_rt *rt, int seq, int layer, int stream, int h, int a, int b, float *out, size_t ldo);
kv_status kv_rti_read_prepare(kv_rt *rt, int seq, int layer, int stream);

/* ---- attention (kv_rti_attend.c) ---- */
kv_status kv_rti_attend(kv_rt *rt, int layer, int seq, int n_q, const float *q, size_t ldq, float *out, size_t ldo);

/* ---- SQuat keys (rt_squat.c, rt_codec.c) ---- */
/* Checks of a SQuat stream and its basis encoders (from kv_rti_codec_init). */
kv_status kv_rti_squat_codec_init(rt_codec *c, const kv_plan *p, int layer);
/* Encode m tokens x kv_dim of a SQuat key stream: per KV head its columns with enc[h], into the uniform
 * tokens-axis block layout. */
kv_status kv_rti_codec_encode_squat(const rt_codec *c, uint8_t *blk, int m, const float *x, kv_squat *const *enc);
/* The encoders of (seq, layer) (choosing the prompt subspace at the first call) and the encode. */
kv_status kv_rti_squat_encode(kv_rt *rt, int seq, int layer, uint8_t *blk, int m, const float *x);
/* Accumulate the Gram matrices of a layer's queries (kv_rt_attend; the prompt variant before the layer's
 * first compression). */
kv_status kv_rti_squat_saw_queries(kv_rt *rt, int seq, int layer, int n_q, const float *q, size_t ldq);
kv_status kv_rti_squat_seq_init(kv_rt *rt, rt_seq *sq);
void kv_rti_squat_seq_clear(kv_rt *rt, rt_seq *sq);
void kv_rti_squat_seq_free(kv_rt *rt, rt_seq *sq);
uint64_t kv_rti_squat_working_bytes(const kv_rt *rt, int seq);
/* kv_rt_prompt_copy: the source's accumulated queries go with its prompt. */
kv_status kv_rti_squat_prompt_copy(kv_rt *dst, int dst_seq, const kv_rt *src, int src_seq);

/* ---- token policy (rt_policy.c): token selection under a memory budget ---- */
typedef enum rt_score_kind {
    RT_SCORE_NONE = 0,   /* no selection */
    RT_SCORE_RECENCY,    /* the most recent tokens (StreamingLLM: sinks + recent) */
    RT_SCORE_ACCUMULATED,/* attention accumulated over every query (H2O) */
    RT_SCORE_WINDOW      /* attention of the prompt's last `window` queries, pooled (SnapKV, PyramidKV) */
} rt_score_kind;
typedef struct rt_policy {
    kv_plan_prune method;
    const char *name;
    rt_score_kind score;
    int pooled;          /* scores smoothed with the plan's pooling kernel */
    int layer_schedule;  /* per-layer budgets falling with depth when the plan gives none (PyramidKV) */
    int decode_chunks;   /* chunks leaving the window after the prompt are selected too (H2O) */
    int min_window;      /* least observation window */
} rt_policy;
const rt_policy *kv_rti_policy_of(kv_plan_prune method); /* NULL for an unknown method */
/* Refusals of plans this policy cannot apply (at open), naming the layer and stream. */
kv_status kv_rti_policy_check(const kv_plan *p);
/* Set up the runtime's policy fields and head codecs (after the codecs). */
kv_status kv_rti_policy_open(kv_rt *rt);
void kv_rti_policy_close(kv_rt *rt);
kv_status kv_rti_policy_seq_init(kv_rt *rt, rt_seq *sq);
void kv_rti_policy_seq_clear(kv_rt *rt, rt_seq *sq);
/* Whether attention of (seq, layer) accumulates scores now (H2O, prompt statistics). */
int kv_rti_policy_accumulates(const kv_rt *rt, int seq, int layer);
int kv_rti_policy_prunes(const kv_rt *rt, int layer);
int kv_rti_policy_holds(const kv_rt *rt, int layer);
/* Room for n more tokens' scores (before they are appended). */
kv_status kv_rti_policy_reserve(kv_rt *rt, int seq, int layer, int n_total);
/* After an attend of n_q rows: keep the window queries and the coverage. */
kv_status kv_rti_policy_saw_queries(kv_rt *rt, int seq, int layer, int n_q, const float *q, size_t ldq);
/* Apply the selection of the prompt (every layer) and end it. */
kv_status rt_policy_end_prompt(kv_rt *rt, int seq);
/* Before an append after the prompt: select chunks leaving the window (H2O). Returns 1 in *handled when
 * the policy took the window's full chunks (the caller then compresses nothing). */
kv_status kv_rti_policy_settle(kv_rt *rt, int seq, int layer, int *handled, float *x);
/* Storage helpers of rt_runtime.c: a stream's f16 rows resized to exactly `rows` (accounted), and its
 * first m window rows dropped. */
kv_status kv_rti_fp_resize(kv_rt *rt, rt_seq *sq, rt_stream *st, int rows);
/* A compressed block of tokens [t0, t0 + m) joins the stream (bytes: what its allocation adds to the sequence's). */
kv_status kv_rti_block_push(kv_rt *rt, rt_seq *sq, rt_stream *st, int t0, int m, uint8_t *data, size_t bytes,
                        const uint32_t *codes);
kv_status kv_rti_window_drop(kv_rt *rt, int seq, rt_stream *st, int m);
/* The f16 row where a stream's window rows start: rt->sinks, or 0 once its windowed layer dropped the sinks. */
int kv_rti_fp_window0(const kv_rt *rt, int seq, const rt_stream *st);
/* Free the per-head blocks of a stream (stream_clear). */
void kv_rti_hstore_clear(rt_hstore *hs);
/* Bytes: kept-token payload and index of a stream (stats). */
void kv_rti_hstore_bytes(const kv_rt *rt, int layer, int stream, const rt_stream *st, uint64_t *payload,
                     uint64_t *index, uint64_t *values);
kv_status kv_rti_scratch_reserve(rt_scratch *s, size_t floats);
/* The runtime's pool threads call the BLAS on their own: it runs single-threaded meanwhile (the
 * previous count is returned, and restored by _end). */
int kv_rti_blas_threads_begin(void);
void kv_rti_blas_threads_end(int previous);

/* ---- AVX2 + FMA + F16C inner loops (rt_avx2.c), used when kv_rti_avx2_usable() ---- */
int kv_rti_avx2_usable(void);
void kv_rti_f16_to_f32_row_avx2(float *dst, const uint16_t *src, size_t n);
void kv_rti_f32_to_f16_row_avx2(uint16_t *dst, const float *src, size_t n);
void kv_rti_f16_scores_avx2(const uint16_t *x, size_t ld, int n, int hd, const float *q, int nq, float *out, size_t ldo);
void kv_rti_f16_accum_avx2(const uint16_t *x, size_t ld, int n, int hd, const float *p, size_t ldp, int nq, float *acc);
void kv_rti_f32_scores_avx2(const float *x, size_t ld, int n, int hd, const float *q, int nq, float *out, size_t ldo);
void kv_rti_f32_accum_avx2(const float *x, size_t ld, int n, int hd, const float *p, size_t ldp, int nq, float *acc);
void kv_rti_exp_avx2(float *x, size_t n);
void kv_rti_unpack_words_avx2(float *dst, const uint32_t *w, size_t nwords, int bits);
void kv_rti_unpack_rows_avx2(float *dst, size_t ldd, const uint32_t *codes, size_t w0, size_t wstride, int rows,
                         size_t nwords, int bits);
void kv_rti_uniform_tok_scores_avx2(const float *cf, size_t ldc, int n, int hd, const float *qs, int nj, float *acc,
                                size_t lda);
void kv_rti_uniform_chan_accum_avx2(const float *cf, size_t ldc, int n, int hd, const float *s, const int *seg, int nseg,
                                const float *p, size_t ldp, int nj, float *acc);
void kv_rti_uniform_tok_scores_fused_avx2(const uint32_t *codes, size_t run0, size_t gs, size_t i0, int n, int hd, int bits,
                                      const float *qs, const float *bias, int nj, float *out, size_t ldo);
void kv_rti_uniform_chan_accum_fused_avx2(const uint32_t *codes, size_t pos0, size_t C, int n, int hd, int bits,
                                      const float *ps, size_t lps, int nseg, const int *seg16, int nj, float *acc);
void kv_rti_uniform_fold_avx2(const float *q, int hd, int nj, const void *s, const void *z, size_t i0, int pt, float *qs,
                          float *bias);
void kv_rti_uniform_chan_weights_avx2(const void *s, const void *z, int pt, size_t lds, int nseg, const float *p,
                                  size_t ldp, int nj, int n, float *ps, float *zacc);

/* ---- vector math shared by the kernels (rt_math.c) ---- */
/* f16 -> f32 without branches, exact for every input (equal to kv_f16_to_f32): the exponent and
 * mantissa moved into place (a subnormal half becomes a float subnormal pattern times 2^112, exact
 * since the product is a normal float), Inf/NaN re-marked, the sign put back. Vectorizes. */
static inline float rt_f16(uint16_t h) {
    union { uint32_t u; float f; } o, magic;
    magic.u = (254u - 15u) << 23; /* 2^112 */
    o.u = (uint32_t)(h & 0x7fffu) << 13;
    o.f *= magic.f;
    o.u |= ((h & 0x7c00u) == 0x7c00u) ? 0x7f800000u : 0u; /* Inf / NaN */
    o.u |= (uint32_t)(h & 0x8000u) << 16;
    return o.f;
}
/* A stored quantizer parameter (f16 or f32) as a float: kv_qm_param_load's value, without branches. */
static inline float rt_param(const void *arr, size_t i, int type) {
    return type == KV_PARAM_F16 ? rt_f16(((const uint16_t *)arr)[i]) : ((const float *)arr)[i];
}
/* The HIGGS decoding multipliers of a tile of n <= ldm tokens from t0 for one head's ng groups (its first group g0;
 * groups of g values, gpt per token): mul[gi * ldm + i], as the AVX2 tile kernels of rt_higgs_avx2.c read them. */
static inline void rt_higgs_tile_muls(float *mul, size_t ldm, const void *params, int norm_type, size_t gpt, size_t g0,
                                      size_t ng, size_t g, int t0, int n) {
    for (size_t gi = 0; gi < ng; gi++)
        for (int i = 0; i < n; i++)
            mul[gi * ldm + (size_t)i] = kv_qm_higgs_dec_mul(rt_param(params, (size_t)(t0 + i) * gpt + g0 + gi, norm_type), g);
}
/* exp(x) for x <= 0 (scores minus their maximum), n values in place: a range reduction and a degree-6
 * polynomial, relative error below 4e-7 (tests/runtime checks it against exp over [-104, 0]);
 * 0 below -103.9. Written in 8 lanes so that every vector path gives the same bits. */
void kv_rti_exp_inplace(float *x, size_t n);
void kv_rti_exp_portable(float *x, size_t n); /* the portable loop alone (kv_rti_exp_inplace's reference) */
/* The largest of x[0..n) (n >= 1, finite values), and x[i] -= it: the softmax's shift. Exact (a
 * maximum and one subtraction per value), so every SIMD level gives the same bits. */
float kv_rti_shift_by_max(float *x, size_t n);
float kv_rti_shift_by_max_avx2(float *x, size_t n);
/* n codes of whole words (bits 1, 2, 4, 8; word-aligned) to floats. */
void kv_rti_unpack_words(float *dst, const uint32_t *w, size_t nwords, int bits);
void kv_rti_f16_to_f32_row(float *dst, const uint16_t *src, size_t n);
void kv_rti_f32_to_f16_row(uint16_t *dst, const float *src, size_t n);

#ifdef __cplusplus
}
#endif
#endif
