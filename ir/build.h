// build_attention(): the FlashAttention-2 forward program for a spec.
#pragma once

#include "ir/ir.h"

#include <string_view>

namespace flashjit::ir {

/// Tuning knobs. Later issues search over these; every field changes the program
/// or its lowering, so all of them are printed into the IR and the cache key.
struct Config {
  int64_t block_m = 64;  // query rows per workgroup
  int64_t block_n = 64;  // keys per KV block
  int64_t waves = 4;     // waves per workgroup (query rows split across them)
  int64_t stages = 1;    // K/V pipeline: 1 none, 2 one step ahead, 3 producer warpgroup + ring
  bool q_in_lds = false; // keep the Q tile in LDS instead of registers
  int64_t pad_k = 16;    // head dims padded (in registers only) to a multiple of this
  /// Queries per accumulator fragment, i.e. the matrix instruction's tile: 16 or
  /// 32 (the CDNA 32x32 MFMAs); 0 lets the lowering choose.
  int64_t mma_m = 0;
  /// The backward's dK/dV program: 1 accumulates dK and dV in one loop over the
  /// query blocks; 2 runs two loops, dV's then dK's (S^T computed in both), so
  /// that only one of the two accumulators is live (lowering::backward_config
  /// takes 2 where both would not fit the registers). 0 lets the lowering
  /// choose for a given config (lowering::backward_dkdv_passes; the runtime
  /// resolves it before building the program, and C and Python configs leave it
  /// 0 unless they set it).
  int64_t dkdv_passes = 1;
  /// The forward with a producer warpgroup (stages 3) as a persistent kernel:
  /// a workgroup per SM (or as many as fit) walks the (query block, head,
  /// batch) tiles, so the producer copies the next tile's K and V while the
  /// consumers finish the last one.
  bool persistent = false;
  /// With stages 2, the forward's KV loop copies whole blocks one iteration
  /// ahead: block kb + 1's K and V tiles are issued at the top of iteration kb
  /// into a second copy of their LDS buffers (twice their LDS), where stages 2
  /// alone issues each tile one step ahead (V while S is computed, the next K
  /// while O is). The backward's loops prefetch so without it.
  bool prefetch_blocks = false;
  bool operator==(const Config &) const = default;
  std::string summary() const;
};

/// Checks the knobs alone (positive, powers of two where the lowering needs them).
Status validate(const Config &c);

/// Head dim rounded up to the config's padding.
inline int64_t padded(int64_t d, int64_t pad) { return (d + pad - 1) / pad * pad; }

/// A mask tensor's element of (b, h, q_idx, kv_idx) as score functions read it
/// (score_function): lowering loads these elements a row's run at a time.
inline constexpr std::string_view kMaskElement =
    "attn_mask[b * mask_batch_stride + h * mask_head_stride + q_idx * mask_q_stride + "
    "kv_idx * mask_k_stride]";

/// The shape-free forward program of `spec`'s signature: lengths, batch,
/// heads, strides, window sizes and the scale are scalar parameters (bound by
/// bind_attention), so the program depends only on spec.signature() and config.
Expected<Program> build_attention(const AttentionSpec &spec, const Config &config);

/// The values of every scalar parameter build_attention() declares, for the
/// shapes of `spec`. Window sizes past every key are clamped (same mask).
/// The shape scalars every program of a spec shares: batch, heads, GQA group,
/// the lengths (or a sequence's capacity and longest length), the pages and the
/// window sizes (clamped to what the lengths can see).
void bind_shape(const AttentionSpec &spec, Bindings &b);
Bindings bind_attention(const AttentionSpec &spec);

/// The first kernel of split-KV attention (flash-decoding): the same program
/// with a 4th grid axis %split over %num_splits, each workgroup visiting one
/// split of its KV blocks (split_range), and writing its partial result in f32
/// to a workspace: @O [num_splits, batch, heads, seqlen_q, head_dim_v] holds
/// acc / l and @LSE [num_splits, batch, heads, seqlen_q] holds ln(sum exp) of
/// the split's keys (-inf for a split with no visible key). A combine kernel
/// (lowering::lower_split_combine) merges the splits by their LSE.
Expected<Program> build_split_kv(const AttentionSpec &spec, const Config &config);

/// Workspace elements (f32) split-KV needs for `spec` over `splits` splits:
/// partial outputs, then partial LSEs.
struct SplitWorkspace {
  int64_t o_elements = 0, lse_elements = 0;
  int64_t bytes() const { return (o_elements + lse_elements) * 4; }
};
SplitWorkspace split_workspace(const AttentionSpec &spec, int64_t splits);

/// bind_attention() for build_split_kv's program with `splits` splits: the
/// workspace's strides instead of O's and the LSE's.
Bindings bind_split_kv(const AttentionSpec &spec, int64_t splits);

/// The KV blocks [begin, end) that hold at least one key visible to some query of
/// q block `qb` (causal and window removed blocks are skipped, never masked).
/// `q_group` > 1: the rows are grouped (AttentionSpec::q_group), row i is query
/// position i / q_group of seqlen_q / q_group.
struct BlockRange {
  int64_t begin, end;
};
BlockRange kv_block_range(int64_t qb, int64_t block_m, int64_t block_n, int64_t seqlen_q,
                          int64_t seqlen_k, bool causal, Window window, int64_t q_group = 1);
/// The transposed range (the backward's dK/dV loop): the query blocks of
/// `block_n` queries [begin, end) that hold at least one query seeing a key of
/// KV block `kb` of `block_m` keys.
BlockRange q_block_range(int64_t kb, int64_t block_m, int64_t block_n, int64_t seqlen_q,
                         int64_t seqlen_k, bool causal, Window window);
/// Split `split` of `splits` of a block range (split-KV): the range cut into
/// `splits` runs of ceil(n / splits) blocks; the last ones may be empty.
BlockRange split_range(BlockRange r, int64_t split, int64_t splits);
/// Whether query row i may see key j (bounds, bottom-right causal, window).
bool visible(int64_t i, int64_t j, int64_t seqlen_q, int64_t seqlen_k, bool causal, Window window);

/// The block-range pass's hook: with an integer mask_mod, `loop` gets `range =
/// @mask_range` (the mask_mod as a function of `p`), which narrows its block
/// range to the blocks the mask's interval over the block may keep
/// (templates/block_range.hip). With a mask tensor it gets `blocks =
/// @attn_mask_blocks` too: the tensor's block summary (lowering::lower_mask_blocks)
/// gives each block's interval of the tensor's mask, which meets the range's
/// (`range` is then "1" where no integer mask_mod bounds it). A float mask_mod
/// alone adds nothing.
void add_block_range(const AttentionSpec &spec, Program &p, Op &loop);
/// Whether the forward's KV loop gets a block range (an integer mask_mod, or a
/// mask tensor).
bool has_block_range(const AttentionSpec &spec, const Config &config);
/// The full-block fast path of a `score_mod` op in a loop the block-range pass
/// narrows: `mod_attrs` get `unmasked = @score_unmasked` (the score function
/// without what the block's class covers: the mask_mod the range bounds, the
/// mask tensor the loop's `blocks` summarize; with `derivative`,
/// @score_grad_unmasked, its derivative), `range = @mask_range` and the loop's
/// `blocks`. Where a block's interval excludes 0, every pair of the block is
/// kept, and the op applies the unmasked function: the same values without
/// evaluating the mask per element.
Status add_unmasked(const AttentionSpec &spec, Program &p, const Op &loop, Attrs &mod_attrs,
                    bool derivative);

/// The backward pass (ir/build_backward.cpp): what it cannot take, by name.
Status validate_backward(const AttentionSpec &spec);
/// The dQ program: a workgroup per query block, looping over the KV blocks.
Expected<Program> build_backward_dq(const AttentionSpec &spec, const Config &config);
/// The dK/dV program: a workgroup per (KV block, query head), rows are keys,
/// looping over the query blocks (a transposed `for`); writes f32 per query head.
Expected<Program> build_backward_dkdv(const AttentionSpec &spec, const Config &config);
/// The same program writing dK and dV themselves, in the dtype, laid out as K
/// and V: for calls where backward_dkdv_direct holds (no reduce kernel).
Expected<Program> build_backward_dkdv_direct(const AttentionSpec &spec, const Config &config);
/// Whether a call's dK/dV program writes dK and dV directly: each KV head has one
/// query head (nothing to sum) and the keys are not packed (the reduce kernel
/// zeroes the packed rows past the last sequence, which no workgroup writes).
/// Else the f32 per-query-head program and the reduce. A run-time choice: the
/// group is a shape, not part of the signature.
bool backward_dkdv_direct(const AttentionSpec &spec);
/// Declares what the spec's score modifiers read in `p`: the softcap scalar,
/// ALiBi's slopes, the mask tensor (`attn_mask` and its four i64 strides).
/// Forward and backward programs share it. bind_modifiers binds its scalars
/// and declare_dropout's.
void declare_modifiers(const AttentionSpec &spec, Program &p);
/// Dropout's scalars (dropout_p, dropout_scale, dropout_seed, dropout_offset)
/// and its function @dropout of `p`: an element x stays x * dropout_scale where
/// uniform(seed, offset, b, h, q_idx, kv_idx) >= dropout_p, else 0. The forward
/// applies it to P after the row sums, the backward to P before dV and to dP.
void declare_dropout(const AttentionSpec &spec, Program &p);
void bind_modifiers(const AttentionSpec &spec, Bindings &b);
/// The spec's score modifiers as one score function of `p`'s scope (its scalars
/// and arrays), in FlashAttention's order: softcap, ALiBi, the user's score_mod,
/// the mask tensor (left out without `with_mask_tensor`), then mask_mod (a
/// select against -inf; left out without `with_mask_mod`). Its
/// text, as the `function` line holds it.
Expected<std::string> score_function(const AttentionSpec &spec, const Program &p,
                                     bool with_mask_mod = true, bool with_mask_tensor = true);

/// The scalar parameters of both backward programs for `spec`'s shapes.
Bindings bind_backward(const AttentionSpec &spec);

/// The backward's f32 workspace, one buffer: L and D (dense [batch, heads,
/// seqlen_q] each, L first), then, unless backward_dkdv_direct, dK and dV per
/// query head (dense [batch, heads, seqlen_k, dim]), which a reduce kernel sums
/// over each group into dK and dV.
/// Packed rows (varlen) are one batch of them all: [heads, total_q] and
/// [heads, total_k, dim].
struct BackwardWorkspace {
  int64_t d_offset = 0, dk_offset = 0, dv_offset = 0, elements = 0;
  Strides rows;   // of L and D (batch and head strides)
  Strides dk, dv; // of the per-query-head dK and dV
};
BackwardWorkspace backward_workspace(const AttentionSpec &spec);

} // namespace flashjit::ir
