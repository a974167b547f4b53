# Sourced by the MPI test scripts: how they start mpirun on a small shared machine.
# --oversubscribe: more ranks than cores is fine for a test; --bind-to none: ranks with OpenMP
# threads are not pinned to one core each. Running as root (containers, CI) needs Open MPI's
# explicit consent. Open MPI's shared-memory transport is used between ranks of one machine.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1
KV_MPIRUN_FLAGS=(--oversubscribe --bind-to none)
# In the sanitizer build, LeakSanitizer reports Open MPI's own allocations that live until exit, from
# plugins it has unloaded by then (no module name to suppress them by): leak checking is off in the
# MPI tests. kvcal's code on these paths (dist, sharded fit, spill, resume) is leak-checked by the
# one-process tests (tests/dist/test_dist.c, tests/fit/test_fit.c); ASan and UBSan stay on here.
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
