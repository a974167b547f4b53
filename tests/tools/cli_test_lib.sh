# Sourced by the command-line tests on stories260K (tests/tools/*.sh): the data paths (exit 77 =
# skipped without the data), a temporary directory removed on exit, and the pass/fail helpers.
# Sets data model tok calib heldout tmp fail; defines ok, bad, expect.
data="${KVCAL_DATA_DIR:-}"
if [ -z "$data" ] || [ ! -f "$data/stories260K/stories260K.bin" ]; then
  echo "skipped: no stories260K in KVCAL_DATA_DIR"
  exit 77
fi
model="$data/stories260K/stories260K.bin"
tok="$data/stories260K/tok512.bin"
calib="$data/wikitext-2-raw/wiki.valid.raw"
heldout="$data/wikitext-2-raw/wiki.test.raw"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
fail=0
ok() { echo "ok: $*"; }
bad() { echo "FAIL: $*"; fail=1; }
# expect CODE PATTERN DESCRIPTION -- command...: the exit code, and PATTERN (when not empty) in what
# the command printed (stderr or stdout)
expect() {
  local want="$1" pat="$2" what="$3"
  shift 4
  "$@" > "$tmp/out" 2> "$tmp/err"
  local got=$?
  if [ "$got" -ne "$want" ]; then
    echo "FAIL: $what: exit $got, expected $want"; cat "$tmp/err"; fail=1
  elif [ -n "$pat" ] && ! grep -q -- "$pat" "$tmp/err" "$tmp/out"; then
    echo "FAIL: $what: output does not match '$pat':"; cat "$tmp/err"; fail=1
  else
    echo "ok: $what"
  fi
}
