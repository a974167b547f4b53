/* The cost reference of an importance profile (kv_importance_time_forwards): plain forward passes, logits
 * included, over exactly the prompts kv_importance_run sampled, so that `kvprof importance --compare-forward`
 * can state how much one forward+backward per prompt costs against inference over the same tokens. */
#include "kv_profile.h"

#include <stdlib.h>
#include <string.h>

kv_status kv_importance_time_forwards(double *seconds, kv_model *m, const kv_importance *imp, const int32_t *tokens,
                                      int bos) {
    const int len = imp->prompt_len, body = len - (bos >= 0);
    int32_t *buf = malloc(sizeof(int32_t) * (size_t)len);
    float *logits = malloc(sizeof(float) * (size_t)len * (size_t)kv_model_arch(m)->vocab_size);
    if (!buf || !logits) {
        free(buf);
        free(logits);
        return KV_ERR(KV_ENOMEM, "out of memory");
    }
    kv_status s = KV_OK;
    const double t0 = kv_now_seconds();
    for (int p = 0; p < imp->n_prompts && s == KV_OK; p++) {
        int n = 0;
        if (bos >= 0) buf[n++] = bos;
        memcpy(buf + n, tokens + imp->prompt_starts[p], sizeof(int32_t) * (size_t)body);
        kv_forward f;
        memset(&f, 0, sizeof f);
        f.tokens = buf, f.n_seqs = 1, f.n_tokens = len, f.logits = logits; /* a whole forward: logits too */
        s = kv_model_forward(m, &f);
    }
    *seconds = kv_now_seconds() - t0;
    free(buf);
    free(logits);
    return s;
}
