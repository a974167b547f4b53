#!/usr/bin/env bash
# The main comparison: fit plans on the calibration split and evaluate them on the held-out split,
# every method by the same tools on the same tokens, and print a table (markdown).
#   scripts/results.sh [--model PATH] [--tokenizer PATH] [--ctx "N ..."] [--eval-tokens N] [--fit-tokens N]
#                      [--seq-len N] [--configs "kivi-2 higgs-2 aqua-2 ..."] [--out DIR] [--build DIR] [--reuse]
# --ctx with several contexts: each plan is fitted once and evaluated at each context on the same
# --eval-tokens (whole chunks), the results in DIR/ctxN/, one table per context. --reuse: keep a plan
# already in DIR (an interrupted run goes on where it stopped; a changed setting needs a fresh DIR).
# Defaults: the default model (fetched), ctx 2048, 40960 held-out tokens (20 chunks), 131072
# calibration tokens in sequences of 1024 for methods with predictors (aqua*) and 8192 for those
# without (--fit-tokens-nopred: kivi and higgs fit nothing from data; their calibration pass only
# measures the held-out errors), configs kivi-2 kivi-4 higgs-2 higgs-3 higgs-4 aqua-2 aqua-3 aqua-4.
# kivi-BgG: KIVI at B bits (1 too) with key groups of G tokens and value groups of 64 channels (kivi-1g128,
# kivi-2g128: the layout of kvcal search's kivi1g128 / kivi2g128 candidates, without the calibrated eta).
# aqua-Nq: AQUA-KV-N with the predictors as 4-bit GPTQ codes (aquakv.txt §4.1; kvcal search's aquaNq candidates).
# CONFIG@POLICYB: the same with token pruning (RUNTIME.md §8), e.g. kivi-4@h2o0.125: H2O at a budget of 1/8 of
# the f16 cache (pruning.method, pruning.budget); in this perplexity protocol only H2O prunes throughout a chunk.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="$here/build"
model=""
tok=""
ctx=2048
eval_tokens=40960
fit_tokens=131072
fit_tokens_nopred=8192
seq_len=1024
configs="kivi-2 kivi-4 higgs-2 higgs-3 higgs-4 aqua-2 aqua-3 aqua-4"
out=""
reuse=0
extra_fit=()
while [ $# -gt 0 ]; do
  case "$1" in
    --model) model="$2"; shift 2 ;;
    --tokenizer) tok="$2"; shift 2 ;;
    --ctx) ctx="$2"; shift 2 ;;
    --eval-tokens) eval_tokens="$2"; shift 2 ;;
    --fit-tokens) fit_tokens="$2"; shift 2 ;;
    --fit-tokens-nopred) fit_tokens_nopred="$2"; shift 2 ;;
    --seq-len) seq_len="$2"; shift 2 ;;
    --configs) configs="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    --build) build="$2"; shift 2 ;;
    --set) extra_fit+=(--set "$2"); shift 2 ;;
    --reuse) reuse=1; shift ;;
    -h|--help) sed -n '2,12p' "$0"; exit 0 ;;
    *) echo "results: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
ctxs="${ctx//,/ }"
n_ctx=$(wc -w <<< "$ctxs")
[ -n "$model" ] || model="$(bash "$here/scripts/fetch-model.sh" | tail -n 1)"
data="$(bash "$here/scripts/data-dir.sh")"
[ -n "$out" ] || out="$build/results/$(basename "$model")"
mkdir -p "$out"
tokargs=()
[ -n "$tok" ] && tokargs=(--tokenizer "$tok")
kvcal="$build/tools/kvcal"
kvrun="$build/tools/kvrun"
calib="$data/wikitext-2-raw/wiki.valid.raw"
heldout="$data/wikitext-2-raw/wiki.test.raw"

for cfg in $configs; do
  base="${cfg%%@*}"
  method="${base%-*}"
  bits="${base##*-}"
  pflags=()
  if [[ "$cfg" == *@* ]]; then
    prune="${cfg#*@}"
    [[ "$prune" =~ ^(h2o|snapkv|pyramidkv|streamingllm)([0-9.]+)$ ]] || { echo "results: bad pruning '$prune' in $cfg (e.g. kivi-4@h2o0.125)" >&2; exit 2; }
    pflags=(--set "pruning.method=${BASH_REMATCH[1]}" --set "pruning.budget=${BASH_REMATCH[2]}")
  fi
  plan="$out/$cfg.kvplan"
  budget=$fit_tokens
  case "$method" in kivi|higgs) budget=$fit_tokens_nopred ;; esac
  # FP8 / NVFP4 (issue 20): fp8-one (scales 1.0), fp8-tensor, fp8-head, nvfp4-tensor, nvfp4-head:
  # the suffix is the scale granularity, no bits; they fit only scales (the no-predictor budget)
  mflags=(--bits "$bits")
  if [ "$method" = kivi ] && [[ "$bits" =~ ^([0-9]+)g([0-9]+)$ ]]; then
    mflags=(--set "keys.bits=${BASH_REMATCH[1]}" --set "values.bits=${BASH_REMATCH[1]}"
            --set "keys.group_size=${BASH_REMATCH[2]}" --set values.group_size=64)
  fi
  # aqua-Nq (aqua-uniform-Nq): AQUA-KV with its predictors stored as 4-bit GPTQ codes (aquakv.txt §4.1,
  # aqua.predictor_bits=4; kvcal search's aquaNq candidates)
  if [[ "$method" == aqua* ]] && [[ "$bits" =~ ^([0-9]+)q$ ]]; then
    mflags=(--bits "${BASH_REMATCH[1]}" --set aqua.predictor_bits=4)
  fi
  case "$method" in
    fp8|nvfp4)
      budget=$fit_tokens_nopred
      if [ "$bits" = one ]; then mflags=(--set fp.scale=one); else mflags=(--scale-granularity "$bits"); fi ;;
  esac
  if [ "$reuse" = 1 ] && [ -s "$plan" ] && [ -s "$out/$cfg.fit-seconds" ]; then
    echo "== $cfg: reusing $plan" >&2
  else
    echo "== $cfg: fit on $(basename "$calib") ($budget tokens)" >&2
    start=$(date +%s.%N)
    "$kvcal" fit --model "$model" "${tokargs[@]}" --corpus "$calib" --out "$plan" --method "$method" \
        "${mflags[@]}" "${pflags[@]}" --seq-len "$seq_len" --max-tokens "$budget" "${extra_fit[@]}" > "$out/$cfg.fit.txt"
    end=$(date +%s.%N)
    python3 -c "import sys; print(float(sys.argv[2]) - float(sys.argv[1]))" "$start" "$end" > "$out/$cfg.fit-seconds"
  fi
  for c in $ctxs; do
    dir="$out"
    [ "$n_ctx" -gt 1 ] && dir="$out/ctx$c" && mkdir -p "$dir"
    [ "$reuse" = 1 ] && [ -s "$dir/$cfg.json" ] && continue
    echo "== $cfg: evaluate on $(basename "$heldout") ($eval_tokens tokens, ctx $c)" >&2
    "$kvrun" eval --model "$model" "${tokargs[@]}" --text "$heldout" --ctx "$c" --max-tokens "$eval_tokens" \
        --plan "$plan" --json > "$dir/$cfg.json.part"
    python3 - "$dir/$cfg.json.part" "$out/$cfg.fit-seconds" <<'PY'
import json, sys
p = sys.argv[1]
r = json.load(open(p))
r["fit_seconds"] = float(open(sys.argv[2]).read())
json.dump(r, open(p, "w"))
PY
    mv "$dir/$cfg.json.part" "$dir/$cfg.json"
  done
done
for c in $ctxs; do
  dir="$out"
  if [ "$n_ctx" -gt 1 ]; then dir="$out/ctx$c"; echo; echo "### context $c"; echo; fi
  python3 "$here/scripts/results_table.py" "$dir" $configs
done
