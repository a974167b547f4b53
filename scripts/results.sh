#!/usr/bin/env bash
# The main comparison (configs/experiments/results.ini): every method fitted on the calibration split and evaluated
# on the held-out split by the same tools on the same tokens, and a markdown table (per context).
#   scripts/results.sh [--model PATH] [--tokenizer PATH] [--ctx "N ..."] [--eval-tokens N] [--fit-tokens N]
#                      [--fit-tokens-nopred N] [--seq-len N] [--configs "kivi-2 higgs-2 aqua-2 ..."] [--out DIR]
#                      [--build DIR] [--set K=V] [--reuse]
# --configs names rows of configs/experiments/methods.ini: kivi-B, kivi-BgG (key groups of G tokens), higgs-B,
# aqua-B, aqua-Bq (GPTQ predictors), aqua-uniform-B, fp8-tensor|head|one, nvfp4-..., and NAME@POLICYB for token
# pruning (e.g. kivi-4@h2o0.125). Defaults in results.ini. A thin wrapper of scripts/experiment.sh.
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
case "${1:-}" in -h|--help) sed -n '2,9p' "$0"; exit 0 ;; esac
exec bash "$here/scripts/experiment.sh" "$here/configs/experiments/results.ini" "$@"
