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

/* What a file type is called in messages. */
static const char *type_name(mode_t m) {
    if (S_ISDIR(m)) return "a directory";
    if (S_ISCHR(m)) return "a character device";
    if (S_ISBLK(m)) return "a block device";
    if (S_ISSOCK(m)) return "a socket";
    if (S_ISFIFO(m)) return "a pipe";
    if (S_ISREG(m)) return "a regular file";
    return "not a regular file";
}

kv_status kv_input_check(const char *path) {
    if (!path || !*path) return KV_ERR(KV_EINVAL, "an input path is empty");
    struct stat st;
    if (stat(path, &st) != 0) return KV_ERR(KV_EIO, "cannot open '%s': %s", path, strerror(errno));
    if (S_ISREG(st.st_mode) || S_ISFIFO(st.st_mode)) return KV_OK;
    return KV_ERR(KV_EINVAL, "'%s' is %s: an input must be a regular file or a pipe (a device such as "
                  "/dev/zero never ends)", path, type_name(st.st_mode));
}

kv_status kv_file_read_bounded(char **out, size_t *size, const char *path, size_t max_bytes) {
    *out = NULL;
    if (size) *size = 0;
    kv_status s = kv_input_check(path);
    if (s != KV_OK) return s;
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
        if (n > max_bytes) {
            free(buf);
            fclose(fp);
            return KV_ERR(KV_EINVAL, "'%s' is larger than %zu bytes, the most this file may hold", path, max_bytes);
        }
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

kv_status kv_file_read_all(char **out, size_t *size, const char *path) {
    return kv_file_read_bounded(out, size, path, SIZE_MAX - 1);
}

static char *dup_string(const char *s) {
    size_t n = strlen(s) + 1;
    char *d = malloc(n);
    if (d) memcpy(d, s, n);
    return d;
}

kv_status kv_atomic_open(kv_atomic_file *af, const char *path) {
    memset(af, 0, sizeof *af);
    if (!path || !*path) return KV_ERR(KV_EINVAL, "an output path is empty");
    struct stat st;
    if (stat(path, &st) == 0 && !S_ISREG(st.st_mode)) {
        /* A device or a pipe (/dev/null, /dev/stdout, a FIFO) is written in place: renaming a file
         * over it would replace the node itself. A directory cannot take a file. */
        if (S_ISDIR(st.st_mode)) return KV_ERR(KV_EINVAL, "cannot write '%s': it is a directory", path);
        if (S_ISSOCK(st.st_mode)) return KV_ERR(KV_EINVAL, "cannot write '%s': it is a socket", path);
        af->final_path = dup_string(path);
        if (!af->final_path) return KV_ERR(KV_ENOMEM, "out of memory");
        af->fp = fopen(path, "wb");
        if (!af->fp) {
            kv_status s = KV_ERR(KV_EIO, "cannot open '%s' for writing: %s", path, strerror(errno));
            free(af->final_path);
            memset(af, 0, sizeof *af);
            return s;
        }
        af->in_place = 1;
        return KV_OK;
    }
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
    if (af->in_place) { /* a device or a pipe: flush and close, nothing to rename or sync */
        const int bad = fflush(af->fp) != 0 || ferror(af->fp);
        const int e = errno;
        const int cbad = fclose(af->fp) != 0;
        af->fp = NULL;
        if (bad || cbad) s = KV_ERR(KV_EIO, "cannot write '%s': %s", af->final_path, strerror(bad ? e : errno));
        free(af->final_path);
        memset(af, 0, sizeof *af);
        return s;
    }
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
    if (af->tmp_path && !af->in_place) unlink(af->tmp_path);
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

/* ---- outputs ---------------------------------------------------------------------------------- */
/* The directory part of path ("." when there is none); malloc'd. */
static char *parent_dir(const char *path) {
    char *dir = dup_string(path);
    if (!dir) return NULL;
    char *slash = strrchr(dir, '/');
    if (!slash) {
        free(dir);
        return dup_string(".");
    }
    if (slash == dir) slash[1] = '\0';
    else *slash = '\0';
    return dir;
}

kv_status kv_output_check(const char *path) {
    if (!path || !*path) return KV_ERR(KV_EINVAL, "an output path is empty");
    struct stat st;
    if (stat(path, &st) == 0) {
        if (S_ISDIR(st.st_mode)) return KV_ERR(KV_EINVAL, "output '%s' is a directory", path);
        if (S_ISSOCK(st.st_mode)) return KV_ERR(KV_EINVAL, "output '%s' is a socket", path);
        if (!S_ISREG(st.st_mode)) { /* written in place */
            if (access(path, W_OK) != 0)
                return KV_ERR(KV_EINVAL, "output '%s' (%s) is not writable: %s", path, type_name(st.st_mode),
                              strerror(errno));
            return KV_OK;
        }
    } else if (errno != ENOENT && errno != ENOTDIR) {
        return KV_ERR(KV_EINVAL, "output '%s': %s", path, strerror(errno));
    }
    /* a regular file (or a new one) is written next to it and renamed: the directory must take it */
    char *dir = parent_dir(path);
    if (!dir) return KV_ERR(KV_ENOMEM, "out of memory");
    kv_status s = KV_OK;
    if (stat(dir, &st) != 0)
        s = KV_ERR(KV_EINVAL, "output '%s': directory '%s' does not exist", path, dir);
    else if (!S_ISDIR(st.st_mode))
        s = KV_ERR(KV_EINVAL, "output '%s': '%s' is not a directory", path, dir);
    else if (access(dir, W_OK | X_OK) != 0)
        s = KV_ERR(KV_EINVAL, "output '%s': directory '%s' is not writable: %s", path, dir, strerror(errno));
    free(dir);
    return s;
}

int kv_same_file(const char *a, const char *b) {
    struct stat sa, sb;
    if (!a || !b || stat(a, &sa) != 0 || stat(b, &sb) != 0) return 0;
    return sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
}

/* ---- threads ---------------------------------------------------------------------------------- */
static int online_cpus(void) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (n > KV_THREADS_MAX ? KV_THREADS_MAX : (int)n) : 1;
}

int kv_threads_cap(void) {
    const long cap = 4L * online_cpus();
    return cap > KV_THREADS_MAX ? KV_THREADS_MAX : (int)cap;
}

kv_status kv_threads_check(long n, const char *what) {
    const int cap = kv_threads_cap();
    if (n < 1 || n > cap)
        return KV_ERR(KV_EINVAL, "%s %ld: threads must be in 1..%d (at most 4 per online CPU, %d CPUs here, and at "
                      "most %d)", what ? what : "thread count", n, cap, online_cpus(), KV_THREADS_MAX);
    return KV_OK;
}

kv_status kv_threads_parse(int *out, const char *text, const char *what) {
    *out = 0;
    char *end = NULL;
    errno = 0;
    const long v = text ? strtol(text, &end, 10) : 0;
    if (!text || !(*text >= '0' && *text <= '9') || errno || !end || *end || end == text)
        return KV_ERR(KV_EINVAL, "%s '%s': expected a thread count in 1..%d", what ? what : "thread count",
                      text ? text : "", kv_threads_cap());
    kv_status s = kv_threads_check(v, what);
    if (s != KV_OK) return s;
    *out = (int)v;
    return KV_OK;
}

kv_status kv_threads_resolve(int *out, long requested, const char *what) {
    *out = 0;
    if (requested != 0) {
        kv_status s = kv_threads_check(requested, what);
        if (s == KV_OK) *out = (int)requested;
        return s;
    }
    const char *env = getenv("KVCAL_THREADS");
    if (env) return kv_threads_parse(out, env, "KVCAL_THREADS");
    *out = online_cpus();
    return KV_OK;
}

int kv_default_threads(void) {
    int n = 0;
    if (kv_threads_resolve(&n, 0, NULL) == KV_OK) return n;
    kv_log(KV_LOG_WARN, "%s; using %d (the online CPUs)", kv_error_last(), online_cpus());
    kv_error_clear();
    return online_cpus();
}

/* mkdir -p: the failing component keeps its errno (free() does not change it in glibc, but save it anyway). */
int kv_mkdir_p(const char *dir) {
    char *p = malloc(strlen(dir) + 1);
    if (!p) return -1;
    strcpy(p, dir);
    for (char *c = p + 1; *c; c++) {
        if (*c != '/') continue;
        *c = '\0';
        if (mkdir(p, 0777) != 0 && errno != EEXIST) {
            const int e = errno;
            free(p);
            errno = e;
            return -1;
        }
        *c = '/';
    }
    const int rc = mkdir(p, 0777) != 0 && errno != EEXIST ? -1 : 0;
    const int e = errno;
    free(p);
    errno = e;
    return rc;
}
