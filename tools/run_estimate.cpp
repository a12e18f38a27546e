#include "tools/run_estimate.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <climits>

namespace flashjit::cli {

RunEstimate estimate_run(const AttentionSpec &spec, const ir::Config &config, bool emulator,
                         unsigned cores) {
  const int64_t bm = std::max<int64_t>(config.block_m, 1);
  const int64_t bn = std::max<int64_t>(config.block_n, 1);
  // KV blocks visited, summed over the query blocks (at most 2^29 / block_m of them).
  double tiles = 0;
  for (int64_t qb = 0; qb * bm < spec.seqlen_q; ++qb) {
    const ir::BlockRange r =
        ir::kv_block_range(qb, bm, bn, spec.seqlen_q, spec.seqlen_k, spec.causal, spec.window);
    tiles += double(std::max<int64_t>(r.end - r.begin, 0));
  }
  RunEstimate e;
  e.flops = 2.0 * double(spec.head_dim_qk + spec.head_dim_v) * double(spec.batch) *
            double(spec.heads) * tiles * double(bm) * double(bn);
  const double per_core = emulator ? kEmulatorFlopsPerCore : kInterpreterFlopsPerCore;
  e.executor_seconds = e.flops / (per_core * double(std::max(cores, 1u)));
  e.reference_seconds = e.flops / kReferenceFlops;
  return e;
}

std::string human_seconds(double seconds) {
  if (seconds < 60)
    return fmt::format("{:.0f} s", std::max(seconds, 1.0));
  if (seconds < 3600)
    return fmt::format("{:.1f} min", seconds / 60);
  return fmt::format("{:.1f} h", seconds / 3600);
}

std::string describe(const RunEstimate &e, std::string_view device, unsigned cores) {
  if (e.executor_seconds == 0) // a GPU: the float64 reference is the time
    return fmt::format("about {} ({:.3g} FLOP on {}, then the float64 reference on the CPU at "
                       "{:.1f} GFLOP/s)",
                       human_seconds(e.seconds()), e.flops, device, kReferenceFlops / 1e9);
  const double per_core = device == "emulator" ? kEmulatorFlopsPerCore : kInterpreterFlopsPerCore;
  return fmt::format("about {} ({:.3g} FLOP: {} on the {} at {:.1f} GFLOP/s x {} core{}, {} for "
                     "the float64 reference at {:.1f} GFLOP/s)",
                     human_seconds(e.seconds()), e.flops, human_seconds(e.executor_seconds), device,
                     per_core / 1e9, std::max(cores, 1u), cores > 1 ? "s" : "",
                     human_seconds(e.reference_seconds), kReferenceFlops / 1e9);
}

Status check_run_time(const RunEstimate &e, std::string_view device, unsigned cores,
                      bool allow_slow) {
  if (allow_slow || e.seconds() <= kSlowRunSeconds)
    return Status::ok();
  return Status::error(
      "this run would take {} on this CPU, past the {:.0f} s that `run` starts "
      "without asking: shorten the sequences (--seqlen-q, --seqlen-k), lower --batch "
      "or --heads, or pass --allow-slow to run it anyway",
      describe(e, device, cores), kSlowRunSeconds);
}

int64_t run_host_bytes(const AttentionSpec &spec) {
  // Sums in double: the sizes may be far past int64 (a refused run must not overflow).
  const double tensors = double(spec.q_elements()) + double(spec.k_elements()) +
                         double(spec.v_elements()) + double(spec.o_elements());
  const double rows = double(spec.batch) * double(spec.heads) * double(spec.seqlen_q);
  const double bytes = tensors * (2 + 4) + rows * 4 +
                       (rows * double(spec.head_dim_v) + rows) * 8; // the float64 reference
  return bytes >= 9.0e18 ? INT64_MAX : int64_t(bytes);
}

int64_t physical_memory_bytes() {
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  return pages > 0 && page > 0 ? int64_t(pages) * int64_t(page) : 0;
}

Status check_run_memory(int64_t bytes, int64_t available) {
  if (available <= 0 || bytes <= available)
    return Status::ok();
  return Status::error("this run needs about {:.3g} GB of host memory for its tensors and the "
                       "float64 reference, more than this machine's {:.3g} GB: shorten the "
                       "sequences (--seqlen-q, --seqlen-k) or lower --batch or --heads",
                       double(bytes) / 1e9, double(available) / 1e9);
}

} // namespace flashjit::cli
