#!/usr/bin/env bash
# The test command (README): install dependencies, fetch the default model, build the normal
# configuration (with CUDA when nvcc is present) and the sanitizer configuration (ASan+UBSan),
# and run the whole CTest suite in both.
#   scripts/test.sh [--blas-matrix]
# --blas-matrix (what .ci/run uses; also KVCAL_BLAS_MATRIX=1): then run the numerical tests again
# under every OpenBLAS core type this CPU executes, with 1 and 2 threads (tests/blas_matrix.py), so
# that a result depending on the BLAS kernel fails here first.
set -euo pipefail
blas_matrix="${KVCAL_BLAS_MATRIX:-0}"
for arg in "$@"; do
  case "$arg" in
    --blas-matrix) blas_matrix=1 ;;
    -h|--help) sed -n '2,8p' "$0"; exit 0 ;;
    *) echo "test: unknown argument '$arg'" >&2; exit 2 ;;
  esac
done
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$here"
bash scripts/setup.sh
# The default model (tests that need it skip when it cannot be fetched, e.g. without network).
bash scripts/fetch-model.sh >/dev/null || echo "test: default model unavailable; tests needing it will be skipped"
bash scripts/check-data.sh

echo "== build: normal =="
bash scripts/build.sh "$here/build"
echo "== test: normal =="
(cd "$here/build" && ctest --output-on-failure -j 2)
if [ "$blas_matrix" = 1 ]; then
  echo "== test: numerical tests x OpenBLAS core types x threads 1, 2 =="
  python3 "$here/tests/blas_matrix.py" "$here/build"
fi

echo "== build: sanitizers (ASan+UBSan) =="
# The sanitizer build skips CUDA: nvcc-compiled host code is covered by the normal build, and
# nothing here can run a GPU.
bash scripts/build.sh "$here/build-asan" -DKV_SANITIZE=ON -DKV_CUDA=OFF -DCMAKE_BUILD_TYPE=Debug
echo "== test: sanitizers =="
(cd "$here/build-asan" && ASAN_OPTIONS=detect_leaks=1:abort_on_error=0 \
   UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 ctest --output-on-failure -j 2)
