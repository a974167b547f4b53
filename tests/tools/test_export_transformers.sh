#!/usr/bin/env bash
# kvcal export read by the real loaders: a small random Llama made and saved by Hugging Face
# transformers (float32, and bfloat16), FP8 plans fitted on it by kvcal (per tensor and per KV head),
# exported as compressed-tensors, then loaded back with transformers + compressed-tensors on the CPU:
# every attention module must carry k_scale / v_scale with the registered shape and the plan's values
# (rounded to the model's dtype), and a forward pass through the quantized KV cache must run.
# The packages are pinned and installed from PyPI into VENV_DIR (a git-ignored folder shared by the
# build trees, under a lock), bounded in time; exit 77 (skipped) when they cannot be installed (no
# network) or the data is missing.
#   test_export_transformers.sh TOOLS_DIR VENV_DIR
set -u
tools="$1"; venv="$2"
kvcal="$tools/kvcal"; kvrun="$tools/kvrun"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
data="${KVCAL_DATA_DIR:-}"
if [ -z "$data" ] || [ ! -f "$data/stories260K/tok512.bin" ]; then
  echo "skipped: no stories260K in KVCAL_DATA_DIR"; exit 77
fi
pins=(torch==2.15.0 transformers==5.23.0 compressed-tensors==0.20.0 safetensors==0.8.0 numpy)
install_budget="${KVCAL_PIP_TIMEOUT:-900}"
mkdir -p "$(dirname "$venv")"
exec 9> "$(dirname "$venv")/lock"
flock 9
ready() { [ -x "$venv/bin/python" ] && [ -f "$venv/.kvcal-pins" ] && [ "$(cat "$venv/.kvcal-pins")" = "${pins[*]}" ] &&
          "$venv/bin/python" -c "import torch, transformers, compressed_tensors, safetensors" 2>/dev/null; }
if ! ready; then
  rm -rf "$venv"
  echo "installing ${pins[*]} into $venv (at most ${install_budget} s)"
  start=$(date +%s)
  if ! { python3 -m venv "$venv" && timeout "$install_budget" "$venv/bin/pip" install -q --disable-pip-version-check \
           "${pins[@]}"; } > "$(dirname "$venv")/pip.log" 2>&1; then
    echo "skipped: cannot install ${pins[*]} with pip (see $(dirname "$venv")/pip.log)"; tail -3 "$(dirname "$venv")/pip.log"; rm -rf "$venv"; exit 77
  fi
  echo "${pins[*]}" > "$venv/.kvcal-pins"
  echo "installed in $(( $(date +%s) - start )) s"
fi
flock -u 9
py="$venv/bin/python"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
head -c 60000 "$data/wikitext-2-raw/wiki.valid.raw" > "$tmp/corpus.txt"
fail=0
for dtype in float32 bfloat16; do
  "$py" "$here/export_transformers_check.py" make "$tmp/hf-$dtype" "$dtype" > "$tmp/make.log" 2>&1 ||
    { echo "FAIL: transformers could not make the $dtype model"; cat "$tmp/make.log"; exit 1; }
done
for g in tensor head; do
  "$kvcal" fit --model "$tmp/hf-float32" --tokenizer "$data/stories260K/tok512.bin" --corpus "$tmp/corpus.txt" \
    --seq-len 256 --max-tokens 4000 --method fp8 --scale-granularity "$g" --no-checkpoint -q --out "$tmp/$g.kvplan" \
    > /dev/null 2> "$tmp/fit.err" || { echo "FAIL: kvcal fit on the transformers checkpoint ($g)"; cat "$tmp/fit.err"; exit 1; }
  "$kvrun" inspect --json "$tmp/$g.kvplan" > "$tmp/$g.json" || exit 1
done
check() { # PLAN DTYPE STRATEGY
  "$kvcal" export --plan "$tmp/$1.kvplan" --model "$tmp/hf-$2" --format compressed-tensors --out "$tmp/out-$1-$2" -q \
    2> "$tmp/e.err" || { echo "FAIL: export $1 into the $2 checkpoint"; cat "$tmp/e.err"; fail=1; return; }
  "$py" "$here/export_transformers_check.py" load "$tmp/out-$1-$2" "$tmp/$1.json" "$2" "$3" || fail=1
}
check tensor float32 tensor
check head float32 attn_head
check tensor bfloat16 tensor
[ $fail -eq 0 ] && echo "test_export_transformers: all passed"
exit $fail
