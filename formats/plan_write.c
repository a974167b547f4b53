/* Plan writer (PLAN_FORMAT.md §3-§6, §8): field-by-field little-endian serialization, 64-byte
 * aligned payloads, zero padding, optional zlib per section, CRCs, atomic file write. */
#define _POSIX_C_SOURCE 200809L
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include "plan_internal.h"

uint32_t kv_plan_crc32(const uint8_t *p, size_t n) {
    uLong c = crc32(0L, Z_NULL, 0);
    while (n > 0) { /* zlib takes uInt lengths */
        const uInt chunk = n > (1u << 30) ? (1u << 30) : (uInt)n;
        c = crc32(c, p, chunk);
        p += chunk;
        n -= chunk;
    }
    return (uint32_t)c;
}

/* ---- kv_buf ------------------------------------------------------------------------------------ */
void kv_buf_free(kv_buf *b) {
    free(b->data);
    memset(b, 0, sizeof *b);
}

uint8_t *kv_buf_grow(kv_buf *b, size_t n) {
    if (b->failed) return NULL;
    if (n > SIZE_MAX - b->size) {
        b->failed = 1;
        return NULL;
    }
    if (b->size + n > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->size + n) {
            if (cap > SIZE_MAX / 2) {
                b->failed = 1;
                return NULL;
            }
            cap *= 2;
        }
        uint8_t *d = realloc(b->data, cap);
        if (!d) {
            b->failed = 1;
            return NULL;
        }
        b->data = d;
        b->cap = cap;
    }
    uint8_t *p = b->data + b->size;
    memset(p, 0, n);
    b->size += n;
    return p;
}

void kv_buf_u32(kv_buf *b, uint32_t v) {
    uint8_t *p = kv_buf_grow(b, 4);
    if (p) kv_store_u32le(p, v);
}
void kv_buf_i32(kv_buf *b, int32_t v) { kv_buf_u32(b, (uint32_t)v); }
void kv_buf_u64(kv_buf *b, uint64_t v) {
    uint8_t *p = kv_buf_grow(b, 8);
    if (p) kv_store_u64le(p, v);
}
void kv_buf_f32(kv_buf *b, float v) {
    uint8_t *p = kv_buf_grow(b, 4);
    if (p) kv_store_f32le(p, v);
}
void kv_buf_f16s(kv_buf *b, const float *v, size_t n) {
    size_t bytes;
    if (kv_size_mul(&bytes, n, 2)) {
        b->failed = 1;
        return;
    }
    uint8_t *p = kv_buf_grow(b, bytes);
    if (!p) return;
    for (size_t i = 0; i < n; i++) kv_store_u16le(p + 2 * i, kv_f32_to_f16(v[i]));
}

void kv_buf_f32s(kv_buf *b, const float *v, size_t n) {
    size_t bytes;
    if (kv_size_mul(&bytes, n, 4)) {
        b->failed = 1;
        return;
    }
    uint8_t *p = kv_buf_grow(b, bytes);
    if (!p) return;
    for (size_t i = 0; i < n; i++) kv_store_f32le(p + 4 * i, v[i]);
}
void kv_buf_bytes(kv_buf *b, const void *src, size_t n) {
    uint8_t *p = kv_buf_grow(b, n);
    if (p && n) memcpy(p, src, n);
}
void kv_buf_str(kv_buf *b, const char *s) {
    size_t n = s ? strlen(s) : 0;
    kv_buf_u32(b, (uint32_t)n);
    kv_buf_bytes(b, s, n);
}

/* ---- section payloads ---------------------------------------------------------------------------- */
static void put_fprt(kv_buf *b, const kv_plan *p) { /* §6.1 */
    const kv_plan_fingerprint *f = &p->fingerprint;
    kv_buf_u32(b, (uint32_t)f->n_layers);
    kv_buf_u32(b, (uint32_t)f->d_model);
    kv_buf_u32(b, (uint32_t)f->n_heads);
    kv_buf_u32(b, (uint32_t)f->n_kv_heads);
    kv_buf_u32(b, (uint32_t)f->head_dim);
    kv_buf_u32(b, (uint32_t)f->vocab_size);
    kv_buf_f32(b, f->rope_theta);
    kv_buf_bytes(b, f->kv_sha256, 32);
    uint8_t arch[32] = {0};
    size_t n = strnlen(f->arch, sizeof arch - 1);
    memcpy(arch, f->arch, n);
    kv_buf_bytes(b, arch, sizeof arch);
}

static void put_glob(kv_buf *b, const kv_plan *p) { /* §6.2 */
    const kv_plan_global *g = &p->global;
    kv_buf_u32(b, (uint32_t)g->sinks);
    kv_buf_u32(b, (uint32_t)g->recent);
    kv_buf_u32(b, (uint32_t)g->prune_method);
    kv_buf_f32(b, g->prune_budget);
    kv_buf_u32(b, (uint32_t)g->prune_window);
    kv_buf_u32(b, (uint32_t)g->prune_pool);
    kv_buf_u64(b, g->rht_seed);
}

static void put_grid(kv_buf *b, const kv_plan *p) { /* §6.3 */
    kv_buf_u32(b, (uint32_t)p->n_grids);
    for (int i = 0; i < p->n_grids; i++) {
        kv_buf_u32(b, (uint32_t)p->grids[i].d);
        kv_buf_u32(b, (uint32_t)p->grids[i].n);
        kv_buf_f32s(b, p->grids[i].points, (size_t)p->grids[i].n * (size_t)p->grids[i].d);
    }
}

static void put_stream(kv_buf *b, const kv_plan_stream *s) { /* §6.4 stream record, 48 bytes */
    uint32_t flags = 0;
    if (s->pre_rope) flags |= KV_PLAN_SF_PRE_ROPE;
    if (s->predictor) flags |= KV_PLAN_SF_PREDICTOR;
    if (s->squat) flags |= KV_PLAN_SF_SQUAT;
    if (s->squat && s->squat->static_subspace) flags |= KV_PLAN_SF_SQUAT_STATIC;
    if (s->predictor && s->predictor->dtype == KV_DTYPE_F16) flags |= KV_PLAN_SF_PRED_F16;
    if (s->predictor && s->predictor->rank >= 1) flags |= KV_PLAN_SF_PRED_LOWRANK;
    if (s->predictor && s->predictor->qbits > 0) flags |= KV_PLAN_SF_PRED_Q4;
    if (s->fp_scales) flags |= KV_PLAN_SF_FP_SCALES;
    kv_buf_u32(b, (uint32_t)s->method);
    kv_buf_u32(b, (uint32_t)s->bits);
    kv_buf_u32(b, (uint32_t)s->group_size);
    kv_buf_u32(b, (uint32_t)s->group_axis);
    kv_buf_u32(b, (uint32_t)s->scale_dtype);
    kv_buf_f32(b, s->eta);
    kv_buf_u32(b, (uint32_t)s->pack);
    kv_buf_i32(b, (int32_t)s->share_codes_with_layer);
    kv_buf_i32(b, (int32_t)s->higgs_grid);
    kv_buf_u32(b, flags);
    kv_buf_f32(b, s->rpc_ratio);
    kv_buf_u32(b, 0);
}

static void put_layr(kv_buf *b, const kv_plan *p) { /* §6.4 */
    kv_buf_u32(b, (uint32_t)p->n_layers);
    kv_buf_u32(b, KV_PLAN_LAYER_RECORD_SIZE);
    for (int l = 0; l < p->n_layers; l++) {
        kv_buf_u32(b, 0); /* layer_flags */
        kv_buf_f32(b, p->layers[l].prune_budget);
        put_stream(b, &p->layers[l].stream[KV_PLAN_K]);
        put_stream(b, &p->layers[l].stream[KV_PLAN_V]);
    }
}

static void put_pred(kv_buf *b, const kv_plan *p) { /* §6.5 */
    uint32_t n = 0;
    for (int l = 0; l < p->n_layers; l++)
        for (int st = 0; st < 2; st++) n += p->layers[l].stream[st].predictor != NULL;
    kv_buf_u32(b, n);
    for (int l = 0; l < p->n_layers; l++)
        for (int st = 0; st < 2; st++) {
            const kv_plan_predictor *pr = p->layers[l].stream[st].predictor;
            if (!pr) continue;
            kv_buf_u32(b, (uint32_t)l);
            kv_buf_u32(b, (uint32_t)st);
            kv_buf_u32(b, (uint32_t)pr->n_inputs);
            for (int i = 0; i < pr->n_inputs; i++) {
                kv_buf_u32(b, (uint32_t)pr->inputs[i].layer);
                kv_buf_u32(b, (uint32_t)pr->inputs[i].stream);
            }
            kv_buf_u32(b, (uint32_t)pr->out_dim);
            kv_buf_u32(b, (uint32_t)pr->in_dim);
            /* 1.2, stream flag PRED_F16: f16 values (exact: validation checked); 1.3, PRED_LOWRANK: the factors */
            void (*put)(kv_buf *, const float *, size_t) = pr->dtype == KV_DTYPE_F16 ? kv_buf_f16s : kv_buf_f32s;
            if (pr->qbits > 0) { /* 1.4, PRED_Q4: bits, group, codes two per byte (low nibble first), scales, offsets */
                const size_t nw = (size_t)pr->out_dim * (size_t)pr->in_dim, ng = nw / (size_t)pr->qgroup;
                kv_buf_u32(b, (uint32_t)pr->qbits);
                kv_buf_u32(b, (uint32_t)pr->qgroup);
                for (size_t i = 0; i < nw; i += 2) {
                    const uint8_t byte = (uint8_t)(pr->qcodes[i] | (i + 1 < nw ? pr->qcodes[i + 1] << 4 : 0));
                    kv_buf_bytes(b, &byte, 1);
                }
                put(b, pr->qscale, ng);
                put(b, pr->qoffset, ng);
            } else if (pr->rank >= 1) {
                kv_buf_u32(b, (uint32_t)pr->rank);
                put(b, pr->left, (size_t)pr->out_dim * (size_t)pr->rank);
                put(b, pr->right, (size_t)pr->rank * (size_t)pr->in_dim);
            } else {
                put(b, pr->weight, (size_t)pr->out_dim * (size_t)pr->in_dim);
            }
            put(b, pr->bias, (size_t)pr->out_dim);
        }
}

static void put_sqat(kv_buf *b, const kv_plan *p) { /* §6.6 */
    uint32_t n = 0;
    for (int l = 0; l < p->n_layers; l++) n += p->layers[l].stream[KV_PLAN_K].squat != NULL;
    kv_buf_u32(b, n);
    const size_t basis_n = (size_t)p->fingerprint.n_kv_heads * (size_t)p->fingerprint.head_dim;
    for (int l = 0; l < p->n_layers; l++) {
        const kv_plan_squat *q = p->layers[l].stream[KV_PLAN_K].squat;
        if (!q) continue;
        kv_buf_u32(b, (uint32_t)l);
        kv_buf_u32(b, KV_PLAN_K);
        kv_buf_u32(b, (uint32_t)q->r);
        kv_buf_f32(b, q->lambda);
        kv_buf_u32(b, (uint32_t)q->g);
        kv_buf_u32(b, q->basis ? 1u : 0u);
        if (q->basis) kv_buf_f32s(b, q->basis, basis_n * (size_t)q->r);
    }
}

static void put_fscl(kv_buf *b, const kv_plan *p) { /* §6.9 (1.1) */
    uint32_t n = 0;
    for (int l = 0; l < p->n_layers; l++)
        for (int st = 0; st < 2; st++) n += p->layers[l].stream[st].fp_scales != NULL;
    kv_buf_u32(b, n);
    for (int l = 0; l < p->n_layers; l++)
        for (int st = 0; st < 2; st++) {
            const kv_plan_stream *s = &p->layers[l].stream[st];
            if (!s->fp_scales) continue;
            kv_buf_u32(b, (uint32_t)l);
            kv_buf_u32(b, (uint32_t)st);
            kv_buf_u32(b, (uint32_t)s->n_fp_scales);
            kv_buf_f32s(b, s->fp_scales, (size_t)s->n_fp_scales);
        }
}

static void put_wndw(kv_buf *b, const kv_plan *p) { /* §6.10 (1.5) */
    kv_buf_u32(b, (uint32_t)p->n_layers);
    for (int l = 0; l < p->n_layers; l++) kv_buf_u32(b, (uint32_t)p->layers[l].window);
}

static void put_prov(kv_buf *b, const kv_plan *p) { /* §6.7 */
    const kv_plan_provenance *v = &p->provenance;
    kv_buf_str(b, v->tool_version);
    kv_buf_str(b, v->git_hash);
    kv_buf_str(b, v->corpus_sha256);
    kv_buf_u64(b, v->seed);
    kv_buf_u64(b, (uint64_t)v->created);
    kv_buf_str(b, v->config_yaml);
}

static void put_rept(kv_buf *b, const kv_plan *p) { /* §6.8 */
    const kv_plan_report *r = &p->report;
    kv_buf_u32(b, (uint32_t)r->n_metrics);
    kv_buf_u32(b, (uint32_t)p->n_layers);
    for (int i = 0; i < r->n_metrics; i++) kv_buf_str(b, r->names[i]);
    kv_buf_f32s(b, r->values, (size_t)p->n_layers * 2u * (size_t)r->n_metrics);
}

/* ---- assembly ---------------------------------------------------------------------------------- */
typedef struct out_section {
    char tag[4];
    uint32_t flags;
    kv_buf raw;       /* uncompressed payload */
    uint8_t *zdata;   /* compressed payload, or NULL */
    size_t zsize;
    uint64_t offset;
} out_section;

static size_t align_up(size_t v) { return (v + (KV_PLAN_ALIGN - 1)) & ~(size_t)(KV_PLAN_ALIGN - 1); }

/* zlib level 9; keeps the result only when it is smaller. */
static kv_status maybe_compress(out_section *s, size_t min_size) {
    if (s->raw.size < min_size) return KV_OK;
    uLongf zcap = compressBound((uLong)s->raw.size);
    uint8_t *z = malloc(zcap);
    if (!z) return KV_ERR(KV_ENOMEM, "out of memory compressing section '%.4s'", s->tag);
    int rc = compress2(z, &zcap, s->raw.data, (uLong)s->raw.size, 9);
    if (rc != Z_OK) {
        free(z);
        return KV_ERR(KV_EIO, "zlib failed to compress section '%.4s' (%d)", s->tag, rc);
    }
    if ((size_t)zcap >= s->raw.size) {
        free(z);
        return KV_OK;
    }
    s->zdata = z;
    s->zsize = (size_t)zcap;
    s->flags |= KV_PLAN_SECTION_ZLIB;
    return KV_OK;
}

kv_status kv_plan_write_memory(uint8_t **out, size_t *out_size, const kv_plan *p,
                               const kv_plan_write_options *opt) {
    *out = NULL;
    *out_size = 0;
    kv_status s = kv_plan_validate(p);
    if (s != KV_OK) return kv_error_wrap(s, "refusing to write an invalid plan: ");
    const int compress = opt ? opt->compress : 1;
    const size_t compress_min = opt && opt->compress_min ? opt->compress_min : 4096;

    int any_pred = 0, any_squat = 0, any_fscl = 0;
    const int windows = kv_plan_has_windows(p);
    for (int l = 0; l < p->n_layers; l++) {
        any_fscl |= p->layers[l].stream[0].fp_scales || p->layers[l].stream[1].fp_scales;
        any_pred |= p->layers[l].stream[0].predictor || p->layers[l].stream[1].predictor;
        any_squat |= p->layers[l].stream[KV_PLAN_K].squat != NULL;
    }
    /* §5: order and flags of the 1.0 sections. */
    struct {
        const char *tag;
        uint32_t flags;
        int present;
        void (*put)(kv_buf *, const kv_plan *);
    } plan_sections[] = {
        {"FPRT", KV_PLAN_SECTION_REQUIRED, 1, put_fprt},
        {"GLOB", KV_PLAN_SECTION_REQUIRED, 1, put_glob},
        {"GRID", KV_PLAN_SECTION_REQUIRED, p->n_grids > 0, put_grid},
        {"LAYR", KV_PLAN_SECTION_REQUIRED, 1, put_layr},
        {"PRED", KV_PLAN_SECTION_REQUIRED, any_pred, put_pred},
        {"SQAT", KV_PLAN_SECTION_REQUIRED, any_squat, put_sqat},
        {"FSCL", KV_PLAN_SECTION_REQUIRED, any_fscl, put_fscl},
        {"WNDW", KV_PLAN_SECTION_REQUIRED, windows, put_wndw},
        {"PROV", 0, 1, put_prov},
        {"REPT", 0, p->report.n_metrics > 0, put_rept},
    };
    enum { N_MAX = sizeof plan_sections / sizeof *plan_sections };
    out_section secs[N_MAX];
    memset(secs, 0, sizeof secs);
    size_t n = 0;
    uint8_t *file = NULL;
    uint64_t required = kv_plan_required_features(p);
    for (size_t i = 0; i < N_MAX; i++) {
        if (!plan_sections[i].present) continue;
        out_section *o = &secs[n++];
        memcpy(o->tag, plan_sections[i].tag, 4);
        o->flags = plan_sections[i].flags;
        plan_sections[i].put(&o->raw, p);
        if (o->raw.failed) {
            s = KV_ERR(KV_ENOMEM, "out of memory serializing section '%.4s'", o->tag);
            goto done;
        }
        if (compress) {
            s = maybe_compress(o, compress_min);
            if (s != KV_OK) goto done;
            if (o->zdata) required |= KV_PLAN_FEAT_ZLIB;
        }
    }
    /* Layout: header, table, payloads at 64-byte boundaries. */
    size_t pos = align_up(KV_PLAN_HEADER_SIZE + n * KV_PLAN_ENTRY_SIZE);
    for (size_t i = 0; i < n; i++) {
        secs[i].offset = pos;
        pos = align_up(pos + (secs[i].zdata ? secs[i].zsize : secs[i].raw.size));
    }
    const size_t file_size = pos;
    file = calloc(1, file_size); /* zero padding everywhere */
    if (!file) {
        s = KV_ERR(KV_ENOMEM, "out of memory for a %zu-byte plan", file_size);
        goto done;
    }
    uint8_t *table = file + KV_PLAN_HEADER_SIZE;
    for (size_t i = 0; i < n; i++) {
        const out_section *o = &secs[i];
        const uint8_t *payload = o->zdata ? o->zdata : o->raw.data;
        const size_t stored = o->zdata ? o->zsize : o->raw.size;
        if (stored) memcpy(file + o->offset, payload, stored);
        uint8_t *e = table + i * KV_PLAN_ENTRY_SIZE; /* §5 entry */
        memcpy(e, o->tag, 4);
        kv_store_u32le(e + 4, o->flags);
        kv_store_u64le(e + 8, o->offset);
        kv_store_u64le(e + 16, stored);
        kv_store_u64le(e + 24, o->raw.size);
        kv_store_u32le(e + 32, kv_plan_crc32(payload, stored));
        kv_store_u32le(e + 36, 0);
    }
    /* §4 header */
    memcpy(file, KV_PLAN_MAGIC_BYTES, 8);
    kv_store_u16le(file + 8, KV_PLAN_VERSION_MAJOR);
    /* §2: the least minor that holds the content, so that a plan without windows stays a 1.4 file byte for byte */
    kv_store_u16le(file + 10, windows ? KV_PLAN_VERSION_MINOR : 4);
    kv_store_u16le(file + 12, KV_PLAN_HEADER_SIZE);
    kv_store_u16le(file + 14, KV_PLAN_ENTRY_SIZE);
    kv_store_u32le(file + 16, KV_PLAN_BOM);
    kv_store_u32le(file + 20, (uint32_t)n);
    kv_store_u64le(file + 24, file_size);
    kv_store_u64le(file + 32, required);
    kv_store_u64le(file + 40, kv_plan_optional_features(p));
    kv_store_u64le(file + 48, KV_PLAN_HEADER_SIZE);
    kv_store_u32le(file + 56, kv_plan_crc32(table, n * KV_PLAN_ENTRY_SIZE));
    kv_store_u32le(file + 60, 0);
    kv_store_u32le(file + 60, kv_plan_crc32(file, KV_PLAN_HEADER_SIZE));
    *out = file;
    *out_size = file_size;
    file = NULL;
    s = KV_OK;
done:
    for (size_t i = 0; i < n; i++) {
        kv_buf_free(&secs[i].raw);
        free(secs[i].zdata);
    }
    free(file);
    return s;
}

kv_status kv_plan_write(const kv_plan *p, const char *path, const kv_plan_write_options *opt) {
    uint8_t *buf = NULL;
    size_t size = 0;
    kv_status s = kv_plan_write_memory(&buf, &size, p, opt);
    if (s == KV_OK) s = kv_write_file_atomic(path, buf, size);
    free(buf);
    if (s != KV_OK) return kv_error_wrap(s, "writing plan '%s': ", path);
    return KV_OK;
}
