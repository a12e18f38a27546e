// Lowering of the attention tile IR to HIP: the op walk shared by every
// family. Values become per-lane register arrays (accumulator fragments of 16
// query rows, per-row statistics), K and V tiles are staged through LDS by the
// whole workgroup with 128-bit loads, and each IR op becomes one commented block
// of loops over fragments. What differs between families (how a fragment maps
// onto lanes, how operand fragments are read, the matrix instruction and the
// prelude) comes from lowering/rules.h: rules_gfx12.cpp, rules_sm80.cpp.
#include "lowering/lower.h"

#include "lowering/hip_writer.h"
#include "lowering/rules.h"
#include "templates/templates.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <map>
#include <set>

namespace flashjit::lowering {

namespace {

using ir::Op;
using ir::OpKind;
using ir::TileLayout;
using ir::Type;
using ir::ValueId;

constexpr int kFrag = 16; // rows of an accumulator fragment; k of an operand fragment

// LDS row padding (elements) so consecutive rows start in different banks.
constexpr int kLdsPad = 8;

std::string float_literal(double x) {
  if (std::isinf(x))
    return x < 0 ? "-__builtin_inff()" : "__builtin_inff()";
  std::string s = fmt::format("{:.9g}", x);
  if (s.find_first_of(".e") == std::string::npos)
    s += ".0";
  return s + "f";
}

class KernelEmitter {
public:
  KernelEmitter(const ir::Program &p, const Target &t, const Rules &r, const MatrixInstr &mi)
      : p_(p), target_(t), rules_(r), mi_(mi), printed_(ir::value_names(p)) {}

  Expected<Lowered> run();

private:
  // ---- value naming and shapes ----
  // The C identifier of a value: its printed IR name (`%6` -> t6, `%m` -> m), so
  // the comments in the HIP match `flashjit emit --print-ir`.
  std::string name(ValueId v) const {
    const std::string &n = printed_[v];
    return std::isdigit(static_cast<unsigned char>(n[0])) ? "t" + n : n;
  }
  const Type &type(ValueId v) const { return p_.type_of(v); }
  int tiles(int64_t extent) const { return int(extent / kFrag); }
  // Accumulator fragments along a tile's columns.
  int col_tiles(int64_t cols) const { return int(cols / rules_.n_tile()); }
  static std::string seq_const(const ir::TensorParam &t) {
    return t.name == "Q" || t.name == "O" || t.name == "LSE" ? "kSeqQ" : "kSeqK";
  }
  static std::string dim_const(const ir::TensorParam &t) {
    return t.name == "Q" || t.name == "K" ? "kDimQK" : "kDimV";
  }

  Status declare_params();
  // Adds a named constant once (the loop body is emitted twice, see emit_for).
  void add_constant(std::string decl, std::string comment) {
    for (const auto &c : constants_)
      if (c.first == decl)
        return;
    constants_.emplace_back(std::move(decl), std::move(comment));
  }
  Status find_mask(const std::vector<Op> &body);
  void emit_constants();
  Status emit_ops(const std::vector<Op> &body);
  Status emit_op(const Op &op);
  Status emit_load(const Op &op);
  Status emit_store(const Op &op);
  Status emit_for(const Op &op);
  void emit_copy(ValueId dst_name_of, const std::string &dst, ValueId src);
  // Loads `len` elements at src + d0 into frag[first...]: one vector load where the
  // run is in bounds and aligned, else element by element with bounds checks.
  void emit_run_load(const std::string &frag, int first, int len, bool whole,
                     const std::string &dim, const std::string &dim_stride);
  std::string declare(ValueId v);
  // Emits `for` headers over a value's fragments; returns the element expression.
  std::string open_elements(const Type &t, const std::string &var);
  void close_elements(const Type &t);
  void barrier_if_read(const std::string &buffer);
  const Op *consumer_of(ValueId v, const std::vector<Op> &body) const;

  const ir::Program &p_;
  const Target &target_;
  const Rules &rules_;
  const MatrixInstr &mi_;
  std::vector<std::string> printed_;
  HipWriter w_;
  int64_t block_m_ = 0, block_n_ = 0, q_tiles_ = 0, waves_ = 0;
  int lds_bytes_ = 0;
  int scale_constants_ = 0;
  std::map<ValueId, std::string> lds_of_;          // #mma_b tiles live in LDS
  std::map<std::string, std::string> lds_role_;    // buffer -> "rows" | "transposed"
  std::map<std::string, std::string> lds_strides_; // buffer -> its stride constant
  std::set<std::string> read_since_barrier_;
  std::map<ValueId, const Op *> def_of_;
  std::vector<std::pair<std::string, std::string>> constants_; // emitted before the kernel
  std::vector<std::string> lds_decls_;                         // emitted at the top of the body
  bool vec_ok_ = true;
  Op mask_{OpKind::Mask, {}, {}, {}, {}, {}}; // the mask attributes every mask and loop shares
};

std::string KernelEmitter::declare(ValueId v) {
  const Type &t = type(v);
  const std::string n = name(v);
  if (t.is_index())
    return fmt::format("int {}", n);
  if (t.is_vector())
    return fmt::format("float {}[kQTiles][kRowSlots]", n);
  if (t.layout == TileLayout::mma_a)
    return fmt::format("{} {}[kQTiles][{}]", rules_.operand_type(), n, tiles(t.cols));
  return fmt::format("{} {}[kQTiles][{}]",
                     t.dtype == DType::f32 ? rules_.acc_type() : rules_.acc16_type(), n,
                     col_tiles(t.cols));
}

std::string KernelEmitter::open_elements(const Type &t, const std::string &var) {
  w_.line("#pragma unroll");
  w_.open("for (int qt = 0; qt < kQTiles; ++qt) {{");
  w_.line("#pragma unroll");
  if (t.is_vector()) {
    w_.open("for (int s = 0; s < kRowSlots; ++s) {{");
    return var + "[qt][s]";
  }
  w_.open("for (int c = 0; c < {}; ++c) {{", col_tiles(t.cols));
  w_.line("#pragma unroll");
  w_.open("for (int e = 0; e < kAccElems; ++e) {{");
  return var + "[qt][c][e]";
}

void KernelEmitter::close_elements(const Type &t) {
  if (!t.is_vector())
    w_.close();
  w_.close();
  w_.close();
}

void KernelEmitter::barrier_if_read(const std::string &buffer) {
  if (read_since_barrier_.count(buffer)) {
    w_.line("fj_barrier(); // every wave is done reading {} before it is overwritten", buffer);
    read_since_barrier_.clear();
  }
}

const Op *KernelEmitter::consumer_of(ValueId v, const std::vector<Op> &body) const {
  for (const Op &op : body) {
    if (std::find(op.operands.begin(), op.operands.end(), v) != op.operands.end())
      return &op;
    if (const Op *inner = consumer_of(v, op.body))
      return inner;
  }
  return nullptr;
}

// The masks become kernel constants, so every mask and loop must agree on them.
Status KernelEmitter::find_mask(const std::vector<Op> &body) {
  for (const Op &op : body) {
    if (op.kind == OpKind::Mask || op.kind == OpKind::For) {
      ir::Attrs a;
      for (const char *k : {"causal", "window_left", "window_right"})
        if (op.attrs.count(k))
          a[k] = op.attrs.at(k);
      if (mask_.attrs.empty())
        mask_.attrs = a;
      else if (mask_.attrs != a)
        return Status::error("{} rules: the program's masks disagree (causal/window differ between "
                             "ops); one kernel implements one mask",
                             rules_.name());
    }
    FJ_RETURN_IF_ERROR(find_mask(op.body));
  }
  return Status::ok();
}

Status KernelEmitter::declare_params() {
  for (const ir::TensorParam &t : p_.tensors) {
    if (t.name == "LSE")
      continue;
    if (t.strides.dim != 1 || t.strides.seq % 8 || t.strides.head % 8 || t.strides.batch % 8 ||
        t.dim % 8)
      vec_ok_ = false;
  }
  return Status::ok();
}

void KernelEmitter::emit_constants() {
  const ir::TensorParam &q = *p_.tensor("Q"), &k = *p_.tensor("K"), &v = *p_.tensor("V");
  auto c = [&](std::string decl, std::string comment) {
    constants_.emplace_back(std::move(decl), std::move(comment));
  };
  c(fmt::format("constexpr int kWave = {};", target_.wave_size), "lanes per wave");
  c(fmt::format("constexpr int kWaves = {};", waves_),
    "waves per workgroup; each owns kQTiles x 16 queries");
  c(fmt::format("constexpr int kThreads = {};", waves_ * target_.wave_size),
    "work-items per workgroup");
  c(fmt::format("constexpr int kBlockM = {};", block_m_), "queries per workgroup");
  c(fmt::format("constexpr int kBlockN = {};", block_n_), "keys per KV block");
  c(fmt::format("constexpr int kQTiles = {};", q_tiles_), "16-query tiles per wave");
  c(fmt::format("constexpr int kNTile = {};", rules_.n_tile()),
    "columns of an accumulator fragment");
  c(fmt::format("constexpr int kAccElems = {};", rules_.acc_elems()),
    "accumulator elements per lane and fragment");
  c(fmt::format("constexpr int kRowSlots = {};", rules_.row_slots()),
    "query rows per lane and 16-row fragment");
  c(fmt::format("constexpr int kSeqQ = {};", q.seq), "seqlen_q");
  c(fmt::format("constexpr int kSeqK = {};", k.seq), "seqlen_k");
  c(fmt::format("constexpr int kDimQK = {};", q.dim),
    "head_dim_qk (padded to 16 in registers only)");
  c(fmt::format("constexpr int kDimV = {};", v.dim), "head_dim_v (padded to 16 in registers only)");
  c(fmt::format("constexpr int kGroup = {};", p_.group), "query heads per KV head (GQA/MQA)");
  c(fmt::format("constexpr bool kCausal = {};", mask_.int_attr("causal") ? "true" : "false"),
    "bottom-right aligned when seqlen_q != seqlen_k");
  c(fmt::format("constexpr int kWindowLeft = {};", mask_.int_attr("window_left", -1)),
    "-1: unbounded");
  c(fmt::format("constexpr int kWindowRight = {};", mask_.int_attr("window_right", -1)),
    "-1: unbounded");
  c(fmt::format("constexpr bool kVecLoads = {};", vec_ok_ ? "true" : "false"),
    "rows are 16-byte aligned runs: 128-bit global loads and stores");
  for (const ir::TensorParam &t : p_.tensors)
    c(fmt::format(
          "constexpr long k{0}BatchStride = {1}, k{0}HeadStride = {2}, k{0}SeqStride = {3};",
          t.name, t.strides.batch, t.strides.head, t.strides.seq),
      fmt::format("{} strides (elements){}", t.name,
                  t.dim ? fmt::format("; dim stride {}", t.strides.dim) : ""));
  for (const ir::TensorParam &t : p_.tensors)
    if (t.dim && t.strides.dim != 1)
      c(fmt::format("constexpr long k{}DimStride = {};", t.name, t.strides.dim), "");
}

Expected<Lowered> KernelEmitter::run() {
  const ir::Attrs &cfg = p_.config;
  auto get = [&](const char *k) { return cfg.count(k) ? std::get<int64_t>(cfg.at(k)) : 0; };
  block_m_ = get("block_m");
  block_n_ = get("block_n");
  waves_ = get("waves");
  if (get("q_in_lds"))
    return Status::error("{} rules: config q_in_lds=1 is not supported yet: keep Q in registers",
                         rules_.name());
  if (waves_ < 1 || block_m_ % (kFrag * waves_) != 0)
    return Status::error("{} rules: block_m ({}) must be a multiple of 16 x waves ({})",
                         rules_.name(), block_m_, waves_);
  if (block_n_ % kFrag != 0)
    return Status::error("{} rules: block_n ({}) must be a multiple of 16", rules_.name(),
                         block_n_);
  if (waves_ * target_.wave_size > target_.max_workgroup_size)
    return Status::error("{} waves of {} lanes exceed {}'s workgroup limit of {} work-items",
                         waves_, target_.wave_size, target_.arch, target_.max_workgroup_size);
  q_tiles_ = block_m_ / (kFrag * waves_);
  FJ_RETURN_IF_ERROR(find_mask(p_.body));
  FJ_RETURN_IF_ERROR(declare_params());
  emit_constants();

  // The kernel body first (it decides the LDS buffers), then the text around it.
  HipWriter body;
  std::swap(w_, body);
  w_.indent(1);
  w_.line("const int lane = fj_thread_id() % kWave;");
  w_.line("const int wave = fj_thread_id() / kWave;");
  rules_.emit_lane_vars(w_);
  w_.line("const int {} = fj_group_id_x();", name(p_.grid_args[0]));
  w_.line("const int {} = fj_group_id_y();", name(p_.grid_args[1]));
  w_.line("const int {} = fj_group_id_z();", name(p_.grid_args[2]));
  w_.line("// The query at row r (0..15) of this wave's 16-query tile qt.");
  w_.line("auto query_row = [&](int qt, int r) {{ return {} * kBlockM + (wave * kQTiles + qt) * 16 "
          "+ r; }};",
          name(p_.grid_args[0]));
  FJ_RETURN_IF_ERROR(emit_ops(p_.body));
  std::swap(w_, body);

  const ir::TensorParam &q = *p_.tensor("Q");
  // The kernel text: everything but the target prelude and the matrix wrapper,
  // so the emulator can run the same text under its own prelude.
  HipWriter kernel;
  std::swap(w_, kernel);
  w_.line("// ---- the element type ({}) ----", dtype_name(q.dtype));
  w_.line("FJ_DEVICE float fj_to_f32(fj_bits x) {{ return fj_{}_to_f32(x); }}",
          dtype_name(q.dtype));
  w_.line("FJ_DEVICE fj_bits fj_from_f32(float x) {{ return fj_f32_to_{}(x); }}",
          dtype_name(q.dtype));
  w_.blank();
  w_.line("// ---- the spec and config, as named constants ----");
  for (const auto &[decl, comment] : constants_)
    w_.line("{}{}", decl, comment.empty() ? "" : " // " + comment);
  w_.blank();
  w_.raw(templates::attention_common);
  w_.blank();
  const char *out_t = "fj_bits *__restrict__";
  const char *in_t = "const fj_bits *__restrict__";
  w_.line("FJ_GLOBAL FJ_WORKGROUP_SIZE({})", waves_ * target_.wave_size);
  w_.line("void {}({} Q, {} K, {} V, {} O, float *__restrict__ LSE)", p_.name, in_t, in_t, in_t,
          out_t);
  w_.open("{{");
  for (const std::string &decl : lds_decls_)
    w_.line("{}", decl);
  w_.raw(body.str());
  w_.close();
  std::swap(w_, kernel);

  w_.line("// flashjit kernel {} for {} ({} rules, wave{}, {})", p_.name, target_.target_id(),
          rules_.name(), target_.wave_size, mi_.builtin.empty() ? mi_.mnemonic : mi_.builtin);
  w_.line("// Generated from the tile IR; `flashjit emit --print-ir` prints the program.");
  w_.line("// Each block below names the IR op it implements.");
  w_.blank();
  w_.raw(rules_.prelude());
  w_.blank();
  w_.line("// ---- the matrix instruction ----");
  rules_.emit_mma_wrapper(w_, mi_, q.dtype);
  w_.blank();
  w_.raw(kernel.str());

  Lowered out;
  out.source = w_.str();
  out.kernel_text = kernel.str();
  out.kernel_name = p_.name;
  out.grid[0] = p_.grid_q_blocks;
  out.grid[1] = p_.grid_heads;
  out.grid[2] = p_.grid_batch;
  out.block_threads = int(waves_ * target_.wave_size);
  out.lds_bytes = lds_bytes_;
  out.mma = &mi_;
  out.rules = std::string(rules_.name());
  out.pointer_alignment = vec_ok_ ? 16 : 2;
  return out;
}

Status KernelEmitter::emit_ops(const std::vector<Op> &body) {
  for (const Op &op : body) {
    for (ValueId r : op.results)
      def_of_[r] = &op;
    FJ_RETURN_IF_ERROR(emit_op(op));
  }
  return Status::ok();
}

Status KernelEmitter::emit_op(const Op &op) {
  const std::string what = op_info(op.kind).name;
  auto unsupported = [&](const std::string &why) {
    return Status::error("{} rules cannot lower `{}`: {}", rules_.name(), what, why);
  };
  if (op.kind != OpKind::For && op.kind != OpKind::Yield) {
    std::string res;
    for (ValueId r : op.results)
      res += (res.empty() ? "%" : ", %") + printed_[r];
    std::string args;
    for (ValueId a : op.operands)
      args += (args.empty() ? "%" : ", %") + printed_[a];
    for (const auto &[key, attr] : op.attrs)
      if (key == "value" || key == "tensor")
        args += fmt::format("{}{{{} = {}}}", args.empty() ? "" : " ", key,
                            std::holds_alternative<ir::Symbol>(attr)
                                ? "@" + std::get<ir::Symbol>(attr).name
                                : fmt::format("{}", std::get<double>(attr)));
    w_.line("// IR: {}{}{}{}", res.empty() ? "" : res + " = ", what, args.empty() ? "" : " ", args);
  }
  // expr_fmt uses {0} for operand 0's element and {1} for operand 1's. A per-row
  // vector operand of a tile op reads the row slot of the element.
  auto element = [&](ValueId v, const Type &result) {
    if (!type(v).is_vector())
      return name(v) + "[qt][c][e]";
    return result.is_vector() ? name(v) + "[qt][s]"
                              : fmt::format("{}[qt][{}]", name(v), rules_.acc_slot("e"));
  };
  auto elementwise = [&](const std::string &expr_fmt) -> Status {
    const Type &t = type(op.results[0]);
    w_.line("{};", declare(op.results[0]));
    const std::string dst = open_elements(t, name(op.results[0]));
    const std::string a = element(op.operands[0], t);
    const std::string b = op.operands.size() > 1 ? element(op.operands[1], t) : "";
    w_.line("{} = {};", dst, fmt::format(fmt::runtime(expr_fmt), a, b));
    close_elements(t);
    return Status::ok();
  };

  switch (op.kind) {
  case OpKind::Load:
    return emit_load(op);
  case OpKind::Store:
    return emit_store(op);
  case OpKind::Fill: {
    const Type &t = type(op.results[0]);
    w_.line("{};", declare(op.results[0]));
    const std::string dst = open_elements(t, name(op.results[0]));
    w_.line("{} = {};", dst, float_literal(op.float_attr("value")));
    close_elements(t);
    return Status::ok();
  }
  case OpKind::MmaABt:
  case OpKind::MmaAB: {
    // S = Q K^T (mma_abt: K staged row-major) and O += P V (mma_ab: V staged
    // transposed); the rules read the LDS fragment and order the operands.
    const bool s_product = op.kind == OpKind::MmaABt;
    auto it = lds_of_.find(op.operands[1]);
    if (it == lds_of_.end() || type(op.operands[0]).layout != TileLayout::mma_a)
      return unsupported("expects A in registers (#mma_a) and B staged in LDS");
    const Type &t = type(op.results[0]);
    const int kt = tiles(type(op.operands[0]).cols);
    w_.line("{};", declare(op.results[0]));
    w_.line("#pragma unroll");
    w_.open("for (int qt = 0; qt < kQTiles; ++qt) {{");
    w_.line("#pragma unroll");
    w_.open("for (int c = 0; c < {}; ++c) {{", col_tiles(t.cols));
    w_.line("{} acc = {}[qt][c];", rules_.acc_type(), name(op.operands[2]));
    w_.line("#pragma unroll");
    w_.open("for (int k = 0; k < {}; ++k) {{", kt);
    const std::string a_frag = name(op.operands[0]) + "[qt][k]";
    if (s_product) {
      rules_.emit_k_fragment(w_, it->second, lds_strides_.at(it->second));
      w_.line("{}", rules_.mma_s(a_frag));
    } else {
      rules_.emit_v_fragment(w_, it->second, lds_strides_.at(it->second));
      w_.line("{}", rules_.mma_o(a_frag));
    }
    w_.close();
    w_.line("{}[qt][c] = acc;", name(op.results[0]));
    w_.close();
    w_.close();
    read_since_barrier_.insert(it->second);
    return Status::ok();
  }
  case OpKind::Scale: {
    const std::string k = fmt::format("kScale{}", scale_constants_++);
    add_constant(fmt::format("constexpr float {} = {};", k, float_literal(op.float_attr("factor"))),
                 fmt::format("factor of IR op `scale` (%{})", name(op.results[0])));
    return elementwise("{0} * " + k);
  }
  case OpKind::Mask: {
    const Type &t = type(op.results[0]);
    w_.line("{};", declare(op.results[0]));
    w_.line("const bool {}_full = fj_block_unmasked({}, {});", name(op.results[0]),
            name(op.operands[1]), name(op.operands[2]));
    const std::string dst = open_elements(t, name(op.results[0]));
    w_.line("const int key = {} * kBlockN + c * kNTile + {};", name(op.operands[2]),
            rules_.acc_col("e"));
    w_.line("{} = {}_full || fj_visible(query_row(qt, {}), key) ? {}[qt][c][e] : "
            "-__builtin_inff();",
            dst, name(op.results[0]), rules_.acc_row("e"), name(op.operands[0]));
    close_elements(t);
    return Status::ok();
  }
  case OpKind::RowMax:
  case OpKind::RowSum: {
    // In-lane over the elements of each row slot, then across the lanes that
    // hold the row's other columns.
    const bool is_max = op.kind == OpKind::RowMax;
    const Type &src = type(op.operands[0]);
    if (src.layout != TileLayout::mma_acc)
      return unsupported("row reductions need a #mma_acc tile");
    const std::string r = name(op.results[0]);
    const std::string x = name(op.operands[0]);
    w_.line("{};", declare(op.results[0]));
    w_.line("#pragma unroll");
    w_.open("for (int qt = 0; qt < kQTiles; ++qt) {{");
    w_.line("float r[kRowSlots];");
    w_.line("#pragma unroll");
    w_.line("for (int s = 0; s < kRowSlots; ++s) r[s] = {};",
            is_max ? "-__builtin_inff()" : "0.0f");
    w_.line("#pragma unroll");
    w_.open("for (int c = 0; c < {}; ++c) {{", col_tiles(src.cols));
    w_.line("#pragma unroll");
    w_.open("for (int e = 0; e < kAccElems; ++e) {{");
    w_.line("float &y = r[{}];", rules_.acc_slot("e"));
    w_.line("y = {};", is_max ? fmt::format("fj_max(y, {}[qt][c][e])", x)
                              : fmt::format("y + {}[qt][c][e]", x));
    w_.close();
    w_.close();
    w_.line("#pragma unroll");
    w_.open("for (int s = 0; s < kRowSlots; ++s) {{");
    for (int mask : rules_.row_share_masks())
      w_.line("r[s] = {}; // the lanes holding the row's other columns",
              is_max ? fmt::format("fj_max(r[s], fj_shfl_xor(r[s], lane, {}))", mask)
                     : fmt::format("r[s] + fj_shfl_xor(r[s], lane, {})", mask));
    w_.line("{}[qt][s] = r[s];", r);
    w_.close();
    w_.close();
    return Status::ok();
  }
  case OpKind::Max:
    return elementwise("fj_max({0}, {1})");
  case OpKind::Add:
    return elementwise("{0} + {1}");
  case OpKind::Sub:
    return elementwise("{0} - {1}");
  case OpKind::Mul:
    return elementwise("{0} * {1}");
  case OpKind::Exp2:
    return elementwise("fj_exp2({0})");
  case OpKind::Log2:
    return elementwise("fj_log2({0})");
  case OpKind::ZeroIfNegInf:
    return elementwise("{0} == -__builtin_inff() ? 0.0f : {0}");
  case OpKind::SubRow:
    return elementwise("{0} - {1}");
  case OpKind::MulRow:
    return elementwise("{0} * {1}");
  case OpKind::DivRow:
    return elementwise("{1} == 0.0f ? 0.0f : {0} * fj_rcp({1})");
  case OpKind::Convert: {
    const Type &t = type(op.results[0]);
    if (t.dtype == DType::f32 || type(op.operands[0]).dtype != DType::f32)
      return unsupported("only f32 -> bf16/f16 conversions are lowered");
    return elementwise("fj_from_f32({0})");
  }
  case OpKind::ConvertLayout: {
    const Type &from = type(op.operands[0]), &to = type(op.results[0]);
    if (!(from.layout == TileLayout::mma_acc && to.layout == TileLayout::mma_a &&
          to.dtype != DType::f32))
      return unsupported(fmt::format("no {} rule converts #{} to #{}", rules_.name(),
                                     tile_layout_name(from.layout), tile_layout_name(to.layout)));
    rules_.emit_p_operand(w_, name(op.results[0]), name(op.operands[0]), tiles(to.cols));
    return Status::ok();
  }
  case OpKind::For:
    return emit_for(op);
  case OpKind::Yield:
    return Status::ok(); // emit_for copies the yielded values
  }
  return unsupported("unknown op");
}

Status KernelEmitter::emit_load(const Op &op) {
  const ir::TensorParam &t = *p_.tensor(op.symbol_attr("tensor"));
  const Type &ty = type(op.results[0]);
  const std::string idx = name(op.operands[0]);
  const std::string head = t.name == "K" || t.name == "V" ? "head / kGroup" : "head";
  const std::string base =
      fmt::format("{0} + long({1}) * k{0}BatchStride + long({2}) * k{0}HeadStride", t.name,
                  name(p_.grid_args[2]), head);
  const std::string dim_stride = t.strides.dim == 1 ? "" : fmt::format(" * k{}DimStride", t.name);
  if (ty.layout == TileLayout::mma_a) {
    // Operand fragments straight from global memory, run by run: each run is
    // `len` consecutive head-dim entries of one query row.
    const int len = rules_.operand_run_len();
    const std::vector<FragmentRun> runs = rules_.operand_runs();
    w_.line("{};", declare(op.results[0]));
    w_.line("const fj_bits *{}_base = {};", name(op.results[0]), base);
    w_.line("#pragma unroll");
    w_.open("for (int qt = 0; qt < kQTiles; ++qt) {{");
    w_.line("#pragma unroll");
    w_.open("for (int c = 0; c < {}; ++c) {{", tiles(ty.cols));
    w_.line("{} frag = {{{}}};", rules_.operand_type(),
            fmt::join(std::vector<int>(len * runs.size(), 0), ", "));
    for (size_t r = 0; r < runs.size(); ++r) {
      w_.open("{{");
      w_.line("const int row = query_row(qt, {});", runs[r].row);
      w_.line("const int d0 = c * 16 + {};", runs[r].col);
      w_.line("const fj_bits *src = {}_base + long(row) * k{}SeqStride;", name(op.results[0]),
              t.name);
      w_.open("if (row < {}) {{", seq_const(t));
      emit_run_load("frag", int(r) * len, len, runs.size() == 1, dim_const(t), dim_stride);
      w_.close();
      w_.close();
    }
    w_.line("{}[qt][c] = frag;", name(op.results[0]));
    w_.close();
    w_.close();
    return Status::ok();
  }
  if (ty.layout != TileLayout::mma_b)
    return Status::error("{} rules cannot lower `load` into #{}", rules_.name(),
                         tile_layout_name(ty.layout));
  // A B operand is staged in LDS by the whole workgroup with 128-bit loads. As
  // B^T (K, consumer mma_abt) it is stored row-major; as B (V, consumer mma_ab)
  // transposed, so that each lane's 8 consecutive keys are one 128-bit LDS read.
  const Op *use = consumer_of(op.results[0], p_.body);
  if (!use || (use->kind != OpKind::MmaABt && use->kind != OpKind::MmaAB))
    return Status::error("{} rules: a #mma_b tile must feed mma_ab or mma_abt", rules_.name());
  const bool transposed = use->kind == OpKind::MmaAB;
  const std::string buf = fmt::format("lds_{}", [&] {
    std::string s = t.name;
    std::transform(s.begin(), s.end(), s.begin(), ::tolower);
    return s + (transposed ? "t" : "");
  }());
  const int64_t rows = ty.rows, cols = ty.cols;
  const int64_t stride = transposed ? rows + kLdsPad : cols + kLdsPad;
  const int64_t elems = transposed ? cols * stride : rows * stride;
  const std::string stride_name = fmt::format("kLds{}Stride", t.name + (transposed ? "t" : ""));
  if (!lds_role_.count(buf)) {
    lds_role_[buf] = transposed ? "transposed" : "rows";
    constants_.emplace_back(
        fmt::format("constexpr int {} = {};", stride_name, stride),
        fmt::format("LDS row stride of the {} tile (elements, padded by {} against bank conflicts)",
                    t.name, kLdsPad));
    lds_strides_[buf] = stride_name;
    lds_bytes_ += int(elems * 2);
    lds_decls_.push_back(
        fmt::format("FJ_LDS_ARRAY(fj_bits, {}, {}); // {} tile {}x{}{}, rows padded by {}", buf,
                    elems, t.name, rows, cols, transposed ? " stored transposed" : "", kLdsPad));
  }
  barrier_if_read(buf);
  w_.line("const fj_bits *{}_src = {};", name(op.results[0]), base);
  w_.line("// {} rows x {} chunks of 8 elements, one 128-bit load each where aligned", rows,
          cols / 8);
  w_.open("for (int i = fj_thread_id(); i < {} * {}; i += kThreads) {{", rows, cols / 8);
  w_.line("const int r = i / {}, d0 = (i % {}) * 8;", cols / 8, cols / 8);
  w_.line("const int row = {} * {} + r;", idx, rows == block_n_ ? "kBlockN" : std::to_string(rows));
  w_.line("const fj_bits *src = {}_src + long(row) * k{}SeqStride;", name(op.results[0]), t.name);
  w_.line("fj_bits8 chunk = {{0, 0, 0, 0, 0, 0, 0, 0}};");
  w_.open("if (row < {}) {{", seq_const(t));
  w_.line("if (kVecLoads && d0 + 8 <= {})", dim_const(t));
  w_.line("  chunk = fj_global_load8(src + d0);");
  w_.line("else");
  w_.line("  for (int e = 0; e < 8; ++e)");
  w_.line("    if (d0 + e < {}) chunk[e] = fj_global_load1(src + long(d0 + e){});", dim_const(t),
          dim_stride);
  w_.close();
  if (transposed) {
    w_.line("#pragma unroll");
    w_.line("for (int e = 0; e < 8; ++e) fj_lds_store1(&{}[(d0 + e) * {} + r], chunk[e]);", buf,
            stride_name);
  } else {
    w_.line("fj_lds_store8(&{}[r * {} + d0], chunk);", buf, stride_name);
  }
  w_.close();
  w_.line("fj_barrier(); // the {} tile is complete before any wave reads it", t.name);
  read_since_barrier_.clear();
  lds_of_[op.results[0]] = buf;
  return Status::ok();
}

Status KernelEmitter::emit_store(const Op &op) {
  const ir::TensorParam &t = *p_.tensor(op.symbol_attr("tensor"));
  const Type &ty = type(op.operands[0]);
  const std::string v = name(op.operands[0]);
  const std::string base =
      fmt::format("{0} + long({1}) * k{0}BatchStride + long({2}) * k{0}HeadStride", t.name,
                  name(p_.grid_args[2]), name(p_.grid_args[1]));
  if (ty.is_vector()) {
    // One value per query row, written by the one lane the rules name for it.
    w_.line("#pragma unroll");
    w_.open("for (int qt = 0; qt < kQTiles; ++qt) {{");
    w_.line("#pragma unroll");
    w_.open("for (int s = 0; s < kRowSlots; ++s) {{");
    w_.line("const int row = query_row(qt, {});", rules_.slot_row("s"));
    w_.line("if ({} && row < {}) fj_global_store_f32({} + long(row) * k{}SeqStride, {}[qt][s]);",
            rules_.row_writer(), seq_const(t), base, t.name, v);
    w_.close();
    w_.close();
    return Status::ok();
  }
  if (ty.layout != TileLayout::mma_acc || ty.dtype == DType::f32)
    return Status::error("{} rules: `store` takes a converted #mma_acc tile", rules_.name());
  const std::string dim_stride = t.strides.dim == 1 ? "" : fmt::format(" * k{}DimStride", t.name);
  // The accumulator fragment, run by run: `len` consecutive head-dim entries of one row.
  const int len = rules_.acc_run_len();
  const std::vector<FragmentRun> runs = rules_.acc_runs();
  w_.line("fj_bits *{}_dst = {};", v, base);
  w_.line("#pragma unroll");
  w_.open("for (int qt = 0; qt < kQTiles; ++qt) {{");
  w_.line("#pragma unroll");
  w_.open("for (int c = 0; c < {}; ++c) {{", col_tiles(ty.cols));
  for (size_t r = 0; r < runs.size(); ++r) {
    w_.open("{{");
    w_.line("const int row = query_row(qt, {});", runs[r].row);
    w_.line("const int d0 = c * kNTile + {};", runs[r].col);
    w_.line("fj_bits *dst = {}_dst + long(row) * k{}SeqStride;", v, t.name);
    w_.open("if (row < {}) {{", seq_const(t));
    const int first = int(r) * len;
    w_.line("if (kVecLoads && d0 + {} <= {})", len, dim_const(t));
    if (runs.size() == 1 && len == 8)
      w_.line("  fj_global_store8(dst + d0, {}[qt][c]);", v);
    else if (len == 2)
      w_.line("  fj_global_store2(dst + d0, {0}[qt][c][{1}], {0}[qt][c][{2}]);", v, first,
              first + 1);
    else
      w_.line("  for (int i = 0; i < {}; ++i) fj_global_store1(dst + d0 + i, {}[qt][c][{} + i]);",
              len, v, first);
    w_.line("else");
    w_.line("  for (int i = 0; i < {}; ++i)", len);
    w_.line("    if (d0 + i < {}) fj_global_store1(dst + long(d0 + i){}, {}[qt][c][{}]);",
            dim_const(t), dim_stride, v, first ? fmt::format("{} + i", first) : "i");
    w_.close();
    w_.close();
  }
  w_.close();
  w_.close();
  return Status::ok();
}

void KernelEmitter::emit_run_load(const std::string &frag, int first, int len, bool whole,
                                  const std::string &dim, const std::string &dim_stride) {
  w_.line("if (kVecLoads && d0 + {} <= {})", len, dim);
  if (whole)
    w_.line("  {} = fj_global_load{}(src + d0);", frag, len);
  else
    w_.line("  {{ const fj_bits{0} v = fj_global_load{0}(src + d0); for (int i = 0; i < {0}; ++i) "
            "{1}[{2} + i] = v[i]; }}",
            len, frag, first);
  w_.line("else");
  w_.line("  for (int i = 0; i < {}; ++i)", len);
  w_.line("    if (d0 + i < {}) {}[{}] = fj_global_load1(src + long(d0 + i){});", dim, frag,
          first ? fmt::format("{} + i", first) : "i", dim_stride);
}

void KernelEmitter::emit_copy(ValueId, const std::string &dst, ValueId src) {
  const Type &t = type(src);
  const std::string d = open_elements(t, dst);
  w_.line("{} = {};", d, t.is_vector() ? name(src) + "[qt][s]" : name(src) + "[qt][c][e]");
  close_elements(t);
}

Status KernelEmitter::emit_for(const Op &op) {
  std::string res;
  for (ValueId r : op.results)
    res += (res.empty() ? "%" : ", %") + name(r);
  w_.line("// IR: {} = for %{} over the KV blocks visible to %{} (loop-carried: running max, sum, "
          "output)",
          res, name(op.region_args[0]), name(op.operands[0]));
  // Loop-carried tiles live in the region arguments' variables.
  for (size_t i = 1; i < op.region_args.size(); ++i) {
    w_.line("{};", declare(op.region_args[i]));
    emit_copy(op.region_args[i], name(op.region_args[i]), op.operands[i]);
  }
  w_.line("int kv_begin, kv_end;");
  w_.line("fj_kv_range({}, &kv_begin, &kv_end);", name(op.operands[0]));
  w_.open("for (int {0} = kv_begin; {0} < kv_end; ++{0}) {{", name(op.region_args[0]));
  // Two passes over the body decide the barriers across the back edge: what the
  // end of one iteration read must be fenced before the next overwrites it.
  const HipWriter saved = w_;
  const int saved_scales = scale_constants_;
  const std::set<std::string> at_entry = read_since_barrier_;
  FJ_RETURN_IF_ERROR(emit_ops(op.body));
  w_ = saved;
  scale_constants_ = saved_scales;
  read_since_barrier_.insert(at_entry.begin(), at_entry.end());
  FJ_RETURN_IF_ERROR(emit_ops(op.body));
  const Op &y = op.body.back();
  w_.line("// IR: yield");
  for (size_t i = 0; i < y.operands.size(); ++i)
    emit_copy(op.region_args[i + 1], name(op.region_args[i + 1]), y.operands[i]);
  w_.close();
  for (size_t i = 0; i < op.results.size(); ++i) {
    const Type &t = type(op.results[i]);
    if (t.is_vector())
      w_.line("float (&{})[kQTiles][kRowSlots] = {};", name(op.results[i]),
              name(op.region_args[i + 1]));
    else
      w_.line("{} (&{})[kQTiles][{}] = {};", rules_.acc_type(), name(op.results[i]),
              col_tiles(t.cols), name(op.region_args[i + 1]));
  }
  return Status::ok();
}

} // namespace

ir::Config default_config(const AttentionSpec &spec, const Target &target) {
  ir::Config c;
  c.waves = 4;
  c.block_m = 16 * c.waves;
  c.pad_k = 16;
  const int64_t d = std::max(ir::padded(spec.head_dim_qk, 16), ir::padded(spec.head_dim_v, 16));
  // Keep the S^T tile small where the O^T accumulator and Q fragments take most VGPRs.
  c.block_n = d <= 128 ? 64 : d <= 192 ? 32 : 16;
  return c;
}

Status check_fits(const AttentionSpec &spec, const ir::Config &c, const Target &t) {
  const int64_t dqk = ir::padded(spec.head_dim_qk, c.pad_k),
                dv = ir::padded(spec.head_dim_v, c.pad_k);
  const int64_t lds = c.block_n * (dqk + kLdsPad) * 2 + dv * (c.block_n + kLdsPad) * 2;
  if (lds > t.lds_bytes)
    return Status::error(
        "the K and V tiles need {} bytes of LDS (block_n {} x head dims {}/{}) but {} "
        "has {} per workgroup: use a smaller --block-n",
        lds, c.block_n, dqk, dv, t.arch, t.lds_bytes);
  if (c.waves * t.wave_size > t.max_workgroup_size)
    return Status::error("{} waves x {} lanes exceed {}'s workgroup limit of {}", c.waves,
                         t.wave_size, t.arch, t.max_workgroup_size);
  // Registers per lane that live across the KV loop: the O^T accumulator
  // (dv/2 VGPRs per 16-query tile) and the Q fragments (dqk/4), plus S^T (block_n/2).
  const int64_t q_tiles = std::max<int64_t>(1, c.block_m / (16 * c.waves));
  const int64_t vgprs = q_tiles * (dv / 2 + dqk / 4 + c.block_n / 2);
  const int64_t budget = t.max_vgprs - 24; // addresses, indices, statistics
  if (vgprs > budget)
    return Status::error(
        "head dims {}/{} need about {} VGPRs per lane for the accumulator, Q and S "
        "tiles (block_m {}, block_n {}), over {}'s budget of {}: use a smaller "
        "--block-n or head dim",
        spec.head_dim_qk, spec.head_dim_v, vgprs, c.block_m, c.block_n, t.arch, budget);
  return Status::ok();
}

Expected<Lowered> lower(const ir::Program &program, const Target &target) {
  FJ_RETURN_IF_ERROR(ir::verify(program));
  const Rules *rules = rules_for(target);
  if (!rules)
    return Status::error("no lowering rules for {} ({}) yet: families with rules are {}",
                         target.arch, target.family_name(), families_with_rules());
  const DType dt = program.tensor("Q")->dtype;
  auto mi = find_matrix_instr(target, dt, kFrag, rules->n_tile(), kFrag);
  if (!mi)
    return mi.status();
  FJ_RETURN_IF_ERROR(rules->check(**mi, target));
  return KernelEmitter(program, target, *rules, **mi).run();
}

Expected<Lowered> generate(const AttentionSpec &spec, const ir::Config &config,
                           const Target &target) {
  FJ_RETURN_IF_ERROR(spec.validate());
  FJ_RETURN_IF_ERROR(check_fits(spec, config, target));
  auto p = ir::build_attention(spec, config);
  if (!p)
    return p.status();
  return lower(*p, target);
}

} // namespace flashjit::lowering
