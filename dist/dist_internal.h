/* dist_internal.h — the backend interface of dist/ (not a public header). dist.c implements the
 * public functions for a single process and calls a backend (dist_mpi.c with MPI, dist_nompi.c
 * without) only when there is more than one rank. */
#ifndef KV_DIST_INTERNAL_H
#define KV_DIST_INTERNAL_H

#include "kv_dist.h"

struct kv_dist {
    int rank, size;
    int mpi_started; /* 1: kv_dist_finalize calls MPI_Finalize */
};

/* Start MPI (d->rank, d->size set); called only when a launcher asked for it. */
kv_status kv_dist_backend_init(kv_dist *d, int *argc, char ***argv);
void kv_dist_backend_finalize(kv_dist *d);
int kv_dist_backend_available(void);
/* Collectives over more than one rank. */
kv_status kv_dist_backend_bcast(kv_dist *d, void *buf, size_t bytes, int root);
kv_status kv_dist_backend_min_int(kv_dist *d, int *v);
kv_status kv_dist_backend_max_int(kv_dist *d, int *v);
kv_status kv_dist_backend_max_double(kv_dist *d, double *v);
kv_status kv_dist_backend_sum_doubles(kv_dist *d, double *buf, size_t n);
kv_status kv_dist_backend_barrier(kv_dist *d);
/* Point to point, n doubles (tag: any int >= 0). */
kv_status kv_dist_backend_send(kv_dist *d, const double *buf, size_t n, int dest, int tag);
kv_status kv_dist_backend_recv(kv_dist *d, double *buf, size_t n, int src, int tag);

#endif
