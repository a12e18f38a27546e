// The IR interpreter. Every workgroup of the grid runs the body with tiles held
// as dense row-major float arrays; the semantics are exactly those documented in
// ir/ops.def, so this is the executable definition of the IR.
#include "ir/interpreter.h"

#include "ir/build.h"
#include "ir/expr.h"
#include "ir/interval.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <mutex>
#include <numbers>
#include <thread>
#include <tuple>

namespace flashjit::ir {

namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

struct TileValue {
  int64_t rows = 0, cols = 0; // cols == 0: a per-row vector
  std::vector<float> data;
  int64_t index = 0; // for index values
  float &at(int64_t r, int64_t c) { return data[r * std::max<int64_t>(cols, 1) + c]; }
  float at(int64_t r, int64_t c) const { return data[r * std::max<int64_t>(cols, 1) + c]; }
};

/// A tensor with its extents and strides bound.
struct BoundTensor {
  int64_t batch, heads, seq, dim;
  Strides strides;       // strides.group: between a grouped position's rows
  int64_t split_stride;  // between the KV splits' partial results (0 elsewhere)
  int64_t row_group = 1; // grouped rows (TensorParam::row_group)
  float *data;
};

struct Buffers {
  std::map<std::string, BoundTensor> by_name;
  std::map<std::string, const std::vector<int32_t> *> indices;
  std::map<std::string, const std::vector<float> *> arrays;
  std::map<std::string, Expr> functions; // parsed once
  const Bindings *args;
  int64_t group;
  /// The first array read past an array's end, as an error ("" while none):
  /// a score function reads only the elements of its positions (GPUs fault).
  std::shared_ptr<std::pair<std::mutex, std::string>> bad_read =
      std::make_shared<std::pair<std::mutex, std::string>>();
};

/// A batch's rows of a sequence: the first row in its tensors and the count
/// (ir::Sequence's definition, with its clamps).
struct SeqRows {
  int64_t start = 0, length = 0;
};

SeqRows sequence_rows(const Sequence &q, const Buffers &b, int64_t batch) {
  const int64_t capacity = b.args->resolve(q.capacity).value();
  SeqRows r;
  if (!q.starts.empty())
    r.start = std::clamp<int64_t>((*b.indices.at(q.starts))[batch], 0, capacity);
  const int64_t length = !q.used.empty()     ? (*b.indices.at(q.used))[batch]
                         : !q.starts.empty() ? (*b.indices.at(q.starts))[batch + 1] - r.start
                                             : capacity;
  r.length = std::clamp<int64_t>(length, 0, capacity - r.start);
  return r;
}

/// An integer attribute's value: the constant or its parameter's binding.
int64_t int_value(const Op &op, const std::string &key, const Bindings &args, int64_t fallback) {
  auto it = op.attrs.find(key);
  if (it == op.attrs.end())
    return fallback;
  if (const ParamRef *r = std::get_if<ParamRef>(&it->second))
    return args.integer(r->name).value(); // check_bindings() ran first
  return op.int_attr(key, fallback);
}

double real_value(const Op &op, const std::string &key, const Bindings &args) {
  auto it = op.attrs.find(key);
  if (it != op.attrs.end())
    if (const ParamRef *r = std::get_if<ParamRef>(&it->second))
      return args.real(r->name).value();
  return op.float_attr(key);
}

class Workgroup {
public:
  Workgroup(const Program &p, const Buffers &buffers, int64_t qb, int64_t head, int64_t batch,
            int64_t split)
      : p_(p), buffers_(buffers), values_(p.values.size()) {
    values_[p.grid_arg(0)].index = qb;
    values_[p.grid_arg(1)].index = head;
    values_[p.grid_arg(2)].index = batch;
    if (p.grid.size() > 3)
      values_[p.grid_arg(3)].index = split;
    head_ = head;
    batch_ = batch;
    split_ = split;
    for (const Sequence &q : p.sequences)
      rows_[q.name] = sequence_rows(q, buffers, batch);
  }

  void run(const std::vector<Op> &body) {
    for (const Op &op : body)
      execute(op);
  }

private:
  TileValue make(ValueId id) {
    const Type &t = p_.type_of(id);
    TileValue v;
    v.rows = t.rows;
    v.cols = t.cols;
    v.data.assign(t.rows * std::max<int64_t>(t.cols, 1), 0.0f);
    return v;
  }
  const TileValue &in(const Op &op, int i) const { return values_[op.operands[i]]; }

  // Applies f elementwise to operand 0 (and 1), writing the result of op.
  template <typename F> void elementwise(const Op &op, F f) {
    TileValue r = make(op.results[0]);
    for (size_t i = 0; i < r.data.size(); ++i)
      r.data[i] = op.operands.size() == 1 ? f(in(op, 0).data[i], 0.0f)
                                          : f(in(op, 0).data[i], in(op, 1).data[i]);
    values_[op.results[0]] = std::move(r);
  }
  template <typename F> void with_row(const Op &op, F f) {
    TileValue r = make(op.results[0]);
    const TileValue &x = in(op, 0), &v = in(op, 1);
    for (int64_t i = 0; i < r.rows; ++i)
      for (int64_t j = 0; j < r.cols; ++j)
        r.at(i, j) = f(x.at(i, j), v.data[i]);
    values_[op.results[0]] = std::move(r);
  }

  // Element offset of (row, col) of `t` for this workgroup's batch and head:
  // packed rows start at the sequence's start, paged rows come from the page table.
  int64_t offset(const TensorParam &t, int64_t row, int64_t col) const {
    const BoundTensor &b = bound(t);
    const int64_t head = t.name == "K" || t.name == "V" ? head_ / buffers_.group : head_;
    int64_t rows = batch_ * b.strides.batch + (row / b.row_group) * b.strides.seq +
                   (row % b.row_group) * b.strides.group;
    if (t.packed) {
      rows = (rows_.at(t.seq.param).start + row) * b.strides.seq;
    } else if (!t.pages.table.empty()) {
      const Bindings &args = *buffers_.args;
      const int64_t size = args.resolve(t.pages.page_size).value();
      const int64_t stride = args.resolve(t.pages.table_stride).value();
      // As the kernels do: past the table's row or outside the cache reads page 0.
      int64_t page = row / size < stride
                         ? (*buffers_.indices.at(t.pages.table))[batch_ * stride + row / size]
                         : 0;
      if (page < 0 || page >= args.resolve(t.pages.count).value())
        page = 0;
      rows = page * b.strides.batch + (row % size) * b.strides.seq;
    }
    return split_ * b.split_stride + rows + head * b.strides.head + col * b.strides.dim;
  }
  // What score expressions read in this workgroup (positions set per element).
  ExprContext expr_context() const {
    ExprContext c;
    c.f32 = true;
    c.b = batch_;
    c.h = head_;
    c.seqlen_q = seq("Q");
    c.seqlen_k = seq("K");
    c.scalar = [this](const std::string &name) { return buffers_.args->real(name).value(); };
    c.load = [this](const std::string &name, int64_t i) {
      const std::vector<float> &a = *buffers_.arrays.at(name);
      if (i >= 0 && i < int64_t(a.size()))
        return double(a[size_t(i)]);
      auto &[mutex, error] = *buffers_.bad_read;
      std::lock_guard<std::mutex> lock(mutex);
      if (error.empty())
        error =
            fmt::format("a score function read @{}[{}], past its {} elements", name, i, a.size());
      return std::numeric_limits<double>::quiet_NaN();
    };
    return c;
  }
  /// The interval of mask function f (ir/interval.h) while the tile's rows range
  /// over [row0, row0 + rows) and its columns over [col0, col0 + cols), clipped
  /// to the lengths: the kernels' templates/block_range.hip, so an unsound
  /// interval shows here as a wrong result. Rows are queries, or keys in the
  /// backward's transposed tiles.
  Interval block_interval(const Expr &f, int64_t row0, int64_t rows, int64_t col0, int64_t cols,
                          bool transposed) const {
    const int64_t sq = seq("Q"), sk = seq("K");
    int64_t q0 = row0, q1 = row0 + rows, k0 = col0, k1 = col0 + cols;
    if (transposed)
      std::swap(q0, k0), std::swap(q1, k1);
    const Interval q = interval::fj_iv_range(double(q0), double(std::min(q1, sq) - 1));
    const Interval k = interval::fj_iv_range(double(k0), double(std::min(k1, sk) - 1));
    return interval_of(
        f,
        [&](const std::string &name) {
          return name == "q_idx"      ? q
                 : name == "kv_idx"   ? k
                 : name == "b"        ? interval::fj_iv_exact(double(batch_))
                 : name == "h"        ? interval::fj_iv_exact(double(head_))
                 : name == "seqlen_q" ? interval::fj_iv_exact(double(sq))
                 : name == "seqlen_k" ? interval::fj_iv_exact(double(sk))
                                      : interval::fj_iv_unknown();
        },
        [&](const std::string &name) { return buffers_.args->real(name).value(); });
  }
  /// The block-range pass (`range = @f` on a `for`): whether block `block` of
  /// the loop may hold a (query, key) pair f keeps. The loop skips the blocks
  /// that may not, at its ends and in between, as the kernels do.
  bool may_see(const Op &loop, int64_t block, bool transposed) const {
    const int64_t rows = loop.int_attr("block_m"), cols = loop.int_attr("block_n");
    const int64_t row0 = in(loop, 0).index * rows, col0 = block * cols;
    return interval::fj_iv_can_be_nonzero(
               block_interval(buffers_.functions.at(loop.symbol_attr("range")), row0, rows, col0,
                              cols, transposed)) &&
           (!loop.attrs.count("blocks") ||
            mask_block_class(row0, rows, col0, cols, transposed) != kMaskBlockEmpty);
  }
  /// A mask tensor's block class (`blocks = @attn_mask_blocks`; the kernels read
  /// it from lowering::lower_mask_blocks' summary, templates/mask_blocks.hip),
  /// judged here from @attn_mask itself over the block's pairs within the lengths.
  static constexpr int kMaskBlockEmpty = 0, kMaskBlockMixed = 1, kMaskBlockFull = 2;
  int mask_block_class(int64_t row0, int64_t rows, int64_t col0, int64_t cols,
                       bool transposed) const {
    int64_t q0 = row0, q1 = row0 + rows, k0 = col0, k1 = col0 + cols;
    if (transposed)
      std::swap(q0, k0), std::swap(q1, k1);
    const std::vector<float> &mask = *buffers_.arrays.at("attn_mask");
    const bool boolean = p_.array("attn_mask")->element == ArrayElement::u8;
    auto stride = [&](const char *name) { return buffers_.args->integer(name).value(); };
    const int64_t base = batch_ * stride("mask_batch_stride") + head_ * stride("mask_head_stride");
    const int64_t sq = stride("mask_q_stride"), sk = stride("mask_k_stride");
    bool attends = false, changed = false;
    for (int64_t q = q0; q < std::min(q1, seq("Q")); ++q)
      for (int64_t k = k0; k < std::min(k1, seq("K")); ++k) {
        const float x = mask[size_t(base + q * sq + k * sk)];
        const bool keep = boolean ? x != 0 : x != -std::numeric_limits<float>::infinity();
        attends = attends || keep;
        changed = changed || (boolean ? !keep : !(x == 0)); // NaN changes the score
      }
    return !attends ? kMaskBlockEmpty : changed ? kMaskBlockMixed : kMaskBlockFull;
  }
  BlockRange narrowed(const Op &op, BlockRange range, bool transposed) const {
    while (range.begin < range.end && !may_see(op, range.begin, transposed))
      ++range.begin;
    while (range.end > range.begin && !may_see(op, range.end - 1, transposed))
      --range.end;
    return range;
  }
  // The rows of `t` this workgroup's batch has.
  int64_t seq(const TensorParam &t) const {
    auto it = t.seq.is_param() ? rows_.find(t.seq.param) : rows_.end();
    return it != rows_.end() ? it->second.length : bound(t).seq;
  }
  int64_t seq(const char *name) const { return seq(*p_.tensor(name)); }
  const BoundTensor &bound(const TensorParam &t) const { return buffers_.by_name.at(t.name); }
  const BoundTensor &bound(const char *name) const { return buffers_.by_name.at(name); }
  Window window(const Op &op) const {
    return {int_value(op, "window_left", *buffers_.args, -1),
            int_value(op, "window_right", *buffers_.args, -1)};
  }

  void execute(const Op &op) {
    switch (op.kind) {
    case OpKind::Load: {
      const TensorParam &t = *p_.tensor(op.symbol_attr("tensor"));
      TileValue r = make(op.results[0]);
      const DType dtype = p_.type_of(op.results[0]).dtype;
      const int64_t row0 = in(op, 0).index * r.rows;
      for (int64_t i = 0; i < r.rows; ++i) {
        if (r.cols == 0 && row0 + i < seq(t)) // a vector: one value per row
          r.data[i] = bound(t).data[offset(t, row0 + i, 0)];
        for (int64_t j = 0; j < r.cols; ++j)
          if (row0 + i < seq(t) && j < t.dim) // an f32 tensor narrowed to the tile's dtype
            r.at(i, j) = round_to(dtype, bound(t).data[offset(t, row0 + i, j)]);
      }
      values_[op.results[0]] = std::move(r);
      break;
    }
    case OpKind::Store: {
      const TensorParam &t = *p_.tensor(op.symbol_attr("tensor"));
      const TileValue &x = in(op, 0);
      float *dst = bound(t).data;
      const int64_t row0 = in(op, 1).index * x.rows;
      for (int64_t i = 0; i < x.rows && row0 + i < seq(t); ++i) {
        if (x.cols == 0) {
          dst[offset(t, row0 + i, 0)] = round_to(t.dtype, x.data[i]);
          continue;
        }
        for (int64_t j = 0; j < t.dim; ++j)
          dst[offset(t, row0 + i, j)] = round_to(t.dtype, x.at(i, j));
      }
      break;
    }
    case OpKind::Fill: {
      TileValue r = make(op.results[0]);
      float value = 0;
      if (op.attrs.count("function"))
        value = float(evaluate(buffers_.functions.at(op.symbol_attr("function")), expr_context()));
      else
        value = float(op.float_attr("value"));
      std::fill(r.data.begin(), r.data.end(), value);
      values_[op.results[0]] = std::move(r);
      break;
    }
    case OpKind::MmaAB:
    case OpKind::MmaABt: {
      const bool bt = op.kind == OpKind::MmaABt;
      const TileValue &a = in(op, 0), &b = in(op, 1);
      TileValue r = in(op, 2);
      for (int64_t i = 0; i < r.rows; ++i)
        for (int64_t j = 0; j < r.cols; ++j) {
          float sum = r.at(i, j);
          for (int64_t k = 0; k < a.cols; ++k)
            sum += a.at(i, k) * (bt ? b.at(j, k) : b.at(k, j));
          r.at(i, j) = sum;
        }
      values_[op.results[0]] = std::move(r);
      break;
    }
    case OpKind::Scale: {
      const float f = float(real_value(op, "factor", *buffers_.args));
      elementwise(op, [f](float x, float) { return x * f; });
      break;
    }
    case OpKind::ScoreMod: {
      TileValue r = in(op, 0);
      ExprContext c = expr_context();
      const int64_t row0 = in(op, 1).index * r.rows, col0 = in(op, 2).index * r.cols;
      const bool transposed = op.int_attr("transposed") != 0; // rows are keys
      // A block whose every pair the mask keeps takes the function without it.
      const bool full =
          op.attrs.count("unmasked") &&
          !interval::fj_iv_can_be_zero(
              block_interval(buffers_.functions.at(op.symbol_attr("range")), row0, r.rows, col0,
                             r.cols, transposed)) &&
          (!op.attrs.count("blocks") ||
           mask_block_class(row0, r.rows, col0, r.cols, transposed) == kMaskBlockFull);
      const Expr &f = buffers_.functions.at(op.symbol_attr(full ? "unmasked" : "function"));
      for (int64_t i = 0; i < r.rows; ++i)
        for (int64_t j = 0; j < r.cols; ++j) {
          c.score = r.at(i, j);
          c.q_idx = transposed ? col0 + j : row0 + i;
          c.kv_idx = transposed ? row0 + i : col0 + j;
          r.at(i, j) = float(evaluate(f, c));
        }
      values_[op.results[0]] = std::move(r);
      break;
    }
    case OpKind::Mask: {
      const int64_t seqlen_q = seq("Q"), seqlen_k = seq("K");
      const Window w = window(op);
      const bool causal = op.int_attr("causal") != 0;
      const bool transposed = op.int_attr("transposed") != 0; // rows are keys
      // Grouped rows: row i is position i / g of seqlen_q / g.
      const int64_t g = int_value(op, "q_group", *buffers_.args, 1);
      TileValue r = in(op, 0);
      const int64_t row0 = in(op, 1).index * r.rows, col0 = in(op, 2).index * r.cols;
      for (int64_t i = 0; i < r.rows; ++i)
        for (int64_t j = 0; j < r.cols; ++j) {
          const int64_t query = transposed ? col0 + j : row0 + i;
          const int64_t key = transposed ? row0 + i : col0 + j;
          // A row past the rows stays past the positions: seqlen_q is a multiple of g.
          if (!visible(query / g, key, seqlen_q / g, seqlen_k, causal, w))
            r.at(i, j) = kNegInf;
        }
      values_[op.results[0]] = std::move(r);
      break;
    }
    case OpKind::RowMax:
    case OpKind::RowSum: {
      const bool is_max = op.kind == OpKind::RowMax;
      const TileValue &x = in(op, 0);
      TileValue r = make(op.results[0]);
      for (int64_t i = 0; i < x.rows; ++i) {
        float acc = is_max ? kNegInf : 0.0f;
        for (int64_t j = 0; j < x.cols; ++j)
          acc = is_max ? std::max(acc, x.at(i, j)) : acc + x.at(i, j);
        r.data[i] = acc;
      }
      values_[op.results[0]] = std::move(r);
      break;
    }
    case OpKind::Max:
      elementwise(op, [](float a, float b) { return std::max(a, b); });
      break;
    case OpKind::RunningMax: {
      const float slack = float(op.float_attr("slack"));
      elementwise(op, [slack](float a, float b) { return b > a + slack ? b : a; });
      break;
    }
    case OpKind::Add:
      elementwise(op, [](float a, float b) { return a + b; });
      break;
    case OpKind::Sub:
      elementwise(op, [](float a, float b) { return a - b; });
      break;
    case OpKind::Mul:
      elementwise(op, [](float a, float b) { return a * b; });
      break;
    case OpKind::Exp2:
      elementwise(op, [](float a, float) { return std::exp2(a); });
      break;
    case OpKind::Log2:
      elementwise(op, [](float a, float) { return std::log2(a); });
      break;
    case OpKind::ZeroIfNegInf:
      elementwise(op, [](float a, float) { return a == kNegInf ? 0.0f : a; });
      break;
    case OpKind::SubRow:
      with_row(op, [](float x, float r) { return x - r; });
      break;
    case OpKind::MulRow:
      with_row(op, [](float x, float r) { return x * r; });
      break;
    case OpKind::DivRow:
      with_row(op, [](float x, float r) { return r == 0.0f ? 0.0f : x / r; });
      break;
    case OpKind::SubCol: {
      TileValue r = make(op.results[0]);
      const TileValue &x = in(op, 0), &c = in(op, 1);
      for (int64_t i = 0; i < r.rows; ++i)
        for (int64_t j = 0; j < r.cols; ++j)
          r.at(i, j) = x.at(i, j) - c.data[j];
      values_[op.results[0]] = std::move(r);
      break;
    }
    case OpKind::Convert: {
      const DType t = p_.type_of(op.results[0]).dtype;
      elementwise(op, [t](float a, float) { return round_to(t, a); });
      break;
    }
    case OpKind::ConvertLayout:
      values_[op.results[0]] = in(op, 0);
      break;
    case OpKind::For: {
      const bool transposed = op.int_attr("transposed") != 0; // over query blocks
      const int64_t bm = op.int_attr("block_m"), bn = op.int_attr("block_n");
      const bool causal = op.int_attr("causal") != 0;
      BlockRange range =
          transposed
              ? q_block_range(in(op, 0).index, bm, bn, seq("Q"), seq("K"), causal, window(op))
              : kv_block_range(in(op, 0).index, bm, bn, seq("Q"), seq("K"), causal, window(op),
                               int_value(op, "q_group", *buffers_.args, 1));
      if (op.attrs.count("range"))
        range = narrowed(op, range, transposed);
      if (op.attrs.count("splits"))
        range = split_range(range, split_, int_value(op, "splits", *buffers_.args, 1));
      for (size_t i = 1; i < op.operands.size(); ++i)
        values_[op.region_args[i]] = in(op, int(i));
      for (int64_t kb = range.begin; kb < range.end; ++kb) {
        if (op.attrs.count("range") && !may_see(op, kb, transposed))
          continue; // an interior block the mask empties
        values_[op.region_args[0]].index = kb;
        for (const Op &inner : op.body) {
          if (inner.kind == OpKind::Yield) {
            std::vector<TileValue> next;
            for (ValueId y : inner.operands)
              next.push_back(values_[y]);
            for (size_t i = 0; i < next.size(); ++i)
              values_[op.region_args[i + 1]] = std::move(next[i]);
          } else {
            execute(inner);
          }
        }
      }
      for (size_t i = 0; i < op.results.size(); ++i)
        values_[op.results[i]] = values_[op.region_args[i + 1]];
      break;
    }
    case OpKind::Yield:
      break; // handled by For
    }
  }

  const Program &p_;
  const Buffers &buffers_;
  std::vector<TileValue> values_;
  int64_t head_ = 0, batch_ = 0, split_ = 0;
  std::map<std::string, SeqRows> rows_; // this batch's rows of each sequence
};

/// The tensor's extents and strides under `args`, checked against its buffer.
/// Its buffer's extents: a packed tensor is [1, heads, capacity, dim], a paged
/// one [pages, heads, page size, dim].
Expected<BoundTensor> bind_tensor(const Program &p, const TensorParam &t, const Bindings &args,
                                  int64_t splits, std::vector<float> &buf) {
  BoundTensor b{};
  const Sequence *rows = t.seq.is_param() ? p.sequence(t.seq.param) : nullptr;
  const Extent one = Extent::constant(1);
  const bool paged = !t.pages.table.empty();
  const Extent &batch = t.packed ? one : paged ? t.pages.count : t.batch;
  const Extent &seq = paged ? t.pages.page_size : rows ? rows->capacity : t.seq;
  const std::tuple<const char *, const Extent *, int64_t *> fields[] = {
      {"batch", &batch, &b.batch},
      {"heads", &t.heads, &b.heads},
      {"seq", &seq, &b.seq},
      {"batch stride", &t.stride_batch, &b.strides.batch},
      {"heads stride", &t.stride_head, &b.strides.head},
      {"seq stride", &t.stride_seq, &b.strides.seq},
      {"dim stride", &t.stride_dim, &b.strides.dim},
      {"split stride", &t.stride_split, &b.split_stride},
      {"group stride", &t.stride_group, &b.strides.group},
      {"row group", &t.row_group, &b.row_group}};
  for (const auto &[what, extent, out] : fields) {
    auto v = args.resolve(*extent);
    if (!v)
      return v.status().with_context(fmt::format("tensor @{}", t.name));
    // A negative stride addresses below the buffer, which the size check below
    // cannot see (the extent only bounds the largest offset).
    if (*v < 0)
      return Status::error("tensor @{}'s {} is bound to {}, expected at least 0", t.name, what, *v);
    *out = *v;
  }
  b.dim = t.dim;
  if (b.row_group < 1 || b.seq % b.row_group != 0)
    return Status::error("tensor @{}'s {} rows do not group by {}: grouped rows come a whole "
                         "group per position",
                         t.name, b.seq, b.row_group);
  // Grouped rows: the positions by the seq stride, the group's members past them.
  const int64_t need = AttentionSpec::extent(b.strides, b.batch, b.heads, b.seq / b.row_group,
                                             std::max<int64_t>(t.dim, 1)) +
                       (b.row_group - 1) * b.strides.group +
                       (b.split_stride ? (splits - 1) * b.split_stride : 0);
  if (need < 0 || int64_t(buf.size()) < need)
    return Status::error("buffer for tensor {} holds {} elements but its shape and strides need {}",
                         t.name, buf.size(), need);
  b.data = buf.data();
  return b;
}

/// The index arrays are long enough for every batch: starts [batches + 1],
/// used lengths [batches], page tables [batches * stride].
Status check_indices(const Program &p, const Bindings &args, const Buffers &buffers) {
  auto batches = args.resolve(p.grid.at(2).extent);
  if (!batches)
    return batches.status();
  auto need = [&](const std::string &name, int64_t count, std::string_view what) -> Status {
    const int64_t have = int64_t(buffers.indices.at(name)->size());
    if (have < count)
      return Status::error("index array @{} holds {} entries but {} needs {}", name, have, what,
                           count);
    return Status::ok();
  };
  for (const Sequence &q : p.sequences) {
    if (!q.starts.empty())
      FJ_RETURN_IF_ERROR(need(q.starts, *batches + 1, "batch + 1 sequence starts"));
    if (!q.used.empty())
      FJ_RETURN_IF_ERROR(need(q.used, *batches, "one length per batch"));
  }
  for (const TensorParam &t : p.tensors)
    if (!t.pages.table.empty()) {
      auto stride = args.resolve(t.pages.table_stride);
      if (!stride)
        return stride.status();
      FJ_RETURN_IF_ERROR(need(t.pages.table, *batches * *stride, "a page table row per batch"));
    }
  return Status::ok();
}

} // namespace

Status interpret(const Program &p, const Bindings &args, HostTensors &t) {
  return interpret(p, args, t, {});
}

void backward_preprocess(const AttentionSpec &spec, const HostTensors &t, std::vector<float> &l,
                         std::vector<float> &d) {
  const int64_t rows = spec.batch * spec.heads * spec.seqlen_q;
  l.assign(size_t(rows), 0.0f);
  d.assign(size_t(rows), 0.0f);
  for (int64_t b = 0; b < spec.batch; ++b)
    for (int64_t h = 0; h < spec.heads; ++h)
      for (int64_t i = 0; i < spec.seqlen_q; ++i) {
        const int64_t row = (b * spec.heads + h) * spec.seqlen_q + i;
        // The preprocess kernel's order: lane j of 8 sums the runs j, j + 8, ...
        // of 8 elements, then the lanes' sums as the tree its shuffles make.
        float lane[8] = {};
        for (int64_t c = 0; c < spec.head_dim_v; ++c) {
          const int64_t at = b * spec.o.batch + h * spec.o.head + i * spec.o.seq + c * spec.o.dim;
          lane[c / 8 % 8] += t.dout[size_t(at)] * t.o[size_t(at)];
        }
        const float dot = ((lane[0] + lane[4]) + (lane[2] + lane[6])) +
                          ((lane[1] + lane[5]) + (lane[3] + lane[7]));
        const float lse = t.lse[size_t(row)];
        l[size_t(row)] = lse == kNegInf ? std::numeric_limits<float>::infinity()
                                        : lse * float(std::numbers::log2e);
        d[size_t(row)] = dot;
      }
}

Status interpret(const Program &p, const Bindings &args, HostTensors &t,
                 const std::map<std::string, std::vector<float> *> &workspace) {
  FJ_RETURN_IF_ERROR(verify(p));
  FJ_RETURN_IF_ERROR(check_bindings(p, args));
  Buffers buffers;
  buffers.args = &args;
  auto group = args.resolve(p.group);
  if (!group)
    return group.status();
  if (*group < 1)
    return Status::error("group = {}, expected at least 1", *group);
  buffers.group = *group;
  int64_t splits = 1;
  if (p.grid.size() > 3) {
    auto n = args.resolve(p.grid[3].extent);
    if (!n)
      return n.status();
    if (*n < 1)
      return Status::error("the KV split axis has {} splits, expected at least 1", *n);
    splits = *n;
  }
  const std::map<std::string, const std::vector<int32_t> *> arrays = {
      {"cu_seqlens_q", &t.cu_seqlens_q},
      {"cu_seqlens_k", &t.cu_seqlens_k},
      {"seqused_k", &t.seqused_k},
      {"block_table", &t.block_table}};
  for (const std::string &name : p.indices) {
    auto it = arrays.find(name);
    if (it == arrays.end())
      return Status::error("the interpreter has no buffer for index array @{}", name);
    buffers.indices[name] = it->second;
  }
  FJ_RETURN_IF_ERROR(check_indices(p, args, buffers));
  const std::map<std::string, const std::vector<float> *> float_arrays = {
      {"alibi_slopes", &t.alibi_slopes}, {"sinks", &t.sinks}, {"attn_mask", &t.attn_mask}};
  for (const ArrayParam &a : p.arrays) {
    if (a.name == "attn_mask_blocks")
      continue; // the interpreter judges the blocks from @attn_mask itself
    auto it = float_arrays.find(a.name);
    if (it == float_arrays.end())
      return Status::error("the interpreter has no buffer for array @{}", a.name);
    buffers.arrays[a.name] = it->second;
  }
  for (const ScoreFunction &f : p.functions) {
    auto e = parse_expr(f.text, p.expr_scope(), fmt::format("function @{}", f.name));
    if (!e)
      return e.status();
    buffers.functions[f.name] = e.take();
  }
  std::map<std::string, std::vector<float> *> named = {
      {"Q", &t.q},     {"K", &t.k},   {"V", &t.v},   {"O", &t.o},  {"LSE", &t.lse},
      {"dO", &t.dout}, {"dQ", &t.dq}, {"dK", &t.dk}, {"dV", &t.dv}};
  for (const auto &[name, buffer] : workspace) // in place of t's (dK, dV per query head)
    named[name] = buffer;
  for (const TensorParam &param : p.tensors) {
    auto it = named.find(param.name);
    if (it == named.end())
      return Status::error("the interpreter has no buffer for tensor @{}", param.name);
    auto bound = bind_tensor(p, param, args, splits, *it->second);
    if (!bound)
      return bound.status();
    buffers.by_name[param.name] = *bound;
  }

  auto grid = grid_size(p.grid, args);
  if (!grid)
    return grid.status();
  const int64_t q_blocks = (*grid)[0] / splits, heads = (*grid)[1], batches = (*grid)[2];
  const int64_t groups = q_blocks * splits * heads * batches;
  const int64_t workers =
      std::clamp<int64_t>(std::thread::hardware_concurrency(), 1, std::max<int64_t>(groups, 1));
  std::vector<std::thread> pool;
  for (int64_t w = 0; w < workers; ++w)
    pool.emplace_back([&, w] {
      for (int64_t g = w; g < groups; g += workers) {
        const int64_t x = g % (q_blocks * splits); // x = q block * splits + split
        const int64_t head = (g / (q_blocks * splits)) % heads;
        const int64_t batch = g / (q_blocks * splits * heads);
        Workgroup(p, buffers, x / splits, head, batch, x % splits).run(p.body);
      }
    });
  for (auto &th : pool)
    th.join();
  if (!buffers.bad_read->second.empty())
    return Status::error("{}", buffers.bad_read->second);
  return Status::ok();
}

} // namespace flashjit::ir
