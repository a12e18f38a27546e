// What the C API needs beyond the public C++ API: which stage of a call failed,
// so that it can return an error code as well as the message.
#pragma once

#include "runtime/attention.h"

namespace flashjit::detail {

/// The stage a call failed in; each maps to one fj_error code.
enum class Failure {
  none,
  argument,    ///< a null or misaligned pointer, a malformed name or option
  spec,        ///< AttentionSpec::validate
  device,      ///< the device: its name, its library, its index
  unsupported, ///< no generated kernel: unknown arch, no rules, does not fit
  compile,     ///< no compiler, or the compile failed
  runtime,     ///< module load, launch, copies, the emulator or interpreter
};

/// Records the failing stage for the C API (where `out` is not null) and
/// passes the Status on.
inline Status failed(Failure *out, Failure stage, Status status) {
  if (out)
    *out = stage;
  return status;
}

struct AttentionAccess {
  static Expected<Attention> create(const AttentionSpec &spec, const Device &device,
                                    const Options &options, Failure *failure);
  static Status forward(Attention &attention, const AttentionSpec &shape,
                        const AttentionTensors &tensors, void *stream, Failure *failure);
  static Status backward(Attention &attention, const AttentionSpec &shape,
                         const BackwardTensors &tensors, void *stream, Failure *failure);
  static Expected<std::string> emit_source(const AttentionSpec &spec, std::string_view arch,
                                           const Options &options, Failure *failure);
  static Expected<std::string> compile_report(const AttentionSpec &spec, std::string_view arch,
                                              const Options &options, Failure *failure);
};

} // namespace flashjit::detail
