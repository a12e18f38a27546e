// parse_target: the supported processors, target-ID features and the hardware
// numbers each Target carries.
#include "lowering/target.h"

#include <gtest/gtest.h>

namespace flashjit::lowering {
namespace {

Target parse_ok(std::string_view id) {
  Expected<Target> t = parse_target(id);
  EXPECT_TRUE(t) << id << ": " << (t ? "" : t.status().message());
  return t ? t.take() : Target{};
}

std::string parse_error(std::string_view id) {
  Expected<Target> t = parse_target(id);
  EXPECT_FALSE(t) << id << " should not parse";
  return t ? std::string() : t.status().message();
}

TEST(Target, SupportedArchsInOrder) {
  std::vector<std::string_view> expected = {"gfx1100", "gfx1101", "gfx1102", "gfx1103", "gfx1150",
                                            "gfx1151", "gfx1200", "gfx1201", "gfx90a",  "gfx942",
                                            "gfx950",  "sm_80",   "sm_86",   "sm_89",   "sm_90"};
  EXPECT_EQ(supported_archs(), expected);
}

struct ArchFacts {
  std::string_view arch;
  Family family;
  int wave_size;
  int lds_bytes;
  int lds_bytes_per_cu;
  int max_vgprs;
  int vgpr_file_per_simd;
  int vgpr_alloc_granule;
  int max_waves_per_simd;
};

// Sources: target/arch.cpp (LLVM AMDGPUBaseInfo.cpp / AMDGPU.td, clang 22 checks,
// the ISA guides, the CUDA programming guide).
constexpr ArchFacts kFacts[] = {
    {"gfx1100", Family::gfx11, 32, 65536, 131072, 256, 1536, 24, 16},
    {"gfx1101", Family::gfx11, 32, 65536, 131072, 256, 1536, 24, 16},
    {"gfx1102", Family::gfx11, 32, 65536, 131072, 256, 1024, 16, 16},
    {"gfx1103", Family::gfx11, 32, 65536, 131072, 256, 1024, 16, 16},
    {"gfx1150", Family::gfx11, 32, 65536, 131072, 256, 1024, 16, 16},
    {"gfx1151", Family::gfx11, 32, 65536, 131072, 256, 1536, 24, 16},
    {"gfx1200", Family::gfx12, 32, 65536, 131072, 256, 1536, 24, 16},
    {"gfx1201", Family::gfx12, 32, 65536, 131072, 256, 1536, 24, 16},
    {"gfx90a", Family::cdna2, 64, 65536, 65536, 512, 512, 8, 8},
    {"gfx942", Family::cdna3, 64, 65536, 65536, 512, 512, 8, 8},
    {"gfx950", Family::cdna4, 64, 163840, 163840, 512, 512, 8, 8},
    // NVIDIA: a warp, the opt-in dynamic shared memory of a block and the shared
    // memory of an SM, 255 registers per thread, 64K registers per SM.
    {"sm_80", Family::sm80, 32, 163 * 1024, 164 * 1024, 255, 512, 8, 16},
    {"sm_86", Family::sm80, 32, 99 * 1024, 100 * 1024, 255, 512, 8, 16},
    {"sm_89", Family::sm80, 32, 99 * 1024, 100 * 1024, 255, 512, 8, 16},
    {"sm_90", Family::sm90, 32, 227 * 1024, 228 * 1024, 255, 512, 8, 16},
};

TEST(Target, ParsesEverySupportedArch) {
  ASSERT_EQ(std::size(kFacts), supported_archs().size());
  for (const ArchFacts &f : kFacts) {
    SCOPED_TRACE(std::string(f.arch));
    Target t = parse_ok(f.arch);
    EXPECT_EQ(t.arch, f.arch);
    EXPECT_EQ(t.features, "");
    EXPECT_EQ(t.target_id(), f.arch);
    EXPECT_FALSE(t.xnack.has_value());
    EXPECT_FALSE(t.sramecc.has_value());
    EXPECT_EQ(t.family, f.family);
    EXPECT_EQ(t.wave_size, f.wave_size);
    EXPECT_EQ(t.lds_bytes, f.lds_bytes);
    EXPECT_EQ(t.lds_bytes_per_cu, f.lds_bytes_per_cu);
    EXPECT_EQ(t.max_vgprs, f.max_vgprs);
    EXPECT_EQ(t.vgpr_file_per_simd, f.vgpr_file_per_simd);
    EXPECT_EQ(t.vgpr_alloc_granule, f.vgpr_alloc_granule);
    EXPECT_EQ(t.max_waves_per_simd, f.max_waves_per_simd);
    EXPECT_EQ(t.max_workgroup_size, 1024);
    EXPECT_FALSE(t.matrix_instrs.empty());
  }
}

TEST(Target, WaveSizePerFamily) {
  EXPECT_EQ(parse_ok("gfx1100").wave_size, 32);
  EXPECT_EQ(parse_ok("gfx1151").wave_size, 32);
  EXPECT_EQ(parse_ok("gfx1201").wave_size, 32);
  EXPECT_EQ(parse_ok("gfx90a").wave_size, 64);
  EXPECT_EQ(parse_ok("gfx942").wave_size, 64);
  EXPECT_EQ(parse_ok("gfx950").wave_size, 64);
}

TEST(Target, FamilyNames) {
  EXPECT_EQ(family_name(Family::gfx11), "gfx11");
  EXPECT_EQ(family_name(Family::gfx12), "gfx12");
  EXPECT_EQ(family_name(Family::cdna2), "cdna2");
  EXPECT_EQ(family_name(Family::cdna3), "cdna3");
  EXPECT_EQ(family_name(Family::cdna4), "cdna4");
  EXPECT_EQ(family_name(Family::sm80), "sm80");
  EXPECT_EQ(family_name(Family::sm90), "sm90");
  EXPECT_EQ(parse_ok("gfx1201").family_name(), "gfx12");
  EXPECT_EQ(parse_ok("sm_89").family_name(), "sm80");
  EXPECT_EQ(parse_ok("sm_90").family_name(), "sm90");
}

// Occupancies reported by clang 22.1.8's kernel-resource-usage remark for kernels
// pinned to N VGPRs (inline asm clobbering v<N-1>).
TEST(Target, OccupancyMatchesClang) {
  struct Case {
    std::string_view arch;
    int vgprs;
    int waves;
  };
  const Case cases[] = {
      {"gfx1100", 24, 16},  {"gfx1100", 26, 16}, {"gfx1100", 97, 12}, {"gfx1100", 128, 10},
      {"gfx1100", 256, 5},  {"gfx1102", 97, 9},  {"gfx1102", 128, 8}, {"gfx1102", 256, 4},
      {"gfx1103", 128, 8},  {"gfx1150", 128, 8}, {"gfx1151", 97, 12}, {"gfx1151", 256, 5},
      {"gfx1200", 128, 10}, {"gfx1201", 97, 12}, {"gfx1201", 256, 5}, {"gfx90a", 25, 8},
      {"gfx90a", 97, 4},    {"gfx90a", 128, 4},  {"gfx90a", 256, 2},  {"gfx942", 97, 4},
      {"gfx950", 128, 4},   {"gfx950", 256, 2},
  };
  for (const Case &c : cases)
    EXPECT_EQ(parse_ok(c.arch).max_waves_for_vgprs(c.vgprs), c.waves)
        << c.arch << " with " << c.vgprs << " VGPRs";
  EXPECT_EQ(parse_ok("gfx90a").max_waves_for_vgprs(512), 1);
  EXPECT_EQ(parse_ok("gfx1201").max_waves_for_vgprs(257), 0) << "over the addressable 256";
}

TEST(Target, FeatureSuffixes) {
  Target t = parse_ok("gfx90a:sramecc+:xnack-");
  EXPECT_EQ(t.arch, "gfx90a");
  EXPECT_EQ(t.features, "sramecc+:xnack-");
  EXPECT_EQ(t.sramecc, std::optional<bool>(true));
  EXPECT_EQ(t.xnack, std::optional<bool>(false));
  EXPECT_EQ(t.target_id(), "gfx90a:sramecc+:xnack-");
  EXPECT_EQ(t.wave_size, 64);

  // Normalized to LLVM's canonical (alphabetical) order.
  EXPECT_EQ(parse_ok("gfx90a:xnack-:sramecc+").features, "sramecc+:xnack-");
  t = parse_ok("gfx942:xnack+");
  EXPECT_EQ(t.features, "xnack+");
  EXPECT_EQ(t.xnack, std::optional<bool>(true));
  EXPECT_FALSE(t.sramecc.has_value());
  EXPECT_EQ(parse_ok("gfx950:sramecc-").target_id(), "gfx950:sramecc-");
}

TEST(Target, UnknownArchListsSupportedOnes) {
  std::string msg = parse_error("gfx1030");
  EXPECT_NE(msg.find("unknown arch 'gfx1030'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("supported are gfx1100, gfx1101,"), std::string::npos) << msg;
  for (std::string_view arch : supported_archs())
    EXPECT_NE(msg.find(arch), std::string::npos) << arch << " missing from: " << msg;
  EXPECT_NE(parse_error("").find("unknown arch ''"), std::string::npos);
  EXPECT_NE(parse_error("GFX1201").find("unknown arch 'GFX1201'"), std::string::npos);
  EXPECT_NE(parse_error("gfx908:xnack-").find("unknown arch 'gfx908'"), std::string::npos);
}

TEST(Target, BadFeatures) {
  std::string msg = parse_error("gfx90a:foo+");
  EXPECT_NE(msg.find("unknown target feature 'foo'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("sramecc, xnack"), std::string::npos) << msg;
  msg = parse_error("gfx90a:xnack");
  EXPECT_NE(msg.find("needs a '+' or '-' suffix"), std::string::npos) << msg;
  msg = parse_error("gfx90a:");
  EXPECT_NE(msg.find("needs a '+' or '-' suffix"), std::string::npos) << msg;
  msg = parse_error("gfx90a:xnack+:xnack-");
  EXPECT_NE(msg.find("given twice"), std::string::npos) << msg;
  // RDNA processors have neither feature. "gfx1201:xnack-" says what is true and is
  // accepted (clang 22 rejects it as a target ID, so it is not passed on);
  // asking for a feature the chip lacks is an error.
  Target t = parse_ok("gfx1201:xnack-");
  EXPECT_EQ(t.target_id(), "gfx1201");
  EXPECT_FALSE(t.xnack.has_value());
  msg = parse_error("gfx1201:xnack+");
  EXPECT_NE(msg.find("gfx1201 has no 'xnack' target feature"), std::string::npos) << msg;
  msg = parse_error("gfx1100:sramecc+");
  EXPECT_NE(msg.find("gfx1100 has no 'sramecc' target feature"), std::string::npos) << msg;
}

} // namespace
} // namespace flashjit::lowering
