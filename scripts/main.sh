#!/usr/bin/env bash
# The main job (README): install dependencies, build, fetch the default model, then on WikiText-2 (calibration
# on the validation split, evaluation on the held-out test split): search one plan across methods at a budget
# of 4 honest bits per value at 2048 tokens (kvcal search: per layer and stream, the candidate with the least
# measured KL under the budget), and evaluate it against the uncompressed model and two single methods (KIVI-2
# and HIGGS-2), with a searched plan at each baseline's own bits as well (equal-bits comparison); print the
# table and the path of the Pareto chart. KIVI-1 with larger groups (kivi1g128) is the cheapest candidate, so
# at HIGGS-2's bits the search can mix it with HIGGS-2 on the streams where it costs least (calib/SEARCH.md §8d).
# About 8 minutes after the build on a 2-core machine, HIGGS grids cached (calib/SEARCH.md §8).
#   scripts/main.sh [--all] [--budget B] [extra arguments for scripts/pareto.sh]
# --all: the full every-method comparison instead (scripts/results.sh: eight fits and evaluations, ~50 min);
# its extra arguments go to scripts/results.sh (e.g. --eval-tokens 40960). The whole frontier at 2K and 8K is
# scripts/pareto.sh with its defaults (hours on 2 cores).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$here"
all=0
budget=4
args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --all) all=1; shift ;;
    --budget) budget="$2"; shift 2 ;;
    *) args+=("$1"); shift ;;
  esac
done
start=$(date +%s)
bash scripts/setup.sh
bash scripts/check-data.sh
bash scripts/build.sh "$here/build"
model="$(bash scripts/fetch-model.sh | tail -n 1)"
echo "== model"
"$here/build/tools/kvrun" info --model "$model"
ready=$(date +%s)
if [ "$all" = 1 ]; then
  echo "== every method: calibrate on wiki.valid.raw, evaluate on wiki.test.raw"
  bash scripts/results.sh --model "$model" --fit-tokens 32768 --eval-tokens 16384 --ctx 2048 "${args[@]}"
else
  echo "== searched plan at $budget honest bits (2048 tokens) vs KIVI-2, HIGGS-2 and the uncompressed model"
  bash scripts/pareto.sh --model "$model" --contexts 2048 --eval-tokens 4096 --methods "kivi-2 higgs-2" \
    --budgets "$budget" --range "0 32" --candidates f16,kivi1g128,kivi2,kivi4,higgs2,aqua2r32 --search-fit-tokens 4096 \
    --sens-ctx 256 --sens-samples 1 --prompts 0 --out "$here/build/main" "${args[@]}"
fi
end=$(date +%s)
echo "== set-up and build $((ready - start)) s, the job $((end - ready)) s"
