/* rt_rope.c — RoPE for streams that store keys before it (pre_rope): the keys a block decodes to are
 * rotated to their positions as they are read, with exactly the model's arithmetic (angle
 * pos * inv_freq[i] in double, cos/sin rounded to float once, x0 c - x1 s and x0 s + x1 c), so a
 * decoded key equals the one the model would have rotated. The cos/sin table grows to the largest
 * position read (head_dim floats per position) and is shared by every layer and sequence; layers with an attention
 * window have a table of their own when the model gives them their own base (Gemma 3's local layers). */
#include "kvrt.h"
#include "rt_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

kv_status kv_rti_rope_reserve(kv_rt *rt, int n_pos) {
    if (n_pos <= rt->rope_n) return KV_OK;
    if (!rt->inv_freq) return KV_ERR(KV_EINVAL, "runtime: a pre-RoPE stream needs the model's RoPE frequencies");
    int cap = rt->rope_n ? rt->rope_n : 256;
    while (cap < n_pos) cap = cap > (1 << 29) ? n_pos : cap * 2;
    const size_t half = (size_t)rt->head_dim / 2;
    float *c = realloc(rt->rope_cos, (size_t)cap * half * sizeof(float));
    if (!c) return KV_ERR(KV_ENOMEM, "runtime: out of memory for the RoPE table (%d positions)", cap);
    rt->rope_cos = c;
    float *s = realloc(rt->rope_sin, (size_t)cap * half * sizeof(float));
    if (!s) return KV_ERR(KV_ENOMEM, "runtime: out of memory for the RoPE table (%d positions)", cap);
    rt->rope_sin = s;
    if (rt->inv_freq_local) {
        if (!(c = realloc(rt->rope_cos_local, (size_t)cap * half * sizeof(float))))
            return KV_ERR(KV_ENOMEM, "runtime: out of memory for the RoPE table (%d positions)", cap);
        rt->rope_cos_local = c;
        if (!(s = realloc(rt->rope_sin_local, (size_t)cap * half * sizeof(float))))
            return KV_ERR(KV_ENOMEM, "runtime: out of memory for the RoPE table (%d positions)", cap);
        rt->rope_sin_local = s;
    }
    for (int p = rt->rope_n; p < cap; p++)
        for (size_t i = 0; i < half; i++) {
            const double ang = (double)p * rt->inv_freq[i];
            rt->rope_cos[(size_t)p * half + i] = (float)cos(ang);
            rt->rope_sin[(size_t)p * half + i] = (float)sin(ang);
            if (rt->inv_freq_local) {
                const double al = (double)p * rt->inv_freq_local[i];
                rt->rope_cos_local[(size_t)p * half + i] = (float)cos(al);
                rt->rope_sin_local[(size_t)p * half + i] = (float)sin(al);
            }
        }
    rt->rope_n = cap;
    return KV_OK;
}

void kv_rti_rope_table(const kv_rt *rt, int layer, const float **cs, const float **sn) {
    const int local = rt->inv_freq_local && rt->win && rt->win[layer] > 0;
    *cs = local ? rt->rope_cos_local : rt->rope_cos;
    *sn = local ? rt->rope_sin_local : rt->rope_sin;
}

static void rope_rows_portable(const kv_rt *rt, const float *tc, const float *ts, float *x, size_t ld, int n, int p0) {
    const int hd = rt->head_dim, half = hd / 2;
    const int adjacent = rt->opt.rope_layout == KV_ROPE_ADJACENT;
    for (int r = 0; r < n; r++) {
        float *xr = x + (size_t)r * ld;
        const float *cs = tc + (size_t)(p0 + r) * (size_t)half;
        const float *sn = ts + (size_t)(p0 + r) * (size_t)half;
        for (int i = 0; i < half; i++) {
            const int i0 = adjacent ? 2 * i : i, i1 = adjacent ? 2 * i + 1 : i + half;
            const float a = xr[i0], b = xr[i1];
            xr[i0] = a * cs[i] - b * sn[i];
            xr[i1] = a * sn[i] + b * cs[i];
        }
    }
}

#if KV_HAVE_X86_AVX2
#include <immintrin.h>
/* The same rotation 8 channels at a time (head_dim a multiple of 16): each output is the portable loop's
 * a * cs - b * sn or a * sn + b * cs, two products and one sum, never fused, so the same bits. Adjacent pairs: the
 * row times (c0 c0 c1 c1 ..) plus its pair-swapped copy times (-s0 s0 -s1 s1 ..); halves: whole vectors. */
__attribute__((target("avx2"))) static void rope_rows_avx2(const kv_rt *rt, const float *tc, const float *ts, float *x,
                                                           size_t ld, int n, int p0) {
    const int hd = rt->head_dim, half = hd / 2;
    const int adjacent = rt->opt.rope_layout == KV_ROPE_ADJACENT;
    const __m256i dup = _mm256_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3);
    const __m256 neg_even = _mm256_castsi256_ps(_mm256_setr_epi32((int)0x80000000u, 0, (int)0x80000000u, 0,
                                                                  (int)0x80000000u, 0, (int)0x80000000u, 0));
    for (int r = 0; r < n; r++) {
        float *xr = x + (size_t)r * ld;
        const float *cs = tc + (size_t)(p0 + r) * (size_t)half;
        const float *sn = ts + (size_t)(p0 + r) * (size_t)half;
        if (adjacent) {
            for (int c = 0; c < hd; c += 8) {
                const __m256 v = _mm256_loadu_ps(xr + c);
                const __m256 C = _mm256_permutevar8x32_ps(_mm256_castps128_ps256(_mm_loadu_ps(cs + c / 2)), dup);
                const __m256 S = _mm256_xor_ps(_mm256_permutevar8x32_ps(_mm256_castps128_ps256(_mm_loadu_ps(sn + c / 2)), dup),
                                               neg_even);
                const __m256 u = _mm256_permute_ps(v, _MM_SHUFFLE(2, 3, 0, 1));
                _mm256_storeu_ps(xr + c, _mm256_add_ps(_mm256_mul_ps(v, C), _mm256_mul_ps(u, S)));
            }
        } else {
            for (int i = 0; i < half; i += 8) {
                const __m256 a = _mm256_loadu_ps(xr + i), b = _mm256_loadu_ps(xr + i + half);
                const __m256 C = _mm256_loadu_ps(cs + i), S = _mm256_loadu_ps(sn + i);
                _mm256_storeu_ps(xr + i, _mm256_sub_ps(_mm256_mul_ps(a, C), _mm256_mul_ps(b, S)));
                _mm256_storeu_ps(xr + i + half, _mm256_add_ps(_mm256_mul_ps(a, S), _mm256_mul_ps(b, C)));
            }
        }
    }
}
#endif

static void rope_rows_tab(const kv_rt *rt, const float *tc, const float *ts, float *x, size_t ld, int n, int p0) {
#if KV_HAVE_X86_AVX2
    if (rt->head_dim % 16 == 0 && kv_rti_avx2_usable()) {
        rope_rows_avx2(rt, tc, ts, x, ld, n, p0);
        return;
    }
#endif
    rope_rows_portable(rt, tc, ts, x, ld, n, p0);
}

void kv_rti_rope_rows(const kv_rt *rt, float *x, size_t ld, int n, int p0) {
    rope_rows_tab(rt, rt->rope_cos, rt->rope_sin, x, ld, n, p0);
}

void kv_rti_rope_rows_layer(const kv_rt *rt, int layer, float *x, size_t ld, int n, int p0) {
    const float *tc, *ts;
    kv_rti_rope_table(rt, layer, &tc, &ts);
    rope_rows_tab(rt, tc, ts, x, ld, n, p0);
}

void kv_rti_rope_rows_at(const kv_rt *rt, int layer, float *x, size_t ld, int n, const int32_t *pos) {
    for (int r = 0; r < n; r++) kv_rti_rope_rows_layer(rt, layer, x + (size_t)r * ld, ld, 1, pos[r]);
}
