/* rt_math.c — vector math of the runtime's attention: exp for the softmax, f16 rows. */
#include "kvrt.h"
#include "rt_internal.h"

#include <string.h>

/* exp(x), x <= 0: x = n ln2 + r with n = round(x log2 e) and |r| <= ln2 / 2 (ln2 split in two so
 * that n ln2 is exact), e^r by the Cephes expf polynomial, times 2^n built in the exponent bits.
 * Every step is elementwise and in one fixed order, so the compiler's vector versions give the
 * same bits as the scalar loop. Below -87.33 (2^n no longer a normal float) the result is 0. */
static inline float exp_le0(float x) {
    const float log2e = 1.44269504088896341f, c1 = 0.693359375f, c2 = -2.12194440e-4f;
    const float magic = 12582912.0f; /* 1.5 * 2^23: adding and subtracting it rounds to an integer */
    const float lo = -87.33f;
    const float xc = x < lo ? lo : x;
    const float n = (xc * log2e + magic) - magic;
    const float r = (xc - n * c1) - n * c2;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    const float y = (p * (r * r) + r) + 1.0f;
    union { uint32_t u; float f; } e;
    e.u = (uint32_t)((int32_t)n + 127) << 23;
    const float out = y * e.f;
    return x < lo ? 0.0f : out;
}

void kv_rti_exp_inplace(float *x, size_t n) {
    if (kv_rti_avx2_usable())
        kv_rti_exp_avx2(x, n);
    else
        kv_rti_exp_portable(x, n);
}

void kv_rti_exp_portable(float *x, size_t n) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int k = 0; k < 8; k++) x[i + (size_t)k] = exp_le0(x[i + (size_t)k]);
    for (; i < n; i++) x[i] = exp_le0(x[i]);
}

float kv_rti_shift_by_max(float *x, size_t n) {
    if (kv_rti_avx2_usable()) return kv_rti_shift_by_max_avx2(x, n);
    float mx = x[0];
    for (size_t i = 1; i < n; i++) mx = x[i] > mx ? x[i] : mx;
    for (size_t i = 0; i < n; i++) x[i] = x[i] - mx;
    return mx;
}

void kv_rti_f16_to_f32_row(float *dst, const uint16_t *src, size_t n) {
    if (kv_rti_avx2_usable()) {
        kv_rti_f16_to_f32_row_avx2(dst, src, n);
        return;
    }
    for (size_t i = 0; i < n; i++) dst[i] = rt_f16(src[i]);
}

void kv_rti_f32_to_f16_row(uint16_t *dst, const float *src, size_t n) {
    if (kv_rti_avx2_usable()) {
        kv_rti_f32_to_f16_row_avx2(dst, src, n);
        return;
    }
    for (size_t i = 0; i < n; i++) dst[i] = kv_f32_to_f16(src[i]);
}

void kv_rti_unpack_words(float *dst, const uint32_t *w, size_t nwords, int bits) {
    if (kv_rti_avx2_usable()) {
        kv_rti_unpack_words_avx2(dst, w, nwords, bits);
        return;
    }
    const int per = 32 / bits;
    const uint32_t mask = (1u << bits) - 1u;
    for (size_t i = 0; i < nwords; i++)
        for (int s = 0; s < per; s++) dst[i * (size_t)per + (size_t)s] = (float)((w[i] >> (s * bits)) & mask);
}
