// The device compiler interface: HIP source in, an AMDGPU code object (the HSA
// ELF shared object that hipModuleLoadData accepts) out. The runtime talks to
// this interface only; llvm_compiler.h implements it with the Clang and LLD
// libraries linked into the process.
#pragma once

#include "ir/status.h"

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace flashjit::compiler {

struct CompileOptions {
  /// Processor, e.g. "gfx1201" or "gfx90a".
  std::string arch;
  /// Target-ID features without the processor, ':'-separated, e.g. "xnack-" or
  /// "sramecc+:xnack-"; empty for the processor's defaults.
  std::string features;
  /// 32 or 64. RDNA compiles wave32 unless 64 is asked for; CDNA is always 64.
  int wave_size = 32;
  /// Clang's -O level, 0 to 3.
  int opt_level = 3;
  /// Further Clang driver flags, appended after flashjit's own.
  std::vector<std::string> extra_flags;
  /// A compile still running after this long is stopped and reported.
  double timeout_seconds = 120;
  /// Compile in a forked child of this process (the same in-process libraries,
  /// no exec): a crash or LLVM fatal error in the compiler cannot take the host
  /// down, and the time limit can be enforced. false compiles on the calling
  /// thread, for debugging: no time limit, and a compiler crash is the host's.
  bool isolate = true;
};

struct CodeObject {
  /// The processor it was compiled for, as CompileOptions::arch.
  std::string arch;
  /// The ELF image.
  std::vector<uint8_t> bytes;
  /// Compiler::identity() of the compiler that made it (part of cache keys).
  std::string compiler;
  /// The compiler's log of this compile (warnings; with nvrtc and
  /// `--ptxas-options=-v` in extra_flags, ptxas's registers and spills). Not
  /// cached: a code object from the cache has none.
  std::string log;
};

class Compiler {
public:
  virtual ~Compiler();
  /// Short name, e.g. "llvm".
  virtual std::string name() const = 0;
  /// Name and exact version, e.g. "llvm 22.1.8": different identities may
  /// produce different code for the same source.
  virtual std::string identity() const = 0;
  /// Compiles one HIP translation unit (device code only; the source brings
  /// its own prelude, no HIP headers are available). Errors carry the
  /// compiler's diagnostics, with source lines and carets.
  virtual Expected<CodeObject> compile(std::string_view source, const CompileOptions &options) = 0;
};

} // namespace flashjit::compiler
