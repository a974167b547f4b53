/* SVG bar chart of per-layer K and V importance (kv_profile.h). Plain SVG, no dependencies:
 * two panels (K above, V below), each with its own scale because K and V gradient norms differ
 * in magnitude; the high-bit layers are drawn darker and marked "H". */
#include "kv_profile.h"

#include <math.h>

enum { PANEL_H = 170, TOP = 50, LEFT = 70, RIGHT = 20, GAP = 50, BOTTOM = 40 };

static double panel_max(const double *mean, const double *std, int n) {
    double m = 0;
    for (int i = 0; i < n; i++) {
        double v = mean[i] + (std ? std[i] : 0.0);
        if (isfinite(v) && v > m) m = v;
    }
    return m > 0 ? m : 1.0;
}

static void panel(FILE *fp, const char *label, const double *mean, const double *std, int n,
                  const int *bits, int high_bits, const char *color_low, const char *color_high,
                  int y0, double bar_w) {
    const double vmax = panel_max(mean, std, n);
    fprintf(fp, "<text x=\"%d\" y=\"%d\" font-size=\"13\" font-weight=\"bold\">%s</text>\n", LEFT,
            y0 - 8, label);
    /* axis and 4 gridlines with tick labels */
    for (int g = 0; g <= 4; g++) {
        double v = vmax * g / 4.0;
        double y = y0 + PANEL_H - PANEL_H * g / 4.0;
        fprintf(fp, "<line x1=\"%d\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#ddd\"/>\n", LEFT, y,
                LEFT + bar_w * n, y);
        fprintf(fp, "<text x=\"%d\" y=\"%.1f\" font-size=\"10\" text-anchor=\"end\">%.3g</text>\n",
                LEFT - 4, y + 3, v);
    }
    for (int i = 0; i < n; i++) {
        double v = isfinite(mean[i]) && mean[i] > 0 ? mean[i] : 0.0;
        double h = PANEL_H * v / vmax;
        double x = LEFT + bar_w * i + bar_w * 0.15;
        int high = bits && bits[i] >= high_bits;
        fprintf(fp,
                "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"%s\"><title>layer "
                "%d: %.6g%s</title></rect>\n",
                x, y0 + PANEL_H - h, bar_w * 0.7, h, high ? color_high : color_low, i, mean[i],
                high ? " (high bits)" : "");
        if (std && isfinite(std[i]) && std[i] > 0) {
            double cx = x + bar_w * 0.35;
            double y1 = y0 + PANEL_H - PANEL_H * (v + std[i]) / vmax;
            double y2 = y0 + PANEL_H - PANEL_H * fmax(v - std[i], 0.0) / vmax;
            fprintf(fp, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#333\"/>\n", cx,
                    y1, cx, y2);
        }
        if (high)
            fprintf(fp, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"9\" text-anchor=\"middle\">H</text>\n",
                    x + bar_w * 0.35, y0 + PANEL_H - h - 3);
        if (n <= 40 || i % 2 == 0)
            fprintf(fp, "<text x=\"%.1f\" y=\"%d\" font-size=\"9\" text-anchor=\"middle\">%d</text>\n",
                    x + bar_w * 0.35, y0 + PANEL_H + 12, i);
    }
}

kv_status kv_importance_svg_write(const char *path, const char *title, const double *k_mean,
                                  const double *k_std, const double *v_mean, const double *v_std,
                                  int n_layers, const kv_alloc *alloc) {
    if (n_layers <= 0 || !k_mean || !v_mean)
        return KV_ERR(KV_EINVAL, "importance chart needs per-layer K and V scores");
    if (alloc && alloc->n_layers != n_layers)
        return KV_ERR(KV_EINVAL, "allocation has %d layers, scores have %d", alloc->n_layers, n_layers);
    const double bar_w = n_layers <= 20 ? 28.0 : 18.0;
    const int width = (int)(LEFT + RIGHT + bar_w * n_layers);
    const int height = TOP + 2 * PANEL_H + GAP + BOTTOM + 20;
    kv_atomic_file af;
    kv_status s = kv_atomic_open(&af, path);
    if (s != KV_OK) return s;
    FILE *fp = af.fp;
    fprintf(fp, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
    fprintf(fp,
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" viewBox=\"0 0 %d %d\" "
            "font-family=\"sans-serif\">\n",
            width < 420 ? 420 : width, height, width < 420 ? 420 : width, height);
    fprintf(fp, "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n");
    fprintf(fp, "<text x=\"%d\" y=\"22\" font-size=\"15\" font-weight=\"bold\">", LEFT);
    for (const char *c = title ? title : "KV importance"; *c; c++) { /* escape for XML */
        if (*c == '<') fputs("&lt;", fp);
        else if (*c == '>') fputs("&gt;", fp);
        else if (*c == '&') fputs("&amp;", fp);
        else fputc(*c, fp);
    }
    fprintf(fp, "</text>\n");
    if (alloc)
        fprintf(fp,
                "<text x=\"%d\" y=\"38\" font-size=\"11\">darker bars, H = high-bit layers "
                "(%d of %d); K avg %.4g bits, V avg %.4g bits; whiskers = std over prompts</text>\n",
                LEFT, alloc->n_high, n_layers, alloc->k_avg_bits, alloc->v_avg_bits);
    int k_high = 0, v_high = 0;
    if (alloc) { /* the high bit width is the largest one in use */
        for (int i = 0; i < n_layers; i++) {
            if (alloc->k_bits[i] > k_high) k_high = alloc->k_bits[i];
            if (alloc->v_bits[i] > v_high) v_high = alloc->v_bits[i];
        }
        if (alloc->n_high == 0) k_high = v_high = 1 << 20; /* nothing is "high" */
    }
    panel(fp, "Key: ||grad W_k||_F per layer", k_mean, k_std, n_layers, alloc ? alloc->k_bits : NULL,
          k_high, "#9ecae1", "#08519c", TOP + 10, bar_w);
    panel(fp, "Value: ||grad W_v||_F per layer", v_mean, v_std, n_layers,
          alloc ? alloc->v_bits : NULL, v_high, "#fdae6b", "#a63603", TOP + 10 + PANEL_H + GAP, bar_w);
    fprintf(fp, "<text x=\"%.1f\" y=\"%d\" font-size=\"11\" text-anchor=\"middle\">layer</text>\n",
            LEFT + bar_w * n_layers / 2.0, height - 8);
    fprintf(fp, "</svg>\n");
    return kv_atomic_commit(&af);
}
