// The IR interpreter against the float64 reference over the spec matrix, one
// shape-free program run at many shapes, the checks on its bindings, and the
// loop-bound logic checked by brute force.
#include "ir/build.h"
#include "ir/interpreter.h"
#include "ir/reference.h"

#include "tests/support/spec_case.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <numbers>
#include <variant>
#include <vector>

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

/// Runs `program` (built for some spec of the same signature) at `spec`'s shapes
/// through bind_attention and compares with the float64 reference at the
/// tolerance stated for the dtype (tolerance_for: bf16 abs 3e-2 / rel L2 2e-2,
/// f16 abs 4e-3 / rel L2 3e-3; ir/reference.cpp says why).
void expect_matches_reference(const ir::Program &program, const AttentionSpec &spec,
                              uint64_t seed) {
  SCOPED_TRACE(spec.summary());
  ASSERT_TRUE(spec.validate()) << spec.validate().message();
  HostTensors t = make_random_inputs(spec, seed);
  // Outputs start as NaN: an element the program does not write cannot pass.
  poison_outputs(spec, t);
  Status run = ir::interpret(program, ir::bind_attention(spec), t);
  ASSERT_TRUE(run) << run.message();
  const ErrorStats err = compare(spec, t, reference_attention(spec, t));
  const Tolerance tol = tolerance_for(spec.dtype);
  EXPECT_TRUE(err.within(tol.abs, tol.rel))
      << "max_abs " << err.max_abs << " rel_l2 " << err.rel_l2 << " nonfinite " << err.nonfinite
      << " (tolerance abs " << tol.abs << " rel " << tol.rel << ")";
}

class InterpreterVsReference : public testing::TestWithParam<Case> {};

TEST_P(InterpreterVsReference, MatchesFloat64) {
  const AttentionSpec spec = spec_of(GetParam());
  ASSERT_TRUE(spec.validate()) << spec.validate().message();
  auto p = ir::build_attention(spec, ir::Config{});
  ASSERT_TRUE(p) << p.status().message();
  expect_matches_reference(*p, spec, 1234 + GetParam().dqk);
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
  Status s = ir::interpret(*p, ir::bind_attention(spec), t);
  ASSERT_FALSE(s);
  EXPECT_NE(s.message().find("tensor K"), std::string::npos) << s.message();
}

// ---- one shape-free program, many shapes ---------------------------------------

/// Specs of one signature (f16, d = 40/40, sliding window, LSE, every stride a
/// multiple of 16 bytes): batch, heads, kv_heads, seqlens, strides, window sizes
/// and scale all differ.
std::vector<AttentionSpec> local_lse_specs() {
  auto spec = [](int64_t b, int64_t hq, int64_t hkv, int64_t sq, int64_t sk, Layout l, Window w,
                 double scale) {
    AttentionSpec s = make_spec(b, hq, hkv, sq, sk, 40, 40, f16, l);
    s.window = w;
    s.scale = scale;
    s.lse = true;
    return s;
  };
  std::vector<AttentionSpec> out = {
      spec(1, 4, 1, 113, 203, bshd, {32, 8}, 0),   // MQA, default scale
      spec(2, 2, 2, 17, 1, bhsd, {-1, 3}, 0.3),    // one key; left unbounded
      spec(1, 6, 3, 200, 64, inter, {0, 0}, 0.05), // the diagonal alone; sq > sk
      // A window past every key: bound clamped to seqlen_q + seqlen_k (and i32).
      spec(1, 1, 1, 1, 300, bshd, {int64_t{5} << 30, 2}, 0.125),
  };
  // Mixed, padded strides: Q rows padded by 8 elements, O in bhsd, V rows padded by 16.
  AttentionSpec padded = spec(3, 2, 1, 64, 70, bshd, {16, -1}, 1.5);
  padded.q.seq += 8;
  padded.q.batch = padded.q.seq * padded.seqlen_q;
  padded.o = {.batch = 2 * 64 * 40, .head = 64 * 40, .seq = 40, .dim = 1};
  padded.v.seq += 16;
  padded.v.batch = padded.v.seq * padded.seqlen_k;
  out.push_back(padded);
  return out;
}

TEST(ShapeFreeProgram, OneProgramServesEveryShapeOfItsSignature) {
  const std::vector<AttentionSpec> specs = local_lse_specs();
  const KernelSignature sig = specs[0].signature();
  EXPECT_EQ(sig.row_align, 16);
  EXPECT_TRUE(sig.local && sig.lse && !sig.causal);
  auto p = ir::build_attention(specs[0], ir::Config{});
  ASSERT_TRUE(p) << p.status().message();
  const std::string text = ir::print(*p);
  uint64_t seed = 100;
  for (const AttentionSpec &spec : specs) {
    ASSERT_TRUE(spec.matches(sig)) << spec.summary() << ": " << spec.matches(sig).message();
    // Building for this spec would give the same program.
    auto own = ir::build_attention(spec, ir::Config{});
    ASSERT_TRUE(own) << own.status().message();
    EXPECT_EQ(ir::print(*own), text) << spec.summary();
    expect_matches_reference(*p, spec, seed++);
  }
}

TEST(ShapeFreeProgram, CausalGqaProgramAcrossShapes) {
  // bf16, d = 80/80, causal, no LSE: sq < sk, sq > sk (fully masked rows), GQA 4:1 and 1:1.
  auto spec = [](int64_t b, int64_t hq, int64_t hkv, int64_t sq, int64_t sk, Layout l,
                 double scale) {
    AttentionSpec s = make_spec(b, hq, hkv, sq, sk, 80, 80, bf16, l);
    s.causal = true;
    s.scale = scale;
    return s;
  };
  const AttentionSpec specs[] = {spec(1, 8, 2, 113, 203, bshd, 0),
                                 spec(2, 2, 2, 150, 40, bhsd, 0.2), spec(1, 4, 1, 1, 77, inter, 0),
                                 spec(1, 2, 1, 64, 64, bshd, 2.0)};
  auto p = ir::build_attention(specs[0], ir::Config{32, 16, 2, 1, false, 16});
  ASSERT_TRUE(p) << p.status().message();
  for (const AttentionSpec &s : specs) {
    ASSERT_TRUE(s.matches(specs[0].signature())) << s.matches(specs[0].signature()).message();
    expect_matches_reference(*p, s, 7 + s.seqlen_q);
  }
}

TEST(ShapeFreeProgram, BindingsGiveEveryScalarItsShape) {
  AttentionSpec spec = local_lse_specs().back(); // the padded one
  auto p = ir::build_attention(spec, ir::Config{});
  ASSERT_TRUE(p);
  const ir::Bindings b = ir::bind_attention(spec);
  EXPECT_TRUE(ir::check_bindings(*p, b)) << ir::check_bindings(*p, b).message();
  EXPECT_EQ(b.integer("batches").value(), 3);
  EXPECT_EQ(b.integer("group").value(), 2);
  EXPECT_EQ(b.integer("seqlen_k").value(), 70);
  EXPECT_EQ(b.integer("q_seq_stride").value(), 88);
  EXPECT_EQ(b.integer("o_head_stride").value(), 64 * 40);
  EXPECT_EQ(b.integer("window_right").value(), -1);
  EXPECT_DOUBLE_EQ(b.real("scale_log2").value(), 1.5 * std::numbers::log2e);
  auto grid = ir::grid_size(p->grid, b);
  ASSERT_TRUE(grid);
  EXPECT_EQ(*grid, (std::array<int64_t, 3>{1, 2, 3})); // ceil(64 / 64), heads, batch
  // A window wider than both sequences is clamped to their sum (an i32).
  AttentionSpec wide = local_lse_specs()[3];
  EXPECT_EQ(ir::bind_attention(wide).integer("window_left").value(), 301);
}

TEST(ShapeFreeProgram, RejectsMissingOrOutOfRangeBindings) {
  AttentionSpec spec = make_spec(1, 2, 2, 17, 17, 32, 32, f16);
  auto p = ir::build_attention(spec, ir::Config{});
  ASSERT_TRUE(p);
  HostTensors t = make_random_inputs(spec, 9);
  Status s = ir::interpret(*p, ir::Bindings{}, t);
  ASSERT_FALSE(s);
  EXPECT_NE(s.message().find("scalar parameter %batches has no value"), std::string::npos)
      << s.message();
  // One binding changed at a time: each refusal names the parameter and why.
  struct Bad {
    const char *name;
    std::variant<int64_t, double> value;
    const char *message;
  };
  const Bad bad[] = {
      {"seqlen_q", int64_t{1} << 32, "%seqlen_q = 4294967296 does not fit the kernel's i32"},
      {"scale_log2", 1e39, "%scale_log2 = 1e+39 is not a finite f32"},
      {"seqlen_k", 17.0, "%seqlen_k is bound to 17, not an integer"},
      // A negative stride would walk below the buffer, which the size check alone misses.
      {"k_seq_stride", int64_t{-1}, "tensor @K's seq stride is bound to -1"},
  };
  for (const Bad &c : bad) {
    ir::Bindings b = ir::bind_attention(spec);
    if (const int64_t *i = std::get_if<int64_t>(&c.value))
      b.set_int(c.name, *i);
    else
      b.set_real(c.name, std::get<double>(c.value));
    s = ir::interpret(*p, b, t);
    ASSERT_FALSE(s) << c.name;
    EXPECT_NE(s.message().find(c.message), std::string::npos) << s.message();
  }
  // Shapes bigger than the buffers hold: the buffer check names the tensor.
  s = ir::interpret(*p, ir::bind_attention(make_spec(1, 2, 2, 18, 17, 32, 32, f16)), t);
  ASSERT_FALSE(s);
  EXPECT_NE(s.message().find("buffer for tensor Q"), std::string::npos) << s.message();
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
  ASSERT_TRUE(ir::interpret(*p, ir::bind_attention(spec), t));
  for (int64_t i = 0; i < 32; ++i) {
    EXPECT_EQ(t.lse[i], -INFINITY) << "row " << i;
    for (int64_t d = 0; d < 16; ++d)
      EXPECT_EQ(t.o[i * spec.o.seq + d], 0.0f) << "row " << i;
  }
  EXPECT_TRUE(std::isfinite(t.lse[32]));
}

} // namespace
