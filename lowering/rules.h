// The part of lowering that differs between matrix-instruction families.
//
// Shared by every family (lowering/lower.cpp): the op walk, value storage,
// LDS staging of K and V with 128-bit loads, barriers, masks, elementwise math,
// row reductions, loops and the launch geometry. A family's Rules say only how
// an accumulator fragment (16 or 32 query rows) is spread over the lanes, how the
// operand fragments are read (from registers, global memory and LDS), in which
// order the operands enter the matrix instruction, and which prelude and
// matrix-instruction wrapper the kernel is compiled with.
#pragma once

#include "ir/build.h"
#include "lowering/hip_writer.h"
#include "lowering/matrix_table.h"
#include "lowering/target.h"

#include <algorithm>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace flashjit::lowering {

/// A contiguous run of fragment elements: `len` elements of one row starting at
/// column `col`; expressions in the lane variables of Rules::emit_lane_vars.
struct FragmentRun {
  std::string row; // row within the m_tile()-row fragment
  std::string col; // first column within the tile
};

/// How a row-major staged tile ([row][column], 16-bit elements) lies in LDS.
enum class LdsLayout {
  /// Rows padded by kLdsPad elements against bank conflicts (ldmatrix, LDS reads).
  padded_rows,
  /// 64-column panels of 128-byte rows, 16-byte chunks permuted by row % 8, each
  /// tile 1024-byte aligned: what a wgmma shared-memory descriptor reads
  /// (fj_swizzle128 in templates/sm90_wgmma.hip).
  swizzled_128b,
};

/// One product of a warpgroup of 4 waves (Rules::warpgroup_products): for every
/// query tile qt (0..kQTiles-1), `acc[qt]` (+)= A x B over all `cols` columns at
/// once. A is in registers (`a[qt][k]`: the operand fragment of 16-wide k tile
/// k) or, where `a_tile` names one, the warpgroup's 64 rows of a staged LDS tile
/// (row-major, [row][k]); B is a staged LDS tile: B^T stored [col][k] (S = Q K^T)
/// or, `b_transposed`, B stored [k][col] (O = P V).
struct WarpgroupProduct {
  std::string acc;     // the accumulator array, [kQTiles][cols / n_tile] fragments
  std::string a;       // the A fragment array, [kQTiles][k_tiles]
  std::string a_tile;  // or: the LDS buffer holding A
  int64_t a_rows = 0;  // rows of that staged tile
  std::string a_row0;  // C expression (of qt) of the warpgroup's first row in it
  std::string b_tile;  // the LDS buffer
  int64_t b_rows = 0;  // rows of the staged tile
  int64_t cols = 0;    // columns of the product (a multiple of n_tile())
  int64_t k_tiles = 0; // 16-wide k tiles
  bool b_transposed = false;
  DType dtype = DType::bf16; // of A and B
  /// The query tiles, as a C for-header ("int qt = 0; qt < kQTiles; ++qt").
  std::string tiles = "int qt = 0; qt < kQTiles; ++qt";
  /// Wait for the product; false: commit it as a group and leave it in flight
  /// (emit_warpgroup_wait finishes it).
  bool wait = true;
  /// Commit each query tile's instructions as a group of its own (in tile
  /// order), so that a wait can take the first tile's product alone.
  bool group_per_tile = false;
  /// Pin the accumulator before the fence (its registers hold C there). False
  /// where the product accumulates in place onto registers no instruction writes
  /// after an earlier product has started: ptxas serializes the products when
  /// one defines a later one's accumulator inside the earlier one's stage.
  bool pin_before = true;
};

/// What rule choice knows of a program beside its tiles (Rules::lowers).
struct ProgramShape {
  int64_t waves = 1;     // the query rows are split across them
  bool q_in_lds = false; // config q_in_lds: the register operand staged in LDS
  bool backward = false; // a backward program (dQ or dK/dV)
};

class Rules {
public:
  virtual ~Rules() = default;
  virtual std::string_view name() const = 0;
  /// False for rules that emit no matrix instruction (simt): lowering then picks no
  /// table row and check() gets none.
  virtual bool uses_matrix_instr() const { return true; }
  /// Checks the instruction's lane maps against what these rules assume.
  virtual Status check(const MatrixInstr &mi, const Target &t) const = 0;

  // ---- accumulators: fragments of m_tile() query rows x n_tile() columns ----
  /// Query rows of an accumulator fragment (a wave's query tile): 16, or 32 for
  /// the CDNA 32x32 MFMAs.
  virtual int m_tile() const { return 16; }
  virtual int n_tile() const = 0;
  virtual int acc_elems() const = 0;
  /// Query rows one lane holds in a fragment (each a "row slot").
  virtual int row_slots() const = 0;
  virtual std::string_view acc_type() const = 0;     // the f32 fragment
  virtual std::string_view acc16_type() const = 0;   // the same fragment in 16-bit elements
  virtual std::string_view operand_type() const = 0; // an m_tile x 16 operand fragment (Q or P)
  virtual void emit_lane_vars(HipWriter &w) const = 0;
  /// Row (0..m_tile-1), row slot and column (0..n_tile-1) of accumulator element `e`.
  virtual std::string acc_row(std::string_view e) const = 0;
  virtual std::string acc_slot(std::string_view e) const = 0;
  virtual std::string acc_col(std::string_view e) const = 0;
  /// acc_row and acc_col as numbers: where element `e` of lane `lane` lies in
  /// its fragment. Lowering groups a lane's elements by it (a ScoreMod's draws).
  virtual MatrixCoord acc_coord(int lane, int e) const = 0;
  /// The row of row slot `s`.
  virtual std::string slot_row(std::string_view s) const = 0;
  /// xor masks reaching the lanes that hold the other columns of the same rows.
  virtual std::vector<int> row_share_masks() const = 0;
  /// True in exactly one lane per row: the lane that stores a per-row value.
  virtual std::string row_writer() const = 0;
  /// The accumulator fragment as runs of acc_run_len() elements along a row.
  virtual int acc_run_len() const = 0;
  virtual std::vector<FragmentRun> acc_runs() const = 0;

  // ---- operands ----
  /// The Q operand fragment of a query tile and a 16-wide k tile, as runs along k.
  virtual int operand_run_len() const = 0;
  virtual std::vector<FragmentRun> operand_runs() const = 0;
  /// Declares `kf`: the K fragment of key tile `c` (n_tile keys) and head-dim tile `k`,
  /// from the row-major [key][dim] LDS buffer.
  virtual void emit_k_fragment(HipWriter &w, std::string_view buf,
                               std::string_view stride) const = 0;
  /// Declares `vf`: the V fragment of head-dim tile `c` (n_tile entries) and key tile
  /// `k`, from the transposed [dim][key] LDS buffer.
  virtual void emit_v_fragment(HipWriter &w, std::string_view buf,
                               std::string_view stride) const = 0;
  /// Declares `qf`: the Q operand fragment of query tile `qt` (of this wave) and
  /// head-dim tile `k`, from the row-major LDS copy of the workgroup's Q block
  /// (config q_in_lds). Only where reads_q_from_lds().
  virtual bool reads_q_from_lds() const { return false; }
  virtual void emit_q_fragment(HipWriter &w, std::string_view buf, std::string_view stride) const {}
  /// 16-wide k tiles per matrix instruction (1 for 16x16x16). Above 1 the product
  /// loop reads the fragments of k_step consecutive k tiles (zeros past the last)
  /// into arrays: `kf` / `vf` for the LDS operand and, passed to mma_s / mma_o,
  /// the register operand's.
  virtual int k_step() const { return 1; }
  /// The table row's k: 16 * k_step(), or less where several instructions
  /// share one 16-wide k tile (CDNA 32x32x8: two of k 8).
  virtual int mma_k() const { return 16 * k_step(); }
  /// The matrix instructions accumulating Q K^T (resp. P V) into `acc`: one
  /// statement per line.
  virtual std::string mma_s(std::string_view q) const = 0;
  virtual std::string mma_o(std::string_view p) const = 0;
  /// convert_layout: the P operand fragments `dst` from the converted accumulator `src`.
  virtual void emit_p_operand(HipWriter &w, std::string_view dst, std::string_view src,
                              int key_tiles) const = 0;
  /// The same for query tile `qt` only (in scope), into the declared `dst`: the
  /// interleaved loop's passes (rules with warpgroup products).
  virtual void emit_p_operand_tile(HipWriter &w, std::string_view dst, std::string_view src,
                                   int key_tiles) const {}

  /// Warpgroup products (sm90 wgmma): one instruction per 16-wide k tile covers
  /// the query tiles of 4 waves by every column of the product, B read straight
  /// from LDS; emit_warpgroup_product writes a whole product, and the staged
  /// tiles lie as lds_layout() says. False: per-fragment instructions (mma_s/mma_o).
  virtual bool warpgroup_products() const { return false; }
  /// Writes one product over every query tile; adds the helper functions it
  /// calls to `helpers` (name -> text, emitted once before the kernel).
  virtual void emit_warpgroup_product(HipWriter &w, const WarpgroupProduct &p,
                                      std::map<std::string, std::string> &helpers) const {}
  /// Waits until at most `pending` committed products are in flight, then pins
  /// the accumulators `acc` (C expressions of [cols / n_tile] fragment arrays,
  /// `cols` columns each) and keeps the register operands `a` (C expressions of
  /// [k_tiles] operand arrays) alive to that point.
  virtual void emit_warpgroup_wait(HipWriter &w, int pending,
                                   const std::vector<std::pair<std::string, int64_t>> &acc,
                                   const std::vector<std::pair<std::string, int64_t>> &a) const {}
  virtual LdsLayout lds_layout() const { return LdsLayout::padded_rows; }
  /// Whether these rules can lower a program of this shape. A family's first
  /// rules that can and whose tiles divide the config lower it
  /// (lowering/rule_choice.cpp).
  virtual bool lowers(const ProgramShape &) const { return true; }
  /// The matrix instruction as the kernel header and explain() name it: the
  /// table row's mnemonic, or what the rules emit in its place.
  virtual std::string instruction_name(const MatrixInstr &mi) const {
    return std::string(mi.mnemonic);
  }
  /// The processor the kernel is compiled for: the target's, or a variant with
  /// the instructions the rules emit (sm_90a for wgmma).
  virtual std::string compile_arch(const Target &t) const { return t.arch; }

  /// Whether V is staged transposed ([dim][key]) in LDS rather than row-major.
  virtual bool v_transposed() const { return true; }
  /// Whether the KV loop issues a mask tensor's loads of a block before its S
  /// product where their bits fit (KernelEmitter::emit_early_masks); measured
  /// on NVIDIA only.
  virtual bool early_mask_loads() const { return false; }
  /// Whether a partly visible block compares each score's key with its row's
  /// bounds (fj_visible_keys, once per row slot) rather than testing fj_visible
  /// per score. On NVIDIA (sm90, window 128, head dim 64) the per-score tests
  /// of the run-time window sizes spilled; on the AMD families, whose lanes
  /// hold one row and keep those sizes in scalar registers, the bounds cost
  /// vector registers (gfx1201 head dim 128: 248 -> 256 and 2 spilled).
  virtual bool mask_by_row_bounds() const { return false; }
  /// Whether the forward's `store` of O (`dim_v` columns) writes its tile
  /// through LDS rows as whole 16-byte runs of each row
  /// (KernelEmitter::emit_staged_store) where they fit
  /// (emit::output_stage_bytes); else the fragments go out directly.
  virtual bool stages_output(int64_t dim_v) const { return false; }
  /// The workgroups per compute unit the registers of these rules' kernels
  /// allow at most, which LDS added below that bound costs none of; 0: none
  /// known (the LDS alone counts).
  virtual int64_t resident_workgroups() const { return 0; }
  /// The default tuning config for a spec (block sizes, waves, pipeline stages):
  /// 4 waves of 16 queries; block_n shrinks as the head dims grow.
  virtual ir::Config default_config(const AttentionSpec &spec) const;
  /// The forward's default config where a producer warpgroup fills its tiles
  /// (config stages 3) and that is faster than default_config's; none where the
  /// rules have no producer or the spec does not fit one.
  virtual std::optional<ir::Config> producer_config(const AttentionSpec &) const {
    return std::nullopt;
  }
  /// The base config of the decode kernels (split-KV's partial kernel and
  /// decode, whose rows the pipeline sets: one query tile per wave).
  virtual ir::Config decode_config(const AttentionSpec &spec) const { return default_config(spec); }
  /// Whether these rules suit the spec when the family has several (its
  /// default config comes from the first that does, else from the last).
  virtual bool prefers(const AttentionSpec &) const { return true; }
  /// The block of the backward's dQ program (`dkdv` false) or dK/dV program
  /// where these rules lower the backward with a block of their own (its
  /// block_m, block_n, waves and q_in_lds); none where they leave the block to
  /// backward_config (lower.h).
  virtual std::optional<ir::Config> backward_block(const AttentionSpec &, bool /*dkdv*/) const {
    return std::nullopt;
  }

  // ---- the text around the kernel ----
  /// fj_stage8 / fj_stage_commit / fj_stage_wait where the prelude has none:
  /// global -> LDS copies of 8 elements (zeros when the row is past the end).
  virtual void emit_staging_helpers(HipWriter &w) const;
  /// Device helpers of the rules' own (e.g. simt's software matrix product), emitted
  /// into the kernel text; empty for most rules.
  virtual std::string_view kernel_helpers() const { return {}; }
  virtual std::string_view prelude() const = 0;
  /// Whether the kernel's LDS arrays are slices of the launch's dynamic LDS
  /// (FJ_DYNAMIC_LDS_ARRAY) rather than static arrays (FJ_LDS_ARRAY).
  virtual bool dynamic_lds() const { return false; }
  virtual void emit_mma_wrapper(HipWriter &w, const MatrixInstr &mi, DType dtype) const = 0;
};

/// The wider of the two head dims padded to 16 columns: what the default
/// configs size their blocks by.
inline int64_t padded_head_dim(const AttentionSpec &spec) {
  return std::max(ir::padded(spec.head_dim_qk, 16), ir::padded(spec.head_dim_v, 16));
}

/// The preferred rules for a target's family, or nullptr.
const Rules *rules_for(const Target &t);
/// Every matrix rule set of a target's family, preferred first (gfx90a, gfx942:
/// 32x32x8 then 16x16x16; gfx950: 32x32x16, 16x16x32, then 16x16x16).
std::vector<const Rules *> matrix_rules_for(const Target &t);
/// The portable simt rules for a target (no matrix instructions), or nullptr.
const Rules *simt_rules_for(const Target &t);
/// Families that have rules, for error messages.
std::string families_with_rules();

} // namespace flashjit::lowering
