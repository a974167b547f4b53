/* gguf_slice — a smaller GGUF of a real model for a lent GPU machine, whose calls carry at most 64 MiB
 * (scripts/gpu-check.sh): the first N decoder layers of IN (every metadata key copied, block_count set to N,
 * the tensors of later layers dropped) and, with --embd-q4_1, the token embedding re-quantized to Q4_1 (min/max
 * per block of 32, as ggml's reference quantizer does). The CPU and the GPU then read the same file, so their
 * results can be compared; the model is a prefix of the real one, not the real one (its perplexity is not the
 * model's). Not a test.
 *
 * usage: gguf_slice IN OUT --layers N [--embd-q4_1] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kv_formats.h"

static void die(kv_status s) {
    fprintf(stderr, "gguf_slice: %s: %s\n", kv_status_name(s), kv_error_last());
    exit(1);
}

/* One Q4_1 block of 32 values: f16 d, f16 m, 16 bytes of nibbles (value j low, j + 16 high); x = d q + m. */
static void q4_1_block(uint8_t *out, const float *x) {
    float mn = x[0], mx = x[0];
    for (int i = 1; i < 32; i++) {
        mn = x[i] < mn ? x[i] : mn;
        mx = x[i] > mx ? x[i] : mx;
    }
    const float d = (mx - mn) / 15.0f, id = d ? 1.0f / d : 0.0f;
    kv_store_u16le(out, kv_f32_to_f16(d));
    kv_store_u16le(out + 2, kv_f32_to_f16(mn));
    for (int j = 0; j < 16; j++) {
        int a = (int)((x[j] - mn) * id + 0.5f), b = (int)((x[j + 16] - mn) * id + 0.5f);
        a = a > 15 ? 15 : a, b = b > 15 ? 15 : b;
        out[4 + j] = (uint8_t)(a | (b << 4));
    }
}

int main(int argc, char **argv) {
    if (argc < 5 || strcmp(argv[3], "--keep") != 0) {
        fprintf(stderr, "usage: gguf_slice IN OUT --keep a-b[,c-d...] [--embd-q4_1]\n");
        return 2;
    }
    const int requant = argc > 5 && strcmp(argv[5], "--embd-q4_1") == 0;
    int newidx[4096], keep = 0;
    for (int i = 0; i < 4096; i++) newidx[i] = -1;
    for (char *t = strtok(argv[4], ","); t; t = strtok(NULL, ",")) {
        int a = 0, b = 0;
        if (sscanf(t, "%d-%d", &a, &b) != 2) b = a = atoi(t);
        for (int l = a; l <= b && l >= 0 && l < 4096; l++) newidx[l] = keep++;
    }
    kv_gguf *g = NULL;
    kv_gguf_writer *w = NULL;
    kv_status s = kv_gguf_open(&g, argv[1]);
    if (s != KV_OK) die(s);
    if ((s = kv_gguf_writer_create(&w)) != KV_OK) die(s);
    char arch[64] = "llama", *a = NULL;
    if (kv_gguf_get_str(g, "general.architecture", &a) == KV_OK) {
        snprintf(arch, sizeof arch, "%s", a);
        free(a);
    }
    char bc[96];
    snprintf(bc, sizeof bc, "%s.block_count", arch);
    for (size_t i = 0; i < kv_gguf_kv_count(g); i++) {
        const kv_gguf_kv *kv = kv_gguf_kv_at(g, i);
        if (strcmp(kv->key, bc) == 0)
            s = kv_gguf_writer_set_u32(w, bc, (uint32_t)keep);
        else if (strcmp(kv->key, "general.name") == 0) {
            char name[256];
            const int len = kv->value.v.str.len < 180 ? (int)kv->value.v.str.len : 180;
            snprintf(name, sizeof name, "%.*s (%d of its layers)", len, kv->value.v.str.ptr, keep);
            s = kv_gguf_writer_set_str(w, kv->key, name);
        } else
            s = kv_gguf_writer_set_value(w, kv->key, &kv->value);
        if (s != KV_OK) die(s);
    }
    for (size_t i = 0; i < kv_gguf_tensor_count(g); i++) {
        const kv_tensor_info *t = kv_gguf_tensor_at(g, i);
        int layer = -1, used = 0;
        char renamed[256];
        const char *name = t->name;
        if (sscanf(t->name, "blk.%d.%n", &layer, &used) == 1 && used > 0) {
            if (layer < 0 || layer >= 4096 || newidx[layer] < 0) continue;
            snprintf(renamed, sizeof renamed, "blk.%d.%s", newidx[layer], t->name + used);
            name = renamed;
        }
        if (requant && strcmp(t->name, "token_embd.weight") == 0 && t->ne[0] % 32 == 0) {
            const size_t n = (size_t)(t->ne[0] * t->ne[1]);
            float *x = malloc(n * sizeof(float));
            uint8_t *q = malloc(n / 32 * 20);
            if (!x || !q) die(KV_ERR(KV_ENOMEM, "out of memory"));
            if ((s = kv_dequantize(x, t->data, t->dtype, n)) != KV_OK) die(s);
            for (size_t b = 0; b < n / 32; b++) q4_1_block(q + b * 20, x + b * 32);
            s = kv_gguf_writer_add_tensor(w, name, KV_DTYPE_Q4_1, t->n_dims, t->ne, q);
            free(x), free(q);
        } else {
            s = kv_gguf_writer_add_tensor(w, name, t->dtype, t->n_dims, t->ne, t->data);
        }
        if (s != KV_OK) die(s);
    }
    if ((s = kv_gguf_writer_write(w, argv[2])) != KV_OK) die(s);
    kv_gguf_writer_free(w);
    kv_gguf_close(g);
    return 0;
}
