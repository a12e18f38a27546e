// The tile IR: types, values, ops and the Program.
//
// A Program is one attention kernel. Its grid maps (q block, head, batch) to
// workgroups; its body is a flat list of ops plus one `for` over KV blocks whose
// loop-carried tiles are the running max, running sum and output accumulator.
//
// A Program is shape-free: sequence lengths, batch, heads, strides, window
// sizes and the softmax scale are scalar parameters (%seqlen_q, ...) bound at
// launch, so one compiled kernel serves every shape of its signature. Tensor
// extents and strides, grid extents and some op attributes name them.
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

#include <array>
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

/// rows: a per-row vector of an #mma_acc tile (one value per row); cols: a
/// per-column vector of one (the backward's per-query values when rows are keys).
enum class TileLayout { blocked, mma_a, mma_b, mma_acc, rows, cols };
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

/// Attribute values: integer, floating point (inf allowed), a symbol (@Q), or a
/// scalar parameter read at run time (%window_left).
struct Symbol {
  std::string name;
  bool operator==(const Symbol &) const = default;
};
struct ParamRef {
  std::string name;
  bool operator==(const ParamRef &) const = default;
};
using Attr = std::variant<int64_t, double, Symbol, ParamRef>;
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

/// The type of a scalar parameter, as the kernel receives it.
enum class ScalarType { i32, i64, f32 };
std::string_view scalar_type_name(ScalarType t);

/// A run-time scalar argument of the kernel: a length, stride, window size or scale.
struct ScalarParam {
  std::string name; // printed %name; also the kernel's C parameter name
  ScalarType type;
  bool operator==(const ScalarParam &) const = default;
};

/// An extent or stride: a constant, or a scalar parameter (printed %name).
struct Extent {
  int64_t value = 0;
  std::string param; // non-empty: the parameter's name, and value is unused
  static Extent constant(int64_t v) { return Extent{v, {}}; }
  static Extent of(std::string param) { return Extent{0, std::move(param)}; }
  bool is_param() const { return !param.empty(); }
  bool operator==(const Extent &) const = default;
};
std::string to_string(const Extent &e); // "64" or "%seqlen_q"

/// A global tensor the kernel reads or writes: logical [batch, heads, seq, dim]
/// (dim = 0 for the LSE vector), with element strides. The head dim is always a
/// constant (it shapes the tiles); the rest may be parameters.
struct TensorParam {
  std::string name; // Q, K, V, O, LSE
  DType dtype;
  Extent batch, heads, seq;
  int64_t dim = 0;
  Extent stride_batch, stride_head, stride_seq, stride_dim;
  /// The stride between splits of the KV range (split-KV partial outputs,
  /// indexed by the grid's 4th axis); constant 0 for every other tensor.
  Extent stride_split = Extent::constant(0);
  /// Grouped rows (AttentionSpec::q_group: the query rows of several heads per
  /// position): row r lies at (r / row_group) * stride_seq + (r % row_group) *
  /// stride_group from the head's row 0. Printed as the strides' `group = ..`
  /// and ` grouped = %q_group`; row_group 1 (not grouped) prints nothing.
  Extent row_group = Extent::constant(1);
  Extent stride_group = Extent::constant(0);
  bool grouped() const { return row_group != Extent::constant(1); }
  /// Every row start (base pointer and strides) is a multiple of this many bytes:
  /// 16 allows 128-bit accesses, 8 allows 64-bit ones. Part of the signature.
  int64_t row_align = 2;
  /// Packed rows (varlen): `seq` names a Sequence with starts, and batch b's row
  /// 0 is row starts[b] of the tensor; the batch stride is unused. Printed ` packed`.
  bool packed = false;
  /// A paged tensor (a paged KV cache): row j of batch b is row j % page_size
  /// of page table[b * table_stride + j / page_size]; the batch stride is the
  /// page stride. A row past the table's row (j / page_size >= table_stride) or
  /// a page outside [0, count) reads page 0: never out of bounds.
  /// Printed ` pages = @table [stride = .., size = .., count = ..]`.
  struct Pages {
    std::string table; // an index array of the program; empty: not paged
    Extent table_stride, page_size, count;
    bool operator==(const Pages &) const = default;
  } pages = {};
  bool operator==(const TensorParam &) const = default;
};

/// A per-batch sequence length read at run time from index arrays (varlen
/// batches, KV caches), defined at the start of each workgroup. Tensor extents,
/// masks and loop bounds name it like a scalar parameter (%seqlen_k). For batch b:
///   start  = starts ? clamp(starts[b], 0, capacity) : 0
///   length = used ? used[b] : starts ? starts[b + 1] - start : capacity
///   length = clamp(length, 0, capacity - start)
/// so no index array can send a tensor access out of its rows.
/// Printed `sequence %seqlen_k = lengths(starts = @cu_seqlens_k, used = @seqused_k,
/// capacity = %total_k)`, the absent fields left out.
struct Sequence {
  std::string name;   // printed %name, the C local's name
  std::string starts; // index array [batches + 1] of cumulative row starts, or empty
  std::string used;   // index array [batches] of lengths, or empty
  Extent capacity;    // the rows a batch may use, counted from row 0 of the tensor
  bool operator==(const Sequence &) const = default;
};

/// One axis of the grid: `arg` runs over [0, ceil(extent / divisor)).
struct GridAxis {
  ValueId arg = -1;
  Extent extent;
  int64_t divisor = 1;
  bool operator==(const GridAxis &) const = default;
};

/// A score expression (ir/expr.h) that `score_mod` ops name with {function = @name}.
/// Printed `function @name = "text"` in its canonical text.
struct ScoreFunction {
  std::string name, text;
  bool operator==(const ScoreFunction &) const = default;
};

/// The element type of an array score functions read: f32 (ALiBi slopes, sink
/// logits) or a mask tensor's (u8 bools, f16, bf16). Every element reads as f32.
enum class ArrayElement { f32, f16, bf16, u8 };
std::string_view array_element_name(ArrayElement e);

/// An array in device memory that score functions read: printed `@alibi_slopes`
/// (f32) or `@attn_mask : u8`.
struct ArrayParam {
  std::string name;
  ArrayElement element = ArrayElement::f32;
  bool operator==(const ArrayParam &) const = default;
};

struct Program {
  std::string name;
  std::vector<ScalarParam> scalars;
  /// Arrays in device memory that score functions read (alibi_slopes, attn_mask).
  std::vector<ArrayParam> arrays;
  std::vector<ScoreFunction> functions;
  /// int32 arrays in device memory (cu_seqlens, seqused_k, block tables), named
  /// like tensors (@cu_seqlens_q); sequences and paged tensors read them.
  std::vector<std::string> indices;
  std::vector<Sequence> sequences;
  std::vector<TensorParam> tensors;
  // Grid: workgroup (x, y, z) = (q block, head, batch); each axis's arg is the
  // index value the body sees for it. An optional 4th axis is the split of the
  // KV range (split-KV): it runs inside x, x = q block * splits + split, and a
  // `for` with a `splits` attribute visits only that split's KV blocks.
  std::vector<GridAxis> grid;
  Extent group = Extent::constant(1); // q heads per kv head: K/V use head / group
  Attrs config;                       // the tuning config the program was built with (block_m, ...)
  std::vector<ValueDef> values;
  std::vector<Op> body;

  ValueId add_value(Type t, std::string name = "");
  const Type &type_of(ValueId v) const { return values.at(v).type; }
  const TensorParam *tensor(const std::string &name) const;
  /// The matrix operands' element type: @Q's, or the type its tiles load as
  /// when @Q is f32 in memory (AttentionSpec::f32_io); bf16 for a program
  /// without @Q or without such a tile.
  DType operand_dtype() const;
  const ScalarParam *scalar(std::string_view name) const;
  const Sequence *sequence(std::string_view name) const;
  bool has_index(std::string_view name) const;
  const ArrayParam *array(std::string_view name) const;
  const ScoreFunction *function(std::string_view name) const;
  /// The names score functions may read: the scalars and the arrays.
  struct ExprScope expr_scope() const;
  ValueId grid_arg(size_t axis) const { return grid.at(axis).arg; }
};

/// The run-time values of a program's scalar parameters, by name. A flat list:
/// a launch binds ~30 values and reads each once, in nearly the order bound, so
/// lookups take a position hint (the last match + 1) and cost no allocation.
class Bindings {
public:
  using Value = std::variant<int64_t, double>;
  Bindings() { values_.reserve(32); }
  void set_int(std::string_view name, int64_t v) { set(name, v); }
  void set_real(std::string_view name, double v) { set(name, v); }
  /// The value bound to `name`, or null; `hint` (in/out, may be null) is
  /// where the search starts and, on a match, the position after it.
  const Value *find(std::string_view name, size_t *hint = nullptr) const;
  /// The integer bound to `name`, or an error naming the missing parameter.
  Expected<int64_t> integer(std::string_view name, size_t *hint = nullptr) const;
  /// The number bound to `name` (an integer reads as a double).
  Expected<double> real(std::string_view name, size_t *hint = nullptr) const;
  /// An extent's value: the constant, or its parameter's binding.
  Expected<int64_t> resolve(const Extent &e) const;
  bool has(std::string_view name) const { return find(name) != nullptr; }

private:
  void set(std::string_view name, Value v);
  std::vector<std::pair<std::string, Value>> values_;
};

/// Checks that `b` binds every scalar of `p` with a value of its type (an i32
/// in range, a finite f32).
Status check_bindings(const Program &p, const Bindings &b);
/// The workgroups a grid launches in (x, y, z) under `b`; a 4th axis (the KV
/// split) multiplies x.
Expected<std::array<int64_t, 3>> grid_size(const std::vector<GridAxis> &grid, const Bindings &b);

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
