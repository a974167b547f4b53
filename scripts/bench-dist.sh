#!/usr/bin/env bash
# kvcal fit beyond one process and one model's memory (BENCHMARKS.md, "Calibration with MPI ranks and
# layer-streamed weights"). A benchmark, not a test; every run prints the exact command behind it.
#   scripts/bench-dist.sh memory [TOKENS]   peak RSS against how the weights and the per-token state
#                                            are held (one process; 2 threads)
#   scripts/bench-dist.sh scale [TOKENS]    peak RSS at TOKENS and 4 x TOKENS, state in memory and spilled
#   scripts/bench-dist.sh ranks [TOKENS]    calibration time with 1, 2 and 3 ranks (1 thread each),
#                                            and 1 process with 2 threads, in turn, ROUNDS times
#   scripts/bench-dist.sh f16 [TOKENS]      the accuracy effect of f16 hidden states: the fit's held-out
#                                            errors and kvrun eval of both plans on the test split
# TOKENS: calibration tokens (default 16384). $ROUNDS (ranks, default 2), $EVAL_TOKENS (f16: tokens evaluated, default 16384).
# Needs a build with MPI (build/ or $KVCAL_BUILD), the default model and WikiText-2. HIGGS grids
# come from the grid cache ($KVCAL_GRID_CACHE; the first run on a machine generates them).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
what="${1:-}"
tokens="${2:-16384}"
build="${KVCAL_BUILD:-$here/build}"
kvcal="$build/tools/kvcal" kvrun="$build/tools/kvrun"
model="$here/data/cache/models/SmolLM2-135M-Instruct.Q4_1.gguf"
data="$(bash "$here/scripts/data-dir.sh")"
valid="$data/wikitext-2-raw/wiki.valid.raw" test_split="$data/wikitext-2-raw/wiki.test.raw"
out="${BENCH_OUT:-$(mktemp -d)}"
mkdir -p "$out"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export SOURCE_DATE_EPOCH="${SOURCE_DATE_EPOCH:-1700000000}" # plans of different runs comparable byte for byte
base=(fit --model "$model" --corpus "$valid" --max-tokens "$tokens" --no-checkpoint -q)
echo "bench-dist: $(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg), $(git -C "$here" rev-parse --short HEAD); output in $out" >&2

# run NAME CMD...: time it and print one line: wall time, CPU time (user + system, of every rank under
# mpirun), GNU time's peak RSS (the largest process; the report's peak RSS is the largest rank's)
run() {
  local name="$1"
  shift
  echo "\$ $*" >&2
  /usr/bin/time -f "%M %e %U %S" -o "$out/$name.time" "$@" > "$out/$name.txt" 2> "$out/$name.err" || {
    echo "bench-dist: $name failed:" >&2; cat "$out/$name.err" >&2; return 1; }
  local rss wall user sys
  read -r rss wall user sys < "$out/$name.time"
  local mem
  mem="$(grep '^memory:' "$out/$name.txt" | sed 's/^memory: //' || true)" # none with --json
  local t
  t="$(grep '^time:' "$out/$name.txt" | sed 's/^time: //' || true)"
  printf '%-34s wall %7.1f s cpu %7.1f s | maxrss %7.1f MiB | %s | %s\n' "$name" "$wall" "$(echo "$user+$sys" | bc -l)" \
    "$(echo "$rss/1024" | bc -l)" "$mem" "$t"
}

case "$what" in
  memory)
    run whole-f32 "$kvcal" "${base[@]}" -t 2 --out "$out/whole-f32.kvplan" --set memory.stream_weights=false \
      --set data.shard_seqs=8
    run whole-native "$kvcal" "${base[@]}" -t 2 --out "$out/whole-native.kvplan" --set memory.stream_weights=false \
      --set memory.weights=native --set data.shard_seqs=8
    run stream-f32 "$kvcal" "${base[@]}" -t 2 --out "$out/stream-f32.kvplan" --set data.shard_seqs=8
    run stream-f32-shard2 "$kvcal" "${base[@]}" -t 2 --out "$out/stream-f32-shard2.kvplan" --set data.shard_seqs=2
    run stream-native-shard2 "$kvcal" "${base[@]}" -t 2 --out "$out/stream-native-shard2.kvplan" --set data.shard_seqs=2 \
      --set memory.weights=native
    run stream-native-shard2-f16 "$kvcal" "${base[@]}" -t 2 --out "$out/stream-native-shard2-f16.kvplan" \
      --set data.shard_seqs=2 --set memory.weights=native --set memory.hidden_dtype=f16
    run stream-native-shard2-spill "$kvcal" "${base[@]}" -t 2 --out "$out/stream-native-shard2-spill.kvplan" \
      --set data.shard_seqs=2 --set memory.weights=native --set "memory.spill_dir=$out/spill"
    ;;
  scale)
    # the same two settings at TOKENS (default 16384) and 4 x TOKENS: the state held grows, the rest not
    for t in "$tokens" "$((4 * tokens))"; do
      b=(fit --model "$model" --corpus "$valid" --max-tokens "$t" --no-checkpoint -q -t 2 --set data.shard_seqs=2
         --set memory.weights=native)
      run "native-shard2-$t" "$kvcal" "${b[@]}" --out "$out/native-shard2-$t.kvplan"
      run "native-shard2-spill-$t" "$kvcal" "${b[@]}" --out "$out/native-shard2-spill-$t.kvplan" --set "memory.spill_dir=$out/spill"
    done
    ;;
  ranks)
    base+=(--set data.shard_seqs=2) # 8 shards at 16384 tokens: work for every rank
    for round in $(seq "${ROUNDS:-2}"); do
      run "r$round-np1-t1" "$kvcal" "${base[@]}" -t 1 --out "$out/np1.kvplan"
      run "r$round-np2-t1" mpirun --oversubscribe --bind-to none -np 2 "$kvcal" "${base[@]}" -t 1 --out "$out/np2.kvplan"
      run "r$round-np3-t1" mpirun --oversubscribe --bind-to none -np 3 "$kvcal" "${base[@]}" -t 1 --out "$out/np3.kvplan"
      run "r$round-np1-t2" "$kvcal" "${base[@]}" -t 2 --out "$out/np1t2.kvplan"
      cmp "$out/np1.kvplan" "$out/np2.kvplan" && cmp "$out/np1.kvplan" "$out/np3.kvplan" && echo "plans of 1, 2, 3 ranks: identical"
    done
    ;;
  f16)
    run f32-hidden "$kvcal" "${base[@]}" -t 2 --json --out "$out/f32.kvplan"
    run f16-hidden "$kvcal" "${base[@]}" -t 2 --json --out "$out/f16.kvplan" --set memory.hidden_dtype=f16
    python3 - "$out/f32-hidden.txt" "$out/f16-hidden.txt" <<'PY'
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
for st in ("k", "v"):
    da = [l[st]["quant_rel_err"] for l in a["layers"]]
    db = [l[st]["quant_rel_err"] for l in b["layers"]]
    rel = [abs(x - y) / x for x, y in zip(da, db)]
    print(f"{st.upper()} held-out total error, mean over layers: f32 hidden {sum(da)/len(da):.6g}, f16 hidden "
          f"{sum(db)/len(db):.6g}; per-layer relative change: max {max(rel):.3g}, mean {sum(rel)/len(rel):.3g}")
PY
    for p in f32 f16; do
      echo "\$ $kvrun eval --model $model --text $test_split --ctx 1024 --plan $out/$p.kvplan --max-tokens ${EVAL_TOKENS:-16384} -t 2 --json" >&2
      "$kvrun" eval --model "$model" --text "$test_split" --ctx 1024 --plan "$out/$p.kvplan" --max-tokens "${EVAL_TOKENS:-16384}" \
        -t 2 --json -q > "$out/eval-$p.json"
      python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(sys.argv[2], 'hidden: ppl %.4f (uncompressed %.4f), KL %.5f, top-1 %.4f' % (d['ppl'], d['ppl_uncompressed'], d['kl_mean'], d['top1_agreement']))" \
        "$out/eval-$p.json" "$p"
    done
    ;;
  *)
    sed -n '2,12p' "$0"
    exit 2
    ;;
esac
