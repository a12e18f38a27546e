#include "ir/spec.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <optional>

namespace flashjit {

namespace {

constexpr int64_t kMaxHeadDim = 512;

constexpr std::array<std::pair<Layout, std::string_view>, 3> kLayoutNames = {{
    {Layout::bshd, "bshd"},
    {Layout::bhsd, "bhsd"},
    {Layout::interleaved, "interleaved"},
}};

/// a * b + c without signed overflow; nullopt when the result does not fit in int64.
std::optional<int64_t> checked_mul_add(int64_t a, int64_t b, int64_t c) {
  int64_t product, sum;
  if (__builtin_mul_overflow(a, b, &product) || __builtin_add_overflow(product, c, &sum))
    return std::nullopt;
  return sum;
}

/// One logical dimension of a tensor as the overlap and extent checks see it.
struct Dim {
  std::string_view name;
  int64_t size, stride;
};

std::array<Dim, 4> dims_of(const Strides &s, int64_t b, int64_t h, int64_t n, int64_t d) {
  return {{{"batch", b, s.batch}, {"head", h, s.head}, {"seq", n, s.seq}, {"dim", d, s.dim}}};
}

/// Largest element offset of the tensor plus one, or nullopt on int64 overflow.
/// Sizes below 1 give 0 (an empty tensor needs no elements).
std::optional<int64_t> checked_extent(const std::array<Dim, 4> &dims) {
  int64_t last = 0;
  for (const Dim &dim : dims) {
    if (dim.size < 1)
      return 0;
    std::optional<int64_t> next = checked_mul_add(dim.size - 1, dim.stride, last);
    if (!next)
      return std::nullopt;
    last = *next;
  }
  int64_t count;
  if (__builtin_add_overflow(last, 1, &count))
    return std::nullopt;
  return count;
}

std::string format_strides(const Strides &s) {
  return fmt::format("(batch={}, head={}, seq={}, dim={})", s.batch, s.head, s.seq, s.dim);
}

/// Checks that the strides of one tensor are non-negative, that no two logical
/// elements share an address, and that every offset fits in int64.
Status validate_strides(std::string_view tensor, const Strides &s, int64_t b, int64_t h, int64_t n,
                        int64_t d) {
  std::array<Dim, 4> dims = dims_of(s, b, h, n, d);
  for (const Dim &dim : dims) {
    if (dim.stride < 0)
      return Status::error("{} {} stride ({}) is negative: strides are element counts >= 0; "
                           "use a positive stride and point the buffer at the first element",
                           tensor, dim.name, dim.stride);
  }
  if (s.dim == 0)
    return Status::error("{} dim stride is 0, so all elements of a head row would overlap: "
                         "set the dim stride to 1 (contiguous head dimension)",
                         tensor);
  for (const Dim &dim : dims) {
    if (dim.stride == 0 && dim.size > 1)
      return Status::error("{} {} stride is 0 but that dimension has {} entries, so they would "
                           "overlap: give the {} dimension a stride that skips past the others",
                           tensor, dim.name, dim.size, dim.name);
  }
  std::optional<int64_t> extent = checked_extent(dims);
  // The byte size of a host copy (4-byte floats) must fit as well.
  if (!extent || !checked_mul_add(*extent, 4, 0))
    return Status::error("{} with strides {} and sizes [b={}, h={}, s={}, d={}] has element "
                         "offsets or a byte size that overflow int64: reduce the sizes or strides",
                         tensor, format_strides(s), b, h, n, d);

  // Sorted by stride, each dimension must step past everything the smaller ones
  // cover; otherwise two logical elements land on the same address.
  std::array<Dim, 4> sorted = dims;
  auto end = std::remove_if(sorted.begin(), sorted.end(), [](const Dim &x) { return x.size <= 1; });
  std::stable_sort(sorted.begin(), end,
                   [](const Dim &x, const Dim &y) { return x.stride < y.stride; });
  int64_t covered = 1; // elements spanned by the smaller dimensions; <= extent, so no overflow
  std::string inner;   // their names
  for (auto it = sorted.begin(); it != end; ++it) {
    if (it->stride < covered)
      return Status::error("{} strides {} overlap: the {} stride ({}) is smaller than the {} "
                           "elements spanned by the {} dimension(s) inside it, so two logical "
                           "elements share an address; make each stride at least the span of "
                           "the dimensions inside it",
                           tensor, format_strides(s), it->name, it->stride, covered, inner);
    covered += (it->size - 1) * it->stride;
    inner += inner.empty() ? "" : "+";
    inner += it->name;
  }
  return Status::ok();
}

} // namespace

std::string_view layout_name(Layout l) {
  for (const auto &[layout, name] : kLayoutNames)
    if (layout == l)
      return name;
  return "?";
}

Expected<Layout> parse_layout(std::string_view name) {
  for (const auto &[layout, known] : kLayoutNames)
    if (known == name)
      return layout;
  std::string valid;
  for (const auto &[layout, known] : kLayoutNames)
    valid += fmt::format("{}{}", valid.empty() ? "" : ", ", known);
  return Status::error("unknown layout '{}': expected one of {}", name, valid);
}

double AttentionSpec::softmax_scale() const {
  return scale != 0 ? scale : 1.0 / std::sqrt(static_cast<double>(head_dim_qk));
}

int64_t AttentionSpec::extent(const Strides &s, int64_t b, int64_t h, int64_t n, int64_t d) {
  // validate() rejects specs whose extent overflows; -1 marks that case here.
  return checked_extent(dims_of(s, b, h, n, d)).value_or(-1);
}

void AttentionSpec::set_layout(Layout l) {
  layout = l;
  // Unsigned arithmetic: absurd sizes wrap instead of being undefined, and
  // validate() then rejects the resulting strides.
  auto mul = [](auto... xs) { return static_cast<int64_t>((static_cast<uint64_t>(xs) * ...)); };
  auto add = [](auto... xs) { return static_cast<int64_t>((static_cast<uint64_t>(xs) + ...)); };
  auto dense_bshd = [&](int64_t h, int64_t n, int64_t d) {
    return Strides{.batch = mul(n, h, d), .head = d, .seq = mul(h, d), .dim = 1};
  };
  auto dense_bhsd = [&](int64_t h, int64_t n, int64_t d) {
    return Strides{.batch = mul(h, n, d), .head = mul(n, d), .seq = d, .dim = 1};
  };
  switch (l) {
  case Layout::bshd:
    q = dense_bshd(heads, seqlen_q, head_dim_qk);
    k = dense_bshd(kv_heads, seqlen_k, head_dim_qk);
    v = dense_bshd(kv_heads, seqlen_k, head_dim_v);
    o = dense_bshd(heads, seqlen_q, head_dim_v);
    break;
  case Layout::bhsd:
    q = dense_bhsd(heads, seqlen_q, head_dim_qk);
    k = dense_bhsd(kv_heads, seqlen_k, head_dim_qk);
    v = dense_bhsd(kv_heads, seqlen_k, head_dim_v);
    o = dense_bhsd(heads, seqlen_q, head_dim_v);
    break;
  case Layout::interleaved: {
    // One token row of the fused projection: [Q heads | K heads | V heads].
    int64_t row =
        add(mul(heads, head_dim_qk), mul(kv_heads, head_dim_qk), mul(kv_heads, head_dim_v));
    q = {.batch = mul(seqlen_q, row), .head = head_dim_qk, .seq = row, .dim = 1};
    k = {.batch = mul(seqlen_k, row), .head = head_dim_qk, .seq = row, .dim = 1};
    v = {.batch = mul(seqlen_k, row), .head = head_dim_v, .seq = row, .dim = 1};
    o = dense_bshd(heads, seqlen_q, head_dim_v);
    break;
  }
  }
}

Status AttentionSpec::validate() const {
  const std::pair<std::string_view, int64_t> counts[] = {
      {"batch", batch},       {"heads", heads},       {"kv_heads", kv_heads},
      {"seqlen_q", seqlen_q}, {"seqlen_k", seqlen_k},
  };
  for (const auto &[field, value] : counts)
    if (value < 1)
      return Status::error("{} ({}) must be at least 1", field, value);
  if (heads % kv_heads != 0)
    return Status::error("heads ({}) must be a multiple of kv_heads ({}) for GQA/MQA: each group "
                         "of heads/kv_heads query heads shares one key/value head",
                         heads, kv_heads);
  int64_t lse_count;
  if (__builtin_mul_overflow(batch, heads, &lse_count) ||
      __builtin_mul_overflow(lse_count, seqlen_q, &lse_count))
    return Status::error("batch*heads*seqlen_q ({}*{}*{}) overflows int64 (the LSE element "
                         "count): reduce batch, heads or seqlen_q",
                         batch, heads, seqlen_q);

  const std::pair<std::string_view, int64_t> dims[] = {{"head_dim_qk", head_dim_qk},
                                                       {"head_dim_v", head_dim_v}};
  for (const auto &[field, value] : dims)
    if (value < 1 || value > kMaxHeadDim)
      return Status::error("{} ({}) must be in 1..{}", field, value, kMaxHeadDim);

  if (dtype != DType::bf16 && dtype != DType::f16)
    return Status::error("dtype {} is not supported for Q/K/V/O: use bf16 or f16 (accumulation "
                         "is always f32)",
                         dtype_name(dtype));

  if (!std::isfinite(scale) || scale < 0)
    return Status::error("scale ({}) must be a finite positive number, or 0 for the default "
                         "1/sqrt(head_dim_qk)",
                         scale);

  if (window.left < -1)
    return Status::error("window left ({}) must be -1 (unbounded) or >= 0", window.left);
  if (window.right < -1)
    return Status::error("window right ({}) must be -1 (unbounded) or >= 0", window.right);
  if (causal && window.right > 0)
    return Status::error("window right ({}) contradicts causal: causal already hides every key "
                         "right of the diagonal; use window right -1 or 0, or drop causal",
                         window.right);

  FJ_RETURN_IF_ERROR(validate_strides("q", q, batch, heads, seqlen_q, head_dim_qk));
  FJ_RETURN_IF_ERROR(validate_strides("k", k, batch, kv_heads, seqlen_k, head_dim_qk));
  FJ_RETURN_IF_ERROR(validate_strides("v", v, batch, kv_heads, seqlen_k, head_dim_v));
  FJ_RETURN_IF_ERROR(validate_strides("o", o, batch, heads, seqlen_q, head_dim_v));
  return Status::ok();
}

std::string AttentionSpec::summary() const {
  std::string s = fmt::format("b={} hq={} hkv={} sq={} sk={} d={}/{} {}", batch, heads, kv_heads,
                              seqlen_q, seqlen_k, head_dim_qk, head_dim_v, dtype_name(dtype));
  if (causal)
    s += " causal";
  if (window != Window{})
    s += fmt::format(" window=({},{})", window.left, window.right);
  if (scale != 0)
    s += fmt::format(" scale={}", scale);
  if (lse)
    s += " lse";
  s += ' ';
  s += layout_name(layout);
  // Strides that do not come from the named layout are part of what the spec says.
  AttentionSpec named = *this;
  named.set_layout(layout);
  if (named.q != q || named.k != k || named.v != v || named.o != o)
    s += fmt::format(" strides q={} k={} v={} o={}", format_strides(q), format_strides(k),
                     format_strides(v), format_strides(o));
  return s;
}

AttentionSpec make_spec(int64_t batch, int64_t heads, int64_t kv_heads, int64_t seqlen_q,
                        int64_t seqlen_k, int64_t head_dim_qk, int64_t head_dim_v, DType dtype,
                        Layout layout) {
  AttentionSpec spec;
  spec.batch = batch;
  spec.heads = heads;
  spec.kv_heads = kv_heads;
  spec.seqlen_q = seqlen_q;
  spec.seqlen_k = seqlen_k;
  spec.head_dim_qk = head_dim_qk;
  spec.head_dim_v = head_dim_v;
  spec.dtype = dtype;
  spec.set_layout(layout);
  return spec;
}

} // namespace flashjit
