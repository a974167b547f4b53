/* gguf_read.c — GGUF v2/v3 reader (kv_formats.h section 2).
 *
 * The whole file is mapped (or borrowed from memory) and parsed in one pass with a bounds-checked
 * cursor. Every count is checked against the bytes left in the file before anything is allocated
 * for it (each element of a count needs a known minimum number of bytes), so a hostile count fails
 * fast with KV_EFORMAT; recursion into nested arrays is bounded by KV_GGUF_MAX_DEPTH. Strings and
 * fixed-size arrays point into the file; keys and tensor names are NUL-terminated copies. All
 * reader-owned memory comes from one arena freed by kv_gguf_close. Keys and tensor names are
 * indexed by hash tables (duplicates are rejected while they are built).
 *
 * Errors name the field and, when the file was opened from a path, the path:
 *   GGUF 'model.gguf': tensor 3 ('blk.0.attn_q.weight'): n_dims 7 out of range (1..4)
 */
#include "gguf_internal.h"

#include <stdlib.h>
#include <string.h>

/* ---- arena ------------------------------------------------------------------------------------ */
typedef struct arena_chunk {
    struct arena_chunk *next;
    size_t cap;
    size_t used;
    _Alignas(16) unsigned char mem[];
} arena_chunk;

typedef struct arena {
    arena_chunk *head;
} arena;

static void *arena_alloc(arena *a, size_t n) {
    n = (n + 15u) & ~(size_t)15u;
    if (n == 0) n = 16;
    arena_chunk *c = a->head;
    if (!c || c->cap - c->used < n) {
        const size_t want = n > (size_t)1 << 16 ? n : (size_t)1 << 16;
        if (want > SIZE_MAX - sizeof(arena_chunk)) return NULL;
        arena_chunk *nc = malloc(sizeof(arena_chunk) + want);
        if (!nc) return NULL;
        nc->cap = want;
        nc->used = 0;
        if (c && n > ((size_t)1 << 16)) { /* a big dedicated chunk goes behind the current one */
            nc->next = c->next;
            c->next = nc;
        } else {
            nc->next = c;
            a->head = nc;
        }
        c = nc;
    }
    void *p = c->mem + c->used;
    c->used += n;
    return p;
}

static void arena_free(arena *a) {
    arena_chunk *c = a->head;
    while (c) {
        arena_chunk *next = c->next;
        free(c);
        c = next;
    }
    a->head = NULL;
}

/* ---- string hash index ------------------------------------------------------------------------- */
typedef struct str_index {
    size_t *slots; /* index + 1, 0 = empty */
    size_t mask;
} str_index;

static uint64_t hash_str(const char *s) {
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++) h = (h ^ (uint8_t)*s) * 1099511628211ull;
    return h;
}

static int index_init(str_index *ix, arena *a, size_t n) {
    size_t cap = 16;
    while (cap < 2 * n) cap <<= 1; /* n is bounded by the file size, so this cannot overflow */
    ix->slots = arena_alloc(a, cap * sizeof(size_t));
    if (!ix->slots) return -1;
    memset(ix->slots, 0, cap * sizeof(size_t));
    ix->mask = cap - 1;
    return 0;
}

/* Insert name (the i-th item); returns -1 and sets *dup to the earlier index if already present. */
static int index_insert(str_index *ix, const char *name, size_t i, const char *const *names,
                        size_t stride, size_t *dup) {
    size_t h = (size_t)hash_str(name) & ix->mask;
    for (;;) {
        const size_t s = ix->slots[h];
        if (s == 0) {
            ix->slots[h] = i + 1;
            return 0;
        }
        const char *other = *(const char *const *)((const char *)names + (s - 1) * stride);
        if (strcmp(other, name) == 0) {
            *dup = s - 1;
            return -1;
        }
        h = (h + 1) & ix->mask;
    }
}

static size_t index_find(const str_index *ix, const char *name, const char *const *names, size_t stride) {
    if (!ix->slots) return SIZE_MAX;
    size_t h = (size_t)hash_str(name) & ix->mask;
    for (;;) {
        const size_t s = ix->slots[h];
        if (s == 0) return SIZE_MAX;
        const char *other = *(const char *const *)((const char *)names + (s - 1) * stride);
        if (strcmp(other, name) == 0) return s - 1;
        h = (h + 1) & ix->mask;
    }
}

/* ---- the reader ---------------------------------------------------------------------------------- */
struct kv_gguf {
    kv_file_map map;
    const uint8_t *base;
    size_t size;
    uint32_t version;
    size_t alignment;
    size_t data_offset;
    size_t n_kv;
    kv_gguf_kv *kvs;
    size_t n_tensors;
    kv_tensor_info *tensors;
    str_index kv_ix;
    str_index tensor_ix;
    arena arena;
};

typedef struct cursor {
    const uint8_t *p;
    size_t size;
    size_t pos;
    arena *arena;
} cursor;

static size_t remaining(const cursor *c) { return c->size - c->pos; }

static kv_status need(const cursor *c, size_t n, const char *what) {
    if (remaining(c) < n)
        return KV_ERR(KV_EFORMAT, "%s at offset %zu needs %zu bytes but the file ends at %zu", what,
                      c->pos, n, c->size);
    return KV_OK;
}

static kv_status rd_u32(cursor *c, uint32_t *out, const char *what) {
    kv_status s = need(c, 4, what);
    if (s) return s;
    *out = kv_load_u32le(c->p + c->pos);
    c->pos += 4;
    return KV_OK;
}

static kv_status rd_u64(cursor *c, uint64_t *out, const char *what) {
    kv_status s = need(c, 8, what);
    if (s) return s;
    *out = kv_load_u64le(c->p + c->pos);
    c->pos += 8;
    return KV_OK;
}

/* A GGUF string: u64 length + bytes. On success *ptr points into the file. */
static kv_status rd_string(cursor *c, const char **ptr, uint64_t *len, const char *what) {
    const size_t at = c->pos;
    uint64_t n;
    kv_status s = rd_u64(c, &n, what);
    if (s) return s;
    if (n > remaining(c))
        return KV_ERR(KV_EFORMAT, "%s length %llu at offset %zu runs past the end of the file (%zu bytes)",
                      what, (unsigned long long)n, at, c->size);
    *ptr = (const char *)(c->p + c->pos);
    *len = n;
    c->pos += (size_t)n;
    return KV_OK;
}

/* A key or tensor name: non-empty, no NUL, copied NUL-terminated into the arena. */
static kv_status rd_name(cursor *c, const char **out, const char *what) {
    const char *p;
    uint64_t n;
    kv_status s = rd_string(c, &p, &n, what);
    if (s) return s;
    if (n == 0) return KV_ERR(KV_EFORMAT, "%s at offset %zu is empty", what, c->pos - 8);
    if (memchr(p, 0, (size_t)n))
        return KV_ERR(KV_EFORMAT, "%s at offset %zu contains a NUL byte", what, c->pos - (size_t)n - 8);
    char *copy = arena_alloc(c->arena, (size_t)n + 1);
    if (!copy) return KV_ERR(KV_ENOMEM, "out of memory copying a %s of %llu bytes", what, (unsigned long long)n);
    memcpy(copy, p, (size_t)n);
    copy[n] = '\0';
    *out = copy;
    return KV_OK;
}

const char *kv_gguf_type_name(int type) {
    switch (type) {
    case KV_GGUF_UINT8: return "uint8";
    case KV_GGUF_INT8: return "int8";
    case KV_GGUF_UINT16: return "uint16";
    case KV_GGUF_INT16: return "int16";
    case KV_GGUF_UINT32: return "uint32";
    case KV_GGUF_INT32: return "int32";
    case KV_GGUF_FLOAT32: return "float32";
    case KV_GGUF_BOOL: return "bool";
    case KV_GGUF_STRING: return "string";
    case KV_GGUF_ARRAY: return "array";
    case KV_GGUF_UINT64: return "uint64";
    case KV_GGUF_INT64: return "int64";
    case KV_GGUF_FLOAT64: return "float64";
    }
    return NULL;
}

/* Decode one fixed-size scalar at p into v (type already set). */
static void decode_fixed(kv_gguf_value *v, const uint8_t *p) {
    switch (v->type) {
    case KV_GGUF_UINT8: v->v.u64 = p[0]; break;
    case KV_GGUF_BOOL: v->v.u64 = p[0]; break;
    case KV_GGUF_INT8: v->v.i64 = (int8_t)p[0]; break;
    case KV_GGUF_UINT16: v->v.u64 = kv_load_u16le(p); break;
    case KV_GGUF_INT16: v->v.i64 = (int16_t)kv_load_u16le(p); break;
    case KV_GGUF_UINT32: v->v.u64 = kv_load_u32le(p); break;
    case KV_GGUF_INT32: v->v.i64 = (int32_t)kv_load_u32le(p); break;
    case KV_GGUF_FLOAT32: v->v.f64 = (double)kv_load_f32le(p); break;
    case KV_GGUF_UINT64: v->v.u64 = kv_load_u64le(p); break;
    case KV_GGUF_INT64: v->v.i64 = (int64_t)kv_load_u64le(p); break;
    case KV_GGUF_FLOAT64: {
        union { uint64_t u; double f; } u;
        u.u = kv_load_u64le(p);
        v->v.f64 = u.f;
        break;
    }
    default: break;
    }
}

static kv_status rd_value(cursor *c, kv_gguf_value *v, uint32_t type, int depth);

static kv_status rd_array(cursor *c, kv_gguf_value *v, int depth) {
    uint32_t et;
    uint64_t count;
    kv_status s = rd_u32(c, &et, "array element type");
    if (s) return s;
    if (!kv_gguf_type_valid(et))
        return KV_ERR(KV_EFORMAT, "unknown array element type %u at offset %zu", et, c->pos - 4);
    s = rd_u64(c, &count, "array count");
    if (s) return s;
    v->v.arr.elem_type = (kv_gguf_type)et;
    v->v.arr.count = count;
    v->v.arr.raw = c->p + c->pos;
    v->v.arr.items = NULL;
    const size_t fixed = kv_gguf_fixed_size((int)et);
    if (fixed) {
        if (count > remaining(c) / fixed)
            return KV_ERR(KV_EFORMAT,
                          "array of %llu %s values at offset %zu runs past the end of the file (%zu bytes)",
                          (unsigned long long)count, kv_gguf_type_name((int)et), c->pos - 12, c->size);
        const size_t nbytes = (size_t)count * fixed;
        if (et == KV_GGUF_BOOL) {
            for (size_t i = 0; i < nbytes; i++)
                if (c->p[c->pos + i] > 1)
                    return KV_ERR(KV_EFORMAT, "bool array element %zu has value %u (must be 0 or 1)", i,
                                  c->p[c->pos + i]);
        }
        c->pos += nbytes;
        return KV_OK;
    }
    /* Strings need at least 8 bytes each, arrays 12: bound the count before allocating items. */
    const size_t min_elem = et == KV_GGUF_STRING ? 8 : 12;
    if (count > remaining(c) / min_elem)
        return KV_ERR(KV_EFORMAT,
                      "array count %llu of %s elements at offset %zu is more than the %zu bytes left can hold",
                      (unsigned long long)count, kv_gguf_type_name((int)et), c->pos - 8, remaining(c));
    if (et == KV_GGUF_ARRAY && depth + 1 >= KV_GGUF_MAX_DEPTH)
        return KV_ERR(KV_EFORMAT, "arrays nested deeper than %d levels at offset %zu", KV_GGUF_MAX_DEPTH,
                      c->pos);
    if (count == 0) return KV_OK;
    kv_gguf_value *items = arena_alloc(c->arena, (size_t)count * sizeof(kv_gguf_value));
    if (!items) return KV_ERR(KV_ENOMEM, "out of memory for an array of %llu values", (unsigned long long)count);
    v->v.arr.items = items;
    for (size_t i = 0; i < (size_t)count; i++) {
        s = rd_value(c, &items[i], et, depth + 1);
        if (s) return kv_error_wrap(s, "array element %zu of %llu: ", i, (unsigned long long)count);
    }
    return KV_OK;
}

static kv_status rd_value(cursor *c, kv_gguf_value *v, uint32_t type, int depth) {
    memset(v, 0, sizeof *v);
    v->type = (kv_gguf_type)type;
    if (type == KV_GGUF_STRING) return rd_string(c, &v->v.str.ptr, &v->v.str.len, "string value");
    if (type == KV_GGUF_ARRAY) return rd_array(c, v, depth);
    const size_t n = kv_gguf_fixed_size((int)type);
    if (n == 0) return KV_ERR(KV_EFORMAT, "unknown value type %u", type);
    kv_status s = need(c, n, kv_gguf_type_name((int)type));
    if (s) return s;
    if (type == KV_GGUF_BOOL && c->p[c->pos] > 1)
        return KV_ERR(KV_EFORMAT, "bool value %u at offset %zu (must be 0 or 1)", c->p[c->pos], c->pos);
    decode_fixed(v, c->p + c->pos);
    c->pos += n;
    return KV_OK;
}

static const char *printable_magic(char out[5], const uint8_t *p) {
    for (int i = 0; i < 4; i++) out[i] = (p[i] >= 0x20 && p[i] < 0x7f) ? (char)p[i] : '.';
    out[4] = '\0';
    return out;
}

static kv_status parse_header(kv_gguf *g, cursor *c, uint64_t *n_tensors, uint64_t *n_kv) {
    if (c->size < 4)
        return KV_ERR(KV_EFORMAT, "truncated header: the file has %zu bytes, a GGUF header needs %u",
                      c->size, KV_GGUF_HEADER_BYTES);
    const uint32_t magic = kv_load_u32le(c->p);
    if (magic != KV_GGUF_MAGIC) {
        char m[5];
        return KV_ERR(KV_EFORMAT, "bad magic %02x %02x %02x %02x ('%s'), expected 'GGUF'", c->p[0], c->p[1],
                      c->p[2], c->p[3], printable_magic(m, c->p));
    }
    if (c->size < KV_GGUF_HEADER_BYTES)
        return KV_ERR(KV_EFORMAT, "truncated header: the file has %zu bytes, a GGUF header needs %u",
                      c->size, KV_GGUF_HEADER_BYTES);
    c->pos = 4;
    uint32_t version;
    (void)rd_u32(c, &version, "version");
    const uint32_t swapped = ((version & 0xffu) << 24) | ((version & 0xff00u) << 8) |
                             ((version >> 8) & 0xff00u) | (version >> 24);
    if (version > 3 && swapped >= 1 && swapped <= 3)
        return KV_ERR(KV_EUNSUPPORTED,
                      "big-endian GGUF file (version field reads 0x%08x); only little-endian files are supported",
                      version);
    if (version < 2)
        return KV_ERR(KV_EVERSION, "GGUF version %u is not supported (this reader reads versions 2 and 3)",
                      version);
    if (version > 3)
        return KV_ERR(KV_EVERSION,
                      "GGUF version %u is a future version (this reader reads versions 2 and 3)", version);
    g->version = version;
    (void)rd_u64(c, n_tensors, "tensor_count");
    (void)rd_u64(c, n_kv, "kv_count");
    /* Minimum bytes per entry: a kv is a key length (8) + type (4) + at least 1 byte of value;
     * a tensor info is a name length (8) + n_dims (4) + one dim (8) + type (4) + offset (8). */
    const size_t left = remaining(c);
    if (*n_kv > left / 13)
        return KV_ERR(KV_EFORMAT, "kv_count %llu is more than a file of %zu bytes can hold",
                      (unsigned long long)*n_kv, c->size);
    if (*n_tensors > left / 32)
        return KV_ERR(KV_EFORMAT, "tensor_count %llu is more than a file of %zu bytes can hold",
                      (unsigned long long)*n_tensors, c->size);
    if (*n_kv * 13 + *n_tensors * 32 > left)
        return KV_ERR(KV_EFORMAT,
                      "kv_count %llu and tensor_count %llu are more than a file of %zu bytes can hold",
                      (unsigned long long)*n_kv, (unsigned long long)*n_tensors, c->size);
    return KV_OK;
}

static kv_status parse_kvs(kv_gguf *g, cursor *c) {
    for (size_t i = 0; i < g->n_kv; i++) {
        kv_gguf_kv *kv = &g->kvs[i];
        kv_status s = rd_name(c, &kv->key, "key");
        if (s) return kv_error_wrap(s, "kv %zu: ", i);
        size_t dup;
        if (index_insert(&g->kv_ix, kv->key, i, (const char *const *)&g->kvs[0].key, sizeof(kv_gguf_kv), &dup))
            return KV_ERR(KV_EFORMAT, "duplicate key '%.200s' (kv %zu and kv %zu)", kv->key, dup, i);
        uint32_t type;
        s = rd_u32(c, &type, "value type");
        if (s == KV_OK && !kv_gguf_type_valid(type))
            s = KV_ERR(KV_EFORMAT, "unknown value type %u at offset %zu", type, c->pos - 4);
        if (s == KV_OK) s = rd_value(c, &kv->value, type, 0);
        if (s) return kv_error_wrap(s, "kv %zu ('%.200s'): ", i, kv->key);
    }
    return KV_OK;
}

static kv_status parse_alignment(kv_gguf *g) {
    g->alignment = KV_GGUF_DEFAULT_ALIGNMENT;
    const kv_gguf_value *v = kv_gguf_find(g, "general.alignment");
    if (!v) return KV_OK;
    if (v->type != KV_GGUF_UINT32)
        return KV_ERR(KV_EFORMAT, "general.alignment has type %s, expected uint32", kv_gguf_type_name((int)v->type));
    const uint64_t a = v->v.u64;
    if (a == 0 || (a & (a - 1)) != 0)
        return KV_ERR(KV_EFORMAT, "general.alignment = %llu is not a power of two", (unsigned long long)a);
    g->alignment = (size_t)a;
    return KV_OK;
}

static kv_status parse_tensor_info(kv_gguf *g, cursor *c, size_t i) {
    kv_tensor_info *t = &g->tensors[i];
    kv_status s = rd_name(c, &t->name, "tensor name");
    if (s) return s;
    size_t dup;
    if (index_insert(&g->tensor_ix, t->name, i, (const char *const *)&g->tensors[0].name, sizeof(kv_tensor_info),
                     &dup))
        return KV_ERR(KV_EFORMAT, "duplicate tensor name (also tensor %zu)", dup);
    uint32_t n_dims;
    s = rd_u32(c, &n_dims, "n_dims");
    if (s) return s;
    if (n_dims < 1 || n_dims > KV_GGUF_MAX_DIMS)
        return KV_ERR(KV_EFORMAT, "n_dims %u out of range (1..%d)", n_dims, KV_GGUF_MAX_DIMS);
    t->n_dims = (int)n_dims;
    uint64_t nelem = 1;
    for (int d = 0; d < KV_GGUF_MAX_DIMS; d++) {
        t->ne[d] = 1;
        if (d >= (int)n_dims) continue;
        s = rd_u64(c, &t->ne[d], "dimension");
        if (s) return s;
        if (t->ne[d] == 0) return KV_ERR(KV_EFORMAT, "dimension ne[%d] is 0", d);
        if (t->ne[d] > (uint64_t)INT64_MAX / nelem)
            return KV_ERR(KV_EFORMAT, "element count overflows at dimension ne[%d] = %llu", d,
                          (unsigned long long)t->ne[d]);
        nelem *= t->ne[d];
    }
    uint32_t type;
    s = rd_u32(c, &type, "tensor type");
    if (s) return s;
    if (kv_dtype_block_bytes((int)type) == 0)
        return KV_ERR(KV_EUNSUPPORTED, "unknown tensor type %u", type);
    t->dtype = (int)type;
    size_t row;
    s = kv_dtype_row_bytes(&row, t->dtype, t->ne[0]);
    if (s)
        return KV_ERR(KV_EFORMAT, "row length ne[0] = %llu is not a multiple of the %s block size %zu",
                      (unsigned long long)t->ne[0], kv_dtype_name(t->dtype), kv_dtype_block_elems(t->dtype));
    size_t nbytes = row;
    for (int d = 1; d < KV_GGUF_MAX_DIMS; d++) {
        if (t->ne[d] > SIZE_MAX || kv_size_mul(&nbytes, nbytes, (size_t)t->ne[d]))
            return KV_ERR(KV_EFORMAT, "data size overflows");
    }
    t->nbytes = nbytes;
    return rd_u64(c, &t->offset, "tensor data offset");
}

static kv_status locate_tensor_data(kv_gguf *g, const cursor *c) {
    const size_t a = g->alignment;
    const size_t end_of_infos = c->pos;
    if (end_of_infos > SIZE_MAX - (a - 1))
        return KV_ERR(KV_EFORMAT, "data section offset overflows (alignment %zu)", a);
    g->data_offset = (end_of_infos + a - 1) & ~(a - 1);
    if (g->n_tensors == 0) return KV_OK;
    if (g->data_offset > c->size)
        return KV_ERR(KV_EFORMAT,
                      "data section would start at %zu (tensor infos end at %zu, alignment %zu), past the end "
                      "of the file (%zu bytes)",
                      g->data_offset, end_of_infos, a, c->size);
    const size_t data_size = c->size - g->data_offset;
    for (size_t i = 0; i < g->n_tensors; i++) {
        kv_tensor_info *t = &g->tensors[i];
        if (t->offset % a != 0)
            return KV_ERR(KV_EFORMAT, "tensor %zu ('%.200s'): data offset %llu is not a multiple of the alignment %zu",
                          i, t->name, (unsigned long long)t->offset, a);
        if (t->offset > data_size || t->nbytes > data_size - (size_t)t->offset)
            return KV_ERR(KV_EFORMAT,
                          "tensor %zu ('%.200s'): data [%llu, +%zu) extends past the end of the file (the data "
                          "section has %zu bytes, file %zu)",
                          i, t->name, (unsigned long long)t->offset, t->nbytes, data_size, c->size);
        t->data = c->p + g->data_offset + (size_t)t->offset;
    }
    return KV_OK;
}

static kv_status parse(kv_gguf *g) {
    cursor c = {g->base, g->size, 0, &g->arena};
    uint64_t n_tensors, n_kv;
    kv_status s = parse_header(g, &c, &n_tensors, &n_kv);
    if (s) return s;
    g->n_kv = (size_t)n_kv;
    g->n_tensors = (size_t)n_tensors;
    /* Both counts are bounded by the file size (checked above): these allocations are too. */
    g->kvs = arena_alloc(&g->arena, (g->n_kv ? g->n_kv : 1) * sizeof(kv_gguf_kv));
    g->tensors = arena_alloc(&g->arena, (g->n_tensors ? g->n_tensors : 1) * sizeof(kv_tensor_info));
    if (!g->kvs || !g->tensors || index_init(&g->kv_ix, &g->arena, g->n_kv) ||
        index_init(&g->tensor_ix, &g->arena, g->n_tensors))
        return KV_ERR(KV_ENOMEM, "out of memory for %zu kvs and %zu tensors", g->n_kv, g->n_tensors);
    memset(g->kvs, 0, (g->n_kv ? g->n_kv : 1) * sizeof(kv_gguf_kv));
    memset(g->tensors, 0, (g->n_tensors ? g->n_tensors : 1) * sizeof(kv_tensor_info));
    s = parse_kvs(g, &c);
    if (s) return s;
    s = parse_alignment(g);
    if (s) return s;
    for (size_t i = 0; i < g->n_tensors; i++) {
        s = parse_tensor_info(g, &c, i);
        if (s) {
            const char *name = g->tensors[i].name;
            return name ? kv_error_wrap(s, "tensor %zu ('%.200s'): ", i, name) : kv_error_wrap(s, "tensor %zu: ", i);
        }
    }
    return locate_tensor_data(g, &c);
}

static kv_status open_common(kv_gguf **out, kv_gguf *g, const char *label) {
    kv_status s = parse(g);
    if (s) {
        kv_error_wrap(s, "GGUF '%s': ", label);
        kv_gguf_close(g);
        return s;
    }
    *out = g;
    return KV_OK;
}

kv_status kv_gguf_open(kv_gguf **out, const char *path) {
    *out = NULL;
    if (!path) return KV_ERR(KV_EINVAL, "kv_gguf_open: NULL path");
    kv_gguf *g = calloc(1, sizeof *g);
    if (!g) return KV_ERR(KV_ENOMEM, "out of memory opening '%s'", path);
    kv_status s = kv_file_map_open(&g->map, path);
    if (s) {
        free(g);
        return s;
    }
    g->base = g->map.data;
    g->size = g->map.size;
    return open_common(out, g, path);
}

kv_status kv_gguf_open_memory(kv_gguf **out, const void *data, size_t size) {
    *out = NULL;
    if (!data && size) return KV_ERR(KV_EINVAL, "kv_gguf_open_memory: NULL data");
    kv_gguf *g = calloc(1, sizeof *g);
    if (!g) return KV_ERR(KV_ENOMEM, "out of memory");
    g->base = data;
    g->size = size;
    return open_common(out, g, "<memory>");
}

void kv_gguf_close(kv_gguf *g) {
    if (!g) return;
    arena_free(&g->arena);
    kv_file_map_close(&g->map);
    free(g);
}

uint32_t kv_gguf_version(const kv_gguf *g) { return g->version; }
size_t kv_gguf_alignment(const kv_gguf *g) { return g->alignment; }
size_t kv_gguf_data_offset(const kv_gguf *g) { return g->data_offset; }
size_t kv_gguf_kv_count(const kv_gguf *g) { return g->n_kv; }

const kv_gguf_kv *kv_gguf_kv_at(const kv_gguf *g, size_t i) { return i < g->n_kv ? &g->kvs[i] : NULL; }

const kv_gguf_value *kv_gguf_find(const kv_gguf *g, const char *key) {
    if (!key || g->n_kv == 0) return NULL;
    const size_t i = index_find(&g->kv_ix, key, (const char *const *)&g->kvs[0].key, sizeof(kv_gguf_kv));
    return i == SIZE_MAX ? NULL : &g->kvs[i].value;
}

static kv_status find_typed(const kv_gguf *g, const char *key, const kv_gguf_value **v) {
    *v = kv_gguf_find(g, key);
    if (!*v) return KV_ERR(KV_ENOTFOUND, "GGUF key '%.200s' not found", key ? key : "(null)");
    return KV_OK;
}

static int is_unsigned(kv_gguf_type t) {
    return t == KV_GGUF_UINT8 || t == KV_GGUF_UINT16 || t == KV_GGUF_UINT32 || t == KV_GGUF_UINT64 ||
           t == KV_GGUF_BOOL;
}
static int is_signed(kv_gguf_type t) {
    return t == KV_GGUF_INT8 || t == KV_GGUF_INT16 || t == KV_GGUF_INT32 || t == KV_GGUF_INT64;
}

kv_status kv_gguf_get_u64(const kv_gguf *g, const char *key, uint64_t *out) {
    const kv_gguf_value *v;
    kv_status s = find_typed(g, key, &v);
    if (s) return s;
    if (is_unsigned(v->type)) {
        *out = v->v.u64;
        return KV_OK;
    }
    if (is_signed(v->type) && v->v.i64 >= 0) {
        *out = (uint64_t)v->v.i64;
        return KV_OK;
    }
    if (is_signed(v->type))
        return KV_ERR(KV_EFORMAT, "GGUF key '%.200s' = %lld is negative, expected an unsigned integer", key,
                      (long long)v->v.i64);
    return KV_ERR(KV_EFORMAT, "GGUF key '%.200s' has type %s, expected an unsigned integer", key,
                  kv_gguf_type_name((int)v->type));
}

kv_status kv_gguf_get_i64(const kv_gguf *g, const char *key, int64_t *out) {
    const kv_gguf_value *v;
    kv_status s = find_typed(g, key, &v);
    if (s) return s;
    if (is_signed(v->type)) {
        *out = v->v.i64;
        return KV_OK;
    }
    if (is_unsigned(v->type) && v->v.u64 <= (uint64_t)INT64_MAX) {
        *out = (int64_t)v->v.u64;
        return KV_OK;
    }
    if (is_unsigned(v->type))
        return KV_ERR(KV_EFORMAT, "GGUF key '%.200s' = %llu does not fit a signed 64-bit integer", key,
                      (unsigned long long)v->v.u64);
    return KV_ERR(KV_EFORMAT, "GGUF key '%.200s' has type %s, expected an integer", key,
                  kv_gguf_type_name((int)v->type));
}

kv_status kv_gguf_get_f64(const kv_gguf *g, const char *key, double *out) {
    const kv_gguf_value *v;
    kv_status s = find_typed(g, key, &v);
    if (s) return s;
    if (v->type == KV_GGUF_FLOAT32 || v->type == KV_GGUF_FLOAT64) {
        *out = v->v.f64;
    } else if (is_signed(v->type)) {
        *out = (double)v->v.i64;
    } else if (is_unsigned(v->type) && v->type != KV_GGUF_BOOL) {
        *out = (double)v->v.u64;
    } else {
        return KV_ERR(KV_EFORMAT, "GGUF key '%.200s' has type %s, expected a number", key,
                      kv_gguf_type_name((int)v->type));
    }
    return KV_OK;
}

kv_status kv_gguf_get_str(const kv_gguf *g, const char *key, char **out) {
    *out = NULL;
    const kv_gguf_value *v;
    kv_status s = find_typed(g, key, &v);
    if (s) return s;
    if (v->type != KV_GGUF_STRING)
        return KV_ERR(KV_EFORMAT, "GGUF key '%.200s' has type %s, expected string", key,
                      kv_gguf_type_name((int)v->type));
    if (v->v.str.len >= SIZE_MAX) return KV_ERR(KV_ENOMEM, "string too long");
    char *copy = malloc((size_t)v->v.str.len + 1);
    if (!copy) return KV_ERR(KV_ENOMEM, "out of memory copying GGUF key '%.200s'", key);
    if (v->v.str.len) memcpy(copy, v->v.str.ptr, (size_t)v->v.str.len);
    copy[v->v.str.len] = '\0';
    *out = copy;
    return KV_OK;
}

size_t kv_gguf_tensor_count(const kv_gguf *g) { return g->n_tensors; }

const kv_tensor_info *kv_gguf_tensor_at(const kv_gguf *g, size_t i) {
    return i < g->n_tensors ? &g->tensors[i] : NULL;
}

const kv_tensor_info *kv_gguf_find_tensor(const kv_gguf *g, const char *name) {
    if (!name || g->n_tensors == 0) return NULL;
    const size_t i = index_find(&g->tensor_ix, name, (const char *const *)&g->tensors[0].name,
                                sizeof(kv_tensor_info));
    return i == SIZE_MAX ? NULL : &g->tensors[i];
}
