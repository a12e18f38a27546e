// gfx12 (RDNA4) rules: wave32 WMMA 16x16x16 with 8-element bf16/f16 operands
// and 8-float accumulators, products computed transposed (layouts doc §6):
// S^T = K Q^T and O^T = V^T P^T. Then
//
//   * each lane owns one query (the accumulator's column, `col` = lane % 16) and
//     8 consecutive keys / head-dim entries (`8 * half + e`, half = lane / 16);
//   * per-query statistics live in the lanes that own the query: a row reduction
//     is 8 in-lane steps plus one exchange with the partner lane (lane ^ 16);
//   * the S^T accumulator, converted to bf16/f16, IS the P^T operand of the second
//     product: no LDS round trip (convert_layout #mma_acc -> #mma_a is free).
//
// Operand K order: A and B of one WMMA use the same, contiguous labeling
// (element e of lane L holds k = 8 * (L / 16) + e), a bijective relabeling of the
// hardware order (doc §3.3) that makes every fragment one 128-bit load and the
// accumulator usable as an operand. check() verifies this and the accumulator map
// of the table row before anything is emitted.
//
//   S^T accumulator (16 keys x 16 queries), lane L, element e:
//             query 0   1  ...  15
//     key 0..7   L=0   1  ...  15     e = key
//     key 8..15  L=16 17  ...  31     e = key - 8
//
// Everything else is the geometry shared with the other AMD families
// (transposed_rules.h).
#include "lowering/transposed_rules.h"

namespace flashjit::lowering {

namespace {

class Gfx12Rules final : public TransposedRules {
public:
  Gfx12Rules() : TransposedRules({.name = "gfx12", .wave = 32}) {}

  // Dropout's draws hold registers across the loop beside the plain kernel's,
  // which at the widest head dims of each KV block (113-128 with 64 keys,
  // 177-192 with 32) runs at 251-256 VGPRs: there LLVM 22 spilled 1 VGPR (128)
  // and 8 (192, causal); half the block keeps dropout at 202 and 187 VGPRs, no
  // spill (session 30; 112, 144, 160 and 176 kept theirs with 222-249 and none,
  // bench/results/amd_forward_spills_2026-11-28_session30_*.txt).
  ir::Config default_config(const AttentionSpec &spec) const override {
    ir::Config c = TransposedRules::default_config(spec);
    const int64_t d = padded_head_dim(spec);
    if (spec.dropout_p > 0 && ((d > 112 && d <= 128) || (d > 176 && d <= 192)))
      c.block_n /= 2;
    return c;
  }
};

} // namespace

const Rules &gfx12_rules() {
  static const Gfx12Rules rules;
  return rules;
}

} // namespace flashjit::lowering
