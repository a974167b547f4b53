/* The runtime's vector fast paths (kernels/rt/, RUNTIME.md §3.1) against the portable loops they replace, kernel by
 * kernel, on blocks encoded by the runtime's own codecs: shapes that are SmolLM2's, and odd ones (several groups per
 * head, one word per group, d = 1, f32 norms, row ranges that start and end anywhere, 1 to 12 query vectors).
 *   - HIGGS scores (4-bit indices, lookup tables by `vpermps`): the same operations in the same order as the
 *     portable loop, so the same bits (memcmp).
 *   - HIGGS values (d = 2, grid points by `vpermps`, fused multiply-adds): each output is a float sum of the same
 *     n products w_t v_t (w_t = p_t norm_t / g rounded the same way on both sides) added to the same initial
 *     value; the portable loop rounds each product and each sum, the fused one each sum only, so both lie within
 *     gamma(n + 1) sum_t |w_t v_t| of the exact sum: they differ by at most 2 gamma(n + 1) sum_t |w_t v_t| plus
 *     the initial value's share. Checked, and required to be non-trivial (some outputs differ in the last bits, or
 *     the comparison would not show that the fast path ran).
 *   - HIGGS decode to the real domain (keys before RoPE are read through it): grid points by `vpermps`, the FWHT's
 *     butterflies in kv_qm_fwht's order (a + b and a - b each rounded once), the signs: the same bits.
 *   - RoPE of decoded rows (rt_rope.c), both layouts: two products and a sum per output, never fused: the same bits.
 *   - HIGGS keys before RoPE scored without a tile (decode, RoPE, dot products fused per token): against the
 *     decoded tile rotated (the same keys, bit for bit, since both steps above are) and scored by the portable dot
 *     product; the two sums of the same hd products differ by at most 2 gamma(hd + 1) sum_c |q_c k_c|. */
#include "kv_test.h"
#include "kvrt.h"
#include "rt_internal.h"
#include "kv_kernels_internal.h"

#include <float.h>
#include <math.h>

static double gamma_n(double n) {
    const double u = ldexp(1.0, -24);
    return n * u / (1.0 - n * u);
}

typedef struct hcase {
    int H, hd, g, d, n, f32norms;
} hcase;

static const hcase k_hcases[] = {
    {3, 64, 64, 2, 16, 0},  /* SmolLM2's heads, HIGGS-2 */
    {2, 64, 32, 2, 16, 0},  /* two groups per head */
    {1, 128, 128, 2, 16, 1},/* one head of 128, f32 norms */
    {2, 64, 16, 2, 16, 0},  /* groups of one word */
    {2, 32, 32, 1, 16, 0},  /* d = 1: scores fast, values portable */
    {2, 64, 64, 2, 256, 0}, /* 8-bit indices: portable on both sides */
};

static kv_plan *higgs_plan(const hcase *c) {
    kv_plan_fingerprint fp;
    memset(&fp, 0, sizeof fp);
    snprintf(fp.arch, sizeof fp.arch, "llama");
    fp.n_layers = 1, fp.n_kv_heads = c->H, fp.head_dim = c->hd, fp.n_heads = c->H * 3, fp.d_model = c->H * 3 * c->hd;
    fp.vocab_size = 32, fp.rope_theta = 10000.0f;
    kv_plan *p = NULL;
    ck_assert_kv_ok(kv_plan_create(&p, &fp));
    p->global.sinks = 4, p->global.recent = 32, p->global.rht_seed = 91;
    float *grid = malloc(sizeof(float) * (size_t)(c->d * c->n));
    kv_rng r;
    kv_rng_init(&r, 17);
    for (int i = 0; i < c->d * c->n; i++) grid[i] = (float)kv_rng_next_normal(&r);
    int gi = -1;
    ck_assert_kv_ok(kv_plan_add_grid(p, c->d, c->n, grid, &gi));
    free(grid);
    for (int st = 0; st < 2; st++) {
        kv_plan_stream *ps = &p->layers[0].stream[st];
        ps->method = KV_PLAN_HIGGS, ps->bits = 0, ps->group_size = c->g, ps->group_axis = KV_PLAN_GROUP_CHANNELS;
        ps->higgs_grid = gi, ps->scale_dtype = c->f32norms ? KV_DTYPE_F32 : KV_DTYPE_F16;
    }
    ck_assert_kv_ok(kv_plan_validate(p));
    return p;
}

/* One HIGGS block of m tokens, encoded by the codec from N(0, 1) values with a few large channels. */
static uint8_t *higgs_block(const rt_codec *c, int m, uint64_t seed, rt_block *b) {
    const int kvd = c->kv_dim;
    float *x = malloc(sizeof(float) * (size_t)m * (size_t)kvd);
    kv_rng r;
    kv_rng_init(&r, seed);
    for (int i = 0; i < m * kvd; i++) x[i] = (float)(kv_rng_next_normal(&r) * ((i % 11) == 4 ? 4.0 : 1.0));
    rt_layout L;
    kv_rti_codec_layout(c, m, &L);
    uint8_t *data = malloc(L.total);
    ck_assert_kv_ok(kv_rti_codec_encode(c, data, m, x));
    free(x);
    *b = (rt_block){0, m, data, (const uint32_t *)data};
    return data;
}

/* Scores and values of every head over rows [r0, r1) at both levels. */
START_TEST(test_higgs_kernels_match_portable) {
    const hcase *hc = &k_hcases[_i];
    kv_plan *p = higgs_plan(hc);
    rt_codec kc, vc;
    ck_assert_kv_ok(kv_rti_codec_init(&kc, p, 0, KV_PLAN_K, NULL));
    ck_assert_kv_ok(kv_rti_codec_init(&vc, p, 0, KV_PLAN_V, NULL));
    const int hd = hc->hd, m = 131;
    rt_block kb, vb;
    uint8_t *kd = higgs_block(&kc, m, 5u + (uint64_t)_i, &kb), *vd = higgs_block(&vc, m, 6u + (uint64_t)_i, &vb);
    const uint32_t *kcodes, *vcodes;
    const uint8_t *kpar, *vpar;
    kv_rti_block_parts(&kc, &kb, &kcodes, &kpar);
    kv_rti_block_parts(&vc, &vb, &vcodes, &vpar);
    const int nqs[] = {1, 3, 4, 5, 12};
    const int ranges[][2] = {{0, 131}, {3, 100}, {7, 8}, {16, 24}, {1, 130}, {64, 64}};
    const size_t pf = kv_rti_higgs_prep_floats(&kc), ld = 160;
    float *q = malloc(sizeof(float) * 12 * (size_t)hd), *prep = malloc(sizeof(float) * 12 * pf);
    float *s0 = malloc(sizeof(float) * 12 * ld), *s1 = malloc(sizeof(float) * 12 * ld);
    float *pw = malloc(sizeof(float) * 12 * ld), *init = malloc(sizeof(float) * 12 * (size_t)hd);
    float *a0 = malloc(sizeof(float) * 12 * (size_t)hd), *a1 = malloc(sizeof(float) * 12 * (size_t)hd);
    float *vdec = malloc(sizeof(float) * (size_t)m * (size_t)hd);
    kv_rng r;
    kv_rng_init(&r, 99);
    int differ = 0, compared = 0;
    for (size_t qi = 0; qi < sizeof nqs / sizeof nqs[0]; qi++)
        for (size_t ri = 0; ri < sizeof ranges / sizeof ranges[0]; ri++)
            for (int h = 0; h < hc->H; h++) {
                const int nq = nqs[qi], r0 = ranges[ri][0], r1 = ranges[ri][1], n = r1 - r0;
                for (int i = 0; i < nq * hd; i++) q[i] = (float)(0.3 * kv_rng_next_normal(&r));
                for (int i = 0; i < nq * (int)ld; i++) pw[i] = (float)kv_rng_next_uniform(&r);
                for (int i = 0; i < nq * hd; i++) init[i] = (float)kv_rng_next_normal(&r);
                for (int j = 0; j < nq; j++) kv_rti_higgs_prepare(&kc, h, q + (size_t)j * hd, prep + (size_t)j * pf);
                /* scores: the same bits */
                kv_simd_level_limit(KV_SIMD_NONE);
                memset(s0, 0, sizeof(float) * 12 * ld);
                kv_rti_higgs_scores(&kc, kcodes, kpar, m, r0, r1, h, prep, nq, s0, ld);
                kv_simd_level_limit(KV_SIMD_AVX2);
                memset(s1, 0, sizeof(float) * 12 * ld);
                kv_rti_higgs_scores(&kc, kcodes, kpar, m, r0, r1, h, prep, nq, s1, ld);
                for (int j = 0; j < nq; j++)
                    for (int t = 0; t < n; t++) {
                        const float x0 = s0[(size_t)j * ld + (size_t)t], x1 = s1[(size_t)j * ld + (size_t)t];
                        ck_assert_msg(memcmp(&x0, &x1, sizeof x0) == 0,
                                      "case %d nq %d rows %d..%d head %d: score %d of vector %d: %.9g (portable) vs %.9g",
                                      _i, nq, r0, r1, h, t, j, (double)x0, (double)x1);
                    }
                /* decoded rows: the same bits */
                {
                    float *d0 = malloc(sizeof(float) * (size_t)(n + 1) * (size_t)hd), *d1 = malloc(sizeof(float) * (size_t)(n + 1) * (size_t)hd);
                    kv_simd_level_limit(KV_SIMD_NONE);
                    kv_rti_codec_decode_head(&kc, &kb, r0, r1, h, d0, (size_t)hd);
                    kv_simd_level_limit(KV_SIMD_AVX2);
                    kv_rti_codec_decode_head(&kc, &kb, r0, r1, h, d1, (size_t)hd);
                    ck_assert_msg(memcmp(d0, d1, sizeof(float) * (size_t)n * (size_t)hd) == 0,
                                  "case %d rows %d..%d head %d: decoded keys differ from the portable decode", _i, r0, r1, h);
                    free(d0), free(d1);
                }
                /* values: within the two summations' bound */
                kv_simd_level_limit(KV_SIMD_NONE);
                memcpy(a0, init, sizeof(float) * (size_t)nq * (size_t)hd);
                kv_rti_higgs_accum(&vc, vcodes, vpar, m, r0, r1, h, pw, ld, nq, a0);
                kv_simd_level_limit(KV_SIMD_AVX2);
                memcpy(a1, init, sizeof(float) * (size_t)nq * (size_t)hd);
                kv_rti_higgs_accum(&vc, vcodes, vpar, m, r0, r1, h, pw, ld, nq, a1);
                /* |w_t v_t| per channel in the rotated domain: the decoded grid point times norm / g, i.e. the
                 * rotated-domain value before D H; rebuilt here from the codes */
                const kv_higgs *hq = &vc.q.higgs;
                const int dd = hq->dim, per_group = hq->group / dd;
                for (int t = r0; t < r1; t++)
                    for (int c = 0; c < hd; c++) {
                        const size_t piece = ((size_t)t * (size_t)vc.kv_dim + (size_t)h * (size_t)hd + (size_t)c) / (size_t)dd;
                        uint8_t idx;
                        kv_unpack_range(&idx, vcodes, piece, 1, vc.bits, vc.per_word);
                        const size_t grp = piece / (size_t)per_group;
                        const float mul = kv_qm_higgs_dec_mul(kv_qm_param_load(vpar, grp, (int)hq->norm_type), (size_t)hq->group);
                        vdec[(size_t)(t - r0) * hd + c] = hq->grid[(size_t)idx * (size_t)dd + (size_t)(c % dd)] * mul;
                    }
                for (int j = 0; j < nq; j++)
                    for (int c = 0; c < hd; c++) {
                        double mag = fabs((double)init[(size_t)j * hd + c]);
                        for (int t = r0; t < r1; t++)
                            mag += fabs((double)pw[(size_t)j * ld + (size_t)(t - r0)] * vdec[(size_t)(t - r0) * hd + c]);
                        const double x0 = a0[(size_t)j * hd + c], x1 = a1[(size_t)j * hd + c];
                        const double tol = 2.0 * gamma_n(n + 2) * mag + 1e-30;
                        ck_assert_msg(fabs(x0 - x1) <= tol,
                                      "case %d nq %d rows %d..%d head %d: value %d of vector %d: %.9g (portable) vs %.9g "
                                      "(difference %.3g > %.3g)", _i, nq, r0, r1, h, c, j, x0, x1, fabs(x0 - x1), tol);
                        differ += x0 != x1;
                        compared++;
                    }
            }
    kv_simd_level_limit(KV_SIMD_AVX2);
    /* the fused path ran where it applies (2-D grids of 16 points on a CPU with AVX2) */
    if (kv_rti_avx2_usable() && hc->d == 2 && hc->n == 16) ck_assert_int_gt(differ, 0);
    printf("higgs case %d: %d of %d values differ from the portable loop's bits (all within the bound)\n", _i, differ,
           compared);
    free(q), free(prep), free(s0), free(s1), free(pw), free(init), free(a0), free(a1), free(vdec), free(kd), free(vd);
    kv_rti_codec_free(&kc);
    kv_rti_codec_free(&vc);
    kv_plan_free(p);
}
END_TEST

/* A runtime shell holding what rt_rope.c and kv_rti_higgs_scores_rope read: the model's RoPE table. */
static void rope_shell(kv_rt *rt, int hd, int layout, int npos) {
    memset(rt, 0, sizeof *rt);
    rt->head_dim = hd;
    rt->opt.rope_layout = layout;
    rt->rope_n = npos;
    rt->rope_cos = malloc(sizeof(float) * (size_t)npos * (size_t)(hd / 2));
    rt->rope_sin = malloc(sizeof(float) * (size_t)npos * (size_t)(hd / 2));
    for (int p = 0; p < npos; p++)
        for (int i = 0; i < hd / 2; i++) {
            const double ang = (double)p * pow(10000.0, -2.0 * i / hd);
            rt->rope_cos[(size_t)p * (size_t)(hd / 2) + (size_t)i] = (float)cos(ang);
            rt->rope_sin[(size_t)p * (size_t)(hd / 2) + (size_t)i] = (float)sin(ang);
        }
}

START_TEST(test_rope_rows_match_portable) {
    const int hds[] = {16, 64, 128};
    for (size_t hi = 0; hi < sizeof hds / sizeof hds[0]; hi++)
        for (int layout = 0; layout < 2; layout++) {
            const int hd = hds[hi], n = 37, p0 = 4000;
            kv_rt rt;
            rope_shell(&rt, hd, layout ? KV_ROPE_HALF : KV_ROPE_ADJACENT, p0 + n);
            float *x0 = malloc(sizeof(float) * (size_t)n * (size_t)hd), *x1 = malloc(sizeof(float) * (size_t)n * (size_t)hd);
            kv_rng r;
            kv_rng_init(&r, 3 + hi);
            for (int i = 0; i < n * hd; i++) x0[i] = x1[i] = (float)(3.0 * kv_rng_next_normal(&r));
            kv_simd_level_limit(KV_SIMD_NONE);
            kv_rti_rope_rows(&rt, x0, (size_t)hd, n, p0);
            kv_simd_level_limit(KV_SIMD_AVX2);
            kv_rti_rope_rows(&rt, x1, (size_t)hd, n, p0);
            ck_assert_msg(memcmp(x0, x1, sizeof(float) * (size_t)n * (size_t)hd) == 0, "head_dim %d layout %d: RoPE differs", hd,
                          layout);
            free(x0), free(x1), free(rt.rope_cos), free(rt.rope_sin);
        }
}
END_TEST

START_TEST(test_higgs_prerope_scores) {
    const hcase *hc = &k_hcases[_i];
    kv_plan *p = higgs_plan(hc);
    rt_codec kc;
    ck_assert_kv_ok(kv_rti_codec_init(&kc, p, 0, KV_PLAN_K, NULL));
    const int hd = hc->hd, m = 131, npos = 6000;
    rt_block kb;
    uint8_t *kd = higgs_block(&kc, m, 21u + (uint64_t)_i, &kb);
    const uint32_t *codes;
    const uint8_t *par;
    kv_rti_block_parts(&kc, &kb, &codes, &par);
    const size_t ld = 160;
    float *q = malloc(sizeof(float) * 12 * (size_t)hd), *s1 = malloc(sizeof(float) * 12 * ld);
    float *tile = malloc(sizeof(float) * (size_t)m * (size_t)hd);
    int32_t *pos = malloc(sizeof(int32_t) * (size_t)m);
    kv_rng r;
    kv_rng_init(&r, 7);
    int ran = 0;
    for (int layout = 0; layout < 2; layout++) {
        kv_rt rt;
        rope_shell(&rt, hd, layout ? KV_ROPE_HALF : KV_ROPE_ADJACENT, npos);
        const int ranges[][2] = {{0, 131}, {5, 77}, {9, 10}, {64, 72}};
        for (size_t ri = 0; ri < sizeof ranges / sizeof ranges[0]; ri++)
            for (int use_pos = 0; use_pos < 2; use_pos++)
                for (int h = 0; h < hc->H; h++) {
                    const int r0 = ranges[ri][0], r1 = ranges[ri][1], n = r1 - r0, nq = 1 + (int)(ri * 3 + (size_t)h) % 7;
                    const int p0 = 17 + 1000 * (int)ri;
                    for (int i = 0; i < n; i++) pos[i] = use_pos ? 11 + 41 * i : p0 + i; /* kept tokens: any positions */
                    for (int i = 0; i < nq * hd; i++) q[i] = (float)(0.3 * kv_rng_next_normal(&r));
                    kv_simd_level_limit(KV_SIMD_AVX2);
                    if (!kv_rti_higgs_scores_rope(&rt, &kc, codes, par, r0, r1, h, p0, use_pos ? pos : NULL, q, nq, s1, ld)) {
                        ck_assert(!(kv_rti_avx2_usable() && hc->d == 2 && hc->n == 16)); /* it must run where it applies */
                        continue;
                    }
                    ran++;
                    /* the reference: the decoded tile (portable), rotated (portable), dotted in double */
                    kv_simd_level_limit(KV_SIMD_NONE);
                    kv_rti_codec_decode_head(&kc, &kb, r0, r1, h, tile, (size_t)hd);
                    for (int i = 0; i < n; i++) kv_rti_rope_rows(&rt, tile + (size_t)i * hd, (size_t)hd, 1, use_pos ? pos[i] : p0 + i);
                    for (int j = 0; j < nq; j++)
                        for (int i = 0; i < n; i++) {
                            double exact = 0, mag = 0;
                            for (int c = 0; c < hd; c++) {
                                exact += (double)q[(size_t)j * hd + c] * tile[(size_t)i * hd + c];
                                mag += fabs((double)q[(size_t)j * hd + c] * tile[(size_t)i * hd + c]);
                            }
                            const double got = s1[(size_t)j * ld + (size_t)i], tol = gamma_n(hd + 1) * mag + 1e-30;
                            ck_assert_msg(fabs(got - exact) <= tol,
                                          "case %d layout %d rows %d..%d head %d vector %d token %d: %.9g vs exact %.9g "
                                          "(%.3g > %.3g)", _i, layout, r0, r1, h, j, i, got, exact, fabs(got - exact), tol);
                        }
                }
        free(rt.rope_cos), free(rt.rope_sin);
    }
    kv_simd_level_limit(KV_SIMD_AVX2);
    printf("higgs case %d: %d pre-RoPE score calls checked\n", _i, ran);
    free(q), free(s1), free(tile), free(pos), free(kd);
    kv_rti_codec_free(&kc);
    kv_plan_free(p);
}
END_TEST

int main(void) {
    Suite *s = suite_create("rt_fastpaths");
    TCase *tc = tcase_create("kernels");
    tcase_set_timeout(tc, 300);
    tcase_add_loop_test(tc, test_higgs_kernels_match_portable, 0, (int)(sizeof k_hcases / sizeof k_hcases[0]));
    tcase_add_test(tc, test_rope_rows_match_portable);
    tcase_add_loop_test(tc, test_higgs_prerope_scores, 0, (int)(sizeof k_hcases / sizeof k_hcases[0]));
    suite_add_tcase(s, tc);
    return kv_test_run(s);
}
