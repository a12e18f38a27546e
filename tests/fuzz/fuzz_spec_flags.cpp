// libFuzzer: the command line's spec and config flags (tools/cli.h,
// tools/spec_flags.h) on any words, taken as the arguments of `flashjit emit`
// (whitespace and NUL separate them), then what `emit` does with a spec the
// flags accept: the target, the default config with the flags' overrides, and
// the generated kernel (validate, build, verify, lower). Refusals are fine;
// a crash is not, and neither is an accepted spec that does not validate.
#include "lowering/lower.h"
#include "lowering/target.h"
#include "tools/cli.h"
#include "tools/spec_flags.h"

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

using namespace flashjit;

namespace {

const cli::Command &emit_command() {
  static const cli::Command command = [] {
    cli::Command c;
    c.name = "emit";
    c.flags = cli::spec_flags();
    for (cli::FlagSpec &f : cli::config_flags())
      c.flags.push_back(f);
    c.flags.push_back({"--arch", "ARCH", "target", ""});
    c.flags.push_back({"--print-ir", "", "print the tile IR", ""});
    return c;
  }();
  return command;
}

std::vector<std::string> words(const uint8_t *data, size_t size) {
  std::vector<std::string> argv(1);
  for (size_t i = 0; i < size; ++i) {
    const char c = char(data[i]);
    if (c == ' ' || c == '\n' || c == '\t' || c == '\0') {
      if (!argv.back().empty())
        argv.emplace_back();
    } else {
      argv.back() += c;
    }
  }
  if (argv.back().empty())
    argv.pop_back();
  return argv;
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  auto args = cli::parse_args(emit_command(), words(data, size));
  if (!args)
    return 0;
  auto spec = cli::spec_from(*args);
  if (!spec)
    return 0;
  if (Status s = spec->validate(); !s) {
    std::fprintf(stderr, "spec_from accepted an invalid spec: %s\n", s.message().c_str());
    __builtin_trap();
  }
  // As tools/flashjit.cpp's job_from: the target's default config, then the flags.
  auto target = lowering::parse_target(args->get("--arch", "gfx1201"));
  if (!target)
    return 0;
  auto rules = lowering::parse_rules_choice(args->get("--rules", "auto"));
  auto mma_m = args->get_int("--mma-m", 0);
  if (!rules || !mma_m)
    return 0;
  auto config = cli::config_from(*args, lowering::default_config(*spec, *target, *rules, *mma_m));
  if (!config)
    return 0;
  (void)lowering::generate(*spec, *config, *target, *rules);
  return 0;
}
