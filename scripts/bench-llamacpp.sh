#!/usr/bin/env bash
# kvcal's compressed caches against llama.cpp's own KV cache types on the same GGUF (BENCHMARKS.md and RESULTS.md,
# "Against llama.cpp's KV cache types"): decode speed after a prompt of N tokens, and quality in the prompt + decode
# regime, side by side. A benchmark, not a test.
#   scripts/bench-llamacpp.sh [--model GGUF] [--threads T] [--contexts "2048 8192"] [--decode K]
#                             [--quality-contexts "2048 8192"] [--score-len M] [--samples "4 1"]
#                             [--plans DIR] [--configs "kivi-2 ..."] [--types "f16 q8_0 ..."] [--out DIR]
#                             [--no-speed] [--no-quality] [--llamacpp-speed]
# Speed: `kvrun bench` (this engine's f16 cache and each plan: a prompt of N seeded random tokens, then K greedy
# decoding steps, batch 1); llama.cpp's decode speed comes from the quality runs' decoding steps (the same prompt +
# decode regime: one llama_decode per token, as greedy decoding does; with --llamacpp-speed also from
# tests/bench/bench_llamacpp_kv.py's random prompt, which costs another prefill per type); ratios against each
# engine's own f16 cache in the same run. Quality: `kvrun eval --protocol continuation
# --step 1` (a prompt of N tokens of wiki.test.raw prefilled and compressed, the next M tokens decoded one at a time
# and scored; KL against the exact model) and tests/bench/bench_llamacpp_quality.py (the same samples through each
# llama.cpp type; KL against its f16 cache), S samples per context (one count per quality context).
# Plans are fitted into DIR (default data/cache/bench-plans) when missing, on 4096 calibration tokens of
# wiki.valid.raw. llama.cpp: llama-cpp-python in $KVCAL_REF_PYTHON (default .venv-ref/bin/python), run with
# GOMP_SPINCOUNT=1000 (its libgomp threads spin 300000 times at every barrier otherwise, which on a shared machine
# collapses its speed: BENCHMARKS.md "Reference model"). Prints a markdown table per context; JSON lines in OUT
# (default DIR/llamacpp): speed.jsonl, quality.jsonl.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
model="$here/data/cache/models/SmolLM2-135M-Instruct.Q4_1.gguf"
threads=2 contexts="2048 8192" decode=32 qcontexts="2048 8192" score=128 samples="4 1"
plans="$here/data/cache/bench-plans" out="" speed=1 quality=1 llama_speed=0
configs="kivi-2 kivi-4 higgs-2 higgs-4 fp8 nvfp4 aqua-2"
types="f16 q8_0 q4_0 q4_1 iq4_nl"
while [ $# -gt 0 ]; do
  case "$1" in
    --model) model="$2"; shift 2 ;;
    --threads) threads="$2"; shift 2 ;;
    --contexts) contexts="$2"; shift 2 ;;
    --decode) decode="$2"; shift 2 ;;
    --quality-contexts) qcontexts="$2"; shift 2 ;;
    --score-len) score="$2"; shift 2 ;;
    --samples) samples="$2"; shift 2 ;;
    --plans) plans="$2"; shift 2 ;;
    --configs) configs="$2"; shift 2 ;;
    --types) types="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    --no-speed) speed=0; shift ;;
    --no-quality) quality=0; shift ;;
    --llamacpp-speed) llama_speed=1; shift ;;
    -h|--help) sed -n '2,19p' "$0"; exit 0 ;;
    *) echo "bench-llamacpp: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
build="${KVCAL_BUILD:-$here/build}"
py="${KVCAL_REF_PYTHON:-$here/.venv-ref/bin/python}"
data="$(bash "$here/scripts/data-dir.sh")"
out="${out:-$plans/llamacpp}"
[ -x "$build/tools/kvrun" ] || { echo "bench-llamacpp: $build/tools/kvrun not built (scripts/build.sh)" >&2; exit 1; }
[ -f "$model" ] || { echo "bench-llamacpp: model $model not found (scripts/fetch-model.sh)" >&2; exit 1; }
"$py" -c "import llama_cpp" 2>/dev/null || { echo "bench-llamacpp: $py has no llama_cpp (llama-cpp-python)" >&2; exit 1; }
mkdir -p "$plans" "$out"
calib="$data/wikitext-2-raw/wiki.valid.raw" text="$data/wikitext-2-raw/wiki.test.raw"
fit() { # name method [extra...]
  local name="$1" method="$2"; shift 2
  [ -f "$plans/$name.kvplan" ] && return 0
  echo "bench-llamacpp: fitting $name" >&2
  "$build/tools/kvcal" fit -q --model "$model" --corpus "$calib" --method "$method" --seq-len 512 --max-tokens 4096 \
    --no-checkpoint --out "$plans/$name.kvplan" "$@" > /dev/null
}
for c in $configs; do
  case "$c" in
    kivi-[0-9]) fit "$c" kivi --bits "${c#kivi-}" ;;
    higgs-[0-9]) fit "$c" higgs --bits "${c#higgs-}" ;;
    higgs-[0-9]p) b="${c#higgs-}"; fit "$c" higgs --bits "${b%p}" --set cache.pre_rope=false ;;
    aqua-[0-9]) fit "$c" aqua --bits "${c#aqua-}" ;;
    aqua-[0-9]r32) b="${c#aqua-}"; fit "$c" aqua --bits "${b%r32}" --set aqua.rank=32 ;;
    fp8) fit fp8 fp8 ;;
    nvfp4) fit nvfp4 nvfp4 ;;
    *) [ -f "$plans/$c.kvplan" ] || { echo "bench-llamacpp: no plan $plans/$c.kvplan and no recipe for '$c'" >&2; exit 2; } ;;
  esac
done
export GOMP_SPINCOUNT=1000
echo "bench-llamacpp: $(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg), $(date -u +%F); $model; threads $threads" >&2
if [ "$speed" = 1 ]; then
  : > "$out/speed.jsonl"
  for ctx in $contexts; do
    for c in f16 $configs; do
      if [ "$c" = f16 ]; then args=(--cache f16); else args=(--plan "$plans/$c.kvplan"); fi
      "$build/tools/kvrun" bench -q --model "$model" "${args[@]}" --context "$ctx" --decode "$decode" -t "$threads" --json \
        | sed "s/^{/{\"engine\": \"kvcal\", \"config\": \"$c\", \"load\": \"$(cut -d' ' -f1 /proc/loadavg)\", /" >> "$out/speed.jsonl"
    done
    for t in $types; do
      [ "$llama_speed" = 1 ] || break
      "$py" "$here/tests/bench/bench_llamacpp_kv.py" "$model" --context "$ctx" --decode "$decode" --threads "$threads" \
        --type-k "$t" --type-v "$t" --flash-attn \
        | sed "s/^{/{\"config\": \"$t\", \"load\": \"$(cut -d' ' -f1 /proc/loadavg)\", /" >> "$out/speed.jsonl"
    done
  done
fi
if [ "$quality" = 1 ]; then
  : > "$out/quality.jsonl"
  set -- $samples
  for ctx in $qcontexts; do
    s="${1:-2}"; [ $# -gt 1 ] && shift
    for c in exact $configs; do
      if [ "$c" = exact ]; then args=(); else args=(--plan "$plans/$c.kvplan" --step 1); fi
      "$build/tools/kvrun" eval -q --model "$model" --protocol continuation --text "$text" --prompt-len "$ctx" \
        --score-len "$score" --samples "$s" -t "$threads" --json "${args[@]}" \
        | sed "s/^{/{\"engine\": \"kvcal\", \"config\": \"$c\", /" >> "$out/quality.jsonl"
    done
    "$py" "$here/tests/bench/bench_llamacpp_quality.py" "$model" "$text" --prompt-len "$ctx" --score-len "$score" \
      --samples "$s" --threads "$threads" --types "$(echo $types | tr ' ' ,)" --flash-attn \
      | sed "s/^{/{\"config\": \"llama.cpp\", /" >> "$out/quality.jsonl"
  done
fi
python3 - "$out" <<'PY'
import json, os, sys
out = sys.argv[1]
def rows(name):
    p = os.path.join(out, name)
    return [json.loads(l) for l in open(p)] if os.path.exists(p) else []
sp, qu = rows("speed.jsonl"), rows("quality.jsonl")
LLAMA_BITS = {"f16": 16.0, "q8_0": 8.5, "q4_0": 4.5, "q4_1": 5.0, "iq4_nl": 4.5}
ctxs = sorted({r["context"] for r in sp} | {r["prompt_len"] for r in qu})
for c in ctxs:
    print(f"\n#### {c} tokens of context\n")
    print("| engine | cache | bits/value | decode tok/s (vs its f16) | ppl (its reference's) | KL vs its reference | top-1 vs its reference |")
    print("|---|---|---|---|---|---|---|")
    def speed(eng, cfg):
        for r in sp:
            if r["context"] == c and r["config"] == cfg and (r.get("engine") == "kvcal") == (eng == "kvcal"):
                return r["decode_tokens_per_second"]
        if eng != "kvcal":  # the quality run's decoding steps (teacher-forced: the cost of greedy decoding)
            for r in qu:
                if r.get("config") == "llama.cpp" and r["prompt_len"] == c and r["cache"] == cfg:
                    return r["decode_tokens_per_second"]
        return None
    def cell(eng, cfg):
        t, f = speed(eng, cfg), speed(eng, "f16")
        return "-" if t is None else (f"{t:.2f} ({t / f:.2f}x)" if f else f"{t:.2f}")
    ref = next((r for r in qu if r.get("engine") == "kvcal" and r["config"] == "exact" and r["prompt_len"] == c), None)
    names = ["f16"] + [r["config"] for r in qu if r.get("engine") == "kvcal" and r["prompt_len"] == c and r["config"] != "exact"]
    for r in sp:
        if r.get("engine") == "kvcal" and r["context"] == c and r["config"] not in names:
            names.append(r["config"])
    for n in names:
        q = next((r for r in qu if r.get("engine") == "kvcal" and r["prompt_len"] == c and r["config"] == n), None)
        b = next((r for r in sp if r.get("engine") == "kvcal" and r["context"] == c and r["config"] == n), None)
        bits = (b or {}).get("bits_per_value_total") or (q or {}).get("bits_per_value") or (16.0 if n == "f16" else 0)
        if q:
            qs = f"{q['ppl']:.3f} ({q['ppl_uncompressed']:.3f}) | {q['kl_mean']:.4f} | {q['top1_agreement']:.4f}"
        elif n == "f16" and ref:
            qs = f"{ref['ppl_uncompressed']:.3f} (exact) | - | -"
        else:
            qs = "- | - | -"
        print(f"| kvcal | {n} | {bits:.2f} | {cell('kvcal', n)} | {qs} |")
    for r in qu:
        if r.get("config") == "llama.cpp" and r["prompt_len"] == c:
            f = next((x for x in qu if x.get("config") == "llama.cpp" and x["prompt_len"] == c and x["cache"] == "f16"), None)
            print(f"| llama.cpp | {r['cache']} | {LLAMA_BITS[r['cache']]:.2f} | {cell('llama.cpp', r['cache'])} | "
                  f"{r['ppl']:.3f} ({f['ppl'] if f else float('nan'):.3f}) | {r['kl_mean_vs_f16']:.4f} | {r['top1_vs_f16']:.4f} |")
    n_q = next((r.get("samples") for r in qu if r["prompt_len"] == c), 0)
    if n_q:
        sc = next(r["score_len"] for r in qu if r["prompt_len"] == c)
        print(f"\nquality: {n_q} sample(s) of a {c}-token prompt, {sc} tokens decoded one at a time and scored")
loads = sorted({r.get("load", "?") for r in sp})
if loads:
    print("load average (1 min) at the start of each speed run: " + ", ".join(loads))
PY
