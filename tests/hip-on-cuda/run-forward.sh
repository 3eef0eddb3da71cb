#!/usr/bin/env bash
# One device call on an NVIDIA machine: build the shim and the project kernels with the local nvcc,
# generate the tiny model with each expert type, and run `selftest --backend hip --forward N` (the
# device forward pass against the CPU engine) through the shim with DS4_HIP_FORWARD=1.
# Usage: run-forward.sh DS4_CHAT_BINARY TREE [N_PROMPT] [N_GREEDY] [EXPERTS...]
#        (TREE holds tests/hip-on-cuda, kernels and tools of the same commit as the binary)
set -uo pipefail
bin="$(readlink -f "${1:?usage: run-forward.sh BINARY TREE [N] [G] [EXPERTS...]}")"
tree="$(readlink -f "${2:?usage: run-forward.sh BINARY TREE [N] [G] [EXPERTS...]}")"
n="${3:-136}"
g="${4:-32}"
if [ $# -gt 4 ]; then experts=("${@:5}"); else experts=(q2 q4 mixed); fi
out="${OUT:-$PWD/out}"
work=/tmp/ds4-hip-on-cuda
mkdir -p "$out"
export PATH="$PATH:/usr/local/cuda/bin"
step() { echo; echo "== $* ($(date -u +%T))"; }
{
  step device
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  step "build shim + project kernels"
  bash "$tree/tests/hip-on-cuda/build.sh" "$work" sm_90 >/dev/null || { echo "SHIM BUILD FAILED"; exit 1; }
  bash "$tree/tools/build-kernels-nvcc.sh" "$work/kernels" sm_90 >/dev/null || { echo "PROJECT KERNEL BUILD FAILED"; exit 1; }
  export DS4_KERNEL_DIR="$work/kernels" DS4_HIP_LIBRARY="$work/lib/libamdhip64.so.5" DS4_HIP_FORWARD=1
  for e in "${experts[@]}"; do
    step "tiny model, $e experts: forward $n tokens + $g greedy, GPU vs CPU"
    "$bin" gen-model --preset tiny --experts "$e" --out "/tmp/tiny-$e.gguf" 2>&1 | tail -1
    timeout 100 "$bin" selftest --backend hip --model "/tmp/tiny-$e.gguf" --forward "$n" --greedy "$g"
    echo "forward rc=$?"
  done
  if [ -n "${MEMCHECK:-}" ] && command -v compute-sanitizer >/dev/null; then
    step "compute-sanitizer memcheck, forward 20 tokens, q2"
    timeout 100 compute-sanitizer --tool memcheck --print-limit 10 \
      "$bin" selftest --backend hip --model /tmp/tiny-q2.gguf --forward 20 --greedy 4 2>&1 | tail -30
    echo "memcheck rc=${PIPESTATUS[0]}"
  fi
  step done
} 2>&1 | tee "$out/forward-log.txt"
