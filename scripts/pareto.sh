#!/usr/bin/env bash
# The Pareto frontier (configs/experiments/pareto.ini, calib/SEARCH.md §6): every single method fitted and evaluated
# at each context, one kvcal search at the grid budgets and each single method's own honest bits, then the chart,
# the table and the equal-bits verdict (scripts/pareto_chart.py: DIR/pareto.svg, DIR/pareto.md).
#   scripts/pareto.sh [--model PATH] [--contexts "2048 8192"] [--eval-tokens N] [--fit-tokens N]
#                     [--methods "kivi-2 ..."] [--budgets "2 3 4 5"] [--range "2 5.5"] [--candidates LIST]
#                     [--search-fit-tokens N] [--sens-ctx N] [--sens-samples N] [--prompts N] [--out DIR]
#                     [--build DIR] [--reuse] [--pruned LIST] [--pruned-layers M,...]
# --range: single methods whose honest bits fall in [lo, hi] get a searched plan at their bits. --pruned: the
# search's pruned contenders (SEARCH.md §5.4), e.g. kivi4@h2o0.07; --pruned-layers: their per-layer options (§5.5).
# A thin wrapper of scripts/experiment.sh.
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
case "${1:-}" in -h|--help) sed -n '2,11p' "$0"; exit 0 ;; esac
exec bash "$here/scripts/experiment.sh" "$here/configs/experiments/pareto.ini" "$@"
