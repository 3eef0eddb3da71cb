#!/usr/bin/env bash
# The 2k/8k speed table (docs/benchmarks.md) in one run: antirez/ds4's CUDA build and ds4-chat's HIP
# backend (on the HIP-on-CUDA shim) on the same Flash-shaped file in /dev/shm, same prompt text.
#   run-bench.sh BIN TREE DS4_SOURCE_TAR PROMPT_FILE
# Writes $OUT/{ds4-bench.csv,ours-bench.csv,bench-log.txt}. Needs ~82 GiB of RAM for the file.
set -uo pipefail
bin="$(readlink -f "${1:?usage: run-bench.sh BIN TREE DS4_SOURCE_TAR PROMPT_FILE}")"
tree="$(readlink -f "$2")"; tar="$(readlink -f "$3")"; prompt="$(readlink -f "$4")"
source "$tree/tests/hip-on-cuda/common.sh"
model=/dev/shm/flash.gguf
{
  step device
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.memory --format=csv
  step "build shim + project kernels, ds4"
  bash "$tree/tests/hip-on-cuda/build-peers.sh" "$tree" "$tar" "$work" || exit 1
  export DS4_KERNEL_DIR="$work/kernels" DS4_HIP_LIBRARY="$work/lib/libamdhip64.so.5"
  step "Flash-shaped q2 file in /dev/shm"
  /usr/bin/time -f "gen-model: %e s wall, max RSS %M KiB" "$bin" gen-model --preset flash --seed 1 --out "$model" 2>&1 | tail -2
  step "ds4-bench (CUDA, weights copied to the device)"
  DS4_CUDA_COPY_MODEL=1 timeout 240 /tmp/ds4src/ds4-bench -m "$model" --cuda --prompt-file "$prompt" \
    --ctx-start 2048 --ctx-max 8192 --step-incr 2048 --gen-tokens 64 > "$out/ds4-bench.csv" 2> "$out/ds4-bench.err"
  echo "ds4-bench rc=$?"; grep -iE "copy|load|error" "$out/ds4-bench.err" | tail -4; cat "$out/ds4-bench.csv"
  step "ds4-chat bench --backend hip --weights copy"
  timeout 300 "$bin" bench --model "$model" --backend hip --weights copy --prompt-file "$prompt" \
    --ctx-start 2048 --ctx-max 8192 --step-incr 2048 --gen-tokens 64 --peak-gbps 4800 --csv "$out/ours-bench.csv" 2> "$out/ours-bench.err"
  echo "ours bench rc=$?"; tail -4 "$out/ours-bench.err"; cat "$out/ours-bench.csv"
  step "Flash-shaped file: HIP backend vs the CPU engine, 16 tokens decoded + prefill (selftest --forward)"
  timeout 300 "$bin" selftest --backend hip --model "$model" --forward 16 --greedy 4 2>&1 | grep -v "by position"
  echo "flash forward rc=${PIPESTATUS[0]}"
  step "ds4-chat bench, decode with direct launches (DS4_HIP_GRAPH=0) for the graph's share"
  DS4_HIP_GRAPH=0 timeout 200 "$bin" bench --model "$model" --backend hip --weights copy --prompt-file "$prompt" \
    --ctx-start 2048 --ctx-max 2048 --gen-tokens 64 --peak-gbps 4800 2>/dev/null | tail -1
  step "ds4-chat run --backend hip, DS4_HIP_PROFILE=shapes, a short prompt and 64 tokens (decode kernels by launch shape; direct launches)"
  DS4_HIP_PROFILE=shapes timeout 120 "$bin" run --model "$model" --backend hip --weights copy --ctx 4096 \
    -p "Write a haiku about the sea." -n 64 --temp 0 --nothink 2>&1 >/dev/null | sed -n '/^ds4-chat: prompt/p; /^DS4_HIP_PROFILE/,$p'
  step "ds4-chat run --backend hip, DS4_HIP_PROFILE=1, a ~2.8k-token prompt (device time per kernel; direct launches)"
  head -c 9000 "$prompt" > /tmp/prompt-2k.txt
  DS4_HIP_PROFILE=1 timeout 120 "$bin" run --model "$model" --backend hip --weights copy --ctx 4096 \
    --prompt-file /tmp/prompt-2k.txt -n 32 --temp 0 --nothink 2>&1 >/dev/null | sed -n '/^ds4-chat: prompt/p; /^DS4_HIP_PROFILE/,$p'
  step "ds4-chat run --backend hip --weights map (zero copy: the GPU reads the host mapping over PCIe)"
  /usr/bin/time -f "run (map): %e s wall" timeout 200 "$bin" run --model "$model" --backend hip --weights map --ctx 4096 \
    -p "Hello, who are you?" -n 8 --temp 0 --nothink 2>&1 >/dev/null | tail -4
  rm -f "$model"
  step done
} 2>&1 | tee "$out/bench-log.txt"
