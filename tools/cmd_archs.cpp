// `flashjit archs`: what this flashjit can target and with what. Every row comes
// from the tables the lowering and the compilers use (target/arch.cpp for the
// processors, through lowering/target.cpp; lowering/matrix_table.cpp for the
// instructions, lowering/rules.cpp for the rule sets), so the listing cannot
// drift from what `emit` does; then the compilers and devices this machine has.
#include "compiler/llvm_plugin.h"
#include "compiler/rtc_compiler.h"
#include "lowering/lower.h"
#include "lowering/rules.h"
#include "runtime/device.h"
#include "tools/commands.h"
#include "tools/json.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <string>
#include <tuple>
#include <vector>

namespace flashjit::cli {
namespace {

int fail(const Status &s) {
  fmt::print(stderr, "flashjit: error: {}\n", s.message());
  return 1;
}

/// One processor as `flashjit archs` shows it.
struct ArchRow {
  lowering::Target target;
  std::vector<std::string> rules; // rule sets that lower it, matrix rules first
  /// The table's rows for the target, and whether the matrix rules lower with it.
  std::vector<std::pair<const lowering::MatrixInstr *, bool>> instructions;
  std::vector<std::string> lowered_with; // "bf16: <builtin>": what `emit` calls, per dtype
};

Expected<ArchRow> describe(std::string_view arch) {
  auto t = lowering::parse_target(arch);
  if (!t)
    return t.status();
  ArchRow row{*t, {}, {}, {}};
  std::vector<const lowering::MatrixInstr *> used;
  // Every matrix rule set of the family (CDNA: 32- and 16-query tiles), preferred first.
  for (const lowering::Rules *r : lowering::matrix_rules_for(*t)) {
    if (std::find(row.rules.begin(), row.rules.end(), r->name()) == row.rules.end())
      row.rules.emplace_back(r->name());
    for (DType dt : {DType::bf16, DType::f16}) {
      auto mi = lowering::find_matrix_instr(*t, dt, r->m_tile(), r->n_tile(), r->mma_k());
      if (mi && r->check(**mi, *t) && std::find(used.begin(), used.end(), *mi) == used.end()) {
        used.push_back(*mi);
        row.lowered_with.push_back(fmt::format(
            "{}: {}", dtype_name(dt), (*mi)->builtin.empty() ? (*mi)->mnemonic : (*mi)->builtin));
      }
    }
  }
  if (const lowering::Rules *simt = lowering::simt_rules_for(*t))
    row.rules.emplace_back(simt->name());
  for (const lowering::MatrixInstr *mi : t->matrix_instrs)
    row.instructions.emplace_back(mi, std::find(used.begin(), used.end(), mi) != used.end());
  return row;
}

std::string lds_text(int bytes) {
  return bytes % 1024 == 0 ? fmt::format("{} KiB", bytes / 1024) : fmt::format("{} B", bytes);
}

/// A compiler this process can use, or why not.
struct CompilerRow {
  std::string name;
  bool available = false;
  std::string detail; // identity and where it came from, or the reason
};

std::vector<CompilerRow> compilers() {
  std::vector<CompilerRow> rows;
  if (auto plugin = compiler::loaded_llvm_plugin())
    rows.push_back({"llvm", true,
                    fmt::format("{}, in process (AMD targets; the emulator), plugin {}",
                                plugin->table->identity(), plugin->path)});
  else
    rows.push_back({"llvm", false, plugin.status().message()});
  for (auto [kind, name, targets] :
       {std::tuple{compiler::RtcKind::hiprtc, "hiprtc", "AMD targets"},
        std::tuple{compiler::RtcKind::nvrtc, "nvrtc", "NVIDIA targets"}}) {
    auto rtc = compiler::RtcCompiler::load(kind);
    if (rtc)
      rows.push_back(
          {name, true,
           fmt::format("{} from {} ({})", (*rtc)->identity(), (*rtc)->library_path(), targets)});
    else
      rows.push_back({name, false, rtc.status().message()});
  }
  return rows;
}

int cmd_archs(const Args &a) {
  std::vector<std::string_view> archs = lowering::supported_archs();
  const std::string only = a.get("--arch"); // outlives the views into it
  if (a.has("--arch"))
    archs = {only};
  std::vector<ArchRow> rows;
  for (std::string_view arch : archs) {
    auto row = describe(arch);
    if (!row)
      return fail(row.status());
    rows.push_back(*row);
  }
  const std::vector<CompilerRow> compiler_rows = compilers();
  auto devices = list_devices();

  if (a.has("--json")) {
    json::Value doc = {{"archs", json::Value::array()},
                       {"compilers", json::Value::array()},
                       {"devices", json::Value::array()}};
    for (const ArchRow &r : rows) {
      json::Value instrs = json::Value::array();
      for (const auto &[mi, used] : r.instructions)
        instrs.push_back({{"mnemonic", mi->mnemonic},
                          {"builtin", mi->builtin},
                          {"shape", fmt::format("{}x{}x{}", mi->m(), mi->n(), mi->k())},
                          {"ab_dtype", dtype_name(mi->ab_dtype)},
                          {"lowered_with", used}});
      doc["archs"].push_back({{"arch", r.target.arch},
                              {"family", r.target.family_name()},
                              {"wave_size", r.target.wave_size},
                              {"lds_bytes", r.target.lds_bytes},
                              {"max_vgprs", r.target.max_vgprs},
                              {"rules", r.rules},
                              {"matrix_instructions", instrs},
                              {"lowered_with", r.lowered_with}});
    }
    for (const CompilerRow &c : compiler_rows)
      doc["compilers"].push_back(
          {{"name", c.name}, {"available", c.available}, {"detail", c.detail}});
    if (devices)
      for (const DeviceInfo &d : *devices)
        doc["devices"].push_back({{"id", d.id()}, {"name", d.name}, {"arch", d.arch}});
    fmt::print("{}", json::print(doc));
    return devices ? 0 : fail(devices.status());
  }

  fmt::print("{:<8} {:<6} {:>4} {:>8} {:>5}  {:<18} {}\n", "arch", "family", "wave", "LDS", "VGPRs",
             "rules", "matrix instructions (* = lowered with)");
  for (const ArchRow &r : rows) {
    std::vector<std::string> instrs;
    for (const auto &[mi, used] : r.instructions)
      instrs.push_back(std::string(mi->mnemonic) + (used ? "*" : ""));
    fmt::print("{:<8} {:<6} {:>4} {:>8} {:>5}  {:<18} {}\n", r.target.arch, r.target.family_name(),
               r.target.wave_size, lds_text(r.target.lds_bytes), r.target.max_vgprs,
               fmt::format("{}", fmt::join(r.rules, ", ")),
               instrs.empty() ? "none" : fmt::format("{}", fmt::join(instrs, " ")));
  }
  fmt::print("\nrules: the family's matrix rules lower by default; simt (FMAs, no matrix\n"
             "instruction) is the portable fallback on every AMD arch, taken when asked or\n"
             "when the matrix rules refuse a spec, and then named in the kernel and the result.\n"
             "CDNA has rules for 32-query tiles (cdna32: 32x32 MFMAs, taken by default where\n"
             "head_dim_v padded to 16 is a multiple of 32) and for 16-query tiles (cdna);\n"
             "--mma-m 16|32 picks one. Hopper (sm90) takes the sm90 rules (wgmma from swizzled\n"
             "shared memory, compiled for sm_90a) for forward kernels with whole warpgroups and\n"
             "Q in LDS, and the sm80 rules (mma.sync) for the backward, split-KV decode and\n"
             "other configs.\n");
  if (rows.size() == 1)
    fmt::print("builtins: {}\n", fmt::join(rows.front().lowered_with, "; "));

  fmt::print("\ncompilers on this machine:\n");
  for (const CompilerRow &c : compiler_rows)
    fmt::print("  {:<7} {:<4} {}\n", c.name, c.available ? "yes" : "no", c.detail);
  fmt::print("\ndevices on this machine:\n");
  if (!devices)
    return fail(devices.status());
  for (const DeviceInfo &d : *devices)
    fmt::print("  {:<18} {}{}\n", d.id(), d.name,
               d.arch.empty() ? "" : fmt::format(" ({})", d.arch));
  fmt::print("{}\n", backends_report());
  return 0;
}

} // namespace

std::vector<Command> archs_commands() {
  return {
      {"archs",
       "List the supported archs (family, wave size, LDS, matrix instructions, rules) and the "
       "compilers and devices on this machine.",
       "[--arch ARCH] [--json]",
       {{"--arch", "ARCH", "only this arch (and the builtins its kernels call)", "every arch"},
        {"--json", "", "print the same as JSON", ""}},
       cmd_archs},
  };
}

} // namespace flashjit::cli
