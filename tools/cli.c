/* Shared command-line parsing for the three tools (kv_cli.h). */
#include "kv_cli.h"

#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

static void print_help(FILE *fp, const char *tool, const char *usage, const char *description,
                       const kv_opt *opts) {
    fprintf(fp, "usage: %s %s\n", tool, usage);
    if (description) fprintf(fp, "\n%s\n", description);
    fprintf(fp, "\noptions:\n");
    for (const kv_opt *o = opts; o && o->name; o++) {
        char left[96];
        const char *mv = o->type == KV_OPT_FLAG ? "" : (o->metavar ? o->metavar : "VALUE");
        if (o->short_name)
            snprintf(left, sizeof left, "-%c, --%s%s%s", o->short_name, o->name, *mv ? " " : "", mv);
        else
            snprintf(left, sizeof left, "    --%s%s%s", o->name, *mv ? " " : "", mv);
        fprintf(fp, "  %-30s %s%s\n", left, o->help ? o->help : "", o->required ? " (required)" : "");
    }
    fprintf(fp, "  %-30s %s\n", "-v, --verbose", "more diagnostics on stderr");
    fprintf(fp, "  %-30s %s\n", "-q, --quiet", "errors only, no progress");
    fprintf(fp, "  %-30s %s\n", "-h, --help", "show this help and exit");
}

int kv_cli_usage_error(const char *tool, const char *fmt, ...) {
    va_list ap;
    fprintf(stderr, "%s: usage error: ", tool);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\n(try '%s --help')\n", tool);
    return KV_EXIT_USAGE;
}

static int set_value(const char *tool, const kv_opt *o, const char *val) {
    char *end = NULL;
    switch (o->type) {
    case KV_OPT_FLAG:
        *(int *)o->target = 1;
        return 0;
    case KV_OPT_STRING:
        *(const char **)o->target = val;
        return 0;
    case KV_OPT_INT: {
        errno = 0;
        long v = strtol(val, &end, 10);
        if (errno || !end || *end || end == val)
            return kv_cli_usage_error(tool, "--%s expects an integer, got '%s'", o->name, val);
        *(long *)o->target = v;
        return 0;
    }
    case KV_OPT_DOUBLE: {
        errno = 0;
        double v = strtod(val, &end);
        if (errno || !end || *end || end == val)
            return kv_cli_usage_error(tool, "--%s expects a number, got '%s'", o->name, val);
        *(double *)o->target = v;
        return 0;
    }
    }
    return KV_EXIT_USAGE;
}

int kv_cli_parse(kv_cli_args *out, const char *tool, const char *usage, const char *description,
                 const kv_opt *opts, int max_pos, int argc, char **argv) {
    memset(out, 0, sizeof *out);
    int nopts = 0;
    while (opts && opts[nopts].name) nopts++;
    out->seen = calloc((size_t)nopts + 1, sizeof(int));
    out->pos = calloc((size_t)argc + 1, sizeof(char *));
    if (!out->seen || !out->pos) {
        fprintf(stderr, "%s: out of memory\n", tool);
        kv_cli_args_free(out);
        return KV_EXIT_RUNTIME;
    }
    int only_pos = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (only_pos || a[0] != '-' || a[1] == '\0') {
            out->pos[out->npos++] = argv[i];
            continue;
        }
        if (strcmp(a, "--") == 0) {
            only_pos = 1;
            continue;
        }
        if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
            print_help(stdout, tool, usage, description, opts);
            kv_cli_args_free(out);
            return -1;
        }
        if (strcmp(a, "-v") == 0 || strcmp(a, "--verbose") == 0) {
            out->verbose = 1;
            continue;
        }
        if (strcmp(a, "-q") == 0 || strcmp(a, "--quiet") == 0) {
            out->quiet = 1;
            continue;
        }
        const kv_opt *found = NULL;
        const char *inline_val = NULL;
        int idx = -1;
        for (int k = 0; k < nopts; k++) {
            const kv_opt *o = &opts[k];
            if (a[1] == '-') {
                size_t n = strlen(o->name);
                if (strncmp(a + 2, o->name, n) == 0 && (a[2 + n] == '\0' || a[2 + n] == '=')) {
                    found = o;
                    idx = k;
                    if (a[2 + n] == '=') inline_val = a + 3 + n;
                    break;
                }
            } else if (o->short_name && a[1] == o->short_name && a[2] == '\0') {
                found = o;
                idx = k;
                break;
            }
        }
        if (!found) {
            int rc = kv_cli_usage_error(tool, "unknown option '%s'", a);
            kv_cli_args_free(out);
            return rc;
        }
        const char *val = NULL;
        if (found->type != KV_OPT_FLAG) {
            if (inline_val) {
                val = inline_val;
            } else if (i + 1 < argc) {
                val = argv[++i];
            } else {
                int rc = kv_cli_usage_error(tool, "option --%s needs a value", found->name);
                kv_cli_args_free(out);
                return rc;
            }
        } else if (inline_val) {
            int rc = kv_cli_usage_error(tool, "option --%s takes no value", found->name);
            kv_cli_args_free(out);
            return rc;
        }
        int rc = set_value(tool, found, val);
        if (rc) {
            kv_cli_args_free(out);
            return rc;
        }
        out->seen[idx] = 1;
    }
    for (int k = 0; k < nopts; k++) {
        if (opts[k].required && !out->seen[k]) {
            int rc = kv_cli_usage_error(tool, "missing required option --%s", opts[k].name);
            kv_cli_args_free(out);
            return rc;
        }
    }
    if (out->npos > max_pos) {
        int rc = kv_cli_usage_error(tool, "unexpected argument '%s'", out->pos[max_pos]);
        kv_cli_args_free(out);
        return rc;
    }
    kv_log_set_callback(kv_log_to_stream, stderr,
                        out->quiet ? KV_LOG_ERROR : (out->verbose ? KV_LOG_DEBUG : KV_LOG_INFO));
    kv_progress_set_stream(out->quiet ? NULL : stderr, 10.0);
    return KV_EXIT_OK;
}

void kv_cli_args_free(kv_cli_args *a) {
    if (!a) return;
    free(a->seen);
    free(a->pos);
    a->seen = NULL;
    a->pos = NULL;
    a->npos = 0;
}

int kv_cli_given(const kv_cli_args *a, const kv_opt *opts, const char *name) {
    for (int k = 0; opts && opts[k].name; k++)
        if (strcmp(opts[k].name, name) == 0) return a->seen ? a->seen[k] : 0;
    return 0;
}

const char **kv_cli_collect(int argc, char **argv, const char *name, int extra, int *n) {
    const char **v = calloc((size_t)argc + (size_t)(extra > 0 ? extra : 0) + 1, sizeof *v);
    const size_t len = strlen(name);
    *n = 0;
    for (int i = 1; v && i < argc && strcmp(argv[i], "--") != 0; i++) {
        const char *a = argv[i];
        if (strncmp(a, "--", 2) != 0 || strncmp(a + 2, name, len) != 0) continue;
        if (a[2 + len] == '\0' && i + 1 < argc) v[(*n)++] = argv[++i];
        else if (a[2 + len] == '=') v[(*n)++] = a + 3 + len;
    }
    return v;
}

/* Results go to stdout: a write error there (a full disk, /dev/full) fails the run (exit 1) instead of
 * leaving a truncated result behind an exit 0. */
static int close_stdout(const char *tool, int rc) {
    errno = 0;
    const int bad = fflush(stdout) != 0 || ferror(stdout);
    const int e = errno;
    const int cbad = fclose(stdout) != 0;
    if ((bad || cbad) && rc == KV_EXIT_OK) {
        fprintf(stderr, "%s: error: cannot write the results to standard output: %s\n", tool,
                strerror(bad ? (e ? e : EIO) : errno));
        return KV_EXIT_RUNTIME;
    }
    return rc;
}

static int dispatch(const char *tool, const char *summary, const kv_subcommand *cmds, int argc, char **argv);

int kv_cli_dispatch(const char *tool, const char *summary, const kv_subcommand *cmds, int argc, char **argv) {
    return close_stdout(tool, dispatch(tool, summary, cmds, argc, argv));
}

static int dispatch(const char *tool, const char *summary, const kv_subcommand *cmds, int argc, char **argv) {
    if (argc < 2 || strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0 ||
        strcmp(argv[1], "help") == 0) {
        FILE *fp = argc < 2 ? stderr : stdout;
        fprintf(fp, "usage: %s COMMAND [OPTIONS]\n\n%s\n\ncommands:\n", tool, summary);
        for (const kv_subcommand *c = cmds; c->name; c++) fprintf(fp, "  %-12s %s\n", c->name, c->summary);
        fprintf(fp, "\n'%s COMMAND --help' describes a command. '%s --version' prints the version.\n",
                tool, tool);
        return argc < 2 ? KV_EXIT_USAGE : KV_EXIT_OK;
    }
    if (strcmp(argv[1], "--version") == 0) {
        printf("%s %s\n", tool, KV_VERSION_STRING);
        return KV_EXIT_OK;
    }
    for (const kv_subcommand *c = cmds; c->name; c++)
        if (strcmp(argv[1], c->name) == 0) return c->run(argc - 1, argv + 1);
    return kv_cli_usage_error(tool, "unknown command '%s'", argv[1]);
}

int kv_cli_fail(const char *tool, kv_status s) {
    const char *msg = kv_error_last();
    fprintf(stderr, "%s: error: %s [%s at %s]\n", tool, *msg ? msg : kv_status_name(s),
            kv_status_name(s), kv_error_where());
    return KV_EXIT_RUNTIME;
}
