#!/usr/bin/env bash
# The main job: build flashjit and show it on an attention spec that no library
# ships a kernel for: head dim 80, GQA 4:1, causal, seqlen_q 113 != seqlen_k 203.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh flashjit
fj=build/tools/flashjit
spec=(--heads 16 --kv-heads 4 --seqlen-q 113 --seqlen-k 203 --head-dim 80 --causal --dtype bf16)
# build/demo holds this script's own outputs only: a fresh copy on every run
# (flashjit's commands never replace an existing file without --force).
rm -rf build/demo
mkdir -p build/demo

echo "== 1. the tile IR (flashjit emit --print-ir)"
$fj emit "${spec[@]}" --print-ir

echo
echo "== 2. HIP for RDNA4 (flashjit emit --arch gfx1201)"
$fj emit --arch gfx1201 "${spec[@]}" -o build/demo/fa_gfx1201_d80.hip
echo "the generated HIP is in $(pwd)/build/demo/fa_gfx1201_d80.hip"

echo
echo "== 3. compiled in-process with LLVM 22 (flashjit compile --arch gfx1201 --resources)"
$fj compile --arch gfx1201 "${spec[@]}" -o build/demo/fa_gfx1201_d80.co --resources

echo
echo "== 4. the IR in the interpreter against the float64 reference"
$fj run --device interpreter "${spec[@]}" --seed 1

echo
echo "== 5. the emitted gfx1201 kernel on the CPU emulator (exact WMMA lane semantics)"
$fj run --device emulator --arch gfx1201 "${spec[@]}" --seed 1 --lse
