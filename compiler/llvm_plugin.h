// The LLVM plugin: everything flashjit does with the LLVM, Clang and LLD 22
// libraries lives in libflashjit_llvm.so, which is loaded with dlopen on first
// use, as hiprtc and nvrtc are. libflashjit.so and the flashjit tool link no
// part of LLVM (about 213 MB of libLLVM and libclang-cpp). A process that
// compiles only with nvrtc or hiprtc never loads it.
//
// The plugin provides three services, one table of functions:
//   * the AMDGPU compiler (LlvmCompiler, llvm_compiler.h);
//   * the code-object readers (disassemble, read_resources: code_object.h);
//   * the host JIT that compiles kernels for the emulator (host_jit.h).
// The plugin and the library that loads it come from one build (one compiler,
// one set of headers), so the table passes C++ types. The loader checks the
// ABI number, the table's size and the flashjit version before using it.
#pragma once

#include "compiler/code_object.h"
#include "compiler/compiler.h"
#include "compiler/host_jit.h"

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace flashjit::compiler {

/// Bumped whenever LlvmPlugin or a type it passes changes.
inline constexpr uint32_t kLlvmPluginAbi = 1;
/// The plugin's file name, and the one symbol it exports:
///   extern "C" const flashjit::compiler::LlvmPlugin *flashjit_llvm_plugin();
inline constexpr const char *kLlvmPluginFile = "libflashjit_llvm.so";
inline constexpr const char *kLlvmPluginSymbol = "flashjit_llvm_plugin";

struct LlvmPlugin {
  uint32_t abi;                 // kLlvmPluginAbi of the plugin's build
  uint32_t size;                // sizeof(LlvmPlugin) in the plugin's build
  const char *flashjit_version; // FLASHJIT_VERSION of the plugin's build
  /// "llvm " + LLVM_VERSION_STRING, e.g. "llvm 22.1.8".
  std::string (*identity)();
  Expected<CodeObject> (*compile)(std::string_view source, const CompileOptions &options);
  Expected<std::string> (*disassemble)(const CodeObject &code);
  Expected<std::vector<ResourceReport>> (*read_resources)(const CodeObject &code,
                                                          int vgpr_file_per_simd,
                                                          int max_waves_per_simd,
                                                          int lds_bytes_per_cu_or_wgp);
  Expected<std::shared_ptr<const HostKernel>> (*compile_for_host)(
      std::string_view prelude, std::string_view kernel_text,
      const std::vector<HostSymbol> &symbols);
};

/// A loaded plugin and where it came from.
struct LoadedLlvmPlugin {
  const LlvmPlugin *table = nullptr;
  std::string path;
};

/// The process's plugin, loaded on the first call (thread-safe); every later
/// call returns the first one's result. The places tried, in order:
///   1. $FLASHJIT_LLVM_PLUGIN, a path to the file; when set, nothing else is
///      tried;
///   2. the directory of the library or program that holds this code (an
///      installed or wheel-packaged libflashjit.so has the plugin beside it);
///   3. where this build wrote it (build tree), then the install's libdir.
/// The error names every place tried and why each failed (for instance the
/// dynamic loader's message about a missing libLLVM.so.22.1), and the fix.
/// A build without LLVM (FLASHJIT_WITH_LLVM=OFF) says so and tries nothing.
Expected<const LlvmPlugin *> llvm_plugin();
/// As llvm_plugin(), with the path it was loaded from.
const Expected<LoadedLlvmPlugin> &loaded_llvm_plugin();

/// Loads the plugin at `path` now, not cached (for tests and diagnostics): a
/// file that is missing, cannot be loaded, lacks the entry point or comes from
/// another build is an error naming the path and the problem.
Expected<const LlvmPlugin *> load_llvm_plugin(const std::string &path);

} // namespace flashjit::compiler
