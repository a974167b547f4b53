/* kvcal search (calib/search.c): the allocator against brute force on small random instances, its
 * refusals, the candidate table, and on stories260K (KVCAL_DATA_DIR) the claim the search rests on: the
 * surgery of single-method plans is byte for byte the plan one fit with the same per-layer choices writes
 * (provenance and report aside), the per-stream honest bytes add up to what `kvrun eval --plan` counts, and
 * the sensitivities order as quantization error must. */
#define _POSIX_C_SOURCE 200809L
#include "kv_bench.h"
#include "kv_calib.h"
#include "kv_model.h"
#include "kv_test.h"
#include "kv_tools.h"
#include "kvrt.h"

#include <math.h>
#include <unistd.h>
#include "stories_fixture.h"

/* ---- allocator ------------------------------------------------------------------------------------ */
/* Does an assignment respect the chain (NULL: always)? Written from the definition in kv_calib.h, item by
 * item, independently of the allocator's states. */
/* Every item's choice accepts the classes of the two items before it (class 0 before item 0), as written
 * directly from the definition. */
static int chain_respected(const kv_search_chain *chain, const int *pick, int n, int k) {
    for (int i = 0; chain && i < n; i++) {
        const int c1 = i >= 1 ? chain->cls[pick[i - 1]] : 0, c2 = i >= 2 ? chain->cls[pick[i - 2]] : 0;
        if (!(chain->ok1[i * k + pick[i]] & 1u << c1) || !(chain->ok2[i * k + pick[i]] & 1u << c2)) return 0;
    }
    return 1;
}

/* Brute force over every assignment (n_choices^n_items): the least value whose cost fits (and that respects
 * allowed and chain, both may be NULL); INFINITY when none. */
static double brute_chain(const uint64_t *cost, const double *value, const unsigned char *allowed,
                          const kv_search_chain *chain, int n, int k, uint64_t budget) {
    double best = INFINITY;
    int pick[8] = {0};
    for (;;) {
        uint64_t c = 0;
        double v = 0;
        int ok = chain_respected(chain, pick, n, k);
        for (int i = 0; i < n; i++) {
            c += cost[i * k + pick[i]];
            v += value[i * k + pick[i]];
            ok &= !allowed || allowed[i * k + pick[i]];
        }
        if (ok && c <= budget && v < best) best = v;
        int i = 0;
        while (i < n && ++pick[i] == k) pick[i++] = 0;
        if (i == n) break;
    }
    return best;
}

static double brute(const uint64_t *cost, const double *value, int n, int k, uint64_t budget) {
    return brute_chain(cost, value, NULL, NULL, n, k, budget);
}

START_TEST(test_allocate_brute) {
    uint64_t rng = 12345;
    for (int trial = 0; trial < 300; trial++) {
        const int n = 1 + (int)(kv_rng_u64(rng, 4 * trial) % 6), k = 1 + (int)(kv_rng_u64(rng, 4 * trial + 1) % 4);
        uint64_t cost[6 * 4];
        double value[6 * 4];
        uint64_t min_sum = 0, max_sum = 0;
        for (int i = 0; i < n; i++) {
            uint64_t mn = UINT64_MAX, mx = 0;
            for (int j = 0; j < k; j++) {
                cost[i * k + j] = kv_rng_u64(rng + 7, (uint64_t)(100 * trial + i * k + j)) % 21;
                value[i * k + j] = kv_rng_uniform(rng + 9, (uint64_t)(100 * trial + i * k + j));
                mn = cost[i * k + j] < mn ? cost[i * k + j] : mn;
                mx = cost[i * k + j] > mx ? cost[i * k + j] : mx;
            }
            min_sum += mn;
            max_sum += mx;
        }
        const uint64_t budget = min_sum + kv_rng_u64(rng, 4 * trial + 2) % (max_sum - min_sum + 1);
        int choice[6];
        uint64_t unit = 0;
        /* max_units >= every budget here (<= 120): unit 1, so the DP is exact */
        ck_assert_kv_ok(kv_search_allocate(choice, cost, value, NULL, NULL, n, k, budget, 1000, &unit));
        ck_assert_uint_eq(unit, 1);
        uint64_t c = 0;
        double v = 0;
        for (int i = 0; i < n; i++) {
            ck_assert(choice[i] >= 0 && choice[i] < k);
            c += cost[i * k + choice[i]];
            v += value[i * k + choice[i]];
        }
        ck_assert_msg(c <= budget, "trial %d: cost %llu over the budget %llu", trial, (unsigned long long)c,
                      (unsigned long long)budget);
        /* the same optimum; the two sums add the same terms in different orders, so allow a few ulps */
        const double b = brute(cost, value, n, k, budget);
        ck_assert_msg(fabs(v - b) <= 1e-12 * (1 + b), "trial %d: DP %.17g, brute force %.17g", trial, v, b);
    }
}
END_TEST

/* kv_search_allocate_timed against brute force over both constraints on small random instances: always
 * feasible; never better than the exact optimum; within the relaxation's gap (at most one item's spread of values:
 * the Lagrangian choice and the optimum differ where the multiplier's bracket switches) of it; the exact optimum on
 * most instances; with a time budget every choice meets, the byte-only knapsack's choice and lambda 0; a time
 * budget below the fastest assembly refused. */
static double brute_timed(const uint64_t *cost, const double *value, const double *time, int n, int k,
                          uint64_t budget, double time_budget, double *least_time) {
    double best = INFINITY;
    int pick[8] = {0};
    *least_time = INFINITY;
    for (;;) {
        uint64_t c = 0;
        double v = 0, t = 0;
        for (int i = 0; i < n; i++) c += cost[i * k + pick[i]], v += value[i * k + pick[i]], t += time[i * k + pick[i]];
        if (c <= budget && t < *least_time) *least_time = t;
        if (c <= budget && t <= time_budget && v < best) best = v;
        int i = 0;
        while (i < n && ++pick[i] == k) pick[i++] = 0;
        if (i == n) break;
    }
    return best;
}

START_TEST(test_allocate_timed) {
    const uint64_t rng = 777;
    int exact = 0, feasible_trials = 0;
    for (int trial = 0; trial < 300; trial++) {
        const int n = 2 + (int)(kv_rng_u64(rng, 4 * trial) % 5), k = 2 + (int)(kv_rng_u64(rng, 4 * trial + 1) % 3);
        uint64_t cost[6 * 4];
        double value[6 * 4], time[6 * 4], spread = 0;
        uint64_t max_sum = 0;
        for (int i = 0; i < n; i++) {
            double lo = INFINITY, hi = -INFINITY;
            uint64_t mx = 0;
            for (int j = 0; j < k; j++) {
                const uint64_t at = (uint64_t)(100 * trial + i * k + j);
                cost[i * k + j] = kv_rng_u64(rng + 7, at) % 21;
                /* a codec that costs more bytes tends to lose less and (like AQUA-KV) may cost more time */
                value[i * k + j] = kv_rng_uniform(rng + 9, at) * (25.0 - (double)cost[i * k + j]);
                time[i * k + j] = 1e-4 * (0.1 + kv_rng_uniform(rng + 11, at));
                lo = value[i * k + j] < lo ? value[i * k + j] : lo;
                hi = value[i * k + j] > hi ? value[i * k + j] : hi;
                mx = cost[i * k + j] > mx ? cost[i * k + j] : mx;
            }
            spread = hi - lo > spread ? hi - lo : spread;
            max_sum += mx;
        }
        const uint64_t budget = max_sum / 2 + kv_rng_u64(rng, 4 * trial + 2) % (max_sum / 2 + 1);
        double least;
        const double unbounded = brute_timed(cost, value, time, n, k, budget, INFINITY, &least);
        if (!isfinite(unbounded)) continue; /* no assembly within the bytes */
        int choice[6], ref[6];
        double lambda = -1;
        /* a time budget every choice meets: the byte-only choice, lambda 0 */
        ck_assert_kv_ok(kv_search_allocate(ref, cost, value, NULL, NULL, n, k, budget, 1000, NULL));
        ck_assert_kv_ok(kv_search_allocate_timed(choice, cost, value, time, 1.0, NULL, NULL, n, k, budget, &lambda));
        ck_assert_mem_eq(choice, ref, (size_t)n * sizeof *choice);
        ck_assert(lambda == 0);
        /* below the fastest assembly within the bytes: refused */
        ck_assert_int_eq(kv_search_allocate_timed(choice, cost, value, time, least * 0.999, NULL, NULL, n, k, budget,
                                                  NULL), KV_EINVAL);
        /* a time budget between the fastest and the unconstrained choice's */
        double t_ref = 0;
        for (int i = 0; i < n; i++) t_ref += time[i * k + ref[i]];
        const double tb = least + (t_ref - least) * kv_rng_uniform(rng + 13, (uint64_t)trial);
        double dummy;
        const double opt = brute_timed(cost, value, time, n, k, budget, tb, &dummy);
        ck_assert_kv_ok(kv_search_allocate_timed(choice, cost, value, time, tb, NULL, NULL, n, k, budget, &lambda));
        uint64_t c = 0;
        double v = 0, t = 0;
        for (int i = 0; i < n; i++) c += cost[i * k + choice[i]], v += value[i * k + choice[i]], t += time[i * k + choice[i]];
        ck_assert_msg(c <= budget && t <= tb, "trial %d: cost %llu / %llu, time %g / %g", trial, (unsigned long long)c,
                      (unsigned long long)budget, t, tb);
        ck_assert_msg(v >= opt - 1e-12 * (1 + fabs(opt)) && v <= opt + spread + 1e-12, "trial %d: %.17g, optimum %.17g, "
                      "spread %g", trial, v, opt, spread);
        feasible_trials++;
        exact += fabs(v - opt) <= 1e-12 * (1 + fabs(opt));
    }
    fprintf(stderr, "allocate_timed: the exact two-constraint optimum on %d of %d instances\n", exact, feasible_trials);
    /* measured 2026-11-28: 240 of 289 (SEARCH.md §7); a relaxation that found the optimum on fewer than half would be broken */
    ck_assert_msg(feasible_trials > 100 && 2 * exact > feasible_trials, "%d of %d", exact, feasible_trials);
}
END_TEST

/* With units coarser than a byte (max_units small) the choice stays feasible at the true costs, and it is
 * at least as good as the exact optimum under a budget reduced by the rounding slack n * unit. */
START_TEST(test_allocate_units) {
    for (int trial = 0; trial < 100; trial++) {
        const int n = 5, k = 3;
        uint64_t cost[15];
        double value[15];
        uint64_t min_sum = 0;
        for (int i = 0; i < n; i++) {
            uint64_t mn = UINT64_MAX;
            for (int j = 0; j < k; j++) {
                cost[i * k + j] = 100 + kv_rng_u64(77, (uint64_t)(100 * trial + i * k + j)) % 900;
                value[i * k + j] = kv_rng_uniform(78, (uint64_t)(100 * trial + i * k + j));
                mn = cost[i * k + j] < mn ? cost[i * k + j] : mn;
            }
            min_sum += mn;
        }
        const uint64_t budget = min_sum + 1500 + kv_rng_u64(79, (uint64_t)trial) % 2000;
        int choice[5];
        uint64_t unit = 0;
        ck_assert_kv_ok(kv_search_allocate(choice, cost, value, NULL, NULL, n, k, budget, 50, &unit));
        ck_assert(unit > 1);
        uint64_t c = 0;
        double v = 0;
        for (int i = 0; i < n; i++) c += cost[i * k + choice[i]], v += value[i * k + choice[i]];
        ck_assert(c <= budget);
        const uint64_t slack = (uint64_t)n * unit;
        if (budget >= min_sum + slack) {
            const double b = brute(cost, value, n, k, budget - slack);
            ck_assert_msg(v <= b + 1e-12, "trial %d: %.17g worse than the optimum %.17g at budget - n*unit", trial, v, b);
        }
    }
}
END_TEST

/* A budget exactly at (or a byte above) the cheapest assembly, with units much coarser than a byte: the
 * cheapest assembly is the answer, not "nothing fits once costs are rounded up" (a search point at a single
 * method's own bits is this tight: that method everywhere is the cheapest assembly). */
START_TEST(test_allocate_tight) {
    for (int trial = 0; trial < 20; trial++) {
        const int n = 60, k = 4;
        uint64_t cost[240], min_sum = 0;
        double value[240];
        int cheapest[60];
        for (int i = 0; i < n; i++) {
            for (int j = 0; j < k; j++) {
                cost[i * k + j] = 1000 + kv_rng_u64(81, (uint64_t)(1000 * trial + i * k + j)) % 100000;
                value[i * k + j] = kv_rng_uniform(82, (uint64_t)(1000 * trial + i * k + j));
            }
            cheapest[i] = 0;
            for (int j = 1; j < k; j++)
                if (cost[i * k + j] < cost[i * k + cheapest[i]]) cheapest[i] = j;
            min_sum += cost[i * k + cheapest[i]];
        }
        for (uint64_t over = 0; over < 2; over++) {
            int choice[60];
            uint64_t unit = 0;
            ck_assert_kv_ok(kv_search_allocate(choice, cost, value, NULL, NULL, n, k, min_sum + over, 0, &unit));
            ck_assert_uint_eq(unit, 1);
            uint64_t c = 0;
            for (int i = 0; i < n; i++) c += cost[i * k + choice[i]];
            /* at the exact budget every item takes a cheapest choice (a tie in cost may pick either) */
            ck_assert_uint_le(c, min_sum + over);
            if (over == 0)
                for (int i = 0; i < n; i++) ck_assert_uint_eq(cost[i * k + choice[i]], cost[i * k + cheapest[i]]);
        }
        /* and a budget with room: feasible at the true costs with units > 1 (2000 units: the DP stays cheap
         * under the sanitizers) */
        int choice[60];
        uint64_t unit = 0, c = 0;
        const uint64_t budget = min_sum + 3000000;
        ck_assert_kv_ok(kv_search_allocate(choice, cost, value, NULL, NULL, n, k, budget, 2000, &unit));
        ck_assert(unit > 1);
        for (int i = 0; i < n; i++) c += cost[i * k + choice[i]];
        ck_assert(c <= budget);
    }
}
END_TEST

/* The chained allocator (predictor inputs, shared codes) against brute force: 1-4 random classes, random
 * accepted classes one and two items back per item and choice (each class accepted with probability 3/4),
 * random forbidden choices; the same optimum, a choice that respects the chain, the cheapest assembly
 * feasible at its own cost, and "nothing respects the chain" reported when brute force finds none. */
START_TEST(test_allocate_chain) {
    int n_infeasible = 0, n_bound = 0, n_multi = 0;
    for (int trial = 0; trial < 600; trial++) {
        const uint64_t r = 5000 + (uint64_t)trial * 64;
        const int n = 1 + (int)(kv_rng_u64(r, 0) % 6), k = 1 + (int)(kv_rng_u64(r, 1) % 4);
        const int C = 1 + (int)(kv_rng_u64(r, 7) % 4);
        uint64_t cost[24];
        double value[24];
        unsigned char cls[4], ok1[24], ok2[24], allowed[24];
        for (int j = 0; j < k; j++) cls[j] = (unsigned char)(kv_rng_u64(r, 2 + j) % (uint64_t)C);
        for (int q = 0; q < n * k; q++) {
            cost[q] = kv_rng_u64(r + 1, (uint64_t)q) % 21;
            value[q] = kv_rng_uniform(r + 2, (uint64_t)q);
            ok1[q] = ok2[q] = 0;
            for (int c = 0; c < C; c++) {
                ok1[q] |= (unsigned char)((kv_rng_u64(r + 3, (uint64_t)(q * 8 + c)) % 4 != 0) << c);
                ok2[q] |= (unsigned char)((kv_rng_u64(r + 5, (uint64_t)(q * 8 + c)) % 4 != 0) << c);
            }
            allowed[q] = kv_rng_u64(r + 4, (uint64_t)q) % 5 != 0;
        }
        n_multi += C >= 3;
        const kv_search_chain chain = {C, cls, ok1, ok2};
        const double any = brute_chain(cost, value, allowed, &chain, n, k, UINT64_MAX);
        uint64_t cheapest = 0;
        int choice[6];
        if (!isfinite(any)) { /* nothing respects the chain: both calls say so */
            n_infeasible++;
            ck_assert_int_eq(kv_search_cheapest(&cheapest, choice, cost, allowed, &chain, n, k), KV_EINVAL);
            ck_assert_int_eq(kv_search_allocate(choice, cost, value, allowed, &chain, n, k, 1000, 1000, NULL), KV_EINVAL);
            continue;
        }
        ck_assert_kv_ok(kv_search_cheapest(&cheapest, choice, cost, allowed, &chain, n, k));
        ck_assert(chain_respected(&chain, choice, n, k));
        uint64_t c0 = 0;
        for (int i = 0; i < n; i++) c0 += cost[i * k + choice[i]];
        ck_assert_uint_eq(c0, cheapest);
        /* the least cost that respects the chain: brute force over costs as values */
        double cost_as_value[24];
        for (int q = 0; q < n * k; q++) cost_as_value[q] = (double)cost[q];
        ck_assert(brute_chain(cost, cost_as_value, allowed, &chain, n, k, UINT64_MAX) == (double)cheapest);
        if (cheapest > 0) /* a byte below the cheapest assembly: refused */
            ck_assert_int_eq(kv_search_allocate(choice, cost, value, allowed, &chain, n, k, cheapest - 1, 1000, NULL),
                             KV_EINVAL);
        const uint64_t budget = cheapest + kv_rng_u64(r, 9) % 40;
        uint64_t unit = 0;
        ck_assert_kv_ok(kv_search_allocate(choice, cost, value, allowed, &chain, n, k, budget, 1000, &unit));
        ck_assert_uint_eq(unit, 1);
        uint64_t c = 0;
        double v = 0;
        for (int i = 0; i < n; i++) {
            ck_assert(allowed[i * k + choice[i]]);
            c += cost[i * k + choice[i]], v += value[i * k + choice[i]];
        }
        ck_assert(chain_respected(&chain, choice, n, k));
        ck_assert_uint_le(c, budget);
        const double b = brute_chain(cost, value, allowed, &chain, n, k, budget);
        ck_assert_msg(fabs(v - b) <= 1e-12 * (1 + b), "trial %d: DP %.17g, brute force %.17g", trial, v, b);
        /* the chain binds: the unconstrained optimum is strictly better in some trials (else this test could
         * pass with the chain ignored) */
        n_bound += brute_chain(cost, value, allowed, NULL, n, k, budget) < b - 1e-12;
    }
    ck_assert_int_gt(n_infeasible, 10);
    ck_assert_int_gt(n_bound, 10);
    ck_assert_int_gt(n_multi, 100);
}
END_TEST

/* The chain of kv_search_chain_init. Chained predictors: the AQUA-KV candidates (any bits, any rank) share a
 * class; at layer l >= 1 an AQUA-KV K accepts only that class two items back (K(l-1)), an AQUA-KV V only that
 * class one back (K(l)) and anything but a spliced placeholder (SQuat, shared codes) two back (V(l-1)).
 * kivi2s (shared codes) accepts only kivi2's class two back, and nothing at layer 0. Free predictors: only the
 * shared-codes rule; without shared codes either, one class (no chain). A codes_of candidate missing from the
 * list is refused. */
static const kv_search_candidate *cand_named(const char *name) {
    int idx;
    ck_assert_kv_ok(kv_search_candidate_find(&idx, name));
    return &kv_search_candidates(NULL)[idx];
}

START_TEST(test_chain_init) {
    const char *names[6] = {"kivi2", "aqua2", "higgs3", "aqua3r32", "kivi2s", "squat2"};
    enum { NC = 6, L = 3 };
    const kv_search_candidate *cands[NC];
    for (int c = 0; c < NC; c++) cands[c] = cand_named(names[c]);
    for (int chained = 1; chained >= 0; chained--) {
        kv_search_chain ch;
        ck_assert_kv_ok(kv_search_chain_init(&ch, cands, NC, L, chained));
        const int C = ch.n_classes, aq = ch.cls[1], src = ch.cls[0];
        ck_assert_int_eq(C, chained ? 4 : 2); /* none, AQUA-KV, spliced, kivi2's codes / none, kivi2's codes */
        ck_assert_int_eq(ch.cls[3], aq);
        ck_assert(src != 0 && src != aq && ch.cls[2] == 0);
        if (chained) ck_assert(ch.cls[4] == ch.cls[5] && ch.cls[4] != 0 && ch.cls[4] != aq && ch.cls[4] != src);
        const unsigned any = (1u << C) - 1;
        for (int l = 0; l < L; l++)
            for (int c = 0; c < NC; c++) {
                const unsigned k1 = ch.ok1[(2 * l) * NC + c], k2 = ch.ok2[(2 * l) * NC + c];
                const unsigned v1 = ch.ok1[(2 * l + 1) * NC + c], v2 = ch.ok2[(2 * l + 1) * NC + c];
                const int pred = chained && l > 0 && (c == 1 || c == 3);
                if (c == 4) { /* kivi2s: kivi2 at layer l-1, the same stream */
                    ck_assert_uint_eq(k2, l > 0 ? 1u << src : 0u);
                    ck_assert_uint_eq(v2, l > 0 ? 1u << src : 0u);
                    ck_assert_uint_eq(k1, any);
                    ck_assert_uint_eq(v1, any);
                    continue;
                }
                ck_assert_uint_eq(k1, any);
                ck_assert_uint_eq(k2, pred ? 1u << aq : any);
                ck_assert_uint_eq(v1, pred ? 1u << aq : any);
                ck_assert_uint_eq(v2, pred ? any & ~(1u << ch.cls[4]) : any);
            }
        kv_search_chain_free(&ch);
    }
    kv_search_chain ch;
    ck_assert_kv_ok(kv_search_chain_init(&ch, cands, 3, L, 0)); /* kivi2, aqua2, higgs3 with free inputs */
    ck_assert_int_eq(ch.n_classes, 1);
    kv_search_chain_free(&ch);
    const kv_search_candidate *no_src[2] = {cand_named("kivi4"), cand_named("kivi2s")};
    ck_assert_int_eq(kv_search_chain_init(&ch, no_src, 2, L, 1), KV_EINVAL);
    ck_assert_ptr_nonnull(strstr(kv_error_last(), "kivi2"));
    /* kv_search_allowed: kivi2s at odd layers only, squat2 on K only */
    unsigned char allowed[2 * L * NC];
    kv_search_allowed(allowed, cands, NC, L);
    for (int i = 0; i < 2 * L; i++)
        for (int c = 0; c < NC; c++)
            ck_assert_int_eq(allowed[i * NC + c], c == 4 ? (i / 2) % 2 == 1 : c == 5 ? i % 2 == 0 : 1);
    /* the pair's KL less kivi2's at the layer below, floored at 0 */
    double kl[2 * L * NC];
    for (int i = 0; i < 2 * L * NC; i++) kl[i] = allowed[i] ? 0.01 * (i + 1) : HUGE_VAL;
    kl[(2 * 1 + 1) * NC + 4] = 0.0; /* layer 1 V: the pair measured below kivi2 alone (noise): 0 */
    double want = kl[(2 * 1) * NC + 4] - kl[0 * NC + 0];
    ck_assert_kv_ok(kv_search_pair_increments(kl, cands, NC, L));
    ck_assert_double_eq_tol(kl[(2 * 1) * NC + 4], want, 1e-15);
    ck_assert(kl[(2 * 1 + 1) * NC + 4] == 0.0);
    ck_assert(kl[(2 * 2) * NC + 4] == HUGE_VAL);
    ck_assert_double_eq_tol(kl[(2 * 1) * NC + 0], 0.01 * (2 * NC + 1), 1e-15); /* others untouched */
}
END_TEST

START_TEST(test_allocate_refusals) {
    const uint64_t cost[4] = {10, 20, 5, 30};
    const double value[4] = {1, 0, 1, 0};
    int choice[2];
    /* the cheapest assembly costs 15 */
    ck_assert_int_eq(kv_search_allocate(choice, cost, value, NULL, NULL, 2, 2, 14, 0, NULL), KV_EINVAL);
    ck_assert_ptr_nonnull(strstr(kv_error_last(), "15"));
    ck_assert_kv_ok(kv_search_allocate(choice, cost, value, NULL, NULL, 2, 2, 15, 0, NULL));
    ck_assert_int_eq(choice[0], 0);
    ck_assert_int_eq(choice[1], 0);
    ck_assert_kv_ok(kv_search_allocate(choice, cost, value, NULL, NULL, 2, 2, 50, 0, NULL));
    ck_assert_int_eq(choice[0], 1);
    ck_assert_int_eq(choice[1], 1);
    /* a forbidden choice is never taken */
    const unsigned char allowed[4] = {1, 0, 1, 1};
    ck_assert_kv_ok(kv_search_allocate(choice, cost, value, allowed, NULL, 2, 2, 50, 0, NULL));
    ck_assert_int_eq(choice[0], 0);
}
END_TEST

/* Per-layer options of a pruned contender (SEARCH.md §5.5) against brute force over every per-layer choice in
 * doubles: random tables (options as multipliers of the budget: KL changes of either sign, bit changes growing
 * with the multiplier), budgets between the cheapest and the dearest prediction. The knapsack counts bits in
 * units of 1e-9, each layer's cost rounded to the nearest unit and extras to units of at most (budget range) /
 * 20000: its choice may miss the optimum only by what a budget tighter by that rounding would allow, and never
 * beats the optimum at a budget looser by it. */
static double brute_layers(const kv_search_layer_table *t, double budget_bits) {
    const int L = t->n_layers, k = t->n_opt + 1;
    int pick[8] = {0};
    double best = INFINITY;
    for (;;) {
        double kl = t->kl, bits = t->bits;
        for (int l = 0; l < L; l++)
            if (pick[l]) {
                kl += t->dkl[l * t->n_opt + pick[l] - 1];
                bits += t->dbits[l * t->n_opt + pick[l] - 1];
            }
        if (bits <= budget_bits && kl < best) best = kl;
        int l = 0;
        while (l < L && ++pick[l] == k) pick[l++] = 0;
        if (l == L) break;
    }
    return best;
}

START_TEST(test_layer_allocate) {
    const double mult[3] = {0.5, 2, 4};
    for (int trial = 0; trial < 200; trial++) {
        const int L = 1 + (int)(kv_rng_u64(31, (uint64_t)trial) % 6), nm = 1 + (int)(kv_rng_u64(32, (uint64_t)trial) % 3);
        double dkl[6 * 3], dbits[6 * 3], lo = 2.0, hi = 2.0;
        for (int l = 0; l < L; l++) {
            double mn = 0, mx = 0;
            for (int o = 0; o < nm; o++) {
                const uint64_t q = (uint64_t)(100 * trial + l * 3 + o);
                dbits[l * nm + o] = (mult[o] - 1.0) * (0.05 + 0.05 * kv_rng_uniform(33, q)) / L;
                dkl[l * nm + o] = (1.0 - mult[o]) * 0.01 * kv_rng_uniform(34, q) + 0.002 * (kv_rng_uniform(35, q) - 0.5);
                mn = dbits[l * nm + o] < mn ? dbits[l * nm + o] : mn;
                mx = dbits[l * nm + o] > mx ? dbits[l * nm + o] : mx;
            }
            lo += mn, hi += mx;
        }
        const kv_search_layer_table t = {L, nm, dkl, dbits, 0.3, 2.0};
        const double budget = lo + (hi - lo) * kv_rng_uniform(36, (uint64_t)trial);
        int choice[6];
        double pkl, pbits;
        ck_assert_kv_ok(kv_search_layer_allocate(choice, &pkl, &pbits, &t, budget));
        double kl = t.kl, bits = t.bits;
        for (int l = 0; l < L; l++) {
            ck_assert(choice[l] >= 0 && choice[l] <= nm);
            if (choice[l]) kl += dkl[l * nm + choice[l] - 1], bits += dbits[l * nm + choice[l] - 1];
        }
        ck_assert_double_eq_tol(pkl, kl, 1e-15);
        ck_assert_double_eq_tol(pbits, bits, 1e-15);
        const double slack = L * ((hi - lo) / 20000 + 2e-9);
        ck_assert_msg(bits <= budget + slack, "trial %d: %.12g bits over the budget %.12g", trial, bits, budget);
        const double tighter = brute_layers(&t, budget - slack), looser = brute_layers(&t, budget + slack);
        ck_assert_msg(kl <= tighter + 1e-12 && kl >= looser - 1e-12, "trial %d: KL %.12g, optimum %.12g (tighter) "
                      "%.12g (looser)", trial, kl, tighter, looser);
    }
    /* below the cheapest prediction: refused; the multiplier is capped at the whole cache */
    const double dk[2] = {0.1, -0.1}, db[2] = {-0.5, 0.5};
    const kv_search_layer_table t1 = {1, 2, dk, db, 0.3, 2.0};
    int c1;
    ck_assert_int_eq(kv_search_layer_allocate(&c1, NULL, NULL, &t1, 1.4), KV_EINVAL);
    ck_assert_kv_ok(kv_search_layer_allocate(&c1, NULL, NULL, &t1, 1.5));
    ck_assert_int_eq(c1, 1);
    ck_assert_kv_ok(kv_search_layer_allocate(&c1, NULL, NULL, &t1, 2.5));
    ck_assert_int_eq(c1, 2);
    ck_assert_double_eq(kv_search_layer_budget(0.3, 4), 1.0);
    ck_assert_double_eq_tol(kv_search_layer_budget(0.3, 0.5), 0.15, 1e-15);
}
END_TEST

/* The context scale (SEARCH.md §5.3) against numbers worked by hand: 3 items, 5 candidates. c0: measured 0.3
 * over a sum of 0.1 -> 3; c4: 0.2 / 0.1 -> 2; the others take the median of {2, 3} = 2.5: c1 not measured,
 * c2 not offered on one item (HUGE_VAL, kept as it is), c3 with a zero sum (uncompressed). */
START_TEST(test_context_scale) {
    enum { N_ITEMS = 3, N_C = 5 };
    const double H = HUGE_VAL;
    const double kl[N_ITEMS * N_C] = {0.05, 0.1, 0.2, 0.0, 0.02, /* item 0: c0..c4 */
                                      0.03, 0.2, H,   0.0, 0.03,
                                      0.02, 0.3, 0.1, 0.0, 0.05};
    const double measured[N_C] = {0.3, NAN, 5.0, 0.0, 0.2};
    double scaled[N_ITEMS * N_C], scale[N_C];
    ck_assert_kv_ok(kv_search_context_scale(scaled, scale, kl, measured, N_ITEMS, N_C));
    const double want[N_C] = {3.0, 2.5, 2.5, 2.5, 2.0};
    for (int c = 0; c < N_C; c++) {
        ck_assert_double_eq_tol(scale[c], want[c], 1e-12);
        for (int i = 0; i < N_ITEMS; i++) {
            const double v = kl[i * N_C + c];
            if (isfinite(v)) ck_assert_double_eq_tol(scaled[i * N_C + c], v * want[c], 1e-15);
            else ck_assert(scaled[i * N_C + c] == HUGE_VAL);
        }
    }
    /* one formed scale: the median is itself; none at all: 1 */
    const double one[N_C] = {0.3, NAN, NAN, NAN, NAN}, none[N_C] = {NAN, NAN, NAN, NAN, NAN};
    ck_assert_kv_ok(kv_search_context_scale(scaled, scale, kl, one, N_ITEMS, N_C));
    for (int c = 0; c < N_C; c++) ck_assert_double_eq_tol(scale[c], 3.0, 1e-12);
    ck_assert_kv_ok(kv_search_context_scale(scaled, scale, kl, none, N_ITEMS, N_C));
    for (int c = 0; c < N_C; c++) ck_assert(scale[c] == 1.0);
    /* in place */
    double inplace[N_ITEMS * N_C];
    memcpy(inplace, kl, sizeof kl);
    ck_assert_kv_ok(kv_search_context_scale(inplace, scale, inplace, measured, N_ITEMS, N_C));
    ck_assert_double_eq_tol(inplace[0], 0.15, 1e-15);
    ck_assert_int_eq(kv_search_context_scale(NULL, scale, kl, measured, N_ITEMS, N_C), KV_EINVAL);
}
END_TEST

START_TEST(test_candidates) {
    int n, k;
    const kv_search_candidate *c = kv_search_candidates(&n);
    ck_assert_int_ge(n, 8);
    for (int i = 0; i < n; i++) {
        ck_assert_kv_ok(kv_search_candidate_find(&k, c[i].name));
        ck_assert_int_eq(k, i);
        kv_fit_config cfg;
        ck_assert_kv_ok(kv_search_candidate_config(&cfg, &c[i], NULL, 0));
        ck_assert_kv_ok(kv_fit_config_validate(&cfg));
        kv_fit_config_free(&cfg);
    }
    ck_assert_int_eq(kv_search_candidate_find(&k, "kivi9"), KV_EINVAL);
    ck_assert_ptr_nonnull(strstr(kv_error_last(), "kivi2"));
}
END_TEST

/* ---- stories260K ---------------------------------------------------------------------------------- */
static kv_model *g_model;
static kv_model_file *g_mf;
static int32_t *g_ids;
static size_t g_n;
static int32_t g_bos = -1;
static char g_model_path[4096];

static void setup(void) {
    char path[4096];
    snprintf(path, sizeof path, "%s/stories260K/tok512.bin", kv_test_data_dir());
    stories_load(&g_mf, &g_model, &g_ids, &g_n, &g_bos, 40000, path, g_model_path);
}

static void teardown(void) {
    kv_model_free(g_model);
    kv_model_file_close(g_mf);
    free(g_ids);
}

/* seq_len 132 = 4 sinks + 2 chunks of 64 (cache.recent 64), 4096 tokens: a few seconds per fit */
static const char *k_common[] = {"data.seq_len=132", "data.max_tokens=4096", "cache.recent=64",
                                 "higgs.grid_samples=32768", "higgs.grid_iters=30"};

static kv_plan *fit_cfg(kv_fit_config *cfg) {
    kv_fit_data d = {g_ids, 4096, NULL, 0, g_bos};
    kv_plan *p = NULL;
    ck_assert_kv_ok(kv_fit_run(&p, NULL, g_model, g_mf, &d, cfg, NULL));
    return p;
}

static kv_plan *fit_candidate_with(const char *name, const char *const *common, int n_common) {
    int k;
    ck_assert_kv_ok(kv_search_candidate_find(&k, name));
    kv_fit_config cfg;
    ck_assert_kv_ok(kv_search_candidate_config(&cfg, &kv_search_candidates(NULL)[k], common, n_common));
    kv_plan *p = fit_cfg(&cfg);
    kv_fit_config_free(&cfg);
    return p;
}

static kv_plan *fit_candidate(const char *name) { return fit_candidate_with(name, k_common, 5); }

/* The serialized plan without provenance and report (those say how it was made, not what it is). */
static void plan_bytes(uint8_t **out, size_t *n, kv_plan *p) {
    kv_plan_provenance empty;
    memset(&empty, 0, sizeof empty);
    ck_assert_kv_ok(kv_plan_set_provenance(p, &empty));
    ck_assert_kv_ok(kv_plan_set_report(p, 0, NULL, NULL));
    kv_plan_write_options wo = {0, 0};
    ck_assert_kv_ok(kv_plan_write_memory(out, n, p, &wo));
}

/* The claim of SEARCH.md §1.2 for two methods that have per-layer bits: a single fit with layers.N.key_bits
 * / value_bits equals the surgery of the uniform-bits fits, byte for byte. KIVI (method xquant with the
 * eta calibrated per layer and stream) and HIGGS (grids appended in first-use order). */
static void check_surgery(kv_fit_method method, const char *name_lo, const char *name_hi, int bits_lo, int bits_hi) {
    kv_plan *srcs[2] = {fit_candidate(name_lo), fit_candidate(name_hi)};
    const int L = srcs[0]->n_layers;
    int choice[64];
    kv_fit_config cfg;
    ck_assert_kv_ok(kv_fit_config_init(&cfg));
    ck_assert_kv_ok(kv_fit_config_method_preset(&cfg, method));
    char set[64];
    snprintf(set, sizeof set, "keys.bits=%d", bits_lo);
    ck_assert_kv_ok(kv_fit_config_set(&cfg, set));
    snprintf(set, sizeof set, "values.bits=%d", bits_lo);
    ck_assert_kv_ok(kv_fit_config_set(&cfg, set));
    if (method == KV_FIT_XQUANT) ck_assert_kv_ok(kv_fit_config_set(&cfg, "xquant.calibrate_eta=true"));
    for (int i = 0; i < 5; i++) ck_assert_kv_ok(kv_fit_config_set(&cfg, k_common[i]));
    for (int l = 0; l < L; l++)
        for (int st = 0; st < 2; st++) {
            choice[2 * l + st] = (l + st) % 2 == 1 || l == L - 1; /* a mix of both, K and V differing */
            if (choice[2 * l + st]) {
                snprintf(set, sizeof set, "layers.%d.%s_bits=%d", l, st ? "value" : "key", bits_hi);
                ck_assert_kv_ok(kv_fit_config_set(&cfg, set));
            }
        }
    kv_plan *single = fit_cfg(&cfg);
    kv_fit_config_free(&cfg);
    kv_plan *surg = NULL;
    ck_assert_kv_ok(kv_search_assemble(&surg, (const kv_plan *const *)srcs, 2, choice, L));
    uint8_t *a = NULL, *b = NULL;
    size_t na = 0, nb = 0;
    plan_bytes(&a, &na, single);
    plan_bytes(&b, &nb, surg);
    ck_assert_msg(na == nb && memcmp(a, b, na) == 0, "%s: the surgery of %s/%s differs from the single fit (%zu vs %zu "
                  "bytes)", kv_fit_method_name(method), name_lo, name_hi, nb, na);
    free(a);
    free(b);
    kv_plan_free(single);
    kv_plan_free(surg);
    kv_plan_free(srcs[0]);
    kv_plan_free(srcs[1]);
}

START_TEST(test_surgery_equals_fit_kivi) {
    check_surgery(KV_FIT_XQUANT, "kivi2", "kivi4", 2, 4);
}
END_TEST

START_TEST(test_surgery_equals_fit_higgs) {
    check_surgery(KV_FIT_HIGGS, "higgs2", "higgs3", 2, 3);
}
END_TEST

/* Surgery refuses what phase 1 cannot copy: an AQUA-KV stream with a predictor. */
START_TEST(test_surgery_refuses_predictor) {
    kv_fit_config cfg;
    ck_assert_kv_ok(kv_fit_config_init(&cfg));
    ck_assert_kv_ok(kv_fit_config_method_preset(&cfg, KV_FIT_AQUA_UNIFORM));
    for (int i = 0; i < 5; i++) ck_assert_kv_ok(kv_fit_config_set(&cfg, k_common[i]));
    kv_plan *aq = fit_cfg(&cfg);
    kv_fit_config_free(&cfg);
    kv_plan *dst = NULL;
    ck_assert_kv_ok(kv_plan_create(&dst, &aq->fingerprint));
    dst->global = aq->global;
    ck_assert_int_eq(kv_search_copy_stream(dst, aq, 1, KV_PLAN_K), KV_EUNSUPPORTED);
    ck_assert_ptr_nonnull(strstr(kv_error_last(), "layer 1 K"));
    kv_plan_free(dst);
    kv_plan_free(aq);
}
END_TEST

/* The candidate table index of each name, as pointers (what kv_search_refit_config takes). */
static void cand_ptrs(const kv_search_candidate **out, const char *const *names, int n) {
    for (int i = 0; i < n; i++) {
        int k;
        ck_assert_kv_ok(kv_search_candidate_find(&k, names[i]));
        out[i] = &kv_search_candidates(NULL)[k];
    }
}

static kv_plan *refit_with(const char *const *names, int n, const int *choice, int L, const char *const *common,
                           int n_common) {
    const kv_search_candidate *c[8];
    cand_ptrs(c, names, n);
    kv_fit_config cfg;
    ck_assert_kv_ok(kv_search_refit_config(&cfg, c, n, choice, L, common, n_common));
    ck_assert_kv_ok(kv_fit_check(&cfg, kv_model_arch(g_model)));
    kv_plan *p = fit_cfg(&cfg);
    kv_fit_config_free(&cfg);
    return p;
}

static kv_plan *refit(const char *const *names, int n, const int *choice, int L) {
    return refit_with(names, n, choice, L, k_common, 5);
}

/* `kvrun eval --plan`'s own code on the plan, written to a temporary file: 2 chunks of ctx tokens past the
 * fits' 4096. */
static void eval_plan_file(kv_plan_eval *ev, const kv_plan *p, int ctx) {
    char dir[256], path[512];
    kv_test_tmpdir(dir, sizeof dir);
    ck_assert_ptr_nonnull(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/plan.kvplan", dir);
    ck_assert_kv_ok(kv_plan_write(p, path, NULL));
    ck_assert_kv_ok(kv_eval_plan(ev, g_model, g_model_path, path, g_ids + 4096, g_n - 4096, ctx, g_bos, 2, 0, 0,
                                      NULL));
    unlink(path);
    rmdir(dir);
}

static void assert_same_plan(kv_plan *x, kv_plan *y, const char *what) {
    uint8_t *a = NULL, *b = NULL;
    size_t na = 0, nb = 0;
    plan_bytes(&a, &na, x);
    plan_bytes(&b, &nb, y);
    ck_assert_msg(na == nb && memcmp(a, b, na) == 0, "%s (%zu vs %zu bytes)", what, na, nb);
    free(a);
    free(b);
}

/* A refitted mix of two candidates against their single fits, stream by stream: the same method, bits, groups
 * and codes per word, the eta too for the candidates in eta_mask (bit c), a predictor exactly on candidate
 * `predicted`'s streams above layer 0, and the honest bytes the knapsack counted from the single fits. */
static void assert_mix_streams(const kv_plan *re, const kv_plan *const src[2], const char *const names[2],
                               const int *choice, int L, int ctx, int predicted, int eta_mask) {
    uint64_t b_re[64], v_re[64], b_src[2][64], v_src[2][64];
    ck_assert_kv_ok(kv_search_stream_bytes(b_re, v_re, re, g_model, ctx));
    for (int c = 0; c < 2; c++) ck_assert_kv_ok(kv_search_stream_bytes(b_src[c], v_src[c], src[c], g_model, ctx));
    for (int l = 0; l < L; l++)
        for (int st = 0; st < 2; st++) {
            const int i = 2 * l + st, c = choice[i];
            const kv_plan_stream *rs = &re->layers[l].stream[st], *ss = &src[c]->layers[l].stream[st];
            ck_assert_msg(rs->method == ss->method && rs->bits == ss->bits && rs->group_axis == ss->group_axis &&
                              rs->group_size == ss->group_size && rs->pack == ss->pack &&
                              (!(eta_mask >> c & 1) || rs->eta == ss->eta),
                          "layer %d %s (%s): method %d/%d bits %d/%d axis %d/%d size %d/%d eta %g/%g", l,
                          st ? "V" : "K", names[c], rs->method, ss->method, rs->bits, ss->bits, rs->group_axis,
                          ss->group_axis, rs->group_size, ss->group_size, rs->eta, ss->eta);
            ck_assert_msg((rs->predictor != NULL) == (c == predicted && l >= 1), "layer %d %s: predictor", l,
                          st ? "V" : "K");
            ck_assert_uint_eq(b_re[i], b_src[c][i]);
        }
}

/* The refit (SEARCH.md §1.3) of a choice that is AQUA-KV everywhere is the AQUA-KV fit itself, byte for
 * byte: per-stream overrides on the xquant base reproduce the method, its first-layer bits, its keys before
 * RoPE, its predictors fitted on its own reconstructions, its grids in the same order. */
START_TEST(test_refit_equals_aqua) {
    const char *names[] = {"aqua2"};
    kv_plan *single = fit_candidate("aqua2");
    const int L = single->n_layers;
    int choice[64] = {0};
    kv_plan *re = refit(names, 1, choice, L);
    assert_same_plan(single, re, "the refit of an all-AQUA-KV-2 choice differs from the AQUA-KV-2 fit");
    kv_plan_free(re);
    kv_plan_free(single);
}
END_TEST

/* The same for AQUA-KV with uniform residuals: the refit's per-layer group and eta keys give its streams the
 * aqua-uniform layout (per-token groups of 64) and eta (0) on the KIVI base, so an all-aquau2 choice is the
 * aquau2 fit byte for byte. In a mix with KIVI-3 (calibrated eta, KIVI's groups) every stream keeps its own
 * candidate's layout and eta, so its honest bytes are the ones the knapsack counted from the single fits. */
START_TEST(test_refit_equals_aqua_uniform) {
    const char *names[] = {"aquau2", "kivi3"};
    kv_plan *single = fit_candidate("aquau2"), *kivi = fit_candidate("kivi3");
    const int L = single->n_layers;
    int choice[64] = {0};
    kv_plan *re = refit(names, 1, choice, L);
    assert_same_plan(single, re, "the refit of an all-AQUA-KV-uniform-2 choice differs from its fit");
    kv_plan_free(re);
    /* KIVI-3 on the K of even layers >= 2 and the V of layer 1; AQUA-KV-uniform-2 elsewhere */
    for (int l = 0; l < L; l++) choice[2 * l] = l >= 2 && l % 2 == 0, choice[2 * l + 1] = l == 1;
    re = refit(names, 2, choice, L);
    const kv_plan *src[2] = {single, kivi};
    assert_mix_streams(re, src, names, choice, L, 256, 0, 3);
    ck_assert_msg(kivi->layers[2].stream[KV_PLAN_K].group_axis != single->layers[2].stream[KV_PLAN_K].group_axis,
                  "the test needs the two layouts to differ");
    kv_plan_free(re);
    kv_plan_free(kivi);
    kv_plan_free(single);
}
END_TEST

/* KIVI with larger groups (kivi1g128: keys per channel in groups of 128 tokens, values per token in groups
 * of 64 channels) in a refit: its groups are per-layer keys on the KIVI base (groups of 32) and its eta is
 * calibrated on them, so an all-kivi1g128 choice is its fit byte for byte, and in a mix with AQUA-KV-2 its
 * streams keep their layout, eta and honest bytes. Key groups of 128 tokens need cache.recent 128. */
START_TEST(test_refit_equals_kivi_g128) {
    static const char *common[] = {"data.seq_len=260", "data.max_tokens=4096", "cache.recent=128",
                                   "higgs.grid_samples=32768", "higgs.grid_iters=30"};
    const char *names[] = {"kivi1g128", "aqua2"};
    kv_plan *single = fit_candidate_with("kivi1g128", common, 5), *aqua = fit_candidate_with("aqua2", common, 5);
    const int L = single->n_layers;
    ck_assert_int_eq(single->layers[1].stream[KV_PLAN_K].group_size, 128);
    ck_assert_int_eq(single->layers[1].stream[KV_PLAN_V].group_size, 64);
    int choice[64] = {0};
    kv_plan *re = refit_with(names, 1, choice, L, common, 5);
    assert_same_plan(single, re, "the refit of an all-kivi1g128 choice differs from its fit");
    kv_plan_free(re);
    /* AQUA-KV-2 keys from layer 0 up and values from layer 2 up (their inputs AQUA-KV or kivi1g128) */
    for (int l = 0; l < L; l++) choice[2 * l] = 1, choice[2 * l + 1] = l >= 2;
    re = refit_with(names, 2, choice, L, common, 5);
    const kv_plan *src[2] = {single, aqua};
    /* a KIVI stream reads its own layer's exact K/V: its calibrated eta is the single fit's (mask 1) */
    assert_mix_streams(re, src, names, choice, L, 512, 1, 1);
    kv_plan_eval ev;
    eval_plan_file(&ev, re, 300);
    ck_assert(isfinite(ev.cmp.kl_mean) && ev.cmp.kl_mean >= 0);
    kv_plan_free(re);
    kv_plan_free(aqua);
    kv_plan_free(single);
}
END_TEST

/* Streams without a predictor come out of the refit as out of their single fits (they read their own
 * layer's exact K/V): the refit of a mix of f16, KIVI-2 (calibrated eta), HIGGS-3 and FP8 equals the
 * surgery of those fits, byte for byte. With AQUA-KV-3 added, its layers >= 1 carry predictors (their inputs
 * the mix's reconstructions, whatever method made them), every other stream is still its single fit's, and
 * the plan evaluates end to end. */
START_TEST(test_refit_mixed) {
    const char *names[] = {"f16", "kivi2", "higgs3", "fp8", "aqua3"};
    enum { NC = 5 };
    kv_plan *plans[NC];
    for (int c = 0; c < NC; c++) plans[c] = fit_candidate(names[c]);
    const int L = plans[0]->n_layers;
    int choice[64];
    for (int i = 0; i < 2 * L; i++) choice[i] = (i * 3 + 1) % 4; /* K and V of a layer differ */
    kv_plan *re = refit(names, NC - 1, choice, L), *surg = NULL;
    ck_assert_kv_ok(kv_search_assemble(&surg, (const kv_plan *const *)plans, NC - 1, choice, L));
    assert_same_plan(re, surg, "the refit of a mix without AQUA-KV differs from the surgery");
    kv_plan_free(re);
    kv_plan_free(surg);
    /* AQUA-KV-3 on K of every odd layer and V of every layer >= 2 */
    for (int l = 1; l < L; l++) {
        if (l % 2) choice[2 * l] = 4;
        if (l >= 2) choice[2 * l + 1] = 4;
    }
    re = refit(names, NC, choice, L);
    for (int l = 0; l < L; l++)
        for (int st = 0; st < 2; st++) {
            const kv_plan_stream *rs = &re->layers[l].stream[st];
            if (choice[2 * l + st] == 4) {
                ck_assert_msg(rs->predictor != NULL, "layer %d %s: no predictor", l, st ? "V" : "K");
                ck_assert_int_eq(rs->method, KV_PLAN_HIGGS);
                ck_assert_int_eq(rs->pre_rope, st == KV_PLAN_K);
                continue;
            }
            /* not predicted: the single fit's stream, copied into a plan of its own to compare */
            kv_plan *a = NULL, *b = NULL;
            ck_assert_kv_ok(kv_plan_create(&a, &re->fingerprint));
            ck_assert_kv_ok(kv_plan_create(&b, &re->fingerprint));
            a->global = b->global = re->global;
            ck_assert_kv_ok(kv_search_copy_stream(a, re, l, st));
            ck_assert_kv_ok(kv_search_copy_stream(b, plans[choice[2 * l + st]], l, st));
            char what[96];
            snprintf(what, sizeof what, "layer %d %s (%s) differs from its single fit", l, st ? "V" : "K",
                     names[choice[2 * l + st]]);
            assert_same_plan(a, b, what);
            kv_plan_free(a);
            kv_plan_free(b);
        }
    kv_plan_eval ev;
    eval_plan_file(&ev, re, 200);
    ck_assert(isfinite(ev.cmp.kl_mean) && ev.cmp.kl_mean >= 0);
    kv_plan_free(re);
    for (int c = 0; c < NC; c++) kv_plan_free(plans[c]);
}
END_TEST

/* Low-rank predictors (format 1.3) through the fit and the refit: AQUA-KV-2 at aqua.rank 4 stores every
 * predictor as rank-4 factors (4 (kv_dim + in) + kv_dim f16 values), reads back as written, and the refit of
 * a choice mixing full and rank-4 AQUA-KV-2 gives each stream its candidate's rank; all at rank 4 is the
 * rank-4 fit itself, byte for byte (the rank travels as layers.N.key_rank / value_rank). */
START_TEST(test_lowrank_predictors) {
    static const kv_search_candidate r4 = {"aqua2r4", KV_FIT_AQUA, {"keys.bits=2", "values.bits=2", "aqua.rank=4", NULL},
                                           "AQUA-KV rank-4 predictors + HIGGS 2 bits", 0, NULL};
    kv_fit_config cfg;
    ck_assert_kv_ok(kv_search_candidate_config(&cfg, &r4, k_common, 5));
    kv_plan *low = fit_cfg(&cfg);
    kv_fit_config_free(&cfg);
    const int L = low->n_layers, kvd = low->fingerprint.n_kv_heads * low->fingerprint.head_dim;
    for (int l = 1; l < L; l++)
        for (int st = 0; st < 2; st++) {
            const kv_plan_predictor *pr = low->layers[l].stream[st].predictor;
            ck_assert_ptr_nonnull(pr);
            ck_assert_int_eq(pr->rank, 4);
            ck_assert_uint_eq(kv_plan_stream_predictor_bytes(low, l, st), 2u * (4u * (uint64_t)(kvd + pr->in_dim) + (uint64_t)kvd));
        }
    uint8_t *a = NULL;
    size_t na = 0;
    kv_plan_write_options wo = {0, 0};
    ck_assert_kv_ok(kv_plan_write_memory(&a, &na, low, &wo));
    kv_plan *back = NULL;
    ck_assert_kv_ok(kv_plan_read_memory(&back, a, na));
    ck_assert(back->file.required_features & KV_PLAN_FEAT_PRED_LOWRANK);
    free(a);
    assert_same_plan(low, back, "a rank-4 plan read back differs");
    kv_plan_free(back);
    int k;
    ck_assert_kv_ok(kv_search_candidate_find(&k, "aqua2"));
    const kv_search_candidate *c[2] = {&kv_search_candidates(NULL)[k], &r4};
    int choice[64] = {0};
    for (int i = 0; i < 2 * L; i++) choice[i] = 1;
    ck_assert_kv_ok(kv_search_refit_config(&cfg, c, 2, choice, L, k_common, 5));
    kv_plan *re = fit_cfg(&cfg);
    kv_fit_config_free(&cfg);
    assert_same_plan(low, re, "the refit of an all-rank-4 choice differs from the rank-4 fit");
    kv_plan_free(re);
    for (int i = 0; i < 2 * L; i++) choice[i] = i % 3 == 0;
    ck_assert_kv_ok(kv_search_refit_config(&cfg, c, 2, choice, L, k_common, 5));
    re = fit_cfg(&cfg);
    kv_fit_config_free(&cfg);
    for (int l = 1; l < L; l++)
        for (int st = 0; st < 2; st++)
            ck_assert_int_eq(re->layers[l].stream[st].predictor->rank, choice[2 * l + st] ? 4 : 0);
    kv_plan_free(re);
    kv_plan_free(low);
}
END_TEST

/* AQUA-KV's GPTQ predictors (format 1.4) as candidates: aqua2q stores every predictor above layer 0 as 4-bit
 * codes (half a byte per weight, f16 scale and offset per 32 columns and the f16 bias: stories260K's kv_dim is 32,
 * hence aqua.predictor_group 32 for every candidate), the refit of an all-aqua2q choice is its fit byte for byte,
 * and a refit mixing aqua2 and aqua2q gives each stream its candidate's predictor (the code bits travel as
 * layers.N.key_predictor_bits / value_predictor_bits). */
START_TEST(test_gptq_predictors) {
    static const char *common[] = {"data.seq_len=132", "data.max_tokens=4096", "cache.recent=64",
                                   "higgs.grid_samples=32768", "higgs.grid_iters=30", "aqua.predictor_group=32"};
    kv_plan *q = fit_candidate_with("aqua2q", common, 6);
    const int L = q->n_layers, kvd = q->fingerprint.n_kv_heads * q->fingerprint.head_dim;
    ck_assert_int_eq(kvd, 32);
    for (int l = 1; l < L; l++)
        for (int st = 0; st < 2; st++) {
            const kv_plan_predictor *pr = q->layers[l].stream[st].predictor;
            ck_assert_ptr_nonnull(pr);
            ck_assert_int_eq(pr->qbits, 4);
            const uint64_t nw = (uint64_t)kvd * (uint64_t)pr->in_dim;
            ck_assert_uint_eq(kv_plan_stream_predictor_bytes(q, l, st), nw / 2 + 2u * (2u * nw / 32u + (uint64_t)kvd));
        }
    const char *names[] = {"aqua2", "aqua2q"};
    int choice[64];
    for (int i = 0; i < 2 * L; i++) choice[i] = 1;
    kv_plan *re = refit_with(names, 2, choice, L, common, 6);
    assert_same_plan(q, re, "the refit of an all-aqua2q choice differs from the aqua2q fit");
    kv_plan_free(re);
    for (int i = 0; i < 2 * L; i++) choice[i] = i % 3 == 0;
    re = refit_with(names, 2, choice, L, common, 6);
    for (int l = 1; l < L; l++)
        for (int st = 0; st < 2; st++)
            ck_assert_int_eq(re->layers[l].stream[st].predictor->qbits, choice[2 * l + st] ? 4 : 0);
    kv_plan_eval ev;
    eval_plan_file(&ev, re, 200);
    ck_assert(isfinite(ev.cmp.kl_mean) && ev.cmp.kl_mean >= 0);
    kv_plan_free(re);
    kv_plan_free(q);
}
END_TEST

/* The sensitivity of a predicted stream runs layers l-1 and l through the cache together, step by step
 * (SEARCH.md §2). Checks: AQUA-KV-2's layer 0 (HIGGS at first_layer_bits, no predictor) measures exactly
 * what HIGGS-4 measures there; a predicted stream's shortcut KL agrees with the one-stream plan run through
 * the whole model by `kvrun eval --plan`'s function (which also rounds every other stream to f16: that
 * floor, ~1e-6 per stream on this model, is what the tolerance allows), and the predictor pays: AQUA-KV-2 errs
 * less than HIGGS-2 in the sum over layers >= 1. */
START_TEST(test_sensitivity_predicted) {
    const char *names[] = {"aqua2", "higgs4", "higgs2"};
    kv_plan *plans[3];
    for (int c = 0; c < 3; c++) plans[c] = fit_candidate(names[c]);
    const int L = plans[0]->n_layers;
    double kl[64 * 3];
    kv_search_sens_options so = {100, 2, g_bos, NULL, NULL};
    ck_assert_kv_ok(kv_search_sensitivity(kl, g_model, (const kv_plan *const *)plans, 3, g_ids + 4096, g_n - 4096, &so,
                                          NULL));
    for (int st = 0; st < 2; st++)
        ck_assert_msg(kl[st * 3 + 0] == kl[st * 3 + 1], "layer 0 %s: aqua2 %.17g, higgs4 %.17g", st ? "V" : "K",
                      kl[st * 3], kl[st * 3 + 1]);
    double aq = 0, hg = 0;
    for (int i = 2; i < 2 * L; i++) aq += kl[i * 3 + 0], hg += kl[i * 3 + 2];
    ck_assert_msg(aq < hg, "AQUA-KV-2 %g >= HIGGS-2 %g over layers >= 1", aq, hg);
    /* layer 2 V (inputs: layer 1 V and layer 2 K) through the whole model */
    const int l = 2 < L ? 2 : L - 1, st = KV_PLAN_V;
    ck_assert_ptr_nonnull(plans[0]->layers[l].stream[st].predictor);
    kv_plan *one = NULL;
    ck_assert_kv_ok(kv_plan_create(&one, &plans[0]->fingerprint));
    one->global = plans[0]->global;
    one->layers[l].stream[KV_PLAN_K].pre_rope = plans[0]->layers[l].stream[KV_PLAN_K].pre_rope;
    one->layers[l - 1].stream[KV_PLAN_K].pre_rope = plans[0]->layers[l - 1].stream[KV_PLAN_K].pre_rope;
    kv_plan_stream *ds = &one->layers[l].stream[st];
    const kv_plan_stream *ss = &plans[0]->layers[l].stream[st];
    int grid;
    const kv_plan_grid *g = &plans[0]->grids[ss->higgs_grid];
    ck_assert_kv_ok(kv_plan_add_grid(one, g->d, g->n, g->points, &grid));
    *ds = *ss;
    ds->predictor = NULL;
    ds->fp_scales = NULL;
    ds->higgs_grid = grid;
    const kv_plan_predictor *pr = ss->predictor;
    ck_assert_kv_ok(kv_plan_set_predictor(one, l, st, pr->n_inputs, pr->inputs, pr->weight, pr->bias));
    ck_assert_kv_ok(kv_plan_set_predictor_dtype(one, l, st, pr->dtype));
    kv_plan_eval ev;
    eval_plan_file(&ev, one, 100);
    const double shortcut = kl[(2 * l + st) * 3];
    fprintf(stderr, "layer %d V: AQUA-KV-2 sensitivity %.6g, whole model through the plan %.6g\n", l, shortcut,
            ev.cmp.kl_mean);
    ck_assert_msg(fabs(ev.cmp.kl_mean - shortcut) < 0.02 * shortcut + 2 * L * 2e-6,
                  "shortcut %.6g vs whole model %.6g", shortcut, ev.cmp.kl_mean);
    kv_plan_free(one);
    for (int c = 0; c < 3; c++) kv_plan_free(plans[c]);
}
END_TEST

/* SQuat keys as a candidate (keys only). The surgery copies a SQuat stream whole: the assembly of the squat2
 * fit's every stream is that fit, byte for byte. Its V streams are not offered (kv_search_allowed) and not
 * measured (HUGE_VAL); its K sensitivities are finite. In a refit with AQUA-KV streams a SQuat key is a
 * placeholder KIVI-2 key (the kivi2 row's stream) that no predictor reads, then spliced: the result is the
 * refit of the same choice with kivi2 there, with that one stream copied from the squat2 fit. A choice where
 * a predictor would read the placeholder is refused. */
START_TEST(test_squat_candidate) {
    const char *names[] = {"squat2", "kivi2", "aqua2"};
    enum { NC = 3 };
    kv_plan *plans[NC];
    for (int c = 0; c < NC; c++) plans[c] = fit_candidate(names[c]);
    const int L = plans[0]->n_layers;
    ck_assert_int_ge(L, 3);
    ck_assert_ptr_nonnull(plans[0]->layers[1].stream[KV_PLAN_K].squat);
    ck_assert_ptr_null(plans[0]->layers[1].stream[KV_PLAN_K].squat->basis); /* squat.static_basis=false */
    int choice[64] = {0};
    kv_plan *surg = NULL;
    ck_assert_kv_ok(kv_search_assemble(&surg, (const kv_plan *const *)plans, 1, choice, L));
    assert_same_plan(plans[0], surg, "the surgery of the squat2 fit differs from the fit");
    kv_plan_free(surg);
    const kv_search_candidate *c[NC];
    cand_ptrs(c, names, NC);
    ck_assert(kv_search_candidate_spliced(c[0]) && !kv_search_candidate_spliced(c[1]) && !kv_search_candidate_spliced(c[2]));
    unsigned char allowed[64 * NC];
    kv_search_allowed(allowed, c, NC, L);
    for (int i = 0; i < 2 * L; i++)
        for (int k = 0; k < NC; k++) ck_assert_int_eq(allowed[i * NC + k], !(k == 0 && i % 2 == 1));
    double kl[64 * NC];
    kv_search_sens_options so = {100, 1, g_bos, NULL, allowed};
    ck_assert_kv_ok(kv_search_sensitivity(kl, g_model, (const kv_plan *const *)plans, NC, g_ids + 4096, g_n - 4096, &so,
                                          NULL));
    for (int i = 0; i < 2 * L; i++)
        ck_assert_msg(i % 2 ? kl[i * NC] == HUGE_VAL : isfinite(kl[i * NC]) && kl[i * NC] >= 0, "item %d: squat2 %g", i,
                      kl[i * NC]);
    /* AQUA-KV-2 on layers 0..L-3 (K and V), SQuat at layer L-2 K, KIVI-2 above */
    const int q = L - 2;
    for (int l = 0; l < L; l++) choice[2 * l] = choice[2 * l + 1] = l < q ? 2 : 1;
    int with_kivi[64];
    memcpy(with_kivi, choice, sizeof with_kivi);
    choice[2 * q] = 0;
    kv_plan *re = refit(names, NC, choice, L), *expect = refit(names, NC, with_kivi, L);
    ck_assert_kv_ok(kv_search_splice(re, (const kv_plan *const *)plans, c, NC, choice, L));
    ck_assert_ptr_nonnull(re->layers[q].stream[KV_PLAN_K].squat);
    ck_assert_kv_ok(kv_search_copy_stream(expect, plans[0], q, KV_PLAN_K));
    assert_same_plan(re, expect, "the spliced refit differs from the kivi2 refit with the SQuat key copied in");
    kv_plan_eval ev;
    eval_plan_file(&ev, re, 200);
    ck_assert(isfinite(ev.cmp.kl_mean) && ev.cmp.kl_mean >= 0);
    kv_plan_free(re);
    kv_plan_free(expect);
    /* AQUA-KV V at layer q reads K(q): a placeholder there is refused */
    choice[2 * q + 1] = 2;
    kv_fit_config cfg;
    ck_assert_int_eq(kv_search_refit_config(&cfg, c, NC, choice, L, k_common, 5), KV_EUNSUPPORTED);
    ck_assert_msg(strstr(kv_error_last(), "placeholder") != NULL, "%s", kv_error_last());
    for (int k = 0; k < NC; k++) kv_plan_free(plans[k]);
}
END_TEST

/* XQuant shared codes as a candidate (kivi2s: odd layers reuse layer l-1's KIVI-2 codes). Its fit's even
 * layers are the kivi2 fit's streams, byte for byte (what kv_search_pair_increments relies on), and the
 * assembly of kivi2 at even and kivi2s at odd layers is the kivi2s fit. The pair sensitivity (the one-stream
 * plan carries the partner) agrees with the whole model run through that two-stream plan. In a refit with
 * AQUA-KV below, a shared stream is a placeholder owning its codes, then spliced; a predictor reading it is
 * refused. */
START_TEST(test_shared_candidate) {
    const char *names[] = {"kivi2", "kivi2s", "aqua2"};
    enum { NC = 3 };
    kv_plan *plans[NC];
    for (int c = 0; c < NC; c++) plans[c] = fit_candidate(names[c]);
    const int L = plans[0]->n_layers;
    ck_assert_int_ge(L, 4);
    int choice[64];
    for (int l = 0; l < L; l++) choice[2 * l] = choice[2 * l + 1] = l % 2;
    kv_plan *surg = NULL;
    ck_assert_kv_ok(kv_search_assemble(&surg, (const kv_plan *const *)plans, 2, choice, L));
    assert_same_plan(plans[1], surg, "kivi2 at even and kivi2s at odd layers differs from the kivi2s fit");
    kv_plan_free(surg);
    for (int i = 0; i < 2 * L; i++) choice[i] = 0;
    ck_assert_kv_ok(kv_search_assemble(&surg, (const kv_plan *const *)&plans[1], 1, choice, L)); /* even layers */
    kv_plan *even = NULL;
    ck_assert_kv_ok(kv_plan_create(&even, &plans[0]->fingerprint));
    even->global = plans[0]->global;
    for (int l = 0; l < L; l++)
        for (int st = 0; st < 2; st++) ck_assert_kv_ok(kv_search_copy_stream(even, l % 2 ? plans[0] : plans[1], l, st));
    kv_plan_free(surg);
    surg = NULL;
    ck_assert_kv_ok(kv_search_assemble(&surg, (const kv_plan *const *)plans, 1, choice, L));
    assert_same_plan(even, surg, "the kivi2s fit's even layers differ from the kivi2 fit's");
    kv_plan_free(surg);
    kv_plan_free(even);
    /* a shared stream is not copied above a stream of other codes */
    kv_plan *dst = NULL;
    ck_assert_kv_ok(kv_plan_create(&dst, &plans[0]->fingerprint));
    dst->global = plans[0]->global;
    ck_assert_int_eq(kv_search_copy_stream(dst, plans[1], 1, KV_PLAN_K), KV_EUNSUPPORTED);
    kv_plan_free(dst);
    const kv_search_candidate *c[NC];
    cand_ptrs(c, names, NC);
    unsigned char allowed[64 * NC];
    kv_search_allowed(allowed, c, NC, L);
    double kl[64 * NC];
    kv_search_sens_options so = {100, 2, g_bos, NULL, allowed};
    ck_assert_kv_ok(kv_search_sensitivity(kl, g_model, (const kv_plan *const *)plans, NC, g_ids + 4096, g_n - 4096, &so,
                                          NULL));
    /* layer 1 V with its partner through the whole model */
    const double pair = kl[(2 * 1 + 1) * NC + 1];
    ck_assert(isfinite(pair) && kl[(2 * 2 + 1) * NC + 1] == HUGE_VAL);
    kv_plan *two = NULL;
    ck_assert_kv_ok(kv_plan_create(&two, &plans[1]->fingerprint));
    two->global = plans[1]->global;
    ck_assert_kv_ok(kv_search_copy_stream(two, plans[1], 0, KV_PLAN_V));
    ck_assert_kv_ok(kv_search_copy_stream(two, plans[1], 1, KV_PLAN_V));
    kv_plan_eval ev;
    eval_plan_file(&ev, two, 100);
    fprintf(stderr, "layers 0-1 V, kivi2s pair: sensitivity %.6g, whole model %.6g; kivi2 layer 0 V alone %.6g\n", pair,
            ev.cmp.kl_mean, kl[1 * NC + 0]);
    ck_assert_msg(fabs(ev.cmp.kl_mean - pair) < 0.02 * pair + 2 * L * 2e-6, "pair %.6g vs whole model %.6g", pair,
                  ev.cmp.kl_mean);
    kv_plan_free(two);
    ck_assert_kv_ok(kv_search_pair_increments(kl, c, NC, L));
    ck_assert_double_eq_tol(kl[(2 * 1 + 1) * NC + 1], fmax(0.0, pair - kl[1 * NC + 0]), 1e-15);
    /* AQUA-KV-2 on layers 0-1, KIVI-2 on layer 2, kivi2s on layer 3 (odd: above kivi2), KIVI-2 above */
    for (int l = 0; l < L; l++) choice[2 * l] = choice[2 * l + 1] = l < 2 ? 2 : l == 3 ? 1 : 0;
    int with_kivi[64];
    memcpy(with_kivi, choice, sizeof with_kivi);
    with_kivi[6] = with_kivi[7] = 0;
    kv_plan *re = refit(names, NC, choice, L), *expect = refit(names, NC, with_kivi, L);
    ck_assert_kv_ok(kv_search_splice(re, (const kv_plan *const *)plans, c, NC, choice, L));
    ck_assert_int_eq(re->layers[3].stream[KV_PLAN_V].share_codes_with_layer, 2);
    for (int st = 0; st < 2; st++) ck_assert_kv_ok(kv_search_copy_stream(expect, plans[1], 3, st));
    ck_assert_kv_ok(kv_plan_set_report(expect, 0, NULL, NULL));
    assert_same_plan(re, expect, "the spliced refit differs from the kivi2 refit with the shared streams copied in");
    eval_plan_file(&ev, re, 200);
    ck_assert(isfinite(ev.cmp.kl_mean) && ev.cmp.kl_mean >= 0);
    kv_plan_free(re);
    kv_plan_free(expect);
    /* an AQUA-KV V at layer 4 would read V(3), a placeholder: refused */
    if (L >= 5) {
        choice[8] = choice[9] = 2;
        choice[6] = 2; /* K(3) AQUA-KV... */
        choice[4] = 2; /* ...above K(2) AQUA-KV */
        kv_fit_config cfg;
        ck_assert_int_eq(kv_search_refit_config(&cfg, c, NC, choice, L, k_common, 5), KV_EUNSUPPORTED);
        ck_assert_msg(strstr(kv_error_last(), "layer 3 V") != NULL, "%s", kv_error_last());
    }
    for (int k = 0; k < NC; k++) kv_plan_free(plans[k]);
}
END_TEST

/* Honest bytes: the per-stream counts of a mixed plan add up to the bits_per_value_total `kvrun eval --plan`
 * reports at the same context (kv_eval_plan, the tool's own function), exactly. The sensitivities:
 * finite, the f16 candidate far below 2-bit KIVI in every stream, and the summed KL falls with more bits. */
START_TEST(test_bytes_and_sensitivity) {
    const char *names[] = {"f16", "kivi2", "kivi4", "higgs2", "fp8", "nvfp4"};
    enum { NC = 6 };
    kv_plan *plans[NC];
    for (int c = 0; c < NC; c++) plans[c] = fit_candidate(names[c]);
    const int L = plans[0]->n_layers, ctx = 200;
    int choice[64];
    for (int i = 0; i < 2 * L; i++) choice[i] = i % NC;
    kv_plan *mix = NULL;
    ck_assert_kv_ok(kv_search_assemble(&mix, (const kv_plan *const *)plans, NC, choice, L));
    uint64_t bytes[64], values[64], tb = 0, tv = 0;
    ck_assert_kv_ok(kv_search_stream_bytes(bytes, values, mix, g_model, ctx));
    for (int i = 0; i < 2 * L; i++) tb += bytes[i], tv += values[i];
    kv_plan_eval ev;
    eval_plan_file(&ev, mix, ctx);
    /* the same byte counts divided the same way: equal up to the last bit of the division */
    ck_assert_msg(fabs(ev.bits_per_value_total - 8.0 * (double)tb / (double)tv) < 1e-12,
                  "kvrun eval counts %.15g bits, the per-stream sum %.15g", ev.bits_per_value_total,
                  8.0 * (double)tb / (double)tv);
    /* sensitivities on two chunks of 100 tokens past the fits' tokens */
    double kl[64 * NC];
    kv_search_sens_options so = {100, 2, g_bos, NULL, NULL};
    ck_assert_kv_ok(kv_search_sensitivity(kl, g_model, (const kv_plan *const *)plans, NC, g_ids + 4096, g_n - 4096, &so,
                                          NULL));
    double sum[NC] = {0};
    for (int i = 0; i < 2 * L; i++)
        for (int c = 0; c < NC; c++) {
            ck_assert(isfinite(kl[i * NC + c]) && kl[i * NC + c] >= 0);
            sum[c] += kl[i * NC + c];
        }
    for (int i = 0; i < 2 * L; i++)
        /* f16 rounds once (relative 2^-11), 2-bit KIVI errs by ~10-30% of a value's range: orders of magnitude
         * apart in KL; 10x leaves room for a stream that barely matters */
        ck_assert_msg(kl[i * NC + 0] * 10 < kl[i * NC + 1], "stream %d: f16 %g, kivi2 %g", i, kl[i * NC], kl[i * NC + 1]);
    ck_assert_msg(sum[2] < sum[1], "kivi4 %g >= kivi2 %g", sum[2], sum[1]);
    fprintf(stderr, "sensitivity sums: f16 %g kivi2 %g kivi4 %g higgs2 %g fp8 %g nvfp4 %g\n", sum[0], sum[1], sum[2],
            sum[3], sum[4], sum[5]);
    kv_plan_free(mix);
    for (int c = 0; c < NC; c++) kv_plan_free(plans[c]);
}
END_TEST

/* The decoding cost model (model/decode_cost.c) on stories260K: every layer's step and compression are measured
 * (positive, finite), the plan's seconds are their sum, the weights' part is measured, the ratio is the closed form;
 * bad arguments refused. Timings are not compared with each other here (noisy on a loaded machine): the model's
 * error against kvrun bench is a benchmark (SEARCH.md §7, BENCHMARKS.md). */
START_TEST(test_decode_cost) {
    kv_plan *kivi = fit_candidate("kivi2");
    const kv_plan *plans[2] = {NULL, kivi}; /* NULL: the f16 cache */
    for (int p = 0; p < 2; p++) {
        kv_decode_cost dc;
        ck_assert_kv_ok(kv_decode_cost_measure(&dc, plans[p], g_model, 200, 3));
        ck_assert_int_eq(dc.n_layers, kivi->n_layers);
        double sum = 0;
        for (int l = 0; l < dc.n_layers; l++) {
            ck_assert(dc.step[l] > 0 && isfinite(dc.step[l]));
            ck_assert(dc.compress[l] > 0 && isfinite(dc.compress[l])); /* every append takes some time */
            sum += dc.step[l] + dc.compress[l];
        }
        ck_assert(fabs(sum - dc.seconds) <= 1e-12 * sum);
        kv_decode_cost_free(&dc);
    }
    double w = 0;
    ck_assert_kv_ok(kv_decode_weights_seconds(&w, g_model, 3));
    ck_assert(w > 0 && isfinite(w));
    ck_assert(fabs(kv_decode_speed_ratio(1.0, 1.0, 3.0) - 2.0) < 1e-15);
    kv_decode_cost dc;
    ck_assert_int_eq(kv_decode_cost_measure(&dc, kivi, g_model, 200, 0), KV_EINVAL);
    ck_assert_int_eq(kv_decode_cost_measure(&dc, kivi, g_model, 0, 3), KV_EINVAL);
    kv_plan_free(kivi);
}
END_TEST

static Suite *search_suite(int with_data) {
    Suite *s = suite_create("search");
    TCase *tc = tcase_create("allocate");
    tcase_add_test(tc, test_allocate_brute);
    tcase_add_test(tc, test_allocate_timed);
    tcase_add_test(tc, test_allocate_units);
    tcase_add_test(tc, test_allocate_tight);
    tcase_add_test(tc, test_allocate_chain);
    tcase_add_test(tc, test_chain_init);
    tcase_add_test(tc, test_allocate_refusals);
    tcase_add_test(tc, test_candidates);
    tcase_add_test(tc, test_context_scale);
    tcase_add_test(tc, test_layer_allocate);
    suite_add_tcase(s, tc);
    if (with_data) {
        TCase *td = tcase_create("stories260K");
        tcase_add_checked_fixture(td, setup, teardown);
        tcase_set_timeout(td, 600);
        tcase_add_test(td, test_surgery_equals_fit_kivi);
        tcase_add_test(td, test_surgery_equals_fit_higgs);
        tcase_add_test(td, test_surgery_refuses_predictor);
        tcase_add_test(td, test_bytes_and_sensitivity);
        tcase_add_test(td, test_decode_cost);
        tcase_add_test(td, test_refit_equals_aqua);
        tcase_add_test(td, test_refit_equals_aqua_uniform);
        tcase_add_test(td, test_refit_equals_kivi_g128);
        tcase_add_test(td, test_gptq_predictors);
        tcase_add_test(td, test_refit_mixed);
        tcase_add_test(td, test_sensitivity_predicted);
        tcase_add_test(td, test_lowrank_predictors);
        tcase_add_test(td, test_squat_candidate);
        tcase_add_test(td, test_shared_candidate);
        suite_add_tcase(s, td);
    }
    return s;
}

int main(void) {
    const char *dir = kv_test_data_dir();
    int with_data = 0;
    if (dir) {
        char path[4096];
        snprintf(path, sizeof path, "%s/stories260K/stories260K.bin", dir);
        FILE *fp = fopen(path, "rb");
        if (fp) with_data = 1, fclose(fp);
    }
    if (!with_data) fprintf(stderr, "test_search: no stories260K in KVCAL_DATA_DIR: the model tests are skipped\n");
    return kv_test_run(search_suite(with_data));
}
