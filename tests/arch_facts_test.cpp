// Arch facts in one place (issue 12, item 5): for every supported processor, the
// facts the lowering (lowering::Target) and the compilers (vendor, wave-size flag,
// wave sizes they accept, VGPR granule and SGPR rule of the occupancy) use are the
// row of target/arch.h, and the rows agree with each other.
#include "compiler/code_object.h"
#include "compiler/rtc_compiler.h"
#include "compiler/select.h"
#include "lowering/target.h"
#include "target/arch.h"
#ifdef FLASHJIT_HAVE_LLVM
#include "compiler/llvm_compiler.h"
#endif

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

namespace flashjit {
namespace {

const target::Arch &row_of(std::string_view arch) {
  const target::Arch *row = target::find_arch(arch);
  EXPECT_NE(row, nullptr) << arch;
  return row ? *row : target::archs().front();
}

bool has(const std::vector<std::string> &args, std::string_view arg) {
  return std::find(args.begin(), args.end(), arg) != args.end();
}

compiler::CompileOptions options(std::string_view arch, int wave_size) {
  compiler::CompileOptions o;
  o.arch = std::string(arch);
  o.wave_size = wave_size;
  return o;
}

TEST(ArchFacts, SupportedArchsAreTheRows) {
  std::vector<std::string_view> rows;
  for (const target::Arch &row : target::archs())
    rows.push_back(row.name);
  EXPECT_EQ(lowering::supported_archs(), rows);
  EXPECT_EQ(target::find_arch("gfx1030"), nullptr);
  EXPECT_EQ(target::processor_of("gfx90a:sramecc+:xnack-"), "gfx90a");
}

TEST(ArchFacts, TargetCarriesTheRow) {
  for (std::string_view arch : lowering::supported_archs()) {
    SCOPED_TRACE(std::string(arch));
    const target::Arch &row = row_of(arch);
    Expected<lowering::Target> t = lowering::parse_target(arch);
    ASSERT_TRUE(t) << t.status().message();
    EXPECT_EQ(t->family, row.family);
    EXPECT_EQ(t->family_name(), target::family_name(row.family));
    EXPECT_EQ(t->is_nvidia(), row.vendor() == target::Vendor::nvidia);
    EXPECT_EQ(t->wave_size, row.wave_size());
    EXPECT_EQ(t->lds_bytes, row.lds_bytes);
    EXPECT_EQ(t->lds_bytes_per_cu, row.lds_bytes_per_cu);
    EXPECT_EQ(t->max_vgprs, row.facts().max_vgprs);
    EXPECT_EQ(t->vgpr_file_per_simd, row.vgpr_file_per_simd);
    EXPECT_EQ(t->vgpr_alloc_granule, row.vgpr_alloc_granule(row.wave_size()));
    EXPECT_EQ(t->max_waves_per_simd, row.facts().max_waves_per_simd);
    EXPECT_EQ(t->max_workgroup_size, target::kMaxWorkgroupSize);
  }
}

// The rows against each other and against the processor names (the one place
// a name is read, to check the table rather than to derive from it).
TEST(ArchFacts, RowsAreConsistent) {
  for (const target::Arch &row : target::archs()) {
    SCOPED_TRACE(std::string(row.name));
    EXPECT_EQ(target::vendor_of_name(row.name), row.vendor());
    EXPECT_TRUE(row.runs_wave(row.wave_size()));
    EXPECT_GT(row.vgpr_alloc_granule(row.wave_size()), 0);
    if (row.vendor() == target::Vendor::amd) {
      // gfx<generation><two more characters>: gfx1201 -> 12, gfx90a -> 9.
      EXPECT_EQ(row.name.substr(0, 3 + std::to_string(row.generation).size()),
                "gfx" + std::to_string(row.generation));
      EXPECT_EQ(row.name.size(), 3 + std::to_string(row.generation).size() + 2);
      // gfx9 (CDNA) is wave64 only and its SGPRs limit occupancy; RDNA runs both.
      EXPECT_EQ(row.runs_wave(32), row.generation >= 10);
      EXPECT_TRUE(row.runs_wave(64));
      EXPECT_EQ(row.facts().sgprs_limit_occupancy, row.generation < 10);
      EXPECT_EQ(row.wave_size(), row.generation < 10 ? 64 : 32);
      // An RDNA workgroup processor is two CUs with one LDS, twice what a
      // workgroup addresses; a CDNA workgroup may take its CU's whole LDS.
      EXPECT_EQ(row.lds_bytes_per_cu, row.generation < 10 ? row.lds_bytes : 2 * row.lds_bytes);
      EXPECT_FALSE(row.facts().has_wgmma);
      EXPECT_FALSE(row.facts().has_tma);
    } else {
      // sm_<generation><minor>: sm_90 -> 9.
      EXPECT_EQ(row.name.substr(0, 4), "sm_" + std::to_string(row.generation));
      EXPECT_EQ(row.wave_size(), target::kNvidiaWarpSize);
      EXPECT_FALSE(row.runs_wave(64));
      EXPECT_FALSE(row.facts().sgprs_limit_occupancy);
      // A block opts into all of its SM's shared memory but the 1 KiB CUDA keeps.
      EXPECT_EQ(row.lds_bytes_per_cu, row.lds_bytes + 1024);
      // Hopper (sm_9x) brought the warpgroup MMA and the tensor memory accelerator.
      EXPECT_EQ(row.facts().has_wgmma, row.generation == 9);
      EXPECT_EQ(row.facts().has_tma, row.generation == 9);
    }
  }
}

// Hopper is a family of its own (the row an sm90 rule set will stand on), not a
// row of the sm80 family; Ampere and Ada stay sm80.
TEST(ArchFacts, Sm90IsItsOwnFamily) {
  EXPECT_EQ(row_of("sm_80").family, target::Family::sm80);
  EXPECT_EQ(row_of("sm_86").family, target::Family::sm80);
  EXPECT_EQ(row_of("sm_89").family, target::Family::sm80);
  const target::Arch &hopper = row_of("sm_90");
  EXPECT_EQ(hopper.family, target::Family::sm90);
  EXPECT_EQ(target::family_name(hopper.family), "sm90");
  EXPECT_EQ(hopper.vendor(), target::Vendor::nvidia);
  EXPECT_EQ(hopper.lds_bytes, 227 * 1024);
  EXPECT_EQ(hopper.lds_bytes_per_cu, 228 * 1024);
  // 64K 32-bit registers per SM: 4 sub-partitions of 512 per lane of a warp.
  EXPECT_EQ(4 * hopper.vgpr_file_per_simd * hopper.wave_size(), 64 * 1024);
  EXPECT_TRUE(hopper.facts().has_wgmma);
  EXPECT_TRUE(hopper.facts().has_tma);
  EXPECT_FALSE(row_of("sm_80").facts().has_wgmma);
  EXPECT_FALSE(row_of("sm_80").facts().has_tma);
  // Every NVIDIA family shares the warp, the register limit and the occupancy rules.
  const target::FamilyFacts &ampere = target::family_facts(target::Family::sm80);
  EXPECT_EQ(hopper.facts().wave_size, ampere.wave_size);
  EXPECT_EQ(hopper.facts().max_vgprs, ampere.max_vgprs);
  EXPECT_EQ(hopper.facts().max_waves_per_simd, ampere.max_waves_per_simd);
}

TEST(ArchFacts, CompilersSeeTheRowsVendor) {
  for (std::string_view arch : lowering::supported_archs()) {
    SCOPED_TRACE(std::string(arch));
    Expected<compiler::Vendor> v = compiler::target_vendor(arch);
    ASSERT_TRUE(v) << v.status().message();
    EXPECT_EQ(*v, row_of(arch).vendor());
  }
}

// hiprtc (and LLVM's driver) get -mwavefrontsize64 exactly when the wave size
// differs from the row's, and refuse a wave size the row cannot run.
TEST(ArchFacts, CompileArgsFollowTheRowsWaveSizes) {
  for (std::string_view arch : lowering::supported_archs()) {
    SCOPED_TRACE(std::string(arch));
    const target::Arch &row = row_of(arch);
    const compiler::RtcKind kind =
        row.vendor() == target::Vendor::amd ? compiler::RtcKind::hiprtc : compiler::RtcKind::nvrtc;
    for (int wave : {32, 64}) {
      auto args = compiler::RtcCompiler::compile_args(kind, options(arch, wave));
      ASSERT_EQ(bool(args), row.runs_wave(wave)) << (args ? "" : args.status().message());
      if (row.vendor() != target::Vendor::amd)
        continue;
      if (!args) {
        EXPECT_NE(args.status().message().find(
                      fmt::format("gfx{} runs wave{} only", row.generation, row.wave_size())),
                  std::string::npos)
            << args.status().message();
        continue;
      }
      EXPECT_TRUE(has(*args, "--offload-arch=" + std::string(arch)));
      EXPECT_EQ(has(*args, "-mwavefrontsize64"), wave != row.wave_size());
#ifdef FLASHJIT_HAVE_LLVM
      EXPECT_EQ(has(compiler::LlvmCompiler::driver_args(options(arch, wave)), "-mwavefrontsize64"),
                wave != row.wave_size());
#endif
    }
  }
  auto unknown =
      compiler::RtcCompiler::compile_args(compiler::RtcKind::hiprtc, options("gfx1030", 32));
  ASSERT_FALSE(unknown);
  EXPECT_NE(unknown.status().message().find("unknown AMDGPU processor 'gfx1030': supported are "
                                            "gfx1100"),
            std::string::npos)
      << unknown.status().message();
}

// The occupancy the compilers report (the row's VGPR granule and SGPR rule) is
// the one the lowering plans with (Target::max_waves_for_vgprs), for every VGPR
// count a kernel can have.
TEST(ArchFacts, CompilerOccupancyIsTheTargets) {
  for (std::string_view arch : lowering::supported_archs()) {
    const target::Arch &row = row_of(arch);
    if (row.vendor() != target::Vendor::amd)
      continue;
    SCOPED_TRACE(std::string(arch));
    lowering::Target t = *lowering::parse_target(arch);
    for (int vgprs = 1; vgprs <= t.max_vgprs; ++vgprs) {
      compiler::ResourceReport r;
      r.vgprs = vgprs;
      r.sgprs = 32; // below every SGPR limit
      r.wavefront_size = row.wave_size();
      r.max_flat_workgroup_size = 256;
      r.vgpr_alloc_granule = row.vgpr_alloc_granule(r.wavefront_size);
      int waves = compiler::occupancy(r, row.facts().sgprs_limit_occupancy, t.vgpr_file_per_simd,
                                      t.max_waves_per_simd, t.lds_bytes);
      ASSERT_EQ(waves, t.max_waves_for_vgprs(vgprs)) << vgprs << " VGPRs";
    }
  }
}

} // namespace
} // namespace flashjit
