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
};

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

/// The tolerances stated for a dtype: bf16 (8 bits of mantissa) is looser than f16.
struct Tolerance {
  double abs, rel;
};
Tolerance tolerance_for(DType t);

} // namespace flashjit
