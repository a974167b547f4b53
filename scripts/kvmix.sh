#!/usr/bin/env bash
# KVmix on the default model: layer importance from the calibration split, then KVmix allocation vs
# uniform 2-bit vs a random allocation with the same average bits, each with and without the
# recent pivotal context (RPC), evaluated on the held-out split as a prompt followed by
# token-by-token decoding (the regime the RPC is for). Prints a markdown table.
#   scripts/kvmix.sh [--model PATH] [--prompts N] [--max-len N] [--ctx N] [--prefill N]
#                    [--eval-tokens N] [--random-seeds "2 3 ..."] [--out DIR] [--build DIR]
# --random-seeds: more random allocations (one draw is a weak baseline), each fitted and evaluated
# with and without RPC; the table adds their mean.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="$here/build"
model=""
prompts=20
max_len=512
ctx=1024
prefill=512
eval_tokens=4096
random_seeds=""
out=""
while [ $# -gt 0 ]; do
  case "$1" in
    --model) model="$2"; shift 2 ;;
    --prompts) prompts="$2"; shift 2 ;;
    --max-len) max_len="$2"; shift 2 ;;
    --ctx) ctx="$2"; shift 2 ;;
    --prefill) prefill="$2"; shift 2 ;;
    --eval-tokens) eval_tokens="$2"; shift 2 ;;
    --random-seeds) random_seeds="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    --build) build="$2"; shift 2 ;;
    -h|--help) sed -n '2,9p' "$0"; exit 0 ;;
    *) echo "kvmix: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
[ -n "$model" ] || model="$(bash "$here/scripts/fetch-model.sh" | tail -n 1)"
data="$(bash "$here/scripts/data-dir.sh")"
[ -n "$out" ] || out="$build/kvmix/$(basename "$model")"
mkdir -p "$out"
calib="$data/wikitext-2-raw/wiki.valid.raw"
heldout="$data/wikitext-2-raw/wiki.test.raw"
B="$build/tools"

echo "== importance: $prompts prompts x $max_len tokens from $(basename "$calib")" >&2
"$B/kvprof" importance --model "$model" --corpus "$calib" --prompts "$prompts" --max-len "$max_len" \
    --out "$out/importance.yaml" --svg "$out/importance.svg" --config-out "$out/kvmix.yaml" \
    --random-config-out "$out/random.yaml" --compare-forward > "$out/importance.txt"
cat "$out/importance.txt" >&2
# More random allocations: the draw depends only on the layer count, --high-frac and the seed, so a
# minimal importance run (2 prompts of 16 tokens) is enough to have the tool write it.
for s in $random_seeds; do
  "$B/kvprof" importance -q --model "$model" --corpus "$calib" --prompts 2 --max-len 16 \
      --out "$out/random$s.importance.yaml" --random-config-out "$out/random$s.yaml" --random-seed "$s" > /dev/null
done
# the same allocations without RPC: every per-layer ratio set to 0
for a in kvmix random $(for s in $random_seeds; do echo "random$s"; done); do
  sed -E 's/(rpc_ratio: )[0-9.]+/\10.0/' "$out/$a.yaml" > "$out/$a-norpc.yaml"
done
printf 'layers: {}\n' > "$out/uniform.yaml"

# KIVI-style asymmetric quantization as in KVmix: keys per channel, values per token, groups of 32;
# without RPC the smallest full-precision buffer that whole key groups allow (32 tokens).
base=(--method kivi --bits 2 --seq-len 512 --max-tokens 4096 --no-checkpoint --set keys.group_size=32
      --set values.group_size=32 --set cache.recent=32)
fit() { # NAME CONFIG [extra...]
  local name="$1" cfg="$2"; shift 2
  echo "== fit $name" >&2
  "$B/kvcal" fit -q --model "$model" --corpus "$calib" --out "$out/$name.kvplan" "${base[@]}" --config "$cfg" "$@" \
      > "$out/$name.fit.txt"
  echo "== eval $name (prompt $prefill, then one token per step)" >&2
  "$B/kvrun" eval -q --model "$model" --text "$heldout" --ctx "$ctx" --max-tokens "$eval_tokens" \
      --plan "$out/$name.kvplan" --prefill "$prefill" --step 1 --json > "$out/$name.json"
}
fit kvmix "$out/kvmix.yaml"
fit kvmix-norpc "$out/kvmix-norpc.yaml"
fit random "$out/random.yaml"
fit random-norpc "$out/random-norpc.yaml"
for s in $random_seeds; do
  fit "random$s" "$out/random$s.yaml"
  fit "random$s-norpc" "$out/random$s-norpc.yaml"
done
fit uniform2 "$out/uniform.yaml" --set cache.rpc_ratio=0.1
fit uniform2-norpc "$out/uniform.yaml"

python3 - "$out" $random_seeds <<'PY'
import json, os, sys
out, seeds = sys.argv[1], sys.argv[2:]
rows = [("KVmix allocation, RPC 20%/10%", "kvmix"), ("KVmix allocation, no RPC", "kvmix-norpc"),
        ("random allocation (same bits, seed 1), RPC", "random"), ("random allocation (seed 1), no RPC", "random-norpc")]
for s in seeds:
    rows += [(f"random allocation (seed {s}), RPC", f"random{s}"), (f"random allocation (seed {s}), no RPC", f"random{s}-norpc")]
rows += [("uniform 2-bit, RPC 10%", "uniform2"), ("uniform 2-bit, no RPC", "uniform2-norpc")]
print("| configuration | bits/value | bits/value (total) | ppl | Δppl | KL (nats) | top-1 agree |")
print("|---|---|---|---|---|---|---|")
base = None
for label, name in rows:
    p = os.path.join(out, name + ".json")
    if not os.path.exists(p):
        continue
    r = json.load(open(p))
    base = base or r
    print(f"| {label} | {r['bits_per_value']:.3f} | {r['bits_per_value_total']:.3f} | {r['ppl']:.4f} | "
          f"{100 * r['ppl_relative_increase']:+.2f}% | {r['kl_mean']:.4f} | {r['top1_agreement']:.4f} |")
for suffix, label in (("", "RPC"), ("-norpc", "no RPC")):
    rs = [json.load(open(os.path.join(out, n + suffix + ".json"))) for n in ["random"] + [f"random{s}" for s in seeds]
          if os.path.exists(os.path.join(out, n + suffix + ".json"))]
    if len(rs) > 1:
        m = lambda k: sum(r[k] for r in rs) / len(rs)
        print(f"| random allocation, {label}: mean of {len(rs)} seeds | {m('bits_per_value'):.3f} | "
              f"{m('bits_per_value_total'):.3f} | {m('ppl'):.4f} | {100 * m('ppl_relative_increase'):+.2f}% | "
              f"{m('kl_mean'):.4f} | {m('top1_agreement'):.4f} |")
if base:
    print(f"\nuncompressed ppl {base['ppl_uncompressed']:.4f}; {base['tokens_evaluated']} held-out tokens in "
          f"{base['chunks']} chunks, each a {base['prefill']}-token prompt then single-token decoding steps.")
PY
