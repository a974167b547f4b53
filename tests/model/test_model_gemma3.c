/* Gemma 3 270M (GGUF Q4_K_M, scripts/fetch-model.sh --model gemma3-270m) against llama.cpp on the same file
 * (llama-cpp-python, CPU, default settings; gen_llamacpp_ref.py --name gemma3), the way SmolLM2 is checked
 * (test_model_smollm.c):
 *   - logits of 4 chunks x 512 tokens of wiki.test.raw (each from an empty cache): top-1 agreement and the
 *     error at llama.cpp's top-8 tokens and over 2 full rows, relative to the row's largest |logit|;
 *   - the llama.cpp-protocol perplexity of the first 16 chunks of 512 tokens within 0.5% of llama.cpp's (the
 *     issue's criterion); a chunk of 512 tokens never reaches past the local layers' window of 512, so also
 *     chunks of 1024 tokens, whose scored second halves (positions 512..1022) are exactly the positions where
 *     the window masks keys, against the exact model (test_ppl_window_vs_exact says why not llama.cpp);
 *   - greedy decoding of six prompts: our tokenizer gives llama.cpp's ids, 64 greedy tokens are the exact
 *     model's, and llama.cpp's too up to near-ties its own noise swaps (test_greedy);
 *   - the exact reference: the GGUF dequantized by gguf-py run by transformers in float64, 768 positions;
 *   - our tokenizer on the whole of wiki.test.raw gives llama.cpp's ids (count and SHA-256), when the data is
 *     there.
 * The golden token ids of the logit and perplexity checks come from llama.cpp's tokenizer, so those do not
 * depend on ours. Under the sanitizers (KV_TEST_SANITIZE) a subset runs: the architecture, the native blocks, one
 * pass of the exact comparison and one greedy prompt (the llama.cpp logit and perplexity checks and the whole
 * file's tokenization are left to the normal build).
 *
 * Why we differ from llama.cpp at all: it multiplies the Q4_K / Q5_0 / Q6_K / Q8_0 weights with activations
 * quantized to 8 bits (Q8_K / Q8_0 blocks), keeps K/V in f16 and evaluates GELU from an f16 table
 * (ggml/src/ggml-cpu/vec.h:987-1000); we dequantize the weights exactly and compute in f32. Each bound below
 * says what it was measured at (the test prints the numbers); a real error (a wrong RoPE base, a missing norm, a
 * shifted window) moves logits by tens of percent (test_model_hft.c measures it).
 * Time: 394 s on a loaded 2-core machine (load ~7), 194 s of it the 16-chunk perplexity. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kv_model.h"
#include "kv_test.h"

#define CTX 512
#define N_LOGIT_CHUNKS 4
#define TOPK 8
#define REC_BYTES (TOPK * 8 + 8)
/* The bounds against llama.cpp are test_model_smollm.c's (the issue asks for the same tolerance). Measured here
 * (printed by the test): top-1 agreement 0.9468 over 2048 positions (109 disagreements; 0.94 allows 13 more);
 * relative error at llama.cpp's top-8 mean 0.0107, max 0.1426 (absolute mean 0.254, max 3.98 logits); over 2 full
 * rows mean 0.0086, max 0.039. The margins are smaller than SmolLM2's (2x there): llama.cpp's noise is larger on
 * Gemma (18 layers, Q4_K/Q5_0/Q6_K/Q8_0 weights times 8-bit activations), while ours is f32 rounding (1e-6 of
 * the largest logit against the exact reference, test_logits_exact), which cannot move these numbers by more
 * than a flipped near-tie or two across BLAS builds. */
#define TOP1_MIN 0.94
#define REL_MEAN_MAX 0.015
#define REL_MAX 0.15

static char *golden_path(const char *name) {
    static char path[1024];
    const char *src = getenv("KVCAL_TEST_SRC");
    snprintf(path, sizeof path, "%s/model/golden/%s", src ? src : "tests", name);
    return path;
}

static void *read_file(const char *name, size_t want) {
    char *buf = NULL;
    size_t size = 0;
    ck_assert_kv_ok(kv_file_read_all(&buf, &size, golden_path(name)));
    ck_assert_msg(want == 0 || size == want, "%s: %zu bytes, expected %zu", name, size, want);
    return buf;
}

/* The value of "key value" in a golden text file (a copy, caller frees); NULL when absent. */
static char *meta_str(const char *file, const char *key) {
    char *txt = read_file(file, 0), *v = NULL;
    const size_t n = strlen(key);
    for (char *line = strtok(txt, "\n"); line; line = strtok(NULL, "\n"))
        if (strncmp(line, key, n) == 0 && line[n] == ' ') {
            v = malloc(strlen(line + n + 1) + 1);
            strcpy(v, line + n + 1);
        }
    free(txt);
    return v;
}

static double meta(const char *key) {
    char *v = meta_str("gemma3_llamacpp.txt", key);
    const double x = v ? strtod(v, NULL) : NAN;
    free(v);
    return x;
}

/* Comma-separated ids into *out (malloc'd); the count. */
static int parse_ids(const char *s, int32_t **out) {
    int n = 1;
    for (const char *p = s; *p; p++) n += *p == ',';
    *out = malloc((size_t)n * sizeof(int32_t));
    int k = 0;
    for (const char *p = s; *p && k < n;) {
        char *end;
        (*out)[k++] = (int32_t)strtol(p, &end, 10);
        p = *end == ',' ? end + 1 : end;
    }
    return k;
}

static kv_model *g_model;
static int32_t *g_tokens; /* 16 * 512 ids */

static void setup(void) {
    ck_assert_kv_ok(kv_model_open(&g_model, getenv("KVCAL_GEMMA3_MODEL"), NULL));
    const char *raw = read_file("gemma3_llamacpp_tokens.i32", 16 * CTX * 4);
    g_tokens = malloc(16 * CTX * sizeof(int32_t));
    for (int i = 0; i < 16 * CTX; i++) g_tokens[i] = (int32_t)kv_load_u32le((const uint8_t *)raw + 4 * i);
    free((void *)raw);
}

static void teardown(void) {
    kv_model_free(g_model);
    free(g_tokens);
}

START_TEST(test_arch) {
    const kv_arch *a = kv_model_arch(g_model);
    ck_assert_str_eq(a->arch, "gemma3");
    ck_assert_int_eq(a->n_layers, 18);
    ck_assert_int_eq(a->n_kv_heads, 1);
    ck_assert_int_eq(a->head_dim, 256);
    ck_assert_int_eq(a->sliding_window, 512);
    for (int l = 0; l < 18; l++) {
        const int global = l % 6 == 5; /* layers 5, 11, 17 */
        ck_assert_int_eq(kv_arch_layer_window(a, l), global ? 0 : 512);
        ck_assert_float_eq(kv_arch_layer_rope_theta(a, l), global ? 1e6f : 1e4f);
    }
    ck_assert_float_eq_tol(kv_arch_attn_scale(a), 1.0 / 16.0, 1e-9);
    ck_assert_float_eq_tol(a->embed_scale, sqrt(640.0), 1e-5);
    ck_assert_float_eq(a->final_logit_softcap, 0.0f);
    ck_assert_int_eq(a->qk_norm && a->post_norms && a->ffn_act == KV_FFN_GELU_TANH, 1);
}
END_TEST

/* The file's blocks kept and decoded on the fly (KV_WEIGHTS_NATIVE: Q4_K, Q5_0, Q6_K, Q8_0 here) give the f32
 * model's logits up to summation order: 64 tokens, measured max |diff| printed, bound 1e-5 of the largest
 * logit (f32 rounding of 18 layers' sums in another order). */
START_TEST(test_native_weights) {
    kv_model *nat = NULL;
    kv_model_options o = {0, KV_WEIGHTS_NATIVE, KV_MODEL_DEVICE_CPU};
    ck_assert_kv_ok(kv_model_open(&nat, getenv("KVCAL_GEMMA3_MODEL"), &o));
    ck_assert_ptr_nonnull(kv_model_layer(nat, 0)->wq.q);
    ck_assert_int_eq(kv_model_layer(nat, 0)->w_down.q_dtype, KV_DTYPE_Q6_K);
    const int V = kv_model_arch(g_model)->vocab_size, T = 64;
    float *a = malloc((size_t)T * V * sizeof(float)), *b = malloc((size_t)T * V * sizeof(float));
    kv_forward f;
    memset(&f, 0, sizeof f);
    f.tokens = g_tokens;
    f.n_seqs = 1;
    f.n_tokens = T;
    f.logits = a;
    ck_assert_kv_ok(kv_model_forward(g_model, &f));
    f.logits = b;
    ck_assert_kv_ok(kv_model_forward(nat, &f));
    double md = 0, mr = 0;
    for (size_t i = 0; i < (size_t)T * V; i++) {
        md = fmax(md, fabs((double)a[i] - b[i]));
        mr = fmax(mr, fabs((double)a[i]));
    }
    printf("Gemma 3 270M native blocks vs f32 weights, %d positions: max |diff| %.3g (max |logit| %.3g)\n", T, md, mr);
    fflush(stdout);
    ck_assert_msg(md <= 1e-5 * mr, "native weights differ by %g", md);
    free(a);
    free(b);
    kv_model_free(nat);
}
END_TEST

typedef struct cmp_stats {
    size_t n_pos, agree, n_top;
    double top_max, top_sum, abs_max, abs_sum;
    double lse_max; /* |log-sum-exp ours - ref| / max |logit| */
} cmp_stats;

static void compare_row(cmp_stats *st, const float *row, int V, const uint8_t *rec) {
    int32_t best;
    ck_assert_kv_ok(kv_sample_token(&best, row, V, 0.0f, 1.0f, NULL));
    st->n_pos++;
    st->agree += best == (int32_t)kv_load_u32le(rec);
    const double amax = kv_load_f32le(rec + TOPK * 8), lse = kv_load_f32le(rec + TOPK * 8 + 4);
    for (int k = 0; k < TOPK; k++) {
        const int32_t id = (int32_t)kv_load_u32le(rec + 4 * k);
        const double e = fabs(row[id] - kv_load_f32le(rec + 4 * TOPK + 4 * k));
        st->abs_max = fmax(st->abs_max, e);
        st->abs_sum += e;
        st->top_max = fmax(st->top_max, e / amax);
        st->top_sum += e / amax;
        st->n_top++;
    }
    float mx = row[0];
    for (int j = 1; j < V; j++) mx = row[j] > mx ? row[j] : mx;
    double se = 0;
    for (int j = 0; j < V; j++) se += exp((double)row[j] - mx);
    st->lse_max = fmax(st->lse_max, fabs(mx + log(se) - lse) / amax);
}

/* Against the exact reference: the GGUF dequantized by gguf-py and run by transformers' Gemma3ForCausalLM in
 * float64 (gen_gemma3_exact_ref.py), 768 tokens, so the positions from 512 on attend through the local layers'
 * window. Two ways through the model, both through the plain cache: one prefill of 752 tokens then 16 decoded
 * one by one (the few-rows kernels); steps of 300, 300 and 168 tokens (the window's edge inside and across
 * steps; not under the sanitizers, where the decoding pass alone covers the window in under a minute). Our f32
 * forward differs from the reference by f32 rounding only: measured max |diff| at the top-8 and of the
 * log-sum-exp printed below (1.1e-6 and 8.8e-7 of the largest |logit|); 2e-5 bounds it with margin, while a window
 * one token off, the wrong RoPE base on the local layers or norms without Gemma's +1 move logits by tens of
 * percent (test_model_hft.c). Every argmax agrees. */
#define EXACT_SEQ 768
START_TEST(test_logits_exact) {
    const int V = kv_model_arch(g_model)->vocab_size;
    const uint8_t *top = read_file("gemma3_exact_top.bin", (size_t)EXACT_SEQ * REC_BYTES);
    float *lg = malloc((size_t)EXACT_SEQ * V * sizeof(float));
    static const int steps[2][20] = {{752, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1}, {300, 300, 168}};
#ifdef KV_TEST_SANITIZE
    const int n_pass = 1;
#else
    const int n_pass = 2;
#endif
    for (int pass = 0; pass < n_pass; pass++) {
        kv_cache *c = NULL;
        ck_assert_kv_ok(kv_cache_plain_create(&c, kv_model_arch(g_model), 1, EXACT_SEQ));
        for (int k = 0, t0 = 0; t0 < EXACT_SEQ; t0 += steps[pass][k++]) {
            kv_forward f;
            memset(&f, 0, sizeof f);
            f.tokens = g_tokens + t0;
            f.n_seqs = 1;
            f.n_tokens = steps[pass][k];
            f.cache = c;
            f.logits = lg + (size_t)t0 * V;
            ck_assert_kv_ok(kv_model_forward(g_model, &f));
        }
        kv_cache_free(c);
        cmp_stats st;
        memset(&st, 0, sizeof st);
        for (int t = 0; t < EXACT_SEQ; t++) compare_row(&st, lg + (size_t)t * V, V, top + (size_t)t * REC_BYTES);
        printf("Gemma 3 270M (%s) vs exact float64 transformers over %zu positions: top-1 agreement %.4f; at the "
               "reference's top-%d: max |diff| %.3g (relative to max |logit| %.3g), mean %.3g; log-sum-exp relative "
               "%.3g\n",
               pass == 0 ? "prefill of 752, 16 decoded" : "steps of 300", st.n_pos,
               (double)st.agree / st.n_pos, TOPK, st.abs_max, st.top_max, st.abs_sum / st.n_top, st.lse_max);
        fflush(stdout);
        ck_assert_uint_eq(st.agree, st.n_pos);
        ck_assert_msg(st.top_max <= 2e-5, "relative error %.3g at the top-%d", st.top_max, TOPK);
        ck_assert_msg(st.lse_max <= 2e-5, "relative log-sum-exp error %.3g", st.lse_max);
    }
    free(lg);
    free((void *)top);
}
END_TEST

START_TEST(test_logits_vs_llamacpp) {
    const int V = kv_model_arch(g_model)->vocab_size;
    const uint8_t *top = read_file("gemma3_llamacpp_top.bin", (size_t)N_LOGIT_CHUNKS * CTX * REC_BYTES);
    const uint8_t *rows = read_file("gemma3_llamacpp_rows.f16", 2 * (size_t)V * 2);
    const int row_pos[2] = {0, CTX - 1};
    float *lg = malloc((size_t)CTX * V * sizeof(float));
    cmp_stats st;
    memset(&st, 0, sizeof st);
    double row_max = 0, row_sum = 0;
    size_t row_n = 0;
    for (int c = 0; c < N_LOGIT_CHUNKS; c++) {
        kv_forward f;
        memset(&f, 0, sizeof f);
        f.tokens = g_tokens + c * CTX;
        f.n_seqs = 1;
        f.n_tokens = CTX;
        f.logits = lg;
        ck_assert_kv_ok(kv_model_forward(g_model, &f));
        for (int t = 0; t < CTX; t++) compare_row(&st, lg + (size_t)t * V, V, top + ((size_t)c * CTX + t) * REC_BYTES);
        for (int r = 0; c == 0 && r < 2; r++) {
            const float *row = lg + (size_t)row_pos[r] * V;
            const uint8_t *ref = rows + (size_t)r * V * 2;
            double rs = 0;
            for (int j = 0; j < V; j++) rs = fmax(rs, fabs(kv_f16_to_f32(kv_load_u16le(ref + 2 * j))));
            for (int j = 0; j < V; j++) {
                const double e = fabs(row[j] - kv_f16_to_f32(kv_load_u16le(ref + 2 * j))) / rs;
                row_max = fmax(row_max, e);
                row_sum += e;
                row_n++;
            }
        }
    }
    const double agreement = (double)st.agree / (double)st.n_pos;
    printf("Gemma 3 270M vs llama.cpp over %zu positions: top-1 agreement %.4f; at llama.cpp's top-%d: relative "
           "error (to the row's max |logit|) max %.4f mean %.5f, absolute max %.3f mean %.4f; %zu values of 2 full "
           "rows: relative max %.4f mean %.5f\n",
           st.n_pos, agreement, TOPK, st.top_max, st.top_sum / st.n_top, st.abs_max, st.abs_sum / st.n_top, row_n,
           row_max, row_sum / row_n);
    fflush(stdout);
    ck_assert_msg(agreement >= TOP1_MIN, "top-1 agreement %.4f", agreement);
    ck_assert_msg(st.top_sum / st.n_top <= REL_MEAN_MAX, "mean relative error %.5f", st.top_sum / st.n_top);
    ck_assert_msg(st.top_max <= REL_MAX, "max relative error %.4f", st.top_max);
    ck_assert_msg(row_sum / row_n <= REL_MEAN_MAX, "mean relative error over full rows %.5f", row_sum / row_n);
    ck_assert_msg(row_max <= REL_MAX, "max relative error over full rows %.4f", row_max);
    free(lg);
    free((void *)top);
    free((void *)rows);
}
END_TEST

/* The criterion: llama.cpp's perplexity protocol over the first 16 chunks of 512 tokens, within 0.5%. */
START_TEST(test_ppl_vs_llamacpp) {
    const double ref = meta("sub_ppl"), chunks = meta("sub_chunks"), add_bos = meta("add_bos");
    ck_assert_msg(isfinite(ref) && chunks == 16, "golden perplexity missing from gemma3_llamacpp.txt");
    kv_ppl_options o = {KV_PPL_LLAMACPP, CTX, 2, add_bos > 0 ? kv_model_arch(g_model)->bos_id : -1, 16, NULL};
    kv_ppl_result r;
    ck_assert_kv_ok(kv_eval_perplexity(&r, g_model, g_tokens, 16 * CTX, &o));
    ck_assert_uint_eq(r.tokens_scored, (size_t)meta("sub_scored"));
    const double rel = fabs(r.ppl - ref) / ref;
    printf("Gemma 3 270M llama.cpp-protocol perplexity, 16 chunks of %d: ours %.4f, llama.cpp %.4f (%.3f%%), %.0f "
           "tok/s\n", CTX, r.ppl, ref, 100 * rel, r.tokens_per_second);
    fflush(stdout);
    ck_assert_msg(rel <= 0.005, "perplexity %.4f vs llama.cpp %.4f", r.ppl, ref);
}
END_TEST

/* The window in the perplexity protocol: chunks of 1024 tokens, positions 512..1022 scored, i.e. exactly the
 * positions where the local layers' window masks keys. Against the exact model (transformers on the dequantized
 * GGUF, in float32: gen_gemma3_exact_ref.py --window-ppl) over the first 2 chunks, within 1e-4 relative: both sides
 * round in f32 (measured: printed below), while a window one token off moves it by far more (test_model_hft.c).
 * Not asserted against llama.cpp: over all 8 chunks we measured ours 19.4677, transformers 19.4677 (19.467743),
 * llama.cpp 19.5822 (gen_llamacpp_ref.py, n_ctx 1024): llama.cpp is 0.58% above both independent f32 forwards
 * here, against 0.38% on the 512-token chunks (test_ppl_vs_llamacpp), its 8-bit activation and f16 cache noise
 * growing with the context, not a disagreement about the window. 2 chunks, not 8, to keep the test's time. */
START_TEST(test_ppl_window_vs_exact) {
    char *v = meta_str("gemma3_exact_window.txt", "win2_ppl"), *n = meta_str("gemma3_exact_window.txt", "win2_scored");
    ck_assert_msg(v && n, "win2_ppl / win2_scored missing from gemma3_exact_window.txt");
    const double ref = strtod(v, NULL), add_bos = meta("add_bos");
    kv_ppl_options o = {KV_PPL_LLAMACPP, 1024, 1, add_bos > 0 ? kv_model_arch(g_model)->bos_id : -1, 2, NULL};
    kv_ppl_result r;
    ck_assert_kv_ok(kv_eval_perplexity(&r, g_model, g_tokens, 16 * CTX, &o));
    ck_assert_uint_eq(r.tokens_scored, (size_t)strtol(n, NULL, 10));
    const double rel = fabs(r.ppl - ref) / ref;
    printf("Gemma 3 270M llama.cpp-protocol perplexity, 2 chunks of 1024 (scored positions beyond the window): "
           "ours %.6f, exact model (transformers, f32) %.6f (relative %.2g)\n", r.ppl, ref, rel);
    fflush(stdout);
    ck_assert_msg(rel <= 1e-4, "perplexity %.6f vs the exact model's %.6f", r.ppl, ref);
    free(v);
    free(n);
}
END_TEST

/* Greedy text, for each prompt of gemma3_llamacpp_greedy.txt (six, written before any result was seen):
 *   - our tokenizer gives llama.cpp's prompt ids;
 *   - 64 greedy tokens decoded through the plain cache are the exact model's (float64 transformers,
 *     gen_gemma3_exact_ref.py), every one;
 *   - against llama.cpp: identical for 64 tokens, or diverging only at a step where the exact model's two best
 *     logits are within NEAR_TIE of each other, which llama.cpp's noise (its logits are 0.25 from the exact
 *     ones on average at the top-8, up to 4) can swap. Measured: three prompts identical for 64 tokens
 *     (Roman Empire, fibonacci, mitochondria); the other three diverge at steps 35, 1 and 9, where the exact
 *     model's best two logits are 0.077, 0.041 and 0.143 apart (and llama.cpp's own margins there are smaller
 *     still); at least IDENTICAL_MIN prompts must stay identical.
 * Under the sanitizers (a decoding step there runs the few-rows kernels unoptimized and instrumented) only the
 * first prompt is decoded. */
#define NEAR_TIE 0.25
#ifdef KV_TEST_SANITIZE
#define GREEDY_PROMPTS_RUN 1
#define IDENTICAL_MIN 1
#else
#define GREEDY_PROMPTS_RUN 6
#define IDENTICAL_MIN 3
#endif
static char *unescape(char *t) {
    char *w = t;
    for (const char *r = t; *r; r++) {
        if (*r == '\\' && (r[1] == 'n' || r[1] == '\\')) {
            *w++ = r[1] == 'n' ? '\n' : '\\';
            r++;
        } else {
            *w++ = *r;
        }
    }
    *w = '\0';
    return t;
}

START_TEST(test_greedy) {
    char *np_s = meta_str("gemma3_llamacpp_greedy.txt", "n_prompts");
    ck_assert_ptr_nonnull(np_s);
    const int n_p = atoi(np_s) < GREEDY_PROMPTS_RUN ? atoi(np_s) : GREEDY_PROMPTS_RUN;
    free(np_s);
    ck_assert_int_eq(n_p, GREEDY_PROMPTS_RUN);
    kv_model_file *mf = NULL;
    kv_tokenizer *tok = NULL;
    ck_assert_kv_ok(kv_model_file_open(&mf, getenv("KVCAL_GEMMA3_MODEL")));
    ck_assert_kv_ok(kv_tokenizer_load(&tok, mf, NULL));
    kv_model_file_close(mf);
    int identical = 0;
    for (int p = 0; p < n_p; p++) {
        char key[64];
        snprintf(key, sizeof key, "prompt_%d", p);
        char *prompt = unescape(meta_str("gemma3_llamacpp_greedy.txt", key));
        snprintf(key, sizeof key, "prompt_ids_%d", p);
        char *pids_s = meta_str("gemma3_llamacpp_greedy.txt", key);
        snprintf(key, sizeof key, "generated_ids_%d", p);
        char *lids_s = meta_str("gemma3_llamacpp_greedy.txt", key);
        snprintf(key, sizeof key, "exact_generated_ids_%d", p);
        char *eids_s = meta_str("gemma3_exact_greedy.txt", key);
        snprintf(key, sizeof key, "exact_margins_%d", p);
        char *emar_s = meta_str("gemma3_exact_greedy.txt", key);
        ck_assert_msg(prompt && pids_s && lids_s && eids_s && emar_s, "greedy golden of prompt %d incomplete", p);
        int32_t *pids = NULL, *lids = NULL, *eids = NULL;
        const int np = parse_ids(pids_s, &pids), nl = parse_ids(lids_s, &lids), ne = parse_ids(eids_s, &eids);
        /* the tokenizer */
        int32_t *ids = NULL;
        size_t n = 0;
        ck_assert_kv_ok(kv_tokenizer_encode(&ids, &n, tok, prompt, strlen(prompt), KV_TOK_ADD_BOS));
        ck_assert_int_eq((int)n, np);
        for (int i = 0; i < np; i++)
            ck_assert_msg(ids[i] == pids[i], "prompt %d token %d: ours %d, llama.cpp %d", p, i, ids[i], pids[i]);
        /* greedy decoding through the plain cache */
        kv_cache *c = NULL;
        ck_assert_kv_ok(kv_cache_plain_create(&c, kv_model_arch(g_model), 1, np + 64));
        int32_t out[64];
        int n_out = 0;
        kv_gen_options g;
        memset(&g, 0, sizeof g);
        g.n_new = 64;
        g.top_p = 1.0f;
        ck_assert_kv_ok(kv_generate(out, &n_out, NULL, g_model, c, pids, np, &g, NULL, NULL));
        kv_cache_free(c);
        ck_assert_int_eq(n_out, ne);
        for (int i = 0; i < ne; i++)
            ck_assert_msg(out[i] == eids[i], "prompt %d generated token %d: ours %d, exact %d", p, i, out[i], eids[i]);
        int k = 0;
        while (k < n_out && k < nl && out[k] == lids[k]) k++;
        double margin = INFINITY;
        if (k < n_out) { /* the exact model's margin at the first step llama.cpp decodes otherwise */
            const char *m = emar_s;
            for (int i = 0; i < k && m; i++) m = strchr(m, ',') ? strchr(m, ',') + 1 : NULL;
            ck_assert_ptr_nonnull(m);
            margin = strtod(m, NULL);
        }
        char *text = NULL;
        size_t len = 0;
        ck_assert_kv_ok(kv_tokenizer_decode(&text, &len, tok, out, (size_t)n_out, 0));
        printf("Gemma 3 270M greedy, prompt %d: %d tokens equal to the exact model's; llama.cpp's %s%d%s (exact margin "
               "there %.4f): %s\n", p, n_out, k == n_out ? "identical for all " : "identical for the first ", k,
               k == n_out ? "" : " tokens", margin, text);
        fflush(stdout);
        identical += k == n_out && n_out == nl;
        if (k < n_out) ck_assert_msg(margin < NEAR_TIE, "prompt %d: llama.cpp diverges at step %d, where the exact "
                                     "model's margin %.4f is no near-tie", p, k, margin);
        free(text);
        free(ids);
        free(pids);
        free(lids);
        free(eids);
        free(prompt);
        free(pids_s);
        free(lids_s);
        free(eids_s);
        free(emar_s);
    }
    printf("Gemma 3 270M greedy: %d of %d prompts identical to llama.cpp for 64 tokens\n", identical, n_p);
    ck_assert_int_ge(identical, IDENTICAL_MIN);
    kv_tokenizer_free(tok);
}
END_TEST

/* Our tokenizer on the whole of wiki.test.raw: llama.cpp's ids (its tokenize with the vocabulary's BOS). */
START_TEST(test_tokenizer_wikitext) {
    const char *data = getenv("KVCAL_DATA_DIR");
    char path[1024];
    snprintf(path, sizeof path, "%s/wikitext-2-raw/wiki.test.raw", data ? data : "");
    char *text = NULL;
    size_t len = 0;
    if (!data || !*data || kv_file_read_all(&text, &len, path) != KV_OK) {
        kv_error_clear();
        printf("wiki.test.raw not found (KVCAL_DATA_DIR): tokenizer check not run\n");
        return;
    }
    kv_model_file *mf = NULL;
    kv_tokenizer *tok = NULL;
    ck_assert_kv_ok(kv_model_file_open(&mf, getenv("KVCAL_GEMMA3_MODEL")));
    ck_assert_kv_ok(kv_tokenizer_load(&tok, mf, NULL));
    kv_model_file_close(mf);
    int32_t *ids = NULL;
    size_t n = 0;
    ck_assert_kv_ok(kv_tokenizer_encode(&ids, &n, tok, text, len, KV_TOK_ADD_BOS));
    kv_sha256 h;
    kv_sha256_init(&h);
    for (size_t i = 0; i < n; i++) {
        uint8_t b[4];
        kv_store_u32le(b, (uint32_t)ids[i]);
        kv_sha256_update(&h, b, 4);
    }
    uint8_t dg[32];
    char hex[65];
    kv_sha256_final(&h, dg);
    kv_sha256_hex(hex, dg);
    char *want = meta_str("gemma3_llamacpp.txt", "tokens_sha256");
    printf("Gemma 3 tokenizer on wiki.test.raw: %zu tokens (llama.cpp %.0f), sha256 %s (llama.cpp %s)\n", n,
           meta("n_tokens"), hex, want ? want : "?");
    fflush(stdout);
    for (size_t i = 0; i < 16 * CTX && i < n; i++)
        ck_assert_msg(ids[i] == g_tokens[i], "token %zu: ours %d, llama.cpp %d", i, ids[i], g_tokens[i]);
    ck_assert_uint_eq(n, (size_t)meta("n_tokens"));
    ck_assert_ptr_nonnull(want);
    ck_assert_str_eq(hex, want);
    free(want);
    free(ids);
    free(text);
    kv_tokenizer_free(tok);
}
END_TEST

int main(void) {
    const char *path = getenv("KVCAL_GEMMA3_MODEL");
    FILE *fp = path ? fopen(path, "rb") : NULL;
    if (!fp) {
        printf("Gemma 3 270M not found (KVCAL_GEMMA3_MODEL; scripts/fetch-model.sh --model gemma3-270m): skipped\n");
        return 77;
    }
    fclose(fp);
    Suite *s = suite_create("model_gemma3");
    TCase *tc = tcase_create("gemma3_vs_llamacpp");
    tcase_set_timeout(tc, 1800);
    tcase_add_unchecked_fixture(tc, setup, teardown);
    tcase_add_test(tc, test_arch);
    tcase_add_test(tc, test_native_weights);
    tcase_add_loop_test(tc, test_logits_exact, 0, 1);
    tcase_add_test(tc, test_greedy);
#ifndef KV_TEST_SANITIZE
    tcase_add_test(tc, test_tokenizer_wikitext);
    tcase_add_test(tc, test_logits_vs_llamacpp);
    tcase_add_test(tc, test_ppl_vs_llamacpp);
    tcase_add_test(tc, test_ppl_window_vs_exact);
#endif
    suite_add_tcase(s, tc);
    return kv_test_run(s);
}
