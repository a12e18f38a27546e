// Sequences: variable-length batches (cu_seqlens_q / cu_seqlens_k), per-batch key
// counts (seqused_k, a KV cache's cache_seqlens) and paged KV caches (block
// tables), against the float64 reference:
//
//   * the IR: sequences, index arrays, packed and paged tensors print, parse and
//     verify; bad ones are refused by name;
//   * the interpreter and the emulator (every AMD family and the simt rules):
//     ragged lengths including 0 and 1, pages of 16, 64 and 256 keys in shuffled
//     order, GQA 1:1 to MQA, causal and windows bottom-right aligned per sequence;
//   * flashjit::Attention on the emulator: one kernel for every batch of
//     lengths, split-KV over a paged cache, and index arrays that are checked.
//
// Tolerances: tolerance_for(dtype), as every forward test.
#include "ir/build.h"
#include "ir/interpreter.h"
#include "lowering/lower.h"
#include "runtime/attention.h"
#include "runtime/emulator.h"
#include "tests/support/describe.h"
#include "tests/support/sequences.h"

#include <gtest/gtest.h>

using namespace flashjit;

namespace {

using test::describe;
using test::make_seq_inputs;
using test::SeqCase;

constexpr Window kNoWindow{-1, -1};
constexpr auto bf16 = DType::bf16, f16 = DType::f16;

void expect_matches_reference(const AttentionSpec &spec, const HostTensors &t) {
  const Tolerance tol = tolerance_for(spec.dtype);
  const ErrorStats err = compare(spec, t, reference_attention(spec, t));
  EXPECT_TRUE(err.within(tol.abs, tol.rel)) << describe(err, tol);
}

const std::vector<SeqCase> &kCases = test::seq_cases();

// ---- the IR ------------------------------------------------------------------

TEST(SequencesIr, PrintsParsesAndVerifies) {
  for (const SeqCase &c : kCases) {
    SCOPED_TRACE(c.name);
    const test::SeqInputs in = make_seq_inputs(c, 1);
    auto p = ir::build_attention(in.spec, ir::Config{});
    ASSERT_TRUE(p) << p.status().message();
    ASSERT_TRUE(ir::verify(*p)) << ir::verify(*p).message();
    const std::string text = ir::print(*p);
    if (c.packed_q)
      EXPECT_NE(text.find("sequence %seqlen_q = lengths(starts = @cu_seqlens_q, capacity = "
                          "%total_q)"),
                std::string::npos)
          << text;
    if (c.page_size)
      EXPECT_NE(text.find("pages = @block_table [stride = %page_table_stride, size = %page_size, "
                          "count = %num_pages]"),
                std::string::npos)
          << text;
    auto back = ir::parse(text);
    ASSERT_TRUE(back) << back.status().message();
    EXPECT_EQ(ir::print(*back), text);
  }
}

TEST(SequencesIr, RefusesWhatCannotBeAddressed) {
  const test::SeqInputs in = make_seq_inputs(kCases[3], 1); // paged
  auto p = ir::build_attention(in.spec, ir::Config{});
  ASSERT_TRUE(p);
  ir::Program paged_q = *p;
  for (ir::TensorParam &t : paged_q.tensors)
    if (t.name == "Q")
      t.pages = paged_q.tensor("K")->pages;
  Status s = ir::verify(paged_q);
  ASSERT_FALSE(s);
  EXPECT_NE(s.message().find("only @K and @V"), std::string::npos) << s.message();

  ir::Program no_array = *p;
  no_array.indices.clear();
  s = ir::verify(no_array);
  ASSERT_FALSE(s);
  EXPECT_NE(s.message().find("not an index array"), std::string::npos) << s.message();

  auto parsed = ir::parse("kernel @k {\n  scalars (%n : i32)\n  sequence %s = lengths(starts = "
                          "@cu, capacity = %n)\n}\n");
  ASSERT_FALSE(parsed);
  EXPECT_NE(parsed.status().message().find("@cu is not an index array"), std::string::npos)
      << parsed.status().message();
}

TEST(SequencesSpec, ValidationNamesTheField) {
  AttentionSpec s = make_spec(2, 4, 4, 8, 64, 64, 64, bf16);
  s.seqs.total_q = 10;
  EXPECT_NE(s.validate().message().find("total_q (10) is set but Q is not packed"),
            std::string::npos)
      << s.validate().message();
  s = make_spec(2, 4, 4, 8, 640, 64, 64, bf16);
  s.seqs.page_size = 16;
  s.seqs.num_pages = 100;
  s.seqs.pages_per_seq = 4;
  s.set_layout(Layout::bshd);
  EXPECT_NE(s.validate().message().find("past what a block table row holds"), std::string::npos)
      << s.validate().message();
  s.seqs.packed_k = true;
  s.seqs.total_k = 100;
  EXPECT_NE(s.validate().message().find("seqused_k"), std::string::npos) << s.validate().message();
}

TEST(SequencesSpec, HostChecksOfTheIndexArrays) {
  test::SeqInputs in = make_seq_inputs(kCases[0], 1);
  ASSERT_TRUE(check_sequences(in.spec, in.tensors));
  HostTensors t = in.tensors;
  std::swap(t.cu_seqlens_q[2], t.cu_seqlens_q[3]);
  Status s = check_sequences(in.spec, t);
  ASSERT_FALSE(s);
  EXPECT_NE(s.message().find("cu_seqlens_q is not nondecreasing"), std::string::npos)
      << s.message();
  t = in.tensors;
  t.cu_seqlens_k.back() = int32_t(in.spec.seqs.total_k + 1);
  s = check_sequences(in.spec, t);
  ASSERT_FALSE(s);
  EXPECT_NE(s.message().find("past the"), std::string::npos) << s.message();

  in = make_seq_inputs(kCases[3], 1); // paged
  t = in.tensors;
  t.block_table[1] = int32_t(in.spec.seqs.num_pages);
  s = check_sequences(in.spec, t);
  ASSERT_FALSE(s);
  EXPECT_NE(s.message().find("block_table[0][1]"), std::string::npos) << s.message();
  t = in.tensors;
  t.seqused_k[0] = int32_t(in.spec.seqlen_k + 1);
  s = check_sequences(in.spec, t);
  ASSERT_FALSE(s);
  EXPECT_NE(s.message().find("seqused_k[0]"), std::string::npos) << s.message();
}

class SequencesInterpreter : public testing::TestWithParam<SeqCase> {};

TEST_P(SequencesInterpreter, MatchesFloat64) {
  test::SeqInputs in = make_seq_inputs(GetParam(), 17);
  ir::Config config;
  config.block_m = 16;
  config.block_n = 32;
  auto p = ir::build_attention(in.spec, config);
  ASSERT_TRUE(p) << p.status().message();
  Status s = ir::interpret(*p, ir::bind_attention(in.spec), in.tensors);
  ASSERT_TRUE(s) << s.message();
  expect_matches_reference(in.spec, in.tensors);
}

INSTANTIATE_TEST_SUITE_P(Cases, SequencesInterpreter, testing::ValuesIn(kCases),
                         [](const auto &info) { return test::name_of(info.param); });

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

class SequencesEmulator : public testing::TestWithParam<std::tuple<Lowering, SeqCase>> {};

TEST_P(SequencesEmulator, MatchesFloat64) {
  const auto &[how, c] = GetParam();
  auto t = lowering::parse_target(how.arch);
  ASSERT_TRUE(t) << t.status().message();
  test::SeqInputs in = make_seq_inputs(c, 23);
  const ir::Config config = lowering::default_config(in.spec, *t, how.choice);
  auto program = ir::build_attention(in.spec, config);
  ASSERT_TRUE(program) << program.status().message();
  auto kernel = lowering::lower(*program, *t, how.choice);
  ASSERT_TRUE(kernel) << kernel.status().message();
  Status s = runtime::emulate(*kernel, *t, in.spec, in.tensors, {.threads = 2});
  ASSERT_TRUE(s) << s.message();
  expect_matches_reference(in.spec, in.tensors);
}

INSTANTIATE_TEST_SUITE_P(Families, SequencesEmulator,
                         testing::Combine(testing::ValuesIn(kLowerings), testing::ValuesIn(kCases)),
                         [](const auto &info) {
                           return fmt::format("{}_{}", name_of(std::get<0>(info.param)),
                                              test::name_of(std::get<1>(info.param)));
                         });

// ---- through flashjit::Attention -------------------------------------------

struct DeviceBuffers {
  std::vector<uint16_t> q, k, v, o;
};

DeviceBuffers to_bits16(const AttentionSpec &spec, const HostTensors &t) {
  DeviceBuffers b{std::vector<uint16_t>(t.q.size()), std::vector<uint16_t>(t.k.size()),
                  std::vector<uint16_t>(t.v.size()), std::vector<uint16_t>(t.o.size(), 0x7fff)};
  for (auto [from, to] : {std::pair{&t.q, &b.q}, std::pair{&t.k, &b.k}, std::pair{&t.v, &b.v}})
    for (size_t i = 0; i < from->size(); ++i)
      (*to)[i] = uint16_t(to_bits(spec.dtype, (*from)[i]));
  return b;
}

AttentionTensors tensors_of(DeviceBuffers &b, HostTensors &t) {
  AttentionTensors a{b.q.data(), b.k.data(), b.v.data(), b.o.data(),
                     t.lse.empty() ? nullptr : t.lse.data()};
  a.cu_seqlens_q = t.cu_seqlens_q.empty() ? nullptr : t.cu_seqlens_q.data();
  a.cu_seqlens_k = t.cu_seqlens_k.empty() ? nullptr : t.cu_seqlens_k.data();
  a.seqused_k = t.seqused_k.empty() ? nullptr : t.seqused_k.data();
  a.block_table = t.block_table.empty() ? nullptr : t.block_table.data();
  return a;
}

Options emulator_options() {
  Options options;
  options.compiler = "none"; // the emulator runs the kernel text; no AMD code object needed
  options.cpu_threads = 2;
  return options;
}

// One Attention serves every batch of ragged lengths: nothing recompiles.
TEST(SequencesAttention, OneKernelForEveryBatchOfLengths) {
  const SeqCase base = kCases[0];
  test::SeqInputs first = make_seq_inputs(base, 5);
  auto attn = Attention::create(first.spec, "emulator:gfx1201", emulator_options());
  ASSERT_TRUE(attn) << attn.status().message();
  const std::vector<std::vector<int32_t>> batches = {{5, 0, 37, 1}, {130}, {0, 0}, {1, 2, 3, 4, 5}};
  for (const std::vector<int32_t> &lens : batches) {
    SCOPED_TRACE(fmt::format("lengths {}", fmt::join(lens, ",")));
    SeqCase c = base;
    c.q_lens = c.k_lens = lens;
    test::SeqInputs in = make_seq_inputs(c, 40 + lens.size());
    DeviceBuffers b = to_bits16(in.spec, in.tensors);
    Status s = attn->forward(in.spec, tensors_of(b, in.tensors));
    ASSERT_TRUE(s) << s.message();
    for (size_t i = 0; i < b.o.size(); ++i)
      in.tensors.o[i] = from_bits(in.spec.dtype, b.o[i]);
    expect_matches_reference(in.spec, in.tensors);
  }
  EXPECT_NE(attn->explain().find("4 forward calls"), std::string::npos) << attn->explain();
}

// Decode over a paged cache through the split-KV kernels (forced and chosen).
TEST(SequencesAttention, SplitKvOverAPagedCache) {
  const SeqCase c = kCases[4]; // paged64 decode
  test::SeqInputs in = make_seq_inputs(c, 8);
  auto attn = Attention::create(in.spec, "emulator:gfx942", emulator_options());
  ASSERT_TRUE(attn) << attn.status().message();
  for (int64_t splits : {int64_t{3}, int64_t{0}, int64_t{1}}) {
    SCOPED_TRACE(fmt::format("num_splits {}", splits));
    test::SeqInputs call = make_seq_inputs(c, 8 + uint64_t(splits));
    call.spec.num_splits = splits;
    DeviceBuffers b = to_bits16(call.spec, call.tensors);
    Status s = attn->forward(call.spec, tensors_of(b, call.tensors));
    ASSERT_TRUE(s) << s.message();
    for (size_t i = 0; i < b.o.size(); ++i)
      call.tensors.o[i] = from_bits(call.spec.dtype, b.o[i]);
    expect_matches_reference(call.spec, call.tensors);
  }
  EXPECT_NE(attn->explain().find("split-kv: 2 of those calls"), std::string::npos)
      << attn->explain();
}

TEST(SequencesAttention, RefusesMissingAndBadIndexArrays) {
  test::SeqInputs in = make_seq_inputs(kCases[3], 3); // paged
  auto attn = Attention::create(in.spec, "emulator:gfx1201", emulator_options());
  ASSERT_TRUE(attn) << attn.status().message();
  DeviceBuffers b = to_bits16(in.spec, in.tensors);
  AttentionTensors t = tensors_of(b, in.tensors);
  t.block_table = nullptr;
  Status s = attn->forward(in.spec, t);
  ASSERT_FALSE(s);
  EXPECT_NE(s.message().find("block_table is null"), std::string::npos) << s.message();
  t = tensors_of(b, in.tensors);
  t.cu_seqlens_q = in.tensors.seqused_k.data();
  s = attn->forward(in.spec, t);
  ASSERT_FALSE(s);
  EXPECT_NE(s.message().find("cu_seqlens_q is given but the spec does not use it"),
            std::string::npos)
      << s.message();
  in.tensors.block_table[0] = -5;
  s = attn->forward(in.spec, tensors_of(b, in.tensors));
  ASSERT_FALSE(s);
  EXPECT_NE(s.message().find("block_table[0][0] is -5"), std::string::npos) << s.message();
  // A dense call of the paged kernel is another signature.
  AttentionSpec dense = make_spec(3, 8, 2, 4, 50, 64, 64, bf16);
  dense.causal = dense.lse = true;
  s = attn->forward(dense, b.q.data(), b.k.data(), b.v.data(), b.o.data(), in.tensors.lse.data());
  ASSERT_FALSE(s);
  EXPECT_NE(s.message().find("per-batch key counts (seqused_k) (false) differs"), std::string::npos)
      << s.message();
}

} // namespace
