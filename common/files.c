/* File mapping, whole-file reads and atomic writes (kv_common.h). */
#define _POSIX_C_SOURCE 200809L
#include "kv_common.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

kv_status kv_file_map_open(kv_file_map *out, const char *path) {
    memset(out, 0, sizeof *out);
    int fd = open(path, O_RDONLY);
    if (fd < 0) return KV_ERR(KV_EIO, "cannot open '%s': %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return KV_ERR(KV_EIO, "cannot stat '%s': %s", path, strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return KV_ERR(KV_EIO, "'%s' is not a regular file", path);
    }
    if (st.st_size == 0) {
        close(fd);
        return KV_OK;
    }
    void *p = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    int e = errno;
    close(fd);
    if (p == MAP_FAILED) return KV_ERR(KV_EIO, "cannot map '%s': %s", path, strerror(e));
    out->data = (const uint8_t *)p;
    out->size = (size_t)st.st_size;
    out->priv_ = p;
    return KV_OK;
}

void kv_file_map_close(kv_file_map *m) {
    if (!m) return;
    if (m->priv_) munmap(m->priv_, m->size);
    memset(m, 0, sizeof *m);
}

kv_status kv_file_read_all(char **out, size_t *size, const char *path) {
    *out = NULL;
    if (size) *size = 0;
    FILE *fp = fopen(path, "rb");
    if (!fp) return KV_ERR(KV_EIO, "cannot open '%s': %s", path, strerror(errno));
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    if (!buf) {
        fclose(fp);
        return KV_ERR(KV_ENOMEM, "out of memory reading '%s'", path);
    }
    for (;;) {
        if (cap - n < 2) {
            char *nb = cap < SIZE_MAX / 2 ? realloc(buf, cap * 2) : NULL;
            if (!nb) {
                free(buf);
                fclose(fp);
                return KV_ERR(KV_ENOMEM, "out of memory reading '%s'", path);
            }
            buf = nb;
            cap *= 2;
        }
        size_t got = fread(buf + n, 1, cap - n - 1, fp);
        n += got;
        if (got == 0) break;
    }
    int err = ferror(fp);
    fclose(fp);
    if (err) {
        free(buf);
        return KV_ERR(KV_EIO, "error reading '%s'", path);
    }
    buf[n] = '\0';
    *out = buf;
    if (size) *size = n;
    return KV_OK;
}

static char *dup_string(const char *s) {
    size_t n = strlen(s) + 1;
    char *d = malloc(n);
    if (d) memcpy(d, s, n);
    return d;
}

kv_status kv_atomic_open(kv_atomic_file *af, const char *path) {
    memset(af, 0, sizeof *af);
    size_t n = strlen(path) + 32;
    af->tmp_path = malloc(n);
    af->final_path = dup_string(path);
    if (!af->tmp_path || !af->final_path) {
        kv_atomic_abort(af);
        return KV_ERR(KV_ENOMEM, "out of memory");
    }
    snprintf(af->tmp_path, n, "%s.tmp.%ld", path, (long)getpid());
    af->fp = fopen(af->tmp_path, "wb");
    if (!af->fp) {
        kv_status s = KV_ERR(KV_EIO, "cannot create '%s': %s", af->tmp_path, strerror(errno));
        free(af->tmp_path);
        free(af->final_path);
        memset(af, 0, sizeof *af);
        return s;
    }
    return KV_OK;
}

static void fsync_parent_dir(const char *path) {
    char *dir = dup_string(path);
    if (!dir) return;
    char *slash = strrchr(dir, '/');
    const char *d = ".";
    if (slash) {
        if (slash == dir) slash[1] = '\0'; else *slash = '\0';
        d = dir;
    }
    int fd = open(d, O_RDONLY);
    if (fd >= 0) {
        fsync(fd); /* best effort: some filesystems refuse fsync on directories */
        close(fd);
    }
    free(dir);
}

kv_status kv_atomic_commit(kv_atomic_file *af) {
    kv_status s = KV_OK;
    if (!af->fp) return KV_ERR(KV_EINVAL, "atomic file is not open");
    if (fflush(af->fp) != 0 || ferror(af->fp)) {
        s = KV_ERR(KV_EIO, "cannot write '%s': %s", af->tmp_path, strerror(errno));
        goto done;
    }
    if (fsync(fileno(af->fp)) != 0) {
        s = KV_ERR(KV_EIO, "cannot fsync '%s': %s", af->tmp_path, strerror(errno));
        goto done;
    }
    if (fclose(af->fp) != 0) {
        af->fp = NULL;
        s = KV_ERR(KV_EIO, "cannot close '%s': %s", af->tmp_path, strerror(errno));
        goto done;
    }
    af->fp = NULL;
    if (rename(af->tmp_path, af->final_path) != 0) {
        s = KV_ERR(KV_EIO, "cannot rename '%s' to '%s': %s", af->tmp_path, af->final_path,
                   strerror(errno));
        goto done;
    }
    fsync_parent_dir(af->final_path);
done:
    if (s != KV_OK) {
        kv_atomic_abort(af);
        return s;
    }
    free(af->tmp_path);
    free(af->final_path);
    memset(af, 0, sizeof *af);
    return KV_OK;
}

void kv_atomic_abort(kv_atomic_file *af) {
    if (!af) return;
    if (af->fp) fclose(af->fp);
    if (af->tmp_path) unlink(af->tmp_path);
    free(af->tmp_path);
    free(af->final_path);
    memset(af, 0, sizeof *af);
}

kv_status kv_write_file_atomic(const char *path, const void *data, size_t size) {
    kv_atomic_file af;
    kv_status s = kv_atomic_open(&af, path);
    if (s != KV_OK) return s;
    if (size && fwrite(data, 1, size, af.fp) != size) {
        s = KV_ERR(KV_EIO, "cannot write '%s': %s", af.tmp_path, strerror(errno));
        kv_atomic_abort(&af);
        return s;
    }
    return kv_atomic_commit(&af);
}

int kv_default_threads(void) {
    const char *env = getenv("KVCAL_THREADS");
    if (env && *env) {
        long v = strtol(env, NULL, 10);
        if (v > 0 && v < 4096) return (int)v;
    }
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}
