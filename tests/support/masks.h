// Mask tensors with structure for the numeric tests: empty, full and mixed
// blocks, as the block summary (lowering/mask_blocks.cpp) classes them.
#pragma once

#include "ir/spec.h"

#include <limits>
#include <vector>

namespace flashjit::test {

/// A mask as transformers builds one for a padded batch, into `mask` (the
/// spec's mask_elements, laid out by its strides): batch b's first 70 * b keys
/// hidden (left padding) and causal (bottom-right); additive masks add 0 where
/// kept, -inf where hidden, and 0.5 in a stripe (mixed blocks that keep every
/// key). Queries of batch 1 before its padding ends see no key.
inline void structured_mask(const AttentionSpec &s, std::vector<float> &mask) {
  const MaskStrides &m = s.mask_strides;
  const bool boolean = s.mask == MaskType::boolean;
  for (int64_t b = 0; b < (m.batch ? s.batch : 1); ++b)
    for (int64_t h = 0; h < (m.head ? s.heads : 1); ++h)
      for (int64_t i = 0; i < (m.q ? s.seqlen_q : 1); ++i)
        for (int64_t j = 0; j < (m.k ? s.seqlen_k : 1); ++j) {
          const bool keep = j >= 70 * b && j <= i + s.seqlen_k - s.seqlen_q;
          const float stripe = (j / 32 + i / 16 + h) % 7 == 0 ? 0.5f : 0.0f;
          mask[size_t(b * m.batch + h * m.head + i * m.q + j * m.k)] =
              boolean ? (keep ? 1.0f : 0.0f)
              : keep  ? stripe
                      : -std::numeric_limits<float>::infinity();
        }
}

} // namespace flashjit::test
