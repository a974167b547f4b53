/* kvcal fit checkpoints (fit_internal.h): after each layer, the state needed to continue is written
 * into a directory next to the output plan, so that a killed run resumes from its last finished
 * layer. Layout of the directory (calib/FIT.md §6):
 *
 *   manifest              text: format line, sha256 of the inputs, last finished layer, shard count,
 *                         file names
 *   state.<L>.<k>.bin     shard k: hidden states after layer L, reconstructed K/V of layer L
 *                         (written by the rank that owns the shard)
 *   report.<L>.bin        the per-layer report numbers so far
 *   plan.<L>.kvplan       the plan so far (a valid plan: later layers still full precision)
 *   kvcal-fit-checkpoint  the owner file, written by the run that created the directory: a directory
 *                         without it is not kvcal's and is refused (kv_fit_ckpt_check_dir), and only
 *                         the names above (and their temporaries) are ever removed, never the user's
 *
 * Every file is written atomically (temporary file, rename; the manifest and plan also fsync'd) and
 * the manifest last, after every rank's shard files are in place, naming files that carry the layer
 * number, so a crash of any rank at any point leaves either the previous complete checkpoint or the
 * new one. State is per shard, not per rank: a run resumed with another number of ranks reads the
 * same files. The state files are private to this machine's float layout (checked by a byte-order
 * mark) and carry a CRC-32 of their payload. */
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

/* SHA-256 of a file read in 1 MiB pieces: a mapping of the whole file would count in the resident
 * set until unmapped (the whole model, which layer streaming is there to avoid). */
static kv_status sha256_file_read(char out[65], const char *path) {
    FILE *fp = fopen(path, "rb");
    if (!fp) return KV_ERR(KV_EIO, "cannot open '%s': %s", path, strerror(errno));
    enum { PIECE = 1 << 20 };
    uint8_t *buf = malloc(PIECE);
    if (!buf) {
        fclose(fp);
        return KV_ERR(KV_ENOMEM, "out of memory");
    }
    kv_sha256 h;
    kv_sha256_init(&h);
    size_t n;
    while ((n = fread(buf, 1, PIECE, fp)) > 0) kv_sha256_update(&h, buf, n);
    const int bad = ferror(fp);
    fclose(fp);
    free(buf);
    if (bad) return KV_ERR(KV_EIO, "reading '%s': %s", path, strerror(errno));
    uint8_t d[32];
    kv_sha256_final(&h, d);
    kv_sha256_hex(out, d);
    return KV_OK;
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
        kv_status s = sha256_file_read(hex, path);
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

/* Is `n` exactly a name this module writes: state.<L>.<k>.bin, plan.<L>.kvplan, report.<L>.bin,
 * manifest, the owner file, or the temporary of one of them (<name>.tmp.<pid>)? *layer: its L (-1 for
 * the manifest and the owner file). Anything else in the directory is the user's and is left alone. */
static int our_name(const char *n, int *layer) {
    char base[256];
    const char *t = strstr(n, ".tmp.");
    size_t len = strlen(n);
    if (t) { /* a temporary: digits to the end */
        const char *q = t + 5;
        if (!*q) return 0;
        for (; *q; q++)
            if (*q < '0' || *q > '9') return 0;
        len = (size_t)(t - n);
    }
    if (len >= sizeof base) return 0;
    memcpy(base, n, len);
    base[len] = 0;
    *layer = -1;
    if (strcmp(base, "manifest") == 0 || strcmp(base, KV_FIT_CKPT_OWNER) == 0) return 1;
    int l = -1, end = 0;
    long long k = -1;
    if (sscanf(base, "state.%d.%lld.bin%n", &l, &k, &end) == 2 && base[end] == 0 && l >= 0 && k >= 0) goto layer;
    end = 0;
    if (sscanf(base, "plan.%d.kvplan%n", &l, &end) == 1 && base[end] == 0 && l >= 0) goto layer;
    end = 0;
    if (sscanf(base, "report.%d.bin%n", &l, &end) == 1 && base[end] == 0 && l >= 0) goto layer;
    return 0;
layer:
    *layer = l;
    return 1;
}

/* Remove our files from dir except those of layer `keep` and the manifest and owner file (keep -1:
 * every file of ours). */
static void remove_files(const char *dir, int keep) {
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        const char *n = e->d_name;
        int l = -1;
        if (!our_name(n, &l)) continue;
        const int tmp = strstr(n, ".tmp.") != NULL;
        if (keep >= 0 && !tmp && (l == keep || l < 0)) continue;
        char *p = join(dir, n);
        if (p) unlink(p);
        free(p);
    }
    closedir(d);
}

kv_status kv_fit_ckpt_check_dir(const char *dir) {
    struct stat sb;
    if (lstat(dir, &sb) != 0) return errno == ENOENT ? KV_OK : KV_ERR(KV_EIO, "'%s': %s", dir, strerror(errno));
    if (S_ISLNK(sb.st_mode))
        return KV_ERR(KV_EINVAL, "'%s' (the checkpoint directory) is a symbolic link: refusing to follow it (remove it, "
                      "or use --no-checkpoint)", dir);
    if (!S_ISDIR(sb.st_mode))
        return KV_ERR(KV_EINVAL, "'%s' (the checkpoint directory) exists and is not a directory", dir);
    char *owner = join(dir, KV_FIT_CKPT_OWNER);
    if (!owner) return KV_ERR(KV_ENOMEM, "out of memory");
    const int ours = lstat(owner, &sb) == 0 && S_ISREG(sb.st_mode);
    free(owner);
    if (!ours)
        return KV_ERR(KV_EINVAL, "'%s' exists and was not made by kvcal fit (it has no %s file): refusing to use "
                      "or clean up a directory it did not create (move it away, or use --no-checkpoint)", dir,
                      KV_FIT_CKPT_OWNER);
    return KV_OK;
}

/* Create the checkpoint directory with its owner file (the run that creates it owns it). */
static kv_status make_dir(const char *dir) {
    if (mkdir(dir, 0777) == 0) {
        char *owner = join(dir, KV_FIT_CKPT_OWNER);
        if (!owner) return KV_ERR(KV_ENOMEM, "out of memory");
        static const char text[] = "kvcal fit checkpoint directory: kvcal fit removes its files (manifest, state.*, "
                                   "plan.*, report.*) and this directory when it is done\n";
        kv_status s = kv_write_file_atomic(owner, text, sizeof text - 1);
        free(owner);
        return s;
    }
    if (errno != EEXIST) return KV_ERR(KV_EIO, "creating checkpoint directory '%s': %s", dir, strerror(errno));
    return KV_OK;
}

void kv_fit_ckpt_clear(const char *dir) { remove_files(dir, -1); }

void kv_fit_ckpt_drop_partial(const char *dir, int keep) {
    if (keep >= 0) remove_files(dir, keep);
    else (void)kv_fit_ckpt_remove(dir);
}

kv_status kv_fit_ckpt_remove(const char *dir) {
    remove_files(dir, -1);
    char *owner = join(dir, KV_FIT_CKPT_OWNER);
    if (owner) unlink(owner);
    free(owner);
    if (rmdir(dir) != 0 && errno != ENOENT && errno != ENOTEMPTY && errno != EEXIST)
        return KV_ERR(KV_EIO, "removing checkpoint directory '%s': %s", dir, strerror(errno));
    return KV_OK; /* a directory still holding the user's files stays */
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

/* A binary checkpoint file: 64-byte header (magic, byte-order mark, then the u64 fields given), the
 * payload pieces, CRC-32 of the payload. */
typedef struct piece {
    void *p;
    size_t n;
} piece;

/* Write atomically (rename) without fsync: a process killed at any point leaves the old or the new
 * file, which is what resuming needs; after a power loss a file whose data did not reach the disk
 * fails its size or CRC check and the run starts over. Syncing the state (hundreds of MB per layer
 * on a real model) would cost more than the layer. */
static kv_status write_bin(const char *path, const char *magic, const uint64_t *fields, int n_fields,
                           const piece *pieces, int n_pieces) {
    kv_atomic_file af;
    kv_status s = kv_atomic_open(&af, path);
    if (s != KV_OK) return s;
    uint8_t hdr[CKPT_HEADER];
    memset(hdr, 0, sizeof hdr);
    memcpy(hdr, magic, 8);
    const uint32_t bom = CKPT_BOM;
    memcpy(hdr + 8, &bom, 4); /* host order: a reader on another byte order rejects the file */
    for (int i = 0; i < n_fields; i++) kv_store_u64le(hdr + 16 + 8 * i, fields[i]);
    uLong crc = crc32(0L, Z_NULL, 0);
    int ok = fwrite(hdr, 1, sizeof hdr, af.fp) == sizeof hdr;
    for (int i = 0; i < n_pieces && ok; i++) ok = write_all(af.fp, pieces[i].p, pieces[i].n, &crc);
    uint8_t tr[4];
    kv_store_u32le(tr, (uint32_t)crc);
    ok = ok && fwrite(tr, 1, 4, af.fp) == 4;
    if (!ok) {
        kv_atomic_abort(&af);
        return KV_ERR(KV_EIO, "writing checkpoint '%s': %s", path, strerror(errno));
    }
    const int closed = fclose(af.fp) == 0;
    af.fp = NULL;
    if (!closed || rename(af.tmp_path, af.final_path) != 0) {
        s = KV_ERR(KV_EIO, "writing checkpoint '%s': %s", path, strerror(errno));
        unlink(af.tmp_path);
    }
    free(af.tmp_path);
    free(af.final_path);
    return s;
}

/* Read a file written by write_bin whose header fields must equal `fields`. */
static kv_status read_bin(const char *path, const char *magic, const uint64_t *fields, int n_fields, const piece *pieces,
                          int n_pieces) {
    FILE *fp = fopen(path, "rb");
    if (!fp) return KV_ERR(KV_EIO, "cannot open '%s': %s", path, strerror(errno));
    kv_status s = KV_OK;
    uint8_t hdr[CKPT_HEADER];
    uint32_t bom;
    if (fread(hdr, 1, sizeof hdr, fp) != sizeof hdr || memcmp(hdr, magic, 8) != 0) {
        s = KV_ERR(KV_EFORMAT, "'%s' is not a kvcal fit checkpoint file of this kind", path);
        goto done;
    }
    memcpy(&bom, hdr + 8, 4);
    int same = bom == CKPT_BOM;
    for (int i = 0; i < n_fields && same; i++) same = kv_load_u64le(hdr + 16 + 8 * i) == fields[i];
    if (!same) {
        s = KV_ERR(KV_EFORMAT, "'%s' does not match this run (layer, shard, sizes or byte order)", path);
        goto done;
    }
    uLong crc = crc32(0L, Z_NULL, 0);
    uint8_t tr[4];
    int ok = 1;
    for (int i = 0; i < n_pieces && ok; i++) ok = read_all(fp, pieces[i].p, pieces[i].n, &crc);
    if (!ok || fread(tr, 1, 4, fp) != 4) {
        s = KV_ERR(KV_EFORMAT, "'%s' is truncated", path);
        goto done;
    }
    if (kv_load_u32le(tr) != (uint32_t)crc) s = KV_ERR(KV_ECHECKSUM, "'%s': CRC mismatch", path);
done:
    fclose(fp);
    return s;
}

#define STATE_MAGIC "KVFITSH2"
#define REPORT_MAGIC "KVFITRP2"

static char *state_path(const char *dir, int layer, int64_t shard) {
    char name[96];
    snprintf(name, sizeof name, "state.%d.%lld.bin", layer, (long long)shard);
    return join(dir, name);
}

kv_status kv_fit_ckpt_save_shard(const char *dir, int layer, int64_t shard, int64_t n_shards, const float *hidden,
                                 uint64_t n_hidden, const float *kp, const float *vp, uint64_t n_kv) {
    kv_status ms = make_dir(dir);
    if (ms != KV_OK) return ms;
    char *path = state_path(dir, layer, shard);
    if (!path) return KV_ERR(KV_ENOMEM, "out of memory");
    const uint64_t f[5] = {(uint64_t)layer, (uint64_t)shard, (uint64_t)n_shards, n_hidden, n_kv};
    const piece p[3] = {{(void *)hidden, (size_t)n_hidden * sizeof(float)},
                        {(void *)kp, (size_t)n_kv * sizeof(float)},
                        {(void *)vp, (size_t)n_kv * sizeof(float)}};
    kv_status s = write_bin(path, STATE_MAGIC, f, 5, p, 3);
    free(path);
    return s;
}

kv_status kv_fit_ckpt_load_shard(const char *dir, int layer, int64_t shard, int64_t n_shards, float *hidden,
                                 uint64_t n_hidden, float *kp, float *vp, uint64_t n_kv) {
    char *path = state_path(dir, layer, shard);
    if (!path) return KV_ERR(KV_ENOMEM, "out of memory");
    const uint64_t f[5] = {(uint64_t)layer, (uint64_t)shard, (uint64_t)n_shards, n_hidden, n_kv};
    const piece p[3] = {{hidden, (size_t)n_hidden * sizeof(float)},
                        {kp, (size_t)n_kv * sizeof(float)},
                        {vp, (size_t)n_kv * sizeof(float)}};
    kv_status s = read_bin(path, STATE_MAGIC, f, 5, p, 3);
    free(path);
    return s;
}

kv_status kv_fit_ckpt_commit(const char *dir, const char *inputs_hash, int layer, int n_layers, int64_t n_shards,
                             const kv_plan *plan, const double *report) {
    kv_status ms = make_dir(dir);
    if (ms != KV_OK) return ms;
    char name[64];
    kv_status s = KV_OK;
    char *report_path = NULL, *plan_path = NULL, *man_path = NULL;
    snprintf(name, sizeof name, "report.%d.bin", layer);
    report_path = join(dir, name);
    snprintf(name, sizeof name, "plan.%d.kvplan", layer);
    plan_path = join(dir, name);
    man_path = join(dir, "manifest");
    if (!report_path || !plan_path || !man_path) {
        s = KV_ERR(KV_ENOMEM, "out of memory");
        goto done;
    }
    {
        const uint64_t f[3] = {(uint64_t)layer, (uint64_t)n_layers, KV_FIT_CKPT_DOUBLES};
        const piece p[1] = {{(void *)report, (size_t)n_layers * KV_FIT_CKPT_DOUBLES * sizeof(double)}};
        if ((s = write_bin(report_path, REPORT_MAGIC, f, 3, p, 1)) != KV_OK) goto done;
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
                               "kvcal-fit-checkpoint 2\ninputs %s\nlayer %d\nn_layers %d\nshards %lld\n"
                               "state state.%d.<shard>.bin\nreport report.%d.bin\nplan plan.%d.kvplan\n",
                               inputs_hash, layer, n_layers, (long long)n_shards, layer, layer, layer);
        if ((s = kv_write_file_atomic(man_path, man, (size_t)n)) != KV_OK) goto done;
    }
    remove_files(dir, layer);
done:
    free(report_path);
    free(plan_path);
    free(man_path);
    return s;
}

void kv_fit_ckpt_manifest(int *layer, const char **why, const char *dir, const char *inputs_hash, int n_layers,
                          int64_t n_shards) {
    *layer = -1;
    *why = NULL;
    char *man_path = join(dir, "manifest");
    if (!man_path) {
        *why = "out of memory";
        return;
    }
    char *man = NULL;
    size_t size = 0;
    kv_status s = kv_file_read_all(&man, &size, man_path);
    free(man_path);
    if (s != KV_OK) { /* no checkpoint (or an unreadable one): start from layer 0 */
        kv_error_clear();
        return;
    }
    char hash[80] = "";
    int l = -1, nl = -1, version = 0;
    long long shards = -1;
    const int n = sscanf(man, "kvcal-fit-checkpoint %d inputs %70s layer %d n_layers %d shards %lld", &version, hash, &l,
                         &nl, &shards);
    free(man);
    if (n != 5 || version != 2 || nl != n_layers || l < 0 || l >= n_layers - 1)
        *why = "its manifest is not one this version writes";
    else if (strcmp(hash, inputs_hash) != 0)
        *why = "it was made from different inputs (model, corpus, configuration or tool version)";
    else if (shards != (long long)n_shards)
        *why = "it was made with another number of shards";
    else
        *layer = l;
}

kv_status kv_fit_ckpt_load_common(kv_plan **plan, double *report, const char *dir, int layer, int n_layers) {
    *plan = NULL;
    char name[64];
    snprintf(name, sizeof name, "plan.%d.kvplan", layer);
    char *plan_path = join(dir, name);
    snprintf(name, sizeof name, "report.%d.bin", layer);
    char *report_path = join(dir, name);
    kv_status s = KV_OK;
    if (!plan_path || !report_path) {
        s = KV_ERR(KV_ENOMEM, "out of memory");
    } else {
        const uint64_t f[3] = {(uint64_t)layer, (uint64_t)n_layers, KV_FIT_CKPT_DOUBLES};
        const piece p[1] = {{report, (size_t)n_layers * KV_FIT_CKPT_DOUBLES * sizeof(double)}};
        s = read_bin(report_path, REPORT_MAGIC, f, 3, p, 1);
        if (s == KV_OK) s = kv_plan_read(plan, plan_path);
    }
    free(plan_path);
    free(report_path);
    return s;
}
