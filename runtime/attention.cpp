// Attention: the pipeline of attention.h, and the three executors behind
// forward(): a generated kernel on a GPU, the same kernel on the CPU emulator,
// and (only when asked for) the IR interpreter fallback.
#include "runtime/attention.h"

#include "compiler/code_object.h"
#include "compiler/kernel_cache.h"
#include "compiler/knobs.h"
#include "compiler/select.h"
#include "ir/interpreter.h"
#include "ir/reference.h"
#include "lowering/lower.h"
#include "lowering/resources.h"
#include "runtime/attention_detail.h"
#include "runtime/emulator.h"
#include "runtime/gpu_driver.h"
#include "runtime/kernel_args.h"
#include "runtime/pipeline.h"
#include "templates/templates.h"

#include <fmt/ranges.h>

#include <atomic>
#include <cstring>
#include <functional>
#include <limits>
#include <mutex>
#include <tuple>

#ifndef FLASHJIT_VERSION
#error "FLASHJIT_VERSION must be defined by the build (runtime/CMakeLists.txt)"
#endif

namespace flashjit {

using detail::failed;
using detail::Failure;

namespace {

/// The emulator's options from the Attention's: its threads and progress.
runtime::EmulatorOptions emulator_options(const Options &o) {
  runtime::EmulatorOptions eo;
  eo.threads = o.cpu_threads;
  eo.progress = o.progress;
  return eo;
}

using pipeline::Compiled;
using pipeline::Generated;

enum class Executor { gpu, emulator, interpreter };

std::string short_key(const std::string &key) { return key.substr(0, 16); }

// ---- host copies of strided tensors ----------------------------------------

/// Calls f(offset) for every logical element of a [b, h, n, d] tensor.
template <typename F>
void for_each_element(const Strides &s, int64_t b, int64_t h, int64_t n, int64_t d, F &&f) {
  for (int64_t ib = 0; ib < b; ++ib)
    for (int64_t ih = 0; ih < h; ++ih)
      for (int64_t is = 0; is < n; ++is)
        for (int64_t id = 0; id < d; ++id)
          f(ib * s.batch + ih * s.head + is * s.seq + id * s.dim);
}

struct TensorShape {
  const Strides *strides;
  int64_t batch, heads, seq, dim, extent;
};

/// The logical elements of a buffer of `t` elements as floats at the same
/// offsets; the gaps between rows are NaN (the poison the emulator and the
/// interpreter expect there).
std::vector<float> to_floats(const void *buffer, const AttentionSpec &spec, const TensorShape &s) {
  std::vector<float> out(size_t(s.extent), std::numeric_limits<float>::quiet_NaN());
  const auto *bytes = static_cast<const uint8_t *>(buffer);
  const DType type = spec.io_dtype();
  const int size = dtype_bytes(type);
  for_each_element(*s.strides, s.batch, s.heads, s.seq, s.dim, [&](int64_t i) {
    uint32_t bits = 0;
    std::memcpy(&bits, bytes + i * size, size_t(size)); // little-endian hosts only
    out[size_t(i)] = from_bits(type, bits);
  });
  return out;
}

/// Writes the logical elements back as `t` bits, leaving the gaps untouched.
void from_floats(const std::vector<float> &values, const AttentionSpec &spec, const TensorShape &s,
                 void *buffer) {
  auto *bytes = static_cast<uint8_t *>(buffer);
  const DType type = spec.io_dtype();
  const int size = dtype_bytes(type);
  for_each_element(*s.strides, s.batch, s.heads, s.seq, s.dim, [&](int64_t i) {
    const uint32_t bits = to_bits(type, values[size_t(i)]);
    std::memcpy(bytes + i * size, &bits, size_t(size));
  });
}

struct Shapes {
  TensorShape q, k, v, o;
};
Shapes shapes_of(const AttentionSpec &s) {
  return {{&s.q, s.q_batches(), s.heads, s.q_rows(), s.head_dim_qk, s.q_elements()},
          {&s.k, s.kv_batches(), s.kv_heads, s.kv_rows(), s.head_dim_qk, s.k_elements()},
          {&s.v, s.kv_batches(), s.kv_heads, s.kv_rows(), s.head_dim_v, s.v_elements()},
          {&s.o, s.q_batches(), s.heads, s.q_rows(), s.head_dim_v, s.o_elements()}};
}

/// The index arrays of a spec with Sequences: (name, entries, pointer) of each
/// one the spec uses.
struct IndexArray {
  const char *name;
  int64_t entries;
  const int32_t *pointer;
  std::vector<int32_t> HostTensors::*host;
};
std::vector<IndexArray> index_arrays(const AttentionSpec &s, const AttentionTensors &t) {
  std::vector<IndexArray> out;
  if (s.seqs.packed_q)
    out.push_back({"cu_seqlens_q", s.batch + 1, t.cu_seqlens_q, &HostTensors::cu_seqlens_q});
  if (s.seqs.packed_k)
    out.push_back({"cu_seqlens_k", s.batch + 1, t.cu_seqlens_k, &HostTensors::cu_seqlens_k});
  if (s.seqs.used_k)
    out.push_back({"seqused_k", s.batch, t.seqused_k, &HostTensors::seqused_k});
  if (s.seqs.paged())
    out.push_back(
        {"block_table", s.batch * s.seqs.pages_per_seq, t.block_table, &HostTensors::block_table});
  return out;
}

/// Each index array of `t` given exactly when the spec's sequences need it, int32-aligned.
Status check_index_arrays(const AttentionSpec &shape, const AttentionTensors &t,
                          std::string_view call) {
  const std::vector<IndexArray> wanted = index_arrays(shape, t);
  const std::pair<const char *, const int32_t *> given[] = {{"cu_seqlens_q", t.cu_seqlens_q},
                                                            {"cu_seqlens_k", t.cu_seqlens_k},
                                                            {"seqused_k", t.seqused_k},
                                                            {"block_table", t.block_table}};
  for (const auto &[name, pointer] : given) {
    const bool needed = std::any_of(wanted.begin(), wanted.end(), [&](const IndexArray &a) {
      return std::string_view(a.name) == name;
    });
    if (needed && !pointer)
      return Status::error("{}: {} is null but the spec's sequences need it ({}): pass "
                           "the int32 array",
                           call, name, shape.summary());
    if (!needed && pointer)
      return Status::error("{}: {} is given but the spec does not use it, so it would be "
                           "ignored: pass null, or set the spec's sequences (AttentionSpec::seqs)",
                           call, name);
    if (pointer && reinterpret_cast<uintptr_t>(pointer) % alignof(int32_t) != 0)
      return Status::error("{}: {} ({}) is not aligned to 4 bytes (an int32 array)", call, name,
                           static_cast<const void *>(pointer));
  }
  return Status::ok();
}

/// Host memory (the emulator): every entry of the spec's index arrays checked
/// (check_sequences), before anything runs.
Status check_host_index_arrays(const AttentionSpec &shape, const AttentionTensors &t) {
  if (!shape.seqs.any())
    return Status::ok();
  HostTensors host;
  for (const IndexArray &a : index_arrays(shape, t))
    (host.*a.host).assign(a.pointer, a.pointer + a.entries);
  return check_sequences(shape, host);
}

/// The index arrays of a backward call, as forward's tensors hold them.
AttentionTensors index_view(const BackwardTensors &t) {
  AttentionTensors a;
  a.cu_seqlens_q = t.cu_seqlens_q;
  a.cu_seqlens_k = t.cu_seqlens_k;
  return a;
}

/// The values of ALiBi's slopes a spec reads (0 without ALiBi).
int64_t alibi_slopes(const AttentionSpec &s) {
  return s.alibi == Alibi::none ? 0 : s.alibi == Alibi::heads ? s.heads : s.batch * s.heads;
}

/// The bytes of a spec's mask tensor (0 without one).
size_t mask_bytes(const AttentionSpec &s) {
  return size_t(s.mask_elements()) * size_t(mask_type_bytes(s.mask));
}

/// The mask pointer exactly when the spec has a mask, aligned to its element.
Status check_mask_pointer(const AttentionSpec &s, const void *mask) {
  if ((s.mask != MaskType::none) != (mask != nullptr))
    return Status::error("attn_mask is {} but the spec {}", mask ? "given" : "null",
                         mask ? "has no mask tensor: pass null, or set spec.mask"
                              : fmt::format("has a {} mask tensor: pass its {} elements",
                                            mask_type_name(s.mask), s.mask_elements()));
  if (mask && reinterpret_cast<uintptr_t>(mask) % uintptr_t(mask_type_bytes(s.mask)) != 0)
    return Status::error("attn_mask ({}) is not aligned to its {}-byte elements", mask,
                         mask_type_bytes(s.mask));
  return Status::ok();
}

/// A sinks array (`name`: sinks, or the backward's dsinks) exactly when the spec
/// has attention sinks, aligned to its f32 elements; `what` says what it holds.
Status check_sinks_pointer(const AttentionSpec &s, const void *pointer, std::string_view name,
                           std::string_view what) {
  if (s.sinks != (pointer != nullptr))
    return Status::error("{} is {} but the spec {}", name, pointer ? "given" : "null",
                         pointer
                             ? "has no attention sinks: pass null, or set spec.sinks"
                             : fmt::format("has attention sinks: pass {} f32 {}", s.heads, what));
  if (reinterpret_cast<uintptr_t>(pointer) % alignof(float) != 0)
    return Status::error("{} ({}) is not aligned to 4 bytes", name, pointer);
  return Status::ok();
}

/// A tensor without elements may be null (PyTorch's empty tensors are): the
/// kernels get this stand-in instead, which nothing reads or writes (the
/// emulator reports an access past its 0 bytes as out of bounds).
alignas(256) std::byte empty_tensor[256];

template <class T> void stand_in(T *&pointer, int64_t elements) {
  if (pointer == nullptr && elements == 0)
    pointer = reinterpret_cast<T *>(empty_tensor);
}

/// `t` with a stand-in for each tensor the spec needs that is null and empty.
template <class Tensors> Tensors with_stand_ins(const AttentionSpec &s, Tensors t) {
  stand_in(t.q, s.q_elements());
  stand_in(t.k, s.k_elements());
  stand_in(t.v, s.v_elements());
  stand_in(t.out, s.o_elements());
  if constexpr (std::is_same_v<Tensors, BackwardTensors>) {
    stand_in(t.lse, s.lse_elements());
    stand_in(t.dout, s.o_elements());
    stand_in(t.dq, s.q_elements());
    stand_in(t.dk, s.k_elements());
    stand_in(t.dv, s.v_elements());
  } else {
    if (s.lse)
      stand_in(t.lse, s.lse_elements());
    if (s.seqs.used_k)
      stand_in(t.seqused_k, s.batch);
    if (s.seqs.paged())
      stand_in(t.block_table, s.batch * s.seqs.pages_per_seq);
  }
  if (s.alibi != Alibi::none)
    stand_in(t.alibi_slopes, alibi_slopes(s));
  if (s.mask != MaskType::none)
    stand_in(t.attn_mask, s.mask_elements());
  return t;
}

/// A kernel's workgroup: its work-items and the LDS its launch passes (dynamic
/// LDS, else none: static in the kernel). The grid is the launch's.
runtime::LaunchGeometry workgroup_geometry(const lowering::Lowered &l) {
  runtime::LaunchGeometry geometry;
  geometry.block[0] = l.block_threads;
  geometry.dynamic_lds_bytes = l.lds_dynamic ? l.lds_bytes : 0;
  return geometry;
}

/// Runs `run` over host copies of host buffers.
Status run_on_host(const AttentionSpec &spec, const AttentionTensors &in,
                   const std::function<Status(HostTensors &)> &run) {
  const Shapes sh = shapes_of(spec);
  HostTensors t;
  t.q = to_floats(in.q, spec, sh.q);
  t.k = to_floats(in.k, spec, sh.k);
  t.v = to_floats(in.v, spec, sh.v);
  t.o.assign(size_t(sh.o.extent), std::numeric_limits<float>::quiet_NaN());
  t.lse.assign(spec.lse ? size_t(spec.lse_elements()) : 0, std::numeric_limits<float>::quiet_NaN());
  for (const IndexArray &a : index_arrays(spec, in))
    (t.*a.host).assign(a.pointer, a.pointer + a.entries);
  if (const int64_t n = alibi_slopes(spec))
    t.alibi_slopes.assign(in.alibi_slopes, in.alibi_slopes + n);
  if (spec.sinks)
    t.sinks.assign(in.sinks, in.sinks + spec.heads);
  if (spec.mask != MaskType::none)
    t.attn_mask = mask_values(spec.mask, in.attn_mask, spec.mask_elements());
  FJ_RETURN_IF_ERROR(check_sequences(spec, t).with_context("forward"));
  FJ_RETURN_IF_ERROR(run(t));
  from_floats(t.o, spec, sh.o, in.out);
  if (spec.lse)
    std::memcpy(in.lse, t.lse.data(), t.lse.size() * sizeof(float));
  return Status::ok();
}

} // namespace

// ---- Attention -------------------------------------------------------------

struct Attention::Impl {
  AttentionSpec spec; // as created: its signature is the kernel's, its shapes forward()'s default
  KernelSignature signature;
  DeviceInfo device;
  Options options;
  std::optional<Generated> generated; // absent when generation failed (fallback)
  std::optional<Compiled> compiled;   // absent on the emulator with compiler "none"
  runtime::GpuDriver *driver = nullptr;
  std::unique_ptr<runtime::GpuKernel> kernel;
  /// With a mask tensor on a GPU: the kernel that summarizes it by blocks
  /// (lowering::lower_mask_blocks) before each kernel that reads the summary
  /// (the emulator runs it itself: runtime::emulate_mask_blocks).
  std::optional<Generated> mask_generated;
  std::unique_ptr<runtime::GpuKernel> mask_kernel;
  Executor executor = Executor::emulator;
  std::optional<ir::Program> fallback_program;
  std::string fallback_reason;
  std::string empty;
  std::vector<uint8_t> no_code;
  std::atomic<int64_t> launches{0};

  /// Split-KV attention (flash-decoding): its two kernels, and the decode kernel
  /// (the attention program on the partial kernel's config, writing O itself) for
  /// decode over one split, built on the first decode call (once per signature,
  /// like the attention kernel).
  struct SplitKv {
    Generated partial, combine, direct;
    std::optional<Compiled> partial_code, combine_code, direct_code;
    std::unique_ptr<runtime::GpuKernel> partial_kernel, combine_kernel, direct_kernel;
    /// Partial-kernel workgroups one compute unit holds at once: the driver's
    /// occupancy calculator on a GPU, lowering::resident_per_unit's estimate
    /// elsewhere. choose_splits sizes decode's splits by it.
    int64_t resident = 1;
  };
  mutable std::mutex split_mutex;
  std::unique_ptr<SplitKv> split;
  /// The split-KV kernels of GQA-packed decode (gqa_packed_decode, ir/spec.h):
  /// the signature's with grouped query rows (`grouped_split`); for one token
  /// with a mask tensor, viewed by strides, those of the signature without
  /// causal, which one bottom-right query makes a no-op (`packed_split`; null
  /// while unbuilt, and for a signature without causal: `split` serves).
  std::unique_ptr<SplitKv> packed_split, grouped_split;
  /// Grouped rows of kWideRows or more per KV head (16 tokens of 8:1 GQA) where
  /// the rules have a producer config of two consumer warpgroups (sm_90:
  /// pipeline::wide_grouped_config): their own split and decode kernels, 128
  /// rows a workgroup with a producer warpgroup copying K and V by TMA. Null
  /// while unbuilt; `wide_failure` says why they cannot be built (those calls
  /// then take grouped_split).
  std::unique_ptr<SplitKv> wide_split;
  std::string wide_failure;
  /// Calls with at least kWideRows grouped rows per KV head and kWideKeys keys
  /// over all (batch, KV head) pairs take them. H200, 16 tokens of 8:1 GQA,
  /// against grouped_split's one warpgroup of 64 rows (bench/results/README.md,
  /// session 32): B=32, 32768 keys, head dim 128 187.6 -> 149.9 us, 80 168.8 ->
  /// 115.3, 96 177.7 -> 126.0, 256 363.6 -> 284.5; B=128, 131072 keys, 128
  /// 3221.9 -> 2022.1 (bench_decode.py). Fewer keys gain nothing (B=1 or 8 at
  /// 32768 or 4096 keys: within 0.5 us) or lose: B=1, 4096 keys 19.0 -> 29.3.
  static constexpr int64_t kWideRows = 128, kWideKeys = 32768;
  /// Which split-KV kernels a call takes: the signature's, or GQA-packed
  /// decode's by strides (one token, a mask tensor), as grouped rows, or as
  /// many grouped rows (wide_split).
  enum class SplitSet { plain, packed, grouped, wide };
  static SplitSet split_set(const std::optional<AttentionSpec> &packed) {
    if (!packed)
      return SplitSet::plain;
    if (packed->q_group == 1)
      return SplitSet::packed;
    const bool wide = packed->seqlen_q >= kWideRows &&
                      packed->batch * packed->heads * packed->seqlen_k >= kWideKeys;
    return wide ? SplitSet::wide : SplitSet::grouped;
  }
  /// Whether a set's kernels take grouped rows (their own query blocks).
  static bool grouped_rows(SplitSet set) {
    return set == SplitSet::grouped || set == SplitSet::wide;
  }

  /// The backward pass's kernels, pipeline::KernelKind's backward_* in that
  /// order, each built on the first backward() call that runs it: the dK/dV
  /// kernel that writes dK and dV itself, or the f32 one and the reduce
  /// (ir::backward_dkdv_direct), and the sinks' gradient only with sinks.
  struct Backward {
    static constexpr int kKernels = 6;
    static_assert(int(pipeline::KernelKind::backward_sinks) -
                          int(pipeline::KernelKind::backward_preprocess) + 1 ==
                      kKernels,
                  "the backward's kernel kinds are consecutive, from the preprocess to the sinks");
    static int index(pipeline::KernelKind kind) {
      return int(kind) - int(pipeline::KernelKind::backward_preprocess);
    }
    Generated generated[kKernels];
    std::optional<Compiled> code[kKernels];
    std::unique_ptr<runtime::GpuKernel> kernel[kKernels];
    bool built[kKernels] = {};
  };
  mutable std::mutex backward_mutex;
  std::unique_ptr<Backward> backward_plan;
  /// Backward calls that wrote dK and dV directly, and that summed per-head f32
  /// results (ir::backward_dkdv_direct), for explain().
  std::atomic<int64_t> backward_direct{0}, backward_grouped{0};
  Expected<const Backward *> backward_kernels(const AttentionSpec &shape, Failure *failure);
  Status check_backward(const AttentionSpec &shape, const BackwardTensors &t) const;
  Status run_backward(const Backward &b, const AttentionSpec &shape, const BackwardTensors &t,
                      void *stream);
  std::string split_failure; // why split-KV could not be built, if it was tried and failed
  std::atomic<int64_t> split_launches{0};
  std::atomic<int64_t> decode_launches{0};  // one split: the decode kernel alone
  std::atomic<int64_t> packed_launches{0};  // of those two, the GQA-packed calls
  std::atomic<int64_t> grouped_launches{0}; // of those, the ones as grouped rows
  std::atomic<int64_t> wide_launches{0};    // of those, the ones through wide_split
  std::atomic<int64_t> last_splits{0};      // the latest split call's number of splits

  /// Generation, compile and module load; the first failure with its stage.
  Status build(Failure *failure);
  /// The number of KV splits of a call, 0 for the attention kernel alone; 1 is
  /// the decode kernel (SplitKv::direct). num_splits n > 1 asks for n, 1 for
  /// none (decode then runs one split where it would choose one). Chosen (0):
  /// decode (at most kDecodeRows queries, or GQA-packed) takes as many splits
  /// as the device holds at once (compute units x SplitKv::resident workgroups
  /// over batch x heads), down to one KV block per split, at most
  /// kMaxChosenSplits; a prefill whose
  /// batch x heads x query blocks cannot fill the compute units takes about four
  /// workgroups per compute unit, with at least 4 KV blocks per split, at most
  /// kMaxSplits. The comments in the body say when one split runs, and why.
  /// Measured on the H100 and the H200: bench/results/README.md. Decode builds
  /// the split kernels (split_kv) to learn their occupancy; where they cannot be
  /// built the call runs unsplit (explain() says why).
  int64_t choose_splits(const AttentionSpec &shape, SplitSet set = SplitSet::plain);
  static constexpr int64_t kDecodeRows = 16;
  /// Grouped rows per KV head from which a split takes at least four KV blocks.
  static constexpr int64_t kManyRows = 64;
  /// The split-KV and decode kernels of `set`, built (thread-safely) on first use.
  Expected<const SplitKv *> split_kv(Failure *failure, SplitSet set = SplitSet::plain);
  /// `dependent_combine`: launch the combine as the split kernel's dependent
  /// (LaunchGeometry::after_previous), as for decode of one query token.
  Status run_split_gpu(const SplitKv &k, const AttentionSpec &shape, int64_t splits,
                       const AttentionTensors &t, void *stream, bool dependent_combine);
  Status prepare_fallback(const Status &why);
  Status check_arguments(const AttentionSpec &shape, const AttentionTensors &t) const;
  /// On a GPU: every buffer reachable by the device and as long as the shapes
  /// need, and the stream the device's (where the driver can tell).
  Status check_device_buffers(const AttentionSpec &shape, const AttentionTensors &t,
                              void *stream) const;
  /// One kernel launch: the grid from `shapes` (within CUDA's y/z limits), the
  /// arguments from `shapes` and `pointers`, and where the kernel takes its
  /// tiles from a counter (Lowered::tile_counter), a zeroed workspace for it.
  /// `after_previous`: the launch directly follows another kernel of this call
  /// on `stream`, so on sm_90 it may be a dependent launch (LaunchGeometry).
  Status launch(const lowering::Lowered &l, runtime::GpuKernel &k, const ir::Bindings &shapes,
                std::span<const runtime::NamedPointer> pointers, void *stream,
                bool after_previous = false);
  /// Runs `use` on `bytes` of stream-ordered device memory, released in stream
  /// order after the work `use` queued (`what` names it in errors).
  Status with_workspace(int64_t bytes, void *stream, std::string_view what,
                        const std::function<Status(void *)> &use);
  /// launch()'s last step: the argument list, then the launch of `geometry`.
  Status launch_args(const lowering::Lowered &l, runtime::GpuKernel &k,
                     const runtime::LaunchGeometry &geometry, const ir::Bindings &shapes,
                     std::span<const runtime::NamedPointer> pointers, void *stream);
  Status run_gpu(const AttentionSpec &shape, const AttentionTensors &t, void *stream);
  /// A launch of an attention program (the attention or the decode kernel) over
  /// the caller's tensors, synchronized where Options::synchronize asks.
  Status run_attention_program(const lowering::Lowered &l, runtime::GpuKernel &k,
                               const AttentionSpec &shape, const AttentionTensors &t, void *stream);
  /// launch() of a kernel of `shape`'s plan: where it reads a mask tensor's block
  /// summary (Lowered::mask_blocks), the summary kernel runs first over the
  /// "attn_mask" of `pointers`, into a stream-ordered workspace released after
  /// `l`'s launch.
  Status launch_reading_mask(const lowering::Lowered &l, runtime::GpuKernel &k,
                             const ir::Bindings &shapes,
                             std::span<const runtime::NamedPointer> pointers,
                             const AttentionSpec &shape, void *stream);
  Status run_emulator(const AttentionSpec &shape, const AttentionTensors &t);
  Status run_interpreter(const AttentionSpec &shape, const AttentionTensors &t, void *stream);
  std::string kernel_name() const {
    return generated ? generated->lowered.kernel_name : fallback_program->name;
  }
};

Status Attention::Impl::build(Failure *failure) {
  auto g = pipeline::generate(spec, device.arch, options, failure);
  if (!g)
    return g.status().with_context(fmt::format("no generated kernel for {} on {} ({})",
                                               spec.summary(), device.id(), device.arch));
  generated = g.take();
  const Generated &gen = *generated;
  const bool emulator = device.kind == DeviceKind::emulator;
  if (options.compiler == "none" && !emulator)
    return failed(failure, Failure::argument,
                  Status::error("compiler 'none' only serves the emulator: {} needs a code object; "
                                "use \"auto\"",
                                device.id()));
  // A mask tensor on a GPU: its summary kernel, compiled beside the attention kernel.
  if (spec.mask != MaskType::none && !emulator) {
    auto m =
        pipeline::generate(spec, device.arch, options, failure, pipeline::KernelKind::mask_blocks);
    if (!m)
      return m.status();
    mask_generated = m.take();
  }
  std::optional<Compiled> mask_code;
  if (options.compiler != "none") {
    std::vector<const Generated *> plan = {&gen};
    if (mask_generated)
      plan.push_back(&*mask_generated);
    auto c = pipeline::compile_all(plan, options, compiler::KernelCache::global(), failure);
    if (!c)
      return c.status();
    compiled = std::move((*c)[0]);
    if (mask_generated)
      mask_code = std::move((*c)[1]);
  }
  if (emulator) {
    // FLASHJIT_OVERRIDE_DIR: the emulator runs the override's kernel text.
    auto emulated = pipeline::emulated_kernel(gen);
    if (!emulated)
      return failed(failure, Failure::compile, emulated.status());
    generated->lowered = emulated.take();
    executor = Executor::emulator;
    return Status::ok();
  }
  auto k = driver->load_kernel(device.index, compiled->code.bytes, gen.lowered.kernel_name);
  if (!k)
    return failed(failure, Failure::runtime,
                  k.status().with_context(
                      fmt::format("loading {} on {}", gen.lowered.kernel_name, device.id())));
  kernel = k.take();
  if (mask_generated) {
    auto mk = driver->load_kernel(device.index, mask_code->code.bytes,
                                  mask_generated->lowered.kernel_name);
    if (!mk)
      return failed(failure, Failure::runtime,
                    mk.status().with_context(fmt::format(
                        "loading {} on {}", mask_generated->lowered.kernel_name, device.id())));
    mask_kernel = mk.take();
  }
  executor = Executor::gpu;
  return Status::ok();
}

Status Attention::Impl::launch_reading_mask(const lowering::Lowered &l, runtime::GpuKernel &k,
                                            const ir::Bindings &shapes,
                                            std::span<const runtime::NamedPointer> pointers,
                                            const AttentionSpec &shape, void *stream) {
  if (l.mask_blocks.block_q == 0)
    return launch(l, k, shapes, pointers, stream);
  if (!mask_kernel)
    return Status::error("{} reads a mask tensor's block summary, but this handle has no summary "
                         "kernel (its spec has no mask tensor)",
                         l.kernel_name);
  const void *mask = nullptr;
  for (const runtime::NamedPointer &p : pointers)
    mask = p.name == "attn_mask" ? p.pointer : mask;
  const int64_t bytes = lowering::mask_blocks_bytes(shape, l.mask_blocks);
  return with_workspace(bytes, stream, "the mask's block summary", [&](void *blocks) {
    if (bytes > 0) {
      const runtime::NamedPointer summary[] = {{"attn_mask", mask}, {"attn_mask_blocks", blocks}};
      FJ_RETURN_IF_ERROR(launch(mask_generated->lowered, *mask_kernel,
                                lowering::bind_mask_blocks(shape, l.mask_blocks), summary, stream));
    }
    std::vector<runtime::NamedPointer> all(pointers.begin(), pointers.end());
    all.push_back({"attn_mask_blocks", blocks});
    return launch(l, k, shapes, all, stream);
  });
}

Status Attention::Impl::with_workspace(int64_t bytes, void *stream, std::string_view what,
                                       const std::function<Status(void *)> &use) {
  auto buffer = driver->allocate_async(device.index, size_t(std::max<int64_t>(bytes, 1)), stream);
  if (!buffer)
    return buffer.status().with_context(
        fmt::format("{} of {} bytes on {}", what, bytes, device.id()));
  Status s = use(*buffer);
  // Released in stream order: after the kernels `use` queued have read it.
  Status released = driver->release_async(device.index, *buffer, stream);
  return s ? released : s;
}

int64_t Attention::Impl::choose_splits(const AttentionSpec &shape, SplitSet set) {
  const bool packed = set != SplitSet::plain;
  // Packed queries have no split kernels (ir::build_split_kv says why).
  if (executor == Executor::interpreter || shape.seqs.packed_q)
    return 0;
  if (shape.seqlen_k == 0)
    return 0; // no keys to split: the attention kernel writes O = 0, LSE -inf
  if (shape.num_splits > 1)
    return shape.num_splits;
  // With attention sinks the decode kernel, like the splits, is built without
  // them: one split chosen runs the split kernels over one split (the combine
  // counts the sink); num_splits 1 (no workspace) the attention kernel, which
  // counts it itself.
  if (shape.sinks) {
    if (shape.num_splits == 1)
      return 0;
    AttentionSpec plain = shape;
    plain.sinks = false;
    return choose_splits(plain, set);
  }
  const ir::Config &c = generated->config;
  const bool decode = packed || shape.seqlen_q <= kDecodeRows;
  const int64_t units = std::max(device.compute_units, 1);
  auto work = [&](int64_t rows) {
    return shape.batch * shape.heads * ((shape.seqlen_q + rows - 1) / rows);
  };
  if (decode) {
    auto sk = split_kv(nullptr, set);
    if (!sk)
      return 0; // explain() says why (split_failure)
    // The split kernel's query blocks: kDecodeRows rows, or grouped rows' own.
    const int64_t blocks = work(grouped_rows(set) ? (*sk)->partial.config.block_m : kDecodeRows);
    // Decode's split kernel is one wave (four for grouped rows), and its KV loop
    // is latency bound: as many splits as the device holds at once, down to one KV block
    // each, past kMaxSplits. One round, because a second one that is only
    // partly full is a tail at a fraction of the bandwidth: on the H200
    // (bench/results/README.md) B=32 Hq:Hkv 32:8 D=128 with 32768 keys took
    // 1402 us over 3 splits (768 workgroups where 660 are resident), 1055 over
    // 2 (one round) and 1073 over 5 (two full rounds); B=8 took 279-284 us
    // over 8 or 10 splits and 303 over 9. B=1 8:1 took 11.3 us at 4096 keys
    // with one block per split against 19.0 with four. A call whose rows alone
    // fill the device runs one split when the attention kernel's block is 128
    // or more rows (2.6x faster at D = 64), else the attention kernel (up to
    // 1.2x faster at D = 128: 4 waves against 1); GQA-packed rows are only the
    // split kernels'.
    // num_splits 1 splits no keys: one split is the decode kernel alone, which
    // writes O itself (no workspace: CUDA graphs capture it), where the
    // attention kernel is slower (the same rule as above).
    // Down to one of the split kernel's own KV blocks (its config is not the
    // attention kernel's: 64 keys at head dim 128 on sm_90, against 128), but
    // past 256 splits at least two blocks each. H100, B=1 8:1 D=128 (session
    // 26, bench/results/README.md): 4096 keys 9.0 us over 64 splits of one
    // block, 10.9 over 32 of two; 16384 keys 11.7 over 256 of one, 12.8-13.2
    // over 128 of two; 32768 keys 16.6-16.9 over 256 of two, 18.2 over 512 of
    // one (each split's fixed cost and the combine's reads of every split).
    // Grouped rows of 64 or more per KV head (16 tokens of 32:8 GQA, 8 of 8:1)
    // make each split's fixed cost large (its query block, and its partial rows,
    // which the combine reads back): at least four blocks each, unless that
    // leaves fewer workgroups than half the compute units. H200, 16 tokens
    // (bench/results/README.md, session 32): B=1, 4096 keys, 32:8, D=64 16.6 us
    // over 32 splits of one block, 12.0 over 8 of four; B=8, 4096 keys, 8:1,
    // D=64 16.9 over 24, 13.2 over 8; B=1, 32768 keys, 8:1, D=128 24.9 over 132
    // of two, 21.4 over 64 of four; but B=1, 4096 keys, 8:1, D=64 (two query
    // blocks) 12.5 over 32 of one, 16.0 over 8 of four.
    const bool many_rows = grouped_rows(set) && shape.seqlen_q >= kManyRows;
    const int64_t split_blocks =
        (shape.seqlen_k + (*sk)->partial.config.block_n - 1) / (*sk)->partial.config.block_n;
    const int64_t half_filled = (units + 2 * blocks - 1) / (2 * blocks);
    const int64_t split_cap =
        many_rows ? std::max(split_blocks / 4, std::min(split_blocks, half_filled)) : split_blocks;
    const int64_t most = std::min({std::max<int64_t>(split_cap, 1),
                                   std::max<int64_t>(256, split_blocks / 2), kMaxChosenSplits});
    const int64_t slots = units * (*sk)->resident;
    const int64_t splits = shape.num_splits == 1 ? 1 : std::clamp<int64_t>(slots / blocks, 1, most);
    return splits > 1 || packed || c.block_m >= 128 ? splits : 0;
  }
  // A prefill that fills the device splits nothing.
  const int64_t blocks = work(c.block_m);
  if (shape.num_splits == 1 || blocks >= units)
    return 0;
  const int64_t kv_blocks = (shape.seqlen_k + c.block_n - 1) / c.block_n;
  const int64_t wanted = (4 * units + blocks - 1) / blocks;
  const int64_t splits = std::max<int64_t>(1, std::min({wanted, kv_blocks / 4, kMaxSplits}));
  return splits > 1 ? splits : 0;
}

Expected<const Attention::Impl::SplitKv *> Attention::Impl::split_kv(Failure *failure,
                                                                     SplitSet set) {
  std::lock_guard<std::mutex> lock(split_mutex);
  if (set == SplitSet::packed && !spec.causal) // without causal, the packed kernels are the same
    set = SplitSet::plain;
  std::unique_ptr<SplitKv> &slot = set == SplitSet::grouped  ? grouped_split
                                   : set == SplitSet::wide   ? wide_split
                                   : set == SplitSet::packed ? packed_split
                                                             : split;
  if (slot)
    return slot.get();
  if (set == SplitSet::wide && !wide_failure.empty())
    return Status::error("{}", wide_failure);
  AttentionSpec kernel_spec = spec;
  if (set == SplitSet::packed)
    kernel_spec.causal = false;
  if (grouped_rows(set)) {
    // The signature with grouped query rows (gqa_packed_decode's view), as a
    // spec of one head and one position of two rows, whose strides are valid
    // whatever this handle's shapes: the group and the heads are a call's
    // (the handle may have been made by a call without GQA), and the kernels
    // take them per call. The group stride is the head stride, as in the view.
    kernel_spec.heads = kernel_spec.kv_heads = 1;
    kernel_spec.seqlen_q = kernel_spec.q_group = 2;
    kernel_spec.q.group = spec.q.head;
    kernel_spec.o.group = spec.o.head;
  }
  Options kernel_options = options;
  if (set == SplitSet::wide) {
    kernel_options.config = pipeline::wide_grouped_config(kernel_spec, device.arch, options);
    if (!kernel_options.config) {
      wide_failure = fmt::format("{} has no producer config of two consumer warpgroups for "
                                 "{} (or a config was given)",
                                 device.arch, kernel_spec.signature().summary());
      return Status::error("{}", wide_failure);
    }
  }
  auto built = [&]() -> Expected<std::unique_ptr<SplitKv>> {
    auto made = std::make_unique<SplitKv>();
    struct Slot {
      pipeline::KernelKind kind;
      Generated *generated;
      std::optional<Compiled> *code;
      std::unique_ptr<runtime::GpuKernel> *kernel;
    };
    const Slot slots[] = {
        {pipeline::KernelKind::split_partial, &made->partial, &made->partial_code,
         &made->partial_kernel},
        {pipeline::KernelKind::split_combine, &made->combine, &made->combine_code,
         &made->combine_kernel},
        {pipeline::KernelKind::decode, &made->direct, &made->direct_code, &made->direct_kernel}};
    // Attention sinks are the combine's: the splits count none (each would count
    // the sink), nor does the decode kernel, which no call with sinks runs.
    AttentionSpec no_sinks = kernel_spec;
    no_sinks.sinks = false;
    const Generated *all[std::size(slots)];
    for (size_t i = 0; i < std::size(slots); ++i) {
      const bool combine = slots[i].kind == pipeline::KernelKind::split_combine;
      auto gen = pipeline::generate(combine ? kernel_spec : no_sinks, device.arch, kernel_options,
                                    failure, slots[i].kind);
      if (!gen)
        return gen.status();
      *slots[i].generated = gen.take();
      all[i] = slots[i].generated;
    }
    if (options.compiler != "none") {
      auto compiled = pipeline::compile_all(all, options, compiler::KernelCache::global(), failure);
      if (!compiled)
        return compiled.status();
      for (size_t i = 0; i < std::size(slots); ++i)
        *slots[i].code = std::move((*compiled)[i]);
    }
    for (const Slot &slot : slots) {
      Generated &g = *slot.generated;
      if (executor == Executor::emulator) { // FLASHJIT_OVERRIDE_DIR, as for the attention kernel
        auto emulated = pipeline::emulated_kernel(g);
        if (!emulated)
          return failed(failure, Failure::compile, emulated.status());
        g.lowered = emulated.take();
      }
      if (executor == Executor::gpu) {
        auto loaded =
            driver->load_kernel(device.index, (*slot.code)->code.bytes, g.lowered.kernel_name);
        if (!loaded)
          return failed(failure, Failure::runtime, loaded.status());
        *slot.kernel = loaded.take();
      }
    }
    const lowering::Lowered &partial = made->partial.lowered;
    if (executor == Executor::gpu) {
      auto resident = made->partial_kernel->resident_per_unit(workgroup_geometry(partial));
      if (!resident)
        return failed(failure, Failure::runtime, resident.status());
      made->resident = std::max(*resident, 1);
    } else {
      made->resident = lowering::resident_per_unit(partial, made->partial.target);
    }
    return made;
  }();
  if (!built) {
    (set == SplitSet::wide ? wide_failure : split_failure) = built.status().message();
    return built.status().with_context("split-KV kernels");
  }
  slot = built.take();
  split_failure.clear();
  return slot.get();
}

Status Attention::Impl::run_split_gpu(const SplitKv &sk, const AttentionSpec &shape, int64_t splits,
                                      const AttentionTensors &t, void *stream,
                                      bool dependent_combine) {
  const ir::SplitWorkspace ws = ir::split_workspace(shape, splits);
  FJ_RETURN_IF_ERROR(with_workspace(ws.bytes(), stream, "split-KV workspace", [&](void *w) {
    float *o_partial = static_cast<float *>(w);
    float *lse_partial = o_partial + ws.o_elements;
    const runtime::NamedPointer first[] = {{"Q", t.q},
                                           {"K", t.k},
                                           {"V", t.v},
                                           {"O", o_partial},
                                           {"LSE", lse_partial},
                                           {"cu_seqlens_k", t.cu_seqlens_k},
                                           {"seqused_k", t.seqused_k},
                                           {"block_table", t.block_table},
                                           {"alibi_slopes", t.alibi_slopes},
                                           {"attn_mask", t.attn_mask}};
    const runtime::NamedPointer second[] = {{"O_partial", o_partial},
                                            {"LSE_partial", lse_partial},
                                            {"O", t.out},
                                            {"LSE", t.lse},
                                            {"sinks", t.sinks}};
    FJ_RETURN_IF_ERROR(launch_reading_mask(sk.partial.lowered, *sk.partial_kernel,
                                           ir::bind_split_kv(shape, splits), first, shape, stream));
    // The combine follows the split kernel on the stream (unless the mask
    // summary's workspace was released between them).
    return launch(sk.combine.lowered, *sk.combine_kernel,
                  lowering::bind_split_combine(shape, splits), second, stream,
                  dependent_combine && sk.partial.lowered.mask_blocks.block_q == 0);
  }));
  if (options.synchronize)
    FJ_RETURN_IF_ERROR(driver->synchronize(device.index, stream)
                           .with_context(fmt::format("running split-KV {} on {}",
                                                     sk.partial.lowered.kernel_name, device.id())));
  return Status::ok();
}

Status Attention::Impl::prepare_fallback(const Status &why) {
  const ir::Config config = generated ? generated->config : options.config.value_or(ir::Config{});
  auto program = ir::build_attention(spec, config);
  if (!program)
    return Status::error("{}; the IR interpreter fallback cannot run it either: {}", why.message(),
                         program.status().message());
  fallback_program = program.take();
  fallback_reason = why.message();
  kernel.reset();
  executor = Executor::interpreter;
  return Status::ok();
}

Status Attention::Impl::check_arguments(const AttentionSpec &shape,
                                        const AttentionTensors &t) const {
  const void *q = t.q, *k = t.k, *v = t.v, *out = t.out;
  const float *lse = t.lse;
  const bool generated_kernel = executor != Executor::interpreter;
  const int align =
      generated_kernel ? generated->lowered.pointer_alignment : dtype_bytes(spec.io_dtype());
  const struct {
    const char *name;
    const void *pointer;
    int alignment;
  } args[] = {{"q", q, align},
              {"k", k, align},
              {"v", v, align},
              {"out", out, align},
              {"lse", lse, int(sizeof(float))}};
  if (spec.lse && lse == nullptr)
    return Status::error("forward: lse is null but the spec asks for the LSE (lse = true): pass "
                         "a float buffer of batch*heads*seqlen_q = {} elements",
                         shape.lse_elements());
  if (!spec.lse && lse != nullptr)
    return Status::error("forward: lse is given but the spec has lse = false, so nothing would be "
                         "written to it: pass null, or create the Attention with lse = true");
  for (const auto &a : args) {
    if (a.pointer == nullptr) {
      if (std::string_view(a.name) == "lse")
        continue;
      return Status::error("forward: {} is null", a.name);
    }
    if (reinterpret_cast<uintptr_t>(a.pointer) % uintptr_t(a.alignment) != 0)
      return Status::error(
          "forward: {} ({}) is not aligned to {} bytes, which {} requires{}", a.name, a.pointer,
          a.alignment,
          generated_kernel ? "kernel " + generated->lowered.kernel_name : "the fallback",
          a.alignment >= 16 && std::string_view(a.name) != "lse"
              ? " (its rows allow 128-bit loads and stores, so every tensor pointer must be too)"
              : "");
  }
  if ((alibi_slopes(shape) > 0) != (t.alibi_slopes != nullptr))
    return Status::error(
        "forward: alibi_slopes is {} but the spec {}", t.alibi_slopes ? "given" : "null",
        t.alibi_slopes ? "has no ALiBi: pass null, or set spec.alibi"
                       : fmt::format("has ALiBi: pass {} f32 slopes", alibi_slopes(shape)));
  FJ_RETURN_IF_ERROR(
      check_sinks_pointer(shape, t.sinks, "sinks", "logits").with_context("forward"));
  if (t.alibi_slopes && reinterpret_cast<uintptr_t>(t.alibi_slopes) % alignof(float) != 0)
    return Status::error("forward: alibi_slopes ({}) is not aligned to 4 bytes",
                         static_cast<const void *>(t.alibi_slopes));
  FJ_RETURN_IF_ERROR(check_mask_pointer(shape, t.attn_mask).with_context("forward"));
  return check_index_arrays(shape, t, "forward");
}

namespace {

/// The backward kernels a call runs, in launch order but the reduce (last).
std::vector<pipeline::KernelKind> backward_kinds(const AttentionSpec &shape) {
  using pipeline::KernelKind;
  std::vector<KernelKind> kinds = {KernelKind::backward_preprocess, KernelKind::backward_dq};
  if (ir::backward_dkdv_direct(shape)) {
    kinds.push_back(KernelKind::backward_dkdv_direct);
  } else {
    kinds.push_back(KernelKind::backward_dkdv);
    kinds.push_back(KernelKind::backward_reduce);
  }
  if (shape.sinks)
    kinds.push_back(KernelKind::backward_sinks);
  return kinds;
}

} // namespace

Expected<const Attention::Impl::Backward *>
Attention::Impl::backward_kernels(const AttentionSpec &shape, Failure *failure) {
  std::lock_guard<std::mutex> lock(backward_mutex);
  if (executor == Executor::interpreter)
    return failed(failure, Failure::unsupported,
                  Status::error("backward: this handle runs the IR interpreter fallback ({}), "
                                "which has no backward; create it where its kernel generates",
                                fallback_reason));
  if (!backward_plan)
    backward_plan = std::make_unique<Backward>();
  Backward &b = *backward_plan;
  using pipeline::KernelKind;
  std::vector<KernelKind> kinds = backward_kinds(shape);
  std::erase_if(kinds, [&](KernelKind k) { return b.built[Backward::index(k)]; });
  if (kinds.empty())
    return backward_plan.get();
  // Generated and compiled together (compile_all runs them in parallel);
  // nothing is kept unless all of them load.
  std::vector<Generated> made;
  for (KernelKind kind : kinds) {
    auto g = pipeline::generate(spec, device.arch, options, failure, kind);
    if (!g)
      return g.status().with_context("backward");
    made.push_back(g.take());
  }
  std::vector<std::optional<Compiled>> codes(made.size());
  if (options.compiler != "none") {
    std::vector<const Generated *> generated;
    for (const Generated &g : made)
      generated.push_back(&g);
    auto compiled =
        pipeline::compile_all(generated, options, compiler::KernelCache::global(), failure);
    if (!compiled)
      return compiled.status().with_context("backward");
    for (size_t i = 0; i < made.size(); ++i)
      codes[i] = std::move((*compiled)[i]);
  }
  std::vector<std::unique_ptr<runtime::GpuKernel>> loaded(made.size());
  for (size_t i = 0; i < made.size(); ++i) {
    if (executor == Executor::emulator) { // FLASHJIT_OVERRIDE_DIR, as for the attention kernel
      auto emulated = pipeline::emulated_kernel(made[i]);
      if (!emulated)
        return failed(failure, Failure::compile, emulated.status());
      made[i].lowered = emulated.take();
    } else {
      auto k = driver->load_kernel(device.index, codes[i]->code.bytes, made[i].lowered.kernel_name);
      if (!k)
        return failed(failure, Failure::runtime, k.status().with_context("backward"));
      loaded[i] = k.take();
    }
  }
  for (size_t i = 0; i < made.size(); ++i) {
    const int at = Backward::index(kinds[i]);
    b.generated[at] = std::move(made[i]);
    b.code[at] = std::move(codes[i]);
    b.kernel[at] = std::move(loaded[i]);
    b.built[at] = true;
  }
  return backward_plan.get();
}

Status Attention::Impl::check_backward(const AttentionSpec &shape, const BackwardTensors &t) const {
  const int align = generated->lowered.pointer_alignment;
  const std::pair<const char *, const void *> args[] = {
      {"q", t.q},       {"k", t.k},   {"v", t.v},   {"out", t.out}, {"lse", t.lse},
      {"dout", t.dout}, {"dq", t.dq}, {"dk", t.dk}, {"dv", t.dv}};
  for (const auto &[name, pointer] : args) {
    if (pointer == nullptr)
      return Status::error("backward: {} is null{}", name,
                           std::string_view(name) == "lse"
                               ? ": pass the LSE forward wrote (create the forward with lse = "
                                 "true)"
                               : "");
    const int a = std::string_view(name) == "lse" ? 4 : align;
    if (reinterpret_cast<uintptr_t>(pointer) % uintptr_t(a) != 0)
      return Status::error("backward: {} ({}) is not aligned to {} bytes, which the kernels of "
                           "this signature require",
                           name, pointer, a);
  }
  if ((alibi_slopes(shape) > 0) != (t.alibi_slopes != nullptr))
    return Status::error("backward: alibi_slopes is {} but the spec {}",
                         t.alibi_slopes ? "given" : "null",
                         t.alibi_slopes ? "has no ALiBi: pass null, or set spec.alibi"
                                        : fmt::format("has ALiBi: pass the forward's {} f32 slopes",
                                                      alibi_slopes(shape)));
  FJ_RETURN_IF_ERROR(check_mask_pointer(shape, t.attn_mask).with_context("backward"));
  for (const auto &[name, pointer, what] : {std::tuple<const char *, const void *, const char *>{
                                                "sinks", t.sinks, "logits (the forward's)"},
                                            {"dsinks", t.dsinks, "for their gradient"}}) {
    FJ_RETURN_IF_ERROR(check_sinks_pointer(shape, pointer, name, what).with_context("backward"));
    if (pointer && driver != nullptr)
      FJ_RETURN_IF_ERROR(driver->check_buffer(device.index, pointer, size_t(shape.heads) * 4,
                                              fmt::format("backward: {}", name)));
  }
  const AttentionTensors arrays = index_view(t);
  FJ_RETURN_IF_ERROR(check_index_arrays(shape, arrays, "backward"));
  if (driver == nullptr) // host memory (the emulator)
    return check_host_index_arrays(shape, arrays).with_context("backward");
  for (const IndexArray &a : index_arrays(shape, arrays))
    FJ_RETURN_IF_ERROR(driver->check_buffer(device.index, a.pointer, size_t(a.entries) * 4,
                                            fmt::format("backward: {}", a.name)));
  if (t.alibi_slopes)
    FJ_RETURN_IF_ERROR(driver->check_buffer(
        device.index, t.alibi_slopes, size_t(alibi_slopes(shape)) * 4, "backward: alibi_slopes"));
  if (t.attn_mask)
    FJ_RETURN_IF_ERROR(
        driver->check_buffer(device.index, t.attn_mask, mask_bytes(shape), "backward: attn_mask"));
  const int64_t e = dtype_bytes(shape.dtype);
  const std::tuple<const char *, const void *, int64_t> buffers[] = {
      {"q", t.q, shape.q_elements() * e},       {"k", t.k, shape.k_elements() * e},
      {"v", t.v, shape.v_elements() * e},       {"out", t.out, shape.o_elements() * e},
      {"lse", t.lse, shape.lse_elements() * 4}, {"dout", t.dout, shape.o_elements() * e},
      {"dq", t.dq, shape.q_elements() * e},     {"dk", t.dk, shape.k_elements() * e},
      {"dv", t.dv, shape.v_elements() * e}};
  for (const auto &[name, pointer, bytes] : buffers)
    FJ_RETURN_IF_ERROR(driver->check_buffer(device.index, pointer, size_t(bytes),
                                            fmt::format("backward: {}", name)));
  return Status::ok();
}

Status Attention::Impl::run_backward(const Backward &b, const AttentionSpec &shape,
                                     const BackwardTensors &t, void *stream) {
  const ir::BackwardWorkspace ws = ir::backward_workspace(shape);
  const ir::Bindings shapes = lowering::bind_backward_kernels(shape);
  const bool gpu = executor == Executor::gpu;
  // The workspace: stream-ordered device memory, or host memory poisoned with
  // NaN on the emulator (every element a kernel reads must have been written).
  // (A call of no query rows may need none: its kernels get the stand-in.)
  std::vector<float> host;
  float *base = reinterpret_cast<float *>(empty_tensor);
  const bool allocated = gpu && ws.elements > 0;
  if (allocated) {
    auto w = driver->allocate_async(device.index, size_t(ws.elements) * 4, stream);
    if (!w)
      return w.status().with_context(
          fmt::format("backward workspace of {} bytes on {}", ws.elements * 4, device.id()));
    base = static_cast<float *>(*w);
  } else if (!gpu && ws.elements > 0) {
    host.assign(size_t(ws.elements), std::numeric_limits<float>::quiet_NaN());
    base = host.data();
  }
  float *l = base, *d = base + ws.d_offset, *dk_heads = base + ws.dk_offset,
        *dv_heads = base + ws.dv_offset;
  const int e = int(dtype_bytes(shape.dtype));
  const int64_t rows = ws.d_offset; // of L and D, one value per query row

  // A kernel argument: its parameter's name, the buffer, its bytes and element size.
  struct Arg {
    std::string_view name;
    const void *pointer;
    int64_t bytes;
    int element;
  };
  const Arg q{"Q", t.q, shape.q_elements() * e, e}, k{"K", t.k, shape.k_elements() * e, e},
      v{"V", t.v, shape.v_elements() * e, e}, dout{"dO", t.dout, shape.o_elements() * e, e},
      l_arg{"L", l, rows * 4, 4}, d_arg{"D", d, rows * 4, 4},
      slopes{"alibi_slopes", t.alibi_slopes, alibi_slopes(shape) * 4, 4},
      mask{"attn_mask", t.attn_mask, int64_t(mask_bytes(shape)), mask_type_bytes(shape.mask)},
      cu_q{"cu_seqlens_q", t.cu_seqlens_q, (shape.batch + 1) * 4, 4},
      cu_k{"cu_seqlens_k", t.cu_seqlens_k, (shape.batch + 1) * 4, 4};
  const int64_t dk_bytes = (ws.dv_offset - ws.dk_offset) * 4,
                dv_bytes = (ws.elements - ws.dv_offset) * 4;
  // dK and dV: the call's own (ir::backward_dkdv_direct), or f32 per query head
  // in the workspace, which the reduce sums into them.
  const bool direct = ir::backward_dkdv_direct(shape);
  const Arg dk{"dK", t.dk, shape.k_elements() * e, e}, dv{"dV", t.dv, shape.v_elements() * e, e};
  using pipeline::KernelKind;
  auto at = Backward::index;
  // Arguments with a null pointer (alibi_slopes without ALiBi) are not the kernel's.
  auto run = [&](KernelKind kind, const std::vector<Arg> &all) -> Status {
    const int i = at(kind);
    std::vector<Arg> args;
    std::copy_if(all.begin(), all.end(), std::back_inserter(args),
                 [](const Arg &a) { return a.pointer != nullptr; });
    const lowering::Lowered &kernel = b.generated[i].lowered;
    if (gpu) {
      std::vector<runtime::NamedPointer> pointers;
      for (const Arg &a : args)
        pointers.push_back({a.name, a.pointer});
      return launch_reading_mask(kernel, *b.kernel[i], shapes, pointers, shape, stream);
    }
    // The emulator checks every access against the buffers; the kernel's
    // parameter types say which it may write.
    std::vector<runtime::EmulatorBuffer> host_buffers;
    for (const Arg &a : args) {
      bool written = false;
      for (const lowering::KernelParam &kp : kernel.params)
        written = written || (kp.name == a.name && !kp.c_type.starts_with("const"));
      host_buffers.push_back(
          {a.name, const_cast<void *>(a.pointer), size_t(a.bytes), a.element, written});
    }
    const runtime::EmulatorOptions eo = emulator_options(options);
    std::vector<uint8_t> blocks; // the mask tensor's block summary, where the kernel reads one
    if (kernel.mask_blocks.block_q > 0) {
      FJ_RETURN_IF_ERROR(runtime::emulate_mask_blocks(
          kernel, b.generated[i].target, shape,
          {mask.name, const_cast<void *>(mask.pointer), size_t(mask.bytes), mask.element, false},
          blocks, eo));
      host_buffers.push_back({"attn_mask_blocks", blocks.data(), blocks.size(), 1, false});
    }
    return runtime::emulate_kernel(kernel, b.generated[i].target, shapes, host_buffers, eo);
  };
  Status s = run(KernelKind::backward_preprocess, {dout,
                                                   {"O", t.out, shape.o_elements() * e, e},
                                                   {"LSE", t.lse, shape.lse_elements() * 4, 4},
                                                   l_arg,
                                                   d_arg});
  // The dQ and dK/dV programs read the same inputs and add the gradients they write.
  auto program = [&](std::initializer_list<Arg> outputs) {
    std::vector<Arg> all = {q, k, v, dout, l_arg, d_arg, slopes, mask, cu_q, cu_k};
    all.insert(all.end(), outputs);
    return all;
  };
  if (s)
    s = run(KernelKind::backward_dq, program({{"dQ", t.dq, shape.q_elements() * e, e}}));
  if (s)
    s = direct ? run(KernelKind::backward_dkdv_direct, program({dk, dv}))
               : run(KernelKind::backward_dkdv,
                     program({{"dK", dk_heads, dk_bytes, 4}, {"dV", dv_heads, dv_bytes, 4}}));
  if (s && shape.sinks)
    s = run(KernelKind::backward_sinks, {l_arg,
                                         d_arg,
                                         {"sinks", t.sinks, shape.heads * 4, 4},
                                         {"dsinks", t.dsinks, shape.heads * 4, 4},
                                         cu_q});
  if (s && !direct)
    s = run(
        KernelKind::backward_reduce,
        {{"dK_heads", dk_heads, dk_bytes, 4}, {"dV_heads", dv_heads, dv_bytes, 4}, cu_k, dk, dv});
  if (allocated) {
    // Released in stream order: after the last kernel above has read it.
    Status released = driver->release_async(device.index, base, stream);
    FJ_RETURN_IF_ERROR(s);
    FJ_RETURN_IF_ERROR(released);
    if (options.synchronize)
      FJ_RETURN_IF_ERROR(driver->synchronize(device.index, stream)
                             .with_context(fmt::format("running the backward on {}", device.id())));
  }
  return s;
}

Status Attention::Impl::check_device_buffers(const AttentionSpec &shape, const AttentionTensors &t,
                                             void *stream) const {
  FJ_RETURN_IF_ERROR(driver->check_stream(device.index, stream).with_context("forward"));
  const int64_t element = dtype_bytes(spec.io_dtype());
  std::vector<std::tuple<const char *, const void *, int64_t>> buffers = {
      {"q", t.q, shape.q_elements() * element},
      {"k", t.k, shape.k_elements() * element},
      {"v", t.v, shape.v_elements() * element},
      {"out", t.out, shape.o_elements() * element}};
  if (t.lse)
    buffers.emplace_back("lse", t.lse, shape.lse_elements() * int64_t(sizeof(float)));
  for (const IndexArray &a : index_arrays(shape, t))
    buffers.emplace_back(a.name, a.pointer, a.entries * int64_t(sizeof(int32_t)));
  if (t.alibi_slopes)
    buffers.emplace_back("alibi_slopes", t.alibi_slopes,
                         alibi_slopes(shape) * int64_t(sizeof(float)));
  if (t.sinks)
    buffers.emplace_back("sinks", t.sinks, shape.heads * int64_t(sizeof(float)));
  if (t.attn_mask)
    buffers.emplace_back("attn_mask", t.attn_mask, int64_t(mask_bytes(shape)));
  for (const auto &[name, pointer, bytes] : buffers)
    FJ_RETURN_IF_ERROR(driver->check_buffer(device.index, pointer, size_t(bytes),
                                            fmt::format("forward: {}", name)));
  return Status::ok();
}

Status Attention::Impl::launch(const lowering::Lowered &l, runtime::GpuKernel &k,
                               const ir::Bindings &shapes,
                               std::span<const runtime::NamedPointer> pointers, void *stream,
                               bool after_previous) {
  auto grid = ir::grid_size(l.grid, shapes);
  if (!grid)
    return grid.status();
  if (l.persistent_blocks > 0) { // the kernel walks the grid's tiles (config persistent)
    const int64_t tiles = (*grid)[0] * (*grid)[1] * (*grid)[2];
    const int64_t resident = int64_t(std::max(device.compute_units, 1)) * l.persistent_blocks;
    *grid = {std::min(tiles, resident), 1, 1};
  }
  if ((*grid)[0] * (*grid)[1] * (*grid)[2] == 0) // nothing to compute (no query rows, or keys)
    return Status::ok();
  // CUDA grids hold at most 65535 workgroups in y (heads) and z (batch).
  constexpr int64_t kCudaGridYZ = 65535;
  if (device.kind == DeviceKind::cuda && ((*grid)[1] > kCudaGridYZ || (*grid)[2] > kCudaGridYZ))
    return Status::error("forward: heads and batch must each be at most {} on CUDA (the grid's y "
                         "and z limits; {} has {} x {}): split the call",
                         kCudaGridYZ, l.kernel_name, (*grid)[1], (*grid)[2]);
  runtime::LaunchGeometry geometry = workgroup_geometry(l);
  std::copy(grid->begin(), grid->end(), geometry.grid);
  if (!l.tile_counter) {
    geometry.after_previous =
        after_previous && l.waits_for_previous && compiler::knobs().dependent_launch;
    return launch_args(l, k, geometry, shapes, pointers, stream);
  }
  // The kernel takes its tiles from a counter (Lowered::tile_counter): a
  // workspace of this launch alone, zeroed in stream order before it.
  return with_workspace(sizeof(uint64_t), stream, "the tile counter", [&](void *counter) {
    FJ_RETURN_IF_ERROR(driver->zero_async(device.index, counter, sizeof(uint64_t), stream));
    std::vector<runtime::NamedPointer> all(pointers.begin(), pointers.end());
    all.push_back({"fj_tile_counter", counter});
    return launch_args(l, k, geometry, shapes, all, stream);
  });
}

Status Attention::Impl::launch_args(const lowering::Lowered &l, runtime::GpuKernel &k,
                                    const runtime::LaunchGeometry &geometry,
                                    const ir::Bindings &shapes,
                                    std::span<const runtime::NamedPointer> pointers, void *stream) {
  auto args = runtime::KernelArgs::make(l.params, shapes, pointers, driver, device.index);
  if (!args)
    return args.status();
  return k.launch(geometry, args->addresses(), stream)
      .with_context(fmt::format("launching {} on {}", l.kernel_name, device.id()));
}

Status Attention::Impl::run_gpu(const AttentionSpec &shape, const AttentionTensors &t,
                                void *stream) {
  return run_attention_program(generated->lowered, *kernel, shape, t, stream);
}

Status Attention::Impl::run_attention_program(const lowering::Lowered &l, runtime::GpuKernel &k,
                                              const AttentionSpec &shape, const AttentionTensors &t,
                                              void *stream) {
  const runtime::NamedPointer pointers[] = {{"Q", t.q},
                                            {"K", t.k},
                                            {"V", t.v},
                                            {"O", t.out},
                                            {"LSE", t.lse},
                                            {"cu_seqlens_q", t.cu_seqlens_q},
                                            {"cu_seqlens_k", t.cu_seqlens_k},
                                            {"seqused_k", t.seqused_k},
                                            {"block_table", t.block_table},
                                            {"alibi_slopes", t.alibi_slopes},
                                            {"sinks", t.sinks},
                                            {"attn_mask", t.attn_mask}};
  FJ_RETURN_IF_ERROR(launch_reading_mask(l, k, ir::bind_attention(shape), pointers, shape, stream));
  if (options.synchronize)
    FJ_RETURN_IF_ERROR(
        driver->synchronize(device.index, stream)
            .with_context(fmt::format("running {} on {}", l.kernel_name, device.id())));
  return Status::ok();
}

Status Attention::Impl::run_emulator(const AttentionSpec &shape, const AttentionTensors &in) {
  const runtime::EmulatorOptions eo = emulator_options(options);
  return run_on_host(shape, in, [&](HostTensors &t) {
    return runtime::emulate(generated->lowered, generated->target, shape, t, eo);
  });
}

Status Attention::Impl::run_interpreter(const AttentionSpec &shape, const AttentionTensors &in,
                                        void *stream) {
  const ir::Bindings shapes = ir::bind_attention(shape);
  auto interpret = [&](HostTensors &t) { return ir::interpret(*fallback_program, shapes, t); };
  if (device.kind == DeviceKind::emulator)
    return run_on_host(shape, in, interpret);

  // A GPU: wait for the stream, copy the buffers to the host, interpret, copy
  // O (with its gaps as they were) and the LSE back.
  const Shapes sh = shapes_of(shape);
  const size_t element = size_t(dtype_bytes(shape.io_dtype()));
  auto fetch = [&](const void *device_pointer, int64_t elements) -> Expected<std::vector<uint8_t>> {
    std::vector<uint8_t> host(size_t(elements) * element);
    FJ_RETURN_IF_ERROR(
        driver->copy_to_host(device.index, host.data(), device_pointer, host.size()));
    return host;
  };
  FJ_RETURN_IF_ERROR(driver->synchronize(device.index, stream));
  auto hq = fetch(in.q, sh.q.extent), hk = fetch(in.k, sh.k.extent), hv = fetch(in.v, sh.v.extent),
       ho = fetch(in.out, sh.o.extent);
  for (auto *h : {&hq, &hk, &hv, &ho})
    if (!*h)
      return h->status();
  std::vector<float> host_lse(shape.lse ? size_t(shape.lse_elements()) : 0);
  AttentionTensors host{hq->data(), hk->data(), hv->data(), ho->data(), host_lse.data()};
  std::vector<std::vector<int32_t>> arrays; // the index arrays' host copies
  for (const IndexArray &a : index_arrays(shape, in)) {
    std::vector<int32_t> &copy = arrays.emplace_back(size_t(a.entries));
    FJ_RETURN_IF_ERROR(
        driver->copy_to_host(device.index, copy.data(), a.pointer, copy.size() * sizeof(int32_t)));
    const std::string_view name = a.name;
    (name == "cu_seqlens_q"   ? host.cu_seqlens_q
     : name == "cu_seqlens_k" ? host.cu_seqlens_k
     : name == "seqused_k"    ? host.seqused_k
                              : host.block_table) = copy.data();
  }
  std::vector<float> slopes(size_t(alibi_slopes(shape)));
  if (!slopes.empty()) {
    FJ_RETURN_IF_ERROR(driver->copy_to_host(device.index, slopes.data(), in.alibi_slopes,
                                            slopes.size() * sizeof(float)));
    host.alibi_slopes = slopes.data();
  }
  std::vector<float> sinks(shape.sinks ? size_t(shape.heads) : 0);
  if (!sinks.empty()) {
    FJ_RETURN_IF_ERROR(
        driver->copy_to_host(device.index, sinks.data(), in.sinks, sinks.size() * sizeof(float)));
    host.sinks = sinks.data();
  }
  std::vector<uint8_t> mask(mask_bytes(shape));
  if (!mask.empty()) {
    FJ_RETURN_IF_ERROR(driver->copy_to_host(device.index, mask.data(), in.attn_mask, mask.size()));
    host.attn_mask = mask.data();
  }
  FJ_RETURN_IF_ERROR(run_on_host(shape, host, interpret));
  FJ_RETURN_IF_ERROR(driver->copy_to_device(device.index, in.out, ho->data(), ho->size()));
  if (shape.lse)
    FJ_RETURN_IF_ERROR(driver->copy_to_device(device.index, in.lse, host_lse.data(),
                                              host_lse.size() * sizeof(float)));
  return Status::ok();
}

Attention::Attention(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Attention::Attention(Attention &&) noexcept = default;
Attention &Attention::operator=(Attention &&) noexcept = default;
Attention::~Attention() = default;

Expected<Attention> Attention::create(const AttentionSpec &spec, const Device &device,
                                      const Options &options) {
  return detail::AttentionAccess::create(spec, device, options, nullptr);
}

Status Attention::forward(const void *q, const void *k, const void *v, void *out, float *lse,
                          void *stream) {
  return detail::AttentionAccess::forward(*this, impl_->spec, {q, k, v, out, lse}, stream, nullptr);
}

Status Attention::forward(const AttentionSpec &shape, const void *q, const void *k, const void *v,
                          void *out, float *lse, void *stream) {
  return detail::AttentionAccess::forward(*this, shape, {q, k, v, out, lse}, stream, nullptr);
}

Status Attention::forward(const AttentionSpec &shape, const AttentionTensors &tensors,
                          void *stream) {
  return detail::AttentionAccess::forward(*this, shape, tensors, stream, nullptr);
}

Status Attention::backward(const AttentionSpec &shape, const BackwardTensors &tensors,
                           void *stream) {
  return detail::AttentionAccess::backward(*this, shape, tensors, stream, nullptr);
}

Status detail::AttentionAccess::backward(Attention &a, const AttentionSpec &shape,
                                         const BackwardTensors &given, void *stream,
                                         Failure *failure) {
  Attention::Impl &m = *a.impl_;
  const BackwardTensors t = with_stand_ins(shape, given);
  if (&shape != &m.spec) {
    if (Status s = shape.validate(); !s)
      return failed(failure, Failure::spec, s.with_context("backward: invalid shapes"));
    if (Status s = shape.matches(m.signature); !s)
      return failed(failure, Failure::argument, s.with_context("backward"));
  }
  if (Status s = ir::validate_backward(shape); !s)
    return failed(failure, Failure::unsupported, s);
  auto plan = m.backward_kernels(shape, failure);
  if (!plan)
    return plan.status();
  if (Status s = m.check_backward(shape, t); !s)
    return failed(failure, Failure::argument, s);
  if (m.driver != nullptr)
    if (Status s = m.driver->check_stream(m.device.index, stream); !s)
      return failed(failure, Failure::argument, s.with_context("backward"));
  for (pipeline::KernelKind kind : backward_kinds(shape)) {
    const Generated &g = (*plan)->generated[Attention::Impl::Backward::index(kind)];
    if (!g.program.body.empty()) // the programs' row strides, as forward checks its own
      if (Status s = lowering::check_launch(g.lowered, shape); !s)
        return failed(failure, Failure::argument, s.with_context("backward"));
  }
  // No query rows and no keys: no gradient has an element. Otherwise the
  // kernels whose grids are empty are skipped, and the others write zeros (dQ
  // without keys, dK/dV without queries).
  if (shape.lse_elements() == 0 && shape.k_elements() == 0 && shape.v_elements() == 0)
    return Status::ok();
  Status s = m.run_backward(**plan, shape, t, stream);
  if (!s)
    return failed(failure, Failure::runtime, s);
  (ir::backward_dkdv_direct(shape) ? m.backward_direct : m.backward_grouped)
      .fetch_add(1, std::memory_order_relaxed);
  return s;
}

std::string Attention::explain() const {
  const Impl &m = *impl_;
  std::string s;
  auto line = [&](std::string_view key, const std::string &value) {
    s += fmt::format("{:<9} {}\n", std::string(key) + ":", value);
  };
  line("spec", m.spec.summary());
  line("device", fmt::format("{} ({})", m.device.id(), m.device.name));
  if (m.generated) {
    const Generated &g = *m.generated;
    const lowering::Lowered &l = g.lowered;
    line("target", fmt::format("{} ({} family, wave{}, {} bytes LDS)", g.target.target_id(),
                               g.target.family_name(), g.target.wave_size, g.target.lds_bytes));
    line("rules", fmt::format("{} ({}){}", l.rules, l.mma ? l.instruction : "no matrix instruction",
                              l.rules_note.empty() ? "" : ": " + l.rules_note));
    line("config", fmt::format("{} ({})", g.config.summary(), g.config_source));
    line("signature", m.signature.summary());
    std::string grid;
    for (const ir::GridAxis &axis : l.grid)
      grid +=
          fmt::format("{}{}", grid.empty() ? "" : " x ",
                      axis.divisor == 1
                          ? ir::to_string(axis.extent)
                          : fmt::format("ceil({} / {})", ir::to_string(axis.extent), axis.divisor));
    if (l.persistent_blocks > 0)
      grid =
          fmt::format("{} tiles walked by min(tiles, {} per SM) persistent workgroups{}", grid,
                      l.persistent_blocks, l.tile_counter ? ", each next tile from a counter" : "");
    line("kernel",
         fmt::format("{}: grid {} (from each call's shapes), {} work-items, {} bytes "
                     "LDS, pointers aligned to {} bytes",
                     l.kernel_name, grid, l.block_threads, l.lds_bytes, l.pointer_alignment));
  }
  if (m.compiled) {
    const Compiled &c = *m.compiled;
    line("compiler",
         fmt::format("{} ({}){}", c.compiler, c.options_text,
                     c.override_path.empty() ? "" : ", source from " + c.override_path));
    line("cache", fmt::format("{} (key {}, {} bytes, {:.3f} s)", c.cache_outcome,
                              short_key(c.cache_key), c.code.bytes.size(), c.seconds));
  } else if (m.generated && m.executor == Executor::emulator) {
    line("compiler", "none (compiler \"none\": the emulator JIT-compiles the kernel text for "
                     "the host)");
    line("cache", "not used (no code object)");
  }
  {
    const int64_t calls = m.launches.load();
    const int64_t decode = m.split_launches.load() + m.decode_launches.load();
    line("launches", decode == 0 ? fmt::format("{} forward calls, all through this one kernel "
                                               "(shapes are its arguments)",
                                               calls)
                                 : fmt::format("{} forward calls: {} through this one kernel, {} "
                                               "through the split-KV or decode kernels below "
                                               "(shapes are their arguments)",
                                               calls, calls - decode, decode));
  }
  {
    std::lock_guard<std::mutex> lock(m.split_mutex);
    const Impl::SplitKv *shown = m.split          ? m.split.get()
                                 : m.packed_split ? m.packed_split.get()
                                                  : m.grouped_split.get();
    if (shown)
      line("split-kv",
           fmt::format(
               "{} of those calls ran the split-KV kernels ({}{} workgroups of the "
               "first resident per compute unit): {} then {} (built on the first decode "
               "call{}); {} ran the decode kernel {} "
               "(one split: O written directly, no workspace); {} of these "
               "GQA-packed (a KV head's query heads as the rows of its tiles){}, {} "
               "as grouped rows (a token's heads side by side){}{}",
               m.split_launches.load(),
               m.split_launches.load() > 0
                   ? fmt::format("the latest over {} splits; ", m.last_splits.load())
                   : "",
               shown->resident, shown->partial.lowered.kernel_name,
               shown->combine.lowered.kernel_name,
               shown->partial_code ? ", cache " + shown->partial_code->cache_outcome : "",
               m.decode_launches.load(), shown->direct.lowered.kernel_name,
               m.packed_launches.load(),
               m.split && m.packed_split ? fmt::format(", through {} (causal is a no-op there)",
                                                       m.packed_split->partial.lowered.kernel_name)
                                         : "",
               m.grouped_launches.load(),
               m.grouped_split
                   ? fmt::format(": {} and {}", m.grouped_split->partial.lowered.kernel_name,
                                 m.grouped_split->direct.lowered.kernel_name)
                   : "",
               m.wide_split ? fmt::format("; {} of those {} or more rows per KV head through {} "
                                          "and {} (two consumer warpgroups, a producer)",
                                          m.wide_launches.load(), Impl::kWideRows,
                                          m.wide_split->partial.lowered.kernel_name,
                                          m.wide_split->direct.lowered.kernel_name)
                            : ""));
    else if (!m.split_failure.empty())
      line("split-kv", "unavailable, calls run unsplit: " + m.split_failure);
    else
      line("split-kv", fmt::format("not used yet (chosen per call for decode, at most {} query "
                                   "rows, and when batch x heads x query blocks cannot fill the "
                                   "{} compute units)",
                                   Impl::kDecodeRows, m.device.compute_units));
  }
  {
    std::lock_guard<std::mutex> lock(m.backward_mutex);
    if (m.backward_plan) {
      const Impl::Backward &b = *m.backward_plan;
      auto name = [&](pipeline::KernelKind kind) {
        const int i = Impl::Backward::index(kind);
        return b.built[i] ? b.generated[i].lowered.kernel_name : std::string("not built yet");
      };
      using pipeline::KernelKind;
      line("backward",
           fmt::format("{} calls: {} wrote dK and dV directly ({}; one query head per KV head), "
                       "{} wrote them per query head in f32, then summed each group ({} then "
                       "{}); each after {} and {}",
                       m.backward_direct.load() + m.backward_grouped.load(),
                       m.backward_direct.load(), name(KernelKind::backward_dkdv_direct),
                       m.backward_grouped.load(), name(KernelKind::backward_dkdv),
                       name(KernelKind::backward_reduce), name(KernelKind::backward_preprocess),
                       name(KernelKind::backward_dq)));
    }
  }
  switch (m.executor) {
  case Executor::gpu:
    line("executor",
         fmt::format("the generated kernel on {} via {}", m.device.id(), m.driver->library_path()));
    break;
  case Executor::emulator:
    line("executor", fmt::format("the generated kernel on the CPU emulator of {}", m.device.arch));
    break;
  case Executor::interpreter:
    line("executor",
         fmt::format("the IR interpreter on the CPU (fallback: {})", m.fallback_reason));
    break;
  }
  return s;
}

const std::string &Attention::source() const {
  return impl_->generated ? impl_->generated->lowered.source : impl_->empty;
}
const std::vector<uint8_t> &Attention::code_object() const {
  return impl_->compiled && impl_->executor != Executor::interpreter ? impl_->compiled->code.bytes
                                                                     : impl_->no_code;
}
const AttentionSpec &Attention::spec() const { return impl_->spec; }
const DeviceInfo &Attention::device() const { return impl_->device; }
bool Attention::uses_fallback() const { return impl_->executor == Executor::interpreter; }

// ---- the entry points, with their failure stages ---------------------------

Expected<Attention> detail::AttentionAccess::create(const AttentionSpec &spec, const Device &device,
                                                    const Options &options, Failure *failure) {
  if (Status s = spec.validate(); !s)
    return failed(failure, Failure::spec, s.with_context("invalid attention spec"));
  auto info = find_device(device.id());
  if (!info)
    return failed(failure, Failure::device, info.status());

  auto impl = std::make_unique<Attention::Impl>();
  impl->spec = spec;
  impl->signature = spec.signature();
  impl->device = *info;
  impl->options = options;
  if (info->kind != DeviceKind::emulator) {
    auto driver = runtime::gpu_driver(info->kind);
    if (!driver)
      return failed(failure, Failure::device, driver.status());
    impl->driver = *driver;
  }

  Failure stage = Failure::none;
  Status built = impl->build(&stage);
  if (!built) {
    // Strict by default: a bad argument always fails; anything else falls back
    // to the interpreter only when asked to.
    if (stage == Failure::argument || !options.allow_fallback)
      return failed(failure, stage,
                    stage == Failure::argument
                        ? built
                        : Status::error("{} (Options::allow_fallback would run the IR "
                                        "interpreter on the CPU instead)",
                                        built.message()));
    if (Status s = impl->prepare_fallback(built); !s)
      return failed(failure, stage, s);
    compiler::debug_log(1, "falling back to the IR interpreter: {}", impl->fallback_reason);
  }
  return Attention(std::move(impl));
}

Status detail::AttentionAccess::forward(Attention &a, const AttentionSpec &shape,
                                        const AttentionTensors &given, void *stream,
                                        Failure *failure) {
  Attention::Impl &m = *a.impl_;
  const AttentionTensors t = with_stand_ins(shape, given);
  if (&shape != &m.spec) {
    if (Status s = shape.validate(); !s)
      return failed(failure, Failure::spec, s.with_context("forward: invalid shapes"));
    if (Status s = shape.matches(m.signature); !s)
      return failed(failure, Failure::argument, s.with_context("forward"));
  }
  if (Status s = m.check_arguments(shape, t); !s)
    return failed(failure, Failure::argument, s);
  if (m.driver != nullptr) // device memory (also for the interpreter on a GPU device)
    if (Status s = m.check_device_buffers(shape, t, stream); !s)
      return failed(failure, Failure::argument, s);
  if (m.device.kind == DeviceKind::emulator)
    if (Status s = check_host_index_arrays(shape, t); !s)
      return failed(failure, Failure::argument, s.with_context("forward"));
  if (m.generated)
    if (Status s = lowering::check_launch(m.generated->lowered, shape); !s)
      return failed(failure, Failure::argument, s.with_context("forward"));
  if (shape.lse_elements() == 0) // no query rows (batch 0, seqlen_q 0): nothing to write
    return Status::ok();
  m.launches.fetch_add(1, std::memory_order_relaxed);
  // Split-KV when asked for, or chosen (decode; a call that cannot fill the
  // device); chosen kernels that cannot be built leave the call to the attention
  // kernel (explain() says why). Decode of up to kMaxPackedTokens tokens with
  // GQA runs GQA-packed: the group's query heads are the rows of one KV head's
  // tiles (grouped rows: a token's heads side by side).
  std::optional<AttentionSpec> packed;
  int64_t splits = 0;
  if (m.executor != Executor::interpreter)
    packed = gqa_packed_decode(shape);
  Attention::Impl::SplitSet set = Attention::Impl::split_set(packed);
  // Many grouped rows take the wide kernels where they build, else the grouped ones.
  if (set == Attention::Impl::SplitSet::wide && !m.split_kv(nullptr, set))
    set = Attention::Impl::SplitSet::grouped;
  splits = m.choose_splits(packed ? *packed : shape, set);
  const Attention::Impl::SplitKv *split = nullptr;
  if (splits > 0) {
    auto sk = m.split_kv(failure, set);
    if (sk)
      split = *sk;
    else if (shape.num_splits > 1)
      return failed(failure, Failure::unsupported,
                    sk.status().with_context(fmt::format("forward with num_splits = {}", splits)));
  }
  // One split: the decode kernel writes O itself (no workspace, no combine), but
  // for attention sinks, which only the combine counts.
  const bool direct = split && splits == 1 && !shape.sinks;
  if (split) {
    if (direct) {
      m.decode_launches.fetch_add(1, std::memory_order_relaxed);
    } else {
      m.split_launches.fetch_add(1, std::memory_order_relaxed);
      m.last_splits.store(splits, std::memory_order_relaxed);
    }
    if (packed)
      m.packed_launches.fetch_add(1, std::memory_order_relaxed);
    if (Attention::Impl::grouped_rows(set))
      m.grouped_launches.fetch_add(1, std::memory_order_relaxed);
    if (set == Attention::Impl::SplitSet::wide)
      m.wide_launches.fetch_add(1, std::memory_order_relaxed);
  }
  // The split kernels see the packed view; everything else the caller's shapes.
  const AttentionSpec &plan = split && packed ? *packed : shape;
  Status s;
  switch (m.executor) {
  case Executor::gpu:
    if (direct)
      s = m.run_attention_program(split->direct.lowered, *split->direct_kernel, plan, t, stream);
    else
      // Decode of one token: the combine starts as the split kernel's workgroups
      // finish its loop (a dependent launch, sm_90). H200 (bench/results/README.md,
      // session 30): one token 0.87-1.04x the time (46 cases, geometric mean 0.97);
      // 16 tokens 0.93-1.11x, so not there.
      s = split ? m.run_split_gpu(*split, plan, splits, t, stream,
                                  /*dependent_combine=*/shape.seqlen_q == 1)
                : m.run_gpu(shape, t, stream);
    break;
  case Executor::emulator:
    if (direct) {
      const runtime::EmulatorOptions eo = emulator_options(m.options);
      s = run_on_host(shape, t, [&](HostTensors &host) {
        return runtime::emulate(split->direct.lowered, split->direct.target, plan, host, eo);
      });
    } else if (split) {
      const runtime::EmulatorOptions eo = emulator_options(m.options);
      s = run_on_host(shape, t, [&](HostTensors &host) {
        return runtime::emulate_split_kv(split->partial.lowered, split->combine.lowered,
                                         split->partial.target, plan, splits, host, eo);
      });
    } else {
      s = m.run_emulator(shape, t);
    }
    break;
  case Executor::interpreter:
    s = m.run_interpreter(shape, t, stream);
    break;
  }
  return s ? s : failed(failure, Failure::runtime, s);
}

Expected<std::string> detail::AttentionAccess::emit_source(const AttentionSpec &spec,
                                                           std::string_view arch,
                                                           const Options &options,
                                                           Failure *failure) {
  auto g = pipeline::generate(spec, arch, options, failure);
  if (!g)
    return g.status();
  return g->lowered.source;
}

Expected<std::string> detail::AttentionAccess::compile_report(const AttentionSpec &spec,
                                                              std::string_view arch,
                                                              const Options &options,
                                                              Failure *failure) {
  auto g = pipeline::generate(spec, arch, options, failure);
  if (!g)
    return g.status();
  auto c = pipeline::compile(*g, options, compiler::KernelCache::global(), failure);
  if (!c)
    return c.status();
  const lowering::Target &t = g->target;
  const int lds_per_unit = int(t.lds_bytes_per_cu); // a WGP's on RDNA
  auto reports =
      compiler::read_resources(c->code, t.vgpr_file_per_simd, t.max_waves_per_simd, lds_per_unit);
  if (!reports)
    return failed(failure, Failure::compile, reports.status());
  for (const compiler::ResourceReport &r : *reports)
    if (r.kernel == g->lowered.kernel_name)
      return r.to_json();
  return failed(failure, Failure::compile,
                Status::error("the code object of {} has no resource metadata for that kernel",
                              g->lowered.kernel_name));
}

Expected<std::string> emit_source(const AttentionSpec &spec, std::string_view arch,
                                  const Options &options) {
  return detail::AttentionAccess::emit_source(spec, arch, options, nullptr);
}

Expected<std::string> compile_report(const AttentionSpec &spec, std::string_view arch,
                                     const Options &options) {
  return detail::AttentionAccess::compile_report(spec, arch, options, nullptr);
}

std::string_view version() { return FLASHJIT_VERSION; }

} // namespace flashjit
