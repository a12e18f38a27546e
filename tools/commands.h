// Command groups of the flashjit tool, each in its own file; flashjit.cpp
// lists them.
#pragma once

#include "tools/cli.h"

#include <vector>

namespace flashjit::cli {

/// `flashjit cache stats|list|clear`, `flashjit warmup --manifest FILE`,
/// `flashjit knobs` (tools/cmd_cache.cpp).
std::vector<Command> cache_commands();

/// `flashjit archs [--arch ARCH] [--json]`: the supported archs with their
/// family, wave size, LDS, matrix instructions and rules, then the compilers
/// and devices on this machine (tools/cmd_archs.cpp).
std::vector<Command> archs_commands();

/// `flashjit tune` (the fastest config of a signature on a device, into the
/// tuned-config database) and `flashjit bench` (TFLOP/s over head dims and
/// lengths) (tools/cmd_tune.cpp).
std::vector<Command> tune_commands();

} // namespace flashjit::cli
