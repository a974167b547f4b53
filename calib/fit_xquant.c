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
#include "kvrt.h"

#include <stdlib.h>
#include <string.h>

int kv_fit_xq_active(const kv_fit_config *cfg) { return cfg->method == KV_FIT_XQUANT; }

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
    const kv_fit_layer_override *lo = kv_fit_config_layer(cfg, l);
    const int eta_set = lo && (lo->set & (st == KV_PLAN_K ? KV_FIT_LO_KEY_ETA : KV_FIT_LO_VALUE_ETA));
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
