#!/usr/bin/env bash
# The tests: build flashjit and run every ctest suite, then the format check.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
ctest --test-dir build --output-on-failure -j"$(nproc)"
scripts/check-format.sh
