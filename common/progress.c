/* Progress reporter: a bar with rate and ETA on a TTY, periodic lines otherwise (kv_common.h). */
#define _POSIX_C_SOURCE 200809L
#include "kv_common.h"

#include <time.h>
#include <unistd.h>

/* Process-wide, set by the tool: NULL means progress is not drawn at all. */
static FILE *g_stream;
static double g_line_interval = 10.0;

double kv_now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void kv_progress_set_stream(FILE *stream, double line_interval_s) {
    g_stream = stream;
    if (line_interval_s > 0) g_line_interval = line_interval_s;
}

static void format_duration(char *out, size_t n, double s) {
    if (s < 0 || s != s || s > 1e7) {
        snprintf(out, n, "--:--");
        return;
    }
    long t = (long)(s + 0.5);
    if (t >= 3600)
        snprintf(out, n, "%ld:%02ld:%02ld", t / 3600, (t / 60) % 60, t % 60);
    else
        snprintf(out, n, "%02ld:%02ld", t / 60, t % 60);
}

static void draw(kv_progress *p, int final) {
    const double now = kv_now_seconds();
    const double elapsed = now - p->t_start;
    const double rate = elapsed > 0 ? p->done / elapsed : 0.0;
    const double frac = p->total > 0 ? p->done / p->total : 0.0;
    char eta[32], ela[32];
    format_duration(eta, sizeof eta, rate > 0 ? (p->total - p->done) / rate : -1.0);
    format_duration(ela, sizeof ela, elapsed);
    if (p->is_tty) {
        char bar[31];
        int filled = (int)(frac * 30.0 + 0.5);
        if (filled > 30) filled = 30;
        for (int i = 0; i < 30; i++) bar[i] = i < filled ? '#' : '.';
        bar[30] = '\0';
        fprintf(g_stream, "\r%s [%s] %5.1f%% %.0f/%.0f %s  %.1f %s/s  ETA %s ", p->label, bar,
                100.0 * frac, p->done, p->total, p->unit, rate, p->unit, final ? ela : eta);
        if (final) fputc('\n', g_stream);
    } else {
        fprintf(g_stream, "%s: %.0f/%.0f %s (%.1f%%), %.1f %s/s, elapsed %s, ETA %s\n", p->label,
                p->done, p->total, p->unit, 100.0 * frac, rate, p->unit, ela, final ? "00:00" : eta);
    }
    fflush(g_stream);
    p->t_last_draw = now;
}

void kv_progress_begin(kv_progress *p, const char *label, const char *unit, double total) {
    p->label = label ? label : "";
    p->unit = unit ? unit : "";
    p->total = total;
    p->done = 0;
    p->t_start = kv_now_seconds();
    p->t_last_draw = p->t_start;
    p->is_tty = g_stream ? isatty(fileno(g_stream)) : 0;
    p->active = g_stream != NULL;
}

void kv_progress_update(kv_progress *p, double done) {
    p->done = done;
    if (!p->active) return;
    const double interval = p->is_tty ? 1.0 / 6.0 : g_line_interval;
    if (kv_now_seconds() - p->t_last_draw >= interval) draw(p, 0);
}

void kv_progress_end(kv_progress *p) {
    if (p->active) draw(p, 1);
    p->active = 0;
}
