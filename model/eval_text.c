/* eval_text.c — perplexity of a text's tokens with the tokenizer's BOS conventions (kv_eval_perplexity_text),
 * what `kvrun eval` runs without a plan: protocol all prefixes every chunk with the tokenizer's BOS; protocol
 * llama.cpp sees the text as llama.cpp's perplexity tool tokenizes it, BOS first when the vocabulary adds one,
 * and no BOS at all otherwise. kv_eval_perplexity (eval.c) takes the tokens as given; this file only prepares
 * them and the BOS id. */
#include "kv_model.h"

#include <stdlib.h>
#include <string.h>

kv_status kv_eval_perplexity_text(kv_ppl_result *out, kv_model *m, const kv_tokenizer *tok, const int32_t *ids,
                                  size_t n_ids, const kv_ppl_options *opt) {
    kv_ppl_options po = *opt;
    const int32_t bos = kv_tokenizer_bos(tok);
    const int adds_bos = kv_tokenizer_add_bos_default(tok);
    po.bos_id = opt->protocol == KV_PPL_LLAMACPP && !adds_bos ? -1 : bos;
    if (opt->protocol != KV_PPL_LLAMACPP || !adds_bos || bos < 0)
        return kv_eval_perplexity(out, m, ids, n_ids, &po);
    /* llama.cpp tokenizes the text with BOS first when the vocabulary adds it */
    int32_t *with_bos = malloc(sizeof(int32_t) * (n_ids + 1));
    if (!with_bos) return KV_ERR(KV_ENOMEM, "out of memory");
    with_bos[0] = bos;
    memcpy(with_bos + 1, ids, sizeof(int32_t) * n_ids);
    const kv_status s = kv_eval_perplexity(out, m, with_bos, n_ids + 1, &po);
    free(with_bos);
    return s;
}
