/* kvprof: thin main — dispatch to the subcommands in kvprof_*.c. */
#include "kv_tools.h"

static const kv_subcommand k_commands[] = {
    {"importance", "KVmix layer importance (gradient norms), bit allocation, RPC ratios", kvprof_importance},
    {"budget", "quantized pruning: token-precision operating points under a memory budget", kvprof_budget},
    {NULL, NULL, NULL},
};

int main(int argc, char **argv) {
    return kv_cli_dispatch("kvprof", "kvprof — profile a model's KV cache: KVmix layer importance, bit allocation, budget search.", k_commands, argc, argv);
}
