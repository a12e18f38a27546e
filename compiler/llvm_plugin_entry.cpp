// The LLVM plugin's one exported symbol (llvm_plugin.h): its table of
// functions. Calling it registers LLVM's targets, so every later call, and
// every compile a host thread forks, finds them ready.
#include "compiler/llvm_impl.h"
#include "compiler/llvm_plugin.h"

extern "C" __attribute__((visibility("default"))) const flashjit::compiler::LlvmPlugin *
flashjit_llvm_plugin() {
  namespace impl = flashjit::compiler::llvm_impl;
  static const flashjit::compiler::LlvmPlugin table = {
      flashjit::compiler::kLlvmPluginAbi,
      sizeof(flashjit::compiler::LlvmPlugin),
      FLASHJIT_VERSION,
      &impl::identity,
      &impl::compile,
      &impl::disassemble,
      &impl::read_resources,
      &impl::compile_for_host,
  };
  impl::initialize_targets();
  return &table;
}
