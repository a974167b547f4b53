/* weights_file.c — kv_model_load / kv_model_open: a kv_model from a model file (GGUF, HF
 * safetensors, llama2.c) through the canonical tensor names of kv_formats.h section 3, shapes checked
 * against the file's kv_arch. (Separate from weights.c so that code building models from memory does
 * not link the file readers.) */
#include "forward_internal.h"

/* The tensor `name` with exactly the shape ne (trailing dims of 1 are equivalent). */
static kv_status find_tensor(const kv_tensor_info **out, const kv_model_file *mf, const char *name, int n_dims,
                             const uint64_t ne[4]) {
    const kv_tensor_info *t = kv_model_file_find(mf, name);
    if (!t) return KV_ENOTFOUND;
    for (int i = 0; i < 4; i++) {
        const uint64_t want = i < n_dims ? ne[i] : 1;
        const uint64_t got = i < t->n_dims ? t->ne[i] : 1;
        if (want != got)
            return KV_ERR(KV_EFORMAT,
                          "%s: tensor '%s' has shape [%llu, %llu, %llu, %llu], the architecture needs "
                          "[%llu, %llu] (GGML order)",
                          kv_model_file_path(mf), name, (unsigned long long)t->ne[0],
                          (unsigned long long)t->ne[1], (unsigned long long)t->ne[2],
                          (unsigned long long)t->ne[3], (unsigned long long)ne[0],
                          (unsigned long long)(n_dims > 1 ? ne[1] : 1));
    }
    *out = t;
    return KV_OK;
}

static kv_status file_reader(void *user, const char *name, int n_dims, const uint64_t ne[4], float *dst) {
    const kv_model_file *mf = user;
    const kv_tensor_info *t = NULL;
    kv_status s = find_tensor(&t, mf, name, n_dims, ne);
    if (s != KV_OK) return s;
    s = kv_model_file_read_f32(mf, t, dst);
    if (s != KV_OK) return kv_error_wrap(s, "reading tensor '%s': ", name);
    return KV_OK;
}

static kv_status file_raw(void *user, const char *name, int n_dims, const uint64_t ne[4], int *dtype,
                          const uint8_t **data, size_t *row_bytes) {
    const kv_model_file *mf = user;
    const kv_tensor_info *t = NULL;
    kv_status s = find_tensor(&t, mf, name, n_dims, ne);
    if (s != KV_OK) return s;
    if ((s = kv_dtype_row_bytes(row_bytes, t->dtype, t->ne[0])) != KV_OK)
        return kv_error_wrap(s, "tensor '%s': ", name);
    *dtype = t->dtype;
    *data = t->data;
    return KV_OK;
}

/* The tensor has been copied or decoded: hand its mapped pages back (they count in the resident set
 * until then; for a streamed model that is the whole point). name NULL: every page of the file —
 * a page fault maps the file's neighbouring cached pages too (the kernel's fault-around), which
 * belong to other tensors and would otherwise stay counted. */
static void file_done(void *user, const char *name) {
    const kv_model_file *mf = user;
    if (!name) {
        kv_model_file_release_pages(mf, NULL);
        return;
    }
    const kv_tensor_info *t = kv_model_file_find(mf, name);
    if (t) kv_model_file_release_pages(mf, t);
}

static const kv_model_raw_source k_file_source = {file_raw, file_done};

static kv_status load(kv_model **out, const kv_model_file *mf, const kv_model_options *opt, int stream) {
    if (!out || !mf) return KV_ERR(KV_EINVAL, "kv_model_load: NULL argument");
    *out = NULL;
    const kv_arch *a = kv_model_file_arch(mf);
    if (!a) return KV_ERR(KV_EINVAL, "kv_model_load: model file has no architecture");
    kv_status s = kv_model_create_raw(out, a, file_reader, &k_file_source, (void *)mf, opt, stream);
    if (s != KV_OK) return kv_error_wrap(s, "loading model '%s': ", kv_model_file_path(mf));
    return KV_OK;
}

kv_status kv_model_load(kv_model **out, const kv_model_file *mf, const kv_model_options *opt) {
    return load(out, mf, opt, 0);
}

kv_status kv_model_load_streamed(kv_model **out, const kv_model_file *mf, const kv_model_options *opt) {
    return load(out, mf, opt, 1);
}

kv_status kv_model_open(kv_model **out, const char *path, const kv_model_options *opt) {
    if (!out || !path) return KV_ERR(KV_EINVAL, "kv_model_open: NULL argument");
    *out = NULL;
    kv_model_file *mf = NULL;
    kv_status s = kv_model_file_open(&mf, path);
    if (s != KV_OK) return s;
    s = kv_model_load(out, mf, opt);
    kv_model_file_close(mf);
    return s;
}

