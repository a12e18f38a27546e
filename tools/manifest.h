// The manifest of `flashjit warmup`: a JSON list of kernels, each naming a
// target and a spec, and perhaps overriding the tuning config:
//   [{"arch": "gfx1201", "heads": 16, "kv_heads": 4, "seqlen_q": 512,
//     "head_dim": 128, "dtype": "bf16", "causal": true},
//    {"arch": "gfx90a", "head_dim": 64, "block_n": 32}]
// Fields and defaults are those of the spec flags (`flashjit emit --help`):
// batch heads kv_heads seqlen_q seqlen_k head_dim head_dim_v (integers), dtype
// layout (strings), causal lse (booleans), window ([left, right]), scale
// (number), block_m block_n waves mma_m (config), compiler (auto|llvm|hiprtc|nvrtc).
// Integers are written as integers: 128, not 128.0, 1.28e2 or 0x80.
// Every item's spec is validated; an unknown field is an error.
#pragma once

#include "ir/spec.h"
#include "ir/status.h"

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace flashjit::cli {

struct WarmupItem {
  std::string arch;
  std::string compiler = "auto";
  AttentionSpec spec;
  std::optional<int64_t> block_m, block_n, waves, mma_m;
};

/// Reads the manifest at `path` (a regular JSON file of bounded size).
Expected<std::vector<WarmupItem>> read_manifest(const std::string &path);
/// The same for a manifest's text; `path` only names it in messages.
Expected<std::vector<WarmupItem>> parse_manifest(std::string_view text, const std::string &path);

} // namespace flashjit::cli
