#include "lowering/target.h"

#include "lowering/matrix_table.h"

#include <algorithm>

namespace flashjit::lowering {
namespace {

// Sources for the numbers below (LLVM main, llvm/lib/Target/AMDGPU/):
// [Usage]    llvm/docs/AMDGPUUsage.rst, processor and target-feature tables.
// [BaseInfo] Utils/AMDGPUBaseInfo.cpp, namespace IsaInfo:
//            getMaxWavesPerEU: 8 if GFX90AInsts (gfx90a, gfx942, gfx950),
//              else 16 on gfx10.3 and later;
//            getTotalNumVGPRs: 512 if GFX90AInsts; wave32 1536 with
//              Feature1_5xVGPRs, else 1024;
//            getAddressableNumVGPRs: 512 if GFX90AInsts, else 256;
//            getVGPRAllocGranule: 8 if GFX90AInsts; wave32 24 with
//              Feature1_5xVGPRs, else 16 on gfx10.3+;
//            getMaxFlatWorkGroupSize: 1024.
// [td]       AMDGPU.td: Feature1_5xVGPRs is in FeatureISAVersion11_0_0 (gfx1100),
//            11_0_1 (gfx1101), 11_5_1 (gfx1151) and FeatureISAVersion12
//            (gfx1200/1201), not in gfx1102/1103/1150.
//            FeatureAddressableLocalMemorySize65536 for GFX9 (9_0_Common),
//            gfx942, GFX11 and GFX12; 163840 for gfx950 (9_5_Common).
// [clang22]  Checked locally with clang 22.1.8: a __shared__ array of 65540 bytes is
//            rejected on gfx1100/gfx1201/gfx90a/gfx942 ("exceeds limit (65536)"),
//            163840 bytes is accepted on gfx950 and 163844 rejected; the
//            kernel-resource-usage remark gives the occupancies that
//            target_test.cpp checks; "gfx1201:xnack-" and "gfx1100:sramecc+" are
//            rejected as invalid target IDs, the gfx9 ones accept both features.
//            flashjit accepts "feature-" on a chip without the feature (it is
//            true) and drops it from the compiler's target ID.

constexpr int kMaxWorkgroupSize = 1024; // [BaseInfo] getMaxFlatWorkGroupSize

struct FamilyRow {
  Family family;
  std::string_view name;
  int wave_size;
  int max_vgprs;          // [BaseInfo] getAddressableNumVGPRs
  int max_waves_per_simd; // [BaseInfo] getMaxWavesPerEU
};

constexpr FamilyRow kFamilies[] = {
    {Family::gfx11, "gfx11", 32, 256, 16},
    {Family::gfx12, "gfx12", 32, 256, 16},
    {Family::cdna2, "cdna2", 64, 512, 8},
    {Family::cdna3, "cdna3", 64, 512, 8},
    {Family::cdna4, "cdna4", 64, 512, 8},
    // NVIDIA: a warp is the "wave"; 255 registers per thread, 16 warps per SM
    // sub-partition (64 per SM) on sm_80..sm_90 (CUDA programming guide, table of
    // compute capabilities).
    {Family::sm80, "sm80", 32, 255, 16},
};

struct ArchRow {
  std::string_view name;
  Family family;
  int vgpr_file_per_simd; // [BaseInfo] getTotalNumVGPRs (wave32 on RDNA)
  int vgpr_alloc_granule; // [BaseInfo] getVGPRAllocGranule (wave32 on RDNA)
  int lds_bytes;          // [td] FeatureAddressableLocalMemorySize*
  bool has_xnack;         // [Usage] target features; [clang22]
  bool has_sramecc;
};

constexpr int k64KiB = 64 * 1024;
constexpr int k160KiB = 160 * 1024;
// NVIDIA: the dynamic shared memory one block may opt into (CUDA programming
// guide, technical specifications per compute capability).
constexpr int k163KiB = 163 * 1024, k99KiB = 99 * 1024, k227KiB = 227 * 1024;

constexpr ArchRow kArchs[] = {
    // name, family, VGPRs per SIMD lane, allocation granule, LDS, xnack, sramecc
    {"gfx1100", Family::gfx11, 1536, 24, k64KiB, false, false},
    {"gfx1101", Family::gfx11, 1536, 24, k64KiB, false, false},
    {"gfx1102", Family::gfx11, 1024, 16, k64KiB, false, false},
    {"gfx1103", Family::gfx11, 1024, 16, k64KiB, false, false},
    {"gfx1150", Family::gfx11, 1024, 16, k64KiB, false, false},
    {"gfx1151", Family::gfx11, 1536, 24, k64KiB, false, false},
    {"gfx1200", Family::gfx12, 1536, 24, k64KiB, false, false},
    {"gfx1201", Family::gfx12, 1536, 24, k64KiB, false, false},
    {"gfx90a", Family::cdna2, 512, 8, k64KiB, true, true},
    {"gfx942", Family::cdna3, 512, 8, k64KiB, true, true},
    {"gfx950", Family::cdna4, 512, 8, k160KiB, true, true},
    // NVIDIA: 64K 32-bit registers per SM = 512 per lane of each of the 4 sub-partitions,
    // allocated per warp in units of 256 (8 per lane); LDS is shared memory, all of
    // it dynamic (static stops at 48 KiB), up to the block's opt-in limit.
    {"sm_80", Family::sm80, 512, 8, k163KiB, false, false},
    {"sm_86", Family::sm80, 512, 8, k99KiB, false, false},
    {"sm_89", Family::sm80, 512, 8, k99KiB, false, false},
    {"sm_90", Family::sm80, 512, 8, k227KiB, false, false},
};

// Target-ID features, in the (alphabetical) order of LLVM's canonical target IDs.
struct FeatureRow {
  std::string_view name;
  bool ArchRow::*supported;
  std::optional<bool> Target::*value;
};

constexpr FeatureRow kFeatures[] = {
    {"sramecc", &ArchRow::has_sramecc, &Target::sramecc},
    {"xnack", &ArchRow::has_xnack, &Target::xnack},
};

const FamilyRow &family_row(Family f) {
  for (const FamilyRow &row : kFamilies)
    if (row.family == f)
      return row;
  return kFamilies[0]; // unreachable: every Family has a row
}

std::string join(const std::vector<std::string_view> &items) {
  std::string out;
  for (std::string_view item : items) {
    if (!out.empty())
      out += ", ";
    out += item;
  }
  return out;
}

std::vector<std::string_view> split(std::string_view s, char sep) {
  std::vector<std::string_view> parts;
  size_t start = 0;
  while (true) {
    size_t end = s.find(sep, start);
    parts.push_back(s.substr(start, end == std::string_view::npos ? end : end - start));
    if (end == std::string_view::npos)
      return parts;
    start = end + 1;
  }
}

} // namespace

std::string_view family_name(Family f) { return family_row(f).name; }

std::vector<std::string_view> supported_archs() {
  std::vector<std::string_view> names;
  for (const ArchRow &row : kArchs)
    names.push_back(row.name);
  return names;
}

std::string Target::target_id() const { return features.empty() ? arch : arch + ":" + features; }

int Target::max_waves_for_vgprs(int vgprs) const {
  if (vgprs > max_vgprs)
    return 0; // cannot be compiled at all
  if (vgprs < vgpr_alloc_granule)
    return max_waves_per_simd;
  int rounded = (vgprs + vgpr_alloc_granule - 1) / vgpr_alloc_granule * vgpr_alloc_granule;
  return std::min(std::max(vgpr_file_per_simd / rounded, 1), max_waves_per_simd);
}

Expected<Target> parse_target(std::string_view target_id) {
  std::vector<std::string_view> parts = split(target_id, ':');
  std::string_view arch = parts[0];
  const ArchRow *row = nullptr;
  for (const ArchRow &r : kArchs)
    if (r.name == arch)
      row = &r;
  if (row == nullptr)
    return Status::error("unknown arch '{}' in target '{}': supported are {}", arch, target_id,
                         join(supported_archs()));

  Target t;
  t.arch = std::string(arch);
  for (size_t i = 1; i < parts.size(); ++i) {
    std::string_view part = parts[i];
    if (part.empty() || (part.back() != '+' && part.back() != '-'))
      return Status::error("target feature '{}' in '{}' needs a '+' or '-' suffix, as in "
                           "'gfx90a:sramecc+:xnack-'",
                           part, target_id);
    std::string_view name = part.substr(0, part.size() - 1);
    const FeatureRow *feature = nullptr;
    for (const FeatureRow &f : kFeatures)
      if (f.name == name)
        feature = &f;
    if (feature == nullptr) {
      std::vector<std::string_view> known;
      for (const FeatureRow &f : kFeatures)
        known.push_back(f.name);
      return Status::error("unknown target feature '{}' in '{}': known are {}, each followed by "
                           "'+' or '-'",
                           name, target_id, join(known));
    }
    if (!(row->*feature->supported)) {
      // "xnack-" on a chip without XNACK states what is true anyway: accept it,
      // but keep it out of the target ID handed to the compiler (clang rejects
      // "gfx1201:xnack-"). Asking for the feature is an error.
      if (part.back() == '-')
        continue;
      return Status::error("{} has no '{}' target feature, so '{}' cannot be honoured; use '{}' "
                           "(or '{}:{}-')",
                           arch, name, target_id, arch, arch, name);
    }
    std::optional<bool> &value = t.*feature->value;
    if (value.has_value())
      return Status::error("target feature '{}' given twice in '{}'", name, target_id);
    value = part.back() == '+';
  }
  for (const FeatureRow &f : kFeatures) {
    const std::optional<bool> &value = t.*f.value;
    if (!value)
      continue;
    if (!t.features.empty())
      t.features += ':';
    t.features += std::string(f.name) + (*value ? "+" : "-");
  }

  const FamilyRow &fam = family_row(row->family);
  t.family = row->family;
  t.wave_size = fam.wave_size;
  t.lds_bytes = row->lds_bytes;
  t.max_vgprs = fam.max_vgprs;
  t.vgpr_file_per_simd = row->vgpr_file_per_simd;
  t.vgpr_alloc_granule = row->vgpr_alloc_granule;
  t.max_workgroup_size = kMaxWorkgroupSize;
  t.max_waves_per_simd = fam.max_waves_per_simd;
  for (const MatrixInstr &instr : matrix_table())
    if (instr.family == t.family)
      t.matrix_instrs.push_back(&instr);
  return t;
}

} // namespace flashjit::lowering
