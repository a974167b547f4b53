#!/usr/bin/env bash
# KVmix on the default model (configs/experiments/kvmix.ini): layer importance from the calibration split, then
# KVmix allocation vs uniform 2-bit vs a random allocation with the same average bits, each with and without the
# recent pivotal context (RPC), evaluated on the held-out split as a prompt followed by token-by-token decoding.
# Prints a markdown table.
#   scripts/kvmix.sh [--model PATH] [--prompts N] [--max-len N] [--ctx N] [--prefill N]
#                    [--eval-tokens N] [--random-seeds "2 3 ..."] [--out DIR] [--build DIR]
# --random-seeds: more random allocations (one draw is a weak baseline), each fitted and evaluated with and without
# RPC; the table adds their mean. A thin wrapper of scripts/experiment.sh.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
args=()
seeds=""
while [ $# -gt 0 ]; do
  case "$1" in
    -h|--help) sed -n '2,9p' "$0"; exit 0 ;;
    --random-seeds) seeds="$2"; shift 2 ;;
    --model|--prompts|--max-len|--ctx|--prefill|--eval-tokens|--out|--build) args+=("$1" "$2"); shift 2 ;;
    *) echo "kvmix: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
run="kvmix kvmix-norpc random random-norpc"
for s in $seeds; do run+=" random$s random$s-norpc"; done
run+=" uniform2 uniform2-norpc"
exec bash "$here/scripts/experiment.sh" "$here/configs/experiments/kvmix.ini" -D "importance.random-seeds=$seeds" \
  --run "$run" "${args[@]}"
