// The FlashAttention-2 backward pass as two tile-IR programs, deterministic by
// construction (no atomics): every gradient element is written by one workgroup.
//
// Before them a preprocess kernel (lowering::lower_backward_preprocess) writes,
// per query row, D = rowsum(dO * O) and L = LSE * log2(e) (+inf for a row that
// sees no key, so that its P below is 0).
//
// dQ, a workgroup per query block (rows are queries, as in the forward):
//   q, do = load Q, dO [q_block];  l, d = load L, D [q_block]  (#rows vectors)
//   for kb in kv blocks visible to q_block:
//     p  = exp2(mask(scale(q * k^T, scale*log2 e)) - l)       (the forward's P)
//     ds = p * (do * v^T - d)
//     dq += ds * k
//   dQ = dq * scale
//
// dK and dV, a workgroup per (KV block, query head), rows are keys and columns
// queries (the transposed problem, so that dK and dV accumulate in registers):
//   k, v = load K, V [kv_block]
//   for qb in query blocks that see a key of kv_block:
//     pt  = exp2(mask(scale(k * q^T, scale*log2 e)) - l)      (l, d: #cols vectors)
//     dst = pt * (v * do^T - d)
//     dv += pt * do;  dk += dst * q
//   dK, dV = dk * scale, dv       (f32, per query head: a reduce kernel sums the
//                                  heads of each KV head's group and converts;
//                                  in the dtype, into dK and dV themselves, where
//                                  backward_dkdv_direct: no group to sum)
//
// With score modifiers (softcap, ALiBi, score_mod, mask_mod) S is the forward's
// modified score and dS is multiplied by the modifier's derivative at the raw
// score (ir::score_derivative), the chain rule through the modifier.
#include "ir/build.h"

#include "ir/expr.h"

#include <numbers>

namespace flashjit::ir {

namespace {

struct Builder {
  Program &p;
  std::vector<Op> *body = nullptr; // inside a loop, else the program's body
  ValueId emit(OpKind k, std::vector<ValueId> operands, Type result, Attrs attrs = {}) {
    ValueId r = p.add_value(result);
    ops().push_back(Op{k, {r}, std::move(operands), std::move(attrs), {}, {}});
    return r;
  }
  void emit_void(OpKind k, std::vector<ValueId> operands, Attrs attrs = {}) {
    ops().push_back(Op{k, {}, std::move(operands), std::move(attrs), {}, {}});
  }
  std::vector<Op> &ops() { return body ? *body : p.body; }
};

enum class Kernel {
  dq,
  dkdv,       // f32 dK and dV per query head, which the reduce kernel sums
  dkdv_direct // dK and dV themselves, in the dtype (backward_dkdv_direct)
};

/// The tensors and scalars both backward programs share, in one order.
struct Params {
  Extent batches, heads, kv_heads, group;
  Extent seqlen_q, seqlen_k; // scalars, or per-batch sequences (packed rows)
  Extent grid_q, grid_k;     // the longest of each: what the grid covers
};

Params declare(Program &p, const AttentionSpec &spec, Kernel kernel) {
  auto scalar = [&](std::string name, ScalarType t) {
    p.scalars.push_back({name, t});
    return Extent::of(std::move(name));
  };
  Params s;
  s.batches = scalar("batches", ScalarType::i32);
  s.heads = scalar("heads", ScalarType::i32);
  s.kv_heads = scalar("kv_heads", ScalarType::i32);
  s.group = scalar("group", ScalarType::i32);
  // Varlen (packed rows): each batch's lengths are sequences read from
  // cu_seqlens, as in the forward; the grid covers the longest.
  s.seqlen_q = Extent::of("seqlen_q");
  s.seqlen_k = Extent::of("seqlen_k");
  const Sequences &seqs = spec.seqs;
  if (seqs.packed_q) {
    s.grid_q = scalar("max_seqlen_q", ScalarType::i32);
    p.indices.push_back("cu_seqlens_q");
    p.sequences.push_back({"seqlen_q", "cu_seqlens_q", "", scalar("total_q", ScalarType::i32)});
  } else {
    s.grid_q = scalar("seqlen_q", ScalarType::i32);
  }
  if (seqs.packed_k) {
    s.grid_k = scalar("max_seqlen_k", ScalarType::i32);
    p.indices.push_back("cu_seqlens_k");
    p.sequences.push_back({"seqlen_k", "cu_seqlens_k", "", scalar("total_k", ScalarType::i32)});
  } else {
    s.grid_k = scalar("seqlen_k", ScalarType::i32);
  }
  if (spec.signature().local) {
    scalar("window_left", ScalarType::i32);
    scalar("window_right", ScalarType::i32);
  }
  scalar("scale_log2", ScalarType::f32);
  scalar("scale", ScalarType::f32);
  declare_modifiers(spec, p);
  const KernelSignature sig = spec.signature();
  // name, prefix, dtype, kv heads?, rows, dim, unit dim, row alignment
  struct T {
    const char *name, *prefix;
    DType dtype;
    bool kv;
    bool keys;
    int64_t dim;
    bool unit;
    int64_t align;
  };
  std::vector<T> tensors = {
      {"Q", "q", spec.dtype, false, false, spec.head_dim_qk, sig.unit_dim[0], sig.row_align},
      {"K", "k", spec.dtype, true, true, spec.head_dim_qk, sig.unit_dim[1], sig.row_align},
      {"V", "v", spec.dtype, true, true, spec.head_dim_v, sig.unit_dim[2], sig.row_align},
      {"dO", "do", spec.dtype, false, false, spec.head_dim_v, sig.unit_dim[3], sig.row_align},
      {"L", "l", DType::f32, false, false, 0, true, 4},
      {"D", "d", DType::f32, false, false, 0, true, 4}};
  if (kernel == Kernel::dq) {
    tensors.push_back(
        {"dQ", "dq", spec.dtype, false, false, spec.head_dim_qk, sig.unit_dim[0], sig.row_align});
  } else if (kernel == Kernel::dkdv_direct) { // laid out as K and V
    tensors.push_back(
        {"dK", "dk", spec.dtype, true, true, spec.head_dim_qk, sig.unit_dim[1], sig.row_align});
    tensors.push_back(
        {"dV", "dv", spec.dtype, true, true, spec.head_dim_v, sig.unit_dim[2], sig.row_align});
  } else { // f32 per query head, dense: [batch, heads, seqlen_k, dim]
    tensors.push_back({"dK", "dk", DType::f32, false, true, spec.head_dim_qk, true, 4});
    tensors.push_back({"dV", "dv", DType::f32, false, true, spec.head_dim_v, true, 4});
  }
  for (const T &t : tensors) {
    TensorParam tp;
    tp.name = t.name;
    tp.dtype = t.dtype;
    tp.batch = s.batches;
    tp.heads = t.kv ? s.kv_heads : s.heads;
    tp.seq = t.keys ? s.seqlen_k : s.seqlen_q;
    tp.dim = t.dim;
    tp.stride_batch = scalar(fmt::format("{}_batch_stride", t.prefix), ScalarType::i64);
    tp.stride_head = scalar(fmt::format("{}_head_stride", t.prefix), ScalarType::i64);
    if (t.dim == 0) { // a vector: one value per row
      tp.stride_seq = Extent::constant(1);
      tp.stride_dim = Extent::constant(0);
    } else {
      tp.stride_seq = scalar(fmt::format("{}_seq_stride", t.prefix), ScalarType::i32);
      tp.stride_dim = t.unit ? Extent::constant(1)
                             : scalar(fmt::format("{}_dim_stride", t.prefix), ScalarType::i32);
    }
    tp.row_align = t.align;
    // Packed rows: Q, dO, dQ, L and D by cu_seqlens_q; K, V and the f32 dK/dV
    // per query head ([heads, total_k, dim]) by cu_seqlens_k.
    tp.packed = t.keys ? seqs.packed_k : seqs.packed_q;
    p.tensors.push_back(std::move(tp));
  }
  p.group = s.group;
  return s;
}

Expected<Program> build(const AttentionSpec &spec, const Config &config, Kernel kernel) {
  FJ_RETURN_IF_ERROR(validate_backward(spec));
  FJ_RETURN_IF_ERROR(validate(config));
  if (kernel != Kernel::dq && config.dkdv_passes == 0)
    return Status::error("config dkdv_passes 0 (the lowering's choice) reached the dK/dV program "
                         "unresolved: lowering::backward_dkdv_passes chooses 1 or 2");
  const KernelSignature sig = spec.signature();
  const DType dt = spec.dtype;
  const int64_t bm = config.block_m, bn = config.block_n;
  const int64_t dqk = padded(spec.head_dim_qk, config.pad_k);
  const int64_t dv = padded(spec.head_dim_v, config.pad_k);

  Program p;
  p.name = fmt::format("fa_bwd_{}_{}_d{}_{}{}{}{}{}",
                       kernel == Kernel::dq     ? "dq"
                       : kernel == Kernel::dkdv ? "dkdv"
                                                : "dkdv_direct",
                       dtype_name(dt), spec.head_dim_qk, spec.head_dim_v,
                       sig.causal ? "_causal" : "", sig.local ? "_local" : "",
                       sig.packed_q ? "_varlenq" : "", sig.packed_k ? "_varlenk" : "");
  const Params s = declare(p, spec, kernel);
  // Score modifiers: the forward's score function, and its derivative for the
  // chain rule (dS of the raw score = dS of the modified one * d mod / d score).
  const bool modified = spec.has_score_modifier();
  if (modified) {
    auto f = score_function(spec, p);
    if (!f)
      return f.status();
    auto e = parse_expr(*f, p.expr_scope(), "the score function");
    if (!e)
      return e.status();
    auto d = score_derivative(*e, p.expr_scope());
    if (!d)
      return d.status();
    p.functions.push_back({"score_mod", f.take()});
    p.functions.push_back({"score_grad", print_expr(*d)});
  }
  declare_dropout(spec, p);
  const bool dropout = spec.signature().dropout;
  p.config = {{"block_m", bm},
              {"block_n", bn},
              {"waves", config.waves},
              {"stages", config.stages},
              {"q_in_lds", int64_t(config.q_in_lds)},
              {"pad_k", config.pad_k}};
  if (config.mma_m)
    p.config["mma_m"] = config.mma_m;
  const bool dq = kernel == Kernel::dq;
  if (!dq && config.dkdv_passes == 2)
    p.config["dkdv_passes"] = int64_t{2};
  // Axis 0: the block of this workgroup's rows (queries for dQ, keys for dK/dV).
  const ValueId row_block = p.add_value(Type::index(), dq ? "q_block" : "kv_block");
  p.grid = {GridAxis{row_block, dq ? s.grid_q : s.grid_k, bm},
            GridAxis{p.add_value(Type::index(), "head"), s.heads, 1},
            GridAxis{p.add_value(Type::index(), "batch"), s.batches, 1}};

  Attrs mask_attrs = {{"causal", int64_t(sig.causal)}};
  if (sig.local) {
    mask_attrs["window_left"] = ParamRef{"window_left"};
    mask_attrs["window_right"] = ParamRef{"window_right"};
  }
  if (!dq)
    mask_attrs["transposed"] = int64_t{1};
  const Type s_type = Type::tile(bm, bn, DType::f32, TileLayout::mma_acc);
  const Type vec = Type::vec(dq ? bm : bn, DType::f32, dq ? TileLayout::rows : TileLayout::cols);
  auto load = [&](Builder &b, const char *tensor, ValueId idx, Type t) {
    return b.emit(OpKind::Load, {idx}, t, {{"tensor", Symbol{tensor}}});
  };
  auto a_tile = [&](int64_t rows, int64_t cols) {
    return Type::tile(rows, cols, dt, TileLayout::mma_a);
  };
  auto b_tile = [&](int64_t rows, int64_t cols) {
    return Type::tile(rows, cols, dt, TileLayout::mma_b);
  };
  auto acc = [&](int64_t cols) { return Type::tile(bm, cols, DType::f32, TileLayout::mma_acc); };

  Builder b{p};
  // The row block's operands, loaded once.
  const ValueId a0 = load(b, dq ? "Q" : "K", row_block, a_tile(bm, dqk));
  const ValueId a1 = load(b, dq ? "dO" : "V", row_block, a_tile(bm, dv));
  ValueId l_rows = -1, d_rows = -1;
  if (dq) {
    l_rows = load(b, "L", row_block, vec);
    d_rows = load(b, "D", row_block, vec);
  }
  // One loop over the column blocks, accumulating dQ, or dK and dV; with
  // config dkdv_passes 2 two loops, dV's then dK's.
  constexpr int kDq = 0, kDk = 1, kDv = 2; // which gradients a loop accumulates
  auto add_loop = [&](int grads) -> Expected<std::vector<ValueId>> {
    std::vector<Type> carried_types;
    std::vector<const char *> names;
    if (dq || (grads & kDk)) {
      carried_types.push_back(acc(dqk));
      names.push_back("grad");
    }
    if (grads & kDv) {
      carried_types.push_back(acc(dv));
      names.push_back("dv");
    }
    b.body = nullptr;
    std::vector<ValueId> inits;
    for (const Type &t : carried_types)
      inits.push_back(b.emit(OpKind::Fill, {}, t, {{"value", 0.0}}));
    Op loop{OpKind::For, {}, {row_block}, mask_attrs, {}, {}};
    loop.attrs["block_m"] = bm;
    loop.attrs["block_n"] = bn;
    add_block_range(spec, p, loop);
    loop.operands.insert(loop.operands.end(), inits.begin(), inits.end());
    const ValueId col_block = p.add_value(Type::index(), dq ? "kb" : "qb");
    loop.region_args = {col_block};
    for (size_t i = 0; i < carried_types.size(); ++i) {
      loop.region_args.push_back(p.add_value(carried_types[i], std::string(names[i]) + "_i"));
      loop.results.push_back(p.add_value(carried_types[i], names[i]));
    }
    b.body = &loop.body;
    // S (or S^T): the forward's scores in the log2 domain, masked.
    const ValueId x0 = load(b, dq ? "K" : "Q", col_block, b_tile(bn, dqk));
    const ValueId zero = b.emit(OpKind::Fill, {}, s_type, {{"value", 0.0}});
    const ValueId qk = b.emit(OpKind::MmaABt, {a0, x0, zero}, s_type);
    Attrs mod_attrs = {{"function", Symbol{"score_mod"}}};
    if (!dq)
      mod_attrs["transposed"] = int64_t{1};
    Attrs grad_attrs = mod_attrs;
    grad_attrs["function"] = Symbol{"score_grad"};
    if (modified) {
      FJ_RETURN_IF_ERROR(add_unmasked(spec, p, loop, mod_attrs, /*derivative=*/false));
      FJ_RETURN_IF_ERROR(add_unmasked(spec, p, loop, grad_attrs, /*derivative=*/true));
    }
    // The softmax's log2 domain, as the forward: the mask takes the scores
    // before the product by `factor`, which then feeds the subtraction of the
    // LSE directly (one fused multiply-add per element).
    ValueId raw = -1, sm = -1;
    Attr factor = ParamRef{"scale_log2"};
    if (modified) { // the modifiers see q.k * scale
      raw = b.emit(OpKind::Scale, {qk}, s_type, {{"factor", ParamRef{"scale"}}});
      const ValueId mod = b.emit(OpKind::ScoreMod, {raw, row_block, col_block}, s_type, mod_attrs);
      sm = b.emit(OpKind::Mask, {mod, row_block, col_block}, s_type, mask_attrs);
      factor = std::numbers::log2e;
    } else {
      sm = b.emit(OpKind::Mask, {qk, row_block, col_block}, s_type, mask_attrs);
    }
    const ValueId sc = b.emit(OpKind::Scale, {sm}, s_type, {{"factor", factor}});
    const ValueId l = dq ? l_rows : load(b, "L", col_block, vec);
    const OpKind sub = dq ? OpKind::SubRow : OpKind::SubCol;
    const ValueId pr = b.emit(OpKind::Exp2, {b.emit(sub, {sc, l}, s_type)}, s_type);
    // Dropout: O = (P o Z) V with Z the kept elements times 1 / (1 - p), so dV
    // takes P o Z and dS = P o (dP o Z - D) (D = rowsum(dO o O) of the dropped O).
    Attrs drop_attrs = {{"function", Symbol{"dropout"}}};
    if (!dq)
      drop_attrs["transposed"] = int64_t{1};
    auto operand = [&](ValueId x) { // an f32 accumulator as a 16-bit A operand
      const ValueId lo = b.emit(OpKind::Convert, {x}, Type::tile(bm, bn, dt, TileLayout::mma_acc));
      return b.emit(OpKind::ConvertLayout, {lo}, a_tile(bm, bn));
    };
    const bool grad_dk = dq || (grads & kDk); // dQ or dK: from dS
    ValueId kept = pr, ds = -1;
    if (grad_dk) {
      // dP (or dP^T) = dO V^T (V dO^T), then dS = P (dP - D).
      const ValueId x1 = load(b, dq ? "V" : "dO", col_block, b_tile(bn, dv));
      const ValueId zero2 = b.emit(OpKind::Fill, {}, s_type, {{"value", 0.0}});
      ValueId dp = b.emit(OpKind::MmaABt, {a1, x1, zero2}, s_type);
      const ValueId d = dq ? d_rows : load(b, "D", col_block, vec);
      if (dropout && !dq) {
        // One draw for both of dK/dV's uses: kept = P o Z weighs dO for dV, and
        // dS = P o (dP o Z - D) = kept o dP + P o (0 - D).
        kept = b.emit(OpKind::ScoreMod, {pr, row_block, col_block}, s_type, drop_attrs);
        const ValueId minus_d =
            b.emit(OpKind::SubCol, {b.emit(OpKind::Fill, {}, s_type, {{"value", 0.0}}), d}, s_type);
        ds = b.emit(
            OpKind::Add,
            {b.emit(OpKind::Mul, {kept, dp}, s_type), b.emit(OpKind::Mul, {pr, minus_d}, s_type)},
            s_type);
      } else {
        if (dropout)
          dp = b.emit(OpKind::ScoreMod, {dp, row_block, col_block}, s_type, drop_attrs);
        ds = b.emit(OpKind::Mul, {pr, b.emit(sub, {dp, d}, s_type)}, s_type);
      }
      if (modified) {
        ds = b.emit(OpKind::Mul,
                    {ds, b.emit(OpKind::ScoreMod, {raw, row_block, col_block}, s_type, grad_attrs)},
                    s_type);
      }
    }
    std::vector<ValueId> yields;
    ValueId gv = -1;
    if (grads & kDv) { // dV += (P o Z)^T dO
      if (dropout && kept == pr)
        kept = b.emit(OpKind::ScoreMod, {pr, row_block, col_block}, s_type, drop_attrs);
      const ValueId dot = load(b, "dO", col_block, b_tile(bn, dv));
      gv = b.emit(OpKind::MmaAB, {operand(kept), dot, loop.region_args.back()}, acc(dv));
    }
    if (grad_dk) { // dQ += dS K, or dK += dS^T Q
      const ValueId x2 = load(b, dq ? "K" : "Q", col_block, b_tile(bn, dqk));
      yields.push_back(b.emit(OpKind::MmaAB, {operand(ds), x2, loop.region_args[1]}, acc(dqk)));
    }
    if (gv >= 0)
      yields.push_back(gv);
    b.emit_void(OpKind::Yield, yields);
    b.body = nullptr;
    std::vector<ValueId> results = loop.results;
    p.body.push_back(std::move(loop));
    return results;
  };

  // dQ, and dK and dV where written directly, in the dtype; else f32.
  const bool narrow = kernel != Kernel::dkdv;
  auto store = [&](ValueId g, const char *tensor, const Type &t) {
    if (narrow)
      g = b.emit(OpKind::Convert, {g}, Type::tile(t.rows, t.cols, dt, TileLayout::mma_acc));
    b.emit_void(OpKind::Store, {g, row_block}, {{"tensor", Symbol{tensor}}});
  };
  auto store_grad = [&](ValueId g, const char *tensor, const Type &t) {
    // dQ and dK take the softmax scale of S = scale * Q K^T; dV does not.
    store(b.emit(OpKind::Scale, {g}, t, {{"factor", ParamRef{"scale"}}}), tensor, t);
  };
  if (dq) {
    auto r = add_loop(kDq);
    if (!r)
      return r.status();
    store_grad((*r)[0], "dQ", acc(dqk));
  } else if (config.dkdv_passes == 2) {
    auto rv = add_loop(kDv);
    if (!rv)
      return rv.status();
    store((*rv)[0], "dV", acc(dv));
    auto rk = add_loop(kDk);
    if (!rk)
      return rk.status();
    store_grad((*rk)[0], "dK", acc(dqk));
  } else {
    auto r = add_loop(kDk | kDv);
    if (!r)
      return r.status();
    store_grad((*r)[0], "dK", acc(dqk));
    store((*r)[1], "dV", acc(dv));
  }
  return p;
}

} // namespace

Status validate_backward(const AttentionSpec &spec) {
  FJ_RETURN_IF_ERROR(spec.validate());
  auto refuse = [](std::string_view what) {
    return Status::error("the backward pass does not take {} yet: compute this gradient another "
                         "way (e.g. PyTorch's SDPA), or drop the feature",
                         what);
  };
  if (spec.seqs.used_k || spec.seqs.paged())
    return refuse("KV-cache sequences (seqused_k, paged KV caches); varlen (cu_seqlens) is taken");
  if (spec.f32_io)
    return refuse("f32 tensors (f32_io; the forward takes them): pass bf16 or f16 tensors");
  return Status::ok();
}

Expected<Program> build_backward_dq(const AttentionSpec &spec, const Config &config) {
  return build(spec, config, Kernel::dq);
}

Expected<Program> build_backward_dkdv(const AttentionSpec &spec, const Config &config) {
  return build(spec, config, Kernel::dkdv);
}

Expected<Program> build_backward_dkdv_direct(const AttentionSpec &spec, const Config &config) {
  return build(spec, config, Kernel::dkdv_direct);
}

bool backward_dkdv_direct(const AttentionSpec &spec) {
  return spec.group() == 1 && !spec.seqs.packed_k;
}

Bindings bind_backward(const AttentionSpec &spec) {
  Bindings b;
  bind_shape(spec, b);
  b.set_real("scale_log2", spec.softmax_scale() * std::numbers::log2e);
  b.set_real("scale", spec.softmax_scale());
  bind_modifiers(spec, b);
  auto strides = [&](const char *prefix, const Strides &s) {
    b.set_int(fmt::format("{}_batch_stride", prefix), s.batch);
    b.set_int(fmt::format("{}_head_stride", prefix), s.head);
    b.set_int(fmt::format("{}_seq_stride", prefix), s.seq);
    b.set_int(fmt::format("{}_dim_stride", prefix), s.dim);
  };
  strides("q", spec.q);
  strides("k", spec.k);
  strides("v", spec.v);
  strides("do", spec.o); // dO is laid out as O
  strides("dq", spec.q); // dQ as Q
  const BackwardWorkspace ws = backward_workspace(spec);
  for (const char *vec : {"l", "d"}) { // dense [batch, heads, seqlen_q] or [heads, total_q]
    b.set_int(fmt::format("{}_batch_stride", vec), ws.rows.batch);
    b.set_int(fmt::format("{}_head_stride", vec), ws.rows.head);
  }
  const bool direct = backward_dkdv_direct(spec);
  strides("dk", direct ? spec.k : ws.dk); // dK and dV are laid out as K and V
  strides("dv", direct ? spec.v : ws.dv);
  return b;
}

BackwardWorkspace backward_workspace(const AttentionSpec &spec) {
  BackwardWorkspace w;
  // Packed rows are one batch of all the rows: [heads, total, ...].
  const int64_t batches_q = spec.q_batches(), sq = spec.q_rows();
  const int64_t batches_k = spec.seqs.packed_k ? 1 : spec.batch;
  const int64_t sk = spec.seqs.packed_k ? spec.seqs.total_k : spec.seqlen_k;
  const int64_t rows = batches_q * spec.heads * sq;
  w.rows = {batches_q == 1 ? 0 : spec.heads * sq, sq, 1, 0};
  w.d_offset = rows;
  w.dk_offset = (2 * rows + 3) / 4 * 4; // 16-byte aligned: the reduce reads runs of 4
  const int64_t dqk = spec.head_dim_qk, dv = spec.head_dim_v;
  w.dk = {batches_k == 1 ? 0 : spec.heads * sk * dqk, sk * dqk, dqk, 1};
  w.dv = {batches_k == 1 ? 0 : spec.heads * sk * dv, sk * dv, dv, 1};
  const bool direct = backward_dkdv_direct(spec); // no per-head dK and dV
  w.dv_offset = w.dk_offset + (direct ? 0 : batches_k * spec.heads * sk * dqk);
  w.elements = w.dv_offset + (direct ? 0 : batches_k * spec.heads * sk * dv);
  return w;
}

} // namespace flashjit::ir
