#include "ir/ir.h"

#include <fmt/format.h>

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

} // namespace flashjit::ir
