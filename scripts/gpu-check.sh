#!/usr/bin/env bash
# The GPU runtime's one prepared check (kernels/RUNTIME.md §10.7) for a lent GPU machine, which has the CUDA
# libraries and nothing of this project: everything is built and prepared here, carried there, and run in one call.
#
#   scripts/gpu-check.sh pack [BUILD_DIR] [DIR]    (here; BUILD_DIR built with nvcc, default build; DIR default
#                                                  .devrun, git-ignored through .git/info/exclude; the models,
#                                                  plans and CPU results already in DIR are kept: KV_GPU_REFRESH=1
#                                                  makes them again)
#     - the binaries (kvrun, the CPU-vs-GPU harnesses, the benchmarks) and the CPU libraries they load, in one
#       xz archive;
#     - the models: stories260K, and SmolLM2-135M's layers 0-2 and 21-29 with its embedding in Q4_1 (a real model's
#       weights and activations in the 64 MiB a call may carry; the whole file is 94 MB: tests/bench/gguf_slice.c);
#     - a plan of every method the device serves for each (kvcal fit here: KIVI, HIGGS, AQUA-KV, XQuant, SQuat,
#       FP8, NVFP4, KVmix RPC with per-layer bits) and the CPU's evaluation of each (kvrun eval --plan --json
#       --predictions, f16 weights as the GPU holds them; and f32 for one plan), to compare with;
#     - run.sh and compare.py.
#   bash DIR/run.sh [STEPS]                       (there; results in $OUT/results.tar.gz and $OUT/summary.txt)
#                                                  STEPS: a comma list of selfcheck,harness,eval,bench,sanitize
#                                                  (default all), in this order, each step under a timeout so that
#                                                  the whole call ends in about 7 minutes:
#     1. kvrun selfcheck --device cuda: every kind of codec, and a real plan (its cost);
#     2. the harness: test_kernels_cuda (quantizers, CPU vs GPU) and test_runtime_cuda (every runtime case on the GPU
#        against the bound, the replay and the host model's bits; long sequences; the self-check catalogue);
#     3. kvrun eval --device cuda against the CPU on both models, exact and with each plan: perplexity within 0.1%,
#        top-1 agreement between the devices' predictions >= 0.99 (compare.py);
#     4. bench_attend_cuda (fused decoding attention vs the f16 baseline and the copy bandwidth) and bench_model_cuda
#        (whole-model decoding);
#     5. compute-sanitizer: memcheck on a quarter of the harness's cases, racecheck on a few short ones.
#   The last lines printed are the summary; full logs and JSON are in the output folder (BENCHMARKS.md "GPU runtime").
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
[ "${1:-}" = pack ] || { sed -n '2,27p' "$0"; exit 2; }
build="${2:-$here/build}"
dir="${3:-$here/.devrun}"
data="$(bash "$here/scripts/data-dir.sh")"
bins=(tools/kvrun tests/runtime/test_runtime_cuda tests/kernels/test_kernels_cuda tests/bench/bench_attend_cuda
      tests/bench/bench_model_cuda)
for b in "${bins[@]}" tools/kvcal tests/bench/gguf_slice; do
  [ -x "$build/$b" ] || { echo "gpu-check: $build/$b missing: build with nvcc present (scripts/build.sh)" >&2; exit 1; }
done
smollm="$(bash "$here/scripts/fetch-model.sh")"
[ "${KV_GPU_REFRESH:-0}" = 1 ] && rm -rf "$dir"
rm -rf "$dir/pkg" "$dir/pkg.tar.xz"
mkdir -p "$dir/pkg/bin" "$dir/pkg/lib" "$dir/data" "$dir/ref"
grep -qx '/.devrun/' "$here/.git/info/exclude" 2>/dev/null || echo '/.devrun/' >> "$here/.git/info/exclude"
for b in "${bins[@]}"; do cp "$build/$b" "$dir/pkg/bin/"; done
# Every library the binaries resolve here except CUDA's (the GPU machine has its own, matching its driver) and the
# C runtime's (the loader must match the system it runs on).
for b in "${bins[@]}"; do ldd "$build/$b"; done | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}' | sort -u |
  grep -Ev '^(libcuda|libcudart|libcublas|libcublasLt|libcusolver|libcusparse|libnvJitLink|libc|libm|libdl|libpthread|librt|libstdc\+\+|libgcc_s)\.so' |
  while read -r name path; do cp -L "$path" "$dir/pkg/lib/$name"; done
tar -C "$dir" -cJf "$dir/pkg.tar.xz" pkg
rm -rf "$dir/pkg"

# ---- models, text, plans and the CPU's results (made once: minutes of fitting and evaluating) ----
if [ ! -s "$dir/ref/done" ]; then
rm -f "$dir/ref/evals.txt"
cp "$data/stories260K/stories260K.bin" "$data/stories260K/tok512.bin" "$dir/data/"
"$build/tests/bench/gguf_slice" "$smollm" "$dir/data/smol11.gguf" --keep 0-2,21-29 --embd-q4_1
head -c 60000 "$data/wikitext-2-raw/wiki.test.raw" > "$dir/data/held.txt" # 4096 tokens are evaluated
calib="$build/gpu-check-calib.txt" # not carried
head -c 400000 "$data/wikitext-2-raw/wiki.valid.raw" > "$calib"
kvcal=("$build/tools/kvcal" fit --corpus "$calib" --no-checkpoint -q)
fit() { # model-name model-path layers method-name kvcal-args...
  local name="$1" path="$2" L="$3" m="$4"
  shift 4
  "${kvcal[@]}" --model "$path" --out "$dir/data/$name-$m.kvplan" "$@" > /dev/null
}
for spec in "stories $dir/data/stories260K.bin 5 256 4096" "smol11 $dir/data/smol11.gguf 11 512 4096"; do
  read -r name path L ctx maxtok <<< "$spec"
  half=$((L / 2)); [ $((half % 2)) = 1 ] || half=$((half + 1))
  common=(--seq-len "$ctx" --max-tokens 12000)
  fit "$name" "$path" "$L" kivi2 --method kivi --bits 2 "${common[@]}"
  fit "$name" "$path" "$L" higgs2 --method higgs --bits 2 "${common[@]}"
  fit "$name" "$path" "$L" aqua2 --method aqua --bits 2 "${common[@]}"
  fit "$name" "$path" "$L" xquant --method xquant --set xquant.km=$half --set xquant.vm=$half \
    --set xquant.kq=$(((L - 1) / 2 * 2)) "${common[@]}"
  fit "$name" "$path" "$L" squat --method squat "${common[@]}"
  fit "$name" "$path" "$L" fp8 --method fp8 "${common[@]}"
  fit "$name" "$path" "$L" nvfp4 --method nvfp4 "${common[@]}"
  fit "$name" "$path" "$L" kvmix --method kivi --bits 2 --set cache.rpc_ratio=0.2 --set layers.0.key_bits=4 \
    --set layers.0.value_bits=4 "${common[@]}"
  for plan in "$dir/data/$name"-*.kvplan; do
    m="$(basename "$plan" .kvplan)"
    for w in f16 f32; do
      [ "$w" = f32 ] && [ "$m" != "$name-kivi2" ] && continue
      tag="$m"; [ "$w" = f32 ] && tag="$m-f32"
      "$build/tools/kvrun" eval --model "$path" --text "$dir/data/held.txt" --ctx "$ctx" --max-tokens "$maxtok" \
        --plan "$plan" --weights "$w" --json --predictions "$dir/ref/$tag.pred" > "$dir/ref/$tag.json" 2> /dev/null
      echo "$name ${path#"$dir"/} $ctx $maxtok ${plan#"$dir"/} $w $tag" >> "$dir/ref/evals.txt"
    done
  done
done
date -u +%FT%TZ > "$dir/ref/done"
fi

cat > "$dir/compare.py" <<'PY'
# CPU vs GPU evaluations of the same plans (run.sh): perplexity exact and through the cache within 0.1% relative,
# the devices' top-1 predictions agreeing on >= 99% of the positions, exact and through the cache.
import array, json, os, sys
ref, gpu = sys.argv[1], sys.argv[2]
rows, bad = [], 0
for line in open(os.path.join(ref, "evals.txt")):
    name, path, ctx, maxtok, plan, w, tag = line.split()
    try:
        c = json.load(open(os.path.join(ref, tag + ".json")))
        g = json.load(open(os.path.join(gpu, tag + ".json")))
    except Exception as e:
        rows.append((tag, "missing", str(e)[:60])); bad += 1; continue
    def preds(d):
        a = array.array("i"); a.frombytes(open(os.path.join(d, tag + ".pred"), "rb").read()); n = len(a) // 2
        return a[:n], a[n:]
    (ce, cc), (ge, gc) = preds(ref), preds(gpu)
    agree_e = sum(x == y for x, y in zip(ce, ge)) / max(1, len(ce))
    agree_c = sum(x == y for x, y in zip(cc, gc)) / max(1, len(cc))
    d_ref = abs(g["ppl_uncompressed"] / c["ppl_uncompressed"] - 1)
    d_plan = abs(g["ppl"] / c["ppl"] - 1)
    ok = d_ref <= 1e-3 and d_plan <= 1e-3 and agree_e >= 0.99 and agree_c >= 0.99
    bad += not ok
    rows.append((tag, "ok" if ok else "MISS",
                 "ppl exact cpu %.4f gpu %.4f (%.4f%%), plan cpu %.4f gpu %.4f (%.4f%%), top-1 agree exact %.4f plan %.4f, "
                 "kl cpu %.3g gpu %.3g, bits %.3f/%.3f" % (c["ppl_uncompressed"], g["ppl_uncompressed"], 100 * d_ref,
                 c["ppl"], g["ppl"], 100 * d_plan, agree_e, agree_c, c["kl_mean"], g["kl_mean"],
                 c["bits_per_value_total"], g["bits_per_value_total"])))
for r in rows: print("%-22s %-4s %s" % r)
print("eval: %d of %d comparisons outside the targets" % (bad, len(rows)))
json.dump([{"plan": r[0], "verdict": r[1], "detail": r[2]} for r in rows], open(os.path.join(gpu, "eval.json"), "w"), indent=1)
PY

cat > "$dir/run.sh" <<'RUN'
#!/usr/bin/env bash
# The GPU check (scripts/gpu-check.sh). Every step has a timeout; the summary is printed last.
set -u
cd "$(dirname "$0")"
# everything goes to out/ here, and after every step into one archive in $OUT (a call brings back at most 8 files)
final="${OUT:-$PWD/final}"
out="$PWD/out"
mkdir -p "$out" "$final" gpu
save() { tar -C "$PWD" -czf "$final/results.tar.gz" out 2>/dev/null; cp "$out/summary.txt" "$final/" 2>/dev/null; }
tar -xJf pkg.tar.xz
cuda_libs=$(dirname "$(find / -name 'libcublasLt.so.13*' -not -path '/proc/*' 2>/dev/null | head -1)")
export LD_LIBRARY_PATH="$PWD/pkg/lib:$cuda_libs:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
export KVCAL_THREADS=8
bin=pkg/bin
summary="$out/summary.txt"
: > "$summary"
step() { # name timeout log command...
  local name="$1" t="$2" log="$3"; shift 3
  local t0=$SECONDS
  timeout "$t" "$@" > "$out/$log" 2> "$out/$log.err"
  local rc=$?
  echo "$(printf '%-28s' "$name") exit $rc, $((SECONDS - t0)) s, log $log" | tee -a "$summary"
  save
  return 0
}
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv > "$out/gpu.txt" 2>&1
cat "$out/gpu.txt"
want() { [ -z "${1:-}" ] || [[ ",$steps," == *",$2,"* ]]; }
steps="${1:-selfcheck,harness,eval,bench,sanitize}"
if want x selfcheck; then
step "selfcheck catalogue" 90 selfcheck.json $bin/kvrun selfcheck --device cuda --json
step "selfcheck smol11 aqua2" 60 selfcheck_plan.json $bin/kvrun selfcheck --device cuda --plan data/smol11-aqua2.kvplan \
  --model data/smol11.gguf --json
fi
if want x harness; then
step "test_kernels_cuda" 60 test_kernels_cuda.txt $bin/test_kernels_cuda
step "test_runtime_cuda" 150 test_runtime_cuda.txt $bin/test_runtime_cuda
fi
if want x eval; then
t0=$SECONDS
while read -r name path ctx maxtok plan w tag; do
  timeout 60 $bin/kvrun eval --device cuda --model "$path" --text data/held.txt --ctx "$ctx" --max-tokens "$maxtok" \
    --plan "$plan" --weights "$w" --json --predictions "gpu/$tag.pred" > "gpu/$tag.json" 2> "gpu/$tag.err"
  cp "gpu/$tag.json" "gpu/$tag.err" "$out/" 2>/dev/null
done < ref/evals.txt
python3 compare.py ref gpu > "$out/eval.txt" 2>&1
echo "$(printf '%-28s' 'eval cpu vs gpu') $(tail -1 "$out/eval.txt"), $((SECONDS - t0)) s" | tee -a "$summary"
save
fi
if want x bench; then
step "bench_attend_cuda" 80 bench_attend.txt $bin/bench_attend_cuda --json "$out/bench_attend.json" --reps 10
step "bench_model_cuda" 80 bench_model.txt $bin/bench_model_cuda --contexts 4096,16384,32768 --batches 1 \
  --methods f16,kivi-2,aqua-2,aqua-2k --steps 12 --json "$out/bench_model.json"
step "bench_model_cuda batch 8" 45 bench_model_b8.txt $bin/bench_model_cuda --contexts 32768 --batches 8 \
  --methods f16,kivi-2 --steps 8 --json "$out/bench_model_b8.json"
fi
if want x sanitize; then
step "memcheck (quarter)" 75 memcheck.txt env KV_CUDA_QUICK=1 compute-sanitizer --tool memcheck --leak-check full \
  $bin/test_runtime_cuda
step "racecheck (tiny cases)" 90 racecheck.txt env KV_CUDA_TINY=1 compute-sanitizer --tool racecheck \
  --racecheck-report all $bin/test_runtime_cuda
fi
echo "== summary"
cat "$summary"
echo "== harness"; grep -E "Checks|FAIL|differ from the host model" "$out/test_runtime_cuda.txt" | grep -v " 0 of " | tail -8
grep -E "Checks" "$out/test_kernels_cuda.txt" | tail -2
echo "== selfcheck"; python3 -c "
import json; d=json.load(open('$out/selfcheck.json')); print('failed', d['failed'], 'of', len(d['checks']), 'max s', max(c['seconds'] for c in d['checks']))
[print(c['codec'], c['what'][:200]) for c in d['checks'] if not c['passed']]" 2>&1 | tail -6
echo "== eval"; tail -20 "$out/eval.txt"
echo "== sanitizers"; grep -E "ERROR SUMMARY|RACECHECK SUMMARY|Checks" "$out/memcheck.txt" "$out/racecheck.txt" | tail -6
echo "== bench"; tail -30 "$out/bench_attend.txt"; tail -16 "$out/bench_model.txt"; tail -4 "$out/bench_model_b8.txt"
save
RUN
echo "gpu-check: $(du -sh "$dir" | cut -f1) in $dir ($(du -sh "$dir/pkg.tar.xz" | cut -f1) of binaries); there: bash ${dir#"$here"/}/run.sh"
