/* kv_dist.h — the public header of dist/: data parallelism across processes.
 *
 * kvcal fit and kvprof importance split their work (shards of calibration sequences, prompts)
 * across the ranks of an MPI job (`mpirun -np N kvcal fit ...`) and combine what the ranks computed
 * through the few collectives below. When the build has no MPI (CMake option KV_MPI, auto-detected),
 * or the process was not started by an MPI launcher, the same functions run as one process (rank 0
 * of 1), so the callers never test for MPI themselves.
 *
 * Determinism: nothing here sums in an order that depends on the number of ranks.
 *   - kv_dist_fold adds per-part partial sums in part order at rank 0 (((p0 + p1) + p2) + ...),
 *     whichever rank computed each part: the result has the same bits for any rank count;
 *   - kv_dist_sum_disjoint adds arrays whose every element is non-zero on at most one rank: x + 0 is
 *     exact, so the result is the same bits in any order, on every rank.
 *
 * Errors: every collective must be called by every rank in the same order. A failure on one rank
 * is carried to the others by kv_dist_agree (and by kv_dist_fold, which agrees before returning), so
 * all ranks leave a computation with the same status instead of waiting on each other forever.
 * Ownership: kv_dist_init's handle is freed by kv_dist_finalize (NULL is accepted everywhere and
 * means a single process). */
#ifndef KV_DIST_H
#define KV_DIST_H

#include "kv_common.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kv_dist kv_dist;

/* Start. Under an MPI launcher (it sets OMPI_COMM_WORLD_SIZE, PMI_SIZE or PMIX_RANK) in a build with
 * MPI: MPI_Init_thread (only the calling thread talks to MPI) and this process's rank in
 * MPI_COMM_WORLD. Otherwise a single process, without touching MPI. KV_EUNSUPPORTED when a launcher
 * started this process as one of several ranks but the build has no MPI (every rank would otherwise
 * run the whole job and write the same files); KV_EIO when MPI fails to start. argc/argv may be NULL. */
kv_status kv_dist_init(kv_dist **out, int *argc, char ***argv);
/* MPI_Finalize when kv_dist_init started MPI; frees the handle. NULL is fine. */
void kv_dist_finalize(kv_dist *d);

int kv_dist_rank(const kv_dist *d);          /* 0 for NULL */
int kv_dist_size(const kv_dist *d);          /* 1 for NULL */
int kv_dist_built_with_mpi(void);            /* 1 when this build links MPI */
/* The rank that owns part k of a job split into parts: k mod size (round robin, so that ranks
 * take turns in kv_dist_fold's part order). */
int kv_dist_owner(const kv_dist *d, int64_t part);

/* Every rank passes its own status; every rank gets back KV_OK when all were KV_OK, else the status
 * of the lowest-numbered failing rank, with that rank's message ("rank R: ..." on the others). */
kv_status kv_dist_agree(kv_dist *d, kv_status local);
/* bytes of buf from root to every rank. */
kv_status kv_dist_bcast(kv_dist *d, void *buf, size_t bytes, int root);
/* Logical OR of flag over ranks, into *out on every rank. */
kv_status kv_dist_any(kv_dist *d, int flag, int *out);
/* The maximum of *v over ranks, into *v on every rank. */
kv_status kv_dist_max(kv_dist *d, double *v);
/* Element-wise sum over ranks of n doubles, in place on every rank, for arrays in which each element
 * is non-zero on at most one rank (each rank filled the entries it owns, the rest are zero): the sum
 * is then exact and the same on every rank. */
kv_status kv_dist_sum_disjoint(kv_dist *d, double *buf, size_t n);
kv_status kv_dist_barrier(kv_dist *d);

/* Fill out (n doubles, zeroed by the caller of the callback) with part `part`'s partial sums. */
typedef kv_status (*kv_dist_part_fn)(void *user, int64_t part, double *out);
/* acc (n doubles, on rank 0) = sum over parts 0..n_parts-1 of fn(part), added in part order starting
 * from zero; part k is computed by rank kv_dist_owner(k), parts of one rank in increasing order.
 * Rank 0 receives the others' parts as it needs them (ranks compute their next part meanwhile).
 * acc is overwritten on rank 0 and left zero elsewhere. The status is agreed (kv_dist_agree). */
kv_status kv_dist_fold(kv_dist *d, double *acc, size_t n, int64_t n_parts, kv_dist_part_fn fn, void *user);

#ifdef __cplusplus
}
#endif
#endif /* KV_DIST_H */
