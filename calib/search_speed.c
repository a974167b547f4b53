/* search_speed.c — decoding speed as a constraint of kv_search_run (SEARCH.md §7). With --min-decode-speed R a
 * plan must decode at least R times the f16 cache's tokens/s at its context on this machine. The cost model
 * (model/kv_bench.h) gives each (context, stream, candidate) its seconds of a decoding step, measured by the runtime;
 * a step costs the weights' part plus the sum over streams, so the floor is a second additive budget beside the
 * bytes: sum_i t_i <= (w + t_f16) / R - w. The knapsack takes it by Lagrangian relaxation
 * (kv_search_allocate_timed); each written plan is then measured end to end (kv_bench_run, the plan against the f16
 * cache) and the run reports predicted against measured. */
#define _POSIX_C_SOURCE 200809L
#include "kv_bench.h"
#include "search_internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static double choice_sum(const double *t, const int *choice, int n_items, int n_choices) {
    double sum = 0;
    for (int i = 0; i < n_items; i++) sum += t[(size_t)i * n_choices + choice[i]];
    return sum;
}

kv_status kv_search_allocate_timed(int *choice, const uint64_t *cost, const double *value, const double *time,
                                   double time_budget, const unsigned char *allowed, const kv_search_chain *chain,
                                   int n_items, int n_choices, uint64_t budget, double *lambda_out) {
    if (!choice || !cost || !value || !time || !(time_budget >= 0) || n_items < 1 || n_choices < 1)
        return KV_ERR(KV_EINVAL, "kv_search_allocate_timed: bad arguments");
    const size_t n = (size_t)n_items * (size_t)n_choices;
    if (lambda_out) *lambda_out = 0;
    kv_status s = kv_search_allocate(choice, cost, value, allowed, chain, n_items, n_choices, budget, 0, NULL);
    if (s != KV_OK || choice_sum(time, choice, n_items, n_choices) <= time_budget) return s;
    double vmax = 0, tmin = INFINITY;
    for (size_t i = 0; i < n; i++) {
        if (allowed && !allowed[i]) continue;
        if (isfinite(value[i]) && fabs(value[i]) > vmax) vmax = fabs(value[i]);
        if (time[i] > 0 && time[i] < tmin) tmin = time[i];
    }
    if (!isfinite(tmin)) return KV_ERR(KV_EINVAL, "kv_search_allocate_timed: no choice takes any time");
    double *v2 = malloc(n * sizeof *v2);
    int *c2 = malloc((size_t)n_items * sizeof *c2);
    if (!v2 || !c2) {
        free(v2);
        free(c2);
        return KV_ERR(KV_ENOMEM, "out of memory");
    }
    /* lambda * time comparable to the values at lam0; the bracket [lo, hi]: lo infeasible, hi feasible */
    const double lam0 = (vmax > 0 ? vmax : 1.0) / tmin;
    double lo = lam0 * 1e-9, hi = lam0, best = INFINITY, least_time = INFINITY;
    int found = 0;
    for (int it = 0, phase = 0; it < 160; it++) {
        const double lam = phase == 0 ? hi : sqrt(lo * hi);
        for (size_t i = 0; i < n; i++) v2[i] = value[i] + lam * time[i];
        if ((s = kv_search_allocate(c2, cost, v2, allowed, chain, n_items, n_choices, budget, 0, NULL)) != KV_OK) break;
        const double t = choice_sum(time, c2, n_items, n_choices);
        least_time = t < least_time ? t : least_time;
        const int ok = t <= time_budget;
        if (ok) {
            const double v = choice_sum(value, c2, n_items, n_choices);
            if (v < best) {
                best = v, found = 1;
                memcpy(choice, c2, (size_t)n_items * sizeof *choice);
                if (lambda_out) *lambda_out = lam;
            }
        }
        if (phase == 0) { /* grow hi until feasible (or 1e24 times lam0: time then rules every choice) */
            if (ok) phase = 1, it = 110; /* 48 bisection steps follow */
            else if (hi > lam0 * 1e24) break;
            else lo = hi, hi *= 16;
        } else if (ok) {
            hi = lam;
        } else {
            lo = lam;
        }
    }
    free(v2);
    free(c2);
    if (s != KV_OK) return s;
    if (!found)
        return KV_ERR(KV_EINVAL, "no assembly within the byte budget meets the decoding speed floor: its time "
                      "budget is %.3g ms per step for the cache, the least found within the bytes is %.3g ms",
                      time_budget * 1e3, least_time * 1e3);
    return KV_OK;
}

/* "cpu: MODEL NAME, N threads" (the first "model name" of /proc/cpuinfo; "cpu" where there is none). */
static void device_name(char *out, size_t cap, int threads) {
    char line[256], name[160] = "unknown CPU";
    FILE *f = fopen("/proc/cpuinfo", "r");
    while (f && fgets(line, sizeof line, f))
        if (strncmp(line, "model name", 10) == 0) {
            const char *p = strchr(line, ':');
            if (p) {
                p++;
                while (*p == ' ' || *p == '\t') p++;
                snprintf(name, sizeof name, "%s", p);
                name[strcspn(name, "\n")] = '\0';
            }
            break;
        }
    if (f) fclose(f);
    snprintf(out, cap, "cpu: %s, %d threads", name, threads);
}

kv_status kv_search_speed_measure(search_run *r) {
    const kv_search_request *q = r->req;
    kv_search_result *res = r->res;
    if (!(q->min_decode_speed > 0)) return KV_OK;
    const double t0 = kv_now_seconds();
    const int steps = q->speed_steps > 0 ? q->speed_steps : 8, nc = r->nc;
    res->cache_seconds = calloc(r->table_len * (size_t)q->n_contexts, sizeof *res->cache_seconds);
    res->f16_seconds = calloc((size_t)q->n_contexts, sizeof *res->f16_seconds);
    r->f16_tps = calloc((size_t)q->n_contexts, sizeof *r->f16_tps);
    if (!res->cache_seconds || !res->f16_seconds || !r->f16_tps) return KV_ERR(KV_ENOMEM, "out of memory");
    device_name(res->device, sizeof res->device, kv_model_threads(q->model));
    kv_status s = kv_decode_weights_seconds(&res->weights_seconds, q->model, 2 * steps);
    for (int k = 0; k < q->n_contexts && s == KV_OK; k++) {
        const int ctx = (int)q->contexts[k];
        kv_decode_cost dc;
        if ((s = kv_decode_cost_measure(&dc, NULL, q->model, ctx, steps)) != KV_OK) break;
        res->f16_seconds[k] = dc.seconds;
        kv_decode_cost_free(&dc);
        kv_log(KV_LOG_INFO, "search: decoding cost at context %d: weights %.2f ms, the f16 cache %.2f ms per step", ctx,
               res->weights_seconds * 1e3, res->f16_seconds[k] * 1e3);
        for (int c = 0; c < nc && s == KV_OK; c++) {
            if ((s = kv_decode_cost_measure(&dc, r->plans[c], q->model, ctx, steps)) != KV_OK) {
                kv_error_wrap(s, "candidate %s: decoding cost: ", r->cands[c]->name);
                break;
            }
            /* a layer's keys and values are attended together: each stream is given half of its layer's cost
             * (the model's assumption; the end-to-end measure of the written plans checks it) */
            for (int l = 0; l < r->L; l++)
                for (int st = 0; st < 2; st++)
                    res->cache_seconds[r->table_len * k + (size_t)(2 * l + st) * nc + c] =
                        0.5 * (dc.step[l] + dc.compress[l]);
            kv_log(KV_LOG_INFO, "search: decoding cost at context %d: %s %.2f ms per step, predicted %.2fx the f16 "
                   "cache", ctx, r->cands[c]->name, dc.seconds * 1e3,
                   kv_decode_speed_ratio(res->weights_seconds, dc.seconds, res->f16_seconds[k]));
            kv_decode_cost_free(&dc);
        }
    }
    res->seconds_speed += kv_now_seconds() - t0;
    return s;
}

double kv_search_time_budget(const search_run *r, int k) {
    const kv_search_result *res = r->res;
    const double w = res->weights_seconds;
    return (w + res->f16_seconds[k]) / r->req->min_decode_speed - w;
}

double kv_search_single_seconds(const search_run *r, int k, int c) {
    double t = 0;
    for (int i = 0; i < r->n_items; i++) t += r->res->cache_seconds[r->table_len * k + (size_t)i * r->nc + c];
    return t;
}

double kv_search_choice_seconds(const search_run *r, int k, const int *choice) {
    return choice_sum(r->res->cache_seconds + r->table_len * k, choice, r->n_items, r->nc);
}

kv_status kv_search_speed_check(search_run *r, kv_search_point *pt) {
    const kv_search_request *q = r->req;
    if (!(q->min_decode_speed > 0)) return KV_OK;
    const int k = pt->ctx_index, ctx = (int)q->contexts[k];
    const int decode = q->speed_decode > 0 ? q->speed_decode : 32;
    const double t0 = kv_now_seconds();
    const kv_bench_options bo = {ctx, decode, 1, 512, NULL, 0, 1};
    kv_bench_result br;
    kv_cache *cache = NULL;
    kv_plan *plan = NULL;
    kv_status s = KV_OK;
    if (r->f16_tps[k] == 0) { /* the f16 cache once per context */
        if ((s = kv_cache_rt_create(&cache, NULL, q->model, 1, ctx + decode, 0, 0)) == KV_OK &&
            (s = kv_bench_run(&br, q->model, cache, &bo)) == KV_OK)
            r->f16_tps[k] = br.decode_tokens_per_second;
        kv_cache_free(cache);
        cache = NULL;
    }
    if (s == KV_OK && (s = kv_plan_read(&plan, pt->path)) == KV_OK &&
        (s = kv_cache_rt_create(&cache, plan, q->model, 1, ctx + decode, 0, 0)) == KV_OK &&
        (s = kv_bench_run(&br, q->model, cache, &bo)) == KV_OK) {
        pt->plan_tps = br.decode_tokens_per_second, pt->f16_tps = r->f16_tps[k];
        pt->measured_speed = pt->f16_tps > 0 ? pt->plan_tps / pt->f16_tps : 0.0;
        kv_log(pt->measured_speed < q->min_decode_speed ? KV_LOG_WARN : KV_LOG_INFO,
               "search: budget %g at context %d: decodes at %.2fx the f16 cache (%.1f against %.1f tokens/s; "
               "predicted %.2fx, floor %.2fx)", pt->budget_bits, ctx, pt->measured_speed, pt->plan_tps, pt->f16_tps,
               pt->predicted_speed, q->min_decode_speed);
    }
    kv_cache_free(cache);
    kv_plan_free(plan);
    r->res->seconds_speed += kv_now_seconds() - t0;
    return s;
}
