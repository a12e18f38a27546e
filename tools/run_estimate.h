// How long `flashjit run` will take on the CPU, estimated before it starts:
// a spec the CPU executors need an hour for is refused (unless --allow-slow)
// instead of running silently.
//
// Both executors run every tile of every KV block the kernel visits (whole
// tiles, masked or not), so their work is
//   FLOPs = 2 * (head_dim + head_dim_v) * batch * heads * pairs,
//   pairs = sum over query blocks of block_m * block_n * (KV blocks visited),
// with the blocks of the config and the mask (ir::kv_block_range). Then
// `run` computes the float64 reference on one core, over the same pairs (an
// upper bound: it skips the masked keys of each row). The rates below were
// measured on a 2-core x86-64 machine (2026-11, CPU time of
// `flashjit run --seqlen-q 2048 --heads 4 --head-dim 128`); a busy machine is
// slower, so the estimate is a floor.
#pragma once

#include "ir/build.h"
#include "ir/spec.h"
#include "ir/status.h"

#include <string>
#include <string_view>

namespace flashjit::cli {

/// FLOP/s of the emulator per core (it runs workgroups on every core).
constexpr double kEmulatorFlopsPerCore = 1.0e9;
/// FLOP/s of the IR interpreter per core (it runs workgroups on every core).
constexpr double kInterpreterFlopsPerCore = 1.0e9;
/// FLOP/s of the float64 reference (one core).
constexpr double kReferenceFlops = 2.0e9;
/// `run` refuses a run estimated longer than this unless --allow-slow is given.
constexpr double kSlowRunSeconds = 60;
/// `run` prints its estimate on stderr before a run longer than this.
constexpr double kAnnounceRunSeconds = 5;

struct RunEstimate {
  double flops = 0;             ///< of the executor (the reference does at most as many)
  double executor_seconds = 0;  ///< flops at the executor's rate on `cores` cores
  double reference_seconds = 0; ///< flops at kReferenceFlops
  double seconds() const { return executor_seconds + reference_seconds; }
};

/// The estimate for running `spec` with `config` on the emulator (`emulator`)
/// or the IR interpreter, with `cores` cores (at least 1 is assumed).
RunEstimate estimate_run(const AttentionSpec &spec, const ir::Config &config, bool emulator,
                         unsigned cores);

/// "about 43 min (2.56e+12 FLOP: 21 min on the emulator at 1.0 GFLOP/s x 2
/// cores, 21 min for the float64 reference at 2.0 GFLOP/s)".
std::string describe(const RunEstimate &e, std::string_view device, unsigned cores);

/// A duration for people: "12 s", "3.5 min", "2.1 h".
std::string human_seconds(double seconds);

/// Ok, or the refusal of a run estimated past kSlowRunSeconds when
/// `allow_slow` is false, naming the estimate and the ways out.
Status check_run_time(const RunEstimate &e, std::string_view device, unsigned cores,
                      bool allow_slow);

/// Host memory `run` needs for `spec` on a CPU executor: Q, K, V and O as their
/// 16-bit bits and as floats, the LSE, and the float64 reference's O and LSE.
int64_t run_host_bytes(const AttentionSpec &spec);

/// This machine's physical memory in bytes (0 if unknown).
int64_t physical_memory_bytes();

/// Ok, or the refusal of a run whose buffers (`bytes`) exceed the machine's
/// memory (`available`; 0: unknown, not checked), naming both and the fix.
/// --allow-slow does not lift it: such a run could only fail.
Status check_run_memory(int64_t bytes, int64_t available);

} // namespace flashjit::cli
