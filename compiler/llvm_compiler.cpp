// LlvmCompiler's side in libflashjit: the driver command line, and the calls
// into the LLVM plugin, which does the compile (llvm_compile.cpp).
#include "compiler/llvm_compiler.h"

#include "compiler/llvm_plugin.h"
#include "target/arch.h"

#ifndef FLASHJIT_CLANG_EXECUTABLE
#error "FLASHJIT_CLANG_EXECUTABLE must name clang in the LLVM install (compiler/CMakeLists.txt)"
#endif

namespace flashjit::compiler {

std::string LlvmCompiler::identity() const {
  auto plugin = llvm_plugin();
  return plugin ? (*plugin)->identity() : "llvm (not loaded)";
}

Expected<CodeObject> LlvmCompiler::compile(std::string_view source, const CompileOptions &options) {
  auto plugin = llvm_plugin();
  if (!plugin)
    return plugin.status().with_context("compile for " + options.arch);
  return (*plugin)->compile(source, options);
}

std::vector<std::string> LlvmCompiler::driver_args(const CompileOptions &options) {
  const std::string target_id =
      options.features.empty() ? options.arch : options.arch + ":" + options.features;
  std::vector<std::string> args = {
      FLASHJIT_CLANG_EXECUTABLE,
      "-x",
      "hip",
      "--offload-arch=" + target_id,
      "--cuda-device-only",
      "-nogpulib",
      "-nogpuinc",
      "-fno-gpu-rdc",
      // Only Clang's own builtin headers: the result depends on nothing else on
      // this machine (compiler identity + source + options = the cache key).
      "-nostdlibinc",
      "-nostdinc++",
      // The compilation-unit ID only ties host and device halves together; with
      // none, its symbol is the same "__hip_cuid_" whatever the flags.
      "-fuse-cuid=none",
      "-fno-color-diagnostics",
      "-O" + std::to_string(options.opt_level),
  };
  // RDNA defaults to wave32; CDNA (gfx9) is wave64 without a flag.
  const target::Arch *arch = target::find_arch(options.arch);
  if (options.wave_size == 64 && arch != nullptr && arch->needs_wave_size_flag(64))
    args.push_back("-mwavefrontsize64");
  args.insert(args.end(), options.extra_flags.begin(), options.extra_flags.end());
  args.push_back(kSourceName);
  return args;
}

} // namespace flashjit::compiler
