// The resource model: what an attention kernel of a spec and config costs on the
// rules that lower it, in LDS bytes per workgroup and in 32-bit registers per
// lane (VGPRs on AMD) that live across the KV loop. check_fits sizes every config
// with it. The emitter lays out its LDS with the same staged_tile_bytes
// (emitter.h) and declares its register arrays from the same fragment counts of
// the rules; tests/resources_test.cpp checks the estimate against the arrays of
// emitted kernels, buffer by buffer and array by array.
#pragma once

#include "ir/build.h"
#include "lowering/lower.h"
#include "lowering/target.h"

#include <cstdint>
#include <string_view>

namespace flashjit::lowering {

class Rules;

struct ResourceEstimate {
  std::string_view rules; ///< the rule set the estimate is for, e.g. "gfx12"
  int64_t dim_qk = 0;     ///< head_dim_qk padded to the config's pad_k
  int64_t dim_v = 0;      ///< head_dim_v padded to the config's pad_k

  // ---- LDS bytes per workgroup, one staged tile each ----
  int64_t lds_k = 0; ///< the K tile (block_n x dim_qk, row-major)
  int64_t lds_v = 0; ///< the V tile (block_n x dim_v, transposed where the rules say)
  int64_t lds_q = 0; ///< the Q block (block_m x dim_qk) under config q_in_lds, else 0
  /// The transaction barriers of the tiles copied with TMA (8 bytes each; the
  /// sm90 rules, KernelEmitter::tma_tile), after the tiles.
  int64_t lds_barriers = 0;
  /// The rows of their own through which the forward's store of O goes where the
  /// rules stage it and they fit (Rules::stages_output, emit::output_stage_bytes),
  /// after the rest at a 16-byte aligned offset; 0 where they lie over the tiles.
  int64_t lds_o = 0;
  int64_t lds_bytes() const {
    const int64_t rest = lds_k + lds_v + lds_q + lds_barriers;
    return lds_o ? ir::padded(rest, 16) + lds_o : rest;
  }

  // ---- registers per lane across the KV loop, over every query tile ----
  int64_t q_tiles = 0; ///< accumulator fragments of m_tile() queries per wave
  int64_t o_regs = 0;  ///< the O accumulator: f32, dim_v / n_tile fragments per tile
  int64_t q_regs = 0;  ///< the Q operand: 16-bit, two per register; 0 under q_in_lds
  int64_t s_regs = 0;  ///< the S accumulator: f32, block_n / n_tile fragments per tile
  int64_t loop_regs() const { return o_regs + q_regs + s_regs; }
};

/// Registers per lane the model leaves beside loop_regs(): addresses, indices
/// and the per-row statistics.
inline constexpr int64_t kReservedRegs = 24;
/// The most loop_regs() a config may need on `t`.
inline int64_t register_budget(const Target &t) { return t.max_vgprs - kReservedRegs; }

/// The estimate on given rules for `target`; `split_partials`: of split-KV's
/// first kernel (build_split_kv), whose f32 partial outputs have no lds_o.
ResourceEstimate estimate_resources(const AttentionSpec &spec, const ir::Config &config,
                                    const Rules &rules, const Target &target,
                                    bool split_partials = false);
/// The estimate on the rules that `choice` and the config select for the spec's
/// dtype on `target` (the ones check_fits and generate() take), or why none can.
Expected<ResourceEstimate> estimate_resources(const AttentionSpec &spec, const ir::Config &config,
                                              const Target &target,
                                              RulesChoice choice = RulesChoice::automatic,
                                              bool split_partials = false);

/// Workgroups of a lowered kernel that one compute unit of `t` holds at once,
/// by its LDS and waves alone (a GPU's driver also counts registers: the
/// runtime asks it where there is one). At least 1.
int64_t resident_per_unit(const Lowered &kernel, const Target &t);

} // namespace flashjit::lowering
