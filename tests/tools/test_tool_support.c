/* The steps the tools share (tools/tool_support.c): incremental tokenization gives exactly the tokens
 * of the whole text (WikiText through the SentencePiece tokenizer of stories260K and, when present,
 * SmolLM2's byte-level BPE; many cuts with small blocks; through a pipe), stops at a token budget
 * while hashing the whole file, refuses a device that never ends; a tokenizer that does not fit the
 * model is refused; the checks on outputs (same file as an input, directories, devices made with
 * mknod in a temporary directory) and on thread counts. */
#define _POSIX_C_SOURCE 200809L
#define _DEFAULT_SOURCE /* mknod, makedev */
#include "kv_test.h"
#include "kv_tools.h"

#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <unistd.h>

static char g_data[1024], g_stories[1200], g_valid[1200], g_tok512[1200];
static const char *g_smollm; /* NULL when the default model is absent */

static void whole_tokens(int32_t **ids, size_t *n, const kv_tokenizer *t, const char *path) {
    char *text = NULL;
    size_t len = 0;
    ck_assert_kv_ok(kv_file_read_all(&text, &len, path));
    ck_assert_kv_ok(kv_tokenizer_encode(ids, n, t, text, len, 0));
    free(text);
}

static void check_model(const char *model, const char *tok_path) {
    kv_model *m = NULL;
    kv_tokenizer *t = NULL;
    ck_assert_kv_ok(kv_tool_open_model(&m, &t, model, tok_path, 1));
    int32_t *ref = NULL, *ids = NULL;
    size_t nref = 0, n = 0;
    whole_tokens(&ref, &nref, t, g_valid);
    char sha[65], want[65];
    ck_assert_kv_ok(kv_sha256_file(want, g_valid));
    /* 1 MiB blocks (one cut in WikiText's 1.1 MB) and 4 KiB blocks (hundreds of cuts) */
    const size_t blocks[] = {1u << 20, 4096, 333};
    for (size_t b = 0; b < sizeof blocks / sizeof *blocks; b++) {
        ck_assert_kv_ok(kv_tool_tokenize_file_ex(&ids, &n, sha, t, g_valid, 0, blocks[b]));
        ck_assert_msg(n == nref, "%s, blocks of %zu: %zu tokens, whole text %zu", model, blocks[b], n, nref);
        size_t i = 0;
        while (i < n && ids[i] == ref[i]) i++;
        ck_assert_msg(i == n, "%s, blocks of %zu: first difference at token %zu of %zu", model, blocks[b], i, n);
        ck_assert_str_eq(sha, want);
        free(ids);
    }
    free(ref);
    /* text without a space: WikiText with every space made '_', cut at line breaks */
    char dir[256], nospace[600];
    kv_test_tmpdir(dir, sizeof dir);
    ck_assert_ptr_nonnull(mkdtemp(dir));
    snprintf(nospace, sizeof nospace, "%s/nospace.txt", dir);
    {
        char *text = NULL;
        size_t len = 0;
        ck_assert_kv_ok(kv_file_read_all(&text, &len, g_valid));
        for (size_t i = 0; i < len; i++)
            if (text[i] == ' ') text[i] = '_';
        FILE *f = fopen(nospace, "wb");
        ck_assert(f && fwrite(text, 1, len, f) == len && fclose(f) == 0);
        free(text);
    }
    whole_tokens(&ref, &nref, t, nospace);
    for (size_t b = 1; b < sizeof blocks / sizeof *blocks; b++) {
        ck_assert_kv_ok(kv_tool_tokenize_file_ex(&ids, &n, NULL, t, nospace, 0, blocks[b]));
        size_t i = 0;
        while (i < n && i < nref && ids[i] == ref[i]) i++;
        ck_assert_msg(n == nref && i == n, "%s, no spaces, blocks of %zu: %zu tokens, whole text %zu, first "
                      "difference at %zu", model, blocks[b], n, nref, i);
        free(ids);
    }
    free(ref);
    unlink(nospace);
    rmdir(dir);
    whole_tokens(&ref, &nref, t, g_valid);
    /* a budget: the first 4096 tokens, the whole file's hash */
    ck_assert_kv_ok(kv_tool_tokenize_file_ex(&ids, &n, sha, t, g_valid, 4096, 4096));
    ck_assert_uint_eq(n, 4096);
    ck_assert_int_eq(memcmp(ids, ref, 4096 * sizeof *ids), 0);
    ck_assert_str_eq(sha, want);
    free(ids);
    free(ref);
    kv_tokenizer_free(t);
    kv_model_free(m);
}

START_TEST(test_incremental_equals_whole_stories) { check_model(g_stories, NULL); }
END_TEST

START_TEST(test_incremental_equals_whole_smollm) {
    if (!g_smollm) {
        fprintf(stderr, "note: no default model (KVCAL_DEFAULT_MODEL): byte-level BPE case not run\n");
        return;
    }
    check_model(g_smollm, NULL);
}
END_TEST

/* A pipe (a FIFO fed by a child) gives the same tokens; a device is refused before reading. */
START_TEST(test_pipe_and_device) {
    kv_model *m = NULL;
    kv_tokenizer *t = NULL;
    ck_assert_kv_ok(kv_tool_open_model(&m, &t, g_stories, NULL, 1));
    char dir[256], fifo[600], dev[600];
    kv_test_tmpdir(dir, sizeof dir);
    ck_assert_ptr_nonnull(mkdtemp(dir));
    snprintf(fifo, sizeof fifo, "%s/fifo", dir);
    ck_assert_int_eq(mkfifo(fifo, 0600), 0);
    const pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) { /* child: copy the corpus into the pipe */
        FILE *in = fopen(g_valid, "rb"), *out = fopen(fifo, "wb");
        char b[65536];
        size_t k;
        while (in && out && (k = fread(b, 1, sizeof b, in)) > 0) fwrite(b, 1, k, out);
        _exit(in && out && fclose(out) == 0 ? 0 : 1);
    }
    int32_t *ids = NULL, *ref = NULL;
    size_t n = 0, nref = 0;
    char sha[65], want[65];
    ck_assert_kv_ok(kv_tool_tokenize_file_ex(&ids, &n, sha, t, fifo, 0, 8192));
    int status = 0;
    waitpid(pid, &status, 0);
    ck_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    whole_tokens(&ref, &nref, t, g_valid);
    ck_assert_uint_eq(n, nref);
    ck_assert_int_eq(memcmp(ids, ref, n * sizeof *ids), 0);
    ck_assert_kv_ok(kv_sha256_file(want, g_valid));
    ck_assert_str_eq(sha, want); /* read to the end: the bytes read are the file */
    free(ids);
    free(ref);
    unlink(fifo);
    snprintf(dev, sizeof dev, "%s/zero", dir);
    if (mknod(dev, S_IFCHR | 0666, makedev(1, 5)) == 0) {
        ck_assert_int_eq(kv_tool_tokenize_file_max(&ids, &n, NULL, t, dev, 4096), KV_EINVAL);
        ck_assert_ptr_nonnull(strstr(kv_error_last(), "character device"));
        ck_assert_ptr_null(ids);
        unlink(dev);
    }
    rmdir(dir);
    kv_tokenizer_free(t);
    kv_model_free(m);
}
END_TEST

/* An empty file and an empty pipe end at once with no tokens (issue 32: the reader looped forever at
 * the end of a text with nothing buffered); the hash is the empty text's. Its own TCase with a short
 * timeout, so that a loop fails in seconds. */
START_TEST(test_empty_input) {
    kv_model *m = NULL;
    kv_tokenizer *t = NULL;
    ck_assert_kv_ok(kv_tool_open_model(&m, &t, g_stories, NULL, 1));
    char dir[256], empty[600], fifo[600];
    kv_test_tmpdir(dir, sizeof dir);
    ck_assert_ptr_nonnull(mkdtemp(dir));
    snprintf(empty, sizeof empty, "%s/empty.txt", dir);
    snprintf(fifo, sizeof fifo, "%s/fifo", dir);
    FILE *fp = fopen(empty, "wb");
    ck_assert_ptr_nonnull(fp);
    fclose(fp);
    static const char empty_sha[] = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";
    const size_t blocks[] = {16, 4096, 1u << 20};
    for (size_t b = 0; b < sizeof blocks / sizeof *blocks; b++) {
        int32_t *ids = NULL;
        size_t n = 1;
        char sha[65] = "";
        ck_assert_kv_ok(kv_tool_tokenize_file_ex(&ids, &n, sha, t, empty, 0, blocks[b]));
        ck_assert_uint_eq(n, 0);
        ck_assert_str_eq(sha, empty_sha);
        free(ids);
        ck_assert_kv_ok(kv_tool_tokenize_file_ex(&ids, &n, NULL, t, empty, 100, blocks[b]));
        ck_assert_uint_eq(n, 0);
        free(ids);
    }
    ck_assert_int_eq(mkfifo(fifo, 0600), 0);
    const pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) { /* child: open the pipe for writing and close it at once */
        FILE *out = fopen(fifo, "wb");
        _exit(out && fclose(out) == 0 ? 0 : 1);
    }
    int32_t *ids = NULL;
    size_t n = 1;
    char sha[65] = "";
    ck_assert_kv_ok(kv_tool_tokenize_file_ex(&ids, &n, sha, t, fifo, 0, 4096));
    int status = 0;
    waitpid(pid, &status, 0);
    ck_assert_uint_eq(n, 0);
    ck_assert_str_eq(sha, empty_sha);
    free(ids);
    unlink(fifo);
    unlink(empty);
    rmdir(dir);
    kv_tokenizer_free(t);
    kv_model_free(m);
}
END_TEST

/* A tokenizer whose vocabulary does not fit the model: SmolLM2 (49152) with stories' tok512.bin, and
 * stories260K (512) with SmolLM2's tokenizer. */
START_TEST(test_vocab_mismatch) {
    if (!g_smollm) {
        fprintf(stderr, "note: no default model: vocabulary mismatch case not run\n");
        return;
    }
    kv_model *m = NULL;
    kv_tokenizer *t = NULL;
    ck_assert_int_eq(kv_tool_open_model(&m, &t, g_smollm, g_tok512, 1), KV_EMISMATCH);
    ck_assert_msg(strstr(kv_error_last(), "512 tokens") && strstr(kv_error_last(), "49152"), "%s", kv_error_last());
    ck_assert_ptr_null(m);
    ck_assert_ptr_null(t);
    ck_assert_int_eq(kv_tool_open_model(&m, &t, g_stories, g_smollm, 1), KV_EMISMATCH);
    ck_assert_ptr_nonnull(strstr(kv_error_last(), "outside the model"));
}
END_TEST

/* Outputs: the same file as an input (a hard link: names differ, inode equal) or as another output,
 * an empty path, a directory, a missing directory are usage errors (2); a device node made with
 * mknod is accepted (written in place); threads outside the rule are usage errors. */
START_TEST(test_io_and_threads) {
    char dir[256], in[600], link2[600], sub[600], dev[600], fresh[600];
    kv_test_tmpdir(dir, sizeof dir);
    ck_assert_ptr_nonnull(mkdtemp(dir));
    snprintf(in, sizeof in, "%s/corpus.txt", dir);
    snprintf(link2, sizeof link2, "%s/other-name.bin", dir);
    snprintf(sub, sizeof sub, "%s/d", dir);
    snprintf(fresh, sizeof fresh, "%s/new.kvplan", dir);
    ck_assert_kv_ok(kv_write_file_atomic(in, "text", 4));
    ck_assert_int_eq(link(in, link2), 0);
    ck_assert_int_eq(mkdir(sub, 0777), 0);
    const kv_tool_path inputs[] = {{"--model", g_stories}, {"--corpus", in}, {"--config", NULL}};
    kv_tool_path out[2] = {{"--out", fresh}, {"--svg", NULL}};
    ck_assert_int_eq(kv_tool_check_io("t", inputs, 3, out, 2), KV_EXIT_OK);
    out[0].path = link2;
    ck_assert_int_eq(kv_tool_check_io("t", inputs, 3, out, 2), KV_EXIT_USAGE);
    out[0].path = g_stories;
    ck_assert_int_eq(kv_tool_check_io("t", inputs, 3, out, 2), KV_EXIT_USAGE);
    out[0].path = "";
    ck_assert_int_eq(kv_tool_check_io("t", inputs, 3, out, 2), KV_EXIT_USAGE);
    out[0].path = sub;
    ck_assert_int_eq(kv_tool_check_io("t", inputs, 3, out, 2), KV_EXIT_USAGE);
    snprintf(sub, sizeof sub, "%s/missing/x", dir);
    out[0].path = sub;
    ck_assert_int_eq(kv_tool_check_io("t", inputs, 3, out, 2), KV_EXIT_USAGE);
    out[0].path = fresh, out[1].path = fresh; /* two outputs, one file (not yet existing) */
    ck_assert_int_eq(kv_tool_check_io("t", inputs, 3, out, 2), KV_EXIT_USAGE);
    /* an input directory (a safetensors model): an output that is a file inside it is refused */
    const kv_tool_path dir_in[] = {{"--model", dir}};
    out[0].path = link2, out[1].path = NULL;
    ck_assert_int_eq(kv_tool_check_io("t", dir_in, 1, out, 2), KV_EXIT_USAGE);
    snprintf(dev, sizeof dev, "%s/null", dir);
    if (mknod(dev, S_IFCHR | 0666, makedev(1, 3)) == 0) {
        out[0].path = dev;
        ck_assert_int_eq(kv_tool_check_io("t", inputs, 3, out, 2), KV_EXIT_OK);
        unlink(dev);
    }
    int n = 0;
    unsetenv("KVCAL_THREADS");
    ck_assert_int_eq(kv_tool_threads("t", 100000, &n), KV_EXIT_USAGE);
    ck_assert_int_eq(kv_tool_threads("t", -1, &n), KV_EXIT_USAGE);
    ck_assert_int_eq(kv_tool_threads("t", 1, &n), KV_EXIT_OK);
    ck_assert_int_eq(n, 1);
    setenv("KVCAL_THREADS", "abc", 1);
    ck_assert_int_eq(kv_tool_threads("t", 0, &n), KV_EXIT_USAGE);
    setenv("KVCAL_THREADS", "2", 1);
    ck_assert_int_eq(kv_tool_threads("t", 0, &n), KV_EXIT_OK);
    ck_assert_int_eq(n, 2);
    ck_assert_str_eq(kv_tool_plural(1, "token", "tokens"), "token");
    ck_assert_str_eq(kv_tool_plural(0, "token", "tokens"), "tokens");
    unlink(in);
    unlink(link2);
    snprintf(sub, sizeof sub, "%s/d", dir);
    rmdir(sub);
    rmdir(dir);
}
END_TEST

int main(void) {
    const char *d = getenv("KVCAL_DATA_DIR");
    if (!d || !*d) {
        printf("no KVCAL_DATA_DIR: skipped\n");
        return 77;
    }
    snprintf(g_data, sizeof g_data, "%s", d);
    snprintf(g_stories, sizeof g_stories, "%s/stories260K/stories260K.bin", g_data);
    snprintf(g_tok512, sizeof g_tok512, "%s/stories260K/tok512.bin", g_data);
    snprintf(g_valid, sizeof g_valid, "%s/wikitext-2-raw/wiki.valid.raw", g_data);
    if (access(g_stories, R_OK) != 0 || access(g_valid, R_OK) != 0) {
        printf("no stories260K or WikiText in %s: skipped\n", g_data);
        return 77;
    }
    const char *sm = getenv("KVCAL_DEFAULT_MODEL");
    g_smollm = sm && access(sm, R_OK) == 0 ? sm : NULL;
    Suite *s = suite_create("tool_support");
    TCase *tc = tcase_create("tool_support");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, test_incremental_equals_whole_stories);
    tcase_add_test(tc, test_incremental_equals_whole_smollm);
    tcase_add_test(tc, test_pipe_and_device);
    tcase_add_test(tc, test_vocab_mismatch);
    tcase_add_test(tc, test_io_and_threads);
    suite_add_tcase(s, tc);
    TCase *te = tcase_create("empty_input");
    tcase_set_timeout(te, 20);
    tcase_add_test(te, test_empty_input);
    suite_add_tcase(s, te);
    return kv_test_run(s);
}
