#!/usr/bin/env bash
# Builds the HIP-on-CUDA test shim and the runtime's smoke-test kernels on an NVIDIA machine.
#   OUTDIR/lib/libamdhip64.so.5                 the shim (point LD_LIBRARY_PATH or DS4_HIP_LIBRARY at it)
#   OUTDIR/kernels/ds4_selftest.<ARCH>.cubin    smoke-test kernels (DS4_KERNEL_DIR=OUTDIR/kernels)
# Usage: tests/hip-on-cuda/build.sh OUTDIR [ARCH]   (ARCH defaults to sm_90)
# Needs g++ and cuda.h (from $CUDA_HOME/include, else beside nvcc); links only -ldl (libcuda.so.1 is
# opened at run time), so it also builds on a machine without a driver.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
out="${1:?usage: build.sh OUTDIR [ARCH]}"
arch="${2:-sm_90}"
mkdir -p "$out/lib" "$out/kernels"

nvcc="${DS4_NVCC:-$(command -v nvcc || true)}"
cuda_home="${CUDA_HOME:-}"
if [ -z "$cuda_home" ] && [ -n "$nvcc" ]; then cuda_home="$(dirname "$(dirname "$(readlink -f "$nvcc")")")"; fi
[ -f "$cuda_home/include/cuda.h" ] || { echo "hip-on-cuda: cuda.h not found (set CUDA_HOME)" >&2; exit 1; }

g++ -O2 -std=gnu++17 -shared -fPIC -fvisibility=hidden -Wall -Wextra -I"$cuda_home/include" \
  -Wl,-soname,libamdhip64.so.5 -Wl,--version-script="$here/hip_amd.map" -Wl,--no-undefined \
  -o "$out/lib/libamdhip64.so.5" "$here/hip_on_cuda.cpp" -ldl
ln -sf libamdhip64.so.5 "$out/lib/libamdhip64.so"  # found first by the runtime's search, as on a ROCm install
echo "hip-on-cuda: built $out/lib/libamdhip64.so.5"

# Every symbol the Rust runtime resolves (HIP_SYMBOLS, from the hip_api! table) must be exported.
missing=0
for s in $(sed -n '/^hip_api! {/,/^}/p' "$root/src/backend/hip/ffi.rs" | grep -oE 'fn hip[A-Za-z0-9_]+' | cut -d' ' -f2); do
  if ! nm -D --defined-only "$out/lib/libamdhip64.so.5" | grep -qE " T $s(@@hip_[0-9.]+)?$"; then
    echo "hip-on-cuda: MISSING export $s" >&2
    missing=1
  fi
done
[ $missing = 0 ] || exit 1
echo "hip-on-cuda: all runtime symbols exported ($(nm -D --defined-only "$out/lib/libamdhip64.so.5" | grep -c ' T hip'))"

if [ -n "$nvcc" ]; then
  "$nvcc" -x cu -O3 -arch="$arch" --cubin -o "$out/kernels/ds4_selftest.$arch.cubin" "$here/selftest_kernels.hip"
  echo "hip-on-cuda: built $out/kernels/ds4_selftest.$arch.cubin"
else
  echo "hip-on-cuda: no nvcc: smoke-test kernels not built" >&2
fi
