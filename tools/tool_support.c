/* tool_support.c — steps the tools share: open a model with its tokenizer, tokenize a text file. */
#include "kv_tools.h"
#include "kvrt.h"

#include <stdlib.h>
#include <string.h>

kv_status kv_tool_tokenize_file(int32_t **ids, size_t *n, char sha256[65], const kv_tokenizer *t, const char *path) {
    *ids = NULL;
    *n = 0;
    char *text = NULL;
    size_t len = 0;
    kv_status s = kv_file_read_all(&text, &len, path);
    if (s != KV_OK) return s;
    if (sha256) {
        kv_sha256 ctx;
        uint8_t d[32];
        kv_sha256_init(&ctx);
        kv_sha256_update(&ctx, text, len);
        kv_sha256_final(&ctx, d);
        kv_sha256_hex(sha256, d);
    }
    /* the whole file at once: no BOS, the SentencePiece dummy prefix once at the start */
    s = kv_tokenizer_encode(ids, n, t, text, len, 0);
    free(text);
    if (s != KV_OK) return kv_error_wrap(s, "tokenizing '%s': ", path);
    return KV_OK;
}

kv_status kv_tool_open_model(kv_model **model, kv_tokenizer **tok, const char *model_path, const char *tok_path,
                             int n_threads) {
    kv_model_options opt;
    memset(&opt, 0, sizeof opt);
    opt.n_threads = n_threads;
    return kv_tool_open_model_opt(model, tok, model_path, tok_path, &opt);
}

kv_status kv_tool_open_model_opt(kv_model **model, kv_tokenizer **tok, const char *model_path, const char *tok_path,
                                 const kv_model_options *opt) {
    *model = NULL;
    if (tok) *tok = NULL;
    kv_model_file *mf = NULL;
    kv_status s = kv_model_file_open(&mf, model_path);
    if (s != KV_OK) return s;
    if ((s = kv_model_load(model, mf, opt)) != KV_OK) goto done;
    if (tok && (s = kv_tokenizer_load(tok, mf, tok_path)) != KV_OK) {
        kv_model_free(*model);
        *model = NULL;
    }
done:
    kv_model_file_close(mf);
    return s;
}

int kv_tool_weight_storage(const char *name) {
    if (strcmp(name, "f32") == 0) return KV_WEIGHTS_F32;
    if (strcmp(name, "f16") == 0) return KV_WEIGHTS_F16;
    if (strcmp(name, "native") == 0) return KV_WEIGHTS_NATIVE;
    return -1;
}

kv_status kv_tool_make_cache(kv_cache **out, kv_plan **plan_out, kv_model *m, const char *model_path,
                             const char *plan_path, const char *cache_kind, int n_seqs, int capacity, unsigned rt_flags) {
    *out = NULL;
    *plan_out = NULL;
    kv_status s = KV_OK;
    if (plan_path) {
        kv_model_file *mf = NULL;
        kv_plan_fingerprint fp;
        if ((s = kv_plan_read(plan_out, plan_path)) != KV_OK) return s;
        if ((s = kv_model_file_open(&mf, model_path)) == KV_OK && (s = kv_plan_fingerprint_compute(&fp, mf)) == KV_OK &&
            (s = kv_plan_check_fingerprint(*plan_out, &fp)) != KV_OK)
            kv_error_wrap(s, "plan '%s' does not belong to model '%s': ", plan_path, model_path);
        kv_model_file_close(mf);
        if (s == KV_OK && (s = kv_cache_rt_create(out, *plan_out, m, n_seqs, capacity, 0, rt_flags)) != KV_OK)
            kv_error_wrap(s, "plan '%s': ", plan_path);
    } else if (cache_kind && strcmp(cache_kind, "f16") == 0) {
        s = kv_cache_rt_create(out, NULL, m, n_seqs, capacity, 0, 0);
    } else {
        s = kv_cache_plain_create(out, kv_model_arch(m), n_seqs, capacity);
    }
    if (s != KV_OK) {
        kv_plan_free(*plan_out);
        *plan_out = NULL;
    }
    return s;
}
