#!/usr/bin/env bash
# Install the Debian packages kvcal builds and tests with. Idempotent: installs only what is missing.
# The CUDA toolkit (nvcc, cuBLAS, cuSOLVER) is not installed here: it is optional and auto-detected.
# Open MPI is optional too (CMake's KV_MPI=AUTO builds without it), but installed so that the tests
# run kvcal fit and kvprof importance under mpirun.
set -euo pipefail
pkgs=(build-essential cmake pkg-config libopenblas-dev liblapacke-dev zlib1g-dev libyaml-dev
      check libsubunit-dev libjansson-dev python3 python3-venv unzip
      libopenmpi-dev openmpi-bin)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all packages present"
  exit 0
fi
echo "setup: installing ${missing[*]}"
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
