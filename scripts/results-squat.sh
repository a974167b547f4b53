#!/usr/bin/env bash
# SQuat's rows (configs/experiments/squat.ini): KIVI-2 and SQuat-2 (the paper's r = 5, lambda = 1e-3, or r and lambda
# chosen per layer by calibration, calib/FIT.md §3.3; the prompt's subspace or the static calibration basis), fitted
# on wiki.valid.raw and evaluated on wiki.test.raw as a prompt of --prefill tokens followed by single-token decoding,
# every plan at 2 bits for keys and values. Columns: bits per value, ppl, KL, top-1 agreement, then the held-out
# attention errors the fit measured, and fit seconds. NAMEs: kivi2 squat2-paper squat2-cal squat2-paper-static
# squat2-cal-static (default: all, kivi2 last: its errors come from the squat2-cal fit).
#   scripts/results-squat.sh [--build DIR] [--out DIR] [--fit-tokens N] [--seq-len N] [--eval-tokens N]
#                            [--ctx N] [--prefill N] [-t N] [NAME ...]
# A thin wrapper of scripts/experiment.sh.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
args=()
while [ $# -gt 0 ]; do
  case "$1" in
    -h|--help) sed -n '2,10p' "$0"; exit 0 ;;
    -t|--build|--out|--fit-tokens|--seq-len|--eval-tokens|--ctx|--prefill) args+=("$1" "$2"); shift 2 ;;
    -*) echo "results-squat: unknown option '$1'" >&2; exit 2 ;;
    *) break ;;
  esac
done
[ $# -gt 0 ] && args+=(--run "$*")
exec bash "$here/scripts/experiment.sh" "$here/configs/experiments/squat.ini" "${args[@]}"
