#!/usr/bin/env bash
# Fuzzing: builds the libFuzzer targets of tests/fuzz (clang 22, ASan + UBSan,
# FLASHJIT_FUZZ=ON, LLVM off) in build-fuzz/ and runs each for SECONDS
# (default 60) on a temporary copy of its seed corpus, tests/fuzz/corpus/<name>/,
# so that the committed files never change. Fails on the first crash, leak,
# timeout or out-of-memory; the input that caused it is kept in
# build-fuzz/artifacts/<name>/ (replay: build-fuzz/tests/fuzz/fuzz_<name> FILE).
#   scripts/fuzz.sh [SECONDS] [NAME...]      NAME: ir_text npy manifest spec_flags
set -euo pipefail
cd "$(dirname "$0")/.."

seconds=${1:-60}
shift || true
targets=("$@")
((${#targets[@]})) || targets=(ir_text npy manifest spec_flags)
if ! [[ $seconds =~ ^[0-9]+$ ]] || ((seconds < 1)); then
  echo "usage: scripts/fuzz.sh [SECONDS] [ir_text|npy|manifest|spec_flags ...]" >&2
  exit 2
fi

# clang 22 with libFuzzer and the sanitizer run-times (libclang-rt-22-dev), and
# llvm-22 for llvm-symbolizer (readable stacks).
packages=(cmake ninja-build g++ libfmt-dev nlohmann-json3-dev clang-22 libclang-rt-22-dev llvm-22)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "fuzz: installing ${missing[*]}"
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
fi

cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_C_COMPILER=clang-22 -DCMAKE_CXX_COMPILER=clang++-22 \
  -DFLASHJIT_WITH_LLVM=OFF -DFLASHJIT_BUILD_TESTS=OFF -DFLASHJIT_FUZZ=ON >/dev/null
ninja -C build-fuzz -j"$(nproc)" fuzzers

export ASAN_SYMBOLIZER_PATH=/usr/lib/llvm-22/bin/llvm-symbolizer
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
for name in "${targets[@]}"; do
  fuzzer=build-fuzz/tests/fuzz/fuzz_$name
  if [ ! -x "$fuzzer" ] || [ ! -d "tests/fuzz/corpus/$name" ]; then
    echo "fuzz: no target '$name' (known: ir_text npy manifest spec_flags)" >&2
    exit 2
  fi
  mkdir -p "$work/$name" "build-fuzz/artifacts/$name"
  cp tests/fuzz/corpus/"$name"/* "$work/$name/"
  dict=()
  [ -f "tests/fuzz/$name.dict" ] && dict=(-dict="tests/fuzz/$name.dict")
  echo "fuzz: $name for ${seconds} s"
  # -timeout: one input may take at most 25 s; -rss_limit_mb also bounds any
  # single allocation (malloc_limit_mb defaults to it).
  if ! "$fuzzer" "$work/$name" "${dict[@]}" -max_total_time="$seconds" -timeout=25 \
    -rss_limit_mb=2048 -print_final_stats=1 -artifact_prefix="build-fuzz/artifacts/$name/" \
    >"$work/$name.log" 2>&1; then
    tail -n 60 "$work/$name.log"
    echo "fuzz: $name FAILED; the input is in build-fuzz/artifacts/$name/" >&2
    exit 1
  fi
  grep -E "^stat::number_of_executed_units|^stat::new_units_added|^stat::peak_rss_mb" \
    "$work/$name.log" | sed "s/^/fuzz: $name: /" || true
done
echo "fuzz: ${#targets[@]} target(s), ${seconds} s each, no crash"
