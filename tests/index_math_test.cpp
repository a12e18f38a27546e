// The kernels' index math (templates/attention_common.hip) compiled for the
// host and checked against the IR's definitions (ir::visible, ir::kv_block_range,
// ir::q_block_range): the per-score mask, the per-row key bounds NVIDIA's masked
// blocks compare with (fj_visible_keys), the KV loop's and the dK/dV loop's
// block ranges, and the full-block tests. Exhaustive over small lengths and
// windows, causal and not: the emulator runs only the AMD rules, so this is
// where the bounds form meets an independent truth before silicon. Likewise
// dropout's draws (fj_draw against ir::philox_uniform) and the helpers that
// compare and pass them (integer thresholds, keep bits, one word each), which
// NVIDIA's kernels use in ways no AMD layout does.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "ir/build.h"
#include "ir/expr.h"

#include <cmath>
#include <limits>

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

TEST(IndexMath, DrawsAreTheIrsPhiloxUniform) {
  using namespace plain_kernel;
  const std::array<uint32_t, 2> key = ir::philox_key(0x123456789ull, 77);
  const fj_draw_key k = fj_philox_key(0x123456789ull, 77);
  ASSERT_EQ(k.k0, key[0]);
  ASSERT_EQ(k.k1, key[1]);
  for (unsigned q : {0u, 1u, 5u, 4095u, 70000u})
    for (unsigned kv = 0; kv < 64; ++kv) {
      const fj_draw_words d = fj_draw(k, 3, 2, q, kv);
      const double want = ir::philox_uniform(0x123456789ull, 77, 3, 2, q, kv);
      ASSERT_EQ(double(fj_draw_slot(d, kv)), want) << "q " << q << " kv " << kv;
      ASSERT_EQ(double(fj_draw_bits(d, kv)) / 65536.0, want);
      // One word each: the word holding key kv, then its half.
      const unsigned word = fj_pick_word(d, int(kv % 8 / 2));
      ASSERT_EQ(fj_word_bits(word, kv), fj_draw_bits(d, kv));
      ASSERT_EQ(fj_word_slot(word, kv), fj_draw_slot(d, kv));
    }
}

TEST(IndexMath, DrawThresholdsCompareAsTheFloats) {
  // bits >= fj_draw_threshold(x) exactly when bits * 2^-16 >= x (f32), for every
  // 16-bit draw: at the grid points, between them, at the ends and beyond.
  using namespace plain_kernel;
  std::vector<float> xs = {0.0f,
                           -0.0f,
                           -1.0f,
                           1.0f,
                           1.5f,
                           2.0f,
                           1e30f,
                           -1e30f,
                           1e-40f,
                           0.5f,
                           0.1f,
                           0.2f,
                           0.9f,
                           0.99999f,
                           65535.0f / 65536.0f,
                           1e-5f,
                           1.0f / 65536.0f,
                           std::nextafter(0.25f, 1.0f),
                           std::nextafter(0.25f, 0.0f),
                           std::numeric_limits<float>::infinity(),
                           -std::numeric_limits<float>::infinity(),
                           std::numeric_limits<float>::quiet_NaN()};
  for (int i = 1; i < 40; ++i)
    xs.push_back(float(i) / 41.0f);
  for (float x : xs) {
    const unsigned t = fj_draw_threshold(x);
    for (unsigned bits = 0; bits < 65536; ++bits)
      ASSERT_EQ(bits >= t, float(bits) * 1.52587890625e-05f >= x)
          << "x " << x << " bits " << bits << " threshold " << t;
  }
}

TEST(IndexMath, KeepBitsAreTheDrawsCompared) {
  // fj_keep_bits' bit s is key s of the draw compared; fj_keep_bit reads a key's
  // bit at any of a word's four bytes; fj_pick is the selected word.
  using namespace plain_kernel;
  const fj_draw_key k = fj_philox_key(5, 0);
  for (unsigned q = 0; q < 50; ++q)
    for (float x : {0.0f, 0.1f, 0.5f, 0.93f, 1.0f}) {
      const fj_draw_words d = fj_draw(k, 0, 1, q, 8 * q);
      const unsigned t = fj_draw_threshold(x);
      const unsigned bits = fj_keep_bits(d, t);
      ASSERT_EQ(bits >> 8, 0u);
      for (int base = 0; base < 32; base += 8)
        for (unsigned kv = 8 * q; kv < 8 * q + 8; ++kv)
          ASSERT_EQ(fj_keep_bit(bits << base, base, kv), unsigned(fj_draw_bits(d, kv) >= t))
              << "q " << q << " kv " << kv << " x " << x << " base " << base;
    }
  const unsigned words[4] = {11, 22, 33, 44};
  for (int i = 0; i < 4; ++i)
    ASSERT_EQ(fj_pick(words, i), words[i]);
}

} // namespace
} // namespace flashjit
