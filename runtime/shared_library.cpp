#include "runtime/shared_library.h"

#include <dlfcn.h>

namespace flashjit::runtime {

Expected<SharedLibrary> SharedLibrary::open(std::string_view what,
                                            const std::vector<std::string> &candidates) {
  std::string tried;
  for (const std::string &path : candidates) {
    // RTLD_LOCAL: the vendor's symbols stay out of the global namespace, so two
    // versions of a library (the host application's and ours) cannot collide.
    if (void *handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL))
      return SharedLibrary(handle, path);
    const char *error = dlerror(); // once: the call clears it
    std::string_view why = error ? error : "not loadable";
    // dlerror() usually starts with the path itself: say it once.
    if (why.starts_with(path + ": "))
      why.remove_prefix(path.size() + 2);
    tried += fmt::format("\n  {}: {}", path, why);
  }
  return Status::error("cannot load {}; tried:{}", what, tried);
}

Expected<void *> SharedLibrary::symbol(const char *name) const {
  dlerror(); // clear any earlier error
  void *address = dlsym(handle_, name);
  if (address == nullptr) {
    const char *why = dlerror();
    return Status::error("{} has no symbol {}: {} (too old a version?)", path_, name,
                         why ? why : "the symbol is null");
  }
  return address;
}

} // namespace flashjit::runtime
