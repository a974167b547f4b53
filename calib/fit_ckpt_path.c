/* Where kvcal fit keeps the checkpoints of a plan (PLAN.ckpt next to it, calib/FIT.md §6): checked before
 * any work (kv_fit_ckpt_check_plan) and named for the run (kv_fit_ckpt_dir_for), so that the check and the
 * run agree on the directory and a plan written to a device or a pipe gets none. */
#define _POSIX_C_SOURCE 200809L
#include "kv_calib.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static char *ckpt_path(const char *plan_path) {
    char *ck = malloc(strlen(plan_path) + 6);
    if (ck) sprintf(ck, "%s.ckpt", plan_path);
    return ck;
}

kv_status kv_fit_ckpt_check_plan(const char *plan_path) {
    char *ck = ckpt_path(plan_path);
    if (!ck) return KV_ERR(KV_ENOMEM, "out of memory");
    struct stat st;
    kv_status s = KV_OK;
    if (stat(ck, &st) == 0 && !S_ISDIR(st.st_mode))
        s = KV_ERR(KV_EINVAL, "'%s' (the checkpoint directory of --out) exists and is not a directory", ck);
    else
        s = kv_fit_ckpt_check_dir(ck); /* a symlink, or a directory kvcal fit did not create */
    free(ck);
    return s;
}

kv_status kv_fit_ckpt_dir_for(char **dir, const char *plan_path) {
    *dir = NULL;
    struct stat st;
    if (stat(plan_path, &st) == 0 && !S_ISREG(st.st_mode)) {
        /* a device or a pipe: its directory (/dev) is no place for PLAN.ckpt, and nothing could resume */
        kv_log(KV_LOG_INFO, "--out '%s' is not a regular file: no checkpoints (as --no-checkpoint)", plan_path);
        return KV_OK;
    }
    if (!(*dir = ckpt_path(plan_path))) return KV_ERR(KV_ENOMEM, "out of memory");
    return KV_OK;
}
