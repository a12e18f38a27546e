// The emitter's KV loop: loop-carried values, the barriers across the back
// edge, the software pipeline of the staged tiles and the block prefetch of the
// backward's loops (lowering/emitter.h).
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
  if (stages() < 2)
    return false;
  std::vector<size_t> loads;
  for (size_t i = 0; i < loop.body.size(); ++i)
    if (loop.body[i].kind == OpKind::Load &&
        type(loop.body[i].results[0]).layout == TileLayout::mma_b)
      loads.push_back(i);
  if (loads.empty())
    return false;
  std::set<std::string> tensors; // a tile read again after the next is staged: prefetch instead
  for (size_t i : loads)
    if (!tensors.insert(loop.body[i].symbol_attr("tensor")).second)
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
// The loop's one S product (mma_abt) and one O product (mma_ab) after it, in a
// body without inner loops or stores.
bool KernelEmitter::find_products(const Op &loop, size_t &s_at, size_t &o_at) const {
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
  return o_at != loop.body.size();
}

bool KernelEmitter::plan_interleave(const Op &loop, size_t &s_at, size_t &o_at) const {
  if (!rules_.warpgroup_products() || q_tiles_ != 2 || loop.int_attr("transposed") != 0 ||
      !find_products(loop, s_at, o_at))
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

// Whether `load` (a top-level op) is followed by nothing but fills and other
// loads up to a `for` that reads its value, and nothing after that loop reads it:
// then the loop's first wait and barrier (a staged K or V tile's, or the block
// prefetch's, every iteration) complete its copy before any product reads it.
bool KernelEmitter::read_in_next_loop(const Op &load) const {
  const std::vector<Op> &body = p_.body;
  size_t at = 0;
  while (at < body.size() && &body[at] != &load)
    ++at;
  for (size_t i = at + 1; i < body.size(); ++i) {
    const Op &op = body[i];
    if (op.kind == OpKind::Fill || op.kind == OpKind::Load)
      continue;
    if (op.kind != OpKind::For || !consumer_of(load.results[0], op.body))
      return false;
    const std::vector<Op> rest(body.begin() + long(i) + 1, body.end());
    return consumer_of(load.results[0], rest) == nullptr;
  }
  return false;
}

bool KernelEmitter::plan_prefetch(const Op &loop) {
  if (stages() < 2)
    return false;
  // Every LDS tile and column vector of the body is of the loop's block, in a
  // buffer of its own that nothing outside the loop uses.
  std::vector<const Op *> loads;
  for (const Op &op : loop.body) {
    if (op.kind == OpKind::For)
      return false;
    if (op.kind != OpKind::Load)
      continue;
    const TileLayout layout = type(op.results[0]).layout;
    if (layout != TileLayout::mma_b && layout != TileLayout::cols)
      continue;
    const Op *use = consumer_of(op.results[0], p_.body);
    if (op.operands[0] != loop.region_args[0] ||
        (layout == TileLayout::mma_b &&
         (!use || (use->kind != OpKind::MmaABt && use->kind != OpKind::MmaAB))) ||
        (lds_role_.count(lds_name(op)) && !stage_elems_.count(lds_name(op))))
      return false; // a buffer of one copy, used outside this loop
    loads.push_back(&op);
  }
  if (loads.empty())
    return false;
  prefetch_loads_.clear();
  std::set<std::string> bufs;
  lds_copies_ = 2;
  for (const Op *op : loads) {
    const bool vector = type(op->results[0]).layout == TileLayout::cols;
    const std::string buf = vector ? register_vector_lds(*op) : register_lds(*op);
    if (bufs.insert(buf).second)
      prefetch_loads_.push_back(op);
    prefetched_.insert(op);
  }
  lds_copies_ = 1;
  return true;
}

bool KernelEmitter::plan_early_issue(const Op &loop, bool vectors_only) {
  early_loads_.clear();
  if (stages() < 2 || std::any_of(loop.body.begin(), loop.body.end(),
                                  [](const Op &op) { return op.kind == OpKind::For; }))
    return false;
  // The tiles' buffers first, then the vectors', in body order: the LDS layout of
  // the loads' own order (a 16-byte vector before a 1024-byte aligned tile would
  // pad the tile).
  std::set<std::string> bufs;
  for (const TileLayout layout : {TileLayout::mma_b, TileLayout::cols})
    for (const Op &op : loop.body) {
      if (op.kind != OpKind::Load || op.operands[0] != loop.region_args[0] ||
          type(op.results[0]).layout != layout)
        continue;
      const std::string buf =
          layout == TileLayout::cols ? register_vector_lds(op) : register_lds(op);
      if (buf.empty() || free_bar_.count(buf) || (vectors_only && layout != TileLayout::cols))
        continue;
      if (bufs.insert(buf).second) // a later load of the buffer reads the same block again
        early_loads_.push_back(&op);
    }
  return !early_loads_.empty();
}

// Starts the copies of block `idx` into copy `copy` of every prefetched buffer
// (in a scope of the caller's: the views shadow the buffers' names).
void KernelEmitter::emit_prefetch_issue(const std::string &idx, const std::string &copy) {
  emit_prefetch_views(prefetch_loads_, copy);
  tma_copy_ = copy;
  for (const Op *op : prefetch_loads_) {
    if (type(op->results[0]).layout == TileLayout::cols)
      emit_vector_issue(*op, idx);
    else
      emit_stage_issue(*op, idx);
  }
  tma_copy_ = "0";
}

// Names copy `copy` of each buffer of `loads` as the buffer (shadowing copy 0).
void KernelEmitter::emit_prefetch_views(const std::vector<const Op *> &loads,
                                        const std::string &copy) {
  for (const Op *op : loads) {
    const bool vector = type(op->results[0]).layout == TileLayout::cols;
    const std::string buf = lds_name(*op);
    w_.line("{0} *const {1} = {1}_x2 + {2} * {3};", vector ? "float" : "fj_bits", buf,
            copy.find(' ') == std::string::npos ? copy : "(" + copy + ")", stage_elems_.at(buf));
  }
}

Expected<bool> KernelEmitter::plan_producer(const Op &loop) {
  if (stages() != 3)
    return false;
  auto refuse = [&](const std::string &why) -> Status {
    return Status::error(
        "config stages = 3 (a producer warpgroup filling a ring of two K/V copies) "
        "needs {}: use stages 2",
        why);
  };
  if (!rules_.warpgroup_products() || !target_.is_nvidia())
    return refuse("the sm90 rules' warpgroup products");
  if (p_.tensor("dO") != nullptr || loop.int_attr("transposed") != 0 || producer_threads_ > 0)
    return refuse("the forward's one KV loop");
  // What was staged before the loop without TMA (grouped query rows, which no
  // tensor map describes) the consumers copied alone (emit_stage_issue), and
  // every thread waited for it at the barrier before the loop.
  std::vector<const Op *> loads;
  std::set<std::string> tensors;
  for (const Op &op : loop.body) {
    if (op.kind == OpKind::For)
      return refuse("a loop without inner loops");
    if (op.kind != OpKind::Load)
      continue;
    const std::string tensor = op.symbol_attr("tensor");
    if (type(op.results[0]).layout != TileLayout::mma_b || op.operands[0] != loop.region_args[0] ||
        !tma_tile(op) || !tensors.insert(tensor).second)
      return refuse(fmt::format("the loop's tiles copied by TMA, each once per block (@{} is not: "
                                "TMA copies dense tensors with a contiguous head dim and 16-byte "
                                "aligned rows)",
                                tensor));
    loads.push_back(&op);
  }
  if (loads.empty())
    return refuse("K and V tiles staged in the loop");
  if (loop.attrs.count("range")) {
    // The consumers learn a block's successor with the first tile they wait for.
    if (loads.front()->symbol_attr("tensor") != "K")
      return refuse("K's tile first in the loop under a mask's block range");
    ring_block_load_ = loads.front();
  }
  ring_loads_ = loads;
  lds_copies_ = 2;
  for (const Op *op : ring_loads_) {
    free_bar_[register_lds(*op)] = free_bars_;
    free_bars_ += 2;
  }
  lds_copies_ = 1;
  // A warpgroup: registers are reallocated per warpgroup (setmaxnreg), and
  // ptxas budgets a warpgroup kernel's registers for whole warpgroups anyway.
  producer_threads_ = 4 * target_.wave_size;
  return true;
}

// Registers per thread of the producer warpgroup and of the consumers (config
// stages 3): the producer keeps setmaxnreg's least, the consumers share the rest
// of the register file among the workgroups per SM (one with two consumer
// warpgroups or more, two with one), in setmaxnreg's steps of 8, at most 256.
KernelEmitter::ProducerBudget KernelEmitter::producer_budget() const {
  constexpr int kFile = 65536, kProducer = 24;
  const int consumer_groups = int(waves_ / 4), blocks = consumer_groups >= 2 ? 1 : 2;
  const int consumer = (kFile / blocks - 128 * kProducer) / (128 * consumer_groups) / 8 * 8;
  return {.producer_regs = kProducer, .consumer_regs = std::min(consumer, 256), .blocks = blocks};
}

// The producer warpgroup's loop (in the loop's range scope): lane 0 walks the same
// blocks as the consumers and issues each block's tiles into copy n % 2 once the
// consumers have freed what that copy held two blocks before. Under a mask's
// block range the producer's first warp walks them, as the consumers do: the
// scan that finds the next block the mask keeps judges 32 blocks, one per lane.
Status KernelEmitter::emit_producer(const Op &loop) {
  const ProducerBudget budget = producer_budget();
  if (persistent_) {
    // The producer's own tile loop (run() assembles it): this tile's range, then
    // its blocks; the ring's count and phases run on across the tiles.
    std::swap(w_, producer_w_);
    Status st = emit_range(loop);
    if (st)
      emit_producer_blocks(loop);
    std::swap(w_, producer_w_);
    FJ_RETURN_IF_ERROR(st);
  } else {
    w_.open("if (wave >= kWaves) {{ // the producer warpgroup: every block's tiles into the ring");
    w_.line("fj_setmaxnreg_dec<{}>(); // its registers go to the consumers", budget.producer_regs);
    emit_producer_warp(loop);
    w_.line("unsigned fj_free_phase = 0; // bit i: the parity of free barrier i's next completion");
    emit_producer_blocks(loop);
    w_.close();
    w_.line("return; // its copies complete on the fill barriers; the consumers go on");
    w_.close();
    w_.line("fj_setmaxnreg_inc<{}>(); // the consumers' registers per thread",
            budget.consumer_regs);
  }
  for (const auto &[op, buf] : deferred_waits_) // each consumer thread waits for itself
    w_.line("fj_tma_wait(fj_tma_bar, {}, fj_tma_phase); // this thread sees the {} tile",
            tma_bar(tma_.at(buf)), op->symbol_attr("tensor"));
  deferred_waits_.clear();
  return Status::ok();
}

// Config persistent, after the loop: the workgroup's next tile (the grid's
// size on, or the producer's fetch from the launch's counter); every S product
// of this tile is done, so the next tile's Q goes into the buffer now and
// arrives during this tile's last O product and epilogue.
void KernelEmitter::emit_persistent_q() {
  const char *next = "fj_next";
  if (dynamic_tiles_) {
    next = "fj_tile_next";
    w_.line("fj_tma_wait(fj_tile_bar, fj_j & 1, fj_slot_phase); // the producer's fetch");
    w_.line("fj_tile_next = fj_tile_slot[fj_j & 1];");
    w_.line("fj_mbar_arrive(&fj_tile_bar[2 + (fj_j & 1)]); // this thread has read the slot");
  }
  if (!q_load_)
    return;
  w_.line("{}; // every consumer is done with this tile's Q", barrier());
  if (dynamic_tiles_) {
    w_.open("if (fj_tile_next < fj_tiles) {{ // the next tile's Q");
  } else {
    w_.open("if (fj_tile + fj_group_count_x() < fj_tiles) {{ // the next tile's Q");
    w_.line("const long fj_next = fj_tile + fj_group_count_x();");
  }
  emit_grid_args(next);
  emit_stage_issue(*q_load_, name(p_.grid_arg(0)));
  w_.close();
}

// Opens the producer's issuing threads: its first lane, or under a mask's block
// range its first warp (the scan takes 32 lanes).
void KernelEmitter::emit_producer_warp(const Op &loop) {
  if (loop.attrs.count("range"))
    w_.open("if (wave == kWaves) {{ // a warp: the block scan takes 32 lanes");
  else
    w_.open("if (wave == kWaves && lane == 0) {{");
}

// The producer's loop over the blocks of [kv_begin, kv_end): block n (fj_n,
// counted from the kernel's start when persistent) into ring copy n % 2.
void KernelEmitter::emit_producer_blocks(const Op &loop) {
  const std::string kb = name(loop.region_args[0]);
  const bool range = loop.attrs.count("range") != 0;
  const char *count = persistent_ ? "" : ", fj_n = 0";
  if (range) {
    w_.open("for (int {0} = kv_begin, fj_kb_next{1}; {0} < kv_end; {0} = fj_kb_next, ++fj_n) {{",
            kb, count);
    w_.line("const bool fj_block_full = fj_kb_full;");
    w_.line("fj_kb_next = fj_next_seen({} + 1, &fj_kb_full); // the next block the mask may keep",
            kb);
  } else {
    w_.open("for (int {0} = kv_begin{1}; {0} < kv_end; ++{0}, ++fj_n) {{", kb, count);
  }
  w_.line("const int fj_fill = fj_n & 1; // the ring copy this block goes into");
  emit_prefetch_views(ring_loads_, "fj_fill");
  tma_issuer_ = range ? "lane == 0" : ""; // lane 0 of the producer
  tma_copy_ = "fj_fill";
  for (const Op *op : ring_loads_) {
    w_.line("if (fj_n >= 2) // the consumers are done with the block this copy held");
    w_.line("  fj_tma_wait(fj_free_bar, {} + fj_fill, fj_free_phase);",
            free_bar_.at(lds_name(*op)));
    if (op == ring_block_load_) // before the fill's arrive, which releases it
      w_.line("if (lane == 0) fj_ring_block[fj_fill] = fj_kb_next * 2 + (fj_block_full ? 1 : 0);");
    emit_stage_issue(*op, kb);
  }
  tma_issuer_ = "fj_thread_id() == 0";
  tma_copy_ = "0";
  w_.close();
}

void KernelEmitter::emit_ring_release(const Op &product) {
  auto it = lds_of_.find(product.operands[1]);
  if (it == lds_of_.end() || !free_bar_.count(it->second))
    return;
  w_.line("fj_mbar_arrive(&fj_free_bar[{} + {}]); // this thread is done with this copy of {}",
          free_bar_.at(it->second), ring_copy_, it->second);
}

std::optional<KernelEmitter::OverlapPlan> KernelEmitter::plan_overlap(const Op &loop, size_t s_at,
                                                                      size_t o_at) const {
  if (free_bars_ == 0 || q_tiles_ != 1 || loop.body.back().kind != OpKind::Yield ||
      o_at + 2 != loop.body.size())
    return std::nullopt;
  OverlapPlan plan;
  plan.s_at = s_at;
  plan.o_at = o_at;
  const Op &o = loop.body[o_at];
  // The accumulator: the region argument the O product's result is yielded to.
  const Op &y = loop.body.back();
  for (size_t i = 0; i < y.operands.size(); ++i)
    if (y.operands[i] == o.results[0])
      plan.acc = i + 1;
  if (plan.acc == 0)
    return std::nullopt;
  // The ops between the products that depend on it, transitively: only the O
  // product may read what they make.
  std::set<ValueId> tainted = {loop.region_args[plan.acc]};
  for (size_t i = s_at + 1; i < o_at; ++i) {
    const Op &op = loop.body[i];
    if (op.kind == OpKind::Load) {
      if (consumer_of(op.results[0], loop.body) != &o)
        return std::nullopt;
      continue;
    }
    bool reads = false;
    for (ValueId v : op.operands)
      reads = reads || tainted.count(v);
    if (!reads)
      continue;
    plan.acc_ops.insert(i);
    for (ValueId r : op.results)
      tainted.insert(r);
  }
  for (size_t i = s_at + 1; i < o_at; ++i)
    if (!plan.acc_ops.count(i))
      for (ValueId v : loop.body[i].operands)
        if (tainted.count(v) && v != loop.region_args[plan.acc])
          return std::nullopt;
  for (size_t i = 0; i < s_at; ++i)
    for (ValueId v : loop.body[i].operands)
      if (tainted.count(v))
        return std::nullopt;
  if (plan.acc_ops.empty() || !tainted.count(o.operands[2]) || tainted.count(o.operands[0]))
    return std::nullopt;
  return plan;
}

// The overlapped loop body (plan_overlap), for block kb:
//   wait K, issue S(kb) | [kb > first] wait V(kb - 1), issue O(kb - 1) with the
//   P it kept | wait S: free K | softmax of kb, P(kb) | [kb > first] wait O:
//   free V(kb - 1), the accumulator is O | rescale it | keep P(kb) for the next
// The O product's result lives across iterations (declared before the loop) and
// accumulates in place: the rescale writes it back before the yield.
Status KernelEmitter::emit_overlapped(const Op &loop) {
  const std::vector<Op> &body = loop.body;
  const OverlapPlan &plan = *overlap_;
  const Op &s = body[plan.s_at], &o = body[plan.o_at];
  auto emit = [&](const Op &op) {
    for (ValueId r : op.results)
      def_of_[r] = &op;
    return emit_op(op);
  };
  const std::string kb = name(loop.region_args[0]);
  const std::string out = name(o.results[0]), p = name(o.operands[0]);
  const int64_t out_cols = type(o.results[0]).cols, s_cols = type(s.results[0]).cols;
  const int64_t p_tiles = tiles(type(o.operands[0]).cols);
  for (ValueId r : o.results)
    def_of_[r] = &o;
  for (size_t i = 0; i < plan.s_at; ++i)
    FJ_RETURN_IF_ERROR(emit(body[i]));
  emit_early_masks(body, plan.s_at + 1, plan.o_at);
  emit_ir_comment(s, ": left in flight");
  FJ_RETURN_IF_ERROR(emit_product(s, -1, /*wait=*/false));
  w_.open("if ({} > kv_begin) {{ // the previous block's O product, beside this S", kb);
  FJ_RETURN_IF_ERROR(emit_overlap_issue(loop));
  w_.line("fj_wgmma_wait<1>(); // S is done; O may be in flight");
  w_.close();
  w_.open("else {{");
  w_.line("fj_wgmma_wait<0>(); // S is done");
  w_.close();
  w_.line("fj_wgmma_pin({}[0], {});", name(s.results[0]), s_cols / 8);
  emit_ring_release(s);
  std::vector<const Op *> before, after;
  for (size_t i = plan.s_at + 1; i < plan.o_at; ++i)
    if (body[i].kind != OpKind::Load)
      (plan.acc_ops.count(i) ? after : before).push_back(&body[i]);
  for (const Op *op : before)
    FJ_RETURN_IF_ERROR(emit(*op));
  // The wait is unconditional (a no-op without a product in flight): ptxas
  // does not pair the two `kb > kv_begin` branches, and would serialize the
  // products for the path that issues O and skips its wait. The copy into the
  // accumulator too, so that only one of the two is live across the loop.
  emit_overlap_finish(loop, kb + " > kv_begin");
  for (const Op *op : after)
    FJ_RETURN_IF_ERROR(emit(*op));
  w_.line("// The next iteration's O product accumulates onto the rescaled accumulator,");
  w_.line("// with this block's P.");
  emit_copy(o.results[0], out, o.operands[2]);
  w_.line("fj_wgmma_pin({}[0], {}); // in its registers before the next S product starts", out,
          out_cols / 8);
  w_.line("#pragma unroll");
  w_.line("for (int qt = 0; qt < kQTiles; ++qt)");
  w_.line("  for (int k = 0; k < {}; ++k) fj_p_prev[qt][k] = {}[qt][k];", p_tiles, p);
  return Status::ok();
}

// Its V copy is the one before fj_copy; issued, not waited for.
Status KernelEmitter::emit_overlap_issue(const Op &loop) {
  const Op &o = loop.body[overlap_->o_at];
  std::vector<const Op *> loads; // the O product's tile
  for (const Op &op : loop.body)
    if (op.kind == OpKind::Load && consumer_of(op.results[0], loop.body) == &o)
      loads.push_back(&op);
  ring_copy_ = "(fj_copy ^ 1)";
  emit_prefetch_views(loads, "(fj_copy ^ 1)");
  for (const Op *op : loads)
    FJ_RETURN_IF_ERROR(emit_load(*op));
  ring_copy_ = "fj_copy";
  // A = the kept P; the result accumulates in place (it holds the rescaled C).
  const std::string saved_a = printed_[o.operands[0]];
  emit_ir_comment(o, ": the previous block's (its P kept in fj_p_prev), left in flight");
  printed_[o.operands[0]] = "fj_p_prev";
  Status st = emit_product(o, -1, /*wait=*/false, /*group_per_tile=*/false, /*in_place=*/true);
  printed_[o.operands[0]] = saved_a;
  return st;
}

void KernelEmitter::emit_overlap_finish(const Op &loop, const std::string &guard) {
  const Op &o = loop.body[overlap_->o_at];
  rules_.emit_warpgroup_wait(w_, 0, {{name(o.results[0]) + "[0]", type(o.results[0]).cols}},
                             {{"fj_p_prev[0]", tiles(type(o.operands[0]).cols)}});
  if (!guard.empty())
    w_.open("if ({}) {{ // the O product is done with its V copy", guard);
  ring_copy_ = "(fj_copy ^ 1)";
  emit_ring_release(o);
  ring_copy_ = "fj_copy";
  if (!guard.empty())
    w_.close();
  emit_copy(loop.region_args[overlap_->acc], name(loop.region_args[overlap_->acc]), o.results[0]);
}

std::string KernelEmitter::barrier() const {
  return consumers_only_ ? fmt::format("fj_named_barrier({})", waves_ * target_.wave_size)
                         : "fj_barrier()";
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
  emit_ring_release(s);
  for (const Op *op : staged) // after both S products: the next K may overwrite theirs
    FJ_RETURN_IF_ERROR(emit(*op));
  emit_ir_comment(o, ": query tile 0, left in flight");
  FJ_RETURN_IF_ERROR(emit_product(o, 0, /*wait=*/false));
  FJ_RETURN_IF_ERROR(pass(1));
  emit_ir_comment(o, ": query tile 1");
  FJ_RETURN_IF_ERROR(emit_product(o, 1, /*wait=*/false));
  rules_.emit_warpgroup_wait(w_, 0, {{o_acc + "[0]", o_cols}, {o_acc + "[1]", o_cols}},
                             {{p + "[0]", p_tiles}, {p + "[1]", p_tiles}});
  emit_ring_release(o);
  for (size_t i = o_at + 1; i < body.size(); ++i)
    FJ_RETURN_IF_ERROR(emit(body[i]));
  return Status::ok();
}

Expected<std::string> KernelEmitter::block_interval(const ir::ScoreFunction &f, bool transposed) {
  auto e = ir::parse_expr(f.text, p_.expr_scope(), "function @" + f.name);
  if (!e)
    return e.status();
  const std::string sq = seq_const(*p_.tensor("Q")), sk = seq_const(*p_.tensor("K"));
  const std::string rows = "fj_iv_range(double(fj_row_lo), double(fj_row_hi))",
                    cols = "fj_iv_range(double(fj_col_lo), double(fj_col_hi))";
  auto exact = [](const std::string &c) { return fmt::format("fj_iv_exact(double({}))", c); };
  return ir::emit_c_interval(*e, [&](const std::string &var) {
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
}

Status KernelEmitter::emit_block_range(const Op &op, bool transposed) {
  if (!op.attrs.count("range"))
    return Status::ok();
  const ir::ScoreFunction *f = p_.function(op.symbol_attr("range"));
  auto interval = block_interval(*f, transposed);
  if (!interval)
    return interval.status();
  const std::string sq = seq_const(*p_.tensor("Q")), sk = seq_const(*p_.tensor("K"));
  w_.line("// IR: range = @{}: the blocks where `{}` is 0 for every", f->name, f->text);
  w_.line("// (query, key) pair, by its interval over the block (templates/block_range.hip),");
  w_.line("// are not visited: those at either end narrow the range, the loop skips the rest.");
  // Rows are this workgroup's block (keys when transposed), columns one block of the loop.
  w_.line("const int fj_row_lo = {} * kBlockM;", name(op.operands[0]));
  w_.line("const int fj_row_hi = (fj_row_lo + kBlockM < {0} ? fj_row_lo + kBlockM : {0}) - 1;",
          transposed ? sk : sq);
  w_.open("auto fj_mask_iv = [&](int block) -> fj_iv {{");
  w_.line("const int fj_col_lo = block * kBlockN;");
  w_.line("const int fj_col_hi = (fj_col_lo + kBlockN < {0} ? fj_col_lo + kBlockN : {0}) - 1;",
          transposed ? sq : sk);
  if (op.attrs.count("blocks")) {
    // The mask tensor's class of the block (templates/mask_blocks.hip), which
    // the summary kernel wrote before this one, meets the function's interval.
    const int64_t rows = op.int_attr("block_m"), cols = op.int_attr("block_n");
    mask_blocks_ = {.block_q = transposed ? cols : rows, .block_k = transposed ? rows : cols};
    const std::string row = name(op.operands[0]);
    w_.line("const unsigned char fj_class = {}[fj_mask_cell({}, {}, {}, {}, heads, {}, {}, {}, {}, "
            "mask_batch_stride, mask_head_stride, mask_q_stride)];",
            op.symbol_attr("blocks"), name(p_.grid_arg(2)), name(p_.grid_arg(1)),
            transposed ? "block" : row, transposed ? row : "block", sq, sk, mask_blocks_.block_q,
            mask_blocks_.block_k);
    w_.line("return fj_iv_and({}, fj_class == FJ_MASK_BLOCK_EMPTY  ? fj_iv_exact(0.0)", *interval);
    w_.line("                    : fj_class == FJ_MASK_BLOCK_FULL ? fj_iv_exact(1.0)");
    w_.line("                                                     : fj_iv_bool(true, true));");
  } else {
    w_.line("return {};", *interval);
  }
  w_.close("};");
  lines(R"(// Which of blocks [base, base + 32) the mask may keep (bit i: block base + i)
// and which it keeps whole: lane l judges block base + l % 32 and an OR across
// the lanes gives each lane every bit, so 32 blocks cost one interval's time.
// The workgroup calls it with one base (uniform control flow).
int fj_scan_base = -64;
unsigned fj_scan_seen = 0, fj_scan_full = 0;
auto fj_scan = [&](int base) {
  const int block = base + lane % 32;
  const fj_iv v = block < kv_end ? fj_mask_iv(block) : fj_iv_exact(0.0);
  unsigned seen = fj_iv_can_be_nonzero(v) ? 1u << (lane % 32) : 0u;
  unsigned full = fj_iv_can_be_zero(v) ? 0u : 1u << (lane % 32);
  for (int m = 1; m < 32; m *= 2) {
    seen |= fj_shfl_xor_u32(seen, lane, m);
    full |= fj_shfl_xor_u32(full, lane, m);
  }
  fj_scan_base = base;
  fj_scan_seen = seen;
  fj_scan_full = full;
};
// The first block in [from, kv_end) the mask may keep, else kv_end; *full: it
// keeps every pair of that block.
auto fj_next_seen = [&](int from, bool *full) -> int {
  while (from < kv_end) {
    if (from < fj_scan_base || from >= fj_scan_base + 32)
      fj_scan(from);
    const unsigned rest = fj_scan_seen >> (from - fj_scan_base);
    if (rest != 0) {
      from += fj_ctz(rest);
      *full = ((fj_scan_full >> (from - fj_scan_base)) & 1u) != 0;
      return from < kv_end ? from : kv_end;
    }
    from = fj_scan_base + 32;
  }
  return kv_end;
};
// One past the last block in [kv_begin, to) the mask may keep, else kv_begin.
auto fj_seen_end = [&](int to) -> int {
  while (to > kv_begin) {
    const int base = to - 32 > kv_begin ? to - 32 : kv_begin;
    fj_scan(base);
    const unsigned bits = fj_scan_seen & (to - base >= 32 ? ~0u : (1u << (to - base)) - 1u);
    if (bits != 0)
      return base + 32 - fj_clz(bits);
    to = base;
  }
  return kv_begin;
};
bool fj_kb_full = false;
kv_begin = fj_next_seen(kv_begin, &fj_kb_full);
kv_end = fj_seen_end(kv_end);)");
  return Status::ok();
}

bool KernelEmitter::block_full_applies(const Op &op) const {
  const Op *loop = range_loop_;
  return op.attrs.count("unmasked") && loop &&
         loop->symbol_attr("range") == op.symbol_attr("range") &&
         op.operands[1] == loop->operands[0] && op.operands[2] == loop->region_args[0] &&
         (op.int_attr("transposed") != 0) == (loop->int_attr("transposed") != 0);
}

// The loop's KV range (the query blocks' when transposed) for this workgroup's
// block, narrowed by the mask's block range.
Status KernelEmitter::emit_range(const Op &op) {
  const bool transposed = op.int_attr("transposed") != 0;
  w_.line("int kv_begin, kv_end;");
  if (!q_group().empty())
    w_.line("fj_kv_range_grouped({}, {}, {}, &kv_begin, &kv_end);", name(op.operands[0]), q_group(),
            mask_args());
  else
    w_.line("{}({}, {}, &kv_begin, &kv_end);", transposed ? "fj_q_range" : "fj_kv_range",
            name(op.operands[0]), mask_args());
  return emit_block_range(op, transposed);
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
  w_.open("{{ // the loop's range, in a scope of its own (a program may have several loops)");
  FJ_RETURN_IF_ERROR(emit_range(op));
  if (op.attrs.count("splits")) {
    const ir::Attr &splits = op.attrs.at("splits");
    w_.line("// IR: splits = {}: this workgroup visits split %{} of those blocks only",
            std::holds_alternative<ir::ParamRef>(splits) ? "%" + std::get<ir::ParamRef>(splits).name
                                                         : std::to_string(op.int_attr("splits")),
            name(p_.grid_arg(3)));
    w_.line("fj_split_range({}, {}, &kv_begin, &kv_end);", name(p_.grid_arg(3)),
            std::holds_alternative<ir::ParamRef>(splits) ? std::get<ir::ParamRef>(splits).name
                                                         : std::to_string(op.int_attr("splits")));
    if (op.attrs.count("range")) {
      w_.line("// A split's run may start in a hole of the mask.");
      w_.line("kv_begin = fj_next_seen(kv_begin, &fj_kb_full);");
    }
  }
  bool prefetch = false;
  auto producer = plan_producer(op);
  if (!producer)
    return producer.status();
  size_t s_at = 0, o_at = 0;
  const bool interleave = plan_interleave(op, s_at, o_at);
  overlap_.reset();
  if (!interleave && *producer && find_products(op, s_at, o_at))
    overlap_ = plan_overlap(op, s_at, o_at);
  if (persistent_ && !*producer)
    return Status::error("config persistent needs the producer warpgroup of config stages 3");
  if (*producer) {
    FJ_RETURN_IF_ERROR(emit_producer(op));
    if (!persistent_) // else declared before the tiles: the ring runs on across them
      w_.line("int fj_copy = 0; // the ring copy that holds this iteration's block");
  }
  if (overlap_) {
    // Values that live across iterations: the O product's result, starting as the
    // loop's accumulator, and the P it reads.
    const Op &o = op.body[overlap_->o_at];
    w_.line("{}; // the O product's accumulator, across iterations", declare(o.results[0]));
    emit_copy(o.results[0], name(o.results[0]), op.operands[overlap_->acc]);
    w_.line("{} fj_p_prev[kQTiles][{}] = {{}}; // the P the next O product reads",
            rules_.operand_type(), tiles(type(o.operands[0]).cols));
  }
  // Without a producer: the tile pipeline where it applies, else the block
  // prefetch; config prefetch_blocks asks for the block prefetch first.
  bool pipelined = false;
  if (!*producer) {
    if (prefetch_blocks_)
      prefetch = plan_prefetch(op);
    if (!prefetch)
      pipelined = plan_pipeline(op);
    if (!prefetch && !pipelined && !prefetch_blocks_)
      prefetch = plan_prefetch(op);
    if (!prefetch)
      plan_early_issue(op, /*vectors_only=*/pipelined);
  }
  if (pipelined) {
    w_.line("// Software pipeline: the first tile is in flight before the loop starts.");
    w_.open("if (kv_begin < kv_end) {{");
    emit_stage_issue(*pipeline_order_.front(), "kv_begin");
    w_.close();
  } else if (prefetch) {
    w_.line("// Block prefetch: the first block's tiles are in flight before the loop starts;");
    w_.line("// each iteration starts the next block's into the other copy of the buffers.");
    for (const Op *l : prefetch_loads_) // an earlier loop may still read copy 0
      barrier_if_read(lds_name(*l));
    w_.open("if (kv_begin < kv_end) {{ // into copy 0");
    emit_prefetch_issue("kv_begin", "0");
    w_.close();
    w_.line("int fj_copy = 0; // the copy that holds this iteration's block");
  }
  const std::string kb = name(op.region_args[0]);
  range_loop_ = nullptr;
  if (op.attrs.count("range") && *producer) {
    w_.open("for (int {0} = kv_begin, fj_kb_next; {0} < kv_end; {0} = fj_kb_next) {{", kb);
    w_.line("// The next block the mask may keep and whether it keeps this one whole come");
    w_.line("// from the producer with K's tile (fj_ring_block): the blocks it empties are");
    w_.line("// skipped.");
    w_.line("bool fj_block_full;");
    next_block_ = "fj_kb_next";
    range_loop_ = &op;
  } else if (op.attrs.count("range")) {
    w_.open("for (int {0} = kv_begin, fj_kb_next; {0} < kv_end; {0} = fj_kb_next) {{", kb);
    w_.line("// The next block the mask may keep: the blocks it empties are skipped.");
    w_.line("const bool fj_block_full = fj_kb_full;");
    w_.line("fj_kb_next = fj_next_seen({} + 1, &fj_kb_full);", kb);
    next_block_ = "fj_kb_next";
    range_loop_ = &op;
  } else {
    w_.open("for (int {0} = kv_begin; {0} < kv_end; ++{0}) {{", kb);
    next_block_ = kb + " + 1";
  }
  if (*producer)
    emit_prefetch_views(ring_loads_, "fj_copy");
  if (prefetch) {
    emit_prefetch_views(prefetch_loads_, "fj_copy");
    // TMA tiles complete on their barriers, the rest (cp.async) on this thread's wait.
    bool async_copies = false, swizzled_copies = false;
    tma_copy_ = "fj_copy";
    for (const Op *l : prefetch_loads_) {
      const std::string buf = lds_name(*l);
      if (auto tma = tma_.find(buf); tma != tma_.end()) {
        w_.line("fj_tma_wait(fj_tma_bar, {}, fj_tma_phase); // this thread sees the {} tile",
                tma_bar(tma->second), l->symbol_attr("tensor"));
        continue;
      }
      async_copies = true;
      swizzled_copies = swizzled_copies || swizzled_.count(buf) != 0;
    }
    tma_copy_ = "0";
    if (async_copies)
      w_.line("fj_stage_wait();");
    if (swizzled_copies)
      w_.line("fj_fence_async_shared(); // the copies are visible to wgmma's reads");
    if (!async_copies)
      wait_for_deferred_copy();
    w_.line("{}; // this block's tiles are complete; every wave is done with the other copy",
            barrier());
    read_since_barrier_.clear();
    w_.open("if ({} < kv_end) {{ // the next block, into the other copy", next_block_);
    emit_prefetch_issue(next_block_, "fj_copy ^ 1");
    w_.close();
  }
  // Two passes over the body decide the barriers across the back edge: what the
  // end of one iteration read must be fenced before the next overwrites it.
  const HipWriter saved = w_;
  const int saved_scales = scale_constants_;
  const std::set<std::string> at_entry = read_since_barrier_;
  auto body = [&] {
    predeclared_.clear();
    early_masks_.clear();
    deferred_wait_written_ = false;
    if (!early_loads_.empty()) {
      for (const Op *l : early_loads_) // the end of the last iteration may still read them
        barrier_if_read(lds_name(*l));
      const bool vectors = std::all_of(early_loads_.begin(), early_loads_.end(), [&](const Op *l) {
        return type(l->results[0]).layout == TileLayout::cols;
      });
      if (vectors) {
        w_.line("// This block's vectors (the tile pipeline carries its tiles): their copies");
        w_.line("// start here, each load waits for its own (plan_early_issue).");
      } else {
        w_.line("// This block's tiles and vectors: every copy starts here, each load waits");
        w_.line("// for its own (plan_early_issue).");
      }
      for (const Op *l : early_loads_) {
        if (type(l->results[0]).layout == TileLayout::cols)
          emit_vector_issue(*l, kb);
        else
          emit_stage_issue(*l, kb);
      }
    }
    if (overlap_) {
      predeclared_.insert(op.body[overlap_->o_at].results[0]);
      return emit_overlapped(op);
    }
    if (interleave)
      return emit_interleaved(op, s_at, o_at);
    // One S and one O product: the mask's loads go before S where they fit,
    // up to head dim 128. Above, the sm80 rules' registers are full: on an
    // H100 (sm80 rules, Q in registers) a bias at head dim 256 ran 3-16%
    // slower with them early, at 128 1.1-1.6x faster (bench/results/README.md).
    size_t s = 0, o = 0;
    const int64_t dims = std::max(p_.tensor("Q")->dim, p_.tensor("V")->dim);
    if (dims > 128 || !find_products(op, s, o))
      return emit_ops(op.body);
    for (size_t i = 0; i < op.body.size(); ++i) {
      if (i == s)
        emit_early_masks(op.body, s + 1, o);
      for (ValueId r : op.body[i].results)
        def_of_[r] = &op.body[i];
      FJ_RETURN_IF_ERROR(emit_op(op.body[i]));
    }
    return Status::ok();
  };
  staged_.clear();
  body_loop_ = &op;
  kept_.clear();
  FJ_RETURN_IF_ERROR(body());
  w_ = saved;
  scale_constants_ = saved_scales;
  read_since_barrier_.insert(at_entry.begin(), at_entry.end());
  staged_.clear();
  kept_.clear();
  FJ_RETURN_IF_ERROR(body());
  body_loop_ = nullptr;
  kept_.clear();
  predeclared_.clear();
  staged_.clear();
  range_loop_ = nullptr;
  early_masks_.clear();
  early_loads_.clear();
  const Op &y = op.body.back();
  if (prefetch || *producer)
    w_.line("fj_copy ^= 1;");
  w_.line("// IR: yield");
  for (size_t i = 0; i < y.operands.size(); ++i)
    emit_copy(op.region_args[i + 1], name(op.region_args[i + 1]), y.operands[i]);
  w_.close();
  if (persistent_)
    emit_persistent_q();
  if (!q_wait_in_loop_.empty()) {
    w_.line("fj_stage_wait(); // Q's copy, where the loop ran no block");
    q_wait_in_loop_.clear();
  }
  if (overlap_) {
    w_.open("if (kv_begin < kv_end) {{ // the last block's O product");
    predeclared_.insert(op.body[overlap_->o_at].results[0]);
    FJ_RETURN_IF_ERROR(emit_overlap_issue(op));
    predeclared_.clear();
    emit_overlap_finish(op, "");
    w_.close();
    overlap_.reset();
  }
  w_.close(); // the range's scope
  consumers_only_ = consumers_only_ || *producer;
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
