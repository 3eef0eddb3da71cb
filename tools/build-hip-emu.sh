#!/usr/bin/env bash
# Build the HIP runtime on the CPU (kernels/emu/hip_api.cpp) as OUTDIR/libamdhip64.so.5. With
#   DS4_HIP_LIBRARY=OUTDIR/libamdhip64.so.5
# a `--features hip` build runs its HIP backend end to end with the kernels executed by the CPU
# emulator (slowly: a few seconds per token on the tiny preset). Test infrastructure only.
# WARP=64 emulates a wave64 device.
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
out="${1:?usage: build-hip-emu.sh OUTDIR}"
warp="${WARP:-32}"
mkdir -p "$out"
cxx="${CXX:-}"
if [ -z "$cxx" ]; then
  for c in clang++-19 clang++ g++; do command -v "$c" >/dev/null 2>&1 && { cxx="$c"; break; }; done
fi
[ -n "$cxx" ] || { echo "build-hip-emu: no C++ compiler (clang++-19, clang++ or g++)" >&2; exit 1; }
"$cxx" -std=c++17 -O2 -ffp-contract=off -fPIC -shared -U_FORTIFY_SOURCE -Wno-unknown-warning-option -Wno-pass-failed -DDS4_EMU -DDS4_EMU_WARP="$warp" \
  -I"$here/kernels/emu" -I"$here/kernels" "$here/kernels/emu/hip_api.cpp" \
  -Wl,-soname,libamdhip64.so.5 -o "$out/libamdhip64.so.5"
echo "$out/libamdhip64.so.5"
