/* Logging through a callback the tools install (kv_common.h). The library never prints. */
#include "kv_common.h"

#include <stdarg.h>

/* Process-wide sink: set once by a tool's main() before any work starts. */
static kv_log_fn g_log_fn;
static void *g_log_user;
static kv_log_level g_log_max = KV_LOG_INFO;

void kv_log_set_callback(kv_log_fn fn, void *user, kv_log_level max_level) {
    g_log_fn = fn;
    g_log_user = user;
    g_log_max = max_level;
}

void kv_log(kv_log_level level, const char *fmt, ...) {
    if (!g_log_fn || level > g_log_max) return;
    char msg[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    g_log_fn(g_log_user, level, msg);
}

void kv_log_to_stream(void *user, kv_log_level level, const char *message) {
    static const char *names[] = {"error", "warning", "info", "debug"};
    FILE *fp = user ? (FILE *)user : stderr;
    fprintf(fp, "%s: %s\n", names[level], message);
    fflush(fp);
}
