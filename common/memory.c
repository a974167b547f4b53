/* Aligned allocation and overflow-checked size arithmetic (kv_common.h). */
#define _POSIX_C_SOURCE 200809L
#define _DEFAULT_SOURCE /* _SC_PHYS_PAGES */
#include "kv_common.h"

#include <stdlib.h>
#include <unistd.h>

void *kv_aligned_alloc(size_t alignment, size_t size) {
    if (alignment < sizeof(void *) || (alignment & (alignment - 1)) != 0) return NULL;
    /* C11 aligned_alloc wants a multiple of the alignment; round up (and never ask for 0). */
    size_t rounded;
    if (kv_size_add(&rounded, size ? size : 1, alignment - 1) != 0) return NULL;
    rounded &= ~(alignment - 1);
    return aligned_alloc(alignment, rounded);
}

void kv_aligned_free(void *p) { free(p); }

int kv_size_mul(size_t *out, size_t a, size_t b) {
    if (a != 0 && b > SIZE_MAX / a) return -1;
    *out = a * b;
    return 0;
}

int kv_size_add(size_t *out, size_t a, size_t b) {
    if (b > SIZE_MAX - a) return -1;
    *out = a + b;
    return 0;
}

uint64_t kv_memory_total_bytes(void) {
    const long pages = sysconf(_SC_PHYS_PAGES), size = sysconf(_SC_PAGESIZE);
    return pages > 0 && size > 0 ? (uint64_t)pages * (uint64_t)size : 0;
}
