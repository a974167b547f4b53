/* dist/ backend of a build without MPI: there is only ever one rank, so dist.c never calls the
 * collectives; they fail loudly if it ever does. */
#include "dist_internal.h"

int kv_dist_backend_available(void) { return 0; }

kv_status kv_dist_backend_init(kv_dist *d, int *argc, char ***argv) {
    (void)d, (void)argc, (void)argv;
    return KV_ERR(KV_EUNSUPPORTED, "this build has no MPI");
}

void kv_dist_backend_finalize(kv_dist *d) { (void)d; }

#define NO_MPI return KV_ERR(KV_EUNSUPPORTED, "this build has no MPI (more than one rank)")
kv_status kv_dist_backend_bcast(kv_dist *d, void *buf, size_t bytes, int root) { (void)d, (void)buf, (void)bytes, (void)root; NO_MPI; }
kv_status kv_dist_backend_min_int(kv_dist *d, int *v) { (void)d, (void)v; NO_MPI; }
kv_status kv_dist_backend_max_int(kv_dist *d, int *v) { (void)d, (void)v; NO_MPI; }
kv_status kv_dist_backend_max_double(kv_dist *d, double *v) { (void)d, (void)v; NO_MPI; }
kv_status kv_dist_backend_sum_doubles(kv_dist *d, double *buf, size_t n) { (void)d, (void)buf, (void)n; NO_MPI; }
kv_status kv_dist_backend_barrier(kv_dist *d) { (void)d; NO_MPI; }
kv_status kv_dist_backend_send(kv_dist *d, const double *buf, size_t n, int dest, int tag) { (void)d, (void)buf, (void)n, (void)dest, (void)tag; NO_MPI; }
kv_status kv_dist_backend_recv(kv_dist *d, double *buf, size_t n, int src, int tag) { (void)d, (void)buf, (void)n, (void)src, (void)tag; NO_MPI; }
