// The emulator: runs an emitted AMD kernel on the CPU with exact lane semantics.
//
// It executes the same text the GPU gets (Lowered::kernel_text: everything but
// the AMD prelude and the fj_mma wrapper) under templates/emulator_prelude.hip,
// compiled in process by Clang for the host and run by LLVM's ORC JIT. Every
// work-item is a fiber; the lanes of a wave rendezvous at each matrix
// instruction and shuffle, the lanes of a workgroup at each barrier, and the
// matrix instruction is computed from all lanes' fragments through the lane maps
// of the kernel's matrix-table row (Lowered::mma->layout), so a kernel whose
// lane bookkeeping is wrong gives the wrong answer here as on the GPU.
//
// Checks a GPU would not give: each stops the run with a Status naming the
// kernel, the workgroup, the lane and the address or detail:
//   * global loads and stores outside the five buffers (Q, K, V, O, LSE), stores
//     into the inputs, f32 stores into 16-bit buffers, misaligned 128-bit accesses;
//   * LDS accesses outside every FJ_LDS_ARRAY, reads of LDS bytes not written in
//     this workgroup, LDS arrays summing past Target::lds_bytes (or disagreeing
//     with Lowered::lds_bytes), and races: accesses by different waves to one
//     element with no barrier between them;
//   * a barrier not reached by every lane (a lane returned while others wait,
//     lanes at different barriers);
//   * a matrix instruction or shuffle issued while some lanes of the wave have
//     exited or wait at a different collective; gfx11 A/B replicas that differ;
//   * an index past the end of one of the kernel's register arrays.
// docs/emulator.md records the design and its decisions.
#pragma once

#include "ir/reference.h"
#include "ir/spec.h"
#include "ir/status.h"
#include "lowering/lower.h"
#include "lowering/target.h"

#include <chrono>
#include <functional>
#include <span>

namespace flashjit::runtime {

struct EmulatorOptions {
  /// Worker threads running workgroups in parallel; 0 = hardware concurrency.
  int threads = 0;
  /// Stack of each emulated lane (below it, a guard page).
  size_t lane_stack_bytes = 256 * 1024;
  /// Called every `progress_every` while a launch runs (never for one that ends
  /// sooner), from a thread of its own: workgroups done, of all.
  std::function<void(int64_t done, int64_t total)> progress;
  std::chrono::milliseconds progress_every{2000};
};

/// Runs kernel `k` for `spec` over `tensors`: Q, K and V (float values
/// representable in the spec's dtype, laid out by the spec's strides) go in as
/// 16-bit device buffers, O (and LSE when the spec asks for it) come back.
/// Gaps between rows are NaN in every device buffer. Results do not depend on
/// the number of threads. Compiled kernels are cached per kernel text for the
/// life of the process.
Status emulate(const lowering::Lowered &k, const lowering::Target &target,
               const AttentionSpec &spec, HostTensors &tensors,
               const EmulatorOptions &options = {});

/// Split-KV attention (ir::build_split_kv, lowering::lower_split_combine) over
/// `splits` splits: the partial kernel into a poisoned f32 workspace, then the
/// combine kernel into O and LSE; otherwise as emulate().
Status emulate_split_kv(const lowering::Lowered &partial, const lowering::Lowered &combine,
                        const lowering::Target &target, const AttentionSpec &spec, int64_t splits,
                        HostTensors &tensors, const EmulatorOptions &options = {});

/// A device buffer of one emulated launch, bound to the kernel parameter of its name.
struct EmulatorBuffer {
  std::string_view name;
  void *data;
  size_t bytes;
  int elem_bytes; // 2 (bf16/f16) or 4 (f32): accesses must match
  bool writable;
};

/// Runs kernel `k` once with its scalars bound by `shapes` over `buffers`.
Status emulate_kernel(const lowering::Lowered &k, const lowering::Target &target,
                      const ir::Bindings &shapes, std::span<const EmulatorBuffer> buffers,
                      const EmulatorOptions &options = {});

/// A mask tensor's block summary for kernel `k` (Lowered::mask_blocks): the
/// summary kernel (lowering::lower_mask_blocks) over `mask` (the attn_mask
/// buffer) into `blocks`, resized. emulate() and emulate_split_kv() run it
/// themselves; a caller of emulate_kernel() passes `blocks` as attn_mask_blocks.
Status emulate_mask_blocks(const lowering::Lowered &k, const lowering::Target &target,
                           const AttentionSpec &spec, const EmulatorBuffer &mask,
                           std::vector<uint8_t> &blocks, const EmulatorOptions &options = {});

/// Ok when this process can emulate: the LLVM plugin, whose host JIT compiles
/// the kernels for the CPU, loads (compiler/llvm_plugin.h). Else why not.
Status emulator_status();
/// emulator_status() is ok.
bool emulator_available();

} // namespace flashjit::runtime
