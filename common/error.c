/* Thread-local error messages and status names (kv_common.h). */
#define _POSIX_C_SOURCE 200809L
#include "kv_common.h"

#include <stdarg.h>
#include <string.h>

#define KV_ERROR_MAX 1024

static _Thread_local char g_message[KV_ERROR_MAX];
static _Thread_local char g_where[256];

const char *kv_status_name(kv_status s) {
    switch (s) {
    case KV_OK: return "KV_OK";
    case KV_EINVAL: return "KV_EINVAL";
    case KV_ENOMEM: return "KV_ENOMEM";
    case KV_EIO: return "KV_EIO";
    case KV_EFORMAT: return "KV_EFORMAT";
    case KV_EVERSION: return "KV_EVERSION";
    case KV_ECHECKSUM: return "KV_ECHECKSUM";
    case KV_ECUDA: return "KV_ECUDA";
    case KV_ENUMERIC: return "KV_ENUMERIC";
    case KV_EUNSUPPORTED: return "KV_EUNSUPPORTED";
    case KV_ENOTFOUND: return "KV_ENOTFOUND";
    case KV_EMISMATCH: return "KV_EMISMATCH";
    case KV_EINTERRUPTED: return "KV_EINTERRUPTED";
    }
    return "KV_E(unknown)";
}

static const char *basename_of(const char *path) {
    const char *slash = strrchr(path, '/');
    return slash ? slash + 1 : path;
}

kv_status kv_error_set_at(kv_status code, const char *file, int line, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g_message, sizeof g_message, fmt, ap);
    va_end(ap);
    snprintf(g_where, sizeof g_where, "%s:%d", basename_of(file ? file : "?"), line);
    return code;
}

kv_status kv_error_wrap(kv_status code, const char *fmt, ...) {
    char prefix[KV_ERROR_MAX];
    char old[KV_ERROR_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    memcpy(old, g_message, sizeof old);
    /* prefix + old message, truncated to the buffer (explicit copies keep -Wformat-truncation quiet) */
    size_t np = strnlen(prefix, sizeof g_message - 1);
    memcpy(g_message, prefix, np);
    size_t no = strnlen(old, sizeof g_message - 1 - np);
    memcpy(g_message + np, old, no);
    g_message[np + no] = '\0';
    return code;
}

kv_status kv_error_append(kv_status code, const char *fmt, ...) {
    const size_t n = strnlen(g_message, sizeof g_message - 1);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g_message + n, sizeof g_message - n, fmt, ap);
    va_end(ap);
    return code;
}

const char *kv_error_last(void) { return g_message; }
const char *kv_error_where(void) { return g_where; }

void kv_error_clear(void) {
    g_message[0] = '\0';
    g_where[0] = '\0';
}
