/* kvrun inspect: print a compression plan (formats/PLAN_FORMAT.md §10) as YAML or JSON, or check it
 * against a model's fingerprint (§6.1): exit 0 when it matches, 1 with the first difference. */
#include "kv_formats.h"
#include "kv_tools.h"

#include <stdio.h>
#include <stdlib.h>

static const char k_usage[] = "PLAN [--json] [--full]  |  --check PLAN --model M";
static const char k_desc[] =
    "Print every field of a compression plan: format header and sections, provenance (with the\n"
    "resolved configuration), model fingerprint, global settings, grids, the per-layer table with\n"
    "bits per value, totals and the calibration report. YAML by default, JSON with --json.\n"
    "With --check, verify instead that the plan was made for the model M (architecture and a hash of\n"
    "its K/V projection weights): exit 0 when it matches, 1 with the first difference.";

static int check_plan(const kv_plan *plan, const char *plan_path, const char *model_path, int json) {
    kv_model_file *mf = NULL;
    kv_status s = kv_model_file_open(&mf, model_path);
    if (s != KV_OK) return kv_cli_fail("kvrun inspect", s);
    kv_plan_fingerprint fp;
    s = kv_plan_fingerprint_compute(&fp, mf);
    kv_model_file_close(mf);
    if (s != KV_OK) return kv_cli_fail("kvrun inspect", s);
    s = kv_plan_check_fingerprint(plan, &fp);
    char hex[65];
    kv_sha256_hex(hex, fp.kv_sha256);
    if (json) {
        /* The message is ours (ASCII) but paths may hold anything: print them through jansson-free
         * escaping of the few characters JSON forbids. */
        printf("{\"plan\": ");
        for (int k = 0; k < 2; k++) {
            const char *str = k ? model_path : plan_path;
            putchar('"');
            for (const unsigned char *c = (const unsigned char *)str; *c; c++) {
                if (*c == '"' || *c == '\\') printf("\\%c", *c);
                else if (*c < 0x20) printf("\\u%04x", *c);
                else putchar(*c);
            }
            printf(k ? "\"" : "\", \"model\": ");
        }
        printf(", \"match\": %s, \"kv_sha256\": \"%s\"}\n", s == KV_OK ? "true" : "false", hex);
    }
    if (s != KV_OK) return kv_cli_fail("kvrun inspect", kv_error_wrap(s, "plan '%s' does not fit model '%s': ", plan_path, model_path));
    if (!json)
        printf("ok: plan '%s' matches model '%s' (%s, %d layers, K/V sha256 %.16s...)\n", plan_path, model_path,
               fp.arch, fp.n_layers, hex);
    return KV_EXIT_OK;
}

int kvrun_inspect(int argc, char **argv) {
    int json = 0, full = 0, check = 0;
    const char *model = NULL;
    const kv_opt opts[] = {
        {"json", 0, KV_OPT_FLAG, &json, NULL, "print JSON instead of YAML", 0},
        {"full", 0, KV_OPT_FLAG, &full, NULL, "include every array (grid points, predictor matrices, SQuat bases)", 0},
        {"check", 0, KV_OPT_FLAG, &check, NULL, "verify the plan's model fingerprint against --model", 0},
        {"model", 'm', KV_OPT_STRING, &model, "PATH", "model file or directory (with --check)", 0},
        {NULL, 0, KV_OPT_FLAG, NULL, NULL, NULL, 0},
    };
    kv_cli_args a;
    int rc = kv_cli_parse(&a, "kvrun inspect", k_usage, k_desc, opts, 1, argc, argv);
    if (rc < 0) return KV_EXIT_OK;
    if (rc != KV_EXIT_OK) return rc;
    if (a.npos != 1) {
        kv_cli_args_free(&a);
        return kv_cli_usage_error("kvrun inspect", "expected one PLAN file");
    }
    if (check != (model != NULL)) {
        kv_cli_args_free(&a);
        return kv_cli_usage_error("kvrun inspect", check ? "--check needs --model M" : "--model is used with --check");
    }
    const char *path = a.pos[0];
    kv_plan *plan = NULL;
    kv_status s = kv_plan_read(&plan, path);
    if (s != KV_OK) {
        kv_cli_args_free(&a);
        return kv_cli_fail("kvrun inspect", s);
    }
    if (check) {
        rc = check_plan(plan, path, model, json);
    } else {
        char *text = NULL;
        s = kv_plan_dump(&text, plan, json, full);
        if (s == KV_OK) {
            fputs(text, stdout);
            rc = fflush(stdout) == 0 ? KV_EXIT_OK : KV_EXIT_RUNTIME;
        } else {
            rc = kv_cli_fail("kvrun inspect", s);
        }
        free(text);
    }
    kv_plan_free(plan);
    kv_cli_args_free(&a);
    return rc;
}
