// NumPy .npy files (format version 1.0, little-endian, C order) for exchanging
// inputs and outputs with anyone's tools. f16 is stored as '<f2'; bf16, which
// NumPy lacks, is widened exactly to '<f4'.
#pragma once

#include "ir/spec.h"
#include "ir/status.h"

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace flashjit::npy {

struct Array {
  std::vector<int64_t> shape;
  std::string descr;          // '<f2', '<f4' or '<f8'
  std::vector<double> values; // C order
};

/// Writes `a` to `path` whole or not at all (a temporary file in the same
/// directory, fsync()ed, closed with its error checked, renamed into place), so
/// a full disk leaves no truncated file and loses nothing. A symbolic link at
/// `path` is never followed; an existing `path` is an error unless `force`,
/// and then it is replaced (a link by the file, not the link's target).
Status write(const std::string &path, const Array &a, bool force = false);

/// Reads a .npy file (format 1.0, 2.0 or 3.0) that NumPy's own reader would
/// accept as a little-endian, C-order f2/f4/f8 array; anything else is refused
/// with the problem and the fix: a header that is not exactly the dict
/// numpy.save writes (a fortran_order other than True/False, a shape of
/// anything but non-negative integers such as 1.5 or -3), a shape that needs
/// more data than the file holds, bytes after the data, a FIFO or device (never
/// opened for a blocking read). What is allocated is bounded by the file's size.
Expected<Array> read(const std::string &path);
/// The same checks on the bytes of a whole .npy file held in memory (read()
/// is this after reading the file); `path` only names it in messages.
Expected<Array> parse(std::string_view bytes, const std::string &path);

/// The .npy shape of a spec's tensor in its named layout: bshd [B,S,H,D],
/// bhsd [B,H,S,D], interleaved [B,S,H*D].
std::vector<int64_t> tensor_shape(Layout layout, int64_t b, int64_t h, int64_t s, int64_t d);

/// Gathers a strided tensor into the dense .npy order of `layout` (and back).
Array gather(const std::vector<float> &buf, const Strides &st, Layout layout, DType t, int64_t b,
             int64_t h, int64_t s, int64_t d);
Status scatter(const Array &a, std::vector<float> &buf, const Strides &st, Layout layout, DType t,
               int64_t b, int64_t h, int64_t s, int64_t d, const std::string &what);

} // namespace flashjit::npy
