/* Run under mpirun -np N (test_dist_mpi.sh): kv_dist's collectives across real ranks.
 *   - kv_dist_fold of order-sensitive parts gives the bits of the one-process left fold on rank 0;
 *   - kv_dist_sum_disjoint gives the exact sum on every rank;
 *   - kv_dist_agree carries the lowest failing rank's status and message to every rank;
 *   - a part that fails on one rank fails the fold on every rank (no rank left waiting);
 *   - kv_dist_bcast, kv_dist_any, kv_dist_max.
 * Exit 0 when every check passes on this rank, 1 otherwise (each rank prints its failures). */
#define _POSIX_C_SOURCE 200809L
#include "dist_parts.h"
#include "kv_dist.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int g_fail;
#define CHECK(cond, ...)                                                                            \
    do {                                                                                            \
        if (!(cond)) {                                                                              \
            fprintf(stderr, "rank %d: FAIL %s:%d: ", rank, __FILE__, __LINE__);                      \
            fprintf(stderr, __VA_ARGS__);                                                           \
            fprintf(stderr, "\n");                                                                  \
            g_fail = 1;                                                                             \
        }                                                                                           \
    } while (0)

static kv_status fail_on_rank1_part(void *user, int64_t part, double *out) {
    (void)user;
    out[0] = (double)part;
    return part == 4 ? KV_ERR(KV_ENUMERIC, "part 4 is bad") : KV_OK;
}

int main(int argc, char **argv) {
    kv_dist *d = NULL;
    kv_status s = kv_dist_init(&d, &argc, &argv);
    int rank = 0;
    if (s != KV_OK) {
        fprintf(stderr, "kv_dist_init: %s\n", kv_error_last());
        return 1;
    }
    rank = kv_dist_rank(d);
    const int size = kv_dist_size(d);
    CHECK(size == (argc > 1 ? atoi(argv[1]) : size), "size %d, expected %s", size, argc > 1 ? argv[1] : "?");
    /* fold: several sizes, more parts than ranks and fewer */
    const int64_t part_counts[] = {0, 1, 2, 7, 13};
    for (size_t t = 0; t < sizeof part_counts / sizeof *part_counts; t++) {
        size_t n = 1000;
        double *acc = malloc(n * sizeof *acc), *ref = malloc(n * sizeof *ref);
        s = kv_dist_fold(d, acc, n, part_counts[t], dist_part_fill, &n);
        CHECK(s == KV_OK, "fold: %s", kv_error_last());
        if (rank == 0) {
            dist_part_left_fold(ref, n, part_counts[t]);
            CHECK(memcmp(acc, ref, n * sizeof *acc) == 0, "fold of %d parts differs from the left fold",
                  (int)part_counts[t]);
        }
        free(acc);
        free(ref);
    }
    /* sum_disjoint: element i belongs to rank i % size */
    {
        enum { N = 101 };
        double v[N];
        for (int i = 0; i < N; i++) v[i] = i % size == rank ? dist_part_value(99, (size_t)i) : 0.0;
        s = kv_dist_sum_disjoint(d, v, N);
        CHECK(s == KV_OK, "sum_disjoint: %s", kv_error_last());
        for (int i = 0; i < N; i++) CHECK(v[i] == dist_part_value(99, (size_t)i), "sum_disjoint element %d", i);
    }
    /* agree: rank size-1 (and, when there are 3 or more ranks, rank 1) fail; the lowest wins */
    {
        kv_status local = KV_OK;
        if (rank == size - 1) local = KV_ERR(KV_EIO, "rank-specific failure %d", rank);
        if (size >= 3 && rank == 1) local = KV_ERR(KV_ENOMEM, "rank-specific failure %d", rank);
        s = kv_dist_agree(d, local);
        const int who = size >= 3 ? 1 : size - 1;
        const kv_status want = size >= 3 ? KV_ENOMEM : KV_EIO;
        CHECK(s == want, "agree: got %s", kv_status_name(s));
        char expect[64];
        snprintf(expect, sizeof expect, "rank-specific failure %d", who);
        CHECK(strstr(kv_error_last(), expect) != NULL, "agree message '%s'", kv_error_last());
        CHECK(kv_dist_agree(d, KV_OK) == KV_OK, "agree of all OK");
    }
    /* a failing part fails the fold everywhere */
    {
        double acc[1];
        s = kv_dist_fold(d, acc, 1, 9, fail_on_rank1_part, NULL);
        CHECK(s == KV_ENUMERIC, "failing fold: got %s", kv_status_name(s));
        CHECK(strstr(kv_error_last(), "part 4 is bad") != NULL, "failing fold message '%s'", kv_error_last());
    }
    /* bcast, any, max */
    {
        char buf[32];
        memset(buf, 0, sizeof buf);
        if (rank == size - 1) snprintf(buf, sizeof buf, "from the last rank");
        CHECK(kv_dist_bcast(d, buf, sizeof buf, size - 1) == KV_OK, "bcast");
        CHECK(strcmp(buf, "from the last rank") == 0, "bcast content '%s'", buf);
        int any = 0;
        CHECK(kv_dist_any(d, rank == size - 1, &any) == KV_OK && any == 1, "any");
        CHECK(kv_dist_any(d, 0, &any) == KV_OK && any == 0, "any of zeros");
        double m = (double)rank;
        CHECK(kv_dist_max(d, &m) == KV_OK && m == (double)(size - 1), "max");
    }
    CHECK(kv_dist_barrier(d) == KV_OK, "barrier");
    kv_dist_finalize(d);
    if (!g_fail) printf("rank %d of %d: ok\n", rank, size);
    return g_fail;
}
