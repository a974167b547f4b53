#!/usr/bin/env bash
# The defects a hostile-input probe found (issue 32), each reproduced through the tools on stories260K:
# empty inputs end at once, results to a full stdout fail, fits sharing a spill directory stay apart,
# kvcal fit owns only its checkpoint files, kvcal search checks every input before any work, sizes
# beyond memory are refused up front, and the low-severity cases.
#   test_probe32.sh TOOLS_DIR   (data from $KVCAL_DATA_DIR; exit 77 = skipped)
bin="$1"
source "$(dirname "${BASH_SOURCE[0]}")/cli_test_lib.sh"
head -c 300000 "$calib" > "$tmp/corpus.txt"
: > "$tmp/empty.txt"
common=(--seq-len 260 --max-tokens 6000 -q)

# ---- 1: an empty text (file or pipe) ends at once with a message, in every tool ----
empty_case() { # WHAT -- command... (run with the empty file and through an empty pipe, 30 s at most)
  local what="$1"; shift 2
  timeout 30 "$@" > /dev/null 2> "$tmp/err"
  local rc=$?
  if [ $rc -eq 124 ]; then bad "$what: still running after 30 s on an empty input"
  elif [ $rc -ne 1 ]; then bad "$what: exit $rc on an empty input"; cat "$tmp/err"
  else ok "$what: empty input refused ($(tail -1 "$tmp/err" | cut -c1-80)...)"; fi
}
empty_case "kvrun eval" -- "$bin/kvrun" eval --model "$model" --text "$tmp/empty.txt" --ctx 64
empty_case "kvrun eval (pipe)" -- "$bin/kvrun" eval --model "$model" --text <(true) --ctx 64
empty_case "kvrun eval continuation" -- "$bin/kvrun" eval --model "$model" --protocol continuation --text "$tmp/empty.txt" \
  --prompt-len 64 --score-len 16
empty_case "kvrun eval passkey" -- "$bin/kvrun" eval --model "$model" --task passkey --filler "$tmp/empty.txt" --length 400
empty_case "kvcal fit" -- "$bin/kvcal" fit --model "$model" --corpus "$tmp/empty.txt" --out "$tmp/e.kvplan" --no-checkpoint -q
empty_case "kvrun bench --text" -- "$bin/kvrun" bench --model "$model" --context 64 --text "$tmp/empty.txt"
empty_case "kvprof budget" -- "$bin/kvprof" budget --model "$model" --corpus "$tmp/empty.txt"
empty_case "kvprof importance" -- "$bin/kvprof" importance --model "$model" --corpus "$tmp/empty.txt" --out "$tmp/e.yaml"

# ---- 12: results to a full stdout (/dev/full) fail with exit 1 ----
"$bin/kvcal" fit --model "$model" --corpus "$tmp/corpus.txt" "${common[@]}" --method fp8 --no-checkpoint --out "$tmp/fp8.kvplan" \
  > /dev/null 2>&1 || bad "fit fp8"
if [ -w /dev/full ]; then
  full_case() {
    local what="$1"; shift 2
    "$@" > /dev/full 2> "$tmp/err"
    local rc=$?
    if [ $rc -eq 1 ] && grep -q "standard output" "$tmp/err"; then ok "$what > /dev/full: exit 1"
    else bad "$what > /dev/full: exit $rc"; cat "$tmp/err"; fi
  }
  full_case "kvrun inspect --json" -- "$bin/kvrun" inspect --json "$tmp/fp8.kvplan"
  full_case "kvrun inspect" -- "$bin/kvrun" inspect "$tmp/fp8.kvplan"
  full_case "kvrun info" -- "$bin/kvrun" info --model "$model"
  full_case "kvrun eval --json" -- "$bin/kvrun" eval --model "$model" --text "$tmp/corpus.txt" --ctx 64 --max-tokens 128 --json
  full_case "kvcal --help" -- "$bin/kvcal" --help
else
  echo "note: no /dev/full here; the full-stdout cases not run"
fi

# ---- 3: two fits sharing memory.spill_dir at the same time give the plan of a fit alone ----
mkdir "$tmp/spill" && echo keep > "$tmp/spill/user.txt"
spill=(--model "$model" --corpus "$tmp/corpus.txt" "${common[@]}" --method kivi --no-checkpoint --set "memory.spill_dir=$tmp/spill")
"$bin/kvcal" fit "${spill[@]}" --out "$tmp/solo.kvplan" > /dev/null 2>&1 || bad "solo spilled fit"
"$bin/kvcal" fit "${spill[@]}" --out "$tmp/r1.kvplan" > /dev/null 2> "$tmp/r1.err" & p1=$!
"$bin/kvcal" fit "${spill[@]}" --out "$tmp/r2.kvplan" > /dev/null 2> "$tmp/r2.err" & p2=$!
wait $p1; rc1=$?; wait $p2; rc2=$?
if [ $rc1 -ne 0 ] || [ $rc2 -ne 0 ]; then bad "concurrent spilled fits: exit $rc1 / $rc2"; cat "$tmp/r1.err" "$tmp/r2.err"
else
  layers() { "$bin/kvrun" inspect --json "$1" | python3 -c "import json,sys; print(json.dumps(json.load(sys.stdin)['layers']))"; }
  solo="$(layers "$tmp/solo.kvplan")"
  [ "$solo" = "$(layers "$tmp/r1.kvplan")" ] && [ "$solo" = "$(layers "$tmp/r2.kvplan")" ] &&
    ok "two fits sharing a spill directory give the solo fit's plan" || bad "concurrent spilled fits differ from the solo fit"
fi
[ "$(ls "$tmp/spill")" = user.txt ] && ok "the spill directory keeps only the user's file" ||
  { bad "the spill directory after the fits: $(ls "$tmp/spill")"; }
"$bin/kvcal" fit "${spill[@]/$tmp\/spill/$tmp/newspill}" --out "$tmp/r3.kvplan" > /dev/null 2>&1 || bad "fit with a new spill dir"
[ ! -e "$tmp/newspill" ] && ok "a spill directory the fit created is removed" || bad "a created spill directory was left"

# ---- 9: kvcal fit owns only its checkpoint files; a directory it did not create is refused ----
fitc=(--model "$model" --corpus "$tmp/corpus.txt" "${common[@]}" --method kivi)
mkdir "$tmp/u.kvplan.ckpt"
for f in state.txt plan.notes report.pdf manifest.bak state.0.0.bin; do echo mine > "$tmp/u.kvplan.ckpt/$f"; done
expect 2 "was not made by kvcal fit" "kvcal fit refuses a checkpoint directory it did not create" -- \
  "$bin/kvcal" fit "${fitc[@]}" --out "$tmp/u.kvplan"
[ "$(ls "$tmp/u.kvplan.ckpt" | wc -l)" -eq 5 ] && [ ! -e "$tmp/u.kvplan" ] && ok "the user's files are untouched" ||
  bad "the user's checkpoint-like files were changed: $(ls "$tmp/u.kvplan.ckpt")"
mkdir "$tmp/elsewhere" && echo mine > "$tmp/elsewhere/state.1.0.bin" && ln -s "$tmp/elsewhere" "$tmp/l.kvplan.ckpt"
expect 2 "symbolic link" "kvcal fit refuses a symlinked checkpoint directory" -- "$bin/kvcal" fit "${fitc[@]}" --out "$tmp/l.kvplan"
[ -f "$tmp/elsewhere/state.1.0.bin" ] || bad "a file behind the symlink was removed"
# a checkpoint of its own, stopped after layer 1, with a user's file added: resumed, only ours removed
KVCAL_FIT_STOP_AFTER_LAYER=1 "$bin/kvcal" fit "${fitc[@]}" --out "$tmp/o.kvplan" > /dev/null 2>&1
[ -f "$tmp/o.kvplan.ckpt/kvcal-fit-checkpoint" ] && [ -f "$tmp/o.kvplan.ckpt/manifest" ] || bad "no checkpoint of its own"
echo mine > "$tmp/o.kvplan.ckpt/plan.notes"
expect 0 "" "kvcal fit resumes from its own checkpoint" -- "$bin/kvcal" fit "${fitc[@]}" --out "$tmp/o.kvplan"
[ "$(ls "$tmp/o.kvplan.ckpt" 2>&1)" = plan.notes ] && ok "only the fit's own checkpoint files were removed" ||
  bad "after the resumed fit the checkpoint directory holds: $(ls "$tmp/o.kvplan.ckpt" 2>&1)"
# low: a failed checkpoint save (the manifest cannot be written, as on a full disk) leaves no
# checkpoint without its manifest
mkdir -p "$tmp/f.kvplan.ckpt/manifest" && touch "$tmp/f.kvplan.ckpt/kvcal-fit-checkpoint"
expect 1 "manifest" "kvcal fit: a checkpoint that cannot be written fails" -- "$bin/kvcal" fit "${fitc[@]}" --out "$tmp/f.kvplan"
left="$(cd "$tmp/f.kvplan.ckpt" 2>/dev/null && ls | grep -E '^(state|plan|report)\.')"
[ -z "$left" ] && ok "no checkpoint files without a manifest" || bad "files without a manifest: $left"

# ---- 10: kvcal search checks every input before any work (and creates --out-dir only for its plans) ----
head -c 400 "$heldout" > "$tmp/ho400.txt"
srch=(--model "$model" --corpus "$tmp/corpus.txt" --budget-bits 8 --context 512 --candidates kivi2,kivi4 --fit-tokens 4096
      --prompts 0 -q)
t0=$(date +%s)
expect 1 "heldout '.*' has .* tokens, fewer than one validation chunk" "search: a 400-byte --heldout refused before the fits" -- \
  "$bin/kvcal" search "${srch[@]}" --heldout "$tmp/ho400.txt" --out "$tmp/s1.kvplan"
[ $(( $(date +%s) - t0 )) -le 5 ] || bad "search took $(( $(date +%s) - t0 )) s to refuse a short --heldout"
[ ! -e "$tmp/s1.kvplan" ] || bad "a refused search left a plan"
expect 1 "fewer than one validation chunk" "search --out-dir with a short --heldout" -- \
  "$bin/kvcal" search "${srch[@]}" --heldout "$tmp/ho400.txt" --out-dir "$tmp/sd/a/b"
[ ! -e "$tmp/sd" ] && ok "a refused search created no --out-dir" || bad "a refused search created --out-dir"
expect 2 "no existing directory\|is not writable\|is not a directory" "search --out-dir under a file" -- \
  "$bin/kvcal" search "${srch[@]}" --heldout "$heldout" --out-dir "$tmp/ho400.txt/x"
for o in "--fit-tokens 99999999999999" "--select-chunks 9223372036854775807" "--sens-samples 4611686018427387904" \
         "--eval-chunks 9223372036854775807"; do
  # shellcheck disable=SC2086
  expect 2 "must be at most" "search $o refused as a usage error" -- "$bin/kvcal" search "${srch[@]}" $o --heldout "$heldout" \
    --out "$tmp/s2.kvplan"
done
long="$(printf 'kivi2,%.0s' $(seq 1 200))kivi4"
expect 2 "more than the 1023" "search --candidates longer than its buffer is refused, not cut" -- \
  "$bin/kvcal" search "${srch[@]}" --candidates "$long" --heldout "$heldout" --out "$tmp/s2.kvplan"
# low: --pruned with every point infeasible: exit 1, not 0 with no plan
expect 1 "no point got a plan" "search --pruned with every budget infeasible" -- "$bin/kvcal" search --model "$model" \
  --corpus "$tmp/corpus.txt" --heldout "$heldout" --budget-bits 0.01,0.02 --context 512 --candidates kivi2 --fit-tokens 4096 \
  --prompts 0 --pruned kivi2@h2o0.5 --out-dir "$tmp/sp" -q
smollm="${KVCAL_DEFAULT_MODEL:-}"
if [ -n "$smollm" ] && [ -f "$smollm" ]; then # --context against the model: the validation's memory, before the fits
  for i in 1 2 3 4 5; do cat "$heldout"; done > "$tmp/ho-long.txt"
  t0=$(date +%s)
  expect 1 "needs about .* GiB of memory" "search --context 1048576 on SmolLM2 refused before the fits" -- "$bin/kvcal" search \
    --model "$smollm" --corpus "$calib" --heldout "$tmp/ho-long.txt" --budget-bits 8 --context 1048576 --select-chunks 0 \
    --eval-chunks 1 --out "$tmp/s3.kvplan" -q
  [ $(( $(date +%s) - t0 )) -le 120 ] || bad "search took $(( $(date +%s) - t0 )) s to refuse --context 1048576"
fi

# ---- 11: sizes beyond memory refused up front, with the estimate (and ordinary sizes still run) ----
expect 0 "decode_tokens_per_second" "kvrun bench at an ordinary size runs" -- "$bin/kvrun" bench --model "$model" --context 256 \
  --decode 2 --batch 2
expect 1 "needs about .* GiB of memory" "kvrun bench --batch 4096 --context 2^22 refused" -- \
  "$bin/kvrun" bench --model "$model" --context 4194304 --batch 4096 --decode 1
expect 1 "needs about .* GiB of memory" "kvrun bench --context 2^22 --prefill-chunk 0 --cache f32 x 64 refused" -- \
  "$bin/kvrun" bench --model "$model" --context 4194304 --batch 64 --prefill-chunk 0 --cache f32 --decode 1
mem_gib=$(awk '/MemTotal/ {print int($2 / 1048576)}' /proc/meminfo)
if [ "$mem_gib" -lt 60 ]; then
  expect 1 "needs about 64.0 GiB of memory" "kvcal grids --samples 2^31 --dim 8 refused" -- \
    "$bin/kvcal" grids --dim 8 --size 256 --samples 2147483648 --out "$tmp/g.grid"
  [ ! -e "$tmp/g.grid" ] || bad "a refused grids left a file"
fi

# ---- low: a cached HIGGS grid with valid CRCs but degenerate points is checked (its MSE) and regenerated ----
export KVCAL_GRID_CACHE="$tmp/grids"
higgs=(--model "$model" --corpus "$tmp/corpus.txt" --seq-len 260 --max-tokens 6000 --method higgs --bits 2 --no-checkpoint
       --set higgs.grid_samples=65536 --set higgs.grid_iters=30)
"$bin/kvcal" fit "${higgs[@]}" --out "$tmp/h1.kvplan" > /dev/null 2>&1 || bad "higgs fit"
g="$(ls "$KVCAL_GRID_CACHE"/*.grid 2>/dev/null | head -1)"
if [ -n "$g" ]; then
  python3 - "$g" <<'PY'
import struct, sys, zlib
p = sys.argv[1]; b = bytearray(open(p, "rb").read())
h = struct.unpack_from("<I", b, 12)[0]  # header size (calib/GRID_FORMAT.md)
n_pts = (len(b) - h) // 4
b[h:] = struct.pack(f"<{n_pts}f", *([0.001] * n_pts))  # every point at the origin: a valid file, not a grid
struct.pack_into("<I", b, 40, zlib.crc32(bytes(b[h:])) & 0xffffffff)
struct.pack_into("<I", b, 44, zlib.crc32(bytes(b[:44])) & 0xffffffff)
open(p, "wb").write(bytes(b))
PY
  "$bin/kvcal" fit "${higgs[@]}" --out "$tmp/h2.kvplan" > /dev/null 2> "$tmp/h2.err" || bad "higgs fit with a degenerate cache"
  grep -q "is degenerate" "$tmp/h2.err" && ok "a degenerate cached grid is detected" || { bad "a degenerate cached grid was used"; tail -3 "$tmp/h2.err"; }
  layers() { "$bin/kvrun" inspect --json "$1" | python3 -c "import json,sys; d=json.load(sys.stdin); print(json.dumps(d['layers']), json.dumps(d.get('grids')))"; }
  [ "$(layers "$tmp/h1.kvplan")" = "$(layers "$tmp/h2.kvplan")" ] && ok "the regenerated grid gives the same plan" ||
    bad "the plan after a degenerate cached grid differs"
else
  bad "no cached grid in $KVCAL_GRID_CACHE"
fi
unset KVCAL_GRID_CACHE

# ---- low: --bits 2.5, narrowing and overflow of counts, the 'nothing was compressed' cause ----
expect 2 "token precisions are whole numbers" "kvprof budget --bits 2.5 refused" -- \
  "$bin/kvprof" budget --model "$model" --corpus "$tmp/corpus.txt" --bits 2.5
for o in "--prompt-len 9223372036854775807 --score-len 9223372036854775807" "--passkey-length 9223372036854775744" \
         "--samples 9223372036854775807" "--prompt-len 4294967298"; do
  # shellcheck disable=SC2086
  expect 2 "" "kvprof budget $o refused" -- "$bin/kvprof" budget --model "$model" --corpus "$tmp/corpus.txt" $o
done
for o in "--prompt-len 9223372036854775807 --score-len 9223372036854775807" "--prompt-len 64 --score-len 16 --step 4294967297" \
         "--prompt-len 64 --score-len 16 --samples 9223372036854775807" "--prompt-len 4294967298 --score-len 1"; do
  # shellcheck disable=SC2086
  expect 2 "" "kvrun eval continuation $o refused" -- "$bin/kvrun" eval --model "$model" --protocol continuation \
    --text "$tmp/corpus.txt" $o
done
expect 2 "" "kvrun eval --step 4294967297 refused" -- "$bin/kvrun" eval --model "$model" --text "$tmp/corpus.txt" --ctx 256 \
  --step 4294967297
"$bin/kvcal" fit --model "$model" --corpus "$tmp/corpus.txt" "${common[@]}" --method kivi --no-checkpoint --out "$tmp/k.kvplan" \
  > /dev/null 2>&1 || bad "kivi fit"
expect 0 "went in as one prompt step" "kvrun eval --prefill = --ctx names the cause" -- "$bin/kvrun" eval --model "$model" \
  --text "$tmp/corpus.txt" --ctx 256 --prefill 256 --plan "$tmp/k.kvplan" --max-tokens 600
expect 0 "never fill the 4 sinks" "kvrun eval with short chunks names that cause" -- "$bin/kvrun" eval --model "$model" \
  --text "$tmp/corpus.txt" --ctx 100 --plan "$tmp/k.kvplan" --max-tokens 600
exit $fail
