// The IR interpreter. Every workgroup of the grid runs the body with tiles held
// as dense row-major float arrays; the semantics are exactly those documented in
// ir/ops.def, so this is the executable definition of the IR.
#include "ir/interpreter.h"

#include "ir/build.h"

#include <algorithm>
#include <cmath>
#include <limits>
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
  Strides strides;
  int64_t split_stride; // between the KV splits' partial results (0 elsewhere)
  float *data;
};

struct Buffers {
  std::map<std::string, BoundTensor> by_name;
  const Bindings *args;
  int64_t group;
};

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

  // Element offset of (row, col) of `t` for this workgroup's batch and head.
  int64_t offset(const TensorParam &t, int64_t row, int64_t col) const {
    const BoundTensor &b = bound(t);
    const int64_t head = t.name == "K" || t.name == "V" ? head_ / buffers_.group : head_;
    return split_ * b.split_stride + batch_ * b.strides.batch + head * b.strides.head +
           row * b.strides.seq + col * b.strides.dim;
  }
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
      const int64_t row0 = in(op, 0).index * r.rows;
      for (int64_t i = 0; i < r.rows; ++i)
        for (int64_t j = 0; j < r.cols; ++j)
          if (row0 + i < bound(t).seq && j < t.dim)
            r.at(i, j) = bound(t).data[offset(t, row0 + i, j)];
      values_[op.results[0]] = std::move(r);
      break;
    }
    case OpKind::Store: {
      const TensorParam &t = *p_.tensor(op.symbol_attr("tensor"));
      const TileValue &x = in(op, 0);
      float *dst = bound(t).data;
      const int64_t row0 = in(op, 1).index * x.rows;
      for (int64_t i = 0; i < x.rows && row0 + i < bound(t).seq; ++i) {
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
      std::fill(r.data.begin(), r.data.end(), float(op.float_attr("value")));
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
    case OpKind::Mask: {
      const int64_t seqlen_q = bound("Q").seq, seqlen_k = bound("K").seq;
      const Window w = window(op);
      const bool causal = op.int_attr("causal") != 0;
      TileValue r = in(op, 0);
      const int64_t row0 = in(op, 1).index * r.rows, col0 = in(op, 2).index * r.cols;
      for (int64_t i = 0; i < r.rows; ++i)
        for (int64_t j = 0; j < r.cols; ++j)
          if (!visible(row0 + i, col0 + j, seqlen_q, seqlen_k, causal, w))
            r.at(i, j) = kNegInf;
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
    case OpKind::Convert: {
      const DType t = p_.type_of(op.results[0]).dtype;
      elementwise(op, [t](float a, float) { return round_to(t, a); });
      break;
    }
    case OpKind::ConvertLayout:
      values_[op.results[0]] = in(op, 0);
      break;
    case OpKind::For: {
      BlockRange range =
          kv_block_range(in(op, 0).index, op.int_attr("block_m"), op.int_attr("block_n"),
                         bound("Q").seq, bound("K").seq, op.int_attr("causal") != 0, window(op));
      if (op.attrs.count("splits"))
        range = split_range(range, split_, int_value(op, "splits", *buffers_.args, 1));
      for (size_t i = 1; i < op.operands.size(); ++i)
        values_[op.region_args[i]] = in(op, int(i));
      for (int64_t kb = range.begin; kb < range.end; ++kb) {
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
};

/// The tensor's extents and strides under `args`, checked against its buffer.
Expected<BoundTensor> bind_tensor(const TensorParam &t, const Bindings &args, int64_t splits,
                                  std::vector<float> &buf) {
  BoundTensor b{};
  const std::tuple<const char *, const Extent *, int64_t *> fields[] = {
      {"batch", &t.batch, &b.batch},
      {"heads", &t.heads, &b.heads},
      {"seq", &t.seq, &b.seq},
      {"batch stride", &t.stride_batch, &b.strides.batch},
      {"heads stride", &t.stride_head, &b.strides.head},
      {"seq stride", &t.stride_seq, &b.strides.seq},
      {"dim stride", &t.stride_dim, &b.strides.dim},
      {"split stride", &t.stride_split, &b.split_stride}};
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
  const int64_t need =
      AttentionSpec::extent(b.strides, b.batch, b.heads, b.seq, std::max<int64_t>(t.dim, 1)) +
      (b.split_stride ? (splits - 1) * b.split_stride : 0);
  if (need < 0 || int64_t(buf.size()) < need)
    return Status::error("buffer for tensor {} holds {} elements but its shape and strides need {}",
                         t.name, buf.size(), need);
  b.data = buf.data();
  return b;
}

} // namespace

Status interpret(const Program &p, const Bindings &args, HostTensors &t) {
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
  std::map<std::string, std::vector<float> *> named = {
      {"Q", &t.q}, {"K", &t.k}, {"V", &t.v}, {"O", &t.o}, {"LSE", &t.lse}};
  for (const TensorParam &param : p.tensors) {
    auto it = named.find(param.name);
    if (it == named.end())
      return Status::error("the interpreter has no buffer for tensor @{}", param.name);
    auto bound = bind_tensor(param, args, splits, *it->second);
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
  return Status::ok();
}

} // namespace flashjit::ir
