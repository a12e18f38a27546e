// libFuzzer: the warmup manifest reader (tools/manifest.h: nlohmann::json within
// the limits of tools/json.h, then the items and their specs) on any text. It may
// refuse it, never crash or throw; every item it accepts has a valid spec.
#include "tools/manifest.h"

#include <cstdint>
#include <cstdio>
#include <string_view>

using namespace flashjit;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  const std::string_view text(reinterpret_cast<const char *>(data), size);
  auto items = cli::parse_manifest(text, "fuzz.json");
  if (!items)
    return 0;
  for (const cli::WarmupItem &item : *items)
    if (Status s = item.spec.validate(); !s) {
      std::fprintf(stderr, "accepted an item with an invalid spec: %s\n", s.message().c_str());
      __builtin_trap();
    }
  return 0;
}
