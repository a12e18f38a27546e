// The block-range pass on the host: templates/block_range.hip's interval
// arithmetic (the code the kernels run), compiled here as ordinary C++, and the
// analysis of a mask expression over a block of queries and keys with it.
#pragma once

#include "ir/expr.h"

#include <cstdint>
#include <functional>
#include <limits>
#include <string>

namespace flashjit::ir::interval {

#define FJ_DEVICE static inline
#define FJ_INF std::numeric_limits<float>::infinity()
#include "templates/block_range.hip"
#undef FJ_DEVICE
#undef FJ_INF

} // namespace flashjit::ir::interval

namespace flashjit::ir {

using Interval = interval::fj_iv;

/// The values `e` can take when its variables range over `vars` (q_idx and
/// kv_idx over a block's rows, b, h and the lengths exact); `scalar` gives an
/// integer scalar's value. Float subexpressions and array elements are unknown.
Interval interval_of(const Expr &e, const std::function<Interval(const std::string &)> &vars,
                     const std::function<double(const std::string &)> &scalar);

/// C for the kernels: an fj_iv expression over the same arithmetic. `vars` maps
/// each built-in variable to a C expression of type fj_iv; integer scalars are
/// read by name (kernel parameters).
std::string emit_c_interval(const Expr &e,
                            const std::function<std::string(const std::string &)> &vars);

} // namespace flashjit::ir
