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
/// `--attn-mask TYPE[:AXES]` (a warmup manifest's "attn_mask" too): the mask
/// type and dense strides over the named axes of [batch, heads, seqlen_q,
/// seqlen_k] (0 for the broadcast ones), from `s`'s shapes.
Status set_attn_mask(const std::string &value, AttentionSpec &s);
/// Overrides the knobs of `base` that the flags set.
Expected<ir::Config> config_from(const Args &a, ir::Config base = {});

} // namespace flashjit::cli
