// The emulator's compiler: emulation prelude + kernel text -> host machine code,
// in process (Clang as a library -> llvm::Module -> ORC LLJIT). No compiler
// process, no temporary files. Compiled kernels live for the whole process and
// are shared by every emulate() call with the same kernel text.
#pragma once

#include "ir/status.h"

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace flashjit::runtime::emu {

/// The launcher the emulator appends to a kernel's text: it takes the address
/// of each argument's value (runtime::KernelArgs) and calls the kernel.
constexpr const char *kLauncherName = "fj_launch";
using KernelEntry = void (*)(void *const *args);

struct CompiledKernel {
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
/// the kernel it calls; `symbols` resolve its external calls (bound
/// as absolute symbols in the kernel's own JITDylib). Thread-safe. Compile
/// errors come back with Clang's diagnostics.
Expected<std::shared_ptr<const CompiledKernel>>
compile_for_host(std::string_view prelude, std::string_view kernel_text,
                 const std::vector<HostSymbol> &symbols);

} // namespace flashjit::runtime::emu
