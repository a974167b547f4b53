/* Replays fuzz corpora through LLVMFuzzerTestOneInput without libFuzzer: link it with a fuzz target's
 * source and register the binary as an ordinary CTest test (every build, ASan included):
 *   add_executable(x_fuzz_replay fuzz_x.c ${PROJECT_SOURCE_DIR}/tests/fuzz_replay.c)
 *   add_test(NAME x_fuzz_corpus COMMAND x_fuzz_replay ${CMAKE_CURRENT_SOURCE_DIR}/fuzz_corpus)
 * Usage: NAME DIR|FILE ... Fails when an input traps or when no input is found. Each input is
 * handed over in an allocation of exactly its size, so ASan sees any read past the end. */
#define _POSIX_C_SOURCE 200809L
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "kv_common.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int run_file(const char *name, const char *path) {
    char *buf = NULL;
    size_t n = 0;
    if (kv_file_read_all(&buf, &n, path) != KV_OK) {
        fprintf(stderr, "%s: %s\n", name, kv_error_last());
        return -1;
    }
    uint8_t *exact = malloc(n ? n : 1);
    if (!exact) {
        free(buf);
        return -1;
    }
    memcpy(exact, buf, n);
    free(buf);
    LLVMFuzzerTestOneInput(exact, n);
    free(exact);
    return 1;
}

int main(int argc, char **argv) {
    const char *slash = argc > 0 ? strrchr(argv[0], '/') : NULL;
    const char *name = argc > 0 ? (slash ? slash + 1 : argv[0]) : "fuzz_replay";
    long count = 0;
    for (int i = 1; i < argc; i++) {
        struct stat st;
        if (stat(argv[i], &st) != 0) {
            fprintf(stderr, "%s: cannot stat '%s'\n", name, argv[i]);
            return 1;
        }
        if (!S_ISDIR(st.st_mode)) {
            if (run_file(name, argv[i]) < 0) return 1;
            count++;
            continue;
        }
        DIR *d = opendir(argv[i]);
        if (!d) return 1;
        for (struct dirent *e; (e = readdir(d));) {
            if (e->d_name[0] == '.') continue;
            char path[4096];
            snprintf(path, sizeof path, "%s/%s", argv[i], e->d_name);
            if (run_file(name, path) < 0) {
                closedir(d);
                return 1;
            }
            count++;
        }
        closedir(d);
    }
    printf("%s: %ld inputs, no crash\n", name, count);
    return count > 0 ? 0 : 1;
}
