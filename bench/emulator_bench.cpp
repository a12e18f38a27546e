// Emulator throughput on one mid-size kernel: seqlen 512, head dim 128, 4 heads,
// batch 1, bf16 (gfx1201's default config). Prints the compile time (first call)
// and the run time of the cached kernel, as seconds and workgroups per second.
//
//   emulator_bench [threads] [repeats]     (threads 0 = hardware concurrency)
#include "runtime/emulator.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>

using namespace flashjit;

namespace {

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

} // namespace

int main(int argc, char **argv) {
  const int threads = argc > 1 ? std::atoi(argv[1]) : 0;
  const int repeats = argc > 2 ? std::max(1, std::atoi(argv[2])) : 3;
  auto target = lowering::parse_target("gfx1201");
  if (!target) {
    std::fprintf(stderr, "%s\n", target.status().message().c_str());
    return 1;
  }
  AttentionSpec spec = make_spec(1, 4, 4, 512, 512, 128, 128, DType::bf16);
  spec.lse = true;
  auto k = lowering::generate(spec, lowering::default_config(spec, *target), *target);
  if (!k) {
    std::fprintf(stderr, "%s\n", k.status().message().c_str());
    return 1;
  }
  const HostTensors inputs = make_random_inputs(spec, 42);
  const runtime::EmulatorOptions options{.threads = threads};
  const auto grid = ir::grid_size(k->grid, ir::bind_attention(spec)).value();
  const int64_t groups = grid[0] * grid[1] * grid[2];

  HostTensors t = inputs;
  auto start = std::chrono::steady_clock::now();
  Status s = runtime::emulate(*k, *target, spec, t, options);
  const double first = seconds_since(start);
  if (!s) {
    std::fprintf(stderr, "%s\n", s.message().c_str());
    return 1;
  }
  const ErrorStats err = compare(spec, t, reference_attention(spec, t));
  const Tolerance tol = tolerance_for(spec.dtype);

  double best = 1e30;
  for (int i = 0; i < repeats; ++i) {
    t = inputs;
    start = std::chrono::steady_clock::now();
    s = runtime::emulate(*k, *target, spec, t, options);
    best = std::min(best, seconds_since(start));
    if (!s) {
      std::fprintf(stderr, "%s\n", s.message().c_str());
      return 1;
    }
  }
  const unsigned used =
      threads > 0 ? unsigned(threads) : std::max(1u, std::thread::hardware_concurrency());
  std::printf("emulator_bench: %s on %s, %lld workgroups x %d work-items, %u thread(s)\n",
              spec.summary().c_str(), target->arch.c_str(), static_cast<long long>(groups),
              k->block_threads, used);
  std::printf("  first call (compile + run): %.3f s\n", first);
  std::printf("  run (best of %d):           %.3f s = %.1f workgroups/s\n", repeats, best,
              double(groups) / best);
  std::printf("  vs float64 reference:       max_abs %.3g rel_l2 %.3g (%s)\n", err.max_abs,
              err.rel_l2, err.within(tol.abs, tol.rel) ? "within tolerance" : "OUT OF TOLERANCE");
  return err.within(tol.abs, tol.rel) ? 0 : 1;
}
