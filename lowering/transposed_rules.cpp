#include "lowering/transposed_rules.h"

#include "templates/templates.h"

namespace flashjit::lowering {

namespace {

/// The prelude's vector typedefs for a builtin's A/B element type: "fj_short"
/// + 8 is `short ext_vector_type(8)`, the bf16 operand of most builtins.
struct BuiltinVector {
  std::string_view elem_type; // MatrixInstr::ab_elem_type
  std::string_view prefix;
};
constexpr BuiltinVector kBuiltinVectors[] = {
    {"_Float16", "fj_half"},
    {"short", "fj_short"},
    {"__bf16", "fj_bfloat"}, // gfx950's K32/K16 bf16 builtins
};

const BuiltinVector *builtin_vector(std::string_view elem_type) {
  for (const BuiltinVector &v : kBuiltinVectors)
    if (v.elem_type == elem_type)
      return &v;
  return nullptr;
}

} // namespace

TransposedRules::TransposedRules(TransposedGeometry g)
    : geo_(g), elems_(16 / (g.wave / 16)), acc_type_(fmt::format("fj_float{}", elems_)),
      acc16_type_(fmt::format("fj_bits{}", elems_)),
      operand_type_(fmt::format("fj_bits{}", g.whole_operand ? 16 : elems_)) {}

int TransposedRules::acc_key(int g, int e) const {
  return geo_.interleaved ? groups() * e + g : elems_ * g + e;
}

int TransposedRules::operand_k(int g, int e) const {
  return geo_.whole_operand ? e : elems_ * g + e;
}

std::string TransposedRules::operand_offset() const {
  return geo_.whole_operand ? "" : fmt::format(" + {} * {}", elems_, group_var());
}

Status TransposedRules::check(const MatrixInstr &mi, const Target &t) const {
  const LaneLayout &l = *mi.layout;
  const int ops = operand_elems();
  const int kt = geo_.k_tiles;
  if (geo_.interleaved && !geo_.whole_operand)
    return Status::error("the {} rules: an interleaved accumulator is not an operand run; such "
                         "rules need whole operands",
                         name());
  if ((kt != 1 && kt != 2) || (kt > 1 && geo_.whole_operand))
    return Status::error("the {} rules: {} k tiles per instruction; 1, or 2 with split operands",
                         name(), kt);
  if (t.wave_size != geo_.wave || l.wave_size != geo_.wave || l.m != 16 || l.n != 16 ||
      l.k != 16 * kt || l.a_elems != ops * kt || l.b_elems != ops * kt || l.cd_elems != elems_)
    return Status::error("{}: the {} rules need a wave{} 16x16x{} instruction with {} A/B and {} "
                         "C/D elements per lane; it is wave{} {}x{}x{} with {}/{}/{} on {} "
                         "(wave{})",
                         mi.mnemonic, name(), geo_.wave, 16 * kt, ops * kt, elems_, l.wave_size,
                         l.m, l.n, l.k, l.a_elems, l.b_elems, l.cd_elems, t.arch, t.wave_size);
  if (!builtin_vector(mi.ab_elem_type))
    return Status::error("{}: no prelude vector type for A/B elements of type {}", mi.mnemonic,
                         mi.ab_elem_type);
  // Operands: lane L holds row L % 16 of A and column L % 16 of B; A and B of
  // one slot share k; these rules' k (operand_k) is a relabeling of it.
  std::vector<int> ours_of_hw(size_t(l.k), -1), hw_of_ours(size_t(l.k), -1);
  for (int lane = 0; lane < l.wave_size; ++lane)
    for (int e = 0; e < ops * kt; ++e) {
      const MatrixCoord a = l.a(lane, e), b = l.b(lane, e);
      if (a.row != lane % 16 || b.col != lane % 16)
        return Status::error("{}: A lane {} element {} holds row {} and B column {}; the {} rules "
                             "need both to be lane % 16 = {}",
                             mi.mnemonic, lane, e, a.row, b.col, name(), lane % 16);
      if (a.col != b.row)
        return Status::error("{}: lane {} element {} holds k = {} of A but k = {} of B; the {} "
                             "rules load both with one labeling of k",
                             mi.mnemonic, lane, e, a.col, b.row, name());
      const int ours = 16 * (e / ops) + operand_k(lane / 16, e % ops);
      int &mapped = ours_of_hw[size_t(a.col)];
      int &back = hw_of_ours[size_t(ours)];
      if ((mapped >= 0 && mapped != ours) || (back >= 0 && back != a.col))
        return Status::error("{}: the {} rules' k labeling (element {} of lane group {} is k = "
                             "{}) is not a relabeling of the hardware's (k = {})",
                             mi.mnemonic, name(), e, lane / 16, ours, a.col);
      mapped = ours;
      back = a.col;
    }
  for (int lane = 0; lane < l.wave_size; ++lane)
    for (int e = 0; e < elems_; ++e) {
      const MatrixCoord d = l.d(lane, e), want{acc_key(lane / 16, e), lane % 16};
      if (d != want)
        return Status::error("{}: accumulator lane {} element {} holds ({}, {}); the {} rules "
                             "need ({}, {})",
                             mi.mnemonic, lane, e, d.row, d.col, name(), want.row, want.col);
    }
  return Status::ok();
}

void TransposedRules::emit_lane_vars(HipWriter &w) const {
  if (geo_.interleaved)
    w.line("const int {0} = lane / 16; // this lane holds keys / head-dim entries {1} * e + {0} of "
           "a fragment",
           group_var(), groups());
  else
    w.line("const int {} = lane / 16; // which {} keys / head-dim entries of a fragment this lane "
           "holds",
           group_var(), elems_);
  w.line("const int col = lane % 16;  // the query this lane owns within a 16-query tile");
  w.line("(void){};", group_var());
}

std::string TransposedRules::acc_col(std::string_view e) const {
  if (geo_.interleaved)
    return fmt::format("{} * {} + {}", groups(), e, group_var());
  return fmt::format("{} * {} + {}", elems_, group_var(), e);
}

std::vector<int> TransposedRules::row_share_masks() const {
  std::vector<int> masks;
  for (int mask = 16; mask < geo_.wave; mask *= 2)
    masks.push_back(mask);
  return masks;
}

std::string TransposedRules::row_writer() const { return fmt::format("{} == 0", group_var()); }

std::vector<FragmentRun> TransposedRules::acc_runs() const {
  if (!geo_.interleaved)
    return {{"col", fmt::format("{} * {}", elems_, group_var())}};
  std::vector<FragmentRun> runs;
  for (int e = 0; e < elems_; ++e)
    runs.push_back({"col", fmt::format("{} + {}", groups() * e, group_var())});
  return runs;
}

std::vector<FragmentRun> TransposedRules::operand_runs() const {
  if (geo_.whole_operand)
    return {{"col", "0"}, {"col", "8"}};
  return {{"col", fmt::format("{} * {}", elems_, group_var())}};
}

void TransposedRules::emit_fragment(HipWriter &w, std::string_view var, std::string_view row,
                                    std::string_view buf, std::string_view stride) const {
  w.line("const {} {} = fj_lds_load{}(&{}[({}) * {} + k * 16{}]);", operand_type_, var,
         operand_elems(), buf, row, stride, operand_offset());
}

// S^T = K Q^T: the K tile is operand A (one key row per lane), Q operand B.
void TransposedRules::emit_k_fragment(HipWriter &w, std::string_view buf,
                                      std::string_view stride) const {
  emit_fragment(w, "kf", "c * 16 + col", buf, stride);
}

// O^T = V^T P^T: V^T is operand A (one head-dim row of the transposed tile per lane).
void TransposedRules::emit_v_fragment(HipWriter &w, std::string_view buf,
                                      std::string_view stride) const {
  emit_fragment(w, "vf", "c * 16 + col", buf, stride);
}

// Q^T is operand B, laid out like A: one query row per lane.
void TransposedRules::emit_q_fragment(HipWriter &w, std::string_view buf,
                                      std::string_view stride) const {
  emit_fragment(w, "qf", "(wave * kQTiles + qt) * 16 + col", buf, stride);
}

ir::Config TransposedRules::default_config(const AttentionSpec &spec) const {
  ir::Config c = Rules::default_config(spec);
  constexpr int64_t kMaxQRegisterDim = 192;
  c.q_in_lds = geo_.whole_operand && ir::padded(spec.head_dim_qk, 16) > kMaxQRegisterDim;
  return c;
}

std::string TransposedRules::concat(std::string_view frags) const {
  std::string lanes;
  for (int i = 0; i < elems_ * geo_.k_tiles; ++i)
    lanes += fmt::format(", {}", i);
  return fmt::format("__builtin_shufflevector({0}[0], {0}[1]{1})", frags, lanes);
}

// k_tiles > 1: the product loop gathers the fragments of consecutive k tiles
// into arrays (Rules::k_step): `kf` / `vf` and `q` / `p` name those arrays.
std::string TransposedRules::mma_s(std::string_view q) const {
  if (geo_.k_tiles > 1)
    return fmt::format("acc = fj_mma({}, {}, acc);", concat("kf"), concat(q));
  return fmt::format("acc = fj_mma(kf, {}, acc);", q);
}

std::string TransposedRules::mma_o(std::string_view p) const {
  if (geo_.k_tiles > 1)
    return fmt::format("acc = fj_mma({}, {}, acc);", concat("vf"), concat(p));
  return fmt::format("acc = fj_mma(vf, {}, acc);", p);
}

void TransposedRules::emit_p_operand(HipWriter &w, std::string_view dst, std::string_view src,
                                     int key_tiles) const {
  if (!geo_.whole_operand) {
    w.line("// The S^T accumulator's lane map is the P^T operand's map: the same registers.");
    w.line("{} (&{})[kQTiles][{}] = {};", operand_type_, dst, key_tiles, src);
    return;
  }
  w.line("{} {}[kQTiles][{}];", operand_type_, dst, key_tiles);
  w.line("#pragma unroll");
  w.open("for (int qt = 0; qt < kQTiles; ++qt) {{");
  w.line("#pragma unroll");
  w.open("for (int k = 0; k < {}; ++k) {{", key_tiles);
  w.line("const {} own = {}[qt][k];", acc16_type_, src);
  w.line("{} p;", operand_type_);
  emit_p_gather(w);
  w.line("{}[qt][k] = p;", dst);
  w.close();
  w.close();
}

std::string_view TransposedRules::prelude() const { return templates::amdgcn_prelude; }

void TransposedRules::emit_mma_wrapper(HipWriter &w, const MatrixInstr &mi, DType) const {
  const BuiltinVector *v = builtin_vector(mi.ab_elem_type); // check() made sure there is one
  const std::string vec = fmt::format("{}{}", v ? v->prefix : "?", mi.layout->a_elems);
  std::string trailing;
  for (const BuiltinArg &arg : mi.trailing_args)
    trailing += fmt::format(", /*{}=*/{}", arg.name, arg.value);
  w.line("// {}: D = A * B + C, {}x{}x{}, {} x {} per lane for A and B, {} x f32 for C/D.",
         mi.mnemonic, mi.m(), mi.n(), mi.k(), mi.layout->a_elems, mi.ab_elem_type,
         mi.layout->cd_elems);
  w.open("FJ_DEVICE {0} fj_mma(fj_bits{1} a, fj_bits{1} b, {0} c) {{", acc_type_,
         mi.layout->a_elems);
  w.line("return {}(__builtin_bit_cast({}, a), __builtin_bit_cast({}, b), c{});", mi.builtin, vec,
         vec, trailing);
  w.close();
}

} // namespace flashjit::lowering
