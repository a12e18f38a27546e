// The emitter's KV loop: loop-carried values, the barriers across the back
// edge, and the software pipeline of the staged tiles (lowering/emitter.h).
#include "lowering/emitter.h"

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
  staged_.clear();
  FJ_RETURN_IF_ERROR(emit_ops(op.body));
  w_ = saved;
  scale_constants_ = saved_scales;
  read_since_barrier_.insert(at_entry.begin(), at_entry.end());
  staged_.clear();
  FJ_RETURN_IF_ERROR(emit_ops(op.body));
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
