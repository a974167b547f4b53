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
    const kv_simd_level lv = kv_simd_level_now();
    if (lv >= KV_SIMD_AVX2 && kv_fwht_avx2(v, v, n)) return;
    if (lv >= KV_SIMD_SSE2 && kv_fwht_sse2(v, v, n)) return;
    fwht_fast(v, n);
}

/* The encoder's transform of one group: v = H (x * signs) * kv_qm_higgs_enc_mul(norm); returns
 * norm = sqrtf(kv_qm_sumsq(x)) (non-finite when x is: v is then meaningless). AVX2, SSE2 and the
 * portable C give the same bits. */
static float encode_transform(float *v, const float *x, size_t g, const float *signs, kv_simd_level lv) {
    float ss;
    if (lv >= KV_SIMD_AVX2 && kv_higgs_transform_avx2(v, x, g, signs, &ss)) return sqrtf(ss);
    if (lv >= KV_SIMD_SSE2 && kv_higgs_transform_sse2(v, x, g, signs, &ss)) return sqrtf(ss);
    const float norm = sqrtf(kv_qm_sumsq(x, g)), mul = kv_qm_higgs_enc_mul(norm);
    for (size_t k = 0; k < g; k++) v[k] = x[k] * signs[k];
    fwht_fast(v, g);
    for (size_t k = 0; k < g; k++) v[k] *= mul;
    return norm;
}

/* The decoder's: y = (H v) * signs (v is overwritten on the portable path). */
static void decode_transform(float *y, float *v, size_t g, const float *signs, kv_simd_level lv) {
    if (lv >= KV_SIMD_AVX2 && kv_fwht_avx2_decode(y, v, g, signs)) return;
    if (lv >= KV_SIMD_SSE2 && kv_fwht_sse2_decode(y, v, g, signs)) return;
    fwht_fast(v, g);
    for (size_t k = 0; k < g; k++) y[k] = v[k] * signs[k];
}

void kv_higgs_decode_transform(float *y, float *v, size_t g, const float *signs) {
    decode_transform(y, v, g, signs, kv_simd_level_now());
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
    size_t batch; /* groups transformed before one nearest-point call (encode) */
    int d, bits, per;
    float *signs; /* channels */
    float *v;     /* batch * g scratch */
} higgs_ctx;

/* Values the encoder transforms before searching their pieces at once: the batched search's
 * per-call set-up is then spread over 512 two-dimensional pieces (measured: 5% faster than one
 * group of 128). */
enum { ENCODE_BATCH_VALUES = 1024 };

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
    cx->batch = cx->g < ENCODE_BATCH_VALUES ? ENCODE_BATCH_VALUES / cx->g : 1;
    cx->v = malloc(cx->batch * cx->g * sizeof *cx->v);
    if (!cx->signs || !cx->v) {
        ctx_free(cx);
        return KV_ERR(KV_ENOMEM, "HIGGS: out of memory");
    }
    for (size_t c = 0; c < channels; c++) cx->signs[c] = kv_qm_higgs_sign(h->seed, h->channel0 + c);
    return KV_OK;
}

kv_status kv_higgs_encode_ref(uint32_t *indices, void *norms, const kv_higgs *h, size_t tokens,
                              size_t channels, const float *x) {
    higgs_ctx cx;
    kv_status st = ctx_init(&cx, h, tokens, channels);
    if (st != KV_OK) return st;
    const size_t g = cx.g, per_group = g / (size_t)cx.d;
    const kv_simd_level lv = kv_simd_level_now();
    uint8_t *ib = malloc(cx.batch * per_group); /* one batch's indices, packed at once */
    if (!ib) {
        st = KV_ERR(KV_ENOMEM, "HIGGS: out of memory");
        goto done;
    }
    memset(indices, 0, kv_pack_words(cx.pieces, cx.bits, 0) * sizeof *indices);
    for (size_t grp0 = 0; grp0 < cx.groups; grp0 += cx.batch) {
        const size_t nb = cx.groups - grp0 < cx.batch ? cx.groups - grp0 : cx.batch;
        for (size_t grp = grp0; grp < grp0 + nb; grp++) {
            const float norm = encode_transform(cx.v + (grp - grp0) * g, x + grp * g, g, cx.signs + (grp * g) % channels, lv);
            if (!kv_qm_is_finite(norm)) {
                st = KV_ERR(KV_ENUMERIC, "HIGGS encode: non-finite input in group %zu", grp);
                goto done;
            }
            kv_qm_param_store(norms, grp, norm, (int)h->norm_type);
        }
        if (h->search)
            kv_grid_search_nearest_many(h->search, ib, cx.v, nb * per_group);
        else
            for (size_t p = 0; p < nb * per_group; p++)
                ib[p] = (uint8_t)kv_qm_grid_nearest(cx.v + p * (size_t)cx.d, h->grid, cx.d, h->size);
        /* every index is < size <= 2^bits: packed directly (kv_pack_ref would mask each code first) */
        kv_pack_range(indices, grp0 * per_group, ib, nb * per_group, cx.bits, cx.per);
    }
done:
    free(ib);
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
    const kv_simd_level lv = kv_simd_level_now();
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
        decode_transform(x_hat + grp * g, v, g, cx.signs + (grp * g) % channels, lv);
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
    kv_qm_higgs_rotate_query(qrot, query, h->seed, h->channel0, channels, cx.g);
    for (size_t t = 0; t < tokens; t++)
        scores[t] = kv_qm_higgs_score(qrot, channels, cx.g, t, indices, norms, (int)h->norm_type, h->grid,
                                      cx.d, cx.bits, cx.per);
    free(qrot);
    ctx_free(&cx);
    return KV_OK;
}
