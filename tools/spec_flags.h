// The spec and config flags shared by every subcommand.
#pragma once

#include "ir/build.h"
#include "ir/spec.h"
#include "tools/cli.h"

namespace flashjit::cli {

std::vector<FlagSpec> spec_flags();
std::vector<FlagSpec> config_flags();
/// Builds and validates the spec from the flags.
Expected<AttentionSpec> spec_from(const Args &a);
/// Overrides the knobs of `base` that the flags set.
Expected<ir::Config> config_from(const Args &a, ir::Config base = {});

} // namespace flashjit::cli
