/* kv_tools.h — the subcommands of kvcal, kvprof and kvrun (each in <tool>_<sub>.c). Internal. */
#ifndef KV_TOOLS_H
#define KV_TOOLS_H

#include "kv_cli.h"

/* kvrun */
int kvrun_info(int argc, char **argv);     /* kvrun_info.c: describe a model file */

/* kvcal */
int kvcal_grids(int argc, char **argv);    /* kvcal_grids.c: generate a HIGGS grid file */

/* kvprof */

#endif
