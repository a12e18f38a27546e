// Kernel text compiled for the host CPU, for the emulator: Clang as a library
// -> llvm::Module -> ORC LLJIT, in the LLVM plugin (llvm_plugin.h). No compiler
// process, no temporary files. Compiled kernels live for the whole process and
// are shared by every caller with the same kernel text.
#pragma once

#include "ir/status.h"

#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace flashjit::compiler {

/// The launcher the emulator appends to a kernel's text: it takes the address
/// of each argument's value (runtime::KernelArgs) and calls the kernel.
constexpr const char *kLauncherName = "fj_launch";
using KernelEntry = void (*)(void *const *args);

struct HostKernel {
  KernelEntry entry = nullptr;
  /// The n of FJ_WORKGROUP_SIZE(n) on the kernel, 0 when it has none.
  int workgroup_size = 0;
  double compile_seconds = 0;
};

/// A symbol the JIT'd code may call: the emulator's hooks and the few C library
/// functions the optimizer introduces (memcpy, memset).
struct HostSymbol {
  std::string name;
  void *address;
};

/// Compiles `prelude` + `kernel_text` once per distinct text and returns its
/// launcher (kLauncherName) as the entry point, with the FJ_WORKGROUP_SIZE of
/// the kernel it calls; `symbols` resolve its external calls (bound as
/// absolute symbols in the kernel's own JITDylib). Thread-safe. Compile errors
/// come back with Clang's diagnostics; without the LLVM plugin, the plugin's
/// error.
Expected<std::shared_ptr<const HostKernel>>
compile_for_host(std::string_view prelude, std::string_view kernel_text,
                 const std::vector<HostSymbol> &symbols);

} // namespace flashjit::compiler
