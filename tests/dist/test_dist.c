/* dist/ as one process (kv_dist.h): the fold adds parts in part order from zero (the same bits
 * that any number of ranks gives: dist_mpi_check runs the same parts under mpirun), a failing part
 * stops it with its status, the collectives are identities, and a process that an MPI launcher
 * started as one of several ranks is refused by a build without MPI. */
#define _POSIX_C_SOURCE 200809L
#include "dist_parts.h"
#include "kv_dist.h"
#include "kv_test.h"

START_TEST(test_single_process) {
    kv_dist *d = NULL;
    unsetenv("OMPI_COMM_WORLD_SIZE");
    unsetenv("PMI_SIZE");
    unsetenv("PMIX_SIZE");
    unsetenv("PMIX_RANK");
    ck_assert_kv_ok(kv_dist_init(&d, NULL, NULL));
    ck_assert_int_eq(kv_dist_rank(d), 0);
    ck_assert_int_eq(kv_dist_size(d), 1);
    ck_assert_int_eq(kv_dist_owner(d, 7), 0);
    ck_assert_int_eq(kv_dist_rank(NULL), 0);
    ck_assert_int_eq(kv_dist_size(NULL), 1);
    int any = -1;
    ck_assert_kv_ok(kv_dist_any(d, 5, &any));
    ck_assert_int_eq(any, 1);
    ck_assert_kv_ok(kv_dist_any(NULL, 0, &any));
    ck_assert_int_eq(any, 0);
    double v[3] = {1.5, -0.0, 3.0}, m = 2.5;
    ck_assert_kv_ok(kv_dist_sum_disjoint(d, v, 3));
    ck_assert(v[0] == 1.5 && v[2] == 3.0);
    ck_assert_kv_ok(kv_dist_max(d, &m));
    ck_assert(m == 2.5);
    ck_assert_kv_ok(kv_dist_bcast(d, v, sizeof v, 0));
    ck_assert_kv_ok(kv_dist_barrier(d));
    /* agree keeps the local status and its message */
    kv_status s = KV_ERR(KV_EIO, "disk full on this rank");
    ck_assert_int_eq(kv_dist_agree(d, s), KV_EIO);
    ck_assert_str_eq(kv_error_last(), "disk full on this rank");
    ck_assert_int_eq(kv_dist_agree(NULL, KV_OK), KV_OK);
    kv_dist_finalize(d);
    kv_dist_finalize(NULL);
}
END_TEST

/* The fold equals the direct left fold bit for bit, and differs from a pairwise sum of the same
 * parts (so the test would notice a fold that reassociated). */
START_TEST(test_fold_is_left_fold) {
    size_t n = 257;
    const int64_t parts = 13;
    double *acc = malloc(n * sizeof *acc), *ref = malloc(n * sizeof *ref), *pair = calloc(n, sizeof *pair);
    ck_assert_kv_ok(kv_dist_fold(NULL, acc, n, parts, dist_part_fill, &n));
    dist_part_left_fold(ref, n, parts);
    ck_assert_int_eq(memcmp(acc, ref, n * sizeof *acc), 0);
    /* pairwise: (p0 + ... + p6) + (p7 + ... + p12) */
    int differ = 0;
    for (size_t i = 0; i < n; i++) {
        double a = 0, b = 0;
        for (int64_t k = 0; k < 7; k++) a += dist_part_value(k, i);
        for (int64_t k = 7; k < parts; k++) b += dist_part_value(k, i);
        pair[i] = a + b;
        differ += pair[i] != ref[i];
    }
    ck_assert_msg(differ > 0, "the test parts do not depend on the order of summation");
    /* zero parts: acc is zeroed */
    acc[0] = 42;
    ck_assert_kv_ok(kv_dist_fold(NULL, acc, n, 0, dist_part_fill, &n));
    ck_assert(acc[0] == 0.0);
    free(acc);
    free(ref);
    free(pair);
}
END_TEST

static kv_status failing_part(void *user, int64_t part, double *out) {
    (void)user;
    out[0] = 1;
    return part == 2 ? KV_ERR(KV_ENUMERIC, "part %d failed", (int)part) : KV_OK;
}

START_TEST(test_fold_failure) {
    double acc[1];
    ck_assert_int_eq(kv_dist_fold(NULL, acc, 1, 5, failing_part, NULL), KV_ENUMERIC);
    ck_assert_str_eq(kv_error_last(), "part 2 failed");
    ck_assert_int_eq(kv_dist_fold(NULL, NULL, 1, 5, failing_part, NULL), KV_EINVAL);
}
END_TEST

/* A launcher that asks for several ranks, in a build without MPI: refused with a message. With MPI
 * the same environment would start MPI, which this single-process test must not do. */
START_TEST(test_launcher_without_mpi) {
    if (kv_dist_built_with_mpi()) return;
    kv_dist *d = (kv_dist *)1;
    setenv("OMPI_COMM_WORLD_SIZE", "3", 1);
    ck_assert_int_eq(kv_dist_init(&d, NULL, NULL), KV_EUNSUPPORTED);
    ck_assert_ptr_null(d);
    ck_assert_ptr_nonnull(strstr(kv_error_last(), "no MPI"));
    setenv("OMPI_COMM_WORLD_SIZE", "1", 1); /* one rank: fine */
    ck_assert_kv_ok(kv_dist_init(&d, NULL, NULL));
    ck_assert_int_eq(kv_dist_size(d), 1);
    kv_dist_finalize(d);
    unsetenv("OMPI_COMM_WORLD_SIZE");
}
END_TEST

int main(void) {
    Suite *s = suite_create("dist");
    TCase *tc = tcase_create("single");
    tcase_add_test(tc, test_single_process);
    tcase_add_test(tc, test_fold_is_left_fold);
    tcase_add_test(tc, test_fold_failure);
    tcase_add_test(tc, test_launcher_without_mpi);
    suite_add_tcase(s, tc);
    return kv_test_run(s);
}
