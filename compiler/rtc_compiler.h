// RtcCompiler: the vendors' run-time compilers, loaded with dlopen (never
// linked, no vendor headers). ROCm's hiprtc (libhiprtc.so) makes AMDGPU code
// objects; CUDA's nvrtc (libnvrtc.so) makes NVIDIA cubins. Their C APIs are the
// same shape -- HIP on NVIDIA maps hiprtcX to nvrtcX one to one -- so one class
// drives both through one function table per library:
//
//   xCreateProgram(&prog, source, "kernel.hip", 0, NULL, NULL)
//   xCompileProgram(prog, n, options)        options from compile_args()
//   xGetProgramLogSize / xGetProgramLog      diagnostics, into the error Status
//   hiprtcGetCode | nvrtcGetCUBIN (+ PTX)    the code
//   xDestroyProgram(&prog)
//
// The options: hiprtc gets --offload-arch=<arch[:features]>, -O<n>,
// -mwavefrontsize64 for wave64 on RDNA, -std=c++17; nvrtc gets
// --gpu-architecture=sm_XX (a cubin, so the driver needs no PTX JIT),
// -std=c++17, -default-device and no fast math (exp2 must stay exact);
// CompileOptions::extra_flags come last.
//
// The vendor compilers run inside this process and cannot be interrupted. With
// CompileOptions::isolate a compile runs on its own thread and one that passes
// the time limit is reported as an error; the thread is left to finish on its
// own (its result is dropped). isolate = false compiles on the calling thread.
#pragma once

#include "compiler/compiler.h"

#include <memory>
#include <string>
#include <vector>

namespace flashjit::compiler {

enum class RtcKind { hiprtc, nvrtc };

/// A loaded library and its function table (defined in rtc_compiler.cpp);
/// loaded once per process and path, never unloaded.
struct RtcLibrary;

class RtcCompiler : public Compiler {
public:
  /// Loads the library from the places search_paths() lists, in order.
  static Expected<std::unique_ptr<RtcCompiler>> load(RtcKind kind);
  /// Loads the library from the first of `candidates` that loads; a name
  /// without '/' goes through the dynamic loader's search path. The error names
  /// every candidate and why it failed.
  static Expected<std::unique_ptr<RtcCompiler>> load(RtcKind kind,
                                                     const std::vector<std::string> &candidates);
  /// hiprtc: $ROCM_PATH/lib, /opt/rocm/lib, then the loader path; nvrtc:
  /// $CUDA_PATH/lib64, /usr/local/cuda/lib64,
  /// /usr/local/cuda/targets/x86_64-linux/lib, then the loader path; each with
  /// the unversioned name first (libnvrtc.so, .so.13, .so.12).
  static std::vector<std::string> search_paths(RtcKind kind);

  /// "hiprtc" or "nvrtc".
  std::string name() const override;
  /// From the library's version call: "nvrtc 13.0", "hiprtc 6.2".
  std::string identity() const override;
  /// AMD: the code object (ELF) for options.arch ("gfx1201"); NVIDIA: the
  /// cubin (ELF) for options.arch ("sm_90"). Errors carry the compiler's log.
  Expected<CodeObject> compile(std::string_view source, const CompileOptions &options) override;
  /// nvrtc only: the PTX for the virtual architecture of options.arch
  /// ("sm_90" -> compute_90), for drivers newer than this nvrtc knows.
  Expected<std::string> compile_ptx(std::string_view source, const CompileOptions &options);

  /// The options compile() hands to xCompileProgram (`ptx`: for compile_ptx).
  static Expected<std::vector<std::string>>
  compile_args(RtcKind kind, const CompileOptions &options, bool ptx = false);
  /// The library file that was loaded, as found.
  const std::string &library_path() const;
  RtcKind kind() const { return kind_; }

  explicit RtcCompiler(RtcKind kind, const RtcLibrary *library) : kind_(kind), library_(library) {}

private:
  RtcKind kind_;
  const RtcLibrary *library_;
};

std::string_view rtc_name(RtcKind kind);

} // namespace flashjit::compiler
