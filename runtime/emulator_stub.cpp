// The emulator in a build without LLVM: it needs Clang and the ORC JIT to
// compile kernels for the CPU, so every call explains that instead.
#include "runtime/emulator.h"

namespace flashjit::runtime {

namespace {
Status no_llvm(const std::string &kernel) {
  return Status::error("emulator: cannot run kernel {}: this flashjit build has no LLVM "
                       "(configured with FLASHJIT_WITH_LLVM=OFF), and the emulator compiles "
                       "kernels for the CPU with the in-process Clang",
                       kernel);
}
} // namespace

bool emulator_available() { return false; }

Status emulate(const lowering::Lowered &k, const lowering::Target &, const AttentionSpec &,
               HostTensors &, const EmulatorOptions &) {
  return no_llvm(k.kernel_name);
}

Status emulate_split_kv(const lowering::Lowered &partial, const lowering::Lowered &,
                        const lowering::Target &, const AttentionSpec &, int64_t, HostTensors &,
                        const EmulatorOptions &) {
  return no_llvm(partial.kernel_name);
}

Status emulate_kernel(const lowering::Lowered &k, const lowering::Target &, const ir::Bindings &,
                      std::span<const EmulatorBuffer>, const EmulatorOptions &) {
  return no_llvm(k.kernel_name);
}

} // namespace flashjit::runtime
