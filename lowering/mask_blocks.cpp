// The kernel before the attention kernel when the spec has a mask tensor: it
// reads the mask once and writes one byte per (query block, key block), the
// block's class (templates/mask_blocks.hip): empty, full or mixed. The attention
// kernel's block scan reads those bytes as the interval of the mask over the
// block (lowering/lower_loops.cpp, emit_block_range), so it skips the blocks
// the mask empties and skips the mask's loads in the blocks it keeps whole.
// A key-padding mask or a causal mask given as a tensor then costs what
// seqused_k or causal cost, where reading the mask per element made a call
// 4-6x slower than the same call without it (bench/results/README.md).
//
// Like the split-KV combine it has no matrix products and no tiles, so it is
// written here directly rather than built as tile IR (docs/decisions.md).
#include "lowering/lower.h"

#include "ir/build.h"
#include "lowering/direct_kernel.h"
#include "templates/templates.h"

namespace flashjit::lowering {

namespace {

constexpr int kThreads = 256;

int64_t blocks(int64_t n, int64_t block) { return (n + block - 1) / block; }

struct Cells {
  int64_t q = 0, k = 0, bh = 0; // entries per axis: query blocks, key blocks, (batch, head)
};

Cells cells(const AttentionSpec &spec, int64_t block_q, int64_t block_k) {
  const MaskStrides &m = spec.mask_strides;
  return {.q = m.q != 0 ? blocks(spec.seqlen_q, block_q) : 1,
          .k = blocks(spec.seqlen_k, block_k),
          .bh = (m.batch != 0 ? spec.batch : 1) * (m.head != 0 ? spec.heads : 1)};
}

} // namespace

int64_t mask_blocks_bytes(const AttentionSpec &spec, MaskBlocks b) {
  const Cells c = cells(spec, b.block_q, b.block_k);
  return c.q * c.k * c.bh;
}

ir::Bindings bind_mask_blocks(const AttentionSpec &spec, MaskBlocks b) {
  ir::Bindings out = ir::bind_attention(spec);
  const Cells c = cells(spec, b.block_q, b.block_k);
  out.set_int("mask_block_q", b.block_q);
  out.set_int("mask_block_k", b.block_k);
  out.set_int("mask_k_blocks", c.k);
  out.set_int("mask_q_blocks", c.q);
  out.set_int("mask_cells", c.k * c.q * c.bh);
  return out;
}

Expected<Lowered> lower_mask_blocks(const AttentionSpec &spec, const Target &target) {
  FJ_RETURN_IF_ERROR(spec.validate());
  if (spec.mask == MaskType::none)
    return Status::error("the mask-block summary kernel needs a spec with a mask tensor");
  const bool boolean = spec.mask == MaskType::boolean;
  const std::string_view type = mask_type_name(spec.mask);
  Lowered out;
  out.kernel_name = fmt::format("fa_mask_blocks_{}", type);
  const char *element = boolean                      ? "const unsigned char *"
                        : spec.mask == MaskType::f32 ? "const float *"
                                                     : "const fj_bits *";
  out.params = {
      {"attn_mask", KernelParam::Kind::tensor, ir::ScalarType::i64, element},
      {"attn_mask_blocks", KernelParam::Kind::tensor, ir::ScalarType::i64, "unsigned char *"}};
  add_scalars(out, {{"mask_batch_stride", ir::ScalarType::i64},
                    {"mask_head_stride", ir::ScalarType::i64},
                    {"mask_q_stride", ir::ScalarType::i64},
                    {"mask_k_stride", ir::ScalarType::i64},
                    {"heads", ir::ScalarType::i32},
                    {"seqlen_q", ir::ScalarType::i32},
                    {"seqlen_k", ir::ScalarType::i32},
                    {"mask_block_q", ir::ScalarType::i32},
                    {"mask_block_k", ir::ScalarType::i32},
                    {"mask_k_blocks", ir::ScalarType::i32},
                    {"mask_q_blocks", ir::ScalarType::i32}});
  // One axis (x): the entries, whatever the batch and heads (CUDA's y and z stop
  // at 65535).
  out.grid = {ir::GridAxis{-1, ir::Extent::of("mask_cells"), 1}};
  out.block_threads = kThreads;

  HipWriter w;
  w.raw(templates::mask_blocks);
  w.blank();
  w.line("constexpr int kThreads = {}; // work-items", kThreads);
  w.blank();
  w.line("// One workgroup per entry (key block, query block, (batch, head)) of the");
  w.line("// mask's own extent. Its work-items read the block's elements within seqlen_q x");
  w.line("// seqlen_k and agree, by two trees, whether any pair attends and whether any");
  w.line("// pair is not kept unchanged.");
  open_direct_kernel(w, out);
  w.line("FJ_LDS_ARRAY(float, lds_tree, kThreads);");
  w.line("const int tid = fj_thread_id();");
  w.line("const long cell = long(fj_group_id_x()); // fj_mask_cell's order: (b, h, qb, kb)");
  w.line(
      "const int kb = int(cell % mask_k_blocks), qb = int(cell / mask_k_blocks % mask_q_blocks);");
  w.line("const long bh = cell / mask_k_blocks / mask_q_blocks;");
  w.line("const long head_cells = mask_head_stride != 0 ? heads : 1;");
  w.line("const long b = bh / head_cells, h = bh % head_cells;");
  w.line("const int q0 = qb * mask_block_q, k0 = kb * mask_block_k;");
  w.line("// A broadcast query axis has one row: any query's.");
  w.line("const int rows = mask_q_stride == 0 ? (seqlen_q > 0 ? 1 : 0)");
  w.line("               : (seqlen_q - q0 < mask_block_q ? seqlen_q - q0 : mask_block_q);");
  w.line("const int cols = seqlen_k - k0 < mask_block_k ? seqlen_k - k0 : mask_block_k;");
  w.line("const long base = b * mask_batch_stride + h * mask_head_stride;");
  w.line("float attends = 0.0f, changed = 0.0f; // 1: some pair attends; is not kept unchanged");
  w.open("for (int e = tid; e < rows * cols; e += kThreads) {{");
  w.line("const int r = e / cols, c = e % cols;");
  w.line("const long at = base + long(q0 + r) * mask_q_stride + long(k0 + c) * mask_k_stride;");
  if (boolean) {
    w.line("const bool keep = attn_mask[at] != 0; // bool: nonzero attends, unchanged");
    w.line("attends = keep ? 1.0f : attends;");
    w.line("changed = keep ? changed : 1.0f;");
  } else {
    w.line("const float x = {}; // added to the score: -inf hides, 0 keeps unchanged",
           spec.mask == MaskType::f32 ? "attn_mask[at]"
                                      : fmt::format("fj_{}_to_f32(attn_mask[at])", type));
    w.line("attends = x == -FJ_INF ? attends : 1.0f;");
    w.line("changed = x == 0.0f ? changed : 1.0f; // NaN too");
  }
  w.close();
  tree_reduce(w, "lds_tree", "attends", true, "attends");
  tree_reduce(w, "lds_tree", "changed", true, "changed");
  w.line("if (tid == 0)");
  w.line("  attn_mask_blocks[cell] = attends == 0.0f ? FJ_MASK_BLOCK_EMPTY");
  w.line("                          : changed == 0.0f ? FJ_MASK_BLOCK_FULL");
  w.line("                                            : FJ_MASK_BLOCK_MIXED;");
  w.close();
  finish_direct_kernel(out, target, w, fmt::format("the block summary of a {} mask tensor", type),
                       "a reduction per block");
  out.rules = "mask_blocks";
  out.lds_bytes = kThreads * 4;
  out.pointer_alignment = mask_type_bytes(spec.mask);
  return out;
}

} // namespace flashjit::lowering
