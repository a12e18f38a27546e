// AttentionSpec: layouts, strides, extents, summary, and one test per
// validation rejection (each checks that the message names the field).
#include "ir/spec.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

namespace flashjit {
namespace {

/// gtest-only stand-in for gmock's HasSubstr (the suites link gtest alone).
::testing::AssertionResult Mentions(const std::string &message, const std::string &needle) {
  if (message.find(needle) != std::string::npos)
    return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << "message \"" << message << "\" lacks \"" << needle << "\"";
}

AttentionSpec valid_spec(Layout layout = Layout::bshd) {
  return make_spec(2, 6, 3, 17, 29, 40, 24, DType::bf16, layout);
}

/// Validates `spec`, expects an error, and returns its message.
std::string rejection(const AttentionSpec &spec) {
  Status s = spec.validate();
  EXPECT_FALSE(s.is_ok()) << "accepted: " << spec.summary();
  return s.message();
}

TEST(Layout, NamesRoundTrip) {
  for (Layout l : {Layout::bshd, Layout::bhsd, Layout::interleaved}) {
    Expected<Layout> parsed = parse_layout(layout_name(l));
    ASSERT_TRUE(parsed.has_value());
    EXPECT_EQ(*parsed, l);
  }
  EXPECT_EQ(layout_name(Layout::interleaved), "interleaved");
}

TEST(Layout, UnknownNameListsValidOnes) {
  Expected<Layout> parsed = parse_layout("bsdh");
  ASSERT_FALSE(parsed.has_value());
  EXPECT_TRUE(Mentions(parsed.status().message(), "'bsdh'"));
  EXPECT_TRUE(Mentions(parsed.status().message(), "bshd"));
  EXPECT_TRUE(Mentions(parsed.status().message(), "bhsd"));
  EXPECT_TRUE(Mentions(parsed.status().message(), "interleaved"));
}

TEST(Spec, SoftmaxScale) {
  AttentionSpec s = valid_spec();
  s.head_dim_qk = 64;
  EXPECT_DOUBLE_EQ(s.softmax_scale(), 0.125);
  s.scale = 0.3;
  EXPECT_DOUBLE_EQ(s.softmax_scale(), 0.3);
}

TEST(Spec, Extent) {
  // 1 + (2-1)*1000 + (3-1)*100 + (4-1)*10 + (5-1)*1
  EXPECT_EQ(AttentionSpec::extent({1000, 100, 10, 1}, 2, 3, 4, 5), 1235);
  EXPECT_EQ(AttentionSpec::extent({1000, 100, 10, 1}, 1, 1, 1, 1), 1);
  EXPECT_EQ(AttentionSpec::extent({1000, 100, 10, 1}, 2, 0, 4, 5), 0);
}

TEST(Spec, MakeSpecSetsSizes) {
  AttentionSpec s = make_spec(2, 8, 2, 5, 7, 32, 16, DType::f16, Layout::bhsd);
  EXPECT_EQ(s.batch, 2);
  EXPECT_EQ(s.heads, 8);
  EXPECT_EQ(s.kv_heads, 2);
  EXPECT_EQ(s.group(), 4);
  EXPECT_EQ(s.seqlen_q, 5);
  EXPECT_EQ(s.seqlen_k, 7);
  EXPECT_EQ(s.diagonal_offset(), 2);
  EXPECT_EQ(s.head_dim_qk, 32);
  EXPECT_EQ(s.head_dim_v, 16);
  EXPECT_EQ(s.dtype, DType::f16);
  EXPECT_EQ(s.layout, Layout::bhsd);
  EXPECT_FALSE(s.causal);
  EXPECT_FALSE(s.lse);
  EXPECT_EQ(s.scale, 0);
  EXPECT_EQ(s.window, Window{});
}

// B=2, Hq=4, Hkv=2, Sq=5, Sk=7, Dqk=16, Dv=8 throughout the stride tests.
AttentionSpec stride_spec(Layout l) { return make_spec(2, 4, 2, 5, 7, 16, 8, DType::bf16, l); }

TEST(SetLayout, Bshd) {
  AttentionSpec s = stride_spec(Layout::bshd);
  EXPECT_EQ(s.q, (Strides{.batch = 5 * 4 * 16, .head = 16, .seq = 4 * 16, .dim = 1}));
  EXPECT_EQ(s.k, (Strides{.batch = 7 * 2 * 16, .head = 16, .seq = 2 * 16, .dim = 1}));
  EXPECT_EQ(s.v, (Strides{.batch = 7 * 2 * 8, .head = 8, .seq = 2 * 8, .dim = 1}));
  EXPECT_EQ(s.o, (Strides{.batch = 5 * 4 * 8, .head = 8, .seq = 4 * 8, .dim = 1}));
  EXPECT_EQ(s.q_elements(), 2 * 5 * 4 * 16);
  EXPECT_EQ(s.k_elements(), 2 * 7 * 2 * 16);
  EXPECT_EQ(s.v_elements(), 2 * 7 * 2 * 8);
  EXPECT_EQ(s.o_elements(), 2 * 5 * 4 * 8);
  EXPECT_EQ(s.lse_elements(), 2 * 4 * 5);
}

TEST(SetLayout, Bhsd) {
  AttentionSpec s = stride_spec(Layout::bhsd);
  EXPECT_EQ(s.q, (Strides{.batch = 4 * 5 * 16, .head = 5 * 16, .seq = 16, .dim = 1}));
  EXPECT_EQ(s.k, (Strides{.batch = 2 * 7 * 16, .head = 7 * 16, .seq = 16, .dim = 1}));
  EXPECT_EQ(s.v, (Strides{.batch = 2 * 7 * 8, .head = 7 * 8, .seq = 8, .dim = 1}));
  EXPECT_EQ(s.o, (Strides{.batch = 4 * 5 * 8, .head = 5 * 8, .seq = 8, .dim = 1}));
  EXPECT_EQ(s.q_elements(), 2 * 4 * 5 * 16);
  EXPECT_EQ(s.o_elements(), 2 * 4 * 5 * 8);
}

TEST(SetLayout, InterleavedWithDifferentHeadDims) {
  AttentionSpec s = stride_spec(Layout::interleaved);
  // Token row: 4 Q heads of 16, 2 K heads of 16, 2 V heads of 8.
  const int64_t W = 4 * 16 + 2 * 16 + 2 * 8;
  ASSERT_EQ(W, 112);
  EXPECT_EQ(s.q, (Strides{.batch = 5 * 112, .head = 16, .seq = 112, .dim = 1}));
  EXPECT_EQ(s.k, (Strides{.batch = 7 * 112, .head = 16, .seq = 112, .dim = 1}));
  EXPECT_EQ(s.v, (Strides{.batch = 7 * 112, .head = 8, .seq = 112, .dim = 1}));
  EXPECT_EQ(s.o, (Strides{.batch = 5 * 32, .head = 8, .seq = 32, .dim = 1}));
  // Last Q element: batch 1, head 3, token 4, dim 15.
  EXPECT_EQ(s.q_elements(), 1 + 560 + 3 * 16 + 4 * 112 + 15);
  EXPECT_EQ(s.k_elements(), 1 + 784 + 1 * 16 + 6 * 112 + 15);
  EXPECT_EQ(s.v_elements(), 1 + 784 + 1 * 8 + 6 * 112 + 7);
  EXPECT_EQ(s.o_elements(), 2 * 5 * 4 * 8);
  EXPECT_TRUE(s.validate().is_ok()) << s.validate().message();
}

TEST(Validate, EachLayoutPasses) {
  for (Layout l : {Layout::bshd, Layout::bhsd, Layout::interleaved}) {
    for (DType t : {DType::bf16, DType::f16}) {
      AttentionSpec s = make_spec(3, 8, 1, 100, 33, 128, 64, t, l);
      Status st = s.validate();
      EXPECT_TRUE(st.is_ok()) << s.summary() << ": " << st.message();
    }
  }
}

TEST(Validate, FeaturesPass) {
  AttentionSpec s = valid_spec();
  s.causal = true;
  s.window = {.left = 16, .right = 0};
  s.scale = 0.5;
  s.lse = true;
  EXPECT_TRUE(s.validate().is_ok()) << s.validate().message();
  s.window.right = -1;
  EXPECT_TRUE(s.validate().is_ok()) << s.validate().message();
  s.causal = false;
  s.window = {.left = 0, .right = 7};
  EXPECT_TRUE(s.validate().is_ok()) << s.validate().message();
}

TEST(Validate, CustomStridesPass) {
  // BSHD with padded rows: every token row padded to 8 extra elements.
  AttentionSpec s = valid_spec();
  s.q.seq += 8;
  s.q.batch = s.q.seq * s.seqlen_q;
  EXPECT_TRUE(s.validate().is_ok()) << s.validate().message();
  // A zero stride on a size-1 dimension is harmless.
  s.batch = 1;
  s.q.batch = 0;
  EXPECT_TRUE(s.validate().is_ok()) << s.validate().message();
}

TEST(Validate, RejectsBatch) {
  AttentionSpec s = valid_spec();
  s.batch = 0;
  EXPECT_TRUE(Mentions(rejection(s), "batch (0)"));
}

TEST(Validate, RejectsHeads) {
  AttentionSpec s = valid_spec();
  s.heads = -2;
  EXPECT_TRUE(Mentions(rejection(s), "heads (-2)"));
}

TEST(Validate, RejectsKvHeads) {
  AttentionSpec s = valid_spec();
  s.kv_heads = 0;
  EXPECT_TRUE(Mentions(rejection(s), "kv_heads (0)"));
}

TEST(Validate, RejectsSeqlenQ) {
  AttentionSpec s = valid_spec();
  s.seqlen_q = 0;
  EXPECT_TRUE(Mentions(rejection(s), "seqlen_q (0)"));
}

TEST(Validate, RejectsSeqlenK) {
  AttentionSpec s = valid_spec();
  s.seqlen_k = 0;
  EXPECT_TRUE(Mentions(rejection(s), "seqlen_k (0)"));
}

TEST(Validate, RejectsHeadsNotMultipleOfKvHeads) {
  AttentionSpec s = make_spec(1, 6, 4, 8, 8, 64, 64, DType::bf16);
  EXPECT_TRUE(Mentions(rejection(s), "heads (6) must be a multiple of kv_heads (4) for GQA/MQA"));
}

TEST(Validate, RejectsLseCountOverflow) {
  AttentionSpec s = valid_spec();
  s.batch = int64_t{1} << 40;
  s.heads = int64_t{1} << 20;
  s.kv_heads = 1;
  s.seqlen_q = int64_t{1} << 10;
  EXPECT_TRUE(Mentions(rejection(s), "batch*heads*seqlen_q"));
}

TEST(Validate, RejectsHeadDimQk) {
  AttentionSpec s = valid_spec();
  s.head_dim_qk = 0;
  EXPECT_TRUE(Mentions(rejection(s), "head_dim_qk (0)"));
  s = make_spec(2, 6, 3, 17, 29, 513, 24, DType::bf16);
  EXPECT_TRUE(Mentions(rejection(s), "head_dim_qk (513)"));
}

TEST(Validate, RejectsHeadDimV) {
  AttentionSpec s = valid_spec();
  s.head_dim_v = -1;
  EXPECT_TRUE(Mentions(rejection(s), "head_dim_v (-1)"));
  s = make_spec(2, 6, 3, 17, 29, 64, 1024, DType::bf16);
  EXPECT_TRUE(Mentions(rejection(s), "head_dim_v (1024)"));
}

TEST(Validate, AcceptsHeadDimBounds) {
  EXPECT_TRUE(make_spec(1, 1, 1, 1, 1, 1, 512, DType::f16).validate().is_ok());
  EXPECT_TRUE(make_spec(1, 1, 1, 1, 1, 512, 1, DType::f16).validate().is_ok());
}

TEST(Validate, RejectsF32) {
  AttentionSpec s = make_spec(1, 1, 1, 8, 8, 64, 64, DType::f32);
  std::string m = rejection(s);
  EXPECT_TRUE(Mentions(m, "dtype f32"));
  EXPECT_TRUE(Mentions(m, "bf16 or f16"));
}

TEST(Validate, RejectsNegativeScale) {
  AttentionSpec s = valid_spec();
  s.scale = -0.5;
  EXPECT_TRUE(Mentions(rejection(s), "scale (-0.5)"));
}

TEST(Validate, RejectsNanScale) {
  AttentionSpec s = valid_spec();
  s.scale = std::nan("");
  EXPECT_TRUE(Mentions(rejection(s), "scale (nan)"));
}

TEST(Validate, RejectsInfScale) {
  AttentionSpec s = valid_spec();
  s.scale = std::numeric_limits<double>::infinity();
  EXPECT_TRUE(Mentions(rejection(s), "scale (inf)"));
}

TEST(Validate, RejectsWindowLeft) {
  AttentionSpec s = valid_spec();
  s.window.left = -2;
  EXPECT_TRUE(Mentions(rejection(s), "window left (-2)"));
}

TEST(Validate, RejectsWindowRight) {
  AttentionSpec s = valid_spec();
  s.window.right = -5;
  EXPECT_TRUE(Mentions(rejection(s), "window right (-5)"));
}

TEST(Validate, RejectsWindowRightWithCausal) {
  AttentionSpec s = valid_spec();
  s.causal = true;
  s.window.right = 5;
  EXPECT_TRUE(Mentions(rejection(s), "window right (5) contradicts causal"));
}

TEST(Validate, RejectsNegativeStride) {
  AttentionSpec s = valid_spec();
  s.k.seq = -48;
  std::string m = rejection(s);
  EXPECT_TRUE(Mentions(m, "k seq stride (-48)"));
  EXPECT_TRUE(Mentions(m, "negative"));
}

TEST(Validate, RejectsZeroDimStride) {
  AttentionSpec s = valid_spec();
  s.v.dim = 0;
  EXPECT_TRUE(Mentions(rejection(s), "v dim stride is 0"));
  // Even for a head dimension of one element: the kernels step along dim.
  s = make_spec(1, 1, 1, 4, 4, 1, 1, DType::bf16);
  s.q.dim = 0;
  EXPECT_TRUE(Mentions(rejection(s), "q dim stride is 0"));
}

TEST(Validate, RejectsZeroStrideOnLargeDim) {
  AttentionSpec s = valid_spec();
  s.o.head = 0; // 6 heads on one address
  std::string m = rejection(s);
  EXPECT_TRUE(Mentions(m, "o head stride is 0"));
  EXPECT_TRUE(Mentions(m, "6 entries"));
}

TEST(Validate, RejectsOverlappingStrides) {
  AttentionSpec s = valid_spec(); // bshd, q: head 40, seq 6*40
  s.q.seq = 100;                  // 6 heads of 40 span 240 elements
  std::string m = rejection(s);
  EXPECT_TRUE(Mentions(m, "q strides (batch=4080, head=40, seq=100, dim=1) overlap"));
  EXPECT_TRUE(Mentions(m, "seq stride (100)"));
}

TEST(Validate, RejectsEqualStrides) {
  AttentionSpec s = valid_spec();
  s.k.head = s.k.seq; // two dimensions walking the same addresses
  EXPECT_TRUE(Mentions(rejection(s), "k strides"));
}

TEST(Validate, RejectsDimStrideSmallerThanHeadRow) {
  // Transposed head dim whose seq stride is too small to hold it.
  AttentionSpec s = make_spec(1, 1, 1, 8, 8, 16, 16, DType::bf16);
  s.v.dim = 4; // 16 dims * 4 = 61-element span, but seq stride is 16
  EXPECT_TRUE(Mentions(rejection(s), "v strides"));
}

TEST(Validate, RejectsOffsetOverflow) {
  AttentionSpec s = valid_spec();
  s.q.batch = std::numeric_limits<int64_t>::max() / 2 + 1; // (2-1)*batch + rest overflows
  s.q.head = std::numeric_limits<int64_t>::max() / 2;
  std::string m = rejection(s);
  EXPECT_TRUE(Mentions(m, "q with strides"));
  EXPECT_TRUE(Mentions(m, "overflow int64"));
}

TEST(Validate, RejectsAbsurdSizesThroughStrides) {
  // Sizes whose dense strides wrap around int64: rejected, not undefined.
  AttentionSpec s = make_spec(1, 1, 1, int64_t{1} << 62, 8, 512, 64, DType::bf16);
  EXPECT_FALSE(s.validate().is_ok());
}

TEST(Summary, Plain) {
  AttentionSpec s = make_spec(1, 16, 4, 113, 203, 80, 80, DType::bf16);
  EXPECT_EQ(s.summary(), "b=1 hq=16 hkv=4 sq=113 sk=203 d=80/80 bf16 bshd");
}

TEST(Summary, AllFeatures) {
  AttentionSpec s = make_spec(2, 8, 8, 64, 64, 128, 64, DType::f16, Layout::interleaved);
  s.causal = true;
  s.window = {.left = 32, .right = 0};
  s.scale = 0.125;
  s.lse = true;
  EXPECT_EQ(s.summary(),
            "b=2 hq=8 hkv=8 sq=64 sk=64 d=128/64 f16 causal window=(32,0) scale=0.125 lse "
            "interleaved");
}

TEST(Summary, ShowsCustomStrides) {
  AttentionSpec s = make_spec(1, 1, 1, 4, 4, 8, 8, DType::bf16);
  s.k.seq = 16;
  s.k.batch = 64;
  EXPECT_EQ(s.summary(), "b=1 hq=1 hkv=1 sq=4 sk=4 d=8/8 bf16 bshd strides "
                         "q=(batch=32, head=8, seq=8, dim=1) k=(batch=64, head=8, seq=16, dim=1) "
                         "v=(batch=32, head=8, seq=8, dim=1) o=(batch=32, head=8, seq=8, dim=1)");
}

} // namespace
} // namespace flashjit
