// verify(): structure, scoping, shape, dtype and layout checks. Messages name the
// op by its place in the body and its text, e.g.
//
//   op #7 `mma_abt`: operand 1 has layout #mma_acc, expected #mma_b (%4 : tile<...>)
//
// Ops inside a loop body are numbered from the loop: `op #5.2` is op 2 of the body
// of op 5. Values are spelled as print() spells them.
#include "ir/ir.h"

#include "ir/build.h"
#include "ir/expr.h"

#include <algorithm>
#include <set>

#include <fmt/format.h>

namespace flashjit::ir {
namespace {

bool is_identifier(std::string_view s) {
  auto start = [](char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; };
  auto rest = [&](char c) { return start(c) || (c >= '0' && c <= '9') || c == '.'; };
  if (s.empty() || !start(s[0]))
    return false;
  for (char c : s)
    if (!rest(c))
      return false;
  return true;
}

std::string layout_text(TileLayout l) { return fmt::format("#{}", tile_layout_name(l)); }

std::string shape_text(const Type &t) {
  return t.is_vector() ? fmt::format("{}", t.rows) : fmt::format("{}x{}", t.rows, t.cols);
}

/// The layout of a per-row vector of a tile in layout `l` (row_max, sub_row, ...).
TileLayout row_layout(TileLayout l) {
  return l == TileLayout::mma_acc ? TileLayout::rows : TileLayout::blocked;
}

const char *attr_kind(const Attr &a) {
  if (std::holds_alternative<int64_t>(a))
    return "an integer";
  if (std::holds_alternative<double>(a))
    return "a float";
  if (std::holds_alternative<ParamRef>(a))
    return "a scalar parameter";
  return "a symbol";
}

/// An operand or a result of the op being checked.
struct Slot {
  bool result;
  size_t i;
};
Slot operand(size_t i) { return {false, i}; }
Slot result(size_t i) { return {true, i}; }

/// The checks of one op; every failure is prefixed with the op's place and name.
class OpChecker {
public:
  OpChecker(const Program &p, const std::vector<std::string> &names, const Op &op, std::string at)
      : p_(p), names_(names), op_(op), at_(std::move(at)) {}

  const std::string &at() const { return at_; }
  const Program &program() const { return p_; }

  template <typename... Args> Status fail(fmt::format_string<Args...> f, Args &&...args) const {
    return Status::error("{}: {}", at_, fmt::format(f, std::forward<Args>(args)...));
  }

  std::string value(ValueId v) const {
    if (v < 0 || static_cast<size_t>(v) >= names_.size())
      return fmt::format("%?{}", v);
    return "%" + names_[v];
  }

  ValueId id(Slot s) const { return s.result ? op_.results[s.i] : op_.operands[s.i]; }
  const Type &type(Slot s) const { return p_.type_of(id(s)); }
  std::string name(Slot s) const {
    return fmt::format("{} {}", s.result ? "result" : "operand", s.i);
  }
  /// "(%4 : tile<64x80xbf16, #mma_b>)", appended to type errors.
  std::string what(Slot s) const {
    return fmt::format("({} : {})", value(id(s)), to_string(type(s)));
  }

  Status index(Slot s) const {
    if (!type(s).is_index())
      return fail("{} has type {}, expected index", name(s), to_string(type(s)));
    return Status::ok();
  }
  Status tile(Slot s) const {
    if (type(s).is_index())
      return fail("{} ({}) has type index, expected a tile", name(s), value(id(s)));
    return Status::ok();
  }
  Status matrix(Slot s) const {
    FJ_RETURN_IF_ERROR(tile(s));
    if (type(s).is_vector())
      return fail("{} is a vector, expected a 2D tile {}", name(s), what(s));
    return Status::ok();
  }
  Status vector(Slot s) const {
    FJ_RETURN_IF_ERROR(tile(s));
    if (!type(s).is_vector())
      return fail("{} is a 2D tile, expected a vector (one value per row) {}", name(s), what(s));
    return Status::ok();
  }
  Status dtype(Slot s, DType want) const {
    if (type(s).dtype != want)
      return fail("{} has dtype {}, expected {} {}", name(s), dtype_name(type(s).dtype),
                  dtype_name(want), what(s));
    return Status::ok();
  }
  Status layout(Slot s, TileLayout want) const {
    if (type(s).layout != want)
      return fail("{} has layout {}, expected {} {}", name(s), layout_text(type(s).layout),
                  layout_text(want), what(s));
    return Status::ok();
  }
  /// The whole type; `why` says where the expectation comes from.
  Status type_is(Slot s, const Type &want, std::string_view why) const {
    if (type(s) != want)
      return fail("{} ({}) has type {}, expected {} ({})", name(s), value(id(s)),
                  to_string(type(s)), to_string(want), why);
    return Status::ok();
  }

  const Attr *attr(const std::string &key) const {
    auto it = op_.attrs.find(key);
    return it == op_.attrs.end() ? nullptr : &it->second;
  }
  template <typename T> Status attr_of(const std::string &key, const char *kind) const {
    const Attr *a = attr(key);
    if (!a)
      return fail("missing attr `{}` ({})", key, kind);
    if (!std::holds_alternative<T>(*a))
      return fail("attr `{}` is {}, expected {}", key, attr_kind(*a), kind);
    return Status::ok();
  }
  Status int_attr(const std::string &key) const { return attr_of<int64_t>(key, "an integer"); }
  Status float_attr(const std::string &key) const { return attr_of<double>(key, "a float"); }
  /// A constant of the given kind or a scalar parameter of a matching type;
  /// absent is fine unless `required`.
  Status value_attr(const std::string &key, bool integer, bool required) const {
    const Attr *a = attr(key);
    if (!a)
      return required ? fail("missing attr `{}`", key) : Status::ok();
    if (const ParamRef *r = std::get_if<ParamRef>(a)) {
      const ScalarParam *s = p_.scalar(r->name);
      if (!s)
        return fail("attr `{}` reads %{}, which is not a scalar parameter of the kernel", key,
                    r->name);
      if ((s->type == ScalarType::f32) == integer)
        return fail("attr `{}` reads %{} of type {}, expected {}", key, r->name,
                    scalar_type_name(s->type), integer ? "an integer type" : "f32");
      return Status::ok();
    }
    if (integer ? std::holds_alternative<int64_t>(*a) : std::holds_alternative<double>(*a))
      return Status::ok();
    return fail("attr `{}` is {}, expected {} or a scalar parameter", key, attr_kind(*a),
                integer ? "an integer" : "a float");
  }

  /// attr `tensor` names a tensor of the kernel.
  Status tensor_attr(const TensorParam *&out) const {
    FJ_RETURN_IF_ERROR(attr_of<Symbol>("tensor", "a symbol such as @Q"));
    const std::string &t = std::get<Symbol>(*attr("tensor")).name;
    out = p_.tensor(t);
    if (!out) {
      std::string known;
      for (const TensorParam &tp : p_.tensors)
        known += fmt::format("{}@{}", known.empty() ? "" : ", ", tp.name);
      return fail("attr `tensor` names @{}, which is not a tensor of the kernel (tensors: {})", t,
                  known.empty() ? "none" : known);
    }
    return Status::ok();
  }

private:
  const Program &p_;
  const std::vector<std::string> &names_;
  const Op &op_;
  std::string at_;
};

Status check_mma(const OpChecker &c, const Op &op) {
  Slot a = operand(0), b = operand(1), acc = operand(2);
  FJ_RETURN_IF_ERROR(c.matrix(a));
  FJ_RETURN_IF_ERROR(c.layout(a, TileLayout::mma_a));
  FJ_RETURN_IF_ERROR(c.matrix(b));
  FJ_RETURN_IF_ERROR(c.layout(b, TileLayout::mma_b));
  FJ_RETURN_IF_ERROR(c.matrix(acc));
  FJ_RETURN_IF_ERROR(c.layout(acc, TileLayout::mma_acc));
  const Type &ta = c.type(a), &tb = c.type(b), &tc = c.type(acc);
  if (ta.dtype == DType::f32)
    return c.fail("operand 0 has dtype f32, expected bf16 or f16 {}", c.what(a));
  FJ_RETURN_IF_ERROR(c.dtype(b, ta.dtype));
  FJ_RETURN_IF_ERROR(c.dtype(acc, DType::f32));
  // A is MxK. mma_abt takes B^T (NxK, one row per output column, as the K tile is
  // loaded); mma_ab takes B itself (KxN, as the V tile is loaded).
  int64_t m = ta.rows, k = ta.cols;
  bool transposed = op.kind == OpKind::MmaABt;
  int64_t b_k = transposed ? tb.cols : tb.rows;
  int64_t n = transposed ? tb.rows : tb.cols;
  if (b_k != k)
    return c.fail("operand 1 has shape {}, expected {} ({}, K = {} from operand 0) {}",
                  shape_text(tb),
                  transposed ? fmt::format("{}x{}", n, k) : fmt::format("{}x{}", k, n),
                  transposed ? "N x K" : "K x N", k, c.what(b));
  if (tc.rows != m || tc.cols != n)
    return c.fail("operand 2 has shape {}, expected {}x{} (M x N, from operands 0 and 1) {}",
                  shape_text(tc), m, n, c.what(acc));
  return c.type_is(result(0), tc, "the accumulator's type");
}

Status check_store(const OpChecker &c) {
  Slot x = operand(0);
  FJ_RETURN_IF_ERROR(c.tile(x));
  FJ_RETURN_IF_ERROR(c.index(operand(1)));
  const TensorParam *t = nullptr;
  FJ_RETURN_IF_ERROR(c.tensor_attr(t));
  const Type &tx = c.type(x);
  if (tx.is_vector()) {
    if (t->dim != 0)
      return c.fail("stores a vector to @{}, which has dim = {}; a vector goes to a tensor with "
                    "dim = 0 (such as @LSE) {}",
                    t->name, t->dim, c.what(x));
    if (t->dtype != DType::f32)
      return c.fail("stores a vector to @{}, which is {}, expected an f32 tensor", t->name,
                    dtype_name(t->dtype));
  } else {
    if (t->dim == 0)
      return c.fail("stores a 2D tile to @{}, which has dim = 0 (a vector tensor) {}", t->name,
                    c.what(x));
    if (tx.cols < t->dim)
      return c.fail("operand 0 has {} columns, fewer than the dim = {} of @{} {}", tx.cols, t->dim,
                    t->name, c.what(x));
  }
  if (tx.dtype != t->dtype)
    return c.fail("operand 0 has dtype {}, but @{} is {} {}", dtype_name(tx.dtype), t->name,
                  dtype_name(t->dtype), c.what(x));
  return Status::ok();
}

Status check_load(const OpChecker &c) {
  FJ_RETURN_IF_ERROR(c.index(operand(0)));
  const TensorParam *t = nullptr;
  FJ_RETURN_IF_ERROR(c.tensor_attr(t));
  Slot r = result(0);
  FJ_RETURN_IF_ERROR(c.tile(r));
  const Type &tr = c.type(r);
  // A 2D tile may narrow an f32 tensor to bf16 or f16 (rounded to nearest even
  // as it is loaded: f32 inputs, AttentionSpec::f32_io); otherwise the dtypes match.
  const bool narrows = t->dtype == DType::f32 && tr.dtype != DType::f32 && !tr.is_vector();
  if (tr.dtype != t->dtype && !narrows)
    return c.fail("result 0 has dtype {}, but @{} is {} {}", dtype_name(tr.dtype), t->name,
                  dtype_name(t->dtype), c.what(r));
  if (tr.is_vector()) {
    if (t->dim != 0)
      return c.fail("loads a vector from @{}, which has dim = {}; a vector comes from a tensor "
                    "with dim = 0 (one value per row, such as @LSE) {}",
                    t->name, t->dim, c.what(r));
    if (tr.layout != TileLayout::rows && tr.layout != TileLayout::cols)
      return c.fail("result 0 has layout {}, expected #rows or #cols for a vector {}",
                    layout_text(tr.layout), c.what(r));
    return Status::ok();
  }
  if (t->dim == 0)
    return c.fail("loads a 2D tile from @{}, which has dim = 0 (a vector tensor) {}", t->name,
                  c.what(r));
  if (tr.cols < t->dim)
    return c.fail("result 0 has {} columns, fewer than the dim = {} of @{} {}", tr.cols, t->dim,
                  t->name, c.what(r));
  return Status::ok();
}

/// sub_col: x[i][j] - v[j], v a #cols vector with one value per column of x.
Status check_col_broadcast(const OpChecker &c) {
  Slot x = operand(0), v = operand(1);
  FJ_RETURN_IF_ERROR(c.matrix(x));
  FJ_RETURN_IF_ERROR(c.dtype(x, DType::f32));
  FJ_RETURN_IF_ERROR(c.layout(x, TileLayout::mma_acc));
  FJ_RETURN_IF_ERROR(c.vector(v));
  FJ_RETURN_IF_ERROR(c.dtype(v, DType::f32));
  FJ_RETURN_IF_ERROR(c.layout(v, TileLayout::cols));
  const Type &tx = c.type(x), &tv = c.type(v);
  if (tv.rows != tx.cols)
    return c.fail("operand 1 has {} entries, expected {} (the columns of operand 0) {}", tv.rows,
                  tx.cols, c.what(v));
  return c.type_is(result(0), tx, "the type of operand 0");
}

/// An optional 0/1 attr, such as `transposed`.
Status flag_attr(const OpChecker &c, const Op &op, const std::string &key) {
  auto it = op.attrs.find(key);
  if (it == op.attrs.end())
    return Status::ok();
  FJ_RETURN_IF_ERROR(c.int_attr(key));
  const int64_t v = std::get<int64_t>(it->second);
  if (v != 0 && v != 1)
    return c.fail("attr `{}` is {}, expected 0 or 1", key, v);
  return Status::ok();
}

/// sub_row, mul_row, div_row: x[i][j] op r[i].
Status check_row_broadcast(const OpChecker &c) {
  Slot x = operand(0), r = operand(1);
  FJ_RETURN_IF_ERROR(c.matrix(x));
  FJ_RETURN_IF_ERROR(c.dtype(x, DType::f32));
  FJ_RETURN_IF_ERROR(c.vector(r));
  FJ_RETURN_IF_ERROR(c.dtype(r, DType::f32));
  const Type &tx = c.type(x), &tr = c.type(r);
  if (tr.rows != tx.rows)
    return c.fail("operand 1 has {} rows, expected {} (the rows of operand 0) {}", tr.rows, tx.rows,
                  c.what(r));
  FJ_RETURN_IF_ERROR(c.layout(r, row_layout(tx.layout)));
  return c.type_is(result(0), tx, "the type of operand 0");
}

/// The op's own type rules; counts and scoping are already checked.
/// Attr `blocks` (a mask tensor's block summary, which the block-range pass
/// reads beside `range`): a u8 array of the kernel, and only with `range`.
Status check_blocks(const OpChecker &c, const Program &p, const Op &op) {
  const auto it = op.attrs.find("blocks");
  if (it == op.attrs.end())
    return Status::ok();
  const Symbol *a = std::get_if<Symbol>(&it->second);
  const ArrayParam *array = a ? p.array(a->name) : nullptr;
  if (!array || array->element != ArrayElement::u8 || !op.attrs.count("range"))
    return c.fail("attr `blocks` must name a u8 array of the kernel (@name: a mask tensor's "
                  "block summary) and come with attr `range`");
  return Status::ok();
}

/// attr `q_group` (the rows per query position of grouped rows) names what
/// @Q's rows are grouped by, and only on the forward's (untransposed) loop.
Status check_q_group(const OpChecker &c, const Op &op) {
  const TensorParam *q = c.program().tensor("Q");
  const Attr *a = c.attr("q_group");
  const bool grouped = q && q->grouped();
  if (!a && !grouped)
    return Status::ok();
  const ParamRef *r = a ? std::get_if<ParamRef>(a) : nullptr;
  if (!grouped || !r || !q->row_group.is_param() || r->name != q->row_group.param)
    return c.fail("has q_group {}, but @Q's rows are {}: the masks count positions by the rows "
                  "@Q groups",
                  !a  ? std::string("missing")
                  : r ? "= %" + r->name
                      : std::string("= ") + attr_kind(*a),
                  grouped ? "grouped by " + to_string(q->row_group) : "not grouped");
  if (op.int_attr("transposed") != 0)
    return c.fail("groups the query rows of a transposed tile (rows are keys); only the "
                  "forward's tiles have grouped rows");
  return Status::ok();
}

Status check_types(const OpChecker &c, const Op &op) {
  switch (op.kind) {
  case OpKind::Load:
    return check_load(c);
  case OpKind::Store:
    return check_store(c);
  case OpKind::Fill: {
    const auto it = op.attrs.find("function");
    if (it == op.attrs.end()) {
      FJ_RETURN_IF_ERROR(c.float_attr("value"));
      return c.tile(result(0));
    }
    const Symbol *f = std::get_if<Symbol>(&it->second);
    const ScoreFunction *fn = f ? c.program().function(f->name) : nullptr;
    if (!fn || op.attrs.count("value"))
      return c.fail("attr `function` must name a function of the kernel (@name), in place of "
                    "`value`");
    auto e = parse_expr(fn->text, c.program().expr_scope(), "function @" + fn->name);
    if (!e)
      return e.status();
    for (const char *per_element : {"score", "q_idx", "kv_idx"})
      if (uses_var(*e, per_element))
        return c.fail("function @{} reads {}, but a fill has one value per workgroup (b, h, "
                      "seqlen_q, seqlen_k, scalars and arrays)",
                      fn->name, per_element);
    return c.tile(result(0));
  }
  case OpKind::MmaAB:
  case OpKind::MmaABt:
    return check_mma(c, op);
  case OpKind::Scale:
    FJ_RETURN_IF_ERROR(c.value_attr("factor", false, true));
    FJ_RETURN_IF_ERROR(c.tile(operand(0)));
    return c.type_is(result(0), c.type(operand(0)), "the type of operand 0");
  case OpKind::ScoreMod: {
    FJ_RETURN_IF_ERROR(c.matrix(operand(0)));
    FJ_RETURN_IF_ERROR(c.dtype(operand(0), DType::f32));
    FJ_RETURN_IF_ERROR(c.index(operand(1)));
    FJ_RETURN_IF_ERROR(c.index(operand(2)));
    const auto it = op.attrs.find("function");
    const Symbol *f = it == op.attrs.end() ? nullptr : std::get_if<Symbol>(&it->second);
    if (!f || !c.program().function(f->name))
      return c.fail("attr `function` must name a function of the kernel (@name)");
    // The full-block fast path: `unmasked` where `range` is nonzero over the block.
    for (const char *attr : {"unmasked", "range"}) {
      const auto a = op.attrs.find(attr);
      const Symbol *g = a == op.attrs.end() ? nullptr : std::get_if<Symbol>(&a->second);
      if (op.attrs.count("unmasked") != op.attrs.count("range") ||
          (a != op.attrs.end() && (!g || !c.program().function(g->name))))
        return c.fail("attrs `unmasked` and `range` go together, each naming a function of the "
                      "kernel (@name)");
    }
    FJ_RETURN_IF_ERROR(check_blocks(c, c.program(), op));
    FJ_RETURN_IF_ERROR(flag_attr(c, op, "transposed"));
    return c.type_is(result(0), c.type(operand(0)), "the type of operand 0");
  }
  case OpKind::Mask:
    FJ_RETURN_IF_ERROR(c.matrix(operand(0)));
    FJ_RETURN_IF_ERROR(c.dtype(operand(0), DType::f32));
    FJ_RETURN_IF_ERROR(c.index(operand(1)));
    FJ_RETURN_IF_ERROR(c.index(operand(2)));
    FJ_RETURN_IF_ERROR(c.int_attr("causal"));
    FJ_RETURN_IF_ERROR(flag_attr(c, op, "transposed"));
    for (const char *key : {"window_left", "window_right", "q_group"})
      FJ_RETURN_IF_ERROR(c.value_attr(key, true, false));
    FJ_RETURN_IF_ERROR(check_q_group(c, op));
    return c.type_is(result(0), c.type(operand(0)), "the type of operand 0");
  case OpKind::RowMax:
  case OpKind::RowSum: {
    FJ_RETURN_IF_ERROR(c.matrix(operand(0)));
    FJ_RETURN_IF_ERROR(c.dtype(operand(0), DType::f32));
    const Type &x = c.type(operand(0));
    return c.type_is(result(0), Type::vec(x.rows, DType::f32, row_layout(x.layout)),
                     fmt::format("one f32 per row of operand 0, {} for a {} tile",
                                 layout_text(row_layout(x.layout)), layout_text(x.layout)));
  }
  case OpKind::RunningMax: {
    FJ_RETURN_IF_ERROR(c.float_attr("slack"));
    const double slack = std::get<double>(op.attrs.at("slack"));
    if (!(slack >= 0 && slack <= 64))
      return c.fail("attr `slack` ({}) must be in [0, 64]: the weights it allows reach 2^slack",
                    slack);
    [[fallthrough]];
  }
  case OpKind::Max:
  case OpKind::Add:
  case OpKind::Sub:
  case OpKind::Mul:
    FJ_RETURN_IF_ERROR(c.tile(operand(0)));
    FJ_RETURN_IF_ERROR(c.type_is(operand(1), c.type(operand(0)), "the type of operand 0"));
    return c.type_is(result(0), c.type(operand(0)), "the type of operand 0");
  case OpKind::Exp2:
  case OpKind::Log2:
  case OpKind::ZeroIfNegInf:
    FJ_RETURN_IF_ERROR(c.tile(operand(0)));
    FJ_RETURN_IF_ERROR(c.dtype(operand(0), DType::f32));
    return c.type_is(result(0), c.type(operand(0)), "the type of operand 0");
  case OpKind::SubRow:
  case OpKind::MulRow:
  case OpKind::DivRow:
    return check_row_broadcast(c);
  case OpKind::SubCol:
    return check_col_broadcast(c);
  case OpKind::Convert: {
    FJ_RETURN_IF_ERROR(c.tile(operand(0)));
    FJ_RETURN_IF_ERROR(c.tile(result(0)));
    Type want = c.type(operand(0));
    want.dtype = c.type(result(0)).dtype;
    return c.type_is(result(0), want, "convert keeps shape and layout; only the dtype changes");
  }
  case OpKind::ConvertLayout: {
    FJ_RETURN_IF_ERROR(c.tile(operand(0)));
    FJ_RETURN_IF_ERROR(c.tile(result(0)));
    const Type &x = c.type(operand(0));
    Type want = x;
    want.layout = c.type(result(0)).layout;
    FJ_RETURN_IF_ERROR(c.type_is(result(0), want,
                                 "convert_layout keeps shape and dtype; only the layout changes"));
    if (want.layout == x.layout)
      return c.fail("converts to the layout it already has ({}) {}", layout_text(x.layout),
                    c.what(operand(0)));
    return Status::ok();
  }
  case OpKind::For:
  case OpKind::Yield:
    return Status::ok(); // structural: checked by the walk
  }
  return c.fail("unknown op kind {}", static_cast<int>(op.kind));
}

/// Whether a `for` in `body` names function `name` as its `range`.
bool names_a_range(const std::vector<Op> &body, const std::string &name) {
  for (const Op &op : body)
    if (op.kind == OpKind::For) {
      const auto it = op.attrs.find("range");
      const Symbol *f = it == op.attrs.end() ? nullptr : std::get_if<Symbol>(&it->second);
      if ((f && f->name == name) || names_a_range(op.body, name))
        return true;
    }
  return false;
}

class Verifier {
public:
  explicit Verifier(const Program &p)
      : p_(p), names_(value_names(p)), visible_(p.values.size(), false),
        def_site_(p.values.size()) {}

  Status run() {
    FJ_RETURN_IF_ERROR(check_header());
    FJ_RETURN_IF_ERROR(collect_defs(p_.body, ""));
    for (const GridAxis &axis : p_.grid)
      visible_[axis.arg] = true;
    return check_block(p_.body, "", nullptr);
  }

private:
  std::string value(ValueId v) const {
    return v >= 0 && static_cast<size_t>(v) < names_.size() ? "%" + names_[v]
                                                            : fmt::format("%?{}", v);
  }
  bool valid(ValueId v) const { return v >= 0 && static_cast<size_t>(v) < p_.values.size(); }

  static std::string op_at(const std::string &prefix, size_t i, const Op &op) {
    return fmt::format("op #{}{} `{}`", prefix, i, op_info(op.kind).name);
  }

  /// An extent is a positive constant or an integer scalar parameter.
  /// With `sequence_ok`, it may also name a sequence (a per-batch length).
  Status check_extent(const Extent &e, std::string_view what, bool zero_ok = false,
                      bool sequence_ok = false) const {
    if (!e.is_param()) {
      if (e.value < (zero_ok ? 0 : 1))
        return Status::error("{} is {}, expected {}", what, e.value,
                             zero_ok ? "at least 0" : "a positive size");
      return Status::ok();
    }
    if (p_.sequence(e.param)) {
      if (sequence_ok)
        return Status::ok();
      return Status::error("{} reads sequence %{}, a per-batch length; it takes a scalar "
                           "parameter",
                           what, e.param);
    }
    const ScalarParam *s = p_.scalar(e.param);
    if (!s)
      return Status::error("{} reads %{}, which is not a scalar parameter of the kernel", what,
                           e.param);
    if (s->type == ScalarType::f32)
      return Status::error("{} reads %{} of type f32, expected an integer parameter", what,
                           e.param);
    return Status::ok();
  }

  Status check_header() {
    if (!is_identifier(p_.name))
      return Status::error("kernel name '{}' is not an identifier", p_.name);
    std::set<std::string> value_names_used(names_.begin(), names_.end());
    for (size_t i = 0; i < p_.scalars.size(); ++i) {
      const ScalarParam &s = p_.scalars[i];
      if (!is_identifier(s.name) || s.name.find('.') != std::string::npos)
        return Status::error("scalar parameter {} has name '{}', which is not a C identifier", i,
                             s.name);
      if (p_.scalar(s.name) != &s)
        return Status::error("scalar parameter %{} is declared twice", s.name);
      if (value_names_used.count(s.name))
        return Status::error("scalar parameter %{} has the name of a value; rename one (both "
                             "become identifiers of the generated kernel)",
                             s.name);
    }
    for (size_t i = 0; i < p_.indices.size(); ++i) {
      const std::string &name = p_.indices[i];
      if (!is_identifier(name) || name.find('.') != std::string::npos)
        return Status::error("index array {} has name '{}', which is not a C identifier", i, name);
      if (std::find(p_.indices.begin(), p_.indices.end(), name) != p_.indices.begin() + i)
        return Status::error("index array @{} is declared twice", name);
      if (p_.scalar(name) || p_.tensor(name) || value_names_used.count(name))
        return Status::error("index array @{} has the name of a scalar, tensor or value; rename "
                             "one (both become identifiers of the generated kernel)",
                             name);
    }
    for (const ArrayParam &a : p_.arrays)
      if (const std::string &name = a.name;
          !is_identifier(name) || name.find('.') != std::string::npos || p_.scalar(name) ||
          p_.has_index(name) || p_.tensor(name) || value_names_used.count(name) ||
          p_.array(name) != &a)
        return Status::error("array @{} is not a C identifier, is declared twice, or has the name "
                             "of a scalar, index array, tensor or value",
                             name);
    for (const ScoreFunction &f : p_.functions) {
      if (!is_identifier(f.name) || p_.function(f.name) != &f)
        return Status::error("function @{} is not an identifier or is defined twice", f.name);
      auto e = parse_expr(f.text, p_.expr_scope(), fmt::format("function @{}", f.name));
      if (!e)
        return e.status();
      if (e->is_int && !names_a_range(p_.body, f.name))
        return Status::error("function @{} gives an integer; a score function gives the new "
                             "score (a float; -inf hides the key), and only a `for`'s `range` "
                             "(a mask) is an integer",
                             f.name);
    }
    for (const Sequence &q : p_.sequences) {
      if (!is_identifier(q.name) || q.name.find('.') != std::string::npos)
        return Status::error("sequence '{}' is not a C identifier", q.name);
      if (p_.sequence(q.name) != &q || p_.scalar(q.name) || p_.has_index(q.name) ||
          value_names_used.count(q.name) || p_.tensor(q.name))
        return Status::error("sequence %{} is declared twice or has the name of a scalar, index "
                             "array, tensor or value",
                             q.name);
      if (q.starts.empty() && q.used.empty())
        return Status::error("sequence %{} reads neither starts nor used lengths: a length the "
                             "same for every batch is a scalar parameter",
                             q.name);
      for (const std::string *array : {&q.starts, &q.used})
        if (!array->empty() && !p_.has_index(*array))
          return Status::error("sequence %{} reads @{}, which is not an index array of the kernel",
                               q.name, *array);
      FJ_RETURN_IF_ERROR(check_extent(q.capacity, fmt::format("sequence %{}'s capacity", q.name)));
    }
    for (size_t i = 0; i < p_.tensors.size(); ++i) {
      const TensorParam &t = p_.tensors[i];
      if (!is_identifier(t.name))
        return Status::error("tensor {} has name '{}', which is not an identifier", i, t.name);
      if (p_.tensor(t.name) != &t)
        return Status::error("tensor @{} is declared twice", t.name);
      if (t.dim < 0)
        return Status::error("tensor @{} has dim = {}; sizes must be positive (dim = 0 only for "
                             "a vector such as @LSE)",
                             t.name, t.dim);
      const std::pair<const char *, const Extent *> extents[] = {{"batch", &t.batch},
                                                                 {"heads", &t.heads},
                                                                 {"seq", &t.seq},
                                                                 {"batch stride", &t.stride_batch},
                                                                 {"heads stride", &t.stride_head},
                                                                 {"seq stride", &t.stride_seq},
                                                                 {"dim stride", &t.stride_dim},
                                                                 {"split stride", &t.stride_split},
                                                                 {"group stride", &t.stride_group},
                                                                 {"row group", &t.row_group}};
      for (const auto &[what, e] : extents)
        FJ_RETURN_IF_ERROR(check_extent(
            *e, fmt::format("tensor @{}'s {}", t.name, what),
            std::string_view(what).find("stride") != std::string_view::npos, e == &t.seq));
      const Sequence *rows = t.seq.is_param() ? p_.sequence(t.seq.param) : nullptr;
      if (t.packed && (!rows || rows->starts.empty()))
        return Status::error("tensor @{} is packed but its seq extent is not a sequence with "
                             "starts (the rows where each batch begins)",
                             t.name);
      if (t.grouped() && (t.packed || (t.name != "Q" && t.name != "O" && t.name != "LSE")))
        return Status::error("tensor @{} is grouped: only dense query rows (@Q, @O, @LSE) may be",
                             t.name);
      if (!t.pages.table.empty()) {
        if (!p_.has_index(t.pages.table))
          return Status::error("tensor @{} reads pages from @{}, which is not an index array of "
                               "the kernel",
                               t.name, t.pages.table);
        if (t.packed)
          return Status::error("tensor @{} is both packed and paged: its rows come from one or "
                               "the other",
                               t.name);
        if (t.name != "K" && t.name != "V")
          return Status::error("tensor @{} is paged: only @K and @V (a KV cache) may be", t.name);
        FJ_RETURN_IF_ERROR(check_extent(t.pages.table_stride,
                                        fmt::format("tensor @{}'s page table stride", t.name)));
        FJ_RETURN_IF_ERROR(
            check_extent(t.pages.page_size, fmt::format("tensor @{}'s page size", t.name)));
        FJ_RETURN_IF_ERROR(
            check_extent(t.pages.count, fmt::format("tensor @{}'s page count", t.name)));
      }
      if (t.row_align != 2 && t.row_align != 4 && t.row_align != 8 && t.row_align != 16)
        return Status::error("tensor @{} has align = {}, expected 2, 4, 8 or 16 (bytes)", t.name,
                             t.row_align);
    }
    // Masks, loops and head dims are defined over Q's and K's rows and V's dim.
    for (const char *required : {"Q", "K", "V"})
      if (!p_.tensor(required))
        return Status::error("missing tensor @{} (a kernel needs @Q, @K and @V)", required);
    if (p_.grid.size() != 3 && p_.grid.size() != 4)
      return Status::error("the grid has {} arguments, expected 3 (q block, head, batch) or 4 "
                           "(and the KV split)",
                           p_.grid.size());
    for (const TensorParam &t : p_.tensors)
      if (t.stride_split != Extent::constant(0) && p_.grid.size() != 4)
        return Status::error("tensor @{} has a split stride but the grid has no KV split axis "
                             "(a 4th grid argument)",
                             t.name);
    const char *roles[] = {"q block", "head", "batch", "kv split"};
    for (size_t i = 0; i < p_.grid.size(); ++i) {
      ValueId v = p_.grid[i].arg;
      if (!valid(v))
        return Status::error("grid argument {} ({}) refers to value {}, which does not exist", i,
                             roles[i], v);
      if (!p_.type_of(v).is_index())
        return Status::error("grid argument {} ({}) has type {}, expected index", i, value(v),
                             to_string(p_.type_of(v)));
      FJ_RETURN_IF_ERROR(define(v, "the grid"));
      FJ_RETURN_IF_ERROR(check_extent(p_.grid[i].extent, fmt::format("grid extent {}", i)));
      if (p_.grid[i].divisor < 1)
        return Status::error("grid extent {} divides by {}, expected a positive divisor", i,
                             p_.grid[i].divisor);
    }
    FJ_RETURN_IF_ERROR(check_extent(p_.group, "group"));
    FJ_RETURN_IF_ERROR(check_config());
    for (size_t v = 0; v < p_.values.size(); ++v) {
      const ValueDef &d = p_.values[v];
      if (!d.name.empty() && !is_identifier(d.name))
        return Status::error("value {} has name '{}', which is not an identifier (a letter or "
                             "'_', then letters, digits, '_' or '.')",
                             v, d.name);
      if (!d.type.is_index() && (d.type.rows <= 0 || d.type.cols < 0))
        return Status::error("value {} has type {}, whose sizes are not positive",
                             value(static_cast<ValueId>(v)), to_string(d.type));
    }
    return Status::ok();
  }

  /// The config holds knobs of ir::Config only (the lowering would ignore any
  /// other), as integers in the ranges ir::validate(Config) accepts: the lowering
  /// sizes its tiles and divides by them.
  Status check_config() const {
    Config c;
    const std::pair<std::string_view, int64_t *> knobs[] = {
        {"block_m", &c.block_m},        {"block_n", &c.block_n}, {"waves", &c.waves},
        {"stages", &c.stages},          {"pad_k", &c.pad_k},     {"mma_m", &c.mma_m},
        {"dkdv_passes", &c.dkdv_passes}};
    for (const auto &[key, attr] : p_.config) {
      if (!std::holds_alternative<int64_t>(attr))
        return Status::error("config {} is {}, expected an integer", key, attr_kind(attr));
      const int64_t v = std::get<int64_t>(attr);
      if (key == "q_in_lds" || key == "persistent" || key == "prefetch_blocks") {
        if (v != 0 && v != 1)
          return Status::error("config {} = {}, expected 0 or 1", key, v);
        if (key == "persistent")
          c.persistent = v != 0;
        if (key == "prefetch_blocks")
          c.prefetch_blocks = v != 0;
        continue;
      }
      auto knob = std::find_if(std::begin(knobs), std::end(knobs),
                               [&](const auto &k) { return k.first == key; });
      if (knob == std::end(knobs))
        return Status::error(
            "config {} is not a knob of the kernels (block_m, block_n, waves, "
            "stages, q_in_lds, pad_k, mma_m, dkdv_passes, persistent, prefetch_blocks)",
            key);
      *knob->second = v;
    }
    return validate(c);
  }

  /// Records where each value is defined; a value defined twice is an error.
  Status define(ValueId v, const std::string &site) {
    if (!valid(v))
      return Status::error("{}: defines value {}, which does not exist (the program has {} "
                           "values)",
                           site, v, p_.values.size());
    if (!def_site_[v].empty())
      return Status::error("{}: redefines {}, already defined by {}", site, value(v), def_site_[v]);
    def_site_[v] = site;
    return Status::ok();
  }

  Status collect_defs(const std::vector<Op> &body, const std::string &prefix) {
    for (size_t i = 0; i < body.size(); ++i) {
      const Op &op = body[i];
      std::string at = op_at(prefix, i, op);
      for (ValueId v : op.results)
        FJ_RETURN_IF_ERROR(define(v, at));
      for (ValueId v : op.region_args)
        FJ_RETURN_IF_ERROR(define(v, at + " (region argument)"));
      FJ_RETURN_IF_ERROR(collect_defs(op.body, fmt::format("{}{}.", prefix, i)));
    }
    return Status::ok();
  }

  /// Counts, scoping and region shape of one op, then its type rules.
  Status check_structure(const OpChecker &c, const Op &op) {
    const OpInfo &info = op_info(op.kind);
    if (info.num_operands >= 0 && op.operands.size() != size_t(info.num_operands))
      return c.fail("has {} operands, expected {}", op.operands.size(), info.num_operands);
    if (info.num_results >= 0 && op.results.size() != size_t(info.num_results))
      return c.fail("has {} results, expected {}", op.results.size(), info.num_results);
    if (op.kind == OpKind::For) {
      if (op.operands.empty())
        return c.fail("has no operands, expected the q block index and then the initial values");
      if (op.results.size() != op.operands.size() - 1)
        return c.fail("has {} results, expected {} (one per initial value)", op.results.size(),
                      op.operands.size() - 1);
      if (const auto it = op.attrs.find("range"); it != op.attrs.end()) {
        // The block-range pass: an integer expression of the pair (a mask).
        const Symbol *f = std::get_if<Symbol>(&it->second);
        const ScoreFunction *fn = f ? p_.function(f->name) : nullptr;
        if (!fn)
          return c.fail("attr `range` must name a function of the kernel (@name)");
        auto e = parse_expr(fn->text, p_.expr_scope(), "function @" + fn->name);
        if (!e)
          return e.status();
        if (!e->is_int || uses_var(*e, "score"))
          return c.fail("attr `range` names @{}, which is not an integer expression of the "
                        "positions (a mask: no score, no float result)",
                        fn->name);
      }
      FJ_RETURN_IF_ERROR(check_blocks(c, p_, op));
    } else if (!op.region_args.empty() || !op.body.empty()) {
      return c.fail("has a region, but only `for` has one");
    }
    for (size_t i = 0; i < op.operands.size(); ++i) {
      ValueId v = op.operands[i];
      if (!valid(v))
        return c.fail("operand {} refers to value {}, which does not exist (the program has {} "
                      "values)",
                      i, v, p_.values.size());
      if (visible_[v])
        continue;
      if (def_site_[v].empty())
        return c.fail("operand {} ({}) is never defined", i, value(v));
      return c.fail("operand {} ({}) is not in scope here: it is defined by {}, which comes later "
                    "or inside a loop body",
                    i, value(v), def_site_[v]);
    }
    for (size_t r = 0; r < op.results.size(); ++r)
      if (p_.type_of(op.results[r]).is_index() && op.kind != OpKind::For)
        return c.fail("result {} ({}) has type index; only the grid and a for's region define "
                      "index values",
                      r, value(op.results[r]));
    return check_types(c, op);
  }

  /// `for`: operand 0 the q block, then the initial values; the body's region
  /// arguments are the kv block index and the loop-carried values.
  Status check_for(const OpChecker &c, const Op &op, const std::string &prefix, size_t i) {
    FJ_RETURN_IF_ERROR(c.index(operand(0)));
    for (const char *key : {"block_m", "block_n", "causal"})
      FJ_RETURN_IF_ERROR(c.int_attr(key));
    FJ_RETURN_IF_ERROR(flag_attr(c, op, "transposed"));
    for (const char *key : {"window_left", "window_right", "q_group"})
      FJ_RETURN_IF_ERROR(c.value_attr(key, true, false));
    FJ_RETURN_IF_ERROR(check_q_group(c, op));
    if (op.attrs.count("splits") && op.int_attr("transposed") != 0)
      return c.fail("splits a transposed loop (over query blocks); only the KV loop splits");
    if (op.attrs.count("splits")) {
      FJ_RETURN_IF_ERROR(c.value_attr("splits", true, true));
      if (p_.grid.size() != 4)
        return c.fail("splits the KV range, but the grid has no KV split axis (a 4th grid "
                      "argument) to say which split a workgroup runs");
    }
    for (size_t r = 0; r < op.results.size(); ++r)
      FJ_RETURN_IF_ERROR(
          c.type_is(result(r), c.type(operand(r + 1)),
                    fmt::format("the type of its initial value, operand {}", r + 1)));
    if (op.region_args.size() != op.operands.size())
      return c.fail("has {} region arguments, expected {} (the kv block index, then one per "
                    "loop-carried value)",
                    op.region_args.size(), op.operands.size());
    for (size_t a = 0; a < op.region_args.size(); ++a) {
      ValueId v = op.region_args[a];
      const Type &want = a == 0 ? Type::index() : c.type(operand(a));
      if (p_.type_of(v) != want)
        return c.fail("region argument {} ({}) has type {}, expected {} ({})", a, value(v),
                      to_string(p_.type_of(v)), to_string(want),
                      a == 0 ? "the kv block index" : "the type of its initial value");
      visible_[v] = true;
    }
    if (op.body.empty() || op.body.back().kind != OpKind::Yield)
      return c.fail("body must end with `yield`");
    FJ_RETURN_IF_ERROR(check_block(op.body, fmt::format("{}{}.", prefix, i), &op));
    for (ValueId v : op.region_args)
      visible_[v] = false;
    return Status::ok();
  }

  /// `yield`: the last op of a for body, with one value per result of the for.
  Status check_yield(const OpChecker &c, const Op &op, const Op &loop) {
    if (op.operands.size() != loop.results.size())
      return c.fail("yields {} values, but the enclosing for has {} results", op.operands.size(),
                    loop.results.size());
    for (size_t i = 0; i < op.operands.size(); ++i) {
      const Type &want = p_.type_of(loop.results[i]);
      FJ_RETURN_IF_ERROR(
          c.type_is(operand(i), want, fmt::format("the type of result {} of the for", i)));
    }
    return Status::ok();
  }

  /// `loop`: the for whose body this is, or null at the top level.
  Status check_block(const std::vector<Op> &body, const std::string &prefix, const Op *loop) {
    std::vector<ValueId> defined;
    for (size_t i = 0; i < body.size(); ++i) {
      const Op &op = body[i];
      OpChecker c(p_, names_, op, op_at(prefix, i, op));
      if (op.kind == OpKind::Yield && !loop)
        return c.fail("`yield` outside a for body");
      if (op.kind == OpKind::Yield && i + 1 != body.size())
        return c.fail("`yield` must be the last op of the for body, but {} more follow",
                      body.size() - i - 1);
      FJ_RETURN_IF_ERROR(check_structure(c, op));
      if (op.kind == OpKind::Yield)
        FJ_RETURN_IF_ERROR(check_yield(c, op, *loop));
      if (op.kind == OpKind::For)
        FJ_RETURN_IF_ERROR(check_for(c, op, prefix, i));
      for (ValueId v : op.results) {
        visible_[v] = true;
        defined.push_back(v);
      }
    }
    if (loop) // a body's values are not visible after its loop
      for (ValueId v : defined)
        visible_[v] = false;
    return Status::ok();
  }

  const Program &p_;
  std::vector<std::string> names_;
  std::vector<bool> visible_;
  std::vector<std::string> def_site_; // "" until defined
};

} // namespace

Status verify(const Program &p) { return Verifier(p).run(); }

} // namespace flashjit::ir
