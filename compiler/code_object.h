// Looking inside an AMDGPU code object: its machine code as text, and what each
// kernel costs in registers, scratch and LDS, read from the AMDHSA metadata
// note the compiler wrote. Both use LLVM in-process (object, MC, msgpack); in a
// build without LLVM they return an error saying so.
#pragma once

#include "compiler/compiler.h"

#include <cstdint>
#include <string>
#include <vector>

namespace flashjit::compiler {

/// The instructions of the executable sections, one per line in the style of
/// `llvm-objdump -d`: each function symbol as a label, then
/// "\t<instruction>  // <address>: <encoding words>".
Expected<std::string> disassemble(const CodeObject &code);

/// What one kernel of a code object uses, from its AMDHSA metadata
/// (amdhsa.kernels[]), plus two figures derived here: the static count of
/// matrix instructions in its code and its occupancy.
struct ResourceReport {
  std::string kernel; ///< .name
  std::string symbol; ///< .symbol, the kernel descriptor ("<kernel>.kd")
  int vgprs = 0;      ///< .vgpr_count (gfx90a+: ArchVGPRs and AccVGPRs together)
  int sgprs = 0;      ///< .sgpr_count
  int agprs = 0;      ///< .agpr_count (0 where the chip has none)
  bool vgpr_spill = false;
  bool sgpr_spill = false;
  int vgpr_spill_count = 0;
  int sgpr_spill_count = 0;
  int64_t private_segment_bytes = 0; ///< scratch per work-item
  int64_t group_segment_bytes = 0;   ///< static LDS per workgroup
  int wavefront_size = 0;
  int max_flat_workgroup_size = 0;
  /// v_wmma_* / v_swmmac_* / v_mfma_* / v_smfmac_* instructions in the
  /// kernel's own code (static count, not executions).
  int matrix_instructions = 0;
  /// VGPRs are handed to a wave in blocks of this many (LLVM's rule for the chip).
  int vgpr_alloc_granule = 0;
  /// Waves of this kernel that fit on one SIMD; see read_resources().
  int occupancy_waves_per_simd = 0;

  /// One line, for logs.
  std::string to_text() const;
  /// One JSON object, keys in the order of the fields above.
  std::string to_json() const;
};

/// A JSON value on one line, as the reports' to_json() (`compile --json`: a report
/// a line), the C API and the command line's one-object outputs print it: ", "
/// between items and ": " after keys, {"kernel": "k", "vgprs": 64, "list": [1, 2]}.
/// `Json` is nlohmann::ordered_json, a template parameter only so that this header
/// needs no JSON library. dump(0) puts every item on a line of its own and has no
/// other newlines (strings escape theirs); bytes that are not UTF-8 become U+FFFD.
/// Hidden, so that libflashjit.so exports no instance naming nlohmann's types.
template <class Json> __attribute__((visibility("hidden"))) std::string json_line(const Json &v) {
  std::string out;
  for (char c : v.dump(0, ' ', false, Json::error_handler_t::replace))
    if (c != '\n')
      out += c;
    else if (out.ends_with(','))
      out += ' ';
  return out;
}

/// Waves of a kernel that fit on one SIMD (see code_object.cpp for the bounds):
/// shared by the LLVM and comgr readers.
int occupancy(const ResourceReport &r, bool sgprs_limit, int vgpr_file_per_simd,
              int max_waves_per_simd, int lds_bytes);
/// v_wmma_*, v_swmmac_*, v_mfma_*, v_smfmac_* mnemonics.
bool is_matrix_instruction(std::string_view text);

/// The resource use of every kernel in `code`, in metadata order. The three
/// hardware figures come from the caller's target description (per SIMD: VGPRs
/// per lane in the register file, most resident waves; LDS bytes of one CDNA
/// CU or RDNA WGP). Occupancy, in waves per SIMD, is the smallest of
///   max_waves_per_simd,
///   vgpr_file_per_simd / roundup(vgprs, vgpr_alloc_granule),
///   (lds_bytes / group_segment_bytes) workgroups * waves per workgroup / 4 SIMDs,
///   and on gfx9 the SGPR limit (LLVM's getOccupancyWithNumSGPRs),
/// and 0 when the kernel's VGPRs exceed the register file.
Expected<std::vector<ResourceReport>> read_resources(const CodeObject &code, int vgpr_file_per_simd,
                                                     int max_waves_per_simd,
                                                     int lds_bytes_per_cu_or_wgp);

} // namespace flashjit::compiler
