/* rt_rope.c — RoPE for streams that store keys before it (pre_rope): the keys a block decodes to are
 * rotated to their positions as they are read, with exactly the model's arithmetic (angle
 * pos * inv_freq[i] in double, cos/sin rounded to float once, x0 c - x1 s and x0 s + x1 c), so a
 * decoded key equals the one the model would have rotated. The cos/sin table grows to the largest
 * position read (head_dim floats per position) and is shared by every layer and sequence. */
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
    for (int p = rt->rope_n; p < cap; p++)
        for (size_t i = 0; i < half; i++) {
            const double ang = (double)p * rt->inv_freq[i];
            rt->rope_cos[(size_t)p * half + i] = (float)cos(ang);
            rt->rope_sin[(size_t)p * half + i] = (float)sin(ang);
        }
    rt->rope_n = cap;
    return KV_OK;
}

void kv_rti_rope_rows(const kv_rt *rt, float *x, size_t ld, int n, int p0) {
    const int hd = rt->head_dim, half = hd / 2;
    const int adjacent = rt->opt.rope_layout == KV_ROPE_ADJACENT;
    for (int r = 0; r < n; r++) {
        float *xr = x + (size_t)r * ld;
        const float *cs = rt->rope_cos + (size_t)(p0 + r) * (size_t)half;
        const float *sn = rt->rope_sin + (size_t)(p0 + r) * (size_t)half;
        for (int i = 0; i < half; i++) {
            const int i0 = adjacent ? 2 * i : i, i1 = adjacent ? 2 * i + 1 : i + half;
            const float a = xr[i0], b = xr[i1];
            xr[i0] = a * cs[i] - b * sn[i];
            xr[i1] = a * sn[i] + b * cs[i];
        }
    }
}

void kv_rti_rope_rows_at(const kv_rt *rt, float *x, size_t ld, int n, const int32_t *pos) {
    for (int r = 0; r < n; r++) kv_rti_rope_rows(rt, x + (size_t)r * ld, ld, 1, pos[r]);
}
