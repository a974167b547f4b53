/* kv_cli.h — command-line parsing shared by kvcal, kvprof and kvrun.
 *
 * Every subcommand declares a table of options; --help/-h, --verbose/-v and --quiet/-q are
 * implicit. Exit codes: KV_EXIT_OK (0), KV_EXIT_RUNTIME (1, a kv_status error), KV_EXIT_USAGE (2).
 */
#ifndef KV_CLI_H
#define KV_CLI_H

#include "kv_common.h"

#ifdef __cplusplus
extern "C" {
#endif

enum { KV_EXIT_OK = 0, KV_EXIT_RUNTIME = 1, KV_EXIT_USAGE = 2 };

typedef enum kv_opt_type {
    KV_OPT_FLAG,   /* int*: set to 1 when present */
    KV_OPT_STRING, /* const char**: borrowed from argv */
    KV_OPT_INT,    /* long* */
    KV_OPT_DOUBLE  /* double* */
} kv_opt_type;

typedef struct kv_opt {
    const char *name;   /* long name without the dashes; NULL ends the table */
    char short_name;    /* 0 when there is none */
    kv_opt_type type;
    void *target;
    const char *metavar; /* "N", "PATH" ...; ignored for flags */
    const char *help;
    int required;
} kv_opt;

typedef struct kv_cli_args {
    int npos;
    char **pos; /* positional arguments (borrowed from argv) */
    int verbose;
    int quiet;
    int *seen;  /* seen[i] != 0 when option i was given on the command line (owned; kv_cli_args_free) */
} kv_cli_args;

/* Parse argv (argv[0] is the subcommand name). Returns KV_EXIT_OK on success, KV_EXIT_USAGE after
 * printing a message to stderr, or -1 after printing --help to stdout (the caller exits 0).
 * Positional arguments beyond max_pos are a usage error. Installs logging (-v/-q) and progress. */
int kv_cli_parse(kv_cli_args *out, const char *tool, const char *usage, const char *description,
                 const kv_opt *opts, int max_pos, int argc, char **argv);
void kv_cli_args_free(kv_cli_args *a);
/* Was the option named `name` given? (For config-file overrides.) */
int kv_cli_given(const kv_cli_args *a, const kv_opt *opts, const char *name);
/* Every value of a repeatable option --NAME V / --NAME=V, in order, before a "--" (the parser keeps only the last):
 * a calloc'ed array (borrowed strings) with room for `extra` more entries, its count in *n; NULL when out of memory. */
const char **kv_cli_collect(int argc, char **argv, const char *name, int extra, int *n);

typedef struct kv_subcommand {
    const char *name;
    const char *summary;
    int (*run)(int argc, char **argv); /* returns an exit code */
} kv_subcommand;

/* Top-level dispatch: "tool SUB ...", "tool --help", "tool --version". */
int kv_cli_dispatch(const char *tool, const char *summary, const kv_subcommand *cmds, int argc,
                    char **argv);

/* Print "tool: error: <message> [file:line]" for a failed status and return KV_EXIT_RUNTIME. */
int kv_cli_fail(const char *tool, kv_status s);

/* Print a usage error and return KV_EXIT_USAGE. */
int kv_cli_usage_error(const char *tool, const char *fmt, ...) KV_PRINTF(2, 3);

#ifdef __cplusplus
}
#endif
#endif /* KV_CLI_H */
