/* kvcal: thin main — dispatch to the subcommands in kvcal_*.c. */
#include "kv_tools.h"

static const kv_subcommand k_commands[] = {
    {"fit", "calibrate a compression plan on a corpus (AQUA-KV, HIGGS, KIVI), with held-out metrics", kvcal_fit},
    {"export", "write a plan's FP8 / NVFP4 KV scales into a Hugging Face checkpoint (compressed-tensors, modelopt)",
     kvcal_export},
    {"search", "choose a method per layer and stream under a budget of honest bits (plan surgery of single-method "
               "fits, per-stream KL sensitivity, exact knapsack), validated end to end", kvcal_search},
    {"grids", "generate a Gaussian-optimal HIGGS grid file (LBG + Lloyd)", kvcal_grids},
    {NULL, NULL, NULL},
};

int main(int argc, char **argv) {
    return kv_cli_dispatch("kvcal", "kvcal — calibrate a KV-cache compression plan for a model on a text corpus.", k_commands, argc, argv);
}
