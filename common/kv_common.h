/* kv_common.h — conventions shared by every kvcal module (the one public header of common/).
 *
 * Status codes and thread-local error messages, logging callback, progress reporter, atomic
 * file writes, aligned allocation, read-only file mapping, SHA-256, f16/bf16 conversion and the
 * KV_HD / KV_RESTRICT macros used by headers that CUDA sources include.
 *
 * Ownership: functions returning memory through an out-parameter hand it to the caller, who
 * frees it with the matching free function. Every free function accepts NULL.
 */
#ifndef KV_COMMON_H
#define KV_COMMON_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- portability macros for headers shared with nvcc ------------------------------------ */
#if defined(__CUDACC__)
#define KV_HD __host__ __device__ static inline
#define KV_RESTRICT __restrict__
#else
#define KV_HD static inline
#if defined(__GNUC__) || defined(__clang__)
#define KV_RESTRICT __restrict__
#else
#define KV_RESTRICT
#endif
#endif

#if defined(__GNUC__) || defined(__clang__)
#define KV_PRINTF(fmt_idx, arg_idx) __attribute__((format(printf, fmt_idx, arg_idx)))
#else
#define KV_PRINTF(fmt_idx, arg_idx)
#endif

#define KV_VERSION_STRING "0.1.0"

/* Tensor element types, numbered as GGML numbers them (GGUF type ids map one to one; kv_formats.h reads and
 * dequantizes them). Here because the plan format (kv_plan.h) stores predictors as KV_DTYPE_F32 / _F16. */
typedef enum kv_dtype {
    KV_DTYPE_F32 = 0,
    KV_DTYPE_F16 = 1,
    KV_DTYPE_Q4_0 = 2,
    KV_DTYPE_Q4_1 = 3,
    KV_DTYPE_Q5_0 = 6,
    KV_DTYPE_Q5_1 = 7,
    KV_DTYPE_Q8_0 = 8,
    KV_DTYPE_Q8_1 = 9,
    KV_DTYPE_Q2_K = 10,
    KV_DTYPE_Q3_K = 11,
    KV_DTYPE_Q4_K = 12,
    KV_DTYPE_Q5_K = 13,
    KV_DTYPE_Q6_K = 14,
    KV_DTYPE_Q8_K = 15,
    KV_DTYPE_I8 = 24,
    KV_DTYPE_I16 = 25,
    KV_DTYPE_I32 = 26,
    KV_DTYPE_I64 = 27,
    KV_DTYPE_F64 = 28,
    KV_DTYPE_BF16 = 30
} kv_dtype;

/* Which channels RoPE rotates together: (2i, 2i+1) (llama.cpp's "normal" GGUF layout) or (i, i + head_dim/2)
 * (HF's rotate_half). A model property (kv_arch, kv_formats.h) that the runtime needs for keys stored before RoPE. */
typedef enum kv_rope_layout { KV_ROPE_ADJACENT = 0, KV_ROPE_HALF = 1 } kv_rope_layout;

/* ---- status codes: values are pinned forever (they appear in exit messages and tests) ---- */
typedef enum kv_status {
    KV_OK = 0,
    KV_EINVAL = -1,       /* invalid argument or contract violation by the caller */
    KV_ENOMEM = -2,       /* allocation failed */
    KV_EIO = -3,          /* operating-system I/O error (open, read, write, fsync, rename) */
    KV_EFORMAT = -4,      /* malformed file content: bad magic, out-of-range count/offset ... */
    KV_EVERSION = -5,     /* file version or required feature this reader does not support */
    KV_ECHECKSUM = -6,    /* CRC / hash mismatch */
    KV_ECUDA = -7,        /* CUDA runtime, cuBLAS or cuSOLVER error */
    KV_ENUMERIC = -8,     /* numerical failure (not positive definite, NaN, no convergence) */
    KV_EUNSUPPORTED = -9, /* valid input this build does not implement (a tensor type, arch) */
    KV_ENOTFOUND = -10,   /* a named key, tensor or file does not exist */
    KV_EMISMATCH = -11,   /* two inputs that must agree do not (plan vs model fingerprint) */
    KV_EINTERRUPTED = -12 /* the operation was interrupted (signal); partial state was kept safe */
} kv_status;

/* Short stable name of a status ("KV_EFORMAT"); never NULL. */
const char *kv_status_name(kv_status s);

/* ---- errors ---------------------------------------------------------------------------------
 * Library functions that fail record a message (thread-local) and return the code. The message
 * carries the source file and line where the error was raised. */
kv_status kv_error_set_at(kv_status code, const char *file, int line, const char *fmt, ...)
    KV_PRINTF(4, 5);
#define KV_ERR(code, ...) kv_error_set_at((code), __FILE__, __LINE__, __VA_ARGS__)

/* The last message recorded on this thread ("" if none). Borrowed; valid until the next error. */
const char *kv_error_last(void);
/* Where the last error was raised, "file:line" ("" if none). Borrowed. */
const char *kv_error_where(void);
void kv_error_clear(void);

/* Prefix the current message with context ("reading plan 'x': " + old message); keeps code. */
kv_status kv_error_wrap(kv_status code, const char *fmt, ...) KV_PRINTF(2, 3);
/* Append to the current message ("; the checkpoint is kept in DIR"); keeps code. */
kv_status kv_error_append(kv_status code, const char *fmt, ...) KV_PRINTF(2, 3);

/* ---- logging: the library never prints; tools install a callback -------------------------- */
typedef enum kv_log_level { KV_LOG_ERROR = 0, KV_LOG_WARN = 1, KV_LOG_INFO = 2, KV_LOG_DEBUG = 3 } kv_log_level;
typedef void (*kv_log_fn)(void *user, kv_log_level level, const char *message);

/* Install the process-wide log sink (NULL = discard) and the most verbose level passed on. */
void kv_log_set_callback(kv_log_fn fn, void *user, kv_log_level max_level);
void kv_log(kv_log_level level, const char *fmt, ...) KV_PRINTF(2, 3);
/* A ready-made sink for tools: writes "level: message\n" to the FILE* given as user. */
void kv_log_to_stream(void *user, kv_log_level level, const char *message);

/* ---- progress -------------------------------------------------------------------------------
 * Long loops report progress through a kv_progress. It draws nothing unless the tool enabled a
 * stream with kv_progress_set_stream(): on a TTY a bar with rate and ETA (at most ~6 redraws/s),
 * otherwise one line every `line_interval_s` seconds (default 10). */
typedef struct kv_progress {
    const char *label;
    const char *unit;     /* "tok", "layer" ... */
    double total;
    double done;
    double t_start;
    double t_last_draw;
    int is_tty;
    int active;
} kv_progress;

void kv_progress_set_stream(FILE *stream, double line_interval_s);
void kv_progress_begin(kv_progress *p, const char *label, const char *unit, double total);
void kv_progress_update(kv_progress *p, double done);
void kv_progress_end(kv_progress *p);
/* Seconds since an arbitrary fixed point (monotonic clock). */
double kv_now_seconds(void);

/* ---- memory ---------------------------------------------------------------------------------- */
/* Aligned allocation (alignment a power of two >= sizeof(void*)); size 0 gives a valid pointer.
 * Returns NULL on failure without recording an error (callers add context). */
void *kv_aligned_alloc(size_t alignment, size_t size);
/* The machine's physical memory in bytes (sysconf), 0 when unknown. Tools refuse work whose memory
 * estimate exceeds it before allocating (an overcommitting kernel would let it grow until killed). */
uint64_t kv_memory_total_bytes(void);
void kv_aligned_free(void *p);
/* Overflow-checked multiply for sizes: returns 0 and sets *out, or -1 on overflow. */
int kv_size_mul(size_t *out, size_t a, size_t b);
int kv_size_add(size_t *out, size_t a, size_t b);

/* ---- files ------------------------------------------------------------------------------------ */
/* A read-only view of a whole file (memory-mapped; empty files get data == NULL, size == 0). */
typedef struct kv_file_map {
    const uint8_t *data;
    size_t size;
    void *priv_;
} kv_file_map;
kv_status kv_file_map_open(kv_file_map *out, const char *path);
void kv_file_map_close(kv_file_map *m);

/* Read a whole file into a malloc'd buffer with a terminating NUL (not counted in *size). The file
 * must be a regular file or a pipe (kv_input_check). */
kv_status kv_file_read_all(char **out, size_t *size, const char *path);
/* The same, refusing (KV_EINVAL) a file larger than max_bytes without reading more than that. */
kv_status kv_file_read_bounded(char **out, size_t *size, const char *path, size_t max_bytes);
/* An input that ends: KV_OK for a regular file or a pipe; KV_EINVAL for an empty path, a directory,
 * a device (/dev/zero never ends) or a socket; KV_EIO when it cannot be stat'ed. */
kv_status kv_input_check(const char *path);

/* Atomic write: data goes to "path.tmp.<pid>", is fsync'd, then renamed over path and the
 * directory fsync'd. On any failure the temporary is removed and path is untouched.
 * A path that exists and is not a regular file (a device such as /dev/null, a pipe) is written in
 * place instead: renaming over it would replace the node. A directory or socket is KV_EINVAL. */
typedef struct kv_atomic_file {
    FILE *fp;          /* write through this */
    char *tmp_path;    /* NULL when writing in place */
    char *final_path;
    int in_place;      /* 1: fp writes final_path directly (not a regular file) */
} kv_atomic_file;
kv_status kv_atomic_open(kv_atomic_file *af, const char *path);
kv_status kv_atomic_commit(kv_atomic_file *af);  /* closes; on error the temporary is removed */
void kv_atomic_abort(kv_atomic_file *af);        /* closes and removes the temporary; NULL-safe */
kv_status kv_write_file_atomic(const char *path, const void *data, size_t size);

/* Can path be written as an output, checked before any work starts: KV_OK for a new file in a
 * writable directory, an existing regular file in a writable directory, or a writable device or
 * pipe (written in place); KV_EINVAL (message names the problem) for an empty path, a directory, a
 * socket, a missing or unwritable directory. */
kv_status kv_output_check(const char *path);
/* 1 when a and b both exist and are the same file (device and inode, not names), else 0. */
int kv_same_file(const char *a, const char *b);
/* mkdir -p: dir and its missing parents (mode 0777 before the umask). 0 on success, -1 with errno set. */
int kv_mkdir_p(const char *dir);

/* ---- SHA-256 (FIPS 180-4) --------------------------------------------------------------------- */
typedef struct kv_sha256 {
    uint32_t h[8];
    uint64_t nbytes;
    uint8_t buf[64];
    size_t nbuf;
} kv_sha256;
void kv_sha256_init(kv_sha256 *s);
void kv_sha256_update(kv_sha256 *s, const void *data, size_t n);
void kv_sha256_final(kv_sha256 *s, uint8_t digest[32]);
void kv_sha256_hex(char out[65], const uint8_t digest[32]);
/* SHA-256 of a whole file as 64 lowercase hex characters plus NUL. */
kv_status kv_sha256_file(char out[65], const char *path);

/* ---- half precision ------------------------------------------------------------------------- */
/* IEEE binary16 -> binary32, exact for every input including subnormals, Inf and NaN. */
KV_HD float kv_f16_to_f32(uint16_t h) {
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t mant = h & 0x3ffu;
    uint32_t bits;
    if (exp == 0) {
        if (mant == 0) {
            bits = sign;
        } else { /* subnormal: renormalize */
            exp = 127 - 15 + 1;
            while ((mant & 0x400u) == 0) {
                mant <<= 1;
                exp--;
            }
            mant &= 0x3ffu;
            bits = sign | (exp << 23) | (mant << 13);
        }
    } else if (exp == 0x1f) {
        bits = sign | 0x7f800000u | (mant << 13);
    } else {
        bits = sign | ((exp + (127 - 15)) << 23) | (mant << 13);
    }
    union { uint32_t u; float f; } v;
    v.u = bits;
    return v.f;
}

/* binary32 -> binary16, round to nearest even, overflow to Inf, NaN kept quiet. */
KV_HD uint16_t kv_f32_to_f16(float f) {
    union { float f; uint32_t u; } v;
    v.f = f;
    const uint32_t x = v.u;
    const uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    const uint32_t absx = x & 0x7fffffffu;
    if (absx >= 0x7f800000u) { /* Inf or NaN */
        return (uint16_t)(sign | 0x7c00u | (absx > 0x7f800000u ? 0x200u : 0u));
    }
    if (absx >= 0x477ff000u) { /* rounds to >= 65520 -> Inf */
        return (uint16_t)(sign | 0x7c00u);
    }
    if (absx < 0x38800000u) { /* result is subnormal or zero */
        if (absx < 0x33000000u) return sign; /* below half the smallest subnormal */
        const uint32_t e = absx >> 23;
        const uint32_t m = (absx & 0x7fffffu) | 0x800000u;
        const uint32_t shift = 126u - e; /* 14..24 */
        uint32_t r = m >> shift;
        const uint32_t rem = m & ((1u << shift) - 1u);
        const uint32_t half = 1u << (shift - 1u);
        if (rem > half || (rem == half && (r & 1u))) r++;
        return (uint16_t)(sign | r);
    }
    uint32_t r = ((absx >> 13) - (112u << 10));
    const uint32_t rem = absx & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (r & 1u))) r++;
    return (uint16_t)(sign | r);
}

KV_HD float kv_bf16_to_f32(uint16_t h) {
    union { uint32_t u; float f; } v;
    v.u = (uint32_t)h << 16;
    return v.f;
}

/* binary32 -> bfloat16, round to nearest even, NaN kept quiet. */
KV_HD uint16_t kv_f32_to_bf16(float f) {
    union { float f; uint32_t u; } v;
    v.f = f;
    if ((v.u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((v.u >> 16) | 0x40u);
    const uint32_t rounding = 0x7fffu + ((v.u >> 16) & 1u);
    return (uint16_t)((v.u + rounding) >> 16);
}

/* ---- little-endian loads from byte buffers (never read raw structs) --------------------------- */
KV_HD uint16_t kv_load_u16le(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }
KV_HD uint32_t kv_load_u32le(const uint8_t *p) {
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}
KV_HD uint64_t kv_load_u64le(const uint8_t *p) {
    return (uint64_t)kv_load_u32le(p) | ((uint64_t)kv_load_u32le(p + 4) << 32);
}
KV_HD float kv_load_f32le(const uint8_t *p) {
    union { uint32_t u; float f; } v;
    v.u = kv_load_u32le(p);
    return v.f;
}
KV_HD void kv_store_u16le(uint8_t *p, uint16_t v) {
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}
KV_HD void kv_store_u32le(uint8_t *p, uint32_t v) {
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
    p[2] = (uint8_t)(v >> 16);
    p[3] = (uint8_t)(v >> 24);
}
KV_HD void kv_store_u64le(uint8_t *p, uint64_t v) {
    kv_store_u32le(p, (uint32_t)v);
    kv_store_u32le(p + 4, (uint32_t)(v >> 32));
}
KV_HD void kv_store_f32le(uint8_t *p, float f) {
    union { float f; uint32_t u; } v;
    v.f = f;
    kv_store_u32le(p, v.u);
}

/* ---- deterministic counter-based RNG (SplitMix64 of seed ^ counter) ---------------------------
 * Same value on CPU and GPU for the same (seed, counter): used for HIGGS signs, sampling. */
KV_HD uint64_t kv_rng_u64(uint64_t seed, uint64_t counter) {
    uint64_t z = seed + (counter + 1u) * 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
/* Uniform in [0,1) with 53 random bits. */
KV_HD double kv_rng_uniform(uint64_t seed, uint64_t counter) {
    return (double)(kv_rng_u64(seed, counter) >> 11) * (1.0 / 9007199254740992.0);
}

/* A sequential RNG for host code (tests, sampling): state advances by one counter per draw. */
typedef struct kv_rng {
    uint64_t seed;
    uint64_t counter;
} kv_rng;
void kv_rng_init(kv_rng *r, uint64_t seed);
uint64_t kv_rng_next_u64(kv_rng *r);
double kv_rng_next_uniform(kv_rng *r);  /* [0,1) */
double kv_rng_next_normal(kv_rng *r);   /* N(0,1), Box-Muller */

/* ---- thread count ------------------------------------------------------------------------------
 * One rule for every tool option (-t/--threads) and $KVCAL_THREADS: an integer in 1..kv_threads_cap(),
 * which is 4 per online CPU and at most KV_THREADS_MAX (more threads than that only oversubscribe the
 * cores: libgomp overflowed its stack at 100000 and spun for minutes at 20000). */
#define KV_THREADS_MAX 1024
int kv_threads_cap(void);
/* KV_EINVAL (message names `what`, e.g. "--threads") unless 1 <= n <= kv_threads_cap(). */
kv_status kv_threads_check(long n, const char *what);
/* Parse text as a thread count under the rule (KV_EINVAL for "abc", "", "0", too many). */
kv_status kv_threads_parse(int *out, const char *text, const char *what);
/* requested > 0: checked; 0: $KVCAL_THREADS when set (checked: an invalid value is an error, never
 * ignored), else the online CPUs; negative: KV_EINVAL. */
kv_status kv_threads_resolve(int *out, long requested, const char *what);
/* Threads the numeric code uses when nobody chose: kv_threads_resolve(0); an invalid $KVCAL_THREADS
 * is logged as a warning and the online CPUs are used (tools refuse it before getting here). */
int kv_default_threads(void);

/* ---- thread pool (pool.c) ---------------------------------------------------------------------
 * A fixed set of threads that run "items" of a job: kv_pool_run(p, n, fn, ctx) calls fn(ctx, i,
 * thread) once for every i < n, spread over the pool's threads and the caller (thread 0; workers are
 * 1..n_threads-1, so `thread` indexes per-thread scratch), and returns when all n calls have
 * returned. Items are claimed from a shared counter, so nothing waits for a thread that has not
 * started (on a machine whose cores are busy, a descheduled worker simply takes no items): work
 * degrades in proportion to the load, without the barrier spinning of OpenMP (pool.c says why).
 * The order in which items run is unspecified: results must not depend on it. One caller at a
 * time per pool (kv_pool_run is not reentrant); fn must not call kv_pool_run on the same pool. */
typedef struct kv_pool kv_pool;
typedef void (*kv_pool_fn)(void *ctx, int item, int thread);
/* n_threads >= 1 (1: everything runs on the caller, no thread is started). */
kv_status kv_pool_create(kv_pool **out, int n_threads);
void kv_pool_free(kv_pool *p);
int kv_pool_threads(const kv_pool *p); /* 1 for NULL */
/* p may be NULL: everything runs on the caller. */
void kv_pool_run(kv_pool *p, int n_items, kv_pool_fn fn, void *ctx);

#ifdef __cplusplus
}
#endif
#endif /* KV_COMMON_H */
