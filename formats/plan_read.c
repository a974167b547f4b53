/* Plan reader (PLAN_FORMAT.md §4-§7). Every field is decoded on its own from the bytes, every
 * count and offset is checked against what remains before anything is allocated, every CRC is
 * verified; malformed input is a status code with a message, never a crash. */
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include "plan_internal.h"

/* ---- bounds-checked cursor over one payload (sticky error) -------------------------------------- */
typedef struct cursor {
    const uint8_t *p;
    size_t n, pos;
    const char *tag;
    kv_status err; /* KV_OK until the first failure; then reads return 0 */
} cursor;

static int need(cursor *c, size_t bytes, const char *what) {
    if (c->err != KV_OK) return 0;
    if (bytes > c->n - c->pos) {
        c->err = KV_ERR(KV_EFORMAT, "section '%s' is truncated: %s needs %zu bytes at offset %zu, %zu remain",
                        c->tag, what, bytes, c->pos, c->n - c->pos);
        return 0;
    }
    return 1;
}
/* need(count * elem) with overflow check. */
static int need_n(cursor *c, uint64_t count, size_t elem, const char *what) {
    size_t bytes;
    if (c->err != KV_OK) return 0;
    if (count > SIZE_MAX || kv_size_mul(&bytes, (size_t)count, elem)) {
        c->err = KV_ERR(KV_EFORMAT, "section '%s': %s count %" PRIu64 " is absurd", c->tag, what, count);
        return 0;
    }
    return need(c, bytes, what);
}
static uint32_t rd_u32(cursor *c, const char *what) {
    if (!need(c, 4, what)) return 0;
    uint32_t v = kv_load_u32le(c->p + c->pos);
    c->pos += 4;
    return v;
}
static int32_t rd_i32(cursor *c, const char *what) { return (int32_t)rd_u32(c, what); }
static uint64_t rd_u64(cursor *c, const char *what) {
    if (!need(c, 8, what)) return 0;
    uint64_t v = kv_load_u64le(c->p + c->pos);
    c->pos += 8;
    return v;
}
static float rd_f32(cursor *c, const char *what) {
    if (!need(c, 4, what)) return 0.0f;
    float v = kv_load_f32le(c->p + c->pos);
    c->pos += 4;
    return v;
}
/* count floats into a new array (count checked against the remaining bytes first). */
static float *rd_f32s(cursor *c, uint64_t count, const char *what) {
    if (!need_n(c, count, 4, what)) return NULL;
    float *v = malloc(count ? (size_t)count * 4 : 1);
    if (!v) {
        c->err = KV_ERR(KV_ENOMEM, "out of memory reading %s", what);
        return NULL;
    }
    for (size_t i = 0; i < (size_t)count; i++) v[i] = kv_load_f32le(c->p + c->pos + 4 * i);
    c->pos += (size_t)count * 4;
    return v;
}
/* count f16 values into a new f32 array (exact). */
static float *rd_f16s(cursor *c, uint64_t count, const char *what) {
    if (!need_n(c, count, 2, what)) return NULL;
    float *v = malloc(count ? (size_t)count * 4 : 1);
    if (!v) {
        c->err = KV_ERR(KV_ENOMEM, "out of memory reading %s", what);
        return NULL;
    }
    for (size_t i = 0; i < (size_t)count; i++) v[i] = kv_f16_to_f32(kv_load_u16le(c->p + c->pos + 2 * i));
    c->pos += (size_t)count * 2;
    return v;
}
/* §1 str into a new NUL-terminated string. */
static char *rd_str(cursor *c, const char *what) {
    uint32_t n = rd_u32(c, what);
    if (c->err != KV_OK) return NULL;
    if (n > KV_PLAN_MAX_STRING) {
        c->err = KV_ERR(KV_EFORMAT, "section '%s': %s length %u exceeds %u", c->tag, what, n, KV_PLAN_MAX_STRING);
        return NULL;
    }
    if (!need(c, n, what)) return NULL;
    const char *src = (const char *)c->p + c->pos;
    if (!kv_plan_utf8_valid(src, n)) {
        c->err = KV_ERR(KV_EFORMAT, "section '%s': %s is not valid UTF-8 (or contains NUL)", c->tag, what);
        return NULL;
    }
    char *s = malloc((size_t)n + 1);
    if (!s) {
        c->err = KV_ERR(KV_ENOMEM, "out of memory reading %s", what);
        return NULL;
    }
    memcpy(s, src, n);
    s[n] = '\0';
    c->pos += n;
    return s;
}
/* A u32 that must lie in [lo, hi]. */
static uint32_t rd_range(cursor *c, uint32_t lo, uint32_t hi, const char *what) {
    uint32_t v = rd_u32(c, what);
    if (c->err == KV_OK && (v < lo || v > hi)) {
        c->err = KV_ERR(KV_EFORMAT, "section '%s': %s = %u out of range [%u, %u]", c->tag, what, v, lo, hi);
        return lo;
    }
    return v;
}

/* ---- read state --------------------------------------------------------------------------------- */
typedef struct reader {
    const uint8_t *data;
    size_t size;
    kv_plan *p;
    int newer_minor;        /* the file's minor is newer than ours: ignore section tails */
    uint8_t *stream_flags;  /* LAYR flags per (layer, stream) */
} reader;

/* Payload bytes of a section: verified CRC already; inflated when ZLIB (*owned set). */
static kv_status payload(reader *r, const kv_plan_section_info *si, const uint8_t **out, uint8_t **owned) {
    *owned = NULL;
    const uint8_t *stored = r->data + si->offset;
    if (!(si->flags & KV_PLAN_SECTION_ZLIB)) {
        *out = stored;
        return KV_OK;
    }
    uint8_t *buf = malloc(si->size ? (size_t)si->size : 1);
    if (!buf) return KV_ERR(KV_ENOMEM, "out of memory inflating section '%s' (%" PRIu64 " bytes)", si->tag, si->size);
    uLongf dlen = (uLongf)si->size;
    uLong slen = (uLong)si->stored_size;
    int rc = uncompress2(buf, &dlen, stored, &slen);
    if (rc != Z_OK || dlen != si->size || slen != si->stored_size) {
        free(buf);
        return KV_ERR(KV_EFORMAT,
                      "section '%s': the zlib stream is invalid or does not inflate to exactly %" PRIu64
                      " bytes (zlib %d)", si->tag, si->size, rc);
    }
    *out = buf;
    *owned = buf;
    return KV_OK;
}

/* After a section's fields: leftover bytes are an error unless the file is a newer minor (§2). */
static kv_status finish(reader *r, cursor *c) {
    if (c->err != KV_OK) return c->err;
    if (c->pos != c->n && !r->newer_minor)
        return KV_ERR(KV_EFORMAT, "section '%s' has %zu unexpected bytes after its fields", c->tag, c->n - c->pos);
    return KV_OK;
}

/* ---- sections (§6) ---------------------------------------------------------------------------- */
static kv_status read_fprt(reader *r, cursor *c, kv_plan_fingerprint *f) {
    memset(f, 0, sizeof *f);
    f->n_layers = (int)rd_range(c, 1, KV_PLAN_MAX_LAYERS, "n_layers");
    f->d_model = (int)rd_range(c, 1, 1u << 20, "d_model");
    f->n_heads = (int)rd_range(c, 1, 4096, "n_heads");
    f->n_kv_heads = (int)rd_range(c, 1, 4096, "n_kv_heads");
    f->head_dim = (int)rd_range(c, 1, 4096, "head_dim");
    f->vocab_size = (int)rd_range(c, 1, 1u << 24, "vocab_size");
    f->rope_theta = rd_f32(c, "rope_theta");
    if (need(c, 64, "kv_sha256 and arch")) {
        memcpy(f->kv_sha256, c->p + c->pos, 32);
        memcpy(f->arch, c->p + c->pos + 32, 32);
        c->pos += 64;
        const char *nul = memchr(f->arch, '\0', sizeof f->arch);
        for (const char *z = nul; z && z < f->arch + sizeof f->arch; z++)
            if (*z != '\0') return KV_ERR(KV_EFORMAT, "section 'FPRT': arch is not NUL-padded");
    }
    kv_status s = finish(r, c);
    if (s != KV_OK) return s;
    return kv_plan_fingerprint_validate(f);
}

static kv_status read_glob(reader *r, cursor *c) {
    kv_plan_global *g = &r->p->global;
    g->sinks = (int)rd_range(c, 0, 1u << 20, "sinks");
    g->recent = (int)rd_range(c, 0, 1u << 24, "recent");
    g->prune_method = (kv_plan_prune)rd_range(c, 0, KV_PLAN_PRUNE_PYRAMIDKV, "prune_method");
    g->prune_budget = rd_f32(c, "prune_budget");
    g->prune_window = (int)rd_range(c, 0, 1u << 20, "prune_window");
    g->prune_pool = (int)rd_range(c, 0, 1024, "prune_pool");
    g->rht_seed = rd_u64(c, "rht_seed");
    return finish(r, c);
}

static kv_status read_grid(reader *r, cursor *c) {
    kv_plan *p = r->p;
    const uint32_t n = rd_range(c, 1, KV_PLAN_MAX_GRIDS, "n_grids");
    if (c->err != KV_OK) return c->err;
    p->grids = calloc(n, sizeof *p->grids);
    if (!p->grids) return KV_ERR(KV_ENOMEM, "out of memory");
    for (uint32_t i = 0; i < n && c->err == KV_OK; i++) {
        kv_plan_grid *g = &p->grids[i];
        g->d = (int)rd_range(c, 1, 16, "grid d");
        g->n = (int)rd_range(c, 2, 65536, "grid n");
        g->points = rd_f32s(c, (uint64_t)g->d * (uint64_t)g->n, "grid points");
        if (c->err == KV_OK) p->n_grids = (int)i + 1;
    }
    return finish(r, c);
}

static kv_status read_stream(reader *r, cursor *c, int l, int st) {
    kv_plan_stream *s = &r->p->layers[l].stream[st];
    /* Enum fields are range-checked here so that no out-of-range value reaches an enum type;
     * kv_plan_validate checks the combinations. */
    s->method = (kv_plan_method)rd_range(c, 0, KV_PLAN_METHOD_COUNT - 1, "stream method");
    s->bits = (int)rd_range(c, 0, 64, "stream bits");
    s->group_size = (int)rd_range(c, 0, 1u << 20, "stream group_size");
    s->group_axis = (kv_plan_group_axis)rd_range(c, 0, KV_PLAN_GROUP_CHANNELS, "stream group_axis");
    s->scale_dtype = (int)rd_range(c, 0, 1, "stream scale_dtype");
    s->eta = rd_f32(c, "stream eta");
    s->pack = (kv_plan_pack)rd_range(c, 0, KV_PLAN_PACK_3BIT_11, "stream pack");
    s->share_codes_with_layer = rd_i32(c, "stream share_codes_with_layer");
    s->higgs_grid = rd_i32(c, "stream higgs_grid");
    const uint32_t flags = rd_u32(c, "stream flags");
    s->rpc_ratio = rd_f32(c, "stream rpc_ratio");
    const uint32_t reserved = rd_u32(c, "stream reserved");
    if (c->err != KV_OK) return c->err;
    if (flags & ~(KV_PLAN_SF_PRE_ROPE | KV_PLAN_SF_PREDICTOR | KV_PLAN_SF_SQUAT | KV_PLAN_SF_FP_SCALES |
                  KV_PLAN_SF_SQUAT_STATIC | KV_PLAN_SF_PRED_F16 | KV_PLAN_SF_PRED_LOWRANK | KV_PLAN_SF_PRED_Q4))
        return KV_ERR(KV_EFORMAT, "layer %d %s: unknown stream flags 0x%x", l, kv_plan_stream_name(st), flags);
    if (reserved != 0) return KV_ERR(KV_EFORMAT, "layer %d %s: reserved field is %u, not 0", l, kv_plan_stream_name(st), reserved);
    if ((flags & KV_PLAN_SF_PRED_F16) && !(flags & KV_PLAN_SF_PREDICTOR))
        return KV_ERR(KV_EFORMAT, "layer %d %s: PRED_F16 flag without the PREDICTOR flag", l, kv_plan_stream_name(st));
    if ((flags & KV_PLAN_SF_PRED_LOWRANK) && !(flags & KV_PLAN_SF_PREDICTOR))
        return KV_ERR(KV_EFORMAT, "layer %d %s: PRED_LOWRANK flag without the PREDICTOR flag", l,
                      kv_plan_stream_name(st));
    if ((flags & KV_PLAN_SF_PRED_Q4) &&
        (!(flags & KV_PLAN_SF_PRED_F16) || (flags & KV_PLAN_SF_PRED_LOWRANK))) /* §6.5: f16 scales and bias, full rank */
        return KV_ERR(KV_EFORMAT, "layer %d %s: PRED_Q4 flag needs PRED_F16 and excludes PRED_LOWRANK", l,
                      kv_plan_stream_name(st));
    if ((flags & KV_PLAN_SF_SQUAT_STATIC) && !(flags & KV_PLAN_SF_SQUAT))
        return KV_ERR(KV_EFORMAT, "layer %d %s: SQUAT_STATIC flag without the SQUAT flag", l, kv_plan_stream_name(st));
    s->pre_rope = (flags & KV_PLAN_SF_PRE_ROPE) ? 1 : 0;
    r->stream_flags[l * 2 + st] = (uint8_t)flags;
    return KV_OK;
}

static kv_status read_layr(reader *r, cursor *c) {
    kv_plan *p = r->p;
    const uint32_t n = rd_u32(c, "n_layers");
    const uint32_t rec = rd_u32(c, "record_size");
    if (c->err != KV_OK) return c->err;
    if (n != (uint32_t)p->n_layers)
        return KV_ERR(KV_EFORMAT, "section 'LAYR': %u layer records for a model of %d layers", n, p->n_layers);
    if (rec < KV_PLAN_LAYER_RECORD_SIZE || rec > 4096 || rec % 4 != 0)
        return KV_ERR(KV_EFORMAT, "section 'LAYR': record_size %u (must be a multiple of 4 in [%u, 4096])", rec,
                      KV_PLAN_LAYER_RECORD_SIZE);
    if (rec > KV_PLAN_LAYER_RECORD_SIZE && !r->newer_minor)
        return KV_ERR(KV_EFORMAT, "section 'LAYR': record_size %u larger than %u in a file of this minor version",
                      rec, KV_PLAN_LAYER_RECORD_SIZE);
    if (!need_n(c, n, rec, "layer records")) return c->err;
    for (uint32_t l = 0; l < n; l++) {
        const size_t start = c->pos;
        const uint32_t layer_flags = rd_u32(c, "layer_flags");
        if (c->err == KV_OK && layer_flags != 0)
            return KV_ERR(KV_EFORMAT, "layer %u: layer_flags 0x%x (must be 0)", l, layer_flags);
        p->layers[l].prune_budget = rd_f32(c, "layer prune_budget");
        kv_status s = read_stream(r, c, (int)l, KV_PLAN_K);
        if (s == KV_OK) s = read_stream(r, c, (int)l, KV_PLAN_V);
        if (s != KV_OK) return s;
        c->pos = start + rec; /* skip fields appended by later minors */
    }
    return finish(r, c);
}

/* (1.4) A PRED_Q4 entry after in_dim (§6.5): u32 bits (4), u32 group, the codes two per byte (low nibble first,
 * in row-major order), f16 scales and f16 offsets (out_dim x in_dim / group each); `weight` is their value. */
static kv_status read_pred_q4(cursor *c, kv_plan_predictor *pr, uint32_t l, uint32_t st) {
    pr->qbits = (int)rd_range(c, 4, 4, "predictor code bits");
    pr->qgroup = (int)rd_range(c, 1, (uint32_t)pr->in_dim, "predictor group");
    if (c->err != KV_OK) return c->err;
    if (pr->in_dim % pr->qgroup != 0)
        return KV_ERR(KV_EFORMAT, "layer %u %s: predictor group %d does not divide in_dim %d", l,
                      kv_plan_stream_name((int)st), pr->qgroup, pr->in_dim);
    const uint64_t n = (uint64_t)pr->out_dim * (uint64_t)pr->in_dim, ng = n / (uint64_t)pr->qgroup;
    if (!need_n(c, (n + 1) / 2, 1, "predictor codes")) return c->err;
    if (!(pr->qcodes = malloc((size_t)n)) || !(pr->weight = malloc((size_t)n * sizeof(float))))
        return KV_ERR(KV_ENOMEM, "out of memory for a %dx%d predictor", pr->out_dim, pr->in_dim);
    for (uint64_t i = 0; i < n; i++) pr->qcodes[i] = (uint8_t)((c->p[c->pos + i / 2] >> (4 * (i % 2))) & 0xfu);
    c->pos += (size_t)((n + 1) / 2);
    pr->qscale = rd_f16s(c, ng, "predictor scales");
    pr->qoffset = rd_f16s(c, ng, "predictor offsets");
    if (c->err != KV_OK) return c->err;
    for (uint64_t i = 0; i < n; i++) {
        const uint64_t g = i / (uint64_t)pr->qgroup; /* groups run along a row: in_dim is a multiple of qgroup */
        pr->weight[i] = kv_plan_pred_qvalue(pr->qscale[g], pr->qoffset[g], pr->qcodes[i]);
    }
    return KV_OK;
}

static kv_status read_pred(reader *r, cursor *c) {
    kv_plan *p = r->p;
    const int kv_dim = p->fingerprint.n_kv_heads * p->fingerprint.head_dim;
    uint32_t flagged = 0;
    for (int i = 0; i < p->n_layers * 2; i++) flagged += (r->stream_flags[i] & KV_PLAN_SF_PREDICTOR) != 0;
    const uint32_t n = rd_u32(c, "n_predictors");
    if (c->err != KV_OK) return c->err;
    if (n != flagged)
        return KV_ERR(KV_EFORMAT, "section 'PRED': %u predictors but %u streams have the PREDICTOR flag", n, flagged);
    long prev = -1;
    for (uint32_t k = 0; k < n; k++) {
        const uint32_t l = rd_range(c, 0, (uint32_t)p->n_layers - 1, "predictor layer");
        const uint32_t st = rd_range(c, 0, 1, "predictor stream");
        const uint32_t n_in = rd_range(c, 1, KV_PLAN_MAX_PRED_INPUTS, "predictor n_inputs");
        if (c->err != KV_OK) return c->err;
        const long key = (long)l * 2 + (long)st;
        if (key <= prev)
            return KV_ERR(KV_EFORMAT, "section 'PRED': predictor %u (layer %u %s) is out of order or repeated", k, l,
                          kv_plan_stream_name((int)st));
        prev = key;
        if (!(r->stream_flags[key] & KV_PLAN_SF_PREDICTOR))
            return KV_ERR(KV_EFORMAT, "section 'PRED': layer %u %s has a predictor but no PREDICTOR flag", l,
                          kv_plan_stream_name((int)st));
        kv_plan_predictor *pr = calloc(1, sizeof *pr);
        if (!pr) return KV_ERR(KV_ENOMEM, "out of memory");
        p->layers[l].stream[st].predictor = pr;
        pr->n_inputs = (int)n_in;
        for (uint32_t i = 0; i < n_in; i++) {
            pr->inputs[i].layer = (int)rd_range(c, 0, (uint32_t)p->n_layers - 1, "predictor input layer");
            pr->inputs[i].stream = (int)rd_range(c, 0, 1, "predictor input stream");
        }
        pr->out_dim = (int)rd_u32(c, "predictor out_dim");
        pr->in_dim = (int)rd_u32(c, "predictor in_dim");
        if (c->err != KV_OK) return c->err;
        /* The dimensions follow from the fingerprint: check them before allocating. */
        if (pr->out_dim != kv_dim || pr->in_dim != (int)n_in * kv_dim)
            return KV_ERR(KV_EFORMAT, "layer %u %s: predictor is %ux%u, expected %dx%d", l, kv_plan_stream_name((int)st),
                          (unsigned)pr->out_dim, (unsigned)pr->in_dim, kv_dim, (int)n_in * kv_dim);
        const int f16 = (r->stream_flags[key] & KV_PLAN_SF_PRED_F16) != 0;
        pr->dtype = f16 ? KV_DTYPE_F16 : KV_DTYPE_F32;
        if (r->stream_flags[key] & KV_PLAN_SF_PRED_Q4) { /* 1.4: bits, group, codes, scales, offsets, bias */
            if ((c->err = read_pred_q4(c, pr, l, st)) != KV_OK) return c->err;
        } else if (r->stream_flags[key] & KV_PLAN_SF_PRED_LOWRANK) { /* 1.3: rank, left, right, bias */
            const int max_rank = pr->out_dim < pr->in_dim ? pr->out_dim : pr->in_dim;
            pr->rank = (int)rd_range(c, 1, (uint32_t)max_rank, "predictor rank");
            if (c->err != KV_OK) return c->err;
            const uint64_t nl = (uint64_t)pr->out_dim * (uint64_t)pr->rank, nr = (uint64_t)pr->rank * (uint64_t)pr->in_dim;
            pr->left = f16 ? rd_f16s(c, nl, "predictor left factor") : rd_f32s(c, nl, "predictor left factor");
            pr->right = f16 ? rd_f16s(c, nr, "predictor right factor") : rd_f32s(c, nr, "predictor right factor");
            if (c->err == KV_OK && !(pr->weight = malloc((size_t)pr->out_dim * (size_t)pr->in_dim * sizeof(float))))
                return KV_ERR(KV_ENOMEM, "out of memory for a %dx%d predictor", pr->out_dim, pr->in_dim);
            kv_plan_predictor_expand(pr);
        } else {
            pr->weight = f16 ? rd_f16s(c, (uint64_t)pr->out_dim * (uint64_t)pr->in_dim, "predictor weight")
                             : rd_f32s(c, (uint64_t)pr->out_dim * (uint64_t)pr->in_dim, "predictor weight");
        }
        pr->bias = f16 ? rd_f16s(c, (uint64_t)pr->out_dim, "predictor bias") : rd_f32s(c, (uint64_t)pr->out_dim, "predictor bias");
        if (c->err != KV_OK) return c->err;
    }
    return finish(r, c);
}

static kv_status read_sqat(reader *r, cursor *c) {
    kv_plan *p = r->p;
    const int hd = p->fingerprint.head_dim;
    uint32_t flagged = 0;
    for (int i = 0; i < p->n_layers * 2; i++) flagged += (r->stream_flags[i] & KV_PLAN_SF_SQUAT) != 0;
    const uint32_t n = rd_u32(c, "n_entries");
    if (c->err != KV_OK) return c->err;
    if (n != flagged)
        return KV_ERR(KV_EFORMAT, "section 'SQAT': %u entries but %u streams have the SQUAT flag", n, flagged);
    long prev = -1;
    for (uint32_t k = 0; k < n; k++) {
        const uint32_t l = rd_range(c, 0, (uint32_t)p->n_layers - 1, "squat layer");
        const uint32_t st = rd_range(c, 0, 0, "squat stream");
        if (c->err != KV_OK) return c->err;
        if ((long)l <= prev)
            return KV_ERR(KV_EFORMAT, "section 'SQAT': entry %u (layer %u) is out of order or repeated", k, l);
        prev = l;
        if (!(r->stream_flags[l * 2 + st] & KV_PLAN_SF_SQUAT))
            return KV_ERR(KV_EFORMAT, "section 'SQAT': layer %u K has SQuat parameters but no SQUAT flag", l);
        kv_plan_squat *q = calloc(1, sizeof *q);
        if (!q) return KV_ERR(KV_ENOMEM, "out of memory");
        p->layers[l].stream[st].squat = q;
        /* r sizes the basis, so r and g are checked here; lambda, and a static subspace without a
         * basis, by the plan's validation once every section is read */
        const uint32_t rank = rd_u32(c, "squat r");
        q->lambda = rd_f32(c, "squat lambda");
        const uint32_t g = rd_u32(c, "squat g");
        const uint32_t has_basis = rd_range(c, 0, 1, "squat has_basis");
        if (c->err != KV_OK) return c->err;
        if (rank < 1 || rank > (uint32_t)hd)
            return KV_ERR(KV_EFORMAT, "layer %u K: SQuat r %u out of range [1, head_dim %d]", l, rank, hd);
        if (g < 1 || g > (uint32_t)hd || (uint32_t)hd % g != 0)
            return KV_ERR(KV_EFORMAT, "layer %u K: SQuat g %u does not divide head_dim %d", l, g, hd);
        q->r = (int)rank;
        q->g = (int)g;
        q->static_subspace = (r->stream_flags[l * 2 + st] & KV_PLAN_SF_SQUAT_STATIC) != 0;
        if (has_basis) {
            /* The basis's shape is implied (n_kv_heads x r x head_dim); one written for another shape
             * shows up as too few bytes here or extra bytes after the last entry. */
            const uint64_t want = (uint64_t)p->fingerprint.n_kv_heads * rank * (uint64_t)hd;
            if ((uint64_t)(c->n - c->pos) / 4u < want)
                return KV_ERR(KV_EFORMAT,
                              "layer %u K: the SQuat basis needs %d x %u x %d floats (n_kv_heads x r x head_dim), "
                              "the section has %zu bytes left",
                              l, p->fingerprint.n_kv_heads, rank, hd, c->n - c->pos);
            q->basis = rd_f32s(c, want, "squat basis");
            if (c->err != KV_OK) return c->err;
        }
    }
    if (c->pos != c->n && !r->newer_minor)
        return KV_ERR(KV_EFORMAT,
                      "section 'SQAT' has %zu bytes after its last entry: a SQuat basis is not n_kv_heads x r x "
                      "head_dim floats",
                      c->n - c->pos);
    return finish(r, c);
}

static kv_status read_fscl(reader *r, cursor *c) { /* §6.9 (1.1) */
    kv_plan *p = r->p;
    uint32_t flagged = 0;
    for (int i = 0; i < p->n_layers * 2; i++) flagged += (r->stream_flags[i] & KV_PLAN_SF_FP_SCALES) != 0;
    const uint32_t n = rd_u32(c, "n_entries");
    if (c->err != KV_OK) return c->err;
    if (n != flagged)
        return KV_ERR(KV_EFORMAT, "section 'FSCL': %u entries but %u streams have the FP_SCALES flag", n, flagged);
    long prev = -1;
    for (uint32_t k = 0; k < n; k++) {
        const uint32_t l = rd_range(c, 0, (uint32_t)p->n_layers - 1, "scales layer");
        const uint32_t st = rd_range(c, 0, 1, "scales stream");
        const uint32_t ns = rd_range(c, 1, (uint32_t)p->fingerprint.n_kv_heads, "scales count");
        if (c->err != KV_OK) return c->err;
        if ((long)(l * 2 + st) <= prev)
            return KV_ERR(KV_EFORMAT, "section 'FSCL': entry %u (layer %u) is out of order or repeated", k, l);
        prev = (long)(l * 2 + st);
        if (!(r->stream_flags[l * 2 + st] & KV_PLAN_SF_FP_SCALES))
            return KV_ERR(KV_EFORMAT, "section 'FSCL': layer %u %s has scales but no FP_SCALES flag", l,
                          kv_plan_stream_name((int)st));
        kv_plan_stream *s = &p->layers[l].stream[st];
        s->fp_scales = rd_f32s(c, ns, "scales");
        if (c->err != KV_OK) return c->err;
        s->n_fp_scales = (int)ns;
    }
    return finish(r, c);
}

static kv_status read_wndw(reader *r, cursor *c) { /* §6.10 (1.5) */
    kv_plan *p = r->p;
    const uint32_t nl = rd_u32(c, "n_layers");
    if (c->err != KV_OK) return c->err;
    if (nl != (uint32_t)p->n_layers)
        return KV_ERR(KV_EFORMAT, "section 'WNDW': %u layers for a model of %d layers", nl, p->n_layers);
    int any = 0;
    for (int l = 0; l < p->n_layers; l++) {
        p->layers[l].window = (int)rd_range(c, 0, KV_PLAN_MAX_WINDOW, "window");
        if (c->err != KV_OK) return c->err;
        any |= p->layers[l].window > 0;
    }
    if (!any) return KV_ERR(KV_EFORMAT, "section 'WNDW': every layer's window is 0 (the section is written only when "
                            "a layer has a window)");
    return finish(r, c);
}

static kv_status read_prov(reader *r, cursor *c) {
    kv_plan_provenance *v = &r->p->provenance;
    v->tool_version = rd_str(c, "tool_version");
    v->git_hash = rd_str(c, "git_hash");
    v->corpus_sha256 = rd_str(c, "corpus_sha256");
    v->seed = rd_u64(c, "seed");
    v->created = (int64_t)rd_u64(c, "created");
    v->config_yaml = rd_str(c, "config_yaml");
    return finish(r, c);
}

static kv_status read_rept(reader *r, cursor *c) {
    kv_plan *p = r->p;
    kv_plan_report *rep = &p->report;
    const uint32_t n = rd_range(c, 1, KV_PLAN_MAX_METRICS, "n_metrics");
    const uint32_t nl = rd_u32(c, "n_layers");
    if (c->err != KV_OK) return c->err;
    if (nl != (uint32_t)p->n_layers)
        return KV_ERR(KV_EFORMAT, "section 'REPT': %u layers for a model of %d layers", nl, p->n_layers);
    rep->names = calloc(n, sizeof *rep->names);
    if (!rep->names) return KV_ERR(KV_ENOMEM, "out of memory");
    rep->n_metrics = (int)n;
    for (uint32_t i = 0; i < n; i++) rep->names[i] = rd_str(c, "metric name");
    rep->values = rd_f32s(c, (uint64_t)nl * 2u * n, "report values");
    if (c->err != KV_OK) {
        /* keep the struct consistent for kv_plan_free: names may be partly NULL, values NULL */
        return c->err;
    }
    return finish(r, c);
}

/* ---- the file ---------------------------------------------------------------------------------- */
/* The sections of §5 in decode order (FPRT first: it sizes everything else). */
static const char k_known[][5] = {"FPRT", "GLOB", "GRID", "LAYR", "PRED", "SQAT", "FSCL", "WNDW", "PROV", "REPT"};
enum { N_KNOWN = sizeof k_known / sizeof *k_known };

static int known_index(const char tag[4]) {
    for (int i = 0; i < N_KNOWN; i++)
        if (memcmp(tag, k_known[i], 4) == 0) return i;
    return -1;
}

static kv_status read_header_and_table(reader *r, kv_plan_file_info *fi, size_t *table_off) {
    const uint8_t *d = r->data;
    const size_t size = r->size;
    if (size < KV_PLAN_HEADER_SIZE)
        return KV_ERR(KV_EFORMAT, "truncated: %zu bytes, smaller than the %u-byte header", size, KV_PLAN_HEADER_SIZE);
    if (memcmp(d, KV_PLAN_MAGIC_BYTES, 8) != 0) return KV_ERR(KV_EFORMAT, "not a kvcal plan (bad magic)");
    const uint32_t bom = kv_load_u32le(d + 16);
    if (bom == 0x0D0C0B0Au) return KV_ERR(KV_EFORMAT, "big-endian plan files are not supported (byte-order mark)");
    if (bom != KV_PLAN_BOM) return KV_ERR(KV_EFORMAT, "bad byte-order mark 0x%08x", bom);
    fi->version_major = kv_load_u16le(d + 8);
    fi->version_minor = kv_load_u16le(d + 10);
    if (fi->version_major > KV_PLAN_VERSION_MAJOR)
        return KV_ERR(KV_EVERSION, "plan format version %d.%d is newer than this reader (%d.x); upgrade kvcal",
                      fi->version_major, fi->version_minor, KV_PLAN_VERSION_MAJOR);
    if (fi->version_major == 0) return KV_ERR(KV_EFORMAT, "plan format major version 0 is invalid");
    r->newer_minor = fi->version_minor > KV_PLAN_VERSION_MINOR;
    const uint32_t hsize = kv_load_u16le(d + 12);
    const uint32_t esize = kv_load_u16le(d + 14);
    if (hsize < KV_PLAN_HEADER_SIZE || hsize > 4096 || hsize % 8 != 0)
        return KV_ERR(KV_EFORMAT, "header_size %u (must be a multiple of 8 in [64, 4096])", hsize);
    if (hsize > size) return KV_ERR(KV_EFORMAT, "truncated: header_size %u but only %zu bytes", hsize, size);
    {
        /* §4: CRC of the header with its CRC field read as zero */
        const uint32_t want = kv_load_u32le(d + 60);
        static const uint8_t zero4[4] = {0, 0, 0, 0};
        uLong crc = crc32(0L, Z_NULL, 0);
        crc = crc32(crc, d, 60);
        crc = crc32(crc, zero4, 4);
        crc = crc32(crc, d + 64, hsize - 64);
        if ((uint32_t)crc != want)
            return KV_ERR(KV_ECHECKSUM, "header CRC mismatch (stored 0x%08x, computed 0x%08x): the file is corrupt",
                          want, (uint32_t)crc);
    }
    fi->file_size = kv_load_u64le(d + 24);
    if (fi->file_size > size)
        return KV_ERR(KV_EFORMAT, "truncated: the header says %" PRIu64 " bytes, the file has %zu", fi->file_size, size);
    if (fi->file_size < size)
        return KV_ERR(KV_EFORMAT, "%zu unexpected bytes after the end of the plan (%" PRIu64 " bytes)",
                      size - (size_t)fi->file_size, fi->file_size);
    fi->required_features = kv_load_u64le(d + 32);
    fi->optional_features = kv_load_u64le(d + 40);
    if (fi->required_features & ~KV_PLAN_REQUIRED_KNOWN)
        return KV_ERR(KV_EVERSION,
                      "the plan requires features 0x%" PRIx64 " unknown to this reader (format %d.%d knows 0x%llx); "
                      "upgrade kvcal", (uint64_t)(fi->required_features & ~KV_PLAN_REQUIRED_KNOWN), KV_PLAN_VERSION_MAJOR,
                      KV_PLAN_VERSION_MINOR, (unsigned long long)KV_PLAN_REQUIRED_KNOWN);
    const uint32_t count = kv_load_u32le(d + 20);
    const uint64_t toff = kv_load_u64le(d + 48);
    if (count < 1 || count > KV_PLAN_MAX_SECTIONS)
        return KV_ERR(KV_EFORMAT, "section_count %u out of range [1, %u]", count, KV_PLAN_MAX_SECTIONS);
    if (esize < KV_PLAN_ENTRY_SIZE || esize > 1024 || esize % 8 != 0)
        return KV_ERR(KV_EFORMAT, "section_entry_size %u (must be a multiple of 8 in [40, 1024])", esize);
    if (esize > KV_PLAN_ENTRY_SIZE && !r->newer_minor)
        return KV_ERR(KV_EFORMAT, "section_entry_size %u larger than %u in a file of this minor version", esize,
                      KV_PLAN_ENTRY_SIZE);
    if (toff < hsize || toff % 8 != 0 || toff > size || (uint64_t)count * esize > size - toff)
        return KV_ERR(KV_EFORMAT, "section table (offset %" PRIu64 ", %u entries of %u bytes) does not fit the file",
                      toff, count, esize);
    const size_t tbytes = (size_t)count * esize;
    const uint32_t tcrc = kv_plan_crc32(d + toff, tbytes);
    if (tcrc != kv_load_u32le(d + 56))
        return KV_ERR(KV_ECHECKSUM, "section table CRC mismatch (stored 0x%08x, computed 0x%08x)",
                      kv_load_u32le(d + 56), tcrc);
    *table_off = (size_t)toff;
    fi->sections = calloc(count, sizeof *fi->sections);
    if (!fi->sections) return KV_ERR(KV_ENOMEM, "out of memory");
    fi->n_sections = (int)count;
    const uint64_t table_end = toff + tbytes;
    uint64_t prev_off = 0, prev_end = table_end;
    for (uint32_t i = 0; i < count; i++) {
        const uint8_t *e = d + toff + (size_t)i * esize;
        kv_plan_section_info *si = &fi->sections[i];
        for (int k = 0; k < 4; k++) {
            if (e[k] < 0x21 || e[k] > 0x7E)
                return KV_ERR(KV_EFORMAT, "section %u: tag is not four printable ASCII characters", i);
            si->tag[k] = (char)e[k];
        }
        si->flags = kv_load_u32le(e + 4);
        si->offset = kv_load_u64le(e + 8);
        si->stored_size = kv_load_u64le(e + 16);
        si->size = kv_load_u64le(e + 24);
        si->crc32 = kv_load_u32le(e + 32);
        for (uint32_t j = 0; j < i; j++)
            if (memcmp(fi->sections[j].tag, si->tag, 4) == 0)
                return KV_ERR(KV_EFORMAT, "section '%s' appears twice", si->tag);
        if (si->offset % KV_PLAN_ALIGN != 0)
            return KV_ERR(KV_EFORMAT, "section '%s': offset %" PRIu64 " is not a multiple of 64", si->tag, si->offset);
        if (si->offset > fi->file_size || si->stored_size > fi->file_size - si->offset)
            return KV_ERR(KV_EFORMAT,
                          "section '%s' [%" PRIu64 ", +%" PRIu64 ") extends past the end of the file (%" PRIu64 " bytes)",
                          si->tag, si->offset, si->stored_size, fi->file_size);
        if (si->offset < table_end)
            return KV_ERR(KV_EFORMAT, "section '%s' at %" PRIu64 " overlaps the header or the section table", si->tag,
                          si->offset);
        if (i > 0 && si->offset < prev_off)
            return KV_ERR(KV_EFORMAT, "section '%s' is out of offset order in the table", si->tag);
        if (si->offset < prev_end)
            return KV_ERR(KV_EFORMAT, "section '%s' at %" PRIu64 " overlaps section '%s' (ends at %" PRIu64 ")",
                          si->tag, si->offset, fi->sections[i - 1].tag, prev_end);
        prev_off = si->offset;
        prev_end = si->offset + si->stored_size;
        if (si->flags & KV_PLAN_SECTION_ZLIB) {
            const uint64_t max = si->stored_size * 1032u + 64u;
            if (si->size > max || si->size > KV_PLAN_MAX_SECTION_SIZE)
                return KV_ERR(KV_EFORMAT, "section '%s': size %" PRIu64 " is impossible for %" PRIu64
                              " compressed bytes", si->tag, si->size, si->stored_size);
        } else if (si->size != si->stored_size) {
            return KV_ERR(KV_EFORMAT, "section '%s': size %" PRIu64 " differs from stored_size %" PRIu64
                          " without compression", si->tag, si->size, si->stored_size);
        }
        const uint32_t reserved = kv_load_u32le(e + 36);
        if (reserved != 0 && !r->newer_minor)
            return KV_ERR(KV_EFORMAT, "section '%s': reserved field is 0x%08x, not 0", si->tag, reserved);
        const uint32_t crc = kv_plan_crc32(d + si->offset, (size_t)si->stored_size);
        if (crc != si->crc32)
            return KV_ERR(KV_ECHECKSUM, "section '%s' CRC mismatch (stored 0x%08x, computed 0x%08x): the file is corrupt",
                          si->tag, si->crc32, crc);
        /* Known tag with known flags: decoded. Otherwise: rejected if REQUIRED, else skipped (§5). */
        const uint32_t unknown_flags = si->flags & ~(KV_PLAN_SECTION_REQUIRED | KV_PLAN_SECTION_ZLIB);
        si->known = known_index((const char *)e) >= 0 && unknown_flags == 0;
        if (!si->known && (si->flags & KV_PLAN_SECTION_REQUIRED)) {
            if (unknown_flags)
                return KV_ERR(KV_EVERSION, "required section '%s' has flags 0x%x unknown to this reader; upgrade kvcal",
                              si->tag, unknown_flags);
            return KV_ERR(KV_EVERSION, "required section '%s' is unknown to this reader (format %d.%d); upgrade kvcal",
                          si->tag, KV_PLAN_VERSION_MAJOR, KV_PLAN_VERSION_MINOR);
        }
    }
    /* §1: bytes outside the header, the table and the payloads are zero. */
    for (uint64_t k = hsize; k < toff; k++)
        if (d[k] != 0) return KV_ERR(KV_EFORMAT, "nonzero padding byte at offset %" PRIu64, k);
    uint64_t at = table_end;
    for (uint32_t i = 0; i <= count; i++) {
        const uint64_t until = i < count ? fi->sections[i].offset : fi->file_size;
        for (uint64_t k = at; k < until; k++)
            if (d[k] != 0) return KV_ERR(KV_EFORMAT, "nonzero padding byte at offset %" PRIu64, k);
        if (i < count) at = fi->sections[i].offset + fi->sections[i].stored_size;
    }
    return KV_OK;
}

static const char *feature_name(uint64_t bit) {
    switch (bit) {
    case KV_PLAN_FEAT_ZLIB: return "ZLIB";
    case KV_PLAN_FEAT_HIGGS: return "HIGGS";
    case KV_PLAN_FEAT_PREDICTOR: return "PREDICTOR";
    case KV_PLAN_FEAT_SHARED_CODES: return "SHARED_CODES";
    case KV_PLAN_FEAT_SQUAT: return "SQUAT";
    case KV_PLAN_FEAT_PRUNING: return "PRUNING";
    case KV_PLAN_FEAT_PACK3_11: return "PACK3_11";
    case KV_PLAN_FEAT_FLOAT: return "FLOAT";
    case KV_PLAN_FEAT_SQUAT_STATIC: return "SQUAT_STATIC";
    case KV_PLAN_FEAT_PRED_F16: return "PRED_F16";
    case KV_PLAN_FEAT_PRED_LOWRANK: return "PRED_LOWRANK";
    case KV_PLAN_FEAT_PRED_Q4: return "PRED_Q4";
    case KV_PLAN_FEAT_WINDOW: return "WINDOW";
    }
    return "?";
}

static kv_status read_all(reader *r) {
    kv_plan_file_info fi;
    memset(&fi, 0, sizeof fi);
    size_t table_off = 0;
    kv_status s = read_header_and_table(r, &fi, &table_off);
    if (s != KV_OK) {
        free(fi.sections);
        return s;
    }
    /* Find the known sections in decode order. */
    const kv_plan_section_info *by_index[N_KNOWN] = {0};
    uint64_t zlib_used = 0;
    for (int i = 0; i < fi.n_sections; i++) {
        if (!fi.sections[i].known) continue;
        by_index[known_index(fi.sections[i].tag)] = &fi.sections[i];
        if (fi.sections[i].flags & KV_PLAN_SECTION_ZLIB) zlib_used = KV_PLAN_FEAT_ZLIB;
    }
    static const char *const must[] = {"FPRT", "GLOB", "LAYR"};
    for (int i = 0; i < 3; i++)
        if (!by_index[known_index(must[i])]) {
            free(fi.sections);
            return KV_ERR(KV_EFORMAT, "missing required section '%s'", must[i]);
        }
    /* FPRT first: it sizes everything else. */
    kv_plan_fingerprint fp;
    const uint8_t *pl = NULL;
    uint8_t *owned = NULL;
    s = payload(r, by_index[0], &pl, &owned);
    if (s == KV_OK) {
        cursor c = {pl, (size_t)by_index[0]->size, 0, "FPRT", KV_OK};
        s = read_fprt(r, &c, &fp);
    }
    free(owned);
    if (s == KV_OK) s = kv_plan_create(&r->p, &fp);
    if (s == KV_OK) {
        r->p->file = fi;
        fi.sections = NULL;
        r->stream_flags = calloc((size_t)fp.n_layers * 2u, 1);
        if (!r->stream_flags) s = KV_ERR(KV_ENOMEM, "out of memory");
    }
    free(fi.sections);
    if (s != KV_OK) return s;

    static kv_status (*const readers[N_KNOWN])(reader *, cursor *) = {
        NULL, read_glob, read_grid, read_layr, read_pred, read_sqat, read_fscl, read_wndw, read_prov, read_rept};
    for (int k = 1; k < N_KNOWN && s == KV_OK; k++) {
        const kv_plan_section_info *si = by_index[k];
        if (!si) continue;
        s = payload(r, si, &pl, &owned);
        if (s != KV_OK) break;
        cursor c = {pl, (size_t)si->size, 0, k_known[k], KV_OK};
        s = readers[k](r, &c);
        free(owned);
    }
    if (s != KV_OK) return s;
    /* Flags that name data which must exist. */
    for (int l = 0; l < r->p->n_layers; l++)
        for (int st = 0; st < 2; st++) {
            const uint8_t f = r->stream_flags[l * 2 + st];
            if ((f & KV_PLAN_SF_PREDICTOR) && !r->p->layers[l].stream[st].predictor)
                return KV_ERR(KV_EFORMAT, "layer %d %s: PREDICTOR flag set but no predictor in section 'PRED'", l,
                              kv_plan_stream_name(st));
            if ((f & KV_PLAN_SF_FP_SCALES) && !r->p->layers[l].stream[st].fp_scales)
                return KV_ERR(KV_EFORMAT, "layer %d %s: FP_SCALES flag set but no entry in section 'FSCL'", l,
                              kv_plan_stream_name(st));
            if ((f & KV_PLAN_SF_SQUAT) && !r->p->layers[l].stream[st].squat)
                return KV_ERR(KV_EFORMAT, "layer %d %s: SQUAT flag set but no entry in section 'SQAT'", l,
                              kv_plan_stream_name(st));
        }
    s = kv_plan_validate(r->p);
    if (s != KV_OK) return s;
    /* §4: every feature the content uses must be declared. */
    const uint64_t used = kv_plan_required_features(r->p) | zlib_used;
    const uint64_t undeclared = used & ~r->p->file.required_features;
    if (undeclared) {
        uint64_t bit = undeclared & (~undeclared + 1);
        return KV_ERR(KV_EFORMAT, "the content uses feature %s but the header does not declare it", feature_name(bit));
    }
    return KV_OK;
}

kv_status kv_plan_read_memory(kv_plan **out, const void *data, size_t size) {
    *out = NULL;
    if (!data && size) return KV_ERR(KV_EINVAL, "kv_plan_read_memory: no data");
    reader r;
    memset(&r, 0, sizeof r);
    r.data = data;
    r.size = size;
    kv_status s = read_all(&r);
    free(r.stream_flags);
    if (s != KV_OK) {
        kv_plan_free(r.p);
        return s;
    }
    *out = r.p;
    return KV_OK;
}

kv_status kv_plan_read(kv_plan **out, const char *path) {
    *out = NULL;
    kv_file_map m;
    kv_status s = kv_file_map_open(&m, path);
    if (s != KV_OK) return kv_error_wrap(s, "reading plan: ");
    s = kv_plan_read_memory(out, m.data, m.size);
    kv_file_map_close(&m);
    if (s != KV_OK) return kv_error_wrap(s, "plan '%s': ", path);
    return KV_OK;
}
