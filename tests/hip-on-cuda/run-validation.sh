#!/usr/bin/env bash
# The validation of the HIP backend on an NVIDIA GPU in one run: shim + kernels built there, the
# selftest's runtime checks, every kernel against the CPU reference bit for bit (the kernel suite's
# test binary), the device forward pass against the CPU engine on the tiny q2/q4/mixed models, the
# reference vectors (case A) on the HIP backend, and `run --backend hip` against
# `run --backend cpu`. Logs go to $OUT (default ./out).
#   run-validation.sh BIN TREE KERNELS_TEST_BIN [VECTORS_TEST_BIN [VECTORS_DIR]]
# BIN: a `--features hip` release ds4-chat; TREE: this repository; KERNELS_TEST_BIN: the kernel
# suite's test binary (`cargo test --release --features hip --test hip_kernels --no-run` prints its
# path); VECTORS_TEST_BIN: the `cpu` integration test binary (it holds the vectors tests) (`cargo test --release --features hip
# --test cpu --no-run`); VECTORS_DIR: the vectors (default: TREE/tests/fixtures/vectors). The test
# binary runs in TREE and rebuilds tiny_a.gguf with TREE/tools/gen_tiny_gguf.py, which needs python3
# with numpy and gguf (carry the gguf wheel: PYTHONPATH).
set -uo pipefail
usage="usage: run-validation.sh BIN TREE KERNELS_TEST_BIN [VECTORS_TEST_BIN [VECTORS_DIR]]"
bin="$(readlink -f "${1:?$usage}")"
tree="$(readlink -f "${2:?$usage}")"
kbin="$(readlink -f "${3:?$usage}")"
vbin="${4:-}"; vdir="${5:-$tree/tests/fixtures/vectors}"
source "$tree/tests/hip-on-cuda/common.sh"
{
  step device
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  step "build shim + project kernels"
  bash "$tree/tests/hip-on-cuda/build.sh" "$work" sm_90 >/dev/null || { echo "SHIM BUILD FAILED"; exit 1; }
  bash "$tree/tools/build-kernels-nvcc.sh" "$work/kernels" sm_90 || { echo "PROJECT KERNEL BUILD FAILED"; exit 1; }
  export DS4_KERNEL_DIR="$work/kernels" DS4_HIP_LIBRARY="$work/lib/libamdhip64.so.5"
  step "selftest: runtime checks, kernel module"
  timeout 120 "$bin" selftest --backend hip; echo "selftest rc=$?"
  step "every kernel against the CPU reference, bitwise (tests/hip_kernels)"
  timeout 300 "$kbin" --nocapture --test-threads 1; echo "kernel suite rc=$?"
  for e in q2 q4 mixed; do
    step "tiny model, $e experts: forward 136 tokens + 64 greedy, GPU vs CPU"
    "$bin" gen-model --preset tiny --experts "$e" --out "/tmp/tiny-$e.gguf" 2>&1 | tail -1
    timeout 120 "$bin" selftest --backend hip --model "/tmp/tiny-$e.gguf" --forward 136 --greedy 64
    echo "forward rc=$?"
  done
  if [ -n "$vbin" ]; then
    step "reference vectors, case A, HIP backend"
    vbin="$(readlink -f "$vbin")"; vdir="$(readlink -f "$vdir")"
    (cd "$tree" && CARGO_TARGET_DIR=/tmp/ds4-vectors-target DS4_VECTORS="$vdir" DS4_VECTORS_BACKEND=hip CI=true \
      timeout 240 "$vbin" case_a_engine_matches_ds4 --nocapture --test-threads 1)
    echo "vectors rc=$?"
    m=/tmp/ds4-vectors-target/ds4-vectors/tiny_a.gguf
    if [ -f "$m" ]; then
      step "run --backend hip vs --backend cpu on tiny_a.gguf: 64 greedy tokens"
      for b in hip cpu; do
        timeout 120 "$bin" run --model "$m" --backend "$b" -p "Write a haiku about the sea." -n 64 --temp 0 --nothink \
          --dump-logprobs "$out/run-$b.json" --logprobs-top-k 5 > "$out/run-$b.txt" 2> "$out/run-$b.err"
        echo "run $b rc=$?"; tail -2 "$out/run-$b.err"
      done
      python3 - "$out/run-hip.json" "$out/run-cpu.json" <<'PY'
import json, sys
h, c = (json.load(open(p)) for p in sys.argv[1:])
th = [s["selected"]["id"] for s in h["steps"]]; tc = [s["selected"]["id"] for s in c["steps"]]
same = next((i for i, (a, b) in enumerate(zip(th, tc)) if a != b), min(len(th), len(tc)))
print(f"run: hip {len(th)} tokens, cpu {len(tc)} tokens, identical for the first {same}; identical overall: {th == tc}")
print(f"run: the dumps' per-step logprobs (top 5 and the selected token) are identical: {h['steps'] == c['steps']}")
if same < min(len(th), len(tc)):
    top = c["steps"][same]["top_logprobs"]
    margin = top[0]["logit"] - top[1]["logit"]
    rule = "a near tie: the vectors' greedy rule lets the sequences part here" if margin <= 0.25 else "a confident CPU step"
    print(f"run: at step {same} the CPU's top-2 logit margin is {margin:.4f} ({rule}); hip chose {th[same]}, the CPU's #2 was {top[1]['token']['id']}")
print("hip:", th); print("cpu:", tc)
PY
    fi
  fi
  step done
} 2>&1 | tee "$out/validation-log.txt"
