// Mask tensors (issue 14: SDPA's attn_mask, padding masks): bool or additive
// (f32, f16, bf16) [batch | 1, heads | 1, seqlen_q, seqlen_k] tensors broadcast
// by 0 strides. The numeric cases of every family and the simt rules live with
// the other score modifiers (score_mod_test: forward; backward_test: gradients);
// here:
//
//   * the spec: validation names the field, the type is in the signature and
//     the strides are not, dense_mask_strides;
//   * the IR: a typed array prints, parses and verifies; bad types are refused;
//   * flashjit::Attention on the emulator: one kernel serves every broadcast
//     shape of one mask type (a full mask, a key-padding mask, a [Sq, Sk] one),
//     split-KV decode reads the mask, the pointer is checked by name;
//   * the block summary (lowering/mask_blocks.cpp): the summary kernel's class
//     of every block against a loop over the mask here, and masks with empty,
//     full and mixed blocks (causal and left padding, as transformers builds
//     them) through every AMD family, split-KV decode included, against float64.
//
// Tolerance: tolerance_for(dtype), as every forward test.
#include "ir/build.h"
#include "ir/interpreter.h"
#include "ir/reference.h"
#include "lowering/lower.h"
#include "runtime/attention.h"
#include "runtime/emulator.h"
#include "tests/support/describe.h"
#include "tests/support/masks.h"

#include <gtest/gtest.h>

#include <cstring>
#include <functional>

namespace flashjit {
namespace {

AttentionSpec masked_spec(MaskType type, std::string_view axes, int64_t b = 2, int64_t h = 4,
                          int64_t sq = 40, int64_t sk = 70) {
  AttentionSpec s = make_spec(b, h, 2, sq, sk, 64, 64, DType::bf16);
  s.mask = type;
  s.mask_strides = dense_mask_strides(axes, b, h, sq, sk).value();
  s.lse = true;
  return s;
}

TEST(MaskSpec, DenseStridesBroadcastTheMissingAxes) {
  EXPECT_EQ(dense_mask_strides("bhqk", 2, 3, 5, 7).value(), (MaskStrides{105, 35, 7, 1}));
  EXPECT_EQ(dense_mask_strides("bk", 2, 3, 5, 7).value(), (MaskStrides{7, 0, 0, 1}));
  EXPECT_EQ(dense_mask_strides("qk", 2, 3, 5, 7).value(), (MaskStrides{0, 0, 7, 1}));
  EXPECT_EQ(dense_mask_strides("", 2, 3, 5, 7).value(), (MaskStrides{0, 0, 0, 0}));
  for (const char *bad : {"kq", "bbk", "x", "hbk"}) {
    auto s = dense_mask_strides(bad, 2, 3, 5, 7);
    ASSERT_FALSE(s) << bad;
    EXPECT_NE(s.status().message().find("letters of bhqk in that order"), std::string::npos);
  }
  EXPECT_EQ(masked_spec(MaskType::f16, "bk").mask_elements(), 2 * 70);
  EXPECT_EQ(masked_spec(MaskType::none, "bk").mask_elements(), 0);
}

TEST(MaskSpec, ValidationNamesTheFieldAndTheFix) {
  AttentionSpec s = masked_spec(MaskType::boolean, "bhqk");
  EXPECT_TRUE(s.validate()) << s.validate().message();
  s.mask_strides.q = -70;
  EXPECT_NE(s.validate().message().find("mask_strides.q (-70) must be in 0..2^40"),
            std::string::npos)
      << s.validate().message();
  s = masked_spec(MaskType::f32, "qk");
  s.seqs.used_k = true;
  EXPECT_NE(s.validate().message().find("a mask tensor with varlen batches"), std::string::npos)
      << s.validate().message();
  s = masked_spec(MaskType::f32, "qk");
  s.mask = MaskType(9);
  EXPECT_NE(s.validate().message().find("mask type 9 is unknown"), std::string::npos);
  EXPECT_EQ(parse_mask_type("bool").value(), MaskType::boolean);
  EXPECT_EQ(parse_mask_type("bf16").value(), MaskType::bf16);
  EXPECT_NE(parse_mask_type("int8").status().message().find("unknown mask type 'int8'"),
            std::string::npos);
}

TEST(MaskSpec, TheTypeIsTheSignatureTheStridesAreNot) {
  const AttentionSpec full = masked_spec(MaskType::boolean, "bhqk");
  const AttentionSpec padding = masked_spec(MaskType::boolean, "bk", 3, 4, 10, 500);
  EXPECT_EQ(full.signature(), padding.signature());
  EXPECT_TRUE(padding.matches(full.signature()));
  const AttentionSpec additive = masked_spec(MaskType::f16, "bhqk");
  Status s = additive.matches(full.signature());
  ASSERT_FALSE(s);
  EXPECT_NE(s.message().find("mask tensor type (f16) differs from the kernel's (bool)"),
            std::string::npos)
      << s.message();
  EXPECT_NE(full.signature().summary().find("mask=bool"), std::string::npos);
  EXPECT_NE(padding.summary().find("mask=bool[500,0,0,1]"), std::string::npos) << padding.summary();
}

TEST(MaskIr, TypedArraysRoundTripAndBadTypesAreRefused) {
  const AttentionSpec spec = masked_spec(MaskType::bf16, "qk");
  ir::Config config;
  config.block_m = 16;
  config.block_n = 32;
  auto p = ir::build_attention(spec, config);
  ASSERT_TRUE(p) << p.status().message();
  const std::string text = ir::print(*p);
  EXPECT_NE(text.find("arrays (@attn_mask : bf16, @attn_mask_blocks : u8)"), std::string::npos)
      << text;
  // The block-range pass reads the mask's block summary: the loop and the score_mod.
  EXPECT_NE(text.find("blocks = @attn_mask_blocks, causal = 0, range = @mask_range"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("function @mask_range = \"1\""), std::string::npos) << text;
  EXPECT_NE(text.find("%mask_q_stride : i64"), std::string::npos) << text;
  auto back = ir::parse(text);
  ASSERT_TRUE(back) << back.status().message();
  EXPECT_EQ(ir::print(*back), text);
  std::string bad = text;
  bad.replace(bad.find("@attn_mask : bf16"), 17, "@attn_mask : i8");
  auto refused = ir::parse(bad);
  ASSERT_FALSE(refused);
  EXPECT_NE(refused.status().message().find("unknown element type 'i8' of array @attn_mask"),
            std::string::npos)
      << refused.status().message();
}

// A tile's rows and columns past the lengths read no mask element: the
// interpreter refuses a read past an array's end (a GPU faults on one), and a
// mask holds exactly the elements of its [seqlen_q, seqlen_k] positions.
TEST(MaskIr, TilesPastTheLengthsReadNoMaskElement) {
  for (MaskType type : {MaskType::boolean, MaskType::f32}) {
    const AttentionSpec spec = masked_spec(type, "qk", 1, 2, 37, 45);
    ir::Config config;
    config.block_m = 64;
    config.block_n = 64;
    auto p = ir::build_attention(spec, config);
    ASSERT_TRUE(p) << p.status().message();
    HostTensors t = make_random_inputs(spec, 11);
    ASSERT_EQ(t.attn_mask.size(), size_t(37 * 45));
    Status s = ir::interpret(*p, ir::bind_attention(spec), t);
    ASSERT_TRUE(s) << s.message();
    const Tolerance tol = tolerance_for(spec.dtype);
    const ErrorStats e = compare(spec, t, reference_attention(spec, t));
    EXPECT_TRUE(e.within(tol.abs, tol.rel)) << test::describe(e, tol);
  }
}

// ---- flashjit::Attention on the emulator ----------------------------------------------

/// One forward through `attn` of `shape` with fresh inputs and mask (which
/// `edit`, when given, may change); checked against the float64 reference. The
/// mask goes in its own element type.
void forward_matches(Attention &attn, const AttentionSpec &shape, uint64_t seed,
                     const std::function<void(HostTensors &)> &edit = {}) {
  HostTensors t = make_random_inputs(shape, seed);
  if (edit)
    edit(t);
  auto bits = [&](const std::vector<float> &x) {
    std::vector<uint16_t> out(x.size());
    for (size_t i = 0; i < x.size(); ++i)
      out[i] = uint16_t(to_bits(shape.dtype, x[i]));
    return out;
  };
  std::vector<uint16_t> q = bits(t.q), k = bits(t.k), v = bits(t.v), o(t.o.size(), 0x7fc1);
  std::vector<uint32_t> mask(t.attn_mask.size()); // 4 bytes per element is room for any type
  mask_storage(shape.mask, t.attn_mask, mask.data());
  AttentionTensors a{q.data(), k.data(), v.data(), o.data(), t.lse.data()};
  a.attn_mask = mask.data();
  Status s = attn.forward(shape, a);
  ASSERT_TRUE(s) << s.message();
  for (size_t i = 0; i < o.size(); ++i)
    t.o[i] = from_bits(shape.dtype, o[i]);
  const Tolerance tol = tolerance_for(shape.dtype);
  const ErrorStats e = compare(shape, t, reference_attention(shape, t));
  EXPECT_TRUE(e.within(tol.abs, tol.rel)) << shape.summary() << ": " << test::describe(e, tol);
}

Options emulator_options() {
  Options o;
  o.compiler = "none";
  o.cpu_threads = 2;
  return o;
}

TEST(MaskAttention, OneKernelServesEveryBroadcastShape) {
  if (!runtime::emulator_available())
    GTEST_SKIP() << "this build has no emulator (FLASHJIT_WITH_LLVM=OFF)";
  auto attn = Attention::create(masked_spec(MaskType::boolean, "bhqk"), "emulator:gfx1201",
                                emulator_options());
  ASSERT_TRUE(attn) << attn.status().message();
  forward_matches(*attn, masked_spec(MaskType::boolean, "bhqk"), 1);
  forward_matches(*attn, masked_spec(MaskType::boolean, "bk", 3, 4, 33, 95), 2); // key padding
  forward_matches(*attn, masked_spec(MaskType::boolean, "qk", 1, 2, 64, 64), 3);
  // Strides of a transposed [Sk, Sq] buffer: any non-negative strides work.
  AttentionSpec transposed = masked_spec(MaskType::boolean, "qk", 1, 2, 24, 40);
  transposed.mask_strides = {0, 0, 1, 24};
  forward_matches(*attn, transposed, 4);
  EXPECT_NE(attn->explain().find("4 forward calls"), std::string::npos) << attn->explain();
}

TEST(MaskAttention, SplitKvDecodeReadsTheMask) {
  if (!runtime::emulator_available())
    GTEST_SKIP() << "this build has no emulator (FLASHJIT_WITH_LLVM=OFF)";
  AttentionSpec spec = masked_spec(MaskType::f32, "bhqk", 2, 4, 1, 300);
  auto attn = Attention::create(spec, "emulator:gfx942", emulator_options());
  ASSERT_TRUE(attn) << attn.status().message();
  for (int64_t splits : {1, 3, 8}) {
    spec.num_splits = splits;
    forward_matches(*attn, spec, uint64_t(splits));
  }
  EXPECT_NE(attn->explain().find("split"), std::string::npos) << attn->explain();
}

TEST(MaskAttention, TheMaskPointerIsChecked) {
  if (!runtime::emulator_available())
    GTEST_SKIP() << "this build has no emulator (FLASHJIT_WITH_LLVM=OFF)";
  const AttentionSpec spec = masked_spec(MaskType::f16, "bk");
  auto attn = Attention::create(spec, "emulator:gfx1201", emulator_options());
  ASSERT_TRUE(attn) << attn.status().message();
  std::vector<uint16_t> q(size_t(spec.q_elements())), k(size_t(spec.k_elements())),
      v(size_t(spec.v_elements())), o(size_t(spec.o_elements()));
  std::vector<float> lse(size_t(spec.lse_elements()));
  std::vector<uint16_t> mask(size_t(spec.mask_elements()) + 1);
  AttentionTensors a{q.data(), k.data(), v.data(), o.data(), lse.data()};
  Status s = attn->forward(spec, a);
  ASSERT_FALSE(s);
  EXPECT_NE(s.message().find("attn_mask is null but the spec has a f16 mask tensor: pass its 140 "
                             "elements"),
            std::string::npos)
      << s.message();
  a.attn_mask = reinterpret_cast<const uint8_t *>(mask.data()) + 1;
  s = attn->forward(spec, a);
  ASSERT_FALSE(s);
  EXPECT_NE(s.message().find("is not aligned to its 2-byte elements"), std::string::npos)
      << s.message();
  // A spec without a mask refuses one.
  AttentionSpec plain = spec;
  plain.mask = MaskType::none;
  auto unmasked = Attention::create(plain, "emulator:gfx1201", emulator_options());
  ASSERT_TRUE(unmasked) << unmasked.status().message();
  a.attn_mask = mask.data();
  s = unmasked->forward(plain, a);
  ASSERT_FALSE(s);
  EXPECT_NE(s.message().find("attn_mask is given but the spec has no mask tensor"),
            std::string::npos)
      << s.message();
}

// ---- the block summary ------------------------------------------------------------------

// The summary kernel's class of each block (templates/mask_blocks.hip), run on
// the emulator, against a loop over the block's elements here: every mask
// type, broadcast axes, tail blocks past the lengths, a NaN (mixed).
TEST(MaskBlocks, TheSummaryClassesEveryBlock) {
  if (!runtime::emulator_available())
    GTEST_SKIP() << "this build has no emulator (FLASHJIT_WITH_LLVM=OFF)";
  const lowering::Target target = lowering::parse_target("gfx1201").value();
  for (MaskType type : {MaskType::boolean, MaskType::f32, MaskType::f16, MaskType::bf16})
    for (const char *axes : {"bhqk", "bk", "qk"}) {
      AttentionSpec spec = masked_spec(type, axes, 2, 3, 90, 200);
      spec.kv_heads = 1;
      SCOPED_TRACE(spec.summary());
      std::vector<float> mask(size_t(spec.mask_elements()));
      test::structured_mask(spec, mask);
      if (type == MaskType::f32)
        mask[5] = std::nanf("");
      std::vector<uint32_t> stored(mask.size());
      mask_storage(type, mask, stored.data());
      lowering::Lowered reader; // a kernel that reads the summary of 16 x 32 blocks
      reader.kernel_name = "reader";
      reader.mask_blocks = {.block_q = 16, .block_k = 32};
      std::vector<uint8_t> blocks;
      const runtime::EmulatorBuffer buffer{"attn_mask", stored.data(),
                                           mask.size() * size_t(mask_type_bytes(type)),
                                           mask_type_bytes(type), false};
      Status st = runtime::emulate_mask_blocks(reader, target, spec, buffer, blocks);
      ASSERT_TRUE(st) << st.message();
      const MaskStrides &m = spec.mask_strides;
      const int64_t bs = m.batch ? spec.batch : 1, hs = m.head ? spec.heads : 1,
                    qs = m.q ? (spec.seqlen_q + 15) / 16 : 1, ks = (spec.seqlen_k + 31) / 32;
      ASSERT_EQ(blocks.size(), size_t(bs * hs * qs * ks));
      int seen[3] = {0, 0, 0};
      for (int64_t b = 0; b < bs; ++b)
        for (int64_t h = 0; h < hs; ++h)
          for (int64_t qb = 0; qb < qs; ++qb)
            for (int64_t kb = 0; kb < ks; ++kb) {
              bool attends = false, changed = false;
              const int64_t rows = m.q ? std::min<int64_t>(16, spec.seqlen_q - qb * 16) : 1;
              for (int64_t i = qb * 16; i < qb * 16 + rows; ++i)
                for (int64_t j = kb * 32; j < std::min<int64_t>(kb * 32 + 32, spec.seqlen_k); ++j) {
                  const float x = mask[size_t(b * m.batch + h * m.head + i * m.q + j * m.k)];
                  const bool keep = type == MaskType::boolean
                                        ? x != 0
                                        : x != -std::numeric_limits<float>::infinity();
                  attends = attends || keep;
                  changed = changed || (type == MaskType::boolean ? !keep : !(x == 0));
                }
              const int want = !attends ? 0 : changed ? 1 : 2;
              const uint8_t got = blocks[size_t(((b * hs + h) * qs + qb) * ks + kb)];
              ++seen[want];
              EXPECT_EQ(int(got), want)
                  << "block (b " << b << ", h " << h << ", q " << qb << ", k " << kb << ")";
            }
      for (int c : {0, 1, 2}) // the mask has blocks of every class
        EXPECT_GT(seen[c], 0) << "class " << c;
    }
}

// Masks with empty, full and mixed blocks through the attention kernels of
// every AMD family (and split-KV decode): the blocks the summary empties are
// skipped, the full ones read no mask element, and the result is float64's.
TEST(MaskBlocks, StructuredMasksMatchFloat64OnEveryFamily) {
  if (!runtime::emulator_available())
    GTEST_SKIP() << "this build has no emulator (FLASHJIT_WITH_LLVM=OFF)";
  struct Case {
    MaskType type;
    const char *axes;
    int64_t sq, sk;
  };
  const Case cases[] = {{MaskType::boolean, "bqk", 150, 200},
                        {MaskType::f32, "bhqk", 150, 150},
                        {MaskType::bf16, "bk", 100, 230}};
  for (const char *arch : {"gfx1201", "gfx1100", "gfx942", "gfx90a", "gfx950"})
    for (const Case &c : cases) {
      AttentionSpec spec = masked_spec(c.type, c.axes, 2, 2, c.sq, c.sk);
      spec.kv_heads = 1;
      SCOPED_TRACE(fmt::format("{} {}", arch, spec.summary()));
      auto attn = Attention::create(spec, fmt::format("emulator:{}", arch), emulator_options());
      ASSERT_TRUE(attn) << attn.status().message();
      forward_matches(*attn, spec, 7,
                      [&](HostTensors &t) { test::structured_mask(spec, t.attn_mask); });
    }
}

// Decode through split-KV with a key-padding mask whose hidden keys fill whole
// splits: each split's run starts at the next block the summary keeps.
TEST(MaskBlocks, SplitKvDecodeSkipsHiddenBlocks) {
  if (!runtime::emulator_available())
    GTEST_SKIP() << "this build has no emulator (FLASHJIT_WITH_LLVM=OFF)";
  AttentionSpec spec = masked_spec(MaskType::boolean, "bk", 2, 4, 1, 600);
  auto attn = Attention::create(spec, "emulator:gfx1201", emulator_options());
  ASSERT_TRUE(attn) << attn.status().message();
  for (int64_t splits : {1, 4, 9}) {
    spec.num_splits = splits;
    SCOPED_TRACE(splits);
    forward_matches(*attn, spec, uint64_t(40 + splits), [](HostTensors &t) {
      for (int64_t b = 0; b < 2; ++b) // batch 0 sees keys [0, 97), batch 1 keys [350, 600)
        for (int64_t j = 0; j < 600; ++j)
          t.attn_mask[size_t(b * 600 + j)] = (b == 0 ? j < 97 : j >= 350) ? 1.0f : 0.0f;
    });
  }
}

} // namespace
} // namespace flashjit
