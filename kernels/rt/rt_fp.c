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

/* Portable loops (the reference of rt_avx2.c's). */
static void f32_scores_portable(const float *x, size_t ld, int n, int hd, const float *q, int nq, float *out,
                                size_t ldo) {
    for (int t = 0; t < n; t++) {
        const float *row = x + (size_t)t * ld;
        for (int j = 0; j < nq; j++) out[(size_t)j * ldo + (size_t)t] = dot8(q + (size_t)j * hd, row, hd);
    }
}

static void f32_accum_portable(const float *x, size_t ld, int n, int hd, const float *p, size_t ldp, int nq,
                               float *acc) {
    for (int t = 0; t < n; t++) {
        const float *row = x + (size_t)t * ld;
        for (int j = 0; j < nq; j++) {
            const float pj = p[(size_t)j * ldp + (size_t)t];
            float *a = acc + (size_t)j * hd;
            for (int c = 0; c < hd; c++) a[c] += pj * row[c];
        }
    }
}

void kv_rti_f32_scores(const float *x, size_t ld, int n, int hd, const float *q, int nq, float *out, size_t ldo) {
    if (hd % 8 == 0 && kv_rti_avx2_usable())
        kv_rti_f32_scores_avx2(x, ld, n, hd, q, nq, out, ldo);
    else
        f32_scores_portable(x, ld, n, hd, q, nq, out, ldo);
}

void kv_rti_f32_accum(const float *x, size_t ld, int n, int hd, const float *p, size_t ldp, int nq, float *acc) {
    if (hd % 8 == 0 && kv_rti_avx2_usable())
        kv_rti_f32_accum_avx2(x, ld, n, hd, p, ldp, nq, acc);
    else
        f32_accum_portable(x, ld, n, hd, p, ldp, nq, acc);
}

/* f16 rows: AVX2 converts them in registers (rt_avx2.c); the portable path converts a tile at a time
 * (exactly) into f32, then runs the f32 loops, so that the rows are converted once for all the
 * query vectors of a KV head. */
static int f16_tile_rows(int hd) {
    const int r = 8192 / (hd > 0 ? hd : 1);
    return r < 1 ? 1 : r > 128 ? 128 : r;
}

/* The portable f16 path: each tile converted once, then the f32 loop (scores, or accum). */
static void f16_by_tiles(const uint16_t *x, size_t ld, int n, int hd, int accum, const float *qp, size_t ldp,
                         int nq, float *out, size_t ldo) {
    float tile[8192 + KV_RT_MAX_HEAD_DIM];
    const int tr = f16_tile_rows(hd);
    for (int t0 = 0; t0 < n; t0 += tr) {
        const int m = n - t0 < tr ? n - t0 : tr;
        for (int r = 0; r < m; r++) kv_rti_f16_to_f32_row(tile + (size_t)r * hd, x + (size_t)(t0 + r) * ld, (size_t)hd);
        if (accum)
            kv_rti_f32_accum(tile, (size_t)hd, m, hd, qp + t0, ldp, nq, out);
        else
            kv_rti_f32_scores(tile, (size_t)hd, m, hd, qp, nq, out + t0, ldo);
    }
}

void kv_rti_f16_scores(const uint16_t *x, size_t ld, int n, int hd, const float *q, int nq, float *out, size_t ldo) {
    if (hd % 8 == 0 && kv_rti_avx2_usable())
        kv_rti_f16_scores_avx2(x, ld, n, hd, q, nq, out, ldo);
    else
        f16_by_tiles(x, ld, n, hd, 0, q, 0, nq, out, ldo);
}

void kv_rti_f16_accum(const uint16_t *x, size_t ld, int n, int hd, const float *p, size_t ldp, int nq, float *acc) {
    if (hd % 8 == 0 && kv_rti_avx2_usable())
        kv_rti_f16_accum_avx2(x, ld, n, hd, p, ldp, nq, acc);
    else
        f16_by_tiles(x, ld, n, hd, 1, p, ldp, nq, acc, 0);
}
