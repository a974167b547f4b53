#!/usr/bin/env bash
# tools/CLI.md is what scripts/cli-reference.sh prints from the tools' --help: the reference cannot drift.
set -u
bin="$1"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
tmp="$(mktemp)"
trap 'rm -f "$tmp"' EXIT
bash "$root/scripts/cli-reference.sh" "$(cd "$bin/.." && pwd)" > "$tmp" || { echo "FAIL: cli-reference.sh"; exit 1; }
if diff -u "$root/tools/CLI.md" "$tmp"; then
  echo "ok: tools/CLI.md matches the tools' --help"
else
  echo "FAIL: tools/CLI.md differs from the tools' --help: regenerate it with scripts/cli-reference.sh BUILD > tools/CLI.md"
  exit 1
fi
