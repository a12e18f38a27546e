#include "lowering/target.h"

#include "lowering/matrix_table.h"

#include <algorithm>

namespace flashjit::lowering {
namespace {

// The hardware numbers are the rows of target/arch.cpp. flashjit accepts
// "feature-" on a chip without the feature (it is true) and drops it from the
// compiler's target ID (clang 22 rejects "gfx1201:xnack-").

using target::Arch;

// Target-ID features, in the (alphabetical) order of LLVM's canonical target IDs.
struct FeatureRow {
  std::string_view name;
  bool Arch::*supported;
  std::optional<bool> Target::*value;
};

constexpr FeatureRow kFeatures[] = {
    {"sramecc", &Arch::has_sramecc, &Target::sramecc},
    {"xnack", &Arch::has_xnack, &Target::xnack},
};

std::string join(const std::vector<std::string_view> &items) {
  std::string out;
  for (std::string_view item : items) {
    if (!out.empty())
      out += ", ";
    out += item;
  }
  return out;
}

std::vector<std::string_view> split(std::string_view s, char sep) {
  std::vector<std::string_view> parts;
  size_t start = 0;
  while (true) {
    size_t end = s.find(sep, start);
    parts.push_back(s.substr(start, end == std::string_view::npos ? end : end - start));
    if (end == std::string_view::npos)
      return parts;
    start = end + 1;
  }
}

} // namespace

std::vector<std::string_view> supported_archs() {
  std::vector<std::string_view> names;
  for (const Arch &row : target::archs())
    names.push_back(row.name);
  return names;
}

std::string Target::target_id() const { return features.empty() ? arch : arch + ":" + features; }

int Target::max_waves_for_vgprs(int vgprs) const {
  if (vgprs > max_vgprs)
    return 0; // cannot be compiled at all
  if (vgprs < vgpr_alloc_granule)
    return max_waves_per_simd;
  int rounded = (vgprs + vgpr_alloc_granule - 1) / vgpr_alloc_granule * vgpr_alloc_granule;
  return std::min(std::max(vgpr_file_per_simd / rounded, 1), max_waves_per_simd);
}

Expected<Target> parse_target(std::string_view target_id) {
  std::vector<std::string_view> parts = split(target_id, ':');
  std::string_view arch = parts[0];
  const Arch *row = target::find_arch(arch);
  if (row == nullptr)
    return Status::error("unknown arch '{}' in target '{}': supported are {}", arch, target_id,
                         join(supported_archs()));

  Target t;
  t.arch = std::string(arch);
  for (size_t i = 1; i < parts.size(); ++i) {
    std::string_view part = parts[i];
    if (part.empty() || (part.back() != '+' && part.back() != '-'))
      return Status::error("target feature '{}' in '{}' needs a '+' or '-' suffix, as in "
                           "'gfx90a:sramecc+:xnack-'",
                           part, target_id);
    std::string_view name = part.substr(0, part.size() - 1);
    const FeatureRow *feature = nullptr;
    for (const FeatureRow &f : kFeatures)
      if (f.name == name)
        feature = &f;
    if (feature == nullptr) {
      std::vector<std::string_view> known;
      for (const FeatureRow &f : kFeatures)
        known.push_back(f.name);
      return Status::error("unknown target feature '{}' in '{}': known are {}, each followed by "
                           "'+' or '-'",
                           name, target_id, join(known));
    }
    if (!(row->*feature->supported)) {
      // "xnack-" on a chip without XNACK states what is true anyway: accept it,
      // but keep it out of the target ID handed to the compiler (clang rejects
      // "gfx1201:xnack-"). Asking for the feature is an error.
      if (part.back() == '-')
        continue;
      return Status::error("{} has no '{}' target feature, so '{}' cannot be honoured; use '{}' "
                           "(or '{}:{}-')",
                           arch, name, target_id, arch, arch, name);
    }
    std::optional<bool> &value = t.*feature->value;
    if (value.has_value())
      return Status::error("target feature '{}' given twice in '{}'", name, target_id);
    value = part.back() == '+';
  }
  for (const FeatureRow &f : kFeatures) {
    const std::optional<bool> &value = t.*f.value;
    if (!value)
      continue;
    if (!t.features.empty())
      t.features += ':';
    t.features += std::string(f.name) + (*value ? "+" : "-");
  }

  const target::FamilyFacts &fam = row->facts();
  t.family = row->family;
  t.wave_size = fam.wave_size;
  t.lds_bytes = row->lds_bytes;
  t.lds_bytes_per_cu = row->lds_bytes_per_cu;
  t.max_vgprs = fam.max_vgprs;
  t.vgpr_file_per_simd = row->vgpr_file_per_simd;
  t.vgpr_alloc_granule = row->vgpr_alloc_granule(fam.wave_size);
  t.max_workgroup_size = target::kMaxWorkgroupSize;
  t.max_waves_per_simd = fam.max_waves_per_simd;
  for (const MatrixInstr &instr : matrix_table())
    if (instr.family == t.family)
      t.matrix_instrs.push_back(&instr);
  return t;
}

} // namespace flashjit::lowering
