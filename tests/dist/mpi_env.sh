# Sourced by the MPI test scripts: how they start mpirun on a small shared machine.
# --oversubscribe: more ranks than cores is fine for a test; --bind-to none: ranks with OpenMP
# threads are not pinned to one core each. Running as root (containers, CI) needs Open MPI's
# explicit consent. Open MPI's shared-memory transport is used between ranks of one machine.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1
KV_MPIRUN_FLAGS=(--oversubscribe --bind-to none)
# LeakSanitizer would report Open MPI's own allocations that live until exit, in the sanitizer build.
export LSAN_OPTIONS="${LSAN_OPTIONS:+$LSAN_OPTIONS:}suppressions=$(dirname "${BASH_SOURCE[0]}")/lsan-mpi.supp"
