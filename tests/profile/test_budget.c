/* Quantized pruning operating points (profile/budget.c): enumeration, names, the kvcal fit assignments
 * (loaded into a configuration: every point is a valid one), the layer-wise mixes, the choice of the
 * best point, the fragment (loaded back) and the chart. */
#define _POSIX_C_SOURCE 200809L
#include "kv_test.h"
#include "kv_profile.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

START_TEST(test_points) {
    const double budgets[] = {0.25, 0.125};
    const kv_plan_prune methods[] = {KV_PLAN_PRUNE_SNAPKV, KV_PLAN_PRUNE_H2O};
    const int bits[] = {16, 8, 4, 2};
    kv_budget_grid g = {budgets, 2, methods, 2, bits, 4, 4, 4, 1};
    kv_budget_point *p = NULL;
    int n = 0;
    ck_assert_kv_ok(kv_budget_points(&p, &n, &g, 30));
    /* per budget: 2 methods x 4 precisions, then 1 mix method x 3 other precisions x 4 ranges */
    ck_assert_int_eq(n, 2 * (2 * 4 + 3 * 4));
    ck_assert_str_eq(p[0].name, "snapkv 16-bit (1x tokens)");
    ck_assert_str_eq(p[3].name, "snapkv 2-bit (8x tokens)");
    ck_assert_str_eq(p[4].name, "h2o 16-bit (1x tokens)");
    ck_assert(p[0].budget == 0.25 && p[20].budget == 0.125);
    /* the mixes: base 4 bits, the ranges cover the 30 layers once for each other precision */
    int covered[3][30];
    memset(covered, 0, sizeof covered);
    for (int i = 8; i < 20; i++) {
        ck_assert_int_eq(p[i].method, KV_PLAN_PRUNE_SNAPKV);
        ck_assert_int_eq(p[i].bits, 4);
        ck_assert(p[i].range_bits == 16 || p[i].range_bits == 8 || p[i].range_bits == 2);
        const int k = p[i].range_bits == 16 ? 0 : p[i].range_bits == 8 ? 1 : 2;
        for (int l = p[i].range_lo; l < p[i].range_hi; l++) covered[k][l]++;
        for (int l = 0; l < 30; l++)
            ck_assert_int_eq(kv_budget_point_layer_bits(&p[i], l),
                             l >= p[i].range_lo && l < p[i].range_hi ? p[i].range_bits : 4);
    }
    for (int k = 0; k < 3; k++)
        for (int l = 0; l < 30; l++) ck_assert_int_eq(covered[k][l], 1);
    ck_assert_str_eq(p[8].name, "snapkv 4-bit, layers 0-6 16-bit");
    /* every point is a valid kvcal fit configuration with its bits, pruning and overrides */
    for (int i = 0; i < n; i++) {
        char a[128][64];
        const int na = kv_budget_point_assignments(&p[i], 30, a, 128);
        kv_fit_config c;
        ck_assert_kv_ok(kv_fit_config_init(&c));
        for (int j = 0; j < na; j++) ck_assert_kv_ok(kv_fit_config_set(&c, a[j]));
        ck_assert_kv_ok(kv_fit_config_validate(&c));
        ck_assert_int_eq(c.method, KV_FIT_KIVI);
        ck_assert_int_eq(c.keys.bits, p[i].bits);
        ck_assert_int_eq(c.pruning.method, p[i].method);
        ck_assert(c.pruning.budget == p[i].budget);
        for (int l = 0; l < 30; l++) {
            const kv_fit_layer_override *o = kv_fit_config_layer(&c, l);
            const int kb = o && (o->set & KV_FIT_LO_KEY_BITS) ? o->key_bits : c.keys.bits;
            const int vb = o && (o->set & KV_FIT_LO_VALUE_BITS) ? o->value_bits : c.values.bits;
            ck_assert_int_eq(kb, kv_budget_point_layer_bits(&p[i], l));
            ck_assert_int_eq(vb, kv_budget_point_layer_bits(&p[i], l));
        }
        kv_fit_config_free(&c);
    }
    free(p);
    /* no mixes; refusals */
    g.mix_base = 0;
    ck_assert_kv_ok(kv_budget_points(&p, &n, &g, 30));
    ck_assert_int_eq(n, 2 * 2 * 4);
    free(p);
    const double bad_b[] = {1.5};
    kv_budget_grid gb = g;
    gb.budgets = bad_b, gb.n_budgets = 1;
    ck_assert_int_eq(kv_budget_points(&p, &n, &gb, 30), KV_EINVAL);
    ck_assert_ptr_nonnull(strstr(kv_error_last(), "outside (0, 1]"));
    const int bad_bits[] = {5};
    gb = g;
    gb.bits = bad_bits, gb.n_bits = 1;
    ck_assert_int_eq(kv_budget_points(&p, &n, &gb, 30), KV_EINVAL);
    const kv_plan_prune none[] = {KV_PLAN_PRUNE_NONE};
    gb = g;
    gb.methods = none, gb.n_methods = 1;
    ck_assert_int_eq(kv_budget_points(&p, &n, &gb, 30), KV_EINVAL);
}
END_TEST

START_TEST(test_best_fragment_chart) {
    kv_budget_result a = {0.1, 10, 0.9, 0.25, NAN, 0}, b = {0.2, 11, 0.8, 0.25, NAN, 0};
    ck_assert(kv_budget_better(&a, NULL));
    ck_assert(kv_budget_better(&a, &b) && !kv_budget_better(&b, &a));
    /* with passkey measured, accuracy first */
    a.passkey_accuracy = 0.5, b.passkey_accuracy = 1.0;
    ck_assert(kv_budget_better(&b, &a) && !kv_budget_better(&a, &b));
    b.passkey_accuracy = 0.5;
    ck_assert(kv_budget_better(&a, &b));

    kv_budget_point p;
    memset(&p, 0, sizeof p);
    p.method = KV_PLAN_PRUNE_PYRAMIDKV, p.budget = 0.125, p.bits = 4, p.range_lo = 2, p.range_hi = 4, p.range_bits = 8;
    snprintf(p.name, sizeof p.name, "pyramidkv 4-bit, layers 2-3 8-bit");
    char path[] = "/tmp/kv_budget_XXXXXX";
    const int fd = mkstemp(path);
    ck_assert_int_ge(fd, 0);
    close(fd);
    ck_assert_kv_ok(kv_budget_config_write(path, &p, &a, 6, 32, 7));
    kv_fit_config c;
    ck_assert_kv_ok(kv_fit_config_init(&c));
    ck_assert_kv_ok(kv_fit_config_load_file(&c, path));
    ck_assert_kv_ok(kv_fit_config_validate(&c));
    ck_assert_int_eq(c.method, KV_FIT_KIVI);
    ck_assert_int_eq(c.keys.bits, 4);
    ck_assert_int_eq(c.values.bits, 4);
    ck_assert_int_eq(c.pruning.method, KV_PLAN_PRUNE_PYRAMIDKV);
    ck_assert(c.pruning.budget == 0.125);
    ck_assert_int_eq(c.pruning.window, 32);
    ck_assert_int_eq(c.pruning.pool, 7);
    for (int l = 0; l < 6; l++) {
        const kv_fit_layer_override *o = kv_fit_config_layer(&c, l);
        if (l >= 2 && l < 4) {
            ck_assert_ptr_nonnull(o);
            ck_assert_int_eq(o->key_bits, 8);
            ck_assert_int_eq(o->value_bits, 8);
        } else {
            ck_assert_ptr_null(o);
        }
    }
    kv_fit_config_free(&c);

    /* the chart: one line per point name, every budget on the x axis */
    kv_budget_point pts[4];
    kv_budget_result res[4];
    const double budgets[] = {0.25, 0.125};
    for (int i = 0; i < 4; i++) {
        memset(&pts[i], 0, sizeof pts[i]);
        pts[i].method = KV_PLAN_PRUNE_SNAPKV, pts[i].budget = budgets[i / 2], pts[i].bits = i % 2 ? 4 : 16;
        snprintf(pts[i].name, sizeof pts[i].name, "snapkv %d-bit", pts[i].bits);
        res[i] = a;
        res[i].kl_mean = 0.01 * (i + 1);
    }
    ck_assert_kv_ok(kv_budget_svg_write(path, "t", pts, res, 4, budgets, 2));
    FILE *fp = fopen(path, "r");
    char buf[16384];
    const size_t len = fread(buf, 1, sizeof buf - 1, fp);
    buf[len] = 0;
    fclose(fp);
    ck_assert_ptr_nonnull(strstr(buf, "</svg>"));
    int lines = 0;
    for (const char *q = buf; (q = strstr(q, "<polyline")); q++) lines++;
    ck_assert_int_eq(lines, 2);
    ck_assert_ptr_nonnull(strstr(buf, "snapkv 16-bit"));
    ck_assert_ptr_nonnull(strstr(buf, "1/8"));
    unlink(path);
}
END_TEST

int main(void) {
    Suite *s = suite_create("profile-budget");
    TCase *tc = tcase_create("budget");
    tcase_add_test(tc, test_points);
    tcase_add_test(tc, test_best_fragment_chart);
    suite_add_tcase(s, tc);
    return kv_test_run(s);
}
