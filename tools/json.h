// A small JSON reader for the manifests of `flashjit warmup` and the test data
// (tests/data/*.json): objects, arrays, numbers, strings, bools, null. Not a
// general-purpose library: no \u escapes beyond ASCII, numbers are doubles
// that keep their text, so that a reader of integers can refuse 1e15 or 2.0.
// Numbers follow JSON's grammar strictly: no hex, NaN, Infinity, leading '+',
// leading zeros or bare '.5'.
// Nothing a file holds can crash it: nesting is bounded (kMaxDepth), and
// parse_file reads only regular files of bounded size.
#pragma once

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace flashjit::cli::json {

struct Value {
  enum class Kind { null, boolean, number, string, array, object };
  Kind kind = Kind::null;
  bool boolean = false;
  double number = 0;
  std::string text; // a number as written, e.g. "128", "-1", "0.5", "1e15"
  std::string string;
  std::vector<Value> items;      // array elements, or object values
  std::vector<std::string> keys; // object keys, parallel to items

  bool is_object() const { return kind == Kind::object; }
  bool is_array() const { return kind == Kind::array; }
  int as_int() const { return static_cast<int>(number); }
  /// The member named `key`, or nullptr (also when this is not an object).
  const Value *find(std::string_view key) const {
    for (size_t i = 0; i < keys.size(); ++i)
      if (keys[i] == key)
        return &items[i];
    return nullptr;
  }
};

/// Whether `s` is a number as JSON writes one: -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)?
inline bool is_json_number(std::string_view s) {
  size_t i = 0;
  auto digits = [&] {
    const size_t start = i;
    while (i < s.size() && s[i] >= '0' && s[i] <= '9')
      ++i;
    return i > start;
  };
  if (i < s.size() && s[i] == '-')
    ++i;
  if (i < s.size() && s[i] == '0')
    ++i;
  else if (!digits())
    return false;
  if (i < s.size() && s[i] == '.' && (++i, !digits()))
    return false;
  if (i < s.size() && (s[i] == 'e' || s[i] == 'E')) {
    ++i;
    if (i < s.size() && (s[i] == '+' || s[i] == '-'))
      ++i;
    if (!digits())
      return false;
  }
  return i == s.size();
}

/// An integer written as one (-?[0-9]+, no fraction or exponent) that fits
/// int64; nullopt for anything else ("1e15", "2.0", "99999999999999999999").
inline std::optional<int64_t> integer_text(std::string_view s) {
  const std::string_view digits = s.starts_with('-') ? s.substr(1) : s;
  if (digits.empty() || digits.find_first_not_of("0123456789") != std::string_view::npos)
    return std::nullopt;
  int64_t v = 0;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || end != s.data() + s.size())
    return std::nullopt;
  return v;
}

/// Arrays and objects nested deeper than this are refused (a manifest is two
/// levels deep); the recursive parser never comes near the stack's end.
constexpr int kMaxDepth = 64;
/// parse_file's default limit on the file's size.
constexpr int64_t kMaxFileBytes = 64 << 20;

class Parser {
public:
  explicit Parser(std::string_view text) : text_(text) {}

  /// Parses the whole text as one value; on failure returns nullopt and sets error().
  std::optional<Value> parse() {
    Value v;
    if (!value(v))
      return std::nullopt;
    skip_space();
    if (pos_ != text_.size())
      return fail("trailing characters");
    return v;
  }
  const std::string &error() const { return error_; }

private:
  std::nullopt_t fail(const std::string &what) {
    if (error_.empty())
      error_ = "JSON error at offset " + std::to_string(pos_) + ": " + what;
    return std::nullopt;
  }
  void skip_space() {
    while (pos_ < text_.size() && (text_[pos_] == ' ' || text_[pos_] == '\n' ||
                                   text_[pos_] == '\r' || text_[pos_] == '\t'))
      ++pos_;
  }
  bool eat(char c) {
    skip_space();
    if (pos_ < text_.size() && text_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }
  bool literal(std::string_view word) {
    if (text_.substr(pos_, word.size()) != word)
      return false;
    pos_ += word.size();
    return true;
  }
  bool string(std::string &out) {
    if (!eat('"'))
      return (fail("expected '\"'"), false);
    while (pos_ < text_.size() && text_[pos_] != '"') {
      char c = text_[pos_++];
      if (c == '\\') {
        if (pos_ >= text_.size())
          break;
        char e = text_[pos_++];
        switch (e) {
        case 'n':
          c = '\n';
          break;
        case 't':
          c = '\t';
          break;
        case 'r':
          c = '\r';
          break;
        case 'b':
          c = '\b';
          break;
        case 'f':
          c = '\f';
          break;
        case 'u': {
          // Exactly four hex digits: no sign, space or "0x" (strtoul took " +7f").
          unsigned code = 0;
          const char *digits = text_.data() + pos_;
          const bool four = pos_ + 4 <= text_.size() &&
                            std::from_chars(digits, digits + 4, code, 16).ptr == digits + 4;
          if (!four)
            return (fail("a \\u escape needs four hex digits, like \\u0041"), false);
          if (code > 0x7f)
            return (fail("non-ASCII \\u escape"), false);
          c = static_cast<char>(code);
          pos_ += 4;
          break;
        }
        case '"':
        case '\\':
        case '/':
          c = e;
          break;
        default:
          return (fail(std::string("unknown escape '\\") + e +
                       "' (JSON has \\\" \\\\ \\/ \\b \\f \\n \\r \\t \\uXXXX)"),
                  false);
        }
      }
      out += c;
    }
    if (pos_ >= text_.size())
      return (fail("unterminated string"), false);
    ++pos_;
    return true;
  }
  bool value(Value &v, int depth = 0) {
    skip_space();
    if (pos_ >= text_.size())
      return (fail("unexpected end"), false);
    char c = text_[pos_];
    if ((c == '{' || c == '[') && depth >= kMaxDepth)
      return (fail("arrays and objects nested more than " + std::to_string(kMaxDepth) +
                   " deep; flatten the document"),
              false);
    if (c == '{') {
      v.kind = Value::Kind::object;
      ++pos_;
      if (eat('}'))
        return true;
      do {
        std::string key;
        if (!string(key))
          return false;
        if (!eat(':'))
          return (fail("expected ':'"), false);
        v.keys.push_back(std::move(key));
        v.items.emplace_back();
        if (!value(v.items.back(), depth + 1))
          return false;
      } while (eat(','));
      return eat('}') || (fail("expected ',' or '}'"), false);
    }
    if (c == '[') {
      v.kind = Value::Kind::array;
      ++pos_;
      if (eat(']'))
        return true;
      do {
        v.items.emplace_back();
        if (!value(v.items.back(), depth + 1))
          return false;
      } while (eat(','));
      return eat(']') || (fail("expected ',' or ']'"), false);
    }
    if (c == '"') {
      v.kind = Value::Kind::string;
      return string(v.string);
    }
    if (literal("true") || literal("false")) {
      v.kind = Value::Kind::boolean;
      v.boolean = c == 't';
      return true;
    }
    if (literal("null"))
      return true;
    std::string number(text_.substr(pos_, text_.find_first_of(",]} \n\r\t", pos_) - pos_));
    if (!is_json_number(number))
      return (fail("bad value '" + number +
                   "' (numbers are written as in JSON: 128, -1, 0.5, "
                   "1e-3; no hex, NaN or Infinity)"),
              false);
    v.number = std::strtod(number.c_str(), nullptr);
    v.text = number;
    v.kind = Value::Kind::number;
    pos_ += number.size();
    return true;
  }

  std::string_view text_;
  size_t pos_ = 0;
  std::string error_;
};

/// Parses `text`; on failure returns nullopt and, if given, sets *error.
inline std::optional<Value> parse(std::string_view text, std::string *error = nullptr) {
  Parser p(text);
  std::optional<Value> v = p.parse();
  if (!v && error)
    *error = p.error();
  return v;
}

/// Reads and parses the JSON file at `path`; on failure returns nullopt and
/// sets *error to the problem and the fix. Only a regular file of at most
/// `max_bytes` is read: a FIFO or a device (`/dev/zero`) is refused before any
/// read could block or run away, as is a huge file.
inline std::optional<Value> parse_file(const std::string &path, std::string *error,
                                       int64_t max_bytes = kMaxFileBytes) {
  auto fail = [&](const std::string &what) {
    if (error)
      *error = path + ": " + what;
    return std::nullopt;
  };
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0)
    return fail(std::string("cannot read it: ") + std::strerror(errno));
  std::string text;
  struct stat st{};
  const bool regular = ::fstat(fd, &st) == 0 && S_ISREG(st.st_mode);
  if (regular && st.st_size <= max_bytes) {
    text.resize(size_t(st.st_size));
    size_t done = 0;
    while (done < text.size()) {
      ssize_t n = ::read(fd, text.data() + done, text.size() - done);
      if (n < 0 && errno == EINTR)
        continue;
      if (n <= 0)
        break;
      done += size_t(n);
    }
    text.resize(done);
  }
  ::close(fd);
  if (!regular)
    return fail("not a regular file (a FIFO, device or directory); give a JSON file");
  if (st.st_size > max_bytes)
    return fail(std::to_string(st.st_size) + " bytes, more than the " + std::to_string(max_bytes) +
                " a JSON file here may be; give a smaller file");
  std::optional<Value> v = parse(text, error);
  if (!v && error)
    *error = path + ": " + *error;
  return v;
}

} // namespace flashjit::cli::json
