// The installed header-only C++ interface (<flashjit/flashjit.hpp>) over the C
// library alone: no fmt, no project headers (issue 17). Emits a kernel, refuses
// a bad device by an exception with the C error code.
#include <flashjit/flashjit.hpp>

#ifdef FMT_VERSION
#error "flashjit.hpp pulled fmt in"
#endif

#include <cstdio>

int main() {
  const fj::Spec spec = fj::Spec::bshd(1, 8, 2, 100, 100, 128, 128, FJ_DTYPE_F16);
  const std::string source = fj::emit(spec, "gfx1201");
  if (source.find("FJ_GLOBAL") == std::string::npos) {
    std::fprintf(stderr, "fj::emit gave no kernel\n");
    return 1;
  }
  try {
    fj::Attention::create(spec, "tpu:0");
    std::fprintf(stderr, "create on tpu:0 succeeded\n");
    return 1;
  } catch (const fj::Error &e) {
    if (e.code() == FJ_OK || std::string(e.what()).find("tpu:0") == std::string::npos) {
      std::fprintf(stderr, "unexpected error: %s\n", e.what());
      return 1;
    }
  }
  std::printf("consumer_hpp: flashjit %s, %zu bytes of HIP\n", fj::version().c_str(),
              source.size());
  return 0;
}
