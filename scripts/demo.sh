#!/usr/bin/env bash
# The main job: build flashjit and show it on an attention spec that no library
# ships a kernel for: head dim 80, GQA 4:1, causal, seqlen_q 113 != seqlen_k 203.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh flashjit
spec=(--heads 16 --kv-heads 4 --seqlen-q 113 --seqlen-k 203 --head-dim 80 --causal --dtype bf16)

echo "== 1. the tile IR (flashjit emit --print-ir)"
build/tools/flashjit emit "${spec[@]}" --print-ir

echo "== 2. run it in the IR interpreter against the float64 reference"
build/tools/flashjit run --device interpreter "${spec[@]}" --seed 1
