#!/usr/bin/env bash
# Rewrites kernels/INDEX.md: runs the kernel checks (tests/hip_kernels) once on the wave32 CPU
# emulator, which generates the index from the kernel table and the checks' launches, and copies the
# generated file over the committed one. Needs a C++ compiler for the emulator (tools/build-hip-emu.sh)
# and the hip feature's kernel build (build.rs); takes a few minutes.
# Usage: tools/kernel-index.sh
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
cd "$here"
gen="target/tmp/kernel-index/INDEX.md"
rm -f "$gen"
# The test fails while the committed index is stale; what matters here is the file it generated.
cargo test --release --features hip --test hip_kernels -- --exact every_kernel_matches_the_cpu_reference \
  >target/kernel-index.log 2>&1 || true
if [ ! -f "$gen" ]; then
  echo "kernel-index: the kernel checks did not generate $gen (see target/kernel-index.log)" >&2
  exit 1
fi
cp "$gen" kernels/INDEX.md
echo "kernels/INDEX.md rewritten"
