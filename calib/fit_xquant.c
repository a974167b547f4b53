/* XQuant in kvcal fit (xquant.txt): the layer layout (1-bit layers, cross-layer shared codes), the
 * data-free eta, and the round trip of a chunk exactly as the runtime compresses it.
 *
 * Layout (xquant.txt Algorithm 1): a stream of layer l uses 1-bit codes when l >= kq (keys) / vq
 * (values), else the configured bits; it reuses the codes of layer l-1 when l >= km / vm and l is
 * odd (pairs (0,1), (2,3), ...: the lower, even layer keeps its codes, gamma = 1, eq. 16). The
 * upper layer stores only its own scale and zero point, computed from its own values (eq. 14-15).
 * Both layers of a pair must then have the same bits and groups (PLAN_FORMAT.md §6.4.1): kq / vq
 * that would split a sharing pair between 2 and 1 bits are refused.
 *
 * Data-free eta (xquant.txt §3.2, eq. 9-13): eta1 for the 1-bit streams, eta2 for the 2-bit ones
 * (the paper's Table 4 values 0.2 and 0.05 by default); other widths keep keys.eta / values.eta.
 * Per-layer key_eta / value_eta overrides win over both. */
#define _POSIX_C_SOURCE 200809L
#include "fit_internal.h"
#include "kv_model.h"
#include "kvrt.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

int kv_fit_xq_active(const kv_fit_config *cfg) { return kv_fit_method_has(cfg->method, KV_FIT_T_XQUANT); }

kv_status kv_fit_xq_stream(kv_plan *p, const kv_fit_config *cfg, int l, int st) {
    if (!kv_fit_xq_active(cfg)) return KV_OK;
    kv_plan_stream *s = &p->layers[l].stream[st];
    if (s->method != KV_PLAN_UNIFORM) return KV_OK;
    const char *sn = st == KV_PLAN_K ? "K" : "V";
    const int q1 = st == KV_PLAN_K ? cfg->xquant.kq : cfg->xquant.vq;
    const int sm = st == KV_PLAN_K ? cfg->xquant.km : cfg->xquant.vm;
    if (q1 >= 0 && l >= q1) {
        s->bits = 1;
        s->pack = KV_PLAN_PACK_WORD; /* the only 1-bit packing (PLAN_FORMAT.md §6.4) */
    }
    const int eta_set = kv_fit_config_stream_eta(cfg, l, st, NULL);
    if (!eta_set && s->bits == 1) s->eta = (float)cfg->xquant.eta1;
    if (!eta_set && s->bits == 2) s->eta = (float)cfg->xquant.eta2;
    s->share_codes_with_layer = -1;
    if (sm >= 0 && l >= sm && l % 2 == 1) {
        const kv_plan_stream *o = &p->layers[l - 1].stream[st];
        if (o->method != KV_PLAN_UNIFORM || o->bits != s->bits || o->group_size != s->group_size ||
            o->group_axis != s->group_axis || o->pack != s->pack)
            return KV_ERR(KV_EINVAL, "xquant.%s %d, xquant.%s %d: layer %d %s would share the codes of layer %d, "
                          "which has %d-bit codes (this layer %d) or another group layout; pairs (l even, l+1) must "
                          "have the same quantizer (use an even xquant.%s)", st ? "vm" : "km", sm, st ? "vq" : "kq",
                          q1, l, sn, l - 1, o->bits, s->bits, st ? "vq" : "kq");
        s->share_codes_with_layer = l - 1;
    }
    return KV_OK;
}

/* ---- codes of the lower layer of a pair, kept for the upper layer ------------------------------- */
void kv_fit_xq_codes_free(kv_fit_xq_codes *c) {
    if (!c) return;
    for (int st = 0; st < 2; st++) free(c->prev[st]), free(c->cur[st]);
    memset(c, 0, sizeof *c);
}

kv_status kv_fit_xq_codes_begin(kv_fit_xq_codes *c, const kv_plan *p, int l, int st, int recent, int kv_dim,
                                int64_t n_chunks_local) {
    free(c->cur[st]);
    c->cur[st] = NULL;
    if (l + 1 >= p->n_layers || p->layers[l + 1].stream[st].share_codes_with_layer != l) return KV_OK;
    kv_quant q;
    kv_block_storage bs;
    kv_status s = kv_quant_from_plan(&q, p, l, st);
    if (s == KV_OK) s = kv_quant_storage(&bs, &q, (size_t)recent, (size_t)kv_dim);
    if (s != KV_OK) return s;
    c->words[st] = (size_t)bs.code_words;
    const size_t n = c->words[st] * (size_t)(n_chunks_local > 0 ? n_chunks_local : 1);
    if (!(c->cur[st] = malloc(n * sizeof(uint32_t))))
        return KV_ERR(KV_ENOMEM, "out of memory keeping layer %d %s's codes for layer %d (%zu words)", l,
                      st ? "V" : "K", l + 1, n);
    return KV_OK;
}

void kv_fit_xq_codes_end_layer(kv_fit_xq_codes *c) {
    for (int st = 0; st < 2; st++) {
        free(c->prev[st]);
        c->prev[st] = c->cur[st];
        c->cur[st] = NULL;
    }
}

/* ---- the round trip --------------------------------------------------------------------------- */
kv_status kv_fit_xq_roundtrip(float *x_hat, uint32_t *codes_out, const kv_quant *q, size_t tokens, size_t channels,
                              const float *x, const uint32_t *partner_codes) {
    if (q->kind != KV_QUANT_UNIFORM || (!q->shared_codes && !codes_out))
        return kv_quant_roundtrip(x_hat, NULL, q, tokens, channels, x);
    if (q->shared_codes && !partner_codes)
        return KV_ERR(KV_EINVAL, "shared codes without the partner layer's codes of this chunk");
    kv_block_storage st;
    kv_status s = kv_quant_storage(&st, q, tokens, channels);
    if (s != KV_OK) return s;
    const size_t pbytes = q->uniform.param_type == KV_PARAM_F32 ? 4 : 2;
    void *scales = malloc((st.groups ? st.groups : 1) * pbytes), *zeros = malloc((st.groups ? st.groups : 1) * pbytes);
    if (!scales || !zeros) {
        s = KV_ERR(KV_ENOMEM, "out of memory compressing %zu x %zu values", tokens, channels);
        goto done;
    }
    /* what the runtime does (rt_runtime.c compress_chunk): a sharing block encodes only its own scale
     * and zero point and decodes the partner's codes of the same chunk with them */
    if ((s = kv_uniform_encode_ref(q->shared_codes ? NULL : codes_out, scales, zeros, &q->uniform, tokens, channels,
                                   x)) != KV_OK)
        goto done;
    s = kv_uniform_decode_ref(x_hat, &q->uniform, tokens, channels, q->shared_codes ? partner_codes : codes_out, scales,
                              zeros);
done:
    free(scales);
    free(zeros);
    return s;
}

/* ---- eta calibrated on data ---------------------------------------------------------------------
 * With a stream's codes fixed (eta does not change them, eq. 11-12), the reconstruction is affine in
 * eta: x_hat(eta) = x_hat(0) + eta * s * (2^B - 1 - 2 code). Both parts come from the runtime's own
 * round trip (eta 0 and eta 1/4: e0 = x_hat(0) - x, d = 4 (x_hat(1/4) - x_hat(0)); the f16 scale
 * and zero point make this exact to their rounding), so any error that is quadratic in the
 * reconstruction error is E(eta) = A + 2 eta B + eta^2 D, minimized at eta = -B / D (clamped to
 * [0, 0.49]). What attention reads:
 *   keys:   score errors q.(k_hat - k) over the calibration queries of the KV head's query heads:
 *           sum over compressed keys j of e_j^T C e_j, C = sum_t q_t q_t^T (queries after RoPE, every
 *           query position >= sinks; causality is not applied to C);
 *   values: output errors sum_j p_tj (v_hat_j - v_j) for the queries t = sinks + 15, + 31, ... (every
 *           16th position), p their exact attention weights over the sequence (softmax of q.k /
 *           sqrt(head_dim), keys 0..t), restricted to the compressed keys.
 * Sums are per shard (calibration and held-out sequences apart), added in shard order. The eta is
 * chosen on the calibration sums; the gains against eta = 0 and the data-free eta are the held-out
 * sums' E at those values. */
void kv_fit_xq_eta_free(kv_fit_xq_eta *e) {
    if (!e) return;
    for (int64_t j = 0; j < e->n_local; j++) {
        if (e->C) free(e->C[j]);
        if (e->P) free(e->P[j]);
    }
    free(e->C);
    free(e->P);
    memset(e, 0, sizeof *e);
}

kv_status kv_fit_xq_eta_init(kv_fit_xq_eta *e, const kv_fit_config *cfg, int n_heads, int n_kv_heads, int head_dim,
                             int sinks, int n_comp, int64_t n_local, const int64_t *shard_nseq) {
    memset(e, 0, sizeof *e);
    if (!kv_fit_xq_active(cfg) || !cfg->xquant.calibrate_eta) return KV_OK;
    e->on = 1;
    e->n_heads = n_heads, e->n_kv_heads = n_kv_heads, e->head_dim = head_dim;
    e->sinks = sinks, e->n_comp = n_comp;
    e->n_q = n_comp / KV_FIT_XQ_QSTRIDE;
    e->n_local = n_local;
    e->shard_nseq = shard_nseq;
    e->C = calloc((size_t)(n_local > 0 ? n_local : 1), sizeof *e->C);
    e->P = calloc((size_t)(n_local > 0 ? n_local : 1), sizeof *e->P);
    if (!e->C || !e->P) goto oom;
    const size_t nc = 2 * (size_t)n_kv_heads * (size_t)head_dim * (size_t)head_dim;
    for (int64_t j = 0; j < n_local; j++) {
        const size_t np = (size_t)shard_nseq[j] * (size_t)e->n_q * (size_t)n_heads * (size_t)n_comp;
        if (!(e->C[j] = malloc(nc * sizeof(double))) || !(e->P[j] = malloc((np ? np : 1) * sizeof(float)))) goto oom;
    }
    return KV_OK;
oom:
    kv_fit_xq_eta_free(e);
    return KV_ERR(KV_ENOMEM, "out of memory for XQuant's eta statistics");
}

kv_status kv_fit_xq_eta_capture(kv_fit_xq_eta *e, int64_t j, int64_t n_cal, const kv_capture *c) {
    if (!e->on) return KV_OK;
    const int H = e->n_heads, G = e->n_kv_heads, hd = e->head_dim, T = c->n_tokens, qd = c->q_dim, kvd = c->kv_dim;
    const int per = H / G;
    double *C = e->C[j];
    memset(C, 0, 2 * (size_t)G * (size_t)hd * (size_t)hd * sizeof(double));
    float *P = e->P[j];
    double *sc = malloc((size_t)T * sizeof(double));
    if (!sc) return KV_ERR(KV_ENOMEM, "out of memory for attention weights");
    const double scale = 1.0 / sqrt((double)hd);
    for (int b = 0; b < c->n_seqs; b++) {
        double *Cs = C + (size_t)(b < n_cal ? 0 : 1) * (size_t)G * (size_t)hd * (size_t)hd;
        const float *Q = c->q + (size_t)b * (size_t)T * (size_t)qd, *K = c->k + (size_t)b * (size_t)T * (size_t)kvd;
        for (int t = e->sinks; t < T; t++)
            for (int h = 0; h < H; h++) {
                const float *q = Q + (size_t)t * (size_t)qd + (size_t)h * (size_t)hd;
                double *Cg = Cs + (size_t)(h / per) * (size_t)hd * (size_t)hd;
                for (int x = 0; x < hd; x++)
                    for (int y = 0; y < hd; y++) Cg[x * hd + y] += (double)q[x] * (double)q[y];
            }
        for (int qi = 0; qi < e->n_q; qi++) {
            const int t = e->sinks + (qi + 1) * KV_FIT_XQ_QSTRIDE - 1;
            for (int h = 0; h < H; h++) {
                const float *q = Q + (size_t)t * (size_t)qd + (size_t)h * (size_t)hd;
                const int g = h / per;
                double mx = -INFINITY, sum = 0;
                for (int k = 0; k <= t; k++) {
                    const float *kk = K + (size_t)k * (size_t)kvd + (size_t)g * (size_t)hd;
                    double dot = 0;
                    for (int x = 0; x < hd; x++) dot += (double)q[x] * (double)kk[x];
                    sc[k] = dot * scale;
                    if (sc[k] > mx) mx = sc[k];
                }
                for (int k = 0; k <= t; k++) sum += (sc[k] = exp(sc[k] - mx));
                float *p = P + (((size_t)b * (size_t)e->n_q + (size_t)qi) * (size_t)H + (size_t)h) * (size_t)e->n_comp;
                for (int k = 0; k < e->n_comp; k++) {
                    const int key = e->sinks + k;
                    p[k] = key <= t ? (float)(sc[key] / sum) : 0.0f;
                }
            }
        }
    }
    free(sc);
    return KV_OK;
}

/* One sequence's error parts e0, d (n_comp x kv_dim) of stream (l, st) from its original values y. */
static kv_status eta_parts(float *e0, float *d, const kv_quant *q0, const float *y, int n_chunks, int recent, int kvd,
                           const uint32_t *partner, size_t wpc) {
    const size_t cv = (size_t)recent * (size_t)kvd;
    float *in = malloc(3 * cv * sizeof(float));
    if (!in) return KV_ERR(KV_ENOMEM, "out of memory");
    float *h0 = in + cv, *h1 = h0 + cv;
    kv_quant q1 = *q0;
    kv_quant qz = *q0;
    qz.uniform.eta = 0.0f;
    q1.uniform.eta = 0.25f;
    kv_status s = KV_OK;
    for (int ci = 0; ci < n_chunks && s == KV_OK; ci++) {
        const float *yc = y + (size_t)ci * cv;
        for (size_t k = 0; k < cv; k++) in[k] = kv_f16_to_f32(kv_f32_to_f16(yc[k]));
        const uint32_t *pc = partner ? partner + (size_t)ci * wpc : NULL;
        if ((s = kv_fit_xq_roundtrip(h0, NULL, &qz, (size_t)recent, (size_t)kvd, in, pc)) != KV_OK) break;
        if ((s = kv_fit_xq_roundtrip(h1, NULL, &q1, (size_t)recent, (size_t)kvd, in, pc)) != KV_OK) break;
        for (size_t k = 0; k < cv; k++) {
            e0[(size_t)ci * cv + k] = h0[k] - yc[k];
            d[(size_t)ci * cv + k] = 4.0f * (h1[k] - h0[k]);
        }
    }
    free(in);
    return s;
}

kv_status kv_fit_xq_eta_sums(const kv_fit_xq_eta *e, double out[6], const kv_quant *q, int st, int64_t j, int64_t n_cal,
                             const float *Y, int n_chunks, int recent, int kvd, const uint32_t *partner, size_t wpc) {
    const int H = e->n_heads, G = e->n_kv_heads, hd = e->head_dim, per = H / G, n_comp = e->n_comp;
    const int64_t nseq = e->shard_nseq[j];
    const size_t sv = (size_t)n_comp * (size_t)kvd;
    float *e0 = malloc(2 * sv * sizeof(float));
    double *o = malloc(2 * (size_t)hd * sizeof(double));
    kv_status s = e0 && o ? KV_OK : KV_ERR(KV_ENOMEM, "out of memory");
    float *d = e0 ? e0 + sv : NULL;
    for (int64_t b = 0; b < nseq && s == KV_OK; b++) {
        const uint32_t *pc = partner ? partner + (size_t)b * (size_t)n_chunks * wpc : NULL;
        if ((s = eta_parts(e0, d, q, Y + (size_t)b * sv, n_chunks, recent, kvd, pc, wpc)) != KV_OK) break;
        double *acc = out + (b < n_cal ? 0 : 3);
        if (st == KV_PLAN_K) {
            const double *Cs = e->C[j] + (size_t)(b < n_cal ? 0 : 1) * (size_t)G * (size_t)hd * (size_t)hd;
            for (int t = 0; t < n_comp; t++)
                for (int g = 0; g < G; g++) {
                    const float *u = e0 + (size_t)t * (size_t)kvd + (size_t)g * (size_t)hd;
                    const float *w = d + (size_t)t * (size_t)kvd + (size_t)g * (size_t)hd;
                    const double *Cg = Cs + (size_t)g * (size_t)hd * (size_t)hd;
                    for (int x = 0; x < hd; x++) {
                        double cu = 0, cw = 0;
                        for (int y = 0; y < hd; y++) cu += Cg[x * hd + y] * u[y], cw += Cg[x * hd + y] * w[y];
                        acc[0] += u[x] * cu, acc[1] += u[x] * cw, acc[2] += w[x] * cw;
                    }
                }
        } else {
            for (int qi = 0; qi < e->n_q; qi++)
                for (int h = 0; h < H; h++) {
                    const float *p = e->P[j] + (((size_t)b * (size_t)e->n_q + (size_t)qi) * (size_t)H + (size_t)h) * (size_t)n_comp;
                    const int g = h / per;
                    memset(o, 0, 2 * (size_t)hd * sizeof(double));
                    for (int t = 0; t < n_comp; t++) {
                        if (p[t] == 0.0f) continue;
                        const float *u = e0 + (size_t)t * (size_t)kvd + (size_t)g * (size_t)hd;
                        const float *w = d + (size_t)t * (size_t)kvd + (size_t)g * (size_t)hd;
                        for (int x = 0; x < hd; x++) o[x] += (double)p[t] * u[x], o[hd + x] += (double)p[t] * w[x];
                    }
                    for (int x = 0; x < hd; x++)
                        acc[0] += o[x] * o[x], acc[1] += o[x] * o[hd + x], acc[2] += o[hd + x] * o[hd + x];
                }
        }
    }
    free(e0);
    free(o);
    return s;
}

void kv_fit_xq_eta_choose(const double sums[6], double eta_df, double *eta, double *gain0, double *gain_df) {
    const double *c = sums, *h = sums + 3;
    double best = 0.0;
    if (c[2] > 0) best = -c[1] / c[2];
    if (!(best >= 0.0)) best = 0.0; /* also NaN */
    if (best > KV_FIT_XQ_ETA_MAX) best = KV_FIT_XQ_ETA_MAX;
    best = (double)(float)best;
    const double e_best = h[0] + 2 * best * h[1] + best * best * h[2];
    const double e_0 = h[0], e_df = h[0] + 2 * eta_df * h[1] + eta_df * eta_df * h[2];
    *eta = best;
    *gain0 = e_0 > 0 ? 1.0 - e_best / e_0 : NAN;
    *gain_df = e_df > 0 ? 1.0 - e_best / e_df : NAN;
}

/* ---- eta of a stream from the calibration data, before its quantization pass (fit.c's loop) ---------- */
typedef struct eta_job {
    kv_fit_state *r;
    int st;
    kv_quant q;
    const uint32_t *partner;
    size_t wpc;
} eta_job;

static kv_status eta_part(void *user, int64_t k, double *out) {
    eta_job *job = user;
    kv_fit_state *r = job->r;
    const int64_t j = k / r->size; /* k = rank + j * size */
    int64_t base = 0;                /* this rank's chunks before shard j */
    for (int64_t i = 0; i < j; i++) base += r->shard_nseq[i] * r->n_chunks;
    float *Y = NULL;
    kv_status s = kv_fit_store_get(&r->st, job->st == KV_PLAN_K ? KV_FIT_K : KV_FIT_V, j, 1, &Y);
    if (s != KV_OK) return s;
    return kv_fit_xq_eta_sums(&r->xqe, out, &job->q, job->st, j, kv_fit_shard_ncal(r, k), Y, r->n_chunks, r->recent, r->kv_dim,
                              job->partner ? job->partner + (size_t)base * job->wpc : NULL, job->wpc);
}

kv_status kv_fit_xq_eta_search(kv_fit_state *r, int l, int st, kv_fit_layer_report *lr) {
    lr->eta_gain_vs_0[st] = lr->eta_gain_vs_datafree[st] = NAN;
    kv_plan_stream *ps = &r->plan->layers[l].stream[st];
    if (!r->xqe.on || ps->method != KV_PLAN_UNIFORM || ps->predictor) return KV_OK;
    /* an explicit layers.N.key_eta / value_eta is kept, not calibrated over (kvcal search's refit gives an
     * AQUA-KV stream with uniform residuals the eta of its own fit that way) */
    if (kv_fit_config_stream_eta(r->cfg, l, st, NULL)) return KV_OK;
    eta_job job;
    memset(&job, 0, sizeof job);
    job.r = r;
    job.st = st;
    kv_status s = kv_quant_from_plan(&job.q, r->plan, l, st);
    if (s != KV_OK) return s;
    job.partner = job.q.shared_codes ? r->xq.prev[st] : NULL;
    job.wpc = r->xq.words[st];
    double acc[6] = {0}, res[3] = {0, NAN, NAN};
    if ((s = kv_dist_fold(r->dist, acc, 6, r->n_shards, eta_part, &job)) != KV_OK) return s;
    if (r->rank == 0) kv_fit_xq_eta_choose(acc, ps->eta, &res[0], &res[1], &res[2]);
    if ((s = kv_dist_bcast(r->dist, res, sizeof res, 0)) != KV_OK) return s;
    ps->eta = (float)res[0];
    lr->eta_gain_vs_0[st] = res[1];
    lr->eta_gain_vs_datafree[st] = res[2];
    return KV_OK;
}
