// The second kernel of split-KV attention: merges the splits' partial results
// by their log-sum-exp.
//
//   lse_max = max_s LSE_s                   (-inf: no split saw a key)
//   w_s     = exp(LSE_s - lse_max)          (0 for an empty split)
//   O       = sum_s w_s O_s / sum_s w_s     (0 for a row that sees no key)
//   LSE     = lse_max + ln(sum_s w_s)       (-inf for such a row)
//
// computed in one pass, as the attention kernel's online softmax folds KV
// blocks: a running max m, sum l and weighted sum acc, rescaled when m moves.
// Each split's LSE and partial entry are loaded together, so the merge is one
// round of loads deep, not a max over every LSE and then a second round.
//
// With attention sinks the splits count no sink (the split kernels are built
// without them); the merge counts the row's head's once, after the splits: the
// max takes the sink too and the sum gains exp(sink - max), which O's entries
// do not (a row that sees no key: O = 0, LSE = sink), as the attention kernel's
// running max and sum starting from the sink give.
//
// It has no matrix products and no tiles, so it is written here directly
// rather than built as tile IR (docs/decisions.md). With many splits one
// workgroup merges one row: groups of work-items each fold every groups-th
// split's partial row, then the first group folds the groups' results, so a
// decode call of a few rows and 512 splits is not 512 dependent loads long.
// With few splits (kFlatUpToSplits) or many rows (kFlatFromRows) each work-item
// merges one entry of O over every split: a workgroup per row would leave most
// of its work-items idle and pay a barrier per row (on an H100, 4096 rows of
// one split took 47.5 us).
// The folds run in a fixed order (the splits in order within a group, then
// the groups in order): results are the same run to run.
#include "lowering/lower.h"

#include "ir/build.h"
#include "lowering/direct_kernel.h"

#include <numbers>

namespace flashjit::lowering {

namespace {

// A workgroup merges col_threads entries of one row (the grid's y axis covers
// the head dim): kThreads / col_threads groups of col_threads, one entry per
// work-item, each fold every groups-th split. col_threads
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
  w.blank();
  const std::string log2e = emit::float_literal(std::numbers::log2e);
  w.line("// Folds (mb, lb, accb), the running max, sum and weighted sum of other keys (mb");
  w.line("// finite), into the running (m, l, acc); m = -inf (nothing folded yet) scales by 0.");
  w.open(
      "FJ_DEVICE void fj_fold(float &m, float &l, float &acc, float mb, float lb, float accb) {{");
  w.line("const float m_new = fj_max(m, mb);");
  w.line("const float scale = fj_exp2((m - m_new) * {0}), scale_b = fj_exp2((mb - m_new) * {0});",
         log2e);
  w.line("l = l * scale + lb * scale_b;");
  w.line("acc = acc * scale + accb * scale_b;");
  w.line("m = m_new;");
  w.close();
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
  // One pass over the splits: each work-item folds its splits into a running
  // (max, sum, weighted sum) in order, as the attention kernel's online softmax
  // does over KV blocks. The split's LSE and its partial entry are loaded together
  // (neither waits for a max over every split first); an empty split (LSE -inf)
  // is selected away, its entry loaded but never used.
  auto fold_splits = [&](std::string_view first, std::string_view step) {
    w.line("float m = -FJ_INF, l = 0.0f, acc = 0.0f;");
    w.line("#pragma unroll 4");
    w.open("for (int s = {}; s < num_splits; {}) {{", first,
           step == "1" ? std::string("++s") : fmt::format("s += {}", step));
    w.line("const float lse = fj_global_load_f32(LSE_partial + s * rows + row);");
    w.line("const float o = col < kDimV ? fj_global_load_f32(O_partial + (s * rows + row) * "
           "kDimV + col) : 0.0f;");
    // The split folded into a copy, then kept by selects, not a branch, so that
    // nothing moves the entry's load after the LSE's (an empty split's fold may be
    // NaN: (-inf) - (-inf)).
    w.line("float mf = m, lf = l, accf = acc;");
    w.line("fj_fold(mf, lf, accf, lse, 1.0f, o);");
    w.line("const bool seen = lse != -FJ_INF;");
    w.line("m = seen ? mf : m;");
    w.line("l = seen ? lf : l;");
    w.line("acc = seen ? accf : acc;");
    w.close();
  };
  // With attention sinks the row's head's logit joins the sum (not O's entries)
  // once every split is in (the caller's head: a KV head's member `member` of its
  // group with grouped rows).
  auto sink_in = [&] {
    if (!sig.sinks)
      return;
    w.line("const float sink = fj_global_load_f32(sinks + head * q_group + member);");
    w.line("if (sink != -FJ_INF) // a logit of weight 1 and no value");
    w.line("  fj_fold(m, l, acc, sink, 1.0f, 0.0f);");
  };
  // What both merges write once they have a row's m, l and acc: the row's place
  // in O, entry `col` of it, and the LSE (`guard` picks the one work-item that
  // writes it). Grouped rows (AttentionSpec::q_group; 1 elsewhere): query row
  // `query` is member `member` of position `position`.
  auto finish_row = [&](std::string_view guard) {
    w.line("const int query = int(row % seqlen_q);");
    w.line("const int head = int(row / seqlen_q % heads);");
    w.line("const long batch = row / seqlen_q / heads;");
    w.line("const int position = query / q_group, member = query % q_group;");
    sink_in();
    w.line("{} *dst = O + batch * o_batch_stride + head * o_head_stride + long(position) * "
           "o_seq_stride + member * o_group_stride;",
           sig.f32_io ? "float" : "fj_bits");
    w.line("if (col < kDimV) // 0 for a row that sees no key");
    w.line("  {}(dst + long(col){}, {}(l > 0.0f ? acc / l : 0.0f));",
           sig.f32_io ? "fj_global_store_f32" : "fj_global_store1",
           sig.unit_dim[3] ? "" : " * o_dim_stride", sig.f32_io ? "" : "fj_from_f32");
    if (!sig.lse)
      return;
    w.line("if ({}) // -inf for a row that sees no key", guard);
    w.line(
        "  fj_global_store_f32(LSE + batch * lse_batch_stride + head * lse_head_stride + position "
        "+ member * lse_group_stride,");
    w.line("                      l > 0.0f ? m + fj_log2(l) * {} : -FJ_INF);",
           emit::float_literal(std::numbers::ln2));
  };
  w.line("// The groups' running (max, sum, weighted sum) of the merge of a workgroup per row.");
  w.line("FJ_LDS_ARRAY(float, lds_m, kThreads);");
  w.line("FJ_LDS_ARRAY(float, lds_l, kThreads);");
  w.line("FJ_LDS_ARRAY(float, lds_acc, kThreads);");
  w.open("if (col_threads == 1) {{");
  w.line("const long entry = long(fj_group_id_x()) * kThreads + fj_thread_id();");
  w.line("if (entry >= rows * kDimV)");
  w.line("  return;");
  w.line("const long row = entry / kDimV;");
  w.line("const int col = int(entry % kDimV);");
  fold_splits("0", "1");
  finish_row("col == 0");
  w.line("return;");
  w.close();
  w.line("const long row = long(fj_group_id_x());");
  w.line("const int tid = fj_thread_id();");
  // The merge, once per width: each a block with its width a constant.
  for (int cols : {kNarrowColThreads, kColThreads}) {
    if (cols == kNarrowColThreads) {
      w.open("if (col_threads == {}) {{", cols);
    } else {
      w.close("} else {");
      w.indent(1);
    }
    w.line("// kGroups groups of kCols work-items, each folding every kGroups-th split;");
    w.line("// then the first group folds the groups' results in order.");
    w.line("constexpr int kCols = {}, kGroups = kThreads / kCols;", cols);
    w.line("const int group = tid / kCols, lane = tid % kCols;");
    w.line("const int col = int(fj_group_id_y()) * kCols + lane;");
    fold_splits("group", "kGroups");
    w.line("lds_m[tid] = m;");
    w.line("lds_l[tid] = l;");
    w.line("lds_acc[tid] = acc;");
    w.line("fj_barrier();");
    w.open("if (tid < kCols) {{");
    w.line("m = -FJ_INF, l = 0.0f, acc = 0.0f;");
    w.line("#pragma unroll");
    w.line("for (int g = 0; g < kGroups; ++g)");
    w.line("  if (lds_m[g * kCols + tid] != -FJ_INF) // else a group of empty splits, or none");
    w.line("    fj_fold(m, l, acc, lds_m[g * kCols + tid], lds_l[g * kCols + tid], "
           "lds_acc[g * kCols + tid]);");
    finish_row("tid == 0 && fj_group_id_y() == 0");
    w.close();
  }
  w.close(); // the widths
  w.close(); // the kernel
  finish_direct_kernel(out, target, w, "merges split-KV partial results",
                       "a loop over the splits per output element");
  out.rules = "combine";
  out.lds_bytes = int(3 * kThreads * 4);
  return out;
}

} // namespace flashjit::lowering
