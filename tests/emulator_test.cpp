// The emulator: emitted gfx12 kernels run on the CPU with exact lane semantics.
//
//   * EmulatedVsReference: the spec matrix (odd head dims, Dqk != Dv, ragged
//     seqlens, bottom-right causal both ways, windows, GQA/MQA, all layouts,
//     bf16 and f16, LSE) against the float64 reference, on gfx1200 and gfx1201,
//     within tolerance_for(dtype);
//   * the IR interpreter and the emulator agree closely on the same inputs;
//   * the lane maps matter: a wrong accumulator map fails against the reference;
//   * each check (global bounds, LDS bounds, unwritten reads and races, LDS
//     size, barriers, collectives with inactive lanes, register-array bounds)
//     catches a deliberately broken kernel: a real kernel's text edited by
//     string replacement;
//   * the f16/bf16 conversions of the emulation prelude are bit-exact.
#include "runtime/emulator.h"

#include "ir/build.h"
#include "ir/interpreter.h"

#include "tests/support/describe.h"
#include "tests/support/spec_case.h"

#include <gtest/gtest.h>

#include <bit>
#include <chrono>
#include <cmath>
#include <cstring>
#include <mutex>
#include <regex>
#include <thread>
#include <vector>

using namespace flashjit;

namespace {

using test::Case;
using test::name_of;
using test::spec_of;

lowering::Target target(const char *arch) {
  auto t = lowering::parse_target(arch);
  EXPECT_TRUE(t) << t.status().message();
  return *t;
}

Expected<lowering::Lowered> lower_spec(const AttentionSpec &spec, const lowering::Target &t) {
  return lowering::generate(spec, lowering::default_config(spec, t), t);
}

using test::describe;

#define EXPECT_HAS(message, text)                                                                  \
  EXPECT_NE((message).find(text), std::string::npos) << "expected \"" << (text) << "\" in:\n"      \
                                                     << (message)

constexpr Window kNoWindow{-1, -1};
constexpr auto bf16 = DType::bf16, f16 = DType::f16;
constexpr auto bshd = Layout::bshd, bhsd = Layout::bhsd, inter = Layout::interleaved;

// Small head counts and batches keep the suite fast; every feature is in here.
const Case kCases[] = {
    {1, 2, 2, 17, 17, 1, 1, bf16, bshd, false, kNoWindow, true},    // head dim 1
    {1, 4, 1, 113, 203, 40, 40, f16, bhsd, true, kNoWindow, true},  // MQA, causal sq < sk
    {1, 8, 2, 113, 203, 80, 80, bf16, bshd, true, kNoWindow, true}, // GQA 4:1
    {2, 2, 2, 203, 113, 72, 72, f16, inter, true, kNoWindow, true}, // causal sq > sk
    {1, 2, 1, 256, 256, 100, 100, bf16, bhsd, false, Window{32, 8}, false},
    {1, 4, 2, 1, 203, 128, 128, f16, bshd, true, kNoWindow, true},  // decode: one query
    {1, 2, 2, 17, 1, 128, 64, bf16, inter, false, kNoWindow, true}, // one key, Dv < Dqk
    {1, 3, 1, 113, 113, 200, 200, f16, bshd, false, Window{16, -1}, true},
    {1, 2, 2, 64, 96, 256, 256, bf16, bshd, true, Window{20, 0}, true},
    {1, 2, 1, 77, 130, 192, 128, bf16, inter, true, kNoWindow, true},  // Dqk 192 / Dv 128
    {1, 2, 2, 65, 65, 64, 200, f16, bshd, false, Window{-1, 3}, true}, // Dv > Dqk
    {1, 2, 2, 256, 17, 40, 40, bf16, bhsd, true, kNoWindow, true},     // most rows fully masked
    {2, 2, 1, 113, 203, 80, 80, bf16, bhsd, false, kNoWindow, true},   // batch 2
    {1, 2, 2, 203, 256, 128, 128, f16, bshd, false, kNoWindow, false}, // 128-bit paths, no LSE
};

class EmulatedVsReference : public testing::TestWithParam<std::tuple<const char *, Case>> {};

TEST_P(EmulatedVsReference, MatchesFloat64) {
  const lowering::Target t = target(std::get<0>(GetParam()));
  const Case &c = std::get<1>(GetParam());
  const AttentionSpec spec = spec_of(c);
  ASSERT_TRUE(spec.validate()) << spec.validate().message();
  auto k = lower_spec(spec, t);
  ASSERT_TRUE(k) << k.status().message();
  HostTensors tensors = make_random_inputs(spec, 1234 + uint64_t(c.dqk));
  Status s = runtime::emulate(*k, t, spec, tensors, {.threads = 2});
  ASSERT_TRUE(s) << s.message();
  const Tolerance tol = tolerance_for(spec.dtype);
  const ErrorStats err = compare(spec, tensors, reference_attention(spec, tensors));
  EXPECT_TRUE(err.within(tol.abs, tol.rel)) << describe(err, tol);
}

INSTANTIATE_TEST_SUITE_P(Specs, EmulatedVsReference,
                         testing::Combine(testing::Values("gfx1200", "gfx1201"),
                                          testing::ValuesIn(kCases)),
                         [](const auto &info) {
                           return std::string(std::get<0>(info.param)) + "_" +
                                  name_of(std::get<1>(info.param));
                         });

// Tuning configs other than the default: several 16-query tiles per wave, one
// or two waves, KV blocks from 16 to 128 keys.
TEST(Emulator, NonDefaultConfigsMatchFloat64) {
  const lowering::Target t = target("gfx1201");
  struct ConfigCase {
    int64_t block_m, block_n, waves;
  };
  const ConfigCase configs[] = {{128, 32, 4}, {32, 128, 2}, {32, 16, 1}, {16, 64, 1}};
  const Case specs[] = {
      {1, 2, 1, 113, 203, 72, 72, bf16, bshd, true, kNoWindow, true},
      {1, 2, 2, 150, 97, 40, 100, f16, inter, false, Window{24, 8}, true},
  };
  for (const ConfigCase &cc : configs)
    for (const Case &c : specs) {
      SCOPED_TRACE(fmt::format("block_m {} block_n {} waves {} {}", cc.block_m, cc.block_n,
                               cc.waves, name_of(c)));
      const AttentionSpec spec = spec_of(c);
      ir::Config config = lowering::default_config(spec, t);
      config.block_m = cc.block_m;
      config.block_n = cc.block_n;
      config.waves = cc.waves;
      auto k = lowering::generate(spec, config, t);
      ASSERT_TRUE(k) << k.status().message();
      HostTensors tensors = make_random_inputs(spec, 11);
      Status s = runtime::emulate(*k, t, spec, tensors, {.threads = 2});
      ASSERT_TRUE(s) << s.message();
      const Tolerance tol = tolerance_for(spec.dtype);
      const ErrorStats err = compare(spec, tensors, reference_attention(spec, tensors));
      EXPECT_TRUE(err.within(tol.abs, tol.rel)) << describe(err, tol);
    }
}

// The online softmax's running max moves only when a block's max passes it by
// more than 8 (log2 units, ir `running_max`), and the accumulator is rescaled
// only then. Keys whose scores grow block by block (each key scaled by
// 1 + (j / 32)^2, then flat from key 192) move it by more than 8 in the early
// blocks and by less later, where the stale max gives weights above 1: output
// and LSE match float64 on every family, and the interpreter agrees.
TEST(Emulator, ScoresThatGrowOverTheKeysMoveTheRunningMax) {
  const Case c{1, 2, 1, 70, 300, 64, 64, bf16, bshd, false, kNoWindow, true};
  const AttentionSpec spec = spec_of(c);
  HostTensors inputs = make_random_inputs(spec, 21);
  for (int64_t h = 0; h < spec.kv_heads; ++h)
    for (int64_t j = 0; j < spec.seqlen_k; ++j) {
      const double grow = 1 + std::pow(double(std::min<int64_t>(j, 192)) / 32, 2);
      for (int64_t d = 0; d < spec.head_dim_qk; ++d) {
        float &x = inputs.k[h * spec.k.head + j * spec.k.seq + d * spec.k.dim];
        x = round_to(spec.dtype, float(x * grow));
      }
    }
  const ReferenceResult reference = reference_attention(spec, inputs);
  const Tolerance tol = tolerance_for(spec.dtype);
  for (const char *arch : {"gfx1201", "gfx1100", "gfx942"}) {
    SCOPED_TRACE(arch);
    const lowering::Target t = target(arch);
    auto k = lowering::generate(spec, lowering::default_config(spec, t), t);
    ASSERT_TRUE(k) << k.status().message();
    HostTensors tensors = inputs;
    Status s = runtime::emulate(*k, t, spec, tensors, {.threads = 2});
    ASSERT_TRUE(s) << s.message();
    const ErrorStats err = compare(spec, tensors, reference);
    EXPECT_TRUE(err.within(tol.abs, tol.rel)) << describe(err, tol);
  }
  auto program = ir::build_attention(spec, lowering::default_config(spec, target("gfx1201")));
  ASSERT_TRUE(program) << program.status().message();
  HostTensors interpreted = inputs;
  Status s = ir::interpret(*program, ir::bind_attention(spec), interpreted);
  ASSERT_TRUE(s) << s.message();
  const ErrorStats err = compare(spec, interpreted, reference);
  EXPECT_TRUE(err.within(tol.abs, tol.rel)) << describe(err, tol);
}

// Head dims whose accumulators do not fit are refused before anything is emitted,
// with a message naming the limit.
TEST(Emulator, SpecsThatDoNotFitAreRejectedByTheLowering) {
  const lowering::Target t = target("gfx1201");
  AttentionSpec spec = make_spec(1, 1, 1, 33, 47, 512, 512, f16, bhsd);
  auto k = lower_spec(spec, t);
  ASSERT_FALSE(k);
  EXPECT_NE(k.status().message().find("VGPRs"), std::string::npos) << k.status().message();
  EXPECT_NE(k.status().message().find("512"), std::string::npos) << k.status().message();
}

// The interpreter runs the same program with the IR's semantics: the two differ
// only in the order of f32 sums, so they agree far inside the reference tolerance.
TEST(Emulator, AgreesWithTheInterpreter) {
  const lowering::Target t = target("gfx1201");
  const Case cases[] = {
      {1, 4, 1, 113, 203, 80, 80, bf16, bshd, true, kNoWindow, true},
      {1, 2, 2, 65, 65, 64, 200, f16, bhsd, false, Window{-1, 3}, true},
      {1, 2, 1, 77, 130, 192, 128, bf16, inter, true, kNoWindow, true},
  };
  for (const Case &c : cases) {
    SCOPED_TRACE(name_of(c));
    const AttentionSpec spec = spec_of(c);
    const ir::Config config = lowering::default_config(spec, t);
    auto k = lowering::generate(spec, config, t);
    ASSERT_TRUE(k) << k.status().message();
    auto program = ir::build_attention(spec, config);
    ASSERT_TRUE(program) << program.status().message();
    HostTensors emulated = make_random_inputs(spec, 99);
    HostTensors interpreted = emulated;
    ASSERT_TRUE(ir::interpret(*program, ir::bind_attention(spec), interpreted));
    Status s = runtime::emulate(*k, t, spec, emulated);
    ASSERT_TRUE(s) << s.message();
    const double tol = c.dtype == bf16 ? 2e-2 : 3e-3;
    double worst = 0;
    for (size_t i = 0; i < emulated.o.size(); ++i) {
      if (std::isnan(interpreted.o[i]) != std::isnan(emulated.o[i])) {
        ADD_FAILURE() << "O[" << i << "]: interpreter " << interpreted.o[i] << ", emulator "
                      << emulated.o[i];
        break;
      }
      if (!std::isnan(interpreted.o[i]))
        worst = std::max(worst, double(std::fabs(interpreted.o[i] - emulated.o[i])));
    }
    for (size_t i = 0; i < emulated.lse.size(); ++i)
      if (std::isfinite(interpreted.lse[i]) || std::isfinite(emulated.lse[i]))
        worst = std::max(worst, double(std::fabs(interpreted.lse[i] - emulated.lse[i])));
    EXPECT_LE(worst, tol);
  }
}

// Results do not depend on how many threads run the workgroups.
TEST(Emulator, DeterministicAcrossThreadCounts) {
  const lowering::Target t = target("gfx1201");
  const AttentionSpec spec =
      spec_of({2, 4, 2, 113, 203, 72, 72, bf16, bshd, true, kNoWindow, true});
  auto k = lower_spec(spec, t);
  ASSERT_TRUE(k) << k.status().message();
  HostTensors one = make_random_inputs(spec, 7), three = one;
  ASSERT_TRUE(runtime::emulate(*k, t, spec, one, {.threads = 1}));
  ASSERT_TRUE(runtime::emulate(*k, t, spec, three, {.threads = 3}));
  EXPECT_EQ(0, std::memcmp(one.o.data(), three.o.data(), one.o.size() * sizeof(float)));
  EXPECT_EQ(0, std::memcmp(one.lse.data(), three.lse.data(), one.lse.size() * sizeof(float)));
}

// EmulatorOptions::progress: called from a thread of its own while the
// workgroups run, with counts that only grow and the launch's total; the
// result is the same as without it.
TEST(Emulator, ReportsProgressWhileItRuns) {
  const lowering::Target t = target("gfx1201");
  const AttentionSpec spec =
      spec_of({2, 4, 2, 256, 256, 64, 64, bf16, bshd, false, kNoWindow, true});
  auto k = lower_spec(spec, t);
  ASSERT_TRUE(k) << k.status().message();
  HostTensors quiet = make_random_inputs(spec, 11), watched = quiet;
  ASSERT_TRUE(runtime::emulate(*k, t, spec, quiet, {.threads = 1}));
  std::mutex m;
  std::vector<std::pair<int64_t, int64_t>> reports;
  runtime::EmulatorOptions o;
  o.threads = 1;
  o.progress_every = std::chrono::milliseconds(1);
  o.progress = [&](int64_t done, int64_t total) {
    std::lock_guard<std::mutex> lock(m);
    reports.emplace_back(done, total);
  };
  ASSERT_TRUE(runtime::emulate(*k, t, spec, watched, o));
  auto grid = ir::grid_size(k->grid, ir::bind_attention(spec));
  ASSERT_TRUE(grid) << grid.status().message();
  const int64_t groups = (*grid)[0] * (*grid)[1] * (*grid)[2];
  ASSERT_FALSE(reports.empty()) << "a launch of this size runs for far more than 1 ms";
  for (size_t i = 0; i < reports.size(); ++i) {
    EXPECT_EQ(reports[i].second, groups);
    EXPECT_LE(reports[i].first, groups);
    if (i > 0)
      EXPECT_GE(reports[i].first, reports[i - 1].first);
  }
  EXPECT_EQ(0, std::memcmp(quiet.o.data(), watched.o.data(), quiet.o.size() * sizeof(float)));
  // No reports once emulate() has returned.
  const size_t seen = reports.size();
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_EQ(reports.size(), seen);
}

// ---- the lane maps matter ----

lowering::MatrixCoord gfx11_interleaved_d(int lane, int e) {
  return {2 * e + lane / 16, lane % 16}; // the gfx11 accumulator rows (doc §2.2), wrong on gfx12
}
lowering::MatrixCoord contiguous_ab(int lane, int e) {
  return {lane % 16, 8 * (lane / 16) + e}; // (row, k): the llama.cpp / CK labeling of K (doc §3.3)
}
lowering::MatrixCoord contiguous_b(int lane, int e) {
  return {8 * (lane / 16) + e, lane % 16}; // (k, n)
}

struct PatchedInstr {
  lowering::LaneLayout layout;
  lowering::MatrixInstr instr;
  explicit PatchedInstr(const lowering::MatrixInstr &real) : layout(*real.layout), instr(real) {
    instr.layout = &layout;
  }
};

ErrorStats run_with(const lowering::MatrixInstr &mi, const AttentionSpec &spec,
                    const lowering::Target &t) {
  auto k = lower_spec(spec, t);
  EXPECT_TRUE(k) << k.status().message();
  k->mma = &mi;
  HostTensors tensors = make_random_inputs(spec, 5);
  Status s = runtime::emulate(*k, t, spec, tensors);
  EXPECT_TRUE(s) << s.message();
  return compare(spec, tensors, reference_attention(spec, tensors));
}

TEST(EmulatorLaneMaps, AWrongAccumulatorMapFailsAgainstTheReference) {
  const lowering::Target t = target("gfx1201");
  const AttentionSpec spec = spec_of({1, 2, 2, 64, 96, 64, 64, bf16, bshd, false, kNoWindow, true});
  const Tolerance tol = tolerance_for(spec.dtype);
  auto k = lower_spec(spec, t);
  ASSERT_TRUE(k) << k.status().message();
  ASSERT_TRUE(run_with(*k->mma, spec, t).within(tol.abs, tol.rel)); // the real row passes
  PatchedInstr wrong(*k->mma);
  wrong.layout.d = &gfx11_interleaved_d;
  const ErrorStats err = run_with(wrong.instr, spec, t);
  EXPECT_FALSE(err.within(tol.abs, tol.rel)) << describe(err, tol);
  EXPECT_GT(err.max_abs, 0.05);
}

// Doc §3.3: relabeling K identically in A and B is harmless; relabeling only
// one operand pairs the wrong entries.
TEST(EmulatorLaneMaps, OnlyAConsistentKLabelingGivesTheRightAnswer) {
  const lowering::Target t = target("gfx1201");
  const AttentionSpec spec = spec_of({1, 2, 2, 64, 96, 64, 64, f16, bshd, false, kNoWindow, true});
  const Tolerance tol = tolerance_for(spec.dtype);
  auto k = lower_spec(spec, t);
  ASSERT_TRUE(k) << k.status().message();
  PatchedInstr both(*k->mma), only_a(*k->mma);
  both.layout.a = &contiguous_ab;
  both.layout.b = &contiguous_b;
  only_a.layout.a = &contiguous_ab;
  const ErrorStats consistent = run_with(both.instr, spec, t);
  EXPECT_TRUE(consistent.within(tol.abs, tol.rel)) << describe(consistent, tol);
  const ErrorStats mixed = run_with(only_a.instr, spec, t);
  EXPECT_FALSE(mixed.within(tol.abs, tol.rel)) << describe(mixed, tol);
}

// gfx11-style rows hold every A/B entry in two lanes (L and L + 16) that must
// agree; a row declared that way catches a kernel whose replicas differ.
lowering::MatrixCoord replicated_a(int lane, int e) { return {lane % 16, e}; }
lowering::MatrixCoord replicated_b(int lane, int e) { return {e, lane % 16}; }

TEST(EmulatorLaneMaps, ReplicasThatDifferAreAnError) {
  const lowering::Target t = target("gfx1201");
  const AttentionSpec spec =
      spec_of({1, 1, 1, 16, 16, 64, 64, bf16, bshd, false, kNoWindow, false});
  auto k = lower_spec(spec, t);
  ASSERT_TRUE(k) << k.status().message();
  PatchedInstr replicated(*k->mma);
  replicated.layout.k = 8;
  replicated.layout.ab_replication = 2;
  replicated.layout.a = &replicated_a;
  replicated.layout.b = &replicated_b;
  k->mma = &replicated.instr;
  HostTensors tensors = make_random_inputs(spec, 5);
  Status s = runtime::emulate(*k, t, spec, tensors);
  ASSERT_FALSE(s);
  EXPECT_HAS(s.message(), "fj_mma: A entry (0, 0) is");
  EXPECT_HAS(s.message(), "needs the replicas equal");
}

// ---- the checks: a real kernel, broken on purpose ----

class EmulatorChecks : public testing::Test {
protected:
  void SetUp() override {
    t_ = target("gfx1201");
    // b=1, one KV head (bshd): K rows past seqlen_k run off the end of K.
    spec_ = spec_of({1, 2, 1, 113, 203, 80, 80, bf16, bshd, true, kNoWindow, true});
    auto k = lower_spec(spec_, t_);
    ASSERT_TRUE(k) << k.status().message();
    k_ = *k;
  }
  /// Replaces the first occurrence of `from` (which must exist) in the kernel text.
  void edit(const std::string &from, const std::string &to) {
    const size_t at = k_.kernel_text.find(from);
    ASSERT_NE(at, std::string::npos) << "not in the kernel text: " << from;
    k_.kernel_text.replace(at, from.size(), to);
  }
  /// Replaces every occurrence of `from` (there may be none).
  void edit_all(const std::string &from, const std::string &to) {
    for (size_t at = k_.kernel_text.find(from); at != std::string::npos;
         at = k_.kernel_text.find(from, at + to.size()))
      k_.kernel_text.replace(at, from.size(), to);
  }
  /// Replaces the first match of `pattern` (ECMAScript; $1 in `to` is its first
  /// group). For text that depends on value numbering or on whether the
  /// lowering prints a size as a literal or a named constant.
  void edit_re(const std::string &pattern, const std::string &to) {
    const std::regex re(pattern);
    ASSERT_TRUE(std::regex_search(k_.kernel_text, re))
        << "no match in the kernel text: " << pattern;
    k_.kernel_text =
        std::regex_replace(k_.kernel_text, re, to, std::regex_constants::format_first_only);
  }
  /// Puts `if (condition)` in front of the statement on the first line holding
  /// `anchor` (which must exist).
  void guard_line_of(const std::string &anchor, const std::string &condition) {
    const size_t at = k_.kernel_text.find(anchor);
    ASSERT_NE(at, std::string::npos) << "not in the kernel text: " << anchor;
    const size_t statement =
        k_.kernel_text.find_first_not_of(' ', k_.kernel_text.rfind('\n', at) + 1);
    k_.kernel_text.insert(statement, "if (" + condition + ") ");
  }
  /// Inserts a line before the line holding `anchor` (which must exist).
  void insert_before_line_of(const std::string &anchor, const std::string &line) {
    const size_t at = k_.kernel_text.find(anchor);
    ASSERT_NE(at, std::string::npos) << "not in the kernel text: " << anchor;
    const size_t bol = k_.kernel_text.rfind('\n', at) + 1;
    k_.kernel_text.insert(bol, line + "\n");
  }
  /// Runs the kernel, expects failure, returns the message.
  std::string fails() {
    HostTensors tensors = make_random_inputs(spec_, 3);
    Status s = runtime::emulate(k_, t_, spec_, tensors, {.threads = 2});
    EXPECT_FALSE(s) << "the broken kernel ran to the end";
    return s.message();
  }
  lowering::Target t_;
  AttentionSpec spec_;
  lowering::Lowered k_;
};

TEST_F(EmulatorChecks, TheUnbrokenKernelPasses) {
  HostTensors tensors = make_random_inputs(spec_, 3);
  Status s = runtime::emulate(k_, t_, spec_, tensors);
  ASSERT_TRUE(s) << s.message();
}

TEST_F(EmulatorChecks, GlobalLoadPastTheEndOfABuffer) {
  edit_re(R"(row < (seqlen_k)\b)", "row < $1 + 64"); // the K tile's row guard
  const std::string m = fails();
  EXPECT_HAS(m, "kernel " + k_.kernel_name);
  EXPECT_HAS(m, "workgroup (");
  EXPECT_HAS(m, "lane ");
  EXPECT_HAS(m, "global load of 16 bytes");
  EXPECT_HAS(m, "past the end of K");
}

TEST_F(EmulatorChecks, GlobalStoreIntoAnInput) {
  edit("fj_global_store8(dst + d0,", "fj_global_store8((fj_bits *)Q + d0,");
  EXPECT_HAS(fails(), "global store into input Q");
}

TEST_F(EmulatorChecks, LdsRowNeverWritten) {
  // Row 5 of the K tile is skipped by every store into it (staged or not).
  edit_all("fj_stage8(&lds_k[", "if (r != 5) fj_stage8(&lds_k[");
  edit_all("fj_lds_store8(&lds_k[", "if (r != 5) fj_lds_store8(&lds_k[");
  const std::string m = fails();
  EXPECT_HAS(m, "never written in this workgroup");
  EXPECT_HAS(m, "lds_k[440]"); // row 5 x stride 88
}

TEST_F(EmulatorChecks, DroppedBarrierIsARaceOnLds) {
  // Without the barrier after the V tile's staging, lanes read V^T entries other
  // lanes have not stored yet.
  edit("fj_barrier(); // the V tile is complete", "// (barrier dropped)");
  const std::string m = fails();
  EXPECT_HAS(m, "LDS load of 16 bytes at lds_vt[");
  EXPECT_HAS(m, "never written in this workgroup");
}

TEST_F(EmulatorChecks, LdsStoreAfterOtherWavesLoadedWithoutABarrier) {
  // Each lane overwrites an element of the K tile right after the S^T products,
  // while the tile's other readers are in the same barrier interval.
  insert_before_line_of("if (fj_block_unmasked", "    fj_lds_store1(&lds_k[fj_thread_id()], 0);");
  const std::string m = fails();
  EXPECT_HAS(m, "LDS race: the store to lds_k[0] overwrites what other waves");
  EXPECT_HAS(m, "lane 0 (wave 0");
}

TEST_F(EmulatorChecks, LdsLoadOfAnotherWavesStoreWithoutABarrier) {
  edit("fj_barrier(); // the K tile is complete before any wave reads it",
       "fj_barrier(); // the K tile is complete before any wave reads it\n"
       "    if (fj_thread_id() == 0) fj_lds_store1(&lds_k[0], 0);");
  const std::string m = fails();
  EXPECT_HAS(m, "LDS race: the load of lds_k[0] reads what lane 0 (wave 0) stored");
  EXPECT_HAS(m, "lane 32 (wave 1");
}

// Lanes of one wave trading data through LDS with nothing between store and load
// run in lockstep on the GPU but one after another here: refused, not guessed.
TEST_F(EmulatorChecks, LdsExchangeInsideAWaveWithoutAnOrderingPoint) {
  edit("fj_barrier(); // the K tile is complete before any wave reads it",
       "fj_barrier(); // the K tile is complete before any wave reads it\n"
       "    if (fj_thread_id() == 0) fj_lds_store1(&lds_k[8], 0);");
  EXPECT_HAS(fails(), "lanes 0 and 16 of wave 0 exchange lds_k[8] through LDS");
}

TEST_F(EmulatorChecks, LdsOverwriteInsideAWaveWithoutAnOrderingPoint) {
  // Lane 0 loads row 0 of the K tile; lane 1 of the same wave then overwrites an
  // element of it before the next wave-wide instruction.
  insert_before_line_of("= fj_mma(",
                        "        if (wave == 0 && lane == 1) fj_lds_store1(&lds_k[2], 0);");
  EXPECT_HAS(fails(), "lane 0 of wave 0 loaded lds_k[2] and lane 1 stores it");
}

TEST_F(EmulatorChecks, LdsIndexOutsideEveryArray) {
  edit("fj_lds_load8(&lds_vt[", "fj_lds_load8(&lds_vt[100000 + ");
  EXPECT_HAS(fails(), "outside every FJ_LDS_ARRAY");
}

TEST_F(EmulatorChecks, LdsArraysOverTheTargetsLimit) {
  edit("FJ_LDS_ARRAY(fj_bits, lds_k, 5632)", "FJ_LDS_ARRAY(fj_bits, lds_k, 40000)");
  const std::string m = fails();
  EXPECT_HAS(m, "FJ_LDS_ARRAY(lds_k, 40000 x 2 bytes)");
  EXPECT_HAS(m, "over gfx1201's 65536 bytes");
}

TEST_F(EmulatorChecks, LdsBytesDisagreeWithTheLowering) {
  k_.lds_bytes += 16;
  EXPECT_HAS(fails(), "Lowered::lds_bytes says");
}

TEST_F(EmulatorChecks, LaneReturnsWhileOthersWaitAtABarrier) {
  edit("const int half = lane / 16;", "if (wave == 1) return;\n  const int half = lane / 16;");
  const std::string m = fails();
  EXPECT_HAS(m, "a barrier is not reached by every lane");
  EXPECT_HAS(m, "lanes 32-63 returned from the kernel");
}

TEST_F(EmulatorChecks, WavesAtDifferentBarriers) {
  // (Skipping a barrier instead shows up as a read of LDS not yet written.)
  edit("fj_barrier(); // the K tile is complete",
       "if (wave == 0) fj_barrier();\n    fj_barrier(); // the K tile is complete");
  const std::string m = fails();
  EXPECT_HAS(m, "a barrier is not reached by every lane");
  EXPECT_HAS(m, "lanes 0-31 at one fj_barrier call, lanes 32-127 at another");
}

TEST_F(EmulatorChecks, MatrixInstructionWithInactiveLanes) {
  guard_line_of("= fj_mma(", "lane < 16"); // the first matrix instruction of S^T
  const std::string m = fails();
  EXPECT_HAS(m, "fj_mma issued by wave 0 with inactive lanes");
  EXPECT_HAS(m, "lanes 16-31 at fj_shfl_xor");
}

TEST_F(EmulatorChecks, MatrixInstructionAfterSomeLanesReturned) {
  edit_re(R"(fj_float8 acc = (t\d+)\[qt\]\[c\];)",
          "if (lane >= 24) return;\n        fj_float8 acc = $1[qt][c];");
  const std::string m = fails();
  EXPECT_HAS(m, "with inactive lanes");
  EXPECT_HAS(m, "lanes 24-31 returned from the kernel");
}

TEST_F(EmulatorChecks, ShuffleWithInactiveLanes) {
  guard_line_of("fj_shfl_xor(",
                "lane < 8"); // the row max's exchange; lanes 8-31 go on to the row sum's
  const std::string m = fails();
  EXPECT_HAS(m, "fj_shfl_xor issued by wave 0 with inactive lanes");
  EXPECT_HAS(m, "lanes 0-7 at one fj_shfl_xor call");
}

TEST_F(EmulatorChecks, RegisterArrayIndexOutOfBounds) {
  // The first matrix instruction reads one Q fragment past the end.
  edit_re(R"(fj_mma\((\w+), (\w+)\[qt\]\[k\])", "fj_mma($1, $2[qt][k + 1]");
  const std::string m = fails();
  EXPECT_HAS(m, "index 5 is out of bounds for the array of type 'fj_bits8[5]'");
  EXPECT_HAS(m, "at kernel_text:");
}

TEST_F(EmulatorChecks, LaunchedWithTheWrongWorkgroupSize) {
  k_.block_threads = 64;
  EXPECT_HAS(fails(), "declares FJ_WORKGROUP_SIZE(128) but is launched with 64");
}

TEST_F(EmulatorChecks, CompileErrorsComeBackWithClangsDiagnostics) {
  edit("const int half = lane / 16;", "const int half = lane / 16 +;");
  const std::string m = fails();
  EXPECT_HAS(m, "does not compile");
  EXPECT_HAS(m, "kernel_text:");
  EXPECT_HAS(m, "error: expected expression");
}

// ---- the prelude's element conversions, bit for bit ----

// f32 test patterns per part (part 0 is the f16 -> f32 -> f16 round trip).
uint32_t pattern(int part, uint32_t i) {
  const uint32_t hash = i * 2654435761u;
  switch (part) {
  case 1: // the f16 range [2^-25, 2^16), random rounding bits
    return 0x33000000u + i * 0x1480u + (hash >> 19);
  case 2: // exact ties of normal halves
    return ((0x33000000u + i * 0x1480u) & ~0x1fffu) | 0x1000u;
  case 3: // every f32 class: signs, zeros, subnormals, inf, NaN
    return hash ^ (i << 16);
  case 4: // the subnormal halves, every 2^7 apart (ties included)
    return 0x38000000u + i * 128u;
  default: // bf16 of random patterns (part 5)
    return hash ^ (i << 16) ^ (i >> 3);
  }
}

TEST(EmulatorPrelude, ConversionsAreBitExact) {
  const lowering::Target t = target("gfx1201");
  constexpr int kParts = 6;
  AttentionSpec spec = make_spec(kParts, 1, 1, 512, 512, 128, 128, f16, bshd);
  auto k = lower_spec(spec, t);
  ASSERT_TRUE(k) << k.status().message();
  k->grid = {{-1, ir::Extent::constant(kParts), 1},
             {-1, ir::Extent::constant(1), 1},
             {-1, ir::Extent::constant(1), 1}};
  // The test kernel takes the tensors only (no shapes).
  std::erase_if(k->params, [](const lowering::KernelParam &p) {
    return p.kind != lowering::KernelParam::Kind::tensor;
  });
  k->block_threads = 32;
  k->lds_bytes = 0;
  k->kernel_text = fmt::format(R"(
FJ_DEVICE unsigned pattern(int part, unsigned i) {{
  const unsigned hash = i * 2654435761u;
  switch (part) {{
  case 1: return 0x33000000u + i * 0x1480u + (hash >> 19);
  case 2: return ((0x33000000u + i * 0x1480u) & ~0x1fffu) | 0x1000u;
  case 3: return hash ^ (i << 16);
  case 4: return 0x38000000u + i * 128u;
  default: return hash ^ (i << 16) ^ (i >> 3);
  }}
}}
FJ_GLOBAL FJ_WORKGROUP_SIZE(32)
void {}(const fj_bits *__restrict__ Q, const fj_bits *__restrict__ K, const fj_bits *__restrict__ V,
        fj_bits *__restrict__ O) {{
  const int part = fj_group_id_x();
  for (unsigned i = fj_thread_id(); i < 65536u; i += 32) {{
    const float x = __builtin_bit_cast(float, pattern(part, i));
    const fj_bits out = part == 0 ? fj_f32_to_f16(fj_f16_to_f32((fj_bits)i))
                      : part == 5 ? fj_f32_to_bf16(x)
                                  : fj_f32_to_f16(x);
    fj_global_store1(O + long(part) * 65536 + i, out);
  }}
}}
)",
                               k->kernel_name);
  HostTensors tensors = make_random_inputs(spec, 1);
  Status s = runtime::emulate(*k, t, spec, tensors);
  ASSERT_TRUE(s) << s.message();
  int mismatches = 0;
  for (int part = 0; part < kParts; ++part)
    for (uint32_t i = 0; i < 65536; ++i) {
      const float got = tensors.o[size_t(part) * 65536 + i]; // f16 bits widened exactly
      const float x = std::bit_cast<float>(pattern(part, i));
      uint16_t want;
      if (part == 0)
        want = uint16_t(i);
      else if (part == 5)
        want = f32_to_bf16_bits(x);
      else
        want = f32_to_f16_bits(x);
      // O comes back decoded as f16 (the spec's dtype), bf16 bits included:
      // compare the decoded values, NaN as a class.
      const float want_value = f16_bits_to_f32(want);
      const bool same = std::isnan(want_value)
                            ? std::isnan(got)
                            : std::bit_cast<uint32_t>(got) == std::bit_cast<uint32_t>(want_value);
      if (!same && mismatches++ < 10)
        ADD_FAILURE() << "part " << part << " i " << i << ": got " << got << ", want "
                      << want_value;
    }
  EXPECT_EQ(mismatches, 0);
}

} // namespace
