// print(): the text form of a Program. The parser reads exactly this form back,
// so print(parse(print(p))) == print(p) byte for byte.
#include "ir/ir.h"

#include <fmt/format.h>

#include <cmath>
#include <set>

namespace flashjit::ir {

std::vector<std::string> value_names(const Program &p) {
  const auto count = static_cast<ValueId>(p.values.size());
  std::vector<std::string> names(p.values.size());
  std::vector<bool> defined(p.values.size(), false);
  std::set<std::string> used;
  int next_number = 0;
  auto define = [&](ValueId v) {
    if (v < 0 || v >= count || defined[v])
      return;
    defined[v] = true;
    const std::string &wanted = p.values[v].name;
    if (wanted.empty()) {
      names[v] = std::to_string(next_number++);
      return;
    }
    std::string name = wanted;
    for (int k = 1; used.count(name); ++k)
      name = fmt::format("{}_{}", wanted, k);
    used.insert(name);
    names[v] = std::move(name);
  };
  // Definition order: grid args, then for each op its results, region args and body.
  auto walk = [&](auto &self, const std::vector<Op> &body) -> void {
    for (const Op &op : body) {
      for (ValueId v : op.results)
        define(v);
      for (ValueId v : op.region_args)
        define(v);
      self(self, op.body);
    }
  };
  for (const GridAxis &axis : p.grid)
    define(axis.arg);
  walk(walk, p.body);
  for (ValueId v = 0; v < count; ++v) // used but never defined: marked, so it cannot parse
    if (!defined[v])
      names[v] = p.values[v].name.empty() ? fmt::format("?{}", v) : "?" + p.values[v].name;
  return names;
}

namespace {

/// An integer prints as itself; a double prints in its shortest round-trip form
/// and always reads back as a double (1.0, not 1).
std::string attr_text(const Attr &a) {
  if (const int64_t *i = std::get_if<int64_t>(&a))
    return fmt::format("{}", *i);
  if (const Symbol *s = std::get_if<Symbol>(&a))
    return "@" + s->name;
  if (const ParamRef *r = std::get_if<ParamRef>(&a))
    return "%" + r->name;
  double d = std::get<double>(a);
  if (std::isinf(d))
    return d < 0 ? "-inf" : "inf";
  if (std::isnan(d))
    return "nan";
  std::string text = fmt::format("{}", d);
  if (text.find_first_of(".e") == std::string::npos)
    text += ".0";
  return text;
}

std::string attrs_text(const Attrs &attrs) {
  std::string s = "{";
  for (const auto &[key, attr] : attrs)
    s += fmt::format("{}{} = {}", s.size() > 1 ? ", " : "", key, attr_text(attr));
  return s + "}";
}

class Printer {
public:
  explicit Printer(const Program &p) : p_(p), names_(value_names(p)) {}

  std::string run() {
    line(1, "kernel @{} {{", p_.name);
    if (!p_.scalars.empty()) {
      std::string scalars;
      for (const ScalarParam &s : p_.scalars)
        scalars += fmt::format("{}%{} : {}", scalars.empty() ? "" : ", ", s.name,
                               scalar_type_name(s.type));
      line(2, "scalars ({})", scalars);
    }
    if (!p_.indices.empty()) {
      std::string indices;
      for (const std::string &name : p_.indices)
        indices += fmt::format("{}@{}", indices.empty() ? "" : ", ", name);
      line(2, "indices ({})", indices);
    }
    if (!p_.arrays.empty()) {
      std::string arrays;
      for (const ArrayParam &a : p_.arrays)
        arrays += fmt::format("{}@{}{}", arrays.empty() ? "" : ", ", a.name,
                              a.element == ArrayElement::f32
                                  ? ""
                                  : fmt::format(" : {}", array_element_name(a.element)));
      line(2, "arrays ({})", arrays);
    }
    for (const ScoreFunction &f : p_.functions)
      line(2, "function @{} = \"{}\"", f.name, f.text);
    for (const Sequence &q : p_.sequences) {
      std::string fields;
      if (!q.starts.empty())
        fields += fmt::format("starts = @{}, ", q.starts);
      if (!q.used.empty())
        fields += fmt::format("used = @{}, ", q.used);
      line(2, "sequence %{} = lengths({}capacity = {})", q.name, fields, to_string(q.capacity));
    }
    for (const TensorParam &t : p_.tensors) {
      std::string layout;
      if (t.packed)
        layout += " packed";
      if (t.grouped())
        layout += " grouped = " + to_string(t.row_group);
      if (!t.pages.table.empty())
        layout += fmt::format(" pages = @{} [stride = {}, size = {}, count = {}]", t.pages.table,
                              to_string(t.pages.table_stride), to_string(t.pages.page_size),
                              to_string(t.pages.count));
      line(2,
           "tensor @{} : {} [batch = {}, heads = {}, seq = {}, dim = {}] "
           "strides [batch = {}, heads = {}, seq = {}, dim = {}{}] align = {}{}",
           t.name, dtype_name(t.dtype), to_string(t.batch), to_string(t.heads), to_string(t.seq),
           t.dim, to_string(t.stride_batch), to_string(t.stride_head), to_string(t.stride_seq),
           to_string(t.stride_dim),
           (t.stride_split == Extent::constant(0) ? "" : ", split = " + to_string(t.stride_split)) +
               (t.grouped() ? ", group = " + to_string(t.stride_group) : ""),
           t.row_align, layout);
    }
    std::string grid;
    for (const GridAxis &axis : p_.grid)
      grid += fmt::format("{}{} : {}", grid.empty() ? "" : ", ", value(axis.arg),
                          axis.divisor == 1
                              ? to_string(axis.extent)
                              : fmt::format("ceil({} / {})", to_string(axis.extent), axis.divisor));
    line(2, "grid ({}) group = {}{}", grid, to_string(p_.group),
         p_.config.empty() ? "" : " config " + attrs_text(p_.config));
    for (const Op &op : p_.body)
      print_op(op, 2);
    line(1, "}}");
    return std::move(out_);
  }

private:
  template <typename... Args> void line(int indent, fmt::format_string<Args...> f, Args &&...args) {
    out_.append(2 * (indent - 1), ' ');
    fmt::format_to(std::back_inserter(out_), f, std::forward<Args>(args)...);
    out_ += '\n';
  }

  std::string value(ValueId v) const {
    if (v < 0 || static_cast<size_t>(v) >= names_.size())
      return fmt::format("%?{}", v);
    return "%" + names_[v];
  }

  std::string value_list(const std::vector<ValueId> &vs) const {
    std::string s;
    for (size_t i = 0; i < vs.size(); ++i)
      s += (i ? ", " : "") + value(vs[i]);
    return s;
  }

  std::string type_of(ValueId v) const {
    if (v < 0 || static_cast<size_t>(v) >= p_.values.size())
      return "<no type>";
    return to_string(p_.values[v].type);
  }

  void print_op(const Op &op, int indent) {
    std::string s;
    if (!op.results.empty())
      s += value_list(op.results) + " = ";
    s += op_info(op.kind).name;
    if (!op.operands.empty())
      s += " " + value_list(op.operands);
    if (!op.attrs.empty())
      s += " " + attrs_text(op.attrs);
    if (!op.results.empty()) {
      s += " :";
      for (size_t i = 0; i < op.results.size(); ++i)
        s += (i ? ", " : " ") + type_of(op.results[i]);
    }
    if (op.kind != OpKind::For && op.region_args.empty() && op.body.empty()) {
      line(indent, "{}", s);
      return;
    }
    // The region arguments' types are implied: index, then the result types.
    line(indent, "{} ({}) {{", s, value_list(op.region_args));
    for (const Op &inner : op.body)
      print_op(inner, indent + 1);
    line(indent, "}}");
  }

  const Program &p_;
  std::vector<std::string> names_;
  std::string out_;
};

} // namespace

std::string print(const Program &p) { return Printer(p).run(); }

} // namespace flashjit::ir
