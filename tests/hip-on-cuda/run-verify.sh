#!/usr/bin/env bash
# The block verify's figures (docs/speculative.md#measuring) in one run, on a Flash-shaped file cut
# to LAYERS layers (24 fit an 80 GB card; 43 is the whole model): a verify of 3 and 6 tokens against
# a decode step at 2k and 32k context, the replay drafter at acceptance 0 / 0.6 / 0.8 / 0.95 against
# plain decode, fast and exact arithmetic; greedy speculative output against plain output; and plain
# decode of this build beside BEFORE_BIN (an earlier build; BEFORE_TREE holds its kernels/ and tools/)
# in the same run.
#   run-verify.sh BIN TREE LAYERS [BEFORE_BIN BEFORE_TREE]
# Writes $OUT/verify-log.txt and the bench CSVs.
set -uo pipefail
bin="$(readlink -f "${1:?usage: run-verify.sh BIN TREE LAYERS [BEFORE_BIN BEFORE_TREE]}")"
tree="$(readlink -f "$2")"; layers="${3:?LAYERS}"
before="${4:-}"; before_tree="${5:-}"
source "$tree/tests/hip-on-cuda/common.sh"
model=/dev/shm/flash-$layers.gguf
bench() { # bench NAME BIN [args...]: 2k and 32k frontiers, 128 decoded tokens each
  local name="$1" b="$2"; shift 2
  timeout 420 "$b" bench --model "$model" --backend hip --weights copy --ctx-start 2048 --ctx-max 32768 \
    --step-incr 30720 --gen-tokens 128 --peak-gbps 3350 --csv "$out/$name.csv" "$@" 2> "$out/$name.err"
  echo "$name rc=$?"; grep -E "verify of|replay|speculate|backend hip" "$out/$name.err"; cat "$out/$name.csv"
}
{
  step device
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.memory --format=csv
  step "build shim + project kernels"
  bash "$tree/tests/hip-on-cuda/build.sh" "$work" sm_90 >/dev/null || { echo "SHIM BUILD FAILED"; exit 1; }
  bash "$tree/tools/build-kernels-nvcc.sh" "$work/kernels" sm_90 || exit 1
  export DS4_HIP_LIBRARY="$work/lib/libamdhip64.so.5"
  step "Flash-shaped q2 file, $layers layers, in /dev/shm"
  /usr/bin/time -f "gen-model: %e s wall" "$bin" gen-model --preset flash --layers "$layers" --seed 1 --out "$model" 2>&1 | tail -2
  export DS4_KERNEL_DIR="$work/kernels"
  step "fast: verify cost and replay drafter"
  bench fast "$bin" --verify-cost 3,6 --replay-acceptance 0,0.6,0.8,0.95
  step "exact: verify cost and replay drafter"
  bench exact "$bin" --exact --verify-cost 3,6 --replay-acceptance 0,0.8
  step "greedy speculative output equals plain output (run --speculate ngram, 256 tokens, 4 prompts)"
  for arith in "" "--exact"; do
    for i in 1 2 3 4; do
      p="$(printf 'Repeat this list %d times, exactly: alpha beta gamma delta epsilon zeta eta theta %d. ' "$i" "$i")"
      a=$(timeout 120 "$bin" run --model "$model" --backend hip --weights copy $arith --ctx 4096 -p "$p" -n 256 --temp 0 --nothink 2>/dev/null | md5sum)
      b=$(timeout 120 "$bin" run --model "$model" --backend hip --weights copy $arith --ctx 4096 -p "$p" -n 256 --temp 0 --nothink --speculate ngram 2>"$out/spec-$i$arith.err" | md5sum)
      echo "prompt $i ${arith:-fast}: plain ${a%% *} speculative ${b%% *} $([ "$a" = "$b" ] && echo EQUAL || echo DIFFER); $(grep -h speculat "$out/spec-$i$arith.err" | tail -1)"
    done
  done
  if [ -n "$before" ]; then
    step "plain decode: this build beside the earlier one (same file, same run)"
    bash "$before_tree/tools/build-kernels-nvcc.sh" "$work/before-kernels" sm_90 >/dev/null || echo "BEFORE KERNELS FAILED"
    for round in 1 2; do
      DS4_KERNEL_DIR="$work/before-kernels" bench "before-$round" "$before"
      bench "after-$round" "$bin"
    done
  fi
  rm -f "$model"
  step done
} 2>&1 | tee "$out/verify-log.txt"
