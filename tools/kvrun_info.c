/* kvrun info: describe a model file (any format kv_model_file_open reads): architecture, tensor
 * types, parameter count, file size and the shape of the KV cache per token. */
#define _POSIX_C_SOURCE 200809L
#include "kv_formats.h"
#include "kv_tools.h"

#include <dirent.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

static const char *format_name(kv_model_format f) {
    switch (f) {
    case KV_MODEL_GGUF: return "gguf";
    case KV_MODEL_SAFETENSORS: return "safetensors";
    case KV_MODEL_LLAMA2C: return "llama2c";
    }
    return "unknown";
}

static const char *rope_layout_name(kv_rope_layout l) { return l == KV_ROPE_HALF ? "half" : "adjacent"; }

static const char *rope_scaling_name(kv_rope_scaling s) {
    switch (s) {
    case KV_ROPE_SCALING_LINEAR: return "linear";
    case KV_ROPE_SCALING_LLAMA3: return "llama3";
    default: return "none";
    }
}

/* Bytes on disk: the file, or the *.safetensors files of a directory. */
static unsigned long long disk_bytes(const char *path) {
    struct stat st;
    if (stat(path, &st) != 0) return 0;
    if (!S_ISDIR(st.st_mode)) return (unsigned long long)st.st_size;
    unsigned long long total = 0;
    DIR *d = opendir(path);
    if (!d) return 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        size_t n = strlen(e->d_name);
        if (n < 12 || strcmp(e->d_name + n - 12, ".safetensors") != 0) continue;
        char full[4096];
        snprintf(full, sizeof full, "%s/%s", path, e->d_name);
        if (stat(full, &st) == 0 && S_ISREG(st.st_mode)) total += (unsigned long long)st.st_size;
    }
    closedir(d);
    return total;
}

static void json_str(const char *s) {
    putchar('"');
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p == '"' || *p == '\\')
            printf("\\%c", *p);
        else if (*p < 0x20)
            printf("\\u%04x", *p);
        else
            putchar(*p);
    }
    putchar('"');
}

enum { N_DTYPE_SLOTS = 64 };

static void print_json(const kv_model_file *mf, const size_t *by_dtype, unsigned long long params,
                       unsigned long long bytes) {
    const kv_arch *a = kv_model_file_arch(mf);
    const unsigned long long kv_values = 2ull * (unsigned long long)a->n_layers * (unsigned long long)a->n_kv_heads *
                                         (unsigned long long)a->head_dim;
    printf("{\n  \"path\": ");
    json_str(kv_model_file_path(mf));
    printf(",\n  \"format\": \"%s\",\n", format_name(kv_model_file_format(mf)));
    if (kv_model_file_gguf(mf)) printf("  \"gguf_version\": %u,\n", kv_gguf_version(kv_model_file_gguf(mf)));
    printf("  \"arch\": {\n    \"arch\": ");
    json_str(a->arch);
    printf(",\n    \"name\": ");
    json_str(a->name);
    printf(",\n    \"n_layers\": %d,\n    \"d_model\": %d,\n    \"n_heads\": %d,\n    \"n_kv_heads\": %d,\n"
           "    \"head_dim\": %d,\n    \"d_ff\": %d,\n    \"vocab_size\": %d,\n    \"max_seq_len\": %d,\n"
           "    \"rms_eps\": %.9g,\n    \"rope_theta\": %.9g,\n    \"rope_layout\": \"%s\",\n"
           "    \"rope_scaling\": \"%s\",\n    \"rope_factor\": %.9g,\n    \"rope_low_freq_factor\": %.9g,\n"
           "    \"rope_high_freq_factor\": %.9g,\n    \"rope_orig_max_pos\": %d,\n    \"qkv_bias\": %s,\n"
           "    \"tied_embeddings\": %s,\n    \"bos_id\": %d,\n    \"eos_id\": %d\n  },\n",
           a->n_layers, a->d_model, a->n_heads, a->n_kv_heads, a->head_dim, a->d_ff, a->vocab_size,
           a->max_seq_len, (double)a->rms_eps, (double)a->rope_theta, rope_layout_name(a->rope_layout),
           rope_scaling_name(a->rope_scaling), (double)a->rope_factor, (double)a->rope_low_freq_factor,
           (double)a->rope_high_freq_factor, a->rope_orig_max_pos, a->qkv_bias ? "true" : "false",
           a->tied_embeddings ? "true" : "false", a->bos_id, a->eos_id);
    printf("  \"tensor_count\": %zu,\n  \"tensors_by_dtype\": {", kv_model_file_tensor_count(mf));
    const char *sep = "";
    for (int t = 0; t < N_DTYPE_SLOTS; t++) {
        if (!by_dtype[t]) continue;
        const char *n = kv_dtype_name(t);
        printf("%s\"%s\": %zu", sep, n ? n : "?", by_dtype[t]);
        sep = ", ";
    }
    printf("},\n  \"parameters\": %llu,\n  \"file_bytes\": %llu,\n", params, bytes);
    printf("  \"kv_per_token\": {\"n_layers\": %d, \"tensors_per_layer\": 2, \"n_kv_heads\": %d, "
           "\"head_dim\": %d, \"values\": %llu, \"bytes_fp16\": %llu}\n}\n",
           a->n_layers, a->n_kv_heads, a->head_dim, kv_values, 2 * kv_values);
}

static void print_text(const kv_model_file *mf, const size_t *by_dtype, unsigned long long params,
                       unsigned long long bytes) {
    const kv_arch *a = kv_model_file_arch(mf);
    const unsigned long long kv_values = 2ull * (unsigned long long)a->n_layers * (unsigned long long)a->n_kv_heads *
                                         (unsigned long long)a->head_dim;
    printf("model          %s\n", kv_model_file_path(mf));
    if (kv_model_file_gguf(mf))
        printf("format         gguf (v%u)\n", kv_gguf_version(kv_model_file_gguf(mf)));
    else
        printf("format         %s\n", format_name(kv_model_file_format(mf)));
    printf("name           %s\n", a->name);
    printf("architecture   %s\n", a->arch);
    printf("layers         %d\n", a->n_layers);
    printf("d_model        %d\n", a->d_model);
    printf("heads          %d query, %d KV (GQA group %d), head_dim %d\n", a->n_heads, a->n_kv_heads,
           a->n_kv_heads ? a->n_heads / a->n_kv_heads : 0, a->head_dim);
    printf("d_ff           %d\n", a->d_ff);
    printf("vocab          %d\n", a->vocab_size);
    printf("max_seq_len    %d\n", a->max_seq_len);
    printf("rms_eps        %g\n", (double)a->rms_eps);
    printf("rope           theta %g, layout %s (%s)\n", (double)a->rope_theta, rope_layout_name(a->rope_layout),
           a->rope_layout == KV_ROPE_HALF ? "pairs i, i+head_dim/2" : "pairs 2i, 2i+1");
    if (a->rope_scaling == KV_ROPE_SCALING_LLAMA3)
        printf("rope scaling   llama3: factor %g, low_freq_factor %g, high_freq_factor %g, original context %d\n",
               (double)a->rope_factor, (double)a->rope_low_freq_factor, (double)a->rope_high_freq_factor,
               a->rope_orig_max_pos);
    else if (a->rope_scaling == KV_ROPE_SCALING_LINEAR)
        printf("rope scaling   linear: factor %g\n", (double)a->rope_factor);
    else
        printf("rope scaling   none\n");
    printf("qkv bias       %s\n", a->qkv_bias ? "yes" : "no");
    printf("embeddings     %s\n", a->tied_embeddings ? "tied (output = token_embd)" : "separate output.weight");
    printf("bos / eos      %d / %d\n", a->bos_id, a->eos_id);
    printf("tensors        %zu (", kv_model_file_tensor_count(mf));
    const char *sep = "";
    for (int t = 0; t < N_DTYPE_SLOTS; t++) {
        if (!by_dtype[t]) continue;
        const char *n = kv_dtype_name(t);
        printf("%s%s %zu", sep, n ? n : "?", by_dtype[t]);
        sep = ", ";
    }
    printf(")\n");
    printf("parameters     %llu (%.2f M)\n", params, (double)params / 1e6);
    printf("file size      %llu bytes (%.2f MiB)\n", bytes, (double)bytes / (1024.0 * 1024.0));
    printf("KV per token   %d layers x 2 (K, V) x %d KV heads x %d = %llu values, %llu bytes at fp16\n",
           a->n_layers, a->n_kv_heads, a->head_dim, kv_values, 2 * kv_values);
}

int kvrun_info(int argc, char **argv) {
    const char *model = NULL;
    int json = 0;
    const kv_opt opts[] = {
        {"model", 'm', KV_OPT_STRING, &model, "PATH", "model: GGUF file, HF safetensors directory or llama2.c checkpoint", 1},
        {"json", 0, KV_OPT_FLAG, &json, NULL, "print JSON instead of text", 0},
        {NULL, 0, KV_OPT_FLAG, NULL, NULL, NULL, 0},
    };
    kv_cli_args args;
    int rc = kv_cli_parse(&args, "kvrun info", "--model PATH [--json]",
                          "Describe a model: architecture, tensor types, parameters, file size and the KV "
                          "cache per token.",
                          opts, 0, argc, argv);
    if (rc == -1) return KV_EXIT_OK;
    if (rc != KV_EXIT_OK) return rc;
    kv_cli_args_free(&args);

    kv_model_file *mf = NULL;
    kv_status s = kv_model_file_open(&mf, model);
    if (s != KV_OK) return kv_cli_fail("kvrun info", s);
    size_t by_dtype[N_DTYPE_SLOTS] = {0};
    unsigned long long params = 0;
    for (size_t i = 0; i < kv_model_file_tensor_count(mf); i++) {
        const kv_tensor_info *t = kv_model_file_tensor_at(mf, i);
        if (t->dtype >= 0 && t->dtype < N_DTYPE_SLOTS) by_dtype[t->dtype]++;
        params += (unsigned long long)(t->ne[0] * t->ne[1] * t->ne[2] * t->ne[3]);
    }
    const unsigned long long bytes = disk_bytes(model);
    if (json)
        print_json(mf, by_dtype, params, bytes);
    else
        print_text(mf, by_dtype, params, bytes);
    kv_model_file_close(mf);
    return KV_EXIT_OK;
}
