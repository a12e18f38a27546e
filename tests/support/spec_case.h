// One row of a numeric test matrix: the spec fields that vary between cases,
// a GoogleTest-safe name for it, and the AttentionSpec it stands for.
#pragma once

#include "ir/spec.h"

#include <fmt/format.h>

#include <string>

namespace flashjit::test {

struct Case {
  int64_t b, hq, hkv, sq, sk, dqk, dv;
  DType dtype;
  Layout layout;
  bool causal;
  Window window;
  bool lse;
};

/// e.g. b1_h8x2_s113x203_d80x80_bf16_bshd_causal_lse; an unbounded window side reads 999.
inline std::string name_of(const Case &c) {
  return fmt::format("b{}_h{}x{}_s{}x{}_d{}x{}_{}_{}{}{}{}", c.b, c.hq, c.hkv, c.sq, c.sk, c.dqk,
                     c.dv, dtype_name(c.dtype), layout_name(c.layout), c.causal ? "_causal" : "",
                     c.window.left >= 0 || c.window.right >= 0
                         ? fmt::format("_w{}_{}", c.window.left < 0 ? 999 : c.window.left,
                                       c.window.right < 0 ? 999 : c.window.right)
                         : "",
                     c.lse ? "_lse" : "");
}

inline AttentionSpec spec_of(const Case &c) {
  AttentionSpec s = make_spec(c.b, c.hq, c.hkv, c.sq, c.sk, c.dqk, c.dv, c.dtype, c.layout);
  s.causal = c.causal;
  s.window = c.window;
  s.lse = c.lse;
  return s;
}

} // namespace flashjit::test
