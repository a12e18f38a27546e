// Lowering: a verified tile-IR Program + a Target -> one self-contained HIP
// source (prelude + kernel) and the launch geometry the runtime needs.
#pragma once

#include "ir/build.h"
#include "ir/ir.h"
#include "lowering/matrix_table.h"
#include "lowering/target.h"

#include <optional>
#include <string>

namespace flashjit::lowering {

/// Which rules lower a program (lowering/rules.h):
///   automatic  the family's matrix-instruction rules where they can lower the
///              program, else the simt rules (AMD), saying why in Lowered::rules_note;
///   matrix     the family's matrix rules, or an error naming why not;
///   simt       the portable rules with FMAs and no matrix instruction (AMD only).
enum class RulesChoice { automatic, matrix, simt };
std::string_view rules_choice_name(RulesChoice c); // "auto", "matrix", "simt"
Expected<RulesChoice> parse_rules_choice(std::string_view name);

/// A parameter of the generated kernel. The kernel takes the program's tensors
/// (as pointers), then its scalar parameters, in the program's order, then the
/// tensor maps of the tiles it copies with TMA (sm90 rules).
struct KernelParam {
  std::string name; // the IR name: Q, ..., LSE, seqlen_q, q_seq_stride, scale_log2, ...
  enum class Kind { tensor, scalar, tensor_map } kind;
  ir::ScalarType type; // of a scalar
  std::string c_type;  // "const fj_bits *", "float *", "int", "long", "float"
  /// A tensor map (CUtensorMap, made per launch by runtime::KernelArgs): the
  /// tensor it reads, whose extents and strides the launch's bindings resolve,
  /// and its box of 64 columns x box_rows rows, 128-byte swizzled
  /// (templates/sm90_wgmma.hip).
  std::optional<ir::TensorParam> map_of = std::nullopt;
  int64_t box_rows = 0;
};

/// The block sizes of a mask tensor's block summary (lower_mask_blocks): a kernel
/// whose loop reads it takes the summary of its own blocks (0: none).
struct MaskBlocks {
  int64_t block_q = 0, block_k = 0;
  bool operator==(const MaskBlocks &) const = default;
};

struct Lowered {
  std::string source; // the HIP text; same program + target -> byte-identical text
  /// The source minus the target prelude and the fj_mma wrapper: the emulator
  /// runs this same text under its CPU prelude.
  std::string kernel_text;
  std::string kernel_name; // the extern "C" symbol
  std::vector<KernelParam> params;
  /// The program's grid: ir::grid_size() of it and the bindings is the launch's grid.
  std::vector<ir::GridAxis> grid;
  int block_threads = 0;
  int lds_bytes = 0; // LDS the kernel declares
  /// The LDS is dynamic (NVIDIA: past the 48 KiB of static shared memory): the
  /// launch passes lds_bytes as its dynamic size.
  bool lds_dynamic = false;
  /// The kernel's first statement waits for the kernel before it on the stream
  /// (fj_grid_dependency_wait, sm_90): a launch may start it while that one runs
  /// (runtime::LaunchGeometry::after_previous).
  bool waits_for_previous = false;
  const MatrixInstr *mma = nullptr; // null for the simt rules
  /// The matrix instruction the kernel runs, in words (Rules::instruction_name;
  /// "" for the simt rules).
  std::string instruction;
  std::string rules; // the rule set that lowered it, e.g. "gfx12", "simt"
  /// The processor to compile for: the target's, or the variant with the
  /// instructions the rules emitted (sm_90a for the sm90 rules' wgmma).
  std::string compile_arch;
  /// Why the simt rules lowered it ("" for matrix rules): asked for, or the
  /// matrix rules' reason for refusing under RulesChoice::automatic.
  std::string rules_note;
  /// Launch requirement: base pointers aligned to this many bytes (128-bit loads).
  int pointer_alignment = 2;
  /// Launch requirement: every seq stride (elements) at most this, so that a
  /// row's offset within a block fits the kernel's 32-bit offsets.
  int64_t max_row_stride = 0;
  /// Config persistent: the launch's grid is min(the grid's workgroups, this
  /// many per SM), in x only; the kernel walks the grid's tiles itself.
  int persistent_blocks = 0;
  /// Config persistent over uneven tiles: the kernel's parameter fj_tile_counter
  /// takes an 8-byte workspace that the launch zeroes first.
  bool tile_counter = false;
  /// The kernel reads a mask tensor's block summary (`attn_mask_blocks`) of
  /// these blocks, which lower_mask_blocks' kernel writes before it runs.
  MaskBlocks mask_blocks;
};

/// The default tuning config for a spec on a target (the one `flashjit emit`
/// uses unless told otherwise): block sizes chosen so K/V tiles fit in LDS and
/// the accumulators in VGPRs. Where the family has rules for several query
/// tiles (CDNA: 32 and 16), those that prefer the spec, or those of `mma_m`
/// queries when it is not 0 (then kept in the config). `producer`: the
/// forward's config with a producer warpgroup where the rules have a faster one
/// (Rules::producer_config); false for the decode kernels (split-KV's partial
/// kernel and decode), which have none: the rules' Rules::decode_config.
ir::Config default_config(const AttentionSpec &spec, const Target &target,
                          RulesChoice choice = RulesChoice::automatic, int64_t mma_m = 0,
                          bool producer = true);

/// Checks that a spec and config can run on the target (LDS bytes, registers,
/// workgroup size) with errors that name the limit and the value; the register
/// estimate is that of the rules `choice` and the config select: of the
/// family's rule sets (and those of config mma_m's tile, when not 0), the first
/// whose query and key tiles divide block_m / waves, block_n and head_dim_v.
Status check_fits(const AttentionSpec &spec, const ir::Config &config, const Target &target,
                  RulesChoice choice = RulesChoice::automatic);

Expected<Lowered> lower(const ir::Program &program, const Target &target,
                        RulesChoice choice = RulesChoice::automatic);

/// The second kernel of split-KV attention (the first is ir::build_split_kv's
/// program): merges the num_splits partial results of every query row by their
/// LSE into O (and the LSE when the spec asks for it). Its parameters are
/// O_partial and LSE_partial (the f32 workspace), O, LSE, then scalars bound by
/// bind_split_combine. It depends only on the spec's signature.
/// `name`: the kernel's name (default: fa_combine_<dtype>_d<head_dim_v>...).
Expected<Lowered> lower_split_combine(const AttentionSpec &spec, const Target &target,
                                      std::string_view name = {});
ir::Bindings bind_split_combine(const AttentionSpec &spec, int64_t splits);

/// The kernel that summarizes a mask tensor by blocks before an attention
/// kernel reads it (Lowered::mask_blocks): parameters attn_mask, then
/// attn_mask_blocks (one byte per entry, mask_blocks_bytes of them), then
/// scalars bound by bind_mask_blocks. It depends only on the mask's element type.
Expected<Lowered> lower_mask_blocks(const AttentionSpec &spec, const Target &target);
ir::Bindings bind_mask_blocks(const AttentionSpec &spec, MaskBlocks blocks);
/// The summary's size: one byte per (query block, key block, batch, head) of the
/// mask's extent, one entry on each axis it broadcasts.
int64_t mask_blocks_bytes(const AttentionSpec &spec, MaskBlocks blocks);

/// The backward pass's kernels beside its two tile-IR programs
/// (ir::build_backward_dq / build_backward_dkdv), written directly
/// (lowering/backward_kernels.cpp): the preprocess (L and D per query row) and
/// the reduce (dK and dV summed over each group of query heads, converted).
Expected<Lowered> lower_backward_preprocess(const AttentionSpec &spec, const Target &target);
Expected<Lowered> lower_backward_reduce(const AttentionSpec &spec, const Target &target);
/// With attention sinks: each head's sink gradient, -sum of P_sink * D over its rows.
Expected<Lowered> lower_backward_sinks(const AttentionSpec &spec, const Target &target);
/// The config of the backward's dQ (dkdv false) or dK/dV program on `target`,
/// from the forward's `config`: 16-row matrix tiles; the block of the first of
/// the family's rules that has one for the backward (Rules::backward_block,
/// sm90) where its LDS fits; else the largest loop block (64, 32 or 16 rows)
/// whose LDS tiles fit the target's workgroup LDS, with the register operands
/// (Q and dO, or K and V) kept in LDS where they fit beside a block of 32 or more
/// (fewer registers, more workgroups per compute unit).
ir::Config backward_config(const AttentionSpec &spec, const Target &target, ir::Config config,
                           bool dkdv);
/// The passes of the dK/dV program with `config` (its block) on `target`:
/// backward_config's register count, 2 where one loop's live values pass the
/// budget. For a caller's config whose dkdv_passes is 0 (the lowering's choice).
int64_t backward_dkdv_passes(const AttentionSpec &spec, const Target &target,
                             const ir::Config &config);
/// The scalars of all four backward kernels for `spec`'s shapes.
ir::Bindings bind_backward_kernels(const AttentionSpec &spec);

/// Whether kernel `k` can run the shapes of `shape` (its row strides within
/// Lowered::max_row_stride); an error names the stride and the limit.
Status check_launch(const Lowered &k, const AttentionSpec &shape);

/// The whole pipeline: validate, build, verify, lower.
Expected<Lowered> generate(const AttentionSpec &spec, const ir::Config &config,
                           const Target &target, RulesChoice choice = RulesChoice::automatic);

} // namespace flashjit::lowering
