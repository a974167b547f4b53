#!/usr/bin/env bash
# The main job (README): install dependencies, build, fetch the default model, and run the
# pipeline on the default model and corpus with what the toolchain implements so far.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$here"
bash scripts/setup.sh
bash scripts/check-data.sh
bash scripts/build.sh "$here/build"
model="$(bash scripts/fetch-model.sh | tail -n 1)"
data="$(bash scripts/data-dir.sh)"
bin="$here/build/tools"
echo "== model: $model =="
"$bin/kvrun" info --model "$model"
