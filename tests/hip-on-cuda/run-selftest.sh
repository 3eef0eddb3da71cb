#!/usr/bin/env bash
# One run on an NVIDIA machine: build the shim, the smoke-test and the project kernels with the
# local nvcc, then run `ds4-chat selftest --backend hip` through the shim (and once more under
# compute-sanitizer memcheck, over the kernel suite's test binary when given). Logs go to $OUT (or ./out).
# Usage: run-selftest.sh DS4_CHAT_BINARY TREE [KERNELS_TEST_BIN]   (TREE holds tests/hip-on-cuda,
#        kernels, tools and src/backend/hip/ffi.rs of the same commit as the binary; KERNELS_TEST_BIN
#        from `cargo test --release --features hip --test hip_kernels --no-run`)
set -uo pipefail
bin="$(readlink -f "${1:?usage: run-selftest.sh BINARY TREE}")"
tree="$(readlink -f "${2:?usage: run-selftest.sh BINARY TREE}")"
kbin="${3:+$(readlink -f "$3")}"
source "$tree/tests/hip-on-cuda/common.sh"
{
  step device
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv
  nvcc --version | tail -2
  uname -r; ldd --version | head -1
  echo "binary: $(stat -c %s "$bin") bytes; undefined hip symbols: $(nm -D --undefined-only "$bin" | grep -c ' hip' || true)"

  step "build shim + smoke-test kernels"
  t0=$(date +%s.%N)
  bash "$tree/tests/hip-on-cuda/build.sh" "$work" sm_90 || { echo "SHIM BUILD FAILED"; exit 1; }
  step "build project kernels"
  bash "$tree/tools/build-kernels-nvcc.sh" "$work/kernels" sm_90 || echo "PROJECT KERNEL BUILD FAILED"
  echo "builds took $(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN{printf "%.1f", b-a}') s"
  ls -la "$work/lib" "$work/kernels"

  export DS4_KERNEL_DIR="$work/kernels"
  step "selftest (DS4_HIP_LIBRARY)"
  DS4_HIP_LIBRARY="$work/lib/libamdhip64.so.5" "$bin" selftest --backend hip
  echo "selftest rc=$?"

  step "selftest, seed 2 (library found on LD_LIBRARY_PATH as libamdhip64.so.5)"
  LD_LIBRARY_PATH="$work/lib" "$bin" selftest --backend hip --seed 2
  echo "selftest rc=$?"

  step "weights: generate the tiny model, upload through pinned staging, read back"
  "$bin" gen-model --preset tiny --out /tmp/ds4-tiny.gguf 2>&1 | tail -1
  DS4_HIP_LIBRARY="$work/lib/libamdhip64.so.5" "$bin" selftest --backend hip --seed 4 --model /tmp/ds4-tiny.gguf
  echo "selftest rc=$?"

  if command -v compute-sanitizer >/dev/null && [ -n "$kbin" ]; then
    step "compute-sanitizer memcheck, the kernel suite (seed 3)"
    DS4_HIP_LIBRARY="$work/lib/libamdhip64.so.5" DS4_KERNEL_SEED=3 timeout 240 compute-sanitizer --tool memcheck \
      --print-limit 20 "$kbin" --nocapture --test-threads 1 2>&1 | tail -60
    echo "memcheck rc=${PIPESTATUS[0]}"
  fi
  step done
} 2>&1 | tee "$out/selftest-log.txt"
