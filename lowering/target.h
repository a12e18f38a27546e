// The GPU a kernel is generated for, parsed once from an AMD target ID such as
// "gfx1201" or "gfx90a:sramecc+:xnack-". Everything the lowering needs to know
// about the hardware is a field or a query here (habit 3: rows, not
// `if (arch == ...)` ladders); the wave size in particular is always
// `target.wave_size`, never a literal. The numbers come from the arch-facts rows
// of target/arch.h, which the compilers read too.
#pragma once

#include "ir/status.h"
#include "target/arch.h"

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace flashjit::lowering {

struct MatrixInstr;

/// Matrix-instruction families (target/arch.h).
using target::Family;
using target::family_name;

struct Target {
  /// Processor name, e.g. "gfx1201".
  std::string arch;
  /// Target-ID features, normalized: sorted by name, ':'-separated, each with
  /// its sign, e.g. "sramecc+:xnack-"; empty when none were given.
  std::string features;
  /// The features as parsed: nullopt = not specified ("any" in LLVM's terms).
  std::optional<bool> xnack;
  std::optional<bool> sramecc;

  Family family = Family::gfx12;

  /// Lanes per wave: 32 on RDNA (flashjit compiles RDNA as wave32, the HIP
  /// default), 64 on CDNA.
  int wave_size = 0;
  /// LDS a workgroup can address, in bytes.
  int lds_bytes = 0;
  /// LDS of one CU (RDNA: workgroup processor; NVIDIA: SM), shared by the
  /// workgroups resident on it, in bytes (for occupancy).
  int lds_bytes_per_cu = 0;
  /// VGPRs one lane of one wave can address (RDNA: 256; CDNA: 512, the unified
  /// ArchVGPR + AccVGPR file of gfx90a and later).
  int max_vgprs = 0;
  /// VGPRs per lane in one SIMD's register file, shared by the waves resident
  /// on it (for occupancy).
  int vgpr_file_per_simd = 0;
  /// VGPRs are allocated to a wave in blocks of this many.
  int vgpr_alloc_granule = 0;
  /// Most work-items in a workgroup.
  int max_workgroup_size = 0;
  /// Most waves resident on one SIMD, whatever their register use.
  int max_waves_per_simd = 0;
  /// The matrix instructions this target can run, rows of matrix_table().
  std::vector<const MatrixInstr *> matrix_instrs;

  std::string_view family_name() const { return lowering::family_name(family); }
  /// NVIDIA targets compile with nvrtc and launch through the CUDA driver.
  bool is_nvidia() const { return target::family_facts(family).vendor == target::Vendor::nvidia; }
  /// The target ID to hand to the compiler: arch, then ":features" if any.
  std::string target_id() const;
  /// Waves that fit on one SIMD when each uses `vgprs` VGPRs (LLVM's
  /// getNumWavesPerEUWithNumVGPRs; on CDNA count ArchVGPRs + AccVGPRs).
  int max_waves_for_vgprs(int vgprs) const;
};

/// Parses "gfxNNNN" with optional ":feature+" / ":feature-" suffixes, or an
/// NVIDIA "sm_NN" (sm_80, sm_86, sm_89, sm_90).
Expected<Target> parse_target(std::string_view target_id);

/// Every processor parse_target accepts, in a fixed order.
std::vector<std::string_view> supported_archs();

} // namespace flashjit::lowering
