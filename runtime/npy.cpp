#include "runtime/npy.h"

#include <bit>
#include <cmath>
#include <cstring>
#include <fstream>
#include <sstream>

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

Status write(const std::string &path, const Array &a) {
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
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out)
    return Status::error("cannot open {} for writing: {}", path, std::strerror(errno));
  const uint16_t hlen = static_cast<uint16_t>(header.size());
  out.write("\x93NUMPY\x01\x00", 8);
  out.write(reinterpret_cast<const char *>(&hlen), 2);
  out << header;
  for (double v : a.values) {
    if (bytes == 2) {
      const uint16_t h = f32_to_f16_bits(float(v));
      out.write(reinterpret_cast<const char *>(&h), 2);
    } else if (bytes == 4) {
      const float f = float(v);
      out.write(reinterpret_cast<const char *>(&f), 4);
    } else {
      out.write(reinterpret_cast<const char *>(&v), 8);
    }
  }
  if (!out)
    return Status::error("writing {} failed: {}", path, std::strerror(errno));
  return Status::ok();
}

Expected<Array> read(const std::string &path) {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    return Status::error("cannot open {}: {}", path, std::strerror(errno));
  char magic[8];
  in.read(magic, 8);
  if (!in || std::memcmp(magic, "\x93NUMPY", 6) != 0)
    return Status::error("{} is not a .npy file (bad magic)", path);
  uint32_t hlen = 0;
  if (magic[6] == 1) {
    uint16_t h16;
    in.read(reinterpret_cast<char *>(&h16), 2);
    hlen = h16;
  } else {
    in.read(reinterpret_cast<char *>(&hlen), 4);
  }
  std::string header(hlen, '\0');
  in.read(header.data(), hlen);
  if (!in)
    return Status::error("{}: truncated .npy header", path);
  auto field = [&](const std::string &key) -> std::string {
    size_t k = header.find("'" + key + "'");
    if (k == std::string::npos)
      return {};
    size_t c = header.find(':', k);
    return c == std::string::npos ? std::string() : header.substr(c + 1);
  };
  Array a;
  std::string descr = field("descr");
  size_t q1 = descr.find('\''), q2 = descr.find('\'', q1 + 1);
  if (q1 == std::string::npos || q2 == std::string::npos)
    return Status::error("{}: .npy header has no descr", path);
  a.descr = descr.substr(q1 + 1, q2 - q1 - 1);
  if (!descr_bytes(a.descr))
    return Status::error("{}: dtype '{}' is not supported: use float16 ('<f2'), float32 ('<f4') "
                         "or float64 ('<f8'), little-endian",
                         path, a.descr);
  if (field("fortran_order").find("True") < field("fortran_order").find(','))
    return Status::error(
        "{}: Fortran-order arrays are not supported: save with np.ascontiguousarray", path);
  std::string shape = field("shape");
  size_t open = shape.find('('), close = shape.find(')');
  if (open == std::string::npos || close == std::string::npos)
    return Status::error("{}: .npy header has no shape", path);
  std::stringstream ss(shape.substr(open + 1, close - open - 1));
  std::string item;
  int64_t count = 1;
  while (std::getline(ss, item, ',')) {
    if (item.find_first_not_of(' ') == std::string::npos)
      continue;
    a.shape.push_back(std::stoll(item));
    count *= a.shape.back();
  }
  const int bytes = descr_bytes(a.descr);
  std::vector<char> raw(count * bytes);
  in.read(raw.data(), raw.size());
  if (in.gcount() != std::streamsize(raw.size()))
    return Status::error("{}: truncated: expected {} bytes of data, found {}", path, raw.size(),
                         in.gcount());
  a.values.resize(count);
  for (int64_t i = 0; i < count; ++i) {
    const char *p = raw.data() + i * bytes;
    if (bytes == 2) {
      uint16_t h;
      std::memcpy(&h, p, 2);
      a.values[i] = f16_bits_to_f32(h);
    } else if (bytes == 4) {
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
