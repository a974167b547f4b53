/* rt_selfcheck.c — the CPU-vs-device self-check (kvrt.h kv_rt_selfcheck, RUNTIME.md §10.4).
 *
 * The same synthetic sequence goes through the CPU runtime and a device runtime opened for one plan: a prompt
 * of sinks + 2 chunks + 10 tokens in one step (the prefill path, every row attended), then four decoding steps
 * (the first compresses the two chunks). Every stream's decoded cache must equal the CPU's bit for bit (the
 * device encodes with quantizers that match the CPU's). An AQUA-KV stream's prediction comes from cuBLAS on the
 * GPU, so its residual codes can flip where a value lies at a rounding boundary, and a flip moves the next
 * layers' predictions: there the device's error against the inputs must equal the CPU's within 5%. Every
 * attention output checked must lie within the runtime's bound of exact attention over what the device holds
 * (RUNTIME.md §4: computed in double over its decoded cache, with the term magnitudes of each codec). Checked
 * rows: the last 4 of the prompt and the first and last decoding rows, every query head.
 *
 * kv_rt_open runs it for a CUDA runtime the first time each kind of codec appears in the process (a kind: the
 * method and its layout, not its fitted values), and refuses the open when it fails. */
#include "kvrt.h"
#include "rt_dev.h"
#include "rt_internal.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHECK_ROWS 4     /* prompt rows checked against the bound (the last ones: they see every token) */
#define DECODE_STEPS 4   /* decoding steps; the first compresses two chunks, the first and the last are checked */

static _Thread_local int t_in_check; /* the check's own runtimes are not checked again */

/* ---- the bound --------------------------------------------------------------------------------------- */
static double gamma_n(double n) {
    const double u = ldexp(1.0, -24);
    return n * u / (1.0 - n * u);
}

/* 0: f16/f32/float rows (|x_c| per term), 1: uniform (|x_c| + 2 Z_c), 2: HIGGS (the group's norm). */
static int term_kind(const rt_codec *c) { return c->ops->bound; }

static void term_mag(int kind, int g, const float *row, const double *zmax, int hd, double *mag) {
    if (kind == 1) {
        for (int c = 0; c < hd; c++) mag[c] = fabs(row[c]) + 2.0 * zmax[c];
    } else if (kind == 2) {
        for (int a = 0; a < hd; a += g) {
            const int b = a + g < hd ? a + g : hd;
            double nk = 0;
            for (int c = a; c < b; c++) nk += (double)row[c] * row[c];
            for (int c = a; c < b; c++) mag[c] = sqrt(nk);
        }
    } else {
        for (int c = 0; c < hd; c++) mag[c] = fabs(row[c]);
    }
}

/* Rows [r0, n_q) of an attend of n_q rows against exact attention over K, V (n x hd, the device's decoded cache of
 * head h, row t = position t: a device keeps a windowed layer's tokens), masked to the layer's window W (0: none):
 * the largest error / bound, or a negative value with `what` filled when a row leaves its bound. */
static double check_rows(const kv_rt *rt, int layer, int h, int n, int n_q, int r0, int W, const float *q,
                         const float *out, const float *K, const float *V, double *work, char *what, size_t what_len) {
    const int hd = rt->head_dim, G = rt->group, qd = rt->n_heads * hd;
    const rt_codec *kc = rt_codec_of(rt, layer, KV_PLAN_K), *vc = rt_codec_of(rt, layer, KV_PLAN_V);
    const int kk = term_kind(kc), vk = term_kind(vc);
    const int gk = kk == 2 ? kc->q.higgs.group : 1, gv = vk == 2 ? vc->q.higgs.group : 1;
    double *kz = work, *vz = kz + hd, *km = vz + hd, *vm = km + (size_t)n * hd, *s = vm + (size_t)n * hd, *ref = s + n;
    for (int c = 0; c < hd; c++) kz[c] = vz[c] = 0;
    for (int t = 0; t < n; t++)
        for (int c = 0; c < hd; c++) {
            kz[c] = fmax(kz[c], fabs(K[(size_t)t * hd + c]));
            vz[c] = fmax(vz[c], fabs(V[(size_t)t * hd + c]));
        }
    for (int t = 0; t < n; t++) {
        term_mag(kk, gk, K + (size_t)t * hd, kz, hd, km + (size_t)t * hd);
        term_mag(vk, gv, V + (size_t)t * hd, vz, hd, vm + (size_t)t * hd);
    }
    const double scale = (double)rt->scale, lg = kk == 2 ? log2((double)gk) : 0.0;
    double worst = 0;
    for (int r = r0; r < n_q; r++)
        for (int g = 0; g < G; g++) {
            const float *qv = q + (size_t)r * qd + (size_t)(h * G + g) * hd;
            const int lim = n - n_q + r + 1, lo = W > 0 && lim - W > 0 ? lim - W : 0;
            double mx = -INFINITY, bmax = 0;
            for (int t = lo; t < lim; t++) {
                double acc = 0, a = 0;
                for (int c = 0; c < hd; c++) {
                    acc += (double)qv[c] * K[(size_t)t * hd + c];
                    a += fabs((double)qv[c]) * km[(size_t)t * hd + c];
                }
                s[t] = acc * scale;
                bmax = fmax(bmax, gamma_n(hd + lg + 8) * a * scale);
                mx = fmax(mx, s[t]);
            }
            double sum = 0;
            for (int t = lo; t < lim; t++) sum += (s[t] = exp(s[t] - mx));
            const double wrel = expm1(2.0 * bmax) + 1e-6;
            for (int c = 0; c < hd; c++) {
                double o = 0;
                for (int t = lo; t < lim; t++) o += s[t] * V[(size_t)t * hd + c];
                ref[c] = o / sum;
            }
            for (int c = 0; c < hd; c++) {
                double spread = 0, mag = 0;
                for (int t = lo; t < lim; t++) {
                    spread += s[t] / sum * fabs(V[(size_t)t * hd + c] - ref[c]);
                    mag += s[t] / sum * vm[(size_t)t * hd + c];
                }
                const double bound =
                    2.0 * wrel * spread + gamma_n(lim - lo + 8) * mag + gamma_n(8) * fabs(ref[c]) + 1e-30;
                const double err = fabs((double)out[(size_t)r * qd + (size_t)(h * G + g) * hd + c] - ref[c]);
                if (!(err <= bound)) {
                    snprintf(what, what_len, "layer %d query head %d row %d channel %d: output %.9g, exact %.9g "
                             "(error %.3g, %.1f x the bound %.3g)", layer, h * G + g, r, c,
                             (double)out[(size_t)r * qd + (size_t)(h * G + g) * hd + c], ref[c], err, err / bound, bound);
                    return -1.0;
                }
                worst = fmax(worst, err / bound);
            }
        }
    return worst;
}

/* ---- the synthetic sequence ------------------------------------------------------------------------- */
/* Keys with per-channel offsets and a few outlier channels, values, queries (as test_runtime draws them). */
static void fill_rows(float *k, float *v, float *q, int n, int kvd, int qd, int layer, int t0) {
    for (int i = 0; i < n; i++) {
        for (int c = 0; c < kvd; c++) {
            const uint64_t ctr = ((uint64_t)layer << 40) ^ ((uint64_t)(t0 + i) << 16) ^ (uint64_t)c;
            const double z1 = kv_rng_uniform(17u, 2 * ctr) - 0.5, z2 = kv_rng_uniform(17u ^ 0x55, 2 * ctr + 1) - 0.5;
            const double off = (c % 7 == 3) ? 3.0 : 0.3 * ((c * 37) % 11 - 5) / 5.0;
            k[(size_t)i * kvd + c] = (float)(off + 2.0 * z1);
            v[(size_t)i * kvd + c] = (float)(1.6 * z2 + 0.2 * (c % 3));
        }
        for (int c = 0; c < qd; c++) {
            const uint64_t ctr = ((uint64_t)layer << 40) ^ ((uint64_t)(t0 + i) << 16) ^ (uint64_t)c;
            q[(size_t)i * qd + c] = (float)(3.0 * (kv_rng_uniform(29u, ctr) - 0.5));
        }
    }
}

/* The RoPE frequencies of a layer's keys: a windowed layer's own when the model gave them (kv_rti_rope_table). */
static const double *layer_freq(const kv_rt *rt, int layer) {
    return rt->inv_freq_local && rt->win[layer] > 0 ? rt->inv_freq_local : rt->inv_freq;
}

/* Post-RoPE keys from pre-RoPE ones (the model's rotation: angle pos * inv_freq in double, cos/sin in float). */
static void rope_rows(float *k, const float *kpre, int n, int t0, int H, int hd, const double *freq, int adjacent) {
    const int half = hd / 2;
    memcpy(k, kpre, sizeof(float) * (size_t)n * (size_t)H * (size_t)hd);
    if (!freq) return;
    for (int i = 0; i < n; i++)
        for (int h = 0; h < H; h++) {
            float *row = k + ((size_t)i * H + (size_t)h) * (size_t)hd;
            for (int p = 0; p < half; p++) {
                const double ang = (double)(t0 + i) * freq[p];
                const int i0 = adjacent ? 2 * p : p, i1 = adjacent ? 2 * p + 1 : p + half;
                const float cs = (float)cos(ang), sn = (float)sin(ang), a = row[i0], b = row[i1];
                row[i0] = a * cs - b * sn;
                row[i1] = a * sn + b * cs;
            }
        }
}

typedef struct dbuf {
    void *p;
    size_t bytes;
} dbuf;

/* Host data to the runtime's device memory (or where it is: the host model's is the host's). */
static kv_status to_dev(kv_rt *rt, dbuf *d, const void *host, size_t bytes) {
    const rt_dev_ops *op = rt->dv->dev->ops;
    if (bytes > d->bytes) {
        op->free(rt->dv->dev, d->p);
        d->p = NULL, d->bytes = 0;
        kv_status s = op->alloc(rt->dv->dev, &d->p, bytes);
        if (s != KV_OK) return s;
        d->bytes = bytes;
    }
    return op->copy(rt->dv->dev, d->p, host, bytes, RT_COPY_H2D);
}

static const char *stream_name(int s) { return s ? "V" : "K"; }

/* The codec of (layer, stream) in words, for messages. */
static void codec_name(const kv_plan *p, int l, int s, char *buf, size_t n) {
    const kv_plan_stream *ps = &p->layers[l].stream[s];
    static const char *const methods[] = {"fp", "uniform", "higgs", "fp8-e4m3", "fp8-e5m2", "nvfp4"};
    const char *m = (int)ps->method >= 0 && (int)ps->method < 6 ? methods[ps->method] : "?";
    snprintf(buf, n, "layer %d %s: %s %d bits, group %d %s%s%s%s%s", l, stream_name(s), m, ps->bits, ps->group_size,
             ps->group_axis == KV_PLAN_GROUP_TOKENS ? "along tokens" : "along channels", ps->pre_rope ? ", pre-RoPE" : "",
             ps->predictor ? ", AQUA-KV predictor" : "", ps->share_codes_with_layer >= 0 ? ", XQuant shared codes" : "",
             ps->squat ? ", SQuat" : "");
}

static kv_status fail(kv_rt_check *rep, const char *fmt, const char *a, const char *b) {
    snprintf(rep->what, sizeof rep->what, fmt, a, b);
    return KV_ERR(KV_ENUMERIC, "runtime self-check (%s): %s", rep->device, rep->what);
}

kv_status kv_rt_selfcheck(const kv_plan *plan, const kv_rt_options *opt, kv_rt_check *report) {
    kv_rt_check dummy, *rep = report ? report : &dummy;
    memset(rep, 0, sizeof *rep);
    if (!plan || !opt || (opt->device != KV_RT_DEVICE_CUDA && opt->device != KV_RT_DEVICE_CUDA_MODEL))
        return KV_ERR(KV_EINVAL, "kv_rt_selfcheck: a plan and a device (CUDA or its host model) are needed");
    snprintf(rep->device, sizeof rep->device, "%s", opt->device == KV_RT_DEVICE_CUDA ? "cuda" : "cuda-model");
    const double t_start = kv_now_seconds();
    kv_rt_options oc = *opt, od = *opt;
    oc.device = KV_RT_DEVICE_CPU, oc.stream = NULL, oc.n_seqs = 1, oc.capacity = 0;
    od.n_seqs = 1, od.capacity = 0;
    kv_rt *cpu = NULL, *dev = NULL;
    float *kp = NULL, *k = NULL, *v = NULL, *q = NULL, *oc_out = NULL, *od_out = NULL, *K = NULL, *V = NULL, *K2 = NULL,
          *V2 = NULL;
    double *work = NULL;
    int32_t *pos = NULL;
    dbuf dk = {0}, dkp = {0}, dvv = {0}, dq = {0}, dout = {0};
    const int saved = t_in_check;
    t_in_check = 1;
    kv_status s = kv_rt_open(&cpu, plan, &oc);
    if (s == KV_OK) s = kv_rt_open(&dev, plan, &od);
    t_in_check = saved;
    if (s != KV_OK) goto done;
    /* windowed layers: the device masks and keeps every token (RUNTIME.md §10.8); the CPU reference does the same
     * here, since dropping what left a window moves where its later chunks start, and the caches are compared bit
     * for bit */
    for (int l = 0; l < cpu->n_layers; l++) cpu->evicts[l] = 0;
    {
        const int L = cpu->n_layers, H = cpu->n_kv_heads, hd = cpu->head_dim, kvd = cpu->kv_dim, qd = cpu->n_heads * hd;
        /* a prompt long enough for the widest layer window to bite (its rows then see a window, not everything) */
        int wmax = 0;
        for (int l = 0; l < L; l++) wmax = cpu->win[l] > wmax ? cpu->win[l] : wmax;
        const int P0 = cpu->sinks + 2 * cpu->recent + 10, P = wmax + cpu->recent + 10 > P0 ? wmax + cpu->recent + 10 : P0;
        const int T = P + DECODE_STEPS;
        const int adjacent = opt->rope_layout == KV_ROPE_ADJACENT;
        kp = malloc(sizeof(float) * (size_t)P * kvd), k = malloc(sizeof(float) * (size_t)P * kvd);
        v = malloc(sizeof(float) * (size_t)P * kvd), q = malloc(sizeof(float) * (size_t)P * qd);
        oc_out = malloc(sizeof(float) * (size_t)P * qd), od_out = malloc(sizeof(float) * (size_t)P * qd);
        K = malloc(sizeof(float) * (size_t)T * hd), V = malloc(sizeof(float) * (size_t)T * hd);
        K2 = malloc(sizeof(float) * (size_t)T * hd), V2 = malloc(sizeof(float) * (size_t)T * hd);
        work = malloc(sizeof(double) * ((size_t)4 * hd + (size_t)2 * T * hd + (size_t)T + 8));
        pos = malloc(sizeof(int32_t) * (size_t)T);
        if (!kp || !k || !v || !q || !oc_out || !od_out || !K || !V || !K2 || !V2 || !work || !pos) {
            s = KV_ERR(KV_ENOMEM, "runtime self-check: out of memory");
            goto done;
        }
        for (int i = 0; i < T; i++) pos[i] = i;
        int len = 0;
        for (int step = 0; step <= DECODE_STEPS && s == KV_OK; step++) {
            const int n = step == 0 ? P : 1;
            for (int l = 0; l < L && s == KV_OK; l++) {
                fill_rows(kp, v, q, n, kvd, qd, l, len);
                rope_rows(k, kp, n, len, H, hd, layer_freq(cpu, l), adjacent);
                const size_t kb = sizeof(float) * (size_t)n * kvd, qb = sizeof(float) * (size_t)n * qd;
                if ((s = kv_rt_append(cpu, l, 0, n, pos + len, kp, k, v, (size_t)kvd)) != KV_OK ||
                    (s = kv_rt_attend(cpu, l, 0, n, q, (size_t)qd, oc_out, (size_t)qd)) != KV_OK)
                    break;
                if ((s = to_dev(dev, &dkp, kp, kb)) != KV_OK || (s = to_dev(dev, &dk, k, kb)) != KV_OK ||
                    (s = to_dev(dev, &dvv, v, kb)) != KV_OK || (s = to_dev(dev, &dq, q, qb)) != KV_OK)
                    break;
                if (dout.bytes < qb) {
                    dev->dv->dev->ops->free(dev->dv->dev, dout.p);
                    dout.p = NULL, dout.bytes = 0;
                    if ((s = dev->dv->dev->ops->alloc(dev->dv->dev, &dout.p, qb)) != KV_OK) break;
                    dout.bytes = qb;
                }
                if ((s = kv_rt_append(dev, l, 0, n, pos + len, dkp.p, dk.p, dvv.p, (size_t)kvd)) != KV_OK ||
                    (s = kv_rt_attend(dev, l, 0, n, dq.p, (size_t)qd, dout.p, (size_t)qd)) != KV_OK ||
                    (s = dev->dv->dev->ops->copy(dev->dv->dev, od_out, dout.p, qb, RT_COPY_D2H)) != KV_OK)
                    break;
                /* the attention outputs against the bound, over the device's decoded cache */
                const int r0 = n > CHECK_ROWS ? n - CHECK_ROWS : 0;
                for (int h = 0; h < H && s == KV_OK && (step == 0 || step == 1 || step == DECODE_STEPS); h++) {
                    const int held = kv_rt_held(dev, l, 0, h);
                    if ((s = kv_rt_decode_head(dev, l, 0, h, K, V)) != KV_OK) break;
                    const double w =
                        check_rows(cpu, l, h, held, n, r0, cpu->win[l], q, od_out, K, V, work, rep->what, sizeof rep->what);
                    if (w < 0) {
                        char cn[160], msg[sizeof rep->what];
                        codec_name(plan, l, 0, cn, sizeof cn);
                        memcpy(msg, rep->what, sizeof msg);
                        s = fail(rep, "attention outside the bound: %.170s (%.110s)", msg, cn);
                        break;
                    }
                    rep->worst_ratio = fmax(rep->worst_ratio, w);
                    rep->rows_checked += (uint64_t)(n - r0) * (uint64_t)cpu->group;
                }
            }
            len += n;
        }
        /* the decoded caches; the inputs again (fill_rows draws by position) for the predicted streams' errors */
        float *xk = malloc(sizeof(float) * (size_t)T * kvd), *xv = malloc(sizeof(float) * (size_t)T * kvd);
        float *xq = malloc(sizeof(float) * (size_t)T * qd), *xkp = malloc(sizeof(float) * (size_t)T * kvd);
        if (!xk || !xv || !xq || !xkp) s = KV_ERR(KV_ENOMEM, "runtime self-check: out of memory");
        for (int l = 0; l < L && s == KV_OK; l++) {
            fill_rows(xkp, xv, xq, T, kvd, qd, l, 0);
            rope_rows(xk, xkp, T, 0, H, hd, layer_freq(cpu, l), adjacent);
            for (int h = 0; h < H && s == KV_OK; h++) {
                const int n = kv_rt_held(cpu, l, 0, h);
                if (n != kv_rt_held(dev, l, 0, h)) {
                    s = fail(rep, "%s%s", "the devices hold different numbers of tokens", "");
                    break;
                }
                if ((s = kv_rt_decode_head(cpu, l, 0, h, K, V)) != KV_OK || (s = kv_rt_decode_head(dev, l, 0, h, K2, V2)) != KV_OK)
                    break;
                for (int st = 0; st < 2; st++) {
                    const float *a = st ? V : K, *b = st ? V2 : K2, *x = st ? xv : xk;
                    const int predicted = rt_codec_of(cpu, l, st)->pred != NULL;
                    uint64_t differ_n = 0;
                    double e_cpu = 0, e_dev = 0;
                    for (int t = 0; t < n; t++) {
                        double mx = 0;
                        for (int c = 0; c < hd; c++) mx = fmax(mx, fabs(a[(size_t)t * hd + c]));
                        for (int c = 0; c < hd; c++) {
                            const double y_c = a[(size_t)t * hd + c], y_d = b[(size_t)t * hd + c];
                            const double xi = x[(size_t)t * kvd + (size_t)h * hd + (size_t)c];
                            const int differ = memcmp(&a[(size_t)t * hd + c], &b[(size_t)t * hd + c], sizeof(float)) != 0;
                            differ_n += (uint64_t)differ;
                            if (differ && mx > 0) rep->max_recon_rel = fmax(rep->max_recon_rel, fabs(y_c - y_d) / mx);
                            e_cpu += (y_c - xi) * (y_c - xi);
                            e_dev += (y_d - xi) * (y_d - xi);
                        }
                    }
                    rep->values_compared += (uint64_t)n * (uint64_t)hd;
                    rep->values_differing += differ_n;
                    const int bad = predicted ? !(fabs(e_dev - e_cpu) <= 0.05 * e_cpu + 1e-12) : differ_n > 0;
                    if (bad) {
                        char cn[160], msg[120];
                        codec_name(plan, l, st, cn, sizeof cn);
                        if (predicted)
                            snprintf(msg, sizeof msg, "head %d: reconstruction error %.4g against the CPU's %.4g", h, e_dev, e_cpu);
                        else
                            snprintf(msg, sizeof msg, "head %d: %llu of %llu decoded values differ", h,
                                     (unsigned long long)differ_n, (unsigned long long)n * (unsigned long long)hd);
                        s = fail(rep, "the compressed cache differs from the CPU's: %.110s (%.150s)", msg, cn);
                        break;
                    }
                }
            }
        }
        free(xk), free(xv), free(xq), free(xkp);
    }
done:
    if (dev && dev->dv) {
        const rt_dev_ops *op = dev->dv->dev->ops;
        op->free(dev->dv->dev, dk.p), op->free(dev->dv->dev, dkp.p), op->free(dev->dv->dev, dvv.p);
        op->free(dev->dv->dev, dq.p), op->free(dev->dv->dev, dout.p);
    }
    kv_rt_close(cpu);
    kv_rt_close(dev);
    free(kp), free(k), free(v), free(q), free(oc_out), free(od_out), free(K), free(V), free(K2), free(V2), free(work),
        free(pos);
    rep->seconds = kv_now_seconds() - t_start;
    rep->passed = s == KV_OK;
    return s;
}

/* ---- the guard of kv_rt_open --------------------------------------------------------------------------- */
/* A codec's kind: what decides which kernel paths run (not the fitted values). */
static uint64_t codec_kind_hash(const kv_plan *p, int l, int st, int n_heads) {
    const kv_plan_stream *s = &p->layers[l].stream[st];
    const int gd = s->higgs_grid >= 0 && s->higgs_grid < p->n_grids ? p->grids[s->higgs_grid].d : 0;
    const int gn = s->higgs_grid >= 0 && s->higgs_grid < p->n_grids ? p->grids[s->higgs_grid].n : 0;
    const int fields[] = {st, (int)s->method, s->bits, s->group_size, (int)s->group_axis, s->scale_dtype,
                          s->eta != 0.0f, (int)s->pack, s->share_codes_with_layer >= 0, gd, gn, s->pre_rope,
                          s->rpc_ratio > 0.0f, s->predictor != NULL, s->squat ? 1 + s->squat->static_subspace : 0,
                          s->n_fp_scales, p->fingerprint.n_kv_heads, p->fingerprint.head_dim, n_heads,
                          p->layers[l].window > 0};
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++) h = (h ^ (uint64_t)(uint32_t)fields[i]) * 1099511628211ull;
    return h;
}

#define SEEN_MAX 4096
static pthread_mutex_t g_seen_lock = PTHREAD_MUTEX_INITIALIZER;
static uint64_t g_seen[SEEN_MAX];
static int g_n_seen;

static int seen(uint64_t h) {
    for (int i = 0; i < g_n_seen; i++)
        if (g_seen[i] == h) return 1;
    return 0;
}

kv_status kv_rti_selfcheck_guard(const kv_plan *plan, const kv_rt_options *opt) {
    if (t_in_check || opt->device != KV_RT_DEVICE_CUDA) return KV_OK;
    uint64_t hs[2 * 512];
    int n = 0, fresh = 0;
    for (int l = 0; l < plan->n_layers; l++)
        for (int st = 0; st < 2 && n < 2 * 512; st++) hs[n++] = codec_kind_hash(plan, l, st, opt->n_heads);
    pthread_mutex_lock(&g_seen_lock);
    for (int i = 0; i < n; i++) fresh |= !seen(hs[i]);
    pthread_mutex_unlock(&g_seen_lock);
    if (!fresh) return KV_OK;
    kv_rt_check rep;
    const kv_status s = kv_rt_selfcheck(plan, opt, &rep);
    if (s != KV_OK)
        return kv_error_wrap(s, "the CUDA runtime failed its self-check against the CPU (kvrun selfcheck --device cuda "
                             "shows every codec): ");
    pthread_mutex_lock(&g_seen_lock);
    for (int i = 0; i < n && g_n_seen < SEEN_MAX; i++)
        if (!seen(hs[i])) g_seen[g_n_seen++] = hs[i];
    pthread_mutex_unlock(&g_seen_lock);
    return KV_OK;
}
