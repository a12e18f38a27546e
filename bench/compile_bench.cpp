// Compile and cache latency, median of N:
//   cold compile, per backend: in-process LLVM on a gfx1201 attention kernel
//     from lowering::generate (isolated in a forked child, the default, and on
//     the calling thread); nvrtc on the same signature's sm_90 kernel (its
//     compile arch, sm_90a for the sm90 rules); hiprtc
//     where ROCm is;
//   memory hit and disk hit of the KernelCache on that gfx1201 code object.
// Targets: cold compile <= 300 ms typical, disk hit <= 1 ms, memory hit <= 20 us.
//
//   compile_bench [cold_repeats] [hit_repeats]     (defaults 7 and 2000)
#include "compiler/kernel_cache.h"
#include "compiler/rtc_compiler.h"
#include "lowering/lower.h"
#include "runtime/pipeline.h"
#ifdef FLASHJIT_HAVE_LLVM
#include "compiler/llvm_compiler.h"
#endif

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <functional>
#include <unistd.h>
#include <vector>

using namespace flashjit;
using namespace flashjit::compiler;

namespace {

double seconds(const std::function<void()> &f) {
  auto start = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

/// CPU time of the calling thread: unlike wall time, not inflated by other
/// processes competing for the cores.
double thread_cpu_seconds() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return double(t.tv_sec) + 1e-9 * double(t.tv_nsec);
}

struct Sample {
  double first = 0, median = 0, best = 0;
};

/// Runs `f` once (first), then `repeats` more times: their median and best.
Sample measure(int repeats, const std::function<void()> &f) {
  Sample s;
  s.first = seconds(f);
  std::vector<double> t;
  for (int i = 0; i < repeats; ++i)
    t.push_back(seconds(f));
  std::sort(t.begin(), t.end());
  s.median = t.empty() ? s.first : t[t.size() / 2];
  s.best = t.empty() ? s.first : t.front();
  return s;
}

std::string time_text(double s) {
  if (s < 1e-3)
    return fmt::format("{:8.2f} us", s * 1e6);
  return fmt::format("{:8.2f} ms", s * 1e3);
}

void report(const std::string &what, const Sample &s, double target) {
  fmt::print("{:<44} median {}  best {}  first {}  target <= {}  {}\n", what, time_text(s.median),
             time_text(s.best), time_text(s.first), time_text(target),
             s.median <= target ? "ok" : "OVER");
}

bool failed(const Status &s, const std::string &what) {
  if (s)
    return false;
  fmt::print(stderr, "{}: {}\n", what, s.message());
  return true;
}

} // namespace

int main(int argc, char **argv) {
  const int cold = argc > 1 ? std::max(1, std::atoi(argv[1])) : 7;
  const int hits = argc > 2 ? std::max(1, std::atoi(argv[2])) : 2000;

  auto target = lowering::parse_target("gfx1201");
  if (!target)
    return failed(target.status(), "gfx1201");
  AttentionSpec spec = make_spec(1, 16, 16, 1024, 1024, 128, 128, DType::bf16);
  spec.causal = true;
  const ir::Config config = lowering::default_config(spec, *target);
  auto kernel = lowering::generate(spec, config, *target);
  if (!kernel)
    return failed(kernel.status(), "generate");
  fmt::print("kernel: {} for {} ({}), {} bytes of HIP\n\n", spec.summary(), target->target_id(),
             config.summary(), kernel->source.size());

  CompileOptions amd;
  amd.arch = target->arch;
  amd.wave_size = target->wave_size;
  CodeObject code;
  code.arch = "gfx1201";
  code.compiler = "none";
  code.bytes.assign(40000, 0x5a); // a stand-in when there is no LLVM

#ifdef FLASHJIT_HAVE_LLVM
  LlvmCompiler llvm;
  Status status;
  for (bool isolate : {true, false}) {
    CompileOptions o = amd;
    o.isolate = isolate;
    Sample s = measure(cold, [&] {
      auto c = llvm.compile(kernel->source, o);
      if (!c)
        status = c.status();
      else
        code = c.take();
    });
    if (failed(status, "llvm"))
      return 1;
    report(fmt::format("cold compile, {} gfx1201{}", llvm.identity(),
                       isolate ? " (forked child)" : " (in thread)"),
           s, 0.300);
    if (!isolate) {
      std::vector<double> cpu;
      for (int i = 0; i < cold; ++i) {
        double start = thread_cpu_seconds();
        (void)llvm.compile(kernel->source, o);
        cpu.push_back(thread_cpu_seconds() - start);
      }
      std::sort(cpu.begin(), cpu.end());
      fmt::print("{:<44} median {} of CPU time (wall time above includes waiting for a core)\n",
                 "  the same, CPU time of the compiling thread", time_text(cpu[cpu.size() / 2]));
    }
  }
#else
  fmt::print("cold compile, llvm: not in this build (FLASHJIT_WITH_LLVM=OFF)\n");
#endif

  if (auto nvrtc = RtcCompiler::load(RtcKind::nvrtc)) {
    // The same attention signature for the H100, through the pipeline: the sm90
    // rules' kernel compiles for its Lowered::compile_arch (sm_90a).
    Options options;
    options.compiler = "nvrtc";
    auto generated = pipeline::generate(spec, "sm_90", options);
    if (!generated)
      return failed(generated.status(), "generate sm_90");
    const lowering::Lowered *nv_kernel = &generated->lowered;
    const CompileOptions o = pipeline::compile_options(generated->target, options, nv_kernel);
    Status status;
    Sample s = measure(cold, [&] {
      auto c = (*nvrtc)->compile(nv_kernel->source, o);
      if (!c)
        status = c.status();
    });
    if (failed(status, "nvrtc"))
      return 1;
    report(fmt::format("cold compile, {} {} d=128", (*nvrtc)->identity(), o.arch), s, 0.300);
  } else {
    fmt::print("cold compile, nvrtc: skipped: {}\n", nvrtc.status().message());
  }
  if (auto hiprtc = RtcCompiler::load(RtcKind::hiprtc)) {
    Status status;
    Sample s = measure(cold, [&] {
      auto c = (*hiprtc)->compile(kernel->source, amd);
      if (!c)
        status = c.status();
    });
    if (!failed(status, "hiprtc"))
      report(fmt::format("cold compile, {} gfx1201", (*hiprtc)->identity()), s, 0.300);
  } else {
    fmt::print("cold compile, hiprtc: skipped: no ROCm here\n");
  }

  // The cache, on the code object compiled above.
  const std::string dir = (std::filesystem::temp_directory_path() /
                           ("flashjit-compile-bench-" + std::to_string(::getpid())))
                              .string();
  KeyParts key;
  key.ir_text = kernel->source;
  key.target_id = "gfx1201";
  key.compiler_identity = code.compiler;
  auto compile = [&]() -> Expected<CodeObject> { return code; };
  {
    KernelCache cache(dir);
    if (!cache.get_or_compile(key, compile))
      return 1;
    CacheOutcome outcome = CacheOutcome::compiled;
    Sample s = measure(hits, [&] { (void)cache.get_or_compile(key, compile, &outcome); });
    if (outcome != CacheOutcome::memory_hit)
      return failed(Status::error("expected memory hits"), "cache");
    report(fmt::format("memory hit ({} bytes)", code.bytes.size()), s, 20e-6);
  }
  {
    CacheOutcome outcome = CacheOutcome::compiled;
    std::vector<double> t;
    for (int i = 0; i < std::min(hits, 500); ++i) {
      KernelCache fresh(dir); // empty memory: every lookup reads the file
      t.push_back(seconds([&] { (void)fresh.get_or_compile(key, compile, &outcome); }));
      if (outcome != CacheOutcome::disk_hit)
        return failed(Status::error("expected disk hits"), "cache");
    }
    Sample s;
    s.first = t.front();
    std::sort(t.begin(), t.end());
    s.median = t[t.size() / 2];
    s.best = t.front();
    report(fmt::format("disk hit (read + SHA-256 of {} bytes)", code.bytes.size()), s, 1e-3);
  }
  std::filesystem::remove_all(dir);
  return 0;
}
