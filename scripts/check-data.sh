#!/usr/bin/env bash
# Verify the sha256 sums of the shared data (data/README.md lists them).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dir="$(bash "$here/scripts/data-dir.sh")"
cd "$dir"
sha256sum --quiet -c - <<'SUMS'
4cd0f6876d07a413aa911261ff6d363c72d757d47f0fdd6015702014c89cb9c7  wikitext-2-raw/wiki.valid.raw
173c87a53759e0201f33e0ccf978e510c2042d7f2cb78229d9a50d79b9e7dd08  wikitext-2-raw/wiki.test.raw
b0a507e7ad0f626624f17112325e66691f9076d622e1d3274d103d00299f2696  stories260K/stories260K.bin
037cb335abb25d1fa9e8ecae30ed2a3a8ace9302862ebcdc05d51a6bbb10c312  stories260K/tok512.bin
SUMS
echo "check-data: $dir verified"
