#!/usr/bin/env bash
# End to end on the tiny model (stories260K), every step through the command-line tools:
#   kvprof importance -> report, SVG, config fragment (and the fragment is a valid kvcal config)
#   kvcal fit (kivi with the KVmix fragment, aqua) -> plans
#   kvrun eval --plan -> JSON with every reported field; a plan for another model is refused;
#   a truncated plan is refused. Exit 77 without the data.
set -u
bin="$1"
source "$(dirname "${BASH_SOURCE[0]}")/cli_test_lib.sh"

# 1. importance
if "$bin/kvprof" importance -q --model "$model" --tokenizer "$tok" --corpus "$calib" --prompts 4 --max-len 64 \
     --out "$tmp/imp.json" --json --svg "$tmp/imp.svg" --config-out "$tmp/kvmix.yaml" \
     --random-config-out "$tmp/random.yaml" > "$tmp/imp.txt"; then
  ok "kvprof importance"
else
  bad "kvprof importance exited $?"
fi
python3 - "$tmp/imp.json" <<'PY' && ok "importance report fields" || bad "importance report"
import json, sys
r = json.load(open(sys.argv[1]))
assert r["meta"]["layers"] == 5 and r["meta"]["prompts"] == 4
assert len(r["layers"]) == 5 and all(l["k_score"] > 0 and l["v_score"] > 0 for l in r["layers"])
a = r["allocation"]
assert a["n_high_layers"] == 1 and abs(a["k_avg_bits"] - (3 + 4 * 2) / 5) < 1e-9 and abs(a["v_avg_bits"] - (4 + 4 * 2) / 5) < 1e-9
assert -1 <= r["stability"]["k_rho"] <= 1 and len(r["per_prompt"]) == 4
PY
grep -q "</svg>" "$tmp/imp.svg" && [ "$(grep -c '(high bits)' "$tmp/imp.svg")" -eq 2 ] && ok "svg marks 1 K + 1 V high layer" || bad "svg"
grep -q "key_rpc_ratio" "$tmp/kvmix.yaml" && ok "config fragment" || bad "config fragment"

# 2. fit: KVmix allocation through the kivi method; AQUA-KV
common=(-q --model "$model" --tokenizer "$tok" --corpus "$calib" --seq-len 128 --max-tokens 4096 --no-checkpoint
        --set higgs.grid_samples=16384 --set higgs.grid_iters=20 --set keys.group_size=32 --set values.group_size=32
        --set cache.recent=32)
"$bin/kvcal" fit "${common[@]}" --method kivi --bits 2 --config "$tmp/kvmix.yaml" --out "$tmp/kvmix.kvplan" > "$tmp/fit1.txt" \
  && ok "kvcal fit with the KVmix fragment" || bad "kvcal fit kvmix"
"$bin/kvcal" fit "${common[@]}" --method aqua --bits 2 --out "$tmp/aqua.kvplan" > "$tmp/fit2.txt" \
  && ok "kvcal fit aqua" || bad "kvcal fit aqua"
"$bin/kvrun" inspect "$tmp/kvmix.kvplan" > "$tmp/inspect.yaml" && grep -q "rpc_ratio: 0.2" "$tmp/inspect.yaml" && grep -q "rpc_ratio: 0.1" "$tmp/inspect.yaml" && ok "inspect: the plan carries the per-layer RPC ratios" || bad "inspect"

# 3. evaluate
for p in kvmix aqua; do
  "$bin/kvrun" eval -q --model "$model" --tokenizer "$tok" --text "$heldout" --ctx 256 --max-tokens 1024 \
      --plan "$tmp/$p.kvplan" --json > "$tmp/$p.json" && ok "eval --plan $p" || bad "eval --plan $p"
  python3 - "$tmp/$p.json" <<'PY' && ok "eval fields $p" || bad "eval fields $p"
import json, sys
r = json.load(open(sys.argv[1]))
for k in ("ppl", "ppl_uncompressed", "kl_mean", "top1_agreement", "bits_per_value", "bits_per_value_total",
          "cache_bytes", "tokens_per_second"):
    assert k in r, k
assert r["kl_mean"] > 0 and 0 < r["top1_agreement"] <= 1 and r["ppl"] > 1 and r["ppl_uncompressed"] > 1
assert 1 < r["bits_per_value"] < 16 and r["bits_per_value_total"] > r["bits_per_value"] - 1e-9
assert r["chunks"] == 4 and r["tokens_scored"] == 4 * 255
PY
done
# KVmix decoding protocol (prompt, then one token per step)
"$bin/kvrun" eval -q --model "$model" --tokenizer "$tok" --text "$heldout" --ctx 128 --max-tokens 256 \
    --plan "$tmp/kvmix.kvplan" --prefill 64 --step 1 --json > "$tmp/dec.json" && grep -q '"step": 1' "$tmp/dec.json" \
  && ok "eval --prefill/--step" || bad "eval --prefill/--step"

# 4. refusals: another model (one K weight changed), a truncated plan
cp "$model" "$tmp/other.bin"
printf '\x55' | dd of="$tmp/other.bin" bs=1 seek=214400 conv=notrunc status=none
"$bin/kvrun" eval -q --model "$tmp/other.bin" --tokenizer "$tok" --text "$heldout" --ctx 256 --max-tokens 512 \
    --plan "$tmp/aqua.kvplan" > "$tmp/o.txt" 2> "$tmp/o.err"
rc=$?
[ $rc -eq 1 ] && grep -q "does not belong" "$tmp/o.err" && ok "wrong model refused" || { bad "wrong model: rc $rc"; cat "$tmp/o.err"; }
head -c 1000 "$tmp/aqua.kvplan" > "$tmp/trunc.kvplan"
"$bin/kvrun" eval -q --model "$model" --tokenizer "$tok" --text "$heldout" --ctx 256 --max-tokens 512 \
    --plan "$tmp/trunc.kvplan" > "$tmp/t.txt" 2> "$tmp/t.err"
rc=$?
[ $rc -eq 1 ] && [ -s "$tmp/t.err" ] && ok "truncated plan refused: $(head -c 160 "$tmp/t.err")" || bad "truncated plan: rc $rc"
exit $fail
