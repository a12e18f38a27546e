// Score modifiers (issue 14, first step): the expression language of ir/expr.h
// and the spec's softcap, ALiBi, score_mod and mask_mod, against the float64
// reference (which applies softcap and ALiBi by their formulas, independently of
// the expression machinery):
//
//   * expressions: canonical printing, types, errors with the column;
//   * the interpreter and the emulator (every AMD family and the simt rules):
//     softcap, ALiBi [heads] and [batch, heads] with causal and sq != sk, a user
//     score_mod, document and sliding masks as mask_mod, a mask that hides every
//     key (output 0, LSE -inf), modifiers over varlen batches;
//   * flashjit::Attention on the emulator: the slopes are a per-call argument.
//
// Tolerances: tolerance_for(dtype), as every forward test.
#include "ir/build.h"
#include "ir/expr.h"
#include "ir/interpreter.h"
#include "lowering/lower.h"
#include "runtime/attention.h"
#include "runtime/emulator.h"
#include "tests/support/describe.h"
#include "tests/support/sequences.h"

#include <gtest/gtest.h>

#include <array>
#include <cmath>

using namespace flashjit;

namespace {

using test::describe;

void expect_matches_reference(const AttentionSpec &spec, const HostTensors &t) {
  const Tolerance tol = tolerance_for(spec.dtype);
  const ErrorStats err = compare(spec, t, reference_attention(spec, t));
  EXPECT_TRUE(err.within(tol.abs, tol.rel)) << describe(err, tol);
}

// ---- the expression language -------------------------------------------------

TEST(ScoreExpr, PrintsCanonicallyWithCPrecedence) {
  const ir::ExprScope scope{{{"softcap", false}}, {"bias"}};
  auto e = ir::parse_expr("softcap*tanh(score/softcap) - bias[h]*abs(q_idx-kv_idx) + 1 % 3 * 2",
                          scope, "score_mod");
  ASSERT_TRUE(e) << e.status().message();
  const std::string text = ir::print_expr(*e);
  EXPECT_EQ(text, "(((softcap * tanh((score / softcap))) - (bias[h] * abs((q_idx - kv_idx)))) + "
                  "((1 % 3) * 2))");
  auto again = ir::parse_expr(text, scope, "score_mod");
  ASSERT_TRUE(again);
  EXPECT_EQ(ir::print_expr(*again), text);
  EXPECT_FALSE(e->is_int);
  auto mask = ir::parse_expr("q_idx >= kv_idx && !(kv_idx < 3) || b == 1 ? 1 : 0", {}, "mask_mod");
  ASSERT_TRUE(mask) << mask.status().message();
  EXPECT_TRUE(mask->is_int);
  ir::ExprContext c;
  c.q_idx = 5;
  c.kv_idx = 4;
  EXPECT_EQ(ir::evaluate(*mask, c), 1);
  c.kv_idx = 2;
  EXPECT_EQ(ir::evaluate(*mask, c), 0);
  c.b = 1;
  EXPECT_EQ(ir::evaluate(*mask, c), 1);
}

TEST(ScoreExpr, ErrorsNameTheColumnAndTheFix) {
  struct Bad {
    const char *text, *message;
  };
  for (const Bad &bad :
       {Bad{"score + scroe", "column 9: unknown name 'scroe'"},
        Bad{"score % 2", "'%' takes integers"},
        Bad{"tanh(score", "expected ')' after the arguments of tanh"},
        Bad{"score +", "expected a value, found the end"},
        Bad{"q_idx >= kv_idx )", "unexpected ')'"}, Bad{"bias[h]", "unknown name 'bias'"},
        Bad{"1e999", "not a number the kernels hold"}}) {
    auto e = ir::parse_expr(bad.text, {}, "score_mod");
    ASSERT_FALSE(e) << bad.text;
    EXPECT_NE(e.status().message().find(bad.message), std::string::npos)
        << bad.text << ": " << e.status().message();
  }
}

TEST(ScoreExpr, FuzzDeepNestingAndLongChainsAreRefused) {
  // Found by tests/fuzz/fuzz_spec_flags: `--score-mod` with a few hundred '('
  // (or '-') overflowed the stack of the recursive parser; a long chain of
  // binary operators would do the same to the printer and the evaluator.
  for (const std::string &deep :
       {std::string(100000, '(') + "score", std::string(100000, '-') + "score",
        std::string(65, '(') + "score" + std::string(65, ')'), "abs(" + std::string(64, '(')}) {
    auto e = ir::parse_expr(deep, {}, "score_mod");
    ASSERT_FALSE(e);
    EXPECT_NE(e.status().message().find("nested more than 64 deep"), std::string::npos)
        << e.status().message().substr(0, 200);
  }
  std::string chain = "score";
  for (int i = 0; i < 1025; ++i)
    chain += " + 1";
  auto e = ir::parse_expr(chain, {}, "score_mod");
  ASSERT_FALSE(e);
  EXPECT_NE(e.status().message().find("more than 1024 operators"), std::string::npos);
  // What a score needs still parses.
  EXPECT_TRUE(ir::parse_expr(std::string(60, '(') + "score" + std::string(60, ')'), {}, "s"));
  chain.resize(chain.size() - 4);
  EXPECT_TRUE(ir::parse_expr(chain, {}, "score_mod"));
}

TEST(ScoreExpr, UniformIsPhiloxAndUniform) {
  // Random123's known answers for philox4x32_10 (the draws take the same
  // rounds, ir::kDrawRounds of them).
  using A4 = std::array<uint32_t, 4>;
  EXPECT_EQ(ir::philox4x32({0, 0, 0, 0}, {0, 0}, 10),
            (A4{0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}));
  EXPECT_EQ(ir::philox4x32({~0u, ~0u, ~0u, ~0u}, {~0u, ~0u}, 10),
            (A4{0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}));
  EXPECT_EQ(ir::philox4x32({0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344},
                           {0xa4093822, 0x299f31d0}, 10),
            (A4{0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}));
  // Draws in [0, 1): 1 in 5 below 0.2 over 2^16 elements, another offset another stream.
  int below = 0, same = 0;
  for (uint32_t i = 0; i < 256; ++i)
    for (uint32_t j = 0; j < 256; ++j) {
      const double u = ir::philox_uniform(42, 0, 1, 3, i, j);
      ASSERT_TRUE(u >= 0 && u < 1);
      below += u < 0.2;
      same += (u < 0.2) == (ir::philox_uniform(42, 1, 1, 3, i, j) < 0.2);
    }
  EXPECT_NEAR(below / 65536.0, 0.2, 0.01);
  EXPECT_NEAR(same / 65536.0, 0.8 * 0.8 + 0.2 * 0.2, 0.01); // independent patterns
  // One draw serves 8 aligned keys, 16 bits each: key 8 * 5 + 3 of query 6 is
  // the high half of word 1 of the counter (5, 6, h, b).
  const std::array<uint32_t, 4> words =
      ir::philox4x32({5, 6, 3, 1}, ir::philox_key(42, 0), ir::kDrawRounds);
  EXPECT_EQ(ir::philox_uniform(42, 0, 1, 3, 6, 43), double(words[1] >> 16) / 65536.0);
  EXPECT_EQ(ir::philox_uniform(42, 0, 1, 3, 6, 40), double(words[0] & 0xFFFF) / 65536.0);
  // The keys of one draw are independent of each other: neighbours in one
  // draw, and across the draws' boundary, are both below 0.2 1 time in 25.
  int both_inside = 0, both_across = 0;
  for (uint32_t i = 0; i < 4096; ++i)
    for (uint32_t j = 0; j < 64; j += 8) {
      both_inside += ir::philox_uniform(7, 0, 0, 0, i, j + 2) < 0.2 &&
                     ir::philox_uniform(7, 0, 0, 0, i, j + 3) < 0.2;
      both_across += ir::philox_uniform(7, 0, 0, 0, i, j + 7) < 0.2 &&
                     ir::philox_uniform(7, 0, 0, 0, i, j + 8) < 0.2;
    }
  EXPECT_NEAR(both_inside / 32768.0, 0.04, 0.005);
  EXPECT_NEAR(both_across / 32768.0, 0.04, 0.005);
  const ir::ExprScope scope{{{"seed", true}}, {}};
  auto e = ir::parse_expr("uniform(seed, 7, b, h, q_idx, kv_idx) < 0.5 ? score : 0.0", scope, "s");
  ASSERT_TRUE(e) << e.status().message();
  ir::ExprContext c;
  c.scalar = [](const std::string &) { return 42.0; };
  c.b = 1;
  c.h = 3;
  c.q_idx = 5;
  c.kv_idx = 9;
  c.score = 2.0;
  EXPECT_EQ(ir::evaluate(*e, c), ir::philox_uniform(42, 7, 1, 3, 5, 9) < 0.5 ? 2.0 : 0.0);
  auto bad = ir::parse_expr("uniform(1, 2, b, h, q_idx, score)", {}, "s");
  ASSERT_FALSE(bad);
  EXPECT_NE(bad.status().message().find("uniform takes integers"), std::string::npos);
}

TEST(ScoreModLowering, DropoutDrawsOncePerEightKeysOnEveryFamily) {
  // How many Philox draws a lane makes per 8 accumulator elements is the
  // dropout's cost: the emitter shares each draw between the elements and the
  // lanes that hold its 8 keys (KernelEmitter::draw_plan), which pass each
  // other 8 keep bits per draw where 8 lanes share a draw (dropout only
  // compares its draws), just the word each reads where that is one word
  // (NVIDIA's quads), else the draws' words. Correctness of the exchange is
  // the emulator cases' (dropout_* and uniform_* above, backward_test's) and,
  // for NVIDIA's, the CUDA dropout tests (python/tests/test_dropout.py).
  AttentionSpec spec = make_spec(1, 2, 2, 128, 128, 128, 128, DType::bf16);
  spec.dropout_p = 0.1;
  struct Want {
    const char *arch;
    const char *forward, *dkdv; // the plan's comment, or "" for lane-local draws
  };
  const Want wants[] = {
      {"sm_90",
       "lanes differing in bits 0x3 hold the same 4 draws, each lane draws 1 and they pass each "
       "other the word each reads (word 0, 1, 2, 3 by rank)",
       "lanes differing in bits 0x1c hold the same 8 draws: each lane draws 1, makes"},
      {"gfx1201", "",
       "lanes differing in bits 0x7 hold the same 8 draws: each lane draws 1, makes"},
      {"gfx1100", "lanes differing in bits 0x10 hold the same 2 draws, each lane draws 1 and they",
       "lanes differing in bits 0x7 hold the same 8 draws: each lane draws 1, makes"},
      {"gfx942", "lanes differing in bits 0x20 hold the same 4 draws, each lane draws 2 and they",
       "lanes differing in bits 0x7 hold the same 8 draws: each lane draws 1, makes"},
  };
  for (const Want &want : wants) {
    SCOPED_TRACE(want.arch);
    auto target = lowering::parse_target(want.arch);
    ASSERT_TRUE(target);
    const ir::Config config = lowering::default_config(spec, *target);
    auto forward = lowering::generate(spec, config, *target);
    ASSERT_TRUE(forward) << forward.status().message();
    auto dkdv_program =
        ir::build_backward_dkdv(spec, lowering::backward_config(spec, *target, config, true));
    ASSERT_TRUE(dkdv_program) << dkdv_program.status().message();
    auto dkdv = lowering::lower(*dkdv_program, *target);
    ASSERT_TRUE(dkdv) << dkdv.status().message();
    for (auto [source, plan] :
         {std::pair(&forward->source, want.forward), std::pair(&dkdv->source, want.dkdv)}) {
      EXPECT_NE(source->find("fj_philox_key("), std::string::npos);
      if (*plan)
        EXPECT_NE(source->find(plan), std::string::npos) << plan;
      else // every element's draw from the lane's own: one draw of 8 elements
        EXPECT_NE(source->find("// draw 0 of the round: elements (c, e) (0, 0) (0, 1) (0, 2) "
                               "(0, 3) (0, 4) (0, 5) (0, 6) (0, 7)"),
                  std::string::npos);
    }
  }
  // A draw read other than by `>= threshold` is turned into a float, from the
  // words passed round (gfx1100) or the one word each lane reads (sm_90).
  spec.dropout_p = 0;
  spec.score_mod = "score + 0.5 * uniform(3, 1, b, h, q_idx, kv_idx)";
  for (auto [arch, plan, slot] :
       {std::tuple("gfx1100", "hold the same 2 draws, each lane draws 1 and they pass them round",
                   "fj_draw_slot(fj_draw0"),
        std::tuple("sm_90", "hold the same 4 draws, each lane draws 1 and they pass each other",
                   "fj_word_slot(fj_word0")}) {
    SCOPED_TRACE(arch);
    auto target = lowering::parse_target(arch);
    ASSERT_TRUE(target);
    auto k = lowering::generate(spec, lowering::default_config(spec, *target), *target);
    ASSERT_TRUE(k) << k.status().message();
    EXPECT_NE(k->source.find(plan), std::string::npos);
    EXPECT_NE(k->source.find(slot), std::string::npos);
    EXPECT_EQ(k->source.find("fj_threshold0"), std::string::npos);
  }
}

TEST(ScoreModLowering, Sm90DropoutDkdvKeepsThreeWorkgroupsPerSm) {
  // The draws would take sm_90's dK/dV kernel past 168 registers where its LDS
  // lets three workgroups share an SM (up to head dim 64): bounded to three
  // (KernelEmitter::nvidia_min_blocks). At 128 the LDS allows two: no bound.
  auto sm90 = lowering::parse_target("sm_90");
  ASSERT_TRUE(sm90);
  for (auto [d, dropout, bounded] : {std::tuple(64, 0.1, true), std::tuple(48, 0.2, true),
                                     std::tuple(64, 0.0, false), std::tuple(128, 0.1, false)}) {
    SCOPED_TRACE(testing::Message() << "head dim " << d << " dropout " << dropout);
    AttentionSpec spec = make_spec(1, 2, 2, 128, 128, d, d, DType::bf16);
    spec.dropout_p = dropout;
    const ir::Config config = lowering::default_config(spec, *sm90);
    auto program =
        ir::build_backward_dkdv_direct(spec, lowering::backward_config(spec, *sm90, config, true));
    ASSERT_TRUE(program) << program.status().message();
    auto k = lowering::lower(*program, *sm90);
    ASSERT_TRUE(k) << k.status().message();
    EXPECT_EQ(k->source.find("FJ_WORKGROUP_SIZE_MIN_BLOCKS(128, 3)") != std::string::npos, bounded);
  }
}

TEST(ScoreModSpec, ValidationNamesTheField) {
  AttentionSpec s = make_spec(1, 2, 2, 8, 8, 64, 64, DType::bf16);
  s.softcap = -1;
  EXPECT_NE(s.validate().message().find("softcap (-1)"), std::string::npos);
  s.softcap = 0;
  s.mask_mod = "score > 0";
  EXPECT_NE(s.validate().message().find("mask_mod \"score > 0\" reads score"), std::string::npos)
      << s.validate().message();
  s.mask_mod = "q_idx >= kv_idx";
  s.sinks = true;
  s.num_splits = 4; // split-KV's combine counts the sinks (session 28)
  EXPECT_TRUE(s.validate()) << s.validate().message();
  s.num_splits = 0;
  s.dropout_p = 1.0;
  EXPECT_NE(s.validate().message().find("dropout_p (1) must be in [0, 1)"), std::string::npos)
      << s.validate().message();
  s.dropout_p = 0.1;
  s.dropout_seed = uint64_t(1) << 60;
  EXPECT_NE(s.validate().message().find("must be below 2^53"), std::string::npos);
  s.dropout_seed = 0;
  s.score_mod = "score * (1 + )";
  EXPECT_NE(s.validate().message().find("score_mod, column 14"), std::string::npos)
      << s.validate().message();
}

// ---- numeric cases -----------------------------------------------------------

struct ModCase {
  const char *name;
  int64_t b, hq, hkv, sq, sk, d;
  DType dtype;
  bool causal;
  Window window;
  double softcap;
  Alibi alibi;
  const char *score_mod, *mask_mod;
  bool sinks = false;
  // A mask tensor (AttentionSpec::mask), dense over these axes of bhqk.
  MaskType mask = MaskType::none;
  const char *mask_axes = "bhqk";
  double dropout_p = 0; // with seed 1234 + the case's batch, offset 7
};

void PrintTo(const ModCase &c, std::ostream *os) { *os << c.name; }

constexpr Window kNoWindow{-1, -1};
const ModCase kCases[] = {
    {"softcap", 2, 4, 2, 70, 70, 64, DType::bf16, false, kNoWindow, 3.5, Alibi::none, "", ""},
    {"softcap_causal_f16", 1, 4, 4, 33, 90, 80, DType::f16, true, kNoWindow, 0.8, Alibi::none, "",
     ""},
    {"alibi_heads_causal", 1, 8, 2, 40, 100, 64, DType::bf16, true, kNoWindow, 0, Alibi::heads, "",
     ""},
    {"alibi_batch_heads_window", 2, 4, 1, 50, 50, 72, DType::f16, false, Window{20, 5}, 0,
     Alibi::batch_heads, "", ""},
    {"softcap_alibi_score_mod", 1, 4, 2, 30, 64, 64, DType::bf16, true, kNoWindow, 5.0,
     Alibi::heads, "score + 0.25 * (q_idx % 3) - 0.01 * (kv_idx - h)", ""},
    {"document_mask", 2, 2, 2, 96, 96, 64, DType::bf16, false, kNoWindow, 0, Alibi::none, "",
     "q_idx / 40 == kv_idx / 40"},
    {"sliding_mask_mod", 1, 2, 1, 80, 80, 96, DType::f16, false, kNoWindow, 0, Alibi::none, "",
     "q_idx >= kv_idx && q_idx - kv_idx < 17"},
    {"mask_hides_every_key", 1, 2, 2, 20, 40, 64, DType::bf16, false, kNoWindow, 0, Alibi::none, "",
     "kv_idx < 0"},
    // Long enough that the block-range pass skips KV blocks at both ends of the
    // loop (and, for the chunks, whole blocks around the diagonal's).
    {"block_range_window", 1, 2, 2, 300, 260, 64, DType::bf16, false, kNoWindow, 0, Alibi::none, "",
     "abs(q_idx - kv_idx) <= 40"},
    {"block_range_chunks_causal", 2, 2, 1, 200, 200, 48, DType::f16, true, kNoWindow, 0,
     Alibi::none, "", "q_idx / 50 == kv_idx / 50"},
    {"block_range_prefix_lm", 1, 2, 2, 210, 210, 64, DType::bf16, false, kNoWindow, 0, Alibi::none,
     "", "kv_idx < 24 || kv_idx <= q_idx"},
    // Holes between visible blocks (skipped) and blocks wholly inside the mask
    // (the full-block path), with a score_mod under the mask.
    {"block_sparse_holes", 1, 2, 1, 300, 300, 64, DType::bf16, false, kNoWindow, 0, Alibi::none,
     "score * 0.5 + 0.01 * (kv_idx % 7)",
     "(q_idx / 64 + kv_idx / 64) % 3 != 1 || q_idx / 64 == kv_idx / 64"},
    {"mask_hides_some_rows", 1, 2, 2, 20, 40, 64, DType::bf16, true, kNoWindow, 0, Alibi::none,
     "score * 2", "q_idx % 2 == 0"},
    {"sinks_causal_gqa", 2, 8, 2, 37, 80, 64, DType::bf16, true, kNoWindow, 0, Alibi::none, "", "",
     true},
    {"sinks_softcap_window_f16", 1, 4, 4, 50, 50, 80, DType::f16, false, Window{8, 8}, 4.0,
     Alibi::none, "", "", true},
    {"sinks_every_key_hidden", 1, 2, 1, 20, 40, 64, DType::bf16, false, kNoWindow, 0, Alibi::none,
     "", "kv_idx < 0", true},
    // Mask tensors (SDPA's attn_mask): random bools (1 in 4 false) or values in
    // [-2, 1) with 1 in 5 -inf, broadcast by 0 strides over the axes they lack.
    {"bool_mask_bhqk_gqa", 2, 4, 2, 45, 70, 64, DType::bf16, false, kNoWindow, 0, Alibi::none, "",
     "", false, MaskType::boolean},
    {"bool_key_padding_causal", 2, 2, 1, 40, 90, 72, DType::f16, true, kNoWindow, 0, Alibi::none,
     "", "", false, MaskType::boolean, "bk"},
    {"additive_f32_qk_sq_gt_sk", 1, 4, 4, 90, 33, 64, DType::bf16, false, kNoWindow, 0, Alibi::none,
     "", "", false, MaskType::f32, "qk"},
    {"additive_f16_hqk_window", 1, 2, 2, 64, 64, 48, DType::f16, false, Window{10, 3}, 0,
     Alibi::none, "", "", false, MaskType::f16, "hqk"},
    {"additive_bf16_softcap_alibi_mods", 2, 2, 1, 30, 50, 64, DType::bf16, true, kNoWindow, 3.0,
     Alibi::heads, "score * 0.5", "q_idx % 3 != 1", false, MaskType::bf16, "bqk"},
    {"additive_f32_sinks_d100", 1, 2, 2, 25, 60, 100, DType::bf16, false, kNoWindow, 0, Alibi::none,
     "", "", true, MaskType::f32, "bhqk"},
    // Dropout: the float64 reference draws the same Philox elements and drops them
    // after the row sums, as the kernels must.
    {"dropout_gqa", 2, 4, 2, 50, 70, 64, DType::bf16, false, kNoWindow, 0, Alibi::none, "", "",
     false, MaskType::none, "", 0.2},
    {"dropout_causal_softcap_f16", 1, 2, 1, 70, 40, 80, DType::f16, true, kNoWindow, 5.0,
     Alibi::none, "", "", false, MaskType::none, "", 0.5},
    {"dropout_bool_mask_sinks", 1, 4, 4, 33, 64, 64, DType::bf16, false, kNoWindow, 0, Alibi::none,
     "", "", true, MaskType::boolean, "bk", 0.1},
    // A user's draws: compared with a threshold (as integers, as dropout's), and
    // in arithmetic (as floats).
    {"uniform_mask_mod_threshold", 1, 4, 2, 45, 80, 64, DType::bf16, true, kNoWindow, 0,
     Alibi::none, "", "uniform(5, 2, b, h, q_idx, kv_idx) >= 0.3"},
    {"uniform_score_mod_words", 2, 2, 1, 40, 70, 64, DType::f16, false, kNoWindow, 0, Alibi::none,
     "score + 0.5 * uniform(3, 1, b, h, q_idx, kv_idx)", ""},
};

AttentionSpec spec_of(const ModCase &c) {
  AttentionSpec s = make_spec(c.b, c.hq, c.hkv, c.sq, c.sk, c.d, c.d, c.dtype);
  s.causal = c.causal;
  s.window = c.window;
  s.softcap = c.softcap;
  s.alibi = c.alibi;
  s.score_mod = c.score_mod;
  s.mask_mod = c.mask_mod;
  s.sinks = c.sinks;
  s.lse = true;
  if (c.mask != MaskType::none) {
    s.mask = c.mask;
    s.mask_strides =
        dense_mask_strides(c.mask_axes, s.batch, s.heads, s.seqlen_q, s.seqlen_k).value();
  }
  s.dropout_p = c.dropout_p;
  s.dropout_seed = 1234 + uint64_t(c.b);
  s.dropout_offset = 7;
  return s;
}

class ScoreModInterpreter : public testing::TestWithParam<ModCase> {};

TEST_P(ScoreModInterpreter, MatchesFloat64) {
  const AttentionSpec spec = spec_of(GetParam());
  ASSERT_TRUE(spec.validate()) << spec.validate().message();
  ir::Config config;
  config.block_m = 16;
  config.block_n = 32;
  auto p = ir::build_attention(spec, config);
  ASSERT_TRUE(p) << p.status().message();
  auto back = ir::parse(ir::print(*p)); // the function line round-trips
  ASSERT_TRUE(back) << back.status().message();
  EXPECT_EQ(ir::print(*back), ir::print(*p));
  HostTensors t = make_random_inputs(spec, 5);
  Status s = ir::interpret(*p, ir::bind_attention(spec), t);
  ASSERT_TRUE(s) << s.message();
  expect_matches_reference(spec, t);
}

INSTANTIATE_TEST_SUITE_P(Cases, ScoreModInterpreter, testing::ValuesIn(kCases),
                         [](const auto &info) { return std::string(info.param.name); });

struct Lowering {
  const char *arch;
  lowering::RulesChoice choice;
};
constexpr auto automatic = lowering::RulesChoice::automatic;
const Lowering kLowerings[] = {{"gfx1201", automatic}, {"gfx1100", automatic},
                               {"gfx942", automatic},  {"gfx90a", automatic},
                               {"gfx950", automatic},  {"gfx1201", lowering::RulesChoice::simt}};

class ScoreModEmulator : public testing::TestWithParam<std::tuple<Lowering, ModCase>> {};

TEST_P(ScoreModEmulator, MatchesFloat64) {
  const auto &[how, c] = GetParam();
  auto t = lowering::parse_target(how.arch);
  ASSERT_TRUE(t) << t.status().message();
  const AttentionSpec spec = spec_of(c);
  auto program = ir::build_attention(spec, lowering::default_config(spec, *t, how.choice));
  ASSERT_TRUE(program) << program.status().message();
  auto kernel = lowering::lower(*program, *t, how.choice);
  ASSERT_TRUE(kernel) << kernel.status().message();
  HostTensors tensors = make_random_inputs(spec, 9);
  Status s = runtime::emulate(*kernel, *t, spec, tensors, {.threads = 2});
  ASSERT_TRUE(s) << s.message();
  expect_matches_reference(spec, tensors);
}

INSTANTIATE_TEST_SUITE_P(Families, ScoreModEmulator,
                         testing::Combine(testing::ValuesIn(kLowerings), testing::ValuesIn(kCases)),
                         [](const auto &info) {
                           const Lowering &l = std::get<0>(info.param);
                           return fmt::format("{}{}_{}", l.arch,
                                              l.choice == lowering::RulesChoice::simt ? "_simt"
                                                                                      : "",
                                              std::get<1>(info.param).name);
                         });

// Modifiers over a varlen batch: q_idx and kv_idx count from each sequence's start.
TEST(ScoreModSequences, AlibiAndAMaskOverVarlenBatches) {
  test::SeqInputs in = test::make_seq_inputs(test::seq_cases()[1], 3); // varlen, window, MQA
  in.spec.alibi = Alibi::heads;
  in.spec.mask_mod = "(q_idx + kv_idx) % 5 != 0";
  in.tensors.alibi_slopes = {0.5f, 0.25f, 0.125f, 0.0625f};
  auto t = lowering::parse_target("gfx942");
  ASSERT_TRUE(t);
  auto program = ir::build_attention(in.spec, lowering::default_config(in.spec, *t, automatic));
  ASSERT_TRUE(program) << program.status().message();
  auto kernel = lowering::lower(*program, *t, automatic);
  ASSERT_TRUE(kernel) << kernel.status().message();
  HostTensors interpreted = in.tensors;
  ASSERT_TRUE(runtime::emulate(*kernel, *t, in.spec, in.tensors, {.threads = 2}));
  expect_matches_reference(in.spec, in.tensors);
  ASSERT_TRUE(ir::interpret(*program, ir::bind_attention(in.spec), interpreted));
  expect_matches_reference(in.spec, interpreted);
}

// Through Attention: the slopes are per call; a call without them is refused.
TEST(ScoreModAttention, SlopesArePerCallArguments) {
  AttentionSpec spec = make_spec(2, 4, 2, 17, 45, 64, 64, DType::bf16);
  spec.causal = true;
  spec.softcap = 2.0;
  spec.alibi = Alibi::batch_heads;
  Options options;
  options.compiler = "none";
  options.cpu_threads = 2;
  auto attn = Attention::create(spec, "emulator:gfx1201", options);
  ASSERT_TRUE(attn) << attn.status().message();
  for (double cap : {2.0, 30.0}) {
    AttentionSpec shape = spec;
    shape.softcap = cap; // a run-time value: the same kernel
    HostTensors t = make_random_inputs(shape, uint64_t(cap));
    std::vector<uint16_t> q(t.q.size()), k(t.k.size()), v(t.v.size()), o(t.o.size(), 0x7fff);
    for (auto [from, to] : {std::pair{&t.q, &q}, std::pair{&t.k, &k}, std::pair{&t.v, &v}})
      for (size_t i = 0; i < from->size(); ++i)
        (*to)[i] = uint16_t(to_bits(shape.dtype, (*from)[i]));
    AttentionTensors a{q.data(), k.data(), v.data(), o.data()};
    a.alibi_slopes = t.alibi_slopes.data();
    Status s = attn->forward(shape, a);
    ASSERT_TRUE(s) << s.message();
    for (size_t i = 0; i < o.size(); ++i)
      t.o[i] = from_bits(shape.dtype, o[i]);
    expect_matches_reference(shape, t);
    a.alibi_slopes = nullptr;
    s = attn->forward(shape, a);
    ASSERT_FALSE(s);
    EXPECT_NE(s.message().find("alibi_slopes is null but the spec has ALiBi: pass 8 f32 slopes"),
              std::string::npos)
        << s.message();
  }
  EXPECT_NE(attn->explain().find("2 forward calls"), std::string::npos) << attn->explain();
}

} // namespace
