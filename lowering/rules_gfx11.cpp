// gfx11 (RDNA3 / RDNA3.5: gfx1100-1103, gfx1150, gfx1151) rules: wave32 WMMA
// 16x16x16 (`__builtin_amdgcn_wmma_f32_16x16x16_{f16,bf16}_w32`) with 16-element
// operands that lanes L and L + 16 must hold identically, and 8-float
// accumulators whose rows interleave the two half-waves (doc §2.2):
// C[2e + L/16][L%16]. Products are computed transposed (doc §6):
//
//   * K (A of S^T = K Q^T) and V^T (A of O^T = V^T P^T): a lane holds one whole
//     16-entry row of the tile, two 128-bit LDS reads; lanes L and L + 16 read
//     the same row, so the replicas agree by construction;
//   * Q (B of S^T): 16 consecutive head-dim entries of the lane's query;
//   * the accumulator: lane L holds query `col` = L % 16 and keys / head-dim
//     entries 2e + half (half = L / 16): no contiguous runs, so O is stored
//     entry by entry;
//   * P^T (B of O^T): the lane's query needs all 16 keys of the tile, in order,
//     in both halves. It holds the even keys (half 0) or the odd ones (half 1):
//     one exchange of its 8 values with lane ^ 16, then key k comes from half
//     k % 2, slot k / 2.
//
//   S^T accumulator (16 keys x 16 queries), lane L, element e:
//             query 0    1  ...  15
//     key 0    L0.e0   L1.e0 ... L15.e0
//     key 1    L16.e0 L17.e0 ... L31.e0
//     key 2    L0.e1   L1.e1 ... L15.e1
//      ...
//     key 15   L16.e7 L17.e7 ... L31.e7
//
//   P^T operand after the exchange, lane L (both halves alike), element k:
//     k:      0          1          2          3      ...   15
//     from    L0.e0      L16.e0     L0.e1      L16.e1 ...   L16.e7   (query L % 16)
#include "lowering/transposed_rules.h"

#include <algorithm>

namespace flashjit::lowering {

namespace {

class Gfx11Rules final : public TransposedRules {
public:
  Gfx11Rules()
      : TransposedRules({.name = "gfx11", .wave = 32, .acc_run = 1, .whole_operand = true}) {}

  // The replicated operands take twice gfx12's VGPRs per Q and P element:
  // KV blocks of 32 keys (16 past head dim 192, with Q in LDS) keep every head
  // dim free of spills. Per-score masks (a mask tensor's elements, a mask_mod's
  // operands) at head dim 192 spilled 8 VGPRs with 32 keys under LLVM 22 (176:
  // 243-255 VGPRs, none); with 16, 239-249 and none (session 30). A mask_mod
  // past head dim 224 spilled 8 VGPRs in four of six kernels (q_idx >= kv_idx,
  // kv_idx < seqlen_k - 5, with causal or the LSE; 250-252 VGPRs); with each
  // block's K/V copies issued one step ahead (stages 2) none did, 246-248
  // (session 32). Elsewhere stages 2 changed little, or spilled (gfx1201 at 128).
  ir::Config default_config(const AttentionSpec &spec) const override {
    ir::Config c = TransposedRules::default_config(spec);
    c.block_n = std::min<int64_t>(c.block_n, 32);
    const int64_t d = padded_head_dim(spec);
    const bool per_score_mask = spec.mask != MaskType::none || !spec.mask_mod.empty();
    if (per_score_mask && d > 176 && d <= 192)
      c.block_n = 16;
    if (!spec.mask_mod.empty() && d > 224)
      c.stages = 2;
    return c;
  }

  // The lane holds keys 2e + half; the partner lane (lane ^ 16) the others.
  void emit_p_gather(HipWriter &w) const override {
    w.line("// P^T: this half-wave holds keys 2e + half of the lane's query; exchange the 8");
    w.line("// values with lane ^ 16 and interleave, so both halves hold all 16 keys in order.");
    w.line("#pragma unroll");
    w.open("for (int e = 0; e < 8; e += 2) {{");
    w.line("// The partner's elements e and e + 1, two keys in one 32-bit exchange.");
    w.line("const unsigned pair = fj_shfl_xor_u32(own[e] | unsigned(own[e + 1]) << 16, lane, 16);");
    w.line("const fj_bits other[2] = {{fj_bits(pair), fj_bits(pair >> 16)}};");
    w.line("#pragma unroll");
    w.open("for (int i = 0; i < 2; ++i) {{");
    w.line("p[2 * (e + i)] = half ? other[i] : own[e + i];     // key 2(e + i): half 0's");
    w.line("p[2 * (e + i) + 1] = half ? own[e + i] : other[i]; // key 2(e + i) + 1: half 1's");
    w.close();
    w.close();
  }
};

} // namespace

const Rules &gfx11_rules() {
  static const Gfx11Rules rules;
  return rules;
}

} // namespace flashjit::lowering
