/* weights.c — building a kv_model: architecture checks, weights from a tensor source or a model
 * file (dequantized to f32, or kept as f16), RoPE frequencies, getters. */
#include "forward_internal.h"

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
    return KV_OK;
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

static void owned_matrix_free(kv_owned_matrix *om) {
    kv_aligned_free(om->data);
    om->data = NULL;
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
static kv_status read_vec(kv_model *m, float **out, kv_tensor_read_fn read, void *user, const char *name,
                          uint64_t n, int optional) {
    *out = NULL;
    float *buf = kv_aligned_alloc(KV_ALIGN, (size_t)n * sizeof(float));
    if (!buf) return KV_ERR(KV_ENOMEM, "out of memory for tensor '%s'", name);
    const uint64_t ne[4] = {n, 1, 1, 1};
    kv_error_clear();
    kv_status s = read(user, name, 1, ne, buf);
    if (s != KV_OK) {
        kv_aligned_free(buf);
        return read_failed(s, name, optional);
    }
    m->weight_bytes += (size_t)n * sizeof(float);
    *out = buf;
    return KV_OK;
}

/* Keep a matrix in its stored blocks (KV_WEIGHTS_NATIVE): 1 when done, 0 when the tensor is not
 * quantized (or f16) and should be read as f32, or a negative status. */
static int read_native(kv_model *m, kv_owned_matrix *om, kv_tensor_raw_fn raw, void *user, const char *name,
                       int rows, int cols, kv_status *status) {
    const uint64_t ne[4] = {(uint64_t)cols, (uint64_t)rows, 1, 1};
    int dtype = -1;
    const uint8_t *data = NULL;
    size_t row_bytes = 0;
    kv_error_clear();
    kv_status s = raw(user, name, 2, ne, &dtype, &data, &row_bytes);
    if (s != KV_OK) {
        *status = s;
        return -1;
    }
    if (dtype == KV_DTYPE_F32 || dtype == KV_DTYPE_BF16 || !kv_dtype_can_dequantize(dtype)) return 0;
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
    om->data = copy;
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

/* Read a rows x cols matrix (GGML ne = {cols, rows}): native blocks, f32, or f16 through `tmp`. */
static kv_status read_mat(kv_model *m, kv_owned_matrix *om, kv_tensor_read_fn read, kv_tensor_raw_fn raw,
                          void *user, const char *name, int rows, int cols, float *tmp, int optional) {
    memset(om, 0, sizeof *om);
    const size_t n = (size_t)rows * (size_t)cols;
    const uint64_t ne[4] = {(uint64_t)cols, (uint64_t)rows, 1, 1};
    kv_status s = KV_OK;
    if (m->opt.weights == KV_WEIGHTS_NATIVE && raw) {
        const int r = read_native(m, om, raw, user, name, rows, cols, &s);
        if (r > 0) return KV_OK;
        if (r < 0) return read_failed(s, name, optional);
    }
    const int f16 = m->opt.weights == KV_WEIGHTS_F16;
    float *dst = f16 ? tmp : kv_aligned_alloc(KV_ALIGN, n * sizeof(float));
    if (!dst) return KV_ERR(KV_ENOMEM, "out of memory for tensor '%s' (%d x %d)", name, rows, cols);
    kv_error_clear();
    s = read(user, name, 2, ne, dst);
    if (s != KV_OK) {
        if (!f16) kv_aligned_free(dst);
        return read_failed(s, name, optional);
    }
    om->m.rows = rows;
    om->m.cols = cols;
    if (f16) {
        uint16_t *h = kv_aligned_alloc(KV_ALIGN, n * sizeof(uint16_t));
        if (!h) return KV_ERR(KV_ENOMEM, "out of memory for tensor '%s' (%d x %d)", name, rows, cols);
        for (size_t i = 0; i < n; i++) h[i] = kv_f32_to_f16(tmp[i]);
        om->data = h;
        om->m.f16 = h;
        m->weight_bytes += n * sizeof(uint16_t);
    } else {
        om->data = dst;
        om->m.f32 = dst;
        m->weight_bytes += n * sizeof(float);
    }
    return KV_OK;
}

void kv_model_free(kv_model *m) {
    if (!m) return;
    owned_matrix_free(&m->tok_embd);
    owned_matrix_free(&m->output);
    kv_aligned_free(m->output_norm);
    if (m->store) {
        for (int l = 0; l < m->arch.n_layers; l++) {
            kv_layer_storage *st = &m->store[l];
            owned_matrix_free(&st->wq);
            owned_matrix_free(&st->wk);
            owned_matrix_free(&st->wv);
            owned_matrix_free(&st->wo);
            owned_matrix_free(&st->w_gate);
            owned_matrix_free(&st->w_up);
            owned_matrix_free(&st->w_down);
            kv_aligned_free(st->attn_norm);
            kv_aligned_free(st->ffn_norm);
            kv_aligned_free(st->bq);
            kv_aligned_free(st->bk);
            kv_aligned_free(st->bv);
        }
    }
    free(m->store);
    free(m->layers);
    free(m->inv_freq_d);
    free(m->inv_freq);
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
    kv_aligned_free(w->rope_cos);
    kv_aligned_free(w->rope_sin);
    kv_aligned_free(w->pos);
    kv_aligned_free(w->rope_pos);
    kv_aligned_free(w->hres);
    kv_aligned_free(w->scores);
    kv_aligned_free(w->deq);
    kv_aligned_free(w->rowbuf);
    free(m);
}

kv_status kv_model_create(kv_model **out, const kv_arch *arch, kv_tensor_read_fn read, void *user,
                          const kv_model_options *opt) {
    return kv_model_create_raw(out, arch, read, NULL, user, opt);
}

kv_status kv_model_create_raw(kv_model **out, const kv_arch *arch, kv_tensor_read_fn read, kv_tensor_raw_fn raw,
                              void *user, const kv_model_options *opt) {
    if (!out || !arch || !read) return KV_ERR(KV_EINVAL, "kv_model_create: NULL argument");
    *out = NULL;
    kv_status s = check_arch(arch);
    if (s != KV_OK) return s;
    kv_model *m = calloc(1, sizeof *m);
    if (!m) return KV_ERR(KV_ENOMEM, "out of memory for the model");
    m->arch = *arch;
    m->isa = -1;
    if (opt) m->opt = *opt;
    kv_model_set_threads(m, m->opt.n_threads);
    const kv_arch *a = &m->arch;
    const int L = a->n_layers, d = a->d_model, hd = a->head_dim;
    const int qd = a->n_heads * hd, kvd = a->n_kv_heads * hd, ff = a->d_ff, V = a->vocab_size;
    float *tmp = NULL, *freq_factors = NULL;
    char name[96];

    /* The largest matrix bounds the f16 conversion buffer. */
    size_t maxn = (size_t)V * (size_t)d;
    if ((size_t)ff * (size_t)d > maxn) maxn = (size_t)ff * (size_t)d;
    if ((size_t)qd * (size_t)d > maxn) maxn = (size_t)qd * (size_t)d;
    if (m->opt.weights != KV_WEIGHTS_F32 && m->opt.weights != KV_WEIGHTS_F16 &&
        m->opt.weights != KV_WEIGHTS_NATIVE) {
        s = KV_ERR(KV_EINVAL, "unknown weight storage %d", (int)m->opt.weights);
        goto done;
    }
    if (m->opt.weights == KV_WEIGHTS_F16) {
        tmp = kv_aligned_alloc(KV_ALIGN, maxn * sizeof(float));
        if (!tmp) {
            s = KV_ERR(KV_ENOMEM, "out of memory for the weight conversion buffer");
            goto done;
        }
    }
    m->store = calloc((size_t)L, sizeof *m->store);
    m->layers = calloc((size_t)L, sizeof *m->layers);
    m->inv_freq_d = calloc((size_t)hd / 2, sizeof(double));
    m->inv_freq = calloc((size_t)hd / 2, sizeof(float));
    if (!m->store || !m->layers || !m->inv_freq_d || !m->inv_freq) {
        s = KV_ERR(KV_ENOMEM, "out of memory for the model");
        goto done;
    }
    if ((s = read_mat(m, &m->tok_embd, read, raw, user, "token_embd.weight", V, d, tmp, 0)) != KV_OK) goto done;
    if ((s = read_vec(m, &m->output_norm, read, user, "output_norm.weight", (uint64_t)d, 0)) != KV_OK) goto done;
    if (!arch->tied_embeddings) {
        if ((s = read_mat(m, &m->output, read, raw, user, "output.weight", V, d, tmp, 1)) != KV_OK) goto done;
    }
    if (!m->output.data) {
        m->output.m = m->tok_embd.m; /* tied (or a file that ties without saying so) */
        m->arch.tied_embeddings = 1;
    }
    for (int l = 0; l < L; l++) {
        kv_layer_storage *st = &m->store[l];
#define MAT(field, suffix, rows, cols)                                                               \
    do {                                                                                             \
        snprintf(name, sizeof name, "blk.%d.%s", l, suffix);                                         \
        if ((s = read_mat(m, &st->field, read, raw, user, name, rows, cols, tmp, 0)) != KV_OK) goto done; \
    } while (0)
#define VEC(field, suffix, n, optional)                                                                   \
    do {                                                                                                  \
        snprintf(name, sizeof name, "blk.%d.%s", l, suffix);                                              \
        if ((s = read_vec(m, &st->field, read, user, name, (uint64_t)(n), optional)) != KV_OK) goto done; \
    } while (0)
        VEC(attn_norm, "attn_norm.weight", d, 0);
        MAT(wq, "attn_q.weight", qd, d);
        MAT(wk, "attn_k.weight", kvd, d);
        MAT(wv, "attn_v.weight", kvd, d);
        MAT(wo, "attn_output.weight", d, qd);
        if (arch->qkv_bias) {
            VEC(bq, "attn_q.bias", qd, 0);
            VEC(bk, "attn_k.bias", kvd, 0);
            VEC(bv, "attn_v.bias", kvd, 0);
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
    }
    /* llama.cpp's GGUF form of llama3 scaling: per-pair frequency divisors. */
    if ((s = read_vec(m, &freq_factors, read, user, "rope_freqs.weight", (uint64_t)hd / 2, 1)) != KV_OK)
        goto done;
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
    s = KV_OK;
done:
    kv_aligned_free(tmp);
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
