/* grid_search.c — the CPU's nearest-grid-point accelerator for d = 1 and 2 (kvrt.h).
 *
 * A table of cells over [lo, lo + cells * w)^d; each cell lists the grid points that can be the
 * nearest anywhere in it (a superset, built with a rounding margin), so the nearest point of a
 * query is found among a few candidates with exactly kv_qm_grid_dist's float distances and the
 * exhaustive search's tie rule (lowest index): the same answer as kv_qm_grid_nearest, which the GPU
 * runs. Queries outside the table take the exhaustive search.
 *
 * Many 2-D queries at once (kv_grid_search_nearest_many: HIGGS's encoder) go in two passes, so that
 * no branch depends on the data:
 *  1. the cell of each query and its 16-bit entry (four queries at a time in SSE2, eight in AVX2
 *     where the CPU has it): a cell with one candidate (70% of Gaussian queries for n = 256, 92%
 *     for n = 16) answers at once; the others are appended to one of two lists, with
 *     unconditional stores and counters (SSE2) or a lane permutation (AVX2);
 *  2. the two-candidate list, then the three-or-four list: the candidates' coordinates are in a
 *     record of the cell (contiguous, no gather), both or all four distances come from one vector
 *     (SSE2), the nearest with the lowest index among equals. Cells with more than four candidates
 *     and queries outside the table (about 1 in 10^4 Gaussian queries) take the scalar search.
 * Without SSE2, pass 2 is the scalar search of each listed query.
 */
#include "kv_quant_math.h"
#include "kv_kernels_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif
#if KV_HAVE_X86_AVX2
#include <immintrin.h>
#endif

struct kv_grid_search {
    int d, n;
    float *grid;     /* copy, n*d */
    int cells;       /* per dimension */
    float lo, inv_w; /* cell of coordinate u: floor((u - lo) * inv_w) */
    uint32_t *offs;  /* cells^d + 1 */
    uint16_t *cand;  /* candidate indices, ascending within a cell */
    /* d = 2: cells^2 + 2 entries, cells^2 for queries outside the table, one spare: see ENTRY_* */
    uint16_t *entry;
    float *pair_xy;    /* per two-candidate record: ax, ay, bx, by (16-byte aligned) */
    uint16_t *pair_id; /* a | b << 8, a < b */
    float *quad_xy;    /* per three-or-four record: x0..x3, y0..y3, ascending index, last repeated */
    uint32_t *quad_id; /* the four indices, byte k = candidate k */
    void *records;     /* the allocation behind pair_xy and quad_xy */
    uint32_t pack_lut[256]; /* d = 2, AVX2: left_pack_code of every lane mask */
};

/* A d = 2 entry: below ENTRY_PAIR, the cell's only candidate; ENTRY_PAIR | r, two candidates in
 * pair record r; ENTRY_QUAD | r, three or four in quad record r; ENTRY_SLOW: outside the table,
 * more than four candidates, or no record left (the scalar search). */
enum { ENTRY_PAIR = 0x8000, ENTRY_QUAD = 0xC000, ENTRY_SLOW = 0xFFFF, ENTRY_RECORDS = 0x3FFF };

/* Squared distance bounds from point p to the box [a, b] (double, per coordinate). */
static void box_dist(const double *a, const double *b, const float *p, int d, double *mind,
                     double *maxd) {
    double lo = 0.0, hi = 0.0;
    for (int k = 0; k < d; k++) {
        const double x = p[k];
        const double near = x < a[k] ? a[k] - x : (x > b[k] ? x - b[k] : 0.0);
        const double far = fabs(x - a[k]) > fabs(x - b[k]) ? fabs(x - a[k]) : fabs(x - b[k]);
        lo += near * near;
        hi += far * far;
    }
    *mind = lo;
    *maxd = hi;
}

#if KV_HAVE_X86_AVX2
/* The lanes of an 8-bit mask packed to the front: lane numbers in 3-bit fields, count at bit 24. */
static uint32_t left_pack_code(unsigned mask) {
    uint32_t code = 0, count = 0;
    for (uint32_t lane = 0; lane < 8; lane++)
        if (mask >> lane & 1u) code |= lane << (3 * count++);
    return code | count << 24;
}
#endif

/* The d = 2 entries and candidate records (s->offs and s->cand built). */
static kv_status build_records(kv_grid_search *s) {
    const size_t ncell = (size_t)s->cells * (size_t)s->cells;
    size_t npair = 0, nquad = 0;
    for (size_t c = 0; c < ncell; c++) {
        const uint32_t count = s->offs[c + 1] - s->offs[c];
        npair += count == 2;
        nquad += count == 3 || count == 4;
    }
    npair = npair < ENTRY_RECORDS ? npair : ENTRY_RECORDS;
    nquad = nquad < ENTRY_RECORDS ? nquad : ENTRY_RECORDS;
    s->entry = malloc((ncell + 2) * sizeof *s->entry); /* + 1 spare: the AVX2 gather reads 32 bits */
    s->pair_id = malloc((npair ? npair : 1) * sizeof *s->pair_id);
    s->quad_id = malloc((nquad ? nquad : 1) * sizeof *s->quad_id);
    s->records = malloc((4 * npair + 8 * nquad + 4) * sizeof(float)); /* +4: 16-byte alignment */
    if (!s->entry || !s->pair_id || !s->quad_id || !s->records) return KV_ERR(KV_ENOMEM, "grid search: out of memory");
    s->pair_xy = (float *)(((uintptr_t)s->records + 15) & ~(uintptr_t)15);
    s->quad_xy = s->pair_xy + 4 * npair;
    size_t np = 0, nq = 0;
    for (size_t c = 0; c < ncell; c++) {
        const uint16_t *cand = s->cand + s->offs[c];
        const uint32_t count = s->offs[c + 1] - s->offs[c];
        if (count == 1) {
            s->entry[c] = cand[0];
        } else if (count == 2 && np < npair) {
            for (int k = 0; k < 4; k++) s->pair_xy[4 * np + (size_t)k] = s->grid[2 * cand[k / 2] + (k & 1)];
            s->pair_id[np] = (uint16_t)(cand[0] | cand[1] << 8);
            s->entry[c] = (uint16_t)(ENTRY_PAIR | np++);
        } else if ((count == 3 || count == 4) && nq < nquad) {
            uint32_t id = 0;
            for (uint32_t k = 0; k < 4; k++) {
                const uint16_t i = cand[k < count ? k : count - 1];
                s->quad_xy[8 * nq + k] = s->grid[2 * i];
                s->quad_xy[8 * nq + 4 + k] = s->grid[2 * i + 1];
                id |= (uint32_t)i << (8 * k);
            }
            s->quad_id[nq] = id;
            s->entry[c] = (uint16_t)(ENTRY_QUAD | nq++);
        } else {
            s->entry[c] = ENTRY_SLOW;
        }
    }
    s->entry[ncell] = ENTRY_SLOW;
    s->entry[ncell + 1] = 0;
#if KV_HAVE_X86_AVX2
    for (unsigned m = 0; m < 256; m++) s->pack_lut[m] = left_pack_code(m);
#endif
    return KV_OK;
}

kv_status kv_grid_search_create(kv_grid_search **out, const float *grid, int d, int n) {
    *out = NULL;
    if (d != 1 && d != 2) return KV_ERR(KV_EINVAL, "grid search: only d = 1 or 2 (got %d)", d);
    if (n < 1 || n > 256) return KV_ERR(KV_EINVAL, "grid search: 1 <= n <= 256 (got %d)", n);
    kv_grid_search *s = calloc(1, sizeof *s);
    if (!s) return KV_ERR(KV_ENOMEM, "grid search: out of memory");
    kv_status st = KV_OK;
    s->d = d;
    s->n = n;
    s->cells = d == 1 ? 4096 : 256;
    const size_t ncell = d == 1 ? (size_t)s->cells : (size_t)s->cells * (size_t)s->cells;
    s->grid = malloc((size_t)n * (size_t)d * sizeof *s->grid);
    s->offs = malloc((ncell + 1) * sizeof *s->offs);
    double *maxd = malloc((size_t)n * sizeof *maxd), *mind = malloc((size_t)n * sizeof *mind);
    size_t cap = ncell * 4, len = 0;
    s->cand = malloc(cap * sizeof *s->cand);
    if (!s->grid || !s->offs || !maxd || !mind || !s->cand) {
        st = KV_ERR(KV_ENOMEM, "grid search: out of memory");
        goto done;
    }
    memcpy(s->grid, grid, (size_t)n * (size_t)d * sizeof *grid);
    float r = 0.0f;
    for (int i = 0; i < n * d; i++) {
        if (!kv_qm_is_finite(grid[i])) {
            st = KV_ERR(KV_EINVAL, "grid search: non-finite grid point");
            goto done;
        }
        r = fabsf(grid[i]) > r ? fabsf(grid[i]) : r;
    }
    /* The table spans the grid plus a margin, and at least +-4: HIGGS's rotated pieces are ~N(0, 1)
     * per coordinate, so fewer than 1e-4 of them fall outside (those take an exhaustive search),
     * against 2% for a small grid's own span (+-2.5 at n = 16). */
    r = r + 0.5f > 4.0f ? r + 0.5f : 4.0f;
    s->lo = -r;
    const float w = 2.0f * r / (float)s->cells;
    s->inv_w = 1.0f / w;
    /* A point can be the (float) nearest somewhere in a cell only if its smallest distance to the
     * cell is within rounding of the smallest farthest-distance of any point; a margin covers float
     * rounding of the distances and of the cell index, so the candidate list always contains the
     * exhaustive search's answer. */
    const double margin = 1e-3, pad = 1e-3 * (double)w;
    for (size_t cell = 0; cell < ncell; cell++) {
        double a[2], b[2];
        const size_t ix[2] = {cell % (size_t)s->cells, cell / (size_t)s->cells};
        for (int k = 0; k < d; k++) {
            a[k] = (double)s->lo + (double)ix[k] * (double)w - pad;
            b[k] = a[k] + (double)w + 2.0 * pad;
        }
        double best = INFINITY;
        for (int i = 0; i < n; i++) {
            box_dist(a, b, grid + (size_t)i * (size_t)d, d, &mind[i], &maxd[i]);
            best = maxd[i] < best ? maxd[i] : best;
        }
        s->offs[cell] = (uint32_t)len;
        for (int i = 0; i < n; i++) {
            if (mind[i] > best + margin) continue;
            if (len == cap) {
                uint16_t *nc = realloc(s->cand, cap * 2 * sizeof *nc);
                if (!nc) {
                    st = KV_ERR(KV_ENOMEM, "grid search: out of memory");
                    goto done;
                }
                s->cand = nc;
                cap *= 2;
            }
            s->cand[len++] = (uint16_t)i;
        }
    }
    s->offs[ncell] = (uint32_t)len;
    if (d == 2) st = build_records(s);
done:
    free(maxd);
    free(mind);
    if (st != KV_OK) {
        kv_grid_search_free(s);
        return st;
    }
    *out = s;
    return KV_OK;
}

void kv_grid_search_free(kv_grid_search *s) {
    if (!s) return;
    free(s->grid);
    free(s->offs);
    free(s->cand);
    free(s->entry);
    free(s->pair_id);
    free(s->quad_id);
    free(s->records);
    free(s);
}

int kv_grid_search_dim(const kv_grid_search *s) { return s->d; }
int kv_grid_search_size(const kv_grid_search *s) { return s->n; }

/* Nearest among the candidates of a cell (the table's index; -1: outside, every point). */
static int nearest_in_cell(const kv_grid_search *s, const float *u, long cell) {
    if (cell < 0) return kv_qm_grid_nearest(u, s->grid, s->d, s->n);
    const uint32_t a = s->offs[cell], b = s->offs[cell + 1];
    int best = s->cand[a];
    float bd = kv_qm_grid_dist(u, s->grid, s->d, best);
    for (uint32_t k = a + 1; k < b; k++) {
        const int i = s->cand[k];
        const float e = kv_qm_grid_dist(u, s->grid, s->d, i);
        best = e < bd ? i : best; /* strict: ties keep the earlier (lower) index */
        bd = e < bd ? e : bd;
    }
    return best;
}

static inline int cell_coord(const kv_grid_search *s, float u) {
    const float f = (u - s->lo) * s->inv_w;
    if (!(f >= 0.0f && f < (float)s->cells)) return -1;
    return (int)f;
}

int kv_grid_search_nearest(const kv_grid_search *s, const float *u) {
    const int i0 = cell_coord(s, u[0]);
    const int i1 = s->d == 2 ? cell_coord(s, u[1]) : 0;
    if (i0 < 0 || i1 < 0) return nearest_in_cell(s, u, -1);
    return nearest_in_cell(s, u, (long)i0 + (long)i1 * s->cells);
}


/* ---- many 2-D queries ----------------------------------------------------------------------- */
enum { CHUNK = 512 }; /* queries per pass; list items hold the query's number in 16 bits */

/* The entry of a query's cell, ENTRY_SLOW outside the table: kv_grid_search_nearest's cell. */
static inline uint16_t entry_of(const kv_grid_search *s, const float *u) {
    const int i0 = cell_coord(s, u[0]), i1 = cell_coord(s, u[1]);
    return i0 < 0 || i1 < 0 ? (uint16_t)ENTRY_SLOW : s->entry[i0 + i1 * s->cells];
}

#if defined(__SSE2__)
/* u[0], u[1] into the low half of a vector. */
static inline __m128 load_pair(const float *u) {
    return _mm_castsi128_ps(_mm_loadl_epi64((const __m128i *)(const void *)u));
}

/* Two candidates a < b at (ax, ay, bx, by): kv_qm_grid_dist's (0 + dx^2) + dy^2 = dx^2 + dy^2 for
 * both in one vector; b only when strictly nearer. */
static inline uint8_t nearest_of_pair(const float *xy, uint16_t id, const float *u) {
    const __m128 q = load_pair(u), d = _mm_sub_ps(_mm_movelh_ps(q, q), _mm_load_ps(xy)), sq = _mm_mul_ps(d, d);
    const __m128 dist = _mm_add_ps(_mm_shuffle_ps(sq, sq, _MM_SHUFFLE(2, 0, 2, 0)), _mm_shuffle_ps(sq, sq, _MM_SHUFFLE(3, 1, 3, 1)));
    const int b_nearer = _mm_comilt_ss(_mm_shuffle_ps(dist, dist, _MM_SHUFFLE(1, 1, 1, 1)), dist);
    return (uint8_t)(b_nearer ? id >> 8 : id & 255u);
}

/* Four candidates (ascending index, the last repeated) at x[0..3], y[0..3]: the lowest lane among
 * the smallest distances, i.e. the lowest index. */
static inline uint8_t nearest_of_quad(const float *xy, uint32_t id, const float *u) {
    static const uint8_t lowest_bit[16] = {0, 0, 1, 0, 2, 0, 1, 0, 3, 0, 1, 0, 2, 0, 1, 0};
    const __m128 q = load_pair(u);
    const __m128 dx = _mm_sub_ps(_mm_shuffle_ps(q, q, _MM_SHUFFLE(0, 0, 0, 0)), _mm_load_ps(xy));
    const __m128 dy = _mm_sub_ps(_mm_shuffle_ps(q, q, _MM_SHUFFLE(1, 1, 1, 1)), _mm_load_ps(xy + 4));
    const __m128 dist = _mm_add_ps(_mm_mul_ps(dx, dx), _mm_mul_ps(dy, dy));
    __m128 m = _mm_min_ps(dist, _mm_shuffle_ps(dist, dist, _MM_SHUFFLE(2, 3, 0, 1)));
    m = _mm_min_ps(m, _mm_shuffle_ps(m, m, _MM_SHUFFLE(1, 0, 3, 2)));
    const int lane = lowest_bit[_mm_movemask_ps(_mm_cmpeq_ps(dist, m))];
    return (uint8_t)(id >> (8 * lane));
}
#endif

/* Pass 1, one query at a time (the tails): the answer when its cell has one candidate (pass 2
 * overwrites it otherwise), and the query (number | entry << 16) appended to its list. */
static inline void list_query(uint8_t *out, uint32_t *pairs, uint32_t *quads, size_t *np, size_t *nq, size_t p,
                              uint32_t e) {
    out[p] = (uint8_t)e;
    if ((e >> 14) == 2u) pairs[(*np)++] = (uint32_t)p | e << 16;
    if ((e >> 14) == 3u) quads[(*nq)++] = (uint32_t)p | e << 16;
}

/* Pass 1 with SSE2 (or, below that level, scalar cells). */
static void first_pass(const kv_grid_search *s, uint8_t *out, const float *u, size_t n, uint32_t *pairs,
                       uint32_t *quads, size_t *np_out, size_t *nq_out, kv_simd_level lv) {
    uint16_t ent[CHUNK];
    uint32_t several[CHUNK];
    size_t p = 0;
    const uint16_t *entry = s->entry;
#if defined(__SSE2__)
    /* cells four at a time, kv_grid_search_nearest's arithmetic: de-interleave, scale, test the
     * range, truncate; the table is 256 x 256, so the row offset is a shift by 8 */
    if (lv >= KV_SIMD_SSE2 && s->cells == 256) {
        const __m128 lo = _mm_set1_ps(s->lo), inv_w = _mm_set1_ps(s->inv_w), top = _mm_set1_ps(256.0f), zero = _mm_setzero_ps();
        const __m128i outside = _mm_set1_epi32(256 * 256);
        for (; p + 4 <= n; p += 4) {
            const __m128 a = _mm_loadu_ps(u + 2 * p), b = _mm_loadu_ps(u + 2 * p + 4);
            const __m128 f0 = _mm_mul_ps(_mm_sub_ps(_mm_shuffle_ps(a, b, _MM_SHUFFLE(2, 0, 2, 0)), lo), inv_w);
            const __m128 f1 = _mm_mul_ps(_mm_sub_ps(_mm_shuffle_ps(a, b, _MM_SHUFFLE(3, 1, 3, 1)), lo), inv_w);
            const __m128 in = _mm_and_ps(_mm_and_ps(_mm_cmpge_ps(f0, zero), _mm_cmplt_ps(f0, top)),
                                         _mm_and_ps(_mm_cmpge_ps(f1, zero), _mm_cmplt_ps(f1, top)));
            const __m128i c = _mm_add_epi32(_mm_cvttps_epi32(_mm_and_ps(f0, in)),
                                            _mm_slli_epi32(_mm_cvttps_epi32(_mm_and_ps(f1, in)), 8));
            const __m128i m = _mm_castps_si128(in);
            int32_t cell[4];
            _mm_storeu_si128((__m128i *)(void *)cell, _mm_or_si128(_mm_and_si128(m, c), _mm_andnot_si128(m, outside)));
            for (int j = 0; j < 4; j++) ent[p + (size_t)j] = entry[cell[j]];
        }
    }
#else
    (void)lv;
#endif
    for (; p < n; p++) ent[p] = entry_of(s, u + 2 * p);
    /* Separate loops from the table loads: a store whose address depends on a loaded entry would
     * hold back the next loads (measured: 20% slower). Every store happens; only counters move. */
    size_t ns = 0, np = 0, nq = 0;
    for (p = 0; p < n; p++) {
        const uint32_t e = ent[p];
        out[p] = (uint8_t)e;
        several[ns] = (uint32_t)p | e << 16;
        ns += e >> 15;
    }
    for (size_t k = 0; k < ns; k++) {
        const uint32_t item = several[k];
        pairs[np] = item;
        quads[nq] = item;
        np += (item >> 30) == 2u;
        nq += (item >> 30) == 3u;
    }
    *np_out = np;
    *nq_out = nq;
}

#if KV_HAVE_X86_AVX2
#define AVX2_FN __attribute__((target("avx2")))

/* Appends the lanes of items selected by mask (8 bits) to list[*len] (8 entries of room). */
AVX2_FN static inline void append_lanes(uint32_t *list, size_t *len, __m256i items, unsigned mask, const uint32_t *lut) {
    const __m256i fields = _mm256_srlv_epi32(_mm256_set1_epi32((int)lut[mask]), _mm256_setr_epi32(0, 3, 6, 9, 12, 15, 18, 21));
    _mm256_storeu_si256((__m256i *)(void *)(list + *len), _mm256_permutevar8x32_epi32(items, _mm256_and_si256(fields, _mm256_set1_epi32(7))));
    *len += lut[mask] >> 24;
}

/* Pass 1 with AVX2, eight queries at a time, no scalar step per query: the cells as in the SSE2
 * loop, the entries by one gather (16-bit entries read as the low half of 32 bits: the table has a
 * spare entry at the end), the answers narrowed to bytes, and the list items packed to the front of
 * their vectors by a permutation looked up from the lane mask. */
AVX2_FN static void first_pass_avx2(const kv_grid_search *s, uint8_t *out, const float *u, size_t n, uint32_t *pairs,
                                    uint32_t *quads, size_t *np_out, size_t *nq_out) {
    const __m256 lo = _mm256_set1_ps(s->lo), inv_w = _mm256_set1_ps(s->inv_w), top = _mm256_set1_ps(256.0f), zero = _mm256_setzero_ps();
    const __m256i outside = _mm256_set1_epi32(256 * 256), low16 = _mm256_set1_epi32(0xFFFF);
    const __m256i lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), two = _mm256_set1_epi32(2), three = _mm256_set1_epi32(3);
    /* byte 0 of each 32-bit lane to the front of its 128-bit half, then the halves' first words together */
    const __m256i low_bytes = _mm256_setr_epi8(0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1,
                                               0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1);
    const __m256i join = _mm256_setr_epi32(0, 4, 0, 0, 0, 0, 0, 0);
    const int *table = (const int *)(const void *)s->entry;
    size_t p = 0, np = 0, nq = 0;
    for (; p + 8 <= n; p += 8) {
        const __m256 a = _mm256_loadu_ps(u + 2 * p), b = _mm256_loadu_ps(u + 2 * p + 8);
        /* shuffle_ps works per 128-bit half: queries 0 1 4 5 | 2 3 6 7, put in order by 64-bit pairs */
        const __m256 xs = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(a, b, _MM_SHUFFLE(2, 0, 2, 0))), _MM_SHUFFLE(3, 1, 2, 0)));
        const __m256 ys = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(a, b, _MM_SHUFFLE(3, 1, 3, 1))), _MM_SHUFFLE(3, 1, 2, 0)));
        const __m256 f0 = _mm256_mul_ps(_mm256_sub_ps(xs, lo), inv_w), f1 = _mm256_mul_ps(_mm256_sub_ps(ys, lo), inv_w);
        const __m256 in = _mm256_and_ps(_mm256_and_ps(_mm256_cmp_ps(f0, zero, _CMP_GE_OQ), _mm256_cmp_ps(f0, top, _CMP_LT_OQ)),
                                        _mm256_and_ps(_mm256_cmp_ps(f1, zero, _CMP_GE_OQ), _mm256_cmp_ps(f1, top, _CMP_LT_OQ)));
        const __m256i c = _mm256_add_epi32(_mm256_cvttps_epi32(_mm256_and_ps(f0, in)),
                                           _mm256_slli_epi32(_mm256_cvttps_epi32(_mm256_and_ps(f1, in)), 8));
        const __m256i cell = _mm256_blendv_epi8(outside, c, _mm256_castps_si256(in));
        const __m256i e = _mm256_and_si256(_mm256_i32gather_epi32(table, cell, 2), low16);
        const __m256i bytes = _mm256_permutevar8x32_epi32(_mm256_shuffle_epi8(e, low_bytes), join);
        _mm_storel_epi64((__m128i *)(void *)(out + p), _mm256_castsi256_si128(bytes));
        const __m256i items = _mm256_or_si256(_mm256_add_epi32(_mm256_set1_epi32((int)p), lanes), _mm256_slli_epi32(e, 16));
        const __m256i kind = _mm256_srli_epi32(e, 14);
        append_lanes(pairs, &np, items, (unsigned)_mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpeq_epi32(kind, two))), s->pack_lut);
        append_lanes(quads, &nq, items, (unsigned)_mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpeq_epi32(kind, three))), s->pack_lut);
    }
    for (; p < n; p++) list_query(out, pairs, quads, &np, &nq, p, entry_of(s, u + 2 * p));
    *np_out = np;
    *nq_out = nq;
}
#endif

/* Passes 1 and 2 for n <= CHUNK queries. */
static void nearest_chunk_2d(const kv_grid_search *s, uint8_t *out, const float *u, size_t n, kv_simd_level lv) {
    uint32_t pairs[CHUNK + 8], quads[CHUNK + 8]; /* + 8: the AVX2 pass stores whole vectors */
    size_t np = 0, nq = 0;
#if KV_HAVE_X86_AVX2
    if (lv >= KV_SIMD_AVX2 && s->cells == 256)
        first_pass_avx2(s, out, u, n, pairs, quads, &np, &nq);
    else
#endif
        first_pass(s, out, u, n, pairs, quads, &np, &nq, lv);
#if defined(__SSE2__)
    if (lv >= KV_SIMD_SSE2) {
        for (size_t k = 0; k < np; k++) {
            const uint32_t q = pairs[k] & 0xFFFFu, r = (pairs[k] >> 16) & ENTRY_RECORDS;
            out[q] = nearest_of_pair(s->pair_xy + 4 * r, s->pair_id[r], u + 2 * q);
        }
        for (size_t k = 0; k < nq; k++) {
            const uint32_t q = quads[k] & 0xFFFFu, e = quads[k] >> 16, r = e & ENTRY_RECORDS;
            out[q] = e == ENTRY_SLOW ? (uint8_t)kv_grid_search_nearest(s, u + 2 * q)
                                     : nearest_of_quad(s->quad_xy + 8 * r, s->quad_id[r], u + 2 * q);
        }
        return;
    }
#endif
    for (size_t k = 0; k < np; k++) out[pairs[k] & 0xFFFFu] = (uint8_t)kv_grid_search_nearest(s, u + 2 * (pairs[k] & 0xFFFFu));
    for (size_t k = 0; k < nq; k++) out[quads[k] & 0xFFFFu] = (uint8_t)kv_grid_search_nearest(s, u + 2 * (quads[k] & 0xFFFFu));
}

void kv_grid_search_nearest_many(const kv_grid_search *s, uint8_t *out, const float *u, size_t n) {
    if (s->d != 2) {
        for (size_t p = 0; p < n; p++) out[p] = (uint8_t)kv_grid_search_nearest(s, u + p * (size_t)s->d);
        return;
    }
    const kv_simd_level lv = kv_simd_level_now();
    for (size_t p = 0; p < n; p += CHUNK) nearest_chunk_2d(s, out + p, u + 2 * p, n - p < CHUNK ? n - p : CHUNK, lv);
}
