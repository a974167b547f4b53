/* kvrun selfcheck: the CPU-vs-device self-check of the runtime (kv_rt_selfcheck, kernels/RUNTIME.md §10.4) for
 * every kind of codec (the built-in catalogue), or for one plan and its model. */
#include "kv_tools.h"
#include "kvrt.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static const char *k_tool = "kvrun selfcheck";

static void print_row(const char *name, kv_status s, const kv_rt_check *r, int json, int first) {
    if (json) {
        printf("%s{\"codec\": ", first ? "" : ", ");
        kv_tool_json_string(stdout, name);
        printf(", \"passed\": %s, \"seconds\": %.4f, \"worst_error_over_bound\": %.4g, \"rows_checked\": %llu, "
               "\"values_compared\": %llu, \"values_differing\": %llu, \"max_relative_difference\": %.3g, \"what\": ",
               s == KV_OK ? "true" : "false", r->seconds, r->worst_ratio, (unsigned long long)r->rows_checked,
               (unsigned long long)r->values_compared, (unsigned long long)r->values_differing, r->max_recon_rel);
        kv_tool_json_string(stdout, s == KV_OK ? "" : (r->what[0] ? r->what : kv_error_last()));
        printf("}");
        return;
    }
    printf("%-34s %-4s %8.3f s  error/bound %-9.3g cache %llu/%llu values differ", name, s == KV_OK ? "ok" : "FAIL",
           r->seconds, r->worst_ratio, (unsigned long long)r->values_differing, (unsigned long long)r->values_compared);
    if (s != KV_OK) printf("\n    %s", r->what[0] ? r->what : kv_error_last());
    printf("\n");
}

int kvrun_selfcheck(int argc, char **argv) {
    const char *device = "cuda", *plan_path = NULL, *model = NULL;
    int json = 0;
    const kv_opt opts[] = {
        {"device", 0, KV_OPT_STRING, &device, "DEV",
         "cuda (the GPU; default) or cuda-model (the CUDA backend's kernels run on the CPU by their host model)", 0},
        {"plan", 'p', KV_OPT_STRING, &plan_path, "PLAN", "check this plan (with --model) instead of every kind of codec", 0},
        {"model", 'm', KV_OPT_STRING, &model, "PATH", "the plan's model (its RoPE and heads)", 0},
        {"json", 0, KV_OPT_FLAG, &json, NULL, "print the result as one JSON object", 0},
        {NULL, 0, 0, NULL, NULL, NULL, 0},
    };
    kv_cli_args args;
    int rc = kv_cli_parse(&args, k_tool, "[--device cuda|cuda-model] [--plan P --model M] [--json]",
                          "Run the runtime's self-check: the same synthetic sequence through the CPU runtime and the\n"
                          "device, compressed caches compared bit for bit and attention outputs against the runtime's\n"
                          "error bound (kernels/RUNTIME.md §10.4), for one small plan per kind of codec or for --plan.\n"
                          "Exit 0 when every check passes, 1 otherwise.",
                          opts, 0, argc, argv);
    if (rc) return rc < 0 ? KV_EXIT_OK : rc;
    kv_cli_args_free(&args);
    kv_rt_options o;
    memset(&o, 0, sizeof o);
    o.n_seqs = 1;
    if (strcmp(device, "cuda") == 0)
        o.device = KV_RT_DEVICE_CUDA;
    else if (strcmp(device, "cuda-model") == 0)
        o.device = KV_RT_DEVICE_CUDA_MODEL;
    else
        return kv_cli_usage_error(k_tool, "--device must be cuda or cuda-model, not '%s'", device);
    if (!plan_path != !model) return kv_cli_usage_error(k_tool, "--plan and --model go together");
    int failed = 0;
    kv_status s = KV_OK;
    if (json) printf("{\"device\": \"%s\", \"checks\": [", device);
    if (plan_path) {
        kv_model *m = NULL;
        kv_plan *plan = NULL;
        kv_rt_check r;
        memset(&r, 0, sizeof r);
        if ((s = kv_tool_open_model(&m, NULL, model, NULL, 0)) == KV_OK && (s = kv_plan_read(&plan, plan_path)) == KV_OK) {
            o.n_heads = kv_model_arch(m)->n_heads;
            o.rope_inv_freq = kv_model_rope_inv_freq_d(m);
            o.rope_layout = (int)kv_model_arch(m)->rope_layout;
            const kv_status c = kv_rt_selfcheck(plan, &o, &r);
            print_row(plan_path, c, &r, json, 1);
            failed = c != KV_OK;
        }
        kv_plan_free(plan);
        kv_model_free(m);
    } else {
        double freq[32]; /* the catalogue's shape: head_dim 64, RoPE theta 10000, adjacent pairs */
        for (int i = 0; i < 32; i++) freq[i] = 1.0 / pow(10000.0, 2.0 * i / 64.0);
        o.n_heads = 9;
        o.rope_inv_freq = freq;
        for (int i = 0; i < kv_rt_selfcheck_catalog_size() && s == KV_OK; i++) {
            kv_plan *plan = NULL;
            const char *name = NULL;
            kv_rt_check r;
            memset(&r, 0, sizeof r);
            if ((s = kv_rt_selfcheck_catalog(i, &plan, &name)) != KV_OK) break;
            const kv_status c = kv_rt_selfcheck(plan, &o, &r);
            print_row(name, c, &r, json, i == 0);
            fflush(stdout);
            failed += c != KV_OK;
            kv_plan_free(plan);
            /* no device at all: every entry would say the same */
            if (c == KV_EUNSUPPORTED) {
                s = c;
                break;
            }
        }
    }
    if (json) printf("], \"failed\": %d}\n", failed);
    if (s != KV_OK) return kv_cli_fail(k_tool, s);
    if (!json) printf("%s: %d %s failed\n", k_tool, failed, kv_tool_plural(failed, "check", "checks"));
    return failed ? KV_EXIT_RUNTIME : KV_EXIT_OK;
}
