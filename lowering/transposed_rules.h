// The rules shared by the AMD families, which all compute both products
// transposed (layouts doc §6): S^T = K Q^T and O^T = V^T P^T with 16 x 16
// fragments. A family is a TransposedGeometry (and, where the P^T operand is not
// the accumulator itself, an emit_p_operand); rules_gfx12.cpp, rules_gfx11.cpp,
// rules_cdna.cpp and rules_simt.cpp hold the rows.
//
// Lane L owns query `col = L % 16` of a 16-query tile and sits in lane group
// g = L / 16 of G = wave / 16 groups (`half` in wave32, `quad` in wave64). It
// holds E = 16 / G accumulator elements of its query: keys of S^T, head-dim
// entries of O^T. Element e is
//
//   contiguous   E * g + e   gfx12 (E = 8), CDNA 16x16x16 (E = 4), simt
//   interleaved  G * e + g   gfx11 (the WMMA rows 2e + half)
//
//   S^T fragment (16 keys x 16 queries) in wave32, lane L / element e:
//     contiguous                          interleaved
//              query 0     1 ...  15               query 0     1 ...  15
//     key 0    L0.e0   L1.e0 ... L15.e0    key 0    L0.e0   L1.e0 ... L15.e0
//     key 1    L0.e1   L1.e1 ... L15.e1    key 1    L16.e0 L17.e0 ... L31.e0
//      ...                                 key 2    L0.e1   L1.e1 ... L15.e1
//     key 8    L16.e0 L17.e0 ... L31.e0     ...
//     key 15   L16.e7 L17.e7 ... L31.e7    key 15   L16.e7 L17.e7 ... L31.e7
//
// Operand fragments (K and V^T as A, Q and P^T as B: B^T is laid out like A)
// hold one row of a 16 x 16 tile per lane (a key, a head-dim entry, a query)
// and `operand_elems` consecutive k of it, in this labeling of k:
//
//   split  E of them, from E * g: the accumulator's own run, so the converted
//          S^T accumulator IS the P^T operand (gfx12, CDNA); needs contiguous
//   whole  all 16, the same in every group (gfx11 needs the replicas; simt
//          computes its elements from them without other lanes)
//
// check() proves this labeling a relabeling of the hardware's k that A and B
// share slot by slot (doc §3.3), and the accumulator map equal to the table
// row's, before anything is emitted. Per-query statistics stay in the lanes
// owning the query: a row reduction is in-lane plus an exchange with each
// other group (lane ^ 16, lane ^ 32).
#pragma once

#include "lowering/rules.h"

namespace flashjit::lowering {

struct TransposedGeometry {
  std::string_view name;      ///< the rules' name, e.g. "gfx12"
  int wave = 32;              ///< lanes per wave
  bool interleaved = false;   ///< accumulator element e is G * e + g, not E * g + e
  bool whole_operand = false; ///< operands hold all 16 k per lane, not the accumulator's E
  /// 16-wide k tiles per instruction: 2 concatenates two consecutive tiles'
  /// operand runs (gfx950 16x16x32, doc §6): slot e of lane group g is
  /// k = 16 * (e / E) + E * g + e % E, for A and B alike.
  int k_tiles = 1;
};

class TransposedRules : public Rules {
public:
  explicit TransposedRules(TransposedGeometry g);

  std::string_view name() const override { return geo_.name; }
  Status check(const MatrixInstr &mi, const Target &t) const override;

  int n_tile() const override { return 16; }
  int acc_elems() const override { return elems_; }
  int row_slots() const override { return 1; }
  std::string_view acc_type() const override { return acc_type_; }
  std::string_view acc16_type() const override { return acc16_type_; }
  std::string_view operand_type() const override { return operand_type_; }
  void emit_lane_vars(HipWriter &w) const override;
  std::string acc_row(std::string_view) const override { return "col"; }
  std::string acc_slot(std::string_view) const override { return "0"; }
  std::string acc_col(std::string_view e) const override;
  std::string slot_row(std::string_view) const override { return "col"; }
  std::vector<int> row_share_masks() const override;
  std::string row_writer() const override;
  int acc_run_len() const override { return geo_.interleaved ? 1 : elems_; }
  std::vector<FragmentRun> acc_runs() const override;
  int operand_run_len() const override { return geo_.whole_operand ? 8 : elems_; }
  int k_step() const override { return geo_.k_tiles; }
  std::vector<FragmentRun> operand_runs() const override;

  void emit_k_fragment(HipWriter &w, std::string_view buf, std::string_view stride) const override;
  void emit_v_fragment(HipWriter &w, std::string_view buf, std::string_view stride) const override;
  /// Q from the row-major LDS copy of the Q block: the same lane pattern as K.
  bool reads_q_from_lds() const override { return true; }
  void emit_q_fragment(HipWriter &w, std::string_view buf, std::string_view stride) const override;
  std::string mma_s(std::string_view q) const override;
  std::string mma_o(std::string_view p) const override;
  /// Split operands: the accumulator's registers (free). Whole operands: per
  /// key tile, `p` (all 16 keys of the lane's query) gathered by emit_p_gather.
  void emit_p_operand(HipWriter &w, std::string_view dst, std::string_view src,
                      int key_tiles) const override;

  /// The shared default; whole operands replicate Q (dqk / 2 VGPRs per lane), so
  /// past head dim 192 the Q block stays in LDS instead.
  ir::Config default_config(const AttentionSpec &spec) const override;
  std::string_view prelude() const override;
  /// fj_mma over the table row's builtin: A and B (fj_bits of the row's A/B
  /// elements: k_tiles operand fragments) move from fj_bits storage into the
  /// builtin's vector type with __builtin_bit_cast (doc §10.2), then the row's
  /// trailing constant arguments (MFMA's cbsz, abid, blgp).
  void emit_mma_wrapper(HipWriter &w, const MatrixInstr &mi, DType dtype) const override;

protected:
  /// Lane groups per wave (G) and the name of this lane's group variable.
  int groups() const { return geo_.wave / 16; }
  std::string_view group_var() const { return groups() == 2 ? "half" : "quad"; }
  int operand_elems() const { return geo_.whole_operand ? 16 : elems_; }
  /// The key (head-dim entry) of accumulator element e in lane group g.
  int acc_key(int g, int e) const;
  /// The k of operand element e in lane group g, in these rules' labeling.
  int operand_k(int g, int e) const;
  /// k_tiles > 1: the instruction operand made of the fragments in array `frags`.
  std::string concat(std::string_view frags) const;
  /// `offset` as " + <expr>" within a fragment row: where this lane's run starts.
  std::string operand_offset() const;
  /// Whole operands: comment lines, then the statements that fill `fj_bits16 p`
  /// (keys 0..15 of the lane's query, in order) from `own`, this lane's E
  /// converted S^T elements of the key tile, exchanging with other lanes.
  virtual void emit_p_gather(HipWriter &) const {}

private:
  /// Declares `var`: this lane's operand run of row `row` (an expression) of a
  /// row-major LDS tile, at k tile `k`.
  void emit_fragment(HipWriter &w, std::string_view var, std::string_view row, std::string_view buf,
                     std::string_view stride) const;

  TransposedGeometry geo_;
  int elems_;
  std::string acc_type_, acc16_type_, operand_type_;
};

} // namespace flashjit::lowering
