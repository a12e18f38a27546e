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
    : geo_(g), elems_(g.tile * g.tile / g.wave), run_(g.acc_run ? g.acc_run : elems_),
      acc_type_(fmt::format("fj_float{}", elems_)), acc16_type_(fmt::format("fj_bits{}", elems_)),
      operand_type_(fmt::format("fj_bits{}", operand_elems())) {}

int TransposedRules::acc_key(int g, int e) const {
  return e / run_ * run_ * groups() + run_ * g + e % run_;
}

int TransposedRules::s_operand_k(int g, int e) const {
  return geo_.whole_operand ? e : operand_elems() * g + e;
}

int TransposedRules::o_operand_k(int g, int e) const {
  return geo_.whole_operand ? e : acc_key(g, e);
}

std::string TransposedRules::operand_offset() const {
  return geo_.whole_operand ? "" : fmt::format(" + {} * {}", operand_elems(), group_var());
}

// Slot h of instruction i (of k_split) is element v = i * P + h of the lane's
// operand elements (P per instruction), k 16 * (v / O) + label(g, v % O) of ours.
Status TransposedRules::check_labeling(const MatrixInstr &mi, std::string_view what,
                                       int (TransposedRules::*label)(int, int) const) const {
  const LaneLayout &l = *mi.layout;
  const int ops = operand_elems(), per = l.a_elems, kt = geo_.k_tiles;
  std::vector<int> ours_of_hw(size_t(16 * kt), -1), hw_of_ours(size_t(16 * kt), -1);
  for (int lane = 0; lane < l.wave_size; ++lane)
    for (int i = 0; i < geo_.k_split; ++i)
      for (int h = 0; h < per; ++h) {
        const MatrixCoord a = l.a(lane, h), b = l.b(lane, h);
        if (a.col != b.row)
          return Status::error("{}: lane {} element {} holds k = {} of A but k = {} of B; the {} "
                               "rules load both with one labeling of k",
                               mi.mnemonic, lane, h, a.col, b.row, name());
        const int v = i * per + h, g = lane / geo_.tile;
        const int ours = 16 * (v / ops) + (this->*label)(g, v % ops), hw = i * l.k + a.col;
        int &mapped = ours_of_hw[size_t(hw)];
        int &back = hw_of_ours[size_t(ours)];
        if ((mapped >= 0 && mapped != ours) || (back >= 0 && back != hw))
          return Status::error("{}: the {} rules' k labeling of the {} (element {} of lane group "
                               "{} is k = {}) is not a relabeling of the hardware's (k = {} of "
                               "instruction {})",
                               mi.mnemonic, name(), what, v, g, ours, a.col, i);
        mapped = ours;
        back = hw;
      }
  return Status::ok();
}

Status TransposedRules::check(const MatrixInstr &mi, const Target &t) const {
  const LaneLayout &l = *mi.layout;
  const int T = geo_.tile, ops = operand_elems(), kt = geo_.k_tiles, ks = geo_.k_split;
  if ((kt != 1 && kt != 2) || (ks != 1 && ks != 2) || (kt > 1 && (ks > 1 || geo_.whole_operand)))
    return Status::error("the {} rules: {} k tiles per instruction and {} instructions per k "
                         "tile; 1 and 1, 2 and 1 with split operands, or 1 and 2",
                         name(), kt, ks);
  if ((T != 16 && T != 32) || (!geo_.whole_operand && run_ < ops && (run_ != 4 || ops != 8)))
    return Status::error("the {} rules: {}-query fragments with V^T read in runs of {} keys; "
                         "16- or 32-query fragments, V^T in whole operand runs or in two runs "
                         "of 4 (fj_concat4)",
                         name(), T, run_);
  if (!geo_.whole_operand)
    for (int g = 0; g < groups(); ++g)
      for (int e = 0; e < elems_; ++e)
        if (acc_key(g, e) != acc_key(g, e % ops) + 16 * (e / ops))
          return Status::error("the {} rules: accumulator element {} of lane group {} is key {}, "
                               "not key {} of 16-key tile {}: the accumulator is not the P^T "
                               "operand; such rules need whole operands",
                               name(), e, g, acc_key(g, e), acc_key(g, e % ops), e / ops);
  if (t.wave_size != geo_.wave || l.wave_size != geo_.wave || l.m != T || l.n != T ||
      l.k != mma_k() || l.a_elems != ops * kt / ks || l.b_elems != ops * kt / ks ||
      l.cd_elems != elems_)
    return Status::error("{}: the {} rules need a wave{} {}x{}x{} instruction with {} A/B and {} "
                         "C/D elements per lane; it is wave{} {}x{}x{} with {}/{}/{} on {} "
                         "(wave{})",
                         mi.mnemonic, name(), geo_.wave, T, T, mma_k(), ops * kt / ks, elems_,
                         l.wave_size, l.m, l.n, l.k, l.a_elems, l.b_elems, l.cd_elems, t.arch,
                         t.wave_size);
  if (!builtin_vector(mi.ab_elem_type))
    return Status::error("{}: no prelude vector type for A/B elements of type {}", mi.mnemonic,
                         mi.ab_elem_type);
  // Operands: lane L holds row L % T of A and column L % T of B; A and B of
  // one slot share k; each of our labelings is a relabeling of it.
  for (int lane = 0; lane < l.wave_size; ++lane)
    for (int e = 0; e < l.a_elems; ++e) {
      const MatrixCoord a = l.a(lane, e), b = l.b(lane, e);
      if (a.row != lane % T || b.col != lane % T)
        return Status::error("{}: A lane {} element {} holds row {} and B column {}; the {} rules "
                             "need both to be lane % {} = {}",
                             mi.mnemonic, lane, e, a.row, b.col, name(), T, lane % T);
    }
  FJ_RETURN_IF_ERROR(check_labeling(mi, "K and Q operands", &TransposedRules::s_operand_k));
  FJ_RETURN_IF_ERROR(check_labeling(mi, "V^T and P^T operands", &TransposedRules::o_operand_k));
  for (int lane = 0; lane < l.wave_size; ++lane)
    for (int e = 0; e < elems_; ++e) {
      const MatrixCoord d = l.d(lane, e), want{acc_key(lane / T, e), lane % T};
      if (d != want)
        return Status::error("{}: accumulator lane {} element {} holds ({}, {}); the {} rules "
                             "need ({}, {})",
                             mi.mnemonic, lane, e, d.row, d.col, name(), want.row, want.col);
    }
  return Status::ok();
}

void TransposedRules::emit_lane_vars(HipWriter &w) const {
  const int T = geo_.tile;
  if (run_ == elems_)
    w.line("const int {} = lane / {}; // which {} keys / head-dim entries of a fragment this lane "
           "holds",
           group_var(), T, elems_);
  else
    w.line("const int {0} = lane / {1}; // this lane holds keys / head-dim entries {2} of a "
           "fragment",
           group_var(), T, acc_col("e"));
  w.line("const int col = lane % {0};  // the query this lane owns within a {0}-query tile", T);
  w.line("(void){};", group_var());
}

std::string TransposedRules::acc_col(std::string_view e) const {
  const int G = groups(), R = run_;
  if (R == elems_)
    return fmt::format("{} * {} + {}", elems_, group_var(), e);
  if (R == 1)
    return fmt::format("{} * {} + {}", G, e, group_var());
  return fmt::format("{} * ({} / {}) + {} * {} + {} % {}", R * G, e, R, R, group_var(), e, R);
}

std::vector<int> TransposedRules::row_share_masks() const {
  std::vector<int> masks;
  for (int mask = geo_.tile; mask < geo_.wave; mask *= 2)
    masks.push_back(mask);
  return masks;
}

std::string TransposedRules::row_writer() const { return fmt::format("{} == 0", group_var()); }

std::vector<FragmentRun> TransposedRules::acc_runs() const {
  if (run_ == elems_)
    return {{"col", fmt::format("{} * {}", elems_, group_var())}};
  std::vector<FragmentRun> runs;
  for (int j = 0; j < elems_ / run_; ++j)
    runs.push_back(
        {"col", run_ == 1 ? fmt::format("{} + {}", groups() * j, group_var())
                : j == 0  ? fmt::format("{} * {}", run_, group_var())
                          : fmt::format("{} + {} * {}", run_ * groups() * j, run_, group_var())});
  return runs;
}

std::vector<FragmentRun> TransposedRules::operand_runs() const {
  if (geo_.whole_operand)
    return {{"col", "0"}, {"col", "8"}};
  return {{"col", fmt::format("{} * {}", operand_elems(), group_var())}};
}

void TransposedRules::emit_fragment(HipWriter &w, std::string_view var, std::string_view row,
                                    std::string_view buf, std::string_view stride,
                                    bool o_product) const {
  const int ops = operand_elems();
  if (!o_product || geo_.whole_operand || run_ >= ops) {
    w.line("const {} {} = fj_lds_load{}(&{}[({}) * {} + k * 16{}]);", operand_type_, var, ops, buf,
           row, stride, operand_offset());
    return;
  }
  // The O product's labeling: the accumulator's runs of R keys, two of 4 (check()).
  w.line("// keys {} of the 16-key tile, the P^T operand's labeling: two 64-bit reads",
         acc_col("e"));
  w.line("const fj_bits *{}_row = &{}[({}) * {} + k * 16];", var, buf, row, stride);
  w.line("const {0} {1} = fj_concat4(fj_lds_load4({1}_row + {2} * {3}), fj_lds_load4({1}_row + {4} "
         "+ {2} * {3}));",
         operand_type_, var, run_, group_var(), run_ * groups());
}

// S^T = K Q^T: the K tile is operand A (one key row per lane), Q operand B.
void TransposedRules::emit_k_fragment(HipWriter &w, std::string_view buf,
                                      std::string_view stride) const {
  emit_fragment(w, "kf", fmt::format("c * {} + col", geo_.tile), buf, stride, false);
}

// O^T = V^T P^T: V^T is operand A (one head-dim row of the transposed tile per lane).
void TransposedRules::emit_v_fragment(HipWriter &w, std::string_view buf,
                                      std::string_view stride) const {
  emit_fragment(w, "vf", fmt::format("c * {} + col", geo_.tile), buf, stride, true);
}

// Q^T is operand B, laid out like A: one query row per lane.
void TransposedRules::emit_q_fragment(HipWriter &w, std::string_view buf,
                                      std::string_view stride) const {
  emit_fragment(w, "qf", fmt::format("(wave * kQTiles + qt) * {} + col", geo_.tile), buf, stride,
                false);
}

ir::Config TransposedRules::default_config(const AttentionSpec &spec) const {
  ir::Config c = Rules::default_config(spec);
  constexpr int64_t kMaxQRegisterDim = 192;
  c.q_in_lds = geo_.whole_operand && ir::padded(spec.head_dim_qk, 16) > kMaxQRegisterDim;
  if (geo_.tile == 32) {
    c.mma_m = 32;
    c.block_m = 32 * c.waves;
    c.pad_k = ir::padded(spec.head_dim_v, 16) % 32 ? 32 : 16;
    // Up to head dim 32, KV blocks of 64 keys made LLVM 22 spill SGPRs on gfx950.
    const int64_t d =
        std::max(ir::padded(spec.head_dim_qk, c.pad_k), ir::padded(spec.head_dim_v, c.pad_k));
    c.block_n = d <= 32 ? 32 : std::max<int64_t>(c.block_n, 32);
  }
  return c;
}

bool TransposedRules::prefers(const AttentionSpec &spec) const {
  // On the signature only (a kernel serves every length): head dims that fill
  // 32-column fragments. Decode (one query) pays for 32-query tiles until
  // split-KV decode has its own plan.
  return geo_.tile == 16 || ir::padded(spec.head_dim_v, 16) % 32 == 0;
}

std::string TransposedRules::concat(std::string_view frags) const {
  std::string lanes;
  for (int i = 0; i < operand_elems() * geo_.k_tiles; ++i)
    lanes += fmt::format(", {}", i);
  return fmt::format("__builtin_shufflevector({0}[0], {0}[1]{1})", frags, lanes);
}

std::string TransposedRules::mma(std::string_view lds, std::string_view reg) const {
  if (geo_.k_tiles > 1)
    return fmt::format("acc = fj_mma({}, {}, acc);", concat(lds), concat(reg));
  if (geo_.k_split > 1)
    return fmt::format("acc = fj_mma(fj_lo4({0}), fj_lo4({1}), acc); // k 0-3 of each lane group\n"
                       "acc = fj_mma(fj_hi4({0}), fj_hi4({1}), acc); // k 4-7",
                       lds, reg);
  return fmt::format("acc = fj_mma({}, {}, acc);", lds, reg);
}

// k_tiles > 1: the product loop gathers the fragments of consecutive k tiles
// into arrays (Rules::k_step): `kf` / `vf` and `q` / `p` name those arrays.
std::string TransposedRules::mma_s(std::string_view q) const { return mma("kf", q); }

std::string TransposedRules::mma_o(std::string_view p) const { return mma("vf", p); }

void TransposedRules::emit_p_operand(HipWriter &w, std::string_view dst, std::string_view src,
                                     int key_tiles) const {
  const int parts = geo_.tile / 16; // 16-key tiles per accumulator fragment (check(): 1 or 2)
  if (!geo_.whole_operand && parts == 1) {
    w.line("// The S^T accumulator's lane map is the P^T operand's map: the same registers.");
    w.line("{} (&{})[kQTiles][{}] = {};", operand_type_, dst, key_tiles, src);
    return;
  }
  w.line("{} {}[kQTiles][{}];", operand_type_, dst, key_tiles);
  if (!geo_.whole_operand) {
    w.line("// The S^T accumulator of {} keys holds the P^T operands of its {} 16-key tiles,",
           geo_.tile, parts);
    w.line("// {} elements each: the same registers.", operand_elems());
    w.line("#pragma unroll");
    w.open("for (int qt = 0; qt < kQTiles; ++qt) {{");
    w.line("#pragma unroll");
    w.line("for (int k = 0; k < {0}; ++k) {1}[qt][k] = k % 2 ? fj_hi8({2}[qt][k / 2]) : "
           "fj_lo8({2}[qt][k / 2]);",
           key_tiles, dst, src);
    w.close();
    return;
  }
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
