// Score expressions (ir/expr.h): a recursive-descent parser with C's
// precedence, the canonical printer, the evaluator and the C emitter.
#include "ir/expr.h"
#include "ir/interval.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <charconv>
#include <cmath>
#include <limits>
#include <utility>

namespace flashjit::ir {

namespace {

constexpr std::string_view kVariables[] = {"score",  "b",        "h",       "q_idx",
                                           "kv_idx", "seqlen_q", "seqlen_k"};
constexpr std::string_view kFunctions[] = {"min", "max", "abs", "exp", "log", "tanh", "uniform"};

bool is_float_function(std::string_view f) {
  return f == "exp" || f == "log" || f == "tanh" || f == "uniform";
}
int arity(std::string_view f) {
  return f == "min" || f == "max" ? 2 : f == "uniform" ? kUniformArgs : 1;
}

class Parser {
public:
  Parser(std::string_view text, const ExprScope &scope, std::string_view what)
      : s_(text), scope_(scope), what_(what) {}

  Expected<Expr> run() {
    Expr e;
    FJ_RETURN_IF_ERROR(ternary(e));
    skip();
    if (pos_ < s_.size())
      return error(fmt::format("unexpected '{}' after a complete expression", s_[pos_]));
    return e;
  }

private:
  Status error(std::string_view message) const {
    return Status::error("{}, column {}: {} (in \"{}\")", what_, pos_ + 1, message, s_);
  }

  // Any text is parsed without exhausting the stack: the parser recurses on
  // nesting (parentheses, calls, indices, ?:, prefix operators), and printing,
  // evaluating and freeing the tree recurse on its depth, which a chain of
  // binary operators makes as deep as it is long. No score needs more of either.
  static constexpr int kMaxNesting = 64;
  static constexpr int kMaxOperators = 1024;
  /// Counts one level of nesting for as long as it lives.
  class Nest {
  public:
    explicit Nest(int &depth) : depth_(++depth) {}
    ~Nest() { --depth_; }

  private:
    int &depth_;
  };
  Status check_depth() const {
    if (depth_ <= kMaxNesting)
      return Status::ok();
    return error(fmt::format("nested more than {} deep (parentheses, calls, '?:', prefix "
                             "operators): simplify the expression",
                             kMaxNesting));
  }
  void skip() {
    while (pos_ < s_.size() && (s_[pos_] == ' ' || s_[pos_] == '\t' || s_[pos_] == '\n'))
      ++pos_;
  }
  bool take(std::string_view op) {
    skip();
    if (s_.substr(pos_, op.size()) != op)
      return false;
    // "<" must not take the first half of "<=", "!" of "!=", "&" alone is no operator.
    if (op.size() == 1 && pos_ + 1 < s_.size() && s_[pos_ + 1] == '=' &&
        (op == "<" || op == ">" || op == "!" || op == "="))
      return false;
    pos_ += op.size();
    return true;
  }
  /// A node's operands, moved in: a braced list would copy every subtree (the
  /// elements of an initializer_list are const), and a chain of n operators
  /// would then cost n^2 copies.
  template <typename... E> static std::vector<Expr> operands(E &&...e) {
    std::vector<Expr> v;
    v.reserve(sizeof...(e));
    (v.push_back(std::forward<E>(e)), ...);
    return v;
  }
  static Expr binary(std::string op, Expr a, Expr b) {
    Expr e;
    e.kind = Expr::Kind::binary;
    const bool logical = op == "<" || op == "<=" || op == ">" || op == ">=" || op == "==" ||
                         op == "!=" || op == "&&" || op == "||";
    e.is_int = logical || (a.is_int && b.is_int);
    e.name = std::move(op);
    e.args = operands(std::move(a), std::move(b));
    return e;
  }

  Status ternary(Expr &out) {
    Nest nest(depth_);
    FJ_RETURN_IF_ERROR(check_depth());
    FJ_RETURN_IF_ERROR(logical_or(out));
    if (!take("?"))
      return Status::ok();
    Expr yes, no;
    FJ_RETURN_IF_ERROR(ternary(yes));
    if (!take(":"))
      return error("expected ':' of a '?:'");
    FJ_RETURN_IF_ERROR(ternary(no));
    Expr e;
    e.kind = Expr::Kind::select;
    e.is_int = yes.is_int && no.is_int;
    e.args = operands(std::move(out), std::move(yes), std::move(no));
    out = std::move(e);
    return Status::ok();
  }
  // One level of left-associative binary operators.
  template <typename Next>
  Status level(Expr &out, std::initializer_list<std::string_view> ops, Next next) {
    FJ_RETURN_IF_ERROR((this->*next)(out));
    for (;;) {
      std::string_view found;
      for (std::string_view op : ops)
        if (take(op)) {
          found = op;
          break;
        }
      if (found.empty())
        return Status::ok();
      if (++operators_ > kMaxOperators)
        return error(fmt::format("more than {} operators: simplify the expression", kMaxOperators));
      const size_t at = pos_;
      Expr rhs;
      FJ_RETURN_IF_ERROR((this->*next)(rhs));
      if (found == "%" && !(out.is_int && rhs.is_int)) {
        pos_ = at;
        return error("'%' takes integers (b, h, q_idx, kv_idx, integer literals)");
      }
      out = binary(std::string(found), std::move(out), std::move(rhs));
    }
  }
  Status logical_or(Expr &e) { return level(e, {"||"}, &Parser::logical_and); }
  Status logical_and(Expr &e) { return level(e, {"&&"}, &Parser::equality); }
  Status equality(Expr &e) { return level(e, {"==", "!="}, &Parser::relational); }
  Status relational(Expr &e) { return level(e, {"<=", ">=", "<", ">"}, &Parser::additive); }
  Status additive(Expr &e) { return level(e, {"+", "-"}, &Parser::multiplicative); }
  Status multiplicative(Expr &e) { return level(e, {"*", "/", "%"}, &Parser::unary); }

  Status unary(Expr &out) {
    for (std::string_view op : {"-", "!"})
      if (take(op)) {
        Nest nest(depth_);
        FJ_RETURN_IF_ERROR(check_depth());
        Expr inner;
        FJ_RETURN_IF_ERROR(unary(inner));
        out = Expr{};
        out.kind = Expr::Kind::unary;
        out.is_int = op == "!" || inner.is_int;
        out.name = std::string(op);
        out.args = operands(std::move(inner));
        return Status::ok();
      }
    return primary(out);
  }

  Status primary(Expr &out) {
    skip();
    if (pos_ >= s_.size())
      return error("expected a value, found the end");
    if (take("(")) {
      FJ_RETURN_IF_ERROR(ternary(out));
      return take(")") ? Status::ok() : error("expected ')'");
    }
    const char c = s_[pos_];
    if (std::isdigit(static_cast<unsigned char>(c)) || c == '.')
      return number(out);
    if (!std::isalpha(static_cast<unsigned char>(c)) && c != '_')
      return error(fmt::format("unexpected '{}'", c));
    const size_t start = pos_;
    while (pos_ < s_.size() &&
           (std::isalnum(static_cast<unsigned char>(s_[pos_])) || s_[pos_] == '_'))
      ++pos_;
    const std::string name(s_.substr(start, pos_ - start));
    out = Expr{};
    out.name = name;
    if (name == "inf") {
      out.kind = Expr::Kind::number;
      out.value = std::numeric_limits<double>::infinity();
      return Status::ok();
    }
    if (std::find(std::begin(kVariables), std::end(kVariables), name) != std::end(kVariables)) {
      out.kind = Expr::Kind::var;
      out.is_int = name != "score";
      return Status::ok();
    }
    if (std::find(std::begin(kFunctions), std::end(kFunctions), name) != std::end(kFunctions)) {
      if (!take("("))
        return error(fmt::format("expected '(' after function {}", name));
      out.kind = Expr::Kind::call;
      for (int i = 0; i < arity(name); ++i) {
        if (i && !take(","))
          return error(fmt::format("{} takes {} arguments", name, arity(name)));
        Expr a;
        FJ_RETURN_IF_ERROR(ternary(a));
        out.args.push_back(std::move(a));
      }
      if (!take(")"))
        return error(fmt::format("expected ')' after the arguments of {}", name));
      out.is_int = !is_float_function(name) && std::all_of(out.args.begin(), out.args.end(),
                                                           [](const Expr &a) { return a.is_int; });
      if (name == "uniform" &&
          !std::all_of(out.args.begin(), out.args.end(), [](const Expr &a) { return a.is_int; }))
        return error("uniform takes integers: uniform(seed, offset, b, h, q_idx, kv_idx)");
      return Status::ok();
    }
    for (const auto &[scalar, is_int] : scope_.scalars)
      if (scalar == name) {
        out.kind = Expr::Kind::scalar;
        out.is_int = is_int;
        return Status::ok();
      }
    if (std::find(scope_.arrays.begin(), scope_.arrays.end(), name) != scope_.arrays.end()) {
      if (!take("["))
        return error(fmt::format("array {} is read by an index: {}[h]", name, name));
      Expr index;
      FJ_RETURN_IF_ERROR(ternary(index));
      if (!index.is_int)
        return error(fmt::format("the index of {} must be an integer", name));
      if (!take("]"))
        return error("expected ']'");
      out.kind = Expr::Kind::load;
      out.args = operands(std::move(index));
      return Status::ok();
    }
    pos_ = start;
    std::string known = "score, b, h, q_idx, kv_idx, seqlen_q, seqlen_k";
    for (const auto &[scalar, is_int] : scope_.scalars)
      known += ", " + scalar;
    for (const std::string &array : scope_.arrays)
      known += ", " + array + "[...]";
    return error(fmt::format("unknown name '{}': the names are {} and the functions min, max, "
                             "abs, exp, log, tanh, uniform",
                             name, known));
  }

  Status number(Expr &out) {
    const size_t start = pos_;
    bool is_float = false;
    while (pos_ < s_.size() && (std::isdigit(static_cast<unsigned char>(s_[pos_])) ||
                                s_[pos_] == '.' || s_[pos_] == 'e' || s_[pos_] == 'E' ||
                                ((s_[pos_] == '-' || s_[pos_] == '+') &&
                                 (s_[pos_ - 1] == 'e' || s_[pos_ - 1] == 'E')))) {
      is_float |= s_[pos_] == '.' || s_[pos_] == 'e' || s_[pos_] == 'E';
      ++pos_;
    }
    const std::string text(s_.substr(start, pos_ - start));
    double v = 0;
    auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
    if (ec != std::errc() || end != text.data() + text.size() || !std::isfinite(v) ||
        (!is_float && v > double(std::numeric_limits<int32_t>::max()))) {
      pos_ = start;
      return error(fmt::format("'{}' is not a number the kernels hold (a finite float, or an "
                               "integer below 2^31)",
                               text));
    }
    out = Expr{};
    out.kind = Expr::Kind::number;
    out.is_int = !is_float;
    out.value = v;
    return Status::ok();
  }

  std::string_view s_;
  const ExprScope &scope_;
  std::string_view what_;
  size_t pos_ = 0;
  int depth_ = 0;     // of nesting, as Nest counts it
  int operators_ = 0; // binary operators so far
};

std::string number_text(const Expr &e) {
  if (std::isinf(e.value))
    return "inf";
  if (e.is_int)
    return fmt::format("{}", int64_t(e.value));
  std::string s = fmt::format("{}", e.value);
  if (s.find_first_of(".e") == std::string::npos)
    s += ".0";
  return s;
}

double round_f32(double x, bool f32) { return f32 ? double(float(x)) : x; }

} // namespace

Expected<Expr> parse_expr(std::string_view text, const ExprScope &scope, std::string_view what) {
  return Parser(text, scope, what).run();
}

std::string print_expr(const Expr &e) {
  switch (e.kind) {
  case Expr::Kind::number:
    return number_text(e);
  case Expr::Kind::var:
  case Expr::Kind::scalar:
    return e.name;
  case Expr::Kind::load:
    return fmt::format("{}[{}]", e.name, print_expr(e.args[0]));
  case Expr::Kind::unary:
    return fmt::format("({}{})", e.name, print_expr(e.args[0]));
  case Expr::Kind::binary:
    return fmt::format("({} {} {})", print_expr(e.args[0]), e.name, print_expr(e.args[1]));
  case Expr::Kind::call: {
    std::string args;
    for (const Expr &a : e.args)
      args += (args.empty() ? "" : ", ") + print_expr(a);
    return fmt::format("{}({})", e.name, args);
  }
  case Expr::Kind::select:
    return fmt::format("({} ? {} : {})", print_expr(e.args[0]), print_expr(e.args[1]),
                       print_expr(e.args[2]));
  }
  return "?";
}

namespace {

/// The text of d e / d score, "" for 0 (which keeps the sums short).
std::string derivative_text(const Expr &e) {
  if (e.is_int || !uses_var(e, "score"))
    return "";
  auto p = [](const Expr &x) { return print_expr(x); };
  auto times = [](const std::string &a, const std::string &da) {
    return da.empty() ? std::string() : fmt::format("({} * {})", a, da);
  };
  auto sum = [](const std::string &a, const std::string &b, const char *op) {
    if (b.empty())
      return a;
    if (a.empty())
      return std::string(op) == "+" ? b : fmt::format("(-{})", b);
    return fmt::format("({} {} {})", a, op, b);
  };
  auto zero_or = [](const std::string &d) { return d.empty() ? std::string("0.0") : d; };
  switch (e.kind) {
  case Expr::Kind::var:
    return "1.0"; // score itself
  case Expr::Kind::number:
  case Expr::Kind::scalar:
  case Expr::Kind::load:
    return "";
  case Expr::Kind::unary: {
    const std::string d = derivative_text(e.args[0]);
    return e.name == "-" && !d.empty() ? fmt::format("(-{})", d) : "";
  }
  case Expr::Kind::binary: {
    const Expr &a = e.args[0], &b = e.args[1];
    const std::string da = derivative_text(a), db = derivative_text(b);
    if (e.name == "+" || e.name == "-")
      return sum(da, db, e.name.c_str());
    if (e.name == "*")
      return sum(times(p(b), da), times(p(a), db), "+");
    if (e.name == "/") {
      const std::string num = sum(times(p(b), da), times(p(a), db), "-");
      return num.empty() ? "" : fmt::format("({} / ({} * {}))", num, p(b), p(b));
    }
    return ""; // comparisons and logic are ints: constant almost everywhere
  }
  case Expr::Kind::call: {
    const std::string x = p(e.args[0]), dx = derivative_text(e.args[0]);
    if (e.name == "min" || e.name == "max") {
      const std::string dy = derivative_text(e.args[1]);
      if (dx.empty() && dy.empty())
        return "";
      return fmt::format("(({} {} {}) ? {} : {})", x, e.name == "min" ? "<=" : ">=", p(e.args[1]),
                         zero_or(dx), zero_or(dy));
    }
    if (dx.empty())
      return "";
    if (e.name == "abs")
      return fmt::format("(({} < 0.0) ? (-{}) : {})", x, dx, dx);
    if (e.name == "exp")
      return times(fmt::format("exp({})", x), dx);
    if (e.name == "log")
      return fmt::format("({} / {})", dx, x);
    return times(fmt::format("(1.0 - (tanh({0}) * tanh({0})))", x), dx); // tanh
  }
  case Expr::Kind::select: {
    const std::string da = derivative_text(e.args[1]), db = derivative_text(e.args[2]);
    if (da.empty() && db.empty())
      return "";
    return fmt::format("({} ? {} : {})", p(e.args[0]), zero_or(da), zero_or(db));
  }
  }
  return "";
}

} // namespace

Expected<Expr> score_derivative(const Expr &e, const ExprScope &scope) {
  const std::string d = derivative_text(e);
  return parse_expr(d.empty() ? "0.0" : d, scope, "the derivative of the score function");
}

bool uses_var(const Expr &e, std::string_view name) {
  if (e.kind == Expr::Kind::var && e.name == name)
    return true;
  return std::any_of(e.args.begin(), e.args.end(),
                     [&](const Expr &a) { return uses_var(a, name); });
}

Expr substitute_score(const Expr &e, const Expr &inner) {
  if (e.kind == Expr::Kind::var && e.name == "score")
    return inner;
  // Each node copied once (copying `e` whole at every level was quadratic in its depth).
  Expr out{e.kind, e.is_int, e.value, e.name, {}};
  out.args.reserve(e.args.size());
  for (const Expr &a : e.args)
    out.args.push_back(substitute_score(a, inner));
  if (out.kind == Expr::Kind::binary || out.kind == Expr::Kind::select ||
      out.kind == Expr::Kind::call || out.kind == Expr::Kind::unary) {
    // Types follow the operands (score is float, so only ever int -> float).
    const bool logical =
        out.kind == Expr::Kind::binary &&
        (out.name == "<" || out.name == "<=" || out.name == ">" || out.name == ">=" ||
         out.name == "==" || out.name == "!=" || out.name == "&&" || out.name == "||");
    if (!logical && !(out.kind == Expr::Kind::unary && out.name == "!")) {
      size_t first = out.kind == Expr::Kind::select ? 1 : 0;
      bool all_int = !(out.kind == Expr::Kind::call && is_float_function(out.name));
      for (size_t i = first; i < out.args.size(); ++i)
        all_int &= out.args[i].is_int;
      out.is_int = all_int;
    }
  }
  return out;
}

double evaluate(const Expr &e, const ExprContext &c) {
  auto arg = [&](int i) { return evaluate(e.args[size_t(i)], c); };
  auto real = [&](double x) { return e.is_int ? std::trunc(x) : round_f32(x, c.f32); };
  switch (e.kind) {
  case Expr::Kind::number:
    return e.value;
  case Expr::Kind::var:
    if (e.name == "score")
      return c.score;
    if (e.name == "b")
      return double(c.b);
    if (e.name == "h")
      return double(c.h);
    if (e.name == "q_idx")
      return double(c.q_idx);
    if (e.name == "kv_idx")
      return double(c.kv_idx);
    if (e.name == "seqlen_q")
      return double(c.seqlen_q);
    return double(c.seqlen_k);
  case Expr::Kind::scalar:
    return c.scalar(e.name);
  case Expr::Kind::load:
    return c.load(e.name, int64_t(arg(0)));
  case Expr::Kind::unary:
    return e.name == "!" ? double(arg(0) == 0) : -arg(0);
  case Expr::Kind::select:
    return arg(0) != 0 ? arg(1) : arg(2);
  case Expr::Kind::call: {
    if (e.name == "uniform")
      return philox_uniform(uint64_t(arg(0)), uint64_t(arg(1)), uint32_t(int64_t(arg(2))),
                            uint32_t(int64_t(arg(3))), uint32_t(int64_t(arg(4))),
                            uint32_t(int64_t(arg(5))));
    const double x = arg(0);
    if (e.name == "min")
      return std::min(x, arg(1));
    if (e.name == "max")
      return std::max(x, arg(1));
    if (e.name == "abs")
      return std::abs(x);
    if (e.name == "exp")
      return round_f32(std::exp(x), c.f32);
    if (e.name == "log")
      return round_f32(std::log(x), c.f32);
    return round_f32(std::tanh(x), c.f32);
  }
  case Expr::Kind::binary: {
    const std::string &op = e.name;
    if (op == "&&")
      return double(arg(0) != 0 && arg(1) != 0);
    if (op == "||")
      return double(arg(0) != 0 || arg(1) != 0);
    const double a = arg(0), b = arg(1);
    if (op == "+")
      return real(a + b);
    if (op == "-")
      return real(a - b);
    if (op == "*")
      return real(a * b);
    if (op == "/") {
      if (e.is_int) // C: truncation; a zero divisor gives 0 rather than a trap
        return b == 0 ? 0 : std::trunc(a / b);
      return round_f32(a / b, c.f32);
    }
    if (op == "%")
      return b == 0 ? 0 : double(int64_t(a) % int64_t(b));
    if (op == "<")
      return double(a < b);
    if (op == "<=")
      return double(a <= b);
    if (op == ">")
      return double(a > b);
    if (op == ">=")
      return double(a >= b);
    if (op == "==")
      return double(a == b);
    return double(a != b);
  }
  }
  return 0;
}

namespace {

/// One Philox-4x32 round on counter c with key k.
void philox_round(uint32_t c[4], const uint32_t k[2]) {
  const uint64_t p0 = uint64_t(0xD2511F53u) * c[0], p1 = uint64_t(0xCD9E8D57u) * c[2];
  const uint32_t hi0 = uint32_t(p0 >> 32), lo0 = uint32_t(p0), hi1 = uint32_t(p1 >> 32),
                 lo1 = uint32_t(p1);
  const uint32_t next[4] = {hi1 ^ c[1] ^ k[0], lo1, hi0 ^ c[3] ^ k[1], lo0};
  std::copy(next, next + 4, c);
}

} // namespace

std::array<uint32_t, 4> philox4x32(std::array<uint32_t, 4> c, std::array<uint32_t, 2> k,
                                   int rounds) {
  for (int r = 0; r < rounds; ++r) {
    if (r > 0) {
      k[0] += 0x9E3779B9u;
      k[1] += 0xBB67AE85u;
    }
    philox_round(c.data(), k.data());
  }
  return c;
}

std::array<uint32_t, 2> philox_key(uint64_t seed, uint64_t offset) {
  // Philox of (seed, offset) under a fixed key, so that every (seed, offset)
  // pair draws its own stream.
  const std::array<uint32_t, 4> key =
      philox4x32({uint32_t(seed), uint32_t(seed >> 32), uint32_t(offset), uint32_t(offset >> 32)},
                 {0x2545F491u, 0x9E3779B9u}, 10);
  return {key[0], key[1]};
}

double philox_uniform(uint64_t seed, uint64_t offset, uint32_t b, uint32_t h, uint32_t q_idx,
                      uint32_t kv_idx) {
  // One draw of the counter serves 8 aligned keys of the query: 16 bits each.
  const std::array<uint32_t, 4> words =
      philox4x32({kv_idx / kDrawKeys, q_idx, h, b}, philox_key(seed, offset), kDrawRounds);
  const uint32_t slot = kv_idx % kDrawKeys;
  return double((words[slot / 2] >> (16 * (slot % 2))) & 0xFFFFu) * 0x1p-16;
}

std::string emit_c(const Expr &e, const std::function<std::string(const std::string &)> &names) {
  auto arg = [&](int i) { return emit_c(e.args[size_t(i)], names); };
  switch (e.kind) {
  case Expr::Kind::number:
    if (std::isinf(e.value))
      return "FJ_INF";
    if (e.is_int)
      return fmt::format("{}", int64_t(e.value));
    return fmt::format("{:.9g}f", e.value).find_first_of(".e") == std::string::npos
               ? fmt::format("{:.9g}.0f", e.value)
               : fmt::format("{:.9g}f", e.value);
  case Expr::Kind::var:
    return "(" + names(e.name) + ")";
  case Expr::Kind::scalar:
    return e.name;
  case Expr::Kind::load:
    return fmt::format("{}[{}]", e.name, arg(0));
  case Expr::Kind::unary:
    return fmt::format("({}{})", e.name, arg(0));
  case Expr::Kind::select:
    // Both branches as the select's type: an array element is a struct that
    // converts to float, which `c ? element : 0` would turn into an int.
    if (!e.is_int)
      return fmt::format("({} ? float({}) : float({}))", arg(0), arg(1), arg(2));
    return fmt::format("({} ? {} : {})", arg(0), arg(1), arg(2));
  case Expr::Kind::call: {
    const std::string x = arg(0);
    if (e.name == "uniform")
      return fmt::format("fj_uniform((unsigned long long)({}), (unsigned long long)({}), "
                         "(unsigned)({}), (unsigned)({}), (unsigned)({}), (unsigned)({}))",
                         x, arg(1), arg(2), arg(3), arg(4), arg(5));
    if (e.name == "min" || e.name == "max") {
      const std::string y = arg(1);
      // Typed to the result, so an int and a float operand compare as floats.
      const std::string t = e.is_int ? "int" : "float";
      return fmt::format("fj_{}_{}({}({}), {}({}))", e.name, t, t, x, t, y);
    }
    if (e.name == "abs")
      return fmt::format("fj_abs_{}({})", e.is_int ? "int" : "float", x);
    return fmt::format("fj_{}(float({}))", e.name, x);
  }
  case Expr::Kind::binary: {
    const std::string &op = e.name;
    // Integer arithmetic that the evaluator defines for a zero divisor.
    if (e.is_int && (op == "/" || op == "%"))
      return fmt::format("fj_int_{}({}, {})", op == "/" ? "div" : "mod", arg(0), arg(1));
    return fmt::format("({} {} {})", arg(0), op, arg(1));
  }
  }
  return "0";
}

// ---- the block-range pass (ir/interval.h) ----------------------------------------

Interval interval_of(const Expr &e, const std::function<Interval(const std::string &)> &vars,
                     const std::function<double(const std::string &)> &scalar) {
  using namespace interval;
  if (!e.is_int) // f32 rounding: no exact bounds
    return fj_iv_unknown();
  auto arg = [&](int i) { return interval_of(e.args[size_t(i)], vars, scalar); };
  switch (e.kind) {
  case Expr::Kind::number:
    return fj_iv_exact(e.value);
  case Expr::Kind::var:
    return vars(e.name);
  case Expr::Kind::scalar:
    return fj_iv_exact(scalar(e.name));
  case Expr::Kind::load:
    return fj_iv_unknown();
  case Expr::Kind::unary:
    return e.name == "!" ? fj_iv_not(arg(0)) : fj_iv_neg(arg(0));
  case Expr::Kind::select:
    return fj_iv_select(arg(0), arg(1), arg(2));
  case Expr::Kind::call:
    if (e.name == "min")
      return fj_iv_min(arg(0), arg(1));
    if (e.name == "max")
      return fj_iv_max(arg(0), arg(1));
    if (e.name == "abs")
      return fj_iv_abs(arg(0));
    return fj_iv_unknown();
  case Expr::Kind::binary: {
    const std::string &op = e.name;
    const Interval a = arg(0), b = arg(1);
    if (op == "&&")
      return fj_iv_and(a, b);
    if (op == "||")
      return fj_iv_or(a, b);
    if (op == "+")
      return fj_iv_add(a, b);
    if (op == "-")
      return fj_iv_sub(a, b);
    if (op == "*")
      return fj_iv_mul(a, b);
    if (op == "/")
      return fj_iv_div(a, b);
    if (op == "%")
      return fj_iv_mod(a, b);
    if (op == "<")
      return fj_iv_lt(a, b);
    if (op == "<=")
      return fj_iv_le(a, b);
    if (op == ">")
      return fj_iv_gt(a, b);
    if (op == ">=")
      return fj_iv_ge(a, b);
    if (op == "==")
      return fj_iv_eq(a, b);
    return fj_iv_ne(a, b);
  }
  }
  return fj_iv_unknown();
}

std::string emit_c_interval(const Expr &e,
                            const std::function<std::string(const std::string &)> &vars) {
  if (!e.is_int)
    return "fj_iv_unknown()";
  auto arg = [&](int i) { return emit_c_interval(e.args[size_t(i)], vars); };
  switch (e.kind) {
  case Expr::Kind::number:
    return fmt::format("fj_iv_exact({}.0)", int64_t(e.value));
  case Expr::Kind::var:
    return vars(e.name);
  case Expr::Kind::scalar:
    return fmt::format("fj_iv_exact(double({}))", e.name);
  case Expr::Kind::load:
    return "fj_iv_unknown()";
  case Expr::Kind::unary:
    return fmt::format("fj_iv_{}({})", e.name == "!" ? "not" : "neg", arg(0));
  case Expr::Kind::select:
    return fmt::format("fj_iv_select({}, {}, {})", arg(0), arg(1), arg(2));
  case Expr::Kind::call:
    if (e.name == "min" || e.name == "max")
      return fmt::format("fj_iv_{}({}, {})", e.name, arg(0), arg(1));
    if (e.name == "abs")
      return fmt::format("fj_iv_abs({})", arg(0));
    return "fj_iv_unknown()";
  case Expr::Kind::binary: {
    static const std::pair<const char *, const char *> kNames[] = {
        {"&&", "and"}, {"||", "or"}, {"+", "add"}, {"-", "sub"}, {"*", "mul"},
        {"/", "div"},  {"%", "mod"}, {"<", "lt"},  {"<=", "le"}, {">", "gt"},
        {">=", "ge"},  {"==", "eq"}, {"!=", "ne"}};
    for (const auto &[op, name] : kNames)
      if (e.name == op)
        return fmt::format("fj_iv_{}({}, {})", name, arg(0), arg(1));
    return "fj_iv_unknown()";
  }
  }
  return "fj_iv_unknown()";
}

} // namespace flashjit::ir
