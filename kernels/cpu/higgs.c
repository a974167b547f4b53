/* HIGGS vector quantizer: CPU reference (kvrt.h).
 *
 * Per group of g channels of one token: norm = ||x||, u = H (D x) / norm (unnormalized Walsh-
 * Hadamard H, random signs D), so that ||u||^2 = g and the coordinates of u are ~N(0, 1); each
 * d-dimensional piece of u is replaced by the index of its nearest grid point. Decode:
 * x = D H (grid[idx] * norm / g), using H H = g I.
 */
#include "kv_quant_math.h"
#include "kv_kernels_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

/* ---- nearest-point search accelerator -------------------------------------------------------- */
static inline int search_nearest(const kv_grid_search *s, const float *u);

struct kv_grid_search {
    int d, n;
    float *grid;       /* copy, n*d */
    int cells;         /* per dimension */
    float lo, inv_w;   /* cell of coordinate u: floor((u - lo) * inv_w) */
    uint32_t *offs;    /* cells^d + 1 */
    uint16_t *cand;    /* candidate indices, ascending within a cell */
    uint16_t *cell;    /* cells^d: the only candidate (< 0x8000), or 0x8000 when there are several */
};

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
    s->cell = malloc(ncell * sizeof *s->cell);
    if (!s->cell) {
        st = KV_ERR(KV_ENOMEM, "grid search: out of memory");
        goto done;
    }
    for (size_t c = 0; c < ncell; c++)
        s->cell[c] = s->offs[c + 1] == s->offs[c] + 1 ? s->cand[s->offs[c]] : (uint16_t)0x8000u;
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
    free(s->cell);
    free(s);
}

int kv_grid_search_dim(const kv_grid_search *s) { return s->d; }
int kv_grid_search_size(const kv_grid_search *s) { return s->n; }

static inline int cell_coord(const kv_grid_search *s, float u) {
    const float f = (u - s->lo) * s->inv_w;
    if (!(f >= 0.0f && f < (float)s->cells)) return -1;
    return (int)f;
}

int kv_grid_search_nearest(const kv_grid_search *s, const float *u) { return search_nearest(s, u); }

static inline int search_nearest(const kv_grid_search *s, const float *u) {
    const int d = s->d;
    const int i0 = cell_coord(s, u[0]);
    const int i1 = d == 2 ? cell_coord(s, u[1]) : 0;
    if (i0 < 0 || i1 < 0) return kv_qm_grid_nearest(u, s->grid, d, s->n);
    const size_t cell = (size_t)i0 + (size_t)i1 * (size_t)s->cells;
    const uint16_t only = s->cell[cell]; /* one compact table first: most cells have one candidate */
    if (only < 0x8000u) return only;
    const uint32_t a = s->offs[cell], b = s->offs[cell + 1];
    int best = s->cand[a];
    float bd = kv_qm_grid_dist(u, s->grid, d, best);
    for (uint32_t k = a + 1; k < b; k++) {
        const int i = s->cand[k];
        const float e = kv_qm_grid_dist(u, s->grid, d, i);
        if (e < bd) {
            bd = e;
            best = i;
        }
    }
    return best;
}

/* Nearest points of n 2-D pieces u[2p], u[2p+1], in three branch-light passes: cell indices for all
 * pieces (vectorized); one table load per piece, collecting the pieces whose cell has several
 * candidates (or lies outside the table) without a data-dependent branch; then the nearest
 * candidate of each collected piece (kv_qm_grid_dist with d = 2, ties keeping the earlier, lower,
 * candidate): the same answers as search_nearest. cell, multi: n scratch entries each. */
static void search_group_2d(const kv_grid_search *s, uint8_t *out, const float *u, size_t n, int32_t *cell,
                            int32_t *multi) {
    const float lo = s->lo, inv_w = s->inv_w, top = (float)s->cells;
    const int32_t cells = s->cells;
    size_t p0 = 0; /* pieces done by the SSE2 loop */
#if defined(__SSE2__)
    /* four pieces at a time, the same arithmetic: de-interleave the coordinates, scale, test the
     * range, truncate; cells (256 for d = 2) is a power of two, so the row offset is a shift */
    if ((cells & (cells - 1)) == 0) {
        int sh = 0;
        while ((1 << sh) < cells) sh++;
        const __m128 vlo = _mm_set1_ps(lo), vinv = _mm_set1_ps(inv_w), vtop = _mm_set1_ps(top), zero = _mm_setzero_ps();
        const __m128i shift = _mm_cvtsi32_si128(sh);
        for (; p0 + 4 <= n; p0 += 4) {
            const __m128 a = _mm_loadu_ps(u + 2 * p0), b = _mm_loadu_ps(u + 2 * p0 + 4);
            const __m128 f0 = _mm_mul_ps(_mm_sub_ps(_mm_shuffle_ps(a, b, _MM_SHUFFLE(2, 0, 2, 0)), vlo), vinv);
            const __m128 f1 = _mm_mul_ps(_mm_sub_ps(_mm_shuffle_ps(a, b, _MM_SHUFFLE(3, 1, 3, 1)), vlo), vinv);
            const __m128 in = _mm_and_ps(_mm_and_ps(_mm_cmpge_ps(f0, zero), _mm_cmplt_ps(f0, vtop)),
                                         _mm_and_ps(_mm_cmpge_ps(f1, zero), _mm_cmplt_ps(f1, vtop)));
            const __m128i c = _mm_add_epi32(_mm_cvttps_epi32(_mm_and_ps(f0, in)),
                                            _mm_sll_epi32(_mm_cvttps_epi32(_mm_and_ps(f1, in)), shift));
            const __m128i m = _mm_castps_si128(in);
            _mm_storeu_si128((__m128i *)(cell + p0), _mm_or_si128(_mm_and_si128(m, c), _mm_andnot_si128(m, _mm_set1_epi32(-1))));
        }
    }
#endif
    for (size_t p = p0; p < n; p++) {
        const float f0 = (u[2 * p] - lo) * inv_w, f1 = (u[2 * p + 1] - lo) * inv_w;
        const int in = (f0 >= 0.0f) & (f0 < top) & (f1 >= 0.0f) & (f1 < top);
        const float g0 = in ? f0 : 0.0f, g1 = in ? f1 : 0.0f;
        cell[p] = in ? (int32_t)g0 + (int32_t)g1 * cells : -1;
    }
    size_t nm = 0;
    for (size_t p = 0; p < n; p++) {
        const int32_t c = cell[p];
        const uint16_t only = c >= 0 ? s->cell[c] : (uint16_t)0x8000u;
        out[p] = (uint8_t)only;
        multi[nm] = (int32_t)p;
        nm += only >> 15; /* kept only when the cell has several candidates or none */
    }
    const float *grid = s->grid;
    for (size_t m = 0; m < nm; m++) {
        const size_t p = (size_t)multi[m];
        const int32_t c = cell[p];
        if (c < 0) { /* outside the table (under 1e-4 of Gaussian pieces): every point */
            out[p] = (uint8_t)kv_qm_grid_nearest(u + 2 * p, grid, 2, s->n);
            continue;
        }
        int best = s->cand[s->offs[c]];
        float bd = kv_qm_grid_dist(u + 2 * p, grid, 2, best);
        for (uint32_t k = s->offs[c] + 1; k < s->offs[c + 1]; k++) {
            const int i = s->cand[k];
            const float e = kv_qm_grid_dist(u + 2 * p, grid, 2, i);
            best = e < bd ? i : best;
            bd = e < bd ? e : bd;
        }
        out[p] = (uint8_t)best;
    }
}

/* ---- transform ----------------------------------------------------------------------------------- */
/* The unnormalized FWHT with exactly kv_qm_fwht's butterflies (same pairs, same a + b / a - b per
 * stage, so bit-identical results), arranged for the vectorizer: the first three stages inside
 * blocks of 8, later stages in runs of 8 with explicit temporaries. */
static void fwht_fast(float *KV_RESTRICT v, size_t n) {
    if (n < 8) {
        kv_qm_fwht(v, n);
        return;
    }
    for (size_t i = 0; i < n; i += 8) {
        float t[8], u[8];
        for (int k = 0; k < 8; k++) t[k] = v[i + (size_t)k];
        for (int k = 0; k < 8; k += 2) { /* h = 1 */
            u[k] = t[k] + t[k + 1];
            u[k + 1] = t[k] - t[k + 1];
        }
        for (int k = 0; k < 8; k += 4) /* h = 2 */
            for (int j = 0; j < 2; j++) {
                t[k + j] = u[k + j] + u[k + j + 2];
                t[k + j + 2] = u[k + j] - u[k + j + 2];
            }
        for (int j = 0; j < 4; j++) { /* h = 4 */
            u[j] = t[j] + t[j + 4];
            u[j + 4] = t[j] - t[j + 4];
        }
        for (int k = 0; k < 8; k++) v[i + (size_t)k] = u[k];
    }
    for (size_t h = 8; h < n; h *= 2)
        for (size_t i = 0; i < n; i += 2 * h)
            for (size_t j = i; j < i + h; j += 8) {
                float a[8], b[8];
                for (int k = 0; k < 8; k++) {
                    a[k] = v[j + (size_t)k];
                    b[k] = v[j + h + (size_t)k];
                }
                for (int k = 0; k < 8; k++) {
                    v[j + (size_t)k] = a[k] + b[k];
                    v[j + h + (size_t)k] = a[k] - b[k];
                }
            }
}

void kv_fwht_unnormalized_ref(float *v, size_t n) {
    if (!kv_fwht_sse2(v, v, n)) fwht_fast(v, n);
}

kv_status kv_fwht_ref(float *v, size_t n) {
    if (n == 0 || (n & (n - 1))) return KV_ERR(KV_EINVAL, "FWHT: length must be a power of two (got %zu)", n);
    kv_fwht_unnormalized_ref(v, n);
    const float scale = 1.0f / sqrtf((float)n);
    for (size_t i = 0; i < n; i++) v[i] *= scale;
    return KV_OK;
}

float kv_higgs_sign(uint64_t seed, size_t c) { return kv_qm_higgs_sign(seed, c); }

/* ---- encode / decode --------------------------------------------------------------------------- */
typedef struct higgs_ctx {
    size_t n, groups, pieces, g;
    int d, bits, per;
    float *signs; /* channels */
    float *v;     /* g scratch */
} higgs_ctx;

static void ctx_free(higgs_ctx *c) {
    free(c->signs);
    free(c->v);
}

static kv_status ctx_init(higgs_ctx *cx, const kv_higgs *h, size_t tokens, size_t channels) {
    memset(cx, 0, sizeof *cx);
    kv_status s = kv_higgs_check(h);
    if (s != KV_OK) return s;
    if (!h->grid) return KV_ERR(KV_EINVAL, "HIGGS: no grid");
    if (channels % (size_t)h->group)
        return KV_ERR(KV_EINVAL, "HIGGS: channels (%zu) must be a multiple of the group (%d)", channels,
                      h->group);
    if (h->search && (kv_grid_search_dim(h->search) != h->dim || kv_grid_search_size(h->search) != h->size))
        return KV_ERR(KV_EINVAL, "HIGGS: search accelerator built for another grid shape");
    if ((s = kv_block_values(&cx->n, tokens, channels)) != KV_OK) return s;
    cx->g = (size_t)h->group;
    cx->d = h->dim;
    cx->groups = cx->n / cx->g;
    cx->pieces = cx->n / (size_t)h->dim;
    cx->bits = kv_higgs_index_bits(h->size);
    cx->per = kv_qm_per_word(cx->bits, 0);
    cx->signs = malloc((channels ? channels : 1) * sizeof *cx->signs);
    cx->v = malloc(cx->g * sizeof *cx->v);
    if (!cx->signs || !cx->v) {
        ctx_free(cx);
        return KV_ERR(KV_ENOMEM, "HIGGS: out of memory");
    }
    for (size_t c = 0; c < channels; c++) cx->signs[c] = kv_qm_higgs_sign(h->seed, c);
    return KV_OK;
}

kv_status kv_higgs_encode_ref(uint32_t *indices, void *norms, const kv_higgs *h, size_t tokens,
                              size_t channels, const float *x) {
    higgs_ctx cx;
    kv_status st = ctx_init(&cx, h, tokens, channels);
    if (st != KV_OK) return st;
    uint8_t *idx = malloc(cx.pieces ? cx.pieces : 1);
    int32_t *cell_idx = malloc(2 * (cx.g / (size_t)cx.d) * sizeof *cell_idx); /* cells, then multi */
    if (!idx || !cell_idx) {
        st = KV_ERR(KV_ENOMEM, "HIGGS: out of memory");
        goto done;
    }
    const size_t g = cx.g, per_group = g / (size_t)cx.d;
    float *v = cx.v;
    for (size_t grp = 0; grp < cx.groups; grp++) {
        const float *xg = x + grp * g;
        const float *sg = cx.signs + (grp * g) % channels;
        float ss;
        if (!kv_sumsq_sse2(xg, g, &ss)) ss = kv_qm_sumsq(xg, g);
        const float norm = sqrtf(ss);
        if (!kv_qm_is_finite(norm)) {
            st = KV_ERR(KV_ENUMERIC, "HIGGS encode: non-finite input in group %zu", grp);
            goto done;
        }
        const float mul = kv_qm_higgs_enc_mul(norm);
        if (!kv_fwht_sse2_encode(v, xg, g, sg, mul)) {
            for (size_t k = 0; k < g; k++) v[k] = xg[k] * sg[k];
            fwht_fast(v, g);
            for (size_t k = 0; k < g; k++) v[k] *= mul;
        }
        uint8_t *ig = idx + grp * per_group;
        if (h->search && cx.d == 2)
            search_group_2d(h->search, ig, v, per_group, cell_idx, cell_idx + per_group);
        else if (h->search)
            for (size_t p = 0; p < per_group; p++)
                ig[p] = (uint8_t)search_nearest(h->search, v + p * (size_t)cx.d);
        else
            for (size_t p = 0; p < per_group; p++)
                ig[p] = (uint8_t)kv_qm_grid_nearest(v + p * (size_t)cx.d, h->grid, cx.d, h->size);
        kv_qm_param_store(norms, grp, norm, (int)h->norm_type);
    }
    /* every index is < size <= 2^bits: pack directly (kv_pack_ref would mask each code first) */
    memset(indices, 0, kv_pack_words(cx.pieces, cx.bits, 0) * sizeof *indices);
    kv_pack_range(indices, 0, idx, cx.pieces, cx.bits, cx.per);
done:
    free(idx);
    free(cell_idx);
    ctx_free(&cx);
    return st;
}

kv_status kv_higgs_decode_ref(float *x_hat, const kv_higgs *h, size_t tokens, size_t channels,
                              const uint32_t *indices, const void *norms) {
    higgs_ctx cx;
    kv_status st = ctx_init(&cx, h, tokens, channels);
    if (st != KV_OK) return st;
    const size_t g = cx.g, per_group = g / (size_t)cx.d;
    const int d = cx.d;
    float *v = cx.v;
    uint8_t *ib = malloc(per_group);
    if (!ib) {
        ctx_free(&cx);
        return KV_ERR(KV_ENOMEM, "HIGGS: out of memory");
    }
    for (size_t grp = 0; grp < cx.groups; grp++) {
        const float mul = kv_qm_higgs_dec_mul(kv_qm_param_load(norms, grp, (int)h->norm_type), g);
        kv_unpack_range(ib, indices, grp * per_group, per_group, cx.bits, cx.per);
        for (size_t p = 0; p < per_group; p++) {
            const uint32_t i = ib[p];
            for (int k = 0; k < d; k++) v[p * (size_t)d + (size_t)k] = h->grid[i * (uint32_t)d + (uint32_t)k] * mul;
        }
        const float *sg = cx.signs + (grp * g) % channels;
        float *yg = x_hat + grp * g;
        if (!kv_fwht_sse2_decode(yg, v, g, sg)) {
            fwht_fast(v, g);
            for (size_t k = 0; k < g; k++) yg[k] = v[k] * sg[k];
        }
    }
    free(ib);
    ctx_free(&cx);
    return KV_OK;
}

kv_status kv_higgs_scores_ref(float *scores, const kv_higgs *h, size_t tokens, size_t channels,
                              const uint32_t *indices, const void *norms, const float *query) {
    higgs_ctx cx;
    kv_status st = ctx_init(&cx, h, tokens, channels);
    if (st != KV_OK) return st;
    float *qrot = malloc((channels ? channels : 1) * sizeof *qrot);
    if (!qrot) {
        ctx_free(&cx);
        return KV_ERR(KV_ENOMEM, "HIGGS: out of memory");
    }
    kv_qm_higgs_rotate_query(qrot, query, h->seed, channels, cx.g);
    for (size_t t = 0; t < tokens; t++)
        scores[t] = kv_qm_higgs_score(qrot, channels, cx.g, t, indices, norms, (int)h->norm_type, h->grid,
                                      cx.d, cx.bits, cx.per);
    free(qrot);
    ctx_free(&cx);
    return KV_OK;
}
