// Kernels written directly rather than built as tile IR (the split-KV combine,
// the mask-block summary, the backward's preprocess, reduce and sinks kernels):
// their parameter list, scalars and the source around their text, one copy.
#pragma once

#include "lowering/emitter.h"
#include "lowering/hip_writer.h"
#include "lowering/lower.h"
#include "templates/templates.h"

#include <initializer_list>
#include <string_view>
#include <utility>

namespace flashjit::lowering {

/// Appends scalar parameters (name, type) to `out`.
inline void add_scalars(Lowered &out,
                        std::initializer_list<std::pair<const char *, ir::ScalarType>> scalars) {
  for (const auto &[name, type] : scalars)
    out.params.push_back({name, KernelParam::Kind::scalar, type, emit::c_scalar_type(type)});
}

/// On sm_90 a kernel's first statement where the runtime may launch it while the
/// kernel before it on the stream still runs (a programmatic dependent launch,
/// Lowered::waits_for_previous): wait for that kernel. Returns whether it wrote it.
inline bool emit_grid_dependency_wait(HipWriter &w, const Target &target) {
  if (target.family != Family::sm90)
    return false;
  w.line("fj_grid_dependency_wait(); // the kernel before it on the stream is done");
  return true;
}

/// The kernel's signature from out.params, then its body's opening brace.
inline void open_direct_kernel(HipWriter &w, const Lowered &out) {
  w.line("FJ_GLOBAL FJ_WORKGROUP_SIZE({})", out.block_threads);
  w.line("void {}(", out.kernel_name);
  w.indent(2);
  for (size_t i = 0; i < out.params.size(); ++i) {
    const KernelParam &p = out.params[i];
    w.line("{}{}{}{}", p.c_type, p.kind == KernelParam::Kind::tensor ? "__restrict__ " : " ",
           p.name, i + 1 < out.params.size() ? "," : ") {");
  }
  w.indent(-2);
  w.indent(1);
}

/// The kernel text and the source around it (a header saying `what` it computes
/// and `how`, then the target's prelude); 4-byte aligned pointers and 32-bit row
/// strides unless the caller says otherwise after.
inline void finish_direct_kernel(Lowered &out, const Target &target, const HipWriter &kernel,
                                 std::string_view what, std::string_view how) {
  out.kernel_text = kernel.str();
  HipWriter full;
  full.line("// flashjit kernel {} for {}: {}", out.kernel_name, target.target_id(), what);
  full.line("// (no tile IR: {}; see docs/decisions.md).", how);
  full.blank();
  full.raw(target.is_nvidia() ? templates::cuda_prelude : templates::amdgcn_prelude);
  full.blank();
  full.raw(out.kernel_text);
  out.source = full.str();
  out.pointer_alignment = 4;
  out.max_row_stride = INT32_MAX;
}

} // namespace flashjit::lowering
