// verify(): a valid kernel passes; each broken rule is reported with the op's
// place, its name and the specific problem.
#include "ir/ir.h"

#include <gtest/gtest.h>

namespace flashjit::ir {
namespace {

// Shape-free like build_attention's output, with some constants mixed in. Op
// numbers (as the verifier counts them) are in the comments.
constexpr std::string_view kValid = R"(kernel @fa_fwd {
  scalars (%batches : i32, %heads : i32, %group : i32, %seqlen_q : i32, %seqlen_k : i32, %window_left : i32, %scale_log2 : f32, %q_batch_stride : i64, %q_seq_stride : i32, %kv_batch_stride : i64)
  tensor @Q : bf16 [batch = %batches, heads = %heads, seq = %seqlen_q, dim = 80] strides [batch = %q_batch_stride, heads = 80, seq = %q_seq_stride, dim = 1] align = 16
  tensor @K : bf16 [batch = %batches, heads = 2, seq = %seqlen_k, dim = 80] strides [batch = %kv_batch_stride, heads = 80, seq = 160, dim = 1] align = 16
  tensor @V : bf16 [batch = %batches, heads = 2, seq = %seqlen_k, dim = 80] strides [batch = %kv_batch_stride, heads = 80, seq = 160, dim = 1] align = 16
  tensor @O : bf16 [batch = %batches, heads = %heads, seq = %seqlen_q, dim = 80] strides [batch = 36160, heads = 80, seq = 320, dim = 1] align = 8
  tensor @LSE : f32 [batch = %batches, heads = %heads, seq = %seqlen_q, dim = 0] strides [batch = 452, heads = %seqlen_q, seq = 1, dim = 0] align = 4
  grid (%q_block : ceil(%seqlen_q / 64), %head : %heads, %batch : %batches) group = %group config {block_m = 64, block_n = 64}
  %q = load %q_block {tensor = @Q} : tile<64x80xbf16, #mma_a>                                     // 0
  %m0 = fill {value = -inf} : tile<64xf32, #rows>                                                 // 1
  %l0 = fill {value = 0.0} : tile<64xf32, #rows>                                                  // 2
  %acc0 = fill {value = 0.0} : tile<64x80xf32, #mma_acc>                                          // 3
  %m, %l, %acc = for %q_block, %m0, %l0, %acc0 {block_m = 64, block_n = 64, causal = 1, window_left = %window_left, window_right = 0} : tile<64xf32, #rows>, tile<64xf32, #rows>, tile<64x80xf32, #mma_acc> (%kb, %m_i, %l_i, %acc_i) {
    %k = load %kb {tensor = @K} : tile<64x80xbf16, #mma_b>                                        // 4.0
    %zero = fill {value = 0.0} : tile<64x64xf32, #mma_acc>                                        // 4.1
    %s = mma_abt %q, %k, %zero : tile<64x64xf32, #mma_acc>                                        // 4.2
    %s2 = scale %s {factor = %scale_log2} : tile<64x64xf32, #mma_acc>                             // 4.3
    %s3 = mask %s2, %q_block, %kb {causal = 1, window_left = %window_left, window_right = 0} : tile<64x64xf32, #mma_acc>
    %mx = row_max %s3 : tile<64xf32, #rows>                                                       // 4.5
    %m_new = max %m_i, %mx : tile<64xf32, #rows>                                                  // 4.6
    %m_safe = zero_if_neg_inf %m_new : tile<64xf32, #rows>                                        // 4.7
    %d = sub_row %s3, %m_safe : tile<64x64xf32, #mma_acc>                                         // 4.8
    %p = exp2 %d : tile<64x64xf32, #mma_acc>                                                      // 4.9
    %dm = sub %m_i, %m_safe : tile<64xf32, #rows>                                                 // 4.10
    %alpha = exp2 %dm : tile<64xf32, #rows>                                                       // 4.11
    %la = mul %l_i, %alpha : tile<64xf32, #rows>                                                  // 4.12
    %ps = row_sum %p : tile<64xf32, #rows>                                                        // 4.13
    %l_new = add %la, %ps : tile<64xf32, #rows>                                                   // 4.14
    %acc_s = mul_row %acc_i, %alpha : tile<64x80xf32, #mma_acc>                                   // 4.15
    %p16 = convert %p : tile<64x64xbf16, #mma_acc>                                                // 4.16
    %pa = convert_layout %p16 : tile<64x64xbf16, #mma_a>                                          // 4.17
    %v = load %kb {tensor = @V} : tile<64x80xbf16, #mma_b>                                        // 4.18
    %acc_new = mma_ab %pa, %v, %acc_s : tile<64x80xf32, #mma_acc>                                 // 4.19
    yield %m_new, %l_new, %acc_new                                                                // 4.20
  }
  %o32 = div_row %acc, %l : tile<64x80xf32, #mma_acc>                                             // 5
  %o = convert %o32 : tile<64x80xbf16, #mma_acc>                                                  // 6
  store %o, %q_block {tensor = @O}                                                                // 7
  %log_l = log2 %l : tile<64xf32, #rows>                                                          // 8
  %lse = add %log_l, %m : tile<64xf32, #rows>                                                     // 9
  store %lse, %q_block {tensor = @LSE}                                                            // 10
}
)";

Program valid() {
  Expected<Program> p = parse(kValid);
  EXPECT_TRUE(p) << p.status().message();
  return p ? p.take() : Program{};
}

/// verify()'s message for `p`, or "ok".
std::string message(const Program &p) {
  Status s = verify(p);
  return s ? "ok" : s.message();
}

struct Edit {
  std::string_view from, to;
};

/// The message for the valid kernel with each edit's one occurrence of `from` replaced by `to`.
std::string rejection(std::initializer_list<Edit> edits) {
  std::string text(kValid);
  for (const Edit &e : edits) {
    size_t at = text.find(e.from);
    if (at == std::string::npos || text.find(e.from, at + 1) != std::string::npos)
      return fmt::format("test bug: '{}' does not occur exactly once", e.from);
    text.replace(at, e.from.size(), e.to);
  }
  Expected<Program> p = parse(text);
  if (!p)
    return "test bug: the variant does not parse: " + p.status().message();
  return message(*p);
}
std::string rejection(std::string_view from, std::string_view to) {
  return rejection({Edit{from, to}});
}

testing::AssertionResult has(const std::string &message, std::string_view part) {
  if (message.find(part) != std::string::npos)
    return testing::AssertionSuccess();
  return testing::AssertionFailure() << "message:  " << message << "\nlacks:    " << part;
}

/// The first op in `body` (searching loop bodies) whose result is named `name`.
Op *find_op(std::vector<Op> &body, const Program &p, std::string_view name) {
  for (Op &op : body) {
    for (ValueId r : op.results)
      if (p.values[r].name == name)
        return &op;
    if (Op *inner = find_op(op.body, p, name))
      return inner;
  }
  return nullptr;
}

TEST(Verifier, AcceptsValidKernel) { EXPECT_EQ(message(valid()), "ok"); }

TEST(Verifier, AcceptsBlockedTilesAndRoundTrippedText) {
  Program p = valid();
  EXPECT_EQ(message(*parse(print(p))), "ok");
  std::string text = R"(kernel @k {
  tensor @Q : f16 [batch = 1, heads = 1, seq = 8, dim = 16] strides [batch = 128, heads = 16, seq = 16, dim = 1] align = 16
  tensor @K : f16 [batch = 1, heads = 1, seq = 8, dim = 16] strides [batch = 128, heads = 16, seq = 16, dim = 1] align = 16
  tensor @V : f16 [batch = 1, heads = 1, seq = 8, dim = 16] strides [batch = 128, heads = 16, seq = 16, dim = 1] align = 16
  tensor @O : f16 [batch = 1, heads = 1, seq = 8, dim = 16] strides [batch = 128, heads = 16, seq = 16, dim = 1] align = 16
  grid (%0 : 1, %1 : 1, %2 : 1) group = 1
  %3 = load %0 {tensor = @Q} : tile<8x16xf16, #blocked>
  %4 = convert %3 : tile<8x16xf32, #blocked>
  %5 = row_max %4 : tile<8xf32, #blocked>
  %6 = sub_row %4, %5 : tile<8x16xf32, #blocked>
  %7 = convert %6 : tile<8x16xf16, #blocked>
  store %7, %0 {tensor = @O}
}
)";
  Expected<Program> blocked = parse(text);
  ASSERT_TRUE(blocked) << blocked.status().message();
  EXPECT_EQ(message(*blocked), "ok");
}

// ---- mma ------------------------------------------------------------------------------

TEST(Verifier, MmaOperandLayout) {
  std::string m = rejection("%k = load %kb {tensor = @K} : tile<64x80xbf16, #mma_b>",
                            "%k = load %kb {tensor = @K} : tile<64x80xbf16, #mma_acc>");
  EXPECT_TRUE(has(m, "op #4.2 `mma_abt`: operand 1 has layout #mma_acc, expected #mma_b (%k : "
                     "tile<64x80xbf16, #mma_acc>)"));
}

TEST(Verifier, MmaAbtReductionDimension) {
  // K (one row per key) must share Q's head dim: NxK with K = 80.
  std::string m = rejection("%k = load %kb {tensor = @K} : tile<64x80xbf16",
                            "%k = load %kb {tensor = @K} : tile<64x96xbf16");
  EXPECT_TRUE(has(m, "op #4.2 `mma_abt`: operand 1 has shape 64x96, expected 64x80 (N x K, K = "
                     "80 from operand 0)"));
}

TEST(Verifier, MmaAbTakesBAsKxN) {
  // P (64x64) times V: V's rows are the 64 keys, its columns the 80 output dims.
  std::string m = rejection("%v = load %kb {tensor = @V} : tile<64x80xbf16",
                            "%v = load %kb {tensor = @V} : tile<32x80xbf16");
  EXPECT_TRUE(has(m, "op #4.19 `mma_ab`: operand 1 has shape 32x80, expected 64x80 (K x N"));
}

TEST(Verifier, MmaAccumulatorShapeAndDtype) {
  std::string m = rejection("%zero = fill {value = 0.0} : tile<64x64xf32",
                            "%zero = fill {value = 0.0} : tile<64x32xf32");
  EXPECT_TRUE(has(m, "op #4.2 `mma_abt`: operand 2 has shape 64x32, expected 64x64 (M x N"));
  m = rejection("%zero = fill {value = 0.0} : tile<64x64xf32, #mma_acc>",
                "%zero = fill {value = 0.0} : tile<64x64xbf16, #mma_acc>");
  EXPECT_TRUE(has(m, "op #4.2 `mma_abt`: operand 2 has dtype bf16, expected f32"));
}

TEST(Verifier, MmaOperandDtypes) {
  std::string m = rejection({{"tensor @K : bf16", "tensor @K : f16"},
                             {"%k = load %kb {tensor = @K} : tile<64x80xbf16",
                              "%k = load %kb {tensor = @K} : tile<64x80xf16"}});
  EXPECT_TRUE(has(m, "op #4.2 `mma_abt`: operand 1 has dtype f16, expected bf16 (%k : "
                     "tile<64x80xf16, #mma_b>)"));
  m = rejection({{"tensor @Q : bf16", "tensor @Q : f32"},
                 {"%q = load %q_block {tensor = @Q} : tile<64x80xbf16",
                  "%q = load %q_block {tensor = @Q} : tile<64x80xf32"}});
  EXPECT_TRUE(has(m, "op #4.2 `mma_abt`: operand 0 has dtype f32, expected bf16 or f16"));
}

TEST(Verifier, MmaResultMustMatchAccumulator) {
  std::string m = rejection("%s = mma_abt %q, %k, %zero : tile<64x64xf32, #mma_acc>",
                            "%s = mma_abt %q, %k, %zero : tile<64x64xf32, #blocked>");
  EXPECT_TRUE(has(m, "op #4.2 `mma_abt`: result 0 (%s) has type tile<64x64xf32, #blocked>, "
                     "expected tile<64x64xf32, #mma_acc> (the accumulator's type)"));
}

// ---- load, store, fill ------------------------------------------------------------------

TEST(Verifier, LoadUnknownTensor) {
  std::string m = rejection("{tensor = @K}", "{tensor = @Kv}");
  EXPECT_TRUE(has(m, "op #4.0 `load`: attr `tensor` names @Kv, which is not a tensor of the "
                     "kernel (tensors: @Q, @K, @V, @O, @LSE)"));
}

TEST(Verifier, LoadDtypeAndColumns) {
  std::string m = rejection("%q = load %q_block {tensor = @Q} : tile<64x80xbf16",
                            "%q = load %q_block {tensor = @Q} : tile<64x80xf16");
  EXPECT_TRUE(has(m, "op #0 `load`: result 0 has dtype f16, but @Q is bf16"));
  m = rejection("%q = load %q_block {tensor = @Q} : tile<64x80xbf16",
                "%q = load %q_block {tensor = @Q} : tile<64x64xbf16");
  EXPECT_TRUE(has(m, "op #0 `load`: result 0 has 64 columns, fewer than the dim = 80 of @Q"));
  // Padding beyond the head dim is allowed (all through the kernel).
  EXPECT_EQ(rejection("tile<64x80xbf16, #mma_a>", "tile<64x96xbf16, #mma_a>"),
            "op #4.2 `mma_abt`: operand 1 has shape 64x80, expected 64x96 (N x K, K = 96 from "
            "operand 0) (%k : tile<64x80xbf16, #mma_b>)");
}

TEST(Verifier, LoadNeedsIndexOperand) {
  std::string m = rejection("%k = load %kb", "%k = load %m_i");
  EXPECT_TRUE(has(m, "op #4.0 `load`: operand 0 has type tile<64xf32, #rows>, expected index"));
}

TEST(Verifier, StoreVectorNeedsVectorTensor) {
  std::string m =
      rejection("store %lse, %q_block {tensor = @LSE}", "store %lse, %q_block {tensor = @O}");
  EXPECT_TRUE(has(m, "op #10 `store`: stores a vector to @O, which has dim = 80; a vector goes to "
                     "a tensor with dim = 0"));
  m = rejection("tensor @LSE : f32", "tensor @LSE : bf16");
  EXPECT_TRUE(has(m, "op #10 `store`: stores a vector to @LSE, which is bf16, expected an f32 "
                     "tensor"));
}

TEST(Verifier, StoreMatrixChecks) {
  std::string m =
      rejection("store %o, %q_block {tensor = @O}", "store %o32, %q_block {tensor = @O}");
  EXPECT_TRUE(has(m, "op #7 `store`: operand 0 has dtype f32, but @O is bf16"));
  m = rejection("store %o, %q_block {tensor = @O}", "store %o, %q_block {tensor = @LSE}");
  EXPECT_TRUE(has(m, "op #7 `store`: stores a 2D tile to @LSE, which has dim = 0"));
  m = rejection("tensor @O : bf16 [batch = %batches, heads = %heads, seq = %seqlen_q, dim = 80]",
                "tensor @O : bf16 [batch = %batches, heads = %heads, seq = %seqlen_q, dim = 96]");
  EXPECT_TRUE(has(m, "op #7 `store`: operand 0 has 80 columns, fewer than the dim = 96 of @O"));
  m = rejection("store %o, %q_block {tensor = @O}", "store %o, %o {tensor = @O}");
  EXPECT_TRUE(has(m, "op #7 `store`: operand 1 has type tile<64x80xbf16, #mma_acc>, expected "
                     "index"));
}

TEST(Verifier, FillNeedsFloatValue) {
  std::string m = rejection("%l0 = fill {value = 0.0}", "%l0 = fill {value = 0}");
  EXPECT_TRUE(has(m, "op #2 `fill`: attr `value` is an integer, expected a float"));
  m = rejection("%l0 = fill {value = 0.0}", "%l0 = fill");
  EXPECT_TRUE(has(m, "op #2 `fill`: missing attr `value` (a float)"));
}

// ---- elementwise and row ops ----------------------------------------------------------------

TEST(Verifier, ScaleNeedsFactorAndKeepsType) {
  std::string m = rejection("{factor = %scale_log2}", "{scale = %scale_log2}");
  EXPECT_TRUE(has(m, "op #4.3 `scale`: missing attr `factor`"));
  m = rejection("%s2 = scale %s {factor = %scale_log2} : tile<64x64xf32",
                "%s2 = scale %s {factor = %scale_log2} : tile<64x64xbf16");
  EXPECT_TRUE(has(m, "op #4.3 `scale`: result 0 (%s2) has type tile<64x64xbf16, #mma_acc>, "
                     "expected tile<64x64xf32, #mma_acc>"));
}

TEST(Verifier, MaskOperandsAndAttrs) {
  std::string m = rejection("mask %s2, %q_block, %kb", "mask %s2, %q_block, %m_i");
  EXPECT_TRUE(has(m, "op #4.4 `mask`: operand 2 has type tile<64xf32, #rows>, expected index"));
  m = rejection("{causal = 1, window_left = %window_left, window_right = 0}",
                "{window_left = %window_left, window_right = 0}");
  EXPECT_TRUE(has(m, "op #4.4 `mask`: missing attr `causal` (an integer)"));
  m = rejection("{causal = 1, window_left = %window_left, window_right = 0}",
                "{causal = %group, window_left = %window_left, window_right = 0}");
  EXPECT_TRUE(has(m, "op #4.4 `mask`: attr `causal` is a scalar parameter, expected an integer"));
  Program p = valid();
  p.body[4].body[4].operands[0] = find_op(p.body, p, "mx")->results[0]; // defined by op 4.5
  EXPECT_TRUE(has(message(p), "op #4.4 `mask`: operand 0 (%mx) is not in scope here: it is "
                              "defined by op #4.5 `row_max`, which comes later"));
}

TEST(Verifier, RowReductionResult) {
  std::string m = rejection("%mx = row_max %s3 : tile<64xf32, #rows>",
                            "%mx = row_max %s3 : tile<64xf32, #blocked>");
  EXPECT_TRUE(has(m, "op #4.5 `row_max`: result 0 (%mx) has type tile<64xf32, #blocked>, "
                     "expected tile<64xf32, #rows> (one f32 per row of operand 0, #rows for a "
                     "#mma_acc tile)"));
  m = rejection("%ps = row_sum %p : tile<64xf32, #rows>",
                "%ps = row_sum %alpha : tile<64xf32, #rows>");
  EXPECT_TRUE(has(m, "op #4.13 `row_sum`: operand 0 is a vector, expected a 2D tile (%alpha"));
  m = rejection("%mx = row_max %s3", "%mx = row_max %q");
  EXPECT_TRUE(has(m, "op #4.5 `row_max`: operand 0 has dtype bf16, expected f32"));
}

TEST(Verifier, ElementwiseOperandsMatch) {
  std::string m = rejection("%la = mul %l_i, %alpha", "%la = mul %l_i, %d");
  EXPECT_TRUE(has(m, "op #4.12 `mul`: operand 1 (%d) has type tile<64x64xf32, #mma_acc>, "
                     "expected tile<64xf32, #rows> (the type of operand 0)"));
  m = rejection("%l_new = add %la, %ps : tile<64xf32, #rows>",
                "%l_new = add %la, %ps : tile<64xf32, #blocked>");
  EXPECT_TRUE(has(m, "op #4.14 `add`: result 0 (%l_new) has type tile<64xf32, #blocked>"));
}

TEST(Verifier, RunningMaxNeedsASlackInRange) {
  const std::string_view max = "%m_new = max %m_i, %mx : tile<64xf32, #rows>";
  EXPECT_EQ(rejection(max, "%m_new = running_max %m_i, %mx {slack = 8.0} : tile<64xf32, #rows>"),
            "ok");
  EXPECT_TRUE(has(rejection(max, "%m_new = running_max %m_i, %mx : tile<64xf32, #rows>"),
                  "op #4.6 `running_max`: missing attr `slack`"));
  for (const char *bad : {"-1.0", "65.0"})
    EXPECT_TRUE(has(rejection(max, fmt::format("%m_new = running_max %m_i, %mx {{slack = {}}} : "
                                               "tile<64xf32, #rows>",
                                               bad)),
                    "attr `slack` ("))
        << bad;
  EXPECT_TRUE(has(rejection(max, "%m_new = running_max %m_i, %s3 {slack = 8.0} : tile<64xf32, "
                                 "#rows>"),
                  "op #4.6 `running_max`: operand 1 (%s3)"));
}

TEST(Verifier, Exp2NeedsF32) {
  Program p = valid();
  Op *pe = find_op(p.body, p, "p");
  ValueId p16 = find_op(p.body, p, "p16")->results[0];
  pe->operands[0] = p16; // defined later in the body
  EXPECT_TRUE(has(message(p), "op #4.9 `exp2`: operand 0 (%p16) is not in scope here: it is "
                              "defined by op #4.16 `convert`"));
  std::string m = rejection("%log_l = log2 %l", "%log_l = log2 %o");
  EXPECT_TRUE(has(m, "op #8 `log2`: operand 0 has dtype bf16, expected f32"));
}

TEST(Verifier, RowBroadcastOperand) {
  std::string m = rejection("%d = sub_row %s3, %m_safe", "%d = sub_row %s3, %s2");
  EXPECT_TRUE(has(m, "op #4.8 `sub_row`: operand 1 is a 2D tile, expected a vector"));
  // A #mma_acc tile's rows come as #rows vectors, not #blocked ones.
  m = rejection({{"%dm = sub %m_i, %m_safe : tile<64xf32, #rows>",
                  "%dm = fill {value = 1.0} : tile<64xf32, #blocked>"},
                 {"%la = mul %l_i, %alpha", "%la = mul %l_i, %l_i"}});
  EXPECT_TRUE(has(m, "op #4.11 `exp2`: result 0 (%alpha) has type tile<64xf32, #rows>"));
  m = rejection(
      {{"%dm = sub %m_i, %m_safe : tile<64xf32, #rows>",
        "%dm = fill {value = 1.0} : tile<64xf32, #blocked>"},
       {"%alpha = exp2 %dm : tile<64xf32, #rows>", "%alpha = exp2 %dm : tile<64xf32, #blocked>"},
       {"%la = mul %l_i, %alpha", "%la = mul %l_i, %l_i"}});
  EXPECT_TRUE(has(m, "op #4.15 `mul_row`: operand 1 has layout #blocked, expected #rows (%alpha : "
                     "tile<64xf32, #blocked>)"));
}

TEST(Verifier, DivRowRowsMustMatch) {
  Program p = valid();
  ValueId r = p.add_value(Type::vec(32, DType::f32), "r32");
  p.body.insert(p.body.begin() + 5, Op{OpKind::Fill, {r}, {}, {{"value", 1.0}}, {}, {}});
  p.body[6].operands[1] = r; // div_row %acc, %r32
  EXPECT_TRUE(has(message(p), "op #6 `div_row`: operand 1 has 32 rows, expected 64 (the rows of "
                              "operand 0)"));
}

TEST(Verifier, ConvertKeepsShapeAndLayout) {
  std::string m = rejection("%p16 = convert %p : tile<64x64xbf16, #mma_acc>",
                            "%p16 = convert %p : tile<64x64xbf16, #mma_a>");
  EXPECT_TRUE(has(m, "op #4.16 `convert`: result 0 (%p16) has type tile<64x64xbf16, #mma_a>, "
                     "expected tile<64x64xbf16, #mma_acc> (convert keeps shape and layout"));
}

TEST(Verifier, ConvertLayoutChangesOnlyTheLayout) {
  std::string m = rejection("%pa = convert_layout %p16 : tile<64x64xbf16, #mma_a>",
                            "%pa = convert_layout %p16 : tile<64x64xbf16, #mma_acc>");
  EXPECT_TRUE(has(m, "op #4.17 `convert_layout`: converts to the layout it already has "
                     "(#mma_acc)"));
  m = rejection("%pa = convert_layout %p16 : tile<64x64xbf16, #mma_a>",
                "%pa = convert_layout %p16 : tile<64x64xf16, #mma_a>");
  EXPECT_TRUE(has(m, "op #4.17 `convert_layout`: result 0 (%pa) has type tile<64x64xf16, "
                     "#mma_a>, expected tile<64x64xbf16, #mma_a>"));
}

// ---- for and yield --------------------------------------------------------------------

TEST(Verifier, ForAttrs) {
  std::string m =
      rejection("{block_m = 64, block_n = 64, causal = 1,", "{block_m = 64, causal = 1,");
  EXPECT_TRUE(has(m, "op #4 `for`: missing attr `block_n` (an integer)"));
}

TEST(Verifier, ForOperandZeroIsTheQBlock) {
  std::string m = rejection("for %q_block, %m0", "for %m0, %m0");
  // The parser checks only counts: the for now has 4 operands and 3 results.
  EXPECT_TRUE(has(m, "op #4 `for`: operand 0 has type tile<64xf32, #rows>, expected index"));
}

TEST(Verifier, ForRegionArgumentTypes) {
  Program p = valid();
  p.values[p.body[4].region_args[3]].type = Type::tile(64, 80, DType::f32, TileLayout::blocked);
  EXPECT_TRUE(has(message(p), "op #4 `for`: region argument 3 (%acc_i) has type tile<64x80xf32, "
                              "#blocked>, expected tile<64x80xf32, #mma_acc>"));
  Program q = valid();
  q.body[4].region_args.pop_back();
  EXPECT_TRUE(has(message(q), "op #4 `for`: has 3 region arguments, expected 4"));
}

TEST(Verifier, YieldTypesMatchResults) {
  std::string m = rejection("yield %m_new, %l_new, %acc_new", "yield %m_new, %acc_new, %l_new");
  EXPECT_TRUE(has(m, "op #4.20 `yield`: operand 1 (%acc_new) has type tile<64x80xf32, "
                     "#mma_acc>, expected tile<64xf32, #rows> (the type of result 1 of the for)"));
  m = rejection("yield %m_new, %l_new, %acc_new", "yield %m_new, %l_new");
  EXPECT_TRUE(has(m, "op #4.20 `yield`: yields 2 values, but the enclosing for has 3 results"));
}

TEST(Verifier, YieldPlacement) {
  Program p = valid();
  std::vector<Op> &body = p.body[4].body;
  std::swap(body[19], body[20]); // yield before the last mma
  EXPECT_TRUE(has(message(p), "op #4 `for`: body must end with `yield`"));
  Program q = valid();
  q.body[4].body.insert(q.body[4].body.begin() + 3, q.body[4].body.back());
  EXPECT_TRUE(has(message(q), "op #4.3 `yield`: `yield` must be the last op of the for body, but "
                              "18 more follow"));
  Program r = valid();
  r.body.push_back(Op{OpKind::Yield, {}, {}, {}, {}, {}});
  EXPECT_TRUE(has(message(r), "op #11 `yield`: `yield` outside a for body"));
}

// ---- scoping, counts, program structure ----------------------------------------------------

TEST(Verifier, LoopBodyValuesAreNotVisibleAfterTheLoop) {
  Program p = valid();
  ValueId mx = find_op(p.body, p, "mx")->results[0];
  p.body[8].operands[0] = mx; // log2 %mx after the loop
  EXPECT_TRUE(has(message(p), "op #8 `log2`: operand 0 (%mx) is not in scope here: it is defined "
                              "by op #4.5 `row_max`"));
  Program q = valid();
  q.body[8].operands[0] = q.body[4].region_args[2]; // %l_i after the loop
  EXPECT_TRUE(has(message(q), "op #8 `log2`: operand 0 (%l_i) is not in scope here: it is "
                              "defined by op #4 `for` (region argument)"));
}

TEST(Verifier, UndefinedAndMissingValues) {
  Program p = valid();
  ValueId orphan = p.add_value(Type::vec(64, DType::f32), "orphan");
  p.body[8].operands[0] = orphan;
  EXPECT_TRUE(has(message(p), "op #8 `log2`: operand 0 (%?orphan) is never defined"));
  p.body[8].operands[0] = 999;
  EXPECT_TRUE(has(message(p), "op #8 `log2`: operand 0 refers to value 999, which does not exist"));
}

TEST(Verifier, OperandAndResultCounts) {
  Program p = valid();
  p.body[8].operands.push_back(p.body[8].operands[0]);
  EXPECT_TRUE(has(message(p), "op #8 `log2`: has 2 operands, expected 1"));
  Program q = valid();
  q.body[7].results.push_back(q.add_value(Type::vec(64, DType::f32), "extra"));
  EXPECT_TRUE(has(message(q), "op #7 `store`: has 1 results, expected 0"));
  Program r = valid();
  r.body[4].results.pop_back();
  EXPECT_TRUE(has(message(r), "op #4 `for`: has 2 results, expected 3 (one per initial value)"));
}

TEST(Verifier, ValueDefinedTwice) {
  Program p = valid();
  p.body[2].results[0] = p.body[1].results[0];
  EXPECT_TRUE(has(message(p), "op #2 `fill`: redefines %m0, already defined by op #1 `fill`"));
}

TEST(Verifier, OnlyForHasARegion) {
  Program p = valid();
  p.body[5].body.push_back(p.body[4].body.back());
  EXPECT_TRUE(has(message(p), "op #5 `div_row`: has a region, but only `for` has one"));
}

TEST(Verifier, GridAndTensors) {
  Program p = valid();
  p.grid.pop_back();
  EXPECT_TRUE(has(message(p), "the grid has 2 arguments, expected 3 (q block, head, batch)"));
  Program q = valid();
  q.values[q.grid_arg(1)].type = Type::vec(64, DType::f32);
  EXPECT_TRUE(has(message(q), "grid argument 1 (%head) has type tile<64xf32, #rows>, expected "
                              "index"));
  std::string m =
      rejection("  tensor @V : bf16 [batch = %batches, heads = 2, seq = %seqlen_k, dim = 80] "
                "strides [batch = %kv_batch_stride, heads = 80, seq = 160, dim = 1] align = 16\n",
                "");
  EXPECT_TRUE(has(m, "missing tensor @V (a kernel needs @Q, @K and @V)"));
  Program r = valid();
  r.tensors.push_back(r.tensors[0]);
  EXPECT_TRUE(has(message(r), "tensor @Q is declared twice"));
}

// ---- scalar parameters, extents and the config ---------------------------------------

TEST(Verifier, ScaleFactorReadsAnF32Scalar) {
  // The kernel multiplies scores by the factor in f32: an integer parameter is refused.
  std::string m = rejection("{factor = %scale_log2}", "{factor = %seqlen_q}");
  EXPECT_TRUE(has(m, "op #4.3 `scale`: attr `factor` reads %seqlen_q of type i32, expected f32"));
  m = rejection("{factor = %scale_log2}", "{factor = %q_batch_stride}");
  EXPECT_TRUE(has(m, "op #4.3 `scale`: attr `factor` reads %q_batch_stride of type i64, "
                     "expected f32"));
  // A constant factor still works; an integer constant is not a float.
  EXPECT_EQ(rejection("{factor = %scale_log2}", "{factor = 0.16129870323320085}"), "ok");
  m = rejection("{factor = %scale_log2}", "{factor = 1}");
  EXPECT_TRUE(has(m, "op #4.3 `scale`: attr `factor` is an integer, expected a float or a scalar "
                     "parameter"));
  // The parser refuses an undeclared parameter; a program built in memory can still hold one.
  Program p = valid();
  find_op(p.body, p, "s2")->attrs["factor"] = ParamRef{"nope"};
  EXPECT_TRUE(has(message(p), "op #4.3 `scale`: attr `factor` reads %nope, which is not a scalar "
                              "parameter of the kernel"));
}

TEST(Verifier, WindowAttrsAreOptionalIntegers) {
  // Absent on both ops: unbounded on both sides.
  EXPECT_EQ(
      rejection({{"causal = 1, window_left = %window_left, window_right = 0} : tile<64xf32",
                  "causal = 1} : tile<64xf32"},
                 {"{causal = 1, window_left = %window_left, window_right = 0}", "{causal = 1}"}}),
      "ok");
  std::string m = rejection("{causal = 1, window_left = %window_left, window_right = 0}",
                            "{causal = 1, window_left = %scale_log2, window_right = 0}");
  EXPECT_TRUE(has(m, "op #4.4 `mask`: attr `window_left` reads %scale_log2 of type f32, expected "
                     "an integer type"));
  m = rejection("{causal = 1, window_left = %window_left, window_right = 0}",
                "{causal = 1, window_left = %window_left, window_right = 0.5}");
  EXPECT_TRUE(has(m, "op #4.4 `mask`: attr `window_right` is a float, expected an integer or a "
                     "scalar parameter"));
  m = rejection("causal = 1, window_left = %window_left, window_right = 0} : tile<64xf32",
                "causal = 1, window_left = %window_left, window_right = %scale_log2} : "
                "tile<64xf32");
  EXPECT_TRUE(has(m, "op #4 `for`: attr `window_right` reads %scale_log2 of type f32"));
  // An i64 parameter is an integer too.
  EXPECT_EQ(rejection("{causal = 1, window_left = %window_left, window_right = 0}",
                      "{causal = 1, window_left = %kv_batch_stride, window_right = 0}"),
            "ok");
}

TEST(Verifier, ExtentsReadIntegerScalars) {
  std::string m = rejection("strides [batch = %q_batch_stride,", "strides [batch = %scale_log2,");
  EXPECT_TRUE(has(m, "tensor @Q's batch stride reads %scale_log2 of type f32, expected an "
                     "integer parameter"));
  m = rejection("%head : %heads", "%head : %scale_log2");
  EXPECT_TRUE(has(m, "grid extent 1 reads %scale_log2 of type f32, expected an integer "
                     "parameter"));
  m = rejection("ceil(%seqlen_q / 64)", "ceil(%scale_log2 / 64)");
  EXPECT_TRUE(has(m, "grid extent 0 reads %scale_log2 of type f32"));
  m = rejection("group = %group", "group = %scale_log2");
  EXPECT_TRUE(has(m, "group reads %scale_log2 of type f32, expected an integer parameter"));
  Program p = valid();
  p.tensors[0].seq = Extent::of("scale_log2");
  EXPECT_TRUE(has(message(p), "tensor @Q's seq reads %scale_log2 of type f32"));
  // i64 parameters are integers.
  EXPECT_EQ(rejection("%head : %heads", "%head : %kv_batch_stride"), "ok");
  // Names the parser would refuse, in a program built in memory.
  Program q = valid();
  q.tensors[1].stride_batch = Extent::of("nope");
  EXPECT_TRUE(has(message(q), "tensor @K's batch stride reads %nope, which is not a scalar "
                              "parameter of the kernel"));
  Program r = valid();
  r.grid[2].extent = Extent::of("nope");
  EXPECT_TRUE(has(message(r), "grid extent 2 reads %nope, which is not a scalar parameter"));
}

TEST(Verifier, ConstantExtentsAndAlignment) {
  Program p = valid();
  p.tensors[1].heads = Extent::constant(0);
  EXPECT_TRUE(has(message(p), "tensor @K's heads is 0, expected a positive size"));
  p = valid();
  p.tensors[1].stride_seq = Extent::constant(-160);
  EXPECT_TRUE(has(message(p), "tensor @K's seq stride is -160, expected at least 0"));
  p = valid();
  p.tensors[1].stride_batch = Extent::constant(0); // a broadcast batch: fine
  EXPECT_EQ(message(p), "ok");
  p.tensors[0].dim = -1;
  EXPECT_TRUE(has(message(p), "tensor @Q has dim = -1"));
  p = valid();
  p.grid[0].divisor = 0;
  EXPECT_TRUE(has(message(p), "grid extent 0 divides by 0, expected a positive divisor"));
  p = valid();
  p.grid[2].extent = Extent::constant(0);
  EXPECT_TRUE(has(message(p), "grid extent 2 is 0, expected a positive size"));
  p = valid();
  p.group = Extent::constant(0);
  EXPECT_TRUE(has(message(p), "group is 0, expected a positive size"));
  std::string m = rejection("align = 8", "align = 12");
  EXPECT_TRUE(has(m, "tensor @O has align = 12, expected 2, 4, 8 or 16 (bytes)"));
}

TEST(Verifier, ScalarNames) {
  // Scalars and values become identifiers of one generated function.
  std::string m = rejection("%scale_log2 : f32,", "%scale_log2 : f32, %m_i : i32,");
  EXPECT_TRUE(has(m, "scalar parameter %m_i has the name of a value; rename one"));
  m = rejection("%scale_log2 : f32,", "%scale_log2 : f32, %head : i32,");
  EXPECT_TRUE(has(m, "scalar parameter %head has the name of a value"));
  // Names as printed: the second value named `x` prints (and is emitted) as %x_1.
  Program p = valid();
  const Type row = Type::vec(64, DType::f32);
  const ValueId x = p.add_value(row, "x"), x2 = p.add_value(row, "x");
  p.body.push_back(Op{OpKind::Fill, {x}, {}, {{"value", 1.0}}, {}, {}});
  p.body.push_back(Op{OpKind::Fill, {x2}, {}, {{"value", 1.0}}, {}, {}});
  EXPECT_EQ(message(p), "ok");
  p.scalars.push_back({"x_1", ScalarType::i32});
  EXPECT_TRUE(has(message(p), "scalar parameter %x_1 has the name of a value"));
  Program q = valid();
  q.scalars.push_back({"heads", ScalarType::i64});
  EXPECT_TRUE(has(message(q), "scalar parameter %heads is declared twice"));
  Program r = valid();
  r.scalars[0].name = "batch.count";
  EXPECT_TRUE(has(message(r), "scalar parameter 0 has name 'batch.count', which is not a C "
                              "identifier"));
  r.scalars[0].name = "";
  EXPECT_TRUE(has(message(r), "scalar parameter 0 has name '', which is not a C identifier"));
}

TEST(Verifier, ConfigValuesAreIntegers) {
  // Issue 18, finding 15: the lowering reads config values with std::get<int64_t>, so a
  // float one that passed the verifier threw std::bad_variant_access there.
  std::string m =
      rejection("config {block_m = 64, block_n = 64}", "config {block_m = 64.0, block_n = 64}");
  EXPECT_TRUE(has(m, "config block_m is a float, expected an integer"));
  m = rejection("config {block_m = 64, block_n = 64}",
                "config {block_m = 64, block_n = %seqlen_k}");
  EXPECT_TRUE(has(m, "config block_n is a scalar parameter, expected an integer"));
  m = rejection("config {block_m = 64, block_n = 64}", "config {block_m = 64, block_n = @Q}");
  EXPECT_TRUE(has(m, "config block_n is a symbol, expected an integer"));
  EXPECT_EQ(rejection(" config {block_m = 64, block_n = 64}", ""), "ok");
}

TEST(Verifier, FuzzConfigKnobsAreKnownAndInRange) {
  // Found by tests/fuzz/fuzz_ir_text: a config whose block sizes were misspelt
  // (`block_nblock_m = 43, block_c = 64`) verified, and the lowering, reading
  // neither, divided by a block size of 0. Every knob must be one of ir::Config's,
  // in the range ir::validate(Config) accepts.
  const std::string good = "config {block_m = 64, block_n = 64}";
  std::string m = rejection(good, "config {block_nblock_m = 43, block_c = 64}");
  EXPECT_TRUE(has(m, "config block_c is not a knob of the kernels (block_m, block_n, waves, "
                     "stages, q_in_lds, pad_k, mma_m, dkdv_passes, persistent, prefetch_blocks)"))
      << m;
  m = rejection(good, "config {block_m = 0, block_n = 64}");
  EXPECT_TRUE(has(m, "config block_m = 0 is out of range: expected 1..4096")) << m;
  m = rejection(good, "config {block_m = 64, block_n = -64}");
  EXPECT_TRUE(has(m, "config block_n = -64 is out of range")) << m;
  m = rejection(good, "config {block_m = 64, block_n = 64, waves = 100000}");
  EXPECT_TRUE(has(m, "config waves = 100000 is out of range")) << m;
  m = rejection(good, "config {block_m = 64, block_n = 64, stages = 4}");
  EXPECT_TRUE(has(m, "config stages = 4 is not a pipeline the kernels have")) << m;
  m = rejection(good, "config {block_m = 64, block_n = 64, mma_m = 8}");
  EXPECT_TRUE(has(m, "config mma_m = 8 is not a matrix-instruction tile")) << m;
  m = rejection(good, "config {block_m = 64, block_n = 64, q_in_lds = 2}");
  EXPECT_TRUE(has(m, "config q_in_lds = 2, expected 0 or 1")) << m;
  m = rejection(good, "config {block_m = 64, block_n = 64, persistent = 1}");
  EXPECT_TRUE(has(m, "config persistent needs stages 3")) << m;
  m = rejection(good, "config {block_m = 64, block_n = 64, prefetch_blocks = 1}");
  EXPECT_TRUE(has(m, "config prefetch_blocks needs stages 2 (got stages 1)")) << m;
  m = rejection(good, "config {block_m = 64, block_n = 64, stages = 2, prefetch_blocks = 2}");
  EXPECT_TRUE(has(m, "config prefetch_blocks = 2, expected 0 or 1")) << m;
  EXPECT_EQ(rejection(good, "config {block_m = 128, block_n = 32, mma_m = 32, pad_k = 16, "
                            "q_in_lds = 1, stages = 2, waves = 8}"),
            "ok");
  EXPECT_EQ(rejection(good, "config {block_m = 64, block_n = 64, stages = 2, prefetch_blocks = 1}"),
            "ok");
}

TEST(Verifier, NamesMustPrintAndParse) {
  Program p = valid();
  p.values[p.body[0].results[0]].name = "1q";
  EXPECT_TRUE(has(message(p), "has name '1q', which is not an identifier"));
  Program q = valid();
  q.name = "";
  EXPECT_TRUE(has(message(q), "kernel name '' is not an identifier"));
}

} // namespace
} // namespace flashjit::ir
