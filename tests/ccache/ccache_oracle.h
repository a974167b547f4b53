/* ccache_oracle.h — the decoded-copy compressed cache, a test oracle for the runtime (ccache_oracle.c). */
#ifndef CCACHE_ORACLE_H
#define CCACHE_ORACLE_H

#include "kv_model.h"

/* A kv_cache (kv_model.h) applying plan with decoded f32 copies; plan and model are borrowed. */
kv_status ccache_oracle_create(kv_cache **out, const kv_plan *plan, const kv_model *model, int n_seqs);

/* What it holds (all sequences), with the runtime's accounting conventions. */
typedef struct ccache_oracle_stats {
    uint64_t tokens;
    uint64_t values_total;
    uint64_t values_compressed;
    uint64_t values_fp;
    uint64_t payload_bits;
    uint64_t fp_bits;
    uint64_t predictor_bits;
} ccache_oracle_stats;
kv_status ccache_oracle_get_stats(const kv_cache *c, ccache_oracle_stats *out);

#endif
