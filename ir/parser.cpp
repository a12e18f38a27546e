// parse(): reads the text form that print() writes. A hand-written recursive
// descent over characters; newlines end ops, `//` starts a comment. Every error
// says where (line, column) and what was expected there. The parser checks
// syntax, names and op arities only; verify() checks types.
#include "ir/ir.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <limits>
#include <optional>
#include <unordered_map>

namespace flashjit::ir {
namespace {

bool is_ident_start(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
bool is_digit(char c) { return c >= '0' && c <= '9'; }
bool is_ident_char(char c) { return is_ident_start(c) || is_digit(c) || c == '.'; }
bool is_number(std::string_view s) {
  return !s.empty() && s.find_first_not_of("0123456789") == std::string_view::npos;
}

std::optional<TileLayout> layout_from_name(std::string_view name) {
  for (TileLayout l : {TileLayout::blocked, TileLayout::mma_a, TileLayout::mma_b,
                       TileLayout::mma_acc, TileLayout::rows, TileLayout::cols})
    if (tile_layout_name(l) == name)
      return l;
  return std::nullopt;
}

std::optional<OpKind> op_from_name(std::string_view name) {
  for (int i = 0; i < kNumOps; ++i)
    if (op_info(static_cast<OpKind>(i)).name == name)
      return static_cast<OpKind>(i);
  return std::nullopt;
}

std::string all_op_names() {
  std::string s;
  for (int i = 0; i < kNumOps; ++i)
    s += fmt::format("{}{}", i ? ", " : "", op_info(static_cast<OpKind>(i)).name);
  return s;
}

std::string plural(int64_t n, std::string_view word) {
  return fmt::format("{} {}{}", n, word, n == 1 ? "" : "s");
}

class Parser {
public:
  explicit Parser(std::string_view text) : src_(text) {}

  Expected<Program> run() {
    Status s = parse_kernel();
    if (!s)
      return s;
    return std::move(prog_);
  }

private:
  // A value name as written after '%' ("m", "12"), and where it was written.
  struct NameAt {
    std::string name;
    size_t pos;
  };

  // ---- characters and tokens -------------------------------------------------

  char peek() const { return pos_ < src_.size() ? src_[pos_] : '\0'; }
  bool at_end() const { return pos_ >= src_.size(); }

  /// Skips spaces and a trailing `//` comment, never the newline.
  void skip_spaces() {
    while (!at_end()) {
      char c = peek();
      if (c == ' ' || c == '\t' || c == '\r') {
        ++pos_;
      } else if (c == '/' && pos_ + 1 < src_.size() && src_[pos_ + 1] == '/') {
        while (!at_end() && peek() != '\n')
          ++pos_;
      } else {
        break;
      }
    }
  }

  void skip_blank_lines() {
    for (;;) {
      skip_spaces();
      if (peek() != '\n')
        return;
      ++pos_;
    }
  }

  /// The text of the token at the cursor, for "found ..." in errors.
  std::string next_token() const {
    if (at_end())
      return "end of input";
    char c = peek();
    if (c == '\n')
      return "end of line";
    size_t end = pos_;
    if (c == '%' || c == '@' || c == '#')
      ++end;
    while (end < src_.size() && (is_ident_char(src_[end]) || src_[end] == '-'))
      ++end;
    if (end == pos_ || (end == pos_ + 1 && !is_ident_char(c)))
      return fmt::format("'{}'", c);
    return fmt::format("'{}'", src_.substr(pos_, end - pos_));
  }

  /// "line L, col C" (both from 1) of a byte offset.
  std::string where(size_t pos) const {
    int line = 1, col = 1;
    for (size_t i = 0; i < pos && i < src_.size(); ++i) {
      if (src_[i] == '\n') {
        ++line;
        col = 1;
      } else {
        ++col;
      }
    }
    return fmt::format("line {}, col {}", line, col);
  }

  Status error_at(size_t pos, std::string_view message) const {
    return Status::error("{}: {}", where(pos), message);
  }

  /// "expected <what>, found <token>" at the cursor (after spaces).
  Status expected(std::string_view what) {
    skip_spaces();
    return error_at(pos_, fmt::format("expected {}, found {}", what, next_token()));
  }

  bool consume(char c) {
    skip_spaces();
    if (peek() != c)
      return false;
    ++pos_;
    return true;
  }

  Status expect(char c, std::string_view context) {
    if (consume(c))
      return Status::ok();
    return expected(fmt::format("'{}' {}", c, context));
  }

  /// An identifier at the cursor (after spaces), or "" if none.
  std::string_view ident() {
    skip_spaces();
    if (!is_ident_start(peek()))
      return {};
    size_t start = pos_;
    while (is_ident_char(peek()))
      ++pos_;
    return src_.substr(start, pos_ - start);
  }

  bool at_word(std::string_view w) {
    skip_spaces();
    size_t end = pos_;
    while (end < src_.size() && is_ident_char(src_[end]))
      ++end;
    return src_.substr(pos_, end - pos_) == w;
  }

  Status expect_word(std::string_view w, std::string_view context) {
    if (!at_word(w))
      return expected(fmt::format("'{}' {}", w, context));
    pos_ += w.size();
    return Status::ok();
  }

  Status expect_end_of_line(std::string_view context) {
    skip_spaces();
    if (at_end())
      return Status::ok();
    if (peek() != '\n')
      return expected(fmt::format("end of line {}", context));
    ++pos_;
    return Status::ok();
  }

  Status parse_int(int64_t &out, std::string_view what) {
    skip_spaces();
    size_t start = pos_;
    if (peek() == '-')
      ++pos_;
    if (!is_digit(peek())) {
      pos_ = start;
      return expected(what);
    }
    while (is_digit(peek()))
      ++pos_;
    auto [ptr, ec] = std::from_chars(src_.data() + start, src_.data() + pos_, out);
    if (ec != std::errc())
      return error_at(start, fmt::format("integer {} does not fit in 64 bits",
                                         src_.substr(start, pos_ - start)));
    return Status::ok();
  }

  /// `@name`
  Status parse_symbol(std::string &out, std::string_view what) {
    skip_spaces();
    if (peek() != '@')
      return expected(what);
    ++pos_;
    std::string_view name = ident();
    if (name.empty())
      return expected(fmt::format("a name after '@' in {}", what));
    out = std::string(name);
    return Status::ok();
  }

  /// An integer, a double (with '.', an exponent, inf or nan) or a symbol.
  /// The rest of `{k = v, ...}` after its '{'.
  Status parse_attr_dict(Attrs &attrs) {
    if (consume('}'))
      return Status::ok();
    do {
      skip_spaces();
      size_t key_pos = pos_;
      std::string key(ident());
      if (key.empty())
        return expected("an attribute name");
      if (attrs.count(key))
        return error_at(key_pos, fmt::format("duplicate attribute '{}'", key));
      FJ_RETURN_IF_ERROR(expect('=', fmt::format("after attribute name '{}'", key)));
      Attr value;
      FJ_RETURN_IF_ERROR(parse_attr_value(value));
      attrs.emplace(std::move(key), std::move(value));
    } while (consume(','));
    return expect('}', "or ',' in the attributes");
  }

  Status parse_attr_value(Attr &out) {
    skip_spaces();
    if (peek() == '@') {
      std::string name;
      FJ_RETURN_IF_ERROR(parse_symbol(name, "a symbol"));
      out = Symbol{name};
      return Status::ok();
    }
    if (peek() == '%') {
      std::string name;
      FJ_RETURN_IF_ERROR(parse_scalar_use(name));
      out = ParamRef{name};
      return Status::ok();
    }
    size_t start = pos_;
    bool negative = peek() == '-';
    if (negative)
      ++pos_;
    if (at_word("inf") || at_word("nan")) {
      bool inf = at_word("inf");
      pos_ += 3;
      double v =
          inf ? std::numeric_limits<double>::infinity() : std::numeric_limits<double>::quiet_NaN();
      out = negative ? -v : v;
      return Status::ok();
    }
    if (!is_digit(peek())) {
      pos_ = start;
      return expected("an attribute value (integer, float, inf, nan, @symbol or %scalar)");
    }
    bool is_float = false;
    while (is_digit(peek()))
      ++pos_;
    if (peek() == '.') {
      is_float = true;
      ++pos_;
      while (is_digit(peek()))
        ++pos_;
    }
    if (peek() == 'e' || peek() == 'E') {
      is_float = true;
      ++pos_;
      if (peek() == '+' || peek() == '-')
        ++pos_;
      if (!is_digit(peek()))
        return expected("exponent digits");
      while (is_digit(peek()))
        ++pos_;
    }
    const char *first = src_.data() + start;
    const char *last = src_.data() + pos_;
    std::string_view text = src_.substr(start, pos_ - start);
    if (is_float) {
      double v = 0;
      auto [ptr, ec] = std::from_chars(first, last, v);
      if (ec != std::errc() || ptr != last)
        return error_at(start, fmt::format("malformed number '{}'", text));
      out = v;
    } else {
      int64_t v = 0;
      auto [ptr, ec] = std::from_chars(first, last, v);
      if (ec != std::errc() || ptr != last)
        return error_at(start, fmt::format("integer {} does not fit in 64 bits", text));
      out = v;
    }
    return Status::ok();
  }

  // ---- types -----------------------------------------------------------------

  /// `index` | `tile<RxCxDT, #layout>` | `tile<RxDT, #layout>`
  Status parse_type(Type &out) {
    skip_spaces();
    if (at_word("index")) {
      pos_ += 5;
      out = Type::index();
      return Status::ok();
    }
    if (!at_word("tile"))
      return expected("a type ('index' or 'tile<...>')");
    pos_ += 4;
    if (peek() != '<')
      return expected("'<' after 'tile'");
    ++pos_;
    int64_t dims[2] = {0, 0};
    int ndims = 0;
    while (is_digit(peek())) {
      if (ndims == 2)
        return expected("a dtype after the tile shape");
      size_t start = pos_;
      while (is_digit(peek()))
        ++pos_;
      auto [ptr, ec] = std::from_chars(src_.data() + start, src_.data() + pos_, dims[ndims]);
      if (ec != std::errc())
        return error_at(start, "tile size does not fit in 64 bits");
      if (dims[ndims] == 0)
        return error_at(start, ndims == 0 ? "tile rows must be positive"
                                          : "tile columns must be positive (a vector tile "
                                            "is written tile<RxDT, #layout>)");
      ++ndims;
      if (peek() != 'x')
        return expected("'x' in the tile shape");
      ++pos_;
    }
    if (ndims == 0)
      return expected("tile rows after 'tile<'");
    size_t dtype_pos = pos_;
    std::string_view dtype_text;
    while (is_ident_char(peek()))
      ++pos_;
    dtype_text = src_.substr(dtype_pos, pos_ - dtype_pos);
    if (dtype_text.empty()) {
      pos_ = dtype_pos;
      return expected("a dtype (bf16, f16 or f32) in the tile type");
    }
    Expected<DType> dtype = parse_dtype(dtype_text);
    if (!dtype)
      return error_at(dtype_pos, dtype.status().message());
    FJ_RETURN_IF_ERROR(expect(',', "after the tile dtype"));
    skip_spaces();
    size_t layout_pos = pos_;
    if (peek() != '#')
      return expected("a layout ('#blocked', '#mma_a', '#mma_b', '#mma_acc' or '#rows')");
    ++pos_;
    std::string_view layout_text = ident();
    std::optional<TileLayout> layout = layout_from_name(layout_text);
    if (!layout)
      return error_at(layout_pos, fmt::format("unknown layout '#{}' (expected #blocked, #mma_a, "
                                              "#mma_b, #mma_acc or #rows)",
                                              layout_text));
    FJ_RETURN_IF_ERROR(expect('>', "to close the tile type"));
    out = Type::tile(dims[0], ndims == 2 ? dims[1] : 0, *dtype, *layout);
    return Status::ok();
  }

  // ---- values and scopes -------------------------------------------------------

  /// `%name` or `%12`, without looking it up.
  Status parse_value_name(NameAt &out, std::string_view what) {
    skip_spaces();
    if (peek() != '%')
      return expected(what);
    out.pos = pos_;
    ++pos_;
    size_t start = pos_;
    while (is_ident_char(peek()))
      ++pos_;
    out.name = std::string(src_.substr(start, pos_ - start));
    if (out.name.empty())
      return error_at(out.pos, "expected a value name or number after '%'");
    if (!is_number(out.name) && !is_ident_start(out.name[0]))
      return error_at(out.pos, fmt::format("invalid value name '%{}': expected a number or "
                                           "a name starting with a letter or '_'",
                                           out.name));
    return Status::ok();
  }

  /// A new value's name: must not have been used before anywhere in the kernel.
  Status parse_def(NameAt &out, std::string_view what) {
    FJ_RETURN_IF_ERROR(parse_value_name(out, what));
    if (auto it = def_pos_.find(out.name); it != def_pos_.end())
      return error_at(out.pos, fmt::format("redefinition of %{} (first defined at {})", out.name,
                                           where(it->second)));
    def_pos_[out.name] = out.pos;
    return Status::ok();
  }

  /// A value list of definitions: `%a, %b, ...` (at least one).
  Status parse_def_list(std::vector<NameAt> &out, std::string_view what) {
    do {
      NameAt n;
      FJ_RETURN_IF_ERROR(parse_def(n, what));
      out.push_back(std::move(n));
    } while (consume(','));
    return Status::ok();
  }

  /// `%12` defines an unnamed value; `%m` keeps its name.
  ValueId add_value(const NameAt &n, Type t) {
    return prog_.add_value(t, is_number(n.name) ? "" : n.name);
  }

  void make_visible(const NameAt &n, ValueId v) {
    visible_[n.name] = v;
    scopes_.back().push_back(n.name);
  }

  Status parse_use(ValueId &out) {
    NameAt n;
    FJ_RETURN_IF_ERROR(parse_value_name(n, "an operand ('%name')"));
    if (auto it = visible_.find(n.name); it != visible_.end()) {
      out = it->second;
      return Status::ok();
    }
    if (auto it = def_pos_.find(n.name); it != def_pos_.end())
      return error_at(n.pos, fmt::format("value %{} (defined at {}) is not visible here: a loop "
                                         "body's values and a for's own results cannot be used "
                                         "inside that loop's body, nor body values after it",
                                         n.name, where(it->second)));
    return error_at(n.pos, fmt::format("use of undefined value %{}", n.name));
  }

  // ---- kernel, header lines, ops ------------------------------------------------

  Status parse_kernel() {
    skip_blank_lines();
    FJ_RETURN_IF_ERROR(expect_word("kernel", "at the start of the program"));
    FJ_RETURN_IF_ERROR(parse_symbol(prog_.name, "the kernel name ('@name')"));
    FJ_RETURN_IF_ERROR(expect('{', "after the kernel name"));
    size_t open_pos = pos_ - 1;
    FJ_RETURN_IF_ERROR(expect_end_of_line("after 'kernel @name {'"));
    scopes_.emplace_back();
    bool have_grid = false;
    for (;;) {
      skip_blank_lines();
      if (at_word("scalars")) {
        if (!prog_.scalars.empty() || !prog_.tensors.empty() || have_grid)
          return error_at(pos_, "the 'scalars' line comes once, before the tensors and the grid");
        FJ_RETURN_IF_ERROR(parse_scalars());
      } else if (at_word("indices")) {
        if (!prog_.indices.empty() || !prog_.sequences.empty() || !prog_.tensors.empty() ||
            have_grid)
          return error_at(pos_, "the 'indices' line comes once, after the scalars and before the "
                                "sequences, the tensors and the grid");
        FJ_RETURN_IF_ERROR(parse_indices());
      } else if (at_word("arrays")) {
        if (!prog_.arrays.empty() || !prog_.tensors.empty() || have_grid)
          return error_at(pos_, "the 'arrays' line comes once, before the tensors and the grid");
        FJ_RETURN_IF_ERROR(parse_arrays());
      } else if (at_word("function")) {
        if (!prog_.tensors.empty() || have_grid)
          return error_at(pos_, "'function' lines come before the tensors and the grid");
        FJ_RETURN_IF_ERROR(parse_function());
      } else if (at_word("sequence")) {
        if (!prog_.tensors.empty() || have_grid)
          return error_at(pos_, "'sequence' lines come before the tensors and the grid");
        FJ_RETURN_IF_ERROR(parse_sequence());
      } else if (at_word("tensor")) {
        FJ_RETURN_IF_ERROR(parse_tensor());
      } else if (at_word("grid")) {
        if (have_grid)
          return error_at(pos_, "the kernel has a second 'grid' line");
        FJ_RETURN_IF_ERROR(parse_grid());
        have_grid = true;
      } else {
        break;
      }
    }
    if (!have_grid)
      return expected("a 'scalars', 'tensor' or 'grid' line (the grid comes before the first op)");
    FJ_RETURN_IF_ERROR(parse_block(prog_.body, open_pos, "kernel"));
    skip_blank_lines();
    if (!at_end())
      return expected("end of input after the kernel's closing '}'");
    return Status::ok();
  }

  /// `%name` of a declared scalar parameter.
  Status parse_scalar_use(std::string &out) {
    NameAt n;
    FJ_RETURN_IF_ERROR(parse_value_name(n, "a scalar parameter ('%name')"));
    if (!prog_.scalar(n.name) && !prog_.sequence(n.name))
      return error_at(n.pos, fmt::format("%{} is not a scalar parameter or sequence of the kernel "
                                         "(declare it on the 'scalars' line or a 'sequence' line)",
                                         n.name));
    out = n.name;
    return Status::ok();
  }

  /// An integer or a scalar parameter: `64` or `%seqlen_q`.
  Status parse_extent(Extent &out, std::string_view what) {
    skip_spaces();
    if (peek() == '%') {
      out.value = 0;
      return parse_scalar_use(out.param);
    }
    out.param.clear();
    return parse_int(out.value, fmt::format("{} (an integer or a %scalar)", what));
  }

  /// `[name = extent, ...]` with exactly the given names in order.
  /// `[name = extent, ...]` in the order of `fields`, then `, optional = extent`
  /// if `optional` is given and present.
  Status parse_fields(std::initializer_list<std::pair<std::string_view, Extent *>> fields,
                      std::string_view what,
                      std::initializer_list<std::pair<std::string_view, Extent *>> optional = {}) {
    FJ_RETURN_IF_ERROR(expect('[', fmt::format("to open the {}", what)));
    bool first = true;
    auto field = [&](std::string_view name, Extent *out) -> Status {
      FJ_RETURN_IF_ERROR(expect_word(name, fmt::format("in the {}", what)));
      FJ_RETURN_IF_ERROR(expect('=', fmt::format("after '{}'", name)));
      return parse_extent(*out, fmt::format("a value for '{}'", name));
    };
    for (auto [name, out] : fields) {
      if (!first)
        FJ_RETURN_IF_ERROR(expect(',', fmt::format("between {} fields", what)));
      first = false;
      FJ_RETURN_IF_ERROR(field(name, out));
    }
    // Optional fields, each at most once and in the order given.
    for (auto [name, out] : optional) {
      const size_t at = pos_;
      if (!consume(','))
        break;
      skip_spaces();
      if (!at_word(name)) {
        pos_ = at;
        continue;
      }
      FJ_RETURN_IF_ERROR(field(name, out));
    }
    return expect(']', fmt::format("to close the {}", what));
  }

  /// `scalars (%seqlen_q : i32, %q_seq_stride : i64, %scale_log2 : f32, ...)`
  Status parse_scalars() {
    pos_ += 7; // "scalars"
    FJ_RETURN_IF_ERROR(expect('(', "after 'scalars'"));
    if (consume(')'))
      return expect_end_of_line("after the scalars");
    do {
      NameAt n;
      FJ_RETURN_IF_ERROR(parse_value_name(n, "a scalar parameter ('%name')"));
      if (!is_ident_start(n.name[0]))
        return error_at(n.pos,
                        fmt::format("scalar parameter %{} needs a name, not a number", n.name));
      if (prog_.scalar(n.name))
        return error_at(n.pos, fmt::format("scalar parameter %{} is declared twice", n.name));
      FJ_RETURN_IF_ERROR(expect(':', "after the scalar parameter"));
      skip_spaces();
      size_t type_pos = pos_;
      std::string_view type = ident();
      ScalarParam param{n.name, ScalarType::i32};
      if (type == "i32")
        param.type = ScalarType::i32;
      else if (type == "i64")
        param.type = ScalarType::i64;
      else if (type == "f32")
        param.type = ScalarType::f32;
      else
        return error_at(type_pos,
                        fmt::format("unknown scalar type '{}': expected i32, i64 or f32", type));
      prog_.scalars.push_back(std::move(param));
    } while (consume(','));
    FJ_RETURN_IF_ERROR(expect(')', "to close the scalars"));
    return expect_end_of_line("after the scalars");
  }

  /// `@name` of a declared index array.
  Status parse_index_use(std::string &out, std::string_view what) {
    skip_spaces();
    const size_t at = pos_;
    FJ_RETURN_IF_ERROR(parse_symbol(out, what));
    if (!prog_.has_index(out))
      return error_at(at, fmt::format("@{} is not an index array of the kernel (declare it on the "
                                      "'indices' line)",
                                      out));
    return Status::ok();
  }

  /// `arrays (@alibi_slopes, @attn_mask : u8, ...)`
  Status parse_arrays() {
    pos_ += 6; // "arrays"
    FJ_RETURN_IF_ERROR(expect('(', "after 'arrays'"));
    do {
      skip_spaces();
      const size_t at = pos_;
      std::string name;
      FJ_RETURN_IF_ERROR(parse_symbol(name, "an array ('@name')"));
      if (prog_.array(name))
        return error_at(at, fmt::format("array @{} is declared twice", name));
      ArrayParam a{std::move(name)};
      if (consume(':')) {
        skip_spaces();
        const size_t type_at = pos_;
        const std::string type(ident());
        const ArrayElement elements[] = {ArrayElement::f32, ArrayElement::f16, ArrayElement::bf16,
                                         ArrayElement::u8};
        auto it = std::find_if(std::begin(elements), std::end(elements),
                               [&](ArrayElement e) { return array_element_name(e) == type; });
        if (it == std::end(elements))
          return error_at(type_at, fmt::format("unknown element type '{}' of array @{}: expected "
                                               "f32, f16, bf16 or u8",
                                               type, a.name));
        a.element = *it;
      }
      prog_.arrays.push_back(std::move(a));
    } while (consume(','));
    FJ_RETURN_IF_ERROR(expect(')', "to close the arrays"));
    return expect_end_of_line("after the arrays");
  }

  /// `function @score_mod = "text"` (the verifier parses the text)
  Status parse_function() {
    pos_ += 8; // "function"
    ScoreFunction f;
    skip_spaces();
    const size_t at = pos_;
    FJ_RETURN_IF_ERROR(parse_symbol(f.name, "the function name ('@name')"));
    if (prog_.function(f.name))
      return error_at(at, fmt::format("function @{} is defined twice", f.name));
    FJ_RETURN_IF_ERROR(expect('=', "after the function name"));
    FJ_RETURN_IF_ERROR(expect('"', "to open the function's text"));
    const size_t end = src_.find_first_of("\"\n", pos_);
    if (end == std::string_view::npos || src_[end] != '"')
      return error_at(pos_, "the function's text has no closing '\"' on its line");
    f.text = std::string(src_.substr(pos_, end - pos_));
    pos_ = end + 1;
    FJ_RETURN_IF_ERROR(expect_end_of_line("after the function"));
    prog_.functions.push_back(std::move(f));
    return Status::ok();
  }

  /// `indices (@cu_seqlens_q, @block_table, ...)`
  Status parse_indices() {
    pos_ += 7; // "indices"
    FJ_RETURN_IF_ERROR(expect('(', "after 'indices'"));
    do {
      skip_spaces();
      const size_t at = pos_;
      std::string name;
      FJ_RETURN_IF_ERROR(parse_symbol(name, "an index array ('@name')"));
      if (prog_.has_index(name))
        return error_at(at, fmt::format("index array @{} is declared twice", name));
      prog_.indices.push_back(std::move(name));
    } while (consume(','));
    FJ_RETURN_IF_ERROR(expect(')', "to close the indices"));
    return expect_end_of_line("after the indices");
  }

  /// `sequence %seqlen_k = lengths(starts = @cu, used = @used, capacity = %total_k)`
  Status parse_sequence() {
    pos_ += 8; // "sequence"
    NameAt n;
    FJ_RETURN_IF_ERROR(parse_value_name(n, "a sequence name ('%seqlen_q')"));
    if (!is_ident_start(n.name[0]))
      return error_at(n.pos, fmt::format("sequence %{} needs a name, not a number", n.name));
    if (prog_.scalar(n.name) || prog_.sequence(n.name))
      return error_at(n.pos, fmt::format("%{} is declared twice", n.name));
    Sequence q{n.name, {}, {}, {}};
    FJ_RETURN_IF_ERROR(expect('=', "after the sequence name"));
    FJ_RETURN_IF_ERROR(expect_word("lengths", "after '='"));
    FJ_RETURN_IF_ERROR(expect('(', "after 'lengths'"));
    if (at_word("starts")) {
      FJ_RETURN_IF_ERROR(expect_word("starts", "in lengths(...)"));
      FJ_RETURN_IF_ERROR(expect('=', "after 'starts'"));
      FJ_RETURN_IF_ERROR(parse_index_use(q.starts, "the starts array ('@name')"));
      FJ_RETURN_IF_ERROR(expect(',', "after the starts"));
    }
    if (at_word("used")) {
      FJ_RETURN_IF_ERROR(expect_word("used", "in lengths(...)"));
      FJ_RETURN_IF_ERROR(expect('=', "after 'used'"));
      FJ_RETURN_IF_ERROR(parse_index_use(q.used, "the lengths array ('@name')"));
      FJ_RETURN_IF_ERROR(expect(',', "after the used lengths"));
    }
    FJ_RETURN_IF_ERROR(expect_word("capacity", "in lengths(...)"));
    FJ_RETURN_IF_ERROR(expect('=', "after 'capacity'"));
    FJ_RETURN_IF_ERROR(parse_extent(q.capacity, "the capacity"));
    FJ_RETURN_IF_ERROR(expect(')', "to close lengths(...)"));
    FJ_RETURN_IF_ERROR(expect_end_of_line("after the sequence"));
    prog_.sequences.push_back(std::move(q));
    return Status::ok();
  }

  /// `tensor @Q : bf16 [batch = .., heads = .., seq = .., dim = ..] strides [...] align = 16
  ///  [packed] [grouped = %q_group] [pages = @table [stride = .., size = .., count = ..]]`
  Status parse_tensor() {
    pos_ += 6; // "tensor"
    TensorParam t{};
    skip_spaces();
    size_t name_pos = pos_;
    FJ_RETURN_IF_ERROR(parse_symbol(t.name, "the tensor name ('@Q')"));
    if (prog_.tensor(t.name))
      return error_at(name_pos, fmt::format("redefinition of tensor @{}", t.name));
    FJ_RETURN_IF_ERROR(expect(':', "after the tensor name"));
    skip_spaces();
    size_t dtype_pos = pos_;
    std::string_view dtype_text = ident();
    if (dtype_text.empty())
      return expected("the tensor dtype (bf16, f16 or f32)");
    Expected<DType> dtype = parse_dtype(dtype_text);
    if (!dtype)
      return error_at(dtype_pos, dtype.status().message());
    t.dtype = *dtype;
    Extent dim;
    FJ_RETURN_IF_ERROR(parse_fields(
        {{"batch", &t.batch}, {"heads", &t.heads}, {"seq", &t.seq}, {"dim", &dim}}, "shape"));
    if (dim.is_param())
      return error_at(pos_, fmt::format("tensor @{}: the head dim shapes the tiles, so it is a "
                                        "constant, not %{}",
                                        t.name, dim.param));
    t.dim = dim.value;
    FJ_RETURN_IF_ERROR(expect_word("strides", "after the tensor shape"));
    FJ_RETURN_IF_ERROR(parse_fields({{"batch", &t.stride_batch},
                                     {"heads", &t.stride_head},
                                     {"seq", &t.stride_seq},
                                     {"dim", &t.stride_dim}},
                                    "strides",
                                    {{"split", &t.stride_split}, {"group", &t.stride_group}}));
    FJ_RETURN_IF_ERROR(expect_word("align", "after the tensor strides"));
    FJ_RETURN_IF_ERROR(expect('=', "after 'align'"));
    FJ_RETURN_IF_ERROR(parse_int(t.row_align, "the row alignment in bytes (2, 8 or 16)"));
    if (at_word("packed")) {
      pos_ += 6;
      t.packed = true;
    }
    if (at_word("grouped")) {
      pos_ += 7;
      FJ_RETURN_IF_ERROR(expect('=', "after 'grouped'"));
      FJ_RETURN_IF_ERROR(parse_extent(t.row_group, "the rows per query position ('%q_group')"));
    }
    if (at_word("pages")) {
      pos_ += 5;
      FJ_RETURN_IF_ERROR(expect('=', "after 'pages'"));
      FJ_RETURN_IF_ERROR(parse_index_use(t.pages.table, "the page table ('@name')"));
      FJ_RETURN_IF_ERROR(parse_fields({{"stride", &t.pages.table_stride},
                                       {"size", &t.pages.page_size},
                                       {"count", &t.pages.count}},
                                      "pages"));
    }
    FJ_RETURN_IF_ERROR(expect_end_of_line("after the tensor alignment"));
    prog_.tensors.push_back(std::move(t));
    return Status::ok();
  }

  /// `grid (%q_block : ceil(%seqlen_q / 64), %head : %heads, %batch : %batches)
  ///  group = %group [config {block_m = 64, ...}]`
  Status parse_grid() {
    size_t grid_pos = pos_;
    pos_ += 4; // "grid"
    FJ_RETURN_IF_ERROR(expect('(', "after 'grid'"));
    int n = 0;
    do {
      if (n == 4)
        return error_at(grid_pos, "grid takes 3 arguments (q block, head, batch) and optionally a "
                                  "4th (the KV split), got more");
      NameAt name;
      FJ_RETURN_IF_ERROR(parse_def(name, "a grid argument ('%name')"));
      FJ_RETURN_IF_ERROR(expect(':', "after the grid argument"));
      GridAxis axis;
      if (at_word("ceil")) {
        pos_ += 4;
        FJ_RETURN_IF_ERROR(expect('(', "after 'ceil'"));
        FJ_RETURN_IF_ERROR(parse_extent(axis.extent, "the grid extent"));
        FJ_RETURN_IF_ERROR(expect('/', "in ceil(extent / divisor)"));
        FJ_RETURN_IF_ERROR(parse_int(axis.divisor, "the divisor (an integer)"));
        FJ_RETURN_IF_ERROR(expect(')', "to close ceil(...)"));
      } else {
        FJ_RETURN_IF_ERROR(parse_extent(axis.extent, "the grid extent"));
      }
      axis.arg = add_value(name, Type::index());
      prog_.grid.push_back(axis);
      make_visible(name, axis.arg);
      ++n;
    } while (consume(','));
    if (n < 3)
      return error_at(grid_pos, fmt::format("grid takes 3 arguments (q block, head, batch) and "
                                            "optionally a 4th (the KV split), got {}",
                                            n));
    FJ_RETURN_IF_ERROR(expect(')', "to close the grid arguments"));
    FJ_RETURN_IF_ERROR(expect_word("group", "after the grid arguments"));
    FJ_RETURN_IF_ERROR(expect('=', "after 'group'"));
    FJ_RETURN_IF_ERROR(parse_extent(prog_.group, "the group size"));
    skip_spaces();
    if (!at_end() && peek() == 'c') {
      FJ_RETURN_IF_ERROR(expect_word("config", "after the group size"));
      FJ_RETURN_IF_ERROR(expect('{', "after 'config'"));
      FJ_RETURN_IF_ERROR(parse_attr_dict(prog_.config));
    }
    return expect_end_of_line("after the grid");
  }

  /// Ops, one a line, up to the '}' that closes the block opened at `open_pos`.
  Status parse_block(std::vector<Op> &out, size_t open_pos, std::string_view what) {
    for (;;) {
      skip_blank_lines();
      if (at_end())
        return error_at(pos_, fmt::format("expected '}}' to close the {} opened at {}, found end "
                                          "of input",
                                          what, where(open_pos)));
      if (peek() == '}') {
        ++pos_;
        return Status::ok();
      }
      FJ_RETURN_IF_ERROR(parse_op(out));
    }
  }

  /// `[%r, ... =] name [%a, ...] [{k = v, ...}] [: T, ...] [(%i, ...) { ops }]`
  Status parse_op(std::vector<Op> &out) {
    std::vector<NameAt> results;
    skip_spaces();
    if (peek() == '%') {
      FJ_RETURN_IF_ERROR(parse_def_list(results, "a result name ('%name')"));
      FJ_RETURN_IF_ERROR(expect('=', "after the result names"));
    }
    skip_spaces();
    size_t op_pos = pos_;
    std::string_view name = ident();
    if (name.empty())
      return expected("an op name");
    std::optional<OpKind> kind = op_from_name(name);
    if (!kind)
      return error_at(op_pos, fmt::format("unknown op '{}' (valid ops: {})", name, all_op_names()));
    const OpInfo &info = op_info(*kind);
    Op op{*kind, {}, {}, {}, {}, {}};
    std::string_view last = "the op name";

    skip_spaces();
    if (peek() == '%') {
      do {
        ValueId v = -1;
        FJ_RETURN_IF_ERROR(parse_use(v));
        op.operands.push_back(v);
      } while (consume(','));
      last = "the operands";
    }
    const auto num_operands = static_cast<int64_t>(op.operands.size());
    const auto num_results = static_cast<int64_t>(results.size());
    if (info.num_operands >= 0 && num_operands != info.num_operands)
      return error_at(op_pos,
                      fmt::format("'{}' takes {}, got {}", info.name,
                                  plural(info.num_operands, "operand"), op.operands.size()));
    if (info.num_results >= 0 && num_results != info.num_results)
      return error_at(op_pos, fmt::format("'{}' has {}, got {}", info.name,
                                          plural(info.num_results, "result"), results.size()));
    if (*kind == OpKind::For && results.size() + 1 != op.operands.size())
      return error_at(op_pos, fmt::format("'for' with {} has {}, expected {} (one per initial "
                                          "value after the block index)",
                                          plural(op.operands.size(), "operand"),
                                          plural(results.size(), "result"),
                                          op.operands.empty() ? 0 : op.operands.size() - 1));

    if (consume('{')) {
      last = "attributes";
      FJ_RETURN_IF_ERROR(parse_attr_dict(op.attrs));
    }

    std::vector<Type> types;
    if (!results.empty()) {
      FJ_RETURN_IF_ERROR(expect(':', fmt::format("after {}", last)));
      do {
        Type t;
        FJ_RETURN_IF_ERROR(parse_type(t));
        types.push_back(t);
      } while (consume(','));
      if (types.size() != results.size())
        return error_at(op_pos, fmt::format("'{}' has {} but {}", info.name,
                                            plural(results.size(), "result"),
                                            plural(types.size(), "result type")));
    }
    for (size_t i = 0; i < results.size(); ++i)
      op.results.push_back(add_value(results[i], types[i]));

    if (*kind == OpKind::For) {
      skip_spaces();
      size_t args_pos = pos_;
      FJ_RETURN_IF_ERROR(expect('(', "and the region arguments after the for's result types"));
      std::vector<NameAt> args;
      FJ_RETURN_IF_ERROR(parse_def_list(args, "a region argument ('%name')"));
      FJ_RETURN_IF_ERROR(expect(')', "to close the region arguments"));
      if (args.size() != results.size() + 1)
        return error_at(args_pos,
                        fmt::format("'for' has {}, expected {} (the block index, then "
                                    "one per result)",
                                    plural(args.size(), "region argument"), results.size() + 1));
      FJ_RETURN_IF_ERROR(expect('{', "to open the loop body"));
      size_t open_pos = pos_ - 1;
      FJ_RETURN_IF_ERROR(expect_end_of_line("after '{'"));
      scopes_.emplace_back();
      for (size_t i = 0; i < args.size(); ++i) {
        ValueId v = add_value(args[i], i == 0 ? Type::index() : types[i - 1]);
        op.region_args.push_back(v);
        make_visible(args[i], v);
      }
      FJ_RETURN_IF_ERROR(parse_block(op.body, open_pos, "loop body"));
      for (const std::string &n : scopes_.back())
        visible_.erase(n);
      scopes_.pop_back();
    }
    FJ_RETURN_IF_ERROR(expect_end_of_line(fmt::format("after the '{}' op", info.name)));
    for (size_t i = 0; i < results.size(); ++i)
      make_visible(results[i], op.results[i]);
    out.push_back(std::move(op));
    return Status::ok();
  }

  std::string_view src_;
  size_t pos_ = 0;
  Program prog_;
  std::unordered_map<std::string, size_t> def_pos_;  // every name defined so far
  std::unordered_map<std::string, ValueId> visible_; // names in scope now
  std::vector<std::vector<std::string>> scopes_;     // names each open scope defined
};

} // namespace

Expected<Program> parse(std::string_view text) { return Parser(text).run(); }

} // namespace flashjit::ir
