/* Qwen3 and Gemma 3 through the HF safetensors path, against Hugging Face transformers itself.
 *
 * Small random-weight checkpoints (config.json + model.safetensors) are written by this test from the
 * counter-based generator of model_test_util.h, loaded through kv_model_open, and their logits compared with
 * golden logits that transformers 5.24.0 computed on the CPU for the same weights
 * (tests/model/gen_hf_transformers_ref.py: Qwen3ForCausalLM, Gemma3ForCausalLM in float64; the golden files
 * hft_qwen3.f32 and hft_gemma3.f32). Qwen3: QK-norm, head_dim != hidden/heads, GQA, no bias. Gemma 3: local,
 * local, global, local layers with a window of 8 tokens over 40-token sequences, per-type RoPE bases and a
 * linear scaling of the global layers only, one KV head, query_pre_attn_scalar != head_dim, the (1 + w)
 * norms, post-norms, GELU-tanh, scaled tied embeddings, final logit softcapping. Each config is written in
 * two styles (the transformers 4 keys: rope_theta, rope_local_base_freq, rope_scaling,
 * sliding_window_pattern; and the config transformers 5 saves: rope_parameters per layer type,
 * layer_types) which must read the same. Every model runs as one batched prefill, token by token through
 * the plain cache, and as a prefill of 13 tokens followed by single tokens (the window's edge inside and
 * outside a step). */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kv_model.h"
#include "kv_test.h"
#include "model_test_util.h"
#include "st_writer.h"

#define N_SEQS 2
#define N_TOKENS 40

typedef struct hft_model {
    const char *name;
    int gemma;
    int hidden, inter, layers, heads, kv_heads, head_dim, vocab, tied;
    const char *config[2]; /* transformers 4 style, transformers 5 style (the JSON after the common part) */
} hft_model;

/* Keep in sync with QWEN3 / GEMMA3 in gen_hf_transformers_ref.py. */
static const hft_model k_models[] = {
    {"qwen3", 0, 64, 96, 2, 4, 2, 32, 89, 0,
     {"\"model_type\": \"qwen3\", \"architectures\": [\"Qwen3ForCausalLM\"], \"hidden_act\": \"silu\", "
      "\"max_position_embeddings\": 256, \"rms_norm_eps\": 1e-06, \"rope_theta\": 1000000.0, "
      "\"tie_word_embeddings\": false, \"attention_bias\": false, \"use_sliding_window\": false, "
      "\"bos_token_id\": 1, \"eos_token_id\": 2, \"torch_dtype\": \"float32\"",
      "\"model_type\": \"qwen3\", \"architectures\": null, \"hidden_act\": \"silu\", \"attention_dropout\": 0.0, "
      "\"layer_types\": [\"full_attention\", \"full_attention\"], \"max_position_embeddings\": 256, "
      "\"max_window_layers\": 28, \"rms_norm_eps\": 1e-06, "
      "\"rope_parameters\": {\"rope_theta\": 1000000.0, \"rope_type\": \"default\"}, \"sliding_window\": null, "
      "\"tie_word_embeddings\": false, \"attention_bias\": false, \"use_sliding_window\": false, "
      "\"bos_token_id\": 1, \"eos_token_id\": 2, \"pad_token_id\": null, \"dtype\": \"float64\", "
      "\"transformers_version\": \"5.24.0\""}},
    {"gemma3", 1, 48, 80, 4, 4, 1, 24, 101, 1,
     {"\"model_type\": \"gemma3_text\", \"architectures\": [\"Gemma3ForCausalLM\"], "
      "\"hidden_activation\": \"gelu_pytorch_tanh\", \"max_position_embeddings\": 512, \"rms_norm_eps\": 1e-06, "
      "\"rope_theta\": 1000000.0, \"rope_local_base_freq\": 10000.0, "
      "\"rope_scaling\": {\"rope_type\": \"linear\", \"factor\": 2.0}, \"sliding_window\": 8, "
      "\"sliding_window_pattern\": 3, \"query_pre_attn_scalar\": 20, \"final_logit_softcapping\": 10.0, "
      "\"attn_logit_softcapping\": null, \"tie_word_embeddings\": true, \"attention_bias\": false, "
      "\"bos_token_id\": 2, \"eos_token_id\": 1, \"pad_token_id\": 0, \"torch_dtype\": \"float32\"",
      "\"model_type\": \"gemma3_text\", \"_sliding_window_pattern\": 3, \"architectures\": null, "
      "\"attention_bias\": false, \"attn_logit_softcapping\": null, \"bos_token_id\": 2, \"eos_token_id\": 1, "
      "\"final_logit_softcapping\": 10.0, \"hidden_activation\": \"gelu_pytorch_tanh\", "
      "\"layer_types\": [\"sliding_attention\", \"sliding_attention\", \"full_attention\", \"sliding_attention\"], "
      "\"max_position_embeddings\": 512, \"pad_token_id\": 0, \"query_pre_attn_scalar\": 20, \"rms_norm_eps\": 1e-06, "
      "\"rope_parameters\": {\"full_attention\": {\"factor\": 2.0, \"rope_theta\": 1000000.0, \"rope_type\": "
      "\"linear\"}, \"sliding_attention\": {\"rope_theta\": 10000.0, \"rope_type\": \"default\"}}, "
      "\"sliding_window\": 8, \"sliding_window_pattern\": 3, \"tie_word_embeddings\": true, "
      "\"use_bidirectional_attention\": false, \"dtype\": \"float64\", \"transformers_version\": \"5.24.0\""}},
};


/* The checkpoint: the tensors gen_hf_transformers_ref.py's weights() makes (Gemma's norms are w around 0,
 * used as 1 + w). */
static void write_checkpoint(const char *dir, const hft_model *m, int style) {
    char path[512];
    snprintf(path, sizeof path, "%s/config.json", dir);
    FILE *fp = fopen(path, "w");
    ck_assert_ptr_nonnull(fp);
    fprintf(fp,
            "{\"hidden_size\": %d, \"intermediate_size\": %d, \"num_hidden_layers\": %d, \"num_attention_heads\": %d,\n"
            " \"num_key_value_heads\": %d, \"head_dim\": %d, \"vocab_size\": %d,\n %s}\n",
            m->hidden, m->inter, m->layers, m->heads, m->kv_heads, m->head_dim, m->vocab, m->config[style]);
    ck_assert_int_eq(fclose(fp), 0);

    st_list *l = calloc(1, sizeof *l);
    ck_assert_ptr_nonnull(l);
    const int d = m->hidden, hd = m->head_dim, qd = m->heads * hd, kvd = m->kv_heads * hd, ff = m->inter;
    const kv_test_weight_kind nk = m->gemma ? KV_TW_BIAS : KV_TW_NORM;
    char name[96];
    add(l, "model.embed_tokens.weight", m->vocab, d, KV_TW_EMB);
    add(l, "model.norm.weight", d, 0, nk);
    if (!m->tied) add(l, "lm_head.weight", m->vocab, d, KV_TW_MATRIX);
    for (int i = 0; i < m->layers; i++) {
#define T(suffix, rows, cols, kind)                                          \
    do {                                                                     \
        snprintf(name, sizeof name, "model.layers.%d.%s", i, suffix);         \
        add(l, name, rows, cols, kind);                                      \
    } while (0)
        T("input_layernorm.weight", d, 0, nk);
        T("post_attention_layernorm.weight", d, 0, nk);
        if (m->gemma) {
            T("pre_feedforward_layernorm.weight", d, 0, nk);
            T("post_feedforward_layernorm.weight", d, 0, nk);
        }
        T("self_attn.q_proj.weight", qd, d, KV_TW_MATRIX);
        T("self_attn.k_proj.weight", kvd, d, KV_TW_MATRIX);
        T("self_attn.v_proj.weight", kvd, d, KV_TW_MATRIX);
        T("self_attn.o_proj.weight", d, qd, KV_TW_MATRIX);
        T("self_attn.q_norm.weight", hd, 0, nk);
        T("self_attn.k_norm.weight", hd, 0, nk);
        T("mlp.gate_proj.weight", ff, d, KV_TW_MATRIX);
        T("mlp.up_proj.weight", ff, d, KV_TW_MATRIX);
        T("mlp.down_proj.weight", d, ff, KV_TW_MATRIX);
#undef T
    }
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    write_safetensors(path, l);
    for (int i = 0; i < l->n; i++) free(l->t[i].data);
    free(l);
}

static float *read_golden(const char *name, size_t n) { return read_golden_f32("hft_", name, n); }

/* Tolerance, relative to the largest |logit|: kvcal runs in f32 (BLAS sums, f32 softmax, RoPE products,
 * GELU's tanhf), the reference in float64 except for transformers' own float32 parts (Gemma3RMSNorm over
 * x.float(), float32 inverse frequencies and cos/sin tables: at position 39 an angle carries ~39 * 6e-8
 * relative error). Over 2-4 layers of width <= 96 that is ~1e-6 of the largest logit (measured: printed
 * below: 3.5e-7 for Qwen3, 4.1e-7 for Gemma 3); 2e-5 leaves a factor of ~50, while every real mistake
 * moves logits by > 3e-2 of their range: measured on the Gemma 3 model by changing one thing at a time in
 * transformers (the same mistake in kvcal would show the same difference), the window one token longer
 * 0.35, the local layers on the global RoPE base 0.21, no linear scaling 0.20, every layer global 0.67,
 * 1/sqrt(head_dim) instead of query_pre_attn_scalar^-1/2 0.038, no softcapping 1.8, QK-norm skipped 0.55,
 * the post-attention norm skipped 0.60, norms as w instead of 1 + w 0.87. */
#define REL_TOL 2e-5

static void check(const char *what, const hft_model *hm, const float *got, const float *golden, size_t n) {
    double md, mr;
    kv_test_maxdiff(got, golden, n, &md, &mr);
    printf("hft %-6s %-28s max |diff| %.3g, max |logit| %.3g (rel %.3g)\n", hm->name, what, md, mr, md / mr);
    fflush(stdout);
    ck_assert_msg(md <= REL_TOL * mr, "%s (%s): logits differ from transformers by %g (max %g)", hm->name, what, md,
                  mr);
}

/* Steps of the given sizes per sequence through a plain cache (both sequences in one batch per step). */
static void run_steps(kv_model *m, const int32_t *toks, const int *steps, int n_steps, float *out) {
    const kv_arch *a = kv_model_arch(m);
    const size_t V = (size_t)a->vocab_size;
    kv_cache *c = NULL;
    ck_assert_kv_ok(kv_cache_plain_create(&c, a, N_SEQS, 0));
    float *lg = malloc((size_t)N_SEQS * N_TOKENS * V * sizeof(float));
    int32_t tk[N_SEQS * N_TOKENS];
    int t0 = 0;
    for (int s = 0; s < n_steps; s++) {
        const int n = steps[s];
        for (int b = 0; b < N_SEQS; b++) memcpy(tk + b * n, toks + b * N_TOKENS + t0, (size_t)n * sizeof(int32_t));
        kv_forward f;
        memset(&f, 0, sizeof f);
        f.tokens = tk;
        f.n_seqs = N_SEQS;
        f.n_tokens = n;
        f.cache = c;
        f.logits = lg;
        ck_assert_kv_ok(kv_model_forward(m, &f));
        for (int b = 0; b < N_SEQS; b++)
            memcpy(out + ((size_t)b * N_TOKENS + t0) * V, lg + (size_t)b * n * V, (size_t)n * V * sizeof(float));
        t0 += n;
    }
    ck_assert_int_eq(t0, N_TOKENS);
    free(lg);
    kv_cache_free(c);
}

START_TEST(test_hft_golden) {
    const hft_model *hm = &k_models[_i / 2];
    const int style = _i % 2;
    char dir[256];
    kv_test_tmpdir(dir, sizeof dir);
    ck_assert_ptr_nonnull(mkdtemp(dir));
    write_checkpoint(dir, hm, style);
    kv_model *m = NULL;
    ck_assert_kv_ok(kv_model_open(&m, dir, NULL));
    const kv_arch *a = kv_model_arch(m);
    ck_assert_str_eq(a->arch, hm->name);
    ck_assert_int_eq(a->rope_layout, KV_ROPE_HALF);
    ck_assert_int_eq(a->head_dim, hm->head_dim);
    ck_assert_int_eq(a->qkv_bias, 0);
    ck_assert_int_eq(a->qk_norm, 1);
    ck_assert_int_eq(a->tied_embeddings, hm->tied);
    ck_assert_int_eq(a->n_kv_heads, hm->kv_heads);
    if (hm->gemma) {
        ck_assert_int_eq(a->post_norms, 1);
        ck_assert_int_eq(a->ffn_act, KV_FFN_GELU_TANH);
        ck_assert_int_eq(a->sliding_window, 8);
        const int local[4] = {1, 1, 0, 1};
        for (int l = 0; l < 4; l++) {
            ck_assert_int_eq(kv_arch_layer_is_local(a, l), local[l]);
            ck_assert_int_eq(kv_arch_layer_window(a, l), local[l] ? 8 : 0);
            ck_assert_float_eq(kv_arch_layer_rope_theta(a, l), local[l] ? 10000.0f : 1000000.0f);
        }
        ck_assert_int_eq(a->rope_scaling, KV_ROPE_SCALING_LINEAR);
        ck_assert_float_eq_tol(kv_arch_attn_scale(a), 1.0 / sqrt(20.0), 1e-7);
        ck_assert_float_eq(a->final_logit_softcap, 10.0f);
        /* HF Gemma norms read as 1 + w */
        const kv_layer_weights *lw = kv_model_layer(m, 0);
        float w0;
        kv_test_fill(&w0, 1, "model.layers.0.input_layernorm.weight", KV_TW_BIAS, 0, KV_TEST_MODEL_SEED);
        ck_assert_float_eq_tol(lw->attn_norm[0], 1.0f + w0, 1e-7);
    } else {
        ck_assert_int_eq(a->post_norms, 0);
        ck_assert_int_eq(a->sliding_window, 0);
        ck_assert_int_eq(a->ffn_act, KV_FFN_SILU);
    }

    const size_t rows = (size_t)N_SEQS * N_TOKENS, V = (size_t)hm->vocab;
    int32_t toks[N_SEQS * N_TOKENS];
    kv_test_tokens(toks, rows, hm->vocab);
    float *golden = read_golden(hm->name, rows * V);
    float *logits = malloc(rows * V * sizeof(float));

    /* batched prefill without a cache */
    kv_forward f;
    memset(&f, 0, sizeof f);
    f.tokens = toks;
    f.n_seqs = N_SEQS;
    f.n_tokens = N_TOKENS;
    f.logits = logits;
    ck_assert_kv_ok(kv_model_forward(m, &f));
    check(style ? "prefill (v5 config)" : "prefill (v4 config)", hm, logits, golden, rows * V);

    /* token by token through the plain cache; then 13 tokens (beyond the window) and single tokens */
    int steps[N_TOKENS];
    for (int t = 0; t < N_TOKENS; t++) steps[t] = 1;
    run_steps(m, toks, steps, N_TOKENS, logits);
    check("decode", hm, logits, golden, rows * V);
    int mixed[N_TOKENS], n_mixed = 0, left = N_TOKENS;
    mixed[n_mixed++] = 13;
    left -= 13;
    mixed[n_mixed++] = 5;
    left -= 5;
    while (left-- > 0) mixed[n_mixed++] = 1;
    run_steps(m, toks, mixed, n_mixed, logits);
    check("prefill 13 + 5 + decode", hm, logits, golden, rows * V);

    free(logits);
    free(golden);
    kv_model_free(m);
    remove_checkpoint_dir(dir);
}
END_TEST

/* Steps of the given sizes (sequence 0 alone) through a cache, the logits of every position into out. */
static kv_status run_cache_steps(kv_model *m, kv_cache *c, const int32_t *toks, const int *steps, int n_steps,
                                 float *out, int *done) {
    const size_t V = (size_t)kv_model_arch(m)->vocab_size;
    float *lg = malloc((size_t)N_TOKENS * V * sizeof(float));
    kv_status st = KV_OK;
    int t0 = 0;
    for (int s = 0; s < n_steps && st == KV_OK; s++) {
        kv_forward f;
        memset(&f, 0, sizeof f);
        f.tokens = toks + t0;
        f.n_seqs = 1;
        f.n_tokens = steps[s];
        f.cache = c;
        f.logits = lg;
        if ((st = kv_model_forward(m, &f)) == KV_OK) {
            memcpy(out + (size_t)t0 * V, lg, (size_t)steps[s] * V * sizeof(float));
            t0 += steps[s];
        }
    }
    *done = t0;
    free(lg);
    return st;
}

/* Through the runtime's f16 cache (kv_cache_rt_create without a plan, which attends itself): every model decodes
 * all 40 tokens within the f16 rounding of K and V (2^-11 relative per value; measured below 2e-4 of the largest
 * logit, bound 2e-3), token by token and as steps of 13, 5 and single tokens (the tiled and the direct attention).
 * Gemma 3's local layers have a window of 8: the f16 plan carries the model's windows (plan 1.5), so the runtime
 * applies them itself (RUNTIME.md §11); a plan without windows (format 1.4) still runs positions 0..7 and the step
 * at position 8 is refused, not attended wrongly; a plan whose windows are not the model's is refused at creation;
 * a cache with prompt statistics (which do not take windows yet) runs its own plan without them. Keys stored before
 * RoPE take the local layers' own base with a plan that has windows, and are refused without. */
START_TEST(test_hft_runtime_cache) {
    const hft_model *hm = &k_models[_i];
    char dir[256];
    kv_test_tmpdir(dir, sizeof dir);
    ck_assert_ptr_nonnull(mkdtemp(dir));
    write_checkpoint(dir, hm, 0);
    kv_model *m = NULL;
    ck_assert_kv_ok(kv_model_open(&m, dir, NULL));
    const kv_arch *a = kv_model_arch(m);
    const size_t V = (size_t)hm->vocab;
    int32_t toks[N_SEQS * N_TOKENS];
    kv_test_tokens(toks, (size_t)N_SEQS * N_TOKENS, hm->vocab);
    float *golden = read_golden(hm->name, (size_t)N_SEQS * N_TOKENS * V);
    float *lg = malloc((size_t)N_TOKENS * V * sizeof(float));
    int ones[N_TOKENS], mixed[N_TOKENS], n_mixed = 0;
    for (int t = 0; t < N_TOKENS; t++) ones[t] = 1;
    mixed[n_mixed++] = 13;
    mixed[n_mixed++] = 5;
    for (int t = 18; t < N_TOKENS; t++) mixed[n_mixed++] = 1;
    const int *const runs[2] = {ones, mixed};
    const int n_runs[2] = {N_TOKENS, n_mixed};
    for (int r = 0; r < 2; r++) {
        kv_cache *c = NULL;
        ck_assert_kv_ok(kv_cache_rt_create(&c, NULL, m, 1, 0, 1, 0));
        ck_assert_int_eq(kv_cache_applies_windows(c), hm->gemma);
        int done = 0;
        ck_assert_kv_ok(run_cache_steps(m, c, toks, runs[r], n_runs[r], lg, &done));
        double md, mr;
        kv_test_maxdiff(lg, golden, (size_t)N_TOKENS * V, &md, &mr);
        printf("hft %-6s runtime f16 cache (%s), %d positions: max |diff| %.3g (rel %.3g)\n", hm->name,
               r ? "13 + 5 + decode" : "decode", N_TOKENS, md, md / mr);
        fflush(stdout);
        ck_assert_msg(md <= 2e-3 * mr, "%s: runtime f16 cache logits differ by %g", hm->name, md);
        kv_cache_free(c);
    }
    if (hm->gemma) {
        kv_plan *p = NULL;
        kv_plan_fingerprint fp;
        memset(&fp, 0, sizeof fp);
        snprintf(fp.arch, sizeof fp.arch, "%s", a->arch);
        fp.n_layers = a->n_layers, fp.d_model = a->d_model, fp.n_heads = a->n_heads, fp.n_kv_heads = a->n_kv_heads;
        fp.head_dim = a->head_dim, fp.vocab_size = a->vocab_size, fp.rope_theta = a->rope_theta;
        ck_assert_kv_ok(kv_plan_create(&p, &fp)); /* every stream f16, as the cache's own plan */
        p->global.sinks = 0;
        for (int l = 0; l < a->n_layers; l++) p->layers[l].window = kv_arch_layer_window(a, l);
        kv_cache *c = NULL;
        p->layers[0].window = 9; /* not the model's */
        ck_assert_int_eq(kv_cache_rt_create(&c, p, m, 1, 0, 1, 0), KV_EMISMATCH);
        ck_assert_ptr_nonnull(strstr(kv_error_last(), "layer 0: the plan's attention window is 9 tokens, the model's 8"));
        p->layers[0].window = 8;
        p->layers[2].window = 8; /* a global layer given a window */
        ck_assert_int_eq(kv_cache_rt_create(&c, p, m, 1, 0, 1, 0), KV_EMISMATCH);
        ck_assert_ptr_nonnull(strstr(kv_error_last(), "layer 2"));
        /* keys stored before RoPE: the local layers rotate with their own base (10000, the global 1e6 with linear
         * scaling), which the runtime takes with a plan that carries the windows; the same bound as above */
        p->layers[2].window = 0;
        for (int l = 0; l < a->n_layers; l++) p->layers[l].stream[KV_PLAN_K].pre_rope = 1;
        ck_assert_kv_ok(kv_cache_rt_create(&c, p, m, 1, 0, 1, 0));
        int done = 0;
        ck_assert_kv_ok(run_cache_steps(m, c, toks, mixed, n_mixed, lg, &done));
        double md, mr;
        kv_test_maxdiff(lg, golden, (size_t)N_TOKENS * V, &md, &mr);
        printf("hft %-6s runtime f16 cache, keys before RoPE (13 + 5 + decode): max |diff| %.3g (rel %.3g)\n", hm->name,
               md, md / mr);
        ck_assert_msg(md <= 2e-3 * mr, "%s: pre-RoPE runtime cache logits differ by %g", hm->name, md);
        kv_cache_free(c);
        for (int l = 0; l < a->n_layers; l++) p->layers[l].window = 0; /* a plan of format 1.4 */
        ck_assert_int_eq(kv_cache_rt_create(&c, p, m, 1, 0, 1, 0), KV_EUNSUPPORTED); /* which base, per layer? */
        ck_assert_ptr_nonnull(strstr(kv_error_last(), "own RoPE base"));
        for (int l = 0; l < a->n_layers; l++) p->layers[l].stream[KV_PLAN_K].pre_rope = 0;
        ck_assert_kv_ok(kv_cache_rt_create(&c, p, m, 1, 0, 1, 0));
        ck_assert_int_eq(kv_cache_applies_windows(c), 0);
        ck_assert_int_eq(run_cache_steps(m, c, toks, ones, N_TOKENS, lg, &done), KV_EUNSUPPORTED);
        ck_assert_int_eq(done, 8);
        ck_assert_ptr_nonnull(strstr(kv_error_last(), "sliding window of 8 tokens"));
        kv_cache_free(c);
        kv_plan_free(p);
        /* prompt statistics do not take windows yet: the cache's own plan runs without them */
        ck_assert_kv_ok(kv_cache_rt_create(&c, NULL, m, 1, 0, 1, KV_CACHE_RT_PROMPT_STATS));
        ck_assert_int_eq(kv_cache_applies_windows(c), 0);
        kv_cache_free(c);
    }
    free(lg);
    free(golden);
    kv_model_free(m);
    remove_checkpoint_dir(dir);
}
END_TEST

int main(void) {
    Suite *s = suite_create("model_hft");
    TCase *tc = tcase_create("golden");
    tcase_set_timeout(tc, 120);
    tcase_add_loop_test(tc, test_hft_golden, 0, 2 * (int)(sizeof k_models / sizeof k_models[0]));
    tcase_add_loop_test(tc, test_hft_runtime_cache, 0, (int)(sizeof k_models / sizeof k_models[0]));
    suite_add_tcase(s, tc);
    return kv_test_run(s);
}
