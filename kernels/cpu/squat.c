/* SQuat key quantization: CPU reference (kvrt.h; squat.txt §3.3, appendix A.2, Algorithm 1).
 *
 * P = I + lambda Qh^T Qh, P_inv = P^-1. The key is quantized in blocks of g channels; after block t
 * (channels [e_{t-1}, e_t)) the remaining channels move by W_t err with W_t = B_t H_t (Lemma 2,
 * eq. 6): B_t = P_inv[e_t:, :e_t], H_t = the last g_t columns of A_t^-1, A_t = P_inv[:e_t, :e_t].
 * The A_t^-1 come from A_T^-1 = P by Lemma 3: A_t^-1 = M - N^T O^-1 N for
 * A_{t+1}^-1 = [[M, N^T], [N, O]]. Everything is precomputed in double; W_t is kept as float.
 */
#include "kv_quant_math.h"
#include "kv_kernels_internal.h"

#include <lapacke.h>
#include <math.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif
#include <stdlib.h>
#include <string.h>

struct kv_squat {
    int d, g, nblocks;   /* nblocks = T = ceil(d / g) */
    double *pinv;        /* d x d */
    float *w;            /* concatenated W_t, t = 1..T-1 */
    float *wt;           /* the same W_t transposed (gt x (d - e_t) each, at the same offsets): the
                            operand of the chunk-wide update, read along the remaining coordinates */
    size_t nw;
    size_t *woff;        /* T + 1 offsets into w (woff[t] for t = 1..T-1) */
};

static int block_end(const kv_squat *s, int t) { return t * s->g < s->d ? t * s->g : s->d; }

kv_status kv_squat_subspace_ref(float *qhat, const float *queries, size_t n, int d, int r) {
    if (d < 1 || r < 1 || (size_t)r > n || r > d)
        return KV_ERR(KV_EINVAL, "SQuat subspace: need 1 <= r <= min(n, d) (n=%zu d=%d r=%d)", n, d, r);
    size_t nd;
    if (kv_size_mul(&nd, n, (size_t)d) != 0) return KV_ERR(KV_EINVAL, "SQuat subspace: too many queries");
    const size_t k = n < (size_t)d ? n : (size_t)d;
    double *a = malloc(nd * sizeof *a), *sv = malloc(k * sizeof *sv), *vt = malloc(k * (size_t)d * sizeof *vt);
    double *superb = malloc(k * sizeof *superb);
    kv_status st = KV_OK;
    if (!a || !sv || !vt || !superb) {
        st = KV_ERR(KV_ENOMEM, "SQuat subspace: out of memory");
        goto done;
    }
    for (size_t i = 0; i < nd; i++) {
        if (!kv_qm_is_finite(queries[i])) {
            st = KV_ERR(KV_ENUMERIC, "SQuat subspace: non-finite query value");
            goto done;
        }
        a[i] = queries[i];
    }
    double udummy = 0.0;
    lapack_int info = LAPACKE_dgesvd(LAPACK_ROW_MAJOR, 'N', 'S', (lapack_int)n, d, a, d, sv, &udummy, 1,
                                     vt, d, superb);
    if (info != 0) {
        st = KV_ERR(KV_ENUMERIC, "SQuat subspace: dgesvd failed (info %d)", (int)info);
        goto done;
    }
    for (int i = 0; i < r; i++)
        for (int j = 0; j < d; j++) qhat[(size_t)i * (size_t)d + (size_t)j] = (float)(sv[i] * vt[(size_t)i * (size_t)d + (size_t)j]);
done:
    free(a);
    free(sv);
    free(vt);
    free(superb);
    return st;
}

void kv_squat_free(kv_squat *s) {
    if (!s) return;
    free(s->pinv);
    free(s->w);
    free(s->wt);
    free(s->woff);
    free(s);
}

int kv_squat_dim(const kv_squat *s) { return s->d; }
size_t kv_squat_bytes(const kv_squat *s) {
    return s ? sizeof *s + (size_t)s->d * (size_t)s->d * sizeof *s->pinv + 2 * s->nw * sizeof *s->w +
                   ((size_t)s->nblocks + 1) * sizeof *s->woff
             : 0;
}
int kv_squat_block(const kv_squat *s) { return s->g; }
const double *kv_squat_pinv(const kv_squat *s) { return s->pinv; }
const float *kv_squat_weights(const kv_squat *s, size_t *count) {
    if (count) *count = s->nw;
    return s->w;
}

kv_status kv_squat_create(kv_squat **out, const float *qhat, int r, int d, float lambda, int block) {
    *out = NULL;
    if (d < 1 || d > 4096) return KV_ERR(KV_EINVAL, "SQuat: dimension must be in 1..4096 (got %d)", d);
    if (block < 1) return KV_ERR(KV_EINVAL, "SQuat: block must be >= 1 (got %d)", block);
    if (r < 0 || (r > 0 && !qhat)) return KV_ERR(KV_EINVAL, "SQuat: bad subspace (r=%d)", r);
    if (!(lambda >= 0.0f) || !kv_qm_is_finite(lambda))
        return KV_ERR(KV_EINVAL, "SQuat: lambda must be finite and >= 0 (got %g)", (double)lambda);
    kv_status st = KV_OK;
    const size_t D = (size_t)d;
    kv_squat *s = calloc(1, sizeof *s);
    double *p = malloc(D * D * sizeof *p), *ainv = malloc(D * D * sizeof *ainv), *x = malloc(D * D * sizeof *x);
    double *o = malloc(D * D * sizeof *o);
    if (!s || !p || !ainv || !x || !o) {
        st = KV_ERR(KV_ENOMEM, "SQuat: out of memory");
        goto done;
    }
    s->d = d;
    s->g = block < d ? block : d;
    s->nblocks = (d + s->g - 1) / s->g;
    s->pinv = malloc(D * D * sizeof *s->pinv);
    s->woff = calloc((size_t)s->nblocks + 1, sizeof *s->woff);
    if (!s->pinv || !s->woff) {
        st = KV_ERR(KV_ENOMEM, "SQuat: out of memory");
        goto done;
    }
    /* P = I + lambda Qh^T Qh */
    for (size_t i = 0; i < D; i++)
        for (size_t j = 0; j < D; j++) {
            double acc = 0.0;
            for (int k = 0; k < r; k++) acc += (double)qhat[(size_t)k * D + i] * (double)qhat[(size_t)k * D + j];
            p[i * D + j] = (i == j ? 1.0 : 0.0) + (double)lambda * acc;
        }
    for (size_t i = 0; i < D * D; i++) {
        if (!isfinite(p[i])) {
            st = KV_ERR(KV_ENUMERIC, "SQuat: non-finite subspace");
            goto done;
        }
    }
    memcpy(s->pinv, p, D * D * sizeof *p);
    lapack_int info = LAPACKE_dpotrf(LAPACK_ROW_MAJOR, 'L', d, s->pinv, d);
    if (info == 0) info = LAPACKE_dpotri(LAPACK_ROW_MAJOR, 'L', d, s->pinv, d);
    if (info != 0) {
        st = KV_ERR(KV_ENUMERIC, "SQuat: I + lambda Qh^T Qh is not invertible (info %d)", (int)info);
        goto done;
    }
    for (size_t i = 0; i < D; i++)
        for (size_t j = i + 1; j < D; j++) s->pinv[i * D + j] = s->pinv[j * D + i];
    /* sizes of the W_t */
    size_t total = 0;
    for (int t = 1; t < s->nblocks; t++) {
        const int e = block_end(s, t), gt = e - block_end(s, t - 1);
        s->woff[t] = total;
        total += (size_t)(d - e) * (size_t)gt;
    }
    s->woff[s->nblocks] = total;
    s->nw = total;
    s->w = malloc((total ? total : 1) * sizeof *s->w);
    s->wt = malloc((total ? total : 1) * sizeof *s->wt);
    if (!s->w || !s->wt) {
        st = KV_ERR(KV_ENOMEM, "SQuat: out of memory");
        goto done;
    }
    /* A_T^-1 = P (leading dimension D throughout); walk t = T-1 .. 1 */
    memcpy(ainv, p, D * D * sizeof *p);
    for (int t = s->nblocks - 1; t >= 1; t--) {
        const int e = block_end(s, t), e1 = block_end(s, t + 1), go = e1 - e;
        /* X = O^-1 N with O = ainv[e:e1, e:e1], N = ainv[e:e1, 0:e] */
        for (int i = 0; i < go; i++) {
            for (int j = 0; j < go; j++) o[(size_t)i * (size_t)go + (size_t)j] = ainv[(size_t)(e + i) * D + (size_t)(e + j)];
            for (int j = 0; j < e; j++) x[(size_t)i * (size_t)e + (size_t)j] = ainv[(size_t)(e + i) * D + (size_t)j];
        }
        info = LAPACKE_dposv(LAPACK_ROW_MAJOR, 'L', go, e, o, go, x, e);
        if (info != 0) {
            st = KV_ERR(KV_ENUMERIC, "SQuat: Lemma 3 solve failed at block %d (info %d)", t, (int)info);
            goto done;
        }
        /* A_t^-1 = M - N^T X, built in o (free now) because N is read while M is replaced */
        double *m = o;
        for (int i = 0; i < e; i++)
            for (int j = 0; j < e; j++) {
                double acc = 0.0;
                for (int k = 0; k < go; k++)
                    acc += ainv[(size_t)(e + k) * D + (size_t)i] * x[(size_t)k * (size_t)e + (size_t)j];
                m[(size_t)i * (size_t)e + (size_t)j] = ainv[(size_t)i * D + (size_t)j] - acc;
            }
        for (int i = 0; i < e; i++)
            for (int j = 0; j < e; j++) ainv[(size_t)i * D + (size_t)j] = m[(size_t)i * (size_t)e + (size_t)j];
        /* W_t = B_t H_t: B_t = pinv[e:d, 0:e], H_t = ainv[0:e, e-gt:e] */
        const int gt = e - block_end(s, t - 1);
        float *w = s->w + s->woff[t];
        for (int i = 0; i < d - e; i++)
            for (int j = 0; j < gt; j++) {
                double acc = 0.0;
                for (int k = 0; k < e; k++)
                    acc += s->pinv[(size_t)(e + i) * D + (size_t)k] * ainv[(size_t)k * D + (size_t)(e - gt + j)];
                w[(size_t)i * (size_t)gt + (size_t)j] = (float)acc;
            }
        float *wtr = s->wt + s->woff[t];
        for (int i = 0; i < d - e; i++)
            for (int j = 0; j < gt; j++) wtr[(size_t)j * (size_t)(d - e) + (size_t)i] = w[(size_t)i * (size_t)gt + (size_t)j];
    }
done:
    free(p);
    free(ainv);
    free(x);
    free(o);
    if (st != KV_OK) {
        kv_squat_free(s);
        return st;
    }
    *out = s;
    return KV_OK;
}

kv_status kv_squat_update_ref(float *rest, const kv_squat *s, int t, const float *err) {
    if (t < 1 || t >= s->nblocks) return KV_ERR(KV_EINVAL, "SQuat update: block %d out of 1..%d", t, s->nblocks - 1);
    const int e = block_end(s, t), gt = e - block_end(s, t - 1);
    const float *w = s->w + s->woff[t];
    for (int i = 0; i < s->d - e; i++) rest[i] = kv_qm_squat_update(rest[i], w + (size_t)i * (size_t)gt, err, gt);
    return KV_OK;
}

/* The per-token reference (the oracle of the chunk-wide encoder below, which gives the same bits). */
kv_status kv_squat_encode_loop(uint32_t *codes, void *scales, void *zeros, const kv_squat *s,
                               const kv_uniform *q, size_t tokens, const float *x) {
    kv_status st = kv_uniform_check(q);
    if (st != KV_OK) return st;
    if (q->axis != KV_AXIS_TOKENS) return KV_ERR(KV_EINVAL, "SQuat: keys must be grouped along tokens");
    const size_t C = (size_t)s->d, G = (size_t)q->group;
    size_t n;
    if ((st = kv_block_values(&n, tokens, C)) != KV_OK || n == 0) return st;
    const int bits = q->bits, per = kv_qm_per_word(bits, q->pack11), pt = (int)q->param_type;
    float *k = malloc(n * sizeof *k);
    float *err = malloc(G * (size_t)s->g * sizeof *err);
    uint8_t *cs = malloc(n);
    if (!k || !err || !cs) {
        st = KV_ERR(KV_ENOMEM, "SQuat: out of memory");
        goto done;
    }
    memcpy(k, x, n * sizeof *k);
    for (size_t kg = 0; kg * G < tokens; kg++) {
        const size_t r0 = kg * G, rows = kv_qm_tok_group_rows(G, tokens, kg);
        float *kt = k + r0 * C;
        for (int t = 1; t <= s->nblocks; t++) {
            const int b0 = block_end(s, t - 1), b1 = block_end(s, t), gt = b1 - b0;
            for (int c = b0; c < b1; c++) {
                float lo = kt[c], hi = kt[c];
                int bad = 0;
                for (size_t i = 0; i < rows; i++) {
                    const float v = kt[i * C + (size_t)c];
                    bad |= !kv_qm_is_finite(v);
                    lo = v < lo ? v : lo;
                    hi = v > hi ? v : hi;
                }
                if (bad) {
                    st = KV_ERR(KV_ENUMERIC, "SQuat: non-finite key value (or error propagation overflow)");
                    goto done;
                }
                const kv_qm_uparams p = kv_qm_uniform_params(lo, hi, bits, q->eta);
                const size_t grp = kg * C + (size_t)c;
                kv_qm_param_store(scales, grp, p.sc, pt);
                kv_qm_param_store(zeros, grp, p.zc, pt);
                const float sr = kv_qm_param_round(p.sc, pt), zr = kv_qm_param_round(p.zc, pt);
                const size_t j0 = kg * G * C + (size_t)c * rows;
                for (size_t i = 0; i < rows; i++) {
                    const size_t j = j0 + i;
                    const float v = kt[i * C + (size_t)c];
                    const uint32_t code = kv_qm_uniform_code(v, p.z, p.inv, kv_qm_slot_max(bits, per, (int)(j % (size_t)per)));
                    cs[j] = (uint8_t)code;
                    err[i * (size_t)gt + (size_t)(c - b0)] = kv_qm_uniform_dequant(code, sr, zr) - v;
                }
            }
            if (t < s->nblocks)
                for (size_t i = 0; i < rows; i++)
                    kv_squat_update_ref(kt + i * C + (size_t)b1, s, t, err + i * (size_t)gt);
        }
    }
    st = kv_pack_ref(codes, cs, n, bits, q->pack11);
done:
    free(k);
    free(err);
    free(cs);
    return st;
}

/* ---- the chunk-wide encoder ----------------------------------------------------------------------
 * Token groups are independent, so block t is quantized for every token of the chunk first, and then
 * the remaining coordinates of all tokens move at once: K[:, e_t:] += E_t W_t^T, a GEMM of
 * (tokens x g_t) by (g_t x (d - e_t)) (for a long input, per tile of about SQUAT_TILE tokens, so that
 * what the blocks pass along stays in cache; a runtime chunk is one tile). Each output element is accumulated exactly as
 * kv_qm_squat_update does it (acc = 0, then acc += w[k] err[k] for k in order, then rest + acc; the
 * build never contracts a*b+c), so the codes, scales and zero points are those of
 * kv_squat_encode_loop bit for bit, at every SIMD level (tested). A BLAS sgemm would reorder the sums
 * and could flip codes against the reference and the CUDA kernel; the loops below get the GEMM's
 * data reuse (4 tokens share each load of W_t^T, 16 coordinates per step) without reordering. */
#define SQUAT_TB 4 /* tokens sharing one pass over W_t^T */
#define SQUAT_TILE 256 /* tokens encoded through all blocks before the next ones */

/* dst[c * ldd + i] = src[i * lds + c] for i < rows, c < cols (the codes of a token group, token-major,
 * to the block's channel runs): 8 x 8 byte tiles through SSE2 unpacks, the edges byte by byte. */
static void squat_transpose_codes(uint8_t *dst, size_t ldd, const uint8_t *src, size_t lds, size_t rows, size_t cols) {
    size_t i0 = 0, c0 = 0;
#if defined(__SSE2__)
    for (i0 = 0; i0 + 8 <= rows; i0 += 8)
        for (c0 = 0; c0 + 8 <= cols; c0 += 8) {
            const uint8_t *s0 = src + i0 * lds + c0;
            __m128i r[8];
            for (int a = 0; a < 8; a++) r[a] = _mm_loadl_epi64((const __m128i *)(const void *)(s0 + (size_t)a * lds));
            /* bytes of rows (0,1), (2,3), ... interleaved, then 16-bit, then 32-bit pairs */
            const __m128i a0 = _mm_unpacklo_epi8(r[0], r[1]), a1 = _mm_unpacklo_epi8(r[2], r[3]);
            const __m128i a2 = _mm_unpacklo_epi8(r[4], r[5]), a3 = _mm_unpacklo_epi8(r[6], r[7]);
            const __m128i b0 = _mm_unpacklo_epi16(a0, a1), b1 = _mm_unpackhi_epi16(a0, a1);
            const __m128i b2 = _mm_unpacklo_epi16(a2, a3), b3 = _mm_unpackhi_epi16(a2, a3);
            const __m128i d0 = _mm_unpacklo_epi32(b0, b2), d1 = _mm_unpackhi_epi32(b0, b2);
            const __m128i d2 = _mm_unpacklo_epi32(b1, b3), d3 = _mm_unpackhi_epi32(b1, b3);
            /* d0 holds columns 0 and 1 (8 rows each), d1 columns 2, 3, d2 4, 5, d3 6, 7 */
            uint8_t *o = dst + c0 * ldd + i0;
            _mm_storel_epi64((__m128i *)(void *)o, d0);
            _mm_storel_epi64((__m128i *)(void *)(o + ldd), _mm_srli_si128(d0, 8));
            _mm_storel_epi64((__m128i *)(void *)(o + 2 * ldd), d1);
            _mm_storel_epi64((__m128i *)(void *)(o + 3 * ldd), _mm_srli_si128(d1, 8));
            _mm_storel_epi64((__m128i *)(void *)(o + 4 * ldd), d2);
            _mm_storel_epi64((__m128i *)(void *)(o + 5 * ldd), _mm_srli_si128(d2, 8));
            _mm_storel_epi64((__m128i *)(void *)(o + 6 * ldd), d3);
            _mm_storel_epi64((__m128i *)(void *)(o + 7 * ldd), _mm_srli_si128(d3, 8));
        }
    /* the column edge of the tiled rows, then the row edge */
    for (size_t i = 0; i < i0; i++)
        for (size_t c = cols - cols % 8; c < cols; c++) dst[c * ldd + i] = src[i * lds + c];
#endif
    for (size_t c = 0; c < cols; c++)
        for (size_t i = i0; i < rows; i++) dst[c * ldd + i] = src[i * lds + c];
}

/* rest[b][cc] += sum_k wt[k][cc] err[b][k] for rows b < nb and cc < nr (row strides: rest ldr, err
 * lde, wt ldw). */
static void squat_update_rows_c(float *rest, size_t ldr, const float *err, size_t lde, const float *wt, size_t ldw,
                                int gt, int nr, int nb) {
    float acc[SQUAT_TB][16];
    for (int c0 = 0; c0 < nr; c0 += 16) {
        const int nc = nr - c0 < 16 ? nr - c0 : 16;
        for (int b = 0; b < nb; b++)
            for (int c = 0; c < nc; c++) acc[b][c] = 0.0f;
        for (int k = 0; k < gt; k++) {
            const float *w = wt + (size_t)k * ldw + (size_t)c0;
            for (int b = 0; b < nb; b++) {
                const float e = err[(size_t)b * lde + (size_t)k];
                for (int c = 0; c < nc; c++) acc[b][c] += w[c] * e;
            }
        }
        for (int b = 0; b < nb; b++)
            for (int c = 0; c < nc; c++) rest[(size_t)b * ldr + (size_t)(c0 + c)] += acc[b][c];
    }
}

#if defined(__SSE2__)
/* The same sums, 4 lanes, SQUAT_TB tokens x 8 coordinates in registers; the tail by the C loop. */
static void squat_update_rows_sse2(float *rest, size_t ldr, const float *err, size_t lde, const float *wt, int gt,
                                   int nr, int nb) {
    int c0 = 0;
    if (nb == SQUAT_TB) {
        for (; c0 + 8 <= nr; c0 += 8) {
            __m128 a0 = _mm_setzero_ps(), a1 = _mm_setzero_ps(), a2 = _mm_setzero_ps(), a3 = _mm_setzero_ps(),
                   a4 = _mm_setzero_ps(), a5 = _mm_setzero_ps(), a6 = _mm_setzero_ps(), a7 = _mm_setzero_ps();
            for (int k = 0; k < gt; k++) {
                const float *w = wt + (size_t)k * (size_t)nr + (size_t)c0;
                const __m128 w0 = _mm_loadu_ps(w), w1 = _mm_loadu_ps(w + 4);
                const __m128 e0 = _mm_set1_ps(err[(size_t)k]), e1 = _mm_set1_ps(err[lde + (size_t)k]);
                const __m128 e2 = _mm_set1_ps(err[2 * lde + (size_t)k]), e3 = _mm_set1_ps(err[3 * lde + (size_t)k]);
                a0 = _mm_add_ps(a0, _mm_mul_ps(w0, e0));
                a1 = _mm_add_ps(a1, _mm_mul_ps(w1, e0));
                a2 = _mm_add_ps(a2, _mm_mul_ps(w0, e1));
                a3 = _mm_add_ps(a3, _mm_mul_ps(w1, e1));
                a4 = _mm_add_ps(a4, _mm_mul_ps(w0, e2));
                a5 = _mm_add_ps(a5, _mm_mul_ps(w1, e2));
                a6 = _mm_add_ps(a6, _mm_mul_ps(w0, e3));
                a7 = _mm_add_ps(a7, _mm_mul_ps(w1, e3));
            }
            float *r = rest + (size_t)c0;
            _mm_storeu_ps(r, _mm_add_ps(_mm_loadu_ps(r), a0));
            _mm_storeu_ps(r + 4, _mm_add_ps(_mm_loadu_ps(r + 4), a1));
            r += ldr;
            _mm_storeu_ps(r, _mm_add_ps(_mm_loadu_ps(r), a2));
            _mm_storeu_ps(r + 4, _mm_add_ps(_mm_loadu_ps(r + 4), a3));
            r += ldr;
            _mm_storeu_ps(r, _mm_add_ps(_mm_loadu_ps(r), a4));
            _mm_storeu_ps(r + 4, _mm_add_ps(_mm_loadu_ps(r + 4), a5));
            r += ldr;
            _mm_storeu_ps(r, _mm_add_ps(_mm_loadu_ps(r), a6));
            _mm_storeu_ps(r + 4, _mm_add_ps(_mm_loadu_ps(r + 4), a7));
        }
    }
    if (c0 < nr) squat_update_rows_c(rest + c0, ldr, err, lde, wt + c0, (size_t)nr, gt, nr - c0, nb);
}
#endif

#if KV_HAVE_X86_AVX2
#include <immintrin.h>
/* The same sums, 8 lanes, SQUAT_TB tokens x 16 coordinates in registers; the tail by the C loop. */
__attribute__((target("avx2"))) static void squat_update_rows_avx2(float *rest, size_t ldr, const float *err,
                                                                   size_t lde, const float *wt, int gt, int nr,
                                                                   int nb) {
    int c0 = 0;
    if (nb == SQUAT_TB) {
        for (; c0 + 16 <= nr; c0 += 16) {
            __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps(), a2 = _mm256_setzero_ps(),
                   a3 = _mm256_setzero_ps(), a4 = _mm256_setzero_ps(), a5 = _mm256_setzero_ps(),
                   a6 = _mm256_setzero_ps(), a7 = _mm256_setzero_ps();
            for (int k = 0; k < gt; k++) {
                const float *w = wt + (size_t)k * (size_t)nr + (size_t)c0;
                const __m256 w0 = _mm256_loadu_ps(w), w1 = _mm256_loadu_ps(w + 8);
                const __m256 e0 = _mm256_set1_ps(err[(size_t)k]), e1 = _mm256_set1_ps(err[lde + (size_t)k]);
                const __m256 e2 = _mm256_set1_ps(err[2 * lde + (size_t)k]), e3 = _mm256_set1_ps(err[3 * lde + (size_t)k]);
                a0 = _mm256_add_ps(a0, _mm256_mul_ps(w0, e0));
                a1 = _mm256_add_ps(a1, _mm256_mul_ps(w1, e0));
                a2 = _mm256_add_ps(a2, _mm256_mul_ps(w0, e1));
                a3 = _mm256_add_ps(a3, _mm256_mul_ps(w1, e1));
                a4 = _mm256_add_ps(a4, _mm256_mul_ps(w0, e2));
                a5 = _mm256_add_ps(a5, _mm256_mul_ps(w1, e2));
                a6 = _mm256_add_ps(a6, _mm256_mul_ps(w0, e3));
                a7 = _mm256_add_ps(a7, _mm256_mul_ps(w1, e3));
            }
            float *r = rest + (size_t)c0;
            _mm256_storeu_ps(r, _mm256_add_ps(_mm256_loadu_ps(r), a0));
            _mm256_storeu_ps(r + 8, _mm256_add_ps(_mm256_loadu_ps(r + 8), a1));
            r += ldr;
            _mm256_storeu_ps(r, _mm256_add_ps(_mm256_loadu_ps(r), a2));
            _mm256_storeu_ps(r + 8, _mm256_add_ps(_mm256_loadu_ps(r + 8), a3));
            r += ldr;
            _mm256_storeu_ps(r, _mm256_add_ps(_mm256_loadu_ps(r), a4));
            _mm256_storeu_ps(r + 8, _mm256_add_ps(_mm256_loadu_ps(r + 8), a5));
            r += ldr;
            _mm256_storeu_ps(r, _mm256_add_ps(_mm256_loadu_ps(r), a6));
            _mm256_storeu_ps(r + 8, _mm256_add_ps(_mm256_loadu_ps(r + 8), a7));
        }
    }
    if (c0 < nr) squat_update_rows_c(rest + c0, ldr, err, lde, wt + c0, (size_t)nr, gt, nr - c0, nb);
}
#endif

/* The update after block t of every token: wt is W_t^T (gt x nr), k the tokens' remaining coordinates,
 * err (tokens x gt, row stride lde) the block's quantization errors. */
static void squat_update(float *k, size_t ldk, const float *err, size_t lde, const float *wt, int gt, int nr,
                         size_t tokens, kv_simd_level lv) {
    for (size_t i = 0; i < tokens; i += SQUAT_TB) {
        const int nb = tokens - i < SQUAT_TB ? (int)(tokens - i) : SQUAT_TB;
#if KV_HAVE_X86_AVX2
        if (lv >= KV_SIMD_AVX2) {
            squat_update_rows_avx2(k + i * ldk, ldk, err + i * lde, lde, wt, gt, nr, nb);
            continue;
        }
#endif
#if defined(__SSE2__)
        if (lv >= KV_SIMD_SSE2) {
            squat_update_rows_sse2(k + i * ldk, ldk, err + i * lde, lde, wt, gt, nr, nb);
            continue;
        }
#endif
        (void)lv;
        squat_update_rows_c(k + i * ldk, ldk, err + i * lde, lde, wt, (size_t)nr, gt, nr, nb);
    }
}

kv_status kv_squat_encode_cols(uint8_t *cs, void *scales, void *zeros, const kv_squat *s, const kv_uniform *q,
                               size_t tokens, size_t channels, size_t c0, const float *x, size_t ldx) {
    kv_status st = kv_uniform_check(q);
    if (st != KV_OK) return st;
    if (q->axis != KV_AXIS_TOKENS) return KV_ERR(KV_EINVAL, "SQuat: keys must be grouped along tokens");
    const int d = s->d;
    const size_t D = (size_t)d, C = channels, G = (size_t)q->group, g = (size_t)s->g;
    if (c0 + D > C || ldx < D)
        return KV_ERR(KV_EINVAL, "SQuat: columns [%zu, %zu) outside a block of %zu channels (row stride %zu)", c0,
                      c0 + D, C, ldx);
    size_t n;
    if ((st = kv_block_values(&n, tokens, D)) != KV_OK || n == 0) return st;
    const int bits = q->bits, per = kv_qm_per_word(bits, q->pack11), pt = (int)q->param_type;
    const kv_simd_level lv = kv_simd_level_now();
    /* tiles of whole token groups (independent), about SQUAT_TILE tokens: the moving keys and the
     * errors of a tile stay in the L2 cache across its blocks */
    const size_t tile = G * ((SQUAT_TILE + G - 1) / G), cap = tile < tokens ? tile : tokens;
    float *k = malloc(cap * D * sizeof *k);
    float *err = malloc(cap * g * sizeof *err);      /* block t's errors: a row of g per token */
    float *col = malloc(G * g * sizeof *col);        /* a token group's codes (bytes), token-major */
    float *pz = malloc(6 * g * sizeof *pz);
    if (!k || !err || !col || !pz) {
        st = KV_ERR(KV_ENOMEM, "SQuat: out of memory");
        goto done;
    }
    float *pinv = pz + g, *sr = pz + 2 * g, *zr = pz + 3 * g, *lo = pz + 4 * g, *hi = pz + 5 * g;
    /* the first block is read from x (nothing moved it); the others are copied to k, which the
     * updates move */
    const size_t e1 = (size_t)block_end(s, 1);
    for (size_t a = 0; a < tokens; a += tile) {
    const size_t nt = tokens - a < tile ? tokens - a : tile;
    const float *xa = x + a * ldx;
    for (size_t i = 0; i < nt; i++) memcpy(k + i * D + e1, xa + i * ldx + e1, (D - e1) * sizeof *k);
    for (int t = 1; t <= s->nblocks; t++) {
        const int b0 = block_end(s, t - 1), b1 = block_end(s, t), gt = b1 - b0;
        const float *src = t == 1 ? xa : k;
        const size_t ld = t == 1 ? ldx : D;
        for (size_t kg = a / G; kg * G < a + nt; kg++) {
            const size_t r0 = kg * G, rows = kv_qm_tok_group_rows(G, tokens, kg), lr = r0 - a;
            const float *kt = src + lr * ld + (size_t)b0;
            /* each channel's range over the group's rows, in row order as the reference compares them
             * (the result of min/max over signed zeros depends on it); vectorized along channels */
            uint32_t bad = 0;
            for (int c = 0; c < gt; c++) lo[c] = hi[c] = kt[c];
            for (size_t i = 0; i < rows; i++) {
                const float *row = kt + i * ld;
                for (int c = 0; c < gt; c++) {
                    const float v = row[c];
                    bad |= kv_qm_nonfinite_bit(v);
                    lo[c] = v < lo[c] ? v : lo[c];
                    hi[c] = v > hi[c] ? v : hi[c];
                }
            }
            if (bad) {
                st = KV_ERR(KV_ENUMERIC, "SQuat: non-finite key value (or error propagation overflow)");
                goto done;
            }
            for (int c = 0; c < gt; c++) {
                const kv_qm_uparams p = kv_qm_uniform_params(lo[c], hi[c], bits, q->eta);
                const size_t grp = kg * C + c0 + (size_t)(b0 + c);
                kv_qm_param_store(scales, grp, p.sc, pt);
                kv_qm_param_store(zeros, grp, p.zc, pt);
                pz[c] = p.z;
                pinv[c] = p.inv;
                sr[c] = kv_qm_param_round(p.sc, pt);
                zr[c] = kv_qm_param_round(p.zc, pt);
            }
            /* codes row by row (a token group's channel is a run of `rows` codes in the block's stream:
             * the codes go to col first, channel-major, then to their runs) */
            const size_t jb = kg * G * C + (c0 + (size_t)b0) * rows;
            for (size_t i = 0; i < rows; i++) {
                const float *row = kt + i * ld;
                float *e = err + (lr + i) * g;
                uint8_t *ci = (uint8_t *)col + i * g;
                if (per != 11) { /* every slot holds 0..2^bits-1: no stream position needed */
                    const uint32_t mx = kv_qm_slot_max(bits, per, 0);
                    for (int c = 0; c < gt; c++) {
                        const uint32_t code = kv_qm_uniform_code(row[c], pz[c], pinv[c], mx);
                        ci[c] = (uint8_t)code;
                        e[c] = kv_qm_uniform_dequant(code, sr[c], zr[c]) - row[c];
                    }
                } else { /* the 11-per-word layout clamps slot 10 of each word */
                    for (int c = 0; c < gt; c++) {
                        const size_t j = jb + (size_t)c * rows + i;
                        const uint32_t code = kv_qm_uniform_code(row[c], pz[c], pinv[c], kv_qm_slot_max(bits, per, (int)(j % 11u)));
                        ci[c] = (uint8_t)code;
                        e[c] = kv_qm_uniform_dequant(code, sr[c], zr[c]) - row[c];
                    }
                }
            }
            squat_transpose_codes(cs + jb, rows, (const uint8_t *)col, g, rows, (size_t)gt);
        }
        if (t < s->nblocks) squat_update(k + b1, D, err, g, s->wt + s->woff[t], gt, d - b1, nt, lv);
    }
    }
done:
    free(k);
    free(err);
    free(col);
    free(pz);
    return st;
}

kv_status kv_squat_encode_ref(uint32_t *codes, void *scales, void *zeros, const kv_squat *s,
                              const kv_uniform *q, size_t tokens, const float *x) {
    kv_status st = kv_uniform_check(q);
    if (st != KV_OK) return st;
    if (q->axis != KV_AXIS_TOKENS) return KV_ERR(KV_EINVAL, "SQuat: keys must be grouped along tokens");
    size_t n;
    if ((st = kv_block_values(&n, tokens, (size_t)s->d)) != KV_OK || n == 0) return st;
    uint8_t *cs = malloc(n);
    if (!cs) return KV_ERR(KV_ENOMEM, "SQuat: out of memory");
    st = kv_squat_encode_cols(cs, scales, zeros, s, q, tokens, (size_t)s->d, 0, x, (size_t)s->d);
    if (st == KV_OK) { /* the codes are in range for their slots already (kv_pack_ref's masking not needed) */
        memset(codes, 0, kv_pack_words(n, q->bits, q->pack11) * sizeof *codes);
        kv_pack_range(codes, 0, cs, n, q->bits, kv_qm_per_word(q->bits, q->pack11));
    }
    free(cs);
    return st;
}
