/* The device attention's element math and work decomposition (kernels/kv_attn_math.h, RUNTIME.md §10), each piece
 * against something independent of it: the runtime's exp; the quantizers' own decoders (kv_*_decode_ref) for every
 * decoding unit of every layout (word-aligned rows, token-group words, element by element, HIGGS in the rotated and
 * the real domain, FP8 / NVFP4, f16 / f32 rows) over sub-ranges of blocks with unaligned ends; the split of the
 * tokens among thread blocks (coverage, limits, shared memory); the combine of partial softmaxes against double
 * precision; the pieces a tile is cut into against a token-by-token classification. */
#include "kv_test.h"
#include "kv_attn_math.h"
#include "kv_kernels_internal.h"
#include "kvrt.h"
#include "rt_dev.h"
#include "rt_internal.h"

#include <math.h>

static float *randn(size_t n, uint64_t seed, float scale) {
    float *x = malloc((n ? n : 1) * sizeof *x);
    kv_rng r;
    kv_rng_init(&r, seed);
    for (size_t i = 0; i < n; i++) x[i] = (float)kv_rng_next_normal(&r) * scale + (i % 7 == 3 ? 2.0f : 0.0f);
    return x;
}

START_TEST(exp_is_the_runtimes) {
    for (double x = -104.0; x <= 0.0; x += 1.0 / 512) {
        float a = (float)x;
        const float got = kv_da_exp(a);
        kv_rti_exp_portable(&a, 1);
        ck_assert_msg(memcmp(&got, &a, sizeof a) == 0, "exp(%.9g): %.9g vs the runtime's %.9g", x, got, a);
    }
    ck_assert_float_eq(kv_da_exp(-INFINITY), 0.0f);
    ck_assert_float_eq(kv_da_exp(0.0f), 1.0f);
}
END_TEST

/* ---- decoding units ----------------------------------------------------------------------------- */
typedef struct ucase {
    int kind;        /* KV_DC_UNIFORM / HIGGS / FLOAT / F16 / F32 */
    int H, hd, m;
    int bits, group, axis, pack11, ptype; /* uniform */
    int d, n, g, real;                    /* HIGGS: grid, group, real domain (keys before RoPE) */
    int fmt, per_head;                    /* float */
} ucase;

#define UNI(H, hd, m, b, G, ax, p11, pt) {KV_DC_UNIFORM, H, hd, m, b, G, ax, p11, pt, 0, 0, 0, 0, 0, 0}
#define HIG(H, hd, m, d, n, g, real) {KV_DC_HIGGS, H, hd, m, 0, 0, 0, 0, 0, d, n, g, real, 0, 0}
#define FLT(H, hd, m, fmt, ph) {KV_DC_FLOAT, H, hd, m, 0, 0, 0, 0, 0, 0, 0, 0, 0, fmt, ph}
static const ucase k_ucases[] = {
    UNI(3, 64, 128, 2, 32, KV_AXIS_TOKENS, 0, KV_PARAM_F16),   UNI(3, 64, 128, 2, 32, KV_AXIS_CHANNELS, 0, KV_PARAM_F16),
    UNI(3, 64, 100, 2, 32, KV_AXIS_TOKENS, 0, KV_PARAM_F32),   UNI(2, 32, 37, 4, 16, KV_AXIS_TOKENS, 0, KV_PARAM_F16),
    UNI(2, 32, 128, 4, 8, KV_AXIS_CHANNELS, 0, KV_PARAM_F32),  UNI(2, 64, 96, 2, 8, KV_AXIS_CHANNELS, 0, KV_PARAM_F16),
    UNI(1, 64, 64, 1, 32, KV_AXIS_TOKENS, 0, KV_PARAM_F16),    UNI(1, 64, 64, 1, 64, KV_AXIS_CHANNELS, 0, KV_PARAM_F16),
    UNI(2, 64, 128, 3, 32, KV_AXIS_TOKENS, 1, KV_PARAM_F16),   UNI(2, 64, 128, 3, 32, KV_AXIS_CHANNELS, 0, KV_PARAM_F16),
    UNI(2, 64, 128, 8, 64, KV_AXIS_CHANNELS, 0, KV_PARAM_F32), UNI(2, 9, 21, 2, 4, KV_AXIS_CHANNELS, 0, KV_PARAM_F16),
    UNI(2, 9, 40, 2, 8, KV_AXIS_TOKENS, 0, KV_PARAM_F16),      UNI(4, 32, 128, 2, 128, KV_AXIS_CHANNELS, 0, KV_PARAM_F16),
    HIG(3, 64, 64, 2, 16, 64, 0),                              HIG(2, 64, 33, 2, 256, 32, 0),
    HIG(2, 32, 40, 1, 8, 32, 0),                               HIG(2, 32, 40, 4, 256, 16, 0),
    HIG(3, 64, 64, 2, 16, 64, 1),                              HIG(2, 64, 20, 8, 256, 32, 1),
    FLT(3, 64, 50, KV_FP_E4M3, 0),                             FLT(3, 64, 50, KV_FP_E4M3, 1),
    FLT(3, 9, 30, KV_FP_E5M2, 1),                              FLT(2, 64, 50, KV_FP_NVFP4, 0),
    FLT(2, 40, 30, KV_FP_NVFP4, 0),                            FLT(2, 32, 30, KV_FP_NVFP4, 1),
    {KV_DC_F16, 3, 64, 40, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},   {KV_DC_F32, 2, 9, 40, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
};

/* Encode x (m x C) as the case says into blk (+ codec); x_hat = the quantizer's own decode. */
typedef struct ublock {
    kv_dcodec c;
    kv_dblock b;
    uint8_t *data;
    float *grid, *signs, *scales, *lut, *x_hat;
} ublock;

static void make_block(const ucase *u, const float *x, ublock *o) {
    const int C = u->H * u->hd, m = u->m;
    memset(o, 0, sizeof *o);
    o->c.kind = u->kind, o->c.kv_dim = C, o->c.head_dim = u->hd;
    o->x_hat = malloc(sizeof(float) * (size_t)m * C);
    kv_quant q;
    memset(&q, 0, sizeof q);
    kv_block_storage st;
    if (u->kind == KV_DC_F16 || u->kind == KV_DC_F32) {
        const size_t es = u->kind == KV_DC_F16 ? 2 : 4;
        o->data = malloc(es * (size_t)m * C);
        for (size_t i = 0; i < (size_t)m * C; i++) {
            if (es == 2) {
                ((uint16_t *)o->data)[i] = kv_f32_to_f16(x[i]);
                o->x_hat[i] = kv_f16_to_f32(((uint16_t *)o->data)[i]);
            } else {
                ((float *)o->data)[i] = o->x_hat[i] = x[i];
            }
        }
        o->b.codes = (const uint32_t *)o->data, o->b.t0 = 0, o->b.m = m;
        return;
    }
    if (u->kind == KV_DC_UNIFORM) {
        q.kind = KV_QUANT_UNIFORM;
        q.uniform = (kv_uniform){u->bits, u->group, (kv_axis)u->axis, (kv_param_type)u->ptype, u->pack11, 0.03f};
    } else if (u->kind == KV_DC_HIGGS) {
        o->grid = randn((size_t)u->d * u->n, 99, 1.0f);
        q.kind = KV_QUANT_HIGGS;
        q.higgs = (kv_higgs){u->d, u->n, u->g, KV_PARAM_F16, 1234, o->grid, NULL, 0};
    } else {
        const int ns = u->per_head ? u->H : 1;
        o->scales = malloc(sizeof(float) * (size_t)ns);
        for (int h = 0; h < ns; h++) o->scales[h] = (u->fmt == KV_FP_NVFP4 ? 0.002f : u->fmt == KV_FP_E4M3 ? 0.01f : 0.5f) * (1 + h);
        q.kind = KV_QUANT_FP;
        q.fp = (kv_fpq){(kv_fp_format)u->fmt, ns, ns > 1 ? u->hd : 0, o->scales};
    }
    ck_assert_kv_ok(kv_quant_storage(&st, &q, (size_t)m, (size_t)C));
    o->data = calloc(1, (size_t)st.total_bytes + 16);
    uint32_t *codes = (uint32_t *)o->data;
    uint8_t *params = o->data + st.code_bytes;
    const uint8_t *zeros = params + (u->kind == KV_DC_UNIFORM ? st.scale_bytes : 0);
    o->c.bits = u->kind == KV_DC_HIGGS ? kv_higgs_index_bits(u->n) : u->kind == KV_DC_FLOAT ? kv_qm_fp_bits(u->fmt) : u->bits;
    o->c.per_word = kv_qm_per_word(o->c.bits, u->kind == KV_DC_UNIFORM ? u->pack11 : 0);
    if (u->kind == KV_DC_UNIFORM) {
        ck_assert_kv_ok(kv_uniform_encode_ref(codes, params, (void *)zeros, &q.uniform, (size_t)m, (size_t)C, x));
        ck_assert_kv_ok(kv_uniform_decode_ref(o->x_hat, &q.uniform, (size_t)m, (size_t)C, codes, params, zeros));
        o->c.axis = u->axis, o->c.group = u->group, o->c.ptype = u->ptype;
        o->c.word_aligned = C % o->c.per_word == 0 && u->hd % o->c.per_word == 0;
    } else if (u->kind == KV_DC_HIGGS) {
        ck_assert_kv_ok(kv_higgs_encode_ref(codes, params, &q.higgs, (size_t)m, (size_t)C, x));
        ck_assert_kv_ok(kv_higgs_decode_ref(o->x_hat, &q.higgs, (size_t)m, (size_t)C, codes, params));
        o->signs = malloc(sizeof(float) * (size_t)C);
        for (int ch = 0; ch < C; ch++) o->signs[ch] = kv_qm_higgs_sign(1234, (size_t)ch);
        o->c.hdim = u->d, o->c.hgroup = u->g, o->c.ntype = KV_PARAM_F16, o->c.grid = o->grid, o->c.signs = o->signs;
        o->c.rotated = !u->real;
    } else {
        ck_assert_kv_ok(kv_fpq_encode_ref(codes, params, &q.fp, (size_t)m, (size_t)C, x));
        ck_assert_kv_ok(kv_fpq_decode_ref(o->x_hat, &q.fp, (size_t)m, (size_t)C, codes, params));
        const int nl = u->fmt == KV_FP_NVFP4 ? 16 : 256;
        o->lut = malloc(sizeof(float) * (size_t)nl);
        for (int i = 0; i < nl; i++) o->lut[i] = kv_qm_fp_decode(u->fmt, (uint32_t)i);
        o->c.fformat = u->fmt, o->c.n_scales = q.fp.n_scales, o->c.scale_channels = q.fp.scale_channels;
        o->c.scales = o->scales, o->c.lut = o->lut;
        o->c.word_aligned = C % o->c.per_word == 0 && u->hd % o->c.per_word == 0;
    }
    o->b.codes = codes, o->b.params = params, o->b.zeros = zeros, o->b.t0 = 0, o->b.m = m;
}

static void free_block(ublock *o) {
    free(o->data), free(o->grid), free(o->signs), free(o->scales), free(o->lut), free(o->x_hat);
}

/* Rows [r0, r1) of head h through the units of one piece, against the quantizer's decode. Uniform values are formed
 * with one fused multiply-add (the quantizer's decode rounds the product first): within one rounding of the
 * terms; HIGGS in the rotated domain is transformed back here (D H) and compared within the transform's rounding;
 * everything else bit for bit. */
static void check_piece(const ucase *u, const ublock *o, int h, int r0, int r1, const char *what) {
    const int hd = u->hd, C = u->H * hd, ld = hd + 4, rows = r1 - r0;
    kv_dpiece p;
    memset(&p, 0, sizeof p);
    p.u0 = 3, p.u1 = 3 + rows, p.r0 = r0; /* destination rows start at 3: the piece's u0 must be honoured */
    if (u->kind == KV_DC_F16 || u->kind == KV_DC_F32) {
        const size_t es = u->kind == KV_DC_F16 ? 2 : 4;
        p.kind = u->kind == KV_DC_F16 ? KV_DP_F16 : KV_DP_F32;
        p.rows = o->data + ((size_t)r0 * C + (size_t)h * hd) * es;
    } else {
        p.kind = KV_DP_BLOCK, p.blk = o->b;
    }
    p.units = kv_da_piece_units(&o->c, &p);
    float *dst = malloc(sizeof(float) * (size_t)(rows + 3) * ld);
    for (size_t i = 0; i < (size_t)(rows + 3) * ld; i++) dst[i] = NAN;
    for (int unit = p.units - 1; unit >= 0; unit--) kv_da_decode_unit(&o->c, &p, h, unit, dst, ld, 0); /* any order */
    for (int i = 0; i < 3 * ld; i++) ck_assert_msg(isnan(dst[i]), "%s: a unit wrote above its piece", what);
    for (int i = 0; i < rows; i++) {
        float *row = dst + (size_t)(3 + i) * ld;
        const float *want = o->x_hat + (size_t)(r0 + i) * C + (size_t)h * hd;
        if (u->kind == KV_DC_HIGGS && o->c.rotated) /* back to the real domain: x = D H v */
            for (int a = 0; a < hd; a += u->g) {
                kv_qm_fwht(row + a, (size_t)u->g);
                for (int k = 0; k < u->g; k++) row[a + k] *= o->signs[h * hd + a + k];
            }
        for (int c = 0; c < hd; c++) {
            ck_assert_msg(!isnan(row[c]), "%s: row %d channel %d not written", what, r0 + i, c);
            double tol = 0;
            if (u->kind == KV_DC_UNIFORM) tol = 4.0 * ldexp(fabs(want[c]) + 8.0, -23);
            if (u->kind == KV_DC_HIGGS && o->c.rotated) tol = 1e-5 * (1.0 + fabs(want[c])) * u->g;
            ck_assert_msg(fabs((double)row[c] - want[c]) <= tol, "%s: row %d head %d channel %d: %.9g, decode %.9g", what,
                          r0 + i, h, c, row[c], want[c]);
        }
    }
    free(dst);
}

START_TEST(units_match_the_decoders) {
    const ucase *u = &k_ucases[_i];
    const int C = u->H * u->hd;
    float *x = randn((size_t)u->m * C, 500 + (uint64_t)_i, 1.3f);
    ublock o;
    make_block(u, x, &o);
    const int cuts[][2] = {{0, u->m}, {1, u->m}, {0, u->m - 3 > 0 ? u->m - 3 : u->m}, {5 < u->m ? 5 : 0, u->m / 2 + 1},
                           {u->m / 3, u->m / 3 + 1}};
    char what[96];
    for (int h = 0; h < u->H; h++)
        for (size_t k = 0; k < sizeof cuts / sizeof cuts[0]; k++) {
            if (cuts[k][1] <= cuts[k][0]) continue;
            snprintf(what, sizeof what, "case %d head %d rows %d..%d", _i, h, cuts[k][0], cuts[k][1]);
            check_piece(u, &o, h, cuts[k][0], cuts[k][1], what);
        }
    /* the reconstruction units: the whole block, every head, added to what is there (real domain) */
    if (u->kind != KV_DC_HIGGS || !u->real) {
        kv_dcodec rc = o.c;
        rc.rotated = 0;
        float *acc = malloc(sizeof(float) * (size_t)u->m * C);
        for (size_t i = 0; i < (size_t)u->m * C; i++) acc[i] = 0.5f;
        const int units = kv_da_recon_units(&rc, &o.b);
        for (int unit = 0; unit < units; unit++) kv_da_recon_unit(&rc, &o.b, unit, acc);
        for (size_t i = 0; i < (size_t)u->m * C; i++) {
            const double want = 0.5 + o.x_hat[i];
            const double tol = u->kind == KV_DC_UNIFORM ? 8.0 * ldexp(fabs(o.x_hat[i]) + 8.0, -23) : ldexp(fabs(want), -23);
            ck_assert_msg(fabs(acc[i] - want) <= tol, "case %d reconstruction value %zu: %.9g vs %.9g", _i, i, acc[i], want);
        }
        free(acc);
    }
    free_block(&o);
    free(x);
}
END_TEST

/* ---- work decomposition ----------------------------------------------------------------------------- */
START_TEST(configure_covers_every_token) {
    const int hds[] = {9, 64, 128, 256}, Gs[] = {1, 3, 8, 16}, nqs[] = {1, 2, 5, 64, 513}, seqs[] = {1, 8, 32};
    const int ns[] = {1, 63, 64, 65, 4096, 32768, 1 << 20};
    for (size_t a = 0; a < 4; a++)
        for (size_t b = 0; b < 4; b++)
            for (size_t c = 0; c < 5; c++)
                for (size_t d = 0; d < 3; d++)
                    for (size_t e = 0; e < 7; e++) {
                        if (nqs[c] > ns[e]) continue;
                        kv_dattn A;
                        memset(&A, 0, sizeof A);
                        A.hd = hds[a], A.G = Gs[b], A.n_q = nqs[c], A.n_seqs = seqs[d], A.H = 3;
                        A.codec[0].kind = A.codec[1].kind = KV_DC_HIGGS, A.codec[0].rotated = A.codec[1].rotated = 1;
                        kv_rti_dev_configure(&A, ns[e]);
                        ck_assert_int_eq(A.split % A.tile, 0);
                        ck_assert_int_le(A.split, KV_DA_MAX_SPLIT);
                        ck_assert_int_ge((long)A.split * A.n_splits, ns[e]);
                        ck_assert_int_lt((long)A.split * (A.n_splits - 1), ns[e]);
                        ck_assert_int_ge(A.rows_per_block, 1);
                        ck_assert_int_ge((long)A.rows_per_block * A.n_rowblocks, A.n_q);
                        ck_assert_int_le(A.rows_per_block * A.G, A.hd <= 128 ? 32 : 16 > A.G ? 16 : A.G);
                        /* enough blocks to fill a GPU when the tokens allow it */
                        const long blocks = (long)A.n_seqs * A.H * A.n_rowblocks * A.n_splits;
                        ck_assert(blocks >= KV_DA_TARGET_BLOCKS || A.split == A.tile || A.n_splits * A.split >= ns[e]);
                        /* shared memory within an H100's 227 KiB opt-in */
                        ck_assert_uint_le(kv_da_smem_bytes(&A, A.rows_per_block * A.G), 227u * 1024u);
                    }
}
END_TEST

START_TEST(combine_matches_double) {
    kv_dattn A;
    memset(&A, 0, sizeof A);
    A.n_seqs = 1, A.n_q = 2, A.H = 2, A.G = 3, A.hd = 9, A.n_splits = 7, A.ldo = A.H * A.G * A.hd;
    const size_t w = (size_t)A.hd + 2, n = (size_t)A.H * A.n_q * A.G * A.n_splits * w;
    float *part = malloc(sizeof(float) * n), *out = malloc(sizeof(float) * (size_t)A.n_q * A.ldo);
    kv_rng r;
    kv_rng_init(&r, 3);
    for (size_t i = 0; i < n; i++) part[i] = (float)kv_rng_next_normal(&r);
    for (size_t s = 0; s < n / w; s++) {
        part[s * w] = (float)(10.0 * kv_rng_uniform(4, s) - 20.0); /* maxima far apart */
        part[s * w + 1] = (float)(1.0 + 50.0 * kv_rng_uniform(5, s));
        if (s % 5 == 2) part[s * w] = -INFINITY, part[s * w + 1] = 0; /* an empty split */
    }
    A.seq[0].part = part, A.seq[0].out = out;
    for (int h = 0; h < A.H; h++)
        for (int row = 0; row < A.n_q; row++)
            for (int g = 0; g < A.G; g++)
                for (int c = 0; c < A.hd; c++) {
                    kv_da_combine_channel(&A, 0, h, row, g, c);
                    const float *p0 = part + kv_da_part_index(&A, h, row, g, 0);
                    double M = -INFINITY, l = 0, o = 0;
                    for (int s = 0; s < A.n_splits; s++) M = fmax(M, p0[s * w]);
                    for (int s = 0; s < A.n_splits; s++)
                        if (p0[s * w] != -INFINITY) {
                            const double e = exp((double)p0[s * w] - M);
                            l += e * p0[s * w + 1];
                            o += e * p0[s * w + 2 + c];
                        }
                    const double want = o / l, got = out[(size_t)row * A.ldo + (size_t)(h * A.G + g) * A.hd + c];
                    ck_assert_msg(fabs(got - want) <= 2e-6 * (fabs(want) + 1e-3) + 1e-7, "combine: %.9g vs %.9g", got, want);
                }
    free(part), free(out);
}
END_TEST

/* A stream: sinks, blocks of uneven sizes (RPC makes small ones), the window; every tile cut into pieces must cover
 * its tokens in order with the right source of each (a token-by-token classification decides), at most
 * KV_DA_MAX_PIECES pieces, ending early only when they ran out. */
START_TEST(pieces_cover_the_tile) {
    const int sinks = 4, hd = 8, H = 2, kvd = H * hd;
    int sizes[64], nb = 0, t = sinks;
    kv_rng r;
    kv_rng_init(&r, 11);
    while (nb < 40) {
        sizes[nb] = 1 + (int)(kv_rng_next_u64(&r) % (nb % 3 ? 3 : 40));
        t += sizes[nb++];
    }
    const int comp_end = t, n = comp_end + 21;
    kv_dblock blocks[64];
    for (int b = 0, t0 = sinks; b < nb; t0 += sizes[b++])
        blocks[b] = (kv_dblock){(const uint32_t *)(uintptr_t)(0x10000u * (b + 1)), NULL, NULL, t0, sizes[b]};
    uint16_t fp[64 * 16];
    kv_dstream st = {fp, blocks, NULL, nb, comp_end};
    kv_dcodec c;
    memset(&c, 0, sizeof c);
    c.kind = KV_DC_UNIFORM, c.kv_dim = kvd, c.head_dim = hd, c.bits = 2, c.per_word = 16, c.group = 1;
    c.axis = KV_AXIS_CHANNELS, c.word_aligned = 0;
    for (int a = 0; a < n; a += 7)
        for (int e = a + 1; e <= n && e <= a + 64; e += 9) {
            kv_dpiece pc[KV_DA_MAX_PIECES];
            int np = 0;
            const int end = kv_da_plan_stream(&c, &st, n, sinks, 1, a, e, pc, &np);
            ck_assert_int_le(np, KV_DA_MAX_PIECES);
            ck_assert(end == e || np == KV_DA_MAX_PIECES);
            ck_assert_int_gt(end, a);
            int v = a, units = 0;
            for (int k = 0; k < np; k++) {
                ck_assert_int_eq(pc[k].u0, v - a);
                ck_assert_int_eq(pc[k].ustart, units);
                units += pc[k].units;
                for (int tt = v; tt < a + pc[k].u1; tt++) {
                    if (tt < sinks) {
                        ck_assert_int_eq(pc[k].kind, KV_DP_F16);
                        ck_assert_ptr_eq(pc[k].rows, fp + (size_t)v * kvd + hd);
                    } else if (tt < comp_end) {
                        int b = 0;
                        while (blocks[b].t0 + blocks[b].m <= tt) b++;
                        ck_assert_int_eq(pc[k].kind, KV_DP_BLOCK);
                        ck_assert_ptr_eq(pc[k].blk.codes, blocks[b].codes);
                        ck_assert_int_eq(pc[k].r0 + (tt - v), tt - blocks[b].t0);
                    } else {
                        ck_assert_int_eq(pc[k].kind, KV_DP_F16);
                        ck_assert_ptr_eq(pc[k].rows, fp + (size_t)(sinks + v - comp_end) * kvd + hd);
                    }
                }
                v = a + pc[k].u1;
            }
            ck_assert_int_eq(v, end);
        }
}
END_TEST

int main(void) {
    Suite *s = suite_create("attn_math");
    TCase *tc = tcase_create("attn_math");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, exp_is_the_runtimes);
    tcase_add_loop_test(tc, units_match_the_decoders, 0, (int)(sizeof k_ucases / sizeof k_ucases[0]));
    tcase_add_test(tc, configure_covers_every_token);
    tcase_add_test(tc, combine_matches_double);
    tcase_add_test(tc, pieces_cover_the_tile);
    suite_add_tcase(s, tc);
    return kv_test_run(s);
}
