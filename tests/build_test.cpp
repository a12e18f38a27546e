// build_attention(): every program it makes verifies and survives the text
// round trip byte for byte; the program is shape-free (its text depends only on
// the spec's signature and the config); bad configs are rejected with a clear
// message.
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
      // bind_attention gives every scalar the program declares a value of its type.
      const Status bound = ir::check_bindings(*p, ir::bind_attention(spec));
      ASSERT_TRUE(bound) << spec.summary() << ": " << bound.message();
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

// ---- shape-free programs ----------------------------------------------------------

/// bf16, d = 80/80, causal, a sliding window and LSE; bshd.
AttentionSpec base_spec() {
  AttentionSpec s = make_spec(1, 8, 2, 113, 203, 80, 80, DType::bf16, Layout::bshd);
  s.causal = true;
  s.window = Window{64, 0};
  s.lse = true;
  return s;
}

std::string program_text(const AttentionSpec &spec, const ir::Config &c = {}) {
  auto p = ir::build_attention(spec, c);
  EXPECT_TRUE(p) << spec.summary() << ": " << p.status().message();
  return p ? ir::print(*p) : "build failed: " + p.status().message();
}

TEST(BuildAttention, DeclaresShapesAsScalarParameters) {
  auto p = ir::build_attention(base_spec(), ir::Config{});
  ASSERT_TRUE(p);
  const ir::TensorParam &q = *p->tensor("Q"), &k = *p->tensor("K");
  EXPECT_EQ(q.batch, ir::Extent::of("batches"));
  EXPECT_EQ(q.heads, ir::Extent::of("heads"));
  EXPECT_EQ(k.heads, ir::Extent::of("kv_heads"));
  EXPECT_EQ(q.seq, ir::Extent::of("seqlen_q"));
  EXPECT_EQ(k.seq, ir::Extent::of("seqlen_k"));
  EXPECT_EQ(q.stride_seq, ir::Extent::of("q_seq_stride"));
  EXPECT_EQ(q.stride_dim, ir::Extent::constant(1)); // unit dim stride: part of the signature
  EXPECT_EQ(q.row_align, 16);
  EXPECT_EQ(p->grid[0].extent, ir::Extent::of("seqlen_q"));
  EXPECT_EQ(p->grid[0].divisor, 64);
  EXPECT_EQ(p->grid[1].extent, ir::Extent::of("heads"));
  EXPECT_EQ(p->grid[2].extent, ir::Extent::of("batches"));
  EXPECT_EQ(p->group, ir::Extent::of("group"));
  const std::string text = ir::print(*p);
  EXPECT_NE(text.find("{factor = %scale_log2}"), std::string::npos) << text;
  EXPECT_NE(text.find("{causal = 1, window_left = %window_left, window_right = %window_right}"),
            std::string::npos)
      << text;
  // No shape of the spec is in the text.
  for (const char *shape : {"113", "203"})
    EXPECT_EQ(text.find(shape), std::string::npos) << shape << " in\n" << text;
  // Without a window there are no window parameters and no window attrs.
  AttentionSpec global = base_spec();
  global.window = Window{};
  const std::string g = program_text(global);
  EXPECT_EQ(g.find("window"), std::string::npos) << g;
}

TEST(BuildAttention, TextIsByteIdenticalAcrossShapesOfOneSignature) {
  const AttentionSpec a = base_spec();
  // Every shape differs: batch, heads, kv_heads (group), seqlens, strides (another
  // layout of the same class, then padded rows), window sizes and scale.
  AttentionSpec b = make_spec(3, 4, 4, 4096, 7, 80, 80, DType::bf16, Layout::bhsd);
  b.causal = true;
  b.window = Window{2, 0};
  b.lse = true;
  b.scale = 0.5;
  AttentionSpec c = make_spec(2, 6, 1, 1, 1000, 80, 80, DType::bf16, Layout::interleaved);
  c.causal = true;
  c.window = Window{int64_t{1} << 40, -1};
  c.lse = true;
  c.q.seq += 16;
  c.q.batch = c.q.seq * c.seqlen_q;
  for (const AttentionSpec *other : {&b, &c}) {
    ASSERT_TRUE(other->validate()) << other->validate().message();
    EXPECT_EQ(other->signature(), a.signature()) << other->summary();
    EXPECT_EQ(program_text(*other), program_text(a)) << other->summary();
  }
  // The same holds under another config; the config itself does change the text.
  const ir::Config small{32, 16, 2, 1, false, 16};
  EXPECT_EQ(program_text(b, small), program_text(a, small));
  EXPECT_NE(program_text(a, small), program_text(a));
}

TEST(BuildAttention, TextDiffersWhenTheSignatureDiffers) {
  const AttentionSpec a = base_spec();
  const std::string base = program_text(a);
  struct Variant {
    const char *what;  // the field matches() names
    const char *shows; // what the text of the variant has
    AttentionSpec spec;
  };
  std::vector<Variant> variants;
  auto variant = [&](const char *what, const char *shows, auto edit) {
    AttentionSpec s = a;
    edit(s);
    variants.push_back({what, shows, s});
  };
  variant("dtype", "tensor @Q : f16", [](AttentionSpec &s) { s.dtype = DType::f16; });
  variant("head_dim_qk", "dim = 96", [](AttentionSpec &s) {
    s.head_dim_qk = 96;
    s.set_layout(Layout::bshd);
  });
  variant("head_dim_v", "dim = 64", [](AttentionSpec &s) {
    s.head_dim_v = 64;
    s.set_layout(Layout::bshd);
  });
  variant("causal", "{causal = 0,", [](AttentionSpec &s) { s.causal = false; });
  variant("sliding window", "{causal = 1}", [](AttentionSpec &s) { s.window = Window{}; });
  variant("lse", "fa_fwd_bf16_d80_80_causal_local {", [](AttentionSpec &s) { s.lse = false; });
  variant("q dim stride", "%q_dim_stride : i32", [](AttentionSpec &s) {
    // Q stored [batch, head, dim, seq]: the head dim is strided.
    s.q = {.batch = s.heads * s.head_dim_qk * s.seqlen_q,
           .head = s.head_dim_qk * s.seqlen_q,
           .seq = 1,
           .dim = s.seqlen_q};
  });
  variant("row alignment", "align = 8", [](AttentionSpec &s) {
    s.k.seq += 4; // 8-byte rows
    s.k.batch = s.k.seq * s.seqlen_k;
  });
  variant("row alignment", "align = 2", [](AttentionSpec &s) {
    s.v.seq += 1; // 2-byte rows
    s.v.batch = s.v.seq * s.seqlen_k;
  });
  for (const Variant &v : variants) {
    SCOPED_TRACE(v.what);
    ASSERT_TRUE(v.spec.validate()) << v.spec.validate().message();
    EXPECT_NE(v.spec.signature(), a.signature());
    const std::string text = program_text(v.spec);
    EXPECT_NE(text, base);
    EXPECT_NE(text.find(v.shows), std::string::npos) << text;
    // A kernel built for `a` refuses the variant and says which field differs
    // (a kernel for narrower rows would serve wider ones, not the reverse).
    const Status m = v.spec.matches(a.signature());
    ASSERT_FALSE(m);
    EXPECT_NE(m.message().find(v.what), std::string::npos) << m.message();
  }
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
