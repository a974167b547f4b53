/* test_gguf: the GGUF reader/writer and dequantization tests that need no model file. */
#include "gguf_test_util.h"

int main(void) {
    Suite *s = gguf_dequant_suite();
    SRunner *sr = srunner_create(s);
    srunner_add_suite(sr, gguf_rw_suite());
    srunner_add_suite(sr, gguf_corrupt_suite());
    srunner_run_all(sr, CK_NORMAL);
    const int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? 0 : 1;
}
