#!/usr/bin/env bash
# kvcal fit on SmolLM2-135M (GGUF, 30 layers) under mpirun at a small token budget: 2 and 3 ranks
# write the plan of one process byte for byte with layer-streamed weights (f32, the default), 3 ranks
# with the file's quantized blocks (memory.weights: native); and the whole model held (no
# streaming) gives the same plan as streamed weights. The sanitizer build (SANITIZE = ON, ~10x
# slower) checks 1 against 3 ranks only.
#   test_mpi_smollm.sh MPIRUN BIN_DIR HAVE_MPI SANITIZE   (exit 77 = skipped: no MPI, model or data)
set -u
mpirun="$1" bin="$2" have="$3" sanitize="${4:-OFF}"
if [ "$have" != "ON" ] || [ -z "$mpirun" ] || [ ! -x "$mpirun" ]; then
  echo "skipped: no MPI in this build"
  exit 77
fi
model="${KVCAL_DEFAULT_MODEL:-}"
data="${KVCAL_DATA_DIR:-}"
if [ -z "$model" ] || [ ! -f "$model" ]; then echo "skipped: no SmolLM2 model at KVCAL_DEFAULT_MODEL"; exit 77; fi
if [ -z "$data" ] || [ ! -f "$data/wikitext-2-raw/wiki.valid.raw" ]; then echo "skipped: no WikiText-2"; exit 77; fi
source "$(dirname "$0")/mpi_env.sh"
kvcal="$bin/kvcal"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
head -c 40000 "$data/wikitext-2-raw/wiki.valid.raw" > "$tmp/corpus.txt"
export SOURCE_DATE_EPOCH=1700000000 KVCAL_GIT_HASH=0123456789abcdef0123456789abcdef01234567
export KVCAL_GRID_CACHE="$tmp/grids"
# 6 sequences of 260 tokens (one held out) in 3 shards of 2: CI stays fast
common=(--model "$model" --corpus "$tmp/corpus.txt" --seq-len 260 --max-tokens 1560 --set data.shard_seqs=2
        --set higgs.grid_samples=20000 --set higgs.grid_iters=20 -q -t 1 --no-checkpoint)
fail=0
same() {
  if cmp -s "$1" "$2"; then echo "ok: $3"; else echo "FAIL: $3: $1 and $2 differ"; fail=1; fi
}
runs=("f32 2 3" "native 3")
[ "$sanitize" = "ON" ] && runs=("f32 3")
for r in "${runs[@]}"; do
  read -r weights nps <<< "$r"
  extra=(--set "memory.weights=$weights")
  "$kvcal" fit "${common[@]}" "${extra[@]}" --out "$tmp/$weights-1.kvplan" > "$tmp/$weights-1.txt" 2> "$tmp/err" \
    || { echo "FAIL: $weights: one process"; cat "$tmp/err"; fail=1; continue; }
  for np in $nps; do
    if "$mpirun" "${KV_MPIRUN_FLAGS[@]}" -np $np "$kvcal" fit "${common[@]}" "${extra[@]}" --out "$tmp/$weights-$np.kvplan" \
         > /dev/null 2> "$tmp/err"; then
      same "$tmp/$weights-1.kvplan" "$tmp/$weights-$np.kvplan" "$weights weights: $np ranks == one process"
    else
      echo "FAIL: $weights: $np ranks"; cat "$tmp/err"; fail=1
    fi
  done
done
grep -q "one layer at a time" "$tmp/f32-1.txt" || { echo "FAIL: the report does not say the weights were streamed"; fail=1; }
[ "$sanitize" = "ON" ] && exit $fail
# the whole model held: the same plan (the configuration in the provenance differs: compare the rest)
"$kvcal" fit "${common[@]}" --set memory.stream_weights=false --out "$tmp/whole.kvplan" > /dev/null 2> "$tmp/err" \
  || { echo "FAIL: whole model"; cat "$tmp/err"; fail=1; }
if "$bin/kvrun" inspect "$tmp/f32-1.kvplan" --json > "$tmp/a.json" && "$bin/kvrun" inspect "$tmp/whole.kvplan" --json > "$tmp/b.json" &&
   python3 - "$tmp/a.json" "$tmp/b.json" <<'PY'
import json, sys
a, b = ([(x["tag"], x["size"], x["crc32"]) for x in json.load(open(p))["format"]["sections"] if x["tag"] != "PROV"]
        for p in sys.argv[1:3])
sys.exit(0 if a == b and len(a) >= 4 else 1)
PY
then echo "ok: streamed weights == whole model (every section but the provenance)"
else echo "FAIL: streaming the weights changed the plan"; fail=1; fi
exit $fail
