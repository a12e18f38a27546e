// The IR interpreter against the float64 reference over the spec matrix, plus
// the loop-bound logic checked by brute force.
#include "ir/build.h"
#include "ir/interpreter.h"
#include "ir/reference.h"

#include "tests/support/spec_case.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

using namespace flashjit;

namespace {

using test::Case;
using test::name_of;
using test::spec_of;

constexpr Window kNoWindow{-1, -1};
constexpr auto bf16 = DType::bf16, f16 = DType::f16;
constexpr auto bshd = Layout::bshd, bhsd = Layout::bhsd, inter = Layout::interleaved;

// The matrix of the foundation issue: head dims incl. 1..512 and Dv != Dqk;
// seqlens 1, 17, 113 vs 203, 256; causal with sq < sk and sq > sk; windows;
// GQA 1:1, 4:1 and MQA; every layout; bf16 and f16.
const Case kCases[] = {
    {1, 2, 2, 17, 17, 1, 1, bf16, bshd, false, kNoWindow, true},
    {1, 4, 1, 113, 203, 40, 40, f16, bhsd, true, kNoWindow, true},
    {1, 8, 2, 113, 203, 80, 80, bf16, bshd, true, kNoWindow, true}, // the demo spec shape (GQA 4:1)
    {2, 4, 4, 203, 113, 72, 72, f16, inter, true, kNoWindow, true}, // causal with sq > sk
    {1, 2, 1, 256, 256, 100, 100, bf16, bhsd, false, Window{32, 8}, false},
    {1, 4, 2, 1, 203, 128, 128, f16, bshd, true, kNoWindow, true}, // decode: one query
    {1, 2, 2, 17, 1, 128, 64, bf16, inter, false, kNoWindow, true},
    {1, 3, 1, 113, 113, 200, 200, f16, bshd, false, Window{16, -1}, true}, // MQA
    {1, 2, 2, 64, 96, 256, 256, bf16, bshd, true, Window{20, 0}, true},
    {1, 1, 1, 33, 47, 512, 512, f16, bhsd, false, kNoWindow, false},
    {1, 2, 1, 77, 130, 192, 128, bf16, inter, true, kNoWindow, true}, // Dqk != Dv
    {1, 2, 2, 65, 65, 64, 200, f16, bshd, false, Window{-1, 3}, true},
    {1, 2, 2, 256, 17, 40, 40, bf16, bhsd, true, kNoWindow, true}, // most rows fully masked
};

class InterpreterVsReference : public testing::TestWithParam<Case> {};

TEST_P(InterpreterVsReference, MatchesFloat64) {
  const AttentionSpec spec = spec_of(GetParam());
  ASSERT_TRUE(spec.validate()) << spec.validate().message();
  auto p = ir::build_attention(spec, ir::Config{});
  ASSERT_TRUE(p) << p.status().message();
  // Fresh random inputs; O and LSE start as NaN poison.
  HostTensors t = make_random_inputs(spec, 1234 + GetParam().dqk);
  ASSERT_TRUE(ir::interpret(*p, t)) << "interpret failed";
  const ErrorStats err = compare(spec, t, reference_attention(spec, t));
  const Tolerance tol = tolerance_for(spec.dtype);
  EXPECT_TRUE(err.within(tol.abs, tol.rel))
      << "max_abs " << err.max_abs << " rel_l2 " << err.rel_l2 << " nonfinite " << err.nonfinite
      << " (tolerance abs " << tol.abs << " rel " << tol.rel << ")";
}

INSTANTIATE_TEST_SUITE_P(Matrix, InterpreterVsReference, testing::ValuesIn(kCases),
                         [](const auto &info) {
                           std::string n = name_of(info.param);
                           std::replace(n.begin(), n.end(), '-', 'm'); // gtest names: [A-Za-z0-9_]
                           return n;
                         });

TEST(Interpreter, RejectsShortBuffers) {
  AttentionSpec spec = make_spec(1, 2, 2, 17, 17, 32, 32, DType::f16);
  auto p = ir::build_attention(spec, ir::Config{});
  ASSERT_TRUE(p);
  HostTensors t = make_random_inputs(spec, 7);
  t.k.resize(t.k.size() - 1);
  Status s = ir::interpret(*p, t);
  ASSERT_FALSE(s);
  EXPECT_NE(s.message().find("tensor K"), std::string::npos) << s.message();
}

TEST(Interpreter, DetectsUnwrittenOutputThroughPoison) {
  // Guards the guard: if a program never stored O, the comparison must fail.
  AttentionSpec spec = make_spec(1, 1, 1, 17, 17, 16, 16, DType::f16);
  HostTensors t = make_random_inputs(spec, 3);
  const ErrorStats err = compare(spec, t, reference_attention(spec, t));
  EXPECT_FALSE(err.within(1, 1));
}

// The loop bounds skip exactly the KV blocks that hold no visible key, and keep
// every block that holds one.
TEST(KvBlockRange, MatchesBruteForce) {
  const Window windows[] = {{-1, -1}, {0, 0}, {5, -1}, {-1, 7}, {13, 2}, {100, 0}};
  for (int64_t sq : {1, 17, 64, 113, 203})
    for (int64_t sk : {1, 17, 64, 113, 203})
      for (bool causal : {false, true})
        for (Window w : windows) {
          if (causal && w.right > 0)
            continue;
          for (int64_t bm : {16, 64})
            for (int64_t bn : {16, 32, 64})
              for (int64_t qb = 0; qb * bm < sq; ++qb) {
                const ir::BlockRange r = ir::kv_block_range(qb, bm, bn, sq, sk, causal, w);
                for (int64_t kb = 0; kb * bn < sk; ++kb) {
                  bool any = false;
                  for (int64_t i = qb * bm; i < std::min(sq, qb * bm + bm); ++i)
                    for (int64_t j = kb * bn; j < std::min(sk, kb * bn + bn); ++j)
                      any = any || ir::visible(i, j, sq, sk, causal, w);
                  const bool in_range = kb >= r.begin && kb < r.end;
                  ASSERT_EQ(any, in_range) << "sq " << sq << " sk " << sk << " causal " << causal
                                           << " window " << w.left << "," << w.right << " bm " << bm
                                           << " bn " << bn << " qb " << qb << " kb " << kb;
                }
              }
        }
}

TEST(Interpreter, FullyMaskedRowsGiveZeroAndNegInfLse) {
  // Causal with seqlen_q > seqlen_k: the first sq - sk queries see no key.
  AttentionSpec spec = make_spec(1, 1, 1, 40, 8, 16, 16, DType::f16);
  spec.causal = true;
  spec.lse = true;
  auto p = ir::build_attention(spec, ir::Config{});
  ASSERT_TRUE(p);
  HostTensors t = make_random_inputs(spec, 5);
  ASSERT_TRUE(ir::interpret(*p, t));
  for (int64_t i = 0; i < 32; ++i) {
    EXPECT_EQ(t.lse[i], -INFINITY) << "row " << i;
    for (int64_t d = 0; d < 16; ++d)
      EXPECT_EQ(t.o[i * spec.o.seq + d], 0.0f) << "row " << i;
  }
  EXPECT_TRUE(std::isfinite(t.lse[32]));
}

} // namespace
