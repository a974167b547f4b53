/* plan_for_model MODEL OUT: write a plan (every stream full precision) fingerprinted for MODEL.
 * A test helper for test_inspect.sh; kvcal fit writes real plans. */
#include <stdio.h>

#include "kv_formats.h"

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: plan_for_model MODEL OUT\n");
        return 2;
    }
    kv_model_file *mf = NULL;
    kv_plan *p = NULL;
    kv_plan_fingerprint fp;
    kv_plan_provenance v = {0};
    v.tool_version = "plan_for_model";
    v.config_yaml = "method: kivi\n";
    kv_status s = kv_model_file_open(&mf, argv[1]);
    if (s == KV_OK) s = kv_plan_fingerprint_compute(&fp, mf);
    kv_model_file_close(mf);
    if (s == KV_OK) s = kv_plan_create(&p, &fp);
    if (s == KV_OK) s = kv_plan_creation_time(&v.created);
    if (s == KV_OK) s = kv_plan_set_provenance(p, &v);
    if (s == KV_OK) s = kv_plan_write(p, argv[2], NULL);
    kv_plan_free(p);
    if (s != KV_OK) {
        fprintf(stderr, "plan_for_model: %s\n", kv_error_last());
        return 1;
    }
    return 0;
}
