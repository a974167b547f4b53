#!/usr/bin/env bash
# kvrun generate on stories260K: greedy from BOS prints llama2.c's published sample (the tokenizer
# found beside the checkpoint, and given explicitly); sampling is reproducible for a seed; usage errors
# exit 2. Exit 77 (skipped) without the data.
set -u
bin="$1"
data="${KVCAL_DATA_DIR:-}"
model="$data/stories260K/stories260K.bin"
[ -n "$data" ] && [ -f "$model" ] || { echo "stories260K not found: skipped"; exit 77; }
fail=0
want="Once upon a time, there was a little girl named Lily. She loved to play outside in the park. One day, she saw a big, red ball."
out=$("$bin/kvrun" generate -m "$model" -n 100 -q) || { echo "FAIL: generate exited $?"; fail=1; }
case "$out" in
  "$want"*) echo "ok: greedy from BOS" ;;
  *) echo "FAIL: greedy output: $out"; fail=1 ;;
esac
out2=$("$bin/kvrun" generate -m "$model" --tokenizer "$data/stories260K/tok512.bin" -n 100 -q -t 1)
[ "$out2" = "$out" ] && echo "ok: explicit tokenizer, 1 thread" || { echo "FAIL: explicit tokenizer output differs: $out2"; fail=1; }
s1=$("$bin/kvrun" generate -m "$model" -p "Tom had a dog" -n 60 --temp 0.9 --seed 7 -q)
s2=$("$bin/kvrun" generate -m "$model" -p "Tom had a dog" -n 60 --temp 0.9 --seed 7 -q)
[ "$s1" = "$s2" ] && echo "ok: sampling reproducible" || { echo "FAIL: sampling differs between runs"; fail=1; }
case "$s1" in "Tom had a dog"*) echo "ok: prompt echoed" ;; *) echo "FAIL: prompt not echoed: $s1"; fail=1 ;; esac
"$bin/kvrun" generate -m "$model" --temp -1 >/dev/null 2>&1; rc=$?
[ "$rc" -eq 2 ] && echo "ok: bad --temp is a usage error" || { echo "FAIL: --temp -1 exited $rc"; fail=1; }
"$bin/kvrun" generate -m "$data/stories260K/tok512.model" -n 5 >/dev/null 2>&1; rc=$?
[ "$rc" -eq 1 ] && echo "ok: not a model exits 1" || { echo "FAIL: not a model exited $rc"; fail=1; }
exit $fail
