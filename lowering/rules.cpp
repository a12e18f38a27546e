#include "lowering/rules.h"

#include <algorithm>

namespace flashjit::lowering {

const Rules &gfx11_rules();    // rules_gfx11.cpp
const Rules &gfx12_rules();    // rules_gfx12.cpp
const Rules &cdna_rules();     // rules_cdna.cpp
const Rules &cdna4_rules();    // rules_cdna.cpp
const Rules &cdna32_rules();   // rules_cdna.cpp
const Rules &cdna4_32_rules(); // rules_cdna.cpp
const Rules &sm80_rules();     // rules_sm80.cpp
const Rules &sm90_rules();     // rules_sm90.cpp

namespace {

struct RulesRow {
  Family family;
  const Rules &(*rules)();
};

// The rows of each family with matrix rules, preferred first. Every AMD target
// can also be lowered by the simt rules (simt_rules_for, rules_simt.cpp).
// clang-format off
constexpr RulesRow kRulesTable[] = {
    {Family::gfx11, gfx11_rules},
    {Family::gfx12, gfx12_rules},
    {Family::cdna2, cdna32_rules},
    {Family::cdna2, cdna_rules},
    {Family::cdna3, cdna32_rules},
    {Family::cdna3, cdna_rules},
    {Family::cdna4, cdna4_32_rules},
    {Family::cdna4, cdna4_rules},
    {Family::cdna4, cdna_rules},
    {Family::sm80, sm80_rules},
    // Hopper: warpgroup products (wgmma) where the config has whole warpgroups
    // and Q in LDS, else the sm80 rules (warp-wide mma.sync, ldmatrix). A
    // measurement build (CMakeLists.txt, FLASHJIT_SM80_RULES_ON_SM90) keeps
    // only the sm80 rules.
#ifndef FLASHJIT_SM80_RULES_ON_SM90
    {Family::sm90, sm90_rules},
#endif
    {Family::sm90, sm80_rules},
};
// clang-format on

} // namespace

ir::Config Rules::default_config(const AttentionSpec &spec) const {
  ir::Config c;
  c.waves = 4;
  c.block_m = 16 * c.waves;
  c.pad_k = 16;
  const int64_t d = padded_head_dim(spec);
  // Keep the S tile small where the output accumulator and Q fragments take most registers.
  c.block_n = d <= 128 ? 64 : d <= 192 ? 32 : 16;
  return c;
}

void Rules::emit_staging_helpers(HipWriter &w) const {
  w.line("// ---- global -> LDS staging (synchronous) ----");
  w.open("FJ_DEVICE void fj_stage8(fj_bits *lds, const fj_bits *src, bool valid) {{");
  w.line("fj_bits8 v = {{0, 0, 0, 0, 0, 0, 0, 0}};");
  w.line("if (valid)");
  w.line("  v = fj_global_load8(src);");
  w.line("fj_lds_store8(lds, v);");
  w.close();
  w.open("FJ_DEVICE void fj_stage4(fj_bits *lds, const fj_bits *src, bool valid) {{");
  w.line("for (int e = 0; e < 4; ++e)");
  w.line("  fj_lds_store1(lds + e, valid ? fj_global_load1(src + e) : fj_bits(0));");
  w.close();
  w.line("FJ_DEVICE void fj_stage_f32(float *lds, const float *src, bool valid) {{ *lds = valid ? "
         "*src : 0.0f; }}");
  w.line("FJ_DEVICE void fj_stage_commit() {{}}");
  w.line("FJ_DEVICE void fj_stage_wait() {{}}");
  w.blank();
}

const Rules *rules_for(const Target &t) {
  for (const RulesRow &row : kRulesTable)
    if (row.family == t.family)
      return &row.rules();
  return nullptr;
}

std::vector<const Rules *> matrix_rules_for(const Target &t) {
  std::vector<const Rules *> out;
  for (const RulesRow &row : kRulesTable)
    if (row.family == t.family)
      out.push_back(&row.rules());
  return out;
}

std::string families_with_rules() {
  std::string out;
  std::vector<Family> listed;
  for (const RulesRow &row : kRulesTable) {
    if (std::find(listed.begin(), listed.end(), row.family) != listed.end())
      continue; // a family's preferred rules name it
    listed.push_back(row.family);
    std::string archs;
    for (std::string_view arch : supported_archs()) {
      Expected<Target> t = parse_target(arch);
      if (t && t->family == row.family)
        archs += (archs.empty() ? "" : ", ") + std::string(arch);
    }
    out += fmt::format("{}{} ({}: {} rules)", out.empty() ? "" : "; ", family_name(row.family),
                       archs, row.rules().name());
  }
  return out;
}

} // namespace flashjit::lowering
