/* fit_internal.h — shared by fit.c, fit_ckpt.c and fit_report.c (not a public header). */
#ifndef KV_FIT_INTERNAL_H
#define KV_FIT_INTERNAL_H

#include "kv_calib.h"

/* Report metric names stored in the plan (PLAN_FORMAT.md §6.8), in this order. */
#define KV_FIT_N_METRICS 6
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

/* ---- checkpoints (fit_ckpt.c) ---- */
/* What a checkpoint restores: the state after `layer` finished. */
typedef struct kv_fit_ckpt {
    int layer;                 /* last finished layer */
    kv_plan *plan;             /* the plan so far (owned) */
    double *layer_report;      /* n_layers * KV_FIT_CKPT_DOUBLES (owned) */
} kv_fit_ckpt;
#define KV_FIT_CKPT_DOUBLES 16 /* per layer: 4 metrics x 2 streams, bits x 2, forward/fit seconds,
                                  ridge rcond x 2, ridge fallback x 2 */

/* SHA-256 (hex) identifying a run's inputs: model identity, tokens, resolved configuration and
 * provenance strings. */
kv_status kv_fit_inputs_hash(char out[65], const kv_model_file *mf, const kv_plan_fingerprint *fp,
                             const kv_fit_data *data, const kv_fit_config *cfg, const kv_fit_options *opt);

/* Write the state after `layer` into dir (created if needed): state file (hidden states, previous
 * reconstructions, per-layer report), plan so far, then the manifest naming them (atomic writes;
 * files of the previous layer removed afterwards). */
kv_status kv_fit_ckpt_save(const char *dir, const char *inputs_hash, int layer, const kv_plan *plan,
                           const double *layer_report, int n_layers, const float *hidden, uint64_t n_hidden,
                           const float *kp, const float *vp, uint64_t n_kv);
/* Look for a usable checkpoint: KV_OK with ck->layer >= 0 and the arrays filled when one matches
 * inputs_hash and the sizes; ck->layer = -1 when there is none or it does not match (a message is
 * logged and the directory is cleared). */
kv_status kv_fit_ckpt_load(kv_fit_ckpt *ck, const char *dir, const char *inputs_hash, int n_layers,
                           float *hidden, uint64_t n_hidden, float *kp, float *vp, uint64_t n_kv);
void kv_fit_ckpt_free(kv_fit_ckpt *ck);
/* Remove the checkpoint files and the directory (missing ones are fine). */
kv_status kv_fit_ckpt_remove(const char *dir);

#endif
