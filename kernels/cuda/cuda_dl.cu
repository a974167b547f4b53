/* cuda_dl.cu — cuBLAS and cuSOLVER opened at their first use (kv_cuda_dl.h says why). The sonames carry the major
 * versions of the headers the code was compiled against, so the functions found have the signatures declared. */
#include <dlfcn.h>

#include "kv_common.h"
#include "kv_cuda_dl.h"

#define KV_STR2(x) #x
#define KV_STR(x) KV_STR2(x)

struct loaded_blas {
    kv_cublas_fns f;
    int ok;
    char why[256];
};
struct loaded_solver {
    kv_cusolver_fns f;
    int ok;
    char why[256];
};

template <typename T> static bool find(void *lib, const char *name, T *fn, char *why, size_t cap) {
    *fn = reinterpret_cast<T>(dlsym(lib, name));
    if (!*fn) snprintf(why, cap, "%s not found in the library", name);
    return *fn != nullptr;
}

static loaded_blas load_blas() {
    loaded_blas L = {};
    const char *soname = "libcublas.so." KV_STR(CUBLAS_VER_MAJOR);
    void *lib = dlopen(soname, RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        snprintf(L.why, sizeof L.why, "cuBLAS (%s) could not be loaded: %s", soname, dlerror());
        return L;
    }
    L.ok = find(lib, "cublasCreate_v2", &L.f.create, L.why, sizeof L.why) &&
           find(lib, "cublasDestroy_v2", &L.f.destroy, L.why, sizeof L.why) &&
           find(lib, "cublasSetStream_v2", &L.f.set_stream, L.why, sizeof L.why) &&
           find(lib, "cublasSetMathMode", &L.f.set_math_mode, L.why, sizeof L.why) &&
           find(lib, "cublasSgemm_v2", &L.f.sgemm, L.why, sizeof L.why) &&
           find(lib, "cublasSgeam", &L.f.sgeam, L.why, sizeof L.why) &&
           find(lib, "cublasGemmEx", &L.f.gemm_ex, L.why, sizeof L.why);
    return L; /* the library stays open for the process */
}

static loaded_solver load_solver() {
    loaded_solver L = {};
    const char *soname = "libcusolver.so." KV_STR(CUSOLVER_VER_MAJOR);
    void *lib = dlopen(soname, RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        snprintf(L.why, sizeof L.why, "cuSOLVER (%s) could not be loaded: %s", soname, dlerror());
        return L;
    }
    L.ok = find(lib, "cusolverDnCreate", &L.f.create, L.why, sizeof L.why) &&
           find(lib, "cusolverDnDestroy", &L.f.destroy, L.why, sizeof L.why) &&
           find(lib, "cusolverDnSetStream", &L.f.set_stream, L.why, sizeof L.why) &&
           find(lib, "cusolverDnSgesvd_bufferSize", &L.f.sgesvd_buffer_size, L.why, sizeof L.why) &&
           find(lib, "cusolverDnSgesvd", &L.f.sgesvd, L.why, sizeof L.why);
    return L;
}

extern "C" const kv_cublas_fns *kv_cuda_cublas(void) {
    static const loaded_blas L = load_blas(); /* initialized once, thread-safe (C++11 static locals) */
    if (!L.ok) {
        KV_ERR(KV_ECUDA, "%s", L.why);
        return nullptr;
    }
    return &L.f;
}

extern "C" const kv_cusolver_fns *kv_cuda_cusolver(void) {
    static const loaded_solver L = load_solver();
    if (!L.ok) {
        KV_ERR(KV_ECUDA, "%s", L.why);
        return nullptr;
    }
    return &L.f;
}
