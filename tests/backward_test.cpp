// The backward pass (issue 15, step 2): dQ, dK and dV against the float64
// analytic gradients of ir/reference.h.
//
//   * the IR: both programs verify and print/parse round trip; the transposed
//     loop's query-block range covers every visible (query, key) pair;
//   * the interpreter: the programs' own semantics, with the host preprocess
//     and the group sum;
//   * flashjit::Attention on the emulator, every AMD family and the simt rules:
//     the four generated kernels end to end (preprocess, dQ, dK/dV, reduce), the
//     forward's O and LSE as their inputs, results the same bits run to run;
//   * score modifiers (softcap, ALiBi, score_mod, mask_mod) through the chain
//     rule: ir::score_derivative against finite differences, and cases whose
//     gradients the reference computes (softcap, ALiBi) or that equal a spec it
//     computes (score_mod "2.0 * score" = twice the scale, a causal mask_mod);
//   * refusals by name: sequences, sinks, a null LSE, missing ALiBi slopes.
//
// Tolerance: each gradient's relative L2 error within 2e-2 (bf16) or 1e-2 (f16)
// of the reference and every element within 4e-2 (bf16) or 2e-2 (f16) times the
// largest reference magnitude of that gradient: the kernels round P and dS to
// the 16-bit dtype before their products, as FlashAttention does.
#include "compiler/code_object.h"
#include "ir/build.h"
#include "ir/expr.h"
#include "ir/interpreter.h"
#include "lowering/lower.h"
#include "runtime/attention.h"
#include "runtime/emulator.h"
#include "runtime/pipeline.h"
#include "tests/support/describe.h"
#include "tests/support/masks.h"
#include "tests/support/sequences.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <future>
#include <numbers>
#include <optional>
#include <regex>
#include <tuple>

namespace flashjit {
namespace {

struct Case {
  const char *name;
  int64_t b, hq, hkv, sq, sk, dqk, dv;
  bool causal = false;
  Window window = {};
  DType dtype = DType::bf16;
  Layout layout = Layout::bshd;
  // Score modifiers. The float64 reference takes softcap and ALiBi itself; a
  // score_mod or mask_mod case is written to equal a spec it takes: the
  // reference runs with the scale times `ref_scale` and causal when `ref_causal`.
  double softcap = 0;
  Alibi alibi = Alibi::none;
  const char *score_mod = "", *mask_mod = "";
  double ref_scale = 1;
  bool ref_causal = false;
  // A mask tensor (AttentionSpec::mask), dense over these axes of bhqk; the
  // reference takes it as it is.
  MaskType mask = MaskType::none;
  const char *mask_axes = "bhqk";
  double dropout_p = 0;         // seed 99, offset 3: the reference draws the same elements
  Window ref_window = {-1, -1}; // the window the reference runs with (a mask_mod's equal)
  bool sinks = false;           // attention sinks: random logits, and their gradient
};

/// A case whose mask_mod equals the window `w` (sq == sk: the diagonal is i == j),
/// long enough that the block-range pass skips blocks in both loops.
constexpr Case with_window_mask(Case c, const char *name, const char *mask_mod, Window w) {
  c.name = name;
  c.mask_mod = mask_mod;
  c.ref_window = w;
  return c;
}

/// A case with a mask tensor of `type`, dense over `axes` of bhqk, on top of `c`.
constexpr Case with_mask(Case c, const char *name, MaskType type, const char *axes) {
  c.name = name;
  c.mask = type;
  c.mask_axes = axes;
  return c;
}

/// A case with attention sinks on top of `c`.
constexpr Case with_sinks(Case c, const char *name) {
  c.name = name;
  c.sinks = true;
  return c;
}

/// A case with dropout probability p on top of `c`.
constexpr Case with_dropout(Case c, const char *name, double p) {
  c.name = name;
  c.dropout_p = p;
  return c;
}

const Case kCases[] = {
    {"plain_d64", 1, 2, 2, 80, 96, 64, 64},
    {"causal_sq_lt_sk", 2, 2, 1, 48, 100, 32, 32, true},
    {"causal_sq_gt_sk", 1, 2, 2, 100, 40, 64, 64, true}, // rows that see no key
    {"window_gqa", 1, 4, 2, 70, 70, 48, 48, false, {16, 8}},
    {"mqa_dqk_ne_dv_f16", 1, 3, 1, 40, 72, 40, 24, true, {}, DType::f16},
    {"bhsd_d80", 1, 2, 2, 33, 65, 80, 80, false, {}, DType::bf16, Layout::bhsd},
    // Head dims that are not multiples of 8: the preprocess reads dO and O element by
    // element, the reduce (GQA) dV by runs of 4 and dK one at a time; MHA writes both
    // directly.
    {"odd_dims_gqa", 1, 4, 2, 37, 45, 36, 20, true},
    {"odd_dims_mha", 2, 2, 2, 30, 41, 42, 12},
    {"softcap_gqa", 1, 4, 2, 50, 70, 32, 32, true, {}, DType::bf16, Layout::bshd, 2.0},
    {"alibi_batch_heads_window",
     2,
     2,
     2,
     40,
     40,
     32,
     32,
     false,
     {12, 4},
     DType::f16,
     Layout::bshd,
     0,
     Alibi::batch_heads},
    {"softcap_alibi",
     1,
     2,
     1,
     33,
     47,
     64,
     64,
     false,
     {},
     DType::bf16,
     Layout::bshd,
     3.0,
     Alibi::heads},
    // score_mod 2 * score is the plain spec at twice the scale; mask_mod the causal one.
    {"score_mod_doubles",
     1,
     2,
     2,
     40,
     56,
     32,
     32,
     false,
     {},
     DType::f16,
     Layout::bshd,
     0,
     Alibi::none,
     "2.0 * score",
     "",
     2.0},
    {"mask_mod_causal",
     1,
     2,
     2,
     48,
     64,
     32,
     32,
     false,
     {},
     DType::bf16,
     Layout::bshd,
     0,
     Alibi::none,
     "",
     "kv_idx <= q_idx + seqlen_k - seqlen_q",
     1.0,
     true},
    with_mask({"", 1, 4, 2, 40, 72, 32, 32}, "bool_mask_gqa", MaskType::boolean, "bhqk"),
    with_mask({"", 2, 2, 2, 30, 50, 64, 64, true, {}, DType::f16},
              "additive_f32_key_padding_causal", MaskType::f32, "bk"),
    with_mask({"", 1, 2, 1, 48, 40, 48, 48, false, {}, DType::bf16, Layout::bshd, 2.5},
              "additive_bf16_qk_softcap", MaskType::bf16, "qk"),
    with_dropout({"", 2, 4, 2, 40, 56, 32, 32}, "dropout_gqa", 0.25),
    with_window_mask({"", 1, 2, 1, 200, 200, 32, 32}, "mask_mod_window_block_range",
                     "q_idx - kv_idx <= 24 && kv_idx - q_idx <= 8", {24, 8}),
    with_dropout({"", 1, 2, 2, 48, 48, 64, 64, true, {}, DType::f16}, "dropout_causal_f16", 0.5),
    // Rows that see no key still have the sink (P_sink = 1, D = 0).
    with_sinks({"", 2, 4, 2, 70, 40, 64, 64, true}, "sinks_causal_gqa_empty_rows"),
    with_sinks({"", 1, 2, 2, 50, 90, 40, 40, false, {20, 5}, DType::f16}, "sinks_window_f16"),
};

AttentionSpec spec_of(const Case &c) {
  AttentionSpec s = make_spec(c.b, c.hq, c.hkv, c.sq, c.sk, c.dqk, c.dv, c.dtype);
  s.causal = c.causal;
  s.window = c.window;
  s.lse = true;
  s.set_layout(c.layout);
  s.softcap = c.softcap;
  s.alibi = c.alibi;
  s.score_mod = c.score_mod;
  s.mask_mod = c.mask_mod;
  if (c.mask != MaskType::none) {
    s.mask = c.mask;
    s.mask_strides =
        dense_mask_strides(c.mask_axes, s.batch, s.heads, s.seqlen_q, s.seqlen_k).value();
  }
  s.sinks = c.sinks;
  s.dropout_p = c.dropout_p;
  s.dropout_seed = 99;
  s.dropout_offset = 3;
  return s;
}

/// The spec the float64 reference computes for case `c` (see Case).
AttentionSpec reference_spec_of(const Case &c) {
  AttentionSpec s = spec_of(c);
  s.scale = s.softmax_scale() * c.ref_scale;
  s.causal = s.causal || c.ref_causal;
  if (c.ref_window != Window{-1, -1})
    s.window = c.ref_window;
  s.score_mod.clear();
  s.mask_mod.clear();
  return s;
}

/// The forward's O and LSE into `t` from the float64 reference (O rounded to
/// the dtype, as a kernel stores it), so each backward test starts from the
/// same forward outputs.
void reference_forward(const AttentionSpec &spec, HostTensors &t) {
  const ReferenceResult r = reference_attention(spec, t);
  t.o.assign(size_t(spec.o_elements()), std::numeric_limits<float>::quiet_NaN());
  t.lse.assign(size_t(spec.lse_elements()), 0.0f);
  const int64_t dv = spec.head_dim_v;
  for (int64_t b = 0; b < spec.batch; ++b)
    for (int64_t h = 0; h < spec.heads; ++h)
      for (int64_t i = 0; i < spec.seqlen_q; ++i) {
        const int64_t row = (b * spec.heads + h) * spec.seqlen_q + i;
        t.lse[size_t(row)] = float(r.lse[size_t(row)]);
        for (int64_t d = 0; d < dv; ++d)
          t.o[size_t(b * spec.o.batch + h * spec.o.head + i * spec.o.seq + d * spec.o.dim)] =
              round_to(spec.dtype, float(r.out[size_t(row * dv + d)]));
      }
}

void expect_gradients_match(const AttentionSpec &spec, const HostTensors &t) {
  auto ref = reference_attention_backward(spec, t); // spec: a reference_spec_of
  ASSERT_TRUE(ref) << ref.status().message();
  const GradErrorStats e = compare_grads(spec, t, *ref);
  const bool bf16 = spec.dtype == DType::bf16;
  const double rel = bf16 ? 2e-2 : 1e-2, abs_scale = bf16 ? 4e-2 : 2e-2;
  const std::pair<const char *, std::pair<const ErrorStats *, const std::vector<double> *>>
      grads[] = {{"dq", {&e.dq, &ref->dq}},
                 {"dk", {&e.dk, &ref->dk}},
                 {"dv", {&e.dv, &ref->dv}},
                 {"dsinks", {&e.dsinks, &ref->dsinks}}};
  ASSERT_EQ(ref->dsinks.size(), spec.sinks ? size_t(spec.heads) : 0);
  for (const auto &[name, stats] : grads) {
    double largest = 0;
    for (double x : *stats.second)
      largest = std::max(largest, std::abs(x));
    const Tolerance tol{abs_scale * std::max(largest, 1e-6), rel};
    EXPECT_TRUE(stats.first->within(tol.abs, tol.rel))
        << name << ": " << test::describe(*stats.first, tol) << " (largest |reference| " << largest
        << ")";
  }
}

// ---- the IR ------------------------------------------------------------------

TEST(BackwardIr, ProgramsVerifyAndRoundTrip) {
  for (const Case &c : kCases) {
    const AttentionSpec spec = spec_of(c);
    ir::Config config;
    config.block_n = 32;
    for (auto build : {ir::build_backward_dq, ir::build_backward_dkdv}) {
      auto p = build(spec, config);
      ASSERT_TRUE(p) << c.name << ": " << p.status().message();
      ASSERT_TRUE(ir::verify(*p)) << c.name << ": " << ir::verify(*p).message();
      const std::string text = ir::print(*p);
      auto back = ir::parse(text);
      ASSERT_TRUE(back) << back.status().message() << "\n" << text;
      EXPECT_EQ(ir::print(*back), text);
    }
  }
}

TEST(BackwardIr, TransposedRangeCoversEveryVisiblePair) {
  const Window windows[] = {{}, {0, 0}, {5, 3}, {17, -1}, {-1, 9}};
  for (int64_t sq : {1, 7, 33, 64})
    for (int64_t sk : {1, 9, 40, 64})
      for (bool causal : {false, true})
        for (const Window &w : windows)
          for (int64_t bm : {16, 32})
            for (int64_t bn : {16, 32}) {
              for (int64_t kb = 0; kb * bm < sk; ++kb) {
                const ir::BlockRange r = ir::q_block_range(kb, bm, bn, sq, sk, causal, w);
                for (int64_t j = kb * bm; j < std::min(sk, kb * bm + bm); ++j)
                  for (int64_t i = 0; i < sq; ++i)
                    if (ir::visible(i, j, sq, sk, causal, w))
                      ASSERT_TRUE(i / bn >= r.begin && i / bn < r.end)
                          << "sq " << sq << " sk " << sk << " causal " << causal << " window "
                          << w.left << "," << w.right << " key " << j << " query " << i;
              }
            }
}

TEST(BackwardIr, RefusalsNameTheFeature) {
  AttentionSpec spec = make_spec(1, 2, 2, 16, 16, 64, 64, DType::bf16);
  const std::pair<const char *, std::function<void(AttentionSpec &)>> cases[] = {
      {"KV-cache sequences", [](AttentionSpec &s) { s.seqs.used_k = true; }}};
  for (const auto &[what, change] : cases) {
    AttentionSpec s = spec;
    change(s);
    Status v = ir::validate_backward(s);
    ASSERT_FALSE(v) << what;
    EXPECT_NE(v.message().find(what), std::string::npos) << v.message();
    EXPECT_NE(v.message().find("the backward pass does not take"), std::string::npos);
  }
}

// ---- the interpreter -----------------------------------------------------------

/// The dK/dV program writing f32 per query head (GQA, packed keys), then the
/// group sum the reduce kernel computes, on the host, into t.dk and t.dv.
void sum_heads_on_host(const AttentionSpec &spec, const ir::Config &config,
                       const ir::Bindings &args, std::vector<float> &l, std::vector<float> &d,
                       HostTensors &t) {
  const ir::BackwardWorkspace ws = ir::backward_workspace(spec);
  std::vector<float> dk_heads(size_t(ws.dv_offset - ws.dk_offset), std::nanf("")),
      dv_heads(size_t(ws.elements - ws.dv_offset), std::nanf(""));
  auto dkdv = ir::build_backward_dkdv(spec, config);
  ASSERT_TRUE(dkdv) << dkdv.status().message();
  Status s =
      ir::interpret(*dkdv, args, t, {{"L", &l}, {"D", &d}, {"dK", &dk_heads}, {"dV", &dv_heads}});
  ASSERT_TRUE(s) << s.message();
  const int64_t g = spec.group();
  for (auto [heads, out, strides, dim] : {std::tuple{&dk_heads, &t.dk, &spec.k, spec.head_dim_qk},
                                          std::tuple{&dv_heads, &t.dv, &spec.v, spec.head_dim_v}})
    for (int64_t b = 0; b < spec.batch; ++b)
      for (int64_t kh = 0; kh < spec.kv_heads; ++kh)
        for (int64_t j = 0; j < spec.seqlen_k; ++j)
          for (int64_t c = 0; c < dim; ++c) {
            float sum = 0;
            for (int64_t h = kh * g; h < kh * g + g; ++h)
              sum += (*heads)[size_t(((b * spec.heads + h) * spec.seqlen_k + j) * dim + c)];
            (*out)[size_t(b * strides->batch + kh * strides->head + j * strides->seq +
                          c * strides->dim)] = round_to(spec.dtype, sum);
          }
}

class BackwardInterpreter : public testing::TestWithParam<Case> {};

TEST_P(BackwardInterpreter, MatchesFloat64) {
  const AttentionSpec spec = spec_of(GetParam()), ref = reference_spec_of(GetParam());
  HostTensors t = make_random_inputs(spec, 21);
  make_random_grad(spec, t, 22);
  reference_forward(ref, t);
  std::vector<float> l, d;
  ir::backward_preprocess(spec, t, l, d);
  ir::Config config;
  config.block_n = 32;
  const ir::Bindings args = ir::bind_backward(spec);
  auto dq = ir::build_backward_dq(spec, config);
  ASSERT_TRUE(dq) << dq.status().message();
  ASSERT_TRUE(ir::interpret(*dq, args, t, {{"L", &l}, {"D", &d}}));
  if (ir::backward_dkdv_direct(spec)) { // into t.dk and t.dv, in the dtype
    auto dkdv = ir::build_backward_dkdv_direct(spec, config);
    ASSERT_TRUE(dkdv) << dkdv.status().message();
    Status s = ir::interpret(*dkdv, args, t, {{"L", &l}, {"D", &d}});
    ASSERT_TRUE(s) << s.message();
  } else {
    sum_heads_on_host(spec, config, args, l, d, t);
  }
  // The sinks' gradient as the sinks kernel computes it, from L and D:
  // -sum over a head's rows of 2^(sink log2(e) - L) * D.
  if (spec.sinks) {
    t.dsinks.assign(size_t(spec.heads), 0.0f);
    for (size_t row = 0; row < l.size(); ++row)
      if (!std::isinf(l[row]))
        t.dsinks[row / size_t(spec.seqlen_q) % size_t(spec.heads)] -=
            std::exp2(t.sinks[row / size_t(spec.seqlen_q) % size_t(spec.heads)] *
                          float(std::numbers::log2e) -
                      l[row]) *
            d[row];
  }
  expect_gradients_match(ref, t);
}

INSTANTIATE_TEST_SUITE_P(Cases, BackwardInterpreter, testing::ValuesIn(kCases),
                         [](const auto &info) { return std::string(info.param.name); });

// ---- Attention on the emulator -----------------------------------------------------

std::vector<uint16_t> bits_of(const AttentionSpec &spec, const std::vector<float> &x) {
  std::vector<uint16_t> out(x.size(), 0x7fc1); // gaps keep a NaN
  for (size_t i = 0; i < x.size(); ++i)
    if (!std::isnan(x[i]))
      out[i] = uint16_t(to_bits(spec.dtype, x[i]));
  return out;
}

std::vector<float> floats_of(const AttentionSpec &spec, const std::vector<uint16_t> &x) {
  std::vector<float> out(x.size());
  for (size_t i = 0; i < x.size(); ++i)
    out[i] = from_bits(spec.dtype, x[i]);
  return out;
}

/// Options that run the emulator's kernels (no device compiler) on two
/// threads, under `rules`.
Options emulated(std::string_view rules = "auto") {
  Options o;
  o.compiler = "none";
  o.rules = std::string(rules);
  o.cpu_threads = 2;
  return o;
}

/// Forward then backward of `spec`'s shapes through `attn`; the gradients into
/// t (a gradient element the backward did not write stays NaN). Varlen specs
/// pass t's cu_seqlens, and a backward without them is refused by name.
void run_on(Attention &attn, const AttentionSpec &spec, HostTensors &t) {
  const std::vector<uint16_t> q = bits_of(spec, t.q), k = bits_of(spec, t.k),
                              v = bits_of(spec, t.v), dout = bits_of(spec, t.dout);
  std::vector<uint16_t> o(size_t(spec.o_elements()), 0x7fc1), dq(t.q.size(), 0x7fc1),
      dk(t.k.size(), 0x7fc1), dv(t.v.size(), 0x7fc1);
  std::vector<float> lse(size_t(spec.lse_elements()), std::nanf(""));
  const float *slopes = t.alibi_slopes.empty() ? nullptr : t.alibi_slopes.data();
  // The mask tensor in its own element type, as a GPU reads it.
  std::vector<uint32_t> mask_words(t.attn_mask.size()); // 4 bytes per element: room for any type
  mask_storage(spec.mask, t.attn_mask, mask_words.data());
  const void *mask = spec.mask == MaskType::none ? nullptr : mask_words.data();
  const int32_t *cu_q = spec.seqs.packed_q ? t.cu_seqlens_q.data() : nullptr;
  const int32_t *cu_k = spec.seqs.packed_k ? t.cu_seqlens_k.data() : nullptr;
  AttentionTensors fwd{q.data(), k.data(), v.data(), o.data(), lse.data()};
  fwd.alibi_slopes = slopes;
  fwd.attn_mask = mask;
  fwd.cu_seqlens_q = cu_q;
  fwd.cu_seqlens_k = cu_k;
  fwd.sinks = spec.sinks ? t.sinks.data() : nullptr;
  Status s = attn.forward(spec, fwd);
  ASSERT_TRUE(s) << s.message();
  std::vector<float> dsinks(spec.sinks ? size_t(spec.heads) : 0, std::nanf("")), dsinks2 = dsinks;
  auto grads_into = [&](std::vector<uint16_t> &gq, std::vector<uint16_t> &gk,
                        std::vector<uint16_t> &gv, std::vector<float> &gs) {
    BackwardTensors b{q.data(),  k.data(),  v.data(), o.data(), lse.data(), dout.data(), gq.data(),
                      gk.data(), gv.data(), slopes,   mask,     cu_q,       cu_k};
    if (spec.sinks) {
      b.sinks = t.sinks.data();
      b.dsinks = gs.data();
    }
    return b;
  };
  s = attn.backward(spec, grads_into(dq, dk, dv, dsinks));
  ASSERT_TRUE(s) << s.message();
  t.dsinks = dsinks;
  t.o = floats_of(spec, o);
  t.dq = floats_of(spec, dq);
  t.dk = floats_of(spec, dk);
  t.dv = floats_of(spec, dv);
  // The same call again: the same bits (no atomics, sums in a fixed order).
  std::vector<uint16_t> dq2(dq.size(), 0x7fc1), dk2(dk.size(), 0x7fc1), dv2(dv.size(), 0x7fc1);
  s = attn.backward(spec, grads_into(dq2, dk2, dv2, dsinks2));
  ASSERT_TRUE(s) << s.message();
  EXPECT_EQ(dq, dq2);
  EXPECT_EQ(0, std::memcmp(dsinks.data(), dsinks2.data(), dsinks.size() * 4));
  EXPECT_EQ(dk, dk2);
  EXPECT_EQ(dv, dv2);
  if (cu_q) {
    BackwardTensors without = grads_into(dq2, dk2, dv2, dsinks2);
    without.cu_seqlens_q = nullptr;
    s = attn.backward(spec, without);
    ASSERT_FALSE(s);
    EXPECT_NE(s.message().find("backward: cu_seqlens_q is null"), std::string::npos) << s.message();
  }
}

/// run_on through a new Attention on `device`.
void run_attention(const AttentionSpec &spec, const std::string &device, const Options &options,
                   HostTensors &t) {
  auto attn = Attention::create(spec, device, options);
  ASSERT_TRUE(attn) << attn.status().message();
  run_on(*attn, spec, t);
}

struct Lowering {
  const char *arch;
  const char *rules;
};
const Lowering kLowerings[] = {{"gfx1201", "auto"}, {"gfx1100", "auto"}, {"gfx942", "auto"},
                               {"gfx90a", "auto"},  {"gfx950", "auto"},  {"gfx1201", "simt"}};

class BackwardEmulator : public testing::TestWithParam<std::tuple<Lowering, Case>> {};

TEST_P(BackwardEmulator, MatchesFloat64) {
  if (!runtime::emulator_available())
    GTEST_SKIP() << "this build has no emulator (FLASHJIT_WITH_LLVM=OFF)";
  const auto &[how, c] = GetParam();
  const AttentionSpec spec = spec_of(c), ref = reference_spec_of(c);
  HostTensors t = make_random_inputs(spec, 31);
  make_random_grad(spec, t, 32);
  const Options options = emulated(how.rules);
  run_attention(spec, fmt::format("emulator:{}", how.arch), options, t);
  if (HasFatalFailure())
    return;
  // The reference's gradients come from the forward's exact O; the kernels used
  // the O forward stored, whose rounding is inside the tolerance.
  expect_gradients_match(ref, t);
}

INSTANTIATE_TEST_SUITE_P(Families, BackwardEmulator,
                         testing::Combine(testing::ValuesIn(kLowerings), testing::ValuesIn(kCases)),
                         [](const auto &info) {
                           const Lowering &l = std::get<0>(info.param);
                           return fmt::format("{}{}_{}", l.arch,
                                              std::string_view(l.rules) == "simt" ? "_simt" : "",
                                              std::get<1>(info.param).name);
                         });

// One handle, two calls: with one query head per KV head the dK/dV kernel writes
// dK and dV itself (no reduce); with GQA it writes f32 per query head and the
// reduce sums each group. Both against float64; explain() counts each.
TEST(BackwardEmulator, MhaWritesDkDvDirectlyAndGqaSumsEachGroup) {
  if (!runtime::emulator_available())
    GTEST_SKIP() << "this build has no emulator (FLASHJIT_WITH_LLVM=OFF)";
  const Case mha{"mha", 1, 2, 2, 40, 56, 64, 64, true}, gqa{"gqa", 2, 4, 2, 33, 40, 64, 64, true};
  auto attn = Attention::create(spec_of(mha), "emulator:gfx1201", emulated());
  ASSERT_TRUE(attn) << attn.status().message();
  for (const Case &c : {mha, gqa}) {
    SCOPED_TRACE(c.name);
    const AttentionSpec spec = spec_of(c);
    EXPECT_EQ(ir::backward_dkdv_direct(spec), c.hq == c.hkv);
    HostTensors t = make_random_inputs(spec, 41);
    make_random_grad(spec, t, 42);
    run_on(*attn, spec, t);
    if (HasFatalFailure())
      return;
    expect_gradients_match(reference_spec_of(c), t);
  }
  const std::string text = attn->explain();
  // Each backward() of run_on runs twice (the second checks the same bits).
  EXPECT_NE(text.find("backward: 4 calls: 2 wrote dK and dV directly (fa_bwd_dkdv_direct_"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("2 wrote them per query head in f32, then summed each group (fa_bwd_dkdv_"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("fa_bwd_reduce_"), std::string::npos) << text;
}

// Empty shapes, FlashAttention-2's semantics: without keys dQ is 0 (no query
// sees a key); without queries dK and dV are 0 (no key is seen); a batch of 0
// writes nothing. Each gradient starts as NaN, so an element left unwritten
// shows; MHA (dK/dV written directly) and GQA (the group sum) alike.
TEST(BackwardEmulator, EmptyShapesWriteZeroGradients) {
  if (!runtime::emulator_available())
    GTEST_SKIP() << "this build has no emulator (FLASHJIT_WITH_LLVM=OFF)";
  for (const char *arch : {"gfx1201", "gfx942"})
    for (const Case &base : {Case{"mha", 2, 2, 2, 40, 56, 64, 64, true},
                             Case{"gqa", 2, 4, 2, 33, 40, 48, 48, false, {16, 0}}}) {
      auto attn = Attention::create(spec_of(base), fmt::format("emulator:{}", arch), emulated());
      ASSERT_TRUE(attn) << attn.status().message();
      for (auto [b, sq, sk] : {std::tuple{2, 0, 56}, {2, 40, 0}, {0, 40, 56}, {1, 0, 0}}) {
        SCOPED_TRACE(fmt::format("{} {} b={} sq={} sk={}", arch, base.name, b, sq, sk));
        Case c = base;
        c.b = b;
        c.sq = sq;
        c.sk = sk;
        const AttentionSpec spec = spec_of(c);
        HostTensors t = make_random_inputs(spec, 51);
        make_random_grad(spec, t, 52);
        run_on(*attn, spec, t);
        if (HasFatalFailure())
          return;
        for (const auto &[name, grad] : {std::pair{"o", &t.o}, std::pair{"dq", &t.dq},
                                         std::pair{"dk", &t.dk}, std::pair{"dv", &t.dv}})
          EXPECT_TRUE(std::all_of(grad->begin(), grad->end(), [](float x) { return x == 0; }))
              << name << " has an element that is not 0 (NaN: never written)";
      }
    }
}

// Masks with empty, full and mixed blocks (tests/support/masks.h: left padding
// and causal as a bool tensor, an additive one with a stripe of finite values):
// the dQ and dK/dV loops each read the mask's block summary of their own blocks
// (the dK/dV loop transposed), skip the empty ones, and read no mask element in
// the full ones; the gradients match float64's.
TEST(BackwardMaskBlocks, StructuredMasksMatchFloat64) {
  if (!runtime::emulator_available())
    GTEST_SKIP() << "this build has no emulator (FLASHJIT_WITH_LLVM=OFF)";
  const Case cases[] = {
      with_mask({"", 2, 2, 1, 100, 130, 64, 64}, "bool_padding_causal", MaskType::boolean, "bqk"),
      with_mask({"", 2, 2, 2, 90, 90, 32, 32}, "f32_stripes", MaskType::f32, "bhqk")};
  for (const char *arch : {"gfx1201", "gfx942"})
    for (const Case &c : cases) {
      SCOPED_TRACE(fmt::format("{} {}", arch, c.name));
      const AttentionSpec spec = spec_of(c), ref = reference_spec_of(c);
      HostTensors t = make_random_inputs(spec, 51);
      test::structured_mask(spec, t.attn_mask);
      make_random_grad(spec, t, 52);
      const Options options = emulated();
      run_attention(spec, fmt::format("emulator:{}", arch), options, t);
      if (HasFatalFailure())
        return;
      expect_gradients_match(ref, t);
    }
}

/// Forward and backward of `c` on the emulator of `arch` (with `config` where
/// given, else the library's); the gradients against float64.
void expect_emulated_gradients(const char *arch, const Case &c, uint64_t seed,
                               const std::optional<ir::Config> &config = std::nullopt) {
  const AttentionSpec spec = spec_of(c);
  HostTensors t = make_random_inputs(spec, seed);
  make_random_grad(spec, t, seed + 1);
  Options options = emulated();
  options.config = config;
  run_attention(spec, fmt::format("emulator:{}", arch), options, t);
  if (testing::Test::HasFatalFailure())
    return;
  expect_gradients_match(reference_spec_of(c), t);
}

/// The VGPRs LLVM 22 spills in the `kind` kernel of `spec`'s backward for `arch`
/// (the default config: backward_config's), the kernel named in `name`; -1, and
/// a test failure, where it does not generate or compile.
int vgpr_spills(const AttentionSpec &spec, const char *arch, pipeline::KernelKind kind,
                std::string &name) {
  Options options;
  options.compiler = "llvm";
  auto target = lowering::parse_target(arch);
  auto g = pipeline::generate(spec, arch, options, nullptr, kind);
  if (!target || !g) {
    ADD_FAILURE() << (target ? g.status().message() : target.status().message());
    return -1;
  }
  name = g->lowered.kernel_name;
  auto compiled = pipeline::compile(*g, options);
  if (!compiled) {
    ADD_FAILURE() << compiled.status().message();
    return -1;
  }
  auto reports = compiler::read_resources(compiled->code, target->vgpr_file_per_simd,
                                          target->max_waves_per_simd, target->lds_bytes_per_cu);
  if (!reports || reports->empty()) {
    ADD_FAILURE() << name << ": no resource report";
    return -1;
  }
  return reports->front().vgpr_spill_count;
}

// RDNA's backward at head dim 128 (issue 15: no VGPR spills on gfx1201 up to
// head dim 128): for dK/dV backward_config picks 16-query blocks with Q and dO
// in LDS (gfx11, which holds each operand twice, also dV's and dK's loops
// apart), for dQ K and V in LDS; the code objects LLVM makes of them spill
// nothing on gfx1201 nor gfx1100 (which spilled 382 in dK/dV with the config
// before, its dQ 84; 3-8 in dK/dV until keep_live_values pinned the values live
// across a staging), and the gradients match float64.
TEST(BackwardRdna, HeadDim128FitsTheRegistersAndMatchesFloat64) {
  if (!runtime::emulator_available())
    GTEST_SKIP() << "this build has no emulator (FLASHJIT_WITH_LLVM=OFF)";
  const Case c{"rdna_d128", 1, 2, 1, 40, 70, 128, 128, true};
  const AttentionSpec spec = spec_of(c);
  for (const char *arch : {"gfx1201", "gfx1100"}) {
    SCOPED_TRACE(arch);
    auto target = lowering::parse_target(arch);
    ASSERT_TRUE(target) << target.status().message();
    const bool gfx11 = std::string_view(arch) == "gfx1100";
    const ir::Config config = lowering::backward_config(
        spec, *target, lowering::default_config(spec, *target), /*dkdv=*/true);
    EXPECT_EQ(config.block_n, 16);
    EXPECT_TRUE(config.q_in_lds);
    EXPECT_EQ(config.dkdv_passes, gfx11 ? 2 : 1);
    const ir::Config dq = lowering::backward_config(
        spec, *target, lowering::default_config(spec, *target), /*dkdv=*/false);
    EXPECT_EQ(dq.block_n, gfx11 ? 16 : 32);
    EXPECT_TRUE(dq.q_in_lds);
    for (auto kind : {pipeline::KernelKind::backward_dkdv, pipeline::KernelKind::backward_dq}) {
      std::string name;
      EXPECT_EQ(vgpr_spills(spec, arch, kind, name), 0)
          << name << ": LLVM 22's allocation against the register model's fit "
          << "(backward_config; gfx1100 spilled 3-8 before the pins of keep_live_values)";
    }

    expect_emulated_gradients(arch, c, 41);
    if (HasFatalFailure())
      return;
  }
}

// gfx12's backward at head dims whose 64-row blocks spill (gfx1201, dQ: 133
// VGPRs at 256, 114 at 256/128; dK/dV: 126 and 54): backward_config takes dQ
// blocks of 32 rows on two waves (16 on one at 288) and dK/dV blocks of 16 rows
// on one wave in two passes, their row operands in LDS; LLVM spills nothing,
// and the gradients of the whole backward match float64 (head dim 256 on the
// emulator).
TEST(BackwardRdna, WideHeadDimsTakeLdsOperandsAndMatchFloat64) {
  if (!runtime::emulator_available())
    GTEST_SKIP() << "this build has no emulator (FLASHJIT_WITH_LLVM=OFF)";
  auto target = lowering::parse_target("gfx1201");
  ASSERT_TRUE(target) << target.status().message();
  for (auto [dqk, dv, dq_waves] :
       {std::tuple{256, 256, 2}, std::tuple{256, 128, 2}, std::tuple{288, 288, 1}}) {
    SCOPED_TRACE(fmt::format("head dims {}/{}", dqk, dv));
    const Case c{"rdna_wide", 1, 2, 1, 40, 70, dqk, dv, true};
    const AttentionSpec spec = spec_of(c);
    const ir::Config base = lowering::default_config(spec, *target);
    const ir::Config dq = lowering::backward_config(spec, *target, base, /*dkdv=*/false);
    EXPECT_EQ(dq.waves, dq_waves);
    EXPECT_EQ(dq.block_m, 16 * dq_waves);
    EXPECT_TRUE(dq.q_in_lds);
    std::string name;
    EXPECT_EQ(vgpr_spills(spec, "gfx1201", pipeline::KernelKind::backward_dq, name), 0) << name;
    if (dqk > 256)
      continue; // dK/dV's 16-row block passes the LDS from there
    const ir::Config dkdv = lowering::backward_config(spec, *target, base, /*dkdv=*/true);
    EXPECT_EQ(dkdv.block_m, 16);
    EXPECT_EQ(dkdv.waves, 1);
    EXPECT_EQ(dkdv.dkdv_passes, 2);
    EXPECT_TRUE(dkdv.q_in_lds);
    EXPECT_EQ(vgpr_spills(spec, "gfx1201", pipeline::KernelKind::backward_dkdv, name), 0) << name;
  }
  expect_emulated_gradients("gfx1201", {"rdna_d256", 1, 2, 1, 40, 70, 256, 256, true}, 43);
}

// gfx11's backward at wide head dims (each 16-bit operand held twice): where the
// 64-row block's operands do not fit the LDS beside the loop's tiles, it kept them
// in registers and spilled (gfx1100 dK/dV: 48 VGPRs at head dim 160, 228-628 at
// 256; dQ 194 at 192, 267-377 at 256). backward_config takes blocks of 32 rows on
// two waves (16 on one where those pass the LDS) with the operands in LDS and
// 16-key blocks; with the values live across each staging pinned
// (keep_live_values) LLVM spills at most one VGPR, and the gradients of the
// whole backward at head dim 256 match float64 on the emulator.
TEST(BackwardRdna, Gfx11WideHeadDimsTakeFewerRowsWithLdsOperands) {
  if (!runtime::emulator_available())
    GTEST_SKIP() << "this build has no emulator (FLASHJIT_WITH_LLVM=OFF)";
  auto target = lowering::parse_target("gfx1100");
  ASSERT_TRUE(target) << target.status().message();
  for (auto [d, dkdv_rows] : {std::pair{160, 32}, std::pair{192, 32}, std::pair{256, 16}}) {
    SCOPED_TRACE(fmt::format("head dim {}", d));
    const AttentionSpec spec = spec_of({"gfx11_wide", 1, 2, 1, 40, 70, d, d, true});
    const ir::Config base = lowering::default_config(spec, *target);
    const ir::Config dq = lowering::backward_config(spec, *target, base, /*dkdv=*/false);
    const ir::Config dkdv = lowering::backward_config(spec, *target, base, /*dkdv=*/true);
    EXPECT_TRUE(dq.q_in_lds && dkdv.q_in_lds);
    EXPECT_EQ(dkdv.block_m, dkdv_rows);
    EXPECT_EQ(dkdv.waves, dkdv_rows / 16);
    EXPECT_EQ(dkdv.block_n, 16);
    EXPECT_EQ(dkdv.dkdv_passes, 2);
    if (d > 160) { // at 160 dQ's 64-row block holds its operands in LDS
      EXPECT_EQ(dq.block_m, 32);
      EXPECT_EQ(dq.block_n, 16);
    }
    std::string name;
    EXPECT_EQ(vgpr_spills(spec, "gfx1100", pipeline::KernelKind::backward_dq, name), 0) << name;
    const int spills = vgpr_spills(spec, "gfx1100", pipeline::KernelKind::backward_dkdv, name);
    EXPECT_TRUE(spills >= 0 && spills <= 1) << name << ": " << spills << " VGPRs spilled";
  }
  expect_emulated_gradients("gfx1100", {"gfx11_d256", 1, 2, 1, 40, 70, 256, 256, true}, 47);
}

// On AMD a staging inside a loop runs through registers behind a branch per
// chunk, and LLVM's MachineSink moves pure ops (a product's matrix instructions)
// past it to their first use, keeping the product's operand fragments live across
// the staging (gfx1100, head dim 256 dK/dV: 201 VGPRs spilled); in the backward
// it also moved the S^T product into the mask's branch. keep_live_values pins the
// f32 tiles computed before each such staging (and the backward's mask) and read
// from there on: in the dK/dV loop before the mask and L's, dO's and D's stagings,
// never the accumulators the loop yields nor a 16-bit operand. The forward (only
// P's operand and O's rescale live across V's staging; its mask not pinned) and
// NVIDIA (asynchronous copies) pin nothing.
TEST(BackwardRdna, ValuesLiveAcrossAStagingArePinnedOnAmdOnly) {
  const AttentionSpec spec = spec_of({"pins", 1, 2, 1, 40, 70, 80, 80, true});
  for (const char *arch : {"gfx1201", "gfx1100", "gfx942", "sm_80"}) {
    SCOPED_TRACE(arch);
    const bool amd = std::string_view(arch) != "sm_80";
    Options options;
    auto dkdv =
        pipeline::generate(spec, arch, options, nullptr, pipeline::KernelKind::backward_dkdv);
    auto forward =
        pipeline::generate(spec, arch, options, nullptr, pipeline::KernelKind::attention);
    ASSERT_TRUE(dkdv && forward);
    const std::string &src = dkdv->lowered.source;
    const std::string pin = "for (auto &fragment : tile) fj_pin(fragment);";
    const size_t first = src.find(pin);
    EXPECT_EQ(first != std::string::npos, amd);
    if (amd) {
      // S^T, pinned as the mask op starts (before its branch: the loop's first
      // pin), and the scaled S^T before L's staging.
      const size_t loop = src.find(" = for %qb"), mask = src.find("= mask ", loop),
                   l_stage = src.find("// IR: stage block qb of @L into");
      EXPECT_TRUE(loop < mask && mask < first && first < l_stage) << first;
      EXPECT_LT(src.find(pin, first + 1), l_stage);
      // The yields copy the loop's new accumulators into its arguments
      // ("dv_i[qt][c][e] = t21[qt][c][e];"): those tiles are not pinned.
      const std::regex yielded(R"((\w+)_i\[qt\]\[c\]\[e\] = (t\d+)\[qt\]\[c\]\[e\];)");
      int accumulators = 0;
      for (auto m = std::sregex_iterator(src.begin(), src.end(), yielded);
           m != std::sregex_iterator(); ++m, ++accumulators)
        EXPECT_EQ(src.find("(auto &tile : " + (*m)[2].str() + ")"), std::string::npos)
            << (*m)[2].str() << ", yielded as " << (*m)[1].str();
      EXPECT_GE(accumulators, 2); // dV's and dK's (one loop, or two passes)
    }
    EXPECT_EQ(forward->lowered.source.find(pin), std::string::npos);
  }
}

// gfx950's dK/dV at head dim 256: its 160 KiB of LDS hold 64-key blocks, and
// in one pass LLVM took 512 VGPRs and spilled 372; the register count now
// counts CDNA's loop-block operands and takes two passes (500, no spill), and
// the gradients match float64 on the emulator.
TEST(BackwardCdna, Gfx950HeadDim256TakesTwoPassesAndMatchesFloat64) {
  if (!runtime::emulator_available())
    GTEST_SKIP() << "this build has no emulator (FLASHJIT_WITH_LLVM=OFF)";
  auto target = lowering::parse_target("gfx950");
  ASSERT_TRUE(target) << target.status().message();
  const Case c{"cdna_d256", 1, 2, 1, 40, 70, 256, 256, true};
  const AttentionSpec spec = spec_of(c);
  const ir::Config dkdv = lowering::backward_config(
      spec, *target, lowering::default_config(spec, *target), /*dkdv=*/true);
  EXPECT_EQ(dkdv.dkdv_passes, 2);
  std::string name;
  EXPECT_EQ(vgpr_spills(spec, "gfx950", pipeline::KernelKind::backward_dkdv, name), 0) << name;
  expect_emulated_gradients("gfx950", c, 45);
}

// A given config (C's fj_options, Python's config=) leaves dkdv_passes 0 unless
// it sets it: the lowering then chooses by the same register count as its own
// configs, so a head-dim-256 config does not run one loop that spills (it did:
// 1, the C++ default, was what C and Python passed). A set value is kept; an
// unresolved 0 never reaches the dK/dV program.
TEST(BackwardConfig, GivenConfigsLeaveTheDkdvPassesToTheLowering) {
  auto sm90 = lowering::parse_target("sm_90");
  auto gfx950 = lowering::parse_target("gfx950");
  ASSERT_TRUE(sm90 && gfx950);
  const AttentionSpec d256 = make_spec(1, 2, 2, 300, 300, 256, 256, DType::bf16);
  const AttentionSpec d64 = make_spec(1, 2, 2, 300, 300, 64, 64, DType::bf16);
  ir::Config given{64, 32, 4, 2, true};
  given.dkdv_passes = 0;
  EXPECT_EQ(lowering::backward_dkdv_passes(d256, *sm90, given), 2);
  EXPECT_EQ(lowering::backward_dkdv_passes(d64, *sm90, given), 1);
  EXPECT_EQ(lowering::backward_dkdv_passes(d256, *gfx950, ir::Config{64, 64, 4, 1, false}), 2);
  for (const int64_t passes : {0, 1, 2}) {
    Options options;
    options.config = given;
    options.config->dkdv_passes = passes;
    for (auto kind :
         {pipeline::KernelKind::backward_dkdv_direct, pipeline::KernelKind::backward_dkdv}) {
      auto g = pipeline::generate(d256, "sm_90", options, nullptr, kind);
      ASSERT_TRUE(g) << g.status().message();
      EXPECT_EQ(g->config.dkdv_passes, passes == 0 ? 2 : passes);
      EXPECT_EQ(g->program.config.count("dkdv_passes") == 1, passes != 1);
    }
  }
  auto unresolved = ir::build_backward_dkdv(d256, given);
  ASSERT_FALSE(unresolved);
  EXPECT_NE(unresolved.status().message().find("unresolved"), std::string::npos)
      << unresolved.status().message();
  ir::Config three = given;
  three.dkdv_passes = 3;
  EXPECT_NE(ir::validate(three).message().find("expected 1 (one loop), 2"), std::string::npos);
}

// RDNA's backward with per-score modifiers, which hold registers of their own:
// backward_config counts them (docs/decisions.md, "RDNA's backward without
// spills"), so LLVM spills nothing where the plain kernels spilled nothing
// (before: gfx1100 dK/dV at head dim 64 spilled 24 VGPRs with dropout, 20 with a
// bool mask, 8 with softcap; gfx1201 at 96 8 and 9); and the gradients of one
// of the smaller configs match float64 on the emulator.
TEST(BackwardRdna, ModifiersFitTheRegistersAndMatchFloat64) {
  if (!runtime::emulator_available())
    GTEST_SKIP() << "this build has no emulator (FLASHJIT_WITH_LLVM=OFF)";
  const Case base{"rdna_modifiers", 1, 2, 1, 40, 70, 64, 64, true};
  Case softcap = base;
  softcap.softcap = 20;
  const Case cases[] = {with_dropout(base, "dropout", 0.2),
                        with_mask(base, "bool_mask", MaskType::boolean, "bk"),
                        with_mask(base, "bf16_mask", MaskType::bf16, "qk"), softcap};
  std::vector<std::pair<std::string, std::future<std::string>>> results;
  for (const char *arch : {"gfx1201", "gfx1100"})
    for (const Case &c : cases)
      for (int64_t d : {64, 96})
        for (auto kind : {pipeline::KernelKind::backward_dkdv, pipeline::KernelKind::backward_dq}) {
          Case at = c;
          at.dqk = at.dv = d;
          results.emplace_back(fmt::format("{} {} head dim {} kind {}", arch, c.name, d, int(kind)),
                               std::async(std::launch::async, [arch, at, kind]() -> std::string {
                                 std::string name;
                                 const int spills = vgpr_spills(spec_of(at), arch, kind, name);
                                 return spills == 0
                                            ? ""
                                            : fmt::format("{}: {} VGPRs spilled", name, spills);
                               }));
        }
  for (auto &[what, result] : results)
    EXPECT_EQ(result.get(), "") << what;
  expect_emulated_gradients("gfx1100", with_dropout(base, "dropout_d64", 0.2), 47);
}

const Case &case_named(std::string_view name) {
  return *std::find_if(std::begin(kCases), std::end(kCases),
                       [&](const Case &c) { return std::string_view(c.name) == name; });
}

/// A config of the caller's for `spec` on `t`, which the plan runs every kernel
/// with as it is: 32-key blocks, so that two copies of the dK/dV loop's four
/// tiles fit 64 KiB, and 16-query matrix tiles (the backward's, backward_config).
ir::Config small_block_config(const AttentionSpec &spec, const lowering::Target &t) {
  ir::Config config = lowering::default_config(spec, t);
  config.block_n = 32;
  config.mma_m = 16;
  return config;
}

// Config stages 2 (the default on NVIDIA): the backward's loops prefetch the next
// block's tiles and column vectors into a second copy of their LDS buffers
// (KernelEmitter::plan_prefetch). The AMD rules run it here, on the emulator.
TEST(BackwardEmulator, PrefetchedLoopsMatchFloat64) {
  if (!runtime::emulator_available())
    GTEST_SKIP() << "this build has no emulator (FLASHJIT_WITH_LLVM=OFF)";
  for (const char *arch : {"gfx1201", "gfx1100", "gfx942"})
    for (const char *name : {"causal_sq_gt_sk", "window_gqa", "mqa_dqk_ne_dv_f16"}) {
      SCOPED_TRACE(fmt::format("{} {}", arch, name));
      const Case &c = case_named(name);
      const AttentionSpec spec = spec_of(c);
      auto target = lowering::parse_target(arch);
      ASSERT_TRUE(target) << target.status().message();
      ir::Config config = small_block_config(spec, *target);
      config.stages = 2;
      for (bool dkdv : {false, true}) {
        auto p = dkdv ? ir::build_backward_dkdv(spec, config) : ir::build_backward_dq(spec, config);
        ASSERT_TRUE(p) << p.status().message();
        auto l = lowering::lower(*p, *target);
        ASSERT_TRUE(l) << l.status().message();
        EXPECT_NE(l->source.find("// Block prefetch:"), std::string::npos);
        EXPECT_NE(l->source.find("fj_copy ^= 1;"), std::string::npos);
      }
      expect_emulated_gradients(arch, c, 33, config);
      if (HasFatalFailure())
        return;
    }
}

// Config dkdv_passes 2 (taken where dK and dV would not both fit the registers,
// lowering::backward_config): the dK/dV program runs dV's loop, then dK's. With
// one buffer per tile and with stages 2 (the copies of an iteration started at
// its top: plan_early_issue); dropout draws the same mask in both loops; softcap
// takes its derivative in dK's loop only.
TEST(BackwardEmulator, TwoPassDkDvMatchesFloat64) {
  if (!runtime::emulator_available())
    GTEST_SKIP() << "this build has no emulator (FLASHJIT_WITH_LLVM=OFF)";
  for (const char *arch : {"gfx1201", "gfx1100", "gfx942"})
    for (const char *name : {"causal_sq_gt_sk", "mqa_dqk_ne_dv_f16", "softcap_gqa", "dropout_gqa"})
      for (int64_t stages : {1, 2}) {
        SCOPED_TRACE(fmt::format("{} {} stages {}", arch, name, stages));
        const Case &c = case_named(name);
        auto target = lowering::parse_target(arch);
        ASSERT_TRUE(target) << target.status().message();
        ir::Config config = small_block_config(spec_of(c), *target);
        config.stages = stages;
        config.dkdv_passes = 2;
        auto p = ir::build_backward_dkdv(spec_of(c), config);
        ASSERT_TRUE(p) << p.status().message();
        EXPECT_EQ(std::count_if(p->body.begin(), p->body.end(),
                                [](const ir::Op &op) { return op.kind == ir::OpKind::For; }),
                  2);
        auto l = lowering::lower(*p, *target);
        ASSERT_TRUE(l) << l.status().message();
        // With stages 2 the loops' L and D vectors, and dK's tiles (one buffer
        // each, which dV's loop declared), start at the top of each iteration.
        EXPECT_EQ(l->source.find("(plan_early_issue)") != std::string::npos, stages == 2);
        expect_emulated_gradients(arch, c, 35, config);
        if (HasFatalFailure())
          return;
      }
}

// Varlen (packed rows, cu_seqlens): ragged lengths with an empty and a one-token
// sequence, bottom-right causal and windows per sequence, GQA and MQA, Dqk != Dv,
// and spare rows past the last sequence: dK and dV get 0 there, dQ is not written.
class BackwardVarlen : public testing::TestWithParam<std::tuple<Lowering, test::SeqCase>> {};

TEST_P(BackwardVarlen, MatchesFloat64) {
  if (!runtime::emulator_available())
    GTEST_SKIP() << "this build has no emulator (FLASHJIT_WITH_LLVM=OFF)";
  const auto &[how, c] = GetParam();
  test::SeqInputs in = test::make_seq_inputs(c, 41);
  const AttentionSpec &spec = in.spec;
  HostTensors &t = in.tensors;
  make_random_grad(spec, t, 42);
  const Options options = emulated(how.rules);
  run_attention(spec, fmt::format("emulator:{}", how.arch), options, t);
  if (HasFatalFailure())
    return;
  expect_gradients_match(spec, t);
  // The rows past the last sequence: K and V rows of no sequence have zero
  // gradients; dQ's are left as they were (the poison, NaN).
  const int64_t used_q = t.cu_seqlens_q.back();
  const int64_t used_k = spec.seqs.packed_k ? t.cu_seqlens_k.back() : 0;
  for (int64_t row = used_k; spec.seqs.packed_k && row < spec.seqs.total_k; ++row)
    for (int64_t h = 0; h < spec.kv_heads; ++h) {
      for (int64_t d = 0; d < spec.head_dim_qk; ++d)
        ASSERT_EQ(t.dk[size_t(row * spec.k.seq + h * spec.k.head + d)], 0.0f) << "dk row " << row;
      for (int64_t d = 0; d < spec.head_dim_v; ++d)
        ASSERT_EQ(t.dv[size_t(row * spec.v.seq + h * spec.v.head + d)], 0.0f) << "dv row " << row;
    }
  for (int64_t row = used_q; row < spec.seqs.total_q; ++row)
    ASSERT_TRUE(std::isnan(t.dq[size_t(row * spec.q.seq)])) << "dq row " << row;
}

const test::SeqCase kVarlenCases[] = {
    {"varlen_causal_gqa4",
     8,
     2,
     64,
     64,
     DType::bf16,
     true,
     {-1, -1},
     true,
     {37, 0, 1, 70},
     {37, 0, 1, 70},
     true,
     true,
     false,
     0},
    {"varlen_window_mqa_dqk_ne_dv_f16",
     3,
     1,
     40,
     24,
     DType::f16,
     false,
     {9, 5},
     true,
     {20, 33, 5},
     {50, 17, 64},
     true,
     true,
     false,
     0},
    // Keys far longer than queries: the dK/dV grid covers max_seqlen_k's
    // blocks (a key block is not a query block past the sequence's end).
    {"varlen_short_q_long_k_causal",
     4,
     2,
     32,
     32,
     DType::bf16,
     true,
     {-1, -1},
     true,
     {3, 20},
     {150, 200},
     true,
     true,
     false,
     0},
    {"varlen_sinks_gqa",
     4,
     2,
     32,
     32,
     DType::bf16,
     true,
     {-1, -1},
     true,
     {30, 0, 45},
     {50, 10, 45},
     true,
     true,
     false,
     0,
     true},
    {"varlen_q_dense_k_causal",
     4,
     4,
     32,
     32,
     DType::bf16,
     true,
     {-1, -1},
     true,
     {12, 40},
     {48, 48},
     true,
     false,
     false,
     0},
};

INSTANTIATE_TEST_SUITE_P(Families, BackwardVarlen,
                         testing::Combine(testing::Values(kLowerings[0], kLowerings[1],
                                                          kLowerings[2], kLowerings[5]),
                                          testing::ValuesIn(kVarlenCases)),
                         [](const auto &info) {
                           const Lowering &l = std::get<0>(info.param);
                           return fmt::format("{}{}_{}", l.arch,
                                              std::string_view(l.rules) == "simt" ? "_simt" : "",
                                              std::get<1>(info.param).name);
                         });

// Interior holes (issue 14): a block that a mask_mod empties between visible
// ones is skipped, in the forward's and dQ's KV loops and in dK/dV's loop over
// query blocks, not visited with every element masked. The mask hides the keys
// of KV block 1 and the queries of query block 1 (128 rows each, a multiple of
// every family's blocks) from every pair, and their K, V, Q and dO rows hold
// NaN: a kernel that visits such a block multiplies that NaN by a weight of 0,
// and its results are NaN (masking hides a score, not a value). The float64
// reference sees finite values there and a bool mask tensor equal to the
// mask_mod. The forward runs as 4 KV splits, so some split's run starts in (or
// is) the hole. It also checks the full-block path: most visited blocks are
// wholly inside the mask and take the score function without it. Tolerances as
// above.
class BlockSparseEmulator : public testing::TestWithParam<Lowering> {};

TEST_P(BlockSparseEmulator, InteriorHolesAreSkipped) {
  if (!runtime::emulator_available())
    GTEST_SKIP() << "this build has no emulator (FLASHJIT_WITH_LLVM=OFF)";
  constexpr int64_t sq = 300, sk = 1300;
  // Hidden: queries 128..255, keys 128..255 and 640..1151 (past the 32 blocks
  // of one scan at 32-key blocks).
  auto keep = [](int64_t i, int64_t j) {
    return i / 128 != 1 && j / 128 != 1 && (j / 128 < 5 || j / 128 > 8);
  };
  AttentionSpec spec = make_spec(1, 2, 1, sq, sk, 64, 64, DType::bf16);
  spec.lse = true;
  spec.mask_mod = "q_idx / 128 != 1 && kv_idx / 128 != 1 && (kv_idx / 128 < 5 || kv_idx / 128 > 8)";
  AttentionSpec ref = spec;
  ref.mask_mod.clear();
  // The forward as 4 KV splits: a split's whole run may lie in the hole.
  spec.num_splits = 4;
  ref.mask = MaskType::boolean;
  ref.mask_strides = dense_mask_strides("qk", 1, 2, sq, sk).value();
  HostTensors clean = make_random_inputs(ref, 41);
  make_random_grad(ref, clean, 42);
  for (int64_t i = 0; i < sq; ++i)
    for (int64_t j = 0; j < sk; ++j)
      clean.attn_mask[size_t(i * sk + j)] = keep(i, j) ? 1.0f : 0.0f;
  HostTensors t = clean;
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (int64_t row = 0; row < sk; ++row)
    for (int64_t d = 0; d < 64; ++d) {
      if (!keep(0, row)) {
        t.k[size_t(row * spec.k.seq + d)] = nan;
        t.v[size_t(row * spec.v.seq + d)] = nan;
      }
      for (int64_t h = 0; h < 2 && row < sq; ++h)
        if (!keep(row, 0)) {
          t.q[size_t(h * spec.q.head + row * spec.q.seq + d)] = nan;
          t.dout[size_t(h * spec.o.head + row * spec.o.seq + d)] = nan;
        }
    }
  const Options options = emulated(GetParam().rules);
  run_attention(spec, fmt::format("emulator:{}", GetParam().arch), options, t);
  if (HasFatalFailure())
    return;
  clean.o = t.o;
  clean.dq = t.dq;
  clean.dk = t.dk;
  clean.dv = t.dv;
  AttentionSpec ref_out = ref;
  ref_out.lse = false; // run_attention keeps O; the gradients check what LSE fed
  const Tolerance tol = tolerance_for(spec.dtype);
  const ErrorStats err = compare(ref_out, clean, reference_attention(ref_out, clean));
  EXPECT_TRUE(err.within(tol.abs, tol.rel)) << "O: " << test::describe(err, tol);
  expect_gradients_match(ref, clean);
}

INSTANTIATE_TEST_SUITE_P(Families, BlockSparseEmulator,
                         testing::Values(kLowerings[0], kLowerings[2], kLowerings[5]),
                         [](const auto &info) {
                           return fmt::format("{}{}", info.param.arch,
                                              std::string_view(info.param.rules) == "simt" ? "_simt"
                                                                                           : "");
                         });

TEST(BackwardAttention, NullLseAndRefusedSpecsAreErrors) {
  if (!runtime::emulator_available())
    GTEST_SKIP() << "this build has no emulator (FLASHJIT_WITH_LLVM=OFF)";
  AttentionSpec spec = make_spec(1, 2, 2, 16, 16, 32, 32, DType::bf16);
  Options options;
  options.compiler = "none";
  auto attn = Attention::create(spec, "emulator:gfx1201", options);
  ASSERT_TRUE(attn) << attn.status().message();
  std::vector<uint16_t> buf(size_t(spec.q_elements()), 0x3f80);
  BackwardTensors t{buf.data(), buf.data(), buf.data(), buf.data(), nullptr,
                    buf.data(), buf.data(), buf.data(), buf.data()};
  Status s = attn->backward(spec, t);
  ASSERT_FALSE(s);
  EXPECT_NE(s.message().find("backward: lse is null"), std::string::npos) << s.message();
  AttentionSpec sunk = spec;
  sunk.sinks = true;
  auto with_sinks = Attention::create(sunk, "emulator:gfx1201", options);
  ASSERT_TRUE(with_sinks) << with_sinks.status().message();
  std::vector<float> lse(32);
  t.lse = lse.data();
  s = with_sinks->backward(sunk, t);
  ASSERT_FALSE(s); // sinks' logits in, their gradient out: both or neither
  EXPECT_NE(s.message().find("backward: sinks is null but the spec has attention sinks: pass 2 "
                             "f32 logits (the forward's)"),
            std::string::npos)
      << s.message();
  std::vector<float> sinks(2, 0.5f);
  t.sinks = sinks.data();
  s = with_sinks->backward(sunk, t);
  ASSERT_FALSE(s);
  EXPECT_NE(s.message().find("backward: dsinks is null"), std::string::npos) << s.message();
  s = attn->backward(spec, t);
  ASSERT_FALSE(s);
  EXPECT_NE(s.message().find("backward: sinks is given but the spec has no attention sinks"),
            std::string::npos)
      << s.message();
  t.sinks = nullptr;
  // ALiBi's slopes are an argument of the backward too.
  AttentionSpec tilted = spec;
  tilted.alibi = Alibi::heads;
  auto alibi = Attention::create(tilted, "emulator:gfx1201", options);
  ASSERT_TRUE(alibi) << alibi.status().message();
  s = alibi->backward(tilted, t);
  ASSERT_FALSE(s);
  EXPECT_NE(s.message().find("backward: alibi_slopes is null but the spec has ALiBi"),
            std::string::npos)
      << s.message();
}

// The derivative of score expressions against central differences of evaluate().
TEST(BackwardIr, ScoreDerivativeMatchesFiniteDifferences) {
  ir::ExprScope scope;
  scope.scalars = {{"softcap", false}};
  scope.arrays = {"alibi_slopes"};
  const char *texts[] = {"softcap * tanh(score / softcap)",
                         "score - alibi_slopes[h] * abs(q_idx - kv_idx)",
                         "(q_idx >= kv_idx) ? score * score : -inf",
                         "exp(score) / (1.0 + exp(score))",
                         "log(1.0 + score * score) + min(score, 0.5) - max(-score, 0.25)",
                         "abs(score - 0.3) * 2.0 - score / (score + 3.0)",
                         "-score + kv_idx"};
  ir::ExprContext c;
  c.h = 1;
  c.q_idx = 5;
  c.kv_idx = 3;
  c.scalar = [](const std::string &) { return 2.5; };
  c.load = [](const std::string &, int64_t i) { return 0.25 * double(i + 1); };
  for (const char *text : texts) {
    auto e = ir::parse_expr(text, scope, "test");
    ASSERT_TRUE(e) << e.status().message();
    auto d = ir::score_derivative(*e, scope);
    ASSERT_TRUE(d) << text << ": " << d.status().message();
    for (double x : {-1.7, -0.4, 0.2, 0.9, 2.3}) {
      const double h = 1e-6;
      c.score = x + h;
      const double up = ir::evaluate(*e, c);
      c.score = x - h;
      const double down = ir::evaluate(*e, c);
      c.score = x;
      const double want = (up - down) / (2 * h), got = ir::evaluate(*d, c);
      if (std::isinf(up) || std::isinf(down)) // the masked branch: derivative 0
        EXPECT_EQ(got, 0.0) << text;
      else
        EXPECT_NEAR(got, want, 1e-5 * std::max(1.0, std::abs(want)))
            << text << " at " << x << ": " << ir::print_expr(*d);
    }
  }
}

} // namespace
} // namespace flashjit
