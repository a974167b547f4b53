/* test_cuda_dl.cu — cuBLAS and cuSOLVER are opened at their first use, not linked (kernels/cuda/kv_cuda_dl.h):
 * the process starts without them (its resident memory stays that of a small program, where linking them cost
 * ~480 MB) and the loader finds every function the CUDA code calls. Needs the CUDA toolkit's libraries, not a GPU
 * (dlopen and dlsym do not touch the device). */
#include <stdio.h>
#include <string.h>

#include "kv_common.h"
#include "kv_cuda_dl.h"

static long rss_kib(void) { /* VmRSS of this process */
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long kib = -1;
    while (f && fgets(line, sizeof line, f))
        if (strncmp(line, "VmRSS:", 6) == 0) sscanf(line + 6, "%ld", &kib);
    if (f) fclose(f);
    return kib;
}

int main(void) {
    const long before = rss_kib();
    /* 64 MiB: a C program with libkvrt, cudart and OpenBLAS mapped; linking cuBLAS alone measured 218 MB here */
    if (before < 0 || before > 64 * 1024) {
        fprintf(stderr, "test_cuda_dl: %ld KiB resident before loading cuBLAS (expected < 64 MiB)\n", before);
        return 1;
    }
    const kv_cublas_fns *bl = kv_cuda_cublas();
    const kv_cusolver_fns *so = kv_cuda_cusolver();
    if (!bl || !so) {
        fprintf(stderr, "test_cuda_dl: %s\n", kv_error_last());
        return 1;
    }
    if (!bl->create || !bl->destroy || !bl->set_stream || !bl->set_math_mode || !bl->sgemm || !bl->sgeam ||
        !bl->gemm_ex || !so->create || !so->destroy || !so->set_stream || !so->sgesvd_buffer_size || !so->sgesvd) {
        fprintf(stderr, "test_cuda_dl: a function is missing\n");
        return 1;
    }
    if (kv_cuda_cublas() != bl) { /* opened once */
        fprintf(stderr, "test_cuda_dl: a second call loaded again\n");
        return 1;
    }
    printf("test_cuda_dl: %ld KiB resident before, %ld KiB after loading cuBLAS and cuSOLVER\n", before, rss_kib());
    return 0;
}
