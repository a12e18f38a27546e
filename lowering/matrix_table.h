// The matrix instructions flashjit can emit, one table row per instruction and
// family (STYLE.md habit 2). Lowering, the emulator and `flashjit archs` read
// this table; tests/matrix_table_test.cpp checks every lane map slot by slot
// against AMD's Matrix Instruction Calculator (tests/data/amd_matrix_layouts.json).
// Facts and sources: ../shared/docs/amd-matrix-layouts.md.
#pragma once

#include "ir/dtype.h"
#include "ir/status.h"
#include "lowering/target.h"

#include <span>
#include <string_view>

namespace flashjit::lowering {

/// An entry of a matrix: A[row = m][col = k], B[row = k][col = n], D[row = m][col = n].
struct MatrixCoord {
  int row = 0;
  int col = 0;
  friend bool operator==(const MatrixCoord &, const MatrixCoord &) = default;
};

/// Which matrix entry lane `lane` holds in element `elem` of the builtin's vector
/// argument (A, B) or result (C/D). Hardware order, exactly as the calculator says.
using LaneMap = MatrixCoord (*)(int lane, int elem);

/// The register layout shared by the instructions of one shape and family.
struct LaneLayout {
  std::string_view name; ///< e.g. "gfx12_16x16x16", for messages and `flashjit archs`
  int m = 0, n = 0, k = 0;
  int wave_size = 0;
  int a_elems = 0;  ///< A vector elements per lane
  int b_elems = 0;  ///< B vector elements per lane
  int cd_elems = 0; ///< C/D vector elements per lane
  /// Lanes holding each A and B entry: 1, or 2 on gfx11 where lanes L and L+16
  /// must hold identical A/B values (doc §2.2).
  int ab_replication = 1;
  LaneMap a; ///< (lane, elem) -> (m, k)
  LaneMap b; ///< (lane, elem) -> (k, n)
  LaneMap d; ///< (lane, elem) -> (m, n), also the layout of C
};

/// A trailing integer-constant argument of a builtin, e.g. MFMA's cbsz.
struct BuiltinArg {
  std::string_view name;
  int value;
};

/// How a row's lane maps are known (doc's status marks).
enum class LayoutSource {
  calculator, ///< [verified-calc]: tests/data/amd_matrix_layouts.json has this instruction
  sources,    ///< [sources]: not in the calculator snapshot; CK-tile, tinygrad, Triton agree
};

struct MatrixInstr {
  /// The mnemonic as the calculator names it, which is also what llvm-objdump
  /// prints for this family (gfx90a: "v_mfma_f32_16x16x16bf16_1k"; gfx942 and
  /// gfx950 print the same opcode as "v_mfma_f32_16x16x16_bf16", doc §4.1).
  std::string_view mnemonic;
  /// The clang builtin the emitted HIP calls.
  std::string_view builtin;
  Family family;
  DType ab_dtype;  ///< element type of A and B
  DType acc_dtype; ///< element type of C and D
  /// Scalar type of the A/B `ext_vector_type` vectors in emitted HIP: "_Float16"
  /// for f16; bf16 is "short" (bit patterns, move in with __builtin_bit_cast) on
  /// gfx11, gfx12, gfx90a and gfx942 builtins, but "__bf16" for the gfx950-only ones.
  std::string_view ab_elem_type;
  /// Scalar type of the C/D vectors in emitted HIP ("float").
  std::string_view cd_elem_type;
  const LaneLayout *layout;
  /// Constant arguments after (a, b, c): MFMA's cbsz, abid, blgp = 0, 0, 0.
  std::span<const BuiltinArg> trailing_args;
  LayoutSource layout_source;

  int m() const { return layout->m; }
  int n() const { return layout->n; }
  int k() const { return layout->k; }
};

/// Every row, grouped by family.
std::span<const MatrixInstr> matrix_table();

/// The instruction computing an m x n x k product with `ab_dtype` inputs (f32
/// accumulate) on `target`, or an error naming what the target offers.
Expected<const MatrixInstr *> find_matrix_instr(const Target &target, DType ab_dtype, int m, int n,
                                                int k);

} // namespace flashjit::lowering
