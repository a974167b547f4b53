#!/usr/bin/env bash
# Every tool answers --help and --version; every subcommand listed in a tool's --help answers
# --help with exit 0 and a usage line that names it once; an unknown command and an unknown option
# exit 2.
set -u
bin="$1"
fail=0
check() { # expected-code description command...
  local want="$1" what="$2"; shift 2
  "$@" >/dev/null 2>&1
  local got=$?
  if [ "$got" -ne "$want" ]; then echo "FAIL: $what: exit $got, expected $want"; fail=1; else echo "ok: $what"; fi
}
for tool in kvcal kvprof kvrun; do
  check 0 "$tool --help" "$bin/$tool" --help
  check 0 "$tool --version" "$bin/$tool" --version
  check 2 "$tool (no command)" "$bin/$tool"
  check 2 "$tool bogus-command" "$bin/$tool" bogus-command
  subs=$("$bin/$tool" --help | awk '/^commands:/{on=1; next} on && /^  [a-z]/{print $1} on && /^$/{on=0}')
  for sub in $subs; do
    check 0 "$tool $sub --help" "$bin/$tool" "$sub" --help
    # the usage line names the command once ("usage: kvrun info --model ...", not "kvrun info info")
    first=$("$bin/$tool" "$sub" --help | head -1)
    case "$first" in
      "usage: $tool $sub $sub"*|"usage: $tool $sub") echo "FAIL: $tool $sub --help usage line: $first"; fail=1 ;;
      "usage: $tool $sub "*) echo "ok: $tool $sub usage line" ;;
      *) echo "FAIL: $tool $sub --help usage line: $first"; fail=1 ;;
    esac
    check 2 "$tool $sub --no-such-option" "$bin/$tool" "$sub" --no-such-option
  done
done
exit $fail
