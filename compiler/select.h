// Choosing the compiler for a target: `flashjit --compiler auto|llvm|hiprtc|nvrtc`.
//
//   AMD targets (gfx...):  auto = hiprtc when a working ROCm is present (the
//                          library loads and a probe kernel compiles for the
//                          target), else the in-process LLVM compiler when this
//                          build has it.
//   NVIDIA targets (sm_...): auto = nvrtc.
//
// A compiler that was asked for by name and is missing gives an error naming
// where it was looked for; one that cannot serve the target's family says so.
#pragma once

#include "compiler/compiler.h"
#include "target/arch.h"

#include <memory>
#include <string_view>
#include <vector>

namespace flashjit::compiler {

using target::Vendor;

/// "gfx1201", "gfx90a:xnack-" -> amd; "sm_90", "sm_90a" -> nvidia; else an error
/// (target::vendor_of_name, with a message).
Expected<Vendor> target_vendor(std::string_view target_id);

/// The names make_compiler() accepts, "auto" first.
const std::vector<std::string_view> &compiler_names();

/// The compiler `name` for `target_id`. With "auto" the reason for the choice is
/// logged at FLASHJIT_DEBUG >= 1.
Expected<std::unique_ptr<Compiler>> make_compiler(std::string_view name,
                                                  std::string_view target_id);

} // namespace flashjit::compiler
