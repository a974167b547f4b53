#!/usr/bin/env bash
# XQuant's RESULTS.md rows: fit on wiki.valid.raw, evaluate on wiki.test.raw, one row per
# configuration NAME=METHOD:SET,SET,...  (kvcal fit --method METHOD --set SET ...).
#   scripts/results-xquant.sh [--build DIR] [--out DIR] [--fit-tokens N] [--seq-len N]
#                             [--eval-tokens N] [--ctx N] NAME=METHOD:SETS ...
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="$here/build"; out=""; fit_tokens=4096; seq_len=1024; eval_tokens=8192; ctx=2048
while [ $# -gt 0 ]; do
  case "$1" in
    --build) build="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    --fit-tokens) fit_tokens="$2"; shift 2 ;;
    --seq-len) seq_len="$2"; shift 2 ;;
    --eval-tokens) eval_tokens="$2"; shift 2 ;;
    --ctx) ctx="$2"; shift 2 ;;
    -h|--help) sed -n '2,5p' "$0"; exit 0 ;;
    *) break ;;
  esac
done
model="$(bash "$here/scripts/fetch-model.sh" | tail -n 1)"
data="$(bash "$here/scripts/data-dir.sh")"
[ -n "$out" ] || out="$build/results/xquant"
mkdir -p "$out"
calib="$data/wikitext-2-raw/wiki.valid.raw"
heldout="$data/wikitext-2-raw/wiki.test.raw"
for spec in "$@"; do
  name="${spec%%=*}"; rest="${spec#*=}"; method="${rest%%:*}"; sets="${rest#*:}"
  args=()
  IFS=',' read -ra kv <<< "$sets"
  for s in "${kv[@]}"; do [ -n "$s" ] && args+=(--set "$s"); done
  plan="$out/$name.kvplan"
  echo "== $name: kvcal fit --method $method ${args[*]} ($fit_tokens tokens)" >&2
  start=$(date +%s.%N)
  "$build/tools/kvcal" fit --model "$model" --corpus "$calib" --out "$plan" --method "$method" \
      --seq-len "$seq_len" --max-tokens "$fit_tokens" "${args[@]}" > "$out/$name.fit.txt"
  end=$(date +%s.%N)
  echo "== $name: evaluate ($eval_tokens tokens, ctx $ctx)" >&2
  "$build/tools/kvrun" eval --model "$model" --text "$heldout" --ctx "$ctx" --max-tokens "$eval_tokens" \
      --plan "$plan" --json > "$out/$name.json"
  python3 - "$out/$name.json" "$start" "$end" <<'PY'
import json, sys
p = sys.argv[1]
r = json.load(open(p))
r["fit_seconds"] = float(sys.argv[3]) - float(sys.argv[2])
json.dump(r, open(p, "w"))
PY
  python3 -c "import json,sys; r=json.load(open(sys.argv[1])); print(sys.argv[2], '| %.3f | %.3f | %.4f | %+.2f%% | %.4f | %.4f | %.0f' % (r['bits_per_value'], r['bits_per_value_total'], r['ppl'], 100*r['ppl_relative_increase'], r['kl_mean'], r['top1_agreement'], r['fit_seconds']))" "$out/$name.json" "$name"
done
