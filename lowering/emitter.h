// The kernel emitter, internal to lowering/: one KernelEmitter walks a verified
// program once and writes the HIP, split by concept across
//   lower.cpp         the op walk: values, elementwise ops, products, masks,
//                     reductions, the kernel's text around the body
//   lower_memory.cpp  global memory and LDS: loads, stores, staging, addressing
//   lower_loops.cpp   the KV loop: loop-carried values, barriers across the back
//                     edge, software pipelining
//   rule_choice.cpp   which rules lower a program, default configs, check_fits
// What differs between families comes from lowering/rules.h.
#pragma once

#include "ir/expr.h"
#include "ir/ir.h"
#include "lowering/hip_writer.h"
#include "lowering/lower.h"
#include "lowering/rules.h"

#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <cctype>
#include <cmath>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

namespace flashjit::lowering::emit {

using ir::Op;
using ir::OpKind;
using ir::TileLayout;
using ir::Type;
using ir::ValueId;

constexpr int kKTile = 16; // k of an operand fragment (head-dim entries or keys)

// LDS row padding (elements) so consecutive rows start in different banks.
constexpr int kLdsPad = 8;

inline std::string c_scalar_type(ir::ScalarType t) {
  switch (t) {
  case ir::ScalarType::i32:
    return "int";
  case ir::ScalarType::i64:
    return "long";
  case ir::ScalarType::f32:
    return "float";
  }
  return "?";
}

/// An array parameter's element in C and its bytes; each reads as a float
/// (templates/attention_common.hip).
struct ArrayElementC {
  const char *type;
  int bytes;
};
inline ArrayElementC array_element_c(ir::ArrayElement e) {
  switch (e) {
  case ir::ArrayElement::u8:
    return {"unsigned char", 1};
  case ir::ArrayElement::f16:
    return {"fj_f16_elem", 2};
  case ir::ArrayElement::bf16:
    return {"fj_bf16_elem", 2};
  case ir::ArrayElement::f32:
    return {"float", 4};
  }
  return {"float", 4};
}

inline std::string float_literal(double x) {
  if (std::isinf(x))
    return x < 0 ? "-FJ_INF" : "FJ_INF";
  std::string s = fmt::format("{:.9g}", x);
  if (s.find_first_of(".e") == std::string::npos)
    s += ".0";
  return s + "f";
}

/// LDS bytes of a staged tile of rows x cols 16-bit elements as the emitter
/// lays it out (KernelEmitter::register_lds): rows padded by kLdsPad elements,
/// or stored transposed with the columns padded; 16-byte aligned. Under
/// LdsLayout::swizzled_128b a row-major tile is whole 64-column panels (1024-byte
/// multiples for rows in multiples of 8). check_fits sizes a config with the
/// same function.
inline int64_t staged_tile_bytes(int64_t rows, int64_t cols, bool transposed,
                                 LdsLayout layout = LdsLayout::padded_rows) {
  if (!transposed && layout == LdsLayout::swizzled_128b)
    return rows * ((cols + 63) / 64) * 128;
  const int64_t stride = (transposed ? rows : cols) + kLdsPad;
  const int64_t elems = (transposed ? cols : rows) * stride;
  return (elems * 2 + 15) / 16 * 16;
}

/// The rows through which `store` writes a 16-bit output tile where the rules
/// stage it (Rules::stages_output): 16 rows per wave, each `dim_v` elements
/// padded to whole 16-byte runs plus 16 bytes where that makes a multiple of 32
/// bytes, so that the 8 rows a wave's lanes write at once (rows g, columns 2t of
/// the accumulator fragment) start 4 banks apart and the 32-bit writes of a wave
/// meet 32 banks.
inline int64_t output_stage_pitch(int64_t dim_v) {
  int64_t words = (dim_v / 2 + 3) / 4 * 4;
  if (words % 8 == 0)
    words += 4;
  return 2 * words;
}
inline int64_t output_stage_size(int64_t waves, int64_t dim_v) {
  return waves * 16 * output_stage_pitch(dim_v) * 2;
}
/// Whether an output of these properties can be written as whole 16-byte runs
/// of its rows: 16-bit elements, the head dim contiguous, rows 16-byte aligned,
/// a head dim of whole runs.
inline bool output_stage_applies(bool f32, bool unit_dim, int64_t row_align, int64_t dim_v) {
  return !f32 && unit_dim && row_align >= 16 && dim_v % 8 == 0;
}
/// LDS the NVIDIA driver reserves per resident workgroup (occupancy counts).
inline constexpr int64_t kReservedLdsPerBlock = 1024;
/// LDS bytes of the staging rows of their own beside `other_lds` bytes on `t`:
/// output_stage_size, or 0 where they would not fit in a workgroup's LDS or
/// would take a workgroup per compute unit away (kReservedLdsPerBlock counted,
/// as on NVIDIA, whose rules alone stage), of at most `bound` resident where
/// the registers allow no more (Rules::resident_workgroups; 0: no bound).
inline int64_t output_stage_bytes(int64_t waves, int64_t dim_v, int64_t other_lds, const Target &t,
                                  int64_t bound) {
  auto resident = [&](int64_t lds) {
    const int64_t n = t.lds_bytes_per_cu / (lds + kReservedLdsPerBlock);
    return bound > 0 ? std::min(n, bound) : n;
  };
  const int64_t bytes = output_stage_size(waves, dim_v);
  const int64_t with = ir::padded(other_lds, 16) + bytes;
  if (with > t.lds_bytes || resident(with) < resident(other_lds))
    return 0;
  return bytes;
}

/// Where TMA copies a staged tile (KernelEmitter::tma_tile): the forward with
/// a producer warpgroup (config stages 3), the backward, or the forward without one.
enum class TmaUse { producer, backward, forward };

/// Whether a staged tile of `rows` x `cols` is of a shape TMA copies for `use`
/// (the sm90 rules; KernelEmitter::tma_tile adds what its tensor must be): at
/// most 256 rows, in boxes of 64 columns. A producer warpgroup copies every tile,
/// a partial last panel too (its columns past the head dim arrive as zeros);
/// elsewhere only whole panels, in the forward from three up (head dims 192, 256).
constexpr bool tma_tile_shape(int64_t rows, int64_t cols, TmaUse use) {
  if (rows > 256)
    return false;
  if (use == TmaUse::producer)
    return true;
  return cols % 64 == 0 && (use == TmaUse::backward || cols >= 192);
}

class KernelEmitter {
public:
  /// `mi` is null for rules without a matrix instruction (simt); `note` says
  /// why these rules were chosen where that is not the family's default.
  KernelEmitter(const ir::Program &p, const Target &t, const Rules &r, const MatrixInstr *mi,
                std::string note)
      : p_(p), target_(t), rules_(r), mi_(mi), note_(std::move(note)),
        printed_(ir::value_names(p)) {}

  Expected<Lowered> run();

private:
  // ---- value naming and shapes ----
  // The C identifier of a value: its printed IR name (`%6` -> t6, `%m` -> m), so
  // the comments in the HIP match `flashjit emit --print-ir`.
  std::string name(ValueId v) const {
    const std::string &n = printed_[v];
    return std::isdigit(static_cast<unsigned char>(n[0])) ? "t" + n : n;
  }
  const Type &type(ValueId v) const { return p_.type_of(v); }
  int tiles(int64_t extent) const { return int(extent / kKTile); }
  // Accumulator fragments along a tile's columns.
  int col_tiles(int64_t cols) const { return int(cols / rules_.n_tile()); }
  // A run-time extent or stride in C: its parameter's name or the constant.
  static std::string c_expr(const ir::Extent &e) {
    return e.is_param() ? e.param : std::to_string(e.value);
  }
  // The rows of a tensor (seqlen_q or seqlen_k).
  static std::string seq_const(const ir::TensorParam &t) { return c_expr(t.seq); }
  // " * q_dim_stride" for a tensor whose head dim is not contiguous, else "".
  static std::string dim_stride(const ir::TensorParam &t) {
    return t.stride_dim == ir::Extent::constant(1) ? "" : " * " + c_expr(t.stride_dim);
  }
  // This workgroup's (batch, head) slice of tensor t, written out at each use:
  // NVIDIA reads kernel arguments from constant memory, so recomputing costs a
  // few integer ops where a hoisted 64-bit pointer would hold registers across
  // the KV loop (sm_90 d=128 went from 168 to 175 registers, 3 -> 2 blocks per
  // SM); LLVM hoists it into scalar registers on AMD by itself.
  // The head of tensor t this workgroup reads: its query head, or for K and V
  // the query head's KV head (GQA: a group of query heads shares one).
  std::string head_index(const ir::TensorParam &t) const {
    const bool kv = t.name == "K" || t.name == "V";
    return kv ? fmt::format("{} / {}", name(p_.grid_arg(1)), c_expr(p_.group))
              : name(p_.grid_arg(1));
  }
  std::string head_base(const ir::TensorParam &t) const {
    const std::string head = head_index(t);
    const std::string split =
        t.stride_split == ir::Extent::constant(0)
            ? ""
            : fmt::format(" + long({}) * {}", name(p_.grid_arg(3)), c_expr(t.stride_split));
    // Packed rows start at the sequence's start row; a paged tensor adds each
    // row's page (page_row_offset) to this head's base.
    const std::string batch =
        t.packed   ? fmt::format("long({}_start) * {}", t.seq.param, c_expr(t.stride_seq))
        : paged(t) ? std::string("0")
                   : fmt::format("long({}) * {}", name(p_.grid_arg(2)), c_expr(t.stride_batch));
    return fmt::format("{} + {} + long({}) * {}{}", t.name, batch, head, c_expr(t.stride_head),
                       split);
  }
  static bool paged(const ir::TensorParam &t) { return !t.pages.table.empty(); }
  // The offset of row `row` of a paged tensor from its head's base: its page
  // from this batch's row of the page table (ir::TensorParam::Pages).
  std::string page_row_offset(const ir::TensorParam &t, const std::string &row) const {
    return fmt::format("fj_page_row({} + long({}) * {}, {}, {}, {}, {}, {}, {})", t.pages.table,
                       name(p_.grid_arg(2)), c_expr(t.pages.table_stride), row,
                       c_expr(t.pages.table_stride), c_expr(t.pages.page_size),
                       c_expr(t.pages.count), c_expr(t.stride_batch), c_expr(t.stride_seq));
  }
  // The first row of block `idx` (of `rows` rows) of a tensor's slice `base`;
  // the slice itself for grouped rows, which row_offset addresses whole.
  static std::string block_base(const ir::TensorParam &t, const std::string &base,
                                const std::string &idx, const std::string &rows) {
    if (t.grouped())
      return base;
    return fmt::format("{} + long({} * {}) * {}", base, idx, rows, c_expr(t.stride_seq));
  }
  // The offset of row `local` of a block from its first row: 32-bit unsigned,
  // so the access takes a scalar base and a 32-bit lane offset; in range as the
  // runtime checks (Lowered::max_row_stride). Grouped rows (ir::TensorParam::
  // row_group) take `row`, the row in the sequence: its position and its member
  // of the position's group, from the slice's row 0.
  static std::string row_offset(const ir::TensorParam &t, const std::string &local,
                                const std::string &row) {
    if (t.grouped())
      return fmt::format("(long(({0}) / {1}) * {2} + long(({0}) % {1}) * {3})", row,
                         c_expr(t.row_group), c_expr(t.stride_seq), c_expr(t.stride_group));
    if (t.stride_seq == ir::Extent::constant(1))
      return fmt::format("unsigned({})", local);
    return fmt::format("unsigned({}) * unsigned({})", local, c_expr(t.stride_seq));
  }
  // The C value of a mask window attribute: a parameter, a constant, or -1 (none).
  std::string window_expr(const char *key) const {
    auto it = mask_.attrs.find(key);
    if (it == mask_.attrs.end())
      return "-1";
    if (const auto *r = std::get_if<ir::ParamRef>(&it->second))
      return r->name;
    return std::to_string(mask_.int_attr(key, -1));
  }
  // Grouped query rows (the mask's q_group, ir/ops.def): the rows per query
  // position, "" where every row is its own position.
  std::string q_group() const {
    auto it = mask_.attrs.find("q_group");
    if (it == mask_.attrs.end())
      return "";
    if (const auto *r = std::get_if<ir::ParamRef>(&it->second))
      return r->name;
    return std::to_string(mask_.int_attr("q_group", 1));
  }
  // The query position of row `row`: the row itself, or of grouped rows row / q_group.
  std::string query_position(const std::string &row) const {
    const std::string g = q_group();
    return g.empty() ? row : fmt::format("{} / {}", row, g);
  }
  // The trailing arguments of the fj_visible / fj_kv_range / fj_block_unmasked
  // helpers; seqlen_q counts query positions.
  std::string mask_args() const {
    return fmt::format("{}, {}, {}, {}", query_position(seq_const(*p_.tensor("Q"))),
                       seq_const(*p_.tensor("K")), window_expr("window_left"),
                       window_expr("window_right"));
  }
  // The head dim constant of a tensor: Q's (K, dQ, dK) or V's (O, dO, dV).
  static std::string dim_const(const ir::TensorParam &t) {
    return t.name == "Q" || t.name == "K" || t.name == "dQ" || t.name == "dK" ? "kDimQK" : "kDimV";
  }

  Status declare_params();
  /// "float" for an f32 tensor, else "fj_bits".
  static const char *element_type(const ir::TensorParam &t);
  /// Tensors that loads narrow from f32 to the operand type (f32_io).
  std::set<std::string> narrowed_tensors() const;
  /// The kernel text's loads of f32 tensors narrowed as they load (f32_io).
  void emit_narrowing_loads();
  void emit_sequences();
  int nvidia_min_blocks() const;
  // Adds a named constant once (the loop body is emitted twice, see emit_for).
  void add_constant(std::string decl, std::string comment) {
    for (const auto &c : constants_)
      if (c.first == decl)
        return;
    constants_.emplace_back(std::move(decl), std::move(comment));
  }
  Status find_mask(const std::vector<Op> &body);
  void emit_constants();
  Status emit_ops(const std::vector<Op> &body);
  Status emit_op(const Op &op);
  void emit_ir_comment(const Op &op, std::string_view note);
  Status emit_load(const Op &op);
  Status emit_vector_load(const Op &op);
  std::string register_lds(const Op &op);
  std::string register_vector_lds(const Op &op);
  /// The LDS buffer a staged tile or #cols vector load goes to (register_lds).
  std::string lds_name(const Op &op) const;
  /// Declares an LDS array of `count` `elem`s ("fj_bits" or "float") taking
  /// `bytes`, at an offset aligned to `align` bytes (dynamic LDS where the rules
  /// say); while lds_copies_ > 1 it has that many copies `bytes` apart, `buf`
  /// naming the first.
  void declare_lds(const std::string &elem, const std::string &buf, int64_t count, int64_t bytes,
                   int64_t align, const std::string &what);
  void emit_stage_issue(const Op &op, const std::string &idx);
  void emit_vector_issue(const Op &op, const std::string &idx);
  void finish_stage(const Op &op, const std::string &buf);
  Status emit_store(const Op &op);
  /// emit_store's path through LDS rows (Rules::stages_output) for a 16-bit
  /// #mma_acc tile `v` of `cols` columns.
  void emit_staged_store(const ir::TensorParam &t, const std::string &v, int64_t cols,
                         bool over_tiles);
  /// The LDS arrays run() declares after the body, in order, each 8-byte aligned:
  /// the barriers, the tile slots, the ring's block words.
  struct TailLds {
    const char *elem, *name;
    int64_t count, bytes;
    const char *what;
  };
  std::vector<TailLds> tail_lds() const;
  /// Where those arrays end when they start at `offset`: where O's staging rows
  /// of their own would start.
  int64_t tail_lds_end(int64_t offset) const;
  Status emit_for(const Op &op);
  // The block-range pass: narrows kv_begin / kv_end by the `for`'s `range`
  // function and defines fj_next_seen(from, &full), by which the loop skips the
  // blocks the mask empties and learns which ones it keeps whole.
  Status emit_block_range(const Op &op, bool transposed);
  Status emit_range(const Op &op);
  // The interval (an fj_iv expression) of mask function `f` over the block whose
  // rows are [fj_row_lo, fj_row_hi] and columns [fj_col_lo, fj_col_hi]; rows are
  // queries, or keys where `transposed`.
  Expected<std::string> block_interval(const ir::ScoreFunction &f, bool transposed);
  // Whether a score_mod's `unmasked` function applies where the loop being written
  // says fj_block_full (its `range`, on the loop's own blocks). Elsewhere the op's
  // `function` alone is right: `unmasked` only saves work.
  bool block_full_applies(const Op &op) const;
  // How a lane's accumulator elements get their Philox draws (ir::philox_uniform:
  // one draw per query and ir::kDrawKeys aligned keys), in rounds of `tiles`
  // column tiles: the round's draws, each with its elements (c, e), and the
  // lane bits in which the lanes holding the same draws differ. Each of those
  // `sharing()` lanes draws draws.size() / sharing() of them and they pass the
  // words round (fj_shfl_u32); with no such bits a lane draws each itself.
  struct DrawPlan {
    int tiles = 1, col_tiles = 1;
    std::vector<std::vector<std::pair<int, int>>> draws;
    int lane_bits = 0;
    int sharing() const { return 1 << std::popcount(unsigned(lane_bits)); }
    // Where every lane reads one word of each draw, the same for every draw
    // and a function of its rank among the sharing lanes: that word by rank.
    std::vector<int> word_of_rank;
    // How the sharing lanes pass their draws round (`compared`: the function
    // only compares them with a threshold; docs/decisions.md, "Keep bits and
    // seven rounds"):
    //   keep_bits  8 keep bits per draw (fj_keep_bits), where 8 or more lanes
    //              share a draw, each holding one of its keys;
    //   one_word   each lane just the word it reads (word_of_rank): sharing - 1
    //              shuffles per `sharing` draws;
    //   words      every word of every draw, 4 shuffles per draw (or no
    //              sharing: each lane draws for itself).
    enum class Share { words, one_word, keep_bits };
    Share share(bool compared) const {
      if (compared && sharing() >= 8)
        return Share::keep_bits;
      return sharing() > 1 && !word_of_rank.empty() ? Share::one_word : Share::words;
    }
  };
  // Rows are keys where `transposed` (the backward's S^T); col_tiles: the tile's
  // column fragments.
  DrawPlan draw_plan(bool transposed, int col_tiles) const;
  // The draws of `plan` for the uniform() calls `draws` (ScoreMod's score
  // function), then `element(c, e)` for each element of each draw, where
  // by plan.share(!thresholds.empty()): fj_draw<i> holds draw i's words,
  // fj_word<i> the word of it this lane reads, or fj_keepword<i> its keep bits
  // at fj_keepbase<i>. `thresholds`: C text per draw, where the function only
  // compares draw i >= thresholds[i], which fj_threshold<i> holds as an
  // integer. q_idx, kv_idx: an element's positions in C.
  void emit_draws(const DrawPlan &plan, const std::vector<ir::Expr> &draws,
                  const std::vector<std::string> &thresholds,
                  const std::function<std::string(const std::string &)> &names,
                  const std::string &q_idx, const std::string &kv_idx,
                  const std::function<void(int c, int e)> &element);
  int64_t stages() const {
    return p_.config.count("stages") ? std::get<int64_t>(p_.config.at("stages")) : 1;
  }
  bool plan_pipeline(const Op &loop);
  // Block prefetch (config stages >= 2 where plan_pipeline does not apply: the
  // backward's loops, which read a tile again after the next one is staged; or
  // first, with config prefetch_blocks): every LDS tile and column vector the
  // loop loads has two buffers; block kb + 1's copies start at the top of
  // iteration kb, right after the barrier that completes block kb's.
  bool plan_prefetch(const Op &loop);
  // Copies at the top of each iteration (config stages >= 2 where neither
  // plan_pipeline nor plan_prefetch applies: the second loop of the backward's
  // two-pass dK/dV, whose buffers of one copy the first loop declared and which
  // reads Q twice): every LDS tile and column vector of the loop's block is
  // issued right after the barrier that frees the buffers, and each load waits
  // for its own copy, so the copies' latencies overlap instead of adding up.
  // In a pipelined loop (vectors_only) the column vectors (the backward's L and
  // D), which the tile pipeline does not carry, start there.
  bool plan_early_issue(const Op &loop, bool vectors_only);
  // Whether `load`'s copy started at the top of the iteration (plan_early_issue).
  bool issued_early(const Op &load) const {
    return std::find(early_loads_.begin(), early_loads_.end(), &load) != early_loads_.end();
  }
  // Before a staging inside a loop on AMD (fj_stage8 loads and stores through
  // registers, a branch per chunk), and the backward's mask (a branch on the
  // block) and score_mod ops (a mask tensor's loads branch): pins (fj_pin) each
  // f32 tile computed earlier in the iteration that `branch` or a later op
  // reads, but the yielded accumulators. Else LLVM's MachineSink moves the pure
  // ops computing it (a product's matrix instructions) past the branch to their
  // use, and the product's operand fragments stay live across it instead of its
  // result (gfx1100, head dim 256 dK/dV: 201 VGPRs spilled).
  void keep_live_values(const Op &branch);
  const Op *body_loop_ = nullptr; // the loop whose body is being written
  std::set<ValueId> kept_;        // values keep_live_values pinned in this iteration
  bool prefetch_blocks_ = false;  // config prefetch_blocks: block prefetch before the tile pipeline
  void emit_prefetch_issue(const std::string &idx, const std::string &copy);
  void emit_prefetch_views(const std::vector<const Op *> &loads, const std::string &copy);
  // Warp specialization (config stages 3, the sm90 forward): a producer
  // warpgroup past the kWaves consumer waves (its first lane) copies every block's K and V tiles
  // with TMA into a ring of two copies; a consumer waits for a copy's fill barrier and, after the
  // product that reads it, arrives on its free barrier, which the producer waits for before it
  // refills the copy. No workgroup barrier in the loop; after it the producer has left, and
  // barriers name the consumers only.
  Expected<bool> plan_producer(const Op &loop);
  Status emit_producer(const Op &loop);
  void emit_producer_warp(const Op &loop);
  void emit_producer_blocks(const Op &loop);
  // Config persistent: run() writes the producer's tile loop and the consumers'
  // around the program (emit_persistent); emit_producer writes the producer's
  // code for one tile into producer_w_.
  bool persistent_ = false;
  // Config persistent over tiles of uneven work (causal): each workgroup's tiles
  // after its first come from a counter in a zeroed workspace (Lowered::tile_counter),
  // fetched by the producer and handed to the consumers in a two-slot LDS ring.
  bool dynamic_tiles_ = false;
  MaskBlocks mask_blocks_; // the mask tensor summary's blocks a loop reads (Lowered::mask_blocks)
  HipWriter producer_w_;
  Status emit_persistent();
  void emit_persistent_q();
  const Op *q_load_ = nullptr; // Q's load, when persistent
  // The grid's indices: of this workgroup, or (persistent) of tile `tile`.
  void emit_grid_args(const std::string &tile);
  void emit_row_helpers();
  // Registers per thread and workgroups per SM under a producer warpgroup.
  struct ProducerBudget {
    int producer_regs = 0, consumer_regs = 0, blocks = 1;
  };
  ProducerBudget producer_budget() const;
  // After `product` has waited: this thread is done with the ring copy it read.
  void emit_ring_release(const Op &product);
  // The ring copy the consumers' waits and releases name: "fj_copy", or the
  // previous block's "(fj_copy ^ 1)" in the overlapped loop.
  std::string ring_copy_ = "fj_copy";
  // The overlapped loop (a producer loop with one query tile per wave): block
  // kb's S product is issued beside block kb - 1's O product, so that the
  // softmax of kb runs while the tensor cores work on kb - 1's O
  // (FlashAttention-3's intra-warpgroup overlap).
  struct OverlapPlan {
    size_t s_at = 0, o_at = 0; // the S and O products in the body
    size_t acc = 0;            // the loop's accumulator: region argument `acc`
    std::set<size_t> acc_ops;  // the ops between the products that read it
  };
  std::optional<OverlapPlan> plan_overlap(const Op &loop, size_t s_at, size_t o_at) const;
  Status emit_overlapped(const Op &loop);
  // Block kb - 1's O product issued (in the loop), or the last block's (after it).
  Status emit_overlap_issue(const Op &loop);
  // Waits for that O product; frees its V copy (where `guard` holds, "" always);
  // the loop's accumulator is its result.
  void emit_overlap_finish(const Op &loop, const std::string &guard);
  std::optional<OverlapPlan> overlap_;  // the loop being written is overlapped
  std::vector<const Op *> ring_loads_;  // the loop's K and V loads, body order
  std::map<std::string, int> free_bar_; // ring buffer -> its first free barrier
  int free_bars_ = 0;                   // free barriers (fj_free_bar)
  int producer_threads_ = 0;            // a warpgroup's with a producer
  // Under a mask's block range, the producer passes each block's successor and
  // full flag to the consumers in fj_ring_block (one int per ring copy), so
  // that only the producer scans the mask; read with ring_block_load_'s fill.
  const Op *ring_block_load_ = nullptr;
  bool consumers_only_ = false; // past a warp-specialized loop
  // The workgroup barrier: every thread, or the consumers once the producer left.
  std::string barrier() const;
  // The condition of the thread that issues a TMA copy: thread 0; empty in the
  // producer warpgroup, whose first lane is already the only one there.
  std::string tma_issuer_ = "fj_thread_id() == 0";
  std::vector<const Op *> prefetch_loads_;     // the first load of each buffer, body order
  std::vector<const Op *> early_loads_;        // plan_early_issue's: the first load of each buffer
  std::set<const Op *> prefetched_;            // every load the buffers serve
  std::map<std::string, int64_t> stage_elems_; // a prefetched buffer -> elements per copy
  void emit_copy(ValueId dst_name_of, const std::string &dst, ValueId src);
  // Loads `len` elements at src + d0 into frag[first...]: one vector load where the
  // run is in bounds and aligned, else element by element with bounds checks.
  void emit_run_load(const std::string &frag, int first, int len, bool whole,
                     const std::string &dim, const std::string &dim_stride);
  // The mask tensor's elements of the ScoreMod `op`'s tile, a row's run of
  // consecutive keys in one load where the run is in bounds and the row's key
  // stride is 1 (0 past the lengths). emit_mask_rows declares `var`_src and
  // `var`_ok, [kQTiles][runs]: where each row of the lane's runs starts and
  // whether its runs load whole; then, with qt and c in scope,
  // emit_mask_columns declares float `var`[kAccElems] and loads column tile c's.
  void emit_mask_rows(const Op &op, const std::string &var);
  void emit_mask_columns(const Op &op, const std::string &var);
  // Issues the mask tensor's loads of the ScoreMod ops of a loop body between
  // `from` and `to` before the block's S product, where their bits fit a
  // register budget: `var`_w[kQTiles][col tiles][runs], which emit_mask_columns
  // then unpacks (early_masks_).
  void emit_early_masks(const std::vector<Op> &body, size_t from, size_t to);
  std::set<const Op *> early_masks_;
  std::string declare(ValueId v);
  // Emits `for` headers over a value's fragments; returns the element expression.
  std::string open_elements(const Type &t, const std::string &var);
  void close_elements(const Type &t);
  // The same loops inside a query tile the caller has opened (open_query_tiles).
  std::string open_tile_elements(const Type &t, const std::string &var);
  void close_tile_elements(const Type &t);
  void barrier_if_read(const std::string &buffer);
  // One line per line of `text`.
  void lines(std::string_view text) {
    for (size_t begin = 0; begin <= text.size();) {
      const size_t end = std::min(text.find('\n', begin), text.size());
      w_.line("{}", text.substr(begin, end - begin));
      begin = end + 1;
    }
  }
  const Op *consumer_of(ValueId v, const std::vector<Op> &body) const;

  const ir::Program &p_;
  const Target &target_;
  const Rules &rules_;
  const MatrixInstr *mi_;
  std::string note_;
  std::vector<std::string> printed_;
  HipWriter w_;
  int64_t block_m_ = 0, block_n_ = 0, q_tiles_ = 0, waves_ = 0, pad_k_ = 16;
  int m_tile_ = 16; // query rows of an accumulator fragment (Rules::m_tile)
  int lds_bytes_ = 0;
  int64_t output_stage_bytes_ = 0; // lds_o, declared after the barriers (emit_staged_store)
  int64_t lds_copies_ =
      1; // copies of each LDS array declared now (2 while plan_prefetch registers)
  int scale_constants_ = 0;
  std::map<ValueId, std::string> lds_of_;          // #mma_b tiles live in LDS
  std::map<std::string, std::string> lds_role_;    // buffer -> "rows" | "transposed"
  std::map<std::string, std::string> lds_strides_; // buffer -> its stride constant
  std::set<std::string> read_since_barrier_;
  // Staged buffer -> the block index (its C name) it holds, within one loop
  // iteration (emit_for clears it: the index names the loop variable).
  std::map<std::string, std::string> staged_;
  std::map<ValueId, const Op *> def_of_;
  std::vector<std::pair<std::string, std::string>> constants_; // emitted before the kernel
  std::vector<std::string> lds_decls_;                         // emitted at the top of the body
  // The interleaved KV loop (emit_interleaved): >= 0 while the ops are written
  // for that query tile only; the values declared once before those passes.
  int fixed_qt_ = -1;
  // The loop's next block, for the tile issued one block ahead: `kb + 1`, or the
  // next block the block-range pass may see.
  std::string next_block_;
  // The loop being written when it scans a `range` (fj_block_full is its block's flag).
  const Op *range_loop_ = nullptr;
  std::set<ValueId> predeclared_;
  // Opens a block over the query tiles (a loop, or the one fixed tile); close with w_.close().
  void open_query_tiles() {
    if (fixed_qt_ >= 0) {
      w_.open("{{ // query tile {} of this pass", fixed_qt_);
      w_.line("constexpr int qt = {};", fixed_qt_);
    } else {
      w_.line("#pragma unroll");
      w_.open("for (int qt = 0; qt < kQTiles; ++qt) {{");
    }
  }
  bool find_products(const Op &loop, size_t &s_at, size_t &o_at) const;
  bool plan_interleave(const Op &loop, size_t &s_at, size_t &o_at) const;
  Status emit_interleaved(const Op &loop, size_t s_at, size_t o_at);
  // `in_place`: the result accumulates where it is (it holds C already, and is
  // declared): no copy of C and no pin before the fence (WarpgroupProduct::pin_before).
  Status emit_product(const Op &op, int only_qt, bool wait, bool group_per_tile = false,
                      bool in_place = false);
  std::set<std::string> swizzled_; // buffers in LdsLayout::swizzled_128b
  // TMA (sm90): a staged tile whose tensor a tensor map describes is copied by
  // one thread with cp.async.bulk.tensor, completing on a transaction barrier of
  // its buffer copy; every thread waits on that barrier (fj_tma_wait).
  bool tma_tile(const Op &op) const;
  TmaUse tma_use() const {
    return p_.tensor("dO") != nullptr ? TmaUse::backward
           : stages() == 3            ? TmaUse::producer
                                      : TmaUse::forward;
  }
  struct TmaBuffer {
    int first_bar = 0;  // its barriers: first_bar + copy
    std::string map;    // the tensor map parameter it is copied through
    int64_t panels = 0; // 64-column panels
  };
  std::map<std::string, TmaBuffer> tma_; // buffer -> its barriers and map
  // Tiles copied by TMA before a producer's loop whose wait the consumers do
  // after the split (emit_producer): the load and its buffer.
  std::vector<std::pair<const Op *, std::string>> deferred_waits_;
  // Without a producer, an LDS tile that only the next loop reads (Q) completes
  // with that loop's first wait (read_in_next_loop): its buffer, while the loop
  // is written. A wait for TMA tiles there waits for its copies too
  // (wait_for_deferred_copy); emit_for waits after the loop for the case of no block.
  std::string q_wait_in_loop_;
  bool deferred_wait_written_ = false; // in this pass over the loop's body
  void wait_for_deferred_copy();
  bool read_in_next_loop(const Op &load) const;
  std::vector<std::pair<std::string, const Op *>> maps_; // map parameter -> a load it serves
  int tma_bars_ = 0;
  std::string tma_bar(const TmaBuffer &b) const;
  // The copy of the prefetched buffers an issue writes ("0", "fj_copy ^ 1"; "0"
  // for a buffer of one copy) and a wait reads ("fj_copy").
  std::string tma_copy_ = "0";
  std::map<std::string, std::string> helpers_; // the rules' helpers, by name (before the kernel)
  bool vec_ok_ = true;
  bool vec4_ok_ = true;     // 64-bit runs: head dims and strides that are multiples of 4 (e.g. 100)
  bool f32_inputs_ = false; // some tensor loads narrowed from f32 (f32_io)
  bool q_in_lds_ = false;
  // Software pipelining of the loop's LDS tiles (config stages >= 2): each tile is
  // issued right after the previous one is complete, the first before the loop.
  std::vector<const Op *> pipeline_order_;
  std::set<const Op *> pipelined_loads_;
  Op mask_{OpKind::Mask, {}, {}, {}, {}, {}}; // the mask attributes every mask and loop shares
};

} // namespace flashjit::lowering::emit
