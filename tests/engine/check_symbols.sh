#!/usr/bin/env bash
# check_symbols.sh LIB.a... — every global symbol the libraries define starts with kv_ (house style: exported names
# carry the prefix, so an engine linking libkvrt meets no clash). Weak symbols that C++ and CUDA headers emit in
# every translation unit that uses them (the C++ personality routine, dim3's inline constructors) are not ours and
# are listed apart; strong definitions (T, D, B, R) must all be kv_. A sanitizer build adds its own globals per
# instrumented global (ASan's __odr_asan.NAME): those are checked by the NAME they carry.
set -euo pipefail
bad=$(nm -g --defined-only "$@" | awk 'NF == 3 { sub(/^__odr_asan[.]/, "", $3) } NF == 3 && $2 ~ /^[TDBRC]$/ && $3 !~ /^kv_/ { print $3 }' | sort -u)
weak=$(nm -g --defined-only "$@" | awk 'NF == 3 && $2 ~ /^[VWvw]$/ && $3 !~ /^kv_/ { print $3 }' | sort -u | tr '\n' ' ')
n=$(nm -g --defined-only "$@" | awk 'NF == 3 && $2 ~ /^[TDBRC]$/ { c++ } END { print c + 0 }')
echo "check_symbols: $n global definitions in $*; weak ones from the C++/CUDA headers: ${weak:-none}"
if [ -n "$bad" ]; then
    echo "check_symbols: globals without the kv_ prefix:" >&2
    echo "$bad" >&2
    exit 1
fi
[ "$n" -gt 0 ] || { echo "check_symbols: no symbols found" >&2; exit 1; }
