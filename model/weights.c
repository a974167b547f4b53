/* weights.c — building a kv_model: architecture checks, weights from a tensor source or a model
 * file (dequantized to f32, kept as f16 or in the file's blocks), all at once or part by part
 * (layer-streamed weights: kv_model_acquire / kv_model_release), RoPE frequencies, getters. */
#include "forward_internal.h"
#include "model_cuda.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <cblas.h>

#define KV_ALIGN 64

static kv_status check_arch(const kv_arch *a) {
    if (a->n_layers <= 0 || a->n_layers > 4096 || a->d_model <= 0 || a->d_model > (1 << 20) ||
        a->n_heads <= 0 || a->n_heads > 4096 || a->n_kv_heads <= 0 || a->n_kv_heads > a->n_heads ||
        a->head_dim <= 0 || a->head_dim > 4096 || (a->head_dim & 1) || a->d_ff <= 0 ||
        a->d_ff > (1 << 22) || a->vocab_size <= 0 || a->vocab_size > (1 << 24))
        return KV_ERR(KV_EINVAL,
                      "model architecture out of range: layers %d, d_model %d, heads %d/%d, head_dim %d, "
                      "d_ff %d, vocab %d",
                      a->n_layers, a->d_model, a->n_heads, a->n_kv_heads, a->head_dim, a->d_ff,
                      a->vocab_size);
    if (a->n_heads % a->n_kv_heads != 0)
        return KV_ERR(KV_EINVAL, "n_heads %d is not a multiple of n_kv_heads %d", a->n_heads, a->n_kv_heads);
    if (!(a->rms_eps > 0.0f) || !(a->rope_theta > 0.0f) || !isfinite(a->rope_theta))
        return KV_ERR(KV_EINVAL, "model architecture: rms_eps %g and rope_theta %g must be positive",
                      (double)a->rms_eps, (double)a->rope_theta);
    if (a->rope_layout != KV_ROPE_ADJACENT && a->rope_layout != KV_ROPE_HALF)
        return KV_ERR(KV_EINVAL, "unknown RoPE layout %d", (int)a->rope_layout);
    if (a->rope_scaling == KV_ROPE_SCALING_LINEAR && !(a->rope_factor > 0.0f))
        return KV_ERR(KV_EINVAL, "linear RoPE scaling needs a positive factor (got %g)", (double)a->rope_factor);
    if (a->rope_scaling == KV_ROPE_SCALING_LLAMA3 &&
        (!(a->rope_factor > 0.0f) || !(a->rope_high_freq_factor > a->rope_low_freq_factor) ||
         !(a->rope_low_freq_factor > 0.0f) || a->rope_orig_max_pos <= 0))
        return KV_ERR(KV_EINVAL,
                      "llama3 RoPE scaling needs factor > 0, high_freq_factor > low_freq_factor > 0 and "
                      "original_max_position_embeddings > 0 (got %g, %g, %g, %d)",
                      (double)a->rope_factor, (double)a->rope_high_freq_factor,
                      (double)a->rope_low_freq_factor, a->rope_orig_max_pos);
    if (a->rope_scaling != KV_ROPE_SCALING_NONE && a->rope_scaling != KV_ROPE_SCALING_LINEAR &&
        a->rope_scaling != KV_ROPE_SCALING_LLAMA3)
        return KV_ERR(KV_EINVAL, "unknown RoPE scaling %d", (int)a->rope_scaling);
    if (a->ffn_act != KV_FFN_SILU && a->ffn_act != KV_FFN_GELU_TANH)
        return KV_ERR(KV_EINVAL, "unknown FFN activation %d", (int)a->ffn_act);
    if (a->sliding_window < 0 || a->swa_pattern < 0 || !(a->embed_scale >= 0.0f) || !isfinite(a->embed_scale) ||
        !(a->attn_scale >= 0.0f) || !isfinite(a->attn_scale) || !(a->final_logit_softcap >= 0.0f) ||
        !isfinite(a->final_logit_softcap) || !(a->rope_theta_local >= 0.0f) || !isfinite(a->rope_theta_local))
        return KV_ERR(KV_EINVAL,
                      "model architecture: sliding_window %d, pattern %d, embedding scale %g, attention scale %g, "
                      "logit softcap %g and local rope_theta %g must be finite and >= 0",
                      a->sliding_window, a->swa_pattern, (double)a->embed_scale, (double)a->attn_scale,
                      (double)a->final_logit_softcap, (double)a->rope_theta_local);
    return KV_OK;
}

/* 1 when the arch uses anything the GPU forward (model/cuda) does not implement. */
static int needs_cpu_forward(const kv_arch *a) {
    return a->qk_norm || a->post_norms || a->ffn_act != KV_FFN_SILU || (a->embed_scale != 0.0f && a->embed_scale != 1.0f) ||
           a->final_logit_softcap > 0.0f || a->sliding_window > 0 ||
           (a->attn_scale > 0.0f && fabs(kv_arch_attn_scale(a) * sqrt((double)a->head_dim) - 1.0) > 1e-7);
}

/* Inverse frequencies: base theta^(-2i/hd), then the scaling (HF _compute_llama3_parameters /
 * linear), then optional per-pair divisors (GGUF rope_freqs.weight, llama.cpp's form of llama3). */
static void compute_inv_freq(double *inv, const kv_arch *a, const float *freq_factors) {
    const int half = a->head_dim / 2;
    for (int i = 0; i < half; i++) {
        double f = 1.0 / pow((double)a->rope_theta, (double)(2 * i) / (double)a->head_dim);
        if (freq_factors) {
            f /= (double)freq_factors[i];
        } else if (a->rope_scaling == KV_ROPE_SCALING_LINEAR) {
            f /= (double)a->rope_factor;
        } else if (a->rope_scaling == KV_ROPE_SCALING_LLAMA3) {
            const double factor = a->rope_factor, lo = a->rope_low_freq_factor, hi = a->rope_high_freq_factor;
            const double old_ctx = (double)a->rope_orig_max_pos;
            const double low_freq_wavelen = old_ctx / lo, high_freq_wavelen = old_ctx / hi;
            const double wavelen = 2.0 * 3.14159265358979323846 / f;
            if (wavelen > low_freq_wavelen) {
                f = f / factor;
            } else if (wavelen >= high_freq_wavelen) { /* medium band: interpolate */
                const double smooth = (old_ctx / wavelen - lo) / (hi - lo);
                f = (1.0 - smooth) * f / factor + smooth * f;
            }
        }
        inv[i] = f;
    }
}

/* Local (sliding-window) layers: base rope_theta_local and no scaling (llama.cpp's freq_scale_swa = 1,
 * src/llama-hparams.h:129; HF Gemma 3's sliding_attention rope parameters are "default"). */
static void compute_inv_freq_local(double *inv, const kv_arch *a) {
    const int half = a->head_dim / 2;
    const double theta = a->rope_theta_local > 0.0f ? (double)a->rope_theta_local : (double)a->rope_theta;
    for (int i = 0; i < half; i++) inv[i] = 1.0 / pow(theta, (double)(2 * i) / (double)a->head_dim);
}

static void owned_matrix_free(kv_model *m, kv_owned_matrix *om) {
    kv_aligned_free(om->data);
    m->weight_bytes -= om->bytes;
    memset(om, 0, sizeof *om);
}

static void vec_free(kv_model *m, float **v, size_t n) {
    if (*v) m->weight_bytes -= n * sizeof(float);
    kv_aligned_free(*v);
    *v = NULL;
}

/* The source's bytes of `name` are not needed any more (the file source releases its pages). */
static void source_done(const kv_model *m, const char *name) {
    if (m->src_raw && m->src_raw->done) m->src_raw->done(m->src_user, name);
}

/* A tensor source's failure: KV_OK for an optional tensor that is absent (nothing is read), the
 * status with a message otherwise. */
static kv_status read_failed(kv_status s, const char *name, int optional) {
    if (s == KV_ENOTFOUND && optional) {
        kv_error_clear();
        return KV_OK;
    }
    if (s == KV_ENOTFOUND && !*kv_error_last()) return KV_ERR(KV_ENOTFOUND, "model has no tensor '%s'", name);
    return s;
}

/* Read a vector tensor (always f32). optional: KV_ENOTFOUND leaves *out NULL. */
static kv_status read_vec(kv_model *m, float **out, const char *name, uint64_t n, int optional) {
    *out = NULL;
    float *buf = kv_aligned_alloc(KV_ALIGN, (size_t)n * sizeof(float));
    if (!buf) return KV_ERR(KV_ENOMEM, "out of memory for tensor '%s'", name);
    const uint64_t ne[4] = {n, 1, 1, 1};
    kv_error_clear();
    kv_status s = m->src_read(m->src_user, name, 1, ne, buf);
    if (s != KV_OK) {
        kv_aligned_free(buf);
        return read_failed(s, name, optional);
    }
    source_done(m, name);
    m->weight_bytes += (size_t)n * sizeof(float);
    *out = buf;
    return KV_OK;
}

/* Keep a matrix in its stored blocks (KV_WEIGHTS_NATIVE): 1 when done, 0 when the tensor is not
 * quantized (or f16) and should be read as f32, or a negative status. f16_ok = 0 reads f16 tensors
 * as f32 too (only quantized blocks are kept). */
static int read_native(kv_model *m, kv_owned_matrix *om, const char *name, int rows, int cols, int f16_ok,
                       kv_status *status) {
    const uint64_t ne[4] = {(uint64_t)cols, (uint64_t)rows, 1, 1};
    int dtype = -1;
    const uint8_t *data = NULL;
    size_t row_bytes = 0;
    kv_error_clear();
    kv_status s = m->src_raw->raw(m->src_user, name, 2, ne, &dtype, &data, &row_bytes);
    if (s != KV_OK) {
        *status = s;
        return -1;
    }
    if (dtype == KV_DTYPE_F32 || dtype == KV_DTYPE_BF16 || !kv_dtype_can_dequantize(dtype)) return 0;
    if (dtype == KV_DTYPE_F16 && !f16_ok) return 0;
    size_t expect = 0;
    if (kv_dtype_row_bytes(&expect, dtype, (uint64_t)cols) != KV_OK || expect != row_bytes) {
        *status = KV_ERR(KV_EFORMAT, "tensor '%s': rows of %zu bytes, %s needs %zu", name, row_bytes,
                         kv_dtype_name(dtype), expect);
        return -1;
    }
    const size_t bytes = row_bytes * (size_t)rows;
    uint8_t *copy = kv_aligned_alloc(KV_ALIGN, bytes);
    if (!copy) {
        *status = KV_ERR(KV_ENOMEM, "out of memory for tensor '%s' (%zu bytes)", name, bytes);
        return -1;
    }
    memcpy(copy, data, bytes);
    source_done(m, name);
    om->data = copy;
    om->bytes = bytes;
    om->m.rows = rows;
    om->m.cols = cols;
    if (dtype == KV_DTYPE_F16) {
        om->m.f16 = (const uint16_t *)copy; /* little-endian host */
    } else {
        om->m.q = copy;
        om->m.q_dtype = dtype;
        om->m.q_row_bytes = row_bytes;
    }
    m->weight_bytes += bytes;
    return 1;
}

/* Read a rows x cols matrix (GGML ne = {cols, rows}) stored as `storage`: native blocks, f32, or f16
 * (converted from an f32 read of the whole matrix, held only during the call). */
static kv_status read_mat(kv_model *m, kv_owned_matrix *om, const char *name, int rows, int cols,
                          kv_weight_storage storage, int optional) {
    memset(om, 0, sizeof *om);
    const size_t n = (size_t)rows * (size_t)cols;
    const uint64_t ne[4] = {(uint64_t)cols, (uint64_t)rows, 1, 1};
    kv_status s = KV_OK;
    if (storage == KV_WEIGHTS_NATIVE && m->src_raw) {
        const int r = read_native(m, om, name, rows, cols, m->opt.weights == KV_WEIGHTS_NATIVE, &s);
        if (r > 0) return KV_OK;
        if (r < 0) return read_failed(s, name, optional);
    }
    const int f16 = storage == KV_WEIGHTS_F16;
    float *dst = kv_aligned_alloc(KV_ALIGN, n * sizeof(float));
    if (!dst) return KV_ERR(KV_ENOMEM, "out of memory for tensor '%s' (%d x %d)", name, rows, cols);
    kv_error_clear();
    s = m->src_read(m->src_user, name, 2, ne, dst);
    if (s != KV_OK) {
        kv_aligned_free(dst);
        return read_failed(s, name, optional);
    }
    source_done(m, name);
    om->m.rows = rows;
    om->m.cols = cols;
    if (f16) {
        uint16_t *h = kv_aligned_alloc(KV_ALIGN, n * sizeof(uint16_t));
        if (!h) {
            kv_aligned_free(dst);
            return KV_ERR(KV_ENOMEM, "out of memory for tensor '%s' (%d x %d)", name, rows, cols);
        }
        for (size_t i = 0; i < n; i++) h[i] = kv_f32_to_f16(dst[i]);
        kv_aligned_free(dst);
        om->data = h;
        om->bytes = n * sizeof(uint16_t);
        om->m.f16 = h;
    } else {
        om->data = dst;
        om->bytes = n * sizeof(float);
        om->m.f32 = dst;
    }
    m->weight_bytes += om->bytes;
    return KV_OK;
}

/* ---- parts: the embedding, the output, each layer ------------------------------------------------ */
static size_t held_index(int part) {
    return part == KV_MODEL_PART_EMBED ? 0 : part == KV_MODEL_PART_OUTPUT ? 1 : (size_t)part + 2;
}

static int valid_part(const kv_model *m, int part) {
    return part == KV_MODEL_PART_EMBED || part == KV_MODEL_PART_OUTPUT || (part >= 0 && part < m->arch.n_layers);
}

static void free_layer(kv_model *m, int l) {
    const kv_arch *a = &m->arch;
    const size_t d = (size_t)a->d_model, qd = (size_t)a->n_heads * a->head_dim, kvd = (size_t)a->n_kv_heads * a->head_dim;
    kv_layer_storage *st = &m->store[l];
    owned_matrix_free(m, &st->wq);
    owned_matrix_free(m, &st->wk);
    owned_matrix_free(m, &st->wv);
    owned_matrix_free(m, &st->wo);
    owned_matrix_free(m, &st->w_gate);
    owned_matrix_free(m, &st->w_up);
    owned_matrix_free(m, &st->w_down);
    vec_free(m, &st->attn_norm, d);
    vec_free(m, &st->ffn_norm, d);
    vec_free(m, &st->bq, qd);
    vec_free(m, &st->bk, kvd);
    vec_free(m, &st->bv, kvd);
    vec_free(m, &st->q_norm, (size_t)a->head_dim);
    vec_free(m, &st->k_norm, (size_t)a->head_dim);
    vec_free(m, &st->post_attn_norm, d);
    vec_free(m, &st->post_ffn_norm, d);
    memset(&m->layers[l], 0, sizeof m->layers[l]);
}

static kv_status load_layer(kv_model *m, int l) {
    const kv_arch *a = &m->arch;
    const int d = a->d_model, hd = a->head_dim;
    const int qd = a->n_heads * hd, kvd = a->n_kv_heads * hd, ff = a->d_ff;
    const kv_weight_storage w = m->opt.weights;
    kv_layer_storage *st = &m->store[l];
    char name[96];
    kv_status s = KV_OK;
#define MAT(field, suffix, rows, cols)                                                           \
    do {                                                                                         \
        snprintf(name, sizeof name, "blk.%d.%s", l, suffix);                                     \
        if ((s = read_mat(m, &st->field, name, rows, cols, w, 0)) != KV_OK) goto done;           \
    } while (0)
#define VEC(field, suffix, n, optional)                                                          \
    do {                                                                                         \
        snprintf(name, sizeof name, "blk.%d.%s", l, suffix);                                     \
        if ((s = read_vec(m, &st->field, name, (uint64_t)(n), optional)) != KV_OK) goto done;    \
    } while (0)
    VEC(attn_norm, "attn_norm.weight", d, 0);
    MAT(wq, "attn_q.weight", qd, d);
    MAT(wk, "attn_k.weight", kvd, d);
    MAT(wv, "attn_v.weight", kvd, d);
    MAT(wo, "attn_output.weight", d, qd);
    if (a->qkv_bias) {
        VEC(bq, "attn_q.bias", qd, 0);
        VEC(bk, "attn_k.bias", kvd, 0);
        VEC(bv, "attn_v.bias", kvd, 0);
    }
    if (a->qk_norm) {
        VEC(q_norm, "attn_q_norm.weight", hd, 0);
        VEC(k_norm, "attn_k_norm.weight", hd, 0);
    }
    if (a->post_norms) {
        VEC(post_attn_norm, "post_attention_norm.weight", d, 0);
        VEC(post_ffn_norm, "post_ffw_norm.weight", d, 0);
    }
    VEC(ffn_norm, "ffn_norm.weight", d, 0);
    MAT(w_gate, "ffn_gate.weight", ff, d);
    MAT(w_up, "ffn_up.weight", ff, d);
    MAT(w_down, "ffn_down.weight", d, ff);
#undef MAT
#undef VEC
    kv_layer_weights *lw = &m->layers[l];
    lw->attn_norm = st->attn_norm;
    lw->ffn_norm = st->ffn_norm;
    lw->wq = st->wq.m;
    lw->wk = st->wk.m;
    lw->wv = st->wv.m;
    lw->wo = st->wo.m;
    lw->bq = st->bq;
    lw->bk = st->bk;
    lw->bv = st->bv;
    lw->w_gate = st->w_gate.m;
    lw->w_up = st->w_up.m;
    lw->w_down = st->w_down.m;
    lw->q_norm = st->q_norm;
    lw->k_norm = st->k_norm;
    lw->post_attn_norm = st->post_attn_norm;
    lw->post_ffn_norm = st->post_ffn_norm;
done:
    if (s != KV_OK) free_layer(m, l);
    return s;
}

/* The embedding. Streamed, quantized blocks stay blocks whatever the storage: a lookup decodes a
 * row to the same f32 values as a dequantized table, and the table is the largest tensor. */
static kv_status load_embed(kv_model *m) {
    const kv_weight_storage w = m->stream && m->opt.weights == KV_WEIGHTS_F32 ? KV_WEIGHTS_NATIVE : m->opt.weights;
    return read_mat(m, &m->tok_embd, "token_embd.weight", m->arch.vocab_size, m->arch.d_model, w, 0);
}

static void free_output(kv_model *m) {
    vec_free(m, &m->output_norm, (size_t)m->arch.d_model);
    if (m->output.data) owned_matrix_free(m, &m->output);
    memset(&m->output, 0, sizeof m->output);
}

/* Output norm and matrix; tied (or a file that ties without saying so): the embedding's matrix,
 * which the caller has loaded. */
static kv_status load_output(kv_model *m) {
    kv_status s = read_vec(m, &m->output_norm, "output_norm.weight", (uint64_t)m->arch.d_model, 0);
    if (s != KV_OK) return s;
    if (!m->arch.tied_embeddings &&
        (s = read_mat(m, &m->output, "output.weight", m->arch.vocab_size, m->arch.d_model, m->opt.weights, 1)) != KV_OK) {
        free_output(m);
        return s;
    }
    if (!m->output.data) {
        m->output.m = m->tok_embd.m;
        m->arch.tied_embeddings = 1;
    }
    return KV_OK;
}

kv_status kv_model_acquire(kv_model *m, int part) {
    if (!m || !valid_part(m, part)) return KV_ERR(KV_EINVAL, "kv_model_acquire: no part %d", part);
    unsigned char *held = &m->held[held_index(part)];
    if (*held) return KV_OK;
    kv_status s;
    if (part == KV_MODEL_PART_EMBED) {
        s = load_embed(m);
    } else if (part == KV_MODEL_PART_OUTPUT) {
        /* tied: the output reads the embedding's matrix; a streamed embedding may be in blocks
         * that a product can read (native), so hold it with the output */
        if ((s = kv_model_acquire(m, KV_MODEL_PART_EMBED)) != KV_OK) return s;
        s = load_output(m);
    } else {
        s = load_layer(m, part);
    }
    if (s != KV_OK) return s;
    *held = 1;
    return KV_OK;
}

void kv_model_release(kv_model *m, int part) {
    if (!m || !m->stream || !valid_part(m, part)) return;
    unsigned char *held = &m->held[held_index(part)];
    if (!*held) return;
    if (part == KV_MODEL_PART_EMBED) {
        if (m->held[1]) return; /* the output still reads it (released with the output) */
        owned_matrix_free(m, &m->tok_embd);
    } else if (part == KV_MODEL_PART_OUTPUT) {
        free_output(m);
        m->held[1] = 0;
        kv_model_release(m, KV_MODEL_PART_EMBED);
    } else {
        free_layer(m, part);
    }
    *held = 0;
    source_done(m, NULL); /* pages of the source mapped around the part's tensors, too */
}

int kv_model_streamed(const kv_model *m) { return m && m->stream; }

int kv_model_holds(const kv_model *m, int part) {
    return m && valid_part(m, part) && m->held[held_index(part)];
}

kv_status kv_model_require(const kv_model *m, int part) {
    if (kv_model_holds(m, part)) return KV_OK;
    if (part == KV_MODEL_PART_EMBED)
        return KV_ERR(KV_EINVAL, "the model's embedding is not loaded (streamed weights: kv_model_acquire)");
    if (part == KV_MODEL_PART_OUTPUT)
        return KV_ERR(KV_EINVAL, "the model's output weights are not loaded (streamed weights: kv_model_acquire)");
    return KV_ERR(KV_EINVAL, "layer %d's weights are not loaded (streamed weights: kv_model_acquire)", part);
}

void kv_model_free(kv_model *m) {
    if (!m) return;
    kv_model_cuda_free(m->gpu);
    if (m->store && m->layers)
        for (int l = 0; l < m->arch.n_layers; l++) free_layer(m, l);
    free_output(m);
    owned_matrix_free(m, &m->tok_embd);
    free(m->held);
    free(m->store);
    free(m->layers);
    free(m->inv_freq_d);
    free(m->inv_freq);
    free(m->inv_freq_local_d);
    free(m->inv_freq_local);
    kv_pool_free(m->pool);
    kv_workspace *w = &m->ws;
    kv_aligned_free(w->x);
    kv_aligned_free(w->q);
    kv_aligned_free(w->q_pre);
    kv_aligned_free(w->k);
    kv_aligned_free(w->k_pre);
    kv_aligned_free(w->v);
    kv_aligned_free(w->att);
    kv_aligned_free(w->proj);
    kv_aligned_free(w->gate);
    kv_aligned_free(w->up);
    for (int i = 0; i < 2; i++) {
        kv_aligned_free(w->rope_cos[i]);
        kv_aligned_free(w->rope_sin[i]);
        kv_aligned_free(w->rope_pos[i]);
    }
    kv_aligned_free(w->pos);
    kv_aligned_free(w->hres);
    kv_aligned_free(w->scores);
    kv_aligned_free(w->deq);
    kv_aligned_free(w->rowbuf);
    free(m);
}

kv_status kv_model_create(kv_model **out, const kv_arch *arch, kv_tensor_read_fn read, void *user,
                          const kv_model_options *opt) {
    return kv_model_create_raw(out, arch, read, NULL, user, opt, 0);
}

kv_status kv_model_create_streamed(kv_model **out, const kv_arch *arch, kv_tensor_read_fn read, void *user,
                                   const kv_model_options *opt) {
    return kv_model_create_raw(out, arch, read, NULL, user, opt, 1);
}

kv_status kv_model_create_raw(kv_model **out, const kv_arch *arch, kv_tensor_read_fn read,
                              const kv_model_raw_source *raw, void *user, const kv_model_options *opt, int stream) {
    if (!out || !arch || !read) return KV_ERR(KV_EINVAL, "kv_model_create: NULL argument");
    *out = NULL;
    kv_status s = check_arch(arch);
    if (s != KV_OK) return s;
    kv_model *m = calloc(1, sizeof *m);
    if (!m) return KV_ERR(KV_ENOMEM, "out of memory for the model");
    m->arch = *arch;
    m->isa = -1;
    if (opt) m->opt = *opt;
    m->stream = stream != 0;
    m->src_read = read;
    m->src_raw = raw && raw->raw ? (kv_model_raw_source *)raw : NULL;
    m->src_user = user;
    kv_model_set_threads(m, m->opt.n_threads);
    const kv_arch *a = &m->arch;
    const int L = a->n_layers, hd = a->head_dim;
    float *freq_factors = NULL;

    if (m->opt.weights != KV_WEIGHTS_F32 && m->opt.weights != KV_WEIGHTS_F16 &&
        m->opt.weights != KV_WEIGHTS_NATIVE) {
        s = KV_ERR(KV_EINVAL, "unknown weight storage %d", (int)m->opt.weights);
        goto done;
    }
    m->store = calloc((size_t)L, sizeof *m->store);
    m->layers = calloc((size_t)L, sizeof *m->layers);
    m->held = calloc((size_t)L + 2, 1);
    m->inv_freq_d = calloc((size_t)hd / 2, sizeof(double));
    m->inv_freq = calloc((size_t)hd / 2, sizeof(float));
    if (!m->store || !m->layers || !m->held || !m->inv_freq_d || !m->inv_freq) {
        s = KV_ERR(KV_ENOMEM, "out of memory for the model");
        goto done;
    }
    if (!m->stream) {
        if ((s = kv_model_acquire(m, KV_MODEL_PART_EMBED)) != KV_OK) goto done;
        if ((s = kv_model_acquire(m, KV_MODEL_PART_OUTPUT)) != KV_OK) goto done;
        for (int l = 0; l < L; l++)
            if ((s = kv_model_acquire(m, l)) != KV_OK) goto done;
    }
    /* llama.cpp's GGUF form of llama3 scaling: per-pair frequency divisors. */
    if ((s = read_vec(m, &freq_factors, "rope_freqs.weight", (uint64_t)hd / 2, 1)) != KV_OK) goto done;
    if (freq_factors) {
        m->weight_bytes -= (size_t)hd / 2 * sizeof(float);
        for (int i = 0; i < hd / 2; i++)
            if (!(freq_factors[i] > 0.0f)) {
                s = KV_ERR(KV_EFORMAT, "rope_freqs.weight[%d] = %g is not positive", i, (double)freq_factors[i]);
                goto done;
            }
    }
    compute_inv_freq(m->inv_freq_d, &m->arch, freq_factors);
    for (int i = 0; i < hd / 2; i++) m->inv_freq[i] = (float)m->inv_freq_d[i];
    if (a->sliding_window > 0) {
        m->inv_freq_local_d = calloc((size_t)hd / 2, sizeof(double));
        m->inv_freq_local = calloc((size_t)hd / 2, sizeof(float));
        if (!m->inv_freq_local_d || !m->inv_freq_local) {
            s = KV_ERR(KV_ENOMEM, "out of memory for the model");
            goto done;
        }
        compute_inv_freq_local(m->inv_freq_local_d, a);
        for (int i = 0; i < hd / 2; i++) m->inv_freq_local[i] = (float)m->inv_freq_local_d[i];
    }
    m->q_fold = kv_arch_attn_scale(a) * sqrt((double)hd);
    if (fabs(m->q_fold - 1.0) <= 1e-7) m->q_fold = 1.0;
    s = KV_OK;
    if (m->opt.device == KV_MODEL_DEVICE_CUDA) {
        s = m->stream ? KV_ERR(KV_EUNSUPPORTED, "model: layer-streamed weights run on the CPU only")
            : needs_cpu_forward(a)
                ? KV_ERR(KV_EUNSUPPORTED, "model: the GPU forward implements the Llama-family block only; '%s' (QK-norm, "
                         "post-norms, GELU gating, scaled embeddings, sliding windows) runs on the CPU", a->arch)
                : kv_model_cuda_open(m);
    } else if (m->opt.device != KV_MODEL_DEVICE_CPU) {
        s = KV_ERR(KV_EINVAL, "unknown model device %d", (int)m->opt.device);
    }
done:
    kv_aligned_free(freq_factors);
    if (s != KV_OK) {
        kv_model_free(m);
        return s;
    }
    *out = m;
    return KV_OK;
}

/* ---- getters -------------------------------------------------------------------------------- */
const kv_arch *kv_model_arch(const kv_model *m) { return &m->arch; }

const kv_layer_weights *kv_model_layer(const kv_model *m, int layer) {
    if (!m || layer < 0 || layer >= m->arch.n_layers) return NULL;
    return &m->layers[layer];
}

kv_matrix kv_model_token_embedding(const kv_model *m) { return m->tok_embd.m; }
kv_matrix kv_model_output_weight(const kv_model *m) { return m->output.m; }
const float *kv_model_output_norm(const kv_model *m) { return m->output_norm; }
const float *kv_model_rope_inv_freq(const kv_model *m) { return m->inv_freq; }
const double *kv_model_rope_inv_freq_d(const kv_model *m) { return m->inv_freq_d; }
const double *kv_model_rope_inv_freq_layer(const kv_model *m, int layer) {
    if (!m || layer < 0 || layer >= m->arch.n_layers) return NULL;
    return kv_arch_layer_is_local(&m->arch, layer) && m->inv_freq_local_d ? m->inv_freq_local_d : m->inv_freq_d;
}
size_t kv_model_weight_bytes(const kv_model *m) { return m->weight_bytes; }
int kv_model_threads(const kv_model *m) { return m->n_threads; }

void kv_model_set_threads(kv_model *m, int n_threads) {
    if (n_threads <= 0) n_threads = kv_default_threads();
    if (m->pool && kv_pool_threads(m->pool) != n_threads) {
        kv_pool_free(m->pool);
        m->pool = NULL;
    }
    m->n_threads = n_threads;
    m->blas_threads = 0;
    kv_model_blas_threads(m, n_threads);
}

kv_pool *kv_model_pool(kv_model *m) {
    /* created on first use; if that fails, kv_pool_run(NULL, ...) runs the work on the caller */
    if (!m->pool && m->n_threads > 1 && kv_pool_create(&m->pool, m->n_threads) != KV_OK) {
        kv_error_clear();
        m->pool = NULL;
    }
    return m->pool;
}

void kv_model_blas_threads(kv_model *m, int n) {
    if (m->blas_threads == n) return;
    openblas_set_num_threads(n);
    m->blas_threads = n;
}

kv_model_device kv_model_device_of(const kv_model *m) { return m && m->gpu ? KV_MODEL_DEVICE_CUDA : KV_MODEL_DEVICE_CPU; }
size_t kv_model_device_weight_bytes(const kv_model *m) { return kv_model_cuda_weight_bytes(m); }
