#!/usr/bin/env bash
# plan_baseline.sh BUILD_DIR OUT_DIR — a plan of every method (and the search, pruning, KVmix layers,
# XQuant's target bits) on stories260K, each with its digest (plan_digest.py) in OUT_DIR/digests.txt.
# Run it with the build before a refactor and the build after, then diff the two digests.txt: a
# refactor that must not change behaviour leaves every line equal. Fits are small (16K tokens) and
# seeded; the same machine gives the same plans (BLAS kernels differ between machines).
set -euo pipefail
b="$(cd "$1" && pwd)"; out="$2"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
data="${KVCAL_DATA:-$here/../shared/data}"
model="$data/stories260K/stories260K.bin"
corpus="$data/wikitext-2-raw/wiki.valid.raw"
heldout="$data/wikitext-2-raw/wiki.test.raw"
mkdir -p "$out"
export SOURCE_DATE_EPOCH=0 KVCAL_THREADS=2
fit() { # name, then kvcal fit options
    local name="$1"; shift
    [ -f "$out/$name.kvplan" ] && return 0
    "$b/tools/kvcal" fit -q --model "$model" --corpus "$corpus" --seq-len 256 --max-tokens 16384 --no-checkpoint \
        --out "$out/$name.kvplan" "$@" > "$out/$name.log" 2>&1 || { cat "$out/$name.log" >&2; exit 1; }
}
fit kivi2 --method kivi --bits 2
fit kivi4 --method kivi --bits 4
fit kivi3-pack10 --method kivi --bits 3 --set keys.pack3=10 --set values.pack3=10
fit kivi-f32 --method kivi --bits 2 --set keys.scale_dtype=f32 --set cache.pre_rope=false
fit higgs2 --method higgs --bits 2
fit aqua2 --method aqua --bits 2
fit aqua-lowrank --method aqua --bits 2 --set aqua.rank=8
fit aqua-q4 --method aqua --bits 2 --set aqua.predictor_bits=4 --set aqua.predictor_group=16
fit aqua-uniform --method aqua-uniform --bits 2
fit fp8 --method fp8
fit fp8-head --method fp8 --scale-granularity head
fit nvfp4 --method nvfp4
fit xquant --method xquant --bits 2 --set xquant.km=2 --set xquant.vq=3
fit xquant-target --method xquant --target-bits 2.5
fit squat --method squat --bits 2
fit squat-static --method squat --bits 2 --set squat.subspace=static --set squat.choose=fixed
printf 'layers:\n  0: {key_bits: 4, value_bits: 4, rpc_ratio: 0.2}\n  3: {key_bits: 3, value_bits: 3}\n' > "$out/kvmix.yaml"
fit kvmix --method kivi --bits 2 --config "$out/kvmix.yaml"
fit snapkv --method kivi --bits 4 --set pruning.method=snapkv --set pruning.budget=0.5
fit pyramidkv --method kivi --bits 16 --set pruning.method=pyramidkv --set pruning.budget=0.25
[ -f "$out/search.kvplan" ] || "$b/tools/kvcal" search -q --model "$model" --corpus "$corpus" --heldout "$heldout" --budget-bits 4 \
    --candidates kivi2,kivi4,higgs2,aqua2 --fit-tokens 8192 --context 2048 --select-chunks 2 --out "$out/search.kvplan"
python3 "$here/tests/tools/plan_digest.py" "$out"/*.kvplan | sed "s|$out/||" > "$out/digests.txt"
cat "$out/digests.txt"
