// AttentionSpec: everything a user says about the attention they need.
// Tensors are addressed by strides (in elements), so BSHD, BHSD and the
// interleaved (fused QKV projection) layouts are all expressible.
#pragma once

#include "ir/dtype.h"
#include "ir/status.h"

#include <cstdint>
#include <optional>
#include <string>

namespace flashjit {

/// Strides, in elements, of a logical [batch, head, seq, dim] tensor. `group`:
/// in a spec with grouped query rows (AttentionSpec::q_group), the stride
/// between the rows of one query position (0 elsewhere).
struct Strides {
  int64_t batch = 0, head = 0, seq = 0, dim = 1, group = 0;
  bool operator==(const Strides &) const = default;
};

/// Named layouts. `interleaved` is the output of a fused QKV projection:
/// one row of `[batch, seq, Hq*Dqk + Hkv*Dqk + Hkv*Dv]` per token holds the Q,
/// K and V heads side by side, so each tensor's seq stride is the whole row.
enum class Layout { bshd, bhsd, interleaved };
std::string_view layout_name(Layout l);
Expected<Layout> parse_layout(std::string_view name);

struct Window {
  int64_t left = -1, right = -1; // -1: unbounded on that side
  bool operator==(const Window &) const = default;
};

/// Where each batch's rows lie when sequence lengths vary (FlashAttention's
/// varlen and KV-cache calls). All off: every batch has seqlen_q queries and
/// seqlen_k keys at its batch stride. The lengths themselves are int32 arrays in
/// device memory, given per call (AttentionTensors); the kernel clamps what it
/// reads from them to the rows described here, so no array content can make it
/// access memory outside the tensors.
struct Sequences {
  /// cu_seqlens_q [batch + 1]: Q, O and LSE are packed: Q and O [total_q, heads,
  /// dim], LSE [heads, total_q]; batch b's queries are rows [cu[b], cu[b + 1]).
  /// seqlen_q is then the longest sequence (max_seqlen_q); batch strides are unused.
  bool packed_q = false;
  /// cu_seqlens_k [batch + 1]: K and V are packed [total_k, kv_heads, dim] likewise.
  bool packed_k = false;
  /// seqused_k / cache_seqlens [batch]: batch b attends to its first used[b] keys.
  bool used_k = false;
  int64_t total_q = 0, total_k = 0; // rows of packed Q/O and of packed K/V
  /// A paged KV cache: K and V are [num_pages, page_size, kv_heads, dim] (their
  /// batch stride is the page stride), and key j of batch b is row j % page_size
  /// of page block_table[b * pages_per_seq + j / page_size]. 0: not paged.
  int64_t page_size = 0;
  int64_t num_pages = 0;
  int64_t pages_per_seq = 0; // block_table's columns
  bool paged() const { return page_size > 0; }
  bool any() const { return packed_q || packed_k || used_k || paged(); }
  bool operator==(const Sequences &) const = default;
};

/// ALiBi slopes (FlashAttention's alibi_slopes): f32 [heads] or [batch, heads],
/// contiguous; the score of (i, j) gains -slope * |i + seqlen_k - seqlen_q - j|.
enum class Alibi { none, heads, batch_heads };

/// An attention mask tensor (SDPA's attn_mask, transformers' padding masks),
/// given per call: its elements are bool (1 byte; nonzero: the query sees the
/// key), or f32 / f16 / bf16 values added to the scaled score (-inf hides the
/// key). The element type changes the kernel's code; the strides do not.
enum class MaskType { none, boolean, f32, f16, bf16 };
std::string_view mask_type_name(MaskType t); // "none", "bool", "f32", ...
Expected<MaskType> parse_mask_type(std::string_view name);
int mask_type_bytes(MaskType t); // 1, 4, 2, 2 (0 for none)

/// Element strides of a mask tensor, logically [batch, heads, seqlen_q,
/// seqlen_k]: 0 broadcasts an axis, so SDPA's [seqlen_q, seqlen_k] mask is
/// {0, 0, seqlen_k, 1} and a key-padding mask [batch, seqlen_k] is {seqlen_k, 0, 0, 1}.
struct MaskStrides {
  int64_t batch = 0, head = 0, q = 0, k = 1;
  bool operator==(const MaskStrides &) const = default;
};

/// Dense strides of a mask tensor over `axes`, the letters of b, h, q, k it
/// has, in that order ("bhqk", "qk", "bk": a key-padding mask); the axes it
/// lacks broadcast (stride 0). E.g. "bk" for batch 2, seqlen_k 9: {9, 0, 0, 1}.
Expected<MaskStrides> dense_mask_strides(std::string_view axes, int64_t batch, int64_t heads,
                                         int64_t seqlen_q, int64_t seqlen_k);

/// What of an attention spec changes a kernel's code. Everything else (batch,
/// heads, kv_heads, seqlens, strides, window sizes, scale) is a run-time argument,
/// so one kernel serves every spec with the same signature.
struct KernelSignature {
  DType dtype = DType::bf16;
  int64_t head_dim_qk = 64, head_dim_v = 64;
  bool causal = false;
  bool local = false; // a sliding window (its sizes are run-time arguments)
  bool lse = false;
  /// Score modifiers (ir/expr.h): softcap on/off, ALiBi's slopes, the text of
  /// the user's score_mod and mask_mod.
  bool softcap = false;
  Alibi alibi = Alibi::none;
  std::string score_mod, mask_mod;
  MaskType mask = MaskType::none; // the mask tensor's element type
  bool sinks = false;
  bool dropout = false; // dropout_p > 0 (its probability and seed are run-time values)
  bool f32_io = false;  // Q, K, V and O are f32 in memory (AttentionSpec::f32_io)
  /// Sequences: packed Q (cu_seqlens_q), packed K/V (cu_seqlens_k), per-batch key
  /// counts (seqused_k), a paged KV cache.
  bool packed_q = false, packed_k = false, used_k = false, paged = false;
  /// Grouped query rows (AttentionSpec::q_group > 1): a row's memory address and
  /// its position under the masks take a division by the group.
  bool grouped_q = false;
  /// Per tensor (q, k, v, o): the head dim is contiguous (dim stride 1).
  bool unit_dim[4] = {true, true, true, true};
  /// Bytes every row start and stride of q, k, v and o is a multiple of: 16
  /// (128-bit accesses), 8 (64-bit), or the element's size (2, or 4 for f32_io).
  int row_align = 2;
  bool operator==(const KernelSignature &) const = default;
  /// e.g. "bf16 d=80/80 causal align16"
  std::string summary() const;
};

/// The most KV splits one call may ask for (AttentionSpec::num_splits).
constexpr int64_t kMaxSplits = 128;
/// The most KV splits flashjit chooses itself (num_splits 0): one-token decode
/// of a few heads needs more workgroups than kMaxSplits to keep a GPU's memory
/// busy. The combine kernel takes up to this many.
constexpr int64_t kMaxChosenSplits = 1024;

/// The longest sequence a kernel indexes (its row indices are 32-bit).
constexpr int64_t kMaxSeqlen = int64_t(1) << 29;

struct AttentionSpec {
  // batch and the lengths may be 0 (FlashAttention-2's empty calls): without
  // query rows nothing is written; without keys every query gets output 0 and
  // LSE -inf. A tensor without elements may be null.
  int64_t batch = 1;
  int64_t heads = 1;    // query heads
  int64_t kv_heads = 1; // key/value heads; heads % kv_heads == 0 (GQA/MQA)
  int64_t seqlen_q = 1;
  int64_t seqlen_k = 1;
  int64_t head_dim_qk = 64;
  int64_t head_dim_v = 64;
  DType dtype = DType::bf16; // of Q, K, V and O; accumulation is f32
  /// Q, K, V and O are f32 in memory (engines that keep activations in f32):
  /// the kernel rounds Q, K and V to `dtype` (bf16 or f16, nearest even) as it
  /// loads them, for the matrix products, and writes O as f32, unrounded.
  bool f32_io = false;
  /// The element type of Q, K, V and O in memory: f32 with f32_io, else dtype.
  DType io_dtype() const { return f32_io ? DType::f32 : dtype; }
  double scale = 0;    // softmax scale; 0 means 1/sqrt(head_dim_qk)
  bool causal = false; // bottom-right aligned when seqlen_q != seqlen_k
  Window window;       // sliding window around the (bottom-right) diagonal
  /// Score modifiers, applied in this order to the scaled score q.k * scale
  /// (FlashAttention's order), before the causal/window mask:
  ///   softcap > 0:  score = softcap * tanh(score / softcap) (the cap is a run-time value)
  ///   alibi:        score -= slope * |q_idx + seqlen_k - seqlen_q - kv_idx| (slopes per call)
  ///   score_mod:    an expression of score, b, h, q_idx, kv_idx, seqlen_q, seqlen_k
  ///   mask:         a mask tensor's element (mask_strides) added, or where
  ///                 false, the key hidden
  ///   mask_mod:     an expression of the same names but score; 0 hides the key
  /// (FlexAttention's names; q_idx and kv_idx count from each sequence's start).
  double softcap = 0;
  Alibi alibi = Alibi::none;
  std::string score_mod, mask_mod;
  MaskType mask = MaskType::none;
  MaskStrides mask_strides; // of the mask tensor (unused without one)
  /// Dropout (training, FlashAttention's dropout_p): each probability P[i, j] is
  /// kept with probability 1 - dropout_p and scaled by 1 / (1 - dropout_p), else
  /// zeroed, before it weighs V; the row sums and the LSE are those without
  /// dropout. Element (b, h, i, j) is dropped where ir::philox_uniform(seed,
  /// offset, b, h, i, j) < dropout_p, so a backward with the same seed and offset
  /// drops the same elements. Seed and offset are below 2^53; a new offset per
  /// call gives a new pattern under one seed.
  double dropout_p = 0;
  uint64_t dropout_seed = 0, dropout_offset = 0;
  /// Attention sinks (gpt-oss): a learned logit per query head, f32 [heads] given
  /// per call, that joins each row's softmax denominator (in the units of the
  /// modified score) without a value: out = sum_j p_j v_j with p_j =
  /// exp(s_j) / (exp(sink) + sum_k exp(s_k)); LSE includes it. Not with split-KV.
  bool sinks = false;
  bool lse = false; // also write LSE, f32 [batch, heads, seqlen_q]
  /// Split-KV (flash-decoding): the keys of each query block are split over this
  /// many workgroups whose partial results a second kernel merges. 0: chosen
  /// per call from the device's compute units (1 when batch x heads x query
  /// blocks fill it); 1: off (decode then runs the decode kernel, one split
  /// writing O itself); at most kMaxSplits. A run-time choice, not part of the
  /// signature.
  int64_t num_splits = 0;
  /// Varlen batches, per-batch key counts, a paged KV cache (Sequences). seqlen_q
  /// and seqlen_k are then the longest sequences (max_seqlen_q / max_seqlen_k; for
  /// a KV cache its capacity).
  Sequences seqs;
  Strides q, k, v, o; // element strides of each tensor
  /// Grouped query rows (the view gqa_packed_decode makes of several query
  /// tokens): Q's, O's and the LSE's rows come q_group per query position. Row r
  /// is position r / q_group, and member r % q_group of it lies that many group
  /// strides (Strides::group; the LSE's: seqlen_q / q_group) past member 0.
  /// seqlen_q counts rows, a multiple of q_group; masks see seqlen_q / q_group
  /// positions. 1: every row is its own position.
  int64_t q_group = 1;
  Layout layout = Layout::bshd; // the named layout the strides came from (for .npy files)

  bool operator==(const AttentionSpec &) const = default;

  double softmax_scale() const;
  int64_t group() const { return heads / kv_heads; }
  /// Column of the key that sits on the diagonal of query row `i` (bottom-right alignment).
  int64_t diagonal_offset() const { return seqlen_k - seqlen_q; }
  /// Elements a buffer must hold for a tensor with the given strides and extents.
  static int64_t extent(const Strides &s, int64_t b, int64_t h, int64_t n, int64_t d);
  /// (Grouped rows: the positions by the seq stride, a group's members past them.)
  int64_t q_elements() const {
    return extent(q, q_batches(), heads, q_rows() / q_group, head_dim_qk) + (q_group - 1) * q.group;
  }
  int64_t k_elements() const { return extent(k, kv_batches(), kv_heads, kv_rows(), head_dim_qk); }
  int64_t v_elements() const { return extent(v, kv_batches(), kv_heads, kv_rows(), head_dim_v); }
  int64_t o_elements() const {
    return extent(o, q_batches(), heads, q_rows() / q_group, head_dim_v) + (q_group - 1) * o.group;
  }
  int64_t lse_elements() const { return q_batches() * heads * q_rows(); }
  /// Elements the mask tensor's buffer must hold (0 without one).
  int64_t mask_elements() const;
  /// The batch and row extents of the Q/O buffers: (1, total_q) when packed.
  int64_t q_batches() const { return seqs.packed_q ? 1 : batch; }
  int64_t q_rows() const { return seqs.packed_q ? seqs.total_q : seqlen_q; }
  /// Of the K/V buffers: (1, total_k) when packed, (num_pages, page_size) when paged.
  int64_t kv_batches() const { return seqs.paged() ? seqs.num_pages : seqs.packed_k ? 1 : batch; }
  int64_t kv_rows() const {
    return seqs.paged() ? seqs.page_size : seqs.packed_k ? seqs.total_k : seqlen_k;
  }

  /// Sets q/k/v/o strides for a named layout from the sizes already set.
  void set_layout(Layout l);
  /// Every impossible spec gets an error that names the field and the fix.
  Status validate() const;
  Status validate_sequences() const;
  Status validate_modifiers() const;
  Status validate_q_group() const;
  bool has_score_modifier() const {
    return softcap > 0 || alibi != Alibi::none || !score_mod.empty() || !mask_mod.empty() ||
           mask != MaskType::none;
  }
  /// What of this spec a kernel specializes on.
  KernelSignature signature() const;
  /// Ok when a kernel generated for `s` computes this spec; else which field
  /// differs and what to do.
  Status matches(const KernelSignature &s) const;
  /// One line, e.g. "b=1 hq=16 hkv=4 sq=113 sk=203 d=80/80 bf16 causal bshd".
  std::string summary() const;
};

/// GQA packing for decode (FlashAttention's "seqlenq_ngroups_swapped"): the
/// `group` query heads that share a KV head become the query rows of that KV
/// head, so each K/V tile is read once per group and fills `group` rows of a
/// product per query token instead of one. The result views the same buffers
/// as heads = kv_heads with grouped rows (q_group = group): row r is head r %
/// group of token r / group, so seqlen_q = tokens x group, and the masks
/// (causal, window) see the tokens. One token with a mask tensor is viewed by
/// strides alone instead: seqlen_q = group (Q's and O's seq stride is their head
/// stride, their head stride group times it; the mask tensor's likewise), and
/// causal dropped (a no-op for one bottom-right query); the LSE, [batch, heads,
/// 1] contiguous, is the same memory as [batch, kv_heads, group].
/// nullopt where a result would differ or the view does not fit the kernels:
/// more than kMaxPackedTokens tokens, group 1, ALiBi, score_mod or mask_mod
/// (they read the head or query position), dropout, sinks, packed queries, a
/// mask tensor with a sliding window or with several tokens, or a row offset
/// that exceeds 32 bits.
std::optional<AttentionSpec> gqa_packed_decode(const AttentionSpec &s);
/// The most query tokens gqa_packed_decode packs (speculative decoding's drafts).
constexpr int64_t kMaxPackedTokens = 16;

/// Returns a spec with sizes set and strides from `layout` (not validated).
AttentionSpec make_spec(int64_t batch, int64_t heads, int64_t kv_heads, int64_t seqlen_q,
                        int64_t seqlen_k, int64_t head_dim_qk, int64_t head_dim_v, DType dtype,
                        Layout layout = Layout::bshd);

} // namespace flashjit
