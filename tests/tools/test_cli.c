/* Unit tests for the shared command-line parser (tools/cli.c). */
#include "kv_test.h"
#include "kv_cli.h"

typedef struct parsed {
    const char *model;
    long ctx;
    double temp;
    int json;
} parsed;

static int parse(parsed *p, kv_cli_args *a, int argc, char **argv) {
    const kv_opt opts[] = {
        {"model", 'm', KV_OPT_STRING, &p->model, "PATH", "model file", 1},
        {"ctx", 0, KV_OPT_INT, &p->ctx, "N", "context length", 0},
        {"temp", 0, KV_OPT_DOUBLE, &p->temp, "T", "temperature", 0},
        {"json", 0, KV_OPT_FLAG, &p->json, NULL, "JSON output", 0},
        {NULL, 0, 0, NULL, NULL, NULL, 0},
    };
    int rc = kv_cli_parse(a, "kvtest", "sub [options] [FILE]", NULL, opts, 1, argc, argv);
    if (rc == 0) {
        /* kv_cli_given works with the same table */
        ck_assert_int_eq(kv_cli_given(a, opts, "json"), p->json);
    }
    return rc;
}

START_TEST(test_parse_ok) {
    parsed p = {NULL, 512, 0.0, 0};
    kv_cli_args a;
    char *argv[] = {"sub", "--model", "m.gguf", "--ctx=2048", "--temp", "0.5", "--json", "extra", NULL};
    ck_assert_int_eq(parse(&p, &a, 8, argv), 0);
    ck_assert_str_eq(p.model, "m.gguf");
    ck_assert_int_eq(p.ctx, 2048);
    ck_assert_double_eq(p.temp, 0.5);
    ck_assert_int_eq(p.json, 1);
    ck_assert_int_eq(a.npos, 1);
    ck_assert_str_eq(a.pos[0], "extra");
    kv_cli_args_free(&a);
}
END_TEST

START_TEST(test_parse_errors) {
    parsed p = {NULL, 512, 0.0, 0};
    kv_cli_args a;
    char *missing[] = {"sub", "--ctx", "5", NULL};
    ck_assert_int_eq(parse(&p, &a, 3, missing), KV_EXIT_USAGE); /* --model is required */
    char *badint[] = {"sub", "-m", "x", "--ctx", "12a", NULL};
    ck_assert_int_eq(parse(&p, &a, 5, badint), KV_EXIT_USAGE);
    char *noval[] = {"sub", "-m", "x", "--ctx", NULL};
    ck_assert_int_eq(parse(&p, &a, 4, noval), KV_EXIT_USAGE);
    char *unknown[] = {"sub", "-m", "x", "--bogus", NULL};
    ck_assert_int_eq(parse(&p, &a, 4, unknown), KV_EXIT_USAGE);
    char *toomany[] = {"sub", "-m", "x", "a", "b", NULL};
    ck_assert_int_eq(parse(&p, &a, 5, toomany), KV_EXIT_USAGE);
    char *flagval[] = {"sub", "-m", "x", "--json=1", NULL};
    ck_assert_int_eq(parse(&p, &a, 4, flagval), KV_EXIT_USAGE);
    char *help[] = {"sub", "--help", NULL};
    ck_assert_int_eq(parse(&p, &a, 2, help), -1);
}
END_TEST

int main(void) {
    Suite *s = suite_create("cli");
    TCase *tc = tcase_create("parse");
    tcase_add_test(tc, test_parse_ok);
    tcase_add_test(tc, test_parse_errors);
    suite_add_tcase(s, tc);
    return kv_test_run(s);
}
