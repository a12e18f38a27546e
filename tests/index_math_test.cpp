// The kernels' index math (templates/attention_common.hip) compiled for the
// host and checked against the IR's definitions (ir::visible, ir::kv_block_range,
// ir::q_block_range): the per-score mask, the per-row key bounds NVIDIA's masked
// blocks compare with (fj_visible_keys), the KV loop's and the dK/dV loop's
// block ranges, and the full-block tests. Exhaustive over small lengths and
// windows, causal and not: the emulator runs only the AMD rules, so this is
// where the bounds form meets an independent truth before silicon.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "ir/build.h"

// What the template needs from a kernel's prelude, as host functions. The
// tests call only the index math, which uses none of them.
#define FJ_DEVICE [[maybe_unused]] static inline
#define FJ_METHOD inline
using fj_bits = unsigned short;
[[maybe_unused]] static inline float fj_f16_to_f32(fj_bits) { return 0; }
[[maybe_unused]] static inline float fj_bf16_to_f32(fj_bits) { return 0; }
[[maybe_unused]] static inline float fj_exp2(float x) { return x; }
[[maybe_unused]] static inline float fj_fabs(float x) { return x < 0 ? -x : x; }
[[maybe_unused]] static inline float fj_log2(float x) { return x; }
[[maybe_unused]] static inline float fj_rcp_approx(float x) { return 1 / x; }

// A kernel's named constants, one set per namespace (kBlockM != kBlockN, so a
// swapped block size shows).
namespace causal_kernel {
constexpr bool kCausal = true;
constexpr int kBlockM = 8, kBlockN = 4;
#include "templates/attention_common.hip"
} // namespace causal_kernel
namespace plain_kernel {
constexpr bool kCausal = false;
constexpr int kBlockM = 8, kBlockN = 4;
#include "templates/attention_common.hip"
} // namespace plain_kernel

namespace flashjit {
namespace {

struct Case {
  int seqlen_q, seqlen_k, left, right;
};

// Lengths 0..13 (shorter and longer than a block, seqlen_q above and below
// seqlen_k) and window sizes from 0 to the widest a kernel is given (the host
// clamps wider ones to seqlen_q + seqlen_k: ir/build.cpp).
std::vector<Case> cases() {
  std::vector<Case> out;
  for (int sq = 0; sq <= 13; ++sq)
    for (int sk = 0; sk <= 13; ++sk) {
      const int sizes[] = {-1, 0, 1, 3, 9, sq + sk};
      for (int l : sizes)
        for (int r : sizes)
          out.push_back({sq, sk, l, r});
    }
  return out;
}

template <class Visible, class Keys>
void expect_key_bounds_match(bool causal, Visible visible, Keys keys) {
  for (const Case &c : cases()) {
    const Window w{c.left, c.right};
    // Rows past seqlen_q too: a block's last rows may lie past the sequence.
    for (int i = 0; i < c.seqlen_q + 8; ++i) {
      int lo = 0, hi = 0;
      keys(i, c.seqlen_q, c.seqlen_k, c.left, c.right, &lo, &hi);
      for (int j = 0; j < c.seqlen_k + 8; ++j) {
        const bool want = ir::visible(i, j, c.seqlen_q, c.seqlen_k, causal, w);
        ASSERT_EQ(want, visible(i, j, c.seqlen_q, c.seqlen_k, c.left, c.right))
            << "fj_visible, causal " << causal << " i " << i << " j " << j << " sq " << c.seqlen_q
            << " sk " << c.seqlen_k << " window " << c.left << "," << c.right;
        ASSERT_EQ(want, lo <= j && j <= hi)
            << "fj_visible_keys [" << lo << ", " << hi << "], causal " << causal << " i " << i
            << " j " << j << " sq " << c.seqlen_q << " sk " << c.seqlen_k << " window " << c.left
            << "," << c.right;
      }
    }
  }
}

TEST(IndexMath, RowKeyBoundsAreTheVisibleKeys) {
  expect_key_bounds_match(true, causal_kernel::fj_visible, causal_kernel::fj_visible_keys);
  expect_key_bounds_match(false, plain_kernel::fj_visible, plain_kernel::fj_visible_keys);
}

template <class KvRange, class QRange, class Unmasked, class UnmaskedT>
void expect_block_math_matches(bool causal, KvRange kv_range, QRange q_range, Unmasked unmasked,
                               UnmaskedT unmasked_t) {
  constexpr int kM = 8, kN = 4; // the namespaces' kBlockM, kBlockN
  for (const Case &c : cases()) {
    const Window w{c.left, c.right};
    auto all_visible = [&](int q0, int q1, int k0, int k1) {
      for (int i = q0; i <= q1; ++i)
        for (int j = k0; j <= k1; ++j)
          if (!ir::visible(i, j, c.seqlen_q, c.seqlen_k, causal, w))
            return false;
      return true;
    };
    for (int qb = 0; qb * kM < c.seqlen_q; ++qb) {
      int begin = 0, end = 0;
      kv_range(qb, c.seqlen_q, c.seqlen_k, c.left, c.right, &begin, &end);
      const ir::BlockRange want = ir::kv_block_range(qb, kM, kN, c.seqlen_q, c.seqlen_k, causal, w);
      ASSERT_EQ(begin, want.begin) << "fj_kv_range qb " << qb << " sq " << c.seqlen_q;
      ASSERT_EQ(end, want.end) << "fj_kv_range qb " << qb << " sq " << c.seqlen_q;
      for (int kb = 0; kb * kN < c.seqlen_k; ++kb) {
        if (unmasked(qb, kb, c.seqlen_q, c.seqlen_k, c.left, c.right)) {
          ASSERT_TRUE(all_visible(qb * kM, qb * kM + kM - 1, kb * kN, kb * kN + kN - 1))
              << "fj_block_unmasked qb " << qb << " kb " << kb;
        }
      }
    }
    for (int kb = 0; kb * kM < c.seqlen_k; ++kb) {
      int begin = 0, end = 0;
      q_range(kb, c.seqlen_q, c.seqlen_k, c.left, c.right, &begin, &end);
      const ir::BlockRange want = ir::q_block_range(kb, kM, kN, c.seqlen_q, c.seqlen_k, causal, w);
      ASSERT_EQ(begin, want.begin) << "fj_q_range kb " << kb << " sk " << c.seqlen_k;
      ASSERT_EQ(end, want.end) << "fj_q_range kb " << kb << " sk " << c.seqlen_k;
      for (int qb = 0; qb * kN < c.seqlen_q; ++qb) {
        if (unmasked_t(kb, qb, c.seqlen_q, c.seqlen_k, c.left, c.right)) {
          ASSERT_TRUE(all_visible(qb * kN, qb * kN + kN - 1, kb * kM, kb * kM + kM - 1))
              << "fj_block_unmasked_t kb " << kb << " qb " << qb;
        }
      }
    }
  }
}

TEST(IndexMath, BlockRangesAndFullBlocksMatchTheIr) {
  expect_block_math_matches(true, causal_kernel::fj_kv_range, causal_kernel::fj_q_range,
                            causal_kernel::fj_block_unmasked, causal_kernel::fj_block_unmasked_t);
  expect_block_math_matches(false, plain_kernel::fj_kv_range, plain_kernel::fj_q_range,
                            plain_kernel::fj_block_unmasked, plain_kernel::fj_block_unmasked_t);
}

} // namespace
} // namespace flashjit
