#!/usr/bin/env bash
# The main job (README; configs/experiments/main.ini): install dependencies, build, fetch the default model, then on
# WikiText-2 (calibration on the validation split, evaluation on the held-out test split): search one plan across
# methods at a budget of 4 honest bits per value at 2048 tokens (kvcal search: per layer and stream, the candidate
# with the least measured KL under the budget), and evaluate it against the uncompressed model and two single methods
# (KIVI-2 and HIGGS-2), with a searched plan at each baseline's own bits as well (equal-bits comparison); print the
# table and the path of the Pareto chart. KIVI-1 with larger groups (kivi1g128) is the cheapest candidate, so at
# HIGGS-2's bits the search can mix it with HIGGS-2 on the streams where it costs least (calib/SEARCH.md §1.1).
# About 8 minutes after the build on a 2-core machine, HIGGS grids cached (calib/SEARCH.md §6).
#   scripts/main.sh [--all] [--budget B] [extra arguments for scripts/experiment.sh]
# --all: the full every-method comparison instead (configs/experiments/results.ini: eight fits and evaluations,
# ~50 min); extra arguments go to it (e.g. --eval-tokens 40960). The whole frontier at 2K and 8K is scripts/pareto.sh
# with its defaults (hours on 2 cores).
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
  bash scripts/experiment.sh configs/experiments/results.ini --model "$model" --fit-tokens 32768 --eval-tokens 16384 \
    --ctx 2048 "${args[@]}"
else
  echo "== searched plan at $budget honest bits (2048 tokens) vs KIVI-2, HIGGS-2 and the uncompressed model"
  bash scripts/experiment.sh configs/experiments/main.ini --model "$model" --budgets "$budget" "${args[@]}"
fi
end=$(date +%s)
echo "== set-up and build $((ready - start)) s, the job $((end - ready)) s"
