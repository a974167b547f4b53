#!/usr/bin/env bash
# Quantized pruning through the tools on stories260K (issue 17):
#   kvcal fit --set pruning.method=... --set pruning.budget=... (every method; --bits 16 = f16 streams;
#   PyramidKV's per-layer budgets recorded in the plan) and its refusals (budget outside (0, 1], even
#   pooling kernel, 16 bits with a quantizing method, --bits 5);
#   kvrun eval --protocol continuation with and without a plan, with and without pruning (JSON fields,
#   the held memory against the budget, the exact model's ppl the same in every run);
#   kvrun eval --task passkey (one answer per length x depth x trial, the same keys every run);
#   refusals: an observation window longer than the prompt, bad --depths / --length;
#   kvprof budget (table, JSON, chart, the best point's fragment loaded by kvcal fit) and its refusals.
#   test_long_eval.sh TOOLS_DIR   (data from $KVCAL_DATA_DIR; exit 77 = skipped)
set -u
bin="$1"
source "$(dirname "${BASH_SOURCE[0]}")/cli_test_lib.sh"

fit=(-q --model "$model" --tokenizer "$tok" --corpus "$calib" --seq-len 128 --max-tokens 2048 --no-checkpoint
     --set keys.group_size=32 --set values.group_size=32 --set cache.recent=32)
# 1. plans: no pruning (4 bits), every selection method at 4 bits, SnapKV at 16 bits (f16 streams) and 2 bits
"$bin/kvcal" fit "${fit[@]}" --method kivi --bits 4 --out "$tmp/kivi4.kvplan" > /dev/null && ok "fit kivi 4" || bad "fit kivi 4"
for pm in streamingllm h2o snapkv pyramidkv; do
  "$bin/kvcal" fit "${fit[@]}" --method kivi --bits 4 --set pruning.method=$pm --set pruning.budget=0.25 \
      --out "$tmp/$pm.kvplan" > /dev/null && ok "fit $pm 4 bits" || bad "fit $pm"
done
"$bin/kvcal" fit "${fit[@]}" --method kivi --bits 16 --set pruning.method=snapkv --set pruning.budget=0.25 \
    --out "$tmp/snap16.kvplan" > /dev/null && ok "fit snapkv 16 bits" || bad "fit snapkv 16"
"$bin/kvcal" fit "${fit[@]}" --method kivi --bits 2 --set pruning.method=snapkv --set pruning.budget=0.25 \
    --out "$tmp/snap2.kvplan" > /dev/null && ok "fit snapkv 2 bits" || bad "fit snapkv 2"
"$bin/kvrun" inspect "$tmp/snap16.kvplan" --json > "$tmp/snap16.json" 2> /dev/null
python3 - "$tmp/snap16.json" <<'PY' && ok "bits 16: every stream fp/16, pruning recorded" || bad "bits 16 plan"
import json, sys
p = json.load(open(sys.argv[1]))
g = p["global"]
assert g["prune_method"] == "snapkv" and abs(g["prune_budget"] - 0.25) < 1e-6, g
for l in p["layers"]:
    for s in ("K", "V"):
        assert l[s]["method"] == "fp" and l[s]["bits"] == 16, l[s]
PY
"$bin/kvrun" inspect "$tmp/pyramidkv.kvplan" --json > "$tmp/pyr.json" 2> /dev/null
python3 - "$tmp/pyr.json" <<'PY' && ok "pyramidkv: falling per-layer budgets with mean 0.25 in the plan" || bad "pyramidkv budgets"
import json, sys
p = json.load(open(sys.argv[1]))
b = [l["prune_budget"] for l in p["layers"]]
assert len(b) == 5 and all(x > 0 for x in b), b
assert all(b[i] > b[i + 1] for i in range(4)), b
# float32 storage of each budget: 1e-6 relative
assert abs(sum(b) / 5 - 0.25) < 1e-6, b
PY

# 2. refusals of the fit configuration
expect 1 "in (0, 1]" "budget 0 refused" -- "$bin/kvcal" fit "${fit[@]}" --method kivi --set pruning.method=snapkv \
    --set pruning.budget=0 --out "$tmp/x.kvplan"
expect 1 "in (0, 1]" "budget 1.5 refused" -- "$bin/kvcal" fit "${fit[@]}" --method kivi --set pruning.method=snapkv \
    --set pruning.budget=1.5 --out "$tmp/x.kvplan"
expect 1 "pruning.pool': must be 0 or odd" "even pooling kernel refused" -- "$bin/kvcal" fit "${fit[@]}" --method kivi \
    --set pruning.method=snapkv --set pruning.budget=0.25 --set pruning.pool=4 --out "$tmp/x.kvplan"
expect 1 "only method kivi" "16 bits with aqua refused" -- "$bin/kvcal" fit "${fit[@]}" --method aqua --bits 16 \
    --out "$tmp/x.kvplan"
expect 1 "uniform quantizer: bits must be 1, 2, 3, 4 or 8 (got 5)" "kivi --bits 5 refused by the method" -- \
    "$bin/kvcal" fit "${fit[@]}" --method kivi --bits 5 --out "$tmp/x.kvplan"
expect 1 "expected an integer in \[1, 8\], got '12' (or 16" "keys.bits 12 refused" -- "$bin/kvcal" fit "${fit[@]}" \
    --method kivi --set keys.bits=12 --out "$tmp/x.kvplan"
[ ! -e "$tmp/x.kvplan" ] && ok "no plan written by a refused fit" || bad "a refused fit wrote a plan"
# every width a method supports is accepted by --bits (1-bit KIVI is a search candidate)
"$bin/kvcal" fit "${fit[@]}" --method kivi --bits 1 --out "$tmp/kivi1.kvplan" > /dev/null \
  && "$bin/kvrun" inspect "$tmp/kivi1.kvplan" | grep -q "keys: {bits: 1," && ok "kivi --bits 1 accepted" || bad "kivi --bits 1"

# 3. continuation: exact model alone, then every plan on the same 3 samples
cont=(-q --model "$model" --tokenizer "$tok" --text "$heldout" --protocol continuation --prompt-len 200 --score-len 48
      --samples 3 --prefill-chunk 64 --json)
"$bin/kvrun" eval "${cont[@]}" > "$tmp/c_exact.json" && ok "continuation, exact model" || bad "continuation exact"
for p in kivi4 streamingllm h2o snapkv pyramidkv snap16 snap2; do
  "$bin/kvrun" eval "${cont[@]}" --plan "$tmp/$p.kvplan" > "$tmp/c_$p.json" && ok "continuation --plan $p" \
    || { bad "continuation --plan $p"; cat "$tmp/c_$p.json"; }
done
python3 - "$tmp" <<'PY' && ok "continuation fields, budgets, orderings" || bad "continuation results"
import json, sys, os
d = sys.argv[1]
r = {p: json.load(open(os.path.join(d, "c_%s.json" % p))) for p in
     ("exact", "kivi4", "streamingllm", "h2o", "snapkv", "pyramidkv", "snap16", "snap2")}
ex = r["exact"]
assert ex["samples"] == 3 and ex["tokens_scored"] == 3 * 48 and ex["ppl_uncompressed"] > 1 and "ppl" not in ex
for p, x in r.items():
    if p == "exact":
        continue
    for k in ("ppl", "kl_mean", "top1_agreement", "cache_fraction", "cache_fraction_end", "bits_per_value",
              "end_prompt_seconds", "prefill_seconds"):
        assert k in x, (p, k)
    # the exact model's ppl does not depend on the plan (same tokens, same one-pass forward)
    assert x["ppl_uncompressed"] == ex["ppl_uncompressed"], (p, x["ppl_uncompressed"], ex["ppl_uncompressed"])
    assert x["kl_mean"] > 0 and 0 < x["top1_agreement"] <= 1 and x["ppl"] > 1, (p, x)
    assert x["step"] == 32 and x["prefill_chunk"] == 64, x
# right after the prompt a pruning plan holds at most its budget of the prompt's f16 cache (sinks, kept
# tokens with their positions, the window: RUNTIME.md section 8), up to whole tokens per layer and head
# (1 token of 200 = 0.005); PyramidKV's per-layer budgets are float32 (mean 0.25 + 1e-6)
assert r["kivi4"]["prune_method"] == "none"
for p in ("streamingllm", "h2o", "snapkv", "pyramidkv", "snap16", "snap2"):
    assert r[p]["prune_method"] in ("streamingllm", "h2o", "snapkv", "pyramidkv"), p
    assert 0.2 < r[p]["cache_fraction"] <= 0.255, (p, r[p]["cache_fraction"])
# dropping 3/4 of the prompt costs more than quantizing it to 4 bits
for p in ("streamingllm", "h2o", "snapkv", "pyramidkv"):
    assert r[p]["kl_mean"] > r["kivi4"]["kl_mean"], (p, r[p]["kl_mean"], r["kivi4"]["kl_mean"])
# 16-bit kept tokens: 4x fewer tokens than 4 bits at the same budget; 2 bits: 2x more
assert r["snap16"]["bits_per_value"] > r["snapkv"]["bits_per_value"] > r["snap2"]["bits_per_value"]
PY

# 3b. the perplexity protocol (kvrun eval --plan, steps of cache.recent): H2O selects after the first step and
# then on every chunk leaving the window, so it prunes throughout; its bits_per_value_total is the memory held
# (codes, scales, positions, the f16 sinks and window) per value of EVERY token, i.e. 16 x cache / f16 cache
# (one chunk), and below KIVI-4's, which holds every token (held_fraction 1)
for p in kivi4 h2o; do
  "$bin/kvrun" eval --model "$model" --tokenizer "$tok" --plan "$tmp/$p.kvplan" --text "$heldout" --ctx 512 \
      --max-tokens 512 --json > "$tmp/ppl_$p.json" 2> /dev/null || bad "ppl protocol $p"
done
python3 - "$tmp/ppl_kivi4.json" "$tmp/ppl_h2o.json" <<'PY' && ok "ppl protocol: a pruning plan's bits count every token" || bad "ppl protocol bits"
import json, sys
k, h = (json.load(open(f)) for f in sys.argv[1:3])
assert k["held_fraction"] == 1.0 and 0 < h["held_fraction"] < 1, (k["held_fraction"], h["held_fraction"])
assert k["fp16_cache_bytes"] == h["fp16_cache_bytes"], (k["fp16_cache_bytes"], h["fp16_cache_bytes"])
for r in (k, h):
    assert abs(r["bits_per_value_total"] - 16.0 * r["cache_bytes"] / r["fp16_cache_bytes"]) < 1e-9, r
assert h["bits_per_value_total"] < k["bits_per_value_total"] and h["kl_mean"] > k["kl_mean"], (h, k)
print("ppl protocol: h2o %.3f bits (held %.3f), KL %.4f; kivi4 %.3f bits, KL %.4f" % (h["bits_per_value_total"],
      h["held_fraction"], h["kl_mean"], k["bits_per_value_total"], k["kl_mean"]))
PY

# 4. passkey: lengths x depths x trials answers, reproducible from the seed
pk=(-q --model "$model" --tokenizer "$tok" --task passkey --filler "$heldout" --length 256,384 --depths 0,0.5,1
    --trials 2 --seed 7 --json)
"$bin/kvrun" eval "${pk[@]}" > "$tmp/pk1.json" && ok "passkey, exact model" || bad "passkey exact"
"$bin/kvrun" eval "${pk[@]}" --plan "$tmp/snapkv.kvplan" > "$tmp/pk2.json" && ok "passkey --plan snapkv" || bad "passkey snapkv"
python3 - "$tmp/pk1.json" "$tmp/pk2.json" <<'PY' && ok "passkey fields and keys" || bad "passkey results"
import json, sys
a, b = (json.load(open(f)) for f in sys.argv[1:3])
for r in (a, b):
    assert r["task"] == "passkey" and r["prompts"] == 2 * 3 * 2 and len(r["trials"]) == 12
    assert abs(r["accuracy"] - r["correct"] / 12) < 1e-9
    for t in r["trials"]:
        assert 10000 <= t["key"] <= 99999
        assert t["correct"] == (t["answer"] == t["key"])
assert a["cache"] == "exact" and b["cache"] == "plan" and b["prune_method"] == "snapkv"
# the same (length, trial) has the same key at every depth, and both runs use the same keys
keys = {(t["length"], t["trial"]): t["key"] for t in a["trials"]}
assert all(keys[(t["length"], t["trial"])] == t["key"] for t in a["trials"] + b["trials"])
assert len(set(keys.values())) > 1
assert all(t["cache_fraction"] < 0.6 for t in b["trials"])
PY

# 5. refusals at evaluation time
"$bin/kvcal" fit "${fit[@]}" --method kivi --bits 4 --set pruning.method=snapkv --set pruning.budget=0.25 \
    --set pruning.window=64 --out "$tmp/w64.kvplan" > /dev/null || bad "fit window 64"
expect 1 "observation window of snapkv (prune_window 64 tokens) is larger than the prompt (40 tokens)" \
    "a window larger than the prompt refused" -- "$bin/kvrun" eval -q --model "$model" --tokenizer "$tok" \
    --text "$heldout" --protocol continuation --prompt-len 40 --score-len 8 --samples 1 --plan "$tmp/w64.kvplan"
expect 2 "--depths values must be in \[0, 1\]" "depth 1.5 refused" -- "$bin/kvrun" eval -q --model "$model" \
    --tokenizer "$tok" --task passkey --filler "$heldout" --length 256 --depths 0.5,1.5
expect 2 "not a comma-separated list" "bad --length list refused" -- "$bin/kvrun" eval -q --model "$model" \
    --tokenizer "$tok" --task passkey --filler "$heldout" --length 256,x
expect 1 "cannot hold its" "a passkey prompt too short for its template refused" -- "$bin/kvrun" eval -q \
    --model "$model" --tokenizer "$tok" --task passkey --filler "$heldout" --length 20
expect 2 "needs --prompt-len" "continuation without --prompt-len refused" -- "$bin/kvrun" eval -q --model "$model" \
    --tokenizer "$tok" --text "$heldout" --protocol continuation --score-len 8

# 6. kvprof budget: every operating point on the calibration text, the table, JSON, chart and a fragment
#    that kvcal fit loads into a plan with the chosen pruning and bits
bud=(-q --model "$model" --tokenizer "$tok" --corpus "$calib" --budgets 0.25,0.125 --methods snapkv,h2o --bits 16,8,4
     --mix-ranges 2 --prompt-len 200 --score-len 32 --samples 2 --passkey-length 256 --depths 0.5
     --set keys.group_size=32 --set values.group_size=32 --set cache.recent=32)
"$bin/kvprof" budget "${bud[@]}" --target 0.125 --config-out "$tmp/best.yaml" --svg "$tmp/budget.svg" \
    --report "$tmp/budget.json" > "$tmp/budget.txt" && ok "kvprof budget" || { bad "kvprof budget"; cat "$tmp/budget.txt"; }
"$bin/kvprof" budget "${bud[@]}" --json > "$tmp/budget_table.json" && ok "kvprof budget --json" || bad "kvprof budget --json"
python3 - "$tmp/budget_table.json" "$tmp/best.yaml" <<'PY' && ok "kvprof budget: points, best, fragment" || bad "kvprof budget results"
import json, sys
r = json.load(open(sys.argv[1]))
pts = r["points"]
# per budget: 2 methods x 3 precisions + 1 mix method x 2 other precisions x 2 ranges
assert len(pts) == 2 * (6 + 4), len(pts)
for p in pts:
    assert p["kl_mean"] > 0 and p["ppl"] > 1 and 0 <= p["passkey_accuracy"] <= 1, p
for b in (0.25, 0.125):
    at = [p for p in pts if abs(p["budget"] - b) < 1e-12]
    best = [p for p in at if p["best"]]
    assert len(best) == 1, (b, best)
    # the best: highest passkey accuracy, then lowest KL
    key = lambda p: (-p["passkey_accuracy"], p["kl_mean"])
    assert key(best[0]) == min(key(p) for p in at), (b, best[0])
    if b == 0.125:
        best125 = best[0]
frag = open(sys.argv[2]).read()
assert "method: %s" % best125["method"] in frag and "bits: %d" % best125["bits"] in frag and "budget: 0.125" in frag, frag
PY
grep -q "</svg>" "$tmp/budget.svg" && [ "$(grep -c '<polyline' "$tmp/budget.svg")" -eq 10 ] && ok "budget chart: 10 lines" \
  || bad "budget chart"
grep -q "<- best" "$tmp/budget.txt" && ok "budget table marks the best" || bad "budget table"
"$bin/kvcal" fit "${fit[@]}" --method kivi --config "$tmp/best.yaml" --out "$tmp/best.kvplan" > /dev/null \
  && ok "kvcal fit loads the fragment" || bad "kvcal fit --config fragment"
"$bin/kvrun" eval "${cont[@]}" --plan "$tmp/best.kvplan" > "$tmp/c_best.json" && ok "the fragment's plan evaluates" \
  || bad "eval the fragment's plan"
expect 2 "--target 0.5 is not one of --budgets" "a target outside the budgets refused" -- "$bin/kvprof" budget \
    "${bud[@]}" --target 0.5
expect 1 "outside (0, 1]" "budget 2 refused" -- "$bin/kvprof" budget "${bud[@]}" --budgets 2 --target 2
expect 1 "token precision 5 bits" "5 bits refused" -- "$bin/kvprof" budget "${bud[@]}" --bits 5
expect 2 "is not streamingllm, h2o, snapkv or pyramidkv" "unknown method refused" -- "$bin/kvprof" budget "${bud[@]}" \
    --methods snapkv,bogus
exit $fail
