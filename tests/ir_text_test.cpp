// The IR text form: golden printing, exact round trips, and parser errors.
#include "ir/ir.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

namespace flashjit::ir {
namespace {

constexpr TileLayout kA = TileLayout::mma_a, kB = TileLayout::mma_b, kAcc = TileLayout::mma_acc,
                     kRows = TileLayout::rows;

/// Appends ops to a block of a Program under construction.
struct Builder {
  Program &p;
  std::vector<Op> *body = &p.body;

  ValueId op(OpKind k, std::vector<ValueId> operands, Type t, Attrs attrs = {},
             std::string name = "") {
    ValueId r = p.add_value(t, std::move(name));
    body->push_back(Op{k, {r}, std::move(operands), std::move(attrs), {}, {}});
    return r;
  }
  void effect(OpKind k, std::vector<ValueId> operands, Attrs attrs = {}) {
    body->push_back(Op{k, {}, std::move(operands), std::move(attrs), {}, {}});
  }
};

/// The tiny kernel's scalar parameters: every shape but the head dims and the
/// strides inside a row is bound at run time.
std::vector<ScalarParam> tiny_scalars() {
  return {{"batches", ScalarType::i32},         {"seqlen_q", ScalarType::i32},
          {"seqlen_k", ScalarType::i32},        {"window_left", ScalarType::i32},
          {"scale_log2", ScalarType::f32},      {"q_batch_stride", ScalarType::i64},
          {"kv_batch_stride", ScalarType::i64}, {"lse_batch_stride", ScalarType::i64}};
}

/// A [batch, 2 heads, seq, dim] tensor: batch, seq and the batch stride are
/// parameters, the head and row strides constants (interleaved heads).
TensorParam tensor(std::string name, DType dtype, const char *seq, int64_t dim,
                   const char *batch_stride) {
  const int64_t heads = 2;
  TensorParam t;
  t.name = std::move(name);
  t.dtype = dtype;
  t.batch = Extent::of("batches");
  t.heads = Extent::constant(heads);
  t.seq = Extent::of(seq);
  t.dim = dim;
  t.stride_batch = Extent::of(batch_stride);
  if (dim == 0) { // a vector: one value per (batch, head, row)
    t.stride_head = Extent::of(seq);
    t.stride_seq = Extent::constant(1);
    t.stride_dim = Extent::constant(0);
    t.row_align = 4;
  } else {
    t.stride_head = Extent::constant(dim);
    t.stride_seq = Extent::constant(heads * dim);
    t.stride_dim = Extent::constant(1);
    t.row_align = 16;
  }
  return t;
}

Attrs loop_attrs() {
  // window_right is absent: unbounded on the right.
  return {{"block_m", int64_t{64}},
          {"block_n", int64_t{32}},
          {"causal", int64_t{1}},
          {"window_left", ParamRef{"window_left"}}};
}

/// Three index values for the grid, named `names` ("" prints as a number).
void constant_grid(Program &p, std::initializer_list<const char *> names = {"", "", ""}) {
  for (const char *n : names)
    p.grid.push_back(GridAxis{p.add_value(Type::index(), n), Extent::constant(1), 1});
}

/// A complete small attention kernel: S = Q K^T, online softmax, O = P V, LSE.
/// Some values are named, the rest print as numbers.
Program tiny_attention() {
  Program p;
  p.name = "tiny";
  p.scalars = tiny_scalars();
  p.tensors = {tensor("Q", DType::bf16, "seqlen_q", 40, "q_batch_stride"),
               tensor("K", DType::bf16, "seqlen_k", 40, "kv_batch_stride"),
               tensor("V", DType::bf16, "seqlen_k", 40, "kv_batch_stride"),
               tensor("O", DType::bf16, "seqlen_q", 40, "q_batch_stride"),
               tensor("LSE", DType::f32, "seqlen_q", 0, "lse_batch_stride")};
  ValueId qb = p.add_value(Type::index(), "q_block");
  p.grid = {GridAxis{qb, Extent::of("seqlen_q"), 64},
            GridAxis{p.add_value(Type::index(), "head"), Extent::constant(2), 1},
            GridAxis{p.add_value(Type::index(), "batch"), Extent::of("batches"), 1}};

  const Type row = Type::vec(64, DType::f32, kRows);
  const Type acc = Type::tile(64, 48, DType::f32, kAcc);
  const Type s_t = Type::tile(64, 32, DType::f32, kAcc);
  Builder b{p};
  ValueId q =
      b.op(OpKind::Load, {qb}, Type::tile(64, 48, DType::bf16, kA), {{"tensor", Symbol{"Q"}}});
  ValueId m0 = b.op(OpKind::Fill, {}, row, {{"value", -INFINITY}});
  ValueId l0 = b.op(OpKind::Fill, {}, row, {{"value", 0.0}});
  ValueId acc0 = b.op(OpKind::Fill, {}, acc, {{"value", 0.0}});

  Op loop{OpKind::For, {}, {qb, m0, l0, acc0}, loop_attrs(), {}, {}};
  loop.results = {p.add_value(row, "m"), p.add_value(row, "l"), p.add_value(acc, "acc")};
  ValueId kb = p.add_value(Type::index(), "kb");
  ValueId m_i = p.add_value(row, "m_i"), l_i = p.add_value(row, "l_i");
  ValueId acc_i = p.add_value(acc, "acc_i");
  loop.region_args = {kb, m_i, l_i, acc_i};
  {
    Builder in{p, &loop.body};
    ValueId k =
        in.op(OpKind::Load, {kb}, Type::tile(32, 48, DType::bf16, kB), {{"tensor", Symbol{"K"}}});
    ValueId zero = in.op(OpKind::Fill, {}, s_t, {{"value", 0.0}});
    ValueId s = in.op(OpKind::MmaABt, {q, k, zero}, s_t, {}, "s");
    s = in.op(OpKind::Scale, {s}, s_t, {{"factor", ParamRef{"scale_log2"}}});
    s = in.op(OpKind::Mask, {s, qb, kb}, s_t,
              {{"causal", int64_t{1}}, {"window_left", ParamRef{"window_left"}}});
    ValueId mx = in.op(OpKind::RowMax, {s}, row);
    ValueId m_new = in.op(OpKind::Max, {m_i, mx}, row, {}, "m_new");
    ValueId m_safe = in.op(OpKind::ZeroIfNegInf, {m_new}, row);
    ValueId pexp = in.op(OpKind::Exp2, {in.op(OpKind::SubRow, {s, m_safe}, s_t)}, s_t, {}, "p");
    ValueId alpha = in.op(OpKind::Exp2, {in.op(OpKind::Sub, {m_i, m_safe}, row)}, row, {}, "alpha");
    ValueId l_new =
        in.op(OpKind::Add,
              {in.op(OpKind::Mul, {l_i, alpha}, row), in.op(OpKind::RowSum, {pexp}, row)}, row);
    ValueId scaled = in.op(OpKind::MulRow, {acc_i, alpha}, acc);
    ValueId p16 = in.op(OpKind::Convert, {pexp}, Type::tile(64, 32, DType::bf16, kAcc));
    ValueId pa = in.op(OpKind::ConvertLayout, {p16}, Type::tile(64, 32, DType::bf16, kA));
    ValueId v =
        in.op(OpKind::Load, {kb}, Type::tile(32, 48, DType::bf16, kB), {{"tensor", Symbol{"V"}}});
    ValueId acc_new = in.op(OpKind::MmaAB, {pa, v, scaled}, acc);
    in.effect(OpKind::Yield, {m_new, l_new, acc_new});
  }
  std::vector<ValueId> carried = loop.results;
  p.body.push_back(std::move(loop));
  ValueId o = b.op(OpKind::DivRow, {carried[2], carried[1]}, acc);
  ValueId o16 = b.op(OpKind::Convert, {o}, Type::tile(64, 48, DType::bf16, kAcc), {}, "o");
  b.effect(OpKind::Store, {o16, qb}, {{"tensor", Symbol{"O"}}});
  ValueId lse =
      b.op(OpKind::Add, {b.op(OpKind::Log2, {carried[1]}, row), carried[0]}, row, {}, "lse");
  b.effect(OpKind::Store, {lse, qb}, {{"tensor", Symbol{"LSE"}}});
  return p;
}

constexpr std::string_view kTinyText = R"(kernel @tiny {
  scalars (%batches : i32, %seqlen_q : i32, %seqlen_k : i32, %window_left : i32, %scale_log2 : f32, %q_batch_stride : i64, %kv_batch_stride : i64, %lse_batch_stride : i64)
  tensor @Q : bf16 [batch = %batches, heads = 2, seq = %seqlen_q, dim = 40] strides [batch = %q_batch_stride, heads = 40, seq = 80, dim = 1] align = 16
  tensor @K : bf16 [batch = %batches, heads = 2, seq = %seqlen_k, dim = 40] strides [batch = %kv_batch_stride, heads = 40, seq = 80, dim = 1] align = 16
  tensor @V : bf16 [batch = %batches, heads = 2, seq = %seqlen_k, dim = 40] strides [batch = %kv_batch_stride, heads = 40, seq = 80, dim = 1] align = 16
  tensor @O : bf16 [batch = %batches, heads = 2, seq = %seqlen_q, dim = 40] strides [batch = %q_batch_stride, heads = 40, seq = 80, dim = 1] align = 16
  tensor @LSE : f32 [batch = %batches, heads = 2, seq = %seqlen_q, dim = 0] strides [batch = %lse_batch_stride, heads = %seqlen_q, seq = 1, dim = 0] align = 4
  grid (%q_block : ceil(%seqlen_q / 64), %head : 2, %batch : %batches) group = 1
  %0 = load %q_block {tensor = @Q} : tile<64x48xbf16, #mma_a>
  %1 = fill {value = -inf} : tile<64xf32, #rows>
  %2 = fill {value = 0.0} : tile<64xf32, #rows>
  %3 = fill {value = 0.0} : tile<64x48xf32, #mma_acc>
  %m, %l, %acc = for %q_block, %1, %2, %3 {block_m = 64, block_n = 32, causal = 1, window_left = %window_left} : tile<64xf32, #rows>, tile<64xf32, #rows>, tile<64x48xf32, #mma_acc> (%kb, %m_i, %l_i, %acc_i) {
    %4 = load %kb {tensor = @K} : tile<32x48xbf16, #mma_b>
    %5 = fill {value = 0.0} : tile<64x32xf32, #mma_acc>
    %s = mma_abt %0, %4, %5 : tile<64x32xf32, #mma_acc>
    %6 = scale %s {factor = %scale_log2} : tile<64x32xf32, #mma_acc>
    %7 = mask %6, %q_block, %kb {causal = 1, window_left = %window_left} : tile<64x32xf32, #mma_acc>
    %8 = row_max %7 : tile<64xf32, #rows>
    %m_new = max %m_i, %8 : tile<64xf32, #rows>
    %9 = zero_if_neg_inf %m_new : tile<64xf32, #rows>
    %10 = sub_row %7, %9 : tile<64x32xf32, #mma_acc>
    %p = exp2 %10 : tile<64x32xf32, #mma_acc>
    %11 = sub %m_i, %9 : tile<64xf32, #rows>
    %alpha = exp2 %11 : tile<64xf32, #rows>
    %12 = mul %l_i, %alpha : tile<64xf32, #rows>
    %13 = row_sum %p : tile<64xf32, #rows>
    %14 = add %12, %13 : tile<64xf32, #rows>
    %15 = mul_row %acc_i, %alpha : tile<64x48xf32, #mma_acc>
    %16 = convert %p : tile<64x32xbf16, #mma_acc>
    %17 = convert_layout %16 : tile<64x32xbf16, #mma_a>
    %18 = load %kb {tensor = @V} : tile<32x48xbf16, #mma_b>
    %19 = mma_ab %17, %18, %15 : tile<64x48xf32, #mma_acc>
    yield %m_new, %14, %19
  }
  %20 = div_row %acc, %l : tile<64x48xf32, #mma_acc>
  %o = convert %20 : tile<64x48xbf16, #mma_acc>
  store %o, %q_block {tensor = @O}
  %21 = log2 %l : tile<64xf32, #rows>
  %lse = add %21, %m : tile<64xf32, #rows>
  store %lse, %q_block {tensor = @LSE}
}
)";

std::string round_trip(const std::string &text) {
  Expected<Program> p = parse(text);
  if (!p)
    return "parse failed: " + p.status().message();
  return print(*p);
}

TEST(IrText, PrintsGolden) { EXPECT_EQ(print(tiny_attention()), kTinyText); }

TEST(IrText, GoldenKernelVerifies) {
  const Status s = verify(tiny_attention());
  EXPECT_TRUE(s) << s.message();
}

TEST(IrText, RoundTripIsExact) {
  std::string text = print(tiny_attention());
  EXPECT_EQ(round_trip(text), text);
}

TEST(IrText, ParsedProgramMatchesBuilt) {
  Expected<Program> p = parse(kTinyText);
  ASSERT_TRUE(p) << p.status().message();
  Program built = tiny_attention();
  EXPECT_EQ(p->name, built.name);
  EXPECT_EQ(p->scalars, built.scalars);
  EXPECT_EQ(p->tensors, built.tensors);
  EXPECT_EQ(p->grid, built.grid);
  EXPECT_EQ(p->grid[0].extent, Extent::of("seqlen_q"));
  EXPECT_EQ(p->grid[0].divisor, 64);
  EXPECT_EQ(p->grid[1].extent, Extent::constant(2));
  EXPECT_EQ(p->grid[2].extent, Extent::of("batches"));
  EXPECT_EQ(p->group, Extent::constant(1));
  EXPECT_EQ(p->tensor("LSE")->stride_head, Extent::of("seqlen_q"));
  EXPECT_EQ(p->tensor("Q")->row_align, 16);
  ASSERT_EQ(p->body.size(), built.body.size());
  const Op &loop = p->body[4];
  ASSERT_EQ(loop.kind, OpKind::For);
  EXPECT_EQ(loop.attrs.at("window_left"), Attr(ParamRef{"window_left"}));
  EXPECT_EQ(loop.attrs.count("window_right"), 0u) << "an absent window side stays absent";
  EXPECT_EQ(loop.int_attr("block_n"), 32);
  ASSERT_EQ(loop.region_args.size(), 4u);
  EXPECT_EQ(p->type_of(loop.region_args[0]), Type::index());
  EXPECT_EQ(p->type_of(loop.region_args[3]), Type::tile(64, 48, DType::f32, kAcc));
  EXPECT_EQ(p->values[loop.region_args[1]].name, "m_i");
  EXPECT_EQ(loop.body.size(), built.body[4].body.size());
  EXPECT_EQ(loop.body.back().kind, OpKind::Yield);
  EXPECT_TRUE(std::isinf(p->body[1].float_attr("value")));
  EXPECT_EQ(loop.body[3].attrs.at("factor"), Attr(ParamRef{"scale_log2"}));
  EXPECT_EQ(loop.body[4].attrs, built.body[4].body[4].attrs);
  EXPECT_EQ(p->body.back().symbol_attr("tensor"), "LSE");
  // Numbered values come back unnamed; named ones keep their names.
  EXPECT_EQ(p->values[p->body[0].results[0]].name, "");
  EXPECT_EQ(p->values[loop.results[2]].name, "acc");
}

TEST(IrText, ParsedProgramIdsFollowDefinitionOrder) {
  Expected<Program> p = parse(kTinyText);
  ASSERT_TRUE(p) << p.status().message();
  EXPECT_EQ(p->grid_arg(0), 0);
  EXPECT_EQ(p->grid_arg(1), 1);
  EXPECT_EQ(p->grid_arg(2), 2);
  EXPECT_EQ(p->body[0].results[0], 3);
  const Op &loop = p->body[4];
  EXPECT_EQ(loop.results, (std::vector<ValueId>{7, 8, 9}));
  EXPECT_EQ(loop.region_args, (std::vector<ValueId>{10, 11, 12, 13}));
}

TEST(IrText, TypesPrint) {
  EXPECT_EQ(to_string(Type::index()), "index");
  EXPECT_EQ(to_string(Type::tile(64, 80, DType::bf16, kA)), "tile<64x80xbf16, #mma_a>");
  EXPECT_EQ(to_string(Type::tile(16, 16, DType::f16, TileLayout::blocked)),
            "tile<16x16xf16, #blocked>");
  EXPECT_EQ(to_string(Type::vec(64, DType::f32)), "tile<64xf32, #rows>");
  EXPECT_EQ(op_info(OpKind::ZeroIfNegInf).name, std::string_view("zero_if_neg_inf"));
  EXPECT_EQ(op_info(OpKind::For).num_operands, -1);
  EXPECT_EQ(op_info(OpKind::MmaABt).num_operands, 3);
}

/// A minimal kernel around one op; `ops` are the lines of its body.
std::string kernel_with(std::string_view ops) {
  return std::string(R"(kernel @k {
  tensor @Q : bf16 [batch = 1, heads = 1, seq = 8, dim = 16] strides [batch = 128, heads = 16, seq = 16, dim = 1] align = 16
  grid (%0 : 1, %1 : 1, %2 : 1) group = 1
)") + std::string(ops) +
         "}\n";
}

TEST(IrText, AttrValuesRoundTrip) {
  Program p;
  p.name = "attrs";
  p.scalars = {{"s", ScalarType::f32}, {"n", ScalarType::i64}};
  constant_grid(p);
  Builder b{p};
  const Type t = Type::vec(16, DType::f32, TileLayout::blocked);
  Attrs attrs = {{"a_neg_inf", -std::numeric_limits<double>::infinity()},
                 {"b_inf", std::numeric_limits<double>::infinity()},
                 {"c_one", 1.0},
                 {"d_eighth", 0.125},
                 {"e_neg_int", int64_t{-7}},
                 {"f_big_int", std::numeric_limits<int64_t>::min()},
                 {"g_tiny", 1e-5},
                 {"h_huge", 1e20},
                 {"i_neg_zero", -0.0},
                 {"j_third", 1.0 / 3.0},
                 {"k_sym", Symbol{"Q"}},
                 {"l_real_param", ParamRef{"s"}},
                 {"m_int_param", ParamRef{"n"}}};
  b.op(OpKind::Fill, {}, t, attrs);
  std::string text = print(p);
  EXPECT_NE(text.find("{a_neg_inf = -inf, b_inf = inf, c_one = 1.0, d_eighth = 0.125, "
                      "e_neg_int = -7, f_big_int = -9223372036854775808, g_tiny = 1e-05, "
                      "h_huge = 1e+20, i_neg_zero = -0.0, j_third = 0.3333333333333333, "
                      "k_sym = @Q, l_real_param = %s, m_int_param = %n}"),
            std::string::npos)
      << text;
  Expected<Program> back = parse(text);
  ASSERT_TRUE(back) << back.status().message();
  EXPECT_EQ(print(*back), text);
  const Attrs &got = back->body[0].attrs;
  for (const auto &[key, value] : attrs) {
    ASSERT_TRUE(got.count(key)) << key;
    EXPECT_EQ(got.at(key).index(), value.index()) << key << ": int stays int, float stays float";
    if (auto *d = std::get_if<double>(&value)) {
      EXPECT_EQ(std::signbit(*d), std::signbit(std::get<double>(got.at(key)))) << key;
    }
  }
  EXPECT_EQ(got, attrs); // bit-exact doubles, including 1/3
}

TEST(IrText, UnnamedValuesAreRenumberedInDefinitionOrder) {
  // Ids out of definition order, gaps, and an unused value: the text counts 0, 1, 2, ...
  Program p;
  p.name = "order";
  ValueId unused = p.add_value(Type::vec(4, DType::f32, kRows));
  ValueId late = p.add_value(Type::vec(4, DType::f32, kRows));
  ValueId early = p.add_value(Type::vec(4, DType::f32, kRows));
  constant_grid(p, {"x", "", ""});
  (void)unused;
  p.body.push_back(Op{OpKind::Fill, {early}, {}, {{"value", 2.0}}, {}, {}});
  p.body.push_back(Op{OpKind::Exp2, {late}, {early}, {}, {}, {}});
  std::string text = print(p);
  EXPECT_NE(text.find("grid (%x : 1, %0 : 1, %1 : 1) group = 1\n"
                      "  %2 = fill {value = 2.0} : tile<4xf32, #rows>\n"
                      "  %3 = exp2 %2 : tile<4xf32, #rows>\n"),
            std::string::npos)
      << text;
  EXPECT_EQ(round_trip(text), text);
}

TEST(IrText, RepeatedNamesAreMadeUnique) {
  Program p;
  p.name = "names";
  constant_grid(p);
  Builder b{p};
  const Type t = Type::vec(4, DType::f32, kRows);
  ValueId a = b.op(OpKind::Fill, {}, t, {{"value", 1.0}}, "x");
  ValueId c = b.op(OpKind::Exp2, {a}, t, {}, "x");
  b.op(OpKind::Exp2, {c}, t, {}, "x_1");
  std::string text = print(p);
  EXPECT_NE(text.find("  %x = fill {value = 1.0} : tile<4xf32, #rows>\n"
                      "  %x_1 = exp2 %x : tile<4xf32, #rows>\n"
                      "  %x_1_1 = exp2 %x_1 : tile<4xf32, #rows>\n"),
            std::string::npos)
      << text;
  EXPECT_EQ(value_names(p)[c], "x_1");
  EXPECT_EQ(round_trip(text), text);
}

TEST(IrText, VectorTilesAndLseTensor) {
  std::string text = kernel_with("  %3 = fill {value = 0.0} : tile<16xf32, #blocked>\n"
                                 "  %4 = fill {value = 0.0} : tile<16x1xf32, #blocked>\n");
  text.insert(text.find("  grid"),
              "  tensor @LSE : f32 [batch = 2, heads = 3, seq = 16, dim = 0] "
              "strides [batch = 48, heads = 16, seq = 1, dim = 0] align = 4\n");
  Expected<Program> p = parse(text);
  ASSERT_TRUE(p) << p.status().message();
  EXPECT_TRUE(p->type_of(p->body[0].results[0]).is_vector());
  EXPECT_FALSE(p->type_of(p->body[1].results[0]).is_vector());
  const TensorParam *lse = p->tensor("LSE");
  ASSERT_NE(lse, nullptr);
  EXPECT_EQ(lse->dim, 0);
  EXPECT_EQ(lse->dtype, DType::f32);
  EXPECT_EQ(lse->stride_batch, Extent::constant(48));
  EXPECT_EQ(lse->stride_head, Extent::constant(16));
  EXPECT_EQ(lse->stride_seq, Extent::constant(1));
  EXPECT_EQ(lse->stride_dim, Extent::constant(0));
  EXPECT_EQ(lse->row_align, 4);
  EXPECT_EQ(print(*p), text);
}

TEST(IrText, ParserAcceptsCommentsBlankLinesAndSpacing) {
  std::string text = "// a comment\n\nkernel   @k   {  // opens\n"
                     "  tensor @Q : bf16 [batch=1, heads=1, seq=8, dim=16] strides [batch=128, "
                     "heads=16, seq=16, dim=1] align=16\n\n"
                     "  grid (%0:1,%1:1,%2:1) group=1\n"
                     "  %3 = fill {value=-inf}:tile<8xf32,#rows>   // trailing\n"
                     "}\n\n";
  Expected<Program> p = parse(text);
  ASSERT_TRUE(p) << p.status().message();
  EXPECT_EQ(print(*p), kernel_with("  %3 = fill {value = -inf} : tile<8xf32, #rows>\n"));
}

// ---- shape-free headers: scalars, symbolic extents, parameter attrs --------------

/// A kernel whose shapes are all parameters, with constants mixed in.
constexpr std::string_view kSymbolicText = R"(kernel @sym {
  scalars (%n : i32, %b : i32, %row : i64, %w : i32, %scale : f32)
  tensor @Q : f16 [batch = %b, heads = 3, seq = %n, dim = 16] strides [batch = %row, heads = 16, seq = 48, dim = 1] align = 8
  tensor @O : f16 [batch = 2, heads = 3, seq = %n, dim = 16] strides [batch = 0, heads = %n, seq = %w, dim = %w] align = 2
  grid (%qb : ceil(%n / 128), %h : 3, %bb : %b) group = %b config {block_m = 128}
  %0 = fill {a = %scale, b = %w, c = -1} : tile<128xf32, #rows>
}
)";

TEST(IrText, SymbolicHeaderRoundTripsExactly) {
  Expected<Program> p = parse(kSymbolicText);
  ASSERT_TRUE(p) << p.status().message();
  EXPECT_EQ(print(*p), kSymbolicText);
  EXPECT_EQ(p->scalars, (std::vector<ScalarParam>{{"n", ScalarType::i32},
                                                  {"b", ScalarType::i32},
                                                  {"row", ScalarType::i64},
                                                  {"w", ScalarType::i32},
                                                  {"scale", ScalarType::f32}}));
  const TensorParam &q = p->tensors[0], &o = p->tensors[1];
  EXPECT_EQ(q.batch, Extent::of("b"));
  EXPECT_EQ(q.heads, Extent::constant(3));
  EXPECT_EQ(q.seq, Extent::of("n"));
  EXPECT_EQ(q.dim, 16);
  EXPECT_EQ(q.stride_batch, Extent::of("row"));
  EXPECT_EQ(q.stride_seq, Extent::constant(48));
  EXPECT_EQ(q.row_align, 8);
  EXPECT_EQ(o.batch, Extent::constant(2));
  EXPECT_EQ(o.stride_batch, Extent::constant(0));
  EXPECT_EQ(o.stride_head, Extent::of("n"));
  EXPECT_EQ(o.stride_dim, Extent::of("w"));
  EXPECT_EQ(o.row_align, 2);
  ASSERT_EQ(p->grid.size(), 3u);
  EXPECT_EQ(p->grid[0], (GridAxis{0, Extent::of("n"), 128}));
  EXPECT_EQ(p->grid[1], (GridAxis{1, Extent::constant(3), 1}));
  EXPECT_EQ(p->grid[2], (GridAxis{2, Extent::of("b"), 1}));
  EXPECT_EQ(p->group, Extent::of("b"));
  const Attrs &attrs = p->body[0].attrs;
  EXPECT_EQ(attrs.at("a"), Attr(ParamRef{"scale"}));
  EXPECT_EQ(attrs.at("b"), Attr(ParamRef{"w"}));
  EXPECT_EQ(attrs.at("c"), Attr(int64_t{-1}));
  // The parser checks only that a parameter is declared; the verifier checks its use.
  EXPECT_EQ(to_string(Extent::of("n")), "%n");
  EXPECT_EQ(to_string(Extent::constant(-3)), "-3");
}

TEST(IrText, GridExtentsPrintInTheirShortestForm) {
  // ceil(x / 1) is x; a constant extent may be divided too.
  std::string text = kernel_with("");
  text.replace(text.find("grid (%0 : 1"), 12, "grid (%0 : ceil(100 / 64)");
  text.replace(text.find("%1 : 1"), 6, "%1 : ceil(7 / 1)");
  Expected<Program> p = parse(text);
  ASSERT_TRUE(p) << p.status().message();
  EXPECT_EQ(p->grid[0], (GridAxis{0, Extent::constant(100), 64}));
  EXPECT_EQ(p->grid[1], (GridAxis{1, Extent::constant(7), 1}));
  const std::string printed = print(*p);
  EXPECT_NE(printed.find("  grid (%0 : ceil(100 / 64), %1 : 7, %2 : 1) group = 1\n"),
            std::string::npos)
      << printed;
  EXPECT_EQ(round_trip(printed), printed);
}

TEST(IrText, EmptyScalarsLineIsNoScalars) {
  std::string text = kernel_with("");
  Expected<Program> p = parse("kernel @k {\n  scalars ()\n" + text.substr(text.find('\n') + 1));
  ASSERT_TRUE(p) << p.status().message();
  EXPECT_TRUE(p->scalars.empty());
  EXPECT_EQ(print(*p), text); // no scalars, no line
}

// ---- parser errors --------------------------------------------------------------

/// Parses `text`, expecting failure; returns the message.
std::string parse_error(const std::string &text) {
  Expected<Program> p = parse(text);
  if (p)
    return "parsed without error";
  return p.status().message();
}

// kernel_with() puts the first op on line 4.
TEST(IrParseError, MissingColonAfterAttributes) {
  std::string m = parse_error(kernel_with("  %3 = fill {value = 1.0} tile<8xf32, #rows>\n"));
  EXPECT_NE(m.find("line 4, col 27: expected ':' after attributes, found 'tile'"),
            std::string::npos)
      << m;
}

TEST(IrParseError, UndefinedValue) {
  std::string m = parse_error(kernel_with("  %3 = exp2 %nope : tile<8xf32, #rows>\n"));
  EXPECT_NE(m.find("line 4, col 13: use of undefined value %nope"), std::string::npos) << m;
}

TEST(IrParseError, UseBeforeDefinition) {
  std::string m = parse_error(kernel_with("  %3 = exp2 %4 : tile<8xf32, #rows>\n"
                                          "  %4 = fill {value = 1.0} : tile<8xf32, #rows>\n"));
  EXPECT_NE(m.find("line 4, col 13: use of undefined value %4"), std::string::npos) << m;
}

TEST(IrParseError, Redefinition) {
  std::string m = parse_error(kernel_with("  %a = fill {value = 1.0} : tile<8xf32, #rows>\n"
                                          "  %a = fill {value = 2.0} : tile<8xf32, #rows>\n"));
  EXPECT_NE(m.find("line 5, col 3: redefinition of %a (first defined at line 4, col 3)"),
            std::string::npos)
      << m;
  m = parse_error(kernel_with("  %1 = fill {value = 1.0} : tile<8xf32, #rows>\n"));
  EXPECT_NE(m.find("line 4, col 3: redefinition of %1 (first defined at line 3, col 17)"),
            std::string::npos)
      << m;
}

TEST(IrParseError, UnknownOpListsValidOps) {
  std::string m = parse_error(kernel_with("  %3 = exp %0 : tile<8xf32, #rows>\n"));
  EXPECT_NE(m.find("line 4, col 8: unknown op 'exp' (valid ops: load, store, fill, mma_ab,"),
            std::string::npos)
      << m;
  EXPECT_NE(m.find("exp2"), std::string::npos) << m;
}

TEST(IrParseError, UnknownLayout) {
  std::string m = parse_error(kernel_with("  %3 = fill {value = 1.0} : tile<8xf32, #row>\n"));
  EXPECT_NE(m.find("line 4, col 41: unknown layout '#row' (expected #blocked, #mma_a, #mma_b, "
                   "#mma_acc or #rows)"),
            std::string::npos)
      << m;
}

TEST(IrParseError, UnknownDtype) {
  std::string m = parse_error(kernel_with("  %3 = fill {value = 1.0} : tile<8x8xbf8, #rows>\n"));
  EXPECT_NE(m.find("line 4, col 38: unknown dtype 'bf8': expected bf16, f16 or f32"),
            std::string::npos)
      << m;
  m = parse_error(R"(kernel @k {
  tensor @Q : fp8 [batch = 1, heads = 1, seq = 8, dim = 16] strides [batch = 128, heads = 16, seq = 16, dim = 1] align = 16
)");
  EXPECT_NE(m.find("line 2, col 15: unknown dtype 'fp8'"), std::string::npos) << m;
}

TEST(IrParseError, WrongOperandCount) {
  std::string m = parse_error(kernel_with("  %3 = fill {value = 1.0} : tile<8x8xbf16, #mma_a>\n"
                                          "  %4 = mma_abt %3, %3 : tile<8x8xf32, #mma_acc>\n"));
  EXPECT_NE(m.find("line 5, col 8: 'mma_abt' takes 3 operands, got 2"), std::string::npos) << m;
}

TEST(IrParseError, WrongResultCount) {
  std::string m = parse_error(kernel_with("  store %0 {tensor = @Q}\n"));
  EXPECT_NE(m.find("line 4, col 3: 'store' takes 2 operands, got 1"), std::string::npos) << m;
  m = parse_error(kernel_with("  %3, %4 = fill {value = 1.0} : tile<8xf32, #rows>, index\n"));
  EXPECT_NE(m.find("line 4, col 12: 'fill' has 1 result, got 2"), std::string::npos) << m;
}

TEST(IrParseError, TypeCountMismatch) {
  std::string m = parse_error(
      kernel_with("  %3 = fill {value = 1.0} : tile<8xf32, #rows>, tile<8xf32, #rows>\n"));
  EXPECT_NE(m.find("line 4, col 8: 'fill' has 1 result but 2 result types"), std::string::npos)
      << m;
}

TEST(IrParseError, LoopBodyValueNotVisibleAfterLoop) {
  std::string m = parse_error(kernel_with("  %3 = fill {value = 1.0} : tile<8xf32, #rows>\n"
                                          "  %4 = for %0, %3 {} : tile<8xf32, #rows> (%kb, %x) {\n"
                                          "    %inner = exp2 %x : tile<8xf32, #rows>\n"
                                          "    yield %inner\n"
                                          "  }\n"
                                          "  %5 = exp2 %inner : tile<8xf32, #rows>\n"));
  EXPECT_NE(m.find("line 9, col 13: value %inner (defined at line 6, col 5) is not visible here"),
            std::string::npos)
      << m;
}

TEST(IrParseError, ForRegionArgumentCount) {
  std::string m = parse_error(kernel_with("  %3 = fill {value = 1.0} : tile<8xf32, #rows>\n"
                                          "  %4 = for %0, %3 {} : tile<8xf32, #rows> (%x) {\n"
                                          "    yield %x\n"
                                          "  }\n"));
  EXPECT_NE(m.find("line 5, col 43: 'for' has 1 region argument, expected 2"), std::string::npos)
      << m;
}

TEST(IrParseError, UnclosedBody) {
  std::string m = parse_error(kernel_with("  %3 = fill {value = 1.0} : tile<8xf32, #rows>\n"
                                          "  %4 = for %0, %3 {} : tile<8xf32, #rows> (%kb, %x) {\n"
                                          "    yield %x\n") +
                              "  %5 = exp2 %4 : tile<8xf32, #rows>\n");
  // The kernel's '}' closed the loop body; the kernel itself is never closed.
  EXPECT_NE(m.find("expected '}' to close the kernel opened at line 1, col 11, found end of input"),
            std::string::npos)
      << m;
}

TEST(IrParseError, BadTensorLineAndGrid) {
  std::string m = parse_error(R"(kernel @k {
  tensor @Q : bf16 [batch = 1, head = 1, seq = 8, dim = 16] strides [batch = 128, heads = 16, seq = 16, dim = 1] align = 16
)");
  EXPECT_NE(m.find("line 2, col 32: expected 'heads' in the shape, found 'head'"),
            std::string::npos)
      << m;
  m = parse_error("kernel @k {\n  grid (%a : 1, %b : 1) group = 1\n}\n");
  EXPECT_NE(m.find("line 2, col 3: grid takes 3 arguments (q block, head, batch) and optionally "
                   "a 4th (the KV split), got 2"),
            std::string::npos)
      << m;
  m = parse_error("kernel @k {\n  %0 = fill {value = 1.0} : tile<8xf32, #rows>\n}\n");
  EXPECT_NE(m.find("line 2, col 3: expected a 'scalars', 'tensor' or 'grid' line"),
            std::string::npos)
      << m;
}

TEST(IrParseError, MalformedAttributesAndTypes) {
  std::string m = parse_error(kernel_with("  %3 = fill {value = } : tile<8xf32, #rows>\n"));
  EXPECT_NE(m.find("line 4, col 22: expected an attribute value"), std::string::npos) << m;
  m = parse_error(kernel_with("  %3 = fill {value = 1.0, value = 2.0} : tile<8xf32, #rows>\n"));
  EXPECT_NE(m.find("line 4, col 27: duplicate attribute 'value'"), std::string::npos) << m;
  m = parse_error(kernel_with("  %3 = fill {value = 1.0} : tile<8x0xf32, #rows>\n"));
  EXPECT_NE(m.find("line 4, col 36: tile columns must be positive"), std::string::npos) << m;
  m = parse_error(kernel_with("  %3 = fill {value = 1.0} : tensor<8xf32>\n"));
  EXPECT_NE(m.find("line 4, col 29: expected a type ('index' or 'tile<...>'), found 'tensor'"),
            std::string::npos)
      << m;
  m = parse_error(kernel_with("  %3 = fill {value = 1.0} : tile<8xf32, #rows> extra\n"));
  EXPECT_NE(m.find("line 4, col 48: expected end of line after the 'fill' op, found 'extra'"),
            std::string::npos)
      << m;
}

TEST(IrParseError, TrailingInput) {
  std::string m = parse_error(kernel_with("") + "kernel @again {\n");
  EXPECT_NE(m.find("line 5, col 1: expected end of input after the kernel's closing '}'"),
            std::string::npos)
      << m;
}

// ---- parser errors in the shape-free header -------------------------------------

/// A header with scalars %n (i32) and %s (f32) and one tensor line; `edit`
/// replaces `from` (which must occur once) to make it wrong.
std::string scalar_header_with(std::string_view from, std::string_view to) {
  std::string text = R"(kernel @k {
  scalars (%n : i32, %s : f32)
  tensor @Q : bf16 [batch = 1, heads = 1, seq = %n, dim = 16] strides [batch = 128, heads = 16, seq = 16, dim = 1] align = 16
  grid (%0 : ceil(%n / 64), %1 : 1, %2 : 1) group = 1
  %3 = fill {value = %s} : tile<64xf32, #rows>
}
)";
  const size_t at = text.find(from);
  if (at == std::string::npos || text.find(from, at + 1) != std::string::npos)
    return fmt::format("test bug: '{}' does not occur exactly once", from);
  return text.replace(at, from.size(), to);
}

TEST(IrParseError, ScalarHeaderBaseParses) {
  Expected<Program> p = parse(scalar_header_with("group = 1", "group = 1"));
  ASSERT_TRUE(p) << p.status().message();
}

TEST(IrParseError, UndeclaredScalarInExtent) {
  std::string m = parse_error(scalar_header_with("seq = %n", "seq = %len"));
  EXPECT_NE(m.find("line 3, col 49: %len is not a scalar parameter or sequence of the kernel "
                   "(declare it on the 'scalars' line or a 'sequence' line)"),
            std::string::npos)
      << m;
  m = parse_error(scalar_header_with("batch = 128", "batch = %stride"));
  EXPECT_NE(m.find("line 3, col 80: %stride is not a scalar parameter"), std::string::npos) << m;
  m = parse_error(scalar_header_with("ceil(%n / 64)", "ceil(%m / 64)"));
  EXPECT_NE(m.find("line 4, col 19: %m is not a scalar parameter"), std::string::npos) << m;
  m = parse_error(scalar_header_with("group = 1", "group = %g"));
  EXPECT_NE(m.find("line 4, col 53: %g is not a scalar parameter"), std::string::npos) << m;
  // A value is not a scalar parameter, even one defined before.
  m = parse_error(scalar_header_with("group = 1", "group = %0"));
  EXPECT_NE(m.find("%0 is not a scalar parameter"), std::string::npos) << m;
}

TEST(IrParseError, UndeclaredScalarInAttr) {
  std::string m = parse_error(scalar_header_with("{value = %s}", "{value = %scale}"));
  EXPECT_NE(m.find("line 5, col 22: %scale is not a scalar parameter or sequence of the kernel"),
            std::string::npos)
      << m;
}

TEST(IrParseError, DuplicateScalar) {
  std::string m = parse_error(scalar_header_with("%s : f32)", "%s : f32, %n : i64)"));
  EXPECT_NE(m.find("line 2, col 32: scalar parameter %n is declared twice"), std::string::npos)
      << m;
}

TEST(IrParseError, UnknownScalarType) {
  std::string m = parse_error(scalar_header_with("%s : f32", "%s : f64"));
  EXPECT_NE(m.find("line 2, col 27: unknown scalar type 'f64': expected i32, i64 or f32"),
            std::string::npos)
      << m;
  m = parse_error(scalar_header_with("%n : i32", "%n : index"));
  EXPECT_NE(m.find("line 2, col 17: unknown scalar type 'index'"), std::string::npos) << m;
}

TEST(IrParseError, ScalarNeedsANameAndComesFirst) {
  std::string m = parse_error(scalar_header_with("%n : i32", "%7 : i32"));
  EXPECT_NE(m.find("line 2, col 12: scalar parameter %7 needs a name, not a number"),
            std::string::npos)
      << m;
  // After a tensor line, a scalars line would declare names already read as undeclared.
  std::string text = scalar_header_with("  grid", "  scalars (%late : i32)\n  grid");
  m = parse_error(text);
  EXPECT_NE(m.find("line 4, col 3: the 'scalars' line comes once, before the tensors and the grid"),
            std::string::npos)
      << m;
}

TEST(IrParseError, HeadDimIsNotAParameter) {
  // The head dim shapes the tiles: a kernel is generated per head dim.
  std::string m = parse_error(scalar_header_with("dim = 16]", "dim = %n]"));
  EXPECT_NE(m.find("tensor @Q: the head dim shapes the tiles, so it is a constant, not %n"),
            std::string::npos)
      << m;
  EXPECT_NE(m.find("line 3,"), std::string::npos) << m;
}

TEST(IrParseError, MalformedGridExtentAndAlign) {
  std::string m = parse_error(scalar_header_with("ceil(%n / 64)", "ceil(%n, 64)"));
  EXPECT_NE(m.find("line 4, col 21: expected '/' in ceil(extent / divisor), found ','"),
            std::string::npos)
      << m;
  m = parse_error(scalar_header_with("ceil(%n / 64)", "ceil(%n / %n)"));
  EXPECT_NE(m.find("line 4, col 24: expected the divisor (an integer)"), std::string::npos) << m;
  m = parse_error(scalar_header_with("%0 : ceil", "%0 = ceil"));
  EXPECT_NE(m.find("line 4, col 12: expected ':' after the grid argument, found '='"),
            std::string::npos)
      << m;
  m = parse_error(scalar_header_with(" align = 16", ""));
  EXPECT_NE(m.find("line 3,"), std::string::npos) << m;
  EXPECT_NE(m.find("expected 'align' after the tensor strides"), std::string::npos) << m;
}

} // namespace
} // namespace flashjit::ir
