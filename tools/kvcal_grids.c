/* kvcal grids: generate a Gaussian-optimal HIGGS grid (LBG + Lloyd) and write it as a grid file. */
#include "kv_calib.h"
#include "kv_tools.h"

#include <stdlib.h>

int kvcal_grids(int argc, char **argv) {
    long dim = 0, size = 0, seed = 1, samples = 0, eval = 1000000;
    const char *out = NULL;
    int json = 0;
    const kv_opt opts[] = {
        {"dim", 'd', KV_OPT_INT, &dim, "D", "grid dimension: 1, 2, 4 or 8", 1},
        {"size", 'n', KV_OPT_INT, &size, "N", "grid points: a power of two, 2..256", 1},
        {"out", 'o', KV_OPT_STRING, &out, "FILE", "grid file to write (calib/GRID_FORMAT.md)", 1},
        {"seed", 0, KV_OPT_INT, &seed, "S", "seed of the training samples (default 1)", 0},
        {"samples", 0, KV_OPT_INT, &samples, "M", "training samples (default max(1000 N, 131072))", 0},
        {"eval-samples", 0, KV_OPT_INT, &eval, "M", "fresh N(0,1) samples for the reported MSE (default 1e6)", 0},
        {"json", 0, KV_OPT_FLAG, &json, NULL, "print the result as JSON", 0},
        {NULL, 0, KV_OPT_FLAG, NULL, NULL, NULL, 0},
    };
    kv_cli_args a;
    int rc = kv_cli_parse(&a, "kvcal grids", "--dim D --size N --out FILE [--seed S] [--samples M]",
                          "Generate a grid of N points in D dimensions that minimizes the mean squared error for "
                          "standard Gaussian vectors (LBG splitting + Lloyd iterations on seeded samples; "
                          "deterministic), write it atomically, and print its MSE per dimension on fresh samples.",
                          opts, 0, argc, argv);
    if (rc != KV_EXIT_OK) return rc < 0 ? KV_EXIT_OK : rc;
    if (seed < 0) {
        kv_cli_args_free(&a);
        return kv_cli_usage_error("kvcal grids", "--seed must be >= 0");
    }
    if (samples < 0 || eval < 1) {
        kv_cli_args_free(&a);
        return kv_cli_usage_error("kvcal grids", "--samples must be >= 0 and --eval-samples >= 1");
    }
    if (!((dim == 1 || dim == 2 || dim == 4 || dim == 8) && size >= 2 && size <= 256 && !(size & (size - 1)))) {
        kv_cli_args_free(&a);
        return kv_cli_usage_error("kvcal grids", "--dim must be 1, 2, 4 or 8 and --size a power of two in 2..256");
    }
    int n_threads = 0; /* KVCAL_THREADS under the one rule; OpenMP follows it */
    if ((rc = kv_tool_threads("kvcal grids", 0, &n_threads)) != KV_EXIT_OK) {
        kv_cli_args_free(&a);
        return rc;
    }
    {   /* the output location before the (long) generation */
        const kv_tool_path outs[] = {{"--out", out}};
        if ((rc = kv_tool_check_io("kvcal grids", NULL, 0, outs, 1)) != KV_EXIT_OK) {
            kv_cli_args_free(&a);
            return rc;
        }
    }
    {   /* the training samples are held whole (samples x dim floats): refused before allocating them */
        const double m_samples = samples ? (double)samples : (size * 1000.0 > 131072 ? size * 1000.0 : 131072);
        char what[128];
        snprintf(what, sizeof what, "--samples %.0f in %ld dimensions", m_samples, dim);
        if (kv_tool_check_memory(m_samples * (double)dim * sizeof(float), what) != KV_OK) {
            kv_cli_args_free(&a);
            return kv_cli_fail("kvcal grids", KV_ENOMEM);
        }
    }
    kv_progress prog;
    kv_grid_opts go = {.seed = (uint64_t)seed, .samples = (size_t)samples, .progress = a.quiet ? NULL : &prog};
    float *points = NULL;
    double train = 0.0, fresh = 0.0;
    const double t0 = kv_now_seconds();
    kv_status s = kv_grid_generate(&points, &train, (int)dim, (int)size, &go);
    const double t1 = kv_now_seconds();
    const size_t used = go.samples ? go.samples : ((size_t)size * 1000 > 131072 ? (size_t)size * 1000 : 131072);
    /* fresh samples: a different stream than training's */
    if (s == KV_OK) s = kv_grid_mse(&fresh, points, (int)dim, (int)size, (uint64_t)seed ^ 0x9e3779b97f4a7c15ull, (size_t)eval);
    if (s == KV_OK) s = kv_grid_write(out, points, (int)dim, (int)size, (uint64_t)seed, used);
    free(points);
    kv_cli_args_free(&a);
    if (s != KV_OK) return kv_cli_fail("kvcal grids", s);
    if (json) {
        printf("{\"dim\": %ld, \"size\": %ld, \"seed\": %ld, \"samples\": %zu, \"train_mse\": %.6g, "
               "\"mse\": %.6g, \"eval_samples\": %ld, \"seconds\": %.3f, \"out\": ",
               dim, size, seed, used, train, fresh, eval, t1 - t0);
        kv_tool_json_string(stdout, out);
        printf("}\n");
    } else
        printf("grid d=%ld n=%ld: MSE per dimension %.6g on %ld fresh N(0,1) samples (training %.6g on %zu "
               "samples, %.1f s) -> %s\n",
               dim, size, fresh, eval, train, used, t1 - t0, out);
    return KV_EXIT_OK;
}
