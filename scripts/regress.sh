#!/usr/bin/env bash
# Held-out regression (configs/experiments/regress.ini): fit plans on the calibration split (wiki.valid.raw) and
# evaluate them on the held-out split (wiki.test.raw), for the tiny model (stories260K) and, with a small token
# budget, the default model (SmolLM2-135M); compare with the checked-in baselines and tolerances in
# tests/regress/baselines.json. A method whose quality or bits get worse fails.
#   scripts/regress.sh [--build DIR] [--out DIR] [--update]   (--update rewrites the baselines)
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --build|--out) args+=("$1" "$2"); shift 2 ;;
    --update) args+=(--update); shift ;;
    -h|--help) sed -n '2,7p' "$0"; exit 0 ;;
    *) echo "regress: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
build="$here/build"
for ((i = 0; i < ${#args[@]}; i++)); do [ "${args[$i]}" = --build ] && build="${args[$((i + 1))]}"; done
[ -x "$build/tools/kvcal" ] && [ -x "$build/tools/kvrun" ] || { echo "regress: build first (no $build/tools/kvcal / kvrun)" >&2; exit 2; }
exec bash "$here/scripts/experiment.sh" "$here/configs/experiments/regress.ini" --out "$here/build/regress" "${args[@]}"
