/* budget.c — the operating points of quantized pruning under a memory budget (kvprof budget;
 * quantized-pruning.txt §4 and appendix C): at a budget b (a fraction of the f16 cache), a selection
 * method keeps 16/B times the tokens of 16-bit storage at B bits ("1x tokens at 16 bits, 2x at 8, 4x at
 * 4, 8x at 2"); the layer-wise study keeps a base precision and changes one range of layers to another.
 * Each point is a `kvcal fit` configuration (method kivi, bits, pruning), so the runtime's own accounting
 * (RUNTIME.md §8) makes the points memory-equivalent; this file enumerates them, names them, picks the
 * best and writes the fragment. The measuring is the tool's (tools/kvprof_budget.c). */
#include "kv_profile.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int valid_bits(int b) { return b == 2 || b == 3 || b == 4 || b == 8 || b == 16; }

kv_status kv_budget_points(kv_budget_point **out, int *n_out, const kv_budget_grid *g, int n_layers) {
    if (!out || !n_out || !g || n_layers < 1) return KV_ERR(KV_EINVAL, "kv_budget_points: bad arguments");
    *out = NULL;
    *n_out = 0;
    if (g->n_budgets < 1 || g->n_methods < 1 || g->n_bits < 1)
        return KV_ERR(KV_EINVAL, "operating points need at least one budget, selection method and precision");
    for (int i = 0; i < g->n_budgets; i++)
        if (!(g->budgets[i] > 0.0 && g->budgets[i] <= 1.0))
            return KV_ERR(KV_EINVAL, "budget %g is outside (0, 1] (a fraction of the f16 cache)", g->budgets[i]);
    for (int i = 0; i < g->n_methods; i++)
        if (g->methods[i] == KV_PLAN_PRUNE_NONE || !kv_plan_prune_name(g->methods[i]))
            return KV_ERR(KV_EINVAL, "selection method %d is not one of streamingllm, h2o, snapkv, pyramidkv",
                          (int)g->methods[i]);
    for (int i = 0; i < g->n_bits; i++)
        if (!valid_bits(g->bits[i]))
            return KV_ERR(KV_EINVAL, "token precision %d bits: 16 (f16), 8, 4, 3 or 2", g->bits[i]);
    if (g->mix_base && !valid_bits(g->mix_base))
        return KV_ERR(KV_EINVAL, "layer-wise mix base %d bits: 16 (f16), 8, 4, 3 or 2", g->mix_base);
    if (g->mix_base && (g->mix_ranges < 1 || g->mix_ranges > n_layers))
        return KV_ERR(KV_EINVAL, "layer-wise mixes over %d ranges of a %d-layer model", g->mix_ranges, n_layers);
    /* mixes: the base precision everywhere but one range of layers at another precision of the list */
    int n_mix = 0;
    for (int i = 0; g->mix_base && i < g->n_bits; i++) n_mix += g->bits[i] != g->mix_base;
    const int mix_methods = g->mix_base ? (g->mix_methods > 0 && g->mix_methods < g->n_methods ? g->mix_methods
                                                                                                 : g->n_methods)
                                        : 0;
    const size_t total = (size_t)g->n_budgets *
                         ((size_t)g->n_methods * (size_t)g->n_bits + (size_t)mix_methods * (size_t)n_mix * (size_t)g->mix_ranges);
    kv_budget_point *p = calloc(total, sizeof *p);
    if (!p) return KV_ERR(KV_ENOMEM, "out of memory for %zu operating points", total);
    int n = 0;
    for (int b = 0; b < g->n_budgets; b++) {
        for (int mi = 0; mi < g->n_methods; mi++)
            for (int k = 0; k < g->n_bits; k++) {
                kv_budget_point *q = &p[n++];
                q->budget = g->budgets[b], q->method = g->methods[mi], q->bits = g->bits[k];
                q->range_lo = q->range_hi = 0, q->range_bits = 0;
                snprintf(q->name, sizeof q->name, "%s %d-bit (%gx tokens)", kv_plan_prune_name(q->method), q->bits,
                         16.0 / q->bits);
            }
        for (int mi = 0; mi < mix_methods; mi++)
            for (int k = 0; k < g->n_bits; k++) {
                if (g->bits[k] == g->mix_base) continue;
                for (int r = 0; r < g->mix_ranges; r++) {
                    kv_budget_point *q = &p[n++];
                    q->budget = g->budgets[b], q->method = g->methods[mi], q->bits = g->mix_base;
                    q->range_lo = (int)((long)n_layers * r / g->mix_ranges);
                    q->range_hi = (int)((long)n_layers * (r + 1) / g->mix_ranges);
                    q->range_bits = g->bits[k];
                    snprintf(q->name, sizeof q->name, "%s %d-bit, layers %d-%d %d-bit", kv_plan_prune_name(q->method),
                             q->bits, q->range_lo, q->range_hi - 1, q->range_bits);
                }
            }
    }
    *out = p;
    *n_out = n;
    return KV_OK;
}

int kv_budget_point_layer_bits(const kv_budget_point *p, int layer) {
    return p->range_bits && layer >= p->range_lo && layer < p->range_hi ? p->range_bits : p->bits;
}

/* "key=value" assignments into a[] (each up to 64 bytes); returns the count. */
int kv_budget_point_assignments(const kv_budget_point *p, int n_layers, char (*a)[64], int max) {
    int n = 0;
#define PUT(...) (n < max ? (snprintf(a[n], 64, __VA_ARGS__), n++) : n)
    PUT("method=kivi");
    PUT("keys.bits=%d", p->bits);
    PUT("values.bits=%d", p->bits);
    PUT("pruning.method=%s", kv_plan_prune_name(p->method));
    PUT("pruning.budget=%.17g", p->budget);
    for (int l = 0; p->range_bits && l < n_layers; l++)
        if (l >= p->range_lo && l < p->range_hi) {
            PUT("layers.%d.key_bits=%d", l, p->range_bits);
            PUT("layers.%d.value_bits=%d", l, p->range_bits);
        }
#undef PUT
    return n;
}

int kv_budget_better(const kv_budget_result *a, const kv_budget_result *b) {
    if (!b) return 1;
    const int pa = isfinite(a->passkey_accuracy), pb = isfinite(b->passkey_accuracy);
    if (pa && pb && a->passkey_accuracy != b->passkey_accuracy) return a->passkey_accuracy > b->passkey_accuracy;
    return a->kl_mean < b->kl_mean;
}

kv_status kv_budget_config_write(const char *path, const kv_budget_point *p, const kv_budget_result *r,
                                 int n_layers, int window, int pool) {
    kv_atomic_file af;
    kv_status s = kv_atomic_open(&af, path);
    if (s != KV_OK) return s;
    FILE *fp = af.fp;
    fprintf(fp, "# kvprof budget: the best operating point at a budget of %g of the f16 cache\n", p->budget);
    fprintf(fp, "# %s: continuation KL %.6g nats, ppl %.4f", p->name, r->kl_mean, r->ppl);
    if (isfinite(r->passkey_accuracy)) fprintf(fp, ", passkey accuracy %.4f", r->passkey_accuracy);
    fprintf(fp, "\n# use: kvcal fit --method kivi --config THIS ...\nmethod: kivi\n");
    fprintf(fp, "keys:\n  bits: %d\nvalues:\n  bits: %d\n", p->bits, p->bits);
    fprintf(fp, "pruning:\n  method: %s\n  budget: %.17g\n  window: %d\n  pool: %d\n", kv_plan_prune_name(p->method),
            p->budget, window, pool);
    if (p->range_bits) {
        fprintf(fp, "layers:\n");
        for (int l = p->range_lo; l < p->range_hi && l < n_layers; l++)
            fprintf(fp, "  %d:\n    key_bits: %d\n    value_bits: %d\n", l, p->range_bits, p->range_bits);
    }
    return kv_atomic_commit(&af);
}

/* ---- chart ------------------------------------------------------------------------------------------ */
static void xml_text(FILE *fp, const char *s) {
    for (; *s; s++) {
        if (*s == '<') fputs("&lt;", fp);
        else if (*s == '>') fputs("&gt;", fp);
        else if (*s == '&') fputs("&amp;", fp);
        else fputc(*s, fp);
    }
}

kv_status kv_budget_svg_write(const char *path, const char *title, const kv_budget_point *pts,
                              const kv_budget_result *res, int n, const double *budgets, int n_budgets) {
    if (!path || !pts || !res || n < 1 || !budgets || n_budgets < 1)
        return KV_ERR(KV_EINVAL, "kv_budget_svg_write: bad arguments");
    /* series: points with the same name apart from the budget (the name holds no budget) */
    int *series = malloc((size_t)n * sizeof *series), n_series = 0;
    if (!series) return KV_ERR(KV_ENOMEM, "out of memory");
    for (int i = 0; i < n; i++) {
        series[i] = -1;
        for (int j = 0; j < i && series[i] < 0; j++)
            if (strcmp(pts[j].name, pts[i].name) == 0) series[i] = series[j];
        if (series[i] < 0) series[i] = n_series++;
    }
    double lo = INFINITY, hi = -INFINITY;
    for (int i = 0; i < n; i++)
        if (isfinite(res[i].kl_mean) && res[i].kl_mean > 0) {
            lo = fmin(lo, res[i].kl_mean);
            hi = fmax(hi, res[i].kl_mean);
        }
    if (!(lo <= hi)) lo = 1e-3, hi = 1.0;
    double l0 = floor(log10(lo)), l1 = ceil(log10(hi));
    if (l1 <= l0) l1 = l0 + 1;
    enum { W = 640, H = 360, L = 70, T = 50, PW = 380, PH = 260 };
    const int legend_h = 16 * n_series + 60;
    kv_atomic_file af;
    kv_status s = kv_atomic_open(&af, path);
    if (s != KV_OK) {
        free(series);
        return s;
    }
    FILE *fp = af.fp;
    static const char *const colors[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
                                         "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"};
    static const char *const dashes[] = {"", "6,3", "2,2", "8,3,2,3"};
    fprintf(fp, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" "
            "height=\"%d\" font-family=\"sans-serif\">\n<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n",
            W, H > legend_h ? H : legend_h);
    fprintf(fp, "<text x=\"%d\" y=\"22\" font-size=\"15\" font-weight=\"bold\">", L);
    xml_text(fp, title ? title : "quantized pruning: quality against memory budget");
    fprintf(fp, "</text>\n<text x=\"%d\" y=\"38\" font-size=\"11\">continuation KL(exact || cache), nats (log scale; "
            "lower is better) against the budget (fraction of the f16 cache)</text>\n", L);
    for (double e = l0; e <= l1 + 1e-9; e += 1.0) {
        const double y = T + PH - PH * (e - l0) / (l1 - l0);
        fprintf(fp, "<line x1=\"%d\" y1=\"%.1f\" x2=\"%d\" y2=\"%.1f\" stroke=\"#ddd\"/>\n<text x=\"%d\" y=\"%.1f\" "
                "font-size=\"10\" text-anchor=\"end\">1e%+d</text>\n", L, y, L + PW, y, L - 4, y + 3, (int)e);
    }
    /* x: the budgets in the order given, evenly spaced */
    for (int b = 0; b < n_budgets; b++) {
        const double x = n_budgets == 1 ? L + PW / 2.0 : L + PW * (double)b / (n_budgets - 1);
        fprintf(fp, "<line x1=\"%.1f\" y1=\"%d\" x2=\"%.1f\" y2=\"%d\" stroke=\"#eee\"/>\n<text x=\"%.1f\" y=\"%d\" "
                "font-size=\"10\" text-anchor=\"middle\">1/%.3g</text>\n", x, T, x, T + PH, x, T + PH + 14,
                1.0 / budgets[b]);
    }
    fprintf(fp, "<text x=\"%d\" y=\"%d\" font-size=\"11\" text-anchor=\"middle\">memory budget</text>\n", L + PW / 2,
            T + PH + 30);
    for (int sidx = 0; sidx < n_series; sidx++) {
        const char *col = colors[sidx % 10], *dash = dashes[(sidx / 10) % 4];
        fprintf(fp, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"1.5\"%s%s%s points=\"", col,
                dash[0] ? " stroke-dasharray=\"" : "", dash, dash[0] ? "\"" : "");
        int first = -1;
        for (int b = 0; b < n_budgets; b++)
            for (int i = 0; i < n; i++) {
                if (series[i] != sidx || pts[i].budget != budgets[b] || !(res[i].kl_mean > 0) ||
                    !isfinite(res[i].kl_mean))
                    continue;
                const double x = n_budgets == 1 ? L + PW / 2.0 : L + PW * (double)b / (n_budgets - 1);
                const double y = T + PH - PH * (log10(res[i].kl_mean) - l0) / (l1 - l0);
                fprintf(fp, "%.1f,%.1f ", x, y);
                if (first < 0) first = i;
            }
        fprintf(fp, "\"/>\n");
        const double ly = T + 16.0 * sidx;
        fprintf(fp, "<line x1=\"%d\" y1=\"%.1f\" x2=\"%d\" y2=\"%.1f\" stroke=\"%s\" stroke-width=\"2\"%s%s%s/>\n"
                "<text x=\"%d\" y=\"%.1f\" font-size=\"10\">", L + PW + 12, ly, L + PW + 30, ly, col,
                dash[0] ? " stroke-dasharray=\"" : "", dash, dash[0] ? "\"" : "", L + PW + 34, ly + 3);
        for (int i = 0; i < n; i++)
            if (series[i] == sidx) {
                xml_text(fp, pts[i].name);
                break;
            }
        fprintf(fp, "</text>\n");
    }
    fprintf(fp, "</svg>\n");
    free(series);
    return kv_atomic_commit(&af);
}
