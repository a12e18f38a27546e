#include "ir/reference.h"

#include "ir/expr.h"

#include <algorithm>
#include <array>
#include <cassert>
#include <cmath>
#include <cstring>
#include <limits>
#include <optional>
#include <random>
#include <utility>

namespace flashjit {

namespace {

constexpr float kPoison = std::numeric_limits<float>::quiet_NaN();
constexpr double kNegInf = -std::numeric_limits<double>::infinity();

int64_t offset(const Strides &s, int64_t b, int64_t h, int64_t n, int64_t d) {
  return b * s.batch + h * s.head + n * s.seq + d * s.dim;
}

/// Calls f(b, h, n, d) for every logical element in row-major [b, h, n, d] order.
template <typename F> void for_each_element(int64_t b, int64_t h, int64_t n, int64_t d, F &&f) {
  for (int64_t ib = 0; ib < b; ++ib)
    for (int64_t ih = 0; ih < h; ++ih)
      for (int64_t in = 0; in < n; ++in)
        for (int64_t id = 0; id < d; ++id)
          f(ib, ih, in, id);
}

/// A buffer of `elements` NaNs whose logical elements are then uniform in
/// [-1, 1), rounded to `dtype`. The uniform draw uses the top 24 bits of the
/// generator directly (std::uniform_real_distribution differs between standard
/// libraries), so the same seed gives the same tensor everywhere.
std::vector<float> random_tensor(const Strides &s, int64_t b, int64_t h, int64_t n, int64_t d,
                                 DType dtype, uint64_t seed) {
  std::vector<float> buf(static_cast<size_t>(AttentionSpec::extent(s, b, h, n, d)), kPoison);
  std::mt19937_64 rng(seed);
  bool any_nonzero = false;
  for_each_element(b, h, n, d, [&](int64_t ib, int64_t ih, int64_t in, int64_t id) {
    float unit = std::ldexp(static_cast<float>(rng() >> 40), -24); // [0, 1), exact in f32
    float x = round_to(dtype, 2.0f * unit - 1.0f);
    buf[offset(s, ib, ih, in, id)] = x;
    any_nonzero |= x != 0;
  });
  if (!any_nonzero && !buf.empty())
    buf[offset(s, 0, 0, 0, 0)] = 0.5f; // exact in every dtype
  return buf;
}

/// Keys visible to query row i of a batch with sq queries and sk keys, as the
/// half-open range [lo, hi).
struct KeyRange {
  int64_t lo, hi;
};

KeyRange visible_keys(const AttentionSpec &spec, int64_t i, int64_t sq, int64_t sk) {
  int64_t diagonal = i + (sk - sq); // bottom-right aligned in each batch
  int64_t lo = 0, hi = sk;
  if (spec.causal)
    hi = std::min(hi, diagonal + 1);
  if (spec.window.left >= 0)
    lo = std::max(lo, diagonal - spec.window.left);
  if (spec.window.right >= 0)
    hi = std::min(hi, diagonal + spec.window.right + 1);
  return {lo, std::max(lo, hi)};
}

/// Where batch b's rows are (Sequences): its query and key counts and, for
/// packed tensors, their first rows. The arrays were checked (check_sequences).
struct BatchRows {
  int64_t q_start = 0, q_len = 0, k_start = 0, k_len = 0;
};

BatchRows batch_rows(const AttentionSpec &spec, const HostTensors &in, int64_t b) {
  const Sequences &s = spec.seqs;
  BatchRows r{0, spec.seqlen_q, 0, spec.seqlen_k};
  if (s.packed_q) {
    r.q_start = in.cu_seqlens_q[b];
    r.q_len = in.cu_seqlens_q[b + 1] - r.q_start;
  }
  if (s.packed_k) {
    r.k_start = in.cu_seqlens_k[b];
    r.k_len = in.cu_seqlens_k[b + 1] - r.k_start;
  }
  if (s.used_k)
    r.k_len = in.seqused_k[b];
  return r;
}

/// Element offsets of query row i and key row j of batch b.
int64_t q_offset(const AttentionSpec &spec, const Strides &st, const BatchRows &r, int64_t b,
                 int64_t h, int64_t i, int64_t d) {
  return spec.seqs.packed_q ? offset(st, 0, h, r.q_start + i, d) : offset(st, b, h, i, d);
}

int64_t kv_offset(const AttentionSpec &spec, const HostTensors &in, const Strides &st,
                  const BatchRows &r, int64_t b, int64_t h, int64_t j, int64_t d) {
  const Sequences &s = spec.seqs;
  if (s.paged()) {
    const int64_t page = in.block_table[b * s.pages_per_seq + j / s.page_size];
    return offset(st, page, h, j % s.page_size, d);
  }
  return s.packed_k ? offset(st, 0, h, r.k_start + j, d) : offset(st, b, h, j, d);
}

/// The seed of one tensor's generator stream: Q, K, V, the slopes, the sinks and dO
/// each have their own, so the values of one do not depend on the size of another.
uint64_t stream_seed(uint64_t seed, uint64_t stream) {
  std::seed_seq seq{seed, stream};
  std::array<uint32_t, 2> words;
  seq.generate(words.begin(), words.end());
  return (uint64_t{words[0]} << 32) | words[1];
}

/// A scaled score after softcap and ALiBi (FlashAttention's order), and its
/// derivative with respect to the scaled score: the backward's chain rule
/// through the cap (ALiBi only adds a constant).
struct ModifiedScore {
  double value, derivative;
};

ModifiedScore softcap_and_alibi(const AttentionSpec &spec, const HostTensors &in, double s,
                                int64_t b, int64_t h, int64_t i, int64_t j, int64_t sq,
                                int64_t sk) {
  double derivative = 1;
  if (spec.softcap > 0) {
    const double t = std::tanh(s / spec.softcap);
    s = spec.softcap * t;
    derivative = 1 - t * t;
  }
  if (spec.alibi != Alibi::none) {
    const double slope =
        in.alibi_slopes[size_t(spec.alibi == Alibi::heads ? h : b * spec.heads + h)];
    s -= slope * double(std::abs(i + sk - sq - j));
  }
  return {s, derivative};
}

/// Dropout's weight of P[i, j] (AttentionSpec::dropout_p): 0 where dropped, else
/// 1 / (1 - p); 1 without dropout. The draw compares in f32, as the kernels do.
double dropout_weight(const AttentionSpec &spec, int64_t b, int64_t h, int64_t i, int64_t j) {
  if (spec.dropout_p <= 0)
    return 1;
  const double u = ir::philox_uniform(spec.dropout_seed, spec.dropout_offset, uint32_t(b),
                                      uint32_t(h), uint32_t(i), uint32_t(j));
  return u >= double(float(spec.dropout_p)) ? 1 / (1 - spec.dropout_p) : 0;
}

/// A scaled score with the mask tensor applied (AttentionSpec::mask): its
/// element added, or the key hidden (-inf) where a bool element is false. The
/// derivative is 1 (0 where hidden, which P's 0 covers).
double apply_mask(const AttentionSpec &spec, const HostTensors &in, double s, int64_t b, int64_t h,
                  int64_t i, int64_t j) {
  if (spec.mask == MaskType::none)
    return s;
  const MaskStrides &m = spec.mask_strides;
  const double x = in.attn_mask[size_t(b * m.batch + h * m.head + i * m.q + j * m.k)];
  if (spec.mask == MaskType::boolean)
    return x != 0 ? s : kNegInf;
  return s + x;
}

/// A buffer's element, or NaN past its end: an element missing from a
/// too-short buffer was never written.
double element_or_poison(const std::vector<float> &buf, int64_t i) {
  return i < static_cast<int64_t>(buf.size()) ? double(buf[i]) : double(kPoison);
}

/// Sums the errors of (result, reference) element pairs into ErrorStats.
class ErrorSums {
public:
  void add(double got, double want) {
    ref2_ += want * want;
    if (!std::isfinite(got)) {
      ++stats_.nonfinite;
      return;
    }
    const double diff = got - want;
    stats_.max_abs = std::max(stats_.max_abs, std::abs(diff));
    err2_ += diff * diff;
  }
  /// rel_l2 falls back to the absolute norm when the reference is all zero.
  ErrorStats stats() const {
    ErrorStats e = stats_;
    e.rel_l2 = ref2_ > 0 ? std::sqrt(err2_ / ref2_) : std::sqrt(err2_);
    return e;
  }

private:
  ErrorStats stats_;
  double err2_ = 0, ref2_ = 0;
};

} // namespace

Status check_sequences(const AttentionSpec &spec, const HostTensors &t) {
  const Sequences &s = spec.seqs;
  const int64_t B = spec.batch;
  auto check_starts = [&](const std::vector<int32_t> &cu, const char *name, int64_t total,
                          int64_t max_len, const char *max_name) -> Status {
    if (int64_t(cu.size()) != B + 1)
      return Status::error("{} has {} entries, expected batch + 1 = {}", name, cu.size(), B + 1);
    if (cu[0] != 0)
      return Status::error("{}[0] is {}, expected 0 (the cumulative starts begin at row 0)", name,
                           cu[0]);
    for (int64_t b = 0; b < B; ++b) {
      if (cu[b + 1] < cu[b])
        return Status::error("{} is not nondecreasing: entry {} ({}) is below entry {} ({}); it "
                             "holds cumulative sequence starts",
                             name, b + 1, cu[b + 1], b, cu[b]);
      if (cu[b + 1] - cu[b] > max_len)
        return Status::error("sequence {} has {} rows ({}[{}] - {}[{}]) but {} is {}: give the "
                             "longest sequence as {}",
                             b, cu[b + 1] - cu[b], name, b + 1, name, b, max_name, max_len,
                             max_name);
    }
    if (cu[B] > total)
      return Status::error("{}[{}] is {}, past the {} rows of the packed tensor", name, B, cu[B],
                           total);
    return Status::ok();
  };
  if (s.packed_q)
    FJ_RETURN_IF_ERROR(
        check_starts(t.cu_seqlens_q, "cu_seqlens_q", s.total_q, spec.seqlen_q, "max_seqlen_q"));
  if (s.packed_k && !s.used_k)
    FJ_RETURN_IF_ERROR(
        check_starts(t.cu_seqlens_k, "cu_seqlens_k", s.total_k, spec.seqlen_k, "max_seqlen_k"));
  if (s.packed_k && s.used_k) // the starts address rows; the used lengths count them
    FJ_RETURN_IF_ERROR(
        check_starts(t.cu_seqlens_k, "cu_seqlens_k", s.total_k, s.total_k, "total_k"));
  if (s.used_k) {
    if (int64_t(t.seqused_k.size()) != B)
      return Status::error("seqused_k has {} entries, expected batch = {}", t.seqused_k.size(), B);
    for (int64_t b = 0; b < B; ++b) {
      const int64_t room = s.packed_k ? t.cu_seqlens_k[b + 1] - t.cu_seqlens_k[b] : spec.seqlen_k;
      if (t.seqused_k[b] < 0 || t.seqused_k[b] > room)
        return Status::error("seqused_k[{}] is {}, outside 0..{} (the keys batch {} has{})", b,
                             t.seqused_k[b], room, b,
                             s.packed_k ? " in cu_seqlens_k" : ": max_seqlen_k, the capacity");
    }
  }
  if (s.paged()) {
    if (int64_t(t.block_table.size()) != B * s.pages_per_seq)
      return Status::error("block_table has {} entries, expected batch x pages_per_seq = {} x {}",
                           t.block_table.size(), B, s.pages_per_seq);
    for (int64_t b = 0; b < B; ++b) {
      const int64_t keys = s.used_k ? t.seqused_k[b] : spec.seqlen_k;
      for (int64_t j = 0; j < (keys + s.page_size - 1) / s.page_size; ++j) {
        const int32_t page = t.block_table[b * s.pages_per_seq + j];
        if (page < 0 || page >= s.num_pages)
          return Status::error("block_table[{}][{}] is {}, outside the {} pages of the KV cache", b,
                               j, page, s.num_pages);
      }
    }
  }
  return Status::ok();
}

std::vector<float> mask_values(MaskType type, const void *storage, int64_t elements) {
  std::vector<float> out(size_t(std::max<int64_t>(elements, 0)));
  const auto *bytes = static_cast<const uint8_t *>(storage);
  for (size_t i = 0; i < out.size(); ++i) {
    switch (type) {
    case MaskType::none:
      break;
    case MaskType::boolean:
      out[i] = bytes[i] != 0 ? 1.0f : 0.0f;
      break;
    case MaskType::f32:
      std::memcpy(&out[i], bytes + 4 * i, 4);
      break;
    case MaskType::f16:
    case MaskType::bf16: {
      uint16_t bits;
      std::memcpy(&bits, bytes + 2 * i, 2);
      out[i] = type == MaskType::f16 ? f16_bits_to_f32(bits) : bf16_bits_to_f32(bits);
      break;
    }
    }
  }
  return out;
}

void mask_storage(MaskType type, std::span<const float> values, void *storage) {
  auto *bytes = static_cast<uint8_t *>(storage);
  for (size_t i = 0; i < values.size(); ++i) {
    switch (type) {
    case MaskType::none:
      break;
    case MaskType::boolean:
      bytes[i] = values[i] != 0 ? 1 : 0;
      break;
    case MaskType::f32:
      std::memcpy(bytes + 4 * i, &values[i], 4);
      break;
    case MaskType::f16:
    case MaskType::bf16: {
      const uint16_t bits =
          type == MaskType::f16 ? f32_to_f16_bits(values[i]) : f32_to_bf16_bits(values[i]);
      std::memcpy(bytes + 2 * i, &bits, 2);
      break;
    }
    }
  }
}

HostTensors make_random_inputs(const AttentionSpec &spec, uint64_t seed) {
  const AttentionSpec &s = spec;
  HostTensors t;
  // Values of the type in memory: f32 ones (f32_io) are not representable in
  // the operand type, so the kernel's rounding of them is exercised.
  const DType io = s.io_dtype();
  t.q = random_tensor(s.q, s.q_batches(), s.heads, s.q_rows(), s.head_dim_qk, io,
                      stream_seed(seed, 0));
  t.k = random_tensor(s.k, s.kv_batches(), s.kv_heads, s.kv_rows(), s.head_dim_qk, io,
                      stream_seed(seed, 1));
  t.v = random_tensor(s.v, s.kv_batches(), s.kv_heads, s.kv_rows(), s.head_dim_v, io,
                      stream_seed(seed, 2));
  if (spec.alibi != Alibi::none) { // positive slopes, as ALiBi's geometric ones are
    std::mt19937_64 rng(stream_seed(seed, 3));
    t.alibi_slopes.resize(size_t(spec.alibi == Alibi::heads ? s.heads : s.batch * s.heads));
    for (float &x : t.alibi_slopes)
      x = 0.05f + std::ldexp(static_cast<float>(rng() >> 40), -24) * 0.95f;
  }
  if (spec.sinks) { // logits around the scores' range, so the sink matters
    std::mt19937_64 rng(stream_seed(seed, 4));
    t.sinks.resize(size_t(s.heads));
    for (float &x : t.sinks)
      x = -2.0f + std::ldexp(static_cast<float>(rng() >> 40), -24) * 5.0f;
  }
  if (spec.mask != MaskType::none) { // about 1 in 4 keys hidden, the rest weighted
    std::mt19937_64 rng(stream_seed(seed, 6));
    t.attn_mask.resize(size_t(spec.mask_elements()));
    const DType type = spec.mask == MaskType::f16    ? DType::f16
                       : spec.mask == MaskType::bf16 ? DType::bf16
                                                     : DType::f32;
    for (float &x : t.attn_mask) {
      const float u = std::ldexp(static_cast<float>(rng() >> 40), -24);
      if (spec.mask == MaskType::boolean)
        x = u >= 0.25f ? 1.0f : 0.0f;
      else
        x = u < 0.2f ? -std::numeric_limits<float>::infinity() : round_to(type, 3.0f * u - 2.0f);
    }
  }
  poison_outputs(spec, t);
  return t;
}

void poison_outputs(const AttentionSpec &spec, HostTensors &t) {
  t.o.assign(static_cast<size_t>(spec.o_elements()), kPoison);
  t.lse.assign(spec.lse ? static_cast<size_t>(spec.lse_elements()) : 0, kPoison);
}

void make_random_grad(const AttentionSpec &spec, HostTensors &t, uint64_t seed) {
  // dO is shaped as O; stream 5 follows make_random_inputs' Q, K, V, slopes and sinks.
  t.dout = random_tensor(spec.o, spec.q_batches(), spec.heads, spec.q_rows(), spec.head_dim_v,
                         spec.dtype, stream_seed(seed, 5));
  t.dq.assign(static_cast<size_t>(spec.q_elements()), kPoison);
  t.dk.assign(static_cast<size_t>(spec.k_elements()), kPoison);
  t.dv.assign(static_cast<size_t>(spec.v_elements()), kPoison);
}

ReferenceResult reference_attention(const AttentionSpec &spec, const HostTensors &in) {
  const int64_t B = spec.batch, H = spec.heads, Sq = spec.seqlen_q, Sk = spec.seqlen_k;
  const int64_t Dqk = spec.head_dim_qk, Dv = spec.head_dim_v;
  assert(static_cast<int64_t>(in.q.size()) >= spec.q_elements());
  assert(static_cast<int64_t>(in.k.size()) >= spec.k_elements());
  assert(static_cast<int64_t>(in.v.size()) >= spec.v_elements());
  const double scale = spec.softmax_scale();

  ReferenceResult r;
  r.out.assign(static_cast<size_t>(B * H * Sq * Dv), 0.0);
  r.lse.assign(static_cast<size_t>(B * H * Sq), kNegInf);

  // The score modifiers (AttentionSpec::softcap, alibi, score_mod, mask_mod), in
  // FlashAttention's order, in float64; -inf hides the key.
  const ir::ExprScope builtins;
  std::optional<ir::Expr> score_mod, mask_mod;
  if (!spec.score_mod.empty())
    score_mod = ir::parse_expr(spec.score_mod, builtins, "score_mod").value();
  if (!spec.mask_mod.empty())
    mask_mod = ir::parse_expr(spec.mask_mod, builtins, "mask_mod").value();
  auto modified = [&](double s, int64_t b, int64_t h, int64_t i, int64_t j, int64_t sq,
                      int64_t sk) {
    s = softcap_and_alibi(spec, in, s, b, h, i, j, sq, sk).value;
    ir::ExprContext c{s, b, h, i, j, sq, sk, {}, {}, false};
    if (score_mod)
      s = ir::evaluate(*score_mod, c);
    s = apply_mask(spec, in, s, b, h, i, j);
    if (mask_mod && ir::evaluate(*mask_mod, c) == 0)
      s = kNegInf;
    return s;
  };

  // Dense float64 copies of one head's K and V rows, reused by its query rows.
  std::vector<double> k(static_cast<size_t>(Sk * Dqk)), v(static_cast<size_t>(Sk * Dv));
  std::vector<double> q(static_cast<size_t>(Dqk)), scores(static_cast<size_t>(Sk));
  for (int64_t b = 0; b < B; ++b) {
    const BatchRows rows = batch_rows(spec, in, b);
    for (int64_t h = 0; h < H; ++h) {
      const int64_t kvh = h / spec.group();
      for (int64_t j = 0; j < rows.k_len; ++j) {
        for (int64_t d = 0; d < Dqk; ++d)
          k[j * Dqk + d] = in.k[kv_offset(spec, in, spec.k, rows, b, kvh, j, d)];
        for (int64_t d = 0; d < Dv; ++d)
          v[j * Dv + d] = in.v[kv_offset(spec, in, spec.v, rows, b, kvh, j, d)];
      }
      for (int64_t i = 0; i < rows.q_len; ++i) {
        const int64_t row = (b * H + h) * Sq + i;
        const KeyRange keys = visible_keys(spec, i, rows.q_len, rows.k_len);
        if (keys.lo == keys.hi && !spec.sinks)
          continue; // fully masked: output 0, LSE -inf
        for (int64_t d = 0; d < Dqk; ++d)
          q[d] = in.q[q_offset(spec, spec.q, rows, b, h, i, d)];
        double max = kNegInf;
        for (int64_t j = keys.lo; j < keys.hi; ++j) {
          double dot = 0;
          for (int64_t d = 0; d < Dqk; ++d)
            dot += q[d] * k[j * Dqk + d];
          scores[j] = modified(scale * dot, b, h, i, j, rows.q_len, rows.k_len);
          max = std::max(max, scores[j]);
        }
        // A sink joins the denominator with its logit and no value.
        const double sink = spec.sinks ? double(in.sinks[size_t(h)]) : kNegInf;
        max = std::max(max, sink);
        if (max == kNegInf)
          continue; // every key hidden by the modifiers: output 0, LSE -inf
        double sum = sink == kNegInf ? 0 : std::exp(sink - max);
        double *out = &r.out[row * Dv];
        for (int64_t j = keys.lo; j < keys.hi; ++j) {
          if (scores[j] == kNegInf)
            continue;
          double p = std::exp(scores[j] - max);
          sum += p;
          p *= dropout_weight(spec, b, h, i, j); // after the sum: the LSE is without it
          for (int64_t d = 0; d < Dv; ++d)
            out[d] += p * v[j * Dv + d];
        }
        for (int64_t d = 0; d < Dv; ++d)
          out[d] /= sum;
        r.lse[row] = max + std::log(sum);
      }
    }
  }
  return r;
}

Expected<ReferenceGrads> reference_attention_backward(const AttentionSpec &spec,
                                                      const HostTensors &in) {
  // What the backward kernels do not take has no float64 gradient here either,
  // so a test cannot check a kernel against semantics nobody wrote down.
  const std::pair<bool, const char *> unsupported[] = {
      {spec.seqs.used_k || spec.seqs.paged(), "KV-cache sequences (seqused_k, a paged KV cache)"},
      {!spec.score_mod.empty(), "score_mod"},
      {!spec.mask_mod.empty(), "mask_mod"},
  };
  for (const auto &[used, feature] : unsupported)
    if (used)
      return Status::error("{} has no backward yet: the float64 reference gradients cover dense "
                           "or strided layouts, varlen (packed rows), GQA/MQA, causal, windows, "
                           "ALiBi, softcap, dropout and attention sinks",
                           feature);

  const int64_t B = spec.batch, H = spec.heads, KVH = spec.kv_heads;
  const int64_t Sq = spec.seqlen_q, Sk = spec.seqlen_k;
  const int64_t Dqk = spec.head_dim_qk, Dv = spec.head_dim_v;
  assert(static_cast<int64_t>(in.q.size()) >= spec.q_elements());
  assert(static_cast<int64_t>(in.k.size()) >= spec.k_elements());
  assert(static_cast<int64_t>(in.v.size()) >= spec.v_elements());
  assert(static_cast<int64_t>(in.dout.size()) >= spec.o_elements());
  const double scale = spec.softmax_scale();

  ReferenceGrads g;
  g.dq.assign(static_cast<size_t>(B * H * Sq * Dqk), 0.0);
  g.dk.assign(static_cast<size_t>(B * KVH * Sk * Dqk), 0.0);
  g.dv.assign(static_cast<size_t>(B * KVH * Sk * Dv), 0.0);
  if (spec.sinks)
    g.dsinks.assign(static_cast<size_t>(H), 0.0);

  // Dense float64 copies of one head's K and V, and of one query row's Q and
  // dO; p and dscore hold the row's probabilities and d(modified)/d(scaled).
  std::vector<double> k(static_cast<size_t>(Sk * Dqk)), v(static_cast<size_t>(Sk * Dv));
  std::vector<double> q(static_cast<size_t>(Dqk)), dout(static_cast<size_t>(Dv));
  std::vector<double> p(static_cast<size_t>(Sk)), dscore(static_cast<size_t>(Sk)),
      z(static_cast<size_t>(Sk));
  for (int64_t b = 0; b < B; ++b) {
    // Varlen: batch b's own lengths and rows; the dense results keep row i of
    // batch b at [b, h, i] (rows past its length stay 0).
    const BatchRows rows = batch_rows(spec, in, b);
    const int64_t sq = rows.q_len, sk = rows.k_len;
    for (int64_t h = 0; h < H; ++h) {
      const int64_t kvh = h / spec.group();
      for (int64_t j = 0; j < sk; ++j) {
        for (int64_t d = 0; d < Dqk; ++d)
          k[j * Dqk + d] = in.k[kv_offset(spec, in, spec.k, rows, b, kvh, j, d)];
        for (int64_t d = 0; d < Dv; ++d)
          v[j * Dv + d] = in.v[kv_offset(spec, in, spec.v, rows, b, kvh, j, d)];
      }
      // A kv head's dK and dV sum over the query heads of its group.
      double *dk = &g.dk[((b * KVH + kvh) * Sk) * Dqk];
      double *dv = &g.dv[((b * KVH + kvh) * Sk) * Dv];
      for (int64_t i = 0; i < sq; ++i) {
        const KeyRange keys = visible_keys(spec, i, sq, sk);
        if (keys.lo == keys.hi)
          continue; // no key: O is the constant 0, so every gradient of the row is 0
        for (int64_t d = 0; d < Dqk; ++d)
          q[d] = in.q[q_offset(spec, spec.q, rows, b, h, i, d)];
        for (int64_t d = 0; d < Dv; ++d)
          dout[d] = in.dout[q_offset(spec, spec.o, rows, b, h, i, d)];

        // The forward again, as reference_attention computes it: P over the visible keys.
        double max = kNegInf;
        for (int64_t j = keys.lo; j < keys.hi; ++j) {
          double dot = 0;
          for (int64_t d = 0; d < Dqk; ++d)
            dot += q[d] * k[j * Dqk + d];
          const ModifiedScore s = softcap_and_alibi(spec, in, scale * dot, b, h, i, j, sq, sk);
          p[j] = apply_mask(spec, in, s.value, b, h, i, j);
          dscore[j] = s.derivative;
          max = std::max(max, p[j]);
        }
        if (max == kNegInf)
          continue; // every key hidden by the mask tensor: zero gradients
        // A sink joins the denominator with its logit and no value.
        const double sink = spec.sinks ? double(in.sinks[size_t(h)]) : kNegInf;
        max = std::max(max, sink);
        double sum = sink == kNegInf ? 0 : std::exp(sink - max);
        for (int64_t j = keys.lo; j < keys.hi; ++j)
          sum += p[j] = std::exp(p[j] - max);
        for (int64_t j = keys.lo; j < keys.hi; ++j)
          p[j] /= sum;
        // Dropout's weights Z: O = (P o Z) V.
        for (int64_t j = keys.lo; j < keys.hi; ++j)
          z[j] = dropout_weight(spec, b, h, i, j);
        // delta = rowsum(dO * O), with O recomputed in float64 (not the stored one).
        double delta = 0;
        for (int64_t d = 0; d < Dv; ++d) {
          double o = 0;
          for (int64_t j = keys.lo; j < keys.hi; ++j)
            o += p[j] * z[j] * v[j * Dv + d];
          delta += dout[d] * o;
        }

        // The sink's own gradient: its probability times (0 - delta), as any
        // logit of a softmax whose output does not use it.
        if (spec.sinks && sink != kNegInf)
          g.dsinks[size_t(h)] -= std::exp(sink - max) / sum * delta;
        // dS = P * (dO V^T - delta) through the modifiers; then the products.
        double *dq = &g.dq[((b * H + h) * Sq + i) * Dqk];
        for (int64_t j = keys.lo; j < keys.hi; ++j) {
          double dp = 0;
          for (int64_t d = 0; d < Dv; ++d)
            dp += dout[d] * v[j * Dv + d];
          const double ds = p[j] * (dp * z[j] - delta) * dscore[j];
          for (int64_t d = 0; d < Dqk; ++d) {
            dq[d] += scale * ds * k[j * Dqk + d];
            dk[j * Dqk + d] += scale * ds * q[d];
          }
          for (int64_t d = 0; d < Dv; ++d)
            dv[j * Dv + d] += p[j] * z[j] * dout[d];
        }
      }
    }
  }
  return g;
}

ErrorStats compare(const AttentionSpec &spec, const HostTensors &result,
                   const ReferenceResult &ref) {
  const int64_t B = spec.batch, H = spec.heads, Sq = spec.seqlen_q, Dv = spec.head_dim_v;
  // Only the rows each batch has (all of them unless Q is packed).
  std::vector<BatchRows> rows(static_cast<size_t>(B));
  for (int64_t b = 0; b < B; ++b)
    rows[b] = batch_rows(spec, result, b);
  ErrorSums sums;
  for_each_element(B, H, Sq, Dv, [&](int64_t b, int64_t h, int64_t i, int64_t d) {
    if (i < rows[b].q_len)
      sums.add(element_or_poison(result.o, q_offset(spec, spec.o, rows[b], b, h, i, d)),
               ref.out[((b * H + h) * Sq + i) * Dv + d]);
  });
  ErrorStats e = sums.stats();

  if (spec.lse) {
    for (int64_t row = 0; row < B * H * Sq; ++row) {
      const int64_t b = row / (H * Sq), h = row / Sq % H, i = row % Sq;
      if (i >= rows[b].q_len)
        continue;
      double want = ref.lse[row];
      // LSE is [batch, heads, seqlen_q], or [heads, total_q] when Q is packed.
      double got = element_or_poison(
          result.lse, spec.seqs.packed_q ? h * spec.seqs.total_q + rows[b].q_start + i : row);
      if (std::isinf(want) && want < 0) {
        e.nonfinite += got != want;
        continue;
      }
      if (!std::isfinite(got)) {
        ++e.nonfinite;
        continue;
      }
      e.max_abs = std::max(e.max_abs, std::abs(got - want));
    }
  }
  return e;
}

GradErrorStats compare_grads(const AttentionSpec &spec, const HostTensors &result,
                             const ReferenceGrads &ref) {
  // Only the rows each batch has (all of them unless packed: varlen).
  std::vector<BatchRows> batch(static_cast<size_t>(spec.batch));
  for (int64_t b = 0; b < spec.batch; ++b)
    batch[b] = batch_rows(spec, result, b);
  auto one = [&](const Strides &st, const std::vector<float> &got, const std::vector<double> &want,
                 int64_t heads, int64_t rows, int64_t dim, bool keys) {
    ErrorSums sums;
    for_each_element(spec.batch, heads, rows, dim, [&](int64_t b, int64_t h, int64_t n, int64_t d) {
      const BatchRows &r = batch[b];
      if (n >= (keys ? r.k_len : r.q_len))
        return;
      const int64_t at =
          keys ? kv_offset(spec, result, st, r, b, h, n, d) : q_offset(spec, st, r, b, h, n, d);
      sums.add(element_or_poison(got, at), want[size_t(((b * heads + h) * rows + n) * dim + d)]);
    });
    return sums.stats();
  };
  ErrorStats dsinks;
  if (spec.sinks) {
    ErrorSums sums;
    double largest = 1;
    for (int64_t h = 0; h < spec.heads; ++h) {
      sums.add(element_or_poison(result.dsinks, h), ref.dsinks[size_t(h)]);
      largest = std::max(largest, std::abs(ref.dsinks[size_t(h)]));
    }
    dsinks = sums.stats();
    dsinks.max_abs /= largest;
  }
  return {.dq = one(spec.q, result.dq, ref.dq, spec.heads, spec.seqlen_q, spec.head_dim_qk, false),
          .dk =
              one(spec.k, result.dk, ref.dk, spec.kv_heads, spec.seqlen_k, spec.head_dim_qk, true),
          .dv = one(spec.v, result.dv, ref.dv, spec.kv_heads, spec.seqlen_k, spec.head_dim_v, true),
          .dsinks = dsinks};
}

Tolerance tolerance_for(DType t) {
  // Inputs are uniform in [-1, 1), so every output is a convex combination of V
  // values and |out| <= 1. The kernels (and the interpreter) round P to the
  // input dtype before P*V while the row sum stays f32, so each p_j carries a
  // relative error up to half an ulp, and O itself is rounded to the dtype:
  //   bf16: 8 significant bits, half ulp 2^-9 ~ 2e-3 relative per element;
  //   f16: 11 significant bits, half ulp 2^-12 ~ 2.4e-4.
  // These errors are mostly independent, so the observed relative L2 error is a
  // few units of the half ulp; rel is set ~10x above it so that noise never
  // fails a test while a wrong mask, a wrong scale or a lost tile (errors of
  // order |out|) always does. abs also covers LSE (computed in f32, |LSE| ~
  // log(seqlen_k) + max score) and small outputs whose own rounding dominates.
  switch (t) {
  case DType::bf16:
    return {.abs = 3e-2, .rel = 2e-2};
  case DType::f16:
    return {.abs = 4e-3, .rel = 3e-3};
  case DType::f32:
    // Not a supported Q/K/V/O type; here for completeness: f32 accumulation
    // over thousands of keys, relative ~1e-6.
    return {.abs = 1e-5, .rel = 1e-5};
  }
  return {.abs = 0, .rel = 0};
}

} // namespace flashjit
