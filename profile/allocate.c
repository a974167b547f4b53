/* KVmix mixed-precision allocation and recent-pivotal-context ratios (kv_profile.h). */
#include "kv_profile.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

void kv_alloc_params_default(kv_alloc_params *p) {
    p->high_frac = 0.2;
    p->k_high_bits = 3;
    p->v_high_bits = 4;
    p->k_low_bits = 2;
    p->v_low_bits = 2;
    p->rpc_high = 0.2;
    p->rpc_low = 0.1;
}

kv_status kv_alloc_params_check(const kv_alloc_params *p) {
    if (!(p->high_frac >= 0.0 && p->high_frac <= 1.0))
        return KV_ERR(KV_EINVAL, "high fraction %g is not in [0, 1]", p->high_frac);
    /* the range kvcal fit accepts for keys.bits / layers.N.key_bits: a fragment it cannot load is no use */
    const int bits[4] = {p->k_high_bits, p->v_high_bits, p->k_low_bits, p->v_low_bits};
    const char *names[4] = {"key high bits", "value high bits", "key low bits", "value low bits"};
    for (int i = 0; i < 4; i++)
        if (bits[i] < KV_FIT_MIN_BITS || bits[i] > KV_FIT_MAX_BITS)
            return KV_ERR(KV_EINVAL, "%s %d is not in [%d, %d] (the bits kvcal fit accepts)", names[i], bits[i],
                          KV_FIT_MIN_BITS, KV_FIT_MAX_BITS);
    if (!(p->rpc_high >= 0.0 && p->rpc_high <= 1.0 && p->rpc_low >= 0.0 && p->rpc_low <= 1.0))
        return KV_ERR(KV_EINVAL, "RPC ratios must be in [0, 1] (got %g, %g)", p->rpc_high, p->rpc_low);
    return KV_OK;
}

static kv_status validate(int n_layers, const kv_alloc_params *p) {
    if (n_layers <= 0 || n_layers > 1 << 16) return KV_ERR(KV_EINVAL, "bad layer count %d", n_layers);
    return kv_alloc_params_check(p);
}

static kv_status alloc_arrays(kv_alloc *a, int n_layers) {
    memset(a, 0, sizeof *a);
    a->n_layers = n_layers;
    a->k_bits = calloc((size_t)n_layers, sizeof(int));
    a->v_bits = calloc((size_t)n_layers, sizeof(int));
    a->k_rpc = calloc((size_t)n_layers, sizeof(double));
    a->v_rpc = calloc((size_t)n_layers, sizeof(double));
    if (!a->k_bits || !a->v_bits || !a->k_rpc || !a->v_rpc) {
        kv_alloc_free(a);
        return KV_ERR(KV_ENOMEM, "out of memory for %d layers", n_layers);
    }
    return KV_OK;
}

void kv_alloc_free(kv_alloc *a) {
    if (!a) return;
    free(a->k_bits);
    free(a->v_bits);
    free(a->k_rpc);
    free(a->v_rpc);
    memset(a, 0, sizeof *a);
}

/* Number of high-bit layers: floor, so 20% of 32 layers is 6 (the paper's 2.1875 and 2.375). The
 * small epsilon keeps e.g. 0.3 * 10 = 2.9999999999999996 from flooring to 2. */
static int n_high_of(int n_layers, double frac) { return (int)floor(frac * n_layers + 1e-9); }

static void finish_averages(kv_alloc *a) {
    double ks = 0, vs = 0;
    for (int i = 0; i < a->n_layers; i++) {
        ks += a->k_bits[i];
        vs += a->v_bits[i];
    }
    a->k_avg_bits = ks / a->n_layers;
    a->v_avg_bits = vs / a->n_layers;
}

/* Mark the n_top largest scores (ties: lower index first) in is_top. */
static kv_status top_set(int *is_top, const double *scores, int n, int n_top) {
    int *order = malloc((size_t)n * sizeof(int));
    if (!order) return KV_ERR(KV_ENOMEM, "out of memory");
    for (int i = 0; i < n; i++) {
        if (!isfinite(scores[i])) {
            free(order);
            return KV_ERR(KV_ENUMERIC, "importance score of layer %d is not finite", i);
        }
        order[i] = i;
    }
    /* insertion sort: n is a layer count (<= a few hundred), stable by construction */
    for (int i = 1; i < n; i++) {
        int x = order[i], j = i - 1;
        while (j >= 0 && scores[order[j]] < scores[x]) {
            order[j + 1] = order[j];
            j--;
        }
        order[j + 1] = x;
    }
    memset(is_top, 0, (size_t)n * sizeof(int));
    for (int i = 0; i < n_top; i++) is_top[order[i]] = 1;
    free(order);
    return KV_OK;
}

static void apply_sets(kv_alloc *a, const int *k_top, const int *v_top, const kv_alloc_params *p) {
    for (int i = 0; i < a->n_layers; i++) {
        a->k_bits[i] = k_top[i] ? p->k_high_bits : p->k_low_bits;
        a->v_bits[i] = v_top[i] ? p->v_high_bits : p->v_low_bits;
        a->k_rpc[i] = k_top[i] ? p->rpc_high : p->rpc_low;
        a->v_rpc[i] = v_top[i] ? p->rpc_high : p->rpc_low;
    }
    finish_averages(a);
}

kv_status kv_alloc_by_importance(kv_alloc *out, const double *k_scores, const double *v_scores,
                                 int n_layers, const kv_alloc_params *p) {
    kv_status s = validate(n_layers, p);
    if (s != KV_OK) return s;
    s = alloc_arrays(out, n_layers);
    if (s != KV_OK) return s;
    int *k_top = calloc((size_t)n_layers, sizeof(int));
    int *v_top = calloc((size_t)n_layers, sizeof(int));
    out->n_high = n_high_of(n_layers, p->high_frac);
    if (!k_top || !v_top) {
        s = KV_ERR(KV_ENOMEM, "out of memory");
        goto done;
    }
    if ((s = top_set(k_top, k_scores, n_layers, out->n_high)) != KV_OK) goto done;
    if ((s = top_set(v_top, v_scores, n_layers, out->n_high)) != KV_OK) goto done;
    apply_sets(out, k_top, v_top, p);
done:
    free(k_top);
    free(v_top);
    if (s != KV_OK) kv_alloc_free(out);
    return s;
}

/* Partial Fisher-Yates: flag the first n_top entries of a random permutation (tmp: n ints). */
static void random_set(int *is_top, int *tmp, int n, int n_top, kv_rng *rng) {
    for (int i = 0; i < n; i++) tmp[i] = i;
    for (int i = 0; i < n_top; i++) {
        int j = i + (int)(kv_rng_next_u64(rng) % (uint64_t)(n - i));
        int t = tmp[i];
        tmp[i] = tmp[j];
        tmp[j] = t;
    }
    memset(is_top, 0, (size_t)n * sizeof(int));
    for (int i = 0; i < n_top; i++) is_top[tmp[i]] = 1;
}

kv_status kv_alloc_random(kv_alloc *out, int n_layers, const kv_alloc_params *p, uint64_t seed) {
    kv_status s = validate(n_layers, p);
    if (s != KV_OK) return s;
    s = alloc_arrays(out, n_layers);
    if (s != KV_OK) return s;
    int *k_top = calloc((size_t)n_layers, sizeof(int));
    int *v_top = calloc((size_t)n_layers, sizeof(int));
    int *tmp = calloc((size_t)n_layers, sizeof(int));
    if (!k_top || !v_top || !tmp) {
        free(k_top);
        free(v_top);
        free(tmp);
        kv_alloc_free(out);
        return KV_ERR(KV_ENOMEM, "out of memory");
    }
    out->n_high = n_high_of(n_layers, p->high_frac);
    kv_rng rng;
    kv_rng_init(&rng, seed);
    random_set(k_top, tmp, n_layers, out->n_high, &rng);
    random_set(v_top, tmp, n_layers, out->n_high, &rng);
    apply_sets(out, k_top, v_top, p);
    free(tmp);
    free(k_top);
    free(v_top);
    return KV_OK;
}

kv_status kv_alloc_uniform(kv_alloc *out, int n_layers, int k_bits, int v_bits, double rpc) {
    kv_alloc_params p;
    kv_alloc_params_default(&p);
    p.high_frac = 0.0;
    p.k_low_bits = k_bits;
    p.v_low_bits = v_bits;
    if (rpc >= 0) p.rpc_low = rpc;
    kv_status s = validate(n_layers, &p);
    if (s != KV_OK) return s;
    s = alloc_arrays(out, n_layers);
    if (s != KV_OK) return s;
    for (int i = 0; i < n_layers; i++) {
        out->k_bits[i] = k_bits;
        out->v_bits[i] = v_bits;
        out->k_rpc[i] = p.rpc_low;
        out->v_rpc[i] = p.rpc_low;
    }
    out->n_high = 0;
    finish_averages(out);
    return KV_OK;
}

/* Average ranks (1-based), ties sharing the mean of the ranks they span. */
static kv_status ranks_of(double *rank, const double *x, int n) {
    int *order = malloc((size_t)n * sizeof(int));
    if (!order) return KV_ERR(KV_ENOMEM, "out of memory");
    for (int i = 0; i < n; i++) order[i] = i;
    for (int i = 1; i < n; i++) {
        int v = order[i], j = i - 1;
        while (j >= 0 && x[order[j]] > x[v]) {
            order[j + 1] = order[j];
            j--;
        }
        order[j + 1] = v;
    }
    for (int i = 0; i < n;) {
        int j = i;
        while (j + 1 < n && x[order[j + 1]] == x[order[i]]) j++;
        double r = 0.5 * (double)(i + j) + 1.0;
        for (int k = i; k <= j; k++) rank[order[k]] = r;
        i = j + 1;
    }
    free(order);
    return KV_OK;
}

kv_status kv_rank_spearman(double *rho, const double *a, const double *b, int n) {
    if (n < 2) return KV_ERR(KV_EINVAL, "rank correlation needs at least 2 values (got %d)", n);
    double *ra = malloc((size_t)n * sizeof(double));
    double *rb = malloc((size_t)n * sizeof(double));
    kv_status s = KV_OK;
    if (!ra || !rb) {
        s = KV_ERR(KV_ENOMEM, "out of memory");
        goto done;
    }
    if ((s = ranks_of(ra, a, n)) != KV_OK || (s = ranks_of(rb, b, n)) != KV_OK) goto done;
    /* Pearson correlation of the ranks (correct with ties, unlike the 1 - 6 sum d^2 shortcut). */
    double ma = 0, mb = 0;
    for (int i = 0; i < n; i++) {
        ma += ra[i];
        mb += rb[i];
    }
    ma /= n;
    mb /= n;
    double sab = 0, saa = 0, sbb = 0;
    for (int i = 0; i < n; i++) {
        sab += (ra[i] - ma) * (rb[i] - mb);
        saa += (ra[i] - ma) * (ra[i] - ma);
        sbb += (rb[i] - mb) * (rb[i] - mb);
    }
    *rho = (saa > 0 && sbb > 0) ? sab / sqrt(saa * sbb) : 0.0;
done:
    free(ra);
    free(rb);
    return s;
}

kv_status kv_top_overlap(double *overlap, const double *a, const double *b, int n, int n_top) {
    if (n <= 0 || n_top <= 0 || n_top > n)
        return KV_ERR(KV_EINVAL, "top-set overlap needs 0 < n_top <= n (got %d, %d)", n_top, n);
    int *ta = malloc((size_t)n * sizeof(int));
    int *tb = malloc((size_t)n * sizeof(int));
    kv_status s = KV_OK;
    if (!ta || !tb) {
        s = KV_ERR(KV_ENOMEM, "out of memory");
        goto done;
    }
    if ((s = top_set(ta, a, n, n_top)) != KV_OK || (s = top_set(tb, b, n, n_top)) != KV_OK) goto done;
    int common = 0;
    for (int i = 0; i < n; i++) common += ta[i] && tb[i];
    *overlap = (double)common / n_top;
done:
    free(ta);
    free(tb);
    return s;
}
