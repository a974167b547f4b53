/* gguf_write.c — GGUF v3 writer (kv_formats.h section 2).
 *
 * Each metadata entry is serialized when it is set (key string + type + value, exactly as it will
 * appear in the file), so replacing a value, deep copies of nested arrays and the final write are
 * all plain byte copies. Output is deterministic: entries in the order they were first set, tensors
 * in the order added, data offsets packed at the alignment, every padding byte zero, and each
 * tensor's data padded to the alignment (as ggml does). Values are validated when set (ranges of
 * narrow integer types, bools 0/1, nesting depth), so whatever this writer produces the reader
 * accepts.
 */
#include "gguf_internal.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

typedef struct wbuf {
    uint8_t *p;
    size_t n;
    size_t cap;
} wbuf;

static int wbuf_reserve(wbuf *b, size_t extra) {
    if (b->cap - b->n >= extra) return 0;
    size_t need;
    if (kv_size_add(&need, b->n, extra)) return -1;
    size_t cap = b->cap ? b->cap : 64;
    while (cap < need) {
        if (cap > SIZE_MAX / 2) {
            cap = need;
            break;
        }
        cap *= 2;
    }
    uint8_t *np = realloc(b->p, cap);
    if (!np) return -1;
    b->p = np;
    b->cap = cap;
    return 0;
}

static int wbuf_put(wbuf *b, const void *src, size_t n) {
    if (n == 0) return 0;
    if (wbuf_reserve(b, n)) return -1;
    memcpy(b->p + b->n, src, n);
    b->n += n;
    return 0;
}

static int wbuf_u32(wbuf *b, uint32_t v) {
    uint8_t t[4];
    kv_store_u32le(t, v);
    return wbuf_put(b, t, 4);
}

static int wbuf_u64(wbuf *b, uint64_t v) {
    uint8_t t[8];
    kv_store_u64le(t, v);
    return wbuf_put(b, t, 8);
}

static int wbuf_str(wbuf *b, const char *s, uint64_t len) {
    if (len > SIZE_MAX) return -1;
    return wbuf_u64(b, len) || wbuf_put(b, s, (size_t)len);
}

typedef struct wkv {
    char *key;
    uint8_t *bytes; /* the whole entry as serialized */
    size_t nbytes;
} wkv;

typedef struct wtensor {
    char *name;
    int dtype;
    int n_dims;
    uint64_t ne[4];
    uint8_t *data;
    size_t nbytes;
} wtensor;

struct kv_gguf_writer {
    wkv *kvs;
    size_t n_kv, cap_kv;
    wtensor *tensors;
    size_t n_tensors, cap_tensors;
    size_t alignment;
};

kv_status kv_gguf_writer_create(kv_gguf_writer **out) {
    *out = calloc(1, sizeof **out);
    if (!*out) return KV_ERR(KV_ENOMEM, "out of memory creating a GGUF writer");
    (*out)->alignment = KV_GGUF_DEFAULT_ALIGNMENT;
    return KV_OK;
}

void kv_gguf_writer_free(kv_gguf_writer *w) {
    if (!w) return;
    for (size_t i = 0; i < w->n_kv; i++) {
        free(w->kvs[i].key);
        free(w->kvs[i].bytes);
    }
    for (size_t i = 0; i < w->n_tensors; i++) {
        free(w->tensors[i].name);
        free(w->tensors[i].data);
    }
    free(w->kvs);
    free(w->tensors);
    free(w);
}

static char *dup_cstr(const char *s) {
    const size_t n = strlen(s) + 1;
    char *d = malloc(n);
    if (d) memcpy(d, s, n);
    return d;
}

/* ---- value serialization (validates as it goes) ------------------------------------------------ */
static kv_status put_fixed(wbuf *b, const kv_gguf_value *v) {
    uint8_t t[8];
    size_t n = kv_gguf_fixed_size((int)v->type);
    const char *tn = kv_gguf_type_name((int)v->type);
    switch (v->type) {
    case KV_GGUF_UINT8:
    case KV_GGUF_UINT16:
    case KV_GGUF_UINT32:
    case KV_GGUF_BOOL: {
        const uint64_t max = v->type == KV_GGUF_BOOL ? 1 : v->type == KV_GGUF_UINT8 ? 0xff
                                                      : v->type == KV_GGUF_UINT16  ? 0xffff
                                                                                   : 0xffffffffu;
        if (v->v.u64 > max)
            return KV_ERR(KV_EINVAL, "value %llu out of range for %s", (unsigned long long)v->v.u64, tn);
        kv_store_u64le(t, v->v.u64); /* little-endian: the low n bytes are the value */
        break;
    }
    case KV_GGUF_INT8:
    case KV_GGUF_INT16:
    case KV_GGUF_INT32: {
        const int64_t lim = v->type == KV_GGUF_INT8 ? 0x80 : v->type == KV_GGUF_INT16 ? 0x8000 : 0x80000000ll;
        if (v->v.i64 < -lim || v->v.i64 >= lim)
            return KV_ERR(KV_EINVAL, "value %lld out of range for %s", (long long)v->v.i64, tn);
        kv_store_u64le(t, (uint64_t)v->v.i64);
        break;
    }
    case KV_GGUF_UINT64: kv_store_u64le(t, v->v.u64); break;
    case KV_GGUF_INT64: kv_store_u64le(t, (uint64_t)v->v.i64); break;
    case KV_GGUF_FLOAT32: kv_store_f32le(t, (float)v->v.f64); break;
    case KV_GGUF_FLOAT64: {
        union { double f; uint64_t u; } u;
        u.f = v->v.f64;
        kv_store_u64le(t, u.u);
        break;
    }
    default: return KV_ERR(KV_EINVAL, "unknown value type %d", (int)v->type);
    }
    if (wbuf_put(b, t, n)) return KV_ERR(KV_ENOMEM, "out of memory");
    return KV_OK;
}

static kv_status put_value(wbuf *b, const kv_gguf_value *v, int depth) {
    if (v->type == KV_GGUF_STRING) {
        if (!v->v.str.ptr && v->v.str.len) return KV_ERR(KV_EINVAL, "string value with NULL data");
        if (wbuf_str(b, v->v.str.ptr, v->v.str.len)) return KV_ERR(KV_ENOMEM, "out of memory");
        return KV_OK;
    }
    if (v->type != KV_GGUF_ARRAY) return put_fixed(b, v);
    const kv_gguf_type et = v->v.arr.elem_type;
    const uint64_t count = v->v.arr.count;
    if (!kv_gguf_type_valid((uint32_t)et)) return KV_ERR(KV_EINVAL, "unknown array element type %d", (int)et);
    if (wbuf_u32(b, (uint32_t)et) || wbuf_u64(b, count)) return KV_ERR(KV_ENOMEM, "out of memory");
    const size_t fixed = kv_gguf_fixed_size((int)et);
    if (fixed) {
        if (count && !v->v.arr.raw) return KV_ERR(KV_EINVAL, "array of %llu values with NULL data", (unsigned long long)count);
        size_t nbytes;
        if (count > SIZE_MAX || kv_size_mul(&nbytes, (size_t)count, fixed))
            return KV_ERR(KV_EINVAL, "array of %llu values is too large", (unsigned long long)count);
        if (et == KV_GGUF_BOOL)
            for (size_t i = 0; i < nbytes; i++)
                if (v->v.arr.raw[i] > 1) return KV_ERR(KV_EINVAL, "bool array element %zu is %u (must be 0 or 1)", i, v->v.arr.raw[i]);
        if (wbuf_put(b, v->v.arr.raw, nbytes)) return KV_ERR(KV_ENOMEM, "out of memory for an array of %zu bytes", nbytes);
        return KV_OK;
    }
    if (et == KV_GGUF_ARRAY && depth + 1 >= KV_GGUF_MAX_DEPTH)
        return KV_ERR(KV_EINVAL, "arrays nested deeper than %d levels", KV_GGUF_MAX_DEPTH);
    if (count && !v->v.arr.items) return KV_ERR(KV_EINVAL, "array of %llu %s values with NULL items",
                                                (unsigned long long)count, kv_gguf_type_name((int)et));
    for (uint64_t i = 0; i < count; i++) {
        const kv_gguf_value *it = &v->v.arr.items[i];
        if (it->type != et)
            return KV_ERR(KV_EINVAL, "array element %llu has type %s, the array holds %s", (unsigned long long)i,
                          kv_gguf_type_name((int)it->type) ? kv_gguf_type_name((int)it->type) : "?",
                          kv_gguf_type_name((int)et));
        kv_status s = put_value(b, it, depth + 1);
        if (s) return s;
    }
    return KV_OK;
}

/* Serialize key + value and store it (replacing an earlier value of the same key). */
static kv_status set_entry(kv_gguf_writer *w, const char *key, const kv_gguf_value *v) {
    if (!w || !key || !v) return KV_ERR(KV_EINVAL, "GGUF writer: NULL argument");
    if (!*key) return KV_ERR(KV_EINVAL, "GGUF writer: empty key");
    if (!kv_gguf_type_valid((uint32_t)v->type)) return KV_ERR(KV_EINVAL, "GGUF writer: key '%.200s': unknown value type %d", key, (int)v->type);
    if (strcmp(key, "general.alignment") == 0) {
        if (v->type != KV_GGUF_UINT32 || v->v.u64 == 0 || v->v.u64 > 0xffffffffu || (v->v.u64 & (v->v.u64 - 1)))
            return KV_ERR(KV_EINVAL, "GGUF writer: general.alignment must be a uint32 power of two");
    }
    wbuf b = {0};
    kv_status s = KV_OK;
    if (wbuf_str(&b, key, strlen(key)) || wbuf_u32(&b, (uint32_t)v->type)) {
        s = KV_ERR(KV_ENOMEM, "out of memory");
        goto done;
    }
    s = put_value(&b, v, 0);
    if (s) {
        kv_error_wrap(s, "GGUF writer: key '%.200s': ", key);
        goto done;
    }
    for (size_t i = 0; i < w->n_kv; i++) {
        if (strcmp(w->kvs[i].key, key) == 0) {
            free(w->kvs[i].bytes);
            w->kvs[i].bytes = b.p;
            w->kvs[i].nbytes = b.n;
            b.p = NULL;
            goto set_alignment;
        }
    }
    if (w->n_kv == w->cap_kv) {
        const size_t cap = w->cap_kv ? 2 * w->cap_kv : 16;
        wkv *nk = realloc(w->kvs, cap * sizeof *nk);
        if (!nk) {
            s = KV_ERR(KV_ENOMEM, "out of memory");
            goto done;
        }
        w->kvs = nk;
        w->cap_kv = cap;
    }
    char *kcopy = dup_cstr(key);
    if (!kcopy) {
        s = KV_ERR(KV_ENOMEM, "out of memory");
        goto done;
    }
    w->kvs[w->n_kv].key = kcopy;
    w->kvs[w->n_kv].bytes = b.p;
    w->kvs[w->n_kv].nbytes = b.n;
    w->n_kv++;
    b.p = NULL;
set_alignment:
    if (strcmp(key, "general.alignment") == 0) w->alignment = (size_t)v->v.u64;
done:
    free(b.p);
    return s;
}

kv_status kv_gguf_writer_set_value(kv_gguf_writer *w, const char *key, const kv_gguf_value *v) {
    return set_entry(w, key, v);
}

kv_status kv_gguf_writer_set_u32(kv_gguf_writer *w, const char *key, uint32_t v) {
    kv_gguf_value val = {.type = KV_GGUF_UINT32, .v.u64 = v};
    return set_entry(w, key, &val);
}

kv_status kv_gguf_writer_set_i32(kv_gguf_writer *w, const char *key, int32_t v) {
    kv_gguf_value val = {.type = KV_GGUF_INT32, .v.i64 = v};
    return set_entry(w, key, &val);
}

kv_status kv_gguf_writer_set_u64(kv_gguf_writer *w, const char *key, uint64_t v) {
    kv_gguf_value val = {.type = KV_GGUF_UINT64, .v.u64 = v};
    return set_entry(w, key, &val);
}

kv_status kv_gguf_writer_set_f32(kv_gguf_writer *w, const char *key, float v) {
    kv_gguf_value val = {.type = KV_GGUF_FLOAT32, .v.f64 = (double)v};
    return set_entry(w, key, &val);
}

kv_status kv_gguf_writer_set_bool(kv_gguf_writer *w, const char *key, int v) {
    kv_gguf_value val = {.type = KV_GGUF_BOOL, .v.u64 = v ? 1u : 0u};
    return set_entry(w, key, &val);
}

kv_status kv_gguf_writer_set_str(kv_gguf_writer *w, const char *key, const char *v) {
    if (!v) return KV_ERR(KV_EINVAL, "GGUF writer: key '%.200s': NULL string", key ? key : "(null)");
    kv_gguf_value val = {.type = KV_GGUF_STRING};
    val.v.str.ptr = v;
    val.v.str.len = strlen(v);
    return set_entry(w, key, &val);
}

kv_status kv_gguf_writer_set_array(kv_gguf_writer *w, const char *key, kv_gguf_type elem_type,
                                   const void *data, uint64_t count) {
    if (kv_gguf_fixed_size((int)elem_type) == 0)
        return KV_ERR(KV_EINVAL, "GGUF writer: key '%.200s': set_array takes fixed-size element types, not %s",
                      key ? key : "(null)", kv_gguf_type_name((int)elem_type) ? kv_gguf_type_name((int)elem_type) : "?");
    kv_gguf_value val = {.type = KV_GGUF_ARRAY};
    val.v.arr.elem_type = elem_type;
    val.v.arr.count = count;
    val.v.arr.raw = (const uint8_t *)data;
    return set_entry(w, key, &val);
}

kv_status kv_gguf_writer_set_str_array(kv_gguf_writer *w, const char *key, const char *const *strs,
                                       uint64_t count) {
    if (count && !strs) return KV_ERR(KV_EINVAL, "GGUF writer: key '%.200s': NULL string array", key ? key : "(null)");
    if (count > SIZE_MAX / sizeof(kv_gguf_value)) return KV_ERR(KV_EINVAL, "GGUF writer: string array too large");
    kv_gguf_value *items = count ? calloc((size_t)count, sizeof *items) : NULL;
    if (count && !items) return KV_ERR(KV_ENOMEM, "out of memory");
    kv_status s = KV_OK;
    for (size_t i = 0; i < (size_t)count; i++) {
        if (!strs[i]) {
            s = KV_ERR(KV_EINVAL, "GGUF writer: key '%.200s': string %zu is NULL", key ? key : "(null)", i);
            goto done;
        }
        items[i].type = KV_GGUF_STRING;
        items[i].v.str.ptr = strs[i];
        items[i].v.str.len = strlen(strs[i]);
    }
    kv_gguf_value val = {.type = KV_GGUF_ARRAY};
    val.v.arr.elem_type = KV_GGUF_STRING;
    val.v.arr.count = count;
    val.v.arr.items = items;
    s = set_entry(w, key, &val);
done:
    free(items);
    return s;
}

kv_status kv_gguf_writer_add_tensor(kv_gguf_writer *w, const char *name, int dtype, int n_dims,
                                    const uint64_t *ne, const void *data) {
    if (!w || !name || !ne) return KV_ERR(KV_EINVAL, "GGUF writer: NULL argument");
    if (!*name) return KV_ERR(KV_EINVAL, "GGUF writer: empty tensor name");
    if (n_dims < 1 || n_dims > KV_GGUF_MAX_DIMS)
        return KV_ERR(KV_EINVAL, "GGUF writer: tensor '%.200s': n_dims %d out of range (1..4)", name, n_dims);
    for (size_t i = 0; i < w->n_tensors; i++)
        if (strcmp(w->tensors[i].name, name) == 0)
            return KV_ERR(KV_EINVAL, "GGUF writer: duplicate tensor name '%.200s'", name);
    uint64_t nelem = 1;
    for (int d = 0; d < n_dims; d++) {
        if (ne[d] == 0 || ne[d] > (uint64_t)INT64_MAX / nelem)
            return KV_ERR(KV_EINVAL, "GGUF writer: tensor '%.200s': bad dimension ne[%d] = %llu", name, d,
                          (unsigned long long)ne[d]);
        nelem *= ne[d];
    }
    size_t nbytes;
    kv_status s = kv_dtype_row_bytes(&nbytes, dtype, ne[0]);
    if (s) return kv_error_wrap(KV_EINVAL, "GGUF writer: tensor '%.200s': ", name);
    for (int d = 1; d < n_dims; d++)
        if (ne[d] > SIZE_MAX || kv_size_mul(&nbytes, nbytes, (size_t)ne[d]))
            return KV_ERR(KV_EINVAL, "GGUF writer: tensor '%.200s': size overflows", name);
    if (!data) return KV_ERR(KV_EINVAL, "GGUF writer: tensor '%.200s': NULL data", name);
    if (w->n_tensors == w->cap_tensors) {
        const size_t cap = w->cap_tensors ? 2 * w->cap_tensors : 16;
        wtensor *nt = realloc(w->tensors, cap * sizeof *nt);
        if (!nt) return KV_ERR(KV_ENOMEM, "out of memory");
        w->tensors = nt;
        w->cap_tensors = cap;
    }
    wtensor *t = &w->tensors[w->n_tensors];
    memset(t, 0, sizeof *t);
    t->name = dup_cstr(name);
    t->data = malloc(nbytes ? nbytes : 1);
    if (!t->name || !t->data) {
        free(t->name);
        free(t->data);
        return KV_ERR(KV_ENOMEM, "out of memory copying tensor '%.200s' (%zu bytes)", name, nbytes);
    }
    memcpy(t->data, data, nbytes);
    t->dtype = dtype;
    t->n_dims = n_dims;
    for (int d = 0; d < KV_GGUF_MAX_DIMS; d++) t->ne[d] = d < n_dims ? ne[d] : 1;
    t->nbytes = nbytes;
    w->n_tensors++;
    return KV_OK;
}

/* ---- output ------------------------------------------------------------------------------------ */
typedef struct sink {
    wbuf *mem;
    FILE *fp;
    int failed;
} sink;

static void emit(sink *k, const void *p, size_t n) {
    if (k->failed || n == 0) return;
    if (k->mem) {
        if (wbuf_put(k->mem, p, n)) k->failed = 1;
    } else if (fwrite(p, 1, n, k->fp) != n) {
        k->failed = 1;
    }
}

static void emit_zeros(sink *k, size_t n) {
    static const uint8_t zeros[64];
    while (n) {
        const size_t m = n < sizeof zeros ? n : sizeof zeros;
        emit(k, zeros, m);
        n -= m;
    }
}

static size_t pad_to(size_t x, size_t a) { return (a - x % a) % a; }

/* Writes the whole file; returns its size. Offsets cannot overflow: every tensor's bytes are held
 * in memory, so their sum (plus at most one alignment of padding each) fits the address space. */
static size_t serialize(const kv_gguf_writer *w, sink *k) {
    const size_t a = w->alignment;
    uint8_t hdr[KV_GGUF_HEADER_BYTES];
    kv_store_u32le(hdr, KV_GGUF_MAGIC);
    kv_store_u32le(hdr + 4, 3);
    kv_store_u64le(hdr + 8, (uint64_t)w->n_tensors);
    kv_store_u64le(hdr + 16, (uint64_t)w->n_kv);
    emit(k, hdr, sizeof hdr);
    size_t pos = sizeof hdr;
    for (size_t i = 0; i < w->n_kv; i++) {
        emit(k, w->kvs[i].bytes, w->kvs[i].nbytes);
        pos += w->kvs[i].nbytes;
    }
    size_t off = 0;
    for (size_t i = 0; i < w->n_tensors; i++) {
        const wtensor *t = &w->tensors[i];
        uint8_t b[8];
        const size_t nl = strlen(t->name);
        kv_store_u64le(b, nl);
        emit(k, b, 8);
        emit(k, t->name, nl);
        kv_store_u32le(b, (uint32_t)t->n_dims);
        emit(k, b, 4);
        for (int d = 0; d < t->n_dims; d++) {
            kv_store_u64le(b, t->ne[d]);
            emit(k, b, 8);
        }
        kv_store_u32le(b, (uint32_t)t->dtype);
        emit(k, b, 4);
        kv_store_u64le(b, off);
        emit(k, b, 8);
        pos += 8 + nl + 4 + 8 * (size_t)t->n_dims + 4 + 8;
        off += t->nbytes + pad_to(t->nbytes, a);
    }
    const size_t pad = pad_to(pos, a);
    emit_zeros(k, pad);
    pos += pad;
    for (size_t i = 0; i < w->n_tensors; i++) {
        const wtensor *t = &w->tensors[i];
        emit(k, t->data, t->nbytes);
        emit_zeros(k, pad_to(t->nbytes, a));
        pos += t->nbytes + pad_to(t->nbytes, a);
    }
    return pos;
}

kv_status kv_gguf_writer_to_memory(kv_gguf_writer *w, uint8_t **out, size_t *size) {
    *out = NULL;
    *size = 0;
    if (!w) return KV_ERR(KV_EINVAL, "GGUF writer: NULL writer");
    wbuf b = {0};
    sink k = {&b, NULL, 0};
    const size_t n = serialize(w, &k);
    if (k.failed) {
        free(b.p);
        return KV_ERR(KV_ENOMEM, "out of memory serializing a GGUF file of %zu bytes", n);
    }
    if (!b.p) { /* cannot happen (the header is always written), but keep the contract */
        b.p = malloc(1);
        if (!b.p) return KV_ERR(KV_ENOMEM, "out of memory");
    }
    *out = b.p;
    *size = b.n;
    return KV_OK;
}

kv_status kv_gguf_writer_write(kv_gguf_writer *w, const char *path) {
    if (!w || !path) return KV_ERR(KV_EINVAL, "GGUF writer: NULL argument");
    kv_atomic_file af;
    kv_status s = kv_atomic_open(&af, path);
    if (s) return s;
    sink k = {NULL, af.fp, 0};
    (void)serialize(w, &k);
    if (k.failed) {
        const int e = errno;
        kv_atomic_abort(&af);
        return KV_ERR(KV_EIO, "cannot write GGUF file '%s': %s", path, strerror(e));
    }
    return kv_atomic_commit(&af);
}
