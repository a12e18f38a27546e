#!/usr/bin/env bash
# Builds flashjit's platform wheel into OUTDIR (default dist/):
#   scripts/build-wheel.sh [OUTDIR]
# Builds libflashjit.so and the LLVM plugin first (scripts/setup.sh), or takes
# them from FLASHJIT_BUILD_DIR when that is set. Install the wheel with
#   pip install OUTDIR/flashjit-*.whl
# It runs outside the source tree; the system needs libfmt9, and for the
# in-process compiler and the emulator LLVM 22's libllvm22 and libclang-cpp22.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-dist}
if [ -n "${FLASHJIT_BUILD_DIR:-}" ]; then
  build=$FLASHJIT_BUILD_DIR
else
  scripts/setup.sh flashjit_shared flashjit_llvm # setup.sh configures with LLVM
  build=build
fi
python3 scripts/make_wheel.py "$build" "$out"
