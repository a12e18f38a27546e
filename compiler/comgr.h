// Code-object inspection through ROCm's code object manager (libamd_comgr.so),
// loaded at run time: the disassembly and resource reports of code_object.h for
// builds without LLVM 22. comgr does the work with the LLVM it was built with,
// so it only knows the processors of its ROCm release: Debian's libamd-comgr2
// (ROCm 5.2, comgr 2.4) reads gfx90a code objects -- versions 4, 5 and LLVM
// 22's default 6 alike -- but not gfx11 or gfx12 ones. Both calls say so when
// the installed comgr does not know the target.
#pragma once

#include "compiler/code_object.h"

#include <string>
#include <vector>

namespace flashjit::compiler {

/// The library comgr calls use, e.g. "comgr 2.4 (/usr/lib/x86_64-linux-gnu/libamd_comgr.so.2)",
/// or the error naming every place searched.
Expected<std::string> comgr_identity();
/// $ROCM_PATH/lib, /opt/rocm/lib, then the loader path; libamd_comgr.so, .so.3, .so.2.
std::vector<std::string> comgr_search_paths();
/// Whether the installed comgr lists `processor` ("gfx90a") among its ISAs.
Expected<bool> comgr_knows(std::string_view processor);

/// The instructions of the code object as comgr's disassembler prints them
/// (llvm-objdump -d style: a "<kernel>:" label line per function, then one
/// "\t<instruction>  // <address>: <encoding>" line per instruction).
Expected<std::string> comgr_disassemble(const CodeObject &code);

/// As read_resources() in code_object.h, from comgr's metadata lookup and
/// disassembly; the occupancy rules are the same.
Expected<std::vector<ResourceReport>> comgr_read_resources(const CodeObject &code,
                                                           int vgpr_file_per_simd,
                                                           int max_waves_per_simd,
                                                           int lds_bytes_per_cu_or_wgp);

} // namespace flashjit::compiler
