#!/usr/bin/env bash
# kvrun inspect end to end: YAML/JSON dumps of the golden plan, --check against real models
# (match, another model, a model whose K weights changed by one byte), errors and usage.
# Needs stories260K (exit 77 without it). Args: KVRUN PLAN_FOR_MODEL GOLDEN
set -u
kvrun="$1"; make_plan="$2"; golden="$3"
data="${KVCAL_DATA_DIR:-}"
stories="$data/stories260K/stories260K.bin"
[ -n "$data" ] && [ -f "$stories" ] || { echo "stories260K not available: skipped"; exit 77; }
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
fail=0
expect() { # CODE PATTERN DESCRIPTION -- command...
  local want="$1" pat="$2" what="$3"; shift 4
  "$@" >"$tmp/out" 2>&1; local got=$?
  if [ "$got" -ne "$want" ]; then echo "FAIL: $what: exit $got, expected $want"; sed 's/^/  | /' "$tmp/out" | head -20; fail=1; return; fi
  if [ -n "$pat" ] && ! grep -q -- "$pat" "$tmp/out"; then echo "FAIL: $what: output lacks '$pat'"; sed 's/^/  | /' "$tmp/out" | head -20; fail=1; return; fi
  echo "ok: $what"
}
expect 0 "prune_method: snapkv" "YAML dump of the golden plan" -- "$kvrun" inspect "$golden"
expect 0 "inputs: \[L0.V, L1.K\]" "YAML per-layer table" -- "$kvrun" inspect "$golden"
expect 0 '"n_layers": 3' "JSON dump" -- "$kvrun" inspect --json "$golden"
expect 0 '"weight": \[' "JSON --full has the matrices" -- "$kvrun" inspect --json --full "$golden"
"$make_plan" "$stories" "$tmp/stories.kvplan" || { echo "FAIL: plan_for_model"; exit 1; }
expect 0 "ok: plan" "--check: the model the plan was made for" -- "$kvrun" inspect --check "$tmp/stories.kvplan" --model "$stories"
expect 0 '"match": true' "--check --json" -- "$kvrun" inspect --check --json "$tmp/stories.kvplan" --model "$stories"
# the same checkpoint with one byte of layer 0's K projection changed
python3 - "$stories" "$tmp/changed.bin" <<'PY'
import struct, sys
b = bytearray(open(sys.argv[1], 'rb').read())
dim, hidden, L, nh, nkv, vocab, seq = struct.unpack('<7i', b[:28])
wk = 28 + 4 * (abs(vocab) * dim + L * dim + L * dim * dim)
b[wk + 5] ^= 0x01
open(sys.argv[2], 'wb').write(b)
PY
expect 1 "K/V projection weights differ" "--check: K weights changed by one byte" -- "$kvrun" inspect --check "$tmp/stories.kvplan" --model "$tmp/changed.bin"
expect 1 '"match": false' "--check --json on a mismatch" -- "$kvrun" inspect --check --json "$tmp/stories.kvplan" --model "$tmp/changed.bin"
model="${KVCAL_DEFAULT_MODEL:-}"
if [ -n "$model" ] && [ -f "$model" ]; then
  expect 1 "n_layers 5 in the plan, 30 in the model" "--check: another model" -- "$kvrun" inspect --check "$tmp/stories.kvplan" --model "$model"
fi
head -c 100 "$golden" > "$tmp/cut.kvplan"
expect 1 "truncated: the header says 1664 bytes, the file has 100" "a truncated plan" -- "$kvrun" inspect "$tmp/cut.kvplan"
expect 1 "cannot open" "a missing plan" -- "$kvrun" inspect "$tmp/none.kvplan"
expect 2 "--check needs --model" "usage: --check without --model" -- "$kvrun" inspect --check "$golden"
expect 2 "expected one PLAN" "usage: no plan" -- "$kvrun" inspect
exit $fail
