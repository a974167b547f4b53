/* Unit tests for common/: SHA-256, half conversions, atomic writes (devices written in place), output
 * and input checks, same-file detection, the thread-count rule, errors, sizes, RNG. */
#define _POSIX_C_SOURCE 200809L
#define _DEFAULT_SOURCE /* mknod, makedev */
#include "kv_test.h"

#include <math.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

static void sha_hex_of(char out[65], const void *data, size_t n) {
    kv_sha256 s;
    uint8_t d[32];
    kv_sha256_init(&s);
    kv_sha256_update(&s, data, n);
    kv_sha256_final(&s, d);
    kv_sha256_hex(out, d);
}

/* FIPS 180-4 / NIST example vectors. */
START_TEST(test_sha256_vectors) {
    char hex[65];
    sha_hex_of(hex, "", 0);
    ck_assert_str_eq(hex, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
    sha_hex_of(hex, "abc", 3);
    ck_assert_str_eq(hex, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    const char *m = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
    sha_hex_of(hex, m, strlen(m));
    ck_assert_str_eq(hex, "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
    /* One million 'a', fed in uneven pieces to exercise the buffering. */
    kv_sha256 s;
    uint8_t d[32];
    char chunk[997];
    memset(chunk, 'a', sizeof chunk);
    kv_sha256_init(&s);
    size_t left = 1000000;
    while (left) {
        size_t n = left < sizeof chunk ? left : sizeof chunk;
        kv_sha256_update(&s, chunk, n);
        left -= n;
    }
    kv_sha256_final(&s, d);
    kv_sha256_hex(hex, d);
    ck_assert_str_eq(hex, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}
END_TEST

/* Every finite f16 survives f16 -> f32 -> f16 exactly; NaNs stay NaN. */
START_TEST(test_f16_roundtrip_exhaustive) {
    for (uint32_t h = 0; h < 65536; h++) {
        float f = kv_f16_to_f32((uint16_t)h);
        uint16_t back = kv_f32_to_f16(f);
        if (((h >> 10) & 0x1f) == 0x1f && (h & 0x3ff)) {
            ck_assert(isnan(f));
            ck_assert((back & 0x7c00) == 0x7c00 && (back & 0x3ff));
        } else {
            ck_assert_msg(back == h, "h=%04x f=%g back=%04x", h, (double)f, back);
        }
    }
}
END_TEST

/* Rounding to nearest even at the halfway points, overflow and underflow. */
START_TEST(test_f16_rounding) {
    ck_assert_uint_eq(kv_f32_to_f16(1.0f), 0x3c00);
    ck_assert_uint_eq(kv_f32_to_f16(65504.0f), 0x7bff);
    ck_assert_uint_eq(kv_f32_to_f16(65520.0f), 0x7c00);      /* halfway to 2^16 rounds up to Inf */
    ck_assert_uint_eq(kv_f32_to_f16(65519.0f), 0x7bff);
    ck_assert_uint_eq(kv_f32_to_f16(1.0f + 1.0f / 2048.0f), 0x3c00); /* tie -> even */
    ck_assert_uint_eq(kv_f32_to_f16(1.0f + 3.0f / 2048.0f), 0x3c02); /* tie -> even (up) */
    ck_assert_uint_eq(kv_f32_to_f16(5.9604645e-8f), 0x0001);  /* smallest subnormal */
    ck_assert_uint_eq(kv_f32_to_f16(2.9802322e-8f), 0x0000);  /* exactly half of it: tie -> 0 */
    ck_assert_uint_eq(kv_f32_to_f16(-0.0f), 0x8000);
    ck_assert_uint_eq(kv_f32_to_bf16(1.0f), 0x3f80);
    ck_assert(kv_bf16_to_f32(0x3f80) == 1.0f);
    ck_assert_uint_eq(kv_f32_to_bf16(1.00390625f), 0x3f80); /* tie -> even */
}
END_TEST

START_TEST(test_atomic_write) {
    char dir[256];
    kv_test_tmpdir(dir, sizeof dir);
    ck_assert_ptr_nonnull(mkdtemp(dir));
    char path[512];
    snprintf(path, sizeof path, "%s/out.bin", dir);
    ck_assert_kv_ok(kv_write_file_atomic(path, "first", 5));
    /* An aborted write leaves the old content and no temporary behind. */
    kv_atomic_file af;
    ck_assert_kv_ok(kv_atomic_open(&af, path));
    fputs("partial", af.fp);
    char tmp_copy[600];
    snprintf(tmp_copy, sizeof tmp_copy, "%s", af.tmp_path);
    kv_atomic_abort(&af);
    ck_assert_int_ne(access(tmp_copy, F_OK), 0);
    char *buf = NULL;
    size_t n = 0;
    ck_assert_kv_ok(kv_file_read_all(&buf, &n, path));
    ck_assert_uint_eq(n, 5);
    ck_assert_str_eq(buf, "first");
    free(buf);
    ck_assert_kv_ok(kv_write_file_atomic(path, "second!", 7));
    ck_assert_kv_ok(kv_file_read_all(&buf, &n, path));
    ck_assert_str_eq(buf, "second!");
    free(buf);
    /* A write into a missing directory fails with KV_EIO and a message naming the path. */
    char bad[600];
    snprintf(bad, sizeof bad, "%s/missing/x.bin", dir);
    ck_assert_int_eq(kv_write_file_atomic(bad, "x", 1), KV_EIO);
    ck_assert_ptr_nonnull(strstr(kv_error_last(), "missing"));
    unlink(path);
    rmdir(dir);
}
END_TEST

/* A character device made with mknod in a temporary directory (never the system's /dev): 1 when
 * made; 0 when this process may not (not root, no CAP_MKNOD), and the caller skips that part. */
static int make_device(const char *path, unsigned minor) {
    return mknod(path, S_IFCHR | 0666, makedev(1, minor)) == 0;
}

/* Outputs that are not regular files are written in place, never renamed over: a null device made
 * with mknod stays a device after an atomic write, kv_output_check accepts it, and directories,
 * empty paths and missing directories are refused before anything is written. */
START_TEST(test_outputs_not_regular) {
    char dir[256], path[600], sub[600];
    kv_test_tmpdir(dir, sizeof dir);
    ck_assert_ptr_nonnull(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/null", dir);
    if (make_device(path, 3)) {
        ck_assert_kv_ok(kv_output_check(path));
        ck_assert_kv_ok(kv_write_file_atomic(path, "plan bytes", 10));
        struct stat st;
        ck_assert_int_eq(stat(path, &st), 0);
        ck_assert_msg(S_ISCHR(st.st_mode), "the device node was replaced by a regular file");
        kv_atomic_file af;
        ck_assert_kv_ok(kv_atomic_open(&af, path));
        ck_assert_int_eq(af.in_place, 1);
        kv_atomic_abort(&af); /* an aborted in-place write leaves the node alone */
        ck_assert_int_eq(stat(path, &st), 0);
        ck_assert(S_ISCHR(st.st_mode));
        unlink(path);
    } else {
        fprintf(stderr, "note: mknod not permitted here; device-node case not exercised\n");
    }
    /* a directory, an empty path, a missing directory, a "directory" that is a file */
    snprintf(sub, sizeof sub, "%s/d", dir);
    ck_assert_int_eq(mkdir(sub, 0777), 0);
    ck_assert_int_eq(kv_output_check(sub), KV_EINVAL);
    ck_assert_ptr_nonnull(strstr(kv_error_last(), "is a directory"));
    ck_assert_int_eq(kv_write_file_atomic(sub, "x", 1), KV_EINVAL);
    ck_assert_int_eq(kv_output_check(""), KV_EINVAL);
    ck_assert_ptr_nonnull(strstr(kv_error_last(), "empty"));
    ck_assert_int_eq(kv_write_file_atomic("", "x", 1), KV_EINVAL);
    snprintf(path, sizeof path, "%s/missing/x.bin", dir);
    ck_assert_int_eq(kv_output_check(path), KV_EINVAL);
    ck_assert_ptr_nonnull(strstr(kv_error_last(), "does not exist"));
    snprintf(path, sizeof path, "%s/file", dir);
    ck_assert_kv_ok(kv_write_file_atomic(path, "x", 1));
    ck_assert_kv_ok(kv_output_check(path)); /* an existing regular file is replaced atomically */
    snprintf(sub, sizeof sub, "%s/file/x.bin", dir);
    ck_assert_int_eq(kv_output_check(sub), KV_EINVAL);
    ck_assert_ptr_nonnull(strstr(kv_error_last(), "not a directory"));
    snprintf(sub, sizeof sub, "%s/new.bin", dir);
    ck_assert_kv_ok(kv_output_check(sub));
    ck_assert_kv_ok(kv_output_check("relative-name-in-cwd.bin"));
    unlink(path);
    snprintf(sub, sizeof sub, "%s/d", dir);
    rmdir(sub);
    rmdir(dir);
}
END_TEST

/* Same file = same device and inode: a hard link and a symlink are the same file under another
 * name; a copy is not; a missing file is nobody's twin. */
START_TEST(test_same_file) {
    char dir[256], a[600], b[600], c[600], d[600];
    kv_test_tmpdir(dir, sizeof dir);
    ck_assert_ptr_nonnull(mkdtemp(dir));
    snprintf(a, sizeof a, "%s/a", dir);
    snprintf(b, sizeof b, "%s/hard", dir);
    snprintf(c, sizeof c, "%s/sym", dir);
    snprintf(d, sizeof d, "%s/copy", dir);
    ck_assert_kv_ok(kv_write_file_atomic(a, "abc", 3));
    ck_assert_kv_ok(kv_write_file_atomic(d, "abc", 3));
    ck_assert_int_eq(link(a, b), 0);
    ck_assert_int_eq(symlink(a, c), 0);
    ck_assert_int_eq(kv_same_file(a, a), 1);
    ck_assert_int_eq(kv_same_file(a, b), 1);
    ck_assert_int_eq(kv_same_file(c, a), 1);
    ck_assert_int_eq(kv_same_file(a, d), 0);
    snprintf(d, sizeof d, "%s/missing", dir);
    ck_assert_int_eq(kv_same_file(a, d), 0);
    ck_assert_int_eq(kv_same_file(d, d), 0);
    unlink(a), unlink(b), unlink(c);
    snprintf(d, sizeof d, "%s/copy", dir);
    unlink(d);
    rmdir(dir);
}
END_TEST

/* Inputs that never end are refused before reading (a zero device made with mknod; a directory);
 * a bounded read refuses a file over its cap without reading the rest. */
START_TEST(test_inputs_bounded) {
    char dir[256], path[600];
    kv_test_tmpdir(dir, sizeof dir);
    ck_assert_ptr_nonnull(mkdtemp(dir));
    char *buf = NULL;
    size_t n = 0;
    snprintf(path, sizeof path, "%s/zero", dir);
    if (make_device(path, 5)) {
        ck_assert_int_eq(kv_input_check(path), KV_EINVAL);
        ck_assert_ptr_nonnull(strstr(kv_error_last(), "character device"));
        ck_assert_int_eq(kv_file_read_all(&buf, &n, path), KV_EINVAL);
        ck_assert_ptr_null(buf);
        unlink(path);
    }
    ck_assert_int_eq(kv_file_read_all(&buf, &n, dir), KV_EINVAL);
    ck_assert_ptr_nonnull(strstr(kv_error_last(), "directory"));
    snprintf(path, sizeof path, "%s/f", dir);
    ck_assert_kv_ok(kv_write_file_atomic(path, "0123456789", 10));
    ck_assert_kv_ok(kv_file_read_bounded(&buf, &n, path, 10));
    ck_assert_uint_eq(n, 10);
    free(buf);
    ck_assert_int_eq(kv_file_read_bounded(&buf, &n, path, 9), KV_EINVAL);
    ck_assert_ptr_nonnull(strstr(kv_error_last(), "larger than 9 bytes"));
    ck_assert_ptr_null(buf);
    unlink(path);
    rmdir(dir);
}
END_TEST

/* One thread-count rule: 1..kv_threads_cap() (4 per CPU, at most 1024) from options and from
 * $KVCAL_THREADS alike; garbage and out-of-range values are errors, never ignored. */
START_TEST(test_thread_rule) {
    const int cap = kv_threads_cap();
    ck_assert_int_ge(cap, 4);
    ck_assert_int_le(cap, KV_THREADS_MAX);
    int n = 0;
    ck_assert_kv_ok(kv_threads_check(1, "-t"));
    ck_assert_kv_ok(kv_threads_check(cap, "-t"));
    ck_assert_int_eq(kv_threads_check(cap + 1, "-t"), KV_EINVAL);
    ck_assert_ptr_nonnull(strstr(kv_error_last(), "-t "));
    ck_assert_int_eq(kv_threads_check(0, "-t"), KV_EINVAL);
    ck_assert_int_eq(kv_threads_check(-3, "-t"), KV_EINVAL);
    ck_assert_int_eq(kv_threads_check(100000, "-t"), KV_EINVAL);
    const char *bad[] = {"abc", "", "0", "-1", "100000", "2x", " 2"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        ck_assert_msg(kv_threads_parse(&n, bad[i], "KVCAL_THREADS") == KV_EINVAL, "'%s' accepted", bad[i]);
        ck_assert_ptr_nonnull(strstr(kv_error_last(), "KVCAL_THREADS"));
    }
    ck_assert_kv_ok(kv_threads_parse(&n, "2", "KVCAL_THREADS"));
    ck_assert_int_eq(n, 2);
    /* the environment variable goes through the same rule */
    ck_assert_int_eq(setenv("KVCAL_THREADS", "abc", 1), 0);
    ck_assert_int_eq(kv_threads_resolve(&n, 0, "--threads"), KV_EINVAL);
    ck_assert_ptr_nonnull(strstr(kv_error_last(), "KVCAL_THREADS 'abc'"));
    ck_assert_int_ge(kv_default_threads(), 1); /* the library falls back (with a warning) */
    ck_assert_int_eq(setenv("KVCAL_THREADS", "100000", 1), 0);
    ck_assert_int_eq(kv_threads_resolve(&n, 0, "--threads"), KV_EINVAL);
    ck_assert_int_eq(setenv("KVCAL_THREADS", "1", 1), 0);
    ck_assert_kv_ok(kv_threads_resolve(&n, 0, "--threads"));
    ck_assert_int_eq(n, 1);
    ck_assert_int_eq(kv_default_threads(), 1);
    ck_assert_kv_ok(kv_threads_resolve(&n, 2, "--threads")); /* an explicit count wins */
    ck_assert_int_eq(n, 2);
    ck_assert_int_eq(kv_threads_resolve(&n, -1, "--threads"), KV_EINVAL);
    ck_assert_int_eq(unsetenv("KVCAL_THREADS"), 0);
    ck_assert_kv_ok(kv_threads_resolve(&n, 0, "--threads"));
    ck_assert_int_ge(n, 1);
}
END_TEST

START_TEST(test_errors_and_sizes) {
    kv_error_clear();
    ck_assert_str_eq(kv_error_last(), "");
    kv_status s = KV_ERR(KV_EFORMAT, "bad %s at %d", "magic", 7);
    ck_assert_int_eq(s, KV_EFORMAT);
    ck_assert_str_eq(kv_error_last(), "bad magic at 7");
    ck_assert_ptr_nonnull(strstr(kv_error_where(), "test_common.c:"));
    kv_error_wrap(s, "reading '%s': ", "f.gguf");
    ck_assert_str_eq(kv_error_last(), "reading 'f.gguf': bad magic at 7");
    ck_assert_int_eq(kv_error_append(s, "; kept in %s", "d"), KV_EFORMAT);
    ck_assert_str_eq(kv_error_last(), "reading 'f.gguf': bad magic at 7; kept in d");
    ck_assert_str_eq(kv_status_name(KV_ECHECKSUM), "KV_ECHECKSUM");
    size_t out;
    ck_assert_int_eq(kv_size_mul(&out, SIZE_MAX / 2, 3), -1);
    ck_assert_int_eq(kv_size_mul(&out, 1u << 20, 1u << 10), 0);
    ck_assert_uint_eq(out, (size_t)1 << 30);
    ck_assert_int_eq(kv_size_add(&out, SIZE_MAX, 1), -1);
    void *p = kv_aligned_alloc(64, 100);
    ck_assert_ptr_nonnull(p);
    ck_assert_uint_eq((uintptr_t)p % 64, 0);
    kv_aligned_free(p);
    ck_assert_ptr_null(kv_aligned_alloc(48, 10)); /* not a power of two */
}
END_TEST

/* The counter-based RNG is a pure function of (seed, counter); normals have mean 0, variance 1
 * within 5 standard errors for 200k draws (a 5-sigma bound makes a false failure negligible). */
START_TEST(test_rng) {
    ck_assert_uint_eq(kv_rng_u64(42, 7), kv_rng_u64(42, 7));
    ck_assert_uint_ne(kv_rng_u64(42, 7), kv_rng_u64(42, 8));
    kv_rng r;
    kv_rng_init(&r, 1234);
    const int n = 200000;
    double sum = 0, sum2 = 0;
    for (int i = 0; i < n; i++) {
        double x = kv_rng_next_normal(&r);
        sum += x;
        sum2 += x * x;
    }
    double mean = sum / n, var = sum2 / n - mean * mean;
    ck_assert_double_lt(fabs(mean), 5.0 / sqrt(n));
    ck_assert_double_lt(fabs(var - 1.0), 5.0 * sqrt(2.0 / n));
}
END_TEST

int main(void) {
    Suite *s = suite_create("common");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, test_sha256_vectors);
    tcase_add_test(tc, test_f16_roundtrip_exhaustive);
    tcase_add_test(tc, test_f16_rounding);
    tcase_add_test(tc, test_atomic_write);
    tcase_add_test(tc, test_outputs_not_regular);
    tcase_add_test(tc, test_same_file);
    tcase_add_test(tc, test_inputs_bounded);
    tcase_add_test(tc, test_thread_rule);
    tcase_add_test(tc, test_errors_and_sizes);
    tcase_add_test(tc, test_rng);
    suite_add_tcase(s, tc);
    return kv_test_run(s);
}
