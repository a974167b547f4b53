/* Descriptor checks, bits accounting and bit packing (kvrt.h). */
#include "kv_quant_math.h"
#include "kv_kernels_internal.h"

#include <string.h>

kv_status kv_uniform_check(const kv_uniform *q) {
    if (!q) return KV_ERR(KV_EINVAL, "uniform quantizer: NULL descriptor");
    if (q->bits != 1 && q->bits != 2 && q->bits != 3 && q->bits != 4 && q->bits != 8)
        return KV_ERR(KV_EINVAL, "uniform quantizer: bits must be 1, 2, 3, 4 or 8 (got %d)", q->bits);
    if (q->group < 1) return KV_ERR(KV_EINVAL, "uniform quantizer: group must be >= 1 (got %d)", q->group);
    if (q->axis != KV_AXIS_TOKENS && q->axis != KV_AXIS_CHANNELS)
        return KV_ERR(KV_EINVAL, "uniform quantizer: unknown axis %d", (int)q->axis);
    if (q->param_type != KV_PARAM_F32 && q->param_type != KV_PARAM_F16)
        return KV_ERR(KV_EINVAL, "uniform quantizer: unknown parameter type %d", (int)q->param_type);
    if (q->pack11 && q->bits != 3)
        return KV_ERR(KV_EINVAL, "uniform quantizer: the 11-per-word layout needs bits = 3 (got %d)", q->bits);
    if (!(q->eta >= 0.0f && q->eta < 0.5f))
        return KV_ERR(KV_EINVAL, "uniform quantizer: eta must be in [0, 0.5) (got %g)", (double)q->eta);
    return KV_OK;
}

kv_status kv_higgs_check(const kv_higgs *h) {
    if (!h) return KV_ERR(KV_EINVAL, "HIGGS: NULL descriptor");
    if (h->dim != 1 && h->dim != 2 && h->dim != 4 && h->dim != 8)
        return KV_ERR(KV_EINVAL, "HIGGS: grid dimension must be 1, 2, 4 or 8 (got %d)", h->dim);
    if (h->size < 2 || h->size > 256 || (h->size & (h->size - 1)))
        return KV_ERR(KV_EINVAL, "HIGGS: grid size must be a power of two in 2..256 (got %d)", h->size);
    if (h->group < h->dim || h->group > KV_HIGGS_MAX_GROUP || (h->group & (h->group - 1)))
        return KV_ERR(KV_EINVAL, "HIGGS: group must be a power of two in %d..%d (got %d)", h->dim,
                      KV_HIGGS_MAX_GROUP, h->group);
    if (h->norm_type != KV_PARAM_F32 && h->norm_type != KV_PARAM_F16)
        return KV_ERR(KV_EINVAL, "HIGGS: unknown norm type %d", (int)h->norm_type);
    return KV_OK;
}

int kv_higgs_index_bits(int n) {
    int b = 0;
    while ((1 << b) < n) b++;
    return b;
}

kv_status kv_block_values(size_t *n, size_t tokens, size_t channels) {
    if (kv_size_mul(n, tokens, channels) != 0 || *n > ((size_t)1 << 48))
        return KV_ERR(KV_EINVAL, "block of %zu x %zu values is too large", tokens, channels);
    return KV_OK;
}

size_t kv_uniform_groups(const kv_uniform *q, size_t tokens, size_t channels) {
    const size_t G = (size_t)q->group;
    if (q->axis == KV_AXIS_CHANNELS) return tokens * kv_qm_chan_groups(G, channels);
    return ((tokens + G - 1) / G) * channels;
}

kv_status kv_quant_storage(kv_block_storage *out, const kv_quant *q, size_t tokens, size_t channels) {
    memset(out, 0, sizeof *out);
    if (!q) return KV_ERR(KV_EINVAL, "bits accounting: NULL descriptor");
    size_t n;
    kv_status s = kv_block_values(&n, tokens, channels);
    if (s != KV_OK) return s;
    out->values = n;
    switch (q->kind) {
    case KV_QUANT_F16:
        out->raw_bytes = 2u * (uint64_t)n;
        break;
    case KV_QUANT_UNIFORM: {
        if ((s = kv_uniform_check(&q->uniform)) != KV_OK) return s;
        const uint64_t pbytes = q->uniform.param_type == KV_PARAM_F16 ? 2u : 4u;
        out->groups = kv_uniform_groups(&q->uniform, tokens, channels);
        out->code_words = q->shared_codes ? 0 : kv_pack_words(n, q->uniform.bits, q->uniform.pack11);
        out->scale_bytes = pbytes * out->groups;
        out->zero_bytes = pbytes * out->groups;
        break;
    }
    case KV_QUANT_HIGGS: {
        if ((s = kv_higgs_check(&q->higgs)) != KV_OK) return s;
        if (channels % (size_t)q->higgs.group)
            return KV_ERR(KV_EINVAL, "HIGGS: channels (%zu) must be a multiple of the group (%d)",
                          channels, q->higgs.group);
        out->groups = n / (size_t)q->higgs.group;
        out->code_words = kv_pack_words(n / (size_t)q->higgs.dim, kv_higgs_index_bits(q->higgs.size), 0);
        out->norm_bytes = (q->higgs.norm_type == KV_PARAM_F16 ? 2u : 4u) * out->groups;
        break;
    }
    case KV_QUANT_FP: {
        if ((s = kv_fpq_check(&q->fp, channels)) != KV_OK) return s;
        const int bits = kv_qm_fp_bits((int)q->fp.format);
        out->code_words = kv_pack_words(n, bits, 0);
        if (q->fp.format == KV_FP_NVFP4) { /* one E4M3 byte per block of 16 channels of a token */
            out->groups = (uint64_t)tokens * ((channels + KV_NVFP4_BLOCK - 1) / KV_NVFP4_BLOCK);
            out->norm_bytes = out->groups;
        }
        break;
    }
    default:
        return KV_ERR(KV_EINVAL, "bits accounting: unknown quantizer kind %d", (int)q->kind);
    }
    out->code_bytes = 4u * out->code_words;
    out->total_bytes = out->code_bytes + out->scale_bytes + out->zero_bytes + out->norm_bytes +
                       out->raw_bytes;
    out->total_bits = 8u * out->total_bytes;
    out->bits_per_value = n ? (double)out->total_bits / (double)n : 0.0;
    return KV_OK;
}

int kv_pack_per_word(int bits, int pack11) { return kv_qm_per_word(bits, pack11 && bits == 3); }

size_t kv_pack_words(size_t n, int bits, int pack11) {
    const int per = kv_pack_per_word(bits, pack11);
    return per ? (n + (size_t)per - 1) / (size_t)per : 0;
}

static kv_status pack_check(int bits, int pack11) {
    if (kv_pack_per_word(bits, pack11) == 0)
        return KV_ERR(KV_EINVAL, "packing: width must be 1..8 bits (got %d)", bits);
    if (pack11 && bits != 3) return KV_ERR(KV_EINVAL, "packing: 11-per-word needs 3 bits (got %d)", bits);
    return KV_OK;
}

/* Whole words with compile-time widths (the compiler unrolls the slot loops). */
#define KV_PACK_WORDS(BITS, PER)                                                                   \
    static void pack_words_b##BITS(uint32_t *KV_RESTRICT w, const uint8_t *KV_RESTRICT c, size_t nw) { \
        for (size_t k = 0; k < nw; k++) {                                                          \
            uint32_t word = 0;                                                                     \
            for (int s = 0; s < PER; s++) word |= (uint32_t)c[k * PER + (size_t)s] << (s * BITS);  \
            w[k] |= word;                                                                          \
        }                                                                                          \
    }                                                                                              \
    static void unpack_words_b##BITS(uint8_t *KV_RESTRICT c, const uint32_t *KV_RESTRICT w, size_t nw) { \
        for (size_t k = 0; k < nw; k++) {                                                          \
            const uint32_t word = w[k];                                                            \
            for (int s = 0; s < PER; s++)                                                          \
                c[k * PER + (size_t)s] = (uint8_t)((word >> (s * BITS)) & ((1u << BITS) - 1u));    \
        }                                                                                          \
    }
KV_PACK_WORDS(3, 10)
KV_PACK_WORDS(5, 6)
KV_PACK_WORDS(6, 5)
KV_PACK_WORDS(7, 4)

static void pack_words_11(uint32_t *KV_RESTRICT w, const uint8_t *KV_RESTRICT c, size_t nw) {
    for (size_t k = 0; k < nw; k++) {
        uint32_t word = 0;
        for (int s = 0; s < 10; s++) word |= (uint32_t)c[k * 11 + (size_t)s] << (s * 3);
        const uint32_t last = c[k * 11 + 10];
        w[k] |= word | (last < 3u ? last : 3u) << 30;
    }
}
static void unpack_words_11(uint8_t *KV_RESTRICT c, const uint32_t *KV_RESTRICT w, size_t nw) {
    for (size_t k = 0; k < nw; k++) {
        const uint32_t word = w[k];
        for (int s = 0; s < 10; s++) c[k * 11 + (size_t)s] = (uint8_t)((word >> (s * 3)) & 7u);
        c[k * 11 + 10] = (uint8_t)(word >> 30);
    }
}

/* 1, 2, 4 and 8 bits: gather 8 byte-sized codes from one little-endian u64 with shift-and-mask
 * steps (no per-slot loop). */
static inline uint64_t load_u64(const uint8_t *p) {
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}
static inline void store_u64(uint8_t *p, uint64_t v) { memcpy(p, &v, 8); }

static inline uint32_t squeeze8_b1(uint64_t x) {
    x = (x | (x >> 7)) & 0x0003000300030003ull;
    x = (x | (x >> 14)) & 0x0000000f0000000full;
    return (uint32_t)((x | (x >> 28)) & 0xffu);
}
static inline uint32_t squeeze8_b2(uint64_t x) {
    x = (x | (x >> 6)) & 0x000f000f000f000full;
    x = (x | (x >> 12)) & 0x000000ff000000ffull;
    return (uint32_t)((x | (x >> 24)) & 0xffffu);
}
static inline uint32_t squeeze8_b4(uint64_t x) {
    x = (x | (x >> 4)) & 0x00ff00ff00ff00ffull;
    x = (x | (x >> 8)) & 0x0000ffff0000ffffull;
    return (uint32_t)(x | (x >> 16));
}
static inline uint64_t spread8_b1(uint32_t v) {
    uint64_t x = v & 0xffu;
    x = (x | (x << 28)) & 0x0000000f0000000full;
    x = (x | (x << 14)) & 0x0003000300030003ull;
    return (x | (x << 7)) & 0x0101010101010101ull;
}
static inline uint64_t spread8_b2(uint32_t v) {
    uint64_t x = v & 0xffffu;
    x = (x | (x << 24)) & 0x000000ff000000ffull;
    x = (x | (x << 12)) & 0x000f000f000f000full;
    return (x | (x << 6)) & 0x0303030303030303ull;
}
static inline uint64_t spread8_b4(uint32_t v) {
    uint64_t x = v;
    x = (x | (x << 16)) & 0x0000ffff0000ffffull;
    x = (x | (x << 8)) & 0x00ff00ff00ff00ffull;
    return (x | (x << 4)) & 0x0f0f0f0f0f0f0f0full;
}

static void pack_words(uint32_t *w, const uint8_t *c, size_t nw, int bits, int per) {
    switch (per == 11 ? 0 : bits) {
    case 1:
        for (size_t k = 0; k < nw; k++, c += 32)
            w[k] |= squeeze8_b1(load_u64(c)) | squeeze8_b1(load_u64(c + 8)) << 8 |
                    squeeze8_b1(load_u64(c + 16)) << 16 | squeeze8_b1(load_u64(c + 24)) << 24;
        return;
    case 2:
        for (size_t k = 0; k < nw; k++, c += 16) w[k] |= squeeze8_b2(load_u64(c)) | squeeze8_b2(load_u64(c + 8)) << 16;
        return;
    case 4:
        for (size_t k = 0; k < nw; k++, c += 8) w[k] |= squeeze8_b4(load_u64(c));
        return;
    case 8:
        for (size_t k = 0; k < nw; k++, c += 4) w[k] |= (uint32_t)c[0] | (uint32_t)c[1] << 8 | (uint32_t)c[2] << 16 | (uint32_t)c[3] << 24;
        return;
    default:
        break;
    }
    if (per == 11) {
        pack_words_11(w, c, nw);
        return;
    }
    switch (bits) {
    case 3: pack_words_b3(w, c, nw); break;
    case 5: pack_words_b5(w, c, nw); break;
    case 6: pack_words_b6(w, c, nw); break;
    default: pack_words_b7(w, c, nw); break; /* 7 bits; 1, 2, 4, 8 are handled above */
    }
}

static void unpack_words(uint8_t *c, const uint32_t *w, size_t nw, int bits, int per) {
    switch (per == 11 ? 0 : bits) {
    case 1:
        for (size_t k = 0; k < nw; k++, c += 32)
            for (int q = 0; q < 4; q++) store_u64(c + 8 * q, spread8_b1(w[k] >> (8 * q)));
        return;
    case 2:
        for (size_t k = 0; k < nw; k++, c += 16) {
            store_u64(c, spread8_b2(w[k]));
            store_u64(c + 8, spread8_b2(w[k] >> 16));
        }
        return;
    case 4:
        for (size_t k = 0; k < nw; k++, c += 8) store_u64(c, spread8_b4(w[k]));
        return;
    case 8:
        for (size_t k = 0; k < nw; k++, c += 4) {
            c[0] = (uint8_t)w[k];
            c[1] = (uint8_t)(w[k] >> 8);
            c[2] = (uint8_t)(w[k] >> 16);
            c[3] = (uint8_t)(w[k] >> 24);
        }
        return;
    default:
        break;
    }
    if (per == 11) {
        unpack_words_11(c, w, nw);
        return;
    }
    switch (bits) {
    case 3: unpack_words_b3(c, w, nw); break;
    case 5: unpack_words_b5(c, w, nw); break;
    case 6: unpack_words_b6(c, w, nw); break;
    default: unpack_words_b7(c, w, nw); break;
    }
}

void kv_pack_range(uint32_t *words, size_t j0, const uint8_t *codes, size_t count, int bits, int per) {
    size_t w = j0 / (size_t)per, i = 0;
    int slot = (int)(j0 - w * (size_t)per);
    for (; i < count && slot != 0; i++) {
        uint32_t c = codes[i];
        const uint32_t mx = kv_qm_slot_max(bits, per, slot);
        c = c < mx ? c : mx;
        words[w] |= c << (slot * bits);
        if (++slot == per) {
            slot = 0;
            w++;
        }
    }
    const size_t nw = (count - i) / (size_t)per;
    pack_words(words + w, codes + i, nw, bits, per);
    i += nw * (size_t)per;
    w += nw;
    for (; i < count; i++, slot++) {
        uint32_t c = codes[i];
        const uint32_t mx = kv_qm_slot_max(bits, per, slot);
        words[w] |= (c < mx ? c : mx) << (slot * bits);
    }
}

void kv_unpack_range(uint8_t *codes, const uint32_t *words, size_t j0, size_t count, int bits, int per) {
    size_t w = j0 / (size_t)per, i = 0;
    int slot = (int)(j0 - w * (size_t)per);
    for (; i < count && slot != 0; i++) {
        codes[i] = (uint8_t)((words[w] >> (slot * bits)) & kv_qm_slot_max(bits, per, slot));
        if (++slot == per) {
            slot = 0;
            w++;
        }
    }
    const size_t nw = (count - i) / (size_t)per;
    unpack_words(codes + i, words + w, nw, bits, per);
    i += nw * (size_t)per;
    w += nw;
    for (; i < count; i++, slot++) codes[i] = (uint8_t)((words[w] >> (slot * bits)) & kv_qm_slot_max(bits, per, slot));
}

kv_status kv_pack_ref(uint32_t *words, const uint8_t *codes, size_t n, int bits, int pack11) {
    kv_status s = pack_check(bits, pack11);
    if (s != KV_OK) return s;
    const int per = kv_pack_per_word(bits, pack11);
    const size_t nw = kv_pack_words(n, bits, pack11);
    const uint32_t mask = (1u << bits) - 1u;
    memset(words, 0, nw * sizeof *words);
    /* mask in chunks so that kv_pack_range sees valid codes (slot 10 of 11/word: masked to 2 bits) */
    uint8_t tmp[1100];
    for (size_t j = 0; j < n; j += sizeof tmp) {
        const size_t m = n - j < sizeof tmp ? n - j : sizeof tmp;
        for (size_t i = 0; i < m; i++) {
            const size_t pos = j + i;
            tmp[i] = (uint8_t)(codes[pos] & ((per == 11 && pos % 11 == 10) ? 3u : mask));
        }
        kv_pack_range(words, j, tmp, m, bits, per);
    }
    return KV_OK;
}

kv_status kv_unpack_ref(uint8_t *codes, const uint32_t *words, size_t n, int bits, int pack11) {
    kv_status s = pack_check(bits, pack11);
    if (s != KV_OK) return s;
    kv_unpack_range(codes, words, 0, n, bits, kv_pack_per_word(bits, pack11));
    return KV_OK;
}
