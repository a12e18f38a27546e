// A small command-line parser: every subcommand declares its flags once, and
// --help is generated from the same declarations.
#pragma once

#include "ir/status.h"

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace flashjit::cli {

struct FlagSpec {
  std::string name;  // "--head-dim"
  std::string value; // "N" for flags that take a value, "" for switches
  std::string help;
  std::string fallback; // shown in --help
};

class Args {
public:
  bool has(const std::string &flag) const { return values_.count(flag) != 0; }
  std::string get(const std::string &flag, const std::string &fallback = "") const {
    auto it = values_.find(flag);
    return it == values_.end() ? fallback : it->second;
  }
  Expected<int64_t> get_int(const std::string &flag, int64_t fallback) const;
  Expected<double> get_double(const std::string &flag, double fallback) const;
  std::map<std::string, std::string> values_;
  std::vector<std::string> positional; // operands that are not options, in order
};

struct Command {
  std::string name;
  std::string summary;
  std::string usage; // the line after the command name
  std::vector<FlagSpec> flags;
  std::function<int(const Args &)> run;
  int max_positional = 0; // operands (non-option arguments) the command takes
  std::string help_text() const;
};

/// Parses argv for one command; "--help" prints help and yields nullopt with code 0.
Expected<Args> parse_args(const Command &c, const std::vector<std::string> &argv);

/// Whether the command line prints progress on stderr: FLASHJIT_PROGRESS, and
/// where it is unset, whether stderr is a terminal.
bool progress_enabled();
/// For Options::progress and EmulatorOptions::progress: a line on stderr each
/// time it is called ("flashjit: emulator: 1200 of 4096 workgroups (29%), 12 s");
/// empty (no reports) where progress is off.
std::function<void(int64_t done, int64_t total)> emulator_progress();

} // namespace flashjit::cli
