# Sourced by the run-*.sh device scripts: the log folder ($OUT, default ./out), the build folder,
# nvcc on PATH, the `step` banner that times each part of the log, and the load scripts' setup.
out="${OUT:-$PWD/out}"
mkdir -p "$out"
work=/tmp/ds4-hip-on-cuda
export PATH="$PATH:/usr/local/cuda/bin"
step() { echo; echo "== $* ($(date -u +%T))"; }
# The load scripts' setup: build the shim, the project's kernels and ds4 (build-peers.sh; needs $tree,
# $tar), point ds4-chat at them, write the 40 kB prompt ds4-bench reads, and generate the
# Flash-shaped q2 file $model with $bin unless it is already there.
build_and_make_flash_model() {
  step "build shim + project kernels, ds4"
  bash "$tree/tests/hip-on-cuda/build-peers.sh" "$tree" "$tar" "$work" || exit 1
  export DS4_KERNEL_DIR="$work/kernels" DS4_HIP_LIBRARY="$work/lib/libamdhip64.so.5"
  yes "The quick brown fox jumps over the lazy dog." | head -c 40000 > /tmp/load-prompt.txt
  step "Flash-shaped q2 file in /dev/shm"
  if [ -s "$model" ]; then echo "reusing $model ($(stat -c %s "$model") bytes)"; else
    /usr/bin/time -f "gen-model: %e s wall" "$bin" gen-model --preset flash --seed 1 --out "$model" 2>&1 | tail -2; fi
}
# Drop a file's pages from the page cache (posix_fadvise DONTNEED; no root needed).
drop_pages() { python3 -c 'import os,sys; fd=os.open(sys.argv[1],os.O_RDONLY); os.posix_fadvise(fd,0,0,os.POSIX_FADV_DONTNEED)' "$1"; }
