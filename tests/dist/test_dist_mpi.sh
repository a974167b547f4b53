#!/usr/bin/env bash
# kv_dist across real ranks: dist_mpi_check under mpirun with 2 and 3 ranks (oversubscribed on a
# small machine). Exit 77 (skipped) when the build has no MPI or there is no launcher.
#   test_dist_mpi.sh MPIRUN DIST_MPI_CHECK HAVE_MPI
set -u
mpirun="$1" check="$2" have="$3"
if [ "$have" != "ON" ] || [ -z "$mpirun" ] || [ ! -x "$mpirun" ]; then
  echo "skipped: no MPI in this build"
  exit 77
fi
source "$(dirname "$0")/mpi_env.sh"
fail=0
for np in 2 3; do
  if "$mpirun" "${KV_MPIRUN_FLAGS[@]}" -np $np "$check" $np; then echo "ok: $np ranks"
  else echo "FAIL: $np ranks"; fail=1; fi
done
exit $fail
