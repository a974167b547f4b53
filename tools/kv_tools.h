/* kv_tools.h — the subcommands of kvcal, kvprof and kvrun (each in <tool>_<sub>.c). Internal. */
#ifndef KV_TOOLS_H
#define KV_TOOLS_H

#include "kv_cli.h"

/* kvrun */
int kvrun_info(int argc, char **argv);     /* kvrun_info.c: describe a model file */

/* kvcal */

/* kvprof */

#endif
