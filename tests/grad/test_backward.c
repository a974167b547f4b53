/* The backward pass (model/backward.c) against finite differences in double precision, on small
 * random-weight models covering every op: embedding, RMSNorm, RoPE in both layouts (and llama3
 * scaling), GQA attention with the causal mask, SwiGLU, QKV bias, tied and separate output, and
 * Qwen3's / Gemma 3's additions (QK-norm, post-norms, GELU-tanh, scaled embeddings, an attention scale
 * other than 1/sqrt(head_dim), final logit softcapping, a sliding window shorter than the prompt on local
 * layers with their own RoPE base, linear scaling on the global ones). Also:
 * the float training forward against the reference forward (kv_model_forward), float gradients
 * against double ones, and finite differences on the real stories260K checkpoint. */
#include "kv_test.h"
#include "kv_model.h"

#include <math.h>

typedef struct model_case {
    const char *name;
    kv_rope_layout layout;
    kv_rope_scaling scaling;
    int qkv_bias;
    int tied;
    int kind; /* 0 Llama family, 1 Qwen3, 2 Gemma 3 */
} model_case;

static const model_case k_cases[] = {
    {"adjacent-tied", KV_ROPE_ADJACENT, KV_ROPE_SCALING_NONE, 0, 1, 0},
    {"half-bias-untied", KV_ROPE_HALF, KV_ROPE_SCALING_NONE, 1, 0, 0},
    {"half-llama3", KV_ROPE_HALF, KV_ROPE_SCALING_LLAMA3, 0, 0, 0},
    {"qwen3", KV_ROPE_HALF, KV_ROPE_SCALING_NONE, 0, 0, 1},
    {"gemma3", KV_ROPE_HALF, KV_ROPE_SCALING_LINEAR, 0, 1, 2},
};

static void small_arch(kv_arch *a, const model_case *c) {
    memset(a, 0, sizeof *a);
    snprintf(a->arch, sizeof a->arch, "%s", c->qkv_bias ? "qwen2" : "llama");
    a->n_layers = 2;
    a->d_model = 16;
    a->n_heads = 4;
    a->n_kv_heads = 2;
    a->head_dim = 4;
    a->d_ff = 24;
    a->vocab_size = 11;
    a->max_seq_len = 64;
    a->rms_eps = 1e-5f;
    a->rope_theta = 10000.0f;
    a->rope_layout = c->layout;
    a->rope_scaling = c->scaling;
    a->rope_factor = 8.0f;
    a->rope_low_freq_factor = 1.0f;
    a->rope_high_freq_factor = 4.0f;
    a->rope_orig_max_pos = 8; /* small so that the 2 frequency pairs fall in different bands */
    a->qkv_bias = c->qkv_bias;
    a->tied_embeddings = c->tied;
    a->bos_id = 1;
    a->eos_id = 2;
    if (c->kind == 1) {
        snprintf(a->arch, sizeof a->arch, "qwen3");
        a->qk_norm = 1;
    } else if (c->kind == 2) {
        snprintf(a->arch, sizeof a->arch, "gemma3");
        a->rope_factor = 2.0f;
        a->qk_norm = a->post_norms = 1;
        a->ffn_act = KV_FFN_GELU_TANH;
        a->embed_scale = 1.7f;
        a->attn_scale = 0.35f;       /* != 1/sqrt(head_dim) = 0.5 */
        a->final_logit_softcap = 3.0f;
        a->sliding_window = 3;       /* prompts of 9-12 tokens */
        a->swa_pattern = 2;          /* layer 0 local, layer 1 global */
        a->rope_theta_local = 100.0f;
    }
}

typedef struct source {
    const model_case *c;
    uint64_t seed;
} source;

/* Random weights: norms around 1, matrices N(0, 0.4^2) (large enough that attention is not
 * uniform and SwiGLU is not linear), biases N(0, 0.2^2). Each tensor seeded by its name. */
static kv_status random_tensor(void *user, const char *name, int n_dims, const uint64_t ne[4], float *dst) {
    source *src = user;
    if (strcmp(name, "output.weight") == 0 && src->c->tied) return KV_ENOTFOUND;
    if (strstr(name, ".bias") && !src->c->qkv_bias) return KV_ENOTFOUND;
    if (strcmp(name, "rope_freqs.weight") == 0) return KV_ENOTFOUND;
    uint64_t h = src->seed;
    for (const char *p = name; *p; p++) h = h * 131 + (uint8_t)*p;
    kv_rng r;
    kv_rng_init(&r, h);
    size_t n = 1;
    for (int i = 0; i < n_dims; i++) n *= ne[i];
    const int is_norm = strstr(name, "norm") != NULL, is_bias = strstr(name, ".bias") != NULL;
    for (size_t i = 0; i < n; i++) {
        double z = kv_rng_next_normal(&r);
        dst[i] = (float)(is_norm ? 1.0 + 0.1 * z : (is_bias ? 0.2 * z : 0.4 * z));
    }
    return KV_OK;
}

static kv_model *make_model(const model_case *c) {
    kv_arch a;
    small_arch(&a, c);
    source src = {c, 1234};
    kv_model_options opt = {1, 0, KV_MODEL_DEVICE_CPU};
    kv_model *m = NULL;
    ck_assert_kv_ok(kv_model_create(&m, &a, random_tensor, &src, &opt));
    return m;
}

/* Central differences in double: truncation error ~eps^2 |f'''| ~1e-12 and rounding ~1e-16/eps
 * ~1e-10 for eps = 1e-6, so agreement to 1e-7 (absolute, plus relative for large entries) checks
 * the analytic gradient to well below any real bug's size. */
static void check_param_fd(kv_grad *g, const int32_t *tok, int T, const char *name, int n_probe, uint64_t seed) {
    void *vp = NULL;
    const void *gp = NULL;
    size_t n = 0;
    ck_assert_kv_ok(kv_grad_param(g, name, &vp, &gp, &n));
    ck_assert_msg(gp != NULL, "no gradient for %s", name);
    double *val = vp;
    const double *grad = gp;
    kv_rng r;
    kv_rng_init(&r, seed);
    const double eps = 1e-6;
    for (int k = 0; k < n_probe; k++) {
        size_t i = (size_t)(kv_rng_next_u64(&r) % n);
        const double old = val[i];
        double lp, lm;
        val[i] = old + eps;
        ck_assert_kv_ok(kv_grad_loss(g, tok, T, &lp));
        val[i] = old - eps;
        ck_assert_kv_ok(kv_grad_loss(g, tok, T, &lm));
        val[i] = old;
        const double fd = (lp - lm) / (2 * eps);
        ck_assert_msg(fabs(fd - grad[i]) <= 1e-7 * (1 + fabs(fd)), "%s[%zu]: analytic %.12g, finite difference %.12g",
                      name, i, grad[i], fd);
    }
}

START_TEST(test_fd_every_parameter) {
    const model_case *c = &k_cases[_i];
    kv_model *m = make_model(c);
    kv_grad *g = NULL;
    ck_assert_kv_ok(kv_grad_create(&g, m, KV_GRAD_F64, 1));
    const int32_t tok[9] = {1, 5, 3, 9, 3, 10, 0, 7, 5};
    double loss;
    ck_assert_kv_ok(kv_grad_run(g, tok, 9, &loss, NULL, NULL));
    ck_assert(isfinite(loss) && loss > 0);
    const char *globals[] = {"token_embd.weight", "output_norm.weight", "output.weight"};
    for (int i = 0; i < 3; i++) {
        if (i == 2 && c->tied) continue;
        check_param_fd(g, tok, 9, globals[i], 12, 10 + i);
    }
    const char *per_layer[] = {"attn_norm.weight",   "attn_q.weight",      "attn_k.weight",
                               "attn_v.weight",      "attn_output.weight", "ffn_norm.weight",
                               "ffn_gate.weight",    "ffn_up.weight",      "ffn_down.weight",
                               "attn_q.bias",        "attn_k.bias",        "attn_v.bias",
                               "attn_q_norm.weight", "attn_k_norm.weight", "post_attention_norm.weight",
                               "post_ffw_norm.weight"};
    for (int l = 0; l < 2; l++)
        for (int i = 0; i < 16; i++) {
            if (i >= 9 && i < 12 && !c->qkv_bias) continue;
            if (i >= 12 && i < 14 && c->kind == 0) continue;
            if (i >= 14 && c->kind != 2) continue;
            char nm[64];
            snprintf(nm, sizeof nm, "blk.%d.%s", l, per_layer[i]);
            check_param_fd(g, tok, 9, nm, 8, 100 + 12 * l + i);
        }
    kv_grad_free(g);
    kv_model_free(m);
}
END_TEST

/* The K/V-only mode (what kvprof runs) gives the same K/V gradients as the all-gradients mode, and
 * the float path agrees with the double path (float rounding through 2 layers: 1e-4 relative). */
START_TEST(test_kv_only_and_float) {
    const model_case *c = &k_cases[_i];
    kv_model *m = make_model(c);
    kv_grad *g64 = NULL, *g64kv = NULL, *g32 = NULL;
    ck_assert_kv_ok(kv_grad_create(&g64, m, KV_GRAD_F64, 1));
    ck_assert_kv_ok(kv_grad_create(&g64kv, m, KV_GRAD_F64, 0));
    ck_assert_kv_ok(kv_grad_create(&g32, m, KV_GRAD_F32, 0));
    const int32_t tok[12] = {1, 4, 4, 2, 8, 6, 10, 3, 3, 0, 9, 1};
    double l64, l64kv, l32, k64[2], v64[2], kk[2], vk[2], k32[2], v32[2];
    ck_assert_kv_ok(kv_grad_run(g64, tok, 12, &l64, k64, v64));
    ck_assert_kv_ok(kv_grad_run(g64kv, tok, 12, &l64kv, kk, vk));
    ck_assert_kv_ok(kv_grad_run(g32, tok, 12, &l32, k32, v32));
    ck_assert_double_eq_tol(l64, l64kv, 1e-14);
    for (int l = 0; l < 2; l++) {
        ck_assert_double_eq_tol(kk[l], k64[l], 1e-12 * k64[l]);
        ck_assert_double_eq_tol(vk[l], v64[l], 1e-12 * v64[l]);
        ck_assert_double_eq_tol(k32[l], k64[l], 1e-4 * k64[l]);
        ck_assert_double_eq_tol(v32[l], v64[l], 1e-4 * v64[l]);
        ck_assert_double_gt(k64[l], 0);
    }
    ck_assert_double_eq_tol(l32, l64, 1e-5 * l64);
    const void *gp = NULL;
    ck_assert_int_eq(kv_grad_param(g64kv, "blk.0.attn_q.weight", NULL, &gp, NULL), KV_OK);
    ck_assert_ptr_null(gp); /* not computed in K/V-only mode */
    ck_assert_int_eq(kv_grad_param(g64, "blk.9.attn_k.weight", NULL, NULL, NULL), KV_ENOTFOUND);
    int32_t bad[2] = {1, 99};
    ck_assert_int_eq(kv_grad_run(g32, bad, 2, NULL, NULL, NULL), KV_EINVAL);
    ck_assert_int_eq(kv_grad_run(g32, bad, 1, NULL, NULL, NULL), KV_EINVAL);
    kv_grad_free(g64);
    kv_grad_free(g64kv);
    kv_grad_free(g32);
    kv_model_free(m);
}
END_TEST

/* The training forward's loss equals the loss computed from the reference forward's logits
 * (kv_model_forward): two implementations of the same model. Float summation orders differ
 * (BLAS blocking, double vs float partial sums): 1e-5 relative. */
START_TEST(test_loss_matches_reference_forward) {
    const model_case *c = &k_cases[_i];
    kv_model *m = make_model(c);
    const int32_t tok[10] = {1, 7, 2, 2, 9, 0, 3, 5, 6, 4};
    float logits[10 * 11];
    kv_forward f = {0};
    f.tokens = tok;
    f.n_seqs = 1;
    f.n_tokens = 10;
    f.logits = logits;
    ck_assert_kv_ok(kv_model_forward(m, &f));
    double ref = 0;
    for (int t = 0; t < 9; t++) ref += kv_nll_of(logits + t * 11, 11, tok[t + 1]);
    ref /= 9;
    kv_grad *g = NULL;
    ck_assert_kv_ok(kv_grad_create(&g, m, KV_GRAD_F32, 0));
    double loss;
    ck_assert_kv_ok(kv_grad_loss(g, tok, 10, &loss));
    ck_assert_double_eq_tol(loss, ref, 1e-5 * ref);
    kv_grad_free(g);
    kv_model_free(m);
}
END_TEST

/* stories260K (real weights, 5 layers, GQA 8/4, adjacent RoPE, tied): finite differences in double
 * on entries of every layer's W_k and W_v, and of the embedding. */
START_TEST(test_fd_stories260k) {
    const char *dir = kv_test_data_dir();
    char path[1024];
    snprintf(path, sizeof path, "%s/stories260K/stories260K.bin", dir);
    kv_model_options opt = {1, 0, KV_MODEL_DEVICE_CPU};
    kv_model *m = NULL;
    ck_assert_kv_ok(kv_model_open(&m, path, &opt));
    kv_grad *g = NULL;
    ck_assert_kv_ok(kv_grad_create(&g, m, KV_GRAD_F64, 1));
    int32_t tok[24];
    kv_rng r;
    kv_rng_init(&r, 77);
    tok[0] = 1;
    for (int i = 1; i < 24; i++) tok[i] = 3 + (int32_t)(kv_rng_next_u64(&r) % 500);
    double loss, kn[5], vn[5];
    ck_assert_kv_ok(kv_grad_run(g, tok, 24, &loss, kn, vn));
    for (int l = 0; l < 5; l++) {
        char nm[64];
        snprintf(nm, sizeof nm, "blk.%d.attn_k.weight", l);
        check_param_fd(g, tok, 24, nm, 4, 200 + l);
        snprintf(nm, sizeof nm, "blk.%d.attn_v.weight", l);
        check_param_fd(g, tok, 24, nm, 4, 300 + l);
        ck_assert_double_gt(kn[l], 0);
        ck_assert_double_gt(vn[l], 0);
    }
    check_param_fd(g, tok, 24, "token_embd.weight", 4, 400);
    kv_grad_free(g);
    kv_model_free(m);
}
END_TEST


/* The threaded paths (GEMM rows split across threads, attention heads in parallel with per-thread
 * scratch) give the single-threaded gradients: stories260K with 512 tokens, so that the SwiGLU and
 * output GEMMs and the attention heads are large enough to be split, every gradient in double.
 * Each output element is summed in the same order whatever the split, so the two agree to
 * rounding (1e-12 of the tensor's largest entry); a wrong row offset or a shared scratch would be
 * off by O(1). */
START_TEST(test_threads_agree_stories260k) {
    const char *dir = kv_test_data_dir();
    char path[1024];
    snprintf(path, sizeof path, "%s/stories260K/stories260K.bin", dir);
    kv_model *m1 = NULL, *m2 = NULL;
    kv_model_options o1 = {1, 0, KV_MODEL_DEVICE_CPU}, o2 = {2, 0, KV_MODEL_DEVICE_CPU};
    ck_assert_kv_ok(kv_model_open(&m1, path, &o1));
    ck_assert_kv_ok(kv_model_open(&m2, path, &o2));
    kv_grad *g1 = NULL, *g2 = NULL;
    ck_assert_kv_ok(kv_grad_create(&g1, m1, KV_GRAD_F64, 1));
    ck_assert_kv_ok(kv_grad_create(&g2, m2, KV_GRAD_F64, 1));
    enum { T = 512 };
    static int32_t tok[T];
    kv_rng r;
    kv_rng_init(&r, 91);
    tok[0] = 1;
    for (int i = 1; i < T; i++) tok[i] = 3 + (int32_t)(kv_rng_next_u64(&r) % 500);
    double l1, l2, k1[5], k2[5], v1[5], v2[5];
    ck_assert_kv_ok(kv_grad_run(g1, tok, T, &l1, k1, v1));
    ck_assert_kv_ok(kv_grad_run(g2, tok, T, &l2, k2, v2));
    ck_assert_double_eq_tol(l1, l2, 1e-12 * l1);
    const char *names[] = {"token_embd.weight", "output_norm.weight", "blk.0.attn_k.weight", "blk.2.attn_v.weight",
                           "blk.4.attn_q.weight", "blk.3.attn_output.weight", "blk.1.ffn_gate.weight",
                           "blk.4.ffn_down.weight", "blk.0.attn_norm.weight"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        const void *a = NULL, *b = NULL;
        size_t n1 = 0, n2 = 0;
        ck_assert_kv_ok(kv_grad_param(g1, names[i], NULL, &a, &n1));
        ck_assert_kv_ok(kv_grad_param(g2, names[i], NULL, &b, &n2));
        ck_assert_uint_eq(n1, n2);
        const double *x = a, *y = b;
        double mx = 0, diff = 0;
        for (size_t j = 0; j < n1; j++) {
            mx = fmax(mx, fabs(x[j]));
            diff = fmax(diff, fabs(x[j] - y[j]));
        }
        ck_assert_msg(mx > 0 && diff <= 1e-12 * mx, "%s: 1 vs 2 threads differ by %g (largest entry %g)", names[i],
                      diff, mx);
    }
    for (int l = 0; l < 5; l++) {
        ck_assert_double_eq_tol(k1[l], k2[l], 1e-12 * k1[l]);
        ck_assert_double_eq_tol(v1[l], v2[l], 1e-12 * v1[l]);
    }
    kv_grad_free(g1);
    kv_grad_free(g2);
    kv_model_free(m1);
    kv_model_free(m2);
}
END_TEST

/* ---- independent reference: JAX (gen_jax_ref.py) -------------------------------------------- */

/* The weights gen_jax_ref.py builds: SplitMix64 of FNV-1a(name) and the element index, uniform
 * values (no transcendental functions, so C and Python produce identical float32 weights). */
static kv_status jax_tensor(void *user, const char *name, int n_dims, const uint64_t ne[4], float *dst) {
    (void)user;
    if (strstr(name, ".bias") || strcmp(name, "rope_freqs.weight") == 0) return KV_ENOTFOUND;
    uint64_t h = 0xcbf29ce484222325ull;
    for (const char *p = name; *p; p++) h = (h ^ (uint8_t)*p) * 0x100000001b3ull;
    size_t n = 1;
    for (int i = 0; i < n_dims; i++) n *= ne[i];
    const int is_norm = strstr(name, "norm") != NULL;
    for (size_t i = 0; i < n; i++) {
        const double u = kv_rng_uniform(h, i);
        dst[i] = (float)(is_norm ? 1.0 + 0.2 * (u - 0.5) : 0.6 * (u - 0.5));
    }
    return KV_OK;
}

/* Loss, every parameter's gradient norm and a few gradient entries agree with JAX's autodiff in
 * float64. Both sides compute in double with different summation orders: 1e-10 relative. The
 * float path's K/V norms (what kvprof reports) agree to 1e-4 (float rounding through 2 layers). */
START_TEST(test_jax_reference) {
    const char *src = getenv("KVCAL_TEST_SRC");
    ck_assert_msg(src != NULL, "KVCAL_TEST_SRC not set");
    char path[1024];
    snprintf(path, sizeof path, "%s/grad/golden/jax_grad_ref.txt", src);
    FILE *fp = fopen(path, "r");
    ck_assert_msg(fp != NULL, "cannot open %s", path);
    kv_arch a;
    memset(&a, 0, sizeof a);
    snprintf(a.arch, sizeof a.arch, "llama");
    a.n_layers = 2, a.d_model = 32, a.n_heads = 4, a.n_kv_heads = 2, a.head_dim = 8, a.d_ff = 48;
    a.vocab_size = 40, a.max_seq_len = 64, a.rms_eps = 1e-5f, a.rope_theta = 10000.0f;
    a.rope_layout = KV_ROPE_ADJACENT, a.bos_id = 1, a.eos_id = 2;
    kv_model_options opt = {1, 0, KV_MODEL_DEVICE_CPU};
    kv_model *m = NULL;
    ck_assert_kv_ok(kv_model_create(&m, &a, jax_tensor, NULL, &opt));
    kv_grad *g = NULL, *g32 = NULL;
    ck_assert_kv_ok(kv_grad_create(&g, m, KV_GRAD_F64, 1));
    ck_assert_kv_ok(kv_grad_create(&g32, m, KV_GRAD_F32, 0));
    const int32_t tok[16] = {1, 17, 5, 33, 5, 22, 9, 0, 38, 12, 7, 7, 30, 2, 19, 25};
    double loss, kn[2], vn[2], kn32[2], vn32[2];
    ck_assert_kv_ok(kv_grad_run(g, tok, 16, &loss, kn, vn));
    ck_assert_kv_ok(kv_grad_run(g32, tok, 16, NULL, kn32, vn32));
    char line[512];
    int n_norms = 0, n_entries = 0, have_loss = 0;
    while (fgets(line, sizeof line, fp)) {
        char name[128];
        double ref;
        long idx;
        if (line[0] == '#') continue;
        if (sscanf(line, "loss %lf", &ref) == 1) {
            ck_assert_double_eq_tol(loss, ref, 1e-10 * ref);
            have_loss = 1;
        } else if (sscanf(line, "norm %127s %lf", name, &ref) == 2) {
            const void *gp = NULL;
            size_t n = 0;
            ck_assert_kv_ok(kv_grad_param(g, name, NULL, &gp, &n));
            double ss = 0;
            for (size_t i = 0; i < n; i++) ss += ((const double *)gp)[i] * ((const double *)gp)[i];
            ck_assert_msg(fabs(sqrt(ss) - ref) <= 1e-10 * ref, "%s: norm %.15g, JAX %.15g", name, sqrt(ss), ref);
            int layer;
            char rest[64];
            if (sscanf(name, "blk.%d.%63s", &layer, rest) == 2) {
                if (strcmp(rest, "attn_k.weight") == 0) {
                    ck_assert_double_eq_tol(kn[layer], ref, 1e-10 * ref);
                    ck_assert_double_eq_tol(kn32[layer], ref, 1e-4 * ref);
                }
                if (strcmp(rest, "attn_v.weight") == 0) {
                    ck_assert_double_eq_tol(vn[layer], ref, 1e-10 * ref);
                    ck_assert_double_eq_tol(vn32[layer], ref, 1e-4 * ref);
                }
            }
            n_norms++;
        } else if (sscanf(line, "entry %127s %ld %lf", name, &idx, &ref) == 3) {
            const void *gp = NULL;
            ck_assert_kv_ok(kv_grad_param(g, name, NULL, &gp, NULL));
            const double got = ((const double *)gp)[idx];
            ck_assert_msg(fabs(got - ref) <= 1e-10 * (fabs(ref) + 1e-3), "%s[%ld]: %.15g, JAX %.15g", name, idx,
                          got, ref);
            n_entries++;
        }
    }
    fclose(fp);
    ck_assert(have_loss);
    ck_assert_int_eq(n_norms, 3 + 2 * 9); /* every parameter of the model */
    ck_assert_int_ge(n_entries, 12);
    kv_grad_free(g);
    kv_grad_free(g32);
    kv_model_free(m);
}
END_TEST

/* "test_backward" runs the random-model checks; "test_backward --stories" the real checkpoint
 * (a separate CTest entry that exits 77, skipped, when the data is absent). */
int main(int argc, char **argv) {
    Suite *s = suite_create("backward");
    TCase *tc = tcase_create("fd");
    tcase_set_timeout(tc, 300);
    if (argc > 1 && strcmp(argv[1], "--stories") == 0) {
        if (!kv_test_data_dir()) {
            fprintf(stderr, "stories260K not found (KVCAL_DATA_DIR): skipped\n");
            return 77;
        }
        tcase_add_test(tc, test_fd_stories260k);
        tcase_add_test(tc, test_threads_agree_stories260k);
    } else {
        const int nc = (int)(sizeof k_cases / sizeof k_cases[0]);
        tcase_add_loop_test(tc, test_fd_every_parameter, 0, nc);
        tcase_add_loop_test(tc, test_kv_only_and_float, 0, nc);
        tcase_add_loop_test(tc, test_loss_matches_reference_forward, 0, nc);
        tcase_add_test(tc, test_jax_reference);
    }
    suite_add_tcase(s, tc);
    return kv_test_run(s);
}
