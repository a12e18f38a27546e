#include "lowering/rules.h"

namespace flashjit::lowering {

const Rules &gfx12_rules(); // rules_gfx12.cpp
const Rules &sm80_rules();  // rules_sm80.cpp

namespace {

struct RulesRow {
  Family family;
  const Rules &(*rules)();
};

// One row per family that has rules; the other families are listed by
// `flashjit archs` but not lowered yet.
constexpr RulesRow kRulesTable[] = {
    {Family::gfx12, gfx12_rules},
    {Family::sm80, sm80_rules},
};

} // namespace

const Rules *rules_for(const Target &t) {
  for (const RulesRow &row : kRulesTable)
    if (row.family == t.family)
      return &row.rules();
  return nullptr;
}

std::string families_with_rules() {
  std::string out;
  for (const RulesRow &row : kRulesTable)
    out += (out.empty() ? "" : ", ") + std::string(family_name(row.family));
  return out + " (gfx1200, gfx1201; sm_80, sm_86, sm_89, sm_90)";
}

} // namespace flashjit::lowering
