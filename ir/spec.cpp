#include "ir/spec.h"

#include "ir/expr.h"

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

bool uses_score(const ir::Expr &e) {
  if (e.kind == ir::Expr::Kind::var && e.name == "score")
    return true;
  return std::any_of(e.args.begin(), e.args.end(), [](const ir::Expr &a) { return uses_score(a); });
}

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
  if (b == 0 || n == 0) // an empty tensor: its strides address nothing (NumPy's are all 0)
    return Status::ok();
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

namespace {
constexpr std::pair<MaskType, std::string_view> kMaskTypeNames[] = {{MaskType::none, "none"},
                                                                    {MaskType::boolean, "bool"},
                                                                    {MaskType::f32, "f32"},
                                                                    {MaskType::f16, "f16"},
                                                                    {MaskType::bf16, "bf16"}};
} // namespace

std::string_view mask_type_name(MaskType t) {
  for (const auto &[type, name] : kMaskTypeNames)
    if (type == t)
      return name;
  return "?";
}

Expected<MaskType> parse_mask_type(std::string_view name) {
  for (const auto &[type, known] : kMaskTypeNames)
    if (known == name)
      return type;
  return Status::error("unknown mask type '{}': expected bool (1 byte, nonzero attends) or f32, "
                       "f16, bf16 (added to the scaled score)",
                       name);
}

int mask_type_bytes(MaskType t) {
  switch (t) {
  case MaskType::none:
    return 0;
  case MaskType::boolean:
    return 1;
  case MaskType::f32:
    return 4;
  case MaskType::f16:
  case MaskType::bf16:
    return 2;
  }
  return 0;
}

Expected<MaskStrides> dense_mask_strides(std::string_view axes, int64_t batch, int64_t heads,
                                         int64_t seqlen_q, int64_t seqlen_k) {
  constexpr std::string_view order = "bhqk";
  size_t last = 0;
  for (size_t i = 0; i < axes.size(); ++i) {
    const size_t at = order.find(axes[i]);
    if (at == std::string_view::npos || (i > 0 && at <= last))
      return Status::error("mask axes '{}' must be letters of bhqk in that order, each at most "
                           "once (e.g. bhqk, qk, bk)",
                           axes);
    last = at;
  }
  const int64_t extents[] = {batch, heads, seqlen_q, seqlen_k};
  int64_t strides[4] = {0, 0, 0, 0}, size = 1;
  for (int i = 3; i >= 0; --i)
    if (axes.find(order[size_t(i)]) != std::string_view::npos) {
      strides[i] = size;
      size *= extents[i];
    }
  return MaskStrides{strides[0], strides[1], strides[2], strides[3]};
}

int64_t AttentionSpec::mask_elements() const {
  if (mask == MaskType::none || batch == 0 || seqlen_q == 0 || seqlen_k == 0)
    return 0;
  const MaskStrides &m = mask_strides;
  return (batch - 1) * m.batch + (heads - 1) * m.head + (seqlen_q - 1) * m.q +
         (seqlen_k - 1) * m.k + 1;
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
  // The rows of each buffer: packed and paged tensors have their own (q_rows).
  const int64_t nq = q_rows(), nk = kv_rows();
  switch (l) {
  case Layout::bshd:
    q = dense_bshd(heads, nq, head_dim_qk);
    k = dense_bshd(kv_heads, nk, head_dim_qk);
    v = dense_bshd(kv_heads, nk, head_dim_v);
    o = dense_bshd(heads, nq, head_dim_v);
    break;
  case Layout::bhsd:
    q = dense_bhsd(heads, nq, head_dim_qk);
    k = dense_bhsd(kv_heads, nk, head_dim_qk);
    v = dense_bhsd(kv_heads, nk, head_dim_v);
    o = dense_bhsd(heads, nq, head_dim_v);
    break;
  case Layout::interleaved: {
    // One token row of the fused projection: [Q heads | K heads | V heads].
    int64_t row =
        add(mul(heads, head_dim_qk), mul(kv_heads, head_dim_qk), mul(kv_heads, head_dim_v));
    q = {.batch = mul(nq, row), .head = head_dim_qk, .seq = row, .dim = 1};
    k = {.batch = mul(nk, row), .head = head_dim_qk, .seq = row, .dim = 1};
    v = {.batch = mul(nk, row), .head = head_dim_v, .seq = row, .dim = 1};
    o = dense_bshd(heads, nq, head_dim_v);
    break;
  }
  }
}

Status AttentionSpec::validate() const {
  const std::pair<std::string_view, int64_t> counts[] = {
      {"batch", batch},       {"heads", heads},       {"kv_heads", kv_heads},
      {"seqlen_q", seqlen_q}, {"seqlen_k", seqlen_k},
  };
  // batch and the sequence lengths may be 0 (an empty call, or keys that are
  // all absent: output 0 and LSE -inf); heads may not, a kernel's signature
  // has them.
  for (const auto &[field, value] : counts)
    if (value < (field.ends_with("heads") ? 1 : 0))
      return Status::error("{} ({}) must be at least {}", field, value,
                           field.ends_with("heads") ? 1 : 0);
  if (num_splits < 0 || num_splits > kMaxSplits)
    return Status::error("num_splits ({}) must be 0 (chosen per call), 1 (no split-KV) or up to {}",
                         num_splits, kMaxSplits);
  for (const auto &[field, value] : counts) {
    const bool seq = field.starts_with("seqlen");
    const int64_t limit = seq ? kMaxSeqlen : std::numeric_limits<int32_t>::max();
    if (value > limit)
      return Status::error("{} ({}) is past the {} the kernels index with 32-bit integers: {}",
                           field, value, limit,
                           seq ? "split the sequence" : "split the call into several");
  }
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
                         "is always f32); for f32 tensors in memory set f32_io, with dtype the "
                         "precision of the matrix products (bf16 or f16)",
                         dtype_name(dtype));

  if (!std::isfinite(scale) || scale < 0)
    return Status::error("scale ({}) must be a finite positive number, or 0 for the default "
                         "1/sqrt(head_dim_qk)",
                         scale);
  // The kernels scale in f32, by scale * log2(e).
  if (!std::isfinite(float(softmax_scale() * 1.4426950408889634)) || float(softmax_scale()) == 0.0f)
    return Status::error("scale ({}) is outside what f32 represents (the kernels scale scores in "
                         "f32): use a scale between 1e-30 and 1e30",
                         scale);

  if (window.left < -1)
    return Status::error("window left ({}) must be -1 (unbounded) or >= 0", window.left);
  if (window.right < -1)
    return Status::error("window right ({}) must be -1 (unbounded) or >= 0", window.right);
  // Causal with a right window is accepted as FlashAttention accepts it: causal
  // already hides every key right of the diagonal, so the right window changes
  // nothing (FlashAttention sets it to 0).

  FJ_RETURN_IF_ERROR(validate_sequences());
  FJ_RETURN_IF_ERROR(validate_modifiers());
  FJ_RETURN_IF_ERROR(validate_q_group());

  const std::pair<std::string_view, const Strides *> rows[] = {
      {"q", &q}, {"k", &k}, {"v", &v}, {"o", &o}};
  for (const auto &[tensor, s] : rows)
    if (s->seq > std::numeric_limits<int32_t>::max() ||
        s->dim > std::numeric_limits<int32_t>::max())
      return Status::error("{} seq stride ({}) and dim stride ({}) must be below 2^31: the kernels "
                           "hold row strides in 32 bits (offsets are 64-bit); use a layout with "
                           "shorter rows",
                           tensor, s->seq, s->dim);
  // Grouped rows: the positions by the seq stride (validate_q_group bounds the
  // members' offsets).
  const int64_t q_positions = q_rows() / q_group;
  FJ_RETURN_IF_ERROR(validate_strides("q", q, q_batches(), heads, q_positions, head_dim_qk));
  FJ_RETURN_IF_ERROR(validate_strides("k", k, kv_batches(), kv_heads, kv_rows(), head_dim_qk));
  FJ_RETURN_IF_ERROR(validate_strides("v", v, kv_batches(), kv_heads, kv_rows(), head_dim_v));
  FJ_RETURN_IF_ERROR(validate_strides("o", o, q_batches(), heads, q_positions, head_dim_v));
  return Status::ok();
}

Status AttentionSpec::validate_q_group() const {
  if (q_group == 1)
    return Status::ok();
  if (q_group < 1 || seqlen_q % q_group != 0)
    return Status::error("q_group ({}) must be 1, or divide seqlen_q ({}): grouped query rows "
                         "come q_group per query position",
                         q_group, seqlen_q);
  // (Attention sinks are split-KV's combine's, which finds a grouped row's head;
  // the tile programs refuse them with grouped rows: ir/build.cpp.)
  if (seqs.packed_q || alibi != Alibi::none || !score_mod.empty() || !mask_mod.empty() ||
      mask != MaskType::none || dropout_p > 0)
    return Status::error("q_group ({}) groups the query rows of several heads, but this spec also "
                         "has {}, which reads a row's head or position: set q_group 1",
                         q_group,
                         seqs.packed_q            ? "packed queries"
                         : alibi != Alibi::none   ? "ALiBi"
                         : !score_mod.empty()     ? "a score_mod"
                         : !mask_mod.empty()      ? "a mask_mod"
                         : mask != MaskType::none ? "a mask tensor"
                                                  : "dropout");
  for (const Strides *t : {&q, &o})
    if ((seqlen_q / q_group - 1) * t->seq + (q_group - 1) * t->group >
        std::numeric_limits<int32_t>::max())
      return Status::error("grouped query rows reach past 2^31 elements from their head's start "
                           "(seq stride {}, group stride {}): set q_group 1",
                           t->seq, t->group);
  return Status::ok();
}

Status AttentionSpec::validate_modifiers() const {
  if (num_splits > 1 && seqs.packed_q)
    return Status::error("num_splits ({}) asks for split-KV, which does not run with packed "
                         "queries (cu_seqlens_q): give num_splits 0 or 1",
                         num_splits);
  if (!std::isfinite(softcap) || softcap < 0 || (softcap > 0 && float(softcap) == 0.0f))
    return Status::error("softcap ({}) must be 0 (off) or a positive finite number (the scores "
                         "become softcap * tanh(score / softcap))",
                         softcap);
  const ir::ExprScope builtins; // the user's names: score, b, h, q_idx, ...
  if (!score_mod.empty())
    if (auto mod = ir::parse_expr(score_mod, builtins, "score_mod"); !mod)
      return mod.status();
  if (!mask_mod.empty()) {
    auto mask = ir::parse_expr(mask_mod, builtins, "mask_mod");
    if (!mask)
      return mask.status();
    if (uses_score(*mask))
      return Status::error("mask_mod \"{}\" reads score: a mask says which keys a query sees "
                           "from b, h, q_idx and kv_idx; put score expressions in score_mod",
                           mask_mod);
  }
  if (!(dropout_p >= 0 && dropout_p < 1))
    return Status::error("dropout_p ({}) must be in [0, 1): the probability of dropping each "
                         "attention weight (0: off)",
                         dropout_p);
  constexpr uint64_t kSeedLimit = uint64_t(1) << 53;
  if (dropout_seed >= kSeedLimit || dropout_offset >= kSeedLimit)
    return Status::error("dropout_seed ({}) and dropout_offset ({}) must be below 2^53 (the "
                         "kernels' scalars round-trip through doubles in the reference)",
                         dropout_seed, dropout_offset);
  if (mask == MaskType::none)
    return Status::ok();
  if (int(mask) < 0 || int(mask) > int(MaskType::bf16))
    return Status::error("mask type {} is unknown: expected none, bool, f32, f16 or bf16",
                         int(mask));
  if (seqs.any())
    return Status::error("a mask tensor with varlen batches, per-batch key counts or a paged KV "
                         "cache is not built (its rows would follow the packed layout): express "
                         "the mask as mask_mod, or pad the batch to dense tensors");
  const MaskStrides &m = mask_strides;
  const std::pair<std::string_view, int64_t> strides[] = {
      {"batch", m.batch}, {"head", m.head}, {"q", m.q}, {"k", m.k}};
  for (const auto &[axis, stride] : strides)
    if (stride < 0 || stride > (int64_t(1) << 40))
      return Status::error("mask_strides.{} ({}) must be in 0..2^40 elements (0 broadcasts the "
                           "axis; flip a reversed mask before passing it)",
                           axis, stride);
  if (mask_elements() > (int64_t(1) << 40))
    return Status::error("the mask tensor spans {} elements, past 2^40: broadcast it over heads "
                         "or batches with 0 strides",
                         mask_elements());
  return Status::ok();
}

Status AttentionSpec::validate_sequences() const {
  const Sequences &s = seqs;
  if (!s.packed_q && s.total_q != 0)
    return Status::error("total_q ({}) is set but Q is not packed: set packed_q (cu_seqlens_q) "
                         "or leave total_q 0",
                         s.total_q);
  if (!s.packed_k && s.total_k != 0)
    return Status::error("total_k ({}) is set but K/V are not packed: set packed_k "
                         "(cu_seqlens_k) or leave total_k 0",
                         s.total_k);
  const std::pair<std::string_view, int64_t> totals[] = {{"total_q", s.total_q},
                                                         {"total_k", s.total_k}};
  for (const auto &[field, value] : totals)
    if (value < 0 || value > kMaxSeqlen)
      return Status::error("{} ({}) must be in 0..{} (the rows of the packed tensors; the kernels "
                           "index rows with 32-bit integers)",
                           field, value, kMaxSeqlen);
  if (!s.paged()) {
    if (s.page_size < 0 || s.num_pages != 0 || s.pages_per_seq != 0)
      return Status::error("num_pages ({}) and pages_per_seq ({}) are set but page_size ({}) is "
                           "not positive: set page_size for a paged KV cache, or leave all three 0",
                           s.num_pages, s.pages_per_seq, s.page_size);
    return Status::ok();
  }
  if (s.packed_k)
    return Status::error("a paged KV cache with packed keys (cu_seqlens_k) is not supported: give "
                         "each batch's key count as seqused_k (cache_seqlens) instead");
  const std::pair<std::string_view, int64_t> pages[] = {
      {"page_size", s.page_size}, {"num_pages", s.num_pages}, {"pages_per_seq", s.pages_per_seq}};
  for (const auto &[field, value] : pages)
    if (value < 1 || value > kMaxSeqlen)
      return Status::error("{} ({}) of the paged KV cache must be in 1..{}", field, value,
                           kMaxSeqlen);
  if (s.page_size * s.pages_per_seq < seqlen_k)
    return Status::error("seqlen_k ({}) is past what a block table row holds: pages_per_seq ({}) "
                         "x page_size ({}) = {} keys; give seqlen_k as the most keys any batch "
                         "attends to, or a wider block table",
                         seqlen_k, s.pages_per_seq, s.page_size, s.pages_per_seq * s.page_size);
  return Status::ok();
}

std::optional<AttentionSpec> gqa_packed_decode(const AttentionSpec &s) {
  const int64_t group = s.heads / std::max<int64_t>(s.kv_heads, 1);
  const bool local = s.window.left >= 0 || s.window.right >= 0;
  const int64_t tokens = s.seqlen_q;
  if (tokens > kMaxPackedTokens || group <= 1 || s.alibi != Alibi::none || !s.score_mod.empty() ||
      !s.mask_mod.empty() || s.dropout_p > 0 || s.seqs.packed_q || s.q_group != 1)
    return std::nullopt;
  // One token with a mask tensor: the view of strides alone (the mask's rows
  // are its heads); a mask tensor with several tokens is not grouped. Attention
  // sinks are the combine's, which finds a row's head in grouped rows only.
  const bool by_strides = tokens == 1 && s.mask != MaskType::none;
  if (by_strides ? local || s.sinks : s.mask != MaskType::none)
    return std::nullopt;
  AttentionSpec p = s;
  p.heads = s.kv_heads;
  p.seqlen_q = tokens * group;
  if (by_strides) { // the head stride becomes a row stride, which is 32-bit
    constexpr int64_t kRowStrideLimit = std::numeric_limits<int32_t>::max();
    if (s.q.head > kRowStrideLimit || s.o.head > kRowStrideLimit)
      return std::nullopt;
    p.causal = false;
    for (Strides *t : {&p.q, &p.o}) {
      t->seq = t->head;
      t->head *= group;
    }
    p.mask_strides.q = s.mask_strides.head;
    p.mask_strides.head = s.mask_strides.head * group;
    return p;
  }
  p.q_group = group;
  for (Strides *t : {&p.q, &p.o}) {
    t->group = t->head;
    t->head *= group;
  }
  if (!p.validate_q_group()) // the rows' offsets must fit the kernels' 32-bit bound
    return std::nullopt;
  return p;
}

KernelSignature AttentionSpec::signature() const {
  KernelSignature s;
  s.dtype = dtype;
  s.head_dim_qk = head_dim_qk;
  s.head_dim_v = head_dim_v;
  s.causal = causal;
  s.local = window.left >= 0 || window.right >= 0;
  s.lse = lse;
  s.softcap = softcap > 0;
  s.alibi = alibi;
  s.score_mod = score_mod;
  s.mask_mod = mask_mod;
  s.mask = mask;
  s.sinks = sinks;
  s.dropout = dropout_p > 0;
  s.f32_io = f32_io;
  s.packed_q = seqs.packed_q;
  s.packed_k = seqs.packed_k;
  s.used_k = seqs.used_k;
  s.paged = seqs.paged();
  s.grouped_q = q_group > 1;
  const Strides *all[] = {&q, &k, &v, &o};
  const int64_t dims[] = {head_dim_qk, head_dim_qk, head_dim_v, head_dim_v};
  // Elements per aligned run that every row start and row length is a multiple of.
  auto aligned_to = [&](int64_t elems) {
    for (int i = 0; i < 4; ++i) {
      const Strides &t = *all[i];
      if (t.dim != 1 || t.batch % elems || t.head % elems || t.seq % elems || t.group % elems ||
          dims[i] % elems)
        return false;
    }
    return true;
  };
  const int bytes = f32_io ? 4 : dtype_bytes(dtype);
  s.row_align = aligned_to(16 / bytes) ? 16 : aligned_to(8 / bytes) ? 8 : bytes;
  for (int i = 0; i < 4; ++i)
    s.unit_dim[i] = all[i]->dim == 1;
  return s;
}

std::string KernelSignature::summary() const {
  std::string s =
      fmt::format("{} d={}/{}{}{}{} align{}", dtype_name(dtype), head_dim_qk, head_dim_v,
                  causal ? " causal" : "", local ? " local" : "", lse ? " lse" : "", row_align);
  if (f32_io)
    s += " f32io";
  if (softcap)
    s += " softcap";
  if (alibi != Alibi::none)
    s += alibi == Alibi::heads ? " alibi[h]" : " alibi[b,h]";
  if (!score_mod.empty())
    s += fmt::format(" score_mod=\"{}\"", score_mod);
  if (!mask_mod.empty())
    s += fmt::format(" mask_mod=\"{}\"", mask_mod);
  if (mask != MaskType::none)
    s += fmt::format(" mask={}", mask_type_name(mask));
  if (sinks)
    s += " sinks";
  if (dropout)
    s += " dropout";
  if (packed_q)
    s += " varlen-q";
  if (packed_k)
    s += " varlen-k";
  if (used_k)
    s += " seqused-k";
  if (paged)
    s += " paged";
  if (grouped_q)
    s += " grouped-q";
  const char *names[] = {"q", "k", "v", "o"};
  for (int i = 0; i < 4; ++i)
    if (!unit_dim[i])
      s += fmt::format(" {}-dim-strided", names[i]);
  return s;
}

Status AttentionSpec::matches(const KernelSignature &want) const {
  const KernelSignature have = signature();
  if (have == want)
    return Status::ok();
  auto differ = [&](std::string_view field, auto got, auto kernel) {
    return Status::error("this call's {} ({}) differs from the kernel's ({}): a kernel serves "
                         "one signature ({}); create another for this one",
                         field, got, kernel, want.summary());
  };
  if (have.dtype != want.dtype)
    return differ("dtype", dtype_name(have.dtype), dtype_name(want.dtype));
  if (have.f32_io != want.f32_io)
    return differ("f32_io (f32 tensors in memory)", have.f32_io, want.f32_io);
  if (have.head_dim_qk != want.head_dim_qk)
    return differ("head_dim_qk", have.head_dim_qk, want.head_dim_qk);
  if (have.head_dim_v != want.head_dim_v)
    return differ("head_dim_v", have.head_dim_v, want.head_dim_v);
  if (have.causal != want.causal)
    return differ("causal", have.causal, want.causal);
  if (have.local != want.local)
    return differ("sliding window (on/off)", have.local, want.local);
  if (have.lse != want.lse)
    return differ("lse", have.lse, want.lse);
  if (have.softcap != want.softcap)
    return differ("softcap (on/off)", have.softcap, want.softcap);
  if (have.alibi != want.alibi)
    return differ("alibi slopes (none, [heads], [batch, heads])", int(have.alibi), int(want.alibi));
  if (have.score_mod != want.score_mod)
    return differ("score_mod", have.score_mod, want.score_mod);
  if (have.mask_mod != want.mask_mod)
    return differ("mask_mod", have.mask_mod, want.mask_mod);
  if (have.mask != want.mask)
    return differ("mask tensor type", mask_type_name(have.mask), mask_type_name(want.mask));
  if (have.sinks != want.sinks)
    return differ("attention sinks", have.sinks, want.sinks);
  if (have.dropout != want.dropout)
    return differ("dropout (on/off)", have.dropout, want.dropout);
  if (have.packed_q != want.packed_q)
    return differ("packed Q (cu_seqlens_q)", have.packed_q, want.packed_q);
  if (have.packed_k != want.packed_k)
    return differ("packed K/V (cu_seqlens_k)", have.packed_k, want.packed_k);
  if (have.used_k != want.used_k)
    return differ("per-batch key counts (seqused_k)", have.used_k, want.used_k);
  if (have.paged != want.paged)
    return differ("paged KV cache", have.paged, want.paged);
  if (have.grouped_q != want.grouped_q)
    return differ("grouped query rows (q_group > 1)", have.grouped_q, want.grouped_q);
  const char *names[] = {"q", "k", "v", "o"};
  for (int i = 0; i < 4; ++i)
    if (have.unit_dim[i] != want.unit_dim[i])
      return differ(fmt::format("{} dim stride (1 or not)", names[i]),
                    have.unit_dim[i] ? "1" : "not 1", want.unit_dim[i] ? "1" : "not 1");
  // A kernel for narrower rows runs wider ones; the reverse would misalign.
  if (have.row_align < want.row_align)
    return differ("row alignment in bytes (of the strides and head dims)", have.row_align,
                  want.row_align);
  return Status::ok();
}

std::string AttentionSpec::summary() const {
  std::string s = fmt::format("b={} hq={} hkv={} sq={} sk={} d={}/{} {}", batch, heads, kv_heads,
                              seqlen_q, seqlen_k, head_dim_qk, head_dim_v, dtype_name(dtype));
  if (f32_io)
    s += " f32io";
  if (causal)
    s += " causal";
  if (window != Window{})
    s += fmt::format(" window=({},{})", window.left, window.right);
  if (scale != 0)
    s += fmt::format(" scale={}", scale);
  if (lse)
    s += " lse";
  if (num_splits)
    s += fmt::format(" splits={}", num_splits);
  if (softcap > 0)
    s += fmt::format(" softcap={}", softcap);
  if (alibi != Alibi::none)
    s += alibi == Alibi::heads ? " alibi[h]" : " alibi[b,h]";
  if (!score_mod.empty())
    s += fmt::format(" score_mod=\"{}\"", score_mod);
  if (!mask_mod.empty())
    s += fmt::format(" mask_mod=\"{}\"", mask_mod);
  if (mask != MaskType::none)
    s += fmt::format(" mask={}[{},{},{},{}]", mask_type_name(mask), mask_strides.batch,
                     mask_strides.head, mask_strides.q, mask_strides.k);
  if (sinks)
    s += " sinks";
  if (dropout_p > 0)
    s += fmt::format(" dropout={}(seed={} offset={})", dropout_p, dropout_seed, dropout_offset);
  if (seqs.packed_q)
    s += fmt::format(" varlen-q(total={})", seqs.total_q);
  if (seqs.packed_k)
    s += fmt::format(" varlen-k(total={})", seqs.total_k);
  if (seqs.used_k)
    s += " seqused-k";
  if (seqs.paged())
    s += fmt::format(" paged(page={} pages={} per-seq={})", seqs.page_size, seqs.num_pages,
                     seqs.pages_per_seq);
  if (q_group > 1)
    s += fmt::format(" q_group={}", q_group);
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
