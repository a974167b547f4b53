#!/usr/bin/env bash
# kvcal search end to end on stories260K (5 layers): the plan is written, respects the budget as `kvrun eval
# --plan` counts it, the JSON carries every part, and the refusals (budget below the cheapest assembly,
# unknown candidate, bad budget) exit with the right codes before any work. Small settings: < 60 s.
set -u
kvcal="$1"
kvrun="$2"
. "$(dirname "$0")/../tools/cli_test_lib.sh"
export KVCAL_THREADS=2
inputs=(--model "$model" --tokenizer "$tok" --corpus "$calib" --heldout "$heldout" --fit-tokens 4096
        --sens-ctx 128 --prompts 4 --set cache.recent=64 --set higgs.grid_samples=32768 --set higgs.grid_iters=30)
# the knapsack's own choice (no selection): what most cases below check; the selection has its own case
base=("${inputs[@]}" --select-chunks 0)
common=("${base[@]}" --context 256 --eval-chunks 2)

# kvrun eval's JSON ($1) against the search's measurement of the point (budget $3, context $4) in its JSON ($2)
check_same="$tmp/check_same.py"
cat > "$check_same" <<'PY'
import json, sys
e = json.load(open(sys.argv[1])); r = json.load(open(sys.argv[2])); b = float(sys.argv[3]); c = int(sys.argv[4])
p = [p for p in r["plans"] if p["budget_bits"] == b and p["context"] == c][0]["measured_heldout"]
# the same tokens (--eval-tokens N is kvrun eval --max-tokens N) and the same code: the same numbers
assert abs(e["bits_per_value_total"] - p["bits_per_value_total"]) < 1e-4 and abs(e["kl_mean"] - p["kl_mean"]) < 1e-5 * max(1, p["kl_mean"]), (e, p)
print("ok: kvrun eval at %d: KL %.5g bits %.4f, as the search measured" % (c, e["kl_mean"], e["bits_per_value_total"]))
PY

# refusals: usage errors (2) before anything is loaded; a budget below the cheapest assembly (runtime error 1,
# after the fits and the byte counts, before the sensitivities)
expect 2 "unknown candidate 'kivi9'" "unknown candidate" -- "$kvcal" search "${common[@]}" --budget-bits 4 \
  --candidates kivi2,kivi9 --out "$tmp/x.kvplan"
expect 2 "budget-bits" "budget out of range" -- "$kvcal" search "${common[@]}" --budget-bits 0 --out "$tmp/x.kvplan"
expect 2 "out-dir" "several budgets need --out-dir" -- "$kvcal" search "${common[@]}" --budget-bits 6,7 \
  --out "$tmp/x.kvplan"
expect 2 "not a comma-separated list" "a bad budget list" -- "$kvcal" search "${common[@]}" --budget-bits 6,x \
  --out-dir "$tmp/d"
expect 2 "not one of the --context values" "a budget at an unknown context" -- "$kvcal" search "${common[@]}" \
  --budget-bits 6,7@300 --out-dir "$tmp/d"
expect 2 "not both" "--eval-chunks with --eval-tokens" -- "$kvcal" search "${common[@]}" --budget-bits 7 \
  --eval-tokens 512 --out "$tmp/x.kvplan"
expect 1 "below the cheapest assembly" "budget below the cheapest plan" -- "$kvcal" search "${common[@]}" \
  --budget-bits 3 --candidates kivi2,fp8 --out "$tmp/x.kvplan"
[ -e "$tmp/x.kvplan" ] && bad "a refused search wrote a plan" || ok "no plan after a refusal"
# refused before any fit: key groups of 128 tokens with a 64-token window; sensitivity chunks no longer than
# the f16 sinks and window (they would measure a KL of 0 for every candidate)
expect 1 "must divide cache.recent" "kivi1g128 with cache.recent 64" -- "$kvcal" search "${common[@]}" \
  --budget-bits 7 --candidates kivi2,kivi1g128 --out "$tmp/x.kvplan"
grep -q "fitting candidate" "$tmp/err" && bad "the refusal came after a fit" || ok "refused before the first fit"
expect 1 "compress nothing" "--sens-ctx within the f16 sinks and window" -- "$kvcal" search "${common[@]}" \
  --set cache.recent=128 --budget-bits 7 --candidates kivi2 --out "$tmp/x.kvplan"
[ -e "$tmp/x.kvplan" ] && bad "a refused search wrote a plan" || ok "no plan after a refusal"

# the decoding speed floor (SEARCH.md §7): out of range is a usage error; a floor no cache meets (the weights alone
# are slower) is refused after the cost model (before the sensitivities); a floor the plans meet gives a plan whose
# predicted speed meets it (by construction), measured end to end, and recorded in the plan's provenance
expect 2 "min-decode-speed" "--min-decode-speed out of range" -- "$kvcal" search "${common[@]}" --budget-bits 7 \
  --candidates f16,kivi2 --min-decode-speed -1 --out "$tmp/x.kvplan"
expect 1 "no cache decodes that fast" "a floor above what the weights allow" -- "$kvcal" search "${common[@]}" \
  --budget-bits 7 --candidates f16,kivi2 --min-decode-speed 100 --out "$tmp/x.kvplan"
grep -q "decoding cost at context 256: kivi2" "$tmp/err" && ok "refused after the cost model" ||
  bad "the floor was refused before the cost model measured it"
[ -e "$tmp/x.kvplan" ] && bad "a refused search wrote a plan" || ok "no plan after a refusal"
expect 0 "" "search with a speed floor" -- "$kvcal" search "${common[@]}" --budget-bits 7 --candidates f16,kivi2,kivi4 \
  --min-decode-speed 0.05 --out "$tmp/sp.kvplan" --json
cp "$tmp/out" "$tmp/sp.json"
expect 0 "" "kvrun inspect the floored plan" -- "$kvrun" inspect "$tmp/sp.kvplan" --json
cp "$tmp/out" "$tmp/sp-inspect.json"
python3 - "$tmp/sp.json" "$tmp/sp-inspect.json" <<'PY' || fail=1
import json, sys
r = json.load(open(sys.argv[1])); i = json.load(open(sys.argv[2]))
d = r["plans"][0]["decode_speed"]
assert d["floor"] == 0.05 and d["predicted"] >= 0.05 and d["measured"] > 0 and d["tokens_per_second"] > 0, d
assert d["f16_tokens_per_second"] > 0 and d["time_budget_ms"] > 0 and d["device"].startswith("cpu: "), d
cfg = i["provenance"]["config"]
assert "min_decode_speed: 0.05" in cfg and "predicted_decode_speed:" in cfg and "speed_device:" in cfg, cfg
print("ok: floor 0.05: predicted %.2fx, measured %.2fx the f16 cache" % (d["predicted"], d["measured"]))
PY

# KIVI with larger groups (kivi1g128) is the cheapest candidate: at 512 tokens with a 128-token window, 5.45 bits
# is below KIVI-1 everywhere (5.5; the f16 sinks and window are 4.125 of them) and feasible with kivi1g128 keys
expect 0 "" "search with kivi1g128" -- "$kvcal" search "${inputs[@]}" --set cache.recent=128 --sens-ctx 256 \
  --select-chunks 0 --context 512 --eval-tokens 1024 --budget-bits 5.45 --candidates kivi1,kivi1g128,kivi2 \
  --out "$tmp/g.kvplan" --json
python3 - "$tmp/out" <<'PY' || fail=1
import json, sys
r = json.load(open(sys.argv[1]))
p = r["plans"][0]
assert p["feasible"] and p["measured_heldout"]["bits_per_value_total"] <= 5.45 + 1e-9, p
assert "kivi1g128" in p["choices"] and p["cheapest_bits"] < 5.45, p
# per stream: kivi1g128's keys cost less than kivi1's (scales per 128 tokens, not 32)
k = r["candidates"]
i1, ig = [c["name"] for c in k].index("kivi1"), [c["name"] for c in k].index("kivi1g128")
assert all(s["bits"][0][ig] < s["bits"][0][i1] for s in r["streams"][0::2]), r["streams"][0]
print("ok: 5.45 bits at 512 tokens with kivi1g128: %.4f bits, %s" % (p["measured_heldout"]["bits_per_value_total"], p["choices"]))
PY

# a search under 7 bits at context 256 (f16 sinks and window cost ~4 bits there)
start=$(date +%s)
expect 0 "" "search runs" -- "$kvcal" search "${common[@]}" --budget-bits 7 --candidates f16,kivi2,kivi4,higgs2,fp8,nvfp4 \
  --out "$tmp/s.kvplan" --json
cp "$tmp/out" "$tmp/s.json"
echo "search took $(( $(date +%s) - start )) s"
python3 - "$tmp/s.json" <<'PY' || fail=1
import json, sys
r = json.load(open(sys.argv[1]))
assert len(r["streams"]) == 10, len(r["streams"])
for s in r["streams"]:
    assert len(s["kl"]) == 6 and len(s["bits"]) == 1 and len(s["bits"][0]) == 6
assert len(r["plans"]) == 1 and r["plans"][0]["feasible"]
r = dict(r, **r["plans"][0])
assert len(r["choices"]) == 10 and all(c in ("f16", "kivi2", "kivi4", "higgs2", "fp8", "nvfp4") for c in r["choices"])
# the plan's honest bits as kvrun eval counts them: within the budget, and equal to the per-stream sum
p, m = r["predicted"], r["measured_heldout"]
assert m["bits_per_value_total"] <= 7.0 + 1e-9, m
assert abs(m["bits_per_value_total"] - p["bits_per_value_total"]) < 1e-9, (m, p)
# additivity on the very tokens of the sensitivities: the summed per-stream KL predicts the plan's KL
# within a factor of 2 (measured 0.00435 vs 0.00438 predicted at 7 bits on this model; interactions between
# streams are second order at these error levels, and 2x still fails a sum that is off by a stream's worth)
s = r["measured_same_tokens"]
assert 0.5 * p["kl_sum"] <= s["kl_mean"] <= 2.0 * p["kl_sum"], (s, p)
for c in r["candidates"]:
    assert c["rho_k"] is None or -1 <= c["rho_k"] <= 1
print("ok: json checks: bits %.4f <= 7, predicted KL %.4g, measured %.4g (same tokens), %.4g (held-out)" %
      (m["bits_per_value_total"], p["kl_sum"], s["kl_mean"], m["kl_mean"]))
PY
# the plan is a plan kvrun evaluates with the same bits
expect 0 "" "kvrun eval reads the plan" -- "$kvrun" eval --model "$model" --tokenizer "$tok" --plan "$tmp/s.kvplan" \
  --text "$heldout" --ctx 256 --max-tokens 510 --json
python3 - "$tmp/out" "$tmp/s.json" <<'PY' || fail=1
import json, sys
e = json.load(open(sys.argv[1])); r = json.load(open(sys.argv[2]))
m = r["plans"][0]["measured_heldout"]
assert abs(e["bits_per_value_total"] - m["bits_per_value_total"]) < 1e-3, (e, m)
print("ok: kvrun eval bits_per_value_total %.4f" % e["bits_per_value_total"])
PY

# several budgets and contexts from one run (shared fits and sensitivities): a plan per feasible point, each
# within its budget as kvrun eval counts it; 5 bits is below the cheapest assembly at 256 tokens (the f16
# sinks and window alone are ~4.3 bits there), so it is reported without a plan; 8@512 is a point at 512 only; more budget never predicts
# more KL (the knapsack is exact up to 2L units of budget/20000, far below the 2 bits between points)
expect 0 "" "search with several points" -- "$kvcal" search "${base[@]}" --eval-tokens 1024 \
  --budget-bits 5,7,9,8@512 --context 256,512 --candidates f16,kivi2,kivi4 --out-dir "$tmp/frontier" --json
cp "$tmp/out" "$tmp/f.json"
python3 - "$tmp/f.json" <<'PY' || fail=1
import json, os, sys
r = json.load(open(sys.argv[1]))
pts = {(p["budget_bits"], p["context"]): p for p in r["plans"]}
assert sorted(pts) == [(5, 256), (5, 512), (7, 256), (7, 512), (8, 512), (9, 256), (9, 512)], sorted(pts)
assert not pts[(5, 256)]["feasible"] and pts[(5, 256)]["plan"] is None and pts[(5, 256)]["cheapest_bits"] > 5
for (b, c), p in pts.items():
    if not p["feasible"]:
        continue
    assert os.path.exists(p["plan"]) and p["plan"].endswith("search-ctx%d-%gbits.kvplan" % (c, b)), p["plan"]
    m = p["measured_heldout"]
    assert m["bits_per_value_total"] <= b + 1e-9 and abs(m["bits_per_value_total"] - p["predicted"]["bits_per_value_total"]) < 1e-9, p
    assert m["ctx"] == c and m["chunks"] == 1024 // c, m
for c in (256, 512):
    assert pts[(9, c)]["predicted"]["kl_sum"] <= pts[(7, c)]["predicted"]["kl_sum"], (pts[(9, c)], pts[(7, c)])
assert len(r["streams"][0]["bits"]) == 2
print("ok: frontier: %d plans" % sum(p["feasible"] for p in pts.values()))
PY
for c in 256 512; do
  expect 0 "" "kvrun eval reads the ctx $c 7-bit plan" -- "$kvrun" eval --model "$model" --tokenizer "$tok" \
    --plan "$tmp/frontier/search-ctx$c-7bits.kvplan" --text "$heldout" --ctx $c --max-tokens 1024 --json
  python3 "$check_same" "$tmp/out" "$tmp/f.json" 7 $c || fail=1
done

# AQUA-KV candidates: a choice that takes one is refitted layer-sequentially (SEARCH.md §1.3); candidates a
# refit cannot carry (KIVI-3 at 10 codes per word: another uniform layout) are refused before any fit
expect 1 "cannot be combined with AQUA-KV" "a candidate the refit cannot carry" -- "$kvcal" search "${common[@]}" \
  --budget-bits 12 --candidates aqua2,kivi3w10 --out "$tmp/x.kvplan"
expect 2 "must be chained or free" "a bad --predictor-inputs" -- "$kvcal" search "${common[@]}" \
  --budget-bits 12 --candidates aqua2 --predictor-inputs any --out "$tmp/x.kvplan"
expect 0 "" "search with AQUA-KV" -- "$kvcal" search "${base[@]}" --context 256 --eval-tokens 1024 --budget-bits 10 \
  --candidates kivi2,aqua4 --out "$tmp/aq.kvplan" --json
cp "$tmp/out" "$tmp/aq.json"
expect 0 "" "search with AQUA-KV, free predictor inputs" -- "$kvcal" search "${base[@]}" --context 256 \
  --eval-tokens 1024 --budget-bits 10 --candidates kivi2,aqua4 --predictor-inputs free --out "$tmp/aqf.kvplan" --json
cp "$tmp/out" "$tmp/aqf.json"
python3 - "$tmp/aq.json" "$tmp/aqf.json" <<'PY' || fail=1
import json, sys
r, rf = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
p, pf = r["plans"][0], rf["plans"][0]
assert r["predictor_inputs"] == "chained" and rf["predictor_inputs"] == "free", (r["predictor_inputs"], rf["predictor_inputs"])
def breaks(ch):
    """the streams that break the predictor chain (SEARCH.md §1.4): an AQUA-KV K at layer l >= 1 not above an
    AQUA-KV K, an AQUA-KV V at l >= 1 not beside one"""
    return [i for i, c in enumerate(ch) if c == "aqua4" and i >= 2 and ch[i - 2 if i % 2 == 0 else i - 1] != "aqua4"]
# on stories260K KIVI-2 errs less than AQUA-KV-4's layer 0 on K (HIGGS-4 before RoPE here) and far more above
# it; 10 bits is room for most but not all AQUA-KV-4 streams: a mix, refitted, with predicted streams
ch = p["choices"]
assert p["refit"] is True and "kivi2" in ch and any(c == "aqua4" for c in ch[2:]), p
assert not breaks(ch), (breaks(ch), ch)
# free inputs take the cheaper KIVI-2 key at layer 0 under AQUA-KV-4 keys (the chain binds here), and the
# chained plan measures a lower KL on held-out text (0.0145 vs 0.0376 when this was written: the post-RoPE
# input of layer 1's key predictor)
assert breaks(pf["choices"]), pf["choices"]
assert p["measured_heldout"]["kl_mean"] < pf["measured_heldout"]["kl_mean"], (p["measured_heldout"], pf["measured_heldout"])
m = p["measured_heldout"]
assert m["bits_per_value_total"] <= 10 + 1e-9 and abs(m["bits_per_value_total"] - p["predicted"]["bits_per_value_total"]) < 1e-9, p
print("ok: AQUA-KV refit: choices %s, bits %.4f, KL %.4g (free inputs: %s, KL %.4g)" % (
    ",".join(ch), m["bits_per_value_total"], m["kl_mean"], ",".join(pf["choices"]), pf["measured_heldout"]["kl_mean"]))
PY
expect 0 "" "kvrun eval reads the refitted plan" -- "$kvrun" eval --model "$model" --tokenizer "$tok" \
  --plan "$tmp/aq.kvplan" --text "$heldout" --ctx 256 --max-tokens 1024 --json
python3 "$check_same" "$tmp/out" "$tmp/aq.json" 10 256 || fail=1
# 4-bit predictors (aqua.predictor_bits 4, plan format 1.4) through the search: every AQUA-KV stream of the
# written plan holds GPTQ codes (kvrun inspect), a predicted stream's honest bits fall by the predictor bytes
# saved (stories260K, kv_dim 32: 4 + 2 x 16 / 32 = 5 bits per weight instead of 16), and the plan evaluates as
# the search measured it
expect 0 "" "search with 4-bit predictors" -- "$kvcal" search "${base[@]}" --context 256 --eval-tokens 1024 \
  --budget-bits 10 --candidates kivi2,aqua4 --set aqua.predictor_bits=4 --set aqua.predictor_group=32 \
  --out "$tmp/aq4.kvplan" --json
cp "$tmp/out" "$tmp/aq4.json"
expect 0 "" "kvrun inspect the 4-bit-predictor plan" -- "$kvrun" inspect "$tmp/aq4.kvplan" --json
python3 - "$tmp/aq.json" "$tmp/aq4.json" "$tmp/out" <<'PY' || fail=1
import json, sys
r, r4, ins = (json.load(open(a)) for a in sys.argv[1:4])
k = [c["name"] for c in r["candidates"]].index("aqua4")
for a, b in zip(r["streams"], r4["streams"]):
    if a["layer"] >= 1:  # predicted streams: the predictor is cheaper, the codes the same
        assert b["bits"][0][k] < a["bits"][0][k] - 0.5, (a, b)
pr = [s["predictor"] for l in ins["layers"] for s in (l["K"], l["V"]) if s.get("predictor")]
assert pr and all(q["code_bits"] == 4 and q["group"] == 32 and q["dtype"] == "f16" for q in pr), pr
assert "PRED_Q4" in ins["format"]["required_features"], ins["format"]
m = r4["plans"][0]["measured_heldout"]
assert m["bits_per_value_total"] <= 10 + 1e-9, m
print("ok: 4-bit predictors: %d GPTQ predictors, bits %.4f, KL %.4g" % (len(pr), m["bits_per_value_total"], m["kl_mean"]))
PY
expect 0 "" "kvrun eval reads the 4-bit-predictor plan" -- "$kvrun" eval --model "$model" --tokenizer "$tok" \
  --plan "$tmp/aq4.kvplan" --text "$heldout" --ctx 256 --max-tokens 1024 --json
python3 "$check_same" "$tmp/out" "$tmp/aq4.json" 10 256 || fail=1
# SQuat keys and XQuant shared codes (SEARCH.md §1.1, §1.4): a shared-codes candidate needs its codes_of
# candidate listed; free predictor inputs with them and AQUA-KV are refused (a predictor could read a spliced
# placeholder); a search over all of them writes a plan that respects the chain and evaluates as predicted
expect 2 "list kivi2 among the candidates" "kivi2s without kivi2" -- "$kvcal" search "${common[@]}" \
  --budget-bits 8 --candidates kivi4,kivi2s --out "$tmp/x.kvplan"
expect 2 "use chained" "SQuat with AQUA-KV and free inputs" -- "$kvcal" search "${common[@]}" \
  --budget-bits 8 --candidates aqua2,squat2 --predictor-inputs free --out "$tmp/x.kvplan"
expect 0 "" "search with SQuat and shared codes" -- "$kvcal" search "${base[@]}" --context 256 --eval-tokens 1024 \
  --budget-bits 6.5,8 --candidates kivi2,kivi2s,squat2,aqua4 --out-dir "$tmp/sq" --json
cp "$tmp/out" "$tmp/sq.json"
python3 - "$tmp/sq.json" <<'PY' || fail=1
import json, sys
r = json.load(open(sys.argv[1]))
names = [c["name"] for c in r["candidates"]]
for i, s in enumerate(r["streams"]):
    kl = dict(zip(names, s["kl"]))
    assert (kl["squat2"] is None) == (s["stream"] == "V"), (i, kl)          # SQuat: keys only
    assert (kl["kivi2s"] is None) == (s["layer"] % 2 == 0), (i, kl)         # shared codes: odd layers only
n_sq = n_sh = 0
for p in r["plans"]:
    assert p["feasible"], p
    ch = p["choices"]
    for i, c in enumerate(ch):
        if c == "kivi2s":
            assert i % 4 >= 2 and ch[i - 2] == "kivi2", (i, ch)               # above KIVI-2 codes, odd layer
        if c == "squat2":
            assert i % 2 == 0, (i, ch)
        if c == "aqua4" and i >= 2:                                           # the predictor chain
            assert ch[i - 2 if i % 2 == 0 else i - 1] == "aqua4", (i, ch)
            assert i % 2 == 0 or ch[i - 2] != "kivi2s", (i, ch)               # never reads a placeholder
    n_sq += ch.count("squat2")
    n_sh += ch.count("kivi2s")
    m = p["measured_heldout"]
    assert m["bits_per_value_total"] <= p["budget_bits"] + 1e-9, p
    assert abs(m["bits_per_value_total"] - p["predicted"]["bits_per_value_total"]) < 1e-9, p
    print("ok: %.4g bits: %s, KL %.4g" % (p["budget_bits"], ",".join(ch), m["kl_mean"]))
print("ok: SQuat keys chosen %d times, shared codes %d times over the points" % (n_sq, n_sh))
PY
# the selection (SEARCH.md §5.3): per point the plan of least KL on calibration chunks at the point's context,
# among the knapsack's choice, the choice on context-corrected sensitivities and every single method within
# the budget; the scale of each single method is its measured KL over its summed sensitivities
expect 0 "" "search with the selection" -- "$kvcal" search "${inputs[@]}" --context 256 --eval-tokens 1024 \
  --select-chunks 2 --budget-bits 6.6,7.3,8 --candidates kivi2,kivi3,kivi4,higgs2,higgs3,aqua4,nvfp4 --out-dir "$tmp/sel" \
  --json
cp "$tmp/out" "$tmp/sel.json"
python3 - "$tmp/sel.json" <<'PY' || fail=1
import json, math, sys
r = json.load(open(sys.argv[1]))
names = [c["name"] for c in r["candidates"]]
own = {}  # a single method's honest bits at 256: the value-weighted mean of its streams' (every stream alike)
for ci, c in enumerate(r["candidates"]):
    own[c["name"]] = sum(s["bits"][0][ci] for s in r["streams"]) / len(r["streams"])
    pred = sum(s["kl"][ci] for s in r["streams"])
    assert c["select_kl"][0] is not None and c["select_kl"][0] > 0, c
    assert abs(c["context_scale"][0] - c["select_kl"][0] / pred) <= 1e-4 * c["context_scale"][0], (c, pred)
kept = set()
assert len(r["plans"]) == 3 and all(p["feasible"] for p in r["plans"]), r["plans"]
for p in r["plans"]:
    sel, b = p["selection"], p["budget_bits"]
    within = {s["name"]: s["kl"] for s in sel["singles_within_budget"]}
    assert set(within) == {n for n in names if own[n] <= b + 1e-9}, (b, within, own)
    for n, k in within.items():
        assert k == r["candidates"][names.index(n)]["select_kl"][0], (n, k)
    tried = [sel["kl_knapsack"]] + ([sel["kl_corrected"]] if sel["kl_corrected"] is not None else []) + list(within.values())
    best = min(tried)
    got = {"knapsack": sel["kl_knapsack"], "corrected": sel["kl_corrected"]}.get(sel["kept"])
    if sel["kept"] == "single":
        got = within[sel["single"]]
        assert p["choices"] == [sel["single"]] * len(p["choices"]) and p["refit"] is False, p
    assert got == best, (sel, best)
    m = p["measured_heldout"]
    assert m["bits_per_value_total"] <= b + 1e-9 and abs(m["bits_per_value_total"] - p["predicted"]["bits_per_value_total"]) < 1e-9, p
    kept.add(sel["kept"])
    print("ok: %.4g bits: kept %s%s (knapsack %.4g, corrected %s, singles %s), held-out KL %.4g" % (
        b, sel["kept"], " " + sel["single"] if sel["single"] else "", sel["kl_knapsack"], sel["kl_corrected"],
        ",".join("%s=%.4g" % kv for kv in within.items()) or "-", m["kl_mean"]))
# at 8 bits the knapsack's mix (AQUA-KV-4 keys, KIVI streams) measured 0.0049 and KIVI-4 alone 0.0038 when
# this was written: the selection keeps the single method there (a 30% margin; the other points are printed)
assert "single" in kept, kept
print("ok: kept over the points: %s" % ",".join(sorted(kept)))
PY
# a choice that is one candidate everywhere (6.3 bits: only KIVI-2 fits, 6.25) is that candidate's own fit, and
# its selection KL the one measured for the single method (not measured again)
expect 0 "" "search whose choice is a single method" -- "$kvcal" search "${inputs[@]}" --context 256 --eval-tokens 1024 \
  --budget-bits 6.3 --candidates kivi2,kivi4 --out "$tmp/one.kvplan" --json
cp "$tmp/out" "$tmp/one.json"
grep -q "the choice is kivi2 on every stream, its own fit" "$tmp/err" && ok "the single fit taken as it is" ||
  bad "no log of the single fit"
python3 - "$tmp/one.json" <<'PY' || fail=1
import json, sys
r = json.load(open(sys.argv[1]))
p, k = r["plans"][0], r["candidates"][0]
assert k["name"] == "kivi2" and p["choices"] == ["kivi2"] * len(p["choices"]) and p["refit"] is False, p
sel = p["selection"]
assert sel["kept"] == "knapsack" and sel["kl_knapsack"] == k["select_kl"][0], (sel, k)
print("ok: single-method choice: selection KL %.5g reused" % sel["kl_knapsack"])
PY
# pruned contenders (SEARCH.md §5.4): a candidate's own fit under H2O, measured by the selection at each context
# and kept where its measured bits fit the budget and its KL is least, also below the cheapest assembly
expect 2 "select-chunks 0" "--pruned without the selection" -- "$kvcal" search "${common[@]}" --budget-bits 7 \
  --candidates kivi2,kivi4 --pruned kivi4@h2o0.1 --out "$tmp/x.kvplan"
expect 2 "not in --candidates" "--pruned of a candidate not in the list" -- "$kvcal" search "${inputs[@]}" \
  --context 512 --budget-bits 7 --candidates kivi2 --pruned kivi4@h2o0.1 --out "$tmp/x.kvplan"
expect 2 "only h2o prunes throughout" "--pruned with SnapKV" -- "$kvcal" search "${inputs[@]}" --context 512 \
  --budget-bits 7 --candidates kivi4 --pruned kivi4@snapkv0.1 --out "$tmp/x.kvplan"
expect 2 "in (0, 1]" "--pruned with a fraction above 1" -- "$kvcal" search "${inputs[@]}" --context 512 \
  --budget-bits 7 --candidates kivi4 --pruned kivi4@h2o1.5 --out "$tmp/x.kvplan"
expect 1 "AQUA-KV predictor" "--pruned AQUA-KV (the runtime cannot prune predicted streams)" -- "$kvcal" search \
  "${inputs[@]}" --context 512 --budget-bits 7 --candidates kivi4,aqua4 --pruned aqua4@h2o0.1 --out "$tmp/x.kvplan"
grep -q "fitting candidate" "$tmp/err" && bad "the refusal came after a fit" || ok "refused before the first fit"
# at 512 tokens with a 64-token window the cheapest assembly (KIVI-2) is 4.625 bits: 3.5 and 4 bits only the
# pruned contenders can serve (KIVI-2 and KIVI-4 under H2O at 1/10 measured 3.41 and 3.53 bits when this was
# written), 3 bits nothing; at 5 bits both kinds compete
expect 0 "" "search with pruned contenders" -- "$kvcal" search "${inputs[@]}" --context 512 --eval-tokens 1024 \
  --budget-bits 3,3.5,4,5 --candidates kivi2,kivi4 --pruned kivi4@h2o0.1,kivi2@h2o0.1,kivi4@h2o0.2 \
  --out-dir "$tmp/pr" --json
cp "$tmp/out" "$tmp/pr.json"
grep -q "only a pruned contender can serve it" "$tmp/err" && ok "points below the assembly go to the pruned" ||
  bad "no log of the points below the cheapest assembly"
python3 - "$tmp/pr.json" <<'PY' || fail=1
import json, sys
r = json.load(open(sys.argv[1]))
pr = {c["name"]: c for c in r["pruned"]}
assert set(pr) == {"kivi4@h2o0.1", "kivi2@h2o0.1", "kivi4@h2o0.2"}, pr
for c in pr.values():  # held below f16 (the budget is a fraction of the f16 cache; the window stays f16)
    assert 0 < c["select_kl"][0] and 0 < c["bits"][0] < 16 * c["budget"] + 16 * 68 / 512 + 1e-9, c
kept = set()
for p in r["plans"]:
    b = p["budget_bits"]
    assert p["assembly"] == (p["cheapest_bits"] <= b), p
    fits = {n: c for n, c in pr.items() if c["bits"][0] <= b}
    if not p["assembly"] and not fits:
        assert not p["feasible"] and p["plan"] is None, p
        print("ok: %.4g bits: no plan (below the assembly and every pruned contender)" % b)
        continue
    assert p["feasible"], p
    sel = p["selection"]
    assert {x["name"] for x in sel["pruned_within_budget"]} == set(fits), (b, sel)
    tried = [x["kl"] for x in sel["pruned_within_budget"]] + [x["kl"] for x in sel["singles_within_budget"]]
    tried += [k for k in (sel["kl_knapsack"], sel["kl_corrected"]) if k is not None]
    if sel["kept"] == "pruned":
        c = pr[sel["pruned"]]
        assert sel["single"] is None and c["select_kl"][0] == min(tried), (sel, tried)
        assert p["choices"] == [c["candidate"]] * len(p["choices"]) and p["predicted"]["kl_sum"] is None, p
        # the bits the selection measured are the validation's: a pruned plan's bits depend on the context only
        assert abs(p["measured_heldout"]["bits_per_value_total"] - c["bits"][0]) < 1e-9, (p, c)
    else:
        assert p["assembly"] and sel["pruned"] is None, p
    assert p["measured_heldout"]["bits_per_value_total"] <= b + 1e-9, p
    kept.add(sel["kept"])
    print("ok: %.4g bits: kept %s %s, held-out KL %.4g at %.4f bits" % (b, sel["kept"], sel["pruned"] or "",
          p["measured_heldout"]["kl_mean"], p["measured_heldout"]["bits_per_value_total"]))
assert "pruned" in kept and not r["plans"][0]["feasible"] and r["plans"][-1]["assembly"], (kept, r["plans"])
PY
# the kept pruned plan is what kvcal fit writes for that candidate with the pruning keys: every section but
# the provenance byte for byte (the search's KIVI-4 is xquant with a calibrated eta, fitted on the same tokens)
expect 0 "" "kvcal fit of KIVI-4 under H2O at 1/10" -- "$kvcal" fit --model "$model" --tokenizer "$tok" \
  --corpus "$calib" --method xquant --set keys.bits=4 --set values.bits=4 --set xquant.calibrate_eta=true \
  --set data.seq_len=512 --set data.max_tokens=4096 --set cache.recent=64 --set pruning.method=h2o \
  --set pruning.budget=0.1 --out "$tmp/pr-fit.kvplan"
pruned4="$(python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); print([p["plan"] for p in r["plans"] if p.get("selection", {}).get("pruned") == "kivi4@h2o0.1"][0])' "$tmp/pr.json")"
"$kvrun" inspect "$pruned4" --json --full > "$tmp/pr-a.json" && "$kvrun" inspect "$tmp/pr-fit.kvplan" --json --full > "$tmp/pr-b.json" ||
  bad "kvrun inspect of the pruned plans"
python3 - "$tmp/pr-a.json" "$tmp/pr-b.json" <<'PY' || fail=1
import json, sys
a, b = (json.load(open(f)) for f in sys.argv[1:3])
crc = lambda d: {x["tag"]: x["crc32"] for x in d["format"]["sections"] if x["tag"] != "PROV"}
assert crc(a) == crc(b) and a["global"] == b["global"] and a["global"]["prune_method"] == "h2o", (crc(a), crc(b))
print("ok: the search's pruned plan is kvcal fit's with pruning.method=h2o, budget 0.1 (sections %s)" % ",".join(sorted(crc(a))))
PY
expect 0 "" "kvrun eval reads the pruned 4-bit plan" -- "$kvrun" eval --model "$model" --tokenizer "$tok" \
  --plan "$tmp/pr/search-ctx512-4bits.kvplan" --text "$heldout" --ctx 512 --max-tokens 1024 --json
python3 "$check_same" "$tmp/out" "$tmp/pr.json" 4 512 || fail=1
# per-layer options of the pruned contenders (SEARCH.md §5.5): refusals, then KIVI-4 and KIVI-2 under H2O at 1/10
# with each layer on either candidate at 1/20, 1/10, 1/5 or 2/5 instead. 3 bits, which the uniform contenders
# could not serve (3.41 bits and up), is served per layer; the table's bits add (memory per value is a sum over
# layers, whatever each layer's quantizer)
expect 2 "give --pruned" "--pruned-layers without --pruned" -- "$kvcal" search "${inputs[@]}" --context 512 \
  --budget-bits 7 --candidates kivi4 --pruned-layers 0.5 --out "$tmp/x.kvplan"
expect 2 "other than 1" "--pruned-layers 1" -- "$kvcal" search "${inputs[@]}" --context 512 --budget-bits 7 \
  --candidates kivi4 --pruned kivi4@h2o0.1 --pruned-layers 0.5,1 --out "$tmp/x.kvplan"
expect 0 "" "search with per-layer options" -- "$kvcal" search "${inputs[@]}" --context 512 --eval-tokens 1024 \
  --budget-bits 3,4 --candidates kivi2,kivi4 --pruned kivi4@h2o0.1,kivi2@h2o0.1 --pruned-layers 0.5,2,4 \
  --out-dir "$tmp/ly" --json
cp "$tmp/out" "$tmp/ly.json"
python3 - "$tmp/ly.json" <<'PY' || fail=1
import json, sys
r = json.load(open(sys.argv[1]))
pr = {c["name"]: c for c in r["pruned"]}
mixed = False
for c in r["pruned"]:
    ly = c["layers"]
    opts = [(o["candidate"], o["multiplier"]) for o in ly["options"]]
    assert opts == [(q, m) for q in ("kivi4", "kivi2") for m in (1, 0.5, 2, 4)], opts
    assert len(ly["dkl"]) == 1 and len(ly["dkl"][0]) == 5 and len(ly["dkl"][0][0]) == 8, ly
    own = opts.index((c["candidate"], 1))
    for l in range(5):
        row = ly["dbits"][0][l]
        assert ly["dkl"][0][l][own] == 0 and row[own] == 0, (c["name"], l)  # the contender itself: not measured
        for q in (0, 4):  # per candidate, fewer kept tokens hold less memory, more hold more
            assert row[q + 1] < row[q] < row[q + 2] < row[q + 3], (c["name"], l, row)
    for p in r["plans"]:
        b, sel = p["budget_bits"], p["selection"]
        t = [x for x in sel["pruned_layers"] if x["name"] == c["name"]][0]
        assert t["state"] == "measured", t
        # the prediction recomputed: the contender as the selection measured it plus the table's changes (measured on
        # a chunk of their own), each layer's option found from its candidate and budget
        assert ly["kl"][0] != c["select_kl"][0], (ly, c)
        kl, bits = c["select_kl"][0], c["bits"][0]
        for l, (q, x) in enumerate(zip(t["candidates"], t["budgets"])):
            o = [i for i, o in enumerate(ly["options"]) if o["candidate"] == q and abs(o["budget"] - x) < 1e-7][0]
            kl += ly["dkl"][0][l][o]
            bits += ly["dbits"][0][l][o]
        mixed |= len(set(t["candidates"])) > 1
        assert abs(kl - t["predicted_kl"]) < 1e-6 and abs(bits - t["predicted_bits"]) < 1e-7, (t, kl, bits)
        # bits add over layers exactly on one text; the selection measures on another, where a head whose kept
        # tokens happen to be consecutive stores no positions (RUNTIME.md §8): a few 1e-4 bits fewer or more
        assert t["predicted_bits"] <= b + 1e-9 and abs(t["bits"] - t["predicted_bits"]) < 2e-3 * b, t
        print("ok: %s, %.4g bits: %s, KL %.4g predicted %.4g, %.4f bits" % (c["name"], b, list(zip(t["candidates"],
              t["budgets"])), t["kl"], t["predicted_kl"], t["bits"]))
assert mixed, "no allocation mixed the two quantizers"
for p in r["plans"]:
    sel = p["selection"]
    tried = [x["kl"] for x in sel["pruned_within_budget"] + sel["singles_within_budget"] + sel["pruned_layers"]]
    tried += [k for k in (sel["kl_knapsack"], sel["kl_corrected"]) if k is not None]
    if sel["layered"]:
        t = [x for x in sel["pruned_layers"] if x["name"] == sel["pruned"]][0]
        assert sel["kept"] == "pruned" and t["kl"] == min(tried), (sel, tried)
        assert abs(p["measured_heldout"]["bits_per_value_total"] - t["bits"]) < 1e-9, (p, t)
        assert p["choices"] == [q for q in t["candidates"] for _ in "KV"], (p["choices"], t)
p3 = r["plans"][0]
assert p3["budget_bits"] == 3 and p3["feasible"] and not p3["assembly"] and p3["selection"]["layered"], p3
PY
for b in 3 4; do
  "$kvrun" inspect "$tmp/ly/search-ctx512-${b}bits.kvplan" --json > "$tmp/ly-$b.json" || bad "kvrun inspect of the $b-bit plan"
  python3 - "$tmp/ly-$b.json" "$tmp/ly.json" $b <<'PY' || fail=1
import json, sys
d, r = (json.load(open(f)) for f in sys.argv[1:3])
p = [p for p in r["plans"] if p["budget_bits"] == float(sys.argv[3])][0]
if p["selection"]["layered"]:
    t = [x for x in p["selection"]["pruned_layers"] if x["name"] == p["selection"]["pruned"]][0]
    got = [x["prune_budget"] or d["global"]["prune_budget"] for x in d["layers"]]
    assert d["global"]["prune_method"] == "h2o" and all(abs(a - b) < 1e-7 for a, b in zip(got, t["budgets"])), (got, t)
    bits = [int(q[4:]) for q in t["candidates"]]  # kivi2 / kivi4
    assert [x["K"]["bits"] for x in d["layers"]] == bits and [x["V"]["bits"] for x in d["layers"]] == bits, d["layers"]
    print("ok: the written %s-bit plan's layers are the allocation's" % sys.argv[3], list(zip(t["candidates"], got)))
PY
done
expect 0 "" "kvrun eval reads the per-layer 3-bit plan" -- "$kvrun" eval --model "$model" --tokenizer "$tok" \
  --plan "$tmp/ly/search-ctx512-3bits.kvplan" --text "$heldout" --ctx 512 --max-tokens 1024 --json
python3 "$check_same" "$tmp/out" "$tmp/ly.json" 3 512 || fail=1
expect 1 "the selection" "a corpus too short for the selection" -- "$kvcal" search "${inputs[@]}" --context 256 \
  --eval-tokens 1024 --select-chunks 100000 --budget-bits 8 --candidates kivi2,kivi4 --out "$tmp/x.kvplan"
[ -e "$tmp/x.kvplan" ] && bad "a refused selection wrote a plan"
for b in 7.3 8; do
  expect 0 "" "kvrun eval reads the selection's $b-bit plan" -- "$kvrun" eval --model "$model" --tokenizer "$tok" \
    --plan "$tmp/sel/search-ctx256-${b}bits.kvplan" --text "$heldout" --ctx 256 --max-tokens 1024 --json
  python3 "$check_same" "$tmp/out" "$tmp/sel.json" $b 256 || fail=1
done
for b in 6.5 8; do
  expect 0 "" "kvrun eval reads the $b-bit plan" -- "$kvrun" eval --model "$model" --tokenizer "$tok" \
    --plan "$tmp/sq/search-ctx256-${b}bits.kvplan" --text "$heldout" --ctx 256 --max-tokens 1024 --json
  python3 "$check_same" "$tmp/out" "$tmp/sq.json" $b 256 || fail=1
done
# without --heldout: validated on the corpus's tokens after every token the search reads (said on stderr and in the
# JSON); a corpus with no room for one validation chunk after them is refused before any fit
nohold=(--model "$model" --tokenizer "$tok" --corpus "$calib" --fit-tokens 4096 --sens-ctx 128 --prompts 4
        --set cache.recent=64 --select-chunks 0 --context 256 --eval-chunks 2 --candidates kivi2,kivi4 --budget-bits 7)
expect 0 "no --heldout: the plans are validated on the corpus's tokens 5120..5630" "search without --heldout" -- \
  "$kvcal" search "${nohold[@]}" --out "$tmp/nh.kvplan" --json
python3 - "$tmp/out" <<'PY' && ok "JSON names the corpus tail as the held-out text" || bad "JSON without --heldout"
import json, sys
r = json.load(open(sys.argv[1]))
assert r["heldout"] == "corpus tokens from 5120", r["heldout"]
assert r["plans"][0]["feasible"] and r["plans"][0]["measured_heldout"]["kl_mean"] > 0
PY
head -c 8000 "$calib" > "$tmp/short.txt"
expect 1 "without --heldout, validates on the tokens after them" "a corpus without room to validate" -- \
  "$kvcal" search "${nohold[@]}" --corpus "$tmp/short.txt" --out "$tmp/nh2.kvplan"
[ ! -e "$tmp/nh2.kvplan" ] && ok "no plan from the refused search" || bad "refused search wrote a plan"
exit $fail
