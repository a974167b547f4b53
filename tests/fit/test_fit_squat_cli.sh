#!/usr/bin/env bash
# kvcal fit with SQuat keys from the command line on stories260K: --method squat, squat.enabled with
# kivi (static subspace, KVmix per-layer key bits) and aqua-uniform, refusals (pre-RoPE keys,
# channel-axis keys) naming the key, and `kvrun inspect` showing the per-layer choice and the
# measured errors. (Resume: test_fit_cli.sh's simulated kill includes --method squat.)
#   test_fit_squat_cli.sh KVCAL KVRUN      (data from $KVCAL_DATA_DIR; exit 77 = skipped)
set -u
kvcal="$1"; kvrun="$2"
data="${KVCAL_DATA_DIR:-}"
if [ -z "$data" ] || [ ! -f "$data/stories260K/stories260K.bin" ]; then
  echo "skipped: no stories260K in KVCAL_DATA_DIR"
  exit 77
fi
command -v python3 > /dev/null || { echo "skipped: no python3"; exit 77; }
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
head -c 60000 "$data/wikitext-2-raw/wiki.valid.raw" > "$tmp/corpus.txt"
export SOURCE_DATE_EPOCH=1700000000
common=(--model "$data/stories260K/stories260K.bin" --corpus "$tmp/corpus.txt" --seq-len 260 --max-tokens 6000 -q --no-checkpoint)
fail=0

expect() { # CODE PATTERN DESCRIPTION -- command...
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

# check PLAN SUBSPACE KEYBITS...: every K stream has SQuat with that subspace, the report has the
# SQuat metrics on K rows, the choice is no worse than the paper's setting and the uniform quantizer
check() {
  "$kvrun" inspect --json "$1" > "$tmp/p.json" || { echo "FAIL: inspect $1"; fail=1; return; }
  if python3 - "$tmp/p.json" "$2" "${3:-}" <<'PY'
import json, sys
d = json.load(open(sys.argv[1])); sub = sys.argv[2]; bits = sys.argv[3].split(",") if sys.argv[3] else None
m = d["report"]["metrics"]
for k in ("squat_r", "squat_lambda", "squat_out_err", "squat_default_out_err", "squat_kivi_out_err", "squat_score_err"):
    assert k in m, k
rows = {(r["layer"], r["stream"]): r for r in d["report"]["rows"]}
for L in d["layers"]:
    l = L["layer"]; k = L["K"]; q = k["squat"]
    assert q["subspace"] == sub, q
    assert q["basis_stored"], q
    if bits: assert k["record"]["bits"] == int(bits[l]), (l, k["record"]["bits"])
    r = rows[(l, "K")]
    assert r["squat_r"] == q["r"] and abs(r["squat_lambda"] - q["lambda"]) < 1e-9, (r, q)
    assert r["squat_out_err"] <= r["squat_default_out_err"] and r["squat_out_err"] <= r["squat_kivi_out_err"], r
    assert rows[(l, "V")]["squat_r"] is None
PY
  then echo "ok: $1: SQuat records and report ($2)"; else echo "FAIL: $1"; fail=1; fi
}

expect 0 "" "--method squat" -- "$kvcal" fit "${common[@]}" --out "$tmp/sq.kvplan" --method squat
check "$tmp/sq.kvplan" prompt
"$kvrun" inspect "$tmp/sq.kvplan" > "$tmp/insp.txt"
grep -q "squat_out_err" "$tmp/insp.txt" && grep -q "squat: {r:" "$tmp/insp.txt" \
  && echo "ok: kvrun inspect (YAML) shows the choice and the errors" || { echo "FAIL: inspect text"; fail=1; }
expect 0 "" "kivi + squat.enabled, static subspace, KVmix key bits" -- "$kvcal" fit "${common[@]}" --out "$tmp/st.kvplan" \
  --method kivi --set squat.enabled=true --set squat.subspace=static --set layers.2.key_bits=4
check "$tmp/st.kvplan" static 2,2,4,2,2
# the stored basis is plan bytes the runtime holds: kvrun eval counts it in the honest bits, once per sequence
# (n_kv_heads x r x head_dim f32 per layer, from the plan's records), like predictor weights
if "$kvrun" eval --model "$data/stories260K/stories260K.bin" --tokenizer "$data/stories260K/tok512.bin" \
     --plan "$tmp/st.kvplan" --text "$tmp/corpus.txt" --ctx 256 --max-tokens 512 --json > "$tmp/ev.json" 2> "$tmp/err" &&
   python3 - "$tmp/p.json" "$tmp/ev.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1])); e = json.load(open(sys.argv[2]))
fp = d["fingerprint"]
basis = sum(4 * fp["n_kv_heads"] * L["K"]["squat"]["r"] * fp["head_dim"] for L in d["layers"])
assert basis > 0
per_seq = 2 * len(d["layers"]) * fp["n_kv_heads"] * fp["head_dim"] * 256  # values one 256-token sequence holds
want = 8.0 * basis / per_seq
got = e["squat_basis_bits_per_value_per_sequence"]
assert abs(got - want) <= 1e-4 * want + 1e-4, (got, want)  # the JSON prints 4 decimals
assert e["bits_per_value_total"] > want, e
print("ok: kvrun eval counts the stored basis: %.4f bits per value per sequence (%d bytes)" % (got, basis))
PY
then :; else echo "FAIL: kvrun eval of the static-basis plan"; cat "$tmp/err"; fail=1; fi
expect 0 "" "aqua-uniform + squat.enabled (keys grouped along tokens)" -- "$kvcal" fit "${common[@]}" --out "$tmp/aq.kvplan" \
  --method aqua-uniform --set squat.enabled=true --set cache.pre_rope=false --set keys.group_axis=tokens --set keys.group_size=32
check "$tmp/aq.kvplan" prompt
expect 1 "cache.pre_rope" "SQuat with pre-RoPE keys is refused" -- "$kvcal" fit "${common[@]}" --out "$tmp/x.kvplan" \
  --method squat --set cache.pre_rope=true
expect 1 "keys.group_axis" "SQuat with per-token key groups is refused" -- "$kvcal" fit "${common[@]}" --out "$tmp/x.kvplan" \
  --method aqua-uniform --set squat.enabled=true --set cache.pre_rope=false
expect 1 "squat.static_basis" "a static subspace without a stored basis is refused" -- "$kvcal" fit "${common[@]}" \
  --out "$tmp/x.kvplan" --method squat --set squat.subspace=static --set squat.static_basis=false
[ -e "$tmp/x.kvplan" ] && { echo "FAIL: a refused run wrote a plan"; fail=1; }
exit $fail
