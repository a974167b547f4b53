/* kvcal fit checkpoints (fit_internal.h): after each layer, the state needed to continue is written
 * into a directory next to the output plan, so that a killed run resumes from its last finished
 * layer. Layout of the directory (calib/FIT.md):
 *
 *   manifest            text: format line, sha256 of the inputs, last finished layer, file names
 *   state.<L>.bin       hidden states after layer L, reconstructed K/V of layer L, per-layer report
 *   plan.<L>.kvplan     the plan so far (a valid plan: later layers still full precision)
 *
 * Every file is written atomically (temporary file, rename; the manifest and plan also fsync'd) and
 * the manifest last, naming
 * files that carry the layer number, so a crash at any point leaves either the previous complete
 * checkpoint or the new one. The state file is private to this machine (host float layout, checked
 * by a byte-order mark) and carries a CRC-32 of its payload. */
#define _POSIX_C_SOURCE 200809L
#include "fit_internal.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#define CKPT_MAGIC "KVFITCK1"
#define CKPT_HEADER 64
#define CKPT_BOM 0x0A0B0C0Du

/* ---- inputs hash ---------------------------------------------------------------------------------- */
static void hash_u64(kv_sha256 *h, uint64_t v) {
    uint8_t b[8];
    kv_store_u64le(b, v);
    kv_sha256_update(h, b, 8);
}

static void hash_str(kv_sha256 *h, const char *s) {
    const size_t n = s ? strlen(s) : 0;
    hash_u64(h, n);
    if (n) kv_sha256_update(h, s, n);
}

static void hash_tokens(kv_sha256 *h, const int32_t *t, size_t n) {
    uint8_t buf[4096];
    hash_u64(h, n);
    for (size_t i = 0; i < n;) {
        size_t k = 0;
        for (; k < sizeof buf / 4 && i < n; k++, i++) kv_store_u32le(buf + 4 * k, (uint32_t)t[i]);
        kv_sha256_update(h, buf, 4 * k);
    }
}

kv_status kv_fit_inputs_hash(char out[65], const kv_model_file *mf, const kv_plan_fingerprint *fp,
                             const kv_fit_data *data, const kv_fit_config *cfg, const kv_fit_options *opt) {
    kv_sha256 h;
    kv_sha256_init(&h);
    kv_sha256_update(&h, "kvcal-fit-inputs 1\n", 19);
    /* the model: the fingerprint, and the whole file's sha256 when it is one file */
    kv_sha256_update(&h, fp->arch, sizeof fp->arch);
    const int dims[] = {fp->n_layers, fp->d_model, fp->n_heads, fp->n_kv_heads, fp->head_dim, fp->vocab_size};
    for (size_t i = 0; i < sizeof dims / sizeof *dims; i++) hash_u64(&h, (uint64_t)(int64_t)dims[i]);
    uint8_t rt[4];
    kv_store_f32le(rt, fp->rope_theta);
    kv_sha256_update(&h, rt, 4);
    kv_sha256_update(&h, fp->kv_sha256, 32);
    const char *path = mf ? kv_model_file_path(mf) : NULL;
    struct stat st;
    if (path && stat(path, &st) == 0 && S_ISREG(st.st_mode)) {
        char hex[65];
        kv_status s = kv_sha256_file(hex, path);
        if (s != KV_OK) return kv_error_wrap(s, "hashing the model file for the checkpoint: ");
        hash_str(&h, hex);
    } else {
        hash_str(&h, "-");
    }
    hash_tokens(&h, data->tokens, data->n_tokens);
    hash_u64(&h, data->heldout_tokens != NULL);
    if (data->heldout_tokens) hash_tokens(&h, data->heldout_tokens, data->n_heldout_tokens);
    hash_u64(&h, (uint64_t)(int64_t)data->bos_id);
    char *yaml = NULL;
    kv_status s = kv_fit_config_dump(&yaml, cfg);
    if (s != KV_OK) return s;
    hash_str(&h, yaml);
    free(yaml);
    hash_str(&h, opt->tool_version);
    hash_str(&h, opt->git_hash);
    hash_str(&h, opt->corpus_sha256);
    uint8_t d[32];
    kv_sha256_final(&h, d);
    kv_sha256_hex(out, d);
    return KV_OK;
}

/* ---- files ------------------------------------------------------------------------------------------ */
static char *join(const char *dir, const char *name) {
    const size_t n = strlen(dir) + strlen(name) + 2;
    char *p = malloc(n);
    if (p) snprintf(p, n, "%s/%s", dir, name);
    return p;
}

/* Remove our files from dir except those of layer `keep` (-1: all, and the manifest). */
static void remove_files(const char *dir, int keep) {
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    char keep_state[64], keep_plan[64];
    snprintf(keep_state, sizeof keep_state, "state.%d.bin", keep);
    snprintf(keep_plan, sizeof keep_plan, "plan.%d.kvplan", keep);
    while ((e = readdir(d)) != NULL) {
        const char *n = e->d_name;
        const int ours = strncmp(n, "state.", 6) == 0 || strncmp(n, "plan.", 5) == 0 ||
                         (keep < 0 && strncmp(n, "manifest", 8) == 0);
        if (!ours) continue;
        if (keep >= 0 && (strcmp(n, keep_state) == 0 || strcmp(n, keep_plan) == 0)) continue;
        if (keep >= 0 && strncmp(n, "manifest", 8) == 0) continue;
        char *p = join(dir, n);
        if (p) unlink(p);
        free(p);
    }
    closedir(d);
}

kv_status kv_fit_ckpt_remove(const char *dir) {
    remove_files(dir, -1);
    if (rmdir(dir) != 0 && errno != ENOENT)
        return KV_ERR(KV_EIO, "removing checkpoint directory '%s': %s", dir, strerror(errno));
    return KV_OK;
}

void kv_fit_ckpt_free(kv_fit_ckpt *ck) {
    if (!ck) return;
    kv_plan_free(ck->plan);
    free(ck->layer_report);
    ck->plan = NULL;
    ck->layer_report = NULL;
}

static uLong crc_update(uLong crc, const void *p, size_t n) {
    const Bytef *b = p;
    while (n > 0) {
        const uInt k = n > (1u << 30) ? (1u << 30) : (uInt)n;
        crc = crc32(crc, b, k);
        b += k;
        n -= k;
    }
    return crc;
}

static int write_all(FILE *fp, const void *p, size_t n, uLong *crc) {
    *crc = crc_update(*crc, p, n);
    return fwrite(p, 1, n, fp) == n;
}

static int read_all(FILE *fp, void *p, size_t n, uLong *crc) {
    if (fread(p, 1, n, fp) != n) return 0;
    *crc = crc_update(*crc, p, n);
    return 1;
}

kv_status kv_fit_ckpt_save(const char *dir, const char *inputs_hash, int layer, const kv_plan *plan,
                           const double *layer_report, int n_layers, const float *hidden, uint64_t n_hidden,
                           const float *kp, const float *vp, uint64_t n_kv) {
    if (mkdir(dir, 0777) != 0 && errno != EEXIST)
        return KV_ERR(KV_EIO, "creating checkpoint directory '%s': %s", dir, strerror(errno));
    char name[64];
    kv_status s = KV_OK;
    char *state_path = NULL, *plan_path = NULL, *man_path = NULL;
    snprintf(name, sizeof name, "state.%d.bin", layer);
    state_path = join(dir, name);
    snprintf(name, sizeof name, "plan.%d.kvplan", layer);
    plan_path = join(dir, name);
    man_path = join(dir, "manifest");
    if (!state_path || !plan_path || !man_path) {
        s = KV_ERR(KV_ENOMEM, "out of memory");
        goto done;
    }
    /* state file */
    {
        kv_atomic_file af;
        if ((s = kv_atomic_open(&af, state_path)) != KV_OK) goto done;
        uint8_t hdr[CKPT_HEADER];
        memset(hdr, 0, sizeof hdr);
        memcpy(hdr, CKPT_MAGIC, 8);
        const uint32_t bom = CKPT_BOM;
        memcpy(hdr + 8, &bom, 4); /* host order: a reader on another byte order rejects the file */
        kv_store_u32le(hdr + 12, (uint32_t)layer);
        kv_store_u32le(hdr + 16, (uint32_t)n_layers);
        kv_store_u32le(hdr + 20, KV_FIT_CKPT_DOUBLES);
        kv_store_u64le(hdr + 24, n_hidden);
        kv_store_u64le(hdr + 32, n_kv);
        uLong crc = crc32(0L, Z_NULL, 0);
        int ok = fwrite(hdr, 1, sizeof hdr, af.fp) == sizeof hdr;
        ok = ok && write_all(af.fp, layer_report, (size_t)n_layers * KV_FIT_CKPT_DOUBLES * sizeof(double), &crc);
        ok = ok && write_all(af.fp, hidden, (size_t)n_hidden * sizeof(float), &crc);
        ok = ok && write_all(af.fp, kp, (size_t)n_kv * sizeof(float), &crc);
        ok = ok && write_all(af.fp, vp, (size_t)n_kv * sizeof(float), &crc);
        uint8_t tr[4];
        kv_store_u32le(tr, (uint32_t)crc);
        ok = ok && fwrite(tr, 1, 4, af.fp) == 4;
        if (!ok) {
            kv_atomic_abort(&af);
            s = KV_ERR(KV_EIO, "writing checkpoint '%s': %s", state_path, strerror(errno));
            goto done;
        }
        /* Renamed into place without fsync: a process killed at any point leaves the old or the new
         * file (the rename is atomic), which is what resuming needs; after a power loss a file whose
         * data did not reach the disk fails its size or CRC check and the run starts over. Syncing
         * the state (hundreds of MB per layer on a real model) would cost more than the layer. */
        const int closed = fclose(af.fp) == 0;
        af.fp = NULL;
        if (!closed || rename(af.tmp_path, af.final_path) != 0) {
            s = KV_ERR(KV_EIO, "writing checkpoint '%s': %s", state_path, strerror(errno));
            unlink(af.tmp_path);
            free(af.tmp_path);
            free(af.final_path);
            goto done;
        }
        free(af.tmp_path);
        free(af.final_path);
    }
    /* uncompressed: zlib level 9 over the predictors (MBs) would cost more than the whole write */
    kv_plan_write_options wo;
    memset(&wo, 0, sizeof wo);
    wo.compress = 0;
    if ((s = kv_plan_write(plan, plan_path, &wo)) != KV_OK) {
        s = kv_error_wrap(s, "writing checkpoint plan: ");
        goto done;
    }
    {
        char man[512];
        const int n = snprintf(man, sizeof man,
                               "kvcal-fit-checkpoint 1\ninputs %s\nlayer %d\nn_layers %d\nstate state.%d.bin\n"
                               "plan plan.%d.kvplan\n",
                               inputs_hash, layer, n_layers, layer, layer);
        if ((s = kv_write_file_atomic(man_path, man, (size_t)n)) != KV_OK) goto done;
    }
    remove_files(dir, layer);
done:
    free(state_path);
    free(plan_path);
    free(man_path);
    return s;
}

/* Why a checkpoint cannot be used (KV_OK = it can). */
static kv_status load_state(const char *path, int layer, int n_layers, double *report, float *hidden,
                            uint64_t n_hidden, float *kp, float *vp, uint64_t n_kv) {
    FILE *fp = fopen(path, "rb");
    if (!fp) return KV_ERR(KV_EIO, "cannot open '%s': %s", path, strerror(errno));
    kv_status s = KV_OK;
    uint8_t hdr[CKPT_HEADER];
    uint32_t bom;
    if (fread(hdr, 1, sizeof hdr, fp) != sizeof hdr || memcmp(hdr, CKPT_MAGIC, 8) != 0) {
        s = KV_ERR(KV_EFORMAT, "'%s' is not a kvcal fit state file", path);
        goto done;
    }
    memcpy(&bom, hdr + 8, 4);
    if (bom != CKPT_BOM || kv_load_u32le(hdr + 12) != (uint32_t)layer || kv_load_u32le(hdr + 16) != (uint32_t)n_layers ||
        kv_load_u32le(hdr + 20) != KV_FIT_CKPT_DOUBLES || kv_load_u64le(hdr + 24) != n_hidden ||
        kv_load_u64le(hdr + 32) != n_kv) {
        s = KV_ERR(KV_EFORMAT, "'%s' does not match this run (layer, sizes or byte order)", path);
        goto done;
    }
    uLong crc = crc32(0L, Z_NULL, 0);
    uint8_t tr[4];
    if (!read_all(fp, report, (size_t)n_layers * KV_FIT_CKPT_DOUBLES * sizeof(double), &crc) ||
        !read_all(fp, hidden, (size_t)n_hidden * sizeof(float), &crc) || !read_all(fp, kp, (size_t)n_kv * sizeof(float), &crc) ||
        !read_all(fp, vp, (size_t)n_kv * sizeof(float), &crc) || fread(tr, 1, 4, fp) != 4) {
        s = KV_ERR(KV_EFORMAT, "'%s' is truncated", path);
        goto done;
    }
    if (kv_load_u32le(tr) != (uint32_t)crc) s = KV_ERR(KV_ECHECKSUM, "'%s': CRC mismatch", path);
done:
    fclose(fp);
    return s;
}

kv_status kv_fit_ckpt_load(kv_fit_ckpt *ck, const char *dir, const char *inputs_hash, int n_layers,
                           float *hidden, uint64_t n_hidden, float *kp, float *vp, uint64_t n_kv) {
    memset(ck, 0, sizeof *ck);
    ck->layer = -1;
    char *man_path = join(dir, "manifest");
    if (!man_path) return KV_ERR(KV_ENOMEM, "out of memory");
    char *man = NULL;
    size_t size = 0;
    kv_status s = kv_file_read_all(&man, &size, man_path);
    free(man_path);
    if (s != KV_OK) { /* no checkpoint (or an unreadable one): start from layer 0 */
        kv_error_clear();
        struct stat st;
        if (stat(dir, &st) == 0) remove_files(dir, -1);
        return KV_OK;
    }
    char hash[80] = "";
    int layer = -1, nl = -1, version = 0;
    const int n = sscanf(man, "kvcal-fit-checkpoint %d inputs %70s layer %d n_layers %d", &version, hash, &layer, &nl);
    free(man);
    const char *why = NULL;
    if (n != 4 || version != 1 || nl != n_layers || layer < 0 || layer >= n_layers - 1)
        why = "its manifest is not one this version writes";
    else if (strcmp(hash, inputs_hash) != 0)
        why = "it was made from different inputs (model, corpus, configuration or tool version)";
    if (!why) {
        char name[64];
        snprintf(name, sizeof name, "plan.%d.kvplan", layer);
        char *plan_path = join(dir, name);
        snprintf(name, sizeof name, "state.%d.bin", layer);
        char *state_path = join(dir, name);
        ck->layer_report = malloc((size_t)n_layers * KV_FIT_CKPT_DOUBLES * sizeof(double));
        if (!plan_path || !state_path || !ck->layer_report) {
            free(plan_path);
            free(state_path);
            kv_fit_ckpt_free(ck);
            return KV_ERR(KV_ENOMEM, "out of memory");
        }
        s = kv_plan_read(&ck->plan, plan_path);
        if (s == KV_OK) s = load_state(state_path, layer, n_layers, ck->layer_report, hidden, n_hidden, kp, vp, n_kv);
        free(plan_path);
        free(state_path);
        if (s != KV_OK) why = kv_error_last();
    }
    if (why) {
        kv_log(KV_LOG_WARN, "fit: not resuming from the checkpoint in %s: %s; starting over", dir, why);
        kv_error_clear();
        kv_fit_ckpt_free(ck);
        remove_files(dir, -1);
        ck->layer = -1;
        return KV_OK;
    }
    ck->layer = layer;
    return KV_OK;
}
