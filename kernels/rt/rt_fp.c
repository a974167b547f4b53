/* rt_fp.c — attention kernels over full-precision rows (f16: sinks, windows, f16 streams; f32:
 * reconstructions and f32 streams). Dot products are summed in 8 lanes (lane k takes elements
 * k, k + 8, ...), the lanes pairwise, then the tail in order: the same bits from every vector width. */
#include "kvrt.h"
#include "rt_internal.h"

#include <string.h>

static inline float dot8(const float *a, const float *b, int n) {
    float l[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int i = 0;
    for (; i + 8 <= n; i += 8)
        for (int k = 0; k < 8; k++) l[k] += a[i + k] * b[i + k];
    float s = ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]));
    for (; i < n; i++) s += a[i] * b[i];
    return s;
}

void rt_f32_scores(const float *x, size_t ld, int n, int hd, const float *q, int nq, float *out, size_t ldo) {
    for (int t = 0; t < n; t++) {
        const float *row = x + (size_t)t * ld;
        for (int j = 0; j < nq; j++) out[(size_t)j * ldo + (size_t)t] = dot8(q + (size_t)j * hd, row, hd);
    }
}

void rt_f32_accum(const float *x, size_t ld, int n, int hd, const float *p, size_t ldp, int nq, float *acc) {
    for (int t = 0; t < n; t++) {
        const float *row = x + (size_t)t * ld;
        for (int j = 0; j < nq; j++) {
            const float pj = p[(size_t)j * ldp + (size_t)t];
            float *a = acc + (size_t)j * hd;
            for (int c = 0; c < hd; c++) a[c] += pj * row[c];
        }
    }
}

void rt_f16_scores(const uint16_t *x, size_t ld, int n, int hd, const float *q, int nq, float *out, size_t ldo) {
    float row[KV_RT_MAX_HEAD_DIM];
    for (int t = 0; t < n; t++) {
        rt_f16_to_f32_row(row, x + (size_t)t * ld, (size_t)hd);
        for (int j = 0; j < nq; j++) out[(size_t)j * ldo + (size_t)t] = dot8(q + (size_t)j * hd, row, hd);
    }
}

void rt_f16_accum(const uint16_t *x, size_t ld, int n, int hd, const float *p, size_t ldp, int nq, float *acc) {
    float row[KV_RT_MAX_HEAD_DIM];
    for (int t = 0; t < n; t++) {
        rt_f16_to_f32_row(row, x + (size_t)t * ld, (size_t)hd);
        for (int j = 0; j < nq; j++) {
            const float pj = p[(size_t)j * ldp + (size_t)t];
            float *a = acc + (size_t)j * hd;
            for (int c = 0; c < hd; c++) a[c] += pj * row[c];
        }
    }
}
