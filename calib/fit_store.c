/* kvcal fit's per-token state, one shard at a time (fit_internal.h, calib/FIT.md §5).
 *
 * The state of a calibration run is, per sequence, the hidden states entering the next layer (H),
 * this layer's captured and then reconstructed keys and values (K, V) and the previous layer's
 * reconstructions (KP, VP). A rank holds the shards it owns. Every pass of the fit walks its shards
 * one at a time through kv_fit_store_get / kv_fit_store_put, so where the state lives is decided
 * here only:
 *   - in memory (the default): five arrays over the rank's sequences; get returns a pointer into
 *     them and put does nothing;
 *   - hidden states in f16 (memory.hidden_dtype): H is an array of halves; get widens one shard
 *     into a scratch buffer, put rounds it back (a value beyond the f16 range is an error);
 *   - spilled (memory.spill_dir): every shard of every role is a file, in a directory of this process's
 *     own made inside memory.spill_dir with a unique name (runs and ranks sharing the spill directory
 *     never touch each other's files; each removes only its own, and memory.spill_dir itself only when
 *     it made it and it is left empty); get reads one shard into a scratch buffer per role, put writes
 *     it back. Memory: one shard per role.
 * The K/V roles name storage slots that swap at the end of a layer (this layer's reconstructions
 * become the next layer's inputs) without copying. */
#define _POSIX_C_SOURCE 200809L
#define _DEFAULT_SOURCE /* mkdtemp */
#include "fit_internal.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

enum { SLOT_H = KV_FIT_ROLES - 1 }; /* H's slot; the K/V roles use slots 0..3 */

static int is_h(const kv_fit_store *st, int role) { return st->slot[role] == SLOT_H; }

static char *slot_path(const kv_fit_store *st, int slot, int64_t shard) {
    const size_t n = strlen(st->dir) + 64;
    char *p = malloc(n);
    if (p) snprintf(p, n, "%s/%s.%lld.bin", st->dir, slot == SLOT_H ? "hidden" : slot == 0 ? "kv0" : slot == 1 ? "kv1" : slot == 2 ? "kv2" : "kv3",
                    (long long)shard);
    return p;
}

static kv_status alloc_bytes(void **p, size_t n, size_t size, const char *what, uint64_t *total) {
    size_t bytes;
    if (kv_size_mul(&bytes, n, size) != 0) return KV_ERR(KV_EINVAL, "%s: size overflow", what);
    *p = kv_aligned_alloc(64, bytes ? bytes : 1);
    if (!*p) return KV_ERR(KV_ENOMEM, "out of memory for %s (%.1f MiB)", what, (double)bytes / 1048576.0);
    *total += bytes;
    return KV_OK;
}

kv_status kv_fit_store_init(kv_fit_store *st, const char *spill_dir, int h_f16, int64_t n_local, const int64_t *shard_ids,
                            const int64_t *shard_nseq, int shard_seqs, size_t h_per_seq, size_t kv_per_seq) {
    memset(st, 0, sizeof *st);
    st->spill = spill_dir && *spill_dir;
    st->h_f16 = h_f16;
    st->n_local = n_local;
    st->shard_ids = shard_ids;
    st->shard_nseq = shard_nseq;
    st->shard_seqs = shard_seqs;
    for (int role = 0; role < KV_FIT_ROLES; role++) {
        st->slot[role] = role == KV_FIT_H ? SLOT_H : role - 1; /* K 0, V 1, KP 2, VP 3 */
        st->per_seq[role] = role == KV_FIT_H ? h_per_seq : kv_per_seq;
    }
    int64_t local_seqs = 0;
    for (int64_t j = 0; j < n_local; j++) local_seqs += shard_nseq[j];
    kv_status s = KV_OK;
    static const char *const what[KV_FIT_ROLES] = {"the hidden states", "keys", "values", "previous keys",
                                                   "previous values"};
    if (st->spill) {
        /* this process's own directory inside memory.spill_dir (mkdtemp: a unique name), so that runs
         * (and ranks) sharing the spill directory never touch each other's files */
        const size_t n = strlen(spill_dir) + 32;
        struct stat sb;
        st->top = malloc(strlen(spill_dir) + 1);
        st->dir = malloc(n);
        if (!st->dir || !st->top) {
            s = KV_ERR(KV_ENOMEM, "out of memory");
            goto done;
        }
        strcpy(st->top, spill_dir);
        st->dir[0] = '\0'; /* "" until mkdtemp made it: kv_fit_store_free removes nothing before */
        st->made_top = stat(spill_dir, &sb) != 0;
        if (kv_mkdir_p(spill_dir) != 0) {
            s = KV_ERR(KV_EIO, "creating the spill directory '%s' (memory.spill_dir): %s", spill_dir, strerror(errno));
            goto done;
        }
        snprintf(st->dir, n, "%s/kvcal-fit-XXXXXX", spill_dir);
        if (!mkdtemp(st->dir)) {
            s = KV_ERR(KV_EIO, "creating a directory in the spill directory '%s' (memory.spill_dir): %s", spill_dir,
                       strerror(errno));
            free(st->dir);
            st->dir = NULL;
            goto done;
        }
        for (int role = 0; role < KV_FIT_ROLES && s == KV_OK; role++)
            s = alloc_bytes((void **)&st->scratch[role], (size_t)shard_seqs * st->per_seq[role], sizeof(float),
                            what[role], &st->bytes);
        if (s == KV_OK && h_f16)
            s = alloc_bytes((void **)&st->h16, (size_t)shard_seqs * h_per_seq, sizeof(uint16_t), "the hidden states",
                            &st->bytes);
    } else {
        for (int role = 0; role < KV_FIT_ROLES && s == KV_OK; role++) {
            const int half = role == KV_FIT_H && h_f16;
            s = alloc_bytes(&st->mem[st->slot[role]], (size_t)local_seqs * st->per_seq[role],
                            half ? sizeof(uint16_t) : sizeof(float), what[role], &st->bytes);
        }
        if (s == KV_OK && h_f16)
            s = alloc_bytes((void **)&st->scratch[KV_FIT_H], (size_t)shard_seqs * h_per_seq, sizeof(float),
                            "the hidden states of a shard", &st->bytes);
    }
done:
    if (s != KV_OK) kv_fit_store_free(st);
    return s;
}

void kv_fit_store_free(kv_fit_store *st) {
    if (!st) return;
    if (st->spill && st->dir && st->dir[0]) {
        for (int64_t j = 0; j < st->n_local; j++)
            for (int slot = 0; slot < KV_FIT_ROLES; slot++) {
                char *p = slot_path(st, slot, st->shard_ids[j]);
                if (p) unlink(p);
                free(p);
            }
        rmdir(st->dir);
        if (st->made_top) rmdir(st->top); /* only when we made it and it is empty (other runs or ranks) */
    }
    for (int i = 0; i < KV_FIT_ROLES; i++) {
        kv_aligned_free(st->mem[i]);
        kv_aligned_free(st->scratch[i]);
    }
    kv_aligned_free(st->h16);
    free(st->dir);
    free(st->top);
    memset(st, 0, sizeof *st);
}

static size_t shard_values(const kv_fit_store *st, int role, int64_t j) {
    return (size_t)st->shard_nseq[j] * st->per_seq[role];
}

/* Offset of local shard j in the in-memory arrays: every shard but the last global one is full,
 * and that one is the last of its rank's. */
static size_t shard_offset(const kv_fit_store *st, int role, int64_t j) {
    return (size_t)j * (size_t)st->shard_seqs * st->per_seq[role];
}

kv_status kv_fit_store_get(kv_fit_store *st, int role, int64_t j, int read, float **out) {
    *out = NULL;
    if (role < 0 || role >= KV_FIT_ROLES || j < 0 || j >= st->n_local)
        return KV_ERR(KV_EINVAL, "fit store: no role %d / shard %lld", role, (long long)j);
    const size_t n = shard_values(st, role, j);
    const int slot = st->slot[role];
    if (!st->spill) {
        if (!(is_h(st, role) && st->h_f16)) {
            *out = (float *)st->mem[slot] + shard_offset(st, role, j);
            return KV_OK;
        }
        float *dst = st->scratch[role];
        if (read) {
            const uint16_t *src = (const uint16_t *)st->mem[slot] + shard_offset(st, role, j);
            for (size_t i = 0; i < n; i++) dst[i] = kv_f16_to_f32(src[i]);
        }
        *out = dst;
        return KV_OK;
    }
    float *dst = st->scratch[role];
    if (read) {
        char *path = slot_path(st, slot, st->shard_ids[j]);
        if (!path) return KV_ERR(KV_ENOMEM, "out of memory");
        FILE *fp = fopen(path, "rb");
        kv_status s = KV_OK;
        const int half = is_h(st, role) && st->h_f16;
        const size_t size = half ? sizeof(uint16_t) : sizeof(float);
        if (!fp || fread(half ? (void *)st->h16 : (void *)dst, size, n, fp) != n)
            s = KV_ERR(KV_EIO, "reading spill file '%s': %s", path, fp && !ferror(fp) ? "truncated" : strerror(errno));
        if (fp) fclose(fp);
        free(path);
        if (s != KV_OK) return s;
        if (half)
            for (size_t i = 0; i < n; i++) dst[i] = kv_f16_to_f32(st->h16[i]);
    }
    *out = dst;
    return KV_OK;
}

/* f32 -> f16 with a range check: the hidden states must fit in f16 (max 65504). */
static kv_status to_half(uint16_t *dst, const float *src, size_t n) {
    for (size_t i = 0; i < n; i++) {
        dst[i] = kv_f32_to_f16(src[i]);
        if ((dst[i] & 0x7c00u) == 0x7c00u)
            return KV_ERR(KV_ENUMERIC, "a hidden state (%g) is outside the range of f16 (memory.hidden_dtype: f16); "
                          "use memory.hidden_dtype: f32", (double)src[i]);
    }
    return KV_OK;
}

kv_status kv_fit_store_put(kv_fit_store *st, int role, int64_t j) {
    if (role < 0 || role >= KV_FIT_ROLES || j < 0 || j >= st->n_local)
        return KV_ERR(KV_EINVAL, "fit store: no role %d / shard %lld", role, (long long)j);
    const size_t n = shard_values(st, role, j);
    const int slot = st->slot[role];
    const int half = is_h(st, role) && st->h_f16;
    if (!st->spill) {
        if (!half) return KV_OK;
        return to_half((uint16_t *)st->mem[slot] + shard_offset(st, role, j), st->scratch[role], n);
    }
    kv_status s = KV_OK;
    if (half && (s = to_half(st->h16, st->scratch[role], n)) != KV_OK) return s;
    char *path = slot_path(st, slot, st->shard_ids[j]);
    if (!path) return KV_ERR(KV_ENOMEM, "out of memory");
    FILE *fp = fopen(path, "wb");
    const size_t size = half ? sizeof(uint16_t) : sizeof(float);
    const void *src = half ? (const void *)st->h16 : (const void *)st->scratch[role];
    int ok = fp && fwrite(src, size, n, fp) == n;
    if (fp && fclose(fp) != 0) ok = 0;
    if (!ok) s = KV_ERR(KV_EIO, "writing spill file '%s': %s", path, strerror(errno));
    free(path);
    return s;
}

void kv_fit_store_swap(kv_fit_store *st) {
    int t = st->slot[KV_FIT_K];
    st->slot[KV_FIT_K] = st->slot[KV_FIT_KP];
    st->slot[KV_FIT_KP] = t;
    t = st->slot[KV_FIT_V];
    st->slot[KV_FIT_V] = st->slot[KV_FIT_VP];
    st->slot[KV_FIT_VP] = t;
}
