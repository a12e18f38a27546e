// Lowering of the attention tile IR to HIP: the op walk shared by every
// family. Values become per-lane register arrays (accumulator fragments of 16
// or 32 query rows, per-row statistics), K and V tiles are staged through LDS by the
// whole workgroup with 128-bit loads, and each IR op becomes one commented block
// of loops over fragments. What differs between families (how a fragment maps
// onto lanes, how operand fragments are read, the matrix instruction and the
// prelude) comes from lowering/rules.h: the AMD families share
// transposed_rules.h (rules_gfx11.cpp, rules_gfx12.cpp, rules_cdna.cpp and the
// portable rules_simt.cpp), NVIDIA has rules_sm80.cpp.
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

constexpr int kKTile = 16; // k of an operand fragment (head-dim entries or keys)

// LDS row padding (elements) so consecutive rows start in different banks.
constexpr int kLdsPad = 8;

std::string c_scalar_type(ir::ScalarType t) {
  switch (t) {
  case ir::ScalarType::i32:
    return "int";
  case ir::ScalarType::i64:
    return "long";
  case ir::ScalarType::f32:
    return "float";
  }
  return "?";
}

std::string float_literal(double x) {
  if (std::isinf(x))
    return x < 0 ? "-FJ_INF" : "FJ_INF";
  std::string s = fmt::format("{:.9g}", x);
  if (s.find_first_of(".e") == std::string::npos)
    s += ".0";
  return s + "f";
}

class KernelEmitter {
public:
  /// `mi` is null for rules without a matrix instruction (simt); `note` says
  /// why these rules were chosen where that is not the family's default.
  KernelEmitter(const ir::Program &p, const Target &t, const Rules &r, const MatrixInstr *mi,
                std::string note)
      : p_(p), target_(t), rules_(r), mi_(mi), note_(std::move(note)),
        printed_(ir::value_names(p)) {}

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
  int tiles(int64_t extent) const { return int(extent / kKTile); }
  // Accumulator fragments along a tile's columns.
  int col_tiles(int64_t cols) const { return int(cols / rules_.n_tile()); }
  // A run-time extent or stride in C: its parameter's name or the constant.
  static std::string c_expr(const ir::Extent &e) {
    return e.is_param() ? e.param : std::to_string(e.value);
  }
  // The rows of a tensor (seqlen_q or seqlen_k).
  static std::string seq_const(const ir::TensorParam &t) { return c_expr(t.seq); }
  // " * q_dim_stride" for a tensor whose head dim is not contiguous, else "".
  static std::string dim_stride(const ir::TensorParam &t) {
    return t.stride_dim == ir::Extent::constant(1) ? "" : " * " + c_expr(t.stride_dim);
  }
  // This workgroup's (batch, head) slice of tensor t, written out at each use:
  // NVIDIA reads kernel arguments from constant memory, so recomputing costs a
  // few integer ops where a hoisted 64-bit pointer would hold registers across
  // the KV loop (sm_90 d=128 went from 168 to 175 registers, 3 -> 2 blocks per
  // SM); LLVM hoists it into scalar registers on AMD by itself.
  std::string head_base(const ir::TensorParam &t) const {
    const bool kv = t.name == "K" || t.name == "V";
    const std::string head =
        kv ? fmt::format("{} / {}", name(p_.grid_arg(1)), c_expr(p_.group)) : name(p_.grid_arg(1));
    return fmt::format("{} + long({}) * {} + long({}) * {}", t.name, name(p_.grid_arg(2)),
                       c_expr(t.stride_batch), head, c_expr(t.stride_head));
  }
  // The first row of block `idx` (of `rows` rows) of a tensor's slice `base`.
  static std::string block_base(const ir::TensorParam &t, const std::string &base,
                                const std::string &idx, const std::string &rows) {
    return fmt::format("{} + long({} * {}) * {}", base, idx, rows, c_expr(t.stride_seq));
  }
  // The offset of row `local` of a block from its first row: 32-bit unsigned,
  // so the access takes a scalar base and a 32-bit lane offset; in range as the
  // runtime checks (Lowered::max_row_stride).
  static std::string row_offset(const ir::TensorParam &t, const std::string &local) {
    if (t.stride_seq == ir::Extent::constant(1))
      return fmt::format("unsigned({})", local);
    return fmt::format("unsigned({}) * unsigned({})", local, c_expr(t.stride_seq));
  }
  // The C value of a mask window attribute: a parameter, a constant, or -1 (none).
  std::string window_expr(const char *key) const {
    auto it = mask_.attrs.find(key);
    if (it == mask_.attrs.end())
      return "-1";
    if (const auto *r = std::get_if<ir::ParamRef>(&it->second))
      return r->name;
    return std::to_string(mask_.int_attr(key, -1));
  }
  // The trailing arguments of the fj_visible / fj_kv_range / fj_block_unmasked helpers.
  std::string mask_args() const {
    return fmt::format("{}, {}, {}, {}", seq_const(*p_.tensor("Q")), seq_const(*p_.tensor("K")),
                       window_expr("window_left"), window_expr("window_right"));
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
  std::string register_lds(const Op &op);
  void emit_stage_issue(const Op &op, const std::string &idx);
  void finish_stage(const Op &op, const std::string &buf);
  Status emit_store(const Op &op);
  Status emit_for(const Op &op);
  bool plan_pipeline(const Op &loop);
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
  // One line per line of `text`.
  void lines(std::string_view text) {
    for (size_t begin = 0; begin <= text.size();) {
      const size_t end = std::min(text.find('\n', begin), text.size());
      w_.line("{}", text.substr(begin, end - begin));
      begin = end + 1;
    }
  }
  const Op *consumer_of(ValueId v, const std::vector<Op> &body) const;

  const ir::Program &p_;
  const Target &target_;
  const Rules &rules_;
  const MatrixInstr *mi_;
  std::string note_;
  std::vector<std::string> printed_;
  HipWriter w_;
  int64_t block_m_ = 0, block_n_ = 0, q_tiles_ = 0, waves_ = 0, pad_k_ = 16;
  int m_tile_ = 16; // query rows of an accumulator fragment (Rules::m_tile)
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
  bool vec4_ok_ = true; // 64-bit runs: head dims and strides that are multiples of 4 (e.g. 100)
  bool q_in_lds_ = false;
  // Software pipelining of the loop's LDS tiles (config stages >= 2): each tile is
  // issued right after the previous one is complete, the first before the loop.
  std::vector<const Op *> pipeline_order_;
  std::set<const Op *> pipelined_loads_;
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

// The widest global access the tensors' row alignment allows (IR `align`):
// 16 bytes for 128-bit runs, 8 for 64-bit ones, else element by element.
Status KernelEmitter::declare_params() {
  for (const ir::TensorParam &t : p_.tensors) {
    if (t.name == "LSE")
      continue;
    const bool unit = t.stride_dim == ir::Extent::constant(1);
    if (!unit || t.row_align < 16 || t.dim % 8)
      vec_ok_ = false;
    if (!unit || t.row_align < 8 || t.dim % 4)
      vec4_ok_ = false;
  }
  return Status::ok();
}

void KernelEmitter::emit_constants() {
  const ir::TensorParam &q = *p_.tensor("Q"), &v = *p_.tensor("V");
  auto c = [&](std::string decl, std::string comment) {
    constants_.emplace_back(std::move(decl), std::move(comment));
  };
  c(fmt::format("constexpr int kWave = {};", target_.wave_size), "lanes per wave");
  c(fmt::format("constexpr int kWaves = {};", waves_),
    fmt::format("waves per workgroup; each owns kQTiles x {} queries", m_tile_));
  c(fmt::format("constexpr int kThreads = {};", waves_ * target_.wave_size),
    "work-items per workgroup");
  c(fmt::format("constexpr int kBlockM = {};", block_m_), "queries per workgroup");
  c(fmt::format("constexpr int kBlockN = {};", block_n_), "keys per KV block");
  c(fmt::format("constexpr int kQTiles = {};", q_tiles_),
    fmt::format("{}-query tiles per wave", m_tile_));
  c(fmt::format("constexpr int kNTile = {};", rules_.n_tile()),
    "columns of an accumulator fragment");
  c(fmt::format("constexpr int kAccElems = {};", rules_.acc_elems()),
    "accumulator elements per lane and fragment");
  c(fmt::format("constexpr int kRowSlots = {};", rules_.row_slots()),
    fmt::format("query rows per lane and {}-row fragment", m_tile_));
  c(fmt::format("constexpr int kDimQK = {};", q.dim),
    fmt::format("head_dim_qk (padded to {} in registers only)", pad_k_));
  c(fmt::format("constexpr int kDimV = {};", v.dim),
    fmt::format("head_dim_v (padded to {} in registers only)", pad_k_));
  c(fmt::format("constexpr bool kCausal = {};", mask_.int_attr("causal") ? "true" : "false"),
    "bottom-right aligned when seqlen_q != seqlen_k");
  c(fmt::format("constexpr bool kVec4Loads = {};", vec4_ok_ ? "true" : "false"),
    "rows are 8-byte aligned runs: 64-bit copies into LDS");
  c(fmt::format("constexpr bool kVecLoads = {};", vec_ok_ ? "true" : "false"),
    "rows are 16-byte aligned runs: 128-bit global loads and stores");
}

Expected<Lowered> KernelEmitter::run() {
  const ir::Attrs &cfg = p_.config;
  auto get = [&](const char *k) { return cfg.count(k) ? std::get<int64_t>(cfg.at(k)) : 0; };
  block_m_ = get("block_m");
  block_n_ = get("block_n");
  waves_ = get("waves");
  q_in_lds_ = get("q_in_lds") != 0;
  if (q_in_lds_ && !rules_.reads_q_from_lds())
    return Status::error("{} rules: config q_in_lds=1 is not supported: keep Q in registers",
                         rules_.name());
  pad_k_ = cfg.count("pad_k") ? get("pad_k") : 16;
  m_tile_ = rules_.m_tile();
  if (waves_ < 1 || block_m_ % (m_tile_ * waves_) != 0)
    return Status::error("{} rules: block_m ({}) must be a multiple of {} x waves ({})",
                         rules_.name(), block_m_, m_tile_, waves_);
  if (block_n_ % kKTile != 0 || block_n_ % rules_.n_tile() != 0)
    return Status::error("{} rules: block_n ({}) must be a multiple of {}", rules_.name(), block_n_,
                         std::max(kKTile, rules_.n_tile()));
  for (const ir::ValueDef &v : p_.values)
    if (v.type.layout == TileLayout::mma_acc && v.type.cols % rules_.n_tile() != 0)
      return Status::error("{} rules: a {}x{} accumulator tile is not made of {}-column "
                           "fragments: use pad_k {} (head_dim_v {} is padded to pad_k {})",
                           rules_.name(), v.type.rows, v.type.cols, rules_.n_tile(),
                           rules_.n_tile(), p_.tensor("V")->dim, pad_k_);
  if (waves_ * target_.wave_size > target_.max_workgroup_size)
    return Status::error("{} waves of {} lanes exceed {}'s workgroup limit of {} work-items",
                         waves_, target_.wave_size, target_.arch, target_.max_workgroup_size);
  q_tiles_ = block_m_ / (m_tile_ * waves_);
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
  w_.line("const int {} = fj_group_id_x();", name(p_.grid_arg(0)));
  w_.line("const int {} = fj_group_id_y();", name(p_.grid_arg(1)));
  w_.line("const int {} = fj_group_id_z();", name(p_.grid_arg(2)));
  w_.line("// The query at row r (0..{0}) of this wave's {1}-query tile qt: its row in the",
          m_tile_ - 1, m_tile_);
  w_.line("// workgroup's block (local_row) and in the sequence (query_row).");
  w_.line("auto local_row = [&](int qt, int r) {{ return (wave * kQTiles + qt) * {} + r; }};",
          m_tile_);
  w_.line("auto query_row = [&](int qt, int r) {{ return {} * kBlockM + local_row(qt, r); }};",
          name(p_.grid_arg(0)));
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
  rules_.emit_staging_helpers(w_);
  w_.line("// ---- the spec and config, as named constants ----");
  for (const auto &[decl, comment] : constants_)
    w_.line("{}{}", decl, comment.empty() ? "" : " // " + comment);
  w_.blank();
  w_.raw(templates::attention_common);
  w_.blank();
  if (!rules_.kernel_helpers().empty()) {
    w_.raw(rules_.kernel_helpers());
    w_.blank();
  }
  // The parameters: the tensors, then the run-time shapes (IR scalars).
  std::vector<KernelParam> params;
  for (const ir::TensorParam &t : p_.tensors) {
    const bool output = t.name == "O" || t.name == "LSE";
    const char *element = t.dtype == DType::f32 ? "float" : "fj_bits";
    params.push_back({t.name, KernelParam::Kind::tensor, ir::ScalarType::i64,
                      fmt::format("{}{} *", output ? "" : "const ", element)});
  }
  for (const ir::ScalarParam &sp : p_.scalars)
    params.push_back({sp.name, KernelParam::Kind::scalar, sp.type, c_scalar_type(sp.type)});
  w_.line("FJ_GLOBAL FJ_WORKGROUP_SIZE({})", waves_ * target_.wave_size);
  w_.line("void {}(", p_.name);
  w_.indent(2);
  for (size_t i = 0; i < params.size(); ++i) {
    const KernelParam &kp = params[i];
    w_.line("{}{}{}{}", kp.c_type, kp.kind == KernelParam::Kind::tensor ? "__restrict__ " : " ",
            kp.name, i + 1 < params.size() ? "," : ") {");
  }
  w_.indent(-2);
  w_.indent(1);
  for (const std::string &decl : lds_decls_)
    w_.line("{}", decl);
  w_.raw(body.str());
  w_.close();
  std::swap(w_, kernel);

  w_.line("// flashjit kernel {} for {} ({} rules, wave{}, {})", p_.name, target_.target_id(),
          rules_.name(), target_.wave_size,
          !mi_                   ? "FMAs, no matrix instruction"
          : mi_->builtin.empty() ? mi_->mnemonic
                                 : mi_->builtin);
  if (!note_.empty())
    w_.line("// {}", note_);
  w_.line("// Generated from the tile IR; `flashjit emit --print-ir` prints the program.");
  w_.line("// Each block below names the IR op it implements.");
  w_.blank();
  w_.raw(rules_.prelude());
  w_.blank();
  w_.line("// ---- the matrix instruction ----");
  if (mi_)
    rules_.emit_mma_wrapper(w_, *mi_, q.dtype);
  else
    w_.line("// none: the {} rules multiply with FMAs in the kernel text", rules_.name());
  w_.blank();
  w_.raw(kernel.str());

  Lowered out;
  out.source = w_.str();
  out.kernel_text = kernel.str();
  out.kernel_name = p_.name;
  out.params = std::move(params);
  out.grid = p_.grid;
  out.block_threads = int(waves_ * target_.wave_size);
  out.lds_bytes = lds_bytes_;
  out.lds_dynamic = rules_.dynamic_lds();
  out.mma = mi_;
  out.rules = std::string(rules_.name());
  out.rules_note = note_;
  out.pointer_alignment = vec_ok_ ? 16 : vec4_ok_ ? 8 : 2;
  // Rows are addressed by a 32-bit offset within a block (row_offset).
  out.max_row_stride = int64_t(UINT32_MAX) / std::max(block_m_, block_n_);
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
    const int step = rules_.k_step();
    std::string a_frag = name(op.operands[0]) + "[qt][k]";
    // The fragments of head-dim (or key) tile k: Q's from LDS where it lives there,
    // and K's or V's from their LDS tile.
    auto emit_fragments = [&] {
      if (auto q = lds_of_.find(op.operands[0]); q != lds_of_.end()) {
        rules_.emit_q_fragment(w_, q->second, lds_strides_.at(q->second));
        a_frag = "qf";
      }
      if (s_product)
        rules_.emit_k_fragment(w_, it->second, lds_strides_.at(it->second));
      else
        rules_.emit_v_fragment(w_, it->second, lds_strides_.at(it->second));
    };
    if (step > 1) {
      // k_step() k tiles per instruction: their fragments into arrays (zeros past
      // the last tile), then one instruction over them (Rules::k_step).
      const char *lds_frag = s_product ? "kf" : "vf";
      w_.line("#pragma unroll");
      w_.open("for (int k0 = 0; k0 < {}; k0 += {}) {{", kt, step);
      w_.line("{0} {1}s[{2}] = {{}}, ops[{2}] = {{}};", rules_.operand_type(), lds_frag, step);
      w_.line("#pragma unroll");
      w_.open("for (int kk = 0; kk < {}; ++kk) {{", step);
      w_.line("const int k = k0 + kk;");
      if (kt % step)
        w_.line("if (k >= {}) break; // the odd last tile pairs with zeros", kt);
      emit_fragments();
      w_.line("{0}s[kk] = {0};", lds_frag);
      w_.line("ops[kk] = {};", a_frag);
      w_.close();
      // The rules read the LDS fragments from the array named like the single one.
      w_.open("{{");
      w_.line("const auto &{0} = {0}s;", lds_frag);
      lines(s_product ? rules_.mma_s("ops") : rules_.mma_o("ops"));
      w_.close();
      w_.close();
    } else {
      w_.line("#pragma unroll");
      w_.open("for (int k = 0; k < {}; ++k) {{", kt);
      emit_fragments();
      lines(s_product ? rules_.mma_s(a_frag) : rules_.mma_o(a_frag));
      w_.close();
    }
    w_.line("{}[qt][c] = acc;", name(op.results[0]));
    w_.close();
    w_.close();
    read_since_barrier_.insert(it->second);
    return Status::ok();
  }
  case OpKind::Scale: {
    if (const auto *r = std::get_if<ir::ParamRef>(&op.attrs.at("factor")))
      return elementwise("{0} * " + r->name);
    const std::string k = fmt::format("kScale{}", scale_constants_++);
    add_constant(fmt::format("constexpr float {} = {};", k, float_literal(op.float_attr("factor"))),
                 fmt::format("factor of IR op `scale` (%{})", name(op.results[0])));
    return elementwise("{0} * " + k);
  }
  case OpKind::Mask: {
    const Type &t = type(op.results[0]);
    w_.line("{};", declare(op.results[0]));
    w_.line("const bool {}_full = fj_block_unmasked({}, {}, {});", name(op.results[0]),
            name(op.operands[1]), name(op.operands[2]), mask_args());
    const std::string dst = open_elements(t, name(op.results[0]));
    w_.line("const int key = {} * kBlockN + c * kNTile + {};", name(op.operands[2]),
            rules_.acc_col("e"));
    // `|`, not `||`: a select, not a branch around every element, keeps the
    // block one straight line for the scheduler (|| made gfx11 spill).
    w_.line("{} = ({}_full | fj_visible(query_row(qt, {}), key, {})) ? {}[qt][c][e] : -FJ_INF;",
            dst, name(op.results[0]), rules_.acc_row("e"), mask_args(), name(op.operands[0]));
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
    w_.line("for (int s = 0; s < kRowSlots; ++s) r[s] = {};", is_max ? "-FJ_INF" : "0.0f");
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
    return elementwise("{0} == -FJ_INF ? 0.0f : {0}");
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
  const std::string base = head_base(t);
  if (ty.layout == TileLayout::mma_a && q_in_lds_) {
    // Q staged once into LDS; the products read its fragments from there.
    const std::string buf = register_lds(op);
    if (buf.empty())
      return Status::error("{} rules: an LDS-resident Q tile must feed mma_abt", rules_.name());
    emit_stage_issue(op, idx);
    finish_stage(op, buf);
    return Status::ok();
  }
  if (ty.layout == TileLayout::mma_a) {
    // Operand fragments straight from global memory, run by run: each run is
    // `len` consecutive head-dim entries of one query row.
    const int len = rules_.operand_run_len();
    const std::vector<FragmentRun> runs = rules_.operand_runs();
    w_.line("{};", declare(op.results[0]));
    w_.line("const fj_bits *{}_base = {};", name(op.results[0]),
            block_base(t, base, idx, "kBlockM"));
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
      w_.line("const fj_bits *src = {}_base + {};", name(op.results[0]),
              row_offset(t, fmt::format("local_row(qt, {})", runs[r].row)));
      w_.open("if (row < {}) {{", seq_const(t));
      emit_run_load("frag", int(r) * len, len, runs.size() == 1, dim_const(t), dim_stride(t));
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
  const std::string buf = register_lds(op);
  if (!buf.empty() && pipelined_loads_.count(&op)) {
    // Issued ahead (see emit_for): wait for this tile, then start the next one.
    finish_stage(op, buf);
    const std::vector<const Op *> &order = pipeline_order_;
    const size_t i = std::find(order.begin(), order.end(), &op) - order.begin();
    const Op &next = *order[(i + 1) % order.size()];
    if (i + 1 < order.size()) {
      emit_stage_issue(next, name(op.operands[0]));
    } else {
      w_.open("if ({} + 1 < kv_end) {{", name(op.operands[0]));
      emit_stage_issue(next, name(op.operands[0]) + " + 1");
      w_.close();
    }
    return Status::ok();
  }
  if (buf.empty())
    return Status::error("{} rules: a #mma_b tile must feed mma_ab or mma_abt", rules_.name());
  barrier_if_read(buf);
  emit_stage_issue(op, idx);
  finish_stage(op, buf);
  return Status::ok();
}

// Waits for this lane's copies into `buf`, then for every wave's: the tile of
// `op` is readable from there on.
void KernelEmitter::finish_stage(const Op &op, const std::string &buf) {
  w_.line("fj_stage_wait();");
  w_.line("fj_barrier(); // the {} tile is complete before any wave reads it",
          op.symbol_attr("tensor"));
  read_since_barrier_.clear();
  lds_of_[op.results[0]] = buf;
}

// A B operand is staged in LDS by the whole workgroup, 128 bits per copy. As B^T
// (K, consumer mma_abt) it is stored row-major; as B (V, consumer mma_ab) row-major
// or transposed, as the rules read it. Declares the buffer once; returns its name
// ("" when the tile feeds no matrix product).
std::string KernelEmitter::register_lds(const Op &op) {
  const ir::TensorParam &t = *p_.tensor(op.symbol_attr("tensor"));
  const Type &ty = type(op.results[0]);
  const Op *use = consumer_of(op.results[0], p_.body);
  if (!use || (use->kind != OpKind::MmaABt && use->kind != OpKind::MmaAB))
    return "";
  const bool transposed = use->kind == OpKind::MmaAB && rules_.v_transposed();
  std::string lower = t.name;
  std::transform(lower.begin(), lower.end(), lower.begin(), ::tolower);
  const std::string buf = "lds_" + lower + (transposed ? "t" : "");
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
    const std::string what = fmt::format("// {} tile {}x{}{}, rows padded by {}", t.name, rows,
                                         cols, transposed ? " stored transposed" : "", kLdsPad);
    if (rules_.dynamic_lds()) // at a 16-byte aligned offset of the launch's dynamic LDS
      lds_decls_.push_back(fmt::format("FJ_DYNAMIC_LDS_ARRAY(fj_bits, {}, {}, {}); {}", buf, elems,
                                       lds_bytes_, what));
    else
      lds_decls_.push_back(fmt::format("FJ_LDS_ARRAY(fj_bits, {}, {}); {}", buf, elems, what));
    lds_bytes_ += int((elems * 2 + 15) / 16 * 16);
  }
  return buf;
}

// Starts copying block `idx` of a #mma_b tile into its LDS buffer: 8 elements per
// copy, asynchronous where the target has it (fj_stage8), element by element at
// ragged edges. fj_stage_wait() + a barrier make it visible.
void KernelEmitter::emit_stage_issue(const Op &op, const std::string &idx) {
  const ir::TensorParam &t = *p_.tensor(op.symbol_attr("tensor"));
  const Type &ty = type(op.results[0]);
  const std::string buf = register_lds(op);
  const bool transposed = lds_role_.at(buf) == "transposed";
  const std::string &stride_name = lds_strides_.at(buf);
  const int64_t rows = ty.rows, cols = ty.cols;
  w_.line("// IR: stage block {} of @{} into {}", idx, t.name, buf);
  w_.open("{{");
  const std::string rows_name = rows == block_n_   ? "kBlockN"
                                : rows == block_m_ ? "kBlockM"
                                                   : std::to_string(rows);
  w_.line("const fj_bits *tile = {};", block_base(t, head_base(t), "(" + idx + ")", rows_name));
  w_.line("// {} rows x {} chunks of 8 elements", rows, cols / 8);
  w_.open("for (int i = fj_thread_id(); i < {} * {}; i += kThreads) {{", rows, cols / 8);
  w_.line("const int r = i / {}, d0 = (i % {}) * 8;", cols / 8, cols / 8);
  w_.line("const int row = ({}) * {} + r;", idx, rows_name);
  w_.line("const fj_bits *src = tile + {};", row_offset(t, "r"));
  if (!transposed) {
    w_.open("if (kVecLoads && d0 + 8 <= {}) {{", dim_const(t));
    w_.line("fj_stage8(&{}[r * {} + d0], src + d0, row < {}); // zeros past the last row", buf,
            stride_name, seq_const(t));
    w_.close("} else if (kVec4Loads && d0 + 4 <= " + dim_const(t) + ") {");
    w_.indent(1);
    w_.line("fj_stage4(&{}[r * {} + d0], src + d0, row < {});", buf, stride_name, seq_const(t));
    w_.line("fj_stage4(&{}[r * {} + d0 + 4], src + d0 + 4, row < {} && d0 + 8 <= {});", buf,
            stride_name, seq_const(t), dim_const(t));
    w_.close("} else {");
    w_.indent(1);
  }
  w_.line("fj_bits8 chunk = {{0, 0, 0, 0, 0, 0, 0, 0}};");
  w_.open("if (row < {}) {{", seq_const(t));
  if (transposed) {
    w_.line("if (kVecLoads && d0 + 8 <= {})", dim_const(t));
    w_.line("  chunk = fj_global_load8(src + d0);");
    w_.line("else");
    w_.indent(1);
  }
  w_.line("for (int e = 0; e < 8; ++e)");
  w_.line("  if (d0 + e < {}) chunk[e] = fj_global_load1(src + long(d0 + e){});", dim_const(t),
          dim_stride(t));
  if (transposed)
    w_.indent(-1);
  w_.close();
  if (transposed) {
    w_.line("#pragma unroll");
    w_.line("for (int e = 0; e < 8; ++e) fj_lds_store1(&{}[(d0 + e) * {} + r], chunk[e]);", buf,
            stride_name);
  } else {
    w_.line("fj_lds_store8(&{}[r * {} + d0], chunk);", buf, stride_name);
    w_.close();
  }
  w_.close();
  w_.line("fj_stage_commit();");
  w_.close();
}

Status KernelEmitter::emit_store(const Op &op) {
  const ir::TensorParam &t = *p_.tensor(op.symbol_attr("tensor"));
  const Type &ty = type(op.operands[0]);
  const std::string v = name(op.operands[0]);
  const std::string base = block_base(t, head_base(t), name(op.operands[1]), "kBlockM");
  if (ty.is_vector()) {
    // One value per query row, written by the one lane the rules name for it.
    w_.line("float *{}_dst = {};", v, base);
    w_.line("#pragma unroll");
    w_.open("for (int qt = 0; qt < kQTiles; ++qt) {{");
    w_.line("#pragma unroll");
    w_.open("for (int s = 0; s < kRowSlots; ++s) {{");
    w_.line("const int row = query_row(qt, {});", rules_.slot_row("s"));
    w_.line("if ({} && row < {}) fj_global_store_f32({}_dst + {}, {}[qt][s]);", rules_.row_writer(),
            seq_const(t), v, row_offset(t, fmt::format("local_row(qt, {})", rules_.slot_row("s"))),
            v);
    w_.close();
    w_.close();
    return Status::ok();
  }
  if (ty.layout != TileLayout::mma_acc || ty.dtype == DType::f32)
    return Status::error("{} rules: `store` takes a converted #mma_acc tile", rules_.name());
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
    w_.line("fj_bits *dst = {}_dst + {};", v,
            row_offset(t, fmt::format("local_row(qt, {})", runs[r].row)));
    w_.open("if (row < {}) {{", seq_const(t));
    const int first = int(r) * len;
    w_.line("if (kVecLoads && d0 + {} <= {})", len, dim_const(t));
    if (runs.size() == 1 && (len == 8 || len == 4))
      w_.line("  fj_global_store{}(dst + d0, {}[qt][c]);", len, v);
    else if (len == 4) // several runs of 4 (CDNA 32x32): a slice of the fragment
      w_.line("  fj_global_store4(dst + d0, __builtin_shufflevector({0}[qt][c], {0}[qt][c], {1}, "
              "{2}, {3}, {4}));",
              v, first, first + 1, first + 2, first + 3);
    else if (len == 2)
      w_.line("  fj_global_store2(dst + d0, {0}[qt][c][{1}], {0}[qt][c][{2}]);", v, first,
              first + 1);
    else
      w_.line("  for (int i = 0; i < {}; ++i) fj_global_store1(dst + d0 + i, {}[qt][c][{} + i]);",
              len, v, first);
    w_.line("else");
    w_.line("  for (int i = 0; i < {}; ++i)", len);
    w_.line("    if (d0 + i < {}) fj_global_store1(dst + long(d0 + i){}, {}[qt][c][{}]);",
            dim_const(t), dim_stride(t), v, first ? fmt::format("{} + i", first) : "i");
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

// With config stages >= 2 the loop's LDS tiles are pipelined: tile i+1 is issued
// as soon as tile i is complete (after its barrier), the first tile of the next
// block as soon as the last tile of this one is. That is safe when every tile is
// read only between its own barrier and the next tile's, which holds when each
// tile's consumer comes before the next tile's load; otherwise nothing is pipelined.
bool KernelEmitter::plan_pipeline(const Op &loop) {
  const ir::Attrs &cfg = p_.config;
  if (!cfg.count("stages") || std::get<int64_t>(cfg.at("stages")) < 2)
    return false;
  std::vector<size_t> loads;
  for (size_t i = 0; i < loop.body.size(); ++i)
    if (loop.body[i].kind == OpKind::Load &&
        type(loop.body[i].results[0]).layout == TileLayout::mma_b)
      loads.push_back(i);
  if (loads.empty())
    return false;
  for (size_t n = 0; n < loads.size(); ++n) {
    const size_t end = n + 1 < loads.size() ? loads[n + 1] : loop.body.size();
    bool consumed = false;
    for (size_t i = loads[n] + 1; i < end; ++i)
      for (ValueId v : loop.body[i].operands)
        consumed = consumed || v == loop.body[loads[n]].results[0];
    if (!consumed)
      return false;
  }
  pipeline_order_.clear();
  pipelined_loads_.clear();
  for (size_t i : loads) {
    pipeline_order_.push_back(&loop.body[i]);
    pipelined_loads_.insert(&loop.body[i]);
  }
  return true;
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
  w_.line("fj_kv_range({}, {}, &kv_begin, &kv_end);", name(op.operands[0]), mask_args());
  if (plan_pipeline(op)) {
    w_.line("// Software pipeline: the first tile is in flight before the loop starts.");
    w_.open("if (kv_begin < kv_end) {{");
    emit_stage_issue(*pipeline_order_.front(), "kv_begin");
    w_.close();
  }
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

namespace {

/// The rules (and their table row) that lower a program with `dt` elements.
struct ChosenRules {
  const Rules *rules = nullptr;
  const MatrixInstr *mi = nullptr; // null for simt
  std::string note;                // Lowered::rules_note
};

/// What the caller asks of the rules' fragments.
struct Want {
  int64_t mma_m = 0; // config mma_m: the query tile asked for; 0: any
  /// A config's shape: the rules' tiles must divide it (the first that do is taken).
  bool fit = false;
  int64_t block_m = 0, block_n = 0, waves = 1, dim_v = 0; // dim_v padded to pad_k
  /// A default config is being chosen: the first rules that prefer this spec.
  const AttentionSpec *spec = nullptr;

  bool fits(const Rules &r) const {
    return block_m % (r.m_tile() * std::max<int64_t>(waves, 1)) == 0 && block_n % r.n_tile() == 0 &&
           dim_v % r.n_tile() == 0;
  }
};

Want want_for(const AttentionSpec &spec, const ir::Config &c) {
  return {.mma_m = c.mma_m,
          .fit = true,
          .block_m = c.block_m,
          .block_n = c.block_n,
          .waves = c.waves,
          .dim_v = ir::padded(spec.head_dim_v, c.pad_k)};
}

Want want_for(const ir::Program &p) {
  auto get = [&](const char *k, int64_t otherwise) {
    return p.config.count(k) ? std::get<int64_t>(p.config.at(k)) : otherwise;
  };
  return {.mma_m = get("mma_m", 0),
          .fit = true,
          .block_m = get("block_m", 0),
          .block_n = get("block_n", 0),
          .waves = get("waves", 1),
          .dim_v = ir::padded(p.tensor("V")->dim, get("pad_k", 16))};
}

/// Ok, or why the family's matrix rules cannot lower `dt` on `t`. Of its rule
/// sets with a table row that their check() accepts (preferred first), and with
/// the query tile asked for: the first that fits the config, else the last (its
/// emitter then names the misfit); for a default config the first that prefers
/// the spec, else the last.
Status matrix_rules(const Target &t, DType dt, const Want &want, ChosenRules &out) {
  const std::vector<const Rules *> candidates = matrix_rules_for(t);
  if (candidates.empty())
    return Status::error("no matrix rules for {} ({}) yet: families with matrix rules are {}",
                         t.arch, t.family_name(), families_with_rules());
  Status refused = Status::ok();
  std::vector<ChosenRules> usable;
  std::string tiles; // of the usable rules, e.g. "32 or 16"
  for (const Rules *r : candidates) {
    const bool asked = want.mma_m == 0 || want.mma_m == r->m_tile();
    auto mi = find_matrix_instr(t, dt, r->m_tile(), r->n_tile(), r->mma_k());
    Status s = mi ? r->check(**mi, t) : mi.status();
    if (!s) {
      if (asked)
        refused = s; // the last (most general) rules' reason
      continue;
    }
    if (tiles.find(std::to_string(r->m_tile())) == std::string::npos)
      tiles += (tiles.empty() ? "" : " or ") + std::to_string(r->m_tile());
    if (asked)
      usable.push_back({r, *mi, ""});
  }
  if (usable.empty() && refused)
    return Status::error("config mma_m = {}: the {} matrix rules for {} on {} have {}-query "
                         "tiles only",
                         want.mma_m, t.family_name(), dtype_name(dt), t.arch,
                         tiles.empty() ? "no usable" : tiles);
  if (usable.empty())
    return refused;
  out = usable.back();
  for (const ChosenRules &c : usable)
    if ((want.fit && want.fits(*c.rules)) || (want.spec && c.rules->prefers(*want.spec)) ||
        (!want.fit && !want.spec)) {
      out = c;
      break;
    }
  return Status::ok();
}

Expected<ChosenRules> choose_rules(const Target &t, DType dt, RulesChoice choice,
                                   const Want &want) {
  ChosenRules chosen;
  Status refused = Status::ok();
  if (choice != RulesChoice::simt) {
    refused = matrix_rules(t, dt, want, chosen);
    if (refused)
      return chosen;
    if (choice == RulesChoice::matrix)
      return refused;
  }
  ChosenRules simt{simt_rules_for(t), nullptr, ""};
  if (!simt.rules)
    return choice == RulesChoice::simt
               ? Status::error("the simt rules emit code for AMD targets; {} ({}) takes its "
                               "matrix rules (--rules matrix or auto)",
                               t.arch, t.family_name())
               : refused;
  if (want.mma_m != 0 && want.mma_m != simt.rules->m_tile())
    return Status::error("config mma_m = {}: the simt rules use {}-query tiles{}", want.mma_m,
                         simt.rules->m_tile(),
                         choice == RulesChoice::simt ? "" : ", and " + refused.message());
  simt.note = choice == RulesChoice::simt
                  ? std::string("simt rules as asked (no matrix instruction)")
                  : fmt::format("simt rules (no matrix instruction), because the {} matrix rules "
                                "cannot lower this: {}",
                                t.family_name(), refused.message());
  return simt;
}

} // namespace

ir::Config default_config(const AttentionSpec &spec, const Target &target, RulesChoice choice,
                          int64_t mma_m) {
  auto chosen = choose_rules(target, spec.dtype, choice, {.mma_m = mma_m, .spec = &spec});
  ir::Config c = chosen ? chosen->rules->default_config(spec) : ir::Config{};
  if (mma_m)
    c.mma_m = mma_m; // kept, so that generate() takes these rules (or says why not)
  return c;
}

std::string_view rules_choice_name(RulesChoice c) {
  switch (c) {
  case RulesChoice::automatic:
    return "auto";
  case RulesChoice::matrix:
    return "matrix";
  case RulesChoice::simt:
    return "simt";
  }
  return "?";
}

Expected<RulesChoice> parse_rules_choice(std::string_view name) {
  for (RulesChoice c : {RulesChoice::automatic, RulesChoice::matrix, RulesChoice::simt})
    if (rules_choice_name(c) == name)
      return c;
  return Status::error("unknown rules '{}': choose auto, matrix or simt", name);
}

Status check_fits(const AttentionSpec &spec, const ir::Config &c, const Target &t,
                  RulesChoice choice) {
  auto chosen = choose_rules(t, spec.dtype, choice, want_for(spec, c));
  if (!chosen)
    return chosen.status();
  const Rules &r = *chosen->rules;
  const int64_t dqk = ir::padded(spec.head_dim_qk, c.pad_k),
                dv = ir::padded(spec.head_dim_v, c.pad_k);
  // K row-major, V transposed or row-major as the rules stage it, Q where it lives there.
  const int64_t v_bytes =
      r.v_transposed() ? dv * (c.block_n + kLdsPad) * 2 : c.block_n * (dv + kLdsPad) * 2;
  const int64_t lds = c.block_n * (dqk + kLdsPad) * 2 + v_bytes +
                      (c.q_in_lds ? c.block_m * (dqk + kLdsPad) * 2 : 0);
  if (lds > t.lds_bytes)
    return Status::error(
        "the K and V tiles need {} bytes of LDS (block_n {} x head dims {}/{}) but {} "
        "has {} per workgroup: use a smaller --block-n",
        lds, c.block_n, dqk, dv, t.arch, t.lds_bytes);
  if (c.waves * t.wave_size > t.max_workgroup_size)
    return Status::error("{} waves x {} lanes exceed {}'s workgroup limit of {}", c.waves,
                         t.wave_size, t.arch, t.max_workgroup_size);
  // Registers per lane that live across the KV loop, per query tile: the
  // O accumulator (E of every n_tile head-dim entries), the Q fragments (16-bit
  // operand elements of every 16 head-dim entries, two per VGPR) and S (E of
  // every n_tile keys). gfx12: dv/2 + dqk/4 + block_n/2.
  const int64_t acc = r.acc_elems(), n_tile = r.n_tile();
  const int64_t operand = r.operand_run_len() * int64_t(r.operand_runs().size());
  const int64_t q_tiles = std::max<int64_t>(1, c.block_m / (r.m_tile() * c.waves));
  // Q kept in LDS (q_in_lds) costs no registers across the loop.
  const int64_t q_regs = c.q_in_lds ? 0 : dqk * operand / (2 * kKTile);
  const int64_t vgprs = q_tiles * (dv * acc / n_tile + q_regs + c.block_n * acc / n_tile);
  const int64_t budget = t.max_vgprs - 24; // addresses, indices, statistics
  if (vgprs > budget)
    return Status::error(
        "head dims {}/{} need about {} VGPRs per lane for the accumulator, Q and S "
        "tiles (block_m {}, block_n {}, {} rules), over {}'s budget of {}: use a smaller "
        "--block-n or head dim",
        spec.head_dim_qk, spec.head_dim_v, vgprs, c.block_m, c.block_n, r.name(), t.arch, budget);
  return Status::ok();
}

Status check_launch(const Lowered &k, const AttentionSpec &shape) {
  const std::pair<const char *, const Strides *> tensors[] = {
      {"q", &shape.q}, {"k", &shape.k}, {"v", &shape.v}, {"o", &shape.o}};
  for (const auto &[name, strides] : tensors)
    if (strides->seq > k.max_row_stride)
      return Status::error("{} seq stride ({} elements) is past the {} that kernel {} addresses "
                           "within a block of rows (32-bit offsets): use a layout with shorter "
                           "rows, or a smaller block_m / block_n",
                           name, strides->seq, k.max_row_stride, k.kernel_name);
  return Status::ok();
}

Expected<Lowered> lower(const ir::Program &program, const Target &target, RulesChoice choice) {
  FJ_RETURN_IF_ERROR(ir::verify(program));
  auto chosen = choose_rules(target, program.tensor("Q")->dtype, choice, want_for(program));
  if (!chosen)
    return chosen.status();
  return KernelEmitter(program, target, *chosen->rules, chosen->mi, chosen->note).run();
}

Expected<Lowered> generate(const AttentionSpec &spec, const ir::Config &config,
                           const Target &target, RulesChoice choice) {
  FJ_RETURN_IF_ERROR(spec.validate());
  FJ_RETURN_IF_ERROR(check_fits(spec, config, target, choice));
  auto p = ir::build_attention(spec, config);
  if (!p)
    return p.status();
  return lower(*p, target, choice);
}

} // namespace flashjit::lowering
