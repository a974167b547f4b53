#!/usr/bin/env bash
# kvcal fit from the command line on stories260K: exit codes for bad input (2 = usage, 1 = runtime,
# each with a message naming the problem), outputs that are inputs or devices (made with mknod in the
# temporary directory), thread counts, refused configurations, SIGINT/SIGTERM during the grid
# generation, a simulated kill (KVCAL_FIT_STOP_AFTER_LAYER) and a real kill -9 both resumed to the
# same plan bytes as an uninterrupted run, --json output.
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
expect 2 "bits must be in 1..8 or 16" "--bits 12" -- "$kvcal" fit "${common[@]}" --corpus "$tmp/corpus.txt" --out "$tmp/x" --bits 12
expect 2 "bits must be in 1..8 or 16" "--bits 0" -- "$kvcal" fit "${common[@]}" --corpus "$tmp/corpus.txt" --out "$tmp/x" --bits 0
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

# ---- outputs and inputs checked before any work (issue 12) ----
# a copy of the model with its tokenizer, so that no test can ever write over the shared data
cp "$model" "$tmp/m.bin"; cp "$data/stories260K/tok512.bin" "$data/stories260K/tok512.model" "$tmp/"
mine=(--model "$tmp/m.bin" --seq-len 260 --max-tokens 6000 --set higgs.grid_samples=20000 --set higgs.grid_iters=20 -q)
ln "$tmp/corpus.txt" "$tmp/corpus-link.bin"
cp "$tmp/corpus.txt" "$tmp/corpus.orig"
expect 2 "same file as the model" "--out = the model" -- "$kvcal" fit "${mine[@]}" --corpus "$tmp/corpus.txt" --out "$tmp/m.bin"
expect 2 "same file as the corpus" "--out = the corpus under another name (hard link)" -- \
  "$kvcal" fit "${mine[@]}" --corpus "$tmp/corpus.txt" --out "$tmp/corpus-link.bin"
cmp -s "$tmp/corpus.txt" "$tmp/corpus.orig" || { echo "FAIL: the corpus was modified"; fail=1; }
cmp -s "$tmp/m.bin" "$model" || { echo "FAIL: the model was modified"; fail=1; }
printf 'method: kivi\n' > "$tmp/c.yaml"
expect 2 "same file as --config" "--out = the config" -- "$kvcal" fit "${mine[@]}" --corpus "$tmp/corpus.txt" --config "$tmp/c.yaml" --out "$tmp/c.yaml"
expect 2 "output path is empty" "--out ''" -- "$kvcal" fit "${mine[@]}" --corpus "$tmp/corpus.txt" --out ""
mkdir -p "$tmp/adir"
expect 2 "is a directory" "--out a directory" -- "$kvcal" fit "${mine[@]}" --corpus "$tmp/corpus.txt" --out "$tmp/adir"
expect 2 "does not exist" "--out in a missing directory" -- "$kvcal" fit "${mine[@]}" --corpus "$tmp/corpus.txt" --out "$tmp/nodir/p.kvplan"
ls -d "$tmp"/*.ckpt "$tmp"/adir.ckpt > /dev/null 2>&1 && { echo "FAIL: a refused run left a checkpoint"; fail=1; }
expect 2 "threads must be in" "-t 100000" -- "$kvcal" fit "${mine[@]}" --corpus "$tmp/corpus.txt" --out "$tmp/x" -t 100000
expect 2 "threads must be in" "-t 20000" -- "$kvcal" fit "${mine[@]}" --corpus "$tmp/corpus.txt" --out "$tmp/x" -t 20000
KVCAL_THREADS=abc expect 2 "KVCAL_THREADS 'abc'" "KVCAL_THREADS=abc" -- "$kvcal" fit "${mine[@]}" --corpus "$tmp/corpus.txt" --out "$tmp/x"
KVCAL_THREADS=100000 expect 2 "KVCAL_THREADS" "KVCAL_THREADS=100000" -- "$kvcal" fit "${mine[@]}" --corpus "$tmp/corpus.txt" --out "$tmp/x"
expect 1 "command line: key 'layers.77': the model has 5 layers" "--set layers.77.key_bits=4 on 5 layers" -- \
  "$kvcal" fit "${mine[@]}" --corpus "$tmp/corpus.txt" --out "$tmp/x" --set layers.77.key_bits=4
printf 'layers:\n  1:\n    key_bits: 3\n  999:\n    value_bits: 4\n' > "$tmp/layers.yaml"
expect 1 "layers.yaml:5:.*layers.999" "config layers: {999: ...}" -- "$kvcal" fit "${mine[@]}" --corpus "$tmp/corpus.txt" --out "$tmp/x" --config "$tmp/layers.yaml"
expect 1 "pruning.pool': must be 0 or odd" "pruning with an even pooling kernel" -- \
  "$kvcal" fit "${mine[@]}" --corpus "$tmp/corpus.txt" --out "$tmp/x" --set pruning.method=h2o --set pruning.budget=0.5 \
  --set pruning.pool=6
printf 'method: kivi\nvalues:\n  bits: 5\n' > "$tmp/bits5.yaml"
expect 1 "values.bits (.*bits5.yaml:3:9)" "a quantizer refusal names the key and the file" -- \
  "$kvcal" fit "${mine[@]}" --corpus "$tmp/corpus.txt" --out "$tmp/x" --config "$tmp/bits5.yaml"
truncate -s 17M "$tmp/huge.yaml"
expect 1 "larger than" "a 17 MB config" -- "$kvcal" fit "${mine[@]}" --corpus "$tmp/corpus.txt" --out "$tmp/x" --config "$tmp/huge.yaml"
[ -e "$tmp/x" ] && { echo "FAIL: a refused run left a plan"; fail=1; }
# device nodes made with mknod in the temporary directory (never the system's /dev)
if mknod "$tmp/null" c 1 3 2>/dev/null && mknod "$tmp/zero" c 1 5 2>/dev/null; then
  expect 0 "" "--out a null device" -- "$kvcal" fit "${mine[@]}" --corpus "$tmp/corpus.txt" --out "$tmp/null" --method kivi
  [ -c "$tmp/null" ] || { echo "FAIL: the device node was replaced"; fail=1; }
  [ -e "$tmp/null.ckpt" ] && { echo "FAIL: a checkpoint directory beside a device"; fail=1; }
  expect 1 "character device" "--corpus a zero device" -- timeout 60 "$kvcal" fit "${mine[@]}" --corpus "$tmp/zero" --out "$tmp/x"
  expect 1 "character device" "--config a zero device" -- timeout 60 "$kvcal" fit "${mine[@]}" --corpus "$tmp/corpus.txt" --config "$tmp/zero" --out "$tmp/x"
else
  echo "note: mknod not permitted here; device-node cases not run"
fi
# a context longer than the model's (512): a warning, not silence
expect 0 "longer than the 512 tokens" "--seq-len 1024 on a 512-token model warns" -- \
  "$kvcal" fit --model "$tmp/m.bin" --corpus "$tmp/corpus.txt" --out "$tmp/long.kvplan" --seq-len 1024 --max-tokens 3000 --method kivi
# methods without predictors print "ev -", never "ev nan"
if grep -q "ev nan" "$tmp/err" || ! grep -q "K ev - " "$tmp/err"; then echo "FAIL: ev for a method without predictors:"; grep "ev" "$tmp/err" | head -2; fail=1
else echo "ok: no 'ev nan'"; fi
# Ctrl-C (INT, and TERM) during the HIGGS grid generation stops it promptly, with the interrupt message
# Not "${mine[@]}": its -q would hide the message the signal waits for, and the kill would then come after
# a fixed 30 s, which a fast machine finishes the grid in. 100 iterations of 4M samples take minutes.
for sig in INT TERM; do
  # one file per signal: with a shared file, the wait below could read the INT run's message before the
  # background shell truncated the file for the TERM run (CI saw exactly that)
  err="$tmp/int-$sig.err"; rm -f "$err"
  KVCAL_GRID_CACHE= "$kvcal" fit --model "$tmp/m.bin" --seq-len 260 --max-tokens 6000 --corpus "$tmp/corpus.txt" \
    --out "$tmp/int.kvplan" --method higgs --bits 4 --set higgs.grid_samples=4000000 --set higgs.grid_iters=100 -v \
    > /dev/null 2> "$err" &
  pid=$!
  for _ in $(seq 1 600); do grep -q "generating a HIGGS grid" "$err" 2>/dev/null && break; sleep 0.05; done
  grep -q "generating a HIGGS grid" "$err" || { echo "FAIL: SIG$sig: no grid generation seen in 30 s"; fail=1; }
  sleep 0.5
  kill -$sig $pid
  t0=$(date +%s)
  for _ in $(seq 1 200); do kill -0 $pid 2>/dev/null || break; sleep 0.05; done
  if kill -0 $pid 2>/dev/null; then
    echo "FAIL: SIG$sig during grid generation: still running after 10 s"; kill -9 $pid; fail=1
  else
    wait $pid; rc=$?
    if [ $rc -eq 1 ] && grep -q "interrupted while generating the HIGGS grid" "$err"; then
      echo "ok: SIG$sig during grid generation stops within $(( $(date +%s) - t0 )) s"
    else echo "FAIL: SIG$sig during grid generation: exit $rc"; cat "$err"; fail=1; fi
  fi
  [ -e "$tmp/int.kvplan" ] && { echo "FAIL: an interrupted run left a plan"; fail=1; }
done

# ---- resume after a simulated kill, byte-identical plan ----
for method in aqua kivi squat; do
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
  # a plan path with a newline and a quote is escaped in the JSON, not dropped
  odd="$tmp/a
\"b.kvplan"
  expect 0 "" "--json with a newline in --out" -- "$kvcal" fit "${common[@]}" --corpus "$tmp/corpus.txt" --out "$odd" --method kivi --json
  if python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); assert d["plan"]==sys.argv[2], d["plan"]' "$tmp/out" "$odd"; then
    echo "ok: --json keeps the newline of the plan path"
  else echo "FAIL: --json plan path:"; cat "$tmp/out"; fail=1; fi
fi
exit $fail
