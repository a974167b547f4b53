#!/usr/bin/env bash
# The decoding cost model (calib/SEARCH.md §7, model/decode_cost.c) against whole-model runs: for the f16 cache and
# each plan, at each context, `kvrun bench --predict` measures decode tokens/s end to end (a prompt of N seeded random
# tokens in 512-token chunks, then K greedy steps, batch 1) and prints the cost model's prediction for the same cache
# and context; R repeats, back to back. Prints a markdown table: measured and predicted tokens/s (the median of the
# repeats), the prediction's error, and the speed against the f16 cache measured and predicted (what
# `kvcal search --min-decode-speed` constrains). A benchmark, not a test.
#   scripts/bench-cost-model.sh --plans "A.kvplan B.kvplan" [--model GGUF] [--contexts "2048 8192"] [--decode K]
#                               [--repeats R] [--threads T]
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
model="$here/data/cache/models/SmolLM2-135M-Instruct.Q4_1.gguf" contexts="2048 8192" decode=32 repeats=3 threads=2
plans=""
while [ $# -gt 0 ]; do
  case "$1" in
    --plans) plans="$2"; shift 2 ;;
    --model) model="$2"; shift 2 ;;
    --contexts) contexts="$2"; shift 2 ;;
    --decode) decode="$2"; shift 2 ;;
    --repeats) repeats="$2"; shift 2 ;;
    --threads) threads="$2"; shift 2 ;;
    -h|--help) sed -n '2,9p' "$0"; exit 0 ;;
    *) echo "bench-cost-model: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
build="${KVCAL_BUILD:-$here/build}"
[ -x "$build/tools/kvrun" ] || { echo "bench-cost-model: $build/tools/kvrun not built (scripts/build.sh)" >&2; exit 1; }
[ -n "$plans" ] || { echo "bench-cost-model: --plans is required" >&2; exit 2; }
echo "bench-cost-model: $(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg), $(date -u +%F); $model; threads $threads" >&2
tmp="$(mktemp -d)"; trap 'rm -rf "$tmp"' EXIT
for ctx in $contexts; do
  for p in f16 $plans; do
    for r in $(seq "$repeats"); do
      "$build/tools/kvrun" bench -q -m "$model" $([ "$p" = f16 ] || echo --plan "$p") --context "$ctx" \
        --decode "$decode" -t "$threads" --predict --json | sed "s|^{|{\"name\": \"$(basename "$p" .kvplan)\", |" \
        >> "$tmp/runs.jsonl"
    done
  done
done
python3 - "$tmp/runs.jsonl" <<'PY'
import json, statistics, sys
runs = [json.loads(l) for l in open(sys.argv[1])]
by = {}
for r in runs:
    by.setdefault((r["context"], r["name"]), []).append(r)
med = lambda rs, k: statistics.median(r[k] for r in rs)
print("| context | cache | measured tok/s | predicted tok/s | error | measured vs f16 | predicted vs f16 |")
print("|---|---|---|---|---|---|---|")
for (ctx, name), rs in by.items():
    m, p = med(rs, "decode_tokens_per_second"), med(rs, "predicted_decode_tokens_per_second")
    f = med(by[(ctx, "f16")], "decode_tokens_per_second")
    print(f"| {ctx} | {name} | {m:.2f} | {p:.2f} | {100 * (p / m - 1):+.1f}% | {m / f:.3f}x | "
          f"{med(rs, 'predicted_speed_vs_f16'):.3f}x |")
PY
