/* calib/grids.c: HIGGS grid generation against Lloyd-Max, determinism, and the grid file. */
#define _DEFAULT_SOURCE /* ualarm */
#include "kv_test.h"
#include "kv_calib.h"
#include "kvrt.h"

#include <math.h>
#include <signal.h>
#include <unistd.h>
#include <zlib.h>

/* Scalar Lloyd-Max quantizers for N(0, 1) (Max 1960): MSE for n = 2, 4, 8, 16. */
static const int k_lm_n[] = {2, 4, 8, 16};
static const double k_lm_mse[] = {0.3634, 0.1175, 0.03454, 0.009497};

START_TEST(lloyd_max_1d) {
    const int n = k_lm_n[_i];
    kv_grid_opts o = {.seed = 1, .samples = 100000};
    float *g = NULL;
    double train = 0.0;
    ck_assert_kv_ok(kv_grid_generate(&g, &train, 1, n, &o));
    for (int i = 1; i < n; i++) ck_assert_float_lt(g[i - 1], g[i]); /* sorted, distinct */
    /* The grid is symmetric up to sampling noise. */
    ck_assert_float_eq_tol(g[0], -g[n - 1], 0.05f * fabsf(g[0]));
    /* Exact MSE of the trained grid (integrated over its cells): the optimum is flat, so centroid
     * errors of ~1/sqrt(1e5 / n) give a relative excess of well under 0.5%; the reference values
     * are rounded to 4 digits (<= 0.02%). */
    double exact = 0.0;
    ck_assert_kv_ok(kv_grid_mse_1d_exact(&exact, g, n));
    ck_assert_msg(fabs(exact - k_lm_mse[_i]) <= 0.005 * k_lm_mse[_i], "n=%d exact %g vs %g", n, exact, k_lm_mse[_i]);
    ck_assert_double_ge(exact, k_lm_mse[_i] * 0.9995); /* nothing beats Lloyd-Max */
    /* On 1e5 fresh samples the squared error has a relative standard error <= 0.5%: 2% is 4 sigma
     * plus the exact excess. */
    double fresh = 0.0;
    ck_assert_kv_ok(kv_grid_mse(&fresh, g, 1, n, 777, 100000));
    ck_assert_msg(fabs(fresh - k_lm_mse[_i]) <= 0.02 * k_lm_mse[_i], "n=%d fresh %g vs %g", n, fresh, k_lm_mse[_i]);
    free(g);
}
END_TEST

START_TEST(grid_2d_beats_product_and_is_deterministic) {
    /* 16 points in 2-D: better than the product of two 4-level Lloyd-Max quantizers (0.1175 per
     * dimension); the optimal 2-D grid is about 6% better, a margin far above sampling noise. */
    kv_grid_opts o = {.seed = 5, .samples = 40000};
    float *a = NULL, *b = NULL;
    ck_assert_kv_ok(kv_grid_generate(&a, NULL, 2, 16, &o));
    double mse = 0.0;
    ck_assert_kv_ok(kv_grid_mse(&mse, a, 2, 16, 99, 100000));
    ck_assert_msg(mse < 0.1175 * 0.99, "2-D n=16 mse %g", mse);
    /* same options, same bytes */
    ck_assert_kv_ok(kv_grid_generate(&b, NULL, 2, 16, &o));
    ck_assert_int_eq(memcmp(a, b, 32 * sizeof *a), 0);
    free(a);
    free(b);
    ck_assert_int_eq(kv_grid_generate(&a, NULL, 3, 16, &o), KV_EINVAL);
    ck_assert_int_eq(kv_grid_generate(&a, NULL, 2, 12, &o), KV_EINVAL);
    ck_assert_int_eq(kv_grid_generate(&a, NULL, 2, 512, &o), KV_EINVAL);
}
END_TEST

static void tmp_path(char *out, size_t n, const char *name) {
    const char *base = getenv("TMPDIR");
    snprintf(out, n, "%s/kvgrid_%ld_%s", base && *base ? base : "/tmp", (long)getpid(), name);
}

static void write_bytes(const char *path, const uint8_t *data, size_t n) {
    FILE *fp = fopen(path, "wb");
    ck_assert_ptr_nonnull(fp);
    ck_assert_uint_eq(fwrite(data, 1, n, fp), n);
    fclose(fp);
}

START_TEST(grid_file_roundtrip_and_corruption) {
    const float pts[8] = {-1.5f, -0.5f, 0.5f, 1.5f, -2.f, 2.f, 0.25f, -0.25f};
    char path[512];
    tmp_path(path, sizeof path, "g.bin");
    ck_assert_kv_ok(kv_grid_write(path, pts, 2, 4, 123, 456));
    float *p = NULL;
    int d = 0, n = 0;
    uint64_t seed = 0, samples = 0;
    ck_assert_kv_ok(kv_grid_read(&p, &d, &n, &seed, &samples, path));
    ck_assert_int_eq(d, 2);
    ck_assert_int_eq(n, 4);
    ck_assert_uint_eq(seed, 123);
    ck_assert_uint_eq(samples, 456);
    ck_assert_int_eq(memcmp(p, pts, sizeof pts), 0);
    free(p);
    char *raw = NULL;
    size_t size = 0;
    ck_assert_kv_ok(kv_file_read_all(&raw, &size, path));
    ck_assert_uint_eq(size, 48 + sizeof pts);
    uint8_t *buf = malloc(size);
    /* each corruption fails with its own code */
    struct {
        const char *what;
        size_t off;
        uint8_t val;
        size_t len;
        kv_status want;
    } cases[] = {
        {"bad magic", 0, 'X', 0, KV_EFORMAT},        {"future version", 8, 2, 0, KV_EVERSION},
        {"header crc", 24, 0x55, 0, KV_ECHECKSUM},   {"payload crc", 50, 0x55, 0, KV_ECHECKSUM},
        {"truncated", 0, 0, 60, KV_EFORMAT},         {"short header", 0, 0, 20, KV_EFORMAT},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        memcpy(buf, raw, size);
        size_t len = cases[i].len ? cases[i].len : size;
        if (!cases[i].len) buf[cases[i].off] = cases[i].val;
        kv_status s = kv_grid_parse(&p, &d, &n, NULL, NULL, buf, len);
        ck_assert_msg(s == cases[i].want, "%s: got %s (%s)", cases[i].what, kv_status_name(s), kv_error_last());
        ck_assert_ptr_null(p);
    }
    /* a valid header CRC around a bad shape is a format error, not a crash */
    memcpy(buf, raw, size);
    kv_store_u32le(buf + 16, 3);
    kv_store_u32le(buf + 44, (uint32_t)0);
    kv_store_u32le(buf + 44, (uint32_t)crc32(0UL, buf, 44));
    ck_assert_int_eq(kv_grid_parse(&p, &d, &n, NULL, NULL, buf, size), KV_EFORMAT);
    /* reading through a file works the same */
    buf[0] = 'Y';
    write_bytes(path, buf, size);
    ck_assert_int_eq(kv_grid_read(&p, &d, &n, NULL, NULL, path), KV_EFORMAT);
    unlink(path);
    ck_assert_int_eq(kv_grid_read(&p, &d, &n, NULL, NULL, path), KV_EIO);
    free(buf);
    free(raw);
}
END_TEST

/* An interrupt flag stops a generation within one Lloyd iteration: raised from the start, nothing is
 * returned; raised by a signal mid-run (SIGALRM after 20 ms on a generation that takes seconds), the
 * call returns KV_EINTERRUPTED well before it would have finished. */
static volatile sig_atomic_t g_grid_flag;
static void on_alarm(int sig) {
    (void)sig;
    g_grid_flag = 1;
}

START_TEST(grid_generation_interrupted) {
    float *g = NULL;
    g_grid_flag = 1;
    kv_grid_opts o = {.seed = 1, .samples = 20000, .interrupt = &g_grid_flag};
    ck_assert_int_eq(kv_grid_generate(&g, NULL, 2, 16, &o), KV_EINTERRUPTED);
    ck_assert_ptr_null(g);
    ck_assert_ptr_nonnull(strstr(kv_error_last(), "interrupted"));
    g_grid_flag = 0;
    signal(SIGALRM, on_alarm);
    o.samples = 2000000; /* 256 points on 2M samples: many seconds uninterrupted */
    o.max_iters = 200;
    ualarm(20000, 0);
    const double t0 = kv_now_seconds();
    ck_assert_int_eq(kv_grid_generate(&g, NULL, 2, 256, &o), KV_EINTERRUPTED);
    const double dt = kv_now_seconds() - t0;
    /* one Lloyd iteration on 2M samples of 256 points takes ~0.1-0.5 s on one core: 5 s is generous
     * and still far below the uninterrupted run */
    ck_assert_msg(dt < 5.0, "stopped after %.2f s", dt);
    ck_assert_ptr_null(g);
    signal(SIGALRM, SIG_DFL);
}
END_TEST

int main(void) {
    Suite *s = suite_create("grids");
    TCase *tc = tcase_create("grids");
    tcase_set_timeout(tc, 300);
    tcase_add_loop_test(tc, lloyd_max_1d, 0, 4);
    tcase_add_test(tc, grid_2d_beats_product_and_is_deterministic);
    tcase_add_test(tc, grid_file_roundtrip_and_corruption);
    tcase_add_test(tc, grid_generation_interrupted);
    suite_add_tcase(s, tc);
    return kv_test_run(s);
}
