#!/usr/bin/env bash
# Compiles kernels/ds4.hip for NVIDIA (the test path of the HIP backend, tests/hip-on-cuda):
#   OUTDIR/ds4_kernels.sm_90.cubin   (SASS for sm_90; loads on any driver of the same CUDA major)
#   OUTDIR/ds4_kernels.sm_90.ptx     (PTX, for a driver-side JIT when the cubin is refused)
# The runtime loads OUTDIR/ds4_kernels.<target>.cubin when DS4_KERNEL_DIR=OUTDIR is set.
# Usage: tools/build-kernels-nvcc.sh OUTDIR [ARCH ...]   (ARCHs default to sm_90)
# nvcc: $DS4_NVCC, else nvcc on PATH, else the PyPI CUDA 13 wheels (installed with
#   pip install nvidia-cuda-nvcc nvidia-cuda-runtime nvidia-cuda-cccl nvidia-cuda-profiler-api).
# Env DS4_NVCC_VERBOSE=1 adds -Xptxas -v (registers, spills) to the output; DS4_NVCC_FLAGS adds flags
# for experiments. -fmad=false is always on: the kernels reproduce the CPU engine bit for bit, and the
# CPU engine never contracts a*b+c (kernels/prelude.h "arithmetic contract").
# The device-side HIP names come from kernels/cuda/hip/hip_runtime.h (Debian's HIP 5.2 NVIDIA
# headers do not compile with CUDA 12+).
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
out="${1:?usage: build-kernels-nvcc.sh OUTDIR [ARCH ...]}"
shift
archs=("$@")
[ ${#archs[@]} -eq 0 ] && archs=(sm_90)
mkdir -p "$out"

nvcc="${DS4_NVCC:-}"
if [ -z "$nvcc" ] && command -v nvcc >/dev/null 2>&1; then nvcc="$(command -v nvcc)"; fi
if [ -z "$nvcc" ]; then
  cu="$(python3 -c 'import nvidia, os; print(os.path.join(list(nvidia.__path__)[0], "cu13"))' 2>/dev/null || true)"
  if [ -n "$cu" ] && [ -x "$cu/bin/nvcc" ]; then nvcc="$cu/bin/nvcc"; fi
fi
if [ -z "$nvcc" ]; then
  echo "kernels: nvcc not found (set DS4_NVCC, or: pip install nvidia-cuda-nvcc nvidia-cuda-runtime nvidia-cuda-cccl nvidia-cuda-profiler-api)" >&2
  exit 1
fi
# The pip wheel keeps cicc/ptxas/includes beside bin/; make sure its own tools are found first.
export PATH="$(dirname "$nvcc"):$PATH"

verbose=()
[ "${DS4_NVCC_VERBOSE:-0}" = 1 ] && verbose=(-Xptxas -v)
# shellcheck disable=SC2206
extra=(${DS4_NVCC_FLAGS:-})
for arch in "${archs[@]}"; do
  cubin="$out/ds4_kernels.$arch.cubin"
  ptx="$out/ds4_kernels.$arch.ptx"
  common=(-x cu -std=c++17 -O3 -fmad=false -arch="$arch" -I"$here/kernels/cuda" -I"$here/kernels" -Wno-deprecated-gpu-targets)
  t0=$(date +%s.%N)
  if ! "$nvcc" "${common[@]}" "${verbose[@]}" "${extra[@]}" --cubin "$here/kernels/ds4.hip" -o "$cubin"; then
    echo "kernels: $arch FAILED ($nvcc)" >&2
    exit 1
  fi
  "$nvcc" "${common[@]}" --ptx "$here/kernels/ds4.hip" -o "$ptx"
  t1=$(date +%s.%N)
  n=$(grep -c '^\.visible \.entry' "$ptx" || true)
  printf 'kernels: %s OK (%s kernels, %s bytes cubin, %.1f s, %s)\n' "$arch" "$n" "$(stat -c %s "$cubin")" \
    "$(awk -v a="$t0" -v b="$t1" 'BEGIN{print b-a}')" "$("$nvcc" --version | grep -o 'release [0-9.]*')"
done
