/* kvrun: thin main — dispatch to the subcommands in kvrun_*.c. */
#include "kv_tools.h"

static const kv_subcommand k_commands[] = {
    {"eval", "perplexity on held-out text; with --plan: ppl, KL, bits of a compressed cache", kvrun_eval},
    {"generate", "generate text through the incremental decoder and the KV cache (greedy or sampled)", kvrun_generate},
    {"info", "describe a model: architecture, tensors, KV cache per token", kvrun_info},
    {"inspect", "print a compression plan (YAML/JSON); --check it against a model", kvrun_inspect},
    {"bench", "decode and prefill speed and bytes held, with a plan or an f32/f16 cache", kvrun_bench},
    {"selfcheck", "the runtime's CPU-vs-GPU self-check for every kind of codec (or one plan)", kvrun_selfcheck},
    {NULL, NULL, NULL},
};

int main(int argc, char **argv) {
    return kv_cli_dispatch("kvrun", "kvrun — apply a compression plan: evaluate, generate, inspect plans and models.", k_commands, argc, argv);
}
