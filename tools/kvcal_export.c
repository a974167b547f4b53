/* kvcal export: a plan's FP8 / NVFP4 KV scales as a Hugging Face checkpoint that vLLM, SGLang,
 * TensorRT-LLM and transformers + compressed-tensors read (formats/export_hf.c says what is written and
 * what is refused; the output directory and every input are checked before any work, exit 2). */
#include "kv_formats.h"
#include "kv_tools.h"

#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

int kvcal_export(int argc, char **argv) {
    const char *tool = "kvcal export";
    const char *plan_path = NULL, *model = NULL, *format = NULL, *out = NULL;
    const kv_opt opts[] = {
        {"plan", 'p', KV_OPT_STRING, &plan_path, "PLAN", "plan from kvcal fit --method fp8|nvfp4", 1},
        {"model", 'm', KV_OPT_STRING, &model, "HF_DIR", "the Hugging Face checkpoint directory the plan was fitted on", 1},
        {"format", 'f', KV_OPT_STRING, &format, "F", "compressed-tensors (vLLM, SGLang) or modelopt (TensorRT-LLM, "
                                                     "vLLM, SGLang)", 1},
        {"out", 'o', KV_OPT_STRING, &out, "DIR", "output directory (new, or empty): a copy of the checkpoint with the KV scales", 1},
        {NULL, 0, KV_OPT_FLAG, NULL, NULL, NULL, 0},
    };
    kv_cli_args a;
    int rc = kv_cli_parse(&a, tool, "--plan PLAN --model HF_DIR --format compressed-tensors|modelopt --out DIR",
                          "Write a new directory DIR (it must not exist, or be empty): a copy of the checkpoint HF_DIR with the "
                          "plan's KV-cache scales as the engines read them: for compressed-tensors, "
                          "model.layers.N.self_attn.k_scale / v_scale of shape (1,) or (num_kv_heads, 1, 1) in the "
                          "model's dtype and config.json's quantization_config.kv_cache_scheme; for modelopt, "
                          "self_attn.k_proj.k_scale / v_proj.v_scale float32 scalars, hf_quant_config.json and "
                          "quantization_config (quant_method modelopt). The checkpoint's own quantization metadata is "
                          "kept and its old KV scales replaced; written into a temporary directory and renamed. Plans "
                          "these formats cannot express (AQUA-KV predictors, uniform or HIGGS streams, mixed methods) "
                          "and another model's checkpoint are refused with the reason (kernels/FLOAT_KV.md).",
                          opts, 0, argc, argv);
    if (rc != KV_EXIT_OK) return rc < 0 ? KV_EXIT_OK : rc;
    kv_export_format f;
    if (strcmp(format, "compressed-tensors") == 0) {
        f = KV_EXPORT_COMPRESSED_TENSORS;
    } else if (strcmp(format, "modelopt") == 0) {
        f = KV_EXPORT_MODELOPT;
    } else {
        kv_cli_args_free(&a);
        return kv_cli_usage_error(tool, "--format must be compressed-tensors or modelopt (got '%s')", format);
    }
    /* every input and the output before any work (exit 2, as every tool) */
    {
        struct stat sb;
        if (!*model || stat(model, &sb) != 0 || !S_ISDIR(sb.st_mode)) {
            kv_cli_args_free(&a);
            return kv_cli_usage_error(tool, "--model '%s' is not a directory (a Hugging Face checkpoint with "
                                      "config.json)", model);
        }
        const kv_tool_path ins[] = {{"--model", model}, {"--plan", plan_path}};
        if ((rc = kv_tool_check_out_dir(tool, "--out", out, ins, 2)) != KV_EXIT_OK) {
            kv_cli_args_free(&a);
            return rc;
        }
    }
    kv_plan *p = NULL;
    kv_status s = kv_input_check(plan_path);
    if (s == KV_OK) s = kv_plan_read(&p, plan_path);
    if (s == KV_OK) s = kv_export_hf(p, model, f, out);
    if (s == KV_OK && !a.quiet)
        printf("%s: %s scales of %d layers written to %s\n", tool, format, p->n_layers, out);
    kv_plan_free(p);
    kv_cli_args_free(&a);
    return s != KV_OK ? kv_cli_fail(tool, s) : KV_EXIT_OK;
}
