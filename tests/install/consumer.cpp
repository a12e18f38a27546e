// Emits a gfx1201 kernel through the installed C++ API, and round-trips its
// tile IR through the installed ir::print / ir::parse (issue 18, finding 15:
// ir::parse was declared in the installed header but not exported).
#include "ir/build.h"
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
  auto program = flashjit::ir::build_attention(spec, flashjit::ir::Config{});
  if (!program) {
    std::fprintf(stderr, "build_attention: %s\n", program.status().message().c_str());
    return 1;
  }
  const std::string text = flashjit::ir::print(*program);
  auto parsed = flashjit::ir::parse(text);
  if (!parsed || flashjit::ir::print(*parsed) != text) {
    std::fprintf(stderr, "ir::parse did not round-trip the printed program\n");
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
