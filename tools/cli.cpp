#include "tools/cli.h"

#include "compiler/knobs.h"

#include <fmt/format.h>

#include <unistd.h>

#include <charconv>
#include <chrono>
#include <cstdio>

namespace flashjit::cli {

bool progress_enabled() {
  const int knob = compiler::knobs().progress;
  return knob < 0 ? isatty(STDERR_FILENO) != 0 : knob == 1;
}

std::function<void(int64_t, int64_t)> emulator_progress() {
  if (!progress_enabled())
    return {};
  const auto start = std::chrono::steady_clock::now();
  return [start](int64_t done, int64_t total) {
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    fmt::print(stderr, "flashjit: emulator: {} of {} workgroups ({}%), {:.0f} s\n", done, total,
               total > 0 ? done * 100 / total : 100, seconds);
    std::fflush(stderr);
  };
}

Expected<int64_t> Args::get_int(const std::string &flag, int64_t fallback) const {
  if (!has(flag))
    return fallback;
  const std::string v = get(flag);
  int64_t x = 0;
  auto [ptr, ec] = std::from_chars(v.data(), v.data() + v.size(), x);
  if (ec != std::errc() || ptr != v.data() + v.size())
    return Status::error("{} expects an integer, got '{}'", flag, v);
  return x;
}

Expected<double> Args::get_double(const std::string &flag, double fallback) const {
  if (!has(flag))
    return fallback;
  const std::string v = get(flag);
  try {
    size_t used = 0;
    double x = std::stod(v, &used);
    if (used == v.size())
      return x;
  } catch (...) {
  }
  return Status::error("{} expects a number, got '{}'", flag, v);
}

std::string Command::help_text() const {
  std::string s = fmt::format("usage: flashjit {} {}\n\n{}\n", name, usage, summary);
  if (!flags.empty())
    s += "\noptions:\n";
  for (const FlagSpec &f : flags) {
    std::string left = f.name + (f.value.empty() ? "" : " " + f.value);
    s += fmt::format("  {:<24} {}", left, f.help);
    if (!f.fallback.empty())
      s += fmt::format(" (default: {})", f.fallback);
    s += "\n";
  }
  s += fmt::format("  {:<24} {}\n", "--help", "show this help");
  return s;
}

Expected<Args> parse_args(const Command &c, const std::vector<std::string> &argv) {
  Args args;
  for (size_t i = 0; i < argv.size(); ++i) {
    std::string a = argv[i];
    std::string value;
    bool inline_value = false;
    if (size_t eq = a.find('='); a.rfind("--", 0) == 0 && eq != std::string::npos) {
      value = a.substr(eq + 1);
      a = a.substr(0, eq);
      inline_value = true;
    }
    if (!a.empty() && a[0] != '-' && int(args.positional.size()) < c.max_positional) {
      args.positional.push_back(a);
      continue;
    }
    if (a == "--help" || a == "-h") {
      args.values_["--help"] = "";
      continue;
    }
    const FlagSpec *spec = nullptr;
    for (const FlagSpec &f : c.flags)
      if (f.name == a)
        spec = &f;
    if (!spec)
      return Status::error("flashjit {}: unknown option '{}' (see flashjit {} --help)", c.name, a,
                           c.name);
    if (spec->value.empty()) {
      if (inline_value)
        return Status::error("flashjit {}: {} takes no value", c.name, a);
      args.values_[a] = "1";
      continue;
    }
    if (!inline_value) {
      if (i + 1 >= argv.size())
        return Status::error("flashjit {}: {} needs a value ({})", c.name, a, spec->value);
      value = argv[++i];
    }
    args.values_[a] = value;
  }
  return args;
}

} // namespace flashjit::cli
