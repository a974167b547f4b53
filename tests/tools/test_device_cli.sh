#!/usr/bin/env bash
# The device options through the tools (kernels/RUNTIME.md §10): kvrun selfcheck on the CUDA backend's host model
# (every kind of codec, and one fitted plan of stories260K), its JSON, and the refusals: unknown devices, the
# GPU's cache options, and a machine without a GPU (a clear error, exit 1).
#   test_device_cli.sh TOOLS_DIR       (data from $KVCAL_DATA_DIR; exit 77 = skipped)
set -u
bin="$1"
source "$(dirname "${BASH_SOURCE[0]}")/cli_test_lib.sh"
head -c 60000 "$calib" > "$tmp/corpus.txt"
head -c 20000 "$heldout" > "$tmp/held.txt"

expect 0 "0 checks failed" "selfcheck of every kind of codec on the host model" -- "$bin/kvrun" selfcheck --device cuda-model
"$bin/kvrun" selfcheck --device cuda-model --json > "$tmp/sc.json" 2> "$tmp/err"
python3 - "$tmp/sc.json" <<'PY' && ok "selfcheck --json: every codec passed, with its numbers" || bad "selfcheck --json"
import json, sys
d = json.load(open(sys.argv[1]))
assert d["device"] == "cuda-model" and d["failed"] == 0, d
assert len(d["checks"]) >= 20
for c in d["checks"]:
    assert c["passed"] and c["values_compared"] > 0 and c["rows_checked"] > 0 and 0 <= c["worst_error_over_bound"] < 1, c
PY
expect 0 "" "kvcal fit (kivi-2) for a plan to check" -- "$bin/kvcal" fit --model "$model" --corpus "$tmp/corpus.txt" \
  --method kivi --bits 2 --seq-len 256 --max-tokens 4000 --out "$tmp/k2.kvplan" -q
expect 0 "0 checks failed" "selfcheck --plan --model on the host model" -- "$bin/kvrun" selfcheck --device cuda-model \
  --plan "$tmp/k2.kvplan" --model "$model"
expect 2 "go together" "selfcheck --plan without --model" -- "$bin/kvrun" selfcheck --device cuda-model --plan "$tmp/k2.kvplan"
expect 2 "must be cuda or cuda-model" "selfcheck --device cpu" -- "$bin/kvrun" selfcheck --device cpu
expect 2 "must be cpu or cuda" "eval --device gpu" -- "$bin/kvrun" eval --model "$model" --text "$tmp/held.txt" --ctx 64 --device gpu
expect 2 "holds the cache in the runtime" "generate --device cuda --cache f32" -- "$bin/kvrun" generate --model "$model" -n 4 \
  --device cuda --cache f32
expect 2 "holds the cache in the runtime" "bench --device cuda --cache f32" -- "$bin/kvrun" bench --model "$model" \
  --context 16 --device cuda --cache f32
if ! command -v nvidia-smi > /dev/null || ! nvidia-smi > /dev/null 2>&1; then
  expect 1 "CUDA" "eval --device cuda without a GPU: a clear error" -- "$bin/kvrun" eval --model "$model" \
    --text "$tmp/held.txt" --ctx 64 --device cuda
  expect 1 "CUDA" "selfcheck --device cuda without a GPU" -- "$bin/kvrun" selfcheck --device cuda
fi
exit $fail
