/* gguf_internal.h — constants shared by gguf_read.c and gguf_write.c (not a public header).
 *
 * GGUF layout (little-endian; v2 and v3 are identical apart from v3 allowing big-endian files,
 * which this reader refuses):
 *   u32 magic "GGUF" | u32 version | u64 tensor_count | u64 kv_count
 *   kv_count x { string key | u32 value_type | value }
 *   tensor_count x { string name | u32 n_dims | u64 ne[n_dims] | u32 type | u64 offset }
 *   zero padding to general.alignment (default 32) | tensor data (offsets relative to here)
 * string = u64 length + bytes (no NUL); array = u32 elem_type + u64 count + elements.
 */
#ifndef KV_GGUF_INTERNAL_H
#define KV_GGUF_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "kv_formats.h"

#define KV_GGUF_MAGIC 0x46554747u /* "GGUF" read as a little-endian u32 */
#define KV_GGUF_DEFAULT_ALIGNMENT 32u
#define KV_GGUF_HEADER_BYTES 24u
/* Arrays nested deeper than this are refused (bounded recursion on hostile input). */
#define KV_GGUF_MAX_DEPTH 16
#define KV_GGUF_MAX_DIMS 4

/* Bytes of one element of a fixed-size value type; 0 for string, array and unknown types. */
static inline size_t kv_gguf_fixed_size(int type) {
    switch (type) {
    case KV_GGUF_UINT8:
    case KV_GGUF_INT8:
    case KV_GGUF_BOOL:
        return 1;
    case KV_GGUF_UINT16:
    case KV_GGUF_INT16:
        return 2;
    case KV_GGUF_UINT32:
    case KV_GGUF_INT32:
    case KV_GGUF_FLOAT32:
        return 4;
    case KV_GGUF_UINT64:
    case KV_GGUF_INT64:
    case KV_GGUF_FLOAT64:
        return 8;
    default:
        return 0;
    }
}

static inline int kv_gguf_type_valid(uint32_t type) { return type <= KV_GGUF_FLOAT64; }

#endif
