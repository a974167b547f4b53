#!/usr/bin/env bash
# The main job (README): install dependencies, build, fetch the default model, then run the whole
# pipeline on the default model and corpus — calibrate a plan per method on WikiText-2's
# validation split, evaluate each on the held-out test split through the compressed cache — and
# print the comparison table. Extra arguments go to scripts/results.sh (e.g. --eval-tokens 40960).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$here"
bash scripts/setup.sh
bash scripts/check-data.sh
bash scripts/build.sh "$here/build"
model="$(bash scripts/fetch-model.sh | tail -n 1)"
echo "== model"
"$here/build/tools/kvrun" info --model "$model"
echo "== calibrate on wiki.valid.raw, evaluate on wiki.test.raw"
bash scripts/results.sh --model "$model" --fit-tokens 32768 --eval-tokens 16384 --ctx 2048 "$@"
