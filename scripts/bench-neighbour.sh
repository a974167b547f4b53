#!/usr/bin/env bash
# Decoding next to a busy neighbour: `kvrun generate` (2 threads, exact f32 cache) alone and with
# one other process spinning on a core, for this build and for another kvrun binary (e.g. a build
# of an older commit), in the same run. A benchmark, not a test: run it on an otherwise quiet
# machine (BENCHMARKS.md, "busy neighbour").
#   scripts/bench-neighbour.sh [--other PATH/TO/kvrun] [--model GGUF] [-n N] [--rounds R]
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
model="$here/data/cache/models/SmolLM2-135M-Instruct.Q4_1.gguf"
other="" n=128 rounds=2
while [ $# -gt 0 ]; do
  case "$1" in
    --other) other="$2"; shift 2 ;;
    --model) model="$2"; shift 2 ;;
    -n) n="$2"; shift 2 ;;
    --rounds) rounds="$2"; shift 2 ;;
    -h|--help) sed -n '2,7p' "$0"; exit 0 ;;
    *) echo "bench-neighbour: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
this="${KVCAL_BUILD:-$here/build}/tools/kvrun"
[ -x "$this" ] || { echo "bench-neighbour: $this not built" >&2; exit 1; }
run() { # kvrun-binary -> decode tokens/s
  "$1" generate --model "$model" --prompt "Once upon a time" -n "$n" --ignore-eos -t 2 2>&1 >/dev/null |
    sed -n 's/.*generated [0-9]* tokens: \([0-9.]*\) tokens\/s.*/\1/p'
}
echo "bench-neighbour: $(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg); $n tokens, 2 threads" >&2
echo "| round | kvrun | alone tok/s | with a busy neighbour tok/s | ratio |"
echo "|---|---|---|---|---|"
for r in $(seq "$rounds"); do
  for bin in "$this" $other; do
    alone="$(run "$bin")"
    python3 -c 'while True: pass' &
    spin=$!
    sleep 1
    busy="$(run "$bin")"
    kill "$spin"
    wait "$spin" 2>/dev/null || true
    echo "| $r | $bin | $alone | $busy | $(python3 -c "print(f'{$busy / $alone:.2f}')") |"
  done
done
