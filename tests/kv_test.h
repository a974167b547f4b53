/* kv_test.h — small helpers shared by the Check test binaries (not a public header). */
#ifndef KV_TEST_H
#define KV_TEST_H

#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kv_common.h"

/* Assert a kv_status is KV_OK, printing the library's message when it is not. */
#define ck_assert_kv_ok(expr)                                                                   \
    do {                                                                                        \
        kv_status _s = (expr);                                                                  \
        ck_assert_msg(_s == KV_OK, "%s -> %s: %s [%s]", #expr, kv_status_name(_s),            \
                      kv_error_last(), kv_error_where());                                        \
    } while (0)

/* The shared data folder as CTest passes it, or NULL (the test then skips what needs it). */
static inline const char *kv_test_data_dir(void) {
    const char *d = getenv("KVCAL_DATA_DIR");
    return (d && *d) ? d : NULL;
}

/* A fresh temporary directory for a test (removed by the OS's tmp cleaning; tests keep it small). */
static inline void kv_test_tmpdir(char *out, size_t n) {
    const char *base = getenv("TMPDIR");
    snprintf(out, n, "%s/kvtestXXXXXX", base && *base ? base : "/tmp");
}

/* Run a suite; returns the process exit code (0 all passed, 1 otherwise). */
static inline int kv_test_run(Suite *s) {
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? 0 : 1;
}

#endif
