/* libFuzzer target over the plan reader (PLAN_FORMAT.md §7). Besides "never crash, never leak",
 * it checks the reader's promise: whatever it accepts validates, dumps, and writes back to bytes
 * that read again into the same plan and serialize identically (canonical form).
 * Every input is read twice: as it is (CRC checks reject most mutations early), and with its CRCs
 * repaired by the harness, so that mutations reach the section decoders and the validator.
 * Built as `fuzz_plan` with -DKV_FUZZ=ON under clang; its corpus (fuzz_corpus/) is replayed as an
 * ordinary test by fuzz_replay.c in every build. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kv_formats.h"
#include "plan_sample.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define CHECK(cond)                                                                              \
    do {                                                                                         \
        if (!(cond)) {                                                                           \
            fprintf(stderr, "fuzz_plan: check failed: %s (last error: %s)\n", #cond, kv_error_last()); \
            __builtin_trap();                                                                    \
        }                                                                                        \
    } while (0)

static void read_one(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    read_one(data, size);
    uint8_t *copy = malloc(size ? size : 1);
    if (!copy) return 0;
    memcpy(copy, data, size);
    plan_bytes_repair_crcs(copy, size);
    read_one(copy, size);
    free(copy);
    return 0;
}

static void read_one(const uint8_t *data, size_t size) {
    kv_plan *p = NULL;
    kv_status s = kv_plan_read_memory(&p, data, size);
    if (s != KV_OK) {
        CHECK(p == NULL);
        CHECK(s == KV_EFORMAT || s == KV_EVERSION || s == KV_ECHECKSUM || s == KV_ENOMEM);
        CHECK(kv_error_last()[0] != '\0');
        return;
    }
    CHECK(kv_plan_validate(p) == KV_OK);
    char *text = NULL;
    CHECK(kv_plan_dump(&text, p, 0, 1) == KV_OK);
    free(text);
    CHECK(kv_plan_dump(&text, p, 1, 0) == KV_OK);
    free(text);
    for (int l = 0; l < p->n_layers; l++) {
        (void)kv_plan_stream_bits(p, l, KV_PLAN_K);
        (void)kv_plan_stream_bits(p, l, KV_PLAN_V);
    }
    const kv_plan_write_options opt = {1, 256};
    uint8_t *b1 = NULL, *b2 = NULL;
    size_t n1 = 0, n2 = 0;
    CHECK(kv_plan_write_memory(&b1, &n1, p, &opt) == KV_OK);
    kv_plan *q = NULL;
    CHECK(kv_plan_read_memory(&q, b1, n1) == KV_OK);
    CHECK(kv_plan_write_memory(&b2, &n2, q, &opt) == KV_OK);
    CHECK(n1 == n2 && memcmp(b1, b2, n1) == 0);
    free(b1);
    free(b2);
    kv_plan_free(q);
    kv_plan_free(p);
}
