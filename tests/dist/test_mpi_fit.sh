#!/usr/bin/env bash
# kvcal fit and kvprof importance under mpirun on stories260K (oversubscribed on a small machine):
#   - 2 and 3 ranks write the plan of one process byte for byte (aqua, kivi, squat with both subspaces;
#     in memory and spilled; hidden states in f16), and kvprof importance gives the same scores and allocation;
#   - a rank killed (kill -9) once a checkpoint exists leaves no plan; the run started again, with
#     another number of ranks, resumes from the checkpoint and writes the uninterrupted plan;
#   - a failure on one rank only (its spill directory cannot be created: an MPMD launch gives rank 1
#     another directory) stops every rank with that rank's message, exit 1, and no plan.
#   test_mpi_fit.sh MPIRUN BIN_DIR HAVE_MPI       (exit 77 = skipped: no MPI, or no data)
set -u
mpirun="$1" bin="$2" have="$3"
if [ "$have" != "ON" ] || [ -z "$mpirun" ] || [ ! -x "$mpirun" ]; then
  echo "skipped: no MPI in this build"
  exit 77
fi
data="${KVCAL_DATA_DIR:-}"
if [ -z "$data" ] || [ ! -f "$data/stories260K/stories260K.bin" ]; then
  echo "skipped: no stories260K in KVCAL_DATA_DIR"
  exit 77
fi
source "$(dirname "$0")/mpi_env.sh"
kvcal="$bin/kvcal" kvprof="$bin/kvprof"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
head -c 120000 "$data/wikitext-2-raw/wiki.valid.raw" > "$tmp/corpus.txt"
export SOURCE_DATE_EPOCH=1700000000 KVCAL_GIT_HASH=0123456789abcdef0123456789abcdef01234567
export KVCAL_GRID_CACHE="$tmp/grids"
model="$data/stories260K/stories260K.bin"
# one thread per rank: the plan is the same bits for any rank count at a given thread count per rank
common=(--model "$model" --corpus "$tmp/corpus.txt" --seq-len 260 --max-tokens 8000 --set data.shard_seqs=3
        --set higgs.grid_samples=20000 --set higgs.grid_iters=20 -q -t 1)
fail=0
run() { "$mpirun" "${KV_MPIRUN_FLAGS[@]}" -np "$@"; }
same() { # same A B WHAT
  if cmp -s "$1" "$2"; then echo "ok: $3"; else echo "FAIL: $3: $1 and $2 differ"; fail=1; fi
}

# ---- the same plan from 1, 2 and 3 ranks ----
for variant in aqua kivi spill f16 squat squat-static; do
  extra=()
  case $variant in
    kivi) extra=(--method kivi) ;;
    squat) extra=(--method squat) ;;
    squat-static) extra=(--method squat --set squat.subspace=static --set "memory.spill_dir=$tmp/spill") ;;
    spill) extra=(--set "memory.spill_dir=$tmp/spill") ;;
    f16) extra=(--set memory.hidden_dtype=f16 --set memory.stream_weights=false) ;;
  esac
  "$kvcal" fit "${common[@]}" "${extra[@]}" --out "$tmp/$variant-1.kvplan" > "$tmp/$variant-1.txt" 2> "$tmp/err" \
    || { echo "FAIL: $variant: one process"; cat "$tmp/err"; fail=1; continue; }
  for np in 2 3; do
    if run $np "$kvcal" fit "${common[@]}" "${extra[@]}" --out "$tmp/$variant-$np.kvplan" > "$tmp/$variant-$np.txt" 2> "$tmp/err"; then
      same "$tmp/$variant-1.kvplan" "$tmp/$variant-$np.kvplan" "$variant: $np ranks == one process"
      grep -q "^ranks: $np;" "$tmp/$variant-$np.txt" || { echo "FAIL: $variant: the report does not say $np ranks"; fail=1; }
    else
      echo "FAIL: $variant: $np ranks"; cat "$tmp/err"; fail=1
    fi
  done
done
[ -e "$tmp/spill" ] && { echo "FAIL: the spill directory was left behind"; fail=1; }
# spilling does not change the fit (the configuration in the provenance differs, the layers do not)
if "$bin/kvrun" inspect "$tmp/aqua-1.kvplan" --json > "$tmp/a.json" && "$bin/kvrun" inspect "$tmp/spill-1.kvplan" --json > "$tmp/s.json" &&
   python3 - "$tmp/a.json" "$tmp/s.json" <<'PY'
import json, sys
# every section's CRC but the provenance's: the bytes of everything the runtime reads
a, b = ([(x["tag"], x["size"], x["crc32"]) for x in json.load(open(p))["format"]["sections"] if x["tag"] != "PROV"]
        for p in sys.argv[1:3])
sys.exit(0 if a == b and len(a) >= 4 else 1)
PY
then echo "ok: spilled plan == in-memory plan (every section but the provenance)"
else echo "FAIL: spilling changed the plan"; fail=1; fi

# ---- kvprof importance: same scores and allocation ----
imp=(importance --model "$model" --corpus "$tmp/corpus.txt" --prompts 7 --max-len 64 -t 1 -q --json)
"$kvprof" "${imp[@]}" --out "$tmp/imp-1.json" --config-out "$tmp/imp-1.yaml" > /dev/null 2>&1 || { echo "FAIL: importance, one process"; fail=1; }
for np in 2 3; do
  run $np "$kvprof" "${imp[@]}" --out "$tmp/imp-$np.json" --config-out "$tmp/imp-$np.yaml" > /dev/null 2> "$tmp/err" \
    || { echo "FAIL: importance, $np ranks"; cat "$tmp/err"; fail=1; }
  same "$tmp/imp-1.yaml" "$tmp/imp-$np.yaml" "importance: $np ranks, same allocation"
  if python3 - "$tmp/imp-1.json" "$tmp/imp-$np.json" <<'PY'
import json, sys
def strip(x):  # timings differ; everything else must not
    if isinstance(x, dict): return {k: strip(v) for k, v in x.items() if k != "timing" and "second" not in k}
    if isinstance(x, list): return [strip(v) for v in x]
    return x
a, b = (strip(json.load(open(p))) for p in sys.argv[1:3])
sys.exit(0 if a == b and a["per_prompt"] else 1)
PY
  then echo "ok: importance: $np ranks, same scores"; else echo "FAIL: importance: $np ranks, scores differ"; fail=1; fi
done

# ---- a rank killed mid-run: no plan; the rerun (3 ranks) resumes and writes the same plan ----
big=("${common[@]}" --max-tokens 16000)
"$kvcal" fit "${big[@]}" --out "$tmp/big-ref.kvplan" > /dev/null 2>&1 || { echo "FAIL: big reference run"; fail=1; }
run 2 "$kvcal" fit "${big[@]}" --out "$tmp/big.kvplan" > /dev/null 2>&1 &
launcher=$!
for _ in $(seq 1 1200); do
  [ -f "$tmp/big.kvplan.ckpt/manifest" ] && break
  kill -0 $launcher 2>/dev/null || break
  sleep 0.05
done
# The background job is a subshell whose child is mpirun; the ranks are mpirun's children. Kill a
# rank, not mpirun: mpirun killed leaves its ranks running on, orphaned, to finish the fit and remove
# the checkpoint while the rerun starts (which then, rightly, does not resume).
launcher_mpirun="$(ps -o pid= --ppid $launcher 2>/dev/null | head -n 1 | tr -d ' ')"
ranks="$( [ -n "$launcher_mpirun" ] && ps -o pid= --ppid "$launcher_mpirun" 2>/dev/null | tr -d ' ')"
victim="$(printf '%s\n' $ranks | tail -n 1)"
if [ -n "$victim" ] && kill -9 "$victim" 2>/dev/null; then
  wait $launcher 2>/dev/null
  # mpirun takes the other ranks down when one dies; the rerun must not race a survivor
  for pid in $ranks; do
    for _ in $(seq 1 600); do kill -0 "$pid" 2>/dev/null || break; sleep 0.05; done
    kill -0 "$pid" 2>/dev/null && { echo "FAIL: rank process $pid outlived the killed run"; fail=1; kill -9 "$pid"; }
  done
  echo "ok: killed rank process $victim (checkpoint after layer $(sed -n 's/^layer //p' "$tmp/big.kvplan.ckpt/manifest" 2>/dev/null))"
  [ -e "$tmp/big.kvplan" ] && { echo "FAIL: a run with a killed rank left a plan"; fail=1; }
  ls "$tmp" | grep -q '\.tmp\.' && { echo "FAIL: a temporary file was left behind"; fail=1; }
else
  wait $launcher
  echo "note: the run ended before a rank could be killed"
fi
if run 3 "$kvcal" fit "${big[@]}" --out "$tmp/big.kvplan" > "$tmp/resumed.txt" 2> "$tmp/err"; then
  same "$tmp/big-ref.kvplan" "$tmp/big.kvplan" "killed with 2 ranks, resumed with 3 == uninterrupted plan"
  if [ -n "$victim" ]; then
    grep -q "resumed from a checkpoint" "$tmp/resumed.txt" && echo "ok: the rerun resumed" \
      || { echo "FAIL: the rerun did not resume"; cat "$tmp/err"; fail=1; }
  fi
  [ -e "$tmp/big.kvplan.ckpt" ] && { echo "FAIL: checkpoint not removed"; fail=1; }
else
  echo "FAIL: rerun after the kill"; cat "$tmp/err"; fail=1
fi

# ---- one rank fails alone: every rank stops, rank 0 reports that rank's message ----
# MPMD launch: rank 1 alone gets a spill directory under a regular file, which cannot be created
mkdir -p "$tmp/ro" && touch "$tmp/ro/blocker"
if "$mpirun" "${KV_MPIRUN_FLAGS[@]}" -np 1 "$kvcal" fit "${common[@]}" --set "memory.spill_dir=$tmp/ok-spill" --out "$tmp/fail.kvplan" \
     : -np 1 "$kvcal" fit "${common[@]}" --set "memory.spill_dir=$tmp/ro/blocker/spill" --out "$tmp/fail.kvplan" \
     > /dev/null 2> "$tmp/err"; then
  echo "FAIL: a run with a failing rank succeeded"; fail=1
else
  grep -q "rank 1: creating the spill directory" "$tmp/err" && echo "ok: rank 1's failure stops every rank, rank 0 reports it" \
    || { echo "FAIL: unexpected message:"; cat "$tmp/err"; fail=1; }
fi
[ -e "$tmp/fail.kvplan" ] && { echo "FAIL: a failed run left a plan"; fail=1; }
exit $fail
