#!/usr/bin/env bash
# The long-context table (docs/benchmarks.md) on an NVIDIA GPU: antirez/ds4's CUDA build (ds4-bench)
# and ds4-chat's HIP backend (on the HIP-on-CUDA shim), same Flash-shaped file, same prompt tokens, frontiers
# 2,048 + k * 16,384 up to CTX_MAX (default 133,120, the first frontier past 128k), 64 tokens
# decoded at each. The whole sweep takes longer than 10 minutes, so it can run as separate
# parts on one machine (the file in /dev/shm and the builds in /tmp stay between them):
#   run-longctx.sh BIN TREE DS4_SOURCE_TAR PROMPT_FILE setup   # build peers, the file, the prompt
#   run-longctx.sh BIN TREE DS4_SOURCE_TAR PROMPT_FILE ds4     # ds4-bench  -> $OUT/ds4-longctx.csv
#   run-longctx.sh BIN TREE DS4_SOURCE_TAR PROMPT_FILE ours    # ds4-chat   -> $OUT/ours-longctx.csv
#   run-longctx.sh BIN TREE DS4_SOURCE_TAR PROMPT_FILE all     # all three (when time allows)
# CTX_MAX, STEP (16384) and GEN (64) override the frontiers; DS4_HIP_PREFILL_CHUNK is passed through
# (our prefill chunk; 16384 for one kernel batch per frontier step). Needs ~82 GiB of RAM for the file.
# The prompt text is repeated until it has comfortably more tokens than CTX_MAX (both benches refuse
# a shorter prompt), so both engines read the same token stream.
set -uo pipefail
bin="$(readlink -f "${1:?usage: run-longctx.sh BIN TREE DS4_SOURCE_TAR PROMPT_FILE [setup|ds4|ours|all]}")"
tree="$(readlink -f "$2")"; tar="$(readlink -f "$3")"; prompt="$(readlink -f "$4")"; part="${5:-all}"
source "$tree/tests/hip-on-cuda/common.sh"
model=/dev/shm/flash.gguf
long=/dev/shm/longctx-prompt.txt
ctx_max="${CTX_MAX:-133120}"; step_incr="${STEP:-16384}"; gen="${GEN:-64}"
flags=(--ctx-start 2048 --ctx-max "$ctx_max" --step-incr "$step_incr" --gen-tokens "$gen")
export DS4_KERNEL_DIR="$work/kernels" DS4_HIP_LIBRARY="$work/lib/libamdhip64.so.5"
{
  if [[ $part == setup || $part == all ]]; then
    step device
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
    step "build shim + project kernels, ds4"
    bash "$tree/tests/hip-on-cuda/build-peers.sh" "$tree" "$tar" "$work" || exit 1
    step "Flash-shaped q2 file in /dev/shm"
    [[ -s $model ]] || "$bin" gen-model --preset flash --seed 1 --out "$model" 2>&1 | tail -2
    step "prompt of at least $((ctx_max * 2)) tokens' worth of text (at most ~4 bytes a token)"
    : > "$long"
    while (( $(stat -c %s "$long") < ctx_max * 8 )); do cat "$prompt" >> "$long"; done
    ls -l "$long"
  fi
  if [[ $part == ds4 || $part == all ]]; then
    step "ds4-bench ${flags[*]} (CUDA, weights copied to the device)"
    DS4_CUDA_COPY_MODEL=1 timeout 590 /tmp/ds4src/ds4-bench -m "$model" --cuda --prompt-file "$long" \
      "${flags[@]}" > "$out/ds4-longctx.csv" 2> "$out/ds4-longctx.err"
    echo "ds4-bench rc=$?"; grep -iE "error|fail" "$out/ds4-longctx.err" | tail -4; cat "$out/ds4-longctx.csv"
  fi
  if [[ $part == ours || $part == all ]]; then
    step "ds4-chat bench ${flags[*]} --backend hip --weights copy (chunk ${DS4_HIP_PREFILL_CHUNK:-default})"
    timeout 590 "$bin" bench --model "$model" --backend hip --weights copy --prompt-file "$long" \
      "${flags[@]}" --peak-gbps 4800 --csv "$out/ours-longctx.csv" 2> "$out/ours-longctx.err"
    echo "ours bench rc=$?"; tail -4 "$out/ours-longctx.err"; cat "$out/ours-longctx.csv"
  fi
  step done
} 2>&1 | tee -a "$out/longctx-log.txt"
