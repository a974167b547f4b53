/* KVmix layer importance (kvmix.txt "KV Importance Analysis", appendix B Algorithm 1, with one
 * backward per prompt for all layers instead of one per layer): prompts are windows of the
 * tokenized corpus, sampled with a seed from non-overlapping slots so that two halves of the
 * prompt set are disjoint (the rank-stability measure compares them). Under MPI the prompts are
 * shared among the ranks (kv_dist). */
#include "kv_profile.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

void kv_importance_free(kv_importance *imp) {
    if (!imp) return;
    free(imp->k_scores);
    free(imp->v_scores);
    free(imp->k_mean);
    free(imp->k_std);
    free(imp->v_mean);
    free(imp->v_std);
    free(imp->losses);
    free(imp->prompt_starts);
    memset(imp, 0, sizeof *imp);
}

/* mean and (population) standard deviation over prompts, per layer */
static void mean_std(const double *scores, int P, int L, double *mean, double *std) {
    for (int l = 0; l < L; l++) {
        double s = 0, s2 = 0;
        for (int p = 0; p < P; p++) s += scores[(size_t)p * L + l];
        const double mu = s / P;
        for (int p = 0; p < P; p++) {
            const double d = scores[(size_t)p * L + l] - mu;
            s2 += d * d;
        }
        mean[l] = mu;
        std[l] = sqrt(s2 / P);
    }
}

kv_status kv_importance_run(kv_importance *out, kv_model *m, const int32_t *tokens, size_t n_tokens,
                            const kv_importance_options *opt) {
    memset(out, 0, sizeof *out);
    const kv_arch *a = kv_model_arch(m);
    const int L = a->n_layers, P = opt->n_prompts;
    const int body = opt->max_len - (opt->bos_id >= 0 ? 1 : 0); /* corpus tokens per prompt */
    if (P < 1 || P > 100000) return KV_ERR(KV_EINVAL, "importance: bad prompt count %d", P);
    if (opt->max_len < 2) return KV_ERR(KV_EINVAL, "importance: --max-len must be >= 2 (got %d)", opt->max_len);
    const size_t n_slots = n_tokens / (size_t)body;
    if (n_slots < (size_t)P)
        return KV_ERR(KV_EINVAL,
                      "importance: the corpus has %zu tokens, room for %zu non-overlapping prompts of %d "
                      "tokens; %d asked (use fewer prompts or a shorter --max-len)",
                      n_tokens, n_slots, body, P);
    kv_status s = KV_OK;
    kv_grad *g = NULL;
    int32_t *buf = malloc(sizeof(int32_t) * (size_t)opt->max_len);
    size_t *slots = malloc(sizeof(size_t) * n_slots);
    out->n_layers = L;
    out->n_prompts = P;
    out->prompt_len = opt->max_len;
    out->k_scores = calloc((size_t)P * L, sizeof(double));
    out->v_scores = calloc((size_t)P * L, sizeof(double));
    out->k_mean = calloc((size_t)L, sizeof(double));
    out->k_std = calloc((size_t)L, sizeof(double));
    out->v_mean = calloc((size_t)L, sizeof(double));
    out->v_std = calloc((size_t)L, sizeof(double));
    out->losses = calloc((size_t)P, sizeof(double));
    out->prompt_starts = calloc((size_t)P, sizeof(int64_t));
    if (!buf || !slots || !out->k_scores || !out->v_scores || !out->k_mean || !out->k_std || !out->v_mean ||
        !out->v_std || !out->losses || !out->prompt_starts)
        s = KV_ERR(KV_ENOMEM, "importance: out of memory");
    if ((s = kv_dist_agree(opt->dist, s)) != KV_OK) goto done;
    /* P distinct slots, uniformly at random (partial Fisher-Yates) */
    kv_rng rng;
    kv_rng_init(&rng, opt->seed);
    for (size_t i = 0; i < n_slots; i++) slots[i] = i;
    for (int i = 0; i < P; i++) {
        size_t j = (size_t)i + (size_t)(kv_rng_next_u64(&rng) % (uint64_t)(n_slots - (size_t)i));
        size_t t = slots[i];
        slots[i] = slots[j];
        slots[j] = t;
        out->prompt_starts[i] = (int64_t)(slots[i] * (size_t)body);
    }
    if ((s = kv_dist_agree(opt->dist, kv_grad_create(&g, m, KV_GRAD_F32, 0))) != KV_OK) goto done;
    kv_progress prog;
    kv_progress_begin(&prog, opt->progress_label ? opt->progress_label : "importance", "prompt", P);
    const double t0 = kv_now_seconds();
    /* this rank's prompts; the others' entries stay zero for the exact sum below */
    for (int p = 0; p < P && s == KV_OK; p++) {
        if (kv_dist_owner(opt->dist, p) != kv_dist_rank(opt->dist)) continue;
        int n = 0;
        if (opt->bos_id >= 0) buf[n++] = opt->bos_id;
        memcpy(buf + n, tokens + out->prompt_starts[p], sizeof(int32_t) * (size_t)body);
        n += body;
        s = kv_grad_run(g, buf, n, &out->losses[p], out->k_scores + (size_t)p * L, out->v_scores + (size_t)p * L);
        if (s != KV_OK) kv_error_wrap(s, "importance: prompt %d: ", p);
        kv_progress_update(&prog, p + 1);
    }
    out->seconds = kv_now_seconds() - t0;
    kv_progress_end(&prog);
    if ((s = kv_dist_agree(opt->dist, s)) != KV_OK) goto done;
    if ((s = kv_dist_sum_disjoint(opt->dist, out->k_scores, (size_t)P * L)) != KV_OK ||
        (s = kv_dist_sum_disjoint(opt->dist, out->v_scores, (size_t)P * L)) != KV_OK ||
        (s = kv_dist_sum_disjoint(opt->dist, out->losses, (size_t)P)) != KV_OK ||
        (s = kv_dist_max(opt->dist, &out->seconds)) != KV_OK)
        goto done;
    mean_std(out->k_scores, P, L, out->k_mean, out->k_std);
    mean_std(out->v_scores, P, L, out->v_mean, out->v_std);
done:
    kv_grad_free(g);
    free(buf);
    free(slots);
    if (s != KV_OK) kv_importance_free(out);
    return s;
}

kv_status kv_importance_stability(kv_stability *out, const kv_importance *imp, int n_top) {
    memset(out, 0, sizeof *out);
    const int P = imp->n_prompts, L = imp->n_layers, half = P / 2;
    if (half < 1 || L < 2) return KV_ERR(KV_EINVAL, "stability needs >= 2 prompts and >= 2 layers");
    kv_status s = KV_OK;
    double *ka = calloc((size_t)L, sizeof(double)), *kb = calloc((size_t)L, sizeof(double));
    double *va = calloc((size_t)L, sizeof(double)), *vb = calloc((size_t)L, sizeof(double));
    out->n_steps = half;
    out->prefix_k_rho = calloc((size_t)half, sizeof(double));
    out->prefix_v_rho = calloc((size_t)half, sizeof(double));
    if (!ka || !kb || !va || !vb || !out->prefix_k_rho || !out->prefix_v_rho) {
        s = KV_ERR(KV_ENOMEM, "out of memory");
        goto done;
    }
    /* set B = prompts [half, 2*half): its mean is the reference */
    for (int p = half; p < 2 * half; p++)
        for (int l = 0; l < L; l++) {
            kb[l] += imp->k_scores[(size_t)p * L + l] / half;
            vb[l] += imp->v_scores[(size_t)p * L + l] / half;
        }
    /* set A's mean over its first n prompts, n = 1 .. half: how fast the ranking settles */
    for (int n = 1; n <= half; n++) {
        for (int l = 0; l < L; l++) {
            ka[l] += imp->k_scores[(size_t)(n - 1) * L + l];
            va[l] += imp->v_scores[(size_t)(n - 1) * L + l];
        }
        if ((s = kv_rank_spearman(&out->prefix_k_rho[n - 1], ka, kb, L)) != KV_OK) goto done;
        if ((s = kv_rank_spearman(&out->prefix_v_rho[n - 1], va, vb, L)) != KV_OK) goto done;
    }
    out->half = half;
    out->k_rho = out->prefix_k_rho[half - 1];
    out->v_rho = out->prefix_v_rho[half - 1];
    out->n_top = n_top;
    if (n_top > 0) {
        if ((s = kv_top_overlap(&out->k_top_overlap, ka, kb, L, n_top)) != KV_OK) goto done;
        if ((s = kv_top_overlap(&out->v_top_overlap, va, vb, L, n_top)) != KV_OK) goto done;
    }
done:
    free(ka);
    free(kb);
    free(va);
    free(vb);
    if (s != KV_OK) kv_stability_free(out);
    return s;
}

void kv_stability_free(kv_stability *st) {
    if (!st) return;
    free(st->prefix_k_rho);
    free(st->prefix_v_rho);
    memset(st, 0, sizeof *st);
}
