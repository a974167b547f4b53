/* generate_prompt.c — what kv_generate is given for a text prompt: the prompt's tokens (BOS first when the
 * vocabulary adds it, and always for an empty prompt, which has nothing else to start from) and the tokens
 * generation stops at (every end-of-generation token, and BOS: a new document begins, as llama2.c stops).
 * kvrun generate's conventions, kept next to the generation they feed. */
#include "kv_model.h"

#include <stdlib.h>
#include <string.h>

kv_status kv_gen_prompt_tokens(int32_t **ids, size_t *n, const kv_tokenizer *tok, const char *prompt) {
    *ids = NULL, *n = 0;
    const int32_t bos = kv_tokenizer_bos(tok);
    const unsigned flags = (bos >= 0 && (kv_tokenizer_add_bos_default(tok) || !*prompt)) ? KV_TOK_ADD_BOS : 0;
    kv_status s = kv_tokenizer_encode(ids, n, tok, prompt, strlen(prompt), flags);
    if (s == KV_OK && *n == 0) s = KV_ERR(KV_EINVAL, "an empty prompt needs a BOS token, and this vocabulary has none");
    return s;
}

kv_status kv_gen_stop_tokens(int32_t **ids, int *n, const kv_tokenizer *tok, int n_vocab) {
    const int nv = kv_tokenizer_n_vocab(tok) < n_vocab ? kv_tokenizer_n_vocab(tok) : n_vocab;
    const int32_t bos = kv_tokenizer_bos(tok);
    *n = 0;
    if (!(*ids = malloc(sizeof(int32_t) * ((size_t)nv + 1)))) return KV_ERR(KV_ENOMEM, "out of memory");
    for (int32_t id = 0; id < nv; id++)
        if (kv_tokenizer_is_eog(tok, id) || id == bos) (*ids)[(*n)++] = id;
    return KV_OK;
}
