// Run-time shapes: 64 (seqlen_q, seqlen_k) pairs through ONE flashjit::Attention
// (GQA 32:8, D=128, causal, bf16): 32 prefill lengths from 1 to 4097 and 32
// decode steps (one query, a KV cache growing by one key per step). Reports
// the compiles (KernelCache stats: exactly one, at create), each call's
// correctness on the first pairs against the float64 reference, and the host
// time of forward(): the call's wall time with the launch queued and not waited
// for (GPU), median of `calls` calls per pair.
//
//   dynamic_shapes DEVICE [calls] [csv]   DEVICE: cuda:0 | hip:0 | emulator:gfx1201
//
// On the emulator forward() runs the kernel before returning, so there the
// host time is measured by the launch preparation alone: the shape checks, the
// bindings and the argument list that forward() builds on every call.
#include "compiler/kernel_cache.h"
#include "ir/build.h"
#include "ir/reference.h"
#include "lowering/lower.h"
#include "runtime/attention.h"
#include "runtime/gpu_driver.h"
#include "runtime/kernel_args.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <vector>

using namespace flashjit;

namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

AttentionSpec shape(int64_t sq, int64_t sk) {
  AttentionSpec s = make_spec(1, 32, 8, sq, sk, 128, 128, DType::bf16);
  s.causal = true;
  return s;
}

/// The 64 pairs: prefill (sq == sk) at 32 lengths spread over 1..4097, then 32
/// decode steps (sq = 1, sk = 4000 + step).
std::vector<std::pair<int64_t, int64_t>> pairs() {
  std::vector<std::pair<int64_t, int64_t>> p;
  for (int i = 0; i < 32; ++i) {
    const int64_t s = i == 31 ? 4097 : int64_t(std::lround(std::pow(4097.0, i / 31.0))) + i;
    p.emplace_back(s, s);
  }
  for (int step = 0; step < 32; ++step)
    p.emplace_back(1, 4000 + step);
  return p;
}

} // namespace

int main(int argc, char **argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: dynamic_shapes DEVICE [calls] [csv]\n");
    return 2;
  }
  const std::string device = argv[1];
  const int calls = argc > 2 ? std::max(3, std::atoi(argv[2])) : 50;
  std::FILE *csv = argc > 3 ? std::fopen(argv[3], "w") : nullptr;
  if (csv)
    std::fprintf(csv, "seqlen_q,seqlen_k,host_us_median,compiles_so_far,max_abs_err\n");

  const auto t0 = std::chrono::steady_clock::now();
  auto attn = Attention::create(shape(128, 128), device);
  if (!attn) {
    std::fprintf(stderr, "%s\n", attn.status().message().c_str());
    return 1;
  }
  const double create_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  fmt::print("create: {:.3f} s\n{}", create_s, attn->explain());
  const bool gpu = attn->device().kind != DeviceKind::emulator;
  // The emulator's per-call preparation is timed on the kernel's own parameters.
  std::optional<lowering::Lowered> kernel;
  if (!gpu) {
    auto target = lowering::parse_target(attn->device().arch);
    auto k = target ? lowering::generate(attn->spec(),
                                         lowering::default_config(attn->spec(), *target), *target)
                    : Expected<lowering::Lowered>(target.status());
    if (!k) {
      std::fprintf(stderr, "%s\n", k.status().message().c_str());
      return 1;
    }
    kernel = k.take();
  }
  runtime::GpuDriver *driver = nullptr;
  if (gpu) {
    auto d = runtime::gpu_driver(attn->device().kind);
    if (!d) {
      std::fprintf(stderr, "%s\n", d.status().message().c_str());
      return 1;
    }
    driver = *d;
  }

  std::vector<double> all_host;
  int checked = 0;
  for (const auto &[sq, sk] : pairs()) {
    const AttentionSpec s = shape(sq, sk);
    HostTensors host = make_random_inputs(s, uint64_t(sq * 7919 + sk));
    auto bits = [&](const std::vector<float> &v) {
      std::vector<uint16_t> b(v.size());
      for (size_t i = 0; i < v.size(); ++i)
        b[i] = std::isnan(v[i]) ? 0 : uint16_t(to_bits(s.dtype, v[i]));
      return b;
    };
    std::vector<uint16_t> q = bits(host.q), k = bits(host.k), v = bits(host.v);
    std::vector<uint16_t> o(size_t(s.o_elements()), 0xffff);
    double max_abs = NAN;
    bool ran = false; // the outputs were computed (and are checked)
    std::vector<double> host_us;
    if (gpu) {
      void *dq = *driver->allocate(0, q.size() * 2), *dk = *driver->allocate(0, k.size() * 2),
           *dv = *driver->allocate(0, v.size() * 2), *dout = *driver->allocate(0, o.size() * 2);
      (void)driver->copy_to_device(0, dq, q.data(), q.size() * 2);
      (void)driver->copy_to_device(0, dk, k.data(), k.size() * 2);
      (void)driver->copy_to_device(0, dv, v.data(), v.size() * 2);
      (void)driver->copy_to_device(0, dout, o.data(), o.size() * 2);
      for (int i = 0; i < calls; ++i) {
        const auto start = std::chrono::steady_clock::now();
        Status st = attn->forward(s, dq, dk, dv, dout);
        host_us.push_back(
            std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start)
                .count());
        if (!st) {
          std::fprintf(stderr, "%s\n", st.message().c_str());
          return 1;
        }
        if (i % 8 == 7)
          (void)driver->synchronize(0, nullptr); // keep the queue short
      }
      (void)driver->synchronize(0, nullptr);
      (void)driver->copy_to_host(0, o.data(), dout, o.size() * 2);
      ran = sq * sk <= 1024 * 1024; // the float64 reference of larger ones is slow
      for (void *p : {dq, dk, dv, dout})
        (void)driver->release(0, p);
    } else {
      // The emulator runs the kernel inside forward(): run it once where that
      // is quick (for the check), and time what forward() does on every call
      // before the launch: the shape checks, the bindings, the argument list.
      if (sq * sk <= 64 * 1024) {
        Status st = attn->forward(s, q.data(), k.data(), v.data(), o.data());
        if (!st) {
          std::fprintf(stderr, "%s\n", st.message().c_str());
          return 1;
        }
        ran = true;
      }
      const runtime::NamedPointer pointers[] = {
          {"Q", q.data()}, {"K", k.data()}, {"V", v.data()}, {"O", o.data()}};
      for (int i = 0; i < calls; ++i) {
        const auto start = std::chrono::steady_clock::now();
        Status st = s.validate();
        if (st)
          st = s.matches(attn->spec().signature());
        if (st)
          st = lowering::check_launch(*kernel, s);
        const ir::Bindings b = ir::bind_attention(s);
        auto grid = ir::grid_size(kernel->grid, b);
        auto args = runtime::KernelArgs::make(kernel->params, b, pointers);
        host_us.push_back(
            std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start)
                .count());
        if (!st || !grid || !args)
          return 1;
      }
    }
    if (ran) {
      host.o.resize(o.size());
      for (size_t i = 0; i < o.size(); ++i)
        host.o[i] = from_bits(s.dtype, o[i]);
      max_abs = compare(s, host, reference_attention(s, host)).max_abs;
      ++checked;
    }
    const double med = median(host_us);
    all_host.push_back(med);
    const auto stats = compiler::KernelCache::global().stats();
    fmt::print("sq {:5d} sk {:5d}: host {:7.2f} us  compiles so far {}  max_abs {:.2e}\n", sq, sk,
               med, stats.compiles, max_abs);
    if (csv)
      std::fprintf(csv, "%lld,%lld,%.3f,%lld,%.3e\n", (long long)sq, (long long)sk, med,
                   (long long)stats.compiles, max_abs);
  }
  const auto stats = compiler::KernelCache::global().stats();
  fmt::print("64 shapes through one Attention: {} compile(s), {} memory / {} disk hits; host time "
             "per forward: median {:.2f} us, max {:.2f} us; {} outputs checked\n",
             stats.compiles, stats.memory_hits, stats.disk_hits, median(all_host),
             *std::max_element(all_host.begin(), all_host.end()), checked);
  fmt::print("{}", attn->explain());
  if (csv)
    std::fclose(csv);
  return 0;
}
