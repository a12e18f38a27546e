// CDNA rules (gfx90a, gfx942, gfx950): wave64 MFMA 16x16x16
// (`__builtin_amdgcn_mfma_f32_16x16x16{f16,bf16_1k}`, cbsz = abid = blgp = 0 from
// the table row) with 4-element operands and 4-float accumulators, products
// computed transposed (doc §6): S^T = K Q^T and O^T = V^T P^T. With
// quad = lane / 16 and col = lane % 16:
//
//   * K (A of S^T) = K[key col][d 4 * quad .. + 3] and V^T (A of O^T) =
//     V^T[d col][keys 4 * quad .. + 3]: one 64-bit LDS read each;
//   * Q (B of S^T) = Q[query col][d 4 * quad .. + 3];
//   * the accumulator: query col, keys / head-dim entries 4 * quad + e, e < 4,
//     contiguous, so the converted S^T accumulator IS the P^T operand (free);
//   * row reductions: 4 in-lane steps, then exchanges with lane ^ 16 and ^ 32;
//     the lanes of quad 0 write per-query values.
//
//   S^T accumulator (16 keys x 16 queries), lane L, element e:
//               query 0    1  ...  15
//     keys 0-3    L0      L1  ...  L15     e = key
//     keys 4-7    L16     L17 ...  L31     e = key - 4
//     keys 8-11   L32     L33 ...  L47     e = key - 8
//     keys 12-15  L48     L49 ...  L63     e = key - 12
//
// The labeling of k is the hardware's (doc §4.2). Everything else is the
// geometry shared with the other AMD families (transposed_rules.h).
//
// gfx950 (cdna4_rules, preferred there) runs v_mfma_f32_16x16x32 with the same
// geometry: each instruction takes two consecutive 16-wide k tiles, its
// 8-element operands the two 4-element runs concatenated (doc §6), so operand
// slot e of lane group quad is k = 16 * (e / 4) + 4 * quad + e % 4 for K, Q, V^T
// and P^T alike: a relabeling of the hardware's k whatever its order inside
// the 8 values (doc §5.3). P^T is still the S^T accumulator as it stands (two
// 16-key tiles per instruction); an odd last k tile is paired with zeros.
//
// The 32x32 rules (preferred where head_dim_v needs no padding past 16 and
// there are more than 16 queries) give each wave a 32-query tile: an
// instruction then reads half the operand bytes per multiply-add of a 16x16
// one. With half = lane / 32 and col = lane % 32:
//
//   * K (A of S^T) = K[key col][d 8 * half .. + 7] and Q (B) =
//     Q[query col][d 8 * half .. + 7]: one 128-bit read per 16-wide k tile.
//     CDNA2/3 feed its halves to two v_mfma_f32_32x32x8 (k 0-3 and 4-7 of each
//     lane group: a relabeling of the hardware's k = 4 * half + e); gfx950
//     feeds all 8 to one v_mfma_f32_32x32x16 (its k = 8 * half + e);
//   * the accumulator (16 floats): query col, keys / head-dim entries
//     8 * (e / 4) + 4 * half + e % 4 (doc §4.2), so elements 0-7 of the
//     converted S^T accumulator are the P^T operand of keys 0-15 and elements
//     8-15 that of keys 16-31, both in the labeling 8 * (e / 4) + 4 * half +
//     e % 4: free again;
//   * V^T (A of O^T) in that labeling: V^T[d col][keys 4 * half .. + 3] and
//     [keys 8 + 4 * half .. + 3], two 64-bit reads per 16-key tile;
//   * row reductions: in-lane over 16 elements, then one exchange with lane ^ 32.
//
//   S^T accumulator (32 keys x 32 queries), lane L, element e:
//                query 0    1  ...  31
//     keys 0-3     L0      L1  ...  L31     e = key
//     keys 4-7     L32     L33 ...  L63     e = key - 4
//     keys 8-11    L0      L1  ...  L31     e = key - 4
//     keys 12-15   L32     L33 ...  L63     e = key - 8
//      ...
//     keys 28-31   L32     L33 ...  L63     e = key - 16
#include "lowering/transposed_rules.h"

namespace flashjit::lowering {

const Rules &cdna_rules() {
  static const TransposedRules rules({.name = "cdna", .wave = 64});
  return rules;
}

const Rules &cdna4_rules() {
  static const TransposedRules rules({.name = "cdna", .wave = 64, .k_tiles = 2});
  return rules;
}

const Rules &cdna32_rules() {
  static const TransposedRules rules(
      {.name = "cdna32", .wave = 64, .tile = 32, .acc_run = 4, .k_split = 2});
  return rules;
}

const Rules &cdna4_32_rules() {
  static const TransposedRules rules({.name = "cdna32", .wave = 64, .tile = 32, .acc_run = 4});
  return rules;
}

} // namespace flashjit::lowering
