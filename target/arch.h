// Arch facts: one row per processor flashjit can target, read by the lowering
// (lowering/target.h builds its Target on these rows) and by the compilers
// (wave-size flags, VGPR allocation granule, occupancy rules, vendor). No fact
// about a processor is derived from its name anywhere else (habit 3; DESIGN.md,
// "Arch facts live in one place"). This folder depends on nothing in flashjit.
//
// Not here yet: the matrix-instruction rows (lowering/matrix_table.cpp).
#pragma once

#include <optional>
#include <span>
#include <string>
#include <string_view>

namespace flashjit::target {

enum class Vendor { amd, nvidia };

/// Matrix-instruction families. A family shares the matrix instructions, their
/// lane layouts and the wave size; the names match the prefixes of the AMD
/// Matrix Instruction Calculator data (tests/data/amd_matrix_layouts.json).
enum class Family {
  gfx11, ///< RDNA3 / RDNA3.5: gfx1100-1103, gfx1150-1151. WMMA, wave32.
  gfx12, ///< RDNA4: gfx1200, gfx1201. WMMA (`_gfx12` builtins), wave32.
  cdna2, ///< gfx90a (MI200). MFMA, wave64.
  cdna3, ///< gfx942 (MI300). MFMA, wave64.
  cdna4, ///< gfx950 (MI350). MFMA with the K32/K16 shapes, wave64.
  sm80,  ///< NVIDIA Ampere and Ada (sm_80, sm_86, sm_89): warp-wide mma.sync, 32 lanes.
  /// NVIDIA Hopper (sm_90): the warpgroup wgmma, TMA and setmaxnreg
  /// (FamilyFacts::has_wgmma, has_tma) that the sm90 rules lower to, and sm80's
  /// warp-wide mma.sync (the matrix table repeats sm80's rows for it), which the
  /// sm80 rules lower where the sm90 ones do not fit.
  sm90,
};

/// What every processor of a family shares.
struct FamilyFacts {
  Family family;
  std::string_view name;
  Vendor vendor;
  /// Lanes per wave the family runs natively (RDNA: 32, the HIP default; CDNA: 64).
  int wave_size;
  /// VGPRs one lane of one wave can address.
  int max_vgprs;
  /// Most waves resident on one SIMD, whatever their register use.
  int max_waves_per_simd;
  /// Whether SGPR use limits occupancy (gfx9 and older; gfx10+ gives every
  /// wave its own SGPRs).
  bool sgprs_limit_occupancy;
  /// Warpgroup matrix products: wgmma.mma_async, issued by four warps together
  /// with B (and optionally A) read from shared memory through a matrix
  /// descriptor. PTX has it for the arch-specific target sm_90a only. No rule
  /// set emits it yet.
  bool has_wgmma;
  /// The Tensor Memory Accelerator: bulk asynchronous tile copies between
  /// global and shared memory (cp.async.bulk.tensor, completing on an mbarrier).
  /// No rule set emits it yet.
  bool has_tma;
};

/// One processor.
struct Arch {
  std::string_view name; ///< "gfx1201", "gfx90a", "sm_90"
  Family family;
  /// AMD: the gfx major version (gfx1201 -> 12, gfx90a -> 9); NVIDIA: the
  /// compute-capability major (sm_90 -> 9).
  int generation;
  /// VGPRs per lane in one SIMD's register file, shared by the waves resident
  /// on it, at the family's wave size.
  int vgpr_file_per_simd;
  /// VGPRs are allocated to a wave in blocks of this many, per wave size; 0
  /// where the processor cannot run waves of that size.
  int vgpr_alloc_granule_wave32;
  int vgpr_alloc_granule_wave64;
  /// LDS (NVIDIA: shared memory) a workgroup can address, in bytes (NVIDIA:
  /// the opt-in limit of one block).
  int lds_bytes;
  /// LDS of one compute unit, shared by the workgroups resident on it, in
  /// bytes: a CDNA CU, an RDNA workgroup processor (two CUs, one LDS; HIP
  /// compiles RDNA in WGP mode), an NVIDIA SM. Occupancy divides it.
  int lds_bytes_per_cu;
  /// Target-ID features the processor has.
  bool has_xnack;
  bool has_sramecc;

  const FamilyFacts &facts() const;
  Vendor vendor() const { return facts().vendor; }
  /// The wave size the processor runs natively (CompileOptions::wave_size by default).
  int wave_size() const { return facts().wave_size; }
  bool runs_wave(int wave_size) const { return vgpr_alloc_granule(wave_size) > 0; }
  /// The VGPR allocation granule for waves of `wave_size` lanes; 0 if it cannot run them.
  int vgpr_alloc_granule(int wave_size) const;
  /// The compiler must be told the wave size (clang's -mwavefrontsize64) when
  /// it differs from the processor's native one.
  bool needs_wave_size_flag(int wave_size) const { return wave_size != this->wave_size(); }
};

/// Most work-items in a workgroup, on every supported processor.
inline constexpr int kMaxWorkgroupSize = 1024;

/// Every supported processor, in a fixed order (`flashjit archs` lists them so).
std::span<const Arch> archs();
/// The row of a processor name ("gfx90a", without target-ID features), or nullptr.
const Arch *find_arch(std::string_view processor);
/// The processor of a target ID: "gfx90a:sramecc+:xnack-" -> "gfx90a".
std::string_view processor_of(std::string_view target_id);
/// The supported processor names, comma-separated, for error messages.
std::string arch_list();

const FamilyFacts &family_facts(Family f);
std::string_view family_name(Family f);

/// The vendor a target ID names by its prefix ("gfx..." AMD, "sm_..." NVIDIA),
/// for names outside the table as well (nvrtc also takes sm_90a, sm_100f, ...).
/// nullopt when the name is neither.
std::optional<Vendor> vendor_of_name(std::string_view target_id);
std::string_view vendor_name(Vendor v);
/// Lanes per NVIDIA warp, on every NVIDIA processor.
inline constexpr int kNvidiaWarpSize = 32;

} // namespace flashjit::target
