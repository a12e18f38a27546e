// build_attention(): every program it makes verifies and survives the text
// round trip byte for byte; bad configs are rejected with a clear message.
#include "ir/build.h"

#include <gtest/gtest.h>

using namespace flashjit;

namespace {

std::vector<AttentionSpec> specs() {
  std::vector<AttentionSpec> out;
  for (Layout layout : {Layout::bshd, Layout::bhsd, Layout::interleaved})
    for (DType t : {DType::bf16, DType::f16})
      for (int64_t d : {1, 40, 80, 100, 128, 200, 256, 512})
        for (bool causal : {false, true}) {
          AttentionSpec s =
              make_spec(2, 8, causal ? 2 : 8, 113, 203, d, d == 512 ? 64 : d, t, layout);
          s.causal = causal;
          s.lse = causal;
          if (!causal)
            s.window = Window{16, 4};
          out.push_back(s);
        }
  return out;
}

TEST(BuildAttention, EveryProgramVerifiesAndRoundTrips) {
  int n = 0;
  for (const AttentionSpec &spec : specs())
    for (ir::Config c : {ir::Config{}, ir::Config{32, 16, 2, 1, false, 16},
                         ir::Config{128, 64, 8, 2, false, 32}}) {
      auto p = ir::build_attention(spec, c);
      ASSERT_TRUE(p) << spec.summary() << ": " << p.status().message();
      ASSERT_TRUE(ir::verify(*p)) << ir::verify(*p).message();
      const std::string text = ir::print(*p);
      auto parsed = ir::parse(text);
      ASSERT_TRUE(parsed) << parsed.status().message() << "\n" << text;
      EXPECT_EQ(ir::print(*parsed), text) << spec.summary();
      ASSERT_TRUE(ir::verify(*parsed));
      ++n;
    }
  EXPECT_GT(n, 200);
}

TEST(BuildAttention, PrintsTheConfigItWasBuiltWith) {
  AttentionSpec s = make_spec(1, 1, 1, 17, 17, 64, 64, DType::f16);
  auto p = ir::build_attention(s, ir::Config{32, 16, 2, 1, false, 16});
  ASSERT_TRUE(p);
  EXPECT_NE(ir::print(*p).find("config {block_m = 32, block_n = 16, pad_k = 16, q_in_lds = 0, "
                               "stages = 1, waves = 2}"),
            std::string::npos);
}

TEST(BuildAttention, PadsHeadDimsInRegistersOnly) {
  AttentionSpec s = make_spec(1, 1, 1, 17, 17, 72, 40, DType::bf16);
  auto p = ir::build_attention(s, ir::Config{});
  ASSERT_TRUE(p);
  // The tiles are padded to the matrix K (16); the tensors keep their real dims.
  EXPECT_EQ(p->tensor("Q")->dim, 72);
  EXPECT_EQ(p->tensor("V")->dim, 40);
  const std::string text = ir::print(*p);
  EXPECT_NE(text.find("tile<64x80xbf16, #mma_a>"), std::string::npos) << text;
  EXPECT_NE(text.find("tile<64x48xbf16, #mma_b>"), std::string::npos) << text;
}

TEST(BuildAttention, RejectsBadSpecAndConfig) {
  AttentionSpec s = make_spec(1, 6, 4, 17, 17, 64, 64, DType::bf16);
  auto p = ir::build_attention(s, ir::Config{});
  ASSERT_FALSE(p);
  EXPECT_NE(p.status().message().find("kv_heads"), std::string::npos) << p.status().message();
  s = make_spec(1, 4, 4, 17, 17, 64, 64, DType::bf16);
  ir::Config c;
  c.block_n = 0;
  p = ir::build_attention(s, c);
  ASSERT_FALSE(p);
  EXPECT_NE(p.status().message().find("block_n"), std::string::npos) << p.status().message();
}

} // namespace
