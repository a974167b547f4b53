/* plan_sample.h — a plan that uses every feature of format 1.0, a deep comparison, and helpers that
 * edit serialized plans (for the corrupt-file list, the golden file and the fuzz corpus). */
#ifndef KV_PLAN_SAMPLE_H
#define KV_PLAN_SAMPLE_H

#include <stddef.h>
#include <stdint.h>

#include "kv_formats.h"

/* The sample: 3 layers, kv_dim 8, two grids, HIGGS / uniform (3-bit 11-per-word, eta, pre-RoPE) /
 * shared codes / FP streams, two predictors (K <- L0.K; V <- [L0.V; L1.K]), SQuat with a basis,
 * SnapKV pruning, provenance with a multi-line config, a report with a NaN. */
kv_status plan_sample_make(kv_plan **out);
/* Format 1.1's golden content: the sample with layer 2 V in FP8 E4M3 with per-KV-head scales. */
kv_status plan_sample_make_v1_1(kv_plan **out);
/* 1.1 plus layer 1 K SQuat with the static subspace and layer 1 V's predictor in f16 (format 1.2:
 * SQUAT_STATIC, PRED_F16). */
kv_status plan_sample_make_v1_2(kv_plan **out);
/* 1.2 plus layer 1 K's predictor (8 x 8) as rank-2 factors in f32 and layer 1 V's (8 x 16) as rank-3
 * factors in f16 (format 1.3: PRED_LOWRANK). */
kv_status plan_sample_make_v1_3(kv_plan **out);
/* 1.3 plus layer 1 V's predictor (8 x 16) as 4-bit codes with groups of 8 columns (format 1.4: PRED_Q4); layer
 * 1 K stays rank-2. */
kv_status plan_sample_make_v1_4(kv_plan **out);
/* 1.4 plus attention windows: layer 0 of 512 tokens, layer 2 of 7, layer 1 full (format 1.5: section WNDW, WINDOW). */
kv_status plan_sample_make_v1_5(kv_plan **out);
/* The sample's fingerprint alone. */
void plan_sample_fingerprint(kv_plan_fingerprint *fp);

/* 1 when a and b hold the same content (file info ignored); else 0 with the first difference. */
int plan_equal(const kv_plan *a, const kv_plan *b, char *why, size_t why_n);

/* ---- editing serialized plans (PLAN_FORMAT.md §4, §5) ---- */
/* Byte offset of the table entry of section `tag`, or 0 when absent. */
size_t plan_bytes_entry(const uint8_t *buf, const char tag[4]);
/* Recompute every CRC the (untrusted) layout lets us find: each section whose bytes lie inside the
 * buffer, then the table, then the header. Used by the corrupt-plan list (to reach the checks behind
 * the CRCs) and by the fuzz target (to let mutations reach the section decoders). */
void plan_bytes_repair_crcs(uint8_t *buf, size_t n);

#endif
