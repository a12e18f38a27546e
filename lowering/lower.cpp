// Lowering of the attention tile IR to HIP: the op walk shared by every
// family. Values become per-lane register arrays (accumulator fragments of 16
// or 32 query rows, per-row statistics), K and V tiles are staged through LDS by the
// whole workgroup with 128-bit loads, and each IR op becomes one commented block
// of loops over fragments. What differs between families (how a fragment maps
// onto lanes, how operand fragments are read, the matrix instruction and the
// prelude) comes from lowering/rules.h: the AMD families share
// transposed_rules.h (rules_gfx11.cpp, rules_gfx12.cpp, rules_cdna.cpp and the
// portable rules_simt.cpp), NVIDIA has rules_sm80.cpp. This file is the op
// walk; lowering/emitter.h says where memory, loops and the rule choice live.
#include "lowering/emitter.h"

#include "ir/build.h"
#include "ir/expr.h"
#include "lowering/resources.h"
#include "templates/templates.h"

#include <algorithm>
#include <bit>
#include <functional>
#include <ranges>
#include <span>

namespace flashjit::lowering::emit {

namespace {

/// Whether a `for` in `body` narrows its range by a mask (the block-range pass).
bool uses_block_range(const std::vector<Op> &body) {
  for (const Op &op : body)
    if (op.kind == OpKind::For && (op.attrs.count("range") || uses_block_range(op.body)))
      return true;
  return false;
}

/// The name a draw of the element's own position takes in a score function
/// (not a name the expression language accepts, so it cannot collide).
constexpr std::string_view kDrawVar = "@draw";

/// Whether `e` reads the element's position or score.
bool varies_per_element(const ir::Expr &e) {
  return ir::uses_var(e, "score") || ir::uses_var(e, "q_idx") || ir::uses_var(e, "kv_idx");
}

/// `e` with each uniform(seed, offset, b, h, q_idx, kv_idx) whose seed and
/// offset are the same for every element replaced by variable @draw<i>, the
/// call appended to `draws`: the draws the emitter makes once per lane group.
ir::Expr take_element_draws(ir::Expr e, std::vector<ir::Expr> &draws) {
  static constexpr std::string_view kPosition[] = {"b", "h", "q_idx", "kv_idx"};
  if (e.kind == ir::Expr::Kind::call && e.name == "uniform" && !varies_per_element(e.args[0]) &&
      !varies_per_element(e.args[1]) &&
      std::ranges::equal(std::span(e.args).subspan(2), kPosition, [](const ir::Expr &a, auto v) {
        return a.kind == ir::Expr::Kind::var && a.name == v;
      })) {
    draws.push_back(std::move(e));
    ir::Expr var;
    var.kind = ir::Expr::Kind::var;
    var.name = fmt::format("{}{}", kDrawVar, draws.size() - 1);
    return var;
  }
  for (ir::Expr &a : e.args)
    a = take_element_draws(std::move(a), draws);
  return e;
}

/// The name a draw's comparison `@draw<i> >= threshold` takes: the draw's 16
/// bits compared with fj_threshold<i> as integers, or its keep bit, as
/// emit_draws shares the draw (DrawPlan::share).
constexpr std::string_view kKeepVar = "@keep";

/// Whether every read of draw @draw<i> in `e` is a comparison `@draw<i> >= x`,
/// all with one x that is the same for every element; that x's C text in
/// `thresholds[i]` (empty until found).
bool draw_thresholds(const ir::Expr &e, std::vector<std::string> &thresholds,
                     const std::function<std::string(const std::string &)> &names) {
  auto draw_index = [](const ir::Expr &v) -> int {
    if (v.kind != ir::Expr::Kind::var || !v.name.starts_with(kDrawVar))
      return -1;
    return std::stoi(v.name.substr(kDrawVar.size()));
  };
  if (e.kind == ir::Expr::Kind::binary && e.name == ">=" && draw_index(e.args[0]) >= 0 &&
      !varies_per_element(e.args[1])) {
    std::string &x = thresholds[size_t(draw_index(e.args[0]))];
    const std::string text = ir::emit_c(e.args[1], names);
    if (!x.empty() && x != text)
      return false;
    x = text;
    return true;
  }
  if (draw_index(e) >= 0)
    return false;
  return std::ranges::all_of(
      e.args, [&](const ir::Expr &a) { return draw_thresholds(a, thresholds, names); });
}

/// `e` with each `@draw<i> >= x` as variable @keep<i> (after draw_thresholds).
ir::Expr take_draw_thresholds(ir::Expr e) {
  if (e.kind == ir::Expr::Kind::binary && e.name == ">=" && e.args[0].kind == ir::Expr::Kind::var &&
      e.args[0].name.starts_with(kDrawVar)) {
    ir::Expr var;
    var.kind = ir::Expr::Kind::var;
    var.is_int = true;
    var.name = std::string(kKeepVar) + e.args[0].name.substr(kDrawVar.size());
    return var;
  }
  for (ir::Expr &a : e.args)
    a = take_draw_thresholds(std::move(a));
  return e;
}

/// The bits of `x` under `mask`, packed from bit 0 (BMI2's pext).
int pext(int x, int mask) {
  int out = 0, i = 0;
  for (int bit = 1; bit <= mask; bit *= 2) {
    if (!(mask & bit))
      continue;
    if (x & bit)
      out |= 1 << i;
    ++i;
  }
  return out;
}

/// The name a mask tensor's element takes in a score function once
/// emit_mask_columns has loaded it (not a name the expression language
/// accepts, so it cannot collide).
constexpr std::string_view kMaskVar = "@mask";

/// `e` with each read of the mask tensor's element (ir::kMaskElement), and each
/// `inside ? element : 0` around one (emit_mask_columns gives 0 outside), as
/// variable @mask; `found` counts them.
ir::Expr take_mask_elements(ir::Expr e, const std::string &element, const std::string &guarded,
                            int &found) {
  if ((e.kind == ir::Expr::Kind::load && e.name == "attn_mask" && ir::print_expr(e) == element) ||
      (e.kind == ir::Expr::Kind::select && ir::print_expr(e) == guarded)) {
    ++found;
    ir::Expr var;
    var.kind = ir::Expr::Kind::var;
    var.name = kMaskVar;
    return var;
  }
  for (ir::Expr &a : e.args)
    a = take_mask_elements(std::move(a), element, guarded, found);
  return e;
}

} // namespace

KernelEmitter::DrawPlan KernelEmitter::draw_plan(bool transposed, int col_tiles) const {
  // Element (c, e) of lane l (column tile c of a round) is query q and key k of
  // its fragments; its draw is (q, k / ir::kDrawKeys). The fragments' origins
  // (query and key blocks, tiles) are multiples of the run and the same in
  // every lane of a wave, so the lane maps alone decide.
  const int elems = rules_.acc_elems(), lanes = target_.wave_size;
  const bool aligned = rules_.n_tile() % ir::kDrawKeys == 0 && m_tile_ % ir::kDrawKeys == 0;
  auto draw_of = [&](int lane, int c, int e) {
    MatrixCoord x = rules_.acc_coord(lane, e);
    x.col += c * rules_.n_tile();
    const auto [q, k] = transposed ? std::pair(x.col, x.row) : std::pair(x.row, x.col);
    return std::pair(q, k / int(ir::kDrawKeys));
  };
  auto plan_of = [&](int tiles) {
    DrawPlan plan;
    plan.tiles = tiles;
    // The elements by draw, in the order of their first element; the same
    // grouping in every lane, or one draw per element.
    std::vector<std::pair<int, int>> all;
    for (int c = 0; c < tiles; ++c)
      for (int e = 0; e < elems; ++e)
        all.emplace_back(c, e);
    for (auto [c, e] : all) {
      auto same = [&](const std::vector<std::pair<int, int>> &d) {
        if (!aligned)
          return false;
        for (int lane = 0; lane < lanes; ++lane)
          if (draw_of(lane, c, e) != draw_of(lane, d.front().first, d.front().second))
            return false;
        return true;
      };
      auto it = std::ranges::find_if(plan.draws, same);
      if (it == plan.draws.end())
        plan.draws.push_back({{c, e}});
      else
        it->push_back({c, e});
    }
    // Lane bits whose flip keeps a lane's draws: such lanes share them.
    for (int bit = 1; bit < lanes; bit *= 2) {
      bool partners = aligned;
      for (int lane = 0; lane < lanes && partners; ++lane)
        for (auto [c, e] : all)
          partners = partners && draw_of(lane, c, e) == draw_of(lane ^ bit, c, e);
      if (partners)
        plan.lane_bits |= bit;
    }
    return plan;
  };
  // The one word of each draw a lane reads, where that is a function of its
  // rank among the sharing lanes alone (pext(lane, lane_bits)).
  auto word_of_rank = [&](const DrawPlan &plan) {
    std::vector<int> words(size_t(plan.sharing()), -1);
    for (int lane = 0; lane < lanes; ++lane) {
      const int rank = pext(lane, plan.lane_bits);
      for (const auto &draw : plan.draws)
        for (auto [c, e] : draw) {
          MatrixCoord x = rules_.acc_coord(lane, e);
          x.col += c * rules_.n_tile();
          const int word = (transposed ? x.row : x.col) % int(ir::kDrawKeys) / 2;
          if (words[size_t(rank)] != -1 && words[size_t(rank)] != word)
            return std::vector<int>{};
          words[size_t(rank)] = word;
        }
    }
    return words;
  };
  // The fewest column tiles whose draws the sharing lanes can split evenly.
  DrawPlan one_tile = plan_of(1);
  one_tile.col_tiles = col_tiles;
  for (int tiles = 1; tiles <= 8 && col_tiles % tiles == 0; tiles *= 2) {
    DrawPlan plan = tiles == 1 ? one_tile : plan_of(tiles);
    plan.col_tiles = col_tiles;
    if (plan.draws.size() % size_t(plan.sharing()) == 0) {
      if (plan.sharing() > 1)
        plan.word_of_rank = word_of_rank(plan);
      return plan;
    }
  }
  one_tile.lane_bits = 0; // each lane draws for itself
  return one_tile;
}

void KernelEmitter::emit_draws(const DrawPlan &plan, const std::vector<ir::Expr> &draws,
                               const std::vector<std::string> &thresholds,
                               const std::function<std::string(const std::string &)> &names,
                               const std::string &q_idx, const std::string &kv_idx,
                               const std::function<void(int c, int e)> &element) {
  // One Philox draw serves 8 aligned keys of a query (ir::kDrawKeys). Each
  // lane draws plan.draws.size() / sharing of a round's draws; the lanes that
  // hold the same draws (they differ in lane_bits) share them as plan.share
  // says.
  const int sharing = plan.sharing(), own = int(plan.draws.size()) / sharing;
  const DrawPlan::Share share = plan.share(!thresholds.empty());
  const bool keep_bits = share == DrawPlan::Share::keep_bits;
  const bool one_word = share == DrawPlan::Share::one_word;
  std::vector<int> bits; // the lane bits of lane_bits, low to high
  for (int bit = 1; bit <= plan.lane_bits; bit *= 2)
    if (plan.lane_bits & bit)
      bits.push_back(bit);
  auto lane_of = [&](int rank) { // pdep(rank, lane_bits)
    int lane = 0;
    for (size_t i = 0; i < bits.size(); ++i)
      lane |= (rank >> i & 1) ? bits[i] : 0;
    return lane;
  };
  if (keep_bits)
    w_.open("{{ // {} draw(s) per query and {} aligned keys; lanes differing in bits {:#x} hold "
            "the same {} draws: each lane draws {}, makes each draw 8 keep bits, and they OR "
            "their bits together",
            draws.size(), ir::kDrawKeys, plan.lane_bits, plan.draws.size(), own);
  else if (one_word)
    w_.open("{{ // {} draw(s) per query and {} aligned keys; lanes differing in bits {:#x} hold "
            "the same {} draws, each lane draws {} and they pass each other the word each "
            "reads (word {} by rank)",
            draws.size(), ir::kDrawKeys, plan.lane_bits, plan.draws.size(), own,
            fmt::join(plan.word_of_rank, ", "));
  else if (sharing > 1)
    w_.open("{{ // {} draw(s) per query and {} aligned keys; lanes differing in bits {:#x} hold "
            "the same {} draws, each lane draws {} and they pass them round",
            draws.size(), ir::kDrawKeys, plan.lane_bits, plan.draws.size(), own);
  else
    w_.open("{{ // {} draw(s) per query and {} aligned keys", draws.size(), ir::kDrawKeys);
  for (size_t d = 0; d < draws.size(); ++d) {
    w_.line("const fj_draw_key fj_key{} = fj_philox_key((unsigned long long)({}), (unsigned "
            "long long)({}));",
            d, ir::emit_c(draws[d].args[0], names), ir::emit_c(draws[d].args[1], names));
    if (!thresholds.empty())
      w_.line("const unsigned fj_threshold{} = fj_draw_threshold({});", d, thresholds[d]);
  }
  if (sharing > 1) {
    // pext(lane, lane_bits): one shift and mask for a run of bits.
    const int low = std::countr_zero(unsigned(plan.lane_bits));
    std::string rank = fmt::format("(lane >> {}) & {}", low, sharing - 1);
    if (plan.lane_bits >> low != sharing - 1) {
      std::vector<std::string> terms;
      for (size_t i = 0; i < bits.size(); ++i)
        terms.push_back(fmt::format("(lane & {}) >> {}", bits[i],
                                    std::countr_zero(unsigned(bits[i])) - int(i)));
      rank = fmt::format("{}", fmt::join(terms, " | "));
    }
    w_.line("const int fj_rank = {}; // this lane's index among those sharing its draws", rank);
  }
  const std::string b = name(p_.grid_arg(2)), h = name(p_.grid_arg(1));
  open_query_tiles();
  w_.line("#pragma unroll");
  w_.open("for (int c0 = 0; c0 < {}; c0 += {}) {{", plan.col_tiles, plan.tiles);
  // Keep bits: a 32-bit word holds 4 draws' bits, 8 each; `words` per own draw.
  const int words = std::max(1, sharing / 4);
  for (size_t d = 0; d < draws.size(); ++d)
    for (int i = 0; i < own; ++i) {
      if (keep_bits)
        w_.line("unsigned fj_keep{}_{}[{}];", d, i, words);
      else if (one_word)
        w_.line("unsigned fj_recv{}_{}[{}]; // [x]: the word this lane reads of rank fj_rank ^ x's "
                "draw",
                d, i, sharing);
      else
        w_.line("fj_draw_words fj_own{}_{};", d, i);
    }
  // The word the lane of rank `rank` (C text) reads, for one_word.
  const bool word_is_rank =
      std::ranges::equal(plan.word_of_rank, std::views::iota(0, int(plan.word_of_rank.size())));
  auto word_of = [&](const std::string &rank) {
    if (word_is_rank)
      return rank;
    std::string chain = std::to_string(plan.word_of_rank.back());
    for (int r = sharing - 2; r >= 0; --r)
      chain = fmt::format("{} == {} ? {} : {}", rank, r, plan.word_of_rank[size_t(r)], chain);
    return fmt::format("({})", chain);
  };
  for (int i = 0; i < own; ++i) {
    // This lane's draw i is the round's draw fj_rank + i * sharing: the position
    // of that draw's first element.
    w_.open("{{");
    std::string fj_q = q_idx, fj_k = kv_idx;
    if (sharing == 1) {
      const auto [c, e] = plan.draws[size_t(i)].front();
      w_.line("const int c = c0 + {}, e = {};", c, e);
    } else {
      w_.line("int fj_q = 0, fj_k = 0;");
      for (int r = 0; r < sharing; ++r) {
        const auto [c, e] = plan.draws[size_t(r + i * sharing)].front();
        w_.line(
            "{{ const int c = c0 + {}, e = {}; if (fj_rank == {}) {{ fj_q = {}; fj_k = {}; }} }}",
            c, e, r, q_idx, kv_idx);
      }
      fj_q = "fj_q";
      fj_k = "fj_k";
    }
    for (size_t d = 0; d < draws.size(); ++d) {
      const std::string draw =
          fmt::format("fj_draw(fj_key{}, {}, {}, {}, {})", d, b, h, fj_q, fj_k);
      if (one_word) {
        // Round x: this lane's draw goes to the lane of rank fj_rank ^ x, as
        // the one word that lane reads.
        w_.line("const fj_draw_words fj_mine = {};", draw);
        for (int x = 0; x < sharing; ++x) {
          const std::string word =
              fmt::format("fj_pick_word(fj_mine, {})", word_of(fmt::format("(fj_rank ^ {})", x)));
          if (x == 0)
            w_.line("fj_recv{}_{}[0] = {};", d, i, word);
          else
            w_.line("fj_recv{}_{}[{}] = fj_shfl_u32({}, lane, lane ^ {:#x});", d, i, x, word,
                    lane_of(x));
        }
        continue;
      }
      if (!keep_bits) {
        w_.line("fj_own{}_{} = {};", d, i, draw);
        continue;
      }
      // The 8 bits at 8 * (fj_rank % 4) of word fj_rank / 4; the sharing lanes
      // OR them together within a word (a butterfly over the rank's low two
      // bits), then each word comes from a lane of its ranks.
      w_.line("unsigned fj_mine = fj_keep_bits({}, fj_threshold{}){};", draw, d,
              sharing > 1 ? " << (8 * (fj_rank % 4))" : "");
      for (int r = 1; r < std::min(sharing, 4); r *= 2)
        w_.line("fj_mine |= fj_shfl_u32(fj_mine, lane, lane ^ {:#x});", lane_of(r));
      if (words == 1)
        w_.line("fj_keep{}_{}[0] = fj_mine;", d, i);
      for (int word = 0; words > 1 && word < words; ++word)
        w_.line("fj_keep{}_{}[{}] = fj_shfl_u32(fj_mine, lane, (lane & ~{:#x}) | {:#x});", d, i,
                word, plan.lane_bits, lane_of(4 * word));
    }
    w_.close();
  }
  for (size_t j = 0; j < plan.draws.size(); ++j) {
    const std::vector<std::pair<int, int>> &elems = plan.draws[j];
    std::vector<std::string> listed;
    for (auto [c, e] : elems)
      listed.push_back(fmt::format("({}, {})", c, e));
    w_.open("{{ // draw {} of the round: elements (c, e) {}", j, fmt::join(listed, " "));
    for (size_t d = 0; d < draws.size(); ++d) {
      const size_t rank = j % size_t(sharing), i = j / size_t(sharing);
      if (keep_bits) {
        // Draw j is rank j % sharing's draw i: its bits in fj_keep<d>_<i>.
        w_.line("const unsigned fj_keepword{} = fj_keep{}_{}[{}];", d, d, i, rank / 4);
        w_.line("const int fj_keepbase{} = {};", d, 8 * (rank % 4));
        continue;
      }
      if (one_word) { // rank j % sharing's draw came in round (j % sharing) ^ fj_rank
        w_.line("const unsigned fj_word{} = fj_pick(fj_recv{}_{}, {} ^ fj_rank);", d, d, i, rank);
        continue;
      }
      const std::string from = fmt::format("fj_own{}_{}", d, i);
      if (sharing == 1) {
        w_.line("const fj_draw_words &fj_draw{} = {};", d, from);
        continue;
      }
      // From the sharing lane of rank j % sharing.
      w_.line("fj_draw_words fj_draw{};", d);
      w_.line("const int fj_from = (lane & ~{:#x}) | {:#x};", plan.lane_bits, lane_of(int(rank)));
      w_.line("#pragma unroll");
      w_.line("for (int w = 0; w < 4; ++w) fj_draw{}.w[w] = fj_shfl_u32({}.w[w], lane, fj_from);",
              d, from);
    }
    for (auto [c, e] : elems)
      element(c, e);
    w_.close();
  }
  w_.close();
  w_.close();
  w_.close();
}

std::string KernelEmitter::declare(ValueId v) {
  const Type &t = type(v);
  const std::string n = name(v);
  if (predeclared_.count(v))
    return fmt::format("// {}: declared before the query-tile passes", n);
  if (t.is_index())
    return fmt::format("int {}", n);
  if (t.is_vector())
    return fmt::format("float {}[kQTiles][kRowSlots]", n);
  if (t.layout == TileLayout::mma_a)
    return fmt::format("{} {}[kQTiles][{}]", rules_.operand_type(), n, tiles(t.cols));
  return fmt::format("{} {}[kQTiles][{}]",
                     t.dtype == DType::f32 ? rules_.acc_type() : rules_.acc16_type(), n,
                     col_tiles(t.cols));
}

std::string KernelEmitter::open_elements(const Type &t, const std::string &var) {
  open_query_tiles();
  return open_tile_elements(t, var);
}

std::string KernelEmitter::open_tile_elements(const Type &t, const std::string &var) {
  w_.line("#pragma unroll");
  if (t.is_vector()) {
    w_.open("for (int s = 0; s < kRowSlots; ++s) {{");
    return var + "[qt][s]";
  }
  w_.open("for (int c = 0; c < {}; ++c) {{", col_tiles(t.cols));
  w_.line("#pragma unroll");
  w_.open("for (int e = 0; e < kAccElems; ++e) {{");
  return var + "[qt][c][e]";
}

void KernelEmitter::close_elements(const Type &t) {
  close_tile_elements(t);
  w_.close();
}

void KernelEmitter::close_tile_elements(const Type &t) {
  if (!t.is_vector())
    w_.close();
  w_.close();
}

void KernelEmitter::barrier_if_read(const std::string &buffer) {
  if (read_since_barrier_.count(buffer)) {
    w_.line("{}; // every wave is done reading {} before it is overwritten", barrier(), buffer);
    read_since_barrier_.clear();
  }
}

const Op *KernelEmitter::consumer_of(ValueId v, const std::vector<Op> &body) const {
  for (const Op &op : body) {
    if (std::find(op.operands.begin(), op.operands.end(), v) != op.operands.end())
      return &op;
    if (const Op *inner = consumer_of(v, op.body))
      return inner;
  }
  return nullptr;
}

// The masks become kernel constants, so every mask and loop must agree on them.
Status KernelEmitter::find_mask(const std::vector<Op> &body) {
  for (const Op &op : body) {
    if (op.kind == OpKind::Mask || op.kind == OpKind::For) {
      ir::Attrs a;
      for (const char *k : {"causal", "window_left", "window_right", "q_group"})
        if (op.attrs.count(k))
          a[k] = op.attrs.at(k);
      if (mask_.attrs.empty())
        mask_.attrs = a;
      else if (mask_.attrs != a)
        return Status::error("{} rules: the program's masks disagree (causal/window/q_group "
                             "differ between ops); one kernel implements one mask",
                             rules_.name());
    }
    FJ_RETURN_IF_ERROR(find_mask(op.body));
  }
  return Status::ok();
}

// The widest global access the tensors' row alignment allows (IR `align`):
// 16 bytes for 128-bit runs, 8 for 64-bit ones, else element by element. f32
// tensors that are only stored (the LSE, split-KV's partials, f32_io's output)
// are written element by element and do not count.
Status KernelEmitter::declare_params() {
  const std::set<std::string> narrowed = narrowed_tensors();
  f32_inputs_ = !narrowed.empty();
  for (const ir::TensorParam &t : p_.tensors) {
    if (t.dtype == DType::f32 && !narrowed.count(t.name))
      continue;
    const bool unit = t.stride_dim == ir::Extent::constant(1);
    if (!unit || t.row_align < 16 || t.dim % 8)
      vec_ok_ = false;
    if (!unit || t.row_align < 8 || t.dim % 4)
      vec4_ok_ = false;
  }
  return Status::ok();
}

std::set<std::string> KernelEmitter::narrowed_tensors() const {
  std::set<std::string> out;
  std::function<void(const std::vector<Op> &)> walk = [&](const std::vector<Op> &ops) {
    for (const Op &op : ops) {
      if (op.kind == OpKind::Load) {
        const ir::TensorParam &t = *p_.tensor(op.symbol_attr("tensor"));
        if (t.dtype == DType::f32 && type(op.results[0]).dtype != DType::f32)
          out.insert(t.name);
      }
      walk(op.body);
    }
  };
  walk(p_.body);
  return out;
}

// f32 tensors in memory (f32_io): overloads of the loads and the staging for
// `const float *`, each element rounded to the operand type (fj_from_f32). 128-bit
// runs load as two f32x4; 64-bit runs (only 8-byte aligned) element by element.
void KernelEmitter::emit_narrowing_loads() {
  w_.line("// ---- f32 tensors in memory: each element rounded to {} as it loads ----",
          dtype_name(p_.operand_dtype()));
  w_.line("FJ_DEVICE fj_bits fj_global_load1(const float *p) {{ return "
          "fj_from_f32(fj_global_load_f32(p)); }}");
  if (target_.is_nvidia())
    w_.line("FJ_DEVICE fj_bits2 fj_global_load2(const float *p) {{ fj_bits2 v; v[0] = "
            "fj_global_load1(p); v[1] = fj_global_load1(p + 1); return v; }}");
  w_.open("FJ_DEVICE fj_bits4 fj_global_load4(const float *p) {{");
  w_.line("fj_bits4 v;");
  w_.line("for (int i = 0; i < 4; ++i) v[i] = fj_global_load1(p + i);");
  w_.line("return v;");
  w_.close();
  w_.open("FJ_DEVICE fj_bits8 fj_global_load8(const float *p) {{");
  w_.line("const fj_float4 a = fj_global_load_f32x4(p), b = fj_global_load_f32x4(p + 4);");
  w_.line("fj_bits8 v;");
  w_.line(
      "for (int i = 0; i < 4; ++i) {{ v[i] = fj_from_f32(a[i]); v[i + 4] = fj_from_f32(b[i]); }}");
  w_.line("return v;");
  w_.close();
  w_.open("FJ_DEVICE void fj_stage8(fj_bits *lds, const float *src, bool valid) {{");
  w_.line("fj_bits8 v = {{0, 0, 0, 0, 0, 0, 0, 0}};");
  w_.line("if (valid)");
  w_.line("  v = fj_global_load8(src);");
  w_.line("fj_lds_store8(lds, v);");
  w_.close();
  w_.open("FJ_DEVICE void fj_stage4(fj_bits *lds, const float *src, bool valid) {{");
  w_.line("for (int e = 0; e < 4; ++e)");
  w_.line("  fj_lds_store1(lds + e, valid ? fj_global_load1(src + e) : fj_bits(0));");
  w_.close();
  w_.blank();
}

void KernelEmitter::emit_constants() {
  const ir::TensorParam &q = *p_.tensor("Q"), &v = *p_.tensor("V");
  auto c = [&](std::string decl, std::string comment) {
    constants_.emplace_back(std::move(decl), std::move(comment));
  };
  c(fmt::format("constexpr int kWave = {};", target_.wave_size), "lanes per wave");
  c(fmt::format("constexpr int kWaves = {};", waves_),
    fmt::format("waves per workgroup; each owns kQTiles x {} queries", m_tile_));
  c(fmt::format("constexpr int kThreads = {};", waves_ * target_.wave_size),
    "work-items per workgroup");
  c(fmt::format("constexpr int kBlockM = {};", block_m_), "queries per workgroup");
  c(fmt::format("constexpr int kBlockN = {};", block_n_), "keys per KV block");
  c(fmt::format("constexpr int kQTiles = {};", q_tiles_),
    fmt::format("{}-query tiles per wave", m_tile_));
  c(fmt::format("constexpr int kNTile = {};", rules_.n_tile()),
    "columns of an accumulator fragment");
  c(fmt::format("constexpr int kAccElems = {};", rules_.acc_elems()),
    "accumulator elements per lane and fragment");
  c(fmt::format("constexpr int kRowSlots = {};", rules_.row_slots()),
    fmt::format("query rows per lane and {}-row fragment", m_tile_));
  c(fmt::format("constexpr int kDimQK = {};", q.dim),
    fmt::format("head_dim_qk (padded to {} in registers only)", pad_k_));
  c(fmt::format("constexpr int kDimV = {};", v.dim),
    fmt::format("head_dim_v (padded to {} in registers only)", pad_k_));
  c(fmt::format("constexpr bool kCausal = {};", mask_.int_attr("causal") ? "true" : "false"),
    "bottom-right aligned when seqlen_q != seqlen_k");
  c(fmt::format("constexpr bool kVec4Loads = {};", vec4_ok_ ? "true" : "false"),
    "rows are 8-byte aligned runs: 64-bit copies into LDS");
  c(fmt::format("constexpr bool kVecLoads = {};", vec_ok_ ? "true" : "false"),
    "rows are 16-byte aligned runs: 128-bit global loads and stores");
}

Expected<Lowered> KernelEmitter::run() {
  const ir::Attrs &cfg = p_.config;
  auto get = [&](const char *k) { return cfg.count(k) ? std::get<int64_t>(cfg.at(k)) : 0; };
  block_m_ = get("block_m");
  block_n_ = get("block_n");
  waves_ = get("waves");
  q_in_lds_ = get("q_in_lds") != 0;
  persistent_ = get("persistent") != 0;
  prefetch_blocks_ = get("prefetch_blocks") != 0;
  if (q_in_lds_ && !rules_.reads_q_from_lds())
    return Status::error("{} rules: config q_in_lds=1 is not supported: keep Q in registers",
                         rules_.name());
  pad_k_ = cfg.count("pad_k") ? get("pad_k") : 16;
  m_tile_ = rules_.m_tile();
  if (waves_ < 1 || block_m_ % (m_tile_ * waves_) != 0)
    return Status::error("{} rules: block_m ({}) must be a multiple of {} x waves ({})",
                         rules_.name(), block_m_, m_tile_, waves_);
  if (block_n_ % kKTile != 0 || block_n_ % rules_.n_tile() != 0)
    return Status::error("{} rules: block_n ({}) must be a multiple of {}", rules_.name(), block_n_,
                         std::max(kKTile, rules_.n_tile()));
  for (const ir::ValueDef &v : p_.values)
    if (v.type.layout == TileLayout::mma_acc && v.type.cols % rules_.n_tile() != 0)
      return Status::error("{} rules: a {}x{} accumulator tile is not made of {}-column "
                           "fragments: use pad_k {} (head_dim_v {} is padded to pad_k {})",
                           rules_.name(), v.type.rows, v.type.cols, rules_.n_tile(),
                           rules_.n_tile(), p_.tensor("V")->dim, pad_k_);
  if (!rules_.lowers({waves_, q_in_lds_, p_.tensor("dO") != nullptr}))
    return Status::error("{} rules cannot lower this program ({} waves, Q in {}): {}",
                         rules_.name(), waves_, q_in_lds_ ? "LDS" : "registers",
                         rules_.warpgroup_products()
                             ? "warpgroup products take forward programs with whole "
                               "warpgroups (waves in multiples of 4) and Q in LDS"
                             : "use another config");
  if (waves_ * target_.wave_size > target_.max_workgroup_size)
    return Status::error("{} waves of {} lanes exceed {}'s workgroup limit of {} work-items",
                         waves_, target_.wave_size, target_.arch, target_.max_workgroup_size);
  q_tiles_ = block_m_ / (m_tile_ * waves_);
  FJ_RETURN_IF_ERROR(find_mask(p_.body));
  FJ_RETURN_IF_ERROR(declare_params());
  emit_constants();

  // The kernel body first (it decides the LDS buffers), then the text around it.
  HipWriter body;
  std::swap(w_, body);
  w_.indent(1);
  w_.line("const int lane = fj_thread_id() % kWave;");
  w_.line("const int wave = fj_thread_id() / kWave;");
  rules_.emit_lane_vars(w_);
  if (persistent_) {
    FJ_RETURN_IF_ERROR(emit_persistent());
  } else {
    emit_grid_args("");
    emit_sequences();
    emit_row_helpers();
    FJ_RETURN_IF_ERROR(emit_ops(p_.body));
  }
  std::swap(w_, body);

  const DType dtype = p_.operand_dtype();
  // The kernel text: everything but the target prelude and the matrix wrapper,
  // so the emulator can run the same text under its own prelude.
  HipWriter kernel;
  std::swap(w_, kernel);
  w_.line("// ---- the element type ({}) ----", dtype_name(dtype));
  w_.line("FJ_DEVICE float fj_to_f32(fj_bits x) {{ return fj_{}_to_f32(x); }}", dtype_name(dtype));
  w_.line("FJ_DEVICE fj_bits fj_from_f32(float x) {{ return fj_f32_to_{}(x); }}",
          dtype_name(dtype));
  w_.blank();
  rules_.emit_staging_helpers(w_);
  if (f32_inputs_)
    emit_narrowing_loads();
  w_.line("// ---- the spec and config, as named constants ----");
  for (const auto &[decl, comment] : constants_)
    w_.line("{}{}", decl, comment.empty() ? "" : " // " + comment);
  w_.blank();
  w_.raw(templates::attention_common);
  w_.blank();
  if (uses_block_range(p_.body)) {
    w_.raw(templates::block_range);
    w_.blank();
    if (p_.array("attn_mask_blocks")) {
      w_.raw(templates::mask_blocks);
      w_.blank();
    }
  }
  if (!rules_.kernel_helpers().empty()) {
    w_.raw(rules_.kernel_helpers());
    w_.blank();
  }
  // The parameters: the tensors, then the run-time shapes (IR scalars).
  std::vector<KernelParam> params;
  // Tensors that a store writes; every other one is read only.
  std::set<std::string> stored;
  std::function<void(const std::vector<Op> &)> find_stores = [&](const std::vector<Op> &ops) {
    for (const Op &op : ops) {
      if (op.kind == OpKind::Store)
        stored.insert(op.symbol_attr("tensor"));
      find_stores(op.body);
    }
  };
  find_stores(p_.body);
  for (const ir::TensorParam &t : p_.tensors) {
    const bool output = stored.count(t.name) > 0;
    const char *element = element_type(t);
    params.push_back({t.name, KernelParam::Kind::tensor, ir::ScalarType::i64,
                      fmt::format("{}{} *", output ? "" : "const ", element)});
  }
  for (const std::string &index : p_.indices)
    params.push_back({index, KernelParam::Kind::tensor, ir::ScalarType::i64, "const int *"});
  for (const ir::ArrayParam &array : p_.arrays) {
    params.push_back({array.name, KernelParam::Kind::tensor, ir::ScalarType::i64,
                      fmt::format("const {} *", array_element_c(array.element).type)});
  }
  for (const ir::ScalarParam &sp : p_.scalars)
    params.push_back({sp.name, KernelParam::Kind::scalar, sp.type, c_scalar_type(sp.type)});
  if (dynamic_tiles_) // zeroed by the launch (Lowered::tile_counter)
    params.push_back({"fj_tile_counter", KernelParam::Kind::tensor, ir::ScalarType::i64,
                      "unsigned long long *"});
  for (const auto &[map, load] : maps_)
    params.push_back({map, KernelParam::Kind::tensor_map, ir::ScalarType::i64,
                      "const __grid_constant__ fj_tensor_map",
                      *p_.tensor(load->symbol_attr("tensor")), type(load->results[0]).rows});
  for (const TailLds &a : tail_lds())
    declare_lds(a.elem, a.name, a.count, a.bytes, 8, a.what);
  if (output_stage_bytes_ > 0)
    declare_lds("fj_bits", "lds_o", output_stage_bytes_ / 2, output_stage_bytes_, 16,
                "each wave's 16 rows of O on their way to memory as 16-byte runs");
  const int64_t threads = waves_ * target_.wave_size + producer_threads_;
  if (producer_threads_ > 0 && producer_budget().blocks > 1) // what setmaxnreg shares out
    w_.line("FJ_GLOBAL FJ_WORKGROUP_SIZE_MIN_BLOCKS({}, {})", threads, producer_budget().blocks);
  else if (const int blocks = nvidia_min_blocks(); blocks > 1)
    w_.line("FJ_GLOBAL FJ_WORKGROUP_SIZE_MIN_BLOCKS({}, {}) // {} blocks per SM, {}", threads,
            blocks, blocks,
            p_.sequences.empty() ? "the registers of the draws bounded" : "as without sequences");
  else
    w_.line("FJ_GLOBAL FJ_WORKGROUP_SIZE({})", threads);
  w_.line("void {}(", p_.name);
  w_.indent(2);
  for (size_t i = 0; i < params.size(); ++i) {
    const KernelParam &kp = params[i];
    w_.line("{}{}{}{}", kp.c_type, kp.kind == KernelParam::Kind::tensor ? "__restrict__ " : " ",
            kp.name, i + 1 < params.size() ? "," : ") {");
  }
  w_.indent(-2);
  w_.indent(1);
  for (const std::string &decl : lds_decls_)
    w_.line("{}", decl);
  if (tma_bars_ > 0) {
    w_.line("unsigned fj_tma_phase = 0; // bit i: the parity of barrier i's next fill");
    if (free_bars_ > 0)
      w_.line("fj_mbar_init(fj_free_bar, {}, kThreads); // the consumers' arrivals", free_bars_);
    if (dynamic_tiles_) {
      w_.line("fj_mbar_init(fj_tile_bar, 2, 1); // a tile slot's fill: the producer's arrival");
      w_.line("fj_mbar_init(fj_tile_bar + 2, 2, kThreads); // its read: the consumers' arrivals");
    }
    w_.line("fj_tma_init(fj_tma_bar, {});", tma_bars_);
  }
  w_.raw(body.str());
  w_.close();
  std::swap(w_, kernel);

  w_.line("// flashjit kernel {} for {} ({} rules, wave{}, {})", p_.name, target_.target_id(),
          rules_.name(), target_.wave_size,
          !mi_                   ? "FMAs, no matrix instruction"
          : mi_->builtin.empty() ? rules_.instruction_name(*mi_)
                                 : mi_->builtin);
  if (!note_.empty())
    w_.line("// {}", note_);
  w_.line("// Generated from the tile IR; `flashjit emit --print-ir` prints the program.");
  w_.line("// Each block below names the IR op it implements.");
  w_.blank();
  w_.raw(rules_.prelude());
  w_.blank();
  w_.line("// ---- the matrix instruction ----");
  if (mi_)
    rules_.emit_mma_wrapper(w_, *mi_, dtype);
  else
    w_.line("// none: the {} rules multiply with FMAs in the kernel text", rules_.name());
  for (const auto &[helper, text] : helpers_)
    w_.raw(text);
  w_.blank();
  w_.raw(kernel.str());

  Lowered out;
  out.source = w_.str();
  out.kernel_text = kernel.str();
  out.kernel_name = p_.name;
  out.params = std::move(params);
  out.grid = p_.grid;
  out.block_threads = int(threads);
  out.lds_bytes = lds_bytes_;
  out.lds_dynamic = rules_.dynamic_lds();
  out.mma = mi_;
  out.instruction = mi_ ? rules_.instruction_name(*mi_) : "";
  out.rules = std::string(rules_.name());
  out.compile_arch = rules_.compile_arch(target_);
  out.rules_note = note_;
  // f32 inputs are read as floats: at least 4-byte aligned.
  out.pointer_alignment = vec_ok_ ? 16 : vec4_ok_ ? 8 : f32_inputs_ ? 4 : 2;
  // Rows are addressed by a 32-bit offset within a block (row_offset).
  out.max_row_stride = int64_t(UINT32_MAX) / std::max(block_m_, block_n_);
  out.persistent_blocks = persistent_ ? producer_budget().blocks : 0;
  out.tile_counter = dynamic_tiles_;
  out.mask_blocks = mask_blocks_;
  return out;
}

std::vector<KernelEmitter::TailLds> KernelEmitter::tail_lds() const {
  std::vector<TailLds> arrays;
  if (tma_bars_ > 0)
    arrays.push_back({"unsigned long long", "fj_tma_bar", tma_bars_, tma_bars_ * 8,
                      "the TMA copies' transaction barriers, one per buffer copy"});
  if (free_bars_ > 0)
    arrays.push_back(
        {"unsigned long long", "fj_free_bar", free_bars_, free_bars_ * 8,
         "the ring copies' free barriers, one per copy: every consumer thread arrives"});
  if (dynamic_tiles_) {
    arrays.push_back(
        {"long", "fj_tile_slot", 2, 16, "the workgroup's next tiles, from the producer"});
    arrays.push_back(
        {"unsigned long long", "fj_tile_bar", 4, 32,
         "per tile slot: filled (the producer arrives), then read (every consumer thread)"});
  }
  if (ring_block_load_)
    arrays.push_back(
        {"int", "fj_ring_block", 2, 8,
         "per ring copy, its block's successor * 2 + whether the mask keeps it whole"});
  return arrays;
}

int64_t KernelEmitter::tail_lds_end(int64_t offset) const {
  for (const TailLds &a : tail_lds())
    offset = ir::padded(offset, 8) + a.bytes;
  return offset;
}

// NVIDIA, programs with sequences: the blocks per SM that the resource model
// gives the loop's registers and the LDS (0: no bound). The per-batch starts and
// lengths live across the KV loop; without a bound ptxas gives them registers of
// their own and a block of occupancy goes (sm_90, d=128: 192 registers against
// 168, 2 blocks per SM against 3). With the bound they cost a few bytes of spill.
// Not for paged tensors: their page lookups need the registers (the bound made
// paged decode 1.1-1.15x slower on the H100, bench/results/README.md).
//
// And sm_90's dK/dV kernel with dropout where its LDS lets three workgroups
// share an SM (head dims up to 64): the draws take it past 168 registers (176 at
// 64, 227 at 48) and so to two; bounded to three it spills 8-40 bytes and ran 6%
// faster at head dim 64 (docs/decisions.md, "Keep bits and seven rounds").
int KernelEmitter::nvidia_min_blocks() const {
  const int64_t by_lds = target_.lds_bytes_per_cu / (lds_bytes_ + kReservedLdsPerBlock);
  if (target_.family == Family::sm90 && p_.tensor("dK") && p_.function("dropout") && by_lds >= 3)
    return 3;
  const bool paged = std::any_of(p_.tensors.begin(), p_.tensors.end(),
                                 [](const ir::TensorParam &t) { return !t.pages.table.empty(); });
  if (!target_.is_nvidia() || p_.sequences.empty() || paged)
    return 0;
  AttentionSpec spec;
  spec.head_dim_qk = p_.tensor("Q")->dim;
  spec.head_dim_v = p_.tensor("V")->dim;
  ir::Config c;
  c.block_m = block_m_;
  c.block_n = block_n_;
  c.waves = waves_;
  c.pad_k = pad_k_;
  c.q_in_lds = q_in_lds_;
  const ResourceEstimate e = estimate_resources(spec, c, rules_, target_);
  constexpr int64_t kRegistersPerSm = 65536, kGranule = 8;
  const int64_t regs = (e.loop_regs() + kReservedRegs + kGranule - 1) / kGranule * kGranule;
  const int64_t threads = waves_ * target_.wave_size;
  const int64_t by_regs = kRegistersPerSm / (regs * threads);
  return int(std::max<int64_t>(1, std::min(by_regs, by_lds)));
}

// The grid's indices (query block, head, batch, and split-KV's split): of this
// workgroup, or with `tile` (config persistent) of the grid's workgroup `tile`.
void KernelEmitter::emit_grid_args(const std::string &tile) {
  const ir::GridAxis &x = p_.grid[0]; // ceil(extent / divisor) workgroups (ir::grid_size)
  const bool causal_order = mask_.int_attr("causal") && p_.tensor("dO") == nullptr;
  if (!tile.empty()) {
    // Tile t is the workgroup t of the grid the kernel would have without
    // persistent: x fastest (a head's query blocks side by side, sharing its K/V
    // in L2), then the head, then the batch.
    const std::string x_of = fmt::format("int({} % fj_q_blocks)", tile);
    if (causal_order)
      w_.line("const int {} = fj_q_blocks - 1 - {}; // the last query block first",
              name(p_.grid_arg(0)), x_of);
    else
      w_.line("const int {} = {};", name(p_.grid_arg(0)), x_of);
    w_.line("const int {} = int({} / fj_q_blocks % {});", name(p_.grid_arg(1)), tile,
            c_expr(p_.grid[1].extent));
    w_.line("const int {} = int({} / fj_q_blocks / {});", name(p_.grid_arg(2)), tile,
            c_expr(p_.grid[1].extent));
    return;
  }
  if (p_.grid.size() > 3) {
    // The KV split runs inside x: x = q block * splits + split.
    const std::string splits = c_expr(p_.grid[3].extent);
    w_.line("const int {} = fj_group_id_x() / {};", name(p_.grid_arg(0)), splits);
    w_.line("const int {} = fj_group_id_x() % {};", name(p_.grid_arg(3)), splits);
  } else if (causal_order) {
    // Causal: a later query block sees more keys. Workgroups start in the order
    // of their ids, so the heaviest blocks go first and the lightest fill the
    // tail (H100, S = 16k: 3-7% faster; bench/results/README.md).
    w_.line("const int {} = ({} - 1) / {} - fj_group_id_x(); // the last query block first",
            name(p_.grid_arg(0)), c_expr(x.extent), std::max<int64_t>(x.divisor, 1));
  } else {
    w_.line("const int {} = fj_group_id_x();", name(p_.grid_arg(0)));
  }
  w_.line("const int {} = fj_group_id_y();", name(p_.grid_arg(1)));
  w_.line("const int {} = fj_group_id_z();", name(p_.grid_arg(2)));
}

// local_row and query_row: where a lane's accumulator rows lie.
void KernelEmitter::emit_row_helpers() {
  w_.line("// The query at row r (0..{0}) of this wave's {1}-query tile qt: its row in the",
          m_tile_ - 1, m_tile_);
  w_.line("// workgroup's block (local_row) and in the sequence (query_row).");
  if (rules_.warpgroup_products()) // each query tile of a warpgroup is 4 consecutive tiles
    w_.line("auto local_row = [&](int qt, int r) {{ return ((wave / 4 * kQTiles + qt) * 4 + "
            "wave % 4) * {} + r; }};",
            m_tile_);
  else
    w_.line("auto local_row = [&](int qt, int r) {{ return (wave * kQTiles + qt) * {} + r; }};",
            m_tile_);
  w_.line("auto query_row = [&](int qt, int r) {{ return {} * kBlockM + local_row(qt, r); }};",
          name(p_.grid_arg(0)));
}

// Config persistent (the sm90 forward with a producer warpgroup): the launch
// has a workgroup per SM (or as many as fit, Lowered::persistent_blocks), and
// each walks tiles: first fj_group_id_x(), then, when every tile is the same
// work, + the grid's size, ...; when tiles differ (causal: a later query block
// sees more keys), whichever tile the launch's counter hands out next, so a
// workgroup done early takes more (the list runs from each head's heaviest
// tile to its lightest). The producer walks the tiles in its own loop and
// copies the next tile's K and V blocks into the ring while the consumers
// finish the last; the ring's fill and free barriers pace it as within a tile.
Status KernelEmitter::emit_persistent() {
  if (p_.grid.size() != 3 || !p_.sequences.empty() || p_.tensor("dO") != nullptr)
    return Status::error("config persistent takes the dense forward (no split-KV, varlen, KV "
                         "cache or backward)");
  const ir::GridAxis &x = p_.grid[0];
  const int64_t div = std::max<int64_t>(x.divisor, 1);
  dynamic_tiles_ = mask_.int_attr("causal") != 0;
  if (dynamic_tiles_)
    w_.line("// Config persistent: this workgroup's first tile is fj_group_id_x(); the next "
            "ones come from fj_tile_counter (the grid's size + its count), one at a time");
  else
    w_.line("// Config persistent: this workgroup's tiles are fj_group_id_x(), + the grid's "
            "size, ...");
  w_.line("const int fj_q_blocks = ({} + {}) / {};", c_expr(x.extent), div - 1, div);
  w_.line("const long fj_tiles = long(fj_q_blocks) * {} * {}; // 64-bit: past 2^31 too",
          c_expr(p_.grid[1].extent), c_expr(p_.grid[2].extent));
  consumers_only_ = true; // the producer never runs the consumers' code
  // The consumers' tile first: its loop plans the producer and writes the
  // producer's code for one tile into producer_w_.
  producer_w_.indent(4);
  HipWriter tile;
  std::swap(w_, tile);
  w_.indent(2);
  emit_grid_args("fj_tile");
  emit_row_helpers();
  FJ_RETURN_IF_ERROR(emit_ops(p_.body));
  std::swap(w_, tile);
  if (producer_threads_ == 0)
    return Status::error("config persistent needs the producer warpgroup of config stages 3");
  const ProducerBudget budget = producer_budget();
  const Op *loop = nullptr;
  for (const Op &op : p_.body)
    if (op.kind == OpKind::For)
      loop = &op;
  if (loop == nullptr)
    return Status::error("config persistent takes a program with a KV loop");
  w_.open(
      "if (wave >= kWaves) {{ // the producer warpgroup: every tile's K/V blocks into the ring");
  w_.line("fj_setmaxnreg_dec<{}>(); // its registers go to the consumers", budget.producer_regs);
  emit_producer_warp(*loop);
  w_.line("unsigned fj_free_phase = 0; // bit i: the parity of free barrier i's next completion");
  w_.line("int fj_n = 0; // the blocks issued so far, over the tiles");
  if (dynamic_tiles_)
    w_.line("unsigned fj_slot_phase = 0; // bit i: the parity of tile slot barrier i's next read");
  if (dynamic_tiles_)
    w_.line("int fj_j = 1; // the ordinal of this workgroup's next tile (its first is 0)");
  const char *walk = dynamic_tiles_ ? "++fj_j" : "fj_tile += fj_group_count_x()";
  w_.open("for (long fj_tile = fj_group_id_x(); fj_tile < fj_tiles; {}) {{", walk);
  emit_grid_args("fj_tile");
  w_.raw(producer_w_.str());
  if (dynamic_tiles_) {
    // Tile j goes into slot j % 2 once the consumers have read tile j - 2 from it.
    w_.line("// The next tile, from the launch's counter, for the consumers in slot fj_j % 2");
    w_.line("if (fj_j >= 3) // the consumers have read tile fj_j - 2 from this slot");
    w_.line("  fj_tma_wait(fj_tile_bar, 2 + (fj_j & 1), fj_slot_phase);");
    auto fetch = [&](const char *into) {
      w_.line("{} = fj_group_count_x() + long(atomicAdd(fj_tile_counter, 1ull));", into);
      w_.line("fj_tile_slot[fj_j & 1] = {};", into);
      w_.line("fj_mbar_arrive(&fj_tile_bar[fj_j & 1]); // publishes the slot to the consumers");
    };
    if (loop->attrs.count("range")) { // emit_producer_warp: a warp, not a lane
      w_.line("long fj_next = 0;");
      w_.open("if (lane == 0) {{");
      fetch("fj_next");
      w_.close();
      w_.line("fj_tile = __shfl_sync(0xffffffffu, fj_next, 0);");
    } else {
      fetch("fj_tile");
    }
  }
  w_.close();
  w_.close();
  w_.line("return; // its copies complete on the fill barriers; the consumers go on");
  w_.close();
  w_.line("fj_setmaxnreg_inc<{}>(); // the consumers' registers per thread", budget.consumer_regs);
  w_.line("int fj_copy = 0; // the ring copy that holds the block being read, over the tiles");
  if (dynamic_tiles_) {
    w_.line("unsigned fj_slot_phase = 0; // bit i: the parity of tile slot i's next fill");
    w_.line("int fj_j = 1; // the ordinal of this workgroup's next tile (its first is 0)");
  }
  w_.open("for (long fj_tile = fj_group_id_x(); fj_tile < fj_tiles; {}) {{", walk);
  if (dynamic_tiles_)
    w_.line("long fj_tile_next = fj_tiles; // the producer's fetch (after the tile's KV loop)");
  w_.raw(tile.str());
  if (dynamic_tiles_)
    w_.line("fj_tile = fj_tile_next;");
  w_.close();
  return Status::ok();
}

// This batch's rows of each sequence (ir::Sequence, clamps included), then an
// early exit for a query block past its sequence's end (the whole workgroup
// leaves together, before any barrier).
void KernelEmitter::emit_sequences() {
  const std::string batch = name(p_.grid_arg(2));
  for (const ir::Sequence &q : p_.sequences) {
    const std::string cap = c_expr(q.capacity);
    w_.line("// IR: sequence %{}: this batch's rows{}{}", q.name,
            q.starts.empty() ? "" : ", from @" + q.starts, q.used.empty() ? "" : ", @" + q.used);
    if (q.starts.empty())
      w_.line("const int {}_start = 0;", q.name);
    else
      w_.line("const int {0}_start = fj_clamp({1}[{2}], 0, {3});", q.name, q.starts, batch, cap);
    const std::string length = !q.used.empty()
                                   ? fmt::format("{}[{}]", q.used, batch)
                                   : fmt::format("{}[{} + 1] - {}_start", q.starts, batch, q.name);
    w_.line("const int {0} = fj_clamp({1}, 0, {2} - {0}_start);", q.name, length, cap);
  }
  // Grid axis 0 is a block of the rows of the tensor loaded at it: Q's in the
  // forward and the dQ kernel, K's in the dK/dV kernel.
  const ValueId row_block = p_.grid_arg(0);
  for (const Op &op : p_.body) {
    if (op.kind != OpKind::Load || op.operands.empty() || op.operands[0] != row_block)
      continue;
    const ir::TensorParam &rows = *p_.tensor(op.symbol_attr("tensor"));
    if (rows.seq.is_param() && p_.sequence(rows.seq.param))
      w_.line("if ({} * kBlockM >= {}) return; // a {} block past this sequence's end",
              name(row_block), rows.seq.param, rows.name == "Q" ? "query" : "key");
    break;
  }
}

// A warpgroup product (Rules::warpgroup_products): over every query tile, or
// only tile `only_qt` (>= 0); waiting for it, or left in flight (the
// interleaved loop waits for it later), as one group or one group per tile.
Status KernelEmitter::emit_product(const Op &op, int only_qt, bool wait, bool group_per_tile,
                                   bool in_place) {
  const bool s_product = op.kind == OpKind::MmaABt;
  auto it = lds_of_.find(op.operands[1]);
  const auto a_lds = lds_of_.find(op.operands[0]);
  if (it == lds_of_.end() || !swizzled_.count(it->second) ||
      (a_lds != lds_of_.end() && !swizzled_.count(a_lds->second)))
    return Status::error("{} rules cannot lower `{}`: warpgroup products read swizzled LDS tiles",
                         rules_.name(), op_info(op.kind).name);
  const Type &t = type(op.results[0]);
  const std::string acc = name(op.results[0]);
  const std::string tiles_of = only_qt >= 0
                                   ? fmt::format("int qt = {}; qt <= {}; ++qt", only_qt, only_qt)
                                   : "int qt = 0; qt < kQTiles; ++qt";
  if (!in_place) { // the result starts as a copy of C
    w_.line("{};", declare(op.results[0]));
    w_.line("#pragma unroll");
    w_.line("for ({})", tiles_of);
    w_.line("  for (int c = 0; c < {}; ++c) {}[qt][c] = {}[qt][c];", col_tiles(t.cols), acc,
            name(op.operands[2]));
  }
  rules_.emit_warpgroup_product(
      w_,
      {.acc = acc,
       .a = name(op.operands[0]),
       .a_tile = a_lds == lds_of_.end() ? "" : a_lds->second,
       .a_rows = block_m_,
       .a_row0 = fmt::format("(wave / 4 * kQTiles + qt) * {}", 4 * m_tile_),
       .b_tile = it->second,
       .b_rows = type(op.operands[1]).rows,
       .cols = t.cols,
       .k_tiles = tiles(type(op.operands[0]).cols),
       .b_transposed = !s_product,
       .dtype = type(op.operands[0]).dtype,
       .tiles = tiles_of,
       .wait = wait,
       .group_per_tile = group_per_tile,
       .pin_before = !in_place},
      helpers_);
  read_since_barrier_.insert(it->second);
  return Status::ok();
}

Status KernelEmitter::emit_ops(const std::vector<Op> &body) {
  for (const Op &op : body) {
    for (ValueId r : op.results)
      def_of_[r] = &op;
    FJ_RETURN_IF_ERROR(emit_op(op));
  }
  return Status::ok();
}

// "// IR: %6 = mma_abt %0, %4, %5", then `note`: the op a block of HIP implements.
void KernelEmitter::emit_ir_comment(const Op &op, std::string_view note) {
  std::string res;
  for (ValueId r : op.results)
    res += (res.empty() ? "%" : ", %") + printed_[r];
  std::string args;
  for (ValueId a : op.operands)
    args += (args.empty() ? "%" : ", %") + printed_[a];
  for (const auto &[key, attr] : op.attrs)
    if (key == "value" || key == "tensor")
      args += fmt::format("{}{{{} = {}}}", args.empty() ? "" : " ", key,
                          std::holds_alternative<ir::Symbol>(attr)
                              ? "@" + std::get<ir::Symbol>(attr).name
                              : fmt::format("{}", std::get<double>(attr)));
  w_.line("// IR: {}{}{}{}{}", res.empty() ? "" : res + " = ", op_info(op.kind).name,
          args.empty() ? "" : " ", args, note);
}

Status KernelEmitter::emit_op(const Op &op) {
  const std::string what = op_info(op.kind).name;
  auto unsupported = [&](const std::string &why) {
    return Status::error("{} rules cannot lower `{}`: {}", rules_.name(), what, why);
  };
  if (op.kind != OpKind::For && op.kind != OpKind::Yield)
    emit_ir_comment(op, "");
  // expr_fmt uses {0} for operand 0's element and {1} for operand 1's. A per-row
  // vector operand of a tile op reads the row slot of the element.
  auto element = [&](ValueId v, const Type &result) {
    if (!type(v).is_vector())
      return name(v) + "[qt][c][e]";
    return result.is_vector() ? name(v) + "[qt][s]"
                              : fmt::format("{}[qt][{}]", name(v), rules_.acc_slot("e"));
  };
  auto elementwise = [&](const std::string &expr_fmt) -> Status {
    const Type &t = type(op.results[0]);
    w_.line("{};", declare(op.results[0]));
    const std::string dst = open_elements(t, name(op.results[0]));
    const std::string a = element(op.operands[0], t);
    const std::string b = op.operands.size() > 1 ? element(op.operands[1], t) : "";
    w_.line("{} = {};", dst, fmt::format(fmt::runtime(expr_fmt), a, b));
    close_elements(t);
    return Status::ok();
  };

  switch (op.kind) {
  case OpKind::Load:
    return emit_load(op);
  case OpKind::Store:
    return emit_store(op);
  case OpKind::Fill: {
    const Type &t = type(op.results[0]);
    std::string value;
    if (op.attrs.count("function")) { // one value per workgroup (ir/expr.h)
      const ir::ScoreFunction *f = p_.function(op.symbol_attr("function"));
      auto e = ir::parse_expr(f->text, p_.expr_scope(), "function @" + f->name);
      if (!e)
        return e.status();
      value = "float(" +
              ir::emit_c(*e,
                         [&](const std::string &var) -> std::string {
                           if (var == "b")
                             return name(p_.grid_arg(2));
                           if (var == "h")
                             return name(p_.grid_arg(1));
                           return seq_const(*p_.tensor(var == "seqlen_q" ? "Q" : "K"));
                         }) +
              ")";
      w_.line("// {}", f->text);
    } else {
      value = float_literal(op.float_attr("value"));
    }
    w_.line("{};", declare(op.results[0]));
    const std::string dst = open_elements(t, name(op.results[0]));
    w_.line("{} = {};", dst, value);
    close_elements(t);
    return Status::ok();
  }
  case OpKind::MmaABt:
  case OpKind::MmaAB: {
    // S = Q K^T (mma_abt: K staged row-major) and O += P V (mma_ab: V staged
    // transposed); the rules read the LDS fragment and order the operands.
    const bool s_product = op.kind == OpKind::MmaABt;
    auto it = lds_of_.find(op.operands[1]);
    if (it == lds_of_.end() || type(op.operands[0]).layout != TileLayout::mma_a)
      return unsupported("expects A in registers (#mma_a) and B staged in LDS");
    if (rules_.warpgroup_products()) {
      FJ_RETURN_IF_ERROR(emit_product(op, -1, /*wait=*/true));
      emit_ring_release(op);
      return Status::ok();
    }
    const Type &t = type(op.results[0]);
    const int kt = tiles(type(op.operands[0]).cols);
    w_.line("{};", declare(op.results[0]));
    w_.line("#pragma unroll");
    w_.open("for (int qt = 0; qt < kQTiles; ++qt) {{");
    w_.line("#pragma unroll");
    w_.open("for (int c = 0; c < {}; ++c) {{", col_tiles(t.cols));
    w_.line("{} acc = {}[qt][c];", rules_.acc_type(), name(op.operands[2]));
    const int step = rules_.k_step();
    std::string a_frag = name(op.operands[0]) + "[qt][k]";
    // The fragments of head-dim (or key) tile k: Q's from LDS where it lives there,
    // and K's or V's from their LDS tile.
    auto emit_fragments = [&] {
      if (auto q = lds_of_.find(op.operands[0]); q != lds_of_.end()) {
        rules_.emit_q_fragment(w_, q->second, lds_strides_.at(q->second));
        a_frag = "qf";
      }
      if (s_product)
        rules_.emit_k_fragment(w_, it->second, lds_strides_.at(it->second));
      else
        rules_.emit_v_fragment(w_, it->second, lds_strides_.at(it->second));
    };
    if (step > 1) {
      // k_step() k tiles per instruction: their fragments into arrays (zeros past
      // the last tile), then one instruction over them (Rules::k_step).
      const char *lds_frag = s_product ? "kf" : "vf";
      w_.line("#pragma unroll");
      w_.open("for (int k0 = 0; k0 < {}; k0 += {}) {{", kt, step);
      w_.line("{0} {1}s[{2}] = {{}}, ops[{2}] = {{}};", rules_.operand_type(), lds_frag, step);
      w_.line("#pragma unroll");
      w_.open("for (int kk = 0; kk < {}; ++kk) {{", step);
      w_.line("const int k = k0 + kk;");
      if (kt % step)
        w_.line("if (k >= {}) break; // the odd last tile pairs with zeros", kt);
      emit_fragments();
      w_.line("{0}s[kk] = {0};", lds_frag);
      w_.line("ops[kk] = {};", a_frag);
      w_.close();
      // The rules read the LDS fragments from the array named like the single one.
      w_.open("{{");
      w_.line("const auto &{0} = {0}s;", lds_frag);
      lines(s_product ? rules_.mma_s("ops") : rules_.mma_o("ops"));
      w_.close();
      w_.close();
    } else {
      w_.line("#pragma unroll");
      w_.open("for (int k = 0; k < {}; ++k) {{", kt);
      emit_fragments();
      lines(s_product ? rules_.mma_s(a_frag) : rules_.mma_o(a_frag));
      w_.close();
    }
    w_.line("{}[qt][c] = acc;", name(op.results[0]));
    w_.close();
    w_.close();
    read_since_barrier_.insert(it->second);
    return Status::ok();
  }
  case OpKind::Scale: {
    if (const auto *r = std::get_if<ir::ParamRef>(&op.attrs.at("factor")))
      return elementwise("{0} * " + r->name);
    const std::string k = fmt::format("kScale{}", scale_constants_++);
    add_constant(fmt::format("constexpr float {} = {};", k, float_literal(op.float_attr("factor"))),
                 fmt::format("factor of IR op `scale` (%{})", name(op.results[0])));
    return elementwise("{0} * " + k);
  }
  case OpKind::ScoreMod: {
    // The score function per element (ir/expr.h's emit_c), with this element's
    // query and key positions; the batch, head and lengths of this workgroup.
    const Type &t = type(op.results[0]);
    const std::string src = name(op.operands[0]), qb = name(op.operands[1]),
                      kb = name(op.operands[2]);
    const bool transposed = op.int_attr("transposed") != 0;
    keep_live_values(op); // a mask tensor's loads branch (the backward's only)
    const std::string mask_var = "fj_mask_" + name(op.results[0]);
    std::string mask_elem; // @mask in C: this element of mask_var
    // Rows are queries of %op1's block and columns keys of %op2's, or the
    // reverse in the backward's transposed tiles.
    const std::string row =
        fmt::format("{} * kBlockM + local_row(qt, {})", qb, rules_.acc_row("e"));
    const std::string col = fmt::format("{} * kBlockN + c * kNTile + {}", kb, rules_.acc_col("e"));
    const std::string q_idx = transposed ? col : row, kv_idx = transposed ? row : col;
    const DrawPlan plan = draw_plan(transposed, col_tiles(t.cols)); // where uniform() is read
    auto names = [&](const std::string &var) -> std::string {
      if (var == "score")
        return src + "[qt][c][e]";
      if (var == "b")
        return name(p_.grid_arg(2));
      if (var == "h")
        return name(p_.grid_arg(1));
      if (var == "q_idx")
        return q_idx;
      if (var == "kv_idx")
        return kv_idx;
      if (var.starts_with(kDrawVar)) { // a draw of this element's own position
        const std::string d = var.substr(kDrawVar.size());
        if (plan.share(false) == DrawPlan::Share::one_word)
          return fmt::format("fj_word_slot(fj_word{}, {})", d, kv_idx);
        return fmt::format("fj_draw_slot(fj_draw{}, {})", d, kv_idx);
      }
      if (var.starts_with(kKeepVar)) { // that draw >= its threshold
        const std::string d = var.substr(kKeepVar.size());
        switch (plan.share(true)) {
        case DrawPlan::Share::keep_bits:
          return fmt::format("fj_keep_bit(fj_keepword{}, fj_keepbase{}, {})", d, d, kv_idx);
        case DrawPlan::Share::one_word:
          return fmt::format("fj_word_bits(fj_word{}, {}) >= fj_threshold{}", d, kv_idx, d);
        case DrawPlan::Share::words:
          break;
        }
        return fmt::format("fj_draw_bits(fj_draw{}, {}) >= fj_threshold{}", d, kv_idx, d);
      }
      if (var == kMaskVar)
        return mask_elem;
      if (var == "seqlen_q")
        return seq_const(*p_.tensor("Q"));
      return seq_const(*p_.tensor("K"));
    };
    auto elements = [&](const char *attr) -> Status {
      const ir::ScoreFunction *f = p_.function(op.symbol_attr(attr));
      auto e = ir::parse_expr(f->text, p_.expr_scope(), "function @" + f->name);
      if (!e)
        return e.status();
      w_.line("// {}", f->text);
      int mask_reads = 0;
      if (p_.array("attn_mask")) {
        // The mask tensor's elements, loaded a row's run at a time
        // (emit_mask_rows, emit_mask_columns) before the elements' arithmetic.
        const std::string element(ir::kMaskElement);
        auto guarded =
            ir::parse_expr("(q_idx < seqlen_q && kv_idx < seqlen_k) ? " + element + " : 0",
                           p_.expr_scope(), "the mask tensor's element");
        auto canonical = ir::parse_expr(element, p_.expr_scope(), "the mask tensor's element");
        if (!guarded || !canonical)
          return !guarded ? guarded.status() : canonical.status();
        *e = take_mask_elements(std::move(*e), ir::print_expr(*canonical), ir::print_expr(*guarded),
                                mask_reads);
      }
      std::vector<ir::Expr> draws; // uniform(seed, offset, b, h, q_idx, kv_idx) calls
      ir::Expr body = take_element_draws(*e, draws);
      // Draws only compared with a threshold are compared as integers, and
      // may be shared as keep bits (DrawPlan::share).
      std::vector<std::string> thresholds(draws.size());
      if (!draws.empty() && draw_thresholds(body, thresholds, names) &&
          std::ranges::none_of(thresholds, &std::string::empty))
        body = take_draw_thresholds(std::move(body));
      else
        thresholds.clear();
      // With draws, the elements go through emit_draws' own order: the tile's
      // mask elements are loaded first, whole.
      mask_elem = mask_var + (draws.empty() ? "[e]" : "_tile[qt][c][e]");
      const std::string code = ir::emit_c(body, names);
      const std::string dst = name(op.results[0]);
      if (mask_reads) {
        if (!early_masks_.count(&op)) // else issued before the S product
          emit_mask_rows(op, mask_var);
        if (!draws.empty())
          w_.line("float {}_tile[kQTiles][{}][kAccElems];", mask_var, col_tiles(t.cols));
        open_query_tiles();
        w_.line("#pragma unroll");
        w_.open("for (int c = 0; c < {}; ++c) {{", col_tiles(t.cols));
        emit_mask_columns(op, mask_var);
        w_.line("#pragma unroll");
        w_.open("for (int e = 0; e < kAccElems; ++e) {{");
        if (draws.empty())
          w_.line("{}[qt][c][e] = {};", dst, code);
        else
          w_.line("{0}_tile[qt][c][e] = {0}[e];", mask_var);
        w_.close();
        w_.close();
        w_.close();
        if (draws.empty())
          return Status::ok();
      } else if (draws.empty()) {
        w_.line("{} = {};", open_elements(t, dst), code);
        close_elements(t);
        return Status::ok();
      }
      emit_draws(plan, draws, thresholds, names, q_idx, kv_idx, [&](int c, int e) {
        w_.line("{{ const int c = c0 + {}, e = {}; {}[qt][c][e] = {}; }}", c, e, dst, code);
      });
      return Status::ok();
    };
    w_.line("{};", declare(op.results[0]));
    if (!block_full_applies(op))
      return elements("function");
    // A branch on the block, not a select per element: the blocks the loop's
    // scan found wholly inside @range skip the mask's arithmetic.
    w_.open("if (fj_block_full) {{ // @{} keeps every pair of the block", op.symbol_attr("range"));
    FJ_RETURN_IF_ERROR(elements("unmasked"));
    w_.close("} else {");
    w_.indent(1);
    FJ_RETURN_IF_ERROR(elements("function"));
    w_.close();
    return Status::ok();
  }
  case OpKind::Mask: {
    // A branch on the block, uniform over the workgroup: a block every pair of
    // which is visible copies the scores; the others select per element, with
    // `?:` rather than a branch around each element, which keeps them one
    // straight line for the scheduler (a branch per element made gfx11 spill).
    const Type &t = type(op.results[0]);
    const bool transposed = op.int_attr("transposed") != 0;
    const std::string dst = name(op.results[0]), src = name(op.operands[0]);
    keep_live_values(op); // the branch on the block (the backward's only)
    w_.line("{};", declare(op.results[0]));
    if (!q_group().empty())
      w_.open("if (fj_block_unmasked_grouped({}, {}, {}, {})) {{ // every pair of the block is "
              "visible",
              name(op.operands[1]), name(op.operands[2]), q_group(), mask_args());
    else
      w_.open("if ({}({}, {}, {})) {{ // every pair of the block is visible",
              transposed ? "fj_block_unmasked_t" : "fj_block_unmasked", name(op.operands[1]),
              name(op.operands[2]), mask_args());
    w_.line("{} = {}[qt][c][e];", open_elements(t, dst), src);
    close_elements(t);
    w_.close("} else {");
    w_.indent(1);
    if (transposed) { // the backward's dK/dV tiles: a key per row
      const std::string element = open_elements(t, dst);
      w_.line("const int query = {} * kBlockN + c * kNTile + {};", name(op.operands[2]),
              rules_.acc_col("e"));
      w_.line("{} = fj_visible(query, query_row(qt, {}), {}) ? {}[qt][c][e] : -FJ_INF;", element,
              rules_.acc_row("e"), mask_args(), src);
    } else if (!rules_.mask_by_row_bounds()) { // one test per score
      const std::string element = open_elements(t, dst);
      w_.line("const int key = {} * kBlockN + c * kNTile + {};", name(op.operands[2]),
              rules_.acc_col("e"));
      w_.line("{} = fj_visible({}, key, {}) ? {}[qt][c][e] : -FJ_INF;", element,
              query_position(fmt::format("query_row(qt, {})", rules_.acc_row("e"))), mask_args(),
              src);
    } else {
      // Each row's visible keys once, counted from the block's first key; then
      // two compares a score.
      open_query_tiles();
      w_.line("int lo[kRowSlots], hi[kRowSlots];");
      w_.line("#pragma unroll");
      w_.open("for (int s = 0; s < kRowSlots; ++s) {{");
      w_.line("fj_visible_keys({}, {}, &lo[s], &hi[s]);",
              query_position(fmt::format("query_row(qt, {})", rules_.slot_row("s"))), mask_args());
      w_.line("lo[s] -= {0} * kBlockN;", name(op.operands[2]));
      w_.line("hi[s] -= {0} * kBlockN;", name(op.operands[2]));
      w_.close();
      const std::string element = open_tile_elements(t, dst);
      w_.line("const int n = c * kNTile + {}, s = {};", rules_.acc_col("e"), rules_.acc_slot("e"));
      w_.line("{} = n >= lo[s] && n <= hi[s] ? {}[qt][c][e] : -FJ_INF;", element, src);
    }
    close_elements(t);
    w_.close();
    return Status::ok();
  }
  case OpKind::RowMax:
  case OpKind::RowSum: {
    // In-lane over the elements of each row slot, then across the lanes that
    // hold the row's other columns.
    const bool is_max = op.kind == OpKind::RowMax;
    const Type &src = type(op.operands[0]);
    if (src.layout != TileLayout::mma_acc)
      return unsupported("row reductions need a #mma_acc tile");
    const std::string r = name(op.results[0]);
    const std::string x = name(op.operands[0]);
    w_.line("{};", declare(op.results[0]));
    open_query_tiles();
    w_.line("float r[kRowSlots];");
    w_.line("#pragma unroll");
    w_.line("for (int s = 0; s < kRowSlots; ++s) r[s] = {};", is_max ? "-FJ_INF" : "0.0f");
    w_.line("#pragma unroll");
    w_.open("for (int c = 0; c < {}; ++c) {{", col_tiles(src.cols));
    w_.line("#pragma unroll");
    w_.open("for (int e = 0; e < kAccElems; ++e) {{");
    w_.line("float &y = r[{}];", rules_.acc_slot("e"));
    w_.line("y = {};", is_max ? fmt::format("fj_max(y, {}[qt][c][e])", x)
                              : fmt::format("y + {}[qt][c][e]", x));
    w_.close();
    w_.close();
    w_.line("#pragma unroll");
    w_.open("for (int s = 0; s < kRowSlots; ++s) {{");
    for (int mask : rules_.row_share_masks())
      w_.line("r[s] = {}; // the lanes holding the row's other columns",
              is_max ? fmt::format("fj_max(r[s], fj_shfl_xor(r[s], lane, {}))", mask)
                     : fmt::format("r[s] + fj_shfl_xor(r[s], lane, {})", mask));
    w_.line("{}[qt][s] = r[s];", r);
    w_.close();
    w_.close();
    return Status::ok();
  }
  case OpKind::Max:
    return elementwise("fj_max({0}, {1})");
  case OpKind::RunningMax:
    return elementwise(
        fmt::format("{{1}} > {{0}} + {} ? {{1}} : {{0}}", float_literal(op.float_attr("slack"))));
  case OpKind::Add:
    return elementwise("{0} + {1}");
  case OpKind::Sub:
    return elementwise("{0} - {1}");
  case OpKind::Mul:
    return elementwise("{0} * {1}");
  case OpKind::Exp2:
    return elementwise("fj_exp2({0})");
  case OpKind::Log2:
    return elementwise("fj_log2({0})");
  case OpKind::ZeroIfNegInf:
    return elementwise("{0} == -FJ_INF ? 0.0f : {0}");
  case OpKind::SubRow:
    return elementwise("{0} - {1}");
  case OpKind::MulRow: {
    // The online softmax's rescale: a work-item whose row factors are all 1
    // (no running max of its rows moved: ir `running_max`) copies the tile.
    const Type &t = type(op.results[0]);
    const std::string dst = name(op.results[0]), x = name(op.operands[0]), r = name(op.operands[1]);
    auto elements = [&](const std::string &value) {
      w_.line("{} = {};", open_tile_elements(t, dst), value);
      close_tile_elements(t);
    };
    w_.line("{};", declare(op.results[0]));
    open_query_tiles();
    w_.line("bool moved = false;");
    w_.line("#pragma unroll");
    w_.line("for (int s = 0; s < kRowSlots; ++s) moved |= {}[qt][s] != 1.0f;", r);
    w_.open("if (moved) {{");
    elements(fmt::format("{}[qt][c][e] * {}[qt][{}]", x, r, rules_.acc_slot("e")));
    w_.close("} else {");
    w_.indent(1);
    elements(x + "[qt][c][e]");
    w_.close();
    w_.close();
    return Status::ok();
  }
  case OpKind::DivRow: {
    // One reciprocal per row (0 for a row without weight), then a multiply per
    // element: the reciprocal's slow path (denormals) is not repeated per column.
    const Type &rows = type(op.operands[1]);
    const std::string rcp = name(op.results[0]) + "_rcp", l = name(op.operands[1]);
    w_.line("float {}[kQTiles][kRowSlots];", rcp);
    const std::string dst = open_elements(rows, rcp);
    w_.line("{} = {}[qt][s] == 0.0f ? 0.0f : fj_rcp({}[qt][s]);", dst, l, l);
    close_elements(rows);
    return elementwise(fmt::format("{{0}} * {}[qt][{}]", rcp, rules_.acc_slot("e")));
  }
  case OpKind::SubCol: {
    // The per-column vector lives in LDS (emit_load): each element reads its column's.
    auto it = lds_of_.find(op.operands[1]);
    if (it == lds_of_.end())
      return unsupported("expects the #cols vector loaded into LDS by `load`");
    const Type &t = type(op.results[0]);
    w_.line("{};", declare(op.results[0]));
    const std::string dst = open_elements(t, name(op.results[0]));
    w_.line("{} = {}[qt][c][e] - {}[c * kNTile + {}];", dst, name(op.operands[0]), it->second,
            rules_.acc_col("e"));
    close_elements(t);
    read_since_barrier_.insert(it->second);
    return Status::ok();
  }
  case OpKind::Convert: {
    const Type &t = type(op.results[0]);
    if (t.dtype == DType::f32 || type(op.operands[0]).dtype != DType::f32)
      return unsupported("only f32 -> bf16/f16 conversions are lowered");
    return elementwise("fj_from_f32({0})");
  }
  case OpKind::ConvertLayout: {
    const Type &from = type(op.operands[0]), &to = type(op.results[0]);
    if (!(from.layout == TileLayout::mma_acc && to.layout == TileLayout::mma_a &&
          to.dtype != DType::f32))
      return unsupported(fmt::format("no {} rule converts #{} to #{}", rules_.name(),
                                     tile_layout_name(from.layout), tile_layout_name(to.layout)));
    if (fixed_qt_ >= 0) { // the fragments of this pass's tile, into the declared array
      open_query_tiles();
      rules_.emit_p_operand_tile(w_, name(op.results[0]), name(op.operands[0]), tiles(to.cols));
      w_.close();
      return Status::ok();
    }
    rules_.emit_p_operand(w_, name(op.results[0]), name(op.operands[0]), tiles(to.cols));
    return Status::ok();
  }
  case OpKind::For: {
    FJ_RETURN_IF_ERROR(emit_for(op));
    // Split-KV's split kernel on sm_90: its combine, launched as a dependent
    // (runtime: decode of one query token), may start once every workgroup is
    // past the KV loop, and waits for it (split_combine.cpp). Triggered at the
    // kernel's start instead, the combine's waiting workgroups took SM resources
    // beside the loops (H200: up to 1.5x slower at head dim 128).
    if (target_.family == Family::sm90 && op.attrs.count("splits")) // the split's KV loop
      w_.line("fj_launch_dependents(); // the combine may start (it waits for this kernel)");
    return Status::ok();
  }
  case OpKind::Yield:
    return Status::ok(); // emit_for copies the yielded values
  }
  return unsupported("unknown op");
}

} // namespace flashjit::lowering::emit
