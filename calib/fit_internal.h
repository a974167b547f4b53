/* fit_internal.h — shared by fit.c, the fitters (fitters.c and the fit_*.c of each method family), fit_ckpt.c and
 * fit_report.c (not a public header). */
#ifndef KV_FIT_INTERNAL_H
#define KV_FIT_INTERNAL_H

#include "kv_calib.h"
#include "kvrt.h"

/* Report metric names stored in the plan (PLAN_FORMAT.md §6.8), in this order. */
#define KV_FIT_N_METRICS 8
extern const char *const kv_fit_metric_names[KV_FIT_N_METRICS];

/* The sequences a fit runs over: n_cal calibration sequences, then n_ho held-out ones, each
 * seq_len tokens (BOS first when bos_id >= 0). */
typedef struct kv_fit_seqs {
    int32_t *tokens;   /* (n_cal + n_ho) * seq_len */
    int64_t n_cal, n_ho;
    int seq_len;
} kv_fit_seqs;
kv_status kv_fit_make_seqs(kv_fit_seqs *out, const kv_fit_data *data, const kv_fit_config *cfg);
void kv_fit_seqs_free(kv_fit_seqs *s);

/* ---- FP8 / NVFP4 scale fitter (fit_float.c) ----
 * Groups: n_groups equal runs of channels of a kv_dim row (1: the tensor; n_kv_heads: the heads).
 * Pass 1: a histogram of log2|x| (KV_FIT_FLOAT_BINS per group, doubles: summed over shards) and
 * the largest |x| per group (a maximum over ranks). Candidates (KV_FIT_FLOAT_CANDS per group, named
 * kv_fit_float_cand_names): scales from the max and from percentiles. Pass 2: per group and
 * candidate, the squared error of quantizing the calibration values. Then the least-error scale. */
#define KV_FIT_FLOAT_BINS 4096
#define KV_FIT_FLOAT_CANDS 4
extern const char *const kv_fit_float_cand_names[KV_FIT_FLOAT_CANDS];
size_t kv_fit_float_hist_len(int n_groups);
void kv_fit_float_hist_add(double *hist, float *amax, const float *x, size_t rows, int kv_dim, int n_groups);
void kv_fit_float_candidates(float *cand, const double *hist, const float *amax, int n_groups, kv_fp_format fmt);
void kv_fit_float_sse_add(double *sse, const float *x, size_t rows, int kv_dim, int n_groups, kv_fp_format fmt,
                          const float *cand);
void kv_fit_float_choose(float *scales, int *which, const double *sse, const float *cand, int n_groups);

/* ---- per-token state, shard by shard (fit_store.c) ---- */
enum { KV_FIT_H = 0, KV_FIT_K, KV_FIT_V, KV_FIT_KP, KV_FIT_VP, KV_FIT_ROLES };
typedef struct kv_fit_store {
    int spill, h_f16;
    char *dir;                      /* this process's directory inside the spill directory (owned) */
    char *top;                      /* memory.spill_dir (owned) */
    int made_top;                   /* 1: this run created memory.spill_dir */
    int64_t n_local;                /* shards of this rank */
    const int64_t *shard_ids;       /* global index of each local shard (borrowed) */
    const int64_t *shard_nseq;      /* sequences of each local shard (borrowed) */
    int shard_seqs;                 /* sequences of a full shard */
    size_t per_seq[KV_FIT_ROLES];   /* values per sequence of each role */
    int slot[KV_FIT_ROLES];         /* storage slot of each role (K/V slots swap between layers) */
    void *mem[KV_FIT_ROLES];        /* in memory: per slot, every local sequence (H: f16 when h_f16) */
    float *scratch[KV_FIT_ROLES];   /* per role, one shard (spill; H when h_f16) */
    uint16_t *h16;                  /* spill + f16: one shard of H as stored */
    uint64_t bytes;                 /* held in memory */
} kv_fit_store;
/* h_per_seq / kv_per_seq: floats per sequence of H and of each K/V role. spill_dir NULL or "": in
 * memory. shard_ids / shard_nseq must outlive the store. */
kv_status kv_fit_store_init(kv_fit_store *st, const char *spill_dir, int h_f16, int64_t n_local, const int64_t *shard_ids,
                            const int64_t *shard_nseq, int shard_seqs, size_t h_per_seq, size_t kv_per_seq);
/* Frees the memory and removes this process's spill files and directory (and memory.spill_dir when
 * this run created it and it is empty). */
void kv_fit_store_free(kv_fit_store *st);
/* The values of `role` for local shard j (shard_nseq[j] * per_seq[role] floats). read = 0: the
 * caller overwrites them all (nothing is read). Valid until the next get of the same role. */
kv_status kv_fit_store_get(kv_fit_store *st, int role, int64_t j, int read, float **out);
/* Store back what get returned, after changing it. */
kv_status kv_fit_store_put(kv_fit_store *st, int role, int64_t j);
/* K <-> KP, V <-> VP: this layer's reconstructions become the next layer's inputs. */
void kv_fit_store_swap(kv_fit_store *st);

/* ---- checkpoints (fit_ckpt.c) ----
 * The directory (shared by every rank) holds, for the last finished layer L: one state file per
 * shard (written by the rank that owns it), the plan so far and the per-layer report (rank 0), and
 * the manifest naming them (rank 0, written last, after every rank's files are in place). */
#define KV_FIT_CKPT_DOUBLES 31 /* per layer: 4 metrics x 2 streams, bits x 2, forward/fit seconds,
                                  ridge rcond x 2, ridge fallback x 2, peak RSS, eta gains x 2 x 2,
                                  the SQuat metrics (10) (17, then 21 before them: older checkpoints
                                  do not match and start over) */

/* SHA-256 (hex) identifying a run's inputs: model identity, tokens, resolved configuration and
 * provenance strings (the model file is read in pieces, not mapped whole). */
kv_status kv_fit_inputs_hash(char out[65], const kv_model_file *mf, const kv_plan_fingerprint *fp,
                             const kv_fit_data *data, const kv_fit_config *cfg, const kv_fit_options *opt);

/* The layer the manifest in dir names when it matches inputs_hash, n_layers and n_shards: *layer >= 0;
 * else *layer = -1 and *why says why (static text, or kv_error_last()); no manifest: -1, why NULL. */
void kv_fit_ckpt_manifest(int *layer, const char **why, const char *dir, const char *inputs_hash, int n_layers,
                          int64_t n_shards);
/* The plan and the per-layer report (n_layers * KV_FIT_CKPT_DOUBLES) of layer `layer`. */
kv_status kv_fit_ckpt_load_common(kv_plan **plan, double *report, const char *dir, int layer, int n_layers);
/* One shard's state after `layer`: hidden states (f32), previous K/V reconstructions. */
kv_status kv_fit_ckpt_save_shard(const char *dir, int layer, int64_t shard, int64_t n_shards, const float *hidden,
                                 uint64_t n_hidden, const float *kp, const float *vp, uint64_t n_kv);
kv_status kv_fit_ckpt_load_shard(const char *dir, int layer, int64_t shard, int64_t n_shards, float *hidden,
                                 uint64_t n_hidden, float *kp, float *vp, uint64_t n_kv);
/* Rank 0, once every shard of `layer` is saved: the report, the plan, then the manifest (atomic,
 * fsync'd), then every file of other layers is removed. */
kv_status kv_fit_ckpt_commit(const char *dir, const char *inputs_hash, int layer, int n_layers, int64_t n_shards,
                             const kv_plan *plan, const double *report);
/* Remove every checkpoint file (keep the directory). Only the names this module writes are removed. */
void kv_fit_ckpt_clear(const char *dir);
/* Remove the checkpoint files, the owner file and the directory (missing ones are fine; a directory
 * still holding other files stays). */
kv_status kv_fit_ckpt_remove(const char *dir);
/* After a failed save of a later layer: remove its partial files, keeping layer `keep`'s checkpoint
 * (keep < 0: no checkpoint was complete, remove everything as kv_fit_ckpt_remove). */
void kv_fit_ckpt_drop_partial(const char *dir, int keep);

/* ---- XQuant (fit_xquant.c) ---- */
struct kv_quant;
int kv_fit_xq_active(const kv_fit_config *cfg);
/* After the uniform stream (l, st) is set up from the configuration: 1-bit layers, data-free eta,
 * shared codes with layer l-1 (layers are set up in order). KV_EINVAL naming the keys when a pair
 * would mix quantizers. No-op for other methods. */
kv_status kv_fit_xq_stream(kv_plan *p, const kv_fit_config *cfg, int l, int st);
/* Codes of each stream's local chunks: cur = the layer being quantized (kept only when layer l+1
 * shares them), prev = the previous layer's (read by a sharing stream). */
typedef struct kv_fit_xq_codes {
    uint32_t *prev[2], *cur[2];
    size_t words[2]; /* u32 words per chunk */
} kv_fit_xq_codes;
kv_status kv_fit_xq_codes_begin(kv_fit_xq_codes *c, const kv_plan *p, int l, int st, int recent, int kv_dim,
                                int64_t n_chunks_local);
void kv_fit_xq_codes_end_layer(kv_fit_xq_codes *c);
void kv_fit_xq_codes_free(kv_fit_xq_codes *c);
/* kv_quant_roundtrip, plus: codes_out (may be NULL) receives the codes; a stream with shared codes
 * encodes only its scales/zeros and decodes partner_codes (the runtime's compression). */
kv_status kv_fit_xq_roundtrip(float *x_hat, uint32_t *codes_out, const struct kv_quant *q, size_t tokens,
                              size_t channels, const float *x, const uint32_t *partner_codes);

/* Eta calibrated on data (method xquant, xquant.calibrate_eta; fit_xquant.c explains the error).
 * Per local shard, refreshed by each layer's forward: C = query second moments per KV head
 * (calibration and held-out sequences apart), P = attention weights of every 16th query. */
#define KV_FIT_XQ_QSTRIDE 16
#define KV_FIT_XQ_ETA_MAX 0.49
struct kv_capture;
typedef struct kv_fit_xq_eta {
    int on;
    int n_heads, n_kv_heads, head_dim, sinks, n_comp, n_q;
    int64_t n_local;
    const int64_t *shard_nseq;
    double **C; /* [shard][2][n_kv_heads][hd][hd] */
    float **P;  /* [shard][seq][n_q][n_heads][n_comp] */
} kv_fit_xq_eta;
kv_status kv_fit_xq_eta_init(kv_fit_xq_eta *e, const kv_fit_config *cfg, int n_heads, int n_kv_heads, int head_dim,
                             int sinks, int n_comp, int64_t n_local, const int64_t *shard_nseq);
void kv_fit_xq_eta_free(kv_fit_xq_eta *e);
/* From a layer's capture of local shard j (its first n_cal sequences are calibration ones). */
kv_status kv_fit_xq_eta_capture(kv_fit_xq_eta *e, int64_t j, int64_t n_cal, const struct kv_capture *c);
/* out[0..2] += calibration A, B, D; out[3..5] += held-out (E(eta) = A + 2 eta B + eta^2 D) for stream
 * st of local shard j from its original values Y (sequences of n_chunks chunks of recent rows);
 * partner: the shard's first chunk's partner codes (shared streams), wpc words per chunk. */
kv_status kv_fit_xq_eta_sums(const kv_fit_xq_eta *e, double out[6], const struct kv_quant *q, int st, int64_t j,
                             int64_t n_cal, const float *Y, int n_chunks, int recent, int kvd, const uint32_t *partner,
                             size_t wpc);
/* The eta minimizing the calibration E, and the held-out gains 1 - E(eta)/E(0), 1 - E(eta)/E(eta_df). */
void kv_fit_xq_eta_choose(const double sums[6], double eta_df, double *eta, double *gain0, double *gain_df);

/* ---- SQuat (fit_squat.c): r and lambda per layer from the calibration queries ----
 * Per local shard: each sequence's query Gram per KV head (double, hd x hd; all query heads of the
 * group, post-RoPE, every token), and of the held-out sequences every KV_FIT_SQ_QSTRIDE-th query
 * (from position sinks on) with all keys and values. */
#define KV_FIT_SQ_METRICS 10
extern const char *const kv_fit_sq_metric_names[KV_FIT_SQ_METRICS];
#define KV_FIT_SQ_MAX_CANDS 64
#define KV_FIT_SQ_QSTRIDE 4
struct kv_squat;
typedef struct kv_fit_sq {
    int on, prompt, fixed;      /* squat.enabled; squat.subspace prompt; squat.choose fixed */
    int n_heads, n_kv_heads, head_dim, seq_len, sinks, n_comp, recent, g, n_q;
    int64_t n_local;
    const int64_t *shard_nseq;  /* borrowed */
    int64_t *shard_ncal;        /* calibration sequences of each local shard */
    double **gram;              /* [shard][seq][G][hd][hd] */
    float **ho;                 /* [shard][held-out seq]: n_q x q_dim queries, T x kv_dim keys, T x kv_dim values */
    /* the current layer */
    double *eigval, *eigvec;    /* mean calibration Gram per KV head: G x hd (descending), G x hd x hd (rows) */
    int r_energy[3];            /* ranks holding 90 / 95 / 99 % of the query energy (largest over KV heads) */
    int n_cand, cand_r[KV_FIT_SQ_MAX_CANDS];
    float cand_lambda[KV_FIT_SQ_MAX_CANDS];
    struct kv_squat **cand_enc; /* static subspace: n_cand x G encoders */
    int r;                      /* the choice */
    float lambda;
    struct kv_squat **enc;      /* its encoders: G (static) or local sequences x G (prompt) */
    int64_t n_enc;
} kv_fit_sq;
/* squat.g, 0 = head_dim / 2 (squat.txt: g = 64 at head_dim 128). */
int kv_fit_sq_g(const kv_fit_config *cfg, int head_dim);
kv_status kv_fit_sq_init(kv_fit_sq *e, const kv_fit_config *cfg, int n_heads, int n_kv_heads, int head_dim, int seq_len,
                         int sinks, int n_comp, int recent, int64_t n_local, const int64_t *shard_nseq,
                         const int64_t *shard_ncal);
void kv_fit_sq_free(kv_fit_sq *e);
/* From a layer's capture of local shard j (its first shard_ncal[j] sequences are calibration ones). */
kv_status kv_fit_sq_capture(kv_fit_sq *e, int64_t j, const struct kv_capture *c);
/* The summed calibration Gram: G x hd x hd doubles, then the number of sequences. */
size_t kv_fit_sq_gram_len(const kv_fit_sq *e);
void kv_fit_sq_gram_part(const kv_fit_sq *e, int64_t j, double *out);
/* From the summed Gram (every rank, the same input): the spectra and the candidates (r, lambda). */
kv_status kv_fit_sq_candidates(kv_fit_sq *e, const double *gram_sum, const kv_fit_config *cfg);
/* Per candidate and KV head: score error^2, score^2, output error^2, output^2, added over the held-out
 * sequence b of local shard j, whose quantizer input is X (n_comp x kv_dim). */
size_t kv_fit_sq_err_len(const kv_fit_sq *e);
kv_status kv_fit_sq_err_seq(const kv_fit_sq *e, double *out, int64_t j, int64_t b, const float *X,
                            const kv_uniform *uq);
/* The least output error (ties: smaller r; squat.choose fixed: squat.r / squat.lambda) into e->r,
 * e->lambda; metrics[KV_FIT_SQ_METRICS] as kv_fit_sq_metric_names. */
void kv_fit_sq_choose(kv_fit_sq *e, const double *err, const kv_fit_config *cfg, double *metrics);
/* The static basis of the choice: G x r x hd. */
kv_status kv_fit_sq_static_basis(const kv_fit_sq *e, float *basis);
/* The choice's encoders for kv_fit_sq_roundtrip. */
kv_status kv_fit_sq_encoders(kv_fit_sq *e);
/* One chunk (recent x kv_dim) of local sequence lseq, every head through its SQuat encoder. */
kv_status kv_fit_sq_roundtrip(float *x_hat, const kv_fit_sq *e, int64_t lseq, const kv_uniform *uq, int recent, int kvd,
                              const float *x);
/* A Gram's top-r subspace in kv_squat_subspace_ref's layout (qhat r x hd) and the energy it holds. */
kv_status kv_fit_sq_gram_basis(float *qhat, double *energy, const double *gram, int hd, int r);

/* ---- the state of one kv_fit_run (fit.c), which the fitters' hooks read ---------------------------- */
typedef struct kv_fit_state {
    kv_model *m;
    const kv_fit_config *cfg;
    const kv_fit_options *opt;
    kv_dist *dist;
    int rank, size;
    kv_plan *plan;
    kv_fit_seqs seqs;
    int L, d_model, kv_dim;
    int seq_len, sinks, recent, n_chunks, n_comp; /* per sequence */
    int64_t n_seqs;             /* every rank's */
    int shard_seqs;
    int64_t n_shards, n_local, max_local; /* shards: all, this rank's, the most any rank has */
    int64_t *shard_ids;         /* n_local: global index of each of this rank's shards */
    int64_t *shard_nseq;        /* n_local: its sequences */
    kv_fit_store st;            /* hidden states and K/V of this rank's shards */
    int32_t *pos;               /* positions of one shard */
    double *layer_report;       /* n_layers * KV_FIT_CKPT_DOUBLES */
    size_t weight_bytes_max;
    kv_grid_search *search[64]; /* per plan grid (at most 64, PLAN_FORMAT.md §6.3) */
    kv_fit_xq_codes xq;         /* XQuant: codes of the lower layer of a sharing pair */
    kv_fit_xq_eta xqe;          /* XQuant: eta statistics of the current layer */
    kv_fit_sq sq;               /* SQuat: query Grams, held-out queries, the layer's choice */
    int sq_layer;               /* 1 while the current layer's K stream is quantized by SQuat */
} kv_fit_state;

/* Sequences of shard k (every rank's numbering). */
static inline int64_t kv_fit_shard_nseq(const kv_fit_state *r, int64_t k) {
    const int64_t first = k * r->shard_seqs;
    return r->n_seqs - first < r->shard_seqs ? r->n_seqs - first : r->shard_seqs;
}

/* Calibration sequences of shard k (they come first, so they are the shard's first ones). */
static inline int64_t kv_fit_shard_ncal(const kv_fit_state *r, int64_t k) {
    int64_t c = r->seqs.n_cal - k * r->shard_seqs;
    const int64_t n = kv_fit_shard_nseq(r, k);
    return c < 0 ? 0 : c > n ? n : c;
}

/* ---- the fitters (fitters.c): one row per kv_fit_method, driven by fit.c's layer-sequential loop ----
 * A row is what the loop asks of a method:
 *   preset        the configuration keys --method sets before the user's (kv_fit_config_method_preset);
 *   setup_stream  the stream's record in the plan before any layer is fitted (its plan method: uniform, f16,
 *                 HIGGS on a grid, FP8 / NVFP4 with scales 1 until calibrated), given the settings every
 *                 stream shares (scale dtype, RPC ratio, pre-RoPE keys, word packing) already set;
 *   calibrate     per layer, after the stream's predictor (if any) and before its quantization pass: the
 *                 statistics over the calibration shards and the choice they make (FP8 / NVFP4 scales;
 *                 XQuant's eta and SQuat's r and lambda on uniform streams), with its report fields in lr
 *                 (NULL: nothing to calibrate). Every rank calls it (collectives inside).
 * Predictors (AQUA-KV, traits KV_FIT_T_PREDICTS) are fitted by the loop itself (fit.c, ridge.c). */
typedef struct kv_fit_stream_setup {
    kv_plan *plan;
    const kv_fit_config *cfg;
    const kv_fit_options *opt; /* NULL: defaults (kv_fit_plan_uncalibrated) */
    int layer, stream;
    int bits, explicit_bits;   /* the stream's bits; 1 when not the config's stream default */
    int head_dim, higgs_group; /* higgs.group_size, 0 resolved to head_dim */
    double *grid_seconds;      /* += time generating HIGGS grids */
} kv_fit_stream_setup;
typedef struct kv_fitter {
    kv_fit_method method;
    const char *const *preset; /* "key=value" settings, NULL-terminated */
    kv_status (*setup_stream)(const kv_fit_stream_setup *c);
    kv_status (*calibrate)(kv_fit_state *r, int layer, int stream, const kv_plan_predictor *pred,
                           kv_fit_layer_report *lr);
} kv_fitter;
/* The row of a method (an index in [0, KV_FIT_METHOD_COUNT): the caller has validated the configuration). */
const kv_fitter *kv_fitter_of(kv_fit_method method);

/* Stream set-up and calibration of each method family: */
kv_status kv_fit_uniform_setup(const kv_fit_stream_setup *c); /* fitters.c: uniform codes, or f16 at 16 bits */
kv_status kv_fit_higgs_setup(const kv_fit_stream_setup *c);   /* fit_higgs.c: a HIGGS grid (generated or cached) */
kv_status kv_fit_fp8_setup(const kv_fit_stream_setup *c);     /* fit_float.c: FP8 E4M3 / E5M2 (fp.fp8_format) */
kv_status kv_fit_nvfp4_setup(const kv_fit_stream_setup *c);   /* fit_float.c: NVFP4 */
/* fit_float.c: the stream's FP8 / NVFP4 tensor scales from the calibration values (fp.scale) */
kv_status kv_fit_float_scales(kv_fit_state *r, int layer, int stream, const kv_plan_predictor *pred,
                              kv_fit_layer_report *lr);
/* fit_xquant.c: XQuant's eta of a uniform stream without a predictor (xquant.calibrate_eta), into lr's eta gains */
kv_status kv_fit_xq_eta_search(kv_fit_state *r, int layer, int stream, kv_fit_layer_report *lr);
/* fit_squat.c: SQuat's r and lambda of the layer's keys (squat.enabled) from the query Grams and held-out
 * errors, into lr->squat; sets r->sq_layer when the keys' pass uses SQuat. pk: the keys' predictor or NULL. */
kv_status kv_fit_sq_choose_layer(kv_fit_state *r, int layer, const kv_plan_predictor *pk, kv_fit_layer_report *lr);

#endif
