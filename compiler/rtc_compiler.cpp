// RtcCompiler: hiprtc and nvrtc through one function table type, filled from
// each library by the symbol names of its row in kVendors.
#include "compiler/rtc_compiler.h"

#include "compiler/knobs.h"
#include "target/arch.h"

#include <dlfcn.h>
#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <map>
#include <mutex>
#include <optional>
#include <thread>

namespace flashjit::compiler {

namespace {

// The C API both libraries share (hiprtc.h / nvrtc.h, declared here so that no
// vendor header is needed). Results are C enums, 0 = success; a program is an
// opaque pointer.
using RtcResult = int;
using RtcProgram = void *;
constexpr RtcResult kSuccess = 0;

struct RtcApi {
  RtcResult (*version)(int *major, int *minor) = nullptr;
  RtcResult (*create_program)(RtcProgram *program, const char *source, const char *name,
                              int header_count, const char *const *headers,
                              const char *const *include_names) = nullptr;
  RtcResult (*compile_program)(RtcProgram program, int option_count,
                               const char *const *options) = nullptr;
  RtcResult (*get_program_log_size)(RtcProgram program, size_t *size) = nullptr;
  RtcResult (*get_program_log)(RtcProgram program, char *log) = nullptr;
  RtcResult (*get_code_size)(RtcProgram program, size_t *size) = nullptr;
  RtcResult (*get_code)(RtcProgram program, char *code) = nullptr;
  RtcResult (*get_ptx_size)(RtcProgram program, size_t *size) = nullptr; // nvrtc only
  RtcResult (*get_ptx)(RtcProgram program, char *ptx) = nullptr;         // nvrtc only
  RtcResult (*destroy_program)(RtcProgram *program) = nullptr;
  const char *(*get_error_string)(RtcResult result) = nullptr;
};

/// The symbol behind each RtcApi field; nullptr: the library has none.
struct SymbolNames {
  const char *version, *create_program, *compile_program, *get_program_log_size, *get_program_log,
      *get_code_size, *get_code, *get_ptx_size, *get_ptx, *destroy_program, *get_error_string;
};

/// One row per vendor library: where it lives and what it exports.
struct VendorLibrary {
  RtcKind kind;
  const char *name;
  const char *root_variable;      // ROCM_PATH / CUDA_PATH
  const char *root_subdir;        // where the library sits under that root
  std::vector<const char *> dirs; // the fixed places, after the root variable
  std::vector<const char *> files;
  const char *install_hint;
  const char *source_name; // how diagnostics name the source
  SymbolNames symbols;
};

const std::vector<VendorLibrary> &vendors() {
  static const std::vector<VendorLibrary> table = {
      {RtcKind::hiprtc,
       "hiprtc",
       "ROCM_PATH",
       "lib",
       {"/opt/rocm/lib"},
       {"libhiprtc.so", "libhiprtc.so.7", "libhiprtc.so.6", "libhiprtc.so.5"},
       "install ROCm (the hip-runtime-amd package) or set ROCM_PATH",
       "kernel.hip",
       {"hiprtcVersion", "hiprtcCreateProgram", "hiprtcCompileProgram", "hiprtcGetProgramLogSize",
        "hiprtcGetProgramLog", "hiprtcGetCodeSize", "hiprtcGetCode", nullptr, nullptr,
        "hiprtcDestroyProgram", "hiprtcGetErrorString"}},
      {RtcKind::nvrtc,
       "nvrtc",
       "CUDA_PATH",
       "lib64",
       {"/usr/local/cuda/lib64", "/usr/local/cuda/targets/x86_64-linux/lib"},
       {"libnvrtc.so", "libnvrtc.so.13", "libnvrtc.so.12"},
       "install CUDA or set CUDA_PATH",
       "kernel.cu",
       {"nvrtcVersion", "nvrtcCreateProgram", "nvrtcCompileProgram", "nvrtcGetProgramLogSize",
        "nvrtcGetProgramLog", "nvrtcGetCUBINSize", "nvrtcGetCUBIN", "nvrtcGetPTXSize",
        "nvrtcGetPTX", "nvrtcDestroyProgram", "nvrtcGetErrorString"}},
  };
  return table;
}

const VendorLibrary &vendor(RtcKind kind) {
  for (const VendorLibrary &v : vendors())
    if (v.kind == kind)
      return v;
  return vendors()[0];
}

} // namespace

struct RtcLibrary {
  std::string path; // the file the loader opened
  std::string identity;
  RtcApi api;
};

namespace {

/// Fills `api` from `handle`; the first missing symbol, or nullptr.
const char *bind(void *handle, const SymbolNames &names, RtcApi &api) {
  auto one = [&](const char *name, auto &field) -> bool {
    if (!name)
      return true;
    field = reinterpret_cast<std::remove_reference_t<decltype(field)>>(dlsym(handle, name));
    return field != nullptr;
  };
  const SymbolNames &n = names;
  if (!one(n.version, api.version))
    return n.version;
  if (!one(n.create_program, api.create_program))
    return n.create_program;
  if (!one(n.compile_program, api.compile_program))
    return n.compile_program;
  if (!one(n.get_program_log_size, api.get_program_log_size))
    return n.get_program_log_size;
  if (!one(n.get_program_log, api.get_program_log))
    return n.get_program_log;
  if (!one(n.get_code_size, api.get_code_size))
    return n.get_code_size;
  if (!one(n.get_code, api.get_code))
    return n.get_code;
  if (!one(n.get_ptx_size, api.get_ptx_size))
    return n.get_ptx_size;
  if (!one(n.get_ptx, api.get_ptx))
    return n.get_ptx;
  if (!one(n.destroy_program, api.destroy_program))
    return n.destroy_program;
  if (!one(n.get_error_string, api.get_error_string))
    return n.get_error_string;
  return nullptr;
}

/// Opens one candidate; the library, or why not (empty reason: plainly absent).
const RtcLibrary *open_candidate(const VendorLibrary &v, const std::string &candidate,
                                 std::string &why) {
  static std::mutex mutex;
  // Never unloaded and never destroyed: a compile abandoned after its time limit still runs on
  // a detached thread and reads its library until it ends, possibly after main returns.
  static auto &loaded = *new std::map<std::string, std::unique_ptr<RtcLibrary>>;
  std::lock_guard<std::mutex> lock(mutex);
  if (auto it = loaded.find(candidate); it != loaded.end())
    return it->second.get();

  const bool on_loader_path = candidate.find('/') == std::string::npos;
  struct stat st{};
  if (!on_loader_path && ::stat(candidate.c_str(), &st) != 0)
    return nullptr;
  void *handle = dlopen(candidate.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!handle) {
    const char *error = dlerror();
    std::string text = error ? error : "dlopen failed";
    if (on_loader_path && text.find("No such file") != std::string::npos)
      return nullptr;
    why = "found, but it does not load: " + text;
    return nullptr;
  }
  auto lib = std::make_unique<RtcLibrary>();
  if (const char *missing = bind(handle, v.symbols, lib->api)) {
    why = fmt::format("found, but it lacks {} (too old?)", missing);
    dlclose(handle);
    return nullptr;
  }
  int major = 0, minor = 0;
  if (lib->api.version(&major, &minor) != kSuccess) {
    why = fmt::format("found, but {} fails", v.symbols.version);
    dlclose(handle);
    return nullptr;
  }
  lib->identity = fmt::format("{} {}.{}", v.name, major, minor);
  Dl_info info{};
  lib->path = dladdr(reinterpret_cast<void *>(lib->api.version), &info) && info.dli_fname
                  ? info.dli_fname
                  : candidate;
  return (loaded[candidate] = std::move(lib)).get();
}

bool is_nvidia_arch(std::string_view arch, std::string_view prefix) {
  if (!arch.starts_with(prefix))
    return false;
  std::string_view rest = arch.substr(prefix.size());
  if (!rest.empty() && (rest.back() == 'a' || rest.back() == 'f'))
    rest.remove_suffix(1);
  return !rest.empty() && rest.size() <= 3 &&
         std::all_of(rest.begin(), rest.end(), [](char c) { return c >= '0' && c <= '9'; });
}

struct RtcOutput {
  std::string code;
  std::string log;
};

std::string error_text(const RtcLibrary &lib, RtcResult r) {
  const char *s = lib.api.get_error_string(r);
  return s ? s : fmt::format("error {}", r);
}

/// One compile, start to end, on the calling thread.
Expected<RtcOutput> run_compile(const RtcLibrary &lib, const VendorLibrary &v,
                                const std::string &source, const std::vector<std::string> &args,
                                const std::string &arch, bool ptx) {
  const RtcApi &api = lib.api;
  RtcProgram program = nullptr;
  if (RtcResult r =
          api.create_program(&program, source.c_str(), v.source_name, 0, nullptr, nullptr);
      r != kSuccess)
    return Status::error("{}: cannot create a program: {}", v.name, error_text(lib, r));
  std::vector<const char *> argv;
  for (const std::string &a : args)
    argv.push_back(a.c_str());
  RtcResult compiled = api.compile_program(program, int(argv.size()), argv.data());
  RtcOutput out;
  size_t log_size = 0;
  if (api.get_program_log_size(program, &log_size) == kSuccess && log_size > 1) {
    out.log.resize(log_size);
    if (api.get_program_log(program, out.log.data()) != kSuccess)
      out.log.clear();
    while (!out.log.empty() && (out.log.back() == '\0' || out.log.back() == '\n'))
      out.log.pop_back();
  }
  auto size_fn = ptx ? api.get_ptx_size : api.get_code_size;
  auto get_fn = ptx ? api.get_ptx : api.get_code;
  Status failed;
  if (compiled != kSuccess) {
    failed = Status::error("{} could not compile {} for {} ({}):\n{}", lib.identity, v.source_name,
                           arch, error_text(lib, compiled),
                           out.log.empty() ? "(the compiler left no log)" : out.log);
  } else {
    size_t size = 0;
    if (RtcResult r = size_fn(program, &size); r != kSuccess || size == 0)
      failed = Status::error("{} compiled {} for {} but gave no {}: {}", lib.identity,
                             v.source_name, arch, ptx ? "PTX" : "code", error_text(lib, r));
    else {
      out.code.resize(size);
      if (RtcResult r2 = get_fn(program, out.code.data()); r2 != kSuccess)
        failed = Status::error("{}: cannot read the {}: {}", lib.identity, ptx ? "PTX" : "code",
                               error_text(lib, r2));
    }
  }
  api.destroy_program(&program);
  if (!failed)
    return failed;
  return out;
}

/// The compiles on threads of their own that have not ended: at exit the
/// process waits for them (wait_for_compiles, registered with atexit after the
/// vendor library was loaded, so it runs before that library's own teardown),
/// since one abandoned after its time limit cannot be interrupted and would
/// otherwise run on while the library's static objects are destroyed.
struct RunningCompiles {
  std::mutex mutex;
  std::condition_variable ended;
  int count = 0;
};
RunningCompiles &running_compiles() {
  static auto &r = *new RunningCompiles; // never destroyed: threads may outlive main
  return r;
}
void wait_for_compiles() {
  RunningCompiles &r = running_compiles();
  std::unique_lock<std::mutex> lock(r.mutex);
  r.ended.wait(lock, [&] { return r.count == 0; });
}

/// run_compile on its own thread, abandoned after the time limit.
Expected<RtcOutput> run_with_limit(const RtcLibrary &lib, const VendorLibrary &v,
                                   std::string source, std::vector<std::string> args,
                                   std::string arch, bool ptx, double seconds) {
  struct Shared {
    std::mutex mutex;
    std::condition_variable done;
    std::optional<Expected<RtcOutput>> result;
  };
  auto shared = std::make_shared<Shared>();
  static std::once_flag registered;
  std::call_once(registered, [] { std::atexit(wait_for_compiles); });
  RunningCompiles &running = running_compiles();
  {
    std::lock_guard<std::mutex> lock(running.mutex);
    ++running.count;
  }
  std::thread([shared, &lib, v, source = std::move(source), args = std::move(args), arch, ptx,
               &running]() {
    Expected<RtcOutput> r = run_compile(lib, v, source, args, arch, ptx);
    {
      std::lock_guard<std::mutex> lock(shared->mutex);
      shared->result.emplace(std::move(r));
      shared->done.notify_all();
    }
    std::lock_guard<std::mutex> lock(running.mutex);
    --running.count;
    running.ended.notify_all();
  }).detach(); // `lib` is never destroyed; `v` is a copy
  std::unique_lock<std::mutex> lock(shared->mutex);
  if (!shared->done.wait_for(lock, std::chrono::duration<double>(seconds),
                             [&] { return shared->result.has_value(); }))
    return Status::error("{} was still compiling for {} after {} s: stopped waiting (the vendor "
                         "compiler cannot be interrupted and finishes in the background)",
                         lib.identity, arch, seconds);
  return std::move(*shared->result);
}

} // namespace

std::string_view rtc_name(RtcKind kind) { return vendor(kind).name; }

std::vector<std::string> RtcCompiler::search_paths(RtcKind kind) {
  const VendorLibrary &v = vendor(kind);
  std::vector<std::string> dirs;
  if (const char *root = std::getenv(v.root_variable); root && *root)
    dirs.push_back(std::string(root) + "/" + v.root_subdir);
  for (const char *d : v.dirs)
    if (std::find(dirs.begin(), dirs.end(), d) == dirs.end())
      dirs.push_back(d);
  std::vector<std::string> paths;
  for (const std::string &d : dirs)
    for (const char *f : v.files)
      paths.push_back(d + "/" + f);
  for (const char *f : v.files)
    paths.push_back(f); // the loader path: LD_LIBRARY_PATH, ld.so.cache
  return paths;
}

Expected<std::unique_ptr<RtcCompiler>> RtcCompiler::load(RtcKind kind) {
  return load(kind, search_paths(kind));
}

Expected<std::unique_ptr<RtcCompiler>>
RtcCompiler::load(RtcKind kind, const std::vector<std::string> &candidates) {
  const VendorLibrary &v = vendor(kind);
  std::string tried;
  for (const std::string &c : candidates) {
    std::string why;
    if (const RtcLibrary *lib = open_candidate(v, c, why))
      return std::make_unique<RtcCompiler>(kind, lib);
    tried += (tried.empty() ? "" : ", ") + c;
    if (c.find('/') == std::string::npos)
      tried += " (loader path)";
    if (!why.empty())
      tried += " (" + why + ")";
  }
  return Status::error("{} not found: tried {}; {}", v.name, tried.empty() ? "nothing" : tried,
                       v.install_hint);
}

std::string RtcCompiler::name() const { return vendor(kind_).name; }
std::string RtcCompiler::identity() const { return library_->identity; }
const std::string &RtcCompiler::library_path() const { return library_->path; }

Expected<std::vector<std::string>> RtcCompiler::compile_args(RtcKind kind, const CompileOptions &o,
                                                             bool ptx) {
  std::vector<std::string> args;
  if (o.opt_level < 0 || o.opt_level > 3)
    return Status::error("compile for {}: optimization level {} is not 0 to 3", o.arch,
                         o.opt_level);
  if (kind == RtcKind::nvrtc) {
    if (!is_nvidia_arch(o.arch, "sm_"))
      return Status::error("nvrtc compiles for NVIDIA GPUs: '{}' is not an architecture like "
                           "sm_80 or sm_90a",
                           o.arch);
    if (!o.features.empty())
      return Status::error("compile for {}: NVIDIA targets take no features ('{}')", o.arch,
                           o.features);
    if (o.wave_size != target::kNvidiaWarpSize)
      return Status::error("compile for {}: NVIDIA warps are {} threads, not {}", o.arch,
                           target::kNvidiaWarpSize, o.wave_size);
    args.push_back("--gpu-architecture=" + (ptx ? "compute_" + o.arch.substr(3) : o.arch));
    args.push_back("-std=c++17");
    args.push_back("-default-device");
    if (o.opt_level != 3)
      args.push_back(fmt::format("--ptxas-options=-O{}", o.opt_level));
  } else {
    if (ptx)
      return Status::error("PTX is NVIDIA's: hiprtc makes AMDGPU code objects");
    if (target::vendor_of_name(o.arch) != target::Vendor::amd)
      return Status::error("hiprtc here compiles for AMD GPUs: '{}' is not a processor like "
                           "gfx1201 or gfx90a",
                           o.arch);
    const target::Arch *arch = target::find_arch(o.arch);
    if (arch == nullptr)
      return Status::error("compile: unknown AMDGPU processor '{}': supported are {}", o.arch,
                           target::arch_list());
    if (o.wave_size != 32 && o.wave_size != 64)
      return Status::error("compile for {}: wave size {} is neither 32 nor 64", o.arch,
                           o.wave_size);
    if (!arch->runs_wave(o.wave_size))
      return Status::error("compile for {}: gfx{} runs wave{} only, not wave{}", o.arch,
                           arch->generation, arch->wave_size(), o.wave_size);
    args.push_back("--offload-arch=" + (o.features.empty() ? o.arch : o.arch + ":" + o.features));
    args.push_back(fmt::format("-O{}", o.opt_level));
    args.push_back("-std=c++17");
    if (o.wave_size == 64 && arch->needs_wave_size_flag(64))
      args.push_back("-mwavefrontsize64");
  }
  args.insert(args.end(), o.extra_flags.begin(), o.extra_flags.end());
  return args;
}

namespace {

Expected<RtcOutput> compile_with(const RtcLibrary &lib, RtcKind kind, std::string_view source,
                                 const CompileOptions &options, bool ptx) {
  auto args = RtcCompiler::compile_args(kind, options, ptx);
  if (!args)
    return args.status();
  if (!(options.timeout_seconds > 0))
    return Status::error("compile for {}: the time limit must be positive", options.arch);
  const VendorLibrary &v = vendor(kind);
  if (knobs().debug >= 2) {
    std::string line;
    for (const std::string &a : *args)
      line += " " + a;
    debug_log(2, "{} ({}):{}", lib.identity, lib.path, line);
  }
  Expected<RtcOutput> out =
      options.isolate ? run_with_limit(lib, v, std::string(source), *args, options.arch, ptx,
                                       options.timeout_seconds)
                      : run_compile(lib, v, std::string(source), *args, options.arch, ptx);
  if (out && !out->log.empty())
    debug_log(2, "{} for {}:\n{}", lib.identity, options.arch, out->log);
  return out;
}

} // namespace

Expected<CodeObject> RtcCompiler::compile(std::string_view source, const CompileOptions &options) {
  auto out = compile_with(*library_, kind_, source, options, /*ptx=*/false);
  if (!out)
    return out.status();
  CodeObject code;
  code.arch = options.arch;
  code.compiler = library_->identity;
  code.bytes.assign(out->code.begin(), out->code.end());
  code.log = std::move(out->log);
  return code;
}

Expected<std::string> RtcCompiler::compile_ptx(std::string_view source,
                                               const CompileOptions &options) {
  if (kind_ != RtcKind::nvrtc)
    return Status::error("PTX is NVIDIA's: {} makes AMDGPU code objects", name());
  auto out = compile_with(*library_, kind_, source, options, /*ptx=*/true);
  if (!out)
    return out.status();
  std::string ptx = std::move(out->code);
  while (!ptx.empty() && ptx.back() == '\0')
    ptx.pop_back();
  return ptx;
}

} // namespace flashjit::compiler
