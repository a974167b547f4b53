/* llama2.c legacy (v0) checkpoints: a header of 7 little-endian int32 (dim, hidden_dim, n_layers,
 * n_heads, n_kv_heads, vocab_size, seq_len; a negative vocab_size means the classifier is stored
 * separately), then fp32 arrays in run.c's order. The file size must be exactly what the header
 * implies. */
#include "model_file_internal.h"

#include <string.h>

#define L2C_HEADER_BYTES 28u
#define L2C_MAGIC_V1 0x616b3432u /* "ak42": llama2.c's versioned exports (export.py version 1/2) */

static kv_status add(kv_model_file *mf, const kv_file_map *map, uint64_t *cursor, const char *name,
                     uint64_t ne0, uint64_t ne1) {
    const uint64_t ne[4] = {ne0, ne1, 1, 1};
    const uint64_t off = *cursor;
    const size_t nbytes = (size_t)(ne0 * ne1 * 4u);
    *cursor += nbytes;
    return kv_mf_add_tensor(mf, name, NULL, KV_DTYPE_F32, ne1 == 1 ? 1 : 2, ne, off, nbytes,
                            map->data + off);
}

kv_status kv_mf_open_llama2c(kv_model_file *mf, const kv_file_map *map) {
    const char *path = mf->path;
    if (map->size >= 8 && kv_load_u32le(map->data) == L2C_MAGIC_V1)
        return KV_ERR(KV_EUNSUPPORTED,
                      "'%s' is a llama2.c version-%u export (magic \"ak42\"); only legacy v0 "
                      "checkpoints (7-int header) are supported",
                      path, kv_load_u32le(map->data + 4));
    if (map->size < L2C_HEADER_BYTES)
        return KV_ERR(KV_EFORMAT,
                      "'%s': unrecognized model format: no GGUF magic, not a directory, and at %zu "
                      "bytes too small for a llama2.c header (%u bytes)",
                      path, map->size, L2C_HEADER_BYTES);
    int32_t h[7];
    for (int i = 0; i < 7; i++) h[i] = (int32_t)kv_load_u32le(map->data + 4 * i);
    const int32_t dim = h[0], hidden = h[1], n_layers = h[2], n_heads = h[3], n_kv_heads = h[4],
                  vocab_signed = h[5], seq_len = h[6];
    const int shared = vocab_signed > 0;
    const int64_t vocab = vocab_signed < 0 ? -(int64_t)vocab_signed : vocab_signed;
    if (dim < 1 || dim > KV_MF_MAX_DIM || hidden < 1 || hidden > KV_MF_MAX_DIM || n_layers < 1 ||
        n_layers > KV_MF_MAX_LAYERS || n_heads < 1 || n_heads > KV_MF_MAX_HEADS || n_kv_heads < 1 ||
        n_kv_heads > n_heads || vocab < 1 || vocab > KV_MF_MAX_VOCAB || seq_len < 1 || seq_len > KV_MF_MAX_SEQ)
        return KV_ERR(KV_EFORMAT,
                      "'%s': unrecognized model format: no GGUF magic, not a directory, and not a "
                      "llama2.c checkpoint (header dim=%d hidden_dim=%d n_layers=%d n_heads=%d "
                      "n_kv_heads=%d vocab_size=%d seq_len=%d has absurd dims)",
                      path, dim, hidden, n_layers, n_heads, n_kv_heads, vocab_signed, seq_len);
    if (dim % n_heads != 0 || (dim / n_heads) % 2 != 0)
        return KV_ERR(KV_EFORMAT,
                      "'%s': llama2.c header: dim %d must be n_heads (%d) times an even head size",
                      path, dim, n_heads);
    /* The limits above keep every product below 2^60: no overflow in uint64. */
    const uint64_t d = (uint64_t)dim, L = (uint64_t)n_layers, ff = (uint64_t)hidden, V = (uint64_t)vocab;
    const uint64_t head = d / (uint64_t)n_heads, kv_dim = (uint64_t)n_kv_heads * head;
    const uint64_t n_floats = V * d              /* token_embedding */
                              + L * d * 2        /* rms_att, rms_ffn */
                              + L * d * d * 2    /* wq, wo */
                              + L * d * kv_dim * 2 /* wk, wv */
                              + L * d * ff * 3   /* w1, w2, w3 */
                              + d                /* rms_final */
                              + (uint64_t)seq_len * head /* freq_cis_real + freq_cis_imag */
                              + (shared ? 0 : V * d); /* wcls */
    const uint64_t want = L2C_HEADER_BYTES + 4 * n_floats;
    if ((uint64_t)map->size < want)
        return KV_ERR(KV_EFORMAT,
                      "'%s': llama2.c checkpoint truncated: the header (dim %d, %d layers, vocab %lld) "
                      "implies %llu bytes, the file has %zu",
                      path, dim, n_layers, (long long)vocab, (unsigned long long)want, map->size);
    if ((uint64_t)map->size > want)
        return KV_ERR(KV_EFORMAT,
                      "'%s': llama2.c checkpoint has %llu trailing bytes after the %llu bytes its "
                      "header implies",
                      path, (unsigned long long)(map->size - want), (unsigned long long)want);

    kv_arch *a = &mf->arch;
    snprintf(a->arch, sizeof a->arch, "llama");
    kv_mf_basename(a->name, sizeof a->name, path);
    a->n_layers = n_layers;
    a->d_model = dim;
    a->n_heads = n_heads;
    a->n_kv_heads = n_kv_heads;
    a->head_dim = (int)head;
    a->d_ff = hidden;
    a->vocab_size = (int)vocab;
    a->max_seq_len = seq_len;
    a->rms_eps = 1e-5f;
    a->rope_theta = 10000.0f;
    a->rope_layout = KV_ROPE_ADJACENT;
    a->rope_scaling = KV_ROPE_SCALING_NONE;
    a->qkv_bias = 0;
    a->tied_embeddings = shared;
    a->bos_id = 1; /* llama2.c's sentencepiece convention */
    a->eos_id = 2;

    /* run.c memory_map_weights: each per-layer array holds all layers back to back. */
    uint64_t cur = L2C_HEADER_BYTES;
    kv_status s = add(mf, map, &cur, "token_embd.weight", d, V);
    static const struct {
        const char *suffix;
        int in, out; /* 0 d, 1 kv_dim, 2 ff, 3 none */
    } k_arrays[] = {
        {"attn_norm.weight", 0, 3},   {"attn_q.weight", 0, 0},   {"attn_k.weight", 0, 1},
        {"attn_v.weight", 0, 1},      {"attn_output.weight", 0, 0}, {"ffn_norm.weight", 0, 3},
        {"ffn_gate.weight", 0, 2} /* w1 */, {"ffn_down.weight", 2, 0} /* w2 */,
        {"ffn_up.weight", 0, 2} /* w3 */,
    };
    const uint64_t width[4] = {d, kv_dim, ff, 1};
    for (size_t k = 0; s == KV_OK && k < sizeof k_arrays / sizeof k_arrays[0]; k++) {
        for (int l = 0; s == KV_OK && l < n_layers; l++) {
            char name[64];
            snprintf(name, sizeof name, "blk.%d.%s", l, k_arrays[k].suffix);
            s = add(mf, map, &cur, name, width[k_arrays[k].in], width[k_arrays[k].out]);
        }
    }
    if (s == KV_OK) s = add(mf, map, &cur, "output_norm.weight", d, 1);
    cur += 4 * (uint64_t)seq_len * head; /* freq_cis_real, freq_cis_imag: unused */
    if (s == KV_OK && !shared) s = add(mf, map, &cur, "output.weight", d, V);
    return s;
}
