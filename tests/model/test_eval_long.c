/* Long-context evaluation (model/eval_compare.c kv_eval_continuation, model/eval_passkey.c) on
 * stories260K: the passkey prompt's layout (exact length, the needle at its depth, a contiguous filler
 * slice, keys from the seed), the continuation protocol against an independent computation of the same
 * scores, and one prefill copied into a pruning cache == that cache's own prefill. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kv_model.h"
#include "kv_test.h"
#include "kvrt.h"
#include "model_test_util.h"

static kv_model *g_m;
static kv_tokenizer *g_tok;

static void open_model(void) {
    char path[1024], tpath[1024];
    snprintf(path, sizeof path, "%s/stories260K/stories260K.bin", kv_test_data_dir());
    snprintf(tpath, sizeof tpath, "%s/stories260K/tok512.bin", kv_test_data_dir());
    ck_assert_kv_ok(kv_model_open(&g_m, path, NULL));
    kv_model_file *mf = NULL;
    ck_assert_kv_ok(kv_model_file_open(&mf, path));
    ck_assert_kv_ok(kv_tokenizer_load(&g_tok, mf, tpath));
    kv_model_file_close(mf);
}

static void close_model(void) {
    kv_tokenizer_free(g_tok);
    kv_model_free(g_m);
    g_tok = NULL, g_m = NULL;
}

/* First index of needle[0..nn) in hay[0..nh), or -1. */
static int find_seq(const int32_t *hay, int nh, const int32_t *needle, int nn) {
    for (int i = 0; i + nn <= nh; i++)
        if (memcmp(hay + i, needle, (size_t)nn * sizeof *hay) == 0) return i;
    return -1;
}

START_TEST(test_passkey_prompt) {
    const int V = kv_model_arch(g_m)->vocab_size, L = 300, NF = 5000;
    int32_t *filler = malloc(NF * sizeof *filler);
    kv_test_tokens(filler, NF, V - 259);
    for (int i = 0; i < NF; i++) filler[i] += 259; /* tok512: ids 3..258 are single bytes; keep to text pieces */
    const double depths[] = {0.0, 0.25, 1.0};
    int at[3], key0 = -1, nn = 0;
    int32_t *needle = NULL;
    for (int d = 0; d < 3; d++) {
        kv_passkey_options o = {L, depths[d], 42};
        int32_t *ids = NULL;
        int n = 0, key = 0;
        ck_assert_kv_ok(kv_passkey_prompt(&ids, &n, &key, g_tok, filler, NF, &o));
        ck_assert_int_eq(n, L);
        ck_assert(key >= 10000 && key <= 99999);
        if (d == 0) { /* the needle's own tokens, as the prompt encodes them */
            key0 = key;
            char text[96];
            snprintf(text, sizeof text, "\nThe pass key is %d. Remember it.\n", key);
            size_t m = 0;
            ck_assert_kv_ok(kv_tokenizer_encode(&needle, &m, g_tok, text, strlen(text), KV_TOK_NO_SPACE_PREFIX));
            nn = (int)m;
        }
        ck_assert_int_eq(key, key0); /* the seed fixes the key whatever the depth */
        at[d] = find_seq(ids, n, needle, nn);
        ck_assert_int_ge(at[d], 1);
        /* the question and the answer's primer end the prompt (each encoded as a piece of its own) */
        static const char *const q[2] = {"\n\nWhat is the pass key?", " The pass key is"};
        int32_t *qi[2] = {NULL, NULL};
        size_t nq[2] = {0, 0};
        for (int k = 0; k < 2; k++)
            ck_assert_kv_ok(kv_tokenizer_encode(&qi[k], &nq[k], g_tok, q[k], strlen(q[k]), KV_TOK_NO_SPACE_PREFIX));
        ck_assert_int_eq(find_seq(ids + n - (int)nq[1], (int)nq[1], qi[1], (int)nq[1]), 0);
        ck_assert_int_eq(find_seq(ids + n - (int)(nq[0] + nq[1]), (int)nq[0], qi[0], (int)nq[0]), 0);
        free(qi[0]), free(qi[1]);
        free(ids);
    }
    /* depth 1 puts all F filler tokens before the needle, depth 0 none, 0.25 round(F/4) */
    const int F = at[2] - at[0];
    ck_assert_int_gt(F, 100);
    ck_assert_int_eq(at[1] - at[0], (int)floor(0.25 * F + 0.5));
    {
        kv_passkey_options o = {L, 0.0, 42};
        int32_t *ids = NULL;
        int n = 0, key = 0;
        ck_assert_kv_ok(kv_passkey_prompt(&ids, &n, &key, g_tok, filler, NF, &o));
        const int32_t *slice = ids + at[0] + nn;
        int off = -1;
        for (int i = 0; i + F <= NF && off < 0; i++)
            if (memcmp(filler + i, slice, (size_t)F * sizeof *slice) == 0) off = i;
        ck_assert_msg(off >= 0, "the filler is not a contiguous slice of the corpus");
        free(ids);
    }
    /* keys from the seed: different seeds, mostly different keys */
    int keys[20], distinct = 0;
    for (int s = 0; s < 20; s++) {
        kv_passkey_options o = {L, 0.5, (uint64_t)s};
        int32_t *ids = NULL;
        int n = 0;
        ck_assert_kv_ok(kv_passkey_prompt(&ids, &n, &keys[s], g_tok, filler, NF, &o));
        free(ids);
        int seen = 0;
        for (int t = 0; t < s; t++) seen |= keys[t] == keys[s];
        distinct += !seen;
    }
    ck_assert_int_ge(distinct, 18); /* 20 draws from 90000 keys: a repeat has probability ~0.002 */
    /* refusals */
    int32_t *ids = NULL;
    int n = 0, key = 0;
    kv_passkey_options shortp = {20, 0.5, 1}, bigp = {L, 0.5, 1}, badd = {L, 1.5, 1};
    ck_assert_int_eq(kv_passkey_prompt(&ids, &n, &key, g_tok, filler, NF, &shortp), KV_EINVAL);
    ck_assert_ptr_nonnull(strstr(kv_error_last(), "cannot hold"));
    ck_assert_int_eq(kv_passkey_prompt(&ids, &n, &key, g_tok, filler, 50, &bigp), KV_EINVAL);
    ck_assert_ptr_nonnull(strstr(kv_error_last(), "filler corpus has 50 tokens"));
    ck_assert_int_eq(kv_passkey_prompt(&ids, &n, &key, g_tok, filler, NF, &badd), KV_EINVAL);
    ck_assert_ptr_null(ids);
    free(needle);
    free(filler);
}
END_TEST

/* A greedy answer through a plain cache: the answer is the first number of the text, correct iff it is
 * the key; the same prompt answered twice gives the same text. */
START_TEST(test_passkey_answer) {
    const int V = kv_model_arch(g_m)->vocab_size, NF = 2000;
    int32_t *filler = malloc(NF * sizeof *filler);
    kv_test_tokens(filler, NF, V);
    kv_passkey_options o = {200, 0.5, 3};
    int32_t *ids = NULL;
    int n = 0, key = 0;
    ck_assert_kv_ok(kv_passkey_prompt(&ids, &n, &key, g_tok, filler, NF, &o));
    kv_cache *c = NULL;
    ck_assert_kv_ok(kv_cache_plain_create(&c, kv_model_arch(g_m), 1, 256));
    kv_passkey_answer a[2];
    for (int r = 0; r < 2; r++) {
        ck_assert_kv_ok(kv_eval_passkey(g_m, g_tok, &c, 1, NULL, ids, n, key, 8, 64, &a[r]));
        const char *p = a[r].text;
        while (*p && (*p < '0' || *p > '9')) p++;
        const int first = *p ? atoi(p) : -1;
        if (first >= 0 && strlen(p) < 10) ck_assert_int_eq(a[r].answer, first);
        if (!*p) ck_assert_int_eq(a[r].answer, -1);
        ck_assert_int_eq(a[r].correct, a[r].answer == key);
    }
    ck_assert_str_eq(a[0].text, a[1].text);
    kv_cache_free(c);
    free(ids);
    free(filler);
}
END_TEST

/* Continuation through an uncompressed (plain f32) cache: the scores equal the exact one-pass model's
 * (KL ~ 0, same ppl), and the exact ppl equals an independent computation from one forward call's
 * logits of every position. */
START_TEST(test_continuation_exact) {
    const kv_arch *a = kv_model_arch(g_m);
    const int V = a->vocab_size, N = 64, M = 24, NT = 3 * (N + M) + 5;
    int32_t *text = malloc(NT * sizeof *text);
    kv_test_tokens(text, NT, V);
    for (int i = 0; i < NT; i++) text[i] = text[i] < 3 ? 3 : text[i]; /* no BOS/EOS inside the text */
    kv_cache *c = NULL;
    ck_assert_kv_ok(kv_cache_plain_create(&c, a, 1, N + M));
    kv_cont_options o;
    memset(&o, 0, sizeof o);
    o.prompt_len = N, o.score_len = M, o.bos_id = a->bos_id, o.prefill_chunk = 16, o.step = 1;
    kv_cont_summary sum;
    kv_cont_result res;
    ck_assert_kv_ok(kv_eval_continuation(g_m, &c, 1, text, NT, &o, &sum, &res));
    ck_assert_uint_eq(sum.n_samples, 3);
    ck_assert_uint_eq(sum.tokens_scored, 3 * M);
    /* incremental attention over f32 keys and values against one pass: float summation order only */
    ck_assert_msg(res.kl_mean < 1e-6, "KL %g", res.kl_mean);
    ck_assert_msg(fabs(res.nll_mean - sum.nll_mean_ref) < 1e-4, "nll %g vs %g", res.nll_mean, sum.nll_mean_ref);
    ck_assert(res.top1_agreement >= 0.99);
    /* independent: BOS + the sample, all logits, NLL of predictions N..N+M-1 (in double) */
    double nll = 0;
    int32_t *in = malloc((N + M + 1) * sizeof *in);
    float *lg = malloc((size_t)(N + M + 1) * V * sizeof *lg);
    for (int smp = 0; smp < 3; smp++) {
        in[0] = a->bos_id;
        memcpy(in + 1, text + smp * (N + M), (N + M) * sizeof *in);
        kv_forward f;
        memset(&f, 0, sizeof f);
        f.tokens = in, f.n_seqs = 1, f.n_tokens = N + M, f.logits = lg;
        ck_assert_kv_ok(kv_model_forward(g_m, &f));
        for (int r = N; r < N + M; r++) {
            const float *x = lg + (size_t)r * V;
            double mx = x[0], z = 0;
            for (int v = 1; v < V; v++) mx = x[v] > mx ? x[v] : mx;
            for (int v = 0; v < V; v++) z += exp((double)x[v] - mx);
            nll += mx + log(z) - x[in[r + 1]];
        }
    }
    nll /= 3.0 * M;
    /* the tool computes logits in row blocks: float rounding of the logits only */
    ck_assert_msg(fabs(nll - sum.nll_mean_ref) < 1e-5, "independent nll %.9g, continuation %.9g", nll, sum.nll_mean_ref);
    /* max_samples, and a text shorter than one sample */
    o.max_samples = 2;
    ck_assert_kv_ok(kv_eval_continuation(g_m, NULL, 0, text, NT, &o, &sum, NULL));
    ck_assert_uint_eq(sum.n_samples, 2);
    ck_assert_int_eq(kv_eval_continuation(g_m, NULL, 0, text, N + M - 1, &o, &sum, NULL), KV_EINVAL);
    ck_assert_ptr_nonnull(strstr(kv_error_last(), "fewer than one sample"));
    o.prompt_len = 1;
    ck_assert_int_eq(kv_eval_continuation(g_m, NULL, 0, text, NT, &o, &sum, NULL), KV_EINVAL);
    free(in), free(lg), free(text);
    kv_cache_free(c);
}
END_TEST

/* A SnapKV plan (f16 streams, budget 1/4): one prefill through a statistics cache copied into the
 * pruning cache gives bit for bit the scores of the pruning cache's own prefill, and pruning costs
 * something (KL > 0) while an unpruned f16 plan is near exact. */
START_TEST(test_continuation_pruned_copy) {
    const kv_arch *a = kv_model_arch(g_m);
    const int V = a->vocab_size, N = 96, M = 16, NT = 2 * (N + M);
    int32_t *text = malloc(NT * sizeof *text);
    kv_test_tokens(text, NT, V);
    for (int i = 0; i < NT; i++) text[i] = text[i] < 3 ? 3 : text[i];
    kv_plan_fingerprint fp;
    memset(&fp, 0, sizeof fp);
    snprintf(fp.arch, sizeof fp.arch, "%s", "llama");
    fp.n_layers = a->n_layers, fp.d_model = a->d_model, fp.n_heads = a->n_heads, fp.n_kv_heads = a->n_kv_heads;
    fp.head_dim = a->head_dim, fp.vocab_size = V, fp.rope_theta = 10000.0f;
    kv_plan *p = NULL, *p0 = NULL;
    ck_assert_kv_ok(kv_plan_create(&p, &fp));
    ck_assert_kv_ok(kv_plan_create(&p0, &fp));
    p->global.sinks = p0->global.sinks = 4;
    p->global.recent = p0->global.recent = 16;
    p->global.prune_method = KV_PLAN_PRUNE_SNAPKV, p->global.prune_budget = 0.25f;
    p->global.prune_window = 16, p->global.prune_pool = 7;
    ck_assert_kv_ok(kv_plan_validate(p));
    kv_cache *own = NULL, *copy = NULL, *src = NULL, *f16 = NULL;
    ck_assert_kv_ok(kv_cache_rt_create(&own, p, g_m, 1, N + M, 1, 0));
    ck_assert_kv_ok(kv_cache_rt_create(&copy, p, g_m, 1, N + M, 1, 0));
    ck_assert_kv_ok(kv_cache_rt_create(&src, p0, g_m, 1, N + M, 1, KV_CACHE_RT_PROMPT_STATS));
    ck_assert_kv_ok(kv_cache_rt_create(&f16, p0, g_m, 1, N + M, 1, 0));
    kv_cont_options o;
    memset(&o, 0, sizeof o);
    o.prompt_len = N, o.score_len = M, o.bos_id = a->bos_id, o.prefill_chunk = 32, o.step = 4;
    kv_cont_summary s1, s2;
    kv_cont_result r1[2], r2;
    kv_cache *both[2] = {own, f16};
    ck_assert_kv_ok(kv_eval_continuation(g_m, both, 2, text, NT, &o, &s1, r1));
    o.prefill_cache = src;
    ck_assert_kv_ok(kv_eval_continuation(g_m, &copy, 1, text, NT, &o, &s2, &r2));
    ck_assert_msg(r1[0].nll_mean == r2.nll_mean && r1[0].kl_mean == r2.kl_mean, "own %.17g %.17g, copied %.17g %.17g",
                  r1[0].nll_mean, r1[0].kl_mean, r2.nll_mean, r2.kl_mean);
    ck_assert(s1.nll_mean_ref == s2.nll_mean_ref);
    ck_assert_msg(r1[0].kl_mean > 1e-4, "pruning 3/4 of the prompt changed nothing (KL %g)", r1[0].kl_mean);
    /* f16 keys and values, nothing dropped: f16 rounding only, far below the pruned cache's KL */
    ck_assert_msg(r1[1].kl_mean < 0.01 * r1[0].kl_mean, "f16 KL %g, pruned %g", r1[1].kl_mean, r1[0].kl_mean);
    /* what the pruning cache holds: each KV head at most its budget's tokens plus sinks and window */
    kv_rt *rt = kv_cache_rt_runtime(copy);
    for (int l = 0; l < a->n_layers; l++)
        for (int h = 0; h < a->n_kv_heads; h++) ck_assert_int_lt(kv_rt_held(rt, l, 0, h), N + M);
    kv_cache_free(own), kv_cache_free(copy), kv_cache_free(src), kv_cache_free(f16);
    kv_plan_free(p), kv_plan_free(p0);
    free(text);
}
END_TEST

int main(void) {
    char path[1024];
    snprintf(path, sizeof path, "%s/stories260K/stories260K.bin", kv_test_data_dir() ? kv_test_data_dir() : ".");
    FILE *fp = kv_test_data_dir() ? fopen(path, "rb") : NULL;
    if (!fp) {
        printf("stories260K not found (KVCAL_DATA_DIR): skipped\n");
        return 77;
    }
    fclose(fp);
    Suite *s = suite_create("eval_long");
    TCase *tc = tcase_create("stories260K");
    tcase_set_timeout(tc, 120);
    tcase_add_checked_fixture(tc, open_model, close_model);
    tcase_add_test(tc, test_passkey_prompt);
    tcase_add_test(tc, test_passkey_answer);
    tcase_add_test(tc, test_continuation_exact);
    tcase_add_test(tc, test_continuation_pruned_copy);
    suite_add_tcase(s, tc);
    return kv_test_run(s);
}
