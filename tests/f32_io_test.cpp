// f32 tensors in memory (AttentionSpec::f32_io): Q, K and V are f32, rounded
// in the kernel to the operand type (bf16 or f16) as they load, and O is
// written as f32, unrounded. Against the float64 reference on fresh random f32
// inputs (not representable in the operand type, so the rounding in the
// kernel is exercised), O poisoned with NaN first:
//
//   * the IR: f32 tensors narrowed by their loads, verified, printed, parsed;
//     the interpreter;
//   * the emulator, every AMD family and the simt rules, through Attention:
//     GQA, causal, window, LSE, odd head dims, both layouts, split-KV decode;
//   * what is refused: the backward, a mismatching shape.
//
// Tolerance: tolerance_for(dtype), dtype being the operand type: the kernel's
// rounding of Q, K and V is of the same order as that of P before P V.
#include "ir/build.h"
#include "ir/interpreter.h"
#include "ir/reference.h"
#include "lowering/lower.h"
#include "runtime/attention.h"
#include "runtime/emulator.h"
#include "tests/support/describe.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

using namespace flashjit;

namespace {

using test::describe;

#define EXPECT_HAS(text, part)                                                                     \
  EXPECT_NE(std::string(text).find(part), std::string::npos) << "in: " << (text)

AttentionSpec f32_spec(int64_t b, int64_t hq, int64_t hkv, int64_t sq, int64_t sk, int64_t d,
                       DType dtype, Layout layout = Layout::bshd) {
  AttentionSpec s = make_spec(b, hq, hkv, sq, sk, d, d, dtype, layout);
  s.f32_io = true;
  return s;
}

void expect_matches_reference(const AttentionSpec &spec, const HostTensors &t) {
  const Tolerance tol = tolerance_for(spec.dtype);
  const ErrorStats err = compare(spec, t, reference_attention(spec, t));
  EXPECT_TRUE(err.within(tol.abs, tol.rel)) << describe(err, tol);
}

/// How many of `values` (finite ones) the operand type cannot represent: an
/// output rounded to it has none.
int64_t unrepresentable(const std::vector<float> &values, DType t) {
  int64_t n = 0;
  for (float x : values)
    n += std::isfinite(x) && round_to(t, x) != x;
  return n;
}

TEST(F32IoIr, LoadsNarrowTheF32TensorsAndTheInterpreterRounds) {
  const AttentionSpec spec = f32_spec(1, 2, 1, 37, 53, 40, DType::bf16);
  auto p = ir::build_attention(spec, ir::Config{});
  ASSERT_TRUE(p) << p.status().message();
  ASSERT_TRUE(ir::verify(*p)) << ir::verify(*p).message();
  const std::string text = ir::print(*p);
  EXPECT_HAS(text, "tensor @Q : f32");
  EXPECT_HAS(text, "tensor @O : f32");
  EXPECT_HAS(p->name, "_f32io");
  auto back = ir::parse(text);
  ASSERT_TRUE(back) << back.status().message();
  EXPECT_EQ(ir::print(*back), text);

  HostTensors t = make_random_inputs(spec, 11);
  EXPECT_GT(unrepresentable(t.q, DType::bf16), int64_t(t.q.size() / 2));
  std::fill(t.o.begin(), t.o.end(), std::nanf(""));
  ASSERT_TRUE(ir::interpret(*p, ir::bind_attention(spec), t));
  expect_matches_reference(spec, t);
  EXPECT_GT(unrepresentable(t.o, DType::bf16), 0) << "O was rounded to bf16";
}

TEST(F32IoIr, ABf16LoadOfAnF32VectorIsRefused) {
  const AttentionSpec spec = f32_spec(1, 1, 1, 16, 16, 32, DType::bf16);
  auto p = ir::build_attention(spec, ir::Config{});
  ASSERT_TRUE(p);
  // The narrowing is for 2D tiles: a tensor of f32 elements does not make any
  // other dtype mismatch legal (the store of the f32 output stays f32).
  for (ir::TensorParam &t : p->tensors)
    if (t.name == "O")
      t.dtype = DType::bf16;
  const Status s = ir::verify(*p);
  ASSERT_FALSE(s);
  EXPECT_HAS(s.message(), "@O is bf16");
}

struct Row {
  const char *arch;
  int64_t b, hq, hkv, sq, sk, d;
  DType dtype;
  Layout layout;
  bool causal;
  Window window;
  bool lse;
  int64_t num_splits;
};

std::string row_name(const ::testing::TestParamInfo<Row> &info) {
  const Row &r = info.param;
  return fmt::format("{}_b{}_h{}x{}_s{}x{}_d{}_{}_{}{}{}{}_splits{}", r.arch, r.b, r.hq, r.hkv,
                     r.sq, r.sk, r.d, dtype_name(r.dtype), layout_name(r.layout),
                     r.causal ? "_causal" : "", r.window.left >= 0 ? "_window" : "",
                     r.lse ? "_lse" : "", r.num_splits);
}

class F32IoEmulator : public ::testing::TestWithParam<Row> {};

TEST_P(F32IoEmulator, MatchesTheFloat64Reference) {
  if (!runtime::emulator_available())
    GTEST_SKIP() << runtime::emulator_status().message();
  const Row &r = GetParam();
  AttentionSpec spec = f32_spec(r.b, r.hq, r.hkv, r.sq, r.sk, r.d, r.dtype, r.layout);
  spec.causal = r.causal;
  spec.window = r.window;
  spec.lse = r.lse;
  spec.num_splits = r.num_splits;
  Options options;
  options.compiler = "none"; // the emulator runs the kernel text
  options.cpu_threads = 2;
  auto attn = Attention::create(spec, fmt::format("emulator:{}", r.arch), options);
  ASSERT_TRUE(attn) << attn.status().message();
  // The family's matrix instructions, on operands of `dtype`: not the simt fallback.
  EXPECT_EQ(attn->explain().find("simt"), std::string::npos) << attn->explain();
  HostTensors t = make_random_inputs(spec, 5 + uint64_t(r.d) + uint64_t(r.sk));
  ASSERT_GT(unrepresentable(t.k, r.dtype), int64_t(t.k.size() / 2));
  std::vector<float> o(t.o.size(), std::nanf("")); // the poison
  std::vector<float> lse(t.lse.size(), std::nanf(""));
  Status s = attn->forward(spec, t.q.data(), t.k.data(), t.v.data(), o.data(),
                           r.lse ? lse.data() : nullptr);
  ASSERT_TRUE(s) << s.message();
  t.o = o;
  t.lse = lse;
  expect_matches_reference(spec, t);
  EXPECT_GT(unrepresentable(t.o, r.dtype), 0) << "O was rounded to " << dtype_name(r.dtype);
  if (r.num_splits > 1)
    EXPECT_HAS(attn->explain(), "1 of those calls ran the split-KV kernels");
}

constexpr Window kNoWindow{-1, -1};
constexpr auto bf16 = DType::bf16, f16 = DType::f16;
constexpr auto bshd = Layout::bshd, bhsd = Layout::bhsd;

INSTANTIATE_TEST_SUITE_P(
    Families, F32IoEmulator,
    ::testing::Values(Row{"gfx1201", 1, 4, 1, 70, 133, 64, bf16, bshd, true, kNoWindow, true, 1},
                      Row{"gfx1201", 2, 2, 2, 33, 47, 72, f16, bhsd, false, {16, 4}, false, 1},
                      Row{"gfx1201", 1, 8, 2, 1, 700, 128, bf16, bshd, true, kNoWindow, true,
                          4}, // decode
                      Row{"gfx1100", 1, 2, 1, 45, 61, 80, f16, bshd, true, kNoWindow, false, 1},
                      Row{"gfx942", 1, 2, 2, 40, 90, 96, bf16, bshd, false, kNoWindow, true, 1},
                      Row{"gfx90a", 1, 3, 1, 29, 29, 100, f16, bshd, true, kNoWindow, false, 1},
                      Row{"gfx950", 1, 2, 1, 64, 64, 256, bf16, bshd, false, kNoWindow, false, 1}),
    row_name);

TEST(F32Io, TheBackwardRefusesF32Tensors) {
  const AttentionSpec spec = f32_spec(1, 2, 2, 16, 16, 32, DType::bf16);
  const Status s = ir::validate_backward(spec);
  ASSERT_FALSE(s);
  EXPECT_HAS(s.message(), "the backward pass does not take f32 tensors (f32_io");
}

TEST(F32Io, AShapeWithoutF32IoIsAnotherSignature) {
  AttentionSpec spec = f32_spec(1, 2, 2, 16, 16, 32, DType::bf16);
  AttentionSpec other = spec;
  other.f32_io = false;
  const Status s = other.matches(spec.signature());
  ASSERT_FALSE(s);
  EXPECT_HAS(s.message(), "f32_io (f32 tensors in memory)");
  EXPECT_HAS(spec.signature().summary(), " f32io");
}

TEST(F32Io, ADtypeOfF32NamesTheField) {
  AttentionSpec spec = make_spec(1, 1, 1, 8, 8, 32, 32, DType::f32);
  const Status s = spec.validate();
  ASSERT_FALSE(s);
  EXPECT_HAS(s.message(), "set f32_io");
}

} // namespace
