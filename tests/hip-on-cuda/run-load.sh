#!/usr/bin/env bash
# Weight load times (docs/benchmarks.md) in one run: ds4-chat's copy placement (pinned staging,
# O_DIRECT or plain reads) and antirez/ds4's CUDA load of the same Flash-shaped q2 file.
#   run-load.sh BIN TREE DS4_SOURCE_TAR [DISK_DIR]
# From the page cache: the file in /dev/shm (tmpfs: O_DIRECT is refused there, so ours reads plainly,
# which the log line says). Disk-bound: when DISK_DIR is on a real disk with 82 GiB free, the file
# is copied there, its pages dropped (posix_fadvise DONTNEED; no root needed), and both loads are
# timed again from the disk. Writes $OUT/load-log.txt. Needs ~82 GiB of RAM for the /dev/shm file.
set -uo pipefail
bin="$(readlink -f "${1:?usage: run-load.sh BIN TREE DS4_SOURCE_TAR [DISK_DIR]}")"
tree="$(readlink -f "$2")"; tar="$(readlink -f "$3")"; disk="${4:-}"
source "$tree/tests/hip-on-cuda/common.sh"
model=/dev/shm/flash.gguf
ours() { # FILE LABEL
  timeout 300 "$bin" bench --model "$1" --backend hip --weights copy --ctx-start 2048 --ctx-max 2048 \
    --gen-tokens 1 --peak-gbps 4800 2>&1 >/dev/null | grep -E "weights|error|ds4-chat:" | sed "s/^/ours ($2): /"
}
theirs() { # FILE LABEL
  DS4_CUDA_COPY_MODEL=1 timeout 300 /tmp/ds4src/ds4-bench -m "$1" --cuda --prompt-file /tmp/load-prompt.txt \
    --ctx-start 2048 --ctx-max 2048 --gen-tokens 1 2>&1 >/dev/null | grep -iE "cop|load|GiB|error" | tail -4 | sed "s/^/ds4 ($2): /"
}
{
  step device
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  free -g | head -2
  build_and_make_flash_model
  step "from the page cache (/dev/shm), twice each"
  for i in 1 2; do ours "$model" "page cache, run $i"; done
  for i in 1 2; do theirs "$model" "page cache, run $i"; done
  if [ -n "$disk" ] && [ "$(df --output=avail -B1G "$disk" | tail -1)" -gt 82 ] \
     && [ "$(stat -f -c %T "$disk")" != tmpfs ]; then
    step "disk-bound: $disk ($(stat -f -c %T "$disk"))"
    cp "$model" "$disk/flash.gguf" && sync
    drop_pages "$disk/flash.gguf"; ours "$disk/flash.gguf" "disk, O_DIRECT"
    drop_pages "$disk/flash.gguf"; DS4_LOAD_MODE=buffered ours "$disk/flash.gguf" "disk, plain reads"
    drop_pages "$disk/flash.gguf"; theirs "$disk/flash.gguf" "disk"
    rm -f "$disk/flash.gguf"
  else
    step "no disk-bound figure (DISK_DIR missing, on tmpfs, or under 82 GiB free)"; df -h / /tmp 2>/dev/null
  fi
  step done
} 2>&1 | tee "$out/load-log.txt"
