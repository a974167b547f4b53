#!/usr/bin/env bash
# Reference-model speed against llama.cpp on the same GGUF and thread count, in the same run:
# prefill tokens/s (one forward pass over N tokens), decode tokens/s (single-token steps through the
# KV cache), peak RSS. A benchmark, not a test: run it on a quiet machine (other load skews both
# sides, and 2-thread runs badly when the cores are oversubscribed).
#   scripts/bench-model.sh [--model GGUF] [--threads T] [--prefill N] [--decode N] [--reps R] [--rounds K]
# Needs a build (build/ or $KVCAL_BUILD) and llama-cpp-python ($KVCAL_REF_PYTHON, default .venv-ref/bin/python).
# The engines alternate for K rounds (default 2); each round's ratios compare measurements taken
# back to back (the load of a shared machine drifts between rounds).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
model="$here/data/cache/models/SmolLM2-135M-Instruct.Q4_1.gguf"
threads=2 prefill=512 decode=128 reps=3 rounds=2
while [ $# -gt 0 ]; do
  case "$1" in
    --model) model="$2"; shift 2 ;;
    --threads) threads="$2"; shift 2 ;;
    --prefill) prefill="$2"; shift 2 ;;
    --decode) decode="$2"; shift 2 ;;
    --reps) reps="$2"; shift 2 ;;
    --rounds) rounds="$2"; shift 2 ;;
    -h|--help) sed -n '2,9p' "$0"; exit 0 ;;
    *) echo "bench-model: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
build="${KVCAL_BUILD:-$here/build}"
bench="$build/tests/model/bench_model"
py="${KVCAL_REF_PYTHON:-$here/.venv-ref/bin/python}"
[ -x "$bench" ] || { echo "bench-model: $bench not built (scripts/build.sh)" >&2; exit 1; }
[ -f "$model" ] || { echo "bench-model: model $model not found (scripts/fetch-model.sh)" >&2; exit 1; }
"$py" -c "import llama_cpp" 2>/dev/null || { echo "bench-model: $py has no llama_cpp (llama-cpp-python)" >&2; exit 1; }
args=(--threads "$threads" --prefill "$prefill" --decode "$decode" --reps "$reps")
out="$(mktemp)"
trap 'rm -f "$out"' EXIT
echo "bench-model: $(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg); $model; ${args[*]}" >&2
for round in $(seq "$rounds"); do
  for w in native f32; do
    "$bench" "$model" "${args[@]}" --weights "$w" | sed "s/\"engine\": \"kvcal\"/\"engine\": \"kvcal ($w weights)\"/" >> "$out"
  done
  "$py" "$here/tests/model/bench_llamacpp.py" "$model" "${args[@]}" >> "$out"
done
"$py" - "$out" <<'PY'
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1])]
per_round = 3  # kvcal native, kvcal f32, llama.cpp: measured back to back
print("| round | engine | threads | prefill tok/s | vs llama.cpp | decode tok/s | vs llama.cpp | peak RSS MB |")
print("|---|---|---|---|---|---|---|---|")
for i in range(0, len(lines), per_round):
    rnd = lines[i:i + per_round]
    ref = rnd[-1]
    for r in rnd:
        print(f"| {i // per_round + 1} | {r['engine']} | {r['threads']} | {r['prefill_tps']:.1f} | "
              f"{r['prefill_tps'] / ref['prefill_tps']:.2f}x | {r['decode_tps']:.1f} | "
              f"{r['decode_tps'] / ref['decode_tps']:.2f}x | {r['peak_rss_mb']:.0f} |")
PY
