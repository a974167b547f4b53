#!/usr/bin/env bash
# The main job (README; configs/experiments/main.ini): install dependencies, build, fetch the default model, then on
# WikiText-2 (calibration on the validation split, evaluation on the held-out test split): search one plan across
# methods at a budget of 4 honest bits per value at 2048 tokens (kvcal search: per layer and stream, the candidate
# with the least measured KL under the budget), and evaluate it against the uncompressed model and two single methods
# (KIVI-2 and HIGGS-2), with a searched plan at each baseline's own bits as well (equal-bits comparison); print the
# table and the path of the Pareto chart. KIVI-1 with larger groups (kivi1g128) is the cheapest candidate, so at
# HIGGS-2's bits the search can mix it with HIGGS-2 on the streams where it costs least (calib/SEARCH.md §1.1).
# About 8 minutes after the build on a 2-core machine, HIGGS grids cached (calib/SEARCH.md §6).
#   scripts/main.sh [--all] [--budget B] [-v] [--no-setup] [--build DIR] [--out DIR] [--model PATH] [--tokenizer PATH]
#                   [extra arguments for scripts/experiment.sh]
# --all: the full every-method comparison instead (configs/experiments/results.ini: eight fits and evaluations,
# ~50 min); extra arguments go to it (e.g. --eval-tokens 40960). The whole frontier at 2K and 8K is scripts/pareto.sh
# with its defaults (hours on 2 cores).
# The terminal gets one line per phase, the tables and where the plans, results and logs are; what the set-up, the
# build and every tool print goes to log files (OUT/logs/, OUT by default BUILD/main; a failure prints the log's last
# lines), or with -v to the terminal. --no-setup: no package installation and no build (BUILD must hold the tools); --model/--tokenizer:
# another model than the default (tests/tools/test_main_job.sh runs the job this way on the tiny model).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$here"
all=0
budget=4
verbose=0
setup=1
build="$here/build"
model=""
out=""
args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --all) all=1; shift ;;
    --budget) budget="$2"; shift 2 ;;
    -v|--verbose) verbose=1; args+=(-v); shift ;;
    --no-setup) setup=0; shift ;;
    --build) build="$(cd "$2" && pwd)"; shift 2 ;;
    --model) model="$2"; args+=(--model "$2"); shift 2 ;;
    --out) out="$2"; args+=(--out "$2"); shift 2 ;;
    -h|--help) sed -n '2,19p' "$0"; exit 0 ;;
    *) args+=("$1"); shift ;;
  esac
done
logs="${out:-$build/main}/logs"
mkdir -p "$logs"
# step NAME LOG CMD...: CMD's output to LOG (or the terminal with -v); on failure, the log's tail and its path
step() {
  local name="$1" log="$2"; shift 2
  if [ "$verbose" = 1 ]; then "$@"; return; fi
  if ! "$@" > "$log" 2>&1; then
    tail -n 20 "$log" | sed 's/^/  | /' >&2
    echo "main: $name failed (log: $log)" >&2
    exit 1
  fi
}
start=$(date +%s)
if [ "$setup" = 1 ]; then
  echo "== set-up and build (log: $logs/setup.log)"
  step "set-up" "$logs/setup.log" bash scripts/setup.sh
  step "data check" "$logs/setup.log.data" bash scripts/check-data.sh
  cat "$logs/setup.log.data" >> "$logs/setup.log" 2>/dev/null && rm -f "$logs/setup.log.data"
  step "build" "$logs/build.log" bash scripts/build.sh "$build"
fi
[ -x "$build/tools/kvrun" ] || { echo "main: no tools in $build (run without --no-setup)" >&2; exit 2; }
if [ -z "$model" ]; then
  if ! model="$(bash scripts/fetch-model.sh 2> "$logs/model.log" | tail -n 1)" || [ ! -f "$model" ]; then
    tail -n 20 "$logs/model.log" | sed 's/^/  | /' >&2
    echo "main: the default model could not be had (log: $logs/model.log)" >&2
    exit 1
  fi
  args+=(--model "$model")
fi
"$build/tools/kvrun" info --model "$model" > "$logs/model-info.txt"
info() { sed -n "s/^$1  *//p" "$logs/model-info.txt"; }
echo "== model $(basename "$model"): $(info architecture), $(info layers) layers, $(info heads); KV per token: $(info 'KV per token')"
ready=$(date +%s)
if [ "$all" = 1 ]; then
  bash scripts/experiment.sh configs/experiments/results.ini --build "$build" --fit-tokens 32768 --eval-tokens 16384 \
    --ctx 2048 "${args[@]}"
else
  bash scripts/experiment.sh configs/experiments/main.ini --build "$build" --budgets "$budget" "${args[@]}"
fi
end=$(date +%s)
echo "== set-up and build $((ready - start)) s, the job $((end - ready)) s"
