/* stories_fixture.h — stories260K loaded and the start of wiki.valid.raw tokenized: the fixture of the C
 * tests that run the tiny real model (tests/fit, tests/search). Include once per test binary, after
 * kv_test.h and kv_model.h. */
#ifndef KV_STORIES_FIXTURE_H
#define KV_STORIES_FIXTURE_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The model (2 threads) and about `text_bytes` of wiki.valid.raw, cut at a line end, tokenized without
 * BOS; bos = the tokenizer's BOS when it adds one by default, else -1. tokenizer: a tokenizer file, or
 * NULL for the one found beside the model. model_path (4096 bytes, may be NULL) receives the model's path. */
static void stories_load(kv_model_file **mf, kv_model **model, int32_t **ids, size_t *n, int32_t *bos, size_t text_bytes,
                         const char *tokenizer, char *model_path) {
    const char *dir = kv_test_data_dir();
    char path[4096];
    snprintf(path, sizeof path, "%s/stories260K/stories260K.bin", dir);
    if (model_path) snprintf(model_path, 4096, "%s", path);
    ck_assert_kv_ok(kv_model_file_open(mf, path));
    kv_model_options mo;
    memset(&mo, 0, sizeof mo);
    mo.n_threads = 2;
    ck_assert_kv_ok(kv_model_load(model, *mf, &mo));
    kv_tokenizer *tok = NULL;
    ck_assert_kv_ok(kv_tokenizer_load(&tok, *mf, tokenizer));
    snprintf(path, sizeof path, "%s/wikitext-2-raw/wiki.valid.raw", dir);
    char *text = NULL;
    size_t len = 0;
    ck_assert_kv_ok(kv_file_read_all(&text, &len, path));
    size_t cut = len < text_bytes ? len : text_bytes;
    while (cut < len && text[cut] != '\n') cut++;
    ck_assert_kv_ok(kv_tokenizer_encode(ids, n, tok, text, cut, 0));
    *bos = kv_tokenizer_add_bos_default(tok) ? kv_tokenizer_bos(tok) : -1;
    free(text);
    kv_tokenizer_free(tok);
}

#endif
