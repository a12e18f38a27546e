// make_compiler(): the rules of select.h.
#include "compiler/select.h"

#include "compiler/knobs.h"
#include "compiler/llvm_plugin.h"
#include "compiler/rtc_compiler.h"
#include "target/arch.h"
#ifdef FLASHJIT_HAVE_LLVM
#include "compiler/llvm_compiler.h"
#endif

#include <map>
#include <mutex>

namespace flashjit::compiler {
namespace {

/// The processor and features of an AMD target id.
void split_target(std::string_view target_id, std::string &arch, std::string &features) {
  size_t colon = target_id.find(':');
  arch = std::string(target_id.substr(0, colon));
  features = colon == std::string_view::npos ? "" : std::string(target_id.substr(colon + 1));
}

Expected<std::unique_ptr<Compiler>> make_llvm(std::string_view target_id) {
#ifdef FLASHJIT_HAVE_LLVM
  if (auto plugin = llvm_plugin(); !plugin)
    return plugin.status().with_context(fmt::format("the llvm compiler for {}", target_id));
  return std::unique_ptr<Compiler>(new LlvmCompiler());
#else
  return Status::error("the llvm compiler is not in this flashjit: it was built without LLVM 22 "
                       "(FLASHJIT_WITH_LLVM=OFF); for {} use --compiler hiprtc (ROCm), or rebuild "
                       "with -DFLASHJIT_WITH_LLVM=ON",
                       target_id);
#endif
}

Expected<std::unique_ptr<Compiler>> make_rtc(RtcKind kind) {
  auto c = RtcCompiler::load(kind);
  if (!c)
    return c.status();
  return std::unique_ptr<Compiler>(c.take());
}

/// Whether hiprtc compiles a trivial kernel for `target_id`; once per target
/// and process. Ok, or why not.
Status probe_hiprtc(RtcCompiler &hiprtc, std::string_view target_id) {
  static std::mutex mutex;
  static std::map<std::string, Status> probed;
  std::lock_guard<std::mutex> lock(mutex);
  auto it = probed.find(std::string(target_id));
  if (it != probed.end())
    return it->second;
  CompileOptions o;
  split_target(target_id, o.arch, o.features);
  // The wave size the processor runs natively (unknown processors: hiprtc's
  // compile_args says so).
  if (const target::Arch *arch = target::find_arch(o.arch))
    o.wave_size = arch->wave_size();
  o.timeout_seconds = 60;
  auto code =
      hiprtc.compile("extern \"C\" __global__ void flashjit_probe(int *p) { *p = 1; }\n", o);
  Status s = code ? Status::ok() : code.status();
  probed[std::string(target_id)] = s;
  return s;
}

} // namespace

Expected<Vendor> target_vendor(std::string_view target_id) {
  if (std::optional<Vendor> v = target::vendor_of_name(target_id))
    return *v;
  return Status::error("'{}' is neither an AMD target (gfx1201, gfx90a:xnack-, ...) nor an "
                       "NVIDIA one (sm_80, sm_90, sm_90a, ...)",
                       target_id);
}

const std::vector<std::string_view> &compiler_names() {
  static const std::vector<std::string_view> names = {"auto", "llvm", "hiprtc", "nvrtc"};
  return names;
}

Expected<std::unique_ptr<Compiler>> make_compiler(std::string_view name,
                                                  std::string_view target_id) {
  auto vendor = target_vendor(target_id);
  if (!vendor)
    return vendor.status();
  const bool amd = *vendor == Vendor::amd;

  if (name == "llvm") {
    if (!amd)
      return Status::error("the llvm compiler makes AMDGPU code objects only, not code for {}: "
                           "use --compiler nvrtc (or auto)",
                           target_id);
    return make_llvm(target_id);
  }
  if (name == "hiprtc") {
    if (!amd)
      return Status::error("ROCm's hiprtc makes AMDGPU code objects only, not code for {} (HIP on "
                           "NVIDIA compiles with nvrtc): use --compiler nvrtc (or auto)",
                           target_id);
    return make_rtc(RtcKind::hiprtc);
  }
  if (name == "nvrtc") {
    if (amd)
      return Status::error("nvrtc compiles for NVIDIA GPUs (sm_80, sm_90, ...) only, not for {}: "
                           "use --compiler hiprtc or llvm (or auto)",
                           target_id);
    return make_rtc(RtcKind::nvrtc);
  }
  if (name != "auto")
    return Status::error("unknown compiler '{}': choose auto, llvm, hiprtc or nvrtc", name);

  if (!amd) {
    auto c = make_rtc(RtcKind::nvrtc);
    if (c)
      debug_log(1, "compiler for {}: {} (auto: NVIDIA target)", target_id, (*c)->identity());
    return c;
  }
  std::string hiprtc_problem;
  if (auto h = RtcCompiler::load(RtcKind::hiprtc); !h) {
    hiprtc_problem = h.status().message();
  } else if (Status probe = probe_hiprtc(**h, target_id); !probe) {
    hiprtc_problem = fmt::format("{} ({}) loads but cannot compile for {}: {}", (*h)->identity(),
                                 (*h)->library_path(), target_id, probe.message());
  } else {
    debug_log(1, "compiler for {}: {} from {} (auto: ROCm present)", target_id, (*h)->identity(),
              (*h)->library_path());
    return std::unique_ptr<Compiler>(h.take());
  }
  auto llvm = make_llvm(target_id);
  if (!llvm)
    return Status::error("no compiler for {}: hiprtc: {}; llvm: {}", target_id, hiprtc_problem,
                         llvm.status().message());
  debug_log(1, "compiler for {}: {} (auto: {})", target_id, (*llvm)->identity(), hiprtc_problem);
  return llvm;
}

} // namespace flashjit::compiler
