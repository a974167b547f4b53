#!/usr/bin/env bash
# The Pareto frontier (calib/SEARCH.md §8): every single method fitted on the calibration split and evaluated at
# each context on the same held-out tokens (scripts/results.sh), then ONE kvcal search run (fits and sensitivities
# shared) that writes and validates a searched plan at each grid budget and at each single method's own honest
# bits at each context (B@N points), on the same tokens; then the chart, the table and the equal-bits verdict
# (scripts/pareto_chart.py: DIR/pareto.svg, DIR/pareto.md).
#   scripts/pareto.sh [--model PATH] [--contexts "2048 8192"] [--eval-tokens N] [--fit-tokens N]
#                     [--methods "kivi-2 ..."] [--budgets "2 3 4 5"] [--range "2 5.5"] [--candidates LIST]
#                     [--search-fit-tokens N] [--sens-ctx N] [--sens-samples N] [--prompts N] [--out DIR]
#                     [--build DIR] [--reuse] [--pruned LIST] [--pruned-layers M,...]
# --range: single methods whose honest bits fall in [lo, hi] get a searched plan at their bits. --reuse: keep
# what an earlier run with the same settings left in DIR (plans, evaluations, the search). --pruned: the search's
# pruned contenders (kvcal search --pruned, calib/SEARCH.md §5d), e.g. kivi4@h2o0.07,kivi4@h2o0.11; --pruned-layers:
# their per-layer options (kvcal search --pruned-layers, §5e), e.g. 0.5,2.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="$here/build"
model=""
contexts="2048 8192"
eval_tokens=8192
fit_tokens=32768
methods="kivi-2 kivi-3 kivi-4 higgs-2 higgs-3 higgs-4 fp8-tensor nvfp4-tensor aqua-2 aqua-3 aqua-4"
budgets="2 2.5 3 3.5 4 5"
range="2 5.5"
candidates="f16,kivi1,kivi2,kivi3,kivi4,higgs2,higgs3,higgs4,aqua2,aqua3,aqua4,aqua2r32,aqua2r64,aqua3r32,aqua3r64"
search_fit_tokens=8192
sens_ctx=512
sens_samples=1
prompts=4
out=""
reuse=()
pruned=()
layers=()
while [ $# -gt 0 ]; do
  case "$1" in
    --model) model="$2"; shift 2 ;;
    --contexts) contexts="$2"; shift 2 ;;
    --eval-tokens) eval_tokens="$2"; shift 2 ;;
    --fit-tokens) fit_tokens="$2"; shift 2 ;;
    --methods) methods="$2"; shift 2 ;;
    --budgets) budgets="$2"; shift 2 ;;
    --range) range="$2"; shift 2 ;;
    --candidates) candidates="$2"; shift 2 ;;
    --search-fit-tokens) search_fit_tokens="$2"; shift 2 ;;
    --sens-ctx) sens_ctx="$2"; shift 2 ;;
    --sens-samples) sens_samples="$2"; shift 2 ;;
    --prompts) prompts="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    --build) build="$2"; shift 2 ;;
    --reuse) reuse=(--reuse); shift ;;
    --pruned) pruned=(--pruned "$2"); shift 2 ;;
    --pruned-layers) layers=(--pruned-layers "$2"); shift 2 ;;
    -h|--help) sed -n '2,14p' "$0"; exit 0 ;;
    *) echo "pareto: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
[ -n "$model" ] || model="$(bash "$here/scripts/fetch-model.sh" | tail -n 1)"
data="$(bash "$here/scripts/data-dir.sh")"
[ -n "$out" ] || out="$build/pareto/$(basename "$model")"
mkdir -p "$out"
echo "== single methods: $methods" >&2
bash "$here/scripts/results.sh" --build "$build" --model "$model" --ctx "$contexts" --eval-tokens "$eval_tokens" \
  --fit-tokens "$fit_tokens" --configs "$methods" --out "$out/single" "${reuse[@]}" > "$out/single.md"
# the budgets: the grid at every context, and each single method's honest bits at its context (kvrun eval's
# JSON prints them to 1e-9: the searched plan is at most 5e-10 bits above the method's)
points="$(python3 - "$out/single" "$range" $budgets <<'PY'
import glob, json, os, sys
d, (lo, hi), grid = sys.argv[1], map(float, sys.argv[2].split()), sys.argv[3:]
pts = [str(float(b)).rstrip("0").rstrip(".") for b in grid]
for path in sorted(glob.glob(os.path.join(d, "*.json")) + glob.glob(os.path.join(d, "ctx*", "*.json"))):
    r = json.load(open(path))
    ctx, b = r["tokens_evaluated"] // r["chunks"], r["bits_per_value_total"]
    if lo <= b <= hi:
        pts.append("%.9f@%s" % (b, ctx))
print(",".join(dict.fromkeys(pts)))
PY
)"
if [ ${#reuse[@]} -eq 0 ] || [ ! -s "$out/search.json" ]; then
  echo "== kvcal search at $points (contexts $contexts)" >&2
  "$build/tools/kvcal" search --model "$model" --corpus "$data/wikitext-2-raw/wiki.valid.raw" \
    --heldout "$data/wikitext-2-raw/wiki.test.raw" --context "${contexts// /,}" --budget-bits "$points" \
    --candidates "$candidates" --fit-tokens "$search_fit_tokens" --sens-ctx "$sens_ctx" \
    --sens-samples "$sens_samples" --prompts "$prompts" --eval-tokens "$eval_tokens" --out-dir "$out/search" \
    "${pruned[@]}" "${layers[@]}" --json > "$out/search.json.part"
  mv "$out/search.json.part" "$out/search.json"
fi
python3 "$here/scripts/pareto_chart.py" "$out"
