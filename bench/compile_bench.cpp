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
//
// --sweep: the data of the compile-latency figure (bench/plot_compile.py). The
// cold compile of the default-config forward kernel of a bf16 causal spec (batch
// 1, 16 heads, seqlen 1024) per head dim (32 to 256), per compiler and target:
// in-process LLVM for gfx1201, gfx1100 and gfx942 on the calling thread, and
// nvrtc for sm_90 (compiled as sm_90a) and sm_80 through the pipeline. Each
// compiler first compiles once untimed (loading its library is no compile).
// Median wall time and median CPU time of the compiling thread, as CSV:
//
//   compile_bench --sweep OUT.csv [repeats]         (default 3)
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
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <thread>
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

/// The spec of every kernel here: the kernel text depends on it only through
/// the head dims.
AttentionSpec causal_spec(int64_t head_dim) {
  AttentionSpec spec = make_spec(1, 16, 16, 1024, 1024, head_dim, head_dim, DType::bf16);
  spec.causal = true;
  return spec;
}

/// "name (N cores)": the sweep's times depend on the machine, so each row says
/// which one (CSVs of several hosts go into one figure).
std::string host_text() {
  char name[256] = {};
  if (::gethostname(name, sizeof name - 1) != 0)
    std::snprintf(name, sizeof name, "unknown");
  return fmt::format("{} ({} cores)", name, std::thread::hardware_concurrency());
}

/// A CSV field, quoted where it holds a separator (a compiler identity or a
/// host name might).
std::string csv_field(const std::string &text) {
  if (text.find_first_of(",\"\n") == std::string::npos)
    return text;
  std::string quoted = "\"";
  for (char c : text)
    quoted += c == '"' ? std::string("\"\"") : std::string(1, c);
  return quoted + "\"";
}

/// One cold compile per head dim, for one compiler and target.
struct SweepRow {
  std::string compiler, target;
  int64_t head_dim = 0;
  double wall = 0, cpu = 0; // medians, seconds
  size_t source_bytes = 0;
};

/// Times `compile` (one cold compile, false on failure) `repeats` times after
/// measure()'s first call: the median wall time, and the median CPU time of the
/// calling thread over the same compiles (wall time includes waiting for a
/// core when other processes compete; CPU time does not). False if any fails.
bool time_compiles(int repeats, const std::function<bool()> &compile, double &wall, double &cpu) {
  bool ok = true;
  std::vector<double> cpus;
  Sample s = measure(repeats, [&] {
    double start = thread_cpu_seconds();
    ok = compile() && ok;
    cpus.push_back(thread_cpu_seconds() - start);
  });
  if (!ok)
    return false;
  cpus.erase(cpus.begin()); // measure()'s first call, which its median leaves out too
  std::sort(cpus.begin(), cpus.end());
  wall = s.median;
  cpu = cpus[cpus.size() / 2];
  return true;
}

int sweep(const std::string &out_path, int repeats) {
  // The CSV is written at the end; a missing directory is better told before
  // minutes of compiles than after.
  const std::filesystem::path dir = std::filesystem::path(out_path).parent_path();
  if (!dir.empty() && !std::filesystem::is_directory(dir))
    return failed(Status::error("{}: no such directory", dir.string()), "sweep");
  const std::vector<int64_t> head_dims = {32, 64, 80, 96, 128, 160, 192, 256};
  const std::string host = host_text();
  std::vector<SweepRow> rows;
  auto add = [&](SweepRow row) {
    fmt::print("{:<12} {:<8} d={:<4} wall median {}  cpu median {}  {} bytes\n", row.compiler,
               row.target, row.head_dim, time_text(row.wall), time_text(row.cpu), row.source_bytes);
    std::fflush(stdout);
    rows.push_back(std::move(row));
  };
  fmt::print("cold compile sweep on {}, median of {}; forward, {}\n", host, repeats,
             causal_spec(128).summary());

#ifdef FLASHJIT_HAVE_LLVM
  {
    LlvmCompiler llvm;
    const std::string identity = llvm.identity();
    bool warmed = false;
    for (const char *arch : {"gfx1201", "gfx1100", "gfx942"}) {
      auto target = lowering::parse_target(arch);
      if (!target)
        return failed(target.status(), arch);
      // As the default mode's in-thread compile: on this thread, so that its CPU
      // time is the compile's (a forked child's is not this thread's).
      CompileOptions o;
      o.arch = target->arch;
      o.wave_size = target->wave_size;
      o.isolate = false;
      for (int64_t d : head_dims) {
        const AttentionSpec spec = causal_spec(d);
        auto kernel = lowering::generate(spec, lowering::default_config(spec, *target), *target);
        if (!kernel)
          return failed(kernel.status(), fmt::format("generate {} d={}", arch, d));
        Status status;
        auto compile = [&] {
          auto c = llvm.compile(kernel->source, o);
          if (!c)
            status = c.status();
          return bool(c);
        };
        // The first compile of the process loads and initializes LLVM's
        // targets: not a kernel's compile time.
        if (!warmed && !compile())
          return failed(status, fmt::format("llvm {} d={} (warm-up)", arch, d));
        warmed = true;
        SweepRow row{identity, o.arch, d, 0, 0, kernel->source.size()};
        if (!time_compiles(repeats, compile, row.wall, row.cpu))
          return failed(status, fmt::format("llvm {} d={}", arch, d));
        add(row);
      }
    }
  }
#else
  fmt::print("llvm: not in this build (FLASHJIT_WITH_LLVM=OFF)\n");
#endif

  if (auto nvrtc = RtcCompiler::load(RtcKind::nvrtc)) {
    const std::string identity = (*nvrtc)->identity();
    Options options;
    options.compiler = "nvrtc";
    // The rules' default config, as for LLVM: never a tuned entry of the host's
    // tuned.json, which would make hosts' figures differ in kernels, not compilers.
    options.tuned = false;
    bool warmed = false;
    for (const char *arch : {"sm_90", "sm_80"}) {
      for (int64_t d : head_dims) {
        // As the default mode: through the pipeline, for the kernel's
        // compile arch (sm_90a for the sm90 rules).
        auto generated = pipeline::generate(causal_spec(d), arch, options);
        if (!generated)
          return failed(generated.status(), fmt::format("generate {} d={}", arch, d));
        const lowering::Lowered &kernel = generated->lowered;
        CompileOptions o = pipeline::compile_options(generated->target, options, &kernel);
        // isolate would run nvrtc on a thread of its own, whose CPU time is not
        // this thread's; the compile's arguments are the same either way.
        o.isolate = false;
        Status status;
        auto compile = [&] {
          auto c = (*nvrtc)->compile(kernel.source, o);
          if (!c)
            status = c.status();
          return bool(c);
        };
        if (!warmed && !compile()) // the first call loads nvrtc's builtins
          return failed(status, fmt::format("nvrtc {} d={} (warm-up)", o.arch, d));
        warmed = true;
        SweepRow row{identity, o.arch, d, 0, 0, kernel.source.size()};
        if (!time_compiles(repeats, compile, row.wall, row.cpu))
          return failed(status, fmt::format("nvrtc {} d={}", o.arch, d));
        add(row);
      }
    }
  } else {
    fmt::print("nvrtc: skipped: {}\n", nvrtc.status().message());
  }

  if (rows.empty())
    return failed(Status::error("no compiler in this build or on this machine"), "sweep");
  // Written only once every compile succeeded: a partial file is never mistaken
  // for the whole sweep.
  std::ofstream out(out_path);
  out << "compiler,target,head_dim,wall_ms_median,cpu_ms_median,repeats,source_bytes,host\n";
  for (const SweepRow &r : rows)
    out << fmt::format("{},{},{},{:.2f},{:.2f},{},{},{}\n", csv_field(r.compiler),
                       csv_field(r.target), r.head_dim, r.wall * 1e3, r.cpu * 1e3, repeats,
                       r.source_bytes, csv_field(host));
  out.close();
  if (!out)
    return failed(Status::error("cannot write {}", out_path), "sweep");
  fmt::print("wrote {} rows to {}\n", rows.size(), out_path);
  return 0;
}

} // namespace

int main(int argc, char **argv) {
  if (argc > 1 && std::string(argv[1]) == "--sweep") {
    if (argc < 3) {
      fmt::print(stderr, "usage: compile_bench --sweep OUT.csv [repeats]\n");
      return 2;
    }
    return sweep(argv[2], argc > 3 ? std::max(1, std::atoi(argv[3])) : 3);
  }
  const int cold = argc > 1 ? std::max(1, std::atoi(argv[1])) : 7;
  const int hits = argc > 2 ? std::max(1, std::atoi(argv[2])) : 2000;

  auto target = lowering::parse_target("gfx1201");
  if (!target)
    return failed(target.status(), "gfx1201");
  const AttentionSpec spec = causal_spec(128);
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
