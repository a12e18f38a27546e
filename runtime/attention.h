// flashjit::Attention: the public C++ API. One object is one kernel signature
// (AttentionSpec::signature: dtype, head dims, mask kind, LSE, layout class) on
// one device, with its kernel generated, compiled (through the kernel cache)
// and loaded at create(); forward() launches it for any shapes of that
// signature: batch, heads, seqlens, strides, window sizes and scale are the
// kernel's arguments, so a new length never compiles.
//
//   auto attn = flashjit::Attention::create(spec, "hip:0");
//   if (!attn) { report(attn.status().message()); ... }
//   Status s = attn->forward(q, k, v, out, lse, stream);          // spec's shapes
//   Status t = attn->forward(other_shapes, q, k, v, out, lse, stream);
//
// create() runs the pipeline of DESIGN.md (runtime/pipeline.h): spec.validate
// -> the device and its arch -> config -> ir::build_attention -> lowering ->
// the device compiler through compiler::KernelCache -> module load.
// It is strict: when no generated kernel can serve the spec on the device,
// create() fails with the reason. Only Options::allow_fallback lets the IR
// interpreter run instead, and explain() then says so and why.
#pragma once

#include "ir/build.h"
#include "ir/spec.h"
#include "ir/status.h"
#include "runtime/device.h"

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace flashjit {

/// A device name: "hip:0", "cuda:1" or "emulator:gfx1201" (see device.h).
/// Parsed by Attention::create(), which reports a malformed one.
class Device {
public:
  Device(const char *id) : id_(id ? id : "") {}
  Device(std::string id) : id_(std::move(id)) {}
  Device(const DeviceInfo &info) : id_(info.id()) {}
  const std::string &id() const { return id_; }

private:
  std::string id_;
};

struct Options {
  /// The device compiler: "auto" (the best one this build and machine have for
  /// the target), or a name compiler::make_compiler knows ("llvm", "hiprtc",
  /// "nvrtc"). On the emulator, "none" skips compiling the AMD code object and
  /// only runs the kernel text (the emulator JIT-compiles it for the host).
  std::string compiler = "auto";
  /// Which lowering rules: "auto" (the family's matrix-instruction rules where
  /// they can lower the spec, else the portable simt rules, with the reason in
  /// explain()), "matrix" (those rules or an error) or "simt".
  std::string rules = "auto";
  /// The tuning config. If unset: the forward kernel's config from the
  /// tuned-config database (`flashjit tune`, <cache dir>/tuned.json) when it has
  /// one for the target and signature (rules "auto", mma_m 0 and `tuned` only),
  /// else lowering::default_config for the spec, target, rules and mma_m.
  std::optional<ir::Config> config;
  /// Whether an unset config may come from the tuned-config database.
  bool tuned = true;
  /// Queries per matrix-instruction tile of the default config: 16, 32 (the CDNA
  /// 32x32 MFMAs) or 0 for the lowering's choice. A given config has its own.
  int64_t mma_m = 0;
  /// Clang -O level and further flags of the device compile (both in the cache key).
  int opt_level = 3;
  std::vector<std::string> extra_flags;
  /// When no generated kernel can serve the spec on the device, run the IR
  /// interpreter on the CPU instead of failing (slow: for coverage and checking,
  /// never for speed). On a GPU the buffers are copied to the host and back.
  bool allow_fallback = false;
  /// forward() waits for the kernel, so errors of its execution surface there.
  bool synchronize = false;
  /// Worker threads of the emulator (0: every core).
  int cpu_threads = 0;
  /// On the emulator, called every 2 s of a kernel's run (from a thread of its
  /// own) with its workgroups done and in all; unset: silent.
  std::function<void(int64_t done, int64_t total)> progress;
};

/// The buffers of one forward() call: device pointers on hip and cuda devices,
/// host pointers on the emulator (see forward()).
struct AttentionTensors {
  const void *q = nullptr, *k = nullptr, *v = nullptr;
  void *out = nullptr;
  float *lse = nullptr; // f32 [batch, heads, seqlen_q] ([heads, total_q] when Q is packed)
  /// The int32 arrays of a spec with Sequences (AttentionSpec::seqs), each
  /// required exactly when the spec says so and null otherwise:
  /// cu_seqlens_q / cu_seqlens_k [batch + 1], seqused_k [batch], block_table
  /// [batch, pages_per_seq]. The kernels never access memory outside the
  /// tensors whatever these hold; on the emulator (host memory) they are checked
  /// first and a bad entry is an error naming it.
  const int32_t *cu_seqlens_q = nullptr, *cu_seqlens_k = nullptr, *seqused_k = nullptr,
                *block_table = nullptr;
  /// ALiBi's slopes, f32 [heads] or [batch, heads] (AttentionSpec::alibi); null otherwise.
  const float *alibi_slopes = nullptr;
  /// Attention sinks' logits, f32 [heads] (AttentionSpec::sinks); null otherwise.
  const float *sinks = nullptr;
  /// The mask tensor (AttentionSpec::mask): elements of its type (bool: 1 byte)
  /// laid out by AttentionSpec::mask_strides, aligned to its element; null otherwise.
  const void *attn_mask = nullptr;
};

/// The buffers of one backward() call, laid out by the shapes' strides like
/// forward()'s: the forward's inputs q, k, v and outputs out and lse (f32
/// [batch, heads, seqlen_q], as forward wrote it), dout (the gradient of out,
/// laid out as out), and the gradients to write: dq as q, dk as k, dv as v.
struct BackwardTensors {
  const void *q = nullptr, *k = nullptr, *v = nullptr, *out = nullptr;
  const float *lse = nullptr;
  const void *dout = nullptr;
  void *dq = nullptr, *dk = nullptr, *dv = nullptr;
  /// ALiBi's slopes as forward took them (AttentionSpec::alibi); null otherwise.
  const float *alibi_slopes = nullptr;
  /// The mask tensor as forward took it (AttentionSpec::mask); null otherwise.
  /// It gets no gradient: an additive mask is a constant of the backward.
  const void *attn_mask = nullptr;
  /// Varlen (packed rows, AttentionSpec::seqs.packed_q / packed_k): the int32
  /// cu_seqlens_q / cu_seqlens_k [batch + 1] forward took, each exactly when the
  /// spec packs that side. lse is then [heads, total_q] as forward wrote it.
  /// Rows past the last sequence belong to none: dq is not written there, dk
  /// and dv get 0. KV-cache sequences (seqused_k, paged) have no backward.
  const int32_t *cu_seqlens_q = nullptr, *cu_seqlens_k = nullptr;
  /// Attention sinks (AttentionSpec::sinks): the forward's f32 logits [heads] in,
  /// their gradient [heads] out (f32; written, not accumulated); null otherwise.
  const float *sinks = nullptr;
  float *dsinks = nullptr;
};

namespace detail {
struct AttentionAccess;
}

/// Thread safety: create() may run on many threads at once (each kernel is
/// compiled once per process, the disk cache is shared by processes). One
/// Attention may run forward() and backward() from several threads at once:
/// workspaces are allocated per call on its stream, kernels built on first use
/// are built once (tests/kernel_cache_test.cpp, AttentionThreads, also under
/// ThreadSanitizer). Destroying or moving it must not race with its calls.
class Attention {
public:
  /// Generates, compiles and loads the kernel for `spec` on `device`.
  static Expected<Attention> create(const AttentionSpec &spec, const Device &device,
                                    const Options &options = {});

  Attention(Attention &&) noexcept;
  Attention &operator=(Attention &&) noexcept;
  ~Attention();

  /// out = softmax(q k^T * scale + mask) v, and lse (f32 [batch, heads,
  /// seqlen_q]) when the spec asks for it (otherwise lse must be null).
  ///
  /// On hip and cuda devices the pointers are device pointers to buffers laid
  /// out by the spec's strides, with 16-bit elements (the spec's dtype); the
  /// kernel is queued on `stream` (a hipStream_t / CUstream; null: the default
  /// stream) and forward() returns without waiting unless Options::synchronize.
  /// On the emulator the pointers are host pointers to the same layout (the
  /// uint16 bits of each bf16 / f16 element), and forward() returns when done.
  /// Every pointer must be aligned as the kernel requires (16 bytes when its
  /// rows allow 128-bit accesses); the error names the pointer otherwise.
  Status forward(const void *q, const void *k, const void *v, void *out, float *lse = nullptr,
                 void *stream = nullptr);
  /// The same for the shapes of `shape` (batch, heads, kv_heads, seqlens,
  /// strides, window sizes, scale), which must have this object's signature
  /// (AttentionSpec::matches says what differs otherwise). Host cost: a few
  /// microseconds; nothing is compiled.
  Status forward(const AttentionSpec &shape, const void *q, const void *k, const void *v, void *out,
                 float *lse = nullptr, void *stream = nullptr);
  /// The general form: any shapes of this signature, with the index arrays of
  /// varlen batches, per-batch key counts and paged KV caches.
  Status forward(const AttentionSpec &shape, const AttentionTensors &tensors,
                 void *stream = nullptr);

  /// The gradients of forward()'s out with respect to q, k and v, given dout:
  /// FlashAttention-2's backward, recomputing the softmax from the LSE. Its
  /// kernels (a preprocess, dQ, dK/dV, and a sum over each group of query heads)
  /// are built on the first call, once per signature. Deterministic: no atomics,
  /// the same bits run to run. Memory as for forward(); on a GPU a
  /// stream-ordered f32 workspace (ir::backward_workspace: 2 values per query
  /// row, dK and dV per query head) is taken and released on `stream`. Score
  /// modifiers (softcap, ALiBi, score_mod, mask_mod) are differentiated through
  /// (ir::score_derivative); varlen (packed rows) is taken, KV-cache sequences
  /// (seqused_k, paged) and sinks are refused by name (ir::validate_backward).
  Status backward(const AttentionSpec &shape, const BackwardTensors &tensors,
                  void *stream = nullptr);

  /// What create() did, one fact per line: spec, device, target, rules, config,
  /// kernel geometry, compiler, cache outcome and key, and which executor runs.
  std::string explain() const;
  /// The generated HIP source (empty when the fallback runs without one).
  const std::string &source() const;
  /// The compiled code object (empty on the emulator with compiler "none" and
  /// when the fallback runs).
  const std::vector<uint8_t> &code_object() const;
  const AttentionSpec &spec() const;
  const DeviceInfo &device() const;
  /// Whether forward() runs the IR interpreter fallback instead of a generated kernel.
  bool uses_fallback() const;

private:
  struct Impl;
  explicit Attention(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
  friend struct detail::AttentionAccess;
};

/// The HIP source flashjit generates for `spec` on an AMD `arch` (e.g. "gfx1201"),
/// with the config of `options` (or the default one); nothing is compiled.
Expected<std::string> emit_source(const AttentionSpec &spec, std::string_view arch,
                                  const Options &options = {});

/// Compiles the kernel for `spec` on `arch` (through the kernel cache) and
/// returns the resource report of its code object as JSON: registers, spills,
/// scratch, LDS, matrix instructions, occupancy (compiler::ResourceReport).
Expected<std::string> compile_report(const AttentionSpec &spec, std::string_view arch,
                                     const Options &options = {});

/// The flashjit version, e.g. "0.1.0".
std::string_view version();

} // namespace flashjit
