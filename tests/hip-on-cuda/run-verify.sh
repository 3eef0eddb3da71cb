#!/usr/bin/env bash
# The block verify's figures (docs/speculative.md#measuring) on a Flash-shaped file cut to LAYERS
# layers (24 fit an 80 GB card; 43 is the whole model), each part's ratios taken in the same run:
#   fast, exact       a verify of 3 and 6 tokens against a decode step at 2k and 32k context, and the
#                     replay drafter at acceptance 0 / 0.6 / 0.8 / 0.95 against plain decode
#   greedy-fast       greedy `run --speculate ngram` output against plain output, 4 prompts x 256 tokens
#   greedy-exact      the same in exact arithmetic, with the --dump-logprobs files compared byte for byte
#   before            plain decode of this build beside BEFORE_BIN (an earlier build; BEFORE_TREE holds
#                     its kernels/ and tools/), alternated ROUNDS times (default 2)
#   profile           device time per kernel of 9 verifies of 6 tokens (and 9 decode steps), as the
#                     difference of two profiled runs, fast arithmetic
#   kernels           the kernel suite's column-matvec and span-copy checks on the device (KERNELS_BIN
#                     from `cargo test --release --features hip --test hip_kernels --no-run`)
#   PARTS="fast greedy-fast" run-verify.sh BIN TREE LAYERS [BEFORE_BIN BEFORE_TREE [KERNELS_BIN]]
# PARTS defaults to every part. Writes $OUT/verify-log.txt and the bench CSVs.
set -uo pipefail
bin="$(readlink -f "${1:?usage: run-verify.sh BIN TREE LAYERS [BEFORE_BIN BEFORE_TREE [KERNELS_BIN]]}")"
tree="$(readlink -f "$2")"; layers="${3:?LAYERS}"
before="${4:-}"; before_tree="${5:-}"; kbin="${6:-}"
parts=" ${PARTS:-fast exact profile greedy-fast greedy-exact before kernels} "
source "$tree/tests/hip-on-cuda/common.sh"
model=/dev/shm/flash-$layers.gguf
want() { [[ "$parts" == *" $1 "* ]]; }
bench() { # bench NAME BIN [args...]: 2k and 32k frontiers, 128 decoded tokens each
  local name="$1" b="$2"; shift 2
  timeout 300 "$b" bench --model "$model" --backend hip --weights copy --ctx-start 2048 --ctx-max 32768 \
    --step-incr 30720 --gen-tokens 128 --peak-gbps 3350 --csv "$out/$name.csv" "$@" 2> "$out/$name.err"
  echo "$name rc=$?"; grep -E "verify of|replay|speculate|backend hip|error" "$out/$name.err"; cat "$out/$name.csv"
}
verdict() { # verdict SAME SPEC_ERR: DIFFER whenever the outputs differ; else EQUAL, or NOT COMPARED when nothing was drafted
  if [ "$1" != 1 ]; then echo DIFFER; elif grep -q " 0 drafted" "$2"; then echo "NOT COMPARED (0 drafted)"; else echo EQUAL; fi
}
# Prompt lookup drafts only where a model repeats its context, which a random model seldom does; the
# lossless property with drafts that are verified is the replay lines' "N of N tokens equal plain
# decode's" in the exact bench (docs/speculative.md#measuring).
greedy() { # greedy TAG ARITH_FLAGS...: plain against --speculate ngram on 4 prompts
  local tag="${1:-fast}" i p a b
  shift
  for i in 1 2 3 4; do
    p="$(printf 'Repeat this list %d times, exactly: alpha beta gamma delta epsilon zeta eta theta %d. ' "$i" "$i")"
    a=$(timeout 120 "$bin" run --model "$model" --backend hip --weights copy "$@" --ctx 4096 -p "$p" -n 256 --temp 0 \
      --nothink 2>"$out/plain-$i-$tag.err" | md5sum)
    b=$(timeout 120 "$bin" run --model "$model" --backend hip --weights copy "$@" --ctx 4096 -p "$p" -n 256 --temp 0 \
      --nothink --speculate ngram 2>"$out/spec-$i-$tag.err" | md5sum)
    echo "prompt $i $tag: plain ${a%% *} speculative ${b%% *} $(verdict "$([ "$a" = "$b" ] && echo 1)" "$out/spec-$i-$tag.err");" \
      "$(grep -h speculat "$out/spec-$i-$tag.err" | tail -1)"
  done
}
{
  step "device; parts:$parts"
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.memory --format=csv
  step "build shim + project kernels"
  bash "$tree/tests/hip-on-cuda/build.sh" "$work" sm_90 >/dev/null || { echo "SHIM BUILD FAILED"; exit 1; }
  bash "$tree/tools/build-kernels-nvcc.sh" "$work/kernels" sm_90 >/dev/null || { echo "KERNEL BUILD FAILED"; exit 1; }
  export DS4_HIP_LIBRARY="$work/lib/libamdhip64.so.5" DS4_KERNEL_DIR="$work/kernels"
  if want kernels && [ -n "$kbin" ]; then
    step "kernel checks on the device: column matvecs, span copies"
    DS4_KERNEL_CHECKS=matvec_cols,matvec_cols_fast,norm_quant timeout 240 "$kbin" --nocapture --test-threads 1 \
      > "$out/kernels.txt" 2>&1
    echo "kernels rc=$?: $(grep -c '^PASS' "$out/kernels.txt") PASS, $(grep -c '^FAIL' "$out/kernels.txt") FAIL"
    grep '^FAIL' "$out/kernels.txt" | head -5
  fi
  step "Flash-shaped q2 file, $layers layers, in /dev/shm"
  /usr/bin/time -f "gen-model: %e s wall" "$bin" gen-model --preset flash --layers "$layers" --seed 1 --out "$model" 2>&1 | tail -2
  if want fast; then
    step "fast: verify cost and replay drafter"
    bench fast "$bin" --verify-cost 3,6 --replay-acceptance 0,0.6,0.8,0.95
  fi
  if want exact; then
    step "exact: verify cost and replay drafter"
    bench exact "$bin" --exact --verify-cost 3,6 --replay-acceptance 0,0.8
  fi
  if want profile; then
    step "device time per kernel (DS4_HIP_PROFILE=1, fast): 9 verifies of 6 tokens and 9 steps, less the same run without them"
    for v in plain verify; do
      extra=(); [ "$v" = verify ] && extra=(--verify-cost 6)
      DS4_HIP_PROFILE=1 timeout 300 "$bin" bench --model "$model" --backend hip --weights copy --ctx-start 2048 \
        --ctx-max 2048 --gen-tokens 32 "${extra[@]}" > /dev/null 2> "$out/profile-$v.err"
      echo "profile $v rc=$?: $(grep -h "device time per kernel" "$out/profile-$v.err")"
    done
    awk '/ calls / && $3 == "calls" { k = $1; if (FILENAME ~ /verify/) { vc[k] += $2; vm[k] += $4 } else { pc[k] += $2; pm[k] += $4 } }
      END { for (k in vm) { d = vm[k] - pm[k]; if (d > 0.05) printf "%-36s %6d calls %9.2f ms\n", k, vc[k] - pc[k], d; } }' \
      "$out/profile-plain.err" "$out/profile-verify.err" | sort -k4 -rn | head -30
    grep -h "verify of" "$out/profile-verify.err"
  fi
  if want greedy-fast; then
    step "greedy speculative output equals plain output, fast (run --speculate ngram, 256 tokens, 4 prompts)"
    greedy fast
  fi
  if want greedy-exact; then
    step "greedy speculative output equals plain output, exact, and the logprob dumps are byte-identical"
    greedy exact --exact
    for i in 1 2; do
      p="$(printf 'Repeat this list %d times, exactly: alpha beta gamma delta epsilon zeta eta theta %d. ' "$i" "$i")"
      timeout 120 "$bin" run --model "$model" --backend hip --weights copy --exact --ctx 4096 -p "$p" -n 128 \
        --nothink --dump-logprobs "$out/dump-plain-$i.txt" >/dev/null 2>&1
      timeout 120 "$bin" run --model "$model" --backend hip --weights copy --exact --ctx 4096 -p "$p" -n 128 \
        --nothink --speculate ngram --dump-logprobs "$out/dump-spec-$i.txt" >/dev/null 2>"$out/dump-spec-$i.err"
      echo "dump $i: $(wc -l < "$out/dump-plain-$i.txt") lines; $(verdict "$(cmp -s "$out/dump-plain-$i.txt" \
        "$out/dump-spec-$i.txt" && echo 1)" "$out/dump-spec-$i.err"); $(grep -h speculat "$out/dump-spec-$i.err" | tail -1)"
    done
  fi
  if want before && [ -n "$before" ]; then
    step "plain decode: this build beside the earlier one (same file, same run)"
    bash "$before_tree/tools/build-kernels-nvcc.sh" "$work/before-kernels" sm_90 >/dev/null || echo "BEFORE KERNELS FAILED"
    for round in $(seq "${ROUNDS:-2}"); do
      DS4_KERNEL_DIR="$work/before-kernels" bench "before-$round" "$before"
      bench "after-$round" "$bin"
    done
  fi
  rm -f "$model"
  step done
} 2>&1 | tee "$out/verify-log.txt"
