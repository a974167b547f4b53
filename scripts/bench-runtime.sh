#!/usr/bin/env bash
# The runtime's decode speed and the bytes it holds, against this engine's f32 and f16 caches and
# llama.cpp's f16 / q8_0 / q4_0 KV caches on the same GGUF, at several contexts (BENCHMARKS.md,
# "Runtime"). A benchmark, not a test: run it on a quiet machine.
#   scripts/bench-runtime.sh [--model GGUF] [--threads T] [--contexts "1024 4096 8192"] [--batches "1 4"]
#                            [--decode K] [--plans DIR] [--configs "f32 f16 kivi-2 ..."] [--no-llamacpp]
# Plans are fitted into DIR (default data/cache/bench-plans) when missing, on a small calibration
# budget (speed does not depend on the fit): kivi-2, kivi-4, higgs-2, aqua-2, kvmix (KVmix
# importance from 8 prompts, its allocation fitted as KIVI-2). llama.cpp: llama-cpp-python in
# $KVCAL_REF_PYTHON (default .venv-ref/bin/python), batch 1 only. Prints a markdown table; the JSON
# lines go to DIR/bench-runtime.jsonl.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
model="$here/data/cache/models/SmolLM2-135M-Instruct.Q4_1.gguf"
threads=2 contexts="1024 4096 8192" batches="1 4" decode=64 plans="$here/data/cache/bench-plans" llamacpp=1
configs="f32 f16 kivi-2 kivi-4 higgs-2 aqua-2 kvmix"
while [ $# -gt 0 ]; do
  case "$1" in
    --model) model="$2"; shift 2 ;;
    --threads) threads="$2"; shift 2 ;;
    --contexts) contexts="$2"; shift 2 ;;
    --batches) batches="$2"; shift 2 ;;
    --decode) decode="$2"; shift 2 ;;
    --plans) plans="$2"; shift 2 ;;
    --configs) configs="$2"; shift 2 ;;
    --no-llamacpp) llamacpp=0; shift ;;
    -h|--help) sed -n '2,12p' "$0"; exit 0 ;;
    *) echo "bench-runtime: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
build="${KVCAL_BUILD:-$here/build}"
py="${KVCAL_REF_PYTHON:-$here/.venv-ref/bin/python}"
data="$(bash "$here/scripts/data-dir.sh")"
[ -x "$build/tools/kvrun" ] || { echo "bench-runtime: $build/tools/kvrun not built (scripts/build.sh)" >&2; exit 1; }
[ -f "$model" ] || { echo "bench-runtime: model $model not found (scripts/fetch-model.sh)" >&2; exit 1; }
mkdir -p "$plans"
calib="$data/wikitext-2-raw/wiki.valid.raw"
fit() { # name method bits [extra...]
  local name="$1" method="$2" bits="$3"; shift 3
  [ -f "$plans/$name.kvplan" ] && return 0
  echo "bench-runtime: fitting $name" >&2
  "$build/tools/kvcal" fit -q --model "$model" --corpus "$calib" --method "$method" --bits "$bits" --seq-len 512 \
    --max-tokens 4096 --no-checkpoint --out "$plans/$name.kvplan" "$@" > /dev/null
}
for c in $configs; do
  case "$c" in
    kivi-2) fit kivi-2 kivi 2 ;;
    kivi-4) fit kivi-4 kivi 4 ;;
    higgs-2) fit higgs-2 higgs 2 ;;
    aqua-2) fit aqua-2 aqua 2 ;;
    kvmix)
      if [ ! -f "$plans/kvmix.kvplan" ]; then
        "$build/tools/kvprof" importance -q --model "$model" --corpus "$calib" --prompts 8 --max-len 512 \
          --out "$plans/kvmix-importance.json" --json --config-out "$plans/kvmix.yaml" > /dev/null
        fit kvmix kivi 2 --config "$plans/kvmix.yaml"
      fi ;;
  esac
done
out="$plans/bench-runtime.jsonl"
: > "$out"
echo "bench-runtime: $(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg); $model; threads $threads, decode $decode" >&2
for ctx in $contexts; do
  for b in $batches; do
    for c in $configs; do
      case "$c" in
        f32|f16) args=(--cache "$c") ;;
        *) args=(--plan "$plans/$c.kvplan") ;;
      esac
      "$build/tools/kvrun" bench -q --model "$model" "${args[@]}" --context "$ctx" --decode "$decode" --batch "$b" \
        -t "$threads" --json | sed "s/^{/{\"config\": \"$c\", /" >> "$out"
    done
    if [ "$llamacpp" = 1 ] && [ "$b" = 1 ] && "$py" -c "import llama_cpp" 2>/dev/null; then
      for kv in "f16 f16" "q8_0 q8_0" "q4_0 q4_0"; do
        set -- $kv
        "$py" "$here/tests/bench/bench_llamacpp_kv.py" "$model" --context "$ctx" --decode "$decode" --threads "$threads" \
          --type-k "$1" --type-v "$2" --flash-attn | sed "s/^{/{\"config\": \"llama.cpp $1\", /" >> "$out"
      done
    fi
  done
done
python3 - "$out" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
ctxs = sorted({r["context"] for r in rows})
batches = sorted({r["batch"] for r in rows})
cols = [(c, b) for b in batches for c in ctxs]
names = []
for r in rows:
    if r["config"] not in names:
        names.append(r["config"])
def get(n, c, b):
    for r in rows:
        if r["config"] == n and r["context"] == c and r["batch"] == b:
            return r
print("| cache | " + " | ".join(f"{c // 1024}K b{b} tok/s (vs f16)" for c, b in cols) +
      " | bytes per sequence at " + ", ".join(f"{c // 1024}K" for c in ctxs) + " | bits/value |")
print("|---|" + "---|" * len(cols) + "---|---|")
for n in names:
    cells = []
    for c, b in cols:
        r, f = get(n, c, b), get("f16", c, b)
        if not r:
            cells.append("-")
            continue
        tps = r["decode_tokens_per_second"]
        cells.append(f"{tps:.2f} ({tps / f['decode_tokens_per_second']:.2f}x)" if f else f"{tps:.2f}")
    sizes = []
    for c in ctxs:
        r = get(n, c, 1) or get(n, c, batches[0])
        sizes.append(f"{r['cache_bytes'] / r['batch'] / 2**20:.1f} MiB" if r else "-")
    r = get(n, ctxs[-1], batches[0])
    bits = r.get("bits_per_value_total") if r else None
    tail = f" | {bits:.2f} |" if bits is not None else " | - |"
    print(f"| {n} | " + " | ".join(cells) + " | " + ", ".join(sizes) + tail)
PY
