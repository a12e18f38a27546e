// Every head dim x mask x dtype lowers for NVIDIA (sm_80; sm_90 by the sm90 rules'
// wgmma, compiled for sm_90a) and compiles with nvrtc into a cubin that exports
// the kernel; so does every kernel kind of a signature (split-KV, the backward's
// five). Skips, visibly, where nvrtc is absent.
#include "compiler/rtc_compiler.h"
#include "lowering/lower.h"
#include "runtime/pipeline.h"

#include <gtest/gtest.h>

#include <functional>
#include <future>
#include <iostream>

using namespace flashjit;

namespace {

struct Case {
  std::string arch;
  int64_t dqk, dv;
  DType dtype;
  bool causal;
  bool f32_io = false; // f32 tensors in memory, rounded to dtype in the kernel
};

std::vector<Case> cases() {
  std::vector<Case> out;
  const std::pair<int64_t, int64_t> dims[] = {{16, 16},   {40, 40},   {64, 64},   {72, 72},
                                              {80, 80},   {96, 96},   {100, 100}, {128, 128},
                                              {160, 160}, {192, 192}, {256, 256}, {192, 128}};
  for (auto [dqk, dv] : dims)
    for (bool causal : {false, true})
      out.push_back({"sm_90", dqk, dv, causal ? DType::bf16 : DType::f16, causal});
  for (auto [dqk, dv] : {std::pair<int64_t, int64_t>{80, 80}, {128, 128}})
    out.push_back({"sm_80", dqk, dv, DType::bf16, true});
  for (int64_t d : {64, 100, 256}) // f32 tensors: cp.async's place taken by rounding loads
    for (const char *arch : {"sm_80", "sm_90"})
      out.push_back({arch, d, d, d == 100 ? DType::f16 : DType::bf16, d != 256, true});
  return out;
}

TEST(NvrtcRegression, EveryHeadDimCompiles) {
  auto nvrtc = compiler::RtcCompiler::load(compiler::RtcKind::nvrtc);
  if (!nvrtc)
    GTEST_SKIP() << "nvrtc is not installed here: " << nvrtc.status().message();
  std::vector<std::future<std::string>> results;
  for (const Case &c : cases())
    results.push_back(std::async(std::launch::async, [&, c]() -> std::string {
      auto target = lowering::parse_target(c.arch);
      if (!target)
        return target.status().message();
      AttentionSpec spec = make_spec(2, 8, 2, 300, 517, c.dqk, c.dv, c.dtype);
      spec.causal = c.causal;
      spec.f32_io = c.f32_io;
      spec.lse = true;
      const ir::Config config = lowering::default_config(spec, *target);
      auto k = lowering::generate(spec, config, *target);
      if (!k)
        return k.status().message();
      if (c.arch == "sm_90" && k->rules != "sm90")
        return "sm_90's default config is lowered by the " + k->rules + " rules, not sm90's";
      compiler::CompileOptions options;
      options.arch = k->compile_arch; // sm_90a for the sm90 rules' wgmma
      auto code = (*nvrtc)->compile(k->source, options);
      if (!code)
        return code.status().message();
      const std::string bytes(code->bytes.begin(), code->bytes.end());
      if (bytes.rfind("\x7f"
                      "ELF",
                      0) != 0)
        return "the cubin is not an ELF file";
      if (bytes.find(k->kernel_name) == std::string::npos)
        return "the cubin does not export " + k->kernel_name;
      std::cout << options.arch << " d" << c.dqk << "/" << c.dv << " " << dtype_name(c.dtype)
                << (c.causal ? " causal" : "") << (c.f32_io ? " f32io" : "") << ": " << k->rules
                << " rules, " << config.summary() << ", " << code->bytes.size() << " bytes, LDS "
                << k->lds_bytes << "\n";
      return "";
    }));
  for (size_t i = 0; i < results.size(); ++i) {
    const std::string error = results[i].get();
    EXPECT_EQ(error, "") << cases()[i].arch << " d" << cases()[i].dqk;
  }
}

/// Non-overlapping occurrences of `what` in `text`.
size_t count(std::string_view text, std::string_view what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string_view::npos;
       at = text.find(what, at + what.size()))
    ++n;
  return n;
}

/// Every kernel a signature may run on sm_90 (the attention kernel, split-KV's two,
/// the backward's preprocess, dQ, dK/dV, reduce and sinks' gradient), dense and
/// varlen, with sinks and the LSE: the hand-written kernels (combine, preprocess,
/// reduce, sinks) included, which no head-dim case above reaches.
TEST(NvrtcRegression, EveryKernelKindCompiles) {
  auto nvrtc = compiler::RtcCompiler::load(compiler::RtcKind::nvrtc);
  if (!nvrtc)
    GTEST_SKIP() << "nvrtc is not installed here: " << nvrtc.status().message();
  using pipeline::KernelKind;
  // f32 tensors (f32_io): the forward's three kernels.
  for (KernelKind kind :
       {KernelKind::attention, KernelKind::split_partial, KernelKind::split_combine}) {
    AttentionSpec s = make_spec(2, 8, 2, 1, 300, 128, 128, DType::bf16);
    s.f32_io = true;
    s.lse = true;
    SCOPED_TRACE(fmt::format("{} kind {}", s.summary(), int(kind)));
    auto g = pipeline::generate(s, "sm_90", Options{}, nullptr, kind);
    ASSERT_TRUE(g) << g.status().message();
    auto code = (*nvrtc)->compile(g->lowered.source,
                                  pipeline::compile_options(g->target, Options{}, &g->lowered));
    ASSERT_TRUE(code) << code.status().message();
  }
  // GQA-packed decode's grouped rows (several tokens, causal, a window), on sm_80
  // and sm_90 (whose four-wave decode kernels take the wgmma rules), at head dims
  // of one, two and four panels (TMA K/V tiles); up to 128 their loops prefetch
  // whole blocks (at 256 the second copies would leave one workgroup per SM).
  for (const char *arch : {"sm_80", "sm_90"})
    for (int64_t d : {64, 128, 256})
      for (KernelKind kind :
           {KernelKind::split_partial, KernelKind::split_combine, KernelKind::decode}) {
        AttentionSpec s = make_spec(2, 32, 8, 5, 3000, d, d, DType::bf16);
        s.causal = true;
        s.window = {1000, 0};
        s.lse = true;
        auto packed = gqa_packed_decode(s);
        ASSERT_TRUE(packed);
        SCOPED_TRACE(fmt::format("{} {} kind {}", arch, packed->summary(), int(kind)));
        auto g = pipeline::generate(*packed, arch, Options{}, nullptr, kind);
        ASSERT_TRUE(g) << g.status().message();
        const bool prefetch = kind != KernelKind::split_combine && d <= 128;
        EXPECT_EQ(g->config.prefetch_blocks, prefetch) << g->config.summary();
        EXPECT_EQ(g->lowered.source.find("Block prefetch") != std::string::npos, prefetch);
        // On sm_90 the combine may be launched as the split kernel's dependent: it
        // waits for it first, and the split kernel lets it launch after its loop.
        const bool sm90 = std::string_view(arch) == "sm_90";
        EXPECT_EQ(g->lowered.waits_for_previous, sm90 && kind == KernelKind::split_combine);
        EXPECT_EQ(count(g->lowered.source, "  fj_grid_dependency_wait();"),
                  sm90 && kind == KernelKind::split_combine ? 1 : 0);
        EXPECT_EQ(count(g->lowered.source, "  fj_launch_dependents();"),
                  sm90 && kind == KernelKind::split_partial ? 1 : 0);
        auto code = (*nvrtc)->compile(g->lowered.source,
                                      pipeline::compile_options(g->target, Options{}, &g->lowered));
        ASSERT_TRUE(code) << code.status().message();
      }
  // One-token decode without GQA (one wave of 16 rows) keeps the tile pipeline.
  for (KernelKind kind : {KernelKind::split_partial, KernelKind::decode}) {
    auto g = pipeline::generate(make_spec(2, 8, 8, 1, 3000, 128, 128, DType::bf16), "sm_90",
                                Options{}, nullptr, kind);
    ASSERT_TRUE(g) << g.status().message();
    EXPECT_FALSE(g->config.prefetch_blocks) << g->config.summary();
  }
  for (bool varlen : {false, true}) {
    AttentionSpec spec = make_spec(2, 8, 2, 100, 300, 64, 64, DType::bf16);
    spec.causal = true;
    spec.lse = true;
    spec.sinks = true;
    if (varlen) {
      spec.seqs.packed_q = spec.seqs.packed_k = true;
      spec.seqs.total_q = 200;
      spec.seqs.total_k = 600;
    }
    for (KernelKind kind :
         {KernelKind::attention, KernelKind::split_partial, KernelKind::split_combine,
          KernelKind::backward_preprocess, KernelKind::backward_dq, KernelKind::backward_dkdv,
          KernelKind::backward_dkdv_direct, KernelKind::backward_reduce,
          KernelKind::backward_sinks}) {
      AttentionSpec s = spec;
      if (kind == KernelKind::split_partial || kind == KernelKind::split_combine) {
        // Split-KV does not run with packed queries; its sinks are the combine's
        // (the partial kernel is built without them).
        s.sinks = kind == KernelKind::split_combine;
        s.seqs.packed_q = false;
        s.seqs.total_q = 0;
      }
      SCOPED_TRACE(fmt::format("{} kind {}", s.summary(), int(kind)));
      const Options options;
      auto g = pipeline::generate(s, "sm_90", options, nullptr, kind);
      ASSERT_TRUE(g) << g.status().message();
      auto code = (*nvrtc)->compile(g->lowered.source,
                                    pipeline::compile_options(g->target, options, &g->lowered));
      ASSERT_TRUE(code) << code.status().message();
      const std::string bytes(code->bytes.begin(), code->bytes.end());
      EXPECT_NE(bytes.find(g->lowered.kernel_name), std::string::npos) << g->lowered.kernel_name;
    }
  }
}

/// GQA-packed decode of many grouped rows per KV head (Attention's wide split
/// set): on sm_90 from head dim 72 the split and decode kernels take two
/// consumer warpgroups of 64 rows and a producer warpgroup that copies K and V
/// by TMA; grouped Q rows, which no tensor map describes, are staged by the
/// consumers alone before the producer splits off. They compile without
/// spilling. Head dim 64 (one consumer warpgroup in the producer config, slower
/// there) and sm_80 have none.
TEST(NvrtcRegression, WideGroupedDecodeKernelsCompileWithoutSpills) {
  auto nvrtc = compiler::RtcCompiler::load(compiler::RtcKind::nvrtc);
  if (!nvrtc)
    GTEST_SKIP() << "nvrtc is not installed here: " << nvrtc.status().message();
  using pipeline::KernelKind;
  for (int64_t d : {64, 80, 128, 256}) {
    AttentionSpec s = make_spec(2, 8, 1, 16, 3000, d, d, DType::bf16);
    s.causal = true;
    s.lse = true;
    auto packed = gqa_packed_decode(s);
    ASSERT_TRUE(packed);
    EXPECT_FALSE(pipeline::wide_grouped_config(*packed, "sm_80", Options{}));
    const std::optional<ir::Config> config =
        pipeline::wide_grouped_config(*packed, "sm_90", Options{});
    ASSERT_EQ(config.has_value(), d != 64) << d;
    if (!config)
      continue;
    EXPECT_EQ(config->block_m, 128);
    EXPECT_EQ(config->waves, 8);
    EXPECT_EQ(config->stages, 3);
    EXPECT_FALSE(config->persistent);
    Options options;
    options.config = config;
    for (KernelKind kind : {KernelKind::split_partial, KernelKind::decode}) {
      SCOPED_TRACE(fmt::format("head dim {} kind {}", d, int(kind)));
      auto g = pipeline::generate(*packed, "sm_90", options, nullptr, kind);
      ASSERT_TRUE(g) << g.status().message();
      EXPECT_EQ(count(g->lowered.source, "if (fj_thread_id() < kThreads) { // the consumers' copy"),
                1);
      EXPECT_EQ(count(g->lowered.source, "if (wave >= kWaves) { // the producer warpgroup"), 1);
      compiler::CompileOptions co = pipeline::compile_options(g->target, options, &g->lowered);
      co.extra_flags.push_back("--ptxas-options=-v");
      auto code = (*nvrtc)->compile(g->lowered.source, co);
      ASSERT_TRUE(code) << code.status().message();
      EXPECT_NE(code->log.find(" 0 bytes spill stores, 0 bytes spill loads"), std::string::npos)
          << code->log;
    }
  }
}

/// "" where `kind`'s default kernel for `spec` on sm_90 compiles without spilling
/// (ptxas's own count, through nvrtc's log with --ptxas-options=-v); else its
/// config and ptxas's line, or why it did not compile.
std::string spills(compiler::RtcCompiler &nvrtc, const AttentionSpec &spec,
                   pipeline::KernelKind kind) {
  auto g = pipeline::generate(spec, "sm_90", Options{}, nullptr, kind);
  if (!g)
    return g.status().message();
  compiler::CompileOptions options = pipeline::compile_options(g->target, Options{}, &g->lowered);
  options.extra_flags.push_back("--ptxas-options=-v");
  auto code = nvrtc.compile(g->lowered.source, options);
  if (!code)
    return code.status().message();
  // "N bytes stack frame, N bytes spill stores, N bytes spill loads"
  const size_t at = code->log.find(" bytes spill stores");
  if (at == std::string::npos)
    return "nvrtc's log has no ptxas resource line:\n" + code->log;
  const size_t line = code->log.rfind('\n', at);
  const size_t from = line == std::string::npos ? 0 : line + 1;
  const std::string info = code->log.substr(from, code->log.find('\n', at) - from);
  if (info.find(" 0 bytes spill stores, 0 bytes spill loads") == std::string::npos)
    return g->config.summary() + ": " + info;
  return "";
}

} // namespace

/// The sm90 forward's default kernels do not spill (ptxas's own count, through
/// nvrtc's log with --ptxas-options=-v), for the features whose per-score code
/// once did: a sliding window's run-time sizes (docs/decisions.md, "Masked blocks
/// compare keys with their row's bounds on NVIDIA") and dropout's draws at head
/// dims 64, 128 and 192 (rules_sm90.cpp's producer_config). Known spills this
/// leaves out: dropout at 80, 96 and 256, and a mask_mod's block scan in the
/// producer's 24 registers (docs/decisions.md).
TEST(NvrtcRegression, Sm90DefaultForwardsDoNotSpill) {
  auto nvrtc = compiler::RtcCompiler::load(compiler::RtcKind::nvrtc);
  if (!nvrtc)
    GTEST_SKIP() << "nvrtc is not installed here: " << nvrtc.status().message();
  struct Feature {
    std::string name;
    std::function<void(AttentionSpec &)> set;
    std::vector<int64_t> dims;
  };
  const std::vector<int64_t> all = {64, 80, 96, 128, 192, 256};
  const std::vector<Feature> features = {
      {"plain", [](AttentionSpec &) {}, all},
      {"causal", [](AttentionSpec &s) { s.causal = true; }, all},
      {"causal, window (128, 0)",
       [](AttentionSpec &s) {
         s.causal = true;
         s.window = {128, 0};
       },
       all},
      {"window (100, 30), GQA, LSE",
       [](AttentionSpec &s) {
         s.window = {100, 30};
         s.lse = true;
       },
       all},
      {"ALiBi", [](AttentionSpec &s) { s.alibi = Alibi::heads; }, all},
      {"dropout", [](AttentionSpec &s) { s.dropout_p = 0.1; }, {64, 128, 192}},
  };
  std::vector<std::pair<std::string, std::future<std::string>>> results;
  for (const Feature &f : features)
    for (int64_t d : f.dims)
      results.emplace_back(fmt::format("{}, head dim {}", f.name, d),
                           std::async(std::launch::async, [&nvrtc, &f, d]() -> std::string {
                             AttentionSpec spec = make_spec(2, 8, 2, 300, 517, d, d, DType::bf16);
                             f.set(spec);
                             return spills(**nvrtc, spec, pipeline::KernelKind::attention);
                           }));
  for (auto &[name, result] : results)
    EXPECT_EQ(result.get(), "") << name;
}

/// The sm90 backward's default dQ and dK/dV kernels do not spill, causal or not,
/// from head dim 64 to 256: dQ above 128 takes two warpgroups of 128 rows, where
/// one warpgroup of 64 spilled 160 and 244 bytes at 224 and 240 (rules_sm90.cpp's
/// backward_block); dK/dV takes two passes from 224 (backward_config). Above 256
/// the sm80 rules' dQ spills (500 bytes at 288), which this leaves out.
TEST(NvrtcRegression, Sm90DefaultBackwardsDoNotSpill) {
  auto nvrtc = compiler::RtcCompiler::load(compiler::RtcKind::nvrtc);
  if (!nvrtc)
    GTEST_SKIP() << "nvrtc is not installed here: " << nvrtc.status().message();
  using pipeline::KernelKind;
  std::vector<std::pair<std::string, std::future<std::string>>> results;
  for (int64_t d : {64, 96, 128, 160, 192, 224, 240, 256})
    for (bool causal : {false, true})
      for (KernelKind kind :
           {KernelKind::backward_dq, KernelKind::backward_dkdv_direct, KernelKind::backward_dkdv}) {
        if (kind == KernelKind::backward_dkdv && causal)
          continue; // GQA's kernel differs by where it writes, not by the mask
        results.emplace_back(
            fmt::format("head dim {}{} kind {}", d, causal ? " causal" : "", int(kind)),
            std::async(std::launch::async, [&nvrtc, d, causal, kind]() -> std::string {
              const bool gqa = kind == KernelKind::backward_dkdv;
              AttentionSpec spec = make_spec(2, 8, gqa ? 2 : 8, 300, 517, d, d, DType::bf16);
              spec.causal = causal;
              spec.lse = true;
              return spills(**nvrtc, spec, kind);
            }));
      }
  for (auto &[name, result] : results)
    EXPECT_EQ(result.get(), "") << name;
}
