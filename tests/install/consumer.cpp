// Emits a gfx1201 kernel through the installed C++ API.
#include "runtime/attention.h"

#include <cstdio>

int main() {
  flashjit::AttentionSpec spec =
      flashjit::make_spec(1, 8, 2, 100, 100, 128, 128, flashjit::DType::f16);
  auto source = flashjit::emit_source(spec, "gfx1201");
  if (!source) {
    std::fprintf(stderr, "emit_source: %s\n", source.status().message().c_str());
    return 1;
  }
  auto bad = flashjit::Attention::create(spec, "tpu:0");
  if (bad) {
    std::fprintf(stderr, "create on tpu:0 succeeded\n");
    return 1;
  }
  std::printf("flashjit %s: %zu bytes of HIP; tpu:0 refused: %s\n",
              std::string(flashjit::version()).c_str(), source->size(),
              bad.status().message().c_str());
  return 0;
}
