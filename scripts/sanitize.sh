#!/usr/bin/env bash
# The test suite under the sanitizers, each build in a directory of its own:
#  1. build-asan: AddressSanitizer + UndefinedBehaviorSanitizer (g++, every UB
#     check fatal), LLVM off, then every ctest suite but the ones named below;
#  2. build-tsan: ThreadSanitizer (clang 22), LLVM on (Attention::create on the
#     emulator needs it), then the concurrency tests of the kernel cache,
#     Attention::create and the compiler.
# Any report fails the run. SANITIZERS=asan or SANITIZERS=tsan runs one of them.
set -euo pipefail
cd "$(dirname "$0")/.."
sanitizers=${SANITIZERS:-asan tsan}

# What scripts/setup.sh installs for an LLVM build, and the sanitizer run-times:
# g++'s libasan/libubsan come with it, clang's with libclang-rt-22-dev.
packages=(cmake ninja-build g++ libfmt-dev nlohmann-json3-dev googletest libgtest-dev
          clang-22 libclang-rt-22-dev llvm-22 lld-22 llvm-22-dev libclang-22-dev libclang-cpp22-dev
          liblld-22-dev)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "sanitize: installing ${missing[*]}"
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
fi
jobs=$(nproc)
export ASAN_SYMBOLIZER_PATH=/usr/lib/llvm-22/bin/llvm-symbolizer

if [[ " $sanitizers " == *" asan "* ]]; then
  # g++, not clang: its -fsanitize=address links the run-time into libflashjit.so
  # too, which is linked with --no-undefined. LLVM off: the in-process compiler
  # and the emulator suites (clang's headers, minutes of JIT per suite) would
  # about double this half's time under ASan; the TSan half builds with LLVM.
  # Every UB check is fatal.
  flags="-fsanitize=address,undefined -fno-sanitize-recover=undefined"
  flags+=" -fno-omit-frame-pointer"
  cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_C_COMPILER=gcc -DCMAKE_CXX_COMPILER=g++ -DFLASHJIT_WITH_LLVM=OFF \
    -DCMAKE_C_FLAGS="$flags" -DCMAKE_CXX_FLAGS="$flags" >/dev/null
  ninja -C build-asan -j"$jobs"
  # Not run here: `install` (its consumer programs are built without the
  # sanitizer, so libflashjit.so's libasan could not be loaded first).
  # A failed test runs once more: LeakSanitizer's tracer (ptrace) itself can
  # crash at a process's exit ("Tracer caught signal 11", seen once after
  # Nvrtc.ThreadsCompileAtOnce had passed, session 30). The log keeps the first
  # failure; a deterministic sanitizer finding fails both runs.
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=0:strict_string_checks=1 \
    LSAN_OPTIONS=suppressions=$PWD/scripts/lsan.supp:print_suppressions=0 \
    UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    ctest --test-dir build-asan --output-on-failure -j"$jobs" -LE '^install$' \
    --repeat until-pass:2
fi

if [[ " $sanitizers " == *" tsan "* ]]; then
  flags="-fsanitize=thread -fno-omit-frame-pointer"
  cmake -S . -B build-tsan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_C_COMPILER=clang-22 -DCMAKE_CXX_COMPILER=clang++-22 -DFLASHJIT_WITH_LLVM=ON \
    -DCMAKE_C_FLAGS="$flags" -DCMAKE_CXX_FLAGS="$flags" >/dev/null
  # Only the two test programs: the rest of an LLVM build adds nothing here.
  ninja -C build-tsan -j"$jobs" kernel_cache_test llvm_compiler_test
  # The threads of one process: the cache's (one key from eight threads, and
  # processes hammering one entry), Attention::create's (eight threads, one
  # cache directory, two kernels) and the compiler's (compiles from threads).
  TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1 \
    ctest --test-dir build-tsan --output-on-failure --no-tests=error -j"$jobs" \
    -R 'CacheTest\.(EightThreads|ProcessesHammering)|AttentionThreads\.|ConcurrentCompiles'
fi
