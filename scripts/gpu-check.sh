#!/usr/bin/env bash
# The CUDA checks for a lent GPU machine, which has the CUDA libraries but none of the CPU ones the tests link:
#   scripts/gpu-check.sh pack [BUILD_DIR] [DIR]   (here) copies test_kernels_cuda, bench_kernels and the CPU
#                                                  libraries they load (not CUDA's, not glibc's) into DIR
#                                                  (default .devrun, git-ignored through .git/info/exclude)
#   bash DIR/run.sh                                (there) the CPU-vs-GPU harness, again under compute-sanitizer
#                                                  memcheck, then bench_kernels (BENCHMARKS.md "GPU")
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
[ "${1:-}" = pack ] || { sed -n '2,7p' "$0"; exit 2; }
build="${2:-$here/build}"
dir="${3:-$here/.devrun}"
bins=("$build/tests/kernels/test_kernels_cuda" "$build/tests/bench/bench_kernels")
for b in "${bins[@]}"; do
  [ -x "$b" ] || { echo "gpu-check: $b missing: build with nvcc present (scripts/build.sh)" >&2; exit 1; }
done
mkdir -p "$dir/lib"
cp "${bins[@]}" "$dir/"
# Every library the binaries resolve here except CUDA's (the GPU machine has its own, matching its driver)
# and the C runtime's (the loader must match the system it runs on).
ldd "${bins[@]}" | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}' | sort -u |
  grep -Ev '^(libcuda|libcudart|libcublas|libcublasLt|libcusolver|libcusparse|libnvJitLink|libc|libm|libdl|libpthread|librt|libstdc\+\+|libgcc_s)\.so' |
  while read -r name path; do cp -L "$path" "$dir/lib/$name"; done
cat > "$dir/run.sh" <<'RUN'
#!/usr/bin/env bash
cd "$(dirname "$0")"
cuda_libs=$(dirname "$(find / -name 'libcublasLt.so.13*' -not -path '/proc/*' 2>/dev/null | head -1)")
export LD_LIBRARY_PATH="$PWD/lib:$cuda_libs:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
echo "== test_kernels_cuda"; ./test_kernels_cuda 2>&1 | tail -3
echo "== compute-sanitizer memcheck"; timeout 200 compute-sanitizer --tool memcheck --leak-check full ./test_kernels_cuda 2>&1 | tail -4
echo "== bench_kernels"; timeout 150 ./bench_kernels 2>&1
RUN
echo "gpu-check: $(du -sh "$dir" | cut -f1) in $dir; there: bash ${dir#"$here"/}/run.sh"
