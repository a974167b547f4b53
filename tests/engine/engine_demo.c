/* engine_demo.c — what an inference engine does with libkvrt, linked against the kvrt target alone (kv_plan.h and
 * kvrt.h; no model readers, YAML or JSON): open a plan file, open a runtime on it, append each layer's keys and
 * values as a forward pass would, attend from the compressed cache, read the cache's statistics.
 *
 *   engine_demo PLAN   the plan of a real model (kvcal fit --out PLAN); random keys, values and queries of its shape
 *   engine_demo        writes a small plan itself (2 layers, 2 KV heads of 32, 8-bit KIVI keys and values), reads
 *                      it back from the file and checks the runtime against exact attention
 *
 * The check (demo plan): every checked output row within 3% (relative, L2) of softmax(q K^T / sqrt(d)) V computed in
 * double from the same keys and values. Reason: 8-bit min-max codes of a group of 32 Gaussian values (range about
 * 4.1 sigma) err by delta = step / sqrt(12), about 0.46% of sigma, on the value side and on the key side (scores off
 * by about delta, since |q| sqrt(scale) ~ 1), so a row is off by about sqrt(2) delta = 0.65% rms; the worst of the 80
 * rows checked (every 25th token, every layer and head) is 0.9% (measured), and 3% is more than 4 times the rms,
 * while a wrong layout, scale, or softmax is off by tens of percent.
 * Its statistics must show 9 bits per compressed value (8-bit codes + an f16 scale and zero point per group of 32). */
#include "kv_plan.h"
#include "kvrt.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define TOKENS 300 /* tokens of the sequence */
#define PROMPT 200 /* of which the prompt, appended in one step */

static int fail(const char *what) {
    fprintf(stderr, "engine_demo: %s: %s\n", what, kv_error_last());
    return 1;
}

/* A plan of the demo shape written to a temporary file (the engine's input is a file). */
static int write_demo_plan(char *path, size_t cap) {
    kv_plan_fingerprint fp;
    memset(&fp, 0, sizeof fp);
    snprintf(fp.arch, sizeof fp.arch, "llama");
    fp.n_layers = 2, fp.d_model = 256, fp.n_heads = 8, fp.n_kv_heads = 2, fp.head_dim = 32, fp.vocab_size = 1000;
    fp.rope_theta = 10000.0f;
    kv_plan *p = NULL;
    if (kv_plan_create(&p, &fp) != KV_OK) return fail("kv_plan_create");
    p->global.recent = 64;
    for (int l = 0; l < fp.n_layers; l++)
        for (int s = 0; s < 2; s++) {
            kv_plan_stream *st = &p->layers[l].stream[s];
            st->method = KV_PLAN_UNIFORM;
            st->bits = 8;
            st->group_size = 32;
            st->group_axis = s == KV_PLAN_K ? KV_PLAN_GROUP_TOKENS : KV_PLAN_GROUP_CHANNELS;
            st->scale_dtype = KV_DTYPE_F16;
        }
    snprintf(path, cap, "%s/engine_demo.%d.kvplan", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp", (int)getpid());
    const kv_status s = kv_plan_write(p, path, NULL);
    kv_plan_free(p);
    return s == KV_OK ? 0 : fail("kv_plan_write");
}

static double gauss(uint64_t *state) { /* Box-Muller over a 64-bit LCG: deterministic on every machine */
    double u[2];
    for (int i = 0; i < 2; i++) {
        *state = *state * 6364136223846793005ull + 1442695040888963407ull;
        u[i] = ((double)(*state >> 11) + 0.5) / 9007199254740992.0;
    }
    return sqrt(-2.0 * log(u[0])) * cos(6.283185307179586 * u[1]);
}

/* Exact attention of query head h (one row) over tokens [0, n) of keys/values with row stride C. */
static void exact_attention(double *out, const float *q, const float *k, const float *v, int n, int C, int hd,
                            int kvh, double scale) {
    double *w = malloc((size_t)n * sizeof *w), mx = -INFINITY, sum = 0.0;
    for (int t = 0; t < n; t++) {
        double d = 0.0;
        for (int i = 0; i < hd; i++) d += (double)q[i] * k[(size_t)t * C + (size_t)kvh * hd + i];
        w[t] = d * scale;
        mx = w[t] > mx ? w[t] : mx;
    }
    for (int t = 0; t < n; t++) sum += (w[t] = exp(w[t] - mx));
    for (int i = 0; i < hd; i++) out[i] = 0.0;
    for (int t = 0; t < n; t++)
        for (int i = 0; i < hd; i++) out[i] += w[t] / sum * v[(size_t)t * C + (size_t)kvh * hd + i];
    free(w);
}

int main(int argc, char **argv) {
    char path[512];
    const int demo = argc < 2;
    if (demo) {
        if (write_demo_plan(path, sizeof path)) return 1;
    } else {
        snprintf(path, sizeof path, "%s", argv[1]);
    }
    kv_plan *plan = NULL;
    if (kv_plan_read(&plan, path) != KV_OK) return fail("kv_plan_read");
    if (demo) unlink(path);
    const kv_plan_fingerprint *fp = &plan->fingerprint;
    const int L = fp->n_layers, H = fp->n_kv_heads, hd = fp->head_dim, C = H * hd, NH = fp->n_heads;
    /* RoPE frequencies of the model (used by streams that store keys before RoPE) */
    double *inv_freq = malloc((size_t)(hd / 2) * sizeof *inv_freq);
    for (int i = 0; i < hd / 2; i++) inv_freq[i] = pow((double)fp->rope_theta, -2.0 * i / hd);
    kv_rt_options opt;
    memset(&opt, 0, sizeof opt);
    opt.device = KV_RT_DEVICE_CPU;
    opt.n_seqs = 1;
    opt.n_heads = NH;
    opt.n_threads = 2;
    opt.rope_inv_freq = inv_freq;
    opt.rope_layout = KV_ROPE_HALF;
    kv_rt *rt = NULL;
    if (kv_rt_open(&rt, plan, &opt) != KV_OK) return fail("kv_rt_open");

    /* A forward pass as an engine runs it: the prompt (PROMPT tokens) through every layer in one step, the prompt
     * ends (plans that prune tokens select here), then one token per step through every layer. Per layer the keys
     * and values are random rows; the keys given before RoPE and after it are the same rows here (the demo checks
     * the cache, not RoPE). */
    const size_t LT = (size_t)TOKENS * C;
    float *k = malloc((size_t)L * LT * sizeof *k), *v = malloc((size_t)L * LT * sizeof *v);
    float *q = malloc((size_t)PROMPT * NH * hd * sizeof *q), *out = malloc((size_t)PROMPT * NH * hd * sizeof *out);
    int32_t *pos = malloc(PROMPT * sizeof *pos);
    double *ref = malloc((size_t)hd * sizeof *ref), worst = 0.0;
    uint64_t rng = 12345;
    int status = 0;
    for (size_t i = 0; i < (size_t)L * LT; i++) k[i] = (float)gauss(&rng), v[i] = (float)gauss(&rng);
    for (int i = 0; i < PROMPT; i++) pos[i] = i;
    for (int t = 0; t < TOKENS && !status;) {
        const int n = t == 0 ? PROMPT : 1; /* tokens of this step */
        for (int l = 0; l < L && !status; l++) {
            const float *kl = k + (size_t)l * LT + (size_t)t * C, *vl = v + (size_t)l * LT + (size_t)t * C;
            if (kv_rt_append(rt, l, 0, n, pos, kl, kl, vl, (size_t)C) != KV_OK) return fail("kv_rt_append");
            for (size_t i = 0; i < (size_t)n * NH * hd; i++) q[i] = (float)gauss(&rng);
            if (kv_rt_attend(rt, l, 0, n, q, (size_t)NH * hd, out, (size_t)NH * hd) != KV_OK) return fail("kv_rt_attend");
            if (!demo || (t + n) % 25 != 0) continue;
            const float *qr = q + (size_t)(n - 1) * NH * hd, *orow = out + (size_t)(n - 1) * NH * hd; /* the last row */
            for (int h = 0; h < NH; h++) { /* query head h reads KV head h / (NH / H) */
                exact_attention(ref, qr + (size_t)h * hd, k + (size_t)l * LT, v + (size_t)l * LT, t + n, C, hd,
                                h / (NH / H), 1.0 / sqrt((double)hd));
                double e = 0.0, nr = 0.0;
                for (int i = 0; i < hd; i++) {
                    e += (orow[h * hd + i] - ref[i]) * (orow[h * hd + i] - ref[i]);
                    nr += ref[i] * ref[i];
                }
                const double rel = sqrt(e / (nr > 0.0 ? nr : 1.0));
                worst = rel > worst ? rel : worst;
                if (rel > 0.03) {
                    fprintf(stderr, "engine_demo: layer %d token %d head %d: relative error %.4g > 0.03\n", l, t + n - 1,
                            h, rel);
                    status = 1;
                }
            }
        }
        if (t == 0 && kv_rt_end_prompt(rt, 0) != KV_OK) return fail("kv_rt_end_prompt");
        t += n;
        pos[0] = t; /* the next step's token */
    }
    kv_rt_stats st;
    if (kv_rt_get_stats(rt, 0, &st) != KV_OK) return fail("kv_rt_get_stats");
    printf("plan %s: %d layers, %d KV heads of %d; %llu tokens held, %llu values compressed, %.4f bits per compressed "
           "value, %.4f bits per value in all, %llu bytes allocated\n", demo ? "(demo)" : path, L, H, hd,
           (unsigned long long)st.tokens, (unsigned long long)st.values_compressed, st.bits_per_value,
           st.bits_per_value_total, (unsigned long long)st.allocated_bytes);
    if (demo) {
        printf("worst relative error of the attention output against exact attention: %.3g (bound 0.03)\n", worst);
        if (st.values_compressed == 0 || fabs(st.bits_per_value - 9.0) > 1e-9) {
            fprintf(stderr, "engine_demo: expected 9 bits per compressed value, got %.6f over %llu values\n",
                    st.bits_per_value, (unsigned long long)st.values_compressed);
            status = 1;
        }
    }
    kv_rt_close(rt);
    kv_plan_free(plan);
    free(inv_freq), free(k), free(v), free(q), free(out), free(ref), free(pos);
    return status;
}
