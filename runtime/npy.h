// NumPy .npy files (format version 1.0, little-endian, C order) for exchanging
// inputs and outputs with anyone's tools. f16 is stored as '<f2'; bf16, which
// NumPy lacks, is widened exactly to '<f4'.
#pragma once

#include "ir/spec.h"
#include "ir/status.h"

#include <cstdint>
#include <string>
#include <vector>

namespace flashjit::npy {

struct Array {
  std::vector<int64_t> shape;
  std::string descr;          // '<f2', '<f4' or '<f8'
  std::vector<double> values; // C order
};

Status write(const std::string &path, const Array &a);
Expected<Array> read(const std::string &path);

/// The .npy shape of a spec's tensor in its named layout: bshd [B,S,H,D],
/// bhsd [B,H,S,D], interleaved [B,S,H*D].
std::vector<int64_t> tensor_shape(Layout layout, int64_t b, int64_t h, int64_t s, int64_t d);

/// Gathers a strided tensor into the dense .npy order of `layout` (and back).
Array gather(const std::vector<float> &buf, const Strides &st, Layout layout, DType t, int64_t b,
             int64_t h, int64_t s, int64_t d);
Status scatter(const Array &a, std::vector<float> &buf, const Strides &st, Layout layout, DType t,
               int64_t b, int64_t h, int64_t s, int64_t d, const std::string &what);

} // namespace flashjit::npy
