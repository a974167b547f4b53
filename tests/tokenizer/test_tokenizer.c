/* Unit tests for the tokenizers and the tokenizer-data loaders (no data files needed): code point
 * classes, UTF-8, the pre-tokenizer splitting rules (expected splits from HF tokenizers'
 * pre_tokenizers with the same regexes), ranked and scored merges on hand-made vocabularies,
 * special tokens, decoding, byte round trips of random bytes, and every loader's error paths on
 * hand-made files (GGUF, tokenizer.json, sentencepiece .model, llama2.c tok*.bin). */
#define _POSIX_C_SOURCE 200809L
#include "kv_test.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kv_formats.h"
#include "kv_model.h"
#include "tokenizer_internal.h"

#define SP "\xE2\x96\x81" /* U+2581 */
#define GSP "\xC4\xA0"    /* U+0120, the byte-level space */

/* ---- helpers --------------------------------------------------------------------------------- */

/* A vocabulary assembled in memory (kv_vocab_data's pointers are borrowed from these arrays). */
typedef struct test_vocab {
    kv_vocab_data v;
    char *tok[1024];
    uint32_t len[1024];
    int32_t type[1024];
    float score[1024];
    char *mrg[1024];
} test_vocab;

static void tv_init(test_vocab *tv, kv_vocab_kind kind) {
    memset(tv, 0, sizeof *tv);
    tv->v.kind = kind;
    tv->v.tokens = tv->tok;
    tv->v.token_len = tv->len;
    tv->v.token_type = tv->type;
    tv->v.scores = kind == KV_VOCAB_SPM ? tv->score : NULL;
    tv->v.merges = tv->mrg;
    tv->v.bos_id = tv->v.eos_id = tv->v.unk_id = tv->v.pad_id = -1;
    snprintf(tv->v.pre, sizeof tv->v.pre, "gpt-2");
}

static int tv_add(test_vocab *tv, const char *s, int type, float score) {
    int id = tv->v.n_tokens++;
    ck_assert_int_lt(id, 1024);
    tv->tok[id] = strdup(s);
    tv->len[id] = (uint32_t)strlen(s);
    tv->type[id] = type;
    tv->score[id] = score;
    return id;
}

static void tv_merge(test_vocab *tv, const char *m) { tv->mrg[tv->v.n_merges++] = strdup(m); }

static void tv_free(test_vocab *tv) {
    for (int i = 0; i < tv->v.n_tokens; i++) free(tv->tok[i]);
    for (int i = 0; i < tv->v.n_merges; i++) free(tv->mrg[i]);
}

/* GPT-2's byte -> code point map, written independently of the library. */
static uint32_t gpt2_byte_cp(int b) {
    int printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    if (printable) return (uint32_t)b;
    int n = 0;
    for (int c = 0; c < b; c++)
        if (!((c >= 0x21 && c <= 0x7E) || (c >= 0xA1 && c <= 0xAC) || (c >= 0xAE && c <= 0xFF))) n++;
    return 256u + (uint32_t)n;
}

static void cp_utf8(uint32_t cp, char *o) {
    if (cp < 0x80) {
        o[0] = (char)cp;
        o[1] = 0;
    } else {
        o[0] = (char)(0xC0 | (cp >> 6));
        o[1] = (char)(0x80 | (cp & 0x3F));
        o[2] = 0;
    }
}

/* Byte-level vocabulary: the 256 byte characters, then the merges given ("a b" in byte-level spelling). */
static void make_bytelevel(test_vocab *tv, const char *const *merges, int n_merges) {
    tv_init(tv, KV_VOCAB_BPE);
    for (int b = 0; b < 256; b++) {
        char s[4];
        cp_utf8(gpt2_byte_cp(b), s);
        tv_add(tv, s, KV_TOKEN_NORMAL, 0);
    }
    for (int i = 0; i < n_merges; i++) {
        const char *m = merges[i];
        const char *sp = strchr(m + 1, ' ');
        ck_assert_ptr_nonnull(sp);
        char buf[128];
        snprintf(buf, sizeof buf, "%.*s%s", (int)(sp - m), m, sp + 1);
        tv_add(tv, buf, KV_TOKEN_NORMAL, 0);
        tv_merge(tv, m);
    }
}

static int32_t tid(const kv_tokenizer *t, const char *s) { return kv_tokenizer_find(t, s, strlen(s)); }

/* Encode and compare with the expected token texts (space-separated, in vocabulary spelling). */
static void expect_tokens(const kv_tokenizer *t, const char *text, unsigned flags, const char *expected) {
    int32_t *ids;
    size_t n;
    ck_assert_kv_ok(kv_tokenizer_encode(&ids, &n, t, text, strlen(text), flags));
    char got[2048];
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        size_t l;
        const char *s = kv_tokenizer_token_text(t, ids[i], &l);
        ck_assert_ptr_nonnull(s);
        if (i) got[k++] = ' ';
        ck_assert_uint_lt(k + l, sizeof got - 1);
        memcpy(got + k, s, l);
        k += l;
    }
    got[k] = 0;
    ck_assert_msg(strcmp(got, expected) == 0, "encode(\"%s\"): got \"%s\", expected \"%s\"", text, got, expected);
    free(ids);
}

static void roundtrip(const kv_tokenizer *t, const char *text, size_t len, unsigned enc_flags) {
    int32_t *ids;
    size_t n, dl;
    char *back;
    ck_assert_kv_ok(kv_tokenizer_encode(&ids, &n, t, text, len, enc_flags));
    ck_assert_kv_ok(kv_tokenizer_decode(&back, &dl, t, ids, n, 0));
    ck_assert_msg(dl == len && memcmp(back, text, len) == 0, "round trip of %zu bytes gave %zu bytes", len, dl);
    free(ids);
    free(back);
}

static void tmpdir_make(char *dir, size_t n) {
    kv_test_tmpdir(dir, n);
    ck_assert_ptr_nonnull(mkdtemp(dir));
}

static void write_file(const char *path, const void *data, size_t n) {
    FILE *fp = fopen(path, "wb");
    ck_assert_ptr_nonnull(fp);
    ck_assert_uint_eq(fwrite(data, 1, n, fp), n);
    fclose(fp);
}

static void write_text(const char *path, const char *s) { write_file(path, s, strlen(s)); }

/* ---- code points ----------------------------------------------------------------------------- */

START_TEST(test_unicode_classes) {
    ck_assert_uint_eq(kv_ucp_flags('a') & 7, KV_UCP_LETTER);
    ck_assert_uint_eq(kv_ucp_flags('Z') & 7, KV_UCP_LETTER);
    ck_assert_uint_eq(kv_ucp_flags('7') & 7, KV_UCP_NUMBER);
    ck_assert_uint_eq(kv_ucp_flags(' ') & 7, KV_UCP_WHITESPACE);
    ck_assert_uint_eq(kv_ucp_flags('\n') & 7, KV_UCP_WHITESPACE);
    ck_assert_uint_eq(kv_ucp_flags(0x0B) & 7, KV_UCP_WHITESPACE);
    ck_assert_uint_eq(kv_ucp_flags(0x1C) & 7, 0); /* Python's isspace() says yes; \s does not */
    ck_assert_uint_eq(kv_ucp_flags('!') & 7, 0);
    ck_assert_uint_eq(kv_ucp_flags(0xE9) & 7, KV_UCP_LETTER);   /* é */
    ck_assert_uint_eq(kv_ucp_flags(0x4E2D) & 7, KV_UCP_LETTER); /* 中 */
    ck_assert_uint_eq(kv_ucp_flags(0x0663) & 7, KV_UCP_NUMBER); /* Arabic-Indic 3 */
    ck_assert_uint_eq(kv_ucp_flags(0x00BD) & 7, KV_UCP_NUMBER); /* ½ (No) */
    ck_assert_uint_eq(kv_ucp_flags(0x216B) & 7, KV_UCP_NUMBER); /* Ⅻ (Nl) */
    ck_assert_uint_eq(kv_ucp_flags(0x00A0) & 7, KV_UCP_WHITESPACE);
    ck_assert_uint_eq(kv_ucp_flags(0x3000) & 7, KV_UCP_WHITESPACE);
    ck_assert_uint_eq(kv_ucp_flags(0x0301) & 7, 0);             /* combining acute: a mark, not a letter */
    ck_assert_uint_eq(kv_ucp_flags(0x1F600) & 7, 0);            /* 😀 */
    ck_assert_uint_eq(kv_ucp_flags(0x20000) & 7, KV_UCP_LETTER); /* CJK extension B */
    ck_assert_uint_eq(kv_ucp_flags(0x10FFFF), KV_UCP_DEFINED);
    ck_assert_uint_eq(kv_ucp_flags(0x110000), 0);
    /* table sanity: sorted, non-overlapping */
    for (size_t i = 1; i < kv_ucp_n_ranges; i++) ck_assert_uint_gt(kv_ucp_ranges[i].first, kv_ucp_ranges[i - 1].last);
}
END_TEST

START_TEST(test_utf8) {
    uint32_t cp;
    int valid;
    ck_assert_uint_eq(kv_utf8_decode((const uint8_t *)"\xC3\xA9", 2, &cp, &valid), 2);
    ck_assert_uint_eq(cp, 0xE9);
    ck_assert_int_eq(valid, 1);
    ck_assert_uint_eq(kv_utf8_decode((const uint8_t *)"\xF0\x9F\x98\x80", 4, &cp, &valid), 4);
    ck_assert_uint_eq(cp, 0x1F600);
    ck_assert_uint_eq(kv_utf8_decode((const uint8_t *)"\x80", 1, &cp, &valid), 1); /* stray continuation */
    ck_assert_int_eq(valid, 0);
    ck_assert_uint_eq(kv_utf8_decode((const uint8_t *)"\xE2\x96", 2, &cp, &valid), 1); /* truncated */
    ck_assert_int_eq(valid, 0);
    ck_assert_uint_eq(kv_utf8_decode((const uint8_t *)"\xC3(", 2, &cp, &valid), 1); /* bad continuation */
    ck_assert_int_eq(valid, 0);
    char buf[4];
    ck_assert_uint_eq(kv_utf8_encode(0x2581, buf), 3);
    ck_assert(memcmp(buf, SP, 3) == 0);
}
END_TEST

/* ---- pre-tokenizers -------------------------------------------------------------------------- */

/* Expected splits: HF tokenizers' pre_tokenizers (Split with each rule's regex, "isolated"; Digits
 * with individual_digits first for smollm), which agree with llama.cpp on the golden files. */
static const struct {
    kv_pretok rule;
    const char *text, *words;
} k_splits[] = {
    {KV_PRETOK_GPT2, "Hello world", "Hello| world"},
    {KV_PRETOK_GPT2, "don't  stop 'S", "don|'t| | stop| '|S"},
    {KV_PRETOK_GPT2, "x12345y", "x|12345|y"},
    {KV_PRETOK_GPT2, "a  \n\n b", "a|  \n\n| b"},
    {KV_PRETOK_GPT2, "  hi  ", " | hi|  "},
    {KV_PRETOK_GPT2, "caf\xc3\xa9 \xc2\xbd 12,5", "caf\xc3\xa9| \xc2\xbd| 12|,|5"},
    {KV_PRETOK_GPT2, "foo!!\n\nbar", "foo|!!|\n|\n|bar"},
    {KV_PRETOK_GPT2, "\t\tx", "\t|\t|x"},
    {KV_PRETOK_GPT2, "I'M HERE", "I|'|M| HERE"},
    {KV_PRETOK_DIGITS_GPT2, "Hello world", "Hello| world"},
    {KV_PRETOK_DIGITS_GPT2, "don't  stop 'S", "don|'t| | stop| '|S"},
    {KV_PRETOK_DIGITS_GPT2, "x12345y", "x|1|2|3|4|5|y"},
    {KV_PRETOK_DIGITS_GPT2, "a  \n\n b", "a|  \n\n| b"},
    {KV_PRETOK_DIGITS_GPT2, "  hi  ", " | hi|  "},
    {KV_PRETOK_DIGITS_GPT2, "caf\xc3\xa9 \xc2\xbd 12,5", "caf\xc3\xa9| |\xc2\xbd| |1|2|,|5"},
    {KV_PRETOK_DIGITS_GPT2, "foo!!\n\nbar", "foo|!!|\n|\n|bar"},
    {KV_PRETOK_DIGITS_GPT2, "\t\tx", "\t|\t|x"},
    {KV_PRETOK_DIGITS_GPT2, "I'M HERE", "I|'|M| HERE"},
    {KV_PRETOK_LLAMA3, "Hello world", "Hello| world"},
    {KV_PRETOK_LLAMA3, "don't  stop 'S", "don|'t| | stop| '|S"},
    {KV_PRETOK_LLAMA3, "x12345y", "x|123|45|y"},
    {KV_PRETOK_LLAMA3, "a  \n\n b", "a|  \n\n| b"},
    {KV_PRETOK_LLAMA3, "  hi  ", " | hi|  "},
    {KV_PRETOK_LLAMA3, "caf\xc3\xa9 \xc2\xbd 12,5", "caf\xc3\xa9| |\xc2\xbd| |12|,|5"},
    {KV_PRETOK_LLAMA3, "foo!!\n\nbar", "foo|!!\n\n|bar"},
    {KV_PRETOK_LLAMA3, "\t\tx", "\t|\tx"},
    {KV_PRETOK_LLAMA3, "I'M HERE", "I|'M| HERE"},
    {KV_PRETOK_QWEN2, "Hello world", "Hello| world"},
    {KV_PRETOK_QWEN2, "don't  stop 'S", "don|'t| | stop| '|S"},
    {KV_PRETOK_QWEN2, "x12345y", "x|1|2|3|4|5|y"},
    {KV_PRETOK_QWEN2, "a  \n\n b", "a|  \n\n| b"},
    {KV_PRETOK_QWEN2, "  hi  ", " | hi|  "},
    {KV_PRETOK_QWEN2, "caf\xc3\xa9 \xc2\xbd 12,5", "caf\xc3\xa9| |\xc2\xbd| |1|2|,|5"},
    {KV_PRETOK_QWEN2, "foo!!\n\nbar", "foo|!!\n\n|bar"},
    {KV_PRETOK_QWEN2, "\t\tx", "\t|\tx"},
    {KV_PRETOK_QWEN2, "I'M HERE", "I|'M| HERE"},
};

START_TEST(test_pretokenizer_splits) {
    static const char *const names[] = {"", "gpt-2", "smollm", "llama-bpe", "qwen2"};
    test_vocab tv;
    make_bytelevel(&tv, NULL, 0);
    tv.v.n_merges = 0;
    tv_merge(&tv, "a b"); /* a BPE vocabulary needs merges; this one is never used */
    snprintf(tv.v.pre, sizeof tv.v.pre, "%s", names[k_splits[_i].rule]);
    kv_tokenizer *t;
    ck_assert_kv_ok(kv_tokenizer_create(&t, &tv.v));
    ck_assert_int_eq(t->pretok, k_splits[_i].rule);
    kv_tok_scratch sc;
    memset(&sc, 0, sizeof sc);
    const char *text = k_splits[_i].text;
    size_t ncp;
    ck_assert_kv_ok(kv_tok_pretokenize(t, &sc, text, strlen(text), &ncp));
    char got[256];
    size_t k = 0, start = 0;
    for (size_t w = 0; w < sc.n_words; w++) {
        if (w) got[k++] = '|';
        size_t a = sc.cp_off[start], b = sc.cp_off[sc.word_end[w]];
        memcpy(got + k, text + a, b - a);
        k += b - a;
        start = sc.word_end[w];
    }
    got[k] = 0;
    ck_assert_uint_eq(start, ncp);
    ck_assert_msg(strcmp(got, k_splits[_i].words) == 0, "rule %s, \"%s\": got \"%s\" expected \"%s\"",
                  names[k_splits[_i].rule], text, got, k_splits[_i].words);
    kv_tok_scratch_free(&sc);
    kv_tokenizer_free(t);
    tv_free(&tv);
}
END_TEST

/* ---- byte-level BPE -------------------------------------------------------------------------- */

START_TEST(test_bpe_merges) {
    /* rank decides, not length or position: "l l" (rank 0) beats "e l" (rank 1) in "hello" */
    static const char *const merges[] = {"l l", "e l", "h e", "he ll", "hell o", GSP " w", "o r", GSP "w or",
                                         GSP "wor ld", "l d"};
    test_vocab tv;
    make_bytelevel(&tv, merges, 10);
    kv_tokenizer *t;
    ck_assert_kv_ok(kv_tokenizer_create(&t, &tv.v));
    expect_tokens(t, "hello world", 0, "hello " GSP "world");
    expect_tokens(t, "hello", 0, "hello");
    expect_tokens(t, "helo", 0, "h el o");    /* "e l" (rank 1) before "h e" (rank 2) */
    expect_tokens(t, "ell", 0, "e ll");       /* "l l" (rank 0) first, then nothing joins e+ll */
    expect_tokens(t, " wor", 0, GSP "wor");
    expect_tokens(t, "\n", 0, "\xC4\x8A");    /* byte 0x0A is U+010A in the byte-level alphabet */
    expect_tokens(t, "", 0, "");
    kv_tokenizer_free(t);
    tv_free(&tv);
}
END_TEST

START_TEST(test_bpe_roundtrip_random_bytes) {
    static const char *const merges[] = {"t h", "th e", GSP " the", "i n", "e r", "a n"};
    test_vocab tv;
    make_bytelevel(&tv, merges, 6);
    for (int rule = 0; rule < 4; rule++) {
        static const char *const pre[] = {"gpt-2", "smollm", "llama-bpe", "qwen2"};
        snprintf(tv.v.pre, sizeof tv.v.pre, "%s", pre[rule]);
        kv_tokenizer *t;
        ck_assert_kv_ok(kv_tokenizer_create(&t, &tv.v));
        kv_rng rng;
        kv_rng_init(&rng, 1234 + (uint64_t)rule);
        char buf[512];
        for (int it = 0; it < 200; it++) {
            size_t n = (size_t)(kv_rng_next_u64(&rng) % sizeof buf);
            for (size_t i = 0; i < n; i++) {
                uint64_t r = kv_rng_next_u64(&rng);
                /* mostly text-like bytes, some arbitrary (invalid UTF-8 included) */
                buf[i] = (char)(r % 4 ? " the\nin1'\xC3\xA9"[(r >> 8) % 12] : (char)(r >> 16));
            }
            roundtrip(t, buf, n, 0);
        }
        kv_tokenizer_free(t);
    }
    tv_free(&tv);
}
END_TEST

START_TEST(test_special_tokens) {
    static const char *const merges[] = {"h i"};
    test_vocab tv;
    make_bytelevel(&tv, merges, 1);
    int ctl = tv_add(&tv, "<|ctl|>", KV_TOKEN_CONTROL, 0);
    int usr = tv_add(&tv, "<usr>", KV_TOKEN_USER_DEFINED, 0);
    int ctl_long = tv_add(&tv, "<|ctl|>x", KV_TOKEN_CONTROL, 0);
    tv.v.bos_id = ctl;
    tv.v.eos_id = ctl_long;
    kv_tokenizer *t;
    ck_assert_kv_ok(kv_tokenizer_create(&t, &tv.v));
    /* user-defined tokens are always split out; control tokens only when asked */
    expect_tokens(t, "hi<usr>hi", 0, "hi <usr> hi");
    expect_tokens(t, "hi<|ctl|>", 0, "hi < | c t l | >");
    expect_tokens(t, "hi<|ctl|>", KV_TOK_PARSE_SPECIAL, "hi <|ctl|>");
    /* the longest special token wins */
    expect_tokens(t, "<|ctl|>x<|ctl|>", KV_TOK_PARSE_SPECIAL, "<|ctl|>x <|ctl|>");
    expect_tokens(t, "hi", KV_TOK_ADD_BOS, "<|ctl|> hi");
    int32_t ids[] = {ctl, tid(t, "hi"), usr, ctl_long};
    char *s;
    size_t l;
    ck_assert_kv_ok(kv_tokenizer_decode(&s, &l, t, ids, 4, 0));
    ck_assert_str_eq(s, "hi<usr>");
    free(s);
    ck_assert_kv_ok(kv_tokenizer_decode(&s, &l, t, ids, 4, KV_DETOK_SPECIAL));
    ck_assert_str_eq(s, "<|ctl|>hi<usr><|ctl|>x");
    free(s);
    ck_assert_int_eq(kv_tokenizer_is_eog(t, ctl_long), 1);
    ck_assert_int_eq(kv_tokenizer_is_eog(t, ctl), 0);
    /* errors */
    int32_t bad = 99999;
    ck_assert_int_eq(kv_tokenizer_decode(&s, &l, t, &bad, 1, 0), KV_EINVAL);
    ck_assert_ptr_null(s);
    ck_assert_ptr_null(kv_tokenizer_piece(t, -1, &l));
    kv_tokenizer_free(t);
    tv.v.bos_id = -1;
    ck_assert_kv_ok(kv_tokenizer_create(&t, &tv.v));
    int32_t *out;
    size_t n;
    ck_assert_int_eq(kv_tokenizer_encode(&out, &n, t, "x", 1, KV_TOK_ADD_BOS), KV_EINVAL);
    kv_tokenizer_free(t);
    snprintf(tv.v.pre, sizeof tv.v.pre, "no-such-rule");
    ck_assert_int_eq(kv_tokenizer_create(&t, &tv.v), KV_EUNSUPPORTED);
    ck_assert_ptr_null(t);
    tv_free(&tv);
}
END_TEST

/* ---- SentencePiece --------------------------------------------------------------------------- */

static void make_spm(test_vocab *tv) {
    tv_init(tv, KV_VOCAB_SPM);
    tv_add(tv, "<unk>", KV_TOKEN_UNKNOWN, 0);
    tv_add(tv, "<s>", KV_TOKEN_CONTROL, 0);
    tv_add(tv, "</s>", KV_TOKEN_CONTROL, 0);
    for (int b = 0; b < 256; b++) {
        char s[8];
        snprintf(s, sizeof s, "<0x%02X>", b);
        tv_add(tv, s, KV_TOKEN_BYTE, 0);
    }
    static const struct {
        const char *s;
        float score;
    } pieces[] = {{SP "a", -1}, {"ab", -2}, {SP "ab", -3}, {SP "b", -4}, {"bc", -0.5f}, {SP, -5}, {"a", -6},
                  {"b", -7},   {"c", -8},  {SP SP, -9},   {"\xC3\xA9", -10}, {"UNUSEDab", -0.1f}};
    for (size_t i = 0; i < sizeof pieces / sizeof pieces[0]; i++) tv_add(tv, pieces[i].s, KV_TOKEN_NORMAL, pieces[i].score);
    tv->v.unk_id = 0;
    tv->v.bos_id = 1;
    tv->v.eos_id = 2;
    tv->v.add_bos = 1;
    tv->v.add_space_prefix = 1;
}

START_TEST(test_spm_merges) {
    test_vocab tv;
    make_spm(&tv);
    kv_tokenizer *t;
    ck_assert_kv_ok(kv_tokenizer_create(&t, &tv.v));
    /* best score first: "bc" (-0.5) beats "▁a" (-1): ▁ a b c -> ▁ a bc -> ▁a bc */
    expect_tokens(t, "abc", 0, SP "a bc");
    expect_tokens(t, "ab", 0, SP "ab");           /* ▁a (-1) before ab (-2), then ▁a+b = ▁ab (-3) */
    expect_tokens(t, "b a", 0, SP "b " SP "a");
    expect_tokens(t, "ab", KV_TOK_NO_SPACE_PREFIX, "ab");
    expect_tokens(t, "x\xC3\xA9", KV_TOK_NO_SPACE_PREFIX, "<0x78> \xC3\xA9"); /* byte fallback */
    expect_tokens(t, "  a", 0, SP SP " " SP "a");
    expect_tokens(t, "a", KV_TOK_ADD_BOS, "<s> " SP "a");
    expect_tokens(t, "", 0, "");
    /* decoding drops the dummy prefix's space once */
    roundtrip(t, "abc ab  c\n\xC3\xA9\xF0\x9F\x98\x80", strlen("abc ab  c\n\xC3\xA9\xF0\x9F\x98\x80"), 0);
    roundtrip(t, " lead", 5, 0);
    size_t l;
    int32_t a = tid(t, SP "a");
    ck_assert_str_eq(kv_tokenizer_piece(t, a, &l), " a");
    ck_assert_str_eq(kv_tokenizer_piece_after(t, 1, a, &l), "a");
    ck_assert_str_eq(kv_tokenizer_piece_after(t, a, a, &l), " a");
    ck_assert_str_eq(kv_tokenizer_piece(t, tid(t, "<0x0A>"), &l), "\n");
    ck_assert_str_eq(kv_tokenizer_piece(t, 1, &l), "");
    kv_tokenizer_free(t);

    /* sentencepiece's remove_extra_whitespaces */
    tv.v.remove_extra_ws = 1;
    ck_assert_kv_ok(kv_tokenizer_create(&t, &tv.v));
    expect_tokens(t, "  a   b  ", 0, SP "a " SP "b");
    expect_tokens(t, "   ", 0, "");
    kv_tokenizer_free(t);
    tv_free(&tv);
}
END_TEST

START_TEST(test_spm_random_roundtrip) {
    test_vocab tv;
    make_spm(&tv);
    kv_tokenizer *t;
    ck_assert_kv_ok(kv_tokenizer_create(&t, &tv.v));
    kv_rng rng;
    kv_rng_init(&rng, 99);
    static const char *const units[] = {"a", "b", "c", " ", "  ", "\n", "\xC3\xA9", "\xF0\x9F\x98\x80"};
    char buf[1200];
    for (int it = 0; it < 300; it++) {
        size_t n = 0, want = (size_t)(kv_rng_next_u64(&rng) % 300);
        while (n < want) {
            uint64_t r = kv_rng_next_u64(&rng);
            if (r % 3) {
                const char *u = units[(r >> 8) % 8];
                memcpy(buf + n, u, strlen(u));
                n += strlen(u);
            } else {
                /* arbitrary bytes below 0xC0: stray continuation bytes, control bytes. A lead byte
                 * >= 0xC0 before ASCII makes a symbol that swallows the next bytes (llama.cpp's
                 * unicode_len_utf8), and a space among them comes back as U+2581's bytes: a property
                 * of the reference algorithm, so lead bytes only appear in valid characters here. */
                buf[n++] = (char)((r >> 16) & 0xBF);
            }
        }
        roundtrip(t, buf, n, 0);
    }
    kv_tokenizer_free(t);
    tv_free(&tv);
}
END_TEST

/* HF-style SentencePiece-like BPE: ranked merges over characters, byte fallback before merging */
START_TEST(test_spm_merges_kind) {
    test_vocab tv;
    tv_init(&tv, KV_VOCAB_SPM_MERGES);
    tv_add(&tv, "<unk>", KV_TOKEN_UNKNOWN, 0);
    for (int b = 0; b < 256; b++) {
        char s[8];
        snprintf(s, sizeof s, "<0x%02X>", b);
        tv_add(&tv, s, KV_TOKEN_BYTE, 0);
    }
    tv_add(&tv, SP, KV_TOKEN_NORMAL, 0);
    tv_add(&tv, "a", KV_TOKEN_NORMAL, 0);
    tv_add(&tv, "b", KV_TOKEN_NORMAL, 0);
    tv_add(&tv, SP "a", KV_TOKEN_NORMAL, 0);
    tv_add(&tv, "ab", KV_TOKEN_NORMAL, 0);
    tv_add(&tv, SP "ab", KV_TOKEN_NORMAL, 0);
    tv_merge(&tv, "a b");
    tv_merge(&tv, SP " a");
    tv_merge(&tv, SP " ab");
    tv.v.unk_id = 0;
    tv.v.add_space_prefix = 1;
    kv_tokenizer *t;
    ck_assert_kv_ok(kv_tokenizer_create(&t, &tv.v));
    expect_tokens(t, "ab", 0, SP "ab");    /* a+b (rank 0), then ▁+ab (rank 2) */
    expect_tokens(t, "aab", 0, SP "a ab"); /* ▁ a a b: a b (0) -> ▁ a ab; ▁ a (1) -> ▁a ab */
    expect_tokens(t, "\xC3\xA9", 0, SP " <0xC3> <0xA9>");
    roundtrip(t, "ab a\xC3\xA9", 6, 0);
    kv_tokenizer_free(t);
    tv_free(&tv);
}
END_TEST

/* ---- loaders --------------------------------------------------------------------------------- */

static void gguf_tokenizer_file(const char *path, const char *model, int scores_count, int tokens_as_ints) {
    kv_gguf_writer *w;
    ck_assert_kv_ok(kv_gguf_writer_create(&w));
    ck_assert_kv_ok(kv_gguf_writer_set_str(w, "general.architecture", "llama"));
    if (model) ck_assert_kv_ok(kv_gguf_writer_set_str(w, "tokenizer.ggml.model", model));
    static const char *const toks[] = {"<unk>", "<s>", "</s>", SP "a", "a", "<0x0A>"};
    if (tokens_as_ints) {
        int32_t x[6] = {0};
        ck_assert_kv_ok(kv_gguf_writer_set_array(w, "tokenizer.ggml.tokens", KV_GGUF_INT32, x, 6));
    } else {
        ck_assert_kv_ok(kv_gguf_writer_set_str_array(w, "tokenizer.ggml.tokens", toks, 6));
    }
    float sc[6] = {0, 0, 0, -1, -2, 0};
    ck_assert_kv_ok(kv_gguf_writer_set_array(w, "tokenizer.ggml.scores", KV_GGUF_FLOAT32, sc, (uint64_t)scores_count));
    int32_t ty[6] = {2, 3, 3, 1, 1, 6};
    ck_assert_kv_ok(kv_gguf_writer_set_array(w, "tokenizer.ggml.token_type", KV_GGUF_INT32, ty, 6));
    ck_assert_kv_ok(kv_gguf_writer_set_u32(w, "tokenizer.ggml.bos_token_id", 1));
    ck_assert_kv_ok(kv_gguf_writer_set_u32(w, "tokenizer.ggml.eos_token_id", 2));
    ck_assert_kv_ok(kv_gguf_writer_set_u32(w, "tokenizer.ggml.padding_token_id", 77)); /* out of range: ignored */
    ck_assert_kv_ok(kv_gguf_writer_set_bool(w, "tokenizer.ggml.add_bos_token", 0));
    ck_assert_kv_ok(kv_gguf_writer_write(w, path));
    kv_gguf_writer_free(w);
}

START_TEST(test_load_gguf) {
    char dir[256], path[300];
    tmpdir_make(dir, sizeof dir);
    snprintf(path, sizeof path, "%s/tok.gguf", dir);
    gguf_tokenizer_file(path, "llama", 6, 0);
    kv_vocab_data *v;
    ck_assert_kv_ok(kv_vocab_load(&v, NULL, path));
    ck_assert_int_eq(v->kind, KV_VOCAB_SPM);
    ck_assert_int_eq(v->n_tokens, 6);
    ck_assert_str_eq(v->tokens[3], SP "a");
    ck_assert_uint_eq(v->token_len[3], 4);
    ck_assert(v->scores[4] == -2.0f);
    ck_assert_int_eq(v->token_type[5], KV_TOKEN_BYTE);
    ck_assert_int_eq(v->bos_id, 1);
    ck_assert_int_eq(v->eos_id, 2);
    ck_assert_int_eq(v->unk_id, 0);  /* llama.cpp's SPM default */
    ck_assert_int_eq(v->pad_id, -1); /* 77 is outside the vocabulary */
    ck_assert_int_eq(v->add_bos, 0);
    ck_assert_int_eq(v->add_space_prefix, 1);
    ck_assert_str_eq(v->source, "gguf");
    kv_tokenizer *t;
    ck_assert_kv_ok(kv_tokenizer_create(&t, v));
    expect_tokens(t, "a\n", 0, SP "a <0x0A>");
    kv_tokenizer_free(t);
    kv_vocab_free(v);

    /* errors: each its own code */
    gguf_tokenizer_file(path, "bert", 6, 0);
    ck_assert_int_eq(kv_vocab_load(&v, NULL, path), KV_EUNSUPPORTED);
    ck_assert_ptr_null(v);
    gguf_tokenizer_file(path, NULL, 6, 0);
    ck_assert_int_eq(kv_vocab_load(&v, NULL, path), KV_ENOTFOUND);
    gguf_tokenizer_file(path, "llama", 5, 0);
    ck_assert_int_eq(kv_vocab_load(&v, NULL, path), KV_EFORMAT);
    ck_assert_ptr_nonnull(strstr(kv_error_last(), "scores"));
    gguf_tokenizer_file(path, "llama", 6, 1);
    ck_assert_int_eq(kv_vocab_load(&v, NULL, path), KV_EFORMAT);
    gguf_tokenizer_file(path, "gpt2", 6, 0); /* BPE without merges */
    ck_assert_int_eq(kv_vocab_load(&v, NULL, path), KV_EFORMAT);
    ck_assert_ptr_nonnull(strstr(kv_error_last(), "merges"));
    unlink(path);
    rmdir(dir);
}
END_TEST

static void put_u32(FILE *fp, uint32_t x) {
    uint8_t b[4];
    kv_store_u32le(b, x);
    fwrite(b, 1, 4, fp);
}

START_TEST(test_load_llama2c) {
    char dir[256], path[300], model[300];
    tmpdir_make(dir, sizeof dir);
    snprintf(path, sizeof path, "%s/tok7.bin", dir);
    snprintf(model, sizeof model, "%s/tok7.model", dir);
    static const char *const toks[] = {"<unk>", "\n<s>\n", "\n</s>\n", "<0x0A>", " a", "a", " "};
    FILE *fp = fopen(path, "wb");
    put_u32(fp, 6);
    for (int i = 0; i < 7; i++) {
        uint8_t b[4];
        kv_store_f32le(b, (float)-i);
        fwrite(b, 1, 4, fp);
        put_u32(fp, (uint32_t)strlen(toks[i]));
        fwrite(toks[i], 1, strlen(toks[i]), fp);
    }
    fclose(fp);
    kv_vocab_data *v;
    ck_assert_kv_ok(kv_vocab_load(&v, NULL, path));
    ck_assert_int_eq(v->n_tokens, 7);
    ck_assert_str_eq(v->tokens[1], "<s>");
    ck_assert_str_eq(v->tokens[2], "</s>");
    ck_assert_str_eq(v->tokens[4], SP "a");
    ck_assert_str_eq(v->tokens[6], SP);
    ck_assert_int_eq(v->token_type[0], KV_TOKEN_UNKNOWN);
    ck_assert_int_eq(v->token_type[1], KV_TOKEN_CONTROL);
    ck_assert_int_eq(v->token_type[3], KV_TOKEN_BYTE);
    ck_assert_int_eq(v->token_type[4], KV_TOKEN_NORMAL);
    ck_assert(v->scores[5] == -5.0f);
    ck_assert_int_eq(v->add_space_prefix, 1);
    ck_assert_int_eq(v->remove_extra_ws, 0); /* no sibling .model */
    kv_vocab_free(v);

    /* a sibling sentencepiece model supplies the normalizer flags: normalizer_spec (field 3) with
     * add_dummy_prefix (3) = 0 and remove_extra_whitespaces (4) = 1 */
    const uint8_t pb[] = {0x1A, 0x04, 0x18, 0x00, 0x20, 0x01};
    write_file(model, pb, sizeof pb);
    ck_assert_kv_ok(kv_vocab_load(&v, NULL, path));
    ck_assert_int_eq(v->add_space_prefix, 0);
    ck_assert_int_eq(v->remove_extra_ws, 1);
    kv_vocab_free(v);
    /* ... and loading the .model itself: no pieces */
    ck_assert_int_eq(kv_vocab_load(&v, NULL, model), KV_EFORMAT);
    /* a unigram model: one piece "a" (field 1 {1: "a"}), trainer_spec (2) with model_type (3) = 1 */
    const uint8_t uni[] = {0x0A, 0x03, 0x0A, 0x01, 'a', 0x12, 0x02, 0x18, 0x01};
    write_file(model, uni, sizeof uni);
    ck_assert_int_eq(kv_vocab_load(&v, NULL, model), KV_EUNSUPPORTED);
    const uint8_t bad[] = {0x0A, 0x7F, 0x0A};
    write_file(model, bad, sizeof bad);
    ck_assert_int_eq(kv_vocab_load(&v, NULL, model), KV_EFORMAT);
    unlink(model);

    /* truncated: the last record's bytes cut */
    FILE *in = fopen(path, "rb");
    char buf[256];
    size_t n = fread(buf, 1, sizeof buf, in);
    fclose(in);
    write_file(path, buf, n - 1);
    ck_assert_int_eq(kv_vocab_load(&v, NULL, path), KV_EFORMAT);
    ck_assert_ptr_null(v);
    /* a negative length */
    memcpy(buf + 8, "\xFF\xFF\xFF\xFF", 4);
    write_file(path, buf, n);
    ck_assert_int_eq(kv_vocab_load(&v, NULL, path), KV_EFORMAT);
    write_file(path, buf, 2);
    ck_assert_int_eq(kv_vocab_load(&v, NULL, path), KV_EFORMAT);
    unlink(path);
    ck_assert_int_eq(kv_vocab_load(&v, NULL, path), KV_ENOTFOUND);
    rmdir(dir);
}
END_TEST

START_TEST(test_load_hf_json) {
    char dir[256], path[300], cfg[300];
    tmpdir_make(dir, sizeof dir);
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    snprintf(cfg, sizeof cfg, "%s/tokenizer_config.json", dir);
    /* byte-level, SmolLM's pipeline, merges in both spellings, added tokens */
    write_text(path,
               "{\"added_tokens\":[{\"id\":0,\"content\":\"<|endoftext|>\",\"special\":true},"
               "{\"id\":5,\"content\":\"<tag>\",\"special\":false}],"
               "\"normalizer\":null,"
               "\"pre_tokenizer\":{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Digits\",\"individual_digits\":true},"
               "{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"trim_offsets\":true,\"use_regex\":true}]},"
               "\"post_processor\":null,"
               "\"model\":{\"type\":\"BPE\",\"vocab\":{\"<|endoftext|>\":0,\"h\":1,\"i\":2,\"hi\":3,\"\xC4\xA0\":4,"
               "\"\xC4\xA0hi\":6},\"merges\":[\"h i\",[\"\xC4\xA0\",\"hi\"]]}}");
    write_text(cfg, "{\"bos_token\":\"<|endoftext|>\",\"eos_token\":{\"content\":\"<|endoftext|>\"},\"add_bos_token\":false}");
    kv_vocab_data *v;
    ck_assert_kv_ok(kv_vocab_load(&v, NULL, dir)); /* a directory holding tokenizer.json */
    ck_assert_int_eq(v->kind, KV_VOCAB_BPE);
    ck_assert_str_eq(v->pre, "smollm");
    ck_assert_int_eq(v->n_tokens, 7);
    ck_assert_int_eq(v->n_merges, 2);
    ck_assert_str_eq(v->merges[1], "\xC4\xA0 hi");
    ck_assert_int_eq(v->token_type[0], KV_TOKEN_CONTROL);
    ck_assert_int_eq(v->token_type[5], KV_TOKEN_USER_DEFINED);
    ck_assert_str_eq(v->tokens[5], "<tag>");
    ck_assert_str_eq(v->tokens[6], "\xC4\xA0hi");
    ck_assert_int_eq(v->bos_id, 0);
    ck_assert_int_eq(v->eos_id, 0);
    ck_assert_int_eq(v->add_bos, 0);
    kv_tokenizer *t;
    ck_assert_kv_ok(kv_tokenizer_create(&t, v));
    expect_tokens(t, "hi hi<tag>", 0, "hi \xC4\xA0hi <tag>");
    kv_tokenizer_free(t);
    kv_vocab_free(v);

    /* Llama 3's split regex -> llama-bpe; BOS from the post-processor when the config says nothing */
    unlink(cfg);
    write_text(path,
               "{\"added_tokens\":[{\"id\":2,\"content\":\"<|begin_of_text|>\",\"special\":true}],"
               "\"pre_tokenizer\":{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Split\",\"pattern\":{\"Regex\":"
               "\"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\\\r\\\\n\\\\p{L}\\\\p{N}]?\\\\p{L}+|\\\\p{N}{1,3}| ?[^\\\\s\\\\p{L}\\\\p{N}]+"
               "[\\\\r\\\\n]*|\\\\s*[\\\\r\\\\n]+|\\\\s+(?!\\\\S)|\\\\s+\"},\"behavior\":\"Isolated\",\"invert\":false},"
               "{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"use_regex\":false}]},"
               "\"post_processor\":{\"type\":\"TemplateProcessing\",\"single\":[{\"SpecialToken\":{\"id\":\"<|begin_of_text|>\","
               "\"type_id\":0}},{\"Sequence\":{\"id\":\"A\",\"type_id\":0}}]},"
               "\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":1,\"ab\":3},\"merges\":[\"a b\"]}}");
    ck_assert_kv_ok(kv_vocab_load(&v, NULL, path));
    ck_assert_str_eq(v->pre, "llama-bpe");
    ck_assert_int_eq(v->bos_id, 2);
    ck_assert_int_eq(v->add_bos, 1);
    kv_vocab_free(v);

    /* SentencePiece-like (Llama 2 exported by HF) */
    write_text(path,
               "{\"added_tokens\":[{\"id\":0,\"content\":\"<unk>\",\"special\":true}],"
               "\"normalizer\":{\"type\":\"Sequence\",\"normalizers\":[{\"type\":\"Prepend\",\"prepend\":\"" SP "\"},"
               "{\"type\":\"Replace\",\"pattern\":{\"String\":\" \"},\"content\":\"" SP "\"}]},"
               "\"pre_tokenizer\":null,"
               "\"model\":{\"type\":\"BPE\",\"unk_token\":\"<unk>\",\"byte_fallback\":true,\"vocab\":{\"<unk>\":0,"
               "\"<0x0A>\":1,\"" SP "\":2,\"a\":3,\"" SP "a\":4},\"merges\":[\"" SP " a\"]}}");
    ck_assert_kv_ok(kv_vocab_load(&v, NULL, path));
    ck_assert_int_eq(v->kind, KV_VOCAB_SPM_MERGES);
    ck_assert_int_eq(v->add_space_prefix, 1);
    ck_assert_int_eq(v->unk_id, 0);
    ck_assert_int_eq(v->token_type[1], KV_TOKEN_BYTE);
    ck_assert_kv_ok(kv_tokenizer_create(&t, v));
    expect_tokens(t, "a\na", 0, SP "a <0x0A> a");
    kv_tokenizer_free(t);
    kv_vocab_free(v);

    /* errors */
    write_text(path, "{\"model\":{\"type\":\"WordPiece\",\"vocab\":{}}}");
    ck_assert_int_eq(kv_vocab_load(&v, NULL, path), KV_EUNSUPPORTED);
    write_text(path, "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[]},"
                     "\"pre_tokenizer\":{\"type\":\"Whitespace\"}}");
    ck_assert_int_eq(kv_vocab_load(&v, NULL, path), KV_EUNSUPPORTED);
    write_text(path, "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":-3},\"merges\":[]},"
                     "\"pre_tokenizer\":{\"type\":\"ByteLevel\"}}");
    ck_assert_int_eq(kv_vocab_load(&v, NULL, path), KV_EFORMAT);
    write_text(path, "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[42]},"
                     "\"pre_tokenizer\":{\"type\":\"ByteLevel\"}}");
    ck_assert_int_eq(kv_vocab_load(&v, NULL, path), KV_EFORMAT);
    write_text(path, "{\"model\": [1, 2");
    ck_assert_int_eq(kv_vocab_load(&v, NULL, path), KV_EFORMAT);
    ck_assert_ptr_null(v);
    unlink(path);
    ck_assert_int_eq(kv_vocab_load(&v, NULL, dir), KV_ENOTFOUND);
    rmdir(dir);
}
END_TEST

static Suite *suite(void) {
    Suite *s = suite_create("tokenizer");
    TCase *tc = tcase_create("unit");
    tcase_add_test(tc, test_unicode_classes);
    tcase_add_test(tc, test_utf8);
    tcase_add_loop_test(tc, test_pretokenizer_splits, 0, (int)(sizeof k_splits / sizeof k_splits[0]));
    tcase_add_test(tc, test_bpe_merges);
    tcase_add_test(tc, test_bpe_roundtrip_random_bytes);
    tcase_add_test(tc, test_special_tokens);
    tcase_add_test(tc, test_spm_merges);
    tcase_add_test(tc, test_spm_random_roundtrip);
    tcase_add_test(tc, test_spm_merges_kind);
    suite_add_tcase(s, tc);
    TCase *tl = tcase_create("loaders");
    tcase_add_test(tl, test_load_gguf);
    tcase_add_test(tl, test_load_llama2c);
    tcase_add_test(tl, test_load_hf_json);
    suite_add_tcase(s, tl);
    return s;
}

int main(void) { return kv_test_run(suite()); }
