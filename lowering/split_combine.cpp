// The second kernel of split-KV attention: merges the splits' partial results
// by their log-sum-exp.
//
//   lse_max = max_s LSE_s                   (-inf: no split saw a key)
//   w_s     = exp(LSE_s - lse_max)          (0 for an empty split)
//   O       = sum_s w_s O_s / sum_s w_s     (0 for a row that sees no key)
//   LSE     = lse_max + ln(sum_s w_s)       (-inf for such a row)
//
// It has no matrix products and no tiles, only a loop over the splits per
// output element, so it is written here directly rather than built as tile IR
// (docs/decisions.md). The splits are summed in order: results are the same
// run to run.
#include "lowering/lower.h"

#include "ir/build.h"
#include "lowering/emitter.h"
#include "lowering/hip_writer.h"
#include "templates/templates.h"

#include <numbers>

namespace flashjit::lowering {

namespace {

// A workgroup merges kRows rows; each row's head-dim entries are spread over
// kColThreads work-items, each holding ceil(head_dim_v / kColThreads) of them.
constexpr int kThreads = 128, kColThreads = 32, kRows = kThreads / kColThreads;

std::string combine_name(const KernelSignature &sig) {
  return fmt::format("fa_combine_{}_d{}{}{}", dtype_name(sig.dtype), sig.head_dim_v,
                     sig.lse ? "_lse" : "", sig.unit_dim[3] ? "" : "_strided");
}

} // namespace

ir::Bindings bind_split_combine(const AttentionSpec &spec, int64_t splits) {
  ir::Bindings b = ir::bind_attention(spec);
  b.set_int("num_splits", splits);
  b.set_int("rows", spec.batch * spec.heads * spec.seqlen_q);
  return b;
}

Expected<Lowered> lower_split_combine(const AttentionSpec &spec, const Target &target,
                                      std::string_view name) {
  FJ_RETURN_IF_ERROR(spec.validate());
  const KernelSignature sig = spec.signature();
  const int cols = int((sig.head_dim_v + kColThreads - 1) / kColThreads);
  Lowered out;
  out.kernel_name = name.empty() ? combine_name(sig) : std::string(name);
  out.params = {
      {"O_partial", KernelParam::Kind::tensor, ir::ScalarType::i64, "const float *"},
      {"LSE_partial", KernelParam::Kind::tensor, ir::ScalarType::i64, "const float *"},
      {"O", KernelParam::Kind::tensor, ir::ScalarType::i64, "fj_bits *"},
  };
  if (sig.lse)
    out.params.push_back({"LSE", KernelParam::Kind::tensor, ir::ScalarType::i64, "float *"});
  const std::pair<const char *, ir::ScalarType> scalars[] = {
      {"rows", ir::ScalarType::i64},
      {"heads", ir::ScalarType::i32},
      {"seqlen_q", ir::ScalarType::i32},
      {"num_splits", ir::ScalarType::i32},
      {"o_batch_stride", ir::ScalarType::i64},
      {"o_head_stride", ir::ScalarType::i64},
      {"o_seq_stride", ir::ScalarType::i32},
      {"o_dim_stride", ir::ScalarType::i32},
      {"lse_batch_stride", ir::ScalarType::i64},
      {"lse_head_stride", ir::ScalarType::i64}};
  for (const auto &[name, type] : scalars) {
    if (std::string_view(name) == "o_dim_stride" && sig.unit_dim[3])
      continue;
    if (std::string_view(name).starts_with("lse_") && !sig.lse)
      continue;
    out.params.push_back({name, KernelParam::Kind::scalar, type, emit::c_scalar_type(type)});
  }
  out.grid = {ir::GridAxis{-1, ir::Extent::of("rows"), kRows}};
  out.block_threads = kThreads;

  HipWriter w;
  w.line("// ---- the element type ({}) ----", dtype_name(sig.dtype));
  w.line("FJ_DEVICE fj_bits fj_from_f32(float x) {{ return fj_f32_to_{}(x); }}",
         dtype_name(sig.dtype));
  w.blank();
  w.line("constexpr int kDimV = {}; // head_dim_v", sig.head_dim_v);
  w.line("constexpr int kColThreads = {}; // work-items per row", kColThreads);
  w.line("constexpr int kCols = {}; // head-dim entries per work-item", cols);
  w.line("constexpr int kRows = {}; // rows per workgroup", kRows);
  w.blank();
  w.line("// Merges split-KV's partial results: workspace row r = (batch * heads + head) *");
  w.line("// seqlen_q + query holds O_partial[split][r][0..kDimV) and LSE_partial[split][r].");
  w.line("FJ_GLOBAL FJ_WORKGROUP_SIZE({})", kThreads);
  w.line("void {}(", out.kernel_name);
  w.indent(2);
  for (size_t i = 0; i < out.params.size(); ++i) {
    const KernelParam &p = out.params[i];
    w.line("{}{}{}{}", p.c_type, p.kind == KernelParam::Kind::tensor ? "__restrict__ " : " ",
           p.name, i + 1 < out.params.size() ? "," : ") {");
  }
  w.indent(-2);
  w.indent(1);
  w.line("const long row = long(fj_group_id_x()) * kRows + fj_thread_id() / kColThreads;");
  w.line("const int col0 = fj_thread_id() % kColThreads;");
  w.line("if (row >= rows)");
  w.line("  return;");
  w.line("const long split_rows = rows; // rows per split in the workspace");
  w.line("float lse_max = -FJ_INF;");
  w.line("for (int s = 0; s < num_splits; ++s)");
  w.line("  lse_max = fj_max(lse_max, fj_global_load_f32(LSE_partial + s * split_rows + row));");
  w.line("float acc[kCols];");
  w.line("#pragma unroll");
  w.line("for (int c = 0; c < kCols; ++c)");
  w.line("  acc[c] = 0.0f;");
  w.line("float sum = 0.0f;");
  w.open("if (lse_max != -FJ_INF) {{");
  w.open("for (int s = 0; s < num_splits; ++s) {{");
  w.line("const float lse = fj_global_load_f32(LSE_partial + s * split_rows + row);");
  w.line("if (lse == -FJ_INF)");
  w.line("  continue; // an empty split: its partial output is 0 with weight 0");
  w.line("const float weight = fj_exp2((lse - lse_max) * {});",
         emit::float_literal(std::numbers::log2e));
  w.line("sum += weight;");
  w.line("const float *o = O_partial + (s * split_rows + row) * kDimV;");
  w.line("#pragma unroll");
  w.line("for (int c = 0; c < kCols; ++c)");
  w.line("  if (col0 + c * kColThreads < kDimV)");
  w.line("    acc[c] += weight * fj_global_load_f32(o + col0 + c * kColThreads);");
  w.close();
  w.close();
  w.line("const int query = int(row % seqlen_q);");
  w.line("const int head = int(row / seqlen_q % heads);");
  w.line("const long batch = row / seqlen_q / heads;");
  w.line("fj_bits *dst = O + batch * o_batch_stride + head * o_head_stride + long(query) * "
         "o_seq_stride;");
  w.line("const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;");
  w.line("#pragma unroll");
  w.line("for (int c = 0; c < kCols; ++c)");
  w.line("  if (col0 + c * kColThreads < kDimV)");
  w.line("    fj_global_store1(dst + long(col0 + c * kColThreads){}, fj_from_f32(acc[c] * inv));",
         sig.unit_dim[3] ? "" : " * o_dim_stride");
  if (sig.lse) {
    w.line("if (col0 == 0)");
    w.line(
        "  fj_global_store_f32(LSE + batch * lse_batch_stride + head * lse_head_stride + query,");
    w.line("                      sum > 0.0f ? lse_max + fj_log2(sum) * {} : -FJ_INF);",
           emit::float_literal(std::numbers::ln2));
  }
  w.close();
  out.kernel_text = w.str();

  HipWriter full;
  full.line("// flashjit kernel {} for {}: merges split-KV partial results", out.kernel_name,
            target.target_id());
  full.line("// (no tile IR: a loop over the splits per output element; see docs/decisions.md).");
  full.blank();
  full.raw(target.is_nvidia() ? templates::cuda_prelude : templates::amdgcn_prelude);
  full.blank();
  full.raw(out.kernel_text);
  out.source = full.str();
  out.rules = "combine";
  out.pointer_alignment = 4;
  out.max_row_stride = INT32_MAX;
  return out;
}

} // namespace flashjit::lowering
