#!/usr/bin/env bash
# One experiment from a configuration (configs/experiments/*.ini; the format in configs/experiments/README.md): fit
# each configured method on the calibration text, evaluate each plan on the held-out text, write JSON and a table;
# with a [search] section also the searched plans and the Pareto chart, with `compare` the regression verdict.
#   scripts/experiment.sh CONFIG [--KEY VALUE ...] [--set K=V ...] [--row NAME=ARGS ...] [-D KEY=VALUE ...]
#                         [--reuse] [--update] [-t N] [-v] [--dry-run]
# --KEY VALUE sets the [experiment] key KEY (or the [search] / [importance] key of that name): --model PATH,
# --ctx "2048 8192", --eval-tokens N, --fit-tokens N, --run "kivi-2 aqua-2" (alias --configs, --methods),
# --out DIR, --build DIR, ... -D KEY=VALUE sets any key (search.KEY, importance.KEY for those sections). --set K=V
# goes to every kvcal fit (and kvcal search). --row NAME='FIT ARGS' adds a row. --reuse keeps plans and results
# already in OUT (an interrupted run goes on where it stopped). --update: rewrite the baselines (`compare`). -v: every
# command and everything the tools print on the terminal (default: in OUT/logs/NN-STEP.log, a failure shows the tail).
# Example: scripts/experiment.sh configs/experiments/results.ini --run "kivi-2 aqua-2" --ctx "2048 8192"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
exec python3 "$here/experiment.py" "$@"
