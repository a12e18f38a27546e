#include "lowering/resources.h"

#include "ir/build.h"
#include "lowering/emitter.h"

#include <algorithm>

namespace flashjit::lowering {

using emit::kKTile;
using emit::staged_tile_bytes;

ResourceEstimate estimate_resources(const AttentionSpec &spec, const ir::Config &c, const Rules &r,
                                    const Target &t, bool split_partials) {
  ResourceEstimate e;
  e.rules = r.name();
  e.dim_qk = ir::padded(spec.head_dim_qk, c.pad_k);
  e.dim_v = ir::padded(spec.head_dim_v, c.pad_k);
  // The tiles as the emitter stages them (KernelEmitter::register_lds): K
  // row-major, V transposed or row-major as the rules read it, Q where it lives there.
  e.lds_k = staged_tile_bytes(c.block_n, e.dim_qk, false, r.lds_layout());
  e.lds_v = staged_tile_bytes(c.block_n, e.dim_v, r.v_transposed(), r.lds_layout());
  e.lds_q = c.q_in_lds ? staged_tile_bytes(c.block_m, e.dim_qk, false, r.lds_layout()) : 0;
  if (c.prefetch_blocks) { // two copies of K and V: the next block's copies are in flight
    e.lds_k *= 2;
    e.lds_v *= 2;
  }
  // TMA copies (whole swizzled panels of dense tensors with 16-byte aligned
  // rows, KernelEmitter::tma_tile): a barrier per tile of one copy.
  const KernelSignature sig = spec.signature();
  if (r.lds_layout() == LdsLayout::swizzled_128b && sig.row_align >= 16) {
    using emit::tma_tile_shape;
    const bool ring = c.stages == 3; // the forward's producer warpgroup
    const emit::TmaUse use = ring ? emit::TmaUse::producer : emit::TmaUse::forward;
    const bool q = c.q_in_lds && !sig.packed_q && !sig.grouped_q && sig.unit_dim[0] &&
                   tma_tile_shape(c.block_m, e.dim_qk, use);
    const bool kv = !sig.packed_k && !sig.used_k && !sig.paged;
    const bool k = kv && sig.unit_dim[1] && tma_tile_shape(c.block_n, e.dim_qk, use),
               v = kv && sig.unit_dim[2] && tma_tile_shape(c.block_n, e.dim_v, use);
    e.lds_barriers = 8 * ((q ? 1 : 0) + (k ? 1 : 0) + (v ? 1 : 0));
    if (ring && k && v) { // two copies of K and V, each with a fill and a free barrier
      e.lds_k *= 2;
      e.lds_v *= 2;
      e.lds_barriers += 8 * 6;
      if (ir::has_block_range(spec, c)) // fj_ring_block: two ints
        e.lds_barriers += 8;
      if (c.persistent && spec.causal) // fj_tile_slot and fj_tile_bar (emit_persistent)
        e.lds_barriers += 16 + 32;
    }
  }
  // O's store through LDS rows (KernelEmitter::emit_store): its 16-bit tile.
  if (!split_partials && r.stages_output(spec.head_dim_v) &&
      emit::output_stage_applies(sig.f32_io, sig.unit_dim[3], sig.row_align, spec.head_dim_v))
    e.lds_o = emit::output_stage_bytes(c.waves, e.dim_v, e.lds_bytes(), t, r.resident_workgroups());
  // Per query tile, the arrays the emitter declares: O and S as acc_elems() f32
  // per n_tile() columns, Q as the operand fragment's 16-bit elements per 16
  // head-dim entries, two to a register (gfx12: dim_v / 2 + dim_qk / 4 + block_n / 2).
  const int64_t acc = r.acc_elems(), n_tile = r.n_tile();
  const int64_t operand = r.operand_run_len() * int64_t(r.operand_runs().size());
  e.q_tiles = std::max<int64_t>(1, c.block_m / (r.m_tile() * c.waves));
  e.o_regs = e.q_tiles * (e.dim_v * acc / n_tile);
  e.q_regs = c.q_in_lds ? 0 : e.q_tiles * (e.dim_qk * operand / (2 * kKTile));
  e.s_regs = e.q_tiles * (c.block_n * acc / n_tile);
  return e;
}

int64_t resident_per_unit(const Lowered &kernel, const Target &t) {
  // Four SIMDs per compute unit on every family flashjit targets: a CDNA CU, an
  // RDNA workgroup processor (two CUs of two SIMD32s), an NVIDIA SM's four
  // partitions.
  constexpr int64_t kSimdsPerUnit = 4;
  const int64_t waves = std::max<int64_t>(1, kernel.block_threads / std::max(t.wave_size, 1));
  int64_t resident = kSimdsPerUnit * t.max_waves_per_simd / waves;
  if (kernel.lds_bytes > 0)
    resident = std::min<int64_t>(resident, t.lds_bytes_per_cu / kernel.lds_bytes);
  return std::max<int64_t>(resident, 1);
}

} // namespace flashjit::lowering
