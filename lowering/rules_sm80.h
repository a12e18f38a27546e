// NVIDIA sm_80+ rules: warp-wide mma.sync.m16n8k16 (bf16/f16 in, f32 out),
// products computed as written: S = Q K^T and O = P V (the FlashAttention-2
// register recipe). With g = lane / 4 and t = lane % 4:
//
//   * a lane holds two query rows of every 16-row fragment, g and g + 8 (two row
//     slots), and the column pair 2t, 2t + 1 of every 8-column fragment;
//   * a row reduction is in-lane over those pairs plus two exchanges among the
//     four lanes of the group (lane ^ 1, lane ^ 2);
//   * the S accumulator of key tiles 2k and 2k + 1, converted to bf16/f16, is the
//     A fragment of key tile k of P V without any data movement between lanes
//     (convert_layout #mma_acc -> #mma_a is a register re-pack);
//   * K (B of Q K^T) and V (B of P V) fragments come from row-major shared-memory
//     tiles with ldmatrix (V with .trans); the tiles arrive by cp.async, issued one
//     tile ahead of the math.
//
//   S fragment (16 queries x 8 keys), lane L = 4g + t, element e:
//                keys 2t, 2t+1
//     query g      e = 0, 1
//     query g+8    e = 2, 3
#pragma once

#include "lowering/rules.h"

#include "templates/templates.h"

#include <algorithm>

namespace flashjit::lowering {

class Sm80Rules : public Rules {
public:
  std::string_view name() const override { return "sm80"; }

  Status check(const MatrixInstr &mi, const Target &t) const override {
    const LaneLayout &l = *mi.layout;
    if (l.m != 16 || l.n != 8 || l.k != 16 || l.wave_size != t.wave_size)
      return Status::error("{}: the sm80 rules need an m16n8k16 warp instruction", mi.mnemonic);
    // The maps these rules emit code for (see the header comment).
    for (int lane = 0; lane < t.wave_size; ++lane) {
      const int g = lane / 4, tt = lane % 4;
      for (int e = 0; e < l.cd_elems; ++e)
        if (l.d(lane, e) != MatrixCoord{g + 8 * (e / 2), 2 * tt + e % 2})
          return Status::error("{}: accumulator lane {} element {} is not where the sm80 rules "
                               "expect it",
                               mi.mnemonic, lane, e);
      for (int e = 0; e < l.a_elems; ++e)
        if (l.a(lane, e) != MatrixCoord{g + 8 * ((e / 2) % 2), 2 * tt + e % 2 + 8 * (e / 4)})
          return Status::error("{}: A lane {} element {} is not where the sm80 rules expect it",
                               mi.mnemonic, lane, e);
      for (int e = 0; e < l.b_elems; ++e)
        if (l.b(lane, e) != MatrixCoord{2 * tt + e % 2 + 8 * (e / 2), g})
          return Status::error("{}: B lane {} element {} is not where the sm80 rules expect it",
                               mi.mnemonic, lane, e);
    }
    return Status::ok();
  }

  int n_tile() const override { return 8; }
  int acc_elems() const override { return 4; }
  int row_slots() const override { return 2; }
  std::string_view acc_type() const override { return "fj_float4"; }
  std::string_view acc16_type() const override { return "fj_bits4"; }
  std::string_view operand_type() const override { return "fj_bits8"; }
  void emit_lane_vars(HipWriter &w) const override {
    w.line("const int g = lane / 4; // this lane's query rows: g and g + 8 of every 16-row tile");
    w.line("const int t = lane % 4; // this lane's column pair: 2t, 2t + 1 of every 8-column tile");
  }
  std::string acc_row(std::string_view e) const override {
    return fmt::format("g + 8 * ({} / 2)", e);
  }
  std::string acc_slot(std::string_view e) const override { return fmt::format("{} / 2", e); }
  std::string acc_col(std::string_view e) const override {
    return fmt::format("2 * t + {} % 2", e);
  }
  MatrixCoord acc_coord(int lane, int e) const override {
    return {lane / 4 + 8 * (e / 2), 2 * (lane % 4) + e % 2};
  }
  std::string slot_row(std::string_view s) const override { return fmt::format("g + 8 * {}", s); }
  std::vector<int> row_share_masks() const override { return {1, 2}; }
  std::string row_writer() const override { return "t == 0"; }
  int acc_run_len() const override { return 2; }
  std::vector<FragmentRun> acc_runs() const override {
    return {{"g", "2 * t"}, {"g + 8", "2 * t"}};
  }
  int operand_run_len() const override { return 2; }
  std::vector<FragmentRun> operand_runs() const override {
    return {{"g", "2 * t"}, {"g + 8", "2 * t"}, {"g", "2 * t + 8"}, {"g + 8", "2 * t + 8"}};
  }

  // S = Q K^T: K^T is operand B (k = head dim, n = key). One ldmatrix.x2 reads it
  // from the row-major K tile: lanes 0-7 address keys c*8.. at head dims k*16..,
  // lanes 8-15 the same keys at k*16 + 8; lane (g, t) receives key g, dims 2t, 2t+1.
  void emit_k_fragment(HipWriter &w, std::string_view buf, std::string_view stride) const override {
    w.line(
        "const fj_bits4 kf = fj_ldmatrix_x2(&{}[(c * 8 + (lane & 7)) * {} + k * 16 + (lane & 8)]);",
        buf, stride);
  }
  // O = P V: V is operand B (k = key, n = head dim), read from the row-major V tile
  // with ldmatrix.x2.trans: lanes 0-15 address keys k*16 + lane at head dims c*8..;
  // lane (g, t) receives keys 2t, 2t+1 (and +8) of head dim g.
  void emit_v_fragment(HipWriter &w, std::string_view buf, std::string_view stride) const override {
    w.line("const fj_bits4 vf = fj_ldmatrix_x2_trans(&{}[(k * 16 + (lane & 15)) * {} + c * 8]);",
           buf, stride);
  }
  // Q from LDS: one ldmatrix.x4 gives the whole A fragment (lanes 0-15 address rows
  // 0-15 at head dims k*16, lanes 16-31 the same rows at k*16 + 8).
  bool reads_q_from_lds() const override { return true; }
  void emit_q_fragment(HipWriter &w, std::string_view buf, std::string_view stride) const override {
    w.line(
        "const fj_bits8 qf = fj_ldmatrix_x4(&{}[((wave * kQTiles + qt) * 16 + (lane & 15)) * {} + "
        "k * 16 + (lane >> 4) * 8]);",
        buf, stride);
  }
  std::string mma_s(std::string_view q) const override {
    return fmt::format("acc = fj_mma({}, kf, acc);", q);
  }
  std::string mma_o(std::string_view p) const override {
    return fmt::format("acc = fj_mma({}, vf, acc);", p);
  }
  void emit_p_operand(HipWriter &w, std::string_view dst, std::string_view src,
                      int key_tiles) const override {
    w.line("// The S fragments of key tiles 2k and 2k + 1 are the A fragment of key tile k.");
    w.line("fj_bits8 {}[kQTiles][{}];", dst, key_tiles);
    w.line("#pragma unroll");
    w.open("for (int qt = 0; qt < kQTiles; ++qt) {{");
    emit_p_operand_tile(w, dst, src, key_tiles);
    w.close();
  }
  void emit_p_operand_tile(HipWriter &w, std::string_view dst, std::string_view src,
                           int key_tiles) const override {
    w.line("#pragma unroll");
    w.line("for (int k = 0; k < {}; ++k) {}[qt][k] = fj_cat({}[qt][2 * k], {}[qt][2 * k + 1]);",
           key_tiles, dst, src, src);
  }

  // O through 16 LDS rows per warp and 16-byte stores of whole rows, as the sm90
  // rules (KernelEmitter::emit_staged_store), where the rows fit. H200, a
  // FLASHJIT_SM80_RULES_ON_SM90 build (bench/results/README.md, session 36):
  // 1-16% faster at head dims 64-192, 16-22% slower at 256 (its one tile per
  // warp already at 254 registers).
  bool stages_output(int64_t dim_v) const override { return dim_v <= 192; }
  // 128 threads at 239-255 registers per thread (ptxas 13.0, sm_80, the default
  // configs at head dims 64-128 and 160-256): two workgroups per SM. At 136-152
  // (168-183 registers) three fit the registers and this bound is low: an A100's
  // LDS holds those to two anyway, a 228 KiB SM (the measurement build) not.
  // The resource model's register count (nvidia_min_blocks) would be the exact
  // bound; unmeasured here.
  int64_t resident_workgroups() const override { return 2; }

  bool v_transposed() const override { return false; }
  bool early_mask_loads() const override { return true; }
  bool mask_by_row_bounds() const override { return true; }
  ir::Config default_config(const AttentionSpec &spec) const override {
    return config(spec, /*one_tile=*/false);
  }
  // Decode kernels take one query tile per wave, whose Q fits the registers up
  // to head dim 128 (the block prefetch's second K/V copies fit beside it).
  ir::Config decode_config(const AttentionSpec &spec) const override {
    return config(spec, /*one_tile=*/true);
  }
  void emit_staging_helpers(HipWriter &) const override {} // cp.async in the prelude

  std::string_view prelude() const override { return templates::cuda_prelude; }
  /// Static shared memory stops at 48 KiB; dynamic goes to the SM's opt-in limit.
  bool dynamic_lds() const override { return true; }

  void emit_mma_wrapper(HipWriter &w, const MatrixInstr &mi, DType) const override {
    w.line("// {}: D = A * B + C, {}x{}x{}; A {} x {}, B {} x {}, C/D {} x f32 per lane.",
           mi.mnemonic, mi.m(), mi.n(), mi.k(), mi.layout->a_elems, mi.ab_elem_type,
           mi.layout->b_elems, mi.ab_elem_type, mi.layout->cd_elems);
    w.open("FJ_DEVICE fj_float4 fj_mma(fj_bits8 a, fj_bits4 b, fj_float4 c) {{");
    w.line("const unsigned *A = reinterpret_cast<const unsigned *>(&a);");
    w.line("const unsigned *B = reinterpret_cast<const unsigned *>(&b);");
    w.line("fj_float4 d;");
    w.line("asm(\"{} {{%0, %1, %2, %3}}, {{%4, %5, %6, %7}}, {{%8, %9}}, {{%10, %11, %12, %13}};\"",
           mi.mnemonic);
    w.line("    : \"=f\"(d[0]), \"=f\"(d[1]), \"=f\"(d[2]), \"=f\"(d[3])");
    w.line("    : \"r\"(A[0]), \"r\"(A[1]), \"r\"(A[2]), \"r\"(A[3]), \"r\"(B[0]), \"r\"(B[1]),");
    w.line("      \"f\"(c[0]), \"f\"(c[1]), \"f\"(c[2]), \"f\"(c[3]));");
    w.line("return d;");
    w.close();
  }

private:
  /// `one_tile`: one query tile per wave whatever the head dim.
  static ir::Config config(const AttentionSpec &spec, bool one_tile) {
    // From a sweep on an H100 (bench/sweep_configs.py; bench/results/sweep_*.csv,
    // S = 4096, causal and not), 4 warps and cp.async one tile ahead (stages 2):
    //   head dim <= 80:  2 16-query tiles per warp, Q in registers, 64-key blocks;
    //   <= 128:          2 tiles per warp, Q in shared memory, 64-key blocks
    //                    (FlashAttention-2's tile; Q's registers would spill);
    //                    above 96 with per-score extras (dropout, a mask tensor
    //                    or mask_mod, ALiBi, a score_mod) 1 tile per warp, Q in
    //                    registers: 2 tiles spilled 8-108 bytes (ptxas 13.0, sm_80);
    //   <= 256:          1 tile per warp, Q in shared memory, 64-key blocks
    //                    (at most 99 KiB: every sm_8x/sm_90 block can opt into it);
    //   above (unmeasured): the same with 16-key blocks, for the registers.
    // H200, a FLASHJIT_SM80_RULES_ON_SM90 build (bench/results/README.md, session
    // 36): with Q in shared memory head dim 96 5-14% and 128 12-18% faster than
    // the registers' 2 tiles per warp (96, which spilled 88 bytes) and 1 (128).
    ir::Config c;
    const int64_t d = padded_head_dim(spec);
    c.waves = 4;
    c.stages = 2;
    c.pad_k = 16;
    const bool extras = spec.dropout_p > 0 || spec.mask != MaskType::none ||
                        !spec.mask_mod.empty() || spec.alibi != Alibi::none ||
                        !spec.score_mod.empty();
    one_tile = one_tile || d > 128 || (extras && d > 96);
    c.q_in_lds = d > 128 || (d > 80 && !one_tile);
    c.block_m = (one_tile ? 16 : 32) * c.waves;
    c.block_n = d <= 256 ? 64 : 16;
    return c;
  }
};

} // namespace flashjit::lowering
