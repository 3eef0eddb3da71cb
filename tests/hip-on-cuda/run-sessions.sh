#!/usr/bin/env bash
# Resume times (docs/sessions.md#resume-times) in one run: an 8k-token conversation on the Flash-shaped q2 file,
# HIP backend through the shim, ready from its KV snapshot against prefilled again.
#   run-sessions.sh BIN TEST_BIN TREE
# BIN: the --features hip ds4-chat binary (gen-model); TEST_BIN: the `cpu` test binary (it holds sessions_resume) of
# the same build (`cargo test --release --features hip --test cpu --no-run` prints its
# path). Writes $OUT/sessions-log.txt. Needs ~82 GiB of RAM for the file.
set -uo pipefail
bin="$(readlink -f "${1:?usage: run-sessions.sh BIN TEST_BIN TREE}")"
test_bin="$(readlink -f "$2")"; tree="$(readlink -f "$3")"
source "$tree/tests/hip-on-cuda/common.sh"
model=/dev/shm/flash.gguf
{
  step device
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  step "build shim + project kernels"
  bash "$tree/tests/hip-on-cuda/build.sh" "$work" sm_90 >/dev/null || { echo "SHIM BUILD FAILED"; exit 1; }
  bash "$tree/tools/build-kernels-nvcc.sh" "$work/kernels" sm_90 || exit 1
  export DS4_KERNEL_DIR="$work/kernels" DS4_HIP_LIBRARY="$work/lib/libamdhip64.so.5"
  step "Flash-shaped q2 file in /dev/shm"
  [ -f "$model" ] || "$bin" gen-model --preset flash --seed 1 --out "$model" 2>&1 | tail -2
  step "8k-token conversation: time to ready from the KV snapshot vs prefilled again (HIP, weights copied)"
  DS4_MODEL="$model" DS4_BACKEND=hip timeout 500 "$test_bin" --exact \
    sessions_resume::time_to_ready_of_an_8k_conversation_from_its_snapshot_and_read_again --ignored --nocapture 2>&1 | tail -6
  echo "sessions rc=${PIPESTATUS[0]}"
  rm -f "$model"
  step done
} 2>&1 | tee "$out/sessions-log.txt"
