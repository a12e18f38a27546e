// The LLVM plugin's own functions, behind the LlvmPlugin table
// (llvm_plugin.h). Only the plugin's sources include this header: everything
// else reaches them through llvm_plugin().
#pragma once

#include "compiler/code_object.h"
#include "compiler/compiler.h"
#include "compiler/host_jit.h"

#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace flashjit::compiler::llvm_impl {

/// Registers LLVM's AMDGPU target (code generation, MC, disassembler) and the
/// host's native target once per process; thread-safe. The plugin's entry
/// point calls it, so it has run before any other plugin function, and before
/// any thread of the host can fork a compile.
void initialize_targets();

std::string identity();
Expected<CodeObject> compile(std::string_view source, const CompileOptions &options);
Expected<std::string> disassemble(const CodeObject &code);
Expected<std::vector<ResourceReport>> read_resources(const CodeObject &code, int vgpr_file_per_simd,
                                                     int max_waves_per_simd,
                                                     int lds_bytes_per_cu_or_wgp);
Expected<std::shared_ptr<const HostKernel>>
compile_for_host(std::string_view prelude, std::string_view kernel_text,
                 const std::vector<HostSymbol> &symbols);

} // namespace flashjit::compiler::llvm_impl
