/* kv_tools.h — the subcommands of kvcal, kvprof and kvrun (each in <tool>_<sub>.c). Internal. */
#ifndef KV_TOOLS_H
#define KV_TOOLS_H

#include "kv_cli.h"
#include "kv_model.h"

/* Shared steps (tool_support.c). */
/* Read a text file and tokenize it whole (no BOS; the SentencePiece dummy prefix once at the
 * start); its SHA-256 into sha256 (may be NULL). *ids is malloc'd. */
kv_status kv_tool_tokenize_file(int32_t **ids, size_t *n, char sha256[65], const kv_tokenizer *t, const char *path);
/* Open a model file, load the model (n_threads 0 = default) and, when tok is not NULL, its
 * tokenizer (tok_path NULL = the model's own). */
kv_status kv_tool_open_model(kv_model **model, kv_tokenizer **tok, const char *model_path, const char *tok_path,
                             int n_threads);

/* kvrun */
int kvrun_info(int argc, char **argv);     /* kvrun_info.c: describe a model file */
int kvrun_inspect(int argc, char **argv);  /* kvrun_inspect.c: print a plan (YAML/JSON); --check it against a model */

/* kvcal */
int kvcal_grids(int argc, char **argv);    /* kvcal_grids.c: generate a HIGGS grid file */
int kvcal_fit(int argc, char **argv);      /* kvcal_fit.c: calibrate a plan (AQUA-KV and baselines) */

/* kvprof */
int kvprof_importance(int argc, char **argv); /* kvprof_importance.c: KVmix layer importance and bit allocation */

#endif
