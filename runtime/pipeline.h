// The pipeline of DESIGN.md, written once: a spec's signature and a target ->
// config -> tile IR -> HIP source -> cache key -> code object. The runtime
// (flashjit::Attention), every CLI command (emit, compile, run, warmup), the
// benches and the tests go through these functions, so a kernel warmed up by
// one is a cache hit for the others.
//
// Only the spec's signature (AttentionSpec::signature) reaches the kernel:
// lengths, batch, heads, strides, window sizes and the scale are scalar
// parameters bound at launch (ir::bind_attention), so the IR, the source, the
// kernel name and the key are the same for every shape of one signature.
#pragma once

#include "compiler/code_object.h"
#include "compiler/kernel_cache.h"
#include "compiler/knobs.h"
#include "ir/build.h"
#include "ir/ir.h"
#include "lowering/lower.h"
#include "lowering/target.h"
#include "runtime/attention.h"
#include "runtime/attention_detail.h"

#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace flashjit::pipeline {

using detail::Failure;

/// Everything between a spec and a compiler.
struct Generated {
  lowering::Target target;
  lowering::RulesChoice rules = lowering::RulesChoice::automatic;
  ir::Config config;
  ir::Program program; // shape-free; its name is unique per (signature, config, target, rules)
  std::string ir_text;
  lowering::Lowered lowered;
  std::string signature; // AttentionSpec::signature().summary(), for the cache's label
  /// Where the config came from, for explain(): "given", "default", or "tuned on
  /// <device> (<path>)"; a tuned entry that was not taken says why.
  std::string config_source;
};

/// The kernels of a signature: the attention kernel, and the two kernels of
/// split-KV attention (flash-decoding) that forward() uses when batch x heads x
/// query blocks cannot fill the device.
enum class KernelKind {
  attention,     // ir::build_attention
  split_partial, // ir::build_split_kv: each split's partial result, f32, to a workspace
  split_combine, // lowering::lower_split_combine: merges the splits by LSE
  decode,        // ir::build_attention on split_partial's config: one-split decode, O direct
  mask_blocks,   // lowering::lower_mask_blocks: a mask tensor's block summary, first
  // The backward pass (Attention::backward), in launch order:
  backward_preprocess,  // lowering::lower_backward_preprocess: L and D per query row
  backward_dq,          // ir::build_backward_dq
  backward_dkdv,        // ir::build_backward_dkdv: f32 per query head
  backward_dkdv_direct, // ir::build_backward_dkdv_direct: dK, dV themselves (no group)
  backward_reduce,      // lowering::lower_backward_reduce: sums each group, converts
  backward_sinks,       // lowering::lower_backward_sinks: the sinks' gradient (with sinks)
};

/// Validates the spec and options, chooses the config (Options::config, else the
/// rules' default for the signature) and builds, prints and lowers the program.
/// FLASHJIT_DEBUG=4 logs the IR. `failure` (may be null) gets the failing stage.
/// The split partial and decode kernels take one wave with one query tile (their
/// rows are few: decode); the combine kernel has no tile IR (Generated::ir_text
/// holds its text).
Expected<Generated> generate(const AttentionSpec &spec, std::string_view arch,
                             const Options &options, Failure *failure = nullptr,
                             KernelKind kind = KernelKind::attention);

/// The config of GQA-packed decode's split and decode kernels for calls of many
/// grouped rows per KV head (Attention's wide split set): the rules' producer
/// config where it has two consumer warpgroups of 64 rows (sm_90 from head dim
/// 72 to 256), not persistent; none elsewhere, with Options::config or other
/// rules given, or where it does not fit.
std::optional<ir::Config> wide_grouped_config(const AttentionSpec &spec, std::string_view arch,
                                              const Options &options);

/// A compiled kernel and where it came from.
struct Compiled {
  compiler::CodeObject code;
  std::string compiler;      // Compiler::identity()
  std::string options_text;  // KeyParts::compile_options
  std::string cache_outcome; // compiler::outcome_name()
  std::string cache_key;     // KeyParts::hash()
  std::string override_path; // the FLASHJIT_OVERRIDE_DIR source, if one was used
  double seconds = 0;        // of this call (compile or cache lookup)
};

/// Compiles `g` (or its FLASHJIT_OVERRIDE_DIR/<kernel name>.hip replacement)
/// with the device compiler Options::compiler names, through `cache`.
/// FLASHJIT_DUMP_DIR receives <kernel name>.hip and the code object.
Expected<Compiled> compile(const Generated &g, const Options &options,
                           compiler::KernelCache &cache = compiler::KernelCache::global(),
                           Failure *failure = nullptr);
/// Compiles each of a plan's kernels (compile() each), at once: all but the
/// first on threads of their own, so a plan's first call waits for its slowest
/// kernel, not for their sum. The codes in `gs`' order, or the first failure in
/// that order (with its stage in `failure`).
Expected<std::vector<Compiled>> compile_all(std::span<const Generated *const> gs,
                                            const Options &options, compiler::KernelCache &cache,
                                            Failure *failure = nullptr);

/// The compile options of a target under `options` (the key's compile_options),
/// for `kernel` when given: its Lowered::compile_arch (e.g. sm_90a) where set.
compiler::CompileOptions compile_options(const lowering::Target &target, const Options &options,
                                         const lowering::Lowered *kernel = nullptr);

/// The kernel the CPU emulator runs for `g`: g.lowered, or, when
/// FLASHJIT_OVERRIDE_DIR holds <kernel name>.hip, g.lowered with that file's
/// kernel text (compiler::override_kernel_text: an override that edits the
/// target prelude or the matrix wrapper, which the emulator replaces with its
/// own, is refused, as is anything compiler::source_override refuses).
Expected<lowering::Lowered> emulated_kernel(const Generated &g,
                                            const compiler::Knobs &knobs = compiler::knobs());

} // namespace flashjit::pipeline
