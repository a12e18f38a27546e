// The float64 reference gradients (reference_attention_backward) against
// central finite differences of the forward reference, over every feature the
// backward covers; rows and keys that take part in no score; the refusals by
// name; make_random_grad and compare_grads.
#include "ir/reference.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <ostream>
#include <random>
#include <string>
#include <utility>
#include <vector>

namespace flashjit {
namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

int64_t at(const Strides &s, int64_t b, int64_t h, int64_t n, int64_t d) {
  return b * s.batch + h * s.head + n * s.seq + d * s.dim;
}

/// The loss whose gradients the backward computes: sum(O * dO), O from the
/// forward reference (dense) and dO read through O's strides.
double loss(const AttentionSpec &s, const HostTensors &t) {
  const ReferenceResult r = reference_attention(s, t);
  double sum = 0;
  for (int64_t b = 0; b < s.batch; ++b)
    for (int64_t h = 0; h < s.heads; ++h)
      for (int64_t i = 0; i < s.seqlen_q; ++i)
        for (int64_t d = 0; d < s.head_dim_v; ++d)
          sum += r.out[size_t(((b * s.heads + h) * s.seqlen_q + i) * s.head_dim_v + d)] *
                 double(t.dout[size_t(at(s.o, b, h, i, d))]);
  return sum;
}

/// One input tensor as the finite differences see it: its buffer in
/// HostTensors, its strides and logical extents, and its dense reference gradient.
struct Operand {
  const char *name;
  std::vector<float> HostTensors::*buffer;
  Strides strides;
  int64_t heads, rows, dim;
  const std::vector<double> *grad;
};

struct Case {
  std::string name;
  AttentionSpec spec;
};

/// A failing case prints its name and spec rather than its bytes.
void PrintTo(const Case &c, std::ostream *os) { *os << c.name << " (" << c.spec.summary() << ")"; }

/// f32 inputs: the reference does not round its inputs, and f32's finer values
/// (multiples of 2^-23) keep the perturbed ones exact (checked below). The
/// kernels' validate() takes only bf16 and f16; the reference takes any dtype.
AttentionSpec f32_spec(int64_t b, int64_t hq, int64_t hkv, int64_t sq, int64_t sk, int64_t dqk,
                       int64_t dv, Layout layout = Layout::bshd) {
  return make_spec(b, hq, hkv, sq, sk, dqk, dv, DType::f32, layout);
}

std::vector<Case> finite_difference_cases() {
  std::vector<Case> cases;
  auto add = [&](const char *name, AttentionSpec s) { cases.push_back({name, s}); };
  add("plain", f32_spec(2, 2, 2, 5, 7, 8, 8));
  AttentionSpec s = f32_spec(1, 2, 2, 4, 9, 8, 8);
  s.causal = true;
  add("causal_sq_lt_sk", s);
  s = f32_spec(1, 2, 2, 9, 4, 8, 8);
  s.causal = true; // rows 0..4 see no key
  add("causal_sq_gt_sk", s);
  s = f32_spec(1, 2, 2, 9, 9, 8, 8);
  s.window = {.left = 2, .right = 1};
  add("window_left_right", s);
  s = f32_spec(1, 2, 1, 8, 5, 8, 8);
  s.window = {.left = 3, .right = 0}; // rows 0..2 see no key; scale above the default
  s.scale = 1.5;
  add("window_sq_gt_sk", s);
  add("gqa", f32_spec(1, 4, 2, 6, 7, 8, 8));
  s = f32_spec(1, 3, 1, 6, 7, 8, 8);
  s.causal = true;
  add("mqa_causal", s);
  add("dqk_ne_dv", f32_spec(1, 2, 2, 5, 6, 12, 5));
  add("bhsd", f32_spec(2, 2, 1, 5, 6, 8, 8, Layout::bhsd));
  s = f32_spec(1, 4, 2, 5, 6, 8, 4, Layout::interleaved);
  s.causal = true;
  // O (so dO) with two elements of padding after each token row: dO is read
  // through O's strides, not densely.
  s.o = {.batch = 5 * (4 * 4 + 2), .head = 4, .seq = 4 * 4 + 2, .dim = 1};
  add("interleaved_padded_o", s);
  s = f32_spec(1, 2, 2, 6, 8, 8, 8);
  s.alibi = Alibi::heads;
  add("alibi_heads", s);
  s = f32_spec(2, 2, 1, 6, 6, 8, 8);
  s.alibi = Alibi::batch_heads;
  s.causal = true;
  add("alibi_batch_heads_causal", s);
  // Scale 2 puts the scores (|q.k| ~ 1 for d=8) near and past the cap, where
  // tanh bends: a gradient missing the cap's derivative is off by a factor ~2.
  s = f32_spec(1, 2, 2, 6, 7, 8, 8);
  s.softcap = 2.0;
  s.scale = 2.0;
  add("softcap", s);
  s = f32_spec(1, 4, 2, 7, 9, 8, 6);
  s.softcap = 2.0;
  s.scale = 1.0;
  s.alibi = Alibi::heads;
  s.causal = true;
  s.window.left = 3;
  add("softcap_alibi_gqa_window", s);
  return cases;
}

class ReferenceBackwardFiniteDifferences : public testing::TestWithParam<Case> {};

// Central differences with h = 2^-10: x +- h stays exact in f32 (asserted), so
// the only differences from the analytic gradient are the truncation error
// h^2/6 * f''' (~1e-7 here: f''' is of order 1 for inputs in [-1, 1)) and
// float64 rounding (~1e-16 * |loss| / h ~ 1e-12). The tolerance, 2e-5 + 1e-4 *
// |gradient|, is two orders above that (the worst error seen, 2e-7, is recorded
// as the test's worst_abs_error property) and two below the gradients
// themselves (~1e-2 to 1), so a missing term (the cap's derivative, the delta,
// the group sum, a wrong mask) fails.
TEST_P(ReferenceBackwardFiniteDifferences, MatchCentralDifferences) {
  const AttentionSpec &s = GetParam().spec;
  HostTensors t = make_random_inputs(s, 17);
  make_random_grad(s, t, 18);
  auto grads = reference_attention_backward(s, t);
  ASSERT_TRUE(grads) << grads.status().message();
  const Operand operands[] = {
      {"dq", &HostTensors::q, s.q, s.heads, s.seqlen_q, s.head_dim_qk, &grads->dq},
      {"dk", &HostTensors::k, s.k, s.kv_heads, s.seqlen_k, s.head_dim_qk, &grads->dk},
      {"dv", &HostTensors::v, s.v, s.kv_heads, s.seqlen_k, s.head_dim_v, &grads->dv},
  };
  const double h = std::ldexp(1.0, -10);
  std::mt19937_64 rng(23); // picks the perturbed positions
  auto below = [&](int64_t n) { return int64_t(rng() % uint64_t(n)); };
  double worst = 0;
  for (const Operand &op : operands) {
    ASSERT_EQ(op.grad->size(), size_t(s.batch * op.heads * op.rows * op.dim)) << op.name;
    for (int pick = 0; pick < 12; ++pick) {
      const int64_t b = below(s.batch), hd = below(op.heads), n = below(op.rows), d = below(op.dim);
      const size_t where = size_t(at(op.strides, b, hd, n, d));
      HostTensors plus = t, minus = t;
      const double x = (t.*op.buffer)[where];
      (plus.*op.buffer)[where] = float(x + h);
      (minus.*op.buffer)[where] = float(x - h);
      ASSERT_EQ(double((plus.*op.buffer)[where]), x + h);
      ASSERT_EQ(double((minus.*op.buffer)[where]), x - h);
      const double numeric = (loss(s, plus) - loss(s, minus)) / (2 * h);
      const double analytic = (*op.grad)[size_t(((b * op.heads + hd) * op.rows + n) * op.dim + d)];
      const double error = std::abs(numeric - analytic);
      worst = std::max(worst, error);
      EXPECT_LE(error, 2e-5 + 1e-4 * std::abs(analytic))
          << op.name << "[" << b << ", " << hd << ", " << n << ", " << d << "]: analytic "
          << analytic << ", finite differences " << numeric;
    }
  }
  RecordProperty("worst_abs_error", testing::PrintToString(worst));
}

INSTANTIATE_TEST_SUITE_P(Cases, ReferenceBackwardFiniteDifferences,
                         testing::ValuesIn(finite_difference_cases()),
                         [](const testing::TestParamInfo<Case> &info) { return info.param.name; });

TEST(ReferenceBackward, RowsThatSeeNoKeyHaveZeroDq) {
  // Causal with more queries than keys: rows 0..4 of 9 see none of the 4 keys.
  AttentionSpec s = make_spec(1, 2, 1, 9, 4, 8, 8, DType::bf16);
  s.causal = true;
  HostTensors t = make_random_inputs(s, 3);
  make_random_grad(s, t, 4);
  auto g = reference_attention_backward(s, t);
  ASSERT_TRUE(g) << g.status().message();
  for (int64_t h = 0; h < 2; ++h)
    for (int64_t i = 0; i < 9; ++i) {
      double norm = 0;
      for (int64_t d = 0; d < 8; ++d) {
        const double x = g->dq[size_t((h * 9 + i) * 8 + d)];
        if (i < 5) {
          EXPECT_EQ(x, 0.0) << "head " << h << " row " << i << " dim " << d;
        }
        norm += x * x;
      }
      // Row 5 sees one key only, so its softmax (and dq) is constant.
      if (i >= 6) {
        EXPECT_GT(norm, 0) << "head " << h << " row " << i;
      }
    }
}

TEST(ReferenceBackward, KeysThatNoQuerySeesHaveZeroDkDv) {
  // Window (0, 0): query i sees only key i + (7 - 3), so keys 0..3 get no gradient.
  AttentionSpec s = make_spec(1, 2, 2, 3, 7, 4, 4, DType::f16);
  s.window = {.left = 0, .right = 0};
  HostTensors t = make_random_inputs(s, 5);
  make_random_grad(s, t, 6);
  auto g = reference_attention_backward(s, t);
  ASSERT_TRUE(g) << g.status().message();
  for (int64_t h = 0; h < 2; ++h)
    for (int64_t j = 0; j < 7; ++j)
      for (int64_t d = 0; d < 4; ++d) {
        const size_t e = size_t((h * 7 + j) * 4 + d);
        // One visible key: P = 1 whatever the score, so dk is 0 and dv copies dO.
        EXPECT_EQ(g->dk[e], 0.0) << "head " << h << " key " << j;
        const double want = j < 4 ? 0.0 : double(t.dout[size_t(at(s.o, 0, h, j - 4, d))]);
        EXPECT_EQ(g->dv[e], want) << "head " << h << " key " << j;
      }
}

TEST(ReferenceBackward, RefusesWhatItDoesNotCoverByName) {
  const AttentionSpec base = make_spec(1, 2, 2, 4, 4, 8, 8, DType::bf16);
  struct Refusal {
    const char *feature;
    void (*set)(AttentionSpec &);
  };
  const Refusal refusals[] = {
      {"sequences", [](AttentionSpec &s) { s.seqs.used_k = true; }},
      {"sequences", [](AttentionSpec &s) { s.seqs.page_size = 2; }},
      {"score_mod", [](AttentionSpec &s) { s.score_mod = "score * 0.5"; }},
      {"mask_mod", [](AttentionSpec &s) { s.mask_mod = "kv_idx <= q_idx"; }},
  };
  for (const Refusal &r : refusals) {
    AttentionSpec s = base;
    r.set(s);
    HostTensors t = make_random_inputs(base, 1);
    make_random_grad(base, t, 2);
    auto g = reference_attention_backward(s, t);
    ASSERT_FALSE(g) << r.feature;
    EXPECT_NE(g.status().message().find(r.feature), std::string::npos) << g.status().message();
    EXPECT_NE(g.status().message().find("no backward"), std::string::npos) << g.status().message();
  }
}

TEST(RandomGrad, RoundedInOStridesWithPoison) {
  // O rows padded by 3 elements: the gaps of dO hold NaN, as make_random_inputs'.
  AttentionSpec s = make_spec(2, 2, 1, 3, 5, 8, 4, DType::bf16, Layout::interleaved);
  s.o = {.batch = 3 * (2 * 4 + 3), .head = 4, .seq = 2 * 4 + 3, .dim = 1};
  HostTensors t = make_random_inputs(s, 1);
  make_random_grad(s, t, 2);
  ASSERT_EQ(t.dout.size(), size_t(s.o_elements()));
  std::vector<bool> logical(t.dout.size(), false);
  for (int64_t b = 0; b < 2; ++b)
    for (int64_t h = 0; h < 2; ++h)
      for (int64_t i = 0; i < 3; ++i)
        for (int64_t d = 0; d < 4; ++d)
          logical[size_t(at(s.o, b, h, i, d))] = true;
  for (size_t e = 0; e < t.dout.size(); ++e) {
    const float x = t.dout[e];
    if (!logical[e]) {
      EXPECT_TRUE(std::isnan(x)) << "gap " << e;
      continue;
    }
    EXPECT_EQ(round_to(DType::bf16, x), x);
    EXPECT_GE(x, -1.0f);
    EXPECT_LE(x, 1.0f);
  }
  const std::pair<const std::vector<float> *, int64_t> poisoned[] = {
      {&t.dq, s.q_elements()}, {&t.dk, s.k_elements()}, {&t.dv, s.v_elements()}};
  for (const auto &[buf, elements] : poisoned) {
    ASSERT_EQ(buf->size(), size_t(elements));
    for (float x : *buf)
      EXPECT_TRUE(std::isnan(x));
  }
  // The same seed gives the same dO; another seed another; dO has its own
  // stream, so it is not Q's values when both use one seed.
  auto logical_dout = [&](uint64_t input_seed, uint64_t grad_seed) {
    HostTensors u = make_random_inputs(s, input_seed);
    make_random_grad(s, u, grad_seed);
    std::vector<float> values;
    for (size_t e = 0; e < u.dout.size(); ++e)
      if (logical[e])
        values.push_back(u.dout[e]);
    return values;
  };
  EXPECT_EQ(logical_dout(1, 2), logical_dout(7, 2));
  EXPECT_NE(logical_dout(1, 2), logical_dout(1, 3));
  HostTensors one_seed = make_random_inputs(s, 2);
  make_random_grad(s, one_seed, 2);
  EXPECT_NE(one_seed.dout[size_t(at(s.o, 0, 0, 0, 0))], one_seed.q[size_t(at(s.q, 0, 0, 0, 0))]);
}

/// Writes a reference gradient into a result buffer through the given strides, as float.
void store(const std::vector<double> &ref, const Strides &st, int64_t batch, int64_t heads,
           int64_t rows, int64_t dim, std::vector<float> &buf) {
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t n = 0; n < rows; ++n)
        for (int64_t d = 0; d < dim; ++d)
          buf[size_t(at(st, b, h, n, d))] =
              float(ref[size_t(((b * heads + h) * rows + n) * dim + d)]);
}

TEST(CompareGrads, PoisonIsNonFiniteAndFloatRoundingIsWithin) {
  // Interleaved strides, so the comparison reads dq/dk/dv through them.
  AttentionSpec s = make_spec(2, 4, 2, 5, 7, 8, 4, DType::bf16, Layout::interleaved);
  s.causal = true;
  HostTensors t = make_random_inputs(s, 9);
  make_random_grad(s, t, 10);
  auto g = reference_attention_backward(s, t);
  ASSERT_TRUE(g) << g.status().message();

  GradErrorStats e = compare_grads(s, t, *g);
  EXPECT_EQ(e.dq.nonfinite, 2 * 4 * 5 * 8); // never written at all
  EXPECT_EQ(e.dk.nonfinite, 2 * 2 * 7 * 8);
  EXPECT_EQ(e.dv.nonfinite, 2 * 2 * 7 * 4);
  EXPECT_FALSE(e.within(1, 1));

  store(g->dq, s.q, 2, 4, 5, 8, t.dq);
  store(g->dk, s.k, 2, 2, 7, 8, t.dk);
  store(g->dv, s.v, 2, 2, 7, 4, t.dv);
  e = compare_grads(s, t, *g);
  EXPECT_TRUE(e.within(1e-6, 1e-6)) << e.dq.max_abs << " " << e.dk.rel_l2 << " " << e.dv.rel_l2;

  // One element wrong in dk is seen in dk alone.
  t.dk[size_t(at(s.k, 1, 1, 6, 7))] += 0.125f;
  e = compare_grads(s, t, *g);
  EXPECT_TRUE(e.dq.within(1e-6, 1e-6));
  EXPECT_NEAR(e.dk.max_abs, 0.125, 1e-6);
  EXPECT_TRUE(e.dv.within(1e-6, 1e-6));
  t.dv[size_t(at(s.v, 0, 0, 0, 0))] = kNaN;
  EXPECT_EQ(compare_grads(s, t, *g).dv.nonfinite, 1);
}

} // namespace
} // namespace flashjit
