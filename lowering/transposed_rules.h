// The rules shared by the AMD families, which all compute both products
// transposed (layouts doc §6): S^T = K Q^T and O^T = V^T P^T. A family is a
// TransposedGeometry (and, where the P^T operand is not the accumulator itself,
// an emit_p_operand); rules_gfx12.cpp, rules_gfx11.cpp, rules_cdna.cpp and
// rules_simt.cpp hold the rows.
//
// Fragments are T x T (T = 16, or 32 for the CDNA 32x32 MFMAs). Lane L owns
// query `col = L % T` of a T-query tile and sits in lane group g = L / T of
// G = wave / T groups (`half` for two, `quad` for four). It holds E = T * T /
// wave accumulator elements of its query: keys of S^T, head-dim entries of
// O^T, in runs of R consecutive ones. Element e is key
//
//   (e / R) * R * G + R * g + e % R
//
//   R = E  contiguous   E * g + e     gfx12 (E = 8), CDNA 16x16 (E = 4), simt
//   R = 1  interleaved  G * e + g     gfx11 (the WMMA rows 2e + half)
//   R = 4  32x32        8 * (e / 4) + 4 * g + e % 4      CDNA 32x32 (E = 16)
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
// hold one row of a T x 16 tile per lane (a key, a head-dim entry, a query)
// and O = 16 / G of its 16 k (all 16 for whole operands), in one of two
// labelings of k, each a relabeling of the hardware's that A and B share slot by
// slot (doc §3.3):
//
//   S product (K, Q)      O * g + e: one run, 128-bit (O = 8) or 64-bit reads
//   O product (V^T, P^T)  the keys of the accumulator's elements e < O, so the
//                         converted S^T accumulator IS the P^T operand: its
//                         elements O * j .. O * j + O - 1 are 16-key tile j
//   whole                 all 16, the same in every group (gfx11 needs the
//                         replicas; simt computes its elements from them
//                         without other lanes)
//
// For T = 16 the two split labelings coincide (E = O = R). check() proves both
// relabelings and the accumulator map equal to the table row's before anything
// is emitted. Per-query statistics stay in the lanes owning the query: a row
// reduction is in-lane plus an exchange with each other group (lane ^ T, ...).
#pragma once

#include "lowering/rules.h"

namespace flashjit::lowering {

struct TransposedGeometry {
  std::string_view name; ///< the rules' name, e.g. "gfx12"
  int wave = 32;         ///< lanes per wave
  int tile = 16;         ///< T: queries, keys and head-dim entries per accumulator fragment
  /// R: consecutive keys per run of accumulator elements; 0 means E (one run).
  int acc_run = 0;
  bool whole_operand = false; ///< operands hold all 16 k per lane, not O of them
  /// 16-wide k tiles per instruction: 2 concatenates two consecutive tiles'
  /// operand runs (gfx950 16x16x32, doc §6): slot e of lane group g is
  /// k = 16 * (e / O) + label(g, e % O), for A and B alike.
  int k_tiles = 1;
  /// Instructions per 16-wide k tile: 2 feeds the halves of each operand
  /// fragment to two instructions of k 8 (CDNA 32x32x8).
  int k_split = 1;
};

class TransposedRules : public Rules {
public:
  explicit TransposedRules(TransposedGeometry g);

  std::string_view name() const override { return geo_.name; }
  Status check(const MatrixInstr &mi, const Target &t) const override;

  int m_tile() const override { return geo_.tile; }
  int n_tile() const override { return geo_.tile; }
  int mma_k() const override { return 16 * geo_.k_tiles / geo_.k_split; }
  int acc_elems() const override { return elems_; }
  int row_slots() const override { return 1; }
  std::string_view acc_type() const override { return acc_type_; }
  std::string_view acc16_type() const override { return acc16_type_; }
  std::string_view operand_type() const override { return operand_type_; }
  void emit_lane_vars(HipWriter &w) const override;
  std::string acc_row(std::string_view) const override { return "col"; }
  std::string acc_slot(std::string_view) const override { return "0"; }
  std::string acc_col(std::string_view e) const override;
  MatrixCoord acc_coord(int lane, int e) const override {
    return {lane % geo_.tile, acc_key(lane / geo_.tile, e)};
  }
  std::string slot_row(std::string_view) const override { return "col"; }
  std::vector<int> row_share_masks() const override;
  std::string row_writer() const override;
  int acc_run_len() const override { return run_; }
  std::vector<FragmentRun> acc_runs() const override;
  int operand_run_len() const override { return geo_.whole_operand ? 8 : operand_elems(); }
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
  /// past head dim 192 the Q block stays in LDS instead. 32-query tiles: 4 waves
  /// of one tile, KV blocks of 64 keys (32 up to head dim 32 and past 128), head
  /// dims padded to 32 where head_dim_v needs it.
  ir::Config default_config(const AttentionSpec &spec) const override;
  /// 32-query tiles where head_dim_v needs no padding past 16 and there are
  /// more than 16 queries; 16-query tiles always.
  bool prefers(const AttentionSpec &spec) const override;
  std::string_view prelude() const override;
  /// fj_mma over the table row's builtin: A and B (fj_bits of the row's A/B
  /// elements: k_tiles operand fragments) move from fj_bits storage into the
  /// builtin's vector type with __builtin_bit_cast (doc §10.2), then the row's
  /// trailing constant arguments (MFMA's cbsz, abid, blgp).
  void emit_mma_wrapper(HipWriter &w, const MatrixInstr &mi, DType dtype) const override;

protected:
  /// Lane groups per wave (G) and the name of this lane's group variable.
  int groups() const { return geo_.wave / geo_.tile; }
  std::string_view group_var() const { return groups() == 2 ? "half" : "quad"; }
  /// O: operand elements per lane and 16-wide k tile.
  int operand_elems() const { return geo_.whole_operand ? 16 : 16 / groups(); }
  /// The key (head-dim entry) of accumulator element e in lane group g.
  int acc_key(int g, int e) const;
  /// The k (0..15) of operand element e < O in lane group g, in the labeling of
  /// the S product (K, Q) or of the O product (V^T, P^T).
  int s_operand_k(int g, int e) const;
  int o_operand_k(int g, int e) const;
  /// k_tiles > 1: the instruction operand made of the fragments in array `frags`.
  std::string concat(std::string_view frags) const;
  /// The instructions of one product: `lds` (kf / vf) is A, `reg` (Q / P^T) is B.
  std::string mma(std::string_view lds, std::string_view reg) const;
  /// `offset` as " + <expr>" within a fragment row: where this lane's run starts.
  std::string operand_offset() const;
  /// Whole operands: comment lines, then the statements that fill `fj_bits16 p`
  /// (keys 0..15 of the lane's query, in order) from `own`, this lane's E
  /// converted S^T elements of the key tile, exchanging with other lanes.
  virtual void emit_p_gather(HipWriter &) const {}

private:
  /// Declares `var`: this lane's operand elements of row `row` (an expression)
  /// of a row-major LDS tile, at k tile `k`, in the S (K, Q) or O (V^T) labeling.
  void emit_fragment(HipWriter &w, std::string_view var, std::string_view row, std::string_view buf,
                     std::string_view stride, bool o_product) const;
  /// Checks one labeling of k against the hardware's: a relabeling that A and B share.
  Status check_labeling(const MatrixInstr &mi, std::string_view what,
                        int (TransposedRules::*label)(int, int) const) const;

  TransposedGeometry geo_;
  int elems_; ///< E
  int run_;   ///< R
  std::string acc_type_, acc16_type_, operand_type_;
};

} // namespace flashjit::lowering
