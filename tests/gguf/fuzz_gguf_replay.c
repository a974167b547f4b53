/* Replays the GGUF fuzz corpus through LLVMFuzzerTestOneInput without libFuzzer (an ordinary CTest
 * test in every build, ASan included): fuzz_gguf_replay DIR|FILE ...
 * Fails when an input traps or when no input is found. Each input is handed over in an allocation
 * of exactly its size, so ASan sees any read past the end. */
#define _POSIX_C_SOURCE 200809L
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "kv_common.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int replay_file(const char *path) {
    char *buf = NULL;
    size_t n = 0;
    if (kv_file_read_all(&buf, &n, path) != KV_OK) {
        fprintf(stderr, "fuzz_gguf_replay: %s\n", kv_error_last());
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
    return 0;
}

int main(int argc, char **argv) {
    long count = 0;
    for (int i = 1; i < argc; i++) {
        struct stat st;
        if (stat(argv[i], &st) != 0) {
            fprintf(stderr, "fuzz_gguf_replay: cannot stat '%s'\n", argv[i]);
            return 1;
        }
        if (!S_ISDIR(st.st_mode)) {
            if (replay_file(argv[i])) return 1;
            count++;
            continue;
        }
        DIR *d = opendir(argv[i]);
        if (!d) return 1;
        for (struct dirent *e; (e = readdir(d));) {
            if (e->d_name[0] == '.') continue;
            char path[4096];
            snprintf(path, sizeof path, "%s/%s", argv[i], e->d_name);
            if (replay_file(path)) {
                closedir(d);
                return 1;
            }
            count++;
        }
        closedir(d);
    }
    printf("fuzz_gguf_replay: %ld inputs, no crash\n", count);
    return count > 0 ? 0 : 1;
}
