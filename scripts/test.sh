#!/usr/bin/env bash
# The test command (README): install dependencies, fetch the default model, build the normal
# configuration (with CUDA when nvcc is present) and the sanitizer configuration (ASan+UBSan),
# and run the whole CTest suite in both.
set -euo pipefail
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

echo "== build: sanitizers (ASan+UBSan) =="
# The sanitizer build skips CUDA: nvcc-compiled host code is covered by the normal build, and
# nothing here can run a GPU.
bash scripts/build.sh "$here/build-asan" -DKV_SANITIZE=ON -DKV_CUDA=OFF -DCMAKE_BUILD_TYPE=Debug
echo "== test: sanitizers =="
(cd "$here/build-asan" && ASAN_OPTIONS=detect_leaks=1:abort_on_error=0 \
   UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 ctest --output-on-failure -j 2)
