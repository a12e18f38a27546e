// The float64 reference against hand-computed cases and an independent naive
// implementation; random inputs; compare().
#include "ir/reference.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

namespace flashjit {
namespace {

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

int64_t at(const Strides &s, int64_t b, int64_t h, int64_t n, int64_t d) {
  return b * s.batch + h * s.head + n * s.seq + d * s.dim;
}

double ref_out(const AttentionSpec &s, const ReferenceResult &r, int64_t b, int64_t h, int64_t i,
               int64_t d) {
  return r.out[((b * s.heads + h) * s.seqlen_q + i) * s.head_dim_v + d];
}

double ref_lse(const AttentionSpec &s, const ReferenceResult &r, int64_t b, int64_t h, int64_t i) {
  return r.lse[(b * s.heads + h) * s.seqlen_q + i];
}

/// Writes the reference into the result buffers through the spec's strides.
void store(const AttentionSpec &s, const ReferenceResult &r, HostTensors &t) {
  for (int64_t b = 0; b < s.batch; ++b)
    for (int64_t h = 0; h < s.heads; ++h)
      for (int64_t i = 0; i < s.seqlen_q; ++i) {
        for (int64_t d = 0; d < s.head_dim_v; ++d)
          t.o[at(s.o, b, h, i, d)] = static_cast<float>(ref_out(s, r, b, h, i, d));
        if (s.lse)
          t.lse[(b * s.heads + h) * s.seqlen_q + i] = static_cast<float>(ref_lse(s, r, b, h, i));
      }
}

/// The mask written out literally from its definition, one condition per line.
bool naive_visible(const AttentionSpec &s, int64_t i, int64_t j) {
  int64_t off = s.seqlen_k - s.seqlen_q;
  bool ok = 0 <= j && j < s.seqlen_k;
  if (s.causal)
    ok = ok && j <= i + off;
  if (s.window.left >= 0)
    ok = ok && j >= i + off - s.window.left;
  if (s.window.right >= 0)
    ok = ok && j <= i + off + s.window.right;
  return ok;
}

/// Softmax without max subtraction, in long double, over an explicit mask:
/// a different code path from the library's.
ReferenceResult naive_attention(const AttentionSpec &s, const HostTensors &in) {
  ReferenceResult r;
  r.out.assign(s.batch * s.heads * s.seqlen_q * s.head_dim_v, 0.0);
  r.lse.assign(s.batch * s.heads * s.seqlen_q, kNegInf);
  for (int64_t b = 0; b < s.batch; ++b)
    for (int64_t h = 0; h < s.heads; ++h)
      for (int64_t i = 0; i < s.seqlen_q; ++i) {
        const int64_t g = h / (s.heads / s.kv_heads);
        long double denom = 0;
        std::vector<long double> num(s.head_dim_v, 0);
        for (int64_t j = 0; j < s.seqlen_k; ++j) {
          if (!naive_visible(s, i, j))
            continue;
          long double dot = 0;
          for (int64_t d = 0; d < s.head_dim_qk; ++d)
            dot += (long double)in.q[at(s.q, b, h, i, d)] * in.k[at(s.k, b, g, j, d)];
          long double e = std::exp(dot * (long double)s.softmax_scale());
          denom += e;
          for (int64_t d = 0; d < s.head_dim_v; ++d)
            num[d] += e * in.v[at(s.v, b, g, j, d)];
        }
        const int64_t row = (b * s.heads + h) * s.seqlen_q + i;
        if (denom == 0)
          continue;
        for (int64_t d = 0; d < s.head_dim_v; ++d)
          r.out[row * s.head_dim_v + d] = static_cast<double>(num[d] / denom);
        r.lse[row] = static_cast<double>(std::log(denom));
      }
  return r;
}

/// Fails with the first differing element only, so a broken mask reads as one line.
::testing::AssertionResult near_results(const ReferenceResult &a, const ReferenceResult &b,
                                        double tol) {
  if (a.out.size() != b.out.size() || a.lse.size() != b.lse.size())
    return ::testing::AssertionFailure() << "sizes differ";
  for (size_t i = 0; i < a.out.size(); ++i)
    if (!(std::abs(a.out[i] - b.out[i]) <= tol))
      return ::testing::AssertionFailure()
             << "out element " << i << ": " << a.out[i] << " vs " << b.out[i];
  for (size_t i = 0; i < a.lse.size(); ++i) {
    bool same = std::isinf(b.lse[i]) ? a.lse[i] == b.lse[i] : std::abs(a.lse[i] - b.lse[i]) <= tol;
    if (!same)
      return ::testing::AssertionFailure()
             << "lse row " << i << ": " << a.lse[i] << " vs " << b.lse[i];
  }
  return ::testing::AssertionSuccess();
}

TEST(RandomInputs, RoundedNonZeroAndInRange) {
  for (DType t : {DType::bf16, DType::f16}) {
    AttentionSpec s = make_spec(2, 4, 2, 9, 13, 24, 16, t);
    HostTensors in = make_random_inputs(s, 7);
    ASSERT_EQ(in.q.size(), static_cast<size_t>(s.q_elements()));
    ASSERT_EQ(in.k.size(), static_cast<size_t>(s.k_elements()));
    ASSERT_EQ(in.v.size(), static_cast<size_t>(s.v_elements()));
    for (const std::vector<float> *buf : {&in.q, &in.k, &in.v}) {
      int nonzero = 0;
      for (float x : *buf) {
        ASSERT_TRUE(std::isfinite(x)); // dense layout: no gaps
        EXPECT_EQ(round_to(t, x), x);
        EXPECT_GE(x, -1.0f);
        EXPECT_LE(x, 1.0f); // 1 only through rounding up
        nonzero += x != 0;
      }
      EXPECT_GT(nonzero, static_cast<int>(buf->size()) / 2);
    }
  }
}

TEST(RandomInputs, OutputsPoisoned) {
  AttentionSpec s = make_spec(1, 2, 1, 5, 6, 8, 8, DType::bf16);
  s.lse = true;
  HostTensors in = make_random_inputs(s, 1);
  ASSERT_EQ(in.o.size(), static_cast<size_t>(s.o_elements()));
  ASSERT_EQ(in.lse.size(), static_cast<size_t>(s.lse_elements()));
  for (float x : in.o)
    EXPECT_TRUE(std::isnan(x));
  for (float x : in.lse)
    EXPECT_TRUE(std::isnan(x));
  s.lse = false;
  EXPECT_TRUE(make_random_inputs(s, 1).lse.empty());
}

TEST(RandomInputs, GapsHoldPoison) {
  // Interleaved Q skips the K and V columns of each token row.
  AttentionSpec s = make_spec(1, 2, 1, 3, 3, 4, 4, DType::bf16, Layout::interleaved);
  HostTensors in = make_random_inputs(s, 3);
  std::vector<bool> logical(in.q.size(), false);
  for (int64_t h = 0; h < 2; ++h)
    for (int64_t n = 0; n < 3; ++n)
      for (int64_t d = 0; d < 4; ++d)
        logical[at(s.q, 0, h, n, d)] = true;
  int gaps = 0;
  for (size_t i = 0; i < in.q.size(); ++i) {
    EXPECT_EQ(std::isnan(in.q[i]), !logical[i]) << "element " << i;
    gaps += !logical[i];
  }
  EXPECT_EQ(gaps, 2 * 8); // rows 0 and 1 each skip K (4) and V (4) columns
}

TEST(RandomInputs, DeterministicPerSeed) {
  AttentionSpec s = make_spec(1, 2, 2, 4, 4, 8, 8, DType::f16);
  HostTensors a = make_random_inputs(s, 42), b = make_random_inputs(s, 42);
  HostTensors c = make_random_inputs(s, 43);
  EXPECT_EQ(a.q, b.q);
  EXPECT_EQ(a.k, b.k);
  EXPECT_EQ(a.v, b.v);
  EXPECT_NE(a.q, c.q);
  EXPECT_NE(a.q, a.k); // distinct streams per tensor
}

TEST(RandomInputs, NeverAllZeroForTinyTensors) {
  for (uint64_t seed = 0; seed < 64; ++seed) {
    AttentionSpec s = make_spec(1, 1, 1, 1, 1, 1, 1, DType::bf16);
    HostTensors in = make_random_inputs(s, seed);
    EXPECT_NE(in.q[0], 0.0f);
    EXPECT_NE(in.k[0], 0.0f);
    EXPECT_NE(in.v[0], 0.0f);
  }
}

TEST(Reference, SingleKeyCopiesValueRow) {
  AttentionSpec s = make_spec(2, 3, 3, 5, 1, 8, 6, DType::bf16);
  HostTensors in = make_random_inputs(s, 11);
  ReferenceResult r = reference_attention(s, in);
  for (int64_t b = 0; b < 2; ++b)
    for (int64_t h = 0; h < 3; ++h)
      for (int64_t i = 0; i < 5; ++i) {
        double dot = 0;
        for (int64_t d = 0; d < 8; ++d)
          dot += double(in.q[at(s.q, b, h, i, d)]) * in.k[at(s.k, b, h, 0, d)];
        EXPECT_NEAR(ref_lse(s, r, b, h, i), dot / std::sqrt(8.0), 1e-12);
        for (int64_t d = 0; d < 6; ++d)
          EXPECT_EQ(ref_out(s, r, b, h, i, d), in.v[at(s.v, b, h, 0, d)]);
      }
}

TEST(Reference, UniformKeysAverageVisibleValues) {
  // All keys equal, so every visible key has the same score: out is the mean
  // of the visible V rows and lse = score + log(count).
  AttentionSpec s = make_spec(1, 1, 1, 6, 9, 4, 3, DType::bf16);
  s.causal = true;
  s.window.left = 2;
  s.scale = 0.5;
  s.lse = true;
  HostTensors in = make_random_inputs(s, 5);
  for (int64_t j = 0; j < 9; ++j)
    for (int64_t d = 0; d < 4; ++d)
      in.k[at(s.k, 0, 0, j, d)] = 0.25f * float(d + 1);
  ReferenceResult r = reference_attention(s, in);
  for (int64_t i = 0; i < 6; ++i) {
    // diagonal = i + 3; visible keys are [i + 1, i + 3].
    double qk = 0;
    for (int64_t d = 0; d < 4; ++d)
      qk += double(in.q[at(s.q, 0, 0, i, d)]) * 0.25 * double(d + 1);
    EXPECT_NEAR(ref_lse(s, r, 0, 0, i), 0.5 * qk + std::log(3.0), 1e-12) << "row " << i;
    for (int64_t d = 0; d < 3; ++d) {
      double mean = 0;
      for (int64_t j = i + 1; j <= i + 3; ++j)
        mean += in.v[at(s.v, 0, 0, j, d)];
      EXPECT_NEAR(ref_out(s, r, 0, 0, i, d), mean / 3, 1e-12) << "row " << i << " dim " << d;
    }
  }
}

TEST(Reference, CausalBottomRightMasksFirstRowsWhenQueriesOutnumberKeys) {
  AttentionSpec s = make_spec(1, 2, 1, 7, 3, 8, 8, DType::f16);
  s.causal = true;
  s.lse = true;
  HostTensors in = make_random_inputs(s, 9);
  ReferenceResult r = reference_attention(s, in);
  for (int64_t h = 0; h < 2; ++h)
    for (int64_t i = 0; i < 7; ++i) {
      if (i < 7 - 3) {
        EXPECT_EQ(ref_lse(s, r, 0, h, i), kNegInf) << "row " << i;
        for (int64_t d = 0; d < 8; ++d)
          EXPECT_EQ(ref_out(s, r, 0, h, i, d), 0.0);
      } else {
        EXPECT_TRUE(std::isfinite(ref_lse(s, r, 0, h, i))) << "row " << i;
      }
    }
  // Row 4 sees key 0 only: it copies V row 0.
  for (int64_t d = 0; d < 8; ++d)
    EXPECT_EQ(ref_out(s, r, 0, 0, 4, d), in.v[at(s.v, 0, 0, 0, d)]);
}

TEST(Reference, DiagonalWindowPicksOneKey) {
  // Window (0, 0) without causal: query i sees only key i + (sk - sq).
  AttentionSpec s = make_spec(1, 1, 1, 4, 2, 4, 4, DType::bf16);
  s.window = {.left = 0, .right = 0};
  s.lse = true;
  HostTensors in = make_random_inputs(s, 2);
  ReferenceResult r = reference_attention(s, in);
  EXPECT_EQ(ref_lse(s, r, 0, 0, 0), kNegInf);
  EXPECT_EQ(ref_lse(s, r, 0, 0, 1), kNegInf);
  for (int64_t i = 2; i < 4; ++i)
    for (int64_t d = 0; d < 4; ++d)
      EXPECT_EQ(ref_out(s, r, 0, 0, i, d), in.v[at(s.v, 0, 0, i - 2, d)]);
}

TEST(Reference, GqaMapsQueryHeadsToTheirKvHead) {
  AttentionSpec s = make_spec(2, 6, 3, 4, 5, 8, 4, DType::bf16);
  HostTensors in = make_random_inputs(s, 4);
  // V of kv head g is the constant 0.25 * (g + 1) (batch 1 negated).
  for (int64_t b = 0; b < 2; ++b)
    for (int64_t g = 0; g < 3; ++g)
      for (int64_t j = 0; j < 5; ++j)
        for (int64_t d = 0; d < 4; ++d)
          in.v[at(s.v, b, g, j, d)] = (b ? -0.25f : 0.25f) * float(g + 1);
  ReferenceResult r = reference_attention(s, in);
  for (int64_t b = 0; b < 2; ++b)
    for (int64_t h = 0; h < 6; ++h)
      for (int64_t i = 0; i < 4; ++i)
        for (int64_t d = 0; d < 4; ++d)
          EXPECT_NEAR(ref_out(s, r, b, h, i, d), (b ? -0.25 : 0.25) * double(h / 2 + 1), 1e-15)
              << "b " << b << " head " << h;
}

TEST(Reference, MatchesNaiveImplementation) {
  struct Case {
    int64_t b, hq, hkv, sq, sk, dqk, dv;
    bool causal;
    Window window;
    double scale;
  };
  const Case cases[] = {
      {1, 1, 1, 1, 1, 1, 1, false, {}, 0},
      {2, 4, 2, 7, 11, 16, 8, false, {}, 0},
      {1, 3, 1, 9, 9, 12, 12, true, {}, 0},
      {2, 2, 2, 11, 5, 8, 16, true, {}, 0.7},
      {1, 4, 4, 5, 13, 8, 8, true, {.left = 3, .right = 0}, 0},
      {1, 2, 1, 13, 8, 4, 4, false, {.left = 2, .right = 1}, 2.0},
      {1, 2, 2, 6, 6, 4, 4, false, {.left = -1, .right = 0}, 0},
      {1, 1, 1, 6, 10, 4, 4, false, {.left = 0, .right = -1}, 0},
  };
  for (const Case &c : cases) {
    for (Layout l : {Layout::bshd, Layout::bhsd, Layout::interleaved}) {
      AttentionSpec s = make_spec(c.b, c.hq, c.hkv, c.sq, c.sk, c.dqk, c.dv, DType::bf16, l);
      s.causal = c.causal;
      s.window = c.window;
      s.scale = c.scale;
      s.lse = true;
      ASSERT_TRUE(s.validate().is_ok()) << s.validate().message();
      SCOPED_TRACE(s.summary());
      HostTensors in = make_random_inputs(s, 100 + c.sq);
      EXPECT_TRUE(near_results(reference_attention(s, in), naive_attention(s, in), 1e-12));
    }
  }
}

TEST(Reference, LayoutDoesNotChangeTheResult) {
  // The same logical values in BSHD and interleaved buffers give identical output.
  AttentionSpec a = make_spec(2, 4, 2, 6, 7, 8, 4, DType::f16, Layout::bshd);
  AttentionSpec b = make_spec(2, 4, 2, 6, 7, 8, 4, DType::f16, Layout::interleaved);
  a.causal = b.causal = true;
  HostTensors ta = make_random_inputs(a, 8);
  HostTensors tb = make_random_inputs(b, 99);
  auto copy = [](const Strides &from, const std::vector<float> &src, const Strides &to,
                 std::vector<float> &dst, int64_t B, int64_t H, int64_t N, int64_t D) {
    for (int64_t ib = 0; ib < B; ++ib)
      for (int64_t ih = 0; ih < H; ++ih)
        for (int64_t in = 0; in < N; ++in)
          for (int64_t id = 0; id < D; ++id)
            dst[at(to, ib, ih, in, id)] = src[at(from, ib, ih, in, id)];
  };
  copy(a.q, ta.q, b.q, tb.q, 2, 4, 6, 8);
  copy(a.k, ta.k, b.k, tb.k, 2, 2, 7, 8);
  copy(a.v, ta.v, b.v, tb.v, 2, 2, 7, 4);
  ReferenceResult ra = reference_attention(a, ta), rb = reference_attention(b, tb);
  EXPECT_EQ(ra.out, rb.out);
  EXPECT_EQ(ra.lse, rb.lse);
}

TEST(Compare, ExactResultHasNoError) {
  AttentionSpec s = make_spec(1, 2, 1, 5, 3, 8, 8, DType::bf16, Layout::bhsd);
  s.causal = true; // rows 0 and 1 fully masked
  s.lse = true;
  HostTensors t = make_random_inputs(s, 6);
  ReferenceResult r = reference_attention(s, t);
  store(s, r, t);
  ErrorStats e = compare(s, t, r);
  EXPECT_EQ(e.nonfinite, 0);
  EXPECT_LT(e.max_abs, 1e-6); // f32 storage of the reference
  EXPECT_LT(e.rel_l2, 1e-6);
  EXPECT_TRUE(e.within(1e-6, 1e-6));
}

TEST(Compare, DetectsPoisonLeftInOutput) {
  AttentionSpec s = make_spec(1, 2, 2, 4, 4, 8, 8, DType::bf16);
  HostTensors t = make_random_inputs(s, 6);
  ReferenceResult r = reference_attention(s, t);
  EXPECT_EQ(compare(s, t, r).nonfinite, s.o_elements()); // never written at all
  store(s, r, t);
  t.o[at(s.o, 0, 1, 3, 7)] = std::numeric_limits<float>::quiet_NaN();
  ErrorStats e = compare(s, t, r);
  EXPECT_EQ(e.nonfinite, 1);
  EXPECT_FALSE(e.within(1, 1));
  t.o[at(s.o, 0, 1, 3, 7)] = std::numeric_limits<float>::infinity();
  EXPECT_EQ(compare(s, t, r).nonfinite, 1);
}

TEST(Compare, MeasuresAbsoluteAndRelativeError) {
  AttentionSpec s = make_spec(1, 1, 1, 2, 2, 2, 2, DType::bf16);
  HostTensors t = make_random_inputs(s, 6);
  ReferenceResult r;
  r.out = {3, 0, 0, 4}; // ||ref|| = 5
  r.lse = {0, 0};
  t.o = {3, 0, 0, 4.5f};
  ErrorStats e = compare(s, t, r);
  EXPECT_EQ(e.nonfinite, 0);
  EXPECT_DOUBLE_EQ(e.max_abs, 0.5);
  EXPECT_DOUBLE_EQ(e.rel_l2, 0.1);
  // A zero reference falls back to the absolute norm.
  r.out = {0, 0, 0, 0};
  t.o = {0, 0, 0.3f, 0.4f};
  EXPECT_NEAR(compare(s, t, r).rel_l2, 0.5, 1e-7);
}

TEST(Compare, ChecksLse) {
  AttentionSpec s = make_spec(1, 1, 1, 3, 1, 4, 4, DType::bf16);
  s.causal = true; // rows 0 and 1 fully masked
  s.lse = true;
  HostTensors t = make_random_inputs(s, 6);
  ReferenceResult r = reference_attention(s, t);
  ASSERT_EQ(r.lse[0], kNegInf);
  store(s, r, t);
  ASSERT_EQ(compare(s, t, r).nonfinite, 0);

  t.lse[2] += 0.25f;
  EXPECT_NEAR(compare(s, t, r).max_abs, 0.25, 1e-6);
  t.lse[2] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_EQ(compare(s, t, r).nonfinite, 1);
  store(s, r, t);
  t.lse[0] = -1e30f; // finite where -inf is required
  EXPECT_EQ(compare(s, t, r).nonfinite, 1);
  t.lse[0] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_EQ(compare(s, t, r).nonfinite, 1);
}

TEST(Tolerance, Stated) {
  EXPECT_EQ(tolerance_for(DType::bf16).abs, 3e-2);
  EXPECT_EQ(tolerance_for(DType::bf16).rel, 2e-2);
  EXPECT_EQ(tolerance_for(DType::f16).abs, 4e-3);
  EXPECT_EQ(tolerance_for(DType::f16).rel, 3e-3);
}

} // namespace
} // namespace flashjit
