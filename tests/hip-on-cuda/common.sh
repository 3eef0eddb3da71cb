# Sourced by the run-*.sh device scripts: the log folder ($OUT, default ./out), the build folder,
# nvcc on PATH, and the `step` banner that times each part of the log.
out="${OUT:-$PWD/out}"
mkdir -p "$out"
work=/tmp/ds4-hip-on-cuda
export PATH="$PATH:/usr/local/cuda/bin"
step() { echo; echo "== $* ($(date -u +%T))"; }
