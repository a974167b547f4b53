// forward_cuda.cu — the slim GPU forward of the reference model (kv_model.h "device", RUNTIME.md §10.6): the
// same decoder (RMSNorm, RoPE in the model's layout, QKV bias, grouped-query attention, SwiGLU, logits) with its
// matrix products in cuBLAS over weights decoded once at load from the same file, and attention through the
// runtime's CUDA backend (kv_rt_append / kv_rt_attend with device pointers, one launch for a batch of decoding
// sequences). Weights are held in f16 (products of f16 inputs accumulated in f32 on tensor cores) or, with
// KV_WEIGHTS_F32, in f32 (f32 products: the CPU's arithmetic up to summation order). The residual stream, norms,
// RoPE, attention and logits are f32 in both.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <math.h>
#include <new>
#include <stdlib.h>
#include <string.h>

#include "forward_internal.h"
#include "kv_cuda_dl.h"
#include "kvrt.h"
#include "model_cuda.h"

#define KV_CU(call)                                                                                               \
    do {                                                                                                          \
        cudaError_t e_ = (call);                                                                                  \
        if (e_ != cudaSuccess) {                                                                                  \
            st = KV_ERR(KV_ECUDA, "%s: %s", #call, cudaGetErrorString(e_));                                       \
            goto done;                                                                                            \
        }                                                                                                         \
    } while (0)
#define KV_CUBLAS(call)                                                                                           \
    do {                                                                                                          \
        cublasStatus_t e_ = (call);                                                                               \
        if (e_ != CUBLAS_STATUS_SUCCESS) {                                                                        \
            st = KV_ERR(KV_ECUDA, "%s: cuBLAS status %d", #call, (int)e_);                                        \
            goto done;                                                                                            \
        }                                                                                                         \
    } while (0)

namespace {

struct dmat { // one weight matrix on the device: rows x cols, row-major, f16 or f32
    void *w;
    int rows, cols;
};

struct dlayer {
    dmat wq, wk, wv, wo, gate, up, down;
    float *attn_norm, *ffn_norm, *bq, *bk, *bv;
};

} // namespace

struct kv_model_cuda {
    int n_layers;
    cudaStream_t stream;
    cublasHandle_t cublas;
    const kv_cublas_fns *blas; /* the loaded cuBLAS */
    int f32w; // weights (and GEMM inputs) in f32
    dlayer *layers;
    dmat embd, output;
    float *out_norm;
    double *inv_freq; // head_dim / 2
    size_t weight_bytes;
    // workspace (rows of the largest step so far)
    size_t rows;
    float *h, *q, *k, *kpre, *v, *att, *proj, *gate, *up, *logits, *last;
    void *xin; // GEMM input: rows x max(d_model, q_dim, d_ff), f16 or f32
    int32_t *tokens, *pos;
    size_t logit_rows;
};

namespace {

unsigned blocks_for(size_t n, unsigned threads) {
    size_t b = (n + threads - 1) / threads;
    if (b > 65535u * 16u) b = 65535u * 16u;
    return b ? (unsigned)b : 1u;
}

// ---- kernels ----------------------------------------------------------------------------------------------
__global__ void embed_kernel(float *h, const void *table, int f32w, const int32_t *tokens, size_t rows, int d) {
    for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < rows * (size_t)d; e += (size_t)gridDim.x * blockDim.x) {
        const size_t r = e / (size_t)d, c = e - r * (size_t)d, src = (size_t)tokens[r] * (size_t)d + c;
        h[e] = f32w ? static_cast<const float *>(table)[src] : __half2float(static_cast<const __half *>(table)[src]);
    }
}

// One block per row: y = x / sqrt(mean(x^2) + eps) * w, the mean square in double; y in f16 or f32.
__global__ void rmsnorm_kernel(void *y, int f32out, const float *x, const float *w, int d, float eps) {
    __shared__ double part[32];
    const float *xr = x + (size_t)blockIdx.x * (size_t)d;
    double ss = 0.0;
    for (int i = threadIdx.x; i < d; i += blockDim.x) ss += (double)xr[i] * (double)xr[i];
    for (int o = 16; o > 0; o /= 2) ss += __shfl_down_sync(0xffffffffu, ss, o);
    if ((threadIdx.x & 31) == 0) part[threadIdx.x / 32] = ss;
    __syncthreads();
    if (threadIdx.x == 0) {
        double t = 0.0;
        for (int i = 0; i < (int)(blockDim.x + 31) / 32; i++) t += part[i];
        part[0] = t;
    }
    __syncthreads();
    const float scale = (float)(1.0 / sqrt(part[0] / d + (double)eps));
    for (int i = threadIdx.x; i < d; i += blockDim.x) {
        const float v = (xr[i] * scale) * w[i];
        const size_t at = (size_t)blockIdx.x * (size_t)d + (size_t)i;
        if (f32out)
            static_cast<float *>(y)[at] = v;
        else
            static_cast<__half *>(y)[at] = __float2half_rn(v);
    }
}

__global__ void bias_kernel(float *y, const float *b, size_t rows, int n) {
    for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < rows * (size_t)n; e += (size_t)gridDim.x * blockDim.x)
        y[e] += b[e % (size_t)n];
}

// RoPE of q (n_heads) and k (n_kv_heads) rows in place at their positions (the model's arithmetic: angles in
// double, cos/sin rounded to float, x0 c - x1 s and x0 s + x1 c).
__global__ void rope_kernel(float *q, float *k, const int32_t *pos, const double *inv_freq, size_t rows, int nh, int nkv,
                            int hd, int adjacent) {
    const int half = hd / 2, per_row = (nh + nkv) * half;
    for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < rows * (size_t)per_row;
         e += (size_t)gridDim.x * blockDim.x) {
        const size_t r = e / (size_t)per_row;
        const int rem = (int)(e - r * (size_t)per_row), head = rem / half, i = rem - head * half;
        float *x = head < nh ? q + (r * (size_t)nh + (size_t)head) * (size_t)hd : k + (r * (size_t)nkv + (size_t)(head - nh)) * (size_t)hd;
        const double ang = (double)pos[r] * inv_freq[i];
        const float c = (float)cos(ang), s = (float)sin(ang);
        const int i0 = adjacent ? 2 * i : i, i1 = adjacent ? 2 * i + 1 : i + half;
        const float x0 = x[i0], x1 = x[i1];
        x[i0] = x0 * c - x1 * s;
        x[i1] = x0 * s + x1 * c;
    }
}

__global__ void to_input_kernel(void *y, int f32out, const float *x, size_t n) {
    for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < n; e += (size_t)gridDim.x * blockDim.x) {
        if (f32out)
            static_cast<float *>(y)[e] = x[e];
        else
            static_cast<__half *>(y)[e] = __float2half_rn(x[e]);
    }
}

// act = g / (1 + e^-g) * u, written as the next product's input.
__global__ void swiglu_kernel(void *y, int f32out, const float *g, const float *u, size_t n) {
    for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < n; e += (size_t)gridDim.x * blockDim.x) {
        const float v = g[e] / (1.0f + expf(-g[e])) * u[e];
        if (f32out)
            static_cast<float *>(y)[e] = v;
        else
            static_cast<__half *>(y)[e] = __float2half_rn(v);
    }
}

__global__ void gather_rows_kernel(float *dst, const float *src, int n_seqs, int n_tokens, int d) {
    for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < (size_t)n_seqs * (size_t)d; e += (size_t)gridDim.x * blockDim.x) {
        const size_t b = e / (size_t)d, c = e - b * (size_t)d;
        dst[e] = src[(b * (size_t)n_tokens + (size_t)n_tokens - 1) * (size_t)d + c];
    }
}

// ---- helpers ------------------------------------------------------------------------------------------------
// y (rows x W.rows, f32) = x (rows x W.cols) W^T (+ beta y): column-major y^T = W x^T.
kv_status gemm(kv_model_cuda *g, const dmat &W, int rows, const void *x, float *y, float beta) {
    kv_status st = KV_OK;
    const float one = 1.0f;
    if (g->f32w) {
        KV_CUBLAS(g->blas->sgemm(g->cublas, CUBLAS_OP_T, CUBLAS_OP_N, W.rows, rows, W.cols, &one, static_cast<const float *>(W.w),
                              W.cols, static_cast<const float *>(x), W.cols, &beta, y, W.rows));
    } else {
        KV_CUBLAS(g->blas->gemm_ex(g->cublas, CUBLAS_OP_T, CUBLAS_OP_N, W.rows, rows, W.cols, &one, W.w, CUDA_R_16F, W.cols, x,
                               CUDA_R_16F, W.cols, &beta, y, CUDA_R_32F, W.rows, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    }
done:
    return st;
}

// A host matrix decoded row by row (any storage) to the device, as f16 or f32.
kv_status upload_matrix(kv_model_cuda *g, const kv_matrix *m, dmat *out) {
    kv_status st = KV_OK;
    const size_t es = g->f32w ? 4u : 2u, cols = (size_t)m->cols, chunk = 256;
    float *row = NULL;
    void *stage = NULL;
    out->rows = m->rows, out->cols = m->cols, out->w = NULL;
    KV_CU(cudaMalloc(&out->w, (size_t)m->rows * cols * es));
    g->weight_bytes += (size_t)m->rows * cols * es;
    row = static_cast<float *>(malloc(cols * sizeof(float)));
    stage = malloc(chunk * cols * es);
    if (!row || !stage) {
        st = KV_ERR(KV_ENOMEM, "out of memory staging weights");
        goto done;
    }
    for (int r0 = 0; r0 < m->rows; r0 += (int)chunk) {
        const int r1 = r0 + (int)chunk < m->rows ? r0 + (int)chunk : m->rows;
        for (int r = r0; r < r1; r++) {
            if ((st = kv_model_matrix_row(m, r, row)) != KV_OK) goto done;
            for (size_t c = 0; c < cols; c++) {
                const size_t at = (size_t)(r - r0) * cols + c;
                if (g->f32w)
                    static_cast<float *>(stage)[at] = row[c];
                else
                    static_cast<uint16_t *>(stage)[at] = kv_f32_to_f16(row[c]);
            }
        }
        KV_CU(cudaMemcpy(static_cast<uint8_t *>(out->w) + (size_t)r0 * cols * es, stage, (size_t)(r1 - r0) * cols * es,
                         cudaMemcpyHostToDevice));
    }
done:
    free(row);
    free(stage);
    return st;
}

kv_status upload_vec(kv_model_cuda *g, const float *host, size_t n, float **out) {
    kv_status st = KV_OK;
    *out = NULL;
    if (!host) return KV_OK;
    KV_CU(cudaMalloc(reinterpret_cast<void **>(out), n * sizeof(float)));
    KV_CU(cudaMemcpy(*out, host, n * sizeof(float), cudaMemcpyHostToDevice));
    g->weight_bytes += n * sizeof(float);
done:
    return st;
}

void free_ws(kv_model_cuda *g) {
    float *bufs[] = {g->h, g->q, g->k, g->kpre, g->v, g->att, g->proj, g->gate, g->up};
    for (float *b : bufs) cudaFree(b);
    cudaFree(g->xin);
    cudaFree(g->tokens);
    cudaFree(g->pos);
    g->h = g->q = g->k = g->kpre = g->v = g->att = g->proj = g->gate = g->up = NULL;
    g->xin = NULL;
    g->tokens = g->pos = NULL;
    g->rows = 0;
}

kv_status ensure_ws(kv_model_cuda *g, const kv_arch *a, size_t rows) {
    kv_status st = KV_OK;
    if (rows <= g->rows) return KV_OK;
    free_ws(g);
    const size_t d = (size_t)a->d_model, qd = (size_t)a->n_heads * a->head_dim, kvd = (size_t)a->n_kv_heads * a->head_dim;
    const size_t ff = (size_t)a->d_ff, wide = ff > qd ? (ff > d ? ff : d) : (qd > d ? qd : d);
    KV_CU(cudaMalloc(reinterpret_cast<void **>(&g->h), rows * d * 4));
    KV_CU(cudaMalloc(reinterpret_cast<void **>(&g->q), rows * qd * 4));
    KV_CU(cudaMalloc(reinterpret_cast<void **>(&g->k), rows * kvd * 4));
    KV_CU(cudaMalloc(reinterpret_cast<void **>(&g->kpre), rows * kvd * 4));
    KV_CU(cudaMalloc(reinterpret_cast<void **>(&g->v), rows * kvd * 4));
    KV_CU(cudaMalloc(reinterpret_cast<void **>(&g->att), rows * qd * 4));
    KV_CU(cudaMalloc(reinterpret_cast<void **>(&g->proj), rows * d * 4));
    KV_CU(cudaMalloc(reinterpret_cast<void **>(&g->gate), rows * ff * 4));
    KV_CU(cudaMalloc(reinterpret_cast<void **>(&g->up), rows * ff * 4));
    KV_CU(cudaMalloc(&g->xin, rows * wide * (g->f32w ? 4 : 2)));
    KV_CU(cudaMalloc(reinterpret_cast<void **>(&g->tokens), rows * sizeof(int32_t)));
    KV_CU(cudaMalloc(reinterpret_cast<void **>(&g->pos), rows * sizeof(int32_t)));
    g->rows = rows;
done:
    if (st != KV_OK) free_ws(g);
    return st;
}

kv_status ensure_logits(kv_model_cuda *g, const kv_arch *a, size_t rows) {
    kv_status st = KV_OK;
    if (rows <= g->logit_rows) return KV_OK;
    cudaFree(g->logits);
    cudaFree(g->last);
    g->logits = g->last = NULL;
    g->logit_rows = 0;
    KV_CU(cudaMalloc(reinterpret_cast<void **>(&g->logits), rows * (size_t)a->vocab_size * 4));
    KV_CU(cudaMalloc(reinterpret_cast<void **>(&g->last), rows * (size_t)a->d_model * 4));
    g->logit_rows = rows;
done:
    return st;
}

} // namespace

extern "C" void kv_model_cuda_free(kv_model_cuda *g) {
    if (!g) return;
    if (g->stream) cudaStreamSynchronize(g->stream);
    free_ws(g);
    cudaFree(g->logits);
    cudaFree(g->last);
    for (int l = 0; g->layers && l < g->n_layers; l++) {
        dlayer *L = &g->layers[l];
        void *ptrs[] = {L->wq.w, L->wk.w, L->wv.w, L->wo.w, L->gate.w, L->up.w, L->down.w,
                        L->attn_norm, L->ffn_norm, L->bq, L->bk, L->bv};
        for (void *p : ptrs) cudaFree(p);
    }
    free(g->layers);
    cudaFree(g->out_norm);
    cudaFree(g->inv_freq);
    if (g->output.w != g->embd.w) cudaFree(g->output.w);
    cudaFree(g->embd.w);
    if (g->cublas) g->blas->destroy(g->cublas);
    if (g->stream) cudaStreamDestroy(g->stream);
    delete g;
}

extern "C" kv_status kv_model_cuda_open(kv_model *m) {
    kv_status st = KV_OK;
    const kv_arch *a = &m->arch;
    if (!kv_cuda_available()) return KV_ERR(KV_EUNSUPPORTED, "model: no usable CUDA device (no driver or no GPU)");
    if (m->stream) return KV_ERR(KV_EUNSUPPORTED, "model: layer-streamed weights do not run on the GPU");
    kv_model_cuda *g = new (std::nothrow) kv_model_cuda();
    if (!g) return KV_ERR(KV_ENOMEM, "out of memory");
    m->gpu = g;
    g->f32w = m->opt.weights == KV_WEIGHTS_F32;
    KV_CU(cudaStreamCreateWithFlags(&g->stream, cudaStreamNonBlocking));
    if (!(g->blas = kv_cuda_cublas())) { /* cuBLAS loaded on first use (kv_cuda_dl.h) */
        st = kv_error_wrap(KV_ECUDA, "model (GPU): ");
        goto done;
    }
    KV_CUBLAS(g->blas->create(&g->cublas));
    KV_CUBLAS(g->blas->set_stream(g->cublas, g->stream));
    KV_CUBLAS(g->blas->set_math_mode(g->cublas, g->f32w ? CUBLAS_PEDANTIC_MATH : CUBLAS_DEFAULT_MATH));
    g->layers = static_cast<dlayer *>(calloc((size_t)a->n_layers, sizeof(dlayer)));
    g->n_layers = a->n_layers;
    if (!g->layers) {
        st = KV_ERR(KV_ENOMEM, "out of memory");
        goto done;
    }
    for (int l = 0; l < a->n_layers; l++) {
        const kv_layer_weights *lw = &m->layers[l];
        dlayer *L = &g->layers[l];
        const size_t d = (size_t)a->d_model, kvd = (size_t)a->n_kv_heads * a->head_dim, qd = (size_t)a->n_heads * a->head_dim;
        if ((st = upload_matrix(g, &lw->wq, &L->wq)) != KV_OK || (st = upload_matrix(g, &lw->wk, &L->wk)) != KV_OK ||
            (st = upload_matrix(g, &lw->wv, &L->wv)) != KV_OK || (st = upload_matrix(g, &lw->wo, &L->wo)) != KV_OK ||
            (st = upload_matrix(g, &lw->w_gate, &L->gate)) != KV_OK || (st = upload_matrix(g, &lw->w_up, &L->up)) != KV_OK ||
            (st = upload_matrix(g, &lw->w_down, &L->down)) != KV_OK || (st = upload_vec(g, lw->attn_norm, d, &L->attn_norm)) != KV_OK ||
            (st = upload_vec(g, lw->ffn_norm, d, &L->ffn_norm)) != KV_OK || (st = upload_vec(g, lw->bq, qd, &L->bq)) != KV_OK ||
            (st = upload_vec(g, lw->bk, kvd, &L->bk)) != KV_OK || (st = upload_vec(g, lw->bv, kvd, &L->bv)) != KV_OK)
            goto done;
    }
    if ((st = upload_matrix(g, &m->tok_embd.m, &g->embd)) != KV_OK) goto done;
    if (m->output.m.f32 == m->tok_embd.m.f32 && m->output.m.f16 == m->tok_embd.m.f16 && m->output.m.q == m->tok_embd.m.q) {
        g->output = g->embd; // tied
    } else if ((st = upload_matrix(g, &m->output.m, &g->output)) != KV_OK) {
        goto done;
    }
    if ((st = upload_vec(g, m->output_norm, (size_t)a->d_model, &g->out_norm)) != KV_OK) goto done;
    KV_CU(cudaMalloc(reinterpret_cast<void **>(&g->inv_freq), (size_t)(a->head_dim / 2) * sizeof(double)));
    KV_CU(cudaMemcpy(g->inv_freq, m->inv_freq_d, (size_t)(a->head_dim / 2) * sizeof(double), cudaMemcpyHostToDevice));
done:
    if (st != KV_OK) {
        kv_model_cuda_free(g);
        m->gpu = NULL;
    }
    return st;
}

extern "C" kv_stream kv_model_cuda_stream(const kv_model *m) {
    return m && m->gpu ? reinterpret_cast<kv_stream>(m->gpu->stream) : NULL;
}

extern "C" size_t kv_model_cuda_weight_bytes(const kv_model *m) { return m && m->gpu ? m->gpu->weight_bytes : 0; }

// One step: f->n_seqs sequences of f->n_tokens tokens, attention through rt (seq slots ids[b]).
static kv_status forward_with(kv_model *m, const kv_forward *f, kv_rt *rt, const int *ids) {
    kv_status st = KV_OK;
    kv_model_cuda *g = m->gpu;
    const kv_arch *a = &m->arch;
    const int nb = f->n_seqs, nt = f->n_tokens, d = a->d_model, hd = a->head_dim, qd = a->n_heads * hd;
    const int kvd = a->n_kv_heads * hd, ff = a->d_ff;
    const size_t rows = (size_t)nb * (size_t)nt;
    int32_t *pos = static_cast<int32_t *>(malloc(rows * sizeof(int32_t)));
    const cudaStream_t s = g->stream;
    const int f32 = g->f32w;
    if (!pos) return KV_ERR(KV_ENOMEM, "out of memory");
    for (int b = 0; b < nb; b++) {
        const int past = kv_rt_length(rt, ids[b]);
        for (int t = 0; t < nt; t++) pos[(size_t)b * nt + t] = past + t;
    }
    for (size_t r = 0; r < rows; r++)
        if (f->tokens[r] < 0 || f->tokens[r] >= a->vocab_size) {
            st = KV_ERR(KV_EINVAL, "token id %d at row %zu is outside the vocabulary (%d)", (int)f->tokens[r], r, a->vocab_size);
            goto done;
        }
    if ((st = ensure_ws(g, a, rows)) != KV_OK) goto done;
    KV_CU(cudaMemcpyAsync(g->tokens, f->tokens, rows * sizeof(int32_t), cudaMemcpyHostToDevice, s));
    KV_CU(cudaMemcpyAsync(g->pos, pos, rows * sizeof(int32_t), cudaMemcpyHostToDevice, s));
    embed_kernel<<<blocks_for(rows * (size_t)d, 256), 256, 0, s>>>(g->h, g->embd.w, f32, g->tokens, rows, d);
    KV_CU(cudaGetLastError());
    for (int l = 0; l < a->n_layers; l++) {
        const dlayer *L = &g->layers[l];
        rmsnorm_kernel<<<(unsigned)rows, 256, 0, s>>>(g->xin, f32, g->h, L->attn_norm, d, a->rms_eps);
        KV_CU(cudaGetLastError());
        if ((st = gemm(g, L->wq, (int)rows, g->xin, g->q, 0.0f)) != KV_OK || (st = gemm(g, L->wk, (int)rows, g->xin, g->k, 0.0f)) != KV_OK ||
            (st = gemm(g, L->wv, (int)rows, g->xin, g->v, 0.0f)) != KV_OK)
            goto done;
        if (L->bq) {
            bias_kernel<<<blocks_for(rows * (size_t)qd, 256), 256, 0, s>>>(g->q, L->bq, rows, qd);
            bias_kernel<<<blocks_for(rows * (size_t)kvd, 256), 256, 0, s>>>(g->k, L->bk, rows, kvd);
            bias_kernel<<<blocks_for(rows * (size_t)kvd, 256), 256, 0, s>>>(g->v, L->bv, rows, kvd);
            KV_CU(cudaGetLastError());
        }
        KV_CU(cudaMemcpyAsync(g->kpre, g->k, rows * (size_t)kvd * 4, cudaMemcpyDeviceToDevice, s));
        rope_kernel<<<blocks_for(rows * (size_t)(a->n_heads + a->n_kv_heads) * (size_t)(hd / 2), 256), 256, 0, s>>>(
            g->q, g->k, g->pos, g->inv_freq, rows, a->n_heads, a->n_kv_heads, hd, a->rope_layout == KV_ROPE_ADJACENT);
        KV_CU(cudaGetLastError());
        if (nt == 1 && nb > 1) { // a decoding step of several sequences: one launch
            if ((st = kv_rt_append_batch(rt, l, nb, ids, g->kpre, g->k, g->v, (size_t)kvd)) != KV_OK ||
                (st = kv_rt_attend_batch(rt, l, nb, ids, g->q, (size_t)qd, g->att, (size_t)qd)) != KV_OK)
                goto done;
        } else {
            for (int b = 0; b < nb; b++) {
                const size_t r0 = (size_t)b * (size_t)nt;
                if ((st = kv_rt_append(rt, l, ids[b], nt, pos + r0, g->kpre + r0 * kvd, g->k + r0 * kvd, g->v + r0 * kvd,
                                       (size_t)kvd)) != KV_OK ||
                    (st = kv_rt_attend(rt, l, ids[b], nt, g->q + r0 * qd, (size_t)qd, g->att + r0 * qd, (size_t)qd)) != KV_OK)
                    goto done;
            }
        }
        to_input_kernel<<<blocks_for(rows * (size_t)qd, 256), 256, 0, s>>>(g->xin, f32, g->att, rows * (size_t)qd);
        KV_CU(cudaGetLastError());
        if ((st = gemm(g, L->wo, (int)rows, g->xin, g->h, 1.0f)) != KV_OK) goto done; // h += att Wo^T
        rmsnorm_kernel<<<(unsigned)rows, 256, 0, s>>>(g->xin, f32, g->h, L->ffn_norm, d, a->rms_eps);
        KV_CU(cudaGetLastError());
        if ((st = gemm(g, L->gate, (int)rows, g->xin, g->gate, 0.0f)) != KV_OK || (st = gemm(g, L->up, (int)rows, g->xin, g->up, 0.0f)) != KV_OK)
            goto done;
        swiglu_kernel<<<blocks_for(rows * (size_t)ff, 256), 256, 0, s>>>(g->xin, f32, g->gate, g->up, rows * (size_t)ff);
        KV_CU(cudaGetLastError());
        if ((st = gemm(g, L->down, (int)rows, g->xin, g->h, 1.0f)) != KV_OK) goto done; // h += act Wdown^T
    }
    if (f->hidden) KV_CU(cudaMemcpyAsync(f->hidden, g->h, rows * (size_t)d * 4, cudaMemcpyDeviceToHost, s));
    if (f->logits) {
        const size_t lr = f->logits_last_only ? (size_t)nb : rows;
        if ((st = ensure_logits(g, a, lr)) != KV_OK) goto done;
        const float *src = g->h;
        if (f->logits_last_only) {
            gather_rows_kernel<<<blocks_for((size_t)nb * (size_t)d, 256), 256, 0, s>>>(g->last, g->h, nb, nt, d);
            KV_CU(cudaGetLastError());
            src = g->last;
        }
        rmsnorm_kernel<<<(unsigned)lr, 256, 0, s>>>(g->xin, f32, src, g->out_norm, d, a->rms_eps);
        KV_CU(cudaGetLastError());
        if ((st = gemm(g, g->output, (int)lr, g->xin, g->logits, 0.0f)) != KV_OK) goto done;
        KV_CU(cudaMemcpyAsync(f->logits, g->logits, lr * (size_t)a->vocab_size * 4, cudaMemcpyDeviceToHost, s));
    }
    KV_CU(cudaStreamSynchronize(s));
done:
    free(pos);
    return st;
}

extern "C" kv_status kv_model_cuda_forward(kv_model *m, const kv_forward *f) {
    if (f->hooks && f->hooks->on_layer)
        return KV_ERR(KV_EUNSUPPORTED, "model (CUDA): capture hooks run on the CPU model only");
    kv_status st = KV_OK;
    int *ids = static_cast<int *>(malloc((size_t)f->n_seqs * sizeof(int)));
    kv_rt *own = NULL;
    kv_plan *plan = NULL;
    kv_rt *rt = NULL;
    if (!ids) return KV_ERR(KV_ENOMEM, "out of memory");
    for (int b = 0; b < f->n_seqs; b++) ids[b] = f->seq_ids ? f->seq_ids[b] : b;
    if (f->cache) {
        rt = kv_cache_rt_runtime(f->cache);
        if (!rt || !kv_rt_stream(rt)) {
            st = KV_ERR(KV_EUNSUPPORTED, "model (CUDA): the KV cache must be a runtime cache on the GPU (kv_cache_rt_create "
                        "with this model), not '%s'", f->cache->ops->name);
            goto done;
        }
    } else { // exact attention within the step: the runtime's f16 cache of this step alone
        kv_rt_options o;
        memset(&o, 0, sizeof o);
        o.device = KV_RT_DEVICE_CUDA, o.n_seqs = f->n_seqs, o.n_heads = m->arch.n_heads, o.capacity = f->n_tokens;
        o.rope_inv_freq = m->inv_freq_d, o.rope_layout = (int)m->arch.rope_layout;
        o.stream = reinterpret_cast<kv_stream>(m->gpu->stream);
        if ((st = kv_model_f16_plan(&plan, &m->arch)) != KV_OK || (st = kv_rt_open(&own, plan, &o)) != KV_OK) goto done;
        rt = own;
        for (int b = 0; b < f->n_seqs; b++) ids[b] = b;
    }
    st = forward_with(m, f, rt, ids);
done:
    kv_rt_close(own);
    kv_plan_free(plan);
    free(ids);
    return st;
}
