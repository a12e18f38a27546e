// The block-range pass (issue 14): interval arithmetic over a block of queries
// and keys (templates/block_range.hip, run on the host through ir/interval.h)
// that lets a `for` skip the KV blocks at either end where an integer mask_mod
// keeps no pair.
//
//   * soundness: for random integer expressions and random blocks, every value
//     ir::evaluate gives for a (query, key) pair of the block lies inside the
//     interval (so a block the interval calls empty is empty);
//   * precision: the masks users write (windows, chunks, prefix-LM, causal)
//     get exact answers for blocks wholly inside or outside them;
//   * the IR: an integer mask_mod puts `range = @mask_range` on the loop (and a
//     float one does not), which prints, parses and verifies; the emitted kernel
//     narrows its loop; correctness with narrowing is score_mod_test's (every
//     family on the emulator) and backward_test's.
#include "ir/build.h"
#include "ir/expr.h"
#include "ir/interval.h"
#include "lowering/lower.h"

#include <gtest/gtest.h>

#include <random>

namespace flashjit {
namespace {

using ir::Interval;
namespace iv = ir::interval;

ir::ExprScope no_scope() { return {}; }

/// The interval of `text` when q_idx ranges over [q0, q1] and kv_idx over [k0, k1].
Interval block_interval(const std::string &text, int64_t q0, int64_t q1, int64_t k0, int64_t k1,
                        int64_t sq = 1000, int64_t sk = 1000) {
  auto e = ir::parse_expr(text, no_scope(), "mask_mod");
  EXPECT_TRUE(e) << e.status().message();
  if (!e)
    return iv::fj_iv_unknown();
  return ir::interval_of(
      *e,
      [&](const std::string &v) {
        return v == "q_idx"      ? iv::fj_iv_range(double(q0), double(q1))
               : v == "kv_idx"   ? iv::fj_iv_range(double(k0), double(k1))
               : v == "b"        ? iv::fj_iv_exact(1)
               : v == "h"        ? iv::fj_iv_exact(3)
               : v == "seqlen_q" ? iv::fj_iv_exact(double(sq))
               : v == "seqlen_k" ? iv::fj_iv_exact(double(sk))
                                 : iv::fj_iv_unknown();
      },
      [](const std::string &) { return 0.0; });
}

/// A random integer expression of the positions, at most `depth` deep, with
/// small constants (so that the kernel's 32-bit arithmetic holds the values).
std::string random_expr(std::mt19937 &rng, int depth) {
  auto pick = [&](int n) { return int(rng() % uint32_t(n)); };
  if (depth == 0 || pick(4) == 0) {
    static const char *leaves[] = {"q_idx", "kv_idx", "b", "h", "seqlen_q", "seqlen_k"};
    return pick(3) == 0 ? std::to_string(pick(90) - 20) : leaves[pick(6)];
  }
  const std::string a = random_expr(rng, depth - 1), b = random_expr(rng, depth - 1);
  static const char *ops[] = {
      "+", "-", "*", "/", "%", "<", "<=", ">", ">=", "==", "!=", "&&", "||"};
  switch (pick(6)) {
  case 0:
    return "(-" + a + ")";
  case 1:
    return "(!" + a + ")";
  case 2: {
    static const char *calls[] = {"min", "max"};
    return std::string(calls[pick(2)]) + "(" + a + ", " + b + ")";
  }
  case 3:
    return "abs(" + a + ")";
  case 4:
    return "(" + a + " ? " + b + " : " + random_expr(rng, depth - 1) + ")";
  default:
    return "(" + a + " " + ops[pick(13)] + " " + b + ")";
  }
}

TEST(BlockRange, IntervalsHoldEveryValueOfTheBlock) {
  std::mt19937 rng(20261125);
  int checked = 0, exact_blocks = 0;
  for (int trial = 0; trial < 3000; ++trial) {
    const std::string text = random_expr(rng, 4);
    auto e = ir::parse_expr(text, no_scope(), "mask_mod");
    ASSERT_TRUE(e) << text << ": " << e.status().message();
    ASSERT_TRUE(e->is_int) << text;
    const int64_t q0 = rng() % 200, k0 = rng() % 200;
    const int64_t q1 = q0 + rng() % 24, k1 = k0 + rng() % 24;
    const int64_t sq = 150 + rng() % 100, sk = 150 + rng() % 100;
    const Interval r = block_interval(text, q0, q1, k0, k1, sq, sk);
    ASSERT_FALSE(r.lo > r.hi) << text;
    exact_blocks += r.lo == r.hi;
    for (int64_t q = q0; q <= q1; ++q)
      for (int64_t k = k0; k <= k1; ++k) {
        ir::ExprContext c;
        c.b = 1;
        c.h = 3;
        c.q_idx = q;
        c.kv_idx = k;
        c.seqlen_q = sq;
        c.seqlen_k = sk;
        const double v = ir::evaluate(*e, c);
        if (std::abs(v) > 2147483647.0)
          continue; // the kernel's int would wrap: the interval said unknown there
        ASSERT_TRUE(v >= r.lo && v <= r.hi)
            << text << " = " << v << " at q_idx " << q << ", kv_idx " << k << " outside [" << r.lo
            << ", " << r.hi << "] of the block q [" << q0 << ", " << q1 << "] k [" << k0 << ", "
            << k1 << "]";
        ++checked;
      }
  }
  EXPECT_GT(checked, 100000);
  EXPECT_GT(exact_blocks, 300); // not everything is unknown
}

TEST(BlockRange, CommonMasksGetExactAnswers) {
  auto empty = [](const Interval &r) { return r.lo == 0 && r.hi == 0; };
  auto full = [](const Interval &r) { return r.lo > 0 || r.hi < 0; };
  // A sliding window: blocks far from the diagonal are empty, those on it partial.
  const std::string window = "abs(q_idx - kv_idx) <= 40";
  EXPECT_TRUE(empty(block_interval(window, 0, 63, 128, 191)));
  EXPECT_TRUE(empty(block_interval(window, 256, 319, 0, 63)));
  EXPECT_FALSE(empty(block_interval(window, 64, 127, 128, 191)));
  EXPECT_TRUE(full(block_interval(window, 100, 110, 100, 110)));
  // Chunks: a block inside one chunk is full, across chunks partial, another chunk empty.
  const std::string chunks = "q_idx / 64 == kv_idx / 64";
  EXPECT_TRUE(full(block_interval(chunks, 64, 127, 64, 127)));
  EXPECT_TRUE(empty(block_interval(chunks, 64, 127, 0, 63)));
  EXPECT_FALSE(empty(block_interval(chunks, 32, 95, 0, 63)));
  // Prefix-LM and causal.
  const std::string prefix = "kv_idx < 24 || kv_idx <= q_idx";
  EXPECT_TRUE(empty(block_interval(prefix, 0, 63, 128, 191)));
  EXPECT_TRUE(full(block_interval(prefix, 0, 63, 0, 15)));
  EXPECT_TRUE(full(block_interval("kv_idx <= q_idx + seqlen_k - seqlen_q", 500, 563, 0, 63)));
  // Modulo within one period maps exactly; a divisor that may be 0 is unknown.
  EXPECT_TRUE(empty(block_interval("q_idx % 100 >= 60", 100, 159, 0, 0)));
  EXPECT_FALSE(empty(block_interval("q_idx / (kv_idx - 5) > 100", 0, 10, 0, 10)));
  // Past 32 bits the kernel's int wraps: nothing is concluded.
  EXPECT_FALSE(empty(block_interval("q_idx * 100000 * 100000 < 0", 1, 2, 0, 0)));
}

TEST(BlockRange, AnIntegerMaskNarrowsTheLoopAFloatOneDoesNot) {
  AttentionSpec spec = make_spec(1, 2, 2, 300, 300, 64, 64, DType::bf16);
  spec.mask_mod = "abs(q_idx - kv_idx) <= 40";
  for (auto build :
       {ir::build_attention, ir::build_split_kv, ir::build_backward_dq, ir::build_backward_dkdv}) {
    auto p = build(spec, ir::Config{});
    ASSERT_TRUE(p) << p.status().message();
    ASSERT_TRUE(ir::verify(*p)) << ir::verify(*p).message();
    const std::string text = ir::print(*p);
    EXPECT_NE(text.find("range = @mask_range"), std::string::npos) << text;
    EXPECT_NE(text.find("function @mask_range = \"(abs((q_idx - kv_idx)) <= 40)\""),
              std::string::npos)
        << text;
    auto back = ir::parse(text);
    ASSERT_TRUE(back) << back.status().message();
    EXPECT_EQ(ir::print(*back), text);
  }
  auto target = lowering::parse_target("gfx1201");
  ASSERT_TRUE(target);
  auto kernel = lowering::generate(spec, lowering::default_config(spec, *target), *target);
  ASSERT_TRUE(kernel) << kernel.status().message();
  EXPECT_NE(kernel->source.find("fj_next_seen(kb + 1, &fj_kb_full)"), std::string::npos);
  EXPECT_NE(kernel->source.find("if (fj_block_full) { // @mask_range keeps every pair"),
            std::string::npos);
  EXPECT_NE(kernel->source.find("fj_iv_le(fj_iv_abs(fj_iv_sub("), std::string::npos);

  spec.mask_mod = "q_idx * 0.5 >= kv_idx"; // a float operand: f32 rounding, no bounds
  auto p = ir::build_attention(spec, ir::Config{});
  ASSERT_TRUE(p) << p.status().message();
  EXPECT_EQ(ir::print(*p).find("range ="), std::string::npos);
  // A `range` must name an integer function of the positions.
  ir::Program bad = *ir::build_attention(make_spec(1, 1, 1, 64, 64, 64, 64, DType::bf16), {});
  bad.functions.push_back({"f", "(score + 1.0)"});
  for (ir::Op &op : bad.body)
    if (op.kind == ir::OpKind::For)
      op.attrs["range"] = ir::Symbol{"f"};
  const Status s = ir::verify(bad);
  ASSERT_FALSE(s);
  EXPECT_NE(s.message().find("not an integer expression of the positions"), std::string::npos)
      << s.message();
}

} // namespace
} // namespace flashjit
