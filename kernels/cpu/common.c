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

kv_status kv_pack_ref(uint32_t *words, const uint8_t *codes, size_t n, int bits, int pack11) {
    kv_status s = pack_check(bits, pack11);
    if (s != KV_OK) return s;
    const int per = kv_pack_per_word(bits, pack11);
    const size_t nw = kv_pack_words(n, bits, pack11);
    for (size_t w = 0; w < nw; w++) words[w] = kv_qm_pack_word(codes, n, w, bits, per);
    return KV_OK;
}

kv_status kv_unpack_ref(uint8_t *codes, const uint32_t *words, size_t n, int bits, int pack11) {
    kv_status s = pack_check(bits, pack11);
    if (s != KV_OK) return s;
    const int per = kv_pack_per_word(bits, pack11);
    for (size_t j = 0; j < n; j++) codes[j] = (uint8_t)kv_qm_unpack(words, j, bits, per);
    return KV_OK;
}
