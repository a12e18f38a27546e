#include "ir/ir.h"

#include "ir/expr.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>

namespace flashjit::ir {

const OpInfo &op_info(OpKind k) {
  static constexpr OpInfo kInfo[] = {
#define FJ_OP(Name, text, nops, nres, doc) {text, nops, nres, doc},
#include "ir/ops.def"
  };
  static_assert(sizeof(kInfo) / sizeof(kInfo[0]) == kNumOps);
  return kInfo[static_cast<int>(k)];
}

std::string_view tile_layout_name(TileLayout l) {
  switch (l) {
  case TileLayout::blocked:
    return "blocked";
  case TileLayout::mma_a:
    return "mma_a";
  case TileLayout::mma_b:
    return "mma_b";
  case TileLayout::mma_acc:
    return "mma_acc";
  case TileLayout::rows:
    return "rows";
  case TileLayout::cols:
    return "cols";
  }
  return "?";
}

std::string to_string(const Type &t) {
  if (t.is_index())
    return "index";
  if (t.is_vector())
    return fmt::format("tile<{}x{}, #{}>", t.rows, dtype_name(t.dtype), tile_layout_name(t.layout));
  return fmt::format("tile<{}x{}x{}, #{}>", t.rows, t.cols, dtype_name(t.dtype),
                     tile_layout_name(t.layout));
}

int64_t Op::int_attr(const std::string &k, int64_t fallback) const {
  auto it = attrs.find(k);
  if (it == attrs.end())
    return fallback;
  if (const int64_t *v = std::get_if<int64_t>(&it->second))
    return *v;
  return fallback;
}

double Op::float_attr(const std::string &k, double fallback) const {
  auto it = attrs.find(k);
  if (it == attrs.end())
    return fallback;
  if (const double *v = std::get_if<double>(&it->second))
    return *v;
  if (const int64_t *v = std::get_if<int64_t>(&it->second))
    return static_cast<double>(*v);
  return fallback;
}

std::string Op::symbol_attr(const std::string &k) const {
  auto it = attrs.find(k);
  if (it == attrs.end())
    return "";
  if (const Symbol *v = std::get_if<Symbol>(&it->second))
    return v->name;
  return "";
}

ValueId Program::add_value(Type t, std::string name) {
  values.push_back(ValueDef{std::move(name), t});
  return static_cast<ValueId>(values.size() - 1);
}

const TensorParam *Program::tensor(const std::string &name) const {
  for (const TensorParam &t : tensors)
    if (t.name == name)
      return &t;
  return nullptr;
}

DType Program::operand_dtype() const {
  const TensorParam *q = tensor("Q");
  if (q != nullptr && q->dtype != DType::f32)
    return q->dtype;
  for (const ValueDef &v : values)
    if (v.type.layout == TileLayout::mma_a && v.type.dtype != DType::f32)
      return v.type.dtype;
  return DType::bf16;
}

const ScalarParam *Program::scalar(std::string_view name) const {
  for (const ScalarParam &s : scalars)
    if (s.name == name)
      return &s;
  return nullptr;
}

const Sequence *Program::sequence(std::string_view name) const {
  for (const Sequence &s : sequences)
    if (s.name == name)
      return &s;
  return nullptr;
}

const ScoreFunction *Program::function(std::string_view name) const {
  for (const ScoreFunction &f : functions)
    if (f.name == name)
      return &f;
  return nullptr;
}

ExprScope Program::expr_scope() const {
  ExprScope scope;
  for (const ScalarParam &s : scalars)
    scope.scalars.emplace_back(s.name, s.type != ScalarType::f32);
  for (const ArrayParam &a : arrays)
    scope.arrays.push_back(a.name);
  return scope;
}

const ArrayParam *Program::array(std::string_view name) const {
  for (const ArrayParam &a : arrays)
    if (a.name == name)
      return &a;
  return nullptr;
}

std::string_view array_element_name(ArrayElement e) {
  switch (e) {
  case ArrayElement::f32:
    return "f32";
  case ArrayElement::f16:
    return "f16";
  case ArrayElement::bf16:
    return "bf16";
  case ArrayElement::u8:
    return "u8";
  }
  return "?";
}

bool Program::has_index(std::string_view name) const {
  return std::find(indices.begin(), indices.end(), name) != indices.end();
}

std::string_view scalar_type_name(ScalarType t) {
  switch (t) {
  case ScalarType::i32:
    return "i32";
  case ScalarType::i64:
    return "i64";
  case ScalarType::f32:
    return "f32";
  }
  return "?";
}

std::string to_string(const Extent &e) {
  return e.is_param() ? "%" + e.param : std::to_string(e.value);
}

// ---- bindings ----------------------------------------------------------------

void Bindings::set(std::string_view name, Value v) {
  for (auto &[n, value] : values_)
    if (n == name) {
      value = v;
      return;
    }
  values_.emplace_back(std::string(name), v);
}

const Bindings::Value *Bindings::find(std::string_view name, size_t *hint) const {
  const size_t n = values_.size();
  const size_t start = hint && *hint < n ? *hint : 0;
  for (size_t i = 0; i < n; ++i) {
    const size_t at = (start + i) % n;
    if (values_[at].first == name) {
      if (hint)
        *hint = at + 1;
      return &values_[at].second;
    }
  }
  return nullptr;
}

Expected<int64_t> Bindings::integer(std::string_view name, size_t *hint) const {
  const Value *v = find(name, hint);
  if (!v)
    return Status::error("scalar parameter %{} has no value: bind it before the launch", name);
  if (const int64_t *i = std::get_if<int64_t>(v))
    return *i;
  return Status::error("scalar parameter %{} is bound to {}, not an integer", name,
                       std::get<double>(*v));
}

Expected<double> Bindings::real(std::string_view name, size_t *hint) const {
  const Value *v = find(name, hint);
  if (!v)
    return Status::error("scalar parameter %{} has no value: bind it before the launch", name);
  if (const int64_t *i = std::get_if<int64_t>(v))
    return double(*i);
  return std::get<double>(*v);
}

Expected<int64_t> Bindings::resolve(const Extent &e) const {
  return e.is_param() ? integer(e.param) : Expected<int64_t>(e.value);
}

Status check_bindings(const Program &p, const Bindings &b) {
  for (const ScalarParam &s : p.scalars) {
    if (s.type == ScalarType::f32) {
      auto v = b.real(s.name);
      if (!v)
        return v.status();
      if (!std::isfinite(float(*v)))
        return Status::error("scalar parameter %{} = {} is not a finite f32", s.name, *v);
      continue;
    }
    auto v = b.integer(s.name);
    if (!v)
      return v.status();
    if (s.type == ScalarType::i32 &&
        (*v < std::numeric_limits<int32_t>::min() || *v > std::numeric_limits<int32_t>::max()))
      return Status::error("scalar parameter %{} = {} does not fit the kernel's i32", s.name, *v);
  }
  return Status::ok();
}

Expected<std::array<int64_t, 3>> grid_size(const std::vector<GridAxis> &grid, const Bindings &b) {
  std::array<int64_t, 3> size{1, 1, 1};
  for (size_t i = 0; i < grid.size() && i < 4; ++i) {
    auto extent = b.resolve(grid[i].extent);
    if (!extent)
      return extent.status();
    const int64_t d = std::max<int64_t>(grid[i].divisor, 1);
    const int64_t n = *extent <= 0 ? 0 : (*extent - 1) / d + 1;
    if (i < 3)
      size[i] = n;
    else
      size[0] *= n; // the KV split runs inside x
  }
  return size;
}

} // namespace flashjit::ir
