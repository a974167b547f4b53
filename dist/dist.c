/* dist/: the public functions (kv_dist.h). A single process (NULL handle, or one rank) is handled
 * here; more than one rank goes through the backend (dist_mpi.c). */
#define _POSIX_C_SOURCE 200809L
#include "dist_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The rank count an MPI launcher announced in the environment: > 0 when known, 0 when a launcher is
 * present without a size (PMIx alone), -1 when there is no launcher. */
static int launcher_size(void) {
    static const char *const sizes[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE", NULL};
    for (int i = 0; sizes[i]; i++) {
        const char *v = getenv(sizes[i]);
        if (v && *v) return atoi(v) > 0 ? atoi(v) : 0;
    }
    const char *r = getenv("PMIX_RANK");
    return r && *r ? 0 : -1;
}

kv_status kv_dist_init(kv_dist **out, int *argc, char ***argv) {
    *out = NULL;
    kv_dist *d = calloc(1, sizeof *d);
    if (!d) return KV_ERR(KV_ENOMEM, "out of memory");
    d->rank = 0;
    d->size = 1;
    const int n = launcher_size();
    if (n >= 0 && kv_dist_backend_available()) {
        kv_status s = kv_dist_backend_init(d, argc, argv);
        if (s != KV_OK) {
            free(d);
            return s;
        }
    } else if (n != -1 && n != 1) {
        free(d);
        return KV_ERR(KV_EUNSUPPORTED, "started by an MPI launcher as one of %s ranks, but this build has no MPI "
                      "(rebuild with Open MPI installed, cmake -DKV_MPI=ON); run it as a single process instead",
                      n > 0 ? "several" : "possibly several");
    }
    *out = d;
    return KV_OK;
}

void kv_dist_finalize(kv_dist *d) {
    if (!d) return;
    if (d->mpi_started) kv_dist_backend_finalize(d);
    free(d);
}

int kv_dist_rank(const kv_dist *d) { return d ? d->rank : 0; }
int kv_dist_size(const kv_dist *d) { return d ? d->size : 1; }
int kv_dist_built_with_mpi(void) { return kv_dist_backend_available(); }

int kv_dist_owner(const kv_dist *d, int64_t part) {
    const int size = kv_dist_size(d);
    return part < 0 ? 0 : (int)(part % size);
}

static int multi(const kv_dist *d) { return d && d->size > 1; }

kv_status kv_dist_agree(kv_dist *d, kv_status local) {
    if (!multi(d)) return local;
    /* the lowest failing rank (size when none failed) */
    int who = local != KV_OK ? d->rank : d->size;
    kv_status s = kv_dist_backend_min_int(d, &who);
    if (s != KV_OK) return s;
    if (who >= d->size) return KV_OK;
    struct {
        int32_t code;
        char msg[1000];
    } m;
    memset(&m, 0, sizeof m);
    if (d->rank == who) {
        m.code = (int32_t)local;
        snprintf(m.msg, sizeof m.msg, "%s", kv_error_last());
    }
    if ((s = kv_dist_backend_bcast(d, &m, sizeof m, who)) != KV_OK) return s;
    if (d->rank == who) return local;
    m.msg[sizeof m.msg - 1] = '\0';
    return KV_ERR((kv_status)m.code, "rank %d: %s", who, m.msg);
}

kv_status kv_dist_bcast(kv_dist *d, void *buf, size_t bytes, int root) {
    if (!multi(d) || bytes == 0) return KV_OK;
    if (root < 0 || root >= d->size) return KV_ERR(KV_EINVAL, "kv_dist_bcast: root %d of %d ranks", root, d->size);
    return kv_dist_backend_bcast(d, buf, bytes, root);
}

kv_status kv_dist_any(kv_dist *d, int flag, int *out) {
    int v = flag != 0;
    if (multi(d)) {
        kv_status s = kv_dist_backend_max_int(d, &v);
        if (s != KV_OK) return s;
    }
    *out = v;
    return KV_OK;
}

kv_status kv_dist_max(kv_dist *d, double *v) { return multi(d) ? kv_dist_backend_max_double(d, v) : KV_OK; }

kv_status kv_dist_sum_disjoint(kv_dist *d, double *buf, size_t n) {
    return multi(d) && n ? kv_dist_backend_sum_doubles(d, buf, n) : KV_OK;
}

kv_status kv_dist_barrier(kv_dist *d) { return multi(d) ? kv_dist_backend_barrier(d) : KV_OK; }

kv_status kv_dist_fold(kv_dist *d, double *acc, size_t n, int64_t n_parts, kv_dist_part_fn fn, void *user) {
    if (n_parts < 0 || !fn || (!acc && n)) return KV_ERR(KV_EINVAL, "kv_dist_fold: bad arguments");
    const int rank = kv_dist_rank(d);
    size_t bytes;
    if (kv_size_mul(&bytes, n + 1, sizeof(double)) != 0) return KV_ERR(KV_EINVAL, "kv_dist_fold: size overflow");
    /* tmp[n] carries the sender's "failed" flag: a rank that failed keeps sending (flagged) parts so
     * that rank 0 never waits for a message that will not come, and the status is agreed at the end. */
    double *tmp = malloc(bytes);
    kv_status local = kv_dist_agree(d, tmp ? KV_OK : KV_ERR(KV_ENOMEM, "out of memory for a partial sum of %zu values", n));
    if (local != KV_OK) {
        free(tmp);
        return local;
    }
    kv_status comm = KV_OK;
    if (n) memset(acc, 0, n * sizeof(double));
    for (int64_t k = 0; k < n_parts && comm == KV_OK; k++) {
        const int owner = kv_dist_owner(d, k);
        const int tag = (int)(k % 32768); /* the tags MPI guarantees; messages between two ranks keep their order anyway */
        if (owner == rank) {
            if (local == KV_OK) {
                memset(tmp, 0, bytes);
                local = fn(user, k, tmp);
            }
            if (rank == 0) {
                if (local == KV_OK)
                    for (size_t i = 0; i < n; i++) acc[i] += tmp[i];
            } else {
                tmp[n] = local != KV_OK ? 1.0 : 0.0;
                comm = kv_dist_backend_send(d, tmp, n + 1, 0, tag);
            }
        } else if (rank == 0) {
            comm = kv_dist_backend_recv(d, tmp, n + 1, owner, tag);
            if (comm == KV_OK && tmp[n] == 0.0 && local == KV_OK)
                for (size_t i = 0; i < n; i++) acc[i] += tmp[i];
        }
    }
    free(tmp);
    if (comm != KV_OK) return comm; /* the MPI error handler has normally ended the job already */
    return kv_dist_agree(d, local);
}
