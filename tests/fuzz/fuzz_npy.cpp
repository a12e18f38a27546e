// libFuzzer: the .npy reader (runtime/npy.h) on the bytes of any file. It may
// refuse them, never crash or allocate past what the file holds; what it
// accepts has one of the three dtypes and exactly the elements its shape says.
#include "runtime/npy.h"

#include <cstdint>
#include <cstdio>
#include <string_view>

using namespace flashjit;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  const std::string_view bytes(reinterpret_cast<const char *>(data), size);
  Expected<npy::Array> a = npy::parse(bytes, "fuzz.npy");
  if (!a)
    return 0;
  uint64_t count = 1;
  for (int64_t x : a->shape)
    count *= uint64_t(x);
  const bool known = a->descr == "<f2" || a->descr == "<f4" || a->descr == "<f8";
  if (!known || count != a->values.size() || a->values.size() > size) {
    std::fprintf(stderr, "accepted an array of dtype '%s' with %zu values for %llu elements\n",
                 a->descr.c_str(), a->values.size(), static_cast<unsigned long long>(count));
    __builtin_trap();
  }
  return 0;
}
