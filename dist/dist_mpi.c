/* dist/ backend over MPI (built when CMake finds MPI; KV_MPI). Only the calling thread talks to
 * MPI (MPI_THREAD_FUNNELED): the OpenMP threads of a rank never do. MPI's default error handler
 * (errors are fatal) stays: a rank that dies takes the job down instead of leaving the others
 * waiting, and the launcher reports it. */
#define _POSIX_C_SOURCE 200809L
#include "dist_internal.h"

#include <limits.h>
#include <mpi.h>

/* MPI counts are ints: large transfers go in pieces. */
enum { PIECE = 1 << 28 };

int kv_dist_backend_available(void) { return 1; }

kv_status kv_dist_backend_init(kv_dist *d, int *argc, char ***argv) {
    int inited = 0;
    MPI_Initialized(&inited);
    if (!inited) {
        int provided = 0;
        if (MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS)
            return KV_ERR(KV_EIO, "MPI_Init_thread failed");
        d->mpi_started = 1;
    }
    MPI_Comm_rank(MPI_COMM_WORLD, &d->rank);
    MPI_Comm_size(MPI_COMM_WORLD, &d->size);
    return KV_OK;
}

void kv_dist_backend_finalize(kv_dist *d) {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Finalize();
    d->mpi_started = 0;
}

static kv_status fail(const char *what, int rc) {
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    if (MPI_Error_string(rc, msg, &len) != MPI_SUCCESS) len = 0;
    msg[len < MPI_MAX_ERROR_STRING ? len : MPI_MAX_ERROR_STRING - 1] = '\0';
    return KV_ERR(KV_EIO, "%s: %s", what, msg);
}

kv_status kv_dist_backend_bcast(kv_dist *d, void *buf, size_t bytes, int root) {
    (void)d;
    for (size_t off = 0; off < bytes; off += PIECE) {
        const int n = (int)(bytes - off < PIECE ? bytes - off : PIECE);
        const int rc = MPI_Bcast((char *)buf + off, n, MPI_BYTE, root, MPI_COMM_WORLD);
        if (rc != MPI_SUCCESS) return fail("MPI_Bcast", rc);
    }
    return KV_OK;
}

static kv_status allreduce_int(int *v, MPI_Op op) {
    const int rc = MPI_Allreduce(MPI_IN_PLACE, v, 1, MPI_INT, op, MPI_COMM_WORLD);
    return rc == MPI_SUCCESS ? KV_OK : fail("MPI_Allreduce", rc);
}

kv_status kv_dist_backend_min_int(kv_dist *d, int *v) {
    (void)d;
    return allreduce_int(v, MPI_MIN);
}

kv_status kv_dist_backend_max_int(kv_dist *d, int *v) {
    (void)d;
    return allreduce_int(v, MPI_MAX);
}

kv_status kv_dist_backend_max_double(kv_dist *d, double *v) {
    (void)d;
    const int rc = MPI_Allreduce(MPI_IN_PLACE, v, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    return rc == MPI_SUCCESS ? KV_OK : fail("MPI_Allreduce", rc);
}

kv_status kv_dist_backend_sum_doubles(kv_dist *d, double *buf, size_t n) {
    (void)d;
    for (size_t off = 0; off < n; off += PIECE) {
        const int k = (int)(n - off < PIECE ? n - off : PIECE);
        const int rc = MPI_Allreduce(MPI_IN_PLACE, buf + off, k, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
        if (rc != MPI_SUCCESS) return fail("MPI_Allreduce", rc);
    }
    return KV_OK;
}

kv_status kv_dist_backend_barrier(kv_dist *d) {
    (void)d;
    const int rc = MPI_Barrier(MPI_COMM_WORLD);
    return rc == MPI_SUCCESS ? KV_OK : fail("MPI_Barrier", rc);
}

kv_status kv_dist_backend_send(kv_dist *d, const double *buf, size_t n, int dest, int tag) {
    (void)d;
    for (size_t off = 0; off < n; off += PIECE) {
        const int k = (int)(n - off < PIECE ? n - off : PIECE);
        const int rc = MPI_Send(buf + off, k, MPI_DOUBLE, dest, tag, MPI_COMM_WORLD);
        if (rc != MPI_SUCCESS) return fail("MPI_Send", rc);
    }
    return KV_OK;
}

kv_status kv_dist_backend_recv(kv_dist *d, double *buf, size_t n, int src, int tag) {
    (void)d;
    for (size_t off = 0; off < n; off += PIECE) {
        const int k = (int)(n - off < PIECE ? n - off : PIECE);
        const int rc = MPI_Recv(buf + off, k, MPI_DOUBLE, src, tag, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        if (rc != MPI_SUCCESS) return fail("MPI_Recv", rc);
    }
    return KV_OK;
}
