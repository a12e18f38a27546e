// ---- the block-range pass: interval arithmetic over a block ----
// Which KV blocks (or query blocks) can hold a (query, key) pair that a mask
// expression keeps: each integer subexpression is bounded by the interval of
// values it can take while q_idx and kv_idx range over the block, and a block
// whose mask can only be 0 is skipped. The kernels and the host (ir/interval.h
// includes this file) run this same code.
//
// Sound by construction: an interval holds every value the kernel's 32-bit
// integer arithmetic can produce for the block. Whatever cannot be bounded that
// way is `unknown` (the whole line): float subexpressions (f32 rounding),
// array elements, divisors that may be 0, and any result past 32 bits (where
// the kernel's int would wrap). Every operation on `unknown` stays sound, and a
// mask that is unknown keeps the block.
struct fj_iv {
  double lo, hi;
};
FJ_DEVICE fj_iv fj_iv_unknown() {
  const double inf = (double)FJ_INF;
  fj_iv r = {-inf, inf};
  return r;
}
// An integer interval the kernel's int holds, else unknown (NaN too).
FJ_DEVICE fj_iv fj_iv_range(double lo, double hi) {
  if (!(lo >= -2147483648.0 && hi <= 2147483647.0 && lo <= hi))
    return fj_iv_unknown();
  fj_iv r = {lo, hi};
  return r;
}
FJ_DEVICE fj_iv fj_iv_exact(double v) { return fj_iv_range(v, v); }
FJ_DEVICE fj_iv fj_iv_bool(bool can_be_false, bool can_be_true) {
  fj_iv r = {can_be_false ? 0.0 : 1.0, can_be_true ? 1.0 : 0.0};
  return r;
}
FJ_DEVICE bool fj_iv_can_be_zero(fj_iv a) { return a.lo <= 0.0 && a.hi >= 0.0; }
FJ_DEVICE bool fj_iv_can_be_nonzero(fj_iv a) { return !(a.lo == 0.0 && a.hi == 0.0); }
FJ_DEVICE double fj_iv_lesser(double a, double b) { return a < b ? a : b; }
FJ_DEVICE double fj_iv_greater(double a, double b) { return a > b ? a : b; }
// The interval of four corner values; unknown when one is NaN.
FJ_DEVICE fj_iv fj_iv_corners(double a, double b, double c, double d) {
  if (a != a || b != b || c != c || d != d)
    return fj_iv_unknown();
  return fj_iv_range(fj_iv_lesser(fj_iv_lesser(a, b), fj_iv_lesser(c, d)),
                     fj_iv_greater(fj_iv_greater(a, b), fj_iv_greater(c, d)));
}
FJ_DEVICE fj_iv fj_iv_neg(fj_iv a) { return fj_iv_range(-a.hi, -a.lo); }
FJ_DEVICE fj_iv fj_iv_add(fj_iv a, fj_iv b) { return fj_iv_range(a.lo + b.lo, a.hi + b.hi); }
FJ_DEVICE fj_iv fj_iv_sub(fj_iv a, fj_iv b) { return fj_iv_range(a.lo - b.hi, a.hi - b.lo); }
// A product of bounds, where an unbounded (infinite) bound times 0 is 0: the
// values themselves are finite.
FJ_DEVICE double fj_iv_times(double a, double b) { return a == 0.0 || b == 0.0 ? 0.0 : a * b; }
FJ_DEVICE fj_iv fj_iv_mul(fj_iv a, fj_iv b) {
  return fj_iv_corners(fj_iv_times(a.lo, b.lo), fj_iv_times(a.lo, b.hi), fj_iv_times(a.hi, b.lo),
                       fj_iv_times(a.hi, b.hi));
}
// C's truncating division of bounds; an unbounded divisor gives 0.
FJ_DEVICE double fj_iv_quotient(double a, double b) {
  const double inf = (double)FJ_INF;
  if (b == inf || b == -inf)
    return (a == inf || a == -inf) ? a - a : 0.0; // NaN when both are unbounded
  const double q = a / b;
  if (q == inf || q == -inf)
    return q;
  return (double)(long long)q;
}
// fj_int_div: truncating, 0 for a zero divisor. Trunc(a / b) is monotone in a
// and, for a divisor of one sign, in b: its extremes are at the corners.
FJ_DEVICE fj_iv fj_iv_div(fj_iv a, fj_iv b) {
  if (b.lo <= 0.0 && b.hi >= 0.0)
    return fj_iv_unknown();
  return fj_iv_corners(fj_iv_quotient(a.lo, b.lo), fj_iv_quotient(a.lo, b.hi),
                       fj_iv_quotient(a.hi, b.lo), fj_iv_quotient(a.hi, b.hi));
}
// fj_int_mod: C's %, 0 for a zero divisor. The result has the dividend's sign,
// is smaller than the divisor in magnitude and no larger than the dividend; a
// non-negative dividend range within one period of an exact positive divisor
// maps exactly.
FJ_DEVICE fj_iv fj_iv_mod(fj_iv a, fj_iv b) {
  if (b.lo == b.hi && b.lo > 0.0 && a.lo >= 0.0 && a.hi <= 2147483647.0) {
    const double period = (double)(long long)(a.lo / b.lo);
    if (period == (double)(long long)(a.hi / b.lo))
      return fj_iv_range(a.lo - period * b.lo, a.hi - period * b.lo);
  }
  const double m = fj_iv_greater(fj_iv_greater(b.lo, -b.lo), fj_iv_greater(b.hi, -b.hi)) - 1.0;
  if (m < 0.0)
    return fj_iv_exact(0.0);
  const double lo = a.lo < 0.0 ? fj_iv_greater(-m, a.lo) : 0.0;
  const double hi = a.hi > 0.0 ? fj_iv_lesser(m, a.hi) : 0.0;
  return fj_iv_range(lo, hi);
}
FJ_DEVICE fj_iv fj_iv_lt(fj_iv a, fj_iv b) { return fj_iv_bool(a.hi >= b.lo, a.lo < b.hi); }
FJ_DEVICE fj_iv fj_iv_le(fj_iv a, fj_iv b) { return fj_iv_bool(a.hi > b.lo, a.lo <= b.hi); }
FJ_DEVICE fj_iv fj_iv_gt(fj_iv a, fj_iv b) { return fj_iv_lt(b, a); }
FJ_DEVICE fj_iv fj_iv_ge(fj_iv a, fj_iv b) { return fj_iv_le(b, a); }
FJ_DEVICE fj_iv fj_iv_eq(fj_iv a, fj_iv b) {
  const bool overlap = a.lo <= b.hi && b.lo <= a.hi;
  const bool same_point = a.lo == a.hi && b.lo == b.hi && a.lo == b.lo;
  return fj_iv_bool(!same_point, overlap);
}
FJ_DEVICE fj_iv fj_iv_ne(fj_iv a, fj_iv b) {
  const fj_iv e = fj_iv_eq(a, b);
  return fj_iv_bool(e.hi != 0.0, e.lo == 0.0);
}
FJ_DEVICE fj_iv fj_iv_not(fj_iv a) {
  return fj_iv_bool(fj_iv_can_be_nonzero(a), fj_iv_can_be_zero(a));
}
FJ_DEVICE fj_iv fj_iv_and(fj_iv a, fj_iv b) {
  return fj_iv_bool(fj_iv_can_be_zero(a) || fj_iv_can_be_zero(b),
                    fj_iv_can_be_nonzero(a) && fj_iv_can_be_nonzero(b));
}
FJ_DEVICE fj_iv fj_iv_or(fj_iv a, fj_iv b) {
  return fj_iv_bool(fj_iv_can_be_zero(a) && fj_iv_can_be_zero(b),
                    fj_iv_can_be_nonzero(a) || fj_iv_can_be_nonzero(b));
}
FJ_DEVICE fj_iv fj_iv_select(fj_iv c, fj_iv x, fj_iv y) {
  if (!fj_iv_can_be_zero(c))
    return x;
  if (!fj_iv_can_be_nonzero(c))
    return y;
  fj_iv r = {fj_iv_lesser(x.lo, y.lo), fj_iv_greater(x.hi, y.hi)};
  return r;
}
FJ_DEVICE fj_iv fj_iv_min(fj_iv a, fj_iv b) {
  fj_iv r = {fj_iv_lesser(a.lo, b.lo), fj_iv_lesser(a.hi, b.hi)};
  return r;
}
FJ_DEVICE fj_iv fj_iv_max(fj_iv a, fj_iv b) {
  fj_iv r = {fj_iv_greater(a.lo, b.lo), fj_iv_greater(a.hi, b.hi)};
  return r;
}
FJ_DEVICE fj_iv fj_iv_abs(fj_iv a) {
  if (a.lo >= 0.0)
    return a;
  if (a.hi <= 0.0)
    return fj_iv_neg(a);
  return fj_iv_range(0.0, fj_iv_greater(-a.lo, a.hi));
}
