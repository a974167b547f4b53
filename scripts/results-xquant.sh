#!/usr/bin/env bash
# XQuant's rows (configs/experiments/xquant.ini): fit on wiki.valid.raw, evaluate on wiki.test.raw, one row per
# configuration: the rows of xquant.ini by NAME, or NAME=METHOD:SET,SET,... (kvcal fit --method METHOD --set SET ...)
# given here. Without NAMEs, xquant.ini's rows.
#   scripts/results-xquant.sh [--build DIR] [--out DIR] [--fit-tokens N] [--seq-len N]
#                             [--eval-tokens N] [--ctx N] [NAME | NAME=METHOD:SETS ...]
# A thin wrapper of scripts/experiment.sh.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
args=()
while [ $# -gt 0 ]; do
  case "$1" in
    -h|--help) sed -n '2,7p' "$0"; exit 0 ;;
    --build|--out|--fit-tokens|--seq-len|--eval-tokens|--ctx) args+=("$1" "$2"); shift 2 ;;
    *) break ;;
  esac
done
names=()
for spec in "$@"; do
  name="${spec%%=*}"
  if [ "$name" != "$spec" ]; then
    rest="${spec#*=}"; method="${rest%%:*}"; sets="${rest#*:}"
    fit="--method $method"
    IFS=',' read -ra kv <<< "$sets"
    for s in "${kv[@]}"; do [ -n "$s" ] && fit+=" --set $s"; done
    args+=(--row "$name=$fit")
  fi
  names+=("$name")
done
[ ${#names[@]} -gt 0 ] && args+=(--run "${names[*]}")
exec bash "$here/scripts/experiment.sh" "$here/configs/experiments/xquant.ini" "${args[@]}"
