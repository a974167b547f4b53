#!/usr/bin/env bash
# kvcal fit beyond one process and one model's memory (BENCHMARKS.md, "Calibration with MPI ranks and
# layer-streamed weights"; configs/experiments/dist-*.ini). A benchmark, not a test; every run prints its command.
#   scripts/bench-dist.sh memory [TOKENS]   peak RSS against how the weights and the per-token state
#                                            are held (one process; 2 threads)
#   scripts/bench-dist.sh scale [TOKENS]    peak RSS at TOKENS and 4 x TOKENS, state in memory and spilled
#   scripts/bench-dist.sh ranks [TOKENS]    calibration time with 1, 2 and 3 ranks (1 thread each),
#                                            and 1 process with 2 threads, in turn, ROUNDS times
#   scripts/bench-dist.sh f16 [TOKENS]      the accuracy effect of f16 hidden states: the fit's held-out
#                                            errors and kvrun eval of both plans on the test split
# TOKENS: calibration tokens (default 16384). $ROUNDS (ranks, default 2), $EVAL_TOKENS (f16: tokens evaluated, default
# 16384), $KVCAL_BUILD (the build, with MPI), $BENCH_OUT (the output folder, default a new temporary one).
# Needs the default model and WikiText-2. HIGGS grids come from the grid cache ($KVCAL_GRID_CACHE).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
what="${1:-}"
tokens="${2:-16384}"
case "$what" in
  memory|ranks|f16) set_tokens=(--fit-tokens "$tokens") ;;
  scale) set_tokens=(--run "native-shard2-$tokens native-shard2-spill-$tokens native-shard2-$((4 * tokens)) native-shard2-spill-$((4 * tokens))") ;;
  *) sed -n '2,14p' "$0"; exit 2 ;;
esac
out="${BENCH_OUT:-$(mktemp -d)}"
extra=()
[ "$what" = ranks ] && extra+=(-D "rounds=${ROUNDS:-2}")
[ "$what" = f16 ] && extra+=(--eval-tokens "${EVAL_TOKENS:-16384}")
echo "bench-dist: $(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg), $(git -C "$here" rev-parse --short HEAD); output in $out" >&2
exec bash "$here/scripts/experiment.sh" "$here/configs/experiments/dist-$what.ini" --build "${KVCAL_BUILD:-$here/build}" \
  --out "$out" "${set_tokens[@]}" "${extra[@]}"
