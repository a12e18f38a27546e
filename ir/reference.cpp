#include "ir/reference.h"

#include <algorithm>
#include <array>
#include <cassert>
#include <cmath>
#include <limits>
#include <random>

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

/// Keys visible to query row i, as the half-open range [lo, hi).
struct KeyRange {
  int64_t lo, hi;
};

KeyRange visible_keys(const AttentionSpec &spec, int64_t i) {
  int64_t diagonal = i + spec.diagonal_offset();
  int64_t lo = 0, hi = spec.seqlen_k;
  if (spec.causal)
    hi = std::min(hi, diagonal + 1);
  if (spec.window.left >= 0)
    lo = std::max(lo, diagonal - spec.window.left);
  if (spec.window.right >= 0)
    hi = std::min(hi, diagonal + spec.window.right + 1);
  return {lo, std::max(lo, hi)};
}

} // namespace

HostTensors make_random_inputs(const AttentionSpec &spec, uint64_t seed) {
  // One stream per tensor, so the values of K do not depend on the size of Q.
  std::seed_seq q_seed{seed, uint64_t{0}}, k_seed{seed, uint64_t{1}}, v_seed{seed, uint64_t{2}};
  auto stream = [](std::seed_seq &seq) {
    std::array<uint32_t, 2> words;
    seq.generate(words.begin(), words.end());
    return (uint64_t{words[0]} << 32) | words[1];
  };
  const AttentionSpec &s = spec;
  HostTensors t;
  t.q = random_tensor(s.q, s.batch, s.heads, s.seqlen_q, s.head_dim_qk, s.dtype, stream(q_seed));
  t.k = random_tensor(s.k, s.batch, s.kv_heads, s.seqlen_k, s.head_dim_qk, s.dtype, stream(k_seed));
  t.v = random_tensor(s.v, s.batch, s.kv_heads, s.seqlen_k, s.head_dim_v, s.dtype, stream(v_seed));
  poison_outputs(spec, t);
  return t;
}

void poison_outputs(const AttentionSpec &spec, HostTensors &t) {
  t.o.assign(static_cast<size_t>(spec.o_elements()), kPoison);
  t.lse.assign(spec.lse ? static_cast<size_t>(spec.lse_elements()) : 0, kPoison);
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

  // Dense float64 copies of one head's K and V rows, reused by its query rows.
  std::vector<double> k(static_cast<size_t>(Sk * Dqk)), v(static_cast<size_t>(Sk * Dv));
  std::vector<double> q(static_cast<size_t>(Dqk)), scores(static_cast<size_t>(Sk));
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t h = 0; h < H; ++h) {
      const int64_t kvh = h / spec.group();
      for (int64_t j = 0; j < Sk; ++j) {
        for (int64_t d = 0; d < Dqk; ++d)
          k[j * Dqk + d] = in.k[offset(spec.k, b, kvh, j, d)];
        for (int64_t d = 0; d < Dv; ++d)
          v[j * Dv + d] = in.v[offset(spec.v, b, kvh, j, d)];
      }
      for (int64_t i = 0; i < Sq; ++i) {
        const int64_t row = (b * H + h) * Sq + i;
        const KeyRange keys = visible_keys(spec, i);
        if (keys.lo == keys.hi)
          continue; // fully masked: output 0, LSE -inf
        for (int64_t d = 0; d < Dqk; ++d)
          q[d] = in.q[offset(spec.q, b, h, i, d)];
        double max = kNegInf;
        for (int64_t j = keys.lo; j < keys.hi; ++j) {
          double dot = 0;
          for (int64_t d = 0; d < Dqk; ++d)
            dot += q[d] * k[j * Dqk + d];
          scores[j] = scale * dot;
          max = std::max(max, scores[j]);
        }
        double sum = 0;
        double *out = &r.out[row * Dv];
        for (int64_t j = keys.lo; j < keys.hi; ++j) {
          double p = std::exp(scores[j] - max);
          sum += p;
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

ErrorStats compare(const AttentionSpec &spec, const HostTensors &result,
                   const ReferenceResult &ref) {
  const int64_t B = spec.batch, H = spec.heads, Sq = spec.seqlen_q, Dv = spec.head_dim_v;
  ErrorStats e;
  double err2 = 0, ref2 = 0;
  // Elements missing from a too-short buffer count as non-finite: never written.
  auto at = [](const std::vector<float> &buf, int64_t i) {
    return i < static_cast<int64_t>(buf.size()) ? double(buf[i]) : double(kPoison);
  };
  for_each_element(B, H, Sq, Dv, [&](int64_t b, int64_t h, int64_t i, int64_t d) {
    double want = ref.out[((b * H + h) * Sq + i) * Dv + d];
    double got = at(result.o, offset(spec.o, b, h, i, d));
    ref2 += want * want;
    if (!std::isfinite(got)) {
      ++e.nonfinite;
      return;
    }
    double diff = got - want;
    e.max_abs = std::max(e.max_abs, std::abs(diff));
    err2 += diff * diff;
  });
  e.rel_l2 = ref2 > 0 ? std::sqrt(err2 / ref2) : std::sqrt(err2);

  if (spec.lse) {
    for (int64_t row = 0; row < B * H * Sq; ++row) {
      double want = ref.lse[row];
      double got = at(result.lse, row);
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
