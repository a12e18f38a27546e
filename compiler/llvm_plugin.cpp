// Loading the LLVM plugin (llvm_plugin.h), and the calls libflashjit makes
// through it that have no class of their own (compile_for_host).
#include "compiler/llvm_plugin.h"

#include "compiler/knobs.h"

#include <dlfcn.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstring>

namespace flashjit::compiler {
namespace {

bool is_file(const std::string &path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

/// The directory of the library or program this function was linked into.
std::string own_directory() {
  Dl_info info;
  if (dladdr(reinterpret_cast<void *>(&own_directory), &info) == 0 || info.dli_fname == nullptr)
    return "";
  std::string path = info.dli_fname;
  size_t slash = path.rfind('/');
  return slash == std::string::npos ? "" : path.substr(0, slash);
}

/// Where to look, in order, when FLASHJIT_LLVM_PLUGIN is unset.
std::vector<std::string> default_candidates() {
  std::vector<std::string> out;
  auto add = [&](std::string path) {
    if (!path.empty() && std::find(out.begin(), out.end(), path) == out.end())
      out.push_back(std::move(path));
  };
  if (std::string dir = own_directory(); !dir.empty())
    add(dir + "/" + kLlvmPluginFile);
#ifdef FLASHJIT_LLVM_PLUGIN_BUILD_PATH
  add(FLASHJIT_LLVM_PLUGIN_BUILD_PATH);
#endif
#ifdef FLASHJIT_LLVM_PLUGIN_INSTALL_PATH
  add(FLASHJIT_LLVM_PLUGIN_INSTALL_PATH);
#endif
  return out;
}

Expected<LoadedLlvmPlugin> load_once() {
#ifndef FLASHJIT_HAVE_LLVM
  return Status::error("this flashjit was built without LLVM 22 (FLASHJIT_WITH_LLVM=OFF), so it "
                       "has no LLVM plugin ({}): rebuild with -DFLASHJIT_WITH_LLVM=ON",
                       kLlvmPluginFile);
#else
  const std::string &chosen = knobs().llvm_plugin;
  const std::vector<std::string> candidates =
      chosen.empty() ? default_candidates() : std::vector<std::string>{chosen};
  std::vector<std::string> problems;
  for (const std::string &path : candidates) {
    if (!is_file(path)) {
      problems.push_back(fmt::format("{}: no such file", path));
      continue;
    }
    auto table = load_llvm_plugin(path);
    if (table)
      return LoadedLlvmPlugin{*table, path};
    problems.push_back(table.status().message());
  }
  std::string tried;
  for (const std::string &p : problems)
    tried += (tried.empty() ? "" : "; ") + p;
  return Status::error(
      "cannot load the LLVM plugin, which holds the in-process AMDGPU compiler, the ISA reader "
      "and the emulator ({}): {}. {}",
      chosen.empty() ? "tried " + std::to_string(candidates.size()) + " places"
                     : "FLASHJIT_LLVM_PLUGIN=" + chosen,
      tried,
      chosen.empty() ? fmt::format("Keep {} beside libflashjit.so (the build and the wheel put "
                                   "it there), or set FLASHJIT_LLVM_PLUGIN to its path; it needs "
                                   "LLVM 22's libraries (apt-get install libllvm22 libclang-cpp22)",
                                   kLlvmPluginFile)
                     : std::string("Point FLASHJIT_LLVM_PLUGIN at the libflashjit_llvm.so of this "
                                   "flashjit build, or unset it"));
#endif
}

} // namespace

Expected<const LlvmPlugin *> load_llvm_plugin(const std::string &path) {
  // RTLD_LOCAL: LLVM's symbols stay out of the process's global namespace.
  void *handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char *why = dlerror();
    return Status::error("{}: cannot be loaded: {}", path, why ? why : "dlopen failed");
  }
  // Never closed: compiled host kernels and LLVM's global state live in it.
  using Entry = const LlvmPlugin *(*)();
  auto entry = reinterpret_cast<Entry>(dlsym(handle, kLlvmPluginSymbol));
  if (entry == nullptr)
    return Status::error("{}: is not a flashjit LLVM plugin (it has no {} function)", path,
                         kLlvmPluginSymbol);
  const LlvmPlugin *table = entry();
  if (table == nullptr || table->abi != kLlvmPluginAbi || table->size != sizeof(LlvmPlugin) ||
      std::strcmp(table->flashjit_version, FLASHJIT_VERSION) != 0)
    return Status::error(
        "{}: comes from another flashjit build (plugin ABI {}, version {}; this library needs "
        "ABI {}, version {}): use the plugin built with this library",
        path, table ? std::to_string(table->abi) : "?",
        table && table->flashjit_version ? table->flashjit_version : "?", kLlvmPluginAbi,
        FLASHJIT_VERSION);
  return table;
}

const Expected<LoadedLlvmPlugin> &loaded_llvm_plugin() {
  static const Expected<LoadedLlvmPlugin> plugin = [] {
    auto p = load_once();
    if (p)
      debug_log(1, "LLVM plugin: {} ({})", p->path, p->table->identity());
    return p;
  }();
  return plugin;
}

Expected<const LlvmPlugin *> llvm_plugin() {
  const Expected<LoadedLlvmPlugin> &p = loaded_llvm_plugin();
  if (!p)
    return p.status();
  return p->table;
}

Expected<std::shared_ptr<const HostKernel>>
compile_for_host(std::string_view prelude, std::string_view kernel_text,
                 const std::vector<HostSymbol> &symbols) {
  auto plugin = llvm_plugin();
  if (!plugin)
    return plugin.status().with_context("emulator");
  return (*plugin)->compile_for_host(prelude, kernel_text, symbols);
}

} // namespace flashjit::compiler
