// The IR text form: golden printing, exact round trips, and parser errors.
#include "ir/ir.h"

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

TensorParam tensor(std::string name, DType t, int64_t seq, int64_t dim) {
  int64_t heads = 2;
  if (dim == 0) // a vector: one value per (batch, head, row)
    return TensorParam{name, t, 1, heads, seq, 0, Strides{heads * seq, seq, 1, 0}};
  return TensorParam{name, t, 1, heads, seq, dim, Strides{seq * heads * dim, dim, heads * dim, 1}};
}

Attrs loop_attrs() {
  return {{"block_m", int64_t{64}},
          {"block_n", int64_t{32}},
          {"causal", int64_t{1}},
          {"window_left", int64_t{-1}},
          {"window_right", int64_t{-1}}};
}

/// A complete small attention kernel: S = Q K^T, online softmax, O = P V, LSE.
/// Some values are named, the rest print as numbers.
Program tiny_attention() {
  Program p;
  p.name = "tiny";
  p.tensors = {tensor("Q", DType::bf16, 100, 40), tensor("K", DType::bf16, 70, 40),
               tensor("V", DType::bf16, 70, 40), tensor("O", DType::bf16, 100, 40),
               tensor("LSE", DType::f32, 100, 0)};
  p.grid_q_blocks = 2;
  p.grid_heads = 2;
  p.grid_batch = 1;
  ValueId qb = p.add_value(Type::index(), "q_block");
  p.grid_args = {qb, p.add_value(Type::index(), "head"), p.add_value(Type::index(), "batch")};

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
    s = in.op(OpKind::Scale, {s}, s_t, {{"factor", 0.125}});
    s = in.op(
        OpKind::Mask, {s, qb, kb}, s_t,
        {{"causal", int64_t{1}}, {"window_left", int64_t{-1}}, {"window_right", int64_t{-1}}});
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
  tensor @Q : bf16 [batch = 1, heads = 2, seq = 100, dim = 40] strides [batch = 8000, heads = 40, seq = 80, dim = 1]
  tensor @K : bf16 [batch = 1, heads = 2, seq = 70, dim = 40] strides [batch = 5600, heads = 40, seq = 80, dim = 1]
  tensor @V : bf16 [batch = 1, heads = 2, seq = 70, dim = 40] strides [batch = 5600, heads = 40, seq = 80, dim = 1]
  tensor @O : bf16 [batch = 1, heads = 2, seq = 100, dim = 40] strides [batch = 8000, heads = 40, seq = 80, dim = 1]
  tensor @LSE : f32 [batch = 1, heads = 2, seq = 100, dim = 0] strides [batch = 200, heads = 100, seq = 1, dim = 0]
  grid (%q_block = 2, %head = 2, %batch = 1) group = 1
  %0 = load %q_block {tensor = @Q} : tile<64x48xbf16, #mma_a>
  %1 = fill {value = -inf} : tile<64xf32, #rows>
  %2 = fill {value = 0.0} : tile<64xf32, #rows>
  %3 = fill {value = 0.0} : tile<64x48xf32, #mma_acc>
  %m, %l, %acc = for %q_block, %1, %2, %3 {block_m = 64, block_n = 32, causal = 1, window_left = -1, window_right = -1} : tile<64xf32, #rows>, tile<64xf32, #rows>, tile<64x48xf32, #mma_acc> (%kb, %m_i, %l_i, %acc_i) {
    %4 = load %kb {tensor = @K} : tile<32x48xbf16, #mma_b>
    %5 = fill {value = 0.0} : tile<64x32xf32, #mma_acc>
    %s = mma_abt %0, %4, %5 : tile<64x32xf32, #mma_acc>
    %6 = scale %s {factor = 0.125} : tile<64x32xf32, #mma_acc>
    %7 = mask %6, %q_block, %kb {causal = 1, window_left = -1, window_right = -1} : tile<64x32xf32, #mma_acc>
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

TEST(IrText, RoundTripIsExact) {
  std::string text = print(tiny_attention());
  EXPECT_EQ(round_trip(text), text);
}

TEST(IrText, ParsedProgramMatchesBuilt) {
  Expected<Program> p = parse(kTinyText);
  ASSERT_TRUE(p) << p.status().message();
  Program built = tiny_attention();
  EXPECT_EQ(p->name, built.name);
  EXPECT_EQ(p->tensors, built.tensors);
  EXPECT_EQ(p->grid_q_blocks, 2);
  EXPECT_EQ(p->grid_heads, 2);
  EXPECT_EQ(p->grid_batch, 1);
  EXPECT_EQ(p->group, 1);
  ASSERT_EQ(p->body.size(), built.body.size());
  const Op &loop = p->body[4];
  ASSERT_EQ(loop.kind, OpKind::For);
  EXPECT_EQ(loop.int_attr("window_left"), -1);
  EXPECT_EQ(loop.int_attr("block_n"), 32);
  ASSERT_EQ(loop.region_args.size(), 4u);
  EXPECT_EQ(p->type_of(loop.region_args[0]), Type::index());
  EXPECT_EQ(p->type_of(loop.region_args[3]), Type::tile(64, 48, DType::f32, kAcc));
  EXPECT_EQ(p->values[loop.region_args[1]].name, "m_i");
  EXPECT_EQ(loop.body.size(), built.body[4].body.size());
  EXPECT_EQ(loop.body.back().kind, OpKind::Yield);
  EXPECT_TRUE(std::isinf(p->body[1].float_attr("value")));
  EXPECT_EQ(loop.body[3].float_attr("factor"), 0.125);
  EXPECT_EQ(p->body.back().symbol_attr("tensor"), "LSE");
  // Numbered values come back unnamed; named ones keep their names.
  EXPECT_EQ(p->values[p->body[0].results[0]].name, "");
  EXPECT_EQ(p->values[loop.results[2]].name, "acc");
}

TEST(IrText, ParsedProgramIdsFollowDefinitionOrder) {
  Expected<Program> p = parse(kTinyText);
  ASSERT_TRUE(p) << p.status().message();
  EXPECT_EQ(p->grid_args, (std::vector<ValueId>{0, 1, 2}));
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
  tensor @Q : bf16 [batch = 1, heads = 1, seq = 8, dim = 16] strides [batch = 128, heads = 16, seq = 16, dim = 1]
  grid (%0 = 1, %1 = 1, %2 = 1) group = 1
)") + std::string(ops) +
         "}\n";
}

TEST(IrText, AttrValuesRoundTrip) {
  Program p;
  p.name = "attrs";
  p.grid_q_blocks = p.grid_heads = p.grid_batch = 1;
  for (int i = 0; i < 3; ++i)
    p.grid_args.push_back(p.add_value(Type::index()));
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
                 {"k_sym", Symbol{"Q"}}};
  b.op(OpKind::Fill, {}, t, attrs);
  std::string text = print(p);
  EXPECT_NE(text.find("{a_neg_inf = -inf, b_inf = inf, c_one = 1.0, d_eighth = 0.125, "
                      "e_neg_int = -7, f_big_int = -9223372036854775808, g_tiny = 1e-05, "
                      "h_huge = 1e+20, i_neg_zero = -0.0, j_third = 0.3333333333333333, "
                      "k_sym = @Q}"),
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
  p.grid_q_blocks = p.grid_heads = p.grid_batch = 1;
  ValueId unused = p.add_value(Type::vec(4, DType::f32, kRows));
  ValueId late = p.add_value(Type::vec(4, DType::f32, kRows));
  ValueId early = p.add_value(Type::vec(4, DType::f32, kRows));
  p.grid_args = {p.add_value(Type::index(), "x"), p.add_value(Type::index()),
                 p.add_value(Type::index())};
  (void)unused;
  p.body.push_back(Op{OpKind::Fill, {early}, {}, {{"value", 2.0}}, {}, {}});
  p.body.push_back(Op{OpKind::Exp2, {late}, {early}, {}, {}, {}});
  std::string text = print(p);
  EXPECT_NE(text.find("grid (%x = 1, %0 = 1, %1 = 1) group = 1\n"
                      "  %2 = fill {value = 2.0} : tile<4xf32, #rows>\n"
                      "  %3 = exp2 %2 : tile<4xf32, #rows>\n"),
            std::string::npos)
      << text;
  EXPECT_EQ(round_trip(text), text);
}

TEST(IrText, RepeatedNamesAreMadeUnique) {
  Program p;
  p.name = "names";
  p.grid_q_blocks = p.grid_heads = p.grid_batch = 1;
  for (int i = 0; i < 3; ++i)
    p.grid_args.push_back(p.add_value(Type::index()));
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
  text.insert(text.find("  grid"), "  tensor @LSE : f32 [batch = 2, heads = 3, seq = 16, dim = 0] "
                                   "strides [batch = 48, heads = 16, seq = 1, dim = 0]\n");
  Expected<Program> p = parse(text);
  ASSERT_TRUE(p) << p.status().message();
  EXPECT_TRUE(p->type_of(p->body[0].results[0]).is_vector());
  EXPECT_FALSE(p->type_of(p->body[1].results[0]).is_vector());
  const TensorParam *lse = p->tensor("LSE");
  ASSERT_NE(lse, nullptr);
  EXPECT_EQ(lse->dim, 0);
  EXPECT_EQ(lse->dtype, DType::f32);
  EXPECT_EQ(lse->strides, (Strides{48, 16, 1, 0}));
  EXPECT_EQ(print(*p), text);
}

TEST(IrText, ParserAcceptsCommentsBlankLinesAndSpacing) {
  std::string text = "// a comment\n\nkernel   @k   {  // opens\n"
                     "  tensor @Q : bf16 [batch=1, heads=1, seq=8, dim=16] strides [batch=128, "
                     "heads=16, seq=16, dim=1]\n\n"
                     "  grid (%0=1,%1=1,%2=1) group=1\n"
                     "  %3 = fill {value=-inf}:tile<8xf32,#rows>   // trailing\n"
                     "}\n\n";
  Expected<Program> p = parse(text);
  ASSERT_TRUE(p) << p.status().message();
  EXPECT_EQ(print(*p), kernel_with("  %3 = fill {value = -inf} : tile<8xf32, #rows>\n"));
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
  tensor @Q : fp8 [batch = 1, heads = 1, seq = 8, dim = 16] strides [batch = 128, heads = 16, seq = 16, dim = 1]
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
  tensor @Q : bf16 [batch = 1, head = 1, seq = 8, dim = 16] strides [batch = 128, heads = 16, seq = 16, dim = 1]
)");
  EXPECT_NE(m.find("line 2, col 32: expected 'heads' in the shape, found 'head'"),
            std::string::npos)
      << m;
  m = parse_error("kernel @k {\n  grid (%a = 1, %b = 1) group = 1\n}\n");
  EXPECT_NE(m.find("line 2, col 3: grid takes 3 arguments (q block, head, batch), got 2"),
            std::string::npos)
      << m;
  m = parse_error("kernel @k {\n  %0 = fill {value = 1.0} : tile<8xf32, #rows>\n}\n");
  EXPECT_NE(m.find("line 2, col 3: expected a 'tensor' or 'grid' line"), std::string::npos) << m;
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

} // namespace
} // namespace flashjit::ir
