#!/usr/bin/env bash
# Compiles kernels/ds4.hip into one bare AMDGPU code object per target:
#   OUTDIR/ds4_kernels.<arch>.hsaco
# Usage: tools/build-kernels-amd.sh OUTDIR [ARCH ...]
#   ARCHs default to $DS4_HIP_ARCHS (comma or space separated), else "gfx1151 gfx1100 gfx1201".
# Finds the compiler and device libraries like this:
#   clang:    $DS4_HIP_CLANG, else $ROCM_PATH/llvm/bin/clang (a ROCm install), else clang-19
#             (Debian bookworm's clang-15/hipcc cannot target gfx1150/gfx1151).
#   bitcode:  $DS4_ROCM_DEVLIBS, else $ROCM_PATH/amdgcn/bitcode, else Debian's
#             /usr/lib/x86_64-linux-gnu/amdgcn/bitcode. Debian's rocm-device-libs 5.2 has no
#             oclc_isa_version_11xx/12xx.bc: those one-constant modules are generated into
#             OUTDIR/devlibs with llvm-dis/llvm-as.
# Prints one line per target: "kernels: gfx1151 OK (N kernels, X bytes)". Exits non-zero on the
# first failure, naming the target and the missing tool.
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
out="${1:?usage: build-kernels-amd.sh OUTDIR [ARCH ...]}"
shift
archs=("$@")
if [ ${#archs[@]} -eq 0 ]; then
  read -r -a archs <<< "$(echo "${DS4_HIP_ARCHS:-gfx1151 gfx1100 gfx1201}" | tr ',' ' ')"
fi
mkdir -p "$out"

rocm="${ROCM_PATH:-}"
clang="${DS4_HIP_CLANG:-}"
if [ -z "$clang" ] && [ -n "$rocm" ] && [ -x "$rocm/llvm/bin/clang" ]; then clang="$rocm/llvm/bin/clang"; fi
if [ -z "$clang" ]; then
  for c in clang-19 /usr/lib/llvm-19/bin/clang clang-20 clang-21; do
    if command -v "$c" >/dev/null 2>&1; then clang="$(command -v "$c")"; break; fi
  done
fi
if [ -z "$clang" ]; then
  echo "kernels: no HIP-capable clang found (set DS4_HIP_CLANG, or ROCM_PATH to a ROCm install, or apt-get install clang-19 lld-19 llvm-19)" >&2
  exit 1
fi
llvmbin="$(dirname "$(readlink -f "$clang")")"

devlibs="${DS4_ROCM_DEVLIBS:-}"
if [ -z "$devlibs" ] && [ -n "$rocm" ] && [ -d "$rocm/amdgcn/bitcode" ]; then devlibs="$rocm/amdgcn/bitcode"; fi
if [ -z "$devlibs" ] && [ -d /usr/lib/x86_64-linux-gnu/amdgcn/bitcode ]; then devlibs=/usr/lib/x86_64-linux-gnu/amdgcn/bitcode; fi
if [ -z "$devlibs" ] || [ ! -f "$devlibs/ockl.bc" ]; then
  echo "kernels: no ROCm device libraries (ockl.bc) found (set DS4_ROCM_DEVLIBS or apt-get install rocm-device-libs)" >&2
  exit 1
fi
rocm_root="${rocm:-/usr}"
hip_inc="$rocm_root/include"
if [ ! -f "$hip_inc/hip/hip_runtime.h" ]; then
  echo "kernels: $hip_inc/hip/hip_runtime.h missing (apt-get install libamdhip64-dev, or set ROCM_PATH)" >&2
  exit 1
fi

# Generated ISA bitcode goes next to a copy of the shipped libraries.
gen_isa() {  # $1 = arch like gfx1151
  local a="${1#gfx}" major minor step v
  major="${a:0:${#a}-2}"; minor="${a: -2:1}"; step="${a: -1}"
  v=$(( major * 1000 + 16#$minor * 100 + 16#$step ))
  local tmpl="$devlibs/oclc_isa_version_1030.bc"
  [ -f "$tmpl" ] || { echo "kernels: cannot generate oclc_isa_version_$a.bc: no template $tmpl" >&2; return 1; }
  "$llvmbin/llvm-dis" -o - "$tmpl" | sed "s/i32 10300/i32 $v/" | "$llvmbin/llvm-as" -o "$2/oclc_isa_version_$a.bc"
}
libdir="$devlibs"
for arch in "${archs[@]}"; do
  if [ ! -f "$libdir/oclc_isa_version_${arch#gfx}.bc" ]; then
    if [ "$libdir" = "$devlibs" ]; then
      libdir="$out/devlibs"; mkdir -p "$libdir"; cp -f "$devlibs"/*.bc "$libdir"/
    fi
    if [ ! -x "$llvmbin/llvm-dis" ] || [ ! -x "$llvmbin/llvm-as" ]; then
      echo "kernels: $arch needs oclc_isa_version_${arch#gfx}.bc, and llvm-dis/llvm-as are missing next to $clang (apt-get install llvm-19)" >&2
      exit 1
    fi
    gen_isa "$arch" "$libdir"
  fi
done

nm="$llvmbin/llvm-nm"
for arch in "${archs[@]}"; do
  obj="$out/ds4_kernels.$arch.hsaco"
  t0=$(date +%s.%N)
  if ! "$clang" -x hip --cuda-device-only --no-gpu-bundle-output -O3 -ffp-contract=off -std=c++17 -mcode-object-version=5 \
      --offload-arch="$arch" -D__HIP_PLATFORM_AMD__ --rocm-path="$rocm_root" --rocm-device-lib-path="$libdir" \
      -I"$hip_inc" -I"$here/kernels" -Wno-unused-command-line-argument \
      "$here/kernels/ds4.hip" -o "$obj"; then
    echo "kernels: $arch FAILED ($clang)" >&2
    exit 1
  fi
  t1=$(date +%s.%N)
  n=$("$nm" "$obj" 2>/dev/null | grep -c '\.kd$' || true)
  printf 'kernels: %s OK (%s kernels, %s bytes, %.1f s)\n' "$arch" "$n" "$(stat -c %s "$obj")" "$(awk -v a="$t0" -v b="$t1" 'BEGIN{print b-a}')"
done
