#!/usr/bin/env bash
# The H100 measurements of the run-time shapes work, as run through the device
# tool (CUDA 13, PyTorch, no LLVM 22 there: LLVM off, nvrtc compiles).
#   bench/h100_session.sh tests    build, ctest, the torch tests, dynamic shapes, compile times
#   bench/h100_session.sh sm90     the sm90 rules: CUDA ctest cases, torch tests, config
#                                  sweep (SWEEP_ARGS), SDPA bench (SDPA_ARGS)
#   bench/h100_session.sh sdpa     the SDPA bench with this tree and with .old (the tree
#                                  before run-time shapes, `git archive` of the last commit)
#   bench/h100_session.sh split    split-KV correctness: the CUDA ctest cases, the torch tests
#   bench/h100_session.sh decode   bench/bench_decode.py (DECODE_ARGS adds its arguments), with
#                                  .old too where it exists (that tree first, into $out/old)
#   bench/h100_session.sh sequences bench/bench_sequences.py (varlen prefill, paged decode)
#   bench/h100_session.sh masks    mask tensors: CUDA ctest cases, the torch SDPA/gradient
#                                  tests, bench/bench_masks.py (MASKS_ARGS adds its arguments)
#   bench/h100_session.sh backward the backward: CUDA ctest cases, the torch gradient tests,
#                                  bench/bench_backward.py (BACKWARD_ARGS adds its arguments)
# Logs go to $OUT (or ./h100-out).
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-h100-out}
mkdir -p "$out"
build() { # src dir, build dir, targets...
  local src=$1 dir=$2
  shift 2
  cmake -S "$src" -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLASHJIT_WITH_LLVM=OFF >/dev/null &&
    ninja -C "$dir" -j16 "$@" >"$out/build-$(basename "$dir").log" 2>&1
}
case "${1:-tests}" in
sm90)
  # The sm90 rules (wgmma): CUDA ctest cases, the torch tests, a config sweep and
  # the SDPA bench (SWEEP_ARGS / SDPA_ARGS add their arguments).
  build . /tmp/fj || { tail -50 "$out/build-fj.log"; exit 1; }
  export FLASHJIT_LIBRARY=/tmp/fj/runtime/libflashjit.so
  ctest --test-dir /tmp/fj -j8 -R "Cuda|Nvrtc" --output-on-failure >"$out/ctest_cuda.log" 2>&1
  tail -5 "$out/ctest_cuda.log"
  grep -E "Failed|\*\*\*" "$out/ctest_cuda.log" | head -20
  FLASHJIT_CACHE_DIR=$(mktemp -d) timeout 300 python3 -m pytest -q -x \
    python/tests/test_torch_cuda.py python/tests/test_torch_matrix.py \
    >"$out/torch_tests.log" 2>&1
  tail -15 "$out/torch_tests.log"
  FLASHJIT_CACHE_DIR=$(mktemp -d) PYTHONUNBUFFERED=1 timeout ${SWEEP_TIMEOUT:-200} \
    python3 bench/sweep_configs.py --out "$out" ${SWEEP_ARGS:-} 2>&1 | tee "$out/sweep.log" | grep -E "default|best|WRONG"
  FLASHJIT_CACHE_DIR=$(mktemp -d) PYTHONUNBUFFERED=1 timeout ${SDPA_TIMEOUT:-200} \
    python3 bench/bench_sdpa.py --out "$out" ${SDPA_ARGS:-} 2>&1 | tee "$out/sdpa.log" | tail -40
  ;;
tests)
  build . /tmp/fj || { tail -50 "$out/build-fj.log"; exit 1; }
  export FLASHJIT_LIBRARY=/tmp/fj/runtime/libflashjit.so
  ctest --test-dir /tmp/fj -j8 --output-on-failure >"$out/ctest.log" 2>&1
  tail -15 "$out/ctest.log"
  grep -E "AttentionCuda|CudaDriver" "$out/ctest.log" | head
  FLASHJIT_CACHE_DIR=$(mktemp -d) /tmp/fj/bench/dynamic_shapes cuda:0 50 "$out/dynamic_shapes_cpp.csv" \
    >"$out/dynamic_shapes_cpp.log" 2>&1
  tail -16 "$out/dynamic_shapes_cpp.log"
  FLASHJIT_CACHE_DIR=$(mktemp -d) PYTHONUNBUFFERED=1 python3 bench/dynamic_shapes.py --out "$out" \
    >"$out/dynamic_shapes_py.log" 2>&1
  tail -22 "$out/dynamic_shapes_py.log"
  /tmp/fj/bench/compile_bench 7 200 >"$out/compile_bench.log" 2>&1
  cat "$out/compile_bench.log"
  # The torch suites (the NumPy ones need the emulator, which needs LLVM).
  FLASHJIT_CACHE_DIR=$(mktemp -d) timeout 300 python3 -m pytest -q -x \
    python/tests/test_torch_cuda.py python/tests/test_torch_matrix.py \
    python/tests/test_torch_sequences.py \
    >"$out/torch_tests.log" 2>&1
  tail -3 "$out/torch_tests.log"
  ;;
sdpa)
  build . /tmp/fj flashjit_shared || { tail -50 "$out/build-fj.log"; exit 1; }
  build .old /tmp/old flashjit_shared || { tail -50 "$out/build-old.log"; exit 1; }
  args=(--seqlens "${SEQLENS:-1024,4096,16384}" --head-dims "${HEAD_DIMS:-64,80,128,256}")
  for tree in old new; do
    # Each tree's own Python package and bench script with its own library.
    lib=/tmp/fj/runtime/libflashjit.so src=.
    [ $tree = old ] && lib=/tmp/old/runtime/libflashjit.so src=.old
    mkdir -p "$out/$tree"
    FLASHJIT_CACHE_DIR=$(mktemp -d) FLASHJIT_LIBRARY=$lib PYTHONUNBUFFERED=1 \
      python3 $src/bench/bench_sdpa.py --out "$out/$tree" "${args[@]}" 2>&1 | tee "$out/sdpa_$tree.log"
  done
  ;;
backward)
  build . /tmp/fj || { tail -50 "$out/build-fj.log"; exit 1; }
  export FLASHJIT_LIBRARY=/tmp/fj/runtime/libflashjit.so
  ctest --test-dir /tmp/fj -j8 -R "Cuda|Nvrtc|nvrtc|Backward" --output-on-failure \
    >"$out/ctest_cuda.log" 2>&1
  tail -5 "$out/ctest_cuda.log"
  grep -E "Failed|\*\*\*" "$out/ctest_cuda.log" | head -20
  FLASHJIT_CACHE_DIR=$(mktemp -d) timeout 400 python3 -m pytest -q -x \
    python/tests/test_torch_grad.py python/tests/test_torch_cuda.py \
    >"$out/torch_tests.log" 2>&1
  tail -15 "$out/torch_tests.log"
  FLASHJIT_CACHE_DIR=$(mktemp -d) PYTHONUNBUFFERED=1 timeout 300 python3 bench/bench_backward.py \
    --out "$out" ${BACKWARD_ARGS:-} 2>&1 | tee "$out/backward.log"
  ;;
masks)
  build . /tmp/fj || { tail -50 "$out/build-fj.log"; exit 1; }
  export FLASHJIT_LIBRARY=/tmp/fj/runtime/libflashjit.so
  ctest --test-dir /tmp/fj -j8 -R "Cuda|Mask|Nvrtc" --output-on-failure >"$out/ctest_cuda.log" 2>&1
  tail -5 "$out/ctest_cuda.log"
  grep -E "Failed|\*\*\*" "$out/ctest_cuda.log" | head -20
  FLASHJIT_CACHE_DIR=$(mktemp -d) timeout 400 python3 -m pytest -q -x \
    python/tests/test_sdpa.py python/tests/test_dropout.py python/tests/test_torch_grad.py \
    python/tests/test_torch_cuda.py python/tests/test_torch_compile.py \
    python/tests/test_transformers.py -k "torch or cuda or llama" \
    >"$out/torch_tests.log" 2>&1
  tail -15 "$out/torch_tests.log"
  FLASHJIT_CACHE_DIR=$(mktemp -d) PYTHONUNBUFFERED=1 timeout 240 python3 bench/bench_masks.py \
    --out "$out" ${MASKS_ARGS:-} 2>&1 | tee "$out/masks.log"
  ;;
split)
  # Split-KV correctness on the GPU: the CUDA ctest cases and the torch suites.
  build . /tmp/fj || { tail -50 "$out/build-fj.log"; exit 1; }
  export FLASHJIT_LIBRARY=/tmp/fj/runtime/libflashjit.so
  ctest --test-dir /tmp/fj -j8 -R "Cuda|Nvrtc|nvrtc" --output-on-failure >"$out/ctest_cuda.log" 2>&1
  tail -8 "$out/ctest_cuda.log"
  FLASHJIT_CACHE_DIR=$(mktemp -d) timeout 300 python3 -m pytest -q -x \
    python/tests/test_torch_cuda.py python/tests/test_torch_matrix.py \
    python/tests/test_torch_sequences.py \
    >"$out/torch_tests.log" 2>&1
  tail -3 "$out/torch_tests.log"
  ;;
decode)
  # The decode benchmark: flashjit (split-KV auto and off) against SDPA's backends;
  # where .old holds an earlier tree (`git archive`), that tree's run first, into $out/old.
  if [ -d .old ]; then
    build . /tmp/fj flashjit_shared &
    build .old /tmp/old flashjit_shared || { tail -50 "$out/build-old.log"; exit 1; }
    wait $! || { tail -50 "$out/build-fj.log"; exit 1; }
    mkdir -p "$out/old"
    FLASHJIT_CACHE_DIR=$(mktemp -d) FLASHJIT_LIBRARY=/tmp/old/runtime/libflashjit.so \
      PYTHONUNBUFFERED=1 python3 .old/bench/bench_decode.py --out "$out/old" ${DECODE_ARGS:-} \
      2>&1 | tail -60
  else
    build . /tmp/fj flashjit_shared || { tail -50 "$out/build-fj.log"; exit 1; }
  fi
  FLASHJIT_CACHE_DIR=$(mktemp -d) FLASHJIT_LIBRARY=/tmp/fj/runtime/libflashjit.so \
    PYTHONUNBUFFERED=1 python3 bench/bench_decode.py --out "$out" ${DECODE_ARGS:-} 2>&1 |
    tail -80
  ;;
sequences)
  # Varlen prefill against dense, paged decode against dense and SDPA.
  build . /tmp/fj flashjit_shared || { tail -50 "$out/build-fj.log"; exit 1; }
  FLASHJIT_CACHE_DIR=$(mktemp -d) FLASHJIT_LIBRARY=/tmp/fj/runtime/libflashjit.so \
    PYTHONUNBUFFERED=1 python3 bench/bench_sequences.py --out "$out" ${SEQUENCES_ARGS:-} 2>&1 | tee "$out/sequences.log" |
    tail -40
  ;;
esac
