// Code object reports, and the LLVM readers (code_object_llvm.cpp, in the LLVM
// plugin) reached through llvm_plugin().
#include "compiler/code_object.h"

#include "target/arch.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>

#include "compiler/llvm_plugin.h"

namespace flashjit::compiler {

std::string ResourceReport::to_text() const {
  return fmt::format("{}: wave{}, {} VGPRs (granule {}), {} SGPRs, {} AGPRs, spills {} VGPR / {} "
                     "SGPR, scratch {} B, LDS {} B, max workgroup {}, {} matrix instructions, "
                     "occupancy {} waves/SIMD",
                     kernel, wavefront_size, vgprs, vgpr_alloc_granule, sgprs, agprs,
                     vgpr_spill_count, sgpr_spill_count, private_segment_bytes, group_segment_bytes,
                     max_flat_workgroup_size, matrix_instructions, occupancy_waves_per_simd);
}

std::string ResourceReport::to_json() const {
  const nlohmann::ordered_json report = {{"kernel", kernel},
                                         {"symbol", symbol},
                                         {"vgprs", vgprs},
                                         {"sgprs", sgprs},
                                         {"agprs", agprs},
                                         {"vgpr_spill", vgpr_spill},
                                         {"sgpr_spill", sgpr_spill},
                                         {"vgpr_spill_count", vgpr_spill_count},
                                         {"sgpr_spill_count", sgpr_spill_count},
                                         {"private_segment_bytes", private_segment_bytes},
                                         {"group_segment_bytes", group_segment_bytes},
                                         {"wavefront_size", wavefront_size},
                                         {"max_flat_workgroup_size", max_flat_workgroup_size},
                                         {"matrix_instructions", matrix_instructions},
                                         {"vgpr_alloc_granule", vgpr_alloc_granule},
                                         {"occupancy_waves_per_simd", occupancy_waves_per_simd}};
  return json_line(report);
}

/// Waves of one kernel per SIMD (LLVM: waves per EU). Each resource gives a
/// bound and the smallest wins:
///  * VGPRs: a wave's VGPRs are allocated in blocks of `vgpr_alloc_granule`,
///    so file / roundup(vgprs, granule) waves fit (AMDGPUBaseInfo.cpp:
///    getNumWavesPerEUWithNumVGPRs, getVGPRAllocGranule).
///  * LDS: a CDNA CU, or an RDNA WGP in WGP mode, holds lds / group_bytes
///    workgroups; each brings ceil(max_flat_workgroup_size / wave) waves,
///    spread over the unit's 4 SIMDs. max_flat_workgroup_size is the kernel's
///    declared bound (1024 when it states none), so kernels without launch
///    bounds get a pessimistic figure. LDS allocation granularity is ignored.
///  * SGPRs limit chips before gfx10 only (gfx10+ gives every wave its own
///    SGPRs): GCNSubtarget::getOccupancyWithNumSGPRs, <= 80: 10, <= 88: 9,
///    <= 100: 8, otherwise 7.
int occupancy(const ResourceReport &r, bool sgprs_limit, int vgpr_file_per_simd,
              int max_waves_per_simd, int lds_bytes) {
  constexpr int kSimdsPerUnit = 4;
  int waves = max_waves_per_simd;
  if (r.vgprs > 0 && r.vgpr_alloc_granule > 0) {
    int blocks = (r.vgprs + r.vgpr_alloc_granule - 1) / r.vgpr_alloc_granule;
    waves = std::min(waves, vgpr_file_per_simd / (blocks * r.vgpr_alloc_granule));
  }
  if (r.group_segment_bytes > 0 && r.wavefront_size > 0) {
    int64_t workgroups = lds_bytes / r.group_segment_bytes;
    int64_t waves_per_workgroup =
        (std::max(r.max_flat_workgroup_size, 1) + r.wavefront_size - 1) / r.wavefront_size;
    int64_t total = workgroups * waves_per_workgroup;
    waves = static_cast<int>(std::min<int64_t>(waves, (total + kSimdsPerUnit - 1) / kSimdsPerUnit));
  }
  if (sgprs_limit) {
    int sgpr_waves = r.sgprs <= 80 ? 10 : r.sgprs <= 88 ? 9 : r.sgprs <= 100 ? 8 : 7;
    waves = std::min(waves, sgpr_waves);
  }
  return std::max(waves, 0);
}

bool is_matrix_instruction(std::string_view text) {
  for (std::string_view prefix : {"v_wmma_", "v_swmmac_", "v_mfma_", "v_smfmac_"})
    if (text.substr(0, prefix.size()) == prefix)
      return true;
  return false;
}

Expected<std::string> disassemble(const CodeObject &code) {
  auto plugin = llvm_plugin();
  if (!plugin)
    return plugin.status().with_context(
        fmt::format("cannot disassemble the {} code object", code.arch));
  return (*plugin)->disassemble(code);
}

Expected<std::vector<ResourceReport>> read_resources(const CodeObject &code, int vgpr_file_per_simd,
                                                     int max_waves_per_simd,
                                                     int lds_bytes_per_cu_or_wgp) {
  auto plugin = llvm_plugin();
  if (!plugin)
    return plugin.status().with_context(
        fmt::format("cannot read the {} code object's resources", code.arch));
  return (*plugin)->read_resources(code, vgpr_file_per_simd, max_waves_per_simd,
                                   lds_bytes_per_cu_or_wgp);
}

} // namespace flashjit::compiler
