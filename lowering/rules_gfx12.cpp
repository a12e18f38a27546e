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
// accumulator usable as an operand. check() verifies the accumulator map of the
// table row against this before anything is emitted.
//
//   S^T accumulator (16 keys x 16 queries), lane L, element e:
//             query 0   1  ...  15
//     key 0..7   L=0   1  ...  15     e = key
//     key 8..15  L=16 17  ...  31     e = key - 8
#include "lowering/rules.h"

#include "templates/templates.h"

namespace flashjit::lowering {

namespace {

class Gfx12Rules final : public Rules {
public:
  std::string_view name() const override { return "gfx12"; }

  Status check(const MatrixInstr &mi, const Target &t) const override {
    const LaneLayout &l = *mi.layout;
    const int halves = t.wave_size / l.n;
    if (l.m != 16 || l.n != 16 || l.k != 16 || l.cd_elems * halves != l.m)
      return Status::error("{}: the gfx12 rules need a 16x16x16 instruction with {} accumulator "
                           "rows per lane group",
                           mi.mnemonic, l.m / halves);
    for (int lane = 0; lane < t.wave_size; ++lane)
      for (int e = 0; e < l.cd_elems; ++e) {
        const MatrixCoord c = l.d(lane, e);
        if (c.col != lane % l.n || c.row != l.cd_elems * (lane / l.n) + e)
          return Status::error("{}: accumulator lane {} element {} holds ({}, {}); the gfx12 "
                               "rules need ({}, {})",
                               mi.mnemonic, lane, e, c.row, c.col, l.cd_elems * (lane / l.n) + e,
                               lane % l.n);
      }
    return Status::ok();
  }

  int n_tile() const override { return 16; }
  int acc_elems() const override { return 8; }
  int row_slots() const override { return 1; }
  std::string_view acc_type() const override { return "fj_float8"; }
  std::string_view acc16_type() const override { return "fj_bits8"; }
  std::string_view operand_type() const override { return "fj_bits8"; }
  void emit_lane_vars(HipWriter &w) const override {
    w.line("const int half = lane / 16; // which 8 keys / head-dim entries of a fragment this "
           "lane holds");
    w.line("const int col = lane % 16;  // the query this lane owns within a 16-query tile");
    w.line("(void)half;");
  }
  std::string acc_row(std::string_view) const override { return "col"; }
  std::string acc_slot(std::string_view) const override { return "0"; }
  std::string acc_col(std::string_view e) const override { return fmt::format("8 * half + {}", e); }
  std::string slot_row(std::string_view) const override { return "col"; }
  std::vector<int> row_share_masks() const override { return {16}; }
  std::string row_writer() const override { return "half == 0"; }
  int acc_run_len() const override { return 8; }
  std::vector<FragmentRun> acc_runs() const override { return {{"col", "8 * half"}}; }
  int operand_run_len() const override { return 8; }
  std::vector<FragmentRun> operand_runs() const override { return {{"col", "8 * half"}}; }

  // S^T = K Q^T: the K tile is operand A (one key row per lane), Q operand B.
  void emit_k_fragment(HipWriter &w, std::string_view buf, std::string_view stride) const override {
    w.line("const fj_bits8 kf = fj_lds_load8(&{}[(c * 16 + col) * {} + k * 16 + 8 * half]);", buf,
           stride);
  }
  // O^T = V^T P^T: V^T is operand A (one head-dim row of the transposed tile per lane).
  void emit_v_fragment(HipWriter &w, std::string_view buf, std::string_view stride) const override {
    w.line("const fj_bits8 vf = fj_lds_load8(&{}[(c * 16 + col) * {} + k * 16 + 8 * half]);", buf,
           stride);
  }
  std::string mma_s(std::string_view q) const override {
    return fmt::format("acc = fj_mma(kf, {}, acc);", q);
  }
  std::string mma_o(std::string_view p) const override {
    return fmt::format("acc = fj_mma(vf, {}, acc);", p);
  }
  void emit_p_operand(HipWriter &w, std::string_view dst, std::string_view src,
                      int key_tiles) const override {
    w.line("// The S^T accumulator's lane map is the P^T operand's map: the same registers.");
    w.line("fj_bits8 (&{})[kQTiles][{}] = {};", dst, key_tiles, src);
  }

  std::string_view prelude() const override { return templates::amdgcn_prelude; }
  void emit_mma_wrapper(HipWriter &w, const MatrixInstr &mi, DType dtype) const override {
    const char *operand = dtype == DType::bf16 ? "fj_short8" : "fj_half8";
    w.line("// {}: D = A * B + C, {}x{}x{}, {} x {} per lane for A and B, {} x f32 for C/D.",
           mi.mnemonic, mi.m(), mi.n(), mi.k(), mi.layout->a_elems, mi.ab_elem_type,
           mi.layout->cd_elems);
    w.open("FJ_DEVICE fj_float8 fj_mma(fj_bits8 a, fj_bits8 b, fj_float8 c) {{");
    w.line("return {}(__builtin_bit_cast({}, a), __builtin_bit_cast({}, b), c);", mi.builtin,
           operand, operand);
    w.close();
  }
};

} // namespace

const Rules &gfx12_rules() {
  static const Gfx12Rules rules;
  return rules;
}

} // namespace flashjit::lowering
