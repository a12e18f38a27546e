#include "runtime/npy.h"

#include "compiler/safe_file.h"

#include <algorithm>
#include <bit>
#include <cctype>
#include <cmath>
#include <cstring>
#include <limits>
#include <new>

namespace flashjit::npy {

namespace {

int descr_bytes(const std::string &d) {
  return d == "<f2" ? 2 : d == "<f4" ? 4 : d == "<f8" ? 8 : 0;
}

// Visits every logical element (b, h, s, d) in the dense order of `layout`.
template <typename F>
void for_each_dense(Layout layout, int64_t B, int64_t H, int64_t S, int64_t D, F f) {
  int64_t i = 0;
  if (layout == Layout::bhsd) {
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t s = 0; s < S; ++s)
          for (int64_t d = 0; d < D; ++d)
            f(i++, b, h, s, d);
    return;
  }
  for (int64_t b = 0; b < B; ++b)
    for (int64_t s = 0; s < S; ++s)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t d = 0; d < D; ++d)
          f(i++, b, h, s, d);
}

int64_t at(const Strides &st, int64_t b, int64_t h, int64_t s, int64_t d) {
  return b * st.batch + h * st.head + s * st.seq + d * st.dim;
}

} // namespace

std::vector<int64_t> tensor_shape(Layout layout, int64_t b, int64_t h, int64_t s, int64_t d) {
  switch (layout) {
  case Layout::bshd:
    return {b, s, h, d};
  case Layout::bhsd:
    return {b, h, s, d};
  case Layout::interleaved:
    return {b, s, h * d};
  }
  return {};
}

Array gather(const std::vector<float> &buf, const Strides &st, Layout layout, DType t, int64_t B,
             int64_t H, int64_t S, int64_t D) {
  Array a{tensor_shape(layout, B, H, S, D), t == DType::f16 ? "<f2" : "<f4", {}};
  a.values.resize(B * H * S * D);
  for_each_dense(layout, B, H, S, D, [&](int64_t i, int64_t b, int64_t h, int64_t s, int64_t d) {
    a.values[i] = buf[at(st, b, h, s, d)];
  });
  return a;
}

Status scatter(const Array &a, std::vector<float> &buf, const Strides &st, Layout layout, DType t,
               int64_t B, int64_t H, int64_t S, int64_t D, const std::string &what) {
  if (a.shape != tensor_shape(layout, B, H, S, D)) {
    std::string got, want;
    for (int64_t x : a.shape)
      got += fmt::format("{},", x);
    for (int64_t x : tensor_shape(layout, B, H, S, D))
      want += fmt::format("{},", x);
    return Status::error("{} has shape ({}) but the spec ({} layout) needs ({})", what, got,
                         layout_name(layout), want);
  }
  Status bad = Status::ok();
  for_each_dense(layout, B, H, S, D, [&](int64_t i, int64_t b, int64_t h, int64_t s, int64_t d) {
    const float x = float(a.values[i]);
    if (bad.is_ok() && round_to(t, x) != x && !std::isnan(x))
      bad = Status::error("{} element {} = {} is not representable in {}: round the inputs to {} "
                          "first (the kernels read {} values)",
                          what, i, a.values[i], dtype_name(t), dtype_name(t), dtype_name(t));
    buf[at(st, b, h, s, d)] = x;
  });
  return bad;
}

Status write(const std::string &path, const Array &a, bool force) {
  const int bytes = descr_bytes(a.descr);
  if (!bytes)
    return Status::error("cannot write {}: unsupported .npy dtype '{}'", path, a.descr);
  std::string shape;
  for (int64_t x : a.shape)
    shape += fmt::format("{}, ", x);
  if (a.shape.size() > 1)
    shape.resize(shape.size() - 2);
  else if (a.shape.size() == 1)
    shape.resize(shape.size() - 1); // "(n,)"
  std::string header =
      fmt::format("{{'descr': '{}', 'fortran_order': False, 'shape': ({}), }}", a.descr, shape);
  const size_t total = 10 + header.size() + 1;
  header.append((64 - total % 64) % 64, ' ');
  header += '\n';
  const uint16_t hlen = static_cast<uint16_t>(header.size());

  std::string file("\x93NUMPY\x01\x00", 8);
  file.reserve(10 + header.size() + a.values.size() * size_t(bytes));
  file.append(reinterpret_cast<const char *>(&hlen), 2);
  file += header;
  for (double v : a.values) {
    if (bytes == 2) {
      const uint16_t h = f32_to_f16_bits(float(v));
      file.append(reinterpret_cast<const char *>(&h), 2);
    } else if (bytes == 4) {
      const float f = float(v);
      file.append(reinterpret_cast<const char *>(&f), 4);
    } else {
      file.append(reinterpret_cast<const char *>(&v), 8);
    }
  }
  return compiler::write_file_atomic(
      path, file, force ? compiler::Existing::replace : compiler::Existing::refuse);
}

namespace {

/// The dict at the start of a .npy file.
struct Header {
  std::string descr;
  bool fortran_order = false;
  std::vector<int64_t> shape;
};

/// Parses the header dict exactly as numpy.save writes it (a Python literal):
///   {'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }
/// The three keys, each once, in any order, then only spaces and newlines.
class HeaderParser {
public:
  explicit HeaderParser(std::string_view text) : text_(text) {}

  Expected<Header> parse() {
    Header h;
    bool seen_descr = false, seen_order = false, seen_shape = false;
    if (!eat('{'))
      return fail("expected '{' at its start");
    while (!eat('}')) {
      std::string key;
      if (!quoted(key))
        return fail("expected a quoted key ('descr', 'fortran_order' or 'shape') or '}'");
      if (!eat(':'))
        return fail(fmt::format("expected ':' after '{}'", key));
      if (key == "descr" && !seen_descr) {
        seen_descr = true;
        if (!quoted(h.descr))
          return fail("'descr' must be a quoted dtype such as '<f4'");
      } else if (key == "fortran_order" && !seen_order) {
        seen_order = true;
        if (word("True"))
          h.fortran_order = true;
        else if (!word("False"))
          return fail(fmt::format("'fortran_order' must be True or False, not '{}'", token()));
      } else if (key == "shape" && !seen_shape) {
        seen_shape = true;
        FJ_RETURN_IF_ERROR(shape(h.shape));
      } else {
        return fail(fmt::format("the key '{}' is {}", key,
                                key == "descr" || key == "fortran_order" || key == "shape"
                                    ? "repeated"
                                    : "not one of 'descr', 'fortran_order', 'shape'"));
      }
      if (!eat(',') && !peek('}'))
        return fail("expected ',' or '}' after a value");
    }
    skip_space();
    if (pos_ != text_.size())
      return fail("stray characters after the closing '}'");
    if (!seen_descr || !seen_order || !seen_shape)
      return fail(fmt::format("it lacks '{}'", !seen_descr   ? "descr"
                                               : !seen_order ? "fortran_order"
                                                             : "shape"));
    return h;
  }

private:
  Status fail(const std::string &what) const {
    return Status::error("{} (at byte {} of the header)", what, pos_);
  }
  void skip_space() {
    while (pos_ < text_.size() && (text_[pos_] == ' ' || text_[pos_] == '\n' ||
                                   text_[pos_] == '\t' || text_[pos_] == '\r'))
      ++pos_;
  }
  bool peek(char c) {
    skip_space();
    return pos_ < text_.size() && text_[pos_] == c;
  }
  bool eat(char c) {
    if (!peek(c))
      return false;
    ++pos_;
    return true;
  }
  bool word(std::string_view w) {
    skip_space();
    const std::string_view rest = text_.substr(pos_);
    if (!rest.starts_with(w) || (rest.size() > w.size() && std::isalnum(uint8_t(rest[w.size()]))))
      return false;
    pos_ += w.size();
    return true;
  }
  /// The text up to the next separator, for messages.
  std::string_view token() {
    skip_space();
    const size_t end = text_.find_first_of(",)} \n", pos_);
    return text_.substr(pos_, std::min<size_t>(end, text_.size()) - pos_).substr(0, 40);
  }
  bool quoted(std::string &out) {
    skip_space();
    if (pos_ >= text_.size() || (text_[pos_] != '\'' && text_[pos_] != '"'))
      return false;
    const size_t close = text_.find(text_[pos_], pos_ + 1);
    if (close == std::string_view::npos)
      return false;
    out.assign(text_.substr(pos_ + 1, close - pos_ - 1));
    pos_ = close + 1;
    return true;
  }
  /// A tuple of non-negative decimal integers: (), (5,), (2, 3) or (2, 3,).
  Status shape(std::vector<int64_t> &out) {
    const char *const expected = "'shape' must be a tuple of non-negative integers such as (2, 3) "
                                 "or (5,)";
    if (!eat('('))
      return fail(fmt::format("{}, not '{}'", expected, token()));
    bool comma = true; // after '(' or ',': a number or ')' may follow
    while (!eat(')')) {
      if (!comma)
        return fail(fmt::format("{}: expected ',' or ')'", expected));
      const std::string_view t = token();
      size_t digits = 0;
      while (digits < t.size() && t[digits] >= '0' && t[digits] <= '9')
        ++digits;
      if (digits == 0 || digits != t.size())
        return fail(fmt::format("{}, not '{}'", expected, t));
      if (digits > 18) // past int64, and past any file
        return fail(fmt::format("the shape dimension {} is too large for any file", t));
      out.push_back(std::stoll(std::string(t)));
      pos_ += t.size();
      comma = eat(',');
    }
    if (out.size() == 1 && !comma)
      return fail(fmt::format("({}) is a number, not a tuple: a 1-d shape is written ({},)", out[0],
                              out[0]));
    return Status::ok();
  }

  std::string_view text_;
  size_t pos_ = 0;
};

std::string shape_text(const std::vector<int64_t> &shape) {
  std::string s;
  for (int64_t x : shape)
    s += fmt::format("{}{}", s.empty() ? "" : ", ", x);
  return "(" + s + (shape.size() == 1 ? ",)" : ")");
}

} // namespace

Expected<Array> read(const std::string &path) {
  // The whole file, which bounds every allocation below by its size.
  compiler::FileRead file;
  try {
    file = compiler::read_regular_file(path, std::numeric_limits<int64_t>::max(),
                                       compiler::Links::follow);
  } catch (const std::bad_alloc &) {
    return Status::error("{} is too large to read into memory: use smaller tensors", path);
  }
  if (file.result == compiler::FileRead::Result::missing)
    return Status::error("cannot open {}: no such file; check the path", path);
  if (file.result == compiler::FileRead::Result::refused)
    return Status::error("cannot read {}: {}; give a .npy file saved by numpy.save", path,
                         file.why);
  return parse(file.bytes, path);
}

Expected<Array> parse(std::string_view bytes, const std::string &path) {
  const std::string fix = "save the array again with numpy.save";
  if (bytes.size() < 10 || bytes.substr(0, 6) != "\x93NUMPY")
    return Status::error("{} is not a .npy file (bad magic): {}", path, fix);
  const int major = uint8_t(bytes[6]), minor = uint8_t(bytes[7]);
  if ((major < 1 || major > 3) || minor != 0)
    return Status::error("{}: .npy format version {}.{} is not supported (1.0, 2.0, 3.0 are): {}",
                         path, major, minor, fix);
  size_t header_at = 10, hlen = uint8_t(bytes[8]) | size_t(uint8_t(bytes[9])) << 8;
  if (major >= 2) {
    if (bytes.size() < 12)
      return Status::error("{}: truncated .npy header: {}", path, fix);
    header_at = 12;
    hlen |= size_t(uint8_t(bytes[10])) << 16 | size_t(uint8_t(bytes[11])) << 24;
  }
  if (hlen > bytes.size() - header_at)
    return Status::error("{}: truncated .npy header: it claims {} bytes, the file holds {}: {}",
                         path, hlen, bytes.size() - header_at, fix);
  auto header = HeaderParser(bytes.substr(header_at, hlen)).parse();
  if (!header)
    return Status::error("{}: malformed .npy header: {}; {}", path, header.status().message(), fix);

  Array a;
  a.descr = header->descr;
  a.shape = header->shape;
  const int item = descr_bytes(a.descr);
  if (!item)
    return Status::error("{}: dtype '{}' is not supported: use float16 ('<f2'), float32 ('<f4') "
                         "or float64 ('<f8'), little-endian",
                         path, a.descr);
  if (header->fortran_order)
    return Status::error(
        "{}: Fortran-order arrays are not supported: save with np.ascontiguousarray", path);
  // The element count, checked against the data the file holds before any
  // allocation: a shape may claim anything.
  const uint64_t have = bytes.size() - header_at - hlen;
  uint64_t count = 1;
  bool overflow = false;
  for (int64_t x : a.shape)
    overflow |= __builtin_mul_overflow(count, uint64_t(x), &count);
  if (std::find(a.shape.begin(), a.shape.end(), 0) != a.shape.end())
    count = 0, overflow = false;
  uint64_t need = 0;
  overflow |= __builtin_mul_overflow(count, uint64_t(item), &need);
  if (overflow || need > have)
    return Status::error("{}: truncated: shape {} of '{}' needs {} bytes of data, the file holds "
                         "{}: {}",
                         path, shape_text(a.shape), a.descr,
                         overflow ? std::string("more than 2^64") : std::to_string(need), have,
                         fix);
  if (need < have)
    return Status::error("{}: {} stray bytes after the {} bytes of data of shape {}: {}", path,
                         have - need, need, shape_text(a.shape), fix);

  const char *data = bytes.data() + header_at + hlen;
  try {
    a.values.resize(count);
  } catch (const std::bad_alloc &) {
    return Status::error("{}: {} elements do not fit in memory as doubles: use smaller tensors",
                         path, count);
  }
  for (uint64_t i = 0; i < count; ++i) {
    const char *p = data + i * item;
    if (item == 2) {
      uint16_t h;
      std::memcpy(&h, p, 2);
      a.values[i] = f16_bits_to_f32(h);
    } else if (item == 4) {
      float f;
      std::memcpy(&f, p, 4);
      a.values[i] = f;
    } else {
      std::memcpy(&a.values[i], p, 8);
    }
  }
  return a;
}

} // namespace flashjit::npy
