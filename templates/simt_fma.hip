// ---- simt rules: the matrix product as FMAs (no matrix instruction) ----
// The fragments of lowering/rules_simt.cpp: a lane owns query `col` and
// kAccElems consecutive rows (keys of S^T, head-dim entries of O^T) of every
// 16 x 16 fragment; its Q or P^T operand holds all 16 k of its query.
typedef float fj_simt_acc __attribute__((ext_vector_type(kAccElems)));

// The kAccElems rows of an LDS tile this lane computes, each 16 consecutive k:
// K rows (the row-major K tile) or V^T rows (the transposed V tile).
struct fj_simt_rows {
  const fj_bits *first; // row 0, k = 0; 16-byte aligned
  int stride;           // elements from one row to the next, a multiple of 8
};

// acc[e] += sum over k of rows[e][k] * x[k], in f32, k in order.
FJ_DEVICE fj_simt_acc fj_simt_mma(fj_simt_rows a, fj_bits16 x, fj_simt_acc acc) {
  float xf[16];
#pragma unroll
  for (int k = 0; k < 16; ++k)
    xf[k] = fj_to_f32(x[k]);
#pragma unroll 1 // a loop: unrolled, every row's LDS reads are hoisted and spill
  for (int e = 0; e < kAccElems; ++e) {
    const fj_bits *row = a.first + e * a.stride;
    const fj_bits8 lo = fj_lds_load8(row), hi = fj_lds_load8(row + 8);
    float sum = acc[e];
#pragma unroll
    for (int k = 0; k < 8; ++k)
      sum += fj_to_f32(lo[k]) * xf[k];
#pragma unroll
    for (int k = 0; k < 8; ++k)
      sum += fj_to_f32(hi[k]) * xf[8 + k];
    acc[e] = sum;
  }
  return acc;
}
