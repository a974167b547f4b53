/* kv_cache.c — the KV-cache dispatch helpers and the full-precision (plain f32) cache. */
#include "kv_model.h"

#include <stdlib.h>
#include <string.h>

#define KV_ALIGN 64

/* ---- dispatch ------------------------------------------------------------------------------- */
kv_status kv_cache_append(kv_cache *c, int layer, int seq, int n, const int32_t *pos, const float *k_pre,
                          const float *k, const float *v, size_t ld) {
    if (!c || !c->ops || layer < 0 || layer >= c->n_layers || seq < 0 || seq >= c->n_seqs || n < 0 ||
        (n > 0 && (!pos || !k || !v)))
        return KV_ERR(KV_EINVAL, "kv_cache_append: bad arguments (layer %d, seq %d, n %d)", layer, seq, n);
    return c->ops->append(c, layer, seq, n, pos, k_pre, k, v, ld);
}

kv_status kv_cache_view_layer(kv_cache *c, int layer, int seq, kv_cache_view *out) {
    if (!c || !c->ops || !out || layer < 0 || layer >= c->n_layers || seq < 0 || seq >= c->n_seqs)
        return KV_ERR(KV_EINVAL, "kv_cache_view_layer: bad arguments (layer %d, seq %d)", layer, seq);
    return c->ops->view(c, layer, seq, out);
}

int kv_cache_length(const kv_cache *c, int seq) {
    if (!c || !c->ops || seq < 0 || seq >= c->n_seqs) return -1;
    return c->ops->length(c, seq);
}

kv_status kv_cache_end_prompt(kv_cache *c, int seq) {
    if (!c || !c->ops || seq < 0 || seq >= c->n_seqs) return KV_ERR(KV_EINVAL, "kv_cache_end_prompt: bad arguments");
    return c->ops->end_prompt ? c->ops->end_prompt(c, seq) : KV_OK;
}

void kv_cache_reset(kv_cache *c, int seq) {
    if (c && c->ops) c->ops->reset(c, seq);
}

size_t kv_cache_bytes(const kv_cache *c) {
    return (c && c->ops && c->ops->bytes) ? c->ops->bytes(c) : 0;
}

void kv_cache_free(kv_cache *c) {
    if (c && c->ops) c->ops->destroy(c);
}

/* ---- plain cache: per (layer, seq) growable arrays of post-RoPE keys and values -------------- */
typedef struct plain_slot {
    float *k, *v; /* cap x kv_dim */
    int n, cap;
} plain_slot;

typedef struct plain_cache {
    kv_cache base;
    int kv_dim;
    plain_slot *slots; /* n_layers * n_seqs, slot (l, s) at l*n_seqs + s */
} plain_cache;

static plain_slot *slot_of(plain_cache *p, int layer, int seq) {
    return &p->slots[(size_t)layer * p->base.n_seqs + seq];
}

static kv_status plain_reserve(plain_cache *p, plain_slot *sl, int need) {
    if (need <= sl->cap) return KV_OK;
    int cap = sl->cap ? sl->cap : 64;
    while (cap < need) {
        if (cap > (1 << 29)) return KV_ERR(KV_ENOMEM, "plain KV cache: %d tokens is too many", need);
        cap *= 2;
    }
    const size_t bytes = (size_t)cap * (size_t)p->kv_dim * sizeof(float);
    float *k = kv_aligned_alloc(KV_ALIGN, bytes), *v = kv_aligned_alloc(KV_ALIGN, bytes);
    if (!k || !v) {
        kv_aligned_free(k);
        kv_aligned_free(v);
        return KV_ERR(KV_ENOMEM, "plain KV cache: out of memory for %d tokens", cap);
    }
    if (sl->n) {
        memcpy(k, sl->k, (size_t)sl->n * p->kv_dim * sizeof(float));
        memcpy(v, sl->v, (size_t)sl->n * p->kv_dim * sizeof(float));
    }
    kv_aligned_free(sl->k);
    kv_aligned_free(sl->v);
    sl->k = k;
    sl->v = v;
    sl->cap = cap;
    return KV_OK;
}

static kv_status plain_append(kv_cache *c, int layer, int seq, int n, const int32_t *pos, const float *k_pre,
                              const float *k, const float *v, size_t ld) {
    (void)k_pre;
    plain_cache *p = c->impl;
    plain_slot *sl = slot_of(p, layer, seq);
    if (n > 0 && pos[0] != sl->n)
        return KV_ERR(KV_EINVAL, "plain KV cache: layer %d seq %d holds %d tokens, append at position %d",
                      layer, seq, sl->n, (int)pos[0]);
    kv_status s = plain_reserve(p, sl, sl->n + n);
    if (s != KV_OK) return s;
    const size_t kvd = (size_t)p->kv_dim;
    for (int i = 0; i < n; i++) {
        memcpy(sl->k + (size_t)(sl->n + i) * kvd, k + (size_t)i * ld, kvd * sizeof(float));
        memcpy(sl->v + (size_t)(sl->n + i) * kvd, v + (size_t)i * ld, kvd * sizeof(float));
    }
    sl->n += n;
    return KV_OK;
}

static kv_status plain_view(kv_cache *c, int layer, int seq, kv_cache_view *out) {
    plain_cache *p = c->impl;
    plain_slot *sl = slot_of(p, layer, seq);
    out->k = sl->k;
    out->v = sl->v;
    out->ld_k = out->ld_v = (size_t)p->kv_dim;
    out->n = sl->n;
    return KV_OK;
}

static int plain_length(const kv_cache *c, int seq) {
    plain_cache *p = c->impl;
    return slot_of(p, c->n_layers - 1, seq)->n;
}

static void plain_reset(kv_cache *c, int seq) {
    plain_cache *p = c->impl;
    for (int l = 0; l < c->n_layers; l++)
        for (int s = 0; s < c->n_seqs; s++)
            if (seq < 0 || s == seq) slot_of(p, l, s)->n = 0;
}

static size_t plain_bytes(const kv_cache *c) {
    plain_cache *p = c->impl;
    size_t total = 0;
    for (size_t i = 0; i < (size_t)c->n_layers * c->n_seqs; i++)
        total += 2 * (size_t)p->slots[i].n * p->kv_dim * sizeof(float);
    return total;
}

static void plain_destroy(kv_cache *c) {
    plain_cache *p = c->impl;
    if (p->slots) {
        for (size_t i = 0; i < (size_t)c->n_layers * c->n_seqs; i++) {
            kv_aligned_free(p->slots[i].k);
            kv_aligned_free(p->slots[i].v);
        }
    }
    free(p->slots);
    free(p);
}

static const kv_cache_ops k_plain_ops = {
    "plain", plain_append, plain_view, plain_length, plain_reset, plain_bytes, plain_destroy, NULL, NULL,
};

kv_status kv_cache_plain_create(kv_cache **out, const kv_arch *arch, int n_seqs, int capacity_hint) {
    if (!out || !arch || n_seqs <= 0 || capacity_hint < 0 || arch->n_layers <= 0 || arch->n_kv_heads <= 0 ||
        arch->head_dim <= 0)
        return KV_ERR(KV_EINVAL, "kv_cache_plain_create: bad arguments (%d sequences)", n_seqs);
    *out = NULL;
    plain_cache *p = calloc(1, sizeof *p);
    if (!p) return KV_ERR(KV_ENOMEM, "out of memory for a KV cache");
    p->base.ops = &k_plain_ops;
    p->base.impl = p;
    p->base.n_layers = arch->n_layers;
    p->base.n_seqs = n_seqs;
    p->base.n_kv_heads = arch->n_kv_heads;
    p->base.head_dim = arch->head_dim;
    p->kv_dim = arch->n_kv_heads * arch->head_dim;
    p->slots = calloc((size_t)arch->n_layers * n_seqs, sizeof *p->slots);
    if (!p->slots) {
        plain_destroy(&p->base);
        return KV_ERR(KV_ENOMEM, "out of memory for a KV cache");
    }
    if (capacity_hint > 0) {
        for (int l = 0; l < arch->n_layers; l++)
            for (int s = 0; s < n_seqs; s++) {
                kv_status st = plain_reserve(p, slot_of(p, l, s), capacity_hint);
                if (st != KV_OK) {
                    plain_destroy(&p->base);
                    return st;
                }
            }
    }
    *out = &p->base;
    return KV_OK;
}
