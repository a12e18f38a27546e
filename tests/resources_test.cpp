// The resource model (lowering/resources.h) against the kernels it sizes: for
// every family's rules and configs with Q in registers and in LDS, one and
// several query tiles per wave, the estimate's LDS tiles are the LDS arrays the
// emitted kernel declares, and its O, Q and S registers are the register arrays
// the kernel declares for those values; check_fits quotes the same numbers.
#include "lowering/lower.h"
#include "lowering/resources.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <map>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

namespace flashjit::lowering {
namespace {

Target target(std::string_view id) {
  Expected<Target> t = parse_target(id);
  EXPECT_TRUE(t) << id << ": " << (t ? "" : t.status().message());
  return t ? t.take() : Target{};
}

/// What an emitted kernel declares, read from its text.
struct Declared {
  int64_t q_tiles = 0;
  std::map<std::string, int64_t> lds; // buffer -> bytes (16-byte aligned, as laid out)
  // Registers per query tile of the array declared for the result of the first
  // `// IR:` comment matching a pattern (wherever the kernel declares it: the
  // interleaved KV loop declares its values before the query-tile passes): f32
  // elements one each, 16-bit elements two to a register.
  std::vector<std::string> lines;

  int64_t regs_after(const std::regex &ir_comment) const {
    static const std::regex result(R"(// IR: %(\w+) = )");
    for (const std::string &line : lines) {
      std::smatch r;
      if (!std::regex_search(line, ir_comment) || !std::regex_search(line, r, result))
        continue;
      const std::string c_name =
          std::isdigit(static_cast<unsigned char>(r.str(1)[0])) ? "t" + r.str(1) : r.str(1);
      const std::regex array(R"(^\s*fj_(float|bits)(\d+) )" + c_name + R"(\[kQTiles\]\[(\d+)\];)");
      for (const std::string &decl : lines) {
        std::smatch m;
        if (!std::regex_search(decl, m, array))
          continue;
        const int64_t elems = std::stoll(m[2]) * std::stoll(m[3]);
        return m[1] == "float" ? elems : elems / 2;
      }
      return 0; // no register array (e.g. Q staged into LDS)
    }
    ADD_FAILURE() << "no line matches the IR comment pattern";
    return -1;
  }
};

Declared read_kernel(const std::string &text) {
  Declared d;
  std::istringstream in(text);
  static const std::regex q_tiles(R"(constexpr int kQTiles = (\d+);)");
  static const std::regex lds(R"(LDS_ARRAY\(fj_bits, (lds_\w+), (\d+)[,)])");
  for (std::string line; std::getline(in, line);) {
    std::smatch m;
    if (std::regex_search(line, m, q_tiles))
      d.q_tiles = std::stoll(m[1]);
    if (std::regex_search(line, m, lds))
      d.lds[m[1]] = (std::stoll(m[2]) * 2 + 15) / 16 * 16;
    d.lines.push_back(line);
  }
  return d;
}

struct Case {
  const char *arch;
  int64_t dqk, dv;
  DType dtype = DType::bf16;
  RulesChoice choice = RulesChoice::automatic;
  // Changes to the default config (0 / -1: keep).
  int64_t block_n = 0, waves = 0, mma_m = 0;
  int q_in_lds = -1;
  const char *rules = ""; // the rules expected to lower it

  std::string name() const {
    return fmt::format("{} d{}/{} {} {} block_n {} waves {} mma_m {} q_in_lds {}", arch, dqk, dv,
                       dtype_name(dtype), rules_choice_name(choice), block_n, waves, mma_m,
                       q_in_lds);
  }
};

const Case kCases[] = {
    {.arch = "gfx1201", .dqk = 64, .dv = 64, .rules = "gfx12"},
    {.arch = "gfx1201", .dqk = 192, .dv = 128, .rules = "gfx12"},
    {.arch = "gfx1201", .dqk = 128, .dv = 128, .block_n = 32, .q_in_lds = 1, .rules = "gfx12"},
    {.arch = "gfx1201", .dqk = 96, .dv = 96, .waves = 2, .rules = "gfx12"},
    {.arch = "gfx1201", .dqk = 80, .dv = 80, .choice = RulesChoice::simt, .rules = "simt"},
    {.arch = "gfx1100", .dqk = 64, .dv = 64, .dtype = DType::f16, .rules = "gfx11"},
    {.arch = "gfx1100", .dqk = 256, .dv = 256, .rules = "gfx11"},
    {.arch = "gfx90a", .dqk = 64, .dv = 64, .dtype = DType::f16, .rules = "cdna32"},
    {.arch = "gfx942", .dqk = 128, .dv = 128, .rules = "cdna32"},
    {.arch = "gfx942", .dqk = 80, .dv = 80, .rules = "cdna"},
    {.arch = "gfx942", .dqk = 128, .dv = 128, .mma_m = 16, .rules = "cdna"},
    {.arch = "gfx950", .dqk = 128, .dv = 128, .rules = "cdna32"},
    {.arch = "gfx950", .dqk = 80, .dv = 80, .dtype = DType::f16, .rules = "cdna"},
    {.arch = "gfx950", .dqk = 64, .dv = 64, .choice = RulesChoice::simt, .rules = "simt"},
    {.arch = "sm_80", .dqk = 64, .dv = 64, .rules = "sm80"},
    // sm_90's defaults take the sm90 rules (swizzled 64-column panels, Q in LDS);
    // a config with Q in registers the sm80 rules.
    // Head dim 128 takes a producer warpgroup and a ring of two K/V copies.
    {.arch = "sm_90", .dqk = 128, .dv = 128, .dtype = DType::f16, .rules = "sm90"},
    {.arch = "sm_90", .dqk = 128, .dv = 64, .rules = "sm90"},
    {.arch = "sm_90", .dqk = 256, .dv = 256, .rules = "sm90"},
    {.arch = "sm_90", .dqk = 80, .dv = 80, .block_n = 64, .rules = "sm90"},
    {.arch = "sm_90", .dqk = 192, .dv = 128, .block_n = 32, .q_in_lds = 0, .rules = "sm80"},
};

ir::Config config_for(const Case &c, const AttentionSpec &spec, const Target &t) {
  ir::Config config = default_config(spec, t, c.choice, c.mma_m);
  if (c.block_n)
    config.block_n = c.block_n;
  if (c.waves) {
    config.block_m = config.block_m / config.waves * c.waves;
    config.waves = c.waves;
  }
  if (c.q_in_lds >= 0)
    config.q_in_lds = c.q_in_lds;
  if (!config.q_in_lds) // the sm80 rules: no producer warpgroup
    config.stages = std::min<int64_t>(config.stages, 2);
  return config;
}

TEST(Resources, EstimateIsWhatTheKernelDeclares) {
  const std::regex q_load(R"(// IR: %\w+ = load .*\{tensor = @Q\})");
  const std::regex s_product(R"(// IR: %\w+ = mma_abt )");
  const std::regex o_product(R"(// IR: %\w+ = mma_ab )");
  for (const Case &c : kCases) {
    SCOPED_TRACE(c.name());
    const Target t = target(c.arch);
    AttentionSpec spec = make_spec(2, 8, 2, 113, 203, c.dqk, c.dv, c.dtype);
    spec.causal = true;
    const ir::Config config = config_for(c, spec, t);
    SCOPED_TRACE(config.summary());
    Expected<ResourceEstimate> e = estimate_resources(spec, config, t, c.choice);
    ASSERT_TRUE(e) << e.status().message();
    Expected<Lowered> l = generate(spec, config, t, c.choice);
    ASSERT_TRUE(l) << l.status().message();
    EXPECT_EQ(l->rules, c.rules);
    EXPECT_EQ(e->rules, l->rules) << "the estimate is for other rules than the kernel's";

    const Declared k = read_kernel(l->kernel_text);
    EXPECT_EQ(e->q_tiles, k.q_tiles);
    // LDS: each staged tile, and the total the launch passes.
    auto lds = [&](std::initializer_list<const char *> names) {
      for (const char *n : names)
        if (k.lds.count(n))
          return k.lds.at(n);
      return int64_t(0);
    };
    // Two copies in one array under a producer warpgroup (config stages 3).
    EXPECT_EQ(e->lds_k, lds({"lds_k", "lds_k_x2"}));
    EXPECT_EQ(e->lds_v, lds({"lds_v", "lds_vt", "lds_v_x2"}));
    EXPECT_EQ(e->lds_q, lds({"lds_q"}));
    EXPECT_EQ(e->lds_o, lds({"lds_o"})) << "O's staging rows";
    EXPECT_EQ(k.lds.size(), 2u + (config.q_in_lds ? 1 : 0) + (e->lds_o ? 1 : 0));
    EXPECT_EQ(e->lds_bytes(), l->lds_bytes);
    // Registers across the KV loop: Q's operand fragments, S and the O product
    // (the loop-carried accumulator's shape), over every query tile.
    EXPECT_EQ(e->q_regs, k.q_tiles * k.regs_after(q_load));
    EXPECT_EQ(e->s_regs, k.q_tiles * k.regs_after(s_product));
    EXPECT_EQ(e->o_regs, k.q_tiles * k.regs_after(o_product));
    EXPECT_EQ(config.q_in_lds, e->q_regs == 0);
    EXPECT_LE(e->loop_regs(), register_budget(t));
    EXPECT_LE(e->lds_bytes(), t.lds_bytes);
  }
}

// check_fits refuses with the estimate's own numbers.
TEST(Resources, CheckFitsQuotesTheEstimate) {
  {
    const Target t = target("sm_90");
    const AttentionSpec spec = make_spec(1, 4, 4, 128, 128, 512, 512, DType::f16);
    const ir::Config config = default_config(spec, t);
    Expected<ResourceEstimate> e = estimate_resources(spec, config, t);
    ASSERT_TRUE(e) << e.status().message();
    EXPECT_GT(e->loop_regs(), register_budget(t));
    const Status s = check_fits(spec, config, t);
    ASSERT_FALSE(s);
    EXPECT_NE(s.message().find(fmt::format("need about {} VGPRs", e->loop_regs())),
              std::string::npos)
        << s.message();
    EXPECT_NE(s.message().find(fmt::format("budget of {}", register_budget(t))), std::string::npos)
        << s.message();
  }
  {
    const Target t = target("gfx942");
    const AttentionSpec spec = make_spec(1, 4, 4, 128, 128, 512, 512, DType::bf16);
    ir::Config config = default_config(spec, t);
    config.block_n = 32;
    Expected<ResourceEstimate> e = estimate_resources(spec, config, t);
    ASSERT_TRUE(e) << e.status().message();
    EXPECT_GT(e->lds_bytes(), t.lds_bytes);
    const Status s = check_fits(spec, config, t);
    ASSERT_FALSE(s);
    EXPECT_NE(s.message().find(fmt::format("need {} bytes of LDS", e->lds_bytes())),
              std::string::npos)
        << s.message();
  }
  // No rules, no estimate: the rule choice's error.
  const Target sm = target("sm_90");
  const AttentionSpec spec = make_spec(1, 1, 1, 64, 64, 64, 64, DType::bf16);
  Expected<ResourceEstimate> simt =
      estimate_resources(spec, default_config(spec, sm), sm, RulesChoice::simt);
  ASSERT_FALSE(simt);
  EXPECT_NE(simt.status().message().find("simt"), std::string::npos) << simt.status().message();
}

} // namespace
} // namespace flashjit::lowering
