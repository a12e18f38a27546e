// LlvmCompiler: HIP source to an AMDGPU code object with the Clang and LLD 22
// libraries of the LLVM plugin (llvm_plugin.h), in this process. No compiler
// binary is executed.
//
// One compile is the two steps the clang driver would run for
//   clang++ -x hip --offload-arch=<arch> --cuda-device-only -nogpulib -nogpuinc
//           -fno-gpu-rdc -O3 kernel.hip -o kernel.co
// (amd-matrix-layouts.md section 8): the driver's cc1 command, executed by a
// CompilerInstance that reads the source from memory and writes the relocatable
// object into memory; then lld's ELF driver links it with -shared into the
// code object.
//
// With CompileOptions::isolate (the default) both steps run in a fork()ed child
// of this process, which streams the code object or the diagnostics back
// through a pipe; the parent enforces the time limit and survives a compiler
// crash. See llvm_compile.cpp for the details.
#pragma once

#include "compiler/compiler.h"

namespace flashjit::compiler {

class LlvmCompiler : public Compiler {
public:
  /// Name of the source buffer; diagnostics say "kernel.hip:LINE:COL: error: ...".
  static constexpr const char *kSourceName = "kernel.hip";

  std::string name() const override { return "llvm"; }
  /// "llvm " + LLVM_VERSION_STRING, e.g. "llvm 22.1.8"; "llvm (not loaded)"
  /// when the plugin cannot be loaded (then compile() says why).
  std::string identity() const override;
  /// The plugin's compile, or the reason the plugin cannot be loaded.
  Expected<CodeObject> compile(std::string_view source, const CompileOptions &options) override;

  /// The clang driver command line compile() runs (argv[0] first), for logs
  /// and reproducing a compile by hand.
  static std::vector<std::string> driver_args(const CompileOptions &options);
};

} // namespace flashjit::compiler
