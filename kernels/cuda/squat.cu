// CUDA: SQuat query subspace (cuSOLVER gesvd) and block-sequential key quantization (kvrt.h).
// P_inv and the Lemma 3 chain are precomputed on the host (kv_squat_create, O(d^3) once per head);
// the kernel runs one thread block per token group and calls the same element math as the CPU.

#include "kv_cuda_dl.h"
#include "kv_cuda_util.h"

#define KV_SQUAT_THREADS 128

__device__ static int squat_block_end(int t, int g, int d) { return t * g < d ? t * g : d; }

static __global__ void kv_squat_encode_kernel(uint8_t *codes, void *scales, void *zeros, float *k, float *err,
                                       const float *w, size_t T, int d, int g, size_t G, int bits, int per,
                                       float eta, int pt, int *bad) {
    const int nblocks = (d + g - 1) / g;
    const size_t C = (size_t)d;
    for (size_t kg = blockIdx.x; kg * G < T; kg += gridDim.x) {
        const size_t r0 = kg * G, rows = kv_qm_tok_group_rows(G, T, kg);
        float *kt = k + r0 * C;
        float *et = err + r0 * (size_t)g;
        size_t woff = 0;
        for (int t = 1; t <= nblocks; t++) {
            const int b0 = squat_block_end(t - 1, g, d), b1 = squat_block_end(t, g, d), gt = b1 - b0;
            for (int c = b0 + (int)threadIdx.x; c < b1; c += (int)blockDim.x) {
                float lo = kt[c], hi = kt[c];
                int nonfinite = 0;
                for (size_t i = 0; i < rows; i++) {
                    const float v = kt[i * C + (size_t)c];
                    nonfinite |= !kv_qm_is_finite(v);
                    lo = v < lo ? v : lo;
                    hi = v > hi ? v : hi;
                }
                if (nonfinite) {
                    atomicExch(bad, 1);
                    lo = hi = 0.0f; /* keep going with harmless values; the call fails */
                }
                const kv_qm_uparams p = kv_qm_uniform_params(lo, hi, bits, eta);
                const size_t grp = kg * C + (size_t)c;
                kv_qm_param_store(scales, grp, p.sc, pt);
                kv_qm_param_store(zeros, grp, p.zc, pt);
                const float sr = kv_qm_param_round(p.sc, pt), zr = kv_qm_param_round(p.zc, pt);
                const size_t j0 = kg * G * C + (size_t)c * rows;
                for (size_t i = 0; i < rows; i++) {
                    const size_t j = j0 + i;
                    const float v = kt[i * C + (size_t)c];
                    const uint32_t code =
                        kv_qm_uniform_code(v, p.z, p.inv, kv_qm_slot_max(bits, per, (int)(j % (size_t)per)));
                    codes[j] = (uint8_t)code;
                    et[i * (size_t)g + (size_t)(c - b0)] = kv_qm_uniform_dequant(code, sr, zr) - v;
                }
            }
            __syncthreads();
            if (t < nblocks) {
                const size_t nr = (size_t)(d - b1);
                const float *wt = w + woff;
                for (size_t e = threadIdx.x; e < rows * nr; e += blockDim.x) {
                    const size_t i = e / nr, cc = e - i * nr;
                    float *dst = kt + i * C + (size_t)b1 + cc;
                    *dst = kv_qm_squat_update(*dst, wt + cc * (size_t)gt, et + i * (size_t)g, gt);
                }
                woff += nr * (size_t)gt;
                __syncthreads();
            }
        }
    }
}

extern "C" kv_status kv_squat_encode_cuda(uint32_t *codes, void *scales, void *zeros, const kv_squat *sq,
                                          const kv_uniform *q, size_t tokens, const float *x, kv_stream stream) {
    cudaStream_t s = (cudaStream_t)stream;
    kv_status st = kv_uniform_check(q);
    size_t n = 0, nw = 0, C = 0;
    const float *hw = NULL;
    float *k = NULL, *err = NULL, *w = NULL;
    uint8_t *cs = NULL;
    int *bad = NULL;
    int per = 0;
    if (st != KV_OK) return st;
    if (q->axis != KV_AXIS_TOKENS) return KV_ERR(KV_EINVAL, "SQuat: keys must be grouped along tokens");
    C = (size_t)kv_squat_dim(sq);
    if ((st = kv_block_values(&n, tokens, C)) != KV_OK || n == 0) return st;
    per = kv_qm_per_word(q->bits, q->pack11);
    hw = kv_squat_weights(sq, &nw);
    KV_CU(cudaMallocAsync((void **)&bad, sizeof *bad, s));
    KV_CU(cudaMemsetAsync(bad, 0, sizeof *bad, s));
    KV_CU(cudaMallocAsync((void **)&k, n * sizeof *k, s));
    KV_CU(cudaMallocAsync((void **)&err, tokens * (size_t)kv_squat_block(sq) * sizeof *err, s));
    KV_CU(cudaMallocAsync((void **)&cs, n, s));
    KV_CU(cudaMallocAsync((void **)&w, (nw ? nw : 1) * sizeof *w, s));
    if (nw) KV_CU(cudaMemcpyAsync(w, hw, nw * sizeof *w, cudaMemcpyHostToDevice, s));
    KV_CU(cudaMemcpyAsync(k, x, n * sizeof *k, cudaMemcpyDeviceToDevice, s));
    kv_squat_encode_kernel<<<kv_cu_blocks((tokens + (size_t)q->group - 1) / (size_t)q->group, 1), KV_SQUAT_THREADS, 0,
                             s>>>(cs, scales, zeros, k, err, w, tokens, kv_squat_dim(sq), kv_squat_block(sq),
                                  (size_t)q->group, q->bits, per, q->eta, (int)q->param_type, bad);
    KV_CU_LAUNCH(squat_encode);
    if ((st = kv_cu_pack(codes, cs, n, q->bits, per, s)) != KV_OK) goto done;
    st = kv_cu_check_flag(bad, s, "SQuat encode (CUDA)");
done:
    if (bad) cudaFreeAsync(bad, s);
    if (k) cudaFreeAsync(k, s);
    if (err) cudaFreeAsync(err, s);
    if (cs) cudaFreeAsync(cs, s);
    if (w) cudaFreeAsync(w, s);
    if (st == KV_OK) {
        cudaError_t e = cudaStreamSynchronize(s);
        if (e != cudaSuccess) st = KV_ERR(KV_ECUDA, "SQuat encode: %s", cudaGetErrorString(e));
    }
    return st;
}

/* qhat[i][j] = sigma_i * v_i[j] from a column-major singular vector matrix. */
static __global__ void kv_squat_qhat_kernel(float *qhat, const float *sv, const float *vecs, int r, int d, int ld,
                                     int vecs_are_rows) {
    for (int e = blockIdx.x * blockDim.x + threadIdx.x; e < r * d; e += gridDim.x * blockDim.x) {
        const int i = e / d, j = e - i * d;
        /* VT (rows are right singular vectors): VT[i][j] at i + j*ld; U (columns): U[j][i] at j + i*ld */
        const float v = vecs_are_rows ? vecs[(size_t)i + (size_t)j * (size_t)ld] : vecs[(size_t)j + (size_t)i * (size_t)ld];
        qhat[e] = sv[i] * v;
    }
}

static __global__ void kv_squat_finite_kernel(const float *x, size_t n, int *bad) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        if (!kv_qm_is_finite(x[i])) atomicExch(bad, 1);
}

extern "C" kv_status kv_squat_subspace_cuda(float *qhat, const float *queries, size_t n, int d, int r,
                                            kv_stream stream) {
    cudaStream_t s = (cudaStream_t)stream;
    kv_status st = KV_OK;
    cusolverDnHandle_t sol = NULL;
    cublasHandle_t blas = NULL;
    float *a = NULL, *sv = NULL, *u = NULL, *vt = NULL, *work = NULL, *rwork = NULL;
    int *info = NULL, *bad = NULL;
    int lwork = 0, hinfo = 0, m = 0, k = 0;
    const float one = 1.0f, zero = 0.0f;
    /* Row-major queries[n][d] is the column-major d x n matrix Q^T. cuSOLVER gesvd needs rows >=
     * cols: with n >= d transpose to column-major Q (n x d) and take VT; otherwise factor Q^T
     * (d x n) directly: its left singular vectors are Q's right singular vectors. */
    const int tall = n >= (size_t)d;
    if (d < 1 || r < 1 || (size_t)r > n || r > d)
        return KV_ERR(KV_EINVAL, "SQuat subspace: need 1 <= r <= min(n, d) (n=%zu d=%d r=%d)", n, d, r);
    if (n > (size_t)1 << 30) return KV_ERR(KV_EINVAL, "SQuat subspace: too many queries (%zu)", n);
    m = tall ? (int)n : d;
    k = tall ? d : (int)n;
    const kv_cublas_fns *bl = kv_cuda_cublas();      /* loaded on first use (kv_cuda_dl.h) */
    const kv_cusolver_fns *so = bl ? kv_cuda_cusolver() : NULL;
    if (!so) return kv_error_wrap(KV_ECUDA, "SQuat subspace (CUDA): ");
    if (so->create(&sol) != CUSOLVER_STATUS_SUCCESS) {
        st = KV_ERR(KV_ECUDA, "cusolverDnCreate failed");
        goto done;
    }
    if (bl->create(&blas) != CUBLAS_STATUS_SUCCESS) {
        st = KV_ERR(KV_ECUDA, "cublasCreate failed");
        goto done;
    }
    so->set_stream(sol, s);
    bl->set_stream(blas, s);
    KV_CU(cudaMallocAsync((void **)&bad, sizeof *bad, s));
    KV_CU(cudaMemsetAsync(bad, 0, sizeof *bad, s));
    kv_squat_finite_kernel<<<kv_cu_blocks(n * (size_t)d, 256), 256, 0, s>>>(queries, n * (size_t)d, bad);
    KV_CU_LAUNCH(squat_finite);
    if ((st = kv_cu_check_flag(bad, s, "SQuat subspace (CUDA)")) != KV_OK) goto done;
    KV_CU(cudaMallocAsync((void **)&a, (size_t)m * (size_t)k * sizeof *a, s));
    KV_CU(cudaMallocAsync((void **)&sv, (size_t)k * sizeof *sv, s));
    KV_CU(cudaMallocAsync((void **)&info, sizeof *info, s));
    if (tall) {
        /* a (n x d, column-major, ld n) = transpose of the column-major d x n input */
        if (bl->sgeam(blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)n, d, &one, queries, d, &zero, a, (int)n, a,
                        (int)n) != CUBLAS_STATUS_SUCCESS) {
            st = KV_ERR(KV_ECUDA, "cublasSgeam (transpose) failed");
            goto done;
        }
        KV_CU(cudaMallocAsync((void **)&vt, (size_t)d * (size_t)d * sizeof *vt, s));
    } else {
        KV_CU(cudaMemcpyAsync(a, queries, (size_t)m * (size_t)k * sizeof *a, cudaMemcpyDeviceToDevice, s));
        KV_CU(cudaMallocAsync((void **)&u, (size_t)m * (size_t)k * sizeof *u, s));
    }
    if (so->sgesvd_buffer_size(sol, m, k, &lwork) != CUSOLVER_STATUS_SUCCESS) {
        st = KV_ERR(KV_ECUDA, "cusolverDnSgesvd_bufferSize failed");
        goto done;
    }
    KV_CU(cudaMallocAsync((void **)&work, (size_t)lwork * sizeof *work, s));
    KV_CU(cudaMallocAsync((void **)&rwork, (size_t)k * sizeof *rwork, s));
    if (so->sgesvd(sol, tall ? 'N' : 'S', tall ? 'S' : 'N', m, k, a, m, sv, u, m, vt, k, work, lwork,
                         rwork, info) != CUSOLVER_STATUS_SUCCESS) {
        st = KV_ERR(KV_ECUDA, "cusolverDnSgesvd failed");
        goto done;
    }
    KV_CU(cudaMemcpyAsync(&hinfo, info, sizeof hinfo, cudaMemcpyDeviceToHost, s));
    KV_CU(cudaStreamSynchronize(s));
    if (hinfo != 0) {
        st = KV_ERR(KV_ENUMERIC, "SQuat subspace: gesvd info %d", hinfo);
        goto done;
    }
    kv_squat_qhat_kernel<<<kv_cu_blocks((size_t)r * (size_t)d, 256), 256, 0, s>>>(qhat, sv, tall ? vt : u, r, d,
                                                                                   tall ? k : m, tall);
    KV_CU_LAUNCH(squat_qhat);
    KV_CU(cudaStreamSynchronize(s));
done:
    if (a) cudaFreeAsync(a, s);
    if (sv) cudaFreeAsync(sv, s);
    if (u) cudaFreeAsync(u, s);
    if (vt) cudaFreeAsync(vt, s);
    if (work) cudaFreeAsync(work, s);
    if (rwork) cudaFreeAsync(rwork, s);
    if (info) cudaFreeAsync(info, s);
    if (bad) cudaFreeAsync(bad, s);
    if (sol) so->destroy(sol);
    if (blas) bl->destroy(blas);
    return st;
}
