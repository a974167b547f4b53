/* simd.c — which x86 instruction-set paths the CPU kernels take (kv_kernels_internal.h).
 *
 * SSE2 is the x86-64 baseline, compiled in directly; AVX2 code is compiled with function target
 * attributes and used only when this CPU (and its OS) has it, so one build runs everywhere. Tests
 * lower the limit to run every path on one machine and compare their bits. */
#include "kv_kernels_internal.h"

#include <stdatomic.h>

static atomic_int simd_limit = KV_SIMD_AVX2;

static kv_simd_level machine_level(void) {
#if KV_HAVE_X86_AVX2
    /* libgcc's CPU model (filled before main) checks CPUID and that the OS saves the YMM registers */
    if (__builtin_cpu_supports("avx2")) return KV_SIMD_AVX2;
#endif
#if defined(__SSE2__)
    return KV_SIMD_SSE2;
#else
    return KV_SIMD_NONE;
#endif
}

kv_simd_level kv_simd_level_now(void) {
    const kv_simd_level m = machine_level();
    const int limit = atomic_load_explicit(&simd_limit, memory_order_relaxed);
    return (int)m < limit ? m : (kv_simd_level)limit;
}

void kv_simd_level_limit(kv_simd_level max) { atomic_store_explicit(&simd_limit, (int)max, memory_order_relaxed); }
