// The emitter's KV loop: loop-carried values, the barriers across the back
// edge, and the software pipeline of the staged tiles (lowering/emitter.h).
#include "lowering/emitter.h"

#include "ir/expr.h"
#include "ir/interval.h"

namespace flashjit::lowering::emit {

void KernelEmitter::emit_copy(ValueId, const std::string &dst, ValueId src) {
  const Type &t = type(src);
  const std::string d = open_elements(t, dst);
  w_.line("{} = {};", d, t.is_vector() ? name(src) + "[qt][s]" : name(src) + "[qt][c][e]");
  close_elements(t);
}

// With config stages >= 2 the loop's LDS tiles are pipelined: tile i+1 is issued
// as soon as tile i is complete (after its barrier), the first tile of the next
// block as soon as the last tile of this one is. That is safe when every tile is
// read only between its own barrier and the next tile's, which holds when each
// tile's consumer comes before the next tile's load; otherwise nothing is pipelined.
bool KernelEmitter::plan_pipeline(const Op &loop) {
  const ir::Attrs &cfg = p_.config;
  if (!cfg.count("stages") || std::get<int64_t>(cfg.at("stages")) < 2)
    return false;
  std::vector<size_t> loads;
  for (size_t i = 0; i < loop.body.size(); ++i)
    if (loop.body[i].kind == OpKind::Load &&
        type(loop.body[i].results[0]).layout == TileLayout::mma_b)
      loads.push_back(i);
  if (loads.empty())
    return false;
  for (size_t n = 0; n < loads.size(); ++n) {
    const size_t end = n + 1 < loads.size() ? loads[n + 1] : loop.body.size();
    bool consumed = false;
    for (size_t i = loads[n] + 1; i < end; ++i)
      for (ValueId v : loop.body[i].operands)
        consumed = consumed || v == loop.body[loads[n]].results[0];
    if (!consumed)
      return false;
  }
  pipeline_order_.clear();
  pipelined_loads_.clear();
  for (size_t i : loads) {
    pipeline_order_.push_back(&loop.body[i]);
    pipelined_loads_.insert(&loop.body[i]);
  }
  return true;
}

// With warpgroup products and two query tiles per wave, the KV loop's body is
// written in two passes, one per tile, so that one tile's softmax runs while the
// tensor cores work on the other tile's product (FlashAttention-3's overlap,
// with the two tiles of one warpgroup in place of two warpgroups):
//   issue S_0, S_1 | wait S_0: softmax 0 | wait S_1: stage V, issue O_0 |
//   softmax 1 | issue O_1 | wait both
// It applies to a body of one S product (mma_abt), one O product (mma_ab) after
// it, and between them elementwise ops, reductions and the staged V tile.
bool KernelEmitter::plan_interleave(const Op &loop, size_t &s_at, size_t &o_at) const {
  if (!rules_.warpgroup_products() || q_tiles_ != 2 || loop.int_attr("transposed") != 0)
    return false;
  s_at = o_at = loop.body.size();
  for (size_t i = 0; i < loop.body.size(); ++i) {
    const OpKind k = loop.body[i].kind;
    if (k == OpKind::MmaABt) {
      if (s_at != loop.body.size())
        return false;
      s_at = i;
    } else if (k == OpKind::MmaAB) {
      if (o_at != loop.body.size() || s_at == loop.body.size())
        return false;
      o_at = i;
    } else if (k == OpKind::For || k == OpKind::Store) {
      return false;
    }
  }
  if (o_at == loop.body.size())
    return false;
  for (size_t i = s_at + 1; i < o_at; ++i) {
    const Op &op = loop.body[i];
    if (op.kind == OpKind::Load && type(op.results[0]).layout != TileLayout::mma_b)
      return false; // only staged tiles load between the products
    if (op.kind == OpKind::Load && consumer_of(op.results[0], loop.body) != &loop.body[o_at])
      return false;
  }
  return true;
}

Status KernelEmitter::emit_interleaved(const Op &loop, size_t s_at, size_t o_at) {
  const std::vector<Op> &body = loop.body;
  auto emit = [&](const Op &op) {
    for (ValueId r : op.results)
      def_of_[r] = &op;
    return emit_op(op);
  };
  auto predeclare = [&](ValueId v) {
    w_.line("{};", declare(v));
    predeclared_.insert(v);
  };
  for (size_t i = 0; i < s_at; ++i)
    FJ_RETURN_IF_ERROR(emit(body[i]));
  const Op &s = body[s_at], &o = body[o_at];
  for (ValueId r : s.results)
    def_of_[r] = &s;
  for (ValueId r : o.results)
    def_of_[r] = &o;
  const std::string s_acc = name(s.results[0]), o_acc = name(o.results[0]);
  const std::string p = name(o.operands[0]);
  const int64_t s_cols = type(s.results[0]).cols, o_cols = type(o.results[0]).cols;
  const int64_t p_tiles = tiles(type(o.operands[0]).cols);
  w_.line("// Two passes over the query tiles: tile 0's softmax overlaps tile 1's S,");
  w_.line("// tile 1's softmax overlaps tile 0's O.");
  emit_ir_comment(s, ": a group per query tile, left in flight");
  FJ_RETURN_IF_ERROR(emit_product(s, -1, /*wait=*/false, /*group_per_tile=*/true));
  std::vector<const Op *> chain, staged;
  for (size_t i = s_at + 1; i < o_at; ++i)
    (body[i].kind == OpKind::Load ? staged : chain).push_back(&body[i]);
  for (const Op *op : chain)
    for (ValueId r : op->results)
      predeclare(r);
  predeclare(o.results[0]);
  auto pass = [&](int qt) -> Status {
    w_.open("{{ // query tile {}", qt);
    fixed_qt_ = qt;
    Status st = Status::ok();
    for (const Op *op : chain)
      if (st)
        st = emit(*op);
    fixed_qt_ = -1;
    w_.close();
    return st;
  };
  rules_.emit_warpgroup_wait(w_, 1, {{s_acc + "[0]", s_cols}}, {});
  FJ_RETURN_IF_ERROR(pass(0));
  rules_.emit_warpgroup_wait(w_, 0, {{s_acc + "[1]", s_cols}}, {});
  for (const Op *op : staged) // after both S products: the next K may overwrite theirs
    FJ_RETURN_IF_ERROR(emit(*op));
  emit_ir_comment(o, ": query tile 0, left in flight");
  FJ_RETURN_IF_ERROR(emit_product(o, 0, /*wait=*/false));
  FJ_RETURN_IF_ERROR(pass(1));
  emit_ir_comment(o, ": query tile 1");
  FJ_RETURN_IF_ERROR(emit_product(o, 1, /*wait=*/false));
  rules_.emit_warpgroup_wait(w_, 0, {{o_acc + "[0]", o_cols}, {o_acc + "[1]", o_cols}},
                             {{p + "[0]", p_tiles}, {p + "[1]", p_tiles}});
  for (size_t i = o_at + 1; i < body.size(); ++i)
    FJ_RETURN_IF_ERROR(emit(body[i]));
  return Status::ok();
}

Status KernelEmitter::emit_block_range(const Op &op, bool transposed) {
  if (!op.attrs.count("range"))
    return Status::ok();
  const ir::ScoreFunction *f = p_.function(op.symbol_attr("range"));
  auto e = ir::parse_expr(f->text, p_.expr_scope(), "function @" + f->name);
  if (!e)
    return e.status();
  const std::string sq = seq_const(*p_.tensor("Q")), sk = seq_const(*p_.tensor("K"));
  // Rows are this workgroup's block (keys when transposed), columns one block of the loop.
  const std::string rows = "fj_iv_range(double(fj_row_lo), double(fj_row_hi))",
                    cols = "fj_iv_range(double(fj_col_lo), double(fj_col_hi))";
  auto exact = [](const std::string &c) { return fmt::format("fj_iv_exact(double({}))", c); };
  const std::string may_see = ir::emit_c_interval(*e, [&](const std::string &var) {
    if (var == "q_idx")
      return transposed ? cols : rows;
    if (var == "kv_idx")
      return transposed ? rows : cols;
    if (var == "b")
      return exact(name(p_.grid_arg(2)));
    if (var == "h")
      return exact(name(p_.grid_arg(1)));
    if (var == "seqlen_q")
      return exact(sq);
    if (var == "seqlen_k")
      return exact(sk);
    return std::string("fj_iv_unknown()");
  });
  w_.line("// IR: range = @{}: the blocks at either end where `{}` is 0 for every", f->name,
          f->text);
  w_.line("// (query, key) pair, by its interval over the block (templates/block_range.hip),");
  w_.line("// are not visited.");
  w_.open("{{");
  w_.line("const int fj_row_lo = {} * kBlockM;", name(op.operands[0]));
  w_.line("const int fj_row_hi = (fj_row_lo + kBlockM < {0} ? fj_row_lo + kBlockM : {0}) - 1;",
          transposed ? sk : sq);
  w_.open("auto fj_may_see = [&](int block) -> bool {{");
  w_.line("const int fj_col_lo = block * kBlockN;");
  w_.line("const int fj_col_hi = (fj_col_lo + kBlockN < {0} ? fj_col_lo + kBlockN : {0}) - 1;",
          transposed ? sq : sk);
  w_.line("return fj_iv_can_be_nonzero({});", may_see);
  w_.close("};");
  w_.line("while (kv_begin < kv_end && !fj_may_see(kv_begin))");
  w_.line("  ++kv_begin;");
  w_.line("while (kv_end > kv_begin && !fj_may_see(kv_end - 1))");
  w_.line("  --kv_end;");
  w_.close();
  return Status::ok();
}

Status KernelEmitter::emit_for(const Op &op) {
  std::string res;
  for (ValueId r : op.results)
    res += (res.empty() ? "%" : ", %") + name(r);
  const bool transposed = op.int_attr("transposed") != 0;
  if (transposed)
    w_.line("// IR: {} = for %{} over the query blocks that see a key of %{}", res,
            name(op.region_args[0]), name(op.operands[0]));
  else
    w_.line("// IR: {} = for %{} over the KV blocks visible to %{}", res, name(op.region_args[0]),
            name(op.operands[0]));
  // Loop-carried tiles live in the region arguments' variables.
  for (size_t i = 1; i < op.region_args.size(); ++i) {
    w_.line("{};", declare(op.region_args[i]));
    emit_copy(op.region_args[i], name(op.region_args[i]), op.operands[i]);
  }
  w_.line("int kv_begin, kv_end;");
  w_.line("{}({}, {}, &kv_begin, &kv_end);", transposed ? "fj_q_range" : "fj_kv_range",
          name(op.operands[0]), mask_args());
  FJ_RETURN_IF_ERROR(emit_block_range(op, transposed));
  if (op.attrs.count("splits")) {
    const ir::Attr &splits = op.attrs.at("splits");
    w_.line("// IR: splits = {}: this workgroup visits split %{} of those blocks only",
            std::holds_alternative<ir::ParamRef>(splits) ? "%" + std::get<ir::ParamRef>(splits).name
                                                         : std::to_string(op.int_attr("splits")),
            name(p_.grid_arg(3)));
    w_.line("fj_split_range({}, {}, &kv_begin, &kv_end);", name(p_.grid_arg(3)),
            std::holds_alternative<ir::ParamRef>(splits) ? std::get<ir::ParamRef>(splits).name
                                                         : std::to_string(op.int_attr("splits")));
  }
  if (plan_pipeline(op)) {
    w_.line("// Software pipeline: the first tile is in flight before the loop starts.");
    w_.open("if (kv_begin < kv_end) {{");
    emit_stage_issue(*pipeline_order_.front(), "kv_begin");
    w_.close();
  }
  w_.open("for (int {0} = kv_begin; {0} < kv_end; ++{0}) {{", name(op.region_args[0]));
  // Two passes over the body decide the barriers across the back edge: what the
  // end of one iteration read must be fenced before the next overwrites it.
  const HipWriter saved = w_;
  const int saved_scales = scale_constants_;
  const std::set<std::string> at_entry = read_since_barrier_;
  size_t s_at = 0, o_at = 0;
  const bool interleave = plan_interleave(op, s_at, o_at);
  auto body = [&] {
    predeclared_.clear();
    return interleave ? emit_interleaved(op, s_at, o_at) : emit_ops(op.body);
  };
  staged_.clear();
  FJ_RETURN_IF_ERROR(body());
  w_ = saved;
  scale_constants_ = saved_scales;
  read_since_barrier_.insert(at_entry.begin(), at_entry.end());
  staged_.clear();
  FJ_RETURN_IF_ERROR(body());
  predeclared_.clear();
  staged_.clear();
  const Op &y = op.body.back();
  w_.line("// IR: yield");
  for (size_t i = 0; i < y.operands.size(); ++i)
    emit_copy(op.region_args[i + 1], name(op.region_args[i + 1]), y.operands[i]);
  w_.close();
  for (size_t i = 0; i < op.results.size(); ++i) {
    const Type &t = type(op.results[i]);
    if (t.is_vector())
      w_.line("float (&{})[kQTiles][kRowSlots] = {};", name(op.results[i]),
              name(op.region_args[i + 1]));
    else
      w_.line("{} (&{})[kQTiles][{}] = {};", rules_.acc_type(), name(op.results[i]),
              col_tiles(t.cols), name(op.region_args[i + 1]));
  }
  return Status::ok();
}

} // namespace flashjit::lowering::emit
