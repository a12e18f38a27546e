// build_attention(): FlashAttention-2's forward pass as a tile-IR program.
//
//   q = load Q[q_block]                          (BM x Dqk, padded to pad_k)
//   m = -inf, l = 0, acc = 0
//   for kb in kv blocks visible to q_block:       (fully masked blocks skipped)
//     s     = mask(scale(q * k^T, scale*log2 e))   (log2 domain)
//     m_new = max(m, row_max(s));  m0 = m_new with -inf -> 0
//     p     = exp2(s - m0);        alpha = exp2(m - m0)
//     l     = l * alpha + row_sum(p)
//     acc   = acc * alpha + convert(p) * v
//   O   = acc / l                                  (0 for a fully masked row)
//   LSE = (m + log2 l) * ln 2                      (-inf for a fully masked row)
#include "ir/build.h"

#include "ir/expr.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <numbers>
#include <optional>

namespace flashjit::ir {

std::string Config::summary() const {
  return fmt::format("block_m={} block_n={} waves={} stages={} q_in={} pad_k={}{}{}{}{}", block_m,
                     block_n, waves, stages, q_in_lds ? "lds" : "regs", pad_k,
                     mma_m ? fmt::format(" mma_m={}", mma_m) : "",
                     dkdv_passes == 2 ? " dkdv_passes=2" : "", persistent ? " persistent" : "",
                     prefetch_blocks ? " prefetch_blocks" : "");
}

Status validate(const Config &c) {
  auto positive = [](const char *name, int64_t v) -> Status {
    if (v < 1 || v > 4096)
      return Status::error("config {} = {} is out of range: expected 1..4096", name, v);
    return Status::ok();
  };
  FJ_RETURN_IF_ERROR(positive("block_m", c.block_m));
  FJ_RETURN_IF_ERROR(positive("block_n", c.block_n));
  FJ_RETURN_IF_ERROR(positive("waves", c.waves));
  // The rules know three loops: plain (1), K/V tiles issued one step ahead (2),
  // and a producer warpgroup filling a ring of two K/V copies (3, the sm90 forward).
  if (c.stages < 1 || c.stages > 3)
    return Status::error("config stages = {} is not a pipeline the kernels have: expected 1 "
                         "(no pipelining), 2 (each K/V tile's copy issued one step ahead) or 3 "
                         "(a producer warpgroup fills a ring of two K/V copies; the sm90 forward)",
                         c.stages);
  FJ_RETURN_IF_ERROR(positive("pad_k", c.pad_k));
  if (c.mma_m != 0 && c.mma_m != 16 && c.mma_m != 32)
    return Status::error("config mma_m = {} is not a matrix-instruction tile: expected 16, 32, or "
                         "0 to let the lowering choose",
                         c.mma_m);
  if (c.persistent && c.stages != 3)
    return Status::error("config persistent needs stages 3: the producer warpgroup walks the "
                         "tiles ahead of the consumers");
  if (c.prefetch_blocks && c.stages != 2)
    return Status::error("config prefetch_blocks needs stages 2 (got stages {}): it issues the "
                         "next block's K and V tiles one iteration ahead",
                         c.stages);
  if (c.dkdv_passes < 0 || c.dkdv_passes > 2)
    return Status::error("config dkdv_passes = {} is not a dK/dV program: expected 1 (one loop), "
                         "2 (dV's loop, then dK's) or 0 (the lowering's choice)",
                         c.dkdv_passes);
  return Status::ok();
}

bool visible(int64_t i, int64_t j, int64_t seqlen_q, int64_t seqlen_k, bool causal, Window w) {
  if (i < 0 || i >= seqlen_q || j < 0 || j >= seqlen_k)
    return false;
  const int64_t diag = i + (seqlen_k - seqlen_q); // the key on query i's bottom-right diagonal
  if (causal && j > diag)
    return false;
  if (w.left >= 0 && j < diag - w.left)
    return false;
  if (w.right >= 0 && j > diag + w.right)
    return false;
  return true;
}

BlockRange kv_block_range(int64_t qb, int64_t block_m, int64_t block_n, int64_t seqlen_q,
                          int64_t seqlen_k, bool causal, Window w, int64_t q_group) {
  // Rows, then (grouped rows) the positions they hold.
  int64_t first = qb * block_m;
  int64_t last = std::min(first + block_m, seqlen_q) - 1;
  if (last < first)
    return {0, 0};
  first /= q_group;
  last /= q_group;
  seqlen_q /= q_group;
  const int64_t off = seqlen_k - seqlen_q;
  // The visible keys of row i form [lo(i), hi(i)], both nondecreasing in i, so the
  // block's keys lie in [lo(first), hi(last)].
  int64_t lo = 0;
  if (w.left >= 0)
    lo = std::max<int64_t>(lo, first + off - w.left);
  int64_t hi = seqlen_k - 1;
  if (causal)
    hi = std::min(hi, last + off);
  if (w.right >= 0)
    hi = std::min(hi, last + off + w.right);
  if (hi < lo)
    return {0, 0};
  return {lo / block_n, hi / block_n + 1};
}

BlockRange q_block_range(int64_t kb, int64_t block_m, int64_t block_n, int64_t seqlen_q,
                         int64_t seqlen_k, bool causal, Window w) {
  const int64_t first = kb * block_m;
  const int64_t last = std::min(first + block_m, seqlen_k) - 1;
  if (last < first || seqlen_q < 1)
    return {0, 0};
  const int64_t off = seqlen_k - seqlen_q;
  // Query i sees the keys [lo(i), hi(i)], both nondecreasing in i: it sees a key
  // of [first, last] when hi(i) >= first and lo(i) <= last.
  int64_t lo = 0, hi = seqlen_q - 1;
  if (causal)
    lo = std::max(lo, first - off);
  if (w.right >= 0)
    lo = std::max(lo, first - off - w.right);
  if (w.left >= 0)
    hi = std::min(hi, last - off + w.left);
  if (hi < lo)
    return {0, 0};
  return {lo / block_n, hi / block_n + 1};
}

BlockRange split_range(BlockRange r, int64_t split, int64_t splits) {
  const int64_t chunk = (r.end - r.begin + splits - 1) / splits;
  const int64_t begin = std::min(r.begin + split * chunk, r.end);
  return {begin, std::min(begin + chunk, r.end)};
}

namespace {

struct Builder {
  Program &p;
  ValueId emit(OpKind k, std::vector<ValueId> operands, Type result, Attrs attrs = {}) {
    ValueId r = p.add_value(result);
    current().push_back(Op{k, {r}, std::move(operands), std::move(attrs), {}, {}});
    return r;
  }
  void emit_void(OpKind k, std::vector<ValueId> operands, Attrs attrs = {}) {
    current().push_back(Op{k, {}, std::move(operands), std::move(attrs), {}, {}});
  }
  std::vector<Op> &current() { return body_stack.back() ? *body_stack.back() : p.body; }
  std::vector<std::vector<Op> *> body_stack{nullptr};
};

/// The scalar parameters of one tensor's strides: {t}_batch_stride, ...
struct TensorScalars {
  std::string batch, head, seq, dim; // dim empty: unit dim stride
};

TensorScalars tensor_scalars(std::string_view t, bool unit_dim) {
  return {fmt::format("{}_batch_stride", t), fmt::format("{}_head_stride", t),
          fmt::format("{}_seq_stride", t), unit_dim ? "" : fmt::format("{}_dim_stride", t)};
}

constexpr const char *kTensorNames[] = {"Q", "K", "V", "O"};
constexpr const char *kTensorPrefixes[] = {"q", "k", "v", "o"};

} // namespace

void bind_shape(const AttentionSpec &spec, Bindings &b) {
  b.set_int("batches", spec.batch);
  b.set_int("heads", spec.heads);
  b.set_int("kv_heads", spec.kv_heads);
  b.set_int("group", spec.group());
  const Sequences &seqs = spec.seqs;
  if (seqs.packed_q) {
    b.set_int("max_seqlen_q", spec.seqlen_q);
    b.set_int("total_q", seqs.total_q);
  } else {
    b.set_int("seqlen_q", spec.seqlen_q);
  }
  if (seqs.packed_k || seqs.used_k)
    b.set_int("max_seqlen_k", spec.seqlen_k);
  else
    b.set_int("seqlen_k", spec.seqlen_k);
  if (seqs.packed_k)
    b.set_int("total_k", seqs.total_k);
  if (seqs.paged()) {
    b.set_int("page_table_stride", seqs.pages_per_seq);
    b.set_int("page_size", seqs.page_size);
    b.set_int("num_pages", seqs.num_pages);
  }
  // A window wider than both sequences hides nothing more; clamping keeps the
  // kernel's 32-bit index sums in range.
  const int64_t widest =
      std::max(spec.seqlen_q, seqs.total_q) + std::max(spec.seqlen_k, seqs.total_k);
  b.set_int("window_left", std::min(spec.window.left, widest));
  b.set_int("window_right", std::min(spec.window.right, widest));
}

Bindings bind_attention(const AttentionSpec &spec) {
  // The names of the stride parameters, in build_attention's order (no
  // formatting per call: this runs on every launch).
  static constexpr std::string_view kStrideNames[4][4] = {
      {"q_batch_stride", "q_head_stride", "q_seq_stride", "q_dim_stride"},
      {"k_batch_stride", "k_head_stride", "k_seq_stride", "k_dim_stride"},
      {"v_batch_stride", "v_head_stride", "v_seq_stride", "v_dim_stride"},
      {"o_batch_stride", "o_head_stride", "o_seq_stride", "o_dim_stride"}};
  Bindings b;
  bind_shape(spec, b);
  const Sequences &seqs = spec.seqs;
  b.set_real("scale_log2", spec.softmax_scale() * std::numbers::log2e);
  if (spec.has_score_modifier())
    b.set_real("scale", spec.softmax_scale());
  bind_modifiers(spec, b);
  const Strides *strides[] = {&spec.q, &spec.k, &spec.v, &spec.o};
  for (int i = 0; i < 4; ++i) {
    b.set_int(kStrideNames[i][0], strides[i]->batch);
    b.set_int(kStrideNames[i][1], strides[i]->head);
    b.set_int(kStrideNames[i][2], strides[i]->seq);
    b.set_int(kStrideNames[i][3], strides[i]->dim);
  }
  // LSE is [batch, heads, seqlen_q], or [heads, total_q] for packed queries;
  // with grouped rows the same memory as [batch, heads, positions, q_group].
  b.set_int("lse_batch_stride", seqs.packed_q ? 0 : spec.heads * spec.seqlen_q);
  b.set_int("lse_head_stride", spec.q_rows());
  if (spec.q_group > 1) {
    b.set_int("q_group", spec.q_group);
    b.set_int("q_group_stride", spec.q.group);
    b.set_int("o_group_stride", spec.o.group);
    b.set_int("lse_group_stride", spec.seqlen_q / spec.q_group);
  }
  return b;
}

SplitWorkspace split_workspace(const AttentionSpec &spec, int64_t splits) {
  const int64_t rows = spec.batch * spec.heads * spec.seqlen_q;
  return {splits * rows * spec.head_dim_v, splits * rows};
}

Bindings bind_split_kv(const AttentionSpec &spec, int64_t splits) {
  Bindings b = bind_attention(spec);
  b.set_int("num_splits", splits);
  const int64_t dv = spec.head_dim_v;
  b.set_int("o_batch_stride", spec.heads * spec.seqlen_q * dv);
  b.set_int("o_head_stride", spec.seqlen_q * dv);
  b.set_int("o_seq_stride", dv);
  b.set_int("o_dim_stride", 1);
  b.set_int("o_split_stride", spec.batch * spec.heads * spec.seqlen_q * dv);
  b.set_int("lse_batch_stride", spec.heads * spec.seqlen_q);
  b.set_int("lse_head_stride", spec.seqlen_q);
  b.set_int("lse_split_stride", spec.batch * spec.heads * spec.seqlen_q);
  return b;
}

void declare_modifiers(const AttentionSpec &spec, Program &p) {
  if (spec.softcap > 0)
    p.scalars.push_back({"softcap", ScalarType::f32});
  if (spec.alibi != Alibi::none)
    p.arrays.push_back({"alibi_slopes"});
  if (spec.mask == MaskType::none)
    return;
  const ArrayElement element = spec.mask == MaskType::boolean ? ArrayElement::u8
                               : spec.mask == MaskType::f16   ? ArrayElement::f16
                               : spec.mask == MaskType::bf16  ? ArrayElement::bf16
                                                              : ArrayElement::f32;
  p.arrays.push_back({"attn_mask", element});
  // Its block summary (lowering/mask_blocks.cpp), which the block-range pass reads.
  p.arrays.push_back({"attn_mask_blocks", ArrayElement::u8});
  for (const char *axis : {"batch", "head", "q", "k"})
    p.scalars.push_back({fmt::format("mask_{}_stride", axis), ScalarType::i64});
}

void declare_dropout(const AttentionSpec &spec, Program &p) {
  if (!spec.signature().dropout)
    return;
  p.scalars.push_back({"dropout_p", ScalarType::f32});
  p.scalars.push_back({"dropout_scale", ScalarType::f32});
  p.scalars.push_back({"dropout_seed", ScalarType::i64});
  p.scalars.push_back({"dropout_offset", ScalarType::i64});
  p.functions.push_back({"dropout", "((uniform(dropout_seed, dropout_offset, b, h, q_idx, "
                                    "kv_idx) >= dropout_p) ? (score * dropout_scale) : 0.0)"});
}

void bind_modifiers(const AttentionSpec &spec, Bindings &b) {
  if (spec.softcap > 0)
    b.set_real("softcap", spec.softcap);
  if (spec.dropout_p > 0) { // the kernels compare in f32: bind the f32 value
    b.set_real("dropout_p", double(float(spec.dropout_p)));
    b.set_real("dropout_scale", 1.0 / (1.0 - spec.dropout_p));
    b.set_int("dropout_seed", int64_t(spec.dropout_seed));
    b.set_int("dropout_offset", int64_t(spec.dropout_offset));
  }
  if (spec.mask == MaskType::none)
    return;
  b.set_int("mask_batch_stride", spec.mask_strides.batch);
  b.set_int("mask_head_stride", spec.mask_strides.head);
  b.set_int("mask_q_stride", spec.mask_strides.q);
  b.set_int("mask_k_stride", spec.mask_strides.k);
}

Expected<std::string> score_function(const AttentionSpec &spec, const Program &p,
                                     bool with_mask_mod, bool with_mask_tensor) {
  const ExprScope scope = p.expr_scope();
  auto parse = [&](std::string_view text, std::string_view what) {
    return parse_expr(text, scope, what);
  };
  Expected<Expr> e = parse("score", "score");
  auto wrap = [&](std::string_view text, std::string_view what) -> Status {
    auto outer = parse(text, what);
    if (!outer)
      return outer.status();
    e = substitute_score(*outer, *e);
    return Status::ok();
  };
  if (spec.softcap > 0)
    // A product by 1 / softcap, which the device compiler computes once per kernel
    // (a division per score cost 2x at D = 64 on the H200: bench/results/README.md).
    FJ_RETURN_IF_ERROR(wrap("softcap * tanh(score * (1.0 / softcap))", "softcap"));
  if (spec.alibi != Alibi::none)
    FJ_RETURN_IF_ERROR(
        wrap(spec.alibi == Alibi::heads
                 ? "score - alibi_slopes[h] * abs(q_idx + seqlen_k - seqlen_q - kv_idx)"
                 : "score - alibi_slopes[b * heads + h] * "
                   "abs(q_idx + seqlen_k - seqlen_q - kv_idx)",
             "alibi"));
  if (!spec.score_mod.empty())
    FJ_RETURN_IF_ERROR(wrap(spec.score_mod, "score_mod"));
  if (e->is_int) // an integer score_mod (e.g. "kv_idx") is still a score
    FJ_RETURN_IF_ERROR(wrap("score * 1.0", "score_mod"));
  if (with_mask_tensor && spec.mask != MaskType::none) {
    // 64-bit index arithmetic: the strides are i64 scalars. A tile's rows and
    // columns past the lengths (masked anyway) read no element: the mask holds
    // only [seqlen_q, seqlen_k] per head.
    const std::string inside = "q_idx < seqlen_q && kv_idx < seqlen_k";
    const std::string element(kMaskElement);
    FJ_RETURN_IF_ERROR(wrap(spec.mask == MaskType::boolean
                                ? "(" + inside + " && " + element + " != 0) ? score : -inf"
                                : "score + ((" + inside + ") ? " + element + " : 0)",
                            "mask"));
  }
  if (with_mask_mod && !spec.mask_mod.empty())
    FJ_RETURN_IF_ERROR(wrap("(" + spec.mask_mod + ") ? score : -inf", "mask_mod"));
  return print_expr(*e);
}

namespace {

/// How far (log2 units) a block's max may pass the online softmax's running max
/// before it moves (ir `running_max`): the weights exp2(s - max) stay below 256,
/// exact in f32 and in range for bf16/f16, and the accumulator is rescaled only
/// on the few blocks that move it (FlashAttention-4 keeps a stale max the same
/// way).
constexpr double kMaxSlack = 8.0;

/// Whether every node of `e` is an integer: what the block-range pass bounds
/// (f32 rounding and array elements have no static bounds).
bool integer_throughout(const Expr &e) {
  if (!e.is_int || e.kind == Expr::Kind::load)
    return false;
  for (const Expr &a : e.args)
    if (!integer_throughout(a))
      return false;
  return true;
}

} // namespace

namespace {

/// The mask_mod as the block-range pass bounds it: an integer expression, else none.
std::optional<Expr> bounded_mask_mod(const AttentionSpec &spec, const Program &p) {
  if (spec.mask_mod.empty())
    return std::nullopt;
  auto e = parse_expr(spec.mask_mod, p.expr_scope(), "mask_mod");
  if (!e || !integer_throughout(*e))
    return std::nullopt;
  return e.take();
}

} // namespace

void add_block_range(const AttentionSpec &spec, Program &p, Op &loop) {
  const std::optional<Expr> mod = bounded_mask_mod(spec, p);
  const bool tensor = spec.mask != MaskType::none;
  if (!mod && !tensor)
    return; // nothing the intervals could bound: no scan
  // A mask tensor alone: the function keeps every pair, its summary does the rest.
  if (!p.function("mask_range"))
    p.functions.push_back({"mask_range", mod ? print_expr(*mod) : "1"});
  loop.attrs["range"] = Symbol{"mask_range"};
  if (tensor)
    loop.attrs["blocks"] = Symbol{"attn_mask_blocks"};
}

Status add_unmasked(const AttentionSpec &spec, Program &p, const Op &loop, Attrs &mod_attrs,
                    bool derivative) {
  if (!loop.attrs.count("range"))
    return Status::ok();
  const char *name = derivative ? "score_grad_unmasked" : "score_unmasked";
  if (!p.function(name)) {
    // Without what the block's class covers: the mask_mod where the range bounds
    // it, the mask tensor where its summary does.
    auto f = score_function(spec, p, /*with_mask_mod=*/!bounded_mask_mod(spec, p),
                            /*with_mask_tensor=*/!loop.attrs.count("blocks"));
    if (!f)
      return f.status();
    std::string text = f.take();
    if (derivative) {
      auto e = parse_expr(text, p.expr_scope(), "the score function");
      if (!e)
        return e.status();
      auto d = score_derivative(*e, p.expr_scope());
      if (!d)
        return d.status();
      text = print_expr(*d);
    }
    p.functions.push_back({name, std::move(text)});
  }
  mod_attrs["unmasked"] = Symbol{name};
  mod_attrs["range"] = loop.attrs.at("range");
  if (loop.attrs.count("blocks"))
    mod_attrs["blocks"] = loop.attrs.at("blocks");
  return Status::ok();
}

namespace {

Expected<Program> build(const AttentionSpec &spec, const Config &config, bool split_kv) {
  FJ_RETURN_IF_ERROR(spec.validate());
  FJ_RETURN_IF_ERROR(validate(config));
  if (split_kv && spec.sinks)
    return Status::error("split-KV's partial kernel with attention sinks is not built: each split "
                         "would count the sink (the combine counts it once: build the split "
                         "kernels without sinks)");
  if (spec.sinks && spec.q_group > 1)
    return Status::error("grouped query rows with attention sinks are not built: a row's sink is "
                         "its head's, which the program's head is not (split-KV's combine counts "
                         "them: build the split kernels without sinks)");
  if (split_kv && spec.seqs.packed_q)
    return Status::error("split-KV with packed queries (cu_seqlens_q) is not built: its "
                         "workspace and combine are dense in the query rows; use num_splits = 1");

  const KernelSignature sig = spec.signature();
  const DType dt = spec.dtype;
  const int64_t bm = config.block_m, bn = config.block_n;
  const int64_t dqk = padded(spec.head_dim_qk, config.pad_k);
  const int64_t dv = padded(spec.head_dim_v, config.pad_k);

  Program p;
  const bool lse = sig.lse || split_kv; // a split's LSE weighs it in the combine
  p.name = fmt::format(
      "fa_fwd_{}{}_d{}_{}{}{}{}{}{}{}{}{}", dtype_name(dt), sig.f32_io ? "_f32io" : "",
      spec.head_dim_qk, spec.head_dim_v, sig.causal ? "_causal" : "", sig.local ? "_local" : "",
      sig.packed_q ? "_varlenq" : "", sig.packed_k ? "_varlenk" : "", sig.used_k ? "_seqused" : "",
      sig.paged ? "_paged" : "", sig.grouped_q ? "_grouped" : "",
      split_kv  ? "_splitkv"
      : sig.lse ? "_lse"
                : "");
  auto scalar = [&](std::string name, ScalarType t) {
    p.scalars.push_back({name, t});
    return Extent::of(std::move(name));
  };
  const Extent batches = scalar("batches", ScalarType::i32);
  const Extent heads = scalar("heads", ScalarType::i32);
  const Extent kv_heads = scalar("kv_heads", ScalarType::i32); // sizes K and V only
  const Extent group = scalar("group", ScalarType::i32);
  // The sequence lengths: scalars, or per-batch sequences read from index arrays
  // (varlen, KV caches) under the same names, so masks and loops read them alike.
  const Sequences &seqs = spec.seqs;
  const Extent seqlen_q = Extent::of("seqlen_q"), seqlen_k = Extent::of("seqlen_k");
  Extent q_grid = seqlen_q;
  if (seqs.packed_q) {
    q_grid = scalar("max_seqlen_q", ScalarType::i32);
    p.indices.push_back("cu_seqlens_q");
    p.sequences.push_back({"seqlen_q", "cu_seqlens_q", "", scalar("total_q", ScalarType::i32)});
  } else {
    scalar("seqlen_q", ScalarType::i32);
  }
  if (seqs.packed_k || seqs.used_k) {
    const Extent capacity = seqs.packed_k ? scalar("total_k", ScalarType::i32)
                                          : scalar("max_seqlen_k", ScalarType::i32);
    Sequence k{"seqlen_k", "", "", capacity};
    if (seqs.packed_k) {
      p.indices.push_back("cu_seqlens_k");
      k.starts = "cu_seqlens_k";
    }
    if (seqs.used_k) {
      p.indices.push_back("seqused_k");
      k.used = "seqused_k";
    }
    p.sequences.push_back(std::move(k));
  } else {
    scalar("seqlen_k", ScalarType::i32);
  }
  TensorParam::Pages pages;
  if (seqs.paged()) {
    p.indices.push_back("block_table");
    pages = {"block_table", scalar("page_table_stride", ScalarType::i32),
             scalar("page_size", ScalarType::i32), scalar("num_pages", ScalarType::i32)};
  }
  if (sig.local) {
    scalar("window_left", ScalarType::i32);
    scalar("window_right", ScalarType::i32);
  }
  scalar("scale_log2", ScalarType::f32);
  const bool modified = spec.has_score_modifier();
  if (modified) {
    scalar("scale", ScalarType::f32);
    declare_modifiers(spec, p);
    auto f = score_function(spec, p);
    if (!f)
      return f.status();
    p.functions.push_back({"score_mod", f.take()});
  }
  declare_dropout(spec, p);
  if (spec.sinks) { // the running max and sum start from the sink's logit (log2 domain)
    p.arrays.push_back({"sinks"});
    p.functions.push_back({"sink_max", "(sinks[h] * 1.44269504)"});
    p.functions.push_back({"sink_sum", "((sinks[h] > (-inf)) ? 1.0 : 0.0)"});
  }
  const Extent num_splits = split_kv ? scalar("num_splits", ScalarType::i32) : Extent{};
  // Grouped query rows (AttentionSpec::q_group): Q's, and O's and the LSE's
  // where they are the caller's (not a split's workspace), address row r as
  // (r / q_group, r % q_group).
  const Extent q_group = sig.grouped_q ? scalar("q_group", ScalarType::i32) : Extent::constant(1);
  auto group_rows = [&](TensorParam &t, const char *prefix) {
    if (!sig.grouped_q)
      return;
    t.row_group = q_group;
    t.stride_group = scalar(fmt::format("{}_group_stride", prefix), ScalarType::i64);
  };
  for (int i = 0; i < 4; ++i) {
    const TensorScalars names = tensor_scalars(kTensorPrefixes[i], sig.unit_dim[i]);
    const bool kv = i == 1 || i == 2;
    TensorParam t;
    t.name = kTensorNames[i];
    t.dtype = sig.f32_io ? DType::f32 : dt; // f32 tensors load narrowed to dt
    t.batch = batches;
    // K and V have heads / group heads; the kernel indexes them by head / group.
    t.heads = kv ? kv_heads : heads;
    t.seq = i == 0 || i == 3 ? seqlen_q : seqlen_k;
    t.dim = i < 2 ? spec.head_dim_qk : spec.head_dim_v;
    t.stride_batch = scalar(names.batch, ScalarType::i64);
    t.stride_head = scalar(names.head, ScalarType::i64);
    // A row stride fits 32 bits (AttentionSpec::validate); offsets are 64-bit.
    t.stride_seq = scalar(names.seq, ScalarType::i32);
    t.stride_dim = names.dim.empty() ? Extent::constant(1) : scalar(names.dim, ScalarType::i32);
    t.row_align = sig.row_align;
    t.packed = kv ? seqs.packed_k : seqs.packed_q;
    if (kv)
      t.pages = pages;
    if (split_kv && i == 3) { // the f32 partial outputs in the workspace
      t.dtype = DType::f32;
      t.stride_split = scalar("o_split_stride", ScalarType::i64);
      t.row_align = 4;
    }
    if (i == 0 || (i == 3 && !split_kv))
      group_rows(t, kTensorPrefixes[i]);
    p.tensors.push_back(std::move(t));
  }
  if (lse) {
    TensorParam t{"LSE",
                  DType::f32,
                  batches,
                  heads,
                  seqlen_q,
                  0,
                  scalar("lse_batch_stride", ScalarType::i64),
                  scalar("lse_head_stride", ScalarType::i64),
                  Extent::constant(1),
                  Extent::constant(0)};
    t.row_align = 4;
    t.packed = seqs.packed_q;
    if (split_kv)
      t.stride_split = scalar("lse_split_stride", ScalarType::i64);
    else
      group_rows(t, "lse");
    p.tensors.push_back(std::move(t));
  }
  p.group = group;
  p.config = {{"block_m", bm},
              {"block_n", bn},
              {"waves", config.waves},
              {"stages", config.stages},
              {"q_in_lds", int64_t(config.q_in_lds)},
              {"pad_k", config.pad_k}};
  if (config.mma_m)
    p.config["mma_m"] = config.mma_m;
  if (config.persistent)
    p.config["persistent"] = int64_t{1};
  if (config.prefetch_blocks)
    p.config["prefetch_blocks"] = int64_t{1};
  const ValueId q_block = p.add_value(Type::index(), "q_block");
  p.grid = {GridAxis{q_block, q_grid, bm}, GridAxis{p.add_value(Type::index(), "head"), heads, 1},
            GridAxis{p.add_value(Type::index(), "batch"), batches, 1}};
  if (split_kv)
    p.grid.push_back(GridAxis{p.add_value(Type::index(), "split"), num_splits, 1});

  const Type row = Type::vec(bm, DType::f32);
  const Type s_type = Type::tile(bm, bn, DType::f32, TileLayout::mma_acc);
  const Type acc_type = Type::tile(bm, dv, DType::f32, TileLayout::mma_acc);
  const double inf = std::numeric_limits<double>::infinity();
  Attrs mask_attrs = {{"causal", int64_t(sig.causal)}};
  if (sig.local) {
    mask_attrs["window_left"] = ParamRef{"window_left"};
    mask_attrs["window_right"] = ParamRef{"window_right"};
  }
  if (sig.grouped_q)
    mask_attrs["q_group"] = ParamRef{"q_group"};

  Builder b{p};
  const ValueId q = b.emit(OpKind::Load, {q_block}, Type::tile(bm, dqk, dt, TileLayout::mma_a),
                           {{"tensor", Symbol{"Q"}}});
  const ValueId m0 = spec.sinks ? b.emit(OpKind::Fill, {}, row, {{"function", Symbol{"sink_max"}}})
                                : b.emit(OpKind::Fill, {}, row, {{"value", -inf}});
  const ValueId l0 = spec.sinks ? b.emit(OpKind::Fill, {}, row, {{"function", Symbol{"sink_sum"}}})
                                : b.emit(OpKind::Fill, {}, row, {{"value", 0.0}});
  const ValueId acc0 = b.emit(OpKind::Fill, {}, acc_type, {{"value", 0.0}});

  // The loop over KV blocks; its results are the final m, l and acc.
  Op loop{OpKind::For, {}, {q_block, m0, l0, acc0}, mask_attrs, {}, {}};
  loop.attrs["block_m"] = bm;
  loop.attrs["block_n"] = bn;
  add_block_range(spec, p, loop);
  if (split_kv)
    loop.attrs["splits"] = ParamRef{"num_splits"};
  const ValueId m = p.add_value(row, "m"), l = p.add_value(row, "l"),
                acc = p.add_value(acc_type, "acc");
  loop.results = {m, l, acc};
  const ValueId kb = p.add_value(Type::index(), "kb");
  const ValueId m_i = p.add_value(row, "m_i"), l_i = p.add_value(row, "l_i"),
                acc_i = p.add_value(acc_type, "acc_i");
  loop.region_args = {kb, m_i, l_i, acc_i};
  b.body_stack.push_back(&loop.body);
  {
    const ValueId k = b.emit(OpKind::Load, {kb}, Type::tile(bn, dqk, dt, TileLayout::mma_b),
                             {{"tensor", Symbol{"K"}}});
    const ValueId zero = b.emit(OpKind::Fill, {}, s_type, {{"value", 0.0}});
    const ValueId qk = b.emit(OpKind::MmaABt, {q, k, zero}, s_type);
    // The softmax runs in the log2 domain: on the scores times `factor` (> 0:
    // the spec refuses other scales). The mask and the row max take the scores
    // before that product, so the one multiply left per element feeds the
    // subtraction of the max directly (one fused multiply-add); the max is
    // scaled per row, and equals the max of the scaled scores (rounding is
    // monotone).
    ValueId raw;
    Attr factor = ParamRef{"scale_log2"};
    if (modified) { // modifiers see q.k * scale
      // Masks alone (mask_mod, a bool mask tensor) commute with the product by
      // the scale (> 0): they take q.k, and the softmax keeps its one product
      // by scale_log2 (the extra product per score cost 15% at D = 64 on the
      // H100: bench/results/README.md).
      const bool masks_only = spec.softcap <= 0 && spec.alibi == Alibi::none &&
                              spec.score_mod.empty() &&
                              (spec.mask == MaskType::none || spec.mask == MaskType::boolean);
      const ValueId scaled =
          masks_only ? qk : b.emit(OpKind::Scale, {qk}, s_type, {{"factor", ParamRef{"scale"}}});
      Attrs mod_attrs = {{"function", Symbol{"score_mod"}}};
      FJ_RETURN_IF_ERROR(add_unmasked(spec, p, loop, mod_attrs, /*derivative=*/false));
      raw = b.emit(OpKind::ScoreMod, {scaled, q_block, kb}, s_type, mod_attrs);
      if (!masks_only)
        factor = std::numbers::log2e;
    } else {
      raw = qk;
    }
    const ValueId sm = b.emit(OpKind::Mask, {raw, q_block, kb}, s_type, mask_attrs);
    const ValueId rmax =
        b.emit(OpKind::Scale, {b.emit(OpKind::RowMax, {sm}, row)}, row, {{"factor", factor}});
    // The running max moves only where a block's max passes it by more than
    // the slack, so most blocks skip the rescale. Not with dropout in f16: its
    // kept weights, scaled by 1 / (1 - p), could pass f16's range.
    const double slack = spec.signature().dropout && dt == DType::f16 ? 0.0 : kMaxSlack;
    const ValueId m_new = b.emit(OpKind::RunningMax, {m_i, rmax}, row, {{"slack", slack}});
    const ValueId m_safe = b.emit(OpKind::ZeroIfNegInf, {m_new}, row);
    const ValueId s = b.emit(OpKind::Scale, {sm}, s_type, {{"factor", factor}});
    const ValueId p_f32 =
        b.emit(OpKind::Exp2, {b.emit(OpKind::SubRow, {s, m_safe}, s_type)}, s_type);
    const ValueId alpha = b.emit(OpKind::Exp2, {b.emit(OpKind::Sub, {m_i, m_safe}, row)}, row);
    const ValueId l_new =
        b.emit(OpKind::Add,
               {b.emit(OpKind::Mul, {l_i, alpha}, row), b.emit(OpKind::RowSum, {p_f32}, row)}, row);
    const ValueId acc_scaled = b.emit(OpKind::MulRow, {acc_i, alpha}, acc_type);
    // Dropout weighs V with the kept probabilities; the sums above are without it.
    const ValueId p_kept = spec.signature().dropout
                               ? b.emit(OpKind::ScoreMod, {p_f32, q_block, kb}, s_type,
                                        {{"function", Symbol{"dropout"}}})
                               : p_f32;
    const ValueId p_lo =
        b.emit(OpKind::Convert, {p_kept}, Type::tile(bm, bn, dt, TileLayout::mma_acc));
    const ValueId p_a =
        b.emit(OpKind::ConvertLayout, {p_lo}, Type::tile(bm, bn, dt, TileLayout::mma_a));
    const ValueId v = b.emit(OpKind::Load, {kb}, Type::tile(bn, dv, dt, TileLayout::mma_b),
                             {{"tensor", Symbol{"V"}}});
    const ValueId acc_new = b.emit(OpKind::MmaAB, {p_a, v, acc_scaled}, acc_type);
    b.emit_void(OpKind::Yield, {m_new, l_new, acc_new});
  }
  b.body_stack.pop_back();
  p.body.push_back(std::move(loop));

  const ValueId o = b.emit(OpKind::DivRow, {acc, l}, acc_type);
  if (split_kv || sig.f32_io) { // the f32 partials of a split, or f32 outputs
    b.emit_void(OpKind::Store, {o, q_block}, {{"tensor", Symbol{"O"}}});
  } else {
    const ValueId o_lo = b.emit(OpKind::Convert, {o}, Type::tile(bm, dv, dt, TileLayout::mma_acc));
    b.emit_void(OpKind::Store, {o_lo, q_block}, {{"tensor", Symbol{"O"}}});
  }
  if (lse) {
    const ValueId lse2 = b.emit(OpKind::Add, {m, b.emit(OpKind::Log2, {l}, row)}, row);
    const ValueId lse = b.emit(OpKind::Scale, {lse2}, row, {{"factor", std::numbers::ln2}});
    b.emit_void(OpKind::Store, {lse, q_block}, {{"tensor", Symbol{"LSE"}}});
  }
  return p;
}

} // namespace

Expected<Program> build_attention(const AttentionSpec &spec, const Config &config) {
  return build(spec, config, false);
}

bool has_block_range(const AttentionSpec &spec, const Config &config) {
  if (spec.mask_mod.empty() && spec.mask == MaskType::none)
    return false;
  Expected<Program> p = build_attention(spec, config);
  if (!p)
    return false;
  std::function<bool(const std::vector<Op> &)> any = [&](const std::vector<Op> &ops) {
    for (const Op &op : ops)
      if (op.attrs.count("range") || any(op.body))
        return true;
    return false;
  };
  return any(p->body);
}

Expected<Program> build_split_kv(const AttentionSpec &spec, const Config &config) {
  return build(spec, config, true);
}

} // namespace flashjit::ir
