#!/usr/bin/env bash
# kvcal fit from the command line on stories260K: exit codes for bad input (2 = usage, 1 = runtime,
# each with a message naming the problem), a simulated kill (KVCAL_FIT_STOP_AFTER_LAYER) and a real
# kill -9 both resumed to the same plan bytes as an uninterrupted run, --json output.
#   test_fit_cli.sh KVCAL_BINARY       (data from $KVCAL_DATA_DIR; exit 77 = skipped)
set -u
kvcal="$1"
data="${KVCAL_DATA_DIR:-}"
if [ -z "$data" ] || [ ! -f "$data/stories260K/stories260K.bin" ]; then
  echo "skipped: no stories260K in KVCAL_DATA_DIR"
  exit 77
fi
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
head -c 60000 "$data/wikitext-2-raw/wiki.valid.raw" > "$tmp/corpus.txt"
printf 'a tiny corpus\n' > "$tmp/tiny.txt"
export SOURCE_DATE_EPOCH=1700000000 KVCAL_GIT_HASH=0123456789abcdef0123456789abcdef01234567
export KVCAL_GRID_CACHE="$tmp/grids"
model="$data/stories260K/stories260K.bin"
common=(--model "$model" --seq-len 260 --max-tokens 6000 --set higgs.grid_samples=20000 --set higgs.grid_iters=20 -q)
fail=0

# expect CODE PATTERN DESCRIPTION -- command...: exit code and a message matching PATTERN on stderr
expect() {
  local want="$1" pat="$2" what="$3"
  shift 4
  "$@" > "$tmp/out" 2> "$tmp/err"
  local got=$?
  if [ "$got" -ne "$want" ]; then
    echo "FAIL: $what: exit $got, expected $want"; cat "$tmp/err"; fail=1
  elif [ -n "$pat" ] && ! grep -q -- "$pat" "$tmp/err"; then
    echo "FAIL: $what: stderr does not match '$pat':"; cat "$tmp/err"; fail=1
  else
    echo "ok: $what"
  fi
}

# ---- usage errors (2) ----
expect 2 "bits must be 2, 3 or 4" "--bits 5" -- "$kvcal" fit "${common[@]}" --corpus "$tmp/corpus.txt" --out "$tmp/x" --bits 5
expect 2 "method must be" "--method bogus" -- "$kvcal" fit "${common[@]}" --corpus "$tmp/corpus.txt" --out "$tmp/x" --method bogus
expect 2 "missing required option --out" "no --out" -- "$kvcal" fit "${common[@]}" --corpus "$tmp/corpus.txt"
expect 2 "no corpus" "no corpus" -- "$kvcal" fit --model "$model" --out "$tmp/x"
expect 2 "seq-len" "--seq-len 1" -- "$kvcal" fit "${common[@]}" --corpus "$tmp/corpus.txt" --out "$tmp/x" --seq-len 1
# ---- runtime errors (1) ----
expect 1 "no-such-corpus" "missing corpus" -- "$kvcal" fit "${common[@]}" --corpus "$tmp/no-such-corpus.txt" --out "$tmp/x"
expect 1 "fewer than" "corpus shorter than one sequence" -- "$kvcal" fit "${common[@]}" --corpus "$tmp/tiny.txt" --out "$tmp/x"
expect 1 "no-such-model" "missing model" -- "$kvcal" fit --model "$tmp/no-such-model.bin" --corpus "$tmp/corpus.txt" --out "$tmp/x"
expect 1 "no.such" "unknown --set key" -- "$kvcal" fit "${common[@]}" --corpus "$tmp/corpus.txt" --out "$tmp/x" --set no.such=1
expect 1 "must divide cache.recent" "kivi groups not dividing the chunk" -- "$kvcal" fit "${common[@]}" --corpus "$tmp/corpus.txt" --out "$tmp/x" --method kivi --set keys.group_size=24
[ -e "$tmp/x" ] && { echo "FAIL: a failed run left a plan"; fail=1; }

# ---- resume after a simulated kill, byte-identical plan ----
for method in aqua kivi; do
  expect 0 "" "$method: uninterrupted" -- "$kvcal" fit "${common[@]}" --corpus "$tmp/corpus.txt" --out "$tmp/ref-$method.kvplan" --method $method
  KVCAL_FIT_STOP_AFTER_LAYER=2 expect 1 "stopped after layer 2" "$method: stop after layer 2" -- \
    "$kvcal" fit "${common[@]}" --corpus "$tmp/corpus.txt" --out "$tmp/res-$method.kvplan" --method $method
  [ -e "$tmp/res-$method.kvplan" ] && { echo "FAIL: $method: interrupted run left a plan"; fail=1; }
  [ -f "$tmp/res-$method.kvplan.ckpt/manifest" ] || { echo "FAIL: $method: no checkpoint manifest"; fail=1; }
  expect 0 "" "$method: resumed" -- "$kvcal" fit "${common[@]}" --corpus "$tmp/corpus.txt" --out "$tmp/res-$method.kvplan" --method $method
  [ -e "$tmp/res-$method.kvplan.ckpt" ] && { echo "FAIL: $method: checkpoint not removed"; fail=1; }
  if cmp -s "$tmp/ref-$method.kvplan" "$tmp/res-$method.kvplan"; then echo "ok: $method: resumed plan == uninterrupted plan"
  else echo "FAIL: $method: resumed plan differs"; fail=1; fi
done

# ---- a real kill -9 once a checkpoint exists ----
big=(--model "$model" --seq-len 260 --max-tokens 16000 --set higgs.grid_samples=20000 --set higgs.grid_iters=20 -q --method aqua)
"$kvcal" fit "${big[@]}" --corpus "$tmp/corpus.txt" --out "$tmp/big-ref.kvplan" > /dev/null 2>&1 || { echo "FAIL: big reference run"; fail=1; }
"$kvcal" fit "${big[@]}" --corpus "$tmp/corpus.txt" --out "$tmp/big.kvplan" > /dev/null 2>&1 &
pid=$!
for _ in $(seq 1 600); do
  [ -f "$tmp/big.kvplan.ckpt/manifest" ] && break
  kill -0 $pid 2>/dev/null || break
  sleep 0.05
done
if kill -9 $pid 2>/dev/null; then
  wait $pid 2>/dev/null
  [ -e "$tmp/big.kvplan" ] && { echo "FAIL: killed run left a plan"; fail=1; }
  echo "ok: killed the run (checkpoint: $(sed -n 's/^layer //p' "$tmp/big.kvplan.ckpt/manifest" 2>/dev/null))"
else
  wait $pid
  echo "note: the run ended before it could be killed"
fi
expect 0 "" "resume after kill -9" -- "$kvcal" fit "${big[@]}" --corpus "$tmp/corpus.txt" --out "$tmp/big.kvplan"
if cmp -s "$tmp/big-ref.kvplan" "$tmp/big.kvplan"; then echo "ok: plan after kill -9 and resume == uninterrupted plan"
else echo "FAIL: plan after kill -9 differs"; fail=1; fi

# ---- JSON report ----
expect 0 "" "--json" -- "$kvcal" fit "${common[@]}" --corpus "$tmp/corpus.txt" --out "$tmp/j.kvplan" --method higgs --bits 4 --json
if command -v python3 > /dev/null; then
  if python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); assert len(d["layers"])==5 and d["method"]=="higgs" and d["layers"][1]["k"]["quant_rel_err"] > 0' "$tmp/out"; then
    echo "ok: --json parses"
  else echo "FAIL: --json output:"; cat "$tmp/out"; fail=1; fi
fi
exit $fail
