/* KVmix allocation, rank stability and the SVG chart (profile/allocate.c, svg.c). */
#define _POSIX_C_SOURCE 200809L
#include "kv_test.h"
#include "kv_profile.h"

#include <math.h>
#include <unistd.h>

/* The paper's arithmetic: 32 layers, 20% high -> 6 layers; K 3/2 bits -> 2.1875, V 4/2 -> 2.375. */
START_TEST(test_paper_average_bits) {
    double ks[32], vs[32];
    for (int i = 0; i < 32; i++) {
        ks[i] = (double)((i * 7) % 32);
        vs[i] = (double)((i * 11) % 32);
    }
    kv_alloc_params p;
    kv_alloc_params_default(&p);
    kv_alloc a;
    ck_assert_kv_ok(kv_alloc_by_importance(&a, ks, vs, 32, &p));
    ck_assert_int_eq(a.n_high, 6);
    ck_assert_double_eq_tol(a.k_avg_bits, 2.1875, 1e-12);
    ck_assert_double_eq_tol(a.v_avg_bits, 2.375, 1e-12);
    /* the high layers are exactly those with the 6 largest scores (26..31) */
    for (int i = 0; i < 32; i++) {
        ck_assert_int_eq(a.k_bits[i], ks[i] >= 26 ? 3 : 2);
        ck_assert_int_eq(a.v_bits[i], vs[i] >= 26 ? 4 : 2);
        ck_assert_double_eq(a.k_rpc[i], ks[i] >= 26 ? 0.2 : 0.1);
        ck_assert_double_eq(a.v_rpc[i], vs[i] >= 26 ? 0.2 : 0.1);
    }
    kv_alloc_free(&a);
}
END_TEST

/* Random allocation: same average bits as the importance one, deterministic for a seed. */
START_TEST(test_random_same_average) {
    kv_alloc_params p;
    kv_alloc_params_default(&p);
    kv_alloc a, b, c;
    ck_assert_kv_ok(kv_alloc_random(&a, 30, &p, 7));
    ck_assert_kv_ok(kv_alloc_random(&b, 30, &p, 7));
    ck_assert_kv_ok(kv_alloc_random(&c, 30, &p, 8));
    ck_assert_int_eq(a.n_high, 6);
    ck_assert_double_eq_tol(a.k_avg_bits, (6 * 3 + 24 * 2) / 30.0, 1e-12);
    ck_assert_double_eq_tol(a.v_avg_bits, (6 * 4 + 24 * 2) / 30.0, 1e-12);
    int same = 1, differs = 0;
    for (int i = 0; i < 30; i++) {
        same &= a.k_bits[i] == b.k_bits[i] && a.v_bits[i] == b.v_bits[i];
        differs |= a.k_bits[i] != c.k_bits[i] || a.v_bits[i] != c.v_bits[i];
    }
    ck_assert(same);
    ck_assert(differs); /* two seeds picking the same 2 x 6 of 30 layers has probability ~1e-11 */
    kv_alloc_free(&a);
    kv_alloc_free(&b);
    kv_alloc_free(&c);
    kv_alloc u;
    ck_assert_kv_ok(kv_alloc_uniform(&u, 5, 2, 2, 0.0));
    ck_assert_double_eq(u.k_avg_bits, 2.0);
    ck_assert_double_eq(u.k_rpc[3], 0.0);
    kv_alloc_free(&u);
}
END_TEST

START_TEST(test_ties_and_errors) {
    double flat[4] = {1, 1, 1, 1};
    kv_alloc_params p;
    kv_alloc_params_default(&p);
    p.high_frac = 0.5;
    kv_alloc a;
    ck_assert_kv_ok(kv_alloc_by_importance(&a, flat, flat, 4, &p));
    ck_assert_int_eq(a.k_bits[0], 3); /* ties go to the lower index */
    ck_assert_int_eq(a.k_bits[1], 3);
    ck_assert_int_eq(a.k_bits[2], 2);
    kv_alloc_free(&a);
    double bad[2] = {1, NAN};
    ck_assert_int_eq(kv_alloc_by_importance(&a, bad, bad, 2, &p), KV_ENUMERIC);
    p.high_frac = 1.5;
    ck_assert_int_eq(kv_alloc_by_importance(&a, flat, flat, 4, &p), KV_EINVAL);
}
END_TEST

/* Spearman against hand-computed values: identical order 1, reversed -1, with ties (scipy's
 * spearmanr([1,2,2,3],[1,3,2,4]) = 0.9486832980505138). */
START_TEST(test_spearman_and_overlap) {
    double a[5] = {1, 2, 3, 4, 5}, b[5] = {10, 20, 30, 40, 50}, c[5] = {5, 4, 3, 2, 1};
    double rho;
    ck_assert_kv_ok(kv_rank_spearman(&rho, a, b, 5));
    ck_assert_double_eq_tol(rho, 1.0, 1e-12);
    ck_assert_kv_ok(kv_rank_spearman(&rho, a, c, 5));
    ck_assert_double_eq_tol(rho, -1.0, 1e-12);
    double t1[4] = {1, 2, 2, 3}, t2[4] = {1, 3, 2, 4};
    ck_assert_kv_ok(kv_rank_spearman(&rho, t1, t2, 4));
    ck_assert_double_eq_tol(rho, 0.9486832980505138, 1e-12);
    double ov;
    ck_assert_kv_ok(kv_top_overlap(&ov, a, c, 5, 2));
    ck_assert_double_eq(ov, 0.0);
    ck_assert_kv_ok(kv_top_overlap(&ov, a, b, 5, 2));
    ck_assert_double_eq(ov, 1.0);
}
END_TEST

START_TEST(test_svg) {
    char path[] = "/tmp/kvsvgXXXXXX";
    int fd = mkstemp(path);
    ck_assert_int_ge(fd, 0);
    close(fd);
    double km[6] = {1, 5, 2, 8, 3, 0.5}, vm[6] = {2, 1, 9, 1, 1, 4}, sd[6] = {0.1, 0.2, 0.1, 0.5, 0.1, 0.1};
    kv_alloc_params p;
    kv_alloc_params_default(&p);
    p.high_frac = 0.34; /* 2 of 6 */
    kv_alloc a;
    ck_assert_kv_ok(kv_alloc_by_importance(&a, km, vm, 6, &p));
    ck_assert_kv_ok(kv_importance_svg_write(path, "test <model> & co", km, sd, vm, sd, 6, &a));
    char *buf = NULL;
    size_t n = 0;
    ck_assert_kv_ok(kv_file_read_all(&buf, &n, path));
    ck_assert_ptr_nonnull(strstr(buf, "<svg"));
    ck_assert_ptr_nonnull(strstr(buf, "</svg>"));
    ck_assert_ptr_nonnull(strstr(buf, "test &lt;model&gt; &amp; co"));
    /* K high layers are 3 and 1, V high layers are 2 and 5: 4 bars in total are marked */
    int marks = 0;
    for (const char *q = buf; (q = strstr(q, "(high bits)")) != NULL; q++) marks++;
    ck_assert_int_eq(marks, 4);
    ck_assert_ptr_nonnull(strstr(buf, "layer 3: 8 (high bits)"));
    free(buf);
    kv_alloc_free(&a);
    unlink(path);
}
END_TEST

int main(void) {
    Suite *s = suite_create("profile-allocate");
    TCase *tc = tcase_create("alloc");
    tcase_add_test(tc, test_paper_average_bits);
    tcase_add_test(tc, test_random_same_average);
    tcase_add_test(tc, test_ties_and_errors);
    tcase_add_test(tc, test_spearman_and_overlap);
    tcase_add_test(tc, test_svg);
    suite_add_tcase(s, tc);
    return kv_test_run(s);
}
