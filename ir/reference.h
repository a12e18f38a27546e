// The float64 CPU reference attention: the oracle for every numeric test.
#pragma once

#include "ir/spec.h"

#include <cstdint>
#include <span>
#include <vector>

namespace flashjit {

/// Host copies of a spec's tensors. Element values are stored as float and are
/// always representable in the spec's dtype; the buffers follow the spec's
/// strides (gaps between rows, if any, hold NaN poison).
struct HostTensors {
  std::vector<float> q, k, v, o, lse;
  /// The int32 index arrays of a spec with Sequences (empty when unused):
  /// cu_seqlens_q/k [batch + 1], seqused_k [batch], block_table [batch, pages_per_seq].
  std::vector<int32_t> cu_seqlens_q, cu_seqlens_k, seqused_k, block_table;
  /// ALiBi's slopes, [heads] or [batch, heads] (AttentionSpec::alibi); empty when unused.
  std::vector<float> alibi_slopes;
  /// Attention sinks' logits, [heads] (AttentionSpec::sinks); empty when unused.
  std::vector<float> sinks;
  /// The mask tensor's elements (AttentionSpec::mask) in its strides
  /// (mask_strides), as values: 0 or 1 for bool, else rounded to its type. Empty when unused.
  std::vector<float> attn_mask;
  /// The backward pass: dout, the gradient of O, in O's strides (spec.o); dq,
  /// dk, dv, the gradients of Q, K and V, in their tensors' strides. Empty when unused.
  std::vector<float> dout, dq, dk, dv;
  /// With attention sinks: their gradient, [heads]. Empty when unused.
  std::vector<float> dsinks;
};

/// A mask tensor's elements (AttentionSpec::mask) as values, from its raw
/// storage (bool: 1 byte, nonzero is 1), and back (values representable in the type).
std::vector<float> mask_values(MaskType type, const void *storage, int64_t elements);
void mask_storage(MaskType type, std::span<const float> values, void *storage);

/// Fresh random Q/K/V (uniform in [-1, 1), rounded to the dtype, never all zero)
/// and O/LSE poisoned with NaN so an unwritten element cannot pass a comparison.
HostTensors make_random_inputs(const AttentionSpec &spec, uint64_t seed);
/// Checks the index arrays of a spec with Sequences (AttentionSpec::seqs) on the
/// host: sizes, cu_seqlens starting at 0, nondecreasing and within the packed
/// rows and max_seqlen, seqused_k within each batch's keys, block table entries
/// of every used page within the cache. The error names the entry and the fix.
Status check_sequences(const AttentionSpec &spec, const HostTensors &t);
/// Sets every element of O and LSE to NaN.
void poison_outputs(const AttentionSpec &spec, HostTensors &t);

struct ReferenceResult {
  std::vector<double> out; // dense [batch, heads, seqlen_q, head_dim_v]
  std::vector<double> lse; // dense [batch, heads, seqlen_q]; -inf for a fully masked row
};
/// Softmax(Q K^T * scale + mask) V in float64 for every spec feature. A fully
/// masked row gives output 0 and LSE -inf.
ReferenceResult reference_attention(const AttentionSpec &spec, const HostTensors &in);

/// Fresh random dO (uniform in [-1, 1), rounded to the dtype, in O's strides)
/// and dQ, dK, dV poisoned with NaN, for a backward test.
void make_random_grad(const AttentionSpec &spec, HostTensors &t, uint64_t seed);

/// The float64 gradients of O = attention(Q, K, V) against dO (HostTensors::dout):
/// dense [batch, heads, seqlen, dim] arrays (dk, dv over kv_heads: a kv head's
/// gradient sums its group of query heads). Rows that see no key have zero
/// gradient. Covers what the backward kernels do: dense or strided layouts,
/// GQA/MQA, causal (bottom-right), windows, ALiBi, softcap, dropout, varlen and
/// attention sinks (dsinks [heads]: a sink's logit joins each row's softmax with no
/// value); anything else (KV-cache sequences, score_mod, mask_mod) is an error
/// naming the feature.
struct ReferenceGrads {
  std::vector<double> dq, dk, dv;
  std::vector<double> dsinks; // [heads], with sinks
};
Expected<ReferenceGrads> reference_attention_backward(const AttentionSpec &spec,
                                                      const HostTensors &in);

struct ErrorStats {
  double max_abs = 0;    // max |out - ref| over O (and LSE where finite)
  double rel_l2 = 0;     // ||out - ref||_2 / ||ref||_2 over O
  int64_t nonfinite = 0; // NaN/inf in O or a mismatch of LSE's -inf
  bool within(double tol_abs, double tol_rel) const {
    return nonfinite == 0 && max_abs <= tol_abs && rel_l2 <= tol_rel;
  }
};
ErrorStats compare(const AttentionSpec &spec, const HostTensors &result,
                   const ReferenceResult &ref);

/// A result's dQ, dK and dV (in the spec's strides) against the reference's.
/// With sinks, dsinks too: a sum over every query row of a head grows with the
/// rows, so its max_abs is relative to max(1, max |reference|).
struct GradErrorStats {
  ErrorStats dq, dk, dv, dsinks;
  bool within(double tol_abs, double tol_rel) const {
    return dq.within(tol_abs, tol_rel) && dk.within(tol_abs, tol_rel) &&
           dv.within(tol_abs, tol_rel) && dsinks.within(tol_abs, tol_rel);
  }
};
GradErrorStats compare_grads(const AttentionSpec &spec, const HostTensors &result,
                             const ReferenceGrads &ref);

/// The tolerances stated for a dtype: bf16 (8 bits of mantissa) is looser than f16.
struct Tolerance {
  double abs, rel;
};
Tolerance tolerance_for(DType t);

} // namespace flashjit
