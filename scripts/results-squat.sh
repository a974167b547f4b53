#!/usr/bin/env bash
# SQuat's RESULTS.md rows (issue 15): SmolLM2-135M calibrated on wiki.valid.raw, evaluated on
# wiki.test.raw with a prompt of --prefill tokens followed by single-token decoding (--step 1, the
# regime SQuat is for), every plan at 2 bits for keys and values (equal bits per value: SQuat keys
# are stored exactly as KIVI's):
#   kivi2               KIVI-2 (--method kivi)
#   squat2-paper        SQuat-2, the paper's r = 5, lambda = 1e-3 on every layer (squat.choose=fixed), prompt subspace
#   squat2-cal          SQuat-2, r and lambda chosen per layer by calibration (calib/FIT.md §3.3), prompt subspace
#   squat2-paper-static the paper's setting with the static calibration basis (squat.subspace=static)
#   squat2-cal-static   calibrated, static basis
# Columns: bits per value, ppl, KL, top-1 agreement (kvrun eval), then the held-out attention errors
# the fit measured (mean over layers of the softmax-output and score errors of the plan's SQuat
# setting; for kivi2 the uniform quantizer's, as measured in the squat2-cal fit), and fit seconds.
# Needs the runtime that applies SQuat plans (kernels/rt, issue 15's runtime half).
#   scripts/results-squat.sh [--build DIR] [--out DIR] [--fit-tokens N] [--seq-len N] [--eval-tokens N]
#                            [--ctx N] [--prefill N] [-t N] [NAME ...]
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="$here/build"; out=""; fit_tokens=16384; seq_len=512; eval_tokens=4096; ctx=1024; prefill=512; threads=""
while [ $# -gt 0 ]; do
  case "$1" in
    --build) build="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    --fit-tokens) fit_tokens="$2"; shift 2 ;;
    --seq-len) seq_len="$2"; shift 2 ;;
    --eval-tokens) eval_tokens="$2"; shift 2 ;;
    --ctx) ctx="$2"; shift 2 ;;
    --prefill) prefill="$2"; shift 2 ;;
    -t) threads="$2"; shift 2 ;;
    -h|--help) sed -n '2,17p' "$0"; exit 0 ;;
    -*) echo "results-squat: unknown option '$1'" >&2; exit 2 ;;
    *) break ;;
  esac
done
names=("$@")
[ ${#names[@]} -gt 0 ] || names=(squat2-cal squat2-paper squat2-cal-static squat2-paper-static kivi2) # kivi2 last: its errors come from the squat2-cal fit
model="$(bash "$here/scripts/fetch-model.sh" | tail -n 1)"
data="$(bash "$here/scripts/data-dir.sh")"
[ -n "$out" ] || out="$build/results/squat"
mkdir -p "$out"
calib="$data/wikitext-2-raw/wiki.valid.raw"
test_text="$data/wikitext-2-raw/wiki.test.raw"
targs=(); [ -n "$threads" ] && targs=(-t "$threads")
echo "| plan | bits/value | ppl | KL | top-1 | softmax-output err | score err | fit s |"
echo "|---|---|---|---|---|---|---|---|"
for name in "${names[@]}"; do
  case "$name" in
    kivi2) fit=(--method kivi) ;;
    squat2-paper) fit=(--method squat --set squat.choose=fixed) ;;
    squat2-cal) fit=(--method squat) ;;
    squat2-paper-static) fit=(--method squat --set squat.choose=fixed --set squat.subspace=static) ;;
    squat2-cal-static) fit=(--method squat --set squat.subspace=static) ;;
    *) echo "results-squat: unknown configuration '$name'" >&2; exit 2 ;;
  esac
  plan="$out/$name.kvplan"
  echo "== $name: kvcal fit ${fit[*]} ($fit_tokens tokens of wiki.valid.raw, sequences of $seq_len)" >&2
  start=$(date +%s.%N)
  "$build/tools/kvcal" fit --model "$model" --corpus "$calib" --out "$plan" "${fit[@]}" --bits 2 \
      --seq-len "$seq_len" --max-tokens "$fit_tokens" --no-checkpoint -q "${targs[@]}" > "$out/$name.fit.txt"
  end=$(date +%s.%N)
  "$build/tools/kvrun" inspect --json "$plan" > "$out/$name.plan.json"
  echo "== $name: kvrun eval --prefill $prefill --step 1 ($eval_tokens tokens of wiki.test.raw, ctx $ctx)" >&2
  "$build/tools/kvrun" eval --model "$model" --text "$test_text" --ctx "$ctx" --max-tokens "$eval_tokens" \
      --plan "$plan" --prefill "$prefill" --step 1 --json "${targs[@]}" > "$out/$name.json"
  python3 - "$out/$name.json" "$out/$name.plan.json" "$out/squat2-cal.plan.json" "$name" "$start" "$end" <<'PY'
import json, math, os, sys
ev = json.load(open(sys.argv[1])); plan = json.load(open(sys.argv[2])); name = sys.argv[4]
def mean_metric(p, key):
    rows = [r[key] for r in p.get("report", {}).get("rows", []) if r["stream"] == "K" and r.get(key) is not None]
    return sum(rows) / len(rows) if rows else float("nan")
src, pre = plan, "squat_"
if name == "kivi2":  # the uniform quantizer's errors, as the squat2-cal fit measured them
    src = json.load(open(sys.argv[3])) if os.path.exists(sys.argv[3]) else {}
    pre = "squat_kivi_"
out_err, score_err = mean_metric(src, pre + "out_err"), mean_metric(src, pre + "score_err")
ev["squat_out_err_mean"], ev["squat_score_err_mean"] = out_err, score_err
ev["fit_seconds"] = float(sys.argv[6]) - float(sys.argv[5])
json.dump(ev, open(sys.argv[1], "w"))
print("| %s | %.3f | %.4f | %.4f | %.4f | %.4f | %.4f | %.0f |" % (name, ev["bits_per_value"], ev["ppl"], ev["kl_mean"],
      ev["top1_agreement"], out_err, score_err, ev["fit_seconds"]))
PY
done
