/* Replays fuzz corpora through LLVMFuzzerTestOneInput without libFuzzer (an ordinary CTest test in
 * every build, ASan included): fuzz_replay DIR|FILE ... Fails when an input traps or none is found. */
#define _POSIX_C_SOURCE 200809L
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "kv_common.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int run_file(const char *path) {
    char *buf = NULL;
    size_t n = 0;
    if (kv_file_read_all(&buf, &n, path) != KV_OK) {
        fprintf(stderr, "fuzz_replay: %s\n", kv_error_last());
        return -1;
    }
    /* an exact-size copy so that ASan sees reads past the end */
    uint8_t *exact = malloc(n ? n : 1);
    if (!exact) return -1;
    memcpy(exact, buf, n);
    free(buf);
    LLVMFuzzerTestOneInput(exact, n);
    free(exact);
    return 1;
}

int main(int argc, char **argv) {
    long count = 0;
    for (int i = 1; i < argc; i++) {
        struct stat st;
        if (stat(argv[i], &st) != 0) {
            fprintf(stderr, "fuzz_replay: cannot stat '%s'\n", argv[i]);
            return 1;
        }
        if (!S_ISDIR(st.st_mode)) {
            if (run_file(argv[i]) < 0) return 1;
            count++;
            continue;
        }
        DIR *d = opendir(argv[i]);
        if (!d) return 1;
        for (struct dirent *e; (e = readdir(d));) {
            if (e->d_name[0] == '.') continue;
            char path[4096];
            snprintf(path, sizeof path, "%s/%s", argv[i], e->d_name);
            if (run_file(path) < 0) {
                closedir(d);
                return 1;
            }
            count++;
        }
        closedir(d);
    }
    printf("fuzz_replay: %ld inputs, no crash\n", count);
    return count > 0 ? 0 : 1;
}
