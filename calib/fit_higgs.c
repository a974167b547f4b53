/* fit_higgs.c — the stream set-up of methods aqua and higgs (fitters.c): a stream coded on a HIGGS grid of
 * 2^(bits * higgs.d) points in higgs.d dimensions (higgs.n when set and the bits are the config's default),
 * groups of higgs.group_size channels. Grids are data-free (calib/grids.c), generated once per shape and kept in
 * the plan (and in a grid cache directory between runs). */
#define _POSIX_C_SOURCE 200809L
#include "fit_internal.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* HIGGS grids are data-free: one fixed seed for every plan, so that a grid cache serves every run. */
#define FIT_GRID_SEED 1u

static kv_status grid_index(kv_plan *p, int d, int n, const kv_fit_config *cfg, const kv_fit_options *opt,
                            int *index, double *seconds) {
    const char *cache_dir = opt->grid_cache_dir;
    for (int i = 0; i < p->n_grids; i++)
        if (p->grids[i].d == d && p->grids[i].n == n) {
            *index = i;
            return KV_OK;
        }
    if (n > 256)
        return KV_ERR(KV_EINVAL, "a HIGGS grid of %d points in %d dimensions is needed (bits * higgs.d = %d): grids "
                      "of at most 256 points are supported, i.e. bits * higgs.d <= 8", n, d, (int)log2((double)n));
    const double t0 = kv_now_seconds();
    float *pts = NULL;
    char *path = NULL;
    kv_status s = KV_OK;
    if (cache_dir) {
        const size_t len = strlen(cache_dir) + 128;
        path = malloc(len);
        if (!path) return KV_ERR(KV_ENOMEM, "out of memory");
        snprintf(path, len, "%s/higgs-d%d-n%d-seed%u-m%lld-it%d.grid", cache_dir, d, n, FIT_GRID_SEED,
                 (long long)cfg->higgs.grid_samples, cfg->higgs.grid_iters);
        int gd = 0, gn = 0;
        uint64_t gseed = 0, gsamples = 0;
        if (kv_grid_read(&pts, &gd, &gn, &gseed, &gsamples, path) == KV_OK &&
            !(gd == d && gn == n && gseed == FIT_GRID_SEED && gsamples == (uint64_t)cfg->higgs.grid_samples)) {
            free(pts);
            pts = NULL;
        }
        kv_error_clear();
        /* valid CRCs say the file is whole, not that its points are a grid: its MSE on fresh N(0, 1) samples
         * must be within 4x the Gaussian distortion-rate bound 2^(-2 log2(n) / d) (Lloyd-Max grids are within
         * 2.72x, the high-rate limit of the 1-D case); a degenerate one (points collapsed) is regenerated */
        double mse = 0.0;
        const double bound = pow(2.0, -2.0 * log2((double)n) / d);
        if (pts && (kv_grid_mse(&mse, pts, d, n, 0x5eedULL, 20000) != KV_OK || !(mse <= 4.0 * bound))) {
            kv_log(KV_LOG_WARN, "fit: the cached HIGGS grid %s is degenerate (MSE per dimension %.4g on fresh samples; a "
                   "sound grid of %d points in %d dimensions has at most %.4g): generating it again", path, mse, n, d,
                   4.0 * bound);
            free(pts);
            pts = NULL;
            kv_error_clear();
        }
        if (pts) kv_log(KV_LOG_INFO, "fit: HIGGS grid d = %d, n = %d from the cache %s", d, n, path);
    }
    if (!pts) {
        kv_grid_opts go;
        memset(&go, 0, sizeof go);
        go.seed = FIT_GRID_SEED;
        go.samples = (size_t)cfg->higgs.grid_samples;
        go.max_iters = cfg->higgs.grid_iters;
        go.interrupt = opt->interrupt;
        kv_log(KV_LOG_INFO, "fit: generating a HIGGS grid (d = %d, n = %d, %lld samples, %d iterations)%s", d, n,
               (long long)cfg->higgs.grid_samples, cfg->higgs.grid_iters, path ? "; it will be cached" : "");
        s = kv_grid_generate(&pts, NULL, d, n, &go);
        if (s == KV_EINTERRUPTED) {
            free(path);
            return KV_ERR(KV_EINTERRUPTED, "interrupted while generating the HIGGS grid d=%d n=%d, before layer 0%s",
                          d, n, cache_dir ? " (grids finished before are cached)" : "");
        }
        if (s != KV_OK) {
            free(path);
            return kv_error_wrap(s, "HIGGS grid d=%d n=%d: ", d, n);
        }
        if (path) { /* a cache that cannot be written only costs time */
            if (kv_mkdir_p(cache_dir) != 0 ||
                kv_grid_write(path, pts, d, n, FIT_GRID_SEED, (uint64_t)cfg->higgs.grid_samples) != KV_OK)
                kv_log(KV_LOG_WARN, "fit: could not cache the grid in %s: %s", path,
                       *kv_error_last() ? kv_error_last() : strerror(errno));
            kv_error_clear();
        }
    }
    s = kv_plan_add_grid(p, d, n, pts, index);
    free(pts);
    free(path);
    *seconds += kv_now_seconds() - t0;
    return s;
}

kv_status kv_fit_higgs_setup(const kv_fit_stream_setup *c) {
    const kv_fit_config *cfg = c->cfg;
    const int bits = c->bits;
    if (bits < 1 || bits > 8)
        return KV_ERR(KV_EINVAL, "layer %d %s stream: %d bits for HIGGS (1..8)", c->layer,
                      c->stream == KV_PLAN_K ? "key" : "value", bits);
    int n = (cfg->higgs.n && !c->explicit_bits) ? cfg->higgs.n : 1 << (bits * cfg->higgs.d > 20 ? 20 : bits * cfg->higgs.d);
    int gi;
    kv_status r = grid_index(c->plan, cfg->higgs.d, n, cfg, c->opt, &gi, c->grid_seconds);
    if (r != KV_OK) return r;
    kv_plan_stream *s = &c->plan->layers[c->layer].stream[c->stream];
    s->method = KV_PLAN_HIGGS;
    s->bits = 0;
    s->group_size = c->higgs_group;
    s->group_axis = KV_PLAN_GROUP_CHANNELS;
    s->eta = 0.0f;
    s->higgs_grid = gi;
    return KV_OK;
}
