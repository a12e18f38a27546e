#include "target/arch.h"

namespace flashjit::target {
namespace {

// Sources for the numbers below (LLVM main, llvm/lib/Target/AMDGPU/):
// [Usage]    llvm/docs/AMDGPUUsage.rst, processor and target-feature tables.
// [BaseInfo] Utils/AMDGPUBaseInfo.cpp, namespace IsaInfo:
//            getMaxWavesPerEU: 8 if GFX90AInsts (gfx90a, gfx942, gfx950),
//              else 16 on gfx10.3 and later;
//            getTotalNumVGPRs: 512 if GFX90AInsts; wave32 1536 with
//              Feature1_5xVGPRs, else 1024;
//            getAddressableNumVGPRs: 512 if GFX90AInsts, else 256;
//            getVGPRAllocGranule: 8 if GFX90AInsts; with Feature1_5xVGPRs
//              24 for wave32 and 12 for wave64, else 16 / 8 on gfx10.3+;
//            getMaxFlatWorkGroupSize: 1024.
// [Occ]      GCNSubtarget::getOccupancyWithNumSGPRs: SGPRs limit waves
//            before gfx10 only.
// [td]       AMDGPU.td: Feature1_5xVGPRs is in FeatureISAVersion11_0_0 (gfx1100),
//            11_0_1 (gfx1101), 11_5_1 (gfx1151) and FeatureISAVersion12
//            (gfx1200/1201), not in gfx1102/1103/1150. gfx9 has no wave32.
//            FeatureAddressableLocalMemorySize65536 for GFX9 (9_0_Common),
//            gfx942, GFX11 and GFX12; 163840 for gfx950 (9_5_Common).
// [clang22]  Checked locally with clang 22.1.8: a __shared__ array of 65540 bytes is
//            rejected on gfx1100/gfx1201/gfx90a/gfx942 ("exceeds limit (65536)"),
//            163840 bytes is accepted on gfx950 and 163844 rejected; the
//            kernel-resource-usage remark gives the occupancies that
//            target_test.cpp checks; "gfx1201:xnack-" and "gfx1100:sramecc+" are
//            rejected as invalid target IDs, the gfx9 ones accept both features.
// [ISA]      The RDNA3 and RDNA4 ISA guides: 128 KiB of LDS per workgroup processor
//            (two CUs); the CDNA3 ISA guide: 64 KiB per CU (gfx90a alike); CDNA4
//            (gfx950): 160 KiB per CU, all of it addressable by one workgroup [td].
// [CUDA]     The CUDA C++ Programming Guide, "Technical Specifications per Compute
//            Capability": 64K 32-bit registers per SM, 255 per thread; shared
//            memory per SM 164 KiB (8.0), 100 KiB (8.6, 8.9), 228 KiB (9.0), per
//            block 163, 99, 227 KiB; resident warps per SM 64 (8.0, 9.0), 48 (8.6, 8.9).
// [PTX]      The PTX ISA: wgmma.mma_async requires sm_90a; cp.async.bulk.tensor
//            sm_90 or later.

constexpr FamilyFacts kFamilies[] = {
    // family, name, vendor, wave size, addressable VGPRs [BaseInfo], most waves per
    // SIMD [BaseInfo], SGPRs limit occupancy [Occ], wgmma, TMA
    {Family::gfx11, "gfx11", Vendor::amd, 32, 256, 16, false, false, false},
    {Family::gfx12, "gfx12", Vendor::amd, 32, 256, 16, false, false, false},
    {Family::cdna2, "cdna2", Vendor::amd, 64, 512, 8, true, false, false},
    {Family::cdna3, "cdna3", Vendor::amd, 64, 512, 8, true, false, false},
    {Family::cdna4, "cdna4", Vendor::amd, 64, 512, 8, true, false, false},
    // NVIDIA: a warp is the "wave"; 255 registers per thread, 16 warps per SM
    // sub-partition (64 per SM) on sm_80 and sm_90 [CUDA] (sm_86/sm_89 hold 48 per
    // SM, which this family-wide figure does not say: nothing computes an NVIDIA
    // occupancy from it yet). Hopper adds wgmma (PTX target sm_90a) and the TMA
    // (cp.async.bulk.tensor) [PTX].
    {Family::sm80, "sm80", Vendor::nvidia, kNvidiaWarpSize, 255, 16, false, false, false},
    {Family::sm90, "sm90", Vendor::nvidia, kNvidiaWarpSize, 255, 16, false, true, true},
};

constexpr int k64KiB = 64 * 1024;
constexpr int k128KiB = 128 * 1024;
constexpr int k160KiB = 160 * 1024;
// NVIDIA [CUDA]: the dynamic shared memory one block may opt into, and the shared
// memory of one SM (the CUDA runtime keeps 1 KiB of it per block).
constexpr int k163KiB = 163 * 1024, k99KiB = 99 * 1024, k227KiB = 227 * 1024;
constexpr int k164KiB = 164 * 1024, k100KiB = 100 * 1024, k228KiB = 228 * 1024;

constexpr Arch kArchs[] = {
    // name, family, generation, VGPRs per SIMD lane [BaseInfo], allocation granule
    // wave32 / wave64 [BaseInfo] (0: no such waves [td]), LDS per workgroup [td] and
    // per CU [ISA], xnack, sramecc [Usage] [clang22]
    {"gfx1100", Family::gfx11, 11, 1536, 24, 12, k64KiB, k128KiB, false, false},
    {"gfx1101", Family::gfx11, 11, 1536, 24, 12, k64KiB, k128KiB, false, false},
    {"gfx1102", Family::gfx11, 11, 1024, 16, 8, k64KiB, k128KiB, false, false},
    {"gfx1103", Family::gfx11, 11, 1024, 16, 8, k64KiB, k128KiB, false, false},
    {"gfx1150", Family::gfx11, 11, 1024, 16, 8, k64KiB, k128KiB, false, false},
    {"gfx1151", Family::gfx11, 11, 1536, 24, 12, k64KiB, k128KiB, false, false},
    {"gfx1200", Family::gfx12, 12, 1536, 24, 12, k64KiB, k128KiB, false, false},
    {"gfx1201", Family::gfx12, 12, 1536, 24, 12, k64KiB, k128KiB, false, false},
    {"gfx90a", Family::cdna2, 9, 512, 0, 8, k64KiB, k64KiB, true, true},
    {"gfx942", Family::cdna3, 9, 512, 0, 8, k64KiB, k64KiB, true, true},
    {"gfx950", Family::cdna4, 9, 512, 0, 8, k160KiB, k160KiB, true, true},
    // NVIDIA: 64K 32-bit registers per SM = 512 per lane of each of the 4 sub-partitions,
    // allocated per warp in units of 256 (8 per lane); LDS is shared memory, all of
    // it dynamic (static stops at 48 KiB), up to the block's opt-in limit [CUDA].
    {"sm_80", Family::sm80, 8, 512, 8, 0, k163KiB, k164KiB, false, false},
    {"sm_86", Family::sm80, 8, 512, 8, 0, k99KiB, k100KiB, false, false},
    {"sm_89", Family::sm80, 8, 512, 8, 0, k99KiB, k100KiB, false, false},
    {"sm_90", Family::sm90, 9, 512, 8, 0, k227KiB, k228KiB, false, false},
};

struct VendorRow {
  Vendor vendor;
  std::string_view name;
  std::string_view prefix; // of every processor name of the vendor
};

constexpr VendorRow kVendors[] = {
    {Vendor::amd, "amd", "gfx"},
    {Vendor::nvidia, "nvidia", "sm_"},
};

} // namespace

const FamilyFacts &family_facts(Family f) {
  for (const FamilyFacts &row : kFamilies)
    if (row.family == f)
      return row;
  return kFamilies[0]; // unreachable: every Family has a row
}

std::string_view family_name(Family f) { return family_facts(f).name; }

const FamilyFacts &Arch::facts() const { return family_facts(family); }

int Arch::vgpr_alloc_granule(int wave_size) const {
  return wave_size == 32   ? vgpr_alloc_granule_wave32
         : wave_size == 64 ? vgpr_alloc_granule_wave64
                           : 0;
}

std::span<const Arch> archs() { return kArchs; }

std::string_view processor_of(std::string_view target_id) {
  return target_id.substr(0, target_id.find(':'));
}

const Arch *find_arch(std::string_view processor) {
  for (const Arch &row : kArchs)
    if (row.name == processor)
      return &row;
  return nullptr;
}

std::string arch_list() {
  std::string out;
  for (const Arch &row : kArchs) {
    if (!out.empty())
      out += ", ";
    out += row.name;
  }
  return out;
}

std::optional<Vendor> vendor_of_name(std::string_view target_id) {
  for (const VendorRow &row : kVendors)
    if (target_id.starts_with(row.prefix))
      return row.vendor;
  return std::nullopt;
}

std::string_view vendor_name(Vendor v) {
  for (const VendorRow &row : kVendors)
    if (row.vendor == v)
      return row.name;
  return "?";
}

} // namespace flashjit::target
