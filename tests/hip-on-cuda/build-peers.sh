#!/usr/bin/env bash
# Builds what the device scripts compare, on the device: the HIP-on-CUDA shim and the project's
# kernels (into WORK), and antirez/ds4's CUDA build from its source tar (into /tmp/ds4src).
#   build-peers.sh TREE DS4_SOURCE_TAR WORK
# Then use DS4_KERNEL_DIR=WORK/kernels DS4_HIP_LIBRARY=WORK/lib/libamdhip64.so.5.
set -uo pipefail
tree="$1"; tar="$2"; work="$3"
bash "$tree/tests/hip-on-cuda/build.sh" "$work" sm_90 >/dev/null || { echo "SHIM BUILD FAILED"; exit 1; }
bash "$tree/tools/build-kernels-nvcc.sh" "$work/kernels" sm_90 || exit 1
mkdir -p /tmp/ds4src && tar -xf "$tar" -C /tmp/ds4src
(cd /tmp/ds4src && make -j16 ds4 ds4-bench CUDA_ARCH=sm_90 CUDA_HOME="$(dirname "$(dirname "$(which nvcc)")")" >/tmp/ds4-build.log 2>&1) \
  && echo "ds4 built ($(cd /tmp/ds4src && git log -1 --format=%h 2>/dev/null || echo source tar))" || { tail -20 /tmp/ds4-build.log; exit 1; }
