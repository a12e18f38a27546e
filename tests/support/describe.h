// How a numeric test reports a comparison with the float64 reference: the
// errors and the tolerance they were held to, in one line.
#pragma once

#include "ir/reference.h"

#include <fmt/format.h>

#include <string>

namespace flashjit::test {

inline std::string describe(const ErrorStats &e, const Tolerance &tol) {
  return fmt::format("max_abs {} rel_l2 {} nonfinite {} (tolerance abs {} rel {})", e.max_abs,
                     e.rel_l2, e.nonfinite, tol.abs, tol.rel);
}

} // namespace flashjit::test
