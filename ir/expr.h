// Score expressions: the small language of score and mask modifiers
// (FlexAttention's score_mod / mask_mod, softcap, ALiBi), in C-like syntax:
//
//   score                 the scaled score q.k * scale of this (query, key), f32
//   b h q_idx kv_idx      batch, query head, query and key positions (from 0 at
//                         the start of each sequence), int
//   seqlen_q seqlen_k     this batch's query and key counts, int
//   a scalar's name       a run-time scalar parameter of the kernel (%softcap)
//   name[index]           an element of a captured f32 array (alibi_slopes[h])
//   literals              1, 2.5, 1e-3, inf
//   - ! * / % + - < <= > >= == != && || ?:   with C's precedence and types
//   min max abs exp log tanh                 functions
//   uniform(seed, offset, b, h, q_idx, kv_idx)  a uniform draw in [0, 1) of six
//                         integers (Philox-4x32-7; philox_uniform): dropout's
//
// Integers stay integers (/ and % truncate as in C); any float operand makes an
// operation float (f32 in the kernels, f64 in the reference). A comparison or
// logical operation is an int 0 or 1. One definition serves every backend:
// parse() checks names and types and reports errors with the column; emit_c()
// writes the kernels' C, evaluate() runs it for the interpreter and reference.
#pragma once

#include "ir/status.h"

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace flashjit::ir {

struct Expr {
  enum class Kind { number, var, scalar, load, unary, binary, call, select };
  Kind kind = Kind::number;
  bool is_int = false; // the expression's type: int or float
  double value = 0;    // number
  std::string name;    // var (score, b, ...), scalar, load (the array), unary/binary/call op
  std::vector<Expr> args;
};

/// What names an expression may use besides the built-in variables: run-time
/// scalars (with whether each is an integer) and captured f32 arrays.
struct ExprScope {
  std::vector<std::pair<std::string, bool>> scalars; // name, is_int
  std::vector<std::string> arrays;
};

/// Parses and type-checks `text`; `what` names it in errors ("score_mod"), which
/// give the column: "score_mod, column 7: unknown name 'scroe'; ...".
Expected<Expr> parse_expr(std::string_view text, const ExprScope &scope, std::string_view what);
/// The canonical text (parse(print(e)) == e), fully parenthesized.
std::string print_expr(const Expr &e);
/// Whether `e` reads the variable `name` (score, q_idx, ...).
bool uses_var(const Expr &e, std::string_view name);
/// `e` with every `score` replaced by `inner` (composing modifiers).
Expr substitute_score(const Expr &e, const Expr &inner);

/// d e / d score as an expression (the backward's chain rule through softcap,
/// ALiBi, score_mod and mask_mod): sums, products, quotients, min/max/abs/select
/// by their branches, exp, log and tanh by their derivatives; what does not read
/// score (and every integer) has derivative 0. Parsed in `scope` like `e`.
Expected<Expr> score_derivative(const Expr &e, const ExprScope &scope);

/// The values an evaluation reads.
struct ExprContext {
  double score = 0;
  int64_t b = 0, h = 0, q_idx = 0, kv_idx = 0, seqlen_q = 0, seqlen_k = 0;
  std::function<double(const std::string &)> scalar;
  /// The element of an array, or an error text when the index is outside it.
  std::function<double(const std::string &, int64_t index)> load;
  bool f32 = false; // round every float result to f32 (the kernels' arithmetic)
};
double evaluate(const Expr &e, const ExprContext &c);

/// Philox-4x32-R (Random123's philox4x32_R) of a counter under a key.
std::array<uint32_t, 4> philox4x32(std::array<uint32_t, 4> counter, std::array<uint32_t, 2> key,
                                   int rounds);

/// The arguments of `uniform`.
constexpr int kUniformArgs = 6;
/// The key of a kernel's draws: Philox-4x32-10 of (seed, offset) under a fixed key.
/// The key is made once per kernel; the draws, one per 8 keys of each query
/// and twice in a backward, take kDrawRounds.
std::array<uint32_t, 2> philox_key(uint64_t seed, uint64_t offset);
/// Keys per Philox draw: one draw's 128 bits give 8 aligned keys of a query
/// 16 bits each, so a lane holding several of them draws once (lowering's
/// ScoreMod groups its elements by draw).
constexpr uint32_t kDrawKeys = 8;
/// Rounds of a draw: 7, the fewest Random123's authors found Crush-resistant
/// for Philox-4x32 (Salmon et al., SC'11; they ship 10 as a safety margin), and
/// FlashAttention-2's. The draws were the dropout backward's largest cost
/// (docs/decisions.md, "Keep bits and seven rounds").
constexpr int kDrawRounds = 7;
/// A uniform draw in [0, 1) with 16 random bits, a pure function of its
/// arguments: Philox-4x32-7 (Salmon et al., SC'11) of the counter (kv_idx / 8,
/// q_idx, h, b) under philox_key(seed, offset) gives 4 words; key kv_idx takes
/// 16-bit half kv_idx % 2 of word kv_idx % 8 / 2, over 2^16. fj_uniform in
/// templates/attention_common.hip computes the same bits.
double philox_uniform(uint64_t seed, uint64_t offset, uint32_t b, uint32_t h, uint32_t q_idx,
                      uint32_t kv_idx);

/// C for the kernels. `names` maps the built-in variables (score, b, h, q_idx,
/// kv_idx, seqlen_q, seqlen_k) to C expressions; scalars and arrays keep their
/// names (they are kernel parameters). Uses fj_tanh, fj_exp, fj_log from
/// templates/attention_common.hip.
std::string emit_c(const Expr &e, const std::function<std::string(const std::string &)> &names);

} // namespace flashjit::ir
