// Every AMD family's rules, run on the CPU emulator against the float64
// reference (emulator_test.cpp covers gfx12 in depth; this file covers the rest
// with a smaller spec matrix):
//
//   * gfx1100, gfx1151 (gfx11 WMMA, replicated 16-element operands), gfx90a,
//     gfx942 (CDNA MFMA 16x16x16 and, with 32-query tiles, two 32x32x8 per
//     16-wide k tile; wave64), gfx950 (MFMA 16x16x32: two k tiles per
//     instruction, and its 16x16x16 fallback; 32x32x16), gfx1200, gfx1201
//     (gfx12), and the simt rules (no matrix instruction) on gfx1100, gfx1201
//     and gfx942;
//   * odd head dims, Dqk != Dv, ragged seqlens, causal both ways, a window,
//     GQA/MQA, bf16 and f16, LSE;
//   * the automatic choice takes the matrix rules everywhere, simt is taken only
//     when asked or when the matrix rules refuse, and says so;
//   * the lane maps matter on gfx11 and CDNA (16x16 and 32x32) too: a wrong
//     accumulator map fails.
#include "runtime/emulator.h"

#include "tests/support/describe.h"
#include "tests/support/spec_case.h"

#include <gtest/gtest.h>

using namespace flashjit;
using lowering::RulesChoice;

namespace {

using test::Case;
using test::name_of;
using test::spec_of;

lowering::Target target(const std::string &arch) {
  auto t = lowering::parse_target(arch);
  EXPECT_TRUE(t) << t.status().message();
  return *t;
}

using test::describe;

constexpr Window kNoWindow{-1, -1};
constexpr auto bf16 = DType::bf16, f16 = DType::f16;
constexpr auto bshd = Layout::bshd, bhsd = Layout::bhsd, inter = Layout::interleaved;

// A dozen specs with every feature; small heads and batches keep wave64 fast.
const Case kCases[] = {
    {1, 2, 2, 17, 17, 1, 1, bf16, bshd, false, kNoWindow, true},    // head dim 1
    {1, 4, 1, 113, 203, 40, 40, f16, bhsd, true, kNoWindow, true},  // MQA, causal sq < sk
    {1, 4, 2, 113, 203, 80, 80, bf16, bshd, true, kNoWindow, true}, // GQA 2:1
    {1, 2, 2, 203, 113, 72, 72, f16, inter, true, kNoWindow, true}, // causal sq > sk
    {1, 2, 1, 150, 150, 100, 100, bf16, bhsd, false, Window{32, 8}, false},
    {1, 2, 2, 1, 203, 128, 128, f16, bshd, true, kNoWindow, true},     // decode: one query
    {1, 2, 1, 77, 130, 192, 128, bf16, inter, true, kNoWindow, true},  // Dqk 192 / Dv 128
    {1, 2, 2, 65, 65, 64, 200, f16, bshd, false, Window{-1, 3}, true}, // Dv > Dqk
    {1, 2, 2, 96, 64, 256, 256, bf16, bshd, true, Window{20, 0}, true},
    {1, 2, 2, 130, 130, 128, 128, bf16, bshd, false, kNoWindow, false}, // 128-bit paths, no LSE
};

// Which rules lower each target: the arch, the rules asked for, the query tile
// asked for (config mma_m; 0: the lowering's choice), the rules expected.
struct Lowering {
  const char *arch;
  RulesChoice choice;
  int64_t mma_m;
  const char *rules;
};

std::string name_of(const Lowering &l) {
  return fmt::format("{}_{}{}", l.arch, l.choice == RulesChoice::simt ? "simt" : "auto",
                     l.mma_m ? fmt::format("_m{}", l.mma_m) : "");
}

constexpr auto automatic = RulesChoice::automatic, simt = RulesChoice::simt;
const Lowering kLowerings[] = {
    {"gfx1100", automatic, 0, "gfx11"}, {"gfx1151", automatic, 0, "gfx11"},
    {"gfx90a", automatic, 16, "cdna"},  {"gfx90a", automatic, 32, "cdna32"},
    {"gfx942", automatic, 16, "cdna"},  {"gfx942", automatic, 32, "cdna32"},
    {"gfx950", automatic, 16, "cdna"},  {"gfx950", automatic, 32, "cdna32"},
    {"gfx1100", simt, 0, "simt"},       {"gfx1201", simt, 0, "simt"},
    {"gfx942", simt, 0, "simt"},
};

class FamiliesVsReference : public testing::TestWithParam<std::tuple<Lowering, Case>> {};

TEST_P(FamiliesVsReference, MatchesFloat64) {
  const Lowering &how = std::get<0>(GetParam());
  const Case &c = std::get<1>(GetParam());
  const lowering::Target t = target(how.arch);
  const AttentionSpec spec = spec_of(c);
  ASSERT_TRUE(spec.validate()) << spec.validate().message();
  auto k = lowering::generate(spec, lowering::default_config(spec, t, how.choice, how.mma_m), t,
                              how.choice);
  ASSERT_TRUE(k) << k.status().message();
  EXPECT_EQ(k->rules, how.rules);
  if (how.mma_m)
    EXPECT_EQ(k->mma->m(), how.mma_m);
  EXPECT_EQ(k->mma == nullptr, how.choice == RulesChoice::simt);
  HostTensors tensors = make_random_inputs(spec, 4321 + uint64_t(c.dqk));
  Status s = runtime::emulate(*k, t, spec, tensors, {.threads = 2});
  ASSERT_TRUE(s) << s.message();
  const Tolerance tol = tolerance_for(spec.dtype);
  const ErrorStats err = compare(spec, tensors, reference_attention(spec, tensors));
  EXPECT_TRUE(err.within(tol.abs, tol.rel)) << describe(err, tol);
}

INSTANTIATE_TEST_SUITE_P(Specs, FamiliesVsReference,
                         testing::Combine(testing::ValuesIn(kLowerings), testing::ValuesIn(kCases)),
                         [](const auto &info) {
                           return name_of(std::get<0>(info.param)) + "_" +
                                  name_of(std::get<1>(info.param));
                         });

// Several query tiles (of T = 16 or 32) per wave, one or two waves, KV blocks
// of 16 (T = 16; 32 for T = 32) to 128 keys.
TEST(Families, NonDefaultConfigsMatchFloat64) {
  struct ConfigCase {
    int64_t block_m, block_n, waves;
  };
  const Case c = {1, 2, 1, 113, 203, 72, 72, f16, bshd, true, kNoWindow, true};
  for (const Lowering &how :
       {kLowerings[0], kLowerings[2], kLowerings[5], kLowerings[6], kLowerings[7], kLowerings[10]})
    for (const ConfigCase &cc :
         {ConfigCase{128, 32, 4}, ConfigCase{32, 16, 1}, ConfigCase{32, 128, 2}}) {
      const int64_t tile = how.mma_m ? how.mma_m : 16, scale = tile / 16;
      const ConfigCase scaled = {cc.block_m * scale, std::max(cc.block_n, tile), cc.waves};
      SCOPED_TRACE(fmt::format("{} block_m {} block_n {} waves {}", name_of(how), scaled.block_m,
                               scaled.block_n, scaled.waves));
      const lowering::Target t = target(how.arch);
      const AttentionSpec spec = spec_of(c);
      ir::Config config = lowering::default_config(spec, t, how.choice, how.mma_m);
      config.block_m = scaled.block_m;
      config.block_n = scaled.block_n;
      config.waves = scaled.waves;
      auto k = lowering::generate(spec, config, t, how.choice);
      ASSERT_TRUE(k) << k.status().message();
      HostTensors tensors = make_random_inputs(spec, 12);
      Status s = runtime::emulate(*k, t, spec, tensors, {.threads = 2});
      ASSERT_TRUE(s) << s.message();
      const Tolerance tol = tolerance_for(spec.dtype);
      const ErrorStats err = compare(spec, tensors, reference_attention(spec, tensors));
      EXPECT_TRUE(err.within(tol.abs, tol.rel)) << describe(err, tol);
    }
}

// With 16-query tiles gfx950 prefers v_mfma_f32_16x16x32 (two 16-wide k tiles
// per instruction, an odd last tile padded with zeros: head dims 40, 72, 80 and
// 100, block_n 16); without those rows it falls back to the 16x16x16
// instructions, with the same numerics.
TEST(Families, Gfx950PrefersK32AndFallsBackToK16) {
  const Case cases[] = {kCases[1], kCases[2], kCases[4], kCases[6]};
  for (bool k32 : {true, false})
    for (const Case &c : cases)
      for (int64_t block_n : {int64_t{0}, int64_t{16}}) {
        SCOPED_TRACE(fmt::format("{} block_n {} {}", name_of(c), block_n, k32 ? "k32" : "k16"));
        lowering::Target t = target("gfx950");
        if (!k32)
          std::erase_if(t.matrix_instrs,
                        [](const lowering::MatrixInstr *mi) { return mi->k() == 32; });
        const AttentionSpec spec = spec_of(c);
        ir::Config config = lowering::default_config(spec, t, RulesChoice::automatic, 16);
        if (block_n)
          config.block_n = block_n;
        auto k = lowering::generate(spec, config, t);
        ASSERT_TRUE(k) << k.status().message();
        ASSERT_NE(k->mma, nullptr);
        EXPECT_EQ(k->rules, "cdna");
        EXPECT_EQ(k->rules_note, "");
        EXPECT_EQ(k->mma->k(), k32 ? 32 : 16);
        EXPECT_EQ(k->mma->m(), 16);
        EXPECT_EQ(k->mma->ab_dtype, spec.dtype);
        HostTensors tensors = make_random_inputs(spec, 77 + uint64_t(c.dqk));
        Status s = runtime::emulate(*k, t, spec, tensors, {.threads = 2});
        ASSERT_TRUE(s) << s.message();
        const Tolerance tol = tolerance_for(spec.dtype);
        const ErrorStats err = compare(spec, tensors, reference_attention(spec, tensors));
        EXPECT_TRUE(err.within(tol.abs, tol.rel)) << describe(err, tol);
      }
}

// ---- which rules, and saying so ----

TEST(Families, AutomaticTakesEveryFamilysMatrixRules) {
  const AttentionSpec spec = spec_of(kCases[2]);
  for (std::string_view arch : lowering::supported_archs()) {
    const lowering::Target t = target(std::string(arch));
    auto k = lowering::generate(spec, lowering::default_config(spec, t), t);
    ASSERT_TRUE(k) << arch << ": " << k.status().message();
    ASSERT_NE(k->mma, nullptr) << arch;
    EXPECT_EQ(k->mma->family, t.family) << arch;
    EXPECT_NE(k->rules, "simt") << arch;
    EXPECT_EQ(k->rules_note, "") << arch;
  }
}

TEST(Families, SimtSaysSoInTheKernelAndTheResult) {
  const AttentionSpec spec = spec_of(kCases[2]);
  for (const char *arch : {"gfx1151", "gfx90a"}) {
    const lowering::Target t = target(arch);
    auto k = lowering::generate(spec, lowering::default_config(spec, t, RulesChoice::simt), t,
                                RulesChoice::simt);
    ASSERT_TRUE(k) << k.status().message();
    EXPECT_EQ(k->rules, "simt");
    EXPECT_EQ(k->mma, nullptr);
    EXPECT_NE(k->rules_note.find("simt"), std::string::npos) << k->rules_note;
    EXPECT_NE(k->source.find(
                  fmt::format("(simt rules, wave{}, FMAs, no matrix instruction)", t.wave_size)),
              std::string::npos);
    EXPECT_NE(k->source.find("// " + k->rules_note), std::string::npos);
    EXPECT_NE(k->kernel_text.find("fj_simt_mma("), std::string::npos);
    EXPECT_EQ(k->source.find("__builtin_amdgcn_wmma"), std::string::npos);
    EXPECT_EQ(k->source.find("__builtin_amdgcn_mfma"), std::string::npos);
  }
  // NVIDIA targets have no simt rules.
  const lowering::Target sm = target("sm_80");
  auto k = lowering::generate(spec, lowering::default_config(spec, sm), sm, RulesChoice::simt);
  ASSERT_FALSE(k);
  EXPECT_NE(k.status().message().find("sm_80"), std::string::npos) << k.status().message();
}

TEST(Families, AutomaticFallsBackToSimtWhenTheMatrixRulesRefuseAndSaysWhy) {
  // A gfx942 without its matrix instructions: the matrix rules cannot lower.
  lowering::Target t = target("gfx942");
  t.matrix_instrs.clear();
  const AttentionSpec spec = spec_of(kCases[1]);
  const ir::Config config = lowering::default_config(spec, t);
  auto matrix = lowering::generate(spec, config, t, RulesChoice::matrix);
  ASSERT_FALSE(matrix);
  EXPECT_NE(matrix.status().message().find("no f16 matrix instruction"), std::string::npos)
      << matrix.status().message();
  auto k = lowering::generate(spec, config, t);
  ASSERT_TRUE(k) << k.status().message();
  EXPECT_EQ(k->rules, "simt");
  EXPECT_NE(k->rules_note.find("no f16 matrix instruction"), std::string::npos) << k->rules_note;
  HostTensors tensors = make_random_inputs(spec, 3);
  Status s = runtime::emulate(*k, t, spec, tensors, {.threads = 2});
  ASSERT_TRUE(s) << s.message();
  const Tolerance tol = tolerance_for(spec.dtype);
  const ErrorStats err = compare(spec, tensors, reference_attention(spec, tensors));
  EXPECT_TRUE(err.within(tol.abs, tol.rel)) << describe(err, tol);
}

TEST(Families, RulesChoiceNamesRoundTrip) {
  for (RulesChoice c : {RulesChoice::automatic, RulesChoice::matrix, RulesChoice::simt}) {
    auto parsed = lowering::parse_rules_choice(lowering::rules_choice_name(c));
    ASSERT_TRUE(parsed);
    EXPECT_EQ(*parsed, c);
  }
  auto bad = lowering::parse_rules_choice("wmma");
  ASSERT_FALSE(bad);
  EXPECT_NE(bad.status().message().find("auto, matrix or simt"), std::string::npos);
}

// ---- the lane maps matter ----

// gfx12's contiguous accumulator rows, wrong on gfx11 (rows 2e + half).
lowering::MatrixCoord contiguous_rows_d(int lane, int e) {
  return {8 * (lane / 16) + e, lane % 16};
}
// CDNA rows 4 * quad + e with the quads in reverse order.
lowering::MatrixCoord reversed_quads_d(int lane, int e) {
  return {4 * (3 - lane / 16) + e, lane % 16};
}
// CDNA 32x32 rows 8 * (e / 4) + 4 * half + e % 4 with the halves swapped.
lowering::MatrixCoord swapped_halves_d(int lane, int e) {
  return {8 * (e / 4) + 4 * (1 - lane / 32) + e % 4, lane % 32};
}

struct PatchedInstr {
  lowering::LaneLayout layout;
  lowering::MatrixInstr instr;
  explicit PatchedInstr(const lowering::MatrixInstr &real) : layout(*real.layout), instr(real) {
    instr.layout = &layout;
  }
};

TEST(Families, AWrongAccumulatorMapFailsAgainstTheReference) {
  const AttentionSpec spec = spec_of({1, 2, 2, 64, 96, 64, 64, bf16, bshd, false, kNoWindow, true});
  const Tolerance tol = tolerance_for(spec.dtype);
  struct WrongMap {
    const char *arch;
    int64_t mma_m;
    lowering::LaneMap map;
  };
  const WrongMap wrong_maps[] = {{"gfx1100", 0, &contiguous_rows_d},
                                 {"gfx942", 16, &reversed_quads_d},
                                 {"gfx942", 32, &swapped_halves_d},
                                 {"gfx950", 32, &swapped_halves_d}};
  for (const auto &[arch, mma_m, map] : wrong_maps) {
    SCOPED_TRACE(fmt::format("{} mma_m {}", arch, mma_m));
    const lowering::Target t = target(arch);
    auto k = lowering::generate(
        spec, lowering::default_config(spec, t, RulesChoice::automatic, mma_m), t);
    ASSERT_TRUE(k) << k.status().message();
    PatchedInstr wrong(*k->mma);
    wrong.layout.d = map;
    k->mma = &wrong.instr;
    HostTensors tensors = make_random_inputs(spec, 5);
    Status s = runtime::emulate(*k, t, spec, tensors, {.threads = 2});
    ASSERT_TRUE(s) << s.message();
    const ErrorStats err = compare(spec, tensors, reference_attention(spec, tensors));
    EXPECT_FALSE(err.within(tol.abs, tol.rel)) << describe(err, tol);
  }
}

// The rules check the table row before emitting anything: a row whose
// accumulator map is not the one the rules assume is refused by name (gfx942:
// its only 32x32x8 row has the halves swapped, so 32-query tiles cannot be had).
TEST(Families, RulesRefuseATableRowWithAnotherAccumulatorMap) {
  struct Refusal {
    const char *arch;
    int m, k; // the row replaced
    lowering::LaneMap wrong_d;
    int64_t mma_m;
    const char *message;
  };
  const Refusal refusals[] = {{"gfx1100", 16, 16, &contiguous_rows_d, 0, "the gfx11 rules need"},
                              {"gfx942", 32, 8, &swapped_halves_d, 32, "the cdna32 rules need"}};
  const AttentionSpec spec = spec_of(kCases[2]);
  for (const Refusal &r : refusals) {
    SCOPED_TRACE(r.arch);
    lowering::Target t = target(r.arch);
    auto real = lowering::find_matrix_instr(t, spec.dtype, r.m, r.m, r.k);
    ASSERT_TRUE(real) << real.status().message();
    PatchedInstr wrong(**real);
    wrong.layout.d = r.wrong_d;
    t.matrix_instrs = {&wrong.instr};
    auto k =
        lowering::generate(spec, lowering::default_config(spec, t, RulesChoice::automatic, r.mma_m),
                           t, RulesChoice::matrix);
    ASSERT_FALSE(k);
    EXPECT_NE(k.status().message().find(r.message), std::string::npos) << k.status().message();
  }
}

} // namespace
