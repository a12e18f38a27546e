// The backward pass's two kernels around its tile-IR programs (ir/build_backward.cpp):
//
//   preprocess  per query row: D = rowsum(dO * O) and L = LSE * log2(e), +inf
//               for a row that sees no key (LSE = -inf), so that P = 2^(S - L) is 0;
//   reduce      per key row and KV head: dK = sum over the group's query heads of
//               the dK/dV program's f32 results, converted to the dtype (likewise dV);
//               with GQA or packed keys only (ir::backward_dkdv_direct);
//   sinks       per head, with attention sinks: dsink = -sum over the head's rows of
//               P_sink * D, P_sink = exp(sink - LSE) = 2^(sink log2(e) - L).
//
// A sink joins each row's softmax with its logit and no value, and the forward's
// LSE counts it: the dQ and dK/dV programs, which take P from L, need nothing
// more, and the sink's own gradient is the softmax's, p_sink * (0 - D).
//
// None has a matrix product or a tile: loops over rows, written here directly
// like the split-KV combine (docs/decisions.md). Each sums in a fixed order, so
// results are the same run to run; the preprocess sums in ir::backward_preprocess's
// order.
#include "lowering/lower.h"

#include "ir/build.h"
#include "lowering/direct_kernel.h"
#include "lowering/resources.h"

#include <algorithm>
#include <initializer_list>
#include <numbers>
#include <optional>

namespace flashjit::lowering {

namespace {

constexpr int kThreads = 128;
// reduce: a workgroup sums kRows key rows, each over kColThreads work-items.
constexpr int kColThreads = 32, kRows = kThreads / kColThreads;
// preprocess: kPreLanes work-items per query row (ir::backward_preprocess sums
// in their order).
constexpr int kPreLanes = 8;

void element_type(HipWriter &w, DType t) {
  w.line("// ---- the element type ({}) ----", dtype_name(t));
  w.line("FJ_DEVICE float fj_to_f32(fj_bits x) {{ return fj_{}_to_f32(x); }}", dtype_name(t));
  w.line("FJ_DEVICE fj_bits fj_from_f32(float x) {{ return fj_f32_to_{}(x); }}", dtype_name(t));
  w.blank();
}

/// The live registers per lane of the backward's loops, as backward_config
/// counts them to choose blocks and the dK/dV program's passes.
class LoopRegisters {
public:
  LoopRegisters(const AttentionSpec &spec, const Target &target, const ir::Config &config,
                bool dkdv)
      : target_(target), dkdv_(dkdv), dqk_(ir::padded(spec.head_dim_qk, config.pad_k)),
        dv_(ir::padded(spec.head_dim_v, config.pad_k)), gfx11_(target.family == Family::gfx11),
        cdna_(!target.is_nvidia() && target.family != Family::gfx11 &&
              target.family != Family::gfx12) {
    // Per-score modifiers hold registers of their own across the loop, which
    // rdna_fits adds to its count. LLVM 22, head dim 64: gfx1201's dK/dV (32-key
    // blocks) 191 VGPRs plain, with dropout 233 (its draws), a bool mask tensor
    // 227, a 16-bit one 211, softcap 208; on gfx1100 those spilled 8-33 VGPRs at
    // head dims 64 to 96. The dQ count is near LLVM's on gfx11 (250 VGPRs
    // counted 256 at head dim 96), where the modifiers spilled 8-19, but high on
    // gfx12 (187 counted 238 at 64), which did not spill with them: only gfx11's
    // dQ counts them (docs/decisions.md, "RDNA's backward without spills").
    const bool bool_mask = spec.mask == MaskType::boolean;
    if (dkdv || gfx11_) {
      if (spec.dropout_p > 0)
        modifiers_ += dkdv ? 40 : 8;
      if (spec.mask != MaskType::none)
        modifiers_ += bool_mask ? (dkdv ? 32 : 16) : (dkdv ? 20 : 8);
      if (spec.softcap > 0)
        modifiers_ += dkdv ? 20 : 8;
    }
  }

  // dK/dV: two passes (dV's loop, then dK's) where the one loop's live
  // registers per lane -- dK and dV, S^T and dP^T, the row operands K and V
  // where they are not in LDS -- pass the register budget (resources.h): that
  // loop must spill. Measured on the H100: 1.8x at head dim 256 (288 by this
  // count), 0.8x at 192 (224, fits), so only where the one loop cannot fit.
  int64_t passes(const ir::Config &c) const {
    if (!dkdv_)
      return 1;
    const double per_col = 16.0 / double(target_.wave_size); // f32 per lane and column, 16 rows
    double regs = per_col * double(dqk_ + dv_ + 2 * c.block_n);
    if (!c.q_in_lds) {
      regs += per_col / 2 * double(dqk_ + dv_); // 16-bit operands, two per register
      // CDNA (two query tiles a wave) holds the loop block's operands too: on
      // gfx950 at head dims 224 and 256 (64-key blocks) LLVM 22 took 512 VGPRs
      // and spilled 216 and 372 in one pass, none in two (442 and 500).
      if (cdna_)
        regs += double(c.block_n * (dqk_ + dv_)) / 64;
    }
    return regs > double(register_budget(target_)) ? 2 : 1;
  }

  // RDNA's loops (wave32 WMMA, 16 rows per wave): the VGPRs per lane that LLVM
  // 22 allocates, fitted to its allocations on gfx1201 and gfx1100 (flashjit
  // compile --kernel backward-dkdv|backward-dq --resources, head dims 64-128,
  // 16-, 32- and 64-row blocks; docs/decisions.md, "RDNA's backward without
  // spills"): the accumulators (dK and dV, one of them with two passes; dQ),
  // about 2.6 per column of the loop's block (3 on gfx11) for S, dP and what the
  // loop makes of them, the workgroup's rows as operands (K and V; Q and dO),
  // and the loop's block as operands: a few tiles from LDS, or the whole block
  // where it is not in LDS. gfx11 holds each 16-bit operand twice (its WMMA
  // reads a row from both halves of the wave). Whether the loop with blocks of
  // `bn` in `passes` passes fits the VGPRs by that count.
  bool rdna_fits(int64_t bn, bool operands_in_lds, int64_t passes) const {
    const double dup = gfx11_ ? 2.0 : 1.0;
    const double acc = double(!dkdv_ ? dqk_ : passes == 2 ? std::max(dqk_, dv_) : dqk_ + dv_) / 2;
    const double operands = operands_in_lds ? 8.0 * dup : double(bn * (dqk_ + dv_)) / 64 * dup;
    const double per_column = gfx11_ ? 3.0 : 2.6;
    const double regs =
        acc + per_column * double(bn) + double(dqk_ + dv_) / 4 * dup + operands + modifiers_;
    return regs <= double(target_.max_vgprs);
  }

  double modifiers() const { return modifiers_; }

private:
  const Target &target_;
  bool dkdv_;
  int64_t dqk_, dv_;
  bool gfx11_, cdna_;
  double modifiers_ = 0;
};

} // namespace

int64_t backward_dkdv_passes(const AttentionSpec &spec, const Target &target,
                             const ir::Config &config) {
  const LoopRegisters regs(spec, target, config, true);
  const bool rdna = target.family == Family::gfx11 || target.family == Family::gfx12;
  if (rdna)
    return regs.rdna_fits(config.block_n, config.q_in_lds, 1) ? 1 : 2;
  return regs.passes(config);
}

ir::Config backward_config(const AttentionSpec &spec, const Target &target, ir::Config config,
                           bool dkdv) {
  config.mma_m = 16; // CDNA's 32x32 MFMAs would need 32-key blocks and dims padded to 32
  // Stages 2 (the forward's default on NVIDIA): the loop prefetches the next
  // block's tiles into a second copy of its LDS buffers.
  config.stages = std::clamp<int64_t>(config.stages, 1, 2);
  config.persistent = false; // a forward knob
  const int64_t copies = config.stages;
  const int64_t dqk = ir::padded(spec.head_dim_qk, config.pad_k);
  const int64_t dv = ir::padded(spec.head_dim_v, config.pad_k);
  // The staged tiles as the emitter lays them out: the loop's two B operands
  // row-major, and transposed again where the rules read B transposed (AMD);
  // the dK/dV loop's two per-query vectors.
  const bool transposed = !target.is_nvidia();
  auto lds = [&](int64_t bm, int64_t bn, bool operands_in_lds, LdsLayout layout) {
    auto tile = [&](int64_t rows, int64_t cols, bool t) {
      return emit::staged_tile_bytes(rows, cols, t, layout);
    };
    int64_t loop = tile(bn, dqk, false) + tile(bn, dv, false);
    if (transposed)
      loop += tile(bn, dqk, true) + (dkdv ? tile(bn, dv, true) : 0);
    if (dkdv)
      loop += 2 * ((bn * 4 + 15) / 16 * 16);
    return (operands_in_lds ? tile(bm, dqk, false) + tile(bm, dv, false) : 0) + copies * loop;
  };
  const bool rdna = target.family == Family::gfx11 || target.family == Family::gfx12;
  const bool gfx11 = target.family == Family::gfx11;
  const LoopRegisters regs(spec, target, config, dkdv);
  if (target.is_nvidia()) {
    // The first of the family's rules with a block of their own that fits
    // (sm90: warpgroup products); else the warp-wide mma.sync rules (the
    // family's last) with their block and waves, not a forward config made
    // for warpgroup products.
    const std::vector<const Rules *> rules = matrix_rules_for(target);
    for (const Rules *r : rules) {
      const std::optional<ir::Config> own = r->backward_block(spec, dkdv);
      if (own &&
          lds(own->block_m, own->block_n, own->q_in_lds, r->lds_layout()) <= target.lds_bytes) {
        config.block_m = own->block_m;
        config.block_n = own->block_n;
        config.waves = own->waves;
        config.q_in_lds = own->q_in_lds;
        config.dkdv_passes = regs.passes(config);
        return config;
      }
    }
    const ir::Config mma_sync = rules.back()->default_config(spec);
    config.waves = mma_sync.waves;
    // 16 rows per warp above head dim 96: the forward's two tiles per warp
    // there (Q in LDS) are measured for the forward only.
    config.block_m = std::max(dqk, dv) > 96 ? 16 * config.waves : mma_sync.block_m;
  }
  // gfx12 at wide head dims: blocks of fewer rows (waves x 16) whose row
  // operands sit in LDS, with the widest of `key_blocks` the LDS holds, where
  // 64-row blocks spill (docs/decisions.md, "gfx12's dQ at wide head dims"). gfx11,
  // which holds each operand twice, spills either way and keeps its config.
  auto rows_in_lds = [&](std::initializer_list<int64_t> waves,
                         std::initializer_list<int64_t> key_blocks,
                         int64_t passes) -> std::optional<ir::Config> {
    for (int64_t w : waves)
      for (int64_t bn : key_blocks)
        if (lds(16 * w, bn, true, LdsLayout::padded_rows) <= target.lds_bytes) {
          ir::Config c = config;
          c.block_m = 16 * w;
          c.waves = w;
          c.block_n = bn;
          c.q_in_lds = true;
          c.dkdv_passes = passes;
          return c;
        }
    return std::nullopt;
  };
  if (target.family == Family::gfx12 && !dkdv && (3 * dqk + dv) / 4 > 192) {
    // The dQ loop with 64-row blocks keeps dQ (dqk / 2 registers per lane), Q
    // (dqk / 4) and dO (dv / 4) in registers; past 192 of those LLVM 22 spills
    // (gfx1201: 83 VGPRs at head dim 224, 133 at 256, 114 at 256/128; none at
    // 192). 32 rows on two waves (16 on one where those pass the LDS): no spill
    // up to 288 (188-236 VGPRs), 16 at 320 (was 205); 384 and up fit no such
    // block and keep the 64-row one.
    if (auto c = rows_in_lds({2, 1}, {64, 32, 16}, 1))
      return *c;
  }
  if (target.family == Family::gfx12 && dkdv && std::max(dqk, dv) > 192) {
    // dK/dV's 64-row blocks in two passes spilled past head dim 192 (gfx1201: 6
    // VGPRs at 208, 44 at 224, 126 at 256, 54 at 256/128, 22 at 256/64). 16
    // rows on one wave with 16-key blocks, in two passes: 189-255 VGPRs and no
    // spill up to 256.
    if (auto c = rows_in_lds({1}, {16}, 2))
      return *c;
  }
  if (rdna) {
    // The largest block that fits both the LDS and the registers; else (dK/dV)
    // the smallest that fits the LDS, in two passes where one would spill. The
    // dQ loop's fit is known with its operands in LDS only (with them in
    // registers LLVM needed fewer than this counts): elsewhere it keeps the
    // first block that fits the LDS, below.
    // gfx11 holds each 16-bit operand twice: where the 64-row block's operands
    // do not fit the LDS beside the loop's tiles, they do not fit its registers
    // either (LLVM 22 with fj_pin, gfx1100: 48-228 VGPRs spilled by dK/dV at head
    // dims 152-256, 72-377 by dQ at 176-256). Fewer rows with the operands in
    // LDS and 16-key blocks instead: at most 1 spilled up to 256 (dQ at 224: 8).
    auto gfx11_rows = [&](const ir::Config &c) {
      if (!gfx11 || c.q_in_lds)
        return c;
      const int64_t passes = dkdv && !regs.rdna_fits(16, true, 1) ? 2 : 1;
      return rows_in_lds({2, 1}, {16}, passes).value_or(c);
    };
    std::optional<ir::Config> smallest;
    for (bool operands_in_lds : {true, false})
      for (int64_t bn : {64, 32, 16}) {
        if ((!dkdv && !operands_in_lds) ||
            lds(config.block_m, bn, operands_in_lds, LdsLayout::padded_rows) > target.lds_bytes)
          continue;
        ir::Config c = config;
        c.block_n = bn;
        c.q_in_lds = operands_in_lds;
        if (regs.rdna_fits(bn, operands_in_lds, 1)) {
          c.dkdv_passes = 1;
          return gfx11_rows(c);
        }
        if (!smallest || bn < smallest->block_n ||
            (bn == smallest->block_n && operands_in_lds && !smallest->q_in_lds))
          smallest = c;
      }
    if (smallest && dkdv) {
      smallest->dkdv_passes = regs.rdna_fits(smallest->block_n, smallest->q_in_lds, 1) ? 1 : 2;
      return gfx11_rows(*smallest);
    }
    // dQ where no block fits the count: on gfx11, or with modifiers, the
    // smallest block with the operands in LDS. The first to fit the LDS below
    // spilled more: gfx1100, head dim 160, 294 VGPRs (32-key blocks, operands
    // in registers) against 26; 128 with a bool mask 109 against 8.
    if (smallest && (regs.modifiers() > 0 || gfx11))
      return *smallest;
    if (gfx11 && !dkdv) // no 64-row block holds dQ's operands in LDS
      if (auto c = rows_in_lds({2, 1}, {16}, 1))
        return *c;
  }
  for (bool operands_in_lds : {true, false})
    for (int64_t bn : {64, 32, 16}) {
      if (operands_in_lds && bn < 32)
        continue;
      if (lds(config.block_m, bn, operands_in_lds, LdsLayout::padded_rows) <= target.lds_bytes) {
        config.block_n = bn;
        config.q_in_lds = operands_in_lds;
        config.dkdv_passes = regs.passes(config);
        return config;
      }
    }
  config.block_n = 16; // the lowering says what does not fit
  config.q_in_lds = false;
  config.dkdv_passes = regs.passes(config);
  return config;
}

ir::Bindings bind_backward_kernels(const AttentionSpec &spec) {
  ir::Bindings b = ir::bind_backward(spec);
  // Packed rows (varlen) are one batch of all the rows: the preprocess and the
  // reduce are per row and need no sequence bounds (the reduce zeroes the rows
  // past the last sequence).
  const Sequences &seqs = spec.seqs;
  const int64_t batches_q = spec.q_batches(), rows_q = spec.q_rows();
  const int64_t batches_k = seqs.packed_k ? 1 : spec.batch;
  const int64_t rows_k = seqs.packed_k ? seqs.total_k : spec.seqlen_k;
  b.set_int("rows", batches_q * spec.heads * rows_q);
  b.set_int("rows_k", batches_k * spec.kv_heads * rows_k);
  b.set_int("q_rows", rows_q);
  b.set_int("q_batches", batches_q);
  b.set_int("k_rows", rows_k);
  for (const auto &[prefix, s] :
       {std::pair{"o", &spec.o}, std::pair{"k", &spec.k}, std::pair{"v", &spec.v}}) {
    b.set_int(fmt::format("{}_batch_stride", prefix), s->batch);
    b.set_int(fmt::format("{}_head_stride", prefix), s->head);
    b.set_int(fmt::format("{}_seq_stride", prefix), s->seq);
    b.set_int(fmt::format("{}_dim_stride", prefix), s->dim);
  }
  // The forward's LSE: [batch, heads, seqlen_q], or [heads, total_q] when packed.
  b.set_int("lse_batch_stride", seqs.packed_q ? 0 : spec.heads * spec.seqlen_q);
  b.set_int("lse_head_stride", rows_q);
  return b;
}

Expected<Lowered> lower_backward_preprocess(const AttentionSpec &spec, const Target &target) {
  FJ_RETURN_IF_ERROR(ir::validate_backward(spec));
  const KernelSignature sig = spec.signature();
  Lowered out;
  out.kernel_name = fmt::format("fa_bwd_pre_{}_d{}{}", dtype_name(sig.dtype), sig.head_dim_v,
                                sig.unit_dim[3] ? "" : "_strided");
  out.params = {
      {"dO", KernelParam::Kind::tensor, ir::ScalarType::i64, "const fj_bits *"},
      {"O", KernelParam::Kind::tensor, ir::ScalarType::i64, "const fj_bits *"},
      {"LSE", KernelParam::Kind::tensor, ir::ScalarType::i64, "const float *"},
      {"L", KernelParam::Kind::tensor, ir::ScalarType::i64, "float *"},
      {"D", KernelParam::Kind::tensor, ir::ScalarType::i64, "float *"},
  };
  add_scalars(out, {{"rows", ir::ScalarType::i64},
                    {"heads", ir::ScalarType::i32},
                    {"q_rows", ir::ScalarType::i32},
                    {"o_batch_stride", ir::ScalarType::i64},
                    {"o_head_stride", ir::ScalarType::i64},
                    {"o_seq_stride", ir::ScalarType::i32},
                    {"o_dim_stride", ir::ScalarType::i32},
                    {"do_batch_stride", ir::ScalarType::i64},
                    {"do_head_stride", ir::ScalarType::i64},
                    {"do_seq_stride", ir::ScalarType::i32},
                    {"do_dim_stride", ir::ScalarType::i32},
                    {"lse_batch_stride", ir::ScalarType::i64},
                    {"lse_head_stride", ir::ScalarType::i64}});
  out.grid = {ir::GridAxis{-1, ir::Extent::of("rows"), kThreads / kPreLanes}};
  out.block_threads = kThreads;

  HipWriter w;
  element_type(w, sig.dtype);
  // Runs of 8 elements (16 bytes) read at once where the rows allow it.
  const bool runs = sig.unit_dim[3] && sig.head_dim_v % 8 == 0;
  w.line("constexpr int kDimV = {}; // head_dim_v", sig.head_dim_v);
  w.line("constexpr int kLanes = {}; // work-items per row", kPreLanes);
  w.line("constexpr int kRows = {}; // rows per workgroup", kThreads / kPreLanes);
  w.line("constexpr int kRuns = {}; // runs of 8 elements per row", (sig.head_dim_v + 7) / 8);
  w.blank();
  w.line("// Row r = (batch * heads + head) * q_rows + query of L and D (dense; packed rows");
  w.line("// are one batch of total_q rows), kLanes work-items per row: L[r] = LSE[r] *");
  w.line("// log2(e), and D[r] = sum_d dO[r][d] * O[r][d] in a fixed order (lane j sums the");
  w.line("// runs j, j + kLanes, ... of 8 elements in order, then the lanes' sums as a tree:");
  w.line("// ((j0 + j4) + (j2 + j6)) + ((j1 + j5) + (j3 + j7))), the same on every target.");
  open_direct_kernel(w, out);
  w.line("const int tid = fj_thread_id();");
  w.line("const int lane = tid % kLanes;");
  w.line("const long row = long(fj_group_id_x()) * kRows + tid / kLanes;");
  w.line("const bool valid = row < rows; // every lane takes part in the shuffles below");
  w.line("const long r = valid ? row : 0;");
  w.line("const int query = int(r % q_rows);");
  w.line("const int head = int(r / q_rows % heads);");
  w.line("const long batch = r / q_rows / heads;");
  w.line("const fj_bits *o = O + batch * o_batch_stride + head * o_head_stride + long(query) * "
         "o_seq_stride;");
  w.line("const fj_bits *d_o = dO + batch * do_batch_stride + head * do_head_stride + "
         "long(query) * do_seq_stride;");
  w.line("float dot = 0.0f;");
  if (runs) {
    w.open("if (((unsigned long)o | (unsigned long)d_o) % 16 == 0) {{ // 16-byte loads");
    w.open("for (int run = lane; valid && run < kRuns; run += kLanes) {{");
    w.line("const fj_bits8 x = fj_global_load8(d_o + run * 8), y = fj_global_load8(o + run * 8);");
    w.line("for (int e = 0; e < 8; ++e)");
    w.line("  dot += fj_to_f32(x[e]) * fj_to_f32(y[e]);");
    w.close();
    w.close("} else {");
    w.indent(1);
  }
  w.open("for (int run = lane; valid && run < kRuns; run += kLanes) {{");
  w.line("for (int d = run * 8; d < run * 8 + 8 && d < kDimV; ++d)");
  w.line("  dot += fj_to_f32(fj_global_load1(d_o + long(d) * do_dim_stride)) *");
  w.line("         fj_to_f32(fj_global_load1(o + long(d) * o_dim_stride));");
  w.close();
  if (runs)
    w.close();
  w.line("for (int mask = kLanes / 2; mask > 0; mask /= 2)");
  w.line("  dot += fj_shfl_xor(dot, tid % {}, mask);", target.wave_size);
  w.line("if (!valid || lane != 0)");
  w.line("  return;");
  w.line("const float lse = fj_global_load_f32(LSE + batch * lse_batch_stride + head * "
         "lse_head_stride + query);");
  w.line("fj_global_store_f32(L + row, lse == -FJ_INF ? FJ_INF : lse * {});",
         emit::float_literal(std::numbers::log2e));
  w.line("fj_global_store_f32(D + row, dot);");
  w.close();
  finish_direct_kernel(out, target, w,
                       "the backward's preprocess (D = rowsum(dO * O), L = LSE * log2 e)",
                       "8 work-items per row");
  out.rules = "backward-preprocess";
  return out;
}

Expected<Lowered> lower_backward_reduce(const AttentionSpec &spec, const Target &target) {
  FJ_RETURN_IF_ERROR(ir::validate_backward(spec));
  const KernelSignature sig = spec.signature();
  Lowered out;
  out.kernel_name = fmt::format(
      "fa_bwd_reduce_{}_d{}_{}{}{}", dtype_name(sig.dtype), sig.head_dim_qk, sig.head_dim_v,
      sig.unit_dim[1] && sig.unit_dim[2] ? "" : "_strided", sig.packed_k ? "_varlenk" : "");
  out.params = {
      {"dK_heads", KernelParam::Kind::tensor, ir::ScalarType::i64, "const float *"},
      {"dV_heads", KernelParam::Kind::tensor, ir::ScalarType::i64, "const float *"},
      {"dK", KernelParam::Kind::tensor, ir::ScalarType::i64, "fj_bits *"},
      {"dV", KernelParam::Kind::tensor, ir::ScalarType::i64, "fj_bits *"},
  };
  if (sig.packed_k)
    out.params.push_back(
        {"cu_seqlens_k", KernelParam::Kind::tensor, ir::ScalarType::i64, "const int *"});
  add_scalars(out, {{"rows_k", ir::ScalarType::i64},
                    {"kv_heads", ir::ScalarType::i32},
                    {"group", ir::ScalarType::i32},
                    {"k_rows", ir::ScalarType::i32},
                    {"batches", ir::ScalarType::i32},
                    {"k_batch_stride", ir::ScalarType::i64},
                    {"k_head_stride", ir::ScalarType::i64},
                    {"k_seq_stride", ir::ScalarType::i32},
                    {"k_dim_stride", ir::ScalarType::i32},
                    {"v_batch_stride", ir::ScalarType::i64},
                    {"v_head_stride", ir::ScalarType::i64},
                    {"v_seq_stride", ir::ScalarType::i32},
                    {"v_dim_stride", ir::ScalarType::i32}});
  out.grid = {ir::GridAxis{-1, ir::Extent::of("rows_k"), kRows}};
  out.block_threads = kThreads;

  HipWriter w;
  element_type(w, sig.dtype);
  w.line("constexpr int kDimQK = {}; // head_dim_qk", sig.head_dim_qk);
  w.line("constexpr int kDimV = {}; // head_dim_v", sig.head_dim_v);
  w.line("constexpr int kColThreads = {}; // work-items per key row", kColThreads);
  w.line("constexpr int kRows = {}; // key rows per workgroup", kRows);
  w.blank();
  w.line("// Key row r = (batch * kv_heads + kv_head) * k_rows + key: dK and dV of that");
  w.line("// row are the sums, over the group's query heads in order, of the f32 rows of");
  w.line("// dK_heads / dV_heads (dense [batch, kv_heads * group, k_rows, dim]; packed rows");
  w.line("// are one batch of total_k rows).");
  open_direct_kernel(w, out);
  w.line("const long row = long(fj_group_id_x()) * kRows + fj_thread_id() / kColThreads;");
  w.line("const int col0 = fj_thread_id() % kColThreads;");
  w.line("if (row >= rows_k)");
  w.line("  return;");
  w.line("const int key = int(row % k_rows);");
  w.line("const int kv_head = int(row / k_rows % kv_heads);");
  w.line("const long batch = row / k_rows / kv_heads;");
  if (sig.packed_k) {
    w.line("// Packed keys: rows past the last sequence's end (cu_seqlens_k[batches], clamped)");
    w.line("// belong to no sequence and the dK/dV kernel wrote nothing there: they get 0.");
    w.line("const int last_end = cu_seqlens_k[batches];");
    w.line("const int used = last_end < 0 ? 0 : last_end > k_rows ? k_rows : last_end;");
    w.line("const bool outside = key >= used;");
  } else {
    w.line("const bool outside = false;");
  }
  w.line("// Row (batch, kv_head * group + g, key) of the per-head results.");
  w.line("const long first = (batch * kv_heads * group + long(kv_head) * group) * k_rows + key;");
  for (const auto &[t, dim, prefix, value, unit] :
       {std::tuple{"K", "kDimQK", "k", sig.head_dim_qk, sig.unit_dim[1]},
        std::tuple{"V", "kDimV", "v", sig.head_dim_v, sig.unit_dim[2]}}) {
    w.line("fj_bits *d{0}_row = d{0} + batch * {1}_batch_stride + kv_head * {1}_head_stride + "
           "long(key) * {1}_seq_stride;",
           t, prefix);
    // Runs of 4 columns (16-byte loads: the workspace's rows are 16-byte aligned
    // at such head dims; 8-byte stores where the row is 8-byte aligned), each
    // column summed over the group in the same order as one at a time.
    const bool runs = unit && value % 4 == 0;
    if (runs) {
      w.open("if ((unsigned long)d{}_row % 8 == 0) {{", t);
      w.open("for (int c = col0 * 4; c < {}; c += kColThreads * 4) {{", dim);
      w.line("float sum[4] = {{0.0f, 0.0f, 0.0f, 0.0f}};");
      w.open("for (int g = 0; g < group && !outside; ++g) {{");
      w.line("const fj_float4 x = fj_global_load_f32x4(d{}_heads + (first + long(g) * k_rows) * "
             "{} + c);",
             t, dim);
      w.line("for (int e = 0; e < 4; ++e)");
      w.line("  sum[e] += x[e];");
      w.close();
      w.line("fj_bits4 out;");
      w.line("for (int e = 0; e < 4; ++e)");
      w.line("  out[e] = fj_from_f32(sum[e]);");
      w.line("fj_global_store4(d{}_row + c, out);", t);
      w.close();
      w.close("} else {");
      w.indent(1);
    }
    w.open("for (int c = col0; c < {}; c += kColThreads) {{", dim);
    w.line("float sum = 0.0f;");
    w.line("for (int g = 0; g < group && !outside; ++g)");
    w.line("  sum += fj_global_load_f32(d{}_heads + (first + long(g) * k_rows) * {} + c);", t, dim);
    w.line("fj_global_store1(d{}_row + long(c) * {}_dim_stride, fj_from_f32(sum));", t, prefix);
    w.close();
    if (runs)
      w.close();
  }
  w.close();
  finish_direct_kernel(out, target, w,
                       "the backward's sum of dK and dV over each group of query heads",
                       "a loop per row");
  out.rules = "backward-reduce";
  return out;
}

Expected<Lowered> lower_backward_sinks(const AttentionSpec &spec, const Target &target) {
  FJ_RETURN_IF_ERROR(ir::validate_backward(spec));
  if (!spec.sinks)
    return Status::error("the sinks' gradient kernel is for a spec with attention sinks");
  const KernelSignature sig = spec.signature();
  constexpr int kSinkThreads = 256;
  Lowered out;
  out.kernel_name = fmt::format("fa_bwd_sinks{}", sig.packed_q ? "_varlenq" : "");
  out.params = {
      {"L", KernelParam::Kind::tensor, ir::ScalarType::i64, "const float *"},
      {"D", KernelParam::Kind::tensor, ir::ScalarType::i64, "const float *"},
      {"sinks", KernelParam::Kind::tensor, ir::ScalarType::i64, "const float *"},
      {"dsinks", KernelParam::Kind::tensor, ir::ScalarType::i64, "float *"},
  };
  if (sig.packed_q)
    out.params.push_back(
        {"cu_seqlens_q", KernelParam::Kind::tensor, ir::ScalarType::i64, "const int *"});
  add_scalars(out, {{"heads", ir::ScalarType::i32},
                    {"q_rows", ir::ScalarType::i32},
                    {"q_batches", ir::ScalarType::i32},
                    {"batches", ir::ScalarType::i32}});
  out.grid = {ir::GridAxis{-1, ir::Extent::of("heads"), 1}};
  out.block_threads = kSinkThreads;

  HipWriter w;
  w.line("constexpr int kThreads = {};", kSinkThreads);
  w.blank();
  w.line("// One workgroup per head: dsinks[head] = -sum over the head's rows r =");
  w.line("// (batch * heads + head) * q_rows + query of 2^(sink log2(e) - L[r]) * D[r]");
  w.line("// (L = +inf: a row that saw nothing, 0), each work-item over every kThreads-th");
  w.line("// row, then a tree: a fixed order.");
  open_direct_kernel(w, out);
  w.line("FJ_LDS_ARRAY(float, lds_tree, kThreads);");
  w.line("const int head = fj_group_id_x();");
  w.line("const int tid = fj_thread_id();");
  if (sig.packed_q) {
    w.line("// Packed queries: the rows up to the last sequence's end (cu_seqlens_q[batches],");
    w.line("// clamped); those past it belong to no sequence.");
    w.line("const int last_end = cu_seqlens_q[batches];");
    w.line("const int used = last_end < 0 ? 0 : last_end > q_rows ? q_rows : last_end;");
  } else {
    w.line("const int used = q_rows;");
  }
  w.line("const float sink = fj_global_load_f32(sinks + head) * {};",
         emit::float_literal(std::numbers::log2e));
  w.line("float sum = 0.0f;");
  w.open("for (long n = tid; n < long(q_batches) * used; n += kThreads) {{");
  w.line("const long row = (n / used * heads + head) * long(q_rows) + n % used;");
  w.line("const float l = fj_global_load_f32(L + row);");
  w.line("if (l != FJ_INF)");
  w.line("  sum += fj_exp2(sink - l) * fj_global_load_f32(D + row);");
  w.close();
  tree_reduce(w, "lds_tree", "sum", false, "sum");
  w.line("if (tid == 0)");
  w.line("  fj_global_store_f32(dsinks + head, -sum);");
  w.close();
  finish_direct_kernel(out, target, w, "the backward's gradient of the attention sinks",
                       "a loop per row");
  out.lds_bytes = kSinkThreads * 4;
  out.rules = "backward-sinks";
  return out;
}

} // namespace flashjit::lowering
