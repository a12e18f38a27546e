// AttentionSpec: layouts, strides, extents, summary, and one test per
// validation rejection (each checks that the message names the field).
#include "ir/spec.h"

#include "ir/build.h"

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
  s.batch = -1;
  EXPECT_TRUE(Mentions(rejection(s), "batch (-1) must be at least 0"));
}

TEST(Validate, RejectsHeads) {
  AttentionSpec s = valid_spec();
  s.heads = -2;
  EXPECT_TRUE(Mentions(rejection(s), "heads (-2)"));
}

TEST(Validate, RejectsKvHeads) {
  AttentionSpec s = valid_spec();
  s.kv_heads = 0;
  EXPECT_TRUE(Mentions(rejection(s), "kv_heads (0) must be at least 1"));
}

TEST(Validate, RejectsSeqlenQ) {
  AttentionSpec s = valid_spec();
  s.seqlen_q = -3;
  EXPECT_TRUE(Mentions(rejection(s), "seqlen_q (-3) must be at least 0"));
}

TEST(Validate, RejectsSeqlenK) {
  AttentionSpec s = valid_spec();
  s.seqlen_k = -1;
  EXPECT_TRUE(Mentions(rejection(s), "seqlen_k (-1) must be at least 0"));
}

// Empty calls are valid (FlashAttention-2 runs them): no batch, no queries or
// no keys, whatever the empty tensors' strides (NumPy's are all 0).
TEST(Validate, AcceptsEmptyBatchesAndSequences) {
  for (auto [b, sq, sk] : {std::tuple{0, 8, 8}, {2, 0, 8}, {2, 8, 0}, {1, 0, 0}}) {
    AttentionSpec s = valid_spec();
    s.batch = b;
    s.seqlen_q = sq;
    s.seqlen_k = sk;
    s.set_layout(Layout::bshd);
    EXPECT_TRUE(s.validate().is_ok()) << s.validate().message();
    if (sk == 0)
      s.k = s.v = Strides{};
    EXPECT_TRUE(s.validate().is_ok()) << s.validate().message();
  }
}

TEST(Validate, RejectsHeadsNotMultipleOfKvHeads) {
  AttentionSpec s = make_spec(1, 6, 4, 8, 8, 64, 64, DType::bf16);
  EXPECT_TRUE(Mentions(rejection(s), "heads (6) must be a multiple of kv_heads (4) for GQA/MQA"));
}

TEST(Validate, RejectsLseCountOverflow) {
  // Each count within its 32-bit limit, the product past int64.
  AttentionSpec s = valid_spec();
  s.batch = std::numeric_limits<int32_t>::max();
  s.heads = std::numeric_limits<int32_t>::max();
  s.kv_heads = 1;
  s.seqlen_q = int64_t{1} << 10;
  EXPECT_TRUE(Mentions(rejection(s), "batch*heads*seqlen_q"));
}

// Issue 18, finding 2: sizes past what the kernels index in 32 bits are refused.
TEST(Validate, Issue18Finding2CountsPastThe32BitKernelsAreRefused) {
  AttentionSpec s = valid_spec();
  s.batch = int64_t{1} << 40;
  std::string m = rejection(s);
  EXPECT_TRUE(Mentions(m, "batch (1099511627776) is past the 2147483647"));
  EXPECT_TRUE(Mentions(m, "split the call into several"));
  s = valid_spec();
  s.heads = s.kv_heads = int64_t{1} << 31;
  EXPECT_TRUE(Mentions(rejection(s), "heads (2147483648) is past the 2147483647"));
}

TEST(Validate, Issue18Finding2SeqlenPastKMaxSeqlenIsRefused) {
  static_assert(kMaxSeqlen == int64_t{1} << 29);
  AttentionSpec s = make_spec(1, 1, 1, kMaxSeqlen + 1, 8, 64, 64, DType::bf16);
  std::string m = rejection(s);
  EXPECT_TRUE(Mentions(m, "seqlen_q (536870913) is past the 536870912"));
  EXPECT_TRUE(Mentions(m, "split the sequence"));
  s = make_spec(1, 1, 1, 8, kMaxSeqlen + 1, 64, 64, DType::bf16);
  EXPECT_TRUE(Mentions(rejection(s), "seqlen_k (536870913) is past the 536870912"));
  // kMaxSeqlen itself is fine.
  s = make_spec(1, 1, 1, kMaxSeqlen, kMaxSeqlen, 64, 64, DType::bf16);
  EXPECT_TRUE(s.validate().is_ok()) << s.validate().message();
}

TEST(Validate, RejectsRowStridesPast32Bits) {
  AttentionSpec s = make_spec(1, 1, 1, 4, 4, 64, 64, DType::bf16);
  s.k.seq = int64_t{1} << 31;
  s.k.batch = s.k.seq * 4;
  std::string m = rejection(s);
  EXPECT_TRUE(Mentions(m, "k seq stride (2147483648) and dim stride (1) must be below 2^31"));
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

// Issue 18, finding 8: the scale is validated in the type the kernels use (f32).
TEST(Validate, Issue18Finding8ScaleOutsideF32IsRefused) {
  // Finite in double, but the kernels scale by scale * log2(e) in f32.
  AttentionSpec s = valid_spec();
  s.scale = 1e39;
  std::string m = rejection(s);
  EXPECT_TRUE(Mentions(m, "scale (1e+39) is outside what f32 represents"));
  s.scale = 3e38; // fits f32, but not once multiplied by log2(e)
  EXPECT_TRUE(Mentions(rejection(s), "scale (3e+38) is outside what f32 represents"));
  s.scale = 1e-50; // rounds to 0 in f32
  EXPECT_TRUE(Mentions(rejection(s), "scale (1e-50) is outside what f32 represents"));
  for (double ok : {1e30, 1e-30}) {
    s.scale = ok;
    EXPECT_TRUE(s.validate().is_ok()) << ok << ": " << s.validate().message();
  }
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

// FlashAttention's semantics: under causal the right window is 0, whatever is
// passed (issue 14: 36 of its sampled test cases were refused here). The mask
// is causal's; split_kv_test runs such a spec against the float64 reference.
TEST(Validate, AcceptsWindowRightWithCausalAsFlashAttentionDoes) {
  AttentionSpec s = valid_spec();
  s.causal = true;
  s.window.right = 5;
  EXPECT_TRUE(s.validate()) << s.validate().message();
  for (int64_t i = 0; i < s.seqlen_q; ++i)
    for (int64_t j = 0; j < s.seqlen_k; ++j)
      EXPECT_EQ(ir::visible(i, j, s.seqlen_q, s.seqlen_k, true, s.window),
                ir::visible(i, j, s.seqlen_q, s.seqlen_k, true, Window{}))
          << i << ", " << j;
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

// ---- kernel signatures ---------------------------------------------------------

TEST(Signature, RowAlignmentClasses) {
  // bf16: 16 bytes are 8 elements, 8 bytes are 4. Dense layouts of one head dim
  // share the class of that head dim.
  struct Row {
    int64_t d;
    int align;
  };
  for (Row r :
       {Row{64, 16}, Row{80, 16}, Row{8, 16}, Row{100, 8}, Row{36, 8}, Row{34, 2}, Row{1, 2}})
    for (Layout l : {Layout::bshd, Layout::bhsd, Layout::interleaved})
      for (DType t : {DType::bf16, DType::f16}) {
        AttentionSpec s = make_spec(2, 4, 2, 17, 29, r.d, r.d, t, l);
        EXPECT_EQ(s.signature().row_align, r.align)
            << "d=" << r.d << " " << layout_name(l) << " " << dtype_name(t);
      }
  // The narrowest tensor decides: padding one row stride by 4 or 1 elements.
  AttentionSpec s = make_spec(1, 2, 2, 8, 8, 64, 64, DType::bf16);
  s.o.seq += 4;
  s.o.batch = s.o.seq * s.seqlen_q;
  EXPECT_EQ(s.signature().row_align, 8);
  s.o.seq += 1;
  s.o.batch = s.o.seq * s.seqlen_q;
  EXPECT_EQ(s.signature().row_align, 2);
  // Batch and head strides count too.
  s = make_spec(2, 1, 1, 8, 8, 64, 64, DType::bf16);
  s.q.batch += 4;
  EXPECT_EQ(s.signature().row_align, 8);
  // Head dims differing between Q/K and V: V's decides.
  s = make_spec(1, 1, 1, 8, 8, 64, 36, DType::bf16);
  EXPECT_EQ(s.signature().row_align, 8);
}

TEST(Signature, HoldsWhatChangesTheCodeOnly) {
  AttentionSpec s = make_spec(1, 8, 2, 113, 203, 80, 80, DType::bf16);
  KernelSignature sig = s.signature();
  EXPECT_EQ(sig.dtype, DType::bf16);
  EXPECT_EQ(sig.head_dim_qk, 80);
  EXPECT_EQ(sig.head_dim_v, 80);
  EXPECT_FALSE(sig.causal || sig.local || sig.lse);
  EXPECT_EQ(sig.summary(), "bf16 d=80/80 align16");
  // Shapes, window sizes and the scale are run-time arguments.
  AttentionSpec other = make_spec(4, 2, 1, 7, 9000, 80, 80, DType::bf16, Layout::bhsd);
  other.scale = 0.01;
  EXPECT_EQ(other.signature(), sig);
  s.causal = true;
  s.window = Window{16, 0};
  s.lse = true;
  AttentionSpec wider = s;
  wider.window = Window{1000, 0};
  EXPECT_EQ(s.signature(), wider.signature());
  EXPECT_EQ(s.signature().summary(), "bf16 d=80/80 causal local lse align16");
  // One bounded side makes a window.
  s.window = Window{-1, 0};
  EXPECT_TRUE(s.signature().local);
  s.window = Window{};
  EXPECT_FALSE(s.signature().local);
  // A strided head dim.
  AttentionSpec t = make_spec(1, 1, 1, 8, 8, 16, 16, DType::f16);
  t.v = {.batch = 8 * 16, .head = 8 * 16, .seq = 1, .dim = 8};
  ASSERT_TRUE(t.validate()) << t.validate().message();
  sig = t.signature();
  EXPECT_TRUE(sig.unit_dim[0] && sig.unit_dim[1] && !sig.unit_dim[2] && sig.unit_dim[3]);
  EXPECT_EQ(sig.summary(), "f16 d=16/16 align2 v-dim-strided");
}

TEST(Signature, MatchesNamesTheDifferingField) {
  const AttentionSpec base = make_spec(1, 8, 2, 113, 203, 80, 80, DType::bf16);
  const KernelSignature kernel = base.signature();
  EXPECT_TRUE(base.matches(kernel).is_ok());
  AttentionSpec s = make_spec(2, 4, 4, 5, 5000, 80, 80, DType::bf16, Layout::interleaved);
  s.scale = 3;
  EXPECT_TRUE(s.matches(kernel).is_ok()) << s.matches(kernel).message();

  s = base;
  s.dtype = DType::f16;
  std::string m = s.matches(kernel).message();
  EXPECT_TRUE(Mentions(m, "this call's dtype (f16) differs from the kernel's (bf16)"));
  EXPECT_TRUE(Mentions(m, "a kernel serves one signature (bf16 d=80/80 align16); create another"));
  s = make_spec(1, 8, 2, 113, 203, 96, 80, DType::bf16);
  EXPECT_TRUE(
      Mentions(s.matches(kernel).message(), "head_dim_qk (96) differs from the kernel's (80)"));
  s = make_spec(1, 8, 2, 113, 203, 80, 64, DType::bf16);
  EXPECT_TRUE(
      Mentions(s.matches(kernel).message(), "head_dim_v (64) differs from the kernel's (80)"));
  s = base;
  s.causal = true;
  EXPECT_TRUE(
      Mentions(s.matches(kernel).message(), "causal (true) differs from the kernel's (false)"));
  s = base;
  s.window = Window{8, 8};
  EXPECT_TRUE(Mentions(s.matches(kernel).message(), "sliding window (on/off) (true)"));
  s = base;
  s.lse = true;
  EXPECT_TRUE(Mentions(s.matches(kernel).message(), "this call's lse (true)"));
  s = base;
  s.o.dim = 2; // every other element: rows of 160 elements hold 80
  s.o.seq *= 2;
  s.o.head *= 2;
  s.o.batch *= 2;
  ASSERT_TRUE(s.validate()) << s.validate().message();
  EXPECT_TRUE(Mentions(s.matches(kernel).message(), "o dim stride (1 or not) (not 1) differs from "
                                                    "the kernel's (1)"));

  // Alignment: a kernel for narrower rows serves wider ones, not the reverse.
  AttentionSpec narrow = base;
  narrow.q.seq += 4; // 8-byte rows
  narrow.q.batch = narrow.q.seq * narrow.seqlen_q;
  ASSERT_EQ(narrow.signature().row_align, 8);
  EXPECT_TRUE(base.matches(narrow.signature()).is_ok());
  m = narrow.matches(kernel).message();
  EXPECT_TRUE(Mentions(m, "row alignment in bytes (of the strides and head dims) (8) differs "
                          "from the kernel's (16)"));
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
