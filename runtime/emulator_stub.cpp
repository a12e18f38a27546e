// The emulator in a build without LLVM: it needs Clang and the ORC JIT to
// compile kernels for the CPU, so every call explains that instead.
#include "runtime/emulator.h"

namespace flashjit::runtime {

bool emulator_available() { return false; }

Status emulate(const lowering::Lowered &k, const lowering::Target &, const AttentionSpec &,
               HostTensors &, const EmulatorOptions &) {
  return Status::error("emulator: cannot run kernel {}: this flashjit build has no LLVM "
                       "(configured with FLASHJIT_WITH_LLVM=OFF), and the emulator compiles "
                       "kernels for the CPU with the in-process Clang",
                       k.kernel_name);
}

} // namespace flashjit::runtime
