/* Helpers of the model-file tests (mf_test.h). */
#define _XOPEN_SOURCE 700
#include "mf_test.h"

#include <ftw.h>
#include <stdarg.h>
#include <unistd.h>

/* ---- files --------------------------------------------------------------------------------- */

void mf_tmpdir(char *out, size_t n) {
    kv_test_tmpdir(out, n);
    ck_assert_msg(mkdtemp(out) != NULL, "mkdtemp(%s) failed", out);
}

static int rm_one(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
    (void)st, (void)flag, (void)ftw;
    return remove(path);
}

void mf_rmtree(const char *path) { nftw(path, rm_one, 16, FTW_DEPTH | FTW_PHYS); }

void mf_write(const char *path, const void *data, size_t n) {
    FILE *fp = fopen(path, "wb");
    ck_assert_msg(fp != NULL, "cannot create %s", path);
    ck_assert(n == 0 || fwrite(data, 1, n, fp) == n);
    ck_assert(fclose(fp) == 0);
}

void mf_write_str(const char *path, const char *text) { mf_write(path, text, strlen(text)); }

uint8_t *mf_read(const char *path, size_t *n) {
    char *buf = NULL;
    ck_assert_kv_ok(kv_file_read_all(&buf, n, path));
    return (uint8_t *)buf;
}

/* ---- a growing string ------------------------------------------------------------------------ */
typedef struct sbuf {
    char *p;
    size_t len, cap;
} sbuf;

static void sb_printf(sbuf *b, const char *fmt, ...) KV_PRINTF(2, 3);
static void sb_printf(sbuf *b, const char *fmt, ...) {
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int k = vsnprintf(b->p ? b->p + b->len : NULL, b->p ? b->cap - b->len : 0, fmt, ap);
        va_end(ap);
        ck_assert(k >= 0);
        if (b->p && b->len + (size_t)k < b->cap) {
            b->len += (size_t)k;
            return;
        }
        b->cap = (b->cap + (size_t)k + 1) * 2;
        b->p = realloc(b->p, b->cap);
        ck_assert(b->p != NULL);
    }
}

/* ---- a random model -------------------------------------------------------------------------- */

static const char *st_dtype_name(int dtype) {
    return dtype == KV_DTYPE_F32 ? "F32" : dtype == KV_DTYPE_F16 ? "F16" : "BF16";
}

static void add_tensor(mf_model *m, kv_rng *rng, const char *hf, const char *canon, int dtype, int rank,
                       uint64_t d0, uint64_t d1) {
    m->t = realloc(m->t, (m->n + 1) * sizeof *m->t);
    ck_assert(m->t != NULL);
    mf_tensor *t = &m->t[m->n++];
    memset(t, 0, sizeof *t);
    snprintf(t->hf, sizeof t->hf, "%s", hf);
    snprintf(t->canon, sizeof t->canon, "%s", canon);
    t->dtype = dtype;
    t->rank = rank;
    t->shape[0] = d0;
    t->shape[1] = rank == 2 ? d1 : 1;
    t->n = (size_t)(d0 * t->shape[1]);
    const size_t esize = dtype == KV_DTYPE_F32 ? 4 : 2;
    t->values = malloc(t->n * sizeof(float));
    t->nbytes = t->n * esize;
    t->bytes = malloc(t->nbytes + 1);
    ck_assert(t->values && t->bytes);
    for (size_t i = 0; i < t->n; i++) {
        float x = (float)(kv_rng_next_normal(rng) * 0.5);
        if (dtype == KV_DTYPE_F32) {
            kv_store_f32le(t->bytes + 4 * i, x);
        } else if (dtype == KV_DTYPE_F16) {
            uint16_t h = kv_f32_to_f16(x);
            kv_store_u16le(t->bytes + 2 * i, h);
            x = kv_f16_to_f32(h);
        } else {
            uint16_t h = kv_f32_to_bf16(x);
            kv_store_u16le(t->bytes + 2 * i, h);
            x = kv_bf16_to_f32(h);
        }
        t->values[i] = x;
    }
}

void mf_model_generate(mf_model *m, const mf_spec *s) {
    memset(m, 0, sizeof *m);
    kv_rng rng;
    kv_rng_init(&rng, s->seed);
    const uint64_t d = (uint64_t)s->d_model, q = (uint64_t)(s->n_heads * s->head_dim),
                   kv = (uint64_t)(s->n_kv_heads * s->head_dim), ff = (uint64_t)s->d_ff, V = (uint64_t)s->vocab;
    add_tensor(m, &rng, "model.embed_tokens.weight", "token_embd.weight", s->dtype, 2, V, d);
    for (int l = 0; l < s->n_layers; l++) {
        char hf[96], cn[64];
#define T(hfname, cname, dt, rank, a, b)                                    \
    snprintf(hf, sizeof hf, "model.layers.%d.%s", l, hfname);              \
    snprintf(cn, sizeof cn, "blk.%d.%s", l, cname);                        \
    add_tensor(m, &rng, hf, cn, dt, rank, a, b)
        T("input_layernorm.weight", "attn_norm.weight", s->norm_dtype, 1, d, 1);
        T("self_attn.q_proj.weight", "attn_q.weight", s->dtype, 2, q, d);
        T("self_attn.k_proj.weight", "attn_k.weight", s->dtype, 2, kv, d);
        T("self_attn.v_proj.weight", "attn_v.weight", s->dtype, 2, kv, d);
        if (s->qkv_bias) {
            T("self_attn.q_proj.bias", "attn_q.bias", s->norm_dtype, 1, q, 1);
            T("self_attn.k_proj.bias", "attn_k.bias", s->norm_dtype, 1, kv, 1);
            T("self_attn.v_proj.bias", "attn_v.bias", s->norm_dtype, 1, kv, 1);
        }
        T("self_attn.o_proj.weight", "attn_output.weight", s->dtype, 2, d, q);
        T("post_attention_layernorm.weight", "ffn_norm.weight", s->norm_dtype, 1, d, 1);
        T("mlp.gate_proj.weight", "ffn_gate.weight", s->dtype, 2, ff, d);
        T("mlp.up_proj.weight", "ffn_up.weight", s->dtype, 2, ff, d);
        T("mlp.down_proj.weight", "ffn_down.weight", s->dtype, 2, d, ff);
#undef T
    }
    add_tensor(m, &rng, "model.norm.weight", "output_norm.weight", s->norm_dtype, 1, d, 1);
    if (!(s->tied && s->omit_lm_head))
        add_tensor(m, &rng, "lm_head.weight", s->tied ? "" : "output.weight", s->dtype, 2, V, d);
}

void mf_model_free(mf_model *m) {
    for (size_t i = 0; i < m->n; i++) {
        free(m->t[i].values);
        free(m->t[i].bytes);
    }
    free(m->t);
    memset(m, 0, sizeof *m);
}

mf_tensor *mf_model_find(mf_model *m, const char *hf) {
    for (size_t i = 0; i < m->n; i++)
        if (strcmp(m->t[i].hf, hf) == 0) return &m->t[i];
    return NULL;
}

const char *mf_config_json(const mf_spec *s, const char *extra) {
    static char buf[4096];
    char head_dim[64] = "", rope[256] = "", type_extra[128] = "";
    if (s->head_dim * s->n_heads != s->d_model) snprintf(head_dim, sizeof head_dim, ", \"head_dim\": %d", s->head_dim);
    if (s->llama3_rope)
        snprintf(rope, sizeof rope,
                 ", \"rope_scaling\": {\"factor\": 8.0, \"low_freq_factor\": 1.0, \"high_freq_factor\": 4.0, "
                 "\"original_max_position_embeddings\": 64, \"rope_type\": \"llama3\"}");
    if (strcmp(s->model_type, "qwen2") == 0)
        snprintf(type_extra, sizeof type_extra, ", \"use_sliding_window\": false, \"sliding_window\": 32768");
    else if (strcmp(s->model_type, "mistral") == 0)
        snprintf(type_extra, sizeof type_extra, ", \"sliding_window\": null");
    snprintf(buf, sizeof buf,
             "{\n  \"architectures\": [\"X\"],\n  \"model_type\": \"%s\",\n  \"hidden_size\": %d,\n"
             "  \"num_hidden_layers\": %d,\n  \"num_attention_heads\": %d,\n  \"num_key_value_heads\": %d,\n"
             "  \"intermediate_size\": %d,\n  \"vocab_size\": %d,\n  \"rms_norm_eps\": 1e-05,\n"
             "  \"rope_theta\": 500000.0,\n  \"max_position_embeddings\": 256,\n"
             "  \"tie_word_embeddings\": %s,\n  \"bos_token_id\": 1,\n  \"eos_token_id\": [2, 3],\n"
             "  \"hidden_act\": \"silu\",\n  \"torch_dtype\": \"bfloat16\"%s%s%s%s\n}\n",
             s->model_type, s->d_model, s->n_layers, s->n_heads, s->n_kv_heads, s->d_ff, s->vocab,
             s->tied ? "true" : "false", head_dim, rope, type_extra, extra ? extra : "");
    return buf;
}

void mf_write_raw_safetensors(const char *path, const char *header, const void *data, size_t ndata,
                              uint64_t hlen_override) {
    const size_t hlen = strlen(header);
    uint8_t *buf = malloc(8 + hlen + ndata + 1);
    ck_assert(buf != NULL);
    kv_store_u64le(buf, hlen_override ? hlen_override : hlen);
    memcpy(buf + 8, header, hlen);
    if (ndata) memcpy(buf + 8 + hlen, data, ndata);
    mf_write(path, buf, 8 + hlen + ndata);
    free(buf);
}

void mf_write_safetensors(const char *path, mf_tensor *const *t, size_t n) {
    sbuf h = {0};
    sb_printf(&h, "{\"__metadata__\":{\"format\":\"pt\"}");
    size_t off = 0;
    for (size_t i = 0; i < n; i++) {
        sb_printf(&h, ",\"%s\":{\"dtype\":\"%s\",\"shape\":[", t[i]->hf, st_dtype_name(t[i]->dtype));
        if (t[i]->rank == 2)
            sb_printf(&h, "%llu,%llu", (unsigned long long)t[i]->shape[0], (unsigned long long)t[i]->shape[1]);
        else
            sb_printf(&h, "%llu", (unsigned long long)t[i]->shape[0]);
        sb_printf(&h, "],\"data_offsets\":[%zu,%zu]}", off, off + t[i]->nbytes);
        off += t[i]->nbytes;
    }
    sb_printf(&h, "}");
    while (h.len % 8) sb_printf(&h, " "); /* as the safetensors library pads */
    uint8_t *data = malloc(off + 1);
    ck_assert(data != NULL);
    off = 0;
    for (size_t i = 0; i < n; i++) {
        memcpy(data + off, t[i]->bytes, t[i]->nbytes);
        off += t[i]->nbytes;
    }
    mf_write_raw_safetensors(path, h.p, data, off, 0);
    free(data);
    free(h.p);
}

void mf_write_hf_dir(const char *dir, const mf_spec *spec, mf_model *m) {
    char path[512];
    snprintf(path, sizeof path, "%s/config.json", dir);
    mf_write_str(path, mf_config_json(spec, NULL));
    mf_tensor **list = malloc(m->n * sizeof *list);
    ck_assert(list != NULL);
    if (spec->n_shards == 0) {
        for (size_t i = 0; i < m->n; i++) list[i] = &m->t[i];
        snprintf(path, sizeof path, "%s/model.safetensors", dir);
        mf_write_safetensors(path, list, m->n);
        free(list);
        return;
    }
    const int ns = spec->n_shards;
    sbuf idx = {0};
    sb_printf(&idx, "{\n  \"metadata\": {\"total_size\": 0},\n  \"weight_map\": {");
    for (int s = 0; s < ns; s++) {
        size_t k = 0;
        char file[64];
        snprintf(file, sizeof file, "model-%05d-of-%05d.safetensors", s + 1, ns);
        for (size_t i = (size_t)s; i < m->n; i += (size_t)ns) {
            list[k++] = &m->t[i];
            sb_printf(&idx, "%s\n    \"%s\": \"%s\"", idx.p[idx.len - 1] == '{' ? "" : ",", m->t[i].hf, file);
        }
        snprintf(path, sizeof path, "%s/%s", dir, file);
        mf_write_safetensors(path, list, k);
    }
    sb_printf(&idx, "\n  }\n}\n");
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    mf_write_str(path, idx.p);
    free(idx.p);
    free(list);
}

/* ---- llama2.c ------------------------------------------------------------------------------------- */

uint8_t *mf_llama2c_image(size_t *size, int dim, int hidden, int n_layers, int n_heads, int n_kv_heads,
                          int vocab, int seq_len) {
    const size_t V = (size_t)(vocab < 0 ? -vocab : vocab), d = (size_t)dim, L = (size_t)n_layers,
                 head = d / (size_t)n_heads, kvd = head * (size_t)n_kv_heads, ff = (size_t)hidden;
    const size_t nf = V * d + 2 * L * d + 2 * L * d * d + 2 * L * d * kvd + 3 * L * d * ff + d +
                      (size_t)seq_len * head + (vocab < 0 ? V * d : 0);
    ck_assert_msg(nf < (1u << 24), "image too large for exact float indices");
    *size = 28 + 4 * nf;
    uint8_t *buf = malloc(*size);
    ck_assert(buf != NULL);
    const int32_t h[7] = {dim, hidden, n_layers, n_heads, n_kv_heads, vocab, seq_len};
    for (int i = 0; i < 7; i++) kv_store_u32le(buf + 4 * i, (uint32_t)h[i]);
    for (size_t i = 0; i < nf; i++) kv_store_f32le(buf + 28 + 4 * i, (float)i);
    return buf;
}

/* ---- GGUF ------------------------------------------------------------------------------------------ */

static void gguf_tensor(kv_gguf_writer *w, mf_model *m, kv_rng *rng, const mf_gguf_opts *o, const char *name,
                        int dtype, uint64_t ne0, uint64_t ne1) {
    if (o->omit_tensor && strcmp(o->omit_tensor, name) == 0) return;
    if (o->q8_1_tensor && strcmp(name, "blk.0.ffn_norm.weight") == 0) dtype = KV_DTYPE_Q8_1;
    const size_t n = (size_t)(ne0 * ne1);
    float *vals = malloc(n * sizeof(float));
    size_t row = 0;
    ck_assert_kv_ok(kv_dtype_row_bytes(&row, dtype, ne0));
    uint8_t *bytes = calloc(row * ne1 + 1, 1);
    ck_assert(vals && bytes);
    if (dtype == KV_DTYPE_Q8_0 || dtype == KV_DTYPE_Q8_1) {
        /* Blocks of 32: f16 scale 2^-6 (exact), then int8 codes (Q8_1 adds an f16 sum). */
        const size_t bb = dtype == KV_DTYPE_Q8_0 ? 34 : 36, hdr = bb - 32;
        for (size_t b = 0; b < n / 32; b++) {
            uint8_t *blk = bytes + b * bb;
            kv_store_u16le(blk, kv_f32_to_f16(1.0f / 64.0f));
            for (size_t j = 0; j < 32; j++) {
                int8_t q = (int8_t)((int)(kv_rng_next_u64(rng) % 255) - 127);
                blk[hdr + j] = (uint8_t)q;
                vals[b * 32 + j] = (float)q / 64.0f;
            }
        }
    } else {
        for (size_t i = 0; i < n; i++) {
            float x = (float)(kv_rng_next_normal(rng) * 0.5);
            if (dtype == KV_DTYPE_F16) {
                uint16_t hv = kv_f32_to_f16(x);
                kv_store_u16le(bytes + 2 * i, hv);
                x = kv_f16_to_f32(hv);
            } else {
                kv_store_f32le(bytes + 4 * i, x);
            }
            vals[i] = x;
        }
    }
    const uint64_t ne[2] = {ne0, ne1};
    ck_assert_kv_ok(kv_gguf_writer_add_tensor(w, name, dtype, ne1 == 1 ? 1 : 2, ne, bytes));
    if (m) {
        m->t = realloc(m->t, (m->n + 1) * sizeof *m->t);
        ck_assert(m->t != NULL);
        mf_tensor *t = &m->t[m->n++];
        memset(t, 0, sizeof *t);
        snprintf(t->canon, sizeof t->canon, "%s", name);
        snprintf(t->hf, sizeof t->hf, "%s", name);
        t->dtype = dtype;
        t->rank = ne1 == 1 ? 1 : 2;
        t->shape[0] = ne1 == 1 ? ne0 : ne1; /* row-major order, as mf_check_values expects */
        t->shape[1] = ne1 == 1 ? 1 : ne0;
        t->n = n;
        t->values = vals;
    } else {
        free(vals);
    }
    free(bytes);
}

uint8_t *mf_gguf_tiny(size_t *size, const mf_gguf_opts *o, mf_model *expected) {
    const char *arch = o->arch ? o->arch : "llama";
    kv_gguf_writer *w = NULL;
    ck_assert_kv_ok(kv_gguf_writer_create(&w));
    char key[128];
#define KEY(suffix) (snprintf(key, sizeof key, "%s.%s", arch, suffix), key)
#define OMIT(k) (o->omit_key && strcmp(o->omit_key, (k)) == 0)
#define SET_U32(k, v) \
    if (!OMIT(k)) ck_assert_kv_ok(kv_gguf_writer_set_u32(w, k, v))
#define SET_F32(k, v) \
    if (!OMIT(k)) ck_assert_kv_ok(kv_gguf_writer_set_f32(w, k, v))
    if (!OMIT("general.architecture")) ck_assert_kv_ok(kv_gguf_writer_set_str(w, "general.architecture", arch));
    ck_assert_kv_ok(kv_gguf_writer_set_str(w, "general.name", "tiny test model"));
    if (o->block_count_as_string)
        ck_assert_kv_ok(kv_gguf_writer_set_str(w, KEY("block_count"), "2"));
    else
        SET_U32(KEY("block_count"), 2);
    SET_U32(KEY("context_length"), 128);
    SET_U32(KEY("embedding_length"), 64);
    SET_U32(KEY("feed_forward_length"), 96);
    SET_U32(KEY("attention.head_count"), 4);
    SET_U32(KEY("attention.head_count_kv"), 2);
    SET_U32(KEY("rope.dimension_count"), 16);
    SET_F32(KEY("attention.layer_norm_rms_epsilon"), 1e-5f);
    SET_F32(KEY("rope.freq_base"), 100000.0f);
    SET_U32("tokenizer.ggml.bos_token_id", 1);
    SET_U32("tokenizer.ggml.eos_token_id", 2);
#undef KEY
#undef OMIT
#undef SET_U32
#undef SET_F32
    kv_rng rng;
    kv_rng_init(&rng, 1234);
    if (expected) memset(expected, 0, sizeof *expected);
    gguf_tensor(w, expected, &rng, o, "token_embd.weight", KV_DTYPE_F32, 64, 40);
    gguf_tensor(w, expected, &rng, o, "output_norm.weight", KV_DTYPE_F32, 64, 1);
    if (!o->tied) gguf_tensor(w, expected, &rng, o, "output.weight", KV_DTYPE_F16, 64, 40);
    for (int l = 0; l < 2; l++) {
        char n[64];
#define T(suffix, dt, a, b) (snprintf(n, sizeof n, "blk.%d.%s", l, suffix), gguf_tensor(w, expected, &rng, o, n, dt, a, b))
        T("attn_norm.weight", KV_DTYPE_F32, 64, 1);
        T("ffn_norm.weight", KV_DTYPE_F32, 64, 1);
        T("attn_q.weight", KV_DTYPE_F16, 64, 64);
        T("attn_k.weight", KV_DTYPE_F16, 64, 32);
        T("attn_v.weight", KV_DTYPE_F16, 64, 32);
        if (o->qkv_bias) {
            T("attn_q.bias", KV_DTYPE_F32, 64, 1);
            T("attn_k.bias", KV_DTYPE_F32, 32, 1);
            T("attn_v.bias", KV_DTYPE_F32, 32, 1);
        }
        T("attn_output.weight", KV_DTYPE_F16, 64, 64);
        T("ffn_gate.weight", KV_DTYPE_Q8_0, 64, 96);
        T("ffn_up.weight", KV_DTYPE_Q8_0, 64, 96);
        T("ffn_down.weight", KV_DTYPE_Q8_0, 96, 64);
#undef T
    }
    uint8_t *buf = NULL;
    ck_assert_kv_ok(kv_gguf_writer_to_memory(w, &buf, size));
    kv_gguf_writer_free(w);
    return buf;
}

/* ---- assertions --------------------------------------------------------------------------------- */

void mf_check_values(const kv_model_file *mf, mf_model *m) {
    for (size_t i = 0; i < m->n; i++) {
        const mf_tensor *e = &m->t[i];
        if (!e->canon[0]) continue; /* in the file but not used (lm_head of a tied model) */
        const kv_tensor_info *t = kv_model_file_find(mf, e->canon);
        ck_assert_msg(t != NULL, "tensor %s (%s) not found", e->canon, e->hf);
        const uint64_t ne0 = e->rank == 2 ? e->shape[1] : e->shape[0], ne1 = e->rank == 2 ? e->shape[0] : 1;
        ck_assert_msg(t->ne[0] == ne0 && t->ne[1] == ne1 && t->ne[2] == 1 && t->ne[3] == 1,
                      "%s: shape [%llu, %llu], expected [%llu, %llu]", e->canon, (unsigned long long)t->ne[0],
                      (unsigned long long)t->ne[1], (unsigned long long)ne0, (unsigned long long)ne1);
        ck_assert_int_eq(t->n_dims, e->rank);
        ck_assert_int_eq(t->dtype, e->dtype);
        float *got = malloc(e->n * sizeof(float) + 1);
        ck_assert(got != NULL);
        ck_assert_kv_ok(kv_model_file_read_f32(mf, t, got));
        for (size_t j = 0; j < e->n; j++)
            ck_assert_msg(memcmp(&got[j], &e->values[j], sizeof(float)) == 0, "%s[%zu] = %.9g, expected %.9g",
                          e->canon, j, (double)got[j], (double)e->values[j]);
        free(got);
    }
}
