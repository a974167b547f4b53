/* Token ids against the reference tokenizers, from the golden files (tests/tokenizer/gen_reference.py):
 *   KV_GOLDEN_SMOLLM2: llama.cpp on SmolLM2-135M's GGUF vocabulary with its own pre-tokenizer
 *                      ("smollm") and with Llama 3's and Qwen2's splitting rules, plus the same
 *                      vocabulary read from a tokenizer.json the test writes;
 *   KV_GOLDEN_STORIES: sentencepiece with tok512.model, against tok512.bin and tok512.model.
 * Every case compares the token count and the SHA-256 of the ids (and all ids of short strings);
 * a mismatch prints the first differing position (or 8192-token block, for whole files).
 * Exits 77 (skipped) when the model or data is absent. */
#define _POSIX_C_SOURCE 200809L
#include "kv_test.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kv_formats.h"
#include "kv_model.h"

/* ---- golden files ---------------------------------------------------------------------------- */

typedef struct gcase {
    char name[64];
    unsigned flags;
    char file[256];   /* data-relative path, or "" */
    char *text;       /* short strings */
    size_t text_len;
    size_t count;
    char sha[65];
    int32_t *ids;     /* all ids (strings) or the first ones (files) */
    size_t n_ids;
    int block;
    char (*blocks)[17];
    size_t n_blocks;
} gcase;

typedef struct golden {
    gcase *c;
    size_t n;
} golden;

static const char *golden_dir(char *buf, size_t n) {
    const char *src = getenv("KVCAL_TEST_SRC");
    snprintf(buf, n, "%s/tokenizer/golden", src && *src ? src : ".");
    return buf;
}

static int hexval(char c) { return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1; }

static golden load_golden(const char *name) {
    char dir[512], path[600];
    snprintf(path, sizeof path, "%s/%s", golden_dir(dir, sizeof dir), name);
    char *data;
    size_t size;
    ck_assert_msg(kv_file_read_all(&data, &size, path) == KV_OK, "cannot read %s", path);
    golden g = {0};
    char *save = NULL;
    for (char *line = strtok_r(data, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        if (line[0] == '#') continue;
        char *sp = strchr(line, ' ');
        const char *key = line, *val = sp ? sp + 1 : "";
        if (sp) *sp = 0;
        if (!strcmp(key, "case")) {
            g.c = realloc(g.c, (g.n + 1) * sizeof *g.c);
            memset(&g.c[g.n], 0, sizeof *g.c);
            snprintf(g.c[g.n].name, sizeof g.c[g.n].name, "%s", val);
            g.n++;
            continue;
        }
        ck_assert(g.n > 0);
        gcase *c = &g.c[g.n - 1];
        if (!strcmp(key, "flags")) c->flags = (unsigned)atoi(val);
        else if (!strcmp(key, "file")) snprintf(c->file, sizeof c->file, "%s", val);
        else if (!strcmp(key, "count")) c->count = (size_t)strtoull(val, NULL, 10);
        else if (!strcmp(key, "sha256")) snprintf(c->sha, sizeof c->sha, "%s", val);
        else if (!strcmp(key, "text_hex")) {
            size_t l = strlen(val) / 2;
            c->text = malloc(l + 1);
            for (size_t i = 0; i < l; i++) c->text[i] = (char)(hexval(val[2 * i]) * 16 + hexval(val[2 * i + 1]));
            c->text[l] = 0;
            c->text_len = l;
        } else if (!strcmp(key, "ids") || !strcmp(key, "first")) {
            size_t cap = 16;
            c->ids = malloc(cap * sizeof *c->ids);
            for (char *p = (char *)val; *p;) {
                char *end;
                long x = strtol(p, &end, 10);
                if (end == p) break;
                if (c->n_ids == cap) c->ids = realloc(c->ids, (cap *= 2) * sizeof *c->ids);
                c->ids[c->n_ids++] = (int32_t)x;
                p = end;
            }
        } else if (!strcmp(key, "blocks")) {
            char *end;
            c->block = (int)strtol(val, &end, 10);
            size_t nb = 0, cap = 64;
            c->blocks = malloc(cap * sizeof *c->blocks);
            for (char *p = end; *p;) {
                while (*p == ' ') p++;
                if (!*p) break;
                if (nb == cap) c->blocks = realloc(c->blocks, (cap *= 2) * sizeof *c->blocks);
                memcpy(c->blocks[nb], p, 16);
                c->blocks[nb][16] = 0;
                nb++;
                p += 16;
            }
            c->n_blocks = nb;
        }
    }
    free(data);
    ck_assert_msg(g.n > 0, "%s has no cases", path);
    return g;
}

static void free_golden(golden *g) {
    for (size_t i = 0; i < g->n; i++) {
        free(g->c[i].text);
        free(g->c[i].ids);
        free(g->c[i].blocks);
    }
    free(g->c);
}

static void sha_ids(char out[65], const int32_t *ids, size_t n) {
    kv_sha256 s;
    uint8_t d[32], b[4];
    kv_sha256_init(&s);
    for (size_t i = 0; i < n; i++) {
        kv_store_u32le(b, (uint32_t)ids[i]);
        kv_sha256_update(&s, b, 4);
    }
    kv_sha256_final(&s, d);
    kv_sha256_hex(out, d);
}

static char *read_data(const char *rel, size_t *n) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", kv_test_data_dir(), rel);
    char *d;
    ck_assert_msg(kv_file_read_all(&d, n, path) == KV_OK, "cannot read %s", path);
    return d;
}

/* Encode one case and compare; returns the number of mismatching cases (0 or 1). */
static int check_case(const kv_tokenizer *t, const gcase *c, const char *label) {
    size_t len;
    char *text = c->file[0] ? read_data(c->file, &len) : NULL;
    if (!text) {
        text = c->text;
        len = c->text_len;
    }
    int32_t *ids;
    size_t n;
    unsigned flags = (c->flags & 1 ? KV_TOK_ADD_BOS : 0) | (c->flags & 2 ? KV_TOK_PARSE_SPECIAL : 0);
    double t0 = kv_now_seconds();
    ck_assert_kv_ok(kv_tokenizer_encode(&ids, &n, t, text, len, flags));
    double dt = kv_now_seconds() - t0;
    char sha[65];
    sha_ids(sha, ids, n);
    int ok = n == c->count && strcmp(sha, c->sha) == 0;
    if (c->file[0]) printf("%s %s: %zu tokens in %.3f s (%.1f MB/s)%s\n", label, c->name, n, dt, len / dt / 1e6,
                           ok ? "" : " MISMATCH");
    if (!ok) {
        size_t first = SIZE_MAX;
        for (size_t i = 0; i < c->n_ids && i < n; i++)
            if (ids[i] != c->ids[i]) {
                first = i;
                break;
            }
        if (first == SIZE_MAX && c->n_ids > n) first = n;
        if (first == SIZE_MAX && c->blocks) {
            for (size_t b = 0; b < c->n_blocks; b++) {
                size_t a = b * (size_t)c->block, e = a + (size_t)c->block;
                if (e > n) e = n;
                char h[65] = "";
                if (a < n) sha_ids(h, ids + a, e - a);
                if (a >= n || strncmp(h, c->blocks[b], 16) != 0) {
                    fprintf(stderr, "%s %s: first difference within ids [%zu, %zu)\n", label, c->name, a, a + c->block);
                    break;
                }
            }
        }
        if (first != SIZE_MAX) {
            fprintf(stderr, "%s %s: first mismatch at id %zu: got", label, c->name, first);
            for (size_t i = first; i < n && i < first + 8; i++) fprintf(stderr, " %d", ids[i]);
            fprintf(stderr, " expected");
            for (size_t i = first; i < c->n_ids && i < first + 8; i++) fprintf(stderr, " %d", c->ids[i]);
            fprintf(stderr, "\n");
        }
        fprintf(stderr, "%s %s: %zu tokens (expected %zu), sha %.16s (expected %.16s)\n", label, c->name, n, c->count,
                sha, c->sha);
    }
    free(ids);
    if (c->file[0]) free(text);
    return !ok;
}

static int check_all(const kv_tokenizer *t, const char *golden_name, const char *label) {
    golden g = load_golden(golden_name);
    int bad = 0;
    for (size_t i = 0; i < g.n; i++) bad += check_case(t, &g.c[i], label);
    free_golden(&g);
    return bad;
}

/* decode(encode(x)) == x (expect: x normalized as the tokenizer normalizes it, or x) */
static void check_roundtrip(const kv_tokenizer *t, const char *x, size_t n, const char *expect, size_t en) {
    int32_t *ids;
    size_t m, dl;
    char *back;
    ck_assert_kv_ok(kv_tokenizer_encode(&ids, &m, t, x, n, 0));
    ck_assert_kv_ok(kv_tokenizer_decode(&back, &dl, t, ids, m, 0));
    if (!(dl == en && memcmp(back, expect, en) == 0)) {
        size_t i = 0;
        while (i < dl && i < en && back[i] == expect[i]) i++;
        ck_abort_msg("round trip of %zu bytes: %zu bytes back, first difference at byte %zu", n, dl, i);
    }
    free(ids);
    free(back);
}

static int file_exists(const char *p) {
    struct stat sb;
    return p && stat(p, &sb) == 0;
}

#ifdef KV_GOLDEN_SMOLLM2
static const char *default_model(void) {
    const char *m = getenv("KVCAL_DEFAULT_MODEL");
    return m && *m ? m : NULL;
}

/* ---- SmolLM2 (llama.cpp reference) ------------------------------------------------------------ */

static const char *const k_variants[][2] = {
    {"smollm", "smollm2.txt"}, {"llama-bpe", "smollm2_llama3.txt"}, {"qwen2", "smollm2_qwen2.txt"}};

START_TEST(test_smollm2_golden) {
    kv_vocab_data *v;
    ck_assert_kv_ok(kv_vocab_load(&v, NULL, default_model()));
    ck_assert_int_eq(v->kind, KV_VOCAB_BPE);
    ck_assert_str_eq(v->pre, "smollm");
    ck_assert_int_eq(v->n_tokens, 49152);
    ck_assert_int_eq(v->bos_id, 1);
    ck_assert_int_eq(v->eos_id, 2);
    ck_assert_int_eq(v->add_bos, 0);
    /* the same vocabulary under another pre-tokenizer name, as the reference's modified GGUF */
    snprintf(v->pre, sizeof v->pre, "%s", k_variants[_i][0]);
    kv_tokenizer *t;
    ck_assert_kv_ok(kv_tokenizer_create(&t, v));
    kv_vocab_free(v);
    int bad = check_all(t, k_variants[_i][1], k_variants[_i][0]);
    ck_assert_msg(bad == 0, "%d cases differ from llama.cpp (pre %s)", bad, k_variants[_i][0]);
    kv_tokenizer_free(t);
}
END_TEST

/* byte-level BPE decodes every byte sequence back exactly */
START_TEST(test_smollm2_roundtrip) {
    kv_tokenizer *t;
    ck_assert_kv_ok(kv_tokenizer_load(&t, NULL, default_model()));
    golden g = load_golden("smollm2.txt");
    for (size_t i = 0; i < g.n; i++) {
        size_t len;
        char *text = g.c[i].file[0] ? read_data(g.c[i].file, &len) : g.c[i].text;
        if (!g.c[i].file[0]) len = g.c[i].text_len;
        check_roundtrip(t, text, len, text, len);
        if (g.c[i].file[0]) free(text);
    }
    free_golden(&g);
    /* special tokens: parsed only when asked, rendered only when asked */
    int32_t *ids;
    size_t n;
    ck_assert_kv_ok(kv_tokenizer_encode(&ids, &n, t, "<|im_start|>user", 16, KV_TOK_PARSE_SPECIAL | KV_TOK_ADD_BOS));
    ck_assert_uint_eq(n, 3);
    ck_assert_int_eq(ids[0], 1);
    ck_assert_int_eq(ids[1], 1);
    ck_assert_int_eq(kv_tokenizer_is_eog(t, 2), 1); /* <|im_end|> */
    ck_assert_int_eq(kv_tokenizer_is_eog(t, 0), 1); /* <|endoftext|> */
    ck_assert_int_eq(kv_tokenizer_is_eog(t, ids[2]), 0);
    char *s;
    size_t l;
    ck_assert_kv_ok(kv_tokenizer_decode(&s, &l, t, ids, n, 0));
    ck_assert_str_eq(s, "user");
    free(s);
    ck_assert_kv_ok(kv_tokenizer_decode(&s, &l, t, ids, n, KV_DETOK_SPECIAL));
    ck_assert_str_eq(s, "<|im_start|><|im_start|>user");
    free(s);
    free(ids);
    kv_tokenizer_free(t);
}
END_TEST

/* The model-file route (kv_model_file_open, then the vocabulary from its GGUF metadata). */
START_TEST(test_smollm2_model_file) {
    kv_model_file *mf;
    ck_assert_kv_ok(kv_model_file_open(&mf, default_model()));
    kv_tokenizer *t;
    ck_assert_kv_ok(kv_tokenizer_load(&t, mf, NULL));
    ck_assert_str_eq(kv_tokenizer_pre(t), "smollm");
    ck_assert_int_eq(kv_tokenizer_n_vocab(t), kv_model_file_arch(mf)->vocab_size);
    int bad = check_all(t, "smollm2.txt", "model-file");
    ck_assert_int_eq(bad, 0);
    kv_tokenizer_free(t);
    kv_model_file_close(mf);
}
END_TEST

/* Write the GGUF vocabulary as an HF tokenizer.json (SmolLM2's pipeline: Digits + ByteLevel; merges
 * half as "a b" strings, half as [a, b] arrays; control tokens as special added tokens) and check
 * that it tokenizes like llama.cpp. */
START_TEST(test_smollm2_tokenizer_json) {
    kv_vocab_data *v;
    ck_assert_kv_ok(kv_vocab_load(&v, NULL, default_model()));
    json_t *vocab = json_object(), *merges = json_array(), *added = json_array();
    for (int i = 0; i < v->n_tokens; i++) {
        json_object_set_new(vocab, v->tokens[i], json_integer(i));
        if (v->token_type[i] == KV_TOKEN_CONTROL) {
            json_t *a = json_object();
            json_object_set_new(a, "id", json_integer(i));
            json_object_set_new(a, "content", json_string(v->tokens[i]));
            json_object_set_new(a, "special", json_true());
            json_array_append_new(added, a);
        }
    }
    for (int i = 0; i < v->n_merges; i++) {
        if (i % 2) {
            json_array_append_new(merges, json_string(v->merges[i]));
        } else {
            const char *m = v->merges[i], *sp = strchr(m + 1, ' ');
            json_t *pair = json_array();
            json_array_append_new(pair, json_stringn(m, (size_t)(sp - m)));
            json_array_append_new(pair, json_string(sp + 1));
            json_array_append_new(merges, pair);
        }
    }
    json_t *model = json_pack("{s:s, s:o, s:o}", "type", "BPE", "vocab", vocab, "merges", merges);
    json_t *pre = json_pack("{s:s, s:[{s:s, s:b}, {s:s, s:b, s:b, s:b}]}", "type", "Sequence", "pretokenizers", "type",
                            "Digits", "individual_digits", 1, "type", "ByteLevel", "add_prefix_space", 0, "trim_offsets",
                            1, "use_regex", 1);
    json_t *root = json_pack("{s:o, s:n, s:o, s:o}", "added_tokens", added, "normalizer", "pre_tokenizer", pre, "model",
                             model);
    ck_assert_ptr_nonnull(root);
    char dir[256], path[300];
    kv_test_tmpdir(dir, sizeof dir);
    ck_assert_ptr_nonnull(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    ck_assert_int_eq(json_dump_file(root, path, JSON_COMPACT), 0);
    json_decref(root);
    kv_vocab_free(v);
    kv_tokenizer *t;
    ck_assert_kv_ok(kv_tokenizer_load(&t, NULL, path));
    ck_assert_str_eq(kv_tokenizer_pre(t), "smollm");
    int bad = check_all(t, "smollm2.txt", "tokenizer.json");
    ck_assert_int_eq(bad, 0);
    kv_tokenizer_free(t);
    unlink(path);
    rmdir(dir);
}
END_TEST

static Suite *suite(void) {
    Suite *s = suite_create("tokenizer_smollm2");
    TCase *tc = tcase_create("golden");
    tcase_set_timeout(tc, 300);
    tcase_add_loop_test(tc, test_smollm2_golden, 0, 3);
    tcase_add_test(tc, test_smollm2_roundtrip);
    tcase_add_test(tc, test_smollm2_model_file);
    tcase_add_test(tc, test_smollm2_tokenizer_json);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) {
    if (!kv_test_data_dir() || !file_exists(default_model())) {
        printf("skipped: needs the default model (scripts/fetch-model.sh) and the shared data\n");
        return 77;
    }
    return kv_test_run(suite());
}
#endif

#ifdef KV_GOLDEN_STORIES
/* ---- stories260K (sentencepiece reference) ---------------------------------------------------- */

static void data_path(char *out, size_t n, const char *rel) { snprintf(out, n, "%s/%s", kv_test_data_dir(), rel); }

/* sentencepiece's remove_extra_whitespaces on ' ' (what decode(encode(x)) gives back) */
static size_t sp_normalize(char *o, const char *x, size_t n) {
    size_t a = 0, b = n, k = 0;
    while (a < b && x[a] == ' ') a++;
    while (b > a && x[b - 1] == ' ') b--;
    for (size_t i = a; i < b; i++) {
        if (x[i] == ' ' && i > a && x[i - 1] == ' ') continue;
        o[k++] = x[i];
    }
    return k;
}

START_TEST(test_stories_golden) {
    static const char *const files[] = {"stories260K/tok512.bin", "stories260K/tok512.model"};
    char path[1024];
    data_path(path, sizeof path, files[_i]);
    kv_vocab_data *v;
    ck_assert_kv_ok(kv_vocab_load(&v, NULL, path));
    ck_assert_int_eq(v->kind, KV_VOCAB_SPM);
    ck_assert_int_eq(v->n_tokens, 512);
    ck_assert_int_eq(v->bos_id, 1);
    ck_assert_int_eq(v->eos_id, 2);
    ck_assert_int_eq(v->add_space_prefix, 1);
    ck_assert_int_eq(v->remove_extra_ws, 1); /* tok512.model's normalizer (also beside tok512.bin) */
    kv_tokenizer *t;
    ck_assert_kv_ok(kv_tokenizer_create(&t, v));
    kv_vocab_free(v);
    int bad = check_all(t, "stories260K.txt", files[_i] + 12);
    ck_assert_msg(bad == 0, "%d cases differ from sentencepiece (%s)", bad, files[_i]);
    kv_tokenizer_free(t);
}
END_TEST

/* The same vocabulary as a Llama-2-style GGUF (written here with the GGUF writer): llama.cpp's
 * SentencePiece path, which keeps runs of spaces (golden from llama.cpp on the same GGUF). */
START_TEST(test_stories_gguf_llamacpp) {
    char path[1024], dir[256], gpath[300];
    data_path(path, sizeof path, "stories260K/tok512.model");
    kv_vocab_data *v;
    ck_assert_kv_ok(kv_vocab_load(&v, NULL, path));
    kv_gguf_writer *w;
    ck_assert_kv_ok(kv_gguf_writer_create(&w));
    ck_assert_kv_ok(kv_gguf_writer_set_str(w, "general.architecture", "llama"));
    ck_assert_kv_ok(kv_gguf_writer_set_str(w, "tokenizer.ggml.model", "llama"));
    ck_assert_kv_ok(kv_gguf_writer_set_str_array(w, "tokenizer.ggml.tokens", (const char *const *)v->tokens,
                                                 (uint64_t)v->n_tokens));
    ck_assert_kv_ok(kv_gguf_writer_set_array(w, "tokenizer.ggml.scores", KV_GGUF_FLOAT32, v->scores,
                                             (uint64_t)v->n_tokens));
    ck_assert_kv_ok(kv_gguf_writer_set_array(w, "tokenizer.ggml.token_type", KV_GGUF_INT32, v->token_type,
                                             (uint64_t)v->n_tokens));
    ck_assert_kv_ok(kv_gguf_writer_set_u32(w, "tokenizer.ggml.bos_token_id", 1));
    ck_assert_kv_ok(kv_gguf_writer_set_u32(w, "tokenizer.ggml.eos_token_id", 2));
    ck_assert_kv_ok(kv_gguf_writer_set_u32(w, "tokenizer.ggml.unknown_token_id", 0));
    kv_test_tmpdir(dir, sizeof dir);
    ck_assert_ptr_nonnull(mkdtemp(dir));
    snprintf(gpath, sizeof gpath, "%s/spm.gguf", dir);
    ck_assert_kv_ok(kv_gguf_writer_write(w, gpath));
    kv_gguf_writer_free(w);
    kv_vocab_free(v);
    ck_assert_kv_ok(kv_vocab_load(&v, NULL, gpath));
    ck_assert_int_eq(v->remove_extra_ws, 0);
    ck_assert_int_eq(v->add_space_prefix, 1);
    ck_assert_int_eq(v->add_bos, 1);
    kv_tokenizer *t;
    ck_assert_kv_ok(kv_tokenizer_create(&t, v));
    kv_vocab_free(v);
    int bad = check_all(t, "stories260K_llamacpp.txt", "gguf-spm");
    ck_assert_msg(bad == 0, "%d cases differ from llama.cpp", bad);
    /* without the normalizer every string round-trips exactly */
    golden g = load_golden("stories260K_llamacpp.txt");
    for (size_t i = 0; i < g.n; i++)
        if (!g.c[i].file[0]) check_roundtrip(t, g.c[i].text, g.c[i].text_len, g.c[i].text, g.c[i].text_len);
    free_golden(&g);
    kv_tokenizer_free(t);
    unlink(gpath);
    rmdir(dir);
}
END_TEST

/* tok512.bin (llama2.c's export) and tok512.model carry the same vocabulary */
START_TEST(test_stories_bin_equals_model) {
    char a[1024], b[1024];
    data_path(a, sizeof a, "stories260K/tok512.bin");
    data_path(b, sizeof b, "stories260K/tok512.model");
    kv_vocab_data *x, *y;
    ck_assert_kv_ok(kv_vocab_load(&x, NULL, a));
    ck_assert_kv_ok(kv_vocab_load(&y, NULL, b));
    ck_assert_str_eq(x->source, "llama2.c");
    ck_assert_str_eq(y->source, "sentencepiece");
    ck_assert_int_eq(x->n_tokens, y->n_tokens);
    for (int i = 0; i < x->n_tokens; i++) {
        ck_assert_msg(x->token_len[i] == y->token_len[i] && !memcmp(x->tokens[i], y->tokens[i], x->token_len[i]),
                      "token %d: '%s' vs '%s'", i, x->tokens[i], y->tokens[i]);
        ck_assert_msg(x->scores[i] == y->scores[i], "score of token %d", i);
        ck_assert_msg(x->token_type[i] == y->token_type[i], "type of token %d: %d vs %d", i, x->token_type[i],
                      y->token_type[i]);
    }
    kv_vocab_free(x);
    kv_vocab_free(y);
}
END_TEST

START_TEST(test_stories_roundtrip) {
    char path[1024];
    data_path(path, sizeof path, "stories260K/tok512.bin");
    kv_tokenizer *t;
    ck_assert_kv_ok(kv_tokenizer_load(&t, NULL, path));
    golden g = load_golden("stories260K.txt");
    for (size_t i = 0; i < g.n; i++) {
        size_t len;
        char *text = g.c[i].file[0] ? read_data(g.c[i].file, &len) : g.c[i].text;
        if (!g.c[i].file[0]) len = g.c[i].text_len;
        char *norm = malloc(len + 1);
        size_t nl = sp_normalize(norm, text, len);
        check_roundtrip(t, text, len, norm, nl);
        free(norm);
        if (g.c[i].file[0]) free(text);
    }
    free_golden(&g);
    /* streaming pieces after BOS lose the dummy prefix's space */
    int32_t *ids;
    size_t n, l;
    ck_assert_kv_ok(kv_tokenizer_encode(&ids, &n, t, "Once upon", 9, KV_TOK_ADD_BOS));
    ck_assert_int_eq(ids[0], 1);
    const char *p = kv_tokenizer_piece_after(t, ids[0], ids[1], &l);
    ck_assert(l > 0 && p[0] == 'O');
    free(ids);
    kv_tokenizer_free(t);
}
END_TEST

/* The model-file route: stories260K.bin finds tok512.bin beside it (vocab_size 512). */
START_TEST(test_stories_model_file) {
    char path[1024];
    data_path(path, sizeof path, "stories260K/stories260K.bin");
    kv_model_file *mf;
    ck_assert_kv_ok(kv_model_file_open(&mf, path));
    kv_tokenizer *t;
    ck_assert_kv_ok(kv_tokenizer_load(&t, mf, NULL));
    ck_assert_int_eq(kv_tokenizer_n_vocab(t), 512);
    ck_assert_int_eq(check_all(t, "stories260K.txt", "model-file"), 0);
    kv_tokenizer_free(t);
    kv_model_file_close(mf);
}
END_TEST

static Suite *suite(void) {
    Suite *s = suite_create("tokenizer_stories");
    TCase *tc = tcase_create("golden");
    tcase_set_timeout(tc, 300);
    tcase_add_loop_test(tc, test_stories_golden, 0, 2);
    tcase_add_test(tc, test_stories_bin_equals_model);
    tcase_add_test(tc, test_stories_gguf_llamacpp);
    tcase_add_test(tc, test_stories_roundtrip);
    tcase_add_test(tc, test_stories_model_file);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) {
    char p[1024];
    if (kv_test_data_dir()) snprintf(p, sizeof p, "%s/stories260K/tok512.model", kv_test_data_dir());
    if (!kv_test_data_dir() || !file_exists(p)) {
        printf("skipped: needs the shared data (stories260K, wikitext-2-raw)\n");
        return 77;
    }
    return kv_test_run(suite());
}
#endif
