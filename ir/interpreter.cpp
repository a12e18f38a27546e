// The IR interpreter. Every workgroup of the grid runs the body with tiles held
// as dense row-major float arrays; the semantics are exactly those documented in
// ir/ops.def, so this is the executable definition of the IR.
#include "ir/interpreter.h"

#include "ir/build.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <thread>

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

struct Buffers {
  std::map<std::string, float *> by_name;
};

class Workgroup {
public:
  Workgroup(const Program &p, const Buffers &buffers, int64_t qb, int64_t head, int64_t batch)
      : p_(p), buffers_(buffers), values_(p.values.size()) {
    values_[p.grid_args[0]].index = qb;
    values_[p.grid_args[1]].index = head;
    values_[p.grid_args[2]].index = batch;
    head_ = head;
    batch_ = batch;
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
    const int64_t head = t.name == "K" || t.name == "V" ? head_ / p_.group : head_;
    return batch_ * t.strides.batch + head * t.strides.head + row * t.strides.seq +
           col * t.strides.dim;
  }

  void execute(const Op &op) {
    switch (op.kind) {
    case OpKind::Load: {
      const TensorParam &t = *p_.tensor(op.symbol_attr("tensor"));
      TileValue r = make(op.results[0]);
      const int64_t row0 = in(op, 0).index * r.rows;
      for (int64_t i = 0; i < r.rows; ++i)
        for (int64_t j = 0; j < r.cols; ++j)
          if (row0 + i < t.seq && j < t.dim)
            r.at(i, j) = buffers_.by_name.at(t.name)[offset(t, row0 + i, j)];
      values_[op.results[0]] = std::move(r);
      break;
    }
    case OpKind::Store: {
      const TensorParam &t = *p_.tensor(op.symbol_attr("tensor"));
      const TileValue &x = in(op, 0);
      float *dst = buffers_.by_name.at(t.name);
      const int64_t row0 = in(op, 1).index * x.rows;
      for (int64_t i = 0; i < x.rows && row0 + i < t.seq; ++i) {
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
      const float f = float(op.float_attr("factor"));
      elementwise(op, [f](float x, float) { return x * f; });
      break;
    }
    case OpKind::Mask: {
      const TensorParam &q = *p_.tensor("Q"), &k = *p_.tensor("K");
      const Window w{op.int_attr("window_left", -1), op.int_attr("window_right", -1)};
      const bool causal = op.int_attr("causal") != 0;
      TileValue r = in(op, 0);
      const int64_t row0 = in(op, 1).index * r.rows, col0 = in(op, 2).index * r.cols;
      for (int64_t i = 0; i < r.rows; ++i)
        for (int64_t j = 0; j < r.cols; ++j)
          if (!visible(row0 + i, col0 + j, q.seq, k.seq, causal, w))
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
      const Window w{op.int_attr("window_left", -1), op.int_attr("window_right", -1)};
      const BlockRange range =
          kv_block_range(in(op, 0).index, op.int_attr("block_m"), op.int_attr("block_n"),
                         p_.tensor("Q")->seq, p_.tensor("K")->seq, op.int_attr("causal") != 0, w);
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
  int64_t head_ = 0, batch_ = 0;
};

Status check_buffer(const TensorParam &t, const std::vector<float> &buf) {
  const int64_t need =
      AttentionSpec::extent(t.strides, t.batch, t.heads, t.seq, std::max<int64_t>(t.dim, 1));
  if (int64_t(buf.size()) < need)
    return Status::error("buffer for tensor {} holds {} elements but its shape and strides need {}",
                         t.name, buf.size(), need);
  return Status::ok();
}

} // namespace

Status interpret(const Program &p, HostTensors &t) {
  FJ_RETURN_IF_ERROR(verify(p));
  Buffers buffers;
  std::map<std::string, std::vector<float> *> named = {
      {"Q", &t.q}, {"K", &t.k}, {"V", &t.v}, {"O", &t.o}, {"LSE", &t.lse}};
  for (const TensorParam &param : p.tensors) {
    auto it = named.find(param.name);
    if (it == named.end())
      return Status::error("the interpreter has no buffer for tensor @{}", param.name);
    FJ_RETURN_IF_ERROR(check_buffer(param, *it->second));
    buffers.by_name[param.name] = it->second->data();
  }

  const int64_t groups = p.grid_q_blocks * p.grid_heads * p.grid_batch;
  const int64_t workers =
      std::clamp<int64_t>(std::thread::hardware_concurrency(), 1, std::max<int64_t>(groups, 1));
  std::vector<std::thread> pool;
  for (int64_t w = 0; w < workers; ++w)
    pool.emplace_back([&, w] {
      for (int64_t g = w; g < groups; g += workers) {
        const int64_t qb = g % p.grid_q_blocks;
        const int64_t head = (g / p.grid_q_blocks) % p.grid_heads;
        const int64_t batch = g / (p.grid_q_blocks * p.grid_heads);
        Workgroup(p, buffers, qb, head, batch).run(p.body);
      }
    });
  for (auto &th : pool)
    th.join();
  return Status::ok();
}

} // namespace flashjit::ir
