// The emitter's memory: global loads of operand fragments, stores of the
// accumulator and per-row vectors, K/V tiles staged through LDS by the whole
// workgroup (asynchronously where the target has it), and their addressing
// (lowering/emitter.h).
#include "lowering/emitter.h"

namespace flashjit::lowering::emit {

// A tensor's element in global memory: a bf16/f16 bit pattern, or f32 (the LSE,
// split-KV's partials, and every tensor of an f32_io kernel, whose loads round).
const char *KernelEmitter::element_type(const ir::TensorParam &t) {
  return t.dtype == DType::f32 ? "float" : "fj_bits";
}

Status KernelEmitter::emit_load(const Op &op) {
  const ir::TensorParam &t = *p_.tensor(op.symbol_attr("tensor"));
  const Type &ty = type(op.results[0]);
  const std::string idx = name(op.operands[0]);
  const std::string base = head_base(t);
  if (ty.is_vector())
    return emit_vector_load(op);
  if (ty.layout == TileLayout::mma_a && q_in_lds_) {
    // Q staged once into LDS; the products read its fragments from there.
    const std::string buf = register_lds(op);
    if (buf.empty())
      return Status::error("{} rules: an LDS-resident Q tile must feed mma_abt", rules_.name());
    if (persistent_ && tma_.count(buf)) {
      // The first tile's Q; each next tile's is issued when the consumers are
      // done with the last one's (emit_persistent_q), before its epilogue.
      q_load_ = &op;
      w_.open("if (fj_tile == fj_group_id_x()) {{ // the first tile's Q");
      emit_stage_issue(op, idx);
      w_.close();
    } else {
      emit_stage_issue(op, idx);
    }
    if (stages() == 3 && tma_.count(buf)) {
      // With a producer warpgroup, only the consumers read Q: they wait for its
      // copy after the split (emit_producer), so the producer's first K and V
      // copies start beside it.
      deferred_waits_.emplace_back(&op, buf);
      lds_of_[op.results[0]] = buf;
      return Status::ok();
    }
    if (!tma_.count(buf) && stages() < 3 && read_in_next_loop(op)) {
      // Q's copy completes with the loop's first K or V copy: each iteration
      // starts with a wait for every copy in flight (fj_stage_wait) and a
      // workgroup barrier before any product reads Q, so Q's latency overlaps
      // the first block's instead of preceding it (a split of decode runs
      // only a block or a few).
      q_wait_in_loop_ = buf;
      lds_of_[op.results[0]] = buf;
      return Status::ok();
    }
    finish_stage(op, buf);
    return Status::ok();
  }
  if (ty.layout == TileLayout::mma_a) {
    // Operand fragments straight from global memory, run by run: each run is
    // `len` consecutive head-dim entries of one query row.
    const int len = rules_.operand_run_len();
    const std::vector<FragmentRun> runs = rules_.operand_runs();
    const char *elem = element_type(t);
    w_.line("{};", declare(op.results[0]));
    w_.line("const {} *{}_base = {};", elem, name(op.results[0]),
            block_base(t, base, idx, "kBlockM"));
    w_.line("#pragma unroll");
    w_.open("for (int qt = 0; qt < kQTiles; ++qt) {{");
    w_.line("#pragma unroll");
    w_.open("for (int c = 0; c < {}; ++c) {{", tiles(ty.cols));
    w_.line("{} frag = {{{}}};", rules_.operand_type(),
            fmt::join(std::vector<int>(len * runs.size(), 0), ", "));
    for (size_t r = 0; r < runs.size(); ++r) {
      w_.open("{{");
      w_.line("const int row = query_row(qt, {});", runs[r].row);
      w_.line("const int d0 = c * 16 + {};", runs[r].col);
      w_.line("const {} *src = {}_base + {};", elem, name(op.results[0]),
              row_offset(t, fmt::format("local_row(qt, {})", runs[r].row), "row"));
      w_.open("if (row < {}) {{", seq_const(t));
      emit_run_load("frag", int(r) * len, len, runs.size() == 1, dim_const(t), dim_stride(t));
      w_.close();
      w_.close();
    }
    w_.line("{}[qt][c] = frag;", name(op.results[0]));
    w_.close();
    w_.close();
    return Status::ok();
  }
  if (ty.layout != TileLayout::mma_b)
    return Status::error("{} rules cannot lower `load` into #{}", rules_.name(),
                         tile_layout_name(ty.layout));
  const std::string buf = register_lds(op);
  if (!buf.empty() && free_bar_.count(buf)) {
    // A ring copy the producer warpgroup fills (emit_producer): wait for its fill.
    tma_copy_ = ring_copy_;
    w_.line("fj_tma_wait(fj_tma_bar, {}, fj_tma_phase); // the producer's {} tile is here",
            tma_bar(tma_.at(buf)), t.name);
    tma_copy_ = "0";
    if (&op == ring_block_load_) {
      w_.line("const int fj_block_info = fj_ring_block[{}]; // written before the fill",
              ring_copy_);
      w_.line("fj_kb_next = fj_block_info >> 1;");
      w_.line("fj_block_full = (fj_block_info & 1) != 0;");
    }
    lds_of_[op.results[0]] = buf;
    return Status::ok();
  }
  if (!buf.empty() && prefetched_.count(&op)) {
    w_.line("// IR: block {} of @{} is in {} (prefetched)", idx, t.name, buf);
    lds_of_[op.results[0]] = buf;
    return Status::ok();
  }
  if (!buf.empty() && pipelined_loads_.count(&op)) {
    // Issued ahead (see emit_for): wait for this tile, then start the next one.
    finish_stage(op, buf);
    const std::vector<const Op *> &order = pipeline_order_;
    const size_t i = std::find(order.begin(), order.end(), &op) - order.begin();
    const Op &next = *order[(i + 1) % order.size()];
    if (i + 1 < order.size()) {
      emit_stage_issue(next, name(op.operands[0]));
    } else {
      w_.open("if ({} < kv_end) {{", next_block_);
      emit_stage_issue(next, next_block_);
      w_.close();
    }
    return Status::ok();
  }
  if (buf.empty())
    return Status::error("{} rules: a #mma_b tile must feed mma_ab or mma_abt", rules_.name());
  if (issued_early(op)) {
    // Its copy started at the top of the iteration (plan_early_issue): wait for it.
    finish_stage(op, buf);
    staged_[buf] = idx;
    return Status::ok();
  }
  if (auto it = staged_.find(buf); it != staged_.end() && it->second == idx) {
    // The buffer already holds this block, staged the same way (the backward
    // reads Q, K and dO both as B^T and as B): read it again.
    w_.line("// IR: block {} of @{} is already in {}", idx, t.name, buf);
    lds_of_[op.results[0]] = buf;
    return Status::ok();
  }
  keep_live_values(op);
  barrier_if_read(buf);
  emit_stage_issue(op, idx);
  finish_stage(op, buf);
  staged_[buf] = idx;
  return Status::ok();
}

void KernelEmitter::keep_live_values(const Op &branch) {
  if (target_.is_nvidia() || body_loop_ == nullptr)
    return;
  // Before a mask or score_mod op only in the backward: MachineSink moved its S^T
  // and dP products into their branches (gfx1100, window 64 dK/dV at head dim 192:
  // 144 VGPRs spilled; bool-mask dQ at 192: 190; none pinned). The forward's pins
  // there cost 8-44 VGPRs in 17 of 126 kernels and saved no spill: it has none.
  if (branch.kind != OpKind::Load && p_.tensor("dO") == nullptr)
    return;
  const std::vector<Op> &body = body_loop_->body;
  const auto at =
      std::find_if(body.begin(), body.end(), [&](const Op &op) { return &op == &branch; });
  if (at == body.end())
    return;
  auto reads = [&](const Op &op, ValueId v) {
    return std::find(op.operands.begin(), op.operands.end(), v) != op.operands.end() ||
           consumer_of(v, op.body) != nullptr;
  };
  // The accumulators the iteration yields and what they are accumulated onto (a
  // product's operand 2, e.g. O rescaled by the new row maximum) stay where LLVM
  // puts them: they are live across the staging anyway, on CDNA in AGPRs, which
  // the pin's VGPR operand would copy (gfx942's dK/dV at head dim 256 spilled;
  // gfx1201's forward at 128 with a bool mask spilled 1 with O's rescale pinned).
  std::set<ValueId> accumulators;
  for (ValueId v : body.back().operands)
    for (ValueId a = v; accumulators.insert(a).second;) {
      const auto def = std::find_if(body.begin(), body.end(), [&](const Op &op) {
        return std::find(op.results.begin(), op.results.end(), a) != op.results.end();
      });
      if (def == body.end() || (def->kind != OpKind::MmaAB && def->kind != OpKind::MmaABt))
        break;
      a = def->operands[2];
    }
  for (auto def = body.begin(); def != at; ++def)
    for (ValueId v : def->results) {
      if (type(v).is_index() || type(v).layout == TileLayout::mma_a || lds_of_.count(v) ||
          kept_.count(v) || accumulators.count(v) ||
          std::none_of(at, body.end(), [&](const Op &op) { return reads(op, v); }))
        continue;
      if (kept_.empty())
        w_.line("// Computed before this branch and read from it on: pinned here (fj_pin).");
      kept_.insert(v);
      w_.line("#pragma unroll");
      w_.line("for (auto &tile : {}) for (auto &fragment : tile) fj_pin(fragment);", name(v));
    }
}

// A vector of one f32 per row of a dim = 0 tensor (the backward's L and D). As
// #rows (one value per row of the workgroup's accumulators) each lane loads its
// row slots; as #cols (one per column of an accumulator, i.e. per row of the
// loop's block) the workgroup stages it into LDS, where sub_col reads it.
Status KernelEmitter::emit_vector_load(const Op &op) {
  const ir::TensorParam &t = *p_.tensor(op.symbol_attr("tensor"));
  const Type &ty = type(op.results[0]);
  const std::string v = name(op.results[0]), idx = name(op.operands[0]);
  if (ty.layout == TileLayout::rows) {
    if (ty.rows != block_m_)
      return Status::error("{} rules: a #rows vector has the workgroup's {} rows, not {}",
                           rules_.name(), block_m_, ty.rows);
    w_.line("{};", declare(op.results[0]));
    w_.line("const float *{}_src = {};", v, block_base(t, head_base(t), idx, "kBlockM"));
    w_.line("#pragma unroll");
    w_.open("for (int qt = 0; qt < kQTiles; ++qt) {{");
    w_.line("#pragma unroll");
    w_.open("for (int s = 0; s < kRowSlots; ++s) {{");
    const std::string local = fmt::format("local_row(qt, {})", rules_.slot_row("s"));
    w_.line("const int row = query_row(qt, {});", rules_.slot_row("s"));
    w_.line("{}[qt][s] = row < {} ? {}_src[{}] : 0.0f;", v, seq_const(t), v,
            row_offset(t, local, "row"));
    w_.close();
    w_.close();
    return Status::ok();
  }
  if (ty.layout != TileLayout::cols)
    return Status::error("{} rules cannot load a vector into #{}", rules_.name(),
                         tile_layout_name(ty.layout));
  const std::string buf = register_vector_lds(op);
  if (prefetched_.count(&op)) {
    w_.line("// IR: block {} of @{} is in {} (prefetched)", idx, t.name, buf);
    lds_of_[op.results[0]] = buf;
    return Status::ok();
  }
  if (!issued_early(op)) {
    keep_live_values(op);
    barrier_if_read(buf);
    emit_vector_issue(op, idx);
  }
  w_.line("fj_stage_wait();");
  w_.line("{}; // the {} vector is complete before any wave reads it", barrier(), t.name);
  read_since_barrier_.clear();
  lds_of_[op.results[0]] = buf;
  return Status::ok();
}

// The LDS buffer of a #cols vector (declared once): one f32 per row of the loop's block.
std::string KernelEmitter::register_vector_lds(const Op &op) {
  const ir::TensorParam &t = *p_.tensor(op.symbol_attr("tensor"));
  const Type &ty = type(op.results[0]);
  const std::string buf = lds_name(op);
  if (!lds_role_.count(buf)) {
    lds_role_[buf] = "cols";
    declare_lds("float", buf, ty.rows, (ty.rows * 4 + 15) / 16 * 16, 16,
                fmt::format("@{}: {} f32, one per column", t.name, ty.rows));
  }
  return buf;
}

// Starts copying block `idx` of a #cols vector into its buffer (asynchronously
// where the target has it, fj_stage_f32); fj_stage_wait() + a barrier make it
// visible.
void KernelEmitter::emit_vector_issue(const Op &op, const std::string &idx) {
  const ir::TensorParam &t = *p_.tensor(op.symbol_attr("tensor"));
  const Type &ty = type(op.results[0]);
  const std::string buf = register_vector_lds(op);
  const std::string rows = ty.rows == block_n_ ? "kBlockN" : std::to_string(ty.rows);
  w_.line("// IR: stage block {} of @{} into {}", idx, t.name, buf);
  w_.open("{{");
  w_.line("const float *src = {};", block_base(t, head_base(t), "(" + idx + ")", rows));
  w_.open("for (int i = fj_thread_id(); i < {}; i += kThreads) {{", rows);
  w_.line("const int row = ({}) * {} + i;", idx, rows);
  w_.line("fj_stage_f32(&{}[i], src + {}, row < {}); // 0 past the last row", buf,
          row_offset(t, "i", "row"), seq_const(t));
  w_.close();
  w_.line("fj_stage_commit();");
  w_.close();
}

void KernelEmitter::declare_lds(const std::string &elem, const std::string &buf, int64_t count,
                                int64_t bytes, int64_t align, const std::string &what) {
  lds_bytes_ = int((lds_bytes_ + align - 1) / align * align);
  const int64_t copies = lds_copies_, elem_bytes = elem == "float" ? 4 : 2;
  if (copies > 1) // each copy at the next aligned offset
    count = bytes / elem_bytes * copies;
  const std::string array = copies > 1 ? fmt::format("{}_x{}", buf, copies) : buf;
  const std::string note =
      copies > 1 ? fmt::format(" // {} ({} copies)", what, copies) : " // " + what;
  if (rules_.dynamic_lds()) // at an aligned offset of the launch's dynamic LDS
    lds_decls_.push_back(fmt::format("FJ_DYNAMIC_LDS_ARRAY({}, {}, {}, {});{}", elem, array, count,
                                     lds_bytes_, note));
  else
    lds_decls_.push_back(fmt::format("FJ_LDS_ARRAY({}, {}, {});{}", elem, array, count, note));
  if (copies > 1) {
    lds_decls_.push_back(fmt::format("{} *const {} = {}; // copy 0", elem, buf, array));
    stage_elems_[buf] = bytes / elem_bytes;
  }
  lds_bytes_ += int(bytes * copies);
}

// A wait in a loop that only waits for TMA tiles also waits for the copy of a
// tile whose wait was left to the loop (q_wait_in_loop_): a no-op once it is done.
void KernelEmitter::wait_for_deferred_copy() {
  if (q_wait_in_loop_.empty() || deferred_wait_written_)
    return;
  deferred_wait_written_ = true;
  w_.line("fj_stage_wait(); // and Q's copy, left to the loop's first wait");
  if (swizzled_.count(q_wait_in_loop_))
    w_.line("fj_fence_async_shared(); // the copies are visible to wgmma's reads");
}

// Waits for this lane's copies into `buf`, then for every wave's: the tile of
// `op` is readable from there on.
void KernelEmitter::finish_stage(const Op &op, const std::string &buf) {
  if (auto tma = tma_.find(buf); tma != tma_.end()) {
    w_.line("fj_tma_wait(fj_tma_bar, {}, fj_tma_phase); // this thread sees the {} tile",
            tma_bar(tma->second), op.symbol_attr("tensor"));
    wait_for_deferred_copy();
  } else {
    w_.line("fj_stage_wait();");
    if (swizzled_.count(buf))
      w_.line("fj_fence_async_shared(); // the copies are visible to wgmma's reads");
  }
  w_.line("{}; // the {} tile is complete before any wave reads it", barrier(),
          op.symbol_attr("tensor"));
  read_since_barrier_.clear();
  lds_of_[op.results[0]] = buf;
}

// A B operand is staged in LDS by the whole workgroup, 128 bits per copy. As B^T
// (K, consumer mma_abt) it is stored row-major; as B (V, consumer mma_ab) row-major
// or transposed, as the rules read it. Declares the buffer once; returns its name
// ("" when the tile feeds no matrix product).
std::string KernelEmitter::lds_name(const Op &op) const {
  std::string lower = op.symbol_attr("tensor");
  std::transform(lower.begin(), lower.end(), lower.begin(), ::tolower);
  if (type(op.results[0]).layout == TileLayout::cols)
    return "lds_" + lower + "_cols";
  const Op *use = consumer_of(op.results[0], p_.body);
  const bool transposed = use && use->kind == OpKind::MmaAB && rules_.v_transposed();
  return "lds_" + lower + (transposed ? "t" : "");
}

std::string KernelEmitter::register_lds(const Op &op) {
  const ir::TensorParam &t = *p_.tensor(op.symbol_attr("tensor"));
  const Type &ty = type(op.results[0]);
  const Op *use = consumer_of(op.results[0], p_.body);
  if (!use || (use->kind != OpKind::MmaABt && use->kind != OpKind::MmaAB))
    return "";
  const bool transposed = use->kind == OpKind::MmaAB && rules_.v_transposed();
  const std::string buf = lds_name(op);
  const int64_t rows = ty.rows, cols = ty.cols;
  if (!transposed && rules_.lds_layout() == LdsLayout::swizzled_128b) {
    // Whole 64-column panels at a 1024-byte aligned offset: what a wgmma
    // descriptor reads (Rules::lds_layout).
    if (!lds_role_.count(buf)) {
      lds_role_[buf] = "rows";
      swizzled_.insert(buf);
      lds_strides_[buf] = ""; // no row stride: fj_swizzle128 addresses it
      const int64_t bytes = staged_tile_bytes(rows, cols, false, LdsLayout::swizzled_128b);
      declare_lds("fj_bits", buf, bytes / 2, bytes, 1024,
                  fmt::format("{} tile {}x{} in 128-byte swizzled panels of 64 columns", t.name,
                              rows, cols));
      if (tma_tile(op)) {
        const std::string map = fmt::format("tmap_{}_{}", t.name, rows);
        tma_[buf] = {tma_bars_, map, (cols + 63) / 64};
        tma_bars_ += int(lds_copies_);
        if (std::none_of(maps_.begin(), maps_.end(), [&](const auto &m) { return m.first == map; }))
          maps_.emplace_back(map, &op);
      }
    }
    return buf;
  }
  const int64_t stride = transposed ? rows + kLdsPad : cols + kLdsPad;
  const int64_t elems = transposed ? cols * stride : rows * stride;
  const std::string stride_name = fmt::format("kLds{}Stride", t.name + (transposed ? "t" : ""));
  if (!lds_role_.count(buf)) {
    lds_role_[buf] = transposed ? "transposed" : "rows";
    constants_.emplace_back(
        fmt::format("constexpr int {} = {};", stride_name, stride),
        fmt::format("LDS row stride of the {} tile (elements, padded by {} against bank conflicts)",
                    t.name, kLdsPad));
    lds_strides_[buf] = stride_name;
    declare_lds("fj_bits", buf, elems, staged_tile_bytes(rows, cols, transposed), 16,
                fmt::format("{} tile {}x{}{}, rows padded by {}", t.name, rows, cols,
                            transposed ? " stored transposed" : "", kLdsPad));
  }
  return buf;
}

// A tile of a dense tensor in 128-byte swizzled panels (the sm90 rules): its
// rows are whole [batch, head, seq, dim] rows with 16-byte aligned strides (the
// align16 class) and a sequence length the launch knows, which is what a
// tensor map can describe. Packed, paged, grouped and per-batch sequences stay
// on cp.async.
// Without a producer warpgroup, so do tiles with a partial panel (head dims 80,
// 96, 160): TMA writes whole 64-column boxes, and on the H100 the zeros past the
// head dim cost more than the copy engine saves (causal D=80 and D=96 ran 3-9%
// slower than cp.async); and the forward's tiles of one or two panels (D=64,
// 128), where TMA gained nothing, while three and four panels gained 10-35%
// (bench/results/README.md). A producer warpgroup copies every tile by TMA
// (tma_tile_shape).
bool KernelEmitter::tma_tile(const Op &op) const {
  if (!target_.is_nvidia() || rules_.lds_layout() != LdsLayout::swizzled_128b)
    return false;
  const ir::TensorParam &t = *p_.tensor(op.symbol_attr("tensor"));
  if (t.packed || paged(t) || t.grouped() || t.dtype == DType::f32 ||
      t.stride_dim != ir::Extent::constant(1) || t.row_align < 16 ||
      t.stride_split != ir::Extent::constant(0) ||
      !tma_tile_shape(type(op.results[0]).rows, type(op.results[0]).cols, tma_use()))
    return false;
  return std::none_of(p_.sequences.begin(), p_.sequences.end(),
                      [&](const ir::Sequence &s) { return s.name == t.seq.param; });
}

// The barrier of the buffer copy being written or read (tma_copy_).
std::string KernelEmitter::tma_bar(const TmaBuffer &b) const {
  return tma_copy_ == "0" ? std::to_string(b.first_bar)
                          : fmt::format("{} + ({})", b.first_bar, tma_copy_);
}

// Starts copying block `idx` of a #mma_b tile into its LDS buffer: 8 elements per
// copy, asynchronous where the target has it (fj_stage8), element by element at
// ragged edges. fj_stage_wait() + a barrier make it visible.
void KernelEmitter::emit_stage_issue(const Op &op, const std::string &idx) {
  const ir::TensorParam &t = *p_.tensor(op.symbol_attr("tensor"));
  const Type &ty = type(op.results[0]);
  const std::string buf = register_lds(op);
  const bool transposed = lds_role_.at(buf) == "transposed";
  const int64_t rows = ty.rows, cols = ty.cols;
  const bool query_rows = ty.layout == TileLayout::mma_a; // Q's block, not a key block
  const std::string rows_name = rows == block_m_ && query_rows ? "kBlockM"
                                : rows == block_n_             ? "kBlockN"
                                : rows == block_m_             ? "kBlockM"
                                                               : std::to_string(rows);
  if (auto tma = tma_.find(buf); tma != tma_.end()) {
    // One thread asks the copy engine for the whole tile; the barrier of this
    // copy of the buffer counts its bytes in.
    const TmaBuffer &b = tma->second;
    w_.line("// IR: stage block {} of @{} into {}: TMA, {} panel{} of 64 columns x {} rows", idx,
            t.name, buf, b.panels, b.panels == 1 ? "" : "s", rows);
    if (!tma_issuer_.empty())
      w_.line("if ({})", tma_issuer_);
    w_.line("{}fj_tma_tile({}, {}, &fj_tma_bar[{}], {}, {}, ({}) * {}, {}, {});",
            tma_issuer_.empty() ? "" : "  ", b.map, buf, tma_bar(b), b.panels, rows, idx, rows_name,
            head_index(t), name(p_.grid_arg(2)));
    return;
  }
  // The LDS element of row r, column d0 of the tile.
  const std::string at = swizzled_.count(buf) ? fmt::format("fj_swizzle128(r, d0, {})", rows)
                                              : fmt::format("r * {} + d0", lds_strides_.at(buf));
  w_.line("// IR: stage block {} of @{} into {}", idx, t.name, buf);
  w_.open("{{");
  const char *elem = element_type(t);
  if (paged(t))
    w_.line("const {} *head_rows = {}; // rows found through the page table", elem, head_base(t));
  else
    w_.line("const {} *tile = {};", elem, block_base(t, head_base(t), "(" + idx + ")", rows_name));
  // Work-item t copies chunks t, t + kThreads, ... On NVIDIA a loop of a fixed
  // trip count, unrolled: the copies are asynchronous and their addresses then
  // differ by constants (the H100 forward at head dim 128 ran ~15% faster).
  // AMD's copies pass through registers: unrolled, or rolled at a fixed count,
  // they spilled more (gfx11 forward at head dim 192; gfx1201 dK/dV at 64), so
  // AMD keeps the strided loop.
  const int64_t chunks = rows * (cols / 8), threads = waves_ * target_.wave_size;
  w_.line("// {} rows x {} chunks of 8 elements", rows, cols / 8);
  // Config stages 3: a tile staged before the KV loop without TMA is the
  // consumers' to copy (kThreads of them); the producer warpgroup's threads,
  // which run the code before the loop too, skip it.
  const bool consumers_copy = target_.is_nvidia() && stages() == 3;
  if (consumers_copy)
    w_.open("if (fj_thread_id() < kThreads) {{ // the consumers' copy (the producer's threads skip "
            "it)");
  if (!target_.is_nvidia()) {
    w_.open("for (int i = fj_thread_id(); i < {}; i += kThreads) {{", chunks);
    w_.line("const int r = i / {}, d0 = (i % {}) * 8;", cols / 8, cols / 8);
  } else {
    w_.line("#pragma unroll");
    w_.open("for (int j = 0; j < {}; ++j) {{", (chunks + threads - 1) / threads);
    if (threads % (cols / 8) == 0) {
      // Each work-item's column is the same in every chunk, its rows kThreads /
      // chunks-per-row apart.
      w_.line("const int r = fj_thread_id() / {} + j * {}, d0 = (fj_thread_id() % {}) * 8;",
              cols / 8, threads / (cols / 8), cols / 8);
      if (chunks % threads != 0)
        w_.line("if (r >= {}) break;", rows);
    } else {
      w_.line("const int i = fj_thread_id() + j * kThreads;");
      if (chunks % threads != 0)
        w_.line("if (i >= {}) break;", chunks);
      w_.line("const int r = i / {}, d0 = (i % {}) * 8;", cols / 8, cols / 8);
    }
  }
  w_.line("const int row = ({}) * {} + r;", idx, rows_name);
  if (paged(t))
    w_.line("const {} *src = head_rows + {};", elem, page_row_offset(t, "row"));
  else
    w_.line("const {} *src = tile + {};", elem, row_offset(t, "r", "row"));
  if (!transposed) {
    w_.open("if (kVecLoads && d0 + 8 <= {}) {{", dim_const(t));
    w_.line("fj_stage8(&{}[{}], src + d0, row < {}); // zeros past the last row", buf, at,
            seq_const(t));
    w_.close("} else if (kVec4Loads && d0 + 4 <= " + dim_const(t) + ") {");
    w_.indent(1);
    w_.line("fj_stage4(&{}[{}], src + d0, row < {});", buf, at, seq_const(t));
    w_.line("fj_stage4(&{}[{} + 4], src + d0 + 4, row < {} && d0 + 8 <= {});", buf, at,
            seq_const(t), dim_const(t));
    w_.close("} else {");
    w_.indent(1);
  }
  w_.line("fj_bits8 chunk = {{0, 0, 0, 0, 0, 0, 0, 0}};");
  w_.open("if (row < {}) {{", seq_const(t));
  if (transposed) {
    w_.line("if (kVecLoads && d0 + 8 <= {})", dim_const(t));
    w_.line("  chunk = fj_global_load8(src + d0);");
    w_.line("else");
    w_.indent(1);
  }
  w_.line("for (int e = 0; e < 8; ++e)");
  w_.line("  if (d0 + e < {}) chunk[e] = fj_global_load1(src + long(d0 + e){});", dim_const(t),
          dim_stride(t));
  if (transposed)
    w_.indent(-1);
  w_.close();
  if (transposed) {
    w_.line("#pragma unroll");
    w_.line("for (int e = 0; e < 8; ++e) fj_lds_store1(&{}[(d0 + e) * {} + r], chunk[e]);", buf,
            lds_strides_.at(buf));
  } else {
    w_.line("fj_lds_store8(&{}[{}], chunk);", buf, at);
    w_.close();
  }
  w_.close();
  if (consumers_copy)
    w_.close();
  w_.line("fj_stage_commit();");
  w_.close();
}

Status KernelEmitter::emit_store(const Op &op) {
  const ir::TensorParam &t = *p_.tensor(op.symbol_attr("tensor"));
  const Type &ty = type(op.operands[0]);
  const std::string v = name(op.operands[0]);
  const std::string base = block_base(t, head_base(t), name(op.operands[1]), "kBlockM");
  if (ty.is_vector()) {
    // One value per query row, written by the one lane the rules name for it.
    w_.line("float *{}_dst = {};", v, base);
    w_.line("#pragma unroll");
    w_.open("for (int qt = 0; qt < kQTiles; ++qt) {{");
    w_.line("#pragma unroll");
    w_.open("for (int s = 0; s < kRowSlots; ++s) {{");
    w_.line("const int row = query_row(qt, {});", rules_.slot_row("s"));
    w_.line("if ({} && row < {}) fj_global_store_f32({}_dst + {}, {}[qt][s]);", rules_.row_writer(),
            seq_const(t), v,
            row_offset(t, fmt::format("local_row(qt, {})", rules_.slot_row("s")), "row"), v);
    w_.close();
    w_.close();
    return Status::ok();
  }
  if (ty.layout != TileLayout::mma_acc)
    return Status::error("{} rules: `store` takes a #mma_acc tile", rules_.name());
  // The accumulator fragment, run by run: `len` consecutive head-dim entries of one row.
  const int len = rules_.acc_run_len();
  const std::vector<FragmentRun> runs = rules_.acc_runs();
  const bool f32 = ty.dtype == DType::f32;
  if (f32 != (t.dtype == DType::f32))
    return Status::error("{} rules: `store` of a {} tile into {} tensor @{}{}", rules_.name(),
                         dtype_name(ty.dtype), dtype_name(t.dtype), t.name,
                         f32 ? ": convert it first" : "");
  w_.line("{} *{}_dst = {};", f32 ? "float" : "fj_bits", v, base);
  // The forward's O where the rules stage it: through LDS rows of its own
  // (lds_o, declared after the barriers, where the estimate counts it), or else
  // over the tiles' LDS where a workgroup has one tile and the rows fit there.
  if (rules_.stages_output(t.dim) && t.name == "O" && len == 2 && runs.size() == 2 &&
      output_stage_applies(f32, t.stride_dim == ir::Extent::constant(1), t.row_align, t.dim)) {
    if (output_stage_bytes_ == 0)
      output_stage_bytes_ = output_stage_bytes(waves_, ty.cols, tail_lds_end(lds_bytes_), target_,
                                               rules_.resident_workgroups());
    const bool over_tiles = output_stage_bytes_ == 0 && producer_threads_ > 0 && !persistent_ &&
                            output_stage_size(waves_, ty.cols) <= lds_bytes_;
    if (output_stage_bytes_ > 0 || over_tiles) {
      emit_staged_store(t, v, ty.cols, over_tiles);
      return Status::ok();
    }
  }
  w_.line("#pragma unroll");
  w_.open("for (int qt = 0; qt < kQTiles; ++qt) {{");
  w_.line("#pragma unroll");
  w_.open("for (int c = 0; c < {}; ++c) {{", col_tiles(ty.cols));
  for (size_t r = 0; r < runs.size(); ++r) {
    w_.open("{{");
    w_.line("const int row = query_row(qt, {});", runs[r].row);
    w_.line("const int d0 = c * kNTile + {};", runs[r].col);
    w_.line("{} *dst = {}_dst + {};", f32 ? "float" : "fj_bits", v,
            row_offset(t, fmt::format("local_row(qt, {})", runs[r].row), "row"));
    w_.open("if (row < {}) {{", seq_const(t));
    const int first = int(r) * len;
    const std::string element = first ? fmt::format("{} + i", first) : "i";
    if (f32) { // split-KV's f32 partials, or f32 outputs (f32_io): element by element
      w_.line("for (int i = 0; i < {}; ++i)", len);
      w_.line("  if (d0 + i < {}) fj_global_store_f32(dst + long(d0 + i){}, {}[qt][c][{}]);",
              dim_const(t), dim_stride(t), v, element);
      w_.close();
      w_.close();
      continue;
    }
    w_.line("if (kVecLoads && d0 + {} <= {})", len, dim_const(t));
    if (runs.size() == 1 && (len == 8 || len == 4))
      w_.line("  fj_global_store{}(dst + d0, {}[qt][c]);", len, v);
    else if (len == 4) // several runs of 4 (CDNA 32x32): a slice of the fragment
      w_.line("  fj_global_store4(dst + d0, __builtin_shufflevector({0}[qt][c], {0}[qt][c], {1}, "
              "{2}, {3}, {4}));",
              v, first, first + 1, first + 2, first + 3);
    else if (len == 2)
      w_.line("  fj_global_store2(dst + d0, {0}[qt][c][{1}], {0}[qt][c][{2}]);", v, first,
              first + 1);
    else
      w_.line("  for (int i = 0; i < {}; ++i) fj_global_store1(dst + d0 + i, {}[qt][c][{} + i]);",
              len, v, first);
    w_.line("else");
    w_.line("  for (int i = 0; i < {}; ++i)", len);
    w_.line("    if (d0 + i < {}) fj_global_store1(dst + long(d0 + i){}, {}[qt][c][{}]);",
            dim_const(t), dim_stride(t), v, element);
    w_.close();
    w_.close();
  }
  w_.close();
  w_.close();
  return Status::ok();
}

// Each wave writes its 16 rows of a query tile into its own rows of lds_o
// (32-bit writes of the fragment's element pairs, 32 banks per write), then
// reads them back as 16-byte runs, a lane per run, and stores whole rows: a
// wave's 16-byte stores cover 512 contiguous bytes where its fragments covered
// 16 bytes of each of 8 rows. Only the wave touches its rows: a wave barrier
// orders the writes before the reads, and the next tile's writes after them.
// `over_tiles`: the rows lie over the tiles' LDS, which a workgroup of one tile
// (not persistent) no longer reads once every consumer has passed a barrier.
void KernelEmitter::emit_staged_store(const ir::TensorParam &t, const std::string &v, int64_t cols,
                                      bool over_tiles) {
  const int64_t pitch = output_stage_pitch(cols), runs = t.dim / 8;
  const std::vector<FragmentRun> frag = rules_.acc_runs();
  if (over_tiles) { // the producer has left: the last product read the tiles
    w_.line("fj_named_barrier(kThreads); // every consumer is past its last product");
    w_.line("fj_bits *const lds_o = reinterpret_cast<fj_bits *>(fj_dynamic_lds); // over the "
            "tiles");
  }
  w_.line("fj_bits *const {}_rows = lds_o + wave * {}; // this wave's 16 rows, {} apart", v,
          16 * pitch, pitch);
  w_.line("#pragma unroll");
  w_.open("for (int qt = 0; qt < kQTiles; ++qt) {{");
  w_.line("fj_wave_barrier(); // the wave's reads of its rows (the last tile's) are done");
  w_.line("#pragma unroll");
  w_.open("for (int c = 0; c < {}; ++c) {{", col_tiles(cols));
  for (size_t r = 0; r < frag.size(); ++r)
    w_.line("fj_lds_store2(&{0}_rows[({1}) * {2} + c * kNTile + {3}], {0}[qt][c][{4}], "
            "{0}[qt][c][{5}]);",
            v, frag[r].row, pitch, frag[r].col, 2 * r, 2 * r + 1);
  w_.close();
  w_.line("fj_wave_barrier(); // the wave's rows are in LDS");
  w_.line("#pragma unroll");
  w_.open("for (int k = 0; k < {}; ++k) {{ // 16 rows x {} runs of 8", (16 * runs + 31) / 32, runs);
  w_.line("const int i = k * kWave + lane, r = i / {}, j = i % {};", runs, runs);
  w_.line("const int row = query_row(qt, r);");
  w_.open("if ({}row < {}) {{", 16 * runs % 32 ? fmt::format("i < {} && ", 16 * runs) : "",
          seq_const(t));
  w_.line("fj_bits *dst = {}_dst + {};", v, row_offset(t, "local_row(qt, r)", "row"));
  w_.line("fj_global_store8(dst + j * 8, fj_lds_load8(&{}_rows[r * {} + j * 8]));", v, pitch);
  w_.close();
  w_.close();
  w_.close();
}

namespace {

/// What emit_mask_rows and emit_mask_columns share: the tile's rows and columns
/// as ScoreMod has them (rows of %op1's block, columns of %op2's: queries and
/// keys, or keys and queries in the backward's transposed tiles).
struct MaskTile {
  std::string rows_end, cols_end, row_stride, col_stride;
};

MaskTile mask_tile(const Op &op, const std::string &sq, const std::string &sk) {
  if (op.int_attr("transposed") != 0)
    return {sk, sq, "mask_k_stride", "mask_q_stride"};
  return {sq, sk, "mask_q_stride", "mask_k_stride"};
}

} // namespace

void KernelEmitter::emit_mask_rows(const Op &op, const std::string &var) {
  const MaskTile m = mask_tile(op, seq_const(*p_.tensor("Q")), seq_const(*p_.tensor("K")));
  const int len = rules_.acc_run_len();
  const std::vector<FragmentRun> runs = rules_.acc_runs();
  w_.line("// The mask tensor's rows of this tile: a run of {} consecutive {} per load where", len,
          op.int_attr("transposed") != 0 ? "queries" : "keys");
  w_.line("// the run is in bounds and aligned.");
  w_.line("const {} *{}_src[kQTiles][{}];", array_element_c(p_.array("attn_mask")->element).type,
          var, runs.size());
  w_.line("bool {}_ok[kQTiles][{}];", var, runs.size());
  open_query_tiles();
  for (size_t r = 0; r < runs.size(); ++r) {
    w_.open("{{");
    w_.line("const int row = {} * kBlockM + local_row(qt, {});", name(op.operands[1]), runs[r].row);
    // A row past the lengths reads nothing (null): none of its elements is inside.
    w_.line("{}_src[qt][{}] = row < {} ? attn_mask + ((long){} * mask_batch_stride + (long){} * "
            "mask_head_stride + (long)row * {}) : nullptr;",
            var, r, m.rows_end, name(p_.grid_arg(2)), name(p_.grid_arg(1)), m.row_stride);
    w_.line(
        "{0}_ok[qt][{1}] = {0}_src[qt][{1}] && {2} == 1 && (unsigned long long){0}_src[qt][{1}] "
        "% (sizeof(*attn_mask) * {3} < 16 ? sizeof(*attn_mask) * {3} : 16) == 0;",
        var, r, m.col_stride, len);
    w_.close();
  }
  w_.close();
}

void KernelEmitter::emit_early_masks(const std::vector<Op> &body, size_t from, size_t to) {
  early_masks_.clear();
  const ir::ArrayParam *mask = p_.array("attn_mask");
  const int len = rules_.acc_run_len();
  const std::vector<FragmentRun> runs = rules_.acc_runs();
  // One query tile per wave: with two, the sm80 kernels spilled 36-408 bytes
  // (head dims 64 and 96).
  if (!mask || len < 2 || !rules_.early_mask_loads() || q_tiles_ != 1)
    return;
  // The bits live across the S product: one register per run (a pair of 16-bit
  // elements, at most 4 bytes), at most 32 of them (wider runs spilled at D = 256).
  if (len * array_element_c(mask->element).bytes > 4)
    return;
  constexpr int kBudgetRegs = 32;
  for (size_t i = from; i < to; ++i) {
    const Op &op = body[i];
    if (op.kind != OpKind::ScoreMod ||
        p_.function(op.symbol_attr("function"))->text.find("attn_mask[") == std::string::npos)
      continue;
    const Type &t = type(op.results[0]);
    const int regs = col_tiles(t.cols) * int(runs.size());
    if (regs > kBudgetRegs)
      continue;
    const MaskTile m = mask_tile(op, seq_const(*p_.tensor("Q")), seq_const(*p_.tensor("K")));
    const std::string var = "fj_mask_" + name(op.results[0]);
    w_.line("// IR: the mask tensor's elements that %{} = score_mod reads, issued before the",
            name(op.results[0]));
    w_.line("// S product (their latency hides behind it), kept as bits: {} registers per lane.",
            regs);
    emit_mask_rows(op, var);
    w_.line("fj_mask_bits<{}, {}> {}_w[kQTiles][{}][{}];", len, array_element_c(mask->element).type,
            var, col_tiles(t.cols), runs.size());
    if (block_full_applies(op))
      w_.open("if (!fj_block_full) {{ // the block's class: full blocks read no element");
    else
      w_.open("{{");
    open_query_tiles();
    w_.line("#pragma unroll");
    w_.open("for (int c = 0; c < {}; ++c) {{", col_tiles(t.cols));
    for (size_t r = 0; r < runs.size(); ++r) {
      w_.line("{{ const int col = {} * kBlockN + c * kNTile + {};", name(op.operands[2]),
              runs[r].col);
      w_.line("  {0}_w[qt][c][{1}] = fj_mask_fetch<{2}>({0}_src[qt][{1}], col, {0}_ok[qt][{1}] && "
              "col + {2} <= {3}, {0}_src[qt][{1}] ? {3} - col : 0, {4}); }}",
              var, r, len, m.cols_end, m.col_stride);
    }
    w_.close();
    w_.close();
    w_.close();
    early_masks_.insert(&op);
  }
}

void KernelEmitter::emit_mask_columns(const Op &op, const std::string &var) {
  const MaskTile m = mask_tile(op, seq_const(*p_.tensor("Q")), seq_const(*p_.tensor("K")));
  const int len = rules_.acc_run_len();
  const std::vector<FragmentRun> runs = rules_.acc_runs();
  w_.line("float {}[kAccElems];", var);
  if (early_masks_.count(&op)) {
    for (size_t r = 0; r < runs.size(); ++r)
      w_.line("fj_mask_unpack({}_w[qt][c][{}], {} + {});", var, r, var, int(r) * len);
    return;
  }
  for (size_t r = 0; r < runs.size(); ++r) {
    const int first = int(r) * len;
    w_.open("{{");
    w_.line("const auto *const src = {}_src[qt][{}];", var, r);
    w_.line("const int col = {} * kBlockN + c * kNTile + {};", name(op.operands[2]), runs[r].col);
    const std::string element =
        fmt::format("{}[{}]", var, first ? fmt::format("{} + i", first) : "i");
    if (len > 1) {
      w_.line("if ({}_ok[qt][{}] && col + {} <= {})", var, r, len, m.cols_end);
      w_.line("  fj_mask_run<{}>(src + col, {}{});", len, var,
              first ? fmt::format(" + {}", first) : "");
      w_.line("else");
      w_.indent(1);
    }
    w_.line("for (int i = 0; i < {}; ++i)", len);
    w_.line("  {} = src && col + i < {} ? float(src[(long)(col + i) * {}]) : 0.0f;", element,
            m.cols_end, m.col_stride);
    if (len > 1)
      w_.indent(-1);
    w_.close();
  }
}

void KernelEmitter::emit_run_load(const std::string &frag, int first, int len, bool whole,
                                  const std::string &dim, const std::string &dim_stride) {
  w_.line("if (kVecLoads && d0 + {} <= {})", len, dim);
  if (whole)
    w_.line("  {} = fj_global_load{}(src + d0);", frag, len);
  else
    w_.line("  {{ const fj_bits{0} v = fj_global_load{0}(src + d0); for (int i = 0; i < {0}; ++i) "
            "{1}[{2} + i] = v[i]; }}",
            len, frag, first);
  w_.line("else");
  w_.line("  for (int i = 0; i < {}; ++i)", len);
  w_.line("    if (d0 + i < {}) {}[{}] = fj_global_load1(src + long(d0 + i){});", dim, frag,
          first ? fmt::format("{} + i", first) : "i", dim_stride);
}

} // namespace flashjit::lowering::emit
