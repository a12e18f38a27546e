// The tile IR: types, values, ops and the Program.
//
// A Program is one attention kernel. Its grid maps (q block, head, batch) to
// workgroups; its body is a flat list of ops plus one `for` over KV blocks whose
// loop-carried tiles are the running max, running sum and output accumulator.
//
// Layouts say how a tile is distributed; they only constrain which ops may
// consume a tile, and changing one is always an explicit convert_layout:
//
//   #blocked   no distribution chosen (the interpreter's view)
//   #mma_a     operand A of a matrix instruction (rows = M, cols = K)
//   #mma_b     operand B: K x N for mma_ab, given as B^T (N x K) for mma_abt
//   #mma_acc   the accumulator C/D (rows = M, cols = N)
//   #rows      a per-row vector of a #mma_acc tile (length M)
#pragma once

#include "ir/dtype.h"
#include "ir/spec.h"
#include "ir/status.h"

#include <cstdint>
#include <map>
#include <string>
#include <variant>
#include <vector>

namespace flashjit::ir {

enum class OpKind {
#define FJ_OP(Name, text, nops, nres, doc) Name,
#include "ir/ops.def"
};
constexpr int kNumOps = 0
#define FJ_OP(Name, text, nops, nres, doc) +1
#include "ir/ops.def"
    ;

struct OpInfo {
  const char *name; // the text form
  int num_operands; // -1: variadic
  int num_results;  // -1: variadic
  const char *summary;
};
const OpInfo &op_info(OpKind k);

enum class TileLayout { blocked, mma_a, mma_b, mma_acc, rows };
std::string_view tile_layout_name(TileLayout l);

/// index (a block number), or tile<RxCxT, #layout>, or a vector tile<RxT, #layout> (cols == 0).
struct Type {
  enum class Kind { index, tile } kind = Kind::index;
  DType dtype = DType::f32;
  int64_t rows = 0;
  int64_t cols = 0; // 0 for a per-row vector
  TileLayout layout = TileLayout::blocked;

  static Type index() { return Type{}; }
  static Type tile(int64_t rows, int64_t cols, DType t, TileLayout l) {
    return Type{Kind::tile, t, rows, cols, l};
  }
  static Type vec(int64_t rows, DType t, TileLayout l = TileLayout::rows) {
    return Type{Kind::tile, t, rows, 0, l};
  }
  bool is_index() const { return kind == Kind::index; }
  bool is_vector() const { return kind == Kind::tile && cols == 0; }
  bool operator==(const Type &) const = default;
};
std::string to_string(const Type &t);

/// Attribute values: integer, floating point (inf allowed), or a symbol (@Q).
struct Symbol {
  std::string name;
  bool operator==(const Symbol &) const = default;
};
using Attr = std::variant<int64_t, double, Symbol>;
using Attrs = std::map<std::string, Attr>; // printed in key order

using ValueId = int;

struct Op {
  OpKind kind;
  std::vector<ValueId> results;
  std::vector<ValueId> operands;
  Attrs attrs;
  // Only for `for`: region arguments (the KV block index, then one per loop-carried
  // tile) and the body, which ends with `yield`.
  std::vector<ValueId> region_args;
  std::vector<Op> body;

  int64_t int_attr(const std::string &k, int64_t fallback = 0) const;
  double float_attr(const std::string &k, double fallback = 0) const;
  std::string symbol_attr(const std::string &k) const;
};

struct ValueDef {
  std::string name; // printed as %name; empty prints as %<id>
  Type type;
};

/// A global tensor the kernel reads or writes: logical [batch, heads, seq, dim]
/// (dim = 0 for the LSE vector), with element strides.
struct TensorParam {
  std::string name; // Q, K, V, O, LSE
  DType dtype;
  int64_t batch, heads, seq, dim;
  Strides strides;
  bool operator==(const TensorParam &) const = default;
};

struct Program {
  std::string name;
  std::vector<TensorParam> tensors;
  // Grid: workgroup (x, y, z) = (q block, head, batch). grid_args are the index
  // values the body sees for them.
  int64_t grid_q_blocks = 0, grid_heads = 0, grid_batch = 0;
  std::vector<ValueId> grid_args; // q_block, head, batch
  int64_t group = 1;              // q heads per kv head: K/V use head / group
  Attrs config;                   // the tuning config the program was built with (block_m, ...)
  std::vector<ValueDef> values;
  std::vector<Op> body;

  ValueId add_value(Type t, std::string name = "");
  const Type &type_of(ValueId v) const { return values.at(v).type; }
  const TensorParam *tensor(const std::string &name) const;
};

/// The text form; parse(print(p)) prints identically.
std::string print(const Program &p);
/// How print() spells each value, without the '%': its name (made unique with a
/// suffix if repeated) or, for an unnamed value, a number counting unnamed values in
/// definition order. Indexed by ValueId; values defined nowhere read "?name" or "?<id>".
std::vector<std::string> value_names(const Program &p);
Expected<Program> parse(std::string_view text);
/// Shape, dtype, layout and structure checks with a message that names the op.
Status verify(const Program &p);

} // namespace flashjit::ir
