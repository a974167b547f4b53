/* test_modelfile: model files written by the tests themselves (llama2.c, safetensors, GGUF) and
 * the corrupt and randomly mutated variants of each. Needs no data. */
#include "mf_test.h"

int main(void) {
    Suite *s = suite_create("modelfile");
    suite_add_tcase(s, mf_tcase_llama2c());
    suite_add_tcase(s, mf_tcase_safetensors());
    suite_add_tcase(s, mf_tcase_gguf());
    suite_add_tcase(s, mf_tcase_corrupt());
    suite_add_tcase(s, mf_tcase_mutate());
    return kv_test_run(s);
}
