// The lowering without a compiler: the same spec gives byte-identical HIP;
// every target builtin goes through a prelude wrapper; both RDNA4 processors
// lower, and every arch with its family's rules (simt only on AMD, when asked);
// configs that do not fit fail with errors naming the limit and the value; the
// launch geometry matches the kernel; a program whose masks disagree is rejected.
#include "lowering/emitter.h"
#include "lowering/lower.h"
#include "lowering/resources.h"
#include "lowering/rules.h"
#include "templates/templates.h"

#include <fmt/ranges.h>
#include <gtest/gtest.h>

#include <map>
#include <numbers>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

namespace flashjit::lowering {
namespace {

Target target(std::string_view id) {
  Expected<Target> t = parse_target(id);
  EXPECT_TRUE(t) << id << ": " << (t ? "" : t.status().message());
  return t ? t.take() : Target{};
}

AttentionSpec spec_for(int64_t dqk, int64_t dv, DType dtype, bool causal = false) {
  AttentionSpec s = make_spec(/*batch=*/2, /*heads=*/8, /*kv_heads=*/2, /*seqlen_q=*/113,
                              /*seqlen_k=*/203, dqk, dv, dtype);
  s.causal = causal;
  return s;
}

Lowered generate_ok(const AttentionSpec &spec, const Target &t) {
  Expected<Lowered> l = generate(spec, default_config(spec, t), t);
  EXPECT_TRUE(l) << spec.summary() << " on " << t.arch << ": " << (l ? "" : l.status().message());
  return l ? l.take() : Lowered{};
}

std::string generate_error(const AttentionSpec &spec, const ir::Config &config, const Target &t) {
  Expected<Lowered> l = generate(spec, config, t);
  EXPECT_FALSE(l) << spec.summary() << " on " << t.arch << " should not lower";
  return l ? std::string() : l.status().message();
}

int count(const std::string &text, const std::string &what) {
  int n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1))
    ++n;
  return n;
}

std::vector<std::string> lines_of(const std::string &text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);)
    lines.push_back(line);
  return lines;
}

/// The functions defined with FJ_DEVICE (the wrappers) that call a
/// `__builtin_amdgcn_` builtin, and the lines calling one outside any of them.
struct BuiltinUse {
  std::vector<std::string> wrappers;
  std::vector<std::string> outside;
};

BuiltinUse builtin_use(const std::string &source) {
  static const std::regex device_fn(R"(^FJ_DEVICE [^(]*\b(\w+)\()");
  BuiltinUse use;
  std::string function; // the FJ_DEVICE function being read, if any
  int depth = 0;
  for (const std::string &line : lines_of(source)) {
    if (line.rfind("//", 0) == 0 || line.find_first_not_of(' ') == std::string::npos)
      continue;
    std::smatch m;
    if (depth == 0) {
      function.clear();
      if (std::regex_search(line, m, device_fn))
        function = m[1];
    }
    for (char c : line)
      depth += c == '{' ? 1 : c == '}' ? -1 : 0;
    if (line.find("__builtin_amdgcn_") == std::string::npos)
      continue;
    if (function.empty())
      use.outside.push_back(line);
    else if (use.wrappers.empty() || use.wrappers.back() != function)
      use.wrappers.push_back(function);
  }
  return use;
}

// The specs most tests lower: bf16 and f16, even and odd head dims, Dqk != Dv.
std::vector<AttentionSpec> sample_specs() {
  return {spec_for(64, 64, DType::bf16), spec_for(80, 80, DType::bf16, /*causal=*/true),
          spec_for(100, 100, DType::f16), spec_for(192, 128, DType::bf16, /*causal=*/true),
          spec_for(40, 40, DType::f16, /*causal=*/true)};
}

TEST(Lowering, SameSpecGivesByteIdenticalSource) {
  for (const char *arch : {"gfx1200", "gfx1201"})
    for (const AttentionSpec &spec : sample_specs()) {
      SCOPED_TRACE(std::string(arch) + " " + spec.summary());
      const Lowered a = generate_ok(spec, target(arch));
      const Lowered b = generate_ok(spec, target(arch)); // a freshly parsed target too
      EXPECT_FALSE(a.source.empty());
      EXPECT_EQ(a.source, b.source);
      EXPECT_EQ(a.kernel_text, b.kernel_text);
      EXPECT_EQ(a.kernel_name, b.kernel_name);
      EXPECT_EQ(a.lds_bytes, b.lds_bytes);
    }
}

// A mask tensor's mixed blocks read each lane's run of consecutive keys at once
// where the rows allow (emit_mask_rows / emit_mask_columns), as many keys as the
// rules' accumulator runs hold; the score arithmetic reads no element itself.
// On NVIDIA (Rules::early_mask_loads) runs of at most 4 bytes are issued
// before the block's S product (emit_early_masks) and kept as bits: under the
// sm90 rules' overlapped loop, and in the sm80 rules' loop up to head dim 128.
TEST(Lowering, MaskTensorRowsAreReadARunAtATime) {
  const struct {
    const char *arch;
    int run; // Rules::acc_run_len of the default rules
  } cases[] = {{"sm_80", 2}, {"sm_90", 2}, {"gfx942", 4}, {"gfx1201", 8}, {"gfx1100", 1}};
  for (const auto &c : cases)
    for (MaskType mask : {MaskType::boolean, MaskType::bf16, MaskType::f32}) {
      SCOPED_TRACE(fmt::format("{} {}", c.arch, mask_type_name(mask)));
      AttentionSpec spec = spec_for(128, 128, DType::bf16);
      spec.mask = mask;
      spec.mask_strides =
          dense_mask_strides("bhqk", spec.batch, spec.heads, spec.seqlen_q, spec.seqlen_k).value();
      const Lowered l = generate_ok(spec, target(c.arch));
      const std::string &k = l.kernel_text;
      const bool early = std::string_view(c.arch).starts_with("sm_") && mask != MaskType::f32;
      EXPECT_EQ(count(k, "issued before the"), early ? 1 : 0);
      // One whole load per run of the lane's accumulator runs, each beside its
      // element-by-element fallback; no element read per score.
      const int fallbacks = early ? count(k, "fj_mask_fetch<")
                                  : count(k, "float(src[(long)(col + i) * mask_k_stride])");
      EXPECT_GE(fallbacks, 1);
      if (early)
        EXPECT_EQ(count(k, "fj_mask_fetch<2>"), fallbacks);
      else
        EXPECT_EQ(count(k, fmt::format("fj_mask_run<{}>", c.run)), c.run > 1 ? fallbacks : 0);
      for (const std::string &line : lines_of(k)) {
        if (line.find("attn_mask[") != std::string::npos) {
          EXPECT_EQ(line.substr(line.find_first_not_of(' '), 2), "//") << line;
        }
      }
    }
}

TEST(Lowering, DifferentSpecsGiveDifferentSources) {
  const Target t = target("gfx1201");
  AttentionSpec causal = spec_for(64, 64, DType::bf16, /*causal=*/true);
  AttentionSpec plain = spec_for(64, 64, DType::bf16);
  EXPECT_NE(generate_ok(causal, t).source, generate_ok(plain, t).source);
  // The scale is a run-time argument (log2(e) folded in: the kernel uses exp2),
  // so another scale is the same kernel.
  const Lowered unscaled = generate_ok(plain, t);
  plain.scale = 0.5;
  const Lowered scaled = generate_ok(plain, t);
  EXPECT_EQ(scaled.source, unscaled.source);
  EXPECT_NE(scaled.source.find(" * scale_log2;"), std::string::npos);
  const ir::Bindings args = ir::bind_attention(plain);
  EXPECT_DOUBLE_EQ(args.real("scale_log2").value(), 0.5 * std::numbers::log2e);
}

TEST(Lowering, SourceIsHeaderPreludeMatrixWrapperThenKernelText) {
  for (const AttentionSpec &spec : sample_specs()) {
    SCOPED_TRACE(spec.summary());
    const Lowered l = generate_ok(spec, target("gfx1201"));
    ASSERT_GE(l.source.size(), l.kernel_text.size());
    EXPECT_EQ(l.source.substr(l.source.size() - l.kernel_text.size()), l.kernel_text);
    const size_t prelude = l.source.find(templates::amdgcn_prelude);
    ASSERT_NE(prelude, std::string::npos);
    EXPECT_LT(prelude, l.source.find("FJ_DEVICE fj_float8 fj_mma("));
    EXPECT_EQ(l.kernel_text.find(templates::amdgcn_prelude), std::string::npos);
    EXPECT_NE(l.kernel_text.find("FJ_GLOBAL"), std::string::npos);
  }
}

TEST(Lowering, KernelTextCallsNoTargetBuiltin) {
  // The emulator runs kernel_text under its own prelude: every target builtin
  // must stay behind an fj_* wrapper.
  for (const char *arch : {"gfx1200", "gfx1201"})
    for (const AttentionSpec &spec : sample_specs()) {
      SCOPED_TRACE(std::string(arch) + " " + spec.summary());
      const Lowered l = generate_ok(spec, target(arch));
      EXPECT_EQ(l.kernel_text.find("__builtin_amdgcn_"), std::string::npos);
      EXPECT_EQ(l.kernel_text.find("__builtin_bit_cast"), std::string::npos);
      EXPECT_EQ(l.kernel_text.find(l.mma->builtin), std::string::npos);
    }
}

TEST(Lowering, EveryBuiltinCallIsInsideAnFjWrapper) {
  for (const AttentionSpec &spec : sample_specs()) {
    SCOPED_TRACE(spec.summary());
    const Lowered l = generate_ok(spec, target("gfx1201"));
    const BuiltinUse use = builtin_use(l.source);
    EXPECT_TRUE(use.outside.empty()) << "builtin called outside a wrapper: " << use.outside[0];
    ASSERT_FALSE(use.wrappers.empty());
    for (const std::string &w : use.wrappers)
      EXPECT_EQ(w.rfind("fj_", 0), 0u) << w;
    // The matrix builtin is called from fj_mma only; the rest from the prelude.
    EXPECT_NE(std::find(use.wrappers.begin(), use.wrappers.end(), "fj_mma"), use.wrappers.end());
    EXPECT_EQ(builtin_use(std::string(templates::amdgcn_prelude)).wrappers.size() + 1,
              use.wrappers.size());
  }
}

TEST(Lowering, OperandsCrossIntoTheBuiltinOnlyThroughBitCast) {
  for (const char *arch : {"gfx1200", "gfx1201"})
    for (DType dt : {DType::bf16, DType::f16}) {
      SCOPED_TRACE(std::string(arch) + " " + std::string(dtype_name(dt)));
      const Lowered l = generate_ok(spec_for(64, 64, dt), target(arch));
      ASSERT_NE(l.mma, nullptr);
      const std::string builtin(l.mma->builtin);
      const std::string vec = dt == DType::bf16 ? "fj_short8" : "fj_half8";
      // Exactly one call, with both A and B bit-cast from the fj_bits8 storage.
      EXPECT_EQ(count(l.source, builtin + "("), 1);
      EXPECT_NE(l.source.find(builtin + "(__builtin_bit_cast(" + vec + ", a), __builtin_bit_cast(" +
                              vec + ", b), c)"),
                std::string::npos);
      // No operand is ever built as the builtin's vector type directly.
      const std::string kernel = l.kernel_text;
      EXPECT_EQ(kernel.find("fj_short8"), std::string::npos);
      EXPECT_EQ(kernel.find("fj_half8"), std::string::npos);
      EXPECT_EQ(kernel.find("__bf16"), std::string::npos);
    }
}

TEST(Lowering, BothRdna4ProcessorsLowerWithTheirWmmaBuiltins) {
  for (const char *arch : {"gfx1200", "gfx1201"}) {
    const Target t = target(arch);
    for (DType dt : {DType::bf16, DType::f16}) {
      SCOPED_TRACE(std::string(arch) + " " + std::string(dtype_name(dt)));
      const Lowered l = generate_ok(spec_for(128, 128, dt, /*causal=*/true), t);
      ASSERT_NE(l.mma, nullptr);
      EXPECT_EQ(l.rules, "gfx12");
      EXPECT_EQ(l.mma->family, Family::gfx12);
      EXPECT_EQ(l.mma->ab_dtype, dt);
      const std::string builtin = dt == DType::bf16
                                      ? "__builtin_amdgcn_wmma_f32_16x16x16_bf16_w32_gfx12"
                                      : "__builtin_amdgcn_wmma_f32_16x16x16_f16_w32_gfx12";
      EXPECT_EQ(l.mma->builtin, builtin);
      EXPECT_NE(l.source.find(fmt::format("// flashjit kernel {} for {} (gfx12 rules, wave32, {})",
                                          l.kernel_name, arch, builtin)),
                std::string::npos);
      EXPECT_NE(l.source.find(fmt::format("constexpr int kWave = {};", t.wave_size)),
                std::string::npos);
    }
  }
}

TEST(Lowering, EveryArchLowersWithItsFamilysMatrixRules) {
  // family -> the rules that lower it (lowering/rules.cpp); CDNA takes 32-query
  // tiles for this spec (head_dim_v 64, 113 queries); Hopper its warpgroup rules.
  const std::map<Family, std::string> expected = {
      {Family::gfx11, "gfx11"},  {Family::gfx12, "gfx12"},  {Family::cdna2, "cdna32"},
      {Family::cdna3, "cdna32"}, {Family::cdna4, "cdna32"}, {Family::sm80, "sm80"},
      {Family::sm90, "sm90"}};
  const AttentionSpec spec = spec_for(64, 64, DType::bf16);
  const std::string listed = families_with_rules();
  for (std::string_view arch : supported_archs()) {
    SCOPED_TRACE(arch);
    const Target t = target(arch);
    const Lowered l = generate_ok(spec, t);
    EXPECT_EQ(l.rules, expected.at(t.family));
    ASSERT_NE(l.mma, nullptr);
    EXPECT_EQ(l.mma->family, t.family);
    EXPECT_EQ(l.rules_note, "");
    EXPECT_NE(listed.find(arch), std::string::npos) << listed;
  }
}

// sm_90 is a family of its own (sm90): its default configs take the sm90 rules
// (wgmma from swizzled shared memory, compiled for sm_90a); a config they cannot
// lower (Q in registers, or not whole warpgroups) and the backward take the sm80
// rules on sm_90's own rows of mma.sync, whose kernels are sm_80's word for word
// but the target they name.
// TMA on sm90 takes what a tensor map describes: a dense tensor's [batch, head,
// seq, dim] with 16-byte aligned rows and a length the launch knows, in whole
// 64-column panels, three and more in the forward. Packed rows (varlen),
// per-batch key counts, paged caches, 8-byte aligned rows (head dim 100),
// partial panels (96) and the forward's tiles of two panels (128) stay on
// threads' cp.async copies; where Q is packed and K/V are dense, K and V still
// take TMA.
// The resource model counts the barriers the kernel declares. A tile copied by
// threads is fenced for wgmma's reads: K and V at their waits in the loop; Q's
// copy completes at the loop's first wait (with K's, or beside K's TMA wait).
TEST(Lowering, Sm90CopiesWithTmaWhatATensorMapDescribes) {
  const Target sm90 = target("sm_90");
  struct Case {
    const char *name;
    AttentionSpec spec;
    int tma_tiles; // of Q, K, V
    int fences;    // fj_fence_async_shared() in the kernel's text
  };
  AttentionSpec packed = spec_for(192, 192, DType::bf16, true);
  packed.seqs.packed_q = packed.seqs.packed_k = true;
  packed.seqs.total_q = 200;
  packed.seqs.total_k = 400;
  AttentionSpec packed_q = packed;
  packed_q.seqs.packed_k = false;
  packed_q.seqs.total_k = 0;
  AttentionSpec used = spec_for(256, 256, DType::f16);
  used.seqs.used_k = true;
  AttentionSpec paged = spec_for(192, 192, DType::bf16);
  paged.seqs.page_size = 64;
  paged.seqs.num_pages = 16;
  paged.seqs.pages_per_seq = 4;
  paged.seqlen_k = 256;
  const Case cases[] = {{"dense", spec_for(256, 256, DType::bf16), 3, 0},
                        {"whole panels of K only", spec_for(192, 96, DType::bf16), 2, 1},
                        {"one panel", spec_for(64, 64, DType::bf16), 0, 2},
                        {"two panels, no producer", spec_for(128, 128, DType::bf16), 0, 2},
                        {"partial panels", spec_for(96, 96, DType::bf16), 0, 2},
                        {"align8", spec_for(100, 100, DType::f16), 0, 2},
                        {"packed", packed, 0, 2},
                        {"packed Q", packed_q, 2, 1},
                        {"seqused_k", used, 1, 2},
                        {"paged", paged, 1, 2}};
  for (const Case &c : cases) {
    SCOPED_TRACE(c.name);
    // Not the producer's default configs (Sm90ProducerWarpgroupFillsARing).
    const ir::Config config =
        default_config(c.spec, sm90, RulesChoice::automatic, 0, /*producer=*/false);
    Expected<Lowered> l = generate(c.spec, config, sm90);
    ASSERT_TRUE(l) << l.status().message();
    ASSERT_EQ(l->rules, "sm90");
    EXPECT_EQ(count(l->kernel_text, "fj_tma_wait(fj_tma_bar, "), c.tma_tiles);
    int maps = 0;
    for (const KernelParam &p : l->params)
      maps += p.kind == KernelParam::Kind::tensor_map;
    EXPECT_EQ(maps, c.tma_tiles);
    EXPECT_EQ(count(l->kernel_text, "fj_fence_async_shared();"), c.fences)
        << "each tile copied by threads is fenced for wgmma";
    EXPECT_EQ(count(l->kernel_text, "and Q's copy, left to the loop's first wait"),
              c.name == std::string("packed Q") ? 1 : 0);
    Expected<ResourceEstimate> e = estimate_resources(c.spec, config, sm90);
    ASSERT_TRUE(e) << e.status().message();
    EXPECT_EQ(e->lds_barriers, 8 * c.tma_tiles);
    EXPECT_EQ(e->lds_bytes(), l->lds_bytes);
  }
}

// The sm90 forward writes O through 16 LDS rows per wave, as 16-byte runs of
// whole rows, where its rows are such runs: rows of their own where they fit
// beside the tiles without taking a workgroup per SM away, else over the tiles
// once every consumer is past its last product (one tile per workgroup, a
// producer); elsewhere the fragments go out directly.
TEST(Lowering, Sm90StagesOThroughLdsRows) {
  const Target sm90 = target("sm_90");
  const std::string staged = "fj_global_store8(dst + j * 8, fj_lds_load8(&";
  const std::string direct = "fj_global_store2(dst + d0, ";
  const std::string over = "fj_bits *const lds_o = reinterpret_cast<fj_bits *>(fj_dynamic_lds);";
  enum class Where { own_rows, over_tiles, direct };
  struct Case {
    const char *name;
    AttentionSpec spec;
    Where where;
    int64_t waves, cols; // of O's staging rows
    bool persistent = false;
  };
  AttentionSpec f32 = spec_for(128, 128, DType::bf16);
  f32.f32_io = true;
  AttentionSpec packed = spec_for(96, 96, DType::bf16, true);
  packed.seqs.packed_q = packed.seqs.packed_k = true;
  packed.seqs.total_q = 200;
  packed.seqs.total_k = 400;
  AttentionSpec odd = spec_for(100, 100, DType::f16); // rows of 200 bytes
  const Case cases[] = {
      {"128", spec_for(128, 128, DType::bf16), Where::own_rows, 8, 128},
      {"64 causal (two workgroups per SM)", spec_for(64, 64, DType::f16, true), Where::own_rows, 4,
       64},
      {"72 (padded to 80 in registers)", spec_for(72, 72, DType::bf16), Where::own_rows, 8, 80},
      {"256", spec_for(256, 256, DType::bf16), Where::over_tiles, 8, 256},
      {"192 causal", spec_for(192, 192, DType::bf16, true), Where::over_tiles, 8, 192},
      {"192, persistent", spec_for(192, 192, DType::bf16), Where::direct, 8, 0, true},
      {"packed Q and K (stages 2: the rows would take a workgroup per SM away)", packed,
       Where::direct, 4, 0},
      {"f32 in memory", f32, Where::direct, 4, 0},
      {"100 (rows of 200 bytes)", odd, Where::direct, 4, 0},
  };
  for (const Case &c : cases) {
    SCOPED_TRACE(c.name);
    ir::Config config = default_config(c.spec, sm90);
    config.persistent = config.persistent || c.persistent;
    EXPECT_EQ(config.waves, c.waves);
    Expected<Lowered> l = generate(c.spec, config, sm90);
    ASSERT_TRUE(l) << l.status().message();
    ASSERT_EQ(l->rules, "sm90");
    const std::string &k = l->kernel_text;
    Expected<ResourceEstimate> e = estimate_resources(c.spec, config, sm90);
    ASSERT_TRUE(e) << e.status().message();
    EXPECT_EQ(e->lds_bytes(), l->lds_bytes);
    const int64_t rows = c.where == Where::own_rows ? emit::output_stage_size(c.waves, c.cols) : 0;
    EXPECT_EQ(e->lds_o, rows);
    EXPECT_EQ(count(k, fmt::format("FJ_DYNAMIC_LDS_ARRAY(fj_bits, lds_o, {},", rows / 2)),
              rows ? 1 : 0);
    EXPECT_EQ(count(k, over), c.where == Where::over_tiles ? 1 : 0);
    EXPECT_EQ(count(k, "fj_named_barrier(kThreads); // every consumer is past its last product"),
              c.where == Where::over_tiles ? 1 : 0);
    if (c.where == Where::direct) {
      EXPECT_EQ(count(k, direct), c.spec.f32_io ? 0 : 2) << "rows g and g + 8";
      EXPECT_EQ(count(k, staged), 0);
      continue;
    }
    EXPECT_LE(emit::output_stage_size(c.waves, c.cols), l->lds_bytes);
    EXPECT_EQ(count(k, staged), 1);
    EXPECT_EQ(count(k, direct), 0);
    EXPECT_EQ(count(k, "fj_wave_barrier();"), 2) << "before the writes and before the reads";
    // Rows g and g + 8 of 8 columns per fragment, 32-bit writes 4 banks apart per row.
    const int64_t pitch = emit::output_stage_pitch(c.cols);
    EXPECT_EQ(pitch % 8, 0) << "16-byte runs";
    EXPECT_EQ(pitch / 2 % 8, 4) << "rows g start 4 banks apart";
    EXPECT_EQ(count(k, fmt::format("[(g + 8) * {} + c * kNTile + 2 * t]", pitch)), 1);
  }
  // The sm80 rules stage O up to head dim 192 where the rows leave the two
  // workgroups per SM their registers allow (Rules::resident_workgroups): at
  // head dim 64 (27 KiB with the rows), not at 128 (Q in LDS: 85 KiB with them,
  // one workgroup of sm_80's 164 KiB), nor at 256.
  const Target sm80 = target("sm_80");
  for (int64_t d : {64, 128, 256}) {
    SCOPED_TRACE(fmt::format("sm_80, head dim {}", d));
    const AttentionSpec spec = spec_for(d, d, DType::bf16);
    const ir::Config config = default_config(spec, sm80);
    Expected<Lowered> l80 = generate(spec, config, sm80);
    ASSERT_TRUE(l80) << l80.status().message();
    auto e = estimate_resources(spec, config, sm80);
    ASSERT_TRUE(e) << e.status().message();
    if (d == 64) {
      EXPECT_EQ(e->lds_o, emit::output_stage_size(config.waves, d));
      EXPECT_EQ(count(l80->kernel_text, "_rows = lds_o + wave * "), 1);
      EXPECT_EQ(count(l80->kernel_text, direct), 0);
    } else {
      EXPECT_EQ(e->lds_o, 0);
      EXPECT_EQ(count(l80->kernel_text, "lds_o"), 0);
      EXPECT_GT(count(l80->kernel_text, direct), 0);
    }
    EXPECT_EQ(l80->lds_bytes, e->lds_bytes());
  }
}

// The sm80 rules' forward defaults (rules_sm80.h): FlashAttention-2's tile of
// two 16-row tiles per warp with Q in LDS from head dim 81 to 128, one tile with
// Q in registers there for specs with per-score extras and for the decode
// kernels (Rules::decode_config), one tile with Q in LDS above 128; the sm80
// backward keeps 16 rows per warp above head dim 96.
TEST(Lowering, Sm80DefaultsTakeTwoTilesWithQInLdsUpToHeadDim128) {
  const Target sm80 = target("sm_80"), sm90 = target("sm_90");
  struct Case {
    int64_t d;
    bool dropout, decode;
    int64_t block_m;
    bool q_in_lds;
  };
  const Case cases[] = {
      {64, false, false, 128, false}, {80, false, false, 128, false}, {96, false, false, 128, true},
      {96, true, false, 128, true},   {128, false, false, 128, true}, {128, true, false, 64, false},
      {128, false, true, 64, false},  {192, false, false, 64, true},  {256, false, true, 64, true}};
  for (const Case &c : cases) {
    SCOPED_TRACE(fmt::format("head dim {}{}{}", c.d, c.dropout ? ", dropout" : "",
                             c.decode ? ", decode" : ""));
    AttentionSpec spec = spec_for(c.d, c.d, DType::bf16);
    if (c.dropout)
      spec.dropout_p = 0.1;
    const ir::Config config =
        default_config(spec, sm80, RulesChoice::automatic, 0, /*producer=*/!c.decode);
    EXPECT_EQ(config.block_m, c.block_m);
    EXPECT_EQ(config.waves, 4);
    EXPECT_EQ(config.q_in_lds, c.q_in_lds);
    EXPECT_TRUE(check_fits(spec, config, sm80)) << check_fits(spec, config, sm80).message();
    if (!c.dropout && !c.decode) {
      const ir::Config dq = backward_config(spec, sm80, config, /*dkdv=*/false);
      EXPECT_EQ(dq.block_m, c.d > 96 ? 64 : 128);
    }
  }
  // sm_90's decode kernels keep the sm90 rules' config (warpgroup products).
  EXPECT_TRUE(default_config(spec_for(128, 128, DType::bf16), sm90, RulesChoice::automatic, 0,
                             /*producer=*/false)
                  .q_in_lds);
}

// Config stages 3, the sm90 forward's default at head dim 128 where a tensor map
// describes every tile: a producer warpgroup fills a ring of two K/V copies; the
// consumers wait for each copy's fill and free it after the product that reads it.
TEST(Lowering, Sm90ProducerWarpgroupFillsARing) {
  const Target sm90 = target("sm_90");
  const AttentionSpec spec = spec_for(128, 128, DType::bf16, /*causal=*/true);
  ir::Config config = default_config(spec, sm90);
  EXPECT_EQ(config.stages, 3);
  EXPECT_EQ(config.waves, 8);
  EXPECT_EQ(config.block_n, 128);
  EXPECT_TRUE(config.persistent);
  config.persistent = false; // one tile (Sm90PersistentKernelWalksTheTiles: the walk)
  Expected<Lowered> l = generate(spec, config, sm90);
  ASSERT_TRUE(l) << l.status().message();
  const std::string &k = l->kernel_text;
  EXPECT_EQ(l->block_threads, 384) << "two consumer warpgroups and the producer's";
  EXPECT_EQ(count(k, "FJ_WORKGROUP_SIZE(384)"), 1);
  EXPECT_EQ(count(k, "fj_setmaxnreg_dec<24>();"), 1);
  EXPECT_EQ(count(k, "fj_setmaxnreg_inc<240>();"), 1) << "(65536 - 128 * 24) / 256, in 8s";
  EXPECT_EQ(count(k, "fj_mbar_init(fj_free_bar, 4, kThreads);"), 1) << "K and V, two copies";
  EXPECT_EQ(count(k, "fj_tma_tile("), 3) << "Q before the loop, K and V in the producer";
  EXPECT_EQ(count(k, "fj_tma_wait(fj_free_bar, "), 2) << "the producer, before each refill";
  EXPECT_EQ(count(k, "fj_mbar_arrive(&fj_free_bar["), 3)
      << "the consumers: K after S, V after the O product in the loop and after it";
  // The overlapped loop: block kb's S product in flight beside block kb - 1's O.
  EXPECT_EQ(count(k, "fj_wgmma_wait<1>(); // S is done; O may be in flight"), 1);
  EXPECT_EQ(count(k, "fj_p_prev[kQTiles][8] = {};"), 1);
  const size_t producer = k.find("fj_setmaxnreg_dec");
  ASSERT_NE(producer, std::string::npos);
  EXPECT_EQ(k.find("fj_barrier()", producer), std::string::npos)
      << "no workgroup barrier once the producer has its own loop";
  EXPECT_LT(k.find("wave >= kWaves"), producer);
  EXPECT_GT(k.find("fj_tma_wait(fj_tma_bar, 0, fj_tma_phase); // this thread sees the Q tile"),
            k.find("fj_setmaxnreg_inc"))
      << "only the consumers wait for Q, so the producer's first copies start beside it";
  Expected<ResourceEstimate> e = estimate_resources(spec, config, sm90);
  ASSERT_TRUE(e) << e.status().message();
  EXPECT_EQ(l->lds_bytes, 32768 + 2 * (32768 + 32768) + 9 * 8 + 8 + 8 * 16 * 272)
      << "Q, two copies of K and V, 9 barriers; at a 16-byte offset O's staging rows: 16 per "
         "wave of 128 columns and 8 more";
  EXPECT_EQ(e->lds_o, 8 * 16 * 272);
  EXPECT_EQ(e->lds_bytes(), l->lds_bytes);

  // One consumer warpgroup of two query tiles: two workgroups per SM share the registers.
  ir::Config one = config;
  one.waves = 4;
  one.block_n = 64;
  Expected<Lowered> l1 = generate(spec, one, sm90);
  ASSERT_TRUE(l1) << l1.status().message();
  EXPECT_EQ(l1->block_threads, 256);
  EXPECT_EQ(count(l1->kernel_text, "FJ_WORKGROUP_SIZE_MIN_BLOCKS(256, 2)"), 1);
  EXPECT_EQ(count(l1->kernel_text, "fj_setmaxnreg_inc<232>();"), 1);

  // A partial last panel (head dims 72-112, 160): the producer copies whole
  // 64-column boxes, the columns past the head dim arriving as TMA's zeros.
  for (const int64_t d : {72, 80, 160}) {
    const AttentionSpec partial = spec_for(d, d, DType::bf16, /*causal=*/true);
    ir::Config c = config;
    c.block_n = d < 128 ? 128 : 64;
    Expected<Lowered> lp = generate(partial, c, sm90);
    ASSERT_TRUE(lp) << lp.status().message();
    EXPECT_EQ(lp->block_threads, 384);
    const int64_t panels = (d + 63) / 64;
    EXPECT_EQ(count(lp->kernel_text, fmt::format("TMA, {} panels of 64 columns", panels)), 3);
    Expected<ResourceEstimate> ep = estimate_resources(partial, c, sm90);
    ASSERT_TRUE(ep) << ep.status().message();
    const int64_t rest = panels * 128 * (128 + 4 * c.block_n) + 9 * 8;
    EXPECT_EQ(lp->lds_bytes, (rest + 15) / 16 * 16 + emit::output_stage_size(8, ir::padded(d, 16)))
        << "Q, 2 K, 2 V, 9 barriers, O's staging rows";
    EXPECT_EQ(ep->lds_bytes(), lp->lds_bytes);
  }

  // Under a mask_mod's block range the producer's first warp scans the mask and
  // passes each block's successor and full flag with K's fill (fj_ring_block):
  // the consumers' loop has no scan of its own.
  AttentionSpec masked = spec;
  masked.mask_mod = "q_idx / 256 == kv_idx / 256 || kv_idx < 64";
  const ir::Config mc = default_config(masked, sm90);
  EXPECT_EQ(mc.stages, 3);
  Expected<Lowered> lm = generate(masked, mc, sm90);
  ASSERT_TRUE(lm) << lm.status().message();
  const std::string &km = lm->kernel_text;
  const size_t split = km.find("fj_setmaxnreg_inc");
  ASSERT_NE(split, std::string::npos);
  EXPECT_EQ(count(km, "if (wave == kWaves) { // a warp: the block scan takes 32 lanes"), 1);
  EXPECT_EQ(count(km, "fj_kb_next = fj_next_seen(kb + 1, &fj_kb_full);"), 1);
  EXPECT_LT(km.find("fj_kb_next = fj_next_seen(kb + 1, &fj_kb_full);"), split)
      << "the producer scans; the consumers do not";
  const size_t write = km.find("if (lane == 0) fj_ring_block[fj_fill] = fj_kb_next * 2");
  ASSERT_NE(write, std::string::npos);
  EXPECT_GT(write, km.find("fj_tma_wait(fj_free_bar, ")) << "once the consumers freed the copy";
  EXPECT_LT(write, km.find("fj_tma_tile(", km.find("fj_tma_wait(fj_free_bar, ")))
      << "before K's copy is issued, whose arrive releases it";
  const size_t read = km.find("const int fj_block_info = fj_ring_block[fj_copy];");
  ASSERT_NE(read, std::string::npos);
  EXPECT_GT(read, km.find("the producer's K tile is here", split)) << "after K's fill";
  EXPECT_LT(read, km.find("fj_mbar_arrive(&fj_free_bar[", split)) << "before K is freed";
  Expected<ResourceEstimate> em = estimate_resources(masked, mc, sm90);
  ASSERT_TRUE(em) << em.status().message();
  EXPECT_EQ(count(km, "FJ_DYNAMIC_LDS_ARRAY(int, fj_ring_block, 2, 163912);"), 1)
      << "an int per ring copy, after the barriers";
  EXPECT_EQ(lm->lds_bytes, l->lds_bytes) << "within the 16-byte alignment of O's staging rows";
  EXPECT_EQ(em->lds_bytes(), lm->lds_bytes);

  // Split-KV's partial kernel has no producer: its default config keeps stages 2.
  EXPECT_EQ(default_config(spec, sm90, RulesChoice::automatic, 0, /*producer=*/false).stages, 2);
  // Where a producer cannot copy every tile, the default has none and stages 3 is
  // refused, naming what it needs and the fix.
  AttentionSpec f32 = spec;
  f32.f32_io = true;
  // Head dim 100: rows of 200 bytes, which a tensor map cannot stride over.
  for (const AttentionSpec &s : {spec_for(100, 100, DType::bf16), f32}) {
    SCOPED_TRACE(s.summary());
    ir::Config c = default_config(s, sm90);
    EXPECT_EQ(c.stages, 2);
    c.stages = 3;
    Expected<Lowered> r = generate(s, c, sm90);
    ASSERT_FALSE(r);
    EXPECT_NE(r.status().message().find("config stages = 3 (a producer warpgroup filling a ring of "
                                        "two K/V copies) needs "),
              std::string::npos)
        << r.status().message();
    EXPECT_NE(r.status().message().find(": use stages 2"), std::string::npos);
  }
  ir::Config amd = default_config(spec, target("gfx1201"));
  amd.stages = 3;
  Expected<Lowered> r = generate(spec, amd, target("gfx1201"));
  ASSERT_FALSE(r);
  EXPECT_NE(r.status().message().find("needs the sm90 rules' warpgroup products: use stages 2"),
            std::string::npos)
      << r.status().message();
}

// Config persistent (the default from head dim 72 to 128 where tiles have equal
// work): a workgroup per SM walks the tiles; the producer in its own tile loop,
// its ring count running on across tiles; the consumers issue the next tile's Q
// once every S product of this tile is done.
TEST(Lowering, Sm90PersistentKernelWalksTheTiles) {
  const Target sm90 = target("sm_90");
  const AttentionSpec spec = spec_for(128, 128, DType::bf16, /*causal=*/false);
  const ir::Config config = default_config(spec, sm90);
  EXPECT_TRUE(config.persistent);
  EXPECT_EQ(config.summary(), "block_m=128 block_n=128 waves=8 stages=3 q_in=lds pad_k=16 "
                              "persistent");
  Expected<Lowered> l = generate(spec, config, sm90);
  ASSERT_TRUE(l) << l.status().message();
  EXPECT_EQ(l->persistent_blocks, 1) << "two consumer warpgroups: one workgroup per SM";
  const std::string &k = l->kernel_text;
  EXPECT_EQ(count(k, "const long fj_tiles = long(fj_q_blocks) * heads * batches;"), 1);
  EXPECT_EQ(count(k, "for (long fj_tile = fj_group_id_x(); fj_tile < fj_tiles; fj_tile += "
                     "fj_group_count_x()) {"),
            2)
      << "the producer's and the consumers'";
  EXPECT_EQ(count(k, "const int q_block = int(fj_tile % fj_q_blocks);"), 2);
  EXPECT_EQ(count(k, "int fj_n = 0; // the blocks issued so far, over the tiles"), 1);
  EXPECT_EQ(count(k, "for (int kb = kv_begin; kb < kv_end; ++kb, ++fj_n) {"), 1);
  EXPECT_EQ(count(k, "int fj_copy = 0;"), 1) << "declared once, before the consumers' tiles";
  const size_t producer = k.find("fj_setmaxnreg_dec"), consumers = k.find("fj_setmaxnreg_inc");
  ASSERT_LT(producer, consumers);
  EXPECT_EQ(count(k, "fj_tma_tile(tmap_Q_128"), 2) << "the first tile's Q, then each next one's";
  const size_t first_q = k.find("if (fj_tile == fj_group_id_x()) { // the first tile's Q");
  const size_t next_q = k.find("if (fj_tile + fj_group_count_x() < fj_tiles) { // the next");
  ASSERT_NE(first_q, std::string::npos);
  ASSERT_NE(next_q, std::string::npos);
  EXPECT_GT(first_q, consumers);
  EXPECT_LT(k.rfind("fj_named_barrier(256); // every consumer is done with this tile's Q", next_q),
            next_q);
  EXPECT_LT(next_q, k.find("// the last block's O product")) << "Q arrives during the epilogue";
  EXPECT_EQ(k.find("return;", consumers), std::string::npos) << "no consumer leaves a tile early";
  Expected<ResourceEstimate> e = estimate_resources(spec, config, sm90);
  ASSERT_TRUE(e) << e.status().message();
  EXPECT_EQ(e->lds_bytes(), l->lds_bytes);

  EXPECT_FALSE(l->tile_counter) << "every tile the same work: a static walk";
  EXPECT_EQ(k.find("fj_tile_counter"), std::string::npos);

  // Causal tiles differ in work: after its first, a workgroup's tiles come from
  // the launch's counter. The producer fetches each, hands it to the consumers
  // in a two-slot ring (a fill and a read barrier per slot), and the consumers
  // read it after their tile's KV loop, where they issue the next tile's Q.
  const AttentionSpec causal = spec_for(128, 128, DType::bf16, /*causal=*/true);
  const ir::Config cc = default_config(causal, sm90);
  EXPECT_TRUE(cc.persistent);
  Expected<Lowered> lc = generate(causal, cc, sm90);
  ASSERT_TRUE(lc) << lc.status().message();
  EXPECT_TRUE(lc->tile_counter);
  EXPECT_EQ(lc->params.back().name.rfind("tmap_", 0), 0u) << "tensor maps last";
  EXPECT_EQ(std::count_if(lc->params.begin(), lc->params.end(),
                          [](const KernelParam &p) { return p.name == "fj_tile_counter"; }),
            1);
  const std::string &kc = lc->kernel_text;
  EXPECT_EQ(count(kc, "for (long fj_tile = fj_group_id_x(); fj_tile < fj_tiles; ++fj_j) {"), 2);
  EXPECT_EQ(count(kc, "fj_tile = fj_group_count_x() + long(atomicAdd(fj_tile_counter, 1ull));"), 1)
      << "the producer's one lane fetches";
  EXPECT_EQ(count(kc, "fj_mbar_init(fj_tile_bar, 2, 1);"), 1);
  EXPECT_EQ(count(kc, "fj_mbar_init(fj_tile_bar + 2, 2, kThreads);"), 1);
  const size_t fetch = kc.find("atomicAdd(fj_tile_counter"),
               wait_free = kc.find("fj_tma_wait(fj_tile_bar, 2 + (fj_j & 1), fj_slot_phase);"),
               read = kc.find("fj_tile_next = fj_tile_slot[fj_j & 1];"),
               next_q_c = kc.find("if (fj_tile_next < fj_tiles) { // the next tile's Q");
  ASSERT_NE(read, std::string::npos);
  ASSERT_NE(next_q_c, std::string::npos);
  EXPECT_LT(wait_free, fetch) << "slot j % 2 refilled once the consumers read tile j - 2";
  EXPECT_LT(kc.find("fj_tma_wait(fj_tile_bar, fj_j & 1, fj_slot_phase);"), read);
  EXPECT_LT(read, next_q_c);
  EXPECT_LT(next_q_c, kc.find("// the last block's O product"));
  EXPECT_EQ(count(kc, "fj_tile = fj_tile_next;"), 1);
  EXPECT_EQ(count(kc, "const int q_block = fj_q_blocks - 1 - int(fj_tile % fj_q_blocks);"), 2)
      << "each head's heaviest tile first";
  Expected<ResourceEstimate> ec = estimate_resources(causal, cc, sm90);
  ASSERT_TRUE(ec) << ec.status().message();
  EXPECT_EQ(ec->lds_bytes(), lc->lds_bytes) << "the tile slots and their barriers counted";

  // Not outside 72..128.
  AttentionSpec masked = spec;
  masked.mask_mod = "q_idx / 256 == kv_idx / 256";
  EXPECT_FALSE(default_config(masked, sm90).persistent);
  EXPECT_FALSE(default_config(spec_for(64, 64, DType::bf16), sm90).persistent);
  EXPECT_FALSE(default_config(spec_for(256, 256, DType::bf16), sm90).persistent);
  EXPECT_TRUE(default_config(spec_for(80, 80, DType::bf16), sm90).persistent);
  // Without a producer it is refused, naming the fix.
  ir::Config two = config;
  two.stages = 2;
  EXPECT_FALSE(ir::validate(two));
}

TEST(Lowering, Sm90TakesWarpgroupProductsWhereTheyFit) {
  const Target sm80 = target("sm_80"), sm90 = target("sm_90");
  EXPECT_EQ(sm90.family, Family::sm90);
  ASSERT_NE(rules_for(sm90), nullptr);
  EXPECT_EQ(rules_for(sm90)->name(), "sm90");
  EXPECT_NE(families_with_rules().find("sm90 (sm_90: sm90 rules)"), std::string::npos)
      << families_with_rules();
  AttentionSpec gqa = spec_for(80, 80, DType::bf16, /*causal=*/true);
  AttentionSpec lse = spec_for(128, 128, DType::f16);
  lse.lse = true;
  AttentionSpec window = spec_for(192, 128, DType::bf16);
  window.window = {64, 0};
  for (const AttentionSpec &spec : {gqa, lse, window, spec_for(256, 256, DType::bf16)}) {
    SCOPED_TRACE(spec.summary());
    const ir::Config config = default_config(spec, sm90);
    EXPECT_TRUE(config.q_in_lds);
    Expected<Lowered> wg = generate(spec, config, sm90);
    ASSERT_TRUE(wg) << wg.status().message();
    EXPECT_EQ(wg->rules, "sm90");
    EXPECT_EQ(wg->compile_arch, "sm_90a");
    EXPECT_EQ(count(wg->source, "wgmma.mma_async.sync.aligned.m64n"), 2)
        << "one wrapper for S = Q K^T (A by descriptor), one for O = P V (P in registers)";
    EXPECT_EQ(count(wg->kernel_text, "fj_mma("), 0) << "no warp-wide mma.sync";
    // Each of the Q, K and V tiles is staged by the copy engine (TMA, whole
    // 64-column panels: Sm90CopiesWithTmaWhatATensorMapDescribes) or by
    // threads' cp.async, fenced for wgmma's reads.
    EXPECT_EQ(count(wg->kernel_text, "fj_tma_wait(fj_tma_bar, ") +
                  count(wg->kernel_text, "fj_fence_async_shared();"),
              config.stages == 3 ? 4 : 3)
        << "Q, K and V tiles (V waited for twice in the overlapped loop: in it and after it)";
    if (config.stages == 3) { // a producer warpgroup: Sm90ProducerWarpgroupFillsARing
      EXPECT_EQ(count(wg->kernel_text, "fj_setmaxnreg_dec<"), 1);
    } else if (spec.head_dim_qk < 192 || spec.head_dim_v < 192) { // partial panels, or two
      EXPECT_NE(wg->kernel_text.find("fj_swizzle128(r, d0, "), std::string::npos);
    } else {
      // Dense tensors with 16-byte aligned rows in whole panels: every tile
      // through a tensor map, each thread waiting on the tile's barrier.
      EXPECT_EQ(count(wg->kernel_text, "fj_tma_init(fj_tma_bar, 3);"), 1);
      EXPECT_EQ(count(wg->kernel_text, "fj_stage8("), 0) << "no thread copies a tile";
      std::vector<std::string> maps;
      for (const KernelParam &p : wg->params)
        if (p.kind == KernelParam::Kind::tensor_map) {
          ASSERT_TRUE(p.map_of.has_value());
          maps.push_back(fmt::format("{}:{}:{}", p.name, p.map_of->name, p.box_rows));
        }
      EXPECT_EQ(fmt::format("{}", fmt::join(maps, " ")),
                fmt::format("tmap_Q_{0}:Q:{0} tmap_K_{1}:K:{1} tmap_V_{1}:V:{1}", config.block_m,
                            config.block_n));
      EXPECT_EQ(wg->params.back().c_type, "const __grid_constant__ fj_tensor_map");
    }

    // Q in registers: the sm80 rules, as on sm_80.
    ir::Config regs = default_config(spec, sm80);
    regs.q_in_lds = false;
    regs.block_m = 16 * regs.waves; // one query tile per warp: Q's registers fit
    Expected<Lowered> a = generate(spec, regs, sm80), b = generate(spec, regs, sm90);
    ASSERT_TRUE(a) << a.status().message();
    ASSERT_TRUE(b) << b.status().message();
    EXPECT_EQ(b->rules, "sm80");
    EXPECT_EQ(b->compile_arch, "sm_90");
    EXPECT_EQ(b->mma->family, Family::sm90);
    EXPECT_EQ(b->mma->mnemonic, a->mma->mnemonic);
    std::string expected = a->source;
    const std::string from = " for sm_80 (", to = " for sm_90 (";
    ASSERT_EQ(count(expected, from), 1);
    expected.replace(expected.find(from), from.size(), to);
    EXPECT_TRUE(b->source == expected) << "sm_90 differs from sm_80 past the target's name";
    EXPECT_EQ(b->lds_bytes, a->lds_bytes);
  }
  // The backward's programs on sm_90: the sm90 rules with their own block (one
  // warpgroup of 64 rows, the row operands in LDS; dQ above head dim 128 two
  // warpgroups of 128 rows over 32-key blocks); on sm_80 the sm80 rules.
  for (const int64_t d : {64, 80, 128, 192, 256}) {
    const AttentionSpec spec = spec_for(d, d, DType::bf16, /*causal=*/true);
    for (bool dkdv : {false, true}) {
      SCOPED_TRACE(fmt::format("head dim {}, {}", d, dkdv ? "dK/dV" : "dQ"));
      for (const Target *t : {&sm90, &sm80}) {
        const ir::Config c = backward_config(spec, *t, default_config(spec, *t), dkdv);
        auto p = dkdv ? ir::build_backward_dkdv(spec, c) : ir::build_backward_dq(spec, c);
        ASSERT_TRUE(p) << p.status().message();
        Expected<Lowered> l = lower(*p, *t);
        ASSERT_TRUE(l) << l.status().message();
        EXPECT_EQ(l->rules, t == &sm90 ? "sm90" : "sm80");
        if (t == &sm90) {
          const bool wide_dq = !dkdv && d > 128;
          EXPECT_EQ(c.block_m, wide_dq ? 128 : 64);
          EXPECT_EQ(c.waves, wide_dq ? 8 : 4);
          EXPECT_TRUE(c.q_in_lds);
          EXPECT_EQ(c.block_n, dkdv ? (d <= 128 ? 64 : 32) : (d <= 64 ? 128 : wide_dq ? 32 : 64));
          EXPECT_EQ(c.stages, 2); // the next block prefetched
          // dK and dV in one loop where both fit the registers, else two passes.
          EXPECT_EQ(c.dkdv_passes, dkdv && d == 256 ? 2 : 1);
          if (c.dkdv_passes == 1) // two passes: dV's loop takes the software pipeline
            EXPECT_NE(l->source.find("// Block prefetch:"), std::string::npos);
          else
            EXPECT_NE(l->source.find("// Software pipeline:"), std::string::npos);
          EXPECT_NE(l->source.find("wgmma.mma_async"), std::string::npos);
          EXPECT_LE(l->lds_bytes, t->lds_bytes);
        }
      }
    }
  }
}

// CDNA has rules for 32- and 16-query tiles. The default takes 32 where
// head_dim_v needs no padding past 16, whatever seqlen_q (a kernel serves every
// length); a config's mma_m (or its block sizes) picks one; misfits are named.
TEST(Lowering, CdnaChoosesItsQueryTileBySpecAndConfig) {
  struct Choice {
    const char *arch;
    int64_t dv, seqlen_q, mma_m;
    int m, k; // the instruction's M and k
  };
  const Choice choices[] = {
      {"gfx942", 128, 113, 0, 32, 8},   {"gfx90a", 64, 113, 0, 32, 8},
      {"gfx950", 128, 113, 0, 32, 16},  {"gfx942", 80, 113, 0, 16, 16},
      {"gfx950", 80, 113, 0, 16, 32},   {"gfx942", 128, 16, 0, 32, 8},
      {"gfx942", 128, 113, 16, 16, 16}, {"gfx942", 80, 113, 32, 32, 8},
      {"gfx950", 72, 113, 32, 32, 16},
  };
  for (const Choice &c : choices) {
    SCOPED_TRACE(fmt::format("{} dv {} seqlen_q {} mma_m {}", c.arch, c.dv, c.seqlen_q, c.mma_m));
    const Target t = target(c.arch);
    AttentionSpec spec = make_spec(1, 4, 2, c.seqlen_q, 203, c.dv, c.dv, DType::bf16);
    const ir::Config config = default_config(spec, t, RulesChoice::automatic, c.mma_m);
    Expected<Lowered> l = generate(spec, config, t);
    ASSERT_TRUE(l) << l.status().message();
    ASSERT_NE(l->mma, nullptr);
    EXPECT_EQ(l->mma->m(), c.m);
    EXPECT_EQ(l->mma->k(), c.k);
    EXPECT_EQ(l->rules, c.m == 32 ? "cdna32" : "cdna");
    EXPECT_EQ(config.block_m % (c.m * config.waves), 0);
    // Head dims padded so the 32-entry fragments tile head_dim_v.
    EXPECT_EQ(ir::padded(c.dv, config.pad_k) % c.m, 0) << config.summary();
    EXPECT_NE(l->source.find(fmt::format("(wave * kQTiles + qt) * {} + r", c.m)),
              std::string::npos);
  }

  const Target t = target("gfx942");
  const AttentionSpec spec = spec_for(128, 128, DType::bf16);
  // No mma_m: the first rules whose tiles divide the config.
  ir::Config c = default_config(spec, t);
  EXPECT_EQ(c.mma_m, 32);
  c.mma_m = 0;
  c.block_m = 64;
  Expected<Lowered> l = generate(spec, c, t);
  ASSERT_TRUE(l) << l.status().message();
  EXPECT_EQ(l->rules, "cdna");
  // mma_m 32 with a block too small for 4 waves of 32 queries.
  c.mma_m = 32;
  std::string error = generate_error(spec, c, t);
  EXPECT_NE(error.find("block_m (64) must be a multiple of 32 x waves (4)"), std::string::npos)
      << error;
  // mma_m 32 with head_dim_v 80 padded to 16 only.
  const AttentionSpec d80 = spec_for(80, 80, DType::bf16);
  c = default_config(d80, t, RulesChoice::automatic, 32);
  EXPECT_EQ(c.pad_k, 32);
  c.pad_k = 16;
  error = generate_error(d80, c, t);
  EXPECT_NE(error.find("use pad_k 32"), std::string::npos) << error;
  // Targets without 32-query tiles say which they have; so does simt.
  for (const char *arch : {"gfx1201", "sm_90"}) {
    const Target other = target(arch);
    error = generate_error(spec, default_config(spec, other, RulesChoice::automatic, 32), other);
    EXPECT_NE(error.find("config mma_m = 32"), std::string::npos) << error;
    EXPECT_NE(error.find("16-query tiles only"), std::string::npos) << error;
  }
  Expected<Lowered> simt =
      generate(spec, default_config(spec, t, RulesChoice::simt, 32), t, RulesChoice::simt);
  ASSERT_FALSE(simt);
  EXPECT_NE(simt.status().message().find("the simt rules use 16-query tiles"), std::string::npos)
      << simt.status().message();
  // Not a tile at all.
  c = default_config(spec, t);
  c.mma_m = 8;
  error = generate_error(spec, c, t);
  EXPECT_NE(error.find("mma_m = 8"), std::string::npos) << error;
}

TEST(Lowering, SimtRulesAreForAmdTargetsOnly) {
  const AttentionSpec spec = spec_for(64, 64, DType::bf16);
  for (const char *arch : {"gfx1100", "gfx1201", "gfx90a", "gfx950"}) {
    const Target t = target(arch);
    Expected<Lowered> l =
        generate(spec, default_config(spec, t, RulesChoice::simt), t, RulesChoice::simt);
    ASSERT_TRUE(l) << arch << ": " << l.status().message();
    EXPECT_EQ(l->rules, "simt");
    EXPECT_EQ(l->mma, nullptr);
    EXPECT_NE(l->rules_note, "");
    EXPECT_EQ(l->kernel_text.find("__builtin_amdgcn_"), std::string::npos);
    EXPECT_EQ(l->kernel_text.find("fj_mma("), std::string::npos);
  }
  const Target sm = target("sm_90");
  Expected<Lowered> simt = generate(spec, default_config(spec, sm), sm, RulesChoice::simt);
  ASSERT_FALSE(simt);
  EXPECT_NE(simt.status().message().find("sm_90"), std::string::npos) << simt.status().message();
}

TEST(Lowering, UnknownArchListsTheSupportedOnes) {
  for (const char *arch : {"gfx9999", "gfx1202", "sm_75"}) {
    Expected<Target> t = parse_target(arch);
    ASSERT_FALSE(t) << arch;
    const std::string &error = t.status().message();
    EXPECT_NE(error.find(arch), std::string::npos) << error;
    for (std::string_view supported : supported_archs())
      EXPECT_NE(error.find(supported), std::string::npos) << supported << " in: " << error;
  }
}

/// The numbers an error names: "(\d+) <what>" and "<limit words> (\d+)".
std::vector<int64_t> numbers_in(const std::string &text) {
  std::vector<int64_t> out;
  static const std::regex number(R"(\d+)");
  for (auto it = std::sregex_iterator(text.begin(), text.end(), number);
       it != std::sregex_iterator(); ++it)
    out.push_back(std::stoll(it->str()));
  return out;
}

bool names(const std::string &error, int64_t value) {
  const std::vector<int64_t> n = numbers_in(error);
  return std::find(n.begin(), n.end(), value) != n.end();
}

TEST(Lowering, LdsOverflowNamesTheBytesAndTheLimit) {
  const Target t = target("gfx1201");
  const AttentionSpec spec = spec_for(512, 512, DType::bf16);
  ir::Config c = default_config(spec, t);
  c.block_n = 128;
  const std::string error = generate_error(spec, c, t);
  EXPECT_NE(error.find("LDS"), std::string::npos) << error;
  // K tile 128 x (512 + 8) plus V^T tile 512 x (128 + 8), 2 bytes each.
  EXPECT_TRUE(names(error, 2 * (128 * (512 + 8) + 512 * (128 + 8)))) << error;
  EXPECT_TRUE(names(error, t.lds_bytes)) << error;
  EXPECT_TRUE(names(error, 128)) << error; // the block_n to shrink
  EXPECT_NE(error.find("gfx1201"), std::string::npos) << error;

  // The same spec with block_n 16 fits in LDS (the VGPR check then decides).
  c.block_n = 16;
  EXPECT_TRUE(check_fits(spec_for(512, 64, DType::bf16), c, t).message().find("LDS") ==
              std::string::npos);
}

TEST(Lowering, VgprBudgetNamesTheEstimateAndTheBudget) {
  const Target t = target("gfx1201");
  const AttentionSpec spec = spec_for(64, 512, DType::bf16);
  const std::string error = generate_error(spec, default_config(spec, t), t);
  static const std::regex shape(R"(need about (\d+) VGPRs.* budget of (\d+))");
  std::smatch m;
  ASSERT_TRUE(std::regex_search(error, m, shape)) << error;
  const int64_t need = std::stoll(m[1]), budget = std::stoll(m[2]);
  EXPECT_GT(need, budget) << error;
  EXPECT_LE(budget, t.max_vgprs) << error;
  EXPECT_TRUE(names(error, 512)) << error; // the head dim at fault
  EXPECT_NE(error.find("gfx1201"), std::string::npos) << error;
}

TEST(Lowering, WorkgroupLimitNamesTheWavesAndTheLimit) {
  const Target t = target("gfx1201");
  const AttentionSpec spec = spec_for(64, 64, DType::bf16);
  ir::Config c = default_config(spec, t);
  c.waves = 64;
  c.block_m = 16 * c.waves;
  const std::string error = generate_error(spec, c, t);
  EXPECT_TRUE(names(error, 64)) << error;
  EXPECT_TRUE(names(error, t.max_workgroup_size)) << error;
  EXPECT_NE(error.find("workgroup"), std::string::npos) << error;
}

TEST(Lowering, DefaultConfigFitsEveryHeadDim) {
  for (const char *arch : {"gfx1200", "gfx1201"})
    for (int64_t d : {16, 40, 64, 72, 80, 96, 100, 128, 160, 192, 256}) {
      const Target t = target(arch);
      const AttentionSpec spec = spec_for(d, d, DType::bf16);
      EXPECT_TRUE(check_fits(spec, default_config(spec, t), t).is_ok()) << arch << " d=" << d;
    }
}

/// The static LDS the kernel declares: sum of FJ_LDS_ARRAY(fj_bits, name, count).
int64_t declared_lds_bytes(const std::string &source) {
  static const std::regex array(R"(FJ_LDS_ARRAY\(fj_bits, \w+, (\d+)\);)");
  int64_t bytes = 0;
  for (auto it = std::sregex_iterator(source.begin(), source.end(), array);
       it != std::sregex_iterator(); ++it)
    bytes += 2 * std::stoll((*it)[1]);
  return bytes;
}

TEST(Lowering, LaunchGeometryMatchesTheKernel) {
  struct Case {
    int64_t seqlen_q, block_m, waves, head_dim;
  };
  // Head dims 64 (vector loads), 100 (scalar loads), 192/256 (large tiles,
  // one 16-query tile per wave so the registers fit).
  const Case cases[] = {{113, 64, 4, 64},  {64, 64, 4, 100},  {1, 64, 2, 64},   {300, 32, 1, 100},
                        {257, 128, 4, 64}, {113, 64, 4, 192}, {77, 32, 2, 256}, {1000, 16, 1, 100}};
  for (const char *arch : {"gfx1200", "gfx1201"})
    for (const Case &k : cases) {
      const Target t = target(arch);
      AttentionSpec spec = make_spec(/*batch=*/3, /*heads=*/6, /*kv_heads=*/3, k.seqlen_q,
                                     /*seqlen_k=*/77, k.head_dim, k.head_dim, DType::bf16);
      ir::Config c = default_config(spec, t);
      c.block_m = k.block_m;
      c.waves = k.waves;
      SCOPED_TRACE(fmt::format("{} {} {}", arch, spec.summary(), c.summary()));
      Expected<Lowered> l = generate(spec, c, t);
      ASSERT_TRUE(l) << l.status().message();
      const auto grid = ir::grid_size(l->grid, ir::bind_attention(spec));
      ASSERT_TRUE(grid) << grid.status().message();
      EXPECT_EQ((*grid)[0], (k.seqlen_q + k.block_m - 1) / k.block_m);
      EXPECT_EQ((*grid)[1], 6);
      EXPECT_EQ((*grid)[2], 3);
      EXPECT_EQ(l->block_threads, k.waves * t.wave_size);
      EXPECT_NE(l->source.find(fmt::format("FJ_WORKGROUP_SIZE({})", l->block_threads)),
                std::string::npos);
      EXPECT_NE(
          l->source.find(fmt::format("constexpr int kQTiles = {};", k.block_m / (16 * k.waves))),
          std::string::npos);
      EXPECT_GT(l->lds_bytes, 0);
      EXPECT_LE(l->lds_bytes, t.lds_bytes);
      EXPECT_EQ(l->lds_bytes, declared_lds_bytes(l->source));
      EXPECT_NE(l->source.find("void " + l->kernel_name + "("), std::string::npos);
      // 128-bit loads need 16-byte aligned rows: 8-element multiples of bf16.
      EXPECT_EQ(l->pointer_alignment, k.head_dim % 8 == 0 ? 16 : k.head_dim % 4 == 0 ? 8 : 2);
    }
}

TEST(Lowering, OddHeadDimsTakeTheScalarPathAndPadInRegisters) {
  const Lowered l = generate_ok(spec_for(100, 100, DType::bf16), target("gfx1201"));
  EXPECT_NE(l.source.find("constexpr bool kVecLoads = false;"), std::string::npos);
  EXPECT_NE(l.source.find("constexpr int kDimQK = 100;"), std::string::npos);
  // 100 padded to 112 in registers: the Q operand is 7 fragments per 16-query tile.
  static const std::regex q_fragments(R"(fj_bits8 \w+\[kQTiles\]\[7\];)");
  EXPECT_TRUE(std::regex_search(l.source, q_fragments));
  EXPECT_NE(l.source.find("K tile 64x112"), std::string::npos);
  // 100 = 4 x 25: rows are 8-byte runs, copied into LDS 64 bits at a time.
  EXPECT_NE(l.source.find("constexpr bool kVec4Loads = true;"), std::string::npos);
  EXPECT_EQ(l.pointer_alignment, 8);
}

TEST(Lowering, DisagreeingMasksAreRejected) {
  const Target t = target("gfx1201");
  const AttentionSpec spec = spec_for(64, 64, DType::bf16, /*causal=*/true);
  Expected<ir::Program> p = ir::build_attention(spec, default_config(spec, t));
  ASSERT_TRUE(p) << p.status().message();
  ASSERT_TRUE(lower(*p, t)) << "the unmodified program lowers";

  // The loop skips blocks as causal, the mask op inside it says not causal.
  int changed = 0;
  for (ir::Op &op : p->body)
    if (op.kind == ir::OpKind::For)
      for (ir::Op &inner : op.body)
        if (inner.kind == ir::OpKind::Mask) {
          inner.attrs["causal"] = int64_t{0};
          ++changed;
        }
  ASSERT_EQ(changed, 1);
  ASSERT_TRUE(ir::verify(*p).is_ok()) << "the verifier does not check agreement; lower() must";
  Expected<Lowered> l = lower(*p, t);
  ASSERT_FALSE(l);
  EXPECT_NE(l.status().message().find("masks disagree"), std::string::npos) << l.status().message();

  // A window on the mask only is rejected the same way.
  for (ir::Op &op : p->body)
    if (op.kind == ir::OpKind::For)
      for (ir::Op &inner : op.body)
        if (inner.kind == ir::OpKind::Mask) {
          inner.attrs["causal"] = int64_t{1};
          inner.attrs["window_left"] = int64_t{32};
        }
  l = lower(*p, t);
  ASSERT_FALSE(l);
  EXPECT_NE(l.status().message().find("masks disagree"), std::string::npos) << l.status().message();
}

} // namespace
} // namespace flashjit::lowering
