// Split-KV attention (flash-decoding): the partial program of
// ir::build_split_kv (a 4th grid axis, a `for` over one split of the KV
// blocks, f32 partial results) and the combine kernel
// (lowering::lower_split_combine), against the float64 reference:
//
//   * the IR: printed, parsed and verified; the interpreter runs the partial
//     program and a host merge of its splits gives the reference result;
//   * the emulator, every AMD family (and the simt rules): 1..16 splits, more
//     splits than KV blocks (empty splits), decode and a few query tokens,
//     GQA 1:1, 4:1, 8:1 and MQA, causal, window, LSE, odd head dims;
//   * bad programs: a `splits` loop without the split axis.
//
// Tolerances: tolerance_for(dtype) (the same as every forward test).
#include "ir/build.h"
#include "ir/interpreter.h"
#include "lowering/lower.h"
#include "lowering/resources.h"
#include "runtime/attention.h"
#include "runtime/device.h"
#include "runtime/emulator.h"
#include "runtime/pipeline.h"
#include "tests/support/describe.h"
#include "tests/support/spec_case.h"

#include <gtest/gtest.h>

#include <cmath>

using namespace flashjit;

namespace {

using test::Case;
using test::name_of;
using test::spec_of;

constexpr Window kNoWindow{-1, -1};
constexpr auto bf16 = DType::bf16, f16 = DType::f16;
constexpr auto bshd = Layout::bshd, bhsd = Layout::bhsd;

using test::describe;

void expect_matches_reference(const AttentionSpec &spec, const HostTensors &t) {
  const Tolerance tol = tolerance_for(spec.dtype);
  const ErrorStats err = compare(spec, t, reference_attention(spec, t));
  EXPECT_TRUE(err.within(tol.abs, tol.rel)) << describe(err, tol);
}

TEST(SplitKvIr, PrintsParsesAndVerifies) {
  AttentionSpec spec = make_spec(2, 8, 2, 3, 500, 80, 80, bf16);
  spec.causal = true;
  auto p = ir::build_split_kv(spec, ir::Config{});
  ASSERT_TRUE(p) << p.status().message();
  ASSERT_TRUE(ir::verify(*p)) << ir::verify(*p).message();
  const std::string text = ir::print(*p);
  EXPECT_NE(text.find("%split : %num_splits"), std::string::npos) << text;
  EXPECT_NE(text.find("splits = %num_splits"), std::string::npos) << text;
  EXPECT_NE(text.find("tensor @O : f32"), std::string::npos) << text;
  EXPECT_NE(text.find("split = %o_split_stride"), std::string::npos) << text;
  auto back = ir::parse(text);
  ASSERT_TRUE(back) << back.status().message();
  EXPECT_EQ(ir::print(*back), text);
}

TEST(SplitKvIr, ASplitLoopNeedsTheSplitAxis) {
  const AttentionSpec spec = make_spec(1, 2, 2, 1, 100, 64, 64, bf16);
  auto p = ir::build_split_kv(spec, ir::Config{});
  ASSERT_TRUE(p);
  p->grid.pop_back();
  for (ir::TensorParam &t : p->tensors)
    t.stride_split = ir::Extent::constant(0);
  const Status s = ir::verify(*p);
  ASSERT_FALSE(s);
  EXPECT_NE(s.message().find("no KV split axis"), std::string::npos) << s.message();
}

TEST(SplitKvIr, SplitRangesCoverTheBlocksOnce) {
  for (int64_t n : {0, 1, 5, 16, 17})
    for (int64_t splits : {1, 2, 3, 7, 16, 40}) {
      int64_t next = 3;
      for (int64_t s = 0; s < splits; ++s) {
        const ir::BlockRange r = ir::split_range({3, 3 + n}, s, splits);
        ASSERT_LE(r.begin, r.end);
        if (r.begin < r.end) {
          EXPECT_EQ(r.begin, next) << n << " blocks, split " << s << " of " << splits;
          next = r.end;
        }
      }
      EXPECT_EQ(next, 3 + n) << n << " blocks over " << splits << " splits";
    }
}

// Grouped query rows in the IR (gqa_packed_decode's view of several tokens):
// the program prints and parses back, verifies, and the interpreter computes
// the caller's attention from the view, causal and windowed on the token, with
// query blocks that end inside a token's group (block_m 8 over groups of 4 and
// 3), in both layouts.
TEST(SplitKvIr, GroupedRowsInterpretToTheReference) {
  for (Layout layout : {bshd, bhsd})
    for (int64_t kv_heads : {2, 3}) {
      AttentionSpec user = make_spec(2, 12, kv_heads, 3, 40, 24, 16, bf16, layout);
      user.causal = true;
      user.window = {20, 0};
      user.lse = true;
      SCOPED_TRACE(user.summary());
      auto view = gqa_packed_decode(user);
      ASSERT_TRUE(view);
      ASSERT_GT(view->q_group, 1);
      ir::Config config;
      config.block_m = 8;
      config.block_n = 16;
      auto p = ir::build_attention(*view, config);
      ASSERT_TRUE(p) << p.status().message();
      const std::string text = ir::print(*p);
      EXPECT_NE(text.find("grouped = %q_group"), std::string::npos) << text;
      EXPECT_NE(text.find("group = %q_group_stride"), std::string::npos) << text;
      auto parsed = ir::parse(text);
      ASSERT_TRUE(parsed) << parsed.status().message();
      EXPECT_EQ(ir::print(*parsed), text);
      ASSERT_TRUE(ir::verify(*parsed)) << ir::verify(*parsed).message();
      HostTensors t = make_random_inputs(user, 7);
      std::fill(t.o.begin(), t.o.end(), NAN);
      std::fill(t.lse.begin(), t.lse.end(), NAN);
      Status s = ir::interpret(*parsed, ir::bind_attention(*view), t);
      ASSERT_TRUE(s) << s.message();
      expect_matches_reference(user, t);
    }
}

// The verifier refuses a mask whose q_group is not what @Q's rows are grouped by.
TEST(SplitKvIr, GroupedRowsNeedTheirMasksGrouped) {
  AttentionSpec user = make_spec(1, 8, 2, 3, 40, 16, 16, bf16);
  user.causal = true;
  auto view = gqa_packed_decode(user);
  ASSERT_TRUE(view);
  ir::Config config;
  config.block_m = 16;
  config.block_n = 16;
  auto p = ir::build_attention(*view, config);
  ASSERT_TRUE(p) << p.status().message();
  std::string text = ir::print(*p);
  const std::string attr = ", q_group = %q_group";
  for (size_t at = text.find(attr); at != std::string::npos; at = text.find(attr))
    text.erase(at, attr.size());
  auto parsed = ir::parse(text);
  ASSERT_TRUE(parsed) << parsed.status().message();
  const Status s = ir::verify(*parsed);
  ASSERT_FALSE(s) << text;
  EXPECT_NE(s.message().find("has q_group missing, but @Q's rows are grouped by %q_group"),
            std::string::npos)
      << s.message();
}

// The interpreter runs the partial program; merging its splits on the host by
// the combine's formula gives the reference.
TEST(SplitKvIr, InterpretedSplitsMergeToTheReference) {
  AttentionSpec spec = make_spec(2, 4, 2, 5, 300, 40, 40, f16, bhsd);
  spec.causal = true;
  spec.lse = true;
  for (int64_t splits : {1, 3, 8}) {
    SCOPED_TRACE(fmt::format("{} splits", splits));
    ir::Config config;
    config.block_m = 16;
    config.block_n = 32;
    auto p = ir::build_split_kv(spec, config);
    ASSERT_TRUE(p) << p.status().message();
    HostTensors t = make_random_inputs(spec, 99);
    const ir::SplitWorkspace ws = ir::split_workspace(spec, splits);
    HostTensors partial{t.q, t.k, t.v, std::vector<float>(size_t(ws.o_elements), NAN),
                        std::vector<float>(size_t(ws.lse_elements), NAN)};
    Status s = ir::interpret(*p, ir::bind_split_kv(spec, splits), partial);
    ASSERT_TRUE(s) << s.message();
    const int64_t rows = spec.batch * spec.heads * spec.seqlen_q, dv = spec.head_dim_v;
    for (int64_t r = 0; r < rows; ++r) {
      double lse_max = -INFINITY;
      for (int64_t sp = 0; sp < splits; ++sp)
        lse_max = std::max(lse_max, double(partial.lse[size_t(sp * rows + r)]));
      double sum = 0;
      std::vector<double> acc(size_t(dv), 0.0);
      for (int64_t sp = 0; sp < splits && lse_max > -INFINITY; ++sp) {
        const double w = std::exp(double(partial.lse[size_t(sp * rows + r)]) - lse_max);
        sum += w;
        for (int64_t d = 0; d < dv; ++d)
          acc[size_t(d)] += w * partial.o[size_t((sp * rows + r) * dv + d)];
      }
      const int64_t b = r / (spec.heads * spec.seqlen_q), h = r / spec.seqlen_q % spec.heads,
                    i = r % spec.seqlen_q;
      for (int64_t d = 0; d < dv; ++d)
        t.o[size_t(b * spec.o.batch + h * spec.o.head + i * spec.o.seq + d)] =
            round_to(spec.dtype, float(sum > 0 ? acc[size_t(d)] / sum : 0.0));
      t.lse[size_t(r)] = float(sum > 0 ? lse_max + std::log(sum) : -INFINITY);
    }
    expect_matches_reference(spec, t);
  }
}

// ---- on the emulator -------------------------------------------------------

struct Lowering {
  const char *arch;
  lowering::RulesChoice choice;
};

std::string name_of(const Lowering &l) {
  return fmt::format("{}{}", l.arch, l.choice == lowering::RulesChoice::simt ? "_simt" : "");
}

constexpr auto automatic = lowering::RulesChoice::automatic;
const Lowering kLowerings[] = {{"gfx1201", automatic}, {"gfx1100", automatic},
                               {"gfx942", automatic},  {"gfx90a", automatic},
                               {"gfx950", automatic},  {"gfx1201", lowering::RulesChoice::simt}};

// Decode and a few query tokens against long KV.
const Case kCases[] = {
    {1, 8, 2, 1, 700, 128, 128, bf16, bshd, false, kNoWindow, true},   // GQA 4:1, decode
    {2, 8, 1, 1, 333, 64, 64, f16, bshd, true, kNoWindow, false},      // MQA, causal
    {1, 8, 1, 16, 520, 80, 80, bf16, bshd, true, kNoWindow, true},     // 8:1, 16 tokens
    {1, 2, 2, 3, 257, 72, 72, f16, bhsd, false, Window{100, 0}, true}, // 1:1, window
    {1, 4, 4, 2, 40, 96, 64, bf16, bshd, true, kNoWindow, true},       // fewer blocks than splits
    {1, 4, 2, 5, 300, 64, 64, f16, bshd, true, Window{-1, 47}, true},  // causal + right window (FA)
};

class SplitKvEmulator
    : public testing::TestWithParam<std::tuple<Lowering, Case, int64_t /*splits*/>> {};

TEST_P(SplitKvEmulator, MatchesFloat64) {
  const auto &[how, c, splits] = GetParam();
  auto t = lowering::parse_target(how.arch);
  ASSERT_TRUE(t) << t.status().message();
  const AttentionSpec spec = spec_of(c);
  ASSERT_TRUE(spec.validate()) << spec.validate().message();
  const ir::Config config = lowering::default_config(spec, *t, how.choice);
  auto program = ir::build_split_kv(spec, config);
  ASSERT_TRUE(program) << program.status().message();
  auto partial = lowering::lower(*program, *t, how.choice);
  ASSERT_TRUE(partial) << partial.status().message();
  auto combine = lowering::lower_split_combine(spec, *t);
  ASSERT_TRUE(combine) << combine.status().message();
  HostTensors tensors = make_random_inputs(spec, 700 + uint64_t(splits));
  Status s =
      runtime::emulate_split_kv(*partial, *combine, *t, spec, splits, tensors, {.threads = 2});
  ASSERT_TRUE(s) << s.message();
  expect_matches_reference(spec, tensors);
}

INSTANTIATE_TEST_SUITE_P(Decode, SplitKvEmulator,
                         testing::Combine(testing::ValuesIn(kLowerings), testing::ValuesIn(kCases),
                                          testing::Values(int64_t{1}, int64_t{3}, int64_t{16})),
                         [](const auto &info) {
                           return fmt::format("{}_{}_splits{}", name_of(std::get<0>(info.param)),
                                              name_of(std::get<1>(info.param)),
                                              std::get<2>(info.param));
                         });

// More splits than the combine's work-items (flashjit chooses up to
// kMaxChosenSplits for decode of few heads), most of them past the last KV
// block (empty): each work-item reads several LSEs.
// From 256 splits on, the combine's workgroups take 8 entries each (else 32;
// up to 16 splits a work-item per entry, SplitKvEmulator): head dims 64 and
// 100 (a last workgroup of 4 entries), both widths, and 17 splits, the first
// past the flat merge.
TEST(SplitKvCombine, TakesMoreSplitsThanWorkItems) {
  auto t = lowering::parse_target("gfx1201");
  ASSERT_TRUE(t) << t.status().message();
  for (int64_t d : {64, 100}) {
    AttentionSpec spec = spec_of({1, 4, 1, 1, 5000, d, d, bf16, bshd, false, kNoWindow, true});
    ir::Config config = lowering::default_config(spec, *t, automatic);
    config.block_n = 16;
    auto program = ir::build_split_kv(spec, config);
    ASSERT_TRUE(program) << program.status().message();
    auto partial = lowering::lower(*program, *t, automatic);
    ASSERT_TRUE(partial) << partial.status().message();
    auto combine = lowering::lower_split_combine(spec, *t);
    ASSERT_TRUE(combine) << combine.status().message();
    for (int64_t splits : {int64_t{17}, int64_t{63}, int64_t{313}, kMaxChosenSplits}) {
      SCOPED_TRACE(fmt::format("d {}, {} splits", d, splits));
      HostTensors tensors = make_random_inputs(spec, 800 + uint64_t(splits));
      Status s =
          runtime::emulate_split_kv(*partial, *combine, *t, spec, splits, tensors, {.threads = 2});
      ASSERT_TRUE(s) << s.message();
      expect_matches_reference(spec, tensors);
    }
  }
}

} // namespace

// ---- through flashjit::Attention -------------------------------------------

/// One forward of `shape` through `attn` on the inputs of `t` (in the spec's dtype;
/// O poisoned; the LSE and sinks where the spec has them), against the reference.
void forward_host_matches(Attention &attn, const AttentionSpec &shape, HostTensors &t) {
  std::vector<uint16_t> q(t.q.size()), k(t.k.size()), v(t.v.size()), o(t.o.size(), 0x7fff);
  for (auto [from, to] : {std::pair{&t.q, &q}, std::pair{&t.k, &k}, std::pair{&t.v, &v}})
    for (size_t i = 0; i < from->size(); ++i)
      (*to)[i] = uint16_t(to_bits(shape.dtype, (*from)[i]));
  std::fill(t.lse.begin(), t.lse.end(), std::numeric_limits<float>::quiet_NaN());
  AttentionTensors a;
  a.q = q.data();
  a.k = k.data();
  a.v = v.data();
  a.out = o.data();
  a.lse = shape.lse ? t.lse.data() : nullptr;
  a.sinks = shape.sinks ? t.sinks.data() : nullptr;
  Status s = attn.forward(shape, a);
  ASSERT_TRUE(s) << s.message();
  for (size_t i = 0; i < o.size(); ++i)
    t.o[i] = from_bits(shape.dtype, o[i]);
  expect_matches_reference(shape, t);
}

// One Attention serves decode steps with split-KV chosen per call (auto), forced
// (n) and off (1: the decode kernel alone), and prefill, all against the
// reference; explain() says how many calls split.
TEST(SplitKvAttention, DecodeSplitsThroughOneAttention) {
  AttentionSpec spec = make_spec(1, 4, 2, 1, 64, 96, 96, f16);
  spec.causal = true;
  spec.lse = true;
  Options options;
  options.compiler = "none"; // the emulator runs the kernel text; no AMD code object needed
  options.cpu_threads = 2;
  auto attn = Attention::create(spec, "emulator:gfx1201", options);
  ASSERT_TRUE(attn) << attn.status().message();
  EXPECT_NE(attn->explain().find("split-kv: not used yet"), std::string::npos) << attn->explain();
  struct Call {
    int64_t sq, sk, num_splits;
  };
  for (const Call &c : {Call{1, 1500, 0}, Call{1, 1501, 1}, Call{3, 777, 5}, Call{1, 9, 0},
                        Call{200, 260, 0}, Call{1, 2000, 128}}) {
    SCOPED_TRACE(fmt::format("sq {} sk {} num_splits {}", c.sq, c.sk, c.num_splits));
    AttentionSpec shape = make_spec(1, 4, 2, c.sq, c.sk, 96, 96, f16);
    shape.causal = true;
    shape.lse = true;
    shape.num_splits = c.num_splits;
    HostTensors t = make_random_inputs(shape, 31 + uint64_t(c.sk));
    forward_host_matches(*attn, shape, t);
  }
  const std::string explain = attn->explain();
  // Decode takes the split kernels when chosen (sk 1500), and 5 and 128 were asked
  // for; sk 9 (too few KV blocks) and num_splits 1 run one split, the decode
  // kernel alone; the prefill (200 queries) has too few KV blocks to split.
  EXPECT_NE(explain.find("split-kv: 3 of those calls ran the split-KV kernels"), std::string::npos)
      << explain;
  EXPECT_NE(explain.find("2 ran the decode kernel"), std::string::npos) << explain;
  EXPECT_NE(explain.find("6 forward calls: 1 through this one kernel, 5 through the split-KV or "
                         "decode kernels"),
            std::string::npos)
      << explain;
}

/// What the emulator tests below create their Attention with: no AMD code
/// object (the emulator runs the kernel text), two CPU threads.
Options emulator_options(std::string rules = "auto", int64_t mma_m = 0) {
  Options o;
  o.compiler = "none";
  o.cpu_threads = 2;
  o.rules = std::move(rules);
  o.mma_m = mma_m;
  return o;
}

/// One forward of `shape` through `attn` on fresh inputs, against the reference.
void forward_matches(Attention &attn, const AttentionSpec &shape, uint64_t seed) {
  HostTensors t = make_random_inputs(shape, seed);
  forward_host_matches(attn, shape, t);
}

// Decode's chosen split count: as many splits as the device holds at once
// (compute units x the split kernel's resident workgroups, over batch x heads),
// capped by the KV blocks. The emulator has kEmulatorComputeUnits and the
// lowering's occupancy estimate; explain() names both numbers.
TEST(SplitKvAttention, DecodeTakesTheSplitsTheDeviceHoldsAtOnce) {
  Options options;
  options.compiler = "none";
  options.cpu_threads = 2;
  for (int64_t sk : {int64_t{300}, int64_t{20000}}) {
    SCOPED_TRACE(fmt::format("sk {}", sk));
    AttentionSpec spec = make_spec(1, 3, 3, 1, sk, 64, 64, bf16);
    auto attn = Attention::create(spec, "emulator:gfx1201", options);
    ASSERT_TRUE(attn) << attn.status().message();
    forward_matches(*attn, spec, 77 + uint64_t(sk));
    auto partial =
        pipeline::generate(spec, "gfx1201", options, nullptr, pipeline::KernelKind::split_partial);
    ASSERT_TRUE(partial) << partial.status().message();
    const int64_t resident = lowering::resident_per_unit(partial->lowered, partial->target);
    const int64_t kv_blocks = (sk + partial->config.block_n - 1) / partial->config.block_n;
    const int64_t splits = std::clamp<int64_t>(kEmulatorComputeUnits * resident / spec.heads, 1,
                                               std::min(kv_blocks, kMaxChosenSplits));
    const std::string explain = attn->explain();
    EXPECT_NE(explain.find(fmt::format("the latest over {} splits; {} workgroups of the first "
                                       "resident per compute unit",
                                       splits, resident)),
              std::string::npos)
        << explain;
  }
}

// Decode with GQA runs GQA-packed (ir/spec.h's gqa_packed_decode): the group's
// query heads are the rows of one KV head's tiles, as grouped rows (a token's
// heads side by side, the masks on the token). Groups of 2..32, 1 to
// kMaxPackedTokens tokens (up to 512 rows: several query blocks), causal
// (bottom-right on the token, including tokens that see no key) and not, both
// layouts, LSE, forced and chosen splits, the decode kernel; more tokens run
// unpacked through the same Attention. (One token with a mask tensor, viewed
// by strides: mask_tensor_test's SplitKvDecodeReadsTheMask.)
TEST(SplitKvAttention, GqaPackedDecodeMatchesTheReference) {
  struct Packed {
    const char *arch;
    int64_t batch, heads, kv_heads, sk, d;
    DType dtype;
    Layout layout;
    bool causal;
  };
  for (const Packed &c : {Packed{"gfx1201", 2, 8, 1, 700, 128, bf16, bshd, true},
                          Packed{"gfx942", 1, 32, 1, 300, 64, f16, bhsd, false},
                          Packed{"gfx1100", 3, 12, 4, 257, 80, bf16, bshd, true}}) {
    SCOPED_TRACE(fmt::format("{} {}:{} d={}", c.arch, c.heads, c.kv_heads, c.d));
    auto shape_of = [&](int64_t sq, int64_t sk, int64_t num_splits) {
      AttentionSpec s =
          make_spec(c.batch, c.heads, c.kv_heads, sq, sk, c.d, c.d, c.dtype, c.layout);
      s.causal = c.causal;
      s.lse = true;
      s.num_splits = num_splits;
      return s;
    };
    auto attn = Attention::create(shape_of(1, c.sk, 0), "emulator:" + std::string(c.arch),
                                  emulator_options());
    ASSERT_TRUE(attn) << attn.status().message();
    forward_matches(*attn, shape_of(1, c.sk, 0), 1);  // packed, splits chosen
    forward_matches(*attn, shape_of(1, c.sk, 5), 2);  // packed, 5 splits
    forward_matches(*attn, shape_of(1, 17, 0), 3);    // packed, one KV block: decode kernel
    forward_matches(*attn, shape_of(2, c.sk, 3), 4);  // two tokens: grouped rows
    forward_matches(*attn, shape_of(1, c.sk, 1), 5);  // packed, no split: decode kernel
    forward_matches(*attn, shape_of(17, c.sk, 3), 6); // past kMaxPackedTokens: unpacked
    forward_matches(*attn, shape_of(16, 40, 1), 7);   // grouped rows: decode kernel
    forward_matches(*attn, shape_of(7, 5, 2), 8);     // causal: tokens 0, 1 see no key
    const std::string explain = attn->explain();
    EXPECT_NE(explain.find("5 of those calls ran the split-KV kernels"), std::string::npos)
        << explain;
    EXPECT_NE(explain.find("3 ran the decode kernel"), std::string::npos) << explain;
    EXPECT_NE(explain.find("7 of these GQA-packed (a KV head's query heads as the rows of its "
                           "tiles), 7 as grouped rows (a token's heads side by side): "),
              std::string::npos)
        << explain;
  }
}

// GQA-packed decode as grouped rows on every family's rules the test above
// does not run (gfx11's replicated operands, CDNA's 16- and 32-query tiles, the
// simt rules): several tokens, causal, a head dim of 72, chosen and forced
// splits, and one split (the decode kernel).
TEST(SplitKvAttention, GroupedRowsMatchTheReferenceOnEveryFamily) {
  struct Family {
    const char *arch;
    const char *rules;
    int64_t mma_m;
  };
  for (const Family &f :
       {Family{"gfx1151", "auto", 0}, Family{"gfx90a", "auto", 16}, Family{"gfx90a", "auto", 32},
        Family{"gfx942", "auto", 16}, Family{"gfx950", "auto", 16}, Family{"gfx950", "auto", 32},
        Family{"gfx1200", "auto", 0}, Family{"gfx1201", "simt", 0}}) {
    SCOPED_TRACE(fmt::format("{} {} mma_m {}", f.arch, f.rules, f.mma_m));
    auto shape_of = [](int64_t sq, int64_t sk, int64_t num_splits) {
      AttentionSpec s = make_spec(2, 8, 2, sq, sk, 72, 72, bf16);
      s.causal = true;
      s.lse = true;
      s.num_splits = num_splits;
      return s;
    };
    auto attn = Attention::create(shape_of(3, 150, 0), "emulator:" + std::string(f.arch),
                                  emulator_options(f.rules, f.mma_m));
    ASSERT_TRUE(attn) << attn.status().message();
    forward_matches(*attn, shape_of(3, 150, 0), 11);
    forward_matches(*attn, shape_of(16, 150, 3), 12);
    forward_matches(*attn, shape_of(5, 40, 1), 13);
    EXPECT_NE(attn->explain().find("3 as grouped rows"), std::string::npos) << attn->explain();
  }
}

// Config prefetch_blocks (the default of GQA-packed decode's four-wave kernels
// on NVIDIA, whose stages are 2): the KV loop copies block kb + 1's K and V while
// block kb is computed. A given config reaches every kernel of the plan: the
// split-KV pair, the decode kernel and the attention kernel of a prefill.
TEST(SplitKvAttention, LoopsPrefetchingWholeBlocksMatchTheReference) {
  ir::Config config;
  config.block_m = 64;
  config.block_n = 32;
  config.waves = 4;
  config.stages = 2;
  config.prefetch_blocks = true;
  for (const char *arch : {"gfx1201", "gfx942"}) {
    SCOPED_TRACE(arch);
    auto shape_of = [](int64_t sq, int64_t sk, int64_t num_splits) {
      AttentionSpec s = make_spec(2, 8, 2, sq, sk, 80, 80, bf16);
      s.causal = true;
      s.lse = true;
      s.num_splits = num_splits;
      return s;
    };
    Options options = emulator_options();
    options.config = config;
    auto attn = Attention::create(shape_of(1, 150, 0), "emulator:" + std::string(arch), options);
    ASSERT_TRUE(attn) << attn.status().message();
    forward_matches(*attn, shape_of(1, 150, 0), 31);  // packed, splits chosen
    forward_matches(*attn, shape_of(1, 150, 3), 32);  // packed, 3 splits
    forward_matches(*attn, shape_of(16, 150, 1), 33); // grouped rows: the decode kernel
    forward_matches(*attn, shape_of(7, 45, 2), 34);   // causal: tokens 0, 1 see no key
    forward_matches(*attn, shape_of(70, 150, 1), 35); // prefill: the attention kernel
    EXPECT_NE(attn->source().find("Block prefetch"), std::string::npos);
    EXPECT_NE(attn->explain().find("prefetch_blocks"), std::string::npos) << attn->explain();
  }
}

// Attention sinks across splits: the split kernels count none, the combine counts
// the row's head's once (its max and its sum), so split-KV and GQA-packed decode
// take sinks: MHA and grouped rows (several tokens, causal with tokens that see
// no key: O = 0, LSE = the sink), chosen and forced splits, a sink of -inf; one
// split is the attention kernel's, which counts the sink itself.
TEST(SplitKvAttention, SinksCountOnceAcrossSplits) {
  for (const char *arch : {"gfx1201", "gfx942"}) {
    SCOPED_TRACE(arch);
    auto shape_of = [](int64_t heads, int64_t kv_heads, int64_t sq, int64_t sk, int64_t splits) {
      AttentionSpec s = make_spec(2, heads, kv_heads, sq, sk, 64, 64, bf16);
      s.causal = true;
      s.lse = true;
      s.sinks = true;
      s.num_splits = splits;
      return s;
    };
    auto attn = Attention::create(shape_of(8, 2, 1, 300, 0), "emulator:" + std::string(arch),
                                  emulator_options());
    ASSERT_TRUE(attn) << attn.status().message();
    uint64_t seed = 40;
    for (const AttentionSpec &shape :
         {shape_of(8, 2, 1, 300, 0), shape_of(8, 2, 1, 300, 3), shape_of(8, 2, 5, 300, 0),
          shape_of(8, 2, 7, 5, 2), shape_of(4, 4, 1, 300, 3), shape_of(8, 2, 1, 300, 1)}) {
      SCOPED_TRACE(shape.summary());
      HostTensors t = make_random_inputs(shape, ++seed);
      ASSERT_EQ(t.sinks.size(), size_t(shape.heads));
      t.sinks[1] = -std::numeric_limits<float>::infinity(); // a head without a sink
      forward_host_matches(*attn, shape, t);
    }
    const std::string explain = attn->explain();
    EXPECT_NE(explain.find("5 of those calls ran the split-KV kernels"), std::string::npos)
        << explain;
    EXPECT_NE(explain.find("4 as grouped rows"), std::string::npos) << explain;
    EXPECT_NE(explain.find("1 through this one kernel"), std::string::npos) << explain;
  }
  // Rows that fill the device: one split chosen, which runs the split kernels
  // (the decode kernel counts no sinks).
  AttentionSpec many = make_spec(16, 32, 16, 1, 200, 64, 64, bf16);
  many.sinks = true;
  many.lse = true;
  auto attn = Attention::create(many, "emulator:gfx1201", emulator_options());
  ASSERT_TRUE(attn) << attn.status().message();
  forward_matches(*attn, many, 49);
  EXPECT_NE(attn->explain().find("ran the split-KV kernels (the latest over 1 splits"),
            std::string::npos)
      << attn->explain();
}

// The group is a call's, not the signature's: a handle made by a call without
// GQA builds the grouped kernels right for a later call with it (they once took
// the handle's group of 1 and read the rows ungrouped).
TEST(SplitKvAttention, GroupedRowsOfAHandleMadeWithoutGqa) {
  auto shape_of = [](int64_t heads, int64_t kv_heads, int64_t sq, int64_t num_splits) {
    AttentionSpec s = make_spec(2, heads, kv_heads, sq, 300, 64, 64, bf16, bhsd);
    s.window = {100, 0};
    s.lse = true;
    s.num_splits = num_splits;
    return s;
  };
  auto attn = Attention::create(shape_of(4, 4, 1, 0), "emulator:gfx1201", emulator_options());
  ASSERT_TRUE(attn) << attn.status().message();
  forward_matches(*attn, shape_of(4, 4, 1, 0), 21);  // MHA: not packed
  forward_matches(*attn, shape_of(16, 4, 1, 3), 22); // GQA 4:1, one token
  forward_matches(*attn, shape_of(12, 2, 5, 1), 23); // GQA 6:1, five tokens
  EXPECT_NE(attn->explain().find("2 as grouped rows"), std::string::npos) << attn->explain();
}

TEST(SplitKvAttention, GqaPackingKeepsWhatDependsOnTheHead) {
  // One token with a mask tensor: the view by strides, causal dropped.
  AttentionSpec s = make_spec(2, 8, 2, 1, 100, 64, 64, bf16);
  s.causal = true;
  s.mask = MaskType::boolean;
  s.mask_strides = dense_mask_strides("bhqk", 2, 8, 1, 100).value();
  auto packed = gqa_packed_decode(s);
  ASSERT_TRUE(packed);
  EXPECT_EQ(packed->heads, 2);
  EXPECT_EQ(packed->seqlen_q, 4);
  EXPECT_FALSE(packed->causal);
  EXPECT_EQ(packed->q_group, 1);
  // Q's row (b, h = kv * 4 + g, 0) is the packed row (b, kv, g): the same element.
  for (int64_t h = 0; h < 8; ++h)
    EXPECT_EQ(h * s.q.head, h / 4 * packed->q.head + h % 4 * packed->q.seq);
  EXPECT_EQ(packed->mask_strides.q, s.mask_strides.head);
  EXPECT_TRUE(packed->validate()) << packed->validate().message();
  const auto refused = [&](auto change) {
    AttentionSpec t = s;
    change(t);
    return !gqa_packed_decode(t).has_value();
  };
  EXPECT_TRUE(refused([](AttentionSpec &t) { t.window = {50, -1}; }));
  EXPECT_TRUE(refused([](AttentionSpec &t) { t.sinks = true; })); // rows by strides: no head
  EXPECT_TRUE(refused([](AttentionSpec &t) { // a mask tensor with several tokens
    t.seqlen_q = 2;
    t.mask_strides = dense_mask_strides("bhqk", 2, 8, 2, 100).value();
  }));
  // Without a mask tensor: grouped rows, whatever the count of tokens up to
  // kMaxPackedTokens; what reads a row's head or position is not packed.
  s.mask = MaskType::none;
  EXPECT_EQ(gqa_packed_decode(s)->q_group, 4);
  EXPECT_TRUE(gqa_packed_decode(s)->causal);
  EXPECT_FALSE(refused([](AttentionSpec &t) { t.window = {50, -1}; }));
  EXPECT_TRUE(refused([](AttentionSpec &t) { t.seqlen_q = kMaxPackedTokens + 1; }));
  EXPECT_TRUE(refused([](AttentionSpec &t) { t.kv_heads = 8; }));
  EXPECT_TRUE(refused([](AttentionSpec &t) { t.alibi = Alibi::heads; }));
  EXPECT_TRUE(refused([](AttentionSpec &t) { t.score_mod = "score + h"; }));
  EXPECT_TRUE(refused([](AttentionSpec &t) { t.mask_mod = "q_idx >= 0"; }));
  EXPECT_TRUE(refused([](AttentionSpec &t) { t.dropout_p = 0.1; }));
  EXPECT_FALSE(refused([](AttentionSpec &t) { t.sinks = true; })); // the combine's
  EXPECT_FALSE(refused([](AttentionSpec &t) { t.softcap = 30; }));
  // Row r of KV head kv is head kv * 4 + r % 4 of token r / 4, in both layouts;
  // causal and a window stay (on the token).
  for (Layout layout : {Layout::bshd, Layout::bhsd}) {
    AttentionSpec m = make_spec(2, 8, 2, 5, 100, 64, 64, bf16, layout);
    m.causal = true;
    m.window = {30, 0};
    auto grouped = gqa_packed_decode(m);
    ASSERT_TRUE(grouped);
    EXPECT_EQ(grouped->heads, 2);
    EXPECT_EQ(grouped->seqlen_q, 20);
    EXPECT_EQ(grouped->q_group, 4);
    EXPECT_TRUE(grouped->causal);
    EXPECT_EQ(grouped->window, m.window);
    EXPECT_TRUE(grouped->signature().grouped_q);
    for (const auto &[user, view] : {std::pair{m.q, grouped->q}, std::pair{m.o, grouped->o}})
      for (int64_t h = 0; h < 8; ++h)
        for (int64_t token = 0; token < 5; ++token) {
          const int64_t r = token * 4 + h % 4;
          EXPECT_EQ(h * user.head + token * user.seq,
                    h / 4 * view.head + r / 4 * view.seq + r % 4 * view.group);
        }
    EXPECT_TRUE(grouped->validate()) << grouped->validate().message();
    AttentionSpec masked = m;
    masked.mask = MaskType::boolean;
    masked.mask_strides = dense_mask_strides("bhqk", 2, 8, 5, 100).value();
    EXPECT_FALSE(gqa_packed_decode(masked).has_value());
  }
}

// A spec with grouped query rows is refused where the rows could not be
// grouped: a q_group that does not divide seqlen_q, or a feature that reads a
// row's head or position.
TEST(SplitKvAttention, GroupedRowsAreRefusedWhereTheyCannotBe) {
  AttentionSpec s = make_spec(1, 2, 2, 6, 100, 64, 64, bf16);
  s.q_group = 4;
  Status st = s.validate();
  ASSERT_FALSE(st);
  EXPECT_NE(st.message().find("q_group (4) must be 1, or divide seqlen_q (6)"), std::string::npos)
      << st.message();
  s.q_group = 3;
  s.alibi = Alibi::heads;
  st = s.validate();
  ASSERT_FALSE(st);
  EXPECT_NE(st.message().find("ALiBi"), std::string::npos) << st.message();
}

TEST(SplitKvAttention, TooManySplitsIsRefused) {
  AttentionSpec spec = make_spec(1, 2, 2, 1, 100, 64, 64, bf16);
  spec.num_splits = kMaxSplits + 1;
  const Status s = spec.validate();
  ASSERT_FALSE(s);
  EXPECT_NE(s.message().find("num_splits"), std::string::npos) << s.message();
}
