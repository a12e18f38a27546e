#!/usr/bin/env bash
# Installs the Debian packages flashjit needs (only when one is missing) and
# builds it into build/. Idempotent: a second run is a no-op build.
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(cmake ninja-build g++ libfmt-dev nlohmann-json3-dev googletest libgtest-dev
          clang-22 clang-format-22 lld-22 llvm-22-dev libclang-22-dev libclang-cpp22-dev liblld-22-dev
          python3-numpy python3-pytest python3-venv pkgconf binutils libamd-comgr2)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "flashjit: installing ${missing[*]}"
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
fi

jobs=$(nproc)
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DFLASHJIT_WITH_LLVM=ON ${FLASHJIT_CMAKE_ARGS:-} >/dev/null
ninja -C build -j"$jobs" "$@"
