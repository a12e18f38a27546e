// The second kernel of split-KV attention: merges the splits' partial results
// by their log-sum-exp.
//
//   lse_max = max_s LSE_s                   (-inf: no split saw a key)
//   w_s     = exp(LSE_s - lse_max)          (0 for an empty split)
//   O       = sum_s w_s O_s / sum_s w_s     (0 for a row that sees no key)
//   LSE     = lse_max + ln(sum_s w_s)       (-inf for such a row)
//
// With attention sinks the splits count no sink (the split kernels are built
// without them); the merge counts the row's head's once: lse_max takes the sink
// too and the sum gains exp(sink - lse_max), which O's entries do not (a row
// that sees no key: O = 0, LSE = sink), as the attention kernel's running max and
// sum start from the sink.
//
// It has no matrix products and no tiles, so it is written here directly
// rather than built as tile IR (docs/decisions.md). With many splits one
// workgroup merges one row: its work-items read the splits' LSEs at once, and
// groups of work-items each sum every groups-th split's partial row, so a
// decode call of a few rows and 512 splits is not 512 dependent loads long.
// With few splits (kFlatUpToSplits) or many rows (kFlatFromRows) each work-item
// merges one entry of O over every split: a workgroup per row would leave most
// of its work-items idle and pay two barriers per row (on an H100, 4096 rows of
// one split took 47.5 us).
// The sums run in a fixed order (a tree over the LSEs, then the groups in
// order; or the splits in order): results are the same run to run.
#include "lowering/lower.h"

#include "ir/build.h"
#include "lowering/direct_kernel.h"

#include <numbers>

namespace flashjit::lowering {

namespace {

// A workgroup merges col_threads entries of one row (the grid's y axis covers
// the head dim): kThreads work-items read the LSEs (every kThreads-th split
// each, kMaxChosenSplits at most), then kThreads / col_threads groups of
// col_threads, one entry per work-item, sum every groups-th split. col_threads
// is a call's: 32 (8 groups) where splits are few, kNarrowColThreads (32
// groups, and 4x the workgroups) from kNarrowFromSplits splits on, where few
// rows have many splits and the loads in flight, not the work, bound the time.
constexpr int kThreads = 256, kColThreads = 32, kNarrowColThreads = 8;
constexpr int64_t kNarrowFromSplits = 256;
// Up to this many splits, or from this many rows, a work-item per entry of O
// (col_threads 1: the "flat" merge), each reading every split's LSE and partial
// entry in order. With many rows the workgroups per row repeat the LSE reads and
// trees for every chunk of columns: on an H200 (session 28) 512 rows of 49
// splits took 11.3 us that way and 6.3 flat over 33; 8192 rows of 24 splits 64.6
// against 10.2 flat over 6.
constexpr int64_t kFlatUpToSplits = 16, kFlatFromRows = 256;

std::string combine_name(const KernelSignature &sig) {
  return fmt::format("fa_combine_{}_d{}{}{}{}", sig.f32_io ? "f32" : dtype_name(sig.dtype),
                     sig.head_dim_v, sig.lse ? "_lse" : "", sig.sinks ? "_sinks" : "",
                     sig.unit_dim[3] ? "" : "_strided");
}

} // namespace

ir::Bindings bind_split_combine(const AttentionSpec &spec, int64_t splits) {
  ir::Bindings b = ir::bind_attention(spec);
  const int64_t rows = spec.batch * spec.heads * spec.seqlen_q;
  b.set_int("num_splits", splits);
  b.set_int("rows", rows);
  if (spec.q_group == 1) { // (bind_attention binds grouped rows' own)
    b.set_int("q_group", 1);
    b.set_int("o_group_stride", 0);
    b.set_int("lse_group_stride", 0);
  }
  if (splits <= kFlatUpToSplits || rows >= kFlatFromRows) {
    b.set_int("col_threads", 1);
    b.set_int("groups", (rows * spec.head_dim_v + kThreads - 1) / kThreads);
    b.set_int("col_chunks", 1);
    return b;
  }
  // On the H200 (bench/results/README.md), B=1 8:1 D=128 with 512 splits: 7.9
  // us at 32 entries per workgroup, 4.6 at 8; but 32 rows of 82 splits took
  // 3.4 at 32 and 4.7 at 8: each workgroup repeats the LSE reads and trees.
  const int col_threads = splits >= kNarrowFromSplits ? kNarrowColThreads : kColThreads;
  b.set_int("col_threads", col_threads);
  b.set_int("groups", rows);
  b.set_int("col_chunks", (spec.head_dim_v + col_threads - 1) / col_threads);
  return b;
}

Expected<Lowered> lower_split_combine(const AttentionSpec &spec, const Target &target,
                                      std::string_view name) {
  FJ_RETURN_IF_ERROR(spec.validate());
  const KernelSignature sig = spec.signature();
  Lowered out;
  out.kernel_name = name.empty() ? combine_name(sig) : std::string(name);
  out.params = {
      {"O_partial", KernelParam::Kind::tensor, ir::ScalarType::i64, "const float *"},
      {"LSE_partial", KernelParam::Kind::tensor, ir::ScalarType::i64, "const float *"},
      // f32 outputs (f32_io) are written unrounded.
      {"O", KernelParam::Kind::tensor, ir::ScalarType::i64, sig.f32_io ? "float *" : "fj_bits *"},
  };
  if (sig.lse)
    out.params.push_back({"LSE", KernelParam::Kind::tensor, ir::ScalarType::i64, "float *"});
  if (sig.sinks)
    out.params.push_back(
        {"sinks", KernelParam::Kind::tensor, ir::ScalarType::i64, "const float *"});
  const std::pair<const char *, ir::ScalarType> scalars[] = {
      {"rows", ir::ScalarType::i64},
      {"heads", ir::ScalarType::i32},
      {"seqlen_q", ir::ScalarType::i32},
      {"num_splits", ir::ScalarType::i32},
      {"col_threads", ir::ScalarType::i32},
      {"o_batch_stride", ir::ScalarType::i64},
      {"o_head_stride", ir::ScalarType::i64},
      {"o_seq_stride", ir::ScalarType::i32},
      {"o_dim_stride", ir::ScalarType::i32},
      {"lse_batch_stride", ir::ScalarType::i64},
      {"lse_head_stride", ir::ScalarType::i64},
      {"q_group", ir::ScalarType::i32},
      {"o_group_stride", ir::ScalarType::i64},
      {"lse_group_stride", ir::ScalarType::i64}};
  for (const auto &[name, type] : scalars) {
    if (std::string_view(name) == "o_dim_stride" && sig.unit_dim[3])
      continue;
    if (std::string_view(name).starts_with("lse_") && !sig.lse)
      continue;
    out.params.push_back({name, KernelParam::Kind::scalar, type, emit::c_scalar_type(type)});
  }
  out.grid = {ir::GridAxis{-1, ir::Extent::of("groups"), 1},
              ir::GridAxis{-1, ir::Extent::of("col_chunks"), 1}};
  out.block_threads = kThreads;

  HipWriter w;
  w.line("// ---- the element type ({}) ----", dtype_name(sig.dtype));
  w.line("FJ_DEVICE fj_bits fj_from_f32(float x) {{ return fj_f32_to_{}(x); }}",
         dtype_name(sig.dtype));
  w.blank();
  w.line("constexpr int kDimV = {}; // head_dim_v", sig.head_dim_v);
  w.line("constexpr int kThreads = {}; // work-items", kThreads);
  w.line("constexpr int kMaxSplits = {}; // the most splits a call has", kMaxChosenSplits);
  w.blank();
  w.line("// Merges split-KV's partial results: workspace row r = (batch * heads + head) *");
  w.line("// seqlen_q + query holds O_partial[split][r][0..kDimV) and LSE_partial[split][r];");
  w.line("// grouped rows (q_group > 1) are q_group per query position.");
  w.line("// col_threads 1 (up to {} splits, or from {} rows): a work-item per entry of O, every",
         kFlatUpToSplits, kFlatFromRows);
  w.line("// split in order. Else one workgroup per row and col_threads (8 or 32) entries of it.");
  open_direct_kernel(w, out);
  // Launched as the split kernel's dependent on sm_90 (runtime: one query token).
  out.waits_for_previous = emit_grid_dependency_wait(w, target);
  const std::string log2e = emit::float_literal(std::numbers::log2e);
  // What both merges write once they have a row's lse_max and sum: the row's
  // place in O, entry `col` of it (`total` the weighted sum), and the LSE
  // (`guard` picks the one work-item that writes it).
  // Grouped rows (AttentionSpec::q_group; 1 elsewhere): query row `query` is
  // member `member` of position `position`.
  auto locate_row = [&] {
    w.line("const int query = int(row % seqlen_q);");
    w.line("const int head = int(row / seqlen_q % heads);");
    w.line("const long batch = row / seqlen_q / heads;");
    w.line("const int position = query / q_group, member = query % q_group;");
  };
  auto store_entry = [&](std::string_view total) {
    w.line("{} *dst = O + batch * o_batch_stride + head * o_head_stride + long(position) * "
           "o_seq_stride + member * o_group_stride;",
           sig.f32_io ? "float" : "fj_bits");
    w.line("{}(dst + long(col){}, {}(sum > 0.0f ? {} / sum : 0.0f));",
           sig.f32_io ? "fj_global_store_f32" : "fj_global_store1",
           sig.unit_dim[3] ? "" : " * o_dim_stride", sig.f32_io ? "" : "fj_from_f32", total);
  };
  // Attention sinks: the row's head's logit joins lse_max, then the sum (the
  // caller's head: a KV head's member `member` of its group with grouped rows).
  auto sink_into_max = [&] {
    if (!sig.sinks)
      return;
    w.line("const float sink = fj_global_load_f32(sinks + head * q_group + member);");
    w.line("lse_max = fj_max(lse_max, sink);");
  };
  auto sink_into_sum = [&] {
    if (!sig.sinks)
      return;
    w.line("if (sink != -FJ_INF) // the sink's weight: in the sum, not in O's entries");
    w.line("  sum += fj_exp2((sink - lse_max) * {});", log2e);
  };
  auto store_lse = [&](std::string_view guard) {
    if (!sig.lse)
      return;
    w.line("if ({})", guard);
    w.line(
        "  fj_global_store_f32(LSE + batch * lse_batch_stride + head * lse_head_stride + position "
        "+ member * lse_group_stride,");
    w.line("                      sum > 0.0f ? lse_max + fj_log2(sum) * {} : -FJ_INF);",
           emit::float_literal(std::numbers::ln2));
  };
  w.line("// The merges of a workgroup per row use these; the flat one none.");
  w.line("FJ_LDS_ARRAY(float, lds_weight, kMaxSplits); // each split's weight");
  w.line("FJ_LDS_ARRAY(float, lds_tree, kThreads); // the reductions over the splits");
  w.line("FJ_LDS_ARRAY(float, lds_acc, kThreads); // each group's weighted sums");
  w.open("if (col_threads == 1) {{");
  w.line("const long entry = long(fj_group_id_x()) * kThreads + fj_thread_id();");
  w.line("if (entry >= rows * kDimV)");
  w.line("  return;");
  w.line("const long row = entry / kDimV;");
  w.line("const int col = int(entry % kDimV);");
  locate_row();
  w.line("float lse_max = -FJ_INF;");
  w.line("for (int s = 0; s < num_splits; ++s)");
  w.line("  lse_max = fj_max(lse_max, fj_global_load_f32(LSE_partial + s * rows + row));");
  sink_into_max();
  w.line("float sum = 0.0f, acc = 0.0f; // the splits in order");
  w.open("for (int s = 0; s < num_splits; ++s) {{");
  w.line("const float lse = fj_global_load_f32(LSE_partial + s * rows + row);");
  w.line("const float w = lse == -FJ_INF ? 0.0f : fj_exp2((lse - lse_max) * {});", log2e);
  w.line("sum += w;");
  w.line("if (w != 0.0f) // an empty split's partial entry is not read");
  w.line("  acc += w * fj_global_load_f32(O_partial + (s * rows + row) * kDimV + col);");
  w.close();
  sink_into_sum();
  store_entry("acc");
  store_lse("col == 0");
  w.line("return;");
  w.close();
  w.line("const long row = long(fj_group_id_x());");
  w.line("const int tid = fj_thread_id();");
  w.line("const long split_rows = rows; // rows per split in the workspace");
  w.line("// lse_max = max_s LSE_s, then sum = sum_s w_s: each work-item over every");
  w.line("// kThreads-th split, then a tree; all in a fixed order.");
  w.line("float lse_max = -FJ_INF;");
  w.line("for (int s = tid; s < num_splits; s += kThreads) {{");
  w.line("  const float lse = fj_global_load_f32(LSE_partial + s * split_rows + row);");
  w.line("  lds_weight[s] = lse;");
  w.line("  lse_max = fj_max(lse_max, lse);");
  w.line("}}");
  tree_reduce(w, "lds_tree", "lse_max", true, "lse_max");
  locate_row();
  sink_into_max();
  w.line("// A split's weight: 0 for an empty one (its partial output is not read), and");
  w.line("// so for every split of a row no split saw a key of.");
  w.line("float sum = 0.0f;");
  w.line("for (int s = tid; s < num_splits; s += kThreads) {{");
  w.line("  const float lse = lds_weight[s];");
  w.line("  const float w = lse == -FJ_INF ? 0.0f : fj_exp2((lse - lse_max) * {});", log2e);
  w.line("  lds_weight[s] = w;");
  w.line("  sum += w;");
  w.line("}}");
  tree_reduce(w, "lds_tree", "sum", false, "sum");
  sink_into_sum();
  // The merge, once per width: each a block with its width a constant.
  for (int cols : {kNarrowColThreads, kColThreads}) {
    if (cols == kNarrowColThreads) {
      w.open("if (col_threads == {}) {{", cols);
    } else {
      w.close("} else {");
      w.indent(1);
    }
    w.line("// kGroups groups of kCols work-items, each summing every kGroups-th split.");
    w.line("constexpr int kCols = {}, kGroups = kThreads / kCols;", cols);
    w.line("const int group = tid / kCols, lane = tid % kCols;");
    w.line("const int col = int(fj_group_id_y()) * kCols + lane;");
    w.line("float acc = 0.0f;");
    w.open("if (col < kDimV) {{");
    w.line("#pragma unroll 8");
    w.open("for (int s = group; s < num_splits; s += kGroups) {{");
    w.line("const float w = lds_weight[s];");
    w.line("if (w != 0.0f)");
    w.line("  acc += w * fj_global_load_f32(O_partial + (s * split_rows + row) * kDimV + col);");
    w.close();
    w.close();
    w.line("lds_acc[tid] = acc;");
    w.line("fj_barrier();");
    w.open("if (tid < kCols && col < kDimV) {{");
    w.line("float total = 0.0f; // the groups' sums in order");
    w.line("#pragma unroll");
    w.line("for (int g = 0; g < kGroups; ++g)");
    w.line("  total += lds_acc[g * kCols + tid];");
    store_entry("total");
    w.close();
  }
  w.close();
  store_lse("tid == 0 && fj_group_id_y() == 0");
  w.close();
  finish_direct_kernel(out, target, w, "merges split-KV partial results",
                       "a loop over the splits per output element");
  out.rules = "combine";
  out.lds_bytes = int((kMaxChosenSplits + 2 * kThreads) * 4);
  return out;
}

} // namespace flashjit::lowering
