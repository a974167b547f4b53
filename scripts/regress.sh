#!/usr/bin/env bash
# Held-out regression: fit plans on the calibration split (wiki.valid.raw) and evaluate them on the
# held-out split (wiki.test.raw), for the tiny model (stories260K) and, with a small token budget,
# the default model (SmolLM2-135M); compare with the checked-in baselines and tolerances in
# tests/regress/baselines.json. A method whose quality or bits get worse fails.
#   scripts/regress.sh [--build DIR] [--out DIR] [--update]   (--update rewrites the baselines)
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="$here/build"
out="$here/build/regress"
update=0
while [ $# -gt 0 ]; do
  case "$1" in
    --build) build="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    --update) update=1; shift ;;
    -h|--help) sed -n '2,7p' "$0"; exit 0 ;;
    *) echo "regress: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
data="$(bash "$here/scripts/data-dir.sh")"
kvcal="$build/tools/kvcal"
kvrun="$build/tools/kvrun"
[ -x "$kvcal" ] && [ -x "$kvrun" ] || { echo "regress: build first (no $kvcal / $kvrun)" >&2; exit 2; }
mkdir -p "$out"
calib="$data/wikitext-2-raw/wiki.valid.raw"
heldout="$data/wikitext-2-raw/wiki.test.raw"
# Small HIGGS grids keep CI fast; the grid's MSE is within a few percent of the full setting's.
grid_opts=(--set higgs.grid_samples=65536 --set higgs.grid_iters=40)

# run NAME MODEL TOKENIZER FIT_ARGS... -- EVAL_ARGS...
run() {
  local name="$1" model="$2" tok="$3"; shift 3
  local fit=() evalargs=() seen=0
  for a in "$@"; do
    if [ "$a" = "--" ]; then seen=1; continue; fi
    if [ $seen -eq 0 ]; then fit+=("$a"); else evalargs+=("$a"); fi
  done
  local tokargs=()
  [ -n "$tok" ] && tokargs=(--tokenizer "$tok")
  echo "== $name"
  "$kvcal" fit -q --model "$model" "${tokargs[@]}" --corpus "$calib" --out "$out/$name.kvplan" \
      --no-checkpoint "${grid_opts[@]}" "${fit[@]}" > "$out/$name.fit.txt"
  "$kvrun" eval -q --model "$model" "${tokargs[@]}" --text "$heldout" --plan "$out/$name.kvplan" --json \
      "${evalargs[@]}" > "$out/$name.json"
  cat "$out/$name.json"
}

tiny="$data/stories260K/stories260K.bin"
tinytok="$data/stories260K/tok512.bin"
tiny_fit=(--seq-len 256 --max-tokens 32768 --set cache.recent=64 --set keys.group_size=32 --set values.group_size=32)
tiny_eval=(--ctx 512 --max-tokens 16384)
for cfg in kivi-2 higgs-2 aqua-2 aqua-4; do
  run "stories260K-$cfg" "$tiny" "$tinytok" --method "${cfg%-*}" --bits "${cfg##*-}" "${tiny_fit[@]}" -- "${tiny_eval[@]}"
done

model="$(bash "$here/scripts/fetch-model.sh" 2>/dev/null | tail -n 1 || true)"
if [ -n "$model" ] && [ -f "$model" ]; then
  smol_fit=(--seq-len 512 --max-tokens 4096)
  smol_eval=(--ctx 512 --max-tokens 1024)
  for m in kivi aqua; do
    run "smollm2-$m-2" "$model" "" --method "$m" --bits 2 "${smol_fit[@]}" -- "${smol_eval[@]}"
  done
else
  echo "regress: default model unavailable; its cases are skipped" >&2
fi

python3 "$here/tests/regress/compare.py" "$here/tests/regress/baselines.json" "$out" $([ $update -eq 1 ] && echo --update)
