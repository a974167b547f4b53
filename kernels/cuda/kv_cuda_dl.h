/* kv_cuda_dl.h — cuBLAS and cuSOLVER loaded when first used (dlopen), not linked.
 *
 * Why: linking libcublas.so maps and relocates it (and libcublasLt) in every process at start-up, about 220 MB of
 * resident memory before main(); libcusolver adds 260 MB. Every tool links libkvrt, and most runs never touch a GPU
 * (and a machine may have the CUDA toolkit but no GPU), so the libraries are opened at the first call that needs
 * them: the device runtime's first AQUA-KV product, the GPU forward's first matrix product, the CUDA SQuat SVD.
 * A missing library is an error of that call (KV_ECUDA with the library's name), not of the process.
 * C++ only (CUDA sources). The functions keep the libraries' signatures (decltype of the real declarations). */
#ifndef KV_CUDA_DL_H
#define KV_CUDA_DL_H

#include <cublas_v2.h>
#include <cusolverDn.h>

struct kv_cublas_fns {
    decltype(&cublasCreate_v2) create;
    decltype(&cublasDestroy_v2) destroy;
    decltype(&cublasSetStream_v2) set_stream;
    decltype(&cublasSetMathMode) set_math_mode;
    decltype(&cublasSgemm_v2) sgemm;
    decltype(&cublasSgeam) sgeam;
    /* the C API's cublasGemmEx (the header also has a C++ overload taking a cudaDataType compute type) */
    cublasStatus_t (*gemm_ex)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int, const void *,
                              const void *, cudaDataType, int, const void *, cudaDataType, int, const void *, void *,
                              cudaDataType, int, cublasComputeType_t, cublasGemmAlgo_t);
};
struct kv_cusolver_fns {
    decltype(&cusolverDnCreate) create;
    decltype(&cusolverDnDestroy) destroy;
    decltype(&cusolverDnSetStream) set_stream;
    decltype(&cusolverDnSgesvd_bufferSize) sgesvd_buffer_size;
    decltype(&cusolverDnSgesvd) sgesvd;
};

/* The loaded functions (opened once per process, thread-safe), or NULL with the reason recorded (kv_error_last). */
extern "C" const kv_cublas_fns *kv_cuda_cublas(void);
extern "C" const kv_cusolver_fns *kv_cuda_cusolver(void);

#endif
