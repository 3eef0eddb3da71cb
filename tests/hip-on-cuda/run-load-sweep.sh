#!/usr/bin/env bash
# The weight-load sweep (docs/benchmarks.md) in one run (< 6 minutes): ds4's CUDA load of the Flash-shaped
# q2 file from the page cache once, ours for several pipeline settings (DS4_LOAD_* knobs, see
# src/backend/hip/weight_load.rs), and a partial disk-bound figure.
#   run-load-sweep.sh BIN TREE DS4_SOURCE_TAR [DISK_DIR (default /tmp)] [DISK_GIB (default 16)]
# Page cache: the file in /dev/shm (tmpfs; `auto` reads it plainly since it is all cached).
# Disk: the full 80.76 GiB file does not fit the 1-GPU machine's 64 GiB disk, so the first DISK_GIB
# of it is written to DISK_DIR, its pages dropped, and read with O_DIRECT by dd: one stream of
# 64 MiB blocks, then 8 parallel streams (our loader's default reader count): a partial
# measurement of the disk, not a load. Writes $OUT/load-sweep.txt.
set -uo pipefail
bin="$(readlink -f "${1:?usage: run-load-sweep.sh BIN TREE DS4_SOURCE_TAR [DISK_DIR] [DISK_GIB]}")"
tree="$(readlink -f "$2")"; tar="$(readlink -f "$3")"; disk="${4:-/tmp}"; disk_gib="${5:-16}"
source "$tree/tests/hip-on-cuda/common.sh"
model=/dev/shm/flash.gguf
ours() { # LABEL, then VAR=VALUE settings
  local label="$1"; shift
  local line
  line="$(env "$@" timeout 120 "$bin" bench --model "$model" --backend hip --weights copy --ctx-start 2048 \
    --ctx-max 2048 --gen-tokens 1 --peak-gbps 4800 2>&1 >/dev/null | grep -E "weights copy|error|ds4-chat:" | head -3)"
  local secs gbps
  secs="$(sed -nE 's/.* in ([0-9.]+) s \(([0-9.]+) GB\/s\).*/\1/p' <<<"$line" | head -1)"
  gbps="$(sed -nE 's/.* in ([0-9.]+) s \(([0-9.]+) GB\/s\).*/\2/p' <<<"$line" | head -1)"
  printf 'ours %-44s %8s s %8s GB/s\n' "$label" "${secs:-FAIL}" "${gbps:--}"
  echo "   $line"
}
{
  step device
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  nproc; free -g | head -2; uname -r
  build_and_make_flash_model
  step "ds4 from the page cache"
  DS4_CUDA_COPY_MODEL=1 timeout 120 /tmp/ds4src/ds4-bench -m "$model" --cuda --prompt-file /tmp/load-prompt.txt \
    --ctx-start 2048 --ctx-max 2048 --gen-tokens 1 2>&1 >/dev/null | grep -iE "model copy|error" | head -2 \
    | sed -E 's/^/ds4: /; s/complete in ([0-9.]+)s/complete in \1 s/'
  step "ours from the page cache: settings sweep"
  ours "defaults"
  ours "threads 4" DS4_LOAD_THREADS=4
  ours "threads 12" DS4_LOAD_THREADS=12
  ours "threads 16" DS4_LOAD_THREADS=16
  ours "threads 8, 16 MiB chunks, 32 buffers" DS4_LOAD_THREADS=8 DS4_LOAD_CHUNK_MIB=16 DS4_LOAD_BUFFERS=32
  ours "threads 8, 256 MiB chunks, 12 buffers" DS4_LOAD_THREADS=8 DS4_LOAD_CHUNK_MIB=256 DS4_LOAD_BUFFERS=12
  ours "register, threads 8, 64 MiB" DS4_LOAD_MODE=register
  ours "register, threads 4, 512 MiB" DS4_LOAD_MODE=register DS4_LOAD_THREADS=4 DS4_LOAD_CHUNK_MIB=512
  ours "direct (O_DIRECT on tmpfs where taken)" DS4_LOAD_MODE=direct
  step "disk, partial: first $disk_gib GiB of the file on $disk ($(stat -f -c %T "$disk"))"
  df -h "$disk" | tail -1
  part="$disk/flash-part.bin"
  if [ "$(df --output=avail -B1G "$disk" | tail -1)" -gt $((disk_gib + 4)) ] && [ "$(stat -f -c %T "$disk")" != tmpfs ]; then
    dd if="$model" of="$part" bs=64M count=$((disk_gib * 16)) iflag=fullblock status=none && sync && drop_pages "$part"
    echo -n "1 stream, O_DIRECT 64 MiB blocks: "
    dd if="$part" of=/dev/null bs=64M iflag=direct 2>&1 | tail -1
    drop_pages "$part"; t0=$(date +%s.%N); per=$((disk_gib * 16 / 8))
    for i in 0 1 2 3 4 5 6 7; do dd if="$part" of=/dev/null bs=64M iflag=direct skip=$((i * per)) count=$per status=none & done; wait
    python3 -c "import sys; g=$disk_gib; s=float(sys.argv[2])-float(sys.argv[1]); print(f'8 streams, O_DIRECT 64 MiB blocks: {g} GiB in {s:.2f} s ({g*2**30/s/1e9:.2f} GB/s)')" "$t0" "$(date +%s.%N)"
    rm -f "$part"
  else
    echo "no room for $disk_gib GiB on $disk (or tmpfs): skipped"
  fi
  step done
} 2>&1 | tee "$out/load-sweep.txt"
