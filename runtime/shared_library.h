// dlopen() over a list of candidate paths, for the vendor libraries flashjit
// loads at run time instead of linking (DESIGN: one binary runs on a CPU-only
// box, an AMD box or an NVIDIA box).
#pragma once

#include "ir/status.h"

#include <string>
#include <string_view>
#include <vector>

namespace flashjit::runtime {

/// A library opened for the life of the process. It is never closed: the
/// function tables filled from it are process-wide, and vendor runtimes do not
/// survive being unloaded under live modules and streams.
class SharedLibrary {
public:
  /// Opens the first of `candidates` that loads. The error says what was being
  /// loaded (`what`, e.g. "the HIP runtime") and names every path tried with
  /// dlerror()'s reason.
  static Expected<SharedLibrary> open(std::string_view what,
                                      const std::vector<std::string> &candidates);

  /// The address of `name`, or an error naming the symbol and the library.
  Expected<void *> symbol(const char *name) const;
  /// Resolves `name` into a typed function pointer.
  template <typename F> Status resolve(const char *name, F *&fn) const {
    auto address = symbol(name);
    if (!address)
      return address.status();
    fn = reinterpret_cast<F *>(*address);
    return Status::ok();
  }

  /// The candidate that loaded.
  const std::string &path() const { return path_; }

private:
  SharedLibrary(void *handle, std::string path) : handle_(handle), path_(std::move(path)) {}
  void *handle_ = nullptr;
  std::string path_;
};

} // namespace flashjit::runtime
