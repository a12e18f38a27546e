// simt rules: the portable fallback for every AMD target, wave32 or wave64, with
// no matrix instruction. The fragments are those of the matrix rules
// (transposed_rules.h: S^T = K Q^T, O^T = V^T P^T, lane = (group, col)), with
// G = wave / 16 lane groups and E = 16 / G contiguous accumulator elements per
// lane; the matrix instruction is replaced by FMAs:
//
//   * Q and P^T (B) are whole: the 16 k of the lane's query, in every group;
//   * K and V^T (A) stay in LDS: a fragment is a pointer to the E rows this lane
//     computes (fj_simt_rows), and fj_simt_mma (templates/simt_fma.hip, part
//     of the kernel text) adds row . operand to each of its E elements;
//   * P^T: key j of a tile is element j % E of group j / E; two keys per 32-bit
//     exchange with lane 16 * (j / E) + col (an xor mask of 16 * (j / E ^ group)).
//
//   S^T accumulator in wave64 (G = 4, E = 4), lane L, element e:
//               query 0    1  ...  15
//     keys 0-3    L0      L1  ...  L15     e = key
//     keys 4-7    L16     L17 ...  L31     e = key - 4
//     keys 8-11   L32     L33 ...  L47     e = key - 8
//     keys 12-15  L48     L49 ...  L63     e = key - 12
//
// Lowering picks these rules when asked (RulesChoice::simt) or when a spec does
// not fit the family's matrix rules (RulesChoice::automatic, which says so in
// Lowered::rules_note); Lowered::rules is "simt" and Lowered::mma null.
#include "lowering/transposed_rules.h"

#include "templates/templates.h"

#include <algorithm>

namespace flashjit::lowering {

namespace {

class SimtRules final : public TransposedRules {
public:
  explicit SimtRules(int wave)
      : TransposedRules({.name = "simt", .wave = wave, .whole_operand = true}) {}

  Status check(const MatrixInstr &, const Target &) const override { return Status::ok(); }
  bool uses_matrix_instr() const override { return false; }

  // Q stays in LDS: in registers the compiler keeps it converted to f32 for the
  // whole loop (16 VGPRs per 16 head-dim entries). Each key of a KV block costs
  // more VGPRs than with a matrix instruction, so the blocks are smaller.
  ir::Config default_config(const AttentionSpec &spec) const override {
    ir::Config c = TransposedRules::default_config(spec);
    c.q_in_lds = true;
    const int64_t d = padded_head_dim(spec);
    c.block_n = d <= 96 ? 32 : 16;
    return c;
  }

  // The E rows of key tile c (K, row-major) or head-dim tile c (V^T) this lane
  // computes, at head-dim (key) tile k.
  void emit_k_fragment(HipWriter &w, std::string_view buf, std::string_view stride) const override {
    emit_rows(w, "kf", buf, stride);
  }
  void emit_v_fragment(HipWriter &w, std::string_view buf, std::string_view stride) const override {
    emit_rows(w, "vf", buf, stride);
  }
  std::string mma_s(std::string_view q) const override {
    return fmt::format("acc = fj_simt_mma(kf, {}, acc);", q);
  }
  std::string mma_o(std::string_view p) const override {
    return fmt::format("acc = fj_simt_mma(vf, {}, acc);", p);
  }

  // Key j of a tile is element j % E of lane group j / E.
  void emit_p_gather(HipWriter &w) const override {
    w.line("// P^T: key j is element j % kAccElems of lane group j / kAccElems; two keys per");
    w.line("// 32-bit exchange with the lane of that group that owns this query.");
    w.line("#pragma unroll");
    w.open("for (int j = 0; j < 16; j += 2) {{");
    w.line("const int e = j % kAccElems; // keys j, j + 1 are elements e, e + 1 of their group");
    w.line("const unsigned pair = fj_shfl_xor_u32(own[e] | unsigned(own[e + 1]) << 16, lane, "
           "16 * ((j / kAccElems) ^ {}));",
           group_var());
    w.line("p[j] = fj_bits(pair);");
    w.line("p[j + 1] = fj_bits(pair >> 16);");
    w.close();
  }

  // Never called: there is no matrix instruction to wrap (uses_matrix_instr()).
  void emit_mma_wrapper(HipWriter &, const MatrixInstr &, DType) const override {}
  std::string_view kernel_helpers() const override { return templates::simt_fma; }

private:
  void emit_rows(HipWriter &w, std::string_view var, std::string_view buf,
                 std::string_view stride) const {
    w.line("const fj_simt_rows {} = {{&{}[(c * 16 + kAccElems * {}) * {} + k * 16], {}}};", var,
           buf, group_var(), stride, stride);
  }
};

} // namespace

const Rules *simt_rules_for(const Target &t) {
  static const SimtRules wave32(32), wave64(64);
  if (t.is_nvidia())
    return nullptr;
  for (const SimtRules *rules : {&wave32, &wave64})
    if (rules->acc_elems() * t.wave_size == 16 * 16)
      return rules;
  return nullptr;
}

} // namespace flashjit::lowering
