// A stand-in for a libflashjit_llvm.so from another flashjit build: it has the
// entry point, with a table whose ABI number no build of this one uses. The
// loader must refuse it before calling anything in it.
#include "compiler/llvm_plugin.h"

extern "C" __attribute__((visibility("default"))) const flashjit::compiler::LlvmPlugin *
flashjit_llvm_plugin() {
  static const flashjit::compiler::LlvmPlugin table = {flashjit::compiler::kLlvmPluginAbi + 1000,
                                                       sizeof(flashjit::compiler::LlvmPlugin),
                                                       "0.0.0",
                                                       nullptr,
                                                       nullptr,
                                                       nullptr,
                                                       nullptr,
                                                       nullptr};
  return &table;
}
