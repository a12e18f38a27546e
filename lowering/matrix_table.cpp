#include "lowering/matrix_table.h"

#include <string>

namespace flashjit::lowering {
namespace {

// Lane maps. L = lane, e = vector element; formulas from
// ../shared/docs/amd-matrix-layouts.md §1-5, checked slot by slot against the
// calculator in tests/matrix_table_test.cpp. In every family B is laid out like
// A with the roles of rows and columns swapped: each lane holds one column of B.

template <LaneMap A> MatrixCoord transposed(int lane, int elem) {
  MatrixCoord c = A(lane, elem);
  return {c.col, c.row};
}

// gfx11 (RDNA3/3.5) v_wmma_f32_16x16x16_{f16,bf16}, wave32 (doc §2.2).
// A: each lane holds one full row of A, lanes L and L+16 the same row (replicated).
// D: lanes 0-15 hold the even rows of column L%16, lanes 16-31 the odd rows.
MatrixCoord gfx11_a(int lane, int elem) { return {lane % 16, elem}; }
MatrixCoord gfx11_d(int lane, int elem) { return {2 * elem + lane / 16, lane % 16}; }

// gfx12 (RDNA4) v_wmma_f32_16x16x16_{f16,bf16}, wave32 (doc §3.2), hardware K order:
//
//   A (16 x 16, m x k): lane L, element e holds A[L%16][8*(e/4) + 4*(L/16) + e%4]
//
//          k:  0  1  2  3 |  4  5  6  7 |  8  9 10 11 | 12 13 14 15
//     m = 0    L0  e0..e3 | L16 e0..e3  | L0  e4..e7  | L16 e4..e7
//     m = 1    L1  e0..e3 | L17 e0..e3  | L1  e4..e7  | L17 e4..e7
//      ...
//     m = 15   L15 e0..e3 | L31 e0..e3  | L15 e4..e7  | L31 e4..e7
//
//   B (k x n) is the transpose: lane L holds column n = L%16 in the same k order.
//
//   D (16 x 16, m x n): lane L, element e holds D[8*(L/16) + e][L%16]
//
//          n:     0       1     ...     15
//     m = 0     L0.e0   L1.e0   ...   L15.e0
//     m = 1     L0.e1   L1.e1   ...   L15.e1
//      ...
//     m = 7     L0.e7   L1.e7   ...   L15.e7
//     m = 8     L16.e0  L17.e0  ...   L31.e0
//      ...
//     m = 15    L16.e7  L17.e7  ...   L31.e7
//
// The k order of A/B is not contiguous; CK, llama.cpp and Triton label k as
// 8*(L/16) + e instead, which is equally right as long as A and B of one
// instruction use the same labeling (doc §3.3). This table keeps the hardware's.
MatrixCoord gfx12_a(int lane, int elem) {
  return {lane % 16, 8 * (elem / 4) + 4 * (lane / 16) + elem % 4};
}
MatrixCoord gfx12_d(int lane, int elem) { return {8 * (lane / 16) + elem, lane % 16}; }

// CDNA v_mfma_f32_16x16x16_{f16,bf16}, wave64 (doc §4.2): 4 lane groups along k.
MatrixCoord mfma_16x16x16_a(int lane, int elem) { return {lane % 16, 4 * (lane / 16) + elem}; }
// All 16x16 MFMAs: four consecutive rows of column L%16.
MatrixCoord mfma_16x16_d(int lane, int elem) { return {4 * (lane / 16) + elem, lane % 16}; }

// CDNA v_mfma_f32_32x32x8_{f16,bf16}, wave64 (doc §4.2): 2 lane groups along k.
MatrixCoord mfma_32x32x8_a(int lane, int elem) { return {lane % 32, 4 * (lane / 32) + elem}; }
// All 32x32 MFMAs: lanes 0-31 own rows {0-3, 8-11, 16-19, 24-27}, lanes 32-63 the rest.
MatrixCoord mfma_32x32_d(int lane, int elem) {
  return {8 * (elem / 4) + 4 * (lane / 32) + elem % 4, lane % 32};
}

// gfx950 v_mfma_f32_16x16x32 / 32x32x16 {f16,bf16} (doc §5.2, [sources]: CK-tile,
// tinygrad, Triton; no CDNA4 in the calculator snapshot). The hardware k order of
// the 8 values is unconfirmed (doc §5.3); any order is right if A and B share it.
MatrixCoord mfma_16x16x32_a(int lane, int elem) { return {lane % 16, 8 * (lane / 16) + elem}; }
MatrixCoord mfma_32x32x16_a(int lane, int elem) { return {lane % 32, 8 * (lane / 32) + elem}; }

// NVIDIA mma.sync.aligned.m16n8k16.row.col.f32.{bf16,f16} (PTX ISA, "Matrix
// fragments for mma.m16n8k16"): g = lane / 4 (group), t = lane % 4.
//
//   A (16 x 16): a0,a1 = A[g][2t..2t+1]    a2,a3 = A[g+8][2t..2t+1]
//                a4,a5 = A[g][2t+8..2t+9]  a6,a7 = A[g+8][2t+8..2t+9]
//   B (16 x 8):  b0,b1 = B[2t..2t+1][g]    b2,b3 = B[2t+8..2t+9][g]
//   D (16 x 8):  d0,d1 = D[g][2t..2t+1]    d2,d3 = D[g+8][2t..2t+1]
MatrixCoord sm80_a(int lane, int elem) {
  return {lane / 4 + 8 * ((elem / 2) % 2), 2 * (lane % 4) + elem % 2 + 8 * (elem / 4)};
}
MatrixCoord sm80_b(int lane, int elem) {
  return {2 * (lane % 4) + elem % 2 + 8 * (elem / 2), lane / 4};
}
MatrixCoord sm80_d(int lane, int elem) {
  return {lane / 4 + 8 * (elem / 2), 2 * (lane % 4) + elem % 2};
}

constexpr LaneLayout kSm80 = {.name = "sm80_m16n8k16",
                              .m = 16,
                              .n = 8,
                              .k = 16,
                              .wave_size = 32,
                              .a_elems = 8,
                              .b_elems = 4,
                              .cd_elems = 4,
                              .ab_replication = 1,
                              .a = sm80_a,
                              .b = sm80_b,
                              .d = sm80_d};

constexpr LaneLayout kGfx11 = {.name = "gfx11_16x16x16",
                               .m = 16,
                               .n = 16,
                               .k = 16,
                               .wave_size = 32,
                               .a_elems = 16,
                               .b_elems = 16,
                               .cd_elems = 8,
                               .ab_replication = 2,
                               .a = gfx11_a,
                               .b = transposed<gfx11_a>,
                               .d = gfx11_d};
constexpr LaneLayout kGfx12 = {.name = "gfx12_16x16x16",
                               .m = 16,
                               .n = 16,
                               .k = 16,
                               .wave_size = 32,
                               .a_elems = 8,
                               .b_elems = 8,
                               .cd_elems = 8,
                               .ab_replication = 1,
                               .a = gfx12_a,
                               .b = transposed<gfx12_a>,
                               .d = gfx12_d};
constexpr LaneLayout kMfma16x16x16 = {.name = "mfma_16x16x16",
                                      .m = 16,
                                      .n = 16,
                                      .k = 16,
                                      .wave_size = 64,
                                      .a_elems = 4,
                                      .b_elems = 4,
                                      .cd_elems = 4,
                                      .ab_replication = 1,
                                      .a = mfma_16x16x16_a,
                                      .b = transposed<mfma_16x16x16_a>,
                                      .d = mfma_16x16_d};
constexpr LaneLayout kMfma32x32x8 = {.name = "mfma_32x32x8",
                                     .m = 32,
                                     .n = 32,
                                     .k = 8,
                                     .wave_size = 64,
                                     .a_elems = 4,
                                     .b_elems = 4,
                                     .cd_elems = 16,
                                     .ab_replication = 1,
                                     .a = mfma_32x32x8_a,
                                     .b = transposed<mfma_32x32x8_a>,
                                     .d = mfma_32x32_d};
constexpr LaneLayout kMfma16x16x32 = {.name = "mfma_16x16x32",
                                      .m = 16,
                                      .n = 16,
                                      .k = 32,
                                      .wave_size = 64,
                                      .a_elems = 8,
                                      .b_elems = 8,
                                      .cd_elems = 4,
                                      .ab_replication = 1,
                                      .a = mfma_16x16x32_a,
                                      .b = transposed<mfma_16x16x32_a>,
                                      .d = mfma_16x16_d};
constexpr LaneLayout kMfma32x32x16 = {.name = "mfma_32x32x16",
                                      .m = 32,
                                      .n = 32,
                                      .k = 16,
                                      .wave_size = 64,
                                      .a_elems = 8,
                                      .b_elems = 8,
                                      .cd_elems = 16,
                                      .ab_replication = 1,
                                      .a = mfma_32x32x16_a,
                                      .b = transposed<mfma_32x32x16_a>,
                                      .d = mfma_32x32_d};

// MFMA's last three builtin arguments; 0, 0, 0 is a plain GEMM (non-zero values
// broadcast or permute operands, doc §4.1).
constexpr BuiltinArg kMfmaArgs[] = {{"cbsz", 0}, {"abid", 0}, {"blgp", 0}};
constexpr std::span<const BuiltinArg> kNoArgs = {};

using enum DType;
using enum Family;
using enum LayoutSource;

// Builtin prototypes: clang/include/clang/Basic/BuiltinsAMDGPU.def (clang 22.1.8).
// Mnemonics: the calculator's names, which are what llvm-objdump prints (doc §4.1, §8).
constexpr MatrixInstr kTable[] = {
    // gfx11: 16-element A/B replicated across half-waves, 8-float accumulator.
    {"v_wmma_f32_16x16x16_f16", "__builtin_amdgcn_wmma_f32_16x16x16_f16_w32", gfx11, f16, f32,
     "_Float16", "float", &kGfx11, kNoArgs, calculator},
    {"v_wmma_f32_16x16x16_bf16", "__builtin_amdgcn_wmma_f32_16x16x16_bf16_w32", gfx11, bf16, f32,
     "short", "float", &kGfx11, kNoArgs, calculator},

    // gfx12: 8-element A/B, no replication, 8-float accumulator (lane diagram above).
    {"v_wmma_f32_16x16x16_f16", "__builtin_amdgcn_wmma_f32_16x16x16_f16_w32_gfx12", gfx12, f16, f32,
     "_Float16", "float", &kGfx12, kNoArgs, calculator},
    {"v_wmma_f32_16x16x16_bf16", "__builtin_amdgcn_wmma_f32_16x16x16_bf16_w32_gfx12", gfx12, bf16,
     f32, "short", "float", &kGfx12, kNoArgs, calculator},

    // CDNA2 (gfx90a). The calculator snapshot has only the bf16_1k forms; the f16
    // forms share their layout (doc §1: "the bf16 forms have exactly the f16 layout").
    {"v_mfma_f32_16x16x16f16", "__builtin_amdgcn_mfma_f32_16x16x16f16", cdna2, f16, f32, "_Float16",
     "float", &kMfma16x16x16, kMfmaArgs, sources},
    {"v_mfma_f32_16x16x16bf16_1k", "__builtin_amdgcn_mfma_f32_16x16x16bf16_1k", cdna2, bf16, f32,
     "short", "float", &kMfma16x16x16, kMfmaArgs, calculator},
    {"v_mfma_f32_32x32x8f16", "__builtin_amdgcn_mfma_f32_32x32x8f16", cdna2, f16, f32, "_Float16",
     "float", &kMfma32x32x8, kMfmaArgs, sources},
    {"v_mfma_f32_32x32x8bf16_1k", "__builtin_amdgcn_mfma_f32_32x32x8bf16_1k", cdna2, bf16, f32,
     "short", "float", &kMfma32x32x8, kMfmaArgs, calculator},

    // CDNA3 (gfx942): the CDNA2 builtins, printed with the new mnemonics.
    {"v_mfma_f32_16x16x16_f16", "__builtin_amdgcn_mfma_f32_16x16x16f16", cdna3, f16, f32,
     "_Float16", "float", &kMfma16x16x16, kMfmaArgs, calculator},
    {"v_mfma_f32_16x16x16_bf16", "__builtin_amdgcn_mfma_f32_16x16x16bf16_1k", cdna3, bf16, f32,
     "short", "float", &kMfma16x16x16, kMfmaArgs, calculator},
    {"v_mfma_f32_32x32x8_f16", "__builtin_amdgcn_mfma_f32_32x32x8f16", cdna3, f16, f32, "_Float16",
     "float", &kMfma32x32x8, kMfmaArgs, calculator},
    {"v_mfma_f32_32x32x8_bf16", "__builtin_amdgcn_mfma_f32_32x32x8bf16_1k", cdna3, bf16, f32,
     "short", "float", &kMfma32x32x8, kMfmaArgs, calculator},

    // CDNA4 (gfx950): the K32/K16 shapes (bf16 takes __bf16 vectors here), then the
    // CDNA3 instructions, which still compile on gfx950 (doc §5.1, §8).
    {"v_mfma_f32_16x16x32_f16", "__builtin_amdgcn_mfma_f32_16x16x32_f16", cdna4, f16, f32,
     "_Float16", "float", &kMfma16x16x32, kMfmaArgs, sources},
    {"v_mfma_f32_16x16x32_bf16", "__builtin_amdgcn_mfma_f32_16x16x32_bf16", cdna4, bf16, f32,
     "__bf16", "float", &kMfma16x16x32, kMfmaArgs, sources},
    {"v_mfma_f32_32x32x16_f16", "__builtin_amdgcn_mfma_f32_32x32x16_f16", cdna4, f16, f32,
     "_Float16", "float", &kMfma32x32x16, kMfmaArgs, sources},
    {"v_mfma_f32_32x32x16_bf16", "__builtin_amdgcn_mfma_f32_32x32x16_bf16", cdna4, bf16, f32,
     "__bf16", "float", &kMfma32x32x16, kMfmaArgs, sources},
    {"v_mfma_f32_16x16x16_f16", "__builtin_amdgcn_mfma_f32_16x16x16f16", cdna4, f16, f32,
     "_Float16", "float", &kMfma16x16x16, kMfmaArgs, sources},
    {"v_mfma_f32_16x16x16_bf16", "__builtin_amdgcn_mfma_f32_16x16x16bf16_1k", cdna4, bf16, f32,
     "short", "float", &kMfma16x16x16, kMfmaArgs, sources},
    {"v_mfma_f32_32x32x8_f16", "__builtin_amdgcn_mfma_f32_32x32x8f16", cdna4, f16, f32, "_Float16",
     "float", &kMfma32x32x8, kMfmaArgs, sources},
    {"v_mfma_f32_32x32x8_bf16", "__builtin_amdgcn_mfma_f32_32x32x8bf16_1k", cdna4, bf16, f32,
     "short", "float", &kMfma32x32x8, kMfmaArgs, sources},

    // NVIDIA sm_80+: warp-wide mma.sync through inline PTX (no builtin); operands are
    // 32-bit registers holding two 16-bit elements each.
    {"mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32", "", sm80, f16, f32, "half", "float",
     &kSm80, kNoArgs, sources},
    {"mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32", "", sm80, bf16, f32, "__nv_bfloat16",
     "float", &kSm80, kNoArgs, sources},

    // NVIDIA sm_90: the same warp-wide mma.sync (the sm80 rules lower Hopper for
    // now); the warpgroup wgmma rows come with the sm90 rule set (issue 16).
    {"mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32", "", sm90, f16, f32, "half", "float",
     &kSm80, kNoArgs, sources},
    {"mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32", "", sm90, bf16, f32, "__nv_bfloat16",
     "float", &kSm80, kNoArgs, sources},
};

} // namespace

std::span<const MatrixInstr> matrix_table() { return kTable; }

Expected<const MatrixInstr *> find_matrix_instr(const Target &target, DType ab_dtype, int m, int n,
                                                int k) {
  std::string offered;
  for (const MatrixInstr *instr : target.matrix_instrs) {
    if (instr->ab_dtype == ab_dtype && instr->m() == m && instr->n() == n && instr->k() == k)
      return instr;
    offered += fmt::format("{}{} {}x{}x{}", offered.empty() ? "" : ", ",
                           dtype_name(instr->ab_dtype), instr->m(), instr->n(), instr->k());
  }
  return Status::error("{} ({}) has no {} matrix instruction of shape {}x{}x{} (m x n x k); "
                       "it has: {}",
                       target.arch, target.family_name(), dtype_name(ab_dtype), m, n, k,
                       offered.empty() ? "none" : offered);
}

} // namespace flashjit::lowering
