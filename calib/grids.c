/* HIGGS grid generation (LBG + Lloyd on Gaussian samples), MSE, and the grid file (kv_calib.h). */
#include "kv_calib.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#define GRID_HEADER 48
#define GRID_VERSION 1u
/* Samples are split into this many fixed chunks whose partial sums are added in chunk order, so
 * the result does not depend on the number of threads. */
#define GRID_CHUNKS 64

static const uint8_t k_magic[8] = {'K', 'V', 'G', 'R', 'I', 'D', '\r', '\n'};

static int valid_shape(int d, int n) {
    return (d == 1 || d == 2 || d == 4 || d == 8) && n >= 2 && n <= 256 && (n & (n - 1)) == 0;
}

/* Normal number m of the stream for `seed` (Box-Muller on counters 2m, 2m+1: the same values
 * kv_rng_next_normal gives from a fresh kv_rng), computable in any order. */
static double normal_at(uint64_t seed, uint64_t m) {
    const double u1 = 1.0 - kv_rng_uniform(seed, 2 * m);
    const double u2 = kv_rng_uniform(seed, 2 * m + 1);
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586476925 * u2);
}

static float *draw_samples(uint64_t seed, size_t m, int d) {
    const size_t total = m * (size_t)d;
    float *x = malloc((total ? total : 1) * sizeof *x);
    if (!x) return NULL;
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < total; i++) x[i] = (float)normal_at(seed, i);
    return x;
}

static inline int nearest(const float *x, const float *c, int d, int k, float *dist) {
    int best = 0;
    float bd = INFINITY;
    for (int j = 0; j < k; j++) {
        float e = 0.0f;
        for (int t = 0; t < d; t++) {
            const float u = x[t] - c[j * d + t];
            e += u * u;
        }
        if (e < bd) {
            bd = e;
            best = j;
        }
    }
    *dist = bd;
    return best;
}

typedef struct lloyd_ws {
    double *sums;  /* GRID_CHUNKS * k * d */
    size_t *cnts;  /* GRID_CHUNKS * k */
    double err[GRID_CHUNKS];
} lloyd_ws;

/* One assignment pass: new centroids in c (empty cells refilled), returns the MSE per dimension
 * of the assignment against the old centroids. */
static double lloyd_step(float *c, const float *x, size_t m, int d, int k, lloyd_ws *ws, uint64_t seed,
                         uint64_t *rng_counter) {
    const size_t kd = (size_t)k * (size_t)d;
#pragma omp parallel for schedule(dynamic, 1)
    for (int ch = 0; ch < GRID_CHUNKS; ch++) {
        double *s = ws->sums + (size_t)ch * kd;
        size_t *n = ws->cnts + (size_t)ch * (size_t)k;
        memset(s, 0, kd * sizeof *s);
        memset(n, 0, (size_t)k * sizeof *n);
        double err = 0.0;
        const size_t lo = m * (size_t)ch / GRID_CHUNKS, hi = m * (size_t)(ch + 1) / GRID_CHUNKS;
        for (size_t i = lo; i < hi; i++) {
            const float *xi = x + i * (size_t)d;
            float dist;
            const int j = nearest(xi, c, d, k, &dist);
            for (int t = 0; t < d; t++) s[(size_t)j * (size_t)d + (size_t)t] += xi[t];
            n[j]++;
            err += dist;
        }
        ws->err[ch] = err;
    }
    double err = 0.0;
    for (int ch = 1; ch < GRID_CHUNKS; ch++) {
        for (size_t i = 0; i < kd; i++) ws->sums[i] += ws->sums[(size_t)ch * kd + i];
        for (int j = 0; j < k; j++) ws->cnts[j] += ws->cnts[(size_t)ch * (size_t)k + (size_t)j];
    }
    for (int ch = 0; ch < GRID_CHUNKS; ch++) err += ws->err[ch];
    for (int j = 0; j < k; j++)
        if (ws->cnts[j])
            for (int t = 0; t < d; t++)
                c[j * d + t] = (float)(ws->sums[(size_t)j * (size_t)d + (size_t)t] / (double)ws->cnts[j]);
    /* an empty cell moves next to the most populated centroid (deterministic perturbation) */
    for (int j = 0; j < k; j++) {
        if (ws->cnts[j]) continue;
        int big = 0;
        for (int i = 1; i < k; i++) big = ws->cnts[i] > ws->cnts[big] ? i : big;
        for (int t = 0; t < d; t++)
            c[j * d + t] = c[big * d + t] + (float)(0.01 * normal_at(seed, (*rng_counter)++));
        ws->cnts[big] /= 2;
    }
    return err / ((double)m * (double)d);
}

static int lex_less(const float *p, const float *q, int d) {
    for (int t = 0; t < d; t++) {
        if (p[t] != q[t]) return p[t] < q[t];
    }
    return 0;
}

/* Insertion sort of n <= 256 points of d <= 8 floats, lexicographic. */
static void sort_points(float *c, int d, int n) {
    float tmp[8];
    for (int i = 1; i < n; i++) {
        for (int j = i; j > 0 && lex_less(c + (size_t)j * (size_t)d, c + (size_t)(j - 1) * (size_t)d, d); j--) {
            memcpy(tmp, c + (size_t)j * (size_t)d, (size_t)d * sizeof *c);
            memcpy(c + (size_t)j * (size_t)d, c + (size_t)(j - 1) * (size_t)d, (size_t)d * sizeof *c);
            memcpy(c + (size_t)(j - 1) * (size_t)d, tmp, (size_t)d * sizeof *c);
        }
    }
}

kv_status kv_grid_generate(float **points, double *train_mse, int d, int n, const kv_grid_opts *opts) {
    *points = NULL;
    if (!valid_shape(d, n))
        return KV_ERR(KV_EINVAL, "grid: need d in {1,2,4,8} and n a power of two in 2..256 (d=%d n=%d)", d, n);
    kv_grid_opts o = {0};
    if (opts) o = *opts;
    size_t m = o.samples ? o.samples : ((size_t)n * 1000 > 131072 ? (size_t)n * 1000 : 131072);
    if (m < (size_t)n) return KV_ERR(KV_EINVAL, "grid: need at least n = %d samples (got %zu)", n, m);
    if (m > ((size_t)1 << 31)) return KV_ERR(KV_EINVAL, "grid: too many samples (%zu)", m);
    const int max_iters = o.max_iters > 0 ? o.max_iters : 200;
    const double tol = o.tol > 0.0 ? o.tol : 1e-7;
    kv_status st = KV_OK;
    float *x = draw_samples(o.seed, m, d);
    float *c = malloc((size_t)n * (size_t)d * sizeof *c);
    lloyd_ws ws;
    ws.sums = malloc((size_t)GRID_CHUNKS * (size_t)n * (size_t)d * sizeof *ws.sums);
    ws.cnts = malloc((size_t)GRID_CHUNKS * (size_t)n * sizeof *ws.cnts);
    if (!x || !c || !ws.sums || !ws.cnts) {
        st = KV_ERR(KV_ENOMEM, "grid: out of memory (%zu samples)", m);
        goto done;
    }
    /* perturbations use the counters after the samples' */
    uint64_t rng_counter = (uint64_t)m * (uint64_t)d;
    /* level 1: the sample mean */
    for (int t = 0; t < d; t++) {
        double s = 0.0;
        for (size_t i = 0; i < m; i++) s += x[i * (size_t)d + (size_t)t];
        c[t] = (float)(s / (double)m);
    }
    if (o.progress) kv_progress_begin(o.progress, "grid", "level", log2((double)n));
    double mse = 0.0;
    for (int k = 1; k < n; k *= 2) {
        /* LBG split: c +- eps r with a random direction r per centroid */
        for (int j = k - 1; j >= 0; j--) {
            for (int t = 0; t < d; t++) {
                const float r = (float)(0.01 * normal_at(o.seed, rng_counter++));
                const float v = c[j * d + t];
                c[(2 * j) * d + t] = v + r;
                c[(2 * j + 1) * d + t] = v - r;
            }
        }
        double prev = INFINITY;
        for (int it = 0; it < max_iters; it++) {
            if (o.interrupt && *o.interrupt) {
                st = KV_ERR(KV_EINTERRUPTED, "grid d=%d n=%d: interrupted while splitting to %d points", d, n, 2 * k);
                if (o.progress) kv_progress_end(o.progress);
                goto done;
            }
            mse = lloyd_step(c, x, m, d, 2 * k, &ws, o.seed, &rng_counter);
            if (prev - mse <= tol * mse) break;
            prev = mse;
        }
        if (o.progress) kv_progress_update(o.progress, log2((double)(2 * k)));
    }
    if (o.progress) kv_progress_end(o.progress);
    for (int i = 0; i < n * d; i++)
        if (!isfinite(c[i])) {
            st = KV_ERR(KV_ENUMERIC, "grid: non-finite point after training");
            goto done;
        }
    sort_points(c, d, n);
    if (train_mse) *train_mse = mse;
    *points = c;
    c = NULL;
done:
    free(x);
    free(c);
    free(ws.sums);
    free(ws.cnts);
    return st;
}

kv_status kv_grid_mse(double *mse_per_dim, const float *points, int d, int n, uint64_t seed, size_t samples) {
    *mse_per_dim = 0.0;
    if (!valid_shape(d, n) && !(n >= 1 && n <= 256 && (d == 1 || d == 2 || d == 4 || d == 8)))
        return KV_ERR(KV_EINVAL, "grid MSE: bad shape d=%d n=%d", d, n);
    if (samples == 0) return KV_ERR(KV_EINVAL, "grid MSE: need samples > 0");
    double err[GRID_CHUNKS];
#pragma omp parallel for schedule(dynamic, 1)
    for (int ch = 0; ch < GRID_CHUNKS; ch++) {
        const size_t lo = samples * (size_t)ch / GRID_CHUNKS, hi = samples * (size_t)(ch + 1) / GRID_CHUNKS;
        double e = 0.0;
        float xi[8];
        for (size_t i = lo; i < hi; i++) {
            for (int t = 0; t < d; t++) xi[t] = (float)normal_at(seed, i * (size_t)d + (size_t)t);
            const float *c = points;
            double best = INFINITY;
            for (int j = 0; j < n; j++) {
                double s = 0.0;
                for (int t = 0; t < d; t++) {
                    const double u = (double)xi[t] - (double)c[j * d + t];
                    s += u * u;
                }
                best = s < best ? s : best;
            }
            e += best;
        }
        err[ch] = e;
    }
    double total = 0.0;
    for (int ch = 0; ch < GRID_CHUNKS; ch++) total += err[ch];
    *mse_per_dim = total / ((double)samples * (double)d);
    return KV_OK;
}

static double phi(double x) { return isinf(x) ? 0.0 : exp(-0.5 * x * x) * 0.39894228040143267794; }
static double big_phi(double x) { return 0.5 * erfc(-x / 1.41421356237309504880); }
static double x_phi(double x) { return isinf(x) ? 0.0 : x * phi(x); }

kv_status kv_grid_mse_1d_exact(double *mse, const float *points, int n) {
    *mse = 0.0;
    if (n < 1 || n > 256) return KV_ERR(KV_EINVAL, "grid MSE: bad size %d", n);
    double p[256];
    for (int i = 0; i < n; i++) p[i] = points[i];
    for (int i = 1; i < n; i++) /* insertion sort (n <= 256) */
        for (int j = i; j > 0 && p[j] < p[j - 1]; j--) {
            const double t = p[j];
            p[j] = p[j - 1];
            p[j - 1] = t;
        }
    double total = 0.0;
    for (int i = 0; i < n; i++) {
        const double a = i == 0 ? -INFINITY : 0.5 * (p[i - 1] + p[i]);
        const double b = i == n - 1 ? INFINITY : 0.5 * (p[i] + p[i + 1]);
        const double c = p[i];
        /* integral over [a, b] of (x - c)^2 phi(x) dx */
        total += (big_phi(b) - x_phi(b)) - (big_phi(a) - x_phi(a)) + 2.0 * c * (phi(b) - phi(a)) +
                 c * c * (big_phi(b) - big_phi(a));
    }
    *mse = total;
    return KV_OK;
}

/* ---- file ---------------------------------------------------------------------------------------- */
kv_status kv_grid_write(const char *path, const float *points, int d, int n, uint64_t seed, uint64_t samples) {
    if (!valid_shape(d, n)) return KV_ERR(KV_EINVAL, "grid file: bad shape d=%d n=%d", d, n);
    const size_t np = (size_t)n * (size_t)d;
    const size_t size = GRID_HEADER + 4 * np;
    uint8_t *buf = malloc(size);
    if (!buf) return KV_ERR(KV_ENOMEM, "grid file: out of memory");
    memcpy(buf, k_magic, 8);
    kv_store_u32le(buf + 8, GRID_VERSION);
    kv_store_u32le(buf + 12, GRID_HEADER);
    kv_store_u32le(buf + 16, (uint32_t)d);
    kv_store_u32le(buf + 20, (uint32_t)n);
    kv_store_u64le(buf + 24, seed);
    kv_store_u64le(buf + 32, samples);
    for (size_t i = 0; i < np; i++) kv_store_f32le(buf + GRID_HEADER + 4 * i, points[i]);
    kv_store_u32le(buf + 40, (uint32_t)crc32(0L, buf + GRID_HEADER, (uInt)(4 * np)));
    kv_store_u32le(buf + 44, (uint32_t)crc32(0L, buf, 44));
    kv_status st = kv_write_file_atomic(path, buf, size);
    free(buf);
    if (st != KV_OK) return kv_error_wrap(st, "writing grid '%s': ", path);
    return KV_OK;
}

kv_status kv_grid_parse(float **points, int *d, int *n, uint64_t *seed, uint64_t *samples,
                        const uint8_t *data, size_t size) {
    *points = NULL;
    if (size < GRID_HEADER || memcmp(data, k_magic, 8) != 0)
        return KV_ERR(KV_EFORMAT, "not a grid file (bad magic or shorter than %d bytes)", GRID_HEADER);
    const uint32_t version = kv_load_u32le(data + 8);
    if (version != GRID_VERSION)
        return KV_ERR(version > GRID_VERSION ? KV_EVERSION : KV_EFORMAT,
                      "grid file version %u is not supported (this reader knows version %u)", version, GRID_VERSION);
    if ((uint32_t)crc32(0L, data, 44) != kv_load_u32le(data + 44))
        return KV_ERR(KV_ECHECKSUM, "grid file: header CRC mismatch");
    const uint32_t hsize = kv_load_u32le(data + 12), gd = kv_load_u32le(data + 16), gn = kv_load_u32le(data + 20);
    if (hsize != GRID_HEADER) return KV_ERR(KV_EFORMAT, "grid file: header size %u (expected %d)", hsize, GRID_HEADER);
    if (gd > 8 || gn > 256 || !valid_shape((int)gd, (int)gn))
        return KV_ERR(KV_EFORMAT, "grid file: bad shape d=%u n=%u", gd, gn);
    const size_t np = (size_t)gd * (size_t)gn;
    if (size != GRID_HEADER + 4 * np)
        return KV_ERR(KV_EFORMAT, "grid file: size %zu, expected %zu for d=%u n=%u", size, GRID_HEADER + 4 * np, gd, gn);
    if ((uint32_t)crc32(0L, data + GRID_HEADER, (uInt)(4 * np)) != kv_load_u32le(data + 40))
        return KV_ERR(KV_ECHECKSUM, "grid file: points CRC mismatch");
    float *p = malloc(np * sizeof *p);
    if (!p) return KV_ERR(KV_ENOMEM, "grid file: out of memory");
    for (size_t i = 0; i < np; i++) {
        p[i] = kv_load_f32le(data + GRID_HEADER + 4 * i);
        if (!isfinite(p[i])) {
            free(p);
            return KV_ERR(KV_EFORMAT, "grid file: point value %zu is not finite", i);
        }
    }
    *points = p;
    *d = (int)gd;
    *n = (int)gn;
    if (seed) *seed = kv_load_u64le(data + 24);
    if (samples) *samples = kv_load_u64le(data + 32);
    return KV_OK;
}

kv_status kv_grid_read(float **points, int *d, int *n, uint64_t *seed, uint64_t *samples, const char *path) {
    *points = NULL;
    kv_file_map m;
    kv_status st = kv_file_map_open(&m, path);
    if (st != KV_OK) return st;
    st = kv_grid_parse(points, d, n, seed, samples, m.data ? m.data : (const uint8_t *)"", m.size);
    kv_file_map_close(&m);
    if (st != KV_OK) return kv_error_wrap(st, "reading grid '%s': ", path);
    return KV_OK;
}
