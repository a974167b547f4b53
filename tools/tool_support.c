/* tool_support.c — steps the tools share: open a model with its tokenizer, tokenize a text file
 * incrementally, validate outputs and thread counts before any work, warn about contexts longer
 * than the model was trained for. */
#define _POSIX_C_SOURCE 200809L
#define _DEFAULT_SOURCE /* realpath */
#include "kv_tools.h"
#include "kvrt.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <omp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- incremental tokenization ------------------------------------------------------------------- */
static int ascii_letter(unsigned char c) { return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z'); }

/* The last position p < n where the text can be cut without changing its tokens: a space between two
 * ASCII letters ("...abc| def"), cut before the space. Every tokenizer here keeps " def" together
 * and ends the word before it at the space: byte-level BPE pre-tokenizers (GPT-2, Llama 3, Qwen2:
 * ` ?\p{L}+` / `[^\r\n\p{L}\p{N}]?\p{L}+`) and SentencePiece BPE (no piece holds a space after its
 * first character), so tokenizing the pieces gives the tokens of the whole text (tests/tools checks
 * this on WikiText with both kinds). 0 when there is none. */
static size_t last_cut(const char *buf, size_t n, size_t from) {
    for (size_t p = n >= 2 ? n - 2 : 0; p >= 1 && p >= from; p--)
        if (buf[p] == ' ' && ascii_letter((unsigned char)buf[p - 1]) && ascii_letter((unsigned char)buf[p + 1]))
            return p;
    return 0;
}

/* Text without such a space (a CJK corpus, code, base64) is cut after a line break that stands alone
 * between two non-space characters ("...abc\n|def"): the byte-level pre-tokenizers end a token at
 * "\n" and never join it to the letters after it, and SentencePiece has no piece across a line break;
 * the piece after it starts with no space, so it is encoded without the dummy prefix
 * (KV_TOK_NO_SPACE_PREFIX). tests/tools checks it on WikiText with every space made '_', with both
 * tokenizer kinds. 0 when there is none. Both searches look at positions >= from only: the bytes
 * before were searched when they were read (so a long text without a cut is read in linear time). */
static size_t last_line_cut(const char *buf, size_t n, size_t from) {
    for (size_t p = n >= 1 ? n - 1 : 0; p >= 2 && p >= from; p--)
        if (buf[p - 1] == '\n' && !isspace((unsigned char)buf[p]) && !isspace((unsigned char)buf[p - 2])) return p;
    return 0;
}

static int same_tokens(const kv_tokenizer *t, const char *a, unsigned fa, const char *b, unsigned fb) {
    int32_t *x = NULL, *y = NULL;
    size_t nx = 0, ny = 0;
    int same = kv_tokenizer_encode(&x, &nx, t, a, strlen(a), fa) == KV_OK &&
               kv_tokenizer_encode(&y, &ny, t, b, strlen(b), fb) == KV_OK && nx == ny &&
               (nx == 0 || memcmp(x, y, nx * sizeof *x) == 0);
    free(x);
    free(y);
    kv_error_clear();
    return same;
}

/* How to encode a piece that continues the text (it starts with the space before a word): without
 * the dummy prefix, so that its space stays the one space the whole text has there; but a
 * SentencePiece normalizer that strips leading spaces (remove_extra_whitespaces) drops it, and then
 * the dummy prefix puts it back. Found by probing the tokenizer. *flags = -1: no per-piece encoding
 * reproduces the whole text's (leading spaces stripped and no dummy prefix): tokenize in one piece. */
static void continuation_flags(const kv_tokenizer *t, long *flags) {
    const int strips = same_tokens(t, " a", KV_TOK_NO_SPACE_PREFIX, "a", KV_TOK_NO_SPACE_PREFIX);
    if (!strips) *flags = KV_TOK_NO_SPACE_PREFIX;
    else if (!same_tokens(t, "a", 0, "a", KV_TOK_NO_SPACE_PREFIX)) *flags = 0;
    else *flags = -1;
}

enum {
    TOK_BLOCK = 1 << 20,          /* bytes read per step */
    TOK_MAX_PENDING = 256 << 20   /* a pipe may not go this long without a place to cut */
};

kv_status kv_tool_tokenize_file_max(int32_t **ids, size_t *n, char sha256[65], const kv_tokenizer *t,
                                    const char *path, size_t max_tokens) {
    return kv_tool_tokenize_file_ex(ids, n, sha256, t, path, max_tokens, TOK_BLOCK);
}

kv_status kv_tool_tokenize_file_ex(int32_t **ids, size_t *n, char sha256[65], const kv_tokenizer *t, const char *path,
                                   size_t max_tokens, size_t block) {
    if (block < 16) return KV_ERR(KV_EINVAL, "kv_tool_tokenize_file_ex: block %zu too small", block);
    *ids = NULL;
    *n = 0;
    kv_status s = kv_input_check(path);
    if (s != KV_OK) return s;
    struct stat st;
    const int regular = stat(path, &st) == 0 && S_ISREG(st.st_mode);
    FILE *fp = fopen(path, "rb");
    if (!fp) return KV_ERR(KV_EIO, "cannot open '%s': %s", path, strerror(errno));
    char *buf = NULL;
    size_t cap = 0, len = 0;
    int32_t *out = NULL;
    size_t n_out = 0, out_cap = 0;
    kv_sha256 h;
    if (sha256) kv_sha256_init(&h);
    int eof = 0;
    unsigned piece_flags = 0; /* how the piece at buf[0] is encoded: the text's start, after a space, after a line */
    long cont_flags;
    continuation_flags(t, &cont_flags);
    while (!(max_tokens && n_out >= max_tokens)) {
        if (cap - len < block) {
            size_t nc = cap ? cap * 2 : 2 * block;
            char *nb = realloc(buf, nc + 1);
            if (!nb) {
                s = KV_ERR(KV_ENOMEM, "out of memory reading '%s'", path);
                goto done;
            }
            buf = nb;
            cap = nc;
        }
        const size_t got = fread(buf + len, 1, block, fp);
        if (got == 0) {
            if (ferror(fp)) {
                s = KV_ERR(KV_EIO, "error reading '%s': %s", path, strerror(errno));
                goto done;
            }
            eof = 1;
        }
        if (sha256) kv_sha256_update(&h, buf + len, got);
        len += got;
        /* the cut positions not searched yet: those that need a byte read in this step */
        const size_t from = len - got >= 2 ? len - got - 2 : 0;
        size_t cut = eof ? len : cont_flags < 0 ? 0 : last_cut(buf, len, from);
        unsigned next_flags = (unsigned)cont_flags;
        if (cut == 0 && !eof && cont_flags >= 0 && (cut = last_line_cut(buf, len, from)) > 0)
            next_flags = KV_TOK_NO_SPACE_PREFIX;
        if (cut == 0) {
            if (eof) break; /* the end, with nothing left to tokenize (an empty file or pipe) */
            /* a tokenizer that can only take the text whole (cont_flags < 0) reads a regular file whole */
            if ((!regular || cont_flags >= 0) && len > TOK_MAX_PENDING) {
                s = KV_ERR(KV_EINVAL, "'%s': no place to cut the text (a space between words or a line break) in %d "
                           "MiB; is it text?", path, TOK_MAX_PENDING >> 20);
                goto done;
            }
            continue;
        }
        int32_t *piece = NULL;
        size_t np = 0;
        /* the SentencePiece dummy prefix once, at the start of the text */
        s = kv_tokenizer_encode(&piece, &np, t, buf, cut, piece_flags);
        if (s != KV_OK) {
            s = kv_error_wrap(s, "tokenizing '%s': ", path);
            goto done;
        }
        piece_flags = next_flags;
        if (n_out + np > out_cap) {
            size_t nc = out_cap ? out_cap : 1 << 16;
            while (nc < n_out + np) nc *= 2;
            int32_t *no = realloc(out, nc * sizeof *no);
            if (!no) {
                free(piece);
                s = KV_ERR(KV_ENOMEM, "out of memory for the tokens of '%s'", path);
                goto done;
            }
            out = no;
            out_cap = nc;
        }
        memcpy(out + n_out, piece, np * sizeof *piece);
        n_out += np;
        free(piece);
        memmove(buf, buf + cut, len - cut);
        len -= cut;
        if (eof) break;
    }
    if (max_tokens && n_out > max_tokens) n_out = max_tokens;
    /* Provenance: a regular file's hash covers the whole file, also past the tokens needed (reading
     * costs far less than tokenizing); a pipe's covers the bytes read. */
    if (sha256 && regular && !eof) {
        size_t got; /* buf holds at least `block` bytes: the loop above ran at least once */
        while ((got = fread(buf, 1, block, fp)) > 0) kv_sha256_update(&h, buf, got);
        if (ferror(fp)) {
            s = KV_ERR(KV_EIO, "error reading '%s': %s", path, strerror(errno));
            goto done;
        }
    }
    if (sha256) {
        uint8_t d[32];
        kv_sha256_final(&h, d);
        kv_sha256_hex(sha256, d);
    }
    if (!out && !(out = malloc(sizeof *out))) {
        s = KV_ERR(KV_ENOMEM, "out of memory");
        goto done;
    }
    *ids = out;
    *n = n_out;
    out = NULL;
done:
    fclose(fp);
    free(buf);
    free(out);
    return s;
}

kv_status kv_tool_tokenize_file(int32_t **ids, size_t *n, char sha256[65], const kv_tokenizer *t, const char *path) {
    return kv_tool_tokenize_file_max(ids, n, sha256, t, path, 0);
}

/* ---- models and tokenizers ---------------------------------------------------------------------- */
kv_status kv_tool_check_vocab(const kv_model *m, const kv_tokenizer *tok, const char *tok_path) {
    const int nm = kv_model_arch(m)->vocab_size, nt = kv_tokenizer_n_vocab(tok);
    const int slack = nm / 16 > 1024 ? nm / 16 : 1024;
    if (nt > nm || nm - nt > slack)
        return KV_ERR(KV_EMISMATCH, "the tokenizer%s%s%s has %d tokens and the model's embedding %d: %s", tok_path ? " '" : "",
                      tok_path ? tok_path : "", tok_path ? "'" : "", nt, nm,
                      nt > nm ? "its ids would fall outside the model" : "it is not this model's tokenizer (a model "
                      "pads its embedding by a few percent at most)");
    return KV_OK;
}

kv_status kv_tool_open_model(kv_model **model, kv_tokenizer **tok, const char *model_path, const char *tok_path,
                             int n_threads) {
    kv_model_options opt;
    memset(&opt, 0, sizeof opt);
    opt.n_threads = n_threads;
    return kv_tool_open_model_opt(model, tok, model_path, tok_path, &opt);
}

kv_status kv_tool_open_model_opt(kv_model **model, kv_tokenizer **tok, const char *model_path, const char *tok_path,
                                 const kv_model_options *opt) {
    *model = NULL;
    if (tok) *tok = NULL;
    kv_model_file *mf = NULL;
    kv_status s = kv_model_file_open(&mf, model_path);
    if (s != KV_OK) return s;
    if ((s = kv_model_load(model, mf, opt)) != KV_OK) goto done;
    if (tok && (s = kv_tokenizer_load(tok, mf, tok_path)) == KV_OK) s = kv_tool_check_vocab(*model, *tok, tok_path);
    if (s != KV_OK) {
        if (tok) {
            kv_tokenizer_free(*tok);
            *tok = NULL;
        }
        kv_model_free(*model);
        *model = NULL;
    }
done:
    kv_model_file_close(mf);
    return s;
}

int kv_tool_weight_storage(const char *name) {
    if (strcmp(name, "f32") == 0) return KV_WEIGHTS_F32;
    if (strcmp(name, "f16") == 0) return KV_WEIGHTS_F16;
    if (strcmp(name, "native") == 0) return KV_WEIGHTS_NATIVE;
    return -1;
}

int kv_tool_model_device(const char *tool, const char *device, const char *weights, kv_weight_storage dflt,
                         kv_model_options *mo) {
    if (!device || strcmp(device, "cpu") == 0)
        mo->device = KV_MODEL_DEVICE_CPU;
    else if (strcmp(device, "cuda") == 0)
        mo->device = KV_MODEL_DEVICE_CUDA;
    else
        return kv_cli_usage_error(tool, "--device must be cpu or cuda, not '%s'", device);
    if (!weights) {
        mo->weights = mo->device == KV_MODEL_DEVICE_CUDA ? KV_WEIGHTS_F16 : dflt;
        return KV_EXIT_OK;
    }
    const int storage = kv_tool_weight_storage(weights);
    if (storage < 0) return kv_cli_usage_error(tool, "--weights must be native, f32 or f16, not '%s'", weights);
    mo->weights = (kv_weight_storage)storage;
    return KV_EXIT_OK;
}

/* ---- checks before any work ----------------------------------------------------------------------- */
int kv_tool_threads(const char *tool, long requested, int *n) {
    *n = 0;
    if (kv_threads_resolve(n, requested, "--threads") != KV_OK) return kv_cli_usage_error(tool, "%s", kv_error_last());
    omp_set_num_threads(*n); /* OpenMP regions without an explicit count follow the same number */
    return KV_EXIT_OK;
}

/* Both name the same regular file, or (neither existing yet) the same name in the same directory;
 * a device or a pipe may take several outputs. */
static int same_target(const char *a, const char *b) {
    struct stat st;
    if (stat(a, &st) == 0 && !S_ISREG(st.st_mode)) return 0; /* two reports to /dev/null are fine */
    if (kv_same_file(a, b)) return 1;
    if (stat(a, &st) == 0 || stat(b, &st) == 0) return 0;
    const char *ba = strrchr(a, '/'), *bb = strrchr(b, '/');
    const char *na = ba ? ba + 1 : a, *nb = bb ? bb + 1 : b;
    if (strcmp(na, nb) != 0) return 0;
    char da[PATH_MAX], db[PATH_MAX], ra[PATH_MAX], rb[PATH_MAX];
    snprintf(da, sizeof da, "%.*s", ba ? (int)(ba - a) + (ba == a) : 1, ba ? a : ".");
    snprintf(db, sizeof db, "%.*s", bb ? (int)(bb - b) + (bb == b) : 1, bb ? b : ".");
    return realpath(da, ra) && realpath(db, rb) && strcmp(ra, rb) == 0;
}

/* An output that is the input, or one of the files directly inside an input directory (a
 * safetensors model). */
static int overwrites_input(const char *out, const char *in) {
    if (kv_same_file(out, in)) return 1;
    struct stat st;
    if (stat(in, &st) != 0 || !S_ISDIR(st.st_mode)) return 0;
    DIR *d = opendir(in);
    if (!d) return 0;
    int hit = 0;
    struct dirent *e;
    while (!hit && (e = readdir(d)) != NULL) {
        char p[PATH_MAX];
        if (snprintf(p, sizeof p, "%s/%s", in, e->d_name) < (int)sizeof p && strcmp(e->d_name, ".") != 0 &&
            strcmp(e->d_name, "..") != 0)
            hit = kv_same_file(out, p);
    }
    closedir(d);
    return hit;
}

int kv_tool_check_io(const char *tool, const kv_tool_path *inputs, int n_in, const kv_tool_path *outputs,
                     int n_out) {
    for (int i = 0; i < n_out; i++) {
        const kv_tool_path *o = &outputs[i];
        if (!o->path) continue;
        if (kv_output_check(o->path) != KV_OK) return kv_cli_usage_error(tool, "%s: %s", o->what, kv_error_last());
        for (int j = 0; j < n_in; j++)
            if (inputs[j].path && overwrites_input(o->path, inputs[j].path))
                return kv_cli_usage_error(tool, "%s '%s' is the same file as %s '%s': refusing to overwrite an input",
                                          o->what, o->path, inputs[j].what, inputs[j].path);
        for (int j = 0; j < i; j++)
            if (outputs[j].path && same_target(o->path, outputs[j].path))
                return kv_cli_usage_error(tool, "%s and %s are the same file '%s'", outputs[j].what, o->what, o->path);
    }
    return KV_EXIT_OK;
}

/* Is `inner` (resolved) `outer` or below it? */
static int path_within(const char *inner, const char *outer) {
    const size_t n = strlen(outer);
    if (strncmp(inner, outer, n) != 0) return 0;
    return inner[n] == '\0' || inner[n] == '/' || (n == 1 && outer[0] == '/');
}

int kv_tool_check_out_dir(const char *tool, const char *what, const char *path, const kv_tool_path *inputs, int n_in) {
    if (!path || !*path) return kv_cli_usage_error(tool, "%s: an output path is empty", what);
    struct stat st;
    char parent[PATH_MAX], rparent[PATH_MAX], rin[PATH_MAX];
    if (stat(path, &st) == 0) {
        if (!S_ISDIR(st.st_mode))
            return kv_cli_usage_error(tool, "%s '%s' exists and is not a directory: the output is a new directory",
                                      what, path);
        DIR *d = opendir(path);
        int empty = d != NULL;
        for (struct dirent *e; d && empty && (e = readdir(d)) != NULL;)
            empty = strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0;
        if (d) closedir(d);
        for (int j = 0; j < n_in; j++)
            if (inputs[j].path && kv_same_file(path, inputs[j].path))
                return kv_cli_usage_error(tool, "%s '%s' is the same directory as %s '%s': refusing to overwrite an "
                                          "input", what, path, inputs[j].what, inputs[j].path);
        if (!empty)
            return kv_cli_usage_error(tool, "%s '%s' exists and is not empty: the output is written whole as a new "
                                      "directory (remove it or name another)", what, path);
    } else if (errno != ENOENT) {
        return kv_cli_usage_error(tool, "%s '%s': %s", what, path, strerror(errno));
    }
    /* the parent must take the temporary directory and the rename */
    size_t n = strlen(path);
    while (n > 1 && path[n - 1] == '/') n--;
    snprintf(parent, sizeof parent, "%.*s", (int)n, path);
    char *slash = strrchr(parent, '/');
    if (!slash) snprintf(parent, sizeof parent, ".");
    else if (slash == parent) slash[1] = '\0';
    else *slash = '\0';
    if (stat(parent, &st) != 0 || !S_ISDIR(st.st_mode))
        return kv_cli_usage_error(tool, "%s '%s': directory '%s' does not exist", what, path, parent);
    if (access(parent, W_OK | X_OK) != 0)
        return kv_cli_usage_error(tool, "%s '%s': directory '%s' is not writable: %s", what, path, parent,
                                  strerror(errno));
    if (!realpath(parent, rparent)) return kv_cli_usage_error(tool, "%s '%s': %s", what, path, strerror(errno));
    for (int j = 0; j < n_in; j++) {
        if (!inputs[j].path || !realpath(inputs[j].path, rin)) continue;
        if (stat(rin, &st) == 0 && S_ISDIR(st.st_mode) && path_within(rparent, rin))
            return kv_cli_usage_error(tool, "%s '%s' is inside %s '%s': refusing to write into an input", what, path,
                                      inputs[j].what, inputs[j].path);
    }
    return KV_EXIT_OK;
}

kv_status kv_tool_check_memory(double bytes, const char *what) {
    const uint64_t total = kv_memory_total_bytes();
    if (total > 0 && bytes > (double)total)
        return KV_ERR(KV_ENOMEM, "%s needs about %.1f GiB of memory, more than the %.1f GiB this machine has: "
                      "refused before allocating (ask for less)", what, bytes / 1073741824.0,
                      (double)total / 1073741824.0);
    return KV_OK;
}

void kv_tool_warn_context(const kv_arch *a, long n, const char *what) {
    if (a->max_seq_len > 0 && n > a->max_seq_len)
        kv_log(KV_LOG_WARN, "%s %ld is longer than the %d tokens the model was trained for (max_seq_len; RoPE scaling "
               "%s): positions past it are extrapolated and quality usually collapses", what, n, a->max_seq_len,
               a->rope_scaling == KV_ROPE_SCALING_NONE ? "none" : "already counted in it");
}

const char *kv_tool_plural(long n, const char *one, const char *many) { return n == 1 ? one : many; }

void kv_tool_json_string(FILE *fp, const char *s) {
    fputc('"', fp);
    for (const unsigned char *p = (const unsigned char *)s; p && *p; p++) {
        if (*p == '"' || *p == '\\') fprintf(fp, "\\%c", *p);
        else if (*p == '\n') fputs("\\n", fp);
        else if (*p == '\t') fputs("\\t", fp);
        else if (*p == '\r') fputs("\\r", fp);
        else if (*p < 0x20 || *p == 0x7f) fprintf(fp, "\\u%04x", *p);
        else fputc(*p, fp);
    }
    fputc('"', fp);
}

kv_status kv_tool_make_cache(kv_cache **out, kv_plan **plan_out, kv_model *m, const char *model_path,
                             const char *plan_path, const char *cache_kind, int n_seqs, int capacity, unsigned rt_flags) {
    *out = NULL;
    *plan_out = NULL;
    kv_status s = KV_OK;
    if (plan_path) {
        kv_model_file *mf = NULL;
        kv_plan_fingerprint fp;
        if ((s = kv_plan_read(plan_out, plan_path)) != KV_OK) return s;
        if ((s = kv_model_file_open(&mf, model_path)) == KV_OK && (s = kv_plan_fingerprint_compute(&fp, mf)) == KV_OK &&
            (s = kv_plan_check_fingerprint(*plan_out, &fp)) != KV_OK)
            kv_error_wrap(s, "plan '%s' does not belong to model '%s': ", plan_path, model_path);
        kv_model_file_close(mf);
        if (s == KV_OK && (s = kv_cache_rt_create(out, *plan_out, m, n_seqs, capacity, 0, rt_flags)) != KV_OK)
            kv_error_wrap(s, "plan '%s': ", plan_path);
    } else if (cache_kind && strcmp(cache_kind, "f16") == 0) {
        s = kv_cache_rt_create(out, NULL, m, n_seqs, capacity, 0, 0);
    } else {
        s = kv_cache_plain_create(out, kv_model_arch(m), n_seqs, capacity);
    }
    if (s != KV_OK) {
        kv_plan_free(*plan_out);
        *plan_out = NULL;
    }
    return s;
}
